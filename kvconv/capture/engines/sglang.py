"""kvconv's probes inside an unmodified SGLang (0.5.12, 0.5.17): the ``sglang.srt.plugins`` entry point.

SGLang calls :func:`register` in every process that runs ``load_plugins()`` (the engine, and its scheduler child
before the ``Scheduler`` is built: ``srt/managers/scheduler.py:3999`` of the 0.5.12 wheel). With
``KVCONV_ENGINE=sglang`` (``kvconv record --engine sglang`` sets it) the plugin registers three AROUND hooks in
SGLang's own ``HookRegistry`` (``srt/plugins/hook_registry.py``), which patches the classes once all plugins ran;
nothing of SGLang's files is edited:

- ``ModelRunner.forward`` (``srt/model_executor/model_runner.py:3293``): every real forward (prefill, decode replay,
  mixed; not the warm-up and capture runs, which call the model directly). At the first one the runner's token pool
  is registered: per layer ``k_buffer[i]`` and ``v_buffer[i]`` (``MHATokenToKVPool``, ``[size + page, heads,
  head_dim]``, token-major: slot = row) as caches ``L{i}.k`` / ``L{i}.v`` of the engine's page size. Around each
  forward: the step's ``out_cache_loc`` (read on the host: one synchronisation a step), a request number per token
  (``ForwardBatch.rids``, numbered from 1 in order of first appearance) and, for a CUDA-graph replay of a padded
  batch (decode: the smallest captured size, ``cuda_graph_runner.py:1256``; a piecewise prefill: the smallest
  captured token count), the pad rows SGLang sends to its dummy slot 0;
  the write probe gets the step (``kvconv record --writes``), and with ``KVCONV_CANARY=1`` the location canary
  snapshots the watched buffers and compares them page by page after the forward (page = slot // the engine's page
  size, or ``KVCONV_CANARY_PAGE`` slots; the dummy page excluded).
- ``release_kv_cache`` (``srt/mem_cache/common.py:566``): a finished, aborted or retracted request gave its slots
  back (``WriteProbe.release``).
- ``Scheduler.flush_cache`` (``srt/managers/scheduler.py:3442``): an idle scheduler flushed its cache
  (``Engine.flush_cache()``): the probe dump is written then. SGLang ends its children with SIGKILL
  (``Engine.shutdown`` -> ``kill_process_tree``, ``srt/utils/common.py:1149``), where no exit handler runs, so a
  harness calls ``engine.flush_cache()`` before it shuts the engine down; ``KVCONV_PROBE_STEPS`` (write after that many
  steps) and a normal interpreter exit write it too.
- In the engine's own process (not a scheduler child): ``Engine.shutdown`` and ``http_server.launch_server``, so
  that a user's own ending (``llm.shutdown()``, a server's SIGINT) first lets the schedulers exit normally, their
  dumps finished (:mod:`kvconv.capture.engines.sglang_end`).

Paths above are 0.5.12's; 0.5.17 keeps the hooked names (``model_runner.py:1382``, ``mem_cache/common.py:132``,
``managers/scheduler.py:4135``) and renames the graph runners (``decode_cuda_graph_runner``,
``prefill_cuda_graph_runner``), which :func:`_graph_runner` reads under either name.

Under ``kvconv record --capture-range profiler`` the plugin opens the tracer's range at the first forward
(``cudaProfilerStart``) and closes it when the dump is written: SGLang's warm-up (thousands of eager KV writes) stays
out of the trace and of the write table.

The dump: under ``kvconv record``, ``<-o's stem>.sglang-<pid>.probe.kvdump`` beside the tracer's dump (one per
scheduler of a TP run) whatever ``KVCONV_PROBE_OUTPUT`` says: record finds and judges it with the run. Elsewhere
``KVCONV_PROBE_OUTPUT`` (``%p``: the process id), else that same name (or ``./kvconv-sglang-<pid>.probe.kvdump``). Its
metadata names the process (pid, ppid, hostname) and what the plugin was asked (``asked``). An error in the plugin
never reaches the engine: it is printed once, kept in the dump's metadata (``plugin_errors``), and the plugin stops
recording.

    >>> step_rows([7, 9, 3], ["a", "b"], [2, 1], 5, {})
    (array([7, 9, 3, 0, 0]), array([1, 1, 2, 0, 0], dtype=uint64), array([False, False, False,  True,  True]))
"""

from __future__ import annotations

import atexit
import bisect
import os
import sys
import warnings

from kvconv.capture.engines._hooks import guarded, probe_metadata, probe_output, stop_probe, version_of
from kvconv.capture.engines.vllm import request_ids

