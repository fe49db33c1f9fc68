"""Emitters: outputs read back by their own readers (perfetto protos, json + jsonschema, pyarrow, DuckDB)."""

from __future__ import annotations

import hashlib
import json
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pytest

from conftest import FIXTURES, ROOT, load_script, run_cli, track_paths
from kvconv.emit import EmitOptions, _text, _wire, write_arrow, write_chrome, write_perfetto
from kvconv.format import dump, layout

pb = pytest.importorskip("perfetto.protos.perfetto.trace.perfetto_trace_pb2")

synth = load_script(FIXTURES / "synthetic-multi" / "make_synthetic.py")

PAIR = [FIXTURES / "synthetic-multi" / "rank0.kvdump", FIXTURES / "synthetic-multi" / "rank1.kvdump"]


def _trace(path) -> pb.Trace:
    t = pb.Trace()
    t.ParseFromString(Path(path).read_bytes())
    return t


@pytest.fixture(scope="module")
def pair_trace(tmp_path_factory):
    out = tmp_path_factory.mktemp("pf") / "tp.pftrace"
    res = write_perfetto(PAIR, out)
    return res, _trace(out), out


# ---------------------------------------------------------------------------------------------------------------
# the vectorised encoders against the reference encoders


@pytest.mark.parametrize("K", [3, 16])
def test_wire_equals_protobuf_serializer(K):
    """K 3: every length prefix has one size (the layout from the fields' bounds); K 16: the track event's length
    prefix takes one byte or two (its inner length straddles 128: the rows' lengths are added up)."""
    rng = np.random.default_rng(7)
    n = 3000
    ts = rng.integers(0, 2**63, n, dtype=np.uint64) >> rng.integers(0, 63, n).astype(np.uint64)
    iid = rng.integers(1, 400, n).astype(np.uint64)
    uuid = rng.integers(0, 2**40, n).astype(np.uint64)
    bx = rng.integers(0, 70000, n).astype(np.uint64)
    flow = rng.integers(0, 2**64 - 1, n, dtype=np.uint64)
    has = rng.random(n) < 0.5
    k = rng.integers(0, K + 1, n)
    fl2 = rng.integers(0, 2**64 - 1, (n, K), dtype=np.uint64)
    te = [_wire.msg(4, [_wire.const(b"\x08\x01"), _wire.varint(3, bx)], present=rng.random(n) < 0.7),
          _wire.const(b"\x48\x03"), _wire.varint(10, iid), _wire.varint(11, uuid),
          _wire.rfixed64(47, fl2, np.minimum(k, K)), _wire.fixed64(48, flow, present=has)]
    ann_present = te[0].present
    pk = [_wire.varint(8, ts), _wire.const(b"\x50\x05"), _wire.msg(11, te), _wire.const(b"\x68\x02")]
    data, order = _wire.encode([_wire.msg(1, pk)], n)
    order = np.arange(n) if order is None else order
    ref = pb.Trace()
    for i in order.tolist():
        p = ref.packet.add()
        p.timestamp = int(ts[i])
        p.trusted_packet_sequence_id = 5
        p.sequence_flags = 2
        e = p.track_event
        if ann_present[i]:
            a = e.debug_annotations.add()
            a.name_iid, a.uint_value = 1, int(bx[i])
        e.type, e.name_iid, e.track_uuid = 3, int(iid[i]), int(uuid[i])
        e.flow_ids.extend(int(x) for x in fl2[i, : min(k[i], K)])
        if has[i]:
            e.terminating_flow_ids.append(int(flow[i]))
    assert data == ref.SerializeToString()


def test_wire_slices_merge_to_one_encoding():
    """Encoding consecutive row ranges and ordering their groups by (signature, range) gives the bytes of one
    encoding of all rows (what the Perfetto emitter relies on when it encodes a chunk in cache-sized slices)."""
    rng = np.random.default_rng(11)
    n = 5000
    ts = rng.integers(0, 2**62, n, dtype=np.uint64) >> rng.integers(0, 60, n).astype(np.uint64)
    bx = rng.integers(0, 300, n).astype(np.uint64)
    has = rng.random(n) < 0.5

    def spec(a, b):
        te = [_wire.msg(4, [_wire.const(b"\x08\x01"), _wire.varint(3, bx[a:b])]), _wire.const(b"\x48\x03"),
              _wire.fixed64(48, ts[a:b], present=has[a:b])]
        return [_wire.msg(1, [_wire.varint(8, ts[a:b]), _wire.msg(11, te)])]

    whole = _wire.encode(spec(0, n), n)[0]
    groups = []
    for a in range(0, n, 700):
        b = min(n, a + 700)
        groups += [(sig, a, m) for sig, m in _wire.encode_groups(spec(a, b), b - a)]
    groups.sort(key=lambda g: (g[0], g[1]))
    assert b"".join(g[2].tobytes() for g in groups) == whole


