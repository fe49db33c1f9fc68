"""Every .pftrace kvconv writes keeps the rules Perfetto's trace processor enforces (tests/perfetto_rules.py: tracks,
slices, flows, incremental state, clocks, sorting windows), and each rule catches a trace damaged on purpose.

Traces: the Qwen3-14B demo, every H200 capture under fixtures/h200-*/ that converts, and the two-GPU merge of
fixtures/h200-tp2, each written through the real CLI. Where a trace_processor binary is at hand (KVCONV_TRACE_PROCESSOR,
or ../shared/tools/trace_processor_shell beside the checkout, as in CI: conftest.trace_processor_bin), each
trace is also loaded into it: no error or data-loss stats, and slice / flow counts and the first slice's time equal
what the rules' own walk of the packets finds; the queries of docs/QUERIES.md run there too.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb
from perfetto_rules import T_BEGIN, T_COUNTER, T_END, T_INSTANT, problems, walk

from conftest import ROOT, run_cli, trace_processor

CASES = {"qwen3-14b": ["fixtures/qwen3-14b/qwen3-14b.kvdump"],
         "h200-tp2 merged": ["fixtures/h200-tp2/rank0.kvdump", "fixtures/h200-tp2/rank1.kvdump"]}
CASES.update({f"{p.parent.name}/{p.name}": [str(p.relative_to(ROOT))]
              for p in sorted(ROOT.glob("fixtures/h200-*/*.kvdump"))})


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    """case -> written .pftrace path, converted on first use through the real CLI."""
    out, folder = {}, tmp_path_factory.mktemp("pftrace")

    def get(case: str) -> Path:
        if case not in out:
            path = folder / (case.replace("/", "_").replace(" ", "_") + ".pftrace")
            r = run_cli("perfetto", *[ROOT / p for p in CASES[case]], "-o", path, "-q")
            assert r.returncode == 0, r.stderr
            out[case] = path
        return out[case]

    return get


def load(path: Path) -> pb.Trace:
    t = pb.Trace()
    t.ParseFromString(path.read_bytes())
    return t


@pytest.fixture(scope="module")
def walked(traces):
    """case -> walk() of its written trace, made once for the tests that read it (~2 s for Qwen's)."""
    out = {}

    def get(case: str):
        if case not in out:
            out[case] = walk(load(traces(case)))
        return out[case]

    return get


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_trace_keeps_the_rules(traces, walked, case):
    w = walked(case)
    if case != "h200-typo-pattern/typo-pattern.kvdump":  # a capture whose pattern matched no kernel: metadata only
        # a trace with events in it, not an empty pass (a probe's dump holds canary steps only: a few dozen)
        assert len(w.events) > (10 if case.startswith("h200-paged-plants/") and ".trace." not in case else 100)
        assert w.tracks
    assert problems(None, walked=w) == {}


# --- each rule, broken on purpose in a copy of a real trace -------------------------------------------------------

@pytest.fixture(scope="module")
def real(traces) -> pb.Trace:
    return load(traces("h200-single/single.kvdump"))


def damaged(real: pb.Trace) -> tuple[pb.Trace, list]:
    t = pb.Trace()
    t.CopyFrom(real)
    return t, walk(t).events


def first(events, **what):
    return next(e for e in events if all(getattr(e, k) == v for k, v in what.items()))


def test_tracks_rule(real):
    t, evs = damaged(real)
    t.packet[first(evs, kind=T_INSTANT).index].track_event.track_uuid = 12345
    assert any("on track 12345, which no track_descriptor describes" in p for p in problems(t)["tracks"])
    t, evs = damaged(real)
    t.packet[first(evs, kind=T_COUNTER).index].track_event.track_uuid = first(evs, kind=T_BEGIN).track
    assert any("counter value on track" in p for p in problems(t)["tracks"])


def _two_slices(evs):
    """A track's first two slices (begin, end, begin, end) with different names, one after the other."""
    by_track = {}
    for e in sorted(evs, key=lambda e: (e.raw_ts, e.index)):
        if e.kind in (T_BEGIN, T_END):
            by_track.setdefault(e.track, []).append(e)
    for seq in by_track.values():
        if len(seq) >= 4 and [e.kind for e in seq[:4]] == [T_BEGIN, T_END, T_BEGIN, T_END] and \
                seq[0].name != seq[2].name and seq[1].raw_ts <= seq[2].raw_ts < seq[3].raw_ts:
            return seq[:4]
    raise AssertionError("no track with two consecutive slices")


def test_slices_rule(real):
    t, evs = damaged(real)
    del t.packet[first(evs, kind=T_END).index]
    assert any("never ends" in p for p in problems(t)["slices"])
    t, evs = damaged(real)
    del t.packet[first(evs, kind=T_BEGIN).index]
    assert any("with no slice open" in p for p in problems(t)["slices"])
    # crossing: A's END (named, as some writers name ENDs) moved inside B, after B began
    t, evs = damaged(real)
    a0, a1, b0, b1 = _two_slices(evs)
    t.packet[a1.index].track_event.name_iid = a0.name
    t.packet[b1.index].track_event.name_iid = b0.name
    assert "slices" not in problems(t)  # named ENDs alone are fine
    t.packet[a1.index].timestamp = (b0.raw_ts + b1.raw_ts) // 2
    assert any("overlap without nesting" in p for p in problems(t)["slices"])


def test_flows_rule(real):
    t, evs = damaged(real)
    start = next(e for e in evs if e.flows)
    del t.packet[start.index].track_event.flow_ids[:]
    assert any("terminates before it starts" in p for p in problems(t)["flows"])
    t, evs = damaged(real)
    end = next(e for e in evs if e.ends)
    del t.packet[end.index].track_event.terminating_flow_ids[:]
    assert any("never terminates" in p for p in problems(t)["flows"])
    # the device block moved (in its own clock) to before the host launch that starts its flow
    t, evs = damaged(real)
    end = next(e for e in evs if e.ends)
    begin = next(e for e in evs if end.ends[0] in e.flows)
    t.packet[end.index].timestamp = end.raw_ts - (end.ts - begin.ts) - 1000
    assert any(f"flow {end.ends[0]} terminates before it starts" in p for p in problems(t)["flows"])


def test_incremental_rule(real):
    t, evs = damaged(real)
    seq = evs[0].seq
    opener = next(i for i, p in enumerate(t.packet) if p.trusted_packet_sequence_id == seq)
    assert t.packet[opener].sequence_flags & 1
    t.packet[opener].sequence_flags = 0
    assert any(f"sequence {seq} uses incremental state that was never cleared" in p
               for p in problems(t)["incremental"])
    t, evs = damaged(real)
    names = t.packet[opener].interned_data.event_names
    gone = names[0].iid
    del names[0]
    assert any(f"event_names iid {gone} used on sequence {seq} before it is defined" in p
               for p in problems(t)["incremental"])


def test_clocks_rule(real):
    # kvconv's traces before the clock fix: no snapshot holds BOOTTIME, the clock of a proto trace file
    t, _ = damaged(real)
    assert {c.clock_id for c in t.packet[0].clock_snapshot.clocks} == {6, 3}
    del t.packet[0]
    assert any("clock 6 cannot be related to the trace time clock 3" in p for p in problems(t)["clocks"])
    # a device sequence's snapshots moved after its first timed packet
    t, evs = damaged(real)
    dev = first(evs, clock=(64, next(e.seq for e in evs if e.clock[0] == 64)))
    snaps = [p.HasField("clock_snapshot") and p.trusted_packet_sequence_id == dev.seq for p in t.packet]
    moved = pb.Trace()
    moved.packet.extend([p for i, p in enumerate(t.packet[:dev.index + 1]) if not snaps[i]])
    moved.packet.extend([p for i, p in enumerate(t.packet[:dev.index + 1]) if snaps[i]])
    moved.packet.extend(t.packet[dev.index + 1:])
    assert any("timed in clock 64 before a clock snapshot holding that clock" in p
               for p in problems(moved)["clocks"])
    # the trace time set by a snapshot that comes after a timed packet (one in BOOTTIME, needing no snapshot itself)
    t, _ = damaged(real)
    late = pb.Trace()
    early = late.packet.add()
    early.timestamp, early.trusted_packet_sequence_id = 1, 99
    late.packet.extend(t.packet)
    assert any("trace time clock is set after packets were already timed" in p for p in problems(late)["clocks"])


def test_order_rule(real):
    t, evs = damaged(real)
    mid = evs[len(evs) // 2]
    later = next(e for e in evs[len(evs) // 2 + 1:] if e.clock == mid.clock and e.kind == T_INSTANT and not e.ends)
    marks = [pb.TracePacket(), pb.TracePacket()]
    marks[0].service_event.all_data_sources_flushed = True
    marks[1].service_event.read_tracing_buffers_completed = True
    cut = pb.Trace()
    cut.packet.extend(list(t.packet[:mid.index + 1]) + marks + list(t.packet[mid.index + 1:]))
    cut.packet[later.index + 2].timestamp = min(e.raw_ts for e in evs[:len(evs) // 2] if e.clock == mid.clock) - 1
    assert any("sorting window already closed" in p for p in problems(cut)["order"])


# --- trace processor itself, where a binary is at hand --------------------------------------------------------------

@pytest.mark.parametrize("case", sorted(CASES))
def test_trace_processor_imports_cleanly(traces, walked, case):
    path = traces(case)
    with trace_processor(path) as tp:
        bad = tp.query("select name, idx, severity, value from stats "
                       "where severity in ('error', 'data_loss') and value > 0").as_pandas_dataframe()
        assert bad.empty, bad.to_string()
        w = walked(case)
        slices = [e for e in w.events if e.kind in (T_BEGIN, T_INSTANT)]
        flows = {f for e in w.events for f in e.ends}
        got = tp.query("select (select count(*) from slice) n, (select count(*) from flow) f, "
                       "(select count(distinct track_id) from slice) t, (select min(ts) from slice) ts"
                       ).as_pandas_dataframe().iloc[0]
        assert int(got.n) == len(slices)
        assert int(got.f) == len(flows)
        assert int(got.t) == len({e.track for e in slices})
        if slices:  # h200-typo-pattern: no slice at all (min(ts) is null)
            assert int(got.ts) == min(e.ts for e in slices)
