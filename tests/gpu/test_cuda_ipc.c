/* GPU test: two processes share one GPU (or use devices 0 and 1 when TPF_IPC_TWO_GPUS=1) and
 * register through CUDA IPC; each runs the gpu_check sweep (every algorithm/collective, a shape
 * history, results and canary). The bootstrap is a process-shared barrier and buffer in an
 * anonymous shared mapping created before fork, so no process touches CUDA before forking.
 * Exit 77 ("skipped: no GPU") without a usable device. */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS */
#define _POSIX_C_SOURCE 200809L
#include "gpu_check.h"
#include "tpflex/tpflex_cuda.h"

#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define NPROC 2
#define SLOT 8192

typedef struct {
  pthread_barrier_t bar;
  unsigned char buf[NPROC][SLOT];
} shared_boot;

typedef struct {
  shared_boot *sh;
  int rank;
} proc_ctx;

static tpf_status sh_barrier(void *ctx) {
  proc_ctx *c = ctx;
  pthread_barrier_wait(&c->sh->bar);
  return TPF_OK;
}

static tpf_status sh_allgather(void *ctx, const void *send, void *recv, size_t bytes) {
  proc_ctx *c = ctx;
  if (bytes > SLOT)
    return tpf_set_error(TPF_EINVAL, "allgather of %zu bytes exceeds the %d-byte slot", bytes,
                         SLOT);
  memcpy(c->sh->buf[c->rank], send, bytes);
  pthread_barrier_wait(&c->sh->bar);
  for (int r = 0; r < NPROC; r++)
    memcpy((unsigned char *)recv + (size_t)r * bytes, c->sh->buf[r], bytes);
  pthread_barrier_wait(&c->sh->bar);
  return TPF_OK;
}

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

static int child(shared_boot *sh, int rank) {
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
  proc_ctx ctx = {sh, rank};
  tpf_bootstrap boot = {.tp_size = NPROC,
                        .rank = rank,
                        .device = device,
                        .allgather = sh_allgather,
                        .barrier = sh_barrier,
                        .ctx = &ctx};
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
  shared_boot *sh =
      mmap(NULL, sizeof(shared_boot), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (sh == MAP_FAILED) {
    perror("mmap");
    return 1;
  }
  pthread_barrierattr_t ba;
  pthread_barrierattr_init(&ba);
  pthread_barrierattr_setpshared(&ba, PTHREAD_PROCESS_SHARED);
  pthread_barrier_init(&sh->bar, &ba, NPROC);
  pid_t pids[NPROC];
  for (int r = 0; r < NPROC; r++) {
    fflush(stdout);
    pids[r] = fork();
    if (pids[r] < 0) {
      perror("fork");
      return 1;
    }
    if (pids[r] == 0) _exit(child(sh, r));
  }
  int worst = 0, skipped = 0;
  int reaped[NPROC] = {0};
  for (int done = 0; done < NPROC; done++) {
    int status = 0;
    pid_t p = wait(&status);
    if (p < 0) break;
    for (int r = 0; r < NPROC; r++)
      if (pids[r] == p) reaped[r] = 1;
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (code == 77) {
      skipped++;
    } else if (code != 0) {
      worst = code;
      /* A failed process may leave its partner in a barrier: stop the partner we started. */
      for (int r = 0; r < NPROC; r++)
        if (!reaped[r]) kill(pids[r], SIGTERM);
    }
  }
  if (skipped == NPROC) return 77;
  printf("%s\n", worst ? "FAILED" : "PASSED");
  return worst ? 1 : 0;
}
