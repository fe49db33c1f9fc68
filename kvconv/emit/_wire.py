"""Vectorised protobuf wire encoding: many messages of one shape, built as numpy byte matrices.

A message shape is a tree of field specs; every leaf holds one value per row (a numpy array) or a constant. Rows
whose fields have the same encoded lengths share a byte layout, so each such group is written as one ``(rows, width)``
``uint8`` matrix, column block by column block, with no per-row Python. The output is exactly what protobuf's own
serializer writes for the same message (fields in field-number order, minimal varints), which the tests check
against ``SerializeToString``.

    >>> import numpy as np
    >>> rows = [const(b"\\x08\\x96\\x01"), varint(2, np.array([1, 300], np.uint64))]
    >>> encode(rows, 2)[0].hex()
    '089601100108960110ac02'
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

U64 = np.uint64
_M56 = U64((1 << 56) - 1)
_S1A, _S1B = U64(0x000000000FFFFFFF), U64(0x00FFFFFFF0000000)
_S2A, _S2B = U64(0x00003FFF00003FFF), U64(0x0FFFC0000FFFC000)
_S3A, _S3B = U64(0x007F007F007F007F), U64(0x3F803F803F803F80)
_CONT = [U64(0)] + [U64(sum(0x80 << (8 * k) for k in range(min(n - 1, 8)))) for n in range(1, 11)]


def tag(field: int, wire: int) -> bytes:
    return varint_bytes((field << 3) | wire)


def varint_bytes(v: int) -> bytes:
    out = bytearray()
    v = int(v)
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def varint_size(v: int) -> int:
    """Encoded length (1..10) of one non-negative value: ``len(varint_bytes(v))`` without building the bytes."""
    return (max(int(v).bit_length(), 1) + 6) // 7


def varint_len(v: np.ndarray) -> np.ndarray:
    """Encoded length (1..10) of each uint64 value."""
    v = np.asarray(v, dtype=U64)
    n = np.ones(v.shape, dtype=np.int64)
    top = varint_size(int(v.max())) if v.size else 1
    for k in range(1, top):
        n += v >= U64(1 << (7 * k))
    return n


def _const_varint_len(v: np.ndarray) -> int | None:
    """The common varint length if every value encodes to the same length (checked from min/max), else None."""
    if v.size == 0:
        return 1
    lo, hi = int(v.min()), int(v.max())
    a, b = varint_size(lo), varint_size(hi)
    return a if a == b else None


def _value_bounds(f: Leaf) -> tuple[int, int]:
    """(min, max) of a varint leaf's values, read once and kept on the leaf (:func:`_enc_varint` asks again)."""
    if f.bounds is None:
        v = f.value
        f.bounds = (int(v.min()), int(v.max())) if v.size else (0, 0)
    return f.bounds


# ---------------------------------------------------------------------------------------------------------------
# field specs


@dataclass
class Leaf:
    kind: str  # "c" const, "v" varint, "f64" fixed64, "rf64" repeated fixed64
    tag: bytes = b""
    value: object = None  # bytes for "c"; scalar or (n,) array for "v"/"f64"; (n, K) array for "rf64"
    present: np.ndarray | None = None  # bool mask (None: always present)
    count: np.ndarray | None = None  # rf64: values used per row
    bounds: tuple | None = None  # "v": (min, max) of the values, once read (every row's, whichever rows are encoded)


@dataclass
class Msg:
    tag: bytes
    children: list
    present: np.ndarray | None = None


def const(b: bytes) -> Leaf:
    return Leaf("c", b"", b)


def varint(field: int, values, present=None, bounds: tuple | None = None) -> Leaf:
    """``bounds``: (min, max) of the values, or of a superset of them, when the caller knows them (not read again)."""
    if np.isscalar(values) or isinstance(values, int):
        return Leaf("c", b"", tag(field, 0) + varint_bytes(int(values))) if present is None else \
            Leaf("v", tag(field, 0), np.full(len(present), int(values), U64), present)
    return Leaf("v", tag(field, 0), np.asarray(values).astype(U64, copy=False), present, bounds=bounds)


def fixed64(field: int, values, present=None) -> Leaf:
    return Leaf("f64", tag(field, 1), np.asarray(values).astype(U64, copy=False), present)


def rfixed64(field: int, values2d: np.ndarray, count: np.ndarray) -> Leaf:
    return Leaf("rf64", tag(field, 1), np.ascontiguousarray(values2d, dtype=U64), None,
                np.asarray(count, dtype=np.int64))


def msg(field: int, children: list, present=None) -> Msg:
    return Msg(tag(field, 2), children, present)


