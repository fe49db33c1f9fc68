"""The value probe's fused path for torch CUDA caches: rows digested in place from their byte addresses by the Triton
kernel of :mod:`kvconv.capture.probe._digest_triton` (imported only when a CUDA step is digested), with the same
bits as :func:`kvconv.capture.probe.digest.digest_rows`, so the records are the same as the torch path's.

Per step: before it, the checked slots (one CUDA graph replay, ``_digest_triton.SlotDigests``, that copies the
slots in from pinned memory and adds them to the caches' addresses; launches where no graph could be captured) and
the source rows (one launch, addresses computed on the host); after it, the slots again and the rows handed over;
then one copy back that the step does not wait for (:class:`FusedStep`). Two sets of buffers
(:class:`FusedBuffers`) are taken in turn, so a step's digests can wait to be read while the next step fills the
other set. Rows the kernel cannot address (on the host, unaligned, not contiguous within a row) are returned to the
caller for the torch path. What it costs and why it is built this way: docs/CANARY.md, "The value canary".

    from kvconv.capture.probe import fused
    if fused.kernel() is not None:              # triton imports
        run = fused.FusedStep(fused.kernel(), fused.FusedBuffers(device), capacity, parity=0)
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from kvconv.capture.probe.digest import is_torch, row_bytes
from kvconv.format import layout

_FLAGS = layout.ENUMS["value_digest_flags"]


@functools.cache
def kernel():
    """The launcher (kvconv.capture.probe._digest_triton.digest_addresses), None without triton."""
    try:
        from kvconv.capture.probe import _digest_triton
    except ImportError:
        return None
    return _digest_triton.digest_addresses


def slot_graphs():
    """The fused path's graph of slot digests (kvconv.capture.probe._digest_triton.SlotDigests), None without
    triton."""
    if kernel() is None:
        return None
    from kvconv.capture.probe import _digest_triton

    return _digest_triton.SlotDigests


MIN_SLOTS = 64  # a slot graph's smallest capacity (slots per group): a new one is captured when a step has more


def check_rows(c, rows, tok) -> None:
    """Refuse rows handed over for cache ``c`` that do not cover the step's checked tokens or are not a slot wide."""
    n, k = int(rows.shape[0]), len(tok)
    if k and int(tok[-1]) >= n:
        raise ValueError(f"cache {c.name!r}: {n} rows given for a step mapping token {int(tok[-1])}")
    width = row_bytes(rows)
    if width != c.slot_bytes:
        raise ValueError(f"cache {c.name!r}: a row is {width} bytes, a slot {c.slot_bytes}")


def row_layout(rows, device):
    """(address of row 0, bytes from a row to the next) of torch ``rows`` ([n, ...]) on ``device`` whose every
    row lies contiguous and 8-byte aligned (the K columns of a QKV output, say), else None (the torch path)."""
    if not is_torch(rows) or rows.device != device:
        return None
    shape, strides = rows.shape, rows.stride()
    want = 1
    for size, st in zip(reversed(shape[1:]), reversed(strides[1:])):
        if size != 1 and st != want:
            return None
        want *= size
    if rows.dtype.is_complex and (rows.is_conj() or rows.is_neg()):  # lazily conjugated: not the bytes stored
        return None
    ptr, step = int(rows.data_ptr()), int(strides[0]) * int(rows.element_size())
    return None if ptr % 8 or step % 8 else (ptr, step)


