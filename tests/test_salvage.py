"""Salvage (issue 7): a dump cut short (a killed process, a full disk) is read up to its last whole record, the loss
reported per record group, and converted by the emitters with a warning.

A truncated copy of each committed fixture (fixtures/*/*.kvdump that are structurally intact) is cut inside a record
of its last multi-record group, then read by the library, ``info``/``validate`` and every emitter with ``--salvage``.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import warnings

import numpy as np
import pytest

from conftest import FIXTURES, Result, run_cli
from kvconv.format import dump, layout
from kvconv.format.errors import FormatError


def _intact(p) -> bool:
    d = dump.scan(p, options=dump.ReadOptions(verify_checksums=False))
    try:
        return not any(f.severity == "error" for f in d.problems)
    finally:
        d.close()


def _groups(raw: bytes):
    out, pos = [], 0
    while pos + layout.HEADER_SIZE <= len(raw):
        h = np.frombuffer(raw, dtype=layout.HEADER_DTYPE, count=1, offset=pos)[0]
        n = int(h["record_count"]) * int(h["record_size"])
        out.append((pos, int(h["record_count"]), int(h["record_size"])))
        pos += layout.HEADER_SIZE + layout.padded(n)
    return out


# intact dumps with a group of 2+ fixed-size records to cut into (h200-typo-pattern: its metadata group alone)
FIXTURE_DUMPS = [p for p in sorted(FIXTURES.glob("*/*.kvdump"))
                 if _intact(p) and any(n >= 2 and rs > 1 for _, n, rs in _groups(p.read_bytes()))]
IDS = [f"{p.parent.name}/{p.stem}" for p in FIXTURE_DUMPS]


def cut_inside_record(src, dst):
    """Copy ``src`` to ``dst`` cut halfway into a record of its last group holding 2+ records (a record group with
    a layout when there is one). Returns (group index, records kept, records lost)."""
    raw = src.read_bytes()
    gs = _groups(raw)
    cands = [i for i, (_, n, rs) in enumerate(gs) if n >= 2 and rs > 1] or \
        [i for i, (_, n, rs) in enumerate(gs) if n >= 2]
    k = cands[-1]
    off, n, rs = gs[k]
    keep = n // 2
    at = off + layout.HEADER_SIZE + keep * rs + max(1, rs // 2)
    dst.write_bytes(raw[:at])
    whole = (at - off - layout.HEADER_SIZE) // rs
    return k, whole, n - whole


# the fast tier cuts a sample (H200 captures with and without block exits, two contexts, write records); the slow
# tier every fixture
SAMPLE = {"h200-single/single", "synthetic-reconcile/two-contexts", "writes-stale-pad/writes-stale-pad",
          "h200-enter-exit/enter-exit"}


@pytest.fixture(params=[p if i in SAMPLE else pytest.param(p, marks=pytest.mark.slow)
                        for p, i in zip(FIXTURE_DUMPS, IDS)], ids=IDS)
def cut(request, tmp_path):
    src = request.param
    dst = tmp_path / f"cut-{src.name}"
    k, whole, lost = cut_inside_record(src, dst)
    return src, dst, k, whole, lost


def test_there_are_fixtures():
    assert len(FIXTURE_DUMPS) >= 5
    assert any(p.name == "qwen3-14b.kvdump" for p in FIXTURE_DUMPS)


def test_library_reads_up_to_the_last_whole_record(cut):
    src, dst, k, whole, lost = cut
    with pytest.raises(FormatError) as e:
        dump.open(dst)
    assert e.value.code in ("truncated-payload", "count-exceeds-file")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        d = dump.open(dst, options=dump.ReadOptions(salvage=True))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the original's own warnings (future-minor says newer-minor) were seen above
        orig = dump.open(src, options=dump.ReadOptions(verify_checksums=False))
    with d, orig:
        assert any("salvaged" in str(x.message) and f"lost {lost:,}" in str(x.message) for x in w), \
            [str(x.message) for x in w]
        assert len(d.groups) == k + 1  # the groups before the cut, whole, and the cut one
        g = d.groups[k]
        assert g.lost_records == lost and len(g.records) == whole
        assert all(x.lost_records == 0 for x in d.groups[:k])
        for a, b in zip(d.groups, orig.groups):
            n = len(a.records)
            assert a.records.tobytes() == b.records[:n].tobytes()


def cli_inprocess(*args) -> Result:
    """``kvconv ARGS`` through the real entry point, in this process (a subprocess per fixture is too slow here)."""
    from kvconv import cli

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), warnings.catch_warnings():
        rc = cli.main([str(a) for a in args])
    return Result(rc, out.getvalue(), err.getvalue())


def test_info_and_validate_report_the_loss_per_group(cut):
    src, dst, k, whole, lost = cut
    r = cli_inprocess("info", dst)
    assert r.returncode == 2 and r.stderr.startswith("Error: ") and "--salvage" in r.stderr
    r = cli_inprocess("info", "--salvage", "--json", dst)
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)["dumps"][0]["result"]
    assert [g["lost_records"] for g in info["groups"]] == [0] * k + [lost]
    assert info["groups"][k]["record_count"] == whole
    r = cli_inprocess("info", "--salvage", dst)
    assert f"(lost to truncation {lost:,})" in r.stdout

    r = cli_inprocess("validate", dst)
    assert r.returncode == 2 and "--salvage" in r.stderr
    r = cli_inprocess("validate", "--salvage", "--json", dst)
    # readable now, never valid (issue 48): incomplete, or failed where findings (missing blocks) remain
    assert r.returncode in (1, 5), r.stderr
    rep = json.loads(r.stdout)["dumps"][0]["result"]
    assert rep["verdict"] == ("failed" if rep["errors"] else "incomplete"), rep["verdict"]
    loss = [f for f in rep["findings"] if f["code"] == "salvaged-loss"]
    assert [(f["group"], f["severity"]) for f in loss] == [(k, "warning")]
    assert f"{lost:,} " in loss[0]["message"]


def _commands():
    import typer.main

    from kvconv.cli import app

    return typer.main.get_command(app).commands


EMITTERS = {"perfetto": "out.pftrace", "chrome": "out.json", "arrow": "out-tables"}


@pytest.mark.parametrize("emitter", sorted(EMITTERS))
def test_emitters_convert_a_salvaged_dump(cut, emitter, tmp_path):
    src, dst, k, whole, lost = cut
    cmds = _commands()
    assert emitter in cmds, f"no `kvconv {emitter}` command"
    opts = {o for p in cmds[emitter].params for o in getattr(p, "opts", [])}
    assert "--salvage" in opts, f"kvconv {emitter} has no --salvage flag"
    out = tmp_path / "out" / EMITTERS[emitter]
    out.parent.mkdir()
    # Without --salvage the cut dump is refused, and nothing is written.
    r = cli_inprocess(emitter, dst, "-o", out)
    assert r.returncode == 2 and r.stderr.startswith("Error: "), r.stderr
    assert list(out.parent.iterdir()) == []
    r = run_cli(emitter, "--salvage", dst, "-o", out)
    assert r.returncode == 0, r.stderr
    assert out.exists()
    assert "Traceback" not in r.stderr
    warn = [ln for ln in r.stderr.splitlines() if ln.lower().startswith("warning")]
    assert any("lost" in ln or "salvage" in ln for ln in warn), r.stderr
    assert sorted(p.name for p in out.parent.iterdir()) == [out.name]  # no temporaries left beside it


@pytest.mark.parametrize("emitter", sorted(EMITTERS))
def test_emitters_refuse_a_cut_dump_without_salvage(emitter, tmp_path):
    assert emitter in _commands(), f"no `kvconv {emitter}` command"
    dst = tmp_path / "cut.kvdump"
    cut_inside_record(FIXTURES / "bad" / "valid-small.kvdump", dst)
    out = tmp_path / "out" / EMITTERS[emitter]
    out.parent.mkdir()
    r = run_cli(emitter, dst, "-o", out)
    assert r.returncode == 2 and r.stderr.startswith("Error: ") and r.stderr.count("\n") == 1, r.stderr
    assert list(out.parent.iterdir()) == []


def test_cut_inside_a_header_keeps_every_group_before(tmp_path):
    src = FIXTURES / "bad" / "valid-small.kvdump"
    raw = src.read_bytes()
    gs = _groups(raw)
    dst = tmp_path / "cut.kvdump"
    dst.write_bytes(raw[: gs[-1][0] + 30])
    r = cli_inprocess("info", "--salvage", "--json", dst)
    assert r.returncode == 0, r.stderr
    assert len(json.loads(r.stdout)["dumps"][0]["result"]["groups"]) == len(gs) - 1
    r = cli_inprocess("validate", "--salvage", "--json", dst)
    codes = {(f["code"], f["severity"]) for f in json.loads(r.stdout)["dumps"][0]["result"]["findings"]}
    assert ("truncated-header", "warning") in codes


def test_cut_at_the_first_record_salvages_zero_records(tmp_path):
    src = FIXTURES / "bad" / "valid-small.kvdump"
    raw = src.read_bytes()
    off, n, rs = _groups(raw)[-1]
    dst = tmp_path / "cut.kvdump"
    dst.write_bytes(raw[: off + layout.HEADER_SIZE + rs - 1])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with dump.open(dst, options=dump.ReadOptions(salvage=True)) as d:
            assert len(d.groups[-1].records) == 0 and d.groups[-1].lost_records == n


def test_salvage_does_not_hide_other_damage(tmp_path):
    """--salvage reads a cut-short file; it does not excuse a bad header in the middle."""
    src = FIXTURES / "bad" / "bad-magic.kvdump"
    dst = tmp_path / "x.kvdump"
    shutil.copy(src, dst)
    r = run_cli("info", "--salvage", dst)
    assert r.returncode == 2 and r.stderr.startswith("Error: ") and "bad magic" in r.stderr


def test_salvage_that_keeps_nothing_is_not_valid(tmp_path):
    """A file cut inside its first group (``head -c 100`` of a real dump): salvage reads no group, and that is an
    unreadable dump, not a valid empty one."""
    cut = tmp_path / "cut.kvdump"
    cut.write_bytes((FIXTURES / "h200-single" / "single.kvdump").read_bytes()[:100])
    for cmd in ("validate", "info"):
        r = run_cli(cmd, "--salvage", cut)
        assert r.returncode == 2, (cmd, r.stdout, r.stderr)
        assert "nothing to check" in r.stderr and "valid" not in r.stdout and "Traceback" not in r.stderr
