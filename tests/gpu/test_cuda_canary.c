/* GPU test: every algorithm/collective on the CUDA backend with P ranks as threads on one GPU,
 * through a history of active shapes; results against the host reference and the registration's
 * bytes past the active layout against a canary (device memory read back). P in {1, 2, 4, 8}, or
 * `--tp N`. Exit 77 ("skipped: no GPU") without a usable device. */
#define _POSIX_C_SOURCE 200809L
#include "gpu_check.h"
#include "tpflex/tpflex_cuda.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  tpf_cuda_threads *group;
  int rank, device;
  tpf_status rc;
  char detail[512];
  gpu_check_stats st;
  tpf_cuda_stats cst;
} rank_job;

/* The stream-ordered pool keeps its memory: with the default release threshold (0) every
 * synchronisation returns it and the next cudaMallocAsync maps memory again, which may wait for the
 * device while a peer rank's spinning wait waits for this thread. */
static void keep_pool_memory(int device) {
  cudaMemPool_t pool;
  if (cudaDeviceGetDefaultMemPool(&pool, device) == cudaSuccess) {
    uint64_t keep = UINT64_MAX;
    cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
  }
}

static void *rank_main(void *p) {
  rank_job *j = p;
  tpf_backend *be = NULL;
  cudaStream_t s = NULL;
  tpf_bootstrap boot;
  tpf_status rc = TPF_OK;
  if (cudaSetDevice(j->device) != cudaSuccess ||
      cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) {
    rc = tpf_set_error(TPF_EBACKEND, "cannot set device %d or create a stream", j->device);
    goto out;
  }
  rc = tpf_cuda_threads_bootstrap(j->group, j->rank, j->device, &boot);
  if (rc == TPF_OK) rc = tpf_cuda_backend_create(&boot, &be);
  if (rc == TPF_OK) rc = gpu_check_rank(be, j->rank, s, &j->st);
  if (be != NULL) {
    tpf_cuda_backend_stats(be, &j->cst);
    tpf_status rc2 = tpf_cuda_backend_destroy(be);
    if (rc == TPF_OK) rc = rc2;
  }
out:
  j->rc = rc;
  snprintf(j->detail, sizeof j->detail, "%s", rc == TPF_OK ? "" : tpf_last_error());
  if (s != NULL) {
    cudaStreamSynchronize(s);
    cudaStreamDestroy(s);
  }
  return NULL;
}

static int run_group(int P, int device, int verbose) {
  tpf_cuda_threads *g = NULL;
  if (tpf_cuda_threads_create(P, &g) != TPF_OK) {
    printf("FAIL tpf_cuda_threads_create: %s\n", tpf_last_error());
    return 1;
  }
  rank_job jobs[8];
  pthread_t th[8];
  memset(jobs, 0, sizeof jobs);
  for (int r = 0; r < P; r++) {
    jobs[r].group = g;
    jobs[r].rank = r;
    jobs[r].device = device;
    jobs[r].st.verbose = verbose;
    pthread_create(&th[r], NULL, rank_main, &jobs[r]);
  }
  int failed = 0, cases = 0;
  for (int r = 0; r < P; r++) {
    pthread_join(th[r], NULL);
    if (jobs[r].rc != TPF_OK) {
      printf("FAIL P=%d rank %d: %s: %s\n", P, r, tpf_status_name(jobs[r].rc), jobs[r].detail);
      failed++;
    }
    failed += jobs[r].st.failures;
    cases += jobs[r].st.cases;
  }
  tpf_cuda_threads_destroy(g);
  printf("P=%d: %d rank-operations, %d failed; rank 0 GEMM heuristic queries %llu, cache hits "
         "%llu\n",
         P, cases, failed, (unsigned long long)jobs[0].cst.gemm_heuristic_queries,
         (unsigned long long)jobs[0].cst.gemm_cache_hits);
  return failed;
}

int main(int argc, char **argv) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count < 1) {
    printf("skipped: no GPU (%s)\n", e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    return 77;
  }
  int only = 0, verbose = 0;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--tp") == 0 && i + 1 < argc)
      only = atoi(argv[++i]);
    else if (strcmp(argv[i], "-v") == 0)
      verbose = 1;
  }
  cudaSetDevice(0);
  keep_pool_memory(0);
  const int Ps[] = {1, 2, 4, 8};
  int failed = 0;
  for (size_t i = 0; i < sizeof Ps / sizeof Ps[0]; i++)
    if (only == 0 || only == Ps[i]) failed += run_group(Ps[i], 0, verbose);
  printf("%s\n", failed ? "FAILED" : "PASSED");
  return failed ? 1 : 0;
}
