// Host-only test program for the live dump (src/live_file.cpp), no CUDA: does what the tracer does to its file
// (metadata, one context's groups, kernel + strings, clock-sync pairs, device events copied out in batches with the
// launched blocks counted as possibly lost until then, host rows appended; then a second context's groups) and
// tests/test_native.py checks the file after it dies at any point.
//
//   live_test steps PATH          run to the end; print the number of steps (write points) taken
//   live_test die-at K PATH       SIGKILL itself at step K (every step is a point a real process can die at)
//   live_test big N PATH          a 2 GiB device-event reservation, N events published, then SIGKILL
//   live_test threads N PATH      N threads append host rows and events for ever, printing "ready" once going;
//                                 the test kills it with SIGKILL from outside
//
// Records follow a pattern the test recomputes: device event i has sequence i, globaltimer 1000+i, gridid 100+i/3,
// block_x i%3; host row i of a single-threaded run has grid_id 100+i, launch_id i+1, tag i+1, node 7*(100+i)+i+1; rows
// of a threaded run satisfy node == 7*grid_id + tag (a torn row would not).
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "live_file.h"

using namespace kvconv;

static long g_die_at = -1;
static long g_steps = 0;
static void on_step() {
  if (++g_steps == g_die_at) raise(SIGKILL);
}

static GroupSpec spec(uint16_t kind, uint32_t size, uint64_t cap, uint32_t ctx) {
  GroupSpec g;
  g.kind = kind;
  g.record_size = size;
  g.capacity = cap;
  g.context_id = ctx;
  g.device_id = static_cast<uint16_t>(ctx);
  g.clock_domain = kind == KVCONV_KIND_DEVICE_EVENT   ? KVCONV_CLOCK_DOMAIN_GPU_GLOBALTIMER
                   : kind >= KVCONV_KIND_GRAPH_NODE ? KVCONV_CLOCK_DOMAIN_HOST_MONOTONIC
                                                    : KVCONV_CLOCK_DOMAIN_NONE;
  return g;
}

// In the tracer's order (context.cpp): the device events last, so that their reservation is not on disk; returned
// as strings, kernel, clock_sync, device_event, graph_node, eager_launch.
// dev_cap > 0 (the big mode): the write canary's cache and slot_write groups too, before the device events, as the
// tracer reserves them with KVCONV_WRITES=1; returned after the six.
static std::vector<LiveGroup> add_context(LiveFile& f, uint32_t ctx, uint64_t cap = 4096, uint64_t dev_cap = 0) {
  std::vector<GroupSpec> specs = {spec(KVCONV_KIND_STRINGS, 1, 4096, ctx), spec(KVCONV_KIND_KERNEL, 32, 8, ctx),
                                  spec(KVCONV_KIND_CLOCK_SYNC, 32, 8, ctx), spec(KVCONV_KIND_GRAPH_NODE, 96, cap, ctx),
                                  spec(KVCONV_KIND_EAGER_LAUNCH, 96, 64, ctx)};
  if (dev_cap) {
    specs.push_back(spec(KVCONV_KIND_CACHE, sizeof(kvconv_cache_t), 256, ctx));
    specs.push_back(spec(KVCONV_KIND_SLOT_WRITE, sizeof(kvconv_slot_write_t), 229376, ctx));
  }
  specs.push_back(spec(KVCONV_KIND_DEVICE_EVENT, 64, dev_cap ? dev_cap : cap, ctx));
  std::vector<LiveGroup> gs;
  if (!f.add_groups(specs, &gs)) {
    std::fprintf(stderr, "live_test: %s\n", f.error().c_str());
    std::exit(1);
  }
  std::vector<LiveGroup> out = {gs[0], gs[1], gs[2], gs.back(), gs[3], gs[4]};
  if (dev_cap) out.insert(out.end(), {gs[5], gs[6]});
  return out;
}

