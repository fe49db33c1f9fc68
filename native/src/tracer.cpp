// kvconv tracer: a Compute Sanitizer injection library (CUDA_INJECTION64_PATH=libkvconv_tracer.so).
//
// Records, per CUDA context:
//   - device side: one 64-byte event per block of every target kernel (device patch patch.cu, block enter/exit),
//     %gridid plus a per-replay tag delivered through per-launch callback data;
//   - host side: graph kernel-node launches of target kernels (graph uploads filtered out), eager launches of
//     target kernels, the kernel table, clock-sync pairs (CLOCK_MONOTONIC bracket around a %globaltimer read);
// and writes a kvconv dump (schemas/layouts.json) atomically at context teardown and at process exit.
//
// Configuration (environment): see docs/TRACER.md.
//   KVCONV_KERNELS          comma-separated substrings of target kernel names (mangled or demangled)
//                           default: reshape_and_cache_flash_kernel
//   KVCONV_OUTPUT           output path; %p = pid, %c = context index, %% = %   default: kvconv-%p.kvdump
//   KVCONV_DEVICE_CAPACITY  device events per context                           default: 1048576 (64 MiB)
//   KVCONV_HOST_CAPACITY    host records per table (graph_node, eager_launch)   default: 65536
//   KVCONV_EVENTS           enter | exit | enter,exit                            default: enter
//   KVCONV_CLOCK_SYNC_MS    period of clock-sync pairs (0 = start and end only)   default: 1000
//   KVCONV_TAG              1 = per-replay tag through per-launch data, 0 = off   default: 1
//   KVCONV_PATCH_FILE       device patch fatbin          default: kvconv_patch.fatbin beside this library
//   KVCONV_CLOCKSYNC_FILE   clock-sync kernel fatbin     default: kvconv_clocksync.fatbin beside this library
//   KVCONV_VERBOSE          0 errors and one summary line, 1 info, 2 debug      default: 0
//   KVCONV_CALLBACKS        minimal (only the callbacks used) | domains (whole domains)   default: minimal
//   KVCONV_GRAPH_CALLBACKS  0 = no graph-node records (measures their cost; breaks the join)  default: 1
#include <cxxabi.h>
#include <cerrno>
#include <dlfcn.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <cuda.h>
#include <sanitizer.h>

#include "dump_writer.h"
#include "kvconv_records.h"
#include "tracer_shared.h"

#ifndef KVCONV_VERSION
#define KVCONV_VERSION "0.1.0"
#endif

namespace {

using kvconv::GroupSpec;

uint64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

// ------------------------------------------------------------------------------------------------ configuration
struct Config {
  std::vector<std::string> patterns;
  std::vector<std::string> module_tokens;  // identifier runs of the patterns, searched in cubin bytes
  std::string output = "kvconv-%p.kvdump";
  uint64_t dev_cap = 1048576;
  uint64_t host_cap = 65536;
  bool enter = true, exit = false;
  int sync_ms = 1000;
  bool tag = true;
  bool graph_callbacks = true;   // KVCONV_GRAPH_CALLBACKS=0: no graph-node records (overhead measurement only)
  bool whole_domains = false;    // KVCONV_CALLBACKS=domains: enable whole callback domains (the facts-note setup)
  int verbose = 0;
  std::string patch_file, clocksync_file;
};
Config g_cfg;
bool g_enabled = false;

void logf(int level, const char* fmt, ...) {
  if (level > g_cfg.verbose) return;
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  fprintf(stderr, "kvconv-tracer: %s\n", buf);
  fflush(stderr);
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s) {
    if (c == sep) {
      if (!cur.empty()) out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (!cur.empty()) out.push_back(cur);
  return out;
}

uint64_t env_u64(const char* name, uint64_t def) {
  const char* v = getenv(name);
  if (!v || !*v) return def;
  char* end = nullptr;
  unsigned long long x = strtoull(v, &end, 10);
  if (end == v || *end) {
    logf(0, "warning: %s=%s is not a number; using %llu", name, v, (unsigned long long)def);
    return def;
  }
  return x;
}

std::string self_dir() {
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(&self_dir), &info) && info.dli_fname) {
    std::string p = info.dli_fname;
    auto s = p.rfind('/');
    if (s != std::string::npos) return p.substr(0, s);
  }
  return ".";
}

void load_config() {
  const char* k = getenv("KVCONV_KERNELS");
  g_cfg.patterns = split(k && *k ? k : "reshape_and_cache_flash_kernel", ',');
  for (auto& p : g_cfg.patterns) {
    // longest identifier run of the pattern: what must appear in a module's cubin for it to hold the kernel
    std::string best, cur;
    for (char c : p + " ") {
      if (isalnum(static_cast<unsigned char>(c)) || c == '_') {
        cur += c;
      } else {
        if (cur.size() > best.size()) best = cur;
        cur.clear();
      }
    }
    g_cfg.module_tokens.push_back(best);
  }
  if (const char* o = getenv("KVCONV_OUTPUT"); o && *o) g_cfg.output = o;
  g_cfg.dev_cap = env_u64("KVCONV_DEVICE_CAPACITY", g_cfg.dev_cap);
  g_cfg.host_cap = env_u64("KVCONV_HOST_CAPACITY", g_cfg.host_cap);
  if (const char* e = getenv("KVCONV_EVENTS"); e && *e) {
    g_cfg.enter = g_cfg.exit = false;
    for (auto& t : split(e, ',')) {
      if (t == "enter") g_cfg.enter = true;
      else if (t == "exit") g_cfg.exit = true;
      else logf(0, "warning: unknown event kind '%s' in KVCONV_EVENTS (enter, exit)", t.c_str());
    }
    if (!g_cfg.enter && !g_cfg.exit) g_cfg.enter = true;
  }
  g_cfg.sync_ms = static_cast<int>(env_u64("KVCONV_CLOCK_SYNC_MS", 1000));
  g_cfg.tag = env_u64("KVCONV_TAG", 1) != 0;
  g_cfg.graph_callbacks = env_u64("KVCONV_GRAPH_CALLBACKS", 1) != 0;
  if (const char* cb = getenv("KVCONV_CALLBACKS"); cb && !strcmp(cb, "domains")) g_cfg.whole_domains = true;
  g_cfg.verbose = static_cast<int>(env_u64("KVCONV_VERBOSE", 0));
  std::string dir = self_dir();
  const char* pf = getenv("KVCONV_PATCH_FILE");
  g_cfg.patch_file = pf && *pf ? pf : dir + "/kvconv_patch.fatbin";
  const char* cf = getenv("KVCONV_CLOCKSYNC_FILE");
  g_cfg.clocksync_file = cf && *cf ? cf : dir + "/kvconv_clocksync.fatbin";
}

