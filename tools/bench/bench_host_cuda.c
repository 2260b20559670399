/* `tpflex bench --backend cuda --section host`: the host cost of one operation on the CUDA
 * backend against a plain cuBLASLt matmul of the same shape, side by side in one run (the table
 * `host_cuda`, after the CPU tables of bench_host.c). Without the CUDA backend, a stub.
 *
 * Per operation kind (ring_ag+gemm, gemm+ring_rs, gemm+pipeline_rs, bulk_ag+gemm, bulk_rs+gemm),
 * P (ranks as threads on one device; default 1 and 2, or --tp-list) and T (default 1024, 4096,
 * 16384 up to C, --quick 1024 and 4096, or --tokens), on a communicator registered at C =
 * --capacity with active T:
 *  - host(us): the tpf_* call, call to return (CLOCK_MONOTONIC), median over repetitions and ranks;
 *  - calls, cuda(us), peer_wait(us), backend(us): from tpf_cuda_backend_enqueue_stats taken on each
 *    rank's thread before and after the timed repetitions, per operation, mean over ranks: CUDA and
 *    cuBLASLt calls (every kind but peer_wait), host us inside them, host us waiting for a peer
 *    rank, and the whole time inside the backend's execute;
 *  - dev(us): CUDA events around the operation (bench_time_begin/end: after a 1 GiB memset that
 *    evicts the L2 and keeps the GPU busy while the host enqueues; earliest rank's start to latest
 *    rank's end), median;
 *  - mm_host(us), mm_dev(us): on rank 0's stream, one cublasLtMatmul of the operation's whole-layer
 *    GEMM (bf16 in and out, fp32 accumulation, the same M, N, K; the heuristic chosen once per T
 *    outside the timing, as torch caches it), timed the same way in the same repetitions, the
 *    operation and the matmul alternating in order (even repetitions the operation first);
 *  - host/mm, dev/mm: the ratios (printed, not judged);
 *  - host>flush: repetitions whose slowest rank's call took longer than the 1 GiB memset ahead of
 *    it (measured once per group), where dev(us) may include host time.
 * Outputs are not checked here: the tp and fp8 sections check these operations.
 * Plain C: CUDA runtime and cuBLASLt host calls only. Calls bench_group.c, bench_cuda_dev.c and
 * bench_util.c. */
#define _POSIX_C_SOURCE 200809L
#include "bench.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef TPF_HAVE_CUDA

#include "bench_lt.h"

#include <cuda_runtime.h>
#include <math.h>

enum { HC_RING_AG, HC_RING_RS, HC_PIPE_RS, HC_BULK_AG, HC_BULK_RS, HC_NKIND };
static const struct {
  const char *name;
  tpf_algo algo;
  tpf_coll coll;
} kHc[HC_NKIND] = {
    [HC_RING_AG] = {"ring_ag+gemm", TPF_ALGO_RING, TPF_COLL_AG},
    [HC_RING_RS] = {"gemm+ring_rs", TPF_ALGO_RING, TPF_COLL_RS},
    [HC_PIPE_RS] = {"gemm+pipeline_rs", TPF_ALGO_PIPELINE, TPF_COLL_RS},
    [HC_BULK_AG] = {"bulk_ag+gemm", TPF_ALGO_BULK, TPF_COLL_AG},
    [HC_BULK_RS] = {"bulk_rs+gemm", TPF_ALGO_BULK, TPF_COLL_RS},
};
/* The GEMM of a gemm_rs kind is x [T, n] w [H, n]^T; every other kind's is [T, H] [n, H]^T. */
static bool hc_rs_gemm(int k) {
  return kHc[k].coll == TPF_COLL_RS && kHc[k].algo != TPF_ALGO_BULK;
}

/* The enqueue figures per operation (one rank): calls, cuda us, peer_wait us, backend us. */
enum { HE_CALLS, HE_CUDA, HE_PEER, HE_BACKEND, HE_NF };

