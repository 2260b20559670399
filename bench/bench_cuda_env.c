/* `tpflex bench`'s CUDA primitives: in-process CUDA rank groups (P threads on one device, each
 * with a tpflex CUDA backend and a stream), device memory, copies and event timing. Without the
 * CUDA backend, stubs that return TPF_EUNSUPPORTED. A leaf: it calls no other bench file (the
 * group's barrier is bench.h's inline bench_barrier).
 *
 * Timing method: before each timed repetition rank 0 enqueues a 1 GiB memset (it evicts the L2,
 * so no input is served from cache, and it keeps the GPU busy while the host enqueues the
 * repetition), then records the start event; the other ranks' streams wait for it; every rank
 * records its end event after its operation, and rank 0 waits for all of them before the stop
 * event. start -> stop is the repetition's time: earliest start to latest end on the device.
 * Host-wall timing (bench_group.c) uses bench_cuda_flush: the same memset, synchronised.
 *
 * Process mode (g->xboot set): this process holds one rank (one thread, global rank g->rank0)
 * whose backend is created over the processes' bootstrap; no events (interprocess events cannot
 * be timed) and the flush buffer only in global rank 0's process.
 */
#define _POSIX_C_SOURCE 200809L
#include "bench.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef TPF_HAVE_CUDA

#include "tpflex/tpflex_cuda.h"

#include <cuda_runtime.h>
#include <math.h>

static tpf_status cuda_err(cudaError_t e, const char *what) {
  return tpf_set_error(TPF_EBACKEND, "%s: %s (%s)", what, cudaGetErrorName(e),
                       cudaGetErrorString(e));
}
#define BENCH_CU(call, what)                                                                       \
  do {                                                                                             \
    cudaError_t e_ = (call);                                                                       \
    if (e_ != cudaSuccess) return cuda_err(e_, what);                                              \
  } while (0)

typedef struct {
  int tp, device;
  int nlocal, rank0; /* rank threads here, the global rank of the first */
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
} cuda_group;

typedef struct {
  cuda_group *cu;
  int rank; /* local index */
} rank_arg;
static rank_arg rank_args[64];

