"""Durations from block exits in the three outputs, on fixtures/h200-enter-exit (recorded with --events
enter,exit), against an independent pairing of the dump's events here; enter-only dumps keep their instants."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import numpy as np
import pyarrow.dataset as ds
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

from conftest import run_cli, track_paths
from kvconv.format import dump, layout

ROOT = Path(__file__).resolve().parent.parent
EE = ROOT / "fixtures/h200-enter-exit/enter-exit.kvdump"
ENTER = layout.ENUMS["event_kind"]["block_enter"]


def _independent():
    """Per block (gridid, tag, SM, blockIdx), entry to exit in sequence order; per launch (gridid, tag), first
    entry to last exit: (sorted block durations, sorted launch durations)."""
    with dump.open(EE) as d:
        ev = np.concatenate([g.records for g in d.groups_of("device_event")])
    ev = ev[np.argsort(ev["sequence"], kind="stable")]
    open_, blocks, lo, hi = defaultdict(list), [], {}, {}
    for e in ev:
        key = (int(e["gridid"]), int(e["tag"]), int(e["smid"]), int(e["block_x"]), int(e["block_y"]), int(e["block_z"]))
        t, launch = int(e["globaltimer"]), key[:2]
        if int(e["kind"]) == ENTER:
            open_[key].append(t)
            lo[launch] = min(lo.get(launch, t), t)
        else:
            blocks.append(t - open_[key].pop(0))
            hi[launch] = max(hi.get(launch, t), t)
    return sorted(blocks), sorted(hi[k] - lo[k] for k in lo)


def _slices_per_track(trace: pb.Trace):
    """Per track uuid: (begin ts, end ts) of its slices, checking that begins and ends balance and nest."""
    out, stacks = defaultdict(list), defaultdict(list)
    events = sorted((p.timestamp, 0 if p.track_event.type == 2 else 1, p.track_event.track_uuid, p.track_event.type)
                    for p in trace.packet if p.HasField("track_event") and p.track_event.type in (1, 2))
    for ts, _, track, typ in events:
        if typ == 1:
            stacks[track].append(ts)
        else:
            assert stacks[track], f"end without begin on track {track}"
            out[track].append((stacks[track].pop(), ts))
    assert not any(stacks.values()), "slices left open"
    return out


def test_block_and_kernel_durations_in_every_output(tmp_path):
    blocks, launches = _independent()
    assert len(blocks) == 1760 and len(launches) == 320
    r = run_cli("perfetto", EE, "-o", tmp_path / "t.pftrace", "-q")
    assert r.returncode == 0, r.stderr
    t = pb.Trace()
    t.ParseFromString((tmp_path / "t.pftrace").read_bytes())
    paths, sl = track_paths(t), _slices_per_track(t)
    sm = sorted(e - b for u, v in sl.items() if "device blocks / SM" in paths[u] for b, e in v)
    kern = sorted(e - b for u, v in sl.items() if "kernels" in paths[u] for b, e in v)
    assert sm == blocks and kern == launches
    r = run_cli("chrome", EE, "-o", tmp_path / "t.json", "-q")
    assert r.returncode == 0, r.stderr
    ev = json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    got = sorted(round(e["dur"] * 1000) for e in ev if e.get("cat") == "block")
    assert got == blocks
    assert sorted(round(e["dur"] * 1000) for e in ev if e.get("cat") == "kernel") == launches
    r = run_cli("arrow", EE, "-o", tmp_path / "tables", "-q")
    assert r.returncode == 0, r.stderr
    lt = ds.dataset(tmp_path / "tables/launch", format="arrow", partitioning="hive").to_table()
    assert sorted(lt["duration_ns"].to_pylist()) == launches
    assert sum(lt["blocks_recorded"].to_pylist()) == 1760


def test_enter_only_dumps_keep_their_instants(tmp_path):
    r = run_cli("perfetto", ROOT / "fixtures/qwen3-14b/qwen3-14b.kvdump", "-o", tmp_path / "q.pftrace", "-q")
    assert r.returncode == 0, r.stderr
    t = pb.Trace()
    t.ParseFromString((tmp_path / "q.pftrace").read_bytes())
    paths = track_paths(t)
    types = {p.track_event.type for p in t.packet
             if p.HasField("track_event") and "device blocks" in paths.get(p.track_event.track_uuid, "")}
    assert types == {3}
    assert not any("kernels" in v for v in paths.values())