def test_text_rows_parse_like_json_dump():
    rng = np.random.default_rng(3)
    n = 2000
    ns = rng.integers(0, 10**16, n)
    v = rng.integers(0, 10**12, n) >> rng.integers(0, 40, n)
    names = [json.dumps(s).encode() for s in ("a", 'b"q', "ü")]
    nid = rng.integers(0, 3, n)
    rows = [_text.lit(',\n{"ts":'), _text.ts_us(ns), _text.lit(',"v":'), _text.uint(v), _text.lit(',"name":'),
            _text.choice(nid, names), _text.lit("}")]
    got = json.loads("[" + _text.render(rows, n).decode()[1:] + "]")
    want = [{"ts": int(a) / 1000, "v": int(b), "name": json.loads(names[c])} for a, b, c in zip(ns, v, nid)]
    key = lambda e: (e["ts"], e["v"], e["name"])  # noqa: E731 - rows may be grouped by name
    assert sorted(got, key=key) == sorted(want, key=key)
    # strings of one length gathered per row, constant and few-valued numbers, long numbers, one group per slice
    n = 70000
    names = [json.dumps(s).encode() for s in ("ab", "cd", "a\"", "node 1 · k")]
    nid = rng.integers(0, 4, n)
    small = rng.integers(5, 40, n).astype(np.uint64)
    big = rng.integers(0, 2**64 - 1, n, dtype=np.uint64)
    ns = rng.integers(10**15, 10**15 + 10**9, n)
    rows = [_text.lit(',\n{"a":'), _text.uint(np.full(n, 7)), _text.lit(',"name":'), _text.choice(nid, names),
            _text.lit(',"s":'), _text.uint(small), _text.lit(',"b":'), _text.uint(big), _text.lit(',"ts":'),
            _text.ts_us(ns), _text.lit(',"z":'), _text.ts_us(np.full(n, 5)), _text.lit("}")]
    got = json.loads("[" + _text.render(rows, n).decode()[1:] + "]")
    want = [{"a": 7, "name": json.loads(names[c]), "s": int(x), "b": int(y), "ts": int(t) / 1000, "z": 0.005}
            for c, x, y, t in zip(nid, small, big, ns)]
    key = lambda e: (e["ts"], e["b"], e["s"], e["name"])  # noqa: E731
    assert sorted(got, key=key) == sorted(want, key=key)


def test_text_pads_few_valued_numbers_instead_of_grouping():
    """A number of few values whose digit count differs between rows (block indices 0..130) is written in the width
    of the largest with leading spaces (JSON whitespace), so the rows stay one matrix; many-valued numbers of
    different digit counts still group (no padding); every row parses to its values."""
    rng = np.random.default_rng(5)
    n = 4096
    few = rng.integers(0, 131, n).astype(np.uint64)
    many = rng.integers(0, 10**12, n) >> rng.integers(0, 40, n)
    rows = [_text.lit(',\n{"b":['), _text.uint(few), _text.lit(',0],"s":'), _text.uint(np.full(n, 3)), _text.lit("}")]
    mats = _text.render_parts(rows, n)
    assert len(mats) == 1 and mats[0].shape == (n, len('\n{"b":[130,0],"s":3}') + 1)
    lines = _text.render(rows, n).decode().split(",\n")[1:]
    assert {ln[ln.index("[") + 1 : ln.index(",")] for ln in lines} == {f"{x:>3}" for x in few.tolist()}
    got = json.loads("[" + ",".join(lines) + "]")
    assert [e["b"][0] for e in got] == few.tolist() and all(e["s"] == 3 for e in got)
    rows = [_text.lit(',\n{"v":'), _text.uint(many), _text.lit(',"b":'), _text.uint(few), _text.lit("}")]
    assert len(_text.render_parts(rows, n)) > 1
    lines = _text.render(rows, n).decode().split(",\n")[1:]
    assert all(" " not in ln[: ln.index(",")] for ln in lines)  # "v" grouped by digit count, not padded
    got = json.loads("[" + ",".join(lines) + "]")
    assert sorted((e["v"], e["b"]) for e in got) == sorted(zip(many.tolist(), few.tolist()))


# ---------------------------------------------------------------------------------------------------------------
# Perfetto


