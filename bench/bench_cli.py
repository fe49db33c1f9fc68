"""The CLI as users meet it: each command as a process (``python -m kvconv ...``), beside the same command run in this
process (imports done: what the process adds is start-up and imports) and the library call under it.

    .venv/bin/python bench/bench_cli.py                        # a generated ~70 MiB dump, 3 rounds
    .venv/bin/python bench/bench_cli.py --rounds 5 --size 256MiB
    .venv/bin/python /tmp/other/bench/bench_cli.py           # another tree (its kvconv/, schemas/, bench/): its code

Commands: perfetto, chrome, arrow, validate, report (each ``-q``, output in a scratch folder beside the dump). Per
command and round, interleaved (a busy moment of the machine hits every column alike): the process (of this tree,
and of ``--other``'s: an A/B of two trees in one window), ``kvconv.cli.main`` in this process, and the library path:
``write_*`` alone, ``write_*`` then ``validate()`` (what the converters' verdict line cost as a second pass),
``write_*`` with ``EmitOptions(verdict=True)`` (the verdict from the converter's own pass), ``validate()``. Each
cell: the best and worst wall time of the rounds and the best CPU time (user + system of every thread: what a loaded
machine disturbs least). Beside them: ``python -c pass`` and ``python -m kvconv --help`` (the floor every command
pays) and ``-X importtime``'s heaviest imports of one converter run. Load average and the memcpy probe before and
after (bench/_timing.quietness): on a shared machine read the ratios, not the seconds.

kvconv's bytecode is compiled first (``compileall``, as ``pip install`` does for a wheel): an editable install under
PYTHONDONTWRITEBYTECODE=1 compiles every module of kvconv in every process, 0.2-0.3 s of each command measured on
the 2-core development machine (``--no-compile`` measures that).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from _table import Col, print_table  # noqa: E402
from _timing import quietness  # noqa: E402

COMMANDS = ("perfetto", "chrome", "arrow", "validate", "report")
OUT = {"perfetto": "t.pftrace", "chrome": "t.json", "arrow": "tables", "report": "r.html"}


def argv(cmd: str, dump: Path, scratch: Path) -> list[str]:
    out = ["-o", str(scratch / OUT[cmd]), "--force"] if cmd in OUT else []
    return [cmd, str(dump), *out, "-q"]


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def process(tree: Path, args: list[str]) -> tuple[float, float]:
    """(wall, CPU) seconds of ``python -m kvconv ARGS`` run from ``tree`` (its kvconv first on the path); CPU: user +
    system of the child, all its threads (on a loaded machine the steadier of the two)."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    env.pop("KVCONV_DEBUG", None)
    c0, t = _children_cpu(), time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "kvconv", *args], cwd=str(tree), env=env, capture_output=True)
    dt, cpu = time.perf_counter() - t, _children_cpu() - c0
    if p.returncode not in (0, 1, 4, 5):  # a verdict's status is no failure of the bench
        raise SystemExit(f"kvconv {' '.join(args)}: exit {p.returncode}: {p.stderr.decode()[-800:]}")
    return dt, cpu


def measured(f, *a, **k) -> tuple[float, float]:
    """(wall, CPU) seconds of ``f(*a, **k)`` in this process (CPU: every thread of the process)."""
    c0, t = time.process_time(), time.perf_counter()
    f(*a, **k)
    return time.perf_counter() - t, time.process_time() - c0


def in_process(args: list[str]) -> tuple[float, float]:
    """(wall, CPU) seconds of ``kvconv.cli.main(ARGS)`` in this process (stdout and stderr swallowed)."""
    from kvconv.cli import main

    def go():
        try:
            main(args)
        except SystemExit:
            pass

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return measured(go)


def library(cmd: str, dump: Path, scratch: Path, *, verdict: bool = False) -> tuple[float, float] | None:
    """(wall, CPU) seconds of the library call under the command (None: report, whose page is the CLI's own work);
    ``verdict``: a converter computing validate's verdict in its own pass (EmitOptions.verdict, what the CLI asks)."""
    from kvconv.check.validate import validate
    from kvconv.emit import EmitOptions, write_arrow, write_chrome, write_perfetto

    f = {"perfetto": write_perfetto, "chrome": write_chrome, "arrow": write_arrow}.get(cmd)
    if f is not None:
        opts = EmitOptions(progress=False, force=True, verdict=verdict)
        return measured(f, [str(dump)], scratch / OUT[cmd], options=opts)
    if cmd == "validate":
        return measured(validate, str(dump))
    return None


def floor(tree: Path) -> tuple[float, float]:
    """(``python -c pass``, ``python -m kvconv --help``) wall seconds."""
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    bare = time.perf_counter() - t
    return bare, process(tree, ["--help"])[0]


