"""What kvconv costs a vLLM run, in tokens/s at batch 8 and 32, over rounds that alternate, and the table of it.

    python3 native/workloads/vllm_cost.py --config untraced --rounds 5 --torch-profile /tmp/prof > u.jsonl
    kvconv record --no-validate -o t.kvdump -- python3 native/workloads/vllm_cost.py --config traced > t.jsonl
    python3 native/workloads/vllm_cost.py --table u.jsonl t.jsonl c.jsonl          # the markdown table

One engine process (native/workloads/vllm_seed.py's: Qwen3-14B's shape, dummy weights, FULL_AND_PIECEWISE graphs
for 1, 2, 4, 8, FLASH_ATTN, vLLM's default engine-core child process and async scheduling) runs a warm-up (one
request, then one untimed round of each batch), then ``--rounds`` cycles; a cycle is a round of 8 requests and a
round of 32, each request 128 output tokens (``--tokens``) from a 16-token prompt, all sent at once (so the batch
is 8, or 32). Batch 8 replays the FULL graph of size 8; batch 32 is above the captured sizes, so its decode steps
run the compiled model without a graph (the tracer's eager path). With ``--torch-profile DIR`` each cycle runs the
same two rounds again under vLLM's torch profiler (``LLM.start_profile`` / ``stop_profile`` around them, the trace
written uncompressed and without the summary table): the untraced and the profiled rounds alternate round by round
in one engine. A traced configuration is a process of its own under ``kvconv record`` (the tracer is injected when
CUDA starts); the sequence of processes is native/scripts/gpu_vllm50.sh's ``cost`` step.

Output: one JSON line per timed round (``config``, ``batch``, ``cycle``, ``tokens_per_s``, ``wall_s``,
``output_tokens``), then one summary line. ``--table`` reads such files and prints, per configuration and batch,
the median tokens/s, the spread (min-max, % of the median), the rounds, and the median's change from the untraced.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import vllm_seed  # noqa: E402

BATCHES = (8, 32)
ORDER = ("untraced", "traced", "canaries", "torch.profiler")


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="untraced", help="the name this process's rounds carry (default untraced)")
    p.add_argument("--rounds", type=int, default=5, metavar="N", help="cycles of batch 8 + batch 32 (default 5)")
    p.add_argument("--tokens", type=int, default=128, metavar="T", help="output tokens per request (default 128)")
    p.add_argument("--torch-profile", metavar="DIR", help="each cycle again under vLLM's torch profiler (traces in "
                   "DIR): rounds named torch.profiler")
    p.add_argument("--compile-cache", metavar="DIR", help="VLLM_CACHE_ROOT (torch.compile's cache)")
    p.add_argument("--table", nargs="+", metavar="JSONL", help="print the markdown table of these outputs instead")
    a = p.parse_args(argv)
    if a.rounds < 1 or a.tokens < 2:
        p.error("--rounds must be >= 1 and --tokens >= 2")
    return a


def rounds_of(llm, a, emit) -> None:
    """The warm-up, then the cycles; each timed round goes to ``emit``."""
    vllm_seed.generate(llm, 1, 1)
    for b in BATCHES:
        vllm_seed.generate(llm, b, a.tokens)
    for cycle in range(1, a.rounds + 1):
        configs = [(a.config, False)] + ([("torch.profiler", True)] if a.torch_profile else [])
        for name, profiled in configs:
            if profiled:
                llm.start_profile()
            for b in BATCHES:
                wall, n = vllm_seed.generate(llm, b, a.tokens)
                emit({"config": name, "batch": b, "cycle": cycle, "output_tokens": n, "wall_s": round(wall, 4),
                      "tokens_per_s": round(n / wall, 1), "expected_tokens": b * a.tokens})
            if profiled:
                t0 = time.perf_counter()
                llm.stop_profile()
                emit({"config": name, "cycle": cycle, "profile_stop_s": round(time.perf_counter() - t0, 2)})


def run(a) -> int:
    vllm_seed.environ(argparse.Namespace(in_process=False, compile_cache=a.compile_cache))
    bad = []

    def emit(row):
        if "batch" in row and row["output_tokens"] != row["expected_tokens"]:
            bad.append(row)
        print(json.dumps(row), flush=True)

    with tempfile.TemporaryDirectory(prefix="qwen3-14b-") as model_dir:
        with open(os.path.join(model_dir, "config.json"), "w") as f:
            json.dump(vllm_seed.QWEN3_14B, f)
        t0 = time.perf_counter()
        opts = {"torch_profiler_use_gzip": False, "torch_profiler_dump_cuda_time_total": False}
        llm = vllm_seed.engine(model_dir, 1, a.torch_profile, opts)
        start = time.perf_counter() - t0
        rounds_of(llm, a, emit)
        llm.llm_engine.engine_core.shutdown()
    print(json.dumps({"summary": a.config, "start_s": round(start, 1), "bad_rounds": len(bad), "pid": os.getpid()}),
          flush=True)
    return 1 if bad else 0


def table(paths) -> str:
    """The markdown table of the rounds in ``paths`` (JSON lines; other lines are skipped)."""
    rows: dict[tuple[str, int], list[float]] = {}
    for path in paths:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if not line.startswith("{"):
                    continue
                r = json.loads(line)
                if "batch" in r and "tokens_per_s" in r:
                    rows.setdefault((r["config"], int(r["batch"])), []).append(float(r["tokens_per_s"]))
    if not rows:
        raise SystemExit("vllm_cost.py --table: no timed round in " + ", ".join(paths))
    base = {b: statistics.median(v) for (c, b), v in rows.items() if c == "untraced"}
    known = {c: i for i, c in enumerate(ORDER)}
    out = ["| configuration | batch | rounds | median tok/s | spread (min-max) | vs untraced |",
           "| --- | --- | --- | --- | --- | --- |"]
    for (c, b) in sorted(rows, key=lambda k: (known.get(k[0], len(ORDER)), k[0], k[1])):
        v = rows[(c, b)]
        med = statistics.median(v)
        spread = f"{min(v):,.1f}-{max(v):,.1f} ({(max(v) - min(v)) / med * 100:.1f}%)"
        rel = "" if c == "untraced" or b not in base else f"{(med / base[b] - 1) * 100:+.1f}%"
        out.append(f"| {c} | {b} | {len(v)} | {med:,.1f} | {spread} | {rel} |")
    return "\n".join(out)


def main(argv=None) -> int:
    a = parse(argv)
    if a.table:
        print(table(a.table))
        return 0
    try:
        import vllm  # noqa: F401
    except ImportError as e:
        sys.exit(f"vllm_cost.py: cannot import vllm ({e}); native/engines/README.md, vLLM, says how to bring it")
    return run(a)


if __name__ == "__main__":
    sys.exit(main())
