"""Each command opens each dump once (issue 51): the Run holds the open dump and everything takes it (validate, the
converters, the run's process links, info, the tables). Counted at the one function every open goes through
(``kvconv.format.reader._open_file``: the file, a pipe's spooled copy, a compressed dump's decompressed copy), by a
wrapper that counts and calls it: a measurement, the code it counts runs as it is."""

from __future__ import annotations

import collections
import os

import pytest

import kvconv
from conftest import FIXTURES, run_cli
from kvconv.format import reader

QWEN = FIXTURES / "qwen3-14b" / "qwen3-14b.kvdump"
RANKS = [FIXTURES / "synthetic-multi" / f"rank{i}.kvdump" for i in (0, 1)]
# one engine run's two processes, zstd-compressed: a process that ran no target kernel beside one that did (the
# run's exit status asks for the processes' links), and a decompressed copy counts as one open
PROCS = [FIXTURES / "h200-engine-procs" / n for n in ("range-profiler.kvdump.zst", "range-profiler.pid959.kvdump.zst")]


@pytest.fixture
def opens(monkeypatch):
    """``path name -> opens`` while the test runs."""
    counts: collections.Counter = collections.Counter()
    real = reader._open_file

    def counting(path):
        counts[os.path.basename(path)] += 1
        return real(path)

    monkeypatch.setattr(reader, "_open_file", counting)
    return counts


def _argv(cmd: str, dumps: list, tmp_path) -> list:
    out = {"perfetto": "t.pftrace", "chrome": "t.json", "arrow": "tables", "report": "r.html"}.get(cmd)
    return [cmd, *dumps, *(["-o", tmp_path / out] if out else [])]


COMMANDS = ["info", "validate", "reconcile", "canary", "perfetto", "chrome", "arrow", "report"]
INPUTS = {"one": [QWEN], "two-ranks": RANKS, "two-processes": PROCS}
CASES = [(c, k) for c in COMMANDS for k in INPUTS if c != "canary" or k == "one"]  # canary takes one dump


@pytest.mark.parametrize("cmd,inputs", CASES, ids=[f"{c}-{k}" for c, k in CASES])
def test_each_command_opens_each_dump_once(cmd, inputs, tmp_path, opens):
    dumps = INPUTS[inputs]
    r = run_cli(*_argv(cmd, dumps, tmp_path))
    assert r.returncode in (0, 1, 4, 5), r.stderr
    assert dict(opens) == {p.name: 1 for p in dumps}, (cmd, r.stderr)


def test_diff_opens_each_dump_once(opens):
    r = run_cli("diff", *RANKS)
    assert r.returncode in (0, 1), r.stderr
    assert dict(opens) == {p.name: 1 for p in RANKS}


def test_converters_with_merge_or_append_open_each_dump_once(tmp_path, opens):
    r = run_cli("arrow", QWEN, "-o", tmp_path / "tables")
    assert r.returncode == 0 and opens[QWEN.name] == 1
    opens.clear()
    r = run_cli("arrow", RANKS[0], "-o", tmp_path / "tables", "--append")
    assert r.returncode == 0, r.stderr
    assert dict(opens) == {RANKS[0].name: 1}


def test_the_run_opens_each_dump_once_whatever_it_is_asked(tmp_path, opens):
    from kvconv.emit import EmitOptions

    with kvconv.open(RANKS) as run:
        run.to_perfetto(tmp_path / "t.pftrace", options=EmitOptions(verdict=True, progress=False))
        assert run.verdict == "ok" and run.exit_code == 0
        assert run.table("launch").num_rows > 0 and "device_event" in run.tables
        run.report(tmp_path / "r.html")
        [d.reconciliation for d in run.dumps]
    assert dict(opens) == {p.name: 1 for p in RANKS}


@pytest.mark.parametrize("cmd", ["validate", "report"])
def test_a_run_found_from_one_dump_opens_each_dump_once(cmd, tmp_path, opens):
    # the other process's dump is found beside the one named (kvconv.check.runs.find): its metadata is read through
    # the DumpRun the run then holds, not from a second open
    r = run_cli(*_argv(cmd, PROCS[:1], tmp_path))
    assert r.returncode in (0, 1, 4, 5), r.stderr
    assert dict(opens) == {p.name: 1 for p in PROCS}, (cmd, r.stderr)


def test_a_file_found_beside_but_not_of_the_run_is_opened_once(tmp_path, opens):
    # a dump named like the run's other processes but of another process tree: asked once, closed, left out
    import shutil

    a, stranger = tmp_path / "run.kvdump", tmp_path / "run.pid7.kvdump"
    shutil.copy(QWEN, a)
    shutil.copy(RANKS[0], stranger)
    with kvconv.open(a) as run:
        paths = run.paths
        assert run.verdict == "ok"
    assert paths == [str(a)]
    assert dict(opens) == {"run.kvdump": 1, "run.pid7.kvdump": 1}


def test_diff_of_a_process_dump_opens_each_dump_of_its_run_once(opens):
    r = run_cli("diff", PROCS[0], RANKS[0])
    assert r.returncode in (0, 1, 4, 5), r.stderr
    assert dict(opens) == {p.name: 1 for p in [*PROCS, RANKS[0]]}, r.stderr
