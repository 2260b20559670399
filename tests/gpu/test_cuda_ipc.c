/* GPU test: two processes share one GPU (or use devices 0 and 1 when TPF_IPC_TWO_GPUS=1) and
 * register through CUDA IPC; each runs the gpu_check sweep (every algorithm/collective, a shape
 * history, results and canary). The bootstrap is proc_boot.c's (a process-shared barrier and
 * buffer in an anonymous shared mapping created before fork), so no process touches CUDA before
 * forking.
 * Exit 77 ("skipped: no GPU") without a usable device. */
#define _POSIX_C_SOURCE 200809L
#include "gpu_check.h"
#include "proc_boot.h"
#include "tpflex/tpflex_cuda.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NPROC 2

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

static int child(proc_boot *pb, int rank) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count < 1) {
    /* Keep the partner from waiting forever in the first barrier. */
    if (rank == 0)
      printf("skipped: no GPU (%s)\n", e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    return 77;
  }
  const char *two = getenv("TPF_IPC_TWO_GPUS");
  int device = (two && atoi(two) && count > 1) ? rank : 0;
  cudaSetDevice(device);
  keep_pool_memory(device);
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  tpf_bootstrap boot;
  proc_boot_fill(pb, rank, device, &boot);
  tpf_backend *be = NULL;
  gpu_check_stats st = {0, 0, 1};
  tpf_status rc = tpf_cuda_backend_create(&boot, &be);
  if (rc == TPF_OK) rc = gpu_check_rank(be, rank, s, &st);
  if (rc != TPF_OK)
    printf("FAIL process rank %d: %s: %s\n", rank, tpf_status_name(rc), tpf_last_error());
  if (be != NULL) tpf_cuda_backend_destroy(be);
  printf("process rank %d (pid %d, device %d): %d operations, %d failed\n", rank, (int)getpid(),
         device, st.cases, st.failures);
  fflush(stdout);
  return (rc != TPF_OK || st.failures) ? 1 : 0;
}

int main(void) {
  proc_boot *pb = proc_boot_create(NPROC);
  if (pb == NULL) return 1;
  const int rc = proc_boot_run(pb, child);
  if (rc == 77) return 77;
  printf("%s\n", rc ? "FAILED" : "PASSED");
  return rc ? 1 : 0;
}
