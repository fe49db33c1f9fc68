"""``kvconv reconcile DUMP... [--json] [--join auto|exact|ordered]``: host records x expected executions x device
events.

    $ kvconv reconcile fixtures/qwen3-14b/qwen3-14b.kvdump
    ...
      280 graph-node records = 280 expected executions = 280 device events, 0 drops

Exit status: 0 when everything agrees, 1 when the reconciler reports an error (missing, extra or duplicated blocks,
unmatched events, duplicated host records), 2 when a dump cannot be read or the options do not fit, 5 when an
unfinished dump's last launches lost blocks at the producer's end (validate's incomplete), 4 when the dump
traced nothing (0 target launches or 0 patched modules: ``coverage-none``, as validate says). Blocks of
launches that ran before coverage began (ordered join, 0 device drops: code coverage-late) are a warning unless
--strict-coverage.
--json prints the envelope every command prints (schemas/cli.schema.json); each dump's result follows
schemas/reconcile.schema.json. With several dumps, the cross-dump replay skew (kvconv.check.skew: each replay's start
and last node on the host clock, against the first dump's) is printed before the status line and is the envelope's
``cross_dump``.
"""

from __future__ import annotations

from pathlib import Path

import typer

from kvconv.cli.common import DUMPS, JSON, PROGRESS, QUIET, RELAXED, SALVAGE

app = typer.Typer()


@app.command("reconcile")
def reconcile_cmd(
    dump_paths: list[Path] = DUMPS,
    as_json: bool = JSON,
    join: str = typer.Option("auto", "--join", metavar="auto|exact|ordered",
                             help="exact: by device gridid + tag; ordered: by sequence order (assumes one stream); "
                                  "auto: exact when device events carry gridid"),
    relaxed: bool = RELAXED,
    strict_coverage: bool = typer.Option(False, "--strict-coverage",
                                         help="treat blocks of launches that ran before coverage began (ordered "
                                              "join, 0 drops) as errors, not warnings"),
    salvage: bool = SALVAGE,
    progress: bool | None = PROGRESS,
    quiet: bool = QUIET,
) -> int:
    """Match host graph-node and eager launch records to the blocks their geometry predicts and to the device
    events: per launch the missing / extra blocks, per graph executable its nodes, replays, order and device timing,
    and the agreement line "N graph-node records = N expected executions = N device events, 0 drops".

    Example: kvconv reconcile run.kvdump --json
    """
    import kvconv
    from kvconv.check import reconcile, skew, verdict
    from kvconv.cli.common import Outcome, each, finish
    from kvconv.progress import Progress, ProgressOptions
    from kvconv.run import RunOptions
    from kvconv.wording import counted

    run = kvconv.open(dump_paths, options=RunOptions(join=join, relaxed=relaxed, strict_coverage=strict_coverage,
                                                     salvage=salvage))
    run.options.reconcile_options()  # a bad --join is refused before any work
    popts = ProgressOptions.from_cli(progress=progress, quiet=quiet or as_json)
    results, reports, nothing = [], [], []

    def one(dr) -> Outcome:
        with Progress(f"reconcile {Path(dr.path).name}", total=0, size_bytes=None, options=popts) as bar:
            dr.progress = bar.update
            r = dr.reconcile(tables=False)  # the report only (no per-event table): memory bounded by the host records
        # a dump that traced nothing agrees trivially (0 = 0 = 0): the verdict's coverage check says so, exit 4
        cov = verdict.coverage(dr.reader, canary_steps=0, write_steps=0)
        dr.close()
        rep, lines = r.to_dict(), r.lines() + [f.line() for f in r.findings]
        if cov is not None:
            rep["findings"].append(cov.to_dict())
            rep["summary"]["warning"] += 1
            lines.append(cov.line())
            nothing.append(dr.path)
        results.append(r)
        reports.append((dr.path, rep))
        from kvconv.names import demangle_text  # kernel names demangled in the text, kept as they are in --json

        code = verdict.EXIT_CODES[verdict.of_reconciliation(r, cov)]
        return Outcome(r.path, code, rep, text="\n".join(demangle_text(x) for x in lines))

    outcomes = each(run.dumps, one)
    cross = skew.cross_dump([p for p, _ in reports], [r for _, r in reports])
    status = reconcile.status_line(results) if results else ""
    if nothing and status == "ok":
        status = f"{verdict.STATES['nothing-checked']} ({counted(len(nothing), 'dump')} with no target launch)"
    bad = [o.exit for o in outcomes if o.error is not None]
    if bad:  # every input reported: the status names the ones that could not be read, with their exit status
        unreadable = bad.count(verdict.EXIT_CODES["unreadable"])
        what = [f"{counted(unreadable, 'dump')} unreadable"] if unreadable else []
        what += [f"{counted(len(bad) - unreadable, 'dump')} damaged (a payload checksum does not match)"] * (
            len(bad) > unreadable)
        status = (f"{verdict.STATES['unreadable' if unreadable else 'failed']} ({'; '.join(what)}"
                  + (f"; the others: {status}" if status else "") + ")")
    if cross is not None:  # several dumps: each replay's start on one host clock, against the first dump's
        status = "\n".join(skew.lines(cross) + [status])
    finish("reconcile", outcomes, as_json=as_json, trailer=status, cross_dump=cross)  # null for one dump
