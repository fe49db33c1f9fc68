"""Block and kernel durations for the traces, from block exit events (``kvconv record --events enter,exit``): the
computation is reconcile's (:mod:`kvconv.join.durations`: per launch first entry to last exit, per block
entry to exit paired first-in first-out per block). Per block nothing is kept across the dump (issue 13: memory
independent of the number of blocks): the first pass keeps the lanes each SM needs, the second pass pairs again
chunk by chunk, a little ahead of what it writes, and gives each block the same lane.

    >>> lanes = Lanes(chunk)                                     # doctest: +SKIP
    >>> for j in context_pass: lanes.feed(j)   # the join's chunks (kvconv.join.passes)  # doctest: +SKIP
    >>> bl = lanes.finish()                    # None: no block paired                   # doctest: +SKIP
    >>> win = BlockStream(ctx, bl).window(di)  # second pass: the pairs of events ``di``  # doctest: +SKIP

Lanes: per SM, the slices sorted by (entry, exit, entry's index) each take the lowest lane whose last slice ended
before they begin. Run streaming: a slice is placed once every slice before it in that order is known, i.e. its
entry lies before both the earliest entry of its SM still waiting for an exit and a lower bound of every later
event's time (:class:`~kvconv.join.passes.Watermarks`: per 16,384 events the minimum, read once ahead). Entries
whose exit is never recorded hold back their SM in the first pass only (the second knows them:
``BlockLanes.open_index``).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from kvconv.emit._stream import SLICE, Ctx
from kvconv.join.durations import BlockPairer
from kvconv.join.passes import Joined, Paired, Watermarks

_I64 = np.iinfo(np.int64)
_NSM = 1 << 16  # smid is u16


class LaneStream:
    """Lanes of paired blocks per SM, placed in (entry, exit, index) order as soon as that order is settled."""

    def __init__(self) -> None:
        self.state: dict[int, list] = {}  # smid -> [busy heap of (end, lane), free heap, lanes]
        self.buf = tuple(np.zeros(0, np.int64) for _ in range(4))  # smid, start, end, enter index: not placed yet

    def lanes(self) -> dict[int, int]:
        return {s: st[2] for s, st in self.state.items()}

    def feed(self, sm, start, end, index, limit: int, pend_sm, pend_t) -> tuple[np.ndarray, ...]:
        """Add paired blocks; place those before ``limit`` and before their SM's earliest waiting entry
        (``pend_sm``, ``pend_t``); returns their (enter index, exit ns, lane)."""
        b = tuple(np.concatenate([x, np.asarray(y, np.int64)]) for x, y in zip(self.buf, (sm, start, end, index)))
        lim = np.full(len(b[0]), limit, np.int64)
        if len(pend_sm) and len(lim):
            m = np.full(_NSM, _I64.max, np.int64)
            np.minimum.at(m, np.asarray(pend_sm, np.int64), np.asarray(pend_t, np.int64))
            np.minimum(lim, m[b[0]], out=lim)
        ready = b[1] < lim
        self.buf = tuple(x[~ready] for x in b)
        sm, st, en, ix = (x[ready] for x in b)
        o = np.lexsort((ix, en, st, sm))
        sm, st, en, ix = sm[o], st[o], en[o], ix[o]
        lane = np.zeros(len(sm), np.int64)
        cut = np.flatnonzero(np.diff(sm)) + 1
        for a, z in zip(np.r_[0, cut].tolist(), np.r_[cut, len(sm)].tolist()):
            if z > a:
                lane[a:z] = self._place(int(sm[a]), st[a:z], en[a:z])
        return ix, en, lane

    def _place(self, smid: int, s: np.ndarray, e: np.ndarray) -> np.ndarray:
        st = self.state.setdefault(smid, [[], [], 0])
        busy, free, n = st
        if (not busy or max(x[0] for x in busy) < s[0]) and bool(np.all(s[1:] > np.maximum.accumulate(e)[:-1])):
            # every lane free and no overlap: all on the lowest lane (what the loop below gives)
            st[0], st[1], st[2] = [(int(e.max()), 0)], list(range(1, n)), max(n, 1)
            return np.zeros(len(s), np.int64)
        out, st[2] = place_lanes(s, e, busy, free, n)
        return out


@dataclass(frozen=True)
class BlockLanes:
    """What the first pass keeps of the paired blocks: lanes per SM, entries never paired, the watermarks."""

    sm_lanes: dict  # smid -> lanes its slices need
    open_index: np.ndarray  # i8 sorted: entries left waiting at the end (never paired)
    marks: Watermarks
    chunk: int


@dataclass(frozen=True)
class BlockSlices:
    """The paired blocks of a stretch of events, by their entry's device index (sorted)."""

    enter_index: np.ndarray  # i8, sorted
    end_ns: np.ndarray  # i8 exit %globaltimer
    lane: np.ndarray  # i8 lane on the SM (0: the SM's own track)
    exit_index: np.ndarray  # i8, sorted: exits drawn as the end of their block's slice (no event of their own)

    def in_chunk(self, dev_index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For the events ``dev_index`` (increasing device indices): the pair of each paired entry (-1: none) and
        whether each is a paired exit."""
        return _lookup(self.enter_index, dev_index), _lookup(self.exit_index, dev_index) >= 0

    @staticmethod
    def of(col: np.ndarray, pair: np.ndarray, default) -> np.ndarray:
        """``col`` of each event's pair, ``default`` where it has none."""
        if not len(col):
            return np.broadcast_to(np.asarray(default, np.int64), pair.shape).copy()
        return np.where(pair >= 0, col[np.maximum(pair, 0)], default)


def _lookup(sorted_ix: np.ndarray, q: np.ndarray) -> np.ndarray:
    if not len(sorted_ix) or not len(q):
        return np.full(len(q), -1, np.int64)
    lo, hi = np.searchsorted(sorted_ix, [int(q[0]), int(q[-1]) + 1])
    part = sorted_ix[lo:hi]
    pos = np.searchsorted(part, q)
    hit = np.zeros(len(q), bool)
    if len(part):
        hit = (pos < len(part)) & (part[np.minimum(pos, len(part) - 1)] == q)
    return np.where(hit, lo + pos, -1)


class Lanes:
    """The first pass's lanes of paired blocks: fed each chunk the join hands back (:class:`Joined`, all of the
    context's events, before any filter)."""

    def __init__(self, chunk: int) -> None:
        self.chunk = chunk
        self.lanes = LaneStream()
        self.paired = 0
        self.last: Paired | None = None

    def feed(self, j: Joined) -> None:
        b = j.paired
        if b is None:
            return
        p = b.pairs
        self.paired += len(p)
        self.last = b
        self.lanes.feed(b.smid, p.start_ns, p.end_ns, p.enter_index, b.marks.at(j.end), *b.waiting)

    def finish(self) -> BlockLanes | None:
        """The lanes of the paired blocks; None when none paired."""
        if not self.paired:
            return None
        self.lanes.feed([], [], [], [], int(_I64.max), [], [])  # the rest: every slice is known
        b = self.last
        return BlockLanes(sm_lanes=self.lanes.lanes(), open_index=np.sort(b.waiting_index), marks=b.marks,
                          chunk=self.chunk)


class BlockStream:
    """The second pass's pairs: the same pairing and lanes as the first pass, run ahead of the chunk written
    until each of its entries is paired and placed (or known never to be)."""

    def __init__(self, c: Ctx, bl: BlockLanes) -> None:
        self.c, self.bl = c, bl
        self._restart()

    def _restart(self) -> None:
        self.it = self.c.chunks(self.bl.chunk, sub=SLICE)
        self.pairer, self.lanes = BlockPairer(), LaneStream()
        self.fed, self.done, self.lo = 0, False, -1
        self.res: list = []  # parts of (enter index, end, lane) placed and not yet written past
        self.exits: list = []  # parts of the paired exits' indices (increasing)

    def window(self, di: np.ndarray) -> BlockSlices:
        """The paired blocks among the events ``di`` (increasing device indices, chunks asked for in order)."""
        lo, hi = int(di[0]), int(di[-1]) + 1
        if lo < self.lo:
            self._restart()
        self.lo = lo
        while not self.done and not self._settled(hi):
            self._step()
        ix, end, lane = (np.concatenate(x) for x in zip(*self.res)) if self.res else (np.zeros(0, np.int64),) * 3
        keep = ix >= lo
        ix, end, lane = ix[keep], end[keep], lane[keep]
        o = np.argsort(ix, kind="stable")
        ix, end, lane = ix[o], end[o], lane[o]
        ex = np.concatenate(self.exits) if self.exits else np.zeros(0, np.int64)
        ex = ex[np.searchsorted(ex, lo):]
        self.res, self.exits = [(ix, end, lane)], [ex]
        j = np.searchsorted(ix, hi)
        return BlockSlices(enter_index=ix[:j], end_ns=end[:j], lane=lane[:j], exit_index=ex[: np.searchsorted(ex, hi)])

    def _settled(self, hi: int) -> bool:
        if self.fed < hi or self.pairer.pending is None:
            return False
        p = self.pairer.pending["index"]
        early = p[p < hi]
        if len(early) and not np.isin(early, self.bl.open_index).all():
            return False
        w = self.lanes.buf[3]
        return not (len(w) and int(w.min()) < hi)

    def _step(self) -> None:
        try:
            first, recs = next(self.it)
        except StopIteration:
            self.done = True
            self._place([], [], [], [], int(_I64.max))
            return
        self.fed = first + len(recs)
        p = self.pairer.feed(first, recs)
        if self.pairer.pending is None:
            return
        self.exits.append(np.sort(p.exit_index))
        sm = recs["smid"][p.exit_index - first]
        self._place(sm, p.start_ns, p.end_ns, p.enter_index, self.bl.marks.at(self.fed))

    def _place(self, sm, start, end, index, limit: int) -> None:
        ix, end, lane = self.lanes.feed(sm, start, end, index, limit, *self.pairer.waiting(self.bl.open_index))
        if len(ix):
            self.res.append((ix, end, lane))


def place_lanes(s: np.ndarray, e: np.ndarray, busy: list, free: list, nlanes: int) -> tuple[np.ndarray, int]:
    """Slices sorted by start, each on the lowest-numbered lane whose last slice ended before it starts (heaps:
    O(n log n)). ``busy`` ((end, lane) of lanes in use) and ``free`` (lanes whose last slice ended) are updated in
    place, so a caller can place a stream of slices batch by batch; returns the lanes and the new lane count."""
    out = np.zeros(len(s), np.int64)
    for k, (si, ei) in enumerate(zip(s.tolist(), e.tolist())):
        while busy and busy[0][0] < si:
            heapq.heappush(free, heapq.heappop(busy)[1])
        if free:
            j = heapq.heappop(free)
        else:
            j, nlanes = nlanes, nlanes + 1
        out[k] = j
        heapq.heappush(busy, (ei, j))
    return out, nlanes
