"""A user's plain SGLang script (issue 49): ``sgl.Engine(...)``, ``generate``, ``llm.shutdown()``; no harness, no drain.

What a new user writes after SGLang's quick start, on Qwen3-14B's shape with dummy weights (no weights, no tokenizer
on the device): 8 requests of 16 prompt tokens, 32 new tokens each, in one ``generate`` call (batch 8, decode in the
CUDA graphs), then ``llm.shutdown()``. Under ``kvconv record`` the tracer and kvconv's SGLang plugin do the rest:
the plugin, loaded by SGLang in this process too, lets the scheduler exit on its own before ``shutdown`` kills it
(kvconv/capture/engines/sglang_end.py), so the scheduler's dumps are finished and ``record`` exits 0 on a clean run.

    python3 native/workloads/sglang_script.py                      # the bundle on PYTHONPATH
    kvconv record -k store_kvcache --writes --engine sglang -o run-%p.kvdump -- \
        python3 native/workloads/sglang_script.py

Prints one JSON line (tokens back per request, the engine's start and end seconds); exits 1 when a request came back
with other than ``--tokens`` tokens.
"""

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sglang_seed import QWEN3_14B, engine_args  # noqa: E402 - the model's shape and SGLang's option names


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=8, help="requests in the one generate call (default 8)")
    ap.add_argument("--tokens", type=int, default=32, help="new tokens per request (default 32)")
    ap.add_argument("--backend", choices=("triton", "flashinfer"), default="triton", help="attention backend")
    ap.add_argument("--kv-canary", choices=("none", "log", "raise"), default="none", help="SGLang's KV canary")
    a = ap.parse_args()
    import sglang as sgl

    with tempfile.TemporaryDirectory(prefix="sglang-script-") as model:
        with open(os.path.join(model, "config.json"), "w") as f:
            json.dump(QWEN3_14B, f)
        t0 = time.perf_counter()
        llm = sgl.Engine(**engine_args(model_path=model, load_format="dummy", skip_tokenizer_init=True,
                                       attention_backend=a.backend, sampling_backend="pytorch",
                                       mem_fraction_static=0.5,
                                       cuda_graph_max_bs=8, kv_canary=a.kv_canary))
        started = time.perf_counter() - t0
        prompts = [[1000 + 7 * r + j for j in range(16)] for r in range(a.batch)]
        outs = llm.generate(input_ids=prompts, sampling_params={"max_new_tokens": a.tokens, "ignore_eos": True})
        t1 = time.perf_counter()
        llm.shutdown()
        ended = time.perf_counter() - t1
    counts = [len(o["output_ids"]) for o in outs]
    print(json.dumps({"workload": "sglang_script", "sglang": sgl.__version__, "backend": a.backend,
                      "kv_canary": a.kv_canary, "tokens_back": counts, "start_s": round(started, 1),
                      "shutdown_s": round(ended, 2)}), flush=True)
    return 0 if all(c == a.tokens for c in counts) else 1


if __name__ == "__main__":
    sys.exit(main())