typedef struct {
  int kind, nts, iters, warmup;
  uint64_t ts[BENCH_MAX_TS];
  uint64_t C, H, n;
  uint64_t xmax, wmax; /* source elements the x and w operands can reach (per rank offset) */
  double flush_us;     /* one 1 GiB memset on this device (rank 0, measured at setup) */
  double host_us[BENCH_MAX_TS], dev_us[BENCH_MAX_TS], mm_host_us[BENCH_MAX_TS],
      mm_dev_us[BENCH_MAX_TS];
  int hbound[BENCH_MAX_TS];
  double enq[BENCH_MAX_TS][TPF_MAX_RANKS][HE_NF]; /* NaN: not measured */
  double *hop;                                    /* [rank * iters + it]: the call's host us */
  double *hmm;                                    /* [it]: the matmul's host us (rank 0) */
  double
      *dus; /* rank 0's device us of both series: [0, iters) the operation's, then the matmul's */
  atomic_int failed;
  pthread_mutex_t mu;
  tpf_status st;
  char err[300];
} hc_job;

static void hc_fail(hc_job *j, tpf_status st, const char *what) {
  pthread_mutex_lock(&j->mu);
  if (j->st == TPF_OK) {
    j->st = st;
    snprintf(j->err, sizeof j->err, "%s: %s (%s)", what, tpf_status_name(st), tpf_last_error());
  }
  pthread_mutex_unlock(&j->mu);
  atomic_store(&j->failed, 1);
}

/* The plain matmul (d[m, n] = x[m, k] w[n, k]^T, row-major bf16, fp32 accumulation) is
 * bench_lt.c's, the baseline the GPU sections share. */

/* Median of REPS timed BENCH_FLUSH_BYTES memsets on `stream` (NULL: the legacy default stream),
 * from the main thread while no rank runs: what the timing's flush gives the host to enqueue
 * before the start event fires. */
static tpf_status hc_flush_us(void *stream, double *us) {
  enum { REPS = 3 };
  void *buf = NULL;
  cudaEvent_t e[2] = {NULL, NULL};
  double v[REPS];
  cudaStream_t s = (cudaStream_t)stream;
  cudaError_t err = cudaMalloc(&buf, BENCH_FLUSH_BYTES);
  if (err == cudaSuccess) err = cudaEventCreate(&e[0]);
  if (err == cudaSuccess) err = cudaEventCreate(&e[1]);
  for (int i = 0; i < REPS && err == cudaSuccess; i++) {
    float ms = 0;
    cudaEventRecord(e[0], s);
    cudaMemsetAsync(buf, i, BENCH_FLUSH_BYTES, s);
    cudaEventRecord(e[1], s);
    err = cudaEventSynchronize(e[1]);
    if (err == cudaSuccess) err = cudaEventElapsedTime(&ms, e[0], e[1]);
    v[i] = (double)ms * 1e3;
  }
  if (e[0]) cudaEventDestroy(e[0]);
  if (e[1]) cudaEventDestroy(e[1]);
  if (buf) cudaFree(buf);
  if (err != cudaSuccess) return bench_cuda_err(err, "the flush's duration");
  *us = bench_median(v, REPS);
  return TPF_OK;
}

/* ---- one kind on one group: every rank's thread ---- */

typedef struct {
  bench_rank *rk;
  hc_job *j;
  bool skip; /* this rank skips the rest of the current T */
  tpf_comm *c;
  void *dmem;         /* the operation's output (AG, bulk: [C, n]; RS: [C/P, H]) */
  void *mmd;          /* rank 0: the matmul's output [C, N of the GEMM] */
  bench_lt lt;        /* rank 0 */
  bench_lt_plan plan; /* rank 0: the current T's */
  bool lt_ready;
  tpf_matrix a, w, d;  /* the current T's operands (a: x of gemm_rs, a of bulk) */
  uint64_t gm, gn, gk; /* the current T's GEMM */
  const void *mx, *mw; /* the matmul's operands */
  tpf_cuda_enqueue_stats s0;
} hc_ctx;

