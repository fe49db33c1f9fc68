// The instrumentation's bias on durations, measured once per context at start-up (issue 27 item 5).
//
// A duration from block events (kvconv reconcile, the Arrow launches table) spans a launch's first block-enter
// event to its last block-exit event; the patch calls around the kernel's body are inside that span, so a short
// kernel reads long (a 1.2 us paged-KV append: ~2.1 us on an H200). The sync thread loads the tracer's own kernel
// module twice, patches one copy as a target module is patched (same enter/exit patch, its events into a buffer of
// its own), and launches kvconv_calib_append alternately from both copies on the clock sync's stream (the legacy
// NULL stream unless KVCONV_SYNC_STREAM=own: a stream of its own slows every graph node, docs/TRACER.md), between
// one-thread %globaltimer stamp kernels, in batches queued behind a 2 ms spin (so that they run back to back). The
// patched copy's block events give the span as kvconv measures it. The reference is what a profiler reports for the
// kernel untraced: CUPTI's duration, taken by kvconv_calib_cupti (calib_cupti.cpp), a program run without the
// injection, since CUPTI cannot subscribe beside the Sanitizer (CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED on the
// H200) and nothing measured on the device stands in for it (CUDA events, even back to back: 5.3 us for a 2.24 us
// kernel; the stream time between stamp kernels adds the ~0.9 us gap to the next kernel; the kernel's own first-to-
// last-instruction span misses its launch and drain):
//   bias = median(tracer's span, patched) - median(CUPTI duration, untraced)
// The stream times and the kernel's own spans (both copies) are recorded beside it.
// recorded in the metadata (`calibration`), where kvconv reads it to print raw and corrected durations.
// KVCONV_CALIBRATE=0 turns it off. Costs ~2 x kLaunches short launches once, beside the program's first work.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <vector>

extern char** environ;

#include "tracer.h"

namespace kvtr {

thread_local int t_own_module = 0;

static const int kLaunches = 200, kBlocks = 8, kThreads = 128, kWords = 256;  // 8 rows of 2 KiB, as a decode step
static const uint64_t kCalibEvents = 2 * kLaunches * kBlocks + 64;
// Launches are queued in batches behind a spin of kSpinNs (the host queues a batch's 350 launches in well under 2 ms):
// timed back to back, as kernels run inside a graph, not at the host's launch rate.
static const int kBatch = 50;
static const unsigned long long kSpinNs = 2000000;

struct CalibBuffers {
  CUdeviceptr state = 0, dst = 0, src = 0, first = 0, last = 0;  // first/last: [2][kLaunches] (plain, patched)
  CUdeviceptr stamps = 0;                                           // [kLaunches][5] %globaltimer stamps
};

static bool alloc_buffers(CalibBuffers& b, CUstream s) {
  const size_t ev = kCalibEvents * sizeof(kvconv_device_event_t);
  CUdeviceptr raw = 0;
  if (g_drv.memAlloc(&raw, KVCONV_STATE_ALIGN + KVCONV_EVENTS_OFFSET + ev) != CUDA_SUCCESS) return false;
  b.state = (raw + KVCONV_STATE_ALIGN - 1) & ~(CUdeviceptr)(KVCONV_STATE_ALIGN - 1);
  if (b.state >> KVCONV_SLOT_SHIFT) return false;
  if (g_drv.memAlloc(&b.dst, (size_t)(17 * kBlocks + 4) * kWords * 8) != CUDA_SUCCESS) return false;
  if (g_drv.memAlloc(&b.src, (size_t)kBlocks * kWords * 8) != CUDA_SUCCESS) return false;
  if (g_drv.memAlloc(&b.first, 2 * kLaunches * 8) != CUDA_SUCCESS) return false;
  if (g_drv.memAlloc(&b.last, 2 * kLaunches * 8) != CUDA_SUCCESS) return false;
  if (g_drv.memAlloc(&b.stamps, 5 * kLaunches * 8) != CUDA_SUCCESS) return false;
  bool ok = g_drv.memsetD8Async(b.first, 0xff, 2 * kLaunches * 8, s) == CUDA_SUCCESS;
  ok &= g_drv.memsetD8Async(b.last, 0, 2 * kLaunches * 8, s) == CUDA_SUCCESS;
  ok &= g_drv.memsetD8Async(b.src, 1, (size_t)kBlocks * kWords * 8, s) == CUDA_SUCCESS;
  ok &= g_drv.memsetD8Async(b.state + KVCONV_EVENTS_OFFSET, 0, ev, s) == CUDA_SUCCESS;
  return ok;
}

// The calibration's device state: its own event buffer; the context's node table (the lookup each event pays) and
// no write recording (the write patch returns at its first test).
static bool init_state(const Ctx* c, const CalibBuffers& b, CUstream s) {
  static kvconv_dev_state st;  // the sync thread's: one calibration at a time
  std::memset(&st, 0, sizeof st);
  st.events = b.state + KVCONV_EVENTS_OFFSET;
  st.capacity = kCalibEvents;
  st.table = c->table_dev;
  st.table_mask = kNodeTableSlots - 1;
  st.cells = c->cells_dev;
  st.flags = range_configured() ? KVCONV_STATE_RANGED : 0;  // the patch's path of the context's own records
  if (g_drv.memcpyHtoDAsync(b.state, &st, sizeof st, s) != CUDA_SUCCESS) return false;
  return g_drv.streamSynchronize(s) == CUDA_SUCCESS;  // `st` is pageable: the copy is done when this returns
}

static bool load_copy(int mode, CUmodule* m, CUfunction* f) {
  t_own_module = mode;
  const bool ok = g_drv.moduleLoad(m, g_cfg.clocksync_file.c_str()) == CUDA_SUCCESS &&
                  g_drv.moduleGetFunction(f, *m, "kvconv_calib_append") == CUDA_SUCCESS;
  t_own_module = 0;
  return ok;
}

static double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(q * (v.size() - 1))];
}

