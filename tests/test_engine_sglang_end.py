"""The SGLang plugin's engine-process half (kvconv.capture.engines.sglang_end, issue 49) where no GPU and no SGLang
are: a stand-in for SGLang's Engine whose ``shutdown`` SIGKILLs its children as SGLang's ``kill_process_tree`` does,
with a "scheduler" child that exits on its own only when asked (SGLang 0.5.17's ``ShutdownReq``) or by SIGTERM
(0.5.12, no ``ShutdownReq``). Through SGLang's plugin contract (``HookRegistry`` AROUND), the user's plain
``engine.shutdown()`` must let the scheduler exit by itself before the kill; and 0.5.17's renamed graph runners must
give the same pad rows as 0.5.12's."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from sglang_fakes import ForwardMode

from kvconv.capture.engines.sglang import _Session

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The scheduler child: exits 0 once the "ShutdownReq" file appears (its event loop returns), its SIGTERM default.
CHILD = ("import os, sys, time\n"
         "sys.argv[0] = 'sglang::scheduler'\n"
         "while not os.path.exists(sys.argv[1]):\n"
         "    time.sleep(0.05)\n")

FAKE = {
    "sglang/__init__.py": "__version__ = '0.5.17-standin'\n",
    "sglang/srt/__init__.py": "",
    "sglang/srt/plugins/__init__.py": "",
    "sglang/srt/plugins/hook_registry.py": """
        import enum, pkgutil
        class HookType(enum.Enum):
            AROUND = "around"
        class HookRegistry:
            _hooks = []
            @classmethod
            def register(cls, target, hook, hook_type=HookType.AROUND):
                cls._hooks.append((target, hook, hook_type))
            @classmethod
            def apply_hooks(cls):
                for target, hook, _ in cls._hooks:
                    path, name = target.rsplit(".", 1)
                    try:
                        owner = pkgutil.resolve_name(path)
                    except (ImportError, AttributeError):
                        continue
                    orig = getattr(owner, name)
                    def wrapper(*a, _o=orig, _h=hook, **kw):
                        return _h(_o, *a, **kw)
                    setattr(owner, name, wrapper)
    """,
    "sglang/srt/entrypoints/__init__.py": "",
    "sglang/srt/entrypoints/engine.py": """
        import os, signal, subprocess, sys
        import psutil
        class TokenizerManager:
            def __init__(self, flag):
                self.flag, self._subprocess_watchdog = flag, None
            def _dispatch_to_scheduler(self, obj):
                open(self.flag, "w").write(type(obj).__name__)
        class Engine:
            def __init__(self, flag):
                self.tokenizer_manager = TokenizerManager(flag)
                self.child = subprocess.Popen([sys.executable, "-c", CHILD, flag])
            def flush_cache(self):  # idle (0.5.12's path waits for it before the SIGTERM)
                return True
            def shutdown(self):  # SGLang's kill_process_tree: SIGKILL to every child
                for p in psutil.Process().children(recursive=True):
                    p.send_signal(signal.SIGKILL)
                return self.child.wait()
    """,
}

DRIVE = """
    import sys
    from kvconv.capture.engines import sglang as plugin
    plugin.register()
    from sglang.srt.plugins.hook_registry import HookRegistry
    HookRegistry.apply_hooks()
    from sglang.srt.entrypoints.engine import Engine
    engine = Engine(sys.argv[1])
    print("child exit", engine.shutdown())
    print("again", engine.shutdown())
