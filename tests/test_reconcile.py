"""The reconciler on small hand-written dumps, the synthetic fault dumps and the Qwen3-14B fixture."""

from __future__ import annotations

import json

import jsonschema
import numpy as np
import pytest

from conftest import FIXTURES, load_script
from kvconv.check import reconcile
from kvconv.format import dump, layout
from kvconv.format.errors import UsageError

H, E = layout.DTYPES["host_launch"], layout.DTYPES["device_event"]
LF, EF = layout.ENUMS["launch_flags"], layout.ENUMS["event_flags"]
QWEN = FIXTURES / "qwen3-14b" / "qwen3-14b.kvdump"


def _gen():
    return load_script(FIXTURES / "synthetic-reconcile" / "generate.py")


synth = _gen()


def _validator():
    return jsonschema.Draft202012Validator(layout.load_json_schema("reconcile.schema.json"))


def run(path, **kw):
    with dump.open(path) as d:
        return reconcile.reconcile(d, options=reconcile.ReconcileOptions(**kw))


def write(path, *, eager=(), graph=(), events=(), device_drops=0, context_id=0):
    with dump.new(path) as w:
        w.write_metadata({"tool": "test", "tool_version": "0"})
        w.write_records("eager_launch", np.array(eager, H) if len(eager) else np.zeros(0, H), context_id=context_id)
        w.write_records("graph_node", np.array(graph, H) if len(graph) else np.zeros(0, H), context_id=context_id)
        w.write_records("device_event", np.array(events, E) if len(events) else np.zeros(0, E),
                        drop_count=device_drops, context_id=context_id)
    return path


def launch(*, grid=1, slot=1, gid=0, ns=0, exec_=0, replay=0, node=0, tag=None, stream=1):
    r = np.zeros((), H)
    r["grid_x"], r["grid_y"], r["grid_z"] = grid, 1, 1
    r["kernel_slot"], r["grid_id"], r["host_ns"], r["stream"] = slot, gid, ns, stream
    if exec_:
        r["graph_exec"], r["launch_id"], r["node"] = exec_, replay, node
        r["flags"] = LF["graph_node"] | (LF["has_tag"] if tag is not None else 0)
        r["tag"] = tag or 0
    else:
        r["flags"] = LF["eager"]
    return r


def event(seq, *, slot=1, x=0, t=0, gid=None, tag=None):
    e = np.zeros((), E)
    e["sequence"], e["kernel_slot"], e["block_x"], e["globaltimer"] = seq, slot, x, t
    e["kind"] = layout.ENUMS["event_kind"]["block_enter"]
    if gid is not None:
        e["gridid"] = gid
        e["flags"] |= EF["has_gridid"]
    if tag is not None:
        e["tag"] = tag
        e["flags"] |= EF["has_tag"]
    return e


def codes(res, severity=None):
    return sorted(f.code for f in res.findings if severity is None or f.severity == severity)


# --- hand-written tables -------------------------------------------------------------------------------------------

def test_exact_join_is_independent_of_device_order(tmp_path):
    graph = [launch(exec_=9, replay=r, node=0x10 + k, gid=50 + k, tag=100 + r, ns=r * 100 + k) for r in (1, 2)
             for k in range(3)]
    # device order scrambled across nodes and replays
    order = [(2, 1), (1, 2), (1, 0), (2, 2), (2, 0), (1, 1)]
    events = [event(i, gid=50 + k, tag=100 + r, t=1000 * r + 10 * k) for i, (r, k) in enumerate(order)]
    res = run(write(tmp_path / "d.kvdump", graph=graph, events=events))
    assert res.ok and codes(res) == []
    m = res.matches
    assert list(m["join"]) == [reconcile.JOIN_EXACT] * 6
    assert [(int(a), int(b)) for a, b in zip(m["replay"], m["node_ordinal"])] == order
    assert list(m["host_index"]) == [(r - 1) * 3 + k for r, k in order]
    assert res.agreement_line() == "6 graph-node records = 6 expected executions = 6 device events, 0 drops"
    g = res.contexts[0]["graph_execs"][0]
    assert (g["nodes"], g["replays"], g["stable_order"]) == (3, [1, 2], True)
    assert g["timing"]["span_ns"]["min"] == 20 and g["timing"]["gap_ns"]["min"] == 1000 - 20


