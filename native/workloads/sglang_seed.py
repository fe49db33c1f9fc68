"""The second seed's request: SGLang (0.5.12, 0.5.17) decoding a dummy-weight Qwen3-14B under its CUDA graphs, one GPU.

Writes Qwen3-14B's config.json into a temp folder (no weights, no tokenizer: nothing can be fetched on the device),
starts ``sgl.Engine`` with load_format="dummy", the triton attention backend and pytorch sampling, and generates
``--batch`` requests of ``--tokens`` new tokens each (ignore_eos) in one call; decode runs in the captured graphs
(cuda_graph_max_bs=8). ``--requests N`` is throughput mode: a warm-up call, then N requests in calls of
``--batch``, timed. Prints one JSON line; exits 1 when an output holds other than ``--tokens`` tokens.

    python3 native/workloads/sglang_seed.py                                # 8 requests x 8 tokens
    python3 native/workloads/sglang_seed.py --requests 32 --tokens 128     # tokens/s, decode step
    kvconv record -k store_kvcache --capture-range graph -o run-%p.kvdump -- python3 native/workloads/sglang_seed.py
    kvconv record -k store_kvcache --capture-range profiler -o run-%p.kvdump -- \
        python3 native/workloads/sglang_seed.py --range profiler
    python3 native/workloads/sglang_seed.py --requests 32 --tokens 128 --rounds 2 --torch-profile /tmp/prof

How it ends (``--end``, default ``drain``): SGLang's ``Engine.shutdown()`` SIGKILLs its children
(``kill_process_tree``, ``srt/utils/common.py:1149`` of 0.5.12): no handler runs in the scheduler, so a tracer there
loses what it had not flushed, and a replay still in flight (the overlap scheduler launches one more batch before it
sees the last results) leaves its launches unfinished. ``drain`` first waits for the scheduler to be idle
(``Engine.flush_cache()`` succeeds only when nothing runs or is queued: ``Scheduler.is_fully_idle``, the overlap's
result queue included; it is also where kvconv's SGLang plugin writes its probe dump), stops SGLang's subprocess
watchdog (which would SIGQUIT this process when a child ends), sends the children SIGTERM and waits for them (the
tracer's SIGTERM handler finishes the dump), then calls ``Engine.shutdown()`` for what is left. ``--end kill``: only
``Engine.shutdown()``, as before. ``--range profiler`` brackets the measured generate calls with SGLang's own
``start_profile(activities=["CUDA_PROFILER"])`` / ``stop_profile()`` (``cudaProfilerStart/Stop`` in the scheduler:
``srt/managers/scheduler_profiler_mixin.py:212/322``), for ``kvconv record --capture-range profiler``.

Needs the SGLang bundle on PYTHONPATH (native/engines/README.md, "SGLang").
"""

from __future__ import annotations

