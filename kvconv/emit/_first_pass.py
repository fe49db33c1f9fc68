"""The first streaming pass over a context's device events: what the tracks need before any is written (per host
launch: matched blocks, first and last entry, the device events that end its flows; events per SM and per ms; the
kernel slots seen; the filters' verdict).

    >>> agg = first_pass(ctx, EmitOptions(flows=4))         # doctest: +SKIP
    >>> agg.count[row], agg.first_ts[row], agg.last_ts[row]
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvconv.emit._blocks import BlockLanes, Timing
from kvconv.emit._flows import Flows
from kvconv.emit._stream import GRAPH_NODE, SLICE, Ctx, expand_runs, runs_of
from kvconv.emit.options import EmitOptions


@dataclass
class Agg:
    """Per-context aggregates of the first streaming pass."""

    count: np.ndarray  # per host row: matched device events kept
    first_ts: np.ndarray  # per host row: earliest matched block entry (device ns, uint64)
    last_ts: np.ndarray
    flows: Flows  # per host row: the device events that end its flows
    sm_count: np.ndarray  # events per SM id
    slots: np.ndarray  # kernel slots seen
    t0: int | None  # first device event ns (min)
    t1: int | None
    rate_ms: np.ndarray  # events-per-ms counter as a step function: ms bins where the count changes (uint64) ...
    rate_vals: np.ndarray  # ... and the count from there on (the last step is back to 0)
    kept: int  # device events kept by the filters
    kept_hosts: np.ndarray  # bool per host row
    durations: object = None  # kvconv.join.durations.Durations per host row (None: no block exits)
    blocks: BlockLanes | None = None  # lanes of the paired blocks (entry to exit) per SM


def event_keep(c: Ctx, recs: np.ndarray, hid: np.ndarray, options: EmitOptions, t0: int | None) -> np.ndarray | None:
    """Filter mask of a chunk (None: keep all)."""
    keep = None
    if options.window_ms is not None and t0 is not None:
        lo = t0 + int(options.window_ms[0] * 1e6)
        hi = t0 + int(options.window_ms[1] * 1e6)
        ts = recs["globaltimer"]
        keep = (ts >= np.uint64(max(lo, 0))) & (ts <= np.uint64(max(hi, 0)))
    if options.replays is not None:
        h = c.host
        a, b = options.replays
        ok_h = (h.kind == GRAPH_NODE) & (h.launch_id >= a) & (h.launch_id <= b)
        k2 = (hid >= 0) & ok_h[np.maximum(hid, 0)]
        keep = k2 if keep is None else keep & k2
    return keep


def first_pass(c: Ctx, options: EmitOptions, progress=None) -> Agg:
    h = c.host
    K = options.flows
    count = np.zeros(h.n, np.int64)
    first = np.full(h.n, np.iinfo(np.uint64).max, np.uint64)
    last = np.zeros(h.n, np.uint64)
    flows = Flows.new(h.n, K)
    sm = np.zeros(1 << 16, np.int64)
    slots: set[int] = set()
    t0 = t1 = None
    # t0 (the window's origin) needs the first event time before filtering: take the min over the first chunk
    # walk cheaply when a window is asked for.
    if options.window_ms is not None and c.n_events:
        mins = [int(g.records["globaltimer"].min()) for g in c.groups if len(g.records)]
        t0 = min(mins) if mins else None
    bins_parts: list[np.ndarray] = []  # per chunk: distinct ms bins and their counts (sparse: bounded by the events,
    cnt_parts: list[np.ndarray] = []  # never by the time span a damaged timestamp can open)
    kept = 0
    filtered = options.window_ms is not None or options.replays is not None
    timing = Timing(c, options.chunk)
    for first_i, recs in c.chunks(options.chunk, verify=options.verify_checksums, sub=SLICE):
        if progress is not None:
            progress(len(recs))
        if not len(recs):
            continue
        timing.feed(first_i, recs)
        starts, rhid = c.match_runs(first_i, recs)
        ts = recs["globaltimer"]
        dev_index = None
        if filtered:
            hid = expand_runs(starts, rhid, len(recs))
            keep = event_keep(c, recs, hid, options, t0)
            if keep is not None:
                idx = np.flatnonzero(keep)
                recs, hid, ts = recs[idx], hid[idx], ts[idx]
                dev_index = first_i + idx
                starts, rhid = runs_of(hid)
        n = len(ts)
        if not n:
            continue
        kept += n
        tsi = np.ascontiguousarray(ts, dtype=np.uint64)
        lo, hi = int(tsi.min()), int(tsi.max())
        t0 = lo if t0 is None or (options.window_ms is None and lo < t0) else t0
        t1 = hi if t1 is None or hi > t1 else t1
        sm_n = np.bincount(recs["smid"])  # (the SMs seen: a pass over 65,536 counters per chunk was 4 ms a trace)
        sm[: len(sm_n)] += sm_n
        ks = recs["kernel_slot"]
        kmin, kmax = int(ks.min()), int(ks.max())
        slots.update([kmin] if kmin == kmax else np.unique(ks).tolist())
        # events per ms
        ms = tsi // np.uint64(1_000_000)
        if lo // 1_000_000 == hi // 1_000_000:
            bins_parts.append(ms[:1])
            cnt_parts.append(np.array([n], np.int64))
        else:
            b, k = _ms_bins(ms)
            bins_parts.append(b)
            cnt_parts.append(k)
        _add_runs(count, first, last, flows, starts, rhid, tsi, first_i, dev_index)
    flows.finish(count)
    kept_hosts = _kept_hosts(c, options, count, t0)
    rate_ms, rate_vals = rate_steps(bins_parts, cnt_parts)
    durations, blocks = timing.finish(count, first)
    return Agg(count=count, first_ts=first, last_ts=last, flows=flows, sm_count=sm,
               slots=np.array(sorted(slots), np.int64), t0=t0, t1=t1, rate_ms=rate_ms, rate_vals=rate_vals, kept=kept,
               kept_hosts=kept_hosts, durations=durations, blocks=blocks)


def _ms_bins(ms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A chunk's ms bins and their event counts: runs of equal consecutive bins when there are few (events come
    nearly in time order; :func:`rate_steps` merges a bin seen in several runs), else each distinct bin once."""
    cut = np.flatnonzero(ms[1:] != ms[:-1]) + 1
    if len(cut) <= len(ms) // 8:
        at = np.concatenate([[0], cut])
        return ms[at], np.diff(np.append(at, len(ms)))
    b, k = np.unique(ms, return_counts=True)
    return b, k.astype(np.int64)


