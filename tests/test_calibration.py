"""The tracer's bias on durations, calibrated at start-up (issue 27 item 5; native/src/calibrate.cpp,
kvconv/join/calibration.py), against CUPTI on the same kernel: the H200 capture in fixtures/h200-calibration (a
paged-KV append of 8 blocks, traced with enter+exit events, and its CUPTI durations from an untraced run), and the
same measurement on this machine's GPU where there is one. Goal (the issue's): the corrected median within 0.2 us or
10% of CUPTI's, whichever is larger."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import ROOT, run_cli

FIX = ROOT / "fixtures" / "h200-calibration"


def _goal(cupti_ns: float) -> float:
    return max(200.0, 0.1 * cupti_ns)


def _eager(dump: Path) -> tuple[dict, dict | None]:
    r = run_cli("reconcile", "--json", dump)
    assert r.returncode == 0, r
    dur = json.loads(r.stdout)["dumps"][0]["result"]["contexts"][0]["durations"]
    (e,) = dur["eager"]
    return e["launches"], dur.get("calibration")


def test_the_corrected_median_meets_the_goal_against_cupti_on_the_h200_fixture():
    cupti = json.loads((FIX / "cupti.json").read_text())["cupti"]["median_ns"]
    spread, cal = _eager(FIX / "calib.kvdump")
    assert cal is not None and cal["bias_ns"] > 0, cal
    assert abs(spread["median_corrected_ns"] - cupti) <= _goal(cupti), (spread, cupti)
    assert abs(spread["median_ns"] - cupti) > _goal(cupti), "the raw median met the goal: nothing to correct"


def test_text_and_arrow_give_raw_and_corrected(tmp_path):
    r = run_cli("reconcile", FIX / "calib.kvdump")
    assert "corrected median" in r.stdout and "raw durations include the tracer's own" in r.stdout, r.stdout
    spread, cal = _eager(FIX / "calib.kvdump")
    assert run_cli("arrow", FIX / "calib.kvdump", "-o", tmp_path / "t", "-q").returncode == 0
    ds = pytest.importorskip("pyarrow.dataset")
    t = ds.dataset(tmp_path / "t" / "launch", format="arrow").to_table()
    raw, fixed = t["duration_ns"].to_numpy(), t["duration_corrected_ns"].to_numpy()
    assert (fixed == np.maximum(raw - cal["bias_ns"], 0)).all()
    assert float(np.median(fixed)) == spread["median_corrected_ns"]


def test_a_dump_without_calibration_says_so(tmp_path):
    """Captures before the calibration (fixtures/h200-enter-exit): raw only, and the text says the bias is in it."""
    d = ROOT / "fixtures" / "h200-enter-exit" / "enter-exit.kvdump"
    r = run_cli("reconcile", d)
    assert "the dump records no calibration" in r.stdout and "corrected median" not in r.stdout, r.stdout
    assert run_cli("arrow", d, "-o", tmp_path / "t", "-q").returncode == 0
    ds = pytest.importorskip("pyarrow.dataset")
    t = ds.dataset(tmp_path / "t" / "launch", format="arrow").to_table()
    assert t["duration_corrected_ns"].null_count == t.num_rows > 0


@pytest.mark.gpu
def test_calibration_against_cupti_on_this_gpu(tmp_path):
    """The fixture's measurement, here: CUPTI (torch.profiler) on the untraced kernel, then the traced run's
    corrected median (kvconv's own computation, read from the dump)."""
    pytest.importorskip("torch")
    pytest.importorskip("cupy")
    lib = ROOT / "native" / "build" / "libkvconv_tracer.so"
    if not lib.exists():
        pytest.skip("native tracer not built (make -C native tracer)")
    wl = str(ROOT / "native" / "workloads" / "calib_check.py")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, wl, "--profile", "--json", str(tmp_path / "cupti.json")], env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    cupti = json.loads((tmp_path / "cupti.json").read_text())["cupti"]["median_ns"]
    dump = tmp_path / "calib.kvdump"
    traced = {**env, "CUDA_INJECTION64_PATH": str(lib), "KVCONV_KERNELS": "paged_append_calib",
              "KVCONV_EVENTS": "enter,exit", "KVCONV_OUTPUT": str(dump)}
    p = subprocess.run([sys.executable, wl], env=traced, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    from kvconv.format import dump as dumpmod
    from kvconv.join import calibration
    from kvconv.join.durations import launch_durations
    from kvconv.join.launches import LaunchTable

    with dumpmod.open(dump) as d:
        cal = calibration.of_dump(d, 0)
        t = LaunchTable.load(d, 0)
        dur = launch_durations(d, 0, t=t)
    assert cal is not None, "the tracer recorded no calibration"
    raw = dur.duration_ns[dur.timed & ~t.upload & ~t.dup]
    fixed = float(np.median(cal.corrected(raw)))
    print(json.dumps({"cupti_ns": cupti, "raw_median_ns": float(np.median(raw)), "corrected_median_ns": fixed,
                      "calibration": cal.as_dict()}))
    assert abs(fixed - cupti) <= _goal(cupti), (fixed, cupti, cal)


def test_the_calibration_on_the_legacy_stream_gives_the_own_streams_bias():
    """Issue 31 moved the clock-sync pairs and the calibration onto the legacy NULL stream (a kernel on a stream of
    the tracer's own slowed every graph node): the H200 capture made so validates, keeps both pairs, and calibrates
    the bias of the own-stream capture within the calibration's own p10-p90 spread."""
    from kvconv.format import dump

    legacy, own = FIX / "calib-legacy.kvdump", FIX / "calib.kvdump"
    assert run_cli("validate", legacy).returncode == 0
    with dump.open(legacy) as d:
        cal = d.metadata()["contexts"][0]["calibration"]
        pairs = d.records("clock_sync")
    with dump.open(own) as d:
        ref = d.metadata()["contexts"][0]["calibration"]
    assert cal["done"] and cal["bias_p10_ns"] <= ref["bias_ns"] <= cal["bias_p90_ns"], (cal, ref)
    assert len(pairs) == 2 and (pairs["uncertainty_ns"] < 10_000).all(), pairs