static void *rank_thread(void *p) {
  rank_arg *a = p;
  cuda_group *cu = a->cu;
  const int r = a->rank, grank = cu->rank0 + a->rank;
  tpf_status st = TPF_OK;
  tpf_bootstrap boot;
  if (cudaSetDevice(cu->device) != cudaSuccess)
    st = tpf_set_error(TPF_EBACKEND, "cudaSetDevice(%d) failed", cu->device);
  if (st == TPF_OK) {
    if (cu->tg)
      st = tpf_cuda_threads_bootstrap(cu->tg, r, cu->device, &boot);
    else
      boot = *cu->g->xboot; /* procs mode: the processes' bootstrap, this process's rank */
  }
  if (st == TPF_OK) st = tpf_cuda_backend_create(&boot, &cu->be[r]);
  if (st == TPF_OK &&
      cudaStreamCreateWithFlags(&cu->stream[r], cudaStreamNonBlocking) != cudaSuccess)
    st = tpf_set_error(TPF_EBACKEND, "cudaStreamCreate failed");
  pthread_mutex_lock(&cu->mu);
  cu->init_rc[r] = st;
  if (st != TPF_OK && !cu->init_err[0])
    snprintf(cu->init_err, sizeof(cu->init_err), "rank %d: %s", grank, tpf_last_error());
  cu->ready++;
  pthread_cond_broadcast(&cu->cv);
  int seen = 0;
  for (;;) {
    while (cu->gen == seen && !cu->quit)
      pthread_cond_wait(&cu->cv, &cu->mu);
    if (cu->quit) break;
    seen = cu->gen;
    pthread_mutex_unlock(&cu->mu);
    bench_rank rk = {
        .rank = grank, .tp = cu->tp, .stream = cu->stream[r], .g = cu->g, .be = cu->be[r]};
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
  cuda_group *cu = calloc(1, sizeof(*cu));
  if (!cu) return tpf_set_error(TPF_ENOMEM, "bench: no memory");
  g->cu = cu;
  cu->g = g;
  cu->tp = g->tp;
  cu->nlocal = g->nlocal;
  cu->rank0 = g->rank0;
  cu->device = g->o->device;
  BENCH_CU(cudaSetDevice(cu->device), "cudaSetDevice");
  if (g->tp == 0) return TPF_OK;
  if (g->nlocal > 64) return tpf_set_error(TPF_EINVAL, "bench: at most 64 rank threads");
  cu->nev = g->xboot ? 0 : g->o->iters; /* no interprocess event timing */
  cu->ev_start = calloc((size_t)cu->nev + 1, sizeof(cudaEvent_t));
  cu->ev_stop = calloc((size_t)cu->nev + 1, sizeof(cudaEvent_t));
  cu->ev_end = calloc((size_t)cu->nev * (size_t)g->tp + 1, sizeof(cudaEvent_t));
  if (!cu->ev_start || !cu->ev_stop || !cu->ev_end)
    return tpf_set_error(TPF_ENOMEM, "bench: no memory");
  for (int i = 0; i < cu->nev; i++) {
    BENCH_CU(cudaEventCreate(&cu->ev_start[i]), "cudaEventCreate");
    BENCH_CU(cudaEventCreate(&cu->ev_stop[i]), "cudaEventCreate");
  }
  for (int i = 0; i < cu->nev * g->tp; i++)
    BENCH_CU(cudaEventCreate(&cu->ev_end[i]), "cudaEventCreate");
  if (cu->rank0 == 0) /* only global rank 0 flushes */
    BENCH_CU(cudaMalloc(&cu->flush, BENCH_FLUSH_BYTES), "cudaMalloc(flush)");
  pthread_mutex_init(&cu->mu, NULL);
  pthread_cond_init(&cu->cv, NULL);
  if (!g->xboot) {
    tpf_status st = tpf_cuda_threads_create(g->tp, &cu->tg);
    if (st != TPF_OK) return st;
  }
  for (int r = 0; r < cu->nlocal; r++) {
    rank_args[r] = (rank_arg){cu, r};
    pthread_create(&cu->th[r], NULL, rank_thread, &rank_args[r]);
  }
  pthread_mutex_lock(&cu->mu);
  while (cu->ready < cu->nlocal)
    pthread_cond_wait(&cu->cv, &cu->mu);
  pthread_mutex_unlock(&cu->mu);
  for (int r = 0; r < cu->nlocal; r++)
    if (cu->init_rc[r] != TPF_OK)
      return tpf_set_error(cu->init_rc[r], "CUDA rank group of %d%s: %s", g->tp,
                           g->xboot ? " (processes)" : "", cu->init_err);
  return TPF_OK;
}

tpf_status bench_cuda_group_run(bench_group *g, bench_rank_fn fn, void *arg) {
  cuda_group *cu = g->cu;
  if (!cu || cu->tp == 0) return tpf_set_error(TPF_EINVAL, "bench: group has no ranks");
  pthread_mutex_lock(&cu->mu);
  cu->fn = fn;
  cu->arg = arg;
  cu->done = 0;
  cu->gen++;
  pthread_cond_broadcast(&cu->cv);
  while (cu->done < cu->nlocal)
    pthread_cond_wait(&cu->cv, &cu->mu);
  pthread_mutex_unlock(&cu->mu);
  for (int r = 0; r < cu->nlocal; r++)
    if (cu->rc[r] != TPF_OK) return cu->rc[r];
  return TPF_OK;
}

void bench_cuda_group_fini(bench_group *g) {
  cuda_group *cu = g->cu;
  if (!cu) return;
  if (cu->tp > 0 && cu->ready > 0) {
    pthread_mutex_lock(&cu->mu);
    cu->quit = true;
    pthread_cond_broadcast(&cu->cv);
    pthread_mutex_unlock(&cu->mu);
    for (int r = 0; r < cu->nlocal; r++)
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
  cuda_group *cu = rk->g->cu;
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
  cuda_group *cu = rk->g->cu;
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
  cuda_group *cu = rk->g->cu;
  bench_barrier(rk);
  tpf_status st = TPF_OK;
  if (rk->rank == 0) {
    cudaError_t e = cudaEventSynchronize(cu->ev_stop[n - 1]);
    for (int it = 0; it < n; it++) {
      float ms = NAN;
      if (e == cudaSuccess) e = cudaEventElapsedTime(&ms, cu->ev_start[it], cu->ev_stop[it]);
      us[it] = e == cudaSuccess ? (double)ms * 1e3 : NAN;
    }
    if (e != cudaSuccess) st = cuda_err(e, "event timing");
  }
  bench_barrier(rk);
  return st;
}

long long bench_cuda_dev_used(void) {
  size_t fr = 0, tot = 0;
  if (cudaMemGetInfo(&fr, &tot) != cudaSuccess) return -1;
  return (long long)(tot - fr);
}

tpf_status bench_cuda_flush(bench_rank *rk, int it) {
  cuda_group *cu = rk->g->cu;
  if (!cu || !cu->flush) return tpf_set_error(TPF_EINVAL, "bench: this rank has no flush buffer");
  cudaStream_t s = (cudaStream_t)rk->stream;
  BENCH_CU(cudaMemsetAsync(cu->flush, it & 0xFF, BENCH_FLUSH_BYTES, s), "cudaMemsetAsync(flush)");
  BENCH_CU(cudaStreamSynchronize(s), "cudaStreamSynchronize(flush)");
  return TPF_OK;
}

tpf_status bench_cuda_enq_stats(bench_rank *rk, tpf_cuda_enqueue_stats *out) {
  memset(out, 0, sizeof *out);
  out->size = sizeof *out;
  return tpf_cuda_backend_enqueue_stats(rk->be, out);
}

int bench_cuda_device_count(char *why, size_t len) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    snprintf(why, len, "cudaGetDeviceCount: %s (%s)", cudaGetErrorName(e), cudaGetErrorString(e));
    return 0;
  }
  if (n == 0) snprintf(why, len, "cudaGetDeviceCount: no device");
  return n;
}

