"""The workload of the vLLM plant runs: eight greedy requests on a dense Qwen3 through vLLM's offline ``LLM``, four
at a time, so that requests finish, their rows and blocks are handed to later ones, and later requests are
admitted (prefill beside decodes: PIECEWISE steps) while others decode (FULL replays).

    $ KVCONV_ENGINE=vllm KVCONV_VALUE=1 python native/workloads/vllm_plants/run.py --model Qwen/Qwen3-0.6B \\
          --probe-out /tmp/clean.probe.kvdump

Requests 1-4 have long prompts (about 160 tokens) and stop after 40, 56, 72 and 88 tokens; requests 5-8 have short
prompts (about 24 tokens) and generate 96: they take the rows of 1-4 and grow into block-table entries those held.
Prefix caching is off (vLLM then hands a freed block out again first) and the pool is small
(``--blocks``), so blocks are reused within the run.
"""

import argparse
import os


def prompts() -> list[str]:
    long = " ".join(f"Item {i}: the quick brown fox jumps over the lazy dog." for i in range(14))
    short = "Count slowly from one to one hundred, one number per line:"
    return [f"Request {r}. {long}" for r in range(1, 5)] + [f"Request {r}. {short}" for r in range(5, 9)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="a dense Qwen3 (name or local folder)")
    ap.add_argument("--probe-out", help="the kvconv probe dump (sets KVCONV_PROBE_OUTPUT for the engine's processes)")
    ap.add_argument("--blocks", type=int, default=256, help="KV blocks in the pool (num_gpu_blocks_override)")
    ap.add_argument("--eager", action="store_true", help="enforce_eager: every step eager (the value probe's rows "
                    "on every step)")
    args = ap.parse_args()
    if args.probe_out:
        os.environ["KVCONV_PROBE_OUTPUT"] = os.path.abspath(args.probe_out)
    from vllm import LLM, SamplingParams

    llm = LLM(model=args.model, max_num_seqs=4, max_model_len=1024, enable_prefix_caching=False,
              num_gpu_blocks_override=args.blocks, gpu_memory_utilization=0.5, seed=0, enforce_eager=args.eager)
    params = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True) for m in (40, 56, 72, 88)]
    params += [SamplingParams(temperature=0.0, max_tokens=96, ignore_eos=True) for _ in range(4)]
    outs = llm.generate(prompts(), params)
    for i, o in enumerate(outs, 1):
        print(f"request {i} ({o.request_id}): {len(o.prompt_token_ids)} prompt tokens, "
              f"{len(o.outputs[0].token_ids)} generated")
    core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    if core is not None:  # the engine core shuts its runner down: the plugin writes its dump then
        core.shutdown()


if __name__ == "__main__":
    main()
