"""The value canary's probe (issue 29, mechanism ii: right slot, wrong data): per step and watched cache, for every
slot the step maps, a 64-bit digest of the row the engine meant to write there and of what the slot holds before
and after the step. ``kvconv validate`` compares them (kvconv.check.canary.value; docs/CANARY.md).

    from kvconv.capture.probe.values import ValueProbe
    probe = ValueProbe("run.values.kvdump", metadata={"producer": "my-engine"})   # or a CanaryRecorder: one dump
    probe.watch(k_cache, name="L0.k", page_size=16)         # [num_pages, page_size, ...], contiguous
    with probe.step(step, slot_mapping, request_ids):       # per token: its slot (-1: padding) and request
        probe.expect_values(step, "L0.k", k_rows)           # the rows the engine meant to write, one per token
        graph.replay()
    probe.close()                                           # writes the dump

Where the expected rows come from (the record's flags say which):

- ``given``: rows the caller hands the probe (``expect_values`` or ``step(..., expect={name: rows})``), e.g. the
  K/V the engine computed before copying them into the graph's static source buffer: a buffer not refilled is seen;
- ``source``: the source tensor named at ``watch(..., source=tensor)``, read before the step: the rows the kernel is
  handed (a kernel converting or placing them wrongly is seen, a stale buffer is not);
- ``eager``: ``step(..., eager=fn)``: ``fn(copies)`` runs the step eagerly on copies of the watched caches (a dict
  name -> copy) before the replay; its written slots are the reference.

One digest (:func:`digest_rows`) serves both sides, with numpy arrays (on the host) and torch tensors (on their
device, queued on the current stream; torch is never imported here: a tensor is recognised by its methods). A step
reads the digests back once (one synchronisation; the fused path below reads them at the next step). Rows are
compared bit for bit as stored: give rows in the cache's dtype (after the engine's own conversion), or use the eager
reference.

The fused path (``ValueProbe(fused=...)``; default: where it applies, unless KVCONV_VALUE_FUSED=0): done with torch
ops, a step's digests are ~40 ops (gathers, a stack, the digest's ~20 elementwise int64 ops, a cat), +16 % to
+59 % of a 6.3 ms 40-layer decode step on an H200 (bench/value_digest_cost.py; the goal is 5 %). Where every
watched cache is a torch CUDA tensor on one device with 8-byte aligned slots of a multiple of 8 bytes, a Triton
kernel (:mod:`kvconv.capture.probe._digest_triton`, imported only then) digests rows in place from their byte
addresses: before the step the slots (one CUDA graph replay: it copies the slots in from pinned memory and adds
them to the caches' addresses) and the source rows (one launch, addresses computed on the host), after it the slots
(a replay) and the given rows (a launch), one copy back, which the step does not wait for: the step's records are
made at the next step, once that step's launches are queued (so that the host's work overlaps the device's), or when
the recorder closes. Its host work is kept small, as what comes before the replay adds to every step: the slots by a
graph replay (not a launch: ~65-95 us of Python in Triton's launcher), two sets of buffers reused across steps in
turn (each pinned one written again only once its last copy is done), addresses of the rows handed over one numpy op
per group of caches, their layouts kept while the same tensors come, records built from the digests' blocks with no
loop over caches: +2.3 % to +5.1 % of the step on an H200, +5.0 % to +9.1 % with launches (docs/CANARY.md). Its
digests are the same bits, so the records are too; rows it cannot address (on the host, unaligned, not contiguous
within a row) take the torch path within the same step, and a step with an eager reference takes it whole.

    >>> import numpy as np
    >>> rows = np.arange(12, dtype=np.int16).reshape(3, 4)
    >>> d = digest_rows(rows)
    >>> d.dtype, len(set(d.tolist())), bool((digest_rows(rows[::-1].copy())[::-1] == d).all())
    (dtype('int64'), 3, True)
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import time
from dataclasses import dataclass

import numpy as np

from kvconv.capture.probe.writer import CanaryRecorder, RecorderOwner
from kvconv.format import layout

FLAGS = layout.ENUMS["value_digest_flags"]
_RECORD = layout.DTYPES["value_digest"]
# ValueProbe._record packs the records as 9 little-endian words: 7 of 8 bytes, then cache_id|row, row_bytes|flags
assert [(_RECORD.fields[f][0].str, _RECORD.fields[f][1]) for f in _RECORD.names] == [
    ("<u8", 0), ("<u8", 8), ("<i8", 16), ("<u8", 24), ("<u8", 32), ("<u8", 40), ("<u8", 48), ("<u4", 56),
    ("<u4", 60), ("<u4", 64), ("<u4", 68)] and _RECORD.itemsize == 72, "value_digest's layout changed"
_U64 = 1 << 64


def _i64(x: int) -> int:
    x &= _U64 - 1
    return x - _U64 if x >= 1 << 63 else x


# splitmix64's finaliser constants and the golden-ratio increment, as signed 64-bit values (torch has no uint64
# arithmetic); products and sums wrap modulo 2**64 on both sides
_M1, _M2, _G = _i64(0xBF58476D1CE4E5B9), _i64(0x94D049BB133111EB), _i64(0x9E3779B97F4A7C15)
_MASK = {s: (1 << (64 - s)) - 1 for s in (27, 30, 31)}  # logical right shifts from arithmetic ones


def _is_torch(x) -> bool:
    return hasattr(x, "untyped_storage") and hasattr(x, "data_ptr")


def _width(rows) -> int:
    """Bytes per row of ``rows`` ([n, ...]), also when n is 0."""
    size = int(rows.element_size()) if _is_torch(rows) else int(rows.itemsize)
    return size * math.prod(int(x) for x in rows.shape[1:])


def _mix(z):
    """splitmix64's finaliser on int64 words (numpy or torch): logical shifts as masked arithmetic ones."""
    z = (z ^ ((z >> 30) & _MASK[30])) * _M1
    z = (z ^ ((z >> 27) & _MASK[27])) * _M2
    return z ^ ((z >> 31) & _MASK[31])


