"""kvconv's probes inside an unmodified vLLM (0.26.0, Model Runner V2): the ``vllm.general_plugins`` entry point.

vLLM calls :func:`register` in every process it starts. With ``KVCONV_ENGINE=vllm`` (``kvconv record --writes
--engine vllm`` sets it) the plugin patches, at run time and in the process that imports them, the V2
``GPUModelRunner`` (``vllm/v1/worker/gpu/model_runner.py``) and its ``BlockTables``; the runner that allocates the KV
caches (the GPU worker, in vLLM's engine-core child by default) then:

- registers every layer's cache with the :class:`~kvconv.capture.probe.writes.WriteProbe` (``L{i}.kv``: FlashAttention
  keeps K and V of a slot in one row, ``[num_blocks, block_size, heads, 2 * head_size]``; page size = the kernel
  block size);
- records each step's slot mapping before the forward, per token its slot, its request (vLLM's request id numbered
  from 1 in order of appearance) and the pads (-1), computed on the host from the block ids the scheduler handed the
  runner (``BlockTables.append_block_ids``) and the positions (``num_computed_tokens``): the engine's own intent, read
  without a device synchronisation, whatever the replay then reads (``KVCONV_VLLM_MAPPING=device`` reads the device
  buffer ``BlockTables.slot_mappings`` instead, one synchronisation a step);
- releases the finished and preempted requests the scheduler names at the next step (``WriteProbe.release``);
- with ``KVCONV_VALUE=1``, runs the :class:`~kvconv.capture.probe.values.ValueProbe` on the steps whose cache write
  runs in Python (PIECEWISE and eager steps: ``unified_kv_cache_update`` is a splitting op), the expected rows being
  the K and V handed to ``FlashAttentionImpl.do_kv_cache_update``;
- with ``KVCONV_CANARY=1``, runs the location canary (:class:`~kvconv.capture.probe.Canary`) on every step, page =
  the kernel block, nothing excluded (vLLM's pads are -1 and write nothing): a page written by a kernel the tracer
  was not told of (``-k``) shows as ``canary-unexpected-write``;
- records each dummy forward (warm-up, graph capture: ``prepare_dummy_attn``, ``prepare_inputs_to_capture``) as a
  step whose every row is a pad, numbered as the real step that follows it: a cache write there is a write no token
  asked for (``writes-unmapped-slot``, vllm-project/vllm#38719's shape);
- under ``kvconv record --capture-range profiler``, records steps only between the engine's
  ``cudaProfilerStart``/``Stop`` (vLLM's ``profiler_config={"profiler": "cuda"}``, ``/start_profile`` and
  ``/stop_profile`` of ``vllm serve``), as the tracer does, and writes its dump at the stop.

Everything goes into the probe's own dump: under ``kvconv record``, ``<-o's stem>.vllm-<pid>.probe.kvdump`` beside
the tracer's dump whatever ``KVCONV_PROBE_OUTPUT`` says (record finds and judges it with the run); elsewhere
``KVCONV_PROBE_OUTPUT``, default that same name or ``./kvconv-vllm-<pid>.probe.kvdump``. Its metadata names the
process (pid, ppid, hostname) and what the plugin was asked (``asked``). It is written when the runner
shuts down, at exit, or after ``KVCONV_PROBE_STEPS`` steps; the tracer (``kvconv record --writes``) gets the caches
and steps too. An error in the plugin never reaches the engine: it is printed once, noted in the dump's metadata
(``plugin_errors``), and the plugin stops recording.

    >>> import numpy as np
    >>> ids = {}
    >>> request_ids(["a", "b"], np.array([2, 1]), 4, ids).tolist(), ids
    ([1, 1, 2, 0], {'a': 1, 'b': 2})
"""

from __future__ import annotations

import atexit
import os
import sys
import warnings

from kvconv.capture.engines._hooks import (
    after_import,
    guarded,
    probe_metadata,
    probe_output,
    stop_probe,
    version_of,
)

