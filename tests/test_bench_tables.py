"""The GPU benchmarks' summary tables (one printer, bench/_table.py) read as the committed H200 logs printed them:
each JSON result committed beside a log, tabled again, gives the log's header and rows to the byte (the logs were
written by each script's own printer before they shared one)."""

from __future__ import annotations

import io
import json

import pytest

from conftest import ROOT, load_script

BENCH = ROOT / "bench"

CASES = [  # (script, committed JSON, its key holding the script's table input (None: all of it), committed log)
    ("gpu_tracer_cost", "gpu_tracer_cost.h200.json", "table", "gpu_tracer_cost.h200.log"),
    ("gpu_tracer_cost", "gpu_tracer_cost.h200-timerfix.json", "table", "gpu_tracer_cost.h200-timerfix.log"),
    ("gpu_overhead", "gpu_overhead.h200.json", None, "gpu_overhead.h200.log"),
    ("gpu_tracer_cost", "issue16/lease-5.json", "table", "issue16/lease-5.log"),  # docs/TRACER.md's issue-16 table
    ("gpu_tracer_cost", "issue31/cost-lease23.json", "table", "issue31/cost-lease23.log"),  # issue 31's last table
]


@pytest.mark.parametrize("script, result, key, log", CASES, ids=[c[1] for c in CASES])
def test_table_reads_as_the_committed_log(monkeypatch, script, result, key, log):
    monkeypatch.syspath_prepend(str(BENCH))  # the scripts import _table and _timing from beside them
    mod = load_script(BENCH / f"{script}.py")
    from _table import print_table

    out = io.StringIO()
    data = json.loads((BENCH / result).read_text())
    print_table(mod.COLUMNS, mod.table_rows(data[key] if key else data), file=out)
    header, *rows = out.getvalue().splitlines()
    logged = (BENCH / log).read_text().splitlines()
    at = logged.index(header)  # ValueError: the header is not the logged one
    assert rows and sorted(rows) == sorted(logged[at + 1 : at + 1 + len(rows)])  # the JSON's keys are sorted
