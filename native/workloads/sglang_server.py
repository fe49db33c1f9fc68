"""``python -m sglang.launch_server`` as a user runs it, requests over HTTP at batch > 1, ended by a signal (issue 49).

Starts the server (Qwen3-14B's shape, dummy weights, no tokenizer: ``--skip-tokenizer-init``, prompts as token ids)
as this script's child, so that under ``kvconv record`` the server, its scheduler and its detokenizer are traced;
waits for ``/health``; sends ``--requests`` requests to ``/generate`` from ``--concurrency`` threads at once (the
scheduler batches them); once all came back, sends the server ``--signal`` (INT: Ctrl-C; TERM: a service manager's
stop) and waits for it. SIGINT: uvicorn returns, kvconv's plugin lets the scheduler exit on its own before
``launch_server.py`` kills it. SIGTERM: SGLang's own graceful path (``ShutdownReq``, then the server SIGKILLs itself:
exit -9 is SGLang's normal end there).

    kvconv record -k store_kvcache --writes --engine sglang -o run-%p.kvdump -- \\
        python3 native/workloads/sglang_server.py --signal INT

Prints one JSON line (tokens back, seconds to ready, to end, the server's exit status); exits 1 when a request failed
or came back short, or the server did not end within ``--end-timeout``.
"""

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sglang_seed import QWEN3_14B, engine_args  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def flags(**kw) -> list[str]:
    """``launch_server`` flags of ``kw`` under this SGLang's option names (True: a bare flag)."""
    out = []
    for k, v in engine_args(**kw).items():
        if v is False or v is None:
            continue
        out.append("--" + k.replace("_", "-"))
        if v is not True:
            out.append(str(v))
    return out


def post(url: str, body: dict, timeout: float) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def ready(base: str, proc, timeout: float) -> bool:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(base + "/health", timeout=5) as r:
                if r.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(1)
    return False


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--signal", choices=("INT", "TERM"), default="INT", help="how the server is ended (default INT)")
    ap.add_argument("--requests", type=int, default=16, help="requests sent (default 16)")
    ap.add_argument("--concurrency", type=int, default=8, help="requests in flight at once (default 8)")
    ap.add_argument("--tokens", type=int, default=32, help="new tokens per request (default 32)")
    ap.add_argument("--backend", choices=("triton", "flashinfer"), default="triton", help="attention backend")
    ap.add_argument("--kv-canary", choices=("none", "log", "raise"), default="none", help="SGLang's KV canary")
    ap.add_argument("--start-timeout", type=float, default=400.0)
    ap.add_argument("--end-timeout", type=float, default=90.0)
    a = ap.parse_args()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix="sglang-server-") as model:
        with open(os.path.join(model, "config.json"), "w") as f:
            json.dump(QWEN3_14B, f)
        cmd = [sys.executable, "-m", "sglang.launch_server"] + flags(
            model_path=model, load_format="dummy", skip_tokenizer_init=True, attention_backend=a.backend,
            sampling_backend="pytorch", mem_fraction_static=0.5, cuda_graph_max_bs=8, kv_canary=a.kv_canary,
            host="127.0.0.1", port=port, log_level="warning")
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd)
        res = {"workload": "sglang_server", "signal": a.signal, "backend": a.backend, "kv_canary": a.kv_canary}
        try:
            if not ready(base, proc, a.start_timeout):
                res["error"] = f"not ready in {a.start_timeout} s (exit {proc.poll()})"
                print(json.dumps(res), flush=True)
                return 1
            res["ready_s"] = round(time.monotonic() - t0, 1)
            body = lambda r: {"input_ids": [1000 + 7 * r + j for j in range(16)],  # noqa: E731
                              "sampling_params": {"max_new_tokens": a.tokens, "ignore_eos": True}}
            with ThreadPoolExecutor(a.concurrency) as pool:
                outs = list(pool.map(lambda r: post(base + "/generate", body(r), 300), range(a.requests)))
            res["tokens_back"] = [len(o.get("output_ids", [])) for o in outs]
        finally:
            t1 = time.monotonic()
            if proc.poll() is None:
                proc.send_signal(getattr(signal, "SIG" + a.signal))
            try:
                res["server_exit"] = proc.wait(timeout=a.end_timeout)
            except subprocess.TimeoutExpired:
                res["server_exit"] = "still running: killed"
                proc.kill()
                proc.wait()
            res["end_s"] = round(time.monotonic() - t1, 1)
    print(json.dumps(res), flush=True)
    ok = res.get("tokens_back") == [a.tokens] * a.requests and isinstance(res["server_exit"], int)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
