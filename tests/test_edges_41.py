"""The edges issue 41 found, each through the real command: report -q states the verdict as the converters do;
reconcile's unreadable exit is 2; a signal after the output was renamed into place never says "removed" and leaves
it; no KeyboardInterrupt traceback at the program's end; arrow writes a dump's metadata even with no context; the
report's plurals and whole-number axes; record's usage line shows the command it runs."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pyarrow.dataset as ds
import pytest

from conftest import FIXTURES, ROOT, run_cli

STALE = FIXTURES / "writes-stale-pad" / "writes-stale-pad.kvdump"
QWEN = FIXTURES / "qwen3-14b" / "qwen3-14b.kvdump"
BAD = FIXTURES / "bad"


def test_report_quiet_states_the_verdict_as_the_converters_do(tmp_path):
    conv = run_cli("perfetto", STALE, "-o", tmp_path / "t.pftrace", "-q")
    rep = run_cli("report", STALE, "-o", tmp_path / "r.html", "-q")
    assert rep.returncode == 1 and conv.returncode == 0  # report exits with the verdict, a converter with its job
    assert rep.stdout == "" and rep.stderr.count("\n") == 1
    assert rep.stderr.replace("the page was written", "X") == conv.stderr.replace("the output was written", "X")


def test_reconcile_says_unreadable_and_exits_2():
    r = run_cli("reconcile", BAD / "bad-magic.kvdump")
    assert r.returncode == 2 and r.stdout.strip() == "UNREADABLE (1 dump unreadable)", r
    r = run_cli("reconcile", BAD / "checksum-mismatch.kvdump", QWEN)
    assert r.returncode == 1 and "1 dump damaged (a payload checksum does not match); the others: ok" in r.stdout
    r = run_cli("reconcile", BAD / "bad-magic.kvdump", QWEN, "--json")
    assert r.returncode == 2


def _child(code: str, tmp_path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)


SIGNALLED = """
import os, signal, sys
from pathlib import Path
from kvconv.format.atomic import atomic_output
from kvconv.cli import interrupt

if sys.argv[-1] == "before":                           # an earlier output, to be replaced (--force)
    Path("out.bin").write_bytes(b"old")
with interrupt.handled():
    interrupt.output("out.bin")
    if sys.argv[-1] == "before":                       # before this command wrote anything
        os.kill(os.getpid(), signal.SIGTERM)
    with atomic_output("out.bin", force=True) as tmp:
        Path(tmp).write_bytes(b"x" * 100)
        if sys.argv[-1] == "mid":                      # still being written
            os.kill(os.getpid(), signal.SIGTERM)
    if sys.argv[-1] == "after":                        # renamed into place, the command still busy
        os.kill(os.getpid(), signal.SIGTERM)
print("not reached")
"""


@pytest.mark.parametrize("when", ["before", "mid", "after"])
def test_a_signal_says_what_happened_to_the_output(when, tmp_path):
    r = _child(SIGNALLED.replace('sys.argv[-1]', repr(when)), tmp_path)
    files = sorted(os.listdir(tmp_path))
    if when == "before":  # the earlier output is as it was, and not claimed as this command's
        assert r.returncode == 128 + signal.SIGTERM and (tmp_path / "out.bin").read_bytes() == b"old", r
        assert r.stderr == "Error: interrupted by SIGTERM\n"
    elif when == "mid":
        assert r.returncode == 128 + signal.SIGTERM and files == [], (r, files)
        assert r.stderr == "Error: terminated by SIGTERM: the unfinished output is removed\n"
    else:
        assert r.returncode == 0 and files == ["out.bin"], (r, files)
        assert "removed" not in r.stderr and r.stderr.startswith("SIGTERM after the output was written: ")
    assert "not reached" not in r.stdout


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """A dump whose conversion and verdict take a moment (~24 MB)."""
    sys.path.insert(0, str(ROOT / "bench"))
    import gendump

    p = tmp_path_factory.mktemp("big") / "big.kvdump"
    gendump.write(p, gendump.GenOptions(size_bytes=24 << 20))
    yield p
    shutil.rmtree(p.parent, ignore_errors=True)  # the suite's temporary space is bounded (conftest)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["INT", "TERM"])
def test_a_signal_once_the_trace_is_in_place_keeps_it_and_never_says_removed(sig, big, tmp_path):
    out = tmp_path / "t.pftrace"
    env = dict(os.environ, PYTHONPATH=str(ROOT), KVCONV_PROGRESS_INTERVAL="3600")
    p = subprocess.Popen([sys.executable, "-m", "kvconv", "perfetto", str(big), "-o", str(out), "-q"], cwd=tmp_path,
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=lambda: [signal.signal(s, signal.SIG_DFL) for s in (signal.SIGINT, signal.SIGTERM)])
    deadline = time.monotonic() + 120
    while not out.exists() and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.002)
    p.send_signal(sig)
    _, err = p.communicate(timeout=120)
    kept = out.exists() and out.stat().st_size > 0
    with contextlib.suppress(OSError):
        out.unlink()
    assert kept and "removed" not in err and "Traceback" not in err, err
    assert p.returncode == 0, (p.returncode, err)


def test_no_keyboard_interrupt_traceback_at_the_programs_end(tmp_path):
    code = f"""
import os, signal, sys, time
from kvconv.cli import main
sys.argv = ["kvconv", "report", {str(QWEN)!r}, "-o", "r.html", "-q"]
rc = main()
os.kill(os.getpid(), signal.SIGINT)   # Ctrl-C as the program ends
time.sleep(0.2)
sys.exit(rc)
"""
    r = _child(code, tmp_path)
    assert r.returncode == 0, r
    assert "KeyboardInterrupt" not in r.stderr and "Exception ignored" not in r.stderr, r.stderr


def test_arrow_writes_the_metadata_of_a_dump_with_no_context(tmp_path):
    from kvconv.format import dump

    p = tmp_path / "meta-only.kvdump"
    with dump.new(p) as w:
        w.write_metadata({"tool": "t", "tool_version": "0"})
    r = run_cli("arrow", p, "-o", tmp_path / "t")
    assert r.returncode == 0, r.stderr
    t = ds.dataset(tmp_path / "t" / "metadata", format="ipc", partitioning="hive").to_table()
    assert t.num_rows == 1 and '"tool": "t"' in t.column("json")[0].as_py()


def test_record_usage_shows_the_command_it_runs():
    r = run_cli("record", "--help")
    assert r.returncode == 0 and r.stdout.startswith("Usage: kvconv record [OPTIONS] -- CMD ARGS...\n"), r.stdout


def test_the_report_counts_in_words_and_whole_numbers(tmp_path):
    import re

    import kvconv
    from kvconv.look import plots

    with kvconv.open(QWEN) as run:
        html = run.page().html
    assert "1 warning;" in html and "1 warnings" not in html and "stream(s)" not in html
    def ticks(svg: str, axes: str) -> list[str]:
        return re.findall(rf'<g id="[{axes}]tick_\d+">.*?<text[^>]*>([^<]*)</text>', svg, re.S)

    for svg, axes in ((plots.replay_timing(np.array([1e6, 2e6, 1.5e6]), np.array([3e5, 4e5]), title="t"), "x"),
                      (plots.canary_grid({"counts": [[0, 1], [2, 0]], "x0": 1, "y0": 3, "wx": 1, "wy": 1},
                                         title="t"), "xy"),
                      (plots.sm_blocks(np.array([3, 1, 2]), title="t"), "xy")):
        labels = ticks(svg, axes)
        assert labels and all(re.fullmatch(r"[\u2212-]?[\d,]+", t) for t in labels), labels
