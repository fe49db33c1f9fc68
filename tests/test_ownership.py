"""Slot ownership across steps (issue 29 item 2, kvconv.check.canary.ownership) through the real CLI
(``kvconv canary --writes``): small dumps written by the real writer (kvconv.format.dump.new) as the tracer writes
the probe's steps, releases made by the probe's own rows (WriteProbe.release / free: probe.writes.release_rows).

Every run below maps request 6's tokens to slots 4112 and 4113 at step 0 and more of its tokens at later steps; a
step mapping 4112 to request 2 is a live overwrite unless 6 had finished (mapped nothing later) or was released."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import FIXTURES, run_cli
from kvconv.capture.probe.writes import release_rows
from kvconv.format import dump, layout

PAGE, SLOTS = 16, 8192
MSG = ("step 3: request 2's token mapped to slot 4112, which holds request 6's token from step 0; request 6 is still "
       "running")
NO_RELEASE = "no release recorded: a request owns its slots until its last step"


def _write(path, events, *, writes=True, untimed=False):
    """events, in host-time order: ("step", number, [(slot, request), ...]) or ("release", number, rows) with rows
    from release_rows. Each step gets a window of 1 ms and, with ``writes``, one eager launch writing exactly the
    slots it maps (so the write canary itself passes) into one 8192-slot cache."""
    steps, smap, launches, sw = [], [], [], []
    for k, (what, number, rows) in enumerate(events):
        t0 = 0 if untimed else 1_000_000 * (k + 1)
        first = sum(len(r) for r in smap)
        if what == "release":
            slots, reqs, flags = rows
            m = np.zeros(len(slots), layout.DTYPES["slot_map"])
            m["slot"], m["request_id"], m["flags"], m["token"] = slots, reqs, flags, np.arange(len(slots))
            steps.append((number, t0, t0, first, len(m)))
            smap.append(m)
            continue
        m = np.zeros(len(rows), layout.DTYPES["slot_map"])
        m["slot"], m["request_id"], m["token"] = [s for s, _ in rows], [r for _, r in rows], np.arange(len(rows))
        steps.append((number, t0, t0 + 999_999 if t0 else 0, first, len(m)))
        smap.append(m)
        grid = k + 1
        launches.append((grid, t0 + 500))
        w = np.zeros(len(rows), layout.DTYPES["slot_write"])
        w["gridid"], w["kernel_slot"], w["stores"] = grid, 1, 4
        w["page"], w["offset"] = [s // PAGE for s, _ in rows], [s % PAGE for s, _ in rows]
        w["block_x"] = np.arange(len(rows))
        w["addr_lo"] = (1 << 20) + np.array([s for s, _ in rows], np.uint64) * 64
        w["addr_hi"] = w["addr_lo"] + 64
        sw.append(w)
    ws = np.zeros(len(steps), layout.DTYPES["write_step"])
    for i, (number, b, e, first, count) in enumerate(steps):
        ws[i]["step"], ws[i]["begin_ns"], ws[i]["end_ns"], ws[i]["map_first"], ws[i]["map_count"] = (
            number, b, e, first, count)
    with dump.new(path) as w:
        w.write_metadata({"tool": "test"})
        if writes:
            ea = np.zeros(len(launches), layout.DTYPES["host_launch"])
            ea["grid_id"], ea["host_ns"] = [g for g, _ in launches], [t for _, t in launches]
            ea["flags"], ea["kernel_slot"], ea["grid_x"] = layout.ENUMS["launch_flags"]["eager"], 1, 8
            w.write_records("eager_launch", ea)
            cache = np.zeros(1, layout.DTYPES["cache"])
            cache["base"], cache["size"], cache["slot_bytes"], cache["page_size"] = 1 << 20, SLOTS * 64, 64, PAGE
            cache["name"] = b"L0.k"
            w.write_records("cache", cache)
            w.write_records("slot_write", np.concatenate(sw))
        w.write_records("write_step", ws)
        w.write_records("slot_map", np.concatenate(smap))


def _run(tmp_path, events, **kw):
    _write(tmp_path / "o.kvdump", events, **kw)
    text = run_cli("canary", "--writes", "o.kvdump", cwd=tmp_path)
    js = run_cli("canary", "--writes", "o.kvdump", "--json", cwd=tmp_path)
    assert "Traceback" not in text.stderr + js.stderr
    res = json.loads(js.stdout)["dumps"][0]["result"]
    assert js.returncode == text.returncode
    return text, res


def _steps(reuse_step_2: bool = False, six_runs_until: int = 4):
    """Request 6 at steps 0..six_runs_until, request 1 at every step, and at step 3 request 2 taking slot 4112."""
    ev = [("step", 0, [(4112, 6), (4113, 6), (100, 1)])]
    for n in (1, 2):
        ev.append(("step", n, [(100 + n, 1)] + ([(4113 + n, 6)] if n <= six_runs_until else [])))
    ev.append(("step", 3, [(4112, 2), (103, 1)] + ([(4116, 6)] if six_runs_until >= 3 else [])))
    ev.append(("step", 4, [(104, 1)] + ([(4117, 6)] if six_runs_until >= 4 else [])))
    return ev


def _codes(res) -> list[str]:
    return sorted(f["code"] for f in res["findings"])


def test_reuse_after_the_request_finished_is_clean(tmp_path):
    text, res = _run(tmp_path, _steps(six_runs_until=2))  # 6's last step is 2: slot 4112 is free at step 3
    assert text.returncode == 0 and _codes(res) == [] and res["verdict"] == "ok"
    s = res["summary"]
    assert s["ownership_steps"] == 5 and s["releases"] == 0 and s["live_overwrites"] == 0
    assert NO_RELEASE in s["ownership_note"] and "host time" in s["ownership_note"]
    assert "slot ownership: 5 steps, 0 releases, 0 live slots handed out again" in text.stdout


def test_reuse_while_the_request_runs_is_a_live_overwrite(tmp_path):
    text, res = _run(tmp_path, _steps())  # 6 maps tokens until step 4: 4112 is still 6's at step 3
    # the write canary alone accepts this run: every block wrote exactly the slot its token maps to
    assert text.returncode == 1 and _codes(res) == ["writes-live-overwrite"] and res["verdict"] == "failed"
    f = res["findings"][0]
    assert f["severity"] == "error" and f["message"] == f"{MSG} (it maps tokens until step 4); {NO_RELEASE}"
    assert res["summary"]["live_overwrites"] == 1 and res["summary"]["errors"] == 1
    assert f"error writes-live-overwrite o.kvdump: byte {f['offset']}: group {f['group']} record {f['record']}: " \
           f"slot_map.slot: {MSG}" in text.stdout
    d = dump.open(tmp_path / "o.kvdump")  # the finding names request 2's slot_map record
    g = d.groups[f["group"]]
    assert g.kind_name == "slot_map" and f["offset"] == g.record_offset(f["record"])
    r = d.records("slot_map")[f["record"]]
    assert (int(r["slot"]), int(r["request_id"])) == (4112, 2)


def test_the_mapping_alone_finds_it_without_tracer_writes(tmp_path):
    text, res = _run(tmp_path, _steps(), writes=False)
    assert text.returncode == 1 and _codes(res) == ["writes-live-overwrite", "writes-nothing-checked"]
    assert res["summary"]["records"] == 0 and res["summary"]["ownership_steps"] == 5
    assert "only the slot ownership of the probe's mapping" in text.stdout
    clean_text, clean = _run(tmp_path, _steps(six_runs_until=2), writes=False)
    assert clean_text.returncode == 4 and _codes(clean) == ["writes-nothing-checked"]  # no write address verified


@pytest.mark.parametrize("how", ["release", "free"])
def test_an_explicit_release_then_reuse_is_clean(tmp_path, how):
    ev = _steps()
    rows = release_rows(request_ids=[6]) if how == "release" else release_rows(slots=[4112, 4113])
    ev.insert(3, ("release", 2, rows))  # after step 2, before step 3; 6 keeps running in new slots
    text, res = _run(tmp_path, ev)
    # a release is no step: free(slots)'s rows map no token the write canary would miss
    assert text.returncode == 0 and _codes(res) == [], text.stdout
    s = res["summary"]
    assert s["releases"] == 1 and s["ownership_steps"] == 5 and s["steps"] == 5
    assert NO_RELEASE not in s["ownership_note"]
    assert [st["step"] for st in res["steps"]] == [0, 1, 2, 3, 4]


def test_a_release_of_another_slot_does_not_excuse_the_overwrite(tmp_path):
    ev = _steps()
    ev.insert(3, ("release", 2, release_rows(slots=[4113])))
    text, res = _run(tmp_path, ev)
    assert text.returncode == 1 and _codes(res) == ["writes-live-overwrite"]
    assert res["findings"][0]["message"] == f"{MSG} (it maps tokens until step 4)"  # releases recorded: no assumption


def test_a_release_counts_from_its_host_time_not_its_step_number(tmp_path):
    """Under async scheduling the engine frees finished requests' blocks after it dispatched the next step: a release
    carrying step number 2 but recorded after step 3 began does not excuse step 3's mapping."""
    ev = _steps()
    ev.insert(4, ("release", 2, release_rows(request_ids=[6])))  # recorded after step 3
    text, res = _run(tmp_path, ev)
    assert text.returncode == 1 and _codes(res) == ["writes-live-overwrite"]
    assert "host time" in res["summary"]["ownership_note"]


