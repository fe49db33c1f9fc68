// Every way the traced process can end, and what each leaves on disk. The live file (live_file.h) is a valid dump at
// every instant; what these paths add is the last events and the exact counts:
//   - the flusher thread copies complete device events from device memory into the file every KVCONV_FLUSH_MS;
//   - clean ends (atexit, last context torn down, SIGTERM/SIGINT) synchronize, take an end clock-sync pair and
//     write the finished dump (tmp + rename over the live one);
//   - crash signals (SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL) wake the flusher for one more copy of everything the
//     GPU wrote and wait for it (at most 0.5 s), then let the signal take its course;
//   - os._exit, SIGKILL, the OOM killer: nothing runs; the file holds everything up to the last flush, and each
//     group's drop_count counts what may be missing (launched blocks whose events are not in the file).
#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <thread>

#include "tracer.h"

namespace kvtr {

// ------------------------------------------------------------------ the flusher thread
// Wakes every KVCONV_FLUSH_MS (poll on a pipe, so that a crash handler can wake it with an async-signal-safe
// write): copies each context's new device events into the file, populates file pages ahead of the tables. An idle
// context (nothing launched since the last copy) costs a load, no driver call.
static int g_flush_pipe[2] = {-1, -1};
static std::atomic<bool> g_flush_stop{false};
static std::atomic<bool> g_flush_running{false};
static std::atomic<uint32_t> g_crash_asked{0}, g_crash_done{0};
static std::thread g_flush_thread;
static pthread_t g_flush_tid;

static bool flushable(const Ctx* c) { return c->alive && c->state_dev && !c->finished; }

static void flush_thread_main() {
  bool relaxed = false;
  struct pollfd p = {g_flush_pipe[0], POLLIN, 0};
  while (!g_flush_stop.load()) {
    if (poll(&p, 1, g_cfg.flush_ms) > 0) {
      char buf[64];
      while (read(g_flush_pipe[0], buf, sizeof buf) > 0) {
      }
    }
    if (g_flush_stop.load()) break;
    const uint32_t asked = g_crash_asked.load();
    const bool crash = asked != g_crash_done.load();
    const std::vector<Ctx*> cs = contexts_where(flushable);
    if (!relaxed && !cs.empty()) relaxed = relaxed_capture_mode();  // once the driver is up (a context exists)
    for (auto* c : cs) {
      while (flush_events(c, crash) && crash) {  // a crash: everything complete, in as many copies as it takes
      }
      writes_flush(c, crash);  // the write table into the file once the context is quiet (writes.cpp)
      if (!crash) populate_ahead(c);
    }
    if (crash) g_crash_done.store(asked);
  }
}

static void wake_flusher() {
  const char b = 1;
  ssize_t r = write(g_flush_pipe[1], &b, 1);
  (void)r;
}

static void start_flush_thread() {
  if (pipe2(g_flush_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
    logf(0, "warning: no flusher pipe (%s): device events reach the dump file only at the end", strerror(errno));
    return;
  }
  g_flush_thread = std::thread(flush_thread_main);
  g_flush_tid = g_flush_thread.native_handle();
  g_flush_running.store(true);
}

static void stop_flush_thread() {
  g_flush_running.store(false);
  g_flush_stop.store(true);
  if (g_flush_pipe[1] >= 0) wake_flusher();
  if (g_flush_thread.joinable()) g_flush_thread.join();
}

// From a crash handler: have the flusher copy out everything the GPU wrote, and wait for it (bounded: if the crashing
// thread holds a driver lock the copy needs, what was not copied stays counted as possibly lost). Async-signal-safe:
// atomics, write, nanosleep.
static void crash_flush() {
  if (!g_flush_running.load() || pthread_equal(pthread_self(), g_flush_tid)) return;
  const uint32_t asked = g_crash_asked.fetch_add(1) + 1;
  wake_flusher();
  const struct timespec step = {0, 1000000};
  for (int i = 0; i < 500 && static_cast<int32_t>(g_crash_done.load() - asked) < 0; ++i) nanosleep(&step, nullptr);
}

// ------------------------------------------------------------------ clean ends
static std::mutex g_final_mu;
static bool g_final_done = false;

static bool unfinished(const Ctx* c) { return c->alive && !c->finished; }

void finalize_all(const char* reason, bool from_signal) {
  if (getpid() != g_pid) return;  // a forked child: the files are its parent's
  std::lock_guard<std::mutex> lk(g_final_mu);
  if (g_final_done) return;
  g_final_done = true;
  stop_sync_thread();
  stop_flush_thread();
  for (auto* c : contexts_where(unfinished)) {
    if (c->state_dev && !from_signal) {
      sync_context(c->ctx);
      do_clock_sync(c, KVCONV_CLOCK_SYNC_FLAGS_END);
    }
    finish_device(c, false);
  }
  write_all(reason);
}

static bool any_alive(const Ctx* c) { return c->alive; }

// Context teardown, inside a sanitizer callback (no driver calls): the context's last events into the file; the
// finished dump once no context of the file is left running.
void on_context_destroy(CUcontext ctx) {
  Ctx* c = retire_ctx(ctx);
  if (!c) return;
  finish_device(c, false);
  std::lock_guard<std::mutex> lk(g_final_mu);
  if (g_final_done) return;
  if (per_context_files()) {
    if (c->state_dev || !c->kernels.empty())
      write_finished(kvconv::expand_path(g_cfg.output, g_pid, static_cast<int>(c->index)), {c}, "context-teardown");
  } else if (contexts_where(any_alive).empty()) {
    write_all("context-teardown");
  }
}

static void at_exit() { finalize_all("process-exit", false); }

// ------------------------------------------------------------------ os._exit in a Python process
// Python's multiprocessing ends a forked child with os._exit (vLLM's engine core, after its SIGTERM shutdown): no
// atexit, no context teardown, so the dump stayed live ("the producer did not finish"). In a Python process the
// tracer wraps os._exit: the dump is finished first, then the original runs. The wrapper is installed from a thread
// of the tracer's once it holds the GIL (the injection runs inside cuInit, often under the GIL).
// KVCONV_PYTHON_EXIT_HOOK=0 leaves os._exit alone.
extern "C" __attribute__((visibility("default"))) void kvconv_tracer_finish(const char* reason) {
  finalize_all(reason && *reason ? reason : "os-exit", false);
}

static void python_exit_hook() {
  using IntFn = int (*)();
  using EnsureFn = int (*)();
  using ReleaseFn = void (*)(int);
  using RunFn = void* (*)(const char*, int, void*, void*);
  using DictFn = void* (*)();
  using DecFn = void (*)(void*);
  using ClearFn = void (*)();
  auto initialized = reinterpret_cast<IntFn>(dlsym(RTLD_DEFAULT, "Py_IsInitialized"));
  auto ensure = reinterpret_cast<EnsureFn>(dlsym(RTLD_DEFAULT, "PyGILState_Ensure"));
  auto release = reinterpret_cast<ReleaseFn>(dlsym(RTLD_DEFAULT, "PyGILState_Release"));
  auto run = reinterpret_cast<RunFn>(dlsym(RTLD_DEFAULT, "PyRun_String"));
  auto dict = reinterpret_cast<DictFn>(dlsym(RTLD_DEFAULT, "PyDict_New"));
  auto dec = reinterpret_cast<DecFn>(dlsym(RTLD_DEFAULT, "Py_DecRef"));
  auto clear = reinterpret_cast<ClearFn>(dlsym(RTLD_DEFAULT, "PyErr_Clear"));
  if (!initialized || !ensure || !release || !run || !dict || !dec || !clear || !initialized()) return;
  char code[1024];
  snprintf(code, sizeof code,
           "import os, ctypes\n"
           "_finish = ctypes.CFUNCTYPE(None, ctypes.c_char_p)(%llu)\n"
           "_exit = os._exit\n"
           "def kvconv_exit(code, _exit=_exit, _finish=_finish):\n"
           "    try:\n"
           "        _finish(b'os-exit')\n"
           "    except BaseException:\n"
           "        pass\n"
           "    _exit(code)\n"
           "kvconv_exit.__wrapped__ = _exit\n"
           "os._exit = kvconv_exit\n",
           static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(&kvconv_tracer_finish)));
  std::thread([=] {
    const int st = ensure();
    void* globals = dict();
    void* r = globals ? run(code, 257 /* Py_file_input */, globals, globals) : nullptr;
    if (!r) clear();
    else dec(r);
    if (globals) dec(globals);
    release(st);
    logf(r ? 1 : 0, r ? "os._exit wrapped: the dump is finished before it" : "warning: could not wrap os._exit");
  }).detach();
}

// ------------------------------------------------------------------ SIGTERM / SIGINT
// The handler only writes the signal number to a pipe; a watcher thread writes the dump (outside any lock the
// interrupted thread may hold), then re-raises the signal with its default action.
static int g_sig_pipe[2] = {-1, -1};
static struct sigaction g_old_term, g_old_int;

static void term_handler(int sig) {
  struct sigaction* old = sig == SIGTERM ? &g_old_term : &g_old_int;
  if (old->sa_handler != SIG_DFL && old->sa_handler != SIG_IGN && !(old->sa_flags & SA_SIGINFO) && old->sa_handler) {
    old->sa_handler(sig);  // the program handles it (and exits normally, through atexit)
    return;
  }
  unsigned char b = static_cast<unsigned char>(sig);
  ssize_t r = write(g_sig_pipe[1], &b, 1);
  (void)r;
}

static void sig_watcher() {
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

// ------------------------------------------------------------------ crash signals
static const int kCrashSignals[] = {SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL};
static struct sigaction g_old_crash[NSIG];
static void crash_handler(int sig, siginfo_t* si, void* uc) {
  if (getpid() == g_pid) crash_flush();
  const struct sigaction& old = g_old_crash[sig];
  if ((old.sa_flags & SA_SIGINFO) && old.sa_sigaction) {
    old.sa_sigaction(sig, si, uc);
    return;
  }
  if (!(old.sa_flags & SA_SIGINFO) && old.sa_handler != SIG_DFL && old.sa_handler != SIG_IGN && old.sa_handler) {
    old.sa_handler(sig);
    return;
  }
  signal(sig, SIG_DFL);  // the default action once this handler returns (the re-raised signal is pending till then)
  raise(sig);
}

void install_exit_paths() {
  atexit(at_exit);
  if (g_cfg.python_exit_hook) python_exit_hook();
  if (pipe(g_sig_pipe) == 0) {
    struct sigaction sa;
    std::memset(&sa, 0, sizeof sa);
    sa.sa_handler = term_handler;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGTERM, &sa, &g_old_term);
    sigaction(SIGINT, &sa, &g_old_int);
    std::thread(sig_watcher).detach();
  }
  struct sigaction cs;
  std::memset(&cs, 0, sizeof cs);
  cs.sa_sigaction = crash_handler;
  sigemptyset(&cs.sa_mask);
  cs.sa_flags = SA_SIGINFO | SA_ONSTACK;
  for (int s : kCrashSignals) sigaction(s, &cs, &g_old_crash[s]);
  start_flush_thread();
  start_sync_thread();
}

}  // namespace kvtr
