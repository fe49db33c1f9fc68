// Clock-sync pairs: a one-thread kernel writes %globaltimer to pinned host memory, bracketed by CLOCK_MONOTONIC
// reads; the narrowest of five brackets is kept. Taken at a context's set-up (start), every KVCONV_CLOCK_SYNC_MS
// (periodic) by a background thread, and at exit (end). Each pair goes into the dump file as it is taken.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <thread>

#include "tracer.h"

namespace kvtr {

static void sync_init(Ctx* c) {  // context pushed on this thread
  SyncRes& s = c->sres;
  s.tried = true;
  if (!g_drv.ok) return;
  if (g_drv.moduleLoad(&s.mod, g_cfg.clocksync_file.c_str()) != CUDA_SUCCESS) {
    logf(0, "warning: cannot load %s; no clock-sync pairs", g_cfg.clocksync_file.c_str());
    return;
  }
  if (g_drv.moduleGetFunction(&s.fn, s.mod, "kvconv_clock_read") != CUDA_SUCCESS) return;
  // The stream the pairs and the calibration launch on (KVCONV_SYNC_STREAM, docs/TRACER.md): the legacy NULL stream,
  // or one of the tracer's own (non-blocking) for a program whose default-stream work must not wait for them. A
  // kernel launched on any stream but the legacy one makes every graph kernel node of the process slower from then
  // on (docs/TRACER.md has the figures), so the legacy stream is the default.
  if (g_cfg.sync_stream == "legacy") s.stream = CU_STREAM_LEGACY;
  else if (g_drv.streamCreate(&s.stream, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) return;
  void* h = nullptr;
  if (g_drv.memHostAlloc(&h, 64, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE) != CUDA_SUCCESS) return;
  s.host = static_cast<volatile unsigned long long*>(h);
  if (g_drv.memHostGetDevicePointer(&s.dev, h, 0) != CUDA_SUCCESS) return;
  s.ok = true;
}

struct Bracket {
  uint64_t width = ~0ull, mid = 0, gpu = 0;
};

// The narrowest of 5 brackets [t0, t1] around a kernel that reads %globaltimer (context pushed).
static Bracket best_bracket(SyncRes& s) {
  Bracket b;
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
    if (t1 - t0 < b.width) b = {t1 - t0, t0 + (t1 - t0) / 2, *s.host};
  }
  return b;
}

void do_clock_sync(Ctx* c, uint32_t flags) {
  if (!g_drv.ok || !c->state_dev) return;
  if (g_drv.ctxPush(c->ctx) != CUDA_SUCCESS) {
    c->sync_failures++;
    return;
  }
  if (!c->sres.tried) sync_init(c);
  const Bracket b = c->sres.ok ? best_bracket(c->sres) : Bracket{};
  if (b.gpu) {
    std::lock_guard<std::mutex> lk(c->sync_mu);
    kvconv_clock_sync_t r;
    std::memset(&r, 0, sizeof r);
    r.host_ns = b.mid;
    r.gpu_ns = b.gpu;
    r.uncertainty_ns = (b.width + 1) / 2;
    r.sequence = static_cast<uint32_t>(c->syncs.size());
    r.flags = flags;
    c->syncs.push_back(r);
    if (c->live.clock_sync.valid()) c->live.clock_sync.put(&r, 1);
    c->last_sync_ns = now_ns();
  } else {
    c->sync_failures++;
  }
  CUcontext popped;
  g_drv.ctxPop(&popped);
}

static std::mutex g_sync_mu;
static std::condition_variable g_sync_cv;
static bool g_sync_stop = false;
static bool g_sync_kick = false;
static std::thread g_sync_thread;

static bool syncable(const Ctx* c) { return c->alive && c->state_dev; }

static void sync_due(Ctx* c) {
  bool first, due;
  {
    std::lock_guard<std::mutex> g(c->sync_mu);
    first = c->syncs.empty() && c->sync_failures < 3;
    due = g_cfg.sync_ms > 0 && !c->syncs.empty() &&
          now_ns() - c->last_sync_ns >= static_cast<uint64_t>(g_cfg.sync_ms) * 1000000ull;
  }
  if (first) {
    do_clock_sync(c, KVCONV_CLOCK_SYNC_FLAGS_START);
    if (!c->calibrated.load() && c->sres.ok) calibrate(c);  // once, with the sync's stream and module at hand
  } else if (due) do_clock_sync(c, KVCONV_CLOCK_SYNC_FLAGS_PERIODIC);
}

static void sync_thread_main() {
  bool relaxed = false;
  std::unique_lock<std::mutex> lk(g_sync_mu);
  while (!g_sync_stop) {
    const int period = g_cfg.sync_ms > 0 ? g_cfg.sync_ms : 1000;
    g_sync_cv.wait_for(lk, std::chrono::milliseconds(std::min(period, 200)), [] { return g_sync_stop || g_sync_kick; });
    if (g_sync_stop) break;
    g_sync_kick = false;
    lk.unlock();
    const std::vector<Ctx*> cs = contexts_where(syncable);
    if (!relaxed && !cs.empty()) relaxed = relaxed_capture_mode();  // once the driver is up (a context exists)
    for (auto* c : cs) sync_due(c);
    lk.lock();
  }
}

void start_sync_thread() { g_sync_thread = std::thread(sync_thread_main); }

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

}  // namespace kvtr
