"""Issue 31: which step of building a second CUDA graph switches on the tracer's context-wide floor (needs a GPU).

    python3 bench/gpu_floor_stages.py --out stages.json                       # orchestrates the processes below
    python3 bench/gpu_floor_stages.py --inner --second engine                 # one process, prints one JSON line

One process per (config, kind of second graph). Graph A (engine-small: 960 kernel nodes, 40 of them the traced
index_copy_) is captured first; then, step by step, a second graph B is made, and A's device time is measured after
every step (primed: a spin kernel queued first so that replay() is submitted while the GPU is busy; median of --iters
replays). The steps, in order:

    alone         A only (gpu_tracer_cost.py's "engine-small alone": +3% with an empty patch)
    empty-cache   torch.cuda.empty_cache() (torch.cuda.graph() calls it before every capture)
    eager         B's model built and run once eagerly (its kernels loaded, B's target launched eagerly)
    captured      B captured into a cudaGraph_t (torch.cuda.CUDAGraph(keep_graph=True): not instantiated yet)
    instantiated  B's cudaGraphExec_t made (cudaGraphInstantiate)
    replayed      B replayed once (the tracer learns its nodes)
    reset         B destroyed (graph and exec)

Kinds of B (--second): engine (the same shape, its own weights: the "two engine-small" process of the issue),
target (40 index_copy_ into 40 caches, nothing else), notarget (engine-small's layers without the index_copy_),
again (A's own model captured a second time). Configs: untraced, noop (the tracer with the empty patch,
native/build/cost/noop.fatbin), shipped, nopatch (the tracer, no kernel pattern matching: callbacks only).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_tracer_cost import KERNELS, ROOT, Engine, _sleep_cycles_per_us, _stats, timed_loop  # noqa: E402

STAGES = ("alone", "empty-cache", "eager", "captured", "instantiated", "replayed", "reset")
SECONDS = ("engine", "target", "notarget", "again")
CONFIGS = ("untraced", "noop", "shipped", "nopatch")


class TargetOnly:
    """40 index_copy_ of one token's K|V row into 40 caches: B with the traced kernel and nothing else."""

    def __init__(self, torch, layers, H=1024):
        self.caches = [torch.zeros(1024, 512, device="cuda", dtype=torch.bfloat16) for _ in range(layers)]
        self.H = H

    def forward(self, h, slot):
        row = h[:, :512]
        for c in self.caches:
            c.index_copy_(0, slot, row)
        return h


class NoTarget(Engine):
    """engine-small's layers with the KV write left out (every other kernel of the graph kept)."""

    def layer(self, L, h, slot):
        torch = self.torch
        orig = torch.Tensor.index_copy_
        try:
            torch.Tensor.index_copy_ = lambda self_, dim, idx, src: self_  # the write skipped, the rest unchanged
            return super().layer(L, h, slot)
        finally:
            torch.Tensor.index_copy_ = orig


def model(torch, kind, layers, a):
    if kind == "engine":
        return Engine(torch, H=1024, q_heads=8, kv_heads=2, inter=2048, layers=layers)
    if kind == "target":
        return TargetOnly(torch, layers)
    if kind == "notarget":
        return NoTarget(torch, H=1024, q_heads=8, kv_heads=2, inter=2048, layers=layers)
    return a  # again: A's model


def single_kind(torch, kind, n):
    """A graph-A model of ``n`` kernels of one kind (which kernels pay the floor?): mm a 1x1024 @ 1024x1024 bf16 matmul
    (cuBLAS), ln layer_norm, add an in-place elementwise add, idx the traced index_copy_, softmax a row softmax."""
    x = torch.randn(1, 1024, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16) * 0.03
    cache = torch.zeros(1024, 1024, device="cuda", dtype=torch.bfloat16)
    ones = torch.ones(1024, device="cuda", dtype=torch.bfloat16)
    o = torch.empty_like(x)
    ops = {"mm": lambda slot: torch.mm(x, w, out=o), "add": lambda slot: x.add_(1e-3),
           "ln": lambda slot: o.copy_(torch.nn.functional.layer_norm(x, (1024,), ones, None, 1e-6)),
           "idx": lambda slot: cache.index_copy_(0, slot, x), "softmax": lambda slot: o.copy_(torch.softmax(x, -1))}
    op = ops[kind]

    class Single:
        def forward(self, h, slot):
            for _ in range(n):
                op(slot)
            return h
    return Single()


