// Host records, written straight into the context's live groups of the dump file: graph-node and eager-launch rows
// (lock-free, many launching threads), the kernel table and its strings (under the context's lock).
#include <cstddef>
#include <cstdio>
#include <cstring>

#include "tracer.h"

namespace kvtr {

kvconv_host_launch_t host_record(const Sanitizer_LaunchData& ld, uint32_t slot) {
  kvconv_host_launch_t r;
  std::memset(&r, 0, sizeof r);
  r.grid_id = ld.gridId;
  r.stream = reinterpret_cast<uint64_t>(ld.stream);
  r.api_stream = reinterpret_cast<uint64_t>(ld.apiStream);
  r.host_ns = now_ns();
  r.grid_x = ld.gridDim_x;
  r.grid_y = ld.gridDim_y;
  r.grid_z = ld.gridDim_z;
  r.block_dim_x = ld.blockDim_x;
  r.block_dim_y = ld.blockDim_y;
  r.block_dim_z = ld.blockDim_z;
  r.kernel_slot = slot;
  return r;
}

// `flags` is never 0 in a host record (graph_node or eager): it is the row's "written" marker.
static const uint32_t kMarker = offsetof(kvconv_host_launch_t, flags);

static void launched(Ctx* c, const kvconv_host_launch_t& r) {
  count_launched_blocks(c, static_cast<uint64_t>(r.grid_x) * r.grid_y * r.grid_z);
}

void append_graph_node(Ctx* c, const kvconv_host_launch_t& r) {
  launched(c, r);
  if (c->live.graph_node.valid()) c->live.graph_node.append_marked(&r, kMarker, &c->graph_next);
}

void append_eager(Ctx* c, const kvconv_host_launch_t& r) {
  launched(c, r);
  if (c->live.eager_launch.valid()) c->live.eager_launch.append_marked(&r, kMarker, &c->eager_next);
}

std::string module_name(uint64_t module) {
  char mod[64];
  snprintf(mod, sizeof mod, "module@%#llx", (unsigned long long)module);
  return mod;
}

// Strings first, then the kernel record that points into them: a published kernel row never points past the
// published strings.
void add_kernel(Ctx* c, const KernelInfo& k) {
  kvconv::LiveGroup& s = c->live.strings;
  if (!s.valid() || !c->live.kernel.valid()) return;
  const std::string mod = module_name(k.module);
  const uint64_t off = s.count();
  kvconv_kernel_t r;
  std::memset(&r, 0, sizeof r);
  r.slot = k.slot;
  r.flags = 1;
  r.module_id = k.module;
  r.name_off = static_cast<uint32_t>(off);
  r.name_len = static_cast<uint32_t>(k.name.size());
  r.module_off = static_cast<uint32_t>(off + k.name.size());
  r.module_len = static_cast<uint32_t>(mod.size());
  const std::string both = k.name + mod;
  if (!s.put(both.data(), both.size())) {
    c->live.kernel.add_drops(1);
    return;
  }
  c->live.kernel.put(&r, 1);
}

}  // namespace kvtr
