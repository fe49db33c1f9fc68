"""Emitter benchmarks: ratios against the obvious paths, measured in one run.

    .venv/bin/python bench/bench_emit.py                 # 1,048,576 device events + 65,536 host records
    .venv/bin/python bench/bench_emit.py --rss 10        # also peak RSS of each emitter on a generated 10 GiB dump
    .venv/bin/python bench/bench_emit.py --baseline-events 131072
    .venv/bin/python bench/bench_emit.py --one-core      # pinned to one CPU: the single-threaded figures

Baselines (perfetto's TraceProtoBuilder with one TracePacket per device event; ``json.dump`` of one dict per device
event) run on the first ``--baseline-events`` events and are scaled to events/s; their output is checked to decode
to the same packets / events as ours for those events. Our emitters run on the whole dump, end to end (open, join,
first pass, host records, slices, counters, the file write: what the CLI runs) and encode only (the device-event
packets / lines alone). Arrow reports GB/s of dump input for the record tables, the join and the matches table
separately, writing beside the input (same filesystem). Every timing is the best of ``--reps`` runs. Perfetto and
Chrome also print the CPU ratio (CPU seconds of every thread of the process, baseline's per event over ours): on a
machine shared with other work it moves less than the wall ratio, which is the target.
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
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


def _tree() -> Path:
    """``--tree PATH``: the checkout whose kvconv this bench measures (default: its own), read before kvconv is
    imported, so that one bench measures two trees' code alike (an A/B of commits in one window)."""
    if "--tree" in sys.argv[:-1]:
        return Path(sys.argv[sys.argv.index("--tree") + 1]).resolve()
    return ROOT


TREE = _tree()
sys.path.insert(0, str(TREE))

import numpy as np  # noqa: E402
from _timing import best, best_cpu, quietness, timed  # noqa: E402

from kvconv.emit import EmitOptions, write_arrow, write_chrome, write_perfetto  # noqa: E402
from kvconv.format import dump  # noqa: E402

_spec = importlib.util.spec_from_file_location("make_synthetic", ROOT / "fixtures/synthetic-multi/make_synthetic.py")
synth = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(synth)


def _out() -> Path:
    p = ROOT / "bench" / "out"  # git-ignored
    p.mkdir(parents=True, exist_ok=True)
    return p


