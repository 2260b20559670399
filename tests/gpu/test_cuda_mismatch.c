/* GPU test of cross-rank agreement on the CUDA backend, ranks as threads on one GPU:
 *  1. ranks disagree on the active shape: every rank gets TPF_EMISMATCH naming both shapes, within
 *     the timeout, and no byte of any registration changes;
 *  2. once they agree, the next operation works: the all-gathered buffer holds every rank's shard;
 *  3. a rank that never arrives: its peers get TPF_ETIMEOUT naming it, then TPF_ESTATE.
 * P = 2 and P = 3. Then, P = 2 (the 0.2 agreement: configuration fingerprint, op key):
 *  4. PIPELINE RS communicators that differ only in num_splits: tpf_comm_create fails with
 *     TPF_EMISMATCH on every rank naming num_splits and both values, nothing is registered, and
 *     an agreeing creation works afterwards;
 *  5. tpf_gemm_rs_ex with different per-operation num_splits: TPF_EMISMATCH from the handshake on
 *     every rank naming both keys ("gemm_rs/2 splits", "gemm_rs/4 splits"), no byte of the
 *     registration or the output changes, and the communicator stays usable: agreeing operations
 *     with either split count give the reference result.
 * Exit 77 ("skipped: no GPU") without a usable device. */
#define _POSIX_C_SOURCE 200809L
#include "reference.h"
#include "tpflex/tpflex_backend.h"
#include "tpflex/tpflex_cuda.h"

#include <cuda_runtime.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { C = 96, H = 64, N = 32, MAXP = 3 };

typedef struct {
  tpf_cuda_threads *group;
  int P, rank;
  pthread_barrier_t *bar;
  int failures;
  char log[4096];
} job;

#include <stdarg.h>

