"""A paged-KV workload with page tables and planted bugs (issue 29 item 3): the value canary, slot ownership and the
write / location canaries, each on the bug it alone (or they together) should catch.

Layout: K and V caches of every layer are views of one pool ``[2 * layers, num_pages, page_size, heads * head_dim]``
(bf16 on torch; bf16 bits as uint16 on numpy); page 0 is the dummy page padding rows write to. Requests hold pages
through a page table in the flashinfer shape: ``indices`` (every row's pages, concatenated), ``indptr`` (row r's
pages are ``indices[indptr[r]:indptr[r + 1]]``), ``last_page_len``. The append computes each row's slot on the device
from the table (``indices[indptr[r + 1] - 1] * page_size + last_page_len[r] - 1``) and copies the row's K and V
from the static source buffers ``k_src`` / ``v_src`` into every layer's caches (``index_copy_``). The engine
computes each step's K/V rows itself and copies them into the source buffers before the replay.

Schedule (defaults): requests 1-4 (prompts 5, 6, 3, 7 tokens) prefilled eagerly at step 0 (every prompt token
written, slots from their page tables); decode steps 1-2 replayed from one CUDA graph of ``--rows`` 5 rows (the
fifth a padding row); request 1 finishes after step 2: the engine releases it (``WriteProbe.release([1])``) and its
pages go back to the allocator; step 3 is the eager prefill of request 5 (3 tokens) in freed pages; decode steps 4-6
with requests 5, 2, 3, 4. Requests 3 and 4 need a new page at step 2, request 2 at step 4.

Modes (``--mode``, or ``all``: one dump per mode):
  clean       as above: every check passes (request 5 reuses request 1's released pages)
  stale-k     step 5's K rows are not copied into the graph's K source buffer: the graph writes step 4's K rows at
              step 5's (right) slots: the value canary alone (canary-wrong-value, in every K cache)
  live-twice  at request 1's release the allocator also frees request 2's last page, which request 2 still holds
              (a double free / an eviction of a page in use): request 5's prompt is mapped onto request 2's tokens:
              slot ownership alone (writes-live-overwrite); every write lands where the engine mapped it
  late-table  at step 2 the indices entries of the two new pages are refreshed one step late: rows 2 and 3 read
              the stale entries (request 4's first page, page 0) and write there: the write canary
              (writes-unmapped-slot, writes-missing-slot) and the location canary (canary-unexpected-write,
              canary-missing-write); the value canary says the mapped slots were not written

Probes, into one dump per mode (``DIR/paged-MODE.kvdump``, kvconv.capture.probe): the location canary (torch
``Canary``; on numpy the same page diff made here), the value canary (``ValueProbe``, expected rows = the rows the
engine computed, handed over with ``expect=``), the slot mapping (``WriteProbe(mirror=...)``: steps and request
releases, in the tracer too when one is loaded). Releases are recorded per request (``release``), at the request's
end: a hook on the allocator's page frees (``free(slots)``) would record the planted double free as a free and
excuse it.

    python native/workloads/paged_plants.py --out DIR --mode all                 # numpy or torch, in this process
    python native/workloads/paged_plants.py --out DIR --mode all --record        # each mode under kvconv record
                                                  # --writes -k index_copy (DIR/paged-MODE.trace.kvdump beside)
    kvconv validate DIR/paged-*.kvdump

``--backend``: torch (CUDA when available: the decode steps replay one CUDA graph; CPU torch: the same steps run
eagerly, reading the same static buffers) or numpy (no torch: the "graph" is the same function, re-run on the static
buffers at every replay, so the plants behave as on the GPU); default torch when importable, else numpy. Nothing
touches a GPU at import.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
MODES = ("clean", "stale-k", "live-twice", "late-table")
PROMPTS = (5, 6, 3, 7)
JOIN_PROMPT = 3


# ------------------------------------------------------------------------------------------------ array backends

class NumpyOps:
    """The few array operations the engine uses, on numpy (KV as bf16 bits in uint16)."""

    name = "numpy"

    def __init__(self, device=None) -> None:
        self.device = "cpu"

    def zeros(self, shape, kind: str):
        return np.zeros(shape, np.uint16 if kind == "kv" else np.int64)

    def kv(self, bits: np.ndarray):
        return bits.astype(np.uint16, copy=True)

    def i64(self, values):
        return np.asarray(values, dtype=np.int64)

    def set(self, dst, src) -> None:
        dst[...] = src

    def append(self, cache2d, slots, rows) -> None:
        cache2d[slots] = rows

    def flat(self, cache, n: int):
        return cache.reshape(-1, n)

    def host(self, x) -> np.ndarray:
        return np.asarray(x)

    def sync(self) -> None:
        pass

    def capture(self, fn):
        fn()  # the warm-up run a CUDA graph capture makes (on the same buffers: the same effects)
        return fn  # no graph: the same function on the same static buffers at every replay


class TorchOps(NumpyOps):
    """The same on torch: bf16 caches, ``index_copy_`` appends, a CUDA graph for the decode step on CUDA."""

    name = "torch"

    def __init__(self, device=None) -> None:
        import torch

        self.torch = torch
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")

    def zeros(self, shape, kind: str):
        t = self.torch
        return t.zeros(shape, dtype=t.bfloat16 if kind == "kv" else t.int64, device=self.device)

    def kv(self, bits: np.ndarray):
        t = self.torch
        return t.from_numpy(np.ascontiguousarray(bits).view(np.int16)).view(t.bfloat16).to(self.device)

    def i64(self, values):
        return self.torch.as_tensor(np.asarray(values, dtype=np.int64), device=self.device)

    def set(self, dst, src) -> None:
        dst.copy_(src if hasattr(src, "device") else self.torch.as_tensor(src, device=self.device))

    def append(self, cache2d, slots, rows) -> None:
        cache2d.index_copy_(0, slots, rows)

    def flat(self, cache, n: int):
        return cache.view(-1, n)

    def host(self, x) -> np.ndarray:
        if x.dtype == self.torch.bfloat16:
            x = x.view(self.torch.int16)
        return x.detach().cpu().numpy()

    def sync(self) -> None:
        if self.device.startswith("cuda"):
            self.torch.cuda.synchronize()

    def capture(self, fn):
        if not self.device.startswith("cuda"):
            return super().capture(fn)
        t = self.torch
        s = t.cuda.Stream()
        s.wait_stream(t.cuda.current_stream())
        with t.cuda.stream(s):  # warm up outside the graph, as torch's docs do
            fn()
        t.cuda.current_stream().wait_stream(s)
        g = t.cuda.CUDAGraph()
        with t.cuda.graph(g):
            fn()
        t.cuda.synchronize()
        self.graph = g
        return g.replay


def make_ops(backend: str, device=None):
    if backend == "numpy":
        return NumpyOps()
    if backend == "torch":
        return TorchOps(device)
    try:
        import torch  # noqa: F401
    except ImportError:
        return NumpyOps()
    return TorchOps(device)


def kv_rows(layer: int, kv: int, reqs, pos, n: int) -> np.ndarray:
    """The K (kv 0) or V (kv 1) rows the engine computes for tokens (request, position) of one layer: bf16 bits in
    [0.0078, 2) with a random sign, deterministic (splitmix64 of the token and element)."""
    reqs, pos = np.asarray(reqs, np.uint64), np.asarray(pos, np.uint64)
    with np.errstate(over="ignore"):
        z = ((np.uint64(layer) << np.uint64(48)) ^ (np.uint64(kv) << np.uint64(44)) ^ (reqs << np.uint64(24)) ^ pos)
        z = z[:, None] * np.uint64(1 << 16) + np.arange(n, dtype=np.uint64)[None, :] + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z ^= z >> np.uint64(31)
    return (np.uint16(0x3C00) | (z & np.uint64(0x03FF)).astype(np.uint16)
            | ((z >> np.uint64(63)).astype(np.uint16) << np.uint16(15)))


# ------------------------------------------------------------------------------------------------ the engine

class Engine:
    def __init__(self, args, ops) -> None:
        self.args, self.ops = args, ops
        self.P, self.L, self.rows = args.page_size, args.layers, args.rows
        self.n = args.heads * args.head_dim
        self.pool = ops.zeros((2 * self.L, args.num_pages, self.P, self.n), "kv")
        self.caches = [self.pool[i] for i in range(2 * self.L)]  # L0.k, L0.v, L1.k, ...
        self.names = [f"L{i // 2}.{'kv'[i % 2]}" for i in range(2 * self.L)]
        self.flat = [ops.flat(c, self.n) for c in self.caches]
        cap = self.rows * (args.num_pages + 1)
        self.indices, self.indptr, self.lpl = ops.zeros(cap, "i64"), ops.zeros(self.rows + 1, "i64"), \
            ops.zeros(self.rows, "i64")
        self.k_src, self.v_src = ops.zeros((self.L, self.rows, self.n), "kv"), ops.zeros((self.L, self.rows, self.n),
                                                                                          "kv")
        self.free = list(range(args.num_pages - 1, 0, -1))  # page 0: the dummy page; pop() gives 1, 2, 3, ...
        self.pages: dict[int, list[int]] = {}
        self.length: dict[int, int] = {}
        self.shown_indices = np.zeros(cap, np.int64)  # what the graph's indices buffer holds (host mirror)
        # a valid table before the graph's warm-up run: every row a padding row on the dummy page (slot 0); zeros
        # would send each row to indices[-1] * page_size - 1 = slot -1, out of range for index_copy_
        ops.set(self.indptr, ops.i64(np.arange(self.rows + 1)))
        ops.set(self.lpl, ops.i64(np.ones(self.rows)))

    def alloc(self) -> int:
        return self.free.pop()

    def slot(self, r: int, pos: int) -> int:
        return self.pages[r][pos // self.P] * self.P + pos % self.P

    def decode_body(self) -> None:
        """The captured step: slots from the page table, then every layer's K and V appended."""
        o = self.ops
        slots = self.indices[self.indptr[1:] - 1] * self.P + self.lpl - 1
        for layer in range(self.L):
            o.append(self.flat[2 * layer], slots, self.k_src[layer])
            o.append(self.flat[2 * layer + 1], slots, self.v_src[layer])

    def prefill(self, reqs: list[int]):
        """The eager prefill of ``reqs`` (pages allocated here): every prompt token's slot from the prefill's own
        page table, computed on the device. Returns (slots, request ids, K rows per layer, V rows per layer)."""
        o = self.ops
        for r in reqs:
            need = -(-self.length[r] // self.P)
            self.pages[r] = [self.alloc() for _ in range(need)]
        indptr = np.cumsum([0] + [len(self.pages[r]) for r in reqs])
        indices = np.concatenate([self.pages[r] for r in reqs])
        tok_row = np.concatenate([np.full(self.length[r], i) for i, r in enumerate(reqs)])
        tok_pos = np.concatenate([np.arange(self.length[r]) for r in reqs])
        tok_req = np.array([reqs[i] for i in tok_row])
        ind, ptr, row, pos = o.i64(indices), o.i64(indptr), o.i64(tok_row), o.i64(tok_pos)
        slots_dev = ind[ptr[row] + pos // self.P] * self.P + pos % self.P
        k = [kv_rows(la, 0, tok_req, tok_pos, self.n) for la in range(self.L)]
        v = [kv_rows(la, 1, tok_req, tok_pos, self.n) for la in range(self.L)]
        return slots_dev, [self.slot(r, p) for r, p in zip(tok_req.tolist(), tok_pos.tolist())], tok_req, k, v

    def run_prefill(self, slots_dev, k, v) -> None:
        o = self.ops
        for layer in range(self.L):
            o.append(self.flat[2 * layer], slots_dev, o.kv(k[layer]))
            o.append(self.flat[2 * layer + 1], slots_dev, o.kv(v[layer]))

    def decode_table(self, rows: list[int | None], late: bool):
        """Host page table of a decode step (a new token per live row; pages allocated when a row crosses one),
        written into the graph's static buffers; ``late``: the entries of pages allocated at this step keep the
        buffer's old values (refreshed one step late). Returns the intended slots, request ids, pad flags."""
        indices, indptr, lpl, new_at = [], [0], [], []
        slots, reqs, pads = [], [], []
        for r in rows:
            if r is None:  # a padding row: one entry, the dummy page 0, one slot used: slot 0
                indices.append(0)
                lpl.append(1)
                slots.append(0)
                reqs.append(0)
                pads.append(True)
            else:
                pos = self.length[r]
                if pos // self.P >= len(self.pages[r]):
                    self.pages[r].append(self.alloc())
                    new_at.append(len(indices) + len(self.pages[r]) - 1)
                indices += self.pages[r]
                lpl.append(pos % self.P + 1)
                slots.append(self.slot(r, pos))
                reqs.append(r)
                pads.append(False)
            indptr.append(len(indices))
        shown = self.shown_indices.copy()
        shown[:len(indices)] = indices
        if late:
            for i in new_at:
                shown[i] = self.shown_indices[i]  # the bug: this entry is refreshed at the next step
        self.shown_indices = shown
        o = self.ops
        o.set(self.indices, o.i64(shown))
        o.set(self.indptr, o.i64(indptr))
        o.set(self.lpl, o.i64(lpl))
        return slots, reqs, pads, bool(new_at)


# ------------------------------------------------------------------------------------------------ the probes

class NumpyCanary:
    """The location canary's page diff on numpy caches (torch: kvconv.capture.probe.Canary does this)."""

    def __init__(self, recorder, caches, names, page_size: int) -> None:
        self.recorder, self.caches, self.names, self.P = recorder, caches, names, page_size

    def step(self, step: int, live_slots):
        import contextlib

        @contextlib.contextmanager
        def cm():
            snap = [c.copy() for c in self.caches]
            yield
            exp = np.unique(np.asarray(live_slots, np.int64) // self.P)
            for i, c in enumerate(self.caches):
                changed = np.flatnonzero((c != snap[i]).reshape(c.shape[0], -1).any(axis=1))
                self.recorder.add(step=step, buffer_id=i, name=self.names[i], num_pages=c.shape[0],
                                  page_size=self.P, compression=1, expected=exp, changed=changed, excluded=[0])
        return cm()


def run_mode(mode: str, args, out_dir: str) -> dict:
    """One run of the schedule with plant ``mode``; writes ``out_dir/paged-MODE.kvdump``."""
    sys.path.insert(0, ROOT)
    import warnings

    from kvconv.capture.probe.values import ValueProbe
    from kvconv.capture.probe.writer import CanaryRecorder
    from kvconv.capture.probe.writes import WriteProbe

    ops = make_ops(args.backend, args.device)
    eng = Engine(args, ops)
    path = os.path.join(out_dir, f"paged-{mode}.kvdump")
    meta = {"producer": "native/workloads/paged_plants.py", "mode": mode, "backend": ops.name, "device": ops.device,
            "layers": eng.L, "rows": eng.rows, "page_size": eng.P, "num_pages": args.num_pages}
    if os.path.exists(path):
        os.remove(path)
    rec = CanaryRecorder(path, metadata=meta)
    vp = ValueProbe(rec)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore" if not os.environ.get("CUDA_INJECTION64_PATH") else "default")
        wp = WriteProbe(mirror=rec)
    if ops.name == "torch":
        from kvconv.capture.probe import Canary

        can = Canary(rec)
        for c, name in zip(eng.caches, eng.names):
            can.watch(c.view(c.shape[0], -1), name=name, page_size=eng.P, excluded=[0], mode="clone")
    else:
        can = NumpyCanary(rec, eng.caches, eng.names, eng.P)
    for c, name in zip(eng.caches, eng.names):
        vp.watch(c, name=name, page_size=eng.P)
        if ops.name == "torch":  # the tracer's cache table (a tensor's device address)
            wp.register_cache(c, page_size=eng.P, name=name)

    def probed(step, slots, reqs, pads, expect, fn):
        live = [s for s, p in zip(slots, pads) if not p]
        with wp.step(step, slots, reqs, pad=pads), vp.step(step, slots, reqs, pad=pads, expect=expect), \
                can.step(step, live):
            t = time.perf_counter_ns()
            fn()
            ops.sync()
            return time.perf_counter_ns() - t

    timings, log = [], []
    reqs0 = list(range(1, len(PROMPTS) + 1))
    for r, n in zip(reqs0, PROMPTS):
        eng.length[r] = n
    # step 0: the eager prefill of every prompt, then the decode graph's capture, whose warm-up run writes every
    # row of the all-padding table to slot 0 (the dummy page): the step maps those rows as padding rows, so every
    # write of the run belongs to a step
    slots_dev, slots, treq, k, v = eng.prefill(reqs0)
    expect = {**{eng.names[2 * la]: ops.kv(k[la]) for la in range(eng.L)},
              **{eng.names[2 * la + 1]: ops.kv(v[la]) for la in range(eng.L)}}
    graph: list = []
    pad = [0] * eng.rows

    def prefill_and_capture():
        eng.run_prefill(slots_dev, k, v)
        graph.append(ops.capture(eng.decode_body))

    timings.append(probed(0, slots + pad, treq.tolist() + pad, [False] * len(slots) + [True] * eng.rows, expect,
                          prefill_and_capture))
    log.append({"step": 0, "kind": "prefill + capture", "slots": slots, "requests": treq.tolist()})
    replay = graph[0]
    rows: list[int | None] = reqs0 + [None] * (eng.rows - len(reqs0))
    for step in range(1, args.steps + 1):
        if step == 3:  # request 1 finished after step 2: released; request 5 joins with a prefill
            wp.release([1])
            freed = eng.pages.pop(1)
            if mode == "live-twice":
                freed = freed + [eng.pages[2][-1]]  # the bug: request 2's last page is freed too, still in use
            eng.free += freed
            eng.length[5] = JOIN_PROMPT
            slots_dev, slots, treq, k, v = eng.prefill([5])
            expect = {**{eng.names[2 * la]: ops.kv(k[la]) for la in range(eng.L)},
                      **{eng.names[2 * la + 1]: ops.kv(v[la]) for la in range(eng.L)}}
            timings.append(probed(3, slots, treq.tolist(), [False] * len(slots), expect,
                                  lambda s=slots_dev, k=k, v=v: eng.run_prefill(s, k, v)))
            log.append({"step": 3, "kind": "prefill", "slots": slots, "requests": treq.tolist(), "freed": freed})
            rows[0] = 5
            continue
        slots, reqs, pads, grew = eng.decode_table(rows, late=(mode == "late-table" and step == 2))
        live = [r for r in rows if r is not None]
        pos = [eng.length[r] for r in live]
        k_new = np.zeros((eng.L, eng.rows, eng.n), np.uint16)
        v_new = np.zeros((eng.L, eng.rows, eng.n), np.uint16)
        for la in range(eng.L):
            k_new[la, :len(live)] = kv_rows(la, 0, live, pos, eng.n)
            v_new[la, :len(live)] = kv_rows(la, 1, live, pos, eng.n)
        kd, vd = ops.kv(k_new), ops.kv(v_new)
        if not (mode == "stale-k" and step == 5):  # the plant: the K source buffer is not refilled at step 5
            ops.set(eng.k_src, kd)
        ops.set(eng.v_src, vd)
        expect = {**{eng.names[2 * la]: kd[la] for la in range(eng.L)},
                  **{eng.names[2 * la + 1]: vd[la] for la in range(eng.L)}}
        timings.append(probed(step, slots, reqs, pads, expect, replay))
        log.append({"step": step, "kind": "decode", "slots": slots, "requests": reqs, "new_page": grew})
        for r in live:
            eng.length[r] += 1
    rec.close()
    return {"mode": mode, "dump": path, "backend": ops.name, "device": ops.device, "write_probe": wp.active,
            "steps": log, "step_ns": timings, "value_probe_ns": vp.timings}


def _verdict(path: str) -> dict:
    from kvconv.check.validate import validate

    rep = validate(path)
    codes: dict[str, int] = {}
    for f in rep.findings:
        if f.severity == "error":
            codes[f.code] = codes.get(f.code, 0) + f.count
    return {"verdict": rep.verdict, "errors": codes}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="folder for the dumps (made if missing)")
    ap.add_argument("--mode", choices=MODES + ("all",), default="all")
    ap.add_argument("--backend", choices=["auto", "torch", "numpy"], default="auto")
    ap.add_argument("--device", default=None, help="torch device (default cuda when available, else cpu)")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--rows", type=int, default=5, help="decode batch rows of the graph (>= 5: 4 requests + a pad)")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--page-size", type=int, default=4)
    ap.add_argument("--num-pages", type=int, default=32)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--record", action="store_true",
                    help="run each mode in a child under kvconv record --writes -k index_copy (tracer dump beside)")
    ap.add_argument("--no-check", action="store_true", help="do not validate the dumps written")
    ap.add_argument("--json", help="also write the summary lines to this file")
    args = ap.parse_args(argv)
    if args.rows < len(PROMPTS) + 1 or args.steps < 6:
        ap.error("--rows must be at least 5 and --steps at least 6 (the plants need the whole schedule)")
    os.makedirs(args.out, exist_ok=True)
    modes = MODES if args.mode == "all" else (args.mode,)
    lines = []
    for mode in modes:
        if args.record:
            trace = os.path.join(args.out, f"paged-{mode}.trace.kvdump")
            child = [a for a in (argv if argv is not None else sys.argv[1:]) if a != "--record"]
            i = child.index("--mode") if "--mode" in child else None
            child = (child[:i] + child[i + 2:] if i is not None else child) + ["--mode", mode, "--no-check"]
            cmd = [sys.executable, "-m", "kvconv", "record", "--writes", "--force", "-k", "index_copy",
                   "-o", trace, "--", sys.executable, os.path.abspath(__file__), *child]
            path = os.pathsep.join(x for x in (ROOT, os.environ.get("PYTHONPATH")) if x)
            p = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": path}, capture_output=True, text=True)
            res = {"mode": mode, "record_exit": p.returncode, "trace": trace, "record_tail": p.stdout[-2000:] +
                   p.stderr[-2000:], "dump": os.path.join(args.out, f"paged-{mode}.kvdump")}
        else:
            res = run_mode(mode, args, args.out)
        if not args.no_check and os.path.exists(res["dump"]):
            res["check"] = _verdict(res["dump"])
            if args.record and os.path.exists(res.get("trace", "")):
                res["trace_check"] = _verdict(res["trace"])
        line = json.dumps(res, sort_keys=True)
        lines.append(line)
        print(line if args.record or args.no_check else json.dumps(
            {"mode": mode, "dump": res["dump"], "backend": res["backend"], **res.get("check", {})}, sort_keys=True))
    if args.json:
        with open(args.json, "w") as f:
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
