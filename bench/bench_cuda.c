/* The GPU half of `tpflex bench`: in-process CUDA rank groups (P threads on one device, each with
 * a tpflex CUDA backend and a stream), event timing, the cuBLASLt baselines (one GEMM of the
 * whole layer; section 3, the chunking tax) and the re-registration alternative of section 1
 * (cudaFree + cudaMalloc + cudaIpcGetMemHandle + a peer's cudaIpcOpenMemHandle in a helper
 * process). Plain C: CUDA runtime and cuBLASLt host calls only, no kernels.
 *
 * Timing method: before each timed repetition rank 0 enqueues a 1 GiB memset (it evicts the L2,
 * so no input is served from cache, and it keeps the GPU busy while the host enqueues the
 * repetition), then records the start event; the other ranks' streams wait for it; every rank
 * records its end event after its operation, and rank 0 waits for all of them before the stop
 * event. start -> stop is the repetition's time: earliest start to latest end on the device.
 */
#define _POSIX_C_SOURCE 200809L
#include "bench.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef TPF_HAVE_CUDA

#include "reference.h"
#include "tpflex/tpflex_cuda.h"

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <math.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

#define BENCH_FLUSH_BYTES (1ull << 30)

static tpf_status bench_cu_err(cudaError_t e, const char *what) {
  return tpf_set_error(TPF_EBACKEND, "%s: %s (%s)", what, cudaGetErrorName(e),
                       cudaGetErrorString(e));
}
#define BENCH_CU(call, what)                                                                       \
  do {                                                                                             \
    cudaError_t bench_e_ = (call);                                                                 \
    if (bench_e_ != cudaSuccess) return bench_cu_err(bench_e_, what);                              \
  } while (0)

typedef struct {
  int tp, device;
  pthread_t th[64];
  tpf_cuda_threads *tg;
  tpf_backend *be[64];
  cudaStream_t stream[64];
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int gen, done, ready;
  bool quit;
  bench_rank_fn fn;
  void *arg;
  tpf_status rc[64];
  tpf_status init_rc[64];
  char init_err[256];
  int nev;
  cudaEvent_t *ev_start, *ev_stop, *ev_end; /* [nev], [nev], [tp * nev] */
  void *flush;
  bench_group *g;
} bench_cu;

typedef struct {
  bench_cu *cu;
  int rank;
} bench_cu_arg;
static bench_cu_arg bench_cu_args[64];

static void *bench_cu_thread(void *p) {
  bench_cu_arg *a = p;
  bench_cu *cu = a->cu;
  const int r = a->rank;
  tpf_status st = TPF_OK;
  tpf_bootstrap boot;
  if (cudaSetDevice(cu->device) != cudaSuccess)
    st = tpf_set_error(TPF_EBACKEND, "cudaSetDevice(%d) failed", cu->device);
  if (st == TPF_OK) st = tpf_cuda_threads_bootstrap(cu->tg, r, cu->device, &boot);
  if (st == TPF_OK) st = tpf_cuda_backend_create(&boot, &cu->be[r]);
  if (st == TPF_OK &&
      cudaStreamCreateWithFlags(&cu->stream[r], cudaStreamNonBlocking) != cudaSuccess)
    st = tpf_set_error(TPF_EBACKEND, "cudaStreamCreate failed");
  pthread_mutex_lock(&cu->mu);
  cu->init_rc[r] = st;
  if (st != TPF_OK && !cu->init_err[0])
    snprintf(cu->init_err, sizeof(cu->init_err), "rank %d: %s", r, tpf_last_error());
  cu->ready++;
  pthread_cond_broadcast(&cu->cv);
  int seen = 0;
  for (;;) {
    while (cu->gen == seen && !cu->quit)
      pthread_cond_wait(&cu->cv, &cu->mu);
    if (cu->quit) break;
    seen = cu->gen;
    pthread_mutex_unlock(&cu->mu);
    bench_rank rk = {.rank = r, .tp = cu->tp, .stream = cu->stream[r], .g = cu->g, .be = cu->be[r]};
    tpf_status rc = cu->be[r] ? cu->fn(&rk, cu->arg) : TPF_EBACKEND;
    pthread_mutex_lock(&cu->mu);
    cu->rc[r] = rc;
    cu->done++;
    pthread_cond_broadcast(&cu->cv);
  }
  pthread_mutex_unlock(&cu->mu);
  if (cu->stream[r]) cudaStreamSynchronize(cu->stream[r]);
  if (cu->be[r]) tpf_cuda_backend_destroy(cu->be[r]);
  if (cu->stream[r]) cudaStreamDestroy(cu->stream[r]);
  return NULL;
}

