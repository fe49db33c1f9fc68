// SGLang's KV store as kvconv sees it (issue 49), without SGLang: the kernel of
// python/sglang/jit_kernel/csrc/elementwise/kvcache.cuh, store_kvcache<2048l, 4, true, long>(StoreKVCacheParams)
// (tvm-ffi's launcher replaced by cudaLaunchKernelEx with PDL, as LaunchKernel(...).enable_pdl(true) does), over an
// MHA pool of per-layer K and V buffers with page size 1 (slot 0: the dummy slot padding rows go to). The caches are
// registered with the tracer and each step's slot mapping handed over, as kvconv's SGLang plugin does, through the
// tracer's C entry points (kvconv_register_cache, kvconv_record_step; kvconv/capture/probe/writes.py via ctypes).
//
// One eager prefill (step 0), then a CUDA graph of the decode step (one store_kvcache per layer) replayed per step.
// Its stores are STG.E.128 (16 bytes a lane, a warp 512 bytes of one token's K and of its V): nvdisasm of this file
// built for sm_90 shows two STG.E.128 between ACQBULK (griddepcontrol.wait) and PREEXIT.
//
//   store_kvcache49 clean | kill     kill: SIGKILL itself after the last step and a quiet second (an engine's
//                                    scheduler killed by its shutdown); prints one JSON line of what it did
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

struct StoreKVCacheParams {
  const void* __restrict__ k;
  const void* __restrict__ v;
  void* __restrict__ k_cache;
  void* __restrict__ v_cache;
  const void* __restrict__ indices;
  int64_t stride_k_bytes;
  int64_t stride_v_bytes;
  int64_t stride_cache_bytes;
  int64_t stride_indices;
  uint32_t batch_size;
  int64_t size_limit;
};

constexpr uint32_t kNumWarps = 4, kWarp = 32;

// The kernel's copy (copy_kv_warp with kAlignment 16: one uint4 a lane per loop).
template <int64_t kElementBytes, int kSplit, bool kUsePDL, typename T>
__global__ void store_kvcache(const __grid_constant__ StoreKVCacheParams params) {
  constexpr int64_t kSplitSize = kElementBytes / kSplit;
  const uint32_t warp_id = blockIdx.x * kNumWarps + threadIdx.x / kWarp;
  const uint32_t item_id = warp_id / kSplit;
  const uint32_t split_id = warp_id % kSplit;
  if (item_id >= params.batch_size) return;
  const T* index_ptr = static_cast<const T*>(params.indices) + item_id * params.stride_indices;
  if (kUsePDL) asm volatile("griddepcontrol.wait;" ::: "memory");
  const T index = *index_ptr;
  const char* k_src = static_cast<const char*>(params.k) + item_id * params.stride_k_bytes + split_id * kSplitSize;
  const char* v_src = static_cast<const char*>(params.v) + item_id * params.stride_v_bytes + split_id * kSplitSize;
  char* k_dst = static_cast<char*>(params.k_cache) + index * params.stride_cache_bytes + split_id * kSplitSize;
  char* v_dst = static_cast<char*>(params.v_cache) + index * params.stride_cache_bytes + split_id * kSplitSize;
  const uint32_t lane = threadIdx.x % kWarp;
#pragma unroll
  for (int64_t i = 0; i < kSplitSize / (16 * kWarp); ++i) {
    const uint4 k = reinterpret_cast<const uint4*>(k_src)[i * kWarp + lane];
    const uint4 v = reinterpret_cast<const uint4*>(v_src)[i * kWarp + lane];
    reinterpret_cast<uint4*>(k_dst)[i * kWarp + lane] = k;
    reinterpret_cast<uint4*>(v_dst)[i * kWarp + lane] = v;
  }
  if (kUsePDL) asm volatile("griddepcontrol.launch_dependents;");
}

static const int kLayers = 8, kRows = 8, kPrefill = 16, kSteps = 20, kSlots = 1024;
static const int64_t kRowBytes = 2048;  // 8 KV heads x 128 x bf16

#define CK(x)                                                                              \
  do {                                                                                     \
    cudaError_t e_ = (x);                                                                  \
    if (e_ != cudaSuccess) {                                                               \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(3);                                                                        \
    }                                                                                      \
  } while (0)

using RegisterFn = int (*)(uint64_t, uint64_t, uint32_t, uint32_t, const char*);
using StepFn = int (*)(uint64_t, uint64_t, uint64_t, uint32_t, const int64_t*, const uint64_t*, const uint32_t*);

static uint64_t now_ns() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<uint64_t>(t.tv_sec) * 1000000000ull + static_cast<uint64_t>(t.tv_nsec);
}

struct Pool {
  std::vector<char*> k, v;
  char *ksrc = nullptr, *vsrc = nullptr;
  int64_t* idx = nullptr;
};

