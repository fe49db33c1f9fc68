"""``kvconv canary --writes DUMP [--json]``: the write-address canary (kvconv.check.canary.writes; docs/CANARY.md).

Exit status as for the page canary (the canary part of the dump's verdict, kvconv.check.verdict.part): 0 clean, 1
findings, 2 unreadable dump, 4 nothing to check (no slot_write records or no recorded step), 5 clean but the producer
did not finish. The text leads with incidents, as kvconv validate's (findings of one cause on one line: one stale
page-table entry in a 40-layer capture is one line "in 80 of 80 caches", not 160); --all and --json keep every
finding. Kernel names demangled in the text, kept as they are in --json.
"""

from __future__ import annotations

from pathlib import Path

import typer


def run_writes(dump_path: Path, opts, *, as_json: bool, all_findings: bool = False, quiet: bool = False) -> int:
    from kvconv.check import verdict
    from kvconv.check.canary import writes
    from kvconv.cli.canary import _LAST_LINE, part_verdict
    from kvconv.cli.common import Outcome, finish, open_or_finish
    from kvconv.names import demangle_text

    with open_or_finish("canary", dump_path, opts, as_json=as_json) as d:
        res = writes.check(d, path=str(dump_path))
        v = part_verdict(d, res, checked=bool(res.summary.get("records") and res.summary.get("steps")))
        lines = writes.report_text(res).splitlines()  # the summary, every finding, the verdict
        if not all_findings and not as_json:  # one line per incident (the findings of one cause: verdict.incidents)
            lines[1:-1] = [verdict.line(i) for i in verdict.incidents(d, res.findings)]
    code = verdict.EXIT_CODES[v]
    if v != res.verdict:  # the dump's own state decides (incomplete): the last line says so
        lines[-1] = _LAST_LINE[v]
    if quiet:  # -q: the findings and the verdict, not the summary line
        lines = lines[1:]
    text = "\n".join(demangle_text(x) for x in lines)
    if v == "ok":  # this part is clean: say so when the dump's one verdict is not (a wrong value, say)
        from kvconv.cli.emit import verdict_warnings

        verdict_warnings([dump_path], salvage=opts.salvage, done="this part is clean")
    finish("canary", [Outcome(str(dump_path), code, res.to_dict(), text=text)], as_json=as_json)
    raise typer.Exit(code)  # pragma: no cover - finish exits