tpf_status bench_cuda_group_init(bench_group *g) {
  bench_cu *cu = calloc(1, sizeof(*cu));
  if (!cu) return tpf_set_error(TPF_ENOMEM, "bench: no memory");
  g->cu = cu;
  cu->g = g;
  cu->tp = g->tp;
  cu->device = g->o->device;
  BENCH_CU(cudaSetDevice(cu->device), "cudaSetDevice");
  if (g->tp == 0) return TPF_OK;
  cu->nev = g->o->iters;
  cu->ev_start = calloc((size_t)cu->nev, sizeof(cudaEvent_t));
  cu->ev_stop = calloc((size_t)cu->nev, sizeof(cudaEvent_t));
  cu->ev_end = calloc((size_t)cu->nev * (size_t)g->tp, sizeof(cudaEvent_t));
  if (!cu->ev_start || !cu->ev_stop || !cu->ev_end)
    return tpf_set_error(TPF_ENOMEM, "bench: no memory");
  for (int i = 0; i < cu->nev; i++) {
    BENCH_CU(cudaEventCreate(&cu->ev_start[i]), "cudaEventCreate");
    BENCH_CU(cudaEventCreate(&cu->ev_stop[i]), "cudaEventCreate");
  }
  for (int i = 0; i < cu->nev * g->tp; i++)
    BENCH_CU(cudaEventCreate(&cu->ev_end[i]), "cudaEventCreate");
  BENCH_CU(cudaMalloc(&cu->flush, BENCH_FLUSH_BYTES), "cudaMalloc(flush)");
  pthread_mutex_init(&cu->mu, NULL);
  pthread_cond_init(&cu->cv, NULL);
  tpf_status st = tpf_cuda_threads_create(g->tp, &cu->tg);
  if (st != TPF_OK) return st;
  for (int r = 0; r < g->tp; r++) {
    bench_cu_args[r] = (bench_cu_arg){cu, r};
    pthread_create(&cu->th[r], NULL, bench_cu_thread, &bench_cu_args[r]);
  }
  pthread_mutex_lock(&cu->mu);
  while (cu->ready < g->tp)
    pthread_cond_wait(&cu->cv, &cu->mu);
  pthread_mutex_unlock(&cu->mu);
  for (int r = 0; r < g->tp; r++)
    if (cu->init_rc[r] != TPF_OK)
      return tpf_set_error(cu->init_rc[r], "CUDA rank group of %d: %s", g->tp, cu->init_err);
  return TPF_OK;
}

tpf_status bench_cuda_group_run(bench_group *g, bench_rank_fn fn, void *arg) {
  bench_cu *cu = g->cu;
  if (!cu || cu->tp == 0) return tpf_set_error(TPF_EINVAL, "bench: group has no ranks");
  pthread_mutex_lock(&cu->mu);
  cu->fn = fn;
  cu->arg = arg;
  cu->done = 0;
  cu->gen++;
  pthread_cond_broadcast(&cu->cv);
  while (cu->done < cu->tp)
    pthread_cond_wait(&cu->cv, &cu->mu);
  pthread_mutex_unlock(&cu->mu);
  for (int r = 0; r < cu->tp; r++)
    if (cu->rc[r] != TPF_OK) return cu->rc[r];
  return TPF_OK;
}

void bench_cuda_group_fini(bench_group *g) {
  bench_cu *cu = g->cu;
  if (!cu) return;
  if (cu->tp > 0 && cu->ready > 0) {
    pthread_mutex_lock(&cu->mu);
    cu->quit = true;
    pthread_cond_broadcast(&cu->cv);
    pthread_mutex_unlock(&cu->mu);
    for (int r = 0; r < cu->tp; r++)
      pthread_join(cu->th[r], NULL);
  }
  if (cu->tg) tpf_cuda_threads_destroy(cu->tg);
  for (int i = 0; i < cu->nev; i++) {
    if (cu->ev_start && cu->ev_start[i]) cudaEventDestroy(cu->ev_start[i]);
    if (cu->ev_stop && cu->ev_stop[i]) cudaEventDestroy(cu->ev_stop[i]);
  }
  for (int i = 0; cu->ev_end && i < cu->nev * cu->tp; i++)
    if (cu->ev_end[i]) cudaEventDestroy(cu->ev_end[i]);
  free(cu->ev_start);
  free(cu->ev_stop);
  free(cu->ev_end);
  if (cu->flush) cudaFree(cu->flush);
  free(cu);
  g->cu = NULL;
}

void *bench_cuda_alloc(uint64_t bytes) {
  void *p = NULL;
  if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) return NULL;
  return p;
}
void bench_cuda_free(void *p) {
  cudaFree(p);
}

