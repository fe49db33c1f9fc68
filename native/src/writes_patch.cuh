// Device patch of the write-address canary (issue 16), included at the end of patch.cu (one fatbin: the tracer loads
// one patch file per context). Every global memory access of a patched module calls kvconv_mem_access; it returns at
// once for non-target functions (NULL userdata), loads, and contexts without write recording. writes_shared.h says
// how the stores of a block are aggregated into one record per slot.
//
// Why it is shaped as it is (measured on the H200, docs/results/write-patch-2026-12-01/NOTES.md, "the write patch reshaped"): a tools patch gets the
// ABI's minimum of registers, so the store path spills and saves registers on entry, and a store's cost is mostly its
// chains of dependent loads. Hence: loads and non-target accesses do not pay the store path's saves
// (kvconv_mem_access is a small wrapper); the cache search is two levels of 16 independent loads, not a binary
// search; the node-table entry is one 16-byte load; page and offset are divided out once per record, not per store.
// (Keeping only the key live and recomputing the identity out of line spilled less but measured slower: the tag and
// cache-search chains then no longer overlap.)
#include "writes_shared.h"

static __device__ __forceinline__ unsigned int kv_laneid() {
  unsigned int l;
  asm volatile("mov.u32 %0, %%laneid;" : "=r"(l));
  return l;
}

static __device__ __forceinline__ unsigned long long kv_mix(unsigned long long h, unsigned long long v) {
  h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  h ^= h >> 31;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 29;
  return h;
}

#ifdef KVCONV_TABLE_PROBES
// kv_node_tag (patch.cu) for every store: the node table and the tag cells are written before the kernel starts, so
// plain loads (L1 after the block's first store) find them.
static __device__ __forceinline__ unsigned long long kv_store_tag(const kvconv_dev_state* st, unsigned long long gid,
                                                                  unsigned long long fallback) {
#ifdef KVCONV_PATCH_NOLOOKUP  // cost measurement only (patch.cu)
  return fallback;
#endif
  const kvconv_node_entry* t = reinterpret_cast<const kvconv_node_entry*>(st->table);
  if (!t) return fallback;
  const unsigned long long mask = st->table_mask;
  for (unsigned int i = 0; i < KVCONV_TABLE_PROBES; ++i) {
    // One 16-byte load of the entry (gridid and cell index together): one dependent load fewer per store.
    const ulonglong2 e = *reinterpret_cast<const ulonglong2*>(t + ((gid + i) & mask));
    if (e.x == gid) {
      // A plain load: the cell is written before the replay's kernels start and L1 holds nothing across a kernel
      // boundary; the block's later stores then find it in L1 (an L2 round trip per store was most of the cost).
      const unsigned long long v = reinterpret_cast<const unsigned long long*>(st->cells)[e.y];
      if (v & KVCONV_CELL_OFF) return KVCONV_TAG_OFF;  // a replay outside the capture range
      return v ? (v & KVCONV_TAG_MASK) : fallback;
    }
    if (e.x == 0) break;
  }
  return fallback;
}
#else
// Without learned graph execs (tracer_shared.h has no node table) the replay tag comes with the per-launch data.
static __device__ __forceinline__ unsigned long long kv_store_tag(const kvconv_dev_state*, unsigned long long,
                                                                  unsigned long long fallback) {
  return fallback;
}
#endif

// The number of the 16 sorted values at `v` that are <= a (independent loads: one latency, not sixteen).
static __device__ __forceinline__ int kv_count_le(const unsigned long long* v, unsigned long long a) {
  const ulonglong2* v2 = reinterpret_cast<const ulonglong2*>(v);
  int n = 0;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const ulonglong2 x = v2[j];
    n += (x.x <= a) + (x.y <= a);
  }
  return n;
}

// The cache holding `a`, or nullptr: two levels of 16 (writes_shared.h).
static __device__ __forceinline__ const kvconv_dev_cache* kv_find_cache(const kvconv_writes_state* ws,
                                                                        unsigned long long a) {
  const int g = kv_count_le(ws->top, a);  // 0: below every cache
  if (g == 0) return nullptr;
  const int i = 16 * (g - 1) + kv_count_le(ws->bases + 16 * (g - 1), a) - 1;
  const kvconv_dev_cache* c = &ws->caches[i];
  return a < c->end ? c : nullptr;
}

