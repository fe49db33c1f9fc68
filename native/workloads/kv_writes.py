"""A paged-KV decode workload for the write-address canary (issue 16), with planted slot bugs.

Requests own pages of a paged KV cache (page_size slots each; page 0 is the dummy page an SGLang-style engine sends
padding rows to). Every layer writes its new K/V rows with ``reshape_and_cache_flash_kernel`` (one block per batch row,
slot from the slot mapping), K and V caches of every layer registered with the write probe
(kvconv.capture.probe.writes). One eager prefill (step 0), then a CUDA graph of ``--rows`` batch rows replayed once per
decode step; a request finishes after step 2, so the later steps carry a padding row. Per step the probe records the
slot mapping the engine intends (token -> slot, request id, pad flag) around the replay.

Plants (--plant):
  none           clean run (vLLM style: padding rows map to -1, the kernel skips them)
  pad-minus-one  vLLM's PADDING_SLOT_ID=-1 written through: the kernel lacks the slot < 0 check
  stale-pad      SGLang style (padding rows meant for the dummy page 0), but the graph's slot buffer is refreshed only
                 for the live rows: the padding row keeps the stale slot of the previous step's last row, a live page
                 of another request
  wrong-page     one request's block-table entry off by one page: its slots land one page further (the mapping the
                 engine intends says otherwise)

    KVCONV_WRITES=1 kvconv record -o run.kvdump -- python3 native/workloads/kv_writes.py --plant stale-pad
    kvconv canary --writes run.kvdump

--bench N: time N replays (CUDA events, median) after the checked steps, printed in the JSON line (overhead runs).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

KERNEL = r"""
extern "C" __global__ void reshape_and_cache_flash_kernel(
    const unsigned short* __restrict__ key, const unsigned short* __restrict__ value,
    unsigned short* __restrict__ key_cache, unsigned short* __restrict__ value_cache,
    const long long* __restrict__ slot_mapping, long long src_stride, int n, int block_size) {
  const long long token = blockIdx.x;            // one block per batch row
  const long long slot = slot_mapping[token];
  CHECK                                          // padding rows (slot -1) are skipped
  const long long dst = slot * (long long)n;
  const long long src = token * src_stride;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    key_cache[dst + i] = key[src + i];
    value_cache[dst + i] = value[src + i];
  }
}
"""


def kernel(plant: str):
    import cupy as cp

    check = "" if plant == "pad-minus-one" else "if (slot < 0) return;"
    return cp.RawModule(code=KERNEL.replace("CHECK", check)).get_function("reshape_and_cache_flash_kernel")


class Engine:
    """Caches, requests and their pages, the static graph buffers."""

    def __init__(self, args):
        import torch

        self.torch, self.args = torch, args
        self.n = args.kv_heads * args.head_dim
        self.bs = args.page_size
        self.slots = args.num_pages * self.bs
        guard = 8 * self.n  # room before every cache: a write at slot -1 lands in our own memory, not a neighbour's
        per = guard + self.slots * self.n
        self.pool = torch.zeros(2 * args.layers * per, device="cuda", dtype=torch.int16)
        self.caches = [self.pool[i * per + guard:(i + 1) * per].view(args.num_pages, self.bs, self.n)
                       for i in range(2 * args.layers)]
        self.W = [torch.randn(args.hidden, 2 * self.n, device="cuda", dtype=torch.bfloat16) * 0.05
                  for _ in range(args.layers)]
        self.x = torch.randn(args.rows, args.hidden, device="cuda", dtype=torch.bfloat16)
        self.slot_buf = torch.full((args.rows,), -1, device="cuda", dtype=torch.int64)
        # request r (1..R) owns pages 1 + 2(r-1) and 2 + 2(r-1); page 0 is the dummy page
        self.requests = list(range(1, args.requests + 1))
        self.pages = {r: [1 + 2 * (r - 1), 2 + 2 * (r - 1)] for r in self.requests}
        self.pos = {r: args.prompt for r in self.requests}

    def slot_of(self, r: int, pos: int, *, shift: int = 0) -> int:
        page = self.pages[r][pos // self.bs] + shift
        return page * self.bs + pos % self.bs

    def layers(self, slots, fn, rows: int):
        import cupy as cp

        with cp.cuda.ExternalStream(self.torch.cuda.current_stream().cuda_stream):
            self._layers(slots, fn, rows)

    def _layers(self, slots, fn, rows: int):
        import numpy as np

        for i, W in enumerate(self.W):
            kv = (self.x[:rows] @ W).view(self.torch.int16)
            k, v = kv[:, :self.n], kv[:, self.n:]
            fn((rows,), (128,), (np.uint64(k.data_ptr()), np.uint64(v.data_ptr()),
                                 np.uint64(self.caches[2 * i].data_ptr()), np.uint64(self.caches[2 * i + 1].data_ptr()),
                                 np.uint64(slots.data_ptr()), np.int64(k.stride(0)), np.int32(self.n),
                                 np.int32(self.bs)))


def decode_mapping(eng: Engine, live: list[int], plant: str, step: int):
    """(intended slots, request ids, pad flags) for the graph's rows, and the slots the buffer actually gets."""
    rows = eng.args.rows
    pad_slot = 0 if plant == "stale-pad" else -1  # SGLang's dummy page 0, vLLM's PADDING_SLOT_ID
    intended, reqs, pads = [], [], []
    for r in live:
        intended.append(eng.slot_of(r, eng.pos[r]))
        reqs.append(r)
        pads.append(False)
    while len(intended) < rows:
        intended.append(pad_slot)
        reqs.append(0)
        pads.append(True)
    actual = list(intended)
    if plant == "wrong-page" and step >= 2 and live[1:2]:
        r = live[1]
        actual[1] = eng.slot_of(r, eng.pos[r], shift=1)  # its block-table entry points one page further
    return intended, reqs, pads, actual


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--plant", choices=["none", "pad-minus-one", "stale-pad", "wrong-page"], default="none")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--steps", type=int, default=4, help="decode steps (graph replays) checked")
    ap.add_argument("--prompt", type=int, default=3, help="prompt tokens per request (the prefill)")
    ap.add_argument("--page-size", type=int, default=8)
    ap.add_argument("--num-pages", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--bench", type=int, default=0)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    import numpy as np
    import torch

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    from kvconv.capture.probe.writes import WriteProbe

    t0 = time.time()
    eng = Engine(args)
    fn = kernel(args.plant)
    probe = WriteProbe()
    for i, c in enumerate(eng.caches):
        probe.register_cache(c, page_size=args.page_size, name=f"L{i // 2}.{'kv'[i % 2]}")
    # step 0: the eager prefill of every request's prompt
    pre = [(r, p) for r in eng.requests for p in range(args.prompt)]
    pre_slots = torch.tensor([eng.slot_of(r, p) for r, p in pre], device="cuda", dtype=torch.int64)
    eng.x = torch.randn(max(len(pre), args.rows), args.hidden, device="cuda", dtype=torch.bfloat16)
    with probe.step(0, [eng.slot_of(r, p) for r, p in pre], [r for r, _ in pre]):
        eng.layers(pre_slots, fn, len(pre))
    torch.cuda.synchronize()
    # the decode graph
    live = list(eng.requests[:args.rows])
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    g = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s):
        with torch.cuda.graph(g, stream=s):
            eng.layers(eng.slot_buf, fn, args.rows)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    steps = []
    for step in range(1, args.steps + 1):
        if step == 3 and len(live) > 1:
            live = live[:1] + live[2:]  # the second request finished: the batch is compacted, one padding row
        intended, reqs, pads, actual = decode_mapping(eng, live, args.plant, step)
        if args.plant == "stale-pad" and step > 1:
            # the bug: only the live rows of the graph's slot buffer are refreshed; padding rows keep stale slots
            buf = eng.slot_buf.cpu().tolist()
            actual = actual[:len(live)] + buf[len(live):]
        eng.slot_buf.copy_(torch.tensor(actual, dtype=torch.int64))
        with probe.step(step, intended, reqs, pad=pads):
            g.replay()
        torch.cuda.synchronize()
        steps.append({"step": step, "intended": intended, "actual": actual, "requests": reqs, "pad": pads})
        for r in live:
            eng.pos[r] += 1
    bench = None
    if args.bench:
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(args.bench)]
        for a, b in ev:
            a.record()
            g.replay()
            b.record()
        torch.cuda.synchronize()
        ms = sorted(a.elapsed_time(b) for a, b in ev)
        bench = {"replays": args.bench, "median_ms": round(statistics.median(ms), 4), "p10_ms": round(ms[len(ms) // 10], 4)}
    out = {"workload": "kv_writes", "plant": args.plant, "probe_active": probe.active, "caches": len(probe.caches),
           "steps_recorded": probe.steps, "layers": args.layers, "rows": args.rows, "page_size": args.page_size,
           "steps": steps, "bench": bench, "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
           "wall_s": round(time.time() - t0, 2), "np": np.__version__}
    line = json.dumps(out, sort_keys=True)
    print(line)
    if args.json:
        with open(args.json, "w") as f:
            f.write(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