// Per launch of the patched copy (events grouped by %gridid, in launch order): first enter to last exit, and the
// mean of its blocks' enter-to-exit.
static void traced_spans(const std::vector<kvconv_device_event_t>& ev, std::vector<double>& span,
                         std::vector<double>& block) {
  struct Acc {
    uint64_t lo = ~0ull, hi = 0;
    std::map<uint32_t, uint64_t> enter;
    double block_sum = 0;
    int blocks = 0;
  };
  std::map<uint64_t, Acc> by;
  for (const auto& e : ev) {
    Acc& a = by[e.gridid];
    if (e.kind == KVCONV_EVENT_KIND_BLOCK_ENTER) {
      a.lo = std::min<uint64_t>(a.lo, e.globaltimer);
      a.enter[e.block_x] = e.globaltimer;
    } else if (e.kind == KVCONV_EVENT_KIND_BLOCK_EXIT) {
      a.hi = std::max<uint64_t>(a.hi, e.globaltimer);
      auto it = a.enter.find(e.block_x);
      if (it != a.enter.end()) a.block_sum += static_cast<double>(e.globaltimer - it->second), a.blocks++;
    }
  }
  for (auto& [gid, a] : by) {
    if (a.lo == ~0ull || a.hi < a.lo || a.blocks != kBlocks) continue;  // incomplete (dropped): not a sample
    span.push_back(static_cast<double>(a.hi - a.lo));
    block.push_back(a.block_sum / a.blocks);
  }
}

