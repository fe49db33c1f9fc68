"""GPU check of the vLLM plugin's session without vLLM: caches in vLLM 0.26.0's FlashAttention layout on CUDA,
steps as the V2 runner makes them (a prefill, FULL decodes, a mixed PIECEWISE step), the ValueProbe's fused path.
Writes DIR/clean.probe.kvdump and DIR/wrong.probe.kvdump (one K row of layer 5 written as 2k+1 at step 7); then
``kvconv validate`` on each: the first valid (exit 0), the second canary-wrong-value (exit 1).

    $ PYTHONPATH=. python3 native/workloads/vllm_plants/session_check.py /tmp/out
"""
import os
import sys
import time

import numpy as np
import torch

from kvconv.capture.engines import vllm as plugin

OUT = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("OUT", ".")
os.environ["KVCONV_VALUE"] = "1"
L, B, H, D, BS = 28, 512, 8, 128, 16


class Runner:
    def __init__(self):
        self.kv_caches = [torch.zeros(B, BS, H, 2 * D, dtype=torch.bfloat16, device="cuda").permute(0, 2, 1, 3)
                          for _ in range(L)]
        self.kv_cache_config = type("C", (), {"kv_cache_groups": [object()]})()
        self.kernel_block_sizes, self.dcp_size, self.pcp_manager = [BS], 1, None
        self.block_tables = type("T", (), {})()
        self.block_tables._kvconv_mirror = plugin.BlockMirror(8, 64)


class Mode:
    def __init__(self, name):
        self.name = name


def write(kv, slots, key, value):
    """reshape_and_cache_flash in torch: token t's K and V into slot slots[t]; -1 skipped."""
    rows = kv.permute(0, 2, 1, 3).reshape(B * BS, H, 2 * D)
    ok = torch.as_tensor(slots >= 0, device="cuda")
    idx = torch.as_tensor(np.where(slots >= 0, slots, 0), device="cuda")
    rows[idx[ok]] = torch.cat([key, value], -1)[ok]


def run(name, wrong):
    os.environ["KVCONV_PROBE_OUTPUT"] = f"{OUT}/{name}.probe.kvdump"
    r = Runner()
    s = plugin._Session(r)
    s.attach()
    m = r.block_tables._kvconv_mirror
    for row in range(4):
        m.append(row, 0, list(range(1 + 8 * row, 1 + 8 * row + 7)))
    gen = torch.Generator(device="cuda").manual_seed(0)
    ncomp = np.zeros(4, np.int64)
    plan = [("NONE", [40, 33, 20, 17], 128)] + [("FULL", [1, 1, 1, 1], 8)] * 6 + [("PIECEWISE", [1, 1, 1, 30], 40)]
    t0 = time.perf_counter()
    for mode, sched, padded in plan:
        s.mode = Mode(mode)
        batch = type("Batch", (), dict(num_tokens_after_padding=padded, num_tokens=sum(sched),
                                       req_ids=[f"r{i}" for i in range(4)], num_scheduled_tokens=np.array(sched),
                                       idx_mapping_np=np.arange(4), num_computed_tokens_np=ncomp.copy()))()
        s.begin(batch)
        slots = plugin.host_slots(m.table, np.arange(4), ncomp, sched, BS, padded)
        for i, kv in enumerate(r.kv_caches):
            key, value = (torch.randn(padded, H, D, generator=gen, device="cuda").to(torch.bfloat16) for _ in "kv")
            if mode != "FULL":
                s.expect(kv, key, value)
            if wrong and mode == "PIECEWISE" and i == 5:
                key = key.clone()
                key[3] = key[3] * 2 + 1
            write(kv, slots, key, value)
        s.end()
        ncomp += sched
    torch.cuda.synchronize()
    print(name, "steps", s.step, "fused steps", s.values.fused_steps if s.values else "-",
          "host s", round(time.perf_counter() - t0, 3), "broken", s.broken)
    s.close()


if __name__ == "__main__":
    print(torch.__version__, torch.cuda.get_device_name())
    run("clean", False)
    run("wrong", True)
