// Declarations shared by the tracer's rooms (one file per concern, as NVIDIA's compute-sanitizer-samples split theirs):
//   config.cpp        environment -> Config, logging
//   driver.cpp        the few driver calls, through dlopen("libcuda.so.1")
//   context.cpp       per-context state (Ctx), the registry, the context's live groups in the dump file
//   patching.cpp      which modules and functions are targets, patching, callback data
//   device_buffer.cpp the device state and event buffer; the flusher's copies of events into the dump file
//   host_tables.cpp   graph-node and eager-launch records, written straight into the dump file
//   clock_pairs.cpp   clock-sync pairs (host side: brackets around tracer_kernels.cu's clock read) and their thread
//   calibrate.cpp     the instrumentation's bias on durations, measured at start-up (issue 27)
//   dump_output.cpp   metadata (JSON writer) and the finished dump (compacted from the live file)
//   exit_paths.cpp    the flusher thread, atexit, SIGTERM/SIGINT, crash signals, fork
//   graph_exec.cpp    graph execs: target nodes learned once per exec, then per replay one tag and their records
//   injection.cpp     InitializeInjection and the callback dispatch
//   writes.cpp        the write-address canary: written KV slots per block (memory-access patch), caches, steps
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <cuda.h>
#include <sanitizer.h>

#include "dump_writer.h"
#include "json_writer.h"
#include "kvconv_records.h"
#include "live_file.h"
#include "tracer_shared.h"

#ifndef KVCONV_VERSION
#define KVCONV_VERSION "0.1.0"
#endif

