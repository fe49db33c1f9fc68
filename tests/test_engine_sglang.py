"""The SGLang plugin (kvconv.capture.engines.sglang, issue 40) where no GPU and no SGLang are: inert without
KVCONV_ENGINE, declared as SGLang's general plugin, the pure functions that turn a ForwardBatch's host arrays into
the write probe's rows, and whole runs through the plugin's hooks on a stand-in for SGLang 0.5.12 (its
HookRegistry's AROUND semantics, a ModelRunner whose forward writes the token pool at out_cache_loc, the release
and flush_cache entry points): the probe dump they write is judged by the real ``kvconv validate`` (a slot handed to
a new request while its owner runs is found with step, request and slot; the location canary's unexpected page,
with torch). The runs on SGLang itself need the H200: native/scripts/gpu_engines.sh (sglang-plants)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from conftest import run_cli
from kvconv.capture.engines.sglang import graph_rows, page_view, pool_caches, step_rows, token_counts

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A stand-in for the parts of SGLang 0.5.12 the plugin touches (paths as in the wheel; AROUND as
# srt/plugins/hook_registry.py's _wrap_fn: hook(original, *args, **kwargs)).
FAKE = {
    "sglang/__init__.py": "__version__ = '0.5.12-standin'\n",
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
                    try:  # as SGLang's: a target that does not resolve is logged and skipped
                        owner = pkgutil.resolve_name(path)
                    except (ImportError, AttributeError):
                        continue
                    orig = getattr(owner, name)
                    def wrapper(*a, _o=orig, _h=hook, **kw):
                        return _h(_o, *a, **kw)
                    setattr(owner, name, wrapper)
    """,
    "sglang/srt/mem_cache/__init__.py": "",
    "sglang/srt/mem_cache/common.py": "def release_kv_cache(req, tree_cache, is_insert=True):\n    return None\n",
    "sglang/srt/managers/__init__.py": "",
    "sglang/srt/managers/scheduler.py": "class Scheduler:\n    def flush_cache(self, empty_cache=True):\n"
                                        "        return True\n",
    "sglang/srt/model_executor/__init__.py": "",
    "sglang/srt/model_executor/cuda_graph_runner.py": """
        import numpy as np
        class DecodeInputBuffers:  # the graph's static buffers (0.5.12: cuda_graph_runner.py:134, populate :282)
            def __init__(self):
                self.out_cache_loc = np.zeros(8, np.int64)
            def populate_from_forward_batch(self, *, forward_batch, raw_bs, raw_num_token, bs, **kw):
                self.out_cache_loc[:] = 0
                self.out_cache_loc[:raw_num_token] = forward_batch.out_cache_loc
    """,
    "sglang/srt/model_executor/model_runner.py": """
        import numpy as np
        from sglang.srt.model_executor.cuda_graph_runner import DecodeInputBuffers
        class Mode:
            def __init__(self, name):
                self.name = name
            def is_idle(self): return self.name == "idle"
            def is_decode(self): return self.name == "decode"
            def is_extend(self): return self.name == "extend"
            def is_target_verify(self): return False
            def is_cuda_graph(self): return self.name == "decode"
        class Batch:
            def __init__(self, mode, rids, slots, extend=None):
                self.forward_mode, self.rids, self.batch_size = Mode(mode), rids, len(rids)
                self.out_cache_loc, self.extend_seq_lens_cpu = slots, extend
        class Graphs:
            capture_bs, num_tokens_per_bs = [1, 2, 4], 1
            def can_run(self, fb): return fb.batch_size <= 4
        class Pool:
            def __init__(self, new, layers, slots):
                self.k_buffer = [new((slots, 2, 4)) for _ in range(layers)]
                self.v_buffer = [new((slots, 2, 4)) for _ in range(layers)]
        class Allocator:
            page_size = 1
        class ModelRunner:
            is_draft_worker = False
            def __init__(self, new, layers=2, slots=32):
                self.token_to_kv_pool, self.token_to_kv_pool_allocator = Pool(new, layers, slots), Allocator()
                self.graph_runner, self.writes, self.buffers = Graphs(), 0, DecodeInputBuffers()
            def forward(self, fb, extra=()):
                loc = list(fb.out_cache_loc) + list(extra)
                if fb.forward_mode.is_cuda_graph():  # a replay writes the static buffer's slots, pads at slot 0
                    n = len(fb.rids)
                    bs = 1 << (n - 1).bit_length()
                    self.buffers.populate_from_forward_batch(forward_batch=fb, raw_bs=n, raw_num_token=n, bs=bs)
                    loc = [int(x) for x in self.buffers.out_cache_loc[:bs]] + list(extra)
                self.slots_written = loc
                self.writes += 1
                for buf in self.token_to_kv_pool.k_buffer + self.token_to_kv_pool.v_buffer:
                    for s in loc:
                        buf[s] = self.writes
                return "output"
    """,
}