static void say(job *j, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(job *j, const char *fmt, ...) {
  size_t n = strlen(j->log);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(j->log + n, sizeof j->log - n, fmt, ap);
  va_end(ap);
}

#define CHECK(cond, what)                                                                          \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      say(j, "  rank %s: FAIL line %d: " what "\n", rank_s, __LINE__);                             \
      j->failures++;                                                                               \
      goto out;                                                                                    \
    }                                                                                              \
  } while (0)

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void *rank_main(void *p) {
  job *j = p;
  char rank_s[8];
  snprintf(rank_s, sizeof rank_s, "%d", j->rank);
  tpf_backend *be = NULL;
  tpf_comm *c = NULL;
  cudaStream_t s = NULL;
  void *dw = NULL, *dd = NULL;
  uint16_t *before = NULL, *after = NULL;
  tpf_bootstrap boot;
  CHECK(cudaSetDevice(0) == cudaSuccess, "cudaSetDevice");
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess, "stream");
  CHECK(tpf_cuda_threads_bootstrap(j->group, j->rank, 0, &boot) == TPF_OK, "bootstrap");
  CHECK(tpf_cuda_backend_create(&boot, &be) == TPF_OK, "backend");
  CHECK(tpf_cuda_backend_set_timeout(be, 2000) == TPF_OK, "timeout");
  tpf_comm_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.name = "qkv_fprop";
  cfg.algo = TPF_ALGO_RING;
  cfg.coll = TPF_COLL_AG;
  cfg.dtype = TPF_BF16;
  cfg.capacity.rows = C;
  cfg.capacity.cols = H;
  CHECK(tpf_comm_create(be, &cfg, &c) == TPF_OK, "comm create");
  CHECK(cudaMalloc(&dw, (size_t)N * H * 2) == cudaSuccess, "malloc w");
  CHECK(cudaMalloc(&dd, (size_t)C * N * 2) == cudaSuccess, "malloc d");
  CHECK(cudaMemset(dw, 0, (size_t)N * H * 2) == cudaSuccess, "memset w");
  void *base;
  uint64_t reg_bytes;
  CHECK(tpf_comm_registration(c, &base, &reg_bytes) == TPF_OK, "registration");
  before = malloc(reg_bytes);
  after = malloc(reg_bytes);
  CHECK(before && after, "host buffers");
  /* A rank-specific pattern over the whole registration. */
  for (uint64_t i = 0; i < reg_bytes / 2; i++)
    before[i] = (uint16_t)(0x3C00u + (unsigned)j->rank * 64u + (unsigned)(i % 61u));
  CHECK(cudaMemcpy(base, before, reg_bytes, cudaMemcpyHostToDevice) == cudaSuccess, "fill");

  /* 1. Disagreement: rank 0 runs 48 rows, the others 96. */
  const uint64_t t_bad = j->rank == 0 ? 48 : 96;
  tpf_shape sh = {t_bad, H};
  CHECK(tpf_comm_set_active_shape(c, sh) == TPF_OK, "set shape");
  tpf_matrix w = {dw, N, H, H, TPF_BF16}, d = {dd, t_bad, N, N, TPF_BF16};
  pthread_barrier_wait(j->bar);
  double t0 = now_s();
  tpf_status rc = tpf_ag_gemm(c, &w, &d, s);
  double dt = now_s() - t0;
  say(j, "  rank %s: mismatch -> %s in %.1f ms: %s\n", rank_s, tpf_status_name(rc), dt * 1000,
      tpf_last_error());
  tpf_status rs = cudaStreamSynchronize(s) == cudaSuccess ? TPF_OK : TPF_EBACKEND;
  CHECK(rc == TPF_EMISMATCH, "expected TPF_EMISMATCH");
  CHECK(rs == TPF_OK, "stream sync after mismatch");
  CHECK(strstr(tpf_last_error(), "48") && strstr(tpf_last_error(), "96"), "detail names both");
  CHECK(dt < 1.9, "mismatch reported before the timeout");
  pthread_barrier_wait(j->bar); /* every rank has seen it before anyone reads back */
  CHECK(cudaMemcpy(after, base, reg_bytes, cudaMemcpyDeviceToHost) == cudaSuccess, "read back");
  CHECK(memcmp(before, after, reg_bytes) == 0, "no byte of the registration changed");

  /* 2. Agreement: the next operation works, and the gathered buffer holds every shard. */
  sh.rows = 48;
  CHECK(tpf_comm_set_active_shape(c, sh) == TPF_OK, "set agreed shape");
  tpf_matrix local;
  CHECK(tpf_comm_local_chunk(c, &local) == TPF_OK, "local chunk");
  const uint64_t R = 48 / (uint64_t)j->P;
  for (uint64_t i = 0; i < R * H; i++)
    before[i] = (uint16_t)(0x4000u + (unsigned)j->rank);
  CHECK(cudaMemcpy(local.ptr, before, R * H * 2, cudaMemcpyHostToDevice) == cudaSuccess, "shard");
  d.rows = 48;
  pthread_barrier_wait(j->bar);
  rc = tpf_ag_gemm(c, &w, &d, s);
  CHECK(rc == TPF_OK, "agreed operation");
  CHECK(cudaStreamSynchronize(s) == cudaSuccess, "sync");
  CHECK(cudaMemcpy(after, base, 48 * H * 2, cudaMemcpyDeviceToHost) == cudaSuccess, "read");
  for (int q = 0; q < j->P; q++)
    for (uint64_t i = 0; i < R * H; i++)
      CHECK(after[(uint64_t)q * R * H + i] == (uint16_t)(0x4000u + (unsigned)q), "gathered");
  say(j, "  rank %s: agreed operation OK, gathered buffer holds all %d shards\n", rank_s, j->P);

  /* 3. The last rank never arrives: the others time out naming it, then refuse work. */
  pthread_barrier_wait(j->bar);
  if (j->rank != j->P - 1) {
    rc = tpf_ag_gemm(c, &w, &d, s);
    say(j, "  rank %s: absent peer -> %s: %s\n", rank_s, tpf_status_name(rc), tpf_last_error());
    CHECK(rc == TPF_ETIMEOUT, "expected TPF_ETIMEOUT");
    char who[32];
    snprintf(who, sizeof who, "rank %d", j->P - 1);
    CHECK(strstr(tpf_last_error(), who) != NULL, "detail names the absent rank");
    CHECK(tpf_ag_gemm(c, &w, &d, s) == TPF_ESTATE, "then TPF_ESTATE");
    cudaStreamSynchronize(s);
  }
  pthread_barrier_wait(j->bar);

