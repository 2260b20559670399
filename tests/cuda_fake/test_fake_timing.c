/* Device timing while profiling (backend_cuda/cuda_timing.c, SPEC §16) over the fake CUDA runtime
 * (fake_cuda.h: events complete at once; cudaEventElapsedTime gives the host time between two
 * records, so no figure here is a GPU's). Two in-process ranks run RING AG and PIPELINE RS
 * operations; checked: off, nothing is timed; on, every operation is read without a wait (events
 * are queried, never synchronized), with op >= GEMMs, exposed = op - GEMMs, hidden <= both the
 * communication and the GEMMs; reset zeroes; a NULL name, a wrong size or a non-CUDA backend is
 * refused. The NVTX ranges and marks (backend_cuda/cuda_nvtx.c) of the same operations are
 * counted through a static NVTX injection: one range per operation and one mark per shape change
 * while profiling, none while not. Prints "fake timing: OK" when every check passes. */
#define _POSIX_C_SOURCE 200809L
#include "fake_cuda.h"
#include "tpflex/tpflex.h"
#include "tpflex/tpflex_cuda.h"

#include <cuda_runtime_api.h>
#include <math.h>
#include <nvtx3/nvToolsExt.h>
#include <stdatomic.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

enum { P = 2, C = 256, H = 64, N = 32, OPS = 5 };

static int g_fail;

/* ---- NVTX: a static injection counting what the backend emits (both ranks' threads) ---- */
static atomic_int g_push, g_pop, g_mark;
static int NVTX_API rec_push(const nvtxEventAttributes_t *ev) {
  (void)ev;
  return atomic_fetch_add(&g_push, 1) + 1;
}
static int NVTX_API rec_pop(void) {
  return atomic_fetch_add(&g_pop, 1) + 1;
}
static void NVTX_API rec_mark(const nvtxEventAttributes_t *ev) {
  (void)ev;
  atomic_fetch_add(&g_mark, 1);
}
static int NVTX_API rec_init(NvtxGetExportTableFunc_t get) {
  const NvtxExportTableCallbacks *cb = (const NvtxExportTableCallbacks *)get(NVTX_ETID_CALLBACKS);
  NvtxFunctionTable table = NULL;
  unsigned size = 0;
  if (!cb || !cb->GetModuleFunctionTable(NVTX_CB_MODULE_CORE, &table, &size)) return 0;
  *table[NVTX_CBID_CORE_RangePushEx] = (NvtxFunctionPointer)rec_push;
  *table[NVTX_CBID_CORE_RangePop] = (NvtxFunctionPointer)rec_pop;
  *table[NVTX_CBID_CORE_MarkEx] = (NvtxFunctionPointer)rec_mark;
  return 1;
}
NvtxInitializeInjectionNvtxFunc_t InitializeInjectionNvtx2_fnptr = rec_init;
#define CHECK(r, cond, ...)                                                                        \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      fprintf(stderr, "rank %d line %d: ", r, __LINE__);                                           \
      fprintf(stderr, __VA_ARGS__);                                                                \
      fprintf(stderr, "\n");                                                                       \
      g_fail = 1;                                                                                  \
      return 1;                                                                                    \
    }                                                                                              \
  } while (0)
#define OK(r, call) CHECK(r, (call) == TPF_OK, "%s: %s", #call, tpf_last_error())

typedef struct {
  tpf_cuda_threads *g;
  int rank;
  pthread_barrier_t *bar;
} job;

static int run_ops(int r, tpf_comm *ag, tpf_comm *rs, void *x, void *w, void *d, cudaStream_t s) {
  for (int i = 0; i < OPS; i++) {
    const uint64_t T = i % 2 ? 128 : 64;
    OK(r, tpf_comm_set_active_shape(ag, (tpf_shape){T, H}));
    OK(r, tpf_comm_set_active_shape(rs, (tpf_shape){T, H}));
    tpf_matrix mw = {w, N, H, H, TPF_BF16}, md = {d, T, N, N, TPF_BF16};
    OK(r, tpf_ag_gemm(ag, &mw, &md, s));
    tpf_matrix mx = {x, T, N, N, TPF_BF16}, mwr = {w, H, N, N, TPF_BF16};
    tpf_matrix mo = {d, T / P, H, H, TPF_BF16};
    OK(r, tpf_gemm_rs(rs, &mx, &mwr, &mo, s));
  }
  return 0;
}

static int check_timing(int r, tpf_backend *be, const char *name, uint64_t want_ops) {
  tpf_cuda_comm_timing t;
  memset(&t, 0, sizeof t);
  OK(r, tpf_cuda_backend_comm_timing(be, name, &t, 0));
  CHECK(r, t.timed_ops == want_ops && t.pending_ops == 0 && t.untimed_ops == 0,
        "'%s': timed %llu pending %llu untimed %llu, want %llu timed", name,
        (unsigned long long)t.timed_ops, (unsigned long long)t.pending_ops,
        (unsigned long long)t.untimed_ops, (unsigned long long)want_ops);
  if (want_ops == 0) return 0;
  const double eps = 1e-6 + 1e-9 * t.op_us;
  CHECK(r, t.op_us > 0 && t.gemm_us > 0 && t.comm_us > 0, "'%s': op %.3f gemm %.3f comm %.3f us",
        name, t.op_us, t.gemm_us, t.comm_us);
  CHECK(r, t.op_us + eps >= t.gemm_us, "'%s': op %.3f < gemm %.3f", name, t.op_us, t.gemm_us);
  CHECK(r, fabs(t.exposed_us - (t.op_us - t.gemm_us)) <= eps * OPS, "'%s': exposed %.3f != %.3f",
        name, t.exposed_us, t.op_us - t.gemm_us);
  CHECK(r, t.hidden_us <= t.comm_us + eps && t.hidden_us <= t.gemm_us + eps && t.hidden_us >= 0,
        "'%s': hidden %.3f vs comm %.3f gemm %.3f", name, t.hidden_us, t.comm_us, t.gemm_us);
  return 0;
}

