// Device patch: block enter (and optionally block exit) callbacks. One elected thread per block writes one 64-byte
// kvconv_device_event_t into the context's fixed buffer; a full buffer is counted in state->drops, never waited on.
#include <sanitizer_patching.h>

#include "kvconv_records.h"
#include "tracer_shared.h"

static __device__ __forceinline__ unsigned long long kv_globaltimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
static __device__ __forceinline__ unsigned long long kv_gridid() {
  unsigned long long g;
  asm volatile("mov.u64 %0, %%gridid;" : "=l"(g));
  return g;
}
static __device__ __forceinline__ unsigned int kv_smid() {
  unsigned int s;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
  return s;
}

// The replay tag of a learned graph node: its exec's tag cell, written on the launch stream before the replay (L2
// loads: the host's copies bypass this SM's L1). `fallback` (userdata's tag) when the node is not in the table or
// the cell is 0. `tm` is the state's (table, table_mask) pair and `cells` its cell array, loaded by the caller in one
// go with the rest of the state: every load here is one L2 round trip the block waits for before the kernel body
// runs, so the chain is kept to the entry (one 16-byte load: key and cell together) and the cell.
static __device__ __forceinline__ unsigned long long kv_node_tag(ulonglong2 tm, unsigned long long cells,
                                                                 unsigned long long gid,
                                                                 unsigned long long fallback) {
#ifdef KVCONV_PATCH_NOLOOKUP  // cost measurement only (bench/gpu_tracer_cost.py --variant): the tag from userdata
  return fallback;
#endif
  if (!tm.x) return fallback;
  const ulonglong2* t = reinterpret_cast<const ulonglong2*>(tm.x);  // kvconv_node_entry: {gridid, cell}
  for (unsigned int i = 0; i < KVCONV_TABLE_PROBES; ++i) {
    const ulonglong2 e = __ldcg(t + ((gid + i) & tm.y));
    if (e.x == gid) {
      const unsigned long long v = __ldcg(reinterpret_cast<const unsigned long long*>(cells) + e.y);
      if (v & KVCONV_CELL_OFF) return KVCONV_TAG_OFF;
      return v ? (v & KVCONV_TAG_MASK) : fallback;
    }
    if (e.x == 0) break;
  }
  return fallback;
}

// KVCONV_PATCH_NOOP / KVCONV_PATCH_NOLOOKUP: builds for cost measurement only (what the instrumentation call alone
// costs, what the node-table lookup costs); never shipped, the dumps they write lack events or tags.
static __device__ __forceinline__ SanitizerPatchResult kv_record(void* userdata, uint64_t pc, unsigned char kind) {
#ifdef KVCONV_PATCH_NOOP
  return SANITIZER_PATCH_SUCCESS;
#endif
  if (userdata == nullptr) return SANITIZER_PATCH_SUCCESS;
  if ((threadIdx.x | threadIdx.y | threadIdx.z) != 0) return SANITIZER_PATCH_SUCCESS;
  const unsigned long long u = reinterpret_cast<unsigned long long>(userdata);
  kvconv_dev_state* st = reinterpret_cast<kvconv_dev_state*>(u & KVCONV_STATE_MASK);
  const unsigned int slot = static_cast<unsigned int>(u >> KVCONV_SLOT_SHIFT);
  const unsigned long long gid = kv_gridid();
  // The state's fields in four independent 16-byte loads, issued together (kvconv_dev_state's layout:
  // {events, capacity} at 0, {table, table_mask} at 32, {cells, writes} at 48, {drops_graph, flags} at 64;
  // static_asserts in tracer_shared.h). Every dependent round trip here delays the kernel's own first instruction.
  const ulonglong2* sv = reinterpret_cast<const ulonglong2*>(st);
  const ulonglong2 ec = __ldcg(sv + 0), tm = __ldcg(sv + 2), cw = __ldcg(sv + 3), fl = __ldcg(sv + 4);
  unsigned long long seq, now, tag;
  if (!(fl.y & KVCONV_STATE_RANGED)) {
    // No capture range: no replay is skipped, so the slot is taken while the tag lookup is in flight.
    seq = atomicAdd(&st->next, 1ull);
    // The timer right after the sequence number: events in sequence order then differ in time by no more than the
    // atomic's latency (validate's timer-backwards tolerance).
    now = kv_globaltimer();
    tag = kv_node_tag(tm, cw.x, gid, u & KVCONV_TAG_MASK);
  } else {
    // The tag first: a replay outside the capture range records nothing (KVCONV_TAG_OFF), not even a drop.
    tag = kv_node_tag(tm, cw.x, gid, u & KVCONV_TAG_MASK);
    if (tag == KVCONV_TAG_OFF) return SANITIZER_PATCH_SUCCESS;
    seq = atomicAdd(&st->next, 1ull);
    now = kv_globaltimer();
  }
  if (seq >= ec.y) {
    atomicAdd(&st->drops, 1ull);
    if (tag) atomicAdd(&st->drops_graph, 1ull);  // graph nodes carry a replay tag; eager launches tag 0
    return SANITIZER_PATCH_SUCCESS;
  }
  kvconv_device_event_t* ev = reinterpret_cast<kvconv_device_event_t*>(ec.x) + seq;
  kvconv_device_event_t e;
  e.globaltimer = now;
  e.pc = pc;
  e.gridid = gid;
  e.tag = tag;
  e.sequence = seq;
  e.kernel_slot = slot;
  e.block_x = blockIdx.x;
  e.block_y = static_cast<uint16_t>(blockIdx.y);
  e.block_z = static_cast<uint16_t>(blockIdx.z);
  e.smid = static_cast<uint16_t>(kv_smid());
  e.kind = kind;
  e.flags = KVCONV_EVENT_FLAGS_HAS_GRIDID | (tag ? KVCONV_EVENT_FLAGS_HAS_TAG : 0);
  e.aux = 0;
  // four 16-byte stores
  const uint4* s = reinterpret_cast<const uint4*>(&e);
  uint4* d = reinterpret_cast<uint4*>(ev);
  d[0] = s[0];
  d[1] = s[1];
  d[2] = s[2];
  d[3] = s[3];
  return SANITIZER_PATCH_SUCCESS;
}

extern "C" __device__ __noinline__ SanitizerPatchResult kvconv_block_enter(void* userdata, uint64_t pc) {
  return kv_record(userdata, pc, KVCONV_EVENT_KIND_BLOCK_ENTER);
}

extern "C" __device__ __noinline__ SanitizerPatchResult kvconv_block_exit(void* userdata, uint64_t pc) {
  return kv_record(userdata, pc, KVCONV_EVENT_KIND_BLOCK_EXIT);
}

#include "writes_patch.cuh"  // the write-address canary's memory-access patch (issue 16)
