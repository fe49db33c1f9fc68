"""Shared test plumbing: the real CLI (in-process, or as a subprocess), the --update-goldens switch, GPU skipping,
the tiers (``slow`` tests run with ``--slow`` only), Perfetto's trace processor binary, and the check that the suite
leaves < 100 MB."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import shutil
import subprocess
import sys
import tempfile
import traceback
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
LEFTOVER_LIMIT = 100 * 2**20  # what the suite may leave in pytest's base temp folder (issue 30)
LEFTOVER_KEY = pytest.StashKey[int]()


def trace_processor_bin() -> str | None:
    """Perfetto's trace_processor_shell: $KVCONV_TRACE_PROCESSOR, else ``../shared/tools/trace_processor_shell`` beside
    the checkout (where CI's fresh clone finds it), else None (tests that need it skip)."""
    env = os.environ.get("KVCONV_TRACE_PROCESSOR")
    if env:
        return env
    shared = ROOT.parent / "shared" / "tools" / "trace_processor_shell"
    return str(shared) if os.access(shared, os.X_OK) else None


NO_TRACE_PROCESSOR = ("no trace_processor binary: set KVCONV_TRACE_PROCESSOR=/path/to/trace_processor_shell or put it "
                      "at ../shared/tools/ (no package on PyPI or Debian ships one, and the perfetto package's "
                      "download needs the internet)")


class _TraceProcessorServer:
    """Perfetto's trace_processor_shell serving HTTP on a free port of 127.0.0.1, polled every 10 ms until it
    answers (perfetto's own launcher, TraceProcessor(config=TraceProcessorConfig(bin_path=...)), sleeps 1 s before
    its second look: ~1 s of every trace loaded, ~30 s of the fast tier)."""

    def __init__(self, binary: str) -> None:
        import socket
        import time
        import urllib.error
        import urllib.request

        for _ in range(5):  # a port taken between its pick and the shell's bind: the shell exits, try another
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                self.port = sock.getsockname()[1]
            self.proc = subprocess.Popen([binary, "-D", "--http-port", str(self.port), "--no-ftrace-raw"],
                                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL, start_new_session=True)
            deadline = time.monotonic() + 30
            while self.proc.poll() is None and time.monotonic() < deadline:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/status", timeout=5):
                        return
                except (urllib.error.URLError, ConnectionError):
                    time.sleep(0.01)
            self.close()
        raise RuntimeError(f"{binary} did not start serving HTTP")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@contextlib.contextmanager
def trace_processor(trace: str | os.PathLike, binary: str | None = None):
    """Perfetto's Python TraceProcessor with ``trace`` loaded into Perfetto's real trace_processor_shell
    (trace_processor_bin()); the test skips, saying why, without the binary."""
    binary = binary or trace_processor_bin()
    if not binary:
        pytest.skip(NO_TRACE_PROCESSOR)
    from perfetto.trace_processor import TraceProcessor

    server = _TraceProcessorServer(binary)
    try:
        tp = TraceProcessor(trace=str(trace), remote=f"127.0.0.1:{server.port}")
        try:
            yield tp
        finally:
            tp.close()
    finally:
        server.close()


def load_script(path: Path, name: str | None = None):
    """Import a file that is not in a package (a fixture generator, a tool, a bench script) as a module, registered
    in ``sys.modules`` (dataclasses look their module up there)."""
    name = name or f"kvconv_script_{path.parent.name}_{path.stem}".replace("-", "_")
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def pytest_addoption(parser):
    parser.addoption("--update-goldens", action="store_true", default=False,
                     help="rewrite the expected outputs of the golden cases under fixtures/ instead of comparing")
    parser.addoption("--slow", action="store_true", default=False,
                     help="also run the slow tier (tests marked slow: scale, memory bounds, fuzz, packaging, browser, "
                          "native builds); without it they are deselected")


@pytest.fixture
def update_goldens(request) -> bool:
    return bool(request.config.getoption("--update-goldens"))


def _has_gpu() -> bool:
    return shutil.which("nvidia-smi") is not None and subprocess.run(
        ["nvidia-smi", "-L"], capture_output=True).returncode == 0


def pytest_collection_modifyitems(config, items):
    if not config.getoption("--slow"):
        slow = [i for i in items if "slow" in i.keywords]
        if slow:
            config.hook.pytest_deselected(items=slow)
            items[:] = [i for i in items if "slow" not in i.keywords]
    if _has_gpu():
        return
    skip = pytest.mark.skip(reason="no NVIDIA GPU on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def _size(path: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(dirpath, f)).st_size
            except OSError:
                pass
    return total


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session, exitstatus):
    """The suite's leftovers: at the end of the session (before pytest removes its base temp folder, which it does only
    when every test passed: tmp_path_retention_policy = "failed"), everything still in the base temp folder (module
    fixtures' folders, failed tests' folders) must stay under LEFTOVER_LIMIT, so even a failing run leaves < 100 MB:
    big dumps go in folders their fixture or test removes. Over the limit the session fails (exit 1), naming the
    biggest folders."""
    factory = getattr(session.config, "_tmp_path_factory", None)
    base = getattr(factory, "_basetemp", None)
    if base is None or not Path(base).is_dir():
        return
    size = _size(Path(base))
    session.config.stash[LEFTOVER_KEY] = size
    if size < LEFTOVER_LIMIT:
        return
    big = sorted(((_size(p), p.name) for p in Path(base).iterdir() if p.is_dir()), reverse=True)[:5]
    msg = (f"ERROR: the suite left {size / 2**20:.1f} MiB in {base} (limit {LEFTOVER_LIMIT / 2**20:.0f} MiB): "
           + ", ".join(f"{n} {b / 2**20:.1f} MiB" for b, n in big))
    tr = session.config.pluginmanager.get_plugin("terminalreporter")
    if tr is not None:
        tr.write_line(msg, red=True)
    else:
        print(msg, file=sys.stderr)
    if session.exitstatus in (0, 5):
        session.exitstatus = 1


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str


def _cli_env(env: dict | None) -> dict:
    """The environment a test's command runs in: the test process's, kvconv importable, no KVCONV_DEBUG, wide
    lines, the progress ticker quiet (tests of progress set their own interval), then the test's own variables."""
    e = dict(os.environ)
    e.pop("KVCONV_DEBUG", None)
    e["PYTHONPATH"] = str(ROOT) + os.pathsep + e.get("PYTHONPATH", "")
    e["COLUMNS"] = "200"
    # Progress lines on a non-terminal come every 2 s: on a loaded machine a command that fails after 2 s would add
    # one before its Error line. Tests of progress set their own interval.
    e["KVCONV_PROGRESS_INTERVAL"] = "3600"
    if env:
        e.update(env)
    return e


# KVCONV_TEST_SUBPROCESS=1: every run_cli a child process, as before the fast tier ran them in-process (issue 30)
ALWAYS_SUBPROCESS = os.environ.get("KVCONV_TEST_SUBPROCESS", "") not in ("", "0")


def run_cli(*args: str, cwd: str | os.PathLike | None = None, env: dict | None = None, timeout: float = 300,
            subprocess_: bool = False) -> Result:
    """Run ``kvconv ARGS`` as a user would, and return its exit code and output.

    By default in this process, through ``kvconv.cli.main`` (what the ``kvconv`` script runs) with the command's
    environment, working folder, stdout and stderr of its own (saves the ~0.5-1 s start-up of a child per command:
    the fast tier's budget, issue 30). ``subprocess_=True`` (or KVCONV_TEST_SUBPROCESS=1 for all) runs ``python -m
    kvconv ARGS`` as a child process: for what is about the process boundary (exit of a child, signals, fds)."""
    if subprocess_ or ALWAYS_SUBPROCESS:
        p = subprocess.run([sys.executable, "-m", "kvconv", *map(str, args)], cwd=cwd, env=_cli_env(env),
                           capture_output=True, text=True, timeout=timeout)
        return Result(p.returncode, p.stdout, p.stderr)
    return _run_in_process([str(a) for a in args], cwd, _cli_env(env))


def _decoded(raw: bytes) -> str:
    # as subprocess.run(text=True) reads a child's output: UTF-8, universal newlines
    return io.TextIOWrapper(io.BytesIO(raw), encoding="utf-8", errors="replace").read()


class _Captured(io.BytesIO):
    """A stream's bytes, kept when the command closes the stream."""

    def close(self) -> None:
        pass


_CLICK_GROUPS: dict = {}


def _click_group(get_command):
    """typer.main.get_command, once per app and set of registered commands: typer rebuilds the click group from the
    commands' signatures on every call (~50 ms, most of a small command's run); a new command (a registered
    format) makes a new key, so the group is rebuilt then."""
    def cached(typer_instance):
        key = (id(typer_instance), id(typer_instance.registered_callback),
               tuple(map(id, typer_instance.registered_commands)), tuple(map(id, typer_instance.registered_groups)))
        if key not in _CLICK_GROUPS:
            _CLICK_GROUPS[key] = (typer_instance, get_command(typer_instance))
        return _CLICK_GROUPS[key][1]

    return cached


def _run_in_process(argv: list[str], cwd, env: dict) -> Result:
    import typer.main

    from kvconv.cli import main

    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    saved_out, saved_err = sys.stdout, sys.stderr
    out_b, err_b = _Captured(), _Captured()
    # what a child's streams are on pipes: UTF-8, stdout strict (kvconv.cli.main sets backslashreplace itself),
    # stderr backslashreplace
    out = io.TextIOWrapper(out_b, encoding="utf-8", errors="strict")
    err = io.TextIOWrapper(err_b, encoding="utf-8", errors="backslashreplace", line_buffering=True)
    os.environ.clear()
    os.environ.update(env)
    get_command = typer.main.get_command
    typer.main.get_command = _click_group(get_command)
    saved_tempdir, tempfile.tempdir = tempfile.tempdir, None  # TMPDIR read again from the command's environment
    try:
        if cwd is not None:
            os.chdir(cwd)
        sys.stdout, sys.stderr = out, err
        with warnings.catch_warnings():
            # a child's warning filters (Python's defaults), not pytest's (which show every DeprecationWarning)
            warnings.resetwarnings()
            for category in (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning):
                warnings.simplefilter("ignore", category)
            try:
                code = main(argv)
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            except BaseException:  # noqa: BLE001 - what a child would print before exiting 1
                traceback.print_exc(file=err)
                code = 1
        for s in (out, err):
            try:
                s.flush()
            except ValueError:  # closed by the command
                pass
    finally:
        typer.main.get_command = get_command
        tempfile.tempdir = saved_tempdir
        sys.stdout, sys.stderr = saved_out, saved_err
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
    return Result(code, _decoded(out_b.getvalue()), _decoded(err_b.getvalue()))


@pytest.fixture
def cli():
    return run_cli


def track_paths(trace) -> dict[int, str]:
    """A Perfetto trace's track uuid -> "root / child / ... / track" from its track descriptors (what the UI nests)."""
    descs = {p.track_descriptor.uuid: p.track_descriptor for p in trace.packet if p.HasField("track_descriptor")}

    def path(u):
        names = []
        while u in descs:
            names.append(descs[u].name)
            u = descs[u].parent_uuid if descs[u].HasField("parent_uuid") else None
        return " / ".join(reversed(names))

    return {u: path(u) for u in descs}
