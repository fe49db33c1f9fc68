"""bench/gendump.py: the realistic dump generator validates and reconciles clean, is deterministic, and lays device
times microseconds after their host launches."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT, load_script
from kvconv.format import dump

gen = load_script(ROOT / "bench" / "gendump.py")


def _report(stdout: str) -> dict:
    """The one dump's report of --json (inside the CLI's envelope, docs/CLI.md, where there is one)."""
    obj = json.loads(stdout)
    if isinstance(obj.get("dumps"), list) and len(obj["dumps"]) == 1 and "result" in obj["dumps"][0]:
        return obj["dumps"][0]["result"]
    return obj


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """Two contexts, more steps than one chunk (sequence numbers and replay ids carried across chunks), block-exit
    events and canary groups."""
    p = tmp_path_factory.mktemp("gen") / "small.kvdump"
    opts = gen.GenOptions(steps=gen.STEPS_PER_CHUNK + 37, nodes=6, exits=True, canary_buffers=3, seed=5)
    totals = gen.write(p, opts)
    yield p, totals
    shutil.rmtree(p.parent, ignore_errors=True)  # 27 MB: not left in pytest's base temp folder to the session's end


def test_validates_clean(small, cli):
    p, totals = small
    r = cli("validate", p, "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    rep = _report(r.stdout)
    assert rep["findings"] == [], rep["findings"][:3]


def test_reconciles_clean(small, cli):
    p, totals = small
    r = cli("reconcile", p, "--json")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr
    rep = _report(r.stdout)
    assert rep["findings"] == []
    ctxs = rep["contexts"]
    assert len(ctxs) == 2
    # every block-enter event matched, by the exact join; exit events are the other half
    assert sum(c["device"]["matched"] for c in ctxs) * 2 == totals["device_event"]
    assert all(len(c["graph_execs"]) == 4 for c in ctxs)
    assert all(c["join"] == "exact" for c in ctxs), [c["join"] for c in ctxs]


def test_canary_clean(small, cli):
    p, totals = small
    r = cli("canary", p, "--json")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr
    res = _report(r.stdout)
    assert res["summary"]["records"] == totals["canary"] == 2 * (gen.STEPS_PER_CHUNK + 37) * 3
    assert res["findings"] == []
    # padded steps change page 0, which is excluded: the generator exercises the exclusion
    assert any(0 in s["changed"] and 0 not in s["expected"] for s in res["steps"])


def test_device_times_follow_host_launches(small):
    """Mapped through the context's clock-sync pairs, each node's first block enters 10-200 µs after its launch
    callback (the device runs behind the host's callbacks)."""
    p, _ = small
    with dump.open(p) as d:
        for ctx, _dev in d.contexts():
            cs = d.records("clock_sync", context_id=ctx)
            gn = d.records("graph_node", context_id=ctx)
            ev = d.records("device_event", context_id=ctx)
            enter = ev[(ev["kind"] == 1) & (ev["tag"] != 0)]
            host_t = np.interp(enter["globaltimer"].astype(np.float64), cs["gpu_ns"].astype(np.float64),
                               cs["host_ns"].astype(np.float64))
            key_h = {(int(g), int(t)): int(h) for g, t, h in zip(gn["grid_id"], gn["tag"], gn["host_ns"])}
            first = {}
            for g, t, h in zip(enter["gridid"], enter["tag"], host_t):
                first.setdefault((int(g), int(t)), h)
            lag = np.array([first[k] - key_h[k] for k in first])
            assert len(lag) == len(gn)
            assert lag.min() > 5_000 and lag.max() < 1_000_000, (lag.min(), lag.max())


def test_deterministic_for_a_seed(tmp_path):
    o = gen.GenOptions(steps=40, nodes=4, canary_buffers=2, seed=3)
    gen.write(tmp_path / "a.kvdump", o)
    gen.write(tmp_path / "b.kvdump", o)
    gen.write(tmp_path / "c.kvdump", gen.GenOptions(steps=40, nodes=4, canary_buffers=2, seed=4))
    a, b, c = ((tmp_path / f"{x}.kvdump").read_bytes() for x in "abc")
    assert a == b
    assert a != c


def test_command_writes_about_the_size_asked(tmp_path):
    out = tmp_path / "s.kvdump"
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "gendump.py"), "--size", "4MiB", "-o", str(out)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert 3 * 2**20 < out.stat().st_size < 5 * 2**20, out.stat().st_size
    assert r.stdout.startswith(f"wrote {out}")
    bad = subprocess.run([sys.executable, str(ROOT / "bench" / "gendump.py"), "--size", "lots", "-o", str(out)],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "not a size" in bad.stderr and "Traceback" not in bad.stderr
