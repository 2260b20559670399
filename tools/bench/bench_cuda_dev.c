/* `tpflex bench`'s CUDA primitives: its rank groups on the harness's CUDA rank threads
 * (harness/cuda_env.h, tpf_cuda_ranks: P threads on one device, each with a tpflex CUDA backend
 * and a stream; in process mode one rank here over the processes' bootstrap), device memory,
 * copies and event timing. Without the CUDA backend, stubs that return TPF_EUNSUPPORTED. A leaf:
 * it calls no other bench file (the group's barrier is bench.h's inline bench_barrier).
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

#include "cuda_env.h" /* the harness's CUDA rank threads */

#include <cuda_runtime.h>
#include <math.h>

tpf_status bench_cuda_err(cudaError_t e, const char *what) {
  return tpf_set_error(TPF_EBACKEND, "%s: %s (%s)", what, cudaGetErrorName(e),
                       cudaGetErrorString(e));
}

typedef struct {
  int tp, device;
  tpf_cuda_ranks *ranks; /* NULL for a group without ranks (tp 0) */
  int nev;
  cudaEvent_t *ev_start, *ev_stop, *ev_end; /* [nev], [nev], [tp * nev] */
  void *flush;
} cuda_group;

/* A bench rank function on the harness's rank threads. */
typedef struct {
  bench_group *g;
  bench_rank_fn fn;
  void *arg;
} bench_call;

static tpf_status bench_rank_call(int rank, tpf_backend *be, void *stream, void *arg) {
  const bench_call *c = arg;
  bench_rank rk = {.rank = rank, .tp = c->g->tp, .stream = stream, .g = c->g, .be = be};
  return c->fn(&rk, c->arg);
}

/* The timing events (threads mode only: interprocess events cannot be timed) and, in global rank
 * 0's process, the flush buffer. */
static tpf_status cuda_group_events(cuda_group *cu, const bench_group *g) {
  cu->nev = g->xboot ? 0 : g->o->iters;
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
  if (g->rank0 == 0) /* only global rank 0 flushes */
    BENCH_CU(cudaMalloc(&cu->flush, BENCH_FLUSH_BYTES), "cudaMalloc(flush)");
  return TPF_OK;
}

tpf_status bench_cuda_group_init(bench_group *g) {
  cuda_group *cu = calloc(1, sizeof(*cu));
  if (!cu) return tpf_set_error(TPF_ENOMEM, "bench: no memory");
  g->cu = cu;
  cu->tp = g->tp;
  cu->device = g->o->device;
  BENCH_CU(cudaSetDevice(cu->device), "cudaSetDevice");
  if (g->tp == 0) return TPF_OK;
  tpf_status st = cuda_group_events(cu, g);
  if (st != TPF_OK) return st;
  const tpf_cuda_ranks_config cfg = {cu->device, g->tp, g->nlocal, g->rank0, g->xboot, NULL};
  return tpf_cuda_ranks_create(&cfg, &cu->ranks);
}

tpf_status bench_cuda_group_run(bench_group *g, bench_rank_fn fn, void *arg) {
  cuda_group *cu = g->cu;
  if (!cu || !cu->ranks) return tpf_set_error(TPF_EINVAL, "bench: group has no ranks");
  bench_call c = {g, fn, arg};
  return tpf_cuda_ranks_run(cu->ranks, bench_rank_call, &c);
}

void bench_cuda_group_fini(bench_group *g) {
  cuda_group *cu = g->cu;
  if (!cu) return;
  tpf_cuda_ranks_destroy(cu->ranks);
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
    if (e != cudaSuccess) st = bench_cuda_err(e, "event timing");
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