def _cudart():
    import ctypes

    return ctypes.CDLL("libcudart.so.13")  # the one PyTorch loaded


def raw_capture(torch, stream, mode, body, after=None):
    """cudaStreamBeginCapture / body() / cudaStreamEndCapture / cudaGraphDestroy through the runtime, no PyTorch
    graph machinery (no private pool, no generator registration)."""
    import ctypes

    rt = _cudart()
    g = ctypes.c_void_p()
    torch.cuda.synchronize()
    assert rt.cudaStreamBeginCapture(ctypes.c_void_p(stream.cuda_stream), mode) == 0
    with torch.cuda.stream(stream):
        body()
    assert rt.cudaStreamEndCapture(ctypes.c_void_p(stream.cuda_stream), ctypes.byref(g)) == 0
    if after:
        after(g)
    assert rt.cudaGraphDestroy(g) == 0


def capture_info(torch):
    import ctypes

    status, cid = ctypes.c_int(), ctypes.c_ulonglong()
    rc = _cudart().cudaStreamGetCaptureInfo(ctypes.c_void_p(torch.cuda.current_stream().cuda_stream),
                                            ctypes.byref(status), ctypes.byref(cid), None, None, None, None)
    assert rc == 0 and status.value == 1, (rc, status.value)


def exchange_mode():
    import ctypes

    mode = ctypes.c_int(2)  # relaxed, then back
    assert _cudart().cudaThreadExchangeStreamCaptureMode(ctypes.byref(mode)) == 0
    assert _cudart().cudaThreadExchangeStreamCaptureMode(ctypes.byref(mode)) == 0


def get_nodes(g):
    import ctypes

    n = ctypes.c_size_t()
    assert _cudart().cudaGraphGetNodes(g, None, ctypes.byref(n)) == 0 and n.value >= 1


def raw_pool_capture(torch, st):
    dev = torch.cuda.current_device()
    pool = torch.cuda.graph_pool_handle()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        torch._C._cuda_beginAllocateCurrentThreadToPool(dev, pool)  # PyTorch >= 2.8's names
    try:
        raw_capture(torch, s, 0, lambda: st["keep"].append(st["x"] * 2.0))
    finally:
        torch._C._cuda_endAllocateToPool(dev, pool)


def torch_capture(torch, body, keep):
    gb = torch.cuda.CUDAGraph(keep_graph=True)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        gb.capture_begin()
        body()
        gb.capture_end()
    torch.cuda.current_stream().wait_stream(s)
    keep.append(gb)
    return gb


