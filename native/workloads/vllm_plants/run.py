"""The workload of the vLLM plant runs: eight greedy requests on a dense Qwen3 through vLLM's offline ``LLM``, four
at a time, so that requests finish, their rows and blocks are handed to later ones, and later requests are
admitted (prefill beside decodes: PIECEWISE steps) while others decode (FULL replays).

    $ KVCONV_ENGINE=vllm KVCONV_VALUE=1 python native/workloads/vllm_plants/run.py --probe-out /tmp/clean.probe.kvdump

Offline (the H200 image: no weights, no tokenizer): without ``--model`` the engine is Qwen3-14B's shape with vLLM's
dummy weights (native/workloads/vllm_seed.py's config.json) and the prompts are token ids of the same lengths.

Requests 1-4 have long prompts (about 160 tokens) and stop after 40, 56, 72 and 88 tokens; requests 5-8 have short
prompts (about 24 tokens) and generate 96: they take the rows of 1-4 and grow into block-table entries those held.
Prefix caching is off (vLLM then hands a freed block out again first) and the pool is small
(``--blocks``), so blocks are reused within the run.
"""

import argparse
import os
import sys
import tempfile


def prompts() -> list[str]:
    long = " ".join(f"Item {i}: the quick brown fox jumps over the lazy dog." for i in range(14))
    short = "Count slowly from one to one hundred, one number per line:"
    return [f"Request {r}. {long}" for r in range(1, 5)] + [f"Request {r}. {short}" for r in range(5, 9)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="a dense Qwen3 (name or local folder); default: Qwen3-14B's shape, dummy weights")
    ap.add_argument("--probe-out", help="the kvconv probe dump (sets KVCONV_PROBE_OUTPUT for the engine's processes)")
    ap.add_argument("--blocks", type=int, default=256, help="KV blocks in the pool (num_gpu_blocks_override)")
    ap.add_argument("--eager", action="store_true", help="enforce_eager: every step eager (the value probe's rows "
                    "on every step)")
    args = ap.parse_args()
    if args.probe_out:
        os.environ["KVCONV_PROBE_OUTPUT"] = os.path.abspath(args.probe_out)
    from vllm import LLM, SamplingParams

    offline = args.model is None
    kw = dict(max_num_seqs=4, max_model_len=1024, enable_prefix_caching=False, num_gpu_blocks_override=args.blocks,
              gpu_memory_utilization=0.5, seed=0, enforce_eager=args.eager)
    if offline:  # no weights, no tokenizer: the seed's config with dummy weights, prompts as token ids
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        import json

        import vllm_seed

        folder = tempfile.mkdtemp(prefix="kvconv-qwen3-14b-")
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump(vllm_seed.QWEN3_14B, f)
        # the seed's engine settings (vllm_seed.engine) where the plants allow: one torch.compile cache serves both
        kw.update(model=folder, load_format="dummy", skip_tokenizer_init=True, dtype="bfloat16", max_model_len=2048,
                  gpu_memory_utilization=0.45, attention_config={"backend": "FLASH_ATTN"},
                  compilation_config={"cudagraph_mode": "FULL_AND_PIECEWISE", "cudagraph_capture_sizes": [1, 2, 4, 8]})
    llm = LLM(model=args.model, **kw) if not offline else LLM(**kw)
    extra = {"detokenize": False} if offline else {}
    params = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True, **extra) for m in (40, 56, 72, 88)]
    params += [SamplingParams(temperature=0.0, max_tokens=96, ignore_eos=True, **extra) for _ in range(4)]
    texts = prompts()
    inputs = ([{"prompt_token_ids": [1000 + 13 * r + j for j in range(len(t.split()) * 4 // 3)]}
               for r, t in enumerate(texts)] if offline else texts)
    outs = llm.generate(list(inputs), params)
    for i, o in enumerate(outs, 1):
        print(f"request {i} ({o.request_id}): {len(o.prompt_token_ids)} prompt tokens, "
              f"{len(o.outputs[0].token_ids)} generated")
    core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    if core is not None:  # the engine core shuts its runner down: the plugin writes its dump then
        core.shutdown()


if __name__ == "__main__":
    main()
