/* Bootstrap helpers of the CUDA backend (docs/SPEC.md §6, where a backend comes from): ranks that
 * are threads of one process, and ranks that already share an NCCL communicator.
 *
 * Method (threads): one shared group object holds a generation barrier (mutex + condition
 * variable; waiting threads leave when the generation they entered with has passed, so the
 * barrier can be reused at once) and a host buffer for the allgather. An allgather is: every rank
 * writes its bytes into its slot, barrier, every rank copies all slots out, barrier (so the buffer
 * is free for the next call). Waits are bounded (TPF_CUDA_BOOT_TIMEOUT_MS, default 120 s) so a
 * rank that never arrives yields TPF_ETIMEOUT instead of a hang.
 *
 * Method (NCCL): allgather is ncclAllGather of a device staging buffer on a private stream,
 * followed by a wait for that stream; barrier is an ncclAllReduce of one int. The wait polls the
 * stream (cudaStreamQuery) and the communicator (ncclCommGetAsyncError), bounded by the same
 * TPF_CUDA_BOOT_TIMEOUT_MS: a rank that never joins yields TPF_ETIMEOUT with a message instead
 * of a hang. The collective then stays pending on the caller's NCCL communicator, which tpflex
 * does not own: the message tells the caller to ncclCommAbort it.
 *
 * The backend's allgather op (tpf_cuda__boot_allgather, the configuration exchange of
 * tpf_comm_create) runs over the same bootstrap, with the backend's timeout instead of the
 * bootstrap's when the bootstrap is one of these two. A caller's own bootstrap has no way to be
 * told a bound (tpf_bootstrap.allgather takes none): its allgather waits as long as it waits.
 */
#define _POSIX_C_SOURCE 200809L
#include "cuda_error.h"
#include "cuda_internal.h"
#include "cuda_param.h"

#include "tpflex/tpflex_backend_support.h"

#include <errno.h>
#include <nccl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- threads ---- */

typedef struct {
  tpf_cuda_threads *group;
  int rank;
} tpf_cuda_thread_rank;

struct tpf_cuda_threads {
  int tp_size;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int arrived;
  uint64_t generation;
  unsigned char *buf; /* tp_size * buf_bytes_per_rank */
  size_t buf_bytes_per_rank;
  uint64_t timeout_ms;
  tpf_cuda_thread_rank ranks[TPF_MAX_RANKS];
};

tpf_status tpf_cuda_threads_create(int tp_size, tpf_cuda_threads **out) {
  TPF_RETURN_IF(out == NULL, TPF_EINVAL, "tpf_cuda_threads_create: out is NULL");
  TPF_RETURN_IF(tp_size < 1 || tp_size > TPF_MAX_RANKS, TPF_EINVAL, "tp_size %d outside 1..%d",
                tp_size, TPF_MAX_RANKS);
  tpf_cuda_threads *g = tpf_calloc(1, sizeof(*g));
  TPF_RETURN_IF(g == NULL, TPF_ENOMEM, "cannot allocate the threads bootstrap");
  g->tp_size = tp_size;
  int e = pthread_mutex_init(&g->mu, NULL);
  if (e != 0) {
    tpf_free(g);
    return tpf_set_error(TPF_EBACKEND, "pthread_mutex_init failed: %s", strerror(e));
  }
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  e = pthread_cond_init(&g->cv, &ca);
  pthread_condattr_destroy(&ca);
  if (e != 0) {
    pthread_mutex_destroy(&g->mu);
    tpf_free(g);
    return tpf_set_error(TPF_EBACKEND, "pthread_cond_init failed: %s", strerror(e));
  }
  g->timeout_ms = tpf_cuda__param_u64(TPF_CUDA_PARAM_BOOT_TIMEOUT_MS); /* >= 1 */
  for (int r = 0; r < tp_size; r++) {
    g->ranks[r].group = g;
    g->ranks[r].rank = r;
  }
  *out = g;
  return TPF_OK;
}

