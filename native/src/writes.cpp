// The write-address canary's host side (issue 16): which KV slots each block of a target kernel wrote.
//
// With KVCONV_WRITES=1 every patched module also gets SANITIZER_INSTRUCTION_GLOBAL_MEMORY_ACCESS patched with
// kvconv_mem_access (writes_patch.cuh); the patch aggregates a target block's stores into one slot_write record per
// (launch, replay tag, block, slot) in a device hash table of KVCONV_WRITE_CAPACITY entries (writes_shared.h), stores
// that find no room counted. Which memory is a KV cache comes from the run: KVCONV_CACHES (static addresses) and
// kvconv_register_cache(), which the Python probe calls through ctypes (kvconv.capture.probe.writes.register_cache);
// the probe also hands over each step's slot mapping (kvconv_record_step). At the end (finish_device) the table is
// copied out and written as the context's cache, slot_write, write_step and slot_map groups (docs/FORMAT.md).
// The live file holds them too (issue 49: SGLang's scheduler is SIGKILLed at shutdown, and the dump record sealed
// from its live file had no slot_write group at all): caches, steps and slot maps are put there as they are
// registered, and the flusher copies the device table into the live slot_write group once the context has been
// quiet for KVCONV_WRITES_SETTLE_MS (no target launch since; default 20) and at a crash. Until then the group's
// drop_count counts the blocks launched since its last copy, so a sealed dump never claims writes it lacks.
#include <algorithm>
#include <atomic>
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
  uint64_t settle_ns = 20000000;  // quiet time before the flusher copies the table into the live file
};

const uint64_t kLiveSteps = 1 << 16, kLiveMaps = 1 << 20;  // live write_step and slot_map reservations

struct HostCache {
  kvconv_cache_t rec;
};

struct WCtx {
  uint64_t state = 0;                   // device kvconv_writes_state
  kvconv_writes_state* host = nullptr;  // its host image (the copy source must outlive the async copy)
  bool finished = false, read = false;
  uint64_t used = 0, drops = 0;
  std::vector<kvconv_slot_write_t> out;
  // the live slot_write group: where each table entry's record is (position + 1; 0: not in the file yet)
  std::vector<uint32_t> pos;
  uint64_t pending_seen = 0, quiet_since = 0, counted_drops = 0, snapshots = 0;
};

std::mutex g_wmu;  // guards everything below
WritesCfg g_wcfg;
bool g_wcfg_loaded = false;
std::vector<HostCache> g_caches;
std::vector<kvconv_write_step_t> g_steps;
std::vector<kvconv_slot_map_t> g_map;
std::unordered_map<const Ctx*, WCtx> g_wctx;
const Ctx* g_steps_owner = nullptr;  // the context whose dump groups carry the steps (the first one with writes)
std::atomic<bool> g_wcfg_ready{false};
std::atomic<bool> g_live_steps_reserved{false};
uint64_t g_modules_instrumented = 0, g_modules_failed = 0;

uint64_t parse_u64(const std::string& s, bool* ok) {
  char* end = nullptr;
  const unsigned long long v = strtoull(s.c_str(), &end, 0);
  *ok = !s.empty() && end && *end == 0;
  return v;
}

// The finished dump's order of slot_write records: launch, replay, block, cache, address.
bool record_before(const kvconv_slot_write_t& a, const kvconv_slot_write_t& b) {
  if (a.gridid != b.gridid) return a.gridid < b.gridid;
  if (a.tag != b.tag) return a.tag < b.tag;
  if (a.block_z != b.block_z) return a.block_z < b.block_z;
  if (a.block_y != b.block_y) return a.block_y < b.block_y;
  if (a.block_x != b.block_x) return a.block_x < b.block_x;
  if (a.cache_id != b.cache_id) return a.cache_id < b.cache_id;
  return a.addr_lo < b.addr_lo;
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
    if (const char* st = getenv("KVCONV_WRITES_SETTLE_MS"); st && *st) {
      bool ok = false;
      const uint64_t ms = parse_u64(st, &ok);
      if (ok) g_wcfg.settle_ns = ms * 1000000ull;
      else logf(0, "error: KVCONV_WRITES_SETTLE_MS=%s is not a number; using 20", st);
    }
    if (g_wcfg.on) load_env_caches();
    g_wcfg_ready.store(true, std::memory_order_release);
  }
  return g_wcfg;
}

