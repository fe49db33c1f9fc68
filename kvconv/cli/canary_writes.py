"""``kvconv canary --writes DUMP [--json]``: the write-address canary (kvconv.check.canary.writes; docs/CANARY.md).

Exit status as for the page canary: 0 clean, 1 findings, 2 unreadable dump, 4 nothing to check (no slot_write records
or no recorded step).
"""

from __future__ import annotations

from pathlib import Path

import typer


def run_writes(dump_path: Path, opts, *, as_json: bool) -> int:
    from kvconv.check.canary import writes
    from kvconv.cli.common import Outcome, finish, open_or_finish

    with open_or_finish("canary", dump_path, opts, as_json=as_json) as d:
        res = writes.check(d, path=str(dump_path))
    code = writes.EXIT_CODES[res.verdict]
    finish("canary", [Outcome(str(dump_path), code, res.to_dict(), text=writes.report_text(res))], as_json=as_json)
    raise typer.Exit(code)  # pragma: no cover - finish exits
