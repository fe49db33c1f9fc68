"""The H200 captures of an engine's process shapes under kvconv record (fixtures/h200-engine-procs, issue 44): every
process kept under its own name, a capture range of each kind, a forked engine child ended by SIGTERM + os._exit
(finished dump), a SIGKILLed child (live dump: sealed when nothing is pending), and a warm-up flood that overflows."""

from __future__ import annotations

import json
import shutil

import pytest

from conftest import FIXTURES, run_cli
from kvconv.capture.seal import seal
from kvconv.format import dump

CASE = FIXTURES / "h200-engine-procs"


def _meta(name: str) -> dict:
    with dump.open(CASE / name) as d:
        return d.metadata()


def _decompressed(name: str, tmp_path):
    import zstandard

    out = tmp_path / name.removesuffix(".zst")
    with open(CASE / name, "rb") as src, open(out, "wb") as dst:
        shutil.copyfileobj(zstandard.ZstdDecompressor().stream_reader(src), dst)
    return out


def _validate(*paths) -> tuple[int, dict]:
    r = run_cli("validate", "--json", *map(str, paths))
    return r.returncode, json.loads(r.stdout)


def test_forked_engine_child_ended_by_sigterm_finishes_its_dump():
    meta = _meta("fork-sigterm.kvdump.zst")
    assert meta["written_at"] == "os-exit"  # vLLM's shape: SystemExit, then multiprocessing's os._exit
    code, out = _validate(CASE / "fork-sigterm.kvdump.zst")
    findings = out["dumps"][0]["result"]["findings"]
    assert code == 0 and not [f for f in findings if f["severity"] != "info"], findings
    r = run_cli("reconcile", str(CASE / "fork-sigterm.kvdump.zst"))
    assert r.returncode == 0
    assert "280 graph-node records = 280 expected executions = 280 device events, 0 drops" in r.stdout


@pytest.mark.parametrize("name, start, stop, before, eager, nodes", [
    ("range-profiler.pid959.kvdump.zst", "cuProfilerStart", "cuProfilerStop", 2440, 0, 360),
    ("range-launches.kvdump.zst", "launches", None, 2401, 40, 360),
    ("range-signal.pid1175.kvdump.zst", "SIGUSR1", "SIGUSR2", 160, 0, 360),
])
def test_capture_range_recorded_and_only_its_launches_traced(name, start, stop, before, eager, nodes):
    cap = _meta(name)["capture"]
    (rng,) = cap["ranges"]
    assert rng["start"] == start and rng.get("stop") == stop and rng["target_launches_before"] == before
    with dump.open(CASE / name) as d:
        assert len(d.records("eager_launch")) == eager and len(d.records("graph_node")) == nodes
    out = cap["out_of_range"]
    assert out["eager_launches"] + out["graph_node_launches"] == before - (1 if start == "launches" else 0)
    code, _ = _validate(CASE / name)
    assert code == 0
    r = run_cli("info", str(CASE / name))
    assert f"capture range: {cap['range']} ({start} after {before:,} target launches" in r.stdout


def test_profiler_range_left_the_warm_up_flood_out():
    out = _meta("range-profiler.pid959.kvdump.zst")["capture"]["out_of_range"]
    # 60 warm-up forwards + the prefill, 40 layers, 512 blocks each: what the range kept out of the buffer
    assert out == {"eager_launches": 2440, "graph_node_launches": 0, "graph_replays": 0, "blocks": 2440 * 512}


def test_every_process_has_its_own_dump_and_the_front_traced_nothing():
    front, child = _meta("range-profiler.kvdump.zst"), _meta("range-profiler.pid959.kvdump.zst")
    assert child["ppid"] == front["pid"] and child["output_owner_pid"] == str(front["pid"])
    code, out = _validate(CASE / "range-profiler.kvdump.zst")  # the -o path: the child's dump is found beside it
    assert [d["path"].rsplit("/", 1)[-1] for d in out["dumps"]] == ["range-profiler.kvdump.zst",
                                                                    "range-profiler.pid959.kvdump.zst"]
    assert out["dumps"][0]["exit"] == 4  # the front ran no target kernel: nothing checked, alone
    assert code == 0 and out["run"]["verdict"] == "ok"  # which does not make the checked run nothing-checked


def test_sigkilled_child_is_sealed_when_nothing_is_pending(tmp_path):
    live = _decompressed("spawn-sigkill-graph.pid831.kvdump.zst", tmp_path)
    assert _validate(live)[0] == 5  # as SIGKILL left it: incomplete
    size = live.stat().st_size
    assert seal(str(live)) == "sealed" and seal(str(live)) == "finished"
    assert live.stat().st_size < size // 100  # the 262,144-event reservation is gone
    code, out = _validate(live)
    assert code == 0 and not [f for f in out["dumps"][0]["result"]["findings"] if f["severity"] != "info"]
    with dump.open(live) as d:
        assert d.metadata()["written_at"] == "sealed-by-record"
    r = run_cli("reconcile", str(live))
    assert "360 graph-node records = 360 expected executions = 360 device events, 0 drops" in r.stdout


def test_flooded_child_is_not_sealed_and_not_ok(tmp_path):
    live = _decompressed("spawn-sigkill-flood.pid704.kvdump.zst", tmp_path)
    before = live.read_bytes()
    assert seal(str(live)) == "pending" and live.read_bytes() == before
    code, out = _validate(live)
    assert code == 1 and "dropped" in {f["code"] for f in out["dumps"][0]["result"]["findings"]}
    r = run_cli("reconcile", "--json", str(live))
    assert r.returncode != 0 and json.loads(r.stdout)["ok"] is False
