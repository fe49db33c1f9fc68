"""One context of a dump as the emitters read it, and its device events walked in bounded chunks.

Memory stays bounded whatever the dump size: device events are walked in chunks of the mmap, each chunk's payload
checksum is folded in as it is read (the dumps are opened with ``verify_checksums=False`` and checked here, in the
same pass, by a worker thread beside the caller's work), and the pages of a walked chunk are given back to the page
cache (``MADV_DONTNEED``) on large dumps. Chunks are handed out in cache-sized slices (``SLICE`` events) where the
work is column by column, so that the records and their temporaries stay in cache.

The join (:class:`kvconv.join.exact.ExactJoin`) looks up each run of device events of one launch once:
tracer dumps carry gridid and tag, and their events come in runs of one launch's blocks.

    >>> for first, recs in ctx.chunks(1 << 18, sub=SLICE):      # doctest: +SKIP
    ...     starts, host_row = ctx.match_runs(first, recs)
"""

from __future__ import annotations

import contextlib
import mmap
import zlib
from dataclasses import dataclass

import numpy as np

from kvconv._workers import worker
from kvconv.clock import Clock
from kvconv.format.errors import DamagedError
from kvconv.join.events import RELEASE_BYTES
from kvconv.join.exact import ExactJoin, load_joined
from kvconv.join.launches import EAGER, GRAPH_NODE, LaunchTable
from kvconv.join.passes import chunk_rows
from kvconv.join.runs import expand_runs
from kvconv.memory import release_heap

__all__ = ["Ctx", "EAGER", "GRAPH_NODE", "SLICE", "RELEASE_BYTES"]

# device events processed at a time: 65,536 (4 MiB of records; their temporaries stay in the heap, kvconv.memory)
# against 16,384 took write_perfetto of the bench's 1M-event dump 199 -> 186 ms of CPU (median of 11 alternating
# runs in one process, 2-core AMD EPYC, 512 KiB L2 a core, 32 MiB L3): the per-slice Python costs more than the
# cache misses (docs/BENCH.md, issue 42)
SLICE = 1 << 16
PAGE = mmap.PAGESIZE