// The measurements on the device (context pushed); `spans` gets each patched launch's traced span.
static std::string run(Ctx* c, Calibration& r, CUstream s, std::vector<double>& spans) {
  CalibBuffers b;
  if (!alloc_buffers(b, s) || !init_state(c, b, s)) return "device memory for the calibration";
  CUmodule mp = nullptr, mq = nullptr;
  CUfunction fp = nullptr, fq = nullptr;
  if (!load_copy(1, &mp, &fp) || !load_copy(2, &mq, &fq)) return "cannot load " + g_cfg.clocksync_file;
  {
    std::lock_guard<std::mutex> lk(c->mu);
    if (!c->patched_modules.count(mp)) return "the calibration copy was not patched";
    c->own_fn[fp] = b.state;  // slot 0, tag 0: only the state address is read
  }
  // Per sample, on the calibration stream: S0 plain S1 S2 S3 patched S4, S a one-thread %globaltimer stamp
  // (kvconv_clock_read). What a kernel adds to the stream between two stamps, against two stamps with nothing between
  // ((S1 - S0) - (S3 - S2)), is recorded beside the bias: its duration plus the gap to the next kernel (~0.9 us on
  // the H200), so not the reference; what the patched copy adds there is the instrumentation's cost to the stream.
  CUfunction spin = nullptr, stamp = nullptr;
  if (g_drv.moduleGetFunction(&spin, mq, "kvconv_calib_spin") != CUDA_SUCCESS ||
      g_drv.moduleGetFunction(&stamp, mq, "kvconv_clock_read") != CUDA_SUCCESS)
    return "the calibration module lacks its spin or stamp kernel";
  int words = kWords;
  auto put_stamp = [&](int i) {
    CUdeviceptr at = b.stamps + 8ull * i;
    void* sargs[] = {&at};
    return g_drv.launchKernel(stamp, 1, 1, 1, 1, 1, 1, 0, s, sargs, nullptr) == CUDA_SUCCESS;
  };
  auto put_kernel = [&](int which, int k) {
    int idx = which * kLaunches + k;
    void* args[] = {&b.dst, &b.src, &words, &b.first, &b.last, &idx};
    return g_drv.launchKernel(which ? fp : fq, kBlocks, 1, 1, kThreads, 1, 1, 0, s, args, nullptr) == CUDA_SUCCESS;
  };
  for (int k = 0; k < kLaunches; ++k) {
    if (k % kBatch == 0) {  // the GPU busy while a batch is queued: its launches then run back to back
      unsigned long long ns = kSpinNs;
      void* sargs[] = {&ns};
      if (g_drv.launchKernel(spin, 1, 1, 1, 1, 1, 1, 0, s, sargs, nullptr) != CUDA_SUCCESS) return "the spin failed";
    }
    const int z = 5 * k;
    if (!put_stamp(z) || !put_kernel(0, k) || !put_stamp(z + 1) || !put_stamp(z + 2) || !put_stamp(z + 3) ||
        !put_kernel(1, k) || !put_stamp(z + 4))
      return "a calibration launch failed";
    if (k % kBatch == kBatch - 1 && g_drv.streamSynchronize(s) != CUDA_SUCCESS) return "a calibration batch failed";
  }
  kvconv_dev_state st;
  std::vector<unsigned long long> first(2 * kLaunches), last(2 * kLaunches);
  bool ok = g_drv.memcpyDtoHAsync(&st, b.state, sizeof st, s) == CUDA_SUCCESS;
  ok &= g_drv.memcpyDtoHAsync(first.data(), b.first, first.size() * 8, s) == CUDA_SUCCESS;
  ok &= g_drv.memcpyDtoHAsync(last.data(), b.last, last.size() * 8, s) == CUDA_SUCCESS;
  std::vector<unsigned long long> stamps(5 * kLaunches);
  ok &= g_drv.memcpyDtoHAsync(stamps.data(), b.stamps, stamps.size() * 8, s) == CUDA_SUCCESS;
  if (!ok || g_drv.streamSynchronize(s) != CUDA_SUCCESS) return "reading the calibration back";
  const uint64_t n = std::min<uint64_t>(st.next, kCalibEvents);
  std::vector<kvconv_device_event_t> events(n);
  if (n && (g_drv.memcpyDtoHAsync(events.data(), st.events, n * sizeof(kvconv_device_event_t), s) != CUDA_SUCCESS ||
            g_drv.streamSynchronize(s) != CUDA_SUCCESS))
    return "reading the calibration's events back";
  std::vector<double> block, own[2], added[2];
  traced_spans(events, spans, block);
  for (int k = 0; k < kLaunches; ++k) {
    const unsigned long long* t = &stamps[5 * k];
    const double empty = static_cast<double>(t[3] - t[2]);  // two stamps with nothing between
    added[0].push_back(static_cast<double>(t[1] - t[0]) - empty);
    added[1].push_back(static_cast<double>(t[4] - t[3]) - empty);
  }
  for (int w = 0; w < 2; ++w)
    for (int k = 0; k < kLaunches; ++k)
      if (last[w * kLaunches + k] >= first[w * kLaunches + k] && first[w * kLaunches + k] != ~0ull)
        own[w].push_back(static_cast<double>(last[w * kLaunches + k] - first[w * kLaunches + k]));
  if (spans.size() < kLaunches / 2 || own[0].size() < kLaunches / 2) return "too few complete calibration launches";
  r.launches = static_cast<uint32_t>(spans.size());
  r.blocks = kBlocks, r.threads = kThreads, r.row_bytes = kWords * 8;
  r.events = st.next, r.dropped = st.drops;
  r.traced_ns = median(spans);
  r.own_plain_ns = median(own[0]);
  r.own_patched_ns = median(own[1]);
  r.stream_plain_ns = median(added[0]);
  r.stream_patched_ns = median(added[1]);
  r.per_block_ns = median(block);
  return "";
}

