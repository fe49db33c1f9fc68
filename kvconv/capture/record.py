"""Run a command under the native tracer (``native/``) and check what it wrote.

    >>> from kvconv.capture.record import RecordOptions, tracer_env
    >>> env = tracer_env(RecordOptions(kernels=("reshape_and_cache_flash_kernel",), output="run.kvdump"),
    ...                  lib="/x/libkvconv_tracer.so")
    >>> env["CUDA_INJECTION64_PATH"], env["KVCONV_KERNELS"], env["KVCONV_OUTPUT"]
    ('/x/libkvconv_tracer.so', 'reshape_and_cache_flash_kernel', 'run.kvdump')

:func:`find_library` finds ``$KVCONV_TRACER_LIB`` (a prebuilt ``libkvconv_tracer.so``, its two fatbins beside it) or
``native/build/libkvconv_tracer.so`` of a source checkout, built with ``make -C native tracer`` when missing (an
installed wheel has no ``native/``: the error says how to build it); :func:`record` sets the environment, runs the
command, finds the dump(s) it wrote (``%p``/``%c`` in the output expand to pid and context) and validates each one.
"""

from __future__ import annotations

import fnmatch
import glob
import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from kvconv.format.errors import KvconvError, OutputError, UsageError
from kvconv.format.info import process_of

ROOT = Path(__file__).resolve().parents[2]  # kvconv/capture/record.py -> the checkout, whose native/ holds the tracer
NATIVE = ROOT / "native"
LIB_NAME = "libkvconv_tracer.so"
DEFAULT_KERNELS = ("reshape_and_cache_flash_kernel",)
EVENT_KINDS = ("enter", "exit")
ENGINES = ("vllm", "sglang")
_RANGE = re.compile(r"none|profiler|graph|signal|launches:\d+|nvtx:.+")


class TracerError(KvconvError):
    """The tracer library cannot be found or built."""

    code = "tracer-missing"


@dataclass(frozen=True)
class RecordOptions:
    """kernels: substrings of target kernel names (mangled or demangled). output: dump path (%p pid, %c context).
    device_capacity / host_capacity: records per context (None = tracer defaults 1,048,576 / 65,536).
    events: subset of ("enter", "exit"). clock_sync_ms: period of clock-sync pairs
    (None = the tracer's 0: start/end only).
    build: build the library when missing. validate: validate every dump written. verbose: tracer log level."""

    kernels: tuple[str, ...] = DEFAULT_KERNELS
    output: str = "kvconv-%p.kvdump"
    device_capacity: int | None = None
    host_capacity: int | None = None
    events: tuple[str, ...] = ("enter",)
    clock_sync_ms: int | None = None
    build: bool = True
    validate: bool = True
    verbose: int = 0
    force: bool = False  # replace an existing dump at a literal output path (one without %p / %c)
    writes: bool = False  # the write-address canary: KV slots written per block (KVCONV_WRITES=1, docs/CANARY.md)
    # which target launches are recorded (KVCONV_CAPTURE_RANGE, docs/TRACER.md): None/"none" from start, "profiler",
    # "graph", "launches:N", "signal", "nvtx:NAME"; capture_range_end "stop" (default) or "repeat"
    capture_range: str | None = None
    capture_range_end: str | None = None
    engine: str | None = None  # "vllm" / "sglang": kvconv's engine plugin registers caches and steps (KVCONV_ENGINE)

    def __post_init__(self) -> None:
        if not self.kernels or any(not k or "," in k for k in self.kernels):
            raise UsageError("--kernel patterns must be non-empty and hold no comma", code="bad-kernel")
        bad = [e for e in self.events if e not in EVENT_KINDS]
        if bad or not self.events:
            raise UsageError(f"--events must be a subset of {', '.join(EVENT_KINDS)}, not {','.join(bad)!r}",
                             code="bad-events")
        if self.capture_range is not None and not _RANGE.fullmatch(self.capture_range):
            raise UsageError(f"--capture-range must be none, profiler, graph, launches:N, signal or nvtx:NAME, not "
                             f"{self.capture_range!r}", code="bad-option")
        if self.capture_range_end not in (None, "stop", "repeat"):
            raise UsageError(f"--capture-range-end must be stop or repeat, not {self.capture_range_end!r}",
                             code="bad-option")
        if self.engine not in (None, *ENGINES):
            raise UsageError(f"--engine must be one of {', '.join(ENGINES)}, not {self.engine!r}", code="bad-option")
        for name in ("device_capacity", "host_capacity", "clock_sync_ms"):
            v = getattr(self, name)
            if v is not None and v < (0 if name == "clock_sync_ms" else 1):
                raise UsageError(f"{name.replace('_', '-')} must be positive, not {v}", code="bad-option")


