"""The value canary's cost: the digests of a 40-layer decode step's written rows at batch 64
(kvconv.capture.probe.values.ValueProbe) against the step's own time. Goal: within 5 % of the step. Results
of past runs: docs/results/value-digest-2026-12-03/ (docs/results/INDEX.md).

    PYTHONPATH=. python3 bench/value_digest_cost.py --json value_digest_cost.json     # on the GPU
    PYTHONPATH=. python3 bench/value_digest_cost.py --small                                       # smoke run, CPU
    PYTHONPATH=. python3 bench/value_digest_cost.py --profile pooled          # where a probed step's time goes

The step: one CUDA graph of ``--layers`` decoder layers of a dense GQA model (hidden 4096, 8 KV heads x 128, FFN
14336: an 8B shape), batch ``--batch``: per layer QKV projection, the K/V append of every row into its paged cache
slot (``index_copy_``), the output projection and a SwiGLU MLP, RMS-normalised. One layer's weights serve every
layer (436 MiB: 9x the H200's L2, so each layer still streams them from memory). Attention over the context is
left out: the step here is shorter than a real one, so the overhead it gives is an upper bound.

Per variant, ``--steps`` pairs of timed steps (after ``--warmup``), each ``replay(); synchronize()`` as an engine that
reads its sampled tokens back does, alternately without and with the probe around it (wall clock, median;
``probe_before_ms``: the probe's host work before the replay, ``probe_after_ms``: after the replay was queued, until
the block returned: on the torch path that includes waiting for the step's device work and making its records, on
the fused path it is the launches of the step and the records of the step before, made while the device runs it):
  pooled        the 2 x layers caches are views of one pool tensor
  apart         every cache its own tensor
  pooled-after  pooled, without the digest before the step (before=False: a missed write then reads as wrong value)
each with the probe's fused path (a Triton kernel digesting the rows in place from their addresses: the slots by
one CUDA graph replay before the step and one after, the given rows by a launch after it, one copy back), as
``<variant>-launch`` with the slots by Triton launches instead of replays (``graphs=False``), and, as
``<variant>-unfused``, with its torch path (``fused=False``: a gather for the pooled caches or one per cache, then
one digest pass over all), in the same process. ``path`` says
which one the probe took on every step ("fused" or "torch"; the fused variants fall back to "torch" on the CPU or
without triton). The probe digests, per step, the expected rows (the K/V the step wrote, given with ``expect=``),
and the slots after (and before) the step: 3 x 2 x layers x batch rows of 2 KiB. Prints one JSON document.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from _timing import quantile  # noqa: E402 - beside this script


def build(args, torch, pooled: bool):
    dev, dt = args.device, torch.bfloat16
    h, kvd, ffn, L, B = args.hidden, args.kv_heads * args.head_dim, args.ffn, args.layers, args.batch
    g = torch.Generator(device="cpu").manual_seed(0)

    def w(*shape):
        return (torch.randn(*shape, generator=g) / shape[0] ** 0.5).to(dev, dt)

    wqkv, wo, wup, wdown = w(h, h + 2 * kvd), w(h, h), w(h, 2 * ffn), w(ffn, h)
    if pooled:
        pool = torch.zeros(2 * L, args.num_pages, args.page_size, kvd, dtype=dt, device=dev)
        caches = [pool[i] for i in range(2 * L)]
    else:
        caches = [torch.zeros(args.num_pages, args.page_size, kvd, dtype=dt, device=dev) for _ in range(2 * L)]
    flat = [c.view(-1, kvd) for c in caches]
    x_in = torch.randn(B, h, generator=g).to(dev, dt)
    slots = torch.zeros(B, dtype=torch.int64, device=dev)
    outs = {}

    def body():
        x = x_in
        for layer in range(L):
            qkv = x @ wqkv
            k, v = qkv[:, h:h + kvd], qkv[:, h + kvd:]
            flat[2 * layer].index_copy_(0, slots, k)
            flat[2 * layer + 1].index_copy_(0, slots, v)
            outs[2 * layer], outs[2 * layer + 1] = k, v  # the rows the step writes (static in the graph)
            x = x + qkv[:, :h] @ wo
            up = x @ wup
            x = x + (torch.nn.functional.silu(up[:, :ffn]) * up[:, ffn:]) @ wdown
            x = x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(dt)

    if dev.startswith("cuda"):
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            body()
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            body()
        torch.cuda.synchronize()
        replay = graph.replay
    else:
        body()
        replay = body
    return caches, outs, slots, replay


def sync(torch, dev):
    if dev.startswith("cuda"):
        torch.cuda.synchronize()


def make_probe(args, torch, name: str, path: str):
    """Variant ``name``'s step and a ValueProbe watching its caches, recording into ``path``: (probe, replay, the
    graph's slot tensor, {cache name: the rows the step writes there}, the expect= of every step)."""
    from kvconv.capture.probe.values import ValueProbe
    from kvconv.capture.probe.writer import CanaryRecorder

    base_name = name.removesuffix("-unfused").removesuffix("-launch")
    caches, outs, slots, replay = build(args, torch, base_name != "apart")
    vp = ValueProbe(CanaryRecorder(path), before=base_name != "pooled-after",
                    fused=False if name.endswith("-unfused") else None, graphs=not name.endswith("-launch"))
    names = [f"L{i // 2}.{'kv'[i % 2]}" for i in range(len(caches))]
    for c, n in zip(caches, names):
        vp.watch(c, name=n, page_size=args.page_size)
    return vp, replay, slots, {n: outs[i] for i, n in enumerate(names)}


