/* CUDA-graph capture is refused, not replayed wrongly: an operation enqueued on a stream under
 * capture returns TPF_EUNSUPPORTED with a message naming the communicator, captures no node into
 * the graph, and leaves the communicator usable: the same operation outside the capture runs. */
#include "tpflex/tpflex.h"
#include "tpflex/tpflex_cuda.h"

#include <cuda_runtime.h>
#include <stdio.h>
#include <string.h>

#define CHECK(cond, ...)                                                                           \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                         \
      fprintf(stderr, __VA_ARGS__);                                                                \
      fprintf(stderr, "\n");                                                                       \
      return 1;                                                                                    \
    }                                                                                              \
  } while (0)

enum { C = 64, H = 32, N = 16 };

int main(void) {
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
    printf("skipped: no GPU\n");
    return 77;
  }
  tpf_cuda_threads *g = NULL;
  tpf_bootstrap boot;
  tpf_backend *be = NULL;
  tpf_comm *c = NULL;
  CHECK(tpf_cuda_threads_create(1, &g) == TPF_OK, "threads: %s", tpf_last_error());
  CHECK(tpf_cuda_threads_bootstrap(g, 0, 0, &boot) == TPF_OK, "boot: %s", tpf_last_error());
  CHECK(tpf_cuda_backend_create(&boot, &be) == TPF_OK, "backend: %s", tpf_last_error());
  tpf_comm_config cfg = {.name = "fc1_fprop",
                         .algo = TPF_ALGO_RING,
                         .coll = TPF_COLL_AG,
                         .dtype = TPF_FP32,
                         .capacity = {C, H}};
  CHECK(tpf_comm_create(be, &cfg, &c) == TPF_OK, "create: %s", tpf_last_error());
  float *w = NULL, *d = NULL;
  CHECK(cudaMalloc((void **)&w, sizeof(float) * N * H) == cudaSuccess, "cudaMalloc w");
  CHECK(cudaMalloc((void **)&d, sizeof(float) * C * N) == cudaSuccess, "cudaMalloc d");
  cudaMemset(w, 0, sizeof(float) * N * H);
  tpf_matrix wm = {w, N, H, H, TPF_FP32}, dm = {d, C, N, N, TPF_FP32};
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess, "stream");

  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess, "capture");
  tpf_status st = tpf_ag_gemm(c, &wm, &dm, s);
  cudaGraph_t graph = NULL;
  CHECK(cudaStreamEndCapture(s, &graph) == cudaSuccess, "end capture");
  size_t nodes = 99;
  CHECK(cudaGraphGetNodes(graph, NULL, &nodes) == cudaSuccess, "graph nodes");
  cudaGraphDestroy(graph);
  CHECK(st == TPF_EUNSUPPORTED, "under capture: %s (%s), expected TPF_EUNSUPPORTED",
        tpf_status_name(st), tpf_last_error());
  CHECK(strstr(tpf_last_error(), "fc1_fprop") && strstr(tpf_last_error(), "captur"),
        "message does not name the communicator and the capture: %s", tpf_last_error());
  CHECK(nodes == 0, "the refused operation captured %zu graph nodes", nodes);
  printf("under capture: %s: %s (0 nodes captured)\n", tpf_status_name(st), tpf_last_error());

  st = tpf_ag_gemm(c, &wm, &dm, s);
  CHECK(st == TPF_OK, "outside capture: %s (%s)", tpf_status_name(st), tpf_last_error());
  CHECK(cudaStreamSynchronize(s) == cudaSuccess, "sync");
  printf("outside capture: TPF_OK\n");
  tpf_comm_destroy(c);
  cudaFree(w);
  cudaFree(d);
  cudaStreamDestroy(s);
  tpf_cuda_backend_destroy(be);
  tpf_cuda_threads_destroy(g);
  printf("test_cuda_capture: OK\n");
  return 0;
}
