// Clock-sync kernel: one thread reads %globaltimer and writes it to host-mapped memory. The host brackets the
// launch with CLOCK_MONOTONIC reads and keeps the narrowest of a few tries (tracer.cpp, do_clock_sync).
extern "C" __global__ void kvconv_clock_read(unsigned long long* out) {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  *reinterpret_cast<volatile unsigned long long*>(out) = t;
  __threadfence_system();
}
