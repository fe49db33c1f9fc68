"""``kvconv canary DUMP [--json]``: pages changed outside the expected set, and expected pages that did not change.

The canary part of the dump's one verdict (kvconv.check.verdict.part: the canary's findings and the dump's own state,
judged as kvconv validate judges the whole; the exit status from schemas/codes.json ``verdicts``; docs/CANARY.md):
0 when canary records were checked and every one is clean; 1 when any page was written unexpectedly, an expected page
did not change, or a canary record is damaged; 2 when the dump cannot be read; 4 when there was nothing to check (no
canary record in the dump): nothing checked is not a pass; 5 when the records checked are clean but the producer did
not finish (a live dump: what it had not published is unknown). Kernel names demangled in the text.
"""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from kvconv.cli.common import JSON, PROGRESS, QUIET, SALVAGE

app = typer.Typer()

_LAST_LINE = {"ok": "ok", "failed": "FAILED",
              "nothing-checked": "NOTHING CHECKED (no canary records; see docs/CANARY.md)",
              "incomplete": "INCOMPLETE (the producer did not finish: the records it published are clean, the rest "
                            "unknown)"}


def part_verdict(d, res, *, checked: bool) -> str:
    """The canary part of the dump's verdict: the check's findings with the dump's own (structure, producer state)."""
    from kvconv.check import verdict

    return verdict.part(list(d.problems) + list(res.findings), checked=checked)


@app.command("canary")
def canary_cmd(
    dump_path: Path = typer.Argument(..., metavar="DUMP", readable=False, help="a kvconv dump holding canary records"),
    as_json: bool = JSON,
    all_steps: bool = typer.Option(False, "--all", help="list every step and buffer, not only those with findings "
                                   "(--writes: every finding, not only one line per incident)"),
    no_missing: bool = typer.Option(False, "--no-missing",
                                    help="do not report expected pages that did not change (mechanism iii)"),
    writes: bool = typer.Option(False, "--writes", help="check the write-address canary instead: the KV slots each "
                                "block wrote (kvconv record --writes) against each step's slot mapping"),
    salvage: bool = SALVAGE,
    progress: bool | None = PROGRESS,
    quiet: bool = QUIET,
) -> int:
    """Check the location canary: per step and buffer, pages changed outside the expected set (aliasing or external
    writes) and expected pages that did not change (missing writes), with page and slot ranges; and, where the probe
    recorded value digests, the value canary (slots written with data other than the engine's rows). Exit 0 clean, 1
    findings, 2 unreadable, 4 nothing to check (no canary records; docs/CANARY.md says how to record them).

    Example: kvconv canary run.kvdump --json
    """
    from kvconv.check import canary, verdict
    from kvconv.check.canary import value
    from kvconv.cli.common import Outcome, finish, open_or_finish
    from kvconv.format import dump
    from kvconv.progress import Progress, ProgressOptions

    opts = dump.ReadOptions(salvage=salvage)
    out = sys.stdout
    if writes:
        from kvconv.cli.canary_writes import run_writes

        return run_writes(dump_path, opts, as_json=as_json, all_findings=all_steps, quiet=quiet)
    with open_or_finish("canary", dump_path, opts, as_json=as_json) as d:
        with Progress(f"canary {dump_path.name}", total=0, size_bytes=d.size,
                      options=ProgressOptions.from_cli(progress=progress, quiet=quiet)) as bar:
            res = canary.check(d, options=canary.CanaryOptions(missing_writes=not no_missing), progress=bar.update)
        # the probe's value digests are the canary's too (kvconv validate judges both): a location canary that is
        # clean beside a wrong value is not an ok (paged-stale-k said ok, exit 0, validate FAILED)
        values = value.check(d, path=str(dump_path)) if d.groups_of("value_digest") else None
        if values is not None:
            res.findings.extend(values.findings)
        checked = bool(res.counts["steps_checked"]) or bool(values and values.summary["steps"])
        v = part_verdict(d, res, checked=checked)
        code = verdict.EXIT_CODES[v]
        if as_json:  # the envelope; the result streamed a step at a time (the same bytes as its to_dict())
            finish("canary", [Outcome(str(dump_path), code, res.write_json)], as_json=True)
        lines = None if all_steps else [verdict.line(i) for i in verdict.incidents(d, res.findings, canary_res=res)]
        _report(res, out, all_steps=all_steps, state=v, quiet=quiet, lines=lines)
    out.flush()
    if v == "ok":  # this part is clean: say so when the dump's one verdict is not (a live slot handed out twice)
        from kvconv.cli.emit import verdict_warnings

        verdict_warnings([dump_path], salvage=salvage, done="this part is clean")
    if code:
        raise typer.Exit(code)
    return 0


def _report(res, out, *, all_steps: bool, state: str, quiet: bool = False, lines: list[str] | None = None) -> None:
    """The text: the summary and the flagged steps (not with -q), one line per incident (``lines``, as validate's;
    every finding with --all), the verdict line."""
    s = res.summary()
    from kvconv.names import demangle_text
    from kvconv.wording import counted

    found = lines if lines is not None else [f.line() for f in res.findings]
    if quiet:
        for ln in found:
            out.write(demangle_text(ln) + "\n")
        out.write(_LAST_LINE[state] + "\n")
        return
    out.write(f"{res.path}: {counted(s['records'], 'canary record')}, {counted(s['steps_checked'], 'step')} checked: "
              f"{counted(s['unexpected_pages'], 'unexpected page')} in {counted(s['steps_with_unexpected'], 'step')}, "
              f"{counted(s['missing_pages'], 'missing page')} in {counted(s['steps_with_missing'], 'step')}\n")
    for st in (res.steps if all_steps else res.steps.flagged()):
        out.write(f"  context {st['context_id']} step {st['step']} buffer {st['buffer']!r} (id {st['buffer_id']}): "
                  f"expected {len(st['expected'])} changed {len(st['changed'])} excluded "
                  f"{len(st['excluded'])}: unexpected {_pages(st['unexpected'])} missing "
                  f"{_pages(st['missing'])}\n")
    for ln in found:
        out.write(demangle_text(ln) + "\n")
    out.write(_LAST_LINE[state] + "\n")


def _pages(pages: list[int]) -> str:
    from kvconv.check.canary import runs

    if not pages:
        return "[]"
    return "[" + ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs(pages)) + "]"
