"""The location canary on a small CUDA-graph-replayed KV write with planted bugs, and the probe's cost per step.

    PYTHONPATH=. python3 bench/canary_gpu.py --out OUTDIR            # the three cases + the cost benchmark
    PYTHONPATH=. python3 bench/canary_gpu.py --out OUTDIR --device cpu --no-bench   # same logic, eager, on CPU

The "engine": 8 requests decode one token per step; each token's key row (128 values) goes to its main-cache slot's
compressed row (slot // 4) of three paged buffers shaped [4096 pages, page_elems], 4 x 64 = 256 slots per page:
L0.index_k bf16 (16 KiB pages, 64 MiB, clone snapshot), L1.index_k_fp8 float8_e4m3fn (8 KiB pages, checksum
snapshot), L2.index_k_scale fp32 (one sum |k| per compressed row, 256 B pages, clone). The write is captured once in a
CUDA graph at batch size 8 and replayed every step. Even steps run all 8 requests; odd steps run requests 0-4, so
graph rows 5-7 are padding. The key of a row is ``hidden @ W + step``: pad rows (hidden 0) carry the step number, so
a pad write changes what it lands on.

Cases (what the engine puts in the pad rows' slot ids on odd steps):
  clean          slot 0 (the sentinel slot of page 0, excluded): nothing is flagged.
  stale-pad      nothing: the slot ids stay from the previous replay, where requests 5-7 wrote their latest token,
                 so the pad rows overwrite those live pages.
  pad-minus-one  -1, and the write does not mask it: index -1 wraps to the buffer's last slot (last page).

Writes OUTDIR/canary-<case>.kvdump, OUTDIR/planted.json (the pages planted per case, step and buffer, and what the
canary reported) and OUTDIR/bench.json. Exits 1 if the canary does not flag exactly the planted pages.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np
import torch

from kvconv.capture.probe import Canary
from kvconv.check import canary
from kvconv.format import dump

NUM_PAGES = 4096
PAGE_SIZE = 64  # compressed rows per page
COMPRESSION = 4
SPP = PAGE_SIZE * COMPRESSION  # main-cache slots per page
ROW = 128  # values per compressed row
MAX_BS = 8
STEPS = 12
CASES = ("clean", "stale-pad", "pad-minus-one")


def make_requests(rng: np.random.Generator):
    # Pages 1..NUM_PAGES-2 go to requests (page 0 is the sentinel, the last page is never allocated).
    pool = rng.permutation(np.arange(1, NUM_PAGES - 1))
    pages = [pool[r * 4 : r * 4 + 4].tolist() for r in range(MAX_BS)]
    pos = [250 - 2 * r for r in range(MAX_BS)]  # several requests cross into their next page during the run
    return pages, pos


def slot_of(pages, r, p) -> int:
    return pages[r][p // SPP] * SPP + p % SPP


class Engine:
    def __init__(self, device: str, use_graph: bool, seed: int = 1) -> None:
        g = torch.Generator(device="cpu").manual_seed(seed)
        self.device = device
        self.k0 = torch.randn(NUM_PAGES, PAGE_SIZE * ROW, generator=g).to(device, torch.bfloat16)
        self.k1 = torch.randn(NUM_PAGES, PAGE_SIZE * ROW, generator=g).to(torch.float8_e4m3fn).to(device)
        self.k2 = torch.rand(NUM_PAGES, PAGE_SIZE, generator=g).to(device, torch.float32)
        self.W = (torch.randn(64, ROW, generator=g) / 8).to(device, torch.bfloat16)
        self.locs = torch.zeros(MAX_BS, dtype=torch.int64, device=device)
        self.hidden = torch.zeros(MAX_BS, 64, dtype=torch.bfloat16, device=device)
        self.stepv = torch.zeros(1, dtype=torch.bfloat16, device=device)
        self.graph = None
        if use_graph:
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):  # warm up outside the capture (the pad slot 0 is the sentinel)
                self.body()
            torch.cuda.current_stream().wait_stream(s)
            torch.cuda.synchronize()
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.body()
            torch.cuda.synchronize()

    def body(self) -> None:
        k = self.hidden @ self.W + self.stepv  # [MAX_BS, ROW] bf16
        rows = torch.div(self.locs, COMPRESSION, rounding_mode="floor")  # compressed row; -1 stays -1
        self.k0.view(NUM_PAGES * PAGE_SIZE, ROW).index_put_((rows,), k)
        self.k1.view(torch.uint8).view(NUM_PAGES * PAGE_SIZE, ROW).index_put_(
            (rows,), k.to(torch.float8_e4m3fn).view(torch.uint8))
        self.k2.view(-1).index_put_((rows,), k.float().abs().sum(dim=1))

    def replay(self) -> None:
        if self.graph is not None:
            self.graph.replay()
        else:
            self.body()


def run_case(case: str, out_dir: str, device: str, use_graph: bool) -> dict:
    rng = np.random.default_rng(7)
    pages, pos = make_requests(rng)
    eng = Engine(device, use_graph)
    hg = torch.Generator(device="cpu").manual_seed(11)
    path = os.path.join(out_dir, f"canary-{case}.kvdump")
    meta = {"producer": "bench/canary_gpu.py", "case": case, "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name() if device == "cuda" else "cpu", "cuda_graph": use_graph}
    planted: dict[str, list[int]] = {}
    with Canary(path, metadata=meta) as can:
        can.watch(eng.k0, name="L0.index_k", page_size=PAGE_SIZE, compression=COMPRESSION, excluded=[0], mode="clone")
        can.watch(eng.k1, name="L1.index_k_fp8", page_size=PAGE_SIZE, compression=COMPRESSION, excluded=[0],
                  mode="checksum")
        can.watch(eng.k2, name="L2.index_k_scale", page_size=PAGE_SIZE, compression=COMPRESSION, excluded=[0],
                  mode="clone")
        prev_locs = np.zeros(MAX_BS, dtype=np.int64)
        for step in range(STEPS):
            bs = MAX_BS if step % 2 == 0 else 5
            real = np.array([slot_of(pages, r, pos[r]) for r in range(bs)], dtype=np.int64)
            locs = prev_locs.copy()
            locs[:bs] = real
            if bs < MAX_BS:
                if case == "clean":
                    locs[bs:] = 0
                elif case == "pad-minus-one":
                    locs[bs:] = -1
                # stale-pad: rows bs.. keep the previous replay's slot ids (the engine forgot to reset them)
            hid = torch.zeros(MAX_BS, 64, dtype=torch.bfloat16)
            hid[:bs] = torch.randn(bs, 64, generator=hg).to(torch.bfloat16)
            eng.locs.copy_(torch.from_numpy(locs))
            eng.hidden.copy_(hid)
            eng.stepv.fill_(step + 1)
            # What the planted bug writes outside the expected set (ground truth, from the engine's own inputs).
            pad = locs[bs:]
            pad_pages = set()
            for s in pad.tolist():
                row = s // COMPRESSION  # floor: -1 -> -1
                row = row % (NUM_PAGES * PAGE_SIZE)
                pad_pages.add(row // PAGE_SIZE)
            exp = set((real // SPP).tolist())
            bad = sorted(p for p in pad_pages if p not in exp and p != 0)
            if bad:
                planted[str(step)] = bad
            with can.step(step, torch.from_numpy(real)):
                eng.replay()
            prev_locs = locs
            for r in range(bs):
                pos[r] += 1
    with dump.open(path) as d:
        res = canary.check(d)
    reported: dict[str, dict[str, list[int]]] = {}
    for s in res.steps:
        if s["unexpected"] or s["missing"]:
            reported.setdefault(str(s["step"]), {})[s["buffer"]] = s["unexpected"] + [-1 - m for m in s["missing"]]
    ok = True
    for s in res.steps:
        want = planted.get(str(s["step"]), [])
        if s["unexpected"] != want or s["missing"]:
            ok = False
    return {"case": case, "dump": os.path.basename(path), "planted": planted,
            "reported_unexpected": {st: v for st, v in reported.items()}, "records": res.records,
            "findings": len(res.findings), "exact": ok}


def _probed_step(can, replay, host_locs):
    """One decode step under the probe: snapshot, the graph replay, compare against the step's written rows."""
    n = [0]

    def stepped():
        can.snapshot()
        replay()
        can.compare(n[0], host_locs)
        n[0] += 1

    return stepped


