"""Reconcile host launch records, the executions their geometry predicts, and the device block events.

    >>> from kvconv.format import dump
    >>> from kvconv.check import reconcile
    >>> with dump.open("run.kvdump") as d:                                  # doctest: +SKIP
    ...     res = reconcile.reconcile(d)
    ...     print(res.agreement_line())
    280 graph-node records = 280 expected executions = 280 device events, 0 drops

What it computes, per context of the dump:

* every host launch (eager launches and graph kernel-node launches; graph uploads are ignored) with the number of
  blocks its grid predicts, the device block-enter events matched to it, and the difference;
* per graph executable: its target nodes, its replays (launch ids), records per (replay, node), nodes repeated in a
  replay, nodes missing from a replay, whether the node order is the same in every replay;
* the join of device events to host launches:

  - **exact** when device events carry ``%gridid`` (flag ``has_gridid``) and, for graph nodes, the per-replay tag
    (``has_tag``): gridid -> launch or graph node (the host's ``grid_id``), tag -> replay (the host's ``tag``).
    Independent of the order in which the device's atomics landed, so right for multi-stream graphs.
  - **ordered** when they do not: device events in sequence order are laid over host launches in host order
    (``host_ns``), each launch taking as many consecutive events as its grid has blocks. This assumes one stream.
    Positions come from the event ``sequence`` (a sequence gap is a lost event at a known place). A deficit with 0
    device drops can only be launches that ran before coverage began (patching happens at module load; coverage
    starts late and never stops early), so it is attributed to the earliest launches and the report says so. With
    drops, the deficit may lie anywhere: events whose launch is the same under every possible placement are matched,
    the rest are reported as one ambiguous run of launches with its deficit. Launches that ran on different streams
    next to each other (e.g. the nodes of a multi-stream graph replay) form a window whose events are attributed to
    the window (the replay) but not to a node, and the report says the ordered join cannot tell. The report's join
    is a second pass over the events, chunk by chunk (``window``), in memory only for the matches table, events out
    of sequence order in the file, and more events than blocks with 0 drops.

* timing per graph executable from device ``%globaltimer`` only (per replay span from the first to the last node's
  first block entry, gaps from the last entry of one replay to the first of the next, per node start offsets); host
  ``CLOCK_MONOTONIC`` times are reported in their own domain and never subtracted from device times;
* drops on both sides (group header ``drop_count`` and the metadata counters) and the agreement line.

Record indices (``host_index``, ``device_index``, Finding.record) are indices into ``d.records(kind, context_id=ctx)``.

Stages (one module each, each returning values): ``events`` (load) -> ``exact`` / ``ordered`` / ``window`` (join)
-> ``count`` -> ``graphs`` (per graph exec, host side and device timing) -> ``report`` (JSON, tables, verdict, text).
The launch table, the exact join, the event load and the durations are :mod:`kvconv.join`'s, shared with the
emitters.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from kvconv.check.reconcile.count import check_ordered_against_gridid, count_blocks, gridid_note
from kvconv.check.reconcile.graphs import device_side, host_graphs
from kvconv.check.reconcile.ordered import join_ordered, misfit_notes
from kvconv.check.reconcile.report import (
    LAUNCH_DTYPE,
    MATCH_DTYPE,
    agreement_counts,
    agreement_line,
    ambiguous_runs,
    blocks_section,
    context_lines,
    counts_agree,
    device_section,
    host_section,
    launch_table,
    match_table,
    problem_launches,
    status_line,
    verdict,
)
from kvconv.check.reconcile.stream import ContextStream
from kvconv.check.reconcile.tally import tally_match
from kvconv.check.reconcile.window import Windowed, join_window
from kvconv.format.errors import UsageError
from kvconv.format.findings import Finding
from kvconv.join import (
    JOINS,  # the one vocabulary of --join (kvconv/join/__init__.py)
    calibration,
)
from kvconv.join.durations import LaunchDurations
from kvconv.join.durations import section as durations_section
from kvconv.join.events import (
    CHUNK,  # noqa: F401 - reconcile.CHUNK: the streaming pass's chunk
    SEQ_LIMIT,
    event_chunks,
    load_drops,
    load_events,
)
from kvconv.join.exact import (
    JOIN_EXACT,
    JOIN_NONE,
    JOIN_ORDERED,
    ExactJoin,
    Match,
    explain_unmatched,
    join_exact,
)
from kvconv.join.launches import EAGER, GRAPH_NODE, LaunchTable
from kvconv.join.notes import Notes
from kvconv.memory import release_heap

JOIN_NAMES = {JOIN_NONE: "none", JOIN_EXACT: "exact", JOIN_ORDERED: "ordered"}

__all__ = ["ReconcileOptions", "ReconcileResult", "reconcile", "status_line", "MATCH_DTYPE", "LAUNCH_DTYPE",
           "LaunchTable", "ExactJoin", "GRAPH_NODE", "EAGER", "JOIN_NONE", "JOIN_EXACT", "JOIN_ORDERED", "JOIN_NAMES",
           "JOINS"]


@dataclass(frozen=True)
class ReconcileOptions:
    """join: "auto" (exact when device events carry gridid, ordered otherwise), "exact" or "ordered".
    relaxed: report mismatches (missing / extra / duplicated / unmatched) as warnings instead of errors.
    strict_coverage: report blocks the ordered join attributes to launches that ran before coverage began (0 device
    drops, deficit at the start: code ``coverage-late``) as errors; by default they are warnings, since nothing the
    tracer saw was lost (the published Qwen3-14B run: its first launch ran before patching).
    max_listed: at most this many findings of one code name their launch individually; the rest are counted in one.
    """

    join: str = "auto"
    relaxed: bool = False
    strict_coverage: bool = False
    max_listed: int = 20

    def __post_init__(self) -> None:
        if self.join not in JOINS:
            raise UsageError(f"--join must be one of {', '.join(JOINS)}, not {self.join!r}", code="bad-join")


@dataclass
class ReconcileResult:
    path: str
    join_requested: str
    contexts: list[dict]
    findings: list[Finding]
    matches: np.ndarray | None  # MATCH_DTYPE, one row per device event of every context (None: tables=False)
    launches: np.ndarray | None  # LAUNCH_DTYPE, one row per host launch record of every context (graph uploads
    # excluded; None: tables=False)

    mismatches: int = 0  # findings that are errors unless --relaxed (each context's agreement.agree is false)
    counts: tuple = (0, 0, 0)  # device events, those matched to a launch, host launches (the JSON summary's)

    @property
    def ok(self) -> bool:
        """The exit status: no error-level finding. Without --relaxed, the same as every context agreeing."""
        return not any(f.severity == "error" for f in self.findings)

    def status_line(self) -> str:
        return status_line([self])

    def agreement_line(self, context_id: int | None = None) -> str:
        """The agreement line of one context (the first when not given)."""
        for c in self.contexts:
            if context_id is None or c["context_id"] == context_id:
                return c["agreement"]["line"]
        return ""

    def to_dict(self) -> dict:
        """JSON-able report, schema ``schemas/reconcile.schema.json``."""
        counts = {s: sum(1 for f in self.findings if f.severity == s) for s in ("error", "warning", "info")}
        n_ev, matched, launches = self.counts
        return {
            "path": self.path,
            "join_requested": self.join_requested,
            "ok": self.ok,
            "contexts": self.contexts,
            "findings": [f.to_dict() for f in self.findings],
            "summary": {**counts, "device_events": int(n_ev), "matched": int(matched), "host_launches": int(launches)},
        }

    def columns(self, table: str = "matches") -> dict[str, np.ndarray]:
        """Arrow-ready columns (name -> contiguous 1-D numpy array) of ``matches`` or ``launches``:
        ``pyarrow.table(res.columns())`` builds the table without copying the numeric data again."""
        arr = {"matches": self.matches, "launches": self.launches}[table]
        out = {name: np.ascontiguousarray(arr[name]) for name in arr.dtype.names}
        if table == "matches":
            out["join_name"] = np.array(["none", "exact", "ordered"], dtype=object)[arr["join"]]
        return out

    def to_arrow(self, table: str = "matches"):
        """A ``pyarrow.Table`` of :meth:`columns` (imports pyarrow)."""
        import pyarrow as pa

        cols = self.columns(table)
        if "join_name" in cols:
            cols["join_name"] = pa.DictionaryArray.from_arrays(
                pa.array(self.matches["join"].astype(np.int8)), pa.array(["none", "exact", "ordered"]))
        return pa.table(cols)

    def lines(self) -> list[str]:
        """The text report ``kvconv reconcile`` prints (without the findings)."""
        out = []
        for c in self.contexts:
            out.extend(context_lines(self.path, c))
        return out


# ---------------------------------------------------------------------------------------------------------------
# entry point


def reconcile(d, *, options: ReconcileOptions = ReconcileOptions(), tables: bool = True,
              progress=None) -> ReconcileResult:
    """Reconcile every context of an opened dump (:func:`kvconv.format.dump.open`) in one read of its device events.

    tables: build ``matches`` and ``launches`` (one row per device event / host launch); without them
    (``tables=False``: the CLI's report, validate) memory stays bounded by the host records, whatever the number of
    device events. progress: ``progress(done, total)`` in device events (:mod:`kvconv.progress`)."""
    r = Reconciler(d, options=options, tables=tables)
    total = sum(r.n_events(ctx) for ctx in r.contexts)
    done = 0
    for ctx in r.contexts:
        s = r.stream(ctx)
        for base, recs in event_chunks(d, ctx):
            s.feed(base, recs)
            done += len(recs)
            if progress is not None:
                progress(done, total)
        r.close(ctx)
    return r.result()


class Reconciler:
    """Reconcile a dump whose device events another pass reads: ``stream(ctx).feed(base, records)`` for every
    chunk of each context's events, in order, ``close(ctx)``, then :meth:`result` (kvconv.check.validate reads the file
    once for its own checks and this). A context without a stream is reconciled from memory in ``result``."""

    def __init__(self, d, *, options: ReconcileOptions = ReconcileOptions(), tables: bool = True,
                 launches: bool = False) -> None:
        # launches: the launch table even without tables (one row per host launch; kvconv.look's plots)
        self.d, self.options, self.tables, self.launches = d, options, tables, tables or launches
        self.contexts = [ctx for ctx, _ in d.contexts() if (
            d.groups_of("device_event", context_id=ctx) or d.groups_of("graph_node", context_id=ctx)
            or d.groups_of("eager_launch", context_id=ctx))]
        self._dev = dict(d.contexts())
        self._streams: dict = {}
        self._done: dict = {}

    def n_events(self, ctx: int) -> int:
        return sum(len(g.records) for g in self.d.groups_of("device_event", context_id=ctx))

    def stream(self, ctx: int) -> ContextStream:
        # lean: the columns only the report needs are read at close, once the pass's own state is gone (the host
        # state is what grows with the dump); the table gives the host records' pages back on large dumps
        t = LaunchTable.load(self.d, ctx, lean=not self.tables)
        nh = int((~t.upload).sum())
        ordered = self.options.join == "ordered"  # the pass only counts the events: no join, no table to fill
        s = ContextStream(t, ExactJoin(t) if nh and not ordered else None, ctx=ctx, n_events=self.n_events(ctx),
                          tables=self.tables and not ordered)
        if s.xj is not None:
            s.dur = LaunchDurations(t, s.xj, enters=False)  # the entries: the tally's earliest per launch
        if ordered and self.tables:
            s.stop()  # the matches table of the ordered join: from the events in memory (ordered.join_ordered)
        elif ordered:
            s.count_only()  # the pass counts the events and checks their order; the join is a second pass (window)
        self._streams[ctx] = s
        release_heap()  # the table's and the join's build temporaries
        return s

    def close(self, ctx: int) -> None:
        """The context's pass has ended: reconcile it now (its streaming state goes)."""
        notes = Notes(self.d, ctx, self.options)
        s = self._streams.pop(ctx, None)
        if s is not None:
            s.xj = None  # the pass is over: the join's lookup tables are not needed by the report
            if s.dur is not None:
                s.dur.xj = None  # (the durations looked launches up with it during the pass only)
            if s.b is not None:
                s.b.end_of_events()  # the repeat bitmap goes before the table grows
                if not self.launches and s.usable(_mode(self.options.join, s.any_gid)) and not s.parts and not (
                        s.t.dup.any()):
                    # every event joined (or none carried a key) and no record repeats another: the streamed report
                    # reads no gridid or tag again; their 16 bytes a row go before the late columns come (issue 13)
                    s.t = s.b.t = replace(s.t, grid_id=None, tag=None)
            release_heap()
            s.t = s.t.complete(self.d, ctx)
        out = reconcile_context(self.d, ctx, self._dev[ctx], self.options, notes, stream=s, tables=self.tables,
                                launches=self.launches)
        if s is not None:
            s.release()
        self._done[ctx] = (out, notes.findings(), sum(notes.mismatches.values()))
        release_heap()  # this context's state: gone from the resident set before the next context's is built

    def result(self) -> ReconcileResult:
        findings: list[Finding] = []
        contexts: list[dict] = []
        matches: list[np.ndarray] = []
        launches: list[np.ndarray] = []
        mismatches = n_ev = n_matched = n_launches = 0
        for ctx in self.contexts:
            if ctx not in self._done:
                self.close(ctx)
            (rep, mt, lt, summary), f, mm = self._done.pop(ctx)
            contexts.append(rep)
            findings.extend(f)
            mismatches += mm
            n_ev, n_matched, n_launches = n_ev + summary[0], n_matched + summary[1], n_launches + summary[2]
            if self.tables:
                matches.append(mt)
            if self.launches:
                launches.append(lt)
        m = la = None
        if self.tables:
            m = (matches[0] if len(matches) == 1 else np.concatenate(matches)) if matches else np.zeros(0, MATCH_DTYPE)
        if self.launches:
            la = ((launches[0] if len(launches) == 1 else np.concatenate(launches)) if launches
                  else np.zeros(0, LAUNCH_DTYPE))
        return ReconcileResult(path=str(self.d.path), join_requested=self.options.join, contexts=contexts,
                               findings=findings, matches=m, launches=la, mismatches=mismatches,
                               counts=(n_ev, n_matched, n_launches))