def test_ordered_late_start_is_attributed_to_the_first_launch(tmp_path):
    eager = [launch(grid=3, ns=i, gid=i + 1) for i in range(4)]  # identical geometry
    events = [event(i, x=i % 3) for i in range(9)]  # 9 of 12 blocks, 0 drops
    res = run(write(tmp_path / "d.kvdump", eager=eager, events=events))
    assert res.contexts[0]["join"] == "ordered"
    assert codes(res) == ["coverage-late"] and res.ok  # a warning: nothing the tracer saw was lost
    f = res.findings[0]
    assert f.record == 0 and "eager launch #0" in f.message and "before coverage began" in f.message
    strict = run(tmp_path / "d.kvdump", strict_coverage=True)
    assert codes(strict, "error") == ["coverage-late"]
    assert list(res.matches["host_index"]) == [1, 1, 1, 2, 2, 2, 3, 3, 3]
    assert res.contexts[0]["blocks"]["late_start_blocks"] == 3


def test_ordered_deficit_with_drops_is_reported_over_the_ambiguous_run(tmp_path):
    eager = [launch(grid=1, ns=i) for i in range(5)]
    events = [event(i) for i in range(4)]
    res = run(write(tmp_path / "d.kvdump", eager=eager, events=events, device_drops=1))
    c = res.contexts[0]
    assert c["ambiguous_runs"] and c["ambiguous_runs"][0]["expected_blocks"] - c["ambiguous_runs"][0][
        "device_events"] == 1
    f = [f for f in res.findings if f.code == "missing-blocks"]
    assert len(f) == 1 and "cannot tell which" in f[0].message
    assert (res.matches["host_index"] == -1).all()  # no guess
    assert c["blocks"]["missing"] == 1


def test_sequence_gap_places_a_lost_event(tmp_path):
    eager = [launch(grid=1, ns=i) for i in range(4)]
    events = [event(s) for s in (0, 1, 3)]  # sequence 2 never arrived
    res = run(write(tmp_path / "d.kvdump", eager=eager, events=events))
    miss = [f for f in res.findings if f.code == "missing-blocks"]
    assert len(miss) == 1 and miss[0].record == 2


def test_extra_block_outside_grid_exact(tmp_path):
    eager = [launch(grid=2, gid=5)]
    events = [event(0, gid=5, x=1), event(1, gid=5, x=0), event(2, gid=5, x=2)]
    res = run(write(tmp_path / "d.kvdump", eager=eager, events=events))
    assert codes(res) == ["extra-blocks"]
    assert "(2,0,0)" in res.findings[0].message and res.findings[0].record == 2


def test_relaxed_downgrades_errors(tmp_path):
    eager = [launch(grid=2, gid=5)]
    events = [event(0, gid=5, x=1)]
    p = write(tmp_path / "d.kvdump", eager=eager, events=events)
    assert codes(run(p), "error") == ["missing-blocks"]
    r = run(p, relaxed=True)
    assert r.ok and codes(r, "warning") == ["missing-blocks"]


def test_exact_forced_without_gridid_is_an_error(tmp_path):
    p = write(tmp_path / "d.kvdump", eager=[launch()], events=[event(0)])
    r = run(p, join="exact")
    assert "join-impossible" in codes(r, "error")
    assert run(p, join="ordered").ok


def test_bad_join_option():
    with pytest.raises(UsageError):
        reconcile.ReconcileOptions(join="sideways")


