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

static __device__ __forceinline__ SanitizerPatchResult kv_record(void* userdata, uint64_t pc, unsigned char kind) {
  if (userdata == nullptr) return SANITIZER_PATCH_SUCCESS;
  if ((threadIdx.x | threadIdx.y | threadIdx.z) != 0) return SANITIZER_PATCH_SUCCESS;
  const unsigned long long u = reinterpret_cast<unsigned long long>(userdata);
  kvconv_dev_state* st = reinterpret_cast<kvconv_dev_state*>(u & KVCONV_STATE_MASK);
  const unsigned long long tag = u & KVCONV_TAG_MASK;
  const unsigned int slot = static_cast<unsigned int>(u >> KVCONV_SLOT_SHIFT);
  const unsigned long long seq = atomicAdd(&st->next, 1ull);
  if (seq >= st->capacity) {
    atomicAdd(&st->drops, 1ull);
    return SANITIZER_PATCH_SUCCESS;
  }
  kvconv_device_event_t* ev = reinterpret_cast<kvconv_device_event_t*>(st->events) + seq;
  kvconv_device_event_t e;
  e.globaltimer = kv_globaltimer();
  e.pc = pc;
  e.gridid = kv_gridid();
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
