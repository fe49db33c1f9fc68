"""``kvconv record``: run a command under the native tracer, then judge the run: every dump it wrote.

    $ kvconv record --kernel reshape_and_cache_flash_kernel -o run.kvdump -- python3 serve.py
"""

from __future__ import annotations

import sys

import typer

from kvconv.cli.common import FORCE, output_option

app = typer.Typer()


# record's own options (those several commands take are kvconv.cli.common's)
_KERNEL = typer.Option(None, "--kernel", "-k", metavar="PATTERN", help="substring of a target kernel name (repeatable; "
                       "mangled or demangled); default reshape_and_cache_flash_kernel")
_DEVICE_CAPACITY = typer.Option(None, "--device-capacity", help="device events per context, 64 bytes each in GPU memory (default by the GPU's memory: 33,554,432 from 64 GiB, 8,388,608 from 16 GiB, else 1,048,576)")  # noqa: E501
_HOST_CAPACITY = typer.Option(None, "--host-capacity", help="host records per table (default 65536)")
_EVENTS = typer.Option(None, "--events", help="block events: enter, exit or enter,exit (default: $KVCONV_EVENTS when "
                       "set, else enter)")
_CLOCK_SYNC = typer.Option(None, "--clock-sync-ms", help="clock-sync period in ms (default 0: start and end pairs "
                           "only; a period slows graph replays, docs/TRACER.md)")
_NO_BUILD = typer.Option(False, "--no-build", help="fail instead of building native/ when missing")
_NO_VALIDATE = typer.Option(False, "--no-validate", help="skip validating the dump(s)")
_VERBOSE = typer.Option(0, "--verbose", "-v", count=True, help="tracer log level (repeat for more)")
_WRITES = typer.Option(False, "--writes", help="also record the KV slots each block of the target kernels writes (the "
                       "write-address canary: kvconv canary --writes; docs/CANARY.md)")
_CAPTURE_RANGE = typer.Option(
    None, "--capture-range", metavar="WHEN",
    help="record only from: profiler (cudaProfilerStart to cudaProfilerStop), graph (the first replay of a graph "
         "holding a target kernel: an engine's eager warm-up left out), launches:N (after N target launches), "
         "signal (SIGUSR1 starts, SIGUSR2 stops), nvtx:NAME (while an NVTX range named NAME is open); default "
         "none: from start (docs/TRACER.md)")
_CAPTURE_RANGE_END = typer.Option(None, "--capture-range-end", metavar="stop|repeat",
                                  help="at a range's end: stop recording for good (default) or repeat at the next "
                                       "start")
_ENGINE = typer.Option(None, "--engine", metavar="vllm|sglang",
                       help="load kvconv's plugin in the engine's processes: it registers the KV caches and each "
                            "step's slots, so --writes is judged against the engine's own mapping (docs/CANARY.md)")


# The command is what follows the options: everything after ``--`` (or after the first word that is not an option)
# is passed on as it is; before it, an unknown option is a usage error ("No such option: --kernal", exit 2), not the
# name of a command to run.
@app.command(context_settings={"allow_extra_args": True, "allow_interspersed_args": False},
             options_metavar="[OPTIONS] -- CMD ARGS...")
