"""``kvconv canary DUMP [--json]``: pages changed outside the expected set, and expected pages that did not change.

The canary part of the dump's one verdict (kvconv.check.verdict.part: the canary's findings and the dump's own state,
judged as kvconv validate judges the whole; the exit status from schemas/codes.json ``verdicts``; docs/CANARY.md):
0 when canary records were checked and every one is clean; 1 when any page was written unexpectedly, an expected page
did not change, or a canary record is damaged; 2 when the dump cannot be read; 4 when there was nothing to check (no
canary record in the dump): nothing checked is not a pass; 5 when the records checked are clean but the producer did
not finish (a live dump: what it had not published is unknown). Kernel names demangled in the text.
"""

from __future__ import annotations

from pathlib import Path

import typer

from kvconv.cli.common import JSON, PROGRESS, QUIET, SALVAGE
from kvconv.format.errors import KvconvError

app = typer.Typer()

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
) -> None:
    """Check the location canary: per step and buffer, pages changed outside the expected set (aliasing or external
    writes) and expected pages that did not change (missing writes), with page and slot ranges; and, where the probe
    recorded value digests, the value canary (slots written with data other than the engine's rows). Exit 0 clean, 1
    findings, 2 unreadable, 4 nothing to check (no canary records; docs/CANARY.md says how to record them).

    Example: kvconv canary run.kvdump --json
    """
    import dataclasses

    import kvconv
    from kvconv.cli.common import Outcome, finish, verdict_warnings
    from kvconv.progress import Progress, ProgressOptions
    from kvconv.run import RunOptions

    run = kvconv.open(dump_path, whole_run=False, options=RunOptions(salvage=salvage, missing_writes=not no_missing))
    dr = run.dumps[0]
    try:
        with Progress(f"canary {dump_path.name}", total=0, size_bytes=None,
                      options=ProgressOptions.from_cli(progress=progress, quiet=quiet or as_json)):
            # the probe's value digests are the canary's too: a location canary that is clean beside a wrong value
            # is not an ok (paged-stale-k said ok, exit 0, validate FAILED)
            part = dr.part("writes") if writes else dr.part("canary", "values")
    except KvconvError as e:
        run.close()  # closed on every path (finish exits)
        if as_json:
            finish("canary", [Outcome(str(dump_path), e.exit_code, error=e)], as_json=True)
        raise
    if writes:
        from kvconv.cli.canary_writes import writes_text

        result, text = part.results["writes"].to_dict(), writes_text(part, all_findings=all_steps, quiet=quiet)
    else:  # the JSON streamed a step at a time (the same bytes as its to_dict())
        res = dataclasses.replace(part.results["canary"], findings=part.findings)
        result, text = res.write_json, _text(res, part, all_steps=all_steps, quiet=quiet)
    if part.verdict == "ok":  # this part is clean: say so when the dump's one verdict is not (a wrong value, say)
        verdict_warnings(run, done="this part is clean")
    run.close()
    finish("canary", [Outcome(str(dump_path), part.exit_code, result, text=text)], as_json=as_json)


def _text(res, part, *, all_steps: bool, quiet: bool = False) -> str:
    """The text: the summary and the flagged steps (not with -q), one line per incident (as validate's; every
    finding with --all), the verdict line."""
    from kvconv.check import verdict
    from kvconv.names import demangle_text
    from kvconv.wording import counted

    s = res.summary()
    lines = []
    if not quiet:
        lines.append(f"{res.path}: {counted(s['records'], 'canary record')}, {counted(s['steps_checked'], 'step')} "
                     f"checked: {counted(s['unexpected_pages'], 'unexpected page')} in "
                     f"{counted(s['steps_with_unexpected'], 'step')}, {counted(s['missing_pages'], 'missing page')} "
                     f"in {counted(s['steps_with_missing'], 'step')}")
        for st in (res.steps if all_steps else res.steps.flagged()):
            lines.append(f"  context {st['context_id']} step {st['step']} buffer {st['buffer']!r} (id "
                         f"{st['buffer_id']}): expected {len(st['expected'])} changed {len(st['changed'])} excluded "
                         f"{len(st['excluded'])}: unexpected {_pages(st['unexpected'])} missing "
                         f"{_pages(st['missing'])}")
    found = [f.line() for f in part.findings] if all_steps else [verdict.line(i) for i in part.incidents]
    lines += [demangle_text(ln) for ln in found]
    lines.append(verdict.part_line(part.verdict, nothing="no canary records; see docs/CANARY.md"))
    return "\n".join(lines)


def _pages(pages: list[int]) -> str:
    from kvconv.check.canary import runs

    if not pages:
        return "[]"
    return "[" + ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs(pages)) + "]"