def run_variant(args, torch, name: str) -> dict:
    B, P = args.batch, args.page_size
    step_slots = [(1 + 2 * r) * P for r in range(B)]  # row r writes the first slot of its own page

    def set_slots(step):
        host = [s + step % P for s in step_slots]
        slots.copy_(torch.tensor(host, dtype=torch.int64))
        return host

    with tempfile.TemporaryDirectory() as tmp:
        vp, replay, slots, expect = make_probe(args, torch, name, os.path.join(tmp, "v.kvdump"))
        reqs = list(range(1, B + 1))
        base, probed = [], []
        for step in range(args.warmup + args.steps):  # a plain step and a probed one, in turn
            set_slots(step)
            t = time.perf_counter_ns()
            replay()
            sync(torch, args.device)
            t_plain = time.perf_counter_ns() - t
            host = set_slots(step)
            t = time.perf_counter_ns()
            with vp.step(step, host, reqs, expect=expect):
                replay()
            sync(torch, args.device)  # the engine reads its sampled tokens back (the fused probe does not wait)
            if step >= args.warmup:
                base.append(t_plain)
                probed.append(time.perf_counter_ns() - t)
        vp.close()
        from kvconv.format import dump

        with dump.open(os.path.join(tmp, "v.kvdump")) as d:
            v = d.records("value_digest")
            wrong = int((v["expected"] != v["actual"]).sum())
            records = len(v)
    warm = vp.timings[args.warmup:]
    med_b, med_p = statistics.median(base), statistics.median(probed)
    path = "fused" if vp.fused_steps == vp.steps else "torch" if not vp.fused_steps else "mixed"
    return {"variant": name, "path": path, "step_ms": round(med_b / 1e6, 4),
            "step_with_probe_ms": round(med_p / 1e6, 4),
            "overhead_pct": round(100 * (med_p - med_b) / med_b, 2),
            "probe_before_ms": round(statistics.median(t for t, _ in warm) / 1e6, 4),
            "probe_after_ms": round(statistics.median(t for _, t in warm) / 1e6, 4),
            "step_p90_ms": round(quantile(base, 0.9) / 1e6, 4),
            "with_probe_p90_ms": round(quantile(probed, 0.9) / 1e6, 4),
            "records": records, "wrong_values": wrong,
            "slot_graphs": len(vp._fused[0].graphs) if vp._fused else 0}  # 4 where the slots went by replays


_SECTIONS = ("fused.FusedStep.__init__", "fused.FusedStep.launch", "fused.FusedStep.queue_read",
             "fused.FusedStep.blocks", "fused.FusedBuffers.get", "fused.FusedBuffers.copy",
             "fused.FusedBuffers.mark", "fused.queue_rows", "fused.columns_from_blocks",
             "values.ValueProbe._fused_before", "values.ValueProbe._fused_after", "values.ValueProbe._flush",
             "values.ValueProbe._record", "values.ValueProbe._live", "_digest_triton.digest_addresses",
             "fused.FusedStep.slots", "_digest_triton.SlotDigests.run",
             "writer.CanaryRecorder.add_records")


def _time_sections() -> dict:
    """Wrap the probe's functions of _SECTIONS with a timer: {label: (original, owner, [ns per call])}."""
    import functools
    import importlib

    out = {}
    for label in _SECTIONS:
        mod, *attrs = label.split(".")
        try:
            owner = importlib.import_module(f"kvconv.capture.probe.{mod}")
            for a in attrs[:-1]:
                owner = getattr(owner, a)
            orig = getattr(owner, attrs[-1])
        except (ImportError, AttributeError):
            continue
        ns: list = []

        def timed(*a, _f=orig, _ns=ns, **k):
            t = time.perf_counter_ns()
            try:
                return _f(*a, **k)
            finally:
                _ns.append(time.perf_counter_ns() - t)

        setattr(owner, attrs[-1], functools.wraps(orig)(timed))
        out[label] = (orig, owner, ns)
    from kvconv.capture.probe import fused

    fused.kernel.cache_clear()  # it holds the launcher it found
    return out


