// The device side's memory and how its events reach the dump file.
//
// One device allocation per context holds the state (slot counter, drop counter) and, right after it, the event
// buffer the patch writes: device memory, as fast for the patch as the tracer before the live file (pinned host
// memory made every patched kernel's stores cross PCIe: +0.1-0.4% of a step on the H200). A flusher thread copies the
// events that arrived into the file every KVCONV_FLUSH_MS with an ordinary async copy on its own non-blocking stream
// (never ordered with the program's work) into pinned staging memory, and publishes the complete ones. What a death
// can lose is what was launched since the last copy: every target launch adds its blocks to the device group's
// drop_count and every copy takes the published ones off, so drop_count bounds it at every instant.
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include "tracer.h"

namespace kvtr {

static const uint64_t kStageEvents = 16384;   // 1 MiB of pinned staging per context; more pending: several copies
static const uint64_t kAheadBytes = 256 << 10;  // file pages populated ahead of each table's end

// Called with c->mu held, inside a sanitizer callback, before the first patched module is patched.
// Behind the events: the node table and the tag cells of learned graph execs (graph_exec.cpp).
static uint64_t events_bytes() { return g_cfg.dev_cap * sizeof(kvconv_device_event_t); }
static uint64_t table_bytes() { return kNodeTableSlots * sizeof(kvconv_node_entry); }
static uint64_t cells_bytes() { return kTagCells * sizeof(uint64_t); }

static bool alloc_state(Ctx* c, uint64_t* state) {
  const uint64_t bytes = KVCONV_STATE_ALIGN + KVCONV_EVENTS_OFFSET + events_bytes() + table_bytes() + cells_bytes();
  void* p = nullptr;
  if (!SAN(sanitizerAlloc(c->ctx, &p, bytes))) return false;
  const uint64_t base = reinterpret_cast<uint64_t>(p);
  *state = (base + KVCONV_STATE_ALIGN - 1) & ~(KVCONV_STATE_ALIGN - 1);
  if (*state >> KVCONV_SLOT_SHIFT) {
    logf(0, "error: device address %#llx does not fit in %d bits; cannot encode callback data",
         (unsigned long long)*state, KVCONV_SLOT_SHIFT);
    return false;
  }
  return true;
}

bool setup_device(Ctx* c) {
  if (c->state_dev) return true;
  if (c->setup_failed) return false;
  c->setup_failed = true;  // until proven otherwise
  if (!c->live.device_event.valid()) return false;  // no room in the dump file: nothing to record into
  if (!SAN(sanitizerAddPatchesFromFile(g_cfg.patch_file.c_str(), c->ctx))) {
    logf(0, "error: cannot load the device patch %s", g_cfg.patch_file.c_str());
    return false;
  }
  c->patches_loaded = true;
  uint64_t state = 0;
  if (!alloc_state(c, &state)) return false;
  if (!SAN(sanitizerGetStreamHandle(c->ctx, nullptr, &c->null_stream))) c->null_stream = nullptr;
  static kvconv_dev_state init;  // pageable source; copied to staging before the call returns
  std::memset(&init, 0, sizeof init);
  init.events = state + KVCONV_EVENTS_OFFSET;
  init.capacity = g_cfg.dev_cap;
  init.table = init.events + events_bytes();
  init.table_mask = kNodeTableSlots - 1;
  init.cells = init.table + table_bytes();
  init.writes = writes_setup(c);  // 0 unless KVCONV_WRITES=1 (writes.cpp)
  init.flags = range_configured() ? KVCONV_STATE_RANGED : 0;  // the patch's order of tag and slot (tracer_shared.h)
  // The event buffer starts zeroed: the flusher reads slots the patch may not have written yet, and only a written
  // slot passes complete() (memory reused from an earlier allocation could otherwise hold a stale event). The node
  // table and the tag cells start empty (gridid 0, tag 0) for the same reason.
  if (!SAN(sanitizerMemset(reinterpret_cast<void*>(init.events), 0, events_bytes() + table_bytes() + cells_bytes(),
                           c->null_stream)))
    return false;
  if (!SAN(sanitizerMemcpyHostToDeviceAsync(reinterpret_cast<void*>(state), &init, sizeof init, c->null_stream)))
    return false;
  if (!SAN(sanitizerStreamSynchronize(c->null_stream))) return false;
  c->dev_events_addr = init.events;
  c->table_dev = init.table;
  c->cells_dev = init.cells;
  c->state_dev = state;
  c->setup_failed = false;
  logf(1, "context %u: %llu-event device buffer at %#llx, state at %#llx", c->index,
       (unsigned long long)g_cfg.dev_cap, (unsigned long long)init.events, (unsigned long long)state);
  return true;
}

// Complete: every 16-byte store of the patch has landed (each holds a field that is never 0 in a real event), at
// the slot its sequence names.
static bool complete(const kvconv_device_event_t& e, uint64_t k) {
  return e.globaltimer && e.pc && e.gridid && e.sequence == k && e.kernel_slot && e.kind;
}

// The flusher's stream and staging memory, made on its first copy (context pushed on the flusher thread).
static bool flusher_init(Ctx* c) {
  Flusher& f = c->fl;
  f.tried = true;
  void* h = nullptr;
  if (!g_drv.ok || !g_drv.streamSynchronize || g_drv.streamCreate(&f.stream, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS ||
      g_drv.memHostAlloc(&h, kStageEvents * sizeof(kvconv_device_event_t), CU_MEMHOSTALLOC_PORTABLE) != CUDA_SUCCESS) {
    logf(0, "warning: context %u: no stream or staging memory for the flusher; device events reach the dump file "
            "only at the end (a death loses them, counted as possibly lost)", c->index);
    return false;
  }
  f.stage = static_cast<kvconv_device_event_t*>(h);
  f.stage_cap = kStageEvents;
  if (!g_drv.memcpyDtoHAsync) f.via_sanitizer = SAN(sanitizerGetStreamHandle(c->ctx, f.stream, &f.san_stream));
  f.ok = g_drv.memcpyDtoHAsync || f.via_sanitizer;
  return f.ok;
}

// `bytes` from device address `src` into the staging memory (context pushed). The driver's async copy first; if it refuses
// the sanitizer's allocation as a source, the sanitizer's own copy on the same stream.
static bool copy_bytes_to_stage(Ctx* c, uint64_t src, size_t bytes) {
  Flusher& f = c->fl;
  if (!f.via_sanitizer) {
    CUresult r = g_drv.memcpyDtoHAsync(f.stage, static_cast<CUdeviceptr>(src), bytes, f.stream);
    if (r == CUDA_SUCCESS) r = g_drv.streamSynchronize(f.stream);
    if (r == CUDA_SUCCESS) return true;
    if (r != CUDA_ERROR_INVALID_VALUE || !SAN(sanitizerGetStreamHandle(c->ctx, f.stream, &f.san_stream))) {
      logf(0, "warning: context %u: device events cannot be copied out (CUDA error %d); the dump file keeps what "
              "was copied before, the rest is counted as possibly lost", c->index, static_cast<int>(r));
      return false;
    }
    f.via_sanitizer = true;
    logf(1, "context %u: the flusher copies through the sanitizer", c->index);
  }
  return SAN(sanitizerMemcpyDeviceToHost(f.stage, reinterpret_cast<void*>(src), bytes, f.san_stream)) &&
         SAN(sanitizerStreamSynchronize(f.san_stream));
}

static bool copy_to_stage(Ctx* c, uint64_t from, uint64_t n) {
  return copy_bytes_to_stage(c, c->dev_events_addr + from * sizeof(kvconv_device_event_t),
                             n * sizeof(kvconv_device_event_t));
}

// Staged events [from, from + n) -> the file: the complete prefix (while kernels run, only what was already complete
// one copy earlier: the four stores of an event still being written are then surely all landed). flush_mu held.
static uint64_t publish_staged(Ctx* c, uint64_t from, uint64_t n, bool settled) {
  kvconv::LiveGroup& g = c->live.device_event;
  if (g.count() != from) return 0;  // finish_device published meanwhile
  uint64_t k = 0;
  while (k < n && complete(c->fl.stage[k], from + k)) ++k;
  uint64_t upto = from + k;
  if (!settled) {
    upto = std::min(upto, std::max(c->fl.seen_end, from));
    c->fl.seen_end = from + k;
  }
  if (upto <= from || !g.backed(upto)) return 0;  // the file grows before the records land (live_file.h)
  std::memcpy(g.at(from), c->fl.stage, (upto - from) * sizeof(kvconv_device_event_t));
  if (!g.advance(from, upto)) return 0;
  g.sub_drops(upto - from);
  return upto - from;
}

uint64_t flush_events(Ctx* c, bool settled) {
  kvconv::LiveGroup& g = c->live.device_event;
  uint64_t from, n;
  {
    std::lock_guard<std::mutex> lk(c->flush_mu);
    if (c->finished || !c->state_dev || !g.valid() || c->dev_unreadable.load()) return 0;
    from = g.count();
    const uint64_t cap = std::min(g.capacity(), g_cfg.dev_cap);
    // drop_count: launched blocks not yet in the file (plus overflow): nothing pending, nothing to copy (idle)
    n = std::min(std::min(g.drops(), cap - from), kStageEvents);
    if (!n) return 0;
    c->copying = true;  // finish_device waits for the copy to end before it takes over
  }
  bool ok = g_drv.ok && g_drv.ctxPush(c->ctx) == CUDA_SUCCESS;
  if (ok) {
    ok = (c->fl.tried ? c->fl.ok : flusher_init(c)) && copy_to_stage(c, from, n);
    CUcontext popped;
    g_drv.ctxPop(&popped);
  }
  std::lock_guard<std::mutex> lk(c->flush_mu);
  c->copying = false;
  c->flush_cv.notify_all();
  if (!ok) {
    c->dev_unreadable.store(true);
    return 0;
  }
  return c->finished ? 0 : publish_staged(c, from, n, settled);
}

// Flusher thread: the file pages each table will be written next are made present and writable now, so that the
// launch callbacks (host rows) and the copies (events) never wait on a page fault.
void populate_ahead(Ctx* c) {
  static bool can = true;
  kvconv::LiveGroup* gs[3] = {&c->live.graph_node, &c->live.eager_launch, &c->live.device_event};
  for (int i = 0; i < 3 && can; ++i) {
    kvconv::LiveGroup& g = *gs[i];
    if (!g.valid()) continue;
    const uint64_t ahead = kAheadBytes / g.record_size();
    const uint64_t end = g.count() + g.drops();  // rows reserved or pending lie below this
    uint64_t& done = c->fl.ahead[i];
    if (done >= g.capacity() || done >= end + ahead / 2) continue;
    const uint64_t to = std::min(g.capacity(), end + ahead);
    if (!g.populate(std::max(done, g.count()), to)) {
      logf(1, "madvise(MADV_POPULATE_WRITE) unavailable: table appends take their page faults");
      can = false;
    }
    done = to;
  }
}

void count_launched_blocks(Ctx* c, uint64_t blocks) {
  if (!c->state_dev) return;
  // the slot writes of these blocks are not in the file until the flusher's next copy of the write table
  if (c->live.slot_write.valid()) c->live.slot_write.add_drops(blocks);
  if (!c->live.device_event.valid()) return;
  c->live.device_event.add_drops(blocks * ((g_cfg.enter ? 1 : 0) + (g_cfg.exit ? 1 : 0)));
}

bool begin_copy(Ctx* c) {
  std::lock_guard<std::mutex> lk(c->flush_mu);
  if (c->finished || !c->state_dev || c->dev_unreadable.load()) return false;
  c->copying = true;  // finish_device waits for the copy to end before it takes over
  return true;
}

void end_copy(Ctx* c) {
  std::lock_guard<std::mutex> lk(c->flush_mu);
  c->copying = false;
  c->flush_cv.notify_all();
}

// Through the flusher's staging memory, in pieces of its size (its own stream: never ordered with the program).
bool flusher_copy(Ctx* c, void* dst, uint64_t src, size_t bytes) {
  if (!g_drv.ok || g_drv.ctxPush(c->ctx) != CUDA_SUCCESS) return false;
  bool ok = c->fl.tried ? c->fl.ok : flusher_init(c);
  const size_t piece = c->fl.stage_cap * sizeof(kvconv_device_event_t);
  for (size_t done = 0; ok && done < bytes; done += piece) {
    const size_t n = std::min(piece, bytes - done);
    ok = copy_bytes_to_stage(c, src + done, n);
    if (ok) std::memcpy(static_cast<char*>(dst) + done, c->fl.stage, n);
  }
  CUcontext popped;
  g_drv.ctxPop(&popped);
  return ok;
}

// The final copy (sanitizer copy on the NULL stream: valid inside a callback and at exit): events [count, reserved)
// in chunks, the complete prefix published.
static void copy_rest(Ctx* c, uint64_t reserved) {
  kvconv::LiveGroup& g = c->live.device_event;
  std::vector<kvconv_device_event_t> evs;
  while (g.count() < reserved) {
    const uint64_t from = g.count(), n = std::min<uint64_t>(reserved - from, 65536);
    evs.resize(n);
    if (!SAN(sanitizerMemcpyDeviceToHost(evs.data(), reinterpret_cast<void*>(c->dev_events_addr + from * sizeof evs[0]),
                                         n * sizeof evs[0], c->null_stream)))
      return;
    uint64_t k = 0;
    while (k < n && complete(evs[k], from + k)) ++k;
    if (!k || !g.put(evs.data(), k)) return;
    g.sub_drops(k);
    if (k < n) return;  // a slot reserved but never written: the rest is not a prefix any more
  }
}

// Final copy-out. `synchronize`: wait for the context's work first (not inside a sanitizer callback). With the
// device state readable, drops are exact (overflow + slots reserved whose record never landed); without it (a
// sticky CUDA error) the group keeps its running count of launched blocks not in the file: an upper bound.
void finish_device(Ctx* c, bool synchronize) {
  std::unique_lock<std::mutex> lk(c->flush_mu);
  if (c->finished) return;
  c->finished = true;
  // A flusher copy in progress ends first; bounded, in case it waits on a driver lock the caller holds (teardown).
  c->flush_cv.wait_for(lk, std::chrono::milliseconds(200), [c] { return !c->copying; });
  if (!c->state_dev) return;
  if (synchronize) sync_context(c->ctx);
  kvconv_dev_state st;
  std::memset(&st, 0, sizeof st);
  c->dev_state_read = SAN(sanitizerMemcpyDeviceToHost(&st, reinterpret_cast<void*>(c->state_dev), sizeof st,
                                                       c->null_stream));
  const uint64_t reserved = std::min<uint64_t>(st.next, g_cfg.dev_cap);
  if (c->dev_state_read && c->live.device_event.valid()) copy_rest(c, reserved);
  if (c->dev_state_read) writes_finish(c);
  const uint64_t published = c->live.device_event.count();
  if (c->dev_state_read) {
    c->dev_next = st.next;
    c->dev_drops = st.drops;
    c->dev_drops_graph = st.drops_graph;
    c->dev_lost_unwritten = reserved > published ? reserved - published : 0;
    c->live.device_event.set_drops(c->dev_drops + c->dev_lost_unwritten);
  }
}

}  // namespace kvtr