#else /* !TPF_HAVE_CUDA: stubs, so the simulator-only CLI links */

static tpf_status no_cuda(void) {
  return tpf_set_error(TPF_EUNSUPPORTED, "this build has no CUDA backend");
}
tpf_status bench_cuda_group_init(bench_group *g) {
  (void)g;
  return no_cuda();
}
tpf_status bench_cuda_group_run(bench_group *g, bench_rank_fn fn, void *arg) {
  (void)g;
  (void)fn;
  (void)arg;
  return no_cuda();
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
  return no_cuda();
}
tpf_status bench_cuda_tile(void *dst, const void *host, uint64_t unit, uint64_t total) {
  (void)dst;
  (void)host;
  (void)unit;
  (void)total;
  return no_cuda();
}
tpf_status bench_cuda_download(bench_rank *rk, void *host, const void *dev, uint64_t bytes) {
  (void)rk;
  (void)host;
  (void)dev;
  (void)bytes;
  return no_cuda();
}
tpf_status bench_cuda_poison(bench_rank *rk, void *dev, uint64_t bytes) {
  (void)rk;
  (void)dev;
  (void)bytes;
  return no_cuda();
}
tpf_status bench_cuda_time_begin(bench_rank *rk, int it) {
  (void)rk;
  (void)it;
  return no_cuda();
}
tpf_status bench_cuda_time_end(bench_rank *rk, int it) {
  (void)rk;
  (void)it;
  return no_cuda();
}
tpf_status bench_cuda_time_collect(bench_rank *rk, int n, double *us) {
  (void)rk;
  (void)n;
  (void)us;
  return no_cuda();
}
tpf_status bench_cuda_sync(bench_rank *rk) {
  (void)rk;
  return no_cuda();
}
long long bench_cuda_dev_used(void) {
  return -1;
}
tpf_status bench_cuda_flush(bench_rank *rk, int it) {
  (void)rk;
  (void)it;
  return no_cuda();
}
tpf_status bench_cuda_enq_stats(bench_rank *rk, tpf_cuda_enqueue_stats *out) {
  (void)rk;
  (void)out;
  return no_cuda();
}
int bench_cuda_device_count(char *why, size_t len) {
  snprintf(why, len, "this build has no CUDA backend");
  return 0;
}

#endif /* TPF_HAVE_CUDA */
