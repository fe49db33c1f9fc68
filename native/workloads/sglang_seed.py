"""The second seed's request: SGLang 0.5.12 decoding a dummy-weight Qwen3-14B under its CUDA graphs, on one GPU.

Writes Qwen3-14B's config.json into a temp folder (no weights, no tokenizer: nothing can be fetched on the device),
starts ``sgl.Engine`` with load_format="dummy", the triton attention backend and pytorch sampling, and generates
``--batch`` requests of ``--tokens`` new tokens each (ignore_eos) in one call; decode runs in the captured graphs
(cuda_graph_max_bs=8). ``--requests N`` is throughput mode: a warm-up call, then N requests in calls of
``--batch``, timed. Prints one JSON line; exits 1 when an output holds other than ``--tokens`` tokens.

    python3 native/workloads/sglang_seed.py                                # 8 requests x 8 tokens
    python3 native/workloads/sglang_seed.py --requests 32 --tokens 128     # tokens/s
    kvconv record -k store_kvcache -o run-%p.kvdump -- python3 native/workloads/sglang_seed.py

Needs the SGLang bundle on PYTHONPATH (native/engines/README.md, "SGLang").
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

# Qwen3-14B's published config.json (Qwen/Qwen3-14B); load_format="dummy" fills the weights at random.
QWEN3_14B = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "torch_dtype": "bfloat16",
    "hidden_size": 5120, "intermediate_size": 17408, "num_hidden_layers": 40, "num_attention_heads": 40,
    "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936, "max_position_embeddings": 40960,
    "max_window_layers": 40, "rms_norm_eps": 1e-06, "rope_theta": 1000000, "rope_scaling": None,
    "hidden_act": "silu", "attention_bias": False, "attention_dropout": 0.0, "initializer_range": 0.02,
    "tie_word_embeddings": False, "use_cache": True, "use_sliding_window": False, "sliding_window": None,
    "bos_token_id": 151643, "eos_token_id": 151645, "transformers_version": "4.51.0",
}


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=8, help="requests per generate call (default 8)")
    ap.add_argument("--tokens", type=int, default=8, help="new tokens per request (default 8)")
    ap.add_argument("--requests", type=int, default=None, help="throughput mode: this many requests, timed")
    ap.add_argument("--prompt-len", type=int, default=16, help="prompt tokens per request (default 16)")
    ap.add_argument("--graph-max-bs", type=int, default=8, help="cuda_graph_max_bs (default 8)")
    a = ap.parse_args(argv)
    for name in ("batch", "tokens", "prompt_len", "graph_max_bs") + (("requests",) if a.requests is not None else ()):
        if getattr(a, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1")
    return a


def start(model_dir, a):
    import sglang as sgl  # the bundle's; imported late so that --help works without it

    return sgl.Engine(model_path=model_dir, load_format="dummy", skip_tokenizer_init=True, dtype="bfloat16",
                      attention_backend="triton", sampling_backend="pytorch", mem_fraction_static=0.5,
                      disable_radix_cache=True, cuda_graph_max_bs=a.graph_max_bs, log_level="warning")


def generate(engine, n, a):
    """n requests of the same prompt in one call; the count of new tokens each came back with."""
    prompt = list(range(1000, 1000 + a.prompt_len))
    outs = engine.generate(input_ids=[prompt] * n,
                           sampling_params={"max_new_tokens": a.tokens, "ignore_eos": True})
    return [len(o["output_ids"]) for o in outs]


def run(engine, a):
    """The seed run (one call of --batch) or throughput mode; the result dict."""
    res = {"engine": "sglang", "model": "Qwen3-14B config, dummy weights", "batch": a.batch, "tokens": a.tokens,
           "prompt_len": a.prompt_len}
    if a.requests is None:
        counts = generate(engine, a.batch, a)
        return dict(res, requests=a.batch, output_tokens=sum(counts), bad=[c for c in counts if c != a.tokens])
    generate(engine, min(a.batch, a.requests), a)  # warm-up: first-call costs stay out of the timing
    counts, t0 = [], time.perf_counter()
    for first in range(0, a.requests, a.batch):
        counts += generate(engine, min(a.batch, a.requests - first), a)
    dt = time.perf_counter() - t0
    return dict(res, requests=a.requests, output_tokens=sum(counts), bad=[c for c in counts if c != a.tokens],
                elapsed_s=round(dt, 3), tokens_per_s=round(sum(counts) / dt, 1))


def main(argv=None):
    a = parse(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    with tempfile.TemporaryDirectory(prefix="sglang-seed-") as model_dir:
        with open(os.path.join(model_dir, "config.json"), "w") as f:
            json.dump(QWEN3_14B, f, indent=2)
        t0 = time.perf_counter()
        engine = start(model_dir, a)
        started = time.perf_counter() - t0
        try:
            res = run(engine, a)
        finally:
            engine.shutdown()  # stops the scheduler and detokenizer children, as SGLang's users do
    res["start_s"] = round(started, 1)
    print(json.dumps(res), flush=True)
    if res["bad"]:
        print(f"sglang_seed.py: {len(res['bad'])} request(s) returned other than {a.tokens} tokens", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
