// What the tracer writes: the run metadata (built with kvconv::JsonWriter) and the finished dump, compacted from the
// live file's groups (tmp + rename over it, so the path holds a valid dump at every instant).
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <map>

#include "json_writer.h"
#include "tracer.h"

namespace kvtr {

static void write_config(kvconv::JsonWriter& j) {
  j.kv("tool", "kvconv-tracer").kv("tool_version", KVCONV_VERSION);
  j.kv("producer", "native/libkvconv_tracer.so (Compute Sanitizer injection)");
}

static void write_run(kvconv::JsonWriter& j) {
  j.strings("command", g_cmdline);
  j.kv("pid", g_pid).kv("ppid", static_cast<long>(getppid()));
  if (!g_cfg.output_owner.empty()) j.kv("output_owner_pid", g_cfg.output_owner);
  j.kv("hostname", g_hostname).kv("started_at", g_started_at).kv("reconstructed", false);
}

static void write_settings(kvconv::JsonWriter& j) {
  j.strings("target_kernels", g_cfg.patterns);
  if (g_cfg.dev_cap) j.kv("device_events_capacity", g_cfg.dev_cap);
  j.kv("host_table_capacity", g_cfg.host_cap);
  // a full device buffer keeps what it holds and counts every later block as dropped (no ring: a capture range
  // is how to keep the steady state; docs/TRACER.md)
  j.kv("device_buffer_policy", "keep-oldest");
  std::vector<std::string> kinds;
  if (g_cfg.enter) kinds.push_back("block_enter");
  if (g_cfg.exit) kinds.push_back("block_exit");
  j.strings("event_kinds", kinds);
  j.key("tag").begin_object().kv("source", "graph launch id").kv("bits", g_cfg.tag ? KVCONV_TAG_BITS : 0);
  // how a replay's tag reaches the device and its graph-node records are made (graph_exec.cpp)
  j.kv("delivery", !g_cfg.whole_domains ? "learned nodes: per-launch data in an exec's first replay, then one tag cell "
                                          "per replay (launch stream), records from the learned nodes"
                                        : "per-launch data per node per replay").end_object();
  j.kv("clock_sync_period_ms", g_cfg.sync_ms);
  j.kv("callbacks", std::string(g_cfg.no_callbacks ? "none" : g_cfg.whole_domains ? "domains" : "minimal") +
                        (g_cfg.graph_callbacks ? (g_cfg.whole_domains ? ",graph-nodes" : ",graph-learn")
                                               : ",no-graph-nodes"));
  // what the user asked to check: a check asked for that left no record is said, never passed (kvconv.check.asked)
  j.key("asked").begin_object().kv("writes", g_cfg.asked_writes).kv("value", g_cfg.asked_value);
  if (!g_cfg.asked_engine.empty()) j.kv("engine", g_cfg.asked_engine);
  if (!g_cfg.asked_range.empty()) j.kv("capture_range", g_cfg.asked_range);
  j.end_object();
}

// The metadata of the live file: what is known at start. Counters are the group headers' (record_count,
// drop_count), kept current while the process runs; `written_at: live` says the process never finished the dump.
std::string live_metadata_json() {
  kvconv::JsonWriter j;
  j.begin_object();
  write_config(j);
  write_run(j);
  j.kv("written_at", "live");
  write_settings(j);
  write_capture(j, true);
  writes_metadata(j, true);  // --writes asked (writes.cpp)
  j.key("live").begin_object().kv("flush_ms", g_cfg.flush_ms).end_object();
  j.end_object();
  return j.str();
}

struct Totals {
  uint64_t dev_drops = 0, dev_drops_graph = 0, needed = 0, overflow = 0, gdrops = 0, edrops = 0, launches = 0, uploads = 0, patched = 0, late = 0, fdata = 0;
  uint64_t unwritten = 0, capfilt = 0, ldata = 0, syncfail = 0, unreadable = 0;
  uint64_t learned = 0, per_node = 0, learn_fail = 0, relearned = 0, from_table = 0, cells = 0, stream_syncs = 0;
};

static Totals totals(const std::vector<Ctx*>& cs) {
  Totals t;
  for (auto* c : cs) {
    t.dev_drops += c->dev_state_read ? c->dev_drops : c->live.device_event.drops();
    t.dev_drops_graph += c->dev_drops_graph;
    t.overflow += c->dev_state_read ? c->dev_drops : 0;
    t.needed += c->dev_next;
    t.gdrops += c->live.graph_node.drops();
    t.edrops += c->live.eager_launch.drops();
    t.launches += c->target_launches.load();
    t.uploads += c->uploads_filtered.load();
    t.patched += c->modules_patched.load();
    t.late += c->late_patched_modules.load();
    t.fdata += c->functions_given_data.load();
    t.unwritten += c->dev_lost_unwritten;
    t.capfilt += c->captured_launches_filtered.load();
    t.ldata += c->launch_data_set.load();
    t.syncfail += c->sync_failures;
    t.unreadable += c->state_dev && !c->dev_state_read;
    t.learned += c->execs_learned.load();
    t.per_node += c->execs_per_node.load();
    t.learn_fail += c->learn_failures.load();
    t.relearned += c->execs_relearned.load();
    t.from_table += c->replays_from_table.load();
    t.cells += c->tag_cells_written.load();
    t.stream_syncs += c->stream_switch_syncs.load();
  }
  return t;
}

static void write_counters(kvconv::JsonWriter& j, const Totals& t) {
  j.key("counters").begin_object();
  j.kv("fatal_count", 0).kv("device_event_drops", t.dev_drops).kv("graph_node_table_drops", t.gdrops);
  j.kv("eager_table_drops", t.edrops).kv("sanitizer_errors", g_sanitizer_errors.load());
  // device events dropped for a full buffer, by launch kind; needed: what a buffer holding every block would take
  j.kv("device_event_drops_overflow_graph", t.dev_drops_graph);
  j.kv("device_event_drops_overflow_eager", t.overflow >= t.dev_drops_graph ? t.overflow - t.dev_drops_graph : 0);
  j.kv("device_events_needed", t.needed);
  j.kv("target_launches", t.launches).kv("graph_uploads_filtered", t.uploads);
  j.kv("captured_launches_filtered", t.capfilt).kv("modules_patched", t.patched);
  j.kv("late_patched_modules", t.late).kv("functions_given_data", t.fdata).kv("launch_data_set", t.ldata);
  j.kv("device_events_unwritten", t.unwritten).kv("clock_sync_failures", t.syncfail);
  // graph execs learned once (their replays recorded from the learned nodes), observed node by node instead, first
  // launches without node callbacks (their target nodes have no host record), execs changed and learned again
  j.kv("graph_execs_learned", t.learned).kv("graph_execs_per_node", t.per_node);
  j.kv("graph_learn_failures", t.learn_fail).kv("graph_execs_relearned", t.relearned);
  j.kv("graph_replays_from_learned_nodes", t.from_table).kv("tag_cells_written", t.cells);
  j.kv("graph_stream_switch_syncs", t.stream_syncs);
  // contexts whose device state could not be read at the end (a sticky CUDA error): their device_event drop count
  // is the launched blocks not in the file, an upper bound, not an exact count
  if (t.unreadable) j.kv("device_state_unreadable", t.unreadable);
  writes_counters(j);  // writes_* with --writes (writes.cpp)
  j.end_object();
}

// The start-up calibration of a context (calibrate.cpp): what kvconv subtracts from a duration, and how it was found.
static void write_calibration(kvconv::JsonWriter& j, const Ctx* c) {
  if (!c->calibrated.load()) return;  // still running at the end (or never started: no patched module)
  const Calibration& r = c->calib;
  auto ns = [](double x) { return static_cast<int64_t>(x < 0 ? x - 0.5 : x + 0.5); };
  j.key("calibration").begin_object().kv("done", r.done);
  if (!r.done) {
    j.kv("why", r.why).end_object();
    return;
  }
  j.kv("kernel", "kvconv_calib_append").kv("launches", r.launches).kv("blocks", r.blocks).kv("threads", r.threads);
  j.kv("row_bytes", r.row_bytes).kv("events", r.events).kv("events_dropped", r.dropped);
  j.kv("traced_span_ns", ns(r.traced_ns)).kv("own_span_unpatched_ns", ns(r.own_plain_ns));
  j.kv("own_span_patched_ns", ns(r.own_patched_ns)).kv("block_span_ns", ns(r.per_block_ns));
  j.kv("cupti_unpatched_ns", ns(r.cupti_plain_ns));
  j.kv("stream_unpatched_ns", ns(r.stream_plain_ns)).kv("stream_patched_ns", ns(r.stream_patched_ns));
  j.kv("bias_ns", ns(r.bias_ns)).kv("bias_p10_ns", ns(r.bias_p10_ns)).kv("bias_p90_ns", ns(r.bias_p90_ns));
  j.end_object();
}

// What the finished dump holds after its metadata group, per record kind: (groups, records). The metadata says it
// (`holds`, docs/FORMAT.md) so that a reader tells a file cut at a group boundary from the finished one.
using Holds = std::map<uint16_t, std::pair<uint64_t, uint64_t>>;

static void write_holds(kvconv::JsonWriter& j, const Holds& h) {
  uint64_t groups = 0;
  for (auto& kv : h) groups += kv.second.first;
  j.key("holds").begin_object().kv("groups", groups).key("kinds").begin_object();
  for (auto& kv : h) {
    j.key(kvconv_kind_name(kv.first)).begin_object().kv("groups", kv.second.first).kv("records", kv.second.second);
    j.end_object();
  }
  j.end_object().end_object();
}

static std::string metadata_json(const std::vector<Ctx*>& cs, const char* reason, const Holds& holds) {
  int drv = 0;
  if (g_drv.driverGetVersion) g_drv.driverGetVersion(&drv);
  kvconv::JsonWriter j;
  j.begin_object();
  write_config(j);
  if (!cs.empty()) j.kv("gpu", gpu_name(cs[0]->device));
  j.kv("cuda", "driver API " + std::to_string(drv / 1000) + "." + std::to_string((drv % 1000) / 10));
  write_run(j);
  j.kv("written_at", reason);
  write_holds(j, holds);
  write_settings(j);
  write_capture(j, false);
  writes_metadata(j, false);  // --writes asked; recorded, or why not (writes.cpp)
  write_counters(j, totals(cs));
  // the kernels of every loaded module (bounded: patching.cpp), for a pattern that matched nothing
  const LoadedKernels lk = loaded_kernels();
  j.strings("loaded_kernels", lk.names).kv("loaded_kernels_dropped", lk.dropped);
  j.kv("loaded_kernel_images_unlisted", lk.images_unlisted);
  j.key("contexts").begin_array();
  for (Ctx* c : cs) {
    j.begin_object().kv("context_id", c->index).kv("device_id", c->device);
    j.kv("device_events", c->live.device_event.count()).kv("device_slots_reserved", c->dev_next);
    j.kv("device_events_capacity", g_cfg.dev_cap);
    j.kv("graph_node_records", c->live.graph_node.count()).kv("eager_launch_records", c->live.eager_launch.count());
    j.kv("clock_sync_pairs", static_cast<uint64_t>(c->syncs.size()));
    write_calibration(j, c);
    j.end_object();
  }
  j.end_array().end_object();
  return j.str();
}

// One context's groups, gathered before anything is written: the metadata goes first and counts what follows it,
// so each count is read once and the same records are written.
struct CtxGroups {
  Ctx* c = nullptr;
  std::string strings;
  std::vector<kvconv_kernel_t> kernels;
  std::vector<kvconv_clock_sync_t> syncs;
  uint64_t events = 0, graph = 0, eager = 0;  // the live groups' published records
  std::string writes;                         // the write-address canary's groups, as a dump's bytes
};

static void gather_kernels(CtxGroups& x) {
  for (auto& k : x.c->kernels) {
    kvconv_kernel_t r;
    std::memset(&r, 0, sizeof r);
    r.slot = k.slot;
    r.flags = 1;
    r.module_id = k.module;
    r.name_off = static_cast<uint32_t>(x.strings.size());
    r.name_len = static_cast<uint32_t>(k.name.size());
    x.strings += k.name;
    const std::string mod = module_name(k.module);
    r.module_off = static_cast<uint32_t>(x.strings.size());
    r.module_len = static_cast<uint32_t>(mod.size());
    x.strings += mod;
    x.kernels.push_back(r);
  }
}

// The write-address canary's groups of a context as write_writes makes them (their state is writes.cpp's, under its
// own lock): written once to a scratch dump beside the output and read back, so that the metadata counts exactly
// the records the dump then holds, even if the probe records a step meanwhile.
static std::string gather_writes(const std::string& path, Ctx* c) {
  if (!writes_enabled()) return "";
  const std::string scratch = path + ".writes." + std::to_string(g_pid);
  {
    kvconv::DumpWriter w(scratch);
    kvconv::GroupSpec g;
    g.context_id = c->index;
    g.device_id = static_cast<uint16_t>(c->device);
    write_writes(w, c, g);
    if (!w.commit()) {
      logf(0, "error: cannot gather the write groups in %s: %s", scratch.c_str(), w.error().c_str());
      return "";
    }
  }
  std::string out;
  if (FILE* f = std::fopen(scratch.c_str(), "rb")) {
    char buf[1 << 16];
    for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) out.append(buf, n);
    std::fclose(f);
  }
  ::unlink(scratch.c_str());
  return out;
}

