"""The exact join (device block-enter events carrying %gridid -> host launch records), the one implementation used
by reconcile and by the emitters, and the per-event attribution every join fills (:class:`Match`).

    >>> xj = ExactJoin(table)                                    # doctest: +SKIP
    >>> rows = xj.lookup(ev["gridid"], ev["tag"], ev["flags"], ev["kind"])   # launch-table row per event, -1 none

Graph uploads and duplicate host records never match; 1) events with a tag match the first tagged host record (in
report order: eager launches, then graph nodes) with the same (gridid, tag); 2) other events with a gridid match the
one host record with that gridid when exactly one has it and not both sides carry a tag.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from kvconv.format import layout
from kvconv.join.events import BLOCK_ENTER, Events
from kvconv.join.launches import EAGER, GRAPH_NODE, Dropped, LaunchTable, kernel_short, launch_name, release_groups
from kvconv.join.notes import Notes, hexs, plural, ranges
from kvconv.join.runs import event_runs, heads, run_starts

_EVF = layout.ENUMS["event_flags"]
JOIN_NONE, JOIN_EXACT, JOIN_ORDERED = 0, 1, 2
JOIN_READS = frozenset({"kind", "flags", "grid_id", "tag", "upload", "dup"})  # launch-table columns ExactJoin reads


@dataclass(frozen=True)
class Match:
    """Per block-enter event (sequence order): what the join attributed it to."""

    host: np.ndarray  # i8 launch-table row, -1 none
    kind: np.ndarray  # u2 host kind (also for events attributed to a replay or window only)
    replay: np.ndarray
    join: np.ndarray  # u1 JOIN_*
    window: np.ndarray  # i8 ordered join: multi-stream window, -1 none
    exec: np.ndarray
    ordinal: np.ndarray  # i4 node ordinal, -1 none

    @classmethod
    def empty(cls, n: int) -> Match:
        return cls(host=np.full(n, -1, np.int64), kind=np.zeros(n, np.uint16), replay=np.zeros(n, np.uint64),
                   join=np.zeros(n, np.uint8), window=np.full(n, -1, np.int64), exec=np.zeros(n, np.uint64),
                   ordinal=np.full(n, -1, np.int32))

    def fill_from_host(self, t: LaunchTable) -> None:
        m = self.host >= 0
        sel = slice(None) if bool(m.all()) else np.flatnonzero(m)  # every event matched: whole columns, no mask
        h = self.host[sel]
        self.kind[sel] = t.kind[h]
        self.replay[sel] = t.replay_at(h)
        self.exec[sel] = t.graph_exec[h]
        self.ordinal[sel] = t.node_ordinal[h]

    def clear(self, sel) -> None:
        self.host[sel], self.kind[sel], self.replay[sel], self.join[sel] = -1, 0, 0, 0
        self.exec[sel], self.ordinal[sel] = 0, -1


def _gid_key(gid: np.ndarray, tag: np.ndarray) -> np.ndarray:
    return gid.astype(np.uint64) ^ (tag.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15))


class ExactJoin:
    """The exact join as a vectorised lookup over a :class:`LaunchTable` (built once, applied to any chunk)."""

    def __init__(self, t: LaunchTable) -> None:
        cand = ~t.upload & ~t.dup
        has_tag = t.has_tag
        rows = np.int32 if t.n < (1 << 31) else np.int64  # row numbers: half the bytes per host record
        # the table's own gridid and tag columns check a hit (tagged records: their tag is the key's)
        self.gid, self.tag = t.grid_id, t.tag
        # 1) (gridid, tag) of tagged records, the first in report order winning
        r = t.in_order(cand & has_tag)  # report order, without sorting by rank
        k = _gid_key(t.grid_id[r], t.tag[r])
        o = np.argsort(k, kind="stable")
        self.k1, self.r1 = k[o], r[o].astype(rows)
        del k, o, r
        g1, t1 = self._g1t1()
        same = self.k1[1:] == self.k1[:-1]
        self.collide = bool(np.any(same & ((g1[1:] != g1[:-1]) | (t1[1:] != t1[:-1]))))
        del g1, t1, same
        # 2) gridid alone, where exactly one record has it
        a = np.flatnonzero(cand)
        ug, fi, cnt = np.unique(t.grid_id[a].astype(np.uint64), return_index=True, return_counts=True)
        self.ug = ug
        self.u_row = np.where(cnt == 1, a[fi], -1).astype(rows)
        self.u_tagged = has_tag[a[fi]]

    def runs(self, recs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """A chunk of device event records as runs: ``(starts, launch-table row of each run)`` (-1: unmatched).
        Device events come in runs of one launch's blocks, so the lookup runs once per run."""
        starts = event_runs(recs)
        return starts, self.lookup(*heads(recs, starts))

    def _g1t1(self) -> tuple[np.ndarray, np.ndarray]:
        """gridid and tag of the tagged records, in key order."""
        return self.gid[self.r1].astype(np.uint64), self.tag[self.r1].astype(np.uint64)

    def lookup(self, gid, tag, flags, kind) -> np.ndarray:
        gid = np.asarray(gid).astype(np.uint64, copy=False)
        tag = np.asarray(tag).astype(np.uint64, copy=False)
        out = np.full(len(gid), -1, np.int64)
        ok = (np.asarray(kind) == BLOCK_ENTER) & ((np.asarray(flags) & _EVF["has_gridid"]) != 0)
        et = (np.asarray(flags) & _EVF["has_tag"]) != 0
        i = np.flatnonzero(ok & et)
        if len(i) and len(self.k1):
            self._tagged(gid[i], tag[i], i, out)
        i = np.flatnonzero(ok & (out < 0))
        if len(i) and len(self.ug):
            gi = gid[i]
            p = np.minimum(np.searchsorted(self.ug, gi), len(self.ug) - 1)
            take = (self.ug[p] == gi) & (self.u_row[p] >= 0) & (~et[i] | ~self.u_tagged[p])
            out[i[take]] = self.u_row[p[take]]
        return out

    def _tagged(self, gi, ti, i, out) -> None:
        if not self.collide:
            p = np.searchsorted(self.k1, _gid_key(gi, ti))
            np.minimum(p, len(self.k1) - 1, out=p)
            r = self.r1[p]
            hit = (self.gid[r] == gi) & (self.tag[r] == ti)
            out[i[hit]] = r[hit]
            return
        # two (gridid, tag) pairs share a key: ranks of the exact pairs instead
        g1, t1 = self._g1t1()
        gids = np.unique(np.r_[g1, gi])
        tags = np.unique(np.r_[t1, ti])
        nt = np.int64(len(tags))
        hk = np.searchsorted(gids, g1).astype(np.int64) * nt + np.searchsorted(tags, t1)
        ek = np.searchsorted(gids, gi).astype(np.int64) * nt + np.searchsorted(tags, ti)
        oo = np.argsort(hk, kind="stable")  # r1 is in report order within equal pairs
        hks = hk[oo]
        p = np.minimum(np.searchsorted(hks, ek), len(hks) - 1)
        hit = hks[p] == ek
        out[i[hit]] = self.r1[oo[p[hit]]]