DRIVE = """
    import json, sys
    from kvconv.capture.engines import sglang as plugin
    plugin.register()
    from sglang.srt.plugins.hook_registry import HookRegistry
    HookRegistry.apply_hooks()
    from sglang.srt.mem_cache.common import release_kv_cache
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.model_executor.model_runner import Batch, ModelRunner
    if sys.argv[2] == "torch":
        import torch
        new = lambda shape: torch.zeros(shape, dtype=torch.bfloat16)
    else:
        import numpy as np
        new = lambda shape: np.zeros(shape, np.float32)
    runner = ModelRunner(new)
    for op in json.loads(sys.argv[1]):
        if op[0] == "fwd":
            _, mode, rids, slots, extend, extra = op
            assert runner.forward(Batch(mode, rids, slots, extend), extra=extra) == "output"
            print("wrote", runner.slots_written)
        elif op[0] == "release":
            release_kv_cache(type("Req", (), {"rid": op[1]})(), None)
        else:
            print("flush", Scheduler().flush_cache())
"""


def _tree(tmp_path):
    for name, text in FAKE.items():
        p = tmp_path / "fake" / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text))
    return tmp_path / "fake"


def _drive(tmp_path, plan, *, array="numpy", env=None):
    full = {k: v for k, v in os.environ.items() if not k.startswith("KVCONV_") and k != "CUDA_INJECTION64_PATH"}
    full |= {"PYTHONPATH": f"{_tree(tmp_path)}{os.pathsep}{ROOT}", "KVCONV_ENGINE": "sglang",
             "KVCONV_PROBE_OUTPUT": str(tmp_path / "p.kvdump")} | (env or {})
    return subprocess.run([sys.executable, "-c", textwrap.dedent(DRIVE), json.dumps(plan), array],
                          capture_output=True, text=True, env=full, cwd=tmp_path, timeout=120)


def _plan(c_slots, extra=()):
    """a (3 prompt tokens) and b (2) prefill, decode twice, a finishes and is released, c (2) prefills at
    ``c_slots``, b and c decode (``extra``: slots that decode also writes), then the harness's flush_cache."""
    return [["fwd", "extend", ["a", "b"], [1, 2, 3, 4, 5], [3, 2], []],
            ["fwd", "decode", ["a", "b"], [6, 7], None, []],
            ["fwd", "decode", ["a", "b"], [8, 9], None, []],
            ["release", "a"],
            ["fwd", "extend", ["b", "c"], [10, *c_slots], [1, 2], []],
            ["fwd", "decode", ["b", "c"], [11, 12], None, list(extra)],
            ["flush"]]


# ---- the entry point ----

