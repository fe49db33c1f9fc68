"""The few dozen metadata packets of a Perfetto trace (track descriptors, interning, clock snapshots, canary instants)
encoded by hand, with the field numbers of perfetto's protos, in the bytes ``SerializeToString`` gives (fields in
field-number order, every field the caller sets written, even when 0): a trace is written without importing
perfetto's generated protos, which cost every ``kvconv perfetto`` process ~45 ms of CPU (their descriptor pool) for
packets that are a few kilobytes. tests/test_emit_proto.py holds each builder to perfetto's own serializer.

    >>> clock_snapshot_packet([(6, 0), (3, 0)], primary=3, seq=1).hex()
    '0a12320e0a04080610000a040803100010035001'
"""

from __future__ import annotations

from kvconv.emit._wire import tag, varint_bytes

_U64 = (1 << 64) - 1


def v(field: int, value) -> bytes:
    """A varint field (uint64, uint32, int32 and enum alike: a negative value as its 64-bit two's complement)."""
    return tag(field, 0) + varint_bytes(int(value) & _U64)


def ld(field: int, data: bytes | str) -> bytes:
    """A length-delimited field: bytes, a string (UTF-8) or an embedded message's bytes."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    return tag(field, 2) + varint_bytes(len(data)) + data


def frame(packet: bytes) -> bytes:
    """One ``Trace.packet`` field around a TracePacket's bytes."""
    return ld(1, packet)


# TracePacket
_CLOCK_SNAPSHOT, _TIMESTAMP, _SEQ_ID, _TRACK_EVENT, _INTERNED, _SEQ_FLAGS, _DEFAULTS, _TRACK_DESCRIPTOR = (
    6, 8, 10, 11, 12, 13, 59, 60)


def clock_snapshot_packet(clocks, *, primary: int, seq: int) -> bytes:
    """A framed ClockSnapshot packet: ``clocks`` as ``(clock_id, timestamp)`` pairs."""
    cs = b"".join(ld(1, v(1, cid) + v(2, ts)) for cid, ts in clocks) + v(2, primary)
    return frame(ld(_CLOCK_SNAPSHOT, cs) + v(_SEQ_ID, seq))


def track_descriptor_packet(*, seq: int, uuid: int, name: str, rank: int, parent: int | None = None,
                            counter: str | None = None, ordering: int | None = None) -> bytes:
    """A framed TrackDescriptor packet (``counter``: the unit name of a counter track)."""
    d = v(1, uuid) + ld(2, name)
    if parent is not None:
        d += v(5, parent)
    if counter is not None:
        d += ld(8, ld(6, counter))
    if ordering is not None:
        d += v(11, ordering)
    d += v(12, rank)
    return frame(v(_SEQ_ID, seq) + ld(_TRACK_DESCRIPTOR, d))


def sequence_start_packet(*, seq: int, flags: int, clock: int, event_names, annotation_names,
                          string_values=()) -> bytes:
    """A framed packet that starts a sequence: its interned names (``(iid, name)`` pairs of event names, debug
    annotation names and annotation string values), its flags and its default timestamp clock."""
    data = b"".join(ld(2, v(1, iid) + ld(2, name)) for iid, name in event_names)
    data += b"".join(ld(3, v(1, iid) + ld(2, name)) for iid, name in annotation_names)
    data += b"".join(ld(29, v(1, iid) + ld(2, text)) for iid, text in string_values)
    p = v(_SEQ_ID, seq) + (ld(_INTERNED, data) if data else b"")
    return frame(p + v(_SEQ_FLAGS, flags) + ld(_DEFAULTS, v(58, clock)))


def instant_packet(*, seq: int, flags: int, ts: int, track: int, kind: int, name: str, annotations) -> bytes:
    """A framed TrackEvent packet with its name inline and ``(name, uint value)`` debug annotations."""
    te = b"".join(ld(4, v(3, value) + ld(10, key)) for key, value in annotations)
    te += v(9, kind) + v(11, track) + ld(23, name)
    return frame(v(_TIMESTAMP, ts) + v(_SEQ_ID, seq) + ld(_TRACK_EVENT, te) + v(_SEQ_FLAGS, flags))