ENV = "KVCONV_ENGINE"
RUNNER_V2 = "vllm.v1.worker.gpu.model_runner"
RUNNER_V1 = "vllm.v1.worker.gpu_model_runner"
BLOCK_TABLE_V2 = "vllm.v1.worker.gpu.block_table"
FLASH_ATTN = "vllm.v1.attention.backends.flash_attn"
CUDAGRAPH_V2 = "vllm.v1.worker.gpu.cudagraph_utils"
_registered = False
_sessions: list = []  # the _Session of each runner that allocated KV caches in this process
# Under --capture-range profiler the probes follow the tracer's range: closed until the engine's cudaProfilerStart.
_window = {"open": True, "stop_closes": False}


def register() -> None:
    """The entry point: patch vLLM's runner where it is imported, if ``KVCONV_ENGINE=vllm``; else nothing."""
    global _registered
    if os.environ.get(ENV, "").lower() != "vllm" or _registered:
        return
    _registered = True
    after_import(BLOCK_TABLE_V2, _patch_block_tables)
    after_import(RUNNER_V2, _patch_runner)
    after_import(RUNNER_V1, _patch_runner_v1)
    after_import(CUDAGRAPH_V2, _patch_capture)
    if os.environ.get("KVCONV_VALUE") == "1":
        after_import(FLASH_ATTN, _patch_flash_attn)
    if os.environ.get("KVCONV_CAPTURE_RANGE") == "profiler":
        _window.update(open=False, stop_closes=os.environ.get("KVCONV_CAPTURE_RANGE_END", "stop") != "repeat")
        after_import("torch.cuda.profiler", _patch_profiler)


# ---- pure functions: vLLM's per-step host arrays -> the probe's rows (tests/test_engine_vllm.py) ----

def request_ids(req_ids, num_scheduled, num_padded: int, ids: dict):
    """Per token of a step (``num_padded`` rows, batch rows' tokens first), its request as a number >= 1 (0: a pad).
    ``req_ids``: the batch rows' vLLM request ids; ``num_scheduled``: tokens per batch row; ``ids``: str -> number,
    extended in order of first appearance (kept across steps)."""
    import numpy as np

    nums = np.array([ids.setdefault(r, len(ids) + 1) for r in req_ids], np.uint64)
    counts = np.asarray(num_scheduled, np.int64)
    if len(counts) != len(nums) or (counts < 0).any():
        raise ValueError(f"{len(nums)} requests, {len(counts)} token counts")
    out = np.zeros(num_padded, np.uint64)
    n = int(counts.sum())
    if n > num_padded:
        raise ValueError(f"{n} tokens do not fit in {num_padded} rows")
    out[:n] = np.repeat(nums, counts)
    return out


def host_slots(table, rows, num_computed, num_scheduled, block_size: int, num_padded: int):
    """The step's slot per token, as ``_compute_slot_mappings_kernel`` computes it without context parallelism:
    token ``j`` of batch row ``b`` is at position ``num_computed[b] + j``, in block ``table[rows[b], pos //
    block_size]`` at offset ``pos % block_size``; rows past the real tokens are -1 (PAD_SLOT_ID). ``table``: the
    kernel block ids per request row ``[max_reqs, max_blocks]``."""
    import numpy as np

    counts = np.asarray(num_scheduled, np.int64)
    n = int(counts.sum())
    if n > num_padded:
        raise ValueError(f"{n} tokens do not fit in {num_padded} rows")
    starts = np.cumsum(counts) - counts
    pos = np.repeat(np.asarray(num_computed, np.int64) - starts, counts) + np.arange(n)
    req = np.repeat(np.asarray(rows, np.int64), counts)
    blk = pos // block_size
    table = np.asarray(table)
    if n and (blk >= table.shape[1]).any():
        raise ValueError(f"a position past the block table's {table.shape[1]} blocks")
    out = np.full(num_padded, -1, np.int64)
    out[:n] = table[req, blk].astype(np.int64) * block_size + pos % block_size
    return out


def page_order(shape, strides, block_size: int):
    """The permutation that makes a cache ``[num_blocks, block_size, ...]`` contiguous in memory (a slot one row of
    bytes), or None where its slots are scattered (HND: heads outside the token dimension) or it has gaps."""
    dims = sorted(range(len(shape)), key=lambda i: (-int(strides[i]) if shape[i] > 1 else 1, i))
    if dims[0] != 0 or len(shape) < 2 or int(shape[dims[1]]) != block_size:
        return None
    expect = 1
    for i in reversed(dims):
        if shape[i] > 1 and int(strides[i]) != expect:
            return None
        expect *= int(shape[i])
    return tuple(dims)


