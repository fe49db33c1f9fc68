"""Tracer cost on decode graphs shaped like an engine's, beside the floor and torch.profiler (needs a GPU; issue 15).

    python3 bench/gpu_tracer_cost.py --out cost.json --before-lib OLD.so      # orchestrates the processes below
    python3 bench/gpu_tracer_cost.py --inner --works engine-small light       # one process, prints one JSON line

Works (each captured as one CUDA graph and replayed; the same process replays all works, interleaved):
  light         native/workloads/kv_decode.py 'light': 40 layers, one 5120x5120 matmul + K/V projection + the CuPy
                reshape_and_cache_flash_kernel KV write per layer (~4 kernel nodes a layer)
  qwen14b       kv_decode.py 'qwen14b': Qwen3-14B decode-layer matmuls (qkv 5120x7168, o 5120x5120,
                gate_up 5120x34816, down 17408x5120) + the same KV write
  engine-small  an engine's decode step, 40 layers x ~25 small kernels (RMSNorm, q/k norms, rotary, GQA attention over
                256 cached tokens, SiLU-gated MLP, residuals) with hidden 1024; one KV write per layer is PyTorch's
                index_copy_ (kernel index_copy_kernel_impl): ~1,000 kernel nodes, 40 of them traced
  engine-qwen   the same graph with Qwen3-14B-sized projections (hidden 5120, 40 q / 8 kv heads, MLP 17408)
  engine-1040   issue 42's shape: engine-small with separate K and V caches, so two index_copy_ KV writes a layer
                (80 traced nodes in 40 layers, ~26 kernel nodes a layer: ~1,040 in all)
  engine-1040-mm  the same, plus one 5120 x 15360 bf16 matmul a layer (one weight shared by every layer: 157 MB,
                3x the H200's L2, so each layer streams it from memory), the work's step dominated by matmuls

Process configs (--configs): untraced; before (--before-lib, its defaults); after (this build, defaults);
floor (this build, KVCONV_CALLBACKS=none: the Compute Sanitizer injection, subscribed, no callback, no patch);
profiler (untraced + torch.profiler with CUDA activity, i.e. CUPTI kernel records, around the timed loop).
Rounds run untraced first, then the other configs in alternating order (ABCD, DCBA, ...). Per replay: GPU time
between CUDA events (median of --iters), host time of replay(). Added = config / untraced - 1 (same round).
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

KERNELS = "reshape_and_cache_flash_kernel,index_copy_kernel_impl"
WORKS = ["light", "qwen14b", "engine-small", "engine-qwen", "engine-small-b", "engine-1040", "engine-1040-mm"]
TARGETS_PER_REPLAY = {"light": 40, "qwen14b": 40, "engine-small": 40, "engine-qwen": 40, "engine-small-b": 40,
                      "engine-1040": 80, "engine-1040-mm": 80}


class Engine:
    """A decode step shaped like vLLM's for a Qwen3-style model, ~25 kernels a layer: norm, qkv projection, q/k norm,
    rotary embedding, KV write with index_copy_, GQA attention over a static context, o projection, residual, norm,
    SiLU-gated MLP, residual. Plain PyTorch ops; the norms are F.layer_norm (one fused kernel each, as an engine's
    fused RMSNorm is). ``split_kv``: separate K and V caches, each written by its own index_copy_ (two traced KV
    writes a layer, as an engine's paged K and V caches); ``extra_mm``: one [1, 5120] x [5120, 15360] matmul a
    layer beside the layer's work (its weight shared by every layer)."""

    def __init__(self, torch, *, H, q_heads, kv_heads, inter, layers, ctx=256, weights=None, split_kv=False,
                 extra_mm=False):
        self.torch, self.H, self.qh, self.kvh, self.d, self.ctx = torch, H, q_heads, kv_heads, 128, ctx
        self.split_kv = split_kv
        dev, dt = "cuda", torch.bfloat16
        g = torch.Generator(device=dev).manual_seed(99)
        n_q, n_kv = q_heads * 128, kv_heads * 128
        self.n_q, self.n_kv = n_q, n_kv

        def w(r, c):
            return (torch.randn(r, c, device=dev, dtype=dt, generator=g) * (1.0 / r ** 0.5)).contiguous()

        self.layers = []
        for i in range(layers):
            if weights is not None:  # Qwen3-14B-sized: share kv_decode's qwen14b matrices (same shapes)
                L = {k: weights[i][k] for k in ("qkv", "o", "gu", "d")}
            else:
                L = {"qkv": w(H, n_q + 2 * n_kv), "o": w(n_q, H), "gu": w(H, 2 * inter), "d": w(inter, H)}
            L["ln1"] = torch.ones(H, device=dev, dtype=dt)
            L["ln2"] = torch.ones(H, device=dev, dtype=dt)
            L["qkn"] = torch.ones(128, device=dev, dtype=dt)
            if split_kv:
                L["kcache"] = torch.zeros(1024, n_kv, device=dev, dtype=dt)
                L["vcache"] = torch.zeros(1024, n_kv, device=dev, dtype=dt)
            else:
                L["cache"] = torch.zeros(1024, 2 * n_kv, device=dev, dtype=dt)
            self.layers.append(L)
        self.mm = (w(5120, 15360), torch.randn(1, 5120, device=dev, dtype=dt, generator=g)) if extra_mm else None
        ang = 7.0 * torch.pow(10000.0, -torch.arange(64, device=dev, dtype=torch.float32) / 64)
        self.cos = torch.cat((ang.cos(), ang.cos())).to(dt)
        self.sin = torch.cat((ang.sin(), ang.sin())).to(dt)

    def layer(self, L, h, slot):
        torch, F, qh, kvh, d = self.torch, self.torch.nn.functional, self.qh, self.kvh, self.d
        x = F.layer_norm(h, (self.H,), L["ln1"], None, 1e-6)
        qkv = x @ L["qkv"]
        qk = F.layer_norm(qkv[:, :self.n_q + self.n_kv].view(qh + kvh, d), (d,), L["qkn"], None, 1e-6)
        qk = qk * self.cos + torch.cat((-qk[:, 64:], qk[:, :64]), dim=-1) * self.sin  # rotary
        q, k = qk[:qh], qk[qh:]
        v = qkv[:, self.n_q + self.n_kv:]
        if self.split_kv:  # two KV writes (traced), as an engine's separate K and V caches, from staged copies
            L["kcache"].index_copy_(0, slot, k.reshape(1, -1).clone())
            L["vcache"].index_copy_(0, slot, v.clone())
            kc = L["kcache"][:self.ctx].view(self.ctx, kvh, d).permute(1, 2, 0)  # [kvh, d, ctx]
            vc = L["vcache"][:self.ctx].view(self.ctx, kvh, d).permute(1, 0, 2)  # [kvh, ctx, d]
        else:
            L["cache"].index_copy_(0, slot, torch.cat((k.reshape(1, -1), v), dim=-1))  # the KV write (traced)
            kv = L["cache"][:self.ctx].view(self.ctx, 2, kvh, d)
            kc, vc = kv[:, 0].permute(1, 2, 0), kv[:, 1].permute(1, 0, 2)  # [kvh, d, ctx], [kvh, ctx, d]
        if self.mm is not None:  # the matmul-heavy variant: its result is kept in the layer's scratch
            L["mm_out"] = self.mm[1] @ self.mm[0]
        s = torch.bmm(q.reshape(kvh, qh // kvh, d), kc) * (d ** -0.5)
        a = torch.bmm(torch.softmax(s, dim=-1, dtype=torch.float32).to(q.dtype), vc).reshape(1, self.n_q)
        h = h + a @ L["o"]
        x = F.layer_norm(h, (self.H,), L["ln2"], None, 1e-6)
        gate, up = (x @ L["gu"]).chunk(2, dim=-1)
        return h + (F.silu(gate) * up) @ L["d"]

    def forward(self, h, slot):
        for L in self.layers:
            h = self.layer(L, h, slot)
        return h


def build(torch, work, layers):
    """(forward(x, slot), hidden): the work's model, its eager warm-up done (kernels loaded, targets launched once)."""
    import kv_decode as kvd

    if work in ("light", "qwen14b"):
        ns = argparse.Namespace(layers=layers, prefill=8, replays=1, streams=1, work=work, kv_heads=8, head_dim=128,
                                block_size=16, num_blocks=8)
        m = kvd.Model(ns, kvd.KvKernel("reshape_and_cache_flash_kernel", kvd.KV_SRC))
        return m, m.H
    if work in ("engine-small", "engine-small-b"):  # -b: a second graph of the same shape (its own weights)
        return Engine(torch, H=1024, q_heads=8, kv_heads=2, inter=2048, layers=layers), 1024
    if work in ("engine-1040", "engine-1040-mm"):
        return Engine(torch, H=1024, q_heads=8, kv_heads=2, inter=2048, layers=layers, split_kv=True,
                      extra_mm=work.endswith("-mm")), 1024
    qw = build.cache.get("qwen14b")
    weights = qw.layers if qw is not None else None
    return Engine(torch, H=5120, q_heads=40, kv_heads=8, inter=17408, layers=layers, weights=weights), 5120


build.cache = {}


def register_caches(work, m):
    """With write recording on (KVCONV_WRITES=1), register every layer's KV cache with the tracer, as an engine would
    (kvconv.capture.probe.writes): the stores then take the cache search and the slot arithmetic of a real run instead
    of the cheaper outside-every-cache path. KVCONV_BENCH_NO_CACHES=1 leaves them unregistered (earlier figures)."""
    if os.environ.get("KVCONV_WRITES") != "1" or os.environ.get("KVCONV_BENCH_NO_CACHES") == "1":
        return
    from kvconv.capture.probe.writes import WriteProbe

    probe = WriteProbe()
    if work in ("light", "qwen14b"):  # kv_decode: one key and one value cache a layer, 16-row pages
        caches = [c for kv in zip(m.kcache, m.vcache) for c in kv]
    elif m.split_kv:  # Engine with separate K and V caches
        caches = [L[c] for L in m.layers for c in ("kcache", "vcache")]
    else:  # Engine: one [1024, K|V] cache a layer
        caches = [L["cache"] for L in m.layers]
    for i, c in enumerate(caches):
        # [slots, row]: one row a slot (the works index rows by slot), pages of 16 slots
        probe.register_cache(c, page_size=16, name=f"{work}.{i}", slot_bytes=int(c[0].numel() * c.element_size()))


def capture(torch, works, layers):
    """{work: graph}, and the graphs' input tensors, which must outlive them: a replay reads its token and slot from
    the addresses captured, and torch.cuda.graph() empties the allocator's cache before each capture (a freed input
    would be unmapped, or reused: an illegal address, or a KV write to a garbage slot)."""
    graphs, inputs = {}, []
    for work in works:
        m, H = build(torch, work, layers)
        build.cache[work] = m
        x = torch.randn(8 if work in ("light", "qwen14b") else 1, H, device="cuda", dtype=torch.bfloat16)
        slots = torch.arange(x.shape[0], device="cuda", dtype=torch.int64)
        m.forward(x, slots)  # eager warm-up: kernels loaded, modules patched, target launched eagerly once
        torch.cuda.synchronize()
        register_caches(work, m)
        tok = torch.randn(1, H, device="cuda", dtype=torch.bfloat16)
        slot = torch.full((1,), 9, device="cuda", dtype=torch.int64)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            m.forward(tok, slot)
        graphs[work] = g
        inputs.append((tok, slot))
    torch.cuda.synchronize()
    return graphs, inputs


def kernels_per_replay(torch, graphs, reps=3):
    """Kernel nodes per replay, counted by torch.profiler (CUPTI) over a few replays outside the timed loop."""
    from torch.profiler import ProfilerActivity, profile

    out = {}
    for work, g in graphs.items():
        with profile(activities=[ProfilerActivity.CUDA]) as p:
            for _ in range(reps):
                g.replay()
            torch.cuda.synchronize()
        n = sum(1 for e in p.events() if e.device_type.name == "CUDA")
        out[work] = round(n / reps)
    return out


MODES = ("idle", "primed", "pipelined")
PIPELINE = 20  # replays queued back to back per sample in the pipelined mode


def _sleep_cycles_per_us(torch) -> float:
    """GPU clock cycles per microsecond of ``torch.cuda._sleep`` (a spin kernel), measured with CUDA events."""
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(1_000_000)
    a.record()
    torch.cuda._sleep(10_000_000)
    b.record()
    b.synchronize()
    return 10_000_000 / (a.elapsed_time(b) * 1e3)


def timed_loop(torch, graphs, iters, warmup, mode="idle", prime_us=0.0, cycles_per_us=0.0, blocked=False):
    """GPU ms and host us per replay of each graph, in one of three ways (issue 31: they differ under the tracer):

    idle       synchronize, event, replay(), event: the GPU sits idle while replay() runs on the host, so the
               figure is the host's launch latency plus the graph's execution (what issue 15's table measured)
    primed     a spin kernel of ``prime_us`` queued first, then event, replay(), event: the launch is submitted
               while the GPU is busy, so the figure is the graph's execution alone (the device time of the step)
    pipelined  event, PIPELINE replays back to back, event, / PIPELINE: the step time of an engine that submits
               ahead (host- or device-bound, whichever is slower)
    """
    gpu = {k: [] for k in graphs}
    host = {k: [] for k in graphs}
    uncovered = {k: 0 for k in graphs}  # primed: replays whose host time outlasted the spin (figure not pure)
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    names = list(graphs)
    n = PIPELINE if mode == "pipelined" else 1
    if n > 1:  # a sample is n replays: as many replays in all as the other modes, in fewer samples
        iters, warmup = max(5, iters // n), max(1, warmup // n)
    if blocked:  # every replay of one work, then the next work's: no other graph launched in between
        plan = [(i, [name]) for name in names for i in range(warmup + iters)]
    else:  # interleaved, rotating which work goes first
        plan = [(i, names[i % len(names):] + names[:i % len(names)]) for i in range(warmup + iters)]
    for i, order in plan:
        for name in order:
            torch.cuda.synchronize()
            if mode == "primed":
                torch.cuda._sleep(int(prime_us * cycles_per_us))
            e0.record()
            t0 = time.perf_counter()
            for _ in range(n):
                graphs[name].replay()
            t1 = time.perf_counter()
            e1.record()
            e1.synchronize()
            if i >= warmup:
                gpu[name].append(e0.elapsed_time(e1) / n)
                host[name].append((t1 - t0) * 1e6 / n)
                if mode == "primed" and (t1 - t0) * 1e6 > prime_us:
                    uncovered[name] += 1
    return gpu, host, uncovered


def _stats(gpu, host, uncovered) -> dict:
    return {w: {"gpu_ms_median": statistics.median(gpu[w]), "gpu_ms_p10": quantile(gpu[w], 0.1),
                "gpu_ms_p90": quantile(gpu[w], 0.9), "host_replay_us_median": statistics.median(host[w]),
                "host_replay_us_max": max(host[w]), "uncovered": uncovered[w]} for w in gpu}


def _process_shape(torch, args) -> list:
    """What else the process holds beside the timed graphs (issue 31: the tracer's cost moved with it): the modules of
    another work, loaded by one eager layer of it (--extra-eager; its weights are one layer's), and device memory
    held unused (--ballast-gb). Kept alive until the process ends."""
    keep = []
    for work in args.extra_eager:
        m, H = build(torch, work, 1)
        x = torch.randn(1, H, device="cuda", dtype=torch.bfloat16)
        m.forward(x, torch.zeros(1, device="cuda", dtype=torch.int64))
        keep.append((m, x))
    if args.ballast_gb:
        keep.append(torch.empty(int(args.ballast_gb * (1 << 30)), dtype=torch.uint8, device="cuda"))
    torch.cuda.synchronize()
    return keep


def inner(args) -> dict:
    import torch

    t0 = time.perf_counter()
    graphs, _inputs = capture(torch, args.works, args.layers)
    for w in args.drop:  # replayed once, then destroyed before any timing (issue 31: does a live second exec matter?)
        graphs[w].replay()
        torch.cuda.synchronize()
        graphs.pop(w).reset()
    torch.cuda.synchronize()
    _extra = _process_shape(torch, args)  # alive until the process ends
    t_setup = time.perf_counter() - t0
    cpu = _sleep_cycles_per_us(torch)
    out = {"iters": args.iters, "layers": args.layers, "setup_s": round(t_setup, 2),
           "traced": bool(os.environ.get("CUDA_INJECTION64_PATH")), "profiler": args.profiler, "modes": {},
           "sleep_cycles_per_us": round(cpu, 1), "blocked": args.blocked, "extra_eager": args.extra_eager,
           "ballast_gb": args.ballast_gb, "dropped": args.drop}
    prime_us = 0.0
    for mode in args.modes:
        if mode == "primed":  # long enough to cover the slowest host replay seen so far, 2 ms at least
            seen = [v["host_replay_us_max"] for m in out["modes"].values() for v in m.values()]
            prime_us = max([2000.0] + [3 * x for x in seen])
            out["prime_us"] = round(prime_us)
        if args.profiler:
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CUDA]):
                res = timed_loop(torch, graphs, args.iters, args.warmup, mode, prime_us, cpu, args.blocked)
        else:
            res = timed_loop(torch, graphs, args.iters, args.warmup, mode, prime_us, cpu, args.blocked)
        out["modes"][mode] = _stats(*res)
    out["works"] = out["modes"][args.modes[0]]  # the first mode asked for, under the key older tables read
    if args.count_kernels:
        for w, n in kernels_per_replay(torch, graphs).items():
            for m in out["modes"].values():
                m[w]["kernel_nodes"] = n
    return out


def config_env(cfg, args):
    env = dict(os.environ)
    for k in [k for k in env if k.startswith("KVCONV_") or k == "CUDA_INJECTION64_PATH"]:
        env.pop(k)
    extra = []
    if cfg in ("before", "after", "floor", "after-nopatch"):
        lib = args.before_lib if cfg == "before" else args.lib
        env["CUDA_INJECTION64_PATH"] = str(Path(lib).resolve())
        env["KVCONV_KERNELS"] = KERNELS if cfg != "after-nopatch" else "kvconv_no_such_kernel"
        env["KVCONV_OUTPUT"] = str(Path(args.dump_dir) / f"cost-{cfg}-%p.kvdump")
        if cfg == "before" and args.before_patch:
            env["KVCONV_PATCH_FILE"] = str(Path(args.before_patch).resolve())
        if cfg == "floor":
            env["KVCONV_CALLBACKS"] = "none"
    if cfg in args.variant:  # this build with extra environment, e.g. another patch fatbin or KVCONV_WRITES=1
        env["CUDA_INJECTION64_PATH"] = str(Path(args.lib).resolve())
        env["KVCONV_KERNELS"] = KERNELS
        env["KVCONV_OUTPUT"] = str(Path(args.dump_dir) / f"cost-{cfg}-%p.kvdump")
        env.update(args.variant[cfg])
    if "CUDA_INJECTION64_PATH" in env and args.host_capacity:  # every replay's records kept, as an engine sizes them
        env.setdefault("KVCONV_HOST_CAPACITY", str(args.host_capacity))
    if cfg == "profiler":
        extra.append("--profiler")
    return env, extra


def _works(res, mode):
    """One inner process's per-work figures for a timing mode (older results have only ``works``: idle)."""
    if not res:
        return None
    return res.get("modes", {}).get(mode) or (res["works"] if mode == "idle" else None)


def summarize(rounds, configs, mode="idle"):
    """Per work and config: medians pooled over rounds, added vs the same round's untraced, per node costs."""
    rounds = [{c: ({"works": _works(r[c], mode)} if _works(r[c], mode) else None) for c in r} for r in rounds]
    table = {}
    for w in WORKS:
        base = [r["untraced"]["works"][w] for r in rounds if r.get("untraced") and w in r["untraced"]["works"]]
        if not base:
            continue
        nodes = base[0].get("kernel_nodes")
        rows = {}
        for cfg in configs:
            adds, host, gpu = [], [], []
            for r in rounds:
                x, b = r.get(cfg), r.get("untraced")
                if not x or not b or w not in x["works"]:
                    continue
                adds.append(x["works"][w]["gpu_ms_median"] / b["works"][w]["gpu_ms_median"] - 1)
                gpu.append(x["works"][w]["gpu_ms_median"])
                host.append(x["works"][w]["host_replay_us_median"])
            if not adds:
                continue
            add_us = statistics.mean(gpu) * 1e3 - statistics.mean(b_["gpu_ms_median"] for b_ in base) * 1e3
            rows[cfg] = {"gpu_ms": statistics.mean(gpu), "added": statistics.mean(adds),
                         "added_per_round": adds, "host_replay_us": statistics.mean(host),
                         "added_us_per_graph_node": add_us / nodes if nodes else None,
                         "added_us_per_traced_node": add_us / TARGETS_PER_REPLAY[w]}
        table[w] = {"kernel_nodes": nodes, "traced_nodes": TARGETS_PER_REPLAY[w], "configs": rows}
    return table

COLUMNS = [Col("work", "13"), Col("nodes", "5d"), Col("config", "14"), Col("gpu ms", "8.4f"),
           Col("added", "+7.2f", "%"), Col("rounds", ">16"), Col("host us", "8.0f"), Col("us/node", "8.3f"),
           Col("us/traced", "9.2f")]


def table_rows(table) -> list[tuple]:
    """One row of COLUMNS per work and config of :func:`summarize`'s table (added cost as percentages)."""
    return [(w, t["kernel_nodes"] or 0, cfg, o["gpu_ms"], o["added"] * 100,
             " ".join(f"{a * 100:+.1f}" for a in o["added_per_round"]), o["host_replay_us"],
             o["added_us_per_graph_node"] if o["added_us_per_graph_node"] is not None else float("nan"),
             o["added_us_per_traced_node"]) for w, t in table.items() for cfg, o in t["configs"].items()]



def outer(args) -> int:
    rounds = []
    for rnd in range(args.rounds):
        # alternating order (ABCD, DCBA, ...) but the baseline first in each round: a round cut short keeps its base
        rest = [c for c in args.configs if c != "untraced"]
        order = [c for c in args.configs if c == "untraced"] + (rest if rnd % 2 == 0 else rest[::-1])
        res = {}
        for cfg in order:
            env, extra = config_env(cfg, args)
            if cfg == "untraced" and rnd == 0:
                extra.append("--count-kernels")
            cmd = [sys.executable, __file__, "--inner", "--iters", str(args.iters), "--warmup", str(args.warmup),
                   "--layers", str(args.layers), "--works", *args.works, "--modes", *args.modes,
                   "--ballast-gb", str(args.ballast_gb), *(["--blocked"] if args.blocked else []),
                   *(["--extra-eager", *args.extra_eager] if args.extra_eager else []),
                   *(["--drop", *args.drop] if args.drop else []), *extra]
            t = time.perf_counter()
            try:
                p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
            except subprocess.TimeoutExpired as e:  # this config has no figures; the others still count
                p = subprocess.CompletedProcess(cmd, -9, "", f"Error: timed out after {e.timeout} s\n")
            print(f"# round {rnd + 1} {cfg}: exit {p.returncode} in {time.perf_counter() - t:.1f} s", flush=True)
            sys.stderr.write("".join(ln + "\n" for ln in p.stderr.splitlines() if "kvconv-tracer" in ln
                                     or "Error" in ln or "error" in ln)[-3000:])
            res[cfg] = json.loads(p.stdout.strip().splitlines()[-1]) if p.returncode == 0 and p.stdout.strip() else None
        rounds.append(res)
        if args.out:  # after every round: a run cut short by its bound keeps the rounds it finished
            Path(args.out).write_text(json.dumps({"argv": sys.argv, "rounds": rounds,
                                                  "table": summarize(rounds, args.configs, args.modes[0]),
                                                  "tables": {m: summarize(rounds, args.configs, m)
                                                             for m in args.modes}},
                                                 indent=1, sort_keys=True) + "\n")
    for m in args.modes:
        print(f"# timing: {m}")
        print_table(COLUMNS, table_rows(summarize(rounds, args.configs, m)))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--inner", action="store_true")
    ap.add_argument("--works", nargs="+", default=WORKS, choices=WORKS)
    ap.add_argument("--configs", nargs="+", default=["untraced", "before", "after", "floor", "profiler"],
                    choices=["untraced", "before", "after", "floor", "profiler", "after-nopatch"])
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=VAR=VALUE[,VAR=VALUE]",
                    help="an extra config (run after --configs): this build (--lib) with these environment "
                         "variables, e.g. "
                         "nolookup=KVCONV_PATCH_FILE=/tmp/nolookup.fatbin or writes=KVCONV_WRITES=1")
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES,
                    help="timings per replay (see timed_loop): idle includes the host's launch latency, primed is "
                         "the graph's device time alone, pipelined the step time when the host submits ahead")
    ap.add_argument("--extra-eager", nargs="*", default=[], choices=WORKS,
                    help="also run one layer of these works eagerly after the capture (their modules loaded)")
    ap.add_argument("--ballast-gb", type=float, default=0.0, help="also hold this much device memory, unused")
    ap.add_argument("--drop", nargs="*", default=[], choices=WORKS,
                    help="works captured and replayed once, then their graph destroyed before the timing")
    ap.add_argument("--blocked", action="store_true",
                    help="time each work's replays in one block (default: the works interleaved, one replay each)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--layers", type=int, default=40)
    ap.add_argument("--lib", default=str(ROOT / "native" / "build" / "libkvconv_tracer.so"))
    ap.add_argument("--before-lib", default=None)
    ap.add_argument("--before-patch", default=None, help="KVCONV_PATCH_FILE for the before library")
    ap.add_argument("--dump-dir", default="/tmp")
    ap.add_argument("--host-capacity", type=int, default=0,
                    help="KVCONV_HOST_CAPACITY for the traced configs (0: the tracer's default, 65,536 records a "
                         "table, which the default run overflows: later replays then skip their host records)")
    ap.add_argument("--timeout", type=int, default=240)
    ap.add_argument("--profiler", action="store_true")
    ap.add_argument("--count-kernels", action="store_true")
    ap.add_argument("--out")
    args = ap.parse_args()
    variants = {}
    for v in args.variant:
        name, _, env = v.partition("=")
        pairs = [kv.split("=", 1) for kv in env.split(",") if kv]
        if not name or any(len(p) != 2 for p in pairs):
            ap.error(f"--variant {v!r}: expected NAME=VAR=VALUE[,VAR=VALUE]")
        variants[name] = dict(pairs)
    args.variant = variants
    args.configs += [v for v in variants if v not in args.configs]
    if args.inner:
        print(json.dumps(inner(args), sort_keys=True), flush=True)
        return 0
    return outer(args)


if __name__ == "__main__":
    sys.exit(main())