import argparse
import json
import os
import signal
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
    ap.add_argument("--pool", type=int, default=None, help="KV slots of the token pool (max_total_tokens; default: "
                    "SGLang's, from mem_fraction_static): a small pool keeps the location canary's snapshots small")
    ap.add_argument("--end", choices=("drain", "kill"), default="drain",
                    help="drain: wait for an idle scheduler, SIGTERM the children, then shut down (default); kill: "
                         "Engine.shutdown() alone, as a user ends it (SIGKILL, unless kvconv's plugin lets the "
                         "schedulers exit first)")
    ap.add_argument("--range", choices=("none", "profiler"), default="none",
                    help="profiler: the measured calls between SGLang's start_profile/stop_profile (CUDA_PROFILER)")
    ap.add_argument("--rounds", type=int, default=1, help="throughput mode: timed rounds (default 1)")
    ap.add_argument("--backend", choices=("triton", "flashinfer"), default="triton",
                    help="SGLang's attention backend (default triton)")
    ap.add_argument("--kv-canary", choices=("none", "log", "raise"), default="none",
                    help="SGLang's own KV canary (0.5.17; default none)")
    ap.add_argument("--torch-profile", metavar="DIR", help="throughput mode: as many rounds again under torch.profiler "
                    "(SGLang's start_profile(activities=[CPU, GPU])), traces written to DIR")
    a = ap.parse_args(argv)
    if a.range != "none" and a.torch_profile:
        ap.error("--range profiler and --torch-profile both use SGLang's one profiler: pick one")
    if a.torch_profile and a.requests is None:
        ap.error("--torch-profile times throughput rounds: give --requests")
    for name in ("batch", "tokens", "prompt_len", "graph_max_bs", "rounds") + \
            (("requests",) if a.requests is not None else ()) + (("pool",) if a.pool is not None else ()):
        if getattr(a, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1")
    return a


# SGLang 0.5.12's names of the CUDA-graph options -> 0.5.17's (server_args.py: per phase, decode / prefill)
RENAMED = {"cuda_graph_max_bs": "cuda_graph_max_bs_decode", "cuda_graph_bs": "cuda_graph_bs_decode",
           "disable_piecewise_cuda_graph": "disable_prefill_cuda_graph"}


def engine_args(**kw) -> dict:
    """``kw`` with 0.5.12's option names renamed where the installed SGLang has only the new ones (0.5.17);
    ``kv_canary`` dropped where SGLang has no KV canary (0.5.12) and it is "none"."""
    import dataclasses

    from sglang.srt.server_args import ServerArgs

    names = {f.name for f in dataclasses.fields(ServerArgs)}
    out = {}
    for k, v in kw.items():
        k = RENAMED[k] if k not in names and RENAMED.get(k) in names else k
        if k.startswith("kv_canary") and k not in names and v in ("none", None):
            continue
        out[k] = v
    return out


def start(model_dir, a):
    import sglang as sgl  # the bundle's; imported late so that --help works without it

    return sgl.Engine(**engine_args(
        model_path=model_dir, load_format="dummy", skip_tokenizer_init=True, dtype="bfloat16",
        attention_backend=a.backend, sampling_backend="pytorch", mem_fraction_static=0.5, disable_radix_cache=True,
        cuda_graph_max_bs=a.graph_max_bs, log_level="warning", kv_canary=a.kv_canary,
        **({"max_total_tokens": a.pool} if a.pool else {})))


def generate(engine, n, a, tokens=None):
    """n requests of the same prompt in one call; the count of new tokens each came back with."""
    prompt = list(range(1000, 1000 + a.prompt_len))
    outs = engine.generate(input_ids=[prompt] * n,
                           sampling_params={"max_new_tokens": tokens or a.tokens, "ignore_eos": True})
    return [len(o["output_ids"]) for o in outs]


class measured:
    """The calls inside SGLang's profiler: ``cuda`` (start_profile CUDA_PROFILER: the tracer's --capture-range
    profiler) or ``torch`` (torch.profiler, its traces in ``out``); ``None``: nothing."""

    def __init__(self, engine, kind: str | None, out: str | None = None) -> None:
        self.engine, self.kw = engine, None
        if kind == "cuda":
            self.kw = {"activities": ["CUDA_PROFILER"]}
        elif kind == "torch":
            os.makedirs(out, exist_ok=True)
            self.kw = {"activities": ["CPU", "GPU"], "output_dir": os.path.abspath(out), "with_stack": False,
                       "record_shapes": False}

    def __enter__(self):
        if self.kw is not None:
            self.engine.start_profile(**self.kw)
        return self

    def __exit__(self, *exc) -> None:
        if self.kw is not None:
            self.engine.stop_profile()


def timed_round(engine, a, prefill: float) -> dict:
    """--requests requests in calls of --batch; tokens/s and the decode step (a call's time less a 1-token call's,
    over the tokens after the first)."""
    counts, calls, t0 = [], 0, time.perf_counter()
    for first in range(0, a.requests, a.batch):
        counts += generate(engine, min(a.batch, a.requests - first), a)
        calls += 1
    dt = time.perf_counter() - t0
    step = (dt / calls - prefill) / (a.tokens - 1) * 1e3 if a.tokens > 1 else None
    return {"output_tokens": sum(counts), "bad": [c for c in counts if c != a.tokens], "elapsed_s": round(dt, 3),
            "tokens_per_s": round(sum(counts) / dt, 1), "decode_step_ms": None if step is None else round(step, 3)}


def run(engine, a):
    """The seed run (one call of --batch) or throughput mode (--rounds rounds, then as many under torch.profiler
    with --torch-profile); the result dict."""
    res = {"engine": "sglang", "model": "Qwen3-14B config, dummy weights", "batch": a.batch, "tokens": a.tokens,
           "prompt_len": a.prompt_len, "range": a.range, "backend": a.backend, "kv_canary": a.kv_canary}
    cuda = "cuda" if a.range == "profiler" else None
    if a.requests is None:
        with measured(engine, cuda):
            counts = generate(engine, a.batch, a)
        return dict(res, requests=a.batch, output_tokens=sum(counts), bad=[c for c in counts if c != a.tokens])
    generate(engine, min(a.batch, a.requests), a)  # warm-up: first-call costs stay out of the timing
    t0 = time.perf_counter()
    generate(engine, min(a.batch, a.requests), a, tokens=1)  # prefill + one token: the rest of a call is decode
    prefill = time.perf_counter() - t0
    with measured(engine, cuda):
        rounds = [timed_round(engine, a, prefill) for _ in range(a.rounds)]
    profiled = []
    if a.torch_profile:
        with measured(engine, "torch", a.torch_profile):
            profiled = [timed_round(engine, a, prefill) for _ in range(a.rounds)]
    bad = [c for r in rounds + profiled for c in r.pop("bad")]
    return dict(res, requests=a.requests, prefill_s=round(prefill, 4), rounds=rounds, torch_profiler_rounds=profiled,
                tokens_per_s=rounds[0]["tokens_per_s"], bad=bad)


def drain(engine, *, timeout_s: float = 60.0) -> dict:
    """End the engine so that its children finish what they write (see the module docstring); what it saw."""
    import psutil  # SGLang's own dependency

    tries, t0 = 0, time.monotonic()
    while True:  # idle: nothing runs, nothing is queued, the overlap's last batch is done (Scheduler.is_fully_idle)
        tries += 1
        out = engine.flush_cache()
        if getattr(out, "success", out) or time.monotonic() - t0 > timeout_s:
            break
        time.sleep(0.1)
    time.sleep(0.2)  # the tracer's flusher copies device events every KVCONV_FLUSH_MS (1 ms)
    dog = getattr(getattr(engine, "tokenizer_manager", None), "_subprocess_watchdog", None)
    if dog is not None:  # else a child ending makes it SIGQUIT this process (srt/utils/watchdog.py:221)
        dog.stop()
    kids = psutil.Process().children(recursive=True)
    for p in kids:
        try:
            p.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            pass
    gone, alive = psutil.wait_procs(kids, timeout=timeout_s)
    return {"idle_after_tries": tries, "idle": bool(getattr(out, "success", out)), "children": len(kids),
            "ended_by_sigterm": len(gone), "exit_codes": sorted(p.returncode for p in gone if p.returncode is not None),
            "left_for_shutdown": len(alive)}


def main(argv=None):
    a = parse(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    with tempfile.TemporaryDirectory(prefix="sglang-seed-") as model_dir:
        with open(os.path.join(model_dir, "config.json"), "w") as f:
            json.dump(QWEN3_14B, f, indent=2)
        t0 = time.perf_counter()
        engine = start(model_dir, a)
        started = time.perf_counter() - t0
        ended = None
        try:
            res = run(engine, a)
            if a.end == "drain":
                ended = drain(engine)
        finally:
            engine.shutdown()  # SIGKILLs whatever child is left (all of them with --end kill)
    res.update(start_s=round(started, 1), end=a.end, drain=ended)
    print(json.dumps(res), flush=True)
    if res["bad"]:
        print(f"sglang_seed.py: {len(res['bad'])} request(s) returned other than {a.tokens} tokens", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
