"""The tracer's duration bias against CUPTI on one short kernel (issue 27 item 5): a paged-KV append of ``--rows``
blocks (one per batch row, K and V rows of ``--width`` halves into their slots, as ``reshape_and_cache_flash``),
launched ``--launches`` times eagerly on torch's stream.

    python3 native/workloads/calib_check.py --profile --json cupti.json          # untraced, CUPTI durations
    KVCONV_EVENTS=enter,exit kvconv record -k paged_append_calib -o t.kvdump -- \\
        python3 native/workloads/calib_check.py                                   # traced: kvconv's durations
    kvconv reconcile t.kvdump                                                     # raw and corrected medians

``--profile``: the launches under torch.profiler (CUPTI activity records), the kernel's durations read from the
profiler's trace (``dur``, us) and their median printed (traced and profiled at once, CUPTI gets no records: it cannot
subscribe beside the Sanitizer). Then 200 more launches, each between two CUDA events, queued behind a spin so that
they run back to back (``events``), and 200 at the host's rate (``events_unprimed``); then the tracer's calibration
reference on this kernel (``stamps``: the stream time it adds between two one-thread %globaltimer stamp kernels, back
to back). Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile

KERNEL = r"""
extern "C" __global__ void paged_append_calib(const unsigned short* __restrict__ k,
                                              const unsigned short* __restrict__ v, unsigned short* __restrict__ kc,
                                              unsigned short* __restrict__ vc, const long long* __restrict__ slots,
                                              int n) {
  const long long slot = slots[blockIdx.x];
  if (slot < 0) return;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    kc[slot * n + i] = k[(long long)blockIdx.x * n + i];
    vc[slot * n + i] = v[(long long)blockIdx.x * n + i];
  }
}
"""
NAME = "paged_append_calib"
STAMP = r"""
extern "C" __global__ void stamp(unsigned long long* out, int i) {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  out[i] = t;
}
"""


def cupti_durations(trace_path: str) -> list[float]:
    """The kernel's durations (ns) in a torch.profiler Chrome trace."""
    with open(trace_path) as f:
        events = json.load(f).get("traceEvents", [])
    return [float(e["dur"]) * 1000.0 for e in events
            if e.get("cat") == "kernel" and NAME in str(e.get("name", "")) and "dur" in e]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--width", type=int, default=1024, help="halves per K (and V) row")
    ap.add_argument("--threads", type=int, default=128)
    ap.add_argument("--launches", type=int, default=800)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    import cupy as cp
    import numpy as np
    import torch

    fn = cp.RawModule(code=KERNEL).get_function(NAME)
    R, W = args.rows, args.width
    k = torch.randn(R, W, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(R, W, device="cuda", dtype=torch.bfloat16)
    kc = torch.zeros(64 * 16, W, device="cuda", dtype=torch.bfloat16)
    vc = torch.zeros_like(kc)
    slots = torch.tensor([(1 + 2 * r) * 16 for r in range(R)], device="cuda", dtype=torch.int64)
    stream = torch.cuda.current_stream()

    def launch():
        with cp.cuda.ExternalStream(stream.cuda_stream):
            fn((R,), (args.threads,), (k.data_ptr(), v.data_ptr(), kc.data_ptr(), vc.data_ptr(), slots.data_ptr(),
                                       np.int32(W)))

    for _ in range(20):  # warm-up: module load, the tracer's patching and calibration
        launch()
    torch.cuda.synchronize()
    out = {"workload": "calib_check", "kernel": NAME, "rows": R, "width": W, "threads": args.threads,
           "launches": args.launches, "traced": bool(os.environ.get("CUDA_INJECTION64_PATH")),
           "gpu": torch.cuda.get_device_name()}
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(args.launches):
                launch()
            torch.cuda.synchronize()
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "trace.json")
            prof.export_chrome_trace(path)
            durs = cupti_durations(path)
        out["cupti"] = {"kernels": len(durs), "median_ns": statistics.median(durs) if durs else None,
                        "p10_ns": float(np.percentile(durs, 10)) if durs else None,
                        "p90_ns": float(np.percentile(durs, 90)) if durs else None}
    else:
        for _ in range(args.launches):
            launch()
        torch.cuda.synchronize()
    # the same kernel between CUDA events (the tracer's calibration reference), after the timed launches: in batches of
    # 50 queued behind a ~10 ms torch.cuda._sleep, so that they run back to back (at the host's launch rate the events
    # time the host), and once more unprimed
    def timed(primed: bool) -> list[float]:
        pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(200)]
        for i, (e0, e1) in enumerate(pairs):
            if primed and i % 50 == 0:
                torch.cuda._sleep(20_000_000)
            e0.record()
            launch()
            e1.record()
        torch.cuda.synchronize()
        return [e0.elapsed_time(e1) * 1e6 for e0, e1 in pairs]

    for key, primed in (("events", True), ("events_unprimed", False)):
        ev = timed(primed)
        out[key] = {"launches": len(ev), "median_ns": statistics.median(ev), "mean_ns": statistics.fmean(ev)}
    # the tracer's reference, here: the stream time the kernel adds between two one-thread %globaltimer stamps,
    # against two stamps with nothing between (S0 K S1 S2 S3), back to back behind a spin
    st = cp.RawModule(code=STAMP).get_function("stamp")
    buf = cp.zeros(4 * 200, dtype=cp.uint64)
    with cp.cuda.ExternalStream(stream.cuda_stream):
        for i in range(200):
            if i % 50 == 0:
                torch.cuda._sleep(20_000_000)
            for j in range(4):
                st((1,), (1,), (buf, np.int32(4 * i + j)))
                if j == 0:
                    launch()
    torch.cuda.synchronize()
    t = cp.asnumpy(buf).astype(np.int64).reshape(200, 4)
    added = (t[:, 1] - t[:, 0]) - (t[:, 3] - t[:, 2])
    out["stamps"] = {"launches": 200, "median_ns": float(np.median(added)), "mean_ns": float(added.mean())}
    line = json.dumps(out)
    print(line, flush=True)
    if args.json:
        with open(args.json, "w") as f:
            f.write(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
