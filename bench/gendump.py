"""Write a realistic kvconv dump of any size, in bounded memory, deterministic for a seed.

    python bench/gendump.py --size 10GiB -o bench/out/big.kvdump          # ~10 GiB, two contexts
    python bench/gendump.py --size 64MiB -o run.kvdump --exits --canary-buffers 3 --seed 7
    python bench/gendump.py --steps 200 -o small.kvdump                    # a fixed number of decode steps

The run it describes (values invented; shapes from vLLM decode): per context (``--contexts``, default 2: two GPUs of
one process, each with its own %globaltimer offset and drift) one stream on which a decode step replays one of
``--execs`` CUDA graph executables (captured batch sizes 1, 8, 16, 32, ...: ``--nodes`` reshape_and_cache kernel
nodes, one per layer, each with as many blocks as the batch has tokens) and, every ``--prefill-every`` steps, an
eager prefill before it (one launch per layer, 64..512 blocks). Device events carry %gridid (and the per-replay tag
for graph nodes), blocks of a launch enter in a scrambled order on random SMs, device times lie microseconds after
their host launch callbacks once mapped through the clock-sync pairs (start, every 100 ms, end). Optional: block-exit
events (``--exits``), canary records for every step (``--canary-buffers``: buffers per step, clean page sets with
page 0 excluded). It validates and reconciles with no finding (tests/test_gendump.py).

Memory: every group is streamed (:meth:`kvconv.format.dump.DumpWriter.write_stream`) in chunks of ``STEPS_PER_CHUNK``
steps, each chunk rebuilt from its own seed, so a 10 GiB dump needs the same ~100 MB as a small one.
Library use: ``gendump.write(path, gendump.GenOptions(size_bytes=1 << 30))`` returns a summary dict.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from kvconv.format import dump, layout  # noqa: E402

EV, HL, CS, KN = (layout.DTYPES[k] for k in ("device_event", "host_launch", "clock_sync", "kernel"))
CAN, PAGE = layout.DTYPES["canary"], layout.DTYPES["canary_page"]
LF, EF, EK = layout.ENUMS["launch_flags"], layout.ENUMS["event_flags"], layout.ENUMS["event_kind"]
CSF = layout.ENUMS["clock_sync_flags"]
KERNEL = ("void vllm::reshape_and_cache_flash_kernel<__nv_bfloat16, __nv_bfloat16, (vllm::Fp8KVCacheDataType)0>"
          "(__nv_bfloat16 const*, __nv_bfloat16 const*, __nv_bfloat16*, __nv_bfloat16*, long const*, long, long, "
          "long, long, long, int, int, int, float const*, float const*)")
SLOT = 4979
STEPS_PER_CHUNK = 512
HOST0 = 1_000_000_000_000
BATCHES = (1, 8, 16, 32, 64, 128, 256, 512)  # blocks per graph node of exec 0, 1, ...
PAGES, PAGE_SIZE, COMPRESSION = 4096, 64, 4


@dataclass(frozen=True)
class GenOptions:
    """What to generate (keyword-only, frozen). ``size_bytes`` (approximate) wins over ``steps`` when given."""

    size_bytes: int | None = None
    steps: int = 256  # decode steps per context
    contexts: int = 2
    execs: int = 4
    nodes: int = 40
    prefill_every: int = 16
    exits: bool = False
    canary_buffers: int = 0
    seed: int = 0

    def __post_init__(self) -> None:
        if not 1 <= self.execs <= len(BATCHES):
            raise ValueError(f"--execs must be 1..{len(BATCHES)}")
        if self.contexts < 1 or self.nodes < 1 or self.steps < 1 or self.prefill_every < 1:
            raise ValueError("--contexts, --nodes, --steps and --prefill-every must be positive")


def parse_size(text: str) -> int:
    """``10GiB``, ``512MiB``, ``1.5G``, ``4096`` -> bytes."""
    m = re.fullmatch(r"\s*([0-9.]+)\s*([KMGT]?)(i?B?)\s*", text, re.I)
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 10GiB)")
    return int(float(m.group(1)) * 1024 ** " KMGT".index((m.group(2) or " ").upper()))


def step_ns(o: GenOptions) -> int:
    """Host time per decode step: the prefill (if any) in the first half, the replay in the second, each with room
    for its launches on the device (30 µs apart) before the next begins."""
    return 2 * (o.nodes * 30_000 + 200_000)


def _plan(o: GenOptions, ctx: int, chunk: int, steps: int) -> dict:
    """Chunk ``chunk`` of context ``ctx``: which exec each step replays, which steps prefill, prefill block counts.
    Rebuilt from its own seed on every pass (host records, events, canary): nothing is kept between groups."""
    rng = np.random.default_rng([o.seed, ctx, chunk])
    s0 = chunk * STEPS_PER_CHUNK
    n = min(STEPS_PER_CHUNK, steps - s0)
    step = np.arange(s0, s0 + n, dtype=np.int64)
    execs = rng.integers(0, o.execs, n)
    prefill = (step % o.prefill_every) == 0
    pre_blocks = rng.integers(64, 513, (n, o.nodes))
    return {"rng": rng, "step": step, "exec": execs, "prefill": prefill, "pre_blocks": pre_blocks}


def _launches(o: GenOptions, ctx: int, p: dict, counters: dict) -> tuple[np.ndarray, np.ndarray]:
    """The chunk's host records, each kind in host time order: (graph_node records, eager records)."""
    step, ex, N = p["step"], p["exec"], o.nodes
    t_step = HOST0 + ctx * 7_777 + step * step_ns(o)
    # eager prefill: one launch per layer, 2 µs apart, at the start of the step
    ps = np.flatnonzero(p["prefill"])
    el = np.zeros(len(ps) * N, HL)
    el["grid_id"] = 100_000 + counters["eager"] + np.arange(len(el))
    counters["eager"] += len(el)
    el["host_ns"] = (t_step[ps][:, None] + np.arange(N)[None, :] * 2_000).reshape(-1)
    el["grid_x"] = p["pre_blocks"][ps].reshape(-1)
    el["block_dim_x"] = 256
    el["flags"] = LF["eager"]
    # the replay: node callbacks 1 µs apart at the launch, half-way through the step
    gn = np.zeros(len(step) * N, HL)
    k = np.tile(np.arange(N), len(step))
    e = np.repeat(ex, N)
    gn["graph_exec"] = 0x7F00_0000_0000 + (ctx << 20) + e * 0x1000
    replay = np.zeros(len(step), np.int64)
    for i, x in enumerate(ex):  # per-exec replay counter (launch ids 1..R of each exec)
        counters["replays"][x] += 1
        replay[i] = counters["replays"][x]
    gn["launch_id"] = np.repeat(replay, N)
    gn["node"] = 0x5500_0000 + (ctx << 24) + e * 0x10000 + k * 0x40
    gn["grid_id"] = 1_000 + e * N + k
    gn["host_ns"] = np.repeat(t_step + step_ns(o) // 2, N) + k * 1_000
    gn["grid_x"] = np.asarray(BATCHES)[e]
    gn["block_dim_x"] = 256
    gn["flags"] = LF["graph_node"] | LF["has_tag"]
    gn["tag"] = np.repeat((ctx << 40) + step + 1, N)
    for h in (el, gn):
        h["grid_y"] = h["grid_z"] = h["block_dim_y"] = h["block_dim_z"] = 1
        h["kernel_slot"] = SLOT
    return gn, el


def _events(o: GenOptions, p: dict, gn: np.ndarray, el: np.ndarray) -> np.ndarray:
    """Device events of the chunk's launches, in %globaltimer order (sequence numbers set by the caller)."""
    rng = p["rng"]
    order = np.argsort(np.concatenate([el["host_ns"], gn["host_ns"]]), kind="stable")  # launch order
    launch_host = np.concatenate([el["host_ns"], gn["host_ns"]]).astype(np.int64)[order]
    blocks = np.concatenate([el["grid_x"], gn["grid_x"]]).astype(np.int64)[order]
    gid = np.concatenate([el["grid_id"], gn["grid_id"]])[order]
    tag = np.concatenate([np.zeros(len(el), np.uint64), gn["tag"]])[order]
    flags = np.concatenate([np.full(len(el), EF["has_gridid"], np.uint8),
                            np.full(len(gn), EF["has_gridid"] | EF["has_tag"], np.uint8)])[order]
    # device start: eager launch k runs 30 µs after the previous, nodes 25 µs apart, 10-20 µs after the callback
    # (the callbacks of one replay come 1-2 µs apart, the kernels tens of µs apart: device time runs ahead)
    is_node = np.r_[np.zeros(len(el), bool), np.ones(len(gn), bool)][order]
    first = np.r_[True, np.diff(launch_host) > 100_000]  # first launch of a burst (prefill or replay)
    burst = np.cumsum(first) - 1
    pos = np.arange(len(launch_host)) - np.flatnonzero(first)[burst]
    start = launch_host[first][burst] + 10_000 + pos * np.where(is_node, 25_000, 30_000) + \
        rng.integers(0, 5_000, len(launch_host))
    n_ev = int(blocks.sum())
    li = np.repeat(np.arange(len(blocks)), blocks)
    first_ev = np.cumsum(blocks) - blocks
    rank = np.arange(n_ev) - first_ev[li]  # entry order within the launch
    bx = np.lexsort((rng.random(n_ev), li)) - first_ev[li]  # a permutation of the launch's blocks
    t_enter = start[li] + rank * 20
    ev = np.zeros(n_ev * (2 if o.exits else 1), EV)
    e = ev[:n_ev]
    e["globaltimer"] = t_enter
    e["kind"] = EK["block_enter"]
    e["block_x"] = bx
    e["smid"] = rng.integers(0, 132, n_ev)
    e["gridid"], e["tag"], e["flags"] = gid[li], tag[li], flags[li]
    if o.exits:
        x = ev[n_ev:]
        x[:] = e
        x["globaltimer"] = t_enter + 3_000
        x["kind"] = EK["block_exit"]
        ev = ev[np.argsort(ev["globaltimer"], kind="stable")]
    ev["pc"] = 0x7F10_0000_01A0
    ev["kernel_slot"] = SLOT
    return ev


class _Clock:
    """One context's GPU clock: offset and drift against CLOCK_MONOTONIC."""

    def __init__(self, ctx: int) -> None:
        self.offset = 1_795_946_000_000_000_000 + ctx * 3_000_000_123
        self.ppm = 20.0 - 55.0 * ctx

    def gpu(self, host_ns: np.ndarray) -> np.ndarray:
        h = np.asarray(host_ns, dtype=np.int64) - HOST0
        return (self.offset + h + (h * self.ppm * 1e-6).astype(np.int64)).astype(np.uint64)

    def pairs(self, span: int, rng) -> np.ndarray:
        t = np.append(np.arange(0, span, 100_000_000), span) + HOST0
        cs = np.zeros(len(t), CS)
        cs["host_ns"] = t
        cs["gpu_ns"] = self.gpu(t)
        cs["uncertainty_ns"] = 1_500 + rng.integers(0, 500, len(t))
        cs["sequence"] = np.arange(len(t))
        cs["flags"] = CSF["periodic"]
        cs["flags"][0], cs["flags"][-1] = CSF["start"], CSF["end"]
        return cs


def _canary(o: GenOptions, p: dict, first_page: int, name_refs) -> tuple[np.ndarray, np.ndarray]:
    """Clean canary records of the chunk (one per step and buffer) and their page lists: the batch's pages are
    expected and changed; padded batches also change page 0, which is excluded."""
    rng = np.random.default_rng([o.seed, 0xCA, int(p["step"][0])])
    B = o.canary_buffers
    n = len(p["step"]) * B
    real = np.asarray(BATCHES)[np.repeat(p["exec"], B)]
    padded = rng.random(n) < 0.5
    n_exp = np.maximum(real - padded * (real // 4), 1)  # pages written by real tokens
    starts = rng.integers(1, PAGES - 600, n)
    rec = np.zeros(n, CAN)
    rec["step"] = np.repeat(p["step"] + 1, B)
    rec["host_ns"] = np.repeat(HOST0 + (p["step"] + 1) * step_ns(o) - 100_000, B)
    rec["buffer_id"] = np.tile(np.arange(B), len(p["step"]))
    rec["name_off"], rec["name_len"] = name_refs[0][rec["buffer_id"]], name_refs[1][rec["buffer_id"]]
    rec["num_pages"], rec["page_size"], rec["compression"] = PAGES, PAGE_SIZE, COMPRESSION
    rec["flags"] = layout.ENUMS["canary_flags"]["snapshot_clone"]
    n_chg = n_exp + padded
    per = n_exp + n_chg + 1  # expected, changed, excluded (page 0)
    base = first_page + np.cumsum(per) - per
    rec["expected_first"], rec["expected_count"] = base, n_exp
    rec["changed_first"], rec["changed_count"] = base + n_exp, n_chg
    rec["excluded_first"], rec["excluded_count"] = base + n_exp + n_chg, 1
    # page lists: expected = start + i (consecutive pages of a block table); changed = [0 if padded] + expected;
    # excluded = [0]
    total = int(per.sum())
    pages = np.zeros(total, PAGE)
    ri = np.repeat(np.arange(n), per)
    off = np.arange(total) - (np.cumsum(per) - per)[ri]
    in_exp = off < n_exp[ri]
    in_chg = ~in_exp & (off < (n_exp + n_chg)[ri])
    j = np.where(in_exp, off, off - n_exp[ri] - padded[ri])  # index into the expected run
    val = starts[ri] + j
    val = np.where(in_chg & padded[ri] & (off == n_exp[ri]), 0, val)
    val = np.where(~in_exp & ~in_chg, 0, val)
    pages["page"] = val
    return rec, pages


def _target_steps(o: GenOptions) -> int:
    """Decode steps per context for about ``size_bytes`` (expected bytes per step from the options)."""
    per_launch_ev = (sum(BATCHES[: o.execs]) / o.execs) * o.nodes + o.nodes * 288 / o.prefill_every
    per_step = per_launch_ev * 64 * (2 if o.exits else 1) + 96 * o.nodes * (1 + 1 / o.prefill_every)
    per_step += o.canary_buffers * (64 + 4 * (2 * sum(BATCHES[: o.execs]) / o.execs + 1))
    return max(1, int(o.size_bytes / (per_step * o.contexts)))


def _host_chunks(o: GenOptions, ctx: int, chunks: int, steps: int, kind_index: int):
    """Graph-node (``kind_index`` 0) or eager-launch (1) records of context ``ctx``, one array per chunk."""
    counters = {"eager": 0, "replays": [0] * o.execs}
    for c in range(chunks):
        yield _launches(o, ctx, _plan(o, ctx, c, steps), counters)[kind_index]


def _event_chunks(o: GenOptions, ctx: int, chunks: int, steps: int, clock: _Clock):
    """Device events of context ``ctx`` on its GPU clock, numbered in sequence across chunks."""
    counters = {"eager": 0, "replays": [0] * o.execs}
    seq = 0
    for c in range(chunks):
        p = _plan(o, ctx, c, steps)
        gn, el = _launches(o, ctx, p, counters)
        ev = _events(o, p, gn, el)
        ev["globaltimer"] = clock.gpu(ev["globaltimer"].astype(np.int64))
        ev["sequence"] = np.arange(seq, seq + len(ev))
        seq += len(ev)
        yield ev


def _canary_chunks(o: GenOptions, ctx: int, chunks: int, steps: int, name_refs, which: int):
    """Canary records (``which`` 0) or their page lists (1) of context ``ctx``, one array per chunk."""
    first = 0
    for c in range(chunks):
        rec, pages = _canary(o, _plan(o, ctx, c, steps), first, name_refs)
        first += len(pages)
        yield (rec, pages)[which]


def write(path, options: GenOptions = GenOptions()) -> dict:
    """Write the dump; returns counts (records per kind, steps per context, bytes)."""
    o = options
    steps = _target_steps(o) if o.size_bytes else o.steps
    chunks = (steps + STEPS_PER_CHUNK - 1) // STEPS_PER_CHUNK
    totals = {"steps_per_context": steps, "contexts": o.contexts}

    def add(kind, n):
        totals[kind] = totals.get(kind, 0) + n

    with dump.new(path) as w:
        w.write_metadata({"tool": "kvconv-gendump", "tool_version": "1", "gpu": "synthetic", "reconstructed": True,
                          "target_kernels": ["reshape_and_cache_flash_kernel"], "generator": asdict(o),
                          "counters": {"fatal_count": 0, "device_event_drops": 0, "graph_node_table_drops": 0,
                                       "eager_table_drops": 0}})
        for ctx in range(o.contexts):
            hdr = {"context_id": ctx, "device_id": ctx}
            st = dump.StringTable()
            kt = np.zeros(1, KN)
            kt["slot"], kt["flags"], kt["module_id"] = SLOT, 1, 0x5000 + ctx
            kt["name_off"], kt["name_len"] = st.add(KERNEL)
            kt["module_off"], kt["module_len"] = st.add("vllm/_C.abi3.so")
            refs = [st.add(f"L{b // 3}.{('index_k', 'index_k_fp8', 'index_k_scale')[b % 3]}")
                    for b in range(o.canary_buffers)]
            name_refs = (np.array([r[0] for r in refs], np.int64), np.array([r[1] for r in refs], np.int64))
            w.write_strings(st, **hdr)
            w.write_records("kernel", kt, **hdr)
            clock = _Clock(ctx)
            cs = clock.pairs((steps + 1) * step_ns(o), np.random.default_rng([o.seed, ctx, 0xC5]))
            w.write_records("clock_sync", cs, **hdr)
            add("clock_sync", len(cs))
            for kind_index, kind in enumerate(("graph_node", "eager_launch")):
                add(kind, w.write_stream(kind, _host_chunks(o, ctx, chunks, steps, kind_index), **hdr))
            add("device_event", w.write_stream("device_event", _event_chunks(o, ctx, chunks, steps, clock), **hdr))
            if o.canary_buffers:
                for which, kind in enumerate(("canary", "canary_pages")):
                    add(kind, w.write_stream(kind, _canary_chunks(o, ctx, chunks, steps, name_refs, which), **hdr))
    totals["bytes"] = Path(path).stat().st_size
    return totals


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-o", "--out", required=True, help="output dump path (written atomically)")
    ap.add_argument("--size", type=parse_size, default=None, help="approximate file size, e.g. 10GiB (wins over "
                    "--steps)")
    d = GenOptions()
    ap.add_argument("--steps", type=int, default=d.steps, help="decode steps per context")
    ap.add_argument("--contexts", type=int, default=d.contexts)
    ap.add_argument("--execs", type=int, default=d.execs, help=f"graph executables (batch sizes {BATCHES})")
    ap.add_argument("--nodes", type=int, default=d.nodes, help="graph nodes (layers) per replay")
    ap.add_argument("--prefill-every", type=int, default=d.prefill_every, help="an eager prefill every N steps")
    ap.add_argument("--exits", action="store_true", help="block-exit events beside the block-enter events")
    ap.add_argument("--canary-buffers", type=int, default=0, help="canary records per step (0: no canary groups)")
    ap.add_argument("--seed", type=int, default=d.seed)
    a = ap.parse_args(argv)
    try:
        o = GenOptions(size_bytes=a.size, steps=a.steps, contexts=a.contexts, execs=a.execs, nodes=a.nodes,
                       prefill_every=a.prefill_every, exits=a.exits, canary_buffers=a.canary_buffers, seed=a.seed)
    except ValueError as e:
        ap.error(str(e))
    t = write(a.out, o)
    kinds = ", ".join(f"{t[k]:,} {k}" for k in ("device_event", "graph_node", "eager_launch", "clock_sync", "canary")
                      if k in t)
    print(f"wrote {a.out}: {t['bytes'] / 2**20:,.1f} MiB, {t['contexts']} contexts x {t['steps_per_context']:,} "
          f"steps: {kinds}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