static kvconv_device_event_t event(uint64_t i) {
  kvconv_device_event_t e;
  std::memset(&e, 0, sizeof e);
  e.globaltimer = 1000 + i;
  e.pc = 0x1000;
  e.gridid = 100 + i / 3;
  e.sequence = i;
  e.kernel_slot = 1;
  e.block_x = static_cast<uint32_t>(i % 3);
  e.kind = KVCONV_EVENT_KIND_BLOCK_ENTER;
  e.flags = KVCONV_EVENT_FLAGS_HAS_GRIDID;
  return e;
}

static kvconv_host_launch_t row(uint64_t grid_id, uint64_t tag) {
  kvconv_host_launch_t r;
  std::memset(&r, 0, sizeof r);
  r.graph_exec = 0x1000;
  r.launch_id = tag;
  r.node = 7 * grid_id + tag;
  r.grid_id = grid_id;
  r.host_ns = 5000 + tag;
  r.grid_x = 3;
  r.grid_y = r.grid_z = 1;
  r.block_dim_x = 128;
  r.block_dim_y = r.block_dim_z = 1;
  r.kernel_slot = 1;
  r.flags = KVCONV_LAUNCH_FLAGS_GRAPH_NODE | KVCONV_LAUNCH_FLAGS_HAS_TAG;
  r.tag = tag;
  return r;
}

static void add_kernel(std::vector<LiveGroup>& gs) {
  const std::string name = "reshape_and_cache_flash_kernel", mod = "module@0xabc0";
  kvconv_kernel_t k;
  std::memset(&k, 0, sizeof k);
  k.slot = 1;
  k.flags = 1;
  k.module_id = 0xabc0;
  k.name_off = static_cast<uint32_t>(gs[0].count());
  k.name_len = static_cast<uint32_t>(name.size());
  k.module_off = k.name_off + k.name_len;
  k.module_len = static_cast<uint32_t>(mod.size());
  const std::string both = name + mod;
  gs[0].put(both.data(), both.size());
  gs[1].put(&k, 1);
}

static void add_sync(LiveGroup& g, uint32_t i) {
  kvconv_clock_sync_t s;
  std::memset(&s, 0, sizeof s);
  s.host_ns = 1000000 + i;
  s.gpu_ns = 5000000 + i;
  s.uncertainty_ns = 1500;
  s.sequence = i;
  s.flags = i ? KVCONV_CLOCK_SYNC_FLAGS_PERIODIC : KVCONV_CLOCK_SYNC_FLAGS_START;
  g.put(&s, 1);
}

// One launch of 3 blocks: the blocks are counted as possibly lost at launch, then the host row, then (as the
// tracer's flusher does) the events copied out and taken off the possibly-lost count. Before each launch the pages
// the tables write next are populated (the flusher's populate_ahead): it must never change a byte of the file.
static bool g_populated = true;
static void launch(std::vector<LiveGroup>& gs, uint64_t i, uint64_t* next) {
  g_populated &= gs[4].populate(*next, *next + 50) && gs[3].populate(gs[3].count(), gs[3].count() + 70);
  gs[3].add_drops(3);
  const kvconv_host_launch_t r = row(100 + i, i + 1);
  gs[4].append_marked(&r, offsetof(kvconv_host_launch_t, flags), next);
  kvconv_device_event_t ev[3] = {event(3 * i), event(3 * i + 1), event(3 * i + 2)};
  if (gs[3].put(ev, 3)) gs[3].sub_drops(3);
}

static std::string meta() {
  return "{\"tool\":\"kvconv-tracer\",\"tool_version\":\"live-test\",\"written_at\":\"live\",\"pid\":" +
         std::to_string(static_cast<long>(getpid())) + "}";
}

static int sequential(const char* path) {
  g_live_step = on_step;
  LiveFile f;
  if (!f.create(path, meta())) return 1;
  std::vector<LiveGroup> gs = add_context(f, 0);
  add_kernel(gs);
  add_sync(gs[2], 0);
  uint64_t next = 0;
  for (uint64_t i = 0; i < 12; ++i) {
    launch(gs, i, &next);
    if (i == 5) add_sync(gs[2], 1);
  }
  std::vector<LiveGroup> g1 = add_context(f, 1);
  add_kernel(g1);
  uint64_t next1 = 0;
  for (uint64_t i = 0; i < 4; ++i) launch(g1, i, &next1);
  std::printf("steps %ld populate %d\n", g_steps, g_populated ? 1 : 0);
  return 0;
}