# ---------------------------------------------------------------------------------------------------------------
# lengths


def _leaf_len(f: Leaf, n: int):
    """Per-row encoded length (an int when constant, else an int64 array)."""
    if f.kind == "c":
        ln = len(f.value)
    elif f.kind == "v":
        if f.value.size == 0:
            c = 1
        else:
            lo, hi = _value_bounds(f)
            c = varint_size(lo) if varint_size(lo) == varint_size(hi) else None
        ln = len(f.tag) + c if c is not None else len(f.tag) + varint_len(f.value)
    elif f.kind == "f64":
        ln = len(f.tag) + 8
    else:  # rf64
        cnt = f.count
        if cnt.size and cnt.min() == cnt.max():
            ln = int(cnt[0]) * (len(f.tag) + 8)
        else:
            ln = cnt * (len(f.tag) + 8)
    if f.present is not None and not f.present.all():
        ln = np.where(f.present, ln, 0)
    return ln


def _msg_len(m: Msg, n: int, varying: list):
    """Inner length of a message; collects the varying leaf-length arrays (the layout signature) in ``varying``."""
    total = 0
    for ch in m.children:
        if isinstance(ch, Msg):
            inner = _msg_len(ch, n, varying)
            ln = len(ch.tag) + _vlen(inner) + inner
            if ch.present is not None and not ch.present.all():
                ln = np.where(ch.present, ln, 0)
                varying.append(ch.present.astype(np.int64))
        else:
            ln = _leaf_len(ch, n)
            if not np.isscalar(ln) and not isinstance(ln, int):
                varying.append(np.asarray(ln))
        total = total + ln
    return total


def _bounds(m: Msg) -> tuple[int, int] | None:
    """(shortest, longest) inner length of message ``m`` over its rows, from its fields' bounds (no per-row
    arithmetic); None when the length prefix of some message inside it may take two sizes (then the rows' lengths
    are needed, :func:`_msg_len`)."""
    lo = hi = 0
    for ch in m.children:
        if isinstance(ch, Msg):
            b = _bounds(ch)
            if b is None or varint_size(b[0]) != varint_size(b[1]):
                return None
            a, z = (len(ch.tag) + varint_size(b[0]) + b[0], len(ch.tag) + varint_size(b[1]) + b[1])
            present = ch.present
        else:
            present = ch.present
            if ch.kind == "c":
                a = z = len(ch.value)
            elif ch.kind == "v":
                if ch.value.size == 0:
                    a = z = len(ch.tag) + 1
                else:
                    vlo, vhi = _value_bounds(ch)
                    a, z = len(ch.tag) + varint_size(vlo), len(ch.tag) + varint_size(vhi)
            elif ch.kind == "f64":
                a = z = len(ch.tag) + 8
            else:
                cnt = ch.count
                c0, c1 = (int(cnt.min()), int(cnt.max())) if cnt.size else (0, 0)
                a, z = c0 * (len(ch.tag) + 8), c1 * (len(ch.tag) + 8)
        if present is not None:
            a = 0
        lo, hi = lo + a, hi + z
    return lo, hi


def _collect_varying(m: Msg, n: int, varying: list) -> None:
    """What :func:`_msg_len` collects in ``varying`` (the same arrays, in the same order), where every length
    prefix inside ``m`` has one size (:func:`_bounds`): the varying fields' lengths and the optional messages'
    presence, without the messages' per-row lengths."""
    for ch in m.children:
        if isinstance(ch, Msg):
            _collect_varying(ch, n, varying)
            if ch.present is not None and not ch.present.all():
                varying.append(ch.present.astype(np.int64))
        else:
            ln = _leaf_len(ch, n)
            if not np.isscalar(ln) and not isinstance(ln, int):
                varying.append(np.asarray(ln))


def _vlen(x):
    if isinstance(x, (int, np.integer)):
        return varint_size(int(x))
    return varint_len(x.astype(U64))


# ---------------------------------------------------------------------------------------------------------------
# writing one group of rows that share a layout


def _sel(v, idx):
    if idx is None or v is None or np.isscalar(v):
        return v
    return v[idx]