def test_perfetto_tree_counts_clocks_interning(pair_trace):
    res, tr, _ = pair_trace
    assert res.contexts == 2 and res.written_events == 2 * (280 + 64)
    descs = {p.track_descriptor.uuid: p.track_descriptor for p in tr.packet if p.HasField("track_descriptor")}
    roots = [d for d in descs.values() if not d.HasField("parent_uuid")]
    assert sorted(d.name.split(" ±")[0] for d in roots) == ["GPU 0 · ctx 0 · rank0.kvdump",
                                                            "GPU 1 · ctx 0 · rank1.kvdump"]

    paths = track_paths(tr)
    path = lambda u: paths.get(u, "")  # noqa: E731

    # sequences: first packet clears incremental state, the rest that use interning need it
    by_seq = defaultdict(list)
    for p in tr.packet:
        by_seq[p.trusted_packet_sequence_id].append(p)
    names: dict[int, dict[int, str]] = {}
    for seq, ps in by_seq.items():
        if seq == 1:  # the trace clock anchor (test_emit_clocks.py), then the track descriptors
            assert ps[0].HasField("clock_snapshot") and all(p.HasField("track_descriptor") for p in ps[1:])
            continue
        assert ps[0].sequence_flags == 1 and ps[0].HasField("interned_data")
        names[seq] = {e.iid: e.name for e in ps[0].interned_data.event_names}
        for p in ps[1:]:
            if p.HasField("track_event"):
                assert p.sequence_flags == 2
    per_track = defaultdict(Counter)
    flows_out, flows_in = set(), set()
    for p in tr.packet:
        if not p.HasField("track_event"):
            continue
        e = p.track_event
        if e.HasField("name_iid"):
            assert e.name_iid in names[p.trusted_packet_sequence_id]
        per_track[path(e.track_uuid)][e.type] += 1
        flows_out.update(e.flow_ids)
        flows_in.update(e.terminating_flow_ids)
    for r in ("rank0", "rank1"):
        g = [k for k in per_track if r in k]
        sm = sum(per_track[k][3] for k in g if "/ device blocks / SM" in k)
        assert sm == 280 + 64
        assert sum(per_track[k][1] for k in g if k.endswith("/ replays")) == 7
        assert sum(per_track[k][1] + per_track[k][3] for k in g if "/ nodes" in k) == 280
        assert sum(per_track[k][3] for k in g if k.endswith("/ host node launches")) == 280
        assert sum(per_track[k][3] for k in g if "eager launches" in k) == 1
    assert flows_out == flows_in and len(flows_in) == res.flows == 2 * (280 + 16)
    # clock snapshots: device clock (sequence-scoped 64) against CLOCK_MONOTONIC, on the device sequence
    snaps = [p for p in tr.packet if p.HasField("clock_snapshot") and p.trusted_packet_sequence_id != 1]
    assert len(snaps) == 20
    for p in snaps:
        assert sorted(c.clock_id for c in p.clock_snapshot.clocks) == [3, 64]
        assert p.clock_snapshot.primary_trace_clock == 3
        first = by_seq[p.trusted_packet_sequence_id][0]
        assert first.trace_packet_defaults.timestamp_clock_id == 64
    assert [a["pairs"] for a in res.alignment] == [10, 10]
    assert all(a["bound_ns"] == a["uncertainty_ns"] + a["drift_ns"] for a in res.alignment)


def test_perfetto_device_packets_equal_reference(pair_trace):
    """Each block-entry packet equals what perfetto's protos serialize for the same event."""
    _, tr, _ = pair_trace
    got = [p for p in tr.packet if p.HasField("track_event") and p.track_event.debug_annotations
           and p.track_event.debug_annotations[0].name_iid == 1 and p.trusted_packet_sequence_id == 2
           and p.track_event.type == 3 and p.track_event.track_uuid >= (1 << 24) + 0x10000]
    with dump.open(PAIR[0]) as d:
        ev = d.records("device_event")
        gn_grid = {int(g): i for i, g in enumerate(d.records("graph_node")["grid_id"])}
        seen = Counter()
        ref = []
        for i, r in enumerate(ev):
            p = pb.TracePacket()
            p.timestamp = int(r["globaltimer"])
            p.trusted_packet_sequence_id = 2
            p.sequence_flags = 2
            e = p.track_event
            a = e.debug_annotations.add()
            a.name_iid, a.uint_value = 1, int(r["block_x"])
            e.type, e.name_iid, e.track_uuid = 3, 1, (1 << 24) + 0x10000 + int(r["smid"])
            host = gn_grid.get(int(r["gridid"]), "eager")
            seen[host] += 1
            if seen[host] <= 16:
                e.terminating_flow_ids.append((1 << 40) | i)
            ref.append(p.SerializeToString())
    assert sorted(p.SerializeToString() for p in got) == sorted(ref)


