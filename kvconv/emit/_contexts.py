"""What every emitter does around its own writing: open the dumps' contexts, join their device events to the host
launch records, show progress, and close it all.

    >>> with emit_run(paths, out, options, warn, "perfetto", passes=2) as run:  # doctest: +SKIP
    ...     res, warn, paths, ctxs, bar = run
    ...     aggs = [first_pass(c, options, bar) for c in ctxs]
"""

from __future__ import annotations

import contextlib
import pickle
import tempfile
import time
from pathlib import Path

import numpy as np

from kvconv.clock import of_dump
from kvconv.emit._canary import canaries
from kvconv.emit._first_pass import first_pass
from kvconv.emit._stream import EAGER, GRAPH_NODE, RELEASE_BYTES, SLICE, Ctx, checksum_mismatch
from kvconv.emit.options import EmitOptions, EmitResult
from kvconv.format import dump as dumpmod
from kvconv.format import layout
from kvconv.format.errors import UsageError
from kvconv.join.exact import ExactJoin
from kvconv.join.launches import LaunchTable, release_groups
from kvconv.join.passes import probe
from kvconv.memory import release_heap, stream_heap
from kvconv.progress import Progress, ProgressOptions

_EVF = layout.ENUMS["event_flags"]
_BLOCK_ENTER = layout.ENUMS["event_kind"]["block_enter"]


def _safe(s: str) -> str:
    out = "".join(c if (c.isalnum() or c in "-_.") else "_" for c in s)
    return out or "run"


def run_name(path: str) -> str:
    """A dump's run name (Arrow's ``run=`` partition, the tables' ``run``): its file name without extensions;
    ``stdin`` for standard input (``-``)."""
    return "stdin" if str(path) == "-" else _safe(Path(path).name.split(".")[0])


@contextlib.contextmanager
def emit_run(dumps, out, options: EmitOptions, warn, name: str, passes: int, *, checks: list | None = None):
    """What every emitter does around its own writing: refuse to overwrite an input, open the dumps' contexts, show
    a progress bar over ``passes`` walks of the device events, and close it all, whatever happens.

    ``dumps``: paths (opened here, closed at the end) or dumps open already (a :class:`kvconv.run.Run`'s: taken as
    they are, left open). ``checks``: each dump's :class:`kvconv.check.validate.Validation` (a Run's own), fed by
    the contexts' walks and finished here (``res.verdicts``); with ``options.verdict`` and no ``checks``, a
    Validation of each dump is made here.

    Yields ``(res, warn, paths, ctxs, bar)``; the caller writes, then sets ``res.bytes_written``."""
    from kvconv.format.atomic import check_output

    res = EmitResult(output=str(out))
    warn = warn or res.warnings.append
    paths = [_path_of(d) for d in dumps]
    check_output(out, inputs=paths, directory=name == "arrow", kind=name, force=options.force)  # before any work
    stream_heap()  # chunk temporaries stay in the heap, whole-table columns are given back (kvconv.memory)
    checks = list(checks) if checks is not None else ([] if options.verdict else None)
    # the trace emitters' first pass sums the device events' checksums (on another core, beside the pass's own work);
    # the Arrow tables', and the verdict's walk, want them from the join's probe, the first walk
    opened, ctxs = open_contexts(dumps, options, warn, res.timings, checks=checks,
                                 probe_verifies=name == "arrow" or checks is not None)
    try:
        total = sum(c.n_events for c in ctxs)
        bar = Progress(f"{name} {', '.join(Path(p).name for p in paths)}", total=passes * total,
                       size_bytes=sum(d.size for d in opened.dumps),
                       options=ProgressOptions.from_cli(progress=options.progress))
        try:
            yield res, warn, paths, ctxs, bar
        finally:
            bar.close()
        res.contexts = len(ctxs)
        res.device_events = total
        t = time.perf_counter()
        if checks:  # the output is written: its contexts' tables go before the checks left for now load theirs
            for c in ctxs:
                c.host = c.xjoin = c.hid = c._runs = None
            release_heap()
            res.verdicts = _verdicts(checks)  # what the walks left: host records, canaries, the reconciler's report
            res.timings["verdict"] = time.perf_counter() - t
    finally:
        opened.close()


def _path_of(d) -> str:
    return d.path if isinstance(d, dumpmod.Dump) else str(d)


