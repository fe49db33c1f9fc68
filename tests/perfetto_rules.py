"""The rules Perfetto's trace processor enforces on a TrackEvent trace, checked on decoded packets (perfetto's own
protos), each rule a function returning what it would refuse, drop or mis-draw (empty: nothing).

Where each rule lives in trace processor (google/perfetto, src/trace_processor/):
- tracks: a TrackEvent names a track by uuid; the uuid must be described by a TrackDescriptor (parents too), and
  counter values go to counter tracks only (importers/proto/track_event_parser.cc, track_event_tracker.cc).
- slices: SliceTracker keeps one stack per track; an END closes the newest open slice whose name matches (unnamed:
  any), so ENDs that cross leave the wrong slice open; an END with nothing open is lost; a BEGIN never closed stays
  "did not end" (importers/common/slice_tracker.cc: MatchingIncompleteSliceIndex, MaybeCloseStack ->
  misplaced_end_event).
- flows: FlowTracker maps a flow id to the slice that started it; a terminating id not yet started is dropped
  (flow_end_without_start), a started one never terminated draws no arrow (importers/common/flow_tracker.cc).
  Events are processed in sorted timestamp order, so "started" means earlier in trace time, across clocks.
- incremental state: ProtoTraceReader skips a packet with SEQ_NEEDS_INCREMENTAL_STATE on a sequence whose state was
  never cleared (tokenizer_skipped_packets); interned ids are looked up in the sequence's current generation
  (packet_sequence_state_generation.cc: interned_data_tokenizer_errors).
- clocks: a ClockSnapshot's primary_trace_clock sets the trace time only before any timestamp was converted
  ("ClockSnapshot too late in trace?"); every clock a packet is timed in, and BOOTTIME (the clock trace processor
  gives a proto trace file), must reach the trace time clock through snapshots (clock_tracker.cc,
  util/clock_synchronizer.h; else clock_sync_failure_* / clock_sync_unrelatable_clock_domains). Conversion uses the
  latest snapshot of the same set of clocks at or before the timestamp (the first one before it), as the
  synchronizer's per-hash time series do.
- order: trace processor sorts within windows (sorter/trace_sorter.cc, SortingMode::kDefault): the tracing service's
  flush and read-buffers markers (TracePacket.service_event) close a window, and an event later in the file but
  earlier than what a closed window already handed on is dropped (sorter_push_event_out_of_order). A file without
  markers is one window (sorted whole); here a window closes at each read_tracing_buffers_completed that follows an
  all_data_sources_flushed (at least as early as trace processor closes one).

    >>> from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb
    >>> t = pb.Trace(); t.ParseFromString(open("run.pftrace", "rb").read())  # doctest: +SKIP
    >>> problems(t)  # doctest: +SKIP
    []
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from dataclasses import dataclass, field

BOOTTIME = 6
CLEARED, NEEDS = 1, 2
T_BEGIN, T_END, T_INSTANT, T_COUNTER = 1, 2, 3, 4


def clock_key(cid: int, seq: int) -> tuple[int, int]:
    """A clock as trace processor keys it: sequence-scoped clocks (ids 64..127) belong to their sequence."""
    return (cid, seq if 64 <= cid < 128 else 0)


@dataclass
class Event:
    """One TrackEvent as the importer sees it: where in the file, on which track, when (raw and in trace time)."""

    index: int
    seq: int
    track: int | None
    kind: int
    clock: tuple[int, int]
    raw_ts: int
    ts: int | None = None
    name: int = 0
    flows: tuple = ()
    ends: tuple = ()
    window: int = 0


@dataclass
class Clocks:
    """The trace's clock snapshots as trace processor's synchronizer holds them, and the trace time clock."""

    primary: tuple[int, int] = clock_key(BOOTTIME, 0)
    series: dict = field(default_factory=lambda: defaultdict(list))  # (a, b, clock set) -> [(a_ts, b_ts)]
    edges: dict = field(default_factory=lambda: defaultdict(set))  # a -> {(b, clock set)}

    def add(self, stamps: list[tuple[tuple[int, int], int]]) -> None:
        ids = frozenset(c for c, _ in stamps)
        for a, ta in stamps:
            for b, tb in stamps:
                if a != b:
                    self.series[(a, b, ids)].append((ta, tb))
                    self.edges[a].add((b, ids))

    def path(self, src) -> list | None:
        """The hops (a, b, clock set) from ``src`` to the trace time clock (shortest), None when there is none."""
        prev, todo = {src: None}, [src]
        while todo:
            a = todo.pop(0)
            if a == self.primary:
                hops = []
                while prev[a] is not None:
                    hops.append(prev[a])
                    a = prev[a][0]
                return hops[::-1]
            for b, ids in sorted(self.edges[a], key=repr):
                if b not in prev:
                    prev[b] = (a, b, ids)
                    todo.append(b)
        return None

    def converter(self):
        """``(clock, ts) -> trace time`` (None where no path), for the snapshots added so far."""
        paths, keys = {}, {}

        def convert(clock, ts: int) -> int | None:
            if clock not in paths:
                paths[clock] = self.path(clock)
            if paths[clock] is None:
                return None
            for hop in paths[clock]:
                s = self.series[hop]
                if hop not in keys:
                    keys[hop] = [x for x, _ in s]
                i = max(bisect.bisect_right(keys[hop], ts) - 1, 0)
                ts = ts - s[i][0] + s[i][1]
            return ts

        return convert


@dataclass
class Walk:
    """What one pass over the packets found: descriptors, events, clocks, and the problems seen on the way."""

    tracks: dict = field(default_factory=dict)  # uuid -> TrackDescriptor
    events: list = field(default_factory=list)
    clocks: Clocks = field(default_factory=Clocks)
    incremental: list = field(default_factory=list)
    clock_problems: list = field(default_factory=list)
    used_clocks: set = field(default_factory=set)


def _interned_uses(p) -> list[tuple[str, int]]:
    te = p.track_event
    uses = [("event_names", te.name_iid)] if te.name_iid else []
    uses += [("event_categories", c) for c in te.category_iids]
    uses += [("debug_annotation_names", a.name_iid) for a in te.debug_annotations if a.name_iid]
    return uses


class _Sequence:
    """A sequence's incremental state: None until its first clear, then the interned ids and packet defaults."""

    def __init__(self) -> None:
        self.first = True
        self.interned: dict[str, set] | None = None
        self.defaults = None


