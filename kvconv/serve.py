"""Open a trace in ui.perfetto.dev the way Perfetto's own ``tools/open_trace_in_ui`` does: serve the file once on
127.0.0.1:9001 (the one local port the UI's content security policy lets it fetch from) with the CORS header for
https://ui.perfetto.dev, and point the browser at ``https://ui.perfetto.dev/#!/?url=http://127.0.0.1:9001/NAME``.

The server answers only ``GET /NAME`` (anything else: 404) and stops after the file was sent once, on Ctrl-C, or when
``timeout`` seconds pass without it being fetched. Over ssh (no browser, no DISPLAY) the URL is printed instead; forward
the port first (``ssh -L 9001:127.0.0.1:9001 host``) so the browser on your side reaches the server.

    >>> from kvconv.serve import OpenOptions, serve_once
    >>> serve_once("run.pftrace", options=OpenOptions(browser=False, timeout=60))  # doctest: +SKIP
    'https://ui.perfetto.dev/#!/?url=http://127.0.0.1:9001/run.pftrace'
"""

from __future__ import annotations

import http.server
import os
import shutil
import time
import urllib.parse
import webbrowser
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kvconv.format.errors import FormatError, OutputError, UsageError

UI = "https://ui.perfetto.dev"
PORT = 9001


@dataclass(frozen=True)
class OpenOptions:
    port: int = PORT
    browser: bool = True  # False: print the URL only
    timeout: float | None = None  # seconds to wait for the fetch (None: until it comes or Ctrl-C)


def ui_url(name: str, port: int = PORT) -> str:
    return f"{UI}/#!/?url=http://127.0.0.1:{port}/{urllib.parse.quote(name)}"


def _handler(path: Path, served: list):
    name = "/" + urllib.parse.quote(path.name)

    class Handler(http.server.BaseHTTPRequestHandler):
        def end_headers(self) -> None:
            self.send_header("Access-Control-Allow-Origin", UI)
            self.send_header("Cache-Control", "no-cache")
            super().end_headers()

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if self.path != name:
                self.send_error(404, "File not found")
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(path.stat().st_size))
            self.end_headers()
            with open(path, "rb") as f:
                shutil.copyfileobj(f, self.wfile, 1 << 20)
            served.append(self.client_address)

        def log_message(self, format: str, *args) -> None:  # noqa: A002 - http.server's signature
            pass  # the command prints its own lines

    return Handler


def _can_open_browser() -> bool:
    if os.name == "posix" and not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")) \
            and not os.uname().sysname == "Darwin":
        return False
    try:
        webbrowser.get()
    except webbrowser.Error:
        return False
    return True


def _check_is_trace(path: Path) -> None:
    """Refuse what the UI would not show as kvconv's trace: a kvconv dump (convert it first), or a file that is
    neither a Perfetto protobuf trace (a TracePacket field, tag 0x0a, first), Chrome JSON (``{`` or ``[`` first) nor
    either of them gzip-compressed (the UI reads .gz)."""
    from kvconv.format.layout import MAGIC

    try:
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError as e:
        raise FormatError(f"cannot open: {e.strerror}", path=str(path), code="unreadable") from None
    if head.startswith(MAGIC):
        raise UsageError("is a kvconv dump, not a trace", path=str(path), code="usage",
                         hint=f"convert it first: kvconv perfetto {path} -o {path.stem}.pftrace, then open that")
    text = head.lstrip(b" \t\r\n\xef\xbb\xbf")[:1]
    if head[:1] == b"\x0a" or text in (b"{", b"[") or head[:2] == b"\x1f\x8b":
        return
    raise UsageError("not a trace (neither a Perfetto .pftrace nor Chrome JSON)", path=str(path), code="usage",
                     hint="kvconv perfetto or kvconv chrome writes the trace to open")


def serve_once(trace: str | os.PathLike, *, options: OpenOptions = OpenOptions(),
               say: Callable[[str], None] = print) -> str:
    """Serve ``trace`` until it was fetched once (or ``options.timeout``); return the UI URL opened or printed."""
    path = Path(trace)
    if not path.exists():
        raise FormatError("no such file", path=str(path), code="not-found",
                          hint="check the path; kvconv perfetto or kvconv chrome writes the trace")
    if not path.is_file():
        raise FormatError("is a folder, not a trace file", path=str(path), code="not-a-file")
    _check_is_trace(path)
    served: list = []
    try:
        server = http.server.HTTPServer(("127.0.0.1", options.port), _handler(path, served))
    except OSError as e:
        raise OutputError(f"cannot listen on 127.0.0.1:{options.port}: {e.strerror}", path=str(path),
                          hint="close what holds the port (another trace being served?) or pass --port",
                          code="output") from None
    url = ui_url(path.name, options.port)
    with server:
        server.timeout = 0.5
        if options.browser and _can_open_browser() and webbrowser.open_new_tab(url):
            say(f"opened {url}")
        else:
            say(f"open this URL in a browser (forward port {options.port} first when on ssh): {url}")
        say(f"serving {path} on http://127.0.0.1:{options.port}/{path.name} until it is fetched (Ctrl-C stops)")
        deadline = None if options.timeout is None else time.monotonic() + options.timeout
        while not served:
            if deadline is not None and time.monotonic() > deadline:
                raise UsageError(f"nobody fetched the trace within {options.timeout:g} s", path=str(path),
                                 hint="open the URL printed above, or pass a longer --timeout", code="usage")
            server.handle_request()
    return url
