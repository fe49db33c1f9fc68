"""The kv_decode workload, then an end of the process chosen on the command line: for the tracer's death tests
(issue 20: the dump survives any end of the traced process).

    python3 native/workloads/die.py CASE [kv_decode args...]

CASE: normal (return 0), exit-code (sys.exit(3)), exception (uncaught RuntimeError), os-exit (os._exit(0), what
forked multiprocessing children do), os-exit-now (torch.cuda.synchronize(); os._exit(0) right after the last target
launch, before the summary line: inside the tracer's flush period, so its last events are never copied out),
abort (os.abort(): SIGABRT), sigsegv (SIGSEGV raised in the program), sigkill
(SIGKILL: nothing in the process runs), illegal-address (a non-target kernel writes to an unmapped address: CUDA
error 700 on the next synchronize, raised as an uncaught exception).

The kv_decode summary line (JSON, with ``expected.device_events``: the blocks the target kernel was launched with) is
printed and flushed before the end, so the number of events launched is known whatever happens next.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import kv_decode  # noqa: E402

CASES = ("normal", "exit-code", "exception", "os-exit", "os-exit-now", "abort", "sigsegv", "sigkill", "illegal-address")

BAD_SRC = r"""
extern "C" __global__ void kvconv_test_bad_store(unsigned long long* p) { p[threadIdx.x] = 1; }
"""


def illegal_address() -> None:
    import cupy as cp
    import numpy as np
    import torch

    fn = cp.RawModule(code=BAD_SRC).get_function("kvconv_test_bad_store")
    with cp.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):
        fn((1,), (32,), (np.uint64(0x10),))
    torch.cuda.synchronize()  # raises: an illegal memory access was encountered


def _exit_now() -> None:
    import torch

    torch.cuda.synchronize()
    os._exit(0)


def main(argv: list[str]) -> int:
    case = argv[0] if argv else "normal"
    if case not in CASES:
        print(f"die.py: CASE must be one of {', '.join(CASES)}", file=sys.stderr)
        return 2
    if case == "os-exit-now":
        kv_decode.END_HOOK = _exit_now
    rc = kv_decode.main(argv[1:])
    sys.stdout.flush()
    print(f"die.py: ending with {case}", flush=True)
    if case == "exit-code":
        sys.exit(3)
    if case == "exception":
        raise RuntimeError("die.py: an uncaught exception")
    if case == "os-exit":
        os._exit(0)
    if case == "abort":
        os.abort()
    if case == "sigsegv":
        os.kill(os.getpid(), signal.SIGSEGV)
    if case == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if case == "illegal-address":
        illegal_address()
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