def join_exact(ev: Events, t: LaunchTable, xj: ExactJoin, names: dict, notes: Notes) -> tuple[Match, int]:
    """The exact join of a context's events held in memory; returns the attribution and the events of replays the
    host never recorded (graph-node events, attributed to no replay)."""
    m = Match.empty(ev.n)
    if ev.n:
        # events come in runs of one launch's blocks: the lookup and the host columns once per run
        starts = run_starts(ev.gridid, ev.tag, ev.flags)  # one launch's blocks come in a run
        rows = xj.lookup(ev.gridid[starts], ev.tag[starts], ev.flags[starts],
                         np.full(len(starts), BLOCK_ENTER, np.uint8))
        lens = np.diff(np.r_[starts, ev.n])
        ok = rows >= 0
        r0 = np.maximum(rows, 0)
        for out, col, none in ((m.host, rows, -1), (m.kind, t.kind, 0), (m.replay, t.replay, 0),
                               (m.exec, t.graph_exec, 0), (m.ordinal, t.node_ordinal, -1)):
            vals = rows if col is rows else np.where(ok, col[r0] if t.n else none, none)
            out[:] = np.repeat(vals.astype(out.dtype, copy=False), lens)
        m.join[:] = np.repeat(np.where(ok, JOIN_EXACT, 0).astype(np.uint8), lens)
    un = np.flatnonzero((m.host < 0) & ev.has_gid)
    if not len(un):
        return m, 0
    u, inv = unmatched_keys(ev.gridid[un], ev.tag[un], ev.has_tag[un], ev.idx[un], ev.slot[un], ev.t[un])
    extra, attributed = explain_unmatched(u, t, names, notes)
    for k, ex, r, ordn in attributed:
        # attributed to the replay, node known: unmatched to a record but named in the table
        sel = un[inv == k]
        m.kind[sel], m.replay[sel], m.join[sel] = GRAPH_NODE, r, JOIN_EXACT
        m.exec[sel], m.ordinal[sel] = ex, ordn
    return m, extra


