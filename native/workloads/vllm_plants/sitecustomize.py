"""Planted engine bugs in an unmodified vLLM 0.26.0 (Model Runner V2), for kvconv's canaries to catch (issue 39).

With this folder first on PYTHONPATH, Python imports this file at start-up in every process vLLM starts (the
engine-core child too); ``KVCONV_PLANT=<name>`` picks the bug, which is patched into vLLM's classes right after
their modules are imported (never into the installed files), and acts once. Each plant says on stderr what it did:
the step (numbered as the kvconv plugin numbers them: the runner's ``prepare_attn`` calls, from 0), layer, request
(vLLM's id, and kvconv's number: order of first appearance in a batch, from 1) and slot.

    $ PYTHONPATH=native/workloads/vllm_plants KVCONV_PLANT=skip-layer KVCONV_ENGINE=vllm python run.py ...

- ``slot-off-by-one``: at the first all-decode step >= KVCONV_PLANT_STEP, batch row 0's slot + 1 in the device's
  slot mapping (``BlockTables.compute_slot_mappings``), after the engine computed it;
- ``stale-block``: a running request's new block-table entry not written to the device
  (``StagedWriteTensor.stage_write``): the row keeps the block the row's earlier request held;
- ``double-alloc``: the KVCONV_PLANT_REQUEST-th new request is handed a block that a running request holds
  (``BlockPool.get_new_blocks``, the scheduler's free list);
- ``skip-layer``: layer KVCONV_PLANT_LAYER's cache write skipped at the first eager or PIECEWISE step >=
  KVCONV_PLANT_STEP (``flash_attn.reshape_and_cache_flash``, the call in ``do_kv_cache_update``);
- ``wrong-value``: there, token 0's K row written as ``2 * k + 1``, into the right slot.

KVCONV_PLANT_STEP defaults to 10, KVCONV_PLANT_LAYER to 1, KVCONV_PLANT_REQUEST to 5.
"""

import os
import sys

PLANT = os.environ.get("KVCONV_PLANT", "")
PLANTS = ("slot-off-by-one", "stale-block", "double-alloc", "skip-layer", "wrong-value")
STEP = int(os.environ.get("KVCONV_PLANT_STEP", "10"))
LAYER = int(os.environ.get("KVCONV_PLANT_LAYER", "1"))
REQUEST = int(os.environ.get("KVCONV_PLANT_REQUEST", "5"))


class _State:
    step = -1  # the runner's current step (prepare_attn calls - 1)
    in_step = False  # inside a real step's execute_model (Python of the forward runs: not a FULL replay)
    batch = runner = skip = current = None
    done = False
    new_requests = 0
    ids: dict = {}  # vLLM request id -> kvconv's number (the plugin's rule: order of first appearance)
    seen: dict = {}  # scheduler side: request id -> Request, every request allocated for


S = _State()


def say(text: str) -> None:
    print(f"kvconv plant {PLANT}: {text}", file=sys.stderr, flush=True)


def wrap(owner, name: str, make) -> None:
    orig = getattr(owner, name)
    setattr(owner, name, make(orig))


def named(req_id) -> str:
    n = S.ids.get(req_id)
    return f"request {req_id!r} (kvconv request {n})" if n else f"request {req_id!r}"


def patch_runner(mod) -> None:
    """Every worker plant: the step count, the batch and the runner, as the plugin sees them."""
    def prepare(orig):
        def prepare_attn(self, input_batch):
            S.step += 1
            S.batch, S.runner = input_batch, self
            for r in input_batch.req_ids:
                S.ids.setdefault(r, len(S.ids) + 1)
            return orig(self, input_batch)
        return prepare_attn

    def execute(orig):
        def execute_model(self, scheduler_output, *a, **kw):
            S.in_step = not kw.get("dummy_run", False)
            try:
                return orig(self, scheduler_output, *a, **kw)
            finally:
                S.in_step = False
        return execute_model
    wrap(mod.GPUModelRunner, "prepare_attn", prepare)
    wrap(mod.GPUModelRunner, "execute_model", execute)


def patch_slot_off_by_one(mod) -> None:
    def make(orig):
        def compute_slot_mappings(self, idx_mapping, query_start_loc, positions, num_tokens_padded, out=None):
            res = orig(self, idx_mapping, query_start_loc, positions, num_tokens_padded, out)
            b = S.batch
            if not S.done and S.step >= STEP and b is not None and b.num_tokens == b.num_reqs:  # all decode
                slots = self.slot_mappings if out is None else out
                t = int(b.query_start_loc_np[0])
                old = int(slots[0, t].item())
                slots[0, t] += 1
                S.done = True
                say(f"step {S.step}: {named(b.req_ids[0])} (batch row 0, token {t}): slot {old} -> {old + 1} "
                    f"in the device's slot mapping, every layer")
            return res
        return compute_slot_mappings
    wrap(mod.BlockTables, "compute_slot_mappings", make)