// CUPTI's median duration of the calibration kernel, untraced, from kvconv_calib_cupti (calib_cupti.cpp) run
// without the injection; "" and the value, or why not. At most ~20 s (a CUDA context's set-up in the child).
static std::string cupti_reference(int device, double* ns) {
  const std::string exe = g_cfg.calib_cupti_file;
  if (access(exe.c_str(), X_OK) != 0) return "no " + exe;
  // A whitelist, not the process's environment less CUDA_INJECTION64_PATH: with that the child hung (over 20 s,
  // H200) — the injected process's environment also carries the Sanitizer's own settings.
  std::vector<std::string> env;
  static const char* keep[] = {"PATH=", "HOME=", "LD_LIBRARY_PATH=", "CUDA_VISIBLE_DEVICES=", "CUDA_DEVICE_ORDER=",
                               "KVCONV_CUPTI_LIB=", "TMPDIR="};
  for (char** e = environ; *e; ++e)
    for (const char* k : keep)
      if (strncmp(*e, k, strlen(k)) == 0) env.emplace_back(*e);
  std::vector<char*> envp;
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  const std::string dev = std::to_string(device), n = "200";
  std::vector<char*> argv = {const_cast<char*>(exe.c_str()), const_cast<char*>(g_cfg.clocksync_file.c_str()),
                             const_cast<char*>(dev.c_str()), const_cast<char*>(n.c_str()), nullptr};
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return "pipe";
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, exe.c_str(), &fa, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  close(fds[1]);
  if (rc != 0) {
    close(fds[0]);
    return "cannot run " + exe;
  }
  std::string out;
  char buf[256];
  const uint64_t until = now_ns() + 20000000000ull;
  for (;;) {
    struct pollfd p = {fds[0], POLLIN, 0};
    const int left = static_cast<int>((until - std::min(until, now_ns())) / 1000000);
    if (left <= 0 || poll(&p, 1, left) <= 0) break;
    const ssize_t k = read(fds[0], buf, sizeof buf);
    if (k <= 0) break;
    out.append(buf, static_cast<size_t>(k));
  }
  close(fds[0]);
  int status = 0;
  pid_t done = 0;  // its stdout closed (or the time is up): reap it, waiting what is left of the 20 s
  while ((done = waitpid(pid, &status, WNOHANG)) == 0 && now_ns() < until) usleep(1000);
  if (done == 0) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    return exe + " took over 20 s";
  }
  const size_t at = out.find("\"median_ns\": ");
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || at == std::string::npos)
    return exe + " found no CUPTI reference (see its stderr)";
  *ns = strtod(out.c_str() + at + 13, nullptr);
  return *ns > 0 ? "" : exe + " printed no duration";
}

// bias = the tracer's span (patched) - CUPTI's duration (unpatched), with the spread of the per-launch spans.
static std::string finish_bias(Ctx* c, Calibration& r, const std::vector<double>& spans) {
  std::string why = cupti_reference(c->device, &r.cupti_plain_ns);
  if (!why.empty()) return "no untraced reference: " + why;
  r.bias_ns = r.traced_ns - r.cupti_plain_ns;
  if (r.bias_ns < 0) return "CUPTI's untraced duration outlasted the traced span (other work on the GPU meanwhile?)";
  std::vector<double> each;
  for (double x : spans) each.push_back(x - r.cupti_plain_ns);
  r.bias_p10_ns = quantile(each, 0.1), r.bias_p90_ns = quantile(each, 0.9);
  return "";
}

void calibrate(Ctx* c) {  // the sync thread, after the context's first clock sync (its stream and module)
  if (c->calibrated.load()) return;
  Calibration r;
  if (!g_cfg.calibrate) r.why = "KVCONV_CALIBRATE=0";
  else if (!g_cfg.enter || !g_cfg.exit) r.why = "enter-only events: no durations to correct";
  else if (!g_drv.memAlloc || !g_drv.memcpyHtoDAsync || !g_drv.memsetD8Async || !g_drv.memcpyDtoHAsync ||
           !g_drv.streamSynchronize || !c->sres.ok)
    r.why = "driver entry points missing";
  else if (g_drv.ctxPush(c->ctx) != CUDA_SUCCESS) r.why = "cannot make the context current";
  else {
    std::vector<double> spans;
    r.why = run(c, r, c->sres.stream, spans);
    CUcontext popped;
    g_drv.ctxPop(&popped);
    if (r.why.empty()) r.why = finish_bias(c, r, spans);
  }
  r.done = r.why.empty();
  if (r.done)
    logf(1, "context %u: calibration: tracer span %.0f ns, CUPTI untraced %.0f ns, stream time %.0f ns (patched "
            "%.0f), kernel's own %.0f ns (patched %.0f): bias %.0f ns (p10 %.0f, p90 %.0f) over %u launches",
         c->index, r.traced_ns, r.cupti_plain_ns, r.stream_plain_ns, r.stream_patched_ns, r.own_plain_ns,
         r.own_patched_ns, r.bias_ns, r.bias_p10_ns, r.bias_p90_ns, r.launches);
  else logf(1, "context %u: no calibration: %s", c->index, r.why.c_str());
  c->calib = r;
  c->calibrated.store(true);
}

}  // namespace kvtr