def rm(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists():
        path.unlink()


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
    ap.add_argument("--reps", type=int, default=3, help="timed runs of each measurement (the best is reported)")
    ap.add_argument("--rss", type=float, default=0, help="GiB of a generated dump for the peak-RSS runs (0: skip)")
    ap.add_argument("--rss-only", action="store_true", help="skip the ratio runs")
    ap.add_argument("--dir", default=None, help="scratch folder (default: a temporary folder beside the repo)")
    ap.add_argument("--one-core", action="store_true", help="pin this process (baselines and ours) to one CPU")
    ap.add_argument("--tree", default=None, help="measure the kvconv of this checkout (its kvconv/ and schemas/)")
    ap.add_argument("--only", default="perfetto,chrome,arrow,reconcile",
                    help="the measurements to run, of perfetto, chrome, arrow, reconcile")
    ap.add_argument("--rss-verdict", action="store_true", help="the peak-RSS runs also with EmitOptions(verdict=True) "
                    "(the CLI's: validate's checks in the converter's pass)")
    ap.add_argument("--child", nargs=4, metavar=("EMITTER", "DUMP", "OUT", "VERDICT"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        em, src, out, verdict = a.child
        f = {"perfetto": write_perfetto, "chrome": write_chrome, "arrow": write_arrow}[em]
        t, r = timed(f, [src], out, options=EmitOptions(progress=False, verdict=verdict == "1"))
        # VmHWM: this process's own peak (ru_maxrss would include the parent's RSS inherited at fork)
        hwm = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM"))
        print(json.dumps({"s": t, "events": r.written_events, "bytes": r.bytes_written, "maxrss_kib": hwm,
                          "ru_maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
        return
    if a.one_core:
        cpu = min(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpu})
        print(f"pinned to CPU {cpu}: single-threaded figures (worker threads share the one core)")
    print(protobuf_line())
    import kvconv

    print(f"kvconv from {Path(kvconv.__file__).parent.parent}")
    print(quietness("start"))
    scratch = Path(a.dir or tempfile.mkdtemp(prefix="kvconv-bench-", dir=str(_out())))
    scratch.mkdir(parents=True, exist_ok=True)
    try:
        run(a, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        print(quietness("end"))


def protobuf_line() -> str:
    """The protobuf runtime the TraceProtoBuilder baseline runs on: its speed differs by backend (upb, cpp,
    python), so every run says which."""
    import google.protobuf
    import perfetto
    from google.protobuf.internal import api_implementation

    pv = getattr(perfetto, "__version__", None)
    if pv is None:
        from importlib.metadata import PackageNotFoundError, version

        try:
            pv = version("perfetto")
        except PackageNotFoundError:
            pv = "?"
    return (f"protobuf {google.protobuf.__version__} ({api_implementation.Type()} backend), perfetto {pv}, "
            f"Python {sys.version.split()[0]}")


def encode_only_perfetto(src: Path, reps: int):
    """The device-event packets of the whole dump (the bulk of the trace), without opening, joining, the first pass,
    the other packets or the file write: best seconds."""
    from kvconv.emit._contexts import open_contexts
    from kvconv.emit._first_pass import first_pass
    from kvconv.emit.perfetto import _Packets
    from kvconv.emit.plan import Plan

    opt = EmitOptions(progress=False)
    dumps, ctxs = open_contexts([str(src)], opt, lambda m: None)
    try:
        pl = [_Packets(Plan(c, first_pass(c, opt), opt)) for c in ctxs]

        def go():
            for p in pl:
                for first, recs in p.c.chunks(opt.chunk):
                    p.device_packets(first, recs)

        return best(reps, go)[0]
    finally:
        for d in dumps:
            d.close()


def encode_only_chrome(src: Path, reps: int):
    """The device-event lines (block slices and flow ends) of the whole dump, without the file write."""
    from kvconv.emit._contexts import open_contexts
    from kvconv.emit._first_pass import first_pass
    from kvconv.emit.chrome import _Chrome
    from kvconv.emit.plan import Plan

    opt = EmitOptions(progress=False)
    dumps, ctxs = open_contexts([str(src)], opt, lambda m: None)
    try:
        ch = [_Chrome(Plan(c, first_pass(c, opt), opt)) for c in ctxs]

        def go():
            for x in ch:
                for first, recs in x.c.chunks(opt.chunk):
                    x.device(first, recs, lambda b: None)

        return best(reps, go)[0]
    finally:
        for d in dumps:
            d.close()


def cli_wall(args: list) -> float:
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "kvconv", *args, "-q"], check=True, cwd=str(TREE), capture_output=True)
    return time.perf_counter() - t


def run(a, scratch: Path) -> None:
    if a.rss_only:
        rss(a, scratch)
        return
    R = a.reps
    RA = max(R, 7)  # the Arrow runs are short and the machine noisy: more of them
    src = scratch / "bench.kvdump"  # outputs go beside it: the same filesystem
    synth.write_large(src, events=a.events, host=a.host)
    size = src.stat().st_size
    with dump.open(src) as d:
        ev = np.array(d.records("device_event"))
    N = len(ev)
    nb = min(a.baseline_events, N)
    print(f"dump: {N:,} device events + {a.host:,} host records, {size / 2**20:.1f} MiB; load average "
          f"{os.getloadavg()[0]:.2f} (2 cores; other work on the machine adds noise)")
    print(f"timings: best of {R} (worst in brackets); baselines run on the first {nb:,} events and are scaled to "
          "events/s; ours run on the whole dump. 'end to end' is write_*(), the function the CLI calls: open, join, "
          "first pass, all packets/lines/tables, the file write (the previous output is removed untimed first)")
    buf = np.empty(size, np.uint8)
    raw = np.frombuffer(src.read_bytes(), np.uint8)
    tcp = best(R, np.copyto, buf, raw)[0]
    print(f"reference: memory copy of the dump into a preallocated buffer {size / tcp / 1e9:.1f} GB/s")
    del buf, raw
    opts = EmitOptions(progress=False)
    only = a.only.split(",")
    if "perfetto" in only:
        bench_perfetto(src, ev, nb, R, opts, scratch)
    if "chrome" in only:
        bench_chrome(src, ev, nb, R, opts, scratch)
    if "arrow" in only:
        bench_arrow(src, RA, opts, scratch)
    if "reconcile" in only:
        t0 = time.perf_counter()
        with dump.open(src) as d:
            from kvconv.check import reconcile

            reconcile.reconcile(d)
        print(f"(kvconv.check.reconcile alone, the full report, not used by the emitters on this dump: "
              f"{time.perf_counter() - t0:.3f} s)")
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")
    if a.rss:
        rss(a, scratch)


def bench_perfetto(src: Path, ev: np.ndarray, nb: int, R: int, opts, scratch: Path) -> None:
    """Perfetto end to end (write_perfetto) and encode only against TraceProtoBuilder on the first ``nb`` events."""
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

    N = len(ev)
    tb, tbw, cb, ref = best_cpu(R, baseline_perfetto, ev, nb)
    rb = nb / tb
    out = scratch / "b.pftrace"
    tm, tmw, cm, res = best_cpu(R, write_perfetto, [src], out, options=opts, before=lambda: rm(out))
    tr = pb.Trace()
    tr.ParseFromString(out.read_bytes())
    mine = Counter(p.SerializeToString() for p in tr.packet if p.trusted_packet_sequence_id == 2
                   and p.HasField("track_event") and p.track_event.type == 3 and p.track_event.debug_annotations
                   and p.track_event.debug_annotations[0].name_iid == 1)
    rt = pb.Trace()
    rt.ParseFromString(ref)
    want = Counter(p.SerializeToString() for p in rt.packet)
    same = all(mine[k] >= v for k, v in want.items())
    te = encode_only_perfetto(src, R)
    rm_ = N / tm
    print(f"perfetto: TraceProtoBuilder {rb / 1e6:.3f} M ev/s ({tb:.2f} s [{tbw:.2f}] for {nb:,}); "
          f"kvconv end to end {rm_ / 1e6:.2f} M ev/s ({tm:.3f} s [{tmw:.3f}], {res.bytes_written / 2**20:.1f} MiB, "
          f"{res.flows:,} flows, join {res.join[0]}) -> ratio {rm_ / rb:.1f}x (target 50x, issue 42); encode only "
          f"{N / te / 1e6:.2f} M ev/s ({te:.3f} s) -> {N / te / rb:.1f}x; baseline packets found in ours: {same}; "
          f"CPU seconds (every thread) {cb:.2f} for {nb:,} / {cm:.3f} -> CPU ratio {N / cm / (nb / cb):.1f}x")
    print(f"perfetto: CLI process wall time (Python start-up and imports included) "
          f"{cli_wall(['perfetto', str(src), '-o', str(scratch / 'c.pftrace')]):.2f} s")
    rm(out)
    rm(scratch / "c.pftrace")


def bench_chrome(src: Path, ev: np.ndarray, nb: int, R: int, opts, scratch: Path) -> None:
    """Chrome JSON end to end (write_chrome) and encode only against json.dump on the first ``nb`` events."""
    N = len(ev)
    tb, tbw, cb, ref_ev = best_cpu(R, baseline_chrome, ev, nb)
    rb = nb / tb
    out = scratch / "b.json"
    tm, tmw, cm, res = best_cpu(R, write_chrome, [src], out, options=opts, before=lambda: rm(out))
    doc = json.loads(out.read_text())
    with dump.open(src) as d:
        ctx_pairs = d.records("clock_sync")
    blocks = {e["args"]["seq"]: e for e in doc["traceEvents"] if e["ph"] == "X" and e.get("cat") == "block"}
    # ours places device times on the host timeline; compare everything else, and ts through the pairs
    from kvconv.clock import Clock

    ck = Clock(np.sort(ctx_pairs, order="gpu_ns"))
    host_ts = ck.to_host(ev["globaltimer"][:nb])
    ok = len(blocks) == N
    for i, e in enumerate(ref_ev):
        m = blocks.get(e["args"]["seq"])
        e = dict(e, ts=int(host_ts[i]) / 1000, pid=1, name=m["name"] if m else "")
        if m != e:
            ok = False
            break
    del doc, blocks
    te = encode_only_chrome(src, R)
    rm_ = N / tm
    print(f"chrome: json.dump {rb / 1e6:.3f} M ev/s ({tb:.2f} s [{tbw:.2f}] for {nb:,}); kvconv end to end "
          f"{rm_ / 1e6:.2f} M ev/s ({tm:.3f} s [{tmw:.3f}], {res.bytes_written / 2**20:.1f} MiB with "
          f"{res.flows:,} flow starts and ends) -> ratio {rm_ / rb:.1f}x (target 50x, issue 42); encode only "
          f"{N / te / 1e6:.2f} M ev/s ({te:.3f} s) -> {N / te / rb:.1f}x; baseline events parse equal: {ok}; "
          f"CPU seconds (every thread) {cb:.2f} for {nb:,} / {cm:.3f} -> CPU ratio {N / cm / (nb / cb):.1f}x")
    rm(out)


def bench_arrow(src: Path, RA: int, opts, scratch: Path) -> None:
    """Arrow IPC end to end (write_arrow): GB/s of dump input, with and without the payload checksums."""
    size = src.stat().st_size
    o = scratch / "tables"
    for label, opt in (("", opts), (" (checksums not verified)", EmitOptions(progress=False, verify_checksums=False))):
        runs = []  # each part's best over the runs (one run's parts are not each at their best)

        def arrow_run(opt=opt, runs=runs):  # this iteration's (bound now, not when called)
            r = write_arrow([src], o, options=opt)
            runs.append(r.timings)
            return r

        tm, tmw, res = best(RA, arrow_run, before=lambda: rm(o))
        tmg = {k: min(t[k] for t in runs) for k in runs[0]}
        print(f"arrow IPC{label}, best of {RA} -> {scratch}: record tables "
              f"{size / tmg['record_tables'] / 1e9:.2f} GB/s of dump input "
              f"({tmg['record_tables'] * 1e3:.0f} ms; target 3 GB/s, issue 42); matches table "
              f"{tmg['matches'] * 1e3:.0f} ms "
              f"+ join {tmg['join'] * 1e3:.0f} ms (join {res.join[0]}); end to end {size / tm / 1e9:.2f} GB/s "
              f"({tm:.3f} s [{tmw:.3f}], {res.bytes_written / 2**20:.1f} MiB written)")
        rm(o)
    arrow_floor(src, RA, scratch)


def arrow_floor(src: Path, RA: int, scratch: Path) -> None:
    """Where the record tables' floor is on this machine: the device_event table's two halves alone, one thread
    each, best of ``RA``: the column copy (the records' fields out of the structs, kvconv.emit.arrow.Deinterleave, a
    batch at a time) and the IPC write of the columns (one batch's columns written as many times as the dump has
    batches, into a fresh file reserved as the emitter reserves it). The record tables run the two at once on two
    cores (memory bandwidth shared), beside the small tables."""
    import pyarrow as pa

    from kvconv.emit import arrow as A
    from kvconv.format import layout

    dt = layout.DTYPES["device_event"]
    with dump.open(src) as d:
        recs = d.records("device_event")
        n, B = len(recs), A.BATCH
        deint = A.Deinterleave(dt, B)

        def copy_all():
            for s in range(0, n, B):
                deint(recs[s : s + B])

        tc = best(RA, copy_all)[0]
        cols = {k: np.array(v) for k, v in deint(recs[:B]).items()}
    cols["context_id"] = np.zeros(B, np.uint32)
    schema = A._schema(pa, dt, [], {})
    nbytes = sum(v.nbytes for v in cols.values()) * (n // B)
    root = scratch / "floor"

    def write_all():
        rm(root)
        root.mkdir()
        kw = {"expect": nbytes + (1 << 20)} if "expect" in inspect.signature(A._Sink).parameters else {}  # (--tree)
        s = A._Sink(pa, root, root / "t" / "part.arrow", schema, EmitOptions(), **kw)
        for _ in range(n // B):
            s.write(cols)
        s.close()

    tw = best(RA, write_all)[0]
    rm(root)
    size = src.stat().st_size
    print(f"arrow floor, one thread each (best of {RA}): the events' column copy {tc * 1e3:.0f} ms "
          f"({size / tc / 1e9:.2f} GB/s of dump input); the IPC write of their columns {tw * 1e3:.0f} ms "
          f"({nbytes / 2**20:.0f} MiB, {nbytes / tw / 1e9:.2f} GB/s); alone, the slower of the two is "
          f"{size / max(tc, tw) / 1e9:.2f} GB/s of dump input, both on one core {size / (tc + tw) / 1e9:.2f} GB/s")


def rss(a, scratch: Path) -> None:
    big = scratch / "huge.kvdump"
    t, n = timed(synth.write_huge, big, nbytes=int(a.rss * 2**30))
    print(f"generated {big.stat().st_size / 2**30:.2f} GiB dump ({n:,} events) in {t:.0f} s")
    try:
        for em in ("arrow", "perfetto", "chrome"):
            for verdict in ("0", "1") if a.rss_verdict else ("0",):
                _rss_child(a, em, big, scratch / f"huge.{em}", verdict)
    finally:
        big.unlink(missing_ok=True)


def _rss_child(a, em: str, big: Path, out: Path, verdict: str) -> None:
    cmd = [sys.executable, __file__, "--child", em, str(big), str(out), verdict]
    if a.tree:
        cmd += ["--tree", a.tree]
    p = subprocess.run(cmd, capture_output=True, text=True)
    what = f"{em}{' with the verdict' if verdict == '1' else ''}"
    if p.returncode:
        print(f"{what}: failed: {p.stderr[-2000:]}")
    else:
        r = json.loads(p.stdout.strip().splitlines()[-1])
        print(f"{what} on {big.stat().st_size / 2**30:.1f} GiB: peak RSS {r['maxrss_kib'] / 1024:.0f} MiB, "
              f"{r['s']:.0f} s, {r['events']:,} events, {r['bytes'] / 2**30:.2f} GiB written")
    if out.is_dir():
        shutil.rmtree(out, ignore_errors=True)
    elif out.exists():
        out.unlink()


if __name__ == "__main__":
    main()
