"""Host cost of the calls the value probe's fused path makes before a replay, on the machine it runs on:
median us per call over 2,000 calls each. A slot graph of 80 caches x 64 slots (the bench's step).

    PYTHONPATH=. python3 bench/value_digest_micro_host.py
"""

from __future__ import annotations

import statistics
import time

import numpy as np
import torch

from kvconv.capture.probe._digest_triton import SlotDigests


def per_call(fn, n: int = 2000, after=None) -> float:
    ns = []
    for _ in range(n):
        t = time.perf_counter_ns()
        fn()
        ns.append(time.perf_counter_ns() - t)
        if after:
            after()
    return statistics.median(ns) / 1e3


def main() -> None:
    dev = torch.device("cuda", 0)
    pool = torch.zeros(80, 1024, 16, 1024, dtype=torch.bfloat16, device=dev)
    groups = [(np.arange(80), np.array([pool[i].data_ptr() for i in range(80)], np.int64), 2048)]
    g = SlotDigests(dev, groups, [64])
    slots = [np.arange(64, dtype=np.int64) * 16]
    ev = torch.cuda.Event()
    ev.record()
    torch.cuda.synchronize()
    sync = torch.cuda.synchronize
    host = np.arange(64)
    rows = {
        "SlotDigests.run (80 caches x 64 slots)": per_call(lambda: g.run(slots), after=sync),
        "CUDAGraph.replay": per_call(g.graph.replay, after=sync),
        "Event.record()": per_call(ev.record),
        "Event.synchronize (done)": per_call(ev.synchronize),
        "Event.query (done)": per_call(ev.query),
        "torch.cuda.current_stream()": per_call(torch.cuda.current_stream),
        "torch.cuda.current_device()": per_call(torch.cuda.current_device),
        "np.flatnonzero(mask of 64)": per_call(lambda: np.flatnonzero((host >= 0) & (host < 99))),
        "np.asarray(list of 64 ints)": per_call(lambda: np.asarray(list(range(64)), np.int64)),
    }
    for k, v in rows.items():
        print(f"{k:42s} {v:7.2f} us")


if __name__ == "__main__":
    main()
