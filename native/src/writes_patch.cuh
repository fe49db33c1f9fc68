// Device patch of the write-address canary (issue 16), included at the end of patch.cu (one fatbin: the tracer loads
// one patch file per context). Every global memory access of a patched module calls kvconv_mem_access; it returns at
// once for non-target functions (NULL userdata), loads, and contexts without write recording. writes_shared.h says
// how the stores of a block are aggregated into one record per slot.
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
    const kvconv_node_entry* e = t + ((gid + i) & mask);
    const unsigned long long k = e->gridid;
    if (k == gid) {
      // A plain load: the cell is written before the replay's kernels start and L1 holds nothing across a kernel
      // boundary; the block's later stores then find it in L1 (an L2 round trip per store was most of the cost).
      const unsigned long long v = reinterpret_cast<const unsigned long long*>(st->cells)[e->cell];
      return v ? (v & KVCONV_TAG_MASK) : fallback;
    }
    if (k == 0) break;
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

// The cache holding `a` (binary search over the sorted table), or -1.
static __device__ __forceinline__ int kv_find_cache(const kvconv_writes_state* ws, unsigned long long a) {
  int lo = 0, hi = static_cast<int>(ws->n_caches) - 1;
  while (lo <= hi) {
    const int mid = (lo + hi) >> 1;
    const kvconv_dev_cache* c = &ws->caches[mid];
    if (a < c->base) hi = mid - 1;
    else if (a >= c->end) lo = mid + 1;
    else return mid;
  }
  return -1;
}

extern "C" __device__ __noinline__ SanitizerPatchResult kvconv_mem_access(void* userdata, uint64_t pc, void* ptr,
                                                                         uint32_t size, uint32_t flags,
                                                                         const void* data) {
#ifdef KVCONV_PATCH_NOOP  // cost measurement only (patch.cu): what the memory-access instrumentation alone costs
  return SANITIZER_PATCH_SUCCESS;
#endif
  if (userdata == nullptr || !(flags & SANITIZER_MEMORY_DEVICE_FLAG_WRITE)) return SANITIZER_PATCH_SUCCESS;
  const unsigned long long u = reinterpret_cast<unsigned long long>(userdata);
  const kvconv_dev_state* st = reinterpret_cast<const kvconv_dev_state*>(u & KVCONV_STATE_MASK);
  kvconv_writes_state* ws = reinterpret_cast<kvconv_writes_state*>(st->writes);
  if (ws == nullptr) return SANITIZER_PATCH_SUCCESS;
  const unsigned long long a = reinterpret_cast<unsigned long long>(ptr);
  const unsigned int kslot = static_cast<unsigned int>(u >> KVCONV_SLOT_SHIFT);
  const unsigned long long gid = kv_gridid();
  const unsigned long long tag = kv_store_tag(st, gid, u & KVCONV_TAG_MASK);
  const int ci = kv_find_cache(ws, a);
  unsigned int cache_id = KVCONV_NO_CACHE, page = 0xFFFFFFFFu, off = 0xFFFFFFFFu;
  unsigned long long where;  // the slot, or the granule outside every cache
  if (ci >= 0) {
    const kvconv_dev_cache* c = &ws->caches[ci];
    const unsigned int ps = c->page_size;
    where = (a - c->base) / c->slot_bytes;
    cache_id = c->cache_id;
    page = static_cast<unsigned int>(where / ps);
    off = static_cast<unsigned int>(where % ps);
  } else {
    where = a >> KVCONV_OUTSIDE_GRANULE_SHIFT;
  }
#ifdef KVCONV_WRITES_STOP_AFTER_FIND  // cost measurement only: up to the slot
  if ((where ^ tag ^ cache_id) == 0x5EEDull) atomicAdd(&ws->drops, 0ull);  // keeps the computation
  return SANITIZER_PATCH_SUCCESS;
#endif
  unsigned long long key = kv_mix(kv_mix(kv_mix(kv_mix(kv_mix(gid, tag), blockIdx.x),
                                                (unsigned long long)blockIdx.y << 32 | blockIdx.z),
                                         cache_id),
                                  where);
#ifdef KVCONV_WRITES_STOP_AFTER_KEY  // cost measurement only: up to the record's key
  if (key == 0x5EEDull) atomicAdd(&ws->drops, 0ull);  // keeps the computation
  return SANITIZER_PATCH_SUCCESS;
#endif
  if (key == 0) key = 1;  // 0 marks an empty entry
  unsigned long long* keys = reinterpret_cast<unsigned long long*>(ws->keys);
  const unsigned long long mask = ws->capacity - 1;
  long long found = -1;
  for (unsigned int i = 0; i < KVCONV_WRITE_PROBES; ++i) {
    const unsigned long long idx = (key + i) & mask;
    unsigned long long k = keys[idx];  // L1 may hold a stale 0: the CAS below then returns the key
    if (k == 0) {
      if (__ldcg(&ws->used) >= ws->limit) break;
      k = atomicCAS(&keys[idx], 0ull, key);
      if (k == 0) {  // claimed: this thread writes the identity of the record
        atomicAdd(&ws->used, 1ull);
        kvconv_slot_write_t* r = reinterpret_cast<kvconv_slot_write_t*>(ws->records) + idx;
        r->gridid = gid;
        r->tag = tag;
        r->page = page;
        r->offset = off;
        r->cache_id = cache_id;
        r->kernel_slot = kslot;
        r->block_x = blockIdx.x;
        r->block_y = static_cast<uint16_t>(blockIdx.y);
        r->block_z = static_cast<uint16_t>(blockIdx.z);
        r->flags = (tag ? KVCONV_SLOT_WRITE_FLAGS_HAS_TAG : 0) | (ci < 0 ? KVCONV_SLOT_WRITE_FLAGS_OUTSIDE : 0);
        found = static_cast<long long>(idx);
        break;
      }
    }
    if (k == key) {
      found = static_cast<long long>(idx);
      break;
    }
  }
  if (found < 0) {
    atomicAdd(&ws->drops, 1ull);
    return SANITIZER_PATCH_SUCCESS;
  }
#if !defined(KVCONV_WRITES_NOCOUNT) || !defined(KVCONV_WRITES_NORANGE)
  kvconv_slot_write_t* r = reinterpret_cast<kvconv_slot_write_t*>(ws->records) + found;
#endif
  // One count per group of lanes storing to the same record (the threads of a block mostly share a few slots).
#ifndef KVCONV_WRITES_NOCOUNT  // cost measurement only (make cost-variants): no store count
  const unsigned int active = __activemask();
  const unsigned int peers = __match_any_sync(active, key);
  if (kv_laneid() == static_cast<unsigned int>(__ffs(peers) - 1)) atomicAdd(&r->stores, __popc(peers));
#endif
#ifndef KVCONV_WRITES_NORANGE  // cost measurement only: no address range
  // The address range: an atomic only when this store widens it (most stores of a slot do not).
  const unsigned long long nlo = ~a, hi = a + size;
  // Plain loads: a stale (smaller) value only costs an atomic that changes nothing (__ldcg instead, coherent with
  // the atomics, measured no faster: engine-small +48.2% against +47.9%).
  if (nlo > r->addr_lo) atomicMax(reinterpret_cast<unsigned long long*>(&r->addr_lo), nlo);
  if (hi > r->addr_hi) atomicMax(reinterpret_cast<unsigned long long*>(&r->addr_hi), hi);
#endif
  return SANITIZER_PATCH_SUCCESS;
}
