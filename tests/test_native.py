"""The native tracer: its dump writer read back by kvconv.format.dump (CPU, CI), its build, the committed H200 fixtures,
and (with a GPU) a real traced run.

CPU tests build native/build/host_dump_test with `make -C native host` (g++ only) and compare every field it writes
with what kvconv.format.dump reads, so CI catches any drift between the C++ writer and the Python reader.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

from kvconv.format import dump, layout

ROOT = Path(__file__).resolve().parent.parent
NATIVE = ROOT / "native"
BUILD = NATIVE / "build"
FIX = ROOT / "fixtures"

needs_gxx = pytest.mark.skipif(shutil.which("make") is None or shutil.which(os.environ.get("CXX", "g++")) is None,
                               reason="make and g++ are needed to build the host test program")


@pytest.fixture(scope="module")
def host_build(tmp_path_factory):
    """native/'s host test programs (host_dump_test, live_test), built once for this module's tests."""
    build = tmp_path_factory.mktemp("native-build")
    p = subprocess.run(["make", "-C", str(NATIVE), "host", f"BUILD={build}"], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    return build


@pytest.fixture(scope="module")
def host_dump(host_build):
    build = host_build
    out = build / "synthetic.kvdump"
    r = subprocess.run([str(build / "host_dump_test"), str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return out, r.stdout


@needs_gxx
def test_host_writer_groups_and_headers(host_dump):
    path, _ = host_dump
    raw = path.read_bytes()
    with dump.open(path) as d:
        assert [g.kind_name for g in d.groups] == ["metadata"] + ["strings", "kernel", "clock_sync", "device_event",
                                                                  "graph_node", "eager_launch"] * 2
        assert d.contexts() == [(0, 0), (1, 1)]
        for g in d.groups:
            hdr = raw[g.offset:g.offset + 64]
            assert hdr[:8] == b"KVCDUMP\0"
            assert int.from_bytes(hdr[60:64], "little") == zlib.crc32(hdr[:60])
            assert g.major == layout.MAJOR and g.minor == layout.group_minor(g.flags) == 0
            assert g.header_size == 64 and g.flags == 0
            assert g.crc_ok()
            assert g.payload_offset % 8 == 0
        ev = d.groups_of("device_event", context_id=0)[0]
        assert (ev.capacity, ev.drop_count, ev.clock_domain_name) == (16, 1, "gpu_globaltimer")
        gn = d.groups_of("graph_node", context_id=0)[0]
        assert (gn.capacity, gn.drop_count, gn.clock_domain_name) == (8, 0, "host_monotonic")
    assert raw[-1:] is not None and len(raw) % 8 == 0


@needs_gxx
def test_host_writer_records(host_dump):
    path, _ = host_dump
    with dump.open(path) as d:
        meta = d.metadata()
        assert meta["tool"] == "kvconv-tracer" and meta["producer"] == 'host "test"\n'
        assert meta["counters"]["device_event_drops"] == 1
        assert d.kernel_names(context_id=0) == {1: "reshape_and_cache_flash_kernel"}
        ev = d.records("device_event", context_id=0)
        assert ev["sequence"].tolist() == list(range(7))
        assert ev["gridid"].tolist() == [5, 5, 5, 7, 8, 7, 8]
        assert ev["tag"].tolist() == [0, 0, 0, 1, 1, 2, 2]
        assert ev["block_x"].tolist() == [0, 1, 2, 0, 0, 0, 0]
        assert set(ev["kind"].tolist()) == {layout.ENUMS["event_kind"]["block_enter"]}
        assert ev["flags"].tolist() == [1, 1, 1, 3, 3, 3, 3]
        assert (np.diff(ev["globaltimer"].astype(np.int64)) == 1000).all()
        gn = d.records("graph_node", context_id=0)
        assert gn["launch_id"].tolist() == [1, 1, 2, 2]
        assert gn["node"].tolist() == [0x2001, 0x2002, 0x2001, 0x2002]
        assert gn["grid_id"].tolist() == [7, 8, 7, 8]
        assert gn["tag"].tolist() == [1, 1, 2, 2]
        assert set(gn["flags"].tolist()) == {layout.ENUMS["launch_flags"]["graph_node"]
                                             | layout.ENUMS["launch_flags"]["has_tag"]}
        el = d.records("eager_launch", context_id=1)
        assert el[["grid_x", "grid_y", "grid_z", "block_dim_x", "grid_id"]].tolist() == [(3, 1, 1, 128, 5)]
        cs = d.records("clock_sync", context_id=0)
        assert cs["flags"].tolist() == [1, 2, 4] and cs["uncertainty_ns"].tolist() == [1500, 1501, 1502]
        assert len(d.records("device_event", context_id=1)) == 3


@needs_gxx
def test_host_writer_helpers(host_dump):
    _, out = host_dump
    lines = dict(line.split(" ", 1) for line in out.strip().splitlines())
    assert lines["expand"] == "out-42-3-%.bin"
    assert lines["writable-missing-dir"] == "error"
    assert lines["crc"] == "cbf43926"  # CRC-32 check value of "123456789", as zlib computes it


@needs_gxx
def test_host_writer_validates(host_dump):
    path, _ = host_dump
    from kvconv.check.validate import validate

    rep = validate(path)
    # the synthetic dump drops one device event on purpose: that, and nothing structural, is what validate reports
    codes = {f.code for f in rep.findings if f.severity == "error"}
    assert codes == {"dropped"}, [f.line() for f in rep.findings]


def _tracer_deps() -> bool:
    p = subprocess.run(["make", "-s", "-C", str(NATIVE), "info"], capture_output=True, text=True)
    info = dict(line.split("=", 1) for line in p.stdout.splitlines() if "=" in line)
    return bool(info.get("SANITIZER_LIB") and info.get("CUDA_H_DIR"))


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("make") is None or shutil.which("g++") is None, reason="no make/g++")
def test_tracer_library_builds(tmp_path):
    if not _tracer_deps():
        pytest.skip("sanitizer headers/lib or cuda.h not found (pip install nvidia-cuda-sanitizer-api==13.0.* "
                    "nvidia-cuda-runtime==13.0.*)")
    p = subprocess.run(["make", "-C", str(NATIVE), f"BUILD={tmp_path}", str(tmp_path / "libkvconv_tracer.so")],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    syms = subprocess.run(["nm", "-D", "--defined-only", str(tmp_path / "libkvconv_tracer.so")], capture_output=True,
                          text=True).stdout
    assert " InitializeInjection" in syms
    if shutil.which("nvcc") or Path("/usr/local/cuda-13.0/bin/nvcc").exists():
        p = subprocess.run(["make", "-C", str(NATIVE), f"BUILD={tmp_path}", str(tmp_path / "kvconv_patch.fatbin")],
                           capture_output=True, text=True)
        assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]


# ---------------------------------------------------------------------------------------------- committed H200 runs
def _reconcile(path, join="auto"):
    from kvconv.check import reconcile

    with dump.open(path) as d:
        res = reconcile.reconcile(d, options=reconcile.ReconcileOptions(join=join))
        return res, d.metadata()


@pytest.mark.parametrize("path", ["h200-single/single.kvdump", "h200-twostream/twostream.kvdump",
                                  "h200-twoproc/procA.kvdump", "h200-twoproc/procB.kvdump"])
def test_h200_fixture_agreement(path):
    res, meta = _reconcile(FIX / path)
    assert res.ok
    assert "280 graph-node records = 280 expected executions = 280 device events, 0 drops" in res.agreement_line()
    m = res.matches
    assert len(m) == 1760 and (m["host_index"] >= 0).all() and (m["join"] == 1).all()  # every event, exact join
    c = meta["counters"]
    assert c["device_event_drops"] == c["graph_node_table_drops"] == c["eager_table_drops"] == 0
    assert c["sanitizer_errors"] == 0 and c["target_launches"] == 320


@pytest.mark.parametrize("path", ["h200-single/single.kvdump", "h200-twostream/twostream.kvdump",
                                  "h200-enter-exit-learned/enter-exit.kvdump"])
def test_h200_learned_graph_exec(tmp_path, path):
    """Re-recorded with the tracer of issue 15 (one and two streams, block enter and exit): the graph exec is learned
    in its first replay (node callbacks, per-launch data for 40 nodes), replays 2..7 come from one graph-launch callback
    each (a tag cell written on the launch stream, the 40 learned records appended with that replay's launch id and
    time), and the exact join still matches every event."""
    from conftest import run_cli

    with dump.open(FIX / path) as d:
        c = d.metadata()["counters"]
        gn = d.records("graph_node")
    assert (c["graph_execs_learned"], c["graph_execs_per_node"], c["graph_learn_failures"]) == (1, 0, 0)
    assert c["launch_data_set"] == 40 and c["graph_replays_from_learned_nodes"] == c["tag_cells_written"] == 6
    assert (gn["flags"] & 8).all() and (gn["tag"] == gn["launch_id"]).all()  # has_tag on every record
    for rid in range(1, 8):
        rows = gn[gn["launch_id"] == rid]
        assert len(rows) == 40 and sorted(rows["grid_id"]) == sorted(gn[gn["launch_id"] == 1]["grid_id"])
        # replay 1 observed node by node (40 callback times); the learned replays share their launch callback's time
        assert len(set(rows["host_ns"].tolist())) == (40 if rid == 1 else 1)
    src = FIX / path
    (tmp_path / src.name).write_bytes(src.read_bytes())
    r = run_cli("reconcile", src.name, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "280 graph-node records = 280 expected executions = 280 device events, 0 drops" in r.stdout
    assert "1,760 matched to a launch, 0 unmatched" in r.stdout


def test_h200_first_launch_fully_covered():
    with dump.open(FIX / "h200-single/single.kvdump") as d:
        el = d.records("eager_launch")
        ev = d.records("device_event")
        first = el[np.argsort(el["host_ns"])[0]]
        n = int(((ev["gridid"] == first["grid_id"]) & (ev["tag"] == 0)).sum())
        assert n == int(first["grid_x"]) == 37


def test_h200_twostream_needs_exact_join():
    exact, _ = _reconcile(FIX / "h200-twostream/twostream.kvdump", "exact")
    ordered, _ = _reconcile(FIX / "h200-twostream/twostream.kvdump", "ordered")
    differ = exact.matches["host_index"] != ordered.matches["host_index"]
    # 230 events land out of host order on the device (126 in the first recording, before issue 15); forced ordered,
    # the join withdraws their node (it cannot know it) and says so, instead of giving them to the wrong node.
    assert int(differ.sum()) == 230
    assert (ordered.matches["host_index"][differ] == -1).all()
    assert (ordered.matches["replay"][differ] == exact.matches["replay"][differ]).all()
    amb = [f for f in ordered.findings if f.code == "ordered-ambiguous"]
    assert len(amb) == 1 and amb[0].count == 230


# ---------------------------------------------------------------------------------------------- GPU
@pytest.mark.gpu
@pytest.mark.slow
def test_gpu_traced_workload(tmp_path):
    p = subprocess.run(["make", "-C", str(NATIVE), "tracer"], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    out = tmp_path / "run.kvdump"
    env = dict(os.environ, CUDA_INJECTION64_PATH=str(BUILD / "libkvconv_tracer.so"), KVCONV_OUTPUT=str(out))
    r = subprocess.run([sys.executable, str(NATIVE / "workloads" / "kv_decode.py"), "--streams", "2"], env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout.strip().splitlines()[-1])["check_ok"]
    res, meta = _reconcile(out)
    assert res.ok and "280 graph-node records = 280 expected executions = 280 device events, 0 drops" in \
        res.agreement_line()


# --------------------------------------------------------------------------------------------- the live dump (issue 20)
# H200 runs of native/workloads/die.py under the tracer (native/scripts/gpu_death.sh): one per way a process can end.
# The first three and the CUDA error end through the tracer's exit path (a finished dump); os._exit, abort(), SIGSEGV
# and SIGKILL leave the live file the tracer kept valid while running (stored gzipped: it is sparse, 3.7 MB of holes).
DEATHS = ["normal", "exit-code", "exception", "os-exit", "abort", "sigsegv", "sigkill", "illegal-address"]
LIVE_ENDS = {"os-exit", "abort", "sigsegv", "sigkill"}


def _death_dump(case: str, tmp_path: Path) -> Path:
    import gzip

    d = FIX / f"h200-death-{case}"
    out = tmp_path / f"h200-death-{case}.kvdump"
    gz = d / (out.name + ".gz")
    out.write_bytes(gzip.decompress(gz.read_bytes()) if gz.exists() else (d / out.name).read_bytes())
    return out


@pytest.mark.parametrize("case", DEATHS)
def test_h200_death_leaves_every_event(case, tmp_path):
    from conftest import run_cli

    path = _death_dump(case, tmp_path)
    launched = json.loads((FIX / f"h200-death-{case}" / "workload.stdout.json").read_text())["expected"]
    r = run_cli("validate", path.name, cwd=tmp_path)
    assert r.stdout == (FIX / f"h200-death-{case}" / "expected" / "validate.txt").read_text()
    assert r.returncode == (5 if case in LIVE_ENDS else 0), r.stdout + r.stderr  # 5: incomplete (codes.json)
    d = dump.scan(path)  # scan: problems collected, not raised or warned
    assert [p.code for p in d.problems] == (["unfinished"] if case in LIVE_ENDS else [])
    assert any(g.live for g in d.groups) == (case in LIVE_ENDS)
    assert all(g.minor == (1 if g.live else 0) for g in d.groups)  # format 1.1: live groups say minor 1
    assert len(d.records("device_event")) == launched["device_events"] == 160
    assert len(d.records("graph_node")) == launched["graph_node_records"]
    assert len(d.records("eager_launch")) == launched["eager_launches"]
    assert d.drops("device_event") == d.drops("graph_node") == d.drops("eager_launch") == 0
    d.close()
    if case in LIVE_ENDS:
        with pytest.warns(dump.DumpWarning, match="did not finish"):
            res, meta = _reconcile(path)
    else:
        res, meta = _reconcile(path)
    assert res.ok and len(res.matches) == 160 and (res.matches["join"] == 1).all()
    assert meta["written_at"] == ("live" if case in LIVE_ENDS else "process-exit")
    if case == "illegal-address":  # the context was dead at exit: the drop count is the launched-blocks bound
        assert meta["counters"]["device_state_unreadable"] == 1


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("case", DEATHS)
def test_gpu_every_end_leaves_every_event(case, tmp_path):
    """On a GPU, with the tracer as built: each end of native/workloads/die.py leaves a dump that validates with every
    event the workload launched (the same checks as the committed H200 fixtures above, on a fresh run)."""
    p = subprocess.run(["make", "-C", str(NATIVE), "tracer"], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    out = tmp_path / f"{case}.kvdump"
    env = dict(os.environ, CUDA_INJECTION64_PATH=str(BUILD / "libkvconv_tracer.so"), KVCONV_OUTPUT=str(out),
               KVCONV_DEVICE_CAPACITY="4096", KVCONV_HOST_CAPACITY="1024")
    r = subprocess.run([sys.executable, str(NATIVE / "workloads" / "die.py"), case, "--layers", "4", "--replays", "3"],
                       env=env, capture_output=True, text=True, timeout=300)
    launched = json.loads(next(ln for ln in r.stdout.splitlines() if '"workload"' in ln))["expected"]
    assert out.exists(), f"{case}: exit {r.returncode}, no dump\n{r.stderr[-2000:]}"
    from conftest import run_cli

    v = run_cli("validate", out)
    assert v.returncode == 0, v.stdout + v.stderr
    d = dump.scan(out)
    assert [p.code for p in d.problems] == (["unfinished"] if case in LIVE_ENDS else [])
    assert len(d.records("device_event")) == launched["device_events"]
    assert len(d.records("graph_node")) == launched["graph_node_records"]
    assert len(d.records("eager_launch")) == launched["eager_launches"]
    assert all(g.minor == (1 if g.live else 0) for g in d.groups)
    d.close()


@pytest.fixture(scope="module")
def live_test(host_build):
    return host_build / "live_test"


def _live_prefix(path: Path) -> dict:
    """The file as a reader sees it after the writer died: structurally valid, every published record whole."""
    d = dump.scan(path)
    assert [p.code for p in d.problems if p.code != "unfinished"] == [], [p.line() for p in d.problems]
    out = {}
    for g in d.groups:
        # format 1.1: the live flag is minor 1's; a newer kind (the write canary's: 2) keeps its own
        assert g.minor == layout.group_minor(g.flags, g.kind_name) == max(g.live, layout.group_minor(0, g.kind_name))
        r, key = g.records, (g.context_id, g.kind_name)
        if g.kind_name == "device_event":
            n = np.arange(len(r), dtype=np.uint64)
            assert (r["sequence"] == n).all() and (r["globaltimer"] == 1000 + n).all() and (r["kind"] == 1).all()
        elif g.kind_name == "graph_node":
            assert (r["node"] == 7 * r["grid_id"] + r["tag"]).all() and (r["flags"] == 9).all()  # no torn row
        elif g.kind_name == "kernel":
            s = d.groups[g.index - 1]
            assert s.kind_name == "strings" and all(int(k["module_off"] + k["module_len"]) <= len(s.records)
                                                    for k in r)
        elif g.kind_name == "metadata":
            # written whole at creation; its length holds the writer's pid, whose digit count differs between the
            # processes compared below (pids pass 9,999 during a CI run): checked here, not counted
            assert isinstance(json.loads(bytes(r))["pid"], int)
            continue
        out[key] = (len(r), g.drop_count)
    d.close()
    return out


@needs_gxx
def test_live_file_valid_after_death_at_every_step(live_test, tmp_path):
    path = tmp_path / "live.kvdump"
    p = subprocess.run([str(live_test), "steps", str(path)], capture_output=True, text=True, check=True)
    words = p.stdout.split()
    steps = int(words[1])
    # the tracer's flusher populates the file pages the tables write next (MADV_POPULATE_WRITE, Linux 5.14+), so
    # that appends take no page fault; live_test populates before every launch and the file must stay as checked
    if tuple(int(x) for x in os.uname().release.split("-")[0].split(".")[:2]) >= (5, 14):
        assert words[2:] == ["populate", "1"], p.stdout
    full = _live_prefix(path)
    assert full[(0, "device_event")] == (36, 0) and full[(0, "graph_node")] == (12, 0)
    assert full[(1, "device_event")] == (12, 0) and full[(1, "kernel")] == (1, 0)
    before = {}
    for k in range(1, steps + 1):
        path.unlink(missing_ok=True)
        r = subprocess.run([str(live_test), "die-at", str(k), str(path)], capture_output=True)
        assert r.returncode == -9, (k, r.stderr)
        now = _live_prefix(path)
        for key, (n, drops) in now.items():
            assert n >= before.get(key, (0, 0))[0], (k, key)  # what was published stays published
            if key[1] == "device_event":  # every launched block is in the file or counted as possibly lost
                assert n + drops >= 3 * now.get((key[0], "graph_node"), (0, 0))[0], (k, key, now)
        before = now
    # the last step dies between publishing a batch and taking it off the possibly-lost count: an upper bound
    assert {k: n for k, (n, _) in before.items()} == {k: n for k, (n, _) in full.items()}


@needs_gxx
def test_live_file_holds_what_was_published_not_the_reservation(live_test, tmp_path):
    """Issue 49: a live dump reserving the default 2 GiB device buffer, killed after 2,559 events, was a 2 GiB
    file. The last group's reservation is not on disk: the file grows as records are published."""
    path = tmp_path / "big.kvdump"
    r = subprocess.run([str(live_test), "big", "2560", str(path)], capture_output=True, text=True)
    assert r.returncode == -9 and r.stdout.split() == ["published", "2559"], (r.returncode, r.stdout, r.stderr)
    st = path.stat()
    # 20 MiB of host-row and slot-write reservations (sparse holes) + what was published + one chunk; on disk: less
    assert st.st_size < 32 << 20, st.st_size
    assert st.st_blocks * 512 < 4 << 20, st.st_blocks
    got = _live_prefix(path)
    assert got[(0, "device_event")] == (2559, 0) and got[(0, "graph_node")] == (853, 0)
    assert got[(0, "cache")] == (1, 0) and got[(0, "slot_write")] == (853, 0)
    d = dump.scan(path)  # the write canary's live groups keep their kinds' minor (2), the live flag's is 1
    assert {g.kind_name: g.minor for g in d.groups if g.live and g.kind_name in ("cache", "slot_write")} == {
        "cache": 2, "slot_write": 2}
    d.close()
    from kvconv.capture.seal import seal

    assert seal(str(path)) == "sealed"  # record's sealing reads it as before: the same records, finished
    d = dump.scan(path)
    assert not any(g.live for g in d.groups) and len(d.records("device_event")) == 2559, [p.line() for p in d.problems]
    assert len(d.records("slot_write")) == 853 and (d.records("slot_write")["page"] == np.arange(853)).all()
    d.close()