class FusedBuffers:
    """The fused path's buffers, kept across steps (pinned memory costs more to allocate than the digests): per
    phase ("before", "after") pinned host addresses and their device copy, and the device digests with their pinned
    host copy, in two sets (names ending in 0 and 1) that steps take in turn. An event marks the end of the work on
    each pair (its copy and the launches reading it); it is waited for before the pair is used again: the copies
    are asynchronous, and a step that raised may leave its work pending, on a stream the next step may not share (a
    buffer dropped when grown is held by torch's pinned allocator until its copy is done)."""

    def __init__(self, device) -> None:
        import torch

        self.torch, self.device = torch, device
        self.pairs: dict = {}  # name -> [host tensor (pinned), its numpy view, device tensor, event]
        self.graphs: dict = {}  # name -> SlotDigests (or a maker's like), see slot_graph
        self.no_graphs = False  # a capture failed: the slots go by address from then on

    def slot_graph(self, name: str, groups: list, counts: list, make):
        """The slot graph ``name`` (made by ``make(device, groups, caps)``) for a step of ``counts`` slots per
        group: the last one where they fit, else a new one with room for twice as many (None once a capture has
        failed: CUDA graphs are refused inside another capture, say)."""
        old = self.graphs.get(name)
        if old is not None and old.fits(counts):
            return old
        if self.no_graphs:
            return None
        caps = [max(MIN_SLOTS, 1 << max(int(k) - 1, 0).bit_length()) for k in counts]
        if old is not None:
            old.event.synchronize()  # its buffer is freed: nothing of it pending
            caps = [max(c, 2 * o) for c, o in zip(caps, old.caps)]
        try:
            new = make(self.device, [(cids, bases, sb) for _key, sb, cids, bases in groups], caps)
        except Exception:  # noqa: BLE001 - any failure to capture: the address path gives the same digests
            self.no_graphs = True
            self.graphs.pop(name, None)
            return None
        self.graphs[name] = new
        return new

    def get(self, name: str, n: int) -> list:
        """The pair ``name`` of at least ``n`` int64, its host side free to write (its last copy completed)."""
        old = self.pairs.get(name)
        if old is not None:
            old[3].synchronize()
            if old[1].size >= n:
                return old
        torch = self.torch
        size = max(n, 1024, 2 * old[1].size if old is not None else 0)
        host = torch.empty(size, dtype=torch.int64, pin_memory=True)
        new = [host, host.numpy(), torch.empty(size, dtype=torch.int64, device=self.device), torch.cuda.Event()]
        self.pairs[name] = new
        return new

    def copy(self, name: str, n: int, *, to_device: bool):
        """Queue the copy of the first ``n`` words of pair ``name`` (either way); :meth:`mark` it after."""
        host, _np, dev, _ev = self.pairs[name]
        if to_device:
            dev[:n].copy_(host[:n], non_blocking=True)
        else:
            host[:n].copy_(dev[:n], non_blocking=True)
        return dev[:n]

    def mark(self, name: str) -> None:
        """Record pair ``name``'s event after the work queued so far on the current stream."""
        self.pairs[name][3].record(self.torch.cuda.current_stream(self.device))