def row_words(rows):
    """``rows`` ([n, ...], contiguous, any dtype) as int64 words ``[n, W]``: each row's bytes read as little-endian
    signed words of the widest of 8, 4, 2, 1 bytes that divides the row, widened to int64."""
    n = int(rows.shape[0])
    if _is_torch(rows):
        import torch

        width = _width(rows)
        b = rows.contiguous().view(torch.uint8).reshape(n, width)
        for size, dt in ((8, torch.int64), (4, torch.int32), (2, torch.int16), (1, torch.int8)):
            if width % size == 0:
                w = b.view(dt)
                return w if dt == torch.int64 else w.to(torch.int64)
    width = _width(rows)
    b = np.ascontiguousarray(rows).view(np.uint8).reshape(n, width)
    for size, dt in ((8, np.int64), (4, np.int32), (2, np.int16), (1, np.int8)):
        if width % size == 0:
            return b.view(dt).astype(np.int64, copy=False)
    raise AssertionError("unreachable")  # pragma: no cover


def digest_words(words):
    """The digest of each row of int64 words ``[n, W]`` (numpy or torch): ``mix(sum_i mix(w_i + i*G) ^ W*G)``, all
    wrapping 64-bit; int64 ``[n]`` on the words' device. Position-keyed, so swapped words change it."""
    width = int(words.shape[1])
    if _is_torch(words):
        import torch

        pos = torch.arange(width, dtype=torch.int64, device=words.device) * _G
        h = _mix(words + pos).sum(dim=1, dtype=torch.int64)
    else:
        with np.errstate(over="ignore"):
            pos = np.arange(width, dtype=np.int64) * np.int64(_G)
            h = _mix(words + pos).sum(axis=1, dtype=np.int64)
    return _mix(h ^ _i64(width * _G))


def digest_rows(rows):
    """One 64-bit digest (int64) per row of ``rows`` ([n, ...]; numpy or torch): the one digest function of the
    value canary, the expected and the written side alike."""
    if _is_torch(rows):
        return digest_words(row_words(rows))
    with np.errstate(over="ignore"):
        return digest_words(row_words(rows))


def _host(x, dtype) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().reshape(-1).cpu().numpy()
    return np.ascontiguousarray(np.asarray(x).reshape(-1), dtype=dtype)


def _word_chunks(rows: dict) -> list[tuple[list, object, int]]:
    """{key: bytes [k, row_bytes]} -> chunks [(keys, int64 words [len(keys) * k, W], k)]: rows of one shape on one
    device stacked (a copy: taken before a step, they keep what the slots held)."""
    groups: dict = {}
    for key, r in rows.items():
        dev = str(r.device) if _is_torch(r) else None
        groups.setdefault((dev, tuple(r.shape)), []).append(key)
    out = []
    for (dev, shape), keys in groups.items():
        if not shape[0]:  # no token checked in these caches
            out.append((keys, None, 0))
            continue
        if dev is not None:
            import torch

            stacked = torch.stack([rows[k] for k in keys])
        else:
            stacked = np.stack([rows[k] for k in keys])
        out.append((keys, row_words(stacked.reshape(len(keys) * shape[0], shape[1])), int(shape[0])))
    return out


def _digest_all(tagged: dict) -> dict:
    """{tag: word chunks} -> {tag: [(keys, digests [len(keys), k])]}: the words of a whole step (before, after,
    expected) of one width on one device concatenated and digested in one pass."""
    out: dict = {tag: [] for tag in tagged}
    groups: dict = {}
    for tag, chunks in tagged.items():
        for keys, words, k in chunks:
            if not k:
                out[tag].append((keys, np.zeros((len(keys), 0), np.int64)))
                continue
            dev = str(words.device) if _is_torch(words) else None
            groups.setdefault((dev, int(words.shape[1])), []).append((tag, keys, words, k))
    for (dev, _w), items in groups.items():
        if dev is not None:
            import torch

            d = digest_words(torch.cat([w for _t, _k, w, _n in items]) if len(items) > 1 else items[0][2])
        else:
            with np.errstate(over="ignore"):
                d = digest_words(np.concatenate([w for _t, _k, w, _n in items]))
        at = 0
        for tag, keys, _words, k in items:
            m = len(keys) * k
            out[tag].append((keys, d[at:at + m].reshape(len(keys), k)))
            at += m
    return out