@needs_gxx
@pytest.mark.parametrize("delay", [0.02, 0.1, 0.3])
def test_live_file_valid_after_sigkill_from_outside(live_test, tmp_path, delay):
    import signal
    import time

    path = tmp_path / "live.kvdump"
    p = subprocess.Popen([str(live_test), "threads", "3", str(path)], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    time.sleep(delay)
    p.send_signal(signal.SIGKILL)
    p.wait()
    got = _live_prefix(path)
    assert got[(0, "graph_node")][0] > 0 and got[(0, "device_event")][0] > 0


def _store_kvcache_dump(path: Path, *, drop_v: bool = False) -> dict:
    """A dump shaped as native/workloads/store_kvcache49.cu's under --writes (2 layers, 2 launches of 3 blocks: each
    block stores its token's slot in layer l's K and V buffer), for its GPU step's checker."""
    from kvconv.format import layout

    def recs(kind, n):
        return np.zeros(n, dtype=layout.kind_dtype(layout.KINDS[kind]))

    caches = recs("cache", 4)
    for i, name in enumerate(["L0.k", "L0.v", "L1.k", "L1.v"]):
        caches[i]["cache_id"], caches[i]["slot_bytes"], caches[i]["page_size"] = i, 2048, 1
        caches[i]["name"] = name.encode()
    ev, sw = recs("device_event", 6), recs("slot_write", 12)
    for b in range(6):
        layer, gid = b // 3, 100 + b // 3
        ev[b]["gridid"], ev[b]["block_x"], ev[b]["sequence"] = gid, b % 3, b
        for j, cid in enumerate((2 * layer, 2 * layer + 1)):
            r = sw[2 * b + j]
            r["gridid"], r["block_x"], r["cache_id"], r["page"], r["stores"] = gid, b % 3, cid, b, 128
    if drop_v:
        sw = sw[:-1]
    steps = recs("write_step", 2)
    with dump.new(path) as w:
        w.write_metadata({"tool": "kvconv-tracer", "tool_version": "t", "writes": {"asked": True}})
        for kind, r in (("device_event", ev), ("cache", caches), ("slot_write", sw), ("write_step", steps)):
            w.write_records(kind, r)
    return {"blocks": 6, "slot_writes": 12, "caches": 4, "steps": 2}


def test_gpu_writes49_checker_fails_on_a_block_missing_a_slot(tmp_path):
    """The issue-49 GPU step's checker (native/workloads/check_writes49.py) passes a dump in which every block
    recorded its K and V slot, and fails the same dump with one V record gone."""
    from conftest import load_script

    chk = load_script(ROOT / "native" / "workloads" / "check_writes49.py")
    good = tmp_path / "good.kvdump"
    want = _store_kvcache_dump(good)
    with dump.open(good) as d:
        assert chk._check_records(d, want) == "12 slot writes, 6 blocks, 2 each (K and V of one layer)"
    bad = tmp_path / "bad.kvdump"
    _store_kvcache_dump(bad, drop_v=True)
    with dump.open(bad) as d, pytest.raises(AssertionError, match="11 slot_write records, expected 12"):
        chk._check_records(d, want)


@pytest.mark.gpu
@pytest.mark.slow
def test_gpu_finished_dump_says_what_it_holds(tmp_path):
    """issue 48: the tracer's finished dump (write recording on: its groups gathered through a scratch dump) counts
    every group after its metadata in ``holds``, exactly; no scratch file is left; a cut at any group boundary is
    unreadable (cut-short), with --salvage never valid."""
    from conftest import run_cli

    p = subprocess.run(["make", "-C", str(NATIVE), "tracer"], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    out = tmp_path / "writes.kvdump"
    env = dict(os.environ, KVCONV_WRITES="1")
    r = subprocess.run([sys.executable, "-m", "kvconv", "record", "-o", str(out), "--", sys.executable,
                        str(NATIVE / "workloads" / "kv_writes.py"), "--plant", "none", "--json",
                        str(tmp_path / "planted.json")], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert sorted(x.name for x in tmp_path.iterdir()) == ["planted.json", "writes.kvdump"]
    with dump.open(out) as d:
        holds, groups = d.metadata()["holds"], d.groups[1:]
        kinds = {}
        for g in groups:
            k = kinds.setdefault(g.kind_name, {"groups": 0, "records": 0})
            k["groups"] += 1
            k["records"] += len(g.records)
        ends = [g.offset for g in groups]
    assert holds == {"groups": len(groups), "kinds": kinds} and "slot_write" in kinds, holds
    raw = out.read_bytes()
    for at in ends:
        out.write_bytes(raw[:at])
        v = run_cli("validate", out)
        assert v.returncode == 2 and "cut-short" not in v.stdout and "metadata.holds" in v.stderr, v.stderr
        v = run_cli("validate", "--salvage", out)
        assert v.returncode in (1, 4, 5), v.stdout