class Opened:
    """The dumps an emitter reads, in input order: those it opened itself (closed by :meth:`close`) and those it was
    given open (left open: their owner closes them)."""

    def __init__(self, dumps, options: EmitOptions) -> None:
        self.dumps, self.own = [], []
        try:
            for d in dumps:
                if not isinstance(d, dumpmod.Dump):
                    d = dumpmod.open(d, options=dumpmod.ReadOptions(verify_checksums=False, salvage=options.salvage))
                    self.own.append(d)
                self.dumps.append(d)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        for d in self.own:
            d.close()
        self.own = []

    def __iter__(self):
        return iter(self.dumps)

    def __getitem__(self, i: int):
        return self.dumps[i]

    def __len__(self) -> int:
        return len(self.dumps)


def open_contexts(dumps, options: EmitOptions, warn, timings: dict | None = None, *,
                  checks: list | None = None, probe_verifies: bool = True) -> tuple[Opened, list[Ctx]]:
    """Open the dumps (paths; a dump open already is taken as it is: :class:`Opened`; checksums are verified while
    streaming) and describe each context. ``checks`` (a list): each dump's
    :class:`kvconv.check.validate.Validation`, which the contexts' walks feed from the join's probe on (an empty
    list: one made here for each dump). ``probe_verifies`` False: the join's probe leaves the device events'
    checksums to the next walk (the trace emitters' first pass, whose work hides the sum; the probe's would wait for
    it: 19 ms of crc32 beside 10 ms of probe on 64 MiB of events)."""
    if not dumps:
        raise UsageError("give at least one dump", code="no-input")
    opened = Opened(dumps, options)
    ctxs: list[Ctx] = []
    runs: dict[str, int] = {}
    try:
        for di, d in enumerate(opened.dumps):
            _kept_something(d)
            if options.verify_checksums:
                _verify_host_groups(d, options, warn)
            stem = run_name(d.path)
            run = stem if stem not in runs else f"{stem}-{di}"
            runs[run] = di
            _describe(d, run, ctxs, options, warn)
            _load_tables(d, [c for c in ctxs if c.dump is d], options)
        if checks is not None:
            _attach_checks(opened.dumps, ctxs, options, checks)
        t = time.perf_counter()
        _join(ctxs, options, warn, verify=options.verify_checksums and probe_verifies)
        if timings is not None:
            timings["join"] = time.perf_counter() - t
    except BaseException:
        opened.close()
        raise
    return opened, ctxs


def _kept_something(d) -> None:
    """Refuse a salvaged prefix that kept no record to convert (its verdict: nothing checked): an empty trace written
    with exit 0 would read as a run that did nothing."""
    from kvconv.format import holds
    from kvconv.format.errors import FormatError

    if holds.salvaged(d) and holds.kept_nothing(d):
        raise FormatError("the salvaged prefix of this cut file kept no launch, device-event, canary, slot-write or "
                          "value record: nothing to convert", path=d.path, offset=d.size, field="header",
                          code="nothing-salvaged", hint="copy or download the dump again")


def _verify_host_groups(d, options: EmitOptions, warn) -> None:
    """The payload checksums of every group but the device events' (those are summed while they stream)."""
    for g in d.groups:  # a live (unfinished) or cut-short group has no checksum to compare
        if g.kind is None or g.kind.name == "device_event" or not g.checksummed:
            continue
        if not g.crc_ok():
            checksum_mismatch(d, g, salvage=options.salvage, warn=warn)
        if d.size > RELEASE_BYTES:  # the pages just checked go back (host records grow with the run)
            dumpmod.release_pages(getattr(d, "_mm", None), g.payload_offset,
                                  len(g.records) * int(g.header["record_size"]))


def _describe(d, run: str, ctxs: list[Ctx], options: EmitOptions, warn) -> None:
    """Each context of dump ``d`` that holds per-context records, as a :class:`Ctx` appended to ``ctxs``."""
    meta = d.metadata()
    for ctx, dev in d.contexts():
        if any(c.dump is d and c.context_id == ctx for c in ctxs):
            continue
        groups = d.groups_of("device_event", context_id=ctx)
        kinds = {g.kind.name for g in d.groups if g.kind is not None and g.context_id == ctx}
        if not (kinds & layout.CONTEXT_KINDS):  # the kinds whose "per_context" is true (layouts.json)
            continue
        clock = of_dump(d, ctx)
        c = Ctx(serial=len(ctxs), dump=d, label=Path(d.path).name, run=run, context_id=ctx, device_id=dev,
                groups=groups, n_events=sum(len(g.records) for g in groups), host=None,
                n_host=sum(len(g.records) for k in ("graph_node", "eager_launch")
                           for g in d.groups_of(k, context_id=ctx)),
                names=d.kernel_names(context_id=ctx), clock=clock,
                device_drops=d.drops("device_event", context_id=ctx),
                host_drops=d.drops("graph_node", context_id=ctx) + d.drops("eager_launch", context_id=ctx),
                meta=meta, salvage=options.salvage, warn=warn)
        if not clock.n and c.n_events:
            warn(f"{c.label} context {ctx}: no clock-sync pairs; device events keep their raw %globaltimer "
                 "times and are not aligned with host records")
        ctxs.append(c)