def _put_varint(mat: np.ndarray, a: int, v: np.ndarray, L: int) -> None:
    if L == 1:
        mat[:, a] = v
        return
    if L == 2:
        mat[:, a] = (v & U64(0x7F)) | U64(0x80)
        mat[:, a + 1] = v >> U64(7)
        return
    x = v & _M56
    x = (x & _S1A) | ((x & _S1B) << U64(4))
    x = (x & _S2A) | ((x & _S2B) << U64(2))
    x = (x & _S3A) | ((x & _S3B) << U64(1))
    x |= _CONT[L]
    k = min(L, 8)
    mat[:, a : a + k] = x.view(np.uint8).reshape(-1, 8)[:, :k]
    if L >= 9:
        hi = v >> U64(56)
        if L == 9:
            mat[:, a + 8] = hi
        else:
            mat[:, a + 8] = (hi & U64(0x7F)) | U64(0x80)
            mat[:, a + 9] = v >> U64(63)


def _plan(node, i0: int, tmpl: bytearray, ops: list) -> None:
    """Lay out ``node`` for the rows sharing row ``i0``'s lengths: constant bytes go into ``tmpl``, the per-row
    fields into ``ops`` as ``(position, leaf, length)``."""
    for ch in node:
        if ch.present is not None and not bool(ch.present[i0]):
            continue
        if isinstance(ch, Msg):
            tmpl += ch.tag
            tmpl += varint_bytes(_msg_len_rows(ch, i0))
            _plan(ch.children, i0, tmpl, ops)
        elif ch.kind == "c":
            tmpl += ch.value
        elif ch.kind == "v":
            tmpl += ch.tag
            L = varint_size(int(ch.value[i0]))
            ops.append((len(tmpl), ch, L))
            tmpl += bytes(L)
        elif ch.kind == "f64":
            tmpl += ch.tag
            ops.append((len(tmpl), ch, 8))
            tmpl += bytes(8)
        else:  # rf64: tags are constant, the values are written per row
            c = int(ch.count[i0])
            if c:
                ops.append((len(tmpl), ch, c))
                tmpl += (ch.tag + bytes(8)) * c


def _spread(v: np.ndarray, L: int) -> np.ndarray:
    """The low ``7 * min(L, 8)`` bits of ``v`` spread to 7 bits per byte, continuation bits set (``L`` >= 2)."""
    x = v & _M56 if L > 8 or v.dtype != U64 else (v.copy() if L > 4 else v & U64((1 << (7 * L)) - 1))
    if L > 4:
        t = x & _S1B
        t <<= U64(4)
        x &= _S1A
        x |= t
    t = x & _S2B
    t <<= U64(2)
    x &= _S2A
    x |= t
    t = x & _S3B
    t <<= U64(1)
    x &= _S3A
    x |= t
    x |= _CONT[L]
    return x


_LUT_MAX = 1 << 16


