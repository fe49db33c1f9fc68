"""docs/DATASETS.md, run: a multi-run Parquet dataset built from the fixtures through the real CLI (h200-tp2's two
ranks, then h200-single and qwen3-14b with --append), each query of the page run with DuckDB and compared to the table
printed under it, and the same answers computed again with pyarrow.dataset + pyarrow.compute. --append refusals leave
the dataset byte for byte as it was."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pytest

from conftest import ROOT, run_cli

duckdb = pytest.importorskip("duckdb")
DOC = ROOT / "docs" / "DATASETS.md"
F = ROOT / "fixtures"


def doc_queries(doc: Path) -> dict[str, tuple[str, list[list[str]]]]:
    """name -> (SQL of the block after ``<!-- query: name -->``, rows of the Markdown table after it, if any)."""
    out = {}
    for m in re.finditer(r"<!-- query: (\S+) -->\n```sql\n(.*?)```\n(.*?)(?=<!-- query:|\Z)", doc.read_text(), re.S):
        rows = [[c.strip() for c in line.strip().strip("|").split("|")]
                for line in m.group(3).splitlines() if line.startswith("|")]
        out[m.group(1)] = (m.group(2), rows[2:])  # header and rule left out
    return out


def fmt(v) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("ds") / "dataset"
    r = run_cli("arrow", F / "h200-tp2/rank0.kvdump", F / "h200-tp2/rank1.kvdump", "-o", d, "--format", "parquet",
                "-q")
    assert r.returncode == 0, r.stderr
    before = digest(d)
    r = run_cli("arrow", F / "h200-single/single.kvdump", F / "qwen3-14b/qwen3-14b.kvdump", "-o", d, "--format",
                "parquet", "--append", "-q")
    assert r.returncode == 0, r.stderr
    after = digest(d)
    assert all(after[f] == h for f, h in before.items() if f != ".kvconv-output.json")  # the old runs untouched
    assert {f.split("/")[1] for f in after if "/" in f} == {"run=rank0", "run=rank1", "run=single", "run=qwen3-14b"}
    assert not [p for p in d.parent.iterdir() if p.name != "dataset"]  # no staging folder left behind
    return d


def test_refused_appends_change_nothing(dataset):
    before = digest(dataset)
    r = run_cli("arrow", F / "h200-tp1/rank0.kvdump", "-o", dataset, "--format", "parquet", "--append", "-q")
    assert r.returncode == 1 and r.stderr.count("\n") == 1
    assert "the dataset already holds clock_sync/run=rank0" in r.stderr
    r = run_cli("arrow", F / "h200-twoproc/procA.kvdump", "-o", dataset, "--append", "-q")  # arrow IPC, not parquet
    assert r.returncode == 1 and "the dataset's files are .parquet, the new ones .arrow" in r.stderr
    assert digest(dataset) == before
    assert not [p for p in dataset.parent.iterdir() if p.name != "dataset"]


def test_a_new_run_appends_and_reads_with_every_run(dataset, tmp_path):
    grown = tmp_path / "grown"
    r = run_cli("arrow", F / "h200-tp2/rank0.kvdump", "-o", grown, "--format", "parquet", "-q")
    assert r.returncode == 0
    r = run_cli("arrow", F / "h200-twoproc/procA.kvdump", "-o", grown, "--format", "parquet", "--append", "-q")
    assert r.returncode == 0, r.stderr
    t = ds.dataset(grown / "device_event", format="parquet", partitioning="hive").to_table()
    assert sorted(set(t.column("run").to_pylist())) == ["procA", "rank0"] and t.num_rows == 2 * 1760


def run_doc(dataset: Path) -> dict[str, list[tuple]]:
    con = duckdb.connect()
    results = {}
    for name, (sql, _) in doc_queries(DOC).items():
        for stmt in [s for s in sql.replace("'dataset/", f"'{dataset}/").split(";") if s.strip()]:
            rel = con.sql(stmt)
            if rel is not None:
                results[name] = rel.fetchall()
    return results


def test_each_query_gives_the_table_printed_under_it(dataset):
    results = run_doc(dataset)
    queries = doc_queries(DOC)
    assert {"views", "replays", "slowest", "skew"} <= set(queries)
    for name, (_, rows) in queries.items():
        if rows:
            assert [[fmt(v) for v in row] for row in results[name]] == rows, name


def _replay_spans(dataset: Path) -> pa.Table:
    """replay_span of the page, computed with pyarrow.dataset and pyarrow.compute (no SQL)."""
    parts = []
    for f in sorted((dataset / "device_event").rglob("*.parquet")):
        rel = f.relative_to(dataset / "device_event")
        ev = ds.dataset(f, format="parquet").to_table(columns=["globaltimer"])
        m = ds.dataset(dataset / "matches" / rel, format="parquet").to_table(columns=["device_index", "replay",
                                                                                        "host_kind"])
        keep = pc.equal(m.column("host_kind"), 6)
        t = pa.table({"replay": pc.filter(m.column("replay"), keep),
                      "ts": pc.take(ev.column("globaltimer"), pc.filter(m.column("device_index"), keep))})
        g = t.group_by("replay").aggregate([("ts", "min"), ("ts", "max")])
        run, device = (p.split("=")[1] for p in rel.parts[:2])
        parts.append(g.append_column("run", pa.array([run] * g.num_rows))
                     .append_column("device", pa.array([int(device)] * g.num_rows)))
    return pa.concat_tables(parts)


def test_pyarrow_dataset_agrees(dataset):
    results = run_doc(dataset)
    spans = _replay_spans(dataset)
    span_ms = {(r["run"], r["replay"]): (r["ts_max"] - r["ts_min"]) / 1e6 for r in spans.to_pylist()}
    per_run = {}
    for (run, _), s in span_ms.items():
        per_run.setdefault(run, []).append(s)
    assert [(run, n, round(lo, 2), round(hi, 2)) for run, _, n, lo, hi in results["replays"]] == \
        [(run, len(v), round(min(v), 2), round(max(v), 2)) for run, v in sorted(per_run.items())]
    slowest = sorted(span_ms.items(), key=lambda kv: -kv[1])[:3]
    assert [(run, replay) for run, replay, _ in results["slowest"]] == [k for k, _ in slowest]
    cs = ds.dataset(dataset / "clock_sync", format="parquet", partitioning="hive").to_table().to_pylist()
    off = {}
    for r in cs:
        off.setdefault(r["run"], []).append(r["host_ns"] - r["gpu_ns"])
    off = {run: sorted(v)[(len(v) - 1) // 2] for run, v in off.items()}  # quantile_disc(0.5): the lower middle
    first = {(r["run"], r["replay"]): r["ts_min"] + off[r["run"]] for r in spans.to_pylist()}
    skew = {rep: (max(first[("rank0", rep)], first[("rank1", rep)]) - min(first[("rank0", rep)],
                                                                            first[("rank1", rep)])) / 1e3
            for rep in sorted({rep for run, rep in first if run == "rank0"})}
    assert [(rep, round(s, 1)) for rep, _, s in results["skew"]] == [(rep, round(s, 1)) for rep, s in skew.items()]
