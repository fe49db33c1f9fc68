"""A context's first pass at the join's level: per chunk of device events, the launch-table row of each run (the
exact join, reconcile's matches or the join probe's runs), the filters, the matched blocks per row (count, earliest
and latest entry) and the durations' feed, all in one walk. The emitters hand over the chunks and read what it
gives: per chunk a :class:`Joined` (what they count besides: per SM, per ms, flow ends, block lanes), at the end a
:class:`Launches`.

    >>> cp = ContextPass(chunks, again, table, xjoin, keep=Keep())   # doctest: +SKIP
    >>> for j in cp: ...                                          # doctest: +SKIP
    >>> rows = cp.finish()                                        # doctest: +SKIP
    >>> rows.count, rows.first_ts, rows.durations                 # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvconv.format import layout
from kvconv.join.durations import Durations, LaunchDurations, Pairs
from kvconv.join.exact import ExactJoin, load_joined
from kvconv.join.launches import GRAPH_NODE, LaunchTable
from kvconv.join.runs import expand_runs, runs_of
from kvconv.memory import release_heap

_EVF = layout.ENUMS["event_flags"]
_BLOCK_ENTER = layout.ENUMS["event_kind"]["block_enter"]
_I64 = np.iinfo(np.int64)
_U64 = np.iinfo(np.uint64)


@dataclass(frozen=True)
class Keep:
    """The filters, as the join applies them: device events from ``window[0]`` to ``window[1]`` (device ns), events
    and host rows of graph replays ``replays`` (first, last); ``host_window``: the window on the host clock, for host
    rows no kept event matched (None: the context has no clock to say)."""

    window: tuple[int, int] | None = None
    replays: tuple[int, int] | None = None
    host_window: tuple[int, int] | None = None
    windowed: bool = False  # a window is asked for (``window`` is None when the context has no event to start it)

    @property
    def filtered(self) -> bool:
        return self.windowed or self.replays is not None


def keep_mask(recs: np.ndarray, hid: np.ndarray, t: LaunchTable, keep: Keep) -> np.ndarray | None:
    """Filter mask of a chunk (``hid``: each event's launch-table row, -1 none); None: keep all."""
    mask = None
    if keep.window is not None:
        ts = recs["globaltimer"]
        mask = (ts >= np.uint64(max(keep.window[0], 0))) & (ts <= np.uint64(max(keep.window[1], 0)))
    if keep.replays is not None:
        a, b = keep.replays
        ok_h = (t.kind == GRAPH_NODE) & (t.launch_id >= a) & (t.launch_id <= b)
        k2 = (hid >= 0) & ok_h[np.maximum(hid, 0)]
        mask = k2 if mask is None else mask & k2
    return mask


def kept_rows(t: LaunchTable, count: np.ndarray, keep: Keep) -> np.ndarray:
    """Host rows the filters keep: in the replays, and for a window matched inside it or (unmatched) launched inside
    it on the host clock."""
    kept = np.ones(t.n, bool)
    if keep.replays is not None:
        a, b = keep.replays
        kept = (t.kind == GRAPH_NODE) & (t.launch_id >= a) & (t.launch_id <= b)
    if keep.windowed:
        in_win = count > 0
        if keep.host_window is not None:
            lo, hi = keep.host_window
            hn = t.host_ns.astype(np.int64)
            in_win = in_win | ((count == 0) & (hn >= lo) & (hn <= hi))
        kept &= in_win
    return kept


def runs_by_kind(first: int, n: int, *, hid: np.ndarray | None, runs: dict | None, xjoin: ExactJoin | None) -> bool:
    """Whether :func:`chunk_rows` gives the chunk's runs of the exact join (:func:`kvconv.join.runs.event_runs`:
    runs of one (gridid, tag, kind, flags)), whose first events' kinds are then every event's."""
    if hid is not None or not n:
        return False
    cached = runs.get(first) if runs is not None else None
    return (cached is not None and cached[0] == n) or xjoin is not None


def chunk_rows(first: int, recs: np.ndarray, *, hid: np.ndarray | None, runs: dict | None,
               xjoin: ExactJoin | None) -> tuple[np.ndarray, np.ndarray]:
    """The join of a chunk as runs: ``(starts, host row of each run)`` (-1: unmatched), from reconcile's matches
    (``hid``, per event), the join probe's runs (``runs``) or the exact join."""
    n = len(recs)
    if hid is not None:
        return runs_of(hid[first : first + n])
    cached = runs.get(first) if runs is not None else None
    if cached is not None and cached[0] == n:
        return cached[1], cached[2]
    if xjoin is None or not n:
        return np.zeros(min(n, 1), np.int64), np.full(min(n, 1), -1, np.int64)
    return xjoin.runs(recs)


RUNS_CACHE = 1 << 22  # runs kept from the join probe for the first pass (beyond: looked up again)


def probe(chunks, xjoin: ExactJoin) -> tuple[dict | None, int]:
    """The exact join over a context's chunks: its runs (first index -> (events, run starts, host row per run), up
    to RUNS_CACHE) and the events it matched when its matches are reconcile's, else ``(None, 0)``: some event
    carries a gridid (else reconcile joins in order) and every block-enter event carrying one found its host record
    (else reconcile explains and attributes them)."""
    runs: dict = {}
    matched = kept = 0
    any_gid = False
    for first, recs in chunks:
        starts, rhid = xjoin.runs(recs)
        hk, hf = recs["kind"][starts], recs["flags"][starts]
        gid = (hk == _BLOCK_ENTER) & ((hf & _EVF["has_gridid"]) != 0)
        any_gid = any_gid or bool(gid.any())
        if bool((gid & (rhid < 0)).any()):
            return None, 0
        matched += int((rhid >= 0).sum())
        kept += len(starts)
        if kept <= RUNS_CACHE:
            runs[first] = (len(recs), starts, rhid)
    return (runs, matched) if any_gid else (None, 0)


class Watermarks:
    """A lower bound of the %globaltimer of every event from a device index on (one read of the timestamps of
    ``chunks``: ``(first index, records)``)."""

    def __init__(self, chunks) -> None:
        starts, mins = [], []
        for first, recs in chunks:
            if len(recs):
                starts.append(first)
                mins.append(int(recs["globaltimer"].min()))
        self.starts = np.array(starts, np.int64)
        m = np.array(mins, np.uint64).astype(np.int64)
        self.suffix = np.minimum.accumulate(m[::-1])[::-1] if len(m) else m

    def at(self, index: int) -> int:
        k = max(int(np.searchsorted(self.starts, index, "right")) - 1, 0)
        return int(self.suffix[k]) if k < len(self.suffix) else int(_I64.max)


@dataclass(frozen=True)
class RowRuns:
    """A chunk's matched runs: the host row of each, its events, where it starts in the chunk, and the events of its
    row before it (earlier chunks and earlier runs of this one; ``None`` unless asked for)."""

    rows: np.ndarray
    lens: np.ndarray
    at: np.ndarray
    base: np.ndarray | None


@dataclass(frozen=True)
class Paired:
    """A chunk's paired blocks (from the first exit of the context on): the pairs, the SM of each, the entries still
    waiting for their exit after it (smid, entry time; their device indices), and the lower bounds of later events'
    times (read at the first exit)."""

    pairs: Pairs
    smid: np.ndarray
    waiting: tuple[np.ndarray, np.ndarray]
    waiting_index: np.ndarray
    marks: Watermarks


@dataclass(frozen=True)
class Joined:
    """One chunk of the pass: its events kept by the filters and their times (u8), the device index of each when a
    filter dropped some (else ``first`` + position), its matched runs, and its paired blocks; ``end``: the device
    index after the chunk (its events before any filter)."""

    first: int
    end: int
    recs: np.ndarray
    ts: np.ndarray
    dev_index: np.ndarray | None
    runs: RowRuns | None
    paired: Paired | None


@dataclass(frozen=True)
class Launches:
    """Per launch-table row, what the pass found: matched device events kept, earliest and latest entry (device ns,
    u8), whether the filters keep the row; the durations (None: the context has no block exit); the events kept."""

    count: np.ndarray
    first_ts: np.ndarray
    last_ts: np.ndarray
    kept_hosts: np.ndarray
    durations: Durations | None
    kept: int


class ContextPass:
    """A context's first walk over its device events (``chunks``: ``(first index, records)``), joined to its launch
    table; ``again``: a fresh walk of the same chunks, read once at the first block exit (:class:`Watermarks`).
    ``table`` None: the table and the exact join are loaded here (``d``, ``ctx``; ``drop``: columns not read) and
    let go at :meth:`finish`. ``hid`` / ``runs``: reconcile's matches, the join probe's runs; ``bases``: each run's
    :attr:`RowRuns.base` (the flow ends need it); ``progress``: called with each chunk's events."""

    def __init__(self, chunks, again, table: LaunchTable | None, xjoin: ExactJoin | None, *, keep: Keep,
                 hid: np.ndarray | None = None, runs: dict | None = None, bases: bool = False, progress=None,
                 d=None, ctx: int = 0, drop: tuple = ()) -> None:
        self.loaded = table is None
        if self.loaded:
            table, xjoin = load_joined(d, ctx, drop=drop)
        self.chunks, self.again, self.t, self.xj, self.keep = chunks, again, table, xjoin, keep
        self.marks: Watermarks | None = None
        self.hid, self.runs, self.bases, self.progress = hid, runs, bases, progress
        self.n = table.n
        self.count = np.zeros(table.n, np.int64)
        self.first = np.full(table.n, _U64.max, np.uint64)
        self.last = np.zeros(table.n, np.uint64)
        self.ld = LaunchDurations(table, xjoin, enters=False)
        self.kept = 0

    def __iter__(self):
        for first_i, recs in self.chunks:
            if self.progress is not None:
                self.progress(len(recs))
            if not len(recs):
                continue
            yield self._chunk(first_i, recs)

    def _chunk(self, first_i: int, recs: np.ndarray) -> Joined:
        starts, rhid = chunk_rows(first_i, recs, hid=self.hid, runs=self.runs, xjoin=self.xj)
        # runs of one kind each: their first events say whether the chunk is block entries only (no pass over its
        # kinds for the durations)
        enters = runs_by_kind(first_i, len(recs), hid=self.hid, runs=self.runs, xjoin=self.xj) \
            and bool(np.all(recs["kind"][starts] == _BLOCK_ENTER))
        p = self.ld.feed(first_i, recs, enters_only=enters)
        pairer = self.ld.pairer
        paired = None
        if pairer.pending is not None:
            if self.marks is None:  # the first exit: blocks will be drawn as slices
                self.marks = Watermarks(self.again())
            paired = Paired(pairs=p, smid=recs["smid"][p.exit_index - first_i], waiting=pairer.waiting(),
                            waiting_index=pairer.pending["index"], marks=self.marks)
        end = first_i + len(recs)
        dev_index = None
        if self.keep.filtered:
            hid = expand_runs(starts, rhid, len(recs))
            mask = keep_mask(recs, hid, self.t, self.keep)
            if mask is not None:
                idx = np.flatnonzero(mask)
                recs, hid = recs[idx], hid[idx]
                dev_index = first_i + idx
                starts, rhid = runs_of(hid)
        tsi = np.ascontiguousarray(recs["globaltimer"], dtype=np.uint64)
        runs = self._add_runs(starts, rhid, tsi) if len(tsi) else None
        self.kept += len(tsi)
        return Joined(first=first_i, end=end, recs=recs, ts=tsi, dev_index=dev_index, runs=runs, paired=paired)

    def _add_runs(self, starts, rhid, tsi) -> RowRuns | None:
        """Fold a chunk's runs (one host row each) into the per-row count, first and last entry."""
        m = rhid >= 0
        if not m.any():
            return None
        count, first, last = self.count, self.first, self.last
        rl = np.diff(np.append(starts, len(tsi)))
        hm, rlm, sm_ = rhid[m], rl[m], starts[m]
        base = _run_bases(hm, rlm, count) if self.bases else None
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
        return RowRuns(rows=hm, lens=rlm, at=sm_, base=base)

    def finish(self) -> Launches:
        """What the pass found per launch-table row; a table loaded here is let go."""
        durations = None
        if self.ld.n_exit:
            start = np.where(self.count > 0, self.first.astype(np.int64), _I64.max)
            durations = self.ld.finish(start_ns=start)
        out = Launches(count=self.count, first_ts=self.first, last_ts=self.last,
                       kept_hosts=kept_rows(self.t, self.count, self.keep), durations=durations, kept=self.kept)
        if self.loaded:
            self.t = self.xj = self.ld = None
            release_heap()  # numpy's freed arrays in glibc's heap: gone from the resident set before the next context
        return out


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
