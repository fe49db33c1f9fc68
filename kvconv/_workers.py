"""Named one-thread workers, started on first use and shared by the whole process: work that runs beside the caller's
(a checksum beside a reader, a column copy beside a writer). One thread a name, so jobs of one name run in the order
they were submitted.

    >>> from kvconv._workers import worker
    >>> worker("crc").submit(sum, [1, 2]).result()
    3
"""

from __future__ import annotations

import threading

_WORKERS: dict = {}
_LOCK = threading.Lock()


def worker(name: str):
    """The ``concurrent.futures`` executor of one thread called ``kvconv-NAME``."""
    w = _WORKERS.get(name)
    if w is None:
        from concurrent.futures import ThreadPoolExecutor

        with _LOCK:
            w = _WORKERS.get(name)
            if w is None:
                w = _WORKERS[name] = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"kvconv-{name}")
    return w
