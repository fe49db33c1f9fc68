"""`kvconv report` pages in a real browser: headless Chromium (Debian's ``chromium``, installed by .ci/run) driven over
the DevTools protocol on a pipe (``--remote-debugging-pipe``: no port, no extra package). The page must load with
no console message at error level, no uncaught exception, no request leaving the file (everything embedded), and
every plot must be drawn: the screenshot's region of each ``figure.plot`` holds ink.

``pytest --update-goldens`` also rewrites docs/report-qwen3-14b.png (the README's picture) from the same run.
"""

from __future__ import annotations

import base64
import io
import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from conftest import FIXTURES, ROOT, run_cli

CHROMIUM = next((p for p in (shutil.which("chromium"), shutil.which("chromium-browser")) if p), None)
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (.ci/run installs it)")]
WIDTH = 1100
SCREENSHOT = ROOT / "docs" / "report-qwen3-14b.png"


class Browser:
    """One headless Chromium, commands over fds 3 (to it) and 4 (from it), NUL-separated JSON."""

    def __init__(self, profile_dir: Path) -> None:
        import fcntl

        to_r, self._to_w = os.pipe()
        self._from_r, from_w = os.pipe()
        # the child's ends moved above 4 first, so that placing them at 3 and 4 cannot overwrite one another
        hi = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (to_r, from_w)]
        for fd in (to_r, from_w):
            os.close(fd)

        def child_fds():
            os.dup2(hi[0], 3)
            os.dup2(hi[1], 4)

        self.proc = subprocess.Popen(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe", "--no-first-run",
             "--hide-scrollbars", f"--user-data-dir={profile_dir}", "--font-render-hinting=none", "about:blank"],
            pass_fds=(3, 4), preexec_fn=child_fds, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for fd in hi:
            os.close(fd)
        self._buf, self._id, self.events = b"", 0, []

    def _read(self) -> dict:
        while b"\0" not in self._buf:
            chunk = os.read(self._from_r, 1 << 20)
            if not chunk:
                raise RuntimeError("chromium closed the DevTools pipe")
            self._buf += chunk
        msg, self._buf = self._buf.split(b"\0", 1)
        return json.loads(msg)

    def send(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._to_w, json.dumps(msg).encode() + b"\0")
        while True:
            m = self._read()
            if m.get("id") == self._id:
                if "error" in m:
                    raise RuntimeError(f"{method}: {m['error']}")
                return m["result"]
            self.events.append(m)

    def wait(self, method: str) -> dict:
        for i, m in enumerate(self.events):
            if m.get("method") == method:
                return self.events.pop(i)
        while True:
            m = self._read()
            if m.get("method") == method:
                return m
            self.events.append(m)

    def close(self) -> None:
        try:
            self.send("Browser.close")
        except (RuntimeError, OSError):
            pass
        self.proc.wait(timeout=30)
        os.close(self._to_w)
        os.close(self._from_r)


def open_page(path: Path, tmp: Path) -> dict:
    """Load ``path`` in a fresh Chromium: console errors, exceptions, requests other than the file itself and its
    embedded ``data:`` images (the heatmaps' rasters), every
    plot's rectangle, and a full-page screenshot (PNG bytes)."""
    b = Browser(tmp / "chromium-profile")
    try:
        target = next(t for t in b.send("Target.getTargets")["targetInfos"] if t["type"] == "page")
        s = b.send("Target.attachToTarget", {"targetId": target["targetId"], "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            b.send(f"{domain}.enable", session=s)
        b.send("Emulation.setDeviceMetricsOverride", {"width": WIDTH, "height": 900, "deviceScaleFactor": 1,
                                                      "mobile": False}, session=s)  # layout at the screenshot's width
        url = path.resolve().as_uri()
        b.send("Page.navigate", {"url": url}, session=s)
        b.wait("Page.loadEventFired")
        js = ("JSON.stringify({h: document.documentElement.scrollHeight, plots: [...document.querySelectorAll("
              "'figure.plot')].map(f => {const r = f.querySelector('svg').getBoundingClientRect(); return {name: "
              "f.dataset.plot, x: r.x, y: r.y + window.scrollY, w: r.width, h: r.height};})})")
        layout = json.loads(b.send("Runtime.evaluate", {"expression": js, "returnByValue": True},
                                   session=s)["result"]["value"])
        b.send("Emulation.setDeviceMetricsOverride", {"width": WIDTH, "height": int(layout["h"]),
                                                      "deviceScaleFactor": 1, "mobile": False}, session=s)
        png = base64.b64decode(b.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True},
                                      session=s)["data"])
        b.send("Runtime.evaluate", {"expression": "1"}, session=s)  # lets late events in before they are read
    finally:
        b.close()
    ev = b.events
    errors = [m["params"] for m in ev if m.get("method") == "Runtime.consoleAPICalled"
              and m["params"]["type"] in ("error", "assert")]
    errors += [m["params"] for m in ev if m.get("method") == "Runtime.exceptionThrown"]
    errors += [m["params"]["entry"] for m in ev if m.get("method") == "Log.entryAdded"
               and m["params"]["entry"]["level"] == "error"]
    requests = [m["params"]["request"]["url"] for m in ev if m.get("method") == "Network.requestWillBeSent"
                and m["params"]["request"]["url"] != url and not m["params"]["request"]["url"].startswith("data:")]
    return {"errors": errors, "requests": requests, "plots": layout["plots"], "png": png}


