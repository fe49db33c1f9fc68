"""Issue 50 where no GPU is: the `vllm serve` driver (native/workloads/vllm_serve.py) against a stand-in server that
speaks the endpoints it uses and ends on the signal it is sent; the vLLM plugin's dummy steps (every row a pad) and
its capture window (the engine's cudaProfilerStart/Stop), through the real probe dump and `kvconv validate`; the
#43810 plant's indexing write; the cost table. The runs on vLLM itself are native/scripts/gpu_vllm50.sh's."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from conftest import run_cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKLOADS = os.path.join(ROOT, "native", "workloads")

# A stand-in for `python -m vllm.entrypoints.cli.main serve`: /health, /v1/completions (usage.completion_tokens =
# max_tokens), /start_profile, /stop_profile; on SIGINT/SIGTERM it notes the signal in $FAKE_LOG and exits 0, or
# ignores it when FAKE_DEAF is set.
FAKE_SERVER = '''
import json, os, signal, sys, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

port = int(sys.argv[sys.argv.index("--port") + 1])
log = open(os.environ["FAKE_LOG"], "a")

class H(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass
    def reply(self, code, body=b""):
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def do_GET(self):
        self.reply(200 if self.path == "/health" else 404)
    def do_POST(self):
        n = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(n) or b"{}")
        if self.path in ("/start_profile", "/stop_profile"):
            log.write(self.path + "\\n"); log.flush()
            return self.reply(200)
        out = {"usage": {"completion_tokens": body["max_tokens"]}, "prompt_len": len(body["prompt"])}
        self.reply(200, json.dumps(out).encode())

srv = ThreadingHTTPServer(("127.0.0.1", port), H)

def stop(signum, frame):
    log.write(signal.Signals(signum).name + "\\n"); log.flush()
    if not os.environ.get("FAKE_DEAF"):
        threading.Thread(target=srv.shutdown).start()

signal.signal(signal.SIGINT, stop)
signal.signal(signal.SIGTERM, stop)
srv.serve_forever()
'''


@pytest.fixture
def fake_vllm(tmp_path):
    pkg = tmp_path / "fake" / "vllm" / "entrypoints" / "cli"
    pkg.mkdir(parents=True)
    for d in (pkg.parent.parent, pkg.parent, pkg):
        (d / "__init__.py").write_text("")
    (pkg / "main.py").write_text(textwrap.dedent(FAKE_SERVER))
    return tmp_path


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _drive(root, *args, deaf=False):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KVCONV_", "FAKE_"))}
    env.update(PYTHONPATH=str(root / "fake"), FAKE_LOG=str(root / "server.log"))
    if deaf:
        env["FAKE_DEAF"] = "1"
    cmd = [sys.executable, os.path.join(WORKLOADS, "vllm_serve.py"), "--port", str(_free_port()),
           "--start-timeout", "60", *args]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    return p, json.loads(p.stdout.strip().splitlines()[-1]), (root / "server.log").read_text().split()


@pytest.mark.parametrize("sig", ["INT", "TERM"])
def test_serve_driver_aims_the_range_sends_a_batch_and_ends_by_the_signal(fake_vllm, sig):
    p, res, seen = _drive(fake_vllm, "--signal", sig, "--requests", "12", "--tokens", "5", "--concurrency", "4")
    assert p.returncode == 0, p.stderr
    assert (res["exit"], res["killed"], res["requests_ok"], res["output_tokens"]) == (0, False, 12, 60)
    assert (res["start_profile"], res["stop_profile"], res["concurrency"]) == (200, 200, 4)
    assert seen == ["/start_profile", "/stop_profile", "SIG" + sig]


def test_serve_driver_through_a_launcher_sigint_reaches_the_whole_group(fake_vllm):
    """Ctrl-C reaches every process of the job: the launcher (here a shell that waits) and the server alike."""
    launcher = ["sh", "-c", 'trap "echo launcher-got-int >> $FAKE_LOG" INT; "$@" & wait $!; wait $!', "sh"]
    p, res, seen = _drive(fake_vllm, "--signal", "INT", "--requests", "3", "--tokens", "2", "--", *launcher)
    assert p.returncode == 0 and res["exit"] == 0, p.stderr
    assert "SIGINT" in seen and "launcher-got-int" in seen


def test_serve_driver_kills_a_server_that_does_not_stop_and_says_so(fake_vllm):
    p, res, seen = _drive(fake_vllm, "--signal", "TERM", "--requests", "2", "--stop-timeout", "2", deaf=True)
    assert p.returncode == 1 and res["killed"] is True and seen[-1] == "SIGTERM"


# ---- the plugin's dummy steps and capture window (numpy; no torch, no tracer: the probe dump alone) ----

class _Runner:
    kernel_block_sizes = [4]
    cudagraph_manager = None

    def __init__(self):
        from kvconv.capture.engines.vllm import BlockMirror

        self.block_tables = type("B", (), {})()
        self.block_tables._kvconv_mirror = BlockMirror(4, 8)
        self.block_tables._kvconv_mirror.append(0, 0, [2, 5])


BATCH = type("Batch", (), dict(num_tokens_after_padding=4, num_tokens=3, req_ids=["r1"],
                               num_scheduled_tokens=np.array([3]), idx_mapping_np=np.array([0]),
                               num_computed_tokens_np=np.array([0])))()


def _session(tmp_path):
    from kvconv.capture.engines import vllm as plugin
    from kvconv.capture.probe import CanaryRecorder
    from kvconv.capture.probe.writes import WriteProbe

    s = plugin._Session(_Runner())
    s.recorder = CanaryRecorder(str(tmp_path / "p.kvdump"), metadata={"producer": "test"})
    from kvconv.capture.probe.writes import WriteProbeWarning

    with pytest.warns(WriteProbeWarning, match="no tracer in this process"):
        s.writes = WriteProbe(mirror=s.recorder)  # no tracer here: the steps go to the probe's dump only
    return plugin, s


def _steps(path):
    from kvconv.format import dump

    with dump.open(path) as d:
        return d.records("write_step"), d.records("slot_map"), d.metadata()


def test_a_dummy_forward_is_a_step_of_pads_numbered_as_the_next_real_step(tmp_path, monkeypatch):
    plugin, s = _session(tmp_path)
    monkeypatch.setitem(plugin._window, "open", True)
    s.begin_dummy(3)  # warm-up: nothing meant to be written
    s.step = 5
    s.begin_dummy(2)  # a captured forward, left open until the next step
    s.finish()
    s.close()
    steps, smap, meta = _steps(tmp_path / "p.kvdump")
    assert steps["step"].tolist() == [0, 5] and steps["map_count"].tolist() == [3, 2]
    assert smap["slot"].tolist() == [-1] * 5 and smap["request_id"].tolist() == [0] * 5
    assert meta["dummy_steps"] == 2
    assert run_cli("validate", "p.kvdump", cwd=tmp_path).returncode in (0, 4)  # clean, or nothing to check


def test_steps_outside_the_profiler_window_are_not_recorded_and_the_stop_writes_the_dump(tmp_path, monkeypatch):
    plugin, s = _session(tmp_path)
    monkeypatch.setattr(plugin, "_sessions", [s])
    monkeypatch.setitem(plugin._window, "open", False)
    monkeypatch.setitem(plugin._window, "stop_closes", True)
    calls = []
    prof = type("Profiler", (), {"start": staticmethod(lambda: calls.append("start")),
                                 "stop": staticmethod(lambda: calls.append("stop"))})
    plugin._patch_profiler(prof)
    s.begin_dummy(4)  # before cudaProfilerStart: not recorded
    s.begin(BATCH)  # a real step outside the range: counted (step 0), not recorded
    s.finish()
    prof.start()
    s.begin(BATCH)  # step 1, recorded: request r1's three tokens at slots 8-10 and a pad
    s.finish()
    prof.stop()  # the engine's cudaProfilerStop: the probe dump is written here
    s.begin(BATCH)  # after the stop: nothing more
    assert calls == ["start", "stop"] and s.recorder is None and plugin._window["open"] is False
    steps, smap, meta = _steps(tmp_path / "p.kvdump")
    assert steps["step"].tolist() == [1] and smap["slot"].tolist() == [8, 9, 10, -1]
    assert meta["request_ids"] == {"1": "r1"}


# ---- the plants (no vLLM: their code paths on numpy stand-ins) ----

def _plants(monkeypatch):
    monkeypatch.delenv("KVCONV_PLANT", raising=False)
    spec = importlib.util.spec_from_file_location("vllm_plants_site",
                                                  os.path.join(WORKLOADS, "vllm_plants", "sitecustomize.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_pad_index_write_sends_a_pad_row_to_the_last_slot_as_vllm_43810(monkeypatch, capsys):
    site = _plants(monkeypatch)
    k_cache, v_cache = np.zeros((6, 4, 1, 2)), np.zeros((6, 4, 1, 2))  # 6 blocks of 4 slots
    key, value = np.arange(6.0).reshape(3, 1, 2) + 1, -np.arange(6.0).reshape(3, 1, 2) - 1
    site.index_write(key, value, k_cache, v_cache, np.array([9, 2, -1]))  # batch of 2 padded to 3
    written = {int(b * 4 + o) for b, o in zip(*np.nonzero(k_cache.any(axis=(2, 3))))}
    assert written == {9, 2, 23} and (k_cache[5, 3] == key[2]).all() and (v_cache[5, 3] == value[2]).all()
    assert "slot 23 (block 5, offset 3)" in capsys.readouterr().err


def test_plants_arm_several_at_once_and_refuse_an_unknown_name():
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVCONV_")}
    plants = os.path.join(WORKLOADS, "vllm_plants")
    run = lambda names: subprocess.run([sys.executable, "-c", "pass"], capture_output=True, text=True,  # noqa: E731
                                       env=env | {"KVCONV_PLANT": names, "PYTHONPATH": plants}, timeout=60)
    both = run("dummy-slot-zero,stale-write")
    assert both.returncode == 0 and "kvconv plant dummy-slot-zero,stale-write: armed in process" in both.stderr
    bad = run("stale-write,off-by-two")
    assert "unknown plant (one of" in bad.stderr and "armed" not in bad.stderr


# ---- the cost table ----

def test_cost_table_medians_spreads_and_change_from_untraced(tmp_path):
    rows = [("untraced", 8, [400, 410, 390, 405, 395]), ("traced", 8, [392, 380, 396, 388, 390]),
            ("untraced", 32, [1000, 1010, 990, 1005, 995])]
    log = tmp_path / "cost.log"
    log.write_text("INFO vLLM says something\n" + "".join(
        json.dumps({"config": c, "batch": b, "cycle": i + 1, "tokens_per_s": v}) + "\n"
        for c, b, vs in rows for i, v in enumerate(vs)))
    p = subprocess.run([sys.executable, os.path.join(WORKLOADS, "vllm_cost.py"), "--table", str(log)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[2] == "| untraced | 8 | 5 | 400.0 | 390.0-410.0 (5.0%) |  |"
    assert lines[3] == "| untraced | 32 | 5 | 1,000.0 | 990.0-1,010.0 (2.0%) |  |"
    assert lines[4] == "| traced | 8 | 5 | 390.0 | 380.0-396.0 (4.1%) | -2.5% |"