def heaviest_imports(tree: Path, args: list[str], n: int = 8) -> list[tuple[str, float]]:
    """The ``n`` top-level imports of one run that took longest (cumulative ms, -X importtime)."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    p = subprocess.run([sys.executable, "-X", "importtime", "-m", "kvconv", *args], cwd=str(tree), env=env,
                       capture_output=True, text=True)
    top = []
    for line in p.stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        _, cum, name = line.split("|")
        if cum.strip().isdigit() and not name.startswith("  "):
            top.append((name.strip(), int(cum) / 1000))
    return sorted(top, key=lambda x: -x[1])[:n]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="70MiB", help="size of the generated dump (bench/gendump.py)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-compile", action="store_true", help="leave kvconv's bytecode as it is")
    ap.add_argument("--commands", default=",".join(COMMANDS))
    ap.add_argument("--other", type=Path, default=None, help="another tree (kvconv/, schemas/) whose processes run "
                    "alternately with this one's: an A/B of the CLI in one window")
    a = ap.parse_args()
    import gendump

    trees = [ROOT] + ([a.other.resolve()] if a.other else [])
    for tree in trees:
        if not a.no_compile:
            import compileall

            compileall.compile_dir(str(tree / "kvconv"), quiet=1)
        pyc = any((tree / "kvconv" / "__pycache__").glob("*.pyc"))
        print(f"{tree}: kvconv bytecode {'compiled' if pyc else 'NOT compiled (every process compiles kvconv)'}")
    print(f"PYTHONDONTWRITEBYTECODE={os.environ.get('PYTHONDONTWRITEBYTECODE', '')!r}")
    print(quietness("start"))
    scratch = Path(tempfile.mkdtemp(prefix="kvconv-bench-cli-", dir=str(_out())))
    try:
        dump = scratch / "run.kvdump"
        info = gendump.write(dump, gendump.GenOptions(size_bytes=gendump.parse_size(a.size)))
        print(f"dump: {dump.stat().st_size / 2**20:.1f} MiB, {info.get('device_event', 0):,} device events, "
              f"{info.get('graph_node', 0) + info.get('eager_launch', 0):,} host records (bench/gendump.py); "
              f"{a.rounds} rounds, interleaved; best (worst) seconds")
        run(a, trees, dump, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        print(quietness("end"))


LIB = ("lib", "lib+validate", "lib verdict")


def run(a, trees: list[Path], dump: Path, scratch: Path) -> None:
    cmds = a.commands.split(",")
    for c in cmds:  # warm: the page cache, this process's imports
        in_process(argv(c, dump, scratch))
    t: dict = {}
    floors: dict = {tree: [] for tree in trees}
    for _ in range(a.rounds):
        for tree in trees:
            floors[tree].append(floor(tree))
        for c in cmds:
            for k, tree in enumerate(trees):
                t.setdefault((c, f"proc{k}"), []).append(process(tree, argv(c, dump, scratch)))
            t.setdefault((c, "inproc"), []).append(in_process(argv(c, dump, scratch)))
            _library_round(t, c, dump, scratch)
    for k, tree in enumerate(trees):
        print(f"tree {k} = {tree}: python -c pass {min(f[0] for f in floors[tree]):.3f} s; python -m kvconv --help "
              f"{min(f[1] for f in floors[tree]):.3f} s")
    _table(t, cmds, len(trees))
    for tree in trees:
        print(f"heaviest imports of `kvconv perfetto`, tree {tree} (cumulative ms): " + ", ".join(
            f"{n} {ms:.0f}" for n, ms in heaviest_imports(tree, argv("perfetto", dump, scratch))))


def _library_round(t: dict, c: str, dump: Path, scratch: Path) -> None:
    """The library calls of one round: the converter alone, then with a separate validate after it (the CLI's work
    before the verdict came from the converter's pass), then computing the verdict in its own pass."""
    lib = library(c, dump, scratch)
    if lib is None:
        return
    t.setdefault((c, "lib"), []).append(lib)
    if c in ("perfetto", "chrome", "arrow"):
        v = library("validate", dump, scratch)
        t.setdefault((c, "lib+validate"), []).append((lib[0] + v[0], lib[1] + v[1]))
        t.setdefault((c, "lib verdict"), []).append(library(c, dump, scratch, verdict=True))


def _table(t: dict, cmds: list, n_trees: int) -> None:
    def cell(c, k):
        v = t.get((c, k))
        if not v:
            return "-"
        wall, cpu = [x[0] for x in v], [x[1] for x in v]
        return f"{min(wall):.3f} ({max(wall):.3f}) {min(cpu):.3f}"

    cols = [Col("command", "9")] + [Col(f"process tree {k}", ">21") for k in range(n_trees)] + [
        Col("kvconv.cli.main", ">21")] + [Col(k, ">21") for k in LIB]
    rows = [(c, *(cell(c, f"proc{k}") for k in range(n_trees)), cell(c, "inproc"), *(cell(c, k) for k in LIB))
            for c in cmds]
    print("cells: best wall (worst wall) best CPU, seconds")
    print_table(cols, rows)


def _out() -> Path:
    p = ROOT / "bench" / "out"  # git-ignored
    p.mkdir(parents=True, exist_ok=True)
    return p


if __name__ == "__main__":
    main()
