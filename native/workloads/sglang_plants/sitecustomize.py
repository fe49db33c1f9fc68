"""Planted engine bugs in an unmodified SGLang (0.5.12, 0.5.17), for kvconv's canaries to catch (issues 40, 49).

With this folder first on PYTHONPATH, Python imports this file at start-up in every process SGLang starts (the
scheduler child too); ``KVCONV_PLANT=<name>`` picks the bug, which is patched into SGLang's classes right after their
modules are imported (never into the installed files) and acts once. Then the next ``sitecustomize.py`` on the path
runs (the SGLang bundle's own: transformers' ``AutoConfig.register``), which this one would otherwise hide. Each plant
says on stderr what it did: the step (numbered as the kvconv plugin numbers them: ``ModelRunner.forward`` calls that
are not idle, from 0), request (SGLang's rid and kvconv's number: order of first appearance, from 1), slot and page.

    $ PYTHONPATH=native/workloads/sglang_plants:$PWD KVCONV_PLANT=loc-shift KVCONV_ENGINE=sglang python run.py ...

Read against the sglang-0.5.12 wheel (paths under ``sglang/``):

- ``loc-shift``: at the first decode replay at step >= KVCONV_PLANT_STEP, batch row 0's slot in the graph's static
  ``out_cache_loc`` is moved by the batch's token count, after ``DecodeInputBuffers.populate_from_forward_batch``
  copied the engine's (``srt/model_executor/cuda_graph_runner.py:282``, the copy ``:315``): the replay writes that
  request's K/V to a slot no token of the step maps (the next step's), and not to its own;
- ``freed-reuse``: before the first decode batch at step >= KVCONV_PLANT_STEP is allocated
  (``ScheduleBatch.prepare_for_decode``, ``srt/managers/schedule_batch.py:2286``, which calls ``alloc_for_decode``,
  ``srt/mem_cache/common.py:524``), the first prompt slot of batch row 1's request, still in its ``req_to_token`` row
  and read by every later step, is put back at the head of the allocator's free list
  (``TokenToKVPoolAllocator.free_pages``, ``srt/mem_cache/allocator.py:121``): row 0's request is handed it, in
  place of the free slot it would have had; that slot is freed when the first owner frees the shared one, so the
  allocator's books balance at the end and SGLang's own idle checks do not end the run (issue 49: the 0.5.12 run
  died, exit 137, and nothing was judged);
- ``outside-write``: in the forward of the first decode step >= KVCONV_PLANT_STEP, one more ``store_kvcache`` launch
  (``MHATokenToKVPool.set_kv_buffer``, ``srt/mem_cache/memory_pool.py:1047``, layer KVCONV_PLANT_LAYER) writes batch
  row 0's request's first prompt slot: a page outside the step's set, on the forward's own stream;
- ``two-stream``: the same write from a second CUDA stream, ordered after the forward stream's work so far (the
  canary's snapshot) but not before the replay that reads that page (the second seed's overlap race).

KVCONV_PLANT_STEP defaults to 6, KVCONV_PLANT_LAYER to 1. SGLang 0.5.17 (``sglang-0.5.17`` bundle): ``loc-shift``
patches ``DecodeCudaGraphRunner.load_batch`` (``srt/model_executor/runner/decode_cuda_graph_runner.py:1036``; the
static buffers are filled by its buffer registry, ``populate_from_forward_batch`` is no longer called); the others
act on names 0.5.17 keeps (``ScheduleBatch.prepare_for_decode`` ``:2949``, ``MHATokenToKVPool.set_kv_buffer``
``srt/mem_cache/memory_pool.py:2305``).
"""

import importlib.util
import os
import sys

PLANT = os.environ.get("KVCONV_PLANT", "")
PLANTS = ("loc-shift", "freed-reuse", "outside-write", "two-stream")
STEP = int(os.environ.get("KVCONV_PLANT_STEP", "6"))
LAYER = int(os.environ.get("KVCONV_PLANT_LAYER", "1"))


class _State:
    step = 0  # the index of the next forward (the plugin's step number of it)
    done = False
    ids: dict = {}  # SGLang rid -> kvconv's number (the plugin's rule: order of first appearance)
    runner = None