tpf_status bench_cuda_copy(bench_rank *rk, void *dst, const void *src, uint64_t bytes) {
  BENCH_CU(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, (cudaStream_t)rk->stream),
           "cudaMemcpyAsync");
  return TPF_OK;
}
tpf_status bench_cuda_tile(void *dst, const void *host, uint64_t unit, uint64_t total) {
  uint64_t first = unit < total ? unit : total;
  BENCH_CU(cudaMemcpy(dst, host, first, cudaMemcpyHostToDevice), "cudaMemcpy(upload)");
  for (uint64_t cur = first; cur < total;) {
    uint64_t n = total - cur < cur ? total - cur : cur;
    BENCH_CU(cudaMemcpy((uint8_t *)dst + cur, dst, n, cudaMemcpyDeviceToDevice),
             "cudaMemcpy(tile)");
    cur += n;
  }
  return TPF_OK;
}
tpf_status bench_cuda_download(bench_rank *rk, void *host, const void *dev, uint64_t bytes) {
  cudaStream_t s = (cudaStream_t)rk->stream;
  BENCH_CU(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, s), "cudaMemcpyAsync(D2H)");
  BENCH_CU(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  return TPF_OK;
}
tpf_status bench_cuda_poison(bench_rank *rk, void *dev, uint64_t bytes) {
  BENCH_CU(cudaMemsetAsync(dev, 0xFF, bytes, (cudaStream_t)rk->stream), "cudaMemsetAsync");
  return TPF_OK;
}
tpf_status bench_cuda_sync(bench_rank *rk) {
  BENCH_CU(cudaStreamSynchronize((cudaStream_t)rk->stream), "cudaStreamSynchronize");
  return TPF_OK;
}

tpf_status bench_cuda_time_begin(bench_rank *rk, int it) {
  bench_cu *cu = rk->g->cu;
  bench_barrier(rk);
  if (rk->rank == 0) {
    cudaStream_t s = (cudaStream_t)rk->stream;
    cudaMemsetAsync(cu->flush, it & 0xFF, BENCH_FLUSH_BYTES, s);
    cudaEventRecord(cu->ev_start[it], s);
  }
  bench_barrier(rk);
  if (rk->rank != 0) cudaStreamWaitEvent((cudaStream_t)rk->stream, cu->ev_start[it], 0);
  return TPF_OK;
}
tpf_status bench_cuda_time_end(bench_rank *rk, int it) {
  bench_cu *cu = rk->g->cu;
  cudaEventRecord(cu->ev_end[rk->rank * cu->nev + it], (cudaStream_t)rk->stream);
  bench_barrier(rk);
  if (rk->rank == 0) {
    cudaStream_t s = (cudaStream_t)rk->stream;
    for (int r = 1; r < rk->tp; r++)
      cudaStreamWaitEvent(s, cu->ev_end[r * cu->nev + it], 0);
    cudaEventRecord(cu->ev_stop[it], s);
  }
  return TPF_OK;
}
tpf_status bench_cuda_time_collect(bench_rank *rk, int n, double *us) {
  bench_cu *cu = rk->g->cu;
  bench_barrier(rk);
  tpf_status st = TPF_OK;
  if (rk->rank == 0) {
    cudaError_t e = cudaEventSynchronize(cu->ev_stop[n - 1]);
    for (int it = 0; it < n; it++) {
      float ms = NAN;
      if (e == cudaSuccess) e = cudaEventElapsedTime(&ms, cu->ev_start[it], cu->ev_stop[it]);
      us[it] = e == cudaSuccess ? (double)ms * 1e3 : NAN;
    }
    if (e != cudaSuccess) st = bench_cu_err(e, "event timing");
  }
  bench_barrier(rk);
  return st;
}

long long bench_cuda_dev_used(void) {
  size_t fr = 0, tot = 0;
  if (cudaMemGetInfo(&fr, &tot) != cudaSuccess) return -1;
  return (long long)(tot - fr);
}

/* ---- cuBLASLt: d[m, n] = x[m, k] * w[n, k]^T, row-major, bf16 in/out, fp32 accumulation ---- */

typedef struct {
  cublasLtHandle_t h;
  void *ws;
  size_t ws_bytes;
  cudaStream_t s;
  cudaEvent_t e0[BENCH_MAX_ITERS], e1[BENCH_MAX_ITERS];
  void *flush;
} bench_lt;

typedef struct {
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t lw, lx, ld;
  cublasLtMatmulAlgo_t algo;
} bench_lt_plan;

static tpf_status bench_lt_err(cublasStatus_t s, const char *what) {
  return tpf_set_error(TPF_EBACKEND, "%s: cuBLASLt status %d", what, (int)s);
}
#define BENCH_LT(call, what)                                                                       \
  do {                                                                                             \
    cublasStatus_t bench_s_ = (call);                                                              \
    if (bench_s_ != CUBLAS_STATUS_SUCCESS) return bench_lt_err(bench_s_, what);                    \
  } while (0)