static const uint16_t *hc_src(const hc_ctx *x, uint64_t off) {
  return (const uint16_t *)x->rk->g->src + off;
}

static void hc_setup(hc_ctx *x) {
  hc_job *j = x->j;
  bench_rank *rk = x->rk;
  char name[48];
  snprintf(name, sizeof name, "host_%s", kHc[j->kind].name);
  tpf_comm_config cfg = {.name = name,
                         .algo = kHc[j->kind].algo,
                         .coll = kHc[j->kind].coll,
                         .dtype = TPF_BF16,
                         .capacity = {j->C, j->H}};
  tpf_status st = tpf_comm_create(rk->be, &cfg, &x->c);
  if (st != TPF_OK) hc_fail(j, st, "tpf_comm_create");
  const uint64_t dbytes = (hc_rs_gemm(j->kind) ? j->C / (uint64_t)rk->tp * j->H : j->C * j->n) * 2;
  if (st == TPF_OK && !(x->dmem = bench_mem_alloc(rk->g, dbytes)))
    hc_fail(j, TPF_ENOMEM, "output allocation");
  if (rk->rank != 0 || atomic_load(&j->failed)) return;
  const uint64_t ncols = j->H > j->n ? j->H : j->n;
  if ((st = bench_lt_init(&x->lt)) != TPF_OK) {
    hc_fail(j, st, "cuBLASLt");
  } else if (!(x->mmd = bench_mem_alloc(rk->g, j->C * ncols * 2))) {
    hc_fail(j, TPF_ENOMEM, "matmul output allocation");
  }
  x->lt_ready = st == TPF_OK;
}

/* The communicator at active T, the operands and views, the matmul's plan (x->skip on failure). */
static void hc_shape(hc_ctx *x, uint64_t T) {
  hc_job *j = x->j;
  bench_rank *rk = x->rk;
  const int r = rk->rank;
  const uint64_t xo = (uint64_t)r << 16, wo = j->xmax + ((uint64_t)r << 16);
  tpf_status st = TPF_OK;
  x->skip = bench_agree_failed(rk, &j->failed);
  if (!x->skip && (st = tpf_comm_set_active_shape(x->c, (tpf_shape){T, j->H})) != TPF_OK)
    hc_fail(j, st, "tpf_comm_set_active_shape");
  const bool rs = hc_rs_gemm(j->kind);
  x->gm = T;
  x->gn = rs ? j->H : j->n;
  x->gk = rs ? j->n : j->H;
  x->mx = hc_src(x, xo);
  x->mw = hc_src(x, wo);
  x->a = (tpf_matrix){(void *)x->mx, x->gm, x->gk, x->gk, TPF_BF16};
  x->w = (tpf_matrix){(void *)x->mw, x->gn, x->gk, x->gk, TPF_BF16};
  x->d = rs ? (tpf_matrix){x->dmem, T / (uint64_t)rk->tp, j->H, j->H, TPF_BF16}
            : (tpf_matrix){x->dmem, T, j->n, j->n, TPF_BF16};
  /* AG kinds: the local shard, once per T (the operation reads it, the timing does not). */
  tpf_matrix local = {0};
  if (st == TPF_OK && !x->skip && kHc[j->kind].coll == TPF_COLL_AG) {
    st = tpf_comm_local_chunk(x->c, &local);
    if (st == TPF_OK) st = bench_mem_copy(rk, local.ptr, x->mx, local.rows * local.ld * 2);
    if (st == TPF_OK) st = bench_sync(rk);
    if (st != TPF_OK) hc_fail(j, st, "the local shard");
  }
  if (st == TPF_OK && !x->skip && r == 0 && x->lt_ready) {
    bench_lt_plan_free(&x->plan);
    if ((st = bench_lt_plan_make(&x->lt, x->gm, x->gn, x->gk, &x->plan)) != TPF_OK)
      hc_fail(j, st, "the matmul's plan");
  }
  /* Every rank skips this T when one failed (a peer would wait for it). */
  x->skip = bench_agree_failed(rk, &j->failed) || x->skip || st != TPF_OK;
}