@dataclass
class Ctx:
    serial: int
    dump: object
    label: str
    run: str
    context_id: int
    device_id: int
    groups: list
    n_events: int
    host: LaunchTable | None  # None while a lazy context's table is let go (outside :meth:`held`)
    names: dict[int, str]
    clock: Clock
    device_drops: int
    host_drops: int
    meta: dict
    n_host: int = 0  # host launch records: the launch table's rows, whether it is loaded or not
    lazy: bool = False  # the launch table and exact join are loaded by :meth:`held` only, and let go after it
    hid: np.ndarray | None = None  # per device event: host table row, -1 unmatched (reconcile mode)
    join: str = "none"
    reconcile_result: object = None
    xjoin: ExactJoin | None = None  # the vectorised exact join (when reconcile's report is not needed)
    _runs: dict | None = None  # first index -> (events, run starts, host row per run), from the join probe
    _matched: int = 0
    verified: bool = False  # a whole pass has checked every device-event group's checksum
    salvage: bool = False  # --salvage: a checksum mismatch is said (warn) and the records converted anyway
    warn: object = None
    checks: object = None  # kvconv.check.validate.Validation of the dump (the verdict): fed by the first whole walk

    @property
    def release(self) -> bool:
        return self.dump.size > RELEASE_BYTES

    @contextlib.contextmanager
    def held(self, *, join: bool = True, drop: tuple = ()):
        """The context with its launch table (and, ``join``, its exact join) in memory for the block. A lazy
        context (a large dump joined by the streaming exact join) loads them here and lets them go after, so that
        the host state in memory is one context's whatever the number of contexts; others keep theirs. ``drop``:
        columns of the table the block does not read, let go at once (a use of one raises :class:`Dropped`)."""
        if not self.lazy or self.host is not None:
            yield self
            return
        self.host, self.xjoin = load_joined(self.dump, self.context_id, join=join, drop=drop)
        try:
            yield self
        finally:
            self.host = self.xjoin = self._runs = None
            release_heap()  # numpy's freed arrays in glibc's heap: gone from the resident set before the next context

    def kernel_name(self, slot: int) -> str:
        return self.names.get(int(slot), f"kernel slot {int(slot)}")

    # -- streaming over device events ------------------------------------------------------------------------

    def chunks(self, size: int, *, verify: bool = False, sub: int | None = None):
        """Yield ``(first_index, records)`` over all device events of the context, in bounded slices (of ``sub``
        events, when given: small enough for the records and their temporaries to stay in cache). ``verify``:
        check each group's payload checksum, once: the first pass that runs to the end does it (beside the
        caller's work, on another core), later passes trust it."""
        verify = verify and not self.verified
        walk = self.checks.begin(self.context_id, verifying=verify) if self.checks is not None else None
        try:
            yield from self._walk(size, verify, sub, walk)
            if walk is not None:
                walk.end()
                walk = None
        finally:
            if walk is not None:  # stopped before the end: a later walk feeds the checks
                walk.abandon()
        self.verified = self.verified or verify

    def _walk(self, size: int, verify: bool, sub: int | None, walk):
        base = 0
        mm = getattr(self.dump, "_mm", None)
        pool = worker("crc") if verify else None
        for g in self.groups:
            fut = None
            rs = int(g.header["record_size"])
            for s, view in g.chunks(size):
                if verify and len(view):  # the checksum runs beside the caller's work (zlib releases the GIL)
                    fut = pool.submit(_crc_after, view.view(np.uint8), fut)
                step = sub or max(len(view), 1)
                for a in range(0, max(len(view), 1), step):
                    if walk is not None:  # validate's checks of the slice, while it is in cache
                        walk.chunk(g, s + a, base + s + a, view[a : a + step])
                    yield base + s + a, view[a : a + step]
                if self.release and mm is not None:
                    if fut is not None:
                        fut.result()
                    lo = (g.payload_offset + s * rs) // PAGE * PAGE
                    hi = (g.payload_offset + (s + len(view)) * rs) // PAGE * PAGE
                    if hi > lo:
                        try:
                            mm.madvise(mmap.MADV_DONTNEED, lo, hi - lo)
                        except (OSError, ValueError, AttributeError):
                            pass
            crc = fut.result() if fut is not None else 0
            if walk is not None:
                walk.group_end(g, crc if verify else None)
            # a live group (a producer that died: no checksum summed) or a cut-short one has none to compare
            if verify and g.checksummed and crc != int(g.header["payload_crc32"]):
                checksum_mismatch(self.dump, g, salvage=self.salvage, warn=self.warn)
            base += len(g.records)

    def match_runs(self, first: int, recs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The join of a chunk as runs: ``(starts, host row of each run)`` (-1: unmatched). Device events come in
        runs of one launch's blocks, so the lookup runs once per run (:func:`kvconv.join.passes.chunk_rows`)."""
        return chunk_rows(first, recs, hid=self.hid, runs=self._runs, xjoin=self.xjoin)

    def match(self, first: int, recs: np.ndarray) -> np.ndarray:
        """Host table row of each event of a chunk (-1: unmatched)."""
        if self.hid is not None:
            return self.hid[first : first + len(recs)]
        starts, rhid = self.match_runs(first, recs)
        return expand_runs(starts, rhid, len(recs))

    def alignment(self) -> dict:
        """The context's clock alignment as every output reports it (EmitResult.alignment, the Chrome trace's
        otherData, each Arrow table's metadata)."""
        return {"dump": self.label, "run": self.run, "context_id": self.context_id, "device_id": self.device_id,
                **self.clock.bound()}


def checksum_mismatch(d, g, *, salvage: bool, warn) -> None:
    """A group whose payload does not match its checksum: damaged records, exit 1 (:class:`DamagedError`, as
    validate and info give); with --salvage a warning, and the records are converted as they are."""
    err = DamagedError("payload checksum does not match header.payload_crc32", path=d.path, group=g.index,
                       offset=g.payload_offset, field="header.payload_crc32", code="payload-checksum",
                       hint="the records are damaged; kvconv validate says more")
    if not salvage or warn is None:
        raise err
    warn(f"{err}; converted as they are (--salvage)")


def _crc_after(buf, prev) -> int:
    """crc32 of ``buf`` continuing the one of ``prev`` (a future of the one worker, so already done)."""
    return zlib.crc32(buf, prev.result() if prev is not None else 0)