def test_tables_and_arrow_columns(tmp_path):
    res = run(synth_path(tmp_path, "clean-exact"))
    m = res.matches
    assert m.dtype == reconcile.MATCH_DTYPE and len(m) == 27
    assert (m["host_kind"][:12] == reconcile.EAGER).all() and (m["host_kind"][12:] == reconcile.GRAPH_NODE).all()
    assert (m["node_ordinal"][:12] == -1).all() and sorted(set(m["replay"][12:].tolist())) == [1, 2, 3]
    cols = res.columns()
    assert set(reconcile.MATCH_DTYPE.names) <= set(cols) and all(c.ndim == 1 for c in cols.values())
    la = res.launches
    assert (la["expected_blocks"] == la["recorded_blocks"]).all()
    pa = pytest.importorskip("pyarrow")
    t = res.to_arrow()
    assert t.num_rows == 27 and t.column("host_index").type == pa.int64()


def test_no_per_event_python(tmp_path):
    """Scaling smoke test: 200k events reconcile (exact and ordered) without trouble."""
    parts = synth.build(eager=2000, eager_blocks=50, nodes=40, replays=50, node_blocks=50)
    p = tmp_path / "big.kvdump"
    synth.write(p, parts)
    for j in ("exact", "ordered"):
        r = run(p, join=j)
        assert r.ok, [f.line() for f in r.findings][:3]
        assert (r.matches["host_index"] >= 0).all()


# --- synthetic faults ----------------------------------------------------------------------------------------------

def synth_path(tmp_path, name):
    p = tmp_path / f"{name}.kvdump"
    synth.write(p, synth.make(name))
    return p


@pytest.mark.parametrize("name", ["clean-exact", "clean-ordered", "multistream"])
def test_clean_runs_agree(tmp_path, name):
    r = run(synth_path(tmp_path, name))
    assert r.ok and not codes(r, "error") and not codes(r, "warning")
    c = r.contexts[0]
    assert c["agreement"]["agree"]
    assert c["join"] == ("ordered" if name == "clean-ordered" else "exact")


FAULTS = {
    "fault-dropped-event": ("missing-blocks", ["replay 2 node #3", "0 of 1 blocks", "dropped 1 event"]),
    "fault-dropped-event-ordered": ("missing-blocks", ["replay 2 node #3", "0 of 1 blocks"]),
    "fault-duplicate-host-record": ("duplicate-host-record", ["replay 3 node #1", "record 12 repeats record 11"]),
    "fault-node-missing": ("node-missing", ["replay 2", "node #2 (0x70000200)"]),
    "fault-extra-replay": ("extra-replay", ["5 device events", "tag 0x7a60004", "host replays 1..3"]),
    "fault-extra-block": ("extra-blocks", ["eager launch #1", "5 device events for 4 expected", "(4,0,0)"]),
    "fault-extra-block-ordered": ("extra-blocks", ["eager launch #2", "(4,0,0)", "eager launch #1"]),
}


@pytest.mark.parametrize("name", sorted(FAULTS))
def test_fault_is_named_precisely(tmp_path, name):
    code, words = FAULTS[name]
    r = run(synth_path(tmp_path, name))
    assert not r.ok
    hits = [f for f in r.findings if f.code == code and f.severity == "error"]
    assert len(hits) == 1, [f.line() for f in r.findings]
    for w in words:
        assert w in hits[0].message, hits[0].message


def test_node_missing_names_the_orphan_device_event(tmp_path):
    r = run(synth_path(tmp_path, "fault-node-missing"))
    f = [f for f in r.findings if f.code == "host-record-missing"]
    assert len(f) == 1 and "replay 2 node #2" in f[0].message
    assert r.agreement_line().startswith("14 graph-node records = 14 expected executions != 15 device events")


def test_duplicate_record_agreement_line(tmp_path):
    r = run(synth_path(tmp_path, "fault-duplicate-host-record"))
    assert r.agreement_line() == "16 graph-node records != 15 expected executions = 15 device events, 0 drops"
    g = r.contexts[0]["graph_execs"][0]
    assert g["repeated_nodes"] == [{"replay": 3, "node": "0x70000100", "node_ordinal": 1, "records": 2}]


