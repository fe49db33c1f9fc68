"""One pass over a context's device events, chunk by chunk, in fixed-size state: the exact join of each chunk (one
lookup per run of one launch's blocks), the tally per launch (:mod:`kvconv.check.reconcile.tally`), the unmatched events
per (gridid, tag) key, and, when asked, the matches table filled as the chunks go by.

    >>> s = ContextStream(table, ExactJoin(table), n_events=len(ev), tables=False)   # doctest: +SKIP
    >>> for base, recs in chunks: s.feed(base, recs)                                  # doctest: +SKIP
    >>> s.in_order, s.any_gid                                                         # doctest: +SKIP

The pass holds only while the events' sequence order is their order in the dump (a tracer writes each event at the
slot its sequence reserved): events out of that order leave the pass unused (``usable``) and the context is
reconciled from memory instead. For the ordered join (no gridid, or ``--join ordered``) the pass counts the entries
and checks their order; the join is a second pass (:mod:`kvconv.check.reconcile.window`).
"""

from __future__ import annotations

import numpy as np

from kvconv.check.reconcile.report import MATCH_DTYPE
from kvconv.check.reconcile.tally import TallyBuilder
from kvconv.format import layout
from kvconv.join.events import BLOCK_ENTER
from kvconv.join.exact import JOIN_EXACT, ExactJoin, Unmatched, unmatched_keys
from kvconv.join.launches import GRAPH_NODE, LaunchTable
from kvconv.join.runs import Runs, chunk_runs

_EVF = layout.ENUMS["event_flags"]
_GID, _TAG = np.uint8(_EVF["has_gridid"]), np.uint8(_EVF["has_tag"])


