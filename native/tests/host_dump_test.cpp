// Host-only test program (no CUDA, no GPU): writes a synthetic dump with the tracer's own writer
// (src/dump_writer.cpp), so CI checks that what the tracer writes is what kvconv.dump reads.
// tests/test_native.py runs it and compares every field with the values below.
//
// Contents (context 0, device 0; context 1, device 1 with one eager launch, to exercise several contexts):
//   kernel slot 1 "reshape_and_cache_flash_kernel" in module 0xabc0
//   eager launch: grid (3,1,1), block (128,1,1), grid_id 5 -> 3 device events (blocks 0..2)
//   graph exec 0x1000, nodes 0x2001 and 0x2002 (grid_ids 7 and 8), replays 1..2, tag = replay -> 4 device events
//   3 clock-sync pairs (start, periodic, end); device capacity 16, 1 device drop; host capacity 8, 0 drops
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "dump_writer.h"

using namespace kvconv;

static kvconv_host_launch_t launch(uint64_t exec, uint64_t id, uint64_t node, uint64_t grid_id, uint32_t gx,
                                   uint32_t flags, uint64_t tag, uint64_t ns) {
  kvconv_host_launch_t r;
  std::memset(&r, 0, sizeof r);
  r.graph_exec = exec;
  r.launch_id = id;
  r.node = node;
  r.grid_id = grid_id;
  r.stream = 0x51;
  r.api_stream = 0x51;
  r.host_ns = ns;
  r.grid_x = gx;
  r.grid_y = r.grid_z = 1;
  r.block_dim_x = 128;
  r.block_dim_y = r.block_dim_z = 1;
  r.kernel_slot = 1;
  r.flags = flags;
  r.tag = tag;
  return r;
}

static kvconv_device_event_t event(uint64_t seq, uint64_t grid_id, uint64_t tag, uint32_t bx, uint64_t t) {
  kvconv_device_event_t e;
  std::memset(&e, 0, sizeof e);
  e.globaltimer = t;
  e.pc = 0x7f0000001000ull;
  e.gridid = grid_id;
  e.tag = tag;
  e.sequence = seq;
  e.kernel_slot = 1;
  e.block_x = bx;
  e.smid = static_cast<uint16_t>(seq % 132);
  e.kind = KVCONV_EVENT_KIND_BLOCK_ENTER;
  e.flags = KVCONV_EVENT_FLAGS_HAS_GRIDID | (tag ? KVCONV_EVENT_FLAGS_HAS_TAG : 0);
  return e;
}