static tpf_status bench_lt_init(bench_lt *lt, int iters) {
  memset(lt, 0, sizeof(*lt));
  BENCH_LT(cublasLtCreate(&lt->h), "cublasLtCreate");
  lt->ws_bytes = 32u << 20;
  BENCH_CU(cudaMalloc(&lt->ws, lt->ws_bytes), "cudaMalloc(workspace)");
  BENCH_CU(cudaMalloc(&lt->flush, BENCH_FLUSH_BYTES), "cudaMalloc(flush)");
  BENCH_CU(cudaStreamCreateWithFlags(&lt->s, cudaStreamNonBlocking), "cudaStreamCreate");
  for (int i = 0; i < iters && i < BENCH_MAX_ITERS; i++) {
    BENCH_CU(cudaEventCreate(&lt->e0[i]), "cudaEventCreate");
    BENCH_CU(cudaEventCreate(&lt->e1[i]), "cudaEventCreate");
  }
  return TPF_OK;
}
static void bench_lt_fini(bench_lt *lt) {
  for (int i = 0; i < BENCH_MAX_ITERS; i++) {
    if (lt->e0[i]) cudaEventDestroy(lt->e0[i]);
    if (lt->e1[i]) cudaEventDestroy(lt->e1[i]);
  }
  if (lt->s) cudaStreamDestroy(lt->s);
  if (lt->ws) cudaFree(lt->ws);
  if (lt->flush) cudaFree(lt->flush);
  if (lt->h) cublasLtDestroy(lt->h);
}

static void bench_lt_plan_free(bench_lt_plan *p) {
  if (p->lw) cublasLtMatrixLayoutDestroy(p->lw);
  if (p->lx) cublasLtMatrixLayoutDestroy(p->lx);
  if (p->ld) cublasLtMatrixLayoutDestroy(p->ld);
  if (p->desc) cublasLtMatmulDescDestroy(p->desc);
  memset(p, 0, sizeof(*p));
}

/* Row-major d[m,n] = x[m,k] w[n,k]^T is column-major d^T[n,m] = (w as k x n)^T (x as k x m). */
static tpf_status bench_lt_plan_make(bench_lt *lt, uint64_t m, uint64_t n, uint64_t k,
                                     bench_lt_plan *p) {
  memset(p, 0, sizeof(*p));
  const cublasOperation_t opT = CUBLAS_OP_T, opN = CUBLAS_OP_N;
  BENCH_LT(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc");
  BENCH_LT(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opT, sizeof(opT)),
           "transa");
  BENCH_LT(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opN, sizeof(opN)),
           "transb");
  BENCH_LT(cublasLtMatrixLayoutCreate(&p->lw, CUDA_R_16BF, k, n, (int64_t)k), "layout w");
  BENCH_LT(cublasLtMatrixLayoutCreate(&p->lx, CUDA_R_16BF, k, m, (int64_t)k), "layout x");
  BENCH_LT(cublasLtMatrixLayoutCreate(&p->ld, CUDA_R_16BF, n, m, (int64_t)n), "layout d");
  cublasLtMatmulPreference_t pref;
  BENCH_LT(cublasLtMatmulPreferenceCreate(&pref), "preference");
  uint64_t ws = lt->ws_bytes;
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                       sizeof(ws));
  cublasLtMatmulHeuristicResult_t res;
  int found = 0;
  cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(lt->h, p->desc, p->lw, p->lx, p->ld, p->ld,
                                                    pref, 1, &res, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (s != CUBLAS_STATUS_SUCCESS || found < 1) {
    bench_lt_plan_free(p);
    return tpf_set_error(TPF_EBACKEND, "cuBLASLt has no algorithm for [%llu,%llu]x[%llu,%llu]^T",
                         (unsigned long long)m, (unsigned long long)k, (unsigned long long)n,
                         (unsigned long long)k);
  }
  p->algo = res.algo;
  return TPF_OK;
}

static tpf_status bench_lt_exec(bench_lt *lt, const bench_lt_plan *p, const void *x, const void *w,
                                void *d) {
  const float one = 1.0f, zero = 0.0f;
  BENCH_LT(cublasLtMatmul(lt->h, p->desc, &one, w, p->lw, x, p->lx, &zero, d, p->ld, d, p->ld,
                          &p->algo, lt->ws, lt->ws_bytes, lt->s),
           "cublasLtMatmul");
  return TPF_OK;
}

/* Checks d[m, n] (device) = x * w^T on sampled rows (3 per block of m/parts rows) and 64 columns;
 * x and w are src views starting at element offsets xo and wo. Returns elements wrong. */
