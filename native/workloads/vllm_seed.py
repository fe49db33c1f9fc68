"""The first seed's vLLM run: Qwen3-14B's shape with dummy weights, one 1-token warm-up, one 8-token request.

    python3 native/workloads/vllm_seed.py                         # the seed's request; one JSON line on stdout
    kvconv record -k reshape_and_cache_flash_kernel -o run-%p.kvdump -- python3 native/workloads/vllm_seed.py
    python3 native/workloads/vllm_seed.py --requests 32 --tokens 128      # throughput: tokens/s, decode step
    python3 native/workloads/vllm_seed.py --in-process --compile-cache /tmp/vllm-cache
    python3 native/workloads/vllm_seed.py --requests 32 --tokens 128 --rounds 2 --torch-profile /tmp/prof

vLLM 0.26.0 on the offline H200 image (native/engines/README.md, "vLLM", says how to bring it there). No weights
and no tokenizer can be fetched, so a temporary folder holds only Qwen3-14B's config.json, the weights are vLLM's
dummy ones, and prompts are token ids. The engine runs as the seed describes it: FULL_AND_PIECEWISE CUDA graphs
for batch 1, 2, 4, 8, FLASH_ATTN (FA3 on Hopper), prefix caching off, an 8 GiB KV cache. By default the engine
core is vLLM's own child process (its KV writes happen there: trace with `%p` in the dump name); `--in-process`
keeps it in this process. The engine is shut down the way vLLM's users do it before the script exits 0.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time

# Qwen3-14B's published config.json (the fields vLLM reads); bf16, 40 layers, 8 KV heads of 128.
QWEN3_14B = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "torch_dtype": "bfloat16",
    "hidden_size": 5120,
    "intermediate_size": 17408,
    "num_hidden_layers": 40,
    "num_attention_heads": 40,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 151936,
    "max_position_embeddings": 40960,
    "max_window_layers": 40,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000,
    "rope_scaling": None,
    "hidden_act": "silu",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "tie_word_embeddings": False,
    "use_sliding_window": False,
    "sliding_window": None,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "initializer_range": 0.02,
    "use_cache": True,
    "transformers_version": "4.51.0",
}
PROMPT_LEN = 16  # fixed, arbitrary token ids: dummy weights make any text meaningless


def parse(argv):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--requests",
        type=int,
        default=0,
        metavar="N",
        help="throughput mode: N requests at once (default: the seed's single request)",
    )
    p.add_argument("--tokens", type=int, default=8, metavar="T", help="output tokens per request (default 8)")
    p.add_argument(
        "--in-process", action="store_true", help="engine core in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0)"
    )
    p.add_argument("--tp", type=int, default=1, metavar="N", help="tensor_parallel_size (default 1)")
    p.add_argument(
        "--compile-cache",
        metavar="DIR",
        help="vLLM's cache root (VLLM_CACHE_ROOT): a second start reuses its torch.compile output",
    )
    p.add_argument("--rounds", type=int, default=1, metavar="N", help="throughput mode: timed rounds (default 1)")
    p.add_argument("--torch-profile", metavar="DIR", help="throughput mode: as many rounds again under vLLM's torch "
                   "profiler (profiler_config, LLM.start_profile/stop_profile), traces in DIR")
    a = p.parse_args(argv)
    if a.torch_profile and not a.requests:
        p.error("--torch-profile times throughput rounds: give --requests")
    for name, least in (("requests", 0), ("tokens", 1), ("tp", 1), ("rounds", 1)):
        if getattr(a, name) < least:
            p.error(f"--{name} must be >= {least}, not {getattr(a, name)}")
    return a


def environ(args):
    """Set before vLLM is imported: envs.py reads them at import, the engine child inherits them."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["VLLM_ATTENTION_BACKEND"] = "FLASH_ATTN"  # 0.26 reads attention_config; kept for older vLLMs
    # NVLink multicast off whatever the caller set (device README): vLLM's TP all-reduce would use it.
    os.environ.update(NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")
    if args.in_process:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    if args.compile_cache:
        os.environ["VLLM_CACHE_ROOT"] = os.path.abspath(args.compile_cache)


def engine(model_dir, tp, profile_dir=None, profiler_options=None):
    from vllm import LLM

    extra = {}
    if profile_dir:  # vllm/config/profiler.py (0.26.0): warmup_iterations 0 = every iteration between start and stop
        extra["profiler_config"] = {"profiler": "torch", "torch_profiler_dir": os.path.abspath(profile_dir),
                                    "torch_profiler_with_stack": False, **(profiler_options or {})}
    return LLM(
        **extra,
        model=model_dir,
        load_format="dummy",
        skip_tokenizer_init=True,
        dtype="bfloat16",
        enable_prefix_caching=False,
        max_model_len=2048,
        gpu_memory_utilization=0.45,
        kv_cache_memory_bytes=8 << 30,
        tensor_parallel_size=tp,
        attention_config={"backend": "FLASH_ATTN"},
        compilation_config={"cudagraph_mode": "FULL_AND_PIECEWISE", "cudagraph_capture_sizes": [1, 2, 4, 8]},
    )


def generate(llm, n, tokens):
    """n requests of `tokens` output tokens each, at once; (seconds, output tokens)."""
    from vllm import SamplingParams

    prompts = [{"prompt_token_ids": [1000 + 7 * i + j for j in range(PROMPT_LEN)]} for i in range(n)]
    params = SamplingParams(max_tokens=tokens, detokenize=False, ignore_eos=True)
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    wall = time.perf_counter() - t0
    return wall, sum(len(o.outputs[0].token_ids) for o in outs)


def run(llm, args):
    """The seed: warm-up then one request. Throughput: also a 1-token pass of the same batch, so that
    (wall - prefill wall) / (T - 1) is the time of one decode step; --rounds rounds, then as many under vLLM's
    torch profiler with --torch-profile."""
    generate(llm, 1, 1)
    n = args.requests or 1
    result = {"requests": n, "tokens_per_request": args.tokens}
    prefill = generate(llm, n, 1)[0] if args.requests and args.tokens > 1 else None
    rounds = [timed_round(llm, n, args.tokens, prefill) for _ in range(args.rounds)]
    profiled = []
    if args.torch_profile:
        llm.start_profile()
        profiled = [timed_round(llm, n, args.tokens, prefill) for _ in range(args.rounds)]
        llm.stop_profile()
    result.update(rounds[0])  # the seed's fields as before: the first round's
    if args.rounds > 1 or profiled:
        result.update(rounds=rounds, torch_profiler_rounds=profiled)
    if prefill is not None:
        result["prefill_wall_s"] = round(prefill, 4)
    bad = [r for r in rounds + profiled if r["output_tokens"] != n * args.tokens]
    if bad:
        result["error"] = f"expected {n * args.tokens} output tokens, got {bad[0]['output_tokens']}"
    return result


def timed_round(llm, n, tokens, prefill):
    wall, produced = generate(llm, n, tokens)
    out = {"output_tokens": produced, "wall_s": round(wall, 4), "tokens_per_s": round(produced / wall, 1)}
    if prefill is not None:
        out["decode_step_ms"] = round((wall - prefill) / (tokens - 1) * 1e3, 3)
    return out


def main(argv=None):
    args = parse(argv)
    environ(args)
    try:
        import vllm  # noqa: F401  (here, so that a missing bundle is one line, not a traceback)
    except ImportError as e:
        sys.exit(f"vllm_seed.py: cannot import vllm ({e}); native/engines/README.md, vLLM, says how to bring it")
    with tempfile.TemporaryDirectory(prefix="qwen3-14b-") as model_dir:
        with open(os.path.join(model_dir, "config.json"), "w") as f:
            json.dump(QWEN3_14B, f, indent=2)
        t0 = time.perf_counter()
        llm = engine(model_dir, args.tp, args.torch_profile)
        start = time.perf_counter() - t0
        result = run(llm, args)
        # vLLM's own shutdown: the engine core client stops its child process (or the in-process core), then
        # the last reference goes, so a traced child ends the way vLLM ends it.
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()
    result.update(start_s=round(start, 1), in_process=args.in_process, tp=args.tp, pid=os.getpid())
    print(json.dumps(result), flush=True)
    return 1 if "error" in result else 0


if __name__ == "__main__":
    sys.exit(main())
