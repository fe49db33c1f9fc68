"""Every table of an Arrow / Parquet output reads back as a hive-partitioned dataset in the readers users have:
pyarrow (dataset and pq.read_table), polars and DuckDB, on multi-dump outputs written through the CLI (issue 12: the
matches table carried two ``context_id`` columns, which every one of these readers refuses)."""

from __future__ import annotations

from collections import Counter

import pytest

from conftest import FIXTURES, run_cli

pa = pytest.importorskip("pyarrow")
import pyarrow.dataset as ds  # noqa: E402
import pyarrow.ipc  # noqa: E402,F401
import pyarrow.parquet as pq  # noqa: E402

MULTI = {
    "synthetic-multi": [FIXTURES / "synthetic-multi" / "rank0.kvdump", FIXTURES / "synthetic-multi" / "rank1.kvdump"],
    "h200-twoproc": [FIXTURES / "h200-twoproc" / "procA.kvdump", FIXTURES / "h200-twoproc" / "procB.kvdump"],
}
PARTITIONS = ("run", "device")


@pytest.fixture(scope="module", params=[(case, fmt) for case in MULTI for fmt in ("arrow", "parquet")],
                ids=lambda p: f"{p[0]}-{p[1]}")
def output(request, tmp_path_factory):
    case, fmt = request.param
    out = tmp_path_factory.mktemp("ds") / "tables"
    r = run_cli("arrow", *MULTI[case], "-o", out, "--format", fmt, "-q")
    assert r.returncode == 0, r.stderr
    return out, fmt


def _files(table_dir, fmt):
    return sorted(table_dir.rglob("*.parquet" if fmt == "parquet" else "*.arrow"))


def _file_schema(f, fmt):
    s = pq.read_schema(f) if fmt == "parquet" else pa.ipc.open_file(f).schema
    return s.remove_metadata()


def _tables(out):
    return sorted(p for p in out.iterdir() if p.is_dir())


def test_schemas_unique_stable_and_apart_from_partitions(output):
    out, fmt = output
    tables = _tables(out)
    assert {t.name for t in tables} >= {"device_event", "graph_node", "kernel", "matches", "metadata"}
    for t in tables:
        files = _files(t, fmt)
        runs = {f.relative_to(t).parts[0] for f in files}
        if t.name in ("device_event", "matches", "graph_node"):
            assert len(runs) == 2, (t.name, runs)  # both dumps: a real multi-dump dataset
        schemas = [_file_schema(f, fmt) for f in files]
        for f, s in zip(files, schemas):
            dup = [n for n, k in Counter(s.names).items() if k > 1]
            assert not dup, f"{f}: duplicate columns {dup}"
            assert not set(s.names) & set(PARTITIONS), f"{f}: a file column repeats a partition column"
        assert all(s.equals(schemas[0]) for s in schemas), f"{t.name}: schemas differ between partitions"


def _rows(t, fmt) -> int:
    if fmt == "parquet":
        return sum(pq.ParquetFile(f).metadata.num_rows for f in _files(t, fmt))
    return sum(pa.ipc.open_file(f).read_all().num_rows for f in _files(t, fmt))


def test_pyarrow_reads_every_table_as_a_hive_dataset(output):
    out, fmt = output
    for t in _tables(out):
        tab = ds.dataset(t, format="parquet" if fmt == "parquet" else "ipc", partitioning="hive").to_table()
        assert tab.num_rows == _rows(t, fmt)
        assert len(set(tab.column_names)) == len(tab.column_names)
        assert {"run", "device"} <= set(tab.column_names)
        if fmt == "parquet":
            assert pq.read_table(t).num_rows == tab.num_rows  # hive partitioning by default


def test_polars_reads_every_table(output):
    pl = pytest.importorskip("polars")
    out, fmt = output
    for t in _tables(out):
        pattern = f"{t}/**/*.{'parquet' if fmt == 'parquet' else 'arrow'}"
        scan = pl.scan_parquet if fmt == "parquet" else pl.scan_ipc
        df = scan(pattern, hive_partitioning=True).collect()
        assert df.height == _rows(t, fmt), t.name
        assert {"run", "device"} <= set(df.columns)
        assert sorted(df["run"].unique().to_list()) == sorted({f.relative_to(t).parts[0][4:]
                                                               for f in _files(t, fmt)})


def test_duckdb_reads_every_table(output):
    duckdb = pytest.importorskip("duckdb")
    out, fmt = output
    con = duckdb.connect()
    for t in _tables(out):
        if fmt == "parquet":
            q = f"select count(*), count(distinct run) from read_parquet('{t}/**/*.parquet', hive_partitioning=true)"
            n, runs = con.execute(q).fetchone()
        else:
            # DuckDB has no reader of its own for Arrow IPC files here: it scans the pyarrow dataset
            dset = ds.dataset(t, format="ipc", partitioning="hive")  # noqa: F841 - found by name in the query
            n, runs = con.execute("select count(*), count(distinct run) from dset").fetchone()
        assert n == _rows(t, fmt), t.name
        assert runs == len({f.relative_to(t).parts[0] for f in _files(t, fmt)})


def test_reserved_file_reads_back_and_gives_back_what_it_did_not_fill(tmp_path):
    """A table file reserved on the disk before its first write (kvconv.emit.arrow._reserve: the device_event
    table) is appended to from byte 0, reads back whole, and keeps no reserved block past its end once closed."""
    import numpy as np

    from kvconv.emit import arrow
    from kvconv.emit.options import EmitOptions

    schema = pa.schema([pa.field("context_id", pa.uint32()), pa.field("v", pa.uint64())])
    path = tmp_path / "t" / "part.arrow"
    s = arrow._Sink(pa, tmp_path, path, schema, EmitOptions(), expect=arrow.RESERVE_FROM)
    if not s.reserved:
        s.close()
        pytest.skip("no fallocate on this file system")
    assert path.stat().st_size == 0 and path.stat().st_blocks * 512 >= arrow.RESERVE_FROM  # reserved, size kept
    v = np.arange(1000, dtype=np.uint64)
    s.write({"context_id": np.zeros(1000, np.uint32), "v": v})
    s.close()
    st = path.stat()
    assert st.st_blocks * 512 < st.st_size + (64 << 10), "the reserved blocks past the end were not given back"
    t = pa.ipc.open_file(str(path)).read_all()
    assert t.column("v").to_numpy().tolist() == v.tolist()