def _read_back(tagged: dict) -> dict:
    """{tag: chunks} -> {tag: {key: int64 digests (numpy)}}: every chunk on the host, torch ones in one copy."""
    flat = [(tag, keys, m) for tag, chunks in tagged.items() for keys, m in chunks]
    mats = [m for *_x, m in flat]
    if any(_is_torch(m) for m in mats):
        import torch

        dev = next(m.device for m in mats if _is_torch(m))
        parts = [(m if _is_torch(m) else torch.from_numpy(np.asarray(m, np.int64))).to(dev).reshape(-1) for m in mats]
        host = torch.cat(parts).cpu().numpy() if parts else np.zeros(0, np.int64)
        sizes = [int(m.numel()) for m in mats]
    else:
        host = np.concatenate([np.asarray(m, np.int64).reshape(-1) for m in mats]) if mats else np.zeros(0, np.int64)
        sizes = [int(m.size) for m in mats]
    out: dict = {tag: {} for tag in tagged}
    at = 0
    for (tag, keys, _m), n in zip(flat, sizes):
        block = host[at:at + n].reshape(len(keys), -1)
        at += n
        out[tag].update(zip(keys, block))
    return out


class _Cache:
    """A watched cache: its slots as byte rows ``[num_slots, slot_bytes]`` (a view), its id and name."""

    def __init__(self, cache, *, name: str, cache_id: int, page_size: int, slot_bytes: int | None, source) -> None:
        self.tensor, self.name, self.cache_id, self.page_size = cache, name, cache_id, int(page_size)
        self.torch = _is_torch(cache)
        nbytes = int(cache.numel()) * int(cache.element_size()) if self.torch else int(cache.nbytes)
        contiguous = cache.is_contiguous() if self.torch else cache.flags["C_CONTIGUOUS"]
        if not contiguous:
            raise ValueError(f"cache {name!r}: not contiguous")
        slots = int(cache.shape[0]) * self.page_size
        if slot_bytes is None:
            if slots <= 0 or nbytes % slots:
                raise ValueError(f"cache {name!r}: {nbytes} bytes do not split into {slots} slots of equal size")
            slot_bytes = nbytes // slots
        self.slot_bytes, self.num_slots = int(slot_bytes), nbytes // int(slot_bytes)
        flat = cache.reshape(-1)
        if self.torch:
            import torch

            flat = flat.view(torch.uint8)[: self.num_slots * self.slot_bytes]
        else:
            flat = flat.view(np.uint8)[: self.num_slots * self.slot_bytes]
        self.rows = flat.reshape(self.num_slots, self.slot_bytes)  # bytes per slot (a view)
        self.base = int(cache.data_ptr()) if self.torch else int(cache.ctypes.data)
        self.live_key = (self.num_slots, str(cache.device) if self.torch else None)  # caches sharing slot indices
        self.source = source

    def gather(self, slots):
        """The slots' rows (bytes ``[k, slot_bytes]``, a copy) of this cache."""
        return self.rows.index_select(0, slots) if self.torch else self.rows[slots]