static void launch(const Pool& p, int layer, uint32_t rows, cudaStream_t s) {
  StoreKVCacheParams prm{p.ksrc, p.vsrc, p.k[layer], p.v[layer], p.idx, kRowBytes, kRowBytes, kRowBytes, 1, rows,
                         kSlots};
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3((rows * 4 + kNumWarps - 1) / kNumWarps);
  cfg.blockDim = dim3(kNumWarps * kWarp);
  cfg.stream = s;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  CK(cudaLaunchKernelEx(&cfg, store_kvcache<2048l, 4, true, long>, prm));
}

int main(int argc, char** argv) {
  const bool kill_at_end = argc > 1 && !std::strcmp(argv[1], "kill");
  CK(cudaFree(nullptr));
  const char* inj = getenv("CUDA_INJECTION64_PATH");
  void* lib = inj ? dlopen(inj, RTLD_NOW | RTLD_NOLOAD) : nullptr;
  auto reg = lib ? reinterpret_cast<RegisterFn>(dlsym(lib, "kvconv_register_cache")) : nullptr;
  auto rec = lib ? reinterpret_cast<StepFn>(dlsym(lib, "kvconv_record_step")) : nullptr;
  Pool p;
  for (int l = 0; l < kLayers; ++l) {
    char *k, *v;
    CK(cudaMalloc(&k, kSlots * kRowBytes));
    CK(cudaMalloc(&v, kSlots * kRowBytes));
    p.k.push_back(k);
    p.v.push_back(v);
    char name[32];
    std::snprintf(name, sizeof name, "L%d.k", l);
    int rk = reg ? reg(reinterpret_cast<uint64_t>(k), kSlots * kRowBytes, kRowBytes, 1, name) : -100;
    std::snprintf(name, sizeof name, "L%d.v", l);
    int rv = reg ? reg(reinterpret_cast<uint64_t>(v), kSlots * kRowBytes, kRowBytes, 1, name) : -100;
    if (rk < 0 || rv < 0) std::fprintf(stderr, "register_cache: %d %d (no tracer with --writes?)\n", rk, rv);
  }
  CK(cudaMalloc(&p.ksrc, kPrefill * kRowBytes));
  CK(cudaMalloc(&p.vsrc, kPrefill * kRowBytes));
  CK(cudaMemset(p.ksrc, 1, kPrefill * kRowBytes));
  CK(cudaMemset(p.vsrc, 2, kPrefill * kRowBytes));
  CK(cudaMalloc(&p.idx, kPrefill * sizeof(int64_t)));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  // step 0: the prefill, eager; request r's two prompt tokens at slots 1 + 2r, 2 + 2r
  std::vector<int64_t> slots(kPrefill);
  std::vector<uint64_t> reqs(kPrefill);
  for (int i = 0; i < kPrefill; ++i) {
    slots[i] = 1 + i;
    reqs[i] = i / 2;
  }
  uint64_t t0 = now_ns();
  CK(cudaMemcpyAsync(p.idx, slots.data(), kPrefill * sizeof(int64_t), cudaMemcpyHostToDevice, s));
  for (int l = 0; l < kLayers; ++l) launch(p, l, kPrefill, s);
  CK(cudaStreamSynchronize(s));
  if (rec) rec(0, t0, now_ns(), kPrefill, slots.data(), reqs.data(), nullptr);
  // the decode step as a graph: kRows rows, one launch per layer
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int l = 0; l < kLayers; ++l) launch(p, l, kRows, s);
  CK(cudaStreamEndCapture(s, &g));
  CK(cudaGraphInstantiate(&ge, g, 0));
  for (int step = 1; step <= kSteps; ++step) {
    slots.assign(kRows, 0);
    reqs.assign(kRows, 0);
    for (int r = 0; r < kRows; ++r) {
      slots[r] = kPrefill + 1 + (step - 1) * kRows + r;
      reqs[r] = r;
    }
    t0 = now_ns();
    CK(cudaMemcpyAsync(p.idx, slots.data(), kRows * sizeof(int64_t), cudaMemcpyHostToDevice, s));
    CK(cudaGraphLaunch(ge, s));
    CK(cudaStreamSynchronize(s));
    if (rec) rec(step, t0, now_ns(), kRows, slots.data(), reqs.data(), nullptr);
  }
  const int blocks = kLayers * ((kPrefill * 4 + 3) / 4) + kSteps * kLayers * ((kRows * 4 + 3) / 4);
  std::printf("{\"launches\": %d, \"blocks\": %d, \"slot_writes\": %d, \"caches\": %d, \"steps\": %d, \"tracer\": %s}\n",
              kLayers * (1 + kSteps), blocks, 2 * blocks, 2 * kLayers, kSteps + 1, rec ? "true" : "false");
  std::fflush(stdout);
  if (kill_at_end) {
    sleep(1);  // quiet: the tracer's flusher copies the write table into the live file (KVCONV_WRITES_SETTLE_MS)
    raise(SIGKILL);
  }
  return 0;
}