def test_multistream_exact_right_ordered_ambiguous(tmp_path):
    p = synth_path(tmp_path, "multistream")
    ex = run(p)
    od = run(p, join="ordered")
    ev = dump.open(p).records("device_event")
    # truth from the synthetic generator: gridid 10000+k is node k, tag 0x7A60000+r is replay r
    node_ev = ev["kernel_slot"] == synth.SLOT_NODE
    assert (ex.matches["node_ordinal"][node_ev] == ev["gridid"][node_ev] - 10_000).all()
    assert (ex.matches["replay"][node_ev] == ev["tag"][node_ev] - synth.TAG0).all()
    # device order differs from launch order in the even replays
    assert (np.diff(ex.matches["node_ordinal"][node_ev].astype(int)) < 0).any()
    # ordered: no node attribution for graph events (no wrong answer), but replay right, and ambiguity reported
    assert (od.matches["host_index"][node_ev] == -1).all()
    assert (od.matches["node_ordinal"][node_ev] == -1).all()
    assert (od.matches["replay"][node_ev] == ev["tag"][node_ev] - synth.TAG0).all()
    amb = [f for f in od.findings if f.code == "ordered-ambiguous"]
    assert len(amb) == 1 and "2 streams" in amb[0].message and "replays 1..4" in amb[0].message
    assert not od.contexts[0]["graph_execs"][0]["node_attribution"]


def test_two_contexts_reconciled_separately(tmp_path):
    p = tmp_path / "two.kvdump"
    synth.write_two_contexts(p)
    r = run(p)
    assert [c["context_id"] for c in r.contexts] == [0, 1]
    assert [c["join"] for c in r.contexts] == ["exact", "ordered"]
    assert r.agreement_line(0) == "15 graph-node records = 15 expected executions = 15 device events, 0 drops"
    assert r.agreement_line(1) == "8 graph-node records = 8 expected executions = 8 device events, 0 drops"
    miss = [f for f in r.findings if f.code == "coverage-late"]
    assert len(miss) == 1 and "context 1" in miss[0].message and "eager launch #0" in miss[0].message
    assert set(r.matches["context_id"].tolist()) == {0, 1}


@pytest.mark.parametrize("name", sorted(synth.CASES))
def test_report_matches_schema(tmp_path, name):
    for j in ("auto", "exact", "ordered"):
        d = json.loads(json.dumps(run(synth_path(tmp_path, name), join=j).to_dict()))
        _validator().validate(d)


# --- the Qwen3-14B fixture -----------------------------------------------------------------------------------------

def test_qwen_fixture():
    r = run(QWEN)
    _validator().validate(json.loads(json.dumps(r.to_dict())))
    c = r.contexts[0]
    assert c["join"] == "ordered"
    assert r.agreement_line() == "280 graph-node records = 280 expected executions = 280 device events, 0 drops"
    assert c["agreement"]["agree"]
    assert (c["blocks"]["expected"], c["blocks"]["recorded"], c["blocks"]["missing"]) == (115_880, 114_112, 1_768)
    assert c["blocks"]["first_missing"]["host_index"] == 0
    assert c["blocks"]["first_missing"]["missing_blocks"] == 1_768 and c["blocks"]["launches_with_missing"] == 1
    (g,) = c["graph_execs"]
    assert (g["nodes"], g["replays"], g["records"], g["stable_order"]) == (40, list(range(1, 8)), 280, True)
    assert not g["repeated_nodes"] and not g["missing_nodes"]
    t = g["timing"]
    assert 106_850_000 <= t["span_ns"]["min"] and t["span_ns"]["max"] <= 108_580_000
    assert 11_380_000 <= t["gap_ns"]["min"] and t["gap_ns"]["max"] <= 11_420_000
    assert c["device"]["drops"]["effective"] == 0 and c["host"]["drops"]["graph_node"]["effective"] == 0
    # the replay events are the last 280, sequences 113,832..114,111, in 7 consecutive groups of 40
    m = r.matches
    assert (m["replay"][-280:] == np.repeat(np.arange(1, 8), 40)).all()
    assert (m["node_ordinal"][-280:] == np.tile(np.arange(40), 7)).all()
    assert (m["replay"][:-280] == 0).all()
    assert codes(r) == ["coverage-late"] and r.ok
    assert codes(run(QWEN, strict_coverage=True), "error") == ["coverage-late"]