tpf_status tpf_cuda_threads_destroy(tpf_cuda_threads *g) {
  TPF_RETURN_IF(g == NULL, TPF_EINVAL, "tpf_cuda_threads_destroy: group is NULL");
  pthread_cond_destroy(&g->cv);
  pthread_mutex_destroy(&g->mu);
  tpf_free(g->buf);
  tpf_free(g);
  return TPF_OK;
}

/* Called with g->mu held; waits at most timeout_ms. */
static tpf_status tpf_cuda__threads_barrier_locked(tpf_cuda_threads *g, int rank,
                                                   uint64_t timeout_ms) {
  const uint64_t gen = g->generation;
  if (++g->arrived == g->tp_size) {
    g->arrived = 0;
    g->generation++;
    pthread_cond_broadcast(&g->cv);
    return TPF_OK;
  }
  struct timespec dl;
  clock_gettime(CLOCK_MONOTONIC, &dl);
  dl.tv_sec += (time_t)(timeout_ms / 1000u);
  dl.tv_nsec += (long)(timeout_ms % 1000u) * 1000000L;
  if (dl.tv_nsec >= 1000000000L) {
    dl.tv_sec++;
    dl.tv_nsec -= 1000000000L;
  }
  while (g->generation == gen) {
    int e = pthread_cond_timedwait(&g->cv, &g->mu, &dl);
    if (e == ETIMEDOUT && g->generation == gen) {
      g->arrived--;
      return tpf_set_error(TPF_ETIMEOUT,
                           "threads bootstrap: rank %d waited %llu ms for the other ranks "
                           "(%d of %d arrived)",
                           rank, (unsigned long long)timeout_ms, g->arrived + 1, g->tp_size);
    }
  }
  return TPF_OK;
}

static tpf_status tpf_cuda__threads_barrier(void *ctx) {
  tpf_cuda_thread_rank *tr = ctx;
  tpf_cuda_threads *g = tr->group;
  pthread_mutex_lock(&g->mu);
  tpf_status rc = tpf_cuda__threads_barrier_locked(g, tr->rank, g->timeout_ms);
  pthread_mutex_unlock(&g->mu);
  return rc;
}

static tpf_status tpf_cuda__threads_allgather_within(void *ctx, const void *send, void *recv,
                                                     size_t bytes, uint64_t timeout_ms) {
  tpf_cuda_thread_rank *tr = ctx;
  tpf_cuda_threads *g = tr->group;
  tpf_status rc = TPF_OK;
  pthread_mutex_lock(&g->mu);
  /* Nobody reads the buffer between the second barrier of the previous call and the first of
   * this one, so whoever comes first may resize it. */
  if (g->buf_bytes_per_rank < bytes) {
    unsigned char *nb = tpf_realloc(g->buf, bytes * (size_t)g->tp_size);
    if (nb == NULL) {
      pthread_mutex_unlock(&g->mu);
      return tpf_set_error(TPF_ENOMEM, "threads bootstrap: cannot grow the allgather buffer");
    }
    /* Slots already written by earlier arrivals move with the stride change. */
    for (int r = g->tp_size - 1; r >= 0; r--)
      memmove(nb + (size_t)r * bytes, nb + (size_t)r * g->buf_bytes_per_rank,
              g->buf_bytes_per_rank);
    g->buf = nb;
    g->buf_bytes_per_rank = bytes;
  }
  memcpy(g->buf + (size_t)tr->rank * g->buf_bytes_per_rank, send, bytes);
  rc = tpf_cuda__threads_barrier_locked(g, tr->rank, timeout_ms);
  if (rc == TPF_OK) {
    for (int r = 0; r < g->tp_size; r++)
      memcpy((unsigned char *)recv + (size_t)r * bytes, g->buf + (size_t)r * g->buf_bytes_per_rank,
             bytes);
    rc = tpf_cuda__threads_barrier_locked(g, tr->rank, timeout_ms);
  }
  pthread_mutex_unlock(&g->mu);
  return rc;
}

