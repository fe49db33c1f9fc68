"""`vllm serve` as its users run it, driven from outside: start the OpenAI-compatible server (under a launcher such as
`kvconv record`, or bare), send it completions over HTTP at batch > 1, aim the capture range with its
/start_profile and /stop_profile endpoints, then end it by a signal, as a terminal's Ctrl-C or a `kill` would.

    python3 native/workloads/vllm_serve.py --signal INT -- \\
        python3 -m kvconv record --writes --engine vllm --capture-range profiler -o serve.kvdump --
    python3 native/workloads/vllm_serve.py --signal TERM --requests 32 --tokens 64 --concurrency 8

Offline (the H200 image: no weights, no tokenizer): the model is Qwen3-14B's config.json with vLLM's dummy weights
(native/workloads/vllm_seed.py's), `--skip-tokenizer-init`, prompts as token ids. The server gets the seed's engine
settings (FULL_AND_PIECEWISE graphs for 1, 2, 4, 8; FLASH_ATTN; no prefix caching; an 8 GiB KV cache) and the
LLM class's batch limits on an H100/H200 (16,384 batched tokens, 1,024 sequences), so that its torch.compile cache
is the one `vllm_seed.py` and `vllm_plants/run.py` use; `--profiler-config '{"profiler": "cuda"}'`: /start_profile
calls cudaProfilerStart in the engine core, which `kvconv record --capture-range profiler` follows.

The end: `--signal INT` sends SIGINT to the launcher's whole process group (the terminal's Ctrl-C reaches the
launcher, the server and its engine core at once); `--signal TERM` sends SIGTERM to the launcher alone (`kill PID`,
`docker stop`), which passes it on. The launcher runs in a session of its own so that the group is its alone. One JSON
line on stdout: the launcher's exit status, the requests and tokens served, the times; exit status: the launcher's
(1 when a request failed or the server did not stop within --stop-timeout, after which its group is SIGKILLed).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from vllm_seed import PROMPT_LEN, QWEN3_14B  # noqa: E402

MODEL_NAME = "qwen3-14b-dummy"


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], usage="%(prog)s [options] [-- LAUNCHER...]",
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--signal", choices=("INT", "TERM"), default="INT", help="how the server is ended (default INT)")
    p.add_argument("--requests", type=int, default=32, metavar="N", help="completions sent (default 32)")
    p.add_argument("--tokens", type=int, default=32, metavar="T", help="output tokens each (default 32)")
    p.add_argument("--concurrency", type=int, default=8, metavar="C", help="requests in flight at once (default 8)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--no-range", action="store_true", help="do not call /start_profile and /stop_profile")
    p.add_argument("--start-timeout", type=float, default=420.0, metavar="S", help="seconds to wait for /health")
    p.add_argument("--stop-timeout", type=float, default=120.0, metavar="S", help="seconds to wait after the signal")
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)  # after it: the command the server runs under
    a = p.parse_args(argv[:cut])
    a.launcher = argv[cut + 1:]
    for name in ("requests", "tokens", "concurrency"):
        if getattr(a, name) < 1:
            p.error(f"--{name} must be >= 1")
    return a


def server_argv(model_dir: str, port: int) -> list[str]:
    """`vllm serve` with the seed's engine settings (vllm_seed.engine), as a user would type it."""
    cc = {"cudagraph_mode": "FULL_AND_PIECEWISE", "cudagraph_capture_sizes": [1, 2, 4, 8]}
    return [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", model_dir,
            "--served-model-name", MODEL_NAME, "--port", str(port), "--host", "127.0.0.1",
            "--load-format", "dummy", "--skip-tokenizer-init", "--dtype", "bfloat16", "--no-enable-prefix-caching",
            "--max-model-len", "2048", "--gpu-memory-utilization", "0.45", "--kv-cache-memory-bytes", str(8 << 30),
            "--max-num-batched-tokens", "16384", "--max-num-seqs", "1024", "--attention-backend", "FLASH_ATTN",
            "--compilation-config", json.dumps(cc), "--profiler-config", json.dumps({"profiler": "cuda"})]