@dataclass
class RecordResult:
    """What :func:`record` ran and found: the command's exit status, every dump of the run (each process's tracer
    dump, each engine plugin's probe dump), their validate reports and the run's one verdict."""

    returncode: int  # the command's exit status; 128+N when signal N killed it
    dumps: list[str] = field(default_factory=list)
    reports: list = field(default_factory=list)  # kvconv.check.validate.Report per dump (when validated)
    sealed: list = field(default_factory=list)  # dumps a killed process left live with nothing pending, now finished
    run: object = None  # the kvconv.run.Run of the dumps (when validated in full)

    @property
    def verdict(self) -> str | None:
        """The run's one verdict (:func:`kvconv.check.runs.judge`); None when not validated. A structural-only
        report (validate could not run here) counts as ok or failed."""
        if not self.reports:
            return None
        if self.run is not None:
            return self.run.verdict
        from kvconv.check.runs import judge

        return judge(self.dumps, [getattr(r, "verdict", "ok" if r.valid else "failed") for r in self.reports],
                     one=True)[0].verdict

    @property
    def valid(self) -> bool:
        """No error in the run: its verdict is neither failed nor unreadable."""
        return self.verdict not in ("failed", "unreadable")


ENV_LIB = "KVCONV_TRACER_LIB"  # a prebuilt libkvconv_tracer.so (its fatbins beside it)
# What the library loads from its own folder unless the variable names it. Without the patch the tracer runs with
# tracing off (checked here); without the clock-sync kernel it records no clock-sync pairs (the tracer warns).
PATCH = ("kvconv_patch.fatbin", "KVCONV_PATCH_FILE")
BUILD_HOWTO = (f"in a kvconv source checkout run: make -C native tracer (needs g++, nvcc 13 and pip install "
               f"'nvidia-cuda-sanitizer-api==13.0.*' 'nvidia-cuda-runtime==13.0.*'); it writes native/build/{LIB_NAME} "
               f"with kvconv_patch.fatbin and kvconv_clocksync.fatbin beside it; then "
               f"export {ENV_LIB}=/path/to/native/build/{LIB_NAME}")


def find_library(*, build: bool = True) -> Path:
    """The tracer library: ``$KVCONV_TRACER_LIB`` (a prebuilt one), else ``native/build/`` of the source checkout
    kvconv runs from, built there with make when missing. An installed wheel has no ``native/``: the error says how
    to build the library and point ``KVCONV_TRACER_LIB`` at it."""
    env = os.environ.get(ENV_LIB)
    if env:
        p = Path(env).expanduser()
        if not p.is_file():
            raise TracerError(f"{ENV_LIB} names no file", path=env, hint=f"unset it, or {BUILD_HOWTO}")
        _check_companions(p.resolve())
        return p.resolve()
    lib = NATIVE / "build" / LIB_NAME
    if lib.is_file() and (lib.parent / PATCH[0]).is_file():
        return lib
    if not (NATIVE / "Makefile").is_file():
        raise TracerError(f"no tracer library: this kvconv is installed without native/ and {ENV_LIB} is not set",
                          hint=BUILD_HOWTO)
    if not build:
        raise TracerError("the tracer is not built", path=str(lib),
                          hint=f"run: make -C {NATIVE} tracer (or set {ENV_LIB} to a prebuilt {LIB_NAME})")
    if shutil.which("make") is None:
        raise TracerError("cannot build the tracer: no make on PATH", path=str(NATIVE),
                          hint=f"install make and run: make -C {NATIVE} tracer, or set {ENV_LIB} to a prebuilt "
                               f"{LIB_NAME}")
    p = subprocess.run(["make", "-C", str(NATIVE), "tracer"], capture_output=True, text=True)
    if p.returncode != 0 or not lib.is_file():
        tail = (p.stdout + p.stderr).strip().splitlines()[-1:] or ["?"]
        raise TracerError(f"building the tracer failed: {tail[0]}", path=str(NATIVE),
                          hint="needs g++, nvcc 13 and nvidia-cuda-sanitizer-api; see docs/TRACER.md")
    return lib


def _check_companions(lib: Path) -> None:
    """The device patch the library loads from its own folder (unless KVCONV_PATCH_FILE names it): without it the
    tracer would run the command with tracing off, so refuse before running anything."""
    name, var = PATCH
    named = os.environ.get(var)
    where = Path(named).expanduser() if named else lib.parent / name
    if not where.is_file():
        raise TracerError(f"{name} is not beside {ENV_LIB}" if not named else f"{var} names no file",
                          path=str(where), hint=f"copy native/build/{name} next to {lib.name}, or set {var}")


