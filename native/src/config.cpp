// Configuration from the environment (docs/TRACER.md lists every variable) and the tracer's log.
#include <dlfcn.h>
#include <time.h>

#include <cctype>
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
  g_cfg.dev_cap = env_u64("KVCONV_DEVICE_CAPACITY", g_cfg.dev_cap);
  g_cfg.host_cap = env_u64("KVCONV_HOST_CAPACITY", g_cfg.host_cap);
  load_events(getenv("KVCONV_EVENTS"));
  g_cfg.sync_ms = static_cast<int>(env_u64("KVCONV_CLOCK_SYNC_MS", 0));
  g_cfg.flush_ms = static_cast<int>(env_u64("KVCONV_FLUSH_MS", 1));
  if (g_cfg.flush_ms < 1) g_cfg.flush_ms = 1;
  g_cfg.tag = env_u64("KVCONV_TAG", 1) != 0;
  g_cfg.graph_callbacks = env_u64("KVCONV_GRAPH_CALLBACKS", 1) != 0;
  g_cfg.graph_learn = env_u64("KVCONV_GRAPH_LEARN", 1) != 0;
  if (const char* cb = getenv("KVCONV_CALLBACKS"); cb && *cb) {
    if (!strcmp(cb, "domains")) g_cfg.whole_domains = true;
    else if (!strcmp(cb, "none")) g_cfg.no_callbacks = true;
    else if (strcmp(cb, "minimal")) logf(0, "warning: KVCONV_CALLBACKS=%s is not minimal, domains or none; using minimal", cb);
  }
  g_cfg.verbose = static_cast<int>(env_u64("KVCONV_VERBOSE", 0));
  g_cfg.calibrate = env_u64("KVCONV_CALIBRATE", 1) != 0;
  if (const char* ss = getenv("KVCONV_SYNC_STREAM"); ss && *ss) {
    if (!strcmp(ss, "own") || !strcmp(ss, "blocking") || !strcmp(ss, "legacy") || !strcmp(ss, "perthread") ||
        !strcmp(ss, "nolaunch"))
      g_cfg.sync_stream = ss;
    else logf(0, "warning: KVCONV_SYNC_STREAM=%s is not legacy, own, blocking, perthread or nolaunch; using legacy", ss);
  }
  std::string dir = self_dir();
  const char* pf = getenv("KVCONV_PATCH_FILE");
  g_cfg.patch_file = pf && *pf ? pf : dir + "/kvconv_patch.fatbin";
  const char* cf = getenv("KVCONV_CLOCKSYNC_FILE");
  g_cfg.clocksync_file = cf && *cf ? cf : dir + "/kvconv_clocksync.fatbin";
  const char* cc = getenv("KVCONV_CALIB_CUPTI");
  g_cfg.calib_cupti_file = cc && *cc ? cc : dir + "/kvconv_calib_cupti";
}

bool per_context_files() { return g_cfg.output.find("%c") != std::string::npos; }

}  // namespace kvtr