// Each group of a dump's bytes (the scratch dump of gather_writes): its spec and its payload.
template <class F>
static void each_group(const std::string& blob, F f) {
  size_t pos = 0;
  while (pos + sizeof(kvconv_header_t) <= blob.size()) {
    kvconv_header_t h;
    std::memcpy(&h, blob.data() + pos, sizeof h);
    const size_t n = static_cast<size_t>(h.record_count) * h.record_size;
    if (n > blob.size() - pos - sizeof h) return;
    kvconv::GroupSpec g;
    g.kind = h.record_kind;
    g.record_size = h.record_size;
    g.record_count = h.record_count;
    g.capacity = h.capacity;
    g.drop_count = h.drop_count;
    g.context_id = h.context_id;
    g.device_id = h.device_id;
    g.clock_domain = h.clock_domain;
    f(g, blob.data() + pos + sizeof h);
    pos += sizeof h + (n + KVCONV_PAYLOAD_ALIGN - 1) / KVCONV_PAYLOAD_ALIGN * KVCONV_PAYLOAD_ALIGN;
  }
}

static CtxGroups gather(const std::string& path, Ctx* c) {
  CtxGroups x;
  x.c = c;
  gather_kernels(x);
  {
    std::lock_guard<std::mutex> lk(c->sync_mu);
    x.syncs = c->syncs;
  }
  x.events = c->live.device_event.count();
  x.graph = c->live.graph_node.count();
  x.eager = c->live.eager_launch.count();
  x.writes = gather_writes(path, c);
  return x;
}

