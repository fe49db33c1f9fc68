"""``Run.table`` is the table ``kvconv arrow`` writes, built in memory from the run's open dumps by the Arrow
writer's own code (kvconv/emit/_tables.py): the same names (``Run.tables``), columns, rows, row order and schema
metadata as a Hive-partitioned read of the written dataset, for one dump, two ranks, a dump with canary records,
one with write-address records, and one engine run's processes (one of them drawing no context)."""

from __future__ import annotations

import pyarrow.dataset as ds
import pytest

import kvconv
from conftest import FIXTURES

CASES = {
    "one": ["qwen3-14b/qwen3-14b.kvdump"],
    "two-ranks": ["synthetic-multi/rank0.kvdump", "synthetic-multi/rank1.kvdump"],
    "canary": ["canary-clean/canary-clean.kvdump"],
    "writes": ["writes-stale-pad/writes-stale-pad.kvdump"],
    "processes": ["h200-engine-procs/range-profiler.kvdump.zst", "h200-engine-procs/range-profiler.pid959.kvdump.zst"],
}


@pytest.mark.parametrize("case", CASES)
def test_run_tables_are_the_written_datasets(case, tmp_path):
    with kvconv.open([FIXTURES / p for p in CASES[case]]) as run:
        run.to_arrow(tmp_path / "t")
        written = sorted(p.name for p in (tmp_path / "t").iterdir() if p.is_dir())
        assert run.tables == written
        for name in written:
            got = run.table(name)
            want = ds.dataset(tmp_path / "t" / name, format="arrow", partitioning="hive").to_table()
            assert got.schema.names == want.schema.names, name
            assert got.schema.metadata == want.schema.metadata, name
            assert got.to_pylist() == want.to_pylist(), name
