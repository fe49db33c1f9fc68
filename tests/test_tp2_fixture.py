"""The two-rank H200 capture (fixtures/h200-tp2): each rank reconciles, the run ended at process exit, the merged
outputs show both GPUs, and the cross-dump skew equals an independent computation from the raw records."""

from __future__ import annotations

import json
from collections import Counter, defaultdict

import jsonschema
import numpy as np
import pytest

from conftest import FIXTURES, run_cli, track_paths
from kvconv.check import reconcile, skew
from kvconv.format import dump, layout

CASE = FIXTURES / "h200-tp2"
RANKS = [CASE / "rank0.kvdump", CASE / "rank1.kvdump"]
pb = pytest.importorskip("perfetto.protos.perfetto.trace.perfetto_trace_pb2")


def _summaries() -> dict[int, dict]:
    out = {}
    for line in (CASE / "record.log").read_text().splitlines():
        if line.startswith("{") and '"workload": "tp_decode"' in line:
            d = json.loads(line)
            out[d["rank"]] = d
    return out


def test_each_rank_reconciles_280_and_ended_at_process_exit():
    sums = _summaries()
    assert sorted(sums) == [0, 1] and all(s["check_ok"] and s["ranks_agree"] for s in sums.values())
    for r, path in enumerate(RANKS):
        res = run_cli("reconcile", path)
        assert res.returncode == 0, res.stderr
        assert "280 graph-node records = 280 expected executions = 280 device events, 0 drops" in res.stdout
        assert "exact join" in res.stdout
        with dump.open(path) as d:
            meta = d.metadata()
            assert meta["written_at"] == "process-exit"
            assert meta["pid"] == sums[r]["pid"]  # the file is the rank it is named after
            (ctx, dev), = d.contexts()
            assert dev == r and len(d.records("device_event", context_id=ctx)) == sums[r]["expected"]["device_events"]
    log = (CASE / "record.log").read_text()
    assert log.count("[process-exit]") == 2 and "[sigterm]" not in log


def _first_entry_per_replay(path):
    """Independent of reconcile: per graph replay (the device tag), the earliest block entry of graph-node events,
    moved to host time through the preceding clock-sync pair (docs/FORMAT.md)."""
    with dump.open(path) as d:
        (ctx, _), = d.contexts()
        ev = np.array(d.records("device_event", context_id=ctx))
        cs = np.sort(np.array(d.records("clock_sync", context_id=ctx)), order="gpu_ns")
    ev = ev[(ev["kind"] == layout.ENUMS["event_kind"]["block_enter"]) & (ev["tag"] != 0)]  # eager: tag 0
    first = {int(tag): int(ev["globaltimer"][ev["tag"] == tag].min()) for tag in np.unique(ev["tag"])}
    i = lambda g: max(int(np.searchsorted(cs["gpu_ns"], g, side="right")) - 1, 0)  # noqa: E731
    host = lambda g: int(cs["host_ns"][i(g)]) + int(g) - int(cs["gpu_ns"][i(g)])  # noqa: E731
    return [host(first[k]) for k in sorted(first)]


def test_cross_dump_skew_equals_independent_computation():
    reports = []
    for p in RANKS:
        with dump.open(p) as d:
            reports.append(reconcile.reconcile(d).to_dict())
    s = skew.cross_dump([str(p) for p in RANKS], reports)
    (e,) = s["graph_execs"]
    a, b = (_first_entry_per_replay(p) for p in RANKS)
    assert len(a) == len(b) == 7
    assert [r["skew_ns"][1] for r in e["per_replay"]] == [y - x for x, y in zip(a, b)]
    # after 39 all_reduces the ranks are in step: the last node's skew is inside the alignment bound
    (bound,) = e["bound_ns"]
    (last,) = e["last_node_skew_ns"]
    assert max(abs(last["min"]), abs(last["max"])) < bound
    text = "\n".join(skew.lines(s))
    assert "rank1.kvdump - rank0.kvdump: 7 replays" in text


def test_cli_reconcile_of_both_ranks_reports_skew():
    res = run_cli("reconcile", *RANKS)
    assert res.returncode == 0, res.stderr
    assert "cross-dump replay skew" in res.stdout and "rank1.kvdump - rank0.kvdump: 7 replays" in res.stdout
    js = run_cli("reconcile", "--json", *RANKS)
    assert js.returncode == 0, js.stderr
    obj = json.loads(js.stdout)
    jsonschema.validate(obj, layout.load_json_schema("cli.schema.json"))
    (e,) = obj["cross_dump"]["graph_execs"]
    assert len(e["per_replay"]) == 7 and e["bound_ns"][0] > 0


def test_merged_perfetto_shows_both_gpus_and_their_nodes(tmp_path):
    out = tmp_path / "tp.pftrace"
    res = run_cli("perfetto", *RANKS, "-o", out)
    assert res.returncode == 0, res.stderr
    tr = pb.Trace()
    tr.ParseFromString(out.read_bytes())
    descs = {p.track_descriptor.uuid: p.track_descriptor for p in tr.packet if p.HasField("track_descriptor")}
    roots = sorted(d.name.split(" ±")[0] for d in descs.values() if not d.HasField("parent_uuid"))
    assert roots == ["GPU 0 · ctx 0 · rank0.kvdump", "GPU 1 · ctx 0 · rank1.kvdump"]

    paths = track_paths(tr)
    per_track = defaultdict(Counter)
    for p in tr.packet:
        if p.HasField("track_event"):
            per_track[paths.get(p.track_event.track_uuid, "")][p.track_event.type] += 1
    for r in ("rank0", "rank1"):
        g = [k for k in per_track if r in k]
        assert sum(per_track[k][3] for k in g if "/ device blocks / SM" in k) == 1760
        assert sum(per_track[k][1] for k in g if k.endswith("/ replays")) == 7
        assert sum(per_track[k][1] + per_track[k][3] for k in g if "/ nodes" in k) == 280


def test_merged_chrome_has_one_process_per_rank_and_their_replays(tmp_path):
    res = run_cli("chrome", *RANKS, "-o", "-")
    assert res.returncode == 0, res.stderr
    ev = json.loads(res.stdout)["traceEvents"]
    procs = {e["pid"]: e["args"]["name"] for e in ev if e.get("ph") == "M" and e["name"] == "process_name"}
    gpu = {pid: name for pid, name in procs.items() if name.startswith("GPU ")}
    assert sorted(gpu.values()) == ["GPU 0 · ctx 0 · rank0.kvdump", "GPU 1 · ctx 0 · rank1.kvdump"]
    count = Counter((e["pid"], e.get("cat")) for e in ev if e.get("ph") == "X")
    for pid in gpu:
        assert (count[(pid, "block")], count[(pid, "node")], count[(pid, "replay")]) == (1760, 280, 7)
    # replay i of rank 1 ends (its last node) within the alignment bound of replay i of rank 0
    ends = {pid: sorted(e["ts"] + e["dur"] for e in ev if e.get("cat") == "replay" and e["pid"] == pid)
            for pid in gpu}
    a, b = ends.values()
    assert all(abs(x - y) < 22.62 for x, y in zip(a, b)), list(zip(a, b))
