// The few driver calls the tracer makes (clock sync, the flusher's copies, synchronize before the final copy, GPU name), through
// dlopen("libcuda.so.1"): the driver is never linked. And the check of every sanitizer return code.
#include <dlfcn.h>

#include "tracer.h"

namespace kvtr {

Drv g_drv;
std::atomic<uint64_t> g_sanitizer_errors{0};

template <typename T>
static void sym(void* h, T& fn, const char* name) {
  fn = reinterpret_cast<T>(dlsym(h, name));
}

void load_driver() {
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (!h) h = dlopen("libcuda.so.1", RTLD_NOW);
  if (!h) return;
  sym(h, g_drv.ctxPush, "cuCtxPushCurrent_v2");
  sym(h, g_drv.ctxPop, "cuCtxPopCurrent_v2");
  sym(h, g_drv.ctxSync, "cuCtxSynchronize");
  sym(h, g_drv.moduleLoad, "cuModuleLoad");
  sym(h, g_drv.moduleGetFunction, "cuModuleGetFunction");
  sym(h, g_drv.streamCreate, "cuStreamCreate");
  sym(h, g_drv.memHostAlloc, "cuMemHostAlloc");
  sym(h, g_drv.memHostGetDevicePointer, "cuMemHostGetDevicePointer_v2");
  sym(h, g_drv.launchKernel, "cuLaunchKernel");
  sym(h, g_drv.deviceGetName, "cuDeviceGetName");
  sym(h, g_drv.driverGetVersion, "cuDriverGetVersion");
  sym(h, g_drv.streamIsCapturing, "cuStreamIsCapturing");
  sym(h, g_drv.memcpyDtoHAsync, "cuMemcpyDtoHAsync_v2");
  sym(h, g_drv.streamSynchronize, "cuStreamSynchronize");
  sym(h, g_drv.threadExchangeStreamCaptureMode, "cuThreadExchangeStreamCaptureMode");
  sym(h, g_drv.memAlloc, "cuMemAlloc_v2");
  sym(h, g_drv.memcpyHtoDAsync, "cuMemcpyHtoDAsync_v2");
  sym(h, g_drv.memsetD8Async, "cuMemsetD8Async");
  sym(h, g_drv.deviceTotalMem, "cuDeviceTotalMem_v2");

  g_drv.ok = g_drv.ctxPush && g_drv.ctxPop && g_drv.ctxSync && g_drv.moduleLoad && g_drv.moduleGetFunction &&
             g_drv.streamCreate && g_drv.memHostAlloc && g_drv.memHostGetDevicePointer && g_drv.launchKernel;
}

std::string gpu_name(int device) {
  char buf[256] = {0};
  if (g_drv.deviceGetName && g_drv.deviceGetName(buf, sizeof buf - 1, device) == CUDA_SUCCESS) return buf;
  return "";
}

bool sync_context(CUcontext ctx) {
  if (!g_drv.ok || g_drv.ctxPush(ctx) != CUDA_SUCCESS) return false;
  const bool ok = g_drv.ctxSync() == CUDA_SUCCESS;
  CUcontext popped;
  g_drv.ctxPop(&popped);
  return ok;
}

bool relaxed_capture_mode() {
  CUstreamCaptureMode m = CU_STREAM_CAPTURE_MODE_RELAXED;
  return g_drv.threadExchangeStreamCaptureMode && g_drv.threadExchangeStreamCaptureMode(&m) == CUDA_SUCCESS;
}

bool san_ok(SanitizerResult r, const char* what) {
  if (r == SANITIZER_SUCCESS) return true;
  g_sanitizer_errors.fetch_add(1, std::memory_order_relaxed);
  const char* s = nullptr;
  sanitizerGetResultString(r, &s);
  logf(0, "error: %s failed: %s (%d)", what, s ? s : "?", static_cast<int>(r));
  return false;
}

}  // namespace kvtr
