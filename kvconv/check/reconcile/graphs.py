"""Per graph executable: its nodes, replays and node order from the host records (``host_graphs``), and its
device-side counts and %globaltimer timing from the joined events (``graph_device``).

    >>> graphs = host_graphs(table, names, notes)            # doctest: +SKIP
    >>> graphs[0].exec, graphs[0].report["replays"]
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvconv.join.launches import GRAPH_NODE, LaunchTable, kernel_short
from kvconv.join.notes import Notes, hexs, ranges
from kvconv.join.runs import rows_by_value, run_starts

_I64 = np.iinfo(np.int64)


def stats(values) -> dict | None:
    v = np.asarray(values, dtype=np.int64)
    if not len(v):
        return None
    return {"min": int(v.min()), "max": int(v.max()), "median": float(np.median(v)), "count": int(len(v))}


@dataclass(frozen=True)
class GraphExec:
    exec: int
    rows: np.ndarray  # launch-table rows of its records (duplicates included), in (replay, record) order
    nodes: np.ndarray  # node handles, sorted
    ordmap: np.ndarray  # node (index into nodes) -> ordinal
    report: dict  # the host side of its JSON report


def host_graphs(t: LaunchTable, names: dict, notes: Notes) -> list[GraphExec]:
    live = (t.kind == GRAPH_NODE) & ~t.upload
    if not live.any():
        return []
    # one graph exec at a time (rows_by_value: a comparison over the column per exec when they are few, no sort of
    # every graph-node row: the rows' temporaries are the peak of a large dump's report stage, issue 13). The distinct
    # graph execs from the starts of runs of one exec (a tracer writes a replay's records together).
    st = run_starts(t.graph_exec, live)
    execs = np.unique(t.graph_exec[st[live[st]]])
    rows = np.int32 if t.n < (1 << 31) else np.int64  # rows kept per graph exec: half the bytes
    out = []
    for _, idx in rows_by_value(t.graph_exec, execs, live):
        idx = idx.astype(rows)
        rep = t.launch_id[idx]
        # (replay, record) order; replays normally grow in record order within a graph exec: then no sort
        if not bool(np.all(rep[1:] >= rep[:-1])):
            idx = idx[np.lexsort((idx, rep))]
        del rep
        out.append(_one_graph(t, names, notes, idx))
    return out


def _node_findings(notes: Notes, gname: str, replays, nodes, ordmap, cnt, unstable, best) -> tuple[list, list]:
    repeated = [{"replay": int(replays[r]), "node": hexs(nodes[k]), "node_ordinal": int(ordmap[k]),
                 "records": int(cnt[r, k])} for r, k in zip(*np.nonzero(cnt > 1))]
    missing = [{"replay": int(replays[r]), "node": hexs(nodes[k]), "node_ordinal": int(ordmap[k])}
               for r, k in zip(*np.nonzero(cnt == 0))]
    for m in sorted(missing, key=lambda m: (m["replay"], m["node_ordinal"])):
        notes.add("error", "node-missing", f"{gname} replay {m['replay']} has no host record of node "
                  f"#{m['node_ordinal']} ({m['node']}), which other replays have")
    rep_ids = [int(r) for r in replays]
    if rep_ids and rep_ids != list(range(rep_ids[0], rep_ids[0] + len(rep_ids))):
        # Gaps as ranges, never as a set of ids: a damaged launch_id can be near 2^64.
        holes = [(a + 1, b - 1) for a, b in zip(rep_ids, rep_ids[1:]) if b - a > 1]
        text = ", ".join(f"{a}" if a == b else f"{a}..{b}" for a, b in holes[:20]) + (
            f" and {len(holes) - 20} more" if len(holes) > 20 else "")
        notes.add("warning", "replay-ids-gap", f"{gname}: host records hold replays {ranges(rep_ids)}; no record of "
                  f"replay(s) {text}", listed=False)
    if unstable:
        notes.add("warning", "node-order-changed", f"{gname}: node order differs from the reference replay "
                  f"{int(replays[best])} in replay(s) {ranges(unstable)}", listed=False)
    return repeated, missing


def _one_graph(t: LaunchTable, names: dict, notes: Notes, idx: np.ndarray) -> GraphExec:
    exec_h = int(t.graph_exec[idx[0]])
    ords = t.node_ordinal[idx]
    nodes, nid, ordmap = _nodes(t.node[idx], ords)
    replays, rid = sorted_codes(t.launch_id[idx])
    N, R = len(nodes), len(replays)
    key = rid * N + nid
    cnt = np.bincount(key, minlength=R * N).reshape(R, N)
    best = int(np.argmax((cnt > 0).sum(axis=1)))  # the reference replay: the first holding the most nodes
    # stable order: within each replay, first occurrences of nodes have increasing ordinals
    first = np.full(R * N, len(idx), np.int64)
    np.minimum.at(first, key, np.arange(len(idx)))
    at_first = np.zeros(len(idx), bool)  # each cell's first record, in record order (a mask: no sort)
    at_first[first[first < len(idx)]] = True
    first_pos = np.flatnonzero(at_first)
    del at_first
    del key, first
    fr, fo = rid[first_pos], ords[first_pos]
    bad = (fr[1:] == fr[:-1]) & (fo[1:] <= fo[:-1])
    unstable = sorted({int(replays[r]) for r in fr[1:][bad]})
    gname = f"graph exec {hexs(exec_h)}"
    repeated, missing = _node_findings(notes, gname, replays, nodes, ordmap, cnt, unstable, best)
    # host timing, CLOCK_MONOTONIC, its own domain
    hns = t.host_ns[idx].astype(np.int64)
    hmin, hmax = np.full(R, _I64.max), np.full(R, _I64.min)
    np.minimum.at(hmin, rid, hns)
    np.maximum.at(hmax, rid, hns)
    report = {
        "graph_exec": hexs(exec_h), "nodes": N, "replays": replays.tolist(), "replay_count": R,
        "records": int(len(idx)), "records_per_replay": stats(cnt.sum(axis=1)), "repeated_nodes": repeated,
        "missing_nodes": missing, "stable_order": not unstable, "unstable_replays": unstable,
        "reference_replay": int(replays[best]), "streams": [hexs(s) for s in _distinct(t.stream[idx])],
        "kernels": sorted({kernel_short(names, s) for s in _distinct(t.kernel_slot[idx])}),
        "host_timing": {
            "clock": "host_monotonic",
            "note": "graph-node launch callbacks (CLOCK_MONOTONIC ns); never subtracted from device times",
            "first_ns": int(hmin.min()), "last_ns": int(hmax.max()), "callback_span_ns": stats(hmax - hmin),
            "replay_start_interval_ns": stats(np.diff(hmin)) if R > 1 else None,
        },
    }
    return GraphExec(exec=exec_h, rows=idx, nodes=nodes, ordmap=ordmap, report=report)


def _distinct(values: np.ndarray) -> np.ndarray:
    """``np.unique(values)``, sorting only the first value of each run of equal ones (a graph's streams and kernels:
    few, each in long runs)."""
    return np.unique(values[run_starts(values)])


def sorted_codes(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(values, return_inverse=True)``, without a sort when ``values`` come in order (a graph's replays
    in its rows' (replay, record) order)."""
    if len(values) < 2 or bool(np.all(values[1:] >= values[:-1])):
        new = np.empty(len(values), bool)
        new[:1] = True
        np.not_equal(values[1:], values[:-1], out=new[1:])
        return values[new], np.cumsum(new) - 1
    u, inv = np.unique(values, return_inverse=True)
    return u, inv.reshape(-1)