def _incremental(p, i: int, s: _Sequence, out: list, is_event: bool) -> None:
    seq = p.trusted_packet_sequence_id
    if p.sequence_flags & CLEARED:
        s.interned, s.defaults = defaultdict(set), None
    uses = _interned_uses(p) if is_event else []
    needs = bool(p.sequence_flags & NEEDS) or bool(uses) or p.HasField("interned_data")
    if needs and s.interned is None:
        out.append(f"packet {i}: sequence {seq} uses incremental state that was never cleared "
                   f"({'its first packet lacks' if s.first else 'no packet before has'} SEQ_INCREMENTAL_STATE_CLEARED:"
                   f" trace_processor skips it)")
    s.first = False
    if s.interned is None:
        return
    if p.HasField("trace_packet_defaults"):
        s.defaults = p.trace_packet_defaults
    if p.HasField("interned_data"):
        for f, items in p.interned_data.ListFields():
            s.interned[f.name].update(x.iid for x in items)
    out += [f"packet {i}: {kind} iid {iid} used on sequence {seq} before it is defined"
            for kind, iid in uses if iid not in s.interned[kind]]


def _clock_of(p, s: _Sequence) -> int:
    if p.HasField("timestamp_clock_id"):
        return p.timestamp_clock_id
    d = s.defaults
    return d.timestamp_clock_id if d is not None and d.HasField("timestamp_clock_id") else BOOTTIME