def _pools(caches: list[_Cache]) -> list[tuple[list[_Cache], object]]:
    """The torch caches that share one storage and one slot width (two or more, int64-aligned): per storage, the
    caches and (flat int64 words of the storage, word offset of each cache's slot 0, words per slot, their arange),
    for one gather across all of them (the K and V caches of every layer as views of one pool, say)."""
    by = {}
    for c in caches:
        if c.torch and c.slot_bytes % 8 == 0:
            st = c.tensor.untyped_storage()
            by.setdefault((st.data_ptr(), str(c.tensor.device), c.slot_bytes), (st, []))[1].append(c)
    out = []
    for (ptr, _dev, sb), (st, cs) in by.items():
        offs = [c.base - ptr for c in cs]
        if len(cs) < 2 or any(o % 8 for o in offs) or st.nbytes() % 8:
            continue
        import torch

        try:  # the whole storage as int64 words (a view)
            flat = torch.empty(0, dtype=torch.uint8, device=cs[0].tensor.device).set_(st).view(torch.int64)
        except (RuntimeError, TypeError):  # pragma: no cover - a storage torch will not view: one gather per cache
            continue
        out.append((cs, (flat, torch.tensor([o // 8 for o in offs], dtype=torch.int64, device=flat.device),
                         sb // 8, torch.arange(sb // 8, device=flat.device))))
    return out


@functools.cache
def _kernel():
    """The fused path's launcher (kvconv.capture.probe._digest_triton.digest_addresses), None without triton."""
    try:
        from kvconv.capture.probe import _digest_triton
    except ImportError:
        return None
    return _digest_triton.digest_addresses


def _slot_graphs():
    """The fused path's graph of slot digests (kvconv.capture.probe._digest_triton.SlotDigests), None without
    triton."""
    if _kernel() is None:
        return None
    from kvconv.capture.probe import _digest_triton

    return _digest_triton.SlotDigests


_MIN_SLOTS = 64  # a slot graph's smallest capacity (slots per group): a new one is captured when a step has more


def _check_rows(c: _Cache, rows, tok) -> None:
    """Refuse rows handed over for cache ``c`` that do not cover the step's checked tokens or are not a slot wide."""
    n, k = int(rows.shape[0]), len(tok)
    if k and int(tok[-1]) >= n:
        raise ValueError(f"cache {c.name!r}: {n} rows given for a step mapping token {int(tok[-1])}")
    width = _width(rows)
    if width != c.slot_bytes:
        raise ValueError(f"cache {c.name!r}: a row is {width} bytes, a slot {c.slot_bytes}")


def _row_layout(rows, device):
    """(address of row 0, bytes from a row to the next) of torch ``rows`` ([n, ...]) on ``device`` whose every
    row lies contiguous and 8-byte aligned (the K columns of a QKV output, say), else None (the torch path)."""
    if not _is_torch(rows) or rows.device != device:
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


class _FusedBuffers:
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
        caps = [max(_MIN_SLOTS, 1 << max(int(k) - 1, 0).bit_length()) for k in counts]
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


class _FusedStep:
    """One step's digests by the fused kernel: rows given by byte address (``bases [C] + offsets``: [k] or [C, k]
    per group of caches), written straight into the phase's pinned buffer, copied in one go and launched (one
    launch per phase and row width) into one device buffer of int64 digests, copied back once (:meth:`queue_read`)
    and read when that copy is done (:meth:`blocks`). Steps alternate between two sets of buffers (``parity``), so
    that a step's digests can still be waiting to be read while the next step fills the other set."""

    def __init__(self, kernel, bufs: _FusedBuffers, capacity: int, parity: int) -> None:
        self.kernel, self.bufs, self.parity = kernel, bufs, str(parity)
        self.digests = "digests" + self.parity
        self.out = bufs.get(self.digests, capacity)[2]
        self.used, self.parts, self.queued, self.waits = 0, [], {}, []

    def slots(self, tag: str, groups: list, memo: dict, slots: np.ndarray, make) -> None:
        """The step's checked slots of every group of caches: digested by one graph replay (``make``: the slot
        graphs' maker, see :meth:`_FusedBuffers.slot_graph`), or where there is none queued by address (``base +
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
        out: dict = {tag: [] for tag in _TAGS}
        for tag, cids, tok, at in self.parts:
            if isinstance(at, int):
                at = host[at:at + len(cids) * len(tok)].reshape(len(cids), len(tok))
            out[tag].append((cids, tok, at))
        return out


_TAGS = ("before", "after", "given", "eager", "source")


def _slot_groups(caches: list[_Cache]) -> list[tuple]:
    """The watched caches grouped for the fused path, once: per (checked tokens' key, slot width) the cache ids
    and slot-0 addresses (int64 arrays), so that a step's slot addresses are one numpy op per group."""
    groups: dict = {}
    for c in caches:
        groups.setdefault((c.live_key, c.slot_bytes), []).append(c)
    return [(key, sb, np.array([c.cache_id for c in cs], np.int64), np.array([c.base for c in cs], np.int64))
            for (key, sb), cs in groups.items()]


@dataclass(frozen=True)
class _RowPlan:
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


def _row_plan(items, device) -> _RowPlan:
    """The :class:`_RowPlan` of handed-over rows (``items``: (cache, rows, checked tokens))."""
    groups, fast, slow = {}, [], []
    for i, (c, rows, tok) in enumerate(items):
        _check_rows(c, rows, tok)
        at = _row_layout(rows, device)
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
    return _RowPlan(tuple(c.cache_id for c, _r, _t in items), [r for _c, r, _t in items], ptrs, out, fast, slow)


def _queue_rows(run: _FusedStep, tag: str, items, plans: dict) -> list:
    """Queue handed-over rows (``items``: (cache, rows, checked tokens)) that the kernel can address; returns the
    others, for the torch path. Raises as :meth:`ValueProbe._rows_words` does for rows that do not fit.

    ``plans`` (tag -> :func:`_row_plan`) keeps the last step's plan: an engine hands the same static graph outputs
    every step, and reading 80 tensors' shapes and strides costs more than the digests. Held, the tensors' ids
    cannot be reused; the plan is kept while the same tensors come for the same caches with the same data_ptr().
    Shape and strides change on the same object only by in-place metadata ops (resize_, as_strided_, t_), which
    nothing does to a graph's outputs (set_ moves the data, which the check sees)."""
    plan = plans.get(tag)
    if plan is None or not plan.fits(items):
        plan = plans[tag] = _row_plan(items, run.bufs.device)
    for first, sb, cids, ptrs, step, n in plan.groups:
        tok = items[first][2]
        if len(tok) and int(tok[-1]) >= n:
            for i in plan.fast:
                _check_rows(*items[i])  # raises: too few rows
        offs = tok * step if isinstance(step, int) else tok[None, :] * step
        run.add(tag, cids, tok, ptrs, offs, sb // 8)
    return [items[i] for i in plan.slow]


def _per_cache(blocks: dict) -> dict:
    """{tag: [(cache ids, tokens, digests [C, k])]} -> {tag: {cache id: digests [k]}} (the torch path's form)."""
    return {tag: {int(cid): row for cids, _tok, m in bl for cid, row in zip(cids, m)} for tag, bl in blocks.items()}


def _columns_from_blocks(blocks: dict, before: bool):
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
            cat(blocks[tag]), cat(blocks["after"]), cat(blocks["before"]) if before else None, FLAGS[tag])


class ValueProbe(RecorderOwner):
    """Watches caches and records, per step, the digests of every mapped slot (see the module docstring).

    ``out``: a dump path (a :class:`~kvconv.capture.probe.writer.CanaryRecorder` is made for it) or a recorder
    shared with the location canary (one dump for both). ``before=False`` skips the digest of the slots before the
    step (cheaper; a slot not written then reads as a wrong value). ``timings``: per step, host ns spent by the probe
    before the step and after it (on the torch path the second includes waiting for the step's work on the device;
    the fused path does not wait: a step's digests are read, and its records made, at the next step, once that
    step's launches are queued, or when the recorder closes, and counted in that step's second figure). ``fused``: the
    Triton path for torch CUDA caches (module docstring): None where it applies and triton imports, unless the
    environment has KVCONV_VALUE_FUSED=0 (read here); False never; True where it applies, an error without triton.
    The records are the same either way; ``fused_steps`` counts the steps it took. ``graphs``: on the fused path,
    the slots' digests before and after the step by one CUDA graph replay each (made at the first step and again
    when a step maps more slots than it holds; the host writes the slots into pinned memory and reads the digests
    out of it), instead of a Triton launch each, whose ~65-95 us of host work before the replay add to every step;
    False, or KVCONV_VALUE_GRAPHS=0 in the environment: launches.
    """

    def __init__(self, out, *, metadata: dict | None = None, context_id: int = 0, device_id: int = 0,
                 before: bool = True, fused: bool | None = None, graphs: bool = True) -> None:
        if isinstance(out, (str, os.PathLike)):
            out = CanaryRecorder(out, context_id=context_id, device_id=device_id, metadata=metadata)
        self.recorder = out
        self.before = before
        self.fused = False if fused is None and os.environ.get("KVCONV_VALUE_FUSED") == "0" else fused
        self.graphs = graphs and os.environ.get("KVCONV_VALUE_GRAPHS") != "0"
        self.fused_steps = 0
        self._fused_dev = None  # (device or None) once decided for the watched caches
        self._fused = None  # (_FusedBuffers, _slot_groups, row plans, slot graphs' maker or None), with _fused_dev
        self.caches: list[_Cache] = []
        self._reps: list[_Cache] = []  # see watch
        self._sourced: list[_Cache] = []
        self._slot_bytes = np.zeros(0, np.int64)
        self._words = np.empty((9, 0), "<u8")  # _record's scratch
        self.timings: list[tuple[int, int]] = []
        self._expect: dict[int, tuple[int, object]] = {}  # cache id -> (step, rows)
        self._step: int | None = None
        self._plan = None  # _pools of the watched caches
        self._by_name: dict[str, _Cache] = {}
        self._pending = None  # the last fused step, its records not made yet (_flush)
        out.add_flusher(self._flush)
        self.steps = 0

    def watch(self, cache, *, name: str, page_size: int, slot_bytes: int | None = None, source=None) -> int:
        """Watch a KV cache shaped ``[num_pages, page_size, ...]`` (contiguous; numpy or torch): slot ``s`` is its
        ``s``-th row of ``slot_bytes`` (default: its bytes over ``num_pages * page_size``). ``source``: the tensor
        of rows the kernel writes from (``[tokens, ...]``, one row per token of a step), digested before each step
        where no rows are given. Returns the cache id its records carry."""
        if any(c.name == name for c in self.caches):
            raise ValueError(f"cache {name!r} is watched already")
        c = _Cache(cache, name=name, cache_id=len(self.caches), page_size=page_size, slot_bytes=slot_bytes,
                   source=source)
        self.caches.append(c)
        self._slot_bytes = np.array([x.slot_bytes for x in self.caches], np.int64)  # by cache id, for _record
        self._by_name[name] = c
        self._plan = self._fused_dev = self._fused = None
        self._reps = list({x.live_key: x for x in self.caches}.values())  # a cache per live key
        self._sourced = [x for x in self.caches if x.source is not None]
        self.recorder.add_cache(cache_id=c.cache_id, name=name, base=c.base, size=c.num_slots * c.slot_bytes,
                                slot_bytes=c.slot_bytes, page_size=c.page_size)
        return c.cache_id

    def _cache(self, which) -> _Cache:
        c = self._by_name.get(which) if isinstance(which, str) else None
        if c is None and isinstance(which, int) and 0 <= which < len(self.caches):
            c = self.caches[which]
        if c is None:
            c = next((x for x in self.caches if which is x.tensor), None)
        if c is None:
            raise KeyError(f"no watched cache {which!r}")
        return c

    def expect_values(self, step: int, cache, rows) -> None:
        """The rows the engine means ``step`` to write into ``cache`` (its name, id or tensor): ``[tokens, ...]``,
        row ``i`` for token ``i`` of the step's slot mapping, each row as many bytes as a slot (the cache's dtype).
        Call before the step's block ends."""
        c = self._cache(cache)
        self._expect[c.cache_id] = (int(step), rows)

    @contextlib.contextmanager
    def step(self, step: int, slot_mapping, request_ids=None, *, pad=None, expect: dict | None = None, eager=None):
        """Record one step around its launches: token ``i`` maps to ``slot_mapping[i]`` for request
        ``request_ids[i]``; ``pad`` marks padding rows (default: negative slots), which are not checked.
        ``expect``: {cache name: rows} as :meth:`expect_values`; ``eager``: a callable run before the step on
        copies of the watched caches (a dict name -> copy), whose written slots are then the expected rows."""
        slots = _host(slot_mapping, np.int64)
        reqs = np.zeros(len(slots), np.uint64) if request_ids is None else _host(request_ids, np.uint64)
        pads = None if pad is None else _host(pad, bool)  # None: the negative slots
        if len(reqs) != len(slots) or (pads is not None and len(pads) != len(slots)):
            raise ValueError(f"step {step}: {len(slots)} slots, {len(reqs)} request ids, "
                             f"{len(slots) if pads is None else len(pads)} pad flags")
        self._step = st = int(step)
        for name, rows in (expect or {}).items():  # as expect_values (inline: 80 caches a step)
            c = self._by_name.get(name) if isinstance(name, str) else None
            self._expect[(c or self._cache(name)).cache_id] = (st, rows)
        t0 = time.perf_counter_ns()
        dev = self._fused_device() if eager is None else None
        memo: dict = {}
        for c in self._reps:  # the checked tokens, once per live key
            self._live(c, slots, pads, memo, dev is None)
        run = live = None  # the fused path lists every cache's tokens after the replay is queued
        if dev is not None:
            capacity = 4 * sum(len(cids) * len(memo[key][0]) for key, _sb, cids, _b in self._fused[1])
            run = _FusedStep(_kernel(), self._fused[0], capacity, self.fused_steps % 2)
            chunks = self._fused_before(run, memo, slots)
        else:
            live = [(c, memo[c.live_key]) for c in self.caches]
            chunks = self._before(live, eager)
        t1 = time.perf_counter_ns()
        try:
            yield self
        except BaseException:
            self._expect.clear()
            self._step = None
            raise
        t2 = time.perf_counter_ns()
        if live is None:
            live = [(c, memo[c.live_key]) for c in self.caches]
        exp = self._expect
        given = [(c, e[1], tok) for c, (tok, _i) in live if (e := exp.get(c.cache_id)) is not None and e[0] == st]
        cols = None
        if run is None:
            chunks["after"] = self._gather(live)
            chunks["given"] = self._rows_words(given)
            host = _read_back(_digest_all(chunks))  # the step's one digest pass and one synchronisation
            self._flush()
            cols = self._columns(live, host)
        elif self._fused_after(run, memo, slots, given, chunks):
            self._flush()  # the step before's records, while this step runs on the device
            # this step's: at the next step or at close (the rows given stay referenced until their digests are read)
            self._pending = (run, st, slots, reqs, live, chunks, time.monotonic_ns(), given)
        else:
            self._flush()
            cols = self._fused_columns(run, live, chunks)
        if cols is not None:
            self._record(st, slots, reqs, *cols, host_ns=time.monotonic_ns())
        self._expect.clear()
        self._step = None
        self.steps += 1
        self.fused_steps += run is not None
        self.timings.append((t1 - t0, time.perf_counter_ns() - t2))

    def _before(self, live, eager) -> dict:
        """The torch/numpy path before the step: only copies are taken (the slots, the source rows, the eager run's
        slots); every digest of the step is made after it, in one pass."""
        chunks: dict = {"before": self._gather(live) if self.before else []}
        chunks["source"] = self._rows_words([(c, c.source, tok) for c, (tok, _) in live if c.source is not None])
        chunks["eager"] = []
        if eager is not None:
            copies = {c.name: (c.tensor.clone() if c.torch else c.tensor.copy()) for c in self.caches}
            eager(copies)
            chunks["eager"] = _word_chunks({c.cache_id: _Cache(copies[c.name], name=c.name, cache_id=c.cache_id,
                                                               page_size=c.page_size, slot_bytes=c.slot_bytes,
                                                               source=None).gather(idx) for c, (_, idx) in live})
        return chunks

    def _fused_device(self):
        """The CUDA device of the watched caches where the fused path applies to them (decided once), else None."""
        if self._fused_dev is None:
            cs, dev = self.caches, False
            if self.fused is not False and cs and all(c.torch and c.tensor.is_cuda and c.slot_bytes % 8 == 0
                                                      and c.base % 8 == 0 for c in cs):
                devs = {c.tensor.device for c in cs}
                if len(devs) == 1 and _kernel() is not None:
                    dev = devs.pop()
                elif len(devs) == 1 and self.fused:
                    raise RuntimeError("ValueProbe(fused=True): triton cannot be imported")
            self._fused_dev = dev
            if dev:
                self._fused = (_FusedBuffers(dev), _slot_groups(cs), {}, _slot_graphs() if self.graphs else None)
        return self._fused_dev or None

    def _fused_before(self, run: _FusedStep, memo: dict, slots: np.ndarray) -> dict:
        """Before the step: a graph replay (or a launch) digests the checked slots (unless ``before=False``), a
        launch the source rows in place; source rows the kernel cannot address are copied for the torch path
        (returned as chunks)."""
        _bufs, groups, layouts, graphs = self._fused
        if self.before:
            run.slots("before", groups, memo, slots, graphs)
        src = [(c, c.source, memo[c.live_key][0]) for c in self._sourced]
        slow = _queue_rows(run, "source", src, layouts) if src else []
        run.launch("before")
        return {"source": self._rows_words(slow)}

    def _fused_after(self, run: _FusedStep, memo: dict, slots: np.ndarray, given: list, chunks: dict) -> bool:
        """After the step: a graph replay (or a launch) over the slots, a launch over the given rows, the copy back
        queued. Rows the kernel cannot address go the torch path (into ``chunks``). Returns whether the kernels made
        every digest of the step (then the records can wait for the next step: :meth:`_flush`)."""
        _bufs, groups, layouts, graphs = self._fused
        run.slots("after", groups, memo, slots, graphs)
        chunks["given"] = self._rows_words(_queue_rows(run, "given", given, layouts))
        run.launch("after")
        run.queue_read()
        return not any(chunks.values())

    def _fused_columns(self, run: _FusedStep, live, chunks: dict):
        """The records' columns of a fused step (waiting for its copy back): straight from the kernel's blocks
        where they allow, else per cache, with the torch path's digests of ``chunks`` merged in."""
        blocks = run.blocks()
        if not any(chunks.values()):
            cols = _columns_from_blocks(blocks, self.before)
            if cols is not None:
                return cols
        host = _per_cache(blocks)
        if any(chunks.values()):
            for tag, got in _read_back(_digest_all(chunks)).items():
                host[tag].update(got)
        return self._columns(live, host)

    def _flush(self) -> None:
        """Make the records of the fused step left pending (the last one, if its digests all came from the
        kernel): called at the next step, once that step's launches are queued, so that this host work overlaps
        the device's, and when the recorder closes. Keeps the records in step order."""
        pending, self._pending = self._pending, None
        if pending is not None:
            run, step, slots, reqs, live, chunks, ns, _given = pending
            cols = self._fused_columns(run, live, chunks)
            if cols is not None:
                self._record(step, slots, reqs, *cols, host_ns=ns)

    def _live(self, c: _Cache, slots: np.ndarray, pads: np.ndarray | None, memo: dict, index: bool = True):
        """Token indices (host) of the step's checked rows in cache ``c`` and their slots (on the cache's device;
        not for the fused path: ``index=False``, None), made once per step for every cache of one size on one
        device."""
        key = c.live_key
        if key not in memo:
            ok = slots.view(np.uint64) < c.num_slots  # a negative slot reads as one past every cache's
            tok = np.flatnonzero(ok if pads is None else ok & ~pads)
            if not index:
                memo[key] = tok, None
            elif c.torch:
                import torch

                memo[key] = tok, torch.as_tensor(slots[tok], dtype=torch.int64).to(c.tensor.device, non_blocking=True)
            else:
                memo[key] = tok, slots[tok]
        return memo[key]

    def _gather(self, live) -> list[tuple[list, object, int]]:
        """Every cache's slots of the step as word chunks (copies): torch caches sharing one storage in one
        gather, the others one gather each."""
        if self._plan is None:  # which caches share a storage: found once
            self._plan = _pools(self.caches)
        where = dict(live)
        out, done = [], set()
        for cs, (flat, base, w, words) in self._plan:
            toks = [where[c][0] for c in cs]
            if len({len(t) for t in toks}) != 1 or not len(toks[0]):
                continue
            import torch

            i0 = where[cs[0]][1]
            if all(where[c][1] is i0 for c in cs):  # caches of one size: one slot index for all (no copy)
                idx = i0.unsqueeze(0).expand(len(cs), -1)
            else:
                idx = torch.stack([where[c][1] for c in cs])  # [C, k] slots
            at = (base[:, None, None] + idx[:, :, None] * w + words).reshape(-1)
            out.append(([c.cache_id for c in cs], flat.index_select(0, at).reshape(-1, w), len(toks[0])))
            done.update(c.cache_id for c in cs)
        out += _word_chunks({c.cache_id: c.gather(idx) for c, (_t, idx) in live if c.cache_id not in done})
        return out

    def _rows_words(self, items) -> list[tuple[list, object, int]]:
        """The rows handed over for caches (``items``: (cache, rows [tokens, ...], checked tokens)) as word chunks:
        the rows of one shape and dtype on one device stacked (a copy), the checked tokens taken (per cache only the
        references are collected: a step's 80 caches cost one stack)."""
        groups: dict = {}
        for c, rows, tok in items:
            t = _is_torch(rows)
            key = (t, rows.device if t else None, rows.dtype, rows.shape, c.slot_bytes, id(tok))
            g = groups.setdefault(key, ([], [], tok))
            g[0].append(c)
            g[1].append(rows)
        out = []
        for (t, _dev, _dt, shape, sb, _id), (cs, rl, tok) in groups.items():
            n, k = int(shape[0]), len(tok)
            _check_rows(cs[0], rl[0], tok)
            if not k:
                out.append(([c.cache_id for c in cs], None, 0))
                continue
            if t:
                import torch

                st = torch.stack(rl)  # [G, n, ...], contiguous (strided rows, a QKV output's K columns, are fine)
                if k != n:
                    st = st.index_select(1, torch.as_tensor(tok, dtype=torch.int64).to(st.device))
                b = st.view(torch.uint8).reshape(len(cs) * k, sb)
            else:
                st = np.stack([np.asarray(r) for r in rl])
                b = np.ascontiguousarray(st if k == n else st[:, tok]).view(np.uint8).reshape(len(cs) * k, sb)
            out.append(([c.cache_id for c in cs], row_words(b), k))
        return out

    def _columns(self, live, host: dict):
        """The records' columns from per-cache digests: expected from the rows given, else the eager reference,
        else the source tensor; a cache with none of them is not checked. (cache ids, tokens, expected, actual,
        before or None, flags), or None where no cache is checked."""
        order = [("given", FLAGS["given"]), ("eager", FLAGS["eager"]), ("source", FLAGS["source"])]
        picked = []
        for c, (tok, _idx) in live:
            for tag, flag in order:
                if c.cache_id in host[tag]:
                    picked.append((c, tok, host[tag][c.cache_id], flag))
                    break
        if not picked:
            return None
        lens = [len(t) for _c, t, _e, _f in picked]
        before = np.concatenate([host["before"][c.cache_id] for c, *_x in picked]) if self.before else None
        return (np.repeat([c.cache_id for c, *_x in picked], lens), np.concatenate([t for _c, t, _e, _f in picked]),
                np.concatenate([e for *_x, e, _f in picked]),
                np.concatenate([host["after"][c.cache_id] for c, *_x in picked]), before,
                np.repeat([f for *_x, f in picked], lens))

    def _record(self, step, slots, reqs, cids, tok, expected, actual, before, flags, *, host_ns: int) -> None:
        """The step's value_digest records, one array (a record per checked token and cache, in cache order). The
        columns are written as rows of one [9, n] matrix of little-endian words (contiguous) and transposed into
        the records once: assigning 11 strided fields of 5,120 records one by one costs twice as much. The matrix
        is kept across steps (fresh memory costs its page faults, ~as much as the writes)."""
        n = len(tok)
        if self._words.shape[1] < n:
            self._words = np.empty((9, max(n, 2 * self._words.shape[1])), "<u8")
        m = self._words[:, :n]
        m[0], m[1] = int(step), host_ns
        m[2], m[3] = slots[tok].view(np.uint64), reqs[tok]
        m[4], m[5] = expected.view(np.uint64), actual.view(np.uint64)
        flags = np.asarray(flags, np.uint64)
        if before is not None:
            m[6] = before.view(np.uint64)
        else:
            m[6], flags = 0, flags | FLAGS["no_before"]
        m[7] = cids.astype(np.uint64) | (tok.astype(np.uint64) << np.uint64(32))  # cache_id, row: u4 each
        m[8] = self._slot_bytes[cids].astype(np.uint64) | (flags << np.uint64(32))  # row_bytes, flags
        r = np.ascontiguousarray(m.T).view(_RECORD).reshape(n)
        self.recorder.add_records("value_digest", r)
