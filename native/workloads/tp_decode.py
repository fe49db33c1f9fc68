"""A tensor-parallel-shaped decode workload: one process per GPU (torch.distributed, NCCL), for issue 8.

Launch with ``torchrun --nproc_per_node N native/workloads/tp_decode.py``. Every rank runs kv_decode.py's model
(imported, not copied: the same ``reshape_and_cache_flash_kernel`` per layer, 40 layers by default) and, after each
layer, an ``all_reduce`` of the layer's output: rank r scales its output by w_r = 2(r+1)/(N(N+1)) (the weights sum
to 1) and the all_reduce sums them, so every rank ends with the same hidden state only if the all_reduces ran.
One eager prefill, then one CUDA graph captured for a 1-token decode step (the NCCL all_reduces captured in it) and
replayed ``--replays`` times. Each rank prints one JSON summary line (with ``rank``, ``world_size`` and ``pid``, so a
dump named by pid maps to its rank).

NVLink multicast stays off (device README): NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1 and
NVSHMEM_DISABLE_NVLS=1 are forced here before NCCL starts, whatever the caller set.

    torchrun --nproc_per_node 2 native/workloads/tp_decode.py
    bash native/scripts/gpu_tp.sh OUT 2          # the same under `kvconv record`, then reconcile + perfetto
"""

from __future__ import annotations

import os

# Before torch / NCCL read them; children of this process inherit them too.
os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
os.environ["NVSHMEM_DISABLE_NVLS"] = "1"

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from datetime import timedelta  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kv_decode import KV_SRC, KvKernel, Model, timed_replays, written_rows  # noqa: E402


class TpModel(Model):
    """kv_decode's model with an all_reduce of every layer's output."""

    def __init__(self, args, kv, rank: int, world: int):
        super().__init__(args, kv)
        import torch.distributed as dist

        self.dist = dist
        self.weight = 2.0 * (rank + 1) / (world * (world + 1))
        self.all_reduces = 0  # issued per forward (eager or captured)

    def layer(self, i: int, h, slots):
        h = super().layer(i, h, slots)
        if self.weight != 1.0:
            h = h * self.weight
        self.dist.all_reduce(h)
        self.all_reduces += 1
        return h


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=40)
    ap.add_argument("--prefill", type=int, default=37, help="prefill tokens (one block each)")
    ap.add_argument("--replays", type=int, default=7)
    ap.add_argument("--work", default="tiny", choices=("tiny", "light", "qwen14b"))
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--num-blocks", type=int, default=8)
    ap.add_argument("--json", help="write the summary here too (%%r = rank)")
    ap.add_argument("--keep-graph-at-teardown", action="store_true",
                    help="destroy the process group while the captured graph is alive (reproduces the exit hang)")
    args = ap.parse_args(argv)
    args.streams = 1

    import torch
    import torch.distributed as dist

    assert args.prefill + args.replays <= args.num_blocks * args.block_size
    t0 = time.perf_counter()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    try:
        import cupy

        cupy.cuda.Device(local).use()  # the KV kernel's module loads on this rank's GPU
    except ImportError:
        pass
    dev = torch.device("cuda", local)
    dist.init_process_group("nccl", device_id=dev, timeout=timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    stage = "init"
    try:
        kv = KvKernel("reshape_and_cache_flash_kernel", KV_SRC)
        model = TpModel(args, kv, rank, world)
        H = model.H
        gen = torch.Generator(device=dev).manual_seed(7)  # same inputs on every rank

        stage = "prefill"
        x = torch.randn(args.prefill, H, device=dev, dtype=torch.bfloat16, generator=gen)
        slots = torch.arange(args.prefill, device=dev, dtype=torch.int64)
        model.forward(x, slots)
        torch.cuda.synchronize()
        eager_all_reduces = model.all_reduces

        stage = "capture"
        tok = torch.randn(1, H, device=dev, dtype=torch.bfloat16, generator=gen)
        slot = torch.full((1,), -1, device=dev, dtype=torch.int64)
        graph = torch.cuda.CUDAGraph()
        dist.barrier()
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            out = model.forward(tok, slot)
        torch.cuda.synchronize()
        captured_all_reduces = model.all_reduces - eager_all_reduces

        stage = "replay"
        step_ms = timed_replays(graph, slot, tok, args, gen)

        stage = "check"
        rows = written_rows(model)
        expect_rows = args.prefill + args.replays
        outs = [torch.empty_like(out) for _ in range(world)]
        dist.all_gather(outs, out)  # eager: every rank must hold the same decode output
        same = all(torch.equal(o.view(torch.int16), out.view(torch.int16)) for o in outs)
        ok = all(r == expect_rows for r in rows) and bool(torch.isfinite(out.float()).all()) and same
        stage = "done"
    except Exception as e:  # noqa: BLE001
        print(json.dumps({"workload": "tp_decode", "rank": rank, "world_size": world, "pid": os.getpid(),
                          "failed_stage": stage, "error": f"{type(e).__name__}: {e}"}, sort_keys=True), flush=True)
        raise
    L = args.layers
    summary = {
        "workload": "tp_decode",
        "rank": rank,
        "world_size": world,
        "local_rank": local,
        "kernel_backend": kv.backend,
        "layers": L,
        "work": args.work,
        "prefill_tokens": args.prefill,
        "replays": args.replays,
        "all_reduces": {"eager": eager_all_reduces, "captured_per_replay": captured_all_reduces},
        "expected": {
            "eager_launches": L,
            "eager_blocks": L * args.prefill,
            "graph_nodes_per_replay": L,
            "graph_node_records": L * args.replays,
            "graph_blocks": L * args.replays,
            "device_events": L * args.prefill + L * args.replays,
        },
        "cache_rows_written_per_layer": sorted(set(rows)),
        "cache_rows_expected": expect_rows,
        "ranks_agree": same,
        "check_ok": ok,
        "step_ms": [round(s, 4) for s in step_ms],
        "wall_s": round(time.perf_counter() - t0, 3),
        "gpu": torch.cuda.get_device_name(dev),
        "torch": torch.__version__,
        "nccl": str(torch.cuda.nccl.version()),
        "pid": os.getpid(),
    }
    line = json.dumps(summary, sort_keys=True)
    print(line, flush=True)
    if args.json:
        with open(args.json.replace("%r", str(rank)), "w") as f:
            f.write(line + "\n")
    shutdown(dist, graph, keep_graph=args.keep_graph_at_teardown)
    return 0 if ok else 1


def shutdown(dist, graph, *, keep_graph: bool) -> None:
    """End the process group so that the process can exit, on any world size.

    A CUDA graph that captured NCCL collectives holds a reference on the communicator (NCCL's
    ``localPersistentRefs``, dropped only when CUDA destroys the graph and fires its user-object destructor), and
    ``ncclCommDestroy`` waits for that count to reach zero. ``destroy_process_group()`` while the graph is still
    alive therefore waits forever. A world of one does not: NCCL runs a one-rank all_reduce as a copy and captures
    no persistent plan. So: synchronise, free the graph (``reset()``), let CUDA run the destructors, then destroy.
    ``keep_graph=True`` keeps the old order, to reproduce the hang.
    """
    import torch

    dist.barrier()
    torch.cuda.synchronize()
    if not keep_graph:
        graph.reset()
        torch.cuda.synchronize()
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
