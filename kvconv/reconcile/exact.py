"""The exact join (device block-enter events carrying %gridid -> host launch records), the one implementation used
by reconcile and by the emitters, and the per-event attribution every join fills (:class:`Match`).

    >>> xj = ExactJoin(table)                                    # doctest: +SKIP
    >>> rows = xj.lookup(ev["gridid"], ev["tag"], ev["flags"], ev["kind"])   # launch-table row per event, -1 none

Graph uploads and duplicate host records never match; 1) events with a tag match the first tagged host record (in
report order: eager launches, then graph nodes) with the same (gridid, tag); 2) other events with a gridid match the
one host record with that gridid when exactly one has it and not both sides carry a tag.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import layout
from ._notes import Notes, hexs, plural, ranges
from .events import BLOCK_ENTER, Events
from .launches import EAGER, GRAPH_NODE, LaunchTable, kernel_short, launch_name

_EVF = layout.ENUMS["event_flags"]
JOIN_NONE, JOIN_EXACT, JOIN_ORDERED = 0, 1, 2


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
    def empty(cls, n: int) -> "Match":
        return cls(host=np.full(n, -1, np.int64), kind=np.zeros(n, np.uint16), replay=np.zeros(n, np.uint64),
                   join=np.zeros(n, np.uint8), window=np.full(n, -1, np.int64), exec=np.zeros(n, np.uint64),
                   ordinal=np.full(n, -1, np.int32))

    def fill_from_host(self, t: LaunchTable) -> None:
        m = self.host >= 0
        h = self.host[m]
        self.kind[m] = t.kind[h]
        self.replay[m] = t.replay[h]
        self.exec[m] = t.graph_exec[h]
        self.ordinal[m] = t.node_ordinal[h]

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
        htag = np.where(has_tag, t.tag, 0).astype(np.uint64)
        rank = t.rank
        # 1) (gridid, tag) of tagged records, the first in report order winning
        r = np.flatnonzero(cand & has_tag)
        r = r[np.argsort(rank[r], kind="stable")]
        k = _gid_key(t.grid_id[r], htag[r])
        o = np.argsort(k, kind="stable")
        self.k1, self.r1 = k[o], r[o].astype(np.int64)
        self.g1, self.t1 = t.grid_id[self.r1].astype(np.uint64), htag[self.r1]
        same = self.k1[1:] == self.k1[:-1]
        self.collide = bool(np.any(same & ((self.g1[1:] != self.g1[:-1]) | (self.t1[1:] != self.t1[:-1]))))
        # 2) gridid alone, where exactly one record has it
        a = np.flatnonzero(cand)
        ug, fi, cnt = np.unique(t.grid_id[a].astype(np.uint64), return_index=True, return_counts=True)
        self.ug = ug
        self.u_row = np.where(cnt == 1, a[fi], -1).astype(np.int64)
        self.u_tagged = has_tag[a[fi]]

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
            hit = (self.g1[p] == gi) & (self.t1[p] == ti)
            out[i[hit]] = self.r1[p[hit]]
            return
        # two (gridid, tag) pairs share a key: ranks of the exact pairs instead
        gids = np.unique(np.r_[self.g1, gi])
        tags = np.unique(np.r_[self.t1, ti])
        nt = np.int64(len(tags))
        hk = np.searchsorted(gids, self.g1).astype(np.int64) * nt + np.searchsorted(tags, self.t1)
        ek = np.searchsorted(gids, gi).astype(np.int64) * nt + np.searchsorted(tags, ti)
        oo = np.argsort(hk, kind="stable")  # r1 is in report order within equal pairs
        hks = hk[oo]
        p = np.minimum(np.searchsorted(hks, ek), len(hks) - 1)
        hit = hks[p] == ek
        out[i[hit]] = self.r1[oo[p[hit]]]


def join_exact(ev: Events, t: LaunchTable, xj: ExactJoin, names: dict, notes: Notes) -> tuple[Match, int]:
    """The exact join of a context's events; returns the attribution and the events of replays the host never
    recorded (graph-node events, attributed to no replay)."""
    m = Match.empty(ev.n)
    if ev.n:
        # events come in runs of one launch's blocks: the lookup and the host columns once per run
        g, tg, fl = ev.gridid, ev.tag, ev.flags
        chg = (g[1:] != g[:-1]) | (tg[1:] != tg[:-1]) | (fl[1:] != fl[:-1])
        starts = np.r_[0, np.flatnonzero(chg) + 1]
        rows = xj.lookup(g[starts], tg[starts], fl[starts], np.full(len(starts), BLOCK_ENTER, np.uint8))
        lens = np.diff(np.r_[starts, ev.n])
        ok = rows >= 0
        r0 = np.maximum(rows, 0)
        for out, col, none in ((m.host, rows, -1), (m.kind, t.kind, 0), (m.replay, t.replay, 0),
                               (m.exec, t.graph_exec, 0), (m.ordinal, t.node_ordinal, -1)):
            vals = rows if col is rows else np.where(ok, col[r0] if t.n else none, none)
            out[:] = np.repeat(vals.astype(out.dtype, copy=False), lens)
        m.join[:] = np.repeat(np.where(ok, JOIN_EXACT, 0).astype(np.uint8), lens)
    return m, _explain_unmatched(ev, t, m, names, notes)


def _explain_unmatched(ev: Events, t: LaunchTable, m: Match, names: dict, notes: Notes) -> int:
    """Name every unmatched exact-mode event group precisely: host record missing for (replay, node), an extra
    replay the host never saw, or a gridid no host record has."""
    un = np.flatnonzero((m.host < 0) & ev.has_gid)
    if not len(un):
        return 0
    hv = t.in_order(~t.dup & ~t.upload)
    # gridid -> a host record with it (node identity); tag -> (exec, replay)
    hg_o = hv[np.argsort(t.grid_id[hv], kind="stable")]
    hg_s = t.grid_id[hg_o]
    tagged = hv[t.has_tag[hv] & (t.kind[hv] == GRAPH_NODE)]
    tg_o = tagged[np.argsort(t.tag[tagged], kind="stable")]
    tg_s = t.tag[tg_o]
    key = np.stack([ev.gridid[un], np.where(ev.has_tag[un], ev.tag[un], 0)], axis=1)
    uk, inv, cnt = np.unique(key, axis=0, return_inverse=True, return_counts=True)
    inv = inv.reshape(-1)
    extra: dict[tuple, dict] = {}
    for k, ((gid, tag), c) in enumerate(zip(uk, cnt)):
        first_ev = un[np.flatnonzero(inv == k)[0]]
        dev_i, c = int(ev.idx[first_ev]), int(c)
        p = np.searchsorted(hg_s, gid)
        if p >= len(hg_s) or hg_s[p] != gid:
            notes.add("error", "unmatched-device-event", f"{c:,} device events with gridid {int(gid)} "
                      f"({kernel_short(names, ev.slot[first_ev])}) match no host launch record",
                      kind="device_event", index=dev_i, count=c)
            continue
        h = hg_o[p]
        if t.kind[h] == EAGER or not ev.has_tag[first_ev]:
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
        # attributed to the replay, node known: unmatched to a record but named in the table
        sel = un[inv == k]
        m.kind[sel], m.replay[sel], m.join[sel] = GRAPH_NODE, r, JOIN_EXACT
        m.exec[sel], m.ordinal[sel] = t.graph_exec[h], t.node_ordinal[h]
    for (ex, tag), x in sorted(extra.items()):
        known = sorted({int(r) for r in t.launch_id[(t.kind == GRAPH_NODE) & ~t.upload & (t.graph_exec == ex)]})
        notes.add("error", "extra-replay", f"graph exec {hexs(ex)}: {x['events']:,} device events of a replay the "
                  f"host never recorded (tag {hexs(tag)}; host replays {ranges(known)}), nodes "
                  f"#{ranges(sorted(x['nodes']))}", kind="device_event", index=x["first"], count=x["events"])
    return sum(x["events"] for x in extra.values())
