/* CUDA-graph capture with dynamic T (docs/SPEC.md §10): every operation kind is captured at two
 * active shapes on every rank, and the two graphs are replayed alternately, with the active shape
 * set between replays and an eager operation in between, each result compared bitwise with the
 * eager result of the same T (and the eager result with an exact host reference: small-integer
 * data make fp32 sums exact). Then the ranks replay different graphs (rank 0 the T1 graph, the
 * others T2): every rank's sync reports TPF_EMISMATCH and no byte of any registration changed.
 *
 *   test_cuda_capture threads P      ranks as threads of this process (P in 1..8)
 *   test_cuda_capture procs P        ranks as processes sharing the GPU (CUDA IPC)
 */
#define _POSIX_C_SOURCE 200809L
#include "proc_boot.h"
#include "tpflex/tpflex.h"
#include "tpflex/tpflex_backend.h"
#include "tpflex/tpflex_cuda.h"

#include <cuda_runtime.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAXP 8
#define REPLAYS 12

#define CHECK(cond, ...)                                                                           \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      fprintf(stderr, "FAIL rank %d %s:%d: ", k->rank, __FILE__, __LINE__);                        \
      fprintf(stderr, __VA_ARGS__);                                                                \
      fprintf(stderr, "\n");                                                                       \
      return 1;                                                                                    \
    }                                                                                              \
  } while (0)
