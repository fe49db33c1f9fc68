"""The value canary (issue 29 item 1, mechanism ii: right slot, wrong data) through the real CLI: dumps recorded by
the real probes on numpy caches (kvconv.capture.probe: ValueProbe, the location canary's CanaryRecorder, the slot
mapping of WriteProbe(mirror=)), with the tracer's part (eager launches and the slot writes the "kernel" made) merged
in as ``kvconv record --writes`` would have written it. The torch side is tested where torch is installed.

The engine: two layers, K and V caches of 16 pages x 4 slots x 8 int16; request 1 in pages 1-2, request 2 in pages
4-5; row 2 of every decode step a padding row (slot -1). Step 0 is the prefill of both prompts, steps 1-3 decode."""

from __future__ import annotations

import contextlib
import json
import time
import warnings

import numpy as np
import pytest

from conftest import run_cli
from kvconv.capture.probe.values import FLAGS, ValueProbe, digest_rows, digest_words, row_words
from kvconv.capture.probe.writer import CanaryRecorder
from kvconv.capture.probe.writes import WriteProbe
from kvconv.format import dump, layout

PAGE, NPAGES, N = 4, 16, 8
NAMES = ["L0.k", "L0.v", "L1.k", "L1.v"]
STEPS = {0: ([4, 5, 6, 7, 8, 16, 17, 18], [1, 1, 1, 1, 1, 2, 2, 2])}
STEPS.update({s: ([8 + s, 18 + s, -1], [1, 2, 0]) for s in (1, 2, 3)})


def _rows(step: int, cache: int, tokens: int, bf16: bool) -> np.ndarray:
    """The rows the engine means ``step`` to write into ``cache`` (deterministic, different per step)."""
    rng = np.random.default_rng(1000 * step + cache)
    if bf16:  # float32 values as bf16 bits, rounded to nearest even (what a correct conversion gives)
        f = rng.standard_normal((tokens, N)).astype(np.float32).view(np.uint32)
        return ((f + 0x7FFF + ((f >> 16) & 1)) >> 16).astype(np.uint16)
    return rng.integers(-30000, 30000, (tokens, N)).astype(np.int16)


def _truncated(step: int, cache: int, tokens: int) -> np.ndarray:
    rng = np.random.default_rng(1000 * step + cache)
    f = rng.standard_normal((tokens, N)).astype(np.float32).view(np.uint32)
    return (f >> 16).astype(np.uint16)  # the bug: bf16 by dropping the low bits (one path only)