def _untime_sections(sections: dict) -> None:
    for label, (orig, owner, _ns) in sections.items():
        setattr(owner, label.split(".")[-1], orig)
    from kvconv.capture.probe import fused

    fused.kernel.cache_clear()


def profile(args, torch, name: str) -> None:
    """Where one variant's probed steps spend their time: the probe's host calls (cProfile over ``--steps`` probed
    steps, top 25 by own time) and the device's kernels and copies (torch.profiler over 10 probed steps)."""
    import cProfile
    import io
    import pstats

    with tempfile.TemporaryDirectory() as tmp:
        vp, replay, slots, expect = make_probe(args, torch, name, os.path.join(tmp, "v.kvdump"))
        host = [(1 + 2 * r) * args.page_size for r in range(args.batch)]
        slots.copy_(torch.tensor(host, dtype=torch.int64))
        reqs = list(range(1, args.batch + 1))

        def probed(step):
            with vp.step(step, host, reqs, expect=expect):
                replay()
            sync(torch, args.device)

        for step in range(args.warmup):
            probed(step)
        sections = _time_sections()
        for step in range(args.steps):
            probed(args.warmup + step)
        _untime_sections(sections)
        print(f"# {name}: host us per call (median of {args.steps} steps; wrapped functions, nested ones inside)")
        for label, (_o, _w, ns) in sections.items():
            if ns:
                print(f"{label:42s} calls/step {len(ns) / args.steps:5.1f}  median {statistics.median(ns) / 1e3:8.1f}"
                      f"  p90 {quantile(ns, 0.9) / 1e3:8.1f}")
        warm = vp.timings[-args.steps:]
        print(f"probe before (t0..t1) {statistics.median(t for t, _ in warm) / 1e3:.1f} us, after (t2..end) "
              f"{statistics.median(t for _, t in warm) / 1e3:.1f} us")
        prof = cProfile.Profile()
        prof.enable()
        for step in range(args.steps):
            probed(args.warmup + step)
        prof.disable()
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(25)
        print(f"# {name}: host, {args.steps} probed steps (cProfile: its own overhead inflates small calls)")
        print(text.getvalue())
        if args.device.startswith("cuda"):
            from torch.profiler import ProfilerActivity
            from torch.profiler import profile as tprofile

            with tprofile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as tp:
                for step in range(10):
                    probed(args.warmup + args.steps + step)
            print(f"# {name}: device, 10 probed steps")
            print(tp.key_averages().table(sort_by="self_cuda_time_total", row_limit=15, max_name_column_width=60))
        vp.close()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=40)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--ffn", type=int, default=14336)
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--num-pages", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--device", default=None)
    ap.add_argument("--variants", default="pooled,pooled-launch,pooled-unfused,apart,apart-unfused,pooled-after,"
                    "pooled-after-unfused")
    ap.add_argument("--small", action="store_true", help="a tiny shape for a smoke run (CPU)")
    ap.add_argument("--json", help="also write the result here")
    ap.add_argument("--profile", metavar="VARIANT", help="profile this variant (host calls, device kernels) instead")
    args = ap.parse_args(argv)
    import torch

    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.device == "cpu":
        torch.set_num_threads(1)  # a smoke run: steadier on a shared machine
    if args.small:
        args.layers, args.batch, args.hidden, args.kv_heads, args.head_dim, args.ffn = 4, 8, 256, 2, 64, 512
        args.num_pages, args.steps, args.warmup = 64, 10, 2
    if 2 * args.batch + 1 > args.num_pages:
        ap.error("--num-pages must exceed 2 x --batch (each row writes its own page)")
    if args.profile:
        profile(args, torch, args.profile)
        return 0
    out = {"bench": "value_digest_cost", "torch": torch.__version__, "device": args.device,
           "gpu": torch.cuda.get_device_name() if args.device.startswith("cuda") else None,
           "layers": args.layers, "batch": args.batch, "caches": 2 * args.layers,
           "row_bytes": args.kv_heads * args.head_dim * 2, "steps": args.steps, "goal_pct": 5.0,
           "variants": [run_variant(args, torch, v) for v in args.variants.split(",")]}
    text = json.dumps(out, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