S = _State()


def say(text: str) -> None:
    print(f"kvconv plant {PLANT}: {text}", file=sys.stderr, flush=True)


def named(rid) -> str:
    n = S.ids.get(rid)
    return f"request {rid!r} (kvconv request {n})" if n else f"request {rid!r}"


def wrap(owner, name: str, make) -> None:
    setattr(owner, name, make(getattr(owner, name)))


def first_slot(runner, pool_idx) -> int:
    """The slot of a request's first prompt token (its ``req_to_token`` row, position 0)."""
    return int(runner.req_to_token_pool.req_to_token[int(pool_idx), 0].item())


def side_write(runner, slot: int, *, stream=None) -> None:
    """One ``store_kvcache`` launch writing ``slot`` of layer LAYER (K and V rows of 7s), on ``stream`` if given."""
    import torch

    pool = runner.token_to_kv_pool
    k = torch.full((1, pool.head_num, pool.head_dim), 7.0, dtype=pool.dtype, device=pool.device)
    loc = torch.tensor([slot], dtype=torch.int64, device=pool.device)
    if stream is None:
        pool.set_kv_buffer(None, loc, k, k.clone(), layer_id_override=LAYER)
        return
    stream.wait_stream(torch.cuda.current_stream())  # after the canary's snapshot, unordered with the replay
    with torch.cuda.stream(stream):
        pool.set_kv_buffer(None, loc, k, k.clone(), layer_id_override=LAYER)


def patch_runner(mod) -> None:
    """Every plant: the step count and the request numbers, as the plugin sees them; the two write plants act here."""
    def make(orig):
        def forward(self, forward_batch, *a, **kw):
            idle = forward_batch.forward_mode.is_idle()
            if not idle:
                for rid in forward_batch.rids or []:
                    S.ids.setdefault(rid, len(S.ids) + 1)
            S.runner = self
            if not idle and PLANT in ("outside-write", "two-stream"):
                act(self, forward_batch)
            try:
                return orig(self, forward_batch, *a, **kw)
            finally:
                S.step += 0 if idle else 1
        return forward
    wrap(mod.ModelRunner, "forward", make)


def act(runner, fb) -> None:
    if S.done or S.step < STEP or not fb.forward_mode.is_decode():
        return
    import torch

    S.done = True
    rid, slot = fb.rids[0], first_slot(runner, fb.req_pool_indices[0])
    page = slot // int(runner.token_to_kv_pool_allocator.page_size)
    how = "on the forward's stream"
    if PLANT == "two-stream":
        side_write(runner, slot, stream=torch.cuda.Stream(device=runner.token_to_kv_pool.device))
        how = "from a second stream, unordered with the replay that reads it"
    else:
        side_write(runner, slot)
    say(f"step {S.step}: layer {LAYER}: {named(rid)}'s first prompt slot {slot} (page {page}) written {how}")


def patch_loc_shift(mod) -> None:
    def make(orig):
        def populate_from_forward_batch(self, *a, **kw):
            out = orig(self, *a, **kw)
            fb, n = kw.get("forward_batch"), int(kw.get("raw_num_token", 0))
            if not S.done and S.step >= STEP and fb is not None and n and fb.forward_mode.is_decode():
                S.done = True
                old = int(self.out_cache_loc[0].item())
                self.out_cache_loc[0] += n
                say(f"step {S.step}: {named(fb.rids[0])} (batch row 0): slot {old} -> {old + n} in the graph's "
                    f"out_cache_loc, every layer")
            return out
        return populate_from_forward_batch
    wrap(mod.DecodeInputBuffers, "populate_from_forward_batch", make)


def patch_loc_shift_0517(mod) -> None:
    """SGLang 0.5.17: the decode graph's static buffers are filled in ``DecodeCudaGraphRunner.load_batch``
    (``model_executor/runner/decode_cuda_graph_runner.py:1036``, the buffer registry's ``fill_from``)."""
    def make(orig):
        def load_batch(self, forward_batch, *a, **kw):
            out = orig(self, forward_batch, *a, **kw)
            n = int(getattr(self, "raw_num_token", 0) or 0)
            if not S.done and S.step >= STEP and n and forward_batch.forward_mode.is_decode():
                S.done = True
                loc = self.buffers.out_cache_loc
                old = int(loc[0].item())
                loc[0] += n
                say(f"step {S.step}: {named(forward_batch.rids[0])} (batch row 0): slot {old} -> {old + n} in the "
                    f"graph's out_cache_loc, every layer")
            return out
        return load_batch
    wrap(mod.DecodeCudaGraphRunner, "load_batch", make)


