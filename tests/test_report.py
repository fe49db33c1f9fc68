"""`kvconv report` through the real CLI: a self-contained page (no URL to fetch, no script), what it holds, bounded
size whatever the dump's, the output rules (never a partial page, never over an input or an existing file), and the
progress display. The browser half is tests/test_report_browser.py."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

from conftest import FIXTURES, ROOT, load_script, run_cli

QWEN = FIXTURES / "qwen3-14b" / "qwen3-14b.kvdump"


class _Page(HTMLParser):
    """Tags, attributes naming something to fetch, and the text of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.fetch: list[str] = []
        self.plots: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        a = dict(attrs)
        for k in ("src", "href", "xlink:href"):
            if k in a and not a[k].startswith(("data:", "#")):
                self.fetch.append(a[k])
        if tag == "figure" and "plot" in (a.get("class") or ""):
            self.plots.append(a["data-plot"])

    def handle_data(self, data):
        self.text.append(data)


def _parse(path: Path) -> _Page:
    p = _Page()
    p.feed(path.read_text(encoding="utf-8"))
    return p


def test_qwen3_page_self_contained(tmp_path: Path) -> None:
    out = tmp_path / "q.html"
    r = run_cli("report", str(QWEN), "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert re.fullmatch(rf"wrote {re.escape(str(out))}: 1 dump, 4 plots, [\d,]+ bytes\n", r.stdout)
    page = _parse(out)
    assert page.fetch == [] and "script" not in page.tags and "link" not in page.tags
    assert page.plots == ["sm", "launch-blocks", "replay-timing", "offsets"]
    text = " ".join(page.text)
    assert "280 graph-node records = 280 expected executions = 280 device events, 0 drops" in text
    assert "coverage-late" in text and "start the tracer earlier" in text  # the finding and its code's advice
    assert not re.search(r"url\((?!#)|@import", out.read_text()), "a stylesheet reference to fetch"


def test_several_dumps_rows_and_skew(tmp_path: Path) -> None:
    out = tmp_path / "tp2.html"
    tp = FIXTURES / "h200-tp2"
    r = run_cli("report", "-q", str(tp / "rank0.kvdump"), str(tp / "rank1.kvdump"), "-o", str(out))
    assert r.returncode == 0 and r.stdout == "", r.stderr
    page = _parse(out)
    assert page.plots.count("skew") == 1 and page.plots.count("sm") == 2
    html = out.read_text()
    rows = html.split("Dumps side by side", 1)[1].split("</table>", 1)[0]
    assert rows.count("<tr>") == 3 and "rank0.kvdump" in rows and "rank1.kvdump" in rows


def test_canary_and_exit_plots(tmp_path: Path) -> None:
    out = tmp_path / "c.html"
    assert run_cli("report", "-q", str(FIXTURES / "canary-stale-pad" / "canary-stale-pad.kvdump"),
                   "-o", str(out)).returncode == 1  # the page is written; the exit is the dump's verdict: failed
    page = _parse(out)
    assert page.plots == ["canary-unexpected"]
    assert "canary-unexpected-write" in " ".join(page.text)
    out2 = tmp_path / "e.html"
    assert run_cli("report", "-q", str(FIXTURES / "h200-enter-exit" / "enter-exit.kvdump"), "-o",
                   str(out2)).returncode == 0
    assert "durations" in _parse(out2).plots


@pytest.mark.parametrize("times", [8, pytest.param(16, marks=pytest.mark.slow)])
def test_size_bounded(tmp_path: Path, times: int) -> None:
    """A dump 8x (the slow tier: 16x) larger (more replays, launches, canary steps) gives a page of about the same
    size: every plot is binned, never a mark per event, launch or replay."""
    gen = load_script(ROOT / "bench" / "gendump.py")
    sizes = []
    for steps in (600, 600 * times):  # both beyond every picture's bins (400 replays / launches along an axis)
        d = tmp_path / f"g{steps}.kvdump"
        gen.write(d, gen.GenOptions(steps=steps, contexts=1, execs=1, nodes=4, canary_buffers=1, exits=True,
                                    seed=3))
        out = tmp_path / f"g{steps}.html"
        r = run_cli("report", "-q", str(d), "-o", str(out))
        assert r.returncode == 0, r.stderr
        sizes.append((d.stat().st_size, out.stat().st_size))
    (d0, h0), (d1, h1) = sizes
    assert d1 > 0.75 * times * d0
    assert h1 < 1.1 * h0, sizes


def test_unreadable_dump_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    r = run_cli("report", str(QWEN), str(FIXTURES / "bad" / "bad-magic.kvdump"), "-o", str(out))
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("Error: ") and "bad-magic.kvdump" in r.stderr
    assert "Traceback" not in r.stderr and not out.exists() and list(tmp_path.iterdir()) == []


def test_output_rules(tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    out.write_text("mine")
    r = run_cli("report", "-q", str(QWEN), "-o", str(out))
    assert r.returncode != 0 and "output exists" in r.stderr and out.read_text() == "mine"
    assert run_cli("report", "-q", str(QWEN), "-o", str(out), "--force").returncode == 0
    assert out.read_text().startswith("<!DOCTYPE html>")
    r = run_cli("report", "-q", str(QWEN), "-o", str(QWEN))
    assert r.returncode != 0 and "input" in r.stderr
    r = run_cli("report", "-q", str(QWEN), "-o", str(tmp_path / "x.html"), "--join", "sideways")
    assert r.returncode == 2 and "--join" in r.stderr and not (tmp_path / "x.html").exists()


def test_progress_lines(tmp_path: Path) -> None:
    """The same progress display as the other commands: stderr lines off a terminal, none with -q."""
    env = {"KVCONV_PROGRESS_INTERVAL": "0.01"}
    r = run_cli("report", str(QWEN), "-o", str(tmp_path / "a.html"), env=env)
    assert r.returncode == 0 and "kvconv: report qwen3-14b.kvdump" in r.stderr
    r = run_cli("report", "-q", str(QWEN), "-o", str(tmp_path / "b.html"), env=env)
    assert r.returncode == 0 and r.stderr == ""


@pytest.mark.parametrize("bad", ["-1", "nan", "inf"])
def test_diff_bad_threshold(bad: str) -> None:
    r = run_cli("diff", str(QWEN), str(QWEN), "--max-median-change", bad)
    assert r.returncode == 2 and r.stderr.startswith("Error: ") and "--max-median-change" in r.stderr
