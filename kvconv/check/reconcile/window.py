"""The ordered join chunk by chunk: a second pass over a context's device events, after the streaming pass
(:mod:`kvconv.check.reconcile.stream`) has counted them and found them in sequence order. State is per launch-table
row (the tallies, the misfits per launch, the ambiguous runs) plus the list of sequence gaps, whatever the number of
events; the report and the JSON are those of the in-memory join (:func:`kvconv.check.reconcile.ordered.join_ordered`).

    >>> w = join_window(stream, drops, event_chunks(d, ctx))     # doctest: +SKIP
    >>> stream.t = stream.t.complete(d, ctx)                   # host times and streams: let go during the pass
    >>> w.ordered.regions, w.tally.matched, w.after          # None: fell back to the in-memory join

The in-memory join is kept for what this pass cannot place in order: events whose sequences (of every kind) do not
rise strictly in file order, and more events than blocks with no drop (the surplus search goes back and forth over
the events: a damaged dump's rare shape).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from kvconv.check.reconcile.count import gridid_contradicts
from kvconv.check.reconcile.ordered import Layout, Ordered, Placer, finish, offsets_of
from kvconv.check.reconcile.tally import Tally, TallyBuilder
from kvconv.format import layout
from kvconv.join.events import BLOCK_ENTER, SEQ_LIMIT, Drops
from kvconv.join.exact import Match

_GID = np.uint8(layout.ENUMS["event_flags"]["has_gridid"])


@dataclass(frozen=True)
class Windowed:
    ordered: Ordered  # match None: the events were not held
    misfits: dict  # reported at the join's turn (ordered.misfit_notes); the placer's host layout is gone by then
    tally: Tally  # before the %gridid cross-check (the block counts)
    after: Tally | None  # after it, when it withdrew events (the timing and the device counts)
    contradicted: tuple  # (events, first device index) the %gridid cross-check withdrew


def _entries(recs: np.ndarray, base: int, n_other: int):
    """A chunk's block-enter events, their indices in the context, and the other events (exits: slots of no block)
    before each, ``n_other`` before the chunk."""
    be = recs["kind"] == BLOCK_ENTER
    if bool(be.all()):
        return recs, np.arange(base, base + len(recs), dtype=np.int64), n_other
    bi = np.flatnonzero(be)
    return recs[bi], base + bi, n_other + bi - np.arange(len(bi))


def join_window(s, drops: Drops, chunks) -> Windowed | None:
    """``s``: the context's finished streaming pass (events in sequence order, counted); ``chunks``: ``(first
    index, records)`` over its device events again. None: the pass cannot place them (see the module), nothing
    reported. The table's host times and streams are read by the layout only and let go (``s.t`` without them: 16
    bytes a row, issue 13); the caller reads them again (:meth:`LaunchTable.complete`)."""
    L = Layout(s.t)
    s.t = L.t = t = replace(s.t, host_ns=None, stream=None)
    n = s.n
    ranks = s.last_seq >= SEQ_LIMIT  # positions are ranks (load_events' rule)
    if ranks:
        T = n
    else:  # every event before the last entry has a smaller sequence: the others among them are not slots
        T = s.last_seq - (s.last_idx - (n - 1)) + 1
    delta, s_lo, s_hi, info = offsets_of(L.E, T, n, drops.device, drops.device_lost)
    if delta < 0 and drops.device == 0 and len(L.order):
        return None  # surplus: the in-memory join locates it
    P = Placer(L, s_lo, s_hi)
    b = TallyBuilder(t, max_events=n)
    b2 = None  # the tally after the %gridid cross-check: forked from ``b`` at the first event it withdraws
    g = _Gaps()
    last_seq, n_other, done, bad_n, bad_first = -1, 0, 0, 0, -1
    for base, recs in chunks:
        if not len(recs):
            continue
        seq = recs["sequence"]
        if int(seq[0]) <= last_seq or bool(np.any(seq[1:] <= seq[:-1])):
            return None  # not strictly rising in file order: positions need the sort of the in-memory join
        last_seq = int(seq[-1])
        sub, idx, others = _entries(recs, base, n_other)
        n_other += len(recs) - len(sub)
        if not len(sub):
            continue
        p = (np.arange(done, done + len(sub), dtype=np.int64) if ranks
             else sub["sequence"].astype(np.int64) - others)
        done += len(sub)
        g.add(p)
        m = Match.empty(len(sub))
        P.place(m, p, sub["kernel_slot"], idx)
        x, y, z, tt = sub["block_x"], sub["block_y"], sub["block_z"], sub["globaltimer"]
        bad = gridid_contradicts(t, m, (sub["flags"] & _GID) != 0, sub["gridid"]) if s.any_gid else None
        if bad is not None and b2 is None and bad.any():
            b2 = b.fork()
        _tally(b, m, x, y, z, tt, idx)
        if b2 is not None:
            if bad.any():
                bad_first = int(idx[np.flatnonzero(bad)[0]]) if bad_n == 0 else bad_first
                bad_n += int(bad.sum())
                m.host[bad], m.ordinal[bad] = -1, -1
            _tally(b2, m, x, y, z, tt, idx)
    if done != n or (n and g.last != T - 1):
        return None  # the file changed under the passes, or the counting pass's rule did not hold
    g.freeze()
    o = finish(L, P, lambda blo, bhi: g.count(blo - s_hi, bhi - s_lo), None, delta, info, {}, drops)
    return Windowed(ordered=o, misfits=P.misfit, tally=b.finish(n), after=b2.finish(n) if b2 is not None else None,
                    contradicted=(bad_n, bad_first))


def _tally(b: TallyBuilder, m: Match, x, y, z, tt, idx) -> None:
    """One chunk's join into a tally (as :func:`kvconv.check.reconcile.tally.tally_match` does for all events)."""
    hm = m.host >= 0
    if hm.all():
        b.add_matched(m.host, x, y, z, tt, idx)
        return
    s = np.flatnonzero(hm)
    b.add_matched(m.host[s], x[s], y[s], z[s], tt[s], idx[s])
    s = np.flatnonzero(~hm)
    b.add_loose(m.kind[s], m.join[s], m.exec[s], m.replay[s], m.ordinal[s], tt[s])


class _Gaps:
    """The events' positions (strictly rising) as runs of consecutive positions: the events at positions
    ``a .. b-1`` are counted from them, after the pass (a region's events lie before and after it). One entry per
    sequence gap, not per event."""

    def __init__(self) -> None:
        self.starts: list = []  # first position of each run
        self.ranks: list = []  # events before it
        self.last, self.n = -2, 0

    def add(self, p: np.ndarray) -> None:
        brk = np.flatnonzero(np.diff(p, prepend=self.last) != 1)
        self.starts.append(p[brk])
        self.ranks.append(brk + self.n)
        self.last, self.n = int(p[-1]), self.n + len(p)

    def _below(self, x: int) -> int:
        """Events at positions below ``x``."""
        j = int(np.searchsorted(self.st, x, side="left")) - 1
        if j < 0:
            return 0
        end = int(self.rk[j + 1]) if j + 1 < len(self.rk) else self.n
        return int(self.rk[j]) + min(x - int(self.st[j]), end - int(self.rk[j]))

    def freeze(self) -> None:
        """Every event is in: the runs as two arrays."""
        self.st = np.concatenate(self.starts) if self.starts else np.zeros(0, np.int64)
        self.rk = np.concatenate(self.ranks) if self.ranks else np.zeros(0, np.int64)
        self.starts, self.ranks = [], []

    def count(self, a: int, b: int) -> int:
        return max(self._below(b) - self._below(a), 0)
