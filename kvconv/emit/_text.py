"""Vectorised JSON lines: many objects of one shape, written as fixed-width numpy byte matrices.

Rows are grouped by their string choices (e.g. kernel names) and by the digit count of every number, so every row of
a group has the same width (no padding) and no per-row Python runs. Groups may come out in another order than the
rows came in; trace viewers sort events by time.

    >>> import numpy as np
    >>> rows = [lit('{"ts":'), ts_us(np.array([1500, 2_000_001], np.int64)), lit("}\\n")]
    >>> print(render(rows, 2).decode(), end="")
    {"ts":1.500}
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
    pad: bool = False  # uint: right-aligned in the width of the largest, leading spaces (JSON whitespace)
    bounds: tuple | None = None  # uint / ts: (min, max) of ``value``, once read (render_parts)


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


def _ndigits(v: np.ndarray, vmax: int | None = None) -> np.ndarray:
    nd = np.ones(v.shape, np.int64)
    top = len(str(int(v.max() if vmax is None else vmax))) if v.size else 1
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


_U64 = np.uint64
_LUT4_64 = _LUT4_32.astype(np.uint64)
_E8 = _U64(10**8)


def _ascii8(x: np.ndarray) -> np.ndarray:
    """The 8 decimal digits (leading zeros) of each ``x`` < 10**8 as ASCII in a little-endian word."""
    hi = x // _U64(10000)
    lo = x - hi * _U64(10000)
    w = _LUT4_64[lo.astype(np.intp)]
    w <<= _U64(32)
    w |= _LUT4_64[hi.astype(np.intp)]
    return w


def _blocks8(v: np.ndarray, D: int):
    """``(end, digits, values)`` of the 8-digit blocks of ``D``-digit numbers ``v``, from the right: each block's
    values and where its digits end within the number."""
    end, rem = D, v
    while end > 0:
        take = min(8, end)
        if end > 8:
            q = rem // _E8
            chunk = rem - q * _E8
            rem = q
        else:
            chunk = rem
        yield end, take, chunk
        end -= take


def _digits_pieces(v: np.ndarray, D: int, at: int, out: list) -> None:
    """``(position, word, bytes)`` pieces writing the ``D``-digit numbers ``v`` at byte ``at``."""
    for end, take, chunk in _blocks8(v, D):
        if take <= 4:
            w = _LUT4_64[chunk.astype(np.intp)]
            if take < 4:
                w >>= _U64(8 * (4 - take))
        else:
            w = _ascii8(chunk)
            if take < 8:
                w >>= _U64(8 * (8 - take))
        out.append((at + end - take, w, take))


def _lut_max(n: int) -> int:
    """The widest value range of ``n`` rows rendered once per value and gathered."""
    return min(n // 4, 1 << 16)


def _number(v: np.ndarray, D: int, at: int, out: list, n: int, pad: bool = False,
            bounds: tuple | None = None) -> bytes:
    """The bytes of a ``D``-digit number column at byte ``at`` for the row template (digits where they are the same
    in every row, zeros elsewhere), adding the pieces of the others to ``out``. Columns of few distinct values are
    rendered once per value and gathered; 8-digit blocks equal in every row go into the template. ``pad``: values
    of fewer digits get leading spaces (always a range of few values: :func:`render_parts`). ``bounds``: the
    values' (min, max), when known."""
    lo, hi = bounds if bounds is not None else (int(v.min()), int(v.max()))
    if lo == hi:
        return str(lo).rjust(D if pad else 0).encode()
    if pad or hi - lo <= _lut_max(n):
        lut: list = []
        _lut_pieces(np.arange(lo, hi + 1, dtype=_U64), D, at, lut, pad)
        ix = (v - _U64(lo)).astype(np.intp)
        out.extend((p, w[ix], L) for p, w, L in lut)
        return bytes(D)
    field = bytearray(D)
    for end, take, chunk in _blocks8(v, D):
        c0, c1 = int(chunk.min()), int(chunk.max())
        if c0 == c1:
            field[end - take : end] = str(c0).zfill(take).encode()
        else:
            _digits_pieces(chunk, take, at + end - take, out)
    return bytes(field)


