"""``kvconv perfetto | chrome | arrow``: convert dumps for trace viewers and data tools, one command per output
format of :mod:`kvconv.emit.registry` (a new format registered there gets its command here, with the options every
format takes and those of its kind: --window/--replays/--flows for traces, --format/--compression for tables).

    $ kvconv perfetto rank0.kvdump rank1.kvdump -o tp.pftrace        # open in ui.perfetto.dev
    $ kvconv chrome run.kvdump -o run.json                           # chrome://tracing, Perfetto
    $ kvconv arrow runs/*.kvdump -o tables/ --format parquet         # DuckDB: read_parquet('tables/device_event/**')

Heavy imports (perfetto protos, pyarrow) happen inside the commands.
"""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

import typer

from kvconv.cli.common import FORCE, JSON, PROGRESS, QUIET, SALVAGE, output_option, renamed
from kvconv.emit.registry import FORMATS, Format

# --join, kvconv reconcile's words (kvconv.join.JOINS): auto | exact | ordered. The former words, which docs/CLI.md
# promises, still work, unlisted: --join reconcile and the former --reconcile always (kvconv reconcile's auto join at
# any size) = auto without the size bound; --reconcile never = exact.
_FORMER = {"reconcile": "auto", "always": "auto", "never": "exact"}


def _options(window=None, replays=None, flows=0, join="auto", chunk=1 << 18, progress=None, **kw):
    from kvconv.emit import EmitOptions
    from kvconv.emit.options import parse_range

    if join in ("reconcile", "always"):
        kw["reconcile_max_events"] = 1 << 62  # kvconv reconcile's join whatever the size, as these words asked
    join = _FORMER.get(join, join)
    return EmitOptions(window_ms=parse_range(window, what="--window"),
                       replays=parse_range(replays, what="--replays", cast=int), flows=flows, join=join,
                       chunk=chunk, progress=progress, **kw)


def _report(res, quiet: bool, *, as_json: bool = False) -> None:
    from kvconv.cli import err
    from kvconv.wording import counted

    for wmsg in res.warnings:
        err(f"Warning: {wmsg}")
    if quiet:
        return
    for a in res.alignment:
        if a["pairs"]:
            err(f"aligned {a['run']} ctx {a['context_id']} (GPU {a['device_id']}): {a['pairs']} clock-sync pairs, "
                f"error bound ±{a['bound_ns'] / 1000:.2f} µs (uncertainty {a['uncertainty_ns'] / 1000:.2f} µs + "
                f"drift between pairs {a['drift_ns'] / 1000:.2f} µs)")
        else:
            err(f"not aligned {a['run']} ctx {a['context_id']} (GPU {a['device_id']}): no clock-sync pairs")
    if len(res.alignment) > 1 and all(a["pairs"] for a in res.alignment):
        worst = sorted((a["bound_ns"] for a in res.alignment), reverse=True)[:2]
        err(f"between two contexts: error bound ±{sum(worst) / 1000:.2f} µs")
    # with -o - the output itself is on stdout, with --json the envelope: the summary goes to stderr
    where = "stdout" if res.output == "-" else res.output
    (sys.stderr if res.output == "-" or as_json else sys.stdout).write(
        f"wrote {where}: {counted(res.contexts, 'context')}, {counted(res.written_events, 'device event')}, "
        f"{counted(res.host_records, 'host record')}, "
        f"{counted(res.tables, 'table') if res.tables else counted(res.flows, 'flow')}, "
        f"{counted(res.bytes_written, 'byte')}\n")


def _output(res) -> dict:
    """What ``--json`` says about the output written (schemas/cli.schema.json ``output``)."""
    return {"path": res.output, "bytes": res.bytes_written, "contexts": res.contexts,
            "device_events": res.written_events, "host_records": res.host_records, "flows": res.flows,
            "tables": res.tables, "alignment": res.alignment, "warnings": list(res.warnings)}


_WINDOW = typer.Option(None, "--window", metavar="START_MS:END_MS",
                       help="keep device events from START to END ms after each context's first device event")
_REPLAYS = typer.Option(None, "--replays", metavar="FIRST:LAST", help="keep only graph replays FIRST..LAST")
_FLOWS = typer.Option(16, "--flows", help="flows from each host launch to at most this many device blocks (0: none)")
_JOIN = typer.Option("auto", "--join", metavar="auto|exact|ordered",
                     help="device event -> host launch, as in kvconv reconcile: exact: by gridid + tag; ordered: by "
                          "sequence order (kvconv reconcile's ordered join); auto: exact when it matches every event, "
                          "else kvconv reconcile's join (up to 4,000,000 events)")
_CHUNK = typer.Option(1 << 18, "--chunk", hidden=True, help="device events per streaming chunk")

_DUMPS = typer.Argument(..., help="dump file(s); each context gets its own track group", metavar="DUMP...",
                        readable=False)  # each unreadable dump is reported by the command, not by click


