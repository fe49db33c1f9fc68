// The device side's memory: the per-context state (slot counter, drop counter; device memory, one atomic per block)
// and the event buffer the patch writes, in pinned host memory so that what the GPU wrote outlives the context (an
// illegal-address error) and can be copied into the dump file while the program runs, without any CUDA call.
#include <algorithm>
#include <cstring>
#include <vector>

#include "tracer.h"

namespace kvtr {

// Called with c->mu held, inside a sanitizer callback, before the first patched module is patched.
static bool alloc_state(Ctx* c, uint64_t* state) {
  const uint64_t bytes = KVCONV_STATE_ALIGN + KVCONV_EVENTS_OFFSET;
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

// The event buffer: pinned host memory (its UVA address is its device address), zeroed so that a record not yet
// written reads as incomplete. Device memory if pinned memory cannot be had (then copied out only at the end).
static uint64_t alloc_events(Ctx* c) {
  const uint64_t bytes = g_cfg.dev_cap * sizeof(kvconv_device_event_t);
  void* h = nullptr;
  if (SAN(sanitizerAllocHost(c->ctx, &h, bytes)) && h) {
    std::memset(h, 0, bytes);
    CUdeviceptr d = reinterpret_cast<CUdeviceptr>(h);
    if (g_drv.memHostGetDevicePointer && g_drv.memHostGetDevicePointer(&d, h, 0) != CUDA_SUCCESS)
      d = reinterpret_cast<CUdeviceptr>(h);
    c->host_events.store(static_cast<kvconv_device_event_t*>(h), std::memory_order_release);
    return static_cast<uint64_t>(d);
  }
  logf(0, "warning: no pinned host memory for context %u's events: device memory, copied out only at the end",
       c->index);
  void* p = nullptr;
  if (!SAN(sanitizerAlloc(c->ctx, &p, bytes))) return 0;
  return reinterpret_cast<uint64_t>(p);
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
  init.events = alloc_events(c);
  init.capacity = g_cfg.dev_cap;
  if (!init.events) return false;
  if (!SAN(sanitizerMemcpyHostToDeviceAsync(reinterpret_cast<void*>(state), &init, sizeof init, c->null_stream)))
    return false;
  if (!SAN(sanitizerStreamSynchronize(c->null_stream))) return false;
  c->dev_events_addr = init.events;
  c->state_dev = state;
  c->setup_failed = false;
  if (c->host_events.load()) watch_for_crash(c);
  logf(1, "context %u: %llu-event buffer at %#llx (%s), state at %#llx", c->index, (unsigned long long)g_cfg.dev_cap,
       (unsigned long long)init.events, c->host_events.load() ? "pinned host" : "device", (unsigned long long)state);
  return true;
}

// Complete: every 16-byte store of the patch has landed (each holds a field that is never 0 in a real event), at
// the slot its sequence names. The buffer starts zeroed, so a slot not yet written fails.
static bool complete(const kvconv_device_event_t* e, uint64_t k) {
  const volatile kvconv_device_event_t* v = e;
  return v->globaltimer && v->pc && v->gridid && v->sequence == k && v->kernel_slot && v->kind;
}

uint64_t flush_events(Ctx* c, bool settled) {
  kvconv_device_event_t* ev = c->host_events.load(std::memory_order_acquire);
  kvconv::LiveGroup& g = c->live.device_event;
  if (!ev || !g.valid()) return 0;
  const uint64_t from = g.count(), cap = std::min(g.capacity(), g_cfg.dev_cap);
  uint64_t end = from;
  while (end < cap && complete(ev + end, end)) ++end;
  uint64_t upto = end;
  if (!settled) {  // while kernels run: copy only what was already complete one flush ago
    upto = std::min(end, c->seen_end.load(std::memory_order_relaxed));
    c->seen_end.store(end, std::memory_order_relaxed);
  }
  if (upto <= from) return 0;
  std::atomic_thread_fence(std::memory_order_acquire);
  std::memcpy(g.at(from), ev + from, (upto - from) * sizeof *ev);
  if (!g.advance(from, upto)) return 0;  // a crash flush got there first, with the same bytes
  g.sub_drops(upto - from);
  return upto - from;
}

void count_launched_blocks(Ctx* c, uint64_t blocks) {
  if (!c->state_dev || !c->live.device_event.valid()) return;
  c->live.device_event.add_drops(blocks * ((g_cfg.enter ? 1 : 0) + (g_cfg.exit ? 1 : 0)));
}

// Events in device memory (no pinned buffer): copied out now, the complete prefix published.
static void copy_from_device(Ctx* c, uint64_t reserved) {
  std::vector<kvconv_device_event_t> evs(reserved);
  if (reserved && !SAN(sanitizerMemcpyDeviceToHost(evs.data(), reinterpret_cast<void*>(c->dev_events_addr),
                                                   reserved * sizeof(kvconv_device_event_t), c->null_stream)))
    return;
  uint64_t k = 0;
  while (k < evs.size() && evs[k].sequence == k && evs[k].kind != 0) ++k;
  if (k && c->live.device_event.put(evs.data(), k)) c->live.device_event.sub_drops(k);
}

// Final copy-out. `synchronize`: wait for the context's work first (not inside a sanitizer callback). With the
// device state readable, drops are exact (overflow + slots reserved whose record never landed); without it (a
// sticky CUDA error) the group keeps its running count of launched blocks not in the file: an upper bound.
void finish_device(Ctx* c, bool synchronize) {
  std::lock_guard<std::mutex> lk(c->flush_mu);
  if (c->finished) return;
  c->finished = true;
  if (!c->state_dev) return;
  if (synchronize) sync_context(c->ctx);
  kvconv_dev_state st;
  std::memset(&st, 0, sizeof st);
  c->dev_state_read = SAN(sanitizerMemcpyDeviceToHost(&st, reinterpret_cast<void*>(c->state_dev), sizeof st,
                                                       c->null_stream));
  const uint64_t reserved = std::min<uint64_t>(st.next, g_cfg.dev_cap);
  if (c->host_events.load()) {
    flush_events(c, true);
  } else if (c->dev_state_read) {
    copy_from_device(c, reserved);
  }
  const uint64_t published = c->live.device_event.count();
  if (c->dev_state_read) {
    c->dev_next = st.next;
    c->dev_drops = st.drops;
    c->dev_lost_unwritten = reserved > published ? reserved - published : 0;
    c->live.device_event.set_drops(c->dev_drops + c->dev_lost_unwritten);
  }
  c->host_events.store(nullptr, std::memory_order_release);  // pinned memory goes with the context
}

}  // namespace kvtr