out:
  if (c) tpf_comm_destroy(c);
  if (be) tpf_cuda_backend_destroy(be);
  cudaFree(dw);
  cudaFree(dd);
  free(before);
  free(after);
  if (s) cudaStreamDestroy(s);
  return NULL;
}

/* ---- 4 and 5: split counts ---- */

enum { SC = 64, SH = 64, SK = 32 }; /* capacity rows, hidden, GEMM k of the RS case */

static uint64_t seed_of(int what, int rank) {
  return 0x9E3779B97F4A7C15ull ^ ((uint64_t)what << 48) ^ ((uint64_t)rank << 40);
}

/* Rank q's inputs of the RS case, regenerated by every rank: x_q [SC, SK], w_q [SH, SK], fp32. */
static void rs_inputs(int q, float *x, float *w) {
  tpf_matrix xm = {x, SC, SK, SK, TPF_FP32}, wm = {w, SH, SK, SK, TPF_FP32};
  tpf_ref_fill(&xm, seed_of(1, q), -1.0f, 1.0f);
  tpf_ref_fill(&wm, seed_of(2, q), -1.0f, 1.0f);
}

static void *rank_splits(void *p) {
  job *j = p;
  char rank_s[8];
  snprintf(rank_s, sizeof rank_s, "%d", j->rank);
  const int P = j->P, r = j->rank;
  const uint64_t R = SC / (uint64_t)P;
  tpf_backend *be = NULL;
  tpf_comm *c = NULL, *bad = NULL;
  cudaStream_t s = NULL;
  float *dx = NULL, *dw = NULL, *dout = NULL;
  float *hx = malloc(sizeof(float) * SC * SK), *hw = malloc(sizeof(float) * SH * SK);
  float *want = calloc(R * SH, sizeof(float)), *got = malloc(sizeof(float) * R * SH);
  unsigned char *before = NULL, *after = NULL;
  float *out_before = malloc(sizeof(float) * R * SH);
  tpf_bootstrap boot;
  CHECK(hx && hw && want && got && out_before, "host buffers");
  CHECK(cudaSetDevice(0) == cudaSuccess, "cudaSetDevice");
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess, "stream");
  CHECK(tpf_cuda_threads_bootstrap(j->group, r, 0, &boot) == TPF_OK, "bootstrap");
  CHECK(tpf_cuda_backend_create(&boot, &be) == TPF_OK, "backend");
  CHECK(tpf_cuda_backend_set_timeout(be, 2000) == TPF_OK, "timeout");

  /* 4. Only num_splits differs: refused at creation on every rank, nothing registered. */
  tpf_comm_config cfg = TPF_COMM_CONFIG_INIT;
  cfg.name = "fc2_fprop";
  cfg.algo = TPF_ALGO_PIPELINE;
  cfg.coll = TPF_COLL_RS;
  cfg.dtype = TPF_FP32;
  cfg.capacity.rows = SC;
  cfg.capacity.cols = SH;
  cfg.num_splits = r == 0 ? 2 : 4;
  pthread_barrier_wait(j->bar);
  tpf_status rc = tpf_comm_create(be, &cfg, &bad);
  say(j, "  rank %s: num_splits 2 vs 4 at creation -> %s: %s\n", rank_s, tpf_status_name(rc),
      tpf_last_error());
  CHECK(rc == TPF_EMISMATCH, "expected TPF_EMISMATCH at creation");
  CHECK(bad == NULL, "no communicator on failure");
  CHECK(strstr(tpf_last_error(), "num_splits") != NULL, "detail names num_splits");
  CHECK(strstr(tpf_last_error(), "2 on rank 0") && strstr(tpf_last_error(), "4 on rank 1"),
        "detail names both values");
  /* The group is still in step: an agreeing creation works. */
  cfg.num_splits = 0;
  CHECK(tpf_comm_create(be, &cfg, &c) == TPF_OK, "agreeing creation after the mismatch");

  /* 5. Per-operation num_splits differ. Inputs, and a pattern in the registration and output. */
  for (int q = 0; q < P; q++) {
    rs_inputs(q, hx, hw);
    float part[SC * SH];
    tpf_matrix xm = {hx, SC, SK, SK, TPF_FP32}, wm = {hw, SH, SK, SK, TPF_FP32};
    CHECK(tpf_ref_gemm_f32(&xm, &wm, part) == TPF_OK, "reference partial");
    for (uint64_t i = 0; i < R * SH; i++)
      want[i] += part[(uint64_t)r * R * SH + i];
  }
  rs_inputs(r, hx, hw);
  CHECK(cudaMalloc((void **)&dx, sizeof(float) * SC * SK) == cudaSuccess, "malloc x");
  CHECK(cudaMalloc((void **)&dw, sizeof(float) * SH * SK) == cudaSuccess, "malloc w");
  CHECK(cudaMalloc((void **)&dout, sizeof(float) * R * SH) == cudaSuccess, "malloc out");
  CHECK(cudaMemcpy(dx, hx, sizeof(float) * SC * SK, cudaMemcpyHostToDevice) == cudaSuccess, "x");
  CHECK(cudaMemcpy(dw, hw, sizeof(float) * SH * SK, cudaMemcpyHostToDevice) == cudaSuccess, "w");
  for (uint64_t i = 0; i < R * SH; i++)
    out_before[i] = -7.0f - (float)(i % 13u);
  CHECK(cudaMemcpy(dout, out_before, sizeof(float) * R * SH, cudaMemcpyHostToDevice) == cudaSuccess,
        "out");
  void *base;
  uint64_t reg_bytes;
  CHECK(tpf_comm_registration(c, &base, &reg_bytes) == TPF_OK, "registration");
  before = malloc(reg_bytes);
  after = malloc(reg_bytes);
  CHECK(before && after, "host registration copies");
  for (uint64_t i = 0; i < reg_bytes; i++)
    before[i] = (unsigned char)(0x40u + (unsigned)r * 8u + (unsigned)(i % 7u));
  CHECK(cudaMemcpy(base, before, reg_bytes, cudaMemcpyHostToDevice) == cudaSuccess, "fill");
  tpf_matrix xm = {dx, SC, SK, SK, TPF_FP32}, wm = {dw, SH, SK, SK, TPF_FP32};
  tpf_matrix om = {dout, R, SH, SH, TPF_FP32};
  tpf_op_options opt = TPF_OP_OPTIONS_INIT;
  opt.num_splits = r == 0 ? 2 : 4;
  pthread_barrier_wait(j->bar);
  double t0 = now_s();
  rc = tpf_gemm_rs_ex(c, &xm, &wm, &om, &opt, s);
  double dt = now_s() - t0;
  say(j, "  rank %s: per-op num_splits 2 vs 4 -> %s in %.1f ms: %s\n", rank_s, tpf_status_name(rc),
      dt * 1000, tpf_last_error());
  CHECK(rc == TPF_EMISMATCH, "expected TPF_EMISMATCH from the handshake");
  CHECK(strstr(tpf_last_error(), "gemm_rs/2 splits") &&
            strstr(tpf_last_error(), "gemm_rs/4 splits"),
        "detail names both operation keys");
  CHECK(dt < 1.9, "mismatch reported before the timeout");
  CHECK(cudaStreamSynchronize(s) == cudaSuccess, "stream sync after mismatch");
  CHECK(tpf_comm_sync(c) == TPF_OK, "communicator sync after mismatch");
  pthread_barrier_wait(j->bar); /* every rank has seen it before anyone reads back */
  CHECK(cudaMemcpy(after, base, reg_bytes, cudaMemcpyDeviceToHost) == cudaSuccess, "read back");
  CHECK(memcmp(before, after, reg_bytes) == 0, "no byte of the registration changed");
  CHECK(cudaMemcpy(got, dout, sizeof(float) * R * SH, cudaMemcpyDeviceToHost) == cudaSuccess,
        "read out");
  CHECK(memcmp(got, out_before, sizeof(float) * R * SH) == 0, "no byte of the output changed");

  /* Still usable: agreeing operations with the default (4) and with 2 splits. */
  const int agreed[] = {4, 2, 0};
  for (size_t a = 0; a < sizeof agreed / sizeof agreed[0]; a++) {
    opt.num_splits = agreed[a];
    pthread_barrier_wait(j->bar);
    rc = tpf_gemm_rs_ex(c, &xm, &wm, &om, &opt, s);
    CHECK(rc == TPF_OK, "agreeing operation after the mismatch");
    CHECK(cudaStreamSynchronize(s) == cudaSuccess, "sync");
    CHECK(cudaMemcpy(got, dout, sizeof(float) * R * SH, cudaMemcpyDeviceToHost) == cudaSuccess,
          "read out");
    tpf_matrix gm = {got, R, SH, SH, TPF_FP32}, wantm = {want, R, SH, SH, TPF_FP32};
    tpf_ref_result res;
    CHECK(tpf_ref_compare(&gm, &wantm, tpf_ref_tolerance(TPF_FP32), &res) == TPF_OK && res.pass,
          "result matches the reference");
    say(j, "  rank %s: agreed num_splits %d -> OK, result matches the reference\n", rank_s,
        agreed[a]);
  }
  CHECK(tpf_comm_sync(c) == TPF_OK, "communicator sync at the end");
  pthread_barrier_wait(j->bar);