@dataclass(frozen=True)
class _Joined:
    mode: str
    note: str
    match: Match | None  # None: the streaming pass answered
    ordered: object  # ordered.Ordered or None
    extra_replay_events: int = 0


def _mode(want: str, any_gid: bool) -> str:
    return ("exact" if any_gid else "ordered") if want == "auto" else want


def _join(ev, t: LaunchTable, drops, names: dict, notes: Notes, want: str, s: ContextStream | None,
          w: Windowed | None = None) -> _Joined:
    """The join: from the streaming pass ``s`` when it answers (exact), from the second pass ``w`` (ordered), else of
    the events in memory ``ev``."""
    n = s.n if s is not None else ev.n
    any_gid = s.any_gid if s is not None else bool(ev.has_gid.any())
    nh = int((~t.upload).sum())
    mode = _mode(want, any_gid)
    if not n or not nh:
        note = "nothing to join" if not (n or nh) else ("no device events" if not n else "no host launch records")
        if n and not nh:
            # An events-only dump (like the published event file) is not wrong, but nothing joins it.
            first = s.first_idx if s is not None else int(ev.idx[0])
            notes.add("warning", "no-host-records", f"{n:,} device events and no host launch records: nothing to "
                      "reconcile them against", kind="device_event", index=first, count=n, listed=False)
        return _Joined("none" if not (n and nh) else mode, note, None if s is not None else Match.empty(n), None)
    if mode == "ordered" and w is not None:
        misfit_notes(t, w.misfits, names, notes)
        return _Joined(mode, w.ordered.note, None, w.ordered)
    if mode == "ordered":
        o = join_ordered(ev, t, drops, names, notes)
        return _Joined(mode, o.note, o.match, o)
    if not any_gid:
        notes.add("error", "join-impossible", "--join exact needs device events carrying %gridid (flags.has_gridid); "
                  "none do", listed=False)
        return _Joined(mode, "exact join impossible: no device event carries gridid",
                       None if s is not None else Match.empty(n), None)
    if s is not None:
        u = s.unmatched()
        extra, attributed = explain_unmatched(u, t, names, notes) if u is not None else (0, [])
        if u is not None:
            s.attribute(u, attributed)
        m, lacking = None, s.lacking
    else:
        m, extra = join_exact(ev, t, s.xj if s is not None else ExactJoin(t), names, notes)
        lacking = int((~ev.has_gid).sum())
    note = "exact: gridid -> launch/node, tag -> replay; independent of device event order" + (
        f"; {lacking:,} events lack gridid and stay unmatched" if lacking else "")
    if lacking:
        notes.add("warning", "gridid-missing", f"{lacking:,} device events carry no gridid and cannot be joined "
                  "exactly", listed=False)
    return _Joined(mode, note, m, None, extra)


