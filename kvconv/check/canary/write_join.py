"""The one join of ``slot_write`` records (kvconv record --writes) to their launch, step, slot and request, shared by
the write-address canary (:mod:`kvconv.check.canary.writes`) and the emitters (Arrow's ``slot_write`` table, the
block events of the Perfetto and Chrome traces).

A write joins its host launch record through ``(gridid, tag)`` = the host record's ``(grid_id, tag)`` (graph nodes;
eager launches by ``grid_id``, tag 0), its step through that record's ``host_ns`` inside the step's
``[begin_ns, end_ns]`` (``write_step``), and its request through the step's slot mapping (``slot_map``): the request
of the step's token mapped to the written slot, and the slot's owner, the request of the last token mapped to it at
that step or before (for a stale write: the request whose KV it overwrote).

    >>> from kvconv.format import dump                                       # doctest: +SKIP
    >>> w = join(dump.open("fixtures/writes-stale-pad/writes-stale-pad.kvdump"), 0)   # doctest: +SKIP
    >>> w.slot[w.status == UNMAPPED], w.owner[w.status == UNMAPPED]           # doctest: +SKIP
    (array([60, 60, ...]), array([4, 4, ...], dtype=uint64))
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvconv.format import layout

_SW = layout.ENUMS["slot_write_flags"]
PAD_FLAG = layout.ENUMS["slot_map_flags"]["pad"]  # a padding row of a step's slot mapping
_RELEASE = layout.ENUMS["slot_map_flags"]["release"]
KINDS = ("cache", "slot_write", "write_step", "slot_map", "graph_node", "eager_launch")
# what each write is, in the canary's terms (status codes index STATUS)
MAPPED, PAD, UNMAPPED, OUTSIDE, UNKNOWN_CACHE, NO_STEP = range(6)
STATUS = ("mapped", "pad", "unmapped", "outside", "unknown-cache", "no-step")
HOST_KINDS = (layout.KINDS["graph_node"].id, layout.KINDS["eager_launch"].id)


@dataclass(frozen=True)
class WriteJoin:
    """Per slot_write record of one context (arrays aligned with ``records``)."""

    context_id: int
    group: object  # the context's (first) slot_write group
    records: np.ndarray  # the slot_write records
    caches: np.ndarray  # the cache records
    steps: np.ndarray  # the write_step records
    smap: np.ndarray  # the slot_map records
    step_idx: np.ndarray  # i8 index into ``steps`` (-1: no step)
    host_kind: np.ndarray  # u2 graph_node / eager_launch kind id of the launch record (0: none)
    host_index: np.ndarray  # i8 index of the launch record in its kind's records (-1: none)
    replay: np.ndarray  # u8 the graph node record's launch_id (0: eager or none)
    node: np.ndarray  # u8 the graph node (0: eager or none)
    slot: np.ndarray  # i8 page * page_size + offset (-1 where the write is outside every cache or its cache unknown)
    request: np.ndarray  # u8 request of the step's token mapped to the slot (valid where has_request)
    has_request: np.ndarray
    owner: np.ndarray  # u8 request of the last token mapped to the slot at the step or before (where has_owner)
    owner_step: np.ndarray  # u8 that token's step
    has_owner: np.ndarray
    status: np.ndarray  # u1 MAPPED .. NO_STEP

    def __len__(self) -> int:
        return len(self.records)

    def step_number(self) -> np.ndarray:
        """u8 the step number of each write (valid where ``step_idx >= 0``)."""
        if not len(self.steps):
            return np.zeros(len(self), np.uint64)
        return np.where(self.step_idx >= 0, self.steps["step"][np.maximum(self.step_idx, 0)], 0).astype(np.uint64)


def name(c) -> str:
    """A cache record's name."""
    return bytes(c["name"]).rstrip(b"\0").decode("utf-8", "replace")


def has_writes(d, ctx: int) -> bool:
    return bool(d.groups_of("slot_write", context_id=ctx))


