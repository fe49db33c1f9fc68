"""``kvconv info`` and ``kvconv validate``.

    $ kvconv info fixtures/qwen3-14b/qwen3-14b.kvdump
    $ kvconv validate fixtures/qwen3-14b/qwen3-14b.kvdump --json
"""

from __future__ import annotations

from pathlib import Path

import typer

from kvconv.cli.common import (
    DUMPS,
    FORCE,
    JSON,
    PROGRESS,
    QUIET,
    RELAXED,
    SALVAGE,
    Outcome,
    each,
    finish,
    internal_error,
    judged,
    output_option,
    quiet_text,
    renamed,
    run_json,
    run_lines,
)
from kvconv.format.findings import Finding
from kvconv.names import demangle, demangle_text
from kvconv.wording import counted

app = typer.Typer()


def _info_text(path: str, info: dict, rep=None) -> str:
    from kvconv.format.layout import KINDS

    blobs = {k.name for k in KINDS.values() if not k.layout}  # byte blobs (metadata, strings): no records
    lines = []
    ver = {(g["major"], g["minor"]) for g in info["groups"]}
    vs = ", ".join(f"v{a}.{b}" for a, b in sorted(ver)) or "no groups"
    lines.append(f"{path}: kvconv dump {vs}, {counted(info['size'], 'byte')}, {counted(len(info['groups']), 'group')}, "
                 f"{counted(len(info['contexts']), 'context')}")
    lines.append(f"{'group':>5} {'offset':>12} {'kind':<13} {'records':>11} {'capacity':>11} {'drops':>7} "
                 f"{'ctx':>4} {'dev':>4} clock")
    for g in info["groups"]:
        lost = f" (lost to truncation {g['lost_records']:,})" if g["lost_records"] else ""
        lines.append(f"{g['index']:>5} {g['offset']:>12,} {g['kind']:<13} {g['record_count']:>11,} "
                     f"{g['capacity']:>11,} {g['drop_count']:>7,} {g['context_id']:>4} {g['device_id']:>4} "
                     f"{g['clock_domain']}{lost}")
    tot = "; ".join(f"{k} {v['records']:,} ({v['drops']:,} dropped"
                    + (f", {v['lost_records']:,} lost to truncation" if v["lost_records"] else "") + ")"
                    for k, v in info["totals"].items() if k not in blobs)
    lines.append(f"totals: {tot}")
    crc = [g["payload_crc"] for g in info["groups"]]
    checked = sum(c != "not-checked" for c in crc)
    bad = crc.count("mismatch")
    why = [g.get("payload_crc_not_checked") for g in info["groups"]]
    live, cut = why.count("unfinished"), len(crc) - checked - why.count("unfinished")
    lines.append(f"payload checksums: {checked:,} of {counted(len(crc), 'group')} verified"
                 + ((f", {bad:,} DO NOT MATCH" if bad else ", all match") if checked else "")
                 + (f" ({live:,} unfinished live group{'s' * (live != 1)} not claimed)" if live else "")
                 + (f" ({cut:,} cut short, not checked)" if cut else ""))
    meta = info.get("metadata")
    if meta:
        keys = ("tool", "tool_version", "gpu", "driver", "model", "engine")
        lines.append("metadata: " + ", ".join(f"{k}={meta[k]}" for k in keys if k in meta))
        from kvconv.format.info import run_lines

        lines.extend(run_lines(meta))
        if isinstance(meta.get("counters"), dict):
            lines.append("counters: " + ", ".join(f"{k}={v!r}" for k, v in sorted(meta["counters"].items())))
    if info.get("metadata_error"):
        lines.append(f"metadata: unreadable ({info['metadata_error']})")
    if info.get("kernels"):
        ks = info["kernels"]
        lines.append(f"kernels: {counted(len(ks), 'kernel')} in the table: "
                     + ", ".join(f"{demangle(k['name'])} (slot {k['slot']})" for k in ks[:4])
                     + (f", {len(ks) - 4:,} more" if len(ks) > 4 else ""))
    if rep is None:  # no verdict (not readable as a whole): the structure's findings
        lines.extend(demangle_text(Finding(**f).line()) for f in info["findings"])
    else:  # the one verdict, as kvconv validate tells it (its findings include the checksums' above)
        lines.extend(_verdict_lines(rep))
    return "\n".join(lines)