namespace kvtr {

uint64_t now_ns();

// ------------------------------------------------------------------ config.cpp
struct Config {
  std::vector<std::string> patterns;
  std::vector<std::string> module_tokens;  // identifier runs of the patterns, searched in cubin bytes
  std::string output = "kvconv-%p.kvdump";
  uint64_t dev_cap = 0;          // KVCONV_DEVICE_CAPACITY; 0: by the GPU's memory (default_device_capacity)
  bool dev_cap_set = false;
  uint64_t host_cap = 65536;
  bool enter = true, exit = false;
  int sync_ms = 0;  // periodic pairs off by default: see KVCONV_CLOCK_SYNC_MS in docs/TRACER.md (issue 31)
  int flush_ms = 1;              // KVCONV_FLUSH_MS: device events copied into the dump file at least this often
  bool tag = true;
  bool graph_callbacks = true;   // KVCONV_GRAPH_CALLBACKS=0: no graph-node records (overhead measurement only)
  bool whole_domains = false;    // KVCONV_CALLBACKS=domains: enable whole callback domains (the facts-note setup)
  bool no_callbacks = false;     // KVCONV_CALLBACKS=none: injected and subscribed, nothing enabled (the cost floor)
  int verbose = 0;
  bool calibrate = true;         // KVCONV_CALIBRATE=0: no start-up calibration of the enter/exit bias
  std::string sync_stream = "legacy";  // KVCONV_SYNC_STREAM: clock-sync pairs and calibration on "legacy" or "own"
  std::string patch_file, clocksync_file, calib_cupti_file;
  std::string output_owner;      // with a literal output: the pid whose output it is (KVCONV_OUTPUT_OWNER)
  bool python_exit_hook = true;  // KVCONV_PYTHON_EXIT_HOOK=0: leave os._exit alone (exit_paths.cpp)
  // what the user asked the run to check (metadata `asked`, kvconv.check.asked): kvconv record --writes, --engine,
  // the value probe, --capture-range, as the environment gives them to every traced process
  bool asked_writes = false, asked_value = false;
  std::string asked_engine, asked_range;
};
extern Config g_cfg;
void load_config();
void logf(int level, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
bool per_context_files();
void claim_output();                     // a literal output path: this process's own name (config.cpp)
uint64_t default_device_capacity(int device);

// ------------------------------------------------------------------ driver.cpp
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
  CUresult (*memcpyDtoHAsync)(void*, CUdeviceptr, size_t, CUstream) = nullptr;
  CUresult (*streamSynchronize)(CUstream) = nullptr;
  CUresult (*threadExchangeStreamCaptureMode)(CUstreamCaptureMode*) = nullptr;
  CUresult (*memAlloc)(CUdeviceptr*, size_t) = nullptr;  // calibration only (calibrate.cpp)
  CUresult (*memcpyHtoDAsync)(CUdeviceptr, const void*, size_t, CUstream) = nullptr;
  CUresult (*memsetD8Async)(CUdeviceptr, unsigned char, size_t, CUstream) = nullptr;
  CUresult (*deviceTotalMem)(size_t*, CUdevice) = nullptr;
};
extern Drv g_drv;
void load_driver();
std::string gpu_name(int device);
bool sync_context(CUcontext ctx);  // push, synchronize, pop (not inside a sanitizer callback)
// For the tracer's own threads: their driver calls (copies, stream synchronize, allocations) are never refused by,
// nor invalidate, a global-mode graph capture the program runs meanwhile on another thread (torch.cuda.graph's
// default): the thread's capture mode becomes relaxed. False before the driver is initialized (call again later).
bool relaxed_capture_mode();

extern std::atomic<uint64_t> g_sanitizer_errors;
bool san_ok(SanitizerResult r, const char* what);
#define SAN(call) ::kvtr::san_ok((call), #call)

// ------------------------------------------------------------------ context.cpp
struct KernelInfo {
  uint32_t slot;
  uint64_t module;
  std::string name;
};

// The start-up calibration (calibrate.cpp): medians over `launches` launches of kvconv_calib_append (blocks x
// threads) of the tracer's span (first block entry to last block exit, as durations are measured) on a patched
// copy of the kernel and CUPTI's duration of it untraced (kvconv_calib_cupti, run without the injection); bias =
// traced - CUPTI. Recorded beside: the stream time each copy adds between two stamp kernels, their own spans.
struct Calibration {
  bool done = false;
  std::string why;  // not done: why
  uint32_t launches = 0, blocks = 0, threads = 0, row_bytes = 0;
  double traced_ns = 0, own_patched_ns = 0, own_plain_ns = 0, bias_ns = 0, per_block_ns = 0;
  double stream_plain_ns = 0, stream_patched_ns = 0;  // stream time added between two stamp kernels
  double cupti_plain_ns = 0;                          // CUPTI's duration untraced (kvconv_calib_cupti)
  double bias_p10_ns = 0, bias_p90_ns = 0;  // of the per-launch bias (patched span minus the plain median)
  uint64_t events = 0, dropped = 0;
};

struct SyncRes {
  bool tried = false, ok = false;
  CUmodule mod = nullptr;
  CUfunction fn = nullptr;
  CUstream stream = nullptr;
  volatile unsigned long long* host = nullptr;
  CUdeviceptr dev = 0;
};

// The flusher thread's per-context resources: its own non-blocking stream (never ordered with the program's work) and
// a pinned staging buffer the device events are copied into before the complete ones go into the file.
struct Flusher {
  bool tried = false, ok = false, via_sanitizer = false;
  CUstream stream = nullptr;
  Sanitizer_StreamHandle san_stream = nullptr;
  kvconv_device_event_t* stage = nullptr;
  uint64_t stage_cap = 0;  // events
  uint64_t seen_end = 0;   // complete prefix seen by the previous copy (published once seen twice)
  uint64_t ahead[3] = {0, 0, 0};  // records populated ahead in graph_node, eager_launch, device_event
};

// A context's groups in the live dump file, in the order of the finished dump.
struct LiveGroups {
  kvconv::LiveGroup strings, kernel, clock_sync, device_event, graph_node, eager_launch;
  // the write-address canary's (writes.cpp; valid with KVCONV_WRITES=1; write_step and slot_map in one context)
  kvconv::LiveGroup cache, slot_write, write_step, slot_map;
};

struct Ctx {
  CUcontext ctx = nullptr;
  uint32_t index = 0;
  int device = 0;
  std::mutex mu;  // guards the maps and the device set-up below
  bool patches_loaded = false, setup_failed = false;
  uint64_t state_dev = 0;  // aligned address of kvconv_dev_state (device memory)
  uint64_t dev_events_addr = 0;  // the event buffer (device memory, right after the state)
  Sanitizer_StreamHandle null_stream = nullptr;
  std::unordered_set<CUmodule> patched_modules;
  std::unordered_map<CUfunction, uint32_t> fn_slot;  // 0 = known non-target
  std::unordered_map<CUfunction, uint64_t> fn_data;  // callback data given to each function of a patched module
  std::unordered_map<CUfunction, uint64_t> own_fn;   // the tracer's own patched functions and their callback data
  std::vector<KernelInfo> kernels;
  LiveGroups live;
  uint64_t graph_next = 0, eager_next = 0;  // rows reserved (may exceed capacity: overflow)
  std::atomic<uint64_t> target_launches{0}, uploads_filtered{0}, captured_launches_filtered{0};
  std::atomic<uint64_t> modules_patched{0}, late_patched_modules{0}, functions_given_data{0};
  std::atomic<uint64_t> launch_data_set{0};
  // learned graph execs (graph_exec.cpp; the table and next_cell under its lock)
  uint64_t table_dev = 0, cells_dev = 0;   // device node table and tag cells (inside the state allocation)
  std::vector<kvconv_node_entry> node_table;  // host copy of the device node table
  uint32_t next_cell = 1;                  // tag cell 0 is never handed out
  std::atomic<uint64_t> execs_learned{0}, execs_per_node{0}, learn_failures{0}, execs_relearned{0};
  std::atomic<uint64_t> replays_from_table{0}, tag_cells_written{0}, stream_switch_syncs{0};
  // clock sync
  std::mutex sync_mu;
  std::vector<kvconv_clock_sync_t> syncs;
  uint64_t last_sync_ns = 0;
  uint32_t sync_failures = 0;
  SyncRes sres;
  Calibration calib;  // the sync thread's (written once, before `calibrated`)
  std::atomic<bool> calibrated{false};
  // device events: copied from device memory into live.device_event by the flusher thread (device_buffer.cpp)
  std::mutex flush_mu;             // guards finished, copying
  std::condition_variable flush_cv;  // copying went false
  bool copying = false;            // the flusher is inside a driver copy of this context (flush_mu not held)
  std::atomic<bool> dev_unreadable{false};  // a copy failed (sticky CUDA error): no more copies during the run
  Flusher fl;                      // the flusher thread's own resources (only that thread touches them)
  // end state (at teardown / exit)
  bool alive = true;
  bool finished = false;
  uint64_t dev_next = 0, dev_drops = 0, dev_drops_graph = 0, dev_lost_unwritten = 0;
  bool dev_state_read = false;
};

extern std::mutex g_mu;                 // registry
extern std::vector<Ctx*> g_all;         // every context seen, never freed
extern kvconv::LiveFile* g_process_file;  // the one live file of the process (NULL with %c: one per context)
extern std::string g_hostname, g_started_at;
extern std::vector<std::string> g_cmdline;
extern long g_pid;                      // the traced process (a forked child must not touch its files)
Ctx* get_ctx(CUcontext c, int device = -1);
std::vector<Ctx*> contexts_where(bool (*pred)(const Ctx*));
Ctx* retire_ctx(CUcontext ctx);  // out of the live set at teardown; NULL if unknown

// ------------------------------------------------------------------ patching.cpp
bool patch_module(Ctx* c, CUmodule m);  // c->mu held
uint32_t classify(Ctx* c, CUfunction f, const char* name, CUmodule m, bool launching);
bool cubin_has_target(const char* cubin, size_t size);
void give_lazy_functions_data(Ctx* c, CUmodule m, const CUfunction* fns, uint32_t n);
// The names of the kernels of every loaded module (metadata loaded_kernels: kvconv's coverage check offers the ones
// closest to a -k pattern that matched nothing): the entry functions of the module's ELF image, the first
// kLoadedKernelsMax distinct names (kLoadedKernelsBytes in all) kept, then up to 256 that share 8 characters in a
// row with a pattern, the rest counted.
static const size_t kLoadedKernelsMax = 4096;
static const size_t kLoadedKernelsBytes = 1 << 20;
void note_loaded_kernels(uint32_t ctx, const void* image, size_t size);
struct LoadedKernels {
  std::vector<std::string> names;
  uint64_t dropped = 0;          // distinct names seen beyond the bounds
  uint64_t images_unlisted = 0;  // loaded modules without an ELF image to read names from
};
LoadedKernels loaded_kernels();
uint64_t encode(const Ctx* c, uint32_t slot, uint64_t tag);

// ------------------------------------------------------------------ device_buffer.cpp
static const uint64_t kNodeTableSlots = 1 << 16;  // learned target graph nodes (1 MiB of device memory)
static const uint64_t kTagCells = 1 << 14;        // graph execs with target nodes (128 KiB)
bool setup_device(Ctx* c);  // c->mu held, inside a sanitizer callback
// Flusher thread only (or a thread that stopped it): device memory -> dump file; returns events newly published.
// `settled`: publish every complete event (a crash flush); else only those already complete one copy earlier.
uint64_t flush_events(Ctx* c, bool settled);
void populate_ahead(Ctx* c);  // flusher thread: page in the file ahead of each table's end (no faults on append)
void count_launched_blocks(Ctx* c, uint64_t blocks);
// The flusher's copies of other device memory (writes.cpp): begin_copy/end_copy bracket them as flush_events does
// (false: the context is finished or has no device state); flusher_copy copies `bytes` from device address `src`.
bool begin_copy(Ctx* c);
void end_copy(Ctx* c);
bool flusher_copy(Ctx* c, void* dst, uint64_t src, size_t bytes);
void finish_device(Ctx* c, bool synchronize);  // final copy-out, exact drops; the flusher leaves the context alone

// ------------------------------------------------------------------ host_tables.cpp
kvconv_host_launch_t host_record(const Sanitizer_LaunchData& ld, uint32_t slot);
void append_graph_node(Ctx* c, const kvconv_host_launch_t& r);
void append_eager(Ctx* c, const kvconv_host_launch_t& r);
void add_kernel(Ctx* c, const KernelInfo& k);  // c->mu held: kernel table + strings, live
std::string module_name(uint64_t module);

// ------------------------------------------------------------------ graph_exec.cpp
// A graph node callback: what to do with it. kSkip: its exec's replays are recorded from the learned nodes;
// kLearn: the exec's learning launch (record it as observed and learn it); kObserve: record it as observed.
enum class NodeRole { kSkip, kLearn, kObserve };
bool enable_graph_callbacks(Sanitizer_SubscriberHandle sub);
void on_graph_launch(Sanitizer_CallbackId cbid, const Sanitizer_GraphLaunchData* d);
void on_graph_exec(Sanitizer_CallbackId cbid, const Sanitizer_GraphExecData* d);
void on_graph_exec_api(const Sanitizer_CallbackData* d);  // driver API that changes an exec's nodes
NodeRole graph_node_role(const Sanitizer_GraphNodeLaunchData* nd);
void graph_node_learned(const Sanitizer_GraphNodeLaunchData* nd, const kvconv_host_launch_t& r);

// ------------------------------------------------------------------ writes.cpp (the write-address canary, issue 16)
bool writes_enabled();                   // KVCONV_WRITES=1
bool writes_patch_module(CUmodule m);    // global memory accesses of a patched module -> kvconv_mem_access
uint64_t writes_setup(Ctx* c);           // inside setup_device: the device write table; its state address or 0
void writes_finish(Ctx* c);              // inside finish_device: the table copied out
void write_writes(kvconv::DumpWriter& w, const Ctx* c, kvconv::GroupSpec g);  // cache/slot_write/step groups
// The live groups a context reserves for the write canary (none when off; write_step and slot_map in the first).
std::vector<kvconv::GroupSpec> writes_live_specs(kvconv::GroupSpec base);
void writes_live_bind(Ctx* c, const std::vector<kvconv::LiveGroup>& gs);  // in writes_live_specs' order
void writes_flush(Ctx* c, bool force);  // flusher thread: the table into the live slot_write group once quiet
void writes_counters(kvconv::JsonWriter& j);  // the metadata's writes_* counters (nothing when off)
void writes_metadata(kvconv::JsonWriter& j, bool live);  // "writes": asked, and why nothing was recorded

// ------------------------------------------------------------------ calibrate.cpp
// Set on the thread loading one of the tracer's own modules: 1 patch it (as a target module), 2 leave it alone;
// either way it is not a program's module (no loaded_kernels names, no modules_patched count).
extern thread_local int t_own_module;
bool patch_own_module(Ctx* c, CUmodule m);  // c->mu held
void calibrate(Ctx* c);                     // the sync thread, after the context's first clock sync

// ----------------------------------------------------------------- clock_pairs.cpp
void do_clock_sync(Ctx* c, uint32_t flags);
void start_sync_thread();
void stop_sync_thread();
void kick_sync();

// ------------------------------------------------------------------ dump_output.cpp
std::string live_metadata_json();
bool write_finished(const std::string& path, const std::vector<Ctx*>& cs, const char* reason);
void write_all(const char* reason);

// ------------------------------------------------------------------ capture_range.cpp
bool load_capture_range();  // false: a bad KVCONV_CAPTURE_RANGE(_END) (tracing off)
bool capture_by_profiler();
bool in_range();
bool range_configured();  // KVCONV_CAPTURE_RANGE is not none: replays may be skipped (the device state says so)
bool range_admit(bool graph_node, uint64_t blocks);    // a target launch: recorded?
bool range_admit_replay(uint64_t nodes, uint64_t blocks);  // a learned exec's replay: recorded?
void range_on_profiler(bool start);
const char* nvtx_range_name();                      // NAME of nvtx:NAME, else NULL
void nvtx_range_edge(bool open, const char* name);  // nvtx_range.cpp: a NAME range began / ended
void write_capture(kvconv::JsonWriter& j, bool live);  // live: the settings only

// ------------------------------------------------------------------ exit_paths.cpp
void finalize_all(const char* reason, bool from_signal);
void on_context_destroy(CUcontext ctx);
void install_exit_paths();

}  // namespace kvtr