class BlockMirror:
    """The block ids the scheduler handed the runner, per request row (group 0, kernel blocks), kept on the host as
    ``BlockTables.append_block_ids`` stages them for the device."""

    def __init__(self, max_reqs: int, max_blocks: int) -> None:
        import numpy as np

        self.table = np.zeros((max_reqs, max_blocks), np.int32)

    def append(self, row: int, start: int, block_ids) -> None:
        ids = list(block_ids)
        self.table[row, start:start + len(ids)] = ids


# ---- the session: one per runner that allocates KV caches (the GPU worker) ----

def probe_path(tracer_output: str | None, pid: int, *, engine: str = "vllm") -> str:
    """The probe dump beside the tracer's (``kvconv record -o``'s path, its %p and %c filled in), or in the working
    folder (:func:`kvconv.check.runs.probe_path`).

    >>> probe_path("runs/run-%p.kvdump", 42), probe_path(None, 42).endswith("kvconv-vllm-42.probe.kvdump")
    ('runs/run-42.vllm-42.probe.kvdump', True)
    """
    from kvconv.check import runs

    return runs.probe_path(tracer_output, pid, engine=engine)


class _Session:
    """The probes of one runner: caches registered after ``initialize_kv_cache``, a step opened after
    ``prepare_attn`` (the mapping is final, nothing launched of the forward yet) and closed when ``execute_model``
    returns, releases at the next ``execute_model``."""

    def __init__(self, runner) -> None:
        self.runner = runner
        self.recorder = self.writes = self.values = self.canary = None
        self.step = 0
        self.dummies = 0  # dummy forwards recorded (every row a pad)
        self.value_open = False  # a value-probe step is open: do_kv_cache_update's rows are expected
        self.ids: dict[str, int] = {}
        self.open: list = []  # the step's entered context managers
        self.names: dict[int, tuple[str, object]] = {}  # cache data_ptr -> (name, page view), for the value rows
        self.mode = None  # the step's CUDA-graph mode (dispatch_cg_and_sync_dp)
        self.rows = 0  # the open step's slot count (the value rows to hand over)
        self.broken = False
        self.limit = int(os.environ.get("KVCONV_PROBE_STEPS", "0") or 0)
        self.device_map = os.environ.get("KVCONV_VLLM_MAPPING", "host") == "device"

    def fail(self, what: str, exc: BaseException) -> None:
        """Stop recording, say so once, note it in the dump: the engine goes on."""
        text = stop_probe(self, "vllm", what, exc)
        if text is not None:
            warnings.warn(f"kvconv vllm plugin: {text}", RuntimeWarning, stacklevel=2)

    def attach(self) -> None:
        from kvconv.capture.probe import CanaryRecorder
        from kvconv.capture.probe.writes import WriteProbe

        r = self.runner
        groups = r.kv_cache_config.kv_cache_groups
        if len(groups) != 1 or getattr(r, "dcp_size", 1) != 1 or getattr(r, "pcp_manager", None) is not None:
            raise RuntimeError(f"{len(groups)} KV-cache groups or context parallelism: one group, no CP is covered")
        kbs = int(r.kernel_block_sizes[0])
        meta = {"producer": "kvconv.capture.engines.vllm", "engine": "vllm", "vllm_version": version_of("vllm"),
                "runner": "v2", "mapping": "device" if self.device_map else "host", "block_size": kbs,
                "plant": os.environ.get("KVCONV_PLANT") or None, **probe_metadata("vllm")}
        path, self.where = probe_output("vllm")
        self.recorder = CanaryRecorder(path, metadata=meta)
        atexit.register(guarded, self, "writing the probe dump at exit", self.close)
        with warnings.catch_warnings():  # no tracer here: the mapping still goes into the probe's dump
            warnings.simplefilter("ignore")
            self.writes = WriteProbe(mirror=self.recorder)
        if os.environ.get("KVCONV_VALUE") == "1":
            from kvconv.capture.probe.values import ValueProbe

            self.values = ValueProbe(self.recorder)
        for i, kv in enumerate(r.kv_caches):
            order = page_order(tuple(kv.shape), kv.stride(), kbs)
            if order is None:
                raise RuntimeError(f"layer {i}: cache {tuple(kv.shape)} strides {kv.stride()}: slots not rows")
            view = kv.permute(*order)
            self.writes.register_cache(view, page_size=kbs, name=f"L{i}.kv")
            if self.values is not None:
                self.values.watch(view, name=f"L{i}.kv", page_size=kbs)
            self.names[int(kv.data_ptr())] = (f"L{i}.kv", view)
        if os.environ.get("KVCONV_CANARY") == "1":
            self.canary = location_canary(self.recorder, [(n, v) for n, v in self.names.values()], kbs)
        print(f"kvconv vllm plugin: {len(r.kv_caches)} caches registered (page {kbs}), probe dump "
              f"{self.recorder.path} ({self.where}), tracer {'on' if self.writes.active else 'off'}, location canary "
              f"{'on' if self.canary is not None else 'off'}", file=sys.stderr, flush=True)

    def mapping(self, batch):
        """(slots, request ids, pads) of the step, host arrays of ``num_tokens_after_padding`` rows."""
        import numpy as np

        n, real = int(batch.num_tokens_after_padding), int(batch.num_tokens)
        reqs = request_ids(batch.req_ids, batch.num_scheduled_tokens, n, self.ids)
        bt = self.runner.block_tables
        if self.device_map:
            slots = bt.slot_mappings[0, :n].cpu().numpy().astype(np.int64)
        else:
            slots = host_slots(bt._kvconv_mirror.table, batch.idx_mapping_np, batch.num_computed_tokens_np,
                               batch.num_scheduled_tokens, int(self.runner.kernel_block_sizes[0]), n)
        pads = np.arange(n) >= real
        return slots, reqs, pads | (slots < 0)

    def begin(self, batch) -> None:
        self.finish()  # a dummy forward's step left open (graph capture) ends here
        if self.writes is None:
            return
        if not _window["open"]:  # outside the capture range: counted, so that step numbers are the runner's
            self.step += 1
            return
        slots, reqs, pads = self.mapping(batch)
        self.rows = len(slots)
        self.enter(self.writes.step(self.step, slots, reqs, pad=pads))
        if self.values is not None and getattr(self.mode, "name", None) != "FULL":  # FULL: no rows to hand over
            self.enter(self.values.step(self.step, slots, reqs, pad=pads))
            self.value_open = True
        if self.canary is not None:
            self.enter(self.canary.step(self.step, slots[~pads]))
        self.step += 1

    def begin_dummy(self, rows: int) -> None:
        """A dummy forward (warm-up, graph capture): its intent is to write nothing, every row a pad (-1); it takes
        the number of the real step that follows it."""
        import numpy as np

        self.finish()
        if self.writes is None or not _window["open"]:
            return
        n = int(rows)
        self.enter(self.writes.step(self.step, np.full(n, -1, np.int64), np.zeros(n, np.uint64),
                                    pad=np.ones(n, bool)))
        self.dummies += 1

    def enter(self, cm) -> None:
        cm.__enter__()
        self.open.append(cm)

    def finish(self) -> None:
        """Close the open step's context managers (the canary's compare, the probes' records)."""
        self.value_open = False
        while self.open:
            self.open.pop().__exit__(None, None, None)

    def end(self) -> None:
        self.finish()
        if self.limit and self.step >= self.limit and self.recorder is not None:
            self.close()

    def release(self, scheduler_output) -> None:
        if self.writes is None:
            return
        done = set(scheduler_output.finished_req_ids or ())
        done |= set(getattr(scheduler_output, "preempted_req_ids", None) or ())
        nums = sorted(self.ids[r] for r in done if r in self.ids)
        if nums:
            self.writes.release(nums)

    def expect(self, kv_cache, key, value) -> None:
        """The rows ``do_kv_cache_update`` is handed, as the cache stores them: per head K then V."""
        if not self.value_open or self.values is None:
            return
        name, view = self.names.get(int(kv_cache.data_ptr()), (None, None))
        if name is None:
            return
        import torch

        if key.dim() != 3 or value.shape != key.shape:
            raise RuntimeError(f"K {tuple(key.shape)}, V {tuple(value.shape)}: [tokens, heads, head_size] expected")
        n, width = self.rows, int(key.shape[-1])
        m = min(n, int(key.shape[0]))  # the rows past the key's are pads (not checked)
        rows = torch.cat([key[:m].reshape(m, -1, width), value[:m].reshape(m, -1, width)], dim=-1).reshape(m, -1)
        if m < n:
            rows = torch.cat([rows, rows.new_zeros((n - m, rows.shape[1]))])
        if rows.dtype != view.dtype:
            raise RuntimeError(f"K/V rows are {rows.dtype}, the cache {view.dtype}: a quantised cache is not covered")
        self.values.expect_values(self.step - 1, name, rows)

    def close(self) -> None:
        if self.recorder is None:
            return
        self.finish()
        rec, self.recorder, self.writes, self.values, self.canary = self.recorder, None, None, None, None
        rec.metadata["request_ids"] = {str(n): rid for rid, n in self.ids.items()}  # the numbers as vLLM names them
        rec.metadata["dummy_steps"] = self.dummies
        rec.close()
        print(f"kvconv vllm plugin: probe dump written: {rec.path} ({self.step} steps)", file=sys.stderr, flush=True)