def _info_one(path: Path, options, popts) -> Outcome:
    import warnings

    import kvconv
    from kvconv.format.info import describe
    from kvconv.progress import Progress

    run = kvconv.open(path, options=options, whole_run=False)
    with warnings.catch_warnings(), run:
        warnings.simplefilter("ignore")  # a salvaged loss is in the table (lost to truncation)
        dr = run.dumps[0]
        d = run.reader
        with Progress(f"info {path.name}", total=d.size, size_bytes=d.size, options=popts) as bar:
            # The one verdict (kvconv validate's: every check the dump allows), stated in the text and the JSON; its
            # checks sum every payload checksum, which the description reports (the file read once).
            dr.progress = bar.update
            rep, failure = judged(dr)
            bad = None if rep is None else {f.group for f in rep.findings if f.code == "payload-checksum"}
            info = describe(d, progress=bar.update, mismatched=bad)
        info["kernels"] = [{"slot": slot, "name": name, "context_id": ctx} for ctx, _dev in d.contexts()
                           for slot, name in sorted(d.kernel_names(context_id=ctx).items())]
    # info's exit status is its own part's (docs/CLI.md): 0 readable and intact, 1 a checksum does not match.
    code = 1 if any(f["severity"] == "error" for f in info["findings"]) else 0
    if rep is None:  # the checks failed on a bug: the description stands, the verdict is not claimed
        info["verdict"] = {"verdict": None, "internal_error": failure}
        text = _info_text(str(path), info) + f"\n{path}: verdict not computed ({internal_error(failure)})"
        return Outcome(str(path), code, info, text=text, dump=dr)
    info["verdict"] = {k: v for k, v in rep.to_dict().items() if k in _VERDICT_KEYS}
    return Outcome(str(path), code, info, text=_info_text(str(path), info, rep), dump=dr)


_VERDICT_KEYS = ("verdict", "exit_code", "errors", "warnings", "incidents")


def _validate_one(dr, popts=None, *, all_findings: bool = False) -> Outcome:
    """One dump of the run (a :class:`kvconv.run.DumpRun`) validated: its outcome, text or one-line error."""
    from kvconv.progress import Progress, ProgressOptions

    path = Path(dr.path)
    try:
        size = path.stat().st_size
    except OSError:
        size = 0
    with Progress(f"validate {path.name}", total=size, size_bytes=size or None,
                  options=popts or ProgressOptions(enabled=False)) as bar:
        dr.progress = bar.update
        r = dr.validation
    dr.close()  # what the run's links and verdict ask after (its process, metadata) is kept (kvconv.dumprun)
    error = dr.unreadable_error()
    if error is not None:  # unreadable input: the one-line error goes to stderr, like every other command's errors
        return Outcome(r.path, r.exit_code, r.to_dict(), error=error, dump=dr)
    return Outcome(r.path, r.exit_code, r.to_dict(), text="\n".join(_verdict_lines(r, all_findings=all_findings)),
                   dump=dr)


def _verdict_lines(r, *, all_findings: bool = False) -> list[str]:
    """A validate report told in text (validate's, and info's last lines): the incidents (findings of one cause are
    one line; --all: the grouped ones, then every finding), then the verdict line. Kernel names demangled."""
    from kvconv.check import verdict

    if all_findings:
        lines = [verdict.line(i) for i in r.incidents if i["where"]] + [f.line() for f in r.findings]
    else:
        lines = [verdict.line(i) for i in r.incidents]
    grouped = sum(1 for i in r.incidents if i["where"])
    inc = f"; {counted(len(r.incidents), 'incident')}" if grouped else ""
    lines.append(f"{r.path}: {verdict.label(r.verdict, r.findings)} ({counted(r.errors, 'error')}, "
                 f"{counted(r.warnings, 'warning')}{inc}; {counted(r.groups, 'group')}, {counted(r.size, 'byte')})")
    return [demangle_text(x) for x in lines]