static Holds holds_of(const std::vector<CtxGroups>& xs) {
  Holds h;
  auto add = [&h](uint16_t kind, uint64_t records) {
    h[kind].first += 1;
    h[kind].second += records;
  };
  for (const CtxGroups& x : xs) {
    add(KVCONV_KIND_STRINGS, x.strings.size());
    add(KVCONV_KIND_KERNEL, x.kernels.size());
    add(KVCONV_KIND_CLOCK_SYNC, x.syncs.size());
    add(KVCONV_KIND_DEVICE_EVENT, x.events);
    add(KVCONV_KIND_GRAPH_NODE, x.graph);
    add(KVCONV_KIND_EAGER_LAUNCH, x.eager);
    each_group(x.writes, [&add](const kvconv::GroupSpec& g, const char*) { add(g.kind, g.record_count); });
  }
  return h;
}

// A live group's first `count` published records (the count the metadata holds) as a finished group.
static void write_live(kvconv::DumpWriter& w, kvconv::GroupSpec g, const kvconv::LiveGroup& lg, uint64_t count) {
  g.record_count = count;
  g.drop_count = lg.drops();
  w.add_group(g, g.record_count ? lg.at(0) : nullptr);
}

static void write_context(kvconv::DumpWriter& w, const CtxGroups& x) {
  Ctx* c = x.c;
  kvconv::GroupSpec g;
  g.context_id = c->index;
  g.device_id = static_cast<uint16_t>(c->device);
  w.add_bytes(KVCONV_KIND_STRINGS, x.strings, g.context_id, g.device_id);
  g.kind = KVCONV_KIND_KERNEL;
  g.record_size = sizeof(kvconv_kernel_t);
  g.record_count = x.kernels.size();
  w.add_group(g, x.kernels.data());
  g.kind = KVCONV_KIND_CLOCK_SYNC;
  g.record_size = sizeof(kvconv_clock_sync_t);
  g.record_count = x.syncs.size();
  w.add_group(g, x.syncs.data());
  g.kind = KVCONV_KIND_DEVICE_EVENT;
  g.record_size = sizeof(kvconv_device_event_t);
  g.capacity = g_cfg.dev_cap;
  g.clock_domain = KVCONV_CLOCK_DOMAIN_GPU_GLOBALTIMER;
  write_live(w, g, c->live.device_event, x.events);
  g.kind = KVCONV_KIND_GRAPH_NODE;
  g.record_size = sizeof(kvconv_host_launch_t);
  g.capacity = g_cfg.host_cap;
  g.clock_domain = KVCONV_CLOCK_DOMAIN_HOST_MONOTONIC;
  write_live(w, g, c->live.graph_node, x.graph);
  g.kind = KVCONV_KIND_EAGER_LAUNCH;
  write_live(w, g, c->live.eager_launch, x.eager);
  // the write-address canary's groups, if recorded (writes.cpp), as gathered
  each_group(x.writes, [&w](const kvconv::GroupSpec& wg, const char* payload) { w.add_group(wg, payload); });
}