def _seq_range_note(s: ContextStream, notes: Notes) -> None:
    """load_events' note on sequences beyond any buffer, for the streaming pass (same words, same event)."""
    if s.last_seq is not None and s.last_seq >= SEQ_LIMIT:
        notes.add("error", "sequence-range", f"device event sequences reach {s.last_seq:,}, beyond any buffer; "
                  "the ordered join uses event order without gap positions", kind="device_event", index=s.last_idx,
                  listed=False)


def _source(d, ctx: int, options: ReconcileOptions, notes: Notes, stream: ContextStream | None, tables: bool):
    """The context's events and launch table: ``(s, w, ev, t, n_all)``, the streaming pass ``s`` when it answers
    (with the ordered join's window pass ``w`` when that one can), else the events loaded now (``ev``)."""
    s, w = stream, None
    if s is not None and not s.usable(_mode(options.join, s.any_gid)):
        if _mode(options.join, s.any_gid) == "ordered" and s.in_order and not tables:
            s.b = None  # the first pass's tally (none, or the exact join's unmatched): the window pass keeps its own
            w = join_window(s, load_drops(d, ctx, Notes(d, ctx, options)), event_chunks(d, ctx))
            s.t = s.t.complete(d, ctx)  # the host times and streams the window let go
        if w is None:
            s = None
    if s is not None:
        _seq_range_note(s, notes)
        return s, w, None, s.t, s.n_all
    ev = load_events(d, ctx, notes)
    return None, None, ev, (stream.t if stream is not None else LaunchTable.load(d, ctx)), ev.n_all