def location_canary(recorder, caches, page: int):
    """The location canary over every layer's cache (``(name, view [blocks, block_size, ...])``), page = the kernel
    block, nothing excluded: vLLM's null block 0 is never handed out and its pads (-1) write nothing, so any change
    outside the step's pages is a stray write. ``KVCONV_CANARY_MODE`` clone / checksum / auto (auto clones a cache up
    to 1 GiB: a pool of N blocks takes N x block bytes per layer again)."""
    from kvconv.capture.probe import Canary

    canary = Canary(recorder)
    mode = os.environ.get("KVCONV_CANARY_MODE", "auto")
    for name, view in caches:
        canary.watch(view.reshape(int(view.shape[0]), -1), name=name, page_size=page, excluded=(), mode=mode)
    return canary


# ---- the patches (run where vLLM's modules are imported) ----

def _wrap(owner, name: str, make) -> None:
    """Replace ``owner.name`` by ``make(original)`` once (a second registration leaves it)."""
    orig = getattr(owner, name)
    if getattr(orig, "_kvconv", False):
        return
    new = make(orig)
    new._kvconv = True
    new.__wrapped__ = orig
    setattr(owner, name, new)


def _patch_block_tables(mod) -> None:
    def make(orig):
        def append_block_ids(self, req_index, new_block_ids, overwrite):
            try:
                mirror = getattr(self, "_kvconv_mirror", None)
                if mirror is None:
                    mirror = self._kvconv_mirror = BlockMirror(*self.block_tables[0].gpu.shape)
                start = 0 if overwrite else int(self.num_blocks.np[0, req_index])
                bpk = self.blocks_per_kv_block[0]
                ids = [b * bpk + k for b in new_block_ids[0] for k in range(bpk)]
                mirror.append(int(req_index), start, ids)
            except Exception as e:  # noqa: BLE001 - the mapping is then unknown: the probe of this runner stops
                self._kvconv_mirror_error = e
            return orig(self, req_index, new_block_ids, overwrite)
        return append_block_ids
    _wrap(mod.BlockTables, "append_block_ids", make)


