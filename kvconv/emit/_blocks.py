"""Block and kernel durations for the traces, from block exit events (``kvconv record --events enter,exit``): the
computation is reconcile's (:mod:`kvconv.check.reconcile.durations`: per launch first entry to last exit, per block
entry to exit paired first-in first-out per block); here it is fed during the emitters' first pass and what the
second pass draws is kept: each paired block's entry (device index), exit time and SM.

    >>> timing = Timing(ctx)                                   # doctest: +SKIP
    >>> for first, recs in ctx.chunks(chunk): timing.feed(first, recs)
    >>> durations, blocks = timing.finish(agg.count, agg.first_ts)   # (None, None): the dump has no exits
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvconv.check.reconcile.durations import Durations, LaunchDurations
from kvconv.emit._stream import Ctx

_I64 = np.iinfo(np.int64)


@dataclass(frozen=True)
class BlockSlices:
    """The paired blocks of a context, by their entry's device index (sorted)."""

    enter_index: np.ndarray  # i8, sorted
    start_ns: np.ndarray  # i8 entry %globaltimer
    end_ns: np.ndarray  # i8 exit %globaltimer
    smid: np.ndarray  # the SM both events name
    exit_index: np.ndarray  # i8, sorted: exits drawn as the end of their block's slice (no event of their own)

    def __len__(self) -> int:
        return len(self.enter_index)

    def in_chunk(self, dev_index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For the events ``dev_index`` (increasing device indices): the pair of each paired entry (-1: none) and
        whether each is a paired exit."""
        return _lookup(self.enter_index, dev_index), _lookup(self.exit_index, dev_index) >= 0


def _lookup(sorted_ix: np.ndarray, q: np.ndarray) -> np.ndarray:
    if not len(sorted_ix) or not len(q):
        return np.full(len(q), -1, np.int64)
    lo, hi = np.searchsorted(sorted_ix, [int(q[0]), int(q[-1]) + 1])
    part = sorted_ix[lo:hi]
    pos = np.searchsorted(part, q)
    hit = (pos < len(part)) & (part[np.minimum(pos, max(len(part) - 1, 0))] == q) if len(part) else np.zeros(len(q), bool)
    return np.where(hit, lo + pos, -1)


class Timing:
    """Fed each chunk of the first pass (all of the context's events, before any filter)."""

    def __init__(self, c: Ctx) -> None:
        self.ld = LaunchDurations(c.host, c.xjoin, enters=False)
        self.parts: list = []

    def feed(self, first: int, recs: np.ndarray) -> None:
        p = self.ld.feed(first, recs)
        if len(p):
            self.parts.append((p.enter_index, p.exit_index, p.start_ns, p.end_ns, recs["smid"][p.exit_index - first]))

    def finish(self, count: np.ndarray, first_ts: np.ndarray) -> tuple[Durations | None, BlockSlices | None]:
        """The launches' durations (their start: the earliest matched entry the first pass found) and the paired
        blocks; (None, None) when the context holds no block exit."""
        if not self.ld.n_exit:
            return None, None
        start = np.where(count > 0, first_ts.astype(np.int64), _I64.max)
        dur = self.ld.finish(start_ns=start)
        if not self.parts:
            return dur, None
        en, ex, st, end, sm = (np.concatenate(x) for x in zip(*self.parts))
        o = np.argsort(en, kind="stable")
        return dur, BlockSlices(enter_index=en[o], start_ns=st[o], end_ns=end[o], smid=sm[o].astype(np.int64),
                                exit_index=np.sort(ex))
