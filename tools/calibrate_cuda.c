/* tpflex calibrate on CUDA: the cost table of one device (calibrate.h).
 *
 * Method (every figure every figure a median of --iters repetitions timed with CUDA events):
 *   gemm     the CUDA backend's own GEMM through the public API: a P = 1 BULK communicator's
 *            tpf_bulk_overlap, which at P = 1 is exactly one GEMM step on the caller's stream
 *            (core/schedule.c; the backend's execute_p1: cuBLASLt with its mapping, plan cache
 *            and workspace, every SM; plus one event record), row-major [m, k] x [n, k]^T in
 *            --dtype, for m = 64 .. 32768 and the shapes the bench runs: AG [m, N, H] and RS
 *            [m, H, N] for N in {3584, 1024} (or --n), H = --hidden. A repetition is B = min(4,
 *            32768 / m) GEMMs back to back on different row blocks of A (as a split operation's
 *            chunks run), after a 256 MiB memset that evicts the L2; its time / B is one sample.
 *   gemm fp8 (--fp8 on, the default) the same grid again as E4M3 x E4M3 -> bf16 GEMMs, the
 *            backend's fp8 GEMM through the same communicator: tpf_bulk_overlap_ex with fp8 a and
 *            b (operands of their own, filled with valid E4M3 values in [-1, 1)), a bf16 d and
 *            tpf_op_options.a_scale_inv / w_scale_inv (device floats, 1), as TE's Float8Tensor
 *            passes them; written as `gemm fp8_e4m3` lines. No fp8_e5m2 points: cuBLASLt on
 *            Hopper runs E4M3 x E5M2 at the E4M3 x E4M3 rate, and the cost model prices fp8_e5m2
 *            GEMMs on the fp8_e4m3 points (tpf_cost_gemm_dtype). --fp8 off: no fp8 points, so
 *            fp8 GEMMs are priced on the --dtype points (an upper bound).
 *   copy     local: cudaMemcpyAsync device to device; peer: cudaMemcpyPeerAsync from --device to
 *            --peer-device (by default the same device: the ranks of `tpflex bench` share one
 *            GPU, so their "peer" copies are device-local). Sizes 64 KiB .. 256 MiB, then
 *            latency + bytes / bandwidth fitted by least squares of the relative error.
 *   reduce   the backend's reduction kernel through tpf_cuda_probe_reduce (include/tpflex/
 *            tpflex_cuda.h: TPF_CUDA_COMM_CTAS CTAs, as a reduce-scatter step launches it) summing
 *            2, 4 and 8 views of [rows, H]; fitted like a copy over the bytes read
 *            (count * rows * H * e, what the cost model charges).
 *   launch   host time of enqueueing one step, median of 200 calls each: (GEMM enqueue + copy
 *            enqueue) / 2 + one cudaEventRecord + cudaStreamWaitEvent (the in-process backend
 *            orders every cross-stream step through an event). The GEMM enqueue is the backend's
 *            own count of its cuBLASLt call's host time in each P = 1 operation
 *            (tpf_cuda_backend_enqueue_stats, kind gemm); the empty kernel launch (reported, not
 *            used) is tpf_cuda_probe_empty_launch.
 *   handshake, barrier: the in-process ranks' host rendezvous (record an event, publish it, wait
 *            until the peer has published, make the stream wait on the peer's event) between two
 *            rank threads, per round; the backend's handshake and barrier are that mechanism.
 */
#define _POSIX_C_SOURCE 200809L
#include "calibrate.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef TPF_HAVE_CUDA

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdatomic.h>

#include "tpflex/tpflex_backend_support.h" /* TPF_CHECK, TPF_RETURN_IF */
#include "reference.h"                     /* tpf_ref_store: random operands of any dtype */
#include "tpflex/tpflex_cuda.h"            /* the P = 1 backend, its enqueue counters and probes */

#include "cli_args.h" /* cli_parse_u64: the TPF_CAL_* environment knobs */

typedef unsigned long long ull;

#define CAL_FLUSH_BYTES (256ull << 20)
#define CAL_MAX_M 32768ull
#define CAL_MAX_ITERS 1000

typedef struct {
  const cal_opts *o;
  cudaStream_t s;
  cudaEvent_t e0[CAL_MAX_ITERS], e1[CAL_MAX_ITERS];
  void *flush;
  void *a, *w, *d;           /* operands: A [32768, kmax], W [nmax, kmax], D [32768, nmax] */
  void *a8, *w8;             /* --fp8: E4M3 A [32768, kmax] and W [nmax, kmax] (D: d, bf16) */
  float *scale;              /* --fp8: a_scale_inv and w_scale_inv, device floats = 1 */
  uint64_t kmax, nmax;       /* elements */
  uint64_t a_bytes, d_bytes; /* >= 256 MiB each: also the sources and targets of the copies */
  /* The CUDA backend at P = 1 (one rank thread: this one) and its BULK communicator, whose
   * operations are one GEMM each; the probes run on the same backend. */
  tpf_cuda_threads *grp;
  tpf_backend *be;
  tpf_comm *comm;
  int points, done; /* progress */
  double t0_ns;
} cal_cu;