def test_lanes_lowest_free_lane():
    from kvconv.emit.plan import lanes as _lanes

    def naive(st, en):  # each slice (by start, then end) on the first lane whose last slice ended before it starts
        order = np.lexsort((en, st))
        ends, out = [], np.zeros(len(st), np.int64)
        for k in order:
            j = next((j for j, le in enumerate(ends) if st[k] > le), len(ends))
            ends[j:j + 1] = [en[k]]
            out[k] = j
        return out

    rng = np.random.default_rng(5)
    for _ in range(200):
        n = int(rng.integers(1, 50))
        st = rng.integers(0, 100, n).astype(np.uint64)
        en = st + rng.integers(0, 40, n).astype(np.uint64)
        assert np.array_equal(_lanes(st, en), naive(st, en))


def test_perfetto_deterministic_chunked_and_refuses_input(tmp_path):
    a, b, c = tmp_path / "a.pftrace", tmp_path / "b.pftrace", tmp_path / "c.pftrace"
    write_perfetto(PAIR, a)
    write_perfetto(PAIR, b)
    assert a.read_bytes() == b.read_bytes()
    write_perfetto(PAIR, c, options=EmitOptions(chunk=7))
    ser = lambda p: Counter(x.SerializeToString() for x in _trace(p).packet)  # noqa: E731
    assert ser(a) == ser(c)
    r = run_cli("perfetto", str(PAIR[0]), "-o", str(PAIR[0]))
    assert r.returncode == 1 and "overwrite an input" in r.stderr and "Traceback" not in r.stderr


def test_perfetto_replays_and_window(tmp_path):
    out = tmp_path / "w.pftrace"
    res = write_perfetto(PAIR[:1], out, options=EmitOptions(replays=(2, 3)))
    assert res.written_events == 80 and res.host_records == 80
    res = write_perfetto(PAIR[:1], tmp_path / "w2.pftrace", options=EmitOptions(window_ms=(0, 1)))
    assert 0 < res.written_events < 344


def test_big_trace_warning(tmp_path):
    res = write_perfetto(PAIR[:1], tmp_path / "x.pftrace", options=EmitOptions(ui_limit_bytes=1000))
    assert any("--window" in w for w in res.warnings)


@pytest.mark.parametrize("fmt", ["perfetto", "chrome"])
@pytest.mark.parametrize("case", ["qwen3-14b", "h200-single"])
def test_size_estimate_is_near_the_written_size(tmp_path, fmt, case):
    """The too-big warning's estimate is within a factor of ~1.7 of what is written (Chrome's said 20 GiB of a
    10 GiB dump's 39 GiB: half)."""
    import re

    out = tmp_path / f"t.{fmt}"
    res = (write_perfetto if fmt == "perfetto" else write_chrome)([next((FIXTURES / case).glob("*.kvdump"))], out,
                                                                   options=EmitOptions(ui_limit_bytes=1))
    v, unit = re.search(r"about ([0-9.]+) (GiB|MiB|KiB|B)\b", " ".join(res.warnings)).groups()
    est = float(v) * {"GiB": 2**30, "MiB": 2**20, "KiB": 2**10, "B": 1}[unit]
    assert 0.6 < est / out.stat().st_size < 1.7


JOIN_DUMPS = sorted(p for pat in ("h200-*/*.kvdump", "synthetic-multi/*.kvdump", "synthetic-reconcile/*.kvdump")
                    for p in FIXTURES.glob(pat))


