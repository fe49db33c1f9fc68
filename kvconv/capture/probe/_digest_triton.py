"""The value canary's digest (:func:`kvconv.capture.probe.digest.digest_words`) as one Triton kernel over rows named
by their byte addresses: the probe's fused path for torch CUDA caches (see ``ValueProbe``). Each row is read in
place as ``words`` little-endian int64 words (8-byte aligned; rows of a multiple of 8 bytes, where ``row_words``
reads int64 words too), so the digests equal ``digest_rows`` bit for bit, without a gather or a stack.

Imported by :mod:`kvconv.capture.probe.fused` only when a CUDA step is digested (importing triton takes a while;
the first launch of a width compiles). The arithmetic is :mod:`kvconv.capture.probe.digest`'s: signed int64,
wrapping products and sums, logical right shifts as masked arithmetic ones.
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

from kvconv.capture.probe import digest

# Triton reads only constexpr globals inside a kernel
G, M1, M2 = tl.constexpr(digest.G), tl.constexpr(digest.M1), tl.constexpr(digest.M2)
MASK27, MASK30, MASK31 = tl.constexpr(digest.MASK[27]), tl.constexpr(digest.MASK[30]), tl.constexpr(digest.MASK[31])


@triton.jit
def _mix(z):
    z = (z ^ ((z >> 30) & MASK30)) * M1
    z = (z ^ ((z >> 27) & MASK27)) * M2
    return z ^ ((z >> 31) & MASK31)


@triton.jit
def _row_digest(base, words, wg, BLOCK: tl.constexpr):
    """``mix(sum_i mix(w_i + i*G) ^ wg)`` over the ``words`` int64 words at ``base`` (an int64 pointer)."""
    acc = tl.zeros([BLOCK], dtype=tl.int64)
    for start in range(0, words, BLOCK):
        i = start + tl.arange(0, BLOCK)
        inside = i < words
        w = tl.load(base + i, mask=inside, other=0)
        acc += tl.where(inside, _mix(w + i.to(tl.int64) * G), 0)
    return _mix(tl.sum(acc, axis=0) ^ wg)


@triton.jit
def _digest_kernel(addr_ptr, out_ptr, words, wg, BLOCK: tl.constexpr):
    """One program per row: ``out[r]`` = the digest of the ``words`` int64 words at ``addr[r]`` (``wg``:
    ``words * G``, wrapped)."""
    row = tl.program_id(0)
    base = tl.load(addr_ptr + row).to(tl.pointer_type(tl.int64))
    tl.store(out_ptr + row, _row_digest(base, words, wg, BLOCK))


@triton.jit
def _slot_kernel(buf_ptr, bases_ptr, count_at, slots_at, out_at, slot_bytes, words, wg, BLOCK: tl.constexpr):
    """Program (t, c): ``buf[out_at + c*n + t]`` = the digest of slot ``buf[slots_at + t]`` of cache ``c`` (slot 0
    at ``bases[c]``), for ``t < n = buf[count_at]``; the other programs do nothing."""
    t = tl.program_id(0)
    c = tl.program_id(1)
    n = tl.load(buf_ptr + count_at)
    if t < n:
        slot = tl.load(buf_ptr + slots_at + t)
        base = (tl.load(bases_ptr + c) + slot * slot_bytes).to(tl.pointer_type(tl.int64))
        tl.store(buf_ptr + out_at + c * n + t, _row_digest(base, words, wg, BLOCK))


@triton.jit
def _stage_kernel(src, dst, start, size, count_at, per, BLOCK: tl.constexpr, COUNTED: tl.constexpr):
    """Copy int64 words ``[start, start + m)`` from ``src`` to ``dst`` (both int64 addresses: one is pinned host
    memory): ``m = size``, or with COUNTED, ``per * src[count_at]``. In blocks of BLOCK words, one per program: a
    kernel reading host memory word by word waits on the bus each time (docs/CANARY.md; the digests read their
    slots from a device copy)."""
    sp = src.to(tl.pointer_type(tl.int64))
    dp = dst.to(tl.pointer_type(tl.int64))
    if COUNTED:
        m = per * tl.load(sp + count_at)
    else:
        m = size
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = i < m
    tl.store(dp + start + i, tl.load(sp + start + i, mask=inside, other=0), mask=inside)


_STAGE = 1024  # words a program of _stage_kernel copies


def _block(words: int) -> int:
    return min(1024, triton.next_power_of_2(max(int(words), 1)))


def _on(device):
    """``device`` made current where it is not (Triton launches and graph replays go to the current device)."""
    if device.index is not None and device.index != torch.cuda.current_device():
        return torch.cuda.device(device)
    return contextlib.nullcontext()


def digest_addresses(addrs, out, words: int) -> None:
    """Queue, on the current stream of ``out``'s device, the digests of the rows at ``addrs`` (int64 byte
    addresses, a CUDA tensor ``[n]``) of ``words`` int64 words each into ``out`` (int64 ``[n]``, same device)."""
    n = int(addrs.numel())
    if not n:
        return
    block = _block(words)
    # host-computed: a Python int argument keeps its value whatever width Triton gives it
    args = (addrs, out, int(words), digest.i64(int(words) * digest.G))
    with _on(out.device):
        _digest_kernel[(n,)](*args, BLOCK=block, num_warps=4)


class SlotDigests:
    """One phase's digests of a step's slots in every group of caches, as one CUDA graph (the fused path's slots
    before and after the step: ``ValueProbe``). Triton's launcher costs far more host time a launch than a graph's
    replay (docs/CANARY.md), and the time before the replay is added to every step.

    Made for fixed capacities (``caps``: the most slots of a step per group) and kept while a step fits. The host
    writes a step's slots into a pinned buffer and reads the digests from it; the graph copies the slots to the
    device, digests them and copies the digests back (kernels reading and writing the pinned buffer through
    unified addressing: no copy to queue). Its event, recorded by the graph, marks when the digests are there and the
    buffer is free to write again. ``groups``: per group (cache ids, their slot-0 addresses, slot bytes)."""

    def __init__(self, device, groups: list, caps: list) -> None:
        self.device, self.caps = device, [int(c) for c in caps]
        self.spans, at = [], 0
        for cap in self.caps:  # the inputs first (one copy in): count and slots of each group
            self.spans.append([at, at + 1])
            at += 1 + cap
        self.inputs = at
        for span, (cids, _bases, _sb), cap in zip(self.spans, groups, self.caps):  # then digests [C, n] per group
            span += [at, len(cids)]
            at += len(cids) * cap
        self.io = torch.zeros(max(at, 1), dtype=torch.int64, pin_memory=True)  # counts 0: the warm-up reads nothing
        self.host = self.io.numpy()
        self.buf = torch.zeros(max(at, 1), dtype=torch.int64, device=device)
        self.bases = [torch.tensor(np_bases, dtype=torch.int64, device=device) for _c, np_bases, _sb in groups]
        self.args = [(int(sb), int(sb) // 8, digest.i64((int(sb) // 8) * digest.G)) for _c, _b, sb in groups]
        # recorded by the graph itself (an event record node): Event.record costs host time at every call
        self.event = torch.cuda.Event(external=True)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.device(device):
            cur = torch.cuda.current_stream()
            side = torch.cuda.Stream()
            side.wait_stream(cur)
            with torch.cuda.stream(side):
                self._launch()  # compiles outside the capture
                self.graph.capture_begin(capture_error_mode="thread_local")  # other threads' CUDA calls go on
                try:
                    self._launch()
                    self.event.record()
                finally:
                    self.graph.capture_end()
            cur.wait_stream(side)
        self.event.record(cur)

    def _launch(self) -> None:
        io, buf = int(self.io.data_ptr()), int(self.buf.data_ptr())
        _stage_kernel[(triton.cdiv(self.inputs, _STAGE),)](io, buf, 0, self.inputs, 0, 0, BLOCK=_STAGE,
                                                            COUNTED=False)
        for (count_at, slots_at, out_at, n_caches), cap, bases, (sb, words, wg) in zip(
                self.spans, self.caps, self.bases, self.args):
            if cap and n_caches:
                _slot_kernel[(cap, n_caches)](self.buf, bases, count_at, slots_at, out_at, sb, words, wg,
                                              BLOCK=_block(words), num_warps=4)
                _stage_kernel[(triton.cdiv(cap * n_caches, _STAGE),)](buf, io, out_at, 0, count_at, n_caches,
                                                                      BLOCK=_STAGE, COUNTED=True)

    def fits(self, counts) -> bool:
        return all(k <= cap for k, cap in zip(counts, self.caps))

    def run(self, slots: list) -> list:
        """Queue the digests of ``slots`` (per group, int64 numpy ``[k]``, k within its cap) on the current stream;
        returns per group the digests ``[C, k]``: views of the pinned buffer, read once :attr:`event` is done and
        good until the next :meth:`run`."""
        self.event.synchronize()  # the last replay has read the slots and its digests were taken
        host, out = self.host, []
        for (count_at, slots_at, out_at, n_caches), s in zip(self.spans, slots):
            k = len(s)
            host[count_at] = k
            host[slots_at:slots_at + k] = s
            out.append(host[out_at:out_at + n_caches * k].reshape(n_caches, k))
        with _on(self.device):
            self.graph.replay()
        return out