static double cal_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int cal_cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}
static double cal_median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cal_cmp);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static tpf_status cal_cu_err(cudaError_t e, const char *what) {
  return tpf_set_error(TPF_EBACKEND, "%s: %s (%s)", what, cudaGetErrorName(e),
                       cudaGetErrorString(e));
}
#define CAL_CU(call, what)                                                                         \
  do {                                                                                             \
    cudaError_t cal_e_ = (call);                                                                   \
    if (cal_e_ != cudaSuccess) return cal_cu_err(cal_e_, what);                                    \
  } while (0)

/* A knob the CUDA backend also reads (its cuda_param.c), parsed as strictly as every
 * command-line number (cli_parse_u64: decimal, no sign, no wrap, in [lo, hi]); an invalid value
 * is named in a warning and the default is used, as the backend does. */
static uint64_t cal_env_u64(const char *name, uint64_t dflt, uint64_t lo, uint64_t hi) {
  const char *v = getenv(name);
  if (!v || !*v) return dflt;
  uint64_t x = 0;
  if (cli_parse_u64(v, lo, hi, &x)) return x;
  fprintf(stderr,
          "tpflex calibrate: warning: %s='%s' is not a decimal number in [%llu, %llu]: using the "
          "default %llu\n",
          name, v, (unsigned long long)lo, (unsigned long long)hi, (unsigned long long)dflt);
  return dflt;
}

