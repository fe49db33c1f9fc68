"""Arrow arrays from numpy columns and Python strings, built on pyarrow's buffers without ``pa.array``.

``pa.array`` asks pandas whether its argument is a pandas object, and that imports pandas when it is installed:
33 MiB of heap and 51 MiB of resident set in all (pyarrow 26, pandas 2), more than the Arrow writer's own state on a
1 GiB dump (issue 13: 10 GiB in <= 512 MiB). ``pa.Array.from_buffers`` over ``pa.py_buffer`` asks nothing and
copies nothing: the same array, the same bytes in every file.

    >>> import numpy as np, pyarrow as pa
    >>> array(pa, np.arange(3, dtype=np.int64), mask=np.array([False, True, False])).to_pylist()
    [0, None, 2]
    >>> array(pa, ["a", None, "bc"], pa.string()).to_pylist()
    ['a', None, 'bc']
"""

from __future__ import annotations

import numpy as np


def array(pa, values, type=None, *, mask: np.ndarray | None = None):  # noqa: A002 - pyarrow's own name
    """``pa.array(values, type, mask=mask)`` for a numpy array of numbers or booleans, or a sequence of ``str`` /
    ``bytes`` / None (``type``: ``pa.string()`` or ``pa.binary()``); anything else goes to ``pa.array``."""
    if isinstance(values, np.ndarray) and values.ndim == 1 and values.dtype.kind in "biuf":
        return _numbers(pa, values, type, mask)
    if type is not None and mask is None and isinstance(values, (list, tuple)) \
            and (type == pa.string() or type == pa.binary()):
        return _strings(pa, values, type)
    return pa.array(values, type, mask=mask)


def _validity(pa, n: int, mask: np.ndarray | None):
    """(validity buffer or None, null count) of ``mask`` (True: null)."""
    if mask is None:
        return None, 0
    nulls = int(np.count_nonzero(mask))
    if not nulls:
        return None, 0
    return pa.py_buffer(np.packbits(~np.asarray(mask, bool), bitorder="little")), nulls


def _numbers(pa, values: np.ndarray, type, mask):
    have = pa.from_numpy_dtype(values.dtype.newbyteorder("="))
    if type is None:
        type = have
    elif type != have:
        return pa.array(values, type, mask=mask)  # a cast: pyarrow's
    n = len(values)
    if values.dtype.kind == "b":
        data = np.packbits(values, bitorder="little")
    else:
        data = np.ascontiguousarray(values).astype(values.dtype.newbyteorder("="), copy=False)
    valid, nulls = _validity(pa, n, mask)
    return pa.Array.from_buffers(type, n, [valid, pa.py_buffer(data)], null_count=nulls)


def _strings(pa, values, type):
    enc = [v.encode("utf-8") if isinstance(v, str) else v for v in values]
    n = len(enc)
    nulls = np.fromiter((v is None for v in enc), bool, count=n)
    lens = np.fromiter((len(v) if v is not None else 0 for v in enc), np.int64, count=n)
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(lens, out=offsets[1:])
    if offsets[-1] >= (1 << 31):
        return pa.array(values, type)  # beyond 32-bit offsets: pyarrow's (large_string is another type)
    data = b"".join(v for v in enc if v is not None)
    valid, count = _validity(pa, n, nulls)
    return pa.Array.from_buffers(type, n, [valid, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(data)],
                                 null_count=count)
