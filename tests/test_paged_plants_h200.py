"""The planted paged-KV bugs recorded on the H200 (fixtures/h200-paged-plants, issue 29): each mechanism's check flags
its plant and only the checks that should, the clean run passes every check; through ``kvconv validate --json``."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from conftest import FIXTURES, run_cli

F = FIXTURES / "h200-paged-plants"

# (dump, exit, {error code: findings}); warnings are not asserted beyond "no other error"
CASES = [
    ("paged-clean.kvdump", 0, {}),
    ("paged-clean.trace.kvdump", 0, {}),
    ("paged-stale-k.kvdump", 1, {"canary-wrong-value": 8}),
    ("paged-stale-k.trace.kvdump", 0, {}),
    ("paged-live-twice.kvdump", 1, {"writes-live-overwrite": 4}),
    ("paged-live-twice.trace.kvdump", 1, {"writes-live-overwrite": 4}),
    ("paged-late-table.kvdump", 1, {"canary-unexpected-write": 4, "canary-missing-write": 4,
                                    "canary-value-not-written": 8}),
    ("paged-late-table.trace.kvdump", 1, {"writes-missing-slot": 8, "writes-unmapped-slot": 4,
                                          "writes-slot-conflict": 4}),
]


@pytest.mark.parametrize("name,code,errors", CASES, ids=[c[0] for c in CASES])
def test_each_plant_is_flagged_by_its_check_alone(name, code, errors):
    r = run_cli("validate", F / name, "--json")
    assert r.returncode == code, (r.stdout[-2000:], r.stderr)
    res = json.loads(r.stdout)["dumps"][0]["result"]
    found = Counter(f["code"] for f in res["findings"] if f["severity"] == "error")
    assert dict(found) == errors
    assert res["verdict"] == ("ok" if code == 0 else "failed")


def test_the_wrong_value_names_step_slot_request_and_row():
    r = run_cli("validate", F / "paged-stale-k.kvdump")
    assert r.returncode == 1
    line = next(ln for ln in r.stdout.splitlines() if "canary-wrong-value" in ln)
    assert "step 5" in line and "request 2's token at slot 5 (batch row 1)" in line and "in 2 of 4 caches" in line
