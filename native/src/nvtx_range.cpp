// The capture range on a named NVTX range (KVCONV_CAPTURE_RANGE=nvtx:NAME): the tracer library is also the process's
// NVTX injection (NVTX_INJECTION64_PATH=libkvconv_tracer.so, which kvconv record sets). NVTX v3 loads it at a
// library's first NVTX call and hands it each module's function table; the tracer fills in the range calls only
// (push/pop, start/end, their domain forms, string registration) and opens the capture range when a range whose
// message is NAME begins, closing it when that range ends. nsys answers the same with --capture-range=nvtx.
//
// Being the injection, these functions are the NVTX calls of the process: they return what NVTX's contract says
// (a push's depth, a start's id, a registered string's handle) and do nothing else.
#if __has_include(<nvtx3/nvToolsExt.h>)  // the build found NVTX's headers (Makefile: NVTX_INC)
#include <atomic>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

#define NVTX_NO_IMPL
#include <nvtx3/nvToolsExt.h>

#include "tracer.h"

namespace kvtr {

namespace {

thread_local std::vector<bool> t_stack;  // this thread's pushed ranges: true for a NAME range
std::mutex g_nmu;
std::unordered_set<uint64_t> g_named_ids;  // start/end ranges (process-wide ids) that are NAME ranges
std::atomic<uint64_t> g_next_id{1};
std::vector<std::string*> g_strings;       // registered strings: the handle is the pointer (never freed)

const char* message_of(const nvtxEventAttributes_t* a) {
  if (!a) return nullptr;
  if (a->messageType == NVTX_MESSAGE_TYPE_ASCII) return a->message.ascii;
  if (a->messageType == NVTX_MESSAGE_TYPE_REGISTERED && a->message.registered)
    return reinterpret_cast<const std::string*>(a->message.registered)->c_str();
  return nullptr;  // wide strings are not matched
}

bool is_named(const char* msg) { return msg && nvtx_range_name() && !strcmp(msg, nvtx_range_name()); }

int push(const char* msg) {
  const bool named = is_named(msg);
  if (named) nvtx_range_edge(true, msg);
  t_stack.push_back(named);
  return static_cast<int>(t_stack.size()) - 1;
}

int pop() {
  if (t_stack.empty()) return -2;  // NVTX: a pop without a push
  if (t_stack.back()) nvtx_range_edge(false, nvtx_range_name());
  t_stack.pop_back();
  return static_cast<int>(t_stack.size());
}

nvtxRangeId_t start(const char* msg) {
  const nvtxRangeId_t id = g_next_id.fetch_add(1);
  if (is_named(msg)) {
    std::lock_guard<std::mutex> lk(g_nmu);
    g_named_ids.insert(id);
    nvtx_range_edge(true, msg);
  }
  return id;
}

void end(nvtxRangeId_t id) {
  std::lock_guard<std::mutex> lk(g_nmu);
  if (g_named_ids.erase(id)) nvtx_range_edge(false, nvtx_range_name());
}

int NVTX_API push_a(const char* m) { return push(m); }
int NVTX_API push_ex(const nvtxEventAttributes_t* a) { return push(message_of(a)); }
int NVTX_API pop_core() { return pop(); }
nvtxRangeId_t NVTX_API start_a(const char* m) { return start(m); }
nvtxRangeId_t NVTX_API start_ex(const nvtxEventAttributes_t* a) { return start(message_of(a)); }
void NVTX_API end_core(nvtxRangeId_t id) { end(id); }
int NVTX_API dom_push(nvtxDomainHandle_t, const nvtxEventAttributes_t* a) { return push(message_of(a)); }
int NVTX_API dom_pop(nvtxDomainHandle_t) { return pop(); }
nvtxRangeId_t NVTX_API dom_start(nvtxDomainHandle_t, const nvtxEventAttributes_t* a) { return start(message_of(a)); }
void NVTX_API dom_end(nvtxDomainHandle_t, nvtxRangeId_t id) { end(id); }
nvtxStringHandle_t NVTX_API dom_register(nvtxDomainHandle_t, const char* s) {
  std::lock_guard<std::mutex> lk(g_nmu);
  g_strings.push_back(new std::string(s ? s : ""));
  return reinterpret_cast<nvtxStringHandle_t>(g_strings.back());
}
nvtxDomainHandle_t NVTX_API dom_create(const char*) {  // any non-NULL handle: domains are not told apart
  static char domain;
  return reinterpret_cast<nvtxDomainHandle_t>(&domain);
}

void put(NvtxFunctionTable table, unsigned int size, unsigned int id, NvtxFunctionPointer fn) {
  if (table && id < size && table[id]) *table[id] = fn;
}

template <typename F>
NvtxFunctionPointer fp(F f) {
  return reinterpret_cast<NvtxFunctionPointer>(f);
}

}  // namespace

int nvtx_initialize(NvtxGetExportTableFunc_t get) {
  if (!load_capture_range() || !nvtx_range_name()) return 0;  // not asked for a named range: NVTX stays a no-op
  auto* cbs = static_cast<const NvtxExportTableCallbacks*>(get ? get(NVTX_ETID_CALLBACKS) : nullptr);
  if (!cbs || !cbs->GetModuleFunctionTable) return 0;
  NvtxFunctionTable t = nullptr;
  unsigned int n = 0;
  if (cbs->GetModuleFunctionTable(NVTX_CB_MODULE_CORE, &t, &n)) {
    put(t, n, NVTX_CBID_CORE_RangePushA, fp(push_a));
    put(t, n, NVTX_CBID_CORE_RangePushEx, fp(push_ex));
    put(t, n, NVTX_CBID_CORE_RangePop, fp(pop_core));
    put(t, n, NVTX_CBID_CORE_RangeStartA, fp(start_a));
    put(t, n, NVTX_CBID_CORE_RangeStartEx, fp(start_ex));
    put(t, n, NVTX_CBID_CORE_RangeEnd, fp(end_core));
  }
  if (cbs->GetModuleFunctionTable(NVTX_CB_MODULE_CORE2, &t, &n)) {
    put(t, n, NVTX_CBID_CORE2_DomainRangePushEx, fp(dom_push));
    put(t, n, NVTX_CBID_CORE2_DomainRangePop, fp(dom_pop));
    put(t, n, NVTX_CBID_CORE2_DomainRangeStartEx, fp(dom_start));
    put(t, n, NVTX_CBID_CORE2_DomainRangeEnd, fp(dom_end));
    put(t, n, NVTX_CBID_CORE2_DomainRegisterStringA, fp(dom_register));
    put(t, n, NVTX_CBID_CORE2_DomainCreateA, fp(dom_create));
  }
  logf(1, "NVTX injection: the capture range opens at NVTX range '%s'", nvtx_range_name());
  return 1;
}

}  // namespace kvtr

// NVTX's entry into an injection library (nvtxDetail/nvtxInit.h): once per NVTX instance (each library that embeds
// the headers has its own), so every instance's range calls come here.
extern "C" __attribute__((visibility("default"))) int InitializeInjectionNvtx2(NvtxGetExportTableFunc_t get) {
  return kvtr::nvtx_initialize(get);
}
#endif  // NVTX's headers
