"""Durations from block enter and block exit events (``kvconv record --events enter,exit``): the one computation
of a launch's device duration (its first block entry to its last block exit, %globaltimer ns) and of each block's
(its entry to its exit), chunk by chunk in memory bounded by the host records and the blocks in flight.

    >>> ld = LaunchDurations(table, ExactJoin(table))               # doctest: +SKIP
    >>> for base, recs in event_chunks(d, ctx): ld.feed(base, recs)  # doctest: +SKIP
    >>> dur = ld.finish()                                             # doctest: +SKIP
    >>> dur.duration_ns[dur.timed]                                    # per launch-table row
    >>> section(table, dur, names)["graph_execs"][0]["replays"][0]   # {"replay": 1, "kv_write_ns": ..., ...}

Or in one call, reading the events itself: ``launch_durations(d, ctx)``.

Launches: an exit is attributed to a launch-table row by the exact join (:class:`ExactJoin`: its gridid and tag are
its block's), so durations need events carrying %gridid; a row's start is its earliest attributed entry, its end its
latest attributed exit (min / max per row: order-independent, one ``ufunc.at`` per chunk).

Blocks (:class:`BlockPairer`): a block's exit is written by the thread that wrote its entry, after it, so in
sequence order each exit follows its entry. Events are keyed by (gridid, tag, kernel slot, SM, blockIdx) (gridid
and tag as 0 where their flag is clear) and within a key paired first-in first-out; an exit with no open entry of
its key is an orphan (its entry dropped). Entries still open at the end of a chunk wait for the next (the blocks in
flight). Until the first exit the latest chunks (``HOLD`` events: views into the dump, no copy) are only held back,
so an enter-only dump costs a comparison per chunk; the first exit opens the pairing from them.

Statistics across replays use ``np.median`` and the nearest-rank p99 (``method="inverted_cdf"``: an observed value).
Timestamps are taken as signed ns (a raw %globaltimer stays below 2^63 for 292 years of uptime).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from kvconv.format import layout
from kvconv.join.launches import EAGER, GRAPH_NODE, LaunchTable, kernel_short
from kvconv.join.notes import hexs

_EVK = layout.ENUMS["event_kind"]
_EVF = layout.ENUMS["event_flags"]
BLOCK_ENTER, BLOCK_EXIT = _EVK["block_enter"], _EVK["block_exit"]
_I64 = np.iinfo(np.int64)
HOLD = 1 << 20  # events held back before the first exit (pairing starts there): blocks in flight are far fewer
_KEYS = ("gridid", "tag", "kernel_slot", "smid", "block_x", "block_y", "block_z")  # a block, as its events name it


@dataclass(frozen=True)
class Pairs:
    """Blocks paired in one chunk (arrays aligned, one entry per block, in the order of their exits)."""

    enter_index: np.ndarray  # i8 device index of the entry (it may lie in an earlier chunk)
    exit_index: np.ndarray  # i8 device index of the exit
    start_ns: np.ndarray  # i8 %globaltimer of the entry
    end_ns: np.ndarray  # i8 %globaltimer of the exit
    gridid: np.ndarray  # u8 (0 without flags.has_gridid)
    tag: np.ndarray  # u8 (0 without flags.has_tag)
    flags: np.ndarray  # u1 the entry's event flags

    def __len__(self) -> int:
        return len(self.exit_index)


def _empty_pairs() -> Pairs:
    i8, u8 = np.zeros(0, np.int64), np.zeros(0, np.uint64)
    return Pairs(i8, i8, i8, i8, u8, u8, np.zeros(0, np.uint8))


def _columns(recs: np.ndarray, sel: np.ndarray, base: int) -> dict:
    """The pairing's columns of the events ``sel`` of a chunk (gridid and tag zeroed where not flagged)."""
    fl = recs["flags"][sel]
    return {"gridid": np.where((fl & _EVF["has_gridid"]) != 0, recs["gridid"][sel], 0).astype(np.uint64),
            "tag": np.where((fl & _EVF["has_tag"]) != 0, recs["tag"][sel], 0).astype(np.uint64),
            **{k: recs[k][sel] for k in _KEYS[2:]}, "flags": fl, "sequence": recs["sequence"][sel],
            "t": recs["globaltimer"][sel].astype(np.int64), "index": base + sel.astype(np.int64),
            "exit": recs["kind"][sel] == BLOCK_EXIT}


