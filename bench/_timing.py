"""Timing for the benchmarks: best of N runs in this process.

    from _timing import best
    t_best, t_worst, result = best(5, fn, arg, before=reset)
"""

from __future__ import annotations

import time


def timed(f, *a, **k):
    """(seconds, result) of one call."""
    t = time.perf_counter()
    r = f(*a, **k)
    return time.perf_counter() - t, r


def best(reps: int, f, *a, before=None, **k):
    """Best of ``reps`` runs: (best seconds, worst seconds, last result). ``before`` runs untimed before each run."""
    ts, r = [], None
    for _ in range(reps):
        if before is not None:
            before()
        t, r = timed(f, *a, **k)
        ts.append(t)
    return min(ts), max(ts), r
