"""The canary checker (kvconv/check/canary/), the record writer (kvconv/capture/probe/writer.py) and `kvconv canary`."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import jsonschema
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import ROOT, run_cli
from kvconv.capture.probe.writer import CanaryRecorder
from kvconv.check import canary
from kvconv.check.canary import _json
from kvconv.format import dump, layout

SCHEMA = json.loads((ROOT / "schemas" / "canary.schema.json").read_text())
GEOM = dict(num_pages=64, page_size=64, compression=4)


def write(path, steps, **kw):
    with CanaryRecorder(path, **kw) as rec:
        for s in steps:
            rec.add(**{**GEOM, "buffer_id": 0, "name": "L0.index_k", "host_ns": 100 + s["step"], **s})
    return path


def check(path, **opts):
    with dump.open(path) as d:
        return canary.check(d, options=canary.CanaryOptions(**opts))


def result_json(r):
    """The canary report in ``kvconv canary --json`` (inside the CLI's envelope), checked against its schema."""
    env = json.loads(r.stdout)
    (entry,) = env["dumps"]
    assert env["exit"] == entry["exit"] == r.returncode and env["ok"] is entry["ok"] is (r.returncode == 0)
    jsonschema.validate(entry["result"], SCHEMA)
    return entry["result"]


def codes(res):
    return sorted(f.code for f in res.findings)


def test_clean_steps_have_no_findings(tmp_path):
    p = write(tmp_path / "c.kvdump", [dict(step=i, expected=[3, 4], changed=[0, 3, 4], excluded=[0]) for i in range(3)])
    res = check(p)
    assert res.ok and res.findings == [] and res.records == 3
    assert [s["unexpected"] for s in res.steps] == [[], [], []]
    assert res.steps[0]["changed"] == [0, 3, 4] and res.steps[0]["excluded"] == [0]
    assert res.steps[0]["slots_per_page"] == 256 and res.steps[0]["snapshot"] == "clone"


def test_unexpected_and_missing_pages(tmp_path):
    p = write(tmp_path / "c.kvdump", [
        dict(step=7, expected=[3, 4, 5], changed=[0, 3, 4, 10, 11, 12, 63], excluded=[0]),
    ])
    res = check(p)
    assert not res.ok
    (s,) = res.steps
    assert s["unexpected"] == [10, 11, 12, 63] and s["missing"] == [5]
    assert codes(res) == ["canary-missing-write", "canary-unexpected-write"]
    un = next(f for f in res.findings if f.code == "canary-unexpected-write")
    assert un.severity == "error" and un.record == 0 and un.field == "canary.changed_first"
    assert "step 7 buffer 'L0.index_k' (id 0): 4 pages changed outside the expected set: pages 10-12, 63" in un.message
    assert "(slots 2560-3327, 16128-16383)" in un.message
    with dump.open(p) as d:
        g = d.groups_of("canary")[0]
        assert un.group == g.index
        assert un.offset == g.record_offset(0) + layout.LAYOUTS["canary"].field("changed_first").offset


def test_excluded_pages_are_neither_unexpected_nor_missing(tmp_path):
    p = write(tmp_path / "c.kvdump", [dict(step=0, expected=[0, 2], changed=[1, 2], excluded=[0, 1])])
    res = check(p)
    assert res.ok and res.steps[0]["unexpected"] == [] and res.steps[0]["missing"] == []


def test_missing_writes_can_be_turned_off(tmp_path):
    p = write(tmp_path / "c.kvdump", [dict(step=0, expected=[2, 3], changed=[2])])
    assert codes(check(p)) == ["canary-missing-write"]
    res = check(p, missing_writes=False)
    assert res.ok and res.steps[0]["missing"] == []


def test_long_page_lists_are_cut_short_in_messages(tmp_path):
    p = write(tmp_path / "c.kvdump", [dict(step=0, expected=[], changed=list(range(1, 64, 2)))])
    msg = check(p).findings[0].message
    assert "32 pages changed" in msg and "... and 16 more" in msg


def test_recorder_sorts_and_dedups_and_refuses_bad_pages(tmp_path):
    p = write(tmp_path / "c.kvdump", [dict(step=0, expected=[5, 2, 5], changed=[2, 5])])
    with dump.open(p) as d:
        assert d.records("canary_pages")["page"].tolist() == [2, 5, 2, 5]
        meta = d.metadata()
    assert meta["tool"] == "kvconv.capture.probe"
    with pytest.raises(ValueError):
        write(tmp_path / "n.kvdump", [dict(step=0, expected=[1], changed=[]), dict(step=1, expected=[2], changed=[-1])])
    with dump.open(tmp_path / "n.kvdump") as d:  # the step before the refused one is kept, and no part of it
        assert d.records("canary")["step"].tolist() == [0] and d.records("canary_pages")["page"].tolist() == [1]
        assert d.metadata()["outcome"]["exception"] == "ValueError: canary pages must lie in 0..2**32-1"


def test_an_exception_in_the_run_keeps_the_steps_before_it(tmp_path):
    """A CUDA error in step 3 (raised by torch as RuntimeError): steps 0-2 are written, kvconv canary says how the
    recording ended, and the exception still reaches the caller."""
    p = tmp_path / "crash.kvdump"
    with pytest.raises(RuntimeError, match="misaligned"):
        with CanaryRecorder(p) as rec:
            for step in range(3):
                rec.add(**GEOM, step=step, buffer_id=0, name="L0.index_k", expected=[3], changed=[3])
            raise RuntimeError("CUDA error: misaligned address")
    res = check(p)
    assert res.records == 3 and codes(res) == ["canary-ended-by-exception"]
    r = run_cli("canary", p)
    assert r.returncode == 0, r
    assert "ended by an exception (RuntimeError: CUDA error: misaligned address) after step 2" in r.stdout + r.stderr
    e = tmp_path / "early.kvdump"
    with pytest.raises(KeyError):
        with CanaryRecorder(e):
            raise KeyError("x")
    assert "before any step was recorded" in check(e).findings[0].message


def test_recorder_needs_an_existing_folder(tmp_path):
    from kvconv.format.errors import OutputError

    with pytest.raises(OutputError):
        CanaryRecorder(tmp_path / "nope" / "c.kvdump")


def test_no_canary_records_is_not_a_pass(tmp_path):
    p = tmp_path / "e.kvdump"
    with dump.new(p) as w:
        w.write_metadata({"tool": "t", "tool_version": "0"})
    res = check(p)
    assert res.verdict == "nothing-checked" and not res.ok and res.steps == [] and res.summary()["records"] == 0
    assert codes(res) == ["canary-nothing-checked"] and res.findings[0].severity == "warning"
    assert "docs/CANARY.md" in res.findings[0].message


def test_cli_nothing_to_check(tmp_path):
    """A dump without canary records, and a recording that ended before its first step: exit 4, its own last line,
    and the JSON says so (ok false, the finding canary-nothing-checked); a clean dump still exits 0."""
    empty = tmp_path / "e.kvdump"
    with dump.new(empty) as w:
        w.write_metadata({"tool": "t", "tool_version": "0"})
    early = tmp_path / "early.kvdump"
    with pytest.raises(KeyError):
        with CanaryRecorder(early):
            raise KeyError("x")
    for p, what in ((empty, "the dump holds no canary records"), (early, "the dump holds no canary records")):
        r = run_cli("canary", p)
        assert r.returncode == 4, r
        lines = r.stdout.splitlines()
        assert lines[0].endswith(": 0 canary records, 0 steps checked: 0 unexpected pages in 0 steps, 0 missing pages "
                                 "in 0 steps")
        assert lines[-1].startswith("NOTHING CHECKED") and "ok" not in lines[-1].split()
        assert any("canary-nothing-checked" in ln and what in ln for ln in lines)
        r = run_cli("canary", p, "--json")
        assert r.returncode == 4
        obj = result_json(r)
        assert obj["ok"] is False and obj["summary"]["steps_checked"] == 0
        assert "canary-nothing-checked" in [f["code"] for f in obj["findings"]]
    good = write(tmp_path / "g.kvdump", [dict(step=0, expected=[3], changed=[3])])
    assert run_cli("canary", good).returncode == 0
    from kvconv.check.verdict import EXIT_CODES  # the one table (schemas/codes.json), the canary's exits among it

    assert {v: EXIT_CODES[v] for v in ("ok", "failed", "nothing-checked")} == {"ok": 0, "failed": 1,
                                                                                "nothing-checked": 4}


def test_nothing_readable_is_a_failure_not_nothing_checked(tmp_path):
    r = run_cli("canary", raw(tmp_path / "r.kvdump", rec(changed_first=9), [3, 4, 0]))
    assert r.returncode == 1 and r.stdout.rstrip().endswith("FAILED") and "canary-nothing-checked" not in r.stdout


# ---- damaged records: raw groups written with dump.new -------------------------------------------------------------

def raw(path, recs, pages, strings=b"L0.index_k", *, drop_count=0, context_id=0):
    with dump.new(path, context_id=context_id) as w:
        w.write_metadata({"tool": "t", "tool_version": "0"})
        w.write_strings(strings)
        w.write_records("canary", recs, drop_count=drop_count)
        pg = np.zeros(len(pages), dtype=layout.DTYPES["canary_page"])
        pg["page"] = pages
        w.write_records("canary_pages", pg)
    return path


def rec(**kw):
    r = np.zeros(1, dtype=layout.DTYPES["canary"])
    base = dict(step=1, buffer_id=0, name_off=0, name_len=10, num_pages=16, page_size=64, compression=4, flags=1,
                expected_first=0, expected_count=2, changed_first=0, changed_count=2, excluded_first=2,
                excluded_count=1)
    for k, v in {**base, **kw}.items():
        r[k] = v
    return r


def test_raw_record_reads_like_the_recorder(tmp_path):
    res = check(raw(tmp_path / "r.kvdump", rec(), [3, 4, 0]))
    assert res.ok and res.steps[0]["expected"] == [3, 4] and res.steps[0]["buffer"] == "L0.index_k"


@pytest.mark.parametrize("kw,pages,code,fld", [
    (dict(changed_first=2, changed_count=5), [3, 4, 0], "canary-pages-range", "canary.changed_first"),
    (dict(), [4, 3, 0], "canary-pages-unsorted", "canary.expected_first"),
    (dict(), [3, 3, 0], "canary-pages-unsorted", "canary.expected_first"),
    (dict(), [3, 16, 0], "canary-page-range", "canary.expected_first"),
    (dict(name_off=4, name_len=10), [3, 4, 0], "canary-name-range", "canary.name_off"),
    (dict(page_size=0), [3, 4, 0], "canary-geometry", "canary.page_size"),
    (dict(compression=0), [3, 4, 0], "canary-geometry", "canary.compression"),
])
def test_damaged_records_are_findings(tmp_path, kw, pages, code, fld):
    p = raw(tmp_path / "r.kvdump", rec(**kw), pages)
    res = check(p)
    f = next(f for f in res.findings if f.code == code)
    assert f.severity == "error" and f.field == fld and f.record == 0
    with dump.open(p) as d:
        g = d.groups_of("canary")[0]
        assert f.offset == g.record_offset(0) + layout.LAYOUTS["canary"].field(fld.split(".")[1]).offset
    assert not res.ok
    r = run_cli("canary", p)
    assert r.returncode == 1 and code in r.stdout and "Traceback" not in r.stderr


def test_unreadable_list_skips_the_step_but_not_the_others(tmp_path):
    recs = np.concatenate([rec(step=1, changed_first=9), rec(step=2)])
    res = check(raw(tmp_path / "r.kvdump", recs, [3, 4, 0]))
    assert [s["step"] for s in res.steps] == [2] and res.records == 2
    assert [f.record for f in res.findings] == [0]


def test_unknown_flags_and_drops_are_warnings(tmp_path):
    res = check(raw(tmp_path / "r.kvdump", rec(flags=1 | 8), [3, 4, 0], drop_count=3))
    assert res.ok and codes(res) == ["canary-dropped", "canary-flags"]
    assert {f.severity for f in res.findings} == {"warning"}


def test_two_contexts_and_two_groups(tmp_path):
    p = tmp_path / "m.kvdump"
    with dump.new(p) as w:
        for ctx in (0, 1):
            w.write_strings(b"L0.index_k", context_id=ctx)
            w.write_records("canary", rec(step=1), context_id=ctx)
            w.write_records("canary", rec(step=2, changed_first=0, changed_count=3), context_id=ctx)
            pg = np.zeros(3, dtype=layout.DTYPES["canary_page"])
            pg["page"] = [3, 4, 9] if ctx else [3, 4, 0]
            w.write_records("canary_pages", pg, context_id=ctx)
    res = check(p)
    assert [(s["context_id"], s["step"], s["record"]) for s in res.steps] == [
        (0, 1, 0), (0, 2, 1), (1, 1, 0), (1, 2, 1)]
    # context 0: page 0 changed at step 2 but is excluded; context 1: page 9 changed (and is its excluded page)
    assert [s["unexpected"] for s in res.steps] == [[], [], [], []]
    assert res.steps[3]["excluded"] == [9]


@settings(max_examples=60, deadline=None)
@given(st.sets(st.integers(0, 63)), st.sets(st.integers(0, 63)), st.sets(st.integers(0, 63)))
def test_set_arithmetic(tmp_path_factory, exp, chg, exc):
    p = write(tmp_path_factory.mktemp("h") / "h.kvdump", [dict(step=0, expected=exp, changed=chg, excluded=exc)])
    (s,) = check(p).steps
    assert s["unexpected"] == sorted(chg - exp - exc)
    assert s["missing"] == sorted(exp - chg - exc)


# ---- CLI ------------------------------------------------------------------------------------------------------------

def test_cli_exit_codes_and_json_schema(tmp_path):
    good = write(tmp_path / "g.kvdump", [dict(step=0, expected=[3], changed=[3])])
    bad = write(tmp_path / "b.kvdump", [dict(step=0, expected=[3], changed=[3, 5])])
    r = run_cli("canary", good)
    assert r.returncode == 0 and r.stdout.rstrip().endswith("ok")
    r = run_cli("canary", bad)
    assert r.returncode == 1 and "canary-unexpected-write" in r.stdout and "unexpected [5]" in r.stdout
    for p, code in ((good, 0), (bad, 1)):
        r = run_cli("canary", p, "--json")
        assert r.returncode == code
        assert result_json(r)["ok"] is (code == 0)
    r = run_cli("canary", good, "--all")
    assert "step 0 buffer 'L0.index_k'" in r.stdout


def test_cli_unreadable_input(tmp_path):
    r = run_cli("canary", tmp_path / "missing.kvdump")
    assert r.returncode == 2 and r.stderr.startswith("Error:") and "Traceback" not in r.stderr
    (tmp_path / "junk").write_bytes(b"x" * 100)
    r = run_cli("canary", tmp_path / "junk")
    assert r.returncode == 2 and "bad magic" in r.stderr


def test_probe_import_needs_no_torch():
    code = ("import sys, kvconv.capture.probe, kvconv.check.canary, kvconv.cli.canary; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr


# ---- the batched checker against a per-record reading of the format ------------------------------------------------

def reference(d, missing_writes=True):
    """Each record on its own, straight from the format's rules (the checker as it was before it was batched):
    (findings, steps) of the canary records, in record order (no context-level findings)."""
    found, steps = [], []
    lay = layout.LAYOUTS["canary"]
    known = canary.FLAGS["snapshot_clone"] | canary.FLAGS["snapshot_checksum"]
    for ctx in dict.fromkeys(c for c, _ in d.contexts()):
        pages = d.records("canary_pages", context_id=ctx)
        pages = pages["page"].astype(np.int64) if len(pages) else np.zeros(0, np.int64)
        blob, index = d.strings(context_id=ctx), 0
        for g in d.groups_of("canary", context_id=ctx):
            for i, r in enumerate(g.records):
                r = {k: int(r[k]) for k in r.dtype.names}
                at = dict(path=d.path, group=g.index, record=index + i)

                def bad(code, fld, msg, sev="error", _at=at, _i=i, _g=g):
                    found.append(dict(severity=sev, code=code, message=msg, **_at, count=1, field=f"canary.{fld}",
                                      offset=_g.record_offset(_i) + lay.field(fld).offset))

                no, nl, bid = r["name_off"], r["name_len"], r["buffer_id"]
                name = blob[no:no + nl].decode("utf-8", "replace") if no + nl <= len(blob) else f"buffer{bid}"
                if no + nl > len(blob):
                    bad("canary-name-range", "name_off",
                        f"buffer name at {no}+{nl} lies outside the strings group ({len(blob)} bytes)")
                label = f"step {r['step']} buffer {name!r} (id {bid})"
                spp = r["page_size"] * r["compression"]
                if spp == 0:
                    bad("canary-geometry", "page_size" if r["page_size"] == 0 else "compression",
                        f"{label}: page_size {r['page_size']} x compression {r['compression']} is 0 slots per page")
                if r["flags"] & ~known:
                    bad("canary-flags", "flags", f"{label}: unknown flag bits {r['flags'] & ~known:#x}", "warning")
                sets = {}
                for lst in ("expected", "changed", "excluded"):
                    first, count = r[f"{lst}_first"], r[f"{lst}_count"]
                    if first + count > len(pages):
                        bad("canary-pages-range", f"{lst}_first", f"{label}: {lst} pages {first}+{count} run past "
                            f"the canary_pages group ({len(pages)} pages)")
                        continue
                    a = pages[first:first + count]
                    for j in range(count - 1):
                        if a[j + 1] <= a[j]:
                            bad("canary-pages-unsorted", f"{lst}_first", f"{label}: {lst} pages are not sorted and "
                                f"unique ({a[j]} then {a[j + 1]} at canary_pages[{first + j}])")
                            break
                    s = sorted(set(a.tolist()))
                    past = [p for p in s if p >= r["num_pages"]]
                    if past:
                        bad("canary-page-range", f"{lst}_first", f"{label}: {lst} page {past[0]} is not below "
                            f"num_pages {r['num_pages']}" + (f" ({len(past)} pages)" if len(past) > 1 else ""))
                    sets[lst] = s
                if len(sets) < 3:
                    continue
                e, c, x = (set(sets[k]) for k in ("expected", "changed", "excluded"))
                un, mi = sorted(c - e - x), sorted(e - c - x) if missing_writes else []
                if un:
                    bad("canary-unexpected-write", "changed_first",
                        f"{label}: {len(un)} page{'s' if len(un) != 1 else ''}"
                        f" changed outside the expected set: {canary.describe_pages(un, spp)}")
                if mi:
                    bad("canary-missing-write", "expected_first", f"{label}: {len(mi)} expected page"
                        f"{'s' if len(mi) != 1 else ''} did not change: {canary.describe_pages(mi, spp)}")
                steps.append(dict(context_id=ctx, step=r["step"], buffer_id=bid, buffer=name, host_ns=r["host_ns"],
                                  num_pages=r["num_pages"], page_size=r["page_size"], compression=r["compression"],
                                  slots_per_page=spp, record=index + i, unexpected=un, missing=mi,
                                  snapshot={1: "clone", 2: "checksum"}.get(r["flags"] & known, "unknown"), **sets))
            index += len(g.records)
    return found, steps


SMALL = st.integers(0, 12)
FIELDS = dict(step=st.integers(0, 2**64 - 1), buffer_id=st.integers(0, 3), name_off=st.integers(0, 12),
              name_len=st.integers(0, 6), num_pages=st.integers(0, 12), page_size=st.integers(0, 2),
              compression=st.integers(0, 2), flags=st.integers(0, 9), expected_first=SMALL,
              expected_count=st.integers(0, 5), changed_first=SMALL, changed_count=st.integers(0, 5),
              excluded_first=SMALL, excluded_count=st.integers(0, 3))


@settings(max_examples=80, deadline=None)
@given(st.lists(st.fixed_dictionaries(FIELDS), min_size=1, max_size=12), st.lists(st.integers(0, 14), max_size=14),
       st.booleans(), st.integers(1, 3))
def test_batched_equals_per_record(tmp_path_factory, recs, pages, missing_writes, groups):
    """Random, often damaged records (unsorted or repeated pages, ranges past the group, pages past num_pages, names
    past the strings, zero geometry, unknown flags), split over several groups: the same findings, in the same
    order, and the same steps as a per-record reading; the JSON streamed equals json.dumps of to_dict()."""
    arr = np.zeros(len(recs), dtype=layout.DTYPES["canary"])
    for i, r in enumerate(recs):
        for k, v in r.items():
            arr[i][k] = v
    p = tmp_path_factory.mktemp("b") / "b.kvdump"
    with dump.new(p) as w:
        w.write_strings(b"L0.k\xffL1.v")
        for part in np.array_split(arr, groups):
            w.write_records("canary", part)
        pg = np.zeros(len(pages), dtype=layout.DTYPES["canary_page"])
        pg["page"] = pages
        w.write_records("canary_pages", pg)
    with dump.open(p) as d:
        res = canary.check(d, options=canary.CanaryOptions(missing_writes=missing_writes))
        want_findings, want_steps = reference(d, missing_writes)
    assert [f.to_dict() for f in res.findings if f.code != "canary-nothing-checked"] == want_findings
    assert list(res.steps) == want_steps and len(res.steps) == len(want_steps)
    assert [s for s in res.steps.flagged()] == [s for s in want_steps if s["unexpected"] or s["missing"]]
    s = res.summary()
    assert s["steps_with_unexpected"] == sum(1 for x in want_steps if x["unexpected"])
    assert s["missing_pages"] == sum(len(x["missing"]) for x in want_steps) and s["records"] == len(recs)
    for st_ in want_steps:
        assert _json.dumps(st_, "  ") == json.dumps(st_, indent=2, sort_keys=True).replace("\n", "\n  ")
    buf = io.StringIO()
    res.write_json(buf)
    assert buf.getvalue() == json.dumps(res.to_dict(), indent=2, sort_keys=True) + "\n"
    jsonschema.validate(res.to_dict(), SCHEMA)


def test_steps_read_like_a_list_after_the_dump_is_closed(tmp_path):
    p = write(tmp_path / "c.kvdump", [dict(step=i, expected=[3], changed=[3, 5] if i % 2 else [3]) for i in range(5)])
    res = check(p)  # closed
    assert len(res.steps) == 5 and res.steps[-1]["step"] == 4 and [s["step"] for s in res.steps[1:4]] == [1, 2, 3]
    assert [s["step"] for s in res.steps.flagged()] == [1, 3] and res.steps == list(res.steps)
    with pytest.raises(IndexError):
        res.steps[5]


def test_batches_split_large_groups_and_long_lists(tmp_path):
    """More records than one batch holds, and one record whose list alone is longer than a batch's page budget:
    every record is checked once, in order, and the planted pages are found."""
    from kvconv.check.canary import _batch

    n = _batch.CHUNK + 3
    big = _batch.BUDGET + 10
    recs = np.zeros(n, dtype=layout.DTYPES["canary"])
    recs["step"] = np.arange(n)
    recs["num_pages"], recs["page_size"], recs["compression"], recs["flags"] = big + 1, 1, 1, 1
    recs["name_len"] = 1
    # every record: expected [1], changed [1] (pages 0..1), except record 7: changed = 1..big (one long list)
    recs["expected_first"], recs["expected_count"] = 1, 1
    recs["changed_first"], recs["changed_count"] = 1, 1
    recs["changed_count"][7] = big
    recs["expected_count"][n - 1] = 0  # the last record: page 1 changed unexpectedly
    pg = np.zeros(big + 1, dtype=layout.DTYPES["canary_page"])
    pg["page"] = np.arange(big + 1)
    p = tmp_path / "big.kvdump"
    with dump.new(p) as w:
        w.write_strings(b"k")
        w.write_records("canary", recs)
        w.write_records("canary_pages", pg)
    with dump.open(p) as d:
        res = canary.check(d)
    assert res.records == n and res.summary()["steps_checked"] == n
    assert [(f.record, f.code) for f in res.findings] == [(7, "canary-unexpected-write"),
                                                          (n - 1, "canary-unexpected-write")]
    assert f"{big - 1} pages changed outside the expected set: pages 2-{big}" in res.findings[0].message
    assert [s["record"] for s in res.steps.flagged()] == [7, n - 1] and res.steps[n - 1]["unexpected"] == [1]


@pytest.mark.parametrize("mod", ["kvconv.check.canary", "kvconv.check.canary._batch", "kvconv.check.canary._sets",
                                 "kvconv.check.canary._text", "kvconv.check.canary._json"])
def test_docstring_examples(mod, tmp_path, monkeypatch):
    import doctest
    import importlib
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the examples' mkdtemp() folders: pytest's, removed
    r = doctest.testmod(importlib.import_module(mod))
    assert r.failed == 0 and r.attempted > 0


def test_cli_progress_lines_off_a_terminal(tmp_path):
    """A long check shows periodic progress on stderr (here every 10 ms); stdout is the same with --no-progress."""
    import re

    from conftest import load_script

    p = tmp_path / "many.kvdump"
    load_script(ROOT / "bench" / "bench_canary.py").make(p, 1 << 18, 4)
    fast = {"KVCONV_PROGRESS_INTERVAL": "0.01"}
    shown = run_cli("canary", p, env=fast)
    plain = run_cli("canary", p, "--no-progress", env=fast)
    assert shown.returncode == plain.returncode == 1 and shown.stdout == plain.stdout
    line = re.compile(r"^kvconv: canary many\.kvdump: (\d+)% \(")
    pct = [int(m.group(1)) for m in map(line.match, shown.stderr.splitlines()) if m]
    assert pct and pct == sorted(pct) and all(0 <= x <= 100 for x in pct), shown.stderr
    assert not [ln for ln in plain.stderr.splitlines() if line.match(ln)]
