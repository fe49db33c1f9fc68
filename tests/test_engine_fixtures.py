"""vLLM 0.26.0 and SGLang 0.5.12 themselves, traced on an H200 (fixtures/h200-vllm-0.26, fixtures/h200-sglang-0.5.12;
issues 39, 40, 44): the seed's run with vLLM's default child process, the plugin's clean run and two planted engine
bugs, and SGLang's scheduler under a capture range. Through the CLI, as a user reads them."""

from __future__ import annotations

import json

import pytest

from conftest import FIXTURES, run_cli
from kvconv.format import dump

VLLM = FIXTURES / "h200-vllm-0.26"
SGLANG = FIXTURES / "h200-sglang-0.5.12"


def _json(*args) -> tuple[int, dict]:
    r = run_cli(*args, "--json")
    return r.returncode, json.loads(r.stdout)


def _codes(doc: dict, i: int = 0) -> set[str]:
    return {f["code"] for f in doc["dumps"][i]["result"]["findings"]}


def _incidents(doc: dict, i: int = 0) -> list[str]:
    return [x["message"] for x in doc["dumps"][i]["result"]["incidents"]]


def test_vllm_default_child_process_dump_is_complete_and_clean():
    with dump.open(VLLM / "vllm-seed.kvdump.zst") as d:
        meta = d.metadata()
    assert meta["written_at"] == "os-exit" and meta["command"][0] == "VLLM::EngineCore"
    code, doc = _json("validate", str(VLLM / "vllm-seed.kvdump.zst"))
    findings = doc["dumps"][0]["result"]["findings"]
    assert code == 0 and not [f for f in findings if f["severity"] != "info"], findings  # no timer-backwards
    r = run_cli("reconcile", str(VLLM / "vllm-seed.kvdump.zst"))
    assert r.returncode == 0
    assert "280 graph-node records = 280 expected executions = 280 device events, 0 drops" in r.stdout


def test_vllm_plugin_clean_run_passes():
    code, doc = _json("validate", str(VLLM / "plant-clean.kvdump.zst"), str(VLLM / "plant-clean.probe.kvdump.zst"))
    assert code == 0, [_incidents(doc, i) for i in (0, 1)]
    with dump.open(VLLM / "plant-clean.kvdump.zst") as d:
        kinds = {g.kind_name: g.record_count for g in d.groups}
    assert kinds["cache"] == 40 and kinds["write_step"] == 196 and kinds["slot_write"] == 61760


def test_vllm_slot_off_by_one_named_with_step_request_and_slot():
    code, doc = _json("validate", str(VLLM / "plant-slot-off-by-one.kvdump.zst"))
    assert code == 1 and "writes-unmapped-slot" in _codes(doc)
    (msg,) = _incidents(doc)
    assert "step 10" in msg and "request 5" in msg and "wrote slot 856" in msg and "instead of 855" in msg
    assert "40 of 40 caches" in msg


def test_vllm_skipped_layer_write_named_in_both_dumps():
    code, doc = _json("validate", str(VLLM / "plant-skip-layer.kvdump.zst"),
                      str(VLLM / "plant-skip-layer.probe.kvdump.zst"))
    assert code == 1
    assert "writes-missing-slot" in _codes(doc, 0)
    assert all("step 43" in m and "1 of 40 caches" in m for m in _incidents(doc, 0))
    assert "canary-value-not-written" in _codes(doc, 1)
    assert any("'L1.kv'" in m and "step 43" in m for m in _incidents(doc, 1))


@pytest.mark.parametrize("cmd", ["canary", "report"])
def test_vllm_plant_fails_through_every_judging_command(cmd, tmp_path):
    args = [cmd, str(VLLM / "plant-slot-off-by-one.kvdump.zst")]
    if cmd == "canary":
        args.append("--writes")
    if cmd == "report":
        args += ["-o", str(tmp_path / "r.html")]
    assert run_cli(*args).returncode == 1


def test_sglang_scheduler_range_left_the_warm_up_out():
    live = SGLANG / "sglang-seed.pid2041.kvdump.zst"
    with pytest.warns(dump.DumpWarning, match="unfinished"), dump.open(live) as d:
        meta = d.metadata()
        nodes, events = len(d.records("graph_node")), len(d.records("device_event"))
    assert meta["capture"]["range"] == "graph" and meta["ppid"] == 1987
    assert nodes == 320 and events == 2376  # 40 nodes x 8 replays; no eager warm-up launch in the buffer
    r = run_cli("info", str(SGLANG / "sglang-seed.pid2041.kvdump.zst"))
    assert "capture range: graph" in r.stdout and "eager_launch            0" in r.stdout


def test_sglang_scheduler_killed_mid_replay_is_incomplete_not_ok():
    code, doc = _json("validate", str(SGLANG / "sglang-seed.pid2041.kvdump.zst"))
    assert code == 5 and "unflushed-blocks" in _codes(doc) and "dropped" not in _codes(doc)
    # 320 launches recorded, 297 with all 8 blocks: the last 23 ran after the last copy; one verdict with validate
    assert any("23 of its last launches lost their blocks" in m for m in _incidents(doc))
    r = run_cli("reconcile", str(SGLANG / "sglang-seed.pid2041.kvdump.zst"))
    assert r.returncode == 5 and r.stdout.rstrip().endswith(
        "INCOMPLETE (23 launches lost blocks at the producer's end: it did not finish its dump; what it recorded "
        "agrees)")


def test_sglang_run_read_as_one_run():
    """The front (nothing checked) and the helper (nothing checked) do not hide the scheduler's verdict."""
    paths = [str(SGLANG / f) for f in ("sglang-seed.kvdump.zst", "sglang-seed.pid2041.kvdump.zst",
                                       "sglang-seed.pid2042.kvdump.zst")]
    assert run_cli("validate", *paths).returncode == 5