def _snapshot(p, i: int, w: Walk, state: dict) -> None:
    seq = p.trusted_packet_sequence_id
    cs = p.clock_snapshot
    if cs.HasField("primary_trace_clock") and not state["primary_set"]:
        if state["timed"]:
            w.clock_problems.append(f"packet {i}: the trace time clock is set after packets were already timed "
                                    f"(trace_processor keeps its earlier clock)")
        else:
            w.clocks.primary = clock_key(cs.primary_trace_clock, 0)
            state["primary_set"] = True
    w.clocks.add([(clock_key(c.clock_id, seq), c.timestamp) for c in cs.clocks])
    state["seen"].update(clock_key(c.clock_id, seq) for c in cs.clocks)


def _event(p, i: int, seq: int, s: _Sequence, clock, window: int) -> Event:
    te = p.track_event
    track = te.track_uuid if te.HasField("track_uuid") else (
        s.defaults.track_event_defaults.track_uuid
        if s.defaults is not None and s.defaults.track_event_defaults.HasField("track_uuid") else None)
    return Event(i, seq, track, te.type, clock, p.timestamp, name=te.name_iid, flows=tuple(te.flow_ids),
                 ends=tuple(te.terminating_flow_ids), window=window)


def walk(trace) -> Walk:
    """One pass over ``trace.packet`` in file order, as trace processor's tokenizer reads them."""
    w = Walk()
    seqs: dict[int, _Sequence] = defaultdict(_Sequence)
    state = {"primary_set": False, "timed": False, "seen": set(), "flushed": False, "window": 0}
    for i, p in enumerate(trace.packet):
        seq = p.trusted_packet_sequence_id
        s = seqs[seq]
        data = p.WhichOneof("data")
        _incremental(p, i, s, w.incremental, data == "track_event")
        if data == "service_event":
            se = p.service_event
            state["flushed"] |= se.all_data_sources_flushed
            if se.read_tracing_buffers_completed and state["flushed"]:
                state["window"], state["flushed"] = state["window"] + 1, False
        elif data == "track_descriptor":
            w.tracks[p.track_descriptor.uuid] = p.track_descriptor
        elif data == "clock_snapshot":
            _snapshot(p, i, w, state)
            continue
        if not p.HasField("timestamp"):
            continue
        clock = clock_key(_clock_of(p, s), seq)
        if clock != clock_key(BOOTTIME, 0) and not (state["primary_set"] and clock in state["seen"]):
            w.clock_problems.append(f"packet {i}: timed in clock {clock[0]} before a clock snapshot "
                                    f"{'holding that clock' if state['primary_set'] else 'setting the trace time'}")
        state["timed"] = True
        w.used_clocks.add(clock)
        if data == "track_event":
            w.events.append(_event(p, i, seq, s, clock, state["window"]))
    convert = w.clocks.converter()
    for ev in w.events:
        ev.ts = convert(ev.clock, ev.raw_ts)
    return w


def check_tracks(w: Walk) -> list[str]:
    out = [f"track {u} ({d.name!r}): parent {d.parent_uuid} is not described"
           for u, d in w.tracks.items() if d.HasField("parent_uuid") and d.parent_uuid not in w.tracks]
    for ev in w.events:
        d = w.tracks.get(ev.track)
        if d is None:
            out.append(f"packet {ev.index}: track_event on track {ev.track}, which no track_descriptor describes")
        elif (ev.kind == T_COUNTER) != d.HasField("counter"):
            what = "counter value on" if ev.kind == T_COUNTER else "slice event on counter"
            out.append(f"packet {ev.index}: {what} track {d.name!r}")
    return out


