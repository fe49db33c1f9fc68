"""An engine's process shape around kv_decode.py, for the tracer's multi-process and capture-range tests (issue 44).

A front process starts one worker with multiprocessing and ends it the way engines do:

- ``--start fork --end sigterm``: vLLM v1's engine core. The front never touches CUDA before the fork; the worker
  catches SIGTERM by raising SystemExit (vLLM's handler) and, being a forked multiprocessing child, ends with
  ``os._exit``: no atexit runs.
- ``--start spawn --end sigkill``: SGLang's scheduler. The front initialises CUDA first (its own dump, no target
  kernel), the worker is SIGKILLed once done (SGLang's ``kill_process_tree``).
- ``--end normal``: the worker returns.

The worker runs ``kv_decode.main`` with the arguments after ``--`` (``--warmup N`` floods the buffer eagerly before
the graph, as an engine's memory profiling does). Prints one JSON line: the front's and worker's pids and how it ended.

    kvconv record -k reshape_and_cache_flash_kernel -o run.kvdump --capture-range graph -- \\
        python3 native/workloads/engine_procs.py --start spawn --end sigkill -- --warmup 200 --prefill 512
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def worker(argv: list[str], done, hold: bool) -> None:
    def on_term(signum, frame):  # vLLM's engine core: SIGTERM ends the busy loop by SystemExit
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, on_term)
    import kv_decode

    rc = kv_decode.main(argv)
    done.set()
    if hold:  # the engine's idle loop: waits to be ended by the front
        while True:
            time.sleep(0.05)
    sys.exit(rc)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--start", choices=("fork", "spawn"), default="spawn")
    ap.add_argument("--end", choices=("normal", "sigterm", "sigkill"), default="normal")
    ap.add_argument("rest", nargs=argparse.REMAINDER, help="-- kv_decode.py arguments")
    args = ap.parse_args()
    rest = args.rest[1:] if args.rest[:1] == ["--"] else args.rest
    if args.start == "spawn":
        import torch

        torch.zeros(1, device="cuda")  # the front's own CUDA context (no target kernel): SGLang's parent
    ctx = mp.get_context(args.start)
    done = ctx.Event()
    p = ctx.Process(target=worker, args=(rest, done, args.end != "normal"))
    p.start()
    done.wait(timeout=300)
    time.sleep(0.2)  # the engine idles a moment before it is shut down
    if args.end == "sigterm":
        p.terminate()
        p.join(5)  # vLLM: terminate, wait 5 s, then kill
        if p.is_alive():
            p.kill()
    elif args.end == "sigkill":
        p.kill()
    p.join()
    print(json.dumps({"front_pid": os.getpid(), "worker_pid": p.pid, "start": args.start, "end": args.end,
                      "worker_exitcode": p.exitcode}), flush=True)
    return 0 if args.end != "normal" or p.exitcode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
