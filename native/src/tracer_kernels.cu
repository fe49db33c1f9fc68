// The tracer's own kernels (one fatbin, kvconv_clocksync.fatbin): the clock read of the clock-sync pairs
// (clock_pairs.cpp) and the calibration's kernels (calibrate.cpp).
//
// Clock-sync kernel: one thread reads %globaltimer and writes it to host-mapped memory. The host brackets the
// launch with CLOCK_MONOTONIC reads and keeps the narrowest of a few tries (clock_pairs.cpp, do_clock_sync).
extern "C" __global__ void kvconv_clock_read(unsigned long long* out) {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  *reinterpret_cast<volatile unsigned long long*>(out) = t;
  __threadfence_system();
}

// Calibration kernel (calibrate.cpp): a paged-KV-append-shaped body (block b copies row b of src, `words` 8-byte
// words, to row slot(b) of dst) whose thread 0 of every block stamps the launch's own first entry and last exit
// (after the block's work) into first[k] / last[k]. Run from a patched and an unpatched copy of this module: the
// tracer's enter/exit span of the patched launches against the kernel's own span of the unpatched ones is the
// instrumentation's bias on a measured duration.
extern "C" __global__ void kvconv_calib_append(unsigned long long* dst, const unsigned long long* src, int words,
                                               unsigned long long* first, unsigned long long* last, int k) {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  if (threadIdx.x == 0) atomicMin(&first[k], t);
  const int b = blockIdx.x, slot = 17 * b + 3;
  for (int i = threadIdx.x; i < words; i += blockDim.x) dst[(size_t)slot * words + i] = src[(size_t)b * words + i];
  __syncthreads();
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  if (threadIdx.x == 0) atomicMax(&last[k], t);
}

// Calibration's spin (calibrate.cpp): one thread waits `ns` of %globaltimer, so that the launches queued behind it
// run back to back on the GPU and the CUDA events between them time the kernels, not the host's launch rate.
extern "C" __global__ void kvconv_calib_spin(unsigned long long ns) {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < ns);
}
