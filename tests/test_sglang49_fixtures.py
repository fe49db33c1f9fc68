"""Issue 49's device runs (SGLang 0.5.17, native/scripts/gpu_sglang49.sh), judged through the CLI once their dumps are
committed: each test skips until its fixture exists, then holds the run to what issue 49 says it must give.

Layout, fixtures/h200-sglang-0.5.17/ (names as gpu_sglang49.sh writes them, each dump xz-compressed):

- ``script.pid<N>.kvdump.xz`` (+ ``script*.probe.kvdump.xz``): the user's plain ``Engine``/``shutdown`` script;
- ``server-int.*``, ``server-term.*``: ``launch_server`` ended by SIGINT / SIGTERM;
- ``plant-<name>.pid<N>.kvdump.xz`` and ``plant-<name>.probe.kvdump.xz`` for clean, loc-shift, freed-reuse,
  outside-write, two-stream (``--writes --engine sglang``, the location canary on).

The scheduler's dump is the run's largest tracer dump (the parent's and the detokenizer's hold no KV write)."""

from __future__ import annotations

import json

import pytest

from conftest import FIXTURES, run_cli

DIR = FIXTURES / "h200-sglang-0.5.17"
WRITE_CODES = {"writes-unmapped-slot", "writes-missing-slot", "writes-live-overwrite"}
# plant -> the write canary's error codes its scheduler dump must hold (sglang_plants/README.md, issue 49 item 2)
EXPECT = {
    "loc-shift": {"writes-unmapped-slot", "writes-missing-slot"},
    "freed-reuse": {"writes-live-overwrite"},
    "outside-write": {"writes-unmapped-slot"},
    "two-stream": {"writes-unmapped-slot"},
}
SANE = 64 << 20  # a finished dump of these runs: well under this (0.5.12's live dump reserved 2,163,344,688 bytes)


def _dumps(run: str) -> dict:
    traces = sorted(DIR.glob(f"{run}.pid*.kvdump.xz"), key=lambda p: p.stat().st_size)
    if not traces:
        pytest.skip(f"no fixture of the SGLang 0.5.17 run {run} yet (native/engines/README.md, issue 49's session)")
    return {"scheduler": traces[-1], "probes": sorted(DIR.glob(f"{run}*.probe.kvdump.xz")), "all": traces}


def _judged(path) -> tuple[int, dict, str]:
    r = run_cli("validate", str(path), "--json")
    return r.returncode, json.loads(r.stdout)["dumps"][0]["result"], run_cli("validate", str(path)).stdout


def _codes(res: dict, severity: str = "error") -> set[str]:
    found = res.get("incidents") or res.get("findings") or []
    return {f["code"] for f in found if f["severity"] == severity}


@pytest.mark.parametrize("run", ["script", "server-int", "server-term", "plant-clean"])
def test_a_users_clean_run_leaves_complete_valid_dumps_of_sane_size(run):
    dumps = _dumps(run)
    for path in dumps["all"] + dumps["probes"]:
        code, res, _ = _judged(path)
        assert code == 0 and not _codes(res), (path.name, _codes(res), _codes(res, "warning"))
        assert res.get("verdict") != "incomplete" and res.get("size", 0) < SANE, (path.name, res.get("size"))


@pytest.mark.parametrize("plant", sorted(EXPECT))
def test_each_plant_is_caught_by_the_write_canary_naming_the_request(plant):
    code, res, text = _judged(_dumps(f"plant-{plant}")["scheduler"])
    assert code == 1 and EXPECT[plant] <= _codes(res), (plant, _codes(res))
    assert "request" in text, text[-2000:]