def _lut_pieces(vals: np.ndarray, D: int, at: int, out: list, pad: bool) -> None:
    """The pieces of :func:`_digits_pieces` for the few values ``vals``; ``pad``: leading spaces instead of zeros
    (``D`` is the width of the largest)."""
    if not pad:
        _digits_pieces(vals, D, at, out)
        return
    m = len(vals)
    digits = np.zeros((m, -(-D // 8) * 8), np.uint8)
    x = vals
    for k in range(D - 1, -1, -1):
        q = x // _U64(10)
        digits[:, k] = (x - q * _U64(10)).astype(np.uint8) + np.uint8(48)
        x = q
    digits[:, :D][np.arange(D)[None, :] < (D - _ndigits(vals))[:, None]] = 32
    words = digits.view("<u8")
    for k in range(words.shape[1]):
        out.append((at + 8 * k, np.ascontiguousarray(words[:, k]), min(8, D - 8 * k)))


def _fill(parts: list, n: int, idx, i0: int) -> np.ndarray:
    """The rows of one group (every number of a part has the same digit count in all its rows): a ``(n, width)``
    uint8 matrix. The constant bytes are broadcast first; the 8-byte words holding numbers are assembled (template
    bytes OR-ed with each number's ASCII digits shifted into place) and stored word column by word column."""
    tmpl, pieces = _template(parts, n, idx)
    W = len(tmpl)
    if W < 8 and pieces:
        return _fill_bytes(parts, n, idx, i0)
    buf = np.empty(n * W + 8, np.uint8)
    mat = buf[: n * W].reshape(n, W)
    row = np.frombuffer(bytes(tmpl), np.uint8)
    if not pieces:
        mat[:] = row
        return mat
    nw = (W + 7) // 8
    words = np.frombuffer(bytes(tmpl) + bytes(8 * nw - W), "<u8")
    cols = _word_columns(pieces, words)
    order = sorted(cols)
    if nw - 1 in cols and W % 8:  # its bytes past the row end spill into the next row's first word: store that after
        order = [nw - 1] + [j for j in order if j != nw - 1]
        if 0 not in cols:
            order.append(0)
    # the word columns are stored a block of rows at a time, the block in cache: a column at a time over the whole
    # matrix (a cache line per row per column) read each line back from memory once per column
    step = max(1, _STORE_BLOCK // W)
    srcs = [(np.ndarray((n,), dtype=_U64, buffer=buf, offset=8 * j, strides=(W,)), cols[j] if j in cols else words[j])
            for j in order]
    for a in range(0, n, step):
        b = min(n, a + step)
        mat[a:b] = row
        for dst, src in srcs:
            dst[a:b] = src[a:b] if src.ndim else src
    return mat


def _template(parts: list, n: int, idx) -> tuple[bytearray, list]:
    """One row's constant bytes (numbers' digits and varying strings left as zero bytes) and the pieces that fill
    them in: ``(byte offset, uint64 column of 8-byte words, length in bytes)``."""
    tmpl = bytearray()
    pieces: list = []
    for p in parts:
        if p.kind == "lit":
            tmpl += p.value
        elif p.kind == "choice":
            tmpl += _choice(p, p.value if idx is None else p.value[idx], len(tmpl), pieces)
        else:
            v = p.value if idx is None else p.value[idx]
            b = p.bounds if idx is None else None  # every row's: the part's own
            if p.kind == "uint":
                D = len(str(int(v.max() if b is None else b[1]))) if p.pad else len(str(int(v[0])))
                tmpl += _number(v, D, len(tmpl), pieces, n, p.pad, b)
            else:
                q = v // _U64(1000)
                tmpl += _number(q, len(str(int(q[0]))), len(tmpl), pieces, n,
                                bounds=(b[0] // 1000, b[1] // 1000) if b is not None else None)
                tmpl += b"."
                tmpl += _number(v - q * _U64(1000), 3, len(tmpl), pieces, n).rjust(3, b"0")
    return tmpl, pieces


def _choice(p, ids: np.ndarray, at: int, pieces: list) -> bytes:
    """A string chosen per row: the one string when every row chose it, else (strings of one length) zero bytes
    in the template and the strings' 8-byte words gathered per row into ``pieces``."""
    c0 = p.choices[int(ids[0])]
    if int(ids.min()) == int(ids.max()):
        return c0
    Ls = len(c0)
    padded = b"".join(c.ljust(-(-Ls // 8) * 8, b"\0")[: -(-Ls // 8) * 8] if len(c) == Ls
                      else bytes(-(-Ls // 8) * 8) for c in p.choices)
    lut = np.frombuffer(padded, "<u8").reshape(len(p.choices), -1)
    ix = ids.astype(np.intp)
    for k in range(lut.shape[1]):
        pieces.append((at + 8 * k, lut[:, k][ix], min(8, Ls - 8 * k)))
    return bytes(Ls)


def _word_columns(pieces: list, words: np.ndarray) -> dict:
    """Each 8-byte word of the row that a piece touches, as a column over the rows: the template's word OR-ed with
    every piece's bytes shifted into place."""
    cols: dict = {}
    for p, val, L in pieces:
        for j in range(p // 8, (p + L - 1) // 8 + 1):
            sh = p - 8 * j
            part = (val << _U64(8 * sh)) if sh > 0 else ((val >> _U64(-8 * sh)) if sh < 0 else val)
            if j not in cols:
                cols[j] = part | words[j] if words[j] else (part.copy() if part is val else part)
            else:
                cols[j] |= part
    return cols


_STORE_BLOCK = 256 << 10  # bytes of rows stored at a time (within a core's L2)


def _fill_bytes(parts: list, n: int, idx, i0: int) -> np.ndarray:
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


SLICE = 1 << 16  # rows rendered at a time (the values and the rows being built stay in cache)


def _digit_key(p: Part, n: int):
    """(radix, per-row digit count) of a number part whose rows differ in digit count, else None; "pad": the rows
    of a uint part of few values that differ in digit count are not grouped but padded with leading spaces (JSON
    whitespace: grouping them gathered every other part's values, the most of a block event line's time)."""
    if not p.value.size:
        return None
    if p.bounds is None:
        p.bounds = (int(p.value.min()), int(p.value.max()))
    vlo, vhi = p.bounds
    if p.kind == "ts":  # the digits before the point: floor division keeps the order, so the bounds' quotients
        vlo, vhi = vlo // 1000, vhi // 1000
    lo, hi = len(str(vlo)), len(str(vhi))
    if lo == hi:
        return None
    if p.kind == "uint" and vhi - vlo <= _lut_max(n):
        return "pad"
    return hi + 1, _ndigits(p.value if p.kind == "uint" else p.value // np.uint64(1000), vhi)


def render_parts(parts: list, n: int) -> list:
    """The byte matrices of ``n`` rows (buffers for ``file.write``).

    Rows are rendered in slices; within a slice they are grouped by their string choices and by the digit count of
    each number, so that every group is one fixed-width matrix with no padding."""
    if n == 0:
        return []
    if n > SLICE:
        out = []
        for s in range(0, n, SLICE):
            e = min(n, s + SLICE)
            out += render_parts([p if p.kind == "lit" else Part(p.kind, p.value[s:e], p.choices) for p in parts],
                                e - s)
        return out
    comps = []
    parts = list(parts)
    for i, p in enumerate(parts):
        if p.kind == "choice":
            if len(p.choices) > 1 and int(p.value.min()) != int(p.value.max()):
                lens = np.array([len(c) for c in p.choices], np.int64)
                if lens.min() != lens.max():
                    comps.append((int(lens.max()) + 1, lens[p.value]))  # rows group by string length
        elif p.kind in ("uint", "ts"):
            k = _digit_key(p, n)
            if k == "pad":
                parts[i] = Part(p.kind, p.value, p.choices, pad=True, bounds=p.bounds)
            elif k is not None:
                comps.append(k)
    if not comps:
        return [_fill(parts, n, None, 0)]
    key = np.zeros(n, np.int64)
    for radix, v in comps:
        key = key * radix + v
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