def blank_plots(png: bytes, plots: list[dict]) -> list[str]:
    """Names of the plots whose screenshot region is (nearly) empty: under 0.5 % of pixels off-white, or fewer than
    four distinct colours (a drawn plot: axes, ticks, labels and marks are several percent)."""
    from matplotlib.image import imread

    img = imread(io.BytesIO(png))[..., :3]
    out = []
    for p in plots:
        x0, y0 = int(p["x"]), int(p["y"])
        region = img[y0 : y0 + int(p["h"]), x0 : x0 + int(p["w"])]
        ink = (region < 0.9).any(axis=-1).mean() if region.size else 0.0
        colours = len(np.unique((region.reshape(-1, 3) * 255).astype(np.uint8), axis=0)) if region.size else 0
        if p["w"] < 50 or p["h"] < 50 or ink < 0.005 or colours < 4:
            out.append(p["name"])
    return out


def _report(tmp_path: Path, *dumps: Path) -> Path:
    out = tmp_path / f"{dumps[0].stem}-{len(dumps)}.html"
    r = run_cli("report", "-q", *(str(d.relative_to(ROOT)) for d in dumps), "-o", str(out), cwd=ROOT)
    assert r.returncode == 0, r.stderr
    return out


def test_qwen3_report_in_chromium(tmp_path: Path, update_goldens: bool) -> None:
    page = open_page(_report(tmp_path, FIXTURES / "qwen3-14b" / "qwen3-14b.kvdump"), tmp_path)
    assert page["errors"] == [] and page["requests"] == []
    assert [p["name"] for p in page["plots"]] == ["sm", "launch-blocks", "replay-timing", "offsets"]
    assert blank_plots(page["png"], page["plots"]) == []
    if update_goldens:
        SCREENSHOT.write_bytes(page["png"])


def test_h200_captures_in_chromium(tmp_path: Path) -> None:
    """A real H200 capture with exit events (durations heatmap), and the two ranks of a TP=2 run (skew)."""
    page = open_page(_report(tmp_path, FIXTURES / "h200-enter-exit" / "enter-exit.kvdump"), tmp_path)
    assert page["errors"] == [] and page["requests"] == []
    assert "durations" in [p["name"] for p in page["plots"]]
    assert blank_plots(page["png"], page["plots"]) == []
    tp = FIXTURES / "h200-tp2"
    page = open_page(_report(tmp_path, tp / "rank0.kvdump", tp / "rank1.kvdump"), tmp_path)
    assert page["errors"] == [] and page["requests"] == []
    assert [p["name"] for p in page["plots"]].count("skew") == 1
    assert blank_plots(page["png"], page["plots"]) == []


def test_checker_sees_console_errors_requests_and_blank_plots(tmp_path: Path) -> None:
    """The browser check itself can fail: a console error, a request for a remote image, an empty figure."""
    bad = tmp_path / "bad.html"
    bad.write_text('<!DOCTYPE html><html><body><script>console.error("boom")</script>'
                   '<img src="http://127.0.0.1:9/x.png"><figure class="plot" data-plot="empty">'
                   '<svg width="400" height="300"></svg></figure></body></html>')
    page = open_page(bad, tmp_path)
    assert any("boom" in json.dumps(e) for e in page["errors"])
    assert page["requests"] == ["http://127.0.0.1:9/x.png"]
    assert blank_plots(page["png"], page["plots"]) == ["empty"]
