// Graph execs: the target nodes of an exec are learned once, then each replay costs one callback, one 8-byte copy and
// a host record per target node, whatever the number of other nodes in the graph.
//
// Why: a graph-node launch callback fires for EVERY node of a replay once it is enabled, and the driver then feeds
// the replay node by node: +65% GPU step time on a 1,040-node decode graph (issue 15). What the node callbacks gave us
// comes another way (facts: ../shared/notes/sanitizer-api-facts.md):
//   - node identity: a node keeps its %gridid in every replay of one exec, so the first replay (node callbacks held on
//     for that one launch) tells which gridids are targets, with their geometry, node and stream;
//   - the replay tag: GRAPHS_LAUNCH_BEGIN fires once per replay; there the host writes the launch id into the exec's
//     tag cell on the launch stream (stream-ordered: before the replay's kernels, after the previous replay's), and the
//     patch finds the cell from %gridid in the device node table (tracer_shared.h);
//   - the host records: the learned records with this replay's launch id, tag and time.
// An exec whose nodes change (cuGraphExecUpdate, ...SetParams, cuGraphNodeSetEnabled) is learned again. One that
// cannot be learned (a conditional node, a full node table) keeps a node callback per node per replay, as does every
// exec under KVCONV_CALLBACKS=domains (whole callback domains enabled).
#include <cstring>
#include <unordered_map>

#include "tracer.h"