static tpf_status tpf_cuda__threads_allgather(void *ctx, const void *send, void *recv,
                                              size_t bytes) {
  tpf_cuda_thread_rank *tr = ctx;
  return tpf_cuda__threads_allgather_within(ctx, send, recv, bytes, tr->group->timeout_ms);
}

tpf_status tpf_cuda_threads_bootstrap(tpf_cuda_threads *g, int rank, int device,
                                      tpf_bootstrap *out) {
  TPF_RETURN_IF(g == NULL || out == NULL, TPF_EINVAL, "tpf_cuda_threads_bootstrap: NULL argument");
  TPF_RETURN_IF(rank < 0 || rank >= g->tp_size, TPF_EINVAL, "rank %d outside 0..%d", rank,
                g->tp_size - 1);
  TPF_RETURN_IF(device < 0, TPF_EINVAL, "device %d is negative", device);
  memset(out, 0, sizeof(*out));
  out->tp_size = g->tp_size;
  out->rank = rank;
  out->device = device;
  out->allgather = tpf_cuda__threads_allgather;
  out->barrier = tpf_cuda__threads_barrier;
  out->ctx = &g->ranks[rank];
  return TPF_OK;
}

/* ---- NCCL ---- */

typedef struct {
  ncclComm_t comm;
  int device;
  cudaStream_t stream;
  void *dbuf; /* staging: nranks * dbuf_per_rank bytes */
  size_t dbuf_per_rank;
  int nranks;
  uint64_t timeout_ms; /* bound on every bootstrap collective */
} tpf_cuda_nccl_ctx;

static uint64_t tpf_cuda__boot_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* Waits for the bootstrap stream, at most timeout_ms, watching the communicator's errors. */
static tpf_status tpf_cuda__nccl_wait(tpf_cuda_nccl_ctx *c, const char *what, uint64_t timeout_ms) {
  const uint64_t start = tpf_cuda__boot_now_ms();
  for (;;) {
    cudaError_t e = cudaStreamQuery(c->stream);
    if (e == cudaSuccess) return TPF_OK;
    if (e != cudaErrorNotReady) return tpf_cuda__err(e, "cudaStreamQuery(bootstrap)");
    ncclResult_t ar = ncclSuccess;
    TPF_NCCL_TRY(ncclCommGetAsyncError(c->comm, &ar), "ncclCommGetAsyncError");
    if (ar != ncclSuccess && ar != ncclInProgress) return tpf_cuda__nccl_err(ar, what);
    if (tpf_cuda__boot_now_ms() - start > timeout_ms)
      return tpf_set_error(TPF_ETIMEOUT,
                           "NCCL bootstrap %s: not complete after %llu ms (a rank of the %d never "
                           "joined?); the collective is still pending on the caller's NCCL "
                           "communicator: ncclCommAbort it (TPF_CUDA_BOOT_TIMEOUT_MS sets the "
                           "bound)",
                           what, (unsigned long long)timeout_ms, c->nranks);
    struct timespec d = {0, 1000000L};
    nanosleep(&d, NULL);
  }
}

static tpf_status tpf_cuda__nccl_allgather_within(void *ctx, const void *send, void *recv,
                                                  size_t bytes, uint64_t timeout_ms) {
  tpf_cuda_nccl_ctx *c = ctx;
  TPF_CUDA_TRY(cudaSetDevice(c->device), "cudaSetDevice");
  if (c->dbuf_per_rank < bytes) {
    if (c->dbuf != NULL) cudaFree(c->dbuf);
    c->dbuf = NULL;
    c->dbuf_per_rank = 0;
    TPF_CUDA_TRY(cudaMalloc(&c->dbuf, bytes * (size_t)c->nranks), "cudaMalloc(bootstrap staging)");
    c->dbuf_per_rank = bytes;
  }
  int me = 0;
  TPF_NCCL_TRY(ncclCommUserRank(c->comm, &me), "ncclCommUserRank");
  unsigned char *slot = (unsigned char *)c->dbuf + (size_t)me * bytes;
  TPF_CUDA_TRY(cudaMemcpyAsync(slot, send, bytes, cudaMemcpyHostToDevice, c->stream),
               "cudaMemcpyAsync(bootstrap)");
  TPF_NCCL_TRY(ncclAllGather(slot, c->dbuf, bytes, ncclUint8, c->comm, c->stream), "ncclAllGather");
  TPF_CUDA_TRY(
      cudaMemcpyAsync(recv, c->dbuf, bytes * (size_t)c->nranks, cudaMemcpyDeviceToHost, c->stream),
      "cudaMemcpyAsync(bootstrap)");
  return tpf_cuda__nccl_wait(c, "allgather", timeout_ms);
}