static long long bench_lt_check(bench_group *g, const void *d, uint64_t m, uint64_t n, uint64_t k,
                                uint64_t xo, uint64_t wo, int parts) {
  uint64_t R = m / (uint64_t)parts, rows[3 * 64];
  int nr = 0;
  for (int p = 0; p < parts; p++) {
    uint64_t c[3] = {0, R / 2, R - 1};
    for (int i = 0; i < 3; i++)
      if (nr == 0 || rows[nr - 1] != p * R + c[i]) rows[nr++] = p * R + c[i];
  }
  uint64_t nc = n < 64 ? n : 64;
  uint16_t *xs = malloc((size_t)nr * k * 2), *ws = malloc(nc * k * 2), *row = malloc(n * 2),
           *got = malloc((size_t)nr * nc * 2);
  float *want = malloc((size_t)nr * nc * sizeof(float));
  long long wrong = -1;
  if (!xs || !ws || !row || !got || !want) goto out;
  for (int i = 0; i < nr; i++) {
    for (uint64_t kk = 0; kk < k; kk++)
      xs[(uint64_t)i * k + kk] = g->pool[(xo + rows[i] * k + kk) % g->pool_elems];
    if (cudaMemcpy(row, (const uint16_t *)d + rows[i] * n, n * 2, cudaMemcpyDeviceToHost) !=
        cudaSuccess)
      goto out;
    for (uint64_t c = 0; c < nc; c++)
      got[(uint64_t)i * nc + c] = row[c * n / nc];
  }
  for (uint64_t c = 0; c < nc; c++)
    for (uint64_t kk = 0; kk < k; kk++)
      ws[c * k + kk] = g->pool[(wo + (c * n / nc) * k + kk) % g->pool_elems];
  tpf_matrix mx = {xs, (uint64_t)nr, k, k, TPF_BF16}, mw = {ws, nc, k, k, TPF_BF16};
  tpf_matrix mg = {got, (uint64_t)nr, nc, nc, TPF_BF16},
             mwant = {want, (uint64_t)nr, nc, nc, TPF_FP32};
  tpf_ref_result res;
  if (tpf_ref_gemm_f32(&mx, &mw, want) != TPF_OK ||
      tpf_ref_compare(&mg, &mwant, tpf_ref_tolerance(TPF_BF16), &res) != TPF_OK)
    goto out;
  wrong = (long long)res.wrong + (!res.pass && res.wrong == 0);
out:
  free(xs);
  free(ws);
  free(row);
  free(got);
  free(want);
  return wrong;
}

static uint64_t bench_lt_off(int it, int salt, uint64_t margin) {
  return (((uint64_t)it * 1009u + (uint64_t)salt * 104729u) * 4096u) % margin / 64u * 64u;
}

/* Median time of `parts` row-chunk GEMMs covering d[m, n] = x[m, k] w^T, back to back on one
 * stream (parts == 1: one GEMM). Inputs rotate through src; a 1 GiB memset before each
 * repetition evicts the L2. *wrong gets the check of the last repetition. */
static tpf_status bench_lt_time(bench_group *g, bench_lt *lt, uint64_t m, uint64_t n, uint64_t k,
                                int parts, int warmup, int iters, double *us, long long *wrong) {
  const uint64_t margin = 8ull << 20;
  tpf_status st = bench_src_reserve(g, (m > n ? m : n) * k + margin);
  if (st != TPF_OK) return st;
  void *d = NULL;
  BENCH_CU(cudaMalloc(&d, m * n * 2), "cudaMalloc(d)");
  bench_lt_plan p;
  st = bench_lt_plan_make(lt, m / (uint64_t)parts, n, k, &p);
  double *v = calloc((size_t)iters, sizeof(double));
  const uint16_t *src = g->src;
  int total = warmup + iters;
  for (int it = 0; st == TPF_OK && it <= total; it++) {
    uint64_t xo = bench_lt_off(it, 0, margin), wo = bench_lt_off(it, 1, margin);
    bool timed = it >= warmup && it < total;
    if (it == total)
      cudaMemsetAsync(d, 0xFF, m * n * 2, lt->s); /* poison, then the checked repetition */
    if (timed) {
      cudaMemsetAsync(lt->flush, it & 0xFF, BENCH_FLUSH_BYTES, lt->s);
      cudaEventRecord(lt->e0[it - warmup], lt->s);
    }
    for (int c = 0; c < parts && st == TPF_OK; c++) {
      uint64_t r0 = (uint64_t)c * (m / (uint64_t)parts);
      st = bench_lt_exec(lt, &p, src + xo + r0 * k, src + wo, (uint16_t *)d + r0 * n);
    }
    if (timed) cudaEventRecord(lt->e1[it - warmup], lt->s);
    if (it == total && st == TPF_OK) {
      cudaError_t e = cudaStreamSynchronize(lt->s);
      if (e != cudaSuccess)
        st = bench_cu_err(e, "GEMM");
      else
        *wrong = bench_lt_check(g, d, m, n, k, xo, wo, parts);
    }
  }
  for (int i = 0; st == TPF_OK && i < iters; i++) {
    float ms;
    cudaError_t e = cudaEventElapsedTime(&ms, lt->e0[i], lt->e1[i]);
    if (e != cudaSuccess) st = bench_cu_err(e, "cudaEventElapsedTime");
    v[i] = ms * 1e3;
  }
  if (st == TPF_OK) *us = bench_median(v, iters);
  free(v);
  bench_lt_plan_free(&p);
  cudaFree(d);
  return st;
}

