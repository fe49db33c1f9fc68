// Which modules and functions are targets, patching them, and the callback data every function of a patched module
// gets before it can run (never garbage: the seed's misaligned-address crash).
#include <cxxabi.h>
#include <elf.h>

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

// The patches every target module gets (and the calibration's copy: the same instrumentation is what is measured).
static bool apply_patches(CUmodule m) {
  bool ok = true;
  if (g_cfg.enter) ok &= SAN(sanitizerPatchInstructions(SANITIZER_INSTRUCTION_BLOCK_ENTER, m, "kvconv_block_enter"));
  if (g_cfg.exit) ok &= SAN(sanitizerPatchInstructions(SANITIZER_INSTRUCTION_BLOCK_EXIT, m, "kvconv_block_exit"));
  ok &= writes_patch_module(m);
  ok &= SAN(sanitizerPatchModule(m));
  return ok;
}

bool patch_own_module(Ctx* c, CUmodule m) {  // c->mu held; the device is set up (calibration follows it)
  if (!c->state_dev || c->patched_modules.count(m)) return false;
  const bool ok = apply_patches(m);
  c->patched_modules.insert(m);
  return ok;
}

bool patch_module(Ctx* c, CUmodule m) {  // c->mu held
  if (c->patched_modules.count(m)) return true;
  if (!setup_device(c)) return false;
  const bool ok = apply_patches(m);
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
  if (auto own = c->own_fn.find(f); own != c->own_fn.end()) {  // the calibration's patched copy: its own buffer
    auto d = c->fn_data.find(f);
    if ((d == c->fn_data.end() || d->second != own->second) &&
        SAN(sanitizerSetCallbackData(f, reinterpret_cast<void*>(own->second))))
      c->fn_data[f] = own->second;
    return 0;
  }
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
    if (c->own_fn.count(f)) continue;  // given its data at its launch (classify)
    // Every function of a patched module gets data now (never garbage): unknown ones NULL; a target is recognised
    // by name at its first launch and given its own data then, before that launch runs.
    const uint64_t ud = slot ? encode(c, slot, 0) : 0;
    if (SAN(sanitizerSetCallbackData(f, reinterpret_cast<void*>(ud)))) c->functions_given_data.fetch_add(1);
    c->fn_data[f] = ud;
  }
}

// ------------------------------------------------------------------ loaded kernel names

static std::mutex g_loaded_mu;
static LoadedKernels g_loaded;                      // g_loaded_mu
static std::unordered_set<uint64_t> g_loaded_seen;  // FNV-1a of every distinct name seen (8 bytes a name)
static size_t g_loaded_bytes = 0, g_loaded_related = 0;

static uint64_t fnv1a(const char* s, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<unsigned char>(s[i])) * 1099511628211ull;
  return h;
}

// The global functions of an ELF64 image's symbol tables, `entries`: only the kernels (STO_CUDA_ENTRY in st_other)
// where the image marks them. Every offset is checked against the image's size (a damaged image lists nothing).
// Returns false when the image is not an ELF64 file with a symbol table.
static bool elf_functions(const char* img, size_t size, bool entries, std::vector<std::pair<const char*, size_t>>& out) {
  Elf64_Ehdr eh;
  if (!img || size < sizeof eh || memcmp(img, ELFMAG, SELFMAG) != 0 || img[EI_CLASS] != ELFCLASS64) return false;
  memcpy(&eh, img, sizeof eh);
  if (!eh.e_shoff || eh.e_shentsize != sizeof(Elf64_Shdr) || eh.e_shoff > size ||
      eh.e_shnum > (size - eh.e_shoff) / sizeof(Elf64_Shdr))
    return false;
  auto section = [&](size_t i) {
    Elf64_Shdr sh;
    memcpy(&sh, img + eh.e_shoff + i * sizeof sh, sizeof sh);
    return sh;
  };
  auto inside = [&](const Elf64_Shdr& sh) { return sh.sh_offset <= size && sh.sh_size <= size - sh.sh_offset; };
  bool any = false;
  for (size_t i = 0; i < eh.e_shnum; ++i) {
    const Elf64_Shdr sh = section(i);
    if (sh.sh_type != SHT_SYMTAB || sh.sh_entsize != sizeof(Elf64_Sym) || sh.sh_link >= eh.e_shnum || !inside(sh))
      continue;
    const Elf64_Shdr st = section(sh.sh_link);
    if (!inside(st)) continue;
    any = true;
    for (size_t k = 0; k < sh.sh_size / sizeof(Elf64_Sym); ++k) {
      Elf64_Sym sym;
      memcpy(&sym, img + sh.sh_offset + k * sizeof sym, sizeof sym);
      const int bind = ELF64_ST_BIND(sym.st_info);
      if (ELF64_ST_TYPE(sym.st_info) != STT_FUNC || (bind != STB_GLOBAL && bind != STB_WEAK)) continue;
      if (entries && !(sym.st_other & 0x10)) continue;  // STO_CUDA_ENTRY: a __global__ function
      if (sym.st_name >= st.sh_size) continue;
      const char* name = img + st.sh_offset + sym.st_name;
      const size_t n = strnlen(name, st.sh_size - sym.st_name);
      if (n && n < st.sh_size - sym.st_name) out.emplace_back(name, n);  // NUL-terminated inside the table
    }
  }
  return any;
}

// A name that shares kRelatedRun characters in a row with a -k pattern (the whole pattern when shorter): past the
// first kLoadedKernelsMax names, up to kLoadedKernelsRelated of these are still kept, so that a large process (a
// framework's kernels loaded first) still lists the kernels a mistyped pattern was meant for.
static const size_t kRelatedRun = 8, kLoadedKernelsRelated = 256;

static bool related(const char* name, size_t n) {
  const std::string s(name, n);
  for (auto& p : g_cfg.patterns) {
    if (p.empty()) continue;
    const size_t run = p.size() < kRelatedRun ? p.size() : kRelatedRun;
    for (size_t i = 0; i + run <= p.size(); ++i)
      if (s.find(p.data() + i, 0, run) != std::string::npos) return true;
  }
  return false;
}

void note_loaded_kernels(uint32_t ctx, const void* image, size_t size) {
  const char* img = static_cast<const char*>(image);
  std::vector<std::pair<const char*, size_t>> fns;
  bool elf = elf_functions(img, size, true, fns);
  if (elf && fns.empty()) elf = elf_functions(img, size, false, fns);  // no entry marks: every global function
  std::lock_guard<std::mutex> lk(g_loaded_mu);
  if (!elf) {
    g_loaded.images_unlisted++;
    return;
  }
  for (auto& [name, n] : fns) {
    if (!g_loaded_seen.insert(fnv1a(name, n)).second) continue;
    logf(2, "context %u: loaded kernel %.*s", ctx, static_cast<int>(n), name);
    if (g_loaded.names.size() >= kLoadedKernelsMax || g_loaded_bytes + n > kLoadedKernelsBytes) {
      if (g_loaded_related >= kLoadedKernelsRelated || n > 4096 || !related(name, n)) {
        g_loaded.dropped++;
        continue;
      }
      g_loaded_related++;  // past the bounds, a name a pattern was likely meant for (at most 256 x 4 KiB more)
    }
    g_loaded.names.emplace_back(name, n);
    g_loaded_bytes += n;
  }
}

LoadedKernels loaded_kernels() {
  std::lock_guard<std::mutex> lk(g_loaded_mu);
  return g_loaded;
}

}  // namespace kvtr
