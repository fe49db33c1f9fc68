"""Issue 50's vLLM runs, judged through the CLI once native/scripts/gpu_vllm50.sh's outputs are committed as fixtures
(fixtures/vllm-0.26-issue50/; each test skips while its files are absent):

- ``vllm serve`` traced (``--writes --engine vllm --capture-range profiler``, ``KVCONV_VALUE=1``), ended by SIGINT
  to its process group and by SIGTERM to ``kvconv record``: ``serve-<sig>.kvdump.zst`` (the engine core's dump),
  ``serve-<sig>.probe.kvdump.zst`` (the plugin's), ``serve-<sig>.json`` (the driver's line): record exit 0, both
  dumps valid, every request served;
- ``plants``: one run.py process with the plants stale-block, double-alloc and wrong-value; ``bugs``: one with the
  shapes of vllm-project/vllm#38719 (dummy-slot-zero), #43810 (pad-index-write) and #45357 (stale-write), the
  location canary on and ``-k index_put_kernel_impl`` beside reshape_and_cache_flash_kernel. ``<run>.plants.txt``
  holds what each plant said it did (``kvconv plant NAME: ...`` on stderr): each test holds the canary's finding to
  that statement (the code, the request by its vLLM id through the probe dump's ``request_ids``, the slot or page).
  native/workloads/vllm_plants/README.md has the table of what each gives.
"""

from __future__ import annotations

import json
import re

import pytest

from conftest import FIXTURES, run_cli

RUNS = FIXTURES / "vllm-0.26-issue50"


def _files(run: str, *suffixes: str) -> list:
    paths = [RUNS / f"{run}{s}" for s in suffixes]
    missing = [p.name for p in paths if not p.exists()]
    if missing:
        pytest.skip(f"no fixture {', '.join(missing)} yet (native/engines/README.md, Device session of issue 50)")
    return paths


def _findings(path) -> tuple[int, list[dict]]:
    r = run_cli("validate", str(path), "--json")
    res = json.loads(r.stdout)["dumps"][0]
    return res["exit"], [f for f in res["result"].get("findings", []) if f["severity"] == "error"]


def _numbers(probe) -> dict[str, int]:
    """vLLM request id -> kvconv's request number, from the probe dump's metadata."""
    from kvconv.format import dump

    with dump.open(probe) as d:
        return {rid: int(n) for n, rid in d.metadata()["request_ids"].items()}


def _said(txt, plant: str, pattern: str) -> re.Match:
    for line in txt.read_text().splitlines():
        m = re.match(rf"kvconv plant [\w,-]*{plant}[\w,-]*: {pattern}", line)
        if m:
            return m
    pytest.fail(f"{txt.name}: the plant {plant} did not say it acted (no line matching {pattern!r})")


def _with(findings, code: str, *needles: str) -> list[dict]:
    return [f for f in findings if f["code"] == code and all(n in f["message"] for n in needles)]


@pytest.mark.parametrize("sig", ["sigint", "sigterm"])
def test_vllm_serve_ended_by_a_signal_is_complete_and_clean(sig):
    trace, probe, line = _files(f"serve-{sig}", ".kvdump.zst", ".probe.kvdump.zst", ".json")
    res = json.loads(line.read_text().splitlines()[-1])
    served = (res["exit"], res["killed"], res["requests_ok"], res["signal"])
    assert served == (0, False, res["requests"], sig[3:].upper()), res
    for path in (trace, probe):
        code, errors = _findings(path)
        assert code == 0 and not errors, (path.name, errors[:3])
    from kvconv.format import dump

    with dump.open(trace) as d:  # the range held the served requests' steps and their writes
        assert len(d.records("write_step")) > 0 and len(d.records("slot_write")) > 0


def test_stale_block_is_an_unmapped_write_by_the_request_it_names():
    trace, probe, txt = _files("plants", ".kvdump.zst", ".probe.kvdump.zst", ".plants.txt")
    m = _said(txt, "stale-block", r"step (\d+): request '([^']+)'")
    code, errors = _findings(trace)
    assert code == 1 and {"writes-unmapped-slot", "writes-missing-slot"} <= {f["code"] for f in errors}
    assert _with(errors, "writes-unmapped-slot", f"request {_numbers(probe)[m[2]]},"), errors[:3]


def test_double_alloc_is_a_live_overwrite_naming_both_requests():
    _, probe, txt = _files("plants", ".kvdump.zst", ".probe.kvdump.zst", ".plants.txt")
    m = _said(txt, "double-alloc", r"block (\d+), held by running request '([^']+)'.*handed to new request '([^']+)'")
    num = _numbers(probe)
    code, errors = _findings(probe)
    assert code == 1 and _with(errors, "writes-live-overwrite", f"request {num[m[3]]}'s token",
                               f"request {num[m[2]]}'s token"), errors[:3]


def test_wrong_value_is_found_in_its_layer_and_slot():
    _, probe, txt = _files("plants", ".kvdump.zst", ".probe.kvdump.zst", ".plants.txt")
    m = _said(txt, "wrong-value", r"step (\d+): layer (\d+): request '([^']+)'.*\(slot (\d+)\)")
    code, errors = _findings(probe)
    assert code == 1 and _with(errors, "canary-wrong-value", f"'L{m[2]}.kv'", f"slot {m[4]}"), errors[:3]


def test_dummy_slot_zero_38719_is_a_write_no_token_asked_for():
    trace, _, txt = _files("bugs", ".kvdump.zst", ".probe.kvdump.zst", ".plants.txt")
    _said(txt, "dummy-slot-zero", "the dummy slot mapping")
    code, errors = _findings(trace)
    assert code == 1 and _with(errors, "writes-unmapped-slot", "slot 0 ", "a padding row"), errors[:3]


def test_pad_index_write_43810_is_caught_by_the_location_canary_and_named_by_its_kernel():
    trace, probe, txt = _files("bugs", ".kvdump.zst", ".probe.kvdump.zst", ".plants.txt")
    m = _said(txt, "pad-index-write", r"layer (\d+): .* lands in slot (\d+) \(block (\d+), offset")
    code, errors = _findings(probe)
    assert code == 1 and _with(errors, "canary-unexpected-write", f"'L{m[1]}.kv'", m[3]), errors[:3]
    _, errors = _findings(trace)  # the second -k pattern names the writer
    assert _with(errors, "writes-unmapped-slot", "index_put_kernel_impl", f"slot {m[2]} "), errors[:3]


def test_stale_write_45357_lands_on_the_new_owner_and_is_found_there():
    trace, probe, txt = _files("bugs", ".kvdump.zst", ".probe.kvdump.zst", ".plants.txt")
    m = _said(txt, "stale-write", r"step (\d+): layer (\d+): block (\d+) of finished request '([^']+)'.*"
                                  r"now request '([^']+)'.*landed on slot (\d+)")
    code, errors = _findings(probe)
    assert code == 1 and _with(errors, "canary-wrong-value", f"'L{m[2]}.kv'", f"slot {m[6]}",
                               f"request {_numbers(probe)[m[5]]}"), errors[:3]
    _, errors = _findings(trace)
    assert _with(errors, "writes-slot-conflict", f"'L{m[2]}.kv' slot {m[6]} "), errors[:3]
