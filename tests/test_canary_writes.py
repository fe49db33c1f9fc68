"""The write-address canary (issue 16) through the real CLI: the four H200 fixtures fixtures/writes-* (recorded with
native/scripts/gpu_writes.sh) against what their workload planted (planted.json, computed independently of the
tracer), small synthetic dumps for the cases no fixture has, and older dumps."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from conftest import FIXTURES, run_cli
from kvconv.format import dump, layout

# clean-80 / wrong-page-80: 80 caches and 192-byte slots (the device's second search level and its division path)
CASES = ["clean", "pad-minus-one", "stale-pad", "wrong-page", "clean-80", "wrong-page-80"]


def _expected(case: str) -> set[tuple[str, int, int]]:
    """(code, step, slot) of every bad write the workload planted, from its own record of the slot buffer: per step,
    what the graph's slot buffer held (actual) against what the engine meant (intended); every row is written into
    every cache (layers x K, V). Outside writes are keyed by slot -1."""
    p = json.loads((FIXTURES / f"writes-{case}" / "planted.json").read_text())
    out = set()
    for s in p["steps"]:
        for act, want, pad in zip(s["actual"], s["intended"], s["pad"]):
            if pad and act < 0:  # PADDING_SLOT_ID: skipped by the kernel unless its check is what was planted away
                if p["plant"] == "pad-minus-one":
                    out.add(("writes-outside-cache", s["step"], -1))
            elif pad and act != want:  # a padding row meant for the dummy page writes a stale slot
                out.add(("writes-unmapped-slot", s["step"], act))
            elif not pad and act != want:  # a live row written to the wrong slot
                out.add(("writes-unmapped-slot", s["step"], act))
                out.add(("writes-missing-slot", s["step"], want))
    return out


def _reported(case: str) -> tuple[int, set, dict]:
    r = run_cli("canary", "--writes", f"writes-{case}.kvdump", "--json", cwd=FIXTURES / f"writes-{case}")
    doc = json.loads(r.stdout)["dumps"][0]
    d = dump.open(FIXTURES / f"writes-{case}" / f"writes-{case}.kvdump")
    sw, caches = d.records("slot_write"), d.records("cache")
    ps = {int(c["cache_id"]): int(c["page_size"]) for c in caches}
    got = set()
    per_code: dict[str, int] = {}
    for f in doc["result"]["findings"]:
        per_code[f["code"]] = per_code.get(f["code"], 0) + f["count"]
        if f["message"].endswith("more like the above, not listed"):  # past the named ones of its code: counted
            continue
        step = int(re.search(r"step (\d+)", f["message"]).group(1))
        if f["record"] is not None:
            w = sw[f["record"]]  # the record the finding names, read back from the dump
            assert f["offset"] == d.groups_of("slot_write")[0].record_offset(f["record"]) + (
                0 if f["code"] == "writes-outside-cache" else 32)
            slot = -1 if int(w["flags"]) & 2 else int(w["page"]) * ps[int(w["cache_id"])] + int(w["offset"])
            assert f"block ({int(w['block_x'])},{int(w['block_y'])},{int(w['block_z'])})" in f["message"]
        else:
            slot = int(re.search(r"at slot (\d+)", f["message"]).group(1))
        got.add((f["code"], step, slot))
    return r.returncode, got, per_code


@pytest.mark.parametrize("case", CASES)
def test_planted_writes_are_found_and_nothing_else(case):
    code, got, per_code = _reported(case)
    want = _expected(case)
    n_caches = len(dump.open(FIXTURES / f"writes-{case}" / f"writes-{case}.kvdump").records("cache"))
    # every planted row is reported once per cache (layers x K, V); past the first named ones of a code, counted
    assert per_code == {c: n_caches * sum(1 for w in want if w[0] == c) for c in {w[0] for w in want}}
    assert got <= want and (got == want or sum(per_code.values()) > len(got))
    assert code == (0 if case.startswith("clean") else 1)


def test_stale_pad_names_slot_block_node_replay_and_both_requests():
    r = run_cli("canary", "--writes", "--all", "writes-stale-pad.kvdump", cwd=FIXTURES / "writes-stale-pad")
    first = r.stdout.splitlines()[1]
    assert re.search(r"step 3 replay 3 node 0x[0-9a-f]+ kernel 'reshape_and_cache_flash_kernel' gridid \d+ "
                     r"block \(3,0,0\): cache 'L0.k' slot 60 \(page 7 offset 4\)", first), first
    assert "a slot of request 4 (mapped at step 2)" in first and "batch row 3 of the step: a padding row" in first
    assert r.stdout.rstrip().endswith("FAILED") and r.returncode == 1


def test_pad_minus_one_is_reported_before_the_cache():
    r = run_cli("canary", "--writes", "--all", "writes-pad-minus-one.kvdump", cwd=FIXTURES / "writes-pad-minus-one")
    lines = [x for x in r.stdout.splitlines() if "writes-outside-cache" in x]
    assert len(lines) == 8 and all("256 bytes before cache" in x and "slot -1" in x for x in lines)


@pytest.mark.parametrize("case", CASES)
def test_fixture_groups_carry_minor_2_only_for_the_new_kinds(case):
    d = dump.open(FIXTURES / f"writes-{case}" / f"writes-{case}.kvdump")
    for g in d.groups:
        assert g.minor == (2 if g.kind_name in layout.MINOR_OF_KINDS else 0), g.kind_name


def test_older_dump_is_nothing_checked():
    r = run_cli("canary", "--writes", "single.kvdump", cwd=FIXTURES / "h200-single")
    assert r.returncode == 4 and "writes-nothing-checked" in r.stdout and r.stdout.rstrip().endswith(
        "NOTHING CHECKED (no slot_write records or steps; see docs/CANARY.md)")


def _synthetic(path, *, drops=0):
    """One graph replay (gridid 5, tag 1) of a one-node graph, one step mapping slots 8 and 9 of a 16-slot cache,
    blocks 0 and 1 both writing slot 8 (a conflict; slot 9 never written), and a write of an unknown launch."""
    gn = np.zeros(1, layout.DTYPES["host_launch"])
    gn["grid_id"], gn["tag"], gn["launch_id"], gn["node"], gn["host_ns"] = 5, 1, 1, 0xABC, 1500
    gn["flags"], gn["kernel_slot"], gn["grid_x"] = 1 | 8, 1, 2
    cache = np.zeros(1, layout.DTYPES["cache"])
    cache["base"], cache["size"], cache["slot_bytes"], cache["page_size"], cache["name"] = 1 << 20, 16 * 64, 64, 4, b"c"
    sw = np.zeros(3, layout.DTYPES["slot_write"])
    sw["gridid"], sw["tag"], sw["kernel_slot"], sw["stores"], sw["flags"] = [5, 5, 7], 1, 1, 4, 1
    sw["page"], sw["offset"], sw["block_x"] = [2, 2, 2], [0, 0, 1], [0, 1, 0]
    sw["addr_lo"] = (1 << 20) + 8 * 64
    sw["addr_hi"] = sw["addr_lo"] + 64
    steps = np.zeros(1, layout.DTYPES["write_step"])
    steps["step"], steps["begin_ns"], steps["end_ns"], steps["map_count"] = 0, 1000, 2000, 2
    smap = np.zeros(2, layout.DTYPES["slot_map"])
    smap["slot"], smap["request_id"], smap["token"] = [8, 9], [11, 12], [0, 1]
    with dump.new(path) as w:
        w.write_metadata({"tool": "test"})
        w.write_records("graph_node", gn)
        w.write_records("cache", cache)
        w.write_records("slot_write", sw, drop_count=drops)
        w.write_records("write_step", steps)
        w.write_records("slot_map", smap)


def test_synthetic_conflict_missing_unattributed_and_drops(tmp_path):
    _synthetic(tmp_path / "s.kvdump", drops=3)
    r = run_cli("canary", "--writes", "s.kvdump", "--json", cwd=tmp_path)
    assert r.returncode == 1
    codes = [f["code"] for f in json.loads(r.stdout)["dumps"][0]["result"]["findings"]]
    assert sorted(codes) == ["writes-dropped", "writes-missing-slot", "writes-slot-conflict", "writes-unattributed"]
    text = run_cli("canary", "--writes", "--all", "s.kvdump", cwd=tmp_path).stdout
    assert "slot 8 written by 2 blocks: gridid 5 block (0,0,0), gridid 5 block (1,0,0)" in text
    assert "request 12's token at slot 9 (page 2 offset 1) was not written in cache 'c'" in text


def test_unreadable_dump_exits_2(tmp_path):
    (tmp_path / "bad.kvdump").write_bytes(b"not a dump at all, longer than a header " * 4)
    r = run_cli("canary", "--writes", "bad.kvdump", cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr


@pytest.mark.parametrize("case", CASES)
def test_json_follows_its_schema(case):
    import jsonschema

    from kvconv.format.layout import load_json_schema

    r = run_cli("canary", "--writes", f"writes-{case}.kvdump", "--json", cwd=FIXTURES / f"writes-{case}")
    res = json.loads(r.stdout)["dumps"][0]["result"]
    jsonschema.validate(res, load_json_schema("canary_writes.schema.json"))
    assert res["ok"] == case.startswith("clean") and res["summary"]["errors"] == sum(
        f["count"] for f in res["findings"] if f["severity"] == "error")


def test_record_writes_sets_the_tracer_switch(tmp_path):
    from kvconv.capture.record import RecordOptions, tracer_env

    assert tracer_env(RecordOptions(writes=True), lib="x.so", base={})["KVCONV_WRITES"] == "1"
    assert "KVCONV_WRITES" not in tracer_env(RecordOptions(), lib="x.so", base={})
    assert "--writes" in run_cli("record", "--help").stdout


def _unregistered(src, path, *, steps: bool):
    """``src`` as `kvconv record --writes` leaves it with no cache registered (issue 39): no cache group, every store
    a granule outside every cache; ``steps``: the probe's steps and slot maps kept (the probe ran, without caches)."""
    drop = {"cache"} | (set() if steps else {"write_step", "slot_map"})
    with dump.open(src) as d, dump.new(path) as w:
        for g in (g for g in d.groups if g.kind_name not in drop):
            payload = bytes(g.payload_bytes())
            if g.kind_name == "slot_write":
                sw = np.frombuffer(payload, layout.DTYPES["slot_write"]).copy()
                sw["flags"] |= layout.ENUMS["slot_write_flags"]["outside"]
                payload = sw.tobytes()
            w.write_raw_group(g.kind, payload, record_count=g.record_count, capacity=g.capacity,
                              drop_count=g.drop_count, context_id=g.context_id, device_id=g.device_id,
                              clock_domain=g.clock_domain)
    return path


