"""Reader and writer: zero-copy views, counts never trusted beyond the file, atomic writes, salvage, warnings."""

import os
import warnings

import numpy as np
import pytest

from kvconv.format import dump, layout
from kvconv.format.errors import FormatError, SchemaError


def events(n, start=0):
    ev = np.zeros(n, dtype=layout.DTYPES["device_event"])
    ev["sequence"] = np.arange(start, start + n)
    ev["globaltimer"] = 1000 + np.arange(n)
    ev["kind"] = 1
    return ev


def test_roundtrip_is_zero_copy(tmp_path):
    p = tmp_path / "d.kvdump"
    with dump.new(p) as w:
        w.write_metadata({"tool": "t", "tool_version": "1"})
        w.write_records("device_event", events(1000), capacity=4096, drop_count=0)
    with dump.open(p) as d:
        ev = d.records("device_event")
        assert len(ev) == 1000 and int(ev["sequence"][-1]) == 999
        # A view into the mapped file, not a copy.
        assert not ev.flags.owndata and not ev.flags.writeable
        # what it holds, counted by the writer (issue 48): every group after the metadata
        assert d.metadata() == {"tool": "t", "tool_version": "1", "holds": {
            "groups": 1, "kinds": {"device_event": {"groups": 1, "records": 1000}}}}
        g = d.groups_of("device_event")[0]
        assert g.capacity == 4096 and g.clock_domain_name == "gpu_globaltimer"
        assert g.record_offset(0) == g.offset + 64


def test_payload_padded_to_8_and_layout_of_groups(tmp_path):
    p = tmp_path / "d.kvdump"
    with dump.new(p) as w:
        w.write_bytes("strings", b"abc")
        w.write_records("device_event", events(2))
    assert p.stat().st_size == 64 + 8 + 64 + 128


def test_events_only_file_of_published_size(tmp_path):
    p = tmp_path / "e.kvdump"
    with dump.new(p) as w:
        w.write_records("device_event", events(114_112), capacity=1_048_576)
    assert p.stat().st_size == 7_303_232


def test_writer_leaves_nothing_on_failure(tmp_path):
    p = tmp_path / "d.kvdump"
    with pytest.raises(RuntimeError):
        with dump.new(p) as w:
            w.write_records("device_event", events(3))
            raise RuntimeError("producer died")
    assert list(tmp_path.iterdir()) == []


def test_writer_rejects_wrong_dtype(tmp_path):
    with dump.new(tmp_path / "d.kvdump") as w:
        with pytest.raises(SchemaError):
            w.write_records("device_event", np.zeros(2, dtype=layout.DTYPES["host_launch"]))


def test_hostile_count_is_not_trusted(tmp_path):
    p = tmp_path / "d.kvdump"
    with dump.new(p) as w:
        w.write_records("device_event", events(4))
    raw = bytearray(p.read_bytes())
    hdr = dump.make_header(layout.KINDS["device_event"], record_count=2**62, payload_crc32=0)
    raw[:64] = hdr
    p.write_bytes(raw)
    with pytest.raises(FormatError) as e:
        dump.open(p)
    assert e.value.code == "count-exceeds-file" and e.value.offset == 24


def test_salvage_reads_up_to_last_whole_record(tmp_path):
    p = tmp_path / "d.kvdump"
    with dump.new(p) as w:
        w.write_records("graph_node", np.zeros(3, dtype=layout.DTYPES["host_launch"]))
        w.write_records("device_event", events(10))
    raw = p.read_bytes()
    cut = tmp_path / "cut.kvdump"
    cut.write_bytes(raw[: len(raw) - 64 * 3 - 10])
    with pytest.raises(FormatError) as e:
        dump.open(cut)
    assert e.value.code == "truncated-payload"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with dump.open(cut, options=dump.ReadOptions(salvage=True)) as d:
            g = d.groups_of("device_event")[0]
            assert len(g.records) == 6 and g.lost_records == 4
            assert list(d.records("device_event")["sequence"]) == list(range(6))
    assert any("salvaged 6, lost 4" in str(w.message) for w in caught)


def test_unknown_kind_and_newer_minor_are_read_with_warnings(tmp_path):
    p = tmp_path / "d.kvdump"
    unknown = layout.RecordKind(name="future", id=999, layout=None, record_size=16)
    with dump.new(p) as w:
        w.write_raw_group(unknown, b"x" * 32, record_count=2)
        w.write_raw_group(layout.KINDS["device_event"], events(2).tobytes(), record_count=2, minor=layout.MINOR + 1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with dump.open(p) as d:
            assert len(d.records("device_event")) == 2
            assert d.groups[0].kind is None
    text = " ".join(str(w.message) for w in caught)
    assert "unknown record kind 999" in text and f"minor version {layout.MINOR + 1}" in text


def test_checksum_mismatch_refused_by_open_and_scan_reports_it(tmp_path):
    p = tmp_path / "d.kvdump"
    with dump.new(p) as w:
        w.write_records("device_event", events(4))
    raw = bytearray(p.read_bytes())
    raw[64 + 70] ^= 0x40
    p.write_bytes(raw)
    with pytest.raises(FormatError) as e:
        dump.open(p)
    assert e.value.code == "payload-checksum"
    d = dump.scan(p)
    assert [f.code for f in d.problems] == ["payload-checksum"]
    d.close()


def test_input_never_changed_by_reading(tmp_path):
    p = tmp_path / "d.kvdump"
    with dump.new(p) as w:
        w.write_records("device_event", events(4))
    before = (p.read_bytes(), os.stat(p).st_mtime_ns)
    with dump.open(p) as d:
        d.records("device_event")
    assert (p.read_bytes(), os.stat(p).st_mtime_ns) == before


def test_several_contexts_and_kernel_names(tmp_path):
    p = tmp_path / "d.kvdump"
    st = dump.StringTable()
    kt = np.zeros(1, dtype=layout.DTYPES["kernel"])
    kt["slot"] = 3
    kt["name_off"], kt["name_len"] = st.add("k3")
    with dump.new(p) as w:
        for ctx in (0, 1):
            w.write_strings(st, context_id=ctx, device_id=ctx)
            w.write_records("kernel", kt, context_id=ctx, device_id=ctx)
            w.write_records("device_event", events(2 + ctx), context_id=ctx, device_id=ctx)
    with dump.open(p) as d:
        assert d.contexts() == [(0, 0), (1, 1)]
        assert len(d.records("device_event", context_id=1)) == 3
        assert len(d.records("device_event")) == 5
        assert d.kernel_names(context_id=1) == {3: "k3"}


def test_chunks_cover_every_record(tmp_path):
    p = tmp_path / "d.kvdump"
    with dump.new(p) as w:
        w.write_records("device_event", events(1000))
    with dump.open(p) as d:
        g = d.groups_of("device_event")[0]
        seen = np.concatenate([c["sequence"] for _, c in g.chunks(size=333)])
        assert list(seen) == list(range(1000))
