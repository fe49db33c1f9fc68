// The write-address canary's host side (issue 16): which KV slots each block of a target kernel wrote.
//
// With KVCONV_WRITES=1 every patched module also gets SANITIZER_INSTRUCTION_GLOBAL_MEMORY_ACCESS patched with
// kvconv_mem_access (writes_patch.cuh); the patch aggregates a target block's stores into one slot_write record per
// (launch, replay tag, block, slot) in a device hash table of KVCONV_WRITE_CAPACITY entries (writes_shared.h), stores
// that find no room counted. Which memory is a KV cache comes from the run: KVCONV_CACHES (static addresses) and
// kvconv_register_cache(), which the Python probe calls through ctypes (kvconv.capture.probe.writes.register_cache);
// the probe also hands over each step's slot mapping (kvconv_record_step). At the end (finish_device) the table is
// copied out and written as the context's cache, slot_write, write_step and slot_map groups (docs/FORMAT.md).
// The slot_write group reaches the dump only then: a process that dies before has none (docs/TRACER.md).
#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "tracer.h"
#include "writes_shared.h"

namespace kvtr {

namespace {

struct WritesCfg {
  bool on = false;
  uint64_t capacity = 1 << 18;  // hash entries (64 + 8 bytes each): 18 MiB of device memory per context
};

struct HostCache {
  kvconv_cache_t rec;
};

struct WCtx {
  uint64_t state = 0;                   // device kvconv_writes_state
  kvconv_writes_state* host = nullptr;  // its host image (the copy source must outlive the async copy)
  bool finished = false, read = false;
  uint64_t used = 0, drops = 0;
  std::vector<kvconv_slot_write_t> out;
};

std::mutex g_wmu;  // guards everything below
WritesCfg g_wcfg;
bool g_wcfg_loaded = false;
std::vector<HostCache> g_caches;
std::vector<kvconv_write_step_t> g_steps;
std::vector<kvconv_slot_map_t> g_map;
std::unordered_map<const Ctx*, WCtx> g_wctx;
const Ctx* g_steps_owner = nullptr;  // the context whose dump groups carry the steps (the first one with writes)

uint64_t parse_u64(const std::string& s, bool* ok) {
  char* end = nullptr;
  const unsigned long long v = strtoull(s.c_str(), &end, 0);
  *ok = !s.empty() && end && *end == 0;
  return v;
}

// Caller holds g_wmu. Sorted by base; no overlaps (checked at registration).
void fill_table(kvconv_writes_state* h) {
  std::vector<const HostCache*> v;
  for (auto& c : g_caches) v.push_back(&c);
  std::sort(v.begin(), v.end(), [](const HostCache* a, const HostCache* b) { return a->rec.base < b->rec.base; });
  h->n_caches = v.size();
  std::fill(std::begin(h->top), std::end(h->top), ~0ull);
  std::fill(std::begin(h->bases), std::end(h->bases), ~0ull);
  for (size_t i = 0; i < v.size(); ++i) h->bases[i] = v[i]->rec.base;
  for (size_t g = 0; g * 16 < v.size(); ++g) h->top[g] = v[g * 16]->rec.base;
  for (size_t i = 0; i < v.size(); ++i) {
    kvconv_dev_cache& d = h->caches[i];
    d.base = v[i]->rec.base;
    d.end = v[i]->rec.base + v[i]->rec.size;
    d.slot_bytes = v[i]->rec.slot_bytes;
    d.page_size = v[i]->rec.page_size;
    d.cache_id = v[i]->rec.cache_id;
    const uint32_t sb = v[i]->rec.slot_bytes;
    d.slot_shift = (sb & (sb - 1)) == 0 ? static_cast<unsigned int>(__builtin_ctz(sb)) : KVCONV_NO_SHIFT;
  }
}

// Caller holds g_wmu. Returns the cache id, or a negative value (logged).
int add_cache(const std::string& name, uint64_t base, uint64_t size, uint32_t slot_bytes, uint32_t page_size) {
  if (!base || !size || !slot_bytes || !page_size) {
    logf(0, "error: cache %s: base, size, slot_bytes and page_size must be nonzero; not registered", name.c_str());
    return -1;
  }
  if (g_caches.size() >= KVCONV_MAX_CACHES) {
    logf(0, "error: cache %s: more than %d caches; not registered", name.c_str(), KVCONV_MAX_CACHES);
    return -2;
  }
  for (auto& c : g_caches)
    if (base < c.rec.base + c.rec.size && c.rec.base < base + size) {
      logf(0, "error: cache %s [%#llx, +%llu) overlaps a registered cache; not registered", name.c_str(),
           (unsigned long long)base, (unsigned long long)size);
      return -3;
    }
  HostCache h;
  std::memset(&h.rec, 0, sizeof h.rec);
  h.rec.base = base;
  h.rec.size = size;
  h.rec.slot_bytes = slot_bytes;
  h.rec.page_size = page_size;
  h.rec.cache_id = static_cast<uint32_t>(g_caches.size());
  std::memcpy(h.rec.name, name.data(), std::min(name.size(), sizeof h.rec.name));
  g_caches.push_back(h);
  logf(1, "cache %u %s: [%#llx, +%llu), %u bytes per slot, %u slots per page", h.rec.cache_id, name.c_str(),
       (unsigned long long)base, (unsigned long long)size, slot_bytes, page_size);
  return static_cast<int>(h.rec.cache_id);
}

// KVCONV_CACHES="name=base:size:slot_bytes:page_size;..." (numbers decimal or 0x...).
void load_env_caches() {
  const char* v = getenv("KVCONV_CACHES");
  if (!v || !*v) return;
  std::string all = v;
  size_t pos = 0;
  while (pos <= all.size()) {
    size_t end = all.find(';', pos);
    if (end == std::string::npos) end = all.size();
    const std::string item = all.substr(pos, end - pos);
    pos = end + 1;
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    std::vector<uint64_t> nums;
    bool ok = eq != std::string::npos;
    for (size_t p = eq + 1; ok && p <= item.size();) {
      size_t c = item.find(':', p);
      if (c == std::string::npos) c = item.size();
      nums.push_back(parse_u64(item.substr(p, c - p), &ok));
      p = c + 1;
    }
    if (!ok || nums.size() != 4 || nums[2] > 0xFFFFFFFFull || nums[3] > 0xFFFFFFFFull) {
      logf(0, "error: KVCONV_CACHES entry '%s' is not name=base:size:slot_bytes:page_size; ignored", item.c_str());
      continue;
    }
    add_cache(item.substr(0, eq), nums[0], nums[1], static_cast<uint32_t>(nums[2]), static_cast<uint32_t>(nums[3]));
  }
}

const WritesCfg& wcfg() {  // caller holds g_wmu
  if (!g_wcfg_loaded) {
    g_wcfg_loaded = true;
    const char* on = getenv("KVCONV_WRITES");
    g_wcfg.on = on && *on && strcmp(on, "0") != 0;
    if (const char* cap = getenv("KVCONV_WRITE_CAPACITY"); cap && *cap) {
      bool ok = false;
      uint64_t n = parse_u64(cap, &ok);
      if (!ok || n < 1024) {
        logf(0, "error: KVCONV_WRITE_CAPACITY=%s is not a number >= 1024; using %llu", cap,
             (unsigned long long)g_wcfg.capacity);
      } else {
        uint64_t p = 1;
        while (p < n) p <<= 1;
        g_wcfg.capacity = p;
      }
    }
    if (g_wcfg.on) load_env_caches();
  }
  return g_wcfg;
}

// Push the cache table to one context's device state (outside a callback: the context pushed on this thread).
bool push_table(Ctx* c, WCtx& w) {
  fill_table(w.host);
  const size_t off = offsetof(kvconv_writes_state, n_caches);
  const size_t bytes = sizeof(kvconv_writes_state) - off;
  if (!g_drv.ok || g_drv.ctxPush(c->ctx) != CUDA_SUCCESS) {
    logf(0, "error: context %u: cannot make the context current to update its cache table", c->index);
    return false;
  }
  relaxed_capture_mode();
  bool ok = SAN(sanitizerMemcpyHostToDeviceAsync(reinterpret_cast<void*>(w.state + off),
                                                 reinterpret_cast<char*>(w.host) + off, bytes, c->null_stream));
  ok = ok && SAN(sanitizerStreamSynchronize(c->null_stream));
  CUcontext popped = nullptr;
  g_drv.ctxPop(&popped);
  return ok;
}

}  // namespace

bool writes_enabled() {
  std::lock_guard<std::mutex> lk(g_wmu);
  return wcfg().on;
}

bool writes_patch_module(CUmodule m) {
  if (!writes_enabled()) return true;
  return SAN(sanitizerPatchInstructions(SANITIZER_INSTRUCTION_GLOBAL_MEMORY_ACCESS, m, "kvconv_mem_access"));
}

// Inside setup_device (c->mu held, inside a callback, c->null_stream known): the device table, zeroed, and its state;
// setup_device synchronizes the null stream afterwards. Returns the state's device address, 0 when off or failed.
uint64_t writes_setup(Ctx* c) {
  std::lock_guard<std::mutex> lk(g_wmu);
  if (!wcfg().on) return 0;
  const uint64_t cap = g_wcfg.capacity;
  const uint64_t bytes = sizeof(kvconv_writes_state) + cap * (sizeof(kvconv_slot_write_t) + sizeof(uint64_t));
  void* p = nullptr;
  if (!SAN(sanitizerAlloc(c->ctx, &p, bytes))) {
    logf(0, "error: context %u: no device memory for the write table (%llu bytes); writes are not recorded", c->index,
         (unsigned long long)bytes);
    return 0;
  }
  WCtx& w = g_wctx[c];
  w.state = reinterpret_cast<uint64_t>(p);
  w.host = new kvconv_writes_state();  // lives as long as the context's state (never freed: contexts are not)
  std::memset(w.host, 0, sizeof *w.host);
  w.host->records = w.state + sizeof(kvconv_writes_state);
  w.host->keys = w.host->records + cap * sizeof(kvconv_slot_write_t);
  w.host->capacity = cap;
  w.host->limit = cap - cap / 8;  // 7/8 load at most: a probe run of 32 stays rare
  fill_table(w.host);
  if (!SAN(sanitizerMemset(p, 0, bytes, c->null_stream)) ||
      !SAN(sanitizerMemcpyHostToDeviceAsync(p, w.host, sizeof *w.host, c->null_stream))) {
    g_wctx.erase(c);
    return 0;
  }
  if (!g_steps_owner) g_steps_owner = c;
  logf(1, "context %u: write table of %llu entries at %#llx, %zu caches", c->index, (unsigned long long)cap,
       (unsigned long long)w.state, g_caches.size());
  return w.state;
}

// Inside finish_device, after the context's work is done: the table copied out and compacted.
void writes_finish(Ctx* c) {
  std::lock_guard<std::mutex> lk(g_wmu);
  auto it = g_wctx.find(c);
  if (it == g_wctx.end() || it->second.finished) return;
  WCtx& w = it->second;
  w.finished = true;
  kvconv_writes_state head;
  if (!SAN(sanitizerMemcpyDeviceToHost(&head, reinterpret_cast<void*>(w.state), offsetof(kvconv_writes_state, caches),
                                       c->null_stream)))
    return;
  w.used = head.used;
  w.drops = head.drops;
  const uint64_t cap = w.host->capacity, chunk = 65536;
  std::vector<uint64_t> keys(chunk);
  std::vector<kvconv_slot_write_t> recs(chunk);
  for (uint64_t from = 0; from < cap; from += chunk) {
    const uint64_t n = std::min(chunk, cap - from);
    if (!SAN(sanitizerMemcpyDeviceToHost(keys.data(), reinterpret_cast<void*>(w.host->keys + from * 8), n * 8,
                                         c->null_stream)) ||
        !SAN(sanitizerMemcpyDeviceToHost(recs.data(), reinterpret_cast<void*>(w.host->records + from * 64), n * 64,
                                         c->null_stream)))
      return;
    for (uint64_t i = 0; i < n; ++i) {
      if (!keys[i]) continue;
      kvconv_slot_write_t r = recs[i];
      r.addr_lo = ~r.addr_lo;  // kept complemented on the device (writes_shared.h)
      w.out.push_back(r);
    }
  }
  std::sort(w.out.begin(), w.out.end(), [](const kvconv_slot_write_t& a, const kvconv_slot_write_t& b) {
    if (a.gridid != b.gridid) return a.gridid < b.gridid;
    if (a.tag != b.tag) return a.tag < b.tag;
    if (a.block_z != b.block_z) return a.block_z < b.block_z;
    if (a.block_y != b.block_y) return a.block_y < b.block_y;
    if (a.block_x != b.block_x) return a.block_x < b.block_x;
    if (a.cache_id != b.cache_id) return a.cache_id < b.cache_id;
    return a.addr_lo < b.addr_lo;
  });
  w.read = true;
  logf(0, "context %u: %zu slot-write records (table %llu of %llu entries used), %llu stores dropped, %zu steps, "
          "%zu caches", c->index, w.out.size(), (unsigned long long)w.used, (unsigned long long)cap,
       (unsigned long long)w.drops, g_steps.size(), g_caches.size());
}

// The context's write groups in the finished dump (nothing for a context without write recording).
void write_writes(kvconv::DumpWriter& dw, const Ctx* c, kvconv::GroupSpec g) {
  std::lock_guard<std::mutex> lk(g_wmu);
  auto it = g_wctx.find(c);
  if (it == g_wctx.end()) return;
  const WCtx& w = it->second;
  std::vector<kvconv_cache_t> caches;
  for (auto& h : g_caches) caches.push_back(h.rec);
  g.clock_domain = KVCONV_CLOCK_DOMAIN_NONE;
  g.capacity = 0;
  g.drop_count = 0;
  g.kind = KVCONV_KIND_CACHE;
  g.record_size = sizeof(kvconv_cache_t);
  g.record_count = caches.size();
  dw.add_group(g, caches.data());
  g.kind = KVCONV_KIND_SLOT_WRITE;
  g.record_size = sizeof(kvconv_slot_write_t);
  g.record_count = w.out.size();
  g.capacity = w.host->limit;
  // Unread table (a sticky CUDA error): everything the table held is unknown; say so through the drop count.
  g.drop_count = w.read ? w.drops : std::max<uint64_t>(1, w.drops);
  dw.add_group(g, w.out.data());
  if (c != g_steps_owner) return;
  g.capacity = 0;
  g.drop_count = 0;
  g.kind = KVCONV_KIND_WRITE_STEP;
  g.record_size = sizeof(kvconv_write_step_t);
  g.record_count = g_steps.size();
  g.clock_domain = KVCONV_CLOCK_DOMAIN_HOST_MONOTONIC;
  dw.add_group(g, g_steps.data());
  g.kind = KVCONV_KIND_SLOT_MAP;
  g.record_size = sizeof(kvconv_slot_map_t);
  g.record_count = g_map.size();
  g.clock_domain = KVCONV_CLOCK_DOMAIN_NONE;
  dw.add_group(g, g_map.data());
}

}  // namespace kvtr