out:
  if (c) tpf_comm_destroy(c);
  if (be) tpf_cuda_backend_destroy(be);
  cudaFree(dx);
  cudaFree(dw);
  cudaFree(dout);
  free(hx);
  free(hw);
  free(want);
  free(got);
  free(out_before);
  free(before);
  free(after);
  if (s) cudaStreamDestroy(s);
  return NULL;
}

static int run_group(int P, void *(*fn)(void *), const char *what) {
  tpf_cuda_threads *g = NULL;
  if (tpf_cuda_threads_create(P, &g) != TPF_OK) {
    printf("FAIL tpf_cuda_threads_create: %s\n", tpf_last_error());
    return 1;
  }
  pthread_barrier_t bar;
  pthread_barrier_init(&bar, NULL, (unsigned)P);
  job jobs[MAXP];
  pthread_t th[MAXP];
  memset(jobs, 0, sizeof jobs);
  for (int r = 0; r < P; r++) {
    jobs[r].group = g;
    jobs[r].P = P;
    jobs[r].rank = r;
    jobs[r].bar = &bar;
    pthread_create(&th[r], NULL, fn, &jobs[r]);
  }
  printf("P=%d, %s:\n", P, what);
  int failures = 0;
  for (int r = 0; r < P; r++) {
    pthread_join(th[r], NULL);
    fputs(jobs[r].log, stdout);
    failures += jobs[r].failures;
  }
  pthread_barrier_destroy(&bar);
  tpf_cuda_threads_destroy(g);
  return failures;
}

int main(void) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count < 1) {
    printf("skipped: no GPU (%s)\n", e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    return 77;
  }
  int failures = 0;
  for (int P = 2; P <= MAXP; P++)
    failures += run_group(P, rank_main, "shapes");
  failures += run_group(2, rank_splits, "split counts");
  printf("%s: %d failures\n", failures ? "FAILED" : "PASSED", failures);
  return failures ? 1 : 0;
}