def bench(device: str, steps: int) -> dict:
    """Per-step cost of the probe on one 64 MiB bf16 buffer [4096, 8192], clone and checksum modes."""
    buf = torch.randn(NUM_PAGES, PAGE_SIZE * ROW, device=device).to(torch.bfloat16)
    locs = torch.arange(0, MAX_BS * 300, 300, device=device, dtype=torch.int64)
    rows = torch.div(locs, COMPRESSION, rounding_mode="floor")
    val = torch.zeros(MAX_BS, ROW, dtype=torch.bfloat16, device=device)
    v2 = buf.view(-1, ROW)

    def body():
        val.add_(1)
        v2.index_put_((rows,), val)

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        body()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        body()
    torch.cuda.synchronize()
    host_locs = locs.cpu()
    out: dict = {"buffer_bytes": buf.numel() * 2, "num_pages": NUM_PAGES, "steps": steps}

    def timed(fn):
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
        ts = []
        for _ in range(steps):
            t = time.perf_counter_ns()
            fn()
            torch.cuda.synchronize()
            ts.append(time.perf_counter_ns() - t)
        return statistics.median(ts) / 1e3, float(np.percentile(ts, 90)) / 1e3

    out["baseline_replay_us"] = timed(g.replay)[0]
    tmp = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"canary-bench-{os.getpid()}.kvdump")
    for mode in ("clone", "checksum"):
        can = Canary(tmp, metadata={"producer": "bench"})
        wb = can.watch(buf, name="bench", page_size=PAGE_SIZE, compression=COMPRESSION, mode=mode)
        med, p90 = timed(_probed_step(can, g.replay, host_locs))
        # Device time alone: snapshot + compare kernels, CUDA events around them (no replay, no host work).
        e0, e1, e2 = (torch.cuda.Event(enable_timing=True) for _ in range(3))
        snap_ms, cmp_ms = [], []
        for _ in range(steps):
            e0.record()
            wb.snapshot()
            e1.record()
            m = wb.changed_mask()
            e2.record()
            e2.synchronize()
            snap_ms.append(e0.elapsed_time(e1))
            cmp_ms.append(e1.elapsed_time(e2))
            del m
        can.close()
        os.unlink(tmp)
        out[mode] = {
            "step_us_median": med,
            "step_us_p90": p90,
            "probe_us_median": med - out["baseline_replay_us"],
            "device_snapshot_us_median": statistics.median(snap_ms) * 1e3,
            "device_compare_us_median": statistics.median(cmp_ms) * 1e3,
            "host_snapshot_us_median": statistics.median(t[0] for t in can.timings) / 1e3,
            "host_compare_us_median": statistics.median(t[1] for t in can.timings) / 1e3,
            "ratio_vs_baseline": med / out["baseline_replay_us"],
        }
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--no-bench", action="store_true")
    ap.add_argument("--bench-steps", type=int, default=500)
    a = ap.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    use_graph = a.device == "cuda"
    cases = [run_case(c, a.out, a.device, use_graph) for c in CASES]
    for c in cases:
        print(f"{c['case']:>14}: exact={c['exact']} planted={c['planted']} reported={c['reported_unexpected']}")
    with open(os.path.join(a.out, "planted.json"), "w") as f:
        json.dump(cases, f, indent=2, sort_keys=True)
        f.write("\n")
    if not a.no_bench and a.device == "cuda":
        b = bench(a.device, a.bench_steps)
        b["gpu"] = torch.cuda.get_device_name()
        b["torch"] = torch.__version__
        print(json.dumps(b, indent=2, sort_keys=True))
        with open(os.path.join(a.out, "bench.json"), "w") as f:
            json.dump(b, f, indent=2, sort_keys=True)
            f.write("\n")
    return 0 if all(c["exact"] for c in cases) else 1


if __name__ == "__main__":
    sys.exit(main())
