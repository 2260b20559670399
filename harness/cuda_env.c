/* The rank environment of the CUDA backend (rank_env.h), shared by conformance_cuda and `tpflex
 * demo --backend cuda`: P ranks as threads of this process on one GPU (device 0, or
 * TPF_CUDA_TEST_DEVICE), bootstrapped in-process; operands in device memory; one non-blocking
 * stream per rank. In process mode (conformance_cuda --procs) this process only holds the state
 * and each rank's process sets up its own device and stream (tpf_cuda_conf_env_enter_rank).
 *
 * Operand memory uses the stream-ordered allocator (cudaMallocAsync/cudaFreeAsync): a plain
 * cudaFree may synchronise the whole device, and with several ranks on one GPU that would wait
 * for another rank's spinning wait, which may wait for this thread.
 */
#define _POSIX_C_SOURCE 200809L
#include "cuda_env.h"

#include "tpflex/tpflex_cuda.h"

#include <cuda_runtime.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  int device;
  int P;
  bool touched; /* this process made CUDA calls for the environment */
  cudaStream_t streams[TPF_MAX_RANKS];
} cuda_env_state;

typedef struct {
  tpf_conf_env *env;
  tpf_cuda_threads *group;
  int rank;
  tpf_conf_rank_fn fn;
  void *arg;
  tpf_status rc;
  char detail[512];
} cuda_rank_job;

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

static tpf_status cuda_fail(cudaError_t e, const char *what) {
  return tpf_set_error(TPF_EBACKEND, "%s: %s", what, cudaGetErrorString(e));
}

static void *cuda_rank_main(void *p) {
  cuda_rank_job *job = p;
  cuda_env_state *st = job->env->ctx;
  tpf_backend *be = NULL;
  tpf_bootstrap boot;
  tpf_status rc = TPF_OK;
  cudaError_t e = cudaSetDevice(st->device);
  if (e != cudaSuccess) {
    rc = cuda_fail(e, "cudaSetDevice");
    goto out;
  }
  rc = tpf_cuda_threads_bootstrap(job->group, job->rank, st->device, &boot);
  if (rc == TPF_OK) rc = tpf_cuda_backend_create(&boot, &be);
  if (rc == TPF_OK) rc = job->fn(be, job->rank, job->arg);
  if (be != NULL) {
    char saved[512];
    snprintf(saved, sizeof saved, "%s", tpf_last_error());
    tpf_status rc2 = tpf_cuda_backend_destroy(be);
    if (rc == TPF_OK)
      rc = rc2;
    else
      tpf_set_error(rc, "%s", saved);
  }
out:
  job->rc = rc;
  snprintf(job->detail, sizeof job->detail, "%s", rc == TPF_OK ? "" : tpf_last_error());
  return NULL;
}

static tpf_status cuda_run(tpf_conf_env *env, int P, tpf_conf_rank_fn fn, void *arg) {
  cuda_env_state *st = env->ctx;
  if (P < 1 || P > env->max_ranks)
    return tpf_set_error(TPF_EINVAL, "cuda env: P=%d outside 1..%d", P, env->max_ranks);
  cudaSetDevice(st->device);
  for (int r = 0; r < P; r++) {
    if (st->streams[r] == NULL) {
      cudaError_t e = cudaStreamCreateWithFlags(&st->streams[r], cudaStreamNonBlocking);
      if (e != cudaSuccess) return cuda_fail(e, "cudaStreamCreateWithFlags");
    }
  }
  st->P = P;
  tpf_cuda_threads *group = NULL;
  tpf_status rc = tpf_cuda_threads_create(P, &group);
  if (rc != TPF_OK) return rc;
  cuda_rank_job jobs[TPF_MAX_RANKS];
  pthread_t th[TPF_MAX_RANKS];
  memset(jobs, 0, sizeof jobs);
  int started = 0;
  for (int r = 0; r < P; r++) {
    jobs[r] = (cuda_rank_job){.env = env, .group = group, .rank = r, .fn = fn, .arg = arg};
    if (pthread_create(&th[r], NULL, cuda_rank_main, &jobs[r]) != 0) {
      rc = tpf_set_error(TPF_EBACKEND, "pthread_create failed for rank %d", r);
      break;
    }
    started++;
  }
  for (int r = 0; r < started; r++)
    pthread_join(th[r], NULL);
  tpf_cuda_threads_destroy(group);
  if (rc != TPF_OK) return rc;
  /* Every failing rank's reason on stderr: the first rank's is often a consequence. */
  int first = -1;
  for (int r = 0; r < P; r++) {
    if (jobs[r].rc == TPF_OK) continue;
    fprintf(stderr, "conformance[cuda] P=%d rank %d: %s: %s\n", P, r, tpf_status_name(jobs[r].rc),
            jobs[r].detail);
    if (first < 0) first = r;
  }
  if (first >= 0) return tpf_set_error(jobs[first].rc, "rank %d: %s", first, jobs[first].detail);
  return TPF_OK;
}

static void *cuda_mem_alloc(tpf_conf_env *env, int rank, size_t bytes) {
  cuda_env_state *st = env->ctx;
  void *p = NULL;
  cudaSetDevice(st->device);
  if (cudaMallocAsync(&p, bytes == 0 ? 1 : bytes, st->streams[rank]) != cudaSuccess) return NULL;
  if (cudaStreamSynchronize(st->streams[rank]) != cudaSuccess) return NULL;
  return p;
}

static void cuda_mem_free(tpf_conf_env *env, int rank, void *p) {
  cuda_env_state *st = env->ctx;
  if (p == NULL) return;
  cudaSetDevice(st->device);
  cudaFreeAsync(p, st->streams[rank]);
}