def _patch_runner(mod) -> None:
    cls = mod.GPUModelRunner

    def init(orig):
        def initialize_kv_cache(self, *a, **kw):
            out = orig(self, *a, **kw)
            self._kvconv = s = _Session(self)
            _sessions.append(s)
            guarded(s, "registering the KV caches", s.attach)
            return out
        return initialize_kv_cache

    def prepare(orig):
        def prepare_attn(self, input_batch):
            out = orig(self, input_batch)
            s = getattr(self, "_kvconv", None)
            err = getattr(self.block_tables, "_kvconv_mirror_error", None)
            if err is not None and s is not None and not s.device_map:
                s.fail("mirroring the block table", err)
            guarded(s, f"recording step {getattr(s, 'step', '?')}", s and s.begin, input_batch)
            return out
        return prepare_attn

    def execute(orig):
        def execute_model(self, scheduler_output, *a, **kw):
            s = getattr(self, "_kvconv", None)
            if s is not None and not kw.get("dummy_run", False):
                guarded(s, "recording the releases", s.release, scheduler_output)
            try:
                return orig(self, scheduler_output, *a, **kw)
            finally:
                if s is not None and s.open:
                    guarded(s, f"closing step {s.step - 1}", s.end)
        return execute_model

    def dummy(orig):
        def prepare_dummy_attn(self, input_batch):
            out = orig(self, input_batch)
            s = getattr(self, "_kvconv", None)
            guarded(s, "recording a dummy forward", s and s.begin_dummy, input_batch.num_tokens_after_padding)
            return out
        return prepare_dummy_attn

    def captured(orig):
        def capture_model(self, *a, **kw):
            try:
                return orig(self, *a, **kw)
            finally:
                s = getattr(self, "_kvconv", None)
                guarded(s, "closing the last captured forward", s and s.finish)
        return capture_model

    def stop(orig):
        def shutdown(self, *a, **kw):
            s = getattr(self, "_kvconv", None)
            guarded(s, "writing the probe dump", s and s.close)
            return orig(self, *a, **kw)
        return shutdown

    def dispatch(orig):
        def dispatch_cg_and_sync_dp(cudagraph_manager, *a, **kw):
            out = orig(cudagraph_manager, *a, **kw)
            for s in _sessions_of(cudagraph_manager):
                s.mode = getattr(out[0], "cg_mode", None)
            return out
        return dispatch_cg_and_sync_dp

    for name, make in (("initialize_kv_cache", init), ("prepare_attn", prepare), ("execute_model", execute),
                       ("prepare_dummy_attn", dummy), ("capture_model", captured), ("shutdown", stop)):
        _wrap(cls, name, make)
    _wrap(mod, "dispatch_cg_and_sync_dp", dispatch)


