// Shared between the tracer's write recording (writes.cpp) and its device patch (writes_patch.cuh): the device state
// of the write-address canary (issue 16). Its address is kvconv_dev_state.writes (0: write recording is off).
//
// The patch (SANITIZER_INSTRUCTION_GLOBAL_MEMORY_ACCESS, target kernels only: non-targets have NULL userdata)
// aggregates every global store of a target block into one kvconv_slot_write_t per (gridid, tag, block, cache, slot)
// (outside every cache: per 4 KiB granule). The records array is an open-addressing hash table keyed by a 64-bit
// fingerprint of that tuple in `keys` (0 = empty): the first store of a key claims its entry with one atomicCAS and
// writes the identity fields; every group of warp lanes on one key adds itself (count, address range) through one
// elected lane's atomics. No per-store record.
// addr_lo is kept complemented on the device (atomicMax of ~addr over a zeroed buffer); the host undoes it.
#pragma once
#include <stdint.h>

#define KVCONV_MAX_CACHES 256
#define KVCONV_WRITE_PROBES 32
#define KVCONV_OUTSIDE_GRANULE_SHIFT 12  // outside every cache: one record per block and 4 KiB granule
#define KVCONV_NO_CACHE 0xFFFFFFFFu

#define KVCONV_NO_SHIFT 0xFFFFFFFFu

struct kvconv_dev_cache {  // sorted by base; [base, end)
  unsigned long long base, end;
  unsigned int slot_bytes, page_size, cache_id;
  unsigned int slot_shift;  // log2(slot_bytes) when a power of two, else KVCONV_NO_SHIFT (the patch divides)
};

struct kvconv_writes_state {
  unsigned long long records;     // device address of kvconv_slot_write_t[capacity]
  unsigned long long keys;        // device address of unsigned long long[capacity]
  unsigned long long capacity;    // entries, a power of two
  unsigned long long limit;       // claims allowed (load bound: probes stay short)
  unsigned long long used;        // entries claimed
  unsigned long long drops;       // stores not recorded (table full, or no entry within KVCONV_WRITE_PROBES)
  unsigned long long n_caches;
  unsigned long long reserved;
  // The cache search in two levels of 16 (a store's cost is mostly its chain of dependent loads: a binary search over
  // 160 caches was 8 of them): top[g] = bases[16 g], bases[i] = caches[i].base, unused entries ~0.
  unsigned long long top[KVCONV_MAX_CACHES / 16];
  unsigned long long bases[KVCONV_MAX_CACHES];
  kvconv_dev_cache caches[KVCONV_MAX_CACHES];
};