ENV = "KVCONV_ENGINE"
FORWARD = "sglang.srt.model_executor.model_runner.ModelRunner.forward"
RELEASE = "sglang.srt.mem_cache.common.release_kv_cache"
FLUSH = "sglang.srt.managers.scheduler.Scheduler.flush_cache"
PAD_SLOT = 0  # SGLang's dummy slot: padded rows write it (mem_cache/allocator.py: free pages start at 1)
_registered = False
_sessions: list = []


def register() -> None:
    """The entry point: hook SGLang's runner through its HookRegistry, if ``KVCONV_ENGINE=sglang``; else nothing."""
    global _registered
    if os.environ.get(ENV, "").lower() != "sglang" or _registered:
        return
    _registered = True
    try:
        from sglang.srt.plugins.hook_registry import HookRegistry, HookType
    except ImportError as e:
        print(f"kvconv sglang plugin: no sglang.srt.plugins.hook_registry ({e}): SGLang's plugin hooks (0.5.12 "
              f"or later) are needed; nothing is recorded", file=sys.stderr, flush=True)
        return
    HookRegistry.register(FORWARD, around_forward, HookType.AROUND)
    HookRegistry.register(RELEASE, around_release, HookType.AROUND)
    HookRegistry.register(FLUSH, around_flush, HookType.AROUND)
    import multiprocessing

    if multiprocessing.parent_process() is None:  # the engine's own process, not a scheduler child: its ending
        from kvconv.capture.engines import sglang_end

        sglang_end.register(HookRegistry, HookType)


# ---- pure functions: a ForwardBatch's host arrays -> the probe's rows (tests/test_engine_sglang.py) ----

