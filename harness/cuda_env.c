/* The CUDA rank environment (cuda_env.h), shared by conformance_cuda, `tpflex demo --backend
 * cuda` and `tpflex bench --backend cuda`.
 *
 * Rank threads (tpf_cuda_ranks): persistent threads, one per local rank, each with a backend and a
 * stream; a run hands every thread the same function under a mutex and condition variable (a
 * generation count), and waits until all are done. Backends are made and destroyed on their own
 * rank's thread, as the CUDA backend's in-process bootstrap expects.
 *
 * The rank environment (tpf_conf_env): P ranks on one GPU (device 0, or TPF_CUDA_TEST_DEVICE),
 * a rank group per run; operands in device memory; one non-blocking stream per rank, kept across
 * runs. In process mode (conformance_cuda --procs) this process only holds the state and each
 * rank's process sets up its own device and stream (tpf_cuda_conf_env_enter_rank).
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

/* ---- rank threads ---------------------------------------------------------------------- */

typedef struct {
  tpf_cuda_ranks *g;
  int local;
} ranks_arg;

struct tpf_cuda_ranks {
  tpf_cuda_ranks_config cfg;
  tpf_cuda_threads *tg; /* the in-process bootstrap (NULL in process mode) */
  pthread_t th[TPF_MAX_RANKS];
  ranks_arg args[TPF_MAX_RANKS];
  tpf_backend *be[TPF_MAX_RANKS];
  cudaStream_t stream[TPF_MAX_RANKS];
  bool own_stream[TPF_MAX_RANKS];
  tpf_status rc[TPF_MAX_RANKS];  /* the last run's, or the setup's */
  tpf_status fin[TPF_MAX_RANKS]; /* the backend destroy's */
  char why[TPF_MAX_RANKS][512];
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int started, ready, done, gen;
  bool quit;
  tpf_cuda_rank_fn fn;
  void *arg;
};

/* On rank `local`'s thread: device, bootstrap, backend and stream. */
static tpf_status ranks_setup(tpf_cuda_ranks *g, int local) {
  const tpf_cuda_ranks_config *c = &g->cfg;
  tpf_bootstrap boot;
  cudaError_t e = cudaSetDevice(c->device);
  if (e != cudaSuccess) return cuda_fail(e, "cudaSetDevice");
  tpf_status st = TPF_OK;
  if (g->tg)
    st = tpf_cuda_threads_bootstrap(g->tg, local, c->device, &boot);
  else
    boot = *c->xboot; /* process mode: the processes' bootstrap, this process's rank */
  if (st == TPF_OK) st = tpf_cuda_backend_create(&boot, &g->be[local]);
  if (st != TPF_OK) return st;
  if (c->streams) {
    g->stream[local] = (cudaStream_t)c->streams[local];
    return TPF_OK;
  }
  e = cudaStreamCreateWithFlags(&g->stream[local], cudaStreamNonBlocking);
  if (e != cudaSuccess) return cuda_fail(e, "cudaStreamCreateWithFlags");
  g->own_stream[local] = true;
  return TPF_OK;
}

/* Records rank `local`'s status and error text (its thread's). */
static void ranks_note(tpf_cuda_ranks *g, int local, tpf_status rc) {
  g->rc[local] = rc;
  snprintf(g->why[local], sizeof g->why[local], "%s", rc == TPF_OK ? "" : tpf_last_error());
}

static void *ranks_thread(void *p) {
  ranks_arg *a = p;
  tpf_cuda_ranks *g = a->g;
  const int r = a->local;
  tpf_status st = ranks_setup(g, r);
  pthread_mutex_lock(&g->mu);
  ranks_note(g, r, st);
  g->ready++;
  pthread_cond_broadcast(&g->cv);
  int seen = 0;
  for (;;) {
    while (g->gen == seen && !g->quit)
      pthread_cond_wait(&g->cv, &g->mu);
    if (g->quit) break;
    seen = g->gen;
    pthread_mutex_unlock(&g->mu);
    tpf_status rc = g->be[r] ? g->fn(g->cfg.rank0 + r, g->be[r], g->stream[r], g->arg)
                             : tpf_set_error(TPF_EBACKEND, "no backend");
    pthread_mutex_lock(&g->mu);
    ranks_note(g, r, rc);
    g->done++;
    pthread_cond_broadcast(&g->cv);
  }
  pthread_mutex_unlock(&g->mu);
  if (g->stream[r]) cudaStreamSynchronize(g->stream[r]);
  if (g->be[r]) g->fin[r] = tpf_cuda_backend_destroy(g->be[r]);
  if (g->own_stream[r]) cudaStreamDestroy(g->stream[r]);
  return NULL;
}