def join(d, ctx: int) -> WriteJoin | None:
    """The join of context ``ctx``'s slot_write records (None: the context has none)."""
    g = {k: d.records(k, context_id=ctx) for k in KINDS}
    gs = d.groups_of("slot_write", context_id=ctx)
    if not gs:
        return None
    g["write_step"] = g["write_step"][~releases(g["write_step"], g["slot_map"])]  # releases are no steps
    sw, caches, steps, smap = g["slot_write"], g["cache"], g["write_step"], g["slot_map"]
    step_idx, host_kind, host_index, replay, node = _launch_and_step(sw, g)
    n = len(sw)
    outside = (sw["flags"] & _SW["outside"]) != 0
    ids = np.sort(caches["cache_id"].astype(np.int64))
    cid = sw["cache_id"].astype(np.int64)
    known = ~outside & np.isin(cid, ids)
    page_size = np.zeros(n, np.int64)
    if len(caches):
        ps = dict(zip(caches["cache_id"].tolist(), caches["page_size"].tolist()))
        page_size[known] = [ps[k] for k in cid[known].tolist()]
    slot = np.where(known, sw["page"].astype(np.int64) * page_size + sw["offset"].astype(np.int64), -1)
    q = np.flatnonzero(known & (step_idx >= 0))
    req, has_req, own, own_step, has_own, pad = _requests(steps, smap, step_idx[q], slot[q], n, q)
    status = np.full(n, MAPPED, np.uint8)
    status[known & (step_idx >= 0) & ~has_req] = UNMAPPED
    status[known & (step_idx >= 0) & ~has_req & pad] = PAD
    status[known & (step_idx < 0)] = NO_STEP
    status[~outside & ~known] = UNKNOWN_CACHE
    status[outside] = OUTSIDE
    return WriteJoin(context_id=ctx, group=gs[0], records=sw, caches=caches, steps=steps, smap=smap,
                     step_idx=step_idx, host_kind=host_kind, host_index=host_index, replay=replay, node=node,
                     slot=slot, request=req, has_request=has_req, owner=own, owner_step=own_step, has_owner=has_own,
                     status=status)


def releases(steps, smap) -> np.ndarray:
    """bool per write_step record: a release the probe recorded (WriteProbe.release / free: rows all flagged
    ``release``), not a step (kvconv.check.canary.ownership)."""
    out = np.zeros(len(steps), bool)
    if not len(steps) or not len(smap):
        return out
    first, count = steps["map_first"].astype(np.int64), steps["map_count"].astype(np.int64)
    ok = (count > 0) & (first + count <= len(smap))
    rel = np.r_[0, np.cumsum((smap["flags"] & _RELEASE) != 0)]
    out[ok] = rel[first[ok] + count[ok]] - rel[first[ok]] == count[ok]
    return out


def _launch_keys(gridid, tag) -> np.ndarray:
    return (np.asarray(gridid).astype(np.uint64) << np.uint64(20)) | (np.asarray(tag).astype(np.uint64)
                                                                      & np.uint64(0xFFFFF))


def _launch_and_step(sw, g):
    """Per slot_write: index of its step (-1: none), its launch record (kind, index; -1: none), replay and node."""
    gn, ea = g["graph_node"], g["eager_launch"]
    keys = np.concatenate([_launch_keys(gn["grid_id"], gn["tag"]), _launch_keys(ea["grid_id"], 0 * ea["grid_id"])])
    host = np.concatenate([gn["host_ns"], ea["host_ns"]]).astype(np.uint64)
    lid = np.concatenate([gn["launch_id"], np.zeros(len(ea), np.uint64)]).astype(np.uint64)
    node = np.concatenate([gn["node"], np.zeros(len(ea), np.uint64)]).astype(np.uint64)
    kind = np.concatenate([np.full(len(gn), HOST_KINDS[0], np.uint16), np.full(len(ea), HOST_KINDS[1], np.uint16)])
    index = np.concatenate([np.arange(len(gn)), np.arange(len(ea))]).astype(np.int64)
    order = np.argsort(keys, kind="stable")
    keys, host, lid, node, kind, index = (a[order] for a in (keys, host, lid, node, kind, index))
    k = _launch_keys(sw["gridid"], sw["tag"])
    i = np.searchsorted(keys, k)
    hit = i < len(keys)
    hit[hit] &= keys[i[hit]] == k[hit]
    j = np.where(hit, i, 0)
    pick = lambda a, none: np.where(hit, a[j] if len(a) else none, none)  # noqa: E731
    hns = pick(host, 0)
    steps = g["write_step"]
    order = np.argsort(steps["begin_ns"], kind="stable")
    b, e = steps["begin_ns"][order], steps["end_ns"][order]
    s = np.searchsorted(b, hns, side="right") - 1
    ok = hit & (s >= 0)
    ok[ok] &= hns[ok] <= e[s[ok]]
    step_idx = np.where(ok, order[np.clip(s, 0, max(len(order) - 1, 0))] if len(order) else -1, -1)
    return (step_idx.astype(np.int64), pick(kind, 0).astype(np.uint16), pick(index, -1).astype(np.int64),
            pick(lid, 0).astype(np.uint64), pick(node, 0).astype(np.uint64))