def token_counts(*, decode: bool, batch_size: int, num_tokens: int, extend_lens=None) -> list[int]:
    """Tokens per request of a forward, in ``out_cache_loc``'s order: decode (and verify) batches the same number per
    request; extend and mixed batches ``extend_seq_lens_cpu``."""
    if decode or extend_lens is None:
        if batch_size <= 0 or num_tokens % batch_size:
            raise ValueError(f"{num_tokens} tokens do not split over {batch_size} requests")
        return [num_tokens // batch_size] * batch_size
    counts = [int(c) for c in extend_lens]
    if sum(counts) != num_tokens:
        raise ValueError(f"extend lengths sum to {sum(counts)}, out_cache_loc holds {num_tokens}")
    return counts


def graph_rows(capture_bs, batch_size: int, tokens_per_bs: int = 1) -> int:
    """The rows a CUDA-graph replay writes: the smallest captured batch size >= the batch's, times the tokens per
    request (``CudaGraphRunner.replay_prepare``: rows past the batch are pads that write slot 0).

    >>> graph_rows([1, 2, 4, 8], 3)
    4
    """
    sizes = sorted(int(b) for b in capture_bs)
    i = bisect.bisect_left(sizes, int(batch_size))
    if i == len(sizes):
        raise ValueError(f"batch {batch_size} is larger than every captured size {sizes}")
    return sizes[i] * int(tokens_per_bs)


def step_rows(slots, rids, counts, rows: int, ids: dict):
    """(slots, request numbers, pad flags) of ``rows`` rows: the real tokens' slots, then pad rows at slot 0."""
    import numpy as np

    real = np.asarray(slots, np.int64).reshape(-1)
    if len(real) > rows:
        raise ValueError(f"{len(real)} tokens do not fit in {rows} rows")
    out = np.full(rows, PAD_SLOT, np.int64)
    out[: len(real)] = real
    pads = np.arange(rows) >= len(real)
    return out, request_ids(list(rids), counts, rows, ids), pads


def page_view(buf, page_slots: int):
    """``buf`` (``[slots, ...]``, token-major) as ``[pages, page_slots * row]``: the whole pages only."""
    n = (int(buf.shape[0]) // page_slots) * page_slots
    if n == 0:
        raise ValueError(f"a buffer of {int(buf.shape[0])} slots holds no page of {page_slots}")
    return buf[:n].reshape(n // page_slots, -1)


def pool_caches(k_buffer, v_buffer, page_size: int, start_layer: int = 0) -> list:
    """(name, view ``[pages, page_size, ...]``) of every layer's K and V buffer of an MHA token pool."""
    if not k_buffer or len(k_buffer) != len(v_buffer):
        raise RuntimeError(f"{len(k_buffer or ())} K and {len(v_buffer or ())} V buffers: an MHA pool is covered")
    out = []
    for i, (k, v) in enumerate(zip(k_buffer, v_buffer)):
        for part, t in (("k", k), ("v", v)):
            if int(t.shape[0]) % page_size:
                raise RuntimeError(f"layer {i + start_layer} {part}: {int(t.shape[0])} slots, page {page_size}")
            out.append((f"L{i + start_layer}.{part}", t.reshape(-1, page_size, *t.shape[1:])))
    return out


# ---- the session: one per ModelRunner (target model) that runs forwards in this process ----

class _Session:
    """The probes of one runner: the pool registered at its first forward, a step around each forward."""

    def __init__(self, runner) -> None:
        self.runner = runner
        self.recorder = self.writes = self.canary = None
        self.step = 0
        self.ids: dict[str, int] = {}
        self.open: list = []
        self.broken = False
        self.limit = int(os.environ.get("KVCONV_PROBE_STEPS", "0") or 0)

    def fail(self, what: str, exc: BaseException) -> None:
        """Stop recording, say so once, note it in the dump: the engine goes on."""
        stop_probe(self, "sglang", what, exc)

    def attach(self) -> None:
        from kvconv.capture.probe import CanaryRecorder
        from kvconv.capture.probe.writes import WriteProbe

        r = self.runner
        pool, alloc = r.token_to_kv_pool, r.token_to_kv_pool_allocator
        page = int(getattr(alloc, "page_size", 1) or 1)
        _check_layout(pool)
        caches = pool_caches(getattr(pool, "k_buffer", None), getattr(pool, "v_buffer", None), page,
                             int(getattr(pool, "start_layer", 0) or 0))
        meta = {"producer": "kvconv.capture.engines.sglang", "engine": "sglang", "sglang_version": version_of("sglang"),
                "page_size": page, "pool": type(pool).__name__, "plant": os.environ.get("KVCONV_PLANT") or None,
                **probe_metadata("sglang")}
        path, where = probe_output("sglang")  # one per scheduler of a TP run (its pid in the name)
        self.recorder = CanaryRecorder(path, metadata=meta)
        atexit.register(guarded, self, "writing the probe dump at exit", self.close)
        with warnings.catch_warnings():  # no tracer here: the mapping still goes into the probe's dump
            warnings.simplefilter("ignore")
            self.writes = WriteProbe(mirror=self.recorder)
        if self.writes.active:
            for name, view in caches:
                self.writes.register_cache(view, page_size=page, name=name)
        if os.environ.get("KVCONV_CANARY") == "1":
            self.canary = _location_canary(self.recorder, caches, page)
        if _profiler_range(True):
            self.recorder.metadata["capture_range"] = "profiler: started at the first forward, stopped at the dump"
        print(f"kvconv sglang plugin: {len(caches)} caches registered (page {page}), probe dump {self.recorder.path} "
              f"({where}), tracer {'on' if self.writes.active else 'off'}, location canary "
              f"{'on' if self.canary is not None else 'off'}", file=sys.stderr, flush=True)

    def mapping(self, fb):
        """(slots, request numbers, pads, real slots) of a forward, host arrays."""
        import numpy as np

        loc = fb.out_cache_loc
        real = np.asarray(loc.detach().reshape(-1).cpu().numpy() if hasattr(loc, "detach") else loc, np.int64)
        mode = fb.forward_mode
        decode = bool(mode.is_decode() or mode.is_target_verify())
        counts = token_counts(decode=decode, batch_size=int(fb.batch_size), num_tokens=len(real),
                              extend_lens=None if decode else fb.extend_seq_lens_cpu)
        slots, reqs, pads = step_rows(real, fb.rids or [], counts, self.padded_rows(fb, len(real)), self.ids)
        return slots, reqs, pads, real

    def padded_rows(self, fb, n: int) -> int:
        """The rows the forward writes: a decode replay pads the batch to a captured size, a piecewise prefill replay
        its tokens to a captured count (``piecewise_cuda_graph_runner.py:656``), both with slot 0; as
        ``ModelRunner._forward_raw`` / ``forward_extend`` decide (``model_runner.py:3390``, ``:3202``). SGLang 0.5.17
        names them ``decode_cuda_graph_runner`` / ``prefill_cuda_graph_runner`` (``can_run_graph``; the decode
        graph's tokens per request ``captured_req_width``; pads zeroed by the buffer registry's ZERO policy)."""
        mode, r = fb.forward_mode, self.runner
        g, runs = _graph_runner(r, "decode_cuda_graph_runner", "graph_runner")
        if mode.is_cuda_graph() and runs(fb):
            width = getattr(g, "captured_req_width", None) or getattr(g, "num_tokens_per_bs", 1)
            return max(n, graph_rows(g.capture_bs, int(fb.batch_size), int(width)))
        pw, runs = _graph_runner(r, "prefill_cuda_graph_runner", "piecewise_cuda_graph_runner")
        if not mode.is_decode() and mode.is_extend() and runs(fb):
            return max(n, graph_rows(pw.capture_num_tokens, n))
        return n

    def begin(self, fb) -> None:
        if self.recorder is None or fb.forward_mode.is_idle():
            return
        slots, reqs, pads, real = self.mapping(fb)
        for cm in (self.writes.step(self.step, slots, reqs, pad=pads),
                   self.canary.step(self.step, real) if self.canary is not None else None):
            if cm is not None:
                cm.__enter__()
                self.open.append(cm)
        self.step += 1

    def end(self) -> None:
        while self.open:
            self.open.pop().__exit__(None, None, None)
        if self.limit and self.step >= self.limit:
            self.close()

    def release(self, rid) -> None:
        if self.writes is not None and rid in self.ids:
            self.writes.release([self.ids[rid]])

    def close(self) -> None:
        if self.recorder is None:
            return
        rec, self.recorder, self.writes, self.canary = self.recorder, None, None, None
        self.open.clear()
        rec.metadata["request_ids"] = {str(n): rid for rid, n in self.ids.items()}  # SGLang's rid per number
        rec.close()
        _profiler_range(False)
        print(f"kvconv sglang plugin: probe dump written: {rec.path} ({self.step} steps)", file=sys.stderr, flush=True)


def _graph_runner(runner, name: str, old_name: str):
    """(graph runner, can-it-replay(fb)) of ``runner`` under SGLang 0.5.17's name or 0.5.12's; an eager stand-in
    (0.5.17's ``EagerRunner``) or none: (None, never)."""
    g = getattr(runner, name, None) or getattr(runner, old_name, None)
    if g is None or type(g).__name__ == "EagerRunner":
        return None, lambda fb: False
    return g, getattr(g, "can_run_graph", None) or g.can_run


def _check_layout(pool) -> None:
    """The plugin reads a slot as a row of each layer's buffer: SGLang's NHD layout (the default); its HND
    (``SGLANG_USE_HND_KVCACHE``) and vectorized layouts scatter a slot over a page."""
    layout = getattr(pool, "kv_cache_layout", "nhd")
    if getattr(pool, "use_hnd", False) or layout not in ("nhd", None):
        raise RuntimeError(f"KV layout {'hnd' if getattr(pool, 'use_hnd', False) else layout!r}: the plugin maps "
                           f"slots of the NHD layout only (one row per slot)")


def _location_canary(recorder, caches, page: int):
    """The location canary over every cache, page = ``KVCONV_CANARY_PAGE`` slots (default: the engine's page), the
    pages holding the dummy slot 0 excluded; ``KVCONV_CANARY_MODE`` clone / checksum / auto."""
    from kvconv.capture.probe import Canary

    cp = int(os.environ.get("KVCONV_CANARY_PAGE", "0") or 0) or page
    canary = Canary(recorder)
    mode = os.environ.get("KVCONV_CANARY_MODE", "auto")
    dummy = list(range(-(-page // cp)))  # the canary pages over the engine's dummy page (slots 0 .. page - 1)
    for name, view in caches:
        canary.watch(page_view(view.reshape(-1, *view.shape[2:]), cp), name=name, page_size=cp, excluded=dummy,
                     mode=mode)
    return canary


def _profiler_range(start: bool) -> bool:
    """Under ``kvconv record --capture-range profiler``: the tracer's range is the plugin's window (warm-up, memory
    profiling and graph capture call the model directly, never ``ModelRunner.forward``, so they stay out)."""
    if os.environ.get("KVCONV_CAPTURE_RANGE") != "profiler":
        return False
    import torch

    (torch.cuda.profiler.start if start else torch.cuda.profiler.stop)()
    return True


# ---- the hooks (HookRegistry AROUND: hook(original, *args, **kwargs)) ----

def session_of(runner) -> _Session | None:
    """The runner's session, made and attached at its first forward; None for a draft model's runner."""
    s = getattr(runner, "_kvconv", None)
    if s is None and not getattr(runner, "is_draft_worker", False):
        s = runner._kvconv = _Session(runner)
        _sessions.append(s)
        guarded(s, "registering the token pool", s.attach)
    return s


def around_forward(original, runner, forward_batch, *a, **kw):
    s = session_of(runner)
    if s is None or s.broken or s.recorder is None:
        return original(runner, forward_batch, *a, **kw)
    guarded(s, f"recording step {s.step}", s.begin, forward_batch)
    try:
        return original(runner, forward_batch, *a, **kw)
    finally:
        if s.open:
            guarded(s, f"closing step {s.step - 1}", s.end)


def around_release(original, req, *a, **kw):
    out = original(req, *a, **kw)
    for s in _sessions:
        guarded(s, "recording a release", s.release, getattr(req, "rid", None))
    return out


def around_flush(original, scheduler, *a, **kw):
    ok = original(scheduler, *a, **kw)
    if ok:  # idle, nothing in flight: the run's end as the harness marks it (Engine.flush_cache)
        for s in _sessions:
            guarded(s, "writing the probe dump at flush_cache", s.close)
    return ok