def _counted(t: LaunchTable, ev, j, s, w, drops, names: dict, notes: Notes, options: ReconcileOptions):
    """The join's tally and the block counts per launch; a gridid that contradicts the ordered join withdraws its
    launches (the timing and the device counts are the tally after it)."""
    tally = w.tally if w is not None else s.b.finish(s.n) if s is not None else tally_match(t, ev, j.match)
    counts = count_blocks(t, tally, j.ordered, drops, names, notes, options.strict_coverage)
    if w is not None and w.contradicted[0]:
        gridid_note(notes, *w.contradicted)
        tally = w.after
    elif w is None and j.mode == "ordered" and check_ordered_against_gridid(ev, t, j.match, notes):
        tally = tally_match(t, ev, j.match)
    return tally, counts


def reconcile_context(d, ctx: int, dev: int, options: ReconcileOptions, notes: Notes, *,
                      stream: ContextStream | None = None, tables: bool = True, launches: bool = False):
    """load -> join -> count -> time -> report, for one context: (report dict, matches table, launches table,
    (device events, matched, host launches)). ``stream``: the context's streaming pass, used when it answers."""
    s, w, ev, t, n_all = _source(d, ctx, options, notes, stream, tables)
    drops = load_drops(d, ctx, notes)
    if t.upload.any():
        notes.add("info", "graph-uploads-ignored", f"{int(t.upload.sum()):,} graph-node records flagged graph_upload "
                  "ignored", listed=False)
    names = d.kernel_names(context_id=ctx)
    graphs = host_graphs(t, names, notes)
    if s is not None and not (tables or launches):
        # the streamed report reads host times and streams in the graphs' host side only (and the ordered join's
        # notes the streams): their 16 bytes a row go before the device side's stage, the peak of a large dump's
        # report (issue 13)
        t = s.t = replace(t, host_ns=None, stream=None if w is None else t.stream)
    _duplicate_findings(t, names, notes)
    j = _join(ev, t, drops, names, notes, options.join, s, w)
    tally, counts = _counted(t, ev, j, s, w, drops, names, notes, options)
    graph_reports = device_side(graphs, t, tally)
    ac = agreement_counts(t, tally, counts, drops, j.extra_replay_events)
    if not counts_agree(ac) and not notes.mismatches and not counts.unflushed:  # (a dead producer's end: said)
        notes.add("error", "counts-differ", f"the counts do not agree ({agreement_line(ac, {})}) and no launch "
                  "explains it", listed=False)
    agreement = verdict(ac, notes.mismatches)
    rep = {"context_id": int(ctx), "device_id": int(dev), "join": j.mode, "join_note": j.note,
           "agreement": agreement, "device": device_section(n_all, tally, agreement, drops),
           "host": host_section(t, drops), "blocks": blocks_section(t, counts, j.ordered, names, tally.n),
           "problem_launches": problem_launches(t, counts, names),
           "ambiguous_runs": ambiguous_runs(t, j.ordered, names),
           "graph_execs": graph_reports}
    if j.mode == "ordered" and j.ordered is not None:
        rep["ordered"] = dict(j.ordered.info)
    dur = stream.dur if stream is not None else None
    if dur is not None and dur.n_exit and j.mode == "exact":  # only dumps with block exits
        rep["durations"] = durations_section(t, dur.finish(start_ns=tally.tmin), names, calibration.of_dump(d, ctx))
    mt = lt = None
    if tables:
        mt = s.matches if s is not None else match_table(ctx, n_all, ev, t, j.match)
    if tables or launches:
        lt = launch_table(ctx, t, counts, j.ordered)
    return rep, mt, lt, (n_all, tally.matched, int((~t.upload).sum()))


def _duplicate_findings(t: LaunchTable, names: dict, notes: Notes) -> None:
    from kvconv.join.launches import first_records, kind_name, launch_name

    rows = t.in_order(t.dup)
    if not len(rows):
        return
    for h, first in zip(rows.tolist(), first_records(t, rows).tolist()):  # (one sort, not a scan per duplicate)
        notes.add("error", "duplicate-host-record", f"{launch_name(t, names, h)} recorded again: {kind_name(t, h)} "
                  f"record {int(t.index[h])} repeats record {int(t.index[first])}; counted once",
                  kind=kind_name(t, h), index=int(t.index[h]))