def tracer_env(options: RecordOptions, *, lib: str | os.PathLike, base: dict | None = None) -> dict:
    """The environment that runs a command under the tracer."""
    env = dict(os.environ if base is None else base)
    env["CUDA_INJECTION64_PATH"] = str(lib)
    env["KVCONV_KERNELS"] = ",".join(options.kernels)
    env["KVCONV_OUTPUT"] = str(options.output)
    env["KVCONV_EVENTS"] = ",".join(options.events)
    if options.device_capacity is not None:
        env["KVCONV_DEVICE_CAPACITY"] = str(options.device_capacity)
    if options.host_capacity is not None:
        env["KVCONV_HOST_CAPACITY"] = str(options.host_capacity)
    if options.clock_sync_ms is not None:
        env["KVCONV_CLOCK_SYNC_MS"] = str(options.clock_sync_ms)
    if options.verbose:
        env["KVCONV_VERBOSE"] = str(options.verbose)
    if options.writes:
        env["KVCONV_WRITES"] = "1"
    if options.capture_range is not None:
        env["KVCONV_CAPTURE_RANGE"] = options.capture_range
    if (options.capture_range or "").startswith("nvtx:"):  # the tracer is also the NVTX injection (nvtx_range.cpp)
        other = env.get("NVTX_INJECTION64_PATH")
        if other and other != str(lib):
            raise UsageError(f"--capture-range {options.capture_range} needs NVTX_INJECTION64_PATH, which is already "
                             f"set to {other}", code="bad-option",
                             hint="unset NVTX_INJECTION64_PATH (another tool's NVTX injection: nsys?)")
        env["NVTX_INJECTION64_PATH"] = str(lib)
    if options.capture_range_end is not None:
        env["KVCONV_CAPTURE_RANGE_END"] = options.capture_range_end
    if options.engine is not None:
        env["KVCONV_ENGINE"] = options.engine
    # the engine plugins write their probe dumps beside -o, named after it, whatever KVCONV_PROBE_OUTPUT says: record
    # finds and judges them with the tracer's (kvconv.check.runs)
    env["KVCONV_RECORD"] = "1"
    # a literal output belongs to the first traced process of this run (native/src/config.cpp); one inherited from
    # an outer traced process would make this run's first process write a .pid<N> name
    env.pop("KVCONV_OUTPUT_OWNER", None)
    if "exit" in options.events:
        cupti = env.get("KVCONV_CUPTI_LIB") or find_cupti()
        if cupti:  # the calibration's untraced reference (native/src/calib_cupti.cpp); without it: raw durations only
            env["KVCONV_CUPTI_LIB"] = cupti
    return env


def find_cupti() -> str | None:
    """A libcupti beside the Python packages (torch's CUDA wheels bring nvidia-cuda-cupti) or in the CUDA toolkit, for
    the tracer's start-up calibration of durations; None when there is none (the tracer then records raw only)."""
    import glob
    import sys

    roots = [os.path.join(p, "nvidia", "*", "lib") for p in sys.path if p] + [
        os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), d) for d in ("extras/CUPTI/lib64", "lib64")]
    for r in roots:
        hits = sorted(glob.glob(os.path.join(r, "libcupti.so*")))
        if hits:
            return hits[0]
    return None


def output_globs(output: str) -> list[str]:
    """The globs that find every tracer dump an output can produce: the pattern itself and, for a literal path, the
    ``<stem>.pid<N><ext>`` names of the processes other than the first (native/src/config.cpp); the engine
    plugins' probe dumps beside them: :func:`kvconv.check.runs.globs`."""
    from kvconv.check.runs import globs

    return globs(output)[0]


def output_glob(output: str) -> str:
    """The glob that finds every file an output pattern can produce."""
    from kvconv.check.runs import pattern_glob

    return pattern_glob(output)


def check_output(output: str, *, force: bool = False) -> None:
    """Refuse, before anything runs, an output whose folder is missing or not writable, and an existing file at a
    literal path (no %p / %c) unless ``force``: the tracer would replace it (atomic.check_output's rule)."""
    if output_glob(output) == glob.escape(output):
        from kvconv.format.atomic import check_output as check_file

        check_file(output, kind="kvdump", force=force)
    folder = Path(output).expanduser().parent
    if not folder.is_dir():
        raise OutputError("output folder does not exist", path=str(folder), code="output-folder",
                          hint="create it or choose another -o")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise OutputError("output folder is not writable", path=str(folder), code="output-folder",
                          hint="choose another -o")
    if Path(output).is_dir():
        raise OutputError("output is a folder", path=output, code="output-folder", hint="name a file")


