"""A decode workload shaped like the seed's vLLM request, for the tracer's GPU fixtures and overhead bench.

40 layers; each layer writes its new key/value rows into its own paged KV cache with a kernel named exactly
``reshape_and_cache_flash_kernel`` (extern "C", one block per token, cache slot from a slot mapping), between per-layer
matmuls. One eager prefill of ``--prefill`` tokens, then one CUDA graph captured for a 1-token decode step and
replayed ``--replays`` times (the slot mapping and input are static buffers refreshed before every replay, as vLLM
does). ``--streams 2`` captures a graph whose layers alternate between two streams (two independent branches).

Checks its own work: after the run every layer's cache must hold exactly prefill + replays written rows (the rest
keep their poison pattern). Prints one JSON line with the predicted launch counts and block counts.

    python3 native/workloads/kv_decode.py --streams 1 --json out.json
    kvconv record -o run.kvdump -- python3 native/workloads/kv_decode.py

Work sizes (--work): tiny (hidden 256), light (hidden 5120: one 5120x5120 matmul + the K/V projection per layer),
qwen14b (Qwen3-14B decode-layer matmuls: qkv 5120x7168, o 5120x5120, gate_up 5120x34816, down 17408x5120).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

KV_SRC = r"""
extern "C" __global__ void reshape_and_cache_flash_kernel(
    const unsigned short* __restrict__ key, const unsigned short* __restrict__ value,
    unsigned short* __restrict__ key_cache, unsigned short* __restrict__ value_cache,
    const long long* __restrict__ slot_mapping, long long src_stride, int n, int block_size) {
  const long long token = blockIdx.x;            // one block per token
  const long long slot = slot_mapping[token];
  if (slot < 0) return;                          // padding token
  const long long blk = slot / block_size, off = slot % block_size;
  const long long dst = (blk * block_size + off) * (long long)n;
  const long long src = token * src_stride;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    key_cache[dst + i] = key[src + i];
    value_cache[dst + i] = value[src + i];
  }
}
"""
# Same code under another name, in its own module: a twin the tracer does not patch (bench baseline in-process).
TWIN_SRC = KV_SRC.replace("reshape_and_cache_flash_kernel", "kv_twin_copy_kernel")

POISON = -1  # int16 view 0xFFFF: a bf16 NaN that no matmul output equals bit-for-bit here


class KvKernel:
    """Launches the KV write kernel on torch's current stream (CuPy RawModule; load_inline fallback)."""

    def __init__(self, name: str, src: str):
        import torch

        self.torch = torch
        self.name = name
        self.backend = None
        try:
            import cupy as cp

            self.cp = cp
            self.fn = cp.RawModule(code=src).get_function(name)
            self.backend = "cupy"
        except Exception as e:  # noqa: BLE001
            print(f"kv_decode: cupy unavailable ({type(e).__name__}: {e}); using load_inline", file=sys.stderr)
            from torch.utils.cpp_extension import load_inline

            cu = src + r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
