// The capture range: which target launches are recorded (host record and device events), as nsys's --capture-range
// and torch.profiler's schedule. An engine's warm-up (memory profiling, graph capture) launches its KV-write kernel
// thousands of times eagerly; the steady state a user wants is the replays after it.
//
//   KVCONV_CAPTURE_RANGE      none (default: from start to exit), profiler (cudaProfilerStart/Stop, i.e. the
//                             driver's cuProfilerStart/Stop), graph (from the first replay of a graph holding a
//                             target node), launches:N (after the first N target launches), signal (SIGUSR1
//                             starts, SIGUSR2 stops)
//   KVCONV_CAPTURE_RANGE_END  stop (default: the first range's end ends recording for good) or repeat
//
// Decided per launch on the host, so that a launch is recorded whole or not at all: an eager launch outside the range
// gets NULL per-launch callback data (the patch returns at once); a learned graph replay outside it gets its tag cell
// marked KVCONV_CELL_OFF (the patch returns before taking a slot); neither gets a host record. What was skipped is
// counted, and the ranges are listed in the dump's metadata (`capture`), so that the checks read "out of range", not
// "missing" or "dropped".
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "json_writer.h"
#include "tracer.h"

namespace kvtr {

namespace {

enum class Start { kNone, kProfiler, kGraph, kLaunches, kSignal, kNvtx };

struct Range {
  uint64_t start_ns = 0, stop_ns = 0;  // CLOCK_MONOTONIC; stop 0: still open at the end
  std::string start_why, stop_why;
  uint64_t launches_before = 0;        // target launches seen before it opened
};

Start g_start = Start::kNone;
uint64_t g_after = 0;  // launches:N
std::string g_nvtx_name;  // nvtx:NAME
bool g_repeat = false;
std::atomic<bool> g_open{true};
std::atomic<bool> g_done{false};  // stop mode: a range ended, nothing opens again
std::atomic<uint64_t> g_seen{0};  // target launches seen, in range or not (launches:N)
std::atomic<uint64_t> g_skipped_eager{0}, g_skipped_nodes{0}, g_skipped_blocks{0}, g_skipped_replays{0};
std::mutex g_rmu;
std::vector<Range> g_ranges;
int g_sig_pipe[2] = {-1, -1};

const char* start_name() {
  switch (g_start) {
    case Start::kNone: return "none";
    case Start::kProfiler: return "profiler";
    case Start::kGraph: return "graph";
    case Start::kLaunches: return "launches";
    case Start::kSignal: return "signal";
    case Start::kNvtx: return "nvtx";
  }
  return "?";
}

void open_range(const char* why) {
  std::lock_guard<std::mutex> lk(g_rmu);
  if (g_open.load() || g_done.load()) return;
  Range r;
  r.start_ns = now_ns();
  r.start_why = why;
  r.launches_before = g_seen.load();
  g_ranges.push_back(r);
  g_open.store(true);
  logf(0, "capture range opened (%s) after %llu target launches", why, (unsigned long long)r.launches_before);
}

void close_range(const char* why) {
  std::lock_guard<std::mutex> lk(g_rmu);
  if (!g_open.load()) return;
  g_open.store(false);
  if (!g_repeat) g_done.store(true);
  if (!g_ranges.empty()) {
    g_ranges.back().stop_ns = now_ns();
    g_ranges.back().stop_why = why;
  }
  logf(0, "capture range closed (%s)", why);
}

// SIGUSR1 / SIGUSR2: the handler writes the signal to a pipe; a thread opens or closes the range (a lock is taken).
void on_range_signal(int sig) {
  const int saved = errno;
  unsigned char b = static_cast<unsigned char>(sig);
  ssize_t r = write(g_sig_pipe[1], &b, 1);
  (void)r;
  errno = saved;
}

void range_signal_thread() {
  unsigned char b;
  while (true) {
    const ssize_t r = read(g_sig_pipe[0], &b, 1);
    if (r < 0 && errno == EINTR) continue;
    if (r != 1) return;
    if (b == SIGUSR1) open_range("SIGUSR1");
    else close_range("SIGUSR2");
  }
}

void install_range_signals() {
  if (pipe(g_sig_pipe) != 0) {
    logf(0, "warning: no pipe for the capture range's signals (%s): recording from start", strerror(errno));
    g_open.store(true);
    return;
  }
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_range_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGUSR1, &sa, nullptr);
  sigaction(SIGUSR2, &sa, nullptr);
  std::thread(range_signal_thread).detach();
}

}  // namespace

