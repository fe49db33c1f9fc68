"""Tracer overhead on a decode step: CUDA-graph replay time with and without the kvconv tracer (needs a GPU).

    python3 bench/gpu_overhead.py --out bench/out/overhead.json            # orchestrates the runs below
    python3 bench/gpu_overhead.py --inner --work qwen14b                    # one process, prints one JSON line

Each inner process builds the 40-layer decode model of native/workloads/kv_decode.py and captures two graphs over the
same weights: one whose KV write kernel is ``reshape_and_cache_flash_kernel`` (patched by the tracer) and a twin whose
identical kernel lives in another module under another name (never patched). It replays them alternately and takes
the median of many replays (GPU time between CUDA events, and host time of the ``replay()`` call).

The outer run starts the inner one once per (work size, config): untraced, traced (default tracer), traced-domains
(whole callback domains), traced-nograph (no graph-node callbacks), and prints per config:
  full           = config target / untraced target   (everything the tracer adds; across processes)
  patch          = config target / config twin       (device-side block records only; same process, interleaved)
  cb-only        = config twin / untraced twin       (host callbacks etc. without any patched kernel)
The untraced row's "patch" column is the noise floor (the same code under two names).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _table import Col, print_table  # beside this script
from _timing import quantile

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "native" / "workloads"))


def inner(args) -> dict:
    import kv_decode as kvd
    import torch

    wl = vars(kvd)
    ns = argparse.Namespace(layers=args.layers, prefill=8, replays=1, streams=1, work=args.work, kv_heads=8,
                            head_dim=128, block_size=16, num_blocks=8)
    target = wl["KvKernel"]("reshape_and_cache_flash_kernel", wl["KV_SRC"])
    twin = wl["KvKernel"]("kv_twin_copy_kernel", wl["TWIN_SRC"])
    mt = wl["Model"](ns, target)
    mw = wl["Model"].__new__(wl["Model"])
    mw.__dict__.update(mt.__dict__)
    mw.kv = twin
    H = mt.H
    x = torch.randn(ns.prefill, H, device="cuda", dtype=torch.bfloat16)
    slots = torch.arange(ns.prefill, device="cuda", dtype=torch.int64)
    mt.forward(x, slots)
    mw.forward(x, slots)
    torch.cuda.synchronize()
    tok = torch.randn(1, H, device="cuda", dtype=torch.bfloat16)
    slot = torch.full((1,), ns.prefill, device="cuda", dtype=torch.int64)
    graphs = {}
    for name, m in (("target", mt), ("twin", mw)):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            m.forward(tok, slot)
        graphs[name] = g
    torch.cuda.synchronize()
    gpu = {k: [] for k in graphs}
    host = {k: [] for k in graphs}
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for i in range(args.warmup + args.iters):
        order = ("target", "twin") if i % 2 == 0 else ("twin", "target")
        for name in order:
            torch.cuda.synchronize()
            e0.record()
            t0 = time.perf_counter()
            graphs[name].replay()
            t1 = time.perf_counter()
            e1.record()
            e1.synchronize()
            if i >= args.warmup:
                gpu[name].append(e0.elapsed_time(e1))
                host[name].append((t1 - t0) * 1e6)
    out = {"work": args.work, "layers": args.layers, "iters": args.iters,
           "traced": bool(os.environ.get("CUDA_INJECTION64_PATH"))}
    for name in graphs:
        out[name] = {"gpu_ms_median": statistics.median(gpu[name]), "gpu_ms_p10": quantile(gpu[name], 0.1),
                     "gpu_ms_p90": quantile(gpu[name], 0.9), "host_replay_us_median": statistics.median(host[name])}
    out["target_over_twin"] = out["target"]["gpu_ms_median"] / out["twin"]["gpu_ms_median"]
    return out


CONFIGS = {
    "untraced": None,
    "traced": {},                                        # the default: minimal callbacks, graph-node records on
    "traced-domains": {"KVCONV_CALLBACKS": "domains"},   # whole callback domains enabled (the facts-note setup)
    "traced-nograph": {"KVCONV_GRAPH_CALLBACKS": "0"},   # no graph-node callbacks: device records only
}

COLUMNS = [Col("work", "9"), Col("config", "15"), Col("gpu ms", "8.4f"), Col("full", "7.2f", "%"),
           Col("patch", "7.2f", "%"), Col("cb-only", "7.2f", "%"), Col("host us", "8.0f")]


def table_rows(results) -> list[tuple]:
    """One row of COLUMNS per work and config (overheads as percentages)."""
    return [(r["work"], cfg, o["gpu_ms_median"], o["full"] * 100, o["patch"] * 100, o["callbacks_only"] * 100,
             o["host_replay_us_median"]) for r in results for cfg, o in r["overhead"].items()]



def outer(args) -> int:
    lib = Path(args.lib).resolve()
    results = []
    for work in args.works:
        row = {"work": work}
        for cfg in args.configs:
            extra = CONFIGS[cfg]
            env = dict(os.environ)
            env.pop("CUDA_INJECTION64_PATH", None)
            if extra is not None:
                env["CUDA_INJECTION64_PATH"] = str(lib)
                env["KVCONV_OUTPUT"] = str(Path(args.dump_dir) / f"bench-{work}-{cfg}-%p.kvdump")
                env.update(extra)
            cmd = [sys.executable, __file__, "--inner", "--work", work, "--iters", str(args.iters),
                   "--warmup", str(args.warmup), "--layers", str(args.layers)]
            p = subprocess.run(cmd, env=env, capture_output=True, text=True)
            sys.stderr.write(p.stderr[-3000:])
            if p.returncode != 0:
                print(f"inner run failed ({work}, {cfg}): exit {p.returncode}", file=sys.stderr)
                row[cfg] = None
                continue
            row[cfg] = json.loads(p.stdout.strip().splitlines()[-1])
        base = row.get("untraced")
        row["overhead"] = {}
        for cfg in args.configs:
            r = row.get(cfg)
            if not r or not base:
                continue
            row["overhead"][cfg] = {
                "full": r["target"]["gpu_ms_median"] / base["target"]["gpu_ms_median"] - 1,
                "patch": r["target_over_twin"] - 1,
                "callbacks_only": r["twin"]["gpu_ms_median"] / base["twin"]["gpu_ms_median"] - 1,
                "gpu_ms_median": r["target"]["gpu_ms_median"],
                "host_replay_us_median": r["target"]["host_replay_us_median"],
            }
        results.append(row)
    print_table(COLUMNS, table_rows(results))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--inner", action="store_true")
    ap.add_argument("--work", default="qwen14b")
    ap.add_argument("--works", nargs="+", default=["light", "qwen14b"])
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--layers", type=int, default=40)
    ap.add_argument("--lib", default=str(ROOT / "native" / "build" / "libkvconv_tracer.so"))
    ap.add_argument("--dump-dir", default="/tmp")
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.inner:
        print(json.dumps(inner(args), sort_keys=True), flush=True)
        return 0
    return outer(args)


if __name__ == "__main__":
    sys.exit(main())