/* The operation once: its host time (us) into *us. */
static void hc_op(hc_ctx *x, double *us) {
  hc_job *j = x->j;
  void *s = x->rk->stream;
  tpf_status st;
  const double t0 = bench_now_ns();
  if (kHc[j->kind].algo == TPF_ALGO_BULK)
    st = tpf_bulk_overlap_ex(x->c, &x->a, &x->w, &x->d, NULL, s);
  else if (kHc[j->kind].coll == TPF_COLL_AG)
    st = tpf_ag_gemm_ex(x->c, &x->w, &x->d, NULL, s);
  else
    st = tpf_gemm_rs_ex(x->c, &x->a, &x->w, &x->d, NULL, s);
  const double t1 = bench_now_ns();
  if (us) *us = (t1 - t0) / 1e3;
  if (st != TPF_OK) {
    hc_fail(j, st, kHc[j->kind].name);
    x->skip = true;
  }
}

/* The plain matmul once on rank 0's stream (other ranks: nothing); its host time into *us. */
static void hc_mm(hc_ctx *x, double *us) {
  if (x->rk->rank != 0) return;
  const double t0 = bench_now_ns();
  tpf_status st =
      bench_lt_exec(&x->lt, &x->plan, x->mx, x->mw, x->mmd, (cudaStream_t)x->rk->stream);
  const double t1 = bench_now_ns();
  if (us) *us = (t1 - t0) / 1e3;
  if (st != TPF_OK) {
    hc_fail(x->j, st, "cublasLtMatmul");
    x->skip = true;
  }
}

/* This rank's enqueue figures per operation since x->s0 into j->enq[ti][rank]. */
static void hc_enq(hc_ctx *x, int ti, bool have0) {
  double *e = x->j->enq[ti][x->rk->rank];
  tpf_cuda_enqueue_stats s1;
  if (!have0 || bench_cuda_enq_stats(x->rk, &s1) != TPF_OK || s1.ops <= x->s0.ops) return;
  const double ops = (double)(s1.ops - x->s0.ops);
  double calls = 0, ns = 0;
  for (int k = 0; k < TPF_CUDA_ENQ_COUNT; k++)
    if (k != TPF_CUDA_ENQ_PEER_WAIT) {
      calls += (double)(s1.calls[k] - x->s0.calls[k]);
      ns += (double)(s1.ns[k] - x->s0.ns[k]);
    }
  e[HE_CALLS] = calls / ops;
  e[HE_CUDA] = ns / ops / 1e3;
  e[HE_PEER] =
      (double)(s1.ns[TPF_CUDA_ENQ_PEER_WAIT] - x->s0.ns[TPF_CUDA_ENQ_PEER_WAIT]) / ops / 1e3;
  e[HE_BACKEND] = (double)(s1.host_ns - x->s0.host_ns) / ops / 1e3;
}

/* Repetition it of T index ti: the operation (device slot it) and the matmul (slot iters + it),
 * alternating which runs first. Every rank makes the same begin/end calls (they hold barriers). */
static void hc_rep(hc_ctx *x, int it) {
  hc_job *j = x->j;
  bench_rank *rk = x->rk;
  for (int half = 0; half < 2; half++) {
    const bool op = (half == 0) == (it % 2 == 0);
    const int slot = op ? it : j->iters + it;
    bench_time_begin(rk, slot);
    if (!x->skip && op) hc_op(x, &j->hop[rk->rank * j->iters + it]);
    if (!x->skip && !op) hc_mm(x, &j->hmm[it]);
    bench_time_end(rk, slot);
  }
}

