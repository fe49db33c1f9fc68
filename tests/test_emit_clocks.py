"""Perfetto traces import without clock-domain errors: every clock a packet is timed in, and the clock
trace_processor takes a proto trace file's own (BOOTTIME), reach the trace time clock through the trace's clock
snapshots, and the trace time is set (``primary_trace_clock``) before any packet is timed.

trace_processor's rule (src/trace_processor/importers/common/clock_tracker.cc, ``BridgeToTraceTime``): a proto file
registers BOOTTIME as its clock; on the first conversion BOOTTIME is bridged to the trace time clock only through a
snapshot path (or when both are the same clock); otherwise the import logs ``clock_sync_unrelatable_clock_domains``,
severity error. Sequence-scoped clocks (ids 64..127) are qualified by their sequence.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

from conftest import run_cli

ROOT = Path(__file__).resolve().parent.parent
BOOTTIME, MONOTONIC = 6, 3
CASES = {
    "qwen3-14b": ["fixtures/qwen3-14b/qwen3-14b.kvdump"],
    "h200-single": ["fixtures/h200-single/single.kvdump"],
    "h200-enter-exit": ["fixtures/h200-enter-exit/enter-exit.kvdump"],
    "h200-twostream": ["fixtures/h200-twostream/twostream.kvdump"],
    "h200-tp2 merged": ["fixtures/h200-tp2/rank0.kvdump", "fixtures/h200-tp2/rank1.kvdump"],
}


def _clock(cid: int, seq: int):
    return (cid, seq if 64 <= cid < 128 else 0)


def clock_problems(trace: pb.Trace) -> list[str]:
    """What trace_processor would refuse about the trace's clocks (empty: nothing)."""
    edges: dict = defaultdict(set)
    primary = None
    defaults: dict[int, int] = {}
    used = {_clock(BOOTTIME, 0)}
    problems = []
    for p in trace.packet:
        seq = p.trusted_packet_sequence_id
        if p.HasField("trace_packet_defaults") and p.trace_packet_defaults.HasField("timestamp_clock_id"):
            defaults[seq] = p.trace_packet_defaults.timestamp_clock_id
        if p.HasField("clock_snapshot"):
            ids = [_clock(c.clock_id, seq) for c in p.clock_snapshot.clocks]
            for a in ids:
                edges[a].update(b for b in ids if b != a)
            if p.clock_snapshot.HasField("primary_trace_clock") and primary is None:
                if len(used) > 1:
                    problems.append("the trace time is set after packets were already timed")
                primary = _clock(p.clock_snapshot.primary_trace_clock, 0)
            continue
        if p.HasField("timestamp"):
            cid = p.timestamp_clock_id if p.HasField("timestamp_clock_id") else defaults.get(seq, BOOTTIME)
            used.add(_clock(cid, seq))
    primary = primary or _clock(BOOTTIME, 0)
    seen, todo = {primary}, [primary]
    while todo:
        for b in edges[todo.pop()] - seen:
            seen.add(b)
            todo.append(b)
    problems += [f"clock {c[0]} (sequence {c[1]}) cannot be related to the trace time clock {primary[0]}"
                 for c in sorted(used - seen)]
    return problems


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_clock_reaches_the_trace_time(tmp_path, case):
    out = tmp_path / "t.pftrace"
    r = run_cli("perfetto", *[ROOT / p for p in CASES[case]], "-o", out, "-q")
    assert r.returncode == 0, r.stderr
    t = pb.Trace()
    t.ParseFromString(out.read_bytes())
    assert clock_problems(t) == []
    first = t.packet[0].clock_snapshot
    assert first.primary_trace_clock == MONOTONIC and {c.clock_id for c in first.clocks} == {BOOTTIME, MONOTONIC}


def test_the_rule_catches_an_unrelated_boottime():
    """The check itself: a trace in MONOTONIC whose snapshots never hold BOOTTIME (kvconv's traces before the fix)."""
    t = pb.Trace()
    p = t.packet.add()
    p.trusted_packet_sequence_id = 2
    for cid, ts in ((MONOTONIC, 100), (64, 5000)):
        c = p.clock_snapshot.clocks.add()
        c.clock_id, c.timestamp = cid, ts
    p.clock_snapshot.primary_trace_clock = MONOTONIC
    q = t.packet.add()
    q.trusted_packet_sequence_id, q.timestamp, q.timestamp_clock_id = 2, 5100, 64
    assert clock_problems(t) == ["clock 6 (sequence 0) cannot be related to the trace time clock 3"]
    late = pb.Trace()
    late.packet.add().CopyFrom(q)
    late.packet.add().CopyFrom(p)
    assert "the trace time is set after packets were already timed" in clock_problems(late)