namespace kvtr {

namespace {

enum class Mode : uint8_t { kLearn, kFast, kPerNode };

struct Exec {
  Ctx* c = nullptr;
  Mode mode = Mode::kLearn;
  bool hold = false;           // holds the node callbacks on
  bool learning = false;       // between the learning launch's begin and end
  bool unlearnable = false;    // seen while learning: a conditional node or a node table without room
  bool cell_dirty = false;     // the cell holds a fast launch's tag: cleared before the exec is learned again
  bool table_pending = false;  // learned table slots not copied to the device yet
  uint64_t launch_id = 0;      // the last launch's id (the sanitizer's launchId, adopted while learning)
  uint64_t nodes_seen = 0;     // node callbacks of the learning launch
  uint32_t cell = 0;
  Sanitizer_StreamHandle last_stream = nullptr;
  std::vector<kvconv_host_launch_t> targets;  // learned records of the target nodes, in launch order
  std::vector<uint32_t> slots;                // their node-table slots
  uint64_t blocks = 0;                        // of the target nodes, in all (the capture range's count)
};

std::mutex g_gmu;  // the execs and every context's node table / next_cell
std::unordered_map<CUgraphExec, Exec> g_execs;
Sanitizer_SubscriberHandle g_sub = nullptr;
std::mutex g_toggle_mu;  // sanitizerEnableCallback calls are serialized by the subscriber (sanitizer_callbacks.h)
uint32_t g_holds = 0;
bool g_nodes_always = false;  // node callbacks enabled for good (whole domains)
bool g_learn_at_create = false;  // a learning launch saw no node callback: hold them from exec creation on

bool node_callbacks(bool on) {
  return SAN(sanitizerEnableCallback(on ? 1 : 0, g_sub, SANITIZER_CB_DOMAIN_GRAPHS,
                                     SANITIZER_CBID_GRAPHS_NODE_LAUNCH_BEGIN));
}

void hold(Exec& e) {
  if (e.hold || g_nodes_always) return;
  e.hold = true;
  std::lock_guard<std::mutex> lk(g_toggle_mu);
  if (g_holds++ == 0) node_callbacks(true);
}

void release(Exec& e) {
  if (!e.hold) return;
  e.hold = false;
  std::lock_guard<std::mutex> lk(g_toggle_mu);
  if (--g_holds == 0) node_callbacks(false);
}

void forget(CUgraphExec x) {
  auto it = g_execs.find(x);
  if (it == g_execs.end()) return;
  release(it->second);
  g_execs.erase(it);
}

// 8 bytes (or a table slot) to the device, ordered on the launch stream. The source is copied to staging memory
// before the call returns (sanitizer_memory.h), so a local is fine.
bool to_device(uint64_t dst, const void* src, size_t n, Sanitizer_StreamHandle s) {
  return SAN(sanitizerMemcpyHostToDeviceAsync(reinterpret_cast<void*>(dst), const_cast<void*>(src), n, s));
}

// A copy on this launch's stream is ordered after the previous replay only if that ran on the same stream: a replay
// on another stream may still be reading the cell, so wait for it first (rare: engines replay on one stream).
void order_after_previous(Exec& e, Sanitizer_StreamHandle s) {
  if (!e.last_stream || e.last_stream == s) return;
  SAN(sanitizerStreamSynchronize(e.last_stream));
  e.c->stream_switch_syncs.fetch_add(1, std::memory_order_relaxed);
}

void start_learning(Exec& e, Sanitizer_StreamHandle s) {
  e.learning = true;
  e.unlearnable = false;
  e.nodes_seen = 0;
  e.targets.clear();
  e.slots.clear();
  e.table_pending = false;
  if (e.cell_dirty && e.c->cells_dev) {
    // the learning launch's kernels take their tag from per-launch data, which a non-zero cell would override
    order_after_previous(e, s);
    const uint64_t zero = 0;
    if (to_device(e.c->cells_dev + e.cell * sizeof(uint64_t), &zero, sizeof zero, s)) e.cell_dirty = false;
    else e.unlearnable = true;
  }
  hold(e);
}

void finish_learning(CUgraphExec x, Exec& e) {
  e.learning = false;
  Ctx* c = e.c;
  if (e.nodes_seen == 0) {
    // The node callbacks did not reach this launch: its target nodes have no host record (their device events stay
    // unmatched, reported by reconcile). Keep them held until the exec's next launch, and from now on hold them from
    // each exec's creation.
    c->learn_failures.fetch_add(1, std::memory_order_relaxed);
    g_learn_at_create = true;
    logf(0, "warning: graph exec %p: no node callback in its first launch; its next launch is learned instead",
         static_cast<void*>(x));
    return;
  }
  release(e);
  if (e.unlearnable || e.cell_dirty) {
    e.mode = Mode::kPerNode;
    c->execs_per_node.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  e.mode = Mode::kFast;
  e.table_pending = !e.slots.empty();
  e.blocks = 0;
  for (const auto& r : e.targets) e.blocks += static_cast<uint64_t>(r.grid_x) * r.grid_y * r.grid_z;
  c->execs_learned.fetch_add(1, std::memory_order_relaxed);
}

// One replay of a learned exec: the tag to the device, the learned records to the dump.
void fast_replay(Exec& e, const Sanitizer_GraphLaunchData* d) {
  Ctx* c = e.c;
  if (e.targets.empty()) return;
  const bool admitted = range_admit_replay(e.targets.size(), e.blocks);
  const uint64_t tag = e.launch_id & KVCONV_TAG_MASK;  // 0 once in 2^20 replays: the cell then says "no tag"
  // Outside the capture range the cell says so (KVCONV_CELL_OFF): the patch records nothing for these nodes.
  const uint64_t cell = admitted ? tag : KVCONV_CELL_OFF;
  bool tagged = false;
  if (g_cfg.tag && c->cells_dev && e.cell) {
    order_after_previous(e, d->hStream);
    bool ok = true;
    if (e.table_pending)
      for (uint32_t slot : e.slots)
        ok &= to_device(c->table_dev + slot * sizeof(kvconv_node_entry), &c->node_table[slot],
                        sizeof(kvconv_node_entry), d->hStream);
    e.table_pending = false;
    ok = ok && to_device(c->cells_dev + e.cell * sizeof(uint64_t), &cell, sizeof cell, d->hStream);
    e.cell_dirty = true;
    if (ok) c->tag_cells_written.fetch_add(1, std::memory_order_relaxed);
    else e.mode = Mode::kLearn;  // a copy failed: this replay's records say no tag; learned again next launch
    tagged = ok && tag;
  } else if (!admitted) {
    logf(0, "warning: graph exec replay outside the capture range without a tag cell (KVCONV_TAG=0?): its device "
            "events are recorded, its host records are not");
  }
  if (!admitted) return;
  const uint64_t now = now_ns();
  for (kvconv_host_launch_t r : e.targets) {
    r.launch_id = e.launch_id;
    r.host_ns = now;
    r.api_stream = reinterpret_cast<uint64_t>(d->stream);
    r.tag = tagged ? tag : 0;
    r.flags = KVCONV_LAUNCH_FLAGS_GRAPH_NODE | (tagged ? KVCONV_LAUNCH_FLAGS_HAS_TAG : 0);
    append_graph_node(c, r);
  }
  c->target_launches.fetch_add(e.targets.size(), std::memory_order_relaxed);
  c->replays_from_table.fetch_add(1, std::memory_order_relaxed);
}

// A free slot (or this gridid's own) within the probe window; -1 if none.
int64_t table_slot(Ctx* c, uint64_t gid) {
  if (!c->table_dev || !gid) return -1;
  if (c->node_table.empty()) c->node_table.assign(kNodeTableSlots, kvconv_node_entry{0, 0});
  for (uint64_t i = 0; i < KVCONV_TABLE_PROBES; ++i) {
    const uint64_t s = (gid + i) & (kNodeTableSlots - 1);
    if (c->node_table[s].gridid == gid || c->node_table[s].gridid == 0) return static_cast<int64_t>(s);
  }
  return -1;
}

}  // namespace

bool enable_graph_callbacks(Sanitizer_SubscriberHandle sub) {
  g_sub = sub;
  g_nodes_always = g_cfg.whole_domains;
  const Sanitizer_CallbackId graphs[] = {SANITIZER_CBID_GRAPHS_GRAPHEXEC_CREATED,
                                               SANITIZER_CBID_GRAPHS_GRAPHEXEC_DESTROYING,
                                               SANITIZER_CBID_GRAPHS_LAUNCH_BEGIN, SANITIZER_CBID_GRAPHS_LAUNCH_END};
  const Sanitizer_CallbackId changes[] = {
      SANITIZER_CBID_DRIVER_API_cuGraphExecKernelNodeSetParams, SANITIZER_CBID_DRIVER_API_cuGraphExecKernelNodeSetParams_v2,
      SANITIZER_CBID_DRIVER_API_cuGraphExecNodeSetParams, SANITIZER_CBID_DRIVER_API_cuGraphExecUpdate,
      SANITIZER_CBID_DRIVER_API_cuGraphExecUpdate_v2, SANITIZER_CBID_DRIVER_API_cuGraphExecChildGraphNodeSetParams,
      SANITIZER_CBID_DRIVER_API_cuGraphNodeSetEnabled};
  bool ok = true;
  if (g_cfg.whole_domains) {
    ok &= SAN(sanitizerEnableDomain(1, sub, SANITIZER_CB_DOMAIN_GRAPHS));
  } else {
    for (auto id : graphs) ok &= SAN(sanitizerEnableCallback(1, sub, SANITIZER_CB_DOMAIN_GRAPHS, id));
    if (g_nodes_always) ok &= node_callbacks(true);
  }
  for (auto id : changes) ok &= SAN(sanitizerEnableCallback(1, sub, SANITIZER_CB_DOMAIN_DRIVER_API, id));
  return ok;
}

void on_graph_exec(Sanitizer_CallbackId cbid, const Sanitizer_GraphExecData* d) {
  std::lock_guard<std::mutex> lk(g_gmu);
  forget(d->graphExec);  // a handle the driver hands out again is a new exec
  if (cbid != SANITIZER_CBID_GRAPHS_GRAPHEXEC_CREATED || !d->graphExec || !g_learn_at_create) return;
  hold(g_execs[d->graphExec]);
}

void on_graph_exec_api(const Sanitizer_CallbackData* d) {
  if (d->callbackSite != SANITIZER_API_ENTER || !d->functionParams) return;
  // every one of these calls takes the exec first (cuGraphExec*(hGraphExec, ...), cuGraphNodeSetEnabled(hGraphExec, ..))
  const CUgraphExec x = *static_cast<const CUgraphExec*>(d->functionParams);
  std::lock_guard<std::mutex> lk(g_gmu);
  auto it = g_execs.find(x);
  if (it == g_execs.end() || it->second.mode == Mode::kLearn) return;
  it->second.mode = Mode::kLearn;
  it->second.c->execs_relearned.fetch_add(1, std::memory_order_relaxed);
}

void on_graph_launch(Sanitizer_CallbackId cbid, const Sanitizer_GraphLaunchData* d) {
  if (d->isGraphUpload || !d->graphExec) return;
  Ctx* c = get_ctx(d->context);
  std::lock_guard<std::mutex> lk(g_gmu);
  if (cbid == SANITIZER_CBID_GRAPHS_LAUNCH_END) {
    auto it = g_execs.find(d->graphExec);
    if (it == g_execs.end()) return;
    if (it->second.learning) finish_learning(d->graphExec, it->second);
    else if (it->second.mode == Mode::kPerNode) release(it->second);
    return;
  }
  Exec& e = g_execs[d->graphExec];
  e.c = c;
  ++e.launch_id;
  if (g_nodes_always && e.mode == Mode::kLearn) e.mode = Mode::kPerNode;
  switch (e.mode) {
    case Mode::kLearn: start_learning(e, d->hStream); break;
    case Mode::kPerNode: hold(e); break;
    case Mode::kFast: fast_replay(e, d); break;
  }
  e.last_stream = d->hStream;
}

NodeRole graph_node_role(const Sanitizer_GraphNodeLaunchData* nd) {
  std::lock_guard<std::mutex> lk(g_gmu);
  auto it = g_execs.find(nd->graphExec);
  if (it == g_execs.end()) return NodeRole::kObserve;  // launched before we saw its launch begin: as before
  Exec& e = it->second;
  if (e.learning) {
    if (e.nodes_seen++ == 0) e.launch_id = nd->launchId;  // the ids the old design recorded: keep them
    if (nd->nodeType == CU_GRAPH_NODE_TYPE_CONDITIONAL) e.unlearnable = true;
    return NodeRole::kLearn;
  }
  return e.mode == Mode::kFast ? NodeRole::kSkip : NodeRole::kObserve;
}

void graph_node_learned(const Sanitizer_GraphNodeLaunchData* nd, const kvconv_host_launch_t& r) {
  std::lock_guard<std::mutex> lk(g_gmu);
  auto it = g_execs.find(nd->graphExec);
  if (it == g_execs.end() || !it->second.learning) return;
  Exec& e = it->second;
  Ctx* c = e.c;
  e.targets.push_back(r);
  if (!g_cfg.tag || e.unlearnable) return;
  if (!e.cell) {
    if (!c->cells_dev || c->next_cell >= kTagCells) {
      e.unlearnable = true;
      return;
    }
    e.cell = c->next_cell++;
  }
  const int64_t s = table_slot(c, r.grid_id);
  if (s < 0) {
    e.unlearnable = true;
    return;
  }
  c->node_table[s] = kvconv_node_entry{r.grid_id, e.cell};
  e.slots.push_back(static_cast<uint32_t>(s));
}

}  // namespace kvtr
