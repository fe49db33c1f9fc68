"""Progress on a non-terminal: periodic one-line progress on stderr, none with -q, stdout and outputs unchanged."""

from __future__ import annotations

import io
import re

import pytest

from conftest import ROOT, load_script
from kvconv.progress import Progress, ProgressOptions

gen = load_script(ROOT / "bench" / "gendump.py")
LINE = re.compile(r"^kvconv: (\w+) (\S+): (\d+)% \(([\d.]+)/([\d.]+) (GiB|MiB|KiB|B), ([\d.]+) s\)$")
FAST = {"KVCONV_PROGRESS_INTERVAL": "0.01"}  # a line every 10 ms: any real run of the command outlasts it


@pytest.fixture(scope="module")
def dump_path(tmp_path_factory):
    p = tmp_path_factory.mktemp("prog") / "p.kvdump"
    gen.write(p, gen.GenOptions(steps=300, nodes=12, seed=2))
    return p


def _progress_lines(stderr: str) -> list[re.Match]:
    return [m for m in map(LINE.match, stderr.splitlines()) if m]


@pytest.mark.parametrize("cmd,ext", [("perfetto", ".pftrace"), ("chrome", ".json"), ("arrow", "")])
def test_emitters_print_progress_lines_off_a_terminal(cli, dump_path, tmp_path, cmd, ext):
    shown = cli(cmd, dump_path, "-o", tmp_path / f"a{ext}", env=FAST)
    quiet = cli(cmd, dump_path, "-o", tmp_path / f"b{ext}", "-q", env=FAST)
    plain = cli(cmd, dump_path, "-o", tmp_path / f"c{ext}", "--no-progress", env=FAST)
    assert shown.returncode == quiet.returncode == plain.returncode == 0, shown.stderr + quiet.stderr
    lines = _progress_lines(shown.stderr)
    assert lines, shown.stderr
    for m in lines:
        assert m.group(1) == cmd and m.group(2) == dump_path.name
        assert 0 <= int(m.group(3)) <= 100 and float(m.group(4)) <= float(m.group(5))
    pct = [int(m.group(3)) for m in lines]
    assert pct == sorted(pct)  # progress only goes forward
    assert not _progress_lines(quiet.stderr) and "kvconv:" not in quiet.stderr
    assert not _progress_lines(plain.stderr)
    # stdout is the command's own, whatever progress does (only the output name differs)
    assert shown.stdout.replace(str(tmp_path / f"a{ext}"), "X") == plain.stdout.replace(str(tmp_path / f"c{ext}"), "X")
    if ext:
        assert (tmp_path / f"a{ext}").read_bytes() == (tmp_path / f"c{ext}").read_bytes()


def test_info_prints_progress_lines_off_a_terminal(cli, tmp_path):
    """info sums every payload's checksum (6 s for 10 GiB): bytes summed, on stderr only."""
    p = tmp_path / "i.kvdump"
    gen.write(p, gen.GenOptions(size_bytes=64 << 20, seed=4))
    shown, quiet = cli("info", p, env={"KVCONV_PROGRESS_INTERVAL": "0.001"}), cli("info", p, "-q", env=FAST)
    assert shown.returncode == quiet.returncode == 0, shown.stderr
    lines = _progress_lines(shown.stderr)
    assert lines and all(m.group(1) == "info" and m.group(2) == p.name for m in lines), shown.stderr
    pct = [int(m.group(3)) for m in lines]
    assert pct == sorted(pct) and pct[-1] <= 100
    assert not _progress_lines(quiet.stderr)
    assert quiet.stdout.splitlines() == shown.stdout.splitlines()[-1:]  # -q: the verdict (no warning here)


def test_default_interval_prints_nothing_for_a_short_run(cli, dump_path, tmp_path):
    r = cli("perfetto", dump_path, "-o", tmp_path / "d.pftrace")
    assert r.returncode == 0 and not _progress_lines(r.stderr)


def test_line_form_and_quiet_options():
    out = io.StringIO()
    bar = Progress("validate big.kvdump", total=100, size_bytes=10 * 2**30,
                   options=ProgressOptions(interval=3600, terminal=False), stream=out)
    bar(41)
    m = LINE.match(bar.line())
    assert m and m.group(3) == "41" and m.group(4) == "4.1" and m.group(5) == "10.0" and m.group(6) == "GiB"
    bar.update(150, 300)  # a re-stated total
    assert bar.fraction == 0.5
    bar.close()
    assert out.getvalue() == ""  # nothing before the first interval
    assert ProgressOptions.from_cli(quiet=True).enabled is False
    assert ProgressOptions.from_cli(progress=True, quiet=True).enabled is False


def test_interval_from_the_environment(monkeypatch):
    monkeypatch.setenv("KVCONV_PROGRESS_INTERVAL", "0.25")
    assert ProgressOptions.from_cli().interval == 0.25
    for bad in ("x", "-1", "nan", "0"):
        monkeypatch.setenv("KVCONV_PROGRESS_INTERVAL", bad)
        assert ProgressOptions.from_cli().interval == 2.0