def test_repeated_blocks_out_of_order_are_counted_once(tmp_path):
    """Blocks of a launch in any order; a repeated blockIdx is an extra block, named at its first repeat, and the
    count is the same whichever way the repeats are found (one key per block, sorted when out of order)."""
    eager = [launch(grid=4, gid=7, ns=0), launch(grid=2, gid=8, ns=1)]
    xs = [2, 0, 1, 2, 3, 3, 1]  # launch gid 7: block 2 repeated, then 3 repeated; gid 8: blocks 1 .. (0 missing)
    gids = [7, 7, 7, 7, 7, 7, 8]
    events = [event(i, x=x, gid=g, t=100 + i) for i, (x, g) in enumerate(zip(xs, gids))]
    res = run(write(tmp_path / "d.kvdump", eager=eager, events=events))
    dup = [f for f in res.findings if f.code == "duplicate-block"]
    assert len(dup) == 1 and "2 blocks recorded more than once, first (2,0,0)" in dup[0].message
    assert dup[0].record == 3  # the first repeat, in sequence order
    la = res.launches
    assert list(la["recorded_blocks"]) == [6, 1] and list(la["distinct_blocks"]) == [4, 1]
    assert list(la["first_ns"]) == [100, 106]
    b = res.contexts[0]["blocks"]
    assert (b["expected"], b["recorded"], b["missing"], b["extra"]) == (6, 7, 1, 2)
    assert b["expected"] - b["missing"] + b["extra"] == b["recorded"]
    assert res.contexts[0]["agreement"]["agree"] is False and not res.ok


def _damaged(seed: int = 5) -> dict:
    """Over 3 chunks of the streaming pass (reconcile.CHUNK events each) with repeated blocks (some 200,000 events
    apart), blocks outside the grid, gridids no host record has and events without a gridid."""
    rng = np.random.default_rng(seed)
    parts = synth.build(eager=3000, eager_blocks=16, nodes=32, replays=300, node_blocks=16, exact=True)
    ev = parts["events"]
    n = len(ev)
    assert n > 3 * reconcile.CHUNK
    ev["block_x"][rng.choice(n, 40, replace=False)] = 999
    ev["gridid"][rng.choice(n, 30, replace=False)] = 77_777_777
    ev["flags"][rng.choice(n, 25, replace=False)] = 0
    far = ev[:50].copy()
    far["sequence"] = ev["sequence"][-1] + 1 + np.arange(50)
    parts["events"] = np.concatenate([ev, far])
    return parts


def test_streaming_pass_agrees_with_the_in_memory_join(tmp_path):
    """The one-pass reconcile (events in sequence order, chunk by chunk) and the in-memory join (the same events
    stored out of sequence order) give the same report, findings and match table (up to the device order)."""
    parts = _damaged()
    a, b = tmp_path / "in-order.kvdump", tmp_path / "reversed.kvdump"
    synth.write(a, parts)
    perm = np.arange(len(parts["events"]))[::-1]
    synth.write(b, {**parts, "events": parts["events"][perm]})
    ra, rb, rq = run(a), run(b), None
    with dump.open(a) as d:
        rq = reconcile.reconcile(d, tables=False)
    codes = sorted((f.code, f.count) for f in ra.findings)
    assert codes == sorted((f.code, f.count) for f in rb.findings)
    assert {"duplicate-block", "extra-blocks", "unmatched-device-event", "gridid-missing"} <= {c for c, _ in codes}
    for key in ("agreement", "blocks", "graph_execs"):
        assert ra.contexts[0][key] == rb.contexts[0][key], key
    assert sum(f.count for f in ra.findings if f.code == "duplicate-block") == 50
    ma, mb = ra.matches, rb.matches[np.argsort(perm)]
    for name in ("host_kind", "host_index", "replay", "node_ordinal", "join"):
        assert (ma[name] == mb[name]).all(), name
    # the report without the per-event table is the same report
    assert rq.matches is None and rq.to_dict() == ra.to_dict()