def _patch_capture(mod) -> None:
    """Graph capture's forwards (a warm-up run, eager, then the capture) read the dummy slot mapping
    ``prepare_inputs_to_capture`` makes: each is a dummy step, closed by the next step or the end of capture."""
    def make(orig):
        def prepare_inputs_to_capture(num_reqs, num_tokens, *a, **kw):
            out = orig(num_reqs, num_tokens, *a, **kw)
            for s in _sessions:
                if getattr(s.runner, "cudagraph_manager", None) is not None:
                    guarded(s, "recording a captured forward", s.begin_dummy, num_tokens)
            return out
        return prepare_inputs_to_capture
    _wrap(mod, "prepare_inputs_to_capture", make)


def _patch_profiler(mod) -> None:
    """``torch.cuda.profiler.start``/``stop`` (vLLM's ``CudaProfilerWrapper`` calls them by attribute): the window in
    which the probes record, the tracer's ``--capture-range profiler``; the stop writes the probe dumps (unless
    ``--capture-range-end repeat``), so that a server ended by a signal has them whatever its exit path."""
    def make(orig, opened: bool):
        def toggle(*a, **kw):
            out = orig(*a, **kw)
            _window["open"] = opened
            if not opened and _window["stop_closes"]:
                for s in list(_sessions):
                    guarded(s, "writing the probe dump at the profiler's stop", s.close)
            return out
        return toggle
    _wrap(mod, "start", lambda orig: make(orig, True))
    _wrap(mod, "stop", lambda orig: make(orig, False))


def _sessions_of(manager):
    """The sessions whose runner owns this CUDA-graph manager (one runner per worker process)."""
    return [s for s in _sessions if getattr(s.runner, "cudagraph_manager", None) is manager]


def _patch_runner_v1(mod) -> None:
    def init(orig):
        def initialize_kv_cache(self, *a, **kw):
            print("kvconv vllm plugin: the V1 model runner (VLLM_USE_V2_MODEL_RUNNER=0) is not covered; nothing is "
                  "recorded (unset VLLM_USE_V2_MODEL_RUNNER)", file=sys.stderr, flush=True)
            return orig(self, *a, **kw)
        return initialize_kv_cache
    _wrap(mod.GPUModelRunner, "initialize_kv_cache", init)


def _patch_flash_attn(mod) -> None:
    def make(orig):
        def do_kv_cache_update(self, layer, key, value, kv_cache, slot_mapping):
            for s in _live_sessions():
                guarded(s, "handing over the K/V rows", s.expect, kv_cache, key, value)
            return orig(self, layer, key, value, kv_cache, slot_mapping)
        return do_kv_cache_update
    _wrap(mod.FlashAttentionImpl, "do_kv_cache_update", make)


def _live_sessions():
    """The sessions with a step open (the forward of this process's runner is running)."""
    return [s for s in _sessions if s.open]
