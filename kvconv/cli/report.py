"""``kvconv report DUMP... -o report.html`` (one self-contained HTML page of plots) and ``kvconv diff A B`` (two runs
compared; exit 1 beyond thresholds). Both read each dump once (:mod:`kvconv.look.profile`).

    $ kvconv report fixtures/qwen3-14b/qwen3-14b.kvdump -o qwen3.html
    wrote qwen3.html: 1 dump, 4 plots, 380,123 bytes
    $ kvconv diff fixtures/h200-tp2/rank0.kvdump fixtures/h200-tp2/rank1.kvdump
    ...
    ok: no change beyond the thresholds

Both read each dump's one verdict (kvconv validate's: :mod:`kvconv.check.verdict`) and state it; a dump's run (the
other dumps found beside it: other processes', the engine plugins' probe dumps, :func:`kvconv.check.runs.find`) is
judged as one. report: once the page is written (its verdict, incidents and findings are in it), the run's
verdict exit status (0 ok, 1 failed, 4 nothing checked, 5 incomplete: schemas/codes.json ``verdicts``); 2 when a
dump cannot be read or the output may not be written (nothing is written then). diff: 0 no check beyond the
thresholds, 1 otherwise (B's verdict worse than A's, or an incident of B that A has not, counts), 2 unreadable;
--json prints the envelope of every command (schemas/cli.schema.json) with the comparison as ``diff``.
docs/REPORT.md.
"""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from kvconv.cli.common import DUMPS, FORCE, JSON, PROGRESS, QUIET, SALVAGE, output_option

app = typer.Typer()

_JOIN = typer.Option("auto", "--join", metavar="auto|exact|ordered", help="the join, as kvconv reconcile's")


def _judged(dr, *, popts, what: str) -> tuple[dict, object]:
    """A dump's verdict (validate's report, as a dict) and profile, each read once (the profile None where the
    records are damaged: the verdict says so); an unreadable dump raises its one-line error."""
    from kvconv.progress import Progress

    try:
        error = dr.unreadable_error()
        if error is not None:
            raise error
        with Progress(f"{what} {Path(dr.path).name}", total=0, size_bytes=None, options=popts) as bar:
            dr.progress = bar.update
            return dr.validation.to_dict(), dr.profile
    finally:
        dr.close()


@app.command("report")
def report_cmd(
    dump_paths: list[Path] = DUMPS,
    output: str = output_option("the HTML page to write (self-contained: open it offline, attach it to a bug)"),
    join: str = _JOIN,
    force: bool = FORCE,
    salvage: bool = SALVAGE,
    progress: bool | None = PROGRESS,
    quiet: bool = QUIET,
    as_json: bool = JSON,
) -> None:
    """Write one self-contained HTML page about the dumps: the agreement headline, findings with their codes'
    meaning, and plots (per-replay span and gap, node x replay start offsets and durations, blocks per SM, predicted
    vs recorded blocks per launch, canary pages by step; for several dumps one row per GPU/rank and the cross-dump
    replay skew). Its size does not grow with the dumps'.

    Example: kvconv report run.kvdump -o report.html
    """
    import kvconv
    from kvconv.cli import interrupt
    from kvconv.cli.common import Outcome, envelope, finish, print_json, run_json, verdict_warnings
    from kvconv.format.atomic import check_output
    from kvconv.format.errors import KvconvError, UsageError
    from kvconv.progress import ProgressOptions
    from kvconv.run import RunOptions
    from kvconv.wording import counted

    run = kvconv.open(dump_paths, options=RunOptions(join=join, salvage=salvage))
    run.options.reconcile_options()  # a bad --join is refused before any work
    if as_json and output == "-":
        raise UsageError("--json prints its document on stdout: give -o PATH for the page", code="bad-output")
    check_output(output, inputs=dump_paths, kind="report", force=force)
    interrupt.output(output)  # a signal once it is in place keeps it, and says so
    popts = ProgressOptions.from_cli(progress=progress, quiet=quiet or as_json)
    for dr in run.dumps:
        try:
            _judged(dr, popts=popts, what="report")
        except KvconvError as e:
            if not as_json:
                raise
            finish("report", [Outcome(dr.path, e.exit_code, error=e)], as_json=True)
    page = run.report(output, force=force)
    if as_json:  # the page is written for every readable dump; each dump's result is its verdict
        outs = [Outcome(dr.path, dr.exit_code, {"verdict": dr.verdict, "incidents": len(dr.incidents)})
                for dr in run.dumps]
        print_json(envelope("report", outs, output=page, code=run.exit_code, **run_json(run)))
    else:
        if not quiet:
            where = "stdout" if output == "-" else output
            (sys.stderr if output == "-" else sys.stdout).write(
                f"wrote {where}: {counted(len(run.dumps), 'dump')}, {counted(page['plots'], 'plot')}, "
                f"{counted(page['bytes'], 'byte')}\n")
            sys.stdout.flush()
        verdict_warnings(run, done="the page was written")  # as the converters say it, -q or not
        if not quiet:
            from kvconv.cli.common import run_lines
            from kvconv.names import demangle_text

            sys.stdout.write("".join(demangle_text(x) + "\n" for x in run_lines(run)))
            sys.stdout.flush()
    code = run.exit_code  # the run's one verdict: every dump found with the ones named (kvconv.check.verdict)
    if code:
        raise typer.Exit(code)