class ContextStream:
    def __init__(self, t: LaunchTable, xj: ExactJoin | None, *, ctx: int, n_events: int, tables: bool) -> None:
        self.t, self.xj = t, xj
        self.b = TallyBuilder(t, max_events=n_events)
        self.n_all = self.n = self.lacking = 0
        self.first_idx = self.last_idx = -1
        self.last_seq: int | None = None
        self.in_order = True
        self.counting = False
        self.any_gid = False
        self.parts: list[Unmatched] = []
        self.un_events: list = []  # tables: (device indices, gridid, tag) of unmatched events carrying a gridid
        self.matches = None
        self.dur = None  # durations.LaunchDurations: block exits, per launch (Reconciler.stream sets it)
        if tables:
            self.matches = np.empty(n_events, MATCH_DTYPE)
            self.matches["context_id"] = ctx
            self.matches["device_index"] = np.arange(n_events)
            self.replay, self.ordinal = t.replay, t.node_ordinal

    def feed(self, base: int, recs: np.ndarray, kind: np.ndarray | None = None, runs: Runs | None = None) -> None:
        """The next chunk of the context's device events (``base``: the index of ``recs[0]``; ``kind``: its kind
        column and ``runs`` its runs (:func:`kvconv.join.runs.chunk_runs`), when the caller found them already)."""
        self.n_all += len(recs)
        if kind is None and (self.dur is not None or self.in_order):
            kind = recs["kind"]
        be = None
        if runs is not None:
            all_enter = runs.all_enter
        elif kind is not None:
            be = kind == BLOCK_ENTER
            all_enter = bool(be.all())
        else:
            all_enter = False
        if self.dur is not None:  # exits and block pairs: order-independent, kept when the pass gives up
            self.dur.feed(base, recs, kind, enters_only=all_enter)
        if not self.in_order or not len(recs):
            return
        if all_enter:
            sub, idx = recs, np.arange(base, base + len(recs), dtype=np.int64)
        else:
            bi = np.flatnonzero(be if be is not None else kind == BLOCK_ENTER)
            sub, idx = recs[bi], base + bi.astype(np.int64)
            runs = None  # the chunk's runs span every kind: the entries' own are found below
        if self.matches is not None:
            self._defaults(base, len(recs), all_enter)
        if not len(sub):
            return
        if runs is None and not self.counting:
            runs = chunk_runs(sub)
        seq = sub["sequence"]
        # sequences rising by 1 (found with the runs) are in order: not compared again
        if (self.last_seq is not None and int(seq[0]) < self.last_seq) or (
                not (runs is not None and runs.consecutive) and bool(np.any(seq[1:] < seq[:-1]))):
            self._give_up()
            return
        self.last_seq = int(seq[-1])
        if self.first_idx < 0:
            self.first_idx = int(idx[0])
        self.last_idx = int(idx[-1])
        self.n += len(sub)
        if self.counting:  # the ordered join's first pass: order and counts (kvconv.check.reconcile.window)
            self.any_gid = self.any_gid or bool(np.any(sub["flags"] & _GID))
            return
        self._join(sub, idx, runs)

    def _join(self, sub, idx, runs: Runs) -> None:
        """The exact join of block entries in sequence order, one look-up per run of one launch's blocks."""
        hg_run = (runs.flags & _GID) != 0
        n_gid = int(runs.lens[hg_run].sum())
        self.any_gid = self.any_gid or n_gid > 0
        self.lacking += len(sub) - n_gid
        starts, lens = runs.starts, runs.lens
        if self.xj is not None and n_gid:
            rows = self.xj.lookup(runs.gid, runs.tag, runs.flags, np.full(runs.n, BLOCK_ENTER, np.uint8))
        else:
            rows = np.full(runs.n, -1, np.int64)
        ok = rows >= 0
        x, tt = sub["block_x"], sub["globaltimer"]
        y, z = sub["block_y"], sub["block_z"]
        if self.matches is not None:
            self._fill(idx, rows, lens)
        if bool(ok.all()):
            self.b.add_runs(rows, starts, len(sub), x, y, z, tt, idx, lens=lens, xyz_max=runs.max)
            return
        sel = np.repeat(ok, lens)
        if ok.any():
            s = np.flatnonzero(sel)
            lk = lens[ok]
            self.b.add_runs(rows[ok], np.r_[0, np.cumsum(lk)[:-1]], len(s), x[s], y[s], z[s], tt[s], idx[s])
        self.b.add_unmatched(int(lens[~ok].sum()))
        un = np.flatnonzero(~sel & np.repeat(hg_run, lens))
        if len(un) and self.xj is not None:
            flags, gid, tag = sub["flags"], sub["gridid"], sub["tag"]
            ht = (flags[un] & _TAG) != 0
            self.parts.append(unmatched_keys(gid[un], tag[un], ht, idx[un], sub["kernel_slot"][un], tt[un])[0])
            if self.matches is not None:
                self.un_events.append((idx[un], gid[un].astype(np.uint64),
                                       np.where(ht, tag[un], 0).astype(np.uint64)))

    def _defaults(self, base: int, n: int, all_enter: bool) -> None:
        mt = self.matches[base : base + n]
        if not all_enter:
            mt["host_kind"], mt["host_index"], mt["replay"], mt["node_ordinal"], mt["join"] = 0, -1, 0, -1, 0

    def _fill(self, idx, rows, lens) -> None:
        t = self.t
        ok = rows >= 0
        r0 = np.maximum(rows, 0)
        mt = self.matches
        for name, col, none in (("host_kind", t.kind, 0), ("host_index", t.index, -1), ("replay", self.replay, 0),
                                ("node_ordinal", self.ordinal, -1)):
            vals = np.where(ok, col[r0], none) if t.n else np.full(len(rows), none)
            mt[name][idx] = np.repeat(vals.astype(mt.dtype[name], copy=False), lens)
        mt["join"][idx] = np.repeat(np.where(ok, JOIN_EXACT, 0).astype(np.uint8), lens)

    def stop(self) -> None:
        self._give_up()

    def count_only(self) -> None:
        """The ordered join: this pass only checks the order and counts the entries; the join is a second pass."""
        self.counting = True
        self.b = None
        self.parts, self.un_events, self.matches = [], [], None

    def release(self) -> None:
        """The context is reconciled: its per-row state goes now, whoever still holds this stream (the caller's
        loop variable would otherwise keep one context's table alive while the next one's is built)."""
        self.t = self.xj = self.b = self.replay = self.ordinal = self.dur = None
        self.parts, self.un_events, self.matches = [], [], None

    def _give_up(self) -> None:
        self.in_order = False
        self.b = None
        self.parts, self.un_events, self.matches = [], [], None

    def usable(self, mode: str) -> bool:
        """The pass answers the context: events in sequence order and an exact join (or nothing to join)."""
        return self.in_order and (mode == "exact" or self.n == 0 or self.t.n == int(self.t.upload.sum()))

    def unmatched(self) -> Unmatched | None:
        return Unmatched.merge(self.parts) if self.parts else None

    def attribute(self, u: Unmatched, attributed: list) -> None:
        """Keys the exact join's explanation attributed to a replay (node known): tally and table."""
        for k, ex, r, ordn in attributed:
            self.b.add_loose_group(ex, r, ordn, int(u.count[k]), int(u.tmin[k]), int(u.tmax[k]))
        if self.matches is None or not attributed or not self.un_events:
            return
        idx, gid, tag = (np.concatenate([e[i] for e in self.un_events]) for i in range(3))
        for k, _ex, r, ordn in attributed:
            sel = idx[(gid == u.gid[k]) & (tag == u.tag[k])]
            mt = self.matches
            mt["host_kind"][sel], mt["replay"][sel], mt["join"][sel] = GRAPH_NODE, r, JOIN_EXACT
            mt["node_ordinal"][sel] = ordn