_MERGE = typer.Option(None, "--merge", metavar="TORCH_TRACE.json", help="put kvconv's tracks into this "
                      "torch.profiler trace of the same run, aligned on its clock (kvconv.emit.torchmerge)")
_FMT = typer.Option("arrow", "--format", help="arrow (IPC files) or parquet")
_COMPRESSION = typer.Option("none", "--compression", help="none, lz4 or zstd")
_APPEND = typer.Option(False, "--append", help="add the dumps' runs to the dataset -o names (kvconv arrow's earlier "
                       "output) without touching its files (kvconv.dataset; docs/DATASETS.md)")


def _parameters(fmt: Format) -> list[inspect.Parameter]:
    """The options of ``kvconv <fmt.name>``, in the order --help lists them."""
    opts = [("dumps", list[Path], _DUMPS), ("out", str, output_option(fmt.output))]
    if fmt.trace:
        opts += [("window", str | None, _WINDOW), ("replays", str | None, _REPLAYS), ("flows", int, _FLOWS)]
    if fmt.tables:
        opts += [("fmt", str, _FMT), ("compression", str, _COMPRESSION), ("append", bool, _APPEND)]
    if fmt.name == "chrome":
        opts += [("merge", Path | None, _MERGE)]
    opts += [("join", str, _JOIN), ("chunk", int, _CHUNK), ("progress", bool | None, PROGRESS),
             ("salvage", bool, SALVAGE), ("force", bool, FORCE), ("quiet", bool, QUIET), ("as_json", bool, JSON)]
    return [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=d, annotation=a) for n, a, d in opts]


def command(fmt: Format):
    """The ``kvconv <fmt.name>`` command of a registered output format (its help ends in the format's example)."""

    def run(*, dumps, out, join, chunk, progress, salvage, force, quiet, as_json, fmt_=fmt, **kind) -> None:
        import kvconv
        from kvconv.cli import interrupt
        from kvconv.cli.common import Outcome, finish, print_json, verdict_warnings
        from kvconv.format.errors import KvconvError, UsageError
        from kvconv.run import RunOptions

        if as_json and out == "-":
            raise UsageError("--json prints its document on stdout: give -o PATH for the output", code="bad-output")
        if not kind.get("append"):  # a signal once it is in place keeps it, and says so
            interrupt.output(out)
        with kvconv.open(dumps, whole_run=False, options=RunOptions(salvage=salvage)) as the_run:
            try:
                res = _write(the_run, out, join, chunk, progress, force, quiet or as_json, fmt_, kind)
            except KvconvError as e:
                if not as_json:
                    raise
                finish(fmt_.name, [Outcome(str(e.path or dumps[0]), e.exit_code, error=e)], as_json=True)
            _report(res, quiet, as_json=as_json)
            # the one verdict of each dump, stated beside the output written; from the pass that converted it
            verdicts = verdict_warnings(the_run)
        if as_json:
            from kvconv.cli.common import envelope

            outcomes = [Outcome(v["path"], 0, {"verdict": v["verdict"], "incidents": v["incidents"]})
                        for v in verdicts]
            print_json(envelope(fmt_.name, outcomes, output=_output(res)))

    def _write(run, out, join, chunk, progress, force, quiet, fmt_, kind):
        """The output, from the run's open dumps (``Run.write``: each dump read once, its verdict from this pass)."""
        extra = {}
        merge = kind.pop("merge", None)
        if fmt_.tables:
            compression = kind.pop("compression")
            extra = {"arrow_format": kind.pop("fmt"), "compression": None if compression == "none" else compression}
            append = kind.pop("append")
        opts = _options(join=join, chunk=chunk, progress=False if quiet else progress,
                        salvage=run.options.salvage, force=force, verdict=True, **kind, **extra)

        def write(_paths, where, *, options):  # the run's own dumps, whatever the paths it is handed
            return run.write(fmt_.name, where, options=options)

        if merge is not None:
            from kvconv.emit.torchmerge import report_merge, write_merged

            res, al = write_merged(write, run.paths, out, merge, options=opts)
            report_merge(al, merge, quiet=quiet)
            return res
        if fmt_.tables and append:
            from kvconv.dataset import write_appending

            return write_appending(write, run.paths, out, options=opts)
        return run.write(fmt_.name, out, options=opts)

    params = _parameters(fmt)
    run.__signature__ = inspect.Signature(params)
    run.__annotations__ = {p.name: p.annotation for p in params}
    run.__name__ = run.__qualname__ = fmt.name
    run.__doc__ = f"{fmt.summary}\n\nExample: {fmt.example}"
    return renamed(out="--out", join="--reconcile")(run)


app = typer.Typer()
for _fmt in FORMATS.values():  # module-level commands, one per registered format
    globals()[_fmt.name] = app.command(_fmt.name)(command(_fmt))
