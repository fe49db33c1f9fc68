"""``kvconv reconcile DUMP... [--json] [--join auto|exact|ordered]``: host records x expected executions x device
events.

    $ kvconv reconcile fixtures/qwen3-14b/qwen3-14b.kvdump
    ...
      280 graph-node records = 280 expected executions = 280 device events, 0 drops

Exit status: 0 when everything agrees, 1 when the reconciler reports an error (missing, extra or duplicated blocks,
unmatched events, duplicated host records), 2 when a dump cannot be read or the options do not fit. Blocks of
launches that ran before coverage began (ordered join, 0 device drops: code coverage-late) are a warning unless
--strict-coverage.
The JSON output follows schemas/reconcile.schema.json (one dump: the report itself; several: {"ok", "dumps": [...]}).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import List

import typer


def reconcile_cmd(
    dump_paths: List[Path] = typer.Argument(..., metavar="DUMP...", help="kvconv dumps to reconcile"),
    as_json: bool = typer.Option(False, "--json", help="print the report as JSON (schemas/reconcile.schema.json)"),
    join: str = typer.Option("auto", "--join", metavar="auto|exact|ordered",
                             help="exact: by device gridid + tag; ordered: by sequence order (assumes one stream); "
                                  "auto: exact when device events carry gridid"),
    relaxed: bool = typer.Option(False, "--relaxed", help="report mismatches as warnings (exit 0)"),
    strict_coverage: bool = typer.Option(False, "--strict-coverage",
                                         help="treat blocks of launches that ran before coverage began (ordered "
                                              "join, 0 drops) as errors, not warnings"),
    salvage: bool = typer.Option(False, "--salvage", help="read a dump cut short up to its last whole record"),
) -> int:
    """Match host graph-node and eager launch records to the blocks their geometry predicts and to the device
    events: per launch the missing / extra blocks, per graph executable its nodes, replays, order and device timing,
    and the agreement line "N graph-node records = N expected executions = N device events, 0 drops".

    Example: kvconv reconcile run.kvdump --json
    """
    from . import dump, reconcile

    opts = reconcile.ReconcileOptions(join=join, relaxed=relaxed, strict_coverage=strict_coverage)
    results = []
    for p in dump_paths:
        with dump.open(p, options=dump.ReadOptions(salvage=salvage)) as d:
            results.append(reconcile.reconcile(d, options=opts))
    ok = all(r.ok for r in results)
    out = sys.stdout
    if as_json:
        obj = results[0].to_dict() if len(results) == 1 else {"ok": ok, "dumps": [r.to_dict() for r in results]}
        out.write(json.dumps(obj, indent=2, sort_keys=True) + "\n")
    else:
        for r in results:
            for line in r.lines():
                out.write(line + "\n")
            for f in r.findings:
                out.write(f.line() + "\n")
        errors = sum(1 for r in results for f in r.findings if f.severity == "error")
        out.write("ok\n" if ok else f"FAILED ({errors} error finding{'s' if errors != 1 else ''})\n")
    out.flush()
    if not ok:
        raise typer.Exit(1)
    return 0


def register(app: typer.Typer) -> None:
    app.command("reconcile")(reconcile_cmd)
