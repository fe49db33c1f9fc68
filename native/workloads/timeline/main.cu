// node_timeline main: one CUDA graph of N units  S T S SIB S OTHER  (S: a one-thread %globaltimer stamp of another
// module), replayed R times; prints one JSON line: per kind (target / sibling / other), the medians over nodes and
// replays of pre (stamp before -> first block entry), body (first entry -> last exit), post (last exit -> stamp
// after), and the whole graph's GPU time (CUDA events). Usage: node_timeline [N=40] [R=200] [BLOCKS=8] [LATE=0]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <cuda_runtime.h>
#include <cstdint>
void launch_target(int, cudaStream_t, int, int, uint16_t*, const uint16_t*, const int*, int, unsigned long long*,
                   unsigned long long*, int);
void launch_other(cudaStream_t, int, int, uint16_t*, const uint16_t*, const int*, int, unsigned long long*,
                  unsigned long long*, int);
void launch_stamp(cudaStream_t, unsigned long long*, int);
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
  fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); exit(1); } } while (0)
static double mean(const std::vector<double>& v) {
  double t = 0; for (double x : v) t += x; return v.empty() ? -1 : t / v.size();
}
static double med(std::vector<double> v) {
  if (v.empty()) return -1; std::sort(v.begin(), v.end()); return v[v.size() / 2];
}
int main(int argc, char** argv) {
  const int N = argc > 1 ? atoi(argv[1]) : 40, R = argc > 2 ? atoi(argv[2]) : 200, B = argc > 3 ? atoi(argv[3]) : 8;
  const int D = 1024, T = 128, K = 3 * N;  // K kernel nodes with first/last; 3N+1 stamps
  uint16_t *dst, *src; int* slot; unsigned long long *first, *last, *stamps;
  CK(cudaMalloc(&dst, (size_t)4096 * D * 2)); CK(cudaMalloc(&src, (size_t)B * D * 2));
  CK(cudaMalloc(&slot, B * sizeof(int))); CK(cudaMalloc(&first, K * 8)); CK(cudaMalloc(&last, K * 8));
  CK(cudaMalloc(&stamps, (3 * N + 1) * 8));
  std::vector<int> hs(B); for (int b = 0; b < B; ++b) hs[b] = 17 * b + 3;
  CK(cudaMemcpy(slot, hs.data(), B * sizeof(int), cudaMemcpyHostToDevice));
  CK(cudaMemset(src, 1, (size_t)B * D * 2));
  cudaStream_t s; CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  // warm-up launches outside the graph (module loads, lazy loading)
  // LATE=1: the target's module is loaded (and patched) first, the other module after it
  const bool late = argc > 4 && atoi(argv[4]) == 1;
  if (late) {
    launch_target(0, s, B, T, dst, src, slot, D, first, last, 0); CK(cudaStreamSynchronize(s));
    launch_target(1, s, B, T, dst, src, slot, D, first, last, 0);
    launch_stamp(s, stamps, 0); launch_other(s, B, T, dst, src, slot, D, first, last, 0);
  } else {
    launch_stamp(s, stamps, 0); launch_target(0, s, B, T, dst, src, slot, D, first, last, 0);
    launch_target(1, s, B, T, dst, src, slot, D, first, last, 0); launch_other(s, B, T, dst, src, slot, D, first, last, 0);
  }
  CK(cudaStreamSynchronize(s));
  cudaGraph_t g; cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  CK(cudaMemsetAsync(first, 0xff, K * 8, s)); CK(cudaMemsetAsync(last, 0, K * 8, s));
  auto units = [&] {  // the N units S T S SIB S OTHER, on the capturing stream
    for (int i = 0; i < N; ++i) {
      launch_stamp(s, stamps, 3 * i);
      launch_target(0, s, B, T, dst, src, slot, D, first, last, 3 * i);
      launch_stamp(s, stamps, 3 * i + 1);
      launch_target(1, s, B, T, dst, src, slot, D, first, last, 3 * i + 1);
      launch_stamp(s, stamps, 3 * i + 2);
      launch_other(s, B, T, dst, src, slot, D, first, last, 3 * i + 2);
    }
  };
  units();
  launch_stamp(s, stamps, 3 * N);
  CK(cudaStreamEndCapture(s, &g)); CK(cudaGraphInstantiate(&ge, g, 0));
  const int execs = argc > 5 ? atoi(argv[5]) : 1;
  cudaGraphExec_t ge2 = nullptr;
  if (execs == 2 || execs == 3) CK(cudaGraphInstantiate(&ge2, g, 0));
  if (execs == 4) {  // the same units captured again: another graph, not another instantiation of this one
    cudaGraph_t g2;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    units();
    CK(cudaStreamEndCapture(s, &g2)); CK(cudaGraphInstantiate(&ge2, g2, 0));
  }
  if (execs == 5) {
    launch_target(0, s, B, T, dst, src, slot, D, first, last, 0); CK(cudaStreamSynchronize(s));
  }
  if (execs == 3) {
    CK(cudaGraphLaunch(ge2, s)); CK(cudaStreamSynchronize(s)); CK(cudaGraphExecDestroy(ge2)); ge2 = nullptr;
  }
  cudaEvent_t e0, e1; CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
  std::vector<double> gpu_us, pre[3], body[3], post[3], seg[3];
  std::vector<unsigned long long> hf(K), hl(K), hst(3 * N + 1);
  for (int r = 0; r < R + 10; ++r) {
    if (ge2) { CK(cudaGraphLaunch(ge2, s)); CK(cudaStreamSynchronize(s)); }  // its stamps are overwritten below
    CK(cudaEventRecord(e0, s)); CK(cudaGraphLaunch(ge, s)); CK(cudaEventRecord(e1, s));
    CK(cudaStreamSynchronize(s));
    if (r < 10) continue;
    float ms; CK(cudaEventElapsedTime(&ms, e0, e1)); gpu_us.push_back(ms * 1000.0);
    CK(cudaMemcpy(hf.data(), first, K * 8, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hl.data(), last, K * 8, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hst.data(), stamps, (3 * N + 1) * 8, cudaMemcpyDeviceToHost));
    for (int i = 0; i < N; ++i)
      for (int j = 0; j < 3; ++j) {
        const int k = 3 * i + j;
        const double a = (double)hst[k], z = (double)hst[k + 1];
        pre[j].push_back((double)hf[k] - a); body[j].push_back((double)hl[k] - (double)hf[k]);
        post[j].push_back(z - (double)hl[k]); seg[j].push_back(z - a);
      }
  }
  CK(cudaGetLastError());
  const char* names[3] = {"target", "sibling", "other"};
  printf("{\"nodes_per_kind\": %d, \"replays\": %d, \"blocks\": %d, \"other_module_loaded_after_target\": %s, "
         "\"execs\": %d, \"gpu_us_median\": %.2f", N, R, B, late ? "true" : "false", execs, med(gpu_us));
  for (int j = 0; j < 3; ++j)
    printf(", \"%s\": {\"pre_ns\": %.0f, \"body_ns\": %.0f, \"post_ns\": %.0f, \"stamp_to_stamp_ns\": %.0f, "
           "\"mean_pre_ns\": %.1f, \"mean_body_ns\": %.1f, \"mean_post_ns\": %.1f, \"mean_stamp_to_stamp_ns\": %.1f}",
           names[j], med(pre[j]), med(body[j]), med(post[j]), med(seg[j]), mean(pre[j]), mean(body[j]), mean(post[j]),
           mean(seg[j]));
  printf("}\n");
  return 0;
}
