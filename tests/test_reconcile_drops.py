"""Device events dropped for want of room make the blocks of the launches that lack them unknowable: reconcile says
which and how many events were dropped, fails, and agrees with validate's verdict (issue 44: a vLLM decode graph's
360 graph-node records with 0 device events, 10,732,944 dropped, were "ok", exit 0).

The dump: two eager launches whose 5 blocks filled the device buffer (capacity 5), then a decode graph of 8 nodes
(grid 8) replayed 45 times whose events were all dropped; exact join (gridid + tag)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import synth
from conftest import run_cli
from kvconv.format import dump, layout
from kvconv.format.reader import _header_crc

DROPPED = 10_732_944
NODES, REPLAYS = 8, 45


def _decode_graph() -> np.ndarray:
    lf = layout.ENUMS["launch_flags"]
    g = np.zeros(NODES * REPLAYS, dtype=layout.DTYPES["host_launch"])
    g["graph_exec"] = 0xABC0
    g["launch_id"] = g["tag"] = np.repeat(np.arange(1, REPLAYS + 1), NODES)
    g["node"] = np.tile(0xD0 + 8 * np.arange(NODES), REPLAYS)
    g["grid_id"] = np.tile(20 + np.arange(NODES), REPLAYS)
    g["stream"] = g["api_stream"] = 0x100
    g["host_ns"] = 2_000_000 + np.arange(len(g)) * 500
    g["grid_x"], g["grid_y"], g["grid_z"] = 8, 1, 1
    g["block_dim_x"], g["block_dim_y"], g["block_dim_z"] = 256, 1, 1
    g["kernel_slot"] = 7
    g["flags"] = lf["graph_node"] | lf["has_tag"]
    return g


def make(path, *, live: bool):
    """``live``: the device group written live (the producer died or was killed, as vLLM's workers often are)."""
    p = synth.small_parts({"device_event_drops": DROPPED})
    ev = p["device_event"][:5].copy()  # the eager launches' 5 blocks (grids 3 and 2)
    ev["gridid"] = [10, 10, 10, 11, 11]
    ev["flags"] = layout.ENUMS["event_flags"]["has_gridid"]
    with dump.new(path) as w:
        w.write_metadata(p["meta"])
        w.write_strings(p["strings"])
        w.write_records("kernel", p["kernel"])
        w.write_records("clock_sync", p["clock_sync"], clock_domain=0)
        w.write_records("eager_launch", p["eager_launch"], capacity=64)
        w.write_records("graph_node", _decode_graph(), capacity=1024)
        w.write_records("device_event", ev, capacity=5, drop_count=DROPPED)
    if live:  # the live flag, and the header checksum a live group has (its counts outside it)
        with dump.open(path) as d:
            off = d.groups_of("device_event")[0].offset
        raw = bytearray(path.read_bytes())
        raw[off + layout.LAYOUTS["header"].field("flags").offset] |= layout.ENUMS["header_flags"]["live"]
        raw[off + 60 : off + 64] = _header_crc(bytes(raw[off : off + 60]), live=True).to_bytes(4, "little")
        path.write_bytes(raw)
    return path


@pytest.mark.parametrize("live", [True, False], ids=["live", "finished"])
def test_dropped_events_make_the_decode_graph_unknowable_not_ok(tmp_path, live):
    d = make(tmp_path / "lost.kvdump", live=live)
    r = run_cli("reconcile", d)
    assert r.returncode == 1, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[-1] == ("FAILED (21 error findings; 2,880 blocks of 360 launches cannot be matched: the device "
                         f"dropped {DROPPED:,} events)"), lines[-1]
    first = next(ln for ln in lines if ln.startswith("error missing-blocks"))
    assert "graph exec 0xabc0 replay 1 node #0" in first and f"the device dropped {DROPPED:,} events" in first, first
    assert "340 more missing-blocks findings" in r.stdout and "unflushed-blocks" not in r.stdout
    j = json.loads(run_cli("reconcile", "--json", d).stdout)
    assert j["ok"] is False and j["exit"] == 1 and j["dumps"][0]["result"]["ok"] is False
    missing = [f for f in j["dumps"][0]["result"]["findings"] if f["code"] == "missing-blocks"]
    assert sum(f["count"] for f in missing) == 360


@pytest.mark.parametrize("live", [True, False], ids=["live", "finished"])
def test_validate_and_reconcile_give_one_verdict_on_dropped_events(tmp_path, live):
    d = make(tmp_path / "lost.kvdump", live=live)
    v = json.loads(run_cli("validate", "--json", d).stdout)
    rec = run_cli("reconcile", d)
    res = v["dumps"][0]["result"]
    assert res["verdict"] == "failed" and v["exit"] == rec.returncode == 1
    codes = {f["code"] for f in res["findings"]}
    assert {"dropped", "missing-blocks"} <= codes and "unflushed-blocks" not in codes, codes
