"""Emitter benchmarks: ratios against the obvious paths, measured in one run.

    .venv/bin/python bench/bench_emit.py                 # 1,048,576 device events + 65,536 host records
    .venv/bin/python bench/bench_emit.py --rss 10        # also peak RSS of each emitter on a generated 10 GiB dump
    .venv/bin/python bench/bench_emit.py --baseline-events 131072

Baselines (perfetto's TraceProtoBuilder with one TracePacket per device event; ``json.dump`` of one dict per device
event) run on the first ``--baseline-events`` events and are scaled to events/s; their output is checked to decode
to the same packets / events as ours for those events. Our emitters run end to end on the whole dump (open,
reconcile, both passes, host records, slices, counters, the file write).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from kvconv import dump  # noqa: E402
from kvconv.emit import EmitOptions, write_arrow, write_chrome, write_perfetto  # noqa: E402

_spec = importlib.util.spec_from_file_location("make_synthetic", ROOT / "fixtures/synthetic-multi/make_synthetic.py")
synth = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(synth)


def _out() -> Path:
    p = ROOT / "bench" / "out"  # git-ignored
    p.mkdir(parents=True, exist_ok=True)
    return p


def timed(f, *a, **k):
    t = time.perf_counter()
    r = f(*a, **k)
    return time.perf_counter() - t, r


def baseline_perfetto(ev, n, K=16):
    from perfetto.trace_builder.proto_builder import TraceProtoBuilder

    gn_seen = Counter()
    b = TraceProtoBuilder()
    for i in range(n):
        r = ev[i]
        p = b.add_packet()
        p.timestamp = int(r["globaltimer"])
        p.trusted_packet_sequence_id = 2
        p.sequence_flags = 2
        e = p.track_event
        a = e.debug_annotations.add()
        a.name_iid = 1
        a.uint_value = int(r["block_x"])
        e.type = 3
        e.name_iid = 1
        e.track_uuid = (1 << 24) + 0x10000 + int(r["smid"])
        g = int(r["gridid"])
        gn_seen[g] += 1
        if gn_seen[g] <= K:
            e.terminating_flow_ids.append((1 << 40) | i)
    return b.serialize()


def baseline_chrome(ev, n, pid=1, name="k"):
    out = []
    for i in range(n):
        r = ev[i]
        out.append({"ph": "X", "pid": pid, "tid": 0x10000 + int(r["smid"]), "ts": int(r["globaltimer"]) / 1000,
                    "dur": 0, "name": name, "cat": "block",
                    "args": {"block": [int(r["block_x"]), int(r["block_y"]), int(r["block_z"])],
                             "seq": int(r["sequence"])}})
    with open(os.devnull, "w") as f:
        json.dump({"displayTimeUnit": "ns", "traceEvents": out}, f)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=1 << 20)
    ap.add_argument("--host", type=int, default=65536)
    ap.add_argument("--baseline-events", type=int, default=1 << 17)
    ap.add_argument("--rss", type=float, default=0, help="GiB of a generated dump for the peak-RSS runs (0: skip)")
    ap.add_argument("--rss-only", action="store_true", help="skip the ratio runs")
    ap.add_argument("--dir", default=None, help="scratch folder (default: a temporary folder beside the repo)")
    ap.add_argument("--child", nargs=3, metavar=("EMITTER", "DUMP", "OUT"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        em, src, out = a.child
        f = {"perfetto": write_perfetto, "chrome": write_chrome, "arrow": write_arrow}[em]
        t, r = timed(f, [src], out, options=EmitOptions(progress=False))
        # VmHWM: this process's own peak (ru_maxrss would include the parent's RSS inherited at fork)
        hwm = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM"))
        print(json.dumps({"s": t, "events": r.written_events, "bytes": r.bytes_written, "maxrss_kib": hwm,
                          "ru_maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
        return
    scratch = Path(a.dir or tempfile.mkdtemp(prefix="kvconv-bench-", dir=str(_out())))
    scratch.mkdir(parents=True, exist_ok=True)
    try:
        run(a, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def run(a, scratch: Path) -> None:
    if a.rss_only:
        rss(a, scratch)
        return
    src = scratch / "bench.kvdump"
    synth.write_large(src, events=a.events, host=a.host)
    size = src.stat().st_size
    with dump.open(src) as d:
        ev = np.array(d.records("device_event"))
    nb = min(a.baseline_events, len(ev))
    print(f"dump: {len(ev):,} device events + {a.host:,} host records, {size / 2**20:.1f} MiB; "
          f"baselines on the first {nb:,} events, scaled")
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

    # --- Perfetto ---
    tb, ref = timed(baseline_perfetto, ev, nb)
    out = scratch / "b.pftrace"
    write_perfetto([src], out, options=EmitOptions(progress=False))  # warm
    tm, res = timed(write_perfetto, [src], out, options=EmitOptions(progress=False))
    tr = pb.Trace()
    tr.ParseFromString(out.read_bytes())
    mine = Counter(p.SerializeToString() for p in tr.packet if p.trusted_packet_sequence_id == 2
                   and p.HasField("track_event") and p.track_event.type == 3 and p.track_event.debug_annotations
                   and p.track_event.debug_annotations[0].name_iid == 1)
    rt = pb.Trace()
    rt.ParseFromString(ref)
    want = Counter(p.SerializeToString() for p in rt.packet)
    same = all(mine[k] >= v for k, v in want.items())
    rb, rm = nb / tb, len(ev) / tm
    print(f"perfetto: TraceProtoBuilder {rb / 1e6:.3f} M ev/s; kvconv {rm / 1e6:.2f} M ev/s end to end "
          f"({tm:.2f} s, {res.bytes_written / 2**20:.1f} MiB, {res.flows:,} flows) -> ratio {rm / rb:.1f}x; "
          f"baseline packets found in ours: {same}")
    # --- Chrome ---
    tb, ref_ev = timed(baseline_chrome, ev, nb)
    out = scratch / "b.json"
    tm, res = timed(write_chrome, [src], out, options=EmitOptions(progress=False))
    doc = json.loads(out.read_text())
    with dump.open(src) as d:
        ctx_pairs = d.records("clock_sync")
    blocks = {e["args"]["seq"]: e for e in doc["traceEvents"] if e["ph"] == "X" and e.get("cat") == "block"}
    # ours places device times on the host timeline; compare everything else, and ts through the pairs
    from kvconv.emit._source import Clock

    ck = Clock(np.sort(ctx_pairs, order="gpu_ns"))
    host_ts = ck.to_host(ev["globaltimer"][:nb])
    ok = True
    for i, e in enumerate(ref_ev):
        m = blocks.get(e["args"]["seq"])
        e = dict(e, ts=int(host_ts[i]) / 1000, pid=1, tid=e["tid"] - 0x10000 + 0x10000, name=m["name"] if m else "")
        if m != e:
            ok = False
            break
    rb, rm = nb / tb, len(ev) / tm
    print(f"chrome: json.dump {rb / 1e6:.3f} M ev/s; kvconv {rm / 1e6:.2f} M ev/s end to end ({tm:.2f} s, "
          f"{res.bytes_written / 2**20:.1f} MiB) -> ratio {rm / rb:.1f}x; baseline events parse equal: {ok}")
    # --- Arrow ---
    for where in (scratch, Path("/dev/shm") if Path("/dev/shm").is_dir() else None):
        if where is None:
            continue
        for label, opt in (("reconcile auto", EmitOptions(progress=False)),
                           ("streaming join", EmitOptions(progress=False, reconcile="never"))):
            o = where / f"kvconv-bench-arrow-{os.getpid()}"
            shutil.rmtree(o, ignore_errors=True)
            tm, res = timed(write_arrow, [src], o, options=opt)
            print(f"arrow IPC ({label}) -> {where}: {size / tm / 1e9:.2f} GB/s of dump input ({tm:.3f} s, "
                  f"{res.bytes_written / 2**20:.1f} MiB written)")
            shutil.rmtree(o, ignore_errors=True)
    t0 = time.perf_counter()
    with dump.open(src) as d:
        from kvconv import reconcile

        reconcile.reconcile(d)
    print(f"(of which kvconv.reconcile alone: {time.perf_counter() - t0:.3f} s)")
    if a.rss:
        rss(a, scratch)


def rss(a, scratch: Path) -> None:
    big = scratch / "huge.kvdump"
    t, n = timed(synth.write_huge, big, nbytes=int(a.rss * 2**30))
    print(f"generated {big.stat().st_size / 2**30:.2f} GiB dump ({n:,} events) in {t:.0f} s")
    try:
        for em in ("arrow", "perfetto", "chrome"):
            out = scratch / f"huge.{em}"
            p = subprocess.run([sys.executable, __file__, "--child", em, str(big), str(out)], capture_output=True,
                               text=True)
            if p.returncode:
                print(f"{em}: failed: {p.stderr[-2000:]}")
            else:
                r = json.loads(p.stdout.strip().splitlines()[-1])
                print(f"{em} on {big.stat().st_size / 2**30:.1f} GiB: peak RSS {r['maxrss_kib'] / 1024:.0f} MiB, "
                      f"{r['s']:.0f} s, {r['events']:,} events, {r['bytes'] / 2**30:.2f} GiB written")
            if out.is_dir():
                shutil.rmtree(out, ignore_errors=True)
            elif out.exists():
                out.unlink()
    finally:
        big.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