#define OK(call) CHECK((call) == TPF_OK, "%s: %s", #call, tpf_last_error())
#define CU(call)                                                                                   \
  CHECK((call) == cudaSuccess, "%s: %s", #call, cudaGetErrorString(cudaGetLastError()))

enum { C = 256, H = 64, N = 32, K = 48 };

typedef enum { OP_RING_AG, OP_RING_RS, OP_PIPE_RS, OP_BULK_AG, OP_COUNT } op_kind;
static const char *const op_names[OP_COUNT] = {"ring_ag", "ring_rs", "pipeline_rs", "bulk_ag"};

typedef struct {
  int rank, P;
  tpf_backend *be;
  cudaStream_t s;
  void (*barrier)(void *);
  void *bctx;
  int replays; /* counted on success */
} rank_ctx;

/* Small integers: every fp32 product sum of the test is exact. */
static float val(int rank, uint64_t i, uint64_t j, uint64_t salt) {
  return (float)((int)((i * 7u + j * 3u + (uint64_t)rank * 5u + salt) % 9u) - 4);
}

typedef struct {
  tpf_comm *c;
  float *w, *x, *d, *a, *b; /* device operands */
  uint64_t drows, dcols;
} op_state;

static int fill_dev(rank_ctx *k, float *dst, uint64_t rows, uint64_t cols, uint64_t ld, int who,
                    uint64_t salt) {
  float *h = malloc(sizeof(float) * rows * ld);
  CHECK(h != NULL, "malloc");
  for (uint64_t i = 0; i < rows; i++)
    for (uint64_t j = 0; j < ld; j++)
      h[i * ld + j] = j < cols ? val(who, i, j, salt) : 0.0f;
  cudaError_t e = cudaMemcpyAsync(dst, h, sizeof(float) * rows * ld, cudaMemcpyHostToDevice, k->s);
  if (e == cudaSuccess) e = cudaStreamSynchronize(k->s);
  free(h);
  CHECK(e == cudaSuccess, "fill: %s", cudaGetErrorString(e));
  return 0;
}

/* The inputs of operation `op` at the communicator's active T: the local chunk (AG), x (RS). */
static int set_inputs(rank_ctx *k, op_kind op, op_state *o, uint64_t T) {
  if (op == OP_RING_AG || op == OP_BULK_AG) {
    tpf_matrix local;
    OK(tpf_comm_local_chunk(o->c, &local));
    return fill_dev(k, local.ptr, local.rows, local.cols, local.ld, k->rank, T);
  }
  return fill_dev(k, o->x, T, K, K, k->rank, T);
}

static tpf_status run_op(rank_ctx *k, op_kind op, op_state *o, uint64_t T) {
  tpf_matrix w = {o->w, N, H, H, TPF_FP32};
  switch (op) {
  case OP_RING_AG: {
    tpf_matrix d = {o->d, T, N, N, TPF_FP32};
    return tpf_ag_gemm(o->c, &w, &d, k->s);
  }
  case OP_RING_RS:
  case OP_PIPE_RS: {
    tpf_matrix x = {o->x, T, K, K, TPF_FP32}, wr = {o->w, H, K, K, TPF_FP32};
    tpf_matrix out = {o->d, T / (uint64_t)k->P, H, H, TPF_FP32};
    return tpf_gemm_rs(o->c, &x, &wr, &out, k->s);
  }
  default: {
    tpf_matrix a = {o->a, 64, K, K, TPF_FP32}, b = {o->b, N, K, K, TPF_FP32};
    tpf_matrix d = {o->d, 64, N, N, TPF_FP32};
    return tpf_bulk_overlap(o->c, &a, &b, &d, k->s);
  }
  }
}

/* Result of the last operation: d's rows, then the whole registration (what moved). */
static int snapshot(rank_ctx *k, op_kind op, op_state *o, uint64_t T, float *out, size_t *n) {
  const uint64_t rows = op == OP_BULK_AG ? 64 : (op == OP_RING_AG ? T : T / (uint64_t)k->P);
  const uint64_t cols = op == OP_RING_AG || op == OP_BULK_AG ? N : H;
  void *base = NULL;
  uint64_t bytes = 0;
  OK(tpf_comm_registration(o->c, &base, &bytes));
  CU(cudaStreamSynchronize(k->s));
  CU(cudaMemcpy(out, o->d, sizeof(float) * rows * cols, cudaMemcpyDeviceToHost));
  CU(cudaMemcpy(out + rows * cols, base, bytes, cudaMemcpyDeviceToHost));
  *n = rows * cols + bytes / sizeof(float);
  return 0;
}

/* The eager result against the exact host reference. */
static int check_exact(rank_ctx *k, op_kind op, uint64_t T, const float *res) {
  if (op == OP_RING_AG) { /* d = AG(X) w^T, the gathered buffer being at res + T*N */
    const float *buf = res + T * N;
    for (uint64_t i = 0; i < T; i++)
      for (uint64_t j = 0; j < N; j++) {
        float acc = 0.0f;
        for (uint64_t h = 0; h < H; h++)
          acc += buf[i * H + h] * val(0, j, h, 1);
        CHECK(res[i * N + j] == acc, "%s T %llu: d[%llu, %llu] = %g, reference %g", op_names[op],
              (unsigned long long)T, (unsigned long long)i, (unsigned long long)j, res[i * N + j],
              acc);
      }
  } else if (op == OP_RING_RS || op == OP_PIPE_RS) {
    const uint64_t R = T / (uint64_t)k->P;
    for (uint64_t i = 0; i < R; i++)
      for (uint64_t j = 0; j < H; j++) {
        float acc = 0.0f;
        for (int q = 0; q < k->P; q++)
          for (uint64_t kk = 0; kk < K; kk++)
            acc += val(q, (uint64_t)k->rank * R + i, kk, T) * val(0, j, kk, 1);
        CHECK(res[i * H + j] == acc, "%s T %llu: out[%llu, %llu] = %g, reference %g", op_names[op],
              (unsigned long long)T, (unsigned long long)i, (unsigned long long)j, res[i * H + j],
              acc);
      }
  }
  return 0;
}

static int same(rank_ctx *k, const char *what, const float *x, const float *y, size_t n) {
  for (size_t i = 0; i < n; i++)
    CHECK(memcmp(&x[i], &y[i], sizeof(float)) == 0, "%s: element %zu is %g, eager %g", what, i,
          x[i], y[i]);
  return 0;
}

static int capture(rank_ctx *k, op_kind op, op_state *o, uint64_t T, cudaGraphExec_t *exec) {
  OK(tpf_comm_set_active_shape(o->c, (tpf_shape){T, H}));
  cudaGraph_t g = NULL;
  CU(cudaStreamBeginCapture(k->s, cudaStreamCaptureModeThreadLocal));
  tpf_status st = run_op(k, op, o, T);
  cudaError_t e = cudaStreamEndCapture(k->s, &g);
  CHECK(st == TPF_OK, "%s T %llu under capture: %s (%s)", op_names[op], (unsigned long long)T,
        tpf_status_name(st), tpf_last_error());
  CHECK(e == cudaSuccess, "end capture: %s", cudaGetErrorString(e));
  size_t nodes = 0;
  CU(cudaGraphGetNodes(g, NULL, &nodes));
  CHECK(nodes > 0, "%s: the capture holds no node", op_names[op]);
  CU(cudaGraphInstantiate(exec, g, 0));
  cudaGraphDestroy(g);
  return 0;
}

static int replay(rank_ctx *k, op_kind op, op_state *o, uint64_t T, cudaGraphExec_t exec) {
  OK(tpf_comm_set_active_shape(o->c, (tpf_shape){T, H}));
  if (set_inputs(k, op, o, T)) return 1;
  CU(cudaMemsetAsync(o->d, 0, sizeof(float) * C * H, k->s));
  CU(cudaGraphLaunch(exec, k->s));
  return 0;
}

static int one_op(rank_ctx *k, op_kind op) {
  const tpf_algo algo = op == OP_BULK_AG   ? TPF_ALGO_BULK
                        : op == OP_PIPE_RS ? TPF_ALGO_PIPELINE
                                           : TPF_ALGO_RING;
  tpf_comm_config cfg = TPF_COMM_CONFIG_INIT;
  cfg.name = op_names[op];
  cfg.algo = algo;
  cfg.coll = op == OP_RING_RS || op == OP_PIPE_RS ? TPF_COLL_RS : TPF_COLL_AG;
  cfg.dtype = TPF_FP32;
  cfg.capacity = (tpf_shape){C, H};
  op_state o;
  memset(&o, 0, sizeof o);
  OK(tpf_comm_create(k->be, &cfg, &o.c));
  uint64_t T[2];
  OK(tpf_comm_legal_rows(o.c, 160, &T[0]));
  OK(tpf_comm_legal_rows(o.c, 72, &T[1]));
  CU(cudaMalloc((void **)&o.w, sizeof(float) * H * K * 2));
  CU(cudaMalloc((void **)&o.x, sizeof(float) * C * K));
  CU(cudaMalloc((void **)&o.d, sizeof(float) * C * H));
  CU(cudaMalloc((void **)&o.a, sizeof(float) * 64 * K));
  CU(cudaMalloc((void **)&o.b, sizeof(float) * K * N));
  if (op == OP_RING_AG) {
    if (fill_dev(k, o.w, N, H, H, 0, 1)) return 1;
  } else if (fill_dev(k, o.w, H, K, K, 0, 1)) {
    return 1;
  }
  if (fill_dev(k, o.a, 64, K, K, k->rank, 2) || fill_dev(k, o.b, N, K, K, k->rank, 3)) return 1;
  void *base = NULL;
  uint64_t bytes = 0;
  OK(tpf_comm_registration(o.c, &base, &bytes));
  const size_t cap = (size_t)C * H + bytes / sizeof(float);
  float *ref[2], *got = malloc(sizeof(float) * cap), *before = malloc(sizeof(float) * cap);
  size_t nref[2], n = 0;
  CHECK(got && before, "malloc");
  /* Eager results per T. */
  for (int t = 0; t < 2; t++) {
    ref[t] = malloc(sizeof(float) * cap);
    CHECK(ref[t] != NULL, "malloc");
    OK(tpf_comm_set_active_shape(o.c, (tpf_shape){T[t], H}));
    if (set_inputs(k, op, &o, T[t])) return 1;
    CU(cudaMemsetAsync(o.d, 0, sizeof(float) * C * H, k->s));
    OK(run_op(k, op, &o, T[t]));
    OK(tpf_comm_sync(o.c));
    if (snapshot(k, op, &o, T[t], ref[t], &nref[t])) return 1;
    if (check_exact(k, op, T[t], ref[t])) return 1;
  }
  cudaGraphExec_t exec[2];
  for (int t = 0; t < 2; t++)
    if (capture(k, op, &o, T[t], &exec[t])) return 1;
  k->barrier(k->bctx);
  /* Alternate the buckets; an eager operation in the middle. */
  for (int i = 0; i < REPLAYS; i++) {
    const int t = i % 2;
    if (i == REPLAYS / 2) {
      OK(tpf_comm_set_active_shape(o.c, (tpf_shape){T[t], H}));
      if (set_inputs(k, op, &o, T[t])) return 1;
      OK(run_op(k, op, &o, T[t]));
    } else if (replay(k, op, &o, T[t], exec[t])) {
      return 1;
    }
    OK(tpf_comm_sync(o.c));
    if (snapshot(k, op, &o, T[t], got, &n)) return 1;
    CHECK(n == nref[t], "%s: snapshot sizes %zu and %zu", op_names[op], n, nref[t]);
    char what[96];
    snprintf(what, sizeof what, "%s T %llu %s %d", op_names[op], (unsigned long long)T[t],
             i == REPLAYS / 2 ? "eager between replays" : "replay", i);
    if (same(k, what, got, ref[t], n)) return 1;
    k->replays++;
  }
  /* Disagreement under replay: rank 0 replays the T[0] graph, the others T[1]. Every byte a
   * rank could receive is marked with its sender: each registration is filled with 1000 + rank,
   * and with x = rank + 1 and w = 1 a rank's partial products are K * (rank + 1). Afterwards no
   * rank's registration may hold another rank's mark or partial. */
  if (k->P > 1) {
    const int t = k->rank == 0 ? 0 : 1;
    OK(tpf_comm_set_active_shape(o.c, (tpf_shape){T[t], H}));
    OK(tpf_comm_registration(o.c, &base, &bytes));
    const size_t nreg = bytes / sizeof(float);
    for (size_t i = 0; i < nreg; i++)
      before[i] = 1000.0f + (float)k->rank;
    CU(cudaMemcpy(base, before, bytes, cudaMemcpyHostToDevice));
    for (size_t i = 0; i < (size_t)C * K; i++)
      got[i] = (float)(k->rank + 1);
    CU(cudaMemcpy(o.x, got, sizeof(float) * C * K, cudaMemcpyHostToDevice));
    for (size_t i = 0; i < (size_t)H * K * 2; i++)
      got[i] = 1.0f;
    CU(cudaMemcpy(o.w, got, sizeof(float) * H * K * 2, cudaMemcpyHostToDevice));
    k->barrier(k->bctx);
    CU(cudaGraphLaunch(exec[t], k->s));
    tpf_status st = tpf_comm_sync(o.c);
    CHECK(st == TPF_EMISMATCH, "%s: ranks replaying T %llu and T %llu: sync gave %s (%s)",
          op_names[op], (unsigned long long)T[0], (unsigned long long)T[1], tpf_status_name(st),
          tpf_last_error());
    if (k->rank == 0) printf("  %s mismatch under replay: %s\n", op_names[op], tpf_last_error());
    CU(cudaStreamSynchronize(k->s));
    CU(cudaMemcpy(got, base, bytes, cudaMemcpyDeviceToHost));
    size_t mine = 0;
    for (size_t i = 0; i < nreg; i++) {
      mine += got[i] == 1000.0f + (float)k->rank;
      for (int q = 0; q < k->P; q++)
        CHECK(q == k->rank || (got[i] != 1000.0f + (float)q && got[i] != (float)(K * (q + 1))),
              "%s: after a mismatched replay element %zu of rank %d's registration is %g: rank "
              "%d's bytes moved",
              op_names[op], i, k->rank, got[i], q);
    }
    CHECK(mine > 0, "%s: the registration lost every mark", op_names[op]);
  }
  k->barrier(k->bctx);
  for (int t = 0; t < 2; t++) {
    cudaGraphExecDestroy(exec[t]);
    free(ref[t]);
  }
  free(got);
  free(before);
  tpf_comm_destroy(o.c);
  cudaFree(o.w);
  cudaFree(o.x);
  cudaFree(o.d);
  cudaFree(o.a);
  cudaFree(o.b);
  if (k->rank == 0)
    printf("  %s P %d: T %llu and %llu captured, %d replays and eager runs bitwise equal\n",
           op_names[op], k->P, (unsigned long long)T[0], (unsigned long long)T[1], REPLAYS);
  return 0;
}

static int rank_body(rank_ctx *k) {
  CU(cudaStreamCreateWithFlags(&k->s, cudaStreamNonBlocking));
  for (int op = 0; op < OP_COUNT; op++)
    if (one_op(k, (op_kind)op)) return 1;
  cudaStreamDestroy(k->s);
  return 0;
}

/* ---- threads ---- */

typedef struct {
  tpf_cuda_threads *g;
  pthread_barrier_t bar;
  rank_ctx k[MAXP];
  int rc[MAXP];
} threads_run;

static void thr_barrier(void *ctx) {
  pthread_barrier_wait(&((threads_run *)ctx)->bar);
}

static threads_run g_tr;

static void *thr_main(void *arg) {
  rank_ctx *k = arg;
  tpf_bootstrap boot;
  int *rc = &g_tr.rc[k->rank];
  *rc = 1;
  if (tpf_cuda_threads_bootstrap(g_tr.g, k->rank, 0, &boot) != TPF_OK ||
      tpf_cuda_backend_create(&boot, &k->be) != TPF_OK) {
    fprintf(stderr, "FAIL rank %d: backend: %s\n", k->rank, tpf_last_error());
    return NULL;
  }
  *rc = rank_body(k);
  tpf_cuda_backend_destroy(k->be);
  return NULL;
}

static int run_threads(int P) {
  if (tpf_cuda_threads_create(P, &g_tr.g) != TPF_OK) {
    fprintf(stderr, "FAIL threads: %s\n", tpf_last_error());
    return 1;
  }
  pthread_barrier_init(&g_tr.bar, NULL, (unsigned)P);
  pthread_t th[MAXP];
  for (int r = 0; r < P; r++) {
    g_tr.k[r] = (rank_ctx){.rank = r, .P = P, .barrier = thr_barrier, .bctx = &g_tr};
    pthread_create(&th[r], NULL, thr_main, &g_tr.k[r]);
  }
  int worst = 0;
  for (int r = 0; r < P; r++) {
    pthread_join(th[r], NULL);
    worst = worst || g_tr.rc[r];
  }
  tpf_cuda_threads_destroy(g_tr.g);
  if (!worst) printf("threads P %d: %d replays per rank, all equal\n", P, g_tr.k[0].replays);
  return worst;
}

/* ---- processes ---- */

static void pb_barrier(void *ctx) {
  proc_boot_barrier(ctx);
}

static int child(proc_boot *pb, int rank) {
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
    if (rank == 0) printf("skipped: no GPU\n");
    return 77;
  }
  cudaSetDevice(0);
  tpf_bootstrap boot;
  proc_boot_fill(pb, rank, 0, &boot);
  rank_ctx k = {.rank = rank, .P = boot.tp_size, .barrier = pb_barrier, .bctx = pb};
  if (tpf_cuda_backend_create(&boot, &k.be) != TPF_OK) {
    fprintf(stderr, "FAIL process rank %d: backend: %s\n", rank, tpf_last_error());
    return 1;
  }
  int rc = rank_body(&k);
  tpf_cuda_backend_destroy(k.be);
  if (rank == 0 && rc == 0) printf("procs P %d: %d replays per rank, all equal\n", k.P, k.replays);
  fflush(stdout);
  return rc;
}

static int run_procs(int P) {
  proc_boot *pb = proc_boot_create(P);
  return pb == NULL ? 1 : proc_boot_run(pb, child);
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "threads";
  const int P = argc > 2 ? atoi(argv[2]) : 2;
  if (P < 1 || P > MAXP || (strcmp(mode, "threads") != 0 && strcmp(mode, "procs") != 0)) {
    fprintf(stderr, "usage: %s threads|procs P (1..%d)\n", argv[0], MAXP);
    return 2;
  }
  /* No CUDA call in this process before the children fork (CUDA is not fork-safe once
   * initialised): procs mode asks for the device in the children. */
  int ndev = 0;
  if (strcmp(mode, "threads") == 0 && (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1)) {
    printf("skipped: no GPU\n");
    return 77;
  }
  const int rc = strcmp(mode, "threads") == 0 ? run_threads(P) : run_procs(P);
  if (rc == 77) return 77; /* every process found no GPU */
  printf("test_cuda_capture %s P %d: %s\n", mode, P, rc ? "FAILED" : "PASSED");
  return rc ? 1 : 0;
}