def record(cmd: list[str], *, options: RecordOptions = RecordOptions()) -> RecordResult:
    """Run ``cmd`` under the tracer; return its exit code, the dumps it wrote and their validation reports."""
    if not cmd:
        raise UsageError("no command to run (kvconv record [options] -- cmd args...)", code="no-command")
    check_output(options.output, force=options.force)
    lib = find_library(build=options.build)
    env = tracer_env(options, lib=lib)
    from kvconv.check.runs import globs

    tracer, probes = globs(options.output)  # every dump of the run: each process's, each plugin's probe dump
    patterns = tracer + probes
    before = {p: os.stat(p).st_mtime_ns for pat in patterns for p in glob.glob(pat)}
    start = time.time_ns()
    try:
        proc = subprocess.Popen(cmd, env=env)
    except FileNotFoundError:
        raise UsageError(f"command not found: {cmd[0]}", code="no-command") from None
    except PermissionError:
        raise UsageError(f"command not executable: {cmd[0]}", code="no-command") from None
    # Ctrl-C / SIGTERM go to the traced command (which writes its dump); we wait for it.
    old = {s: signal.signal(s, lambda signum, frame, p=proc: p.send_signal(signum))
           for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        rc = proc.wait()
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    dumps = sorted({p for pat in patterns for p in glob.glob(pat)
                    if ".tmp." not in p and (p not in before or os.stat(p).st_mtime_ns != before[p])
                    and os.stat(p).st_mtime_ns >= start - 2_000_000_000},
                   key=lambda p: (any(fnmatch.fnmatchcase(p, g) for g in probes), p))  # tracer dumps first
    _wait_for_writers(dumps)
    from kvconv.capture.seal import seal

    sealed = [p for p in dumps if seal(p) == "sealed"]  # an engine's SIGKILLed child (kvconv.capture.seal)
    # killed by signal N (Popen says -N): 128+N, as shells and nsys give (a raw -6 would exit 250)
    res = RecordResult(returncode=rc if rc >= 0 else 128 - rc, dumps=dumps, sealed=sealed)
    if options.validate and dumps:
        res.run, res.reports = validate_run(dumps)
    return res


def _wait_for_writers(dumps: list[str], *, timeout_s: float | None = None) -> None:
    """An engine's children can outlive the command record started (they end at their own pace after it returned):
    wait, up to ``KVCONV_RECORD_WAIT_S`` seconds (10), for each dump still live whose process still runs."""
    from kvconv.capture.seal import running

    limit = float(os.environ.get("KVCONV_RECORD_WAIT_S", "10")) if timeout_s is None else timeout_s
    deadline = time.monotonic() + limit
    for p in dumps:
        while time.monotonic() < deadline:
            proc = process_of(p)
            if proc.get("written_at") != "live" or not running(proc.get("pid")):
                break
            time.sleep(0.1)


@dataclass
class _StructuralReport:
    """What record reports when kvconv.check.validate cannot run here (a dependency is missing): a structural read."""

    path: str
    findings: list

    @property
    def valid(self) -> bool:
        return not any(f.severity == "error" for f in self.findings)


def validate_run(dumps: list[str]) -> tuple:
    """The run of ``dumps`` (:class:`kvconv.run.Run`, judged as one) and each dump's validate report; where validate
    cannot run here (e.g. jsonschema missing on a GPU image): no run, and a structural read of each dump."""
    try:
        from kvconv.run import Run

        run = Run(dumps, one_run=True)  # every dump this command wrote is its run's
        return run, [d.validation for d in run.dumps]
    except ModuleNotFoundError:
        return None, [validate_dump(p) for p in dumps]


def validate_dump(path: str):
    """kvconv.check.validate on one dump; where it cannot run (e.g. jsonschema missing on a GPU image), a structural
    read with :func:`kvconv.format.dump.open` and a warning saying so."""
    try:
        import kvconv

        return kvconv.open(path, whole_run=False).dumps[0].validation
    except ModuleNotFoundError as e:
        from kvconv.format import dump
        from kvconv.format.findings import Finding

        findings = [Finding("warning", "validate-unavailable",
                            f"full validation skipped ({e.name} is not installed); checked the structure only",
                            path=path)]
        try:
            with dump.open(path):
                pass
        except KvconvError as err:
            findings.append(Finding.from_error(err))
        return _StructuralReport(path, findings)