class BlockPairer:
    """Each block's entry paired with its exit, streaming: ``feed(base, recs)`` per chunk returns that chunk's
    :class:`Pairs`; ``open`` (entries waiting) and ``orphans`` (exits without an entry) at the end."""

    def __init__(self, *, hold: int = HOLD) -> None:
        self.pending: dict | None = None  # columns of the open entries (None: no exit seen yet)
        self.orphans = 0
        self.skipped = 0  # entries of chunks held back and let go before the first exit: never paired
        self.hold = hold
        self.held: deque = deque()  # (base, records) of the latest chunks before the first exit (views, no copy)
        self.held_n = 0
        self.held_enters: deque = deque()  # entries of each held chunk

    @property
    def open(self) -> int:
        return len(self.pending["t"]) if self.pending is not None else 0

    def waiting(self, exclude: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(smid, entry time) of the entries waiting for their exit (less ``exclude``: entries never paired)."""
        p = self.pending
        if p is None or not len(p["t"]):
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        if exclude is not None and len(exclude):
            k = ~np.isin(p["index"], exclude, assume_unique=True)
            return p["smid"][k], p["t"][k]
        return p["smid"], p["t"]

    def feed(self, base: int, recs: np.ndarray, kind: np.ndarray | None = None) -> Pairs:
        """``kind``: the chunk's kind column when the caller has it already (contiguous: one read of the records)."""
        kind = recs["kind"] if kind is None else kind
        if self.pending is None:
            if not bool((kind == BLOCK_EXIT).any()):
                self.hold_back(base, recs, int(np.count_nonzero(kind == BLOCK_ENTER)))
                return _empty_pairs()
            # the first exit: the entries held back open the pairing (their exits are in this chunk or later)
            self.pending = _columns(recs, np.zeros(0, np.int64), base)
            for b, r in self.held:
                self._open(b, r)
            self.held.clear()
            self.held_enters.clear()
        return self._open(base, recs, kind)

    def hold_back(self, base: int, recs: np.ndarray, enters: int) -> None:
        """A chunk without exits (``enters``: its block entries) while no exit has come yet: held back."""
        # entries counted now, while the chunk is read: a chunk let go later may have had its pages given back
        # (kvconv.format.dump.release_pages), and reading it then would fault the whole file back in
        self.held.append((base, recs))
        self.held_enters.append(enters)
        self.held_n += len(recs)
        while self.held_n - len(self.held[0][1]) >= self.hold:
            _, r = self.held.popleft()
            self.held_n -= len(r)
            self.skipped += self.held_enters.popleft()

    def _open(self, base: int, recs: np.ndarray, kind: np.ndarray | None = None) -> Pairs:
        kind = recs["kind"] if kind is None else kind
        cur = _columns(recs, np.flatnonzero((kind == BLOCK_EXIT) | (kind == BLOCK_ENTER)), base)
        c = {k: np.concatenate([self.pending[k], cur[k]]) for k in cur}
        return self._pair(c)

    def _pair(self, c: dict) -> Pairs:
        o = np.lexsort((c["sequence"],) + tuple(c[k] for k in reversed(_KEYS)))
        c = {k: v[o] for k, v in c.items()}
        n = len(o)
        new = np.zeros(n, bool)
        if n:
            new[0] = True
            for k in _KEYS:
                new[1:] |= c[k][1:] != c[k][:-1]
        grp = np.cumsum(new) - 1  # key group of each event, groups in key order, events in sequence order
        starts = np.flatnonzero(new)
        step = np.where(c["exit"], -1, 1).astype(np.int64)
        bal = np.cumsum(step)
        bal -= (bal - step)[starts][grp]  # open entries of the key after each event
        # an exit that takes the balance to a new low below 0 has no open entry: an orphan
        big = 2 * n + 2
        low = np.minimum.accumulate(bal - grp * big) + grp * big  # running minimum within the group
        prev = np.where(new, 0, np.r_[0, low[:-1]])
        orphan = c["exit"] & (bal < np.minimum(prev, 0))
        self.orphans += int(orphan.sum())
        keep = ~orphan
        g, isx = grp[keep], c["exit"][keep]
        pos = np.flatnonzero(keep)
        # first in, first out: the k-th entry of a key with the k-th (non-orphan) exit of that key
        o2 = np.lexsort((isx, g))  # stable: sequence order kept within (group, kind)
        g2, x2, p2 = g[o2], isx[o2], pos[o2]
        first = np.r_[True, (g2[1:] != g2[:-1]) | (x2[1:] != x2[:-1])] if len(g2) else np.zeros(0, bool)
        rank = np.arange(len(g2)) - np.maximum.accumulate(np.where(first, np.arange(len(g2)), 0))
        n_x = np.bincount(g2[x2], minlength=len(starts)) if len(g2) else np.zeros(len(starts), np.int64)
        ent = ~x2
        paired_ent = ent & (rank < n_x[g2])
        # entries by (group, rank) and exits by (group, rank) line up in the same order
        e_pos, x_pos = p2[paired_ent], p2[x2]
        waiting = p2[ent & ~paired_ent]
        self.pending = {k: v[waiting] for k, v in c.items()}
        return Pairs(enter_index=c["index"][e_pos], exit_index=c["index"][x_pos], start_ns=c["t"][e_pos],
                     end_ns=c["t"][x_pos], gridid=c["gridid"][e_pos], tag=c["tag"][e_pos], flags=c["flags"][e_pos])


@dataclass(frozen=True)
class Durations:
    """Per launch-table row (arrays aligned with the table)."""

    start_ns: np.ndarray  # i8 earliest attributed block entry (_I64.max: none)
    end_ns: np.ndarray  # i8 latest attributed block exit (_I64.min: none)
    exits: np.ndarray  # i8 exit events attributed to the row
    blocks: np.ndarray  # i8 blocks paired (entry and exit)
    block_ns_max: np.ndarray  # i8 the longest (0: none)
    exit_events: int  # in the context
    unattributed_exits: int  # exits no launch row takes (no gridid, unknown gridid/tag)
    open_entries: int  # entries never paired with an exit (paired blocks only: per-block figures)
    orphan_exits: int  # exits without an entry of their block

    @property
    def timed(self) -> np.ndarray:
        """Rows with an entry and an exit."""
        return (self.start_ns != _I64.max) & (self.end_ns != _I64.min)

    @property
    def duration_ns(self) -> np.ndarray:
        """i8 first entry to last exit, -1 where not timed."""
        return np.where(self.timed, self.end_ns - self.start_ns, -1)


class LaunchDurations:
    """Per launch-table row: earliest entry, latest exit, paired blocks; ``feed`` each chunk, then ``finish``.

    enters=False: the caller supplies the earliest entries at ``finish(start_ns=...)`` (reconcile's tally has
    them), and an enter-only dump costs one comparison per chunk."""

    def __init__(self, t: LaunchTable, xj, *, enters: bool = True) -> None:
        self.n, self.xj, self.enters = t.n, xj, enters
        self.start = np.full(t.n, _I64.max, np.int64) if enters else None
        self.end = self.exits = self.blocks = self.bmax = None  # per row, from the first exit on
        self.n_exit = self.unattributed = 0
        self.pairer = BlockPairer()

    def _alloc(self) -> None:
        self.end = np.full(self.n, _I64.min, np.int64)
        self.exits, self.blocks, self.bmax = (np.zeros(self.n, np.int64) for _ in range(3))

    def _rows(self, gid, tag, flags) -> np.ndarray:
        if self.xj is None or not len(gid):
            return np.full(len(gid), -1, np.int64)
        return self.xj.lookup(gid, tag, flags, np.full(len(gid), BLOCK_ENTER, np.uint8))

    def feed(self, base: int, recs: np.ndarray, kind: np.ndarray | None = None, *,
             enters_only: bool = False) -> Pairs:
        """One chunk of the context's device events; returns its paired blocks (attributed by :meth:`rows_of`).
        ``kind``: the chunk's kind column when the caller has it already; ``enters_only``: the caller found every
        event of the chunk a block entry (an enter-only dump then costs no pass here)."""
        if enters_only and not self.enters and self.pairer.pending is None:
            self.pairer.hold_back(base, recs, len(recs))
            return _empty_pairs()
        kind = recs["kind"] if kind is None else kind
        ex = np.flatnonzero(kind == BLOCK_EXIT)
        if not len(ex) and not self.enters and self.pairer.pending is None:  # no exit yet: entries held back
            self.pairer.hold_back(base, recs, int(np.count_nonzero(kind == BLOCK_ENTER)))
            return _empty_pairs()
        if self.enters:
            en = np.flatnonzero(kind == BLOCK_ENTER)
            r = self._rows(recs["gridid"][en], recs["tag"][en], recs["flags"][en])
            ok = r >= 0
            np.minimum.at(self.start, r[ok], recs["globaltimer"][en[ok]].astype(np.int64))
        if len(ex):
            if self.end is None:
                self._alloc()
            r = self._rows(recs["gridid"][ex], recs["tag"][ex], recs["flags"][ex])
            ok = r >= 0
            self.n_exit += len(ex)
            self.unattributed += int((~ok).sum())
            np.maximum.at(self.end, r[ok], recs["globaltimer"][ex[ok]].astype(np.int64))
            np.add.at(self.exits, r[ok], 1)
        p = self.pairer.feed(base, recs, kind)
        if len(p):  # (pairs come only after an exit: the per-row arrays exist)
            r = self.rows_of(p)
            ok = r >= 0
            d = p.end_ns[ok] - p.start_ns[ok]
            np.add.at(self.blocks, r[ok], 1)
            np.maximum.at(self.bmax, r[ok], d)
        return p

    def rows_of(self, p: Pairs) -> np.ndarray:
        """Launch-table row of each paired block (-1: none), by its entry's gridid and tag."""
        return self._rows(p.gridid, p.tag, p.flags)

    def finish(self, start_ns: np.ndarray | None = None) -> Durations:
        start = self.start if start_ns is None else np.asarray(start_ns, np.int64)
        if self.end is None:  # no exit in the context: read-only constant columns, no memory per row (32 bytes
            # per launch held would grow with an enter-only dump)
            end = np.broadcast_to(np.int64(_I64.min), (self.n,))
            zero = np.broadcast_to(np.int64(0), (self.n,))
            return Durations(start_ns=start, end_ns=end, exits=zero, blocks=zero, block_ns_max=zero,
                             exit_events=0, unattributed_exits=0, open_entries=0,
                             orphan_exits=self.pairer.orphans)
        return Durations(start_ns=start, end_ns=self.end, exits=self.exits, blocks=self.blocks,
                         block_ns_max=self.bmax, exit_events=self.n_exit,
                         unattributed_exits=self.unattributed, open_entries=self.pairer.open if self.n_exit else 0,
                         orphan_exits=self.pairer.orphans)


def launch_durations(d, ctx: int, *, t: LaunchTable | None = None, xj=None, chunk: int | None = None) -> Durations:
    """The durations of one context of an opened dump, in one read of its device events."""
    from kvconv.join.events import CHUNK, event_chunks
    from kvconv.join.exact import ExactJoin

    t = LaunchTable.load(d, ctx) if t is None else t
    ld = LaunchDurations(t, ExactJoin(t) if xj is None else xj)
    for base, recs in event_chunks(d, ctx, chunk or CHUNK):
        ld.feed(base, recs)
    return ld.finish()


# ---------------------------------------------------------------------------------------------------------------
# reconcile's report


def _spread(v: np.ndarray, corrected: np.ndarray | None = None) -> dict:
    """min / median / p99 / max of durations ``v`` (ns); with ``corrected`` (the same durations less the tracer's
    calibrated bias) also their corrected median."""
    v = np.asarray(v, np.int64)
    out = {"count": int(len(v)), "min_ns": int(v.min()), "median_ns": float(np.median(v)),
           "p99_ns": int(np.percentile(v, 99, method="inverted_cdf")), "max_ns": int(v.max())}
    if corrected is not None:
        out["median_corrected_ns"] = float(np.median(corrected))
    return out


def section(t: LaunchTable, dur: Durations, names: dict, calibration=None) -> dict:
    """The ``durations`` of a context's reconcile report: per graph exec, per node across replays and per replay
    (KV-write time: the sum of its node executions' durations; span: first entry to last exit), per eager
    kernel across launches. ``calibration`` (kvconv.join.calibration.Calibration, the tracer's start-up measure of
    its own bias): medians also given corrected."""
    live = ~t.upload & ~t.dup & dur.timed
    dns = dur.duration_ns
    fix = calibration.corrected if calibration is not None else None
    out = {"clock": "gpu_globaltimer",
           "note": "launch: first block entry to last block exit; block: its entry to its exit",
           "exit_events": dur.exit_events, "launches_timed": int(live.sum()), "blocks_paired": int(dur.blocks.sum()),
           "unattributed_exits": dur.unattributed_exits, "open_entries": dur.open_entries,
           "orphan_exits": dur.orphan_exits,
           "block_ns_max": int(dur.block_ns_max.max()) if t.n else 0, "eager": [], "graph_execs": []}
    if calibration is not None:
        out["calibration"] = calibration.as_dict()
    e = np.flatnonzero(live & (t.kind == EAGER))
    for slot in np.unique(t.kernel_slot[e]):
        rows = e[t.kernel_slot[e] == slot]
        out["eager"].append({"kernel": kernel_short(names, slot),
                             "launches": _spread(dns[rows], fix(dns[rows]) if fix else None)})
    g = np.flatnonzero(live & (t.kind == GRAPH_NODE))
    for ex in np.unique(t.graph_exec[g]):
        rows = g[t.graph_exec[g] == ex]
        out["graph_execs"].append(_graph(t, dur, names, int(ex), rows, calibration))
    return out


def _graph(t: LaunchTable, dur: Durations, names: dict, ex: int, rows: np.ndarray, calibration=None) -> dict:
    dns = dur.duration_ns
    fix = calibration.corrected if calibration is not None else None
    nodes = []
    for o in np.unique(t.node_ordinal[rows]):
        r = rows[t.node_ordinal[rows] == o]
        nodes.append({"node_ordinal": int(o), "node": hexs(t.node[r[0]]),
                      "kernel": kernel_short(names, t.kernel_slot[r[0]]),
                      "replays": _spread(dns[r], fix(dns[r]) if fix else None)})
    # per replay, by one sort of the rows (a mask of all rows per replay is quadratic)
    lid = t.launch_id[rows]
    order = np.argsort(lid, kind="stable")
    r, lid = rows[order], lid[order]
    at = np.flatnonzero(np.r_[True, lid[1:] != lid[:-1]])  # rows is never empty: a graph exec of timed rows
    count = np.diff(np.r_[at, len(r)])
    kv_ns = np.add.reduceat(dns[r].astype(np.int64), at)
    span = np.maximum.reduceat(dur.end_ns[r], at) - np.minimum.reduceat(dur.start_ns[r], at)
    replays = [{"replay": int(rep), "nodes_timed": int(c), "kv_write_ns": int(k), "span_ns": int(s)}
               for rep, c, k, s in zip(lid[at].tolist(), count.tolist(), kv_ns.tolist(), span.tolist())]
    kv = np.array([x["kv_write_ns"] for x in replays], np.int64)
    kv_fixed = np.add.reduceat(fix(dns[r]), at) if fix else None  # each node execution corrected, then summed
    return {"graph_exec": hexs(ex), "node_ns": _spread(dns[rows], fix(dns[rows]) if fix else None),
            "kv_write_ns": _spread(kv, kv_fixed), "nodes": nodes, "replays": replays}


def _us(ns) -> str:
    return f"{float(ns) / 1e3:.2f} us"


def lines(sec: dict) -> list[str]:
    """The text report's lines for a context's ``durations``."""
    out = [f"  durations (gpu_globaltimer, first block entry to last block exit): {sec['launches_timed']:,} launches "
           f"timed, {sec['blocks_paired']:,} blocks paired (longest {_us(sec['block_ns_max'])})"
           + (f"; {sec['open_entries']:,} entries without exit" if sec["open_entries"] else "")
           + (f"; {sec['orphan_exits']:,} exits without entry" if sec["orphan_exits"] else "")
           + (f"; {sec['unattributed_exits']:,} exits not attributed" if sec["unattributed_exits"] else "")]
    cal = sec.get("calibration")
    if cal:
        out.append(f"    raw durations include the tracer's own {_us(cal['bias_ns'])} per launch, measured at start-up "
                   f"({cal['kernel']}, {cal['launches']} launches: {_us(cal['traced_span_ns'])} traced, "
                   f"{_us(cal['reference_ns'])} untraced under CUPTI); corrected = raw - {_us(cal['bias_ns'])}")
    else:
        out.append("    raw durations include the tracer's own enter/exit cost (the dump records no calibration)")
    for e in sec["eager"]:
        s = e["launches"]
        out.append(f"    eager {e['kernel']}: {s['count']:,} launches {_us(s['min_ns'])} .. {_us(s['max_ns'])} "
                   f"(median {_us(s['median_ns'])}, p99 {_us(s['p99_ns'])}{_fixed(s)})")
    for g in sec["graph_execs"]:
        s, k = g["node_ns"], g["kv_write_ns"]
        out.append(f"    graph exec {g['graph_exec']}: node executions {_us(s['min_ns'])} .. {_us(s['max_ns'])} "
                   f"(median {_us(s['median_ns'])}, p99 {_us(s['p99_ns'])}{_fixed(s)}); KV-write time per replay "
                   f"{_us(k['min_ns'])} .. {_us(k['max_ns'])} (median {_us(k['median_ns'])}{_fixed(k)})")
    return out


def _fixed(s: dict) -> str:
    return f"; corrected median {_us(s['median_corrected_ns'])}" if "median_corrected_ns" in s else ""
