"""The value canary's digest (:func:`kvconv.capture.probe.values.digest_words`) as one Triton kernel over rows named
by their byte addresses: the probe's fused path for torch CUDA caches (see ``ValueProbe``). Each row is read in
place as ``words`` little-endian int64 words (8-byte aligned; rows of a multiple of 8 bytes, where ``row_words``
reads int64 words too), so the digests equal ``digest_rows`` bit for bit, without a gather or a stack.

Imported by ``values`` only when a CUDA step is digested (importing triton costs ~1 s; the first launch of a width
compiles). The arithmetic is the module's: signed int64, wrapping products and sums, logical right shifts as
masked arithmetic ones.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kvconv.capture.probe.values import _G, _M1, _M2, _MASK, _i64

# Triton reads only constexpr globals inside a kernel
G, M1, M2 = tl.constexpr(_G), tl.constexpr(_M1), tl.constexpr(_M2)
MASK27, MASK30, MASK31 = tl.constexpr(_MASK[27]), tl.constexpr(_MASK[30]), tl.constexpr(_MASK[31])


@triton.jit
def _mix(z):
    z = (z ^ ((z >> 30) & MASK30)) * M1
    z = (z ^ ((z >> 27) & MASK27)) * M2
    return z ^ ((z >> 31) & MASK31)


@triton.jit
def _digest_kernel(addr_ptr, out_ptr, words, wg, BLOCK: tl.constexpr):
    """One program per row: ``out[r] = mix(sum_i mix(w_i + i*G) ^ wg)`` over the ``words`` int64 words at
    ``addr[r]`` (``wg``: ``words * G``, wrapped)."""
    row = tl.program_id(0)
    base = tl.load(addr_ptr + row).to(tl.pointer_type(tl.int64))
    acc = tl.zeros([BLOCK], dtype=tl.int64)
    for start in range(0, words, BLOCK):
        i = start + tl.arange(0, BLOCK)
        inside = i < words
        w = tl.load(base + i, mask=inside, other=0)
        acc += tl.where(inside, _mix(w + i.to(tl.int64) * G), 0)
    h = tl.sum(acc, axis=0)
    tl.store(out_ptr + row, _mix(h ^ wg))


def digest_addresses(addrs, out, words: int) -> None:
    """Queue, on the current stream of ``out``'s device, the digests of the rows at ``addrs`` (int64 byte
    addresses, a CUDA tensor ``[n]``) of ``words`` int64 words each into ``out`` (int64 ``[n]``, same device)."""
    n = int(addrs.numel())
    if not n:
        return
    block = min(1024, triton.next_power_of_2(max(int(words), 1)))
    dev = out.device
    # host-computed: a Python int argument keeps its value whatever width Triton gives it
    args = (addrs, out, int(words), _i64(int(words) * _G))
    if dev.index is not None and dev.index != torch.cuda.current_device():
        with torch.cuda.device(dev):  # Triton launches on the current device
            _digest_kernel[(n,)](*args, BLOCK=block, num_warps=4)
    else:
        _digest_kernel[(n,)](*args, BLOCK=block, num_warps=4)
