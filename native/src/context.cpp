// Per-context state and the registry; each context's groups in the live dump file, reserved when it is first seen.
#include <unistd.h>

#include "tracer.h"

namespace kvtr {

std::mutex g_mu;
std::vector<Ctx*> g_all;
kvconv::LiveFile* g_process_file = nullptr;
std::string g_hostname, g_started_at;
std::vector<std::string> g_cmdline;
long g_pid = 0;

static std::unordered_map<CUcontext, Ctx*> g_live;  // live contexts
static std::atomic<uint64_t> g_gen{0};              // bumped when a context dies (invalidates thread caches)

static const uint64_t kStringsCap = 1 << 20;  // bytes of kernel and module names
static const uint64_t kKernelCap = 4096;      // target kernels per context
static const uint64_t kSyncCap = 1 << 16;     // clock-sync pairs (18 hours at one a second)

// Reserve the context's groups in the dump file (its own file with %c). Failure leaves the context traced with
// groups that are not valid(): it is still written at a clean end, only not kept on disk while running.
static void reserve_live(Ctx* c) {
  if (!g_cfg.dev_cap) {
    g_cfg.dev_cap = default_device_capacity(c->device);
    logf(1, "device buffer: %llu events (KVCONV_DEVICE_CAPACITY unset; by device %d's memory)",
         (unsigned long long)g_cfg.dev_cap, c->device);
  }
  kvconv::LiveFile* f = g_process_file;
  if (per_context_files()) {
    f = new kvconv::LiveFile();  // lives as long as the process: the mapping is the buffer
    if (!f->create(kvconv::expand_path(g_cfg.output, g_pid, static_cast<int>(c->index)), live_metadata_json())) {
      logf(0, "error: %s; context %u is not kept on disk while running", f->error().c_str(), c->index);
      return;
    }
  }
  if (!f) return;
  auto spec = [c](uint16_t kind, uint32_t size, uint64_t cap, uint16_t clock) {
    kvconv::GroupSpec g;
    g.kind = kind;
    g.record_size = size;
    g.capacity = cap;
    g.context_id = c->index;
    g.device_id = static_cast<uint16_t>(c->device);
    g.clock_domain = clock;
    return g;
  };
  // The device events last: the last group's reservation is not on disk, the file grows as events are published
  // (live_file.h), so a live dump is the size of what it holds, not of the 2 GiB default buffer (issue 49).
  std::vector<kvconv::GroupSpec> specs = {
      spec(KVCONV_KIND_STRINGS, 1, kStringsCap, KVCONV_CLOCK_DOMAIN_NONE),
      spec(KVCONV_KIND_KERNEL, sizeof(kvconv_kernel_t), kKernelCap, KVCONV_CLOCK_DOMAIN_NONE),
      spec(KVCONV_KIND_CLOCK_SYNC, sizeof(kvconv_clock_sync_t), kSyncCap, KVCONV_CLOCK_DOMAIN_NONE),
      spec(KVCONV_KIND_GRAPH_NODE, sizeof(kvconv_host_launch_t), g_cfg.host_cap, KVCONV_CLOCK_DOMAIN_HOST_MONOTONIC),
      spec(KVCONV_KIND_EAGER_LAUNCH, sizeof(kvconv_host_launch_t), g_cfg.host_cap, KVCONV_CLOCK_DOMAIN_HOST_MONOTONIC)};
  const std::vector<kvconv::GroupSpec> writes = writes_live_specs(spec(0, 0, 0, KVCONV_CLOCK_DOMAIN_NONE));
  specs.insert(specs.end(), writes.begin(), writes.end());
  specs.push_back(
      spec(KVCONV_KIND_DEVICE_EVENT, sizeof(kvconv_device_event_t), g_cfg.dev_cap, KVCONV_CLOCK_DOMAIN_GPU_GLOBALTIMER));
  std::vector<kvconv::LiveGroup> gs;
  if (!f->add_groups(specs, &gs)) {
    logf(0, "error: %s; context %u is not kept on disk while running", f->error().c_str(), c->index);
    return;
  }
  c->live.strings = gs[0];
  c->live.kernel = gs[1];
  c->live.clock_sync = gs[2];
  c->live.graph_node = gs[3];
  c->live.eager_launch = gs[4];
  c->live.device_event = gs.back();
  writes_live_bind(c, std::vector<kvconv::LiveGroup>(gs.begin() + 5, gs.end() - 1));
}

Ctx* get_ctx(CUcontext c, int device) {
  thread_local CUcontext t_c = nullptr;
  thread_local Ctx* t_p = nullptr;
  thread_local uint64_t t_gen = ~0ull;
  uint64_t gen = g_gen.load(std::memory_order_acquire);
  if (c == t_c && t_p && gen == t_gen) return t_p;
  std::lock_guard<std::mutex> lk(g_mu);
  auto it = g_live.find(c);
  Ctx* p;
  if (it != g_live.end()) {
    p = it->second;
  } else {
    p = new Ctx();
    p->ctx = c;
    p->index = static_cast<uint32_t>(g_all.size());
    p->device = device < 0 ? 0 : device;
    reserve_live(p);
    g_all.push_back(p);
    g_live[c] = p;
    logf(1, "context %u (device %d) seen", p->index, p->device);
  }
  if (device >= 0) p->device = device;
  t_c = c;
  t_p = p;
  t_gen = gen;
  return p;
}

// Take a context out of the live set (its teardown has begun).
Ctx* retire_ctx(CUcontext ctx) {
  std::lock_guard<std::mutex> lk(g_mu);
  auto it = g_live.find(ctx);
  if (it == g_live.end()) return nullptr;
  Ctx* c = it->second;
  c->alive = false;
  g_live.erase(it);
  g_gen.fetch_add(1, std::memory_order_release);
  return c;
}

std::vector<Ctx*> contexts_where(bool (*pred)(const Ctx*)) {
  std::lock_guard<std::mutex> lk(g_mu);
  std::vector<Ctx*> out;
  for (auto* c : g_all)
    if (pred(c)) out.push_back(c);
  return out;
}

}  // namespace kvtr
