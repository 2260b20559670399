/* GPU test: a failure on one communicator leaves the others working (tpflex.h:
 * deferred errors belong to the communicator whose operation caused them).
 *
 * P = 2 ranks as threads on GPU 0, with the device flag kernels (TPF_CUDA_DEVICE_FLAGS=1, set
 * here before the backend reads its parameters), whose waits report into a device status area:
 * the path where a failure is deferred. Two communicators, A ('fc1_fprop') and B ('fc2_fprop').
 *  1. Rank 0 enqueues an operation on A that rank 1 never joins: A's handshake kernel times out
 *     on the device (2 s) and records it. Rank 0 waits for its stream, so the failure is in
 *     place before anything else runs.
 *  2. B is untouched: tpf_comm_async_error(B) is TPF_OK on both ranks, and two operations on B
 *     succeed on both ranks with every shard in the gathered buffer, tpf_comm_sync(B) TPF_OK.
 *     (The old backend had one status area per backend: rank 0's execute on B reported A's
 *     timeout, the core left B failed for good, and B's kernels skipped their work.)
 *  3. A's failure is A's: tpf_comm_async_error(A) and tpf_comm_sync(A) on rank 0 are
 *     TPF_ETIMEOUT naming 'fc1_fprop' and rank 1; A refuses further operations (TPF_ESTATE).
 * Exit 77 ("skipped: no GPU") without a usable device. */
#define _POSIX_C_SOURCE 200809L
#include "tpflex/tpflex_backend.h"
#include "tpflex/tpflex_cuda.h"

#include <cuda_runtime.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { P = 2, C = 96, T = 48, H = 64, N = 32 };

typedef struct {
  tpf_cuda_threads *group;
  int rank;
  pthread_barrier_t *bar;
  int failures;
  char log[4096];
} job;

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
      say(j, "  rank %d: FAIL line %d: %s (last error: %s)\n", j->rank, __LINE__, what,            \
          tpf_last_error());                                                                       \
      j->failures++;                                                                               \
      goto out;                                                                                    \
    }                                                                                              \
  } while (0)

static tpf_status make(tpf_backend *be, const char *name, tpf_comm **out) {
  tpf_comm_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.name = name;
  cfg.algo = TPF_ALGO_RING;
  cfg.coll = TPF_COLL_AG;
  cfg.dtype = TPF_BF16;
  cfg.capacity.rows = C;
  cfg.capacity.cols = H;
  tpf_status rc = tpf_comm_create(be, &cfg, out);
  if (rc != TPF_OK) return rc;
  tpf_shape s = {T, H};
  return tpf_comm_set_active_shape(*out, s);
}

/* One ag_gemm on B with rank-tagged shards; true when the gathered buffer holds every shard. */
static bool run_b(job *j, tpf_comm *b, tpf_matrix *w, tpf_matrix *d, cudaStream_t s, uint16_t *host,
                  tpf_status *rc) {
  tpf_matrix local, full;
  const uint64_t R = T / P;
  *rc = tpf_comm_local_chunk(b, &local);
  if (*rc != TPF_OK) return false;
  for (uint64_t i = 0; i < R * H; i++)
    host[i] = (uint16_t)(0x4000u + (unsigned)j->rank);
  if (cudaMemcpy(local.ptr, host, R * H * 2, cudaMemcpyHostToDevice) != cudaSuccess) return false;
  pthread_barrier_wait(j->bar); /* both shards in place before either rank sends */
  *rc = tpf_ag_gemm(b, w, d, s);
  if (*rc != TPF_OK) return false;
  if (cudaStreamSynchronize(s) != cudaSuccess) return false;
  pthread_barrier_wait(j->bar); /* both done before the next round overwrites a shard */
  if (tpf_comm_buffer(b, &full) != TPF_OK) return false;
  if (cudaMemcpy(host, full.ptr, (size_t)T * H * 2, cudaMemcpyDeviceToHost) != cudaSuccess)
    return false;
  for (int q = 0; q < P; q++)
    for (uint64_t i = 0; i < R * H; i++)
      if (host[(uint64_t)q * R * H + i] != (uint16_t)(0x4000u + (unsigned)q)) return false;
  return true;
}

