"""``kvconv open TRACE`` through the real CLI: the file served once from the loopback, fetched here with urllib as
ui.perfetto.dev fetches it (CORS header, bytes), the UI URL printed where no browser is at hand, the command gone once
the file was sent; a missing file, a busy port and a timeout as one-line errors."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

from conftest import FIXTURES, ROOT, run_cli

UI = "https://ui.perfetto.dev"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(trace, port: int, *extra: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "BROWSER")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.Popen([sys.executable, "-m", "kvconv", "open", str(trace), "--port", str(port), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _get(url: str, tries: int = 100):
    for _ in range(tries):
        try:
            return urllib.request.urlopen(url, timeout=10)
        except urllib.error.URLError as e:
            if isinstance(e, urllib.error.HTTPError) or not isinstance(e.reason, ConnectionRefusedError):
                raise
            time.sleep(0.1)  # the server is still starting
    raise AssertionError(f"nothing listens at {url}")


def test_serves_the_trace_once_with_the_ui_cors_header(tmp_path):
    trace = tmp_path / "run name.pftrace"
    trace.write_bytes(b"\x0a\x00" + bytes(range(256)) * 1000)  # starts as a Perfetto trace (a TracePacket tag)
    port = _free_port()
    p = _start(trace, port, "--timeout", "120")
    try:
        try:
            _get(f"http://127.0.0.1:{port}/other.pftrace")
            raise AssertionError("another path was served")
        except urllib.error.HTTPError as e:
            assert e.code == 404
        with _get(f"http://127.0.0.1:{port}/run%20name.pftrace") as r:
            assert r.status == 200
            assert r.headers["Access-Control-Allow-Origin"] == UI
            assert r.headers["Cache-Control"] == "no-cache"
            assert int(r.headers["Content-Length"]) == trace.stat().st_size
            assert r.read() == trace.read_bytes()
        out, err = p.communicate(timeout=30)
    finally:
        p.kill()
    assert p.returncode == 0, err
    # no DISPLAY here: the URL is printed, for a browser elsewhere (over ssh)
    assert f"{UI}/#!/?url=http://127.0.0.1:{port}/run%20name.pftrace" in out
    assert "forward port" in out


def test_a_real_trace_byte_for_byte(tmp_path):
    trace = tmp_path / "single.pftrace"
    assert run_cli("perfetto", ROOT / "fixtures/h200-single/single.kvdump", "-o", trace, "-q").returncode == 0
    port = _free_port()
    p = _start(trace, port, "--timeout", "120")
    try:
        with _get(f"http://127.0.0.1:{port}/single.pftrace") as r:
            assert r.read() == trace.read_bytes()
        p.communicate(timeout=30)
    finally:
        p.kill()
    assert p.returncode == 0


def test_one_line_errors(tmp_path):
    r = run_cli("open", tmp_path / "missing.pftrace")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip() == f"Error: {tmp_path / 'missing.pftrace'}: no such file (check the path; kvconv " \
                               "perfetto or kvconv chrome writes the trace)"
    # Before: a kvconv dump or any file was served, and the UI showed an import error.
    dump = FIXTURES / "bad" / "valid-small.kvdump"
    r = run_cli("open", dump, "--timeout", "0.5", "--no-browser")
    assert r.returncode == 2 and r.stdout == "" and r.stderr.count("\n") == 1, r
    assert "is a kvconv dump, not a trace (convert it first: kvconv perfetto" in r.stderr, r.stderr
    junk = tmp_path / "junk.pftrace"
    junk.write_bytes(b"x")
    r = run_cli("open", junk, "--timeout", "0.5", "--no-browser")
    assert r.returncode == 2 and r.stdout == "" and "not a trace" in r.stderr, r
    trace = tmp_path / "t.pftrace"
    trace.write_bytes(b"\x0a\x00")  # one empty TracePacket
    r = run_cli("open", trace, "--port", str(_free_port()), "--timeout", "0.5")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.count("\n") == 1 and "nobody fetched the trace within 0.5 s" in r.stderr
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        r = run_cli("open", trace, "--port", str(busy.getsockname()[1]), "--timeout", "5")
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and "cannot listen on 127.0.0.1:" in r.stderr
