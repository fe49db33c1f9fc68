"""The first streaming pass over a context's device events: what the tracks need before any is written (per host
launch: matched blocks, first and last entry, the device events that end its flows; events per SM and per ms; the
kernel slots seen; the filters' verdict). The join's part (the host row of each event, the filters, the matched blocks
and durations per row) is :class:`kvconv.join.passes.ContextPass`'s: this pass hands it the chunks and counts, from
each chunk it hands back, what the tracks need besides.

    >>> agg = first_pass(ctx, EmitOptions(flows=4))         # doctest: +SKIP
    >>> agg.count[row], agg.first_ts[row], agg.last_ts[row]
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from kvconv.emit._blocks import BlockLanes, Lanes
from kvconv.emit._flows import Flows
from kvconv.emit._stream import SLICE, Ctx
from kvconv.emit.options import EmitOptions
from kvconv.join.passes import ContextPass, Keep, keep_mask


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


def keep_of(c: Ctx, options: EmitOptions, t0: int | None) -> Keep:
    """The filters of ``options`` as the join applies them, for the context ``c`` whose first device event is at
    ``t0`` (device ns)."""
    window = host_window = None
    if options.window_ms is not None and t0 is not None:
        window = (t0 + int(options.window_ms[0] * 1e6), t0 + int(options.window_ms[1] * 1e6))
        if c.clock.n:
            host_window = tuple(c.clock.to_host(np.array([w], np.uint64))[0] for w in window)
    return Keep(window=window, replays=options.replays, host_window=host_window,
                windowed=options.window_ms is not None)


def event_keep(c: Ctx, recs: np.ndarray, hid: np.ndarray, options: EmitOptions, t0: int | None) -> np.ndarray | None:
    """Filter mask of a chunk (None: keep all)."""
    return keep_mask(recs, hid, c.host, keep_of(c, options, t0))


def first_pass(c: Ctx, options: EmitOptions, progress=None, *, drop: tuple = ()) -> Agg:
    """The context's first pass: the join's (:class:`ContextPass`: host row of each event, the filters, matched
    blocks and durations per row) and, from each chunk it hands back, what the tracks count besides. A context
    whose launch table is not loaded (lazy) has it loaded by the join for the pass (``drop``: columns not read)."""
    K = options.flows
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
    keep = keep_of(c, options, t0)
    lanes = Lanes(options.chunk)
    chunks = c.chunks(options.chunk, verify=options.verify_checksums, sub=SLICE)
    again = functools.partial(c.chunks, options.chunk, sub=SLICE)  # the timestamps read ahead, at the first exit
    cp = ContextPass(chunks, again, c.host, c.xjoin, keep=keep, hid=c.hid, runs=c._runs, bases=K > 0,
                     progress=progress, d=c.dump, ctx=c.context_id, drop=drop)
    flows = Flows.new(cp.n, K)
    for j in cp:
        lanes.feed(j)
        n = len(j.ts)
        if not n:
            continue
        tsi = j.ts
        lo, hi = int(tsi.min()), int(tsi.max())
        t0 = lo if t0 is None or (options.window_ms is None and lo < t0) else t0
        t1 = hi if t1 is None or hi > t1 else t1
        recs = j.recs
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
        r = j.runs
        if K and r is not None:
            flows.add(r.rows, r.base, np.clip(K - r.base, 0, r.lens), r.at, j.first, j.dev_index)
    blocks = lanes.finish()
    rate_ms, rate_vals = rate_steps(bins_parts, cnt_parts)
    rows = cp.finish()
    flows.finish(rows.count)
    return Agg(count=rows.count, first_ts=rows.first_ts, last_ts=rows.last_ts, flows=flows, sm_count=sm,
               slots=np.array(sorted(slots), np.int64), t0=t0, t1=t1, rate_ms=rate_ms, rate_vals=rate_vals,
               kept=rows.kept, kept_hosts=rows.kept_hosts, durations=rows.durations, blocks=blocks)


def _ms_bins(ms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A chunk's ms bins and their event counts: runs of equal consecutive bins when there are few (events come
    nearly in time order; :func:`rate_steps` merges a bin seen in several runs), else each distinct bin once."""
    cut = np.flatnonzero(ms[1:] != ms[:-1]) + 1
    if len(cut) <= len(ms) // 8:
        at = np.concatenate([[0], cut])
        return ms[at], np.diff(np.append(at, len(ms)))
    b, k = np.unique(ms, return_counts=True)
    return b, k.astype(np.int64)


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