@dataclass(frozen=True)
class Unmatched:
    """Exact-mode events carrying a gridid that no host record took, per (gridid, tag) key (tag 0 for events without
    one), in key order: events, the first event (sequence order): its device index, kernel slot and has_tag; the
    earliest and latest entry (signed ns)."""

    gid: np.ndarray
    tag: np.ndarray
    count: np.ndarray
    first: np.ndarray
    slot: np.ndarray
    has_tag: np.ndarray
    tmin: np.ndarray
    tmax: np.ndarray

    @classmethod
    def merge(cls, parts: list) -> Unmatched:
        """Parts in sequence order (each already reduced) as one: the first part's first event wins."""
        cols = {f: np.concatenate([getattr(p, f) for p in parts]) for f in cls.__dataclass_fields__}
        return _reduce(cols)[0]


def unmatched_keys(gid, tag, has_tag, dev, slot, tt) -> tuple[Unmatched, np.ndarray]:
    """Reduce unmatched events (sequence order) to their keys; also each event's key index."""
    ts = np.asarray(tt).astype(np.int64)
    cols = {"gid": np.asarray(gid).astype(np.uint64), "tag": np.where(has_tag, tag, 0).astype(np.uint64),
            "count": np.ones(len(gid), np.int64), "first": np.asarray(dev).astype(np.int64),
            "slot": np.asarray(slot), "has_tag": np.asarray(has_tag), "tmin": ts, "tmax": ts}
    return _reduce(cols)


def _reduce(cols: dict) -> tuple[Unmatched, np.ndarray]:
    key = np.stack([cols["gid"], cols["tag"]], axis=1)
    uk, fi, inv = np.unique(key, axis=0, return_index=True, return_inverse=True)
    inv = inv.reshape(-1)
    k = len(uk)
    cnt = np.bincount(inv, weights=cols["count"], minlength=k).astype(np.int64)
    lo, hi = np.full(k, np.iinfo(np.int64).max), np.full(k, np.iinfo(np.int64).min)
    np.minimum.at(lo, inv, cols["tmin"])
    np.maximum.at(hi, inv, cols["tmax"])
    return Unmatched(gid=uk[:, 0], tag=uk[:, 1], count=cnt, first=cols["first"][fi], slot=cols["slot"][fi],
                     has_tag=cols["has_tag"][fi], tmin=lo, tmax=hi), inv


