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


def test_arrow_tables_of_the_probe_read_by_other_readers(tmp_path):
    # Before: cache, write_step, slot_map and value_digest were not exported (and the cache's 32-byte name field made
    # the generic table path fail with an internal error once exported).
    import duckdb
    import polars as pl
    import pyarrow.dataset as ds

    out = tmp_path / "tables"
    r = run_cli("arrow", F / "paged-stale-k.kvdump", "-o", out, "-q")
    assert r.returncode == 0, r.stderr
    assert {"cache", "write_step", "slot_map", "value_digest"} <= {p.name for p in out.iterdir()}
    vd = ds.dataset(out / "value_digest", format="arrow", partitioning="hive").to_table()
    wrong = [e != a for e, a in zip(vd["expected"].to_pylist(), vd["actual"].to_pylist())]
    assert sum(wrong) == 8 and vd.num_rows > 8  # the 8 canary-wrong-value findings, among all digests
    cache = pl.read_ipc(next((out / "cache").rglob("*.arrow")))
    assert cache["name"].to_list() == ["L0.k", "L0.v", "L1.k", "L1.v"]
    con = duckdb.connect()
    con.register("vd", vd)
    assert con.execute("select count(*) from vd where expected <> actual and step = 5").fetchone() == (8,)


def test_arrow_schema_metadata_leaves_the_kernel_list_to_the_metadata_table(tmp_path):
    # Before: each file's schema carried the tracer's 1,551 loaded kernel names: 13 MB for a 508 KB dump.
    import pyarrow.ipc as ipc

    out = tmp_path / "tables"
    r = run_cli("arrow", F / "paged-live-twice.trace.kvdump", "-o", out, "-q")
    assert r.returncode == 0 and "verdict FAILED" in r.stderr, r.stderr  # written, the verdict said on stderr
    files = list(out.rglob("*.arrow"))
    assert files
    for f in files:
        meta = ipc.open_file(f).schema.metadata
        assert len(meta[b"kvconv.run_metadata"]) < 20_000 and b"loaded_kernels\"" not in meta[b"kvconv.run_metadata"]
    md = next((out / "metadata").rglob("*.arrow"))
    assert b"loaded_kernels" in ipc.open_file(md).read_all()["json"][0].as_py().encode()
    assert sum(f.stat().st_size for f in files) < 2_000_000


def test_canary_says_what_validate_says():
    # Before: `kvconv canary paged-stale-k.kvdump` said ok, exit 0 (its location canary was clean) while validate
    # said FAILED on the wrong values; on live-twice it said ok with no word of the live slot handed out twice.
    r = run_cli("canary", F / "paged-stale-k.kvdump")
    assert r.returncode == 1 and "canary-wrong-value: context 0 step 5" in r.stdout, (r.stdout, r.stderr)
    r = run_cli("canary", F / "paged-live-twice.kvdump")
    assert r.returncode == 0 and r.stdout.splitlines()[-1] == "ok"  # its own part: pages and values are clean
    assert r.stderr.count("\n") == 1 and "verdict FAILED" in r.stderr and "this part is clean" in r.stderr, r.stderr
    r = run_cli("canary", F / "paged-clean.kvdump")
    assert r.returncode == 0 and r.stderr == "", r.stderr