def run_step(torch, name, st, args):
    """One irreversible step of the process (see the module docstring); ``st`` holds what must stay alive."""
    x = st["x"]
    if name == "empty-cache":
        torch.cuda.empty_cache()
    elif name == "eager":
        st["b"] = model(torch, args.second, args.layers, st["a"])
        st["b"].forward(st["tok_b"], st["slot_b"])
    elif name == "captured":
        torch.cuda.empty_cache()
        st["gb"] = torch_capture(torch, lambda: st["b"].forward(st["tok_b"], st["slot_b"]), st["keep"])
    elif name == "instantiated":
        st["gb"].instantiate()
    elif name == "replayed":
        st["gb"].replay()
    elif name == "reset":
        st["gb"].reset()
    elif name == "raw-empty":  # nothing captured, relaxed mode
        raw_capture(torch, torch.cuda.Stream(), 2, lambda: None)
    elif name == "raw-kernel":  # one in-place kernel, global mode (as the C++ reproducer's EXECS=4)
        raw_capture(torch, torch.cuda.Stream(), 0, lambda: x.add_(1.0))
    elif name == "raw-threadlocal":  # one in-place kernel, thread-local mode
        raw_capture(torch, torch.cuda.Stream(), 1, lambda: x.add_(1.0))
    elif name == "raw-info":  # + cudaStreamGetCaptureInfo while capturing (PyTorch calls it in capture_begin)
        raw_capture(torch, torch.cuda.Stream(), 0, lambda: (x.add_(1.0), capture_info(torch)))
    elif name == "raw-xmode":  # + cudaThreadExchangeStreamCaptureMode there and back (c10's capture-mode guard)
        raw_capture(torch, torch.cuda.Stream(), 0, lambda: (x.add_(1.0), exchange_mode()))
    elif name == "raw-getnodes":  # + cudaGraphGetNodes on the captured graph (PyTorch's capture_end)
        raw_capture(torch, torch.cuda.Stream(), 0, lambda: x.add_(1.0), after=get_nodes)
    elif name == "raw-pool":  # the caching allocator's private pool around a raw capture of an allocating kernel
        raw_pool_capture(torch, st)
    elif name == "streams":  # 32 new streams from PyTorch's pool, one eager kernel on each, no capture
        for _ in range(32):
            s = torch.cuda.Stream()
            with torch.cuda.stream(s):
                x.add_(1.0)
    elif name == "streams2":  # 2 new streams, one eager kernel on each
        for _ in range(2):
            s = torch.cuda.Stream()
            with torch.cuda.stream(s):
                x.add_(1.0)
    elif name == "raw-many":  # ten raw captures of one kernel each
        for _ in range(10):
            raw_capture(torch, torch.cuda.Stream(), 0, lambda: x.add_(1.0))
    elif name == "sleep":  # five seconds of host time, nothing else
        time.sleep(5)
    elif name == "torch-empty":  # torch.cuda.CUDAGraph capture of nothing
        torch_capture(torch, lambda: None, st["keep"])
    elif name == "torch-noalloc":  # torch.cuda.CUDAGraph capture of one in-place kernel: no allocation
        torch_capture(torch, lambda: x.add_(1.0), st["keep"])
    elif name == "torch-alloc":  # one allocation from the graph's private pool
        torch_capture(torch, lambda: st["keep"].append(x * 2.0), st["keep"])
    elif name == "pool-eager":  # a private memory pool used eagerly, no capture
        pool = torch.cuda.MemPool()
        with torch.cuda.use_mem_pool(pool):
            st["keep"].append(torch.empty(64 << 20, dtype=torch.uint8, device="cuda"))
        st["keep"].append(pool)
    else:
        raise SystemExit(f"unknown step {name!r}")
    torch.cuda.synchronize()


def inner(args) -> dict:
    import torch

    cpu = _sleep_cycles_per_us(torch)
    if args.a == "engine":
        a = Engine(torch, H=1024, q_heads=8, kv_heads=2, inter=2048, layers=args.layers)
    else:
        a = single_kind(torch, args.a, args.nodes)
    tok = torch.randn(1, 1024, device="cuda", dtype=torch.bfloat16)
    slot = torch.full((1,), 9, device="cuda", dtype=torch.int64)
    a.forward(tok, slot)
    torch.cuda.synchronize()
    ga = torch.cuda.CUDAGraph()
    with torch.cuda.graph(ga):
        a.forward(tok, slot)
    torch.cuda.synchronize()
    st = {"a": a, "x": torch.randn(1, 1024, device="cuda"), "keep": [],
          "tok_b": torch.randn(1, 1024, device="cuda", dtype=torch.bfloat16),
          "slot_b": torch.full((1,), 11, device="cuda", dtype=torch.int64)}
    out = {"a": args.a, "second": args.second, "layers": args.layers, "iters": args.iters, "stages": {}}
    steps = ["alone"] + args.steps
    for name in steps:
        if name != "alone":
            run_step(torch, name, st, args)
        torch.cuda.synchronize()
        res = timed_loop(torch, {"a": ga}, args.iters, args.warmup, "primed", 2000.0, cpu)
        out["stages"][name] = _stats(*res)["a"]
    return out


def config_env(cfg, args):
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVCONV_") and k != "CUDA_INJECTION64_PATH"}
    if cfg in args.variant:  # NAME=BASE:VAR=VALUE,...: a base config with extra environment
        base, extra = args.variant[cfg]
        env = config_env(base, args)
        env.update(extra)
        return env
    if cfg == "untraced":
        return env
    build = ROOT / "native" / "build"
    env["CUDA_INJECTION64_PATH"] = str(build / "libkvconv_tracer.so")
    env["KVCONV_KERNELS"] = KERNELS if cfg != "nopatch" else "kvconv_no_such_kernel"
    env["KVCONV_OUTPUT"] = str(Path(args.dump_dir) / f"stages-{cfg}-%p.kvdump")
    if cfg == "noop":
        env["KVCONV_PATCH_FILE"] = str(build / "cost" / "noop.fatbin")
    return env