def check_slices(w: Walk) -> list[str]:
    """Per track, in sorted order (trace time, then file order): BEGIN/END balance and ENDs close the newest slice."""
    out = []
    by_track = defaultdict(list)
    for ev in w.events:
        if ev.kind in (T_BEGIN, T_END) and ev.ts is not None:
            by_track[ev.track].append(ev)
    for track, evs in by_track.items():
        stack: list[Event] = []
        for ev in sorted(evs, key=lambda e: (e.ts, e.index)):
            if ev.kind == T_BEGIN:
                stack.append(ev)
            elif not stack:
                out.append(f"packet {ev.index}: END on track {track} with no slice open (lost)")
            else:
                top = stack.pop()
                if ev.name and top.name and ev.name != top.name:
                    out.append(f"packet {ev.index}: END of name iid {ev.name} on track {track} while iid {top.name} "
                               f"(packet {top.index}) is the newest open slice: the slices overlap without nesting")
        out += [f"packet {b.index}: slice on track {track} never ends" for b in stack]
    return out


def check_flows(w: Walk) -> list[str]:
    """In sorted order across the whole trace: every flow id starts once, then terminates once."""
    out, open_, done = [], {}, set()
    for ev in sorted((e for e in w.events if e.ts is not None and (e.flows or e.ends)), key=lambda e: (e.ts, e.index)):
        for f in ev.flows:
            if f in done:
                out.append(f"packet {ev.index}: flow {f} used again after it terminated")
            open_.setdefault(f, ev)
        for f in ev.ends:
            if f not in open_:
                out.append(f"packet {ev.index}: flow {f} terminates before it starts (flow_end_without_start)")
            open_.pop(f, None)
            done.add(f)
    out += [f"packet {ev.index}: flow {f} never terminates" for f, ev in open_.items()]
    return out


def check_clocks(w: Walk) -> list[str]:
    out = list(w.clock_problems)
    for c in sorted(w.used_clocks | {clock_key(BOOTTIME, 0)}):
        if w.clocks.path(c) is None:
            out.append(f"clock {c[0]}{f' (sequence {c[1]})' if c[1] else ''} cannot be related to the trace time "
                       f"clock {w.clocks.primary[0]} (clock_sync_unrelatable_clock_domains)")
    for (a, _b, ids), s in w.clocks.series.items():
        if any(y[0] < x[0] for x, y in zip(s, s[1:])):
            out.append(f"clock {a[0]}: snapshots of clocks {sorted(c[0] for c in ids)} go back in time "
                       f"(invalid_clock_snapshots)")
    return out


def check_order(w: Walk) -> list[str]:
    """No event earlier (in trace time) than an event of a sorting window already closed before it."""
    out, closed, latest = [], None, {}
    for ev in w.events:
        if ev.ts is None:
            continue
        if closed is not None and ev.window > closed[0] and ev.ts < closed[1].ts:
            out.append(f"packet {ev.index}: timestamp {ev.ts} on track {ev.track} is earlier than packet "
                       f"{closed[1].index} ({closed[1].ts}) of a sorting window already closed "
                       f"(sorter_push_event_out_of_order: dropped)")
        for k in [k for k in latest if k < ev.window]:  # windows now closed
            if closed is None or latest[k].ts > closed[1].ts:
                closed = (k, latest.pop(k))
            else:
                latest.pop(k)
        if ev.window not in latest or ev.ts > latest[ev.window].ts:
            latest[ev.window] = ev
    return out


def backward_steps(w: Walk) -> list[tuple[int, int]]:
    """(track, ns) for each step back in time between consecutive events of one track in file order: harmless to
    trace processor within one window, told apart from the rule above for readers that stream."""
    out, last = [], {}
    for ev in w.events:
        key = (ev.track, ev.clock)
        if key in last and ev.raw_ts < last[key]:
            out.append((ev.track, last[key] - ev.raw_ts))
        last[key] = ev.raw_ts
    return out


RULES = {"tracks": check_tracks, "slices": check_slices, "flows": check_flows,
         "incremental": lambda w: list(w.incremental), "clocks": check_clocks, "order": check_order}


def problems(trace, rules=RULES, walked: Walk | None = None) -> dict[str, list[str]]:
    """Each rule's problems on ``trace`` (a decoded perfetto Trace; ``walked``: its walk(), where already made);
    rules without problems are left out."""
    w = walk(trace) if walked is None else walked
    found = {name: rule(w) for name, rule in rules.items()}
    return {k: v for k, v in found.items() if v}