static void *rank_main(void *p) {
  job *j = p;
  tpf_backend *be = NULL;
  tpf_comm *a = NULL, *b = NULL;
  cudaStream_t s = NULL;
  void *dw = NULL, *dd = NULL;
  uint16_t *host = malloc((size_t)C * H * 2);
  tpf_bootstrap boot;
  tpf_status rc, st;
  CHECK(host != NULL, "host buffer");
  CHECK(cudaSetDevice(0) == cudaSuccess, "cudaSetDevice");
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess, "stream");
  CHECK(tpf_cuda_threads_bootstrap(j->group, j->rank, 0, &boot) == TPF_OK, "bootstrap");
  CHECK(tpf_cuda_backend_create(&boot, &be) == TPF_OK, "backend");
  CHECK(tpf_cuda_backend_set_timeout(be, 2000) == TPF_OK, "timeout");
  CHECK(make(be, "fc1_fprop", &a) == TPF_OK, "create A");
  CHECK(make(be, "fc2_fprop", &b) == TPF_OK, "create B");
  CHECK(cudaMalloc(&dw, (size_t)N * H * 2) == cudaSuccess, "malloc w");
  CHECK(cudaMalloc(&dd, (size_t)C * N * 2) == cudaSuccess, "malloc d");
  CHECK(cudaMemset(dw, 0, (size_t)N * H * 2) == cudaSuccess, "memset w");
  tpf_matrix w = {dw, N, H, H, TPF_BF16}, d = {dd, T, N, N, TPF_BF16};

  /* 1. A fails on rank 0's device: rank 1 never joins. */
  pthread_barrier_wait(j->bar);
  if (j->rank == 0) {
    rc = tpf_ag_gemm(a, &w, &d, s);
    say(j, "  rank 0: A enqueued -> %s\n", tpf_status_name(rc));
    CHECK(rc == TPF_OK, "A's operation is enqueued (its failure is deferred)");
    CHECK(cudaStreamSynchronize(s) == cudaSuccess, "A's kernels finish (bounded on the device)");
    CHECK(tpf_comm_async_error(a, &st) == TPF_OK && st == TPF_ETIMEOUT,
          "A's deferred status is TPF_ETIMEOUT");
  }
  pthread_barrier_wait(j->bar);

  /* 2. B works on both ranks. */
  CHECK(tpf_comm_async_error(b, &st) == TPF_OK && st == TPF_OK, "B's deferred status is OK");
  for (int round = 0; round < 2; round++) {
    bool right = run_b(j, b, &w, &d, s, host, &rc);
    say(j, "  rank %d: B operation %d -> %s%s\n", j->rank, round + 1, tpf_status_name(rc),
        right ? ", every shard gathered" : "");
    CHECK(rc == TPF_OK, "B's operation succeeds although A failed");
    CHECK(right, "B's gathered buffer holds every shard");
  }
  CHECK(tpf_comm_sync(b) == TPF_OK, "tpf_comm_sync(B) is OK");

  /* 3. A's failure is A's. */
  if (j->rank == 0) {
    rc = tpf_comm_sync(a);
    say(j, "  rank 0: tpf_comm_sync(A) -> %s: %s\n", tpf_status_name(rc), tpf_last_error());
    CHECK(rc == TPF_ETIMEOUT, "tpf_comm_sync(A) reports A's timeout");
    CHECK(strstr(tpf_last_error(), "fc1_fprop") && strstr(tpf_last_error(), "rank 1"),
          "the detail names A and the rank it waited for");
    CHECK(tpf_ag_gemm(a, &w, &d, s) == TPF_ESTATE, "A refuses further operations");
    CHECK(tpf_comm_async_error(b, &st) == TPF_OK && st == TPF_OK, "B is still OK");
  }
  pthread_barrier_wait(j->bar);

out:
  if (a) tpf_comm_destroy(a);
  if (b) tpf_comm_destroy(b);
  if (be) tpf_cuda_backend_destroy(be);
  cudaFree(dw);
  cudaFree(dd);
  free(host);
  if (s) cudaStreamDestroy(s);
  return NULL;
}

/* A rank that fails a check leaves the test barriers, and its peer then waits for it (the old
 * backend: rank 0's B failed, rank 1 waited in B's handshake and at the barrier): fail, not
 * hang. */
static void watchdog(int sig) {
  (void)sig;
  static const char msg[] = "FAILED: watchdog: a rank is stuck (a check failed on its peer?)\n";
  ssize_t n = write(1, msg, sizeof msg - 1);
  (void)n;
  _exit(1);
}

int main(void) {
  signal(SIGALRM, watchdog);
  alarm(90);
  /* The device flag kernels in threads mode (read once, at the first backend creation). */
  setenv("TPF_CUDA_DEVICE_FLAGS", "1", 1);
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count < 1) {
    printf("skipped: no GPU (%s)\n", e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    return 77;
  }
  tpf_cuda_threads *g = NULL;
  if (tpf_cuda_threads_create(P, &g) != TPF_OK) {
    printf("FAILED tpf_cuda_threads_create: %s\n", tpf_last_error());
    return 1;
  }
  pthread_barrier_t bar;
  pthread_barrier_init(&bar, NULL, P);
  job jobs[P];
  pthread_t th[P];
  memset(jobs, 0, sizeof jobs);
  for (int r = 0; r < P; r++) {
    jobs[r].group = g;
    jobs[r].rank = r;
    jobs[r].bar = &bar;
    pthread_create(&th[r], NULL, rank_main, &jobs[r]);
  }
  int failures = 0;
  for (int r = 0; r < P; r++) {
    pthread_join(th[r], NULL);
    fputs(jobs[r].log, stdout);
    failures += jobs[r].failures;
  }
  pthread_barrier_destroy(&bar);
  tpf_cuda_threads_destroy(g);
  printf("%s: %d failures\n", failures ? "FAILED" : "PASSED", failures);
  return failures ? 1 : 0;
}
