// One module: the traced kernel and a sibling that is not a target (as PyTorch's IndexKernel.cu module holds every
// index kernel). The Compute Sanitizer patches a module as a whole.
#include "common.cuh"
extern "C" __global__ void kvt_target_append(uint16_t* dst, const uint16_t* src, const int* slot, int D,
                                             unsigned long long* first, unsigned long long* last, int k) {
  append_body(dst, src, slot, D, first, last, k);
}
extern "C" __global__ void kvt_sibling_append(uint16_t* dst, const uint16_t* src, const int* slot, int D,
                                              unsigned long long* first, unsigned long long* last, int k) {
  append_body(dst, src, slot, D, first, last, k);
}
void launch_target(int which, cudaStream_t s, int blocks, int threads, uint16_t* dst, const uint16_t* src,
                   const int* slot, int D, unsigned long long* first, unsigned long long* last, int k) {
  if (which == 0) kvt_target_append<<<blocks, threads, 0, s>>>(dst, src, slot, D, first, last, k);
  else kvt_sibling_append<<<blocks, threads, 0, s>>>(dst, src, slot, D, first, last, k);
}