// ------------------------------------------------------------------ the live file's write groups (caller holds g_wmu)
void live_put_cache(const Ctx* c, const kvconv_cache_t& r) {
  kvconv::LiveGroup g = c->live.cache;  // a handle: the file holds the records
  if (g.valid()) g.put(&r, 1);
}

// One step and its slot map into the live groups of the context that has them; a step whose map finds no room is
// not put (its map_first would point past the slot_map group) and counted as a drop.
void live_put_step(const Ctx* c, const kvconv_write_step_t& s) {
  kvconv::LiveGroup ws = c->live.write_step, sm = c->live.slot_map;
  if (!ws.valid() || !sm.valid()) return;
  if (sm.count() != s.map_first || !sm.put(&g_map[s.map_first], s.map_count)) {
    ws.add_drops(1);
    return;
  }
  ws.put(&s, 1);
}

// Table entries [0, n) as copied from the device (addr_lo still complemented) into the live slot_write group: an
// entry already there is updated in place (its count and address range only grow; identity fields never change),
// new ones are appended in the finished dump's order. A record being updated when the process dies is one of two
// copies of the same record, field by field.
void live_publish(WCtx& w, kvconv::LiveGroup g, const kvconv_slot_write_t* recs, uint64_t base, uint64_t n,
                  bool complemented) {
  if (!g.valid()) return;
  std::vector<std::pair<uint32_t, kvconv_slot_write_t>> fresh;
  for (uint64_t i = base; i < base + n; ++i) {
    if (!recs[i - base].gridid) continue;  // empty, or claimed and its identity not written yet
    kvconv_slot_write_t r = recs[i - base];
    if (complemented) r.addr_lo = ~r.addr_lo;
    if (w.pos[i]) std::memcpy(g.at(w.pos[i] - 1), &r, sizeof r);
    else fresh.push_back({static_cast<uint32_t>(i), r});
  }
  std::sort(fresh.begin(), fresh.end(), [](const auto& a, const auto& b) { return record_before(a.second, b.second); });
  std::vector<kvconv_slot_write_t> rs;
  for (auto& f : fresh) rs.push_back(f.second);
  const uint64_t at = g.count();
  if (rs.empty() || !g.put(rs.data(), rs.size())) return;
  for (size_t k = 0; k < fresh.size(); ++k) w.pos[fresh[k].first] = static_cast<uint32_t>(at + k + 1);
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
  if (g_wcfg_ready.load(std::memory_order_acquire)) return g_wcfg.on;  // no lock: called under g_mu (context.cpp)
  std::lock_guard<std::mutex> lk(g_wmu);
  return wcfg().on;
}

bool writes_patch_module(CUmodule m) {
  if (!writes_enabled()) return true;
  const bool ok = SAN(sanitizerPatchInstructions(SANITIZER_INSTRUCTION_GLOBAL_MEMORY_ACCESS, m, "kvconv_mem_access"));
  if (t_own_module) return ok;  // the calibration's copy of the tracer's own kernel: not a program's module
  std::lock_guard<std::mutex> lk(g_wmu);
  ++(ok ? g_modules_instrumented : g_modules_failed);
  return ok;
}

