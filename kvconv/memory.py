"""Process memory hygiene: give the C heap's free memory back to the system between stages that each build large
temporaries, so that the resident set shows what is live, not what was.

    >>> from kvconv.memory import release_heap
    >>> release_heap()  # glibc malloc_trim(0); nothing where there is no glibc

stream_heap() (mallopt) is for processes that stream: many chunk-sized temporaries, one large state after another.

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
HEAP_TOP_KEPT = 32 << 20  # free bytes at the top of the heap kept for the next chunk's temporaries
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # malloc.h


def stream_heap() -> None:
    """Set glibc's heap for a streaming process (``mallopt``; elsewhere nothing): every allocation of
    ``MAPPED_ARRAYS`` bytes or more gets pages of its own, returned to the system the moment it is freed, and up to
    ``HEAP_TOP_KEPT`` free bytes stay at the top of the heap between chunks.

    Why both: glibc's default raises the mmap threshold each time a block that large is freed, and gives the top of
    the heap back to the system whenever more than twice that is free there, so a chunk's numpy temporaries were
    given back after every chunk and faulted in again for the next; with the threshold raised, one context's
    whole-table columns landed in the heap, where the next context's, built among their holes, grew the peak.
    Above ``MAPPED_ARRAYS`` they never do. The trim threshold bounds what the resident set keeps beyond the live
    arrays; :func:`release_heap` still gives everything free back between stages. Once set, glibc keeps both for
    the process. The figures: docs/results/streaming-10gib-2026-12-01/NOTES.md ("The heap")."""
    fn = _mallopt()
    if fn is not None:
        fn(_M_MMAP_THRESHOLD, MAPPED_ARRAYS)
        fn(_M_TRIM_THRESHOLD, HEAP_TOP_KEPT)


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
