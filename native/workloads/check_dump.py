"""Join a tracer dump's host records with its device events on (gridid, tag) and print the figures as JSON.

    python3 native/workloads/check_dump.py run.kvdump [--expect-graph 280 --expect-eager 40]

Independent of kvconv.check.reconcile (which the lead owns): this is the tracer's own self-check, used on the GPU machine
right after a run. Exit 1 if the exact join fails or an expectation is not met.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from kvconv.format import dump  # noqa: E402


def check(path: str) -> dict:
    out = {"path": str(path), "contexts": []}
    with dump.open(path) as d:
        meta = d.metadata()
        out["counters"] = meta.get("counters", {})
        for ctx, dev in d.contexts():
            ev = d.records("device_event", context_id=ctx)
            gn = d.records("graph_node", context_id=ctx)
            el = d.records("eager_launch", context_id=ctx)
            cs = d.records("clock_sync", context_id=ctx)
            cnt = collections.Counter(zip(ev["gridid"].tolist(), ev["tag"].tolist()))
            host_keys = set()
            bad = []
            first_eager = None
            for kind, recs in (("eager", el), ("graph", gn)):
                for i, r in enumerate(recs):
                    key = (int(r["grid_id"]), int(r["tag"]))
                    host_keys.add(key)
                    pred = int(r["grid_x"]) * int(r["grid_y"]) * int(r["grid_z"])
                    got = cnt.get(key, 0)
                    if kind == "eager" and first_eager is None:
                        first_eager = {"predicted": pred, "recorded": got}
                    if got != pred:
                        bad.append({"kind": kind, "index": i, "grid_id": key[0], "tag": key[1], "predicted": pred,
                                    "recorded": got})
            unmatched = sum(c for k, c in cnt.items() if k not in host_keys)
            replays = collections.defaultdict(list)
            for r in gn:
                replays[(int(r["graph_exec"]), int(r["launch_id"]))].append(int(r["node"]))
            node_orders = {tuple(v) for v in replays.values()}
            seq = ev["sequence"]
            entry = {
                "context_id": ctx, "device_id": dev,
                "device_events": int(len(ev)),
                "device_drops": d.drops("device_event", context_id=ctx),
                "graph_node_records": int(len(gn)),
                "graph_node_drops": d.drops("graph_node", context_id=ctx),
                "eager_launch_records": int(len(el)),
                "eager_drops": d.drops("eager_launch", context_id=ctx),
                "graph_execs": len({int(x) for x in gn["graph_exec"]}),
                "launch_ids": sorted({int(x) for x in gn["launch_id"]}),
                "nodes_per_replay": sorted({len(v) for v in replays.values()}),
                "node_order_identical_across_replays": len(node_orders) <= 1,
                "distinct_nodes": len({int(x) for x in gn["node"]}),
                "predicted_blocks": int(sum(int(r["grid_x"]) * int(r["grid_y"]) * int(r["grid_z"])
                                            for recs in (el, gn) for r in recs)),
                "graph_events": int(sum(cnt.get((int(r["grid_id"]), int(r["tag"])), 0) for r in gn)),
                "first_eager_launch": first_eager,
                "launches_with_block_mismatch": len(bad),
                "mismatch_examples": bad[:5],
                "unmatched_device_events": int(unmatched),
                "sequence_contiguous": bool(len(seq) == 0 or (seq == range(len(seq))).all()),
                "events_with_tag": int((ev["tag"] != 0).sum()),
                "clock_sync_pairs": int(len(cs)),
                "clock_sync_max_uncertainty_ns": int(cs["uncertainty_ns"].max()) if len(cs) else None,
                "kernel_names": d.kernel_names(context_id=ctx),
            }
            if len(gn):
                # device order vs host order inside each replay: does the atomic order differ from launch order?
                order_diff = 0
                by_key = {}
                for i, (g, tg) in enumerate(zip(ev["gridid"].tolist(), ev["tag"].tolist())):
                    by_key.setdefault((g, tg), i)
                for (exe, lid), nodes in replays.items():
                    host_order = [int(r["grid_id"]) for r in gn if int(r["graph_exec"]) == exe and int(r["launch_id"]) == lid]
                    dev_order = sorted(host_order, key=lambda g: by_key.get((g, lid & ((1 << 20) - 1)), 1 << 62))
                    order_diff += host_order != dev_order
                entry["replays_where_device_order_differs_from_host_order"] = order_diff
            entry["exact_join"] = not bad and unmatched == 0
            out["contexts"].append(entry)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("paths", nargs="+")
    ap.add_argument("--expect-graph", type=int)
    ap.add_argument("--expect-eager", type=int)
    a = ap.parse_args()
    rc = 0
    for p in a.paths:
        r = check(p)
        for c in r["contexts"]:
            if not c["exact_join"]:
                rc = 1
            if a.expect_graph is not None and c["graph_node_records"] != a.expect_graph:
                rc = 1
            if a.expect_eager is not None and c["eager_launch_records"] != a.expect_eager:
                rc = 1
        print(json.dumps(r, sort_keys=True, default=str))
    return rc


if __name__ == "__main__":
    sys.exit(main())