static int threaded(int n, const char* path) {
  LiveFile f;
  if (!f.create(path, meta())) return 1;
  std::vector<LiveGroup> gs = add_context(f, 0, 1 << 22);
  add_kernel(gs);
  static uint64_t next = 0;
  std::atomic<uint64_t> tags{1};
  std::vector<std::thread> ts;
  for (int t = 0; t < n; ++t)
    ts.emplace_back([&] {
      while (true) {
        const uint64_t tag = tags.fetch_add(1);
        const kvconv_host_launch_t r = row(100 + tag % 5, tag);
        if (!gs[4].append_marked(&r, offsetof(kvconv_host_launch_t, flags), &next)) return;  // full
      }
    });
  uint64_t i = 0;
  std::printf("ready\n");
  std::fflush(stdout);
  uint64_t ahead = 0;
  while (true) {  // the "flusher": events in batches of 3, bounded by the group's capacity; rows populated ahead
    const uint64_t end = gs[4].count() + gs[4].drops();
    if (ahead < end + 512) {
      gs[4].populate(end, end + 2048);  // beside the writers: pages they may be writing at this moment
      ahead = end + 2048;
    }
    if (i * 3 + 3 <= gs[3].capacity()) {
      gs[3].add_drops(3);
      kvconv_device_event_t ev[3] = {event(3 * i), event(3 * i + 1), event(3 * i + 2)};
      if (gs[3].put(ev, 3)) gs[3].sub_drops(3);
      ++i;
    }
  }
}

// A 2 GiB device-event reservation (the tracer's default on an 80 GB GPU) of which `n` events are published, then
// SIGKILL: the file must hold what was published, not the reservation.
static int big(uint64_t n, const char* path) {
  LiveFile f;
  if (!f.create(path, meta())) return 1;
  std::vector<LiveGroup> gs = add_context(f, 0, 65536, (2ull << 30) / 64);
  add_kernel(gs);
  kvconv_cache_t c;
  std::memset(&c, 0, sizeof c);
  c.base = 1ull << 32;
  c.size = 1024 * 2048;
  c.slot_bytes = 2048;
  c.page_size = 1;
  std::memcpy(c.name, "L0.k", 4);
  gs[6].put(&c, 1);
  uint64_t next = 0;
  for (uint64_t i = 0; i < n / 3; ++i) {
    launch(gs, i, &next);
    kvconv_slot_write_t w;  // block 0 of each launch wrote slot i of L0.k (as the flusher's copy of the table)
    std::memset(&w, 0, sizeof w);
    w.gridid = 100 + i;
    w.addr_lo = c.base + i * 2048;
    w.addr_hi = w.addr_lo + 2048;
    w.page = static_cast<uint32_t>(i);
    w.kernel_slot = 1;
    w.stores = 128;
    gs[7].put(&w, 1);
  }
  std::printf("published %llu\n", (unsigned long long)gs[3].count());
  std::fflush(stdout);
  raise(SIGKILL);
  return 0;
}

int main(int argc, char** argv) {
  if (argc == 4 && !std::strcmp(argv[1], "big")) return big(std::strtoull(argv[2], nullptr, 10), argv[3]);
  if (argc == 3 && !std::strcmp(argv[1], "steps")) return sequential(argv[2]);
  if (argc == 4 && !std::strcmp(argv[1], "die-at")) {
    g_die_at = std::atol(argv[2]);
    return sequential(argv[3]);
  }
  if (argc == 4 && !std::strcmp(argv[1], "threads")) return threaded(std::atoi(argv[2]), argv[3]);
  std::fprintf(stderr, "usage: live_test steps PATH | die-at K PATH | big N PATH | threads N PATH\n");
  return 2;
}