def patch_stale_block(mod) -> None:
    def make_append(orig):
        def append_block_ids(self, req_index, new_block_ids, overwrite):
            if not S.done and not overwrite and S.step + 1 >= STEP and new_block_ids and new_block_ids[0]:
                start = int(self.num_blocks.np[0, req_index])
                table = self.block_tables[0]
                if start < table.gpu.shape[1]:
                    stale = int(table.gpu[req_index, start].item())
                    if stale not in (0, new_block_ids[0][0]):
                        S.skip = (table, int(req_index), start, stale, list(new_block_ids[0]))
            try:
                return orig(self, req_index, new_block_ids, overwrite)
            finally:
                S.skip = None
        return append_block_ids

    def make_stage(orig):
        def stage_write(self, index, start, x):
            sk = S.skip
            if sk is not None and sk[0] is self and index == sk[1] and start == sk[2]:
                S.done, S.skip = True, None
                rid = S.runner.req_states.index_to_req_id.get(index) if S.runner is not None else None
                say(f"step {S.step + 1}: {named(rid)} (request row {index}): block-table entry {start} left at block "
                    f"{sk[3]} (the row's earlier request's), block {sk[4][0]} not written")
                return None
            return orig(self, index, start, x)
        return stage_write
    wrap(mod.BlockTables, "append_block_ids", make_append)
    wrap(sys.modules["vllm.v1.worker.gpu.buffer_utils"].StagedWriteTensor, "stage_write", make_stage)


def patch_kv_cache_manager(mod) -> None:
    def make(orig):
        def allocate_slots(self, request, *a, **kw):
            S.current = (self, request)
            S.seen[request.request_id] = request
            try:
                return orig(self, request, *a, **kw)
            finally:
                S.current = None
        return allocate_slots
    wrap(mod.KVCacheManager, "allocate_slots", make)


def victim(manager, request):
    """The first block of the running request (not ``request``) with the most tokens still to generate."""
    best = None
    for q in S.seen.values():
        if q is request or q.is_finished() or q.num_computed_tokens == 0:  # its tokens not mapped yet
            continue
        try:
            ids = manager.get_block_ids(q.request_id)[0]
        except Exception:  # noqa: BLE001 - a request the manager no longer holds
            continue
        left = q.max_tokens - q.num_output_tokens
        if ids and (best is None or left > best[0]):
            best = (left, q, ids[0])
    return best


def patch_block_pool(mod) -> None:
    def make(orig):
        def get_new_blocks(self, num_blocks):
            ret = orig(self, num_blocks)
            cur = S.current
            if S.done or cur is None or not ret or cur[1].num_computed_tokens != 0:
                return ret
            S.new_requests += 1
            pick = victim(cur[0], cur[1]) if S.new_requests >= REQUEST else None
            if pick is not None:
                _left, owner, bid = pick
                given = ret[0]
                given.ref_cnt -= 1
                self.free_block_queue.prepend_n([given])
                self.blocks[bid].ref_cnt += 1
                ret[0] = self.blocks[bid]
                S.done = True
                say(f"block {bid}, held by running {named(owner.request_id)}, handed to new "
                    f"{named(cur[1].request_id)} as well (in place of block {given.block_id})")
            return ret
        return get_new_blocks
    wrap(mod.BlockPool, "get_new_blocks", make)


def patch_cache_write(mod) -> None:
    def make(orig):
        def reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, *rest, **kw):
            if S.in_step and not S.done and S.step >= STEP and layer_of(key_cache) == LAYER:
                S.done = True
                rid, slot = S.batch.req_ids[0], int(slot_mapping[0].item())
                if PLANT == "skip-layer":
                    say(f"step {S.step}: layer {LAYER}'s cache write skipped ({S.batch.num_tokens} tokens, "
                        f"{named(rid)} first, slot {slot})")
                    return None
                key = key.clone()
                key[0] = key[0] * 2 + 1
                say(f"step {S.step}: layer {LAYER}: {named(rid)}'s token 0 (slot {slot}): K row written as 2k+1")
            return orig(key, value, key_cache, value_cache, slot_mapping, *rest, **kw)
        return reshape_and_cache_flash
    wrap(mod, "reshape_and_cache_flash", make)


def layer_of(key_cache) -> int:
    ptr = int(key_cache.data_ptr())
    caches = getattr(S.runner, "kv_caches", None) or []
    return next((i for i, kv in enumerate(caches) if int(kv.data_ptr()) == ptr), -1)


def install() -> None:
    if PLANT not in PLANTS:
        say(f"unknown plant (one of {', '.join(PLANTS)}); nothing planted")
        return
    from kvconv.capture.engines._hooks import after_import

    after_import("vllm.v1.worker.gpu.model_runner", patch_runner)
    if PLANT == "slot-off-by-one":
        after_import("vllm.v1.worker.gpu.block_table", patch_slot_off_by_one)
    elif PLANT == "stale-block":
        after_import("vllm.v1.worker.gpu.block_table", patch_stale_block)
    elif PLANT == "double-alloc":
        after_import("vllm.v1.core.kv_cache_manager", patch_kv_cache_manager)
        after_import("vllm.v1.core.block_pool", patch_block_pool)
    else:
        after_import("vllm.v1.attention.backends.flash_attn", patch_cache_write)
    say(f"armed in process {os.getpid()} (step >= {STEP}, layer {LAYER}, new request {REQUEST})")


if PLANT:
    install()