void launch(torch::Tensor k, torch::Tensor v, torch::Tensor kc, torch::Tensor vc, torch::Tensor slots,
            int64_t stride, int64_t n, int64_t bs) {
  auto s = at::cuda::getCurrentCUDAStream();
  NAME<<<k.size(0), 128, 0, s>>>((const unsigned short*)k.data_ptr(), (const unsigned short*)v.data_ptr(),
      (unsigned short*)kc.data_ptr(), (unsigned short*)vc.data_ptr(), (const long long*)slots.data_ptr(),
      (long long)stride, (int)n, (int)bs);
}
""".replace("NAME", name)
            self.ext = load_inline(name=f"kv_{name}", cpp_sources="void launch(torch::Tensor k, torch::Tensor v, "
                                   "torch::Tensor kc, torch::Tensor vc, torch::Tensor slots, int64_t stride, "
                                   "int64_t n, int64_t bs);", cuda_sources=cu, functions=["launch"], verbose=False)
            self.backend = "load_inline"

    def __call__(self, k, v, kc, vc, slots, n: int, block_size: int) -> None:
        T = slots.shape[0]
        stride = k.stride(0)
        if self.backend == "cupy":
            cp = self.cp
            import numpy as np

            with cp.cuda.ExternalStream(self.torch.cuda.current_stream().cuda_stream):
                self.fn((T,), (128,), (np.uint64(k.data_ptr()), np.uint64(v.data_ptr()), np.uint64(kc.data_ptr()),
                                       np.uint64(vc.data_ptr()), np.uint64(slots.data_ptr()), np.int64(stride),
                                       np.int32(n), np.int32(block_size)))
        else:
            self.ext.launch(k, v, kc, vc, slots, stride, n, block_size)


class Model:
    def __init__(self, args, kv: KvKernel):
        import torch

        self.torch = torch
        self.args = args
        self.kv = kv
        dev = "cuda"
        dt = torch.bfloat16
        H = {"tiny": 256, "light": 5120, "qwen14b": 5120}[args.work]
        self.H = H
        self.n = args.kv_heads * args.head_dim
        n = self.n
        g = torch.Generator(device=dev).manual_seed(1234)

        def w(r, c):
            return (torch.randn(r, c, device=dev, dtype=dt, generator=g) * (1.0 / r ** 0.5)).contiguous()

        self.layers = []
        for _ in range(args.layers):
            L = {}
            if args.work == "qwen14b":
                L["qkv"] = w(H, H + 2 * n)
                L["o"] = w(H, H)
                L["gu"] = w(H, 2 * 17408)
                L["d"] = w(17408, H)
            else:
                L["qkv"] = w(H, H + 2 * n) if args.work == "tiny" else w(H, 2 * n)
                L["o"] = w(H, H)
            self.layers.append(L)
        slots_total = args.num_blocks * args.block_size
        self.kcache = [torch.full((slots_total, n), POISON, device=dev, dtype=torch.int16).view(dt)
                       for _ in range(args.layers)]
        self.vcache = [torch.full((slots_total, n), POISON, device=dev, dtype=torch.int16).view(dt)
                       for _ in range(args.layers)]

    def layer(self, i: int, h, slots):
        torch = self.torch
        L = self.layers[i]
        H, n = self.H, self.n
        qkv = h @ L["qkv"]
        if self.args.work == "light":
            k, v, q = qkv[:, :n], qkv[:, n:], h
        else:
            q, k, v = qkv[:, :H], qkv[:, H:H + n], qkv[:, H + n:]
        self.kv(k, v, self.kcache[i], self.vcache[i], slots, n, self.args.block_size)
        h = h + torch.tanh(q @ L["o"])
        if "gu" in L:
            gu = h @ L["gu"]
            gate, up = gu.chunk(2, dim=-1)
            h = h + (torch.nn.functional.silu(gate) * up) @ L["d"]
        return h

    def forward(self, x, slots, streams=None):
        if not streams or len(streams) == 1:
            h = x
            for i in range(self.args.layers):
                h = self.layer(i, h, slots)
            return h
        torch = self.torch
        main = torch.cuda.current_stream()
        for s in streams:
            s.wait_stream(main)
        hs = [x for _ in streams]
        for i in range(self.args.layers):
            j = i % len(streams)
            with torch.cuda.stream(streams[j]):
                hs[j] = self.layer(i, hs[j], slots)
        for s in streams:
            main.wait_stream(s)
        return sum(hs)


def written_rows(model) -> list[int]:
    torch = model.torch
    out = []
    for kc, vc in zip(model.kcache, model.vcache):
        ki = kc.view(torch.int16)
        vi = vc.view(torch.int16)
        wk = (ki != POISON).any(dim=1)
        wv = (vi != POISON).any(dim=1)
        out.append(int((wk & wv).sum().item()))
    return out


END_HOOK = None  # called right after the last replay when set (die.py)


def timed_replays(graph, slot, tok, args, gen) -> list[float]:
    """Replay the decode graph ``args.replays`` times, refreshing its static inputs first as vLLM does (the next
    cache slot, a new token row); returns each replay's GPU time in ms (CUDA events)."""
    import torch

    step_ms = []
    for r in range(args.replays):
        slot.fill_(args.prefill + r)
        tok.copy_(torch.randn(tok.shape, device=tok.device, dtype=tok.dtype, generator=gen))
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        graph.replay()
        e1.record()
        e1.synchronize()
        step_ms.append(e0.elapsed_time(e1))
    torch.cuda.synchronize()
    return step_ms


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=40)
    ap.add_argument("--prefill", type=int, default=37, help="prefill tokens (one block each)")
    ap.add_argument("--replays", type=int, default=7)
    ap.add_argument("--streams", type=int, default=1, choices=(1, 2))
    ap.add_argument("--work", default="tiny", choices=("tiny", "light", "qwen14b"))
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--num-blocks", type=int, default=8)
    ap.add_argument("--json", help="write the summary here too")
    ap.add_argument("--sleep-after", type=float, default=0.0, help="sleep this long before exiting (signal tests)")
    ap.add_argument("--warmup", type=int, default=0,
                    help="eager forwards of the prompt before the prefill, as an engine's memory profiling and "
                         "warm-up (they rewrite the prefill's slots); the capture-range tests leave them out")
    ap.add_argument("--profiler-range", action="store_true",
                    help="torch.cuda.profiler.start() before the replays and stop() after them (cudaProfilerStart/"
                         "Stop: kvconv record --capture-range profiler)")
    ap.add_argument("--signal-range", action="store_true",
                    help="SIGUSR1 to itself before the replays, SIGUSR2 after (kvconv record --capture-range signal)")
    args = ap.parse_args(argv)

    import torch

    assert args.prefill + args.replays <= args.num_blocks * args.block_size
    t0 = time.perf_counter()
    kv = KvKernel("reshape_and_cache_flash_kernel", KV_SRC)
    model = Model(args, kv)
    H = model.H
    dev = "cuda"
    gen = torch.Generator(device=dev).manual_seed(7)

    # eager prefill: one forward over the prompt, slots 0..prefill-1 (after the warm-up's forwards, if any)
    x = torch.randn(args.prefill, H, device=dev, dtype=torch.bfloat16, generator=gen)
    slots = torch.arange(args.prefill, device=dev, dtype=torch.int64)
    for _ in range(args.warmup):
        model.forward(x, slots)
    model.forward(x, slots)
    torch.cuda.synchronize()

    # decode graph: static buffers, captured once, replayed with fresh inputs
    tok = torch.randn(1, H, device=dev, dtype=torch.bfloat16, generator=gen)
    slot = torch.full((1,), -1, device=dev, dtype=torch.int64)
    graph = torch.cuda.CUDAGraph()
    extra = [torch.cuda.Stream() for _ in range(args.streams)] if args.streams > 1 else None
    with torch.cuda.graph(graph):
        out = model.forward(tok, slot, streams=extra)
    torch.cuda.synchronize()
    expected = {
        "warmup_launches": args.layers * args.warmup,
        "warmup_blocks": args.layers * args.warmup * args.prefill,
        "eager_launches": args.layers,
        "eager_blocks": args.layers * args.prefill,
        "graph_nodes_per_replay": args.layers,
        "graph_node_records": args.layers * args.replays,
        "graph_blocks": args.layers * args.replays,
        "device_events": args.layers * args.prefill + args.layers * args.replays,
    }
    if args.profiler_range:
        torch.cuda.profiler.start()
    if args.signal_range:  # the tracer's signal thread opens the range; give it a moment to see the signal
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(0.2)
    step_ms = timed_replays(graph, slot, tok, args, gen)
    if args.profiler_range:
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
    if args.signal_range:
        torch.cuda.synchronize()
        os.kill(os.getpid(), signal.SIGUSR2)
        time.sleep(0.2)
    if END_HOOK is not None:  # die.py os-exit-now: the end comes right after the last target launch
        print(json.dumps({"workload": "kv_decode", "expected": expected, "ended_by": "END_HOOK"}), flush=True)
        END_HOOK()
    rows = written_rows(model)
    expect_rows = args.prefill + args.replays
    ok = all(r == expect_rows for r in rows) and bool(torch.isfinite(out.float()).all())
    summary = {
        "workload": "kv_decode",
        "kernel_backend": kv.backend,
        "layers": args.layers,
        "streams": args.streams,
        "work": args.work,
        "prefill_tokens": args.prefill,
        "replays": args.replays,
        "expected": expected,
        "cache_rows_written_per_layer": sorted(set(rows)),
        "cache_rows_expected": expect_rows,
        "check_ok": ok,
        "step_ms": [round(s, 4) for s in step_ms],
        "wall_s": round(time.perf_counter() - t0, 3),
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "pid": os.getpid(),
    }
    line = json.dumps(summary, sort_keys=True)
    print(line, flush=True)
    if args.json:
        with open(args.json, "w") as f:
            f.write(line + "\n")
    if args.sleep_after:
        time.sleep(args.sleep_after)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