class FusedStep:
    """One step's digests by the fused kernel: rows given by byte address (``bases [C] + offsets``: [k] or [C, k]
    per group of caches), written straight into the phase's pinned buffer, copied in one go and launched (one
    launch per phase and row width) into one device buffer of int64 digests, copied back once (:meth:`queue_read`)
    and read when that copy is done (:meth:`blocks`). Steps alternate between two sets of buffers (``parity``), so
    that a step's digests can still be waiting to be read while the next step fills the other set."""

    def __init__(self, kernel, bufs: FusedBuffers, capacity: int, parity: int) -> None:
        self.kernel, self.bufs, self.parity = kernel, bufs, str(parity)
        self.digests = "digests" + self.parity
        self.out = bufs.get(self.digests, capacity)[2]
        self.used, self.parts, self.queued, self.waits = 0, [], {}, []

    def slots(self, tag: str, groups: list, memo: dict, slots: np.ndarray, make) -> None:
        """The step's checked slots of every group of caches: digested by one graph replay (``make``: the slot
        graphs' maker, see :meth:`FusedBuffers.slot_graph`), or where there is none queued by address (``base +
        slot * slot_bytes``, one numpy op a group) for the phase's :meth:`launch`."""
        toks = [memo[key][0] for key, *_x in groups]
        graph = None if make is None else self.bufs.slot_graph(tag + self.parity, groups, [len(t) for t in toks],
                                                               make)
        if graph is None:
            for (_key, sb, cids, bases), tok in zip(groups, toks):
                self.add(tag, cids, tok, bases, slots[tok] * sb, sb // 8)
            return
        for (_key, _sb, cids, _b), tok, view in zip(groups, toks, graph.run([slots[t] for t in toks])):
            self.parts.append((tag, cids, tok, view))
        self.waits.append(graph.event)

    def add(self, tag: str, cids: np.ndarray, tok: np.ndarray, bases: np.ndarray, offs: np.ndarray, words: int):
        self.queued.setdefault(words, []).append((tag, cids, tok, bases, offs))

    def launch(self, phase: str) -> None:
        n = sum(len(c) * len(t) for items in self.queued.values() for _tag, c, t, *_x in items)
        assert self.used + n <= len(self.out), "more rows than the step's digest buffer holds"
        if not n:
            self.queued = {}
            return
        phase += self.parity
        host, at, spans = self.bufs.get(phase, n)[1], 0, []
        for words, items in self.queued.items():
            start = at
            for tag, cids, tok, bases, offs in items:  # the addresses, computed in place
                m = len(cids) * len(tok)
                np.add(bases[:, None], offs, out=host[at:at + m].reshape(len(cids), len(tok)))
                self.parts.append((tag, cids, tok, self.used + at))
                at += m
            spans.append((words, start, at))
        dev = self.bufs.copy(phase, n, to_device=True)  # one host -> device copy, then a launch per width
        for words, start, end in spans:
            if end > start:
                self.kernel(dev[start:end], self.out[self.used + start:self.used + end], words)
        self.bufs.mark(phase)
        self.used += n
        self.queued = {}

    def queue_read(self) -> None:
        """Queue the one device -> host copy of the step's digests (after its last launch)."""
        self.bufs.copy(self.digests, self.used, to_device=False)
        self.bufs.mark(self.digests)

    def blocks(self) -> dict:
        """{tag: [(cache ids, checked tokens, digests [C, k] (numpy))]}, in the order queued, once the copy of
        :meth:`queue_read` is done (waited for here). The arrays view the pinned buffer: used before the step after
        next, which fills it again."""
        _t, host, _d, ev = self.bufs.pairs[self.digests]
        ev.synchronize()
        for w in self.waits:  # the slot graphs' (on the stream of their step's phase)
            w.synchronize()
        out: dict = {tag: [] for tag in TAGS}
        for tag, cids, tok, at in self.parts:
            if isinstance(at, int):
                at = host[at:at + len(cids) * len(tok)].reshape(len(cids), len(tok))
            out[tag].append((cids, tok, at))
        return out


TAGS = ("before", "after", "given", "eager", "source")


def slot_groups(caches: list) -> list[tuple]:
    """The watched caches grouped for the fused path, once: per (checked tokens' key, slot width) the cache ids
    and slot-0 addresses (int64 arrays), so that a step's slot addresses are one numpy op per group."""
    groups: dict = {}
    for c in caches:
        groups.setdefault((c.live_key, c.slot_bytes), []).append(c)
    return [(key, sb, np.array([c.cache_id for c in cs], np.int64), np.array([c.base for c in cs], np.int64))
            for (key, sb), cs in groups.items()]


@dataclass(frozen=True)
class RowPlan:
    """How the kernel reads handed-over rows: kept while the same tensors come for the same caches."""

    cache_ids: tuple  # of the items, in order
    rows: list  # the rows tensors (held: their ids cannot be reused)
    ptrs: list  # data_ptr() of the addressable ones (``fast``)
    groups: list  # per (checked tokens' key, slot width): (first item, slot bytes, cache ids, row-0 addresses,
    #               row strides (one int where they agree), the fewest rows of any)
    fast: list  # indices of the items the kernel addresses
    slow: list  # indices of the others (the torch path)

    def fits(self, items) -> bool:
        return (self.cache_ids == tuple(c.cache_id for c, _r, _t in items)
                and all(r is h for (_c, r, _t), h in zip(items, self.rows))
                and self.ptrs == [items[i][1].data_ptr() for i in self.fast])


def row_plan(items, device) -> RowPlan:
    """The :class:`RowPlan` of handed-over rows (``items``: (cache, rows, checked tokens))."""
    groups, fast, slow = {}, [], []
    for i, (c, rows, tok) in enumerate(items):
        check_rows(c, rows, tok)
        at = row_layout(rows, device)
        if at is None:
            slow.append(i)
            continue
        fast.append(i)
        g = groups.setdefault((c.live_key, c.slot_bytes), (i, c.slot_bytes, [], [], [], []))
        for lst, x in zip(g[2:], (c.cache_id, at[0], at[1], int(rows.shape[0]))):
            lst.append(x)
    out = []
    for first, sb, cids, ptrs, steps, ns in groups.values():
        steps = np.asarray(steps, np.int64)
        step = int(steps[0]) if (steps == steps[0]).all() else steps[:, None]
        out.append((first, sb, np.asarray(cids, np.int64), np.asarray(ptrs, np.int64), step, min(ns)))
    ptrs = [int(items[i][1].data_ptr()) for i in fast]
    return RowPlan(tuple(c.cache_id for c, _r, _t in items), [r for _c, r, _t in items], ptrs, out, fast, slow)


def queue_rows(run: FusedStep, tag: str, items, plans: dict) -> list:
    """Queue handed-over rows (``items``: (cache, rows, checked tokens)) that the kernel can address; returns the
    others, for the torch path. Raises as :meth:`ValueProbe._rows_words` does for rows that do not fit.

    ``plans`` (tag -> :func:`row_plan`) keeps the last step's plan: an engine hands the same static graph outputs
    every step, and reading 80 tensors' shapes and strides costs more than the digests. Held, the tensors' ids
    cannot be reused; the plan is kept while the same tensors come for the same caches with the same data_ptr().
    Shape and strides change on the same object only by in-place metadata ops (resize_, as_strided_, t_), which
    nothing does to a graph's outputs (set_ moves the data, which the check sees)."""
    plan = plans.get(tag)
    if plan is None or not plan.fits(items):
        plan = plans[tag] = row_plan(items, run.bufs.device)
    for first, sb, cids, ptrs, step, n in plan.groups:
        tok = items[first][2]
        if len(tok) and int(tok[-1]) >= n:
            for i in plan.fast:
                check_rows(*items[i])  # raises: too few rows
        offs = tok * step if isinstance(step, int) else tok[None, :] * step
        run.add(tag, cids, tok, ptrs, offs, sb // 8)
    return [items[i] for i in plan.slow]


def per_cache(blocks: dict) -> dict:
    """{tag: [(cache ids, tokens, digests [C, k])]} -> {tag: {cache id: digests [k]}} (the torch path's form)."""
    return {tag: {int(cid): row for cids, _tok, m in bl for cid, row in zip(cids, m)} for tag, bl in blocks.items()}


def columns_from_blocks(blocks: dict, before: bool):
    """The records' columns straight from the fused step's blocks, without a loop over caches, where that gives
    what the per-cache path gives: every cache's expected rows from one tag (given, else source) in blocks that
    match the "after" ones, in cache order. Returns (cache ids, tokens, expected, actual, before, flag) or None."""
    tag = "given" if blocks["given"] else "source"
    other = "source" if tag == "given" else "given"
    if blocks["eager"] or blocks[other] or not blocks["after"]:
        return None
    shape = [(c.tolist(), len(t)) for c, t, _m in blocks["after"]]
    sides = [blocks[tag]] + ([blocks["before"]] if before else [])
    if any([(c.tolist(), len(t)) for c, t, _m in bl] != shape for bl in sides):
        return None
    cids = [c for cs, _k in shape for c in cs]
    if any(a >= b for a, b in zip(cids, cids[1:])):  # not in cache order
        return None

    def cat(bl):
        return np.concatenate([m.reshape(-1) for *_x, m in bl])

    return (np.concatenate([np.repeat(c, len(t)) for c, t, _m in blocks["after"]]),
            np.concatenate([np.tile(t, len(c)) for c, t, _m in blocks["after"]]),
            cat(blocks[tag]), cat(blocks["after"]), cat(blocks["before"]) if before else None, _FLAGS[tag])
