"""kvconv.emit._proto writes the metadata packets of a Perfetto trace byte for byte as perfetto's own protos serialize
them (the same values set on a TracePacket, ``SerializeToString``), and writing a trace imports none of them."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import FIXTURES, ROOT
from kvconv.emit import _proto as pr

pb = pytest.importorskip("perfetto.protos.perfetto.trace.perfetto_trace_pb2")

BIG = (1 << 64) - 1


def _framed(p) -> bytes:
    return pr.frame(p.SerializeToString())


@pytest.mark.parametrize("clocks,primary,seq", [([(6, 0), (3, 0)], 3, 1), ([(3, 123_456_789), (64, BIG)], 3, 7)])
def test_clock_snapshot(clocks, primary, seq):
    p = pb.TracePacket()
    p.trusted_packet_sequence_id = seq
    for cid, ts in clocks:
        c = p.clock_snapshot.clocks.add()
        c.clock_id, c.timestamp = cid, ts
    p.clock_snapshot.primary_trace_clock = primary
    assert pr.clock_snapshot_packet(clocks, primary=primary, seq=seq) == _framed(p)


@pytest.mark.parametrize("kw", [
    {"uuid": 1 << 40, "name": "GPU 0 · ctx 1 · run.kvdump ±0.25 µs", "rank": 0, "ordering": 3},
    {"uuid": 5, "name": "SM 131 (2)", "rank": 300, "parent": 1 << 40},
    {"uuid": BIG, "name": "", "rank": 2, "parent": 0, "counter": "events/ms"},
])
def test_track_descriptor(kw):
    p = pb.TracePacket()
    p.trusted_packet_sequence_id = 1
    d = p.track_descriptor
    d.uuid, d.name = kw["uuid"], kw["name"]
    if "parent" in kw:
        d.parent_uuid = kw["parent"]
    if "ordering" in kw:
        d.child_ordering = kw["ordering"]
    d.sibling_order_rank = kw["rank"]
    if "counter" in kw:
        d.counter.unit_name = kw["counter"]
    assert pr.track_descriptor_packet(seq=1, **kw) == _framed(p)


@pytest.mark.parametrize("names,ann,strings", [
    ([], [], []),
    ([(1, "reshape_and_cache_flash_kernel"), (2, "node 3 · ké")], [(1, "block_x"), (2, "replay")], []),
    ([(1, "k")], [(1, "cache")], [(1, b"outside every cache"), (2, b"")]),
])
def test_sequence_start(names, ann, strings):
    p = pb.TracePacket()
    p.trusted_packet_sequence_id = 4
    p.sequence_flags = 1
    p.trace_packet_defaults.timestamp_clock_id = 64
    for iid, name in names:
        e = p.interned_data.event_names.add()
        e.iid, e.name = iid, name
    for iid, name in ann:
        e = p.interned_data.debug_annotation_names.add()
        e.iid, e.name = iid, name
    for iid, text in strings:
        e = p.interned_data.debug_annotation_string_values.add()
        e.iid, e.str = iid, text
    got = pr.sequence_start_packet(seq=4, flags=1, clock=64, event_names=names, annotation_names=ann,
                                   string_values=strings)
    assert got == _framed(p)


def test_instant():
    p = pb.TracePacket()
    p.trusted_packet_sequence_id, p.sequence_flags, p.timestamp = 3, 2, 1_700_000_000_123
    te = p.track_event
    te.type, te.track_uuid, te.name = 3, (9 << 40) + 7, "step 4 k0: 1 unexpected, 0 missing"
    ann = [("pages", 12), ("excluded", 0), ("unexpected", 1), ("missing", 0)]
    for k, val in ann:
        a = te.debug_annotations.add()
        a.name, a.uint_value = k, val
    got = pr.instant_packet(seq=3, flags=2, ts=1_700_000_000_123, track=(9 << 40) + 7, kind=3,
                            name="step 4 k0: 1 unexpected, 0 missing", annotations=ann)
    assert got == _framed(p)


def test_writing_a_trace_imports_no_perfetto_protos(tmp_path):
    code = ("import sys; from kvconv.emit import EmitOptions, write_perfetto; "
            f"write_perfetto([{str(FIXTURES / 'qwen3-14b' / 'qwen3-14b.kvdump')!r}], {str(tmp_path / 't.pftrace')!r}, "
            "options=EmitOptions(progress=False)); "
            "print(sorted(m for m in sys.modules if m.startswith(('perfetto', 'google.protobuf'))))")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "[]"