bool write_finished(const std::string& path, const std::vector<Ctx*>& cs, const char* reason) {
  std::vector<CtxGroups> xs;
  for (Ctx* c : cs) xs.push_back(gather(path, c));
  kvconv::DumpWriter w(path);
  const uint32_t ctx0 = cs.empty() ? 0 : cs[0]->index;
  const uint16_t dev0 = cs.empty() ? 0 : static_cast<uint16_t>(cs[0]->device);
  w.add_bytes(KVCONV_KIND_METADATA, metadata_json(cs, reason, holds_of(xs)), ctx0, dev0);
  for (const CtxGroups& x : xs) write_context(w, x);
  if (!w.commit()) {
    logf(0, "error: cannot write %s: %s (the live dump stays there)", path.c_str(), w.error().c_str());
    return false;
  }
  for (const CtxGroups& x : xs) {
    const Ctx* c = x.c;
    logf(0, "wrote %s: context %u, %llu device events (drops %llu), %llu graph-node and %llu eager records "
            "(drops %llu, %llu), %zu clock-sync pairs, %llu sanitizer errors [%s]",
         path.c_str(), c->index, (unsigned long long)x.events, (unsigned long long)c->live.device_event.drops(),
         (unsigned long long)x.graph, (unsigned long long)x.eager, (unsigned long long)c->live.graph_node.drops(),
         (unsigned long long)c->live.eager_launch.drops(), x.syncs.size(),
         (unsigned long long)g_sanitizer_errors.load(), reason);
  }
  return true;
}

static bool has_content(const Ctx* c) {
  return c->finished && (c->state_dev || !c->kernels.empty() || c->live.graph_node.count() ||
                         c->live.eager_launch.count());
}

void write_all(const char* reason) {
  const std::vector<Ctx*> cs = contexts_where(has_content);
  if (per_context_files()) {
    for (auto* c : cs) write_finished(kvconv::expand_path(g_cfg.output, g_pid, static_cast<int>(c->index)), {c}, reason);
  } else {
    write_finished(kvconv::expand_path(g_cfg.output, g_pid, 0), cs, reason);
  }
}

}  // namespace kvtr