/* Rank 0, after the series of T index ti: the medians, the repetitions past the flush. */
static void hc_collect(hc_job *j, int ti, int P) {
  const int n = j->iters;
  double *v = malloc((size_t)(P * n + 1) * sizeof(double));
  if (!v || atomic_load(&j->failed)) {
    free(v);
    return;
  }
  int hb = 0;
  for (int it = 0; it < n; it++) {
    double mx = 0;
    for (int r = 0; r < P; r++)
      mx = j->hop[r * n + it] > mx ? j->hop[r * n + it] : mx;
    hb += mx > j->flush_us;
  }
  j->hbound[ti] = hb;
  memcpy(v, j->hop, (size_t)(P * n) * sizeof(double));
  j->host_us[ti] = bench_median(v, P * n);
  memcpy(v, j->hmm, (size_t)n * sizeof(double));
  j->mm_host_us[ti] = bench_median(v, n);
  j->dev_us[ti] = bench_median(j->dus, n);
  j->mm_dev_us[ti] = bench_median(j->dus + n, n);
  free(v);
}

/* T index ti on this rank: warm-up (lockstep), the timed repetitions, the figures. */
static void hc_series(hc_ctx *x, int ti) {
  hc_job *j = x->j;
  bench_rank *rk = x->rk;
  hc_shape(x, j->ts[ti]);
  for (int it = 0; it < j->warmup; it++) {
    if (!x->skip) hc_op(x, NULL);
    if (!x->skip) hc_mm(x, NULL);
    bench_barrier(rk); /* no rank runs an operation ahead of the others */
  }
  if (!x->skip) bench_sync(rk);
  bench_barrier(rk);
  const bool have0 = !x->skip && bench_cuda_enq_stats(rk, &x->s0) == TPF_OK;
  for (int it = 0; it < j->iters; it++)
    hc_rep(x, it);
  if (!x->skip && bench_sync(rk) != TPF_OK) hc_fail(j, TPF_EBACKEND, "synchronize");
  if (!x->skip) hc_enq(x, ti, have0);
  if (bench_time_collect(rk, 2 * j->iters, j->dus) != TPF_OK) hc_fail(j, TPF_EBACKEND, "events");
  if (rk->rank == 0) hc_collect(j, ti, rk->tp);
}

static tpf_status hc_rank(bench_rank *rk, void *arg) {
  hc_ctx x;
  memset(&x, 0, sizeof x);
  x.rk = rk;
  x.j = arg;
  hc_setup(&x);
  for (int ti = 0; ti < x.j->nts; ti++)
    hc_series(&x, ti);
  bench_barrier(rk);
  if (x.c) tpf_comm_destroy(x.c);
  if (x.dmem) bench_mem_free(rk->g, x.dmem);
  if (x.mmd) bench_mem_free(rk->g, x.mmd);
  if (rk->rank == 0) {
    bench_lt_plan_free(&x.plan);
    bench_lt_fini(&x.lt);
  }
  return TPF_OK;
}

/* ---- the table ---- */

static const char *const kCols[] = {
    "op",          "P",         "T",           "M",          "N",
    "K",           "host(us)",  "calls",       "cuda(us)",   "peer_wait(us)",
    "backend(us)", "dev(us)",   "mm_host(us)", "mm_dev(us)", "host/mm",
    "dev/mm",      "host>flush"};
enum { HC_NCOLS = sizeof kCols / sizeof kCols[0] };

/* The mean over P ranks of enqueue field f (NaN when a rank did not measure it). */
static double hc_enq_mean(const hc_job *j, int ti, int P, int f) {
  double s = 0;
  for (int r = 0; r < P; r++)
    s += j->enq[ti][r][f];
  return s / P;
}

