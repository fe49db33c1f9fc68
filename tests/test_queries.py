"""docs/QUERIES.md, run: each DuckDB query on the Qwen3-14B demo's Parquet tables (written through the real CLI) gives
the table printed under it; each Perfetto SQL query gives the same table in trace processor, where
a binary is at hand (KVCONV_TRACE_PROCESSOR or ../shared/tools/trace_processor_shell; skipped elsewhere, with the
reason)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import NO_TRACE_PROCESSOR, ROOT, run_cli, trace_processor, trace_processor_bin

DOC = ROOT / "docs" / "QUERIES.md"
DUMP = ROOT / "fixtures/qwen3-14b/qwen3-14b.kvdump"


def doc_queries() -> dict[str, dict]:
    """name -> {"perfetto": SQL, "duckdb": SQL, "rows": the Markdown table's rows after the name's last block}."""
    text = DOC.read_text()
    out: dict[str, dict] = {}
    for m in re.finditer(r"<!-- (perfetto|duckdb): (\S+) -->\n```sql\n(.*?)```\n(.*?)(?=<!-- |\Z)", text, re.S):
        q = out.setdefault(m.group(2), {})
        q[m.group(1)] = m.group(3)
        rows = [[c.strip() for c in line.strip().strip("|").split("|")]
                for line in m.group(4).splitlines() if line.startswith("|")]
        if rows:
            q["rows"] = rows[2:]
    return out


def fmt(v) -> str:
    return f"{v:.2f}".rstrip("0").rstrip(".") + (".0" if float(v).is_integer() else "") \
        if isinstance(v, float) else str(v)


@pytest.fixture(scope="module")
def tables(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("q") / "tables"
    r = run_cli("arrow", DUMP, "-o", out, "--format", "parquet", "-q")
    assert r.returncode == 0, r.stderr
    return out


def test_the_page_asks_the_five_questions():
    q = doc_queries()
    assert {"span", "slowest", "per_node", "per_sm", "missing"} <= set(q)
    for name in ("span", "slowest", "per_node", "per_sm", "missing"):
        assert {"perfetto", "duckdb", "rows"} <= set(q[name]), name


def test_duckdb_on_the_arrow_tables(tables):
    duckdb = pytest.importorskip("duckdb")
    con = duckdb.connect()
    for name, q in doc_queries().items():
        got = None
        for stmt in [s for s in q["duckdb"].replace("'tables/", f"'{tables}/").split(";") if s.strip()]:
            rel = con.sql(stmt)
            got = rel.fetchall() if rel is not None else got
        if "rows" in q:
            assert [[fmt(v) for v in row] for row in got] == q["rows"], name


def test_perfetto_sql_in_trace_processor(tmp_path):
    if not trace_processor_bin():
        pytest.skip(NO_TRACE_PROCESSOR)
    trace = tmp_path / "qwen3-14b.pftrace"
    assert run_cli("perfetto", DUMP, "-o", trace, "-q").returncode == 0
    with trace_processor(trace) as tp:
        for name, q in doc_queries().items():
            if "perfetto" in q and "rows" in q:
                df = tp.query(q["perfetto"]).as_pandas_dataframe()
                got = [[fmt(v.item() if hasattr(v, "item") else v) for v in row] for row in df.itertuples(index=False)]
                assert got == q["rows"], name