static bench_lt bench_lt_main;
static bool bench_lt_ready;

tpf_status bench_cuda_gemm_us(bench_group *g, uint64_t m, uint64_t n, uint64_t k, double *us) {
  if (!bench_lt_ready) {
    tpf_status st = bench_lt_init(&bench_lt_main, g->o->iters);
    if (st != TPF_OK) return st;
    bench_lt_ready = true;
  }
  long long wrong = 0;
  tpf_status st =
      bench_lt_time(g, &bench_lt_main, m, n, k, 1, g->o->warmup, g->o->iters, us, &wrong);
  if (st == TPF_OK && wrong != 0)
    return tpf_set_error(TPF_EBACKEND, "layer GEMM check failed (%lld wrong)", wrong);
  return st;
}

void bench_cuda_header(const bench_opts *o) {
  struct cudaDeviceProp prop;
  int rt = 0, drv = 0;
  cudaRuntimeGetVersion(&rt);
  cudaDriverGetVersion(&drv);
  if (cudaGetDeviceProperties(&prop, o->device) == cudaSuccess)
    printf("# GPU %d: %s, %d SMs, %.1f GiB, compute capability %d.%d; CUDA runtime %d, driver %d, "
           "cuBLASLt %zu\n",
           o->device, prop.name, prop.multiProcessorCount,
           (double)prop.totalGlobalMem / (1024.0 * 1024.0 * 1024.0), prop.major, prop.minor, rt,
           drv, cublasLtGetVersion());
  else
    printf("# GPU %d: cudaGetDeviceProperties failed\n", o->device);
  printf("# timing: CUDA events around each repetition, a 1 GiB memset before each one (L2 "
         "eviction), inputs rotated\n# through a random bf16 array, median of the repetitions; "
         "P ranks are threads sharing this one GPU.\n");
}

/* ---- section 3: chunking tax ---------------------------------------------------------------- */

int bench_cuda_section_chunking(const bench_opts *o) {
  static const char *const cols[] = {
      "T",   "N",     "H", "P", "chunk_rows", "one(us)", "one_TF/s", "chunked(us)", "chunked_TF/s",
      "tax", "#wrong"};
  char title[200];
  snprintf(title, sizeof(title),
           "Section 3: chunking tax on one GPU: P row-chunk cuBLASLt GEMMs [T/P,H]x[N,H]^T back "
           "to back vs one [T,H]x[N,H]^T (H=%llu)",
           (unsigned long long)o->hidden);
  bench_table("chunking", title, 11, cols);
  bench_group *g = NULL;
  tpf_status st = bench_group_create(o, 0, &g);
  bench_lt lt;
  if (st == TPF_OK) st = bench_lt_init(&lt, o->iters);
  if (st != TPF_OK) {
    bench_note("FAILED: %s", tpf_last_error());
    bench_group_destroy(g);
    return 1;
  }
  int rc = 0;
  const uint64_t Ns[2] = {o->n, 1024};
  for (int ni = 0; ni < 2; ni++) {
    if (ni == 1 && Ns[1] == Ns[0]) continue;
    for (uint64_t T = 512; T <= 32768; T *= 2) {
      if (o->quick && T != 1024 && T != 8192 && T != 32768) continue;
      double one = NAN;
      long long w1 = 0;
      bench_progress("[3/4 chunking] N=%llu T=%llu", (unsigned long long)Ns[ni],
                     (unsigned long long)T);
      st = bench_lt_time(g, &lt, T, Ns[ni], o->hidden, 1, o->warmup, o->iters, &one, &w1);
      if (st != TPF_OK) {
        bench_note("FAILED T=%llu N=%llu: %s", (unsigned long long)T, (unsigned long long)Ns[ni],
                   tpf_last_error());
        rc = 1;
        continue;
      }
      for (int P = 2; P <= 8; P *= 2) {
        double ch = NAN;
        long long w = 0;
        st = bench_lt_time(g, &lt, T, Ns[ni], o->hidden, P, o->warmup, o->iters, &ch, &w);
        if (st != TPF_OK) {
          bench_note("FAILED T=%llu P=%d: %s", (unsigned long long)T, P, tpf_last_error());
          rc = 1;
          continue;
        }
        double fl = 2.0 * (double)T * (double)Ns[ni] * (double)o->hidden;
        bench_cell_i((long long)T);
        bench_cell_i((long long)Ns[ni]);
        bench_cell_i((long long)o->hidden);
        bench_cell_i(P);
        bench_cell_i((long long)(T / (uint64_t)P));
        bench_cell_f(one, 1);
        bench_cell_f(fl / (one * 1e-6) / 1e12, 1);
        bench_cell_f(ch, 1);
        bench_cell_f(fl / (ch * 1e-6) / 1e12, 1);
        bench_cell_f(ch / one, 3);
        bench_cell_i(w + w1);
        bench_row_end();
        if (w + w1 != 0) rc = 1;
      }
    }
  }
  bench_note("tax = chunked / one; #wrong counts both runs' sampled elements outside tolerance");
  bench_lt_fini(&lt);
  bench_group_destroy(g);
  return rc;
}