def test_the_entry_point_resolves_and_is_inert_without_kvconv_engine(tmp_path):
    code = """
        import sys
        from importlib.metadata import entry_points
        (ep,) = [e for e in entry_points(group="sglang.srt.plugins") if e.name == "kvconv"]
        ep.load()()
        print(ep.value, sorted(m for m in sys.modules if m.split(".")[0] in ("numpy", "torch", "sglang")))
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVCONV_")}
    env["PYTHONPATH"] = f"{_tree(tmp_path)}{os.pathsep}{ROOT}"
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env,
                       cwd=ROOT, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["kvconv.capture.engines.sglang:register", "[]"]


def test_without_sglangs_hook_registry_it_says_so_and_records_nothing(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVCONV_")} | {"KVCONV_ENGINE": "sglang"}
    p = subprocess.run([sys.executable, "-c", "from kvconv.capture.engines import sglang; sglang.register()"],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert p.returncode == 0 and "SGLang's plugin hooks (0.5.12 or later) are needed; nothing is recorded" in p.stderr


# ---- the rows ----

def test_token_counts_of_decode_and_extend_batches():
    assert token_counts(decode=True, batch_size=3, num_tokens=3) == [1, 1, 1]
    assert token_counts(decode=False, batch_size=2, num_tokens=7, extend_lens=[5, 2]) == [5, 2]
    with pytest.raises(ValueError, match="extend lengths sum to 6, out_cache_loc holds 7"):
        token_counts(decode=False, batch_size=2, num_tokens=7, extend_lens=[4, 2])
    with pytest.raises(ValueError, match="7 tokens do not split over 2 requests"):
        token_counts(decode=True, batch_size=2, num_tokens=7)


def test_graph_rows_pick_the_smallest_captured_size_as_sglang_pads():
    assert [graph_rows([8, 1, 4, 2], b) for b in (1, 2, 3, 5, 8)] == [1, 2, 4, 8, 8]
    assert graph_rows([1, 2, 4], 3, tokens_per_bs=4) == 16
    with pytest.raises(ValueError, match="batch 9 is larger than every captured size"):
        graph_rows([1, 2, 4, 8], 9)


def test_step_rows_number_requests_and_send_pads_to_the_dummy_slot():
    ids = {"x": 1}
    slots, reqs, pads = step_rows(np.array([12, 4, 5]), ["y", "x"], [1, 2], 4, ids)
    assert slots.tolist() == [12, 4, 5, 0] and reqs.tolist() == [2, 1, 1, 0] and pads.tolist() == [0, 0, 0, 1]
    assert ids == {"x": 1, "y": 2}
    with pytest.raises(ValueError, match="3 tokens do not fit in 2 rows"):
        step_rows([1, 2, 3], ["x"], [3], 2, {})


def test_padded_rows_follow_the_graph_runners_sglang_would_replay():
    from sglang_fakes import ForwardMode

    from kvconv.capture.engines.sglang import _Session

    class Runs:
        def __init__(self, ok, **kw):
            self.__dict__.update(kw, ok=ok)

        def can_run(self, fb):
            return self.ok

    runner = type("R", (), {"graph_runner": Runs(True, capture_bs=[1, 2, 4], num_tokens_per_bs=1),
                            "piecewise_cuda_graph_runner": Runs(True, capture_num_tokens=[4, 8, 16])})()
    s = _Session(runner)
    batch = type("B", (), {"forward_mode": ForwardMode("decode"), "batch_size": 3})()
    assert s.padded_rows(batch, 3) == 4
    batch.forward_mode = ForwardMode("extend")
    assert s.padded_rows(batch, 5) == 8  # a piecewise prefill replay pads tokens to a captured count
    runner.piecewise_cuda_graph_runner.ok = runner.graph_runner.ok = False
    assert s.padded_rows(batch, 5) == 5
    batch.forward_mode = ForwardMode("decode")
    assert s.padded_rows(batch, 3) == 3  # an eager decode: no pad row


def test_pool_caches_and_page_views_follow_the_engines_pages():
    k = [np.zeros((9, 2, 4), np.float32) for _ in range(2)]
    caches = pool_caches(k, [np.zeros((9, 2, 4), np.float32) for _ in range(2)], 3, start_layer=10)
    assert [(n, v.shape) for n, v in caches] == [(f"L{i}.{p}", (3, 3, 2, 4)) for i in (10, 11) for p in "kv"]
    assert page_view(k[0], 4).shape == (2, 32)  # the whole pages: slot 8 is in none
    with pytest.raises(RuntimeError, match="an MHA pool is covered"):
        pool_caches(None, None, 1)
    with pytest.raises(RuntimeError, match="layer 0 k: 9 slots, page 2"):
        pool_caches(k[:1], k[:1], 2)


# ---- runs through the hooks, judged by kvconv validate ----

def test_a_run_through_the_hooks_writes_its_mapping_and_releases(tmp_path):
    from kvconv.format import dump

    p = _drive(tmp_path, _plan([1, 2]))  # c takes a's slots once a was released: clean
    assert p.returncode == 0, p.stderr
    assert "flush True" in p.stdout and "probe dump written" in p.stderr and "(5 steps)" in p.stderr
    with dump.open(tmp_path / "p.kvdump") as d:
        meta, steps, rows = d.metadata(), d.records("write_step"), d.records("slot_map")
    assert (meta["engine"], meta["sglang_version"], meta["page_size"], meta["request_ids"]) == \
        ("sglang", "0.5.12-standin", 1, {"1": "a", "2": "b", "3": "c"})
    assert steps["step"].tolist() == [0, 1, 2, 2, 3, 4]  # the release is recorded at the last step before it
    first, count = int(steps["map_first"][4]), int(steps["map_count"][4])  # step 3: b's decode token, c's prefill
    assert rows["slot"][first:first + count].tolist() == [10, 1, 2]
    assert rows["request_id"][first:first + count].tolist() == [2, 3, 3]
    decode = int(steps["map_first"][1])  # step 1: a 2-request decode in the size-2 graph: no pad
    assert rows["slot"][decode:decode + 2].tolist() == [6, 7]
    r = run_cli("validate", "p.kvdump", "--json", cwd=tmp_path)
    res = json.loads(r.stdout)["dumps"][0]["result"]
    assert r.returncode == 4 and res["errors"] == 0, r.stdout  # ownership clean; no tracer: nothing else checked


def test_a_slot_handed_to_a_new_request_while_its_owner_runs_is_found(tmp_path):
    p = _drive(tmp_path, _plan([4, 13]))  # slot 4 is b's (its first prompt token), b still decodes
    assert p.returncode == 0, p.stderr
    r = run_cli("validate", "p.kvdump", cwd=tmp_path)
    assert r.returncode == 1 and "writes-live-overwrite" in r.stdout, r.stdout
    assert "step 3: request 3's token mapped to slot 4, which holds request 2's token from step 0" in r.stdout


def test_a_probe_output_with_pct_p_names_the_scheduler(tmp_path):
    p = _drive(tmp_path, _plan([1, 2]), env={"KVCONV_PROBE_OUTPUT": str(tmp_path / "p-%p.kvdump")})
    assert p.returncode == 0, p.stderr
    (dump_path,) = tmp_path.glob("p-*.kvdump")
    assert dump_path.name[2:-7].isdigit() and f"probe dump written: {dump_path}" in p.stderr


def test_pad_rows_of_a_padded_replay_are_mapped_to_slot_zero(tmp_path):
    from kvconv.format import dump

    plan = [["fwd", "extend", ["a", "b", "c"], [1, 2, 3], [1, 1, 1], []],
            ["fwd", "decode", ["a", "b", "c"], [4, 5, 6], None, []], ["flush"]]
    assert _drive(tmp_path, plan).returncode == 0
    with dump.open(tmp_path / "p.kvdump") as d:
        steps, rows = d.records("write_step"), d.records("slot_map")
    first, count = int(steps["map_first"][1]), int(steps["map_count"][1])
    assert rows["slot"][first:first + count].tolist() == [4, 5, 6, 0]
    assert (rows["flags"][first:first + count] != 0).tolist() == [False, False, False, True]


def test_the_loc_shift_plant_moves_the_graphs_slot_after_the_plugin_read_the_engines(tmp_path):
    from kvconv.format import dump

    env = {"PYTHONPATH": f"{PLANTS}{os.pathsep}{_tree(tmp_path)}{os.pathsep}{ROOT}", "KVCONV_PLANT": "loc-shift",
           "KVCONV_PLANT_STEP": "2"}
    p = _drive(tmp_path, _plan([1, 2]), env=env)
    assert p.returncode == 0, p.stderr
    # step 2 is the first decode at or after step 2: a and b at slots 8 and 9, row 0 moved by the batch's 2 tokens
    assert "kvconv plant loc-shift: step 2: request 'a' (kvconv request 1) (batch row 0): slot 8 -> 10 in the " \
           "graph's out_cache_loc, every layer" in p.stderr
    assert p.stdout.splitlines()[2] == "wrote [10, 9]"
    with dump.open(tmp_path / "p.kvdump") as d:
        steps, rows = d.records("write_step"), d.records("slot_map")
    first = int(steps["map_first"][2])
    assert (int(steps["step"][2]), rows["slot"][first:first + 2].tolist()) == (2, [8, 9])  # the engine's intent


def test_an_error_in_the_plugin_stops_the_probe_not_the_engine(tmp_path):
    plan = [["fwd", "extend", ["a"], [1, 2], [3], []], ["fwd", "decode", ["a"], [3], None, []], ["flush"]]
    p = _drive(tmp_path, plan)  # extend lengths (3) that do not match out_cache_loc (2)
    assert p.returncode == 0, p.stderr
    assert "recording step 0: ValueError: extend lengths sum to 3, out_cache_loc holds 2" in p.stderr
    from kvconv.format import dump

    with dump.open(tmp_path / "p.kvdump") as d:
        assert d.metadata()["plugin_errors"] == ["recording step 0: ValueError: extend lengths sum to 3, "
                                                 "out_cache_loc holds 2"]


def test_location_canary_on_the_pool_finds_a_page_outside_the_steps_set(tmp_path):
    pytest.importorskip("torch")
    clean = _drive(tmp_path, _plan([1, 2]), array="torch", env={"KVCONV_CANARY": "1"})
    assert clean.returncode == 0, clean.stderr
    assert run_cli("canary", "p.kvdump", cwd=tmp_path).returncode == 0
    planted = _drive(tmp_path, _plan([1, 2], extra=[20]), array="torch", env={"KVCONV_CANARY": "1"})
    assert planted.returncode == 0, planted.stderr
    r = run_cli("canary", "p.kvdump", cwd=tmp_path)
    assert r.returncode == 1 and "canary-unexpected-write" in r.stdout, r.stdout
    assert "step 4" in r.stdout and "'L0.k'" in r.stdout and "changed outside the expected set: page 20" in r.stdout


# ---- the harness (native/workloads): the plants' start-up and the seed script's options, no SGLang needed ----

PLANTS = os.path.join(ROOT, "native", "workloads", "sglang_plants")
SEED = os.path.join(ROOT, "native", "workloads", "sglang_seed.py")


def test_plant_harness_arms_only_when_asked_and_runs_the_bundles_sitecustomize(tmp_path):
    nxt = tmp_path / "site"
    nxt.mkdir()
    (nxt / "sitecustomize.py").write_text("print('the bundle sitecustomize ran')\n")

    def start(plant):
        env = {k: v for k, v in os.environ.items() if not k.startswith("KVCONV_")}
        env |= {"PYTHONPATH": f"{PLANTS}{os.pathsep}{nxt}"} | ({"KVCONV_PLANT": plant} if plant else {})
        return subprocess.run([sys.executable, "-c", "import sys; print('kvconv.capture.engines._hooks' in "
                               "sys.modules)"], capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)

    armed = start("two-stream")
    assert armed.returncode == 0 and "kvconv plant two-stream: armed in process" in armed.stderr
    assert armed.stdout == "the bundle sitecustomize ran\nTrue\n"
    wrong = start("loc-shift-by-two")
    assert "unknown plant (one of loc-shift, freed-reuse, outside-write, two-stream)" in wrong.stderr
    quiet = start(None)
    assert quiet.stdout == "the bundle sitecustomize ran\nFalse\n" and quiet.stderr == ""


def test_seed_script_options_without_sglang():
    def seed(*args):
        return subprocess.run([sys.executable, SEED, *args], capture_output=True, text=True, timeout=120)

    r = seed("--help")
    for opt in ("--end", "--range", "--torch-profile", "--rounds", "--pool"):
        assert opt in r.stdout
    assert "--torch-profile times throughput rounds: give --requests" in seed("--torch-profile", "/tmp/p").stderr
    r = seed("--requests", "8", "--range", "profiler", "--torch-profile", "/tmp/p")
    assert r.returncode == 2 and "both use SGLang's one profiler" in r.stderr
    assert seed("--rounds", "0").returncode == 2


DRAIN = """
    import json, subprocess, sys, time
    sys.path.insert(0, sys.argv[1])
    import sglang_seed

    class Out:
        def __init__(self, ok):
            self.success = ok

    class Dog:
        stopped = False
        def stop(self):
            Dog.stopped = True

    class Engine:  # flush_cache fails while a batch is in flight, as Scheduler.flush_cache does
        calls = 0
        tokenizer_manager = type("TM", (), {"_subprocess_watchdog": Dog()})()
        def flush_cache(self):
            Engine.calls += 1
            return Out(Engine.calls >= 3)

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    t0 = time.monotonic()
    seen = sglang_seed.drain(Engine(), timeout_s=20)
    print(json.dumps(dict(seen, dog_stopped=Dog.stopped, s=round(time.monotonic() - t0, 1))))
