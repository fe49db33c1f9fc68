"""Flow ends: per host launch record, the first K kept device events matched to it, held in memory that does not
grow with K nor (usually) with the events.

A launch's blocks come in a run of consecutive device events, so a record's flow ends are almost always consecutive
device indices: a record keeps only the device index of its first flow end (``first``); its count is
``min(blocks recorded, K)``. Records whose flow ends are not consecutive (launches interleaved on several streams,
filters that skip events) are listed apart, device index by device index (``xrows`` / ``xptr`` / ``xdev``). The
second pass asks which events of a chunk end a flow (:meth:`Flows.mask`): the flow ends as merged ranges of device
indices, built once after the first pass.

    >>> f = Flows.new(2, 3)
    >>> f.add(np.array([0, 1]), np.array([0, 0]), np.array([3, 2]), np.array([0, 5]), 0, None)
    >>> f.finish(np.array([4, 2]))
    >>> f.of_rows(np.array([0, 1]))[0].tolist(), f.mask(0, 8).nonzero()[0].tolist()
    ([[0, 1, 2], [5, 6, -1]], [0, 1, 2, 5, 6])
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

XROW = -2  # ``first`` of a record whose flow ends are listed apart


@dataclass
class Flows:
    K: int
    first: np.ndarray  # per host row: device index of its first flow end; -1 none; XROW listed apart
    kept: np.ndarray | None = None  # per host row: blocks kept (the first pass's count; flow ends: min(kept, K))
    xrows: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # rows listed apart, increasing
    xptr: np.ndarray = field(default_factory=lambda: np.zeros(1, np.int64))  # their flow ends: xdev[xptr[i]:xptr[i+1]]
    xdev: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    starts: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # all flow ends as merged ranges
    ends: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    _parts: list = field(default_factory=list)  # (row, rank, device index) of rows listed apart, while adding

    @classmethod
    def new(cls, rows: int, K: int) -> Flows:
        return cls(K=K, first=np.full(rows if K else 0, -1, np.int64))

    def add(self, hm, base, take, pos0, first_i: int, dev_index) -> None:
        """Fold a chunk's runs in: run r of host row ``hm[r]`` gives its ``take[r]`` events from chunk position
        ``pos0[r]`` on, as flow ends ``base[r]``.. of its row (``dev_index``: device index of each chunk position
        when a filter dropped events, else ``first_i`` + position)."""
        t = take > 0
        if not t.any():
            return
        hr, br, tr, p0 = hm[t], base[t], take[t], pos0[t]
        if dev_index is None:
            d0 = p0 + first_i
            inside = True
        else:
            d0 = dev_index[p0]
            inside = dev_index[p0 + tr - 1] - d0 == tr - 1  # the run's kept events are consecutive
        z = br == 0
        self.first[hr[z]] = d0[z]
        f = self.first[hr]
        ok = inside & (f >= 0) & (d0 == f + br)
        if ok.all():
            return
        new = np.unique(hr[~ok & (f != XROW)])
        if len(new):  # their flow ends so far (consecutive) go to the list, then this chunk's
            k = np.searchsorted(new, hr)
            on = (k < len(new)) & (new[np.minimum(k, len(new) - 1)] == hr)
            before = np.full(len(new), self.K, np.int64)
            np.minimum.at(before, k[on], br[on])
            rr = np.repeat(new, before)
            rank = np.arange(len(rr)) - np.repeat(np.cumsum(before) - before, before)
            self._parts.append((rr, rank, np.repeat(self.first[new], before) + rank))
            self.first[new] = XROW
        x = self.first[hr] == XROW
        hr, br, tr, p0 = hr[x], br[x], tr[x], p0[x]
        tot = int(tr.sum())
        ri = np.repeat(np.arange(len(hr)), tr)
        off = np.arange(tot) - np.repeat(np.cumsum(tr) - tr, tr)
        pos = p0[ri] + off
        self._parts.append((hr[ri], br[ri] + off, (pos + first_i) if dev_index is None else dev_index[pos]))

    def finish(self, count: np.ndarray) -> None:
        """After the first pass (``count``: kept events per host row): the rows listed apart in order, and the
        merged ranges of every flow end for :meth:`mask`."""
        K = self.K
        if not K:
            return
        self.kept = count
        if self._parts:
            r, k, d = (np.concatenate(a) for a in zip(*self._parts))
            self._parts = []
            o = np.lexsort((k, r))
            r, d = r[o], d[o]
            self.xrows, at = np.unique(r, return_index=True)
            self.xptr = np.r_[at, len(r)].astype(np.int64)
            self.xdev = d
        rows = np.flatnonzero(self.first >= 0)
        s = np.concatenate([self.first[rows], self.xdev])
        e = s + np.concatenate([self.counts(rows), np.ones(len(self.xdev), np.int64)])
        del rows
        o = np.argsort(s, kind="stable")
        s, e = s[o], e[o]
        del o
        head = np.r_[True, s[1:] != e[:-1]] if len(s) else np.zeros(0, bool)  # merge touching ranges
        tail = np.r_[head[1:], True] if len(s) else head
        self.starts, self.ends = s[head], e[tail]

    def counts(self, rows: np.ndarray) -> np.ndarray:
        """Flow ends of host rows ``rows``."""
        return np.minimum(self.kept[rows], self.K).astype(np.int64)

    def of_rows(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(device indices (len(rows), K), -1 padding; flow ends per row)`` of some host rows."""
        K = self.K
        cnt = self.counts(rows)
        f = self.first[rows]
        dev = f[:, None] + np.arange(K, dtype=np.int64)[None, :]
        if len(cnt) and int(cnt.min()) < K:
            dev[np.arange(K)[None, :] >= cnt[:, None]] = -1
        x = np.flatnonzero(f == XROW)
        if len(x):
            i = np.searchsorted(self.xrows, rows[x])
            for j, a, b in zip(x.tolist(), self.xptr[i].tolist(), self.xptr[i + 1].tolist()):
                dev[j, : b - a] = self.xdev[a:b]
        return dev, cnt

    def ids_of_rows(self, rows: np.ndarray, high: int) -> tuple[np.ndarray, np.ndarray]:
        """``(flow ids (len(rows), K) u8, flow ends per row)`` of some host rows: ``high`` OR-ed with each flow end's
        device index (:func:`kvconv.emit._first_pass.flow_id`), made in one pass; a row's entries past its count are
        left undefined (not -1 as :meth:`of_rows` pads: every reader stops at the count)."""
        K = self.K
        cnt = self.counts(rows)
        f = self.first[rows]
        ids = np.empty((len(rows), K), np.uint64)
        # device indices stay below 2**40 (flow_id's layout), so high | (first + k) == (high | first) + k
        np.add((f.astype(np.uint64) | np.uint64(high))[:, None], np.arange(K, dtype=np.uint64)[None, :], out=ids)
        x = np.flatnonzero(f == XROW)
        if len(x):
            i = np.searchsorted(self.xrows, rows[x])
            for j, a, b in zip(x.tolist(), self.xptr[i].tolist(), self.xptr[i + 1].tolist()):
                ids[j, : b - a] = self.xdev[a:b].astype(np.uint64) | np.uint64(high)
        return ids, cnt

    def mask(self, first: int, n: int) -> np.ndarray | None:
        """Which events of the chunk ``first .. first+n`` end a flow (None: none)."""
        if not len(self.starts):
            return None
        lo = int(np.searchsorted(self.ends, first, side="right"))
        hi = int(np.searchsorted(self.starts, first + n, side="left"))
        if lo >= hi:
            return None
        d = np.zeros(n + 1, np.int8)
        d[np.maximum(self.starts[lo:hi] - first, 0)] += 1
        np.subtract.at(d, np.minimum(self.ends[lo:hi] - first, n), 1)
        return np.cumsum(d[:n]) > 0
