"""The workload of the SGLang plant runs: eight greedy requests on Qwen3-14B's shape (dummy weights) through SGLang
0.5.12's or 0.5.17's offline ``Engine``, at most four running, so that requests finish, give their slots back and
waiting ones are admitted (prefill beside decodes) while others decode in the CUDA graphs.

    $ KVCONV_ENGINE=sglang KVCONV_CANARY=1 python native/workloads/sglang_plants/run.py --probe-out /tmp/p.kvdump

Requests 1-4 have 160-token prompts and stop after 24, 32, 40 and 48 tokens; requests 5-8 have 24-token prompts and
generate 40. Graphs are captured for every batch size 1-4 (``cuda_graph_bs``), so a replay has no pad rows; the
token pool is small (``--pool`` slots, ``max_total_tokens``) so that the location canary's snapshots stay small
(clones of 2 x 40 buffers of ``--pool`` slots x 2 KiB) and slots are reused within the run. Piecewise CUDA graphs for
prefill are off (``--piecewise`` turns them on: their capture compiles for about a minute). The engine ends as a
user ends it, ``Engine.shutdown()``: kvconv's plugin first lets the schedulers exit on their own (SGLang's
``ShutdownReq``; 0.5.12: idle, then SIGTERM), so their dumps are finished (``--end drain``: sglang_seed.py's drain
first, as before issue 49).
"""

import argparse
import json
import os
import sys
import tempfile


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--probe-out", help="the kvconv probe dump (sets KVCONV_PROBE_OUTPUT for the scheduler)")
    ap.add_argument("--pool", type=int, default=4096, help="KV slots in the token pool (max_total_tokens)")
    ap.add_argument("--piecewise", action="store_true", help="keep SGLang's piecewise CUDA graphs for prefill")
    ap.add_argument("--backend", choices=("triton", "flashinfer"), default="triton", help="attention backend")
    ap.add_argument("--kv-canary", choices=("none", "log", "raise"), default="none",
                    help="SGLang's own KV canary beside kvconv's (0.5.17)")
    ap.add_argument("--kv-canary-real-data", choices=("none", "partial", "all"), default="none",
                    help="SGLang's canary over the real KV data too (its real_kv_* perturbations need it)")
    ap.add_argument("--end", choices=("shutdown", "drain"), default="shutdown",
                    help="shutdown: Engine.shutdown() as a user ends it (kvconv's plugin lets the schedulers exit "
                         "first; default); drain: sglang_seed.py's drain first")
    args = ap.parse_args()
    if args.probe_out:
        os.environ["KVCONV_PROBE_OUTPUT"] = os.path.abspath(args.probe_out)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import sglang as sgl
    import sglang_seed

    with tempfile.TemporaryDirectory(prefix="sglang-plants-") as folder:
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump(sglang_seed.QWEN3_14B, f)
        engine = sgl.Engine(**sglang_seed.engine_args(
            model_path=folder, load_format="dummy", skip_tokenizer_init=True, dtype="bfloat16",
            attention_backend=args.backend, sampling_backend="pytorch", mem_fraction_static=0.5,
            disable_radix_cache=True, max_running_requests=4, cuda_graph_bs=[1, 2, 3, 4], max_total_tokens=args.pool,
            disable_piecewise_cuda_graph=not args.piecewise, log_level="warning", kv_canary=args.kv_canary,
            kv_canary_real_data=args.kv_canary_real_data))
        try:
            prompts = [[1000 + 13 * r + j for j in range(160 if r < 4 else 24)] for r in range(8)]
            params = [{"max_new_tokens": m, "ignore_eos": True, "temperature": 0.0} for m in (24, 32, 40, 48)]
            params += [{"max_new_tokens": 40, "ignore_eos": True, "temperature": 0.0} for _ in range(4)]
            outs = engine.generate(input_ids=prompts, sampling_params=params)
            for i, o in enumerate(outs, 1):
                print(f"request {i} ({o['meta_info'].get('id')}): {len(prompts[i - 1])} prompt tokens, "
                      f"{len(o['output_ids'])} generated", flush=True)
            if args.end == "drain":
                print(json.dumps({"drain": sglang_seed.drain(engine)}), flush=True)
        finally:
            engine.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
