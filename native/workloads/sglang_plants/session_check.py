"""GPU check of the SGLang plugin's session without SGLang (issue 40 item 2's model-free mapping test): a token pool in
SGLang 0.5.12's MHA layout on CUDA (per layer ``k_buffer``/``v_buffer`` ``[slots + 1, 8, 128]`` bf16, slot = row),
forwards as ``ModelRunner.forward`` sees them (a prefill of three requests, decodes in a size-4 graph with one pad row
at slot 0), and the location canary over pages of ``--page`` slots (default 256: the second seed's page = slot //
256). Writes DIR/clean.probe.kvdump and DIR/outside.probe.kvdump (at step 3, one row of layer 1's K written in a page
outside the step's set), then ``kvconv canary`` on each: the first ok (exit 0), the second canary-unexpected-write.

    $ PYTHONPATH=. python3 native/workloads/sglang_plants/session_check.py /tmp/out
"""

import argparse
import json
import os
import subprocess
import sys
import time

import torch

from kvconv.capture.engines import sglang as plugin

L, H, D = 40, 8, 128


class Mode:
    def __init__(self, name):
        self.name = name

    def is_idle(self):
        return False

    def is_decode(self):
        return self.name == "decode"

    def is_extend(self):
        return self.name == "extend"

    def is_target_verify(self):
        return False

    def is_cuda_graph(self):
        return self.name == "decode"


class Graphs:
    capture_bs, num_tokens_per_bs = [1, 2, 4], 1

    def can_run(self, fb):
        return fb.batch_size <= 4


class Runner:
    """What the plugin reads of a ModelRunner: the pool, the allocator's page size, the graph runners."""

    def __init__(self, slots):
        new = [torch.zeros(slots + 1, H, D, dtype=torch.bfloat16, device="cuda") for _ in range(2 * L)]
        self.token_to_kv_pool = type("Pool", (), {"k_buffer": new[:L], "v_buffer": new[L:], "start_layer": 0})()
        self.token_to_kv_pool_allocator = type("Alloc", (), {"page_size": 1})()
        self.graph_runner, self.piecewise_cuda_graph_runner, self.is_draft_worker = Graphs(), None, False


def plan(slots):
    """(mode, rids, slots, extend lens): a, b, c prefill (100, 300, 40 tokens), then five decodes of the three."""
    a, b, c = list(range(1, 101)), list(range(101, 401)), list(range(401, 441))
    steps = [("extend", ["a", "b", "c"], a + b + c, [100, 300, 40])]
    nxt = 441
    for _ in range(5):
        steps.append(("decode", ["a", "b", "c"], [nxt, nxt + 1, nxt + 2], None))
        nxt += 3
    assert nxt < slots
    return steps


def forward(runner, fb, gen, extra_slot=None):
    """The pool writes of one forward: every layer's K and V at the step's slots (and a graph's pad row at slot 0)."""
    loc = fb.out_cache_loc
    if fb.forward_mode.is_cuda_graph() and fb.batch_size < 4:
        loc = torch.cat([loc, loc.new_zeros(4 - fb.batch_size)])
    pool = runner.token_to_kv_pool
    for buf in pool.k_buffer + pool.v_buffer:
        buf[loc] = torch.randn(len(loc), H, D, generator=gen, device="cuda").to(torch.bfloat16)
    if extra_slot is not None:  # the plant: one K row of layer 1 outside the step's pages
        pool.k_buffer[1][extra_slot] = 7.0


def run(out, name, slots, outside):
    os.environ["KVCONV_PROBE_OUTPUT"] = os.path.join(out, f"{name}.probe.kvdump")
    runner = Runner(slots)
    s = plugin._Session(runner)
    s.attach()
    gen = torch.Generator(device="cuda").manual_seed(0)
    t0, times = time.perf_counter(), []
    for i, (mode, rids, locs, ext) in enumerate(plan(slots)):
        fb = type("FB", (), dict(forward_mode=Mode(mode), rids=rids, batch_size=len(rids), extend_seq_lens_cpu=ext,
                                 out_cache_loc=torch.tensor(locs, dtype=torch.int64, device="cuda")))()
        t = time.perf_counter()
        s.begin(fb)
        forward(runner, fb, gen, extra_slot=slots - 1 if outside and i == 3 else None)
        s.end()
        times.append(round((time.perf_counter() - t) * 1e3, 2))
    s.close()
    r = subprocess.run([sys.executable, "-m", "kvconv", "canary", os.environ["KVCONV_PROBE_OUTPUT"]],
                       capture_output=True, text=True)
    print(json.dumps({"run": name, "steps": s.step, "broken": s.broken, "step_ms": times,
                      "total_s": round(time.perf_counter() - t0, 3), "canary_exit": r.returncode}), flush=True)
    print("\n".join(r.stdout.splitlines()[-4:]), flush=True)
    return r.returncode


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", nargs="?", default=os.environ.get("OUT", "."))
    ap.add_argument("--slots", type=int, default=32768, help="pool slots (default 32768)")
    ap.add_argument("--page", type=int, default=256, help="canary page in slots (KVCONV_CANARY_PAGE, default 256)")
    a = ap.parse_args()
    os.environ.update(KVCONV_CANARY="1", KVCONV_CANARY_PAGE=str(a.page))
    os.environ.pop("KVCONV_CAPTURE_RANGE", None)
    print(torch.__version__, torch.cuda.get_device_name(), flush=True)
    clean, planted = run(a.out, "clean", a.slots, False), run(a.out, "outside", a.slots, True)
    return 0 if (clean, planted) == (0, 1) else 1


if __name__ == "__main__":
    sys.exit(main())