"""


def test_drain_waits_for_idle_stops_the_watchdog_and_sigterms_the_children():
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(DRAIN), os.path.dirname(SEED)], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    seen = json.loads(p.stdout)
    assert (seen["idle_after_tries"], seen["idle"], seen["dog_stopped"]) == (3, True, True)
    ended = (seen["children"], seen["ended_by_sigterm"], seen["left_for_shutdown"], seen["exit_codes"])
    assert ended == (1, 1, 0, [-15])  # the child ended by SIGTERM (a tracer's handler finishes its dump there)
    assert seen["s"] < 10


def test_the_device_scripts_entry_points_find_both_plugins_in_the_checkout(tmp_path):
    """gpu_engines.sh declares the checkout's plugins without building kvconv's wheel: both engines' loaders find
    them through importlib.metadata, as vLLM's and SGLang's plugin loaders do."""
    script = os.path.join(ROOT, "native", "scripts", "gpu_engines.sh")
    env = dict(os.environ, KVPLUG=str(tmp_path / "kvplug"))
    subprocess.run(["bash", script, "plugin_entry_points"], check=True, env=env, timeout=60)
    code = ("from importlib.metadata import distributions\n"
            "d = [d for d in distributions(path=[sys.argv[1]])]\n"
            "print(d[0].metadata['Name'], sorted((e.group, e.value) for e in d[0].entry_points))\n"
            "[e.load() for e in d[0].entry_points]\n")
    p = subprocess.run([sys.executable, "-c", "import sys\n" + code, str(tmp_path / "kvplug")], capture_output=True,
                       text=True, cwd=ROOT, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == ("kvconv-engine-plugins [('sglang.srt.plugins', "
                                "'kvconv.capture.engines.sglang:register'), "
                                "('vllm.general_plugins', 'kvconv.capture.engines.vllm:register')]")