static tpf_status tpf_cuda__nccl_allgather(void *ctx, const void *send, void *recv, size_t bytes) {
  tpf_cuda_nccl_ctx *c = ctx;
  return tpf_cuda__nccl_allgather_within(ctx, send, recv, bytes, c->timeout_ms);
}

static tpf_status tpf_cuda__nccl_barrier(void *ctx) {
  tpf_cuda_nccl_ctx *c = ctx;
  TPF_CUDA_TRY(cudaSetDevice(c->device), "cudaSetDevice");
  if (c->dbuf_per_rank < sizeof(int)) {
    /* Reuse the allgather path's staging; an int per rank is enough. */
    int dummy = 0;
    int *all = tpf_calloc((size_t)c->nranks, sizeof(int));
    if (all == NULL) return tpf_set_error(TPF_ENOMEM, "NCCL bootstrap barrier: out of memory");
    tpf_status rc = tpf_cuda__nccl_allgather(ctx, &dummy, all, sizeof(int));
    tpf_free(all);
    return rc;
  }
  TPF_NCCL_TRY(ncclAllReduce(c->dbuf, c->dbuf, 1, ncclInt32, ncclSum, c->comm, c->stream),
               "ncclAllReduce");
  return tpf_cuda__nccl_wait(c, "barrier", c->timeout_ms);
}

tpf_status tpf_cuda_nccl_bootstrap(void *nccl_comm, int device, tpf_bootstrap *out) {
  TPF_RETURN_IF(nccl_comm == NULL || out == NULL, TPF_EINVAL,
                "tpf_cuda_nccl_bootstrap: NULL argument");
  ncclComm_t comm = (ncclComm_t)nccl_comm;
  int n = 0, me = 0;
  TPF_NCCL_TRY(ncclCommCount(comm, &n), "ncclCommCount");
  TPF_NCCL_TRY(ncclCommUserRank(comm, &me), "ncclCommUserRank");
  TPF_RETURN_IF(n < 1 || n > TPF_MAX_RANKS, TPF_EINVAL, "NCCL communicator has %d ranks (1..%d)", n,
                TPF_MAX_RANKS);
  tpf_cuda_nccl_ctx *c = tpf_calloc(1, sizeof(*c));
  TPF_RETURN_IF(c == NULL, TPF_ENOMEM, "cannot allocate the NCCL bootstrap");
  c->comm = comm;
  c->device = device;
  c->nranks = n;
  tpf_cuda__param_load(me);
  c->timeout_ms = tpf_cuda__param_u64(TPF_CUDA_PARAM_BOOT_TIMEOUT_MS); /* >= 1 */
  cudaError_t e = cudaSetDevice(device);
  if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
  if (e != cudaSuccess) {
    tpf_free(c);
    return tpf_cuda__err(e, "cudaStreamCreateWithFlags(bootstrap)");
  }
  memset(out, 0, sizeof(*out));
  out->tp_size = n;
  out->rank = me;
  out->device = device;
  out->allgather = tpf_cuda__nccl_allgather;
  out->barrier = tpf_cuda__nccl_barrier;
  out->ctx = c;
  return TPF_OK;
}

void tpf_cuda_nccl_bootstrap_free(tpf_bootstrap *b) {
  if (b == NULL || b->ctx == NULL) return;
  tpf_cuda_nccl_ctx *c = b->ctx;
  cudaSetDevice(c->device);
  if (c->stream != NULL) cudaStreamSynchronize(c->stream);
  if (c->dbuf != NULL) cudaFree(c->dbuf);
  if (c->stream != NULL) cudaStreamDestroy(c->stream);
  tpf_free(c);
  b->ctx = NULL;
}