@pytest.mark.parametrize("path", JOIN_DUMPS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_exact_join_equals_reconcile(path):
    """The emitters' vectorised exact join gives kvconv.check.reconcile's exact-join matches and node ordinals."""
    from kvconv.check import reconcile
    from kvconv.emit._contexts import open_contexts

    dumps, ctxs = open_contexts([path], EmitOptions(join="exact"), lambda m: None)
    try:
        res = reconcile.reconcile(dumps[0], options=reconcile.ReconcileOptions(relaxed=True))
        for c in ctxs:
            rep = [r for r in res.contexts if r["context_id"] == c.context_id]
            m = res.matches[res.matches["context_id"] == c.context_id]
            la = res.launches[(res.launches["context_id"] == c.context_id) & (res.launches["host_kind"] == 6)]
            assert np.array_equal(c.host.node_ordinal[la["host_index"]], la["node_ordinal"])
            if not rep or rep[0]["join"] != "exact":
                continue
            want = np.full(c.n_events, -1, np.int64)
            ok = m["host_index"] >= 0
            want[m["device_index"][ok]] = np.where(m["host_kind"][ok] == 6, m["host_index"][ok],
                                                   c.host.n_gn + m["host_index"][ok])
            for chunk in (7, 1 << 18):
                got = np.concatenate([c.match(f, r) for f, r in c.chunks(chunk)] or [np.zeros(0, np.int64)])
                assert np.array_equal(got, want)
    finally:
        for d in dumps:
            d.close()


@pytest.mark.parametrize("path", [p for p in JOIN_DUMPS if "h200" in p.parent.name or "clean" in p.name
                                  or "fault-node-missing" in p.name][:6], ids=lambda p: p.name)
def test_auto_join_outputs_equal_reconcile_outputs(tmp_path, path):
    """auto (the vectorised exact join, reconcile when it cannot stand in) joins as kvconv reconcile does: the matches
    table it writes is reconcile's, row for row; and lifting the size bound (the former --join reconcile) changes
    no byte."""
    import pyarrow.dataset as ds

    from kvconv.check import reconcile

    for f, ext in ((write_perfetto, "pftrace"), (write_chrome, "json")):
        a, b = tmp_path / f"a.{ext}", tmp_path / f"b.{ext}"
        ra, rb = f([path], a), f([path], b, options=EmitOptions(reconcile_max_events=1 << 62))
        assert ra.join == rb.join and a.read_bytes() == b.read_bytes()
    write_arrow([path], tmp_path / "A")
    got = ds.dataset(tmp_path / "A" / "matches", format="arrow", partitioning="hive").to_table()
    with dump.open(path) as d:
        want = reconcile.reconcile(d, options=reconcile.ReconcileOptions(relaxed=True)).matches
    for name in ("context_id", "device_index", "host_kind", "host_index", "replay", "node_ordinal", "join"):
        assert np.array_equal(got.column(name).to_numpy(), want[name]), name


def test_emitters_verify_device_event_checksums(tmp_path):
    p = tmp_path / "bad.kvdump"
    p.write_bytes(PAIR[0].read_bytes())
    with dump.open(p) as d:
        off = d.groups_of("device_event")[0].payload_offset
    raw = bytearray(p.read_bytes())
    raw[off + 70] ^= 0x40
    p.write_bytes(raw)
    from kvconv.format.errors import FormatError

    for f in (write_perfetto, write_chrome, write_arrow):
        with pytest.raises(FormatError) as e:
            f([p], tmp_path / "out", options=EmitOptions(chunk=16))
        assert e.value.code == "payload-checksum"


def test_streaming_gridid_join_matches_reconcile(tmp_path):
    a, b = tmp_path / "a.pftrace", tmp_path / "b.pftrace"
    ra = write_perfetto(PAIR[:1], a, options=EmitOptions(join="auto", reconcile_max_events=1 << 62))
    rb = write_perfetto(PAIR[:1], b, options=EmitOptions(join="exact"))
    assert ra.flows == rb.flows == 296
    assert rb.join == ["exact(gridid)"]


# ---------------------------------------------------------------------------------------------------------------
# Chrome JSON


def test_chrome_schema_events_flows_alignment(tmp_path):
    jsonschema = pytest.importorskip("jsonschema")
    out = tmp_path / "t.json"
    res = write_chrome(PAIR, out)
    doc = json.loads(out.read_text())
    schema = json.loads((ROOT / "schemas" / "chrome.schema.json").read_text())
    jsonschema.validate(doc, schema)
    assert doc["displayTimeUnit"] == "ns"
    ev = doc["traceEvents"]
    ph = Counter(e["ph"] for e in ev)
    assert ph["s"] == ph["f"] == res.flows == 2 * (280 + 16)
    assert {e["id"] for e in ev if e["ph"] == "s"} == {e["id"] for e in ev if e["ph"] == "f"}
    blocks = [e for e in ev if e["ph"] == "X" and e["cat"] == "block"]
    assert len(blocks) == 2 * 344
    # device times sit on the host timeline through the nearest earlier clock-sync pair
    with dump.open(PAIR[1]) as d:
        cs = d.records("clock_sync")
        e0 = d.records("device_event")[100]
    i = np.searchsorted(cs["gpu_ns"], e0["globaltimer"], side="right") - 1
    want = (int(cs["host_ns"][i]) + int(e0["globaltimer"]) - int(cs["gpu_ns"][i])) / 1000
    hit = [e for e in blocks if e["pid"] == 2 and e["args"]["seq"] == 100]
    assert hit and hit[0]["ts"] == want
    assert write_chrome(PAIR, tmp_path / "u.json") and (tmp_path / "u.json").read_bytes() == out.read_bytes()


# ---------------------------------------------------------------------------------------------------------------
# Arrow / Parquet


def test_arrow_roundtrip_and_metadata(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.ipc  # noqa: F401

    out = tmp_path / "tables"
    res = write_arrow(PAIR[:1], out)
    assert res.written_events == 344
    f = out / "device_event" / "run=rank0" / "device=0" / "part-ctx0.arrow"
    t = pa.ipc.open_file(f).read_all()
    meta = {k.decode(): v.decode() for k, v in t.schema.metadata.items()}
    assert meta["kvconv.format_version"] == f"{layout.MAJOR}.0"  # the dump's own version (finished dumps: 1.0)
    assert json.loads(meta["kvconv.run_metadata"])["tool"] == "kvconv-synthetic"
    assert json.loads(meta["kvconv.alignment"])["pairs"] == 10
    with dump.open(PAIR[0]) as d:
        ev = d.records("device_event")
        for name in ev.dtype.names:
            assert np.array_equal(t[name].to_numpy(), ev[name]), name
        gn = pa.ipc.open_file(out / "graph_node" / "run=rank0" / "device=0" / "part-ctx0.arrow").read_all()
        assert np.array_equal(gn["host_ns"].to_numpy(), d.records("graph_node")["host_ns"])
    k = pa.ipc.open_file(out / "kernel" / "run=rank0" / "device=0" / "part-ctx0.arrow").read_all()
    assert "reshape_and_cache_flash_kernel" in k["name"][0].as_py()
    m = pa.ipc.open_file(out / "matches" / "run=rank0" / "device=0" / "part-ctx0.arrow").read_all()
    assert m.num_rows == 344 and (m["host_index"].to_numpy() >= 0).all()


def test_parquet_dataset_duckdb(tmp_path):
    duckdb = pytest.importorskip("duckdb")
    out = tmp_path / "ds"
    r = run_cli("arrow", *map(str, PAIR), "-o", str(out), "--format", "parquet")
    assert r.returncode == 0, r.stderr
    assert "error bound" in r.stderr
    q = duckdb.sql(f"""
        select run, device, count(*) n, count(distinct smid) sms
        from read_parquet('{out}/device_event/*/*/*.parquet', hive_partitioning=true)
        group by all order by run""").fetchall()
    assert [(a, int(b), int(n)) for a, b, n, _ in q] == [("rank0", 0, 344), ("rank1", 1, 344)]
    j = duckdb.sql(f"""
        select m.run, count(*) from read_parquet('{out}/matches/*/*/*.parquet', hive_partitioning=true) m
        where m.host_kind = 6 group by all order by 1""").fetchall()
    assert j == [("rank0", 280), ("rank1", 280)]
    h1 = hashlib.sha256(b"".join(p.read_bytes() for p in sorted(out.rglob("*.parquet")))).hexdigest()
    out2 = tmp_path / "ds2"
    assert run_cli("arrow", *map(str, PAIR), "-o", str(out2), "--format", "parquet").returncode == 0
    assert h1 == hashlib.sha256(b"".join(p.read_bytes() for p in sorted(out2.rglob("*.parquet")))).hexdigest()


def test_cli_perfetto_and_chrome(tmp_path):
    r = run_cli("perfetto", *map(str, PAIR), "-o", str(tmp_path / "t.pftrace"))
    assert r.returncode == 0 and "between two contexts: error bound" in r.stderr, r.stderr
    r = run_cli("chrome", str(PAIR[0]), "-o", str(tmp_path / "t.json"), "--replays", "1:2", "-q")
    assert r.returncode == 0 and r.stderr == ""
    r = run_cli("chrome", str(PAIR[0]), "-o", str(tmp_path / "t.json"), "--window", "x")
    assert r.returncode == 2 and "START:END" in r.stderr


def test_synthetic_large_dump_multi_group(tmp_path):
    """A bench-shaped dump (several host records per replay, many blocks per launch) through all emitters."""
    p = tmp_path / "big.kvdump"
    synth.write_large(p, events=1 << 14, host=1 << 10)
    r1 = write_perfetto([p], tmp_path / "b.pftrace", options=EmitOptions(chunk=1000, flows=4))
    assert r1.written_events == 1 << 14 and r1.flows == 4 * (1 << 10)
    tr = _trace(tmp_path / "b.pftrace")
    assert sum(1 for x in tr.packet if x.HasField("track_event") and x.track_event.terminating_flow_ids) == 4096
    r2 = write_chrome([p], tmp_path / "b.json", options=EmitOptions(chunk=1000))
    assert len(json.loads((tmp_path / "b.json").read_text())["traceEvents"]) > r2.written_events
    r3 = write_arrow([p], tmp_path / "b", options=EmitOptions(chunk=1000))
    assert r3.written_events == 1 << 14


@pytest.mark.parametrize("fmt", ["arrow", "parquet"])
def test_arrow_device_table_across_many_batches(tmp_path, fmt):
    """Small chunks: many batches through the two alternating column sets; every column reads back equal."""
    pa = pytest.importorskip("pyarrow")
    import pyarrow.dataset as ds

    p = tmp_path / "big.kvdump"
    synth.write_large(p, events=20_000, host=512)
    out = tmp_path / "t"
    res = write_arrow([p], out, options=EmitOptions(chunk=1_234, arrow_format=fmt))
    assert res.written_events == 20_000
    t = ds.dataset(out / "device_event", format="ipc" if fmt == "arrow" else "parquet").to_table()
    if fmt == "arrow":
        f = next((out / "device_event").rglob("*.arrow"))
        assert pa.ipc.open_file(f).num_record_batches == -(-20_000 // 1_234)
    with dump.open(p) as d:
        ev = d.records("device_event")
        for name in ev.dtype.names:
            assert np.array_equal(t[name].to_numpy(), ev[name]), name
        assert res.host_records == len(d.records("graph_node")) + len(d.records("eager_launch")) >= 512
        hl = d.records("graph_node")
        gn = ds.dataset(out / "graph_node", format="ipc" if fmt == "arrow" else "parquet").to_table()
        for name in hl.dtype.names:
            assert np.array_equal(gn[name].to_numpy(), hl[name]), name
    assert (t["context_id"].to_numpy() == 0).all()


def test_background_writer_order_limit_and_errors():
    import errno
    import io
    import threading

    from kvconv.emit._writer import BackgroundWriter

    f = io.BytesIO()
    with BackgroundWriter(f, limit=10) as w:
        for i in range(200):
            w.write(np.full(7, i, np.uint8))
            assert w.waiting <= 10 + 7  # at most the limit waits, plus the buffer that crossed it
    assert f.getvalue() == b"".join(bytes([i]) * 7 for i in range(200))

    class Full(io.RawIOBase):
        def __init__(self):
            self.n = 0
            self.seen_thread = None

        def writable(self):
            return True

        def write(self, b):
            self.seen_thread = threading.current_thread().name
            self.n += len(b)
            if self.n > 50:
                raise OSError(errno.ENOSPC, "No space left on device")
            return len(b)

    full = Full()
    with pytest.raises(OSError) as e:
        with BackgroundWriter(full, limit=1) as w:
            for _ in range(100):
                w.write(b"x" * 20)
    assert e.value.errno == errno.ENOSPC and full.seen_thread == "kvconv-writer"
    # the caller's own error wins; the thread still ends
    with pytest.raises(KeyError):
        with BackgroundWriter(io.BytesIO()) as w:
            w.write(b"abc")
            raise KeyError("x")
    assert not w.thread.is_alive()


def test_many_overlapping_lanes_get_their_own_tracks(tmp_path):
    """70 overlapping replays and 700 overlapping node executions of one graph exec: every lane its own track
    under the exec's group, none shared, and no track with overlapping slices (Perfetto and Chrome)."""
    gen = load_script(FIXTURES / "synthetic-reconcile" / "generate.py")
    parts = gen.build(eager=1, eager_blocks=1, nodes=10, replays=70, node_blocks=2)
    e = parts["events"]
    node = np.flatnonzero(e["kernel_slot"] == gen.SLOT_NODE)
    # every node execution spans [its own start, one common end]: all of them overlap, and so do the replays
    e["globaltimer"][node] = np.where(e["block_x"][node] == 0, gen.GPU0 + node, gen.GPU0 + 10**9)
    p = tmp_path / "lanes.kvdump"
    gen.write(p, parts)
    write_perfetto([p], tmp_path / "t.pftrace")
    tr = _trace(tmp_path / "t.pftrace")
    desc = [x.track_descriptor for x in tr.packet if x.HasField("track_descriptor")]
    uuids = [d.uuid for d in desc]
    assert len(uuids) == len(set(uuids))
    by = {d.uuid: d for d in desc}
    group = next(d.uuid for d in desc if d.name.startswith("graph exec"))
    replays = [d for d in desc if d.name.startswith("replays")]
    nodes = [d for d in desc if d.name.startswith("nodes")]
    assert len(replays) == 70 and len(nodes) == 700
    assert all(d.parent_uuid == group for d in replays + nodes)
    spans: dict = defaultdict(list)
    for x in tr.packet:
        te = x.track_event
        if x.HasField("track_event") and te.type in (1, 2) and by.get(te.track_uuid) in replays + nodes:
            spans[te.track_uuid].append((x.timestamp, 0 if te.type == 2 else 1))
    assert sum(len(v) for v in spans.values()) == 2 * (70 + 700)
    for v in spans.values():  # ends sort before begins at one timestamp: at most one open slice per track
        depth = 0
        for _, kind in sorted(v):
            depth += 1 if kind else -1
            assert depth in (0, 1)
    write_chrome([p], tmp_path / "t.json")
    names: dict = defaultdict(set)
    for ev in json.loads((tmp_path / "t.json").read_text())["traceEvents"]:
        if ev["ph"] == "M" and ev["name"] == "thread_name":
            names[(ev["pid"], ev["tid"])].add(ev["args"]["name"])
    assert all(len(v) == 1 for v in names.values())
    assert sum(1 for v in names.values() if " · nodes" in next(iter(v))) == 700


@pytest.mark.parametrize("opts", [[], ["--window", "0:3"]])
def test_flows_of_interleaved_launches(tmp_path, opts):
    """Blocks of launches interleaved (launch pairs running at once, a block of one then of the other), over more
    than one 16,384-event slice of a pass, with and without a filter that skips events: every host record's flows
    still go to its first K kept device blocks in dump order, in Perfetto and in Chrome (the flow ends of such
    records are not consecutive device events, which the emitters keep apart from the usual runs)."""
    gen = load_script(FIXTURES / "synthetic-reconcile" / "generate.py")
    parts = gen.build(eager=3, eager_blocks=40, nodes=20, replays=60, node_blocks=24)
    e = parts["events"]
    run = np.r_[0, np.cumsum((e["gridid"][1:] != e["gridid"][:-1]) | (e["tag"][1:] != e["tag"][:-1]))]
    within = np.arange(len(e)) - np.searchsorted(run, run)
    e = e[np.lexsort((run, within, run // 2))]  # launch pairs: block 0 of both, block 1 of both, ...
    e["sequence"] = np.arange(len(e))
    parts["events"] = e
    p = tmp_path / "inter.kvdump"
    gen.write(p, parts)
    assert len(e) > 1 << 14
    K = 5
    for fmt, out in (("perfetto", "t.pftrace"), ("chrome", "t.json")):
        r = run_cli(fmt, p, "-o", tmp_path / out, "--flows", K, "-q", *opts)
        assert r.returncode == 0, r.stderr
    kept = np.ones(len(e), bool)
    if opts:  # --window 0:3: device events within 3 ms of the first
        t = e["globaltimer"]
        kept = t <= t.min() + 3_000_000
        assert 0 < kept.sum() < len(e)
    seen: dict = defaultdict(list)  # (gridid, tag) -> its kept device events, in dump order
    for i in np.flatnonzero(kept).tolist():
        seen[(int(e["gridid"][i]), int(e["tag"][i]))].append(i)
    want = sorted(tuple((1 << 40) | i for i in v[:K]) for v in seen.values())
    tr = _trace(tmp_path / "t.pftrace")
    host = sorted(tuple(x.track_event.flow_ids) for x in tr.packet
                  if x.HasField("track_event") and x.track_event.flow_ids)
    ends = sorted(f for x in tr.packet if x.HasField("track_event") for f in x.track_event.terminating_flow_ids)
    assert host == want and ends == sorted(f for v in want for f in v)
    evs = json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    starts: dict = defaultdict(list)
    for x in evs:
        if x["ph"] == "s":
            starts[(x["tid"], x["ts"])].append(x["id"])
    assert sorted(tuple(v) for v in starts.values()) == want
    assert sorted(x["id"] for x in evs if x["ph"] == "f") == sorted(f for v in want for f in v)


@pytest.mark.parametrize("fmt", ["arrow", "parquet"])
def test_arrow_host_tables_in_batches(tmp_path, fmt):
    """More host records than one record batch holds (65,536): the graph_node table is written a batch at a time
    (bounded memory on long runs) and reads back whole and equal, through the CLI, with pyarrow (and DuckDB for
    Parquet)."""
    pa = pytest.importorskip("pyarrow")
    import pyarrow.dataset as ds

    p = tmp_path / "host.kvdump"
    synth.write_large(p, events=140_000, host=70_144)
    out = tmp_path / "t"
    r = run_cli("arrow", p, "-o", out, "--format", fmt, "-q")
    assert r.returncode == 0, r.stderr
    form = "ipc" if fmt == "arrow" else "parquet"
    gn = ds.dataset(out / "graph_node", format=form).to_table()
    if fmt == "arrow":
        assert pa.ipc.open_file(next((out / "graph_node").rglob("*.arrow"))).num_record_batches == 2
    with dump.open(p) as d:
        hl = d.records("graph_node")
        assert len(hl) == 70_144 and gn.num_rows == len(hl)
        for name in hl.dtype.names:
            assert np.array_equal(gn[name].to_numpy(), hl[name]), name
    duckdb = pytest.importorskip("duckdb")
    files = [str(f) for f in (out / "graph_node").rglob(f"*.{fmt}")]
    if fmt == "parquet":
        got = duckdb.sql(f"select count(*), sum(launch_id) from read_parquet({files})").fetchall()
        assert got == [(len(hl), int(hl["launch_id"].sum()))]