// ------------------------------------------------------------------------------------------------ driver API (dlsym)
struct Drv {
  bool ok = false;
  CUresult (*ctxPush)(CUcontext) = nullptr;
  CUresult (*ctxPop)(CUcontext*) = nullptr;
  CUresult (*ctxSync)() = nullptr;
  CUresult (*moduleLoad)(CUmodule*, const char*) = nullptr;
  CUresult (*moduleGetFunction)(CUfunction*, CUmodule, const char*) = nullptr;
  CUresult (*streamCreate)(CUstream*, unsigned) = nullptr;
  CUresult (*memHostAlloc)(void**, size_t, unsigned) = nullptr;
  CUresult (*memHostGetDevicePointer)(CUdeviceptr*, void*, unsigned) = nullptr;
  CUresult (*launchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
                           void**, void**) = nullptr;
  CUresult (*deviceGetName)(char*, int, CUdevice) = nullptr;
  CUresult (*driverGetVersion)(int*) = nullptr;
  CUresult (*streamIsCapturing)(CUstream, CUstreamCaptureStatus*) = nullptr;
};
Drv g_drv;

template <typename T>
void sym(void* h, T& fn, const char* name) {
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
  g_drv.ok = g_drv.ctxPush && g_drv.ctxPop && g_drv.ctxSync && g_drv.moduleLoad && g_drv.moduleGetFunction &&
             g_drv.streamCreate && g_drv.memHostAlloc && g_drv.memHostGetDevicePointer && g_drv.launchKernel;
}

// ------------------------------------------------------------------------------------------------ counters
std::atomic<uint64_t> g_sanitizer_errors{0};

bool san_ok(SanitizerResult r, const char* what) {
  if (r == SANITIZER_SUCCESS) return true;
  g_sanitizer_errors.fetch_add(1, std::memory_order_relaxed);
  const char* s = nullptr;
  sanitizerGetResultString(r, &s);
  logf(0, "error: %s failed: %s (%d)", what, s ? s : "?", static_cast<int>(r));
  return false;
}
#define SAN(call) san_ok((call), #call)

// ------------------------------------------------------------------------------------------------ host tables
struct HostTable {
  std::unique_ptr<kvconv_host_launch_t[]> recs;
  std::unique_ptr<std::atomic<uint8_t>[]> ready;
  uint64_t cap = 0;
  std::atomic<uint64_t> next{0};
  std::atomic<uint64_t> drops{0};

