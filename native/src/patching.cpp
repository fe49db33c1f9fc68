// Which modules and functions are targets, patching them, and the callback data every function of a patched module
// gets before it can run (never garbage: the seed's misaligned-address crash).
#include <cxxabi.h>

#include <cstdlib>
#include <cstring>

#include "tracer.h"

namespace kvtr {

static bool name_matches(const char* name) {
  if (!name) return false;
  for (auto& p : g_cfg.patterns)
    if (strstr(name, p.c_str())) return true;
  int st = 0;
  char* dem = abi::__cxa_demangle(name, nullptr, nullptr, &st);
  bool hit = false;
  if (dem && st == 0)
    for (auto& p : g_cfg.patterns)
      if (strstr(dem, p.c_str())) hit = true;
  free(dem);
  return hit;
}

bool cubin_has_target(const char* cubin, size_t size) {
  if (!cubin || !size) return true;  // unknown contents: patch (coverage first)
  for (auto& t : g_cfg.module_tokens) {
    if (t.empty()) return true;
    if (memmem(cubin, size, t.data(), t.size())) return true;
  }
  return false;
}

uint64_t encode(const Ctx* c, uint32_t slot, uint64_t tag) {
  if (!c->state_dev) return 0;
  return c->state_dev | (static_cast<uint64_t>(slot) << KVCONV_SLOT_SHIFT) | (tag & KVCONV_TAG_MASK);
}

bool patch_module(Ctx* c, CUmodule m) {  // c->mu held
  if (c->patched_modules.count(m)) return true;
  if (!setup_device(c)) return false;
  bool ok = true;
  if (g_cfg.enter) ok &= SAN(sanitizerPatchInstructions(SANITIZER_INSTRUCTION_BLOCK_ENTER, m, "kvconv_block_enter"));
  if (g_cfg.exit) ok &= SAN(sanitizerPatchInstructions(SANITIZER_INSTRUCTION_BLOCK_EXIT, m, "kvconv_block_exit"));
  ok &= writes_patch_module(m);
  ok &= SAN(sanitizerPatchModule(m));
  c->patched_modules.insert(m);
  c->modules_patched.fetch_add(1);
  logf(1, "context %u: patched module %p", c->index, (void*)m);
  return ok;
}

static uint32_t new_target(Ctx* c, const char* name, CUmodule m, bool launching) {  // c->mu held
  const uint32_t slot = static_cast<uint32_t>(c->kernels.size()) + 1;
  c->kernels.push_back({slot, reinterpret_cast<uint64_t>(m), name ? name : ""});
  add_kernel(c, c->kernels.back());
  logf(1, "context %u: target kernel slot %u: %s", c->index, slot, name ? name : "?");
  if (launching && !c->patched_modules.count(m)) {
    // The module check missed it (token not in the cubin bytes): patch now; blocks launched before are lost.
    logf(0, "warning: target %s is in a module that was not patched at load; patching at its launch",
         name ? name : "?");
    if (patch_module(c, m)) c->late_patched_modules.fetch_add(1);
  }
  return slot;
}

// Classify a function (target or not), give it function-level callback data if its module is patched.
// Returns the kernel slot (0 = not a target). Function-level data is set once and never changes: a stable pointer
// that lives as long as the context (the seed's lesson), NULL for non-targets.
uint32_t classify(Ctx* c, CUfunction f, const char* name, CUmodule m, bool launching) {
  std::lock_guard<std::mutex> lk(c->mu);
  uint32_t slot;
  auto it = c->fn_slot.find(f);
  if (it != c->fn_slot.end()) {
    slot = it->second;
  } else {
    slot = name_matches(name) ? new_target(c, name, m, launching) : 0;
    c->fn_slot[f] = slot;
  }
  if (c->patched_modules.count(m)) {
    logf(2, "context %u: function of a patched module: %s (slot %u)", c->index, name ? name : "?", slot);
    const uint64_t ud = slot ? encode(c, slot, 0) : 0;
    auto d = c->fn_data.find(f);
    if (d == c->fn_data.end() || d->second != ud) {
      if (SAN(sanitizerSetCallbackData(f, reinterpret_cast<void*>(ud)))) c->functions_given_data.fetch_add(1);
      c->fn_data[f] = ud;
    }
  }
  return slot;
}

void give_lazy_functions_data(Ctx* c, CUmodule m, const CUfunction* fns, uint32_t n) {
  std::lock_guard<std::mutex> lk(c->mu);
  if (!c->patched_modules.count(m)) return;
  logf(2, "context %u: %u lazily loaded functions of patched module %p", c->index, n, (void*)m);
  for (uint32_t i = 0; i < n; ++i) {
    CUfunction f = fns[i];
    auto it = c->fn_slot.find(f);
    const uint32_t slot = it == c->fn_slot.end() ? 0 : it->second;
    // Every function of a patched module gets data now (never garbage): unknown ones NULL; a target is recognised
    // by name at its first launch and given its own data then, before that launch runs.
    const uint64_t ud = slot ? encode(c, slot, 0) : 0;
    if (SAN(sanitizerSetCallbackData(f, reinterpret_cast<void*>(ud)))) c->functions_given_data.fetch_add(1);
    c->fn_data[f] = ud;
  }
}

}  // namespace kvtr