// ------------------------------------------------------------------ called by the probe (ctypes), any thread
// A KV cache: slot s at base + s * slot_bytes, page_size slots per page. Returns its cache id (>= 0) or < 0.
extern "C" __attribute__((visibility("default"))) int kvconv_register_cache(uint64_t base, uint64_t size,
                                                                          uint32_t slot_bytes, uint32_t page_size,
                                                                          const char* name) {
  using namespace kvtr;
  std::lock_guard<std::mutex> lk(g_wmu);
  if (!wcfg().on) return -10;  // KVCONV_WRITES is off: the probe says so
  const int id = add_cache(name ? name : "", base, size, slot_bytes, page_size);
  if (id < 0) return id;
  for (auto& kv : g_wctx) {
    Ctx* c = const_cast<Ctx*>(kv.first);
    if (!kv.second.finished && !push_table(c, kv.second)) return -4;
  }
  return id;
}

// One step: the target launches whose host records lie in [begin_ns, end_ns] (CLOCK_MONOTONIC) belong to it; token i
// maps to slots[i] for request requests[i] (flags[i]: KVCONV_SLOT_MAP_FLAGS_PAD for a padding row). Returns 0.
extern "C" __attribute__((visibility("default"))) int kvconv_record_step(uint64_t step, uint64_t begin_ns,
                                                                       uint64_t end_ns, uint32_t n,
                                                                       const int64_t* slots, const uint64_t* requests,
                                                                       const uint32_t* flags) {
  using namespace kvtr;
  std::lock_guard<std::mutex> lk(g_wmu);
  if (!wcfg().on) return -10;
  kvconv_write_step_t s;
  std::memset(&s, 0, sizeof s);
  s.step = step;
  s.begin_ns = begin_ns;
  s.end_ns = end_ns;
  s.map_first = static_cast<uint32_t>(g_map.size());
  s.map_count = n;
  for (uint32_t i = 0; i < n; ++i) {
    kvconv_slot_map_t m;
    std::memset(&m, 0, sizeof m);
    m.slot = slots[i];
    m.request_id = requests ? requests[i] : 0;
    m.token = i;
    m.flags = flags ? flags[i] : 0;
    g_map.push_back(m);
  }
  g_steps.push_back(s);
  return 0;
}
