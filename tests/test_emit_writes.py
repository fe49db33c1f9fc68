"""The write-address canary's records in the outputs (issue 16), through the real CLI on the H200 fixtures
fixtures/writes-*: Arrow's ``slot_write`` table read back by pyarrow and DuckDB, the block events of the Perfetto and
Chrome traces annotated with cache, slot and request, checked against what the workload planted (planted.json)."""

from __future__ import annotations

import json

import pytest

from conftest import FIXTURES, run_cli
from kvconv.format import dump


def _planted_stale(case: str) -> set[tuple[int, int, int]]:
    """(step, slot, owner request) of every padding row the workload sent to a live slot: the owner is the request
    whose live token was mapped to that slot last, in an earlier step (from planted.json alone)."""
    p = json.loads((FIXTURES / f"writes-{case}" / "planted.json").read_text())
    owner, out = {}, set()
    for s in sorted(p["steps"], key=lambda s: s["step"]):
        for act, want, pad in zip(s["actual"], s["intended"], s["pad"]):
            if pad and act >= 0 and act != want:
                out.add((s["step"], act, owner[act]))
        for act, req, pad in zip(s["actual"], s["requests"], s["pad"]):
            if not pad:
                owner[act] = req
    return out


@pytest.fixture(scope="module")
def stale_tables(tmp_path_factory):
    out = tmp_path_factory.mktemp("w") / "tables"
    r = run_cli("arrow", FIXTURES / "writes-stale-pad" / "writes-stale-pad.kvdump", "-o", out)
    assert r.returncode == 0, r.stderr
    return out


def test_slot_write_table_pyarrow_names_the_stale_pad_writes(stale_tables):
    import pyarrow.dataset as ds

    t = ds.dataset(stale_tables / "slot_write", format="ipc", partitioning="hive").to_table()
    d = dump.open(FIXTURES / "writes-stale-pad" / "writes-stale-pad.kvdump")
    assert t.num_rows == len(d.records("slot_write"))  # one row per record
    rows = t.to_pylist()
    expected = _planted_stale("stale-pad")
    assert expected and {(60, 4)} == {(s, o) for _, s, o in expected}
    bad = [r for r in rows if r["status"] == "unmapped"]
    assert {(r["write_step"], r["kv_slot"], r["slot_owner"]) for r in bad} == expected
    assert len(bad) == 4 * len(expected)  # every bad row written into the 4 caches (2 layers x K, V)
    assert {r["cache"] for r in bad} == {"L0.k", "L0.v", "L1.k", "L1.v"}
    assert all(r["request"] is None and r["page"] == 7 and r["offset"] == 4 and r["replay"] == r["write_step"]
               for r in bad)
    # the planted row's own slot, a step earlier, was request 4's token: written as mapped, request 4
    ok = [r for r in rows if r["kv_slot"] == 60 and r["status"] == "mapped"]
    assert ok and all(r["request"] == 4 and r["write_step"] == 2 for r in ok)
    assert not [r for r in rows if r["status"] in ("outside", "no-step", "unknown-cache")]


def test_slot_write_table_duckdb_joins_device_events(tmp_path):
    """DuckDB's own Parquet reader: the slot_write table joins device_event on (context, gridid, tag, block)."""
    duckdb = pytest.importorskip("duckdb")
    out = tmp_path / "tables"
    r = run_cli("arrow", FIXTURES / "writes-stale-pad" / "writes-stale-pad.kvdump", "-o", out, "--format", "parquet")
    assert r.returncode == 0, r.stderr
    con = duckdb.connect()
    for view, table in (("sw", "slot_write"), ("ev", "device_event")):
        con.sql(f"create view {view} as select * from read_parquet('{out}/{table}/**/*.parquet', "
                "hive_partitioning=true)")
    got = con.execute("""
        select sw.write_step, sw.kv_slot, sw.slot_owner, count(*) as n, count(ev.sequence) as events
        from sw left join ev on sw.context_id = ev.context_id and sw.gridid = ev.gridid and sw.tag = ev.tag
            and sw.block_x = ev.block_x and sw.block_y = ev.block_y and sw.block_z = ev.block_z
        where sw.status = 'unmapped' group by all order by all""").fetchall()
    assert {(s, k, o) for s, k, o, _, _ in got} == _planted_stale("stale-pad")
    assert all(n == 4 and e == 4 for *_, n, e in got)  # each of the 4 rows of a step joins its block's entry
    unjoined = con.execute("""select count(*) from sw anti join ev on sw.context_id = ev.context_id and
        sw.gridid = ev.gridid and sw.tag = ev.tag and sw.block_x = ev.block_x and sw.block_y = ev.block_y and
        sw.block_z = ev.block_z""").fetchone()[0]
    assert unjoined == 0


