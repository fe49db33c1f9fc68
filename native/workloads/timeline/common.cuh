// node_timeline: where a traced graph node's added time lies (issue 31). Shared declarations.
#pragma once
#include <cstdint>
__device__ __forceinline__ uint64_t gtimer() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
// A paged-KV-append-shaped body: block b copies row b of src (D halves as u16) to row slot[b] of dst, and block
// thread 0 records the kernel's own first entry / last exit (after the block's work) for node k.
__device__ __forceinline__ void append_body(uint16_t* dst, const uint16_t* src, const int* slot, int D,
                                            unsigned long long* first, unsigned long long* last, int k) {
  if (threadIdx.x == 0) atomicMin(&first[k], (unsigned long long)gtimer());
  const int b = blockIdx.x;
  for (int i = threadIdx.x; i < D; i += blockDim.x) dst[(size_t)slot[b] * D + i] = src[(size_t)b * D + i];
  __syncthreads();
  if (threadIdx.x == 0) atomicMax(&last[k], (unsigned long long)gtimer());
}