def record(path, plant: str = "none", *, values: bool = True, location: bool = True, tracer: bool = True,
           before: bool = True) -> dict:
    """Run the engine with the probes into ``path``; returns what the tracer would have recorded."""
    bf16 = plant == "bf16"
    pool = np.zeros((4, NPAGES, PAGE, N), np.uint16 if bf16 else np.int16)
    caches = [pool[i] for i in range(4)]
    rec = CanaryRecorder(path, metadata={"producer": "tests/test_value_canary.py", "plant": plant})
    vp = ValueProbe(rec, before=before) if values else None
    for name, c in zip(NAMES, caches):
        if vp is not None:
            vp.watch(c, name=name, page_size=PAGE)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        wp = WriteProbe(library="/nonexistent/libkvconv_tracer.so", mirror=rec)
    launches, writes = [], []
    prev = None
    for step, (slots, reqs) in STEPS.items():
        slots = np.array(slots)
        rows = {i: _rows(step, i, len(slots), bf16) for i in range(4)}
        snap = [c.copy() for c in caches]
        ctx = vp.step(step, slots, reqs, expect={NAMES[i]: r for i, r in rows.items()}) if vp else _nothing()
        with wp.step(step, slots, reqs), ctx:
            for i, c in enumerate(caches):  # the "kernel": one launch per cache, one block per batch row
                src = rows[i]
                if plant == "stale-source" and step == 2 and i % 2 == 0:
                    src = src.copy()
                    src[1] = prev[i][1]  # row 1's K source not refilled: last step's row, at this step's slot
                if plant == "bf16" and i == 2:
                    src = _truncated(step, i, len(slots))
                grid = len(launches) + 1
                launches.append((grid, time.monotonic_ns(), len(slots)))
                flat = c.reshape(-1, N)
                for row, s in enumerate(slots.tolist()):
                    if s < 0 or (plant == "not-written" and step == 3 and row == 1 and i == 1):
                        continue
                    flat[s] = src[row]
                    writes.append((grid, i, s, row))
        if location:
            live = slots[slots >= 0]
            for i, c in enumerate(caches):
                changed = np.flatnonzero((c != snap[i]).reshape(NPAGES, -1).any(axis=1))
                rec.add(step=step, buffer_id=i, name=NAMES[i], num_pages=NPAGES, page_size=PAGE, compression=1,
                        expected=np.unique(live // PAGE), changed=changed, excluded=[0])
        prev = rows
    rec.close()
    if tracer:
        _merge_tracer(path, launches, writes, caches)
    return {"launches": len(launches), "writes": len(writes)}


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def _merge_tracer(path, launches, writes, caches) -> None:
    """Add what the tracer writes under kvconv record --writes: eager launch records and one slot_write per block
    and slot (the probe's dump already holds the cache table, the steps and their slot maps)."""
    with dump.open(path) as d:
        kept = [(g.kind_name, np.array(g.records)) for g in d.groups]
    ea = np.zeros(len(launches), layout.DTYPES["host_launch"])
    ea["grid_id"], ea["host_ns"] = [g for g, _, _ in launches], [t for _, t, _ in launches]
    ea["flags"], ea["kernel_slot"] = layout.ENUMS["launch_flags"]["eager"], 1
    for f in ("grid_x", "grid_y", "grid_z", "block_dim_x", "block_dim_y", "block_dim_z"):
        ea[f] = 1
    ea["grid_x"] = [n for *_, n in launches]
    sw = np.zeros(len(writes), layout.DTYPES["slot_write"])
    base = {i: int(c.ctypes.data) for i, c in enumerate(caches)}
    sw["gridid"], sw["kernel_slot"], sw["stores"] = [g for g, *_ in writes], 1, 1
    sw["cache_id"] = [i for _, i, _, _ in writes]
    sw["page"], sw["offset"] = [s // PAGE for *_, s, _ in writes], [s % PAGE for *_, s, _ in writes]
    sw["block_x"] = [r for *_, r in writes]
    sw["addr_lo"] = [base[i] + s * 2 * N for _, i, s, _ in writes]
    sw["addr_hi"] = sw["addr_lo"] + 2 * N
    ev = np.zeros(int(ea["grid_x"].sum()), layout.DTYPES["device_event"])  # block_enter of every block
    ev["gridid"] = np.repeat(ea["grid_id"], ea["grid_x"])
    ev["block_x"] = np.concatenate([np.arange(n) for n in ea["grid_x"].tolist()])
    ev["sequence"] = np.arange(len(ev))
    ev["globaltimer"] = 5_000_000_000 + 1000 * np.arange(len(ev))
    ev["kernel_slot"], ev["pc"] = 1, 0x1000
    ev["kind"], ev["flags"] = layout.ENUMS["event_kind"]["block_enter"], layout.ENUMS["event_flags"]["has_gridid"]
    with dump.new(path) as w:
        for kind, recs in kept:
            if kind == "metadata":
                w.write_bytes("metadata", recs.tobytes())
            elif kind == "strings":
                blob = recs.tobytes()
                kt = np.zeros(1, layout.DTYPES["kernel"])  # the kernel table, its name after the probe's strings
                kt["slot"], kt["flags"], kt["name_off"], kt["name_len"] = 1, 1, len(blob), len(KERNEL)
                w.write_strings(blob + KERNEL.encode())
                w.write_records("kernel", kt)
            else:
                w.write_records(kind, recs)
        if "cache" not in dict(kept):  # the tracer's own cache table (register_cache), as the value probe writes it
            ct = np.zeros(len(caches), layout.DTYPES["cache"])
            ct["cache_id"], ct["base"], ct["size"] = np.arange(len(caches)), list(base.values()), caches[0].nbytes
            ct["slot_bytes"], ct["page_size"], ct["name"] = 2 * N, PAGE, [n.encode() for n in NAMES]
            w.write_records("cache", ct)
        w.write_records("eager_launch", ea)
        w.write_records("device_event", ev)
        w.write_records("slot_write", sw)


KERNEL = "reshape_and_cache_flash_kernel"


def _validate(path):
    r = run_cli("validate", path, "--json")
    assert "Traceback" not in r.stderr
    return r, json.loads(r.stdout)["dumps"][0]["result"]


def _errors(res) -> set[str]:
    return {f["code"] for f in res["findings"] if f["severity"] == "error"}


def _other_canaries_pass(path) -> None:
    """The location canary and the write canary (slot ownership included) find nothing wrong."""
    loc = run_cli("canary", path, "--json")  # kvconv canary judges the value digests too: its page findings here
    pages = json.loads(loc.stdout)["dumps"][0]["result"]
    assert pages["summary"]["unexpected_pages"] == pages["summary"]["missing_pages"] == 0, loc.stdout
    assert {f["code"] for f in pages["findings"]} <= {"canary-wrong-value", "canary-value-not-written"}, loc.stdout
    wr = run_cli("canary", "--writes", path)
    assert wr.returncode == 0 and wr.stdout.rstrip().endswith("ok"), wr.stdout


def test_a_clean_run_passes_every_check(tmp_path):
    p = tmp_path / "clean.kvdump"
    record(p)
    r, res = _validate(p)
    assert r.returncode == 0 and res["verdict"] == "ok" and not _errors(res), r.stdout[-3000:]
    _other_canaries_pass(p)
    with dump.open(p) as d:
        v = d.records("value_digest")
        assert [g.minor for g in d.groups if g.kind_name == "value_digest"] == [layout.MINOR_OF_KINDS["value_digest"]]
    # every live token of every step, in each of the 4 caches; padding rows not checked
    assert len(v) == 4 * (8 + 3 * 2) and set(v["flags"].tolist()) == {FLAGS["given"]}
    assert (v["expected"] == v["actual"]).all() and (v["before"] != v["actual"]).all()


def test_a_stale_source_row_is_caught_by_the_value_canary_alone(tmp_path):
    """Row 1 (request 2) of step 2 is written from last step's K source row: the right slot (18 + 2 = 20, page 5
    offset 0) and page, wrong data. The location and write canaries pass; the value canary names it."""
    p = tmp_path / "stale.kvdump"
    record(p, "stale-source")
    _other_canaries_pass(p)
    r, res = _validate(p)
    assert r.returncode == 1 and res["verdict"] == "failed" and _errors(res) == {"canary-wrong-value"}
    wrong = [f for f in res["findings"] if f["code"] == "canary-wrong-value"]
    assert [f["message"].split(":")[0] for f in wrong] == ["step 2 cache 'L0.k' (id 0) slot 20 (page 5 offset 0)",
                                                           "step 2 cache 'L1.k' (id 2) slot 20 (page 5 offset 0)"]
    assert all("request 2's token (batch row 1) holds data other than the row the engine meant to write" in f["message"]
               and "from the rows given to the probe" in f["message"] for f in wrong)
    with dump.open(p) as d:  # the finding points at the record's actual digest, and both digests are in its text
        g = d.groups[wrong[0]["group"]]
        rec = d.records("value_digest")[wrong[0]["record"]]
        assert g.kind_name == "value_digest" and wrong[0]["offset"] == g.record_offset(wrong[0]["record"]) + 40
        assert f"digest {int(rec['actual']):#018x}, expected {int(rec['expected']):#018x}" in wrong[0]["message"]
        assert (int(rec["step"]), int(rec["slot"]), int(rec["request_id"]), int(rec["row"])) == (2, 20, 2, 1)
    (inc,) = [i for i in res["incidents"] if i["code"] == "canary-wrong-value"]
    assert inc["message"] == ("context 0 step 2: request 2's token at slot 20 (batch row 1) holds data other than the "
                              "row the engine meant to write, in 2 of 4 caches ('L0.k', 'L1.k')")
    text = run_cli("validate", p)
    assert text.returncode == 1 and f"error canary-wrong-value: {inc['message']} (2 findings)" in text.stdout
    out = tmp_path / "r.html"
    rep = run_cli("report", "-q", p, "-o", out)
    assert rep.returncode == 1, rep.stderr
    page = out.read_text()
    assert 'data-verdict="failed"' in page and inc["message"].replace("'", "&#x27;") in page


def test_a_bf16_truncation_on_one_path_fails(tmp_path):
    p = tmp_path / "bf16.kvdump"
    record(p, "bf16")
    _other_canaries_pass(p)
    r, res = _validate(p)
    assert r.returncode == 1 and _errors(res) == {"canary-wrong-value"}
    wrong = [f for f in res["findings"] if f["code"] == "canary-wrong-value"]
    assert {f["message"].split(" (id")[0] for f in wrong} <= {f"step {s} cache 'L1.k'" for s in STEPS}
    assert len(wrong) >= 12  # nearly every row of L1.k: rounding and truncation differ in some of 8 values
    (inc,) = [i for i in res["incidents"] if i["code"] == "canary-wrong-value" and i["where"]["step"] == 0]
    assert "8 tokens (request 1's token at slot 4 (batch row 0)" in inc["message"] and "in 1 of 4 caches ('L1.k')" \
        in inc["message"]


def test_a_slot_not_written_is_told_apart(tmp_path):
    p = tmp_path / "nw.kvdump"
    record(p, "not-written")
    r, res = _validate(p)
    assert r.returncode == 1 and "canary-value-not-written" in _errors(res) and "canary-wrong-value" not in _errors(res)
    (f,) = [f for f in res["findings"] if f["code"] == "canary-value-not-written"]
    assert f["message"].startswith("step 3 cache 'L0.v' (id 1) slot 21 (page 5 offset 1): request 2's token (batch row "
                                   "1) was not written: the slot holds what it held before the step")
    assert "writes-missing-slot" in _errors(res)  # the write canary sees the same slot missing
    # without the digest before the step the value canary can only say the value is wrong
    p2 = tmp_path / "nw-nobefore.kvdump"
    record(p2, "not-written", before=False)
    _r, res2 = _validate(p2)
    assert "canary-wrong-value" in _errors(res2) and "canary-value-not-written" not in _errors(res2)


def test_values_alone_are_a_checked_dump(tmp_path):
    """A dump holding only the value probe's records: checked (exit 0 clean, 1 with a wrong value), not 'nothing
    checked'; a dump without value records is simply not value-checked."""
    p = tmp_path / "v.kvdump"
    record(p, location=False, tracer=False)
    r, res = _validate(p)
    assert r.returncode == 0 and res["verdict"] == "ok", r.stdout
    assert "coverage-none" not in {f["code"] for f in res["findings"]}
    record(p, "stale-source", location=False, tracer=False)
    r, res = _validate(p)
    assert r.returncode == 1 and _errors(res) == {"canary-wrong-value"}
    q = tmp_path / "nov.kvdump"
    record(q, "stale-source", values=False)
    r, res = _validate(q)
    assert r.returncode == 0 and not {f["code"] for f in res["findings"]} & {"canary-wrong-value",
                                                                             "canary-value-not-written"}


def test_many_wrong_rows_are_counted_past_the_named(tmp_path, monkeypatch):
    from kvconv.check.canary import value

    monkeypatch.setattr(value, "MAX_NAMED", 3)
    p = tmp_path / "bf16.kvdump"
    record(p, "bf16", location=False, tracer=False)
    with dump.open(p) as d:
        res = value.check(d)
    named = [f for f in res.findings if f.count == 1]
    more = [f for f in res.findings if f.count > 1]
    assert len(named) == 3 and len(more) == 1 and more[0].message.endswith("more like the above, not listed")
    assert res.summary["wrong_values"] == 3 + more[0].count and res.summary["records"] == 56


def test_eager_reference_mode(tmp_path):
    """expected from an eager run of the step on copies of the caches: the replay that writes another row differs."""
    cache = np.zeros((4, PAGE, N), np.int16)
    rows = np.arange(3 * N, dtype=np.int16).reshape(3, N) + 1
    slots = np.array([5, 6, -1])

    def eager(copies):  # the step run eagerly: every row to its slot
        copies["kv"].reshape(-1, N)[slots[:2]] = rows[:2]

    path = tmp_path / "e.kvdump"
    with ValueProbe(path) as vp:
        vp.watch(cache, name="kv", page_size=PAGE)
        with vp.step(0, slots, [1, 2, 0], eager=eager):
            cache.reshape(-1, N)[slots[:2]] = rows[:2]
        with vp.step(1, [7, 8, -1], [1, 2, 0], eager=lambda c: c["kv"].reshape(-1, N).__setitem__(slots[:2] + 2,
                                                                                                rows[:2])):
            cache.reshape(-1, N)[slots[:2] + 2] = rows[[1, 0]]  # the "replay" swaps the rows
    with dump.open(path) as d:
        v = d.records("value_digest")
    assert set(v["flags"].tolist()) == {FLAGS["eager"]}
    assert (v["expected"] == v["actual"]).tolist() == [True, True, False, False]
    r, res = _validate(path)
    assert r.returncode == 1 and "from the eager reference run" in res["findings"][0]["message"]


def test_source_tensor_named_at_watch(tmp_path):
    """rows read from the source tensor before the step: a kernel writing another row than its own is seen."""
    cache = np.zeros((4, PAGE, N), np.int16)
    src = np.zeros((2, N), np.int16)
    path = tmp_path / "s.kvdump"
    with ValueProbe(path) as vp:
        vp.watch(cache, name="kv", page_size=PAGE, source=src)
        src[:] = [[1] * N, [2] * N]
        with vp.step(0, [4, 5], [1, 2]):
            cache.reshape(-1, N)[[4, 5]] = src[[1, 0]]  # rows swapped
    with dump.open(path) as d:
        v = d.records("value_digest")
    assert set(v["flags"].tolist()) == {FLAGS["source"]} and not (v["expected"] == v["actual"]).any()


def test_probe_refuses_what_it_cannot_digest(tmp_path):
    cache = np.zeros((4, PAGE, N), np.int16)
    vp = ValueProbe(tmp_path / "x.kvdump")
    vp.watch(cache, name="kv", page_size=PAGE)
    with pytest.raises(ValueError):
        vp.watch(cache, name="kv", page_size=PAGE)
    with pytest.raises(ValueError):
        vp.watch(np.zeros((4, 4, 3)).T, name="t", page_size=PAGE)
    with pytest.raises(ValueError), vp.step(0, [4, 5], [1, 2], expect={"kv": np.zeros((2, N // 2), np.int16)}):
        pass
    with pytest.raises(ValueError), vp.step(1, [4, 5], [1]):
        pass
    with pytest.raises(KeyError):
        vp.expect_values(0, "nope", np.zeros((1, N), np.int16))


def test_digest_is_fixed_and_position_keyed():
    z = np.zeros((1, 16), np.uint8)
    one = z.copy()
    one[0, 0] = 1
    swapped = np.array([[0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0]], np.uint8)
    d = digest_rows(np.concatenate([z, one, swapped]))
    assert len(set(d.tolist())) == 3
    # pinned: the records of every dump carry these digests; a change to the function is a format change
    assert [int(x) & (2**64 - 1) for x in d.tolist()] == PINNED
    # the word width follows the row: 6-byte rows are read as three int16 words
    assert row_words(np.zeros((2, 6), np.uint8)).shape == (2, 3)
    assert digest_words(row_words(np.zeros((2, 6), np.uint8))).shape == (2,)
    # dtype does not matter, only the bytes
    f = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
    assert (digest_rows(f) == digest_rows(f.view(np.int32))).all()
    assert (digest_rows(f) == digest_rows(f.view(np.uint8))).all()


PINNED = [13867563454281172139, 401560547176496010, 8853410974868434435]


def test_torch_digest_equals_numpy():
    torch = pytest.importorskip("torch")
    a = np.random.default_rng(1).integers(-2**15, 2**15, (33, 24)).astype(np.int16)
    for x in (a, a.view(np.uint8)[:, :46].copy(), a.astype(np.int64)):
        assert (digest_rows(torch.from_numpy(x)).numpy() == digest_rows(x)).all()
    t = torch.from_numpy(a.copy()).view(torch.bfloat16)
    assert (digest_rows(t).numpy() == digest_rows(a)).all()


def test_torch_probe_pooled_and_per_cache(tmp_path):
    torch = pytest.importorskip("torch")
    from kvconv.capture.probe.values import _pools

    pool = torch.zeros(4, NPAGES, PAGE, N, dtype=torch.bfloat16)
    k_pool, v_pool = (torch.zeros(2, NPAGES, PAGE, N, dtype=torch.bfloat16) for _ in range(2))
    two = [k_pool[0], v_pool[0], k_pool[1], v_pool[1]]  # K and V pools apart (SGLang's k_buffer / v_buffer)
    apart = [torch.zeros(NPAGES, PAGE, N, dtype=torch.bfloat16) for _ in range(2)]
    for caches, name, pools in ((list(pool), "pooled", [4]), (two, "two pools", [2, 2]), (apart, "apart", [])):
        path = tmp_path / f"{name}.kvdump"
        with ValueProbe(path) as vp:
            for i, c in enumerate(caches):
                vp.watch(c, name=f"c{i}", page_size=PAGE)
            slots = torch.tensor([4, 9, -1])
            rows = torch.randn(3, N).to(torch.bfloat16)
            with vp.step(0, slots, [1, 2, 0], expect={f"c{i}": rows for i in range(len(caches))}):
                for i, c in enumerate(caches):
                    r = rows.clone()
                    if i == 1:
                        r[1] += 1
                    c.view(-1, N)[slots[:2]] = r[:2]
        with dump.open(path) as d:
            v = d.records("value_digest")
        bad = [(int(x["cache_id"]), int(x["slot"])) for x in v if x["expected"] != x["actual"]]
        assert bad == [(1, 9)], name
        assert sorted(len(cs) for cs, _ in _pools(vp.caches)) == pools, name


def test_paged_plants_workload_each_plant_caught_by_its_check(tmp_path):
    """native/workloads/paged_plants.py (numpy backend, no tracer: the GPU run adds the write-address records):
    clean passes; stale-k is a wrong value only; live-twice a live overwrite only (validate runs the ownership check
    from the probe's mapping, no slot_write needed); late-table the location canary's and the value canary's
    missing writes."""
    import subprocess
    import sys

    from conftest import ROOT

    p = subprocess.run([sys.executable, str(ROOT / "native/workloads/paged_plants.py"), "--out", str(tmp_path),
                        "--mode", "all", "--backend", "numpy", "--no-check"], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr
    want = {"clean": set(), "stale-k": {"canary-wrong-value"}, "live-twice": {"writes-live-overwrite"},
            "late-table": {"canary-unexpected-write", "canary-missing-write", "canary-value-not-written"}}
    for mode, codes in want.items():
        r, res = _validate(tmp_path / f"paged-{mode}.kvdump")
        assert _errors(res) == codes and r.returncode == (1 if codes else 0), (mode, r.stdout[-2000:])
    _r, res = _validate(tmp_path / "paged-stale-k.kvdump")
    (inc,) = [i for i in res["incidents"] if i["code"] == "canary-wrong-value"]
    assert inc["message"].startswith("context 0 step 5: 4 tokens (") and inc["message"].endswith(
        "in 2 of 4 caches ('L0.k', 'L1.k')")
    live = [f["message"] for f in _validate(tmp_path / "paged-live-twice.kvdump")[1]["findings"]
            if f["code"] == "writes-live-overwrite"]
    assert live[0] == ("step 3: request 5's token mapped to slot 16, which holds request 2's token from step 0; "
                       "request 2 is still running (it maps tokens until step 6)")


def test_a_step_of_padding_rows_only_records_nothing(tmp_path):
    caches = [np.zeros((4, PAGE, N), np.int16) for _ in range(2)]
    with ValueProbe(tmp_path / "pad.kvdump") as vp:
        for i, c in enumerate(caches):
            vp.watch(c, name=f"c{i}", page_size=PAGE)
        with vp.step(0, [-1, -1], [0, 0], expect={"c0": np.zeros((2, N), np.int16), "c1": np.zeros((2, N), np.int16)}):
            pass
    with dump.open(tmp_path / "pad.kvdump") as d:
        assert len(d.records("value_digest")) == 0


def test_damaged_value_records_are_read_without_a_traceback(tmp_path):
    """Random bytes as value_digest records, no cache table: every record is judged on its digests, caches are named
    by id, and validate, report and the converters end as for any failed dump."""
    rng = np.random.default_rng(3)
    r = np.frombuffer(rng.bytes(72 * 50), layout.DTYPES["value_digest"]).copy()
    r["actual"][::2] = r["expected"][::2]  # half of them agree
    p = tmp_path / "junk.kvdump"
    with dump.new(p) as w:
        w.write_metadata({"tool": "test", "tool_version": "1"})
        w.write_records("value_digest", r)
    res, js = _validate(p)
    assert res.returncode == 1 and _errors(js) == {"canary-wrong-value"}  # random "before" digests: all written
    wrong = [f for f in js["findings"] if f["code"] == "canary-wrong-value"]
    assert len(wrong) == 25 and all(" cache 'cache " in f["message"] for f in wrong)
    for cmd in (["report", "-q", p, "-o", tmp_path / "r.html"], ["perfetto", p, "-o", tmp_path / "t.pftrace"],
                ["arrow", p, "-o", tmp_path / "a"]):
        out = run_cli(*cmd)
        assert "Traceback" not in out.stderr and out.returncode in (0, 1), (cmd, out.stderr)


def test_fused_switch_is_read_at_construction_and_numpy_keeps_its_path(tmp_path, monkeypatch):
    """``fused``: None (auto) unless KVCONV_VALUE_FUSED=0 at construction; host caches never take the fused (CUDA)
    path, whatever it says, and record the same (the fused path itself: tests/test_value_digest_gpu.py)."""
    monkeypatch.setenv("KVCONV_VALUE_FUSED", "0")
    off = ValueProbe(tmp_path / "off.kvdump")
    monkeypatch.setenv("KVCONV_VALUE_FUSED", "1")
    probes = [ValueProbe(tmp_path / "auto.kvdump"), ValueProbe(tmp_path / "on.kvdump", fused=True), off]
    monkeypatch.delenv("KVCONV_VALUE_FUSED")
    assert [p.fused for p in probes] == [None, True, False]
    assert ValueProbe(tmp_path / "x.kvdump", fused=False).fused is False
    cache = np.zeros((NPAGES, PAGE, N), np.int16)
    for p in probes:
        p.watch(cache, name="c", page_size=PAGE)
    for step in range(2):
        slots = np.array([4 + step, 9, -1])
        rows = _rows(step, 0, 3, bf16=False)
        with contextlib.ExitStack() as stack:
            for p in probes:
                stack.enter_context(p.step(step, slots, [1, 2, 0], expect={"c": rows}))
            cache.reshape(-1, N)[slots[:2]] = rows[:2]
            cache.reshape(-1, N)[9, 0] += 1
    recs = []
    for p in probes:
        p.close()
        assert (p.steps, p.fused_steps) == (2, 0)
        with dump.open(p.recorder.path) as d:
            recs.append(d.records("value_digest"))
    for r in recs[1:]:
        for field in r.dtype.names:
            assert field == "host_ns" or (r[field] == recs[0][field]).all(), field
    assert [int(x["slot"]) for x in recs[0] if x["expected"] != x["actual"]] == [9, 9]


class _Rows(np.ndarray):
    """Host rows with torch's data_ptr(): the fused path's row-layout cache checks it."""

    def data_ptr(self) -> int:
        return int(self.ctypes.data)


class _FakeTensor:
    """The torch tensor methods FusedBuffers uses, on a numpy array; copy_ is queued on the fake stream."""

    def __init__(self, a: np.ndarray, dev: _FakeDevice) -> None:
        self.a, self.dev = a, dev

    def __getitem__(self, i):
        return _FakeTensor(self.a[i], self.dev)

    def __len__(self) -> int:
        return len(self.a)

    def numpy(self) -> np.ndarray:
        return self.a

    def copy_(self, src, non_blocking=False):
        assert non_blocking
        self.dev.pending.append(lambda: self.a.__setitem__(slice(None), src.a))


class _FakeDevice:
    """A device and stream for the fused path on the host, under the real FusedBuffers: copies and launches are
    queued and run in order only when an event is waited for, so a host buffer written again before its copy ran
    gives wrong digests. The "kernel" reads each address inside the arrays registered (anything else fails the
    test) and digests it with digest_words."""

    int64 = np.int64

    def __init__(self, arrays) -> None:
        from kvconv.capture.probe.fused import FusedBuffers

        self.pending, self.arrays, self.done = [], list(arrays), 0  # done: how many queued have run
        self.cuda = type("cuda", (), {"Event": self.event, "current_stream": staticmethod(lambda _dev: None)})
        self.bufs = FusedBuffers.__new__(FusedBuffers)
        self.bufs.torch, self.bufs.device, self.bufs.pairs = self, "fake", {}

    def empty(self, size, *, dtype, pin_memory=False, device=None):
        assert pin_memory != (device is not None)  # host buffers pinned
        return _FakeTensor(np.full(size, -1, dtype), self)

    def run(self, upto: int | None = None) -> None:
        while self.pending and (upto is None or self.done < upto):
            self.pending.pop(0)()
            self.done += 1

    def event(self):
        fake = self

        class Event:
            mark = 0

            def record(self, _stream):
                self.mark = fake.done + len(fake.pending)

            def synchronize(self):
                fake.run(self.mark)

        return Event()

    def _row(self, addr: int, words: int) -> np.ndarray:
        for a in self.arrays:
            raw = a.reshape(-1).view(np.uint8)
            at = addr - a.ctypes.data
            if 0 <= at and at + 8 * words <= raw.size:
                return raw[at:at + 8 * words].view(np.int64)
        raise AssertionError(f"address {addr:#x} in no array")

    def kernel(self, addrs, out, words):
        def go():
            out.a[:] = digest_words(np.stack([self._row(int(a), words) for a in addrs.a]))

        self.pending.append(go)


class _FakeSlotDigests:
    """SlotDigests' interface on _FakeDevice: the replay is queued (it digests the slots copied at run, as the real
    one reads them from its pinned buffer), its event recorded after it; ``made`` counts the graphs made."""

    made = 0

    def __init__(self, fake: _FakeDevice, groups: list, caps: list) -> None:
        self.fake, self.groups, self.caps = fake, groups, list(caps)
        self.out = [np.full(len(cids) * cap, -1, np.int64) for (cids, _b, _sb), cap in zip(groups, caps)]
        self.event = fake.event()
        self.event.record(None)
        type(self).made += 1

    def fits(self, counts) -> bool:
        return all(k <= c for k, c in zip(counts, self.caps))

    def run(self, slots: list) -> list:
        self.event.synchronize()
        views = [o[:len(g[0]) * len(s)].reshape(len(g[0]), len(s)) for o, g, s in zip(self.out, self.groups, slots)]
        taken = [np.array(s) for s in slots]

        def replay():
            for v, (_cids, bases, sb), s in zip(views, self.groups, taken):
                for i, base in enumerate(bases):
                    v[i] = digest_words(np.stack([self.fake._row(int(base + x * sb), sb // 8) for x in s])) \
                        if len(s) else v[i]

        self.fake.pending.append(replay)
        self.event.record(None)
        return views


def _fused_host_run(tmp_path, name, fused: bool, monkeypatch, uniform: bool, graphs: bool | str = False):
    """Five steps on host caches, the fused path's host side driven through _FakeDevice (fused=True; ``graphs``:
    the slots by _FakeSlotDigests, one slot's room at first, so that a graph is made again as steps map more) or
    the numpy path; ``graphs="fail"``: making a graph raises); step 2 raises inside its block (its copies left
    pending). Returns the records and the fast-path count."""
    from kvconv.capture.probe import fused as fp

    widths = [8, 8, 8, 8] if uniform else [8, 12, 8, 4]
    pages = [NPAGES, NPAGES, NPAGES if uniform else NPAGES // 2, NPAGES]
    caches = [np.zeros((p, PAGE, w), np.int16) for p, w in zip(pages, widths)]
    qkv = [np.zeros((6, 3 * w), np.int16) for w in widths]
    src = np.zeros((6, widths[3]), np.int16).view(_Rows)
    fake = _FakeDevice(caches + qkv + [src])
    vp = ValueProbe(tmp_path / f"{name}.kvdump", fused=False)
    if fused:
        monkeypatch.setattr(fp, "kernel", lambda: fake.kernel)
        monkeypatch.setattr(fp, "row_layout", lambda r, _d: None if r.ctypes.data % 8 or r.strides[0] % 8
                            else (r.ctypes.data, r.strides[0]))
        vp._fused_device = lambda: "fake"
    for i, c in enumerate(caches):
        vp.watch(c, name=f"c{i}", page_size=PAGE, source=None if uniform or i != 3 else src)
    if fused:
        fake.bufs.graphs, fake.bufs.no_graphs = {}, False
        monkeypatch.setattr(fp, "MIN_SLOTS", 1)

        def make(_dev, groups, caps):
            if graphs == "fail":
                raise RuntimeError("operation not permitted when stream is capturing")
            return _FakeSlotDigests(fake, groups, caps)

        vp._fused = (fake.bufs, fp.slot_groups(vp.caches), {}, make if graphs else None)
    fast = 0
    real = fp.columns_from_blocks

    def spy(*a):
        nonlocal fast
        got = real(*a)
        fast += got is not None
        return got

    monkeypatch.setattr(fp, "columns_from_blocks", spy)
    rng = np.random.default_rng(5)

    def views(qs):
        rows = [q[:, w:2 * w].view(_Rows) for q, w in zip(qs, widths)]
        if not uniform:
            rows[2] = qs[2][:, 1:1 + widths[2]].view(_Rows)  # unaligned: the numpy path within a fused step
        return rows

    for step in range(5):
        slots = np.array([8, 20 + step, -1, 33 + step, -1 if step == 0 else 40, 9])  # step 0: one token fewer
        # the engine's next values: written in stream order as a graph refills its static buffers (the fused
        # path reads a step's digests only at the next step: the refill must not overtake its kernel)
        new_q = [rng.integers(-30000, 30000, q.shape).astype(np.int16) for q in qkv]
        new_src = rng.integers(-30000, 30000, src.shape).astype(np.int16).view(_Rows)
        rows, new_rows = views(qkv), views(new_q)
        expect = {f"c{i}": r for i, r in enumerate(rows) if uniform or i != 3}

        def refill(new_q=new_q, new_src=new_src):
            for q, v in zip(qkv, new_q):
                q[:] = v
            src[:] = new_src

        writes = []
        for i, c in enumerate(caches):
            flat = c.reshape(-1, widths[i])
            ok = (slots >= 0) & (slots < flat.shape[0]) & (slots != 8)
            new = (new_src if i == 3 and not uniform else new_rows[i]).copy()
            new[3, 0] ^= i == 0  # one wrong bit in cache 0
            writes.append(lambda flat=flat, at=slots[ok], new=new[ok]: flat.__setitem__(at, new))
        fake.pending.append(refill) if fused else refill()  # before the probe's launches: the step's inputs
        if fused and not uniform:
            fake.run()  # the numpy path within a fused step reads on the host at once: the device caught up first
        with contextlib.suppress(RuntimeError), vp.step(step, slots, list(range(6)), expect=expect):
            for w in writes:  # the step's writes, queued behind the probe's launches before the step
                fake.pending.append(w) if fused else w()
            if step == 2:
                raise RuntimeError("the engine failed")
    vp.close()
    assert vp.fused_steps == (4 if fused else 0)
    if fused:  # a failed capture: the slots by address from then on (the records below still equal)
        assert (fake.bufs.no_graphs, bool(fake.bufs.graphs)) == (graphs == "fail", graphs is True)
    with dump.open(vp.recorder.path) as d:
        return d.records("value_digest"), fast


@pytest.mark.parametrize("uniform,graphs", [(True, False), (False, False), (True, True), (False, True),
                                            (True, "fail")])
def test_fused_host_side_records_equal_the_numpy_path(tmp_path, monkeypatch, uniform, graphs):
    """The fused path's host side (addresses built per group into reused buffers, the layout cache of given rows,
    the records straight from its blocks or per cache; with graphs, the slots by slot graphs made again as a step
    maps more) records what the numpy path does, also with its copies asynchronous and a step that raised leaving
    them pending."""
    _FakeSlotDigests.made = 0
    fused, fast = _fused_host_run(tmp_path, "f", True, monkeypatch, uniform, graphs)
    if graphs is True:  # per phase and parity and group: a first graph (one slot's room) and again as steps map more
        assert _FakeSlotDigests.made > 4
    plain, _ = _fused_host_run(tmp_path, "p", False, monkeypatch, uniform)
    assert fast == (4 if uniform else 0)  # uniform: every step's records from the blocks; else per cache
    assert len(fused) == len(plain) > 0
    for field in fused.dtype.names:
        assert field == "host_ns" or (fused[field] == plain[field]).all(), field
    assert sorted({int(s) for s in fused["slot"][fused["expected"] != fused["actual"]]}) == \
        [8] + [33 + s for s in (0, 1, 3, 4)]
    assert (fused["before"] != fused["actual"]).any() and set(fused["step"].tolist()) == {0, 1, 3, 4}
