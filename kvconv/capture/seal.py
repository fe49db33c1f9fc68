"""Seal the live dump of a process that ended without finishing it, when nothing it launched is missing.

An engine ends some of its processes with SIGKILL (SGLang's ``kill_process_tree``): no handler runs, and the tracer's
dump stays as its last flush left it: ``written_at: live``, every group reserving its whole capacity (a 2 GiB device
buffer is a 2 GiB sparse file) and the verdict incomplete. Yet when every group's ``drop_count`` is 0, every record
the process launched is in the file: the tracer counts a launched block, or a host row being written, as possibly
lost until it is published (docs/TRACER.md). :func:`seal` then writes the same records as a finished dump (a
temporary file renamed over the live one), its metadata saying so (``written_at: sealed-by-record``, ``sealed``).
A dump with anything pending, or whose process still runs, is left as it is. ``kvconv record`` seals what the run
left live.

    >>> from kvconv.capture.seal import seal
    >>> seal("run.pid831.kvdump")   # doctest: +SKIP
    'sealed'
"""

from __future__ import annotations

import os

import numpy as np

from kvconv.format.errors import KvconvError


def running(pid) -> bool:
    """Whether process ``pid`` still runs (one of another user's counts: EPERM)."""
    try:
        os.kill(int(pid), 0)
    except PermissionError:
        return True
    except (OSError, ValueError, TypeError):
        return False
    return True


def seal(path: str) -> str:
    """Seal ``path`` if it is a live dump whose process has ended with nothing pending. Returns ``"sealed"``, or why
    it was left alone: ``"finished"``, ``"unreadable"`` (or holding a kind this kvconv does not know), ``"running"``
    or ``"pending"`` (a group's drop_count is not 0: the verdict stays incomplete, as it should)."""
    import warnings

    from kvconv.format import dump

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "unfinished" is what this is about
            with dump.open(path) as d:
                why = _why_not(d)
                if why is None:
                    _rewrite(d, path, d.metadata() or {})
    except (KvconvError, OSError, ValueError):
        return "unreadable"
    return why or "sealed"


def _why_not(d) -> str | None:
    """Why dump ``d`` cannot be sealed; None when it can."""
    if not any(g.live for g in d.groups):
        return "finished"
    if any(int(g.header["drop_count"]) for g in d.groups):
        return "pending"
    if any(g.kind is None for g in d.groups):
        return "unreadable"  # a kind this kvconv does not know: not rewritten
    pid = (d.metadata() or {}).get("pid")
    return "running" if pid is not None and running(pid) else None


def _rewrite(d, path: str, meta: dict) -> None:
    from kvconv.format import dump

    meta = dict(meta, written_at="sealed-by-record", sealed={
        "by": "kvconv record",
        "why": "the process ended without finishing its dump (killed: no handler ran) after every record it launched "
               "was in the file: each group's drop_count was 0. The end clock-sync pair, the calibration and the "
               "tracer's end counters are not in it"})
    first = d.groups[0]
    with dump.new(path) as w:
        w.write_metadata(meta, context_id=int(first.header["context_id"]), device_id=int(first.header["device_id"]))
        for g in d.groups[1:]:
            h = g.header
            payload = memoryview(np.ascontiguousarray(g.records).view(np.uint8).reshape(-1))
            w.write_raw_group(g.kind, payload, record_count=len(g.records), capacity=int(h["capacity"]),
                              context_id=int(h["context_id"]), device_id=int(h["device_id"]),
                              clock_domain=int(h["clock_domain"]))