class _Reuse:
    """freed-reuse's bookkeeping: slot ``x`` handed to a second request, slot ``y`` (the free slot it displaced) kept
    aside, so that the allocator's books still balance when both owners give ``x`` back: the first free of ``x``
    frees ``y`` instead (``x`` is still held by the other owner, whose free returns it). Else SGLang's idle check
    (0.5.17 ``invariant_checker.py``: a double free, a count off by one; 0.5.12 ``check_memory``'s leak count) raises
    in the scheduler and the run dies (issue 40's exit 137) before the write canary could judge: the bug planted is
    the write, not the books."""
    x = y = None
    freed_x = 0


R = _Reuse()


def _balanced_free(alloc):
    import torch

    free = alloc.free

    def free_once(index, *a, **kw):
        if R.x is not None and isinstance(index, torch.Tensor) and index.numel():
            hit = index == R.x
            if bool(hit.any()):
                R.freed_x += 1
                if R.freed_x == 1:  # the first owner's free: the displaced slot instead (x is still held)
                    index = torch.where(hit, torch.full_like(index, R.y), index)
                    say(f"slot {R.x} freed by its first owner: slot {R.y} freed in its place (the books balance)")
        return free(index, *a, **kw)

    alloc.free = free_once


def patch_freed_reuse(mod) -> None:
    def make(orig):
        def prepare_for_decode(self, *a, **kw):
            if not S.done and S.step >= STEP and S.runner is not None and len(self.reqs) >= 2:
                S.done = True
                victim = self.reqs[1]
                slot = first_slot(S.runner, victim.req_pool_idx)
                alloc = getattr(self, "token_to_kv_pool_allocator", None) or \
                    self.tree_cache.token_to_kv_pool_allocator
                R.x, R.y = slot, int(alloc.free_pages[0].item())
                alloc.free_pages = alloc.free_pages.clone()
                alloc.free_pages[0] = slot  # the next slot handed out (batch row 0's) is the victim's
                _balanced_free(alloc)
                say(f"step {S.step}: slot {slot}, {named(victim.rid)}'s first prompt slot, freed while it runs and "
                    f"handed to batch row 0, {named(self.reqs[0].rid)} (free slot {R.y} kept aside)")
            return orig(self, *a, **kw)
        return prepare_for_decode
    wrap(mod.ScheduleBatch, "prepare_for_decode", make)


def chain() -> str | None:
    """Run the next ``sitecustomize.py`` on sys.path (Python imports only the first it finds)."""
    here = os.path.dirname(os.path.abspath(__file__))
    for d in sys.path:
        f = os.path.join(d or ".", "sitecustomize.py")
        if os.path.abspath(d or ".") != here and os.path.isfile(f):
            spec = importlib.util.spec_from_file_location("_kvconv_next_sitecustomize", f)
            spec.loader.exec_module(importlib.util.module_from_spec(spec))
            return f
    return None


def install() -> None:
    if PLANT not in PLANTS:
        say(f"unknown plant (one of {', '.join(PLANTS)}); nothing planted")
        return
    from kvconv.capture.engines._hooks import after_import

    after_import("sglang.srt.model_executor.model_runner", patch_runner)
    if PLANT == "loc-shift":
        after_import("sglang.srt.model_executor.cuda_graph_runner", patch_loc_shift)  # 0.5.12
        after_import("sglang.srt.model_executor.runner.decode_cuda_graph_runner", patch_loc_shift_0517)
    elif PLANT == "freed-reuse":
        after_import("sglang.srt.managers.schedule_batch", patch_freed_reuse)
    say(f"armed in process {os.getpid()} (step >= {STEP}, layer {LAYER})")


if PLANT:
    install()
chain()