@app.command()
def info(
    dumps: list[Path] = DUMPS,
    as_json: bool = JSON,
    salvage: bool = SALVAGE,
    progress: bool | None = PROGRESS,
    quiet: bool = QUIET,
) -> None:
    """Show a dump's record groups, counts, capacities, drops, clock domains, run metadata and kernels, verify its
    payload checksums, and state its verdict (kvconv validate's, last line; JSON: verdict). Exit 0 readable and
    intact, whatever the verdict, 1 a checksum does not match, 2 unreadable (the verdict's status: kvconv validate).

    Example: kvconv info run.kvdump --json
    """
    from kvconv.progress import ProgressOptions  # numpy etc.: imported by the commands that run, not by --help
    from kvconv.run import RunOptions

    opts = RunOptions(salvage=salvage, verify_checksums=False)  # verified in describe, reported
    popts = ProgressOptions.from_cli(progress=progress, quiet=quiet)
    outcomes = each(dumps, lambda p: _info_one(p, opts, popts))
    for o in outcomes:  # one blank line between dumps; -q: the warnings and errors, and the verdict
        if quiet and o.text:
            o.text = quiet_text(o.text, keep_last=True)
        elif o.text:
            o.text += "\n" if o is not outcomes[-1] else ""
    finish("info", outcomes, as_json=as_json)

@app.command()
@renamed(relaxed="--relaxed-reconcile")
def validate(
    dumps: list[Path] = DUMPS,
    as_json: bool = JSON,
    relaxed: bool = RELAXED,
    no_reconcile: bool = typer.Option(False, "--no-reconcile", help="skip the reconciler's checks"),
    all_findings: bool = typer.Option(False, "--all", help="list every finding, not only one line per incident"),
    salvage: bool = SALVAGE,
    progress: bool | None = PROGRESS,
    quiet: bool = QUIET,
) -> None:
    """Run every check the dump allows (structure, schema, reconcile, location and write canaries, coverage, what
    was asked) and give one verdict: exit 0 ok, 1 failed (errors), 2 unreadable, 4 nothing checked, 5 incomplete
    (the producer died). Findings of one cause are one incident line; --all and --json keep every finding.

    A run is every dump it wrote: given a dump or kvconv record's -o path (literal or with %p), the other
    processes' dumps (<stem>.pid<N>.kvdump) and the engine plugins' probe dumps (<stem>.<engine>-<pid>.probe.kvdump)
    found beside it are validated with it, and the run gets one verdict (its last line).

    Example: kvconv validate run.kvdump
    """
    import kvconv
    from kvconv.progress import ProgressOptions
    from kvconv.run import RunOptions

    opts = RunOptions(reconcile=not no_reconcile, relaxed=relaxed, salvage=salvage)
    popts = ProgressOptions.from_cli(progress=progress, quiet=quiet)
    # every dump of the run(s) named: other processes', probe dumps; closed on every path (finish exits)
    with kvconv.open(dumps, options=opts) as run:
        outcomes = each(run.dumps, lambda dr: _validate_one(dr, popts, all_findings=all_findings))
        trailer = "\n".join(demangle_text(x) for x in run_lines(run))
        code, extra = run.exit_code, run_json(run)
    finish("validate", outcomes, as_json=as_json, trailer=trailer, code=code, **extra)


@app.command()
@renamed(out="--out")
def demo(
    out: Path = output_option("the demo's folder (created; replaced only when it is kvconv's own earlier demo)",
                              Path("kvconv-demo")),
    force: bool = FORCE,
) -> None:
    """Run the main job on the embedded Qwen3-14B fixture: write the dump (qwen3-14b.kvdump, from the generator
    shipped in the package), then info, validate, reconcile, Perfetto and Chrome traces, Parquet tables, all into
    one new folder (built beside it, in place once complete). A rerun replaces kvconv's own earlier demo; a folder
    holding anything else is refused, even with --force.

    Example: kvconv demo -o kvconv-demo   (then open kvconv-demo/qwen3-14b.pftrace in ui.perfetto.dev)
    """
    from kvconv.cli import main
    from kvconv.demo.run import run

    raise typer.Exit(run(out, main=main, force=force))
