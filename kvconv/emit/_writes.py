"""What the emitters draw of the write-address canary's records (``kvconv record --writes``): the ``slot_write``
Arrow table (one row per record, joined to its launch, step, slot and request) and, per block that wrote, what its
events in the traces are annotated with. The join is the canary's own (:mod:`kvconv.check.canary.write_join`).

    >>> bw = BlockWrites.of(ctx)                 # doctest: +SKIP   (None: the context holds no slot_write records)
    >>> k = bw.lookup(recs)                      # per device event: its block's summary row, -1 where it wrote nothing
    >>> bw.slot[k[k >= 0]], bw.cache_label(bw.cache_ix[k[k >= 0]])
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvconv.check.canary import write_join as wj
from kvconv.emit._arrays import array
from kvconv.format import layout

_EVF = layout.ENUMS["event_flags"]
# a block's label when it wrote more than one way: the worst status wins (outside > unknown cache > unmapped > ...)
_SEVERITY = np.array([0, 1, 3, 5, 4, 2], np.int64)  # by status code: mapped, pad, unmapped, outside, unknown, no-step
STATUS_TEXT = {wj.MAPPED: "mapped slot", wj.PAD: "padding slot", wj.UNMAPPED: "unmapped slot",
               wj.OUTSIDE: "outside every cache", wj.UNKNOWN_CACHE: "unregistered cache", wj.NO_STEP: "no step"}
FLAGGED = {wj.UNMAPPED: "write to an unmapped slot", wj.OUTSIDE: "write outside every cache"}  # name suffixes


def join(c) -> wj.WriteJoin | None:
    """The canary's join of the context's slot_write records (None: none)."""
    return wj.join(c.dump, c.context_id) if wj.has_writes(c.dump, c.context_id) else None


def _block_key(gridid, tag, bx, by, bz) -> np.ndarray:
    """One sortable 16-byte key per block of a launch: (gridid << 20 | tag, blockIdx), big-endian."""
    k = np.empty(len(bx), [("a", ">u8"), ("b", ">u8")])
    k["a"] = wj._launch_keys(gridid, tag)
    k["b"] = (np.asarray(bx).astype(np.uint64) << np.uint64(32)) | (np.asarray(by).astype(np.uint64) << np.uint64(16)) \
        | np.asarray(bz).astype(np.uint64)
    return k.view("V16").reshape(-1)


@dataclass(frozen=True)
class BlockWrites:
    """One row per block (launch and blockIdx) that wrote, sorted by its key: what its events are annotated with."""

    key: np.ndarray  # V16 sorted
    status: np.ndarray  # u1 the block's worst write status
    cache_ix: np.ndarray  # i8 index into ``labels``: the caches it wrote ("L0.k, L0.v")
    page: np.ndarray  # u8 of its lowest slot (valid where has_slot)
    offset: np.ndarray
    slot: np.ndarray  # i8
    has_slot: np.ndarray
    request: np.ndarray  # u8 the request the step maps that slot to (valid where has_request)
    has_request: np.ndarray
    owner: np.ndarray  # u8 the slot's owner (the request whose KV the write lands in; where has_owner)
    has_owner: np.ndarray
    step: np.ndarray  # u8 (valid where has_step)
    has_step: np.ndarray
    writes: np.ndarray  # u8 slot_write records of the block
    labels: list  # cache labels

    @classmethod
    def of(cls, c) -> BlockWrites | None:
        w = join(c)
        return None if w is None or not len(w) else cls.from_join(w)

    @classmethod
    def from_join(cls, w: wj.WriteJoin) -> BlockWrites:
        r = w.records
        key = _block_key(r["gridid"], r["tag"], r["block_x"], r["block_y"], r["block_z"])
        # per block, its records worst status first, then lowest slot: the first record of each block speaks for it
        slot_order = np.where(w.slot >= 0, w.slot, np.iinfo(np.int64).max)
        o = np.lexsort((slot_order, -_SEVERITY[w.status], key))
        ks = key[o]
        head = np.r_[True, ks[1:] != ks[:-1]] if len(ks) else np.zeros(0, bool)
        grp = np.cumsum(head) - 1
        f = o[head]
        names = {int(x["cache_id"]): wj.name(x) for x in w.caches}
        # the caches each block wrote, in cache id order, as one label
        cid = np.where(w.status[o] == wj.OUTSIDE, -1, r["cache_id"][o].astype(np.int64))
        per: list[set] = [set() for _ in range(int(head.sum()))]
        for g, k in zip(grp.tolist(), cid.tolist()):
            per[g].add(k)
        text = [", ".join("outside" if k < 0 else names.get(k, f"cache {k}") for k in sorted(s)) for s in per]
        labels, cache_ix = np.unique(np.array(text, dtype=object), return_inverse=True) if text else ([], np.zeros(0))
        st = w.step_number()
        has_slot = w.slot[f] >= 0
        return cls(key=ks[head], status=w.status[f], cache_ix=np.asarray(cache_ix, np.int64).reshape(-1),
                   page=np.where(has_slot, r["page"][f], 0).astype(np.uint64),
                   offset=np.where(has_slot, r["offset"][f], 0).astype(np.uint64), slot=w.slot[f], has_slot=has_slot,
                   request=w.request[f], has_request=w.has_request[f], owner=w.owner[f], has_owner=w.has_owner[f],
                   step=st[f], has_step=w.step_idx[f] >= 0,
                   writes=np.bincount(grp, minlength=len(f)).astype(np.uint64), labels=[str(x) for x in labels])

    def __len__(self) -> int:
        return len(self.key)

    def lookup(self, recs: np.ndarray) -> np.ndarray:
        """Per device event: its block's row here (-1: the block wrote nothing, or the event carries no gridid)."""
        fl = recs["flags"]
        tag = np.where((fl & _EVF["has_tag"]) != 0, recs["tag"], 0)
        k = _block_key(recs["gridid"], tag, recs["block_x"], recs["block_y"], recs["block_z"])
        i = np.searchsorted(self.key, k)
        hit = (i < len(self.key)) & ((fl & _EVF["has_gridid"]) != 0)
        hit[hit] &= self.key[i[hit]] == k[hit]
        return np.where(hit, i, -1)