static void hc_rows(const hc_job *j, int P) {
  for (int ti = 0; ti < j->nts; ti++) {
    const uint64_t T = j->ts[ti];
    const bool rs = hc_rs_gemm(j->kind);
    bench_cell_s(kHc[j->kind].name);
    bench_cell_i(P);
    bench_cell_i((long long)T);
    bench_cell_i((long long)T);
    bench_cell_i((long long)(rs ? j->H : j->n));
    bench_cell_i((long long)(rs ? j->n : j->H));
    bench_cell_f(j->host_us[ti], 1);
    bench_cell_f(hc_enq_mean(j, ti, P, HE_CALLS), 1);
    bench_cell_f(hc_enq_mean(j, ti, P, HE_CUDA), 1);
    bench_cell_f(hc_enq_mean(j, ti, P, HE_PEER), 1);
    bench_cell_f(hc_enq_mean(j, ti, P, HE_BACKEND), 1);
    bench_cell_f(j->dev_us[ti], 1);
    bench_cell_f(j->mm_host_us[ti], 1);
    bench_cell_f(j->mm_dev_us[ti], 1);
    bench_cell_f(j->host_us[ti] / j->mm_host_us[ti], 2);
    bench_cell_f(j->dev_us[ti] / j->mm_dev_us[ti], 3);
    if (j->hbound[ti] >= 0)
      bench_cell_i(j->hbound[ti]);
    else
      bench_cell_s("n/a");
    bench_row_end();
  }
}

/* Kind k on group g (P ranks): runs it and prints its rows. 1 when it failed (noted). */
static int hc_kind(bench_group *g, hc_job *j, int k, int P) {
  j->kind = k;
  j->st = TPF_OK;
  j->err[0] = 0;
  atomic_store(&j->failed, 0);
  for (int ti = 0; ti < BENCH_MAX_TS; ti++) {
    j->host_us[ti] = j->dev_us[ti] = j->mm_host_us[ti] = j->mm_dev_us[ti] = NAN;
    j->hbound[ti] = -1;
    for (int r = 0; r < TPF_MAX_RANKS; r++)
      for (int f = 0; f < HE_NF; f++)
        j->enq[ti][r][f] = NAN;
  }
  bench_progress("[host cuda] %s P=%d", kHc[k].name, P);
  tpf_status st = bench_group_run(g, hc_rank, j);
  if (st != TPF_OK && j->st == TPF_OK) hc_fail(j, st, "run");
  hc_rows(j, P);
  if (j->st == TPF_OK) return 0;
  bench_note("FAILED %s P=%d: %s", kHc[k].name, P, j->err);
  return 1;
}

/* The T values of P: --tokens, else 1024, 4096, 16384 (--quick: 1024, 4096), those <= C that P
 * divides. */
static int hc_ts(const bench_opts *o, int P, uint64_t *ts) {
  static const uint64_t def[] = {1024, 4096, 16384};
  const int nd = o->quick ? 2 : 3;
  const uint64_t *src = o->tps_given ? o->tps : def;
  const int n = o->tps_given ? o->ntps : nd;
  int m = 0;
  for (int i = 0; i < n; i++)
    if (src[i] <= o->capacity && src[i] % (uint64_t)P == 0) ts[m++] = src[i];
  return m;
}