def record(
    ctx: typer.Context,
    kernel: list[str] | None = _KERNEL,
    output: str = output_option("dump path; %p = pid, %c = CUDA context index", "kvconv-%p.kvdump"),
    device_capacity: int | None = _DEVICE_CAPACITY,
    host_capacity: int | None = _HOST_CAPACITY,
    events: str | None = _EVENTS,
    clock_sync_ms: int | None = _CLOCK_SYNC,
    no_build: bool = _NO_BUILD,
    no_validate: bool = _NO_VALIDATE,
    verbose: int = _VERBOSE,
    force: bool = FORCE,
    writes: bool = _WRITES,
    capture_range: str | None = _CAPTURE_RANGE,
    capture_range_end: str | None = _CAPTURE_RANGE_END,
    engine: str | None = _ENGINE,
) -> None:
    """Run CMD under the kvconv tracer (CUDA_INJECTION64_PATH), then judge the run: every dump it wrote.

    Every CUDA process of the command writes its own dump: with a path without %p the first one writes it and every
    other (an engine's scheduler or worker) writes <stem>.pid<N><ext> beside it. Each is reported with its process.

    The run is every dump it wrote: each process's tracer dump and each probe dump of the engine plugins (--engine:
    <stem>.<engine>-<pid>.probe.kvdump beside -o, whatever KVCONV_PROBE_OUTPUT says). Each dump gets its line, then
    the run gets ONE verdict line, as kvconv validate of the -o path gives it.

    Exit code: the command's own if it failed (128+N when signal N killed it, as shells give), else the run's
    verdict: the worst over its dumps that checked something (1 failed: a bug caught in any dump, a probe dump's
    included; 5 incomplete), 4 (nothing checked) when none did (e.g. no kernel matched -k) or nothing that was asked
    (--writes, --engine) ran in any dump, 1 when no dump was written, else 0.

    Example: kvconv record -k reshape_and_cache_flash_kernel -o run.kvdump -- python3 decode.py

    Example: kvconv record -k reshape_and_cache_flash_kernel --writes --engine vllm -o run.kvdump -- python3 serve.py

    Example: kvconv record -k store_kvcache --capture-range graph -o run.kvdump -- python3 serve.py
    """
    from kvconv.capture.record import RecordOptions
    from kvconv.capture.record import record as run_record
    from kvconv.cli import err

    cmd = list(ctx.args)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    events = record_events(events)
    opts = RecordOptions(kernels=tuple(kernel) if kernel else RecordOptions.kernels, output=output,
                         device_capacity=device_capacity, host_capacity=host_capacity,
                         events=tuple(e.strip() for e in events.split(",") if e.strip()), clock_sync_ms=clock_sync_ms,
                         build=not no_build, validate=not no_validate, verbose=verbose, force=force, writes=writes,
                         capture_range=capture_range, capture_range_end=capture_range_end, engine=engine)
    res = run_record(cmd, options=opts)
    if not res.dumps:
        err(f"Error: the command wrote no dump matching {output} (did it use CUDA and a target kernel?)")
        raise typer.Exit(res.returncode or 1)
    for p in res.sealed:
        sys.stdout.write(f"{p}: sealed: its process was killed after every record it launched was in the file "
                         "(no end record: kvconv.capture.seal)\n")
    for i, p in enumerate(res.dumps):
        _report_dump(p, res.reports[i] if i < len(res.reports) else None)
    v = res.verdict  # the run's one verdict: every dump, tracer's and probe, judged as one (kvconv.check.verdict)
    if v is not None:
        from kvconv.cli.common import run_lines
        from kvconv.names import demangle_text

        if res.run is not None:
            lines = run_lines(res.run, always=True)
        else:
            from kvconv.check.verdict import LABELS

            lines = [f"run of {len(res.dumps)} dump{'s' * (len(res.dumps) != 1)}: {LABELS[v]}"]
        sys.stdout.write("".join(demangle_text(x) + "\n" for x in lines))
    from kvconv.check.verdict import EXIT_CODES

    raise typer.Exit(res.returncode or (EXIT_CODES[v] if v is not None else 0))


def _report_dump(p: str, rep) -> None:
    """Print one dump of the run (a process's tracer dump, a plugin's probe dump): its incidents, then path, process
    and verdict."""
    from kvconv.capture.record import process_of

    proc = process_of(p)
    who = ""
    if proc.get("pid") is not None:
        cmd = " ".join(str(a) for a in (proc.get("command") or []))
        who = f" (pid {proc['pid']}, parent {proc.get('ppid', '?')}: {cmd[:80]}{'...' if len(cmd) > 80 else ''})"
    if rep is None:
        sys.stdout.write(f"{p}{who}: written (not validated)\n")
        return
    from kvconv.check.verdict import line
    from kvconv.names import demangle_text

    incidents = getattr(rep, "incidents", None)  # findings of one cause on one line, as kvconv validate
    for text in ([line(i) for i in incidents] if incidents is not None
                 else [f.line() for f in rep.findings if f.severity != "info"]):
        sys.stdout.write(demangle_text(text) + "\n")  # kernel names demangled, as kvconv validate's text
    # the dump's verdict (kvconv.check.verdict); a structural-only report: valid or not
    from kvconv.check.verdict import LABELS

    v = getattr(rep, "verdict", "ok" if rep.valid else "failed")
    word = LABELS[v] + (f" ({_nothing_why(rep)})" if v == "nothing-checked" else "")
    sys.stdout.write(f"{p}{who}: {word}\n")


def _nothing_why(rep) -> str:
    """Why a dump of the run checked nothing, in a few words."""
    codes = {f.code for f in rep.findings}
    return "no target kernel ran here" if "coverage-none" in codes else "nothing of what was asked ran here"


def record_events(option: str | None) -> str:
    """The block events to record: ``--events``, else the exported ``KVCONV_EVENTS`` (docs/TRACER.md), else enter. A
    --events that contradicts an exported KVCONV_EVENTS is refused rather than one of them silently ignored."""
    import os

    from kvconv.format.errors import UsageError

    env = os.environ.get("KVCONV_EVENTS")
    if env is None or not env.strip():
        return option or "enter"
    if option is None:
        bad = {e.strip() for e in env.split(",") if e.strip()} - {"enter", "exit"}
        if bad:
            raise UsageError(f"KVCONV_EVENTS={env} in the environment is not a subset of enter, exit",
                             code="bad-events", hint="unset it, or export KVCONV_EVENTS=enter,exit")
        return env

    def kinds(v: str) -> set[str]:
        return {e.strip() for e in v.split(",") if e.strip()}

    if kinds(option) != kinds(env):
        raise UsageError(f"--events {option} contradicts KVCONV_EVENTS={env} in the environment", code="bad-events",
                         hint="drop one of them: unset KVCONV_EVENTS, or leave --events out")
    return option