static bool write_context(DumpWriter& w, uint32_t ctx, uint16_t dev, bool with_graph) {
  std::string strings;
  const std::string name = "reshape_and_cache_flash_kernel", mod = "module@0xabc0";
  kvconv_kernel_t k;
  std::memset(&k, 0, sizeof k);
  k.slot = 1;
  k.flags = 1;
  k.module_id = 0xabc0;
  k.name_off = 0;
  k.name_len = static_cast<uint32_t>(name.size());
  k.module_off = static_cast<uint32_t>(name.size());
  k.module_len = static_cast<uint32_t>(mod.size());
  strings = name + mod;
  w.add_bytes(KVCONV_KIND_STRINGS, strings, ctx, dev);
  GroupSpec g;
  g.context_id = ctx;
  g.device_id = dev;
  g.kind = KVCONV_KIND_KERNEL;
  g.record_size = sizeof k;
  g.record_count = 1;
  w.add_group(g, &k);

  std::vector<kvconv_clock_sync_t> cs(3);
  std::memset(cs.data(), 0, cs.size() * sizeof cs[0]);
  const uint32_t fl[3] = {KVCONV_CLOCK_SYNC_FLAGS_START, KVCONV_CLOCK_SYNC_FLAGS_PERIODIC, KVCONV_CLOCK_SYNC_FLAGS_END};
  for (uint32_t i = 0; i < 3; ++i) {
    cs[i].host_ns = 1000000000ull + i * 1000000ull;
    cs[i].gpu_ns = 5000000000ull + i * 1000000ull + 250;
    cs[i].uncertainty_ns = 1500 + i;
    cs[i].sequence = i;
    cs[i].flags = fl[i];
  }
  g.kind = KVCONV_KIND_CLOCK_SYNC;
  g.record_size = sizeof(kvconv_clock_sync_t);
  g.record_count = cs.size();
  w.add_group(g, cs.data());

  std::vector<kvconv_device_event_t> ev;
  std::vector<kvconv_host_launch_t> gn, el;
  uint64_t t = 5000100000ull;
  el.push_back(launch(0, 0, 0, 5, 3, KVCONV_LAUNCH_FLAGS_EAGER, 0, 1000100000ull));
  for (uint32_t b = 0; b < 3; ++b) ev.push_back(event(ev.size(), 5, 0, b, t += 1000));
  if (with_graph) {
    for (uint64_t replay = 1; replay <= 2; ++replay) {
      for (uint64_t n = 0; n < 2; ++n) {
        gn.push_back(launch(0x1000, replay, 0x2001 + n, 7 + n, 1,
                            KVCONV_LAUNCH_FLAGS_GRAPH_NODE | KVCONV_LAUNCH_FLAGS_HAS_TAG, replay,
                            1000200000ull + replay * 1000 + n));
        ev.push_back(event(ev.size(), 7 + n, replay, 0, t += 1000));
      }
    }
  }
  g.kind = KVCONV_KIND_DEVICE_EVENT;
  g.record_size = sizeof(kvconv_device_event_t);
  g.record_count = ev.size();
  g.capacity = 16;
  g.drop_count = with_graph ? 1 : 0;
  g.clock_domain = KVCONV_CLOCK_DOMAIN_GPU_GLOBALTIMER;
  w.add_group(g, ev.data());
  g.kind = KVCONV_KIND_GRAPH_NODE;
  g.record_size = sizeof(kvconv_host_launch_t);
  g.record_count = gn.size();
  g.capacity = 8;
  g.drop_count = 0;
  g.clock_domain = KVCONV_CLOCK_DOMAIN_HOST_MONOTONIC;
  w.add_group(g, gn.data());
  g.kind = KVCONV_KIND_EAGER_LAUNCH;
  g.record_count = el.size();
  return w.add_group(g, el.data());
}

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: host_dump_test OUT.kvdump\n");
    return 2;
  }
  DumpWriter w(argv[1]);
  if (!w.ok()) {
    std::fprintf(stderr, "host_dump_test: %s\n", w.error().c_str());
    return 1;
  }
  const std::string meta =
      "{\"tool\":\"kvconv-tracer\",\"tool_version\":\"host-test\",\"producer\":\"" + json_escape("host \"test\"\n") +
      "\",\"pid\":1,\"target_kernels\":[\"reshape_and_cache_flash_kernel\"],\"device_events_capacity\":16,"
      "\"host_table_capacity\":8,\"counters\":{\"fatal_count\":0,\"device_event_drops\":1,"
      "\"graph_node_table_drops\":0,\"eager_table_drops\":0,\"sanitizer_errors\":0,\"target_launches\":6}}";
  w.add_bytes(KVCONV_KIND_METADATA, meta, 0, 0);
  write_context(w, 0, 0, true);
  write_context(w, 1, 1, false);
  if (!w.commit()) {
    std::fprintf(stderr, "host_dump_test: %s\n", w.error().c_str());
    return 1;
  }
  // path expansion and the writability check, printed for the Python test to compare
  std::printf("expand %s\n", expand_path("out-%p-%c-%%.bin", 42, 3).c_str());
  std::printf("writable-missing-dir %s\n", check_writable("/nonexistent-kvconv-dir/x.bin").empty() ? "ok" : "error");
  std::printf("crc %08x\n", crc32("123456789", 9));
  return 0;
}