  void init(uint64_t c) {
    cap = c;
    recs.reset(new kvconv_host_launch_t[c ? c : 1]);
    ready.reset(new std::atomic<uint8_t>[c ? c : 1]);
    for (uint64_t i = 0; i < c; ++i) ready[i].store(0, std::memory_order_relaxed);
  }
  // Lock-free append: one fetch_add reserves the row, a release store publishes it.
  void append(const kvconv_host_launch_t& r) {
    uint64_t i = next.fetch_add(1, std::memory_order_relaxed);
    if (i >= cap) {
      drops.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    recs[i] = r;
    ready[i].store(1, std::memory_order_release);
  }
  // Published prefix; rows reserved but not yet published at snapshot time count as drops.
  uint64_t published(uint64_t* unpublished) const {
    uint64_t n = std::min(next.load(std::memory_order_acquire), cap);
    uint64_t k = 0;
    while (k < n && ready[k].load(std::memory_order_acquire)) ++k;
    *unpublished = n - k;
    return k;
  }
};

struct KernelInfo {
  uint32_t slot;
  uint64_t module;
  std::string name;
};

struct SyncRes {
  bool tried = false, ok = false;
  CUmodule mod = nullptr;
  CUfunction fn = nullptr;
  CUstream stream = nullptr;
  volatile unsigned long long* host = nullptr;
  CUdeviceptr dev = 0;
};

struct Ctx {
  CUcontext ctx = nullptr;
  uint32_t index = 0;
  int device = 0;
  std::mutex mu;  // guards the maps and the device set-up below
  bool patches_loaded = false, setup_failed = false;
  void* alloc = nullptr;
  uint64_t state_dev = 0;  // aligned address of kvconv_dev_state
  Sanitizer_StreamHandle null_stream = nullptr;
  std::unordered_set<CUmodule> patched_modules;
  std::unordered_set<CUmodule> seen_modules;
  std::unordered_map<CUfunction, uint32_t> fn_slot;  // 0 = known non-target
  std::unordered_map<CUfunction, uint64_t> fn_data;  // callback data given to each function of a patched module
  std::vector<KernelInfo> kernels;
  HostTable graph, eager;
  std::atomic<uint64_t> target_launches{0}, uploads_filtered{0}, captured_launches_filtered{0};
  std::atomic<uint64_t> modules_patched{0}, late_patched_modules{0}, functions_given_data{0};
  std::atomic<uint64_t> launch_data_set{0};
  // clock sync
  std::mutex sync_mu;
  std::vector<kvconv_clock_sync_t> syncs;
  uint64_t last_sync_ns = 0;
  uint32_t sync_failures = 0;
  SyncRes sres;
  // snapshot (at teardown / exit)
  bool alive = true;
  bool snapped = false;
  std::vector<kvconv_device_event_t> events;
  uint64_t dev_next = 0, dev_drops = 0, dev_lost_unwritten = 0;
  std::vector<kvconv_host_launch_t> graph_recs, eager_recs;
  uint64_t graph_drops = 0, eager_drops = 0;
};

std::mutex g_mu;                                  // registry
std::vector<Ctx*> g_all;                          // every context seen, never freed
std::unordered_map<CUcontext, Ctx*> g_live;       // live contexts
std::atomic<uint64_t> g_gen{0};                   // bumped when a context dies (invalidates thread caches)
Sanitizer_SubscriberHandle g_sub = nullptr;
std::string g_hostname, g_started_at;
std::vector<std::string> g_cmdline;

Ctx* get_ctx(CUcontext c, int device = -1) {
  thread_local CUcontext t_c = nullptr;
  thread_local Ctx* t_p = nullptr;
  thread_local uint64_t t_gen = ~0ull;
  uint64_t gen = g_gen.load(std::memory_order_acquire);
  if (c == t_c && t_p && gen == t_gen) return t_p;
  std::lock_guard<std::mutex> lk(g_mu);
  auto it = g_live.find(c);
  Ctx* p;
  if (it != g_live.end()) {
    p = it->second;
  } else {
    p = new Ctx();
    p->ctx = c;
    p->index = static_cast<uint32_t>(g_all.size());
    p->device = device < 0 ? 0 : device;
    p->graph.init(g_cfg.host_cap);
    p->eager.init(g_cfg.host_cap);
    g_all.push_back(p);
    g_live[c] = p;
    logf(1, "context %u (device %d) seen", p->index, p->device);
  }
  if (device >= 0) p->device = device;
  t_c = c;
  t_p = p;
  t_gen = gen;
  return p;
}

// ------------------------------------------------------------------------------------------------ name matching
bool name_matches(const char* name) {
  if (!name) return false;
  for (auto& p : g_cfg.patterns)
    if (strstr(name, p.c_str())) return true;
  int st = 0;
  char* dem = abi::__cxa_demangle(name, nullptr, nullptr, &st);
  bool hit = false;
  if (dem && st == 0)
    for (auto& p : g_cfg.patterns)
      if (strstr(dem, p.c_str())) hit = true;
  free(dem);
  return hit;
}

bool cubin_has_target(const char* cubin, size_t size) {
  if (!cubin || !size) return true;  // unknown contents: patch (coverage first)
  for (auto& t : g_cfg.module_tokens) {
    if (t.empty()) return true;
    if (memmem(cubin, size, t.data(), t.size())) return true;
  }
  return false;
}

uint64_t encode(const Ctx* c, uint32_t slot, uint64_t tag) {
  if (!c->state_dev) return 0;
  return c->state_dev | (static_cast<uint64_t>(slot) << KVCONV_SLOT_SHIFT) | (tag & KVCONV_TAG_MASK);
}

// ------------------------------------------------------------------------------------------------ device set-up
// Called with c->mu held, inside a sanitizer callback, before the first patched module is patched.
bool setup_device(Ctx* c) {
  if (c->state_dev) return true;
  if (c->setup_failed) return false;
  c->setup_failed = true;  // until proven otherwise
  if (!SAN(sanitizerAddPatchesFromFile(g_cfg.patch_file.c_str(), c->ctx))) {
    logf(0, "error: cannot load the device patch %s", g_cfg.patch_file.c_str());
    return false;
  }
  c->patches_loaded = true;
  const uint64_t bytes = KVCONV_STATE_ALIGN + KVCONV_EVENTS_OFFSET + g_cfg.dev_cap * sizeof(kvconv_device_event_t);
  void* p = nullptr;
  if (!SAN(sanitizerAlloc(c->ctx, &p, bytes))) return false;
  c->alloc = p;
  const uint64_t base = reinterpret_cast<uint64_t>(p);
  const uint64_t state = (base + KVCONV_STATE_ALIGN - 1) & ~(KVCONV_STATE_ALIGN - 1);
  if (state >> KVCONV_SLOT_SHIFT) {
    logf(0, "error: device address %#llx does not fit in %d bits; cannot encode callback data",
         (unsigned long long)state, KVCONV_SLOT_SHIFT);
    return false;
  }
  if (!SAN(sanitizerGetStreamHandle(c->ctx, nullptr, &c->null_stream))) c->null_stream = nullptr;
  static kvconv_dev_state init;  // pageable source; copied to staging before the call returns
  std::memset(&init, 0, sizeof init);
  init.events = state + KVCONV_EVENTS_OFFSET;
  init.capacity = g_cfg.dev_cap;
  if (!SAN(sanitizerMemcpyHostToDeviceAsync(reinterpret_cast<void*>(state), &init, sizeof init, c->null_stream)))
    return false;
  if (!SAN(sanitizerStreamSynchronize(c->null_stream))) return false;
  c->state_dev = state;
  c->setup_failed = false;
  logf(1, "context %u: %llu-event device buffer at %#llx (%llu bytes)", c->index,
       (unsigned long long)g_cfg.dev_cap, (unsigned long long)state, (unsigned long long)bytes);
  return true;
}

bool patch_module(Ctx* c, CUmodule m) {  // c->mu held
  if (c->patched_modules.count(m)) return true;
  if (!setup_device(c)) return false;
  bool ok = true;
  if (g_cfg.enter) ok &= SAN(sanitizerPatchInstructions(SANITIZER_INSTRUCTION_BLOCK_ENTER, m, "kvconv_block_enter"));
  if (g_cfg.exit) ok &= SAN(sanitizerPatchInstructions(SANITIZER_INSTRUCTION_BLOCK_EXIT, m, "kvconv_block_exit"));
  ok &= SAN(sanitizerPatchModule(m));
  c->patched_modules.insert(m);
  c->modules_patched.fetch_add(1);
  logf(1, "context %u: patched module %p", c->index, (void*)m);
  return ok;
}

// Classify a function (target or not), give it function-level callback data if its module is patched.
// Returns the kernel slot (0 = not a target). Function-level data is set once and never changes: a stable pointer
// that lives as long as the context (the seed's lesson), NULL for non-targets.
uint32_t classify(Ctx* c, CUfunction f, const char* name, CUmodule m, bool launching) {
  std::lock_guard<std::mutex> lk(c->mu);
  uint32_t slot;
  auto it = c->fn_slot.find(f);
  if (it != c->fn_slot.end()) {
    slot = it->second;
  } else {
    slot = 0;
    if (name_matches(name)) {
      slot = static_cast<uint32_t>(c->kernels.size()) + 1;
      c->kernels.push_back({slot, reinterpret_cast<uint64_t>(m), name ? name : ""});
      logf(1, "context %u: target kernel slot %u: %s", c->index, slot, name ? name : "?");
      if (launching && !c->patched_modules.count(m)) {
        // The module check missed it (token not in the cubin bytes): patch now; blocks launched before are lost.
        logf(0, "warning: target %s is in a module that was not patched at load; patching at its launch",
             name ? name : "?");
        if (patch_module(c, m)) c->late_patched_modules.fetch_add(1);
      }
    }
    c->fn_slot[f] = slot;
  }
  if (c->patched_modules.count(m)) {
    const uint64_t ud = slot ? encode(c, slot, 0) : 0;
    auto d = c->fn_data.find(f);
    if (d == c->fn_data.end() || d->second != ud) {
      if (SAN(sanitizerSetCallbackData(f, reinterpret_cast<void*>(ud)))) c->functions_given_data.fetch_add(1);
      c->fn_data[f] = ud;
    }
  }
  return slot;
}

kvconv_host_launch_t host_record(const Sanitizer_LaunchData& ld, uint32_t slot) {
  kvconv_host_launch_t r;
  std::memset(&r, 0, sizeof r);
  r.grid_id = ld.gridId;
  r.stream = reinterpret_cast<uint64_t>(ld.stream);
  r.api_stream = reinterpret_cast<uint64_t>(ld.apiStream);
  r.host_ns = now_ns();
  r.grid_x = ld.gridDim_x;
  r.grid_y = ld.gridDim_y;
  r.grid_z = ld.gridDim_z;
  r.block_dim_x = ld.blockDim_x;
  r.block_dim_y = ld.blockDim_y;
  r.block_dim_z = ld.blockDim_z;
  r.kernel_slot = slot;
  return r;
}

// ------------------------------------------------------------------------------------------------ clock sync
void sync_init(Ctx* c) {  // context pushed on this thread
  SyncRes& s = c->sres;
  s.tried = true;
  if (!g_drv.ok) return;
  if (g_drv.moduleLoad(&s.mod, g_cfg.clocksync_file.c_str()) != CUDA_SUCCESS) {
    logf(0, "warning: cannot load %s; no clock-sync pairs", g_cfg.clocksync_file.c_str());
    return;
  }
  if (g_drv.moduleGetFunction(&s.fn, s.mod, "kvconv_clock_read") != CUDA_SUCCESS) return;
  if (g_drv.streamCreate(&s.stream, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) return;
  void* h = nullptr;
  if (g_drv.memHostAlloc(&h, 64, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE) != CUDA_SUCCESS) return;
  s.host = static_cast<volatile unsigned long long*>(h);
  if (g_drv.memHostGetDevicePointer(&s.dev, h, 0) != CUDA_SUCCESS) return;
  s.ok = true;
}

// One clock-sync pair: the narrowest of 5 brackets [t0, t1] around a kernel that reads %globaltimer.
void do_clock_sync(Ctx* c, uint32_t flags) {
  if (!g_drv.ok || !c->state_dev) return;
  if (g_drv.ctxPush(c->ctx) != CUDA_SUCCESS) {
    c->sync_failures++;
    return;
  }
  if (!c->sres.tried) sync_init(c);
  SyncRes& s = c->sres;
  if (s.ok) {
    uint64_t best_w = ~0ull, best_mid = 0, best_gpu = 0;
    for (int t = 0; t < 5; ++t) {
      *s.host = 0;
      void* args[] = {&s.dev};
      uint64_t t0 = now_ns();
      if (g_drv.launchKernel(s.fn, 1, 1, 1, 1, 1, 1, 0, s.stream, args, nullptr) != CUDA_SUCCESS) break;
      uint64_t t1;
      bool got = false;
      do {
        t1 = now_ns();
        if (*s.host != 0) {
          got = true;
          break;
        }
      } while (t1 - t0 < 1000000000ull);
      if (!got) break;  // a busy GPU: give up on this pair (the late write lands in our own pinned memory)
      const uint64_t gpu = *s.host;
      if (t1 - t0 < best_w) {
        best_w = t1 - t0;
        best_mid = t0 + (t1 - t0) / 2;
        best_gpu = gpu;
      }
    }
    if (best_gpu) {
      std::lock_guard<std::mutex> lk(c->sync_mu);
      kvconv_clock_sync_t r;
      std::memset(&r, 0, sizeof r);
      r.host_ns = best_mid;
      r.gpu_ns = best_gpu;
      r.uncertainty_ns = (best_w + 1) / 2;
      r.sequence = static_cast<uint32_t>(c->syncs.size());
      r.flags = flags;
      c->syncs.push_back(r);
      c->last_sync_ns = now_ns();
    } else {
      c->sync_failures++;
    }
  } else {
    c->sync_failures++;
  }
  CUcontext popped;
  g_drv.ctxPop(&popped);
}

std::mutex g_sync_mu;
std::condition_variable g_sync_cv;
bool g_sync_stop = false;
bool g_sync_kick = false;
std::thread g_sync_thread;

void sync_thread_main() {
  std::unique_lock<std::mutex> lk(g_sync_mu);
  while (!g_sync_stop) {
    const int period = g_cfg.sync_ms > 0 ? g_cfg.sync_ms : 1000;
    g_sync_cv.wait_for(lk, std::chrono::milliseconds(std::min(period, 200)), [] { return g_sync_stop || g_sync_kick; });
    if (g_sync_stop) break;
    g_sync_kick = false;
    std::vector<Ctx*> todo;
    {
      std::lock_guard<std::mutex> g(g_mu);
      for (auto* c : g_all)
        if (c->alive && c->state_dev) todo.push_back(c);
    }
    lk.unlock();
    for (auto* c : todo) {
      bool first, due;
      {
        std::lock_guard<std::mutex> g(c->sync_mu);
        first = c->syncs.empty() && c->sync_failures < 3;
        due = g_cfg.sync_ms > 0 && !c->syncs.empty() &&
              now_ns() - c->last_sync_ns >= static_cast<uint64_t>(g_cfg.sync_ms) * 1000000ull;
      }
      if (first) do_clock_sync(c, KVCONV_CLOCK_SYNC_FLAGS_START);
      else if (due) do_clock_sync(c, KVCONV_CLOCK_SYNC_FLAGS_PERIODIC);
    }
    lk.lock();
  }
}

void kick_sync() {
  {
    std::lock_guard<std::mutex> lk(g_sync_mu);
    g_sync_kick = true;
  }
  g_sync_cv.notify_all();
}

void stop_sync_thread() {
  {
    std::lock_guard<std::mutex> lk(g_sync_mu);
    g_sync_stop = true;
  }
  g_sync_cv.notify_all();
  if (g_sync_thread.joinable()) g_sync_thread.join();
}

// ------------------------------------------------------------------------------------------------ snapshot + dump
// Copy a context's device buffer and host tables. `synchronize`: wait for the context's work first (not inside a
// sanitizer callback).
void snapshot(Ctx* c, bool synchronize) {
  std::lock_guard<std::mutex> lk(c->mu);
  if (c->snapped) return;
  c->snapped = true;
  if (c->state_dev) {
    if (synchronize && g_drv.ok && g_drv.ctxPush(c->ctx) == CUDA_SUCCESS) {
      g_drv.ctxSync();
      CUcontext popped;
      g_drv.ctxPop(&popped);
    }
    kvconv_dev_state st;
    std::memset(&st, 0, sizeof st);
    if (SAN(sanitizerMemcpyDeviceToHost(&st, reinterpret_cast<void*>(c->state_dev), sizeof st, c->null_stream))) {
      c->dev_next = st.next;
      c->dev_drops = st.drops;
      uint64_t n = std::min<uint64_t>(st.next, g_cfg.dev_cap);
      c->events.resize(n);
      if (n && !SAN(sanitizerMemcpyDeviceToHost(c->events.data(), reinterpret_cast<void*>(st.events),
                                                n * sizeof(kvconv_device_event_t), c->null_stream))) {
        c->events.clear();
      }
      // A slot reserved whose record was not yet written (work still running at a signal): count, never emit.
      uint64_t k = 0;
      while (k < c->events.size() && c->events[k].sequence == k && c->events[k].kind != 0) ++k;
      c->dev_lost_unwritten = c->events.size() - k;
      c->events.resize(k);
    }
  }
  uint64_t un = 0;
  uint64_t n = c->graph.published(&un);
  c->graph_recs.assign(c->graph.recs.get(), c->graph.recs.get() + n);
  c->graph_drops = c->graph.drops.load() + un;
  n = c->eager.published(&un);
  c->eager_recs.assign(c->eager.recs.get(), c->eager.recs.get() + n);
  c->eager_drops = c->eager.drops.load() + un;
}

std::string gpu_name(int device) {
  char buf[256] = {0};
  if (g_drv.deviceGetName && g_drv.deviceGetName(buf, sizeof buf - 1, device) == CUDA_SUCCESS) return buf;
  return "";
}

std::string metadata_json(const std::vector<Ctx*>& cs, const char* reason) {
  uint64_t dev_drops = 0, gdrops = 0, edrops = 0, launches = 0, uploads = 0, patched = 0, late = 0, fdata = 0;
  uint64_t unwritten = 0, capfilt = 0, ldata = 0, syncfail = 0;
  for (auto* c : cs) {
    dev_drops += c->dev_drops;
    gdrops += c->graph_drops;
    edrops += c->eager_drops;
    launches += c->target_launches.load();
    uploads += c->uploads_filtered.load();
    patched += c->modules_patched.load();
    late += c->late_patched_modules.load();
    fdata += c->functions_given_data.load();
    unwritten += c->dev_lost_unwritten;
    capfilt += c->captured_launches_filtered.load();
    ldata += c->launch_data_set.load();
    syncfail += c->sync_failures;
  }
  int drv = 0;
  if (g_drv.driverGetVersion) g_drv.driverGetVersion(&drv);
  std::string j = "{";
  j += "\"tool\":\"kvconv-tracer\",\"tool_version\":\"" KVCONV_VERSION "\",";
  j += "\"producer\":\"native/libkvconv_tracer.so (Compute Sanitizer injection)\",";
  if (!cs.empty()) j += "\"gpu\":\"" + kvconv::json_escape(gpu_name(cs[0]->device)) + "\",";
  j += "\"cuda\":\"driver API " + std::to_string(drv / 1000) + "." + std::to_string((drv % 1000) / 10) + "\",";
  j += "\"command\":[";
  for (size_t i = 0; i < g_cmdline.size(); ++i) j += (i ? ",\"" : "\"") + kvconv::json_escape(g_cmdline[i]) + "\"";
  j += "],";
  j += "\"pid\":" + std::to_string(static_cast<long>(getpid())) + ",";
  j += "\"hostname\":\"" + kvconv::json_escape(g_hostname) + "\",";
  j += "\"started_at\":\"" + g_started_at + "\",";
  j += "\"reconstructed\":false,";
  j += "\"written_at\":\"" + std::string(reason) + "\",";
  j += "\"target_kernels\":[";
  for (size_t i = 0; i < g_cfg.patterns.size(); ++i)
    j += (i ? ",\"" : "\"") + kvconv::json_escape(g_cfg.patterns[i]) + "\"";
  j += "],";
  j += "\"device_events_capacity\":" + std::to_string(g_cfg.dev_cap) + ",";
  j += "\"host_table_capacity\":" + std::to_string(g_cfg.host_cap) + ",";
  j += std::string("\"event_kinds\":[") + (g_cfg.enter ? "\"block_enter\"" : "") +
       (g_cfg.enter && g_cfg.exit ? "," : "") + (g_cfg.exit ? "\"block_exit\"" : "") + "],";
  j += "\"tag\":{\"source\":\"graph launch id\",\"bits\":" + std::to_string(g_cfg.tag ? KVCONV_TAG_BITS : 0) + "},";
  j += "\"clock_sync_period_ms\":" + std::to_string(g_cfg.sync_ms) + ",";
  j += std::string("\"callbacks\":\"") + (g_cfg.whole_domains ? "domains" : "minimal") +
       (g_cfg.graph_callbacks ? "" : ",no-graph-nodes") + "\",";
  j += "\"counters\":{";
  j += "\"fatal_count\":0,";
  j += "\"device_event_drops\":" + std::to_string(dev_drops) + ",";
  j += "\"graph_node_table_drops\":" + std::to_string(gdrops) + ",";
  j += "\"eager_table_drops\":" + std::to_string(edrops) + ",";
  j += "\"sanitizer_errors\":" + std::to_string(g_sanitizer_errors.load()) + ",";
  j += "\"target_launches\":" + std::to_string(launches) + ",";
  j += "\"graph_uploads_filtered\":" + std::to_string(uploads) + ",";
  j += "\"captured_launches_filtered\":" + std::to_string(capfilt) + ",";
  j += "\"modules_patched\":" + std::to_string(patched) + ",";
  j += "\"late_patched_modules\":" + std::to_string(late) + ",";
  j += "\"functions_given_data\":" + std::to_string(fdata) + ",";
  j += "\"launch_data_set\":" + std::to_string(ldata) + ",";
  j += "\"device_events_unwritten\":" + std::to_string(unwritten) + ",";
  j += "\"clock_sync_failures\":" + std::to_string(syncfail);
  j += "},";
  j += "\"contexts\":[";
  for (size_t i = 0; i < cs.size(); ++i) {
    Ctx* c = cs[i];
    j += i ? "," : "";
    j += "{\"context_id\":" + std::to_string(c->index) + ",\"device_id\":" + std::to_string(c->device) +
         ",\"device_events\":" + std::to_string(c->events.size()) +
         ",\"device_slots_reserved\":" + std::to_string(c->dev_next) +
         ",\"graph_node_records\":" + std::to_string(c->graph_recs.size()) +
         ",\"eager_launch_records\":" + std::to_string(c->eager_recs.size()) +
         ",\"clock_sync_pairs\":" + std::to_string(c->syncs.size()) + "}";
  }
  j += "]}";
  return j;
}

bool write_dump(const std::string& path, const std::vector<Ctx*>& cs, const char* reason) {
  kvconv::DumpWriter w(path);
  const uint32_t ctx0 = cs.empty() ? 0 : cs[0]->index;
  const uint16_t dev0 = cs.empty() ? 0 : static_cast<uint16_t>(cs[0]->device);
  w.add_bytes(KVCONV_KIND_METADATA, metadata_json(cs, reason), ctx0, dev0);
  for (Ctx* c : cs) {
    const uint16_t dev = static_cast<uint16_t>(c->device);
    std::string strings;
    std::vector<kvconv_kernel_t> ks;
    for (auto& k : c->kernels) {
      kvconv_kernel_t r;
      std::memset(&r, 0, sizeof r);
      r.slot = k.slot;
      r.flags = 1;
      r.module_id = k.module;
      r.name_off = static_cast<uint32_t>(strings.size());
      r.name_len = static_cast<uint32_t>(k.name.size());
      strings += k.name;
      char mod[64];
      snprintf(mod, sizeof mod, "module@%#llx", (unsigned long long)k.module);
      r.module_off = static_cast<uint32_t>(strings.size());
      r.module_len = static_cast<uint32_t>(strlen(mod));
      strings += mod;
      ks.push_back(r);
    }
    w.add_bytes(KVCONV_KIND_STRINGS, strings, c->index, dev);
    GroupSpec g;
    g.context_id = c->index;
    g.device_id = dev;
    g.kind = KVCONV_KIND_KERNEL;
    g.record_size = sizeof(kvconv_kernel_t);
    g.record_count = ks.size();
    w.add_group(g, ks.data());
    std::vector<kvconv_clock_sync_t> syncs;
    {
      std::lock_guard<std::mutex> lk(c->sync_mu);
      syncs = c->syncs;
    }
    g.kind = KVCONV_KIND_CLOCK_SYNC;
    g.record_size = sizeof(kvconv_clock_sync_t);
    g.record_count = syncs.size();
    g.clock_domain = KVCONV_CLOCK_DOMAIN_NONE;
    w.add_group(g, syncs.data());
    g.kind = KVCONV_KIND_DEVICE_EVENT;
    g.record_size = sizeof(kvconv_device_event_t);
    g.record_count = c->events.size();
    g.capacity = g_cfg.dev_cap;
    g.drop_count = c->dev_drops + c->dev_lost_unwritten;
    g.clock_domain = KVCONV_CLOCK_DOMAIN_GPU_GLOBALTIMER;
    w.add_group(g, c->events.data());
    g.kind = KVCONV_KIND_GRAPH_NODE;
    g.record_size = sizeof(kvconv_host_launch_t);
    g.record_count = c->graph_recs.size();
    g.capacity = g_cfg.host_cap;
    g.drop_count = c->graph_drops;
    g.clock_domain = KVCONV_CLOCK_DOMAIN_HOST_MONOTONIC;
    w.add_group(g, c->graph_recs.data());
    g.kind = KVCONV_KIND_EAGER_LAUNCH;
    g.record_count = c->eager_recs.size();
    g.drop_count = c->eager_drops;
    w.add_group(g, c->eager_recs.data());
  }
  if (!w.commit()) {
    logf(0, "error: cannot write %s: %s", path.c_str(), w.error().c_str());
    return false;
  }
  for (Ctx* c : cs) {
    logf(0, "wrote %s: context %u, %zu device events (drops %llu), %zu graph-node and %zu eager records "
            "(drops %llu, %llu), %zu clock-sync pairs, %llu sanitizer errors [%s]",
         path.c_str(), c->index, c->events.size(), (unsigned long long)(c->dev_drops + c->dev_lost_unwritten),
         c->graph_recs.size(), c->eager_recs.size(), (unsigned long long)c->graph_drops,
         (unsigned long long)c->eager_drops, c->syncs.size(), (unsigned long long)g_sanitizer_errors.load(), reason);
  }
  return true;
}

bool per_context_files() { return g_cfg.output.find("%c") != std::string::npos; }

std::mutex g_final_mu;
bool g_final_done = false;

void write_all(const char* reason) {
  std::vector<Ctx*> cs;
  {
    std::lock_guard<std::mutex> lk(g_mu);
    for (auto* c : g_all)
      if (c->snapped && (c->state_dev || !c->kernels.empty() || c->graph_recs.size() || c->eager_recs.size()))
        cs.push_back(c);
  }
  if (per_context_files()) {
    for (auto* c : cs) write_dump(kvconv::expand_path(g_cfg.output, getpid(), static_cast<int>(c->index)), {c}, reason);
  } else {
    write_dump(kvconv::expand_path(g_cfg.output, getpid(), 0), cs, reason);
  }
}

// Context teardown: inside a sanitizer callback (no driver calls); snapshot and write what we have.
void on_context_destroy(CUcontext ctx) {
  Ctx* c = nullptr;
  {
    std::lock_guard<std::mutex> lk(g_mu);
    auto it = g_live.find(ctx);
    if (it == g_live.end()) return;
    c = it->second;
  }
  {
    std::lock_guard<std::mutex> lk(c->sync_mu);
  }
  snapshot(c, false);
  {
    std::lock_guard<std::mutex> lk(g_mu);
    c->alive = false;
    g_live.erase(ctx);
    g_gen.fetch_add(1, std::memory_order_release);
  }
  std::lock_guard<std::mutex> lk(g_final_mu);
  if (g_final_done) return;
  if (per_context_files()) {
    if (c->state_dev || !c->kernels.empty())
      write_dump(kvconv::expand_path(g_cfg.output, getpid(), static_cast<int>(c->index)), {c}, "context-teardown");
  } else {
    write_all("context-teardown");
  }
}

void finalize_all(const char* reason, bool from_signal) {
  std::lock_guard<std::mutex> lk(g_final_mu);
  if (g_final_done) return;
  g_final_done = true;
  stop_sync_thread();
  std::vector<Ctx*> live;
  {
    std::lock_guard<std::mutex> g(g_mu);
    for (auto* c : g_all)
      if (c->alive && !c->snapped) live.push_back(c);
  }
  for (auto* c : live) {
    if (c->state_dev && !from_signal) {
      if (g_drv.ok && g_drv.ctxPush(c->ctx) == CUDA_SUCCESS) {
        g_drv.ctxSync();
        CUcontext popped;
        g_drv.ctxPop(&popped);
      }
      do_clock_sync(c, KVCONV_CLOCK_SYNC_FLAGS_END);
    }
    snapshot(c, true);
  }
  write_all(reason);
}

void at_exit() { finalize_all("process-exit", false); }

// ------------------------------------------------------------------------------------------------ signals
// SIGTERM/SIGINT: the handler only writes the signal number to a pipe; a watcher thread writes the dump (outside
// any lock the interrupted thread may hold), then re-raises the signal with its default action.
int g_sig_pipe[2] = {-1, -1};
struct sigaction g_old_term, g_old_int;

void sig_handler(int sig) {
  struct sigaction* old = sig == SIGTERM ? &g_old_term : &g_old_int;
  if (old->sa_handler != SIG_DFL && old->sa_handler != SIG_IGN && !(old->sa_flags & SA_SIGINFO) && old->sa_handler) {
    old->sa_handler(sig);  // the program handles it (and exits normally, through atexit)
    return;
  }
  unsigned char b = static_cast<unsigned char>(sig);
  ssize_t r = write(g_sig_pipe[1], &b, 1);
  (void)r;
}

void sig_watcher() {
  unsigned char b;
  while (true) {
    ssize_t r = read(g_sig_pipe[0], &b, 1);
    if (r == 1) break;
    if (r < 0 && errno == EINTR) continue;
    return;
  }
  const int sig = b;
  logf(0, "signal %d: writing the dump before exiting", sig);
  finalize_all(sig == SIGTERM ? "sigterm" : "sigint", true);
  signal(sig, SIG_DFL);
  raise(sig);
}

void install_signals() {
  if (pipe(g_sig_pipe) != 0) return;
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_handler = sig_handler;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, &g_old_term);
  sigaction(SIGINT, &sa, &g_old_int);
  std::thread(sig_watcher).detach();
}

// ------------------------------------------------------------------------------------------------ callbacks
void on_module_loaded(const Sanitizer_ResourceModuleData* md) {
  Ctx* c = get_ctx(md->context);
  bool has = cubin_has_target(md->pCubin, md->cubinSize);
  bool did = false;
  {
    std::lock_guard<std::mutex> lk(c->mu);
    c->seen_modules.insert(md->module);
    if (has) did = patch_module(c, md->module);
  }
  if (did) kick_sync();
}

void on_functions_lazy(const Sanitizer_ResourceFunctionsLazyLoadedData* fd) {
  Ctx* c = get_ctx(fd->context);
  std::lock_guard<std::mutex> lk(c->mu);
  if (!c->patched_modules.count(fd->module)) return;
  for (uint32_t i = 0; i < fd->numFunctions; ++i) {
    CUfunction f = fd->functions[i];
    auto it = c->fn_slot.find(f);
    const uint32_t slot = it == c->fn_slot.end() ? 0 : it->second;
    // Every function of a patched module gets data now (never garbage): unknown ones NULL; a target is recognised
    // by name at its first launch and given its own data then, before that launch runs.
    const uint64_t ud = slot ? encode(c, slot, 0) : 0;
    if (SAN(sanitizerSetCallbackData(f, reinterpret_cast<void*>(ud)))) c->functions_given_data.fetch_add(1);
    c->fn_data[f] = ud;
  }
}

bool stream_capturing(CUstream s) {
  if (!g_drv.streamIsCapturing) return false;
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  if (g_drv.streamIsCapturing(s, &st) != CUDA_SUCCESS) return false;
  return st != CU_STREAM_CAPTURE_STATUS_NONE;
}

void SANITIZERAPI callback(void*, Sanitizer_CallbackDomain domain, Sanitizer_CallbackId cbid, const void* cbdata) {
  if (!g_enabled) return;
  switch (domain) {
    case SANITIZER_CB_DOMAIN_RESOURCE:
      switch (cbid) {
        case SANITIZER_CBID_RESOURCE_CONTEXT_CREATION_FINISHED: {
          auto* d = static_cast<const Sanitizer_ResourceContextData*>(cbdata);
          get_ctx(d->context, static_cast<int>(d->device));
          break;
        }
        case SANITIZER_CBID_RESOURCE_CONTEXT_DESTROY_STARTING: {
          auto* d = static_cast<const Sanitizer_ResourceContextData*>(cbdata);
          on_context_destroy(d->context);
          break;
        }
        case SANITIZER_CBID_RESOURCE_MODULE_LOADED:
          on_module_loaded(static_cast<const Sanitizer_ResourceModuleData*>(cbdata));
          break;
        case SANITIZER_CBID_RESOURCE_FUNCTIONS_LAZY_LOADED:
        case SANITIZER_CBID_RESOURCE_FUNCTIONS_LAZY_PATCHED:
          on_functions_lazy(static_cast<const Sanitizer_ResourceFunctionsLazyLoadedData*>(cbdata));
          break;
        default:
          break;
      }
      break;
    case SANITIZER_CB_DOMAIN_LAUNCH:
      if (cbid == SANITIZER_CBID_LAUNCH_BEGIN) {
        auto* ld = static_cast<const Sanitizer_LaunchData*>(cbdata);
        Ctx* c = get_ctx(ld->context);
        uint32_t slot = classify(c, ld->function, ld->functionName, ld->module, true);
        if (!slot) break;
        if (stream_capturing(ld->apiStream ? ld->apiStream : ld->stream)) {
          c->captured_launches_filtered.fetch_add(1);  // becomes a graph node; recorded when a replay runs it
          break;
        }
        c->target_launches.fetch_add(1, std::memory_order_relaxed);
        kvconv_host_launch_t r = host_record(*ld, slot);
        r.flags = KVCONV_LAUNCH_FLAGS_EAGER;
        c->eager.append(r);
      }
      break;
    case SANITIZER_CB_DOMAIN_GRAPHS:
      if (cbid == SANITIZER_CBID_GRAPHS_NODE_LAUNCH_BEGIN) {
        auto* nd = static_cast<const Sanitizer_GraphNodeLaunchData*>(cbdata);
        if (nd->nodeType != CU_GRAPH_NODE_TYPE_KERNEL) break;
        const Sanitizer_LaunchData& ld = nd->launchData;
        Ctx* c = get_ctx(ld.context);
        uint32_t slot = classify(c, ld.function, ld.functionName, ld.module, !nd->isGraphUpload);
        if (!slot) break;
        if (nd->isGraphUpload) {
          c->uploads_filtered.fetch_add(1, std::memory_order_relaxed);
          break;
        }
        c->target_launches.fetch_add(1, std::memory_order_relaxed);
        kvconv_host_launch_t r = host_record(ld, slot);
        r.graph_exec = reinterpret_cast<uint64_t>(nd->graphExec);
        r.launch_id = nd->launchId;
        r.node = reinterpret_cast<uint64_t>(nd->node);
        r.flags = KVCONV_LAUNCH_FLAGS_GRAPH_NODE;
        if (g_cfg.tag && c->state_dev) {
          const uint64_t tag = static_cast<uint64_t>(nd->launchId) & KVCONV_TAG_MASK;
          if (tag && SAN(sanitizerSetLaunchCallbackData(ld.hLaunch, ld.function, ld.hStream,
                                                        reinterpret_cast<void*>(encode(c, slot, tag))))) {
            r.tag = tag;
            r.flags |= KVCONV_LAUNCH_FLAGS_HAS_TAG;
            c->launch_data_set.fetch_add(1, std::memory_order_relaxed);
          }
        }
        c->graph.append(r);
      }
      break;
    default:
      break;
  }
}

std::string iso_now() {
  time_t t = time(nullptr);
  struct tm tmv;
  gmtime_r(&t, &tmv);
  char buf[64];
  strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tmv);
  return buf;
}

