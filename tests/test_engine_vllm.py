"""The vLLM plugin (kvconv.capture.engines.vllm, issue 39) where no GPU is: inert without KVCONV_ENGINE, declared as
vLLM's general plugin, its import hook, and the pure functions that turn the runner's per-step host arrays into the
write probe's rows, checked on hand-made steps and, through the real ``kvconv validate``, on a probe dump made from
them (a block handed out twice is found, the same run without it is clean). The runs on vLLM itself need a GPU and
vLLM: ``test_plants_on_vllm`` (marked gpu, skipped here; native/workloads/vllm_plants/README.md says how to run them
by hand)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from conftest import run_cli
from kvconv.capture.engines.vllm import BlockMirror, host_slots, page_order, probe_path, request_ids

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLANTS = os.path.join(ROOT, "native", "workloads", "vllm_plants")


def _python(code: str, env: dict) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if not k.startswith("KVCONV_")} | env
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=full,
                          cwd=ROOT, timeout=120)


INERT = """
    import sys, time
    t = time.perf_counter()
    from importlib.metadata import entry_points
    (ep,) = [e for e in entry_points(group="vllm.general_plugins") if e.name == "kvconv"]
    register = ep.load()
    register()
    from kvconv.capture.engines import _hooks
    heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("numpy", "torch", "vllm"))
    print(ep.value, heavy, _hooks._finder in sys.meta_path, sorted(_hooks._pending))
