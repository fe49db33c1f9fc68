"""``kvconv canary --writes DUMP [--json]``: the write-address canary (kvconv.check.canary.writes; docs/CANARY.md).

Exit status as for the page canary (the canary part of the dump's verdict, kvconv.check.verdict.part): 0 clean, 1
findings, 2 unreadable dump, 4 nothing to check (no slot_write records or no recorded step), 5 clean but the producer
did not finish. Kernel names demangled in the text, kept as they are in --json.
"""

from __future__ import annotations

from pathlib import Path

import typer


def run_writes(dump_path: Path, opts, *, as_json: bool) -> int:
    from kvconv.check import verdict
    from kvconv.check.canary import writes
    from kvconv.cli.canary import _LAST_LINE, part_verdict
    from kvconv.cli.common import Outcome, finish, open_or_finish
    from kvconv.names import demangle_text

    with open_or_finish("canary", dump_path, opts, as_json=as_json) as d:
        res = writes.check(d, path=str(dump_path))
        v = part_verdict(d, res, checked=bool(res.summary.get("records") and res.summary.get("steps")))
    code = verdict.EXIT_CODES[v]
    lines = writes.report_text(res).splitlines()
    if v != res.verdict:  # the dump's own state decides (incomplete): the last line says so
        lines[-1] = _LAST_LINE[v]
    text = "\n".join(demangle_text(x) for x in lines)
    finish("canary", [Outcome(str(dump_path), code, res.to_dict(), text=text)], as_json=as_json)
    raise typer.Exit(code)  # pragma: no cover - finish exits