void read_cmdline() {
  FILE* f = fopen("/proc/self/cmdline", "rb");
  if (!f) return;
  std::string cur;
  int ch;
  while ((ch = fgetc(f)) != EOF) {
    if (ch == 0) {
      g_cmdline.push_back(cur);
      cur.clear();
    } else {
      cur += static_cast<char>(ch);
    }
  }
  if (!cur.empty()) g_cmdline.push_back(cur);
  fclose(f);
}

}  // namespace

extern "C" __attribute__((visibility("default"))) int InitializeInjection() {
  static bool once = false;
  if (once) return 1;
  once = true;
  load_config();
  const std::string first = kvconv::expand_path(g_cfg.output, getpid(), 0);
  std::string why = kvconv::check_writable(first);
  if (!why.empty()) {
    logf(0, "error: output path %s is not writable (%s); tracing is OFF for this process", first.c_str(),
         why.c_str());
    return 1;
  }
  if (access(g_cfg.patch_file.c_str(), R_OK) != 0) {
    logf(0, "error: device patch %s not found (set KVCONV_PATCH_FILE); tracing is OFF", g_cfg.patch_file.c_str());
    return 1;
  }
  load_driver();
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  g_hostname = host;
  g_started_at = iso_now();
  read_cmdline();
  if (!SAN(sanitizerSubscribe(&g_sub, callback, nullptr))) return 1;
  bool ok = true;
  if (g_cfg.whole_domains) {
    ok &= SAN(sanitizerEnableDomain(1, g_sub, SANITIZER_CB_DOMAIN_RESOURCE));
    ok &= SAN(sanitizerEnableDomain(1, g_sub, SANITIZER_CB_DOMAIN_LAUNCH));
    if (g_cfg.graph_callbacks) ok &= SAN(sanitizerEnableDomain(1, g_sub, SANITIZER_CB_DOMAIN_GRAPHS));
  } else {
    // Only the callbacks used: every enabled callback costs time on the launch path.
    const Sanitizer_CallbackIdResource res[] = {
        SANITIZER_CBID_RESOURCE_CONTEXT_CREATION_FINISHED, SANITIZER_CBID_RESOURCE_CONTEXT_DESTROY_STARTING,
        SANITIZER_CBID_RESOURCE_MODULE_LOADED, SANITIZER_CBID_RESOURCE_FUNCTIONS_LAZY_LOADED,
        SANITIZER_CBID_RESOURCE_FUNCTIONS_LAZY_PATCHED};
    for (auto id : res) ok &= SAN(sanitizerEnableCallback(1, g_sub, SANITIZER_CB_DOMAIN_RESOURCE, id));
    ok &= SAN(sanitizerEnableCallback(1, g_sub, SANITIZER_CB_DOMAIN_LAUNCH, SANITIZER_CBID_LAUNCH_BEGIN));
    if (g_cfg.graph_callbacks)
      ok &= SAN(sanitizerEnableCallback(1, g_sub, SANITIZER_CB_DOMAIN_GRAPHS, SANITIZER_CBID_GRAPHS_NODE_LAUNCH_BEGIN));
  }
  if (!ok) return 1;
  g_enabled = true;
  atexit(at_exit);
  install_signals();
  g_sync_thread = std::thread(sync_thread_main);
  std::string pats;
  for (auto& p : g_cfg.patterns) pats += (pats.empty() ? "" : ",") + p;
  logf(1, "tracing kernels [%s] -> %s (device capacity %llu, host capacity %llu, events%s%s, clock sync %d ms)",
       pats.c_str(), g_cfg.output.c_str(), (unsigned long long)g_cfg.dev_cap, (unsigned long long)g_cfg.host_cap,
       g_cfg.enter ? " enter" : "", g_cfg.exit ? " exit" : "", g_cfg.sync_ms);
  return 1;
}
