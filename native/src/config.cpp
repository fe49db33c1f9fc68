// Configuration from the environment (docs/TRACER.md lists every variable) and the tracer's log.
#include <dlfcn.h>
#include <time.h>

#include <signal.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "tracer.h"

namespace kvtr {

Config g_cfg;

uint64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

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

static std::vector<std::string> split(const std::string& s, char sep) {
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

static uint64_t env_u64(const char* name, uint64_t def) {
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

static std::string self_dir() {
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(&self_dir), &info) && info.dli_fname) {
    std::string p = info.dli_fname;
    auto s = p.rfind('/');
    if (s != std::string::npos) return p.substr(0, s);
  }
  return ".";
}

// Longest identifier run of a pattern: what must appear in a module's cubin for it to hold the kernel.
static std::string module_token(const std::string& p) {
  std::string best, cur;
  for (char c : p + " ") {
    if (isalnum(static_cast<unsigned char>(c)) || c == '_') {
      cur += c;
    } else {
      if (cur.size() > best.size()) best = cur;
      cur.clear();
    }
  }
  return best;
}

static void load_events(const char* e) {
  if (!e || !*e) return;
  g_cfg.enter = g_cfg.exit = false;
  for (auto& t : split(e, ',')) {
    if (t == "enter") g_cfg.enter = true;
    else if (t == "exit") g_cfg.exit = true;
    else logf(0, "warning: unknown event kind '%s' in KVCONV_EVENTS (enter, exit)", t.c_str());
  }
  if (!g_cfg.enter && !g_cfg.exit) g_cfg.enter = true;
}

void load_config() {
  const char* k = getenv("KVCONV_KERNELS");
  g_cfg.patterns = split(k && *k ? k : "reshape_and_cache_flash_kernel", ',');
  for (auto& p : g_cfg.patterns) g_cfg.module_tokens.push_back(module_token(p));
  if (const char* o = getenv("KVCONV_OUTPUT"); o && *o) g_cfg.output = o;
  g_cfg.dev_cap = env_u64("KVCONV_DEVICE_CAPACITY", 0);
  g_cfg.dev_cap_set = g_cfg.dev_cap != 0;
  g_cfg.host_cap = env_u64("KVCONV_HOST_CAPACITY", g_cfg.host_cap);
  load_events(getenv("KVCONV_EVENTS"));
  g_cfg.sync_ms = static_cast<int>(env_u64("KVCONV_CLOCK_SYNC_MS", 0));
  g_cfg.flush_ms = static_cast<int>(env_u64("KVCONV_FLUSH_MS", 1));
  if (g_cfg.flush_ms < 1) g_cfg.flush_ms = 1;
  g_cfg.tag = env_u64("KVCONV_TAG", 1) != 0;
  g_cfg.graph_callbacks = env_u64("KVCONV_GRAPH_CALLBACKS", 1) != 0;
  if (const char* cb = getenv("KVCONV_CALLBACKS"); cb && *cb) {
    if (!strcmp(cb, "domains")) g_cfg.whole_domains = true;
    else if (!strcmp(cb, "none")) g_cfg.no_callbacks = true;
    else if (strcmp(cb, "minimal")) logf(0, "warning: KVCONV_CALLBACKS=%s is not minimal, domains or none; using minimal", cb);
  }
  g_cfg.verbose = static_cast<int>(env_u64("KVCONV_VERBOSE", 0));
  g_cfg.calibrate = env_u64("KVCONV_CALIBRATE", 1) != 0;
  g_cfg.python_exit_hook = env_u64("KVCONV_PYTHON_EXIT_HOOK", 1) != 0;
  if (const char* ss = getenv("KVCONV_SYNC_STREAM"); ss && *ss) {
    if (!strcmp(ss, "own") || !strcmp(ss, "legacy")) g_cfg.sync_stream = ss;
    else logf(0, "warning: KVCONV_SYNC_STREAM=%s is not legacy or own; using legacy", ss);
  }
  // what was asked, recorded as asked (the metadata's `asked`): KVCONV_WRITES as writes.cpp reads it
  const char* wr = getenv("KVCONV_WRITES");
  g_cfg.asked_writes = wr && *wr && strcmp(wr, "0") != 0;
  const char* val = getenv("KVCONV_VALUE");
  g_cfg.asked_value = val && !strcmp(val, "1");  // the engine plugins' value probe (kvconv.capture.engines)
  if (const char* en = getenv("KVCONV_ENGINE"); en && *en) g_cfg.asked_engine = en;
  if (const char* cr = getenv("KVCONV_CAPTURE_RANGE"); cr && *cr && strcmp(cr, "none")) g_cfg.asked_range = cr;
  std::string dir = self_dir();
  const char* pf = getenv("KVCONV_PATCH_FILE");
  g_cfg.patch_file = pf && *pf ? pf : dir + "/kvconv_patch.fatbin";
  const char* cf = getenv("KVCONV_CLOCKSYNC_FILE");
  g_cfg.clocksync_file = cf && *cf ? cf : dir + "/kvconv_clocksync.fatbin";
  const char* cc = getenv("KVCONV_CALIB_CUPTI");
  g_cfg.calib_cupti_file = cc && *cc ? cc : dir + "/kvconv_calib_cupti";
}

bool per_context_files() { return g_cfg.output.find("%c") != std::string::npos; }

// The device buffer when KVCONV_DEVICE_CAPACITY is not set: an engine's warm-up alone can launch its KV write for
// millions of blocks, so take 2 GiB of events (33,554,432) where the GPU has 64 GiB or more, 512 MiB from 16 GiB,
// else 64 MiB (1,048,576 events, the old default). The dump file reserves as much (a sparse hole until written).
uint64_t default_device_capacity(int device) {
  size_t total = 0;
  if (!g_drv.deviceTotalMem || g_drv.deviceTotalMem(&total, static_cast<CUdevice>(device)) != CUDA_SUCCESS) total = 0;
  const uint64_t gib = 1ull << 30, ev = sizeof(kvconv_device_event_t);
  if (total >= 64 * gib) return 2 * gib / ev;
  if (total >= 16 * gib) return gib / 2 / ev;
  return 1048576;
}

// A literal output path (no %p, %c) is the first traced process's: it exports KVCONV_OUTPUT_OWNER=its pid, which the
// processes it starts inherit. Any other process (a child: an engine's scheduler or worker; or a sibling that finds a
// running process's live dump there) writes <stem>.pid<N><ext> beside it, so that no process replaces another's
// dump. kvconv record finds both forms.
static bool live_dump_of_running_process(const std::string& path) {
  FILE* f = fopen(path.c_str(), "rb");
  if (!f) return false;
  char buf[16384];
  const size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  const char* live = static_cast<const char*>(memmem(buf, n, "\"written_at\":\"live\"", 19));
  const char* pid = static_cast<const char*>(memmem(buf, n, "\"pid\":", 6));
  if (!live || !pid) return false;
  const long p = strtol(pid + 6, nullptr, 10);
  return p > 0 && p != static_cast<long>(getpid()) && (kill(static_cast<pid_t>(p), 0) == 0 || errno == EPERM);
}

static std::string with_pid(const std::string& out) {
  const size_t slash = out.rfind('/');
  size_t dot = out.rfind('.');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash) || dot == slash + 1) dot = out.size();
  return out.substr(0, dot) + ".pid%p" + out.substr(dot);
}

void claim_output() {
  if (g_cfg.output.find("%p") != std::string::npos || per_context_files()) return;
  const std::string me = std::to_string(getpid());
  const char* owner = getenv("KVCONV_OUTPUT_OWNER");
  if ((owner && *owner && me != owner) || live_dump_of_running_process(g_cfg.output)) {
    g_cfg.output_owner = owner && *owner ? owner : "";
    logf(0, "process %s: %s is another process's dump; this one writes %s", me.c_str(), g_cfg.output.c_str(),
         kvconv::expand_path(with_pid(g_cfg.output), getpid(), 0).c_str());
    g_cfg.output = with_pid(g_cfg.output);
    return;
  }
  g_cfg.output_owner = me;
  setenv("KVCONV_OUTPUT_OWNER", me.c_str(), 1);
}

}  // namespace kvtr