static void cal_progress(cal_cu *c, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
static void cal_progress(cal_cu *c, const char *fmt, ...) {
  char buf[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  c->done++;
  fprintf(stderr, "[calibrate %3d/%d %5.1f s] %s\n", c->done, c->points,
          (cal_now_ns() - c->t0_ns) * 1e-9, buf);
  fflush(stderr);
}

/* Random values in [-1, 1) of the dtype: one upload of 4 Mi elements, then doubling copies. */
static tpf_status cal_fill(void *dev, uint64_t elems, tpf_dtype dt) {
  const uint64_t unit = 1ull << 22, e = tpf_dtype_size(dt);
  uint64_t n = elems < unit ? elems : unit;
  void *host = malloc(n * e);
  if (!host) return tpf_set_error(TPF_ENOMEM, "calibrate: no host memory for the inputs");
  uint64_t s = 0x9E3779B97F4A7C15ull;
  for (uint64_t i = 0; i < n; i++)
    tpf_ref_store(dt, host, i, tpf_ref_rand_uniform(&s, -1.0f, 1.0f));
  cudaError_t err = cudaMemcpy(dev, host, n * e, cudaMemcpyHostToDevice);
  free(host);
  if (err != cudaSuccess) return cal_cu_err(err, "cudaMemcpy(inputs)");
  for (uint64_t cur = n; cur < elems;) {
    uint64_t k = elems - cur < cur ? elems - cur : cur;
    CAL_CU(cudaMemcpy((char *)dev + cur * e, dev, k * e, cudaMemcpyDeviceToDevice),
           "cudaMemcpy(tile)");
    cur += k;
  }
  return TPF_OK;
}

/* Median over o->iters repetitions of what `rep` enqueues, in microseconds, each repetition
 * after an L2 flush and bracketed by events; `per` divides each sample (back-to-back batches).
 * warm untimed repetitions first. */
typedef tpf_status (*cal_rep_fn)(cal_cu *c, int rep, void *arg);
static tpf_status cal_time(cal_cu *c, cal_rep_fn rep, void *arg, int per, double *us) {
  const int n = c->o->iters, warm = 2;
  for (int i = 0; i < warm; i++)
    TPF_CHECK(rep(c, -1 - i, arg));
  for (int i = 0; i < n; i++) {
    CAL_CU(cudaMemsetAsync(c->flush, i & 0xFF, CAL_FLUSH_BYTES, c->s), "cudaMemsetAsync(flush)");
    CAL_CU(cudaEventRecord(c->e0[i], c->s), "cudaEventRecord");
    TPF_CHECK(rep(c, i, arg));
    CAL_CU(cudaEventRecord(c->e1[i], c->s), "cudaEventRecord");
  }
  CAL_CU(cudaStreamSynchronize(c->s), "cudaStreamSynchronize");
  double v[CAL_MAX_ITERS];
  for (int i = 0; i < n; i++) {
    float ms = 0;
    CAL_CU(cudaEventElapsedTime(&ms, c->e0[i], c->e1[i]), "cudaEventElapsedTime");
    v[i] = (double)ms * 1e3 / per;
  }
  *us = cal_median(v, n);
  return TPF_OK;
}

/* ---- gemm: row-major d[m, n] = a[m, k] w[n, k]^T, the backend's GEMM through a P = 1 BULK
 * communicator's tpf_bulk_overlap (one GEMM step on the caller's stream; the backend plans it
 * with its cuBLASLt mapping and caches the plan per shape: the warm-up repetitions plan). */

typedef struct {
  uint64_t m, n, k;
  int batch;
  bool fp8; /* E4M3 x E4M3 -> bf16 with the per-tensor scales, else --dtype throughout */
} cal_gemm_arg;

/* One E4M3 x E4M3 -> bf16 GEMM of g on the row block `block` of the fp8 A, with the scales
 * (tpf_op_options a_scale_inv, w_scale_inv) as TE passes a Float8Tensor's scale_inv. */
static tpf_status cal_gemm_one_fp8(cal_cu *c, const cal_gemm_arg *g, int block) {
  tpf_matrix a = {(char *)c->a8 + (uint64_t)block * g->m * g->k, g->m, g->k, g->k, TPF_FP8_E4M3};
  tpf_matrix w = {c->w8, g->n, g->k, g->k, TPF_FP8_E4M3};
  tpf_matrix d = {c->d, g->m, g->n, g->n, TPF_BF16};
  tpf_op_options opt = TPF_OP_OPTIONS_INIT;
  opt.a_scale_inv = c->scale;
  opt.w_scale_inv = c->scale + 1;
  return tpf_bulk_overlap_ex(c->comm, &a, &w, &d, &opt, c->s);
}

/* One GEMM of g on the row block `block` of A. */
static tpf_status cal_gemm_one(cal_cu *c, const cal_gemm_arg *g, int block) {
  if (g->fp8) return cal_gemm_one_fp8(c, g, block);
  const tpf_dtype dt = c->o->dtype;
  const uint64_t e = tpf_dtype_size(dt);
  tpf_matrix a = {(char *)c->a + (uint64_t)block * g->m * g->k * e, g->m, g->k, g->k, dt};
  tpf_matrix w = {c->w, g->n, g->k, g->k, dt};
  tpf_matrix d = {c->d, g->m, g->n, g->n, dt};
  return tpf_bulk_overlap(c->comm, &a, &w, &d, c->s);
}

static tpf_status cal_gemm_rep(cal_cu *c, int rep, void *p) {
  (void)rep;
  const cal_gemm_arg *g = p;
  for (int b = 0; b < g->batch; b++)
    TPF_CHECK(cal_gemm_one(c, g, b));
  return TPF_OK;
}

/* ---- copies and reductions ---- */

typedef struct {
  void *dst;
  int dst_dev;
  const void *src;
  int src_dev;
  uint64_t bytes;
  bool peer; /* cudaMemcpyPeerAsync, else cudaMemcpyAsync */
} cal_copy_arg;

static tpf_status cal_copy_rep(cal_cu *c, int rep, void *p) {
  (void)rep;
  const cal_copy_arg *a = p;
  if (a->peer)
    CAL_CU(cudaMemcpyPeerAsync(a->dst, a->dst_dev, a->src, a->src_dev, a->bytes, c->s),
           "cudaMemcpyPeerAsync");
  else
    CAL_CU(cudaMemcpyAsync(a->dst, a->src, a->bytes, cudaMemcpyDeviceToDevice, c->s),
           "cudaMemcpyAsync");
  return TPF_OK;
}

typedef struct {
  const void *srcs[8];
  int count;
  uint64_t rows;
} cal_reduce_arg;

static tpf_status cal_reduce_rep(cal_cu *c, int rep, void *p) {
  (void)rep;
  const cal_reduce_arg *a = p;
  const uint64_t H = c->o->hidden;
  return tpf_cuda_probe_reduce(c->be, a->srcs, a->count, H, c->d, H, a->rows, H, c->o->dtype, c->s);
}

/* us = lat + bytes / (gbps * 1e3), least squares of the relative error; *worst gets the largest
 * relative residual. */
static void cal_fit(const double *bytes, const double *us, int n, tpf_cost_link *out,
                    double *worst) {
  double sw = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (int i = 0; i < n; i++) {
    double w = 1.0 / (us[i] * us[i]);
    sw += w;
    sx += w * bytes[i];
    sy += w * us[i];
    sxx += w * bytes[i] * bytes[i];
    sxy += w * bytes[i] * us[i];
  }
  double det = sw * sxx - sx * sx, a = 0, b = 0;
  if (det > 0) {
    a = (sxx * sy - sx * sxy) / det;
    b = (sw * sxy - sx * sy) / det;
  }
  if (a < 0 || b <= 0) { /* no latency: the slope through the origin */
    a = 0;
    b = sxy / sxx;
  }
  if (b <= 0) b = 1e-9;
  out->latency_us = a;
  out->gbps = 1.0 / (b * 1e3);
  if (out->gbps < 0.1) out->gbps = 0.1; /* printed with one decimal: never "0.0" */
  *worst = 0;
  for (int i = 0; i < n; i++) {
    double r = fabs(a + b * bytes[i] - us[i]) / us[i];
    if (r > *worst) *worst = r;
  }
}

/* ---- host costs ---- */

/* Median host time (us) of `what` over 200 calls, synchronising every 50 so no queue fills. */
typedef enum { H_GEMM, H_COPY, H_EVENT, H_KERNEL } cal_host_kind;
static tpf_status cal_host_us(cal_cu *c, cal_host_kind what, cudaStream_t other, cudaEvent_t ev,
                              const cal_gemm_arg *small, double *us) {
  enum { N = 200 };
  double v[N];
  tpf_cuda_enqueue_stats before, after;
  memset(&before, 0, sizeof before);
  memset(&after, 0, sizeof after);
  for (int i = -20; i < N; i++) {
    if (i >= 0 && i % 50 == 0) CAL_CU(cudaStreamSynchronize(c->s), "cudaStreamSynchronize");
    double t0 = cal_now_ns();
    switch (what) {
    case H_GEMM: /* the backend's own count of its cuBLASLt call's host time, not the op's */
      TPF_CHECK(tpf_cuda_backend_enqueue_stats(c->be, &before));
      TPF_CHECK(cal_gemm_one(c, small, 0));
      TPF_CHECK(tpf_cuda_backend_enqueue_stats(c->be, &after));
      TPF_RETURN_IF(after.calls[TPF_CUDA_ENQ_GEMM] != before.calls[TPF_CUDA_ENQ_GEMM] + 1,
                    TPF_EBACKEND, "calibrate: a P = 1 operation made %llu GEMM calls, not one",
                    (ull)(after.calls[TPF_CUDA_ENQ_GEMM] - before.calls[TPF_CUDA_ENQ_GEMM]));
      break;
    case H_COPY:
      CAL_CU(cudaMemcpyAsync(c->d, c->a, 65536, cudaMemcpyDeviceToDevice, c->s), "cudaMemcpyAsync");
      break;
    case H_EVENT:
      CAL_CU(cudaEventRecord(ev, c->s), "cudaEventRecord");
      CAL_CU(cudaStreamWaitEvent(other, ev, 0), "cudaStreamWaitEvent");
      break;
    case H_KERNEL: /* the backend's 1-thread flag kernel with no peer, doing nothing */
      TPF_CHECK(tpf_cuda_probe_empty_launch(c->be, c->s));
      break;
    }
    if (i >= 0)
      v[i] = what == H_GEMM
                 ? (double)(after.ns[TPF_CUDA_ENQ_GEMM] - before.ns[TPF_CUDA_ENQ_GEMM]) * 1e-3
                 : (cal_now_ns() - t0) * 1e-3;
  }
  CAL_CU(cudaStreamSynchronize(c->s), "cudaStreamSynchronize");
  CAL_CU(cudaStreamSynchronize(other), "cudaStreamSynchronize");
  qsort(v, N, sizeof *v, cal_cmp);
  *us = 0.5 * (v[N / 2 - 1] + v[N / 2]);
  return TPF_OK;
}

/* Two rank threads doing the in-process handshake: record, publish, wait for the peer, wait on
 * its event. */
typedef struct {
  int device, rounds;
  _Atomic uint64_t word[2];
  cudaEvent_t ev[2][2];
  cudaStream_t s[2];
  pthread_barrier_t bar;
  double us;
  tpf_status rc[2];
} cal_hs;
typedef struct {
  cal_hs *h;
  int me;
} cal_hs_arg;

static void *cal_hs_thread(void *p) {
  cal_hs_arg *a = p;
  cal_hs *h = a->h;
  const int me = a->me, peer = 1 - me;
  tpf_status rc = TPF_OK;
  if (cudaSetDevice(h->device) != cudaSuccess) rc = TPF_EBACKEND;
  pthread_barrier_wait(&h->bar);
  double t0 = cal_now_ns();
  for (int i = 1; rc == TPF_OK && i <= h->rounds; i++) {
    cudaEvent_t ev = h->ev[me][i & 1];
    if (cudaEventRecord(ev, h->s[me]) != cudaSuccess) rc = TPF_EBACKEND;
    atomic_store_explicit(&h->word[me], (uint64_t)i, memory_order_release);
    double w0 = cal_now_ns();
    while (atomic_load_explicit(&h->word[peer], memory_order_acquire) < (uint64_t)i)
      if (cal_now_ns() - w0 > 1e10) { /* 10 s: the peer died */
        rc = TPF_ETIMEOUT;
        break;
      }
    if (rc == TPF_OK && cudaStreamWaitEvent(h->s[me], h->ev[peer][i & 1], 0) != cudaSuccess)
      rc = TPF_EBACKEND;
  }
  double t1 = cal_now_ns();
  if (rc != TPF_OK) atomic_store(&h->word[me], UINT64_MAX); /* release the peer */
  if (me == 0) h->us = (t1 - t0) * 1e-3 / h->rounds;
  h->rc[me] = rc;
  return NULL;
}

static tpf_status cal_handshake(int device, double *us) {
  static cal_hs h;
  memset(&h, 0, sizeof h);
  h.device = device;
  h.rounds = 2000;
  for (int r = 0; r < 2; r++) {
    CAL_CU(cudaStreamCreateWithFlags(&h.s[r], cudaStreamNonBlocking), "cudaStreamCreate");
    for (int k = 0; k < 2; k++)
      CAL_CU(cudaEventCreateWithFlags(&h.ev[r][k], cudaEventDisableTiming), "cudaEventCreate");
  }
  pthread_barrier_init(&h.bar, NULL, 2);
  pthread_t th[2];
  cal_hs_arg args[2] = {{&h, 0}, {&h, 1}};
  for (int r = 0; r < 2; r++)
    pthread_create(&th[r], NULL, cal_hs_thread, &args[r]);
  for (int r = 0; r < 2; r++)
    pthread_join(th[r], NULL);
  pthread_barrier_destroy(&h.bar);
  for (int r = 0; r < 2; r++) {
    cudaStreamSynchronize(h.s[r]);
    cudaStreamDestroy(h.s[r]);
    for (int k = 0; k < 2; k++)
      cudaEventDestroy(h.ev[r][k]);
  }
  TPF_RETURN_IF(h.rc[0] != TPF_OK || h.rc[1] != TPF_OK, TPF_EBACKEND,
                "calibrate: the handshake threads failed (%s, %s)", tpf_status_name(h.rc[0]),
                tpf_status_name(h.rc[1]));
  *us = h.us;
  return TPF_OK;
}

/* ---- the whole measurement ---- */

static void cal_free(cal_cu *c) {
  for (int i = 0; i < CAL_MAX_ITERS; i++) {
    if (c->e0[i]) cudaEventDestroy(c->e0[i]);
    if (c->e1[i]) cudaEventDestroy(c->e1[i]);
  }
  if (c->s) cudaStreamSynchronize(c->s);
  if (c->comm) tpf_comm_destroy(c->comm);
  if (c->be) tpf_cuda_backend_destroy(c->be);
  if (c->grp) tpf_cuda_threads_destroy(c->grp);
  c->comm = NULL;
  c->be = NULL;
  c->grp = NULL;
  if (c->s) cudaStreamDestroy(c->s);
  if (c->flush) cudaFree(c->flush);
  if (c->a) cudaFree(c->a);
  if (c->w) cudaFree(c->w);
  if (c->d) cudaFree(c->d);
  if (c->a8) cudaFree(c->a8);
  if (c->w8) cudaFree(c->w8);
  if (c->scale) cudaFree(c->scale);
}

/* The device, its description in rep->gpu, the stream, events, operands, and the P = 1 backend
 * with its BULK communicator (the GEMMs and probes run through them). */
static tpf_status cal_setup(cal_cu *c, cal_report *rep) {
  const cal_opts *o = c->o;
  const tpf_dtype dt = o->dtype;
  const uint64_t e = tpf_dtype_size(dt), H = o->hidden;
  CAL_CU(cudaSetDevice(o->device), "cudaSetDevice");
  struct cudaDeviceProp prop;
  CAL_CU(cudaGetDeviceProperties(&prop, o->device), "cudaGetDeviceProperties");
  int rt = 0, drv = 0;
  cudaRuntimeGetVersion(&rt);
  cudaDriverGetVersion(&drv);
  snprintf(rep->gpu, sizeof rep->gpu,
           "%s (%d SMs, compute capability %d.%d), CUDA runtime %d, driver %d, cuBLASLt %zu",
           prop.name, prop.multiProcessorCount, prop.major, prop.minor, rt, drv,
           cublasLtGetVersion());
  c->nmax = H;
  c->kmax = H;
  for (int i = 0; i < o->nns; i++) {
    if (o->ns[i] > c->nmax) c->nmax = o->ns[i];
    if (o->ns[i] > c->kmax) c->kmax = o->ns[i];
  }
  CAL_CU(cudaStreamCreateWithFlags(&c->s, cudaStreamNonBlocking), "cudaStreamCreate");
  for (int i = 0; i < o->iters; i++) {
    CAL_CU(cudaEventCreate(&c->e0[i]), "cudaEventCreate");
    CAL_CU(cudaEventCreate(&c->e1[i]), "cudaEventCreate");
  }
  CAL_CU(cudaMalloc(&c->flush, CAL_FLUSH_BYTES), "cudaMalloc(flush)");
  const uint64_t min_bytes = 256ull << 20;
  c->a_bytes = CAL_MAX_M * c->kmax * e > min_bytes ? CAL_MAX_M * c->kmax * e : min_bytes;
  c->d_bytes = CAL_MAX_M * c->nmax * e > min_bytes ? CAL_MAX_M * c->nmax * e : min_bytes;
  CAL_CU(cudaMalloc(&c->a, c->a_bytes), "cudaMalloc(A)");
  CAL_CU(cudaMalloc(&c->w, c->nmax * c->kmax * e), "cudaMalloc(W)");
  CAL_CU(cudaMalloc(&c->d, c->d_bytes), "cudaMalloc(D)");
  TPF_CHECK(cal_fill(c->a, c->a_bytes / e, dt));
  TPF_CHECK(cal_fill(c->w, c->nmax * c->kmax, dt));
  CAL_CU(cudaMemset(c->d, 0, c->d_bytes), "cudaMemset(D)");
  if (o->fp8) { /* E4M3 operands of their own (valid values in [-1, 1)); D is d, as bf16 */
    const float one[2] = {1.0f, 1.0f};
    CAL_CU(cudaMalloc(&c->a8, CAL_MAX_M * c->kmax), "cudaMalloc(A fp8)");
    CAL_CU(cudaMalloc(&c->w8, c->nmax * c->kmax), "cudaMalloc(W fp8)");
    CAL_CU(cudaMalloc((void **)&c->scale, sizeof one), "cudaMalloc(scales)");
    CAL_CU(cudaMemcpy(c->scale, one, sizeof one, cudaMemcpyHostToDevice), "cudaMemcpy(scales)");
    TPF_CHECK(cal_fill(c->a8, CAL_MAX_M * c->kmax, TPF_FP8_E4M3));
    TPF_CHECK(cal_fill(c->w8, c->nmax * c->kmax, TPF_FP8_E4M3));
  }
  /* The backend at P = 1: one rank, this thread, on --device. */
  TPF_CHECK(tpf_cuda_threads_create(1, &c->grp));
  tpf_bootstrap boot;
  TPF_CHECK(tpf_cuda_threads_bootstrap(c->grp, 0, o->device, &boot));
  TPF_CHECK(tpf_cuda_backend_create(&boot, &c->be));
  tpf_comm_config cfg = TPF_COMM_CONFIG_INIT;
  cfg.name = "calibrate_gemm";
  cfg.algo = TPF_ALGO_BULK; /* at P = 1 an operation is its one GEMM; the buffer is unused */
  cfg.coll = TPF_COLL_AG;
  cfg.dtype = dt;
  cfg.capacity = (tpf_shape){128, 128};
  TPF_CHECK(tpf_comm_create(c->be, &cfg, &c->comm));
  return TPF_OK;
}

/* The measurement's grid: GEMM rows, copy sizes, reduction counts and rows (--quick: fewer). */
typedef struct {
  const uint64_t *ms, *sz, *rows;
  const int *cnt;
  int nm, nsz, ncnt, nrows;
} cal_grid;

static cal_grid cal_grid_of(const cal_opts *o) {
  static const uint64_t ms_full[] = {64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768};
  static const uint64_t ms_quick[] = {64, 256, 1024, 4096, 16384, 32768};
  static const uint64_t sz_full[] = {64ull << 10, 256ull << 10, 1ull << 20,  4ull << 20,
                                     16ull << 20, 64ull << 20,  256ull << 20};
  static const uint64_t sz_quick[] = {256ull << 10, 4ull << 20, 64ull << 20};
  static const int cnt_full[] = {2, 4, 8}, cnt_quick[] = {4};
  static const uint64_t rows_red[] = {16, 64, 256, 1024, 4096};
  cal_grid g = {o->quick ? ms_quick : ms_full,
                o->quick ? sz_quick : sz_full,
                o->quick ? rows_red + 1 : rows_red,
                o->quick ? cnt_quick : cnt_full,
                o->quick ? 6 : 10,
                o->quick ? 3 : 7,
                o->quick ? 1 : 3,
                o->quick ? 3 : 5};
  return g;
}

/* GEMMs: AG [m, N, H] then RS [m, H, N] for each N, as gemm points of t: --dtype, or (fp8)
 * E4M3 x E4M3 -> bf16 as fp8_e4m3 points. */
static tpf_status cal_gemms(cal_cu *c, const cal_grid *gr, bool fp8, tpf_cost_table *t,
                            cal_report *rep) {
  const cal_opts *o = c->o;
  const tpf_dtype dt = fp8 ? TPF_FP8_E4M3 : o->dtype;
  double *lo = fp8 ? &rep->fp8_tf_lo : &rep->gemm_tf_lo,
         *hi = fp8 ? &rep->fp8_tf_hi : &rep->gemm_tf_hi;
  *lo = 1e300;
  *hi = 0;
  for (int ni = 0; ni < o->nns; ni++)
    for (int shape = 0; shape < 2; shape++)
      for (int mi = 0; mi < gr->nm; mi++) {
        cal_gemm_arg g;
        memset(&g, 0, sizeof g);
        g.m = gr->ms[mi];
        g.n = shape == 0 ? o->ns[ni] : o->hidden;
        g.k = shape == 0 ? o->hidden : o->ns[ni];
        uint64_t b = CAL_MAX_M / g.m;
        g.batch = (int)(b > 4 ? 4 : b < 1 ? 1 : b);
        g.fp8 = fp8;
        double us = 0;
        TPF_CHECK(cal_time(c, cal_gemm_rep, &g, g.batch, &us));
        TPF_RETURN_IF(t->ngemm >= TPF_COST_MAX_GEMM_POINTS, TPF_EINVAL,
                      "calibrate: more than %d gemm points", TPF_COST_MAX_GEMM_POINTS);
        t->gemm[t->ngemm++] = (tpf_cost_gemm_point){dt, g.m, g.n, g.k, us};
        rep->nfp8 += fp8;
        double tf = 2.0 * (double)g.m * (double)g.n * (double)g.k / (us * 1e-6) / 1e12;
        if (tf < *lo) *lo = tf;
        if (tf > *hi) *hi = tf;
        cal_progress(c,
                     "gemm %s%s %s m=%llu n=%llu k=%llu: %.2f us (%.1f TFLOP/s, %d back to back)",
                     tpf_dtype_name(dt), fp8 ? " x fp8_e4m3 -> bf16" : "", shape == 0 ? "AG" : "RS",
                     (ull)g.m, (ull)g.n, (ull)g.k, us, tf, g.batch);
      }
  return TPF_OK;
}

/* A 256 MiB destination on the peer device, with peer access enabled from --device. */
static tpf_status cal_peer_alloc(const cal_opts *o, void **peer_dst) {
  int can = 0;
  CAL_CU(cudaDeviceCanAccessPeer(&can, o->device, o->peer), "cudaDeviceCanAccessPeer");
  TPF_RETURN_IF(!can, TPF_EUNSUPPORTED,
                "calibrate: device %d cannot access device %d as a peer (no P2P between them)",
                o->device, o->peer);
  cudaError_t pe = cudaDeviceEnablePeerAccess(o->peer, 0);
  if (pe == cudaErrorPeerAccessAlreadyEnabled)
    (void)cudaGetLastError();
  else if (pe != cudaSuccess)
    return cal_cu_err(pe, "cudaDeviceEnablePeerAccess");
  CAL_CU(cudaSetDevice(o->peer), "cudaSetDevice(peer)");
  cudaError_t ae = cudaMalloc(peer_dst, 256ull << 20);
  CAL_CU(cudaSetDevice(o->device), "cudaSetDevice");
  if (ae != cudaSuccess) return cal_cu_err(ae, "cudaMalloc(peer)");
  return TPF_OK;
}

/* Copies: local, then peer, each fitted into t's link. */
static tpf_status cal_copies(cal_cu *c, const cal_grid *gr, tpf_cost_table *t, cal_report *rep) {
  const cal_opts *o = c->o;
  void *peer_dst = NULL;
  rep->peer_other = o->peer != o->device;
  if (rep->peer_other) TPF_CHECK(cal_peer_alloc(o, &peer_dst));
  double xs[16], ys[16];
  for (int kind = 0; kind < 2; kind++) { /* 0 local, 1 peer */
    for (int i = 0; i < gr->nsz; i++) {
      cal_copy_arg a = {kind == 1 && peer_dst ? peer_dst : c->d,
                        kind == 1 ? o->peer : o->device,
                        c->a,
                        o->device,
                        gr->sz[i],
                        kind == 1};
      tpf_status st = cal_time(c, cal_copy_rep, &a, 1, &ys[i]);
      if (st != TPF_OK) {
        if (peer_dst) cudaFree(peer_dst);
        return st;
      }
      xs[i] = (double)gr->sz[i];
      cal_progress(c, "copy %s %llu KiB: %.2f us (%.1f GB/s)", kind ? "peer" : "local",
                   (ull)(gr->sz[i] >> 10), ys[i], xs[i] / (ys[i] * 1e3));
    }
    cal_fit(xs, ys, gr->nsz, kind ? &t->peer : &t->local, kind ? &rep->peer_res : &rep->local_res);
  }
  if (peer_dst) cudaFree(peer_dst);
  return TPF_OK;
}

/* Reductions: count views of [rows, H] from A into D, fitted over the bytes read. */
static tpf_status cal_reductions(cal_cu *c, const cal_grid *gr, tpf_cost_table *t,
                                 cal_report *rep) {
  const uint64_t H = c->o->hidden, e = tpf_dtype_size(c->o->dtype);
  rep->ctas = (int)cal_env_u64("TPF_CUDA_COMM_CTAS", 16, 1, 1024);
  if (rep->ctas < 1) rep->ctas = 1;
  if (rep->ctas > 1024) rep->ctas = 1024;
  double xs[16], ys[16];
  int nr = 0;
  for (int ci = 0; ci < gr->ncnt; ci++)
    for (int ri = 0; ri < gr->nrows; ri++) {
      cal_reduce_arg a;
      memset(&a, 0, sizeof a);
      const uint64_t rows = gr->rows[ri];
      for (int q = 0; q < gr->cnt[ci]; q++)
        a.srcs[q] = (const char *)c->a + (uint64_t)q * rows * H * e;
      a.count = gr->cnt[ci];
      a.rows = rows;
      TPF_CHECK(cal_time(c, cal_reduce_rep, &a, 1, &ys[nr]));
      xs[nr] = (double)gr->cnt[ci] * (double)rows * (double)H * (double)e;
      cal_progress(c, "reduce %d x [%llu, %llu]: %.2f us (%.1f GB/s read)", gr->cnt[ci], (ull)rows,
                   (ull)H, ys[nr], xs[nr] / (ys[nr] * 1e3));
      nr++;
    }
  cal_fit(xs, ys, nr, &t->reduce, &rep->reduce_res);
  return TPF_OK;
}

/* Host costs: the enqueue of a GEMM, a copy, an event pair and an empty kernel; launch_us. */
static tpf_status cal_hosts(cal_cu *c, tpf_cost_table *t, cal_report *rep) {
  cudaStream_t other = NULL;
  cudaEvent_t ev = NULL;
  CAL_CU(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking), "cudaStreamCreate");
  CAL_CU(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreate");
  cal_gemm_arg small;
  memset(&small, 0, sizeof small);
  small.m = 64;
  small.n = c->nmax < 1024 ? c->nmax : 1024;
  small.k = c->o->hidden;
  small.batch = 1;
  tpf_status st = cal_host_us(c, H_GEMM, other, ev, &small, &rep->h_gemm);
  if (st == TPF_OK) cal_progress(c, "host: cublasLtMatmul enqueue %.2f us", rep->h_gemm);
  if (st == TPF_OK) st = cal_host_us(c, H_COPY, other, ev, NULL, &rep->h_copy);
  if (st == TPF_OK) cal_progress(c, "host: cudaMemcpyAsync enqueue %.2f us", rep->h_copy);
  if (st == TPF_OK) st = cal_host_us(c, H_EVENT, other, ev, NULL, &rep->h_event);
  if (st == TPF_OK)
    cal_progress(c, "host: cudaEventRecord + cudaStreamWaitEvent %.2f us", rep->h_event);
  if (st == TPF_OK) st = cal_host_us(c, H_KERNEL, other, ev, NULL, &rep->h_kernel);
  if (st == TPF_OK) cal_progress(c, "host: empty kernel launch %.2f us", rep->h_kernel);
  cudaEventDestroy(ev);
  cudaStreamDestroy(other);
  TPF_CHECK(st);
  t->launch_us = 0.5 * (rep->h_gemm + rep->h_copy) + rep->h_event;
  return TPF_OK;
}

static tpf_status cal_measure(cal_cu *c, tpf_cost_table *t, cal_report *rep) {
  const cal_opts *o = c->o;
  TPF_CHECK(cal_setup(c, rep));
  const cal_grid gr = cal_grid_of(o);
  c->points = (o->fp8 ? 4 : 2) * o->nns * gr.nm + 2 * gr.nsz + gr.ncnt * gr.nrows + 5;
  c->t0_ns = cal_now_ns();
  fprintf(stderr, "calibrate: %s; %s GEMMs%s, %d repetitions per point\n", rep->gpu,
          tpf_dtype_name(o->dtype), o->fp8 ? " and fp8_e4m3 x fp8_e4m3 -> bf16 GEMMs" : "",
          o->iters);
  TPF_CHECK(cal_gemms(c, &gr, false, t, rep));
  if (o->fp8) TPF_CHECK(cal_gemms(c, &gr, true, t, rep));
  TPF_CHECK(cal_copies(c, &gr, t, rep));
  TPF_CHECK(cal_reductions(c, &gr, t, rep));
  TPF_CHECK(cal_hosts(c, t, rep));
  double hs_us = 0;
  TPF_CHECK(cal_handshake(o->device, &hs_us));
  cal_progress(c, "host: in-process handshake round of 2 ranks %.2f us", hs_us);
  t->handshake_us = hs_us;
  t->barrier_us = hs_us;
  rep->seconds = (cal_now_ns() - c->t0_ns) * 1e-9;
  return TPF_OK;
}

int cal_cuda_device_count(char *why, size_t len) {
  int count = 0;
  cudaError_t ce = cudaGetDeviceCount(&count);
  if (ce != cudaSuccess || count == 0) {
    snprintf(why, len, "%s",
             ce != cudaSuccess ? cudaGetErrorString(ce) : "cudaGetDeviceCount found 0 devices");
    return 0;
  }
  return count;
}

tpf_status cal_cuda_measure(const cal_opts *o, tpf_cost_table *t, cal_report *rep) {
  static cal_cu c;
  memset(&c, 0, sizeof c);
  c.o = o;
  tpf_status st = cal_measure(&c, t, rep);
  cal_free(&c);
  return st;
}

#else /* !TPF_HAVE_CUDA */

int cal_cuda_device_count(char *why, size_t len) {
  snprintf(why, len, "this build has no CUDA backend");
  return 0;
}

tpf_status cal_cuda_measure(const cal_opts *o, tpf_cost_table *t, cal_report *rep) {
  (void)o;
  (void)t;
  (void)rep;
  return tpf_set_error(TPF_EUNSUPPORTED, "calibrate: this build has no CUDA backend");
}

#endif /* TPF_HAVE_CUDA */
