// kvconv_calib_cupti: CUPTI's durations of the tracer's calibration kernel, untraced (issue 27 item 5).
//
// The tracer (calibrate.cpp) measures its own span of kvconv_calib_append on a patched copy; the reference it
// subtracts from is what a profiler reports for the same kernel untraced. CUPTI cannot subscribe in a process the
// Compute Sanitizer is injected into (CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED on the H200), and no
// device-side timestamp separates a kernel's launch and drain from the gap to the next one, so the tracer runs this
// program (without the injection) once at start-up: it launches the kernel as the calibration does (8 blocks x 128
// threads, rows of 2 KiB), reads CUPTI's kernel activity records and prints one line:
//   {"kernels": N, "median_ns": M}
// Usage: kvconv_calib_cupti FATBIN DEVICE_ORDINAL LAUNCHES. libcuda.so.1 and libcupti (KVCONV_CUPTI_LIB, else
// libcupti.so.13, libcupti.so) are opened at run time: nothing CUDA is linked. Exit 0 with the line, else 1 with a
// reason on stderr.
#include <cuda.h>
#include <cupti_activity.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

namespace {

struct Cupti {
  CUptiResult (*registerCallbacks)(CUpti_BuffersCallbackRequestFunc, CUpti_BuffersCallbackCompleteFunc);
  CUptiResult (*enable)(CUpti_ActivityKind);
  CUptiResult (*flushAll)(uint32_t);
  CUptiResult (*next)(uint8_t*, size_t, CUpti_Activity**);
};
Cupti g_cupti;
std::mutex g_mu;
std::vector<double> g_ns;  // durations of kvconv_calib_append

template <typename T>
bool sym(void* h, T& fn, const char* name) {
  fn = reinterpret_cast<T>(dlsym(h, name));
  return fn != nullptr;
}

void CUPTIAPI request(uint8_t** buf, size_t* size, size_t* max_records) {
  *size = 1 << 20;
  *buf = static_cast<uint8_t*>(aligned_alloc(8, *size));
  *max_records = 0;
}

void CUPTIAPI complete(CUcontext, uint32_t, uint8_t* buf, size_t, size_t valid) {
  CUpti_Activity* rec = nullptr;
  while (g_cupti.next(buf, valid, &rec) == CUPTI_SUCCESS) {
    if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && rec->kind != CUPTI_ACTIVITY_KIND_KERNEL) continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);  // start/end/name: stable across versions
    if (k->name && strstr(k->name, "kvconv_calib_append") && k->end > k->start) {
      std::lock_guard<std::mutex> lk(g_mu);
      g_ns.push_back(static_cast<double>(k->end - k->start));
    }
  }
  free(buf);
}

void* open_cupti() {
  const char* env = getenv("KVCONV_CUPTI_LIB");
  for (const char* n : {env, "libcupti.so.13", "libcupti.so"})
    if (n && *n)
      if (void* h = dlopen(n, RTLD_NOW)) return h;
  return nullptr;
}

int fail(const char* why) {
  fprintf(stderr, "kvconv_calib_cupti: %s\n", why);
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) return fail("usage: kvconv_calib_cupti FATBIN DEVICE_ORDINAL LAUNCHES");
  const int ordinal = atoi(argv[2]), launches = std::max(10, atoi(argv[3]));
  void* cu = dlopen("libcuda.so.1", RTLD_NOW);
  void* cp = open_cupti();
  if (!cu) return fail("cannot open libcuda.so.1");
  if (!cp) return fail("cannot open libcupti (set KVCONV_CUPTI_LIB)");
  CUresult (*init)(unsigned);
  CUresult (*devGet)(CUdevice*, int);
  CUresult (*retain)(CUcontext*, CUdevice);
  CUresult (*setCurrent)(CUcontext);
  CUresult (*load)(CUmodule*, const char*);
  CUresult (*getFn)(CUfunction*, CUmodule, const char*);
  CUresult (*alloc)(CUdeviceptr*, size_t);
  CUresult (*memset8)(CUdeviceptr, unsigned char, size_t);
  CUresult (*launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
                     void**, void**);
  CUresult (*sync)();
  bool ok = sym(cu, init, "cuInit") && sym(cu, devGet, "cuDeviceGet") && sym(cu, retain, "cuDevicePrimaryCtxRetain") &&
            sym(cu, setCurrent, "cuCtxSetCurrent") && sym(cu, load, "cuModuleLoad") &&
            sym(cu, getFn, "cuModuleGetFunction") && sym(cu, alloc, "cuMemAlloc_v2") &&
            sym(cu, memset8, "cuMemsetD8_v2") && sym(cu, launch, "cuLaunchKernel") && sym(cu, sync, "cuCtxSynchronize");
  ok = ok && sym(cp, g_cupti.registerCallbacks, "cuptiActivityRegisterCallbacks") &&
       sym(cp, g_cupti.enable, "cuptiActivityEnable") && sym(cp, g_cupti.flushAll, "cuptiActivityFlushAll") &&
       sym(cp, g_cupti.next, "cuptiActivityGetNextRecord");
  if (!ok) return fail("a CUDA or CUPTI entry point is missing");
  if (g_cupti.registerCallbacks(request, complete) != CUPTI_SUCCESS ||
      g_cupti.enable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS)
    return fail("CUPTI refused its activity callbacks (another subscriber, or no permission)");
  CUdevice dev;
  CUcontext ctx;
  CUmodule mod;
  CUfunction fn;
  if (init(0) || devGet(&dev, ordinal) || retain(&ctx, dev) || setCurrent(ctx)) return fail("no CUDA device");
  if (load(&mod, argv[1]) || getFn(&fn, mod, "kvconv_calib_append")) return fail("cannot load the calibration kernel");
  const int blocks = 8, threads = 128, words = 256;  // calibrate.cpp's shape
  CUdeviceptr dst, src, first, last;
  if (alloc(&dst, (size_t)(17 * blocks + 4) * words * 8) || alloc(&src, (size_t)blocks * words * 8) ||
      alloc(&first, 8ull * (launches + 20)) || alloc(&last, 8ull * (launches + 20)))
    return fail("device memory");
  memset8(first, 0xff, 8ull * (launches + 20));
  memset8(last, 0, 8ull * (launches + 20));
  int w = words;
  for (int k = 0; k < launches + 20; ++k) {  // 20 first, as the calibration's warm-up: not counted
    int idx = k;
    void* args[] = {&dst, &src, &w, &first, &last, &idx};
    if (launch(fn, blocks, 1, 1, threads, 1, 1, 0, nullptr, args, nullptr)) return fail("a launch failed");
    if (k == 19 && sync() == CUDA_SUCCESS) {
      g_cupti.flushAll(1);
      std::lock_guard<std::mutex> lk(g_mu);
      g_ns.clear();
    }
  }
  if (sync()) return fail("the launches failed");
  g_cupti.flushAll(1);
  std::lock_guard<std::mutex> lk(g_mu);
  if (g_ns.size() < static_cast<size_t>(launches) / 2) return fail("CUPTI recorded too few kernels");
  std::sort(g_ns.begin(), g_ns.end());
  const size_t n = g_ns.size();
  const double med = n % 2 ? g_ns[n / 2] : (g_ns[n / 2 - 1] + g_ns[n / 2]) / 2;
  printf("{\"kernels\": %zu, \"median_ns\": %.1f}\n", n, med);
  return 0;
}