def _nodes(handles: np.ndarray, ords: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A graph's node handles (sorted), each record's index into them and each node's ordinal, from the records'
    node ordinals (a node's ordinal is its own within its graph exec: 0..N-1, :func:`launches.node_ordinals`)."""
    n_ord = int(ords.max()) + 1 if len(ords) else 0
    seen = np.zeros(n_ord, bool)
    if len(ords) and int(ords.min()) >= 0:
        seen[ords] = True
    by_ord = np.zeros(n_ord, handles.dtype)
    if not bool(seen.all()) or not len(ords):  # not the ordinals 0..N-1 of these nodes: the sort
        nodes, nid = np.unique(handles, return_inverse=True)
        nid = nid.reshape(-1)
        ordmap = np.empty(len(nodes), np.int32)
        ordmap[nid] = ords
        return nodes, nid, ordmap
    by_ord[ords] = handles
    ordmap = np.argsort(by_ord, kind="stable").astype(np.int32)  # node (sorted handles) -> ordinal
    rank = np.empty(n_ord, np.int64)
    rank[ordmap] = np.arange(n_ord)
    return by_ord[ordmap], rank[ords], ordmap


def device_side(graphs: list[GraphExec], t: LaunchTable, tally) -> list[dict]:
    """Each graph exec's report, host side and device side, from the join's per-launch reductions (count, first
    and last entry) and the graph-node events attributed to a replay without a launch, reduced per (graph exec,
    replay, node ordinal) (:class:`kvconv.check.reconcile.tally.Tally`): the timing takes only minima and maxima."""
    if not graphs:
        return []
    cnt = tally.recorded
    loose = sorted(tally.loose.items())
    out = []
    for g in graphs:
        rows = g.rows[cnt[g.rows] > 0]
        lo = [(k[1], k[2], v) for k, v in loose if k[0] == g.exec]
        n_lo = sum(v[0] for _, _, v in lo)
        live = ~t.dup[g.rows]
        lrep = np.array([r for r, _, _ in lo], np.uint64)
        lord = np.array([o for _, o, _ in lo], np.int64)
        # a graph's rows hold no upload and live none of the duplicates: their grids are the expected blocks
        dev = {"expected_executions": int(np.count_nonzero(live)),
               "expected_blocks": int(np.sum(t.grid[g.rows], where=live)),
               "device_events": int(cnt[rows].sum()) + n_lo, "matched_events": int(cnt[rows].sum()),
               "device_replays": _replays(t.launch_id[rows], lrep).tolist(),
               "node_attribution": bool((lord >= 0).all())}
        del live
        timing = {"clock": "gpu_globaltimer", "note": "device %globaltimer only; block entries, not kernel durations"}
        if len(rows) or lo:
            timing.update(_timing(g, *_items(t, tally, rows, lo, lrep, lord)))
        dev["timing"] = timing
        out.append({**g.report, **dev})
    return out


def _items(t: LaunchTable, tally, rows: np.ndarray, lo: list, lrep: np.ndarray, lord: np.ndarray) -> tuple:
    """The timing's items (launches, then the loose groups): first entry, last entry, replay, node ordinal. Each
    column gathered once (no concatenation when there is nothing loose: these are per-row temporaries)."""
    cols = (tally.tmin[rows], tally.tmax[rows], t.launch_id[rows], t.node_ordinal[rows])
    if not lo:
        return cols
    more = (np.array([v[1] for _, _, v in lo], np.int64), np.array([v[2] for _, _, v in lo], np.int64), lrep, lord)
    return tuple(np.concatenate([a, b.astype(a.dtype, copy=False)]) for a, b in zip(cols, more))


def _replays(launch_ids: np.ndarray, loose: np.ndarray) -> np.ndarray:
    """The replays device events came from: a graph's rows in replay order, the loose ones (rare) merged in."""
    if not len(loose):
        return sorted_codes(launch_ids)[0]
    return np.unique(np.r_[launch_ids, loose])


def _timing(g: GraphExec, t: np.ndarray, t_last: np.ndarray, rep: np.ndarray, ordn: np.ndarray) -> dict:
    """Per replay span and gap, per node start offsets, from items (a launch or an event) with their first and
    last entry, replay and node ordinal (-1: none)."""
    if len(rep) < 2 or bool(np.all(rep[1:] >= rep[:-1])):  # a graph's launches come in replay order: no sort
        new = np.r_[True, rep[1:] != rep[:-1]] if len(rep) else np.zeros(0, bool)
        ur, rinv = rep[new], np.cumsum(new) - 1
    else:
        ur, rinv = np.unique(rep, return_inverse=True)
        rinv = rinv.reshape(-1)
    R, N = len(ur), len(g.nodes)
    rfirst, rlast = np.full(R, _I64.max), np.full(R, _I64.min)
    np.minimum.at(rfirst, rinv, t)
    np.maximum.at(rlast, rinv, t_last)
    known = ordn >= 0
    spans = rlast - rfirst
    node_first = None
    if known.any():
        nf = np.full(R * N, _I64.max)
        every = bool(known.all())
        key = (rinv if every else rinv[known]).astype(np.int64)
        key *= N
        key += ordn if every else ordn[known]
        np.minimum.at(nf, key, t if every else t[known])
        del key
        node_first = nf.reshape(R, N)
        has = node_first != _I64.max  # (cells without an entry hold _I64.max: the minimum needs no mask)
        nf_min = node_first.min(axis=1)
        nf_max = node_first.max(axis=1, initial=_I64.min, where=has)
        spans = np.where(has.any(axis=1), nf_max - nf_min, spans)
    gaps = rfirst[1:] - rlast[:-1]
    # the per-replay rows from Python lists (one conversion per column, not a numpy scalar per cell)
    ur_l, rf_l, rl_l, sp_l, gap_l = ur.tolist(), rfirst.tolist(), rlast.tolist(), spans.tolist(), gaps.tolist()
    out = {"span_ns": stats(spans), "gap_ns": stats(gaps) if R > 1 else None,
           "per_replay": [{"replay": ur_l[j], "first_ns": rf_l[j], "last_ns": rl_l[j], "span_ns": sp_l[j],
                           "gap_to_next_ns": gap_l[j] if j + 1 < R else None} for j in range(R)]}
    if node_first is not None:
        out["node_offsets"] = _node_offsets(g, node_first, has, nf_min)
    return out


def _node_offsets(g: GraphExec, node_first: np.ndarray, has: np.ndarray, base: np.ndarray) -> list:
    """Per node ordinal, its first entry's offset from its replay's first node entry: min, median, max over the
    replays that ran it (every replay ran every node, the usual case: one reduction over the whole table)."""
    N = node_first.shape[1]
    node_of = [g.nodes[np.flatnonzero(g.ordmap == o)[0]] if o in g.ordmap else None for o in range(N)]
    if bool(has.all()) and len(has):
        v = node_first - base[:, None]
        lo, med, hi = v.min(axis=0).tolist(), np.median(v, axis=0).tolist(), v.max(axis=0).tolist()
        R = len(has)
        return [{"node_ordinal": o, "node": hexs(node_of[o]), "replays": R, "min_ns": lo[o],
                 "median_ns": float(med[o]), "max_ns": hi[o]} for o in range(N)]
    offs = []
    for o in range(N):
        col = has[:, o]
        if not col.any():
            continue
        v = node_first[col, o] - base[col]
        offs.append({"node_ordinal": o, "node": hexs(node_of[o]), "replays": int(col.sum()), "min_ns": int(v.min()),
                     "median_ns": float(np.median(v)), "max_ns": int(v.max())})
    return offs
