"""``kvconv reconcile DUMP... [--json] [--join auto|exact|ordered]``: host records x expected executions x device
events.

    $ kvconv reconcile fixtures/qwen3-14b/qwen3-14b.kvdump
    ...
      280 graph-node records = 280 expected executions = 280 device events, 0 drops

Exit status: 0 when everything agrees, 1 when the reconciler reports an error (missing, extra or duplicated blocks,
unmatched events, duplicated host records), 2 when a dump cannot be read or the options do not fit, 5 when an
unfinished (live) dump or a file cut short read with --salvage agrees as far as it goes (validate's incomplete:
its last launches' blocks lost at the producer's end or at the cut are warnings), 4 when the dump traced nothing (0
target launches or 0 patched modules: ``coverage-none``, as validate says) or its salvaged prefix kept no launch or
device event. A file cut at a group boundary that its metadata says holds more is unreadable (2). Blocks of
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
    from kvconv.check import skew
    from kvconv.cli.common import each, finish, quiet_text
    from kvconv.progress import ProgressOptions
    from kvconv.run import RunOptions

    opts = RunOptions(join=join, relaxed=relaxed, strict_coverage=strict_coverage, salvage=salvage)
    popts = ProgressOptions.from_cli(progress=progress, quiet=quiet or as_json)
    done: list[tuple] = []  # (its clocks: DumpRun.clocks, result, its JSON, nothing checked, incomplete: "cut" |
    #                          "unfinished" | None)
    with kvconv.open(dump_paths, options=opts, whole_run=False) as run:  # each dump closed on every path
        outcomes = each(run.dumps, lambda dr: _one(dr, popts, done))
    for o in outcomes if quiet else ():  # -q: the warnings and errors, then the status line
        o.text = o.text and quiet_text(o.text, keep_last=False)
    cross = skew.cross_dump([x[0] for x in done], [x[2] for x in done])
    status = _status(done, outcomes)
    if cross is not None:  # several dumps: each replay's start on one host clock, against the first dump's
        status = "\n".join(skew.lines(cross) + [status])
    finish("reconcile", outcomes, as_json=as_json, trailer=status, cross_dump=cross)  # null for one dump


def _one(dr, popts, done: list):
    """One dump's reconciliation: its text, JSON and exit status (on validate's scale: kvconv.check.verdict)."""
    from kvconv.check import verdict
    from kvconv.cli.common import Outcome
    from kvconv.format import holds
    from kvconv.names import demangle_text  # kernel names demangled in the text, kept as they are in --json
    from kvconv.progress import Progress

    with Progress(f"reconcile {Path(dr.path).name}", total=0, size_bytes=None, options=popts) as bar:
        dr.progress = bar.update
        r = dr.reconcile(tables=False)  # the report only (no per-event table): memory bounded by the host records
    # a dump that traced nothing agrees trivially (0 = 0 = 0): the verdict's coverage check says so, exit 4
    cov = verdict.coverage(dr.reader, canary_steps=0, write_steps=0)
    if cov is not None:
        cov = _canary_steps_said(dr.reader, cov)
    # what the dump lacks makes it incomplete, as validate says: cut short (--salvage), or left live by its producer
    why = "cut" if holds.salvaged(dr.reader) else "unfinished" if any(g.live for g in dr.reader.groups) else None
    clocks = dr.clocks  # what the cross-dump skew needs of it, kept once the dump is closed
    dr.close()
    rep, lines = r.to_dict(), r.lines() + [f.line() for f in r.findings]
    if cov is not None:
        rep["findings"].append(cov.to_dict())
        rep["summary"]["warning"] += 1
        lines.append(cov.line())
    done.append((clocks, r, rep, cov is not None, why))
    code = verdict.EXIT_CODES[verdict.of_reconciliation(r, cov, cut=why is not None)]
    return Outcome(r.path, code, rep, text="\n".join(demangle_text(x) for x in lines), dump=dr)


def _canary_steps_said(d, cov):
    """Reconcile's own ``coverage-none``: nothing to reconcile. A dump of canary or write steps (the probe's dump)
    holds no launch by design: say which command checks what it holds, instead of "no canary or write step"."""
    from dataclasses import replace

    from kvconv.wording import counted

    steps = [(sum(len(g.records) for g in d.groups_of(kind)), noun, cmd) for kind, noun, cmd in
             (("canary", "canary step", "kvconv canary"), ("write_step", "write step", "kvconv canary --writes"))]
    held = [f"{counted(n, noun)}: {cmd}" for n, noun, cmd in steps if n]
    if not held:
        return cov
    head, _, tail = cov.message.partition(", no canary or write step")
    return replace(cov, message=f"{head}, nothing to reconcile (the dump's {'; '.join(held)} checks them){tail}")


def _status(done: list, outcomes: list) -> str:
    """The last line: every readable dump's agreement (kvconv.check.reconcile.status_line), then the dumps that
    traced nothing and those that could not be read, with the verdict's words."""
    from kvconv.check import reconcile, verdict
    from kvconv.wording import counted

    status = reconcile.status_line([x[1] for x in done]) if done else ""
    nothing = sum(1 for x in done if x[3])
    if nothing and status == "ok":
        status = f"{verdict.STATES['nothing-checked']} ({counted(nothing, 'dump')} with no target launch)"
    cut, live = (sum(1 for x in done if x[4] == w) for w in ("cut", "unfinished"))
    if (cut or live) and status == "ok":  # what they hold agrees; what they lack is not known
        why = [f"{counted(cut, 'dump')} cut short, read with --salvage"] if cut else []
        why += [f"{counted(live, 'dump')} left unfinished by {'its' if live == 1 else 'their'} producer"] * bool(live)
        status = f"{verdict.STATES['incomplete']} ({'; '.join(why)}: what is there agrees, the rest is not known)"
    bad = [o.exit for o in outcomes if o.error is not None]
    if not bad:
        return status
    # every input reported: the status names the ones that could not be read, with their exit status
    unreadable = bad.count(verdict.EXIT_CODES["unreadable"])
    what = [f"{counted(unreadable, 'dump')} unreadable"] if unreadable else []
    what += [f"{counted(len(bad) - unreadable, 'dump')} damaged (a payload checksum does not match)"] * (
        len(bad) > unreadable)
    return (f"{verdict.STATES['unreadable' if unreadable else 'failed']} ({'; '.join(what)}"
            + (f"; the others: {status}" if status else "") + ")")