std::vector<kvconv::GroupSpec> writes_live_specs(kvconv::GroupSpec g) {
  std::vector<kvconv::GroupSpec> out;
  if (!writes_enabled()) return out;
  auto add = [&](uint16_t kind, uint32_t size, uint64_t cap, uint16_t clock) {
    g.kind = kind;
    g.record_size = size;
    g.capacity = cap;
    g.clock_domain = clock;
    out.push_back(g);
  };
  add(KVCONV_KIND_CACHE, sizeof(kvconv_cache_t), KVCONV_MAX_CACHES, KVCONV_CLOCK_DOMAIN_NONE);
  add(KVCONV_KIND_SLOT_WRITE, sizeof(kvconv_slot_write_t), g_wcfg.capacity - g_wcfg.capacity / 8,
      KVCONV_CLOCK_DOMAIN_NONE);
  bool no = false;
  if (g_live_steps_reserved.compare_exchange_strong(no, true)) {  // the steps: one context's (the first's)
    add(KVCONV_KIND_WRITE_STEP, sizeof(kvconv_write_step_t), kLiveSteps, KVCONV_CLOCK_DOMAIN_HOST_MONOTONIC);
    add(KVCONV_KIND_SLOT_MAP, sizeof(kvconv_slot_map_t), kLiveMaps, KVCONV_CLOCK_DOMAIN_NONE);
  }
  return out;
}

void writes_live_bind(Ctx* c, const std::vector<kvconv::LiveGroup>& gs) {
  if (gs.size() < 2) return;
  c->live.cache = gs[0];
  c->live.slot_write = gs[1];
  if (gs.size() >= 4) {
    c->live.write_step = gs[2];
    c->live.slot_map = gs[3];
  }
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
    c->live.slot_write = kvconv::LiveGroup();  // no launch counted there: nothing will be copied (stays empty, 0 drops)
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
    c->live.slot_write = kvconv::LiveGroup();  // as above (before the context's state is set: no launch reads it yet)
    return 0;
  }
  w.pos.assign(cap, 0);
  if (!g_steps_owner || c->live.write_step.valid()) g_steps_owner = c;  // the live steps' context carries them
  for (auto& h : g_caches) live_put_cache(c, h.rec);
  for (auto& st : g_steps) live_put_step(c, st);
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
    // the live file gets the whole table too: a death while the finished dump is written keeps every write
    live_publish(w, c->live.slot_write, recs.data(), from, n, true);
  }
  if (c->live.slot_write.valid()) c->live.slot_write.set_drops(w.drops);
  std::sort(w.out.begin(), w.out.end(), record_before);
  w.read = true;
  if (w.out.empty())
    logf(0, "warning: context %u: --writes was asked and no slot write was recorded: %s", c->index,
         g_caches.empty() ? "no cache was registered" : "no target store was seen (metadata writes.not_recorded_reason)");
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

// Flusher thread, every flush: once the context's target launches have stopped and every launched block has entered
// (its block-enter event is in the file) for settle_ns, or at a crash, the device table is copied into the live
// slot_write group and the blocks launched before the copy are taken off its drop_count (not at a crash: blocks may
// still run). A quiet context with nothing launched since the last copy costs a lock and two loads.
void writes_flush(Ctx* c, bool force) {
  kvconv::LiveGroup g = c->live.slot_write;
  uint64_t pending, cap, records, state;
  bool quiet;
  {
    std::lock_guard<std::mutex> lk(g_wmu);
    auto it = g_wctx.find(c);
    if (it == g_wctx.end() || it->second.finished || !g.valid()) return;
    WCtx& w = it->second;
    const uint64_t d = g.drops();
    pending = d > w.counted_drops ? d - w.counted_drops : 0;  // blocks launched since the last copy
    if (!pending) return;
    const uint64_t now = now_ns();
    // Still launching, or blocks launched that have not all entered yet (their block-enter events are not all in
    // the file; a full event buffer cannot tell, and leaves it to the quiet time): an engine queues work ahead.
    const kvconv::LiveGroup& ev = c->live.device_event;
    const bool entering = ev.valid() && ev.drops() > 0 && ev.count() < ev.capacity();
    if (pending != w.pending_seen || entering) {
      w.pending_seen = pending;
      w.quiet_since = now;
    }
    quiet = now - w.quiet_since >= g_wcfg.settle_ns;
    if (!quiet && !force) return;
    cap = w.host->capacity;
    records = w.host->records;
    state = w.state;
  }
  if (!begin_copy(c)) return;
  kvconv_writes_state head;
  std::vector<kvconv_slot_write_t> recs(cap);
  const bool ok = flusher_copy(c, &head, state, offsetof(kvconv_writes_state, caches)) &&
                  flusher_copy(c, recs.data(), records, cap * sizeof(kvconv_slot_write_t));
  end_copy(c);
  if (!ok) return;
  std::lock_guard<std::mutex> lk(g_wmu);
  auto it = g_wctx.find(c);
  if (it == g_wctx.end() || it->second.finished) return;  // finish_device took over meanwhile (it publishes all)
  WCtx& w = it->second;
  live_publish(w, g, recs.data(), 0, cap, true);
  // Quiet: the blocks counted ended before the copy, their stores are in it. At a crash with blocks still running
  // they stay counted as possibly lost.
  if (quiet) g.sub_drops(pending);
  if (head.drops > w.counted_drops) g.add_drops(head.drops - w.counted_drops);  // stores the table had no room for
  w.counted_drops = std::max(w.counted_drops, static_cast<uint64_t>(head.drops));
  w.pending_seen = 0;
  ++w.snapshots;
  logf(1, "context %u: write table copied into the live file: %llu slot-write records, %llu blocks settled%s",
       c->index, (unsigned long long)g.count(), (unsigned long long)pending, quiet ? "" : " (crash: still counted)");
}