def arrow_columns(pa, w: wj.WriteJoin, kernel_names) -> dict:
    """The ``slot_write`` table's columns: the records' fields, then the join (nulls where it found nothing)."""
    r = w.records
    n = len(r)
    outside = w.status == wj.OUTSIDE
    in_cache = w.slot >= 0
    names = {int(x["cache_id"]): wj.name(x) for x in w.caches}
    cols = {k: np.ascontiguousarray(r[k]) for k in r.dtype.names}
    cols["context_id"] = np.full(n, w.context_id, np.uint32)
    cols["record"] = np.arange(n, dtype=np.int64)
    cols["kernel"] = kernel_names(r["kernel_slot"])
    cols["cache"] = array(pa, [names.get(int(k)) if ok else None for k, ok in
                              zip(r["cache_id"].tolist(), in_cache.tolist())], pa.string())
    cols["kv_slot"] = array(pa, w.slot, pa.int64(), mask=~in_cache)
    cols["outside_cache"] = outside
    cols["host_kind"] = w.host_kind
    cols["host_index"] = w.host_index
    cols["replay"] = w.replay
    cols["node_id"] = w.node
    cols["write_step"] = array(pa, w.step_number(), pa.uint64(), mask=w.step_idx < 0)
    cols["request"] = array(pa, w.request, pa.uint64(), mask=~w.has_request)
    cols["slot_owner"] = array(pa, w.owner, pa.uint64(), mask=~w.has_owner)
    cols["slot_owner_step"] = array(pa, w.owner_step, pa.uint64(), mask=~w.has_owner)
    cols["status"] = pa.DictionaryArray.from_arrays(array(pa, w.status.astype(np.int8)),
                                                    array(pa, list(wj.STATUS), pa.string()))
    return cols