def _verdicts(checks: list) -> list:
    """Each dump's report (:meth:`kvconv.check.validate.Validation.finish`); a failure of the checks that is not
    about the dump (a bug: the output is written by now) stands in its place, for the caller to say (KVCONV_DEBUG=1
    raises it)."""
    import os

    from kvconv.format.errors import KvconvError

    out = []
    for ch in checks:
        try:
            out.append(ch.finish())
        except KvconvError:
            raise
        except Exception as e:  # noqa: BLE001 - see the docstring
            if os.environ.get("KVCONV_DEBUG"):
                raise
            out.append(e)
    return out


# A lazy context (a large dump's, its launch table loaded for each walk) with more host launch records than this is
# checked after the conversion: fed by the walk, the reconciler's launch table and the checks' state sit beside the
# converter's (the sum of the two passes' state, not the larger), which the peak-RSS bounds of the slow tier do not
# allow (tests/test_scale_rss_emit.py: chrome of a 1 GiB dump 170 MiB fed against a bound of 163, checked after
# within it), while feeding them saves no time on a large dump (docs/BENCH.md). So every lazy context is checked
# after; a dump small enough to be read whole is checked in the pass.
LAZY_CHECKED_HOSTS = 0


def _attach_checks(dumps: list, ctxs: list[Ctx], options: EmitOptions, checks: list) -> None:
    """Each dump's checks (:class:`kvconv.check.validate.Validation`: ``checks[i]`` of dump i, made here when the
    list is empty), fed by its contexts' walks; a lazy context with more than :data:`LAZY_CHECKED_HOSTS` host
    records is checked after the conversion (memory: the larger of the two passes' state, not their sum)."""
    from kvconv.check.validate import ValidateOptions, Validation

    if not checks:
        checks.extend(Validation(d, ValidateOptions(salvage=options.salvage)) for d in dumps)
    for d, ch in zip(dumps, checks):
        for c in ctxs:
            if c.dump is d and (not c.lazy or c.n_host <= LAZY_CHECKED_HOSTS):
                c.checks = ch


def _load_tables(d, cs: list[Ctx], options: EmitOptions) -> None:
    """The launch table of each context of the dump ``d``, now, unless the dump is large and joined by the
    streaming exact join alone: its contexts are lazy then (the first pass and :meth:`Ctx.held` load one at a time)."""
    total = sum(c.n_events for c in cs)
    streaming = options.join == "exact" or (options.join == "auto" and total > options.reconcile_max_events)
    for c in cs:
        c.lazy = d.size > RELEASE_BYTES and streaming
        if not c.lazy:
            c.host = LaunchTable.load(d, c.context_id)
            if d.size > RELEASE_BYTES:  # the launch table holds copies: the records' pages can go
                release_groups(d, ("graph_node", "eager_launch"), c.context_id)


def _join(ctxs: list[Ctx], options: EmitOptions, warn, *, verify: bool = True) -> None:
    """Device event -> host record, per dump (``options.join``, the vocabulary of ``kvconv reconcile --join``).

    "auto": the vectorised exact join (:class:`ExactJoin`, the same matches as kvconv.check.reconcile's exact join)
    when every device event that carries a gridid finds its host record; otherwise (no gridids: the ordered join; or
    unmatched events, which reconcile explains and attributes) kvconv.check.reconcile's auto join, up to
    ``reconcile_max_events``. "exact": the vectorised exact join only. "ordered": kvconv.check.reconcile's ordered
    join (by sequence order), whatever the size."""
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
            c.xjoin = ExactJoin(c.host) if not c.lazy and c.host.n else None  # lazy: loaded by the pass or Ctx.held
        use = rec is not None and (options.join == "ordered" or (
            options.join == "auto" and total <= options.reconcile_max_events))
        if use and options.join == "auto":
            use = not all(_probe(c, options, verify=verify) for c in cs)
        res = None
        if use:
            try:
                # not relaxed: .ok is the verdict to report
                res = rec.reconcile(d, options=rec.ReconcileOptions(join="ordered" if options.join == "ordered"
                                                                    else "auto"))
            except Exception as e:  # noqa: BLE001 - fall back to the streaming join, and say so
                warn(f"{cs[0].label}: reconcile failed ({e}); using exact gridid joins only")
                res = None
        elif rec is not None and options.join == "auto" and total > options.reconcile_max_events:
            warn(f"{cs[0].label}: {total:,} device events exceed the {options.reconcile_max_events:,} up to which "
                 "--join auto runs kvconv reconcile's join; flows and node slices use the streaming exact (gridid) "
                 "join only (--join ordered joins by sequence order at any size; `kvconv reconcile` explains the "
                 "events left unmatched)")
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
            elif options.join == "auto" and c._runs is not None:
                c.join = "exact" if c._matched else "none"  # what reconcile calls the same matches
            else:
                c.join = "exact(gridid)"


