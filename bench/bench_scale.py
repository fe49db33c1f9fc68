"""Peak RSS and time of every long command on one generated dump, beside the page-cache read of the same file.

    .venv/bin/python bench/bench_scale.py                        # 1 GiB dump (bench/gendump.py), all commands
    .venv/bin/python bench/bench_scale.py --size 10GiB --mem-limit 16GiB
    .venv/bin/python bench/bench_scale.py --commands validate,reconcile --keep bench/out/big.kvdump

Each command runs as the CLI does (``python -m kvconv CMD DUMP ... -q``) in a child process; its peak RSS is the
child's own ``ru_maxrss`` (``os.wait4``: RUSAGE_CHILDREN of that one child), its time the child's wall time minus
the interpreter start (``python -m kvconv --help``, measured here). The baseline, in this process: reading the file
through the page cache (second read, 16 MiB at a time); each command's time is printed as a ratio of it. Goals
(issue 13): peak RSS <= 512 MiB for every command on a 10 GiB dump; validate (which reconciles) <= 15x the read.

``--mem-limit`` caps each child's data segment (RLIMIT_DATA: anonymous memory, not the mmap of the dump), so that a
command that would need more than the machine has fails alone ("out of memory", reported) instead of pushing the
shared machine into swap or the OOM killer. The generated dump and the outputs live under bench/out/ (ignored) or
``--dir``, and are deleted at the end unless ``--keep`` names where to keep the dump.
"""

from __future__ import annotations

import argparse
import json
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

import gendump  # noqa: E402
from _timing import best, quietness, timed  # noqa: E402

COMMANDS = {
    "validate": lambda d, o: ["validate", d],
    "validate-structure": lambda d, o: ["validate", d, "--no-reconcile"],
    "reconcile": lambda d, o: ["reconcile", d],
    "reconcile-ordered": lambda d, o: ["reconcile", d, "--join", "ordered"],  # the chunked window join (no %gridid)
    "canary": lambda d, o: ["canary", d],
    "perfetto": lambda d, o: ["perfetto", d, "-o", f"{o}.pftrace"],
    "chrome": lambda d, o: ["chrome", d, "-o", f"{o}.json"],
    "arrow": lambda d, o: ["arrow", d, "-o", f"{o}-arrow"],
}


def page_cache_read(path: Path) -> float:
    def read():
        with open(path, "rb", buffering=0) as f:
            buf = bytearray(16 << 20)
            while f.readinto(buf):
                pass

    read()
    return best(3, read)[0]


def child(args: list[str], mem_limit: int | None) -> tuple[float, int, int, str]:
    """(wall seconds, peak RSS bytes, exit status, stderr tail) of ``python -m kvconv ARGS``."""
    def limit():
        if mem_limit:
            resource.setrlimit(resource.RLIMIT_DATA, (mem_limit, mem_limit))

    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    t = time.perf_counter()
    p = subprocess.Popen([sys.executable, "-m", "kvconv", *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         preexec_fn=limit, env=env, cwd=str(ROOT))
    err = p.stderr.read()
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t
    p.returncode = os.waitstatus_to_exitcode(status)
    return wall, ru.ru_maxrss * 1024, p.returncode, err.decode(errors="replace")[-400:]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=gendump.parse_size, default=1 << 30, help="dump size, e.g. 10GiB (default 1GiB)")
    ap.add_argument("--commands", default=",".join(COMMANDS), help=f"comma-separated, of {', '.join(COMMANDS)}")
    ap.add_argument("--canary-buffers", type=int, default=3, help="canary records per step in the dump")
    ap.add_argument("--exits", action="store_true", help="block-exit events too")
    ap.add_argument("--mem-limit", type=gendump.parse_size, default=8 << 30,
                    help="RLIMIT_DATA of each command (default 8GiB; 0: none)")
    ap.add_argument("--dir", default=None, help="scratch folder (default: one under bench/out/)")
    ap.add_argument("--keep", default=None, help="keep the generated dump at this path (and reuse it if there)")
    ap.add_argument("--json", default=None, help="also write the figures to this JSON file")
    a = ap.parse_args()
    cmds = [c for c in a.commands.split(",") if c]
    for c in cmds:
        if c not in COMMANDS:
            ap.error(f"unknown command {c!r}")
    out_root = ROOT / "bench" / "out"
    out_root.mkdir(parents=True, exist_ok=True)
    scratch = Path(a.dir or tempfile.mkdtemp(prefix="scale-", dir=str(out_root)))
    scratch.mkdir(parents=True, exist_ok=True)
    src = Path(a.keep) if a.keep else scratch / "scale.kvdump"
    free = shutil.disk_usage(src.parent).free
    print(quietness("start"))
    try:
        if not src.exists():
            if free < 2.5 * a.size:
                sys.exit(f"not enough disk under {src.parent}: {free / 2**30:.1f} GiB free for a "
                         f"{a.size / 2**30:.1f} GiB dump and its outputs")
            t, tot = timed(gendump.write, src, gendump.GenOptions(size_bytes=a.size, exits=a.exits,
                                                                  canary_buffers=a.canary_buffers))
            print(f"generated {src} in {t:.1f} s: {tot['bytes'] / 2**30:.2f} GiB, {tot['device_event']:,} device "
                  f"events, {tot['graph_node'] + tot['eager_launch']:,} host records, {tot.get('canary', 0):,} "
                  f"canary records, {tot['contexts']} contexts")
        size = src.stat().st_size
        t_read = page_cache_read(src)
        start = min(child(["--help"], None)[0] for _ in range(3))
        print(f"baseline: page-cache read of the {size / 2**30:.2f} GiB file {t_read:.2f} s "
              f"({size / t_read / 1e9:.1f} GB/s); interpreter start + imports {start:.2f} s (subtracted)")
        print(f"{'command':<20} {'exit':>4} {'time s':>8} {'x read':>7} {'peak RSS':>10} {'RSS/dump':>9}")
        rows = []
        for c in cmds:
            o = scratch / f"out-{c}"
            wall, rss, rc, err = child([str(x) for x in COMMANDS[c](str(src), str(o))] + (
                ["-q"] if c in ("perfetto", "chrome", "arrow") else []), a.mem_limit or None)
            t = max(wall - start, 0.0)
            note = "" if rc in (0, 1) else f"  FAILED: {err.strip().splitlines()[-1] if err.strip() else rc}"
            print(f"{c:<20} {rc:>4} {t:>8.2f} {t / t_read:>6.1f}x {rss / 2**20:>8.0f} MiB {rss / size:>8.2f}x"
                  f"{note}", flush=True)
            rows.append({"command": c, "exit": rc, "seconds": round(t, 3), "x_read": round(t / t_read, 2),
                         "peak_rss_mib": round(rss / 2**20, 1), "load_average": os.getloadavg()})
            for p in scratch.glob(f"out-{c}*"):
                shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink()
        if a.json:
            Path(a.json).write_text(json.dumps({"dump_bytes": size, "page_cache_read_s": round(t_read, 4),
                                                "interpreter_start_s": round(start, 3), "commands": rows}, indent=1)
                                    + "\n")
    finally:
        if not a.keep:
            src.unlink(missing_ok=True)
        if not a.dir:
            shutil.rmtree(scratch, ignore_errors=True)
        print(quietness("end"))


if __name__ == "__main__":
    main()