/* One group of P ranks and every kind on it. Returns the failures. */
static int hc_group(const bench_opts *o, int P, hc_job *j) {
  bench_opts o2 = *o; /* the group's events: both series of a repetition */
  o2.iters = 2 * j->iters;
  j->nts = hc_ts(o, P, j->ts);
  if (j->nts == 0) {
    bench_note("P=%d: no T to run (each T must be <= C = %llu and a multiple of P)", P,
               (unsigned long long)o->capacity);
    return 0;
  }
  bench_group *g = NULL;
  tpf_status st = bench_group_create(&o2, P, &g);
  if (st == TPF_OK) st = bench_src_reserve(g, j->xmax + j->wmax);
  if (st == TPF_OK) st = hc_flush_us(NULL, &j->flush_us); /* no rank runs yet */
  j->hop = calloc((size_t)(P * j->iters), sizeof(double));
  j->hmm = calloc((size_t)j->iters, sizeof(double));
  j->dus = calloc((size_t)(2 * j->iters), sizeof(double));
  const bool ready = st == TPF_OK && j->hop && j->hmm && j->dus;
  int fails = 0;
  if (!ready) {
    bench_note("FAILED P=%d: %s", P, st != TPF_OK ? tpf_last_error() : "no memory");
    fails = 1;
  }
  for (int k = 0; k < HC_NKIND && ready; k++) /* a failed kind leaves the others to run */
    fails += hc_kind(g, j, k, P);
  if (ready)
    bench_note("P=%d: the 1 GiB flush ahead of each repetition takes %.0f us", P, j->flush_us);
  free(j->hop);
  free(j->hmm);
  free(j->dus);
  j->hop = j->hmm = j->dus = NULL;
  bench_group_destroy(g);
  return fails;
}

int bench_host_cuda_table(const bench_opts *o) {
  static const int def_ps[] = {1, 2};
  const int *ps = o->ps_given ? o->ps : def_ps;
  const int nps = o->ps_given ? o->nps : 2;
  char title[240];
  snprintf(title, sizeof title,
           "Section host (CUDA): per operation, host cost and device time against one cuBLASLt "
           "matmul of the same shape, in the same run (C=%llu H=%llu n=%llu bf16)",
           (unsigned long long)o->capacity, (unsigned long long)o->hidden,
           (unsigned long long)o->n);
  bench_table("host_cuda", title, HC_NCOLS, kCols);
  hc_job *j = calloc(1, sizeof *j);
  if (!j) {
    bench_note("FAILED: no memory");
    return 1;
  }
  pthread_mutex_init(&j->mu, NULL);
  j->iters = o->iters < BENCH_MAX_ITERS / 2 ? o->iters : BENCH_MAX_ITERS / 2;
  j->warmup = o->warmup;
  j->C = o->capacity;
  j->H = o->hidden;
  j->n = o->n;
  const uint64_t wide = o->hidden > o->n ? o->hidden : o->n;
  j->xmax = j->C * wide + ((uint64_t)TPF_MAX_RANKS << 16);
  j->wmax = o->hidden * o->n + ((uint64_t)TPF_MAX_RANKS << 16);
  int fails = 0;
  for (int pi = 0; pi < nps; pi++)
    fails += hc_group(o, ps[pi], j);
  bench_progress_done();
  bench_note("host = the tpf_* call, call to return, median over %d repetitions and the ranks; "
             "calls, cuda, peer_wait, backend: per operation from tpf_cuda_backend_enqueue_stats, "
             "mean over ranks",
             j->iters);
  bench_note("dev = CUDA events after a 1 GiB memset, earliest rank's start to latest rank's end, "
             "median; mm = one cublasLtMatmul [M,K]x[N,K]^T on rank 0's stream, alternating with "
             "the operation");
  bench_note("targets at P = 1 (printed, not judged): host/mm <= 1.3, dev/mm <= 1.03; at P > 1 "
             "the ranks share this GPU, so dev counts every rank's GEMM");
  bench_note("host>flush = repetitions whose slowest call outlasted the flush (dev may then "
             "include host time); outputs are not checked here (the tp and fp8 sections do)");
  pthread_mutex_destroy(&j->mu);
  free(j);
  return fails ? 1 : 0;
}

#else /* !TPF_HAVE_CUDA: a stub, so the simulator-only CLI links */

int bench_host_cuda_table(const bench_opts *o) {
  (void)o;
  printf("# host (CUDA): FAILED: this build has no CUDA backend\n");
  return 1;
}

#endif /* TPF_HAVE_CUDA */
