// The injection entry point (CUDA_INJECTION64_PATH=libkvconv_tracer.so) and the callback dispatch.
//
// Records, per CUDA context:
//   - device side: one 64-byte event per block of every target kernel (device patch patch.cu, block enter/exit),
//     %gridid plus a per-replay tag delivered through per-launch callback data;
//   - host side: graph kernel-node launches of target kernels (graph uploads filtered out; learned once per graph
//     exec, then recorded per replay from one graph-launch callback: graph_exec.cpp), eager launches of target kernels, the kernel table, clock-sync pairs (CLOCK_MONOTONIC bracket around a %globaltimer read);
// into a kvconv dump (schemas/layouts.json) that is valid on disk from start-up on (live_file.h) and finished at
// context teardown or process exit (exit_paths.cpp). Configuration (environment): config.cpp, docs/TRACER.md.
#include <pthread.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "tracer.h"

namespace kvtr {

// Read on every callback: one relaxed load. A forked child turns it off in its atfork handler (the files are its
// parent's), so the callback needs no getpid(): a system call per graph node (~0.2 us each, hundreds per replay)
// was a measurable part of the live design's cost on the H200.
static std::atomic<bool> g_enabled{false};
static void in_forked_child() { g_enabled.store(false, std::memory_order_relaxed); }
static Sanitizer_SubscriberHandle g_sub = nullptr;

static void on_module_loaded(const Sanitizer_ResourceModuleData* md) {
  Ctx* c = get_ctx(md->context);
  if (t_own_module) {  // the tracer's own (calibrate.cpp): not the program's
    std::lock_guard<std::mutex> lk(c->mu);
    if (t_own_module == 1) patch_own_module(c, md->module);
    return;
  }
  note_loaded_kernels(c->index, md->pCubin, md->cubinSize);  // metadata loaded_kernels (patching.cpp)
  bool has = cubin_has_target(md->pCubin, md->cubinSize);
  logf(2, "context %u: module %p loaded: cubin %zu bytes%s, %s", c->index, (void*)md->module, (size_t)md->cubinSize,
       md->pCubin ? "" : " (no image)", has ? "target token found: patching" : "no target");
  bool did = false;
  {
    std::lock_guard<std::mutex> lk(c->mu);
    if (has) did = patch_module(c, md->module);
  }
  if (did) kick_sync();
}

static bool stream_capturing(CUstream s) {
  if (!g_drv.streamIsCapturing) return false;
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  if (g_drv.streamIsCapturing(s, &st) != CUDA_SUCCESS) return false;
  return st != CU_STREAM_CAPTURE_STATUS_NONE;
}

static uint64_t blocks_of(const Sanitizer_LaunchData& ld) {
  return static_cast<uint64_t>(ld.gridDim_x) * ld.gridDim_y * ld.gridDim_z;
}

// A target launch outside the capture range: its blocks must not record (per-launch data NULL: the patch returns).
static void silence(Ctx* c, const Sanitizer_LaunchData& ld) {
  if (c->state_dev) SAN(sanitizerSetLaunchCallbackData(ld.hLaunch, ld.function, ld.hStream, nullptr));
}

static void on_launch(const Sanitizer_LaunchData* ld) {
  Ctx* c = get_ctx(ld->context);
  uint32_t slot = classify(c, ld->function, ld->functionName, ld->module, true);
  if (!slot) return;
  if (stream_capturing(ld->apiStream ? ld->apiStream : ld->stream)) {
    c->captured_launches_filtered.fetch_add(1);  // becomes a graph node; recorded when a replay runs it
    return;
  }
  if (!range_admit(false, blocks_of(*ld))) {
    silence(c, *ld);
    return;
  }
  c->target_launches.fetch_add(1, std::memory_order_relaxed);
  kvconv_host_launch_t r = host_record(*ld, slot);
  r.flags = KVCONV_LAUNCH_FLAGS_EAGER;
  append_eager(c, r);
}

static void on_graph_node(const Sanitizer_GraphNodeLaunchData* nd) {
  const NodeRole role = nd->isGraphUpload ? NodeRole::kObserve : graph_node_role(nd);
  if (role == NodeRole::kSkip || nd->nodeType != CU_GRAPH_NODE_TYPE_KERNEL) return;
  const Sanitizer_LaunchData& ld = nd->launchData;
  Ctx* c = get_ctx(ld.context);
  uint32_t slot = classify(c, ld.function, ld.functionName, ld.module, !nd->isGraphUpload);
  if (!slot) return;
  if (nd->isGraphUpload) {
    c->uploads_filtered.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  kvconv_host_launch_t r = host_record(ld, slot);
  r.graph_exec = reinterpret_cast<uint64_t>(nd->graphExec);
  r.launch_id = nd->launchId;
  r.node = reinterpret_cast<uint64_t>(nd->node);
  r.flags = KVCONV_LAUNCH_FLAGS_GRAPH_NODE;
  const bool admitted = range_admit(true, blocks_of(ld));
  if (admitted && g_cfg.tag && c->state_dev) {
    const uint64_t tag = static_cast<uint64_t>(nd->launchId) & KVCONV_TAG_MASK;
    if (tag && SAN(sanitizerSetLaunchCallbackData(ld.hLaunch, ld.function, ld.hStream,
                                                  reinterpret_cast<void*>(encode(c, slot, tag))))) {
      r.tag = tag;
      r.flags |= KVCONV_LAUNCH_FLAGS_HAS_TAG;
      c->launch_data_set.fetch_add(1, std::memory_order_relaxed);
    }
  }
  if (admitted) {
    c->target_launches.fetch_add(1, std::memory_order_relaxed);
    append_graph_node(c, r);
  } else {
    silence(c, ld);
  }
  if (role == NodeRole::kLearn) graph_node_learned(nd, r);  // learned in or out of range: later replays need it
}

// cuProfilerStart / cuProfilerStop (cudaProfilerStart/Stop): the capture range's edges with KVCONV_CAPTURE_RANGE=
// profiler. Every other driver API callback enabled is a change to a graph exec (graph_exec.cpp).
static void on_driver_api(Sanitizer_CallbackId cbid, const Sanitizer_CallbackData* d) {
  if (cbid == SANITIZER_CBID_DRIVER_API_cuProfilerStart || cbid == SANITIZER_CBID_DRIVER_API_cuProfilerStop) {
    if (d->callbackSite == SANITIZER_API_ENTER) range_on_profiler(cbid == SANITIZER_CBID_DRIVER_API_cuProfilerStart);
    return;
  }
  on_graph_exec_api(d);
}

static void on_resource(Sanitizer_CallbackId cbid, const void* cbdata) {
  switch (cbid) {
    case SANITIZER_CBID_RESOURCE_CONTEXT_CREATION_FINISHED: {
      auto* d = static_cast<const Sanitizer_ResourceContextData*>(cbdata);
      get_ctx(d->context, static_cast<int>(d->device));
      break;
    }
    case SANITIZER_CBID_RESOURCE_CONTEXT_DESTROY_STARTING:
      on_context_destroy(static_cast<const Sanitizer_ResourceContextData*>(cbdata)->context);
      break;
    case SANITIZER_CBID_RESOURCE_MODULE_LOADED:
      on_module_loaded(static_cast<const Sanitizer_ResourceModuleData*>(cbdata));
      break;
    case SANITIZER_CBID_RESOURCE_FUNCTIONS_LAZY_LOADED:
    case SANITIZER_CBID_RESOURCE_FUNCTIONS_LAZY_PATCHED: {
      auto* fd = static_cast<const Sanitizer_ResourceFunctionsLazyLoadedData*>(cbdata);
      give_lazy_functions_data(get_ctx(fd->context), fd->module, fd->functions, fd->numFunctions);
      break;
    }
    default:
      break;
  }
}

static void SANITIZERAPI callback(void*, Sanitizer_CallbackDomain domain, Sanitizer_CallbackId cbid,
                                  const void* cbdata) {
  if (!g_enabled.load(std::memory_order_relaxed)) return;
  if (domain == SANITIZER_CB_DOMAIN_RESOURCE) {
    on_resource(cbid, cbdata);
  } else if (domain == SANITIZER_CB_DOMAIN_LAUNCH && cbid == SANITIZER_CBID_LAUNCH_BEGIN) {
    on_launch(static_cast<const Sanitizer_LaunchData*>(cbdata));
  } else if (domain == SANITIZER_CB_DOMAIN_GRAPHS) {
    switch (cbid) {
      case SANITIZER_CBID_GRAPHS_NODE_LAUNCH_BEGIN:
        on_graph_node(static_cast<const Sanitizer_GraphNodeLaunchData*>(cbdata));
        break;
      case SANITIZER_CBID_GRAPHS_LAUNCH_BEGIN:
      case SANITIZER_CBID_GRAPHS_LAUNCH_END:
        on_graph_launch(cbid, static_cast<const Sanitizer_GraphLaunchData*>(cbdata));
        break;
      case SANITIZER_CBID_GRAPHS_GRAPHEXEC_CREATED:
      case SANITIZER_CBID_GRAPHS_GRAPHEXEC_DESTROYING:
        on_graph_exec(cbid, static_cast<const Sanitizer_GraphExecData*>(cbdata));
        break;
      default:
        break;
    }
  } else if (domain == SANITIZER_CB_DOMAIN_DRIVER_API) {
    on_driver_api(cbid, static_cast<const Sanitizer_CallbackData*>(cbdata));
  }
}

static std::string iso_now() {
  time_t t = time(nullptr);
  struct tm tmv;
  gmtime_r(&t, &tmv);
  char buf[64];
  strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tmv);
  return buf;
}

static void read_cmdline() {
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

static bool enable_callbacks() {
  if (g_cfg.no_callbacks) return true;  // the floor: injected and subscribed, nothing else
  bool ok = true;
  if (g_cfg.whole_domains) {
    ok &= SAN(sanitizerEnableDomain(1, g_sub, SANITIZER_CB_DOMAIN_RESOURCE));
    ok &= SAN(sanitizerEnableDomain(1, g_sub, SANITIZER_CB_DOMAIN_LAUNCH));
    if (g_cfg.graph_callbacks) ok &= enable_graph_callbacks(g_sub);
    return ok;
  }
  // Only the callbacks used: every enabled callback costs time on the launch path.
  const Sanitizer_CallbackIdResource res[] = {
      SANITIZER_CBID_RESOURCE_CONTEXT_CREATION_FINISHED, SANITIZER_CBID_RESOURCE_CONTEXT_DESTROY_STARTING,
      SANITIZER_CBID_RESOURCE_MODULE_LOADED, SANITIZER_CBID_RESOURCE_FUNCTIONS_LAZY_LOADED,
      SANITIZER_CBID_RESOURCE_FUNCTIONS_LAZY_PATCHED};
  for (auto id : res) ok &= SAN(sanitizerEnableCallback(1, g_sub, SANITIZER_CB_DOMAIN_RESOURCE, id));
  ok &= SAN(sanitizerEnableCallback(1, g_sub, SANITIZER_CB_DOMAIN_LAUNCH, SANITIZER_CBID_LAUNCH_BEGIN));
  // graph nodes: the launch of a graph, its exec's creation and changes; node callbacks only while learning
  if (g_cfg.graph_callbacks) ok &= enable_graph_callbacks(g_sub);
  if (capture_by_profiler())
    for (auto id : {SANITIZER_CBID_DRIVER_API_cuProfilerStart, SANITIZER_CBID_DRIVER_API_cuProfilerStop})
      ok &= SAN(sanitizerEnableCallback(1, g_sub, SANITIZER_CB_DOMAIN_DRIVER_API, id));
  return ok;
}

// The process's live dump (one file for all contexts; with %c each context creates its own): written before any
// CUDA work, so every end of the process from here on leaves a dump.
static bool create_process_file() {
  if (per_context_files()) return true;
  auto* f = new kvconv::LiveFile();  // lives as long as the process: the mapping is the buffer
  if (!f->create(kvconv::expand_path(g_cfg.output, g_pid, 0), live_metadata_json())) {
    logf(0, "error: %s; tracing is OFF for this process", f->error().c_str());
    delete f;
    return false;
  }
  g_process_file = f;
  return true;
}

static int initialize() {
  load_config();
  g_pid = static_cast<long>(getpid());
  claim_output();
  if (!load_capture_range()) return 1;
  const std::string first = kvconv::expand_path(g_cfg.output, g_pid, 0);
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
  if (!create_process_file()) return 1;
  if (!SAN(sanitizerSubscribe(&g_sub, callback, nullptr))) return 1;
  if (!enable_callbacks()) return 1;
  pthread_atfork(nullptr, nullptr, in_forked_child);
  g_enabled.store(true, std::memory_order_relaxed);
  install_exit_paths();
  std::string pats;
  for (auto& p : g_cfg.patterns) pats += (pats.empty() ? "" : ",") + p;
  logf(1, "tracing kernels [%s] -> %s (device capacity %llu, host capacity %llu, events%s%s, clock sync %d ms, "
          "flush %d ms)",
       pats.c_str(), g_cfg.output.c_str(), (unsigned long long)g_cfg.dev_cap, (unsigned long long)g_cfg.host_cap,
       g_cfg.enter ? " enter" : "", g_cfg.exit ? " exit" : "", g_cfg.sync_ms, g_cfg.flush_ms);
  return 1;
}

}  // namespace kvtr

extern "C" __attribute__((visibility("default"))) int InitializeInjection() {
  static bool once = false;
  if (once) return 1;
  once = true;
  return kvtr::initialize();
}