def release_join(ctxs: list, options: EmitOptions) -> None:
    """After the first pass and the verdict on it: the second pass of Perfetto and Chrome asks the join only for
    --replays; without it the exact join's tables and the probe's runs go (memory that grows with the host records
    and, up to :data:`kvconv.join.passes.RUNS_CACHE`, with the events)."""
    if options.replays is None:
        for c in ctxs:
            c.xjoin, c._runs = None, None


def _probe(c: Ctx, options: EmitOptions, *, verify: bool = True) -> bool:
    """Run the vectorised exact join over the context (:func:`kvconv.join.passes.probe`); True when its matches are
    reconcile's. Keeps the runs for the first pass. ``verify``: sum the checksums in this walk."""
    c._runs, c._matched = None, 0
    if c.xjoin is None or not c.n_events:
        return False
    c._runs, c._matched = probe(c.chunks(options.chunk, sub=SLICE, verify=verify), c.xjoin)
    return c._runs is not None


class Spilled:
    """A value put aside by :class:`Spill` (``kept``: the first pass's count of kept events, asked for before)."""

    def __init__(self, f, at: int, kept: int) -> None:
        self.f, self.at, self.kept = f, at, kept

    def load(self):
        self.f.seek(self.at)
        return pickle.load(self.f)


FIRST_PASS_DROPS = ("index", "host_ns", "graph_exec", "launch_id", "node", "stream", "kernel_slot", "flags", "gx", "gy",
                    "gz", "grid", "upload", "dup", "node_ordinal")


def first_passes(ctxs: list[Ctx], options: EmitOptions, bar) -> list:
    """The first pass (:func:`first_pass`) of each context. A lazy context's aggregates
    (memory that grows with its host records) are pickled into an unnamed temporary file and a :class:`Spilled`
    stands for them until :class:`Plans` reads them back: one context's host state in memory at a time."""
    aggs, f = [], None
    # the first pass reads the table's row count (kind), and the filters' columns; the exact join keeps its own
    need = {"kind"} | ({"launch_id"} if options.replays is not None else set()) \
        | ({"host_ns"} if options.window_ms is not None else set())
    unused = tuple(k for k in FIRST_PASS_DROPS if k not in need)
    for c in ctxs:
        a = first_pass(c, options, bar, drop=unused)  # a lazy context's table: loaded by the pass, let go after it
        if c.lazy:
            f = f or tempfile.TemporaryFile(prefix="kvconv-")
            at = f.seek(0, 2)
            pickle.dump(a, f, protocol=pickle.HIGHEST_PROTOCOL)
            a = Spilled(f, at, a.kept)
            release_heap()
        aggs.append(a)
    return aggs


class Plans:
    """``make(ctx, agg, canary)`` of each context (its plan for one format), walked in context order as often as the
    writer needs (descriptors of all, then each one's events). Contexts kept in memory are planned once; a lazy
    context is planned again on each walk, inside :meth:`Ctx.held` (its launch table loaded, its aggregates read
    back), and let go before the next: the plan is a function of them, so the same every time."""

    def __init__(self, ctxs: list[Ctx], aggs: list, make, options: EmitOptions, *, unused: tuple = ()) -> None:
        self.ctxs, self.aggs, self.make = ctxs, aggs, make
        self.canary = canaries(ctxs)
        self.join = options.replays is not None  # the second pass asks the join only for --replays
        self.drop = () if self.join else unused  # launch-table columns the format does not write
        self.kept = [None if c.lazy else make(c, a, k) for c, a, k in zip(ctxs, aggs, self.canary)]

    def __iter__(self):
        return self.walk()

    def walk(self, *, drop: tuple = ()):
        """The plans in context order; ``drop``: launch-table columns this walk does not read either, let go from a
        lazy context's table as it is loaded (the descriptors' walk reads fewer than the events')."""
        drop = self.drop + tuple(k for k in drop if k not in self.drop) if not self.join else ()
        for c, a, k, p in zip(self.ctxs, self.aggs, self.canary, self.kept):
            if p is not None:
                yield p
                continue
            with c.held(join=self.join, drop=drop):
                p = self.make(c, a.load() if isinstance(a, Spilled) else a, k)
                release_heap()  # the load's and the planning's temporaries
                yield p
                p = None
