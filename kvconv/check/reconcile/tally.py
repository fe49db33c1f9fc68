"""Tally stage: what the device events joined to each launch add up to, accumulated chunk by chunk in fixed-size
state (per launch-table row, plus a few per-key dicts), whatever the number of events.

    >>> b = TallyBuilder(table)                                       # doctest: +SKIP
    >>> b.add_matched(h, x, y, z, t, dev_index)                      # per chunk: events matched to rows h
    >>> b.add_loose(kind, join, exec_, replay, ordinal, t)            # per chunk: events not matched to a row
    >>> tally = b.finish()

Per row: events matched, those inside the grid, outside it, repeated blocks (a block seen before in sequence order:
a bitmap over the launch's first block slot plus the linear blockIdx), the earliest and latest entry; the first
event outside the grid and the first repeated one (for the findings). Per context: events per host kind, matched,
attributed to a replay or window only, unmatched, and the graph-node events not matched to a row reduced per
(graph exec, replay, node ordinal) for the device timing (which only takes minima and maxima).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np

from kvconv.join.launches import EAGER, GRAPH_NODE, LaunchTable

_I64 = np.iinfo(np.int64)
_U64_MAX = np.iinfo(np.uint64).max
BITMAP_MAX_BITS = 1 << 31  # 256 MiB of bitmap at most; beyond (damaged grids), repeats are found by a sort at the end


@dataclass(frozen=True)
class Tally:
    recorded: np.ndarray  # per row: events matched
    distinct: np.ndarray  # per row: distinct in-grid blocks among them
    outside: np.ndarray
    dupblk: np.ndarray
    tmin_u: np.ndarray | None  # u8 earliest matched entry where one lies at or beyond 2^63 ns (else None: tmin's)
    tmin: np.ndarray  # i8 earliest / latest matched entry as signed ns (the device timing's domain)
    tmax: np.ndarray
    first_out: dict  # row -> (device index, x, y, z) of its first event outside the grid
    first_dup: dict  # row -> the same, of its first repeated block
    n: int  # block-enter events
    matched: int
    replay_only: int  # not matched to a row, attributed to a replay or window (join != 0)
    unmatched: int
    graph_events: int  # events whose host kind is a graph node (matched or not)
    eager_events: int
    loose: dict  # (exec, replay, ordinal) -> [events, tmin, tmax]: graph-node events not matched to a row

    @property
    def first_ns(self) -> np.ndarray:
        """u8 earliest matched entry per row (0 if none), built when asked (the launches table): not kept."""
        tmin_u = self.tmin_u if self.tmin_u is not None else self.tmin.view(np.uint64)
        return np.where(self.recorded > 0, tmin_u, 0).astype(np.uint64)


class TallyBuilder:
    def __init__(self, t: LaunchTable, *, max_events: int | None = None) -> None:
        """``max_events``: the events that can be matched (a context's device events): counts per row as i4 below
        2^31 of them."""
        nH = t.n
        self.t = t
        # per row: 20 bytes while the events go by (+4 of bitmap base). Events outside the grid and repeated blocks
        # are rare: their counts are allocated at the first one (those inside the grid are the recorded less the
        # outside ones); the unsigned earliest entry is the signed one until an entry at or beyond 2^63 ns comes
        # (then kept apart)
        self.count_dtype = np.int32 if max_events is not None and max_events < (1 << 31) else np.int64
        self.recorded = np.zeros(nH, self.count_dtype)
        self.outside: np.ndarray | None = None
        self.repeats: np.ndarray | None = None
        self.tmin_u: np.ndarray | None = None
        self.tmin = np.full(nH, _I64.max, np.int64)
        self.tmax = np.full(nH, _I64.min, np.int64)
        self.first_out: dict = {}
        self.first_dup: dict = {}
        self.n = self.matched = self.replay_only = self.unmatched = self.graph = self.eager = 0
        self.loose: dict = {}
        grid = np.maximum(t.grid, 0)
        true = t.gx.astype(np.float64)
        true *= t.gy
        true *= t.gz
        # keys are the launch's first block slot plus the linear blockIdx: exact only where no grid overflowed
        total = float(grid.sum(dtype=np.float64)) if bool(np.all(true == grid)) else float("inf")
        del true
        self.base = None
        self.bits = None
        self.parts: list | None = None  # (h, lin, dev, x, y, z) of in-grid events when there is no bitmap
        if total < BITMAP_MAX_BITS:
            self.base = np.cumsum(grid)
            self.base -= grid  # each launch's first block slot: below 2^31 (BITMAP_MAX_BITS), so i4
            self.base = self.base.astype(np.int32)
            self.bits = np.zeros(int(total) // 64 + 2, np.uint64)
            self.nbits = int(total)
        else:
            self.parts = []

    def fork(self) -> TallyBuilder:
        """A builder that goes on from this one's state on its own (the ordered join's second tally, made at the
        first event the %gridid cross-check withdraws, so that dumps without one hold a single tally)."""
        c = copy.copy(self)
        for name in ("recorded", "outside", "repeats", "tmin_u", "tmin", "tmax", "bits"):
            v = getattr(self, name)
            setattr(c, name, None if v is None else v.copy())
        c.first_out, c.first_dup = dict(self.first_out), dict(self.first_dup)
        c.loose = {k: list(v) for k, v in self.loose.items()}
        c.parts = list(self.parts) if self.parts is not None else None
        return c

    # -- matched events ------------------------------------------------------------------------------------------

    def add_matched(self, h, x, y, z, tt, dev) -> None:
        """Events (sequence order) matched to launch-table rows ``h``; blockIdx, %globaltimer, device index."""
        n = len(h)
        if not n:
            return
        st = np.r_[0, np.flatnonzero(h[1:] != h[:-1]) + 1]  # runs of one launch
        self.add_runs(h[st], st, n, x, y, z, tt, dev)

    def add_runs(self, rows, starts, n: int, x, y, z, tt, dev, *, lens=None, xyz_max: dict | None = None) -> None:
        """Events (sequence order) in runs: run ``i`` (from ``starts[i]``) matched to launch-table row ``rows[i]``.
        The per-event work is a few passes: 1-D grids whose blocks are all inside and all new (the usual case) need
        no sort; anything else goes the way of :meth:`add_matched`. ``lens`` (events per run) and ``xyz_max`` (per
        run, the largest block_x / block_y / block_z): when the caller has them (:class:`kvconv.join.runs.Runs`)."""
        if not n:
            return
        if lens is None:
            lens = np.diff(starts, append=n)
        self._per_run(rows, starts, n, tt, lens)
        t = self.t
        flat = (not xyz_max["block_y"].any() and not xyz_max["block_z"].any()) if xyz_max is not None else (
            not y.any() and not z.any())
        if self.bits is not None and flat:
            xmax = xyz_max["block_x"] if xyz_max is not None else np.maximum.reduceat(x, starts)
            if bool(np.all((xmax < t.gx[rows]) & (t.gy[rows] > 0) & (t.gz[rows] > 0))):
                if self._bitmap_runs(rows, lens, n, x):
                    return
                h = np.repeat(rows, lens)
                key = self.base[h] + x.astype(np.int64)
                self._repeat_events(h, key, dev, x.astype(np.uint64), y.astype(np.uint64), z.astype(np.uint64))
                self._set_bits(key)
                return
        self._blocks(np.repeat(rows, lens), x, y, z, dev)

    def _bitmap_runs(self, rows, lens, n: int, x) -> bool:
        """Set the bits of in-grid blocks of 1-D grids; False (nothing set) when one repeats a block seen before
        or in this chunk, or when the chunk's keys spread too far for a dense pass."""
        b0 = self.base[rows]
        lo = int(b0.min()) & ~63
        span = int((b0 + np.maximum(self.t.grid[rows], 0)).max()) - lo
        if span > 16 * n + (1 << 16):
            key = np.repeat(b0.astype(np.int64), lens)
            key += x
            return self._bitmap_sorted(key)
        key = np.repeat((b0 - lo).astype(np.int64), lens)
        key += x
        present = np.zeros(-(-span // 64) * 64, bool)
        present[key] = True
        words = np.packbits(present, bitorder="little").view("<u8")
        cur = self.bits[lo >> 6 : (lo >> 6) + len(words)]
        if int(np.count_nonzero(present)) < n or bool((cur & words).any()):
            return False
        cur |= words
        return True

    def _bitmap_sorted(self, key) -> bool:
        srt = key if (len(key) < 2 or bool(np.all(key[1:] > key[:-1]))) else np.sort(key)
        if len(srt) > 1 and not bool(np.all(srt[1:] != srt[:-1])):
            return False
        w, b = srt >> 6, np.left_shift(np.uint64(1), (srt & 63).astype(np.uint64))
        if bool(((self.bits[w] & b) != 0).any()):
            return False
        self._set_bits(srt)
        return True

    def _set_bits(self, key) -> None:
        srt = key if (len(key) < 2 or bool(np.all(key[1:] >= key[:-1]))) else np.sort(key)
        w, b = srt >> 6, np.left_shift(np.uint64(1), (srt & 63).astype(np.uint64))
        ws = np.r_[0, np.flatnonzero(w[1:] != w[:-1]) + 1] if len(w) else np.zeros(0, np.int64)
        if len(ws):
            self.bits[w[ws]] |= np.bitwise_or.reduceat(b, ws)

    def _per_run(self, hr, st, n: int, tt, lens) -> None:
        """Counts and earliest / latest entry per launch, from the runs (``hr``: the run's row, ``st``: its start)."""
        t = self.t
        self.matched += n
        ts = tt.view(np.int64) if tt.dtype == np.uint64 else tt.astype(np.int64)
        lo = np.minimum.reduceat(ts, st)
        if self.tmin_u is None and (tt.dtype != np.uint64 or bool((lo < 0).any())):
            self.tmin_u = np.where(self.recorded > 0, self.tmin.view(np.uint64), _U64_MAX).astype(np.uint64)
        lens = lens.astype(self.count_dtype)  # ufunc.at casting is ~15x slower
        if len(hr) < 2 or bool(np.all(hr[1:] > hr[:-1])):  # each launch once (in row order): a plain gather
            self.recorded[hr] += lens
        else:
            np.add.at(self.recorded, hr, lens)
        if self.tmin_u is not None:
            np.minimum.at(self.tmin_u, hr, np.minimum.reduceat(tt, st))
        np.minimum.at(self.tmin, hr, lo)
        np.maximum.at(self.tmax, hr, np.maximum.reduceat(ts, st))
        kh = t.kind[hr]
        self.graph += int(lens[kh == GRAPH_NODE].sum())
        self.eager += int(lens[kh == EAGER].sum())

    def _blocks(self, h, x, y, z, dev) -> None:
        """In-grid check and repeated blocks, per event (any grid shape)."""
        t = self.t
        gx, gy, gz = t.gx[h], t.gy[h], t.gz[h]
        x, y, z = x.astype(np.uint64), y.astype(np.uint64), z.astype(np.uint64)
        inside = (x < gx) & (y < gy) & (z < gz)
        with np.errstate(over="ignore"):
            lin = x + gx * (y + gy * z)
        if not inside.all():
            out = np.flatnonzero(~inside)
            if self.outside is None:
                self.outside = np.zeros(len(self.recorded), self.count_dtype)
            np.add.at(self.outside, h[out], 1)
            self._firsts(self.first_out, h[out], out, dev, x, y, z)
            h, lin, dev, x, y, z = h[inside], lin[inside], dev[inside], x[inside], y[inside], z[inside]
        if self.bits is None:
            self.parts.append((h, lin, dev, x, y, z))
            return
        self._bitmap(h, lin, dev, x, y, z)

    def _bitmap(self, h, lin, dev, x, y, z) -> None:
        key = self.base[h] + lin.astype(np.int64)
        srt = key if (len(key) < 2 or bool(np.all(key[1:] > key[:-1]))) else np.sort(key)
        first = np.r_[True, srt[1:] != srt[:-1]] if len(srt) else np.zeros(0, bool)
        uk = srt[first]
        w, b = uk >> 6, np.left_shift(np.uint64(1), (uk & 63).astype(np.uint64))
        seen = (self.bits[w] & b) != 0
        if not first.all() or seen.any():  # the rare path: which events repeat a block, in sequence order
            self._repeat_events(h, key, dev, x, y, z)
        ws = np.r_[0, np.flatnonzero(w[1:] != w[:-1]) + 1] if len(w) else np.zeros(0, np.int64)
        if len(ws):
            self.bits[w[ws]] |= np.bitwise_or.reduceat(b, ws)

    def _repeat_events(self, h, key, dev, x, y, z) -> None:
        o = np.lexsort((np.arange(len(key)), key))
        ks = key[o]
        dupe = np.zeros(len(key), bool)
        dupe[o] = np.r_[False, ks[1:] == ks[:-1]]
        w, b = key >> 6, np.left_shift(np.uint64(1), (key & 63).astype(np.uint64))
        dupe |= (self.bits[w] & b) != 0
        self._add_repeats(h, np.flatnonzero(dupe), dev, x, y, z)

    def _add_repeats(self, h, d, dev, x, y, z) -> None:
        if not len(d):
            return
        if self.repeats is None:
            self.repeats = np.zeros(len(self.recorded), self.count_dtype)
        np.add.at(self.repeats, h[d], 1)
        self._firsts(self.first_dup, h[d], d, dev, x, y, z)

    @staticmethod
    def _firsts(out: dict, hs, sel, dev, x, y, z) -> None:
        u, fi = np.unique(hs, return_index=True)
        for hh, f in zip(u.tolist(), fi.tolist()):
            if hh not in out:
                i = sel[f]
                out[hh] = (int(dev[i]), int(x[i]), int(y[i]), int(z[i]))

    # -- events not matched to a row -----------------------------------------------------------------------------

    def add_loose(self, kind, join, exec_, replay, ordinal, tt) -> None:
        """Events not matched to a row: their host kind, join, graph exec, replay and node ordinal (when the join
        attributed them to a replay or window), %globaltimer."""
        n = len(kind)
        if not n:
            return
        att = join != 0
        self.replay_only += int(att.sum())
        self.unmatched += n - int(att.sum())
        g = kind == GRAPH_NODE
        self.eager += int((kind == EAGER).sum())
        ng = int(g.sum())
        if not ng:
            return
        self.graph += ng
        ts = tt[g].astype(np.int64)
        k = np.stack([exec_[g].astype(np.uint64), replay[g].astype(np.uint64),
                      ordinal[g].astype(np.int64).view(np.uint64)], axis=1)
        uk, inv = np.unique(k, axis=0, return_inverse=True)
        inv = inv.reshape(-1)
        cnt = np.bincount(inv, minlength=len(uk))
        lo, hi = np.full(len(uk), _I64.max), np.full(len(uk), _I64.min)
        np.minimum.at(lo, inv, ts)
        np.maximum.at(hi, inv, ts)
        for j, row in enumerate(uk.tolist()):
            self.add_loose_group(row[0], row[1], int(np.uint64(row[2]).view(np.int64)), int(cnt[j]), int(lo[j]),
                                 int(hi[j]), counted=True)

    def add_loose_group(self, exec_: int, replay: int, ordinal: int, count: int, tmin: int, tmax: int, *,
                        counted: bool = False) -> None:
        """``count`` graph-node events of one (exec, replay, ordinal) attributed to a replay only; ``counted``:
        already counted by :meth:`add_loose`, else moved here from the unmatched ones."""
        if not counted:
            self.unmatched -= count
            self.replay_only += count
            self.graph += count
        v = self.loose.setdefault((int(exec_), int(replay), int(ordinal)), [0, _I64.max, _I64.min])
        v[0] += count
        v[1] = min(v[1], tmin)
        v[2] = max(v[2], tmax)

    def add_unmatched(self, n: int) -> None:
        self.unmatched += n

    # -- the result -------------------------------------------------------------------------------------------------

    def end_of_events(self) -> None:
        """No more events: the repeats are known and the bitmap's memory (a bit per expected block, 4 bytes per
        row) goes now (the loose groups may still come)."""
        if self.parts:
            self._repeats_by_sort()
        self.base = self.bits = None

    def finish(self, n_block_enter: int) -> Tally:
        self.end_of_events()  # the repeat bitmap is done with: its memory goes before the report stages
        rec = self.recorded
        # never-written zeros cost no memory: the counts of launches without events outside the grid or repeats
        outside = self.outside if self.outside is not None else np.zeros(len(rec), rec.dtype)
        repeats = self.repeats if self.repeats is not None else np.zeros(len(rec), rec.dtype)
        distinct = rec - outside
        distinct -= repeats
        dupblk = repeats  # distinct was computed apart: the repeat counts themselves, not a copy
        return Tally(recorded=rec, distinct=distinct, outside=outside, dupblk=dupblk,
                     tmin_u=self.tmin_u, tmin=self.tmin, tmax=self.tmax,
                     first_out=self.first_out, first_dup=self.first_dup, n=n_block_enter, matched=self.matched,
                     replay_only=self.replay_only, unmatched=self.unmatched, graph_events=self.graph,
                     eager_events=self.eager, loose=self.loose)

    def _repeats_by_sort(self) -> None:
        h, lin, dev, x, y, z = (np.concatenate([p[i] for p in self.parts]) for i in range(6))
        self.parts = []
        key_o = np.lexsort((np.arange(len(h)), lin, h))
        hs, ls = h[key_o], lin[key_o]
        dupe = np.zeros(len(h), bool)
        dupe[key_o] = np.r_[False, (hs[1:] == hs[:-1]) & (ls[1:] == ls[:-1])]
        self._add_repeats(h, np.flatnonzero(dupe), dev, x, y, z)


def tally_match(t: LaunchTable, ev, m) -> Tally:
    """The tally of a whole in-memory join (the ordered join; the exact join of events out of sequence order)."""
    b = TallyBuilder(t, max_events=ev.n)
    hm = m.host >= 0
    if hm.all():
        b.add_matched(m.host, ev.x, ev.y, ev.z, ev.t, ev.idx)
    else:
        s = np.flatnonzero(hm)
        b.add_matched(m.host[s], ev.x[s], ev.y[s], ev.z[s], ev.t[s], ev.idx[s])
        s = np.flatnonzero(~hm)
        b.add_loose(m.kind[s], m.join[s], m.exec[s], m.replay[s], m.ordinal[s], ev.t[s])
    return b.finish(ev.n)