def outer(args) -> int:
    runs = []
    plans = [tuple((p.split(":") + [""])[:3]) for p in args.plans] or [("engine", s, "") for s in args.seconds]
    for a, second, steps in plans:
        steps = steps.split(",") if steps else list(STAGES[1:])
        for cfg in args.configs:
            cmd = [sys.executable, __file__, "--inner", "--a", a, "--second", second, "--layers", str(args.layers),
                   "--nodes", str(args.nodes), "--iters", str(args.iters), "--warmup", str(args.warmup),
                   "--steps", *steps]
            t = time.perf_counter()
            p = subprocess.run(cmd, env=config_env(cfg, args), capture_output=True, text=True, timeout=args.timeout)
            res = json.loads(p.stdout.strip().splitlines()[-1]) if p.returncode == 0 and p.stdout.strip() else None
            took = time.perf_counter() - t
            print(f"# {a} {second} {','.join(steps)} {cfg}: exit {p.returncode} in {took:.1f} s", flush=True)
            if p.returncode:
                sys.stderr.write(p.stderr[-2000:])
            runs.append({"a": a, "second": second, "steps": steps, "config": cfg, "result": res})
            if args.out:
                Path(args.out).write_text(json.dumps({"argv": sys.argv, "runs": runs}, indent=1) + "\n")

    def key(r):
        return r["a"], r["second"], tuple(r["steps"])

    base = {key(r): r["result"] for r in runs if r["config"] == "untraced" and r["result"]}
    for r in runs:
        if not r["result"]:
            continue
        b = base.get(key(r))
        names = list(r["result"]["stages"])
        if r["config"] == "untraced" or not b:
            print(f"# A={r['a']} B={r['second']}: " + " ".join(f"{s:>13}" for s in names))
        cells = []
        for s in names:
            v = r["result"]["stages"][s]["gpu_ms_median"]
            cells.append(f"{v:.3f}" if r["config"] == "untraced" or not b else
                         f"{100 * (v / b['stages'][s]['gpu_ms_median'] - 1):+.1f}%")
        print(f"{r['config']:<9} " + " ".join(f"{c:>13}" for c in cells))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--inner", action="store_true")
    ap.add_argument("--second", choices=SECONDS, default="engine")
    ap.add_argument("--seconds", nargs="+", choices=SECONDS, default=list(SECONDS))
    ap.add_argument("--configs", nargs="+", default=["untraced", "noop"],
                    help=f"of {', '.join(CONFIGS)} and the --variant names")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=BASE:VAR=VALUE[,VAR=VALUE]",
                    help="a config: BASE (one of the configs) with extra environment, e.g. "
                         "nosync=noop:KVCONV_CLOCK_SYNC_MS=0")
    ap.add_argument("--layers", type=int, default=40)
    ap.add_argument("--a", choices=("engine", "mm", "ln", "add", "idx", "softmax"), default="engine",
                    help="graph A: engine-small, or --nodes kernels of one kind")
    ap.add_argument("--nodes", type=int, default=400)
    ap.add_argument("--steps", nargs="*", default=list(STAGES[1:]))
    ap.add_argument("--plans", nargs="*", default=[], metavar="A:SECOND[:STEP,STEP...]",
                    help="processes to run (default: engine A with each --seconds and the stage steps)")
    ap.add_argument("--iters", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--dump-dir", default="/tmp")
    ap.add_argument("--timeout", type=int, default=180)
    ap.add_argument("--out")
    args = ap.parse_args()
    variants = {}
    for v in args.variant:
        name, _, rest = v.partition("=")
        base, _, env = rest.partition(":")
        pairs = [kv.split("=", 1) for kv in env.split(",") if kv]
        if not name or base not in CONFIGS or any(len(p) != 2 for p in pairs):
            ap.error(f"--variant {v!r}: expected NAME=BASE:VAR=VALUE[,VAR=VALUE] with BASE one of {CONFIGS}")
        variants[name] = (base, dict(pairs))
    args.variant = variants
    bad = [c for c in args.configs if c not in CONFIGS and c not in variants]
    if bad:
        ap.error(f"unknown configs {bad}")
    if args.inner:
        print(json.dumps(inner(args)), flush=True)
        return 0
    return outer(args)


if __name__ == "__main__":
    sys.exit(main())
