"""Planted engine bugs in an unmodified SGLang 0.5.12, for kvconv's canaries to catch (issue 40).

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
  (``TokenToKVPoolAllocator.free_pages``, ``srt/mem_cache/allocator.py:121``): row 0's request is handed it;
- ``outside-write``: in the forward of the first decode step >= KVCONV_PLANT_STEP, one more ``store_kvcache`` launch
  (``MHATokenToKVPool.set_kv_buffer``, ``srt/mem_cache/memory_pool.py:1047``, layer KVCONV_PLANT_LAYER) writes batch
  row 0's request's first prompt slot: a page outside the step's set, on the forward's own stream;
- ``two-stream``: the same write from a second CUDA stream, ordered after the forward stream's work so far (the
  canary's snapshot) but not before the replay that reads that page (the second seed's overlap race).

KVCONV_PLANT_STEP defaults to 6, KVCONV_PLANT_LAYER to 1.
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


def patch_freed_reuse(mod) -> None:
    def make(orig):
        def prepare_for_decode(self, *a, **kw):
            if not S.done and S.step >= STEP and S.runner is not None and len(self.reqs) >= 2:
                import torch

                S.done = True
                victim = self.reqs[1]
                slot = first_slot(S.runner, victim.req_pool_idx)
                alloc = self.token_to_kv_pool_allocator
                alloc.free_pages = torch.cat((torch.tensor([slot], dtype=alloc.free_pages.dtype,
                                                           device=alloc.free_pages.device), alloc.free_pages))
                say(f"step {S.step}: slot {slot}, {named(victim.rid)}'s first prompt slot, freed while it runs and "
                    f"handed to batch row 0, {named(self.reqs[0].rid)}")
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
        after_import("sglang.srt.model_executor.cuda_graph_runner", patch_loc_shift)
    elif PLANT == "freed-reuse":
        after_import("sglang.srt.managers.schedule_batch", patch_freed_reuse)
    say(f"armed in process {os.getpid()} (step >= {STEP}, layer {LAYER})")


if PLANT:
    install()
chain()