def http(port: int, path: str, body: dict | None = None, *, post: bool = False,
         timeout: float = 300.0) -> tuple[int, dict | str]:
    """(status, JSON or text) of a GET, or a POST when there is a body or ``post``; (0, reason) when the server cannot
    be reached."""
    data = json.dumps(body).encode() if body is not None else (b"" if post else None)
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            text = r.read().decode()
            return r.status, json.loads(text) if text.startswith("{") else text
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")[:500]
    except (urllib.error.URLError, ConnectionError, TimeoutError) as e:
        return 0, str(e)


def wait_healthy(proc, port: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        if http(port, "/health", timeout=5)[0] == 200:
            return True
        time.sleep(1.0)
    return False


def completion(port: int, i: int, tokens: int) -> int:
    """One request's output tokens (usage.completion_tokens), -1 when it failed (the reason on stderr)."""
    body = {"model": MODEL_NAME, "prompt": [1000 + 7 * i + j for j in range(PROMPT_LEN)], "max_tokens": tokens,
            "temperature": 0.0, "ignore_eos": True}
    status, out = http(port, "/v1/completions", body)
    if status != 200 or not isinstance(out, dict):
        print(f"vllm_serve.py: request {i}: HTTP {status}: {str(out)[:300]}", file=sys.stderr, flush=True)
        return -1
    return int(out.get("usage", {}).get("completion_tokens", -1))


def serve_round(a) -> dict:
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=a.concurrency) as pool:
        got = list(pool.map(lambda i: completion(a.port, i, a.tokens), range(a.requests)))
    wall = time.perf_counter() - t0
    ok = sum(1 for g in got if g == a.tokens)
    return {"requests_ok": ok, "output_tokens": sum(g for g in got if g > 0), "wall_s": round(wall, 3),
            "tokens_per_s": round(sum(g for g in got if g > 0) / wall, 1)}


def stop(proc, how: str, timeout: float) -> tuple[int, float, bool]:
    """(exit status, seconds, whether it had to be SIGKILLed) after the signal."""
    t0 = time.perf_counter()
    if how == "INT":
        os.killpg(proc.pid, signal.SIGINT)  # a terminal's Ctrl-C: the whole foreground job
    else:
        proc.send_signal(signal.SIGTERM)  # kill PID: the launcher alone
    try:
        rc = proc.wait(timeout=timeout)
        return rc, time.perf_counter() - t0, False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        return proc.wait(), time.perf_counter() - t0, True


def main(argv=None) -> int:
    a = parse(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    with tempfile.TemporaryDirectory(prefix="qwen3-14b-") as model_dir:
        with open(os.path.join(model_dir, "config.json"), "w") as f:
            json.dump(QWEN3_14B, f)
        cmd = a.launcher + server_argv(model_dir, a.port)
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, start_new_session=True)
        res: dict = {"signal": a.signal, "launcher": " ".join(a.launcher[:3]) or "(none)", "requests": a.requests,
                     "tokens": a.tokens, "concurrency": a.concurrency}
        if not wait_healthy(proc, a.port, a.start_timeout):
            res["error"] = f"the server was not healthy within {a.start_timeout:.0f} s (exit {proc.poll()})"
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            res["exit"] = proc.wait()
            print(json.dumps(res), flush=True)
            return 1
        res["start_s"] = round(time.perf_counter() - t0, 1)
        completion(a.port, 10_000, 4)  # one request before the range: the first step's one-off work stays out
        if not a.no_range:
            res["start_profile"] = http(a.port, "/start_profile", post=True)[0]
        res.update(serve_round(a))
        if not a.no_range:
            res["stop_profile"] = http(a.port, "/stop_profile", post=True)[0]
        rc, secs, killed = stop(proc, a.signal, a.stop_timeout)
        res.update(exit=rc, stop_s=round(secs, 1), killed=killed)
    print(json.dumps(res), flush=True)
    ranged = a.no_range or {res["start_profile"], res["stop_profile"]} == {200}
    if killed or res["requests_ok"] != a.requests or not ranged:
        return 1
    return rc if rc >= 0 else 128 - rc


if __name__ == "__main__":
    sys.exit(main())