@app.command("diff")
def diff_cmd(
    a: Path = typer.Argument(..., metavar="A", readable=False, help="the reference run's dump"),
    b: Path = typer.Argument(..., metavar="B", readable=False, help="the dump compared with it"),
    as_json: bool = JSON,
    max_median_change: float = typer.Option(0.10, "--max-median-change", metavar="FRACTION",
                                            help="relative change of a median (span, node) that counts, when also "
                                                 "beyond the noise"),
    max_p99_change: float = typer.Option(0.25, "--max-p99-change", metavar="FRACTION",
                                         help="relative change of a p99 that counts, when also beyond the noise"),
    noise_factor: float = typer.Option(3.0, "--noise-factor", metavar="K",
                                       help="a change must exceed K times the within-run noise (scaled MAD)"),
    max_drops: int = typer.Option(0, "--max-drops", metavar="N", help="drops B may add to A's"),
    join: str = _JOIN,
    salvage: bool = SALVAGE,
    progress: bool | None = PROGRESS,
    quiet: bool = QUIET,
) -> None:
    """Compare two runs of one workload: node order and count per replay, blocks per launch, per-replay span and
    per-node duration (or start offset) medians and p99 against the within-run noise, drops, missing blocks, canary
    pages, findings that appear or disappear. Exit 0 when nothing changed beyond the thresholds, 1 otherwise.

    Example: kvconv diff before.kvdump after.kvdump --max-median-change 0.05
    """
    import kvconv
    from kvconv.cli.common import Outcome, envelope, print_json
    from kvconv.format.errors import KvconvError
    from kvconv.look import diff
    from kvconv.progress import ProgressOptions
    from kvconv.run import RunOptions

    opts = diff.DiffOptions(max_median_change=max_median_change, max_p99_change=max_p99_change,
                            noise_factor=noise_factor, max_drops=max_drops)
    run = kvconv.open([a, b], options=RunOptions(join=join, salvage=salvage), whole_run=False)  # the two compared
    run.options.reconcile_options()
    popts = ProgressOptions.from_cli(progress=progress, quiet=quiet or as_json)
    outcomes, profiles = [], []
    for dr in run.dumps:
        try:
            profiles.append(_judged(dr, popts=popts, what="diff"))
            outcomes.append(Outcome(dr.path, 0, _summary(*profiles[-1])))
        except KvconvError as e:
            if not as_json:
                raise
            outcomes.append(Outcome(dr.path, e.exit_code, error=e))
    sides = [_run_side(dr, v) for dr, (v, _) in zip(run.dumps, profiles)]
    res = (diff.compare(profiles[0][1], profiles[1][1], options=opts, verdicts=tuple(sides))
           if len(profiles) == 2 else None)
    code = max([o.exit for o in outcomes] + [res["exit"] if res else 0])
    if as_json:
        env = envelope("diff", outcomes, diff=res)
        env["exit"], env["ok"] = code, code == 0  # the comparison's verdict counts beside the dumps'
        print_json(env)
    else:
        from kvconv.names import demangle_text  # kernel names demangled in the text, as recorded in --json

        sys.stdout.write("\n".join(demangle_text(x) for x in diff.lines(res, quiet=quiet)) + "\n")
    sys.stdout.flush()
    raise typer.Exit(code)


def _run_side(dr, v: dict) -> dict:
    """A side of the diff judged as its run, the verdict compared: ``v`` (validate's dict of the dump compared) with
    the run's one verdict and every dump's incidents where other dumps of its run lie beside it (other processes',
    the engine plugins' probe dumps: :func:`kvconv.check.runs.find`)."""
    from kvconv.run import whole as whole_run

    with whole_run([dr.path], dr.options, held={dr.path: dr}) as whole:  # the dump compared, validated once
        if len(whole.dumps) < 2:
            return v
        incidents = [dict(i, message=i["message"].replace(d.path, "")) for d in whole.dumps for i in d.incidents]
        return dict(v, verdict=whole.verdict, incidents=incidents)


def _summary(v: dict, p) -> dict:
    """What a dump's entry of the diff envelope says of it: its verdict, and its agreement per context."""
    return {"size": v["size"], "ok": p.ok if p is not None else False, "verdict": v["verdict"], "contexts": [
        {"context_id": c["context_id"], "device_id": c["device_id"], "agreement": c["agreement"]["line"],
         "graph_execs": len(c["graph_execs"])} for c in (p.reconcile["contexts"] if p is not None else [])]}
