"""The committed GPU canary dumps (fixtures/canary-*/, from bench/canary_gpu.py on an H200): the canary names
exactly the planted pages, on every buffer, and nothing on the clean run."""

from __future__ import annotations

import json

import jsonschema
import pytest

from conftest import FIXTURES, ROOT
from kvconv.check import canary
from kvconv.format import dump

CASES = sorted(p.parent.name for p in FIXTURES.glob("canary-*/planted.json"))
SCHEMA = json.loads((ROOT / "schemas" / "canary.schema.json").read_text())


def test_the_three_cases_are_committed():
    assert CASES == ["canary-clean", "canary-pad-minus-one", "canary-stale-pad"]


@pytest.mark.parametrize("case", CASES)
def test_exactly_the_planted_pages(case):
    spec = json.loads((FIXTURES / case / "planted.json").read_text())
    with dump.open(FIXTURES / case / spec["dump"]) as d:
        meta = d.metadata()
        res = canary.check(d)
    assert meta["cuda_graph"] is True and meta["gpu"].startswith("NVIDIA")
    assert res.records == 12 * len(spec["buffers"]) == len(res.steps)
    planted = spec["planted_unexpected"]
    for s in res.steps:
        assert s["buffer"] in spec["buffers"]
        assert s["unexpected"] == planted.get(str(s["step"]), []), (s["step"], s["buffer"])
        assert s["missing"] == []
        assert s["excluded"] == [0] and s["slots_per_page"] == 256 and s["num_pages"] == 4096
        assert s["snapshot"] == ("checksum" if s["buffer"] == "L1.index_k_fp8" else "clone")
    flagged = {(f.record, f.code) for f in res.findings}
    want = {(s["record"], "canary-unexpected-write") for s in res.steps if str(s["step"]) in planted}
    assert flagged == want
    assert res.ok is (not planted)
    jsonschema.validate(res.to_dict(), SCHEMA)


def test_the_planted_shapes():
    stale = json.loads((FIXTURES / "canary-stale-pad" / "planted.json").read_text())["planted_unexpected"]
    neg = json.loads((FIXTURES / "canary-pad-minus-one" / "planted.json").read_text())["planted_unexpected"]
    odd = [str(i) for i in range(1, 12, 2)]
    assert sorted(stale) == sorted(odd) and all(len(v) == 3 for v in stale.values())  # requests 5-7's live pages
    assert neg == {k: [4095] for k in odd}  # slot -1 wraps to the buffer's last slot, in the last page