@pytest.mark.parametrize("steps", [False, True], ids=["no-probe", "probe-without-caches"])
def test_unregistered_writes_are_nothing_checked_not_invalid(tmp_path, steps):
    """Was: 'INVALID (104 errors)', writes-outside-cache: no cache is registered, while nothing was checked."""
    p = _unregistered(FIXTURES / "writes-clean" / "writes-clean.kvdump", tmp_path / "u.kvdump", steps=steps)
    c = run_cli("canary", "--writes", p)
    assert c.returncode == 4, c.stdout + c.stderr
    assert "writes-outside-cache" not in c.stdout and "NOTHING CHECKED" in c.stdout
    hint = next(ln for ln in c.stdout.splitlines() if "writes-no-cache" in ln)
    assert "104 slot-write records but no cache is registered" in hint and "--engine vllm" in hint, hint
    assert "WriteProbe.register_cache" in hint and "docs/CANARY.md" in hint, hint
    j = json.loads(run_cli("canary", "--writes", "--json", p).stdout)["dumps"][0]["result"]
    assert j["verdict"] == "nothing-checked" and j["summary"]["records"] == 0
    v = json.loads(run_cli("validate", "--json", p).stdout)  # reconcile and the rest judge as before: clean
    res = v["dumps"][0]["result"]
    assert v["exit"] == 0 and res["verdict"] == "ok" and res["errors"] == 0, res["findings"]
    assert run_cli("report", p, "-o", tmp_path / "r.html").returncode == 0
