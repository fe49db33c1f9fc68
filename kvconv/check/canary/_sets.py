"""Many small page sets at once: the canary's set arithmetic as numpy passes over CSR lists, no loop per record.

A batch of records' page lists is held as ``(offs, vals)``: record ``i``'s pages are ``vals[offs[i]:offs[i + 1]]``
(int64). Tagging each page with its record, ``key = i << 32 | page`` (pages are u32), turns per-record questions into
one sorted array: when every list is sorted, the keys of a batch are sorted too, so membership is one
``np.searchsorted`` and sorting every list at once is one ``np.unique``.

    >>> import numpy as np
    >>> a = csr([[1, 2, 5], [], [3, 4]]); b = csr([[2], [7], [4]])
    >>> offs, vals = difference(a, keyed(b))
    >>> offs.tolist(), vals.tolist()
    ([0, 2, 2, 3], [1, 5, 3])
"""

from __future__ import annotations

import numpy as np

Csr = tuple[np.ndarray, np.ndarray]  # (offsets [n + 1], values), int64
_EMPTY = np.zeros(0, dtype=np.int64)


def csr(lists) -> Csr:
    """Python lists -> CSR (for tests and doctests)."""
    offs = np.zeros(len(lists) + 1, dtype=np.int64)
    np.cumsum([len(x) for x in lists], out=offs[1:])
    vals = np.concatenate([np.asarray(x, dtype=np.int64) for x in lists]) if offs[-1] else _EMPTY
    return offs, vals


def offsets(counts: np.ndarray) -> np.ndarray:
    offs = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=offs[1:])
    return offs


def owners(offs: np.ndarray) -> np.ndarray:
    """The record each value belongs to."""
    return np.repeat(np.arange(len(offs) - 1, dtype=np.int64), np.diff(offs))


def gather(pages: np.ndarray, first: np.ndarray, count: np.ndarray) -> Csr:
    """``pages[first[i]:first[i] + count[i]]`` for every record, as one CSR (ranges already checked)."""
    offs = offsets(count)
    idx = np.repeat(first - offs[:-1], count) + np.arange(offs[-1], dtype=np.int64)
    return offs, pages[idx].astype(np.int64)


def first_unsorted(offs: np.ndarray, vals: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Records whose list is not strictly increasing, and for each the position in ``vals`` of the first value that
    is not below its successor."""
    if len(vals) < 2:
        return _EMPTY, _EMPTY
    own = owners(offs)
    at = np.flatnonzero((vals[1:] <= vals[:-1]) & (own[1:] == own[:-1]))
    if not len(at):
        return _EMPTY, _EMPTY
    recs, first = np.unique(own[at], return_index=True)
    return recs, at[first]


def sort_unique(offs: np.ndarray, vals: np.ndarray) -> Csr:
    """Every list sorted and de-duplicated, in one sort of the batch."""
    keys = np.unique((owners(offs) << 32) | vals)
    return offsets(np.bincount(keys >> 32, minlength=len(offs) - 1)), keys & 0xFFFFFFFF


def _member(keys: np.ndarray, sorted_keys: np.ndarray) -> np.ndarray:
    if not len(sorted_keys) or not len(keys):
        return np.zeros(len(keys), dtype=bool)
    pos = np.minimum(np.searchsorted(sorted_keys, keys), len(sorted_keys) - 1)
    return sorted_keys[pos] == keys


def keyed(a: Csr) -> np.ndarray:
    """``record << 32 | page`` for every value: sorted when every list is."""
    return (owners(a[0]) << 32) | a[1]


def difference(a: Csr, *others: np.ndarray, keys: np.ndarray | None = None) -> Csr:
    """Per record, the values of ``a`` in none of the lists keyed as ``others`` (:func:`keyed`; every list sorted and
    unique); order kept. ``keys``: ``keyed(a)`` when the caller has it."""
    keys = keyed(a) if keys is None else keys
    keep = np.ones(len(keys), dtype=bool)
    for o in others:
        keep &= ~_member(keys, o)
    return offsets(np.bincount(keys[keep] >> 32, minlength=len(a[0]) - 1)), a[1][keep]


def over(offs: np.ndarray, vals: np.ndarray, limit: np.ndarray) -> np.ndarray:
    """Records with a value ``>= limit[record]``."""
    own = owners(offs)
    return np.unique(own[vals >= limit[own]])
