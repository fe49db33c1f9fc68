"""Process memory hygiene: give the C heap's free memory back to the system between stages that each build large
temporaries, so that the resident set shows what is live, not what was.

    >>> from kvconv.memory import release_heap
    >>> release_heap()  # glibc malloc_trim(0); nothing where there is no glibc

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


@functools.cache
def _malloc_trim():
    """libc's ``malloc_trim``, looked up once; None where there is none (not glibc)."""
    import ctypes
    import ctypes.util

    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None