static int body(int r, tpf_backend *be, pthread_barrier_t *bar) {
  tpf_comm_config cfg = TPF_COMM_CONFIG_INIT;
  cfg.dtype = TPF_BF16;
  cfg.capacity = (tpf_shape){C, H};
  cfg.name = "fc1_fprop";
  cfg.algo = TPF_ALGO_RING;
  cfg.coll = TPF_COLL_AG;
  tpf_comm *ag = NULL, *rs = NULL;
  OK(r, tpf_comm_create(be, &cfg, &ag));
  cfg.name = "fc2_fprop";
  cfg.algo = TPF_ALGO_PIPELINE;
  cfg.coll = TPF_COLL_RS;
  OK(r, tpf_comm_create(be, &cfg, &rs));
  void *x = NULL, *w = NULL, *d = NULL;
  cudaStream_t s = NULL;
  CHECK(r,
        cudaMalloc(&x, (size_t)C * N * 2) == cudaSuccess &&
            cudaMalloc(&w, (size_t)H * N * 2) == cudaSuccess &&
            cudaMalloc(&d, (size_t)C * H * 2) == cudaSuccess && cudaStreamCreate(&s) == cudaSuccess,
        "allocation");
  if (r == 0) tpf_cuda_set_profile(0);
  pthread_barrier_wait(bar);
  if (run_ops(r, ag, rs, x, w, d, s)) return 1;
  if (check_timing(r, be, "fc1_fprop", 0)) return 1; /* off: nothing timed */
  pthread_barrier_wait(bar);
  CHECK(r, atomic_load(&g_push) + atomic_load(&g_mark) == 0,
        "profiling off, yet %d ranges, %d marks", atomic_load(&g_push), atomic_load(&g_mark));
  if (r == 0) tpf_cuda_set_profile(1);
  pthread_barrier_wait(bar);
  if (run_ops(r, ag, rs, x, w, d, s)) return 1;
  pthread_barrier_wait(bar);
  if (r == 0) tpf_cuda_set_profile(0);
  /* Both ranks: one range per operation (2 communicators x OPS), one mark per shape change. */
  CHECK(r,
        atomic_load(&g_push) == 2 * P * OPS && atomic_load(&g_pop) == 2 * P * OPS &&
            atomic_load(&g_mark) == 2 * P * OPS,
        "NVTX: %d pushes, %d pops, %d marks, want %d each", atomic_load(&g_push),
        atomic_load(&g_pop), atomic_load(&g_mark), 2 * P * OPS);
  if (check_timing(r, be, "fc1_fprop", OPS) || check_timing(r, be, "fc2_fprop", OPS)) return 1;
  tpf_cuda_comm_timing t;
  memset(&t, 0, sizeof t);
  OK(r, tpf_cuda_backend_comm_timing(be, "fc1_fprop", &t, 1)); /* read and reset */
  if (check_timing(r, be, "fc1_fprop", 0)) return 1;
  if (check_timing(r, be, "no_such_site", 0)) return 1;
  CHECK(r, tpf_cuda_backend_comm_timing(be, NULL, &t, 0) == TPF_EINVAL, "NULL name accepted");
  t.size = sizeof t - 8;
  CHECK(r, tpf_cuda_backend_comm_timing(be, "fc1_fprop", &t, 0) == TPF_EINVAL,
        "a wrong size accepted");
  CHECK(r, strstr(tpf_last_error(), "tpf_cuda_comm_timing") != NULL, "detail: %s",
        tpf_last_error());
  OK(r, tpf_comm_destroy(ag));
  OK(r, tpf_comm_destroy(rs));
  cudaFree(x), cudaFree(w), cudaFree(d), cudaStreamDestroy(s);
  return 0;
}

static pthread_barrier_t g_bar;

static void *rank_main(void *p) {
  job *j = p;
  tpf_bootstrap boot;
  tpf_backend *be = NULL;
  if (tpf_cuda_threads_bootstrap(j->g, j->rank, 0, &boot) != TPF_OK ||
      tpf_cuda_backend_create(&boot, &be) != TPF_OK) {
    fprintf(stderr, "rank %d: backend creation: %s\n", j->rank, tpf_last_error());
    g_fail = 1;
    return NULL;
  }
  if (body(j->rank, be, &g_bar)) g_fail = 1;
  if (tpf_cuda_backend_destroy(be) != TPF_OK) g_fail = 1;
  return NULL;
}

int main(void) {
  tpf_cuda_comm_timing t = {0};
  if (tpf_cuda_backend_comm_timing(NULL, "x", &t, 0) != TPF_EINVAL) {
    fprintf(stderr, "a NULL backend accepted\n");
    return 1;
  }
  tpf_cuda_threads *g = NULL;
  if (tpf_cuda_threads_create(P, &g) != TPF_OK) return 1;
  pthread_barrier_init(&g_bar, NULL, P);
  pthread_t th[P];
  job jobs[P];
  for (int r = 0; r < P; r++) {
    jobs[r] = (job){g, r, &g_bar};
    pthread_create(&th[r], NULL, rank_main, &jobs[r]);
  }
  for (int r = 0; r < P; r++)
    pthread_join(th[r], NULL);
  tpf_cuda_threads_destroy(g);
  pthread_barrier_destroy(&g_bar);
  printf("fake timing: %s\n", g_fail ? "FAILED" : "OK");
  return g_fail;
}