"""


def _run(tmp_path, *, shutdown_req: bool):
    files = dict(FAKE)
    files["sglang/srt/entrypoints/engine.py"] = f"CHILD = {CHILD!r}\n" + textwrap.dedent(files[
        "sglang/srt/entrypoints/engine.py"])
    if shutdown_req:
        files["sglang/srt/managers/__init__.py"] = ""
        files["sglang/srt/managers/io_struct.py"] = "class ShutdownReq:\n    pass\n"
    for name, text in files.items():
        p = tmp_path / "fake" / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text))
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVCONV_")}
    env |= {"PYTHONPATH": f"{tmp_path / 'fake'}{os.pathsep}{ROOT}", "KVCONV_ENGINE": "sglang",
            "KVCONV_SGLANG_END_S": "10"}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(DRIVE), str(tmp_path / "flag")],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)


def test_a_users_shutdown_lets_the_scheduler_exit_on_its_own_with_sglangs_shutdown_req(tmp_path):
    pytest.importorskip("psutil")
    p = _run(tmp_path, shutdown_req=True)
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "flag").read_text() == "ShutdownReq"
    # exited by itself (0), before SGLang's kill (-9) came
    assert "engine end: 1 of 1 scheduler(s) exited after ShutdownReq in " in p.stderr and "(exit codes [0]); 0 left" \
        in p.stderr
    assert p.stderr.count("engine end:") == 1  # the second shutdown (SGLang's atexit) does nothing more


def test_without_shutdown_req_the_scheduler_gets_sigterm_before_the_kill(tmp_path):
    pytest.importorskip("psutil")
    p = _run(tmp_path, shutdown_req=False)
    assert p.returncode == 0, p.stderr
    # SIGTERM: the tracer's handler finishes its dump there
    assert "1 of 1 scheduler(s) exited after SIGTERM" in p.stderr and "(exit codes [-15]); 0 left" in p.stderr
    assert not (tmp_path / "flag").exists()


class _Runs:
    def __init__(self, ok, **kw):
        self.__dict__.update(kw, ok=ok)

    def can_run_graph(self, fb):
        return self.ok


class EagerRunner:  # SGLang 0.5.17's stand-in when the prefill graph is off (model_runner.py: isinstance check)
    capture_num_tokens = [4, 8]

    def can_run_graph(self, fb):
        return True


def test_padded_rows_under_sglang_0517s_graph_runner_names():
    runner = type("R", (), {"decode_cuda_graph_runner": _Runs(True, capture_bs=[1, 2, 4, 8], captured_req_width=1),
                            "prefill_cuda_graph_runner": _Runs(True, capture_num_tokens=[4, 8, 16])})()
    s = _Session(runner)
    batch = type("B", (), {"forward_mode": ForwardMode("decode"), "batch_size": 3})()
    assert s.padded_rows(batch, 3) == 4
    batch.forward_mode = ForwardMode("extend")
    assert s.padded_rows(batch, 9) == 16
    runner.prefill_cuda_graph_runner = EagerRunner()  # prefill graph off: eager, no pad rows
    assert s.padded_rows(batch, 5) == 5
    runner.decode_cuda_graph_runner.ok = False
    batch.forward_mode = ForwardMode("decode")
    assert s.padded_rows(batch, 3) == 3


def test_a_pool_in_the_hnd_layout_is_refused_by_name():
    from kvconv.capture.engines.sglang import _check_layout

    _check_layout(type("P", (), {"kv_cache_layout": "nhd", "use_hnd": False})())
    with pytest.raises(RuntimeError, match="KV layout 'hnd': the plugin maps slots of the NHD layout only"):
        _check_layout(type("P", (), {"kv_cache_layout": "hnd", "use_hnd": True})())


ARGS = """
    import sys
    sys.path.insert(0, sys.argv[1])
    import sglang_seed, sglang_server
    print(sorted(sglang_seed.engine_args(cuda_graph_max_bs=8, cuda_graph_bs=[1, 2], disable_piecewise_cuda_graph=True,
                                         kv_canary="none", mem_fraction_static=0.5).items()))
    print(sglang_server.flags(skip_tokenizer_init=True, cuda_graph_max_bs=8, kv_canary="log", host=None))
"""


def _args(tmp_path, fields: str):
    p = tmp_path / "fake" / "sglang" / "srt" / "server_args.py"
    p.parent.mkdir(parents=True, exist_ok=True)
    for pkg in (p.parent.parent, p.parent):
        (pkg / "__init__.py").write_text("")
    p.write_text("import dataclasses\n@dataclasses.dataclass\nclass ServerArgs:\n" +
                 "".join(f"    {f}: object = None\n" for f in fields.split()))
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "fake"))
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(ARGS), os.path.join(ROOT, "native", "workloads")],
                       capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.splitlines()


def test_workload_options_follow_the_installed_sglangs_names(tmp_path):
    new = _args(tmp_path, "cuda_graph_max_bs_decode cuda_graph_bs_decode disable_prefill_cuda_graph kv_canary "
                          "mem_fraction_static skip_tokenizer_init host")
    assert new[0] == ("[('cuda_graph_bs_decode', [1, 2]), ('cuda_graph_max_bs_decode', 8), "
                      "('disable_prefill_cuda_graph', True), ('kv_canary', 'none'), ('mem_fraction_static', 0.5)]")
    assert new[1] == "['--skip-tokenizer-init', '--cuda-graph-max-bs-decode', '8', '--kv-canary', 'log']"
    old = _args(tmp_path, "cuda_graph_max_bs cuda_graph_bs disable_piecewise_cuda_graph mem_fraction_static "
                          "skip_tokenizer_init host")  # 0.5.12: no KV canary, "none" dropped
    assert old[0] == ("[('cuda_graph_bs', [1, 2]), ('cuda_graph_max_bs', 8), ('disable_piecewise_cuda_graph', True), "
                      "('mem_fraction_static', 0.5)]")