def _enc_varint(v: np.ndarray, L: int, bounds: tuple | None = None):
    """Varint bytes of ``v`` (all of length ``L``) as little-endian words: (bytes 0..7, bytes 8.. or None).
    ``bounds``: known (min, max) of the values, or of a superset of them."""
    if L == 1:
        return v, None
    if L == 2:
        x = v >> U64(7)
        x <<= U64(8)
        x |= v & U64(0x7F)
        x |= U64(0x80)
        return x, None
    if L <= 8:
        n = len(v)
        if n >= 4096:
            lo, hi = bounds if bounds is not None else (int(v.min()), int(v.max()))
            if hi - lo < min(_LUT_MAX, n // 4):  # few distinct values: encode them once, gather
                lut = _spread(np.arange(lo, hi + 1, dtype=U64), L)
                return lut[(v - U64(lo)).astype(np.intp)], None
        return _spread(v, L), None
    x = _spread(v, L)
    hi = v >> U64(56)
    if L == 10:
        hi = (hi & U64(0x7F)) | U64(0x80) | ((v >> U64(63)) << U64(8))
    return x, hi


def _fill(node, n: int, idx, i0: int) -> np.ndarray:
    """The rows of one layout group: a ``(n, width)`` uint8 matrix.

    Rows are assembled as 8-byte words (template constants OR-ed with each field's bytes, shifted into place) and
    stored word column by word column into the row-major buffer, the last column first: its bytes past the row end
    spill into the next row's first word, which is stored afterwards."""
    tmpl = bytearray()
    ops: list = []
    _plan(node, i0, tmpl, ops)
    W = len(tmpl)
    if W < 8:
        return _fill_bytes(tmpl, ops, n, idx)
    nw = (W + 7) // 8
    words = np.frombuffer(bytes(tmpl) + bytes(8 * nw - W), "<u8")
    cols: list = [None] * nw

    def put(p: int, val: np.ndarray, L: int) -> None:
        for j in range(p // 8, (p + L - 1) // 8 + 1):
            sh = p - 8 * j
            part = (val << U64(8 * sh)) if sh > 0 else ((val >> U64(-8 * sh)) if sh < 0 else val)
            if cols[j] is None:
                cols[j] = part | words[j] if words[j] else (part.copy() if part is val else part)
            else:
                cols[j] |= part

    for pos, ch, L in ops:
        v = _sel(ch.value, idx)
        if ch.kind == "v":
            lo, hi = _enc_varint(v, L, ch.bounds)
            put(pos, lo, min(L, 8))
            if hi is not None:
                put(pos + 8, hi, L - 8)
        elif ch.kind == "f64":
            put(pos, np.ascontiguousarray(v, dtype=U64), 8)
    buf = np.empty(n * W + 8, np.uint8)
    for j in [nw - 1] + list(range(nw - 1)):
        dst = np.ndarray((n,), dtype=U64, buffer=buf, offset=8 * j, strides=(W,))
        dst[...] = cols[j] if cols[j] is not None else words[j]
    mat = buf[: n * W].reshape(n, W)
    for pos, ch, L in ops:  # repeated fixed64: the tags came with the template, the values are copied as bytes
        if ch.kind == "rf64":
            dst = np.ndarray((n, L), dtype=U64, buffer=buf, offset=pos + len(ch.tag), strides=(W, len(ch.tag) + 8))
            dst[...] = _sel(ch.value, idx)[:, :L]
    return mat


def _fill_bytes(tmpl: bytearray, ops: list, n: int, idx) -> np.ndarray:
    mat = np.empty((n, len(tmpl)), np.uint8)
    mat[:] = np.frombuffer(bytes(tmpl), np.uint8)
    for pos, ch, L in ops:
        if ch.kind == "v":
            _put_varint(mat, pos, _sel(ch.value, idx), L)
        elif ch.kind == "f64":
            mat[:, pos : pos + 8] = np.ascontiguousarray(_sel(ch.value, idx)).view(np.uint8).reshape(-1, 8)
        elif ch.kind == "rf64":  # repeated fixed64: the tags came with the template, the values are copied
            vals = _sel(ch.value, idx)[:, :L]
            for k in range(L):
                at = pos + len(ch.tag) + k * (len(ch.tag) + 8)
                mat[:, at : at + 8] = np.ascontiguousarray(vals[:, k], dtype=U64).view(np.uint8).reshape(-1, 8)
    return mat


def _msg_len_rows(m: Msg, i0: int) -> int:
    """Inner length of message ``m`` for row ``i0`` (all rows of a group share it)."""
    total = 0
    for ch in m.children:
        if isinstance(ch, Msg):
            if ch.present is not None and not bool(ch.present[i0]):
                continue
            inner = _msg_len_rows(ch, i0)
            total += len(ch.tag) + varint_size(inner) + inner
        else:
            if ch.present is not None and not bool(ch.present[i0]):
                continue
            if ch.kind == "c":
                total += len(ch.value)
            elif ch.kind == "v":
                total += len(ch.tag) + varint_size(int(ch.value[i0]))
            elif ch.kind == "f64":
                total += len(ch.tag) + 8
            else:
                total += int(ch.count[i0]) * (len(ch.tag) + 8)
    return total


def encode(children: list, n: int) -> tuple[bytes, np.ndarray | None]:
    """Encode ``n`` rows of the field list ``children`` (the top-level fields, e.g. ``[msg(1, packet_fields)]`` for
    ``Trace.packet``). Returns the bytes and the row order used (None: rows in input order)."""
    parts, order = encode_parts(children, n)
    return b"".join(p.tobytes() if isinstance(p, np.ndarray) else p for p in parts), order


def _sig(node, i0: int, out: list) -> list:
    """Row ``i0``'s layout signature: every field's encoded length (0: absent) and every optional message's
    presence, in the order :func:`_msg_len` collects them. Groups of :func:`encode_parts` come out in increasing
    signature order, so sorting groups of consecutive row ranges by signature (stably) gives the same byte order as
    encoding all the rows at once."""
    for ch in node:
        if isinstance(ch, Msg):
            _sig(ch.children, i0, out)
            if ch.present is not None:
                out.append(int(bool(ch.present[i0])))
            continue
        if ch.present is not None and not bool(ch.present[i0]):
            out.append(0)
        elif ch.kind == "c":
            out.append(len(ch.value))
        elif ch.kind == "v":
            out.append(len(ch.tag) + varint_size(int(ch.value[i0])))
        elif ch.kind == "f64":
            out.append(len(ch.tag) + 8)
        else:
            out.append(int(ch.count[i0]) * (len(ch.tag) + 8))
    return out


def encode_groups(children: list, n: int) -> list:
    """Like :func:`encode_parts`, each byte matrix with its layout signature: ``[(signature, matrix), ...]``."""
    parts, order = encode_parts(children, n)
    if not parts:
        return []
    if order is None:
        return [(tuple(_sig(children, 0, [])), parts[0])]
    out, at = [], 0
    for m in parts:
        out.append((tuple(_sig(children, int(order[at]), [])), m))
        at += len(m)
    return out


def encode_parts(children: list, n: int) -> tuple[list, np.ndarray | None]:
    """Like :func:`encode`, but returns the byte matrices (buffers for ``file.write``) instead of joining them."""
    if n == 0:
        return [], None
    g = _layout_groups(children, n)
    if g is None:
        return [_fill(children, n, None, 0)], None
    order, bounds = g
    parts = []
    for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        idx = order[a:b]
        parts.append(_fill(children, len(idx), idx, int(idx[0])))
    return parts, order


def _layout_groups(children: list, n: int):
    """Rows grouped by their layout signature (the tuple of varying lengths), in increasing signature order:
    ``(stable row order, group bounds in it)``; None when all rows share one layout."""
    varying: list = []
    top = Msg(b"", children)
    if _bounds(top) is not None:  # every length prefix has one size: no per-row message lengths to add up
        _collect_varying(top, n, varying)
    else:
        _msg_len(top, n, varying)
    if not varying:
        return None
    # small keys sort by radix
    key = np.zeros(n, np.int64)
    for arr in varying:
        a = np.asarray(arr, np.int64)
        key = key * (int(a.max()) + 1) + a
    kmax = int(key.max())
    if kmax < 65536:
        cnt = np.bincount(key, minlength=kmax + 1)
        used = np.flatnonzero(cnt)
        if len(used) == 1:
            return None
        remap = np.zeros(kmax + 1, np.uint16)
        remap[used] = np.arange(len(used), dtype=np.uint16)
        inv = remap[key]
        sizes = cnt[used]
    else:
        uniq, inv, sizes = np.unique(key, return_inverse=True, return_counts=True)
        if len(uniq) == 1:
            return None
    order = np.argsort(inv, kind="stable")
    return order, np.concatenate([[0], np.cumsum(sizes)])


def encode_batched(fields, n: int, step: int = 1 << 16, whole: int | None = None):
    """The byte buffers of :func:`encode_parts` for ``n`` rows, yielded ``step`` rows at a time: ``fields(idx, full)``
    gives the field list of rows ``idx`` (an increasing index array, or a slice); with ``full`` False it is only asked
    for the rows' layouts (rfixed64 values are not read: a ``(rows, 0)`` array will do). The same bytes as one encoding
    of all rows; only a batch's fields are held, and a layout id per row (:func:`batched_order`). Up to ``whole``
    rows (default ``step``) they are encoded at once: no separate layout pass."""
    if not n:
        return
    if n <= max(step, whole or 0):
        parts, _ = encode_parts(fields(slice(0, n), True), n)
        yield from parts
        return
    order = batched_order(lambda i: fields(i, False), n, step)
    for a in range(0, n, step):
        idx = np.arange(a, min(n, a + step)) if order is None else np.sort(order[a : a + step])
        parts, _ = encode_parts(fields(idx, True), len(idx))
        yield from parts


def batched_order(fields, n: int, step: int) -> np.ndarray | None:
    """The row order of one encoding of all ``n`` rows (encoded in that order, consecutive ranges of it one at a
    time give the same bytes as one encoding of all rows), found a batch of ``step`` rows at a time: each row's
    layout signature (:func:`_sig`) as a small id, the rows then sorted stably by signature.
    Signatures compare as the whole encoding's radix keys do (the same lengths, in the same order; a length constant
    over all rows does not change the order), so the order is the same; memory: an id per row, not the fields."""
    ids = np.zeros(n, np.int32)
    sigs: dict[tuple, int] = {}
    for a in range(0, n, step):
        b = min(n, a + step)
        children = fields(slice(a, b))
        g = _layout_groups(children, b - a)
        if g is None:
            ids[a:b] = sigs.setdefault(tuple(_sig(children, 0, [])), len(sigs))
            continue
        order, bounds = g
        for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
            rows = order[lo:hi]
            ids[a + rows] = sigs.setdefault(tuple(_sig(children, int(rows[0]), [])), len(sigs))
    if len(sigs) == 1:
        return None
    rank = np.empty(len(sigs), np.int32)
    rank[[sigs[k] for k in sorted(sigs)]] = np.arange(len(sigs), dtype=np.int32)
    return np.argsort(rank[ids], kind="stable")