def explain_unmatched(u: Unmatched, t: LaunchTable, names: dict, notes: Notes) -> tuple[int, list]:
    """Name every unmatched exact-mode key precisely: host record missing for (replay, node), an extra replay the
    host never saw, or a gridid no host record has. Returns the events of extra replays and the keys attributed to a
    replay with their node known: ``(key index, graph exec, replay, node ordinal)``."""
    if not len(u.gid):
        return 0, []
    hv = t.in_order(~t.dup & ~t.upload)
    # gridid -> a host record with it (node identity); tag -> (exec, replay)
    hg_o = hv[np.argsort(t.grid_id[hv], kind="stable")]
    hg_s = t.grid_id[hg_o]
    tagged = hv[t.has_tag[hv] & (t.kind[hv] == GRAPH_NODE)]
    tg_o = tagged[np.argsort(t.tag[tagged], kind="stable")]
    tg_s = t.tag[tg_o]
    extra: dict[tuple, dict] = {}
    attributed = []
    for k, (gid, tag, c) in enumerate(zip(u.gid, u.tag, u.count)):
        dev_i, c = int(u.first[k]), int(c)
        p = np.searchsorted(hg_s, gid)
        if p >= len(hg_s) or hg_s[p] != gid:
            notes.add("error", "unmatched-device-event", f"{c:,} device events with gridid {int(gid)} "
                      f"({kernel_short(names, u.slot[k])}) match no host launch record",
                      kind="device_event", index=dev_i, count=c)
            continue
        h = hg_o[p]
        if t.kind[h] == EAGER or not u.has_tag[k]:
            nsame = int(np.searchsorted(hg_s, gid, side="right") - p)
            notes.add("error", "unmatched-device-event", f"{c:,} device events with gridid {int(gid)} cannot be "
                      f"joined: {nsame} host records share that gridid and the events carry no tag to pick one "
                      f"({launch_name(t, names, h)})", kind="device_event", index=dev_i, count=c)
            continue
        q = np.searchsorted(tg_s, tag)
        rec_h = None
        if q < len(tg_s) and tg_s[q] == tag:
            cand = tg_o[q : int(np.searchsorted(tg_s, tag, side="right"))]
            cand = cand[t.graph_exec[cand] == t.graph_exec[h]]
            rec_h = cand[0] if len(cand) else None
        if rec_h is None:
            x = extra.setdefault((int(t.graph_exec[h]), int(tag)), {"events": 0, "nodes": set(), "first": dev_i})
            x["events"] += c
            x["nodes"].add(int(t.node_ordinal[h]))
            continue
        r = int(t.launch_id[rec_h])
        notes.add("error", "host-record-missing", f"graph exec {hexs(t.graph_exec[h])} replay {r} node "
                  f"#{int(t.node_ordinal[h])} ({hexs(t.node[h])}): {plural(c, 'device event')} (tag {hexs(tag)}) "
                  "but no host graph-node record of this node in this replay", kind="device_event", index=dev_i,
                  count=c)
        attributed.append((k, int(t.graph_exec[h]), r, int(t.node_ordinal[h])))
    for (ex, tag), x in sorted(extra.items()):
        known = sorted({int(r) for r in t.launch_id[(t.kind == GRAPH_NODE) & ~t.upload & (t.graph_exec == ex)]})
        notes.add("error", "extra-replay", f"graph exec {hexs(ex)}: {x['events']:,} device events of a replay the "
                  f"host never recorded (tag {hexs(tag)}; host replays {ranges(known)}), nodes "
                  f"#{ranges(sorted(x['nodes']))}", kind="device_event", index=x["first"], count=x["events"])
    return sum(x["events"] for x in extra.values()), attributed


def load_joined(d, ctx: int, *, join: bool = True, drop: tuple = ()) -> tuple[LaunchTable, ExactJoin | None]:
    """A context's launch table and (``join``, when it has rows) its exact join, the host records' pages given back
    (the table holds copies). ``drop``: columns of the table let go at once (a use of one raises :class:`Dropped`);
    those the join does not read go before it is built (its temporaries are the peak of the load)."""
    t = LaunchTable.load(d, ctx)
    release_groups(d, ("graph_node", "eager_launch"), ctx)
    early = {k: Dropped(k) for k in drop if k not in JOIN_READS}
    if early:
        t = replace(t, **early)
    xj = ExactJoin(t) if join and t.n else None
    if len(early) < len(drop):
        t = replace(t, **{k: Dropped(k) for k in drop if k not in early})
    return t, xj