tpf_status tpf_cuda_ranks_create(const tpf_cuda_ranks_config *cfg, tpf_cuda_ranks **out) {
  *out = NULL;
  if (cfg->nlocal < 1 || cfg->nlocal > TPF_MAX_RANKS || cfg->tp < cfg->nlocal ||
      (cfg->xboot == NULL && (cfg->nlocal != cfg->tp || cfg->rank0 != 0)))
    return tpf_set_error(TPF_EINVAL,
                         "CUDA rank group: %d rank threads from rank %d of P = %d (at most %d; "
                         "without a bootstrap between processes, all P from rank 0)",
                         cfg->nlocal, cfg->rank0, cfg->tp, TPF_MAX_RANKS);
  tpf_cuda_ranks *g = calloc(1, sizeof *g);
  if (g == NULL) return tpf_set_error(TPF_ENOMEM, "CUDA rank group: no memory");
  g->cfg = *cfg;
  pthread_mutex_init(&g->mu, NULL);
  pthread_cond_init(&g->cv, NULL);
  tpf_status st = cfg->xboot ? TPF_OK : tpf_cuda_threads_create(cfg->tp, &g->tg);
  for (int r = 0; st == TPF_OK && r < cfg->nlocal; r++) {
    g->args[r] = (ranks_arg){g, r};
    if (pthread_create(&g->th[r], NULL, ranks_thread, &g->args[r]) != 0)
      st = tpf_set_error(TPF_EBACKEND, "pthread_create failed for rank %d", cfg->rank0 + r);
    else
      g->started++;
  }
  pthread_mutex_lock(&g->mu);
  while (g->ready < g->started)
    pthread_cond_wait(&g->cv, &g->mu);
  pthread_mutex_unlock(&g->mu);
  for (int r = 0; st == TPF_OK && r < cfg->nlocal; r++)
    if (g->rc[r] != TPF_OK)
      st = tpf_set_error(g->rc[r], "CUDA rank group of %d%s: rank %d: %s", cfg->tp,
                         cfg->xboot ? " (processes)" : "", cfg->rank0 + r, g->why[r]);
  if (st != TPF_OK) {
    char saved[512];
    snprintf(saved, sizeof saved, "%s", tpf_last_error());
    tpf_cuda_ranks_destroy(g);
    return tpf_set_error(st, "%s", saved);
  }
  *out = g;
  return TPF_OK;
}

tpf_status tpf_cuda_ranks_run(tpf_cuda_ranks *g, tpf_cuda_rank_fn fn, void *arg) {
  pthread_mutex_lock(&g->mu);
  g->fn = fn;
  g->arg = arg;
  g->done = 0;
  g->gen++;
  pthread_cond_broadcast(&g->cv);
  while (g->done < g->cfg.nlocal)
    pthread_cond_wait(&g->cv, &g->mu);
  pthread_mutex_unlock(&g->mu);
  for (int r = 0; r < g->cfg.nlocal; r++)
    if (g->rc[r] != TPF_OK)
      return tpf_set_error(g->rc[r], "rank %d: %s", g->cfg.rank0 + r, g->why[r]);
  return TPF_OK;
}

tpf_status tpf_cuda_ranks_status(const tpf_cuda_ranks *g, int i, const char **why) {
  *why = g->why[i];
  return g->rc[i];
}

tpf_status tpf_cuda_ranks_destroy(tpf_cuda_ranks *g) {
  if (g == NULL) return TPF_OK;
  pthread_mutex_lock(&g->mu);
  g->quit = true;
  pthread_cond_broadcast(&g->cv);
  pthread_mutex_unlock(&g->mu);
  for (int r = 0; r < g->started; r++)
    pthread_join(g->th[r], NULL);
  if (g->tg) tpf_cuda_threads_destroy(g->tg);
  tpf_status st = TPF_OK;
  for (int r = 0; r < g->started && st == TPF_OK; r++)
    if (g->fin[r] != TPF_OK)
      st = tpf_set_error(g->fin[r], "rank %d: the backend's destroy failed", g->cfg.rank0 + r);
  pthread_mutex_destroy(&g->mu);
  pthread_cond_destroy(&g->cv);
  free(g);
  return st;
}

/* ---- the rank environment ----------------------------------------------------------------- */

typedef struct {
  tpf_conf_rank_fn fn;
  void *arg;
} conf_job;

static tpf_status conf_rank(int rank, tpf_backend *be, void *stream, void *arg) {
  (void)stream; /* the environment's: env->stream(env, rank) */
  const conf_job *j = arg;
  return j->fn(be, rank, j->arg);
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
  void *streams[TPF_MAX_RANKS];
  for (int r = 0; r < P; r++)
    streams[r] = st->streams[r];
  const tpf_cuda_ranks_config cfg = {st->device, P, P, 0, NULL, streams};
  tpf_cuda_ranks *g = NULL;
  tpf_status rc = tpf_cuda_ranks_create(&cfg, &g);
  if (rc != TPF_OK) return rc;
  conf_job job = {fn, arg};
  rc = tpf_cuda_ranks_run(g, conf_rank, &job);
  /* Every failing rank's reason on stderr: the first rank's is often a consequence. */
  for (int r = 0; rc != TPF_OK && r < P; r++) {
    const char *why = NULL;
    tpf_status rr = tpf_cuda_ranks_status(g, r, &why);
    if (rr != TPF_OK)
      fprintf(stderr, "conformance[cuda] P=%d rank %d: %s: %s\n", P, r, tpf_status_name(rr), why);
  }
  char saved[512];
  snprintf(saved, sizeof saved, "%s", tpf_last_error());
  tpf_status drc = tpf_cuda_ranks_destroy(g);
  if (rc != TPF_OK) return tpf_set_error(rc, "%s", saved);
  return drc;
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
      .fp8_tn_only = true, /* cuBLASLt's fp8 GEMM (tpf_cuda__gemm_fp8_prepare) */
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
      .fp8_tn_only = true, /* cuBLASLt's fp8 GEMM (tpf_cuda__gemm_fp8_prepare) */
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