static tpf_status cuda_copy(tpf_conf_env *env, int rank, void *dst, const void *src, size_t bytes,
                            const char *what) {
  cuda_env_state *st = env->ctx;
  cudaSetDevice(st->device);
  cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, st->streams[rank]);
  if (e == cudaSuccess) e = cudaStreamSynchronize(st->streams[rank]);
  return e == cudaSuccess ? TPF_OK : cuda_fail(e, what);
}

static tpf_status cuda_upload(tpf_conf_env *env, int rank, void *dst, const void *src,
                              size_t bytes) {
  return cuda_copy(env, rank, dst, src, bytes, "upload");
}

static tpf_status cuda_download(tpf_conf_env *env, int rank, void *dst, const void *src,
                                size_t bytes) {
  return cuda_copy(env, rank, dst, src, bytes, "download");
}

static void *cuda_stream(tpf_conf_env *env, int rank) {
  cuda_env_state *st = env->ctx;
  return st->streams[rank];
}

static tpf_status cuda_sync(tpf_conf_env *env, int rank, tpf_backend *be) {
  cuda_env_state *st = env->ctx;
  /* The backend's sync waits for the stream and reports a deferred device-side failure. */
  return be->ops->sync(be, st->streams[rank]);
}

tpf_status tpf_cuda_conf_env_init(tpf_conf_env *env) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count < 1)
    return tpf_set_error(TPF_EUNSUPPORTED, "no GPU (%s)",
                         e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
  /* TPF_CUDA_TEST_DEVICE: decimal digits only, below the device count (no atoi: "-1", "1x" or
   * 2^32 must not become some other device). */
  const char *dev = getenv("TPF_CUDA_TEST_DEVICE");
  int device = 0;
  if (dev != NULL && *dev != '\0') {
    unsigned long long v = 0;
    bool ok = true;
    for (const char *p = dev; ok && *p; p++) {
      ok = *p >= '0' && *p <= '9' && v < (unsigned long long)count;
      v = v * 10 + (unsigned long long)(*p - '0');
    }
    if (!ok || v >= (unsigned long long)count)
      return tpf_set_error(TPF_EINVAL,
                           "TPF_CUDA_TEST_DEVICE='%s' is not a device index in [0, %d] (%d GPUs "
                           "present)",
                           dev, count - 1, count);
    device = (int)v;
  }
  cuda_env_state *st = calloc(1, sizeof *st);
  if (st == NULL) return tpf_set_error(TPF_ENOMEM, "cannot allocate the CUDA environment");
  st->device = device;
  st->touched = true;
  cudaSetDevice(device);
  keep_pool_memory(device);
  *env = (tpf_conf_env){
      .name = "cuda",
      .max_ranks = 8,
      .run = cuda_run,
      .mem_alloc = cuda_mem_alloc,
      .mem_free = cuda_mem_free,
      .upload = cuda_upload,
      .download = cuda_download,
      .stream = cuda_stream,
      .sync = cuda_sync,
      .ctx = st,
  };
  return TPF_OK;
}

void tpf_cuda_conf_env_free(tpf_conf_env *env) {
  cuda_env_state *st = env->ctx;
  if (st == NULL) return;
  if (st->touched) {
    cudaSetDevice(st->device);
    for (int r = 0; r < TPF_MAX_RANKS; r++)
      if (st->streams[r] != NULL) {
        cudaStreamSynchronize(st->streams[r]);
        cudaStreamDestroy(st->streams[r]);
      }
  }
  free(st);
  env->ctx = NULL;
}

tpf_status tpf_cuda_conf_env_init_lazy(tpf_conf_env *env) {
  cuda_env_state *st = calloc(1, sizeof *st);
  if (st == NULL) return tpf_set_error(TPF_ENOMEM, "cannot allocate the CUDA environment");
  *env = (tpf_conf_env){
      .name = "cuda",
      .max_ranks = 8,
      .run = NULL,
      .mem_alloc = cuda_mem_alloc,
      .mem_free = cuda_mem_free,
      .upload = cuda_upload,
      .download = cuda_download,
      .stream = cuda_stream,
      .sync = cuda_sync,
      .ctx = st,
  };
  return TPF_OK;
}

tpf_status tpf_cuda_conf_env_enter_rank(tpf_conf_env *env, int rank, int device) {
  cuda_env_state *st = env->ctx;
  if (st == NULL || rank < 0 || rank >= TPF_MAX_RANKS || device < 0)
    return tpf_set_error(TPF_EINVAL, "cuda env: rank %d, device %d", rank, device);
  st->device = device;
  st->touched = true;
  cudaError_t e = cudaSetDevice(device);
  if (e != cudaSuccess) return cuda_fail(e, "cudaSetDevice");
  keep_pool_memory(device);
  if (st->streams[rank] == NULL) {
    e = cudaStreamCreateWithFlags(&st->streams[rank], cudaStreamNonBlocking);
    if (e != cudaSuccess) return cuda_fail(e, "cudaStreamCreateWithFlags");
  }
  return TPF_OK;
}

void tpf_cuda_conf_env_leave_rank(tpf_conf_env *env, int rank) {
  cuda_env_state *st = env->ctx;
  if (st == NULL || rank < 0 || rank >= TPF_MAX_RANKS || st->streams[rank] == NULL) return;
  cudaSetDevice(st->device);
  cudaStreamSynchronize(st->streams[rank]);
  cudaStreamDestroy(st->streams[rank]);
  st->streams[rank] = NULL;
}
