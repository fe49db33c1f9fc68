"""What every emitter reads: the contexts of several dumps, their clock-sync pairs, host records, the join of device
events to host launches, and a first streaming pass that aggregates what the tracks need.

Memory stays bounded whatever the dump size: device events are walked in chunks of the mmap, each chunk's payload
checksum is folded in as it is read (the dumps are opened with ``verify_checksums=False`` and checked here, in the
same pass, by a worker thread beside the caller's work), and the pages of a walked chunk are given back to the page
cache (``MADV_DONTNEED``) on large dumps. Chunks are handed out in cache-sized slices (``SLICE`` events) where the
work is column by column, so that the records and their temporaries stay in cache.

The join (:class:`ExactJoin`) looks up each run of device events of one launch once: tracer dumps carry gridid and
tag, and their events come in runs of one launch's blocks.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kvconv.format import dump as dumpmod
from kvconv.format import layout
from kvconv._workers import worker
from kvconv.format.errors import FormatError, UsageError
from kvconv.check.reconcile.exact import ExactJoin
from kvconv.check.reconcile.launches import LaunchTable
from kvconv.emit._flows import Flows

GRAPH_NODE = layout.KINDS["graph_node"].id
EAGER = layout.KINDS["eager_launch"].id
_EVF = layout.ENUMS["event_flags"]
_EV_DT = layout.DTYPES["device_event"]
SLICE = 1 << 14  # device events processed at a time (records and temporaries stay in cache)
RELEASE_BYTES = 256 << 20  # dumps larger than this give walked pages back to the page cache
PAGE = mmap.PAGESIZE


@dataclass(frozen=True)
class EmitOptions:
    """Options shared by the emitters (keyword-only, frozen).

    chunk: device events per streaming chunk (bounds memory).
    flows: flows drawn from each host launch to at most this many of its device blocks (0: no flows).
    window_ms: keep device events from START to END ms after each context's first device event (host records are
      kept when their launch's events are, or, unmatched, when the window mapped through the clock-sync pairs
      holds them).
    replays: keep only graph replays (launch ids) FIRST..LAST, their host records and matched device events.
    reconcile: "auto" (the vectorised exact (gridid, tag) join, which gives kvconv.check.reconcile's matches, when every
      device event carrying a gridid finds its host record; else kvconv.check.reconcile when the dump has at most
      reconcile_max_events device events; else the exact join alone), "always" (kvconv.check.reconcile), "never" (the
      exact join alone).
    ui_limit_bytes: warn when a Perfetto/Chrome trace is bigger than the Perfetto UI loads comfortably.
    progress: show a progress bar (None: only when stderr is a terminal).
    arrow_format: "arrow" (IPC files) or "parquet"; compression: None, "lz4" or "zstd".
    salvage: read dumps cut short up to their last whole record (the loss is reported as a warning).
    """

    chunk: int = 1 << 18
    flows: int = 16
    window_ms: tuple[float, float] | None = None
    replays: tuple[int, int] | None = None
    reconcile: str = "auto"
    reconcile_max_events: int = 4_000_000
    ui_limit_bytes: int = 1 << 30
    progress: bool | None = None
    verify_checksums: bool = True
    arrow_format: str = "arrow"
    compression: str | None = None
    salvage: bool = False
    force: bool = False  # replace an existing output (kvconv.atomic.check_output says what is never replaced)

    def __post_init__(self) -> None:
        if self.chunk < 1:
            raise UsageError("chunk must be positive", code="bad-chunk")
        if self.flows < 0:
            raise UsageError("--flows must be 0 or more", code="bad-flows")
        if self.reconcile not in ("auto", "always", "never"):
            raise UsageError("reconcile must be auto, always or never", code="bad-reconcile")
        if self.window_ms is not None and not (self.window_ms[0] <= self.window_ms[1]):
            raise UsageError("--window START:END needs START <= END", code="bad-window")
        if self.replays is not None and not (self.replays[0] <= self.replays[1]):
            raise UsageError("--replays FIRST:LAST needs FIRST <= LAST", code="bad-replays")
        if self.arrow_format not in ("arrow", "parquet"):
            raise UsageError("--format must be arrow or parquet", code="bad-format")
        if self.compression not in (None, "lz4", "zstd"):
            raise UsageError("--compression must be none, lz4 or zstd", code="bad-compression")


@dataclass
class EmitResult:
    output: str
    contexts: int = 0
    device_events: int = 0
    host_records: int = 0
    written_events: int = 0
    bytes_written: int = 0
    flows: int = 0
    join: list[str] = field(default_factory=list)
    alignment: list[dict] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    timings: dict = field(default_factory=dict)  # seconds per phase (arrow: join, record_tables, matches)


def parse_range(text: str | None, *, what: str, cast=float):
    if text is None:
        return None
    try:
        a, b = text.split(":")
        return cast(a), cast(b)
    except ValueError:
        raise UsageError(f"{what} must look like START:END, not {text!r}", code="bad-range") from None


# ---------------------------------------------------------------------------------------------------------------
# host records


# The launch table (kvconv.check.reconcile.launches.LaunchTable: graph-node rows, then eager launches; one dedup, one node
# order) and its exact join are reconcile's own: one implementation of each, used here and there.
Host = LaunchTable


def _host(d, ctx: int) -> Host:
    return LaunchTable.load(d, ctx)


def unique_pairs(a: np.ndarray, b: np.ndarray):
    """Distinct (a, b) pairs: (a of each pair, index of its first occurrence, inverse per element)."""
    n = len(a)
    if not n:
        return a[:0], np.zeros(0, np.int64), np.zeros(0, np.int64)
    o = np.lexsort((np.arange(n), b, a))
    sa, sb = a[o], b[o]
    new = np.concatenate([[True], (sa[1:] != sa[:-1]) | (sb[1:] != sb[:-1])])
    gid = np.cumsum(new) - 1
    inv = np.empty(n, np.int64)
    inv[o] = gid
    return sa[new], o[new], inv


# ---------------------------------------------------------------------------------------------------------------
# clock alignment (through the dump's own clock-sync pairs; never raw host - device)


@dataclass
class Clock:
    pairs: np.ndarray  # clock_sync records sorted by gpu_ns

    @property
    def n(self) -> int:
        return len(self.pairs)

    def bound(self) -> dict:
        """Alignment error bound: the worst pair uncertainty plus the worst drift between neighbouring pairs (how
        much the host interval and the device interval between two pairs differ, each measured in its own clock)."""
        p = self.pairs
        if not len(p):
            return {"pairs": 0, "uncertainty_ns": None, "drift_ns": None, "bound_ns": None}
        unc = int(p["uncertainty_ns"].max())
        drift = 0
        if len(p) > 1:
            dh = np.diff(p["host_ns"].astype(np.int64))
            dg = np.diff(p["gpu_ns"].astype(np.int64))
            drift = int(np.abs(dh - dg).max())
        return {"pairs": int(len(p)), "uncertainty_ns": unc, "drift_ns": drift, "bound_ns": unc + drift}

    def to_host(self, gpu_ns: np.ndarray) -> np.ndarray:
        """Device ns -> host CLOCK_MONOTONIC ns through the nearest earlier pair (the first before the first pair),
        as trace_processor converts a clock from its snapshots: host_i + (gpu - gpu_i)."""
        return self._map(gpu_ns, "gpu_ns", "host_ns")

    def to_device(self, host_ns: np.ndarray) -> np.ndarray:
        """Host CLOCK_MONOTONIC ns -> device ns, the same way round."""
        return self._map(host_ns, "host_ns", "gpu_ns")

    def _map(self, t: np.ndarray, src: str, dst: str) -> np.ndarray:
        t = np.asarray(t, dtype=np.uint64)
        p = self.pairs
        if not len(p):
            return t.astype(np.int64)
        ps = p[src]
        i = np.searchsorted(ps, t, side="right") - 1
        np.clip(i, 0, len(p) - 1, out=i)
        return p[dst].astype(np.int64)[i] + (t.astype(np.int64) - ps.astype(np.int64)[i])


# ---------------------------------------------------------------------------------------------------------------
# contexts


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
    host: Host
    names: dict[int, str]
    clock: Clock
    device_drops: int
    host_drops: int
    meta: dict
    hid: np.ndarray | None = None  # per device event: host table row, -1 unmatched (reconcile mode)
    replay_of_event: np.ndarray | None = None
    join: str = "none"
    reconcile_result: object = None
    xjoin: "ExactJoin | None" = None  # the vectorised exact join (when reconcile's report is not needed)
    _runs: dict | None = None  # first index -> (events, run starts, host row per run), from the join probe
    _matched: int = 0
    verified: bool = False  # a whole pass has checked every device-event group's checksum

    @property
    def release(self) -> bool:
        return self.dump.size > RELEASE_BYTES

    def kernel_name(self, slot: int) -> str:
        return self.names.get(int(slot), f"kernel slot {int(slot)}")

    # -- streaming over device events ------------------------------------------------------------------------

    def chunks(self, size: int, *, verify: bool = False, sub: int | None = None):
        """Yield ``(first_index, records)`` over all device events of the context, in bounded slices (of ``sub``
        events, when given: small enough for the records and their temporaries to stay in cache). ``verify``:
        check each group's payload checksum, once: the first pass that runs to the end does it (beside the
        caller's work, on another core), later passes trust it."""
        verify = verify and not self.verified
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
            if verify and not g.lost_records and crc != int(g.header["payload_crc32"]):
                raise FormatError("payload checksum does not match header.payload_crc32", path=self.dump.path,
                                  group=g.index, offset=g.payload_offset, field="header.payload_crc32",
                                  code="payload-checksum", hint="the records are damaged; kvconv validate says more")
            base += len(g.records)
        self.verified = self.verified or verify

    def match_runs(self, first: int, recs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The join of a chunk as runs: ``(starts, host row of each run)`` (-1: unmatched). Device events come in
        runs of one launch's blocks, so the lookup runs once per run."""
        n = len(recs)
        if self.hid is not None:
            return _runs_of(self.hid[first : first + n])
        cached = self._runs.get(first) if self._runs is not None else None
        if cached is not None and cached[0] == n:
            return cached[1], cached[2]
        if self.xjoin is None or not n:
            return np.zeros(min(n, 1), np.int64), np.full(min(n, 1), -1, np.int64)
        starts = _event_runs(recs)
        return starts, self.xjoin.lookup(*_heads(recs, starts))

    def match(self, first: int, recs: np.ndarray) -> np.ndarray:
        """Host table row of each event of a chunk (-1: unmatched)."""
        if self.hid is not None:
            return self.hid[first : first + len(recs)]
        starts, rhid = self.match_runs(first, recs)
        return expand_runs(starts, rhid, len(recs))


class BackgroundWriter:
    """``f.write`` in a second thread, so that encoding the next buffers overlaps writing these (numpy and the
    write both release the GIL). At most ``limit`` bytes wait, so memory stays bounded. The buffers handed over
    must not change afterwards. A write error is raised in the caller's thread, at its next write or at close.

        >>> import io
        >>> f = io.BytesIO()
        >>> with BackgroundWriter(f) as w:
        ...     w.write(b"a"); w.write(b"b")
        >>> f.getvalue()
        b'ab'
    """

    def __init__(self, f, limit: int = 32 << 20) -> None:
        import collections
        import threading

        self.f, self.limit = f, limit
        self.queue: collections.deque = collections.deque()
        self.waiting = 0  # bytes queued or being written
        self.error: BaseException | None = None
        self.closing = False
        self.cv = threading.Condition()
        self.thread = threading.Thread(target=self._run, name="kvconv-writer", daemon=True)
        self.thread.start()

    def write(self, b) -> None:
        n = memoryview(b).nbytes
        with self.cv:
            while self.waiting > self.limit and self.error is None:
                self.cv.wait()
            if self.error is not None:
                raise self.error
            self.queue.append((b, n))
            self.waiting += n
            self.cv.notify_all()

    def _run(self) -> None:
        while True:
            with self.cv:
                while not self.queue and not self.closing:
                    self.cv.wait()
                if not self.queue:
                    return
                b, n = self.queue.popleft()
            try:
                self.f.write(b)
            except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
                with self.cv:
                    self.error = e
                    self.queue.clear()
                    self.cv.notify_all()
                return
            with self.cv:
                self.waiting -= n
                self.cv.notify_all()

    def close(self) -> None:
        """Wait until everything is written; raise the write error, if any."""
        with self.cv:
            self.closing = True
            self.cv.notify_all()
        self.thread.join()
        if self.error is not None:
            raise self.error

    def __enter__(self) -> "BackgroundWriter":
        return self

    def __exit__(self, kind, value, tb) -> None:
        if kind is None:
            self.close()
            return
        with self.cv:  # the caller failed: drop what waits, let the thread end
            self.queue.clear()
            self.closing = True
            self.cv.notify_all()
        self.thread.join()


def _crc_after(buf, prev) -> int:
    """crc32 of ``buf`` continuing the one of ``prev`` (a future of the one worker, so already done)."""
    return zlib.crc32(buf, prev.result() if prev is not None else 0)


def _runs_of(hid: np.ndarray):
    """Run starts of equal values in ``hid`` and the value of each run (returned as (starts, values))."""
    n = len(hid)
    if not n:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    st = np.flatnonzero(hid[1:] != hid[:-1]) + 1
    starts = np.concatenate([[0], st]).astype(np.int64)
    return starts, hid[starts].astype(np.int64)


def expand_runs(starts: np.ndarray, values: np.ndarray, n: int) -> np.ndarray:
    if not n:
        return np.zeros(0, np.int64)
    if len(starts) == n:
        return values.astype(np.int64, copy=False)
    return np.repeat(values, np.diff(np.append(starts, n)))


_OFF = {name: _EV_DT.fields[name][1] for name in _EV_DT.names}


def _event_runs(recs: np.ndarray) -> np.ndarray:
    """Starts of runs of device events with equal (gridid, tag, kind, flags)."""
    n = len(recs)
    if n <= 1:
        return np.zeros(n, np.int64)
    if recs.dtype == _EV_DT and recs.dtype.itemsize % 8 == 0 and recs.flags.c_contiguous \
            and _OFF["flags"] == _OFF["kind"] + 1 and _OFF["kind"] // 8 == (_OFF["flags"]) // 8:
        w = recs.view(np.uint64).reshape(n, _EV_DT.itemsize // 8)
        g, t = w[:, _OFF["gridid"] // 8], w[:, _OFF["tag"] // 8]
        kf = w[:, _OFF["kind"] // 8] >> np.uint64(8 * (_OFF["kind"] % 8))
    else:
        g, t = recs["gridid"], recs["tag"]
        kf = recs["kind"].astype(np.uint16) | (recs["flags"].astype(np.uint16) << np.uint16(8))
    chg = g[1:] != g[:-1]
    chg |= t[1:] != t[:-1]
    chg |= kf[1:] != kf[:-1]
    st = np.flatnonzero(chg)
    out = np.empty(len(st) + 1, np.int64)
    out[0] = 0
    out[1:] = st + 1
    return out


_BLOCK_ENTER = layout.ENUMS["event_kind"]["block_enter"]


def _heads(recs: np.ndarray, starts: np.ndarray):
    """(gridid, tag, flags, kind) of the events at ``starts``."""
    if _OFF["kind"] % 8 <= 6 and recs.flags.c_contiguous and recs.dtype == _EV_DT:
        w = recs.view(np.uint64).reshape(len(recs), _EV_DT.itemsize // 8)[starts]
        kf = w[:, _OFF["kind"] // 8]
        return (w[:, _OFF["gridid"] // 8], w[:, _OFF["tag"] // 8],
                (kf >> np.uint64(8 * (_OFF["flags"] % 8))) & np.uint64(0xFF),
                (kf >> np.uint64(8 * (_OFF["kind"] % 8))) & np.uint64(0xFF))
    h = recs[starts]
    return h["gridid"], h["tag"], h["flags"], h["kind"]


def _safe(s: str) -> str:
    out = "".join(c if (c.isalnum() or c in "-_.") else "_" for c in s)
    return out or "run"


@contextlib.contextmanager
def emit_run(paths, out, options: EmitOptions, warn, name: str, passes: int):
    """What every emitter does around its own writing: refuse to overwrite an input, open the dumps' contexts, show
    a progress bar over ``passes`` walks of the device events, and close it all, whatever happens.

    Yields ``(res, warn, paths, ctxs, bar)``; the caller writes, then sets ``res.bytes_written``."""
    from kvconv.atomic import check_output

    res = EmitResult(output=str(out))
    warn = warn or res.warnings.append
    paths = [str(p) for p in paths]
    check_output(out, inputs=paths, directory=name == "arrow", kind=name, force=options.force)  # before any work
    dumps, ctxs = open_contexts(paths, options, warn, res.timings)
    try:
        total = sum(c.n_events for c in ctxs)
        bar = Progress(f"{name} {', '.join(Path(p).name for p in paths)}", total=passes * total,
                       size_bytes=sum(d.size for d in dumps),
                       options=ProgressOptions.from_cli(progress=options.progress))
        try:
            yield res, warn, paths, ctxs, bar
        finally:
            bar.close()
        res.contexts = len(ctxs)
        res.device_events = total
    finally:
        for d in dumps:
            d.close()


def open_contexts(paths: list, options: EmitOptions, warn, timings: dict | None = None) -> tuple[list, list[Ctx]]:
    """Open the dumps (checksums are verified while streaming) and describe each context."""
    if not paths:
        raise UsageError("give at least one dump", code="no-input")
    dumps = dumpmod.open_many(paths, options=dumpmod.ReadOptions(verify_checksums=False, salvage=options.salvage))
    ctxs: list[Ctx] = []
    runs: dict[str, int] = {}
    try:
        for di, d in enumerate(dumps):
            if options.verify_checksums:
                for g in d.groups:
                    if g.kind is not None and g.kind.name != "device_event" and not g.lost_records and not g.crc_ok():
                        raise FormatError("payload checksum does not match header.payload_crc32", path=d.path,
                                          group=g.index, offset=g.payload_offset, field="header.payload_crc32",
                                          code="payload-checksum", hint="the records are damaged")
            meta = d.metadata()
            stem = _safe(Path(d.path).name.split(".")[0])
            run = stem if stem not in runs else f"{stem}-{di}"
            runs[run] = di
            for ctx, dev in d.contexts():
                if any(c.dump is d and c.context_id == ctx for c in ctxs):
                    continue
                groups = d.groups_of("device_event", context_id=ctx)
                kinds = {g.kind.name for g in d.groups if g.kind is not None and g.context_id == ctx}
                if not (kinds & {"device_event", "graph_node", "eager_launch", "canary", "clock_sync"}):
                    continue
                cs = np.array(d.records("clock_sync", context_id=ctx))
                cs = cs[np.argsort(cs["gpu_ns"], kind="stable")] if len(cs) else cs
                c = Ctx(serial=len(ctxs), dump=d, label=Path(d.path).name, run=run, context_id=ctx, device_id=dev,
                        groups=groups, n_events=sum(len(g.records) for g in groups), host=_host(d, ctx),
                        names=d.kernel_names(context_id=ctx), clock=Clock(cs),
                        device_drops=d.drops("device_event", context_id=ctx),
                        host_drops=d.drops("graph_node", context_id=ctx) + d.drops("eager_launch", context_id=ctx),
                        meta=meta)
                if d.size > RELEASE_BYTES:  # the launch table holds copies: the records' pages can go
                    release_groups(d, ("graph_node", "eager_launch"), ctx)
                if not len(cs) and c.n_events:
                    warn(f"{c.label} context {ctx}: no clock-sync pairs; device events keep their raw %globaltimer "
                         "times and are not aligned with host records")
                ctxs.append(c)
        t = time.perf_counter()
        _join(ctxs, options, warn)
        if timings is not None:
            timings["join"] = time.perf_counter() - t
    except BaseException:
        for d in dumps:
            d.close()
        raise
    return dumps, ctxs


def release_groups(d, kinds, ctx: int) -> None:
    """Give the pages of a context's groups of ``kinds`` back (read again from the page cache if asked for)."""
    for kind in kinds:
        for g in d.groups_of(kind, context_id=ctx):
            rs = int(g.header["record_size"])
            dumpmod.release_pages(getattr(d, "_mm", None), g.payload_offset, len(g.records) * rs)


def _join(ctxs: list[Ctx], options: EmitOptions, warn) -> None:
    """Device event -> host record, per dump.

    "auto": the vectorised exact join (:class:`ExactJoin`, the same matches as kvconv.check.reconcile's exact join) when
    every device event that carries a gridid finds its host record; otherwise (no gridids: the ordered join; or
    unmatched events, which reconcile explains and attributes) kvconv.check.reconcile's matches, up to
    ``reconcile_max_events``. "always": kvconv.check.reconcile. "never": the vectorised exact join only."""
    try:
        from kvconv.check import reconcile as rec
    except ImportError:  # pragma: no cover - reconcile is part of kvconv
        rec = None
    by_dump: dict[int, list[Ctx]] = {}
    for c in ctxs:
        by_dump.setdefault(id(c.dump), []).append(c)
    for cs in by_dump.values():
        d = cs[0].dump
        total = sum(c.n_events for c in cs)
        for c in cs:
            c.xjoin = ExactJoin(c.host) if c.host.n else None
        use = rec is not None and options.reconcile != "never" and (
            options.reconcile == "always" or total <= options.reconcile_max_events)
        if use and options.reconcile == "auto":
            use = not all(_probe(c, options) for c in cs)
        res = None
        if use:
            try:
                res = rec.reconcile(d, options=rec.ReconcileOptions())  # not relaxed: .ok is the verdict to report
            except Exception as e:  # noqa: BLE001 - fall back to the streaming join, and say so
                warn(f"{cs[0].label}: reconcile failed ({e}); using exact gridid joins only")
                res = None
        elif rec is not None and options.reconcile == "auto" and total > options.reconcile_max_events:
            warn(f"{cs[0].label}: {total:,} device events exceed the {options.reconcile_max_events:,} up to which "
                 "--join auto runs kvconv reconcile's join; flows and node slices use the streaming exact (gridid) "
                 "join only (--join reconcile runs it anyway)")
        for c in cs:
            h = c.host
            if res is not None:
                c._runs = None
                m = res.matches[res.matches["context_id"] == c.context_id]
                hid = np.full(c.n_events, -1, np.int64)
                di = m["device_index"]
                ok = (di >= 0) & (di < c.n_events) & (m["host_index"] >= 0)
                hk, hx = m["host_kind"][ok], m["host_index"][ok]
                row = np.where(hk == GRAPH_NODE, hx, h.n_gn + hx)
                good = (row >= 0) & (row < h.n) & ((hk == GRAPH_NODE) | (hk == EAGER))
                hid[di[ok][good]] = row[good]
                c.hid = hid
                c.reconcile_result = res
                joins = {int(j) for j in np.unique(m["join"][ok])} if ok.any() else set()
                c.join = "+".join(rec.JOIN_NAMES[j] for j in sorted(joins) if j) or "none"
            elif options.reconcile == "auto" and c._runs is not None:
                c.join = "exact" if c._matched else "none"  # what reconcile calls the same matches
            else:
                c.join = "exact(gridid)"


RUNS_CACHE = 1 << 22  # runs kept from the join probe for the first pass (beyond: looked up again)


def release_join(ctxs: list, options: EmitOptions) -> None:
    """After the first pass and the verdict on it: the second pass of Perfetto and Chrome asks the join only for
    --replays; without it the exact join's tables and the probe's runs go (memory that grows with the host records
    and, up to RUNS_CACHE, with the events)."""
    if options.replays is None:
        for c in ctxs:
            c.xjoin, c._runs = None, None


def _probe(c: Ctx, options: EmitOptions) -> bool:
    """Run the vectorised exact join over the context; True when its matches are reconcile's: some event carries a
    gridid (else reconcile joins in order) and every block-enter event carrying one found its host record (else
    reconcile explains and attributes them). Keeps the runs for the first pass."""
    c._runs, c._matched = {}, 0
    if c.xjoin is None or not c.n_events:
        c._runs = None
        return False
    kept = 0
    any_gid = False
    for first, recs in c.chunks(options.chunk, sub=SLICE, verify=options.verify_checksums):
        starts = _event_runs(recs)
        hg, ht, hf, hk = _heads(recs, starts)
        rhid = c.xjoin.lookup(hg, ht, hf, hk)
        gid = (hk == _BLOCK_ENTER) & ((hf & _EVF["has_gridid"]) != 0)
        any_gid = any_gid or bool(gid.any())
        if bool((gid & (rhid < 0)).any()):
            c._runs = None
            return False
        c._matched += int((rhid >= 0).sum())
        kept += len(starts)
        if kept <= RUNS_CACHE:
            c._runs[first] = (len(recs), starts, rhid)
    if not any_gid:
        c._runs = None
        return False
    return True


# ---------------------------------------------------------------------------------------------------------------
# first pass: what the tracks need


@dataclass
class Agg:
    """Per-context aggregates of the first streaming pass."""

    count: np.ndarray  # per host row: matched device events kept
    first_ts: np.ndarray  # per host row: earliest matched block entry (device ns, uint64)
    last_ts: np.ndarray
    flows: Flows  # per host row: the device events that end its flows
    sm_count: np.ndarray  # events per SM id
    slots: np.ndarray  # kernel slots seen
    t0: int | None  # first device event ns (min)
    t1: int | None
    rate_ms: np.ndarray  # events-per-ms counter as a step function: ms bins where the count changes (uint64) ...
    rate_vals: np.ndarray  # ... and the count from there on (the last step is back to 0)
    kept: int  # device events kept by the filters
    kept_hosts: np.ndarray  # bool per host row


def event_keep(c: Ctx, recs: np.ndarray, hid: np.ndarray, options: EmitOptions, t0: int | None) -> np.ndarray | None:
    """Filter mask of a chunk (None: keep all)."""
    keep = None
    if options.window_ms is not None and t0 is not None:
        lo = t0 + int(options.window_ms[0] * 1e6)
        hi = t0 + int(options.window_ms[1] * 1e6)
        ts = recs["globaltimer"]
        keep = (ts >= np.uint64(max(lo, 0))) & (ts <= np.uint64(max(hi, 0)))
    if options.replays is not None:
        h = c.host
        a, b = options.replays
        ok_h = (h.kind == GRAPH_NODE) & (h.launch_id >= a) & (h.launch_id <= b)
        k2 = (hid >= 0) & ok_h[np.maximum(hid, 0)]
        keep = k2 if keep is None else keep & k2
    return keep


def first_pass(c: Ctx, options: EmitOptions, progress=None) -> Agg:
    h = c.host
    K = options.flows
    count = np.zeros(h.n, np.int64)
    first = np.full(h.n, np.iinfo(np.uint64).max, np.uint64)
    last = np.zeros(h.n, np.uint64)
    flows = Flows.new(h.n, K)
    sm = np.zeros(1 << 16, np.int64)
    slots: set[int] = set()
    t0 = t1 = None
    # t0 (the window's origin) needs the first event time before filtering: take the min over the first chunk
    # walk cheaply when a window is asked for.
    if options.window_ms is not None and c.n_events:
        mins = [int(g.records["globaltimer"].min()) for g in c.groups if len(g.records)]
        t0 = min(mins) if mins else None
    bins_parts: list[np.ndarray] = []  # per chunk: distinct ms bins and their counts (sparse: bounded by the events,
    cnt_parts: list[np.ndarray] = []  # never by the time span a damaged timestamp can open)
    kept = 0
    filtered = options.window_ms is not None or options.replays is not None
    for first_i, recs in c.chunks(options.chunk, verify=options.verify_checksums, sub=SLICE):
        if progress is not None:
            progress(len(recs))
        if not len(recs):
            continue
        starts, rhid = c.match_runs(first_i, recs)
        ts = recs["globaltimer"]
        dev_index = None
        if filtered:
            hid = expand_runs(starts, rhid, len(recs))
            keep = event_keep(c, recs, hid, options, t0)
            if keep is not None:
                idx = np.flatnonzero(keep)
                recs, hid, ts = recs[idx], hid[idx], ts[idx]
                dev_index = first_i + idx
                starts, rhid = _runs_of(hid)
        n = len(ts)
        if not n:
            continue
        kept += n
        tsi = np.ascontiguousarray(ts, dtype=np.uint64)
        lo, hi = int(tsi.min()), int(tsi.max())
        t0 = lo if t0 is None or (options.window_ms is None and lo < t0) else t0
        t1 = hi if t1 is None or hi > t1 else t1
        sm += np.bincount(recs["smid"], minlength=1 << 16)
        ks = recs["kernel_slot"]
        kmin, kmax = int(ks.min()), int(ks.max())
        slots.update([kmin] if kmin == kmax else np.unique(ks).tolist())
        # events per ms
        ms = tsi // np.uint64(1_000_000)
        if lo // 1_000_000 == hi // 1_000_000:
            bins_parts.append(ms[:1])
            cnt_parts.append(np.array([n], np.int64))
        else:
            b, k = np.unique(ms, return_counts=True)
            bins_parts.append(b)
            cnt_parts.append(k.astype(np.int64))
        _add_runs(count, first, last, flows, starts, rhid, tsi, first_i, dev_index)
    flows.finish(count)
    kept_hosts = _kept_hosts(c, options, count, t0)
    rate_ms, rate_vals = rate_steps(bins_parts, cnt_parts)
    return Agg(count=count, first_ts=first, last_ts=last, flows=flows, sm_count=sm,
               slots=np.array(sorted(slots), np.int64), t0=t0, t1=t1, rate_ms=rate_ms, rate_vals=rate_vals, kept=kept,
               kept_hosts=kept_hosts)


def _add_runs(count, first, last, flows: Flows, starts, rhid, tsi, first_i: int, dev_index) -> None:
    """Fold a chunk's runs (one host row each) into the per-row count, first and last entry, and the first K
    device events of each row that end a flow."""
    n = len(tsi)
    m = rhid >= 0
    if m.any():
        rl = np.diff(np.append(starts, n))
        hm, rlm, sm_ = rhid[m], rl[m], starts[m]
        base = _run_bases(hm, rlm, count) if flows.K else None
        rmin = np.minimum.reduceat(tsi, starts)[m]
        rmax = np.maximum.reduceat(tsi, starts)[m]
        if _distinct(hm, len(count)):
            count[hm] += rlm
            np.minimum(first[hm], rmin, out=rmin)
            first[hm] = rmin
            np.maximum(last[hm], rmax, out=rmax)
            last[hm] = rmax
        else:
            np.add.at(count, hm, rlm)
            np.minimum.at(first, hm, rmin)
            np.maximum.at(last, hm, rmax)
        if flows.K:
            flows.add(hm, base, np.clip(flows.K - base, 0, rlm), sm_, first_i, dev_index)


def _kept_hosts(c: Ctx, options: EmitOptions, count: np.ndarray, t0: int | None) -> np.ndarray:
    """Host rows the filters keep: in --replays, and for --window matched inside it or (unmatched) launched inside
    it on the host clock."""
    h = c.host
    kept_hosts = np.ones(h.n, bool)
    if options.replays is not None:
        a, b = options.replays
        kept_hosts = (h.kind == GRAPH_NODE) & (h.launch_id >= a) & (h.launch_id <= b)
    if options.window_ms is not None:
        in_win = count > 0
        unm = count == 0
        if t0 is not None and c.clock.n:
            lo = c.clock.to_host(np.array([t0 + int(options.window_ms[0] * 1e6)], np.uint64))[0]
            hi = c.clock.to_host(np.array([t0 + int(options.window_ms[1] * 1e6)], np.uint64))[0]
            hn = h.host_ns.astype(np.int64)
            in_win = in_win | (unm & (hn >= lo) & (hn <= hi))
        kept_hosts &= in_win
    return kept_hosts


def _distinct(hm: np.ndarray, n: int) -> bool:
    """Whether the values of ``hm`` (host rows) are all different."""
    if len(hm) <= 1 or bool(np.all(hm[1:] > hm[:-1])):
        return True
    return int(np.bincount(hm, minlength=n).max()) <= 1


def _run_bases(hm: np.ndarray, rl: np.ndarray, count: np.ndarray) -> np.ndarray:
    """Events of each run's host row before the run: earlier chunks (``count``) plus earlier runs of this chunk."""
    base = count[hm].copy()
    if len(hm) > 1 and not bool(np.all(hm[1:] > hm[:-1])):
        o = np.argsort(hm, kind="stable")
        s, r = hm[o], rl[o]
        cs = np.cumsum(r) - r  # exclusive, over the sorted runs
        head = np.flatnonzero(np.concatenate([[True], s[1:] != s[:-1]]))
        cs -= np.repeat(cs[head], np.diff(np.append(head, len(s))))
        base[o] += cs
    return base


def rate_steps(bins_parts: list, cnt_parts: list) -> tuple[np.ndarray, np.ndarray]:
    """Merge per-chunk (ms bin, count) pairs into the change points of the events-per-ms step function, with the
    drop back to 0 after each run of busy milliseconds (what a dense histogram's change points would give)."""
    if not bins_parts:
        return np.zeros(0, np.uint64), np.zeros(0, np.int64)
    bins, inv = np.unique(np.concatenate(bins_parts), return_inverse=True)
    counts = np.bincount(inv, weights=np.concatenate(cnt_parts)).astype(np.int64)
    nxt = np.r_[bins[1:], bins[-1]]
    gap = np.r_[nxt[:-1] != bins[:-1] + np.uint64(1), True] & (bins < np.uint64(2**64 - 1))
    pts = np.concatenate([bins, bins[gap] + np.uint64(1)])
    vals = np.concatenate([counts, np.zeros(int(gap.sum()), np.int64)])
    o = np.argsort(pts, kind="stable")
    pts, vals = pts[o], vals[o]
    keep = np.r_[True, vals[1:] != vals[:-1]]
    return pts[keep], vals[keep]


def _add_counts(count: np.ndarray, hm: np.ndarray) -> None:
    count += np.bincount(hm, minlength=len(count))


def _bincount_at(hm: np.ndarray, n: int) -> np.ndarray:
    """How many times each element's value occurs in ``hm`` (per element)."""
    return np.bincount(hm, minlength=n)[hm]


def _ranks(hm: np.ndarray) -> np.ndarray:
    """Rank of each element among equal values, in order (0 for the first occurrence)."""
    n = len(hm)
    if n == 0:
        return np.zeros(0, np.int64)
    if n == 1 or bool(np.all(hm[1:] >= hm[:-1])):
        start = np.flatnonzero(np.concatenate([[True], hm[1:] != hm[:-1]]))
        runlen = np.diff(np.concatenate([start, [n]]))
        return np.arange(n) - np.repeat(start, runlen)
    order = np.argsort(hm, kind="stable")
    s = hm[order]
    start = np.flatnonzero(np.concatenate([[True], s[1:] != s[:-1]]))
    runlen = np.diff(np.concatenate([start, [n]]))
    r = np.empty(n, np.int64)
    r[order] = np.arange(n) - np.repeat(start, runlen)
    return r


def flow_id(c: Ctx, dev_index) -> np.ndarray:
    """Trace-wide flow id of a (context, device event) pair."""
    return (np.uint64(c.serial + 1) << np.uint64(40)) | np.asarray(dev_index, dtype=np.uint64)


from kvconv.progress import Progress, ProgressOptions  # noqa: E402 - the one progress display (kvconv/progress.py)


def out_size(path) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0
