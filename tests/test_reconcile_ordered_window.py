"""The ordered join works on a bounded window (issue 13): ``kvconv reconcile --join ordered`` (and the auto join of
events without gridid) places the device events chunk by chunk in a second pass instead of loading them all. Its
report equals the in-memory join's (``reconcile(d, tables=True)``, which still holds the events for the matches
table) where ambiguous runs, multi-stream windows, misfits and %gridid contradictions cross chunk edges (each device
event group is a chunk of its own), and its peak RSS stays well below the dump's size."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import ROOT, load_script, run_cli
from kvconv.check import reconcile
from kvconv.format import dump, layout

H, E = layout.DTYPES["host_launch"], layout.DTYPES["device_event"]
LF, EF, EK = layout.ENUMS["launch_flags"], layout.ENUMS["event_flags"], layout.ENUMS["event_kind"]


def launches(grids, *, streams=None, slot=1, exec_=0):
    """Eager launches (or, with ``exec_``, one replay's graph nodes) in host order, grid_id 100 + i."""
    n = len(grids)
    h = np.zeros(n, H)
    h["grid_x"], h["grid_y"], h["grid_z"] = grids, 1, 1
    h["kernel_slot"], h["grid_id"], h["host_ns"] = slot, 100 + np.arange(n), 1000 * (1 + np.arange(n))
    h["stream"] = streams if streams is not None else 1
    if exec_:
        h["graph_exec"], h["launch_id"], h["node"] = exec_, 1 + np.arange(n) // 4, 0xD0 + np.arange(n) % 4
        h["flags"] = LF["graph_node"]
    else:
        h["flags"] = LF["eager"]
    return h


def blocks_of(h, *, gid=False):
    """One block-enter event per block of each launch, in host order (sequence 0, 1, ...)."""
    rows = np.repeat(np.arange(len(h)), h["grid_x"])
    ev = np.zeros(len(rows), E)
    ev["sequence"] = np.arange(len(rows))
    ev["kind"] = EK["block_enter"]
    ev["kernel_slot"] = h["kernel_slot"][rows]
    ev["block_x"] = np.arange(len(rows)) - np.repeat(np.cumsum(h["grid_x"]) - h["grid_x"], h["grid_x"])
    ev["globaltimer"] = 10_000 + 10 * np.arange(len(rows))
    if gid:
        ev["gridid"], ev["flags"] = h["grid_id"][rows], EF["has_gridid"]
    return ev


def write(path, h, ev, *, cuts=(), drops=0, graph=False):
    """A dump whose device events are split into groups at ``cuts`` (each group a chunk of the passes)."""
    with dump.new(path) as w:
        w.write_metadata({"tool": "test", "tool_version": "0"})
        w.write_records("eager_launch", np.zeros(0, H) if graph else h)
        w.write_records("graph_node", h if graph else np.zeros(0, H))
        for k, part in enumerate(np.split(ev, list(cuts))):
            w.write_records("device_event", part, drop_count=drops if k == 0 else 0)
    return path


def windowed_equals_in_memory(path, join="ordered") -> dict:
    """The CLI's report (the chunked join) equals the in-memory join's, context and findings; returns the former."""
    r = run_cli("reconcile", path, "--json", "--join", join, "--relaxed")
    assert r.returncode in (0, 1) and r.stdout, r.stderr
    got = json.loads(r.stdout)["dumps"][0]["result"]
    with dump.open(path) as d:
        ref = reconcile.reconcile(d, options=reconcile.ReconcileOptions(join=join, relaxed=True), tables=True)
    want = json.loads(json.dumps(ref.to_dict(), default=int))
    assert got["contexts"] == want["contexts"]
    assert got["findings"] == want["findings"]
    return got


def test_ambiguous_runs_across_chunk_edges(tmp_path):
    h = launches([1] * 40)
    ev = blocks_of(h)
    keep = np.ones(len(ev), bool)
    keep[[9, 21, 22]] = False  # dropped by the device before a slot was taken: 3 drops, no sequence gap
    ev = ev[keep]
    ev["sequence"] = np.arange(len(ev))
    got = windowed_equals_in_memory(write(tmp_path / "d.kvdump", h, ev, cuts=(7, 10, 20, 30), drops=3))
    runs = got["contexts"][0]["ambiguous_runs"]
    # 3 blocks short with 3 drops: no event's launch is certain, one run over every chunk
    assert len(runs) == 1 and runs[0]["first"]["host_index"] == 0 and runs[0]["last"]["host_index"] == 39
    assert runs[0]["expected_blocks"] - runs[0]["device_events"] == 3


def test_sequence_gaps_and_other_events_across_chunk_edges(tmp_path):
    h = launches([3, 5, 2, 4, 1, 6, 2])
    ev = blocks_of(h)
    ev["sequence"] = 2 * np.arange(len(ev))  # a block exit after each entry: slots of no block
    exits = ev.copy()
    exits["sequence"] += 1
    exits["kind"] = EK["block_exit"]
    both = np.sort(np.concatenate([ev, exits]), order="sequence")
    both = np.delete(both, [10])  # a lost entry: one sequence gap in the middle of a chunk
    got = windowed_equals_in_memory(write(tmp_path / "d.kvdump", h, both, cuts=(5, 9, 12, 30)))
    c = got["contexts"][0]
    assert c["ordered"]["sequence_gaps"] == 1 and c["blocks"]["missing"] == 1
    assert [f["code"] for f in got["findings"]] == ["missing-blocks"]


def test_multistream_windows_across_chunk_edges(tmp_path):
    h = launches([2] * 24, streams=np.tile([1, 1, 2, 2], 6), exec_=0xAB)
    ev = blocks_of(h)
    got = windowed_equals_in_memory(write(tmp_path / "d.kvdump", h, ev, cuts=(3, 5, 11, 30), graph=True))
    runs = got["contexts"][0]["ambiguous_runs"]
    # one window per replay (its 4 nodes on 2 streams), the first two cut by chunk edges
    assert len(runs) == 6 and {r["reason"] for r in runs} == {"multi-stream"}
    assert [r["device_events"] for r in runs] == [8] * 6


def test_misfits_of_one_launch_in_two_chunks(tmp_path):
    h = launches([8, 8, 8])
    ev = blocks_of(h)
    ev["kernel_slot"][[10, 11, 13]] = 5  # launch 1's blocks 2, 3 and 5 carry another kernel
    got = windowed_equals_in_memory(write(tmp_path / "d.kvdump", h, ev, cuts=(12,)))
    mis = [f for f in got["findings"] if f["code"] == "ordered-misfit"]
    assert len(mis) == 1 and mis[0]["count"] == 3 and mis[0]["record"] == 10


@pytest.mark.parametrize("swaps", [[(1, 2), (5, 6)], [(5, 6)]])
def test_gridid_contradicts_the_order_in_two_chunks(tmp_path, swaps):
    """The tally after the cross-check starts at the first contradiction, in the first chunk or a later one."""
    h = launches([2, 2, 2, 2])
    ev = blocks_of(h, gid=True)
    for i, j in swaps:  # two launches' blocks swapped on the device
        ev[[i, j]] = ev[[j, i]]
    ev["sequence"] = np.arange(len(ev))
    got = windowed_equals_in_memory(write(tmp_path / "d.kvdump", h, ev, cuts=(2, 6)))
    amb = [f for f in got["findings"] if "contradicted by %gridid" in f["message"]]
    assert len(amb) == 1 and amb[0]["count"] == 2 * len(swaps) and amb[0]["record"] == swaps[0][0]


def test_auto_join_without_gridid_is_windowed(tmp_path):
    h = launches([4, 4, 4, 4])
    ev = blocks_of(h)[:-2]  # the last launch's last 2 blocks never came (no drop counted)
    got = windowed_equals_in_memory(write(tmp_path / "d.kvdump", h, ev, cuts=(3, 9)), join="auto")
    c = got["contexts"][0]
    assert c["join"] == "ordered" and c["blocks"]["late_start_blocks"] == 2


def test_surplus_and_out_of_order_events_stay_in_memory(tmp_path):
    """More events than blocks with no drop (the surplus search) and events out of sequence order in the file are
    joined in memory: the same report as before."""
    h = launches([3, 3, 3])
    ev = blocks_of(h)
    extra = ev[4:5].copy()
    extra["block_x"] = 7  # outside the grid: a surplus event
    ev = np.concatenate([ev[:5], extra, ev[5:]])
    ev["sequence"] = np.arange(len(ev))
    got = windowed_equals_in_memory(write(tmp_path / "s.kvdump", h, ev, cuts=(4,)))
    assert [f["code"] for f in got["findings"]] == ["extra-blocks"]
    ev2 = blocks_of(h)
    ev2[[2, 6]] = ev2[[6, 2]]  # file order is not sequence order
    windowed_equals_in_memory(write(tmp_path / "o.kvdump", h, ev2, cuts=(4,)))


gen = load_script(ROOT / "bench" / "gendump.py")


@pytest.mark.slow
def test_ordered_join_peak_rss_well_below_the_dump(tmp_path):
    from test_scale_rss import _peak_rss

    p = tmp_path / "big.kvdump"
    gen.write(p, gen.GenOptions(size_bytes=384 << 20, seed=3))
    rc, rss = _peak_rss("reconcile", "--join", "ordered", p, "-q")
    size = p.stat().st_size
    assert rc == 0
    # the in-memory join held every event (about 2x the dump); the window holds per-launch state and a few chunks
    assert rss < size * 0.45, f"peak RSS {rss / 2**20:.0f} MiB for a {size / 2**20:.0f} MiB dump"


def test_misfits_listed_in_report_order_not_host_order(tmp_path):
    """Misfits are found in host order (the order events are placed) and listed in report order (record order)."""
    h = launches([4, 4, 4])
    h["host_ns"] = h["host_ns"][::-1].copy()  # recorded last-launched first: host order is record 2, 1, 0
    ev = blocks_of(h[::-1].copy())
    ev["kernel_slot"][[1, 5, 9]] = 5  # one block of each launch carries another kernel
    got = windowed_equals_in_memory(write(tmp_path / "d.kvdump", h, ev, cuts=(6,)))
    mis = [f for f in got["findings"] if f["code"] == "ordered-misfit"]
    assert [f["record"] for f in mis] == [9, 5, 1]  # records 0, 1, 2: their blocks came last, middle, first
    assert all(f["count"] == 1 for f in mis)
