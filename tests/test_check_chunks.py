"""validate reads the device events chunk by chunk (``kvconv.check.validate_events.EV_CHUNK`` events at a time) and
checks blockIdx once per run of one launch's events: what it finds at a chunk's edge, or inside a launch's run, is
what it finds anywhere else. Through the real CLI, on dumps of three chunks."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import run_cli
from kvconv.check.validate_events import EV_CHUNK
from kvconv.format import dump, layout

PER = 256  # blocks per launch: its events come in one run
N = 3 * EV_CHUNK


def make(path, mutate=None):
    """N block-enter events of N / PER graph-node launches (gridid + tag), in sequence order, 1 us apart."""
    n_hosts = N // PER
    h = np.zeros(n_hosts, dtype=layout.DTYPES["host_launch"])
    h["graph_exec"] = 0xE0
    h["launch_id"] = np.arange(n_hosts) // 16 + 1
    h["node"] = 0x1000 + np.arange(n_hosts) % 16
    h["grid_id"] = 100 + np.arange(n_hosts)
    h["tag"] = h["launch_id"]
    h["host_ns"] = 10**9 + np.arange(n_hosts) * 1000
    h["grid_x"], h["grid_y"], h["grid_z"] = PER, 1, 1
    h["block_dim_x"], h["block_dim_y"], h["block_dim_z"] = 128, 1, 1
    h["kernel_slot"] = 1
    h["flags"] = layout.ENUMS["launch_flags"]["graph_node"] | layout.ENUMS["launch_flags"]["has_tag"]
    e = np.zeros(N, dtype=layout.DTYPES["device_event"])
    launch = np.arange(N) // PER
    e["sequence"] = np.arange(N)
    e["globaltimer"] = 5_000_000_000 + 1024 * np.arange(N, dtype=np.uint64)
    e["gridid"], e["tag"] = h["grid_id"][launch], h["tag"][launch]
    e["block_x"] = np.arange(N) % PER
    e["kernel_slot"] = 1
    e["kind"] = layout.ENUMS["event_kind"]["block_enter"]
    e["flags"] = layout.ENUMS["event_flags"]["has_gridid"] | layout.ENUMS["event_flags"]["has_tag"]
    if mutate:
        mutate(e)
    st = dump.StringTable()
    k = np.zeros(1, dtype=layout.DTYPES["kernel"])
    k["slot"] = 1
    k["name_off"], k["name_len"] = st.add("reshape_and_cache_flash_kernel")
    with dump.new(path) as w:
        w.write_metadata({"tool": "test", "tool_version": "0", "counters": {"fatal_count": 0}})
        w.write_strings(st)
        w.write_records("kernel", k)
        w.write_records("graph_node", h)
        w.write_records("device_event", e)
    return path


def findings(path, *args) -> dict:
    r = run_cli("validate", "--json", *args, path)
    assert r.returncode in (0, 1), r.stderr
    return {f["code"]: f for f in json.loads(r.stdout)["dumps"][0]["result"]["findings"]}


def test_three_chunks_validate_and_reconcile_clean(tmp_path):
    r = run_cli("validate", make(tmp_path / "d.kvdump"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 errors" in r.stdout and "0 warnings" in r.stdout


@pytest.mark.parametrize("at", [EV_CHUNK, EV_CHUNK + 1, 2 * EV_CHUNK - 1])
def test_timer_step_back_at_and_near_a_chunk_edge(tmp_path, at):
    def mutate(e):
        e["globaltimer"][at] = int(e["globaltimer"][at - 1]) - 65_536  # beyond any race between blocks

    f = findings(make(tmp_path / "d.kvdump", mutate), "--no-reconcile")
    assert f["timer-backwards"]["record"] == at and f["timer-backwards"]["count"] == 1
    assert "sequence-gap" not in f


def test_sequence_gap_at_a_chunk_edge(tmp_path):
    def mutate(e):
        e["sequence"][EV_CHUNK:] += 1  # one event lost just where the second chunk begins

    f = findings(make(tmp_path / "d.kvdump", mutate), "--no-reconcile")
    assert f["sequence-gap"]["record"] == EV_CHUNK and f["sequence-gap"]["count"] == 1


@pytest.mark.parametrize("at", [EV_CHUNK + 100, EV_CHUNK - 1, 2 * EV_CHUNK])
def test_block_outside_its_grid_inside_a_launchs_run(tmp_path, at):
    def mutate(e):
        e["block_x"][at] = PER + 5
        e["block_x"][at + 3 * PER] = PER  # a later launch too: one finding, both counted

    f = findings(make(tmp_path / "d.kvdump", mutate))
    assert f["block-outside-grid"]["record"] == at and f["block-outside-grid"]["count"] == 2
    assert f["block-outside-grid"]["field"] == "device_event.block_x"


# validate checks flags, kernel slots and kinds once per run of one launch's events (kvconv.join.runs): a bad value
# on one event inside a long run splits the run there, so the finding still names that event and counts every one.
_BAD_KIND = max(layout.ENUMS["event_kind"].values()) + 1
_BAD_FLAG = 0x80
assert not _BAD_FLAG & sum(layout.ENUMS["event_flags"].values())


@pytest.mark.parametrize(("code", "column", "value"), [
    ("bad-flags", "flags", layout.ENUMS["event_flags"]["has_gridid"] | layout.ENUMS["event_flags"]["has_tag"]
     | _BAD_FLAG),
    ("unknown-kernel-slot", "kernel_slot", 7),
    ("bad-enum", "kind", _BAD_KIND),
])
def test_one_bad_event_inside_a_launchs_run(tmp_path, code, column, value):
    at = (EV_CHUNK + 2 * PER + 17, 2 * EV_CHUNK + 5 * PER + 200)  # mid-run, in the second and third chunk

    def mutate(e):
        e[column][list(at)] = value

    f = findings(make(tmp_path / "d.kvdump", mutate), "--no-reconcile")
    assert f[code]["record"] == at[0] and f[code]["count"] == 2, f[code]
    assert f[code]["field"] == f"device_event.{column}"