// The metadata's counters of the write canary (issue 49: a --writes run must say when nothing was recorded).
void writes_counters(kvconv::JsonWriter& j) {
  std::lock_guard<std::mutex> lk(g_wmu);
  if (!wcfg().on) return;
  uint64_t recs = 0, drops = 0, tables = 0, snaps = 0;
  for (auto& kv : g_wctx) {
    recs += kv.second.out.size();
    drops += kv.second.drops;
    tables += 1;
    snaps += kv.second.snapshots;
  }
  j.kv("writes_asked", 1).kv("writes_modules_instrumented", g_modules_instrumented);
  j.kv("writes_modules_not_instrumented", g_modules_failed).kv("writes_tables", tables);
  j.kv("writes_caches_registered", static_cast<uint64_t>(g_caches.size()));
  j.kv("writes_steps_recorded", static_cast<uint64_t>(g_steps.size())).kv("slot_write_records", recs);
  j.kv("writes_stores_dropped", drops).kv("writes_live_copies", snaps);
}

namespace {
// Caller holds g_wmu. Why a --writes run recorded no slot write, or "" when it recorded some.
std::string not_recorded_reason() {
  uint64_t recs = 0;
  bool unread = false, finished = false;
  for (auto& kv : g_wctx) {
    recs += kv.second.out.size();
    unread |= kv.second.finished && !kv.second.read;
    finished |= kv.second.finished;
  }
  if (recs) return "";
  if (!g_modules_instrumented) return "no module was instrumented for writes (no target kernel's module was patched)";
  if (g_wctx.empty()) return "no device write table (its allocation failed, or no context was set up)";
  if (unread) return "the device write table could not be read at the end";
  if (g_caches.empty()) return "no cache was registered (KVCONV_CACHES, or the probe's register_cache)";
  if (!finished) return "the process ended before its write table was copied out";
  return "no target kernel stored to global memory while recording (none ran, or all outside the capture range)";
}
}  // namespace

// The live file's metadata is written under the context registry's lock (context.cpp): no g_wmu taken there.
void writes_metadata(kvconv::JsonWriter& j, bool live) {
  if (!writes_enabled()) return;
  j.key("writes").begin_object().kv("asked", true);
  if (!live) {
    std::lock_guard<std::mutex> lk(g_wmu);
    const std::string why = not_recorded_reason();
    j.kv("recorded", why.empty());
    if (!why.empty()) j.kv("not_recorded_reason", why);
  }
  j.end_object();
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
  for (auto& kv : g_wctx) live_put_cache(kv.first, g_caches.back().rec);
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
  if (g_steps_owner) live_put_step(g_steps_owner, s);  // before the owner's set-up: put there at its set-up
  return 0;
}