static bool parse_capture_range() {
  const char* v = getenv("KVCONV_CAPTURE_RANGE");
  const std::string s = v ? v : "";
  if (s.empty() || s == "none") g_start = Start::kNone;
  else if (s == "profiler") g_start = Start::kProfiler;
  else if (s == "graph") g_start = Start::kGraph;
  else if (s == "signal") g_start = Start::kSignal;
  else if (s.rfind("nvtx:", 0) == 0 && s.size() > 5) {
    g_nvtx_name = s.substr(5);
    g_start = Start::kNvtx;
  } else if (s.rfind("launches:", 0) == 0) {
    char* end = nullptr;
    g_after = strtoull(s.c_str() + 9, &end, 10);
    if (end == s.c_str() + 9 || *end) {
      logf(0, "error: KVCONV_CAPTURE_RANGE=%s: launches:N needs a number", s.c_str());
      return false;
    }
    g_start = Start::kLaunches;
  } else {
    logf(0, "error: KVCONV_CAPTURE_RANGE=%s is not none, profiler, graph, launches:N, signal or nvtx:NAME",
         s.c_str());
    return false;
  }
  const char* e = getenv("KVCONV_CAPTURE_RANGE_END");
  if (e && *e && strcmp(e, "stop") && strcmp(e, "repeat")) {
    logf(0, "error: KVCONV_CAPTURE_RANGE_END=%s is not stop or repeat", e);
    return false;
  }
  g_repeat = e && !strcmp(e, "repeat");
  g_open.store(g_start == Start::kNone || (g_start == Start::kLaunches && g_after == 0));
  if (g_open.load()) g_ranges.push_back(Range{now_ns(), 0, "start", "", 0});
  if (g_start == Start::kSignal) install_range_signals();
  return true;
}

// Once per process, from whichever comes first: the CUDA injection or the NVTX one (nvtx_range.cpp).
bool load_capture_range() {
  static std::once_flag once;
  static bool ok = false;
  std::call_once(once, [] { ok = parse_capture_range(); });
  return ok;
}

const char* nvtx_range_name() { return g_start == Start::kNvtx ? g_nvtx_name.c_str() : nullptr; }

void nvtx_range_edge(bool open, const char* name) {
  const std::string why = std::string("NVTX range ") + (name ? name : "?");
  if (open) open_range(why.c_str());
  else close_range(why.c_str());
}

bool capture_by_profiler() { return g_start == Start::kProfiler; }

bool range_configured() { return g_start != Start::kNone; }

bool in_range() { return g_open.load(std::memory_order_relaxed); }

// A target launch (eager or a graph node) about to run: counts it, opens a launches:N range on the N+1st. True when
// it is to be recorded.
bool range_admit(bool graph_node, uint64_t blocks) {
  const uint64_t n = g_seen.fetch_add(1, std::memory_order_relaxed) + 1;
  if (g_start == Start::kLaunches && n == g_after + 1) open_range("launches");
  if (g_start == Start::kGraph && graph_node) open_range("first graph replay");
  if (in_range()) return true;
  (graph_node ? g_skipped_nodes : g_skipped_eager).fetch_add(1, std::memory_order_relaxed);
  g_skipped_blocks.fetch_add(blocks, std::memory_order_relaxed);
  return false;
}

// A learned exec's replay with `n` target nodes of `blocks` blocks in all.
bool range_admit_replay(uint64_t n, uint64_t blocks) {
  g_seen.fetch_add(n, std::memory_order_relaxed);
  if (g_start == Start::kGraph) open_range("first graph replay");
  if (in_range()) return true;
  g_skipped_replays.fetch_add(1, std::memory_order_relaxed);
  g_skipped_nodes.fetch_add(n, std::memory_order_relaxed);
  g_skipped_blocks.fetch_add(blocks, std::memory_order_relaxed);
  return false;
}

void range_on_profiler(bool start) {
  if (g_start != Start::kProfiler) return;
  if (start) open_range("cuProfilerStart");
  else close_range("cuProfilerStop");
}

void write_capture(kvconv::JsonWriter& j, bool live) {
  std::lock_guard<std::mutex> lk(g_rmu);
  j.key("capture").begin_object().kv("range", start_name());
  if (g_start == Start::kLaunches) j.kv("after_launches", g_after);
  if (g_start == Start::kNvtx) j.kv("nvtx_range", g_nvtx_name);
  j.kv("range_end", g_repeat ? "repeat" : "stop");
  if (live) {  // the live file's metadata is written at start: the ranges and counts come with the finished dump
    j.end_object();
    return;
  }
  j.kv("open_at_end", g_open.load());
  j.kv("target_launches_seen", g_seen.load());
  j.key("out_of_range").begin_object().kv("eager_launches", g_skipped_eager.load());
  j.kv("graph_node_launches", g_skipped_nodes.load()).kv("graph_replays", g_skipped_replays.load());
  j.kv("blocks", g_skipped_blocks.load()).end_object();
  j.key("ranges").begin_array();
  for (const Range& r : g_ranges) {
    j.begin_object().kv("start_ns", r.start_ns).kv("start", r.start_why);
    j.kv("target_launches_before", r.launches_before);
    if (r.stop_ns) j.kv("stop_ns", r.stop_ns).kv("stop", r.stop_why);
    j.end_object();
  }
  j.end_array().end_object();
}

}  // namespace kvtr
