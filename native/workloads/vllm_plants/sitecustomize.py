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

The shapes of three published vLLM bugs (issue 50; each fixed in 0.26.0, so planted back):

- ``dummy-slot-zero`` (vllm-project/vllm#38719): the dummy slot mapping left at zeros instead of PAD_SLOT_ID
  (``BlockTables.get_dummy_slot_mappings``) for the forwards of up to KVCONV_PLANT_DUMMY_MAX (8) tokens, the FULL
  graphs' sizes: their warm-up and capture forwards write slot 0 of every layer;
- ``pad-index-write`` (vllm-project/vllm#43810, fix #43869): layer KVCONV_PLANT_LAYER's K and V also written through
  ``key_cache[slot // block_size, slot % block_size] = key`` (a PyTorch index_put kernel, not reshape_and_cache),
  from graph capture on: a padded row's slot -1 lands in the last slot of the last block;
- ``stale-write`` (vllm-project/vllm#45357): the first finished request's freed block, handed to a new request, is
  written once more after the new request filled it (the in-flight write of the old request landing late): the
  new request's first token in that block gets other K/V rows, in layer KVCONV_PLANT_LAYER.

KVCONV_PLANT takes one name or several, comma-separated (each acts once, on its own): ``stale-block,wrong-value``.
KVCONV_PLANT_STEP defaults to 10, KVCONV_PLANT_LAYER to 1, KVCONV_PLANT_REQUEST to 5.
"""

import os
import sys

PLANT = os.environ.get("KVCONV_PLANT", "")
ARMED = tuple(p.strip() for p in PLANT.split(",") if p.strip())
PLANTS = ("slot-off-by-one", "stale-block", "double-alloc", "skip-layer", "wrong-value", "dummy-slot-zero",
          "pad-index-write", "stale-write")
STEP = int(os.environ.get("KVCONV_PLANT_STEP", "10"))
LAYER = int(os.environ.get("KVCONV_PLANT_LAYER", "1"))
REQUEST = int(os.environ.get("KVCONV_PLANT_REQUEST", "5"))
DUMMY_MAX = int(os.environ.get("KVCONV_PLANT_DUMMY_MAX", "8"))  # dummy-slot-zero: forwards of up to this many tokens


class _State:
    step = -1  # the runner's current step (prepare_attn calls - 1)
    in_step = False  # inside a real step's execute_model (Python of the forward runs: not a FULL replay)
    batch = runner = skip = current = stale = None
    fired: set = set()  # the plants that acted
    new_requests = 0
    ids: dict = {}  # vLLM request id -> kvconv's number (the plugin's rule: order of first appearance)
    seen: dict = {}  # scheduler side: request id -> Request, every request allocated for


S = _State()


def say(text: str, plant: str = PLANT) -> None:
    print(f"kvconv plant {plant}: {text}", file=sys.stderr, flush=True)


def fire(plant: str) -> None:
    S.fired.add(plant)


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
    def kv_init(orig):
        def initialize_kv_cache(self, *a, **kw):
            S.runner = self  # graph capture comes before the first step: layer_of needs the caches then
            return orig(self, *a, **kw)
        return initialize_kv_cache
    wrap(mod.GPUModelRunner, "prepare_attn", prepare)
    wrap(mod.GPUModelRunner, "execute_model", execute)
    wrap(mod.GPUModelRunner, "initialize_kv_cache", kv_init)


def patch_slot_off_by_one(mod) -> None:
    def make(orig):
        def compute_slot_mappings(self, idx_mapping, query_start_loc, positions, num_tokens_padded, out=None):
            res = orig(self, idx_mapping, query_start_loc, positions, num_tokens_padded, out)
            b = S.batch
            if "slot-off-by-one" not in S.fired and S.step >= STEP and b is not None and b.num_tokens == b.num_reqs:
                slots = self.slot_mappings if out is None else out
                t = int(b.query_start_loc_np[0])
                old = int(slots[0, t].item())
                slots[0, t] += 1
                fire("slot-off-by-one")
                say(f"step {S.step}: {named(b.req_ids[0])} (batch row 0, token {t}): slot {old} -> {old + 1} "
                    f"in the device's slot mapping, every layer", "slot-off-by-one")
            return res
        return compute_slot_mappings
    wrap(mod.BlockTables, "compute_slot_mappings", make)


def patch_stale_block(mod) -> None:
    def make_append(orig):
        def append_block_ids(self, req_index, new_block_ids, overwrite):
            armed = "stale-block" not in S.fired and not overwrite and S.step + 1 >= STEP
            if armed and new_block_ids and new_block_ids[0]:
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
                S.skip = None
                fire("stale-block")
                rid = S.runner.req_states.index_to_req_id.get(index) if S.runner is not None else None
                say(f"step {S.step + 1}: {named(rid)} (request row {index}): block-table entry {start} left at block "
                    f"{sk[3]} (the row's earlier request's), block {sk[4][0]} not written", "stale-block")
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
            if "double-alloc" in S.fired or cur is None or not ret or cur[1].num_computed_tokens != 0:
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
                fire("double-alloc")
                say(f"block {bid}, held by running {named(owner.request_id)}, handed to new "
                    f"{named(cur[1].request_id)} as well (in place of block {given.block_id})", "double-alloc")
            return ret
        return get_new_blocks
    wrap(mod.BlockPool, "get_new_blocks", make)


def patch_cache_write(mod) -> None:
    """skip-layer, wrong-value, pad-index-write and stale-write: around the module-level reshape_and_cache_flash
    that FlashAttentionImpl.do_kv_cache_update calls (eager and PIECEWISE steps, and graph capture)."""
    def make(orig):
        def reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, *rest, **kw):
            layer = layer_of(key_cache)
            for plant in ("skip-layer", "wrong-value"):
                if plant in ARMED and plant not in S.fired and S.in_step and S.step >= STEP and layer == LAYER:
                    fire(plant)
                    rid, slot = S.batch.req_ids[0], int(slot_mapping[0].item())
                    if plant == "skip-layer":
                        say(f"step {S.step}: layer {LAYER}'s cache write skipped ({S.batch.num_tokens} tokens, "
                            f"{named(rid)} first, slot {slot})", plant)
                        return None
                    key = key.clone()
                    key[0] = key[0] * 2 + 1
                    say(f"step {S.step}: layer {LAYER}: {named(rid)}'s token 0 (slot {slot}): K row written as 2k+1",
                        plant)
            out = orig(key, value, key_cache, value_cache, slot_mapping, *rest, **kw)
            if layer == LAYER and "pad-index-write" in ARMED:
                index_write(key, value, key_cache, value_cache, slot_mapping)
            if layer == LAYER and S.stale is not None and S.in_step:
                stale_write(orig, key, value, key_cache, value_cache, slot_mapping, rest, kw)
            return out
        return reshape_and_cache_flash
    wrap(mod, "reshape_and_cache_flash", make)


def index_write(key, value, key_cache, value_cache, slot_mapping) -> None:
    """vllm-project/vllm#43810's write: ``cache[slot // block_size, slot % block_size] = rows`` for every row, pads
    (-1) included: Python's floor division sends -1 to the last block's last slot. Captured into FULL graphs too."""
    bs, n = int(key_cache.shape[1]), int(slot_mapping.shape[0])
    key_cache[slot_mapping // bs, slot_mapping % bs] = key[:n]
    value_cache[slot_mapping // bs, slot_mapping % bs] = value[:n]
    if "pad-index-write" not in S.fired:
        fire("pad-index-write")
        last = (int(key_cache.shape[0]) - 1) * bs + bs - 1
        say(f"layer {LAYER}: K and V also written by index_put (cache[slot // {bs}, slot % {bs}] = rows), from "
            f"{'graph capture' if S.step < 0 else f'step {S.step}'} on: a pad row (slot -1) lands in slot {last} "
            f"(block {int(key_cache.shape[0]) - 1}, offset {bs - 1})", "pad-index-write")


def stale_write(orig, key, value, key_cache, value_cache, slot_mapping, rest, kw) -> None:
    """vllm-project/vllm#45357's race, landed: once the finished request's block is written by its new owner in
    this step, the old owner's pending write lands on the new owner's first token there."""
    req, block = S.stale
    bs = int(key_cache.shape[1])
    slots = slot_mapping.cpu()
    hit = ((slots // bs) == block).nonzero()
    if not len(hit):
        return
    t = int(hit[0, 0])
    S.stale = None
    fire("stale-write")
    orig(key[t:t + 1] * 2 + 1, value[t:t + 1] * 2 + 1, key_cache, value_cache, slot_mapping[t:t + 1], *rest, **kw)
    owner = S.batch.req_ids[[i for i, q in enumerate(S.batch.query_start_loc_np[1:]) if q > t][0]]
    say(f"step {S.step}: layer {LAYER}: block {block} of finished {named(req)}, now {named(owner)}'s: "
        f"{named(req)}'s stale write landed on slot {int(slots[t])} after {named(owner)} wrote it", "stale-write")


def patch_finish(mod) -> None:
    """stale-write: the first request the scheduler says finished; its last block (from kvconv's own host mirror of
    the block table, which the plugin keeps) is the one a late write of it would hit."""
    def make(orig):
        def finish_requests(self, scheduler_output):
            done = sorted(r for r in scheduler_output.finished_req_ids if not r.startswith("_"))  # not warm-up's
            if "stale-write" not in S.fired and S.stale is None and done:
                rid = done[0]
                row = self.req_states.req_id_to_index.get(rid)
                mirror = getattr(self.block_tables, "_kvconv_mirror", None)
                n = int(self.block_tables.num_blocks.np[0, row]) if row is not None else 0
                if mirror is not None and n:
                    S.stale = (rid, int(mirror.table[row, n - 1]))
                    say(f"step {S.step + 1}: {named(rid)} finished; its last block {S.stale[1]} is freed with a "
                        f"write of it still pending", "stale-write")
            return orig(self, scheduler_output)
        return finish_requests
    wrap(mod.GPUModelRunner, "finish_requests", make)


def patch_dummy_slots(mod) -> None:
    """dummy-slot-zero: the dummy slot mapping of the forwards under FULL graphs (up to DUMMY_MAX tokens: the
    capture sizes' warm-up and capture forwards) left at zeros, vllm-project/vllm#38719; the 16,384-token compile
    warm-up keeps its pads (it would only repeat the finding 16,384 times a layer)."""
    def make(orig):
        def get_dummy_slot_mappings(self, num_tokens):
            out = orig(self, num_tokens)
            if num_tokens > DUMMY_MAX:
                return out
            self.slot_mappings.zero_()
            if "dummy-slot-zero" not in S.fired:
                fire("dummy-slot-zero")
                say(f"the dummy slot mapping of {num_tokens} tokens (and every dummy forward of up to {DUMMY_MAX}) "
                    f"left at zeros, not PAD_SLOT_ID: warm-up and capture forwards write slot 0 (block 0) of every "
                    f"layer", "dummy-slot-zero")
            return out
        return get_dummy_slot_mappings
    wrap(mod.BlockTables, "get_dummy_slot_mappings", make)


def layer_of(key_cache) -> int:
    ptr = int(key_cache.data_ptr())
    caches = getattr(S.runner, "kv_caches", None) or []
    return next((i for i, kv in enumerate(caches) if int(kv.data_ptr()) == ptr), -1)


def install() -> None:
    unknown = [p for p in ARMED if p not in PLANTS]
    if unknown:
        say(f"unknown plant (one of {', '.join(PLANTS)}); nothing planted")
        return
    from kvconv.capture.engines._hooks import after_import

    after_import("vllm.v1.worker.gpu.model_runner", patch_runner)
    if "slot-off-by-one" in ARMED:
        after_import("vllm.v1.worker.gpu.block_table", patch_slot_off_by_one)
    if "stale-block" in ARMED:
        after_import("vllm.v1.worker.gpu.block_table", patch_stale_block)
    if "double-alloc" in ARMED:
        after_import("vllm.v1.core.kv_cache_manager", patch_kv_cache_manager)
        after_import("vllm.v1.core.block_pool", patch_block_pool)
    if "dummy-slot-zero" in ARMED:
        after_import("vllm.v1.worker.gpu.block_table", patch_dummy_slots)
    if "stale-write" in ARMED:
        after_import("vllm.v1.worker.gpu.model_runner", patch_finish)
    if set(ARMED) & {"skip-layer", "wrong-value", "pad-index-write", "stale-write"}:
        after_import("vllm.v1.attention.backends.flash_attn", patch_cache_write)
    say(f"armed in process {os.getpid()} (step >= {STEP}, layer {LAYER}, new request {REQUEST})")


if PLANT:
    install()