def step_map(steps, smap, si: int) -> dict:
    """Step ``si``'s tokens: ``live`` slot -> request (padding rows and negative slots left out), ``pad`` the slots
    >= 0 of padding rows (sentinels where writes are allowed), ``rows`` its slot_map records."""
    s = steps[si]
    rows = smap[int(s["map_first"]):int(s["map_first"]) + int(s["map_count"])]
    live = {int(r["slot"]): int(r["request_id"]) for r in rows
            if not int(r["flags"]) & PAD_FLAG and int(r["slot"]) >= 0}
    pad = {int(r["slot"]) for r in rows if int(r["flags"]) & PAD_FLAG and int(r["slot"]) >= 0}
    return {"live": live, "pad": pad, "rows": rows}


def _tokens(steps, smap):
    """Every token of every step: (slot, step rank (steps in step-number order), step number, request, pad)."""
    order = np.argsort(steps["step"], kind="stable")
    rank = np.empty(len(steps), np.int64)
    rank[order] = np.arange(len(steps))
    first, count = steps["map_first"].astype(np.int64), steps["map_count"].astype(np.int64)
    si = np.repeat(np.arange(len(steps)), count)
    at = np.repeat(first, count) + (np.arange(int(count.sum())) - np.repeat(np.cumsum(count) - count, count))
    at = at[at < len(smap)]
    si = si[: len(at)]
    m = smap[at]
    return (m["slot"].astype(np.int64), rank[si], steps["step"][si].astype(np.uint64),
            m["request_id"].astype(np.uint64), (m["flags"] & PAD_FLAG) != 0, rank)


def _last_at_or_before(ms, mr, qs, qr) -> np.ndarray:
    """For each query (slot qs, rank qr): the index of the last token (slot ms, rank mr; later tokens of one step
    after earlier ones) with the same slot at rank <= qr, or -1."""
    n, k = len(ms), len(qs)
    if not n or not k:
        return np.full(k, -1, np.int64)
    slot, rank = np.concatenate([ms, qs]), np.concatenate([mr, qr])
    isq = np.r_[np.zeros(n, bool), np.ones(k, bool)]
    o = np.lexsort((np.arange(n + k), isq, rank, slot))
    pos = np.arange(n + k)
    last = np.maximum.accumulate(np.where(~isq[o], pos, -1))
    cand = np.where(last >= 0, o[np.maximum(last, 0)], -1)
    cand = np.where((cand >= 0) & (slot[np.maximum(cand, 0)] == slot[o]), cand, -1)
    out = np.empty(k, np.int64)
    qpos = np.flatnonzero(isq[o])
    out[o[qpos] - n] = cand[qpos]
    return out


def _requests(steps, smap, qstep, qslot, n: int, q: np.ndarray):
    """Per write ``q`` (its step index and slot): the request the step maps the slot to, the slot's owner (the last
    live token mapped to it at that step or before) and whether the slot is a padding row's of the step."""
    req, own, own_step = (np.zeros(n, np.uint64) for _ in range(3))
    has_req, has_own, pad = (np.zeros(n, bool) for _ in range(3))
    if not len(q) or not len(steps):
        return req, has_req, own, own_step, has_own, pad
    ms, mr, mstep, mreq, mpad, rank = _tokens(steps, smap)
    qr = rank[qstep]
    live = ~mpad & (ms >= 0)
    li = np.flatnonzero(live)
    if not len(li):  # no live token mapped at all (every mapped row a pad, or slot < 0): nobody owns a slot
        pi = np.flatnonzero(mpad & (ms >= 0))
        if len(pi):
            j = _last_at_or_before(ms[pi], mr[pi], qslot, qr)
            pad[q] = (j >= 0) & (mr[pi[np.maximum(j, 0)]] == qr)
        return req, has_req, own, own_step, has_own, pad
    j = _last_at_or_before(ms[li], mr[li], qslot, qr)
    f = j >= 0
    jj = li[np.maximum(j, 0)]
    has_own[q] = f
    own[q] = np.where(f, mreq[jj], 0)
    own_step[q] = np.where(f, mstep[jj], 0)
    this = f & (mr[jj] == qr)
    has_req[q] = this
    req[q] = np.where(this, mreq[jj], 0)
    pi = np.flatnonzero(mpad & (ms >= 0))
    j = _last_at_or_before(ms[pi], mr[pi], qslot, qr)
    pad[q] = (j >= 0) & (mr[pi[np.maximum(j, 0)]] == qr) if len(pi) else False
    return req, has_req, own, own_step, has_own, pad
