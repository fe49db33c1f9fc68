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


def best_cpu(reps: int, f, *a, before=None, **k):
    """Best of ``reps`` runs, wall and CPU: (best wall s, worst wall s, best CPU s, last result). CPU is
    ``time.process_time`` (user + system of every thread of this process): on a machine shared with other work it
    moves less than the wall time, which waits for the cores too."""
    ts, cs, r = [], [], None
    for _ in range(reps):
        if before is not None:
            before()
        c = time.process_time()
        t, r = timed(f, *a, **k)
        cs.append(time.process_time() - c)
        ts.append(t)
    return min(ts), max(ts), min(cs), r


def quantile(xs, p: float):
    """The ``p`` quantile of ``xs``: the sorted value nearest to rank ``p * (n - 1)`` (no interpolation)."""
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * (len(xs) - 1) + 0.5))]


def memcpy_gbs(mib: int = 256, reps: int = 5) -> float:
    """Best memory-copy bandwidth (GB/s) of ``mib`` MiB: how quiet the machine is right now (other work sharing the
    cores and memory bus lowers it)."""
    import numpy as np

    a = np.ones(mib << 20, np.uint8)
    b = np.empty_like(a)
    t = best(reps, np.copyto, b, a)[0]
    return a.nbytes / t / 1e9


def quietness(tag: str) -> str:
    """``quiet check (start): memcpy 9.8 GB/s, load average 0.31 (2 cores)``: print it before and after a bench."""
    import os

    one, five, fifteen = os.getloadavg()
    return (f"quiet check ({tag}): memcpy {memcpy_gbs():.1f} GB/s, load average {one:.2f} "
            f"({os.cpu_count()} cores; 5/15 min {five:.2f} {fifteen:.2f})")