/* ---- section 1 alternative: cudaFree + cudaMalloc + IPC handle + a peer's open ------------- */

/* The peer: opens every handle it reads on stdin (closing the previous one) and answers one
 * byte per handle: 1 on success, 0 on failure. */
int bench_cuda_ipc_peer(void) {
  if (cudaSetDevice(0) != cudaSuccess || cudaFree(NULL) != cudaSuccess) return 1;
  unsigned char ok = 1;
  if (write(1, &ok, 1) != 1) return 1;
  void *open = NULL;
  cudaIpcMemHandle_t h;
  for (;;) {
    size_t got = 0;
    while (got < sizeof(h)) {
      ssize_t n = read(0, (char *)&h + got, sizeof(h) - got);
      if (n <= 0) goto done;
      got += (size_t)n;
    }
    if (open) cudaIpcCloseMemHandle(open);
    open = NULL;
    ok = cudaIpcOpenMemHandle(&open, h, cudaIpcMemLazyEnablePeerAccess) == cudaSuccess;
    if (write(1, &ok, 1) != 1) break;
  }
done:
  if (open) cudaIpcCloseMemHandle(open);
  return 0;
}

int bench_cuda_setshape_alternatives(const bench_opts *o, bench_group *g) {
  (void)g;
  const int n = o->realloc_iters;
  double *a = calloc((size_t)n, sizeof(double)), *b = calloc((size_t)n, sizeof(double)),
         *c = calloc((size_t)n, sizeof(double));
  int to_child[2] = {-1, -1}, from_child[2] = {-1, -1};
  pid_t pid = -1;
  bool peer = false;
  int rc = 0;
  if (pipe(to_child) == 0 && pipe(from_child) == 0) {
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, to_child[0], 0);
    posix_spawn_file_actions_adddup2(&fa, from_child[1], 1);
    posix_spawn_file_actions_addclose(&fa, to_child[1]);
    posix_spawn_file_actions_addclose(&fa, from_child[0]);
    char *argv[] = {"tpflex", "bench", "--ipc-peer", NULL};
    if (posix_spawn(&pid, "/proc/self/exe", &fa, NULL, argv, environ) == 0) {
      unsigned char ok = 0;
      close(to_child[0]);
      close(from_child[1]);
      to_child[0] = from_child[1] = -1;
      peer = read(from_child[0], &ok, 1) == 1 && ok == 1;
    }
    posix_spawn_file_actions_destroy(&fa);
  }
  void *buf = NULL;
  int done = 0;
  const uint64_t flags_bytes = 64ull * 128 * 8 + 64 * 8; /* tpflex's flag area, for realism */
  for (int i = 0; i < n && a && b && c; i++) {
    static const uint64_t div[4] = {8, 4, 2, 1};
    uint64_t bytes = o->capacity / div[i & 3] * o->hidden * 2 + flags_bytes;
    double t0 = bench_now_ns();
    if (buf) cudaFree(buf);
    buf = NULL;
    if (cudaMalloc(&buf, bytes) != cudaSuccess) {
      rc = 1;
      break;
    }
    double t1 = bench_now_ns();
    cudaIpcMemHandle_t h;
    if (cudaIpcGetMemHandle(&h, buf) != cudaSuccess) {
      rc = 1;
      break;
    }
    double t2 = bench_now_ns();
    double t3 = t2;
    if (peer) {
      unsigned char ok = 0;
      if (write(to_child[1], &h, sizeof(h)) != (ssize_t)sizeof(h) ||
          read(from_child[0], &ok, 1) != 1 || ok != 1) {
        peer = false;
        rc = 1;
      }
      t3 = bench_now_ns();
    }
    a[done] = t1 - t0;
    b[done] = t2 - t0;
    c[done] = t3 - t0;
    done++;
  }
  if (to_child[1] >= 0) close(to_child[1]);
  if (pid > 0) {
    int status;
    waitpid(pid, &status, 0);
  }
  if (from_child[0] >= 0) close(from_child[0]);
  if (buf) cudaFree(buf);
  const char *cols_unused = NULL;
  (void)cols_unused;
  if (done > 0) {
    double ma = bench_median(a, done), pa = bench_quantile(a, done, 0.99);
    double mb = bench_median(b, done), pb = bench_quantile(b, done, 0.99);
    bench_cell_s("cudaFree+cudaMalloc");
    bench_cell_i(1);
    bench_cell_i((long long)o->capacity);
    bench_cell_i((long long)o->hidden);
    bench_cell_i(done);
    bench_cell_f(ma, 0);
    bench_cell_f(pa, 0);
    bench_cell_f(NAN, 2);
    bench_cell_f(1, 2);
    bench_cell_f(NAN, 1);
    bench_cell_s("alternative: new buffer of T*H*2 bytes");
    bench_row_end();
    bench_cell_s("+cudaIpcGetMemHandle");
    bench_cell_i(1);
    bench_cell_i((long long)o->capacity);
    bench_cell_i((long long)o->hidden);
    bench_cell_i(done);
    bench_cell_f(mb, 0);
    bench_cell_f(pb, 0);
    bench_cell_f(NAN, 2);
    bench_cell_f(1, 2);
    bench_cell_f(NAN, 1);
    bench_cell_s("alternative: ... and export it");
    bench_row_end();
    if (peer) {
      double mc = bench_median(c, done), pc = bench_quantile(c, done, 0.99);
      bench_cell_s("+peer cudaIpcOpenMemHandle");
      bench_cell_i(2);
      bench_cell_i((long long)o->capacity);
      bench_cell_i((long long)o->hidden);
      bench_cell_i(done);
      bench_cell_f(mc, 0);
      bench_cell_f(pc, 0);
      bench_cell_f(NAN, 2);
      bench_cell_f(1, 2);
      bench_cell_f(NAN, 1);
      bench_cell_s("alternative: ... one peer process closes old, opens new");
      bench_row_end();
      bench_note("the +peer row is one peer process on the same GPU (pipe round trip included); "
                 "a TP group repeats the open on P-1 peers");
    } else {
      bench_note("peer open not measured: the helper process could not open CUDA IPC handles "
                 "here");
    }
  } else {
    bench_note("cudaMalloc/IPC alternative FAILED");
    rc = 1;
  }
  free(a);
  free(b);
  free(c);
  return rc;
}

