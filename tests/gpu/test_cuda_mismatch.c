/* GPU test of cross-rank agreement on the CUDA backend, ranks as threads on one GPU:
 *  1. ranks disagree on the active shape: every rank gets TPF_EMISMATCH naming both shapes, within
 *     the timeout, and no byte of any registration changes;
 *  2. once they agree, the next operation works: the all-gathered buffer holds every rank's shard;
 *  3. a rank that never arrives: its peers get TPF_ETIMEOUT naming it, then TPF_ESTATE.
 * P = 2 and P = 3. Exit 77 ("skipped: no GPU") without a usable device. */
#define _POSIX_C_SOURCE 200809L
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
  char log[2048];
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

int main(void) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count < 1) {
    printf("skipped: no GPU (%s)\n", e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    return 77;
  }
  int failures = 0;
  for (int P = 2; P <= MAXP; P++) {
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
      pthread_create(&th[r], NULL, rank_main, &jobs[r]);
    }
    printf("P=%d:\n", P);
    for (int r = 0; r < P; r++) {
      pthread_join(th[r], NULL);
      fputs(jobs[r].log, stdout);
      failures += jobs[r].failures;
    }
    pthread_barrier_destroy(&bar);
    tpf_cuda_threads_destroy(g);
  }
  printf("%s: %d failures\n", failures ? "FAILED" : "PASSED", failures);
  return failures ? 1 : 0;
}
