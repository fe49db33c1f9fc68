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
    from kvconv.check import reconcile, skew, verdict
    from kvconv.cli.common import Outcome, each, finish
    from kvconv.format import dump
    from kvconv.progress import Progress, ProgressOptions
    from kvconv.wording import counted

    opts = reconcile.ReconcileOptions(join=join, relaxed=relaxed, strict_coverage=strict_coverage)
    popts = ProgressOptions.from_cli(progress=progress, quiet=quiet)
    results, reports, nothing = [], [], []

    def one(p) -> Outcome:
        with dump.open(p, options=dump.ReadOptions(salvage=salvage)) as d:
            # the report only (no per-event table): memory bounded by the host records
            with Progress(f"reconcile {Path(p).name}", total=0, size_bytes=d.size, options=popts) as bar:
                r = reconcile.reconcile(d, options=opts, tables=False, progress=bar.update)
            # a dump that traced nothing agrees trivially (0 = 0 = 0): the verdict's coverage check says so, exit 4
            cov = verdict.coverage(d, canary_steps=0, write_steps=0)
        rep = r.to_dict()
        lines = r.lines() + [f.line() for f in r.findings]
        code = 0 if r.ok else 1
        if code == 0 and reconcile.report.lost_at_end([r]):  # lost at the producer's end: validate's incomplete
            code = verdict.EXIT_CODES["incomplete"]
        if cov is not None:
            rep["findings"].append(cov.to_dict())
            rep["summary"]["warning"] += 1
            lines.append(cov.line())
            nothing.append(p)
            code = max(code, verdict.EXIT_CODES["nothing-checked"]) if code == 0 else code
        results.append(r)
        reports.append((p, rep))
        from kvconv.names import demangle_text  # kernel names demangled in the text, kept as they are in --json

        return Outcome(r.path, code, rep, text="\n".join(demangle_text(x) for x in lines))

    outcomes = each(dump_paths, one)
    cross = skew.cross_dump([p for p, _ in reports], [r for _, r in reports])
    unreadable = sum(o.error is not None for o in outcomes)
    status = reconcile.status_line(results) if results else ""
    if nothing and status == "ok":
        status = f"NOTHING CHECKED ({counted(len(nothing), 'dump')} with no target launch)"
    if unreadable:  # every input reported: the status names the ones that could not be read
        status = f"FAILED ({counted(unreadable, 'dump')} unreadable" + (
            f"; the others: {status}" if status else "") + ")"
    if cross is not None:  # several dumps: each replay's start on one host clock, against the first dump's
        status = "\n".join(skew.lines(cross) + [status])
    finish("reconcile", outcomes, as_json=as_json, trailer=status, cross_dump=cross)  # null for one dump