/* ---- the backend's allgather op ---- */

/* One allgather over boot, bounded by timeout_ms when the bootstrap is one of ours. */
static tpf_status tpf_cuda__boot_allgather_once(const tpf_bootstrap *boot, const void *send,
                                                void *recv, size_t bytes, uint64_t timeout_ms) {
  if (boot->allgather == tpf_cuda__threads_allgather)
    return tpf_cuda__threads_allgather_within(boot->ctx, send, recv, bytes, timeout_ms);
  if (boot->allgather == tpf_cuda__nccl_allgather)
    return tpf_cuda__nccl_allgather_within(boot->ctx, send, recv, bytes, timeout_ms);
  /* A caller's bootstrap: no bound can be passed through tpf_bootstrap (see the file comment). */
  return boot->allgather(boot->ctx, send, recv, bytes);
}

tpf_status tpf_cuda__boot_allgather(const tpf_bootstrap *boot, const void *send, void *recv,
                                    size_t bytes, uint64_t timeout_ms) {
  TPF_RETURN_IF(boot == NULL || boot->allgather == NULL || send == NULL || recv == NULL ||
                    bytes == 0,
                TPF_EINVAL, "cuda allgather: %s", bytes ? "NULL argument" : "zero bytes");
  const int P = boot->tp_size;
  TPF_RETURN_IF(P < 1 || P > TPF_MAX_RANKS, TPF_EINVAL, "cuda allgather: tp_size %d", P);
  if (timeout_ms == 0) timeout_ms = 1;
  /* Sizes first: ranks built from different tpflex versions may contribute different sizes, and
   * an allgather of unequal sizes is undefined for NCCL and the threads buffer alike. The size
   * words are equal-sized everywhere, so this exchange is always well-formed. */
  uint64_t mine = (uint64_t)bytes, sizes[TPF_MAX_RANKS];
  TPF_CHECK(tpf_cuda__boot_allgather_once(boot, &mine, sizes, sizeof mine, timeout_ms));
  for (int q = 0; q < P; q++)
    TPF_RETURN_IF(sizes[q] != mine, TPF_EMISMATCH,
                  "configuration exchange: rank %d contributes %llu bytes, rank %d %llu "
                  "(different tpflex versions?)",
                  boot->rank, (unsigned long long)mine, q, (unsigned long long)sizes[q]);
  return tpf_cuda__boot_allgather_once(boot, send, recv, bytes, timeout_ms);
}

/* ---- the outcome of a collective creation's step ---- */

typedef struct {
  int32_t status;
  char msg[196];
} tpf_cuda_outcome;

tpf_status tpf_cuda__boot_outcome(const tpf_bootstrap *boot, tpf_status mine, const char *what,
                                  uint64_t timeout_ms) {
  tpf_cuda_outcome me, all[TPF_MAX_RANKS];
  memset(&me, 0, sizeof me);
  me.status = (int32_t)mine;
  if (mine != TPF_OK) snprintf(me.msg, sizeof me.msg, "%s", tpf_last_error());
  const tpf_status ex =
      tpf_cuda__boot_allgather_once(boot, &me, all, sizeof me, timeout_ms ? timeout_ms : 1);
  if (mine != TPF_OK) return tpf_set_error(mine, "%s", me.msg); /* the exchange may have reset it */
  if (ex != TPF_OK) return ex;
  for (int q = 0; q < boot->tp_size; q++) {
    if (all[q].status == (int32_t)TPF_OK) continue;
    all[q].msg[sizeof all[q].msg - 1] = '\0';
    return tpf_set_error((tpf_status)all[q].status,
                         "rank %d could not %s (%s): %s; rank %d gives up too, nothing was kept", q,
                         what, tpf_status_name((tpf_status)all[q].status), all[q].msg, boot->rank);
  }
  return TPF_OK;
}