def _perfetto_block_events(path):
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

    t = pb.Trace()
    t.ParseFromString(path.read_bytes())
    names, ann, strings, out = {}, {}, {}, []
    for p in t.packet:
        if p.HasField("interned_data") and p.trusted_packet_sequence_id == 2:
            names.update({e.iid: e.name for e in p.interned_data.event_names})
            ann.update({e.iid: e.name for e in p.interned_data.debug_annotation_names})
            strings.update({e.iid: e.str.decode() for e in p.interned_data.debug_annotation_string_values})
        if p.HasField("track_event") and p.trusted_packet_sequence_id == 2 and p.track_event.name_iid \
                and any(ann.get(a.name_iid) == "block_x" for a in p.track_event.debug_annotations):
            args = {ann[a.name_iid]: (strings[a.string_value_iid] if a.string_value_iid else a.uint_value)
                    for a in p.track_event.debug_annotations}
            out.append((names[p.track_event.name_iid], args))
    return out


def test_perfetto_block_events_carry_slot_and_request(tmp_path):
    out = tmp_path / "t.pftrace"
    r = run_cli("perfetto", FIXTURES / "writes-stale-pad" / "writes-stale-pad.kvdump", "-o", out)
    assert r.returncode == 0, r.stderr
    ev = _perfetto_block_events(out)
    assert len(ev) == 56 and all("slot" in a and "cache" in a for _, a in ev)  # every block of the kernel wrote
    flagged = [(n, a) for n, a in ev if a["write"] == "unmapped slot"]
    assert {(a["step"], a["slot"], a["slot_owner"]) for _, a in flagged} == _planted_stale("stale-pad")
    assert all(n.endswith(" · write to an unmapped slot") and "request" not in a for n, a in flagged)
    assert all(a["request"] == a["slot_owner"] for _, a in ev if a["write"] == "mapped slot")


def test_outside_writes_flagged_in_perfetto_and_chrome(tmp_path):
    p = FIXTURES / "writes-pad-minus-one" / "writes-pad-minus-one.kvdump"
    r = run_cli("perfetto", p, "-o", tmp_path / "t.pftrace")
    assert r.returncode == 0, r.stderr
    out = [(n, a) for n, a in _perfetto_block_events(tmp_path / "t.pftrace") if a["write"] == "outside every cache"]
    assert out and all(n.endswith(" · write outside every cache") and "slot" not in a and a["cache"] == "outside"
                       for n, a in out)
    r = run_cli("chrome", p, "-o", tmp_path / "t.json")
    assert r.returncode == 0, r.stderr
    doc = json.loads((tmp_path / "t.json").read_text())
    ch = [e for e in doc["traceEvents"] if e.get("cat") == "block" and e["args"].get("write") == "outside every cache"]
    assert len(ch) == len(out) and all(e["name"].endswith(" · write outside every cache") for e in ch)


def test_chrome_block_args(tmp_path):
    r = run_cli("chrome", FIXTURES / "writes-stale-pad" / "writes-stale-pad.kvdump", "-o", tmp_path / "t.json")
    assert r.returncode == 0, r.stderr
    doc = json.loads((tmp_path / "t.json").read_text())
    blocks = [e for e in doc["traceEvents"] if e.get("cat") == "block"]
    assert len(blocks) == 56 and all({"cache", "slot", "write", "seq", "block"} <= set(e["args"]) for e in blocks)
    bad = {(e["args"]["step"], e["args"]["slot"], e["args"]["slot_owner"]) for e in blocks
           if e["args"]["write"] == "unmapped slot"}
    assert bad == _planted_stale("stale-pad")
