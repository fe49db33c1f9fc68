// Every way the traced process can end, and what each leaves on disk. The live file (live_file.h) is a valid dump at
// every instant; what these paths add is the last events and the exact counts:
//   - the flusher thread copies complete device events from the pinned buffer into the file every KVCONV_FLUSH_MS;
//   - clean ends (atexit, last context torn down, SIGTERM/SIGINT) synchronize, take an end clock-sync pair and
//     write the finished dump (tmp + rename over the live one);
//   - crash signals (SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL) copy what the GPU wrote since the last flush (memcpy and
//     atomics only: async-signal-safe), then let the signal take its course;
//   - os._exit, SIGKILL, the OOM killer: nothing runs; the file holds everything up to the last flush, and each
//     group's drop_count counts what may be missing (launched blocks whose events are not in the file).
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <thread>

#include "tracer.h"

namespace kvtr {

// ------------------------------------------------------------------ the flusher thread
static std::mutex g_flush_mu;
static std::condition_variable g_flush_cv;
static bool g_flush_stop = false;
static std::thread g_flush_thread;

static bool has_pinned(const Ctx* c) { return c->alive && c->host_events.load() != nullptr; }

static void flush_thread_main() {
  std::unique_lock<std::mutex> lk(g_flush_mu);
  while (!g_flush_stop) {
    g_flush_cv.wait_for(lk, std::chrono::milliseconds(g_cfg.flush_ms), [] { return g_flush_stop; });
    if (g_flush_stop) break;
    lk.unlock();
    for (auto* c : contexts_where(has_pinned)) {
      std::lock_guard<std::mutex> f(c->flush_mu);
      if (!c->finished) flush_events(c, false);
    }
    lk.lock();
  }
}

static void stop_flush_thread() {
  {
    std::lock_guard<std::mutex> lk(g_flush_mu);
    g_flush_stop = true;
  }
  g_flush_cv.notify_all();
  if (g_flush_thread.joinable()) g_flush_thread.join();
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
static const int kMaxCrashCtx = 64;
static std::atomic<Ctx*> g_crash_ctx[kMaxCrashCtx];

static void crash_flush() {
  for (int i = 0; i < kMaxCrashCtx; ++i) {
    Ctx* c = g_crash_ctx[i].load(std::memory_order_acquire);
    if (c) flush_events(c, true);  // no lock: identical bytes if the flusher is copying too; the count moves once
  }
}

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

void watch_for_crash(Ctx* c) {
  for (int i = 0; i < kMaxCrashCtx; ++i) {
    Ctx* none = nullptr;
    if (g_crash_ctx[i].compare_exchange_strong(none, c)) return;
  }
}

void install_exit_paths() {
  atexit(at_exit);
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
  g_flush_thread = std::thread(flush_thread_main);
  start_sync_thread();
}

}  // namespace kvtr
