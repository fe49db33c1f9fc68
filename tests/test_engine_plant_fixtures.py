"""The plants prepared for the next H200 session, judged through the CLI once their dumps are committed as fixtures
(issue 40 item 3, issue 39 item 3): each test skips until its fixture exists, then holds the run to what the plant's
README says it must give. Names are those native/scripts/gpu_engines.sh writes (then zstd-compressed):

- fixtures/h200-sglang-0.5.12-plants/sglang-plant-<name>.pid<N>.kvdump.zst (the scheduler's tracer dump; the largest
  of the run) and sglang-plant-<name>.probe.kvdump.zst (the plugin's), for clean, loc-shift, freed-reuse,
  outside-write, two-stream;
- the vLLM plants of issue 39 and the published bugs' shapes of issue 50: tests/test_engine_vllm_fixtures.py
  (native/scripts/gpu_vllm50.sh runs them two processes at a time)."""

from __future__ import annotations

import json

import pytest

from conftest import FIXTURES, run_cli

SGLANG = FIXTURES / "h200-sglang-0.5.12-plants"

# plant -> (the dump that must show it, the error codes it must hold); sglang_plants/README.md's table
SGLANG_EXPECT = {
    "loc-shift": {"trace": {"writes-unmapped-slot", "writes-missing-slot"},
                  "probe": {"canary-unexpected-write", "canary-missing-write"}},
    "freed-reuse": {"probe": {"writes-live-overwrite"}},
    "outside-write": {"trace": {"writes-unmapped-slot"}, "probe": {"canary-unexpected-write"}},
    "two-stream": {"trace": {"writes-unmapped-slot"}, "probe": {"canary-unexpected-write"}},
}


def _sglang(name: str) -> dict:
    traces = sorted(SGLANG.glob(f"sglang-plant-{name}.pid*.kvdump.zst"), key=lambda p: p.stat().st_size)
    probe = SGLANG / f"sglang-plant-{name}.probe.kvdump.zst"
    if not traces or not probe.exists():
        pytest.skip(f"no fixture of the SGLang plant {name} yet (native/engines/README.md, the next device session)")
    return {"trace": traces[-1], "probe": probe}


def _judged(path) -> tuple[int, set[str]]:
    r = run_cli("validate", str(path), "--json")
    res = json.loads(r.stdout)["dumps"][0]
    codes = {f["code"] for f in res["result"].get("findings", []) if f["severity"] == "error"}
    return r.returncode, codes


def test_sglang_clean_plant_run_is_valid():
    dumps = _sglang("clean")
    for kind, path in dumps.items():
        code, errors = _judged(path)
        assert code == 0 and not errors, (kind, errors)


PLANTS = [(_sglang, SGLANG_EXPECT, p) for p in sorted(SGLANG_EXPECT)]


@pytest.mark.parametrize("dumps_of,expect,plant", PLANTS, ids=[f"{f.__name__[1:]}-{p}" for f, _, p in PLANTS])
def test_plant_is_caught(dumps_of, expect, plant):
    dumps = dumps_of(plant)
    for kind, codes in expect[plant].items():
        code, errors = _judged(dumps[kind])
        assert code == 1 and codes <= errors, (kind, errors)
