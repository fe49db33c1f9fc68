"""Cross-dump replay skew: when each rank's replay of the same CUDA graph started, on one host clock.

Several dumps of one run (one per tensor-parallel rank, say) each replay their own graph executable. The k-th graph
executable of every context (in order of its first host record) is taken to be the same graph; its replays are
paired by their position (first replay with first replay). A replay's start is its first block entry
(``%globaltimer``, reconcile's ``timing.per_replay[].first_ns``), moved to the host's CLOCK_MONOTONIC through the
context's own clock-sync pairs (the same piecewise mapping as the emitters: the nearest earlier pair). Skew is the
start on each context minus the start on the first one; the same is given for the replay's last node entry, which
in a tensor-parallel graph comes after the collectives that hold the ranks together. Its error bound is the sum of
the two contexts' alignment bounds (pair uncertainty + drift between pairs). Host clocks of different machines
are unrelated: dumps whose ``metadata.hostname`` differ get no skew, only a note.

    >>> from kvconv.format import dump                                # doctest: +SKIP
    >>> from kvconv.check import reconcile, skew                      # doctest: +SKIP
    >>> paths = ["rank0.kvdump", "rank1.kvdump"]
    >>> reports = [reconcile.reconcile(dump.open(p)).to_dict() for p in paths]
    >>> s = skew.cross_dump(paths, reports)
    >>> s["graph_execs"][0]["skew_ns"]          # per other member: min / median / max over the paired replays
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from kvconv.clock import Clock
from kvconv.format import dump as dumpmod


def clocks(dump) -> tuple[str, str | None, dict[int, Clock]]:
    """``(path, hostname, clock per context)`` of a dump: what :func:`cross_dump` needs of it, small enough to keep
    once the dump is closed. ``dump``: an open dump (read as it is) or a path (opened for them)."""
    if not isinstance(dump, dumpmod.Dump):
        with dumpmod.open(dump) as d:
            return clocks(d)
    meta = dump.metadata() or {}
    out = {}
    for ctx, _dev in dump.contexts():
        cs = np.array(dump.records("clock_sync", context_id=ctx))
        out[int(ctx)] = Clock(np.sort(cs, order="gpu_ns") if len(cs) else cs)
    return dump.path, meta.get("hostname"), out


def _members(dumps, reports) -> list[dict]:
    """One member per (dump, context, graph exec), in order: k = the exec's position in its context."""
    out = []
    for dump, rep in zip(dumps, reports):
        path, host, clocks_ = dump if isinstance(dump, tuple) else clocks(dump)
        for c in rep.get("contexts", []):
            clock = clocks_.get(int(c["context_id"]))
            for k, g in enumerate(c.get("graph_execs", [])):
                per = (g.get("timing") or {}).get("per_replay") or []
                first = np.array([r["first_ns"] for r in per], dtype=np.uint64)
                last = np.array([r["last_ns"] for r in per], dtype=np.uint64)
                out.append({"k": k, "path": str(path), "name": Path(path).name, "context_id": c["context_id"],
                            "device_id": c["device_id"], "graph_exec": g["graph_exec"], "hostname": host,
                            "replays": [r["replay"] for r in per],
                            "start_host_ns": clock.to_host(first) if clock is not None and clock.n else None,
                            "last_host_ns": clock.to_host(last) if clock is not None and clock.n else None,
                            "bound_ns": clock.bound()["bound_ns"] if clock is not None else None})
    return out


def _stats(v: np.ndarray) -> dict:
    return {"min": int(v.min()), "median": float(np.median(v)), "max": int(v.max()), "count": int(len(v))}


def _one_exec(group: list[dict]) -> dict:
    ref = group[0]
    entry = {"members": [{k: m[k] for k in ("path", "context_id", "device_id", "graph_exec", "replays")}
                         for m in group],
             "per_replay": [], "skew_ns": [], "last_node_skew_ns": [], "bound_ns": None, "note": None}
    hosts = {m["hostname"] for m in group}
    if len(hosts) > 1:
        entry["note"] = "dumps from different hosts: their host clocks are unrelated, no skew computed"
        return entry
    if any(m["start_host_ns"] is None for m in group):
        entry["note"] = "a context has no clock-sync pairs: no skew computed"
        return entry
    n = min(len(m["start_host_ns"]) for m in group)
    starts = np.stack([m["start_host_ns"][:n].astype(np.int64) for m in group])  # members x replays
    lasts = np.stack([m["last_host_ns"][:n].astype(np.int64) for m in group])
    d, dl = starts - starts[0], lasts - lasts[0]
    entry["per_replay"] = [{"position": i + 1, "replays": [m["replays"][i] for m in group],
                            "start_host_ns": starts[:, i].tolist(), "skew_ns": d[:, i].tolist(),
                            "last_node_skew_ns": dl[:, i].tolist()}
                           for i in range(n)]
    entry["skew_ns"] = [_stats(d[j]) for j in range(1, len(group))] if n else []
    entry["last_node_skew_ns"] = [_stats(dl[j]) for j in range(1, len(group))] if n else []
    entry["bound_ns"] = [ref["bound_ns"] + m["bound_ns"] for m in group[1:]]
    return entry


def cross_dump(dumps, reports) -> dict | None:
    """Pair the graph execs of several dumps and give each replay's start skew against the first dump.

    ``dumps``: each an open dump, what :func:`clocks` gave of it, or a path (opened for its clocks). ``reports`` are
    reconcile's ``to_dict()`` of each, in the same order. None for fewer than two dumps."""
    if len(dumps) < 2:
        return None
    members = _members(dumps, reports)
    by_k: dict[int, list[dict]] = {}
    for m in members:
        by_k.setdefault(m["k"], []).append(m)
    execs = [_one_exec(g) for k, g in sorted(by_k.items()) if len(g) > 1]
    return {"clock": "host_monotonic",
            "pairing": "k-th graph exec of each context, replays by position; start = first block entry",
            "graph_execs": execs}


def lines(s: dict | None) -> list[str]:
    """The text report: one headline per paired graph exec, then one line per replay."""
    if not s:
        return []
    out = ["cross-dump replay skew (start of each replay against the first dump's, host CLOCK_MONOTONIC via each "
           "context's clock-sync pairs):"]
    for i, e in enumerate(s["graph_execs"]):
        names = ", ".join(f"{Path(m['path']).name} ctx {m['context_id']} {m['graph_exec']}" for m in e["members"])
        out.append(f"  graph exec #{i + 1}: {names}")
        if e["note"]:
            out.append(f"    {e['note']}")
            continue
        for j, (st, sl, b) in enumerate(zip(e["skew_ns"], e["last_node_skew_ns"], e["bound_ns"]), start=1):
            out.append(f"    {Path(e['members'][j]['path']).name} - {Path(e['members'][0]['path']).name}: "
                       f"{st['count']} replays; start skew {_us(st['min'])} .. {_us(st['max'])} "
                       f"(median {_us(st['median'])}); last-node skew {_us(sl['min'])} .. {_us(sl['max'])} "
                       f"(median {_us(sl['median'])}); alignment bound ±{b / 1000:.2f} µs")
        for r in e["per_replay"]:
            out.append(f"      replay {r['replays'][0]}: start " + ", ".join(_us(x) for x in r["skew_ns"][1:])
                       + "; last node " + ", ".join(_us(x) for x in r["last_node_skew_ns"][1:]))
    return out


def _us(ns) -> str:
    return f"{ns / 1000:+.2f} µs"
