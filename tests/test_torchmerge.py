"""kvconv chrome --merge: kvconv's tracks inside a torch.profiler trace captured on the H200 with the same run
(fixtures/h200-torch-merge), aligned on the profiler's clock; checked against CLOCK_REALTIME / CLOCK_MONOTONIC read
back to back in the profiled process (the fixture's anchors.json), not against kvconv's own estimate."""

from __future__ import annotations

import json
import re

from conftest import FIXTURES, run_cli

F = FIXTURES / "h200-torch-merge"
DUMP, TORCH = F / "run.kvdump", F / "torch_trace.json"


def _merged(tmp_path):
    out = tmp_path / "merged.json"
    r = run_cli("chrome", DUMP, "--merge", TORCH, "-o", out)
    assert r.returncode == 0, r.stderr
    return json.loads(out.read_text()), r


def test_merged_trace_holds_both_timelines_aligned_on_the_profiler_clock(tmp_path):
    m, r = _merged(tmp_path)
    torch = json.loads(TORCH.read_text())
    info = m["kvconv_merge"]
    truth = [rt - mo for a in json.loads((F / "torch_trace.json.anchors.json").read_text())["anchors"]
             for rt, mo in zip(a["realtime_ns"], a["monotonic_ns"])]
    # the offset lies within the stated error of REALTIME - MONOTONIC as the process read it
    assert all(abs(t - info["offset_ns"]) <= info["error_ns"] for t in truth), (truth, info)
    assert info["anchors"] == 2 and info["error_ns"] < 20_000
    assert f"alignment error ±{info['error_ns'] / 1000:.2f} µs" in r.stderr
    ev = m["traceEvents"]
    assert ev[: len(torch["traceEvents"])] == torch["traceEvents"]  # the profiler's events untouched
    kv = [e for e in ev[len(torch["traceEvents"]):]]
    assert all(e["pid"] >= 1 << 30 for e in kv if "pid" in e)
    # 48 host launch records; 80 blocks, each one slice from its entry to its exit (160 device events)
    assert sum(e.get("cat") == "host" for e in kv) == 48
    assert [e["ph"] for e in kv if e.get("cat") == "block"] == ["X"] * 80
    assert all(e["dur"] > 0 for e in kv if e.get("cat") == "block")
    # every kvconv host launch record falls between the two anchors of the profiled run (the workload ran there)
    anchors = sorted(e["ts"] for e in torch["traceEvents"] if str(e.get("name", "")).startswith("kvconv-clock-"))
    host = [e["ts"] for e in kv if e.get("cat") == "host"]
    assert anchors[1] < min(host) and max(host) < anchors[2]
    blocks = [e["ts"] for e in kv if e.get("cat") == "block"]
    assert anchors[1] < min(blocks) and max(blocks) < anchors[2]


def test_a_torch_trace_without_anchors_is_refused(tmp_path):
    t = json.loads(TORCH.read_text())
    t["traceEvents"] = [e for e in t["traceEvents"] if "kvconv-clock-anchor" not in str(e.get("name", ""))]
    bad = tmp_path / "noanchor.json"
    bad.write_text(json.dumps(t))
    out = tmp_path / "merged.json"
    r = run_cli("chrome", DUMP, "--merge", bad, "-o", out)
    assert r.returncode == 2 and "no clock anchor" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary left behind


def test_a_torch_trace_of_another_run_is_refused(tmp_path):
    # Before: merged silently, kvconv's events ~530 s away from the profiler's. The anchors of "another run" state
    # a CLOCK_MONOTONIC 530 s later: the dump's events land 530 s before the profiled ones.
    t = json.loads(TORCH.read_text())
    for e in t["traceEvents"]:
        name = str(e.get("name", ""))
        if name.startswith("kvconv-clock-anchor monotonic_ns="):
            e["name"] = f"kvconv-clock-anchor monotonic_ns={int(name.rsplit('=', 1)[1]) + 530 * 10**9}"
    other = tmp_path / "other-run.json"
    other.write_text(json.dumps(t))
    out = tmp_path / "merged.json"
    r = run_cli("chrome", DUMP, "--merge", other, "-o", out)
    assert r.returncode == 2 and "does not overlap the dump" in r.stderr, r.stderr
    gap = float(re.search(r"events lie ([\d.,]+) s before the profiler's", r.stderr).group(1).replace(",", ""))
    assert 500 < gap < 530, r.stderr  # 530 s less the runs' own length
    assert len(r.stderr.strip().splitlines()) == 1 and not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