#else /* !TPF_HAVE_CUDA: stubs, so the simulator-only CLI links */

static tpf_status bench_no_cuda(void) {
  return tpf_set_error(TPF_EUNSUPPORTED, "this build has no CUDA backend");
}
tpf_status bench_cuda_group_init(bench_group *g) {
  (void)g;
  return bench_no_cuda();
}
tpf_status bench_cuda_group_run(bench_group *g, bench_rank_fn fn, void *arg) {
  (void)g;
  (void)fn;
  (void)arg;
  return bench_no_cuda();
}
void bench_cuda_group_fini(bench_group *g) {
  (void)g;
}
void *bench_cuda_alloc(uint64_t bytes) {
  (void)bytes;
  return NULL;
}
void bench_cuda_free(void *p) {
  (void)p;
}
tpf_status bench_cuda_copy(bench_rank *rk, void *dst, const void *src, uint64_t bytes) {
  (void)rk;
  (void)dst;
  (void)src;
  (void)bytes;
  return bench_no_cuda();
}
tpf_status bench_cuda_tile(void *dst, const void *host, uint64_t unit, uint64_t total) {
  (void)dst;
  (void)host;
  (void)unit;
  (void)total;
  return bench_no_cuda();
}
tpf_status bench_cuda_download(bench_rank *rk, void *host, const void *dev, uint64_t bytes) {
  (void)rk;
  (void)host;
  (void)dev;
  (void)bytes;
  return bench_no_cuda();
}
tpf_status bench_cuda_poison(bench_rank *rk, void *dev, uint64_t bytes) {
  (void)rk;
  (void)dev;
  (void)bytes;
  return bench_no_cuda();
}
tpf_status bench_cuda_time_begin(bench_rank *rk, int it) {
  (void)rk;
  (void)it;
  return bench_no_cuda();
}
tpf_status bench_cuda_time_end(bench_rank *rk, int it) {
  (void)rk;
  (void)it;
  return bench_no_cuda();
}
tpf_status bench_cuda_time_collect(bench_rank *rk, int n, double *us) {
  (void)rk;
  (void)n;
  (void)us;
  return bench_no_cuda();
}
tpf_status bench_cuda_sync(bench_rank *rk) {
  (void)rk;
  return bench_no_cuda();
}
long long bench_cuda_dev_used(void) {
  return -1;
}
tpf_status bench_cuda_gemm_us(bench_group *g, uint64_t m, uint64_t n, uint64_t k, double *us) {
  (void)g;
  (void)m;
  (void)n;
  (void)k;
  (void)us;
  return bench_no_cuda();
}
void bench_cuda_header(const bench_opts *o) {
  (void)o;
}
int bench_cuda_section_chunking(const bench_opts *o) {
  (void)o;
  return 1;
}
int bench_cuda_setshape_alternatives(const bench_opts *o, bench_group *g) {
  (void)o;
  (void)g;
  return 1;
}
int bench_cuda_ipc_peer(void) {
  fprintf(stderr, "tpflex bench: --ipc-peer needs a CUDA build\n");
  return 2;
}

#endif /* TPF_HAVE_CUDA */
