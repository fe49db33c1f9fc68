"""The value canary's digest: one 64-bit digest per row, the same bits for numpy arrays on the host and torch tensors
on their device (queued on the current stream; torch is never imported here: a tensor is recognised by its
methods). The expected and the written side of the value canary both go through :func:`digest_rows`; the fused
path's Triton kernel (``_digest_triton``) computes the same bits from rows' byte addresses.

Each row's bytes are read as little-endian words (:func:`row_words`), and ``mix(sum_i mix(w_i + i*G) ^ W*G)`` taken
over them in wrapping signed 64-bit arithmetic, ``mix`` being splitmix64's finaliser (:func:`digest_words`).

    >>> import numpy as np
    >>> rows = np.arange(12, dtype=np.int16).reshape(3, 4)
    >>> d = digest_rows(rows)
    >>> d.dtype, len(set(d.tolist())), bool((digest_rows(rows[::-1].copy())[::-1] == d).all())
    (dtype('int64'), 3, True)
"""

from __future__ import annotations

import math

import numpy as np

_U64 = 1 << 64


def i64(x: int) -> int:
    x &= _U64 - 1
    return x - _U64 if x >= 1 << 63 else x


# splitmix64's finaliser constants and the golden-ratio increment, as signed 64-bit values (torch has no uint64
# arithmetic); products and sums wrap modulo 2**64 on both sides
M1, M2, G = i64(0xBF58476D1CE4E5B9), i64(0x94D049BB133111EB), i64(0x9E3779B97F4A7C15)
MASK = {s: (1 << (64 - s)) - 1 for s in (27, 30, 31)}  # logical right shifts from arithmetic ones


def is_torch(x) -> bool:
    return hasattr(x, "untyped_storage") and hasattr(x, "data_ptr")


def row_bytes(rows) -> int:
    """Bytes per row of ``rows`` ([n, ...]), also when n is 0."""
    size = int(rows.element_size()) if is_torch(rows) else int(rows.itemsize)
    return size * math.prod(int(x) for x in rows.shape[1:])


def _mix(z):
    """splitmix64's finaliser on int64 words (numpy or torch): logical shifts as masked arithmetic ones."""
    z = (z ^ ((z >> 30) & MASK[30])) * M1
    z = (z ^ ((z >> 27) & MASK[27])) * M2
    return z ^ ((z >> 31) & MASK[31])


def row_words(rows):
    """``rows`` ([n, ...], contiguous, any dtype) as int64 words ``[n, W]``: each row's bytes read as little-endian
    signed words of the widest of 8, 4, 2, 1 bytes that divides the row, widened to int64."""
    n = int(rows.shape[0])
    if is_torch(rows):
        import torch

        width = row_bytes(rows)
        b = rows.contiguous().view(torch.uint8).reshape(n, width)
        for size, dt in ((8, torch.int64), (4, torch.int32), (2, torch.int16), (1, torch.int8)):
            if width % size == 0:
                w = b.view(dt)
                return w if dt == torch.int64 else w.to(torch.int64)
    width = row_bytes(rows)
    b = np.ascontiguousarray(rows).view(np.uint8).reshape(n, width)
    for size, dt in ((8, np.int64), (4, np.int32), (2, np.int16), (1, np.int8)):
        if width % size == 0:
            return b.view(dt).astype(np.int64, copy=False)
    raise AssertionError("unreachable")  # pragma: no cover


def digest_words(words):
    """The digest of each row of int64 words ``[n, W]`` (numpy or torch): ``mix(sum_i mix(w_i + i*G) ^ W*G)``, all
    wrapping 64-bit; int64 ``[n]`` on the words' device. Position-keyed, so swapped words change it."""
    width = int(words.shape[1])
    if is_torch(words):
        import torch

        pos = torch.arange(width, dtype=torch.int64, device=words.device) * G
        h = _mix(words + pos).sum(dim=1, dtype=torch.int64)
    else:
        with np.errstate(over="ignore"):
            pos = np.arange(width, dtype=np.int64) * np.int64(G)
            h = _mix(words + pos).sum(axis=1, dtype=np.int64)
    return _mix(h ^ i64(width * G))


def digest_rows(rows):
    """One 64-bit digest (int64) per row of ``rows`` ([n, ...]; numpy or torch): the one digest function of the
    value canary, the expected and the written side alike."""
    if is_torch(rows):
        return digest_words(row_words(rows))
    with np.errstate(over="ignore"):
        return digest_words(row_words(rows))


def word_chunks(rows: dict) -> list[tuple[list, object, int]]:
    """{key: bytes [k, row_bytes]} -> chunks [(keys, int64 words [len(keys) * k, W], k)]: rows of one shape on one
    device stacked (a copy: taken before a step, they keep what the slots held)."""
    groups: dict = {}
    for key, r in rows.items():
        dev = str(r.device) if is_torch(r) else None
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


def digest_all(tagged: dict) -> dict:
    """{tag: word chunks} -> {tag: [(keys, digests [len(keys), k])]}: the words of a whole step (before, after,
    expected) of one width on one device concatenated and digested in one pass."""
    out: dict = {tag: [] for tag in tagged}
    groups: dict = {}
    for tag, chunks in tagged.items():
        for keys, words, k in chunks:
            if not k:
                out[tag].append((keys, np.zeros((len(keys), 0), np.int64)))
                continue
            dev = str(words.device) if is_torch(words) else None
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


def read_back(tagged: dict) -> dict:
    """{tag: chunks} -> {tag: {key: int64 digests (numpy)}}: every chunk on the host, torch ones in one copy."""
    flat = [(tag, keys, m) for tag, chunks in tagged.items() for keys, m in chunks]
    mats = [m for *_x, m in flat]
    if any(is_torch(m) for m in mats):
        import torch

        dev = next(m.device for m in mats if is_torch(m))
        parts = [(m if is_torch(m) else torch.from_numpy(np.asarray(m, np.int64))).to(dev).reshape(-1) for m in mats]
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
