"""``kvconv canary DUMP [--json]``: pages changed outside the expected set, and expected pages that did not change.

Exit status: 0 when every canary record is clean, 1 when any page was written unexpectedly, an expected page did not
change, or a canary record is damaged; 2 when the dump cannot be read.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer


def canary_cmd(
    dump_path: Path = typer.Argument(..., metavar="DUMP", help="a kvconv dump holding canary records"),
    as_json: bool = typer.Option(False, "--json", help="print the result as JSON (schemas/canary.schema.json)"),
    all_steps: bool = typer.Option(False, "--all", help="list every step and buffer, not only those with findings"),
    no_missing: bool = typer.Option(False, "--no-missing",
                                    help="do not report expected pages that did not change (mechanism iii)"),
    salvage: bool = typer.Option(False, "--salvage", help="read a dump cut short up to its last whole record"),
) -> int:
    """Check the location canary: per step and buffer, pages changed outside the expected set (aliasing or external
    writes) and expected pages that did not change (missing writes), with page and slot ranges.

    Example: kvconv canary run.kvdump --json
    """
    from . import canary, dump

    opts = dump.ReadOptions(salvage=salvage)
    with dump.open(dump_path, options=opts) as d:
        res = canary.check(d, options=canary.CanaryOptions(missing_writes=not no_missing))
    out = sys.stdout
    if as_json:
        out.write(json.dumps(res.to_dict(), indent=2, sort_keys=True) + "\n")
    else:
        s = res.summary()
        out.write(f"{res.path}: {s['records']} canary records, {s['steps_checked']} steps checked: "
                  f"{s['unexpected_pages']} unexpected pages in {s['steps_with_unexpected']} steps, "
                  f"{s['missing_pages']} missing pages in {s['steps_with_missing']} steps\n")
        for st in res.steps:
            if not (all_steps or st["unexpected"] or st["missing"]):
                continue
            out.write(f"  context {st['context_id']} step {st['step']} buffer {st['buffer']!r} (id {st['buffer_id']}): "
                      f"expected {len(st['expected'])} changed {len(st['changed'])} excluded "
                      f"{len(st['excluded'])}: unexpected {_pages(st['unexpected'])} missing "
                      f"{_pages(st['missing'])}\n")
        for f in res.findings:
            out.write(f.line() + "\n")
        out.write("ok\n" if res.ok else "FAILED\n")
    out.flush()
    code = 0 if res.ok else 1
    if code:
        raise typer.Exit(code)
    return 0


def _pages(pages: list[int]) -> str:
    from .canary import runs

    if not pages:
        return "[]"
    return "[" + ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs(pages)) + "]"


def register(app: typer.Typer) -> None:
    app.command("canary")(canary_cmd)