def _add_runs(count, first, last, flows: Flows, starts, rhid, tsi, first_i: int, dev_index) -> None:
    """Fold a chunk's runs (one host row each) into the per-row count, first and last entry, and the first K
    device events of each row that end a flow."""
    n = len(tsi)
    m = rhid >= 0
    if m.any():
        rl = np.diff(np.append(starts, n))
        hm, rlm, sm_ = rhid[m], rl[m], starts[m]
        base = _run_bases(hm, rlm, count) if flows.K else None
        rmin = np.minimum.reduceat(tsi, starts)[m]
        rmax = np.maximum.reduceat(tsi, starts)[m]
        if _distinct(hm, len(count)):
            count[hm] += rlm
            np.minimum(first[hm], rmin, out=rmin)
            first[hm] = rmin
            np.maximum(last[hm], rmax, out=rmax)
            last[hm] = rmax
        else:
            np.add.at(count, hm, rlm)
            np.minimum.at(first, hm, rmin)
            np.maximum.at(last, hm, rmax)
        if flows.K:
            flows.add(hm, base, np.clip(flows.K - base, 0, rlm), sm_, first_i, dev_index)


def _kept_hosts(c: Ctx, options: EmitOptions, count: np.ndarray, t0: int | None) -> np.ndarray:
    """Host rows the filters keep: in --replays, and for --window matched inside it or (unmatched) launched inside
    it on the host clock."""
    h = c.host
    kept_hosts = np.ones(h.n, bool)
    if options.replays is not None:
        a, b = options.replays
        kept_hosts = (h.kind == GRAPH_NODE) & (h.launch_id >= a) & (h.launch_id <= b)
    if options.window_ms is not None:
        in_win = count > 0
        unm = count == 0
        if t0 is not None and c.clock.n:
            lo = c.clock.to_host(np.array([t0 + int(options.window_ms[0] * 1e6)], np.uint64))[0]
            hi = c.clock.to_host(np.array([t0 + int(options.window_ms[1] * 1e6)], np.uint64))[0]
            hn = h.host_ns.astype(np.int64)
            in_win = in_win | (unm & (hn >= lo) & (hn <= hi))
        kept_hosts &= in_win
    return kept_hosts


def _distinct(hm: np.ndarray, n: int) -> bool:
    """Whether the values of ``hm`` (host rows) are all different."""
    if len(hm) <= 1 or bool(np.all(hm[1:] > hm[:-1])):
        return True
    return int(np.bincount(hm, minlength=n).max()) <= 1


def _run_bases(hm: np.ndarray, rl: np.ndarray, count: np.ndarray) -> np.ndarray:
    """Events of each run's host row before the run: earlier chunks (``count``) plus earlier runs of this chunk."""
    base = count[hm].copy()
    if len(hm) > 1 and not bool(np.all(hm[1:] > hm[:-1])):
        o = np.argsort(hm, kind="stable")
        s, r = hm[o], rl[o]
        cs = np.cumsum(r) - r  # exclusive, over the sorted runs
        head = np.flatnonzero(np.concatenate([[True], s[1:] != s[:-1]]))
        cs -= np.repeat(cs[head], np.diff(np.append(head, len(s))))
        base[o] += cs
    return base


def rate_steps(bins_parts: list, cnt_parts: list) -> tuple[np.ndarray, np.ndarray]:
    """Merge per-chunk (ms bin, count) pairs into the change points of the events-per-ms step function, with the
    drop back to 0 after each run of busy milliseconds (what a dense histogram's change points would give)."""
    if not bins_parts:
        return np.zeros(0, np.uint64), np.zeros(0, np.int64)
    bins, inv = np.unique(np.concatenate(bins_parts), return_inverse=True)
    counts = np.bincount(inv, weights=np.concatenate(cnt_parts)).astype(np.int64)
    nxt = np.r_[bins[1:], bins[-1]]
    gap = np.r_[nxt[:-1] != bins[:-1] + np.uint64(1), True] & (bins < np.uint64(2**64 - 1))
    pts = np.concatenate([bins, bins[gap] + np.uint64(1)])
    vals = np.concatenate([counts, np.zeros(int(gap.sum()), np.int64)])
    o = np.argsort(pts, kind="stable")
    pts, vals = pts[o], vals[o]
    keep = np.r_[True, vals[1:] != vals[:-1]]
    return pts[keep], vals[keep]


def flow_id(c: Ctx, dev_index) -> np.ndarray:
    """Trace-wide flow id of a (context, device event) pair."""
    return (np.uint64(c.serial + 1) << np.uint64(40)) | np.asarray(dev_index, dtype=np.uint64)
