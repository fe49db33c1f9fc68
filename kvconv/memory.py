"""Process memory hygiene: give the C heap's free memory back to the system between stages that each build large
temporaries, so that the resident set shows what is live, not what was.

    >>> from kvconv.memory import release_heap
    >>> release_heap()  # glibc malloc_trim(0); nothing where there is no glibc

map_large_arrays() (mallopt M_MMAP_THRESHOLD) is for processes that build one large state after another.

(A dump's mapped pages are given back by :func:`kvconv.format.reader.release_pages`, a reading concern.)
"""

from __future__ import annotations

import functools


def release_heap() -> None:
    """Give the C heap's free memory back to the system (glibc ``malloc_trim``; elsewhere nothing): numpy's freed
    temporaries below glibc's dynamic mmap threshold (up to 32 MiB) otherwise stay in the resident set, so that one
    context's reconciled state would still count while the next one's is built. Cheap: call it between stages."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def _malloc_trim():
    return _glibc("malloc_trim")


MAPPED_ARRAYS = 4 << 20  # bytes from which an allocation gets pages of its own (mmap), given back when freed


def map_large_arrays() -> None:
    """Have glibc give every allocation of ``MAPPED_ARRAYS`` bytes or more pages of its own (``mallopt``
    M_MMAP_THRESHOLD), returned to the system the moment it is freed. By default glibc raises that threshold (up to
    32 MiB) each time such a block is freed, after which one context's whole-table columns and their temporaries
    land in the heap, where the next context's, built among their holes, grew a 10 GiB Chrome trace's peak by
    ~100 MiB (issue 13). Chunk-sized temporaries stay below the threshold (no page faults added per chunk). For
    processes that hold one large state after another (the Chrome emitter calls it on large dumps); once set, glibc
    keeps it for the process."""
    fn = _mallopt()
    if fn is not None:
        fn(-3, MAPPED_ARRAYS)  # M_MMAP_THRESHOLD (malloc.h)


def _mallopt():
    return _glibc("mallopt")


@functools.cache
def _glibc(name: str):
    """glibc's function ``name``, looked up once; None where there is none (not glibc)."""
    import ctypes
    import ctypes.util

    try:
        return getattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6"), name)
    except (OSError, AttributeError):
        return None