def test_without_host_times_steps_are_ordered_by_number(tmp_path):
    ev = _steps()
    ev.insert(4, ("release", 2, release_rows(request_ids=[6])))  # by number: right after step 2
    text, res = _run(tmp_path, ev, writes=False, untimed=True)
    assert _codes(res) == ["writes-nothing-checked"] and text.returncode == 4
    assert "step number" in res["summary"]["ownership_note"]


def test_two_requests_mapping_one_slot_in_one_step(tmp_path):
    ev = [("step", 0, [(4112, 6), (100, 1)]), ("step", 1, [(4113, 6), (4113, 2)])]
    text, res = _run(tmp_path, ev, writes=False)
    assert text.returncode == 1 and [f["message"] for f in res["findings"] if f["code"] == "writes-live-overwrite"] \
        == [f"step 1: request 2's token mapped to slot 4113, which holds request 6's token from step 1; request 6 is "
            f"still running (it maps tokens until step 1); {NO_RELEASE}"]


@pytest.mark.parametrize("case", ["clean", "clean-80", "pad-minus-one", "stale-pad", "wrong-page", "wrong-page-80"])
def test_committed_write_fixtures_have_no_live_overwrite(case):
    """The H200 fixtures hand no slot out twice (no request finishes early enough for its slots to be reused)."""
    r = run_cli("canary", "--writes", f"writes-{case}.kvdump", "--json", cwd=FIXTURES / f"writes-{case}")
    res = json.loads(r.stdout)["dumps"][0]["result"]
    assert res["summary"]["ownership_steps"] == 5 and res["summary"]["live_overwrites"] == 0
    assert "writes-live-overwrite" not in {f["code"] for f in res["findings"]}


def test_json_follows_its_schema(tmp_path):
    import jsonschema

    from kvconv.format.layout import load_json_schema

    ev = _steps()
    ev.insert(3, ("release", 2, release_rows(slots=[4113])))
    _text, res = _run(tmp_path, ev)
    jsonschema.validate(res, load_json_schema("canary_writes.schema.json"))


def test_release_rows_refuse_what_is_no_release():
    for bad in ({}, {"request_ids": [1], "slots": [2]}, {"request_ids": [0]}, {"slots": [-1]}):
        with pytest.raises(ValueError):
            release_rows(**bad)