// `where` of a store: the slot in cache `c` (a shift when the slot size is a power of two, the usual case, instead
// of a 64-bit division per store), or the 4 KiB granule outside every cache.
static __device__ __forceinline__ unsigned long long kv_where(const kvconv_dev_cache* c, unsigned long long a) {
  if (!c) return a >> KVCONV_OUTSIDE_GRANULE_SHIFT;
  const unsigned long long rel = a - c->base;
  return c->slot_shift != KVCONV_NO_SHIFT ? rel >> c->slot_shift : rel / c->slot_bytes;
}

// The record's key: a 64-bit fingerprint of (gridid, replay tag, block, cache, slot or granule); never 0 (empty).
static __device__ __forceinline__ unsigned long long kv_key(unsigned long long gid, unsigned long long tag,
                                                            unsigned int cache_id, unsigned long long where) {
  const unsigned long long key =
      kv_mix(kv_mix(kv_mix(kv_mix(kv_mix(gid, tag), blockIdx.x), (unsigned long long)blockIdx.y << 32 | blockIdx.z),
                    cache_id),
             where);
  return key ? key : 1;
}

// The claimer writes the identity of the record (once per record; page and offset divided out here, not per store).
static __device__ __forceinline__ void kv_claim(kvconv_slot_write_t* r, unsigned long long gid, unsigned long long tag,
                                                const kvconv_dev_cache* c, unsigned long long where,
                                                unsigned int kslot) {
  r->gridid = gid;
  r->tag = tag;
  r->page = c ? static_cast<unsigned int>(where / c->page_size) : 0xFFFFFFFFu;
  r->offset = c ? static_cast<unsigned int>(where % c->page_size) : 0xFFFFFFFFu;
  r->cache_id = c ? c->cache_id : KVCONV_NO_CACHE;
  r->kernel_slot = kslot;
  r->block_x = blockIdx.x;
  r->block_y = static_cast<uint16_t>(blockIdx.y);
  r->block_z = static_cast<uint16_t>(blockIdx.z);
  r->flags = (tag ? KVCONV_SLOT_WRITE_FLAGS_HAS_TAG : 0) | (c ? 0 : KVCONV_SLOT_WRITE_FLAGS_OUTSIDE);
}

// The entry of `key` (claimed by this call if new), or -1 when the table is full or has no room within the probes.
static __device__ __forceinline__ long long kv_entry(kvconv_writes_state* ws, unsigned long long key,
                                                     unsigned long long gid, unsigned long long tag,
                                                     const kvconv_dev_cache* c, unsigned long long where,
                                                     unsigned int kslot) {
  unsigned long long* keys = reinterpret_cast<unsigned long long*>(ws->keys);
  const unsigned long long mask = ws->capacity - 1;
  for (unsigned int i = 0; i < KVCONV_WRITE_PROBES; ++i) {
    const unsigned long long idx = (key + i) & mask;
    unsigned long long k = keys[idx];  // L1 may hold a stale 0: the CAS below then returns the key
    if (k == 0) {
      if (__ldcg(&ws->used) >= ws->limit) return -1;
      k = atomicCAS(&keys[idx], 0ull, key);
      if (k == 0) {  // claimed: this thread writes the identity of the record
        atomicAdd(&ws->used, 1ull);
        kv_claim(reinterpret_cast<kvconv_slot_write_t*>(ws->records) + idx, gid, tag, c, where, kslot);
        return static_cast<long long>(idx);
      }
    }
    if (k == key) return static_cast<long long>(idx);
  }
  return -1;
}