"""


def test_the_entry_point_resolves_and_is_inert_without_kvconv_engine():
    p = _python(INERT, {})
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["kvconv.capture.engines.vllm:register", "[]", "False", "[]"]


def test_with_kvconv_engine_it_waits_for_vllm_without_importing_it():
    p = _python(INERT, {"KVCONV_ENGINE": "vllm", "KVCONV_VALUE": "1"})
    assert p.returncode == 0, p.stderr
    ep, heavy, hooked, *pending = p.stdout.strip().split(maxsplit=3)
    assert (ep, heavy, hooked) == ("kvconv.capture.engines.vllm:register", "[]", "True")
    assert pending == ["['vllm.v1.attention.backends.flash_attn', 'vllm.v1.worker.gpu.block_table', "
                       "'vllm.v1.worker.gpu.cudagraph_utils', 'vllm.v1.worker.gpu.model_runner', "
                       "'vllm.v1.worker.gpu_model_runner']"]


def test_the_import_hook_runs_after_the_module_and_only_then(tmp_path):
    pkg = tmp_path / "fakeengine"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "runner.py").write_text("class Runner:\n    def step(self):\n        return 'engine'\n")
    code = """
        from kvconv.capture.engines._hooks import after_import
        seen = []
        def patch(mod):
            seen.append(mod.__name__)
            orig = mod.Runner.step
            mod.Runner.step = lambda self: "patched " + orig(self)
        after_import("fakeengine.runner", patch)
        print(seen)
        import fakeengine.runner
        print(seen, fakeengine.runner.Runner().step())
        import importlib; importlib.reload(fakeengine.runner)
        print(len(seen), fakeengine.runner.Runner().step())
        after_import("fakeengine.other", lambda mod: mod.Missing)
        import fakeengine.other
        print(fakeengine.other.VALUE)
    """
    (pkg / "other.py").write_text("VALUE = 'imported'\n")
    p = _python(code, {"PYTHONPATH": str(tmp_path)})
    assert p.returncode == 0, p.stderr
    # a reload is not patched again: the hook is spent once it ran; a patch that fails leaves the import whole
    assert p.stdout.splitlines() == ["[]", "['fakeengine.runner'] patched engine", "1 engine", "imported"]
    assert "kvconv: patching fakeengine.other failed (AttributeError: " in p.stderr


# ---- the rows: hand-made steps ----

def test_request_ids_number_requests_by_first_appearance_and_leave_pads_zero():
    ids: dict = {}
    assert request_ids(["r-b", "r-a"], [3, 1], 6, ids).tolist() == [1, 1, 1, 2, 0, 0]
    assert request_ids(["r-a", "r-c", "r-b"], [1, 1, 1], 4, ids).tolist() == [2, 3, 1, 0]
    assert ids == {"r-b": 1, "r-a": 2, "r-c": 3}
    with pytest.raises(ValueError, match="7 tokens do not fit in 6 rows"):
        request_ids(["x"], [7], 6, {})
    with pytest.raises(ValueError, match="2 requests, 1 token counts"):
        request_ids(["x", "y"], [1], 6, {})


def _table(rows: dict, width: int = 8) -> np.ndarray:
    m = BlockMirror(4, width)
    for row, blocks in rows.items():
        m.append(row, 0, blocks)
    return m.table


def test_host_slots_prefill_and_decode_with_cuda_graph_pads():
    table = _table({0: [3, 4], 2: [7]})
    # a mixed step: row 0 (request row 2) decodes at position 3, row 1 (request row 0) prefills 6 tokens
    got = host_slots(table, [2, 0], [3, 0], [1, 6], 4, 10)
    assert got.tolist() == [31, 12, 13, 14, 15, 16, 17, -1, -1, -1]
    # a decode step padded to a captured size of 4: positions 6 and 4 cross into the second block of each
    table2 = _table({0: [3, 4], 2: [7, 9]})
    assert host_slots(table2, [0, 2], [6, 4], [1, 1], 4, 4).tolist() == [18, 36, -1, -1]


def test_host_slots_tell_a_stale_table_apart():
    """A failing case: the table without the appended block (what a stale device row reads) gives other rows."""
    right = host_slots(_table({2: [7, 9]}), [2], [4], [1], 4, 2)
    stale = host_slots(_table({2: [7, 5]}), [2], [4], [1], 4, 2)
    assert right.tolist() == [36, -1] and stale.tolist() == [20, -1] and (right != stale).any()
    with pytest.raises(ValueError, match="past the block table's 2 blocks"):
        host_slots(_table({0: [1, 2]}, width=2), [0], [8], [1], 4, 1)


def test_block_mirror_appends_where_the_runner_says():
    m = BlockMirror(2, 6)
    m.append(1, 0, [5, 6])
    m.append(1, 2, [9])  # a running request's new block (append_block_ids with overwrite=False: start 2)
    m.append(1, 0, [8])  # a new request in the same row (overwrite=True: start 0); entries past it stay
    assert m.table[1].tolist() == [8, 6, 9, 0, 0, 0] and not m.table[0].any()


def _strides(a: np.ndarray) -> tuple:
    return tuple(s // a.itemsize for s in a.strides)


def test_page_order_finds_flash_attention_slots_as_rows():
    # FlashAttention (0.26.0): logical (blocks, heads, block_size, 2 * head_size), NHD memory (blocks, block_size,
    # heads, 2 * head_size): a permutation of the logical view
    nhd = np.zeros((5, 16, 2, 8), np.float16).transpose(0, 2, 1, 3)
    order = page_order(nhd.shape, _strides(nhd), 16)
    assert order == (0, 2, 1, 3) and nhd.transpose(order).flags.c_contiguous
    one_head = np.zeros((5, 16, 1, 8), np.float16).transpose(0, 2, 1, 3)
    order = page_order(one_head.shape, _strides(one_head), 16)
    assert order is not None and one_head.transpose(order).shape[:2] == (5, 16)
    hnd = np.zeros((5, 2, 16, 8), np.float16)  # HND: a slot's heads lie block_size rows apart
    assert page_order(hnd.shape, _strides(hnd), 16) is None
    padded = np.zeros((5, 16 * 2 * 8 + 8), np.float16)[:, :256].reshape(5, 16, 2, 8)  # pages with a gap
    assert page_order(padded.shape, _strides(padded), 16) is None


def test_probe_path_sits_beside_the_tracer_dump():
    assert probe_path("/r/run.kvdump", 7) == "/r/run.vllm-7.probe.kvdump"
    assert probe_path("/r/kvconv-%p.kvdump", 7) == "/r/kvconv-7.vllm-7.probe.kvdump"


# ---- the rows through the write probe and kvconv validate ----

def _run(path, c_blocks) -> None:
    """Four steps as the V2 runner sees them (block size 4): a (6-token prompt) and b (3) prefill, both decode
    twice (b's fifth token in a new block), a finishes and is released, c (5 tokens) takes a's request row with
    ``c_blocks``; the plugin's functions make the rows, the write probe records them."""
    from kvconv.capture.probe import CanaryRecorder
    from kvconv.capture.probe.writes import WriteProbe

    mirror, ids = BlockMirror(4, 8), {}
    with pytest.warns(UserWarning, match="no tracer"):
        probe = WriteProbe(mirror=CanaryRecorder(path, metadata={"producer": "test_engine_vllm"}))
    mirror.append(0, 0, [3, 4])
    mirror.append(1, 0, [7])
    steps = [(["a", "b"], [0, 1], [0, 0], [6, 3], 10), (["a", "b"], [0, 1], [6, 3], [1, 1], 4)]
    for k, (req, rows, done, sched, padded) in enumerate(steps):
        with probe.step(k, host_slots(mirror.table, rows, done, sched, 4, padded), request_ids(req, sched, padded,
                                                                                                ids)):
            pass
    mirror.append(1, 1, [9])
    with probe.step(2, host_slots(mirror.table, [0, 1], [7, 4], [1, 1], 4, 4), request_ids(["a", "b"], [1, 1], 4,
                                                                                            ids)):
        pass
    probe.release([ids["a"]])  # finished_req_ids of the next scheduler output
    mirror.append(0, 0, c_blocks)
    slots = host_slots(mirror.table, [1, 0], [5, 0], [1, 5], 4, 8)
    with probe.step(3, slots, request_ids(["b", "c"], [1, 5], 8, ids)):
        pass
    probe.mirror.close()


def test_reused_blocks_after_a_release_are_clean(tmp_path):
    _run(tmp_path / "clean.kvdump", [4, 3])  # a's blocks, given back
    r = run_cli("validate", "clean.kvdump", "--json", cwd=tmp_path)
    res = json.loads(r.stdout)["dumps"][0]["result"]
    # the ownership check found nothing; with no tracer writes and no value records nothing else was checked (4)
    assert r.returncode == 4 and res["errors"] == 0, r.stdout
    assert {f["code"] for f in res["findings"]} == {"writes-nothing-checked", "coverage-none"}


def test_a_block_handed_out_twice_is_found(tmp_path):
    _run(tmp_path / "double.kvdump", [7, 3])  # b's first block, b still running
    r = run_cli("validate", "double.kvdump", cwd=tmp_path)
    assert r.returncode == 1, r.stdout
    assert "writes-live-overwrite" in r.stdout
    assert "step 3: request 3's token mapped to slot 28, which holds request 2's token from step 0" in r.stdout


# ---- on vLLM (GPU) ----

EXPECT = {  # plant -> (the dump that shows it, findings it must hold); the clean run: exit 0 on both
    "slot-off-by-one": ("trace", {"writes-missing-slot", "writes-unmapped-slot"}),
    "stale-block": ("trace", {"writes-missing-slot", "writes-unmapped-slot"}),
    "double-alloc": ("probe", {"writes-live-overwrite"}),
    "skip-layer": ("trace", {"writes-missing-slot"}),
    "wrong-value": ("probe", {"canary-wrong-value"}),
    # issue 50: the published bugs' shapes (vllm_plants/README.md)
    "dummy-slot-zero": ("trace", {"writes-unmapped-slot"}),
    "pad-index-write": ("probe", {"canary-unexpected-write"}),
    "stale-write": ("probe", {"canary-wrong-value"}),
}


@pytest.mark.gpu
@pytest.mark.parametrize("plant", ["clean", *EXPECT])
def test_plants_on_vllm(plant, tmp_path):
    """``KVCONV_VLLM_MODEL`` names a dense Qwen3; vLLM 0.26.0 and the built tracer are needed."""
    pytest.importorskip("vllm")
    model = os.environ.get("KVCONV_VLLM_MODEL") or pytest.skip("KVCONV_VLLM_MODEL is not set")
    env = {"KVCONV_ENGINE": "vllm", "KVCONV_VALUE": "1", "KVCONV_CANARY": "1", "PYTHONPATH": PLANTS}
    if plant != "clean":
        env["KVCONV_PLANT"] = plant
    r = run_cli("record", "--writes", "--no-validate", "-o", "t-%p.kvdump", "--", sys.executable,
                os.path.join(PLANTS, "run.py"), "--model", model, "--probe-out", "p.kvdump", cwd=tmp_path,
                env=env, subprocess_=True, timeout=900)
    assert r.returncode == 0, r.stderr[-4000:]
    found = {"trace": (0, set()), "probe": (0, set())}  # per kind: worst exit of a checked dump, error codes
    for path in sorted(p.name for p in tmp_path.glob("*.kvdump")):
        res = json.loads(run_cli("validate", path, "--json", cwd=tmp_path).stdout)["dumps"][0]
        which = "probe" if path == "p.kvdump" else "trace"
        codes = {f["code"] for f in res["result"].get("findings", []) if f["severity"] == "error"}
        worst = max(found[which][0], res["exit"] if res["exit"] != 4 else 0)  # 4: a process that wrote no cache
        found[which] = (worst, found[which][1] | codes)
    if plant == "clean":
        assert found == {"trace": (0, set()), "probe": (0, set())}, found
    else:
        which, codes = EXPECT[plant]
        assert found[which][0] == 1 and codes <= found[which][1], found
        assert f"kvconv plant {plant}: " in r.stderr


# ---- the session on CPU torch tensors shaped as vLLM 0.26.0's (skipped without torch) ----

class _Runner:
    """What the plugin reads of vLLM's V2 GPUModelRunner after initialize_kv_cache, with CPU tensors in vLLM's
    FlashAttention layout: per layer logical (blocks, heads, block_size, 2 * head_size), NHD in memory."""

    def __init__(self, torch, layers=2, blocks=8, heads=2, head=4, bs=4):
        self.kv_caches = [torch.zeros(blocks, bs, heads, 2 * head, dtype=torch.bfloat16).permute(0, 2, 1, 3)
                          for _ in range(layers)]
        self.kv_cache_config = type("C", (), {"kv_cache_groups": [object()]})()
        self.kernel_block_sizes, self.dcp_size, self.pcp_manager = [bs], 1, None
        self.block_tables = type("B", (), {})()
        self.block_tables._kvconv_mirror = BlockMirror(4, 8)


def _write_cache(kv, slots, key, value):
    """reshape_and_cache_flash on the CPU: token t's K and V into slot slots[t] (pads, -1, skipped)."""
    bs, d = kv.shape[2], key.shape[-1]
    for t, s in enumerate(slots.tolist()):
        if s >= 0:
            kv[s // bs, :, s % bs, :d] = key[t]
            kv[s // bs, :, s % bs, d:] = value[t]


def _session_run(tmp_path, monkeypatch, *, wrong: bool):
    torch = pytest.importorskip("torch")
    from kvconv.capture.engines import vllm as plugin

    monkeypatch.setenv("KVCONV_VALUE", "1")
    monkeypatch.setenv("KVCONV_PROBE_OUTPUT", str(tmp_path / "p.kvdump"))
    monkeypatch.delenv("CUDA_INJECTION64_PATH", raising=False)
    runner = _Runner(torch)
    s = plugin._Session(runner)
    s.attach()
    runner.block_tables._kvconv_mirror.append(0, 0, [2, 5])
    batch = type("Batch", (), dict(num_tokens_after_padding=8, num_tokens=6, req_ids=["r1"],
                                   num_scheduled_tokens=np.array([6]), idx_mapping_np=np.array([0]),
                                   num_computed_tokens_np=np.array([0])))()
    s.begin(batch)
    gen = torch.Generator().manual_seed(0)
    slots = host_slots(runner.block_tables._kvconv_mirror.table, [0], [0], [6], 4, 8)
    for i, kv in enumerate(runner.kv_caches):
        key, value = (torch.randn(8, 2, 4, generator=gen).to(torch.bfloat16) for _ in range(2))
        plugin.guarded(s, "rows", s.expect, kv, key, value)
        written = key.clone()
        if wrong and i == 1:
            written[3] = written[3] * 2 + 1
        _write_cache(kv, slots, written, value)
    s.end()
    s.close()
    return run_cli("validate", "p.kvdump", cwd=tmp_path)


def test_session_values_of_the_flash_attention_layout_are_clean(tmp_path, monkeypatch):
    from kvconv.format import dump

    r = _session_run(tmp_path, monkeypatch, wrong=False)
    assert r.returncode == 0, r.stdout
    with dump.open(tmp_path / "p.kvdump") as d:
        meta = d.metadata()
        caches = d.records("cache")
    assert (meta["runner"], meta["mapping"], meta["block_size"], meta["request_ids"]) == ("v2", "host", 4, {"1": "r1"})
    # one cache per layer, a slot = heads * 2 * head_size bf16 (K and V of a head side by side)
    assert [c["name"].rstrip(b"\0").decode() for c in caches] == ["L0.kv", "L1.kv"]
    assert caches["slot_bytes"].tolist() == [2 * 2 * 4 * 2] * 2 and caches["page_size"].tolist() == [4, 4]


def test_session_finds_a_wrong_value_in_the_right_slot(tmp_path, monkeypatch):
    r = _session_run(tmp_path, monkeypatch, wrong=True)
    assert r.returncode == 1 and "canary-wrong-value" in r.stdout, r.stdout
    assert "step 0" in r.stdout and "'L1.kv'" in r.stdout and "slot 11" in r.stdout and "request 1" in r.stdout


def test_session_error_stops_the_probe_not_the_engine(tmp_path, monkeypatch, capsys):
    torch = pytest.importorskip("torch")
    from kvconv.capture.engines import vllm as plugin
    from kvconv.format import dump

    monkeypatch.setenv("KVCONV_VALUE", "1")
    monkeypatch.setenv("KVCONV_PROBE_OUTPUT", str(tmp_path / "p.kvdump"))
    runner = _Runner(torch)
    s = plugin._Session(runner)
    s.attach()
    runner.block_tables._kvconv_mirror.append(0, 0, [1])
    batch = type("Batch", (), dict(num_tokens_after_padding=1, num_tokens=1, req_ids=["r1"],
                                   num_scheduled_tokens=np.array([1]), idx_mapping_np=np.array([0]),
                                   num_computed_tokens_np=np.array([0])))()
    s.begin(batch)
    flat = torch.zeros(1, 8, dtype=torch.bfloat16)  # K/V not [tokens, heads, head_size]
    with pytest.warns(RuntimeWarning, match="handing over"):
        plugin.guarded(s, "handing over the K/V rows", s.expect, runner.kv_caches[0], flat, flat)
    plugin.guarded(s, "later", s.begin, batch)  # stopped: nothing more is tried
    assert s.broken and "recording stops, the engine goes on" in capsys.readouterr().err
    with dump.open(tmp_path / "p.kvdump") as d:
        assert d.metadata()["plugin_errors"] == ["handing over the K/V rows: RuntimeError: K (1, 8), V (1, 8): "
                                                 "[tokens, heads, head_size] expected"]


def test_plant_harness_arms_in_any_python_process_only_when_asked():
    armed = _python("pass", {"KVCONV_PLANT": "skip-layer", "PYTHONPATH": PLANTS})
    assert armed.returncode == 0 and "kvconv plant skip-layer: armed in process" in armed.stderr
    wrong = _python("pass", {"KVCONV_PLANT": "off-by-two", "PYTHONPATH": PLANTS})
    assert wrong.returncode == 0 and "unknown plant (one of slot-off-by-one, stale-block" in wrong.stderr
    quiet = _python("import sys; print('kvconv.capture.engines._hooks' in sys.modules)", {"PYTHONPATH": PLANTS})
    assert quiet.returncode == 0 and quiet.stdout == "False\n" and quiet.stderr == ""


# ---- on vLLM's own modules where vLLM is installed (no GPU needed; skipped without vllm) ----

def test_patches_reach_vllms_classes():
    pytest.importorskip("vllm")
    code = """
        from kvconv.capture.engines import vllm as plugin
        plugin.register()
        import vllm.v1.worker.gpu.block_table as bt, vllm.v1.worker.gpu.model_runner as mr
        import vllm.v1.attention.backends.flash_attn as fa
        runner = [getattr(mr.GPUModelRunner, n) for n in ("initialize_kv_cache", "prepare_attn", "execute_model",
                                                         "shutdown")]
        done = runner + [mr.dispatch_cg_and_sync_dp, bt.BlockTables.append_block_ids,
                         fa.FlashAttentionImpl.do_kv_cache_update]
        print([getattr(f, "_kvconv", False) for f in done])
    """
    p = _python(code, {"KVCONV_ENGINE": "vllm", "KVCONV_VALUE": "1"})
    assert p.returncode == 0 and p.stdout.splitlines()[-1] == str([True] * 7), p.stderr[-3000:]


DOUBLE = """
    import torch
    from vllm.sampling_params import SamplingParams
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.request import Request

    spec = FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=8, dtype=torch.bfloat16)
    cfg = KVCacheConfig(num_blocks=32, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["l.0"], spec)])
    m = KVCacheManager(cfg, max_model_len=64, scheduler_block_size=4, hash_block_size=4, enable_caching=False)
    reqs = [Request(f"req-{i}", list(range(9)), SamplingParams(max_tokens=10 * i), None) for i in range(1, 6)]
    for r in reqs[:4]:
        m.allocate_slots(r, 9)
        r.num_computed_tokens = 9
    m.allocate_slots(reqs[4], 9)
    ids = {r.request_id: m.get_block_ids(r.request_id)[0] for r in reqs}
    print(ids["req-4"][0] == ids["req-5"][0], m.block_pool.blocks[ids["req-4"][0]].ref_cnt)
"""


def test_double_alloc_plant_on_vllms_block_pool():
    """The plant hands the fifth new request the first block of the running request with most tokens to go."""
    pytest.importorskip("vllm")
    p = _python(DOUBLE, {"KVCONV_PLANT": "double-alloc", "PYTHONPATH": PLANTS})
    assert p.returncode == 0 and p.stdout.splitlines()[-1] == "True 2", p.stderr[-3000:]
    assert "kvconv plant double-alloc: block " in p.stderr and "held by running request 'req-4'" in p.stderr
    clean = _python(DOUBLE, {"PYTHONPATH": PLANTS})
    assert clean.returncode == 0 and clean.stdout.splitlines()[-1] == "False 1", clean.stderr[-3000:]
