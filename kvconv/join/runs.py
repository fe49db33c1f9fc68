"""A chunk of device events as runs of one launch's blocks, found once and read by every check of the chunk: validate's
record checks (flags, kernel slots, blockIdx against the grid) and the reconciler's streaming pass (the exact join and
the tally) each work per run instead of per event, and no column of the chunk is compared twice.

    >>> r = chunk_runs(ev, ev["kind"])                     # doctest: +SKIP
    >>> r.starts, r.lens, r.gid, r.flags, r.max["block_x"]  # per run         # doctest: +SKIP
    >>> r.all_enter, r.consecutive  # every event a block entry; sequences +1   # doctest: +SKIP
    >>> [(int(v), rows.tolist()) for v, rows in rows_by_value(np.array([7, 3, 7]), np.array([3, 7]))]
    [(3, [1]), (7, [0, 2])]

A run is a stretch of events with equal gridid, tag, flags and kernel slot (a tracer writes a launch's blocks
together): whatever is constant in a run is read at its first event, and a run's largest blockIdx is its maximum.
The exact join looks a chunk up by the runs of :func:`event_runs` (equal gridid, tag, kind and flags) and their
heads (:func:`heads`: the keys of each run's first event).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvconv.format import layout

BLOCK_ENTER = layout.ENUMS["event_kind"]["block_enter"]


@dataclass(frozen=True)
class Runs:
    starts: np.ndarray  # i8: first event of each run
    lens: np.ndarray  # i8: events in each run
    gid: np.ndarray  # per run: its gridid, tag, flags, kernel slot (those of every event in it)
    tag: np.ndarray
    flags: np.ndarray
    slot: np.ndarray
    max: dict  # "block_x" / "block_y" / "block_z" -> per run, the largest
    all_enter: bool  # every event of the chunk a block entry (its kind column need not be read again)
    consecutive: bool  # sequences rise by exactly 1 from event to event (in order, no gap, no repeat)

    @property
    def n(self) -> int:
        return len(self.starts)


def run_starts(*cols: np.ndarray) -> np.ndarray:
    """Starts of runs of equal values in every column of ``cols`` (equal lengths), as int64 indices."""
    if not len(cols[0]):
        return np.zeros(0, np.int64)
    chg = cols[0][1:] != cols[0][:-1]
    for col in cols[1:]:
        chg |= col[1:] != col[:-1]
    out = np.empty(int(np.count_nonzero(chg)) + 1, np.int64)
    out[0] = 0
    out[1:] = np.flatnonzero(chg)
    out[1:] += 1
    return out


def chunk_runs(ev: np.ndarray, kind: np.ndarray | None = None) -> Runs:
    """The runs of a chunk of device event records (``kind``: its kind column, already read by the caller; None:
    every event is known to be a block entry)."""
    gid, tag, flags, slot = ev["gridid"], ev["tag"], ev["flags"], ev["kernel_slot"]
    st = run_starts(gid, tag, flags, slot)
    n = len(ev)
    lens = np.empty(len(st), np.int64)
    lens[:-1] = st[1:] - st[:-1]
    if len(st):
        lens[-1] = n - st[-1]
    mx = {b: np.maximum.reduceat(ev[b], st) if n else np.zeros(0, ev.dtype[b]) for b in ("block_x", "block_y",
                                                                                             "block_z")}
    seq = ev["sequence"]
    return Runs(starts=st, lens=lens, gid=gid[st], tag=tag[st], flags=flags[st], slot=slot[st], max=mx,
                all_enter=kind is None or bool(np.all(kind == BLOCK_ENTER)),
                consecutive=n < 2 or bool(np.all(np.diff(seq) == 1)))


SCAN_GROUPS = 64  # up to this many values, a comparison pass over the column each; beyond it, one stable sort


def rows_by_value(col: np.ndarray, values: np.ndarray, live: np.ndarray | None = None):
    """Yield ``(value, rows)`` for each of ``values`` (distinct, increasing): the rows of ``col`` equal to it (and
    ``live``), increasing. A few values (graph execs): one comparison over the column each, no temporaries beyond a
    value's rows; many (a run that instantiates a graph per step): one stable sort, not a pass per value."""
    if len(values) <= SCAN_GROUPS:
        for v in values:
            m = col == v
            if live is not None:
                m &= live
            yield v, np.flatnonzero(m)
        return
    rows = np.flatnonzero(live) if live is not None else np.arange(len(col))
    order = rows[np.argsort(col[rows], kind="stable")]
    srt = col[order]
    lo, hi = np.searchsorted(srt, values, "left"), np.searchsorted(srt, values, "right")
    del srt
    for v, a, b in zip(values, lo.tolist(), hi.tolist()):
        yield v, order[a:b]


_EV_DT = layout.DTYPES["device_event"]
_OFF = {name: _EV_DT.fields[name][1] for name in _EV_DT.names}


def event_runs(recs: np.ndarray) -> np.ndarray:
    """Starts of runs of device events with equal (gridid, tag, kind, flags)."""
    n = len(recs)
    if n <= 1:
        return np.zeros(n, np.int64)
    if recs.dtype == _EV_DT and recs.dtype.itemsize % 8 == 0 and recs.flags.c_contiguous \
            and _OFF["flags"] == _OFF["kind"] + 1 and _OFF["kind"] // 8 == (_OFF["flags"]) // 8:
        w = recs.view(np.uint64).reshape(n, _EV_DT.itemsize // 8)
        g, t = w[:, _OFF["gridid"] // 8], w[:, _OFF["tag"] // 8]
        kf = w[:, _OFF["kind"] // 8] >> np.uint64(8 * (_OFF["kind"] % 8))
    else:
        g, t = recs["gridid"], recs["tag"]
        kf = recs["kind"].astype(np.uint16) | (recs["flags"].astype(np.uint16) << np.uint16(8))
    return run_starts(g, t, kf)


def heads(recs: np.ndarray, starts: np.ndarray):
    """(gridid, tag, flags, kind) of the events at ``starts``."""
    if _OFF["kind"] % 8 <= 6 and recs.flags.c_contiguous and recs.dtype == _EV_DT:
        w = recs.view(np.uint64).reshape(len(recs), _EV_DT.itemsize // 8)[starts]
        kf = w[:, _OFF["kind"] // 8]
        return (w[:, _OFF["gridid"] // 8], w[:, _OFF["tag"] // 8],
                (kf >> np.uint64(8 * (_OFF["flags"] % 8))) & np.uint64(0xFF),
                (kf >> np.uint64(8 * (_OFF["kind"] % 8))) & np.uint64(0xFF))
    h = recs[starts]
    return h["gridid"], h["tag"], h["flags"], h["kind"]


def runs_of(hid: np.ndarray):
    """Run starts of equal values in ``hid`` and the value of each run (returned as (starts, values))."""
    n = len(hid)
    if not n:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    st = np.flatnonzero(hid[1:] != hid[:-1]) + 1
    starts = np.concatenate([[0], st]).astype(np.int64)
    return starts, hid[starts].astype(np.int64)


def expand_runs(starts: np.ndarray, values: np.ndarray, n: int) -> np.ndarray:
    """Each of ``n`` events' value, from the runs ``(starts, values)``."""
    if not n:
        return np.zeros(0, np.int64)
    if len(starts) == n:
        return values.astype(np.int64, copy=False)
    return np.repeat(values, np.diff(np.append(starts, n)))