// A target's store (kvconv_mem_access below decides). Out of line: its registers are saved on entry, and the loads
// and non-target accesses that kvconv_mem_access turns away must not pay for that (the saves ran before the first
// test when this was one function: ~14 local stores and loads on every memory access of a patched module).
static __device__ __noinline__ void kv_store(void* userdata, void* ptr, uint32_t size) {
  const unsigned long long u = reinterpret_cast<unsigned long long>(userdata);
  const kvconv_dev_state* st = reinterpret_cast<const kvconv_dev_state*>(u & KVCONV_STATE_MASK);
  kvconv_writes_state* ws = reinterpret_cast<kvconv_writes_state*>(st->writes);
  if (ws == nullptr) return;
  const unsigned long long a = reinterpret_cast<unsigned long long>(ptr);
  const unsigned long long gid = kv_gridid();
  const unsigned long long tag = kv_store_tag(st, gid, u & KVCONV_TAG_MASK);
  if (tag == KVCONV_TAG_OFF) return;
  const kvconv_dev_cache* c = kv_find_cache(ws, a);
  const unsigned long long where = kv_where(c, a);
  const unsigned int cache_id = c ? c->cache_id : KVCONV_NO_CACHE;
#ifdef KVCONV_WRITES_STOP_AFTER_FIND  // cost measurement only: up to the slot
  if ((where ^ tag ^ cache_id) == 0x5EEDull) atomicAdd(&ws->drops, 0ull);  // keeps the computation
  return;
#endif
  const unsigned long long key = kv_key(gid, tag, cache_id, where);
#ifdef KVCONV_WRITES_STOP_AFTER_KEY  // cost measurement only: up to the record's key
  if (key == 0x5EEDull) atomicAdd(&ws->drops, 0ull);  // keeps the computation
  return;
#endif
#ifndef KVCONV_WRITES_NORANGE
  // The range of the key's first entry, loaded beside the key probe instead of after it (almost every store finds
  // its record at the first probe).
  const unsigned long long first = key & (ws->capacity - 1);
  const ulonglong2 early = *reinterpret_cast<const ulonglong2*>(
      &(reinterpret_cast<const kvconv_slot_write_t*>(ws->records) + first)->addr_lo);
#endif
  const long long found = kv_entry(ws, key, gid, tag, c, where, static_cast<unsigned int>(u >> KVCONV_SLOT_SHIFT));
  if (found < 0) {
    atomicAdd(&ws->drops, 1ull);
    return;
  }
#ifdef KVCONV_WRITES_BARE  // cost measurement only: count and range for writes outside every cache only
  if (c) return;
#endif
#if !defined(KVCONV_WRITES_NOCOUNT) || !defined(KVCONV_WRITES_NORANGE)
  kvconv_slot_write_t* r = reinterpret_cast<kvconv_slot_write_t*>(ws->records) + found;
#endif
#ifndef KVCONV_WRITES_NOCOUNT  // cost measurement only (make cost-variants): no store count
  // One count per group of lanes storing to the same record (the threads of a block mostly share a few slots).
  const unsigned int peers = __match_any_sync(__activemask(), key);
  if (kv_laneid() == static_cast<unsigned int>(__ffs(peers) - 1)) atomicAdd(&r->stores, __popc(peers));
#endif
#ifndef KVCONV_WRITES_NORANGE  // cost measurement only: no address range
  // The address range: an atomic only when this store widens it (most stores of a slot do not). Plain loads: a stale
  // (smaller) value only costs an atomic that changes nothing. addr_lo is kept complemented.
  const ulonglong2 cur = static_cast<unsigned long long>(found) == first
                             ? early : *reinterpret_cast<const ulonglong2*>(&r->addr_lo);
  if (~a > cur.x) atomicMax(reinterpret_cast<unsigned long long*>(&r->addr_lo), ~a);
  if (a + size > cur.y) atomicMax(reinterpret_cast<unsigned long long*>(&r->addr_hi), a + size);
#endif
}

extern "C" __device__ __noinline__ SanitizerPatchResult kvconv_mem_access(void* userdata, uint64_t pc, void* ptr,
                                                                         uint32_t size, uint32_t flags,
                                                                         const void* data) {
#ifdef KVCONV_PATCH_NOOP  // cost measurement only (patch.cu): what the memory-access instrumentation alone costs
  return SANITIZER_PATCH_SUCCESS;
#endif
  // Loads, and every access of a non-target function (NULL userdata), return here.
  if (userdata != nullptr && (flags & SANITIZER_MEMORY_DEVICE_FLAG_WRITE)) kv_store(userdata, ptr, size);
  return SANITIZER_PATCH_SUCCESS;
}
