"""The GPU benchmarks' summary tables (one printer, bench/_table.py) read as the logs of docs/results/ printed them:
each JSON result committed beside a log, tabled again, gives the log's header and rows to the byte (the logs were
written by each script's own printer before they shared one)."""

from __future__ import annotations

import io
import json

import pytest

from conftest import ROOT, load_script

BENCH = ROOT / "bench"
RESULTS = ROOT / "docs" / "results"  # the results archive (docs/results/INDEX.md)

CASES = [  # (script, committed JSON, its key holding the script's table input (None: all of it), committed log)
    ("gpu_tracer_cost", "tracer-cost-2026-11-30/gpu_tracer_cost.h200.json", "table",
     "tracer-cost-2026-11-30/gpu_tracer_cost.h200.log"),
    ("gpu_tracer_cost", "tracer-cost-2026-11-30/gpu_tracer_cost.h200-timerfix.json", "table",
     "tracer-cost-2026-11-30/gpu_tracer_cost.h200-timerfix.log"),
    ("gpu_overhead", "tracer-overhead-2026-11-29/gpu_overhead.h200.json", None,
     "tracer-overhead-2026-11-29/gpu_overhead.h200.log"),
    ("gpu_tracer_cost", "write-patch-2026-12-01/lease-5.json", "table",
     "write-patch-2026-12-01/lease-5.log"),  # docs/results/write-patch-2026-12-01/NOTES.md's table of the write patch
    ("gpu_tracer_cost", "node-time-2026-12-02/cost-lease23.json", "table",
     "node-time-2026-12-02/cost-lease23.log"),  # node-time-2026-12-02/NOTES.md's last table of a traced node's time
    ("gpu_tracer_cost", "tracer-1040-2026-12-05/lease-a.json", "table",
     "tracer-1040-2026-12-05/lease-a.log"),  # tracer-1040-2026-12-05/NOTES.md's issue 42 table (the 1,040-node shape)
    ("gpu_tracer_cost", "tracer-1040-2026-12-05/lease-b.json", "table",
     "tracer-1040-2026-12-05/lease-b.log"),  # the same on a second machine
]


@pytest.mark.parametrize("script, result, key, log", CASES, ids=[c[1].split("/")[-1] for c in CASES])
def test_table_reads_as_the_committed_log(monkeypatch, script, result, key, log):
    monkeypatch.syspath_prepend(str(BENCH))  # the scripts import _table and _timing from beside them
    mod = load_script(BENCH / f"{script}.py")
    from _table import print_table

    out = io.StringIO()
    data = json.loads((RESULTS / result).read_text())
    print_table(mod.COLUMNS, mod.table_rows(data[key] if key else data), file=out)
    header, *rows = out.getvalue().splitlines()
    logged = (RESULTS / log).read_text().splitlines()
    at = logged.index(header)  # ValueError: the header is not the logged one
    assert rows and sorted(rows) == sorted(logged[at + 1 : at + 1 + len(rows)])  # the JSON's keys are sorted
