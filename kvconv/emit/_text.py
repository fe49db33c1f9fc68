"""Vectorised JSON lines: many objects of one shape, written as fixed-width numpy byte matrices.

Numbers are right-aligned in a field as wide as the chunk's widest value, padded with spaces before the number (JSON
allows whitespace between tokens), so every row of a group has the same width and no per-row Python runs. Rows are
grouped by their string choices (e.g. kernel names), so groups may come out in another order than the rows came in;
trace viewers sort events by time.

    >>> import numpy as np
    >>> rows = [lit('{"ts":'), ts_us(np.array([1500, 2_000_001], np.int64)), lit("}\\n")]
    >>> print(render(rows, 2).decode(), end="")
    {"ts":   1.500}
    {"ts":2000.001}
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_LUT4 = np.frombuffer("".join(f"{i:04d}" for i in range(10000)).encode(), np.uint8).reshape(10000, 4)
_LUT4_32 = _LUT4.copy().view(np.uint32).reshape(-1)
_LUT3 = np.frombuffer("".join(f"{i:03d}" for i in range(1000)).encode(), np.uint8).reshape(1000, 3)
_P10 = [10**k for k in range(20)]


@dataclass
class Part:
    kind: str  # "lit", "uint", "ts", "choice"
    value: object = None
    choices: list | None = None


def lit(s: str | bytes) -> Part:
    return Part("lit", s.encode() if isinstance(s, str) else s)


def uint(v) -> Part:
    return Part("uint", np.asarray(v).astype(np.uint64, copy=False))


def ts_us(ns) -> Part:
    """Nanoseconds written as microseconds with three decimals (exact; negative values are clipped to 0)."""
    a = np.asarray(ns)
    if a.dtype.kind == "i" and a.size and a.min() < 0:
        a = np.maximum(a, 0)
    return Part("ts", a.astype(np.uint64, copy=False))


def choice(ids, strings: list[bytes]) -> Part:
    """One of a few byte strings per row (ids index ``strings``)."""
    return Part("choice", np.asarray(ids, np.int64), [s if isinstance(s, bytes) else s.encode() for s in strings])


def _ndigits(v: np.ndarray) -> np.ndarray:
    nd = np.ones(v.shape, np.int64)
    top = len(str(int(v.max()))) if v.size else 1
    for k in range(1, top):
        nd += v >= np.uint64(_P10[k])
    return nd


def _put_uint(mat: np.ndarray, a: int, v: np.ndarray, D: int) -> None:
    """Write ``v`` right-aligned in columns ``a .. a+D`` with leading spaces."""
    n = len(v)
    g = (D + 3) // 4
    buf = np.empty((n, g), np.uint32)
    x = v
    for k in range(g - 1, -1, -1):
        q = x // np.uint64(10000)
        buf[:, k] = _LUT4_32[(x - q * np.uint64(10000)).astype(np.intp)]
        x = q
    digits = buf.view(np.uint8)[:, g * 4 - D :]
    lo = int(v.min()) if n else 0
    if len(str(lo)) == D:
        mat[:, a : a + D] = digits
        return
    nd = _ndigits(v)
    pad = np.arange(D)[None, :] < (D - nd)[:, None]
    mat[:, a : a + D] = np.where(pad, np.uint8(32), digits)


def _width(p: Part) -> int:
    if p.kind == "lit":
        return len(p.value)
    v = p.value
    if p.kind == "uint":
        return len(str(int(v.max()))) if v.size else 1
    if p.kind == "ts":
        q = int(v.max()) // 1000 if v.size else 0
        return len(str(q)) + 4
    raise AssertionError(p.kind)


def _fill(parts: list, n: int, idx, i0: int) -> np.ndarray:
    widths = []
    for p in parts:
        if p.kind == "choice":
            widths.append(len(p.choices[int(p.value[i0])]))
        else:
            q = p if idx is None or p.kind == "lit" else Part(p.kind, p.value[idx])
            widths.append(_width(q))
    mat = np.empty((n, sum(widths)), np.uint8)
    pos = 0
    tmpl = bytearray()
    ops = []
    for p, wd in zip(parts, widths):
        if p.kind == "lit":
            tmpl += p.value
        elif p.kind == "choice":
            tmpl += p.choices[int(p.value[i0])]
        else:
            ops.append((pos, p, wd))
            tmpl += b" " * wd
        pos += wd
    mat[:] = np.frombuffer(bytes(tmpl), np.uint8)
    for pos, p, wd in ops:
        v = p.value if idx is None else p.value[idx]
        if p.kind == "uint":
            _put_uint(mat, pos, v, wd)
        else:
            q = v // np.uint64(1000)
            _put_uint(mat, pos, q, wd - 4)
            mat[:, pos + wd - 4] = ord(".")
            mat[:, pos + wd - 3 : pos + wd] = _LUT3[(v - q * np.uint64(1000)).astype(np.intp)]
    return mat


def render_parts(parts: list, n: int) -> list:
    """The byte matrices of ``n`` rows (buffers for ``file.write``)."""
    if n == 0:
        return []
    ch = [p for p in parts if p.kind == "choice"]
    if not ch:
        return [_fill(parts, n, None, 0)]
    key = np.zeros(n, np.int64)
    for p in ch:
        key = key * len(p.choices) + p.value
    kmin, kmax = int(key.min()), int(key.max())
    if kmin == kmax:
        return [_fill(parts, n, None, 0)]
    order = np.argsort(key, kind="stable")
    sk = key[order]
    cut = np.flatnonzero(sk[1:] != sk[:-1]) + 1
    bounds = np.concatenate([[0], cut, [n]])
    out = []
    for a, b in zip(bounds[:-1], bounds[1:]):
        idx = order[a:b]
        out.append(_fill(parts, len(idx), idx, int(idx[0])))
    return out


def render(parts: list, n: int) -> bytes:
    return b"".join(m.tobytes() for m in render_parts(parts, n))
