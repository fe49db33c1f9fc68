"""``kvconv report DUMP... -o report.html`` (one self-contained HTML page of plots) and ``kvconv diff A B`` (two runs
compared; exit 1 beyond thresholds). Both read each dump once (:mod:`kvconv.look.profile`).

    $ kvconv report fixtures/qwen3-14b/qwen3-14b.kvdump -o qwen3.html
    wrote qwen3.html: 1 dump, 4 plots, 380,123 bytes
    $ kvconv diff fixtures/h200-tp2/rank0.kvdump fixtures/h200-tp2/rank1.kvdump
    ...
    ok: no change beyond the thresholds

Both read each dump's one verdict (kvconv validate's: :mod:`kvconv.check.verdict`) and state it. report: once the
page is written (its verdict, incidents and findings are in it), the worst dump's verdict exit status (0 ok, 1 failed,
4 nothing checked, 5 incomplete: schemas/codes.json ``verdicts``); 2 when a dump cannot be read or the output may
not be written (nothing is written then). diff: 0 no check beyond the thresholds, 1 otherwise (B's verdict worse than
A's, or an incident of B that A has not, counts), 2 unreadable; --json prints the envelope of every command
(schemas/cli.schema.json) with the comparison as ``diff``. docs/REPORT.md.
"""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from kvconv.cli.common import DUMPS, FORCE, JSON, PROGRESS, QUIET, SALVAGE, output_option

app = typer.Typer()

_JOIN = typer.Option("auto", "--join", metavar="auto|exact|ordered", help="the join, as kvconv reconcile's")


def _profile(path: Path, *, join: str, salvage: bool, popts, what: str):
    """The dump's verdict (kvconv validate's report, as a dict) and its profile (None where the records are damaged:
    a payload checksum that does not match; the verdict says so)."""
    from kvconv.check.validate import ValidateOptions, validate
    from kvconv.format import dump
    from kvconv.format.errors import FormatError, KvconvError
    from kvconv.look.profile import profile
    from kvconv.progress import Progress

    rep = validate(path, options=ValidateOptions(salvage=salvage))
    if rep.unreadable:
        first = next(f for f in rep.findings if f.severity == "error")
        raise FormatError(first.message, path=first.path, offset=first.offset, field=first.field, group=first.group,
                          code=first.code)
    try:
        with dump.open(path, options=dump.ReadOptions(salvage=salvage)) as d:
            with Progress(f"{what} {Path(path).name}", total=0, size_bytes=d.size, options=popts) as bar:
                return rep.to_dict(), profile(d, join=join, progress=bar.update)
    except KvconvError:
        if rep.verdict != "failed":
            raise
        return rep.to_dict(), None


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
    from kvconv.check import reconcile, skew
    from kvconv.cli.common import Outcome, finish
    from kvconv.format.atomic import atomic_output, check_output
    from kvconv.format.errors import KvconvError, UsageError
    from kvconv.look import report
    from kvconv.progress import ProgressOptions
    from kvconv.wording import counted

    reconcile.ReconcileOptions(join=join)  # a bad --join is refused before any work
    if as_json and output == "-":
        raise UsageError("--json prints its document on stdout: give -o PATH for the page", code="bad-output")
    check_output(output, inputs=dump_paths, kind="report", force=force)
    popts = ProgressOptions.from_cli(progress=progress, quiet=quiet or as_json)
    judged = []
    for p in dump_paths:
        try:
            judged.append(_profile(p, join=join, salvage=salvage, popts=popts, what="report"))
        except KvconvError as e:
            if not as_json:
                raise
            finish("report", [Outcome(str(p), e.exit_code, error=e)], as_json=True)
    verdicts, profiles = [v for v, _ in judged], [p for _, p in judged]
    whole = [(str(path), p) for path, p in zip(dump_paths, profiles) if p is not None]
    cross = skew.cross_dump([w for w, _ in whole], [p.reconcile for _, p in whole]) if len(whole) > 1 else None
    page = report.page(profiles, cross=cross, verdicts=verdicts)
    data = page.html.encode("utf-8")
    with atomic_output(output, inputs=dump_paths, kind="report", force=force) as tmp:
        Path(tmp).write_bytes(data)
    if as_json:  # the page is written for every readable dump; each dump's result is its verdict
        from kvconv.cli.common import Outcome, envelope, print_json

        outs = [Outcome(v["path"], v["exit_code"], {"verdict": v["verdict"], "incidents": len(v["incidents"])})
                for v in verdicts]
        print_json(envelope("report", outs, output={"path": output, "bytes": len(data), "plots": page.plots}))
    elif not quiet:
        where = "stdout" if output == "-" else output
        (sys.stderr if output == "-" else sys.stdout).write(
            f"wrote {where}: {counted(len(profiles), 'dump')}, {counted(page.plots, 'plot')}, "
            f"{counted(len(data), 'byte')}\n" + "".join(f"{v['path']}: verdict {v['verdict']} (exit {v['exit_code']}; "
                                                      f"{counted(len(v['incidents']), 'incident')} in the report)\n"
                                                      for v in verdicts if v["verdict"] != "ok"))
    code = max(v["exit_code"] for v in verdicts)
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
    from kvconv.check import reconcile
    from kvconv.cli.common import Outcome, envelope, print_json
    from kvconv.format.errors import KvconvError
    from kvconv.look import diff
    from kvconv.progress import ProgressOptions

    opts = diff.DiffOptions(max_median_change=max_median_change, max_p99_change=max_p99_change,
                            noise_factor=noise_factor, max_drops=max_drops)
    reconcile.ReconcileOptions(join=join)
    popts = ProgressOptions.from_cli(progress=progress, quiet=quiet)
    outcomes, profiles = [], []
    for p in (a, b):
        try:
            profiles.append(_profile(p, join=join, salvage=salvage, popts=popts, what="diff"))
            outcomes.append(Outcome(str(p), 0, _summary(*profiles[-1])))
        except KvconvError as e:
            if not as_json:
                raise
            outcomes.append(Outcome(str(p), e.exit_code, error=e))
    res = (diff.compare(profiles[0][1], profiles[1][1], options=opts, verdicts=(profiles[0][0], profiles[1][0]))
           if len(profiles) == 2 else None)
    code = max([o.exit for o in outcomes] + [res["exit"] if res else 0])
    if as_json:
        env = envelope("diff", outcomes, diff=res)
        env["exit"], env["ok"] = code, code == 0  # the comparison's verdict counts beside the dumps'
        print_json(env)
    else:
        from kvconv.names import demangle_text  # kernel names demangled in the text, as recorded in --json

        sys.stdout.write("\n".join(demangle_text(x) for x in diff.lines(res)) + "\n")
    sys.stdout.flush()
    raise typer.Exit(code)


def _summary(v: dict, p) -> dict:
    """What a dump's entry of the diff envelope says of it: its verdict, and its agreement per context."""
    return {"size": v["size"], "ok": p.ok if p is not None else False, "verdict": v["verdict"], "contexts": [
        {"context_id": c["context_id"], "device_id": c["device_id"], "agreement": c["agreement"]["line"],
         "graph_execs": len(c["graph_execs"])} for c in (p.reconcile["contexts"] if p is not None else [])]}
