/* The sections of `tpflex bench` that go through the public tpflex API, on either backend:
 * 1 (set_active_shape cost), 2 (dynamic versus padded) and 4/5 (TP emulation with the serial
 * baseline), and the variants runner of the planner section. Calls the groups (bench_group.c),
 * the GPU baselines (bench_cuda_sections.c) and bench_util.c.
 *
 * Method: one per-rank function (op_rank) runs an operation over a sweep of active T on a
 * communicator registered once at capacity. Every repetition takes fresh operand views at a
 * rotating offset into a random source array (src[i] = pool[i % pool_elems]), so the host knows
 * every input element and checks sampled output rows against harness/reference.c without
 * copying inputs back. Timing brackets each repetition across all ranks (earliest start to latest
 * end); the figure reported is the median. After the timed repetitions the output is poisoned
 * (0xFF, a bf16 NaN), the operation runs once more and the check counts #wrong. Every rank runs
 * the same sequence of barriers whatever fails, so a failure ends the job instead of hanging it.
 * With variants (bench_run_variants, the planner section) each repetition runs every variant in
 * turn on the same communicator with its own per-operation split count, each timed on its own,
 * and the check runs for every variant.
 *
 * A job may time two ways in one run (the tp section): first `iters` repetitions with the
 * group's timing (CUDA events, or the simulator's clock), then `host_iters` with host-wall timing
 * (bench_host_begin/end: flush, agreement, CLOCK_MONOTONIC around enqueue + stream sync), which
 * also records each rank's host time of the tpf_* call (enqueue). In procs mode (the group's
 * ranks in several processes, bench_modes.c) only the host-wall timing runs; the barriers and
 * agreements span the processes, and at the end of the job every process's #wrong, checked
 * counts and first failure are exchanged (job_gather), so every process holds the whole result.
 */
#define _POSIX_C_SOURCE 200809L
#include "bench.h"

#include "reference.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h" /* tpf__alloc_live_count */

/* ---- operations --------------------------------------------------------------------------- */

typedef enum {
  BOP_RING_AG = 0,
  BOP_RING_AG_AGGR,
  BOP_RING_AG_SERIAL,
  BOP_RING_RS,
  BOP_PIPE_RS,
  BOP_PIPE_RS_SERIAL,
  BOP_BULK_AG, /* the fp8 section's (bench_run_dtype): BULK AG beside d = a w^T */
  BOP_COUNT
} bench_op;

static const struct {
  const char *name;
  tpf_algo algo;
  tpf_coll coll;
  int splits; /* 0: the default (P, P/2 aggregate, pipeline 4) */
  bool aggregate;
} kOps[BOP_COUNT] = {
    [BOP_RING_AG] = {"ring_ag+gemm", TPF_ALGO_RING, TPF_COLL_AG, 0, false},
    [BOP_RING_AG_AGGR] = {"ring_ag_aggr+gemm", TPF_ALGO_RING, TPF_COLL_AG, 0, true},
    [BOP_RING_AG_SERIAL] = {"serial_ag,gemm", TPF_ALGO_RING, TPF_COLL_AG, 1, false},
    [BOP_RING_RS] = {"gemm+ring_rs", TPF_ALGO_RING, TPF_COLL_RS, 0, false},
    [BOP_PIPE_RS] = {"gemm+pipeline_rs", TPF_ALGO_PIPELINE, TPF_COLL_RS, 0, false},
    [BOP_PIPE_RS_SERIAL] = {"serial_gemm,rs", TPF_ALGO_PIPELINE, TPF_COLL_RS, 1, false},
    [BOP_BULK_AG] = {"bulk_ag+gemm", TPF_ALGO_BULK, TPF_COLL_AG, 0, false},
};

/* One operation over a sweep of T at one capacity: inputs, results. */
typedef struct {
  bench_op op;
  /* The GEMM operands' dtype: TPF_BF16 (0, every section), or TPF_FP8_E4M3 (bench_run_dtype):
   * then x/a, w and the AG buffer are E4M3 with kFp8ScaleA/W, RS buffers and D stay bf16. */
  tpf_dtype dt;
  uint64_t C, H, N; /* AG: buffer [C, H], w [N, H]. RS: buffer cols H, x [C, N], w [H, N] */
  int nts;
  uint64_t ts[BENCH_MAX_TS];
  int iters, warmup;
  int host_iters;             /* host-wall repetitions after the `iters` timed ones (0: none) */
  uint64_t margin;            /* rotation span of operand offsets, elements */
  bench_variants *var;        /* NULL: one schedule, the communicator's (no options) */
  const tpf_cost_table *cost; /* without var: an ADAPTIVE communicator planning with it */
  bool pair; /* without var, host_iters > 0: the serial baseline alternated with the op */
  /* results */
  double us[BENCH_MAX_TS];
  double host_us[BENCH_MAX_TS], enq_us[BENCH_MAX_TS]; /* host wall, enqueue: medians */
  double pair_us[BENCH_MAX_TS], spd[BENCH_MAX_TS], spd_q1[BENCH_MAX_TS], spd_q3[BENCH_MAX_TS];
  atomic_llong wrong[BENCH_MAX_TS];
  atomic_llong checked[BENCH_MAX_TS];
  int chose[BENCH_MAX_TS]; /* with cost: rank 0's planner choice per T (0: none) */
  /* The enqueue breakdown (BENCH_ENQ_*) over the host-wall repetitions: per global rank (NaN:
   * not measured), then the mean over ranks and the largest host us (job_enq_reduce). */
  double enq_rank[BENCH_MAX_TS][TPF_MAX_RANKS][BENCH_ENQ_NF];
  double enq_mean[BENCH_MAX_TS][BENCH_ENQ_NF], enq_max[BENCH_MAX_TS];
  bool chose_aggr[BENCH_MAX_TS];
  bool chose_pull[BENCH_MAX_TS]; /* RING RS: the planner chose the pull baseline (PIPELINE) */
  atomic_int failed;
  tpf_status st;
  char err[300];
  pthread_mutex_t mu;
} bench_job;

static void job_fail(bench_job *j, tpf_status st, const char *what) {
  pthread_mutex_lock(&j->mu);
  if (j->st == TPF_OK) {
    j->st = st;
    snprintf(j->err, sizeof(j->err), "%s: %s (%s)", what, tpf_status_name(st), tpf_last_error());
  }
  pthread_mutex_unlock(&j->mu);
  atomic_store(&j->failed, 1);
}

/* Offset (elements) of an operand of rank r at repetition it; salt tells operands apart. */
static uint64_t operand_off(const bench_job *j, int r, int it, int salt) {
  uint64_t v = (uint64_t)it * 1009u + (uint64_t)r * 7919u + (uint64_t)salt * 104729u;
  return (v * 4096u) % (j->margin ? j->margin : 1) / 64u * 64u;
}

static bool is_ag(bench_op op) {
  return kOps[op].coll == TPF_COLL_AG;
}

/* FP8 jobs (SPEC §11): the per-tensor scales (a_scale_inv, w_scale_inv; the conformance sweep's
 * values) and their product, applied once to the fp32 product. */
static const float kFp8ScaleA = 0.75f, kFp8ScaleW = 2.0f;
static bool job_fp8(const bench_job *j) {
  return j->dt == TPF_FP8_E4M3;
}
/* The buffer's dtype: an FP8 job's AG buffer is E4M3, an RS buffer holds bf16 partials. */
static tpf_dtype buf_dtype(const bench_job *j) {
  return is_ag(j->op) ? j->dt : TPF_BF16;
}
/* Operand element `off` of the job's source (src, or src8 for FP8). */
static const void *src_at(const bench_group *g, const bench_job *j, uint64_t off) {
  return job_fp8(j) ? (const void *)((const uint8_t *)g->src8 + off)
                    : (const void *)((const uint16_t *)g->src + off);
}
/* dst[at] = the source's element i as stored (bf16 or E4M3 code). */
static void pool_get(const bench_group *g, bool fp8, uint64_t i, void *dst, uint64_t at) {
  if (fp8)
    ((uint8_t *)dst)[at] = g->pool8[i % g->pool_elems];
  else
    ((uint16_t *)dst)[at] = g->pool[i % g->pool_elems];
}

/* Elements of src the job's operands can reach. */
static uint64_t job_src_elems(const bench_job *j, int P) {
  uint64_t need;
  if (is_ag(j->op)) {
    /* BULK AG's GEMM reads a [T, H] of its own. */
    uint64_t chunk = j->op == BOP_BULK_AG ? j->C * j->H : j->C / (uint64_t)P * j->H,
             w = j->N * j->H;
    need = chunk > w ? chunk : w;
  } else {
    uint64_t x = j->C * j->N, w = j->H * j->N;
    need = x > w ? x : w;
  }
  return need + j->margin;
}

/* One unit in the last place of bf16 at |x| (8 significant bits). */
static float ulp_bf16(float x) {
  int e = 0;
  if (x == 0.0f || !isfinite(x)) return 0.0f;
  frexpf(x, &e); /* |x| in [2^(e-1), 2^e) */
  return ldexpf(1.0f, e - 8);
}

/* Sampled rows of the check: first, middle and last row of each of `parts` blocks of R rows. */
static int sample_rows(uint64_t parts, uint64_t R, uint64_t *rows, int cap) {
  int n = 0;
  for (uint64_t p = 0; p < parts; p++) {
    uint64_t c[3] = {0, R / 2, R - 1};
    for (int k = 0; k < 3; k++) {
      uint64_t v = p * R + c[k];
      bool dup = false;
      for (int i = 0; i < n; i++)
        dup |= rows[i] == v;
      if (!dup && n < cap) rows[n++] = v;
    }
  }
  return n;
}

/* The sampled check of one rank's output (check_output): the sampled rows and columns, the
 * reference values and slack, and the values read back. */
typedef struct {
  bench_rank *rk;
  const bench_job *j;
  uint64_t T, R, ncols_out, kdim, nc;
  int it, nr;
  bool ag;
  uint64_t rows[3 * 64 + 3], cols[64];
  uint16_t *row, *got;
  void *xs, *ws; /* the job's operand dtype */
  float *want, *part, *slack;
} chk;

/* The reference: want = sampled rows x sampled columns of the operation from the source values,
 * with the rounding and (CUDA) accumulation-order slack. TPF_OK or the failure. */
static tpf_status chk_reference(chk *k) {
  const bench_job *j = k->j;
  const bench_group *g = k->rk->g;
  const int P = k->rk->tp, r = k->rk->rank;
  const uint64_t kdim = k->kdim, nc = k->nc, R = k->R;
  const bool f8 = job_fp8(j);
  const float sc = f8 ? kFp8ScaleA * kFp8ScaleW : 1.0f;
  for (int src_rank = 0; src_rank < (k->ag ? 1 : P); src_rank++) {
    for (int i = 0; i < k->nr; i++) {
      uint64_t base;
      if (j->op == BOP_BULK_AG) { /* the GEMM's own a [T, H] of this rank */
        base = operand_off(j, r, k->it, 2) + k->rows[i] * j->H;
      } else if (k->ag) { /* gathered row t lives in chunk t / R, from that rank's chunk operand */
        uint64_t t = k->rows[i], q = t / R;
        base = operand_off(j, (int)q, k->it, 0) + (t - q * R) * j->H;
      } else { /* rank src_rank's x row (global row r*R + i) */
        base = operand_off(j, src_rank, k->it, 0) + ((uint64_t)r * R + k->rows[i]) * j->N;
      }
      for (uint64_t q = 0; q < kdim; q++)
        pool_get(g, f8, base + q, k->xs, (uint64_t)i * kdim + q);
    }
    int wr = k->ag ? r : src_rank;
    for (uint64_t c = 0; c < nc; c++) {
      uint64_t base = operand_off(j, wr, k->it, 1) + k->cols[c] * kdim;
      for (uint64_t q = 0; q < kdim; q++)
        pool_get(g, f8, base + q, k->ws, c * kdim + q);
    }
    tpf_matrix mx = {k->xs, (uint64_t)k->nr, kdim, kdim, j->dt};
    tpf_matrix mw = {k->ws, nc, kdim, kdim, j->dt};
    tpf_status st = tpf_ref_gemm_f32(&mx, &mw, k->part);
    if (st != TPF_OK) return st;
    /* RS partials pass through the bf16 buffer before the fp32 sum (as the conformance tests
     * model them); AG has a single product. FP8: the scales multiply the fp32 product once. */
    for (uint64_t e = 0; e < (uint64_t)k->nr * nc; e++) {
      const float v = k->part[e] * sc;
      k->want[e] += k->ag ? v : tpf_ref_round(TPF_BF16, v);
      if (!k->ag) k->slack[e] += ulp_bf16(v);
    }
    /* CUDA's cuBLASLt sums over k in its own order: SPEC §7's accumulation-order slack,
     * gamma_K sum_k |x_ik w_jk| of this product (the simulator sums in the reference's order). */
    if (g->cuda && (st = tpf_ref_order_slack_add(&mx, &mw, (double)sc, k->slack)) != TPF_OK)
      return st;
  }
  return TPF_OK;
}

/* The sampled elements of d against the reference: elements wrong (-1 on a failure), *checked
 * gets the elements compared. */
static long long chk_compare(chk *k, const tpf_matrix *d, long long *checked) {
  for (int i = 0; i < k->nr; i++) {
    const uint8_t *p = (const uint8_t *)d->ptr + k->rows[i] * d->ld * 2;
    if (bench_mem_download(k->rk, k->row, p, k->ncols_out * 2) != TPF_OK) return -1;
    for (uint64_t c = 0; c < k->nc; c++)
      k->got[(uint64_t)i * k->nc + c] = k->row[k->cols[c]];
  }
  tpf_matrix mg = {k->got, (uint64_t)k->nr, k->nc, k->nc, TPF_BF16};
  tpf_matrix mwant = {k->want, (uint64_t)k->nr, k->nc, k->nc, TPF_FP32};
  tpf_ref_result res;
  /* RS: each partial is rounded to the bf16 buffer before the sum. A backend whose fp32
   * accumulation order differs from the reference's may round a partial to the other bf16
   * neighbour, an error of one ulp of that partial, which the per-element test of SPEC §7 cannot
   * see past when the sum is much smaller than its partials. So an RS element is wrong only when
   * its error exceeds the SPEC §7 tolerance and that rounding slack (one ulp per partial and of
   * the sum), and the verdict is that no element is wrong (tpf_ref_compare_slack). Until
   * 2026-12-03 the verdict was SPEC §7's at the max-diff element even for RS, so an element
   * inside its slack but 2.5 % off a cancelling sum counted as one wrong element. On CUDA the
   * slack also holds every product's accumulation-order slack (AG included); an AG result on the
   * simulator is judged by SPEC §7 alone. */
  const tpf_status cst =
      (k->ag && !k->rk->g->cuda)
          ? tpf_ref_compare(&mg, &mwant, tpf_ref_tolerance(TPF_BF16), &res)
          : tpf_ref_compare_slack(&mg, &mwant, k->slack, tpf_ref_tolerance(TPF_BF16), &res);
  if (cst != TPF_OK) return -1;
  /* SPEC §7 per element: res.pass is res.wrong == 0 (NaN/inf mismatches are wrong elements). */
  *checked += (long long)res.compared;
  if (!res.pass) {
    char line[TPF_REF_FORMAT_LEN];
    tpf_ref_format(&res, line, sizeof(line));
    fprintf(stderr, "bench: %s rank %d T=%llu: %s\n", kOps[k->j->op].name, k->rk->rank,
            (unsigned long long)k->T, line);
  }
  return (long long)res.wrong;
}

/* AG: the buffer must hold the gathered input exactly (sampled rows, every column). Elements
 * wrong (-1 on a failure); *checked counts the elements compared. */
static long long chk_buffer(chk *k, const tpf_matrix *buf, long long *checked) {
  const bench_group *g = k->rk->g;
  const uint64_t H = k->j->H, R = k->R;
  const bool f8 = job_fp8(k->j);
  const size_t es = tpf_dtype_size(buf->dtype);
  long long wrong = 0;
  for (int i = 0; i < k->nr; i++) {
    uint64_t t = k->rows[i], q = t / R,
             base = operand_off(k->j, (int)q, k->it, 0) + (t - q * R) * H;
    if (bench_mem_download(k->rk, k->row, (const uint8_t *)buf->ptr + t * buf->ld * es, H * es) !=
        TPF_OK)
      return -1;
    for (uint64_t c = 0; c < H; c++)
      wrong += f8 ? ((const uint8_t *)k->row)[c] != g->pool8[(base + c) % g->pool_elems]
                  : k->row[c] != g->pool[(base + c) % g->pool_elems];
    *checked += (long long)H;
  }
  return wrong;
}

/* Checks this rank's output of the last (poisoned, then re-run) repetition `it`. Returns
 * elements wrong; *checked gets the elements compared. */
static long long check_output(bench_rank *rk, bench_job *j, uint64_t T, int it, const tpf_matrix *d,
                              const tpf_matrix *buf, long long *checked) {
  chk k = {.rk = rk, .j = j, .T = T, .it = it, .ag = is_ag(j->op)};
  const uint64_t H = j->H, N = j->N;
  k.R = T / (uint64_t)rk->tp;
  k.nr = k.ag ? sample_rows((uint64_t)rk->tp, k.R, k.rows, 3 * 64) : sample_rows(1, k.R, k.rows, 3);
  k.ncols_out = k.ag ? N : H;
  k.kdim = k.ag ? H : N;
  k.nc = k.ncols_out < 64 ? k.ncols_out : 64;
  for (uint64_t c = 0; c < k.nc; c++)
    k.cols[c] = c * k.ncols_out / k.nc;
  long long wrong = -1;
  *checked = 0;
  k.row = malloc(((k.ncols_out > H ? k.ncols_out : H) + 1) * 2);
  k.xs = malloc((size_t)k.nr * k.kdim * 2);
  k.ws = malloc(k.nc * k.kdim * 2);
  k.want = calloc((size_t)k.nr * k.nc, sizeof(float));
  k.part = malloc((size_t)k.nr * k.nc * sizeof(float));
  k.slack = calloc((size_t)k.nr * k.nc, sizeof(float));
  k.got = malloc((size_t)k.nr * k.nc * 2);
  if (k.row && k.xs && k.ws && k.want && k.part && k.got && k.slack &&
      chk_reference(&k) == TPF_OK) {
    wrong = chk_compare(&k, d, checked);
    if (wrong >= 0 && k.ag && buf) {
      long long bw = chk_buffer(&k, buf, checked);
      wrong = bw < 0 ? -1 : wrong + bw;
    }
  }
  free(k.row);
  free(k.xs);
  free(k.ws);
  free(k.want);
  free(k.part);
  free(k.got);
  free(k.slack);
  return wrong;
}

/* Procs mode, at the end of a job: every process's #wrong and checked counts summed, and the
 * first failure (lowest rank) spread, so that every process holds the job's whole result. All
 * rank threads call it; the first of each process exchanges. */
static void job_gather(bench_rank *rk, bench_job *j) {
  bench_group *g = rk->g;
  if (!g->xboot) return;
  pthread_barrier_wait(&g->bar);
  if (rk->rank == g->rank0) {
    typedef struct {
      long long wrong[BENCH_MAX_TS], checked[BENCH_MAX_TS];
      int failed, rank, st;
      char err[300];
    } part;
    const int np = g->xboot->tp_size;
    part mine, *all = calloc((size_t)np, sizeof(part));
    memset(&mine, 0, sizeof mine);
    for (int i = 0; i < j->nts; i++) {
      mine.wrong[i] = atomic_load(&j->wrong[i]);
      mine.checked[i] = atomic_load(&j->checked[i]);
    }
    mine.failed = atomic_load(&j->failed);
    mine.rank = rk->rank;
    mine.st = (int)j->st;
    snprintf(mine.err, sizeof mine.err, "%s", j->err);
    tpf_status st = all ? bench_xallgather(g, &mine, all, sizeof mine)
                        : tpf_set_error(TPF_ENOMEM, "bench: no memory for the results");
    if (st == TPF_OK) {
      for (int i = 0; i < j->nts; i++) {
        long long w = 0, c = 0;
        for (int q = 0; q < np; q++) {
          w += all[q].wrong[i];
          c += all[q].checked[i];
        }
        atomic_store(&j->wrong[i], w);
        atomic_store(&j->checked[i], c);
      }
      for (int q = 0; q < np; q++)
        if (all[q].failed && all[q].err[0]) {
          pthread_mutex_lock(&j->mu);
          if (q != g->xboot->rank || j->st == TPF_OK) {
            j->st = all[q].st != TPF_OK ? (tpf_status)all[q].st : TPF_EBACKEND;
            snprintf(j->err, sizeof j->err, "rank %d: %.280s", all[q].rank, all[q].err);
          }
          pthread_mutex_unlock(&j->mu);
          atomic_store(&j->failed, 1);
          break;
        }
    } else {
      job_fail(j, st, "gathering the results of the processes");
    }
    free(all);
  }
  pthread_barrier_wait(&g->bar);
}

/* The CUDA backend's cumulative enqueue statistics of this rank (its own thread), or false where
 * there are none (the simulator). */
static bool enq_snap(bench_rank *rk, tpf_cuda_enqueue_stats *s) {
  return rk->g->cuda && bench_cuda_enq_stats(rk, s) == TPF_OK;
}

/* *acc += b - a: what happened between snapshots a and b (the paired baseline's calls, which
 * the operation's breakdown leaves out). */
static void enq_add(tpf_cuda_enqueue_stats *acc, const tpf_cuda_enqueue_stats *a,
                    const tpf_cuda_enqueue_stats *b) {
  acc->ops += b->ops - a->ops;
  acc->host_ns += b->host_ns - a->host_ns;
  for (int k = 0; k < TPF_CUDA_ENQ_COUNT; k++) {
    acc->calls[k] += b->calls[k] - a->calls[k];
    acc->ns[k] += b->ns[k] - a->ns[k];
  }
}

/* This rank's breakdown at T index ti: the statistics now minus s0 minus ex (the paired
 * baseline's share, zero without it), per operation. */
static void enq_record(bench_rank *rk, bench_job *j, int ti, const tpf_cuda_enqueue_stats *s0,
                       const tpf_cuda_enqueue_stats *ex) {
  tpf_cuda_enqueue_stats s1;
  if (!enq_snap(rk, &s1) || s1.ops <= s0->ops + ex->ops) return;
  double *e = j->enq_rank[ti][rk->rank];
  const double ops = (double)(s1.ops - s0->ops - ex->ops);
  e[BENCH_ENQ_HOST] = (double)(s1.host_ns - s0->host_ns - ex->host_ns) / ops * 1e-3;
  uint64_t calls = 0;
  for (int k = 0; k < TPF_CUDA_ENQ_COUNT; k++) {
    if (k != TPF_CUDA_ENQ_PEER_WAIT) calls += s1.calls[k] - s0->calls[k] - ex->calls[k];
    e[BENCH_ENQ_KIND + k] = (double)(s1.ns[k] - s0->ns[k] - ex->ns[k]) / ops * 1e-3;
  }
  e[BENCH_ENQ_CALLS] = (double)calls / ops;
}

/* The breakdown over ranks: the first rank thread of each process sums its rank threads'
 * figures (and takes the largest host us), the processes exchange the sums through the bootstrap
 * (procs mode), and every process ends with the mean over the ranks that measured and the
 * maximum in j->enq_mean / enq_max (NaN where none did). All rank threads call it, in every
 * process, so the exchanges pair up. */
static void job_enq_reduce(bench_rank *rk, bench_job *j) {
  bench_group *g = rk->g;
  pthread_barrier_wait(&g->bar);
  if (rk->rank == g->rank0) {
    typedef struct {
      double sum[BENCH_MAX_TS][BENCH_ENQ_NF], max[BENCH_MAX_TS];
      int n[BENCH_MAX_TS];
    } part;
    const int np = g->xboot ? g->xboot->tp_size : 1;
    part mine, *all = calloc((size_t)np, sizeof(part));
    memset(&mine, 0, sizeof mine);
    for (int ti = 0; ti < j->nts; ti++) {
      mine.max[ti] = -1;
      for (int l = 0; l < g->nlocal; l++) {
        const double *e = j->enq_rank[ti][g->rank0 + l];
        if (isnan(e[BENCH_ENQ_HOST])) continue;
        mine.n[ti]++;
        for (int f = 0; f < BENCH_ENQ_NF; f++)
          mine.sum[ti][f] += e[f];
        if (e[BENCH_ENQ_HOST] > mine.max[ti]) mine.max[ti] = e[BENCH_ENQ_HOST];
      }
    }
    const bool ok = all && bench_xallgather(g, &mine, all, sizeof mine) == TPF_OK;
    for (int ti = 0; ti < j->nts; ti++) {
      int n = 0;
      double sum[BENCH_ENQ_NF] = {0}, max = -1;
      for (int q = 0; ok && q < np; q++) {
        n += all[q].n[ti];
        for (int f = 0; f < BENCH_ENQ_NF; f++)
          sum[f] += all[q].sum[ti][f];
        if (all[q].max[ti] > max) max = all[q].max[ti];
      }
      for (int f = 0; f < BENCH_ENQ_NF; f++)
        j->enq_mean[ti][f] = n > 0 ? sum[f] / n : NAN;
      j->enq_max[ti] = n > 0 ? max : NAN;
    }
    free(all);
  }
  pthread_barrier_wait(&g->bar);
}

/* One repetition of the paired serial baseline (communicator pc, FIXED) on the operation's
 * operands w, x and output d, timed in host-wall slot pslot like the operation; every rank
 * calls it (the timing's agreements pair up), pc NULL or an earlier failure only skip the call.
 * The CUDA enqueue statistics it causes go into *excl (after the first snapshot), which the
 * operation's breakdown leaves out. Returns true when this rank must skip from here on. */
static bool pair_rep(bench_rank *rk, bench_job *j, tpf_comm *pc, const tpf_matrix *plocal, int it,
                     int pslot, const tpf_matrix *w, const tpf_matrix *x, tpf_matrix *d,
                     const tpf_op_options *opt, bool have_enq0, tpf_cuda_enqueue_stats *excl) {
  bench_group *g = rk->g;
  const bool ag = is_ag(j->op);
  const uint64_t R = d->rows / (ag ? (uint64_t)rk->tp : 1u);
  bool skip = atomic_load(&j->failed) != 0 || pc == NULL;
  tpf_status st;
  if (!skip && ag &&
      (st = bench_mem_copy(rk, plocal->ptr, src_at(g, j, operand_off(j, rk->rank, it, 0)),
                           R * j->H * tpf_dtype_size(j->dt))) != TPF_OK) {
    job_fail(j, st, "input copy (the paired serial baseline)");
    skip = true;
  }
  tpf_cuda_enqueue_stats x0, x1;
  const bool snap = have_enq0 && enq_snap(rk, &x0);
  skip = bench_host_begin(rk, pslot, &j->failed) || skip;
  if (!skip) {
    const double e0 = bench_now_ns();
    st = ag ? tpf_ag_gemm_ex(pc, w, d, opt, rk->stream)
            : tpf_gemm_rs_ex(pc, x, w, d, opt, rk->stream);
    g->enq[rk->rank * BENCH_MAX_ITERS + pslot] = bench_now_ns() - e0;
    if (st != TPF_OK) {
      job_fail(j, st, "the paired serial baseline");
      skip = true;
    }
  }
  bench_host_end(rk, pslot);
  if (snap && enq_snap(rk, &x1)) enq_add(excl, &x0, &x1);
  return skip;
}

/* One rank's state in op_rank: the operation's communicator and the paired baseline's, the
 * output, the current T's views and the timing arrays. */
typedef struct {
  bench_rank *rk;
  bench_job *j;
  bench_variants *var;
  int nv;    /* variants (1 without) */
  bool ag;   /* an all-gather operation (else a reduce-scatter) */
  bool pair; /* the paired serial baseline runs (the same on every rank) */
  bool skip; /* this rank skips the rest of the current T */
  tpf_comm *c, *pc;
  void *dmem;
  uint64_t dcols;
  tpf_matrix d, buf, local, plocal;  /* the current T's output and the communicators' views */
  tpf_cuda_enqueue_stats enq0, excl; /* before the first host-wall repetition; the baseline's */
  bool have_enq0;
  float *scales;       /* FP8 jobs: {a_scale_inv, w_scale_inv} in backend memory, else NULL */
  tpf_op_options fopt; /* FP8 jobs: the options carrying them */
  double *us, *one, *hus, *pus, *ratio;
} op_ctx;

/* The operation's communicator (adaptive with a cost table), its output and, with pair, the
 * paired serial baseline's FIXED communicator; failures are the job's. */
static void op_setup(op_ctx *x) {
  bench_job *j = x->j;
  bench_rank *rk = x->rk;
  char name[64];
  snprintf(name, sizeof(name), "bench_%s%s", kOps[j->op].name, j->cost ? "_adaptive" : "");
  tpf_comm_config cfg = {.name = name,
                         .algo = kOps[j->op].algo,
                         .coll = kOps[j->op].coll,
                         .dtype = buf_dtype(j),
                         .capacity = {j->C, j->H},
                         .num_splits = kOps[j->op].splits,
                         .aggregate = kOps[j->op].aggregate};
  if ((x->var && x->var->cost) || j->cost) {
    cfg.plan = TPF_PLAN_ADAPTIVE;
    cfg.cost = x->var ? x->var->cost : j->cost;
  }
  tpf_status st = tpf_comm_create(rk->be, &cfg, &x->c);
  if (st != TPF_OK) job_fail(j, st, "tpf_comm_create");
  /* Output: AG d [C, N]; RS out [C/P, H]. */
  uint64_t drows = x->ag ? j->C : j->C / (uint64_t)rk->tp;
  x->dcols = x->ag ? j->N : j->H;
  if (st == TPF_OK) {
    x->dmem = bench_mem_alloc(rk->g, drows * x->dcols * 2);
    if (!x->dmem) job_fail(j, TPF_ENOMEM, "output allocation");
  }
  if (st == TPF_OK && job_fp8(j)) { /* the scales, in backend memory (SPEC §11) */
    const float host[2] = {kFp8ScaleA, kFp8ScaleW};
    x->scales = bench_mem_alloc(rk->g, sizeof host);
    if (!x->scales) {
      job_fail(j, TPF_ENOMEM, "FP8 scale allocation");
    } else if (rk->g->cuda) {
      if ((st = bench_cuda_tile(x->scales, host, sizeof host, sizeof host)) != TPF_OK)
        job_fail(j, st, "FP8 scale upload");
    } else {
      memcpy(x->scales, host, sizeof host);
    }
    x->fopt = (tpf_op_options)TPF_OP_OPTIONS_INIT;
    x->fopt.a_scale_inv = x->scales;
    x->fopt.w_scale_inv = x->scales ? x->scales + 1 : NULL;
  }
  /* The paired serial baseline: its own FIXED communicator, run after the operation in every
   * host-wall repetition on the same operands and output, timed alike. pair is the same on
   * every rank (the options), so the repetitions' agreements pair up even where pc failed. */
  x->pair = j->pair && !x->var && j->host_iters > 0 && 2 * j->host_iters <= BENCH_MAX_ITERS;
  if (x->pair && st == TPF_OK) {
    const bench_op sop = x->ag ? BOP_RING_AG_SERIAL : BOP_PIPE_RS_SERIAL;
    tpf_comm_config pcfg = {.name = "bench_paired_serial",
                            .algo = kOps[sop].algo,
                            .coll = kOps[sop].coll,
                            .dtype = buf_dtype(j),
                            .capacity = {j->C, j->H},
                            .num_splits = kOps[sop].splits};
    st = tpf_comm_create(rk->be, &pcfg, &x->pc);
    if (st != TPF_OK) job_fail(j, st, "tpf_comm_create (the paired serial baseline)");
  }
  x->us = calloc((size_t)j->iters * (size_t)x->nv + 1, sizeof(double));
  x->one = calloc((size_t)j->iters + 1, sizeof(double));
  x->hus = calloc((size_t)j->host_iters + 1, sizeof(double));
  x->pus = calloc((size_t)j->host_iters + 1, sizeof(double));
  x->ratio = calloc((size_t)j->host_iters + 1, sizeof(double));
  if (!x->us || !x->one || !x->hus || !x->pus || !x->ratio)
    job_fail(j, TPF_ENOMEM, "timing arrays");
}

/* Both communicators at active T and the views of this T (x->skip after a failure). */
static void op_shape(op_ctx *x, uint64_t T) {
  bench_job *j = x->j;
  tpf_status st;
  x->skip = bench_agree_failed(x->rk, &j->failed);
  if (!x->skip && (st = tpf_comm_set_active_shape(x->c, (tpf_shape){T, j->H})) != TPF_OK) {
    job_fail(j, st, "tpf_comm_set_active_shape");
    x->skip = true;
  }
  x->buf = x->local = x->plocal = (tpf_matrix){0};
  if (!x->skip && ((st = tpf_comm_buffer(x->c, &x->buf)) != TPF_OK ||
                   (x->ag && (st = tpf_comm_local_chunk(x->c, &x->local)) != TPF_OK))) {
    job_fail(j, st, "tpf_comm_buffer");
    x->skip = true;
  }
  if (!x->skip && x->pc &&
      ((st = tpf_comm_set_active_shape(x->pc, (tpf_shape){T, j->H})) != TPF_OK ||
       (x->ag && (st = tpf_comm_local_chunk(x->pc, &x->plocal)) != TPF_OK))) {
    job_fail(j, st, "the paired serial baseline's shape");
    x->skip = true;
  }
  const uint64_t R = T / (uint64_t)x->rk->tp;
  x->d = (tpf_matrix){x->dmem, x->ag ? T : R, x->dcols, x->dcols, TPF_BF16};
  x->have_enq0 = false;
  memset(&x->excl, 0, sizeof x->excl);
}

/* The checked repetition's start: everything before is done everywhere; poisons what the
 * operation must write. */
static void op_check_begin(op_ctx *x, bool run) {
  bench_rank *rk = x->rk;
  if (!x->skip) bench_sync(rk);
  x->skip = bench_agree_failed(rk, &x->j->failed) || x->skip;
  if (!x->skip && run) {
    bench_mem_poison(rk, x->d.ptr, x->d.rows * x->d.ld * 2);
    if (x->ag)
      bench_mem_poison(rk, x->buf.ptr, x->buf.rows * x->buf.ld * tpf_dtype_size(x->buf.dtype));
    bench_sync(rk);
  }
  bench_barrier(rk);
}

/* Operands w and a (RS only) at repetition it's offsets; the AG input copied into the local
 * chunk. */
static void op_operands(op_ctx *x, uint64_t T, int it, tpf_matrix *a, tpf_matrix *w) {
  bench_job *j = x->j;
  const int r = x->rk->rank;
  const bench_group *g = x->rk->g;
  const tpf_dtype dt = j->dt;
  tpf_status st = TPF_OK;
  if (x->ag) {
    *w = (tpf_matrix){(void *)src_at(g, j, operand_off(j, r, it, 1)), j->N, j->H, j->H, dt};
    if (j->op == BOP_BULK_AG) /* BULK: the GEMM's own a [T, H] beside the all-gather */
      *a = (tpf_matrix){(void *)src_at(g, j, operand_off(j, r, it, 2)), T, j->H, j->H, dt};
    st = bench_mem_copy(x->rk, x->local.ptr, src_at(g, j, operand_off(j, r, it, 0)),
                        T / (uint64_t)x->rk->tp * j->H * tpf_dtype_size(dt));
  } else {
    *a = (tpf_matrix){(void *)src_at(g, j, operand_off(j, r, it, 0)), T, j->N, j->N, dt};
    *w = (tpf_matrix){(void *)src_at(g, j, operand_off(j, r, it, 1)), j->H, j->N, j->N, dt};
  }
  if (st != TPF_OK) {
    job_fail(j, st, "input copy");
    x->skip = true;
  }
}

/* The adaptive communicator's decision just made at T index ti (rank 0, the checked
 * repetition): read before any other operation. */
static void op_plan_info(op_ctx *x, int ti, int v) {
  bench_job *j = x->j;
  if (x->var && x->var->cost && x->var->splits[v] == 0) {
    if (tpf_comm_plan_info(x->c, &x->var->plan[ti]) != TPF_OK) x->var->plan[ti].ncand = 0;
  } else if (!x->var && j->cost) {
    tpf_plan_result pr; /* the decision for this T (the same on every rank) */
    if (tpf_comm_plan_info(x->c, &pr) == TPF_OK && pr.ncand > 0) {
      j->chose[ti] = pr.cand[pr.chosen].num_splits;
      j->chose_aggr[ti] = pr.cand[pr.chosen].aggregate;
      j->chose_pull[ti] = pr.cand[pr.chosen].algo != kOps[j->op].algo;
    }
  }
}

/* The operation itself (variant v); its host enqueue time into host-wall slot hslot (< 0: none). */
static void op_call(op_ctx *x, int v, const tpf_matrix *a, const tpf_matrix *w, int hslot) {
  bench_rank *rk = x->rk;
  tpf_status st;
  /* NULL options: the defaults (bf16 jobs without variants). */
  tpf_op_options opt = x->scales ? x->fopt : (tpf_op_options)TPF_OP_OPTIONS_INIT;
  if (x->var) opt.num_splits = x->var->splits[v];
  const tpf_op_options *optp = x->var || x->scales ? &opt : NULL;
  const double e0 = bench_now_ns();
  if (x->j->op == BOP_BULK_AG)
    st = tpf_bulk_overlap_ex(x->c, a, w, &x->d, optp, rk->stream);
  else if (x->ag)
    st = tpf_ag_gemm_ex(x->c, w, &x->d, optp, rk->stream);
  else
    st = tpf_gemm_rs_ex(x->c, a, w, &x->d, optp, rk->stream);
  if (hslot >= 0) rk->g->enq[rk->rank * BENCH_MAX_ITERS + hslot] = bench_now_ns() - e0;
  if (st != TPF_OK) {
    job_fail(x->j, st, kOps[x->j->op].name);
    x->skip = true;
  }
}

/* The checked repetition's end: the output against the reference, counted into the job. */
static void op_check_end(op_ctx *x, uint64_t T, int it, int ti) {
  bench_job *j = x->j;
  tpf_status st = bench_sync(x->rk);
  if (st != TPF_OK) {
    job_fail(j, st, "synchronize");
    x->skip = true;
    return;
  }
  long long checked = 0;
  long long wr = check_output(x->rk, j, T, it, &x->d, x->ag ? &x->buf : NULL, &checked);
  if (wr < 0) {
    job_fail(j, TPF_ENOMEM, "check");
  } else {
    atomic_fetch_add(&j->wrong[ti], wr);
    atomic_fetch_add(&j->checked[ti], checked);
  }
}

/* Repetition it of variant v at T index ti: warm-up, device-timed, host-timed (with the paired
 * baseline before or after) or the last, checked one. */
static void op_rep(op_ctx *x, int ti, int it, int v) {
  bench_job *j = x->j;
  bench_rank *rk = x->rk;
  const uint64_t T = j->ts[ti];
  const int total = j->warmup + j->iters + j->host_iters + 1;
  const bool timed = it >= j->warmup && it < j->warmup + j->iters;
  const bool htimed = it >= j->warmup + j->iters && it < total - 1;
  const bool check = it == total - 1;
  const int slot = (it - j->warmup) * x->nv + v;
  const int hslot = it - j->warmup - j->iters;      /* host_iters > 0 only without variants */
  const bool run = !x->var || x->var->legal[v][ti]; /* the same on every rank */
  const int pslot = j->host_iters + hslot;
  if (check) op_check_begin(x, run);
  tpf_matrix a = {0}, w = {0};
  if (!x->skip && run) op_operands(x, T, it, &a, &w);
  if (timed) bench_time_begin(rk, slot);
  if (htimed && hslot == 0) x->have_enq0 = enq_snap(rk, &x->enq0);
  if (htimed && x->pair && hslot % 2 == 1) /* odd repetitions: the baseline first */
    x->skip = pair_rep(rk, j, x->pc, &x->plocal, it, pslot, &w, &a, &x->d,
                       x->scales ? &x->fopt : NULL, x->have_enq0, &x->excl) ||
              x->skip;
  if (htimed) x->skip = bench_host_begin(rk, hslot, &j->failed) || x->skip;
  if (!x->skip && run) {
    op_call(x, v, &a, &w, htimed ? hslot : -1);
    if (!x->skip && check && rk->rank == 0) op_plan_info(x, ti, v);
  }
  if (timed)
    bench_time_end(rk, slot);
  else if (htimed)
    bench_host_end(rk, hslot);
  else
    bench_barrier(rk); /* lockstep enqueue: no rank runs an operation ahead of the others */
  if (htimed && hslot == j->host_iters - 1 && x->have_enq0)
    enq_record(rk, j, ti, &x->enq0, &x->excl);
  if (htimed && x->pair && hslot % 2 == 0) /* even repetitions: the operation first */
    x->skip = pair_rep(rk, j, x->pc, &x->plocal, it, pslot, &w, &a, &x->d,
                       x->scales ? &x->fopt : NULL, x->have_enq0, &x->excl) ||
              x->skip;
  if (check && !x->skip && run) op_check_end(x, T, it, ti);
}

/* T index ti's figures: the host-wall medians and paired speedups (the group's first rank), the
 * device-timed medians per variant (rank 0). */
static void op_collect(op_ctx *x, int ti) {
  bench_job *j = x->j;
  bench_rank *rk = x->rk;
  if (j->iters > 0) bench_time_collect(rk, j->iters * x->nv, x->us);
  double enq = NAN;
  if (j->host_iters > 0 && bench_host_collect(rk, j->host_iters, x->hus, &enq) != TPF_OK)
    job_fail(j, TPF_ETIMEOUT, "host timing exchange");
  double penq = NAN;
  if (x->pair && bench_host_collect_at(rk, j->host_iters, j->host_iters, x->pus, &penq) != TPF_OK)
    job_fail(j, TPF_ETIMEOUT, "host timing exchange (the paired serial baseline)");
  if (rk->rank == rk->g->rank0 && j->host_iters > 0) {
    const bool bad = atomic_load(&j->failed) || !x->hus || !x->pus || !x->ratio;
    const int n = j->host_iters;
    if (x->pair && !bad) { /* before the medians sort hus and pus */
      for (int i = 0; i < n; i++)
        x->ratio[i] = x->pus[i] / x->hus[i];
      j->spd[ti] = bench_median(x->ratio, n); /* sorts ratio */
      j->spd_q1[ti] = bench_quantile(x->ratio, n, 0.25);
      j->spd_q3[ti] = bench_quantile(x->ratio, n, 0.75);
      j->pair_us[ti] = bench_median(x->pus, n);
    }
    j->host_us[ti] = bad ? NAN : bench_median(x->hus, n);
    j->enq_us[ti] = bad ? NAN : enq;
  }
  if (rk->rank == 0 && j->iters > 0)
    for (int v = 0; v < x->nv; v++) {
      for (int i = 0; i < j->iters; i++)
        x->one[i] = x->us[i * x->nv + v];
      const bool run = !x->var || x->var->legal[v][ti];
      double med =
          atomic_load(&j->failed) || !run || !x->one ? NAN : bench_median(x->one, j->iters);
      if (x->var)
        x->var->us[v][ti] = med;
      else
        j->us[ti] = med;
    }
}

static tpf_status op_rank(bench_rank *rk, void *arg) {
  op_ctx x = {.rk = rk, .j = arg};
  bench_job *j = x.j;
  x.var = j->var;
  x.nv = x.var ? x.var->nvar : 1;
  x.ag = is_ag(j->op);
  op_setup(&x);
  const int total = j->warmup + j->iters + j->host_iters + 1;
  for (int ti = 0; ti < j->nts; ti++) {
    op_shape(&x, j->ts[ti]);
    for (int it = 0; it < total; it++)
      for (int v = 0; v < x.nv; v++)
        op_rep(&x, ti, it, v);
    op_collect(&x, ti);
  }
  free(x.us);
  free(x.one);
  free(x.hus);
  free(x.pus);
  free(x.ratio);
  job_enq_reduce(rk, j);
  job_gather(rk, j);
  bench_barrier(rk);
  if (x.c) tpf_comm_destroy(x.c);
  if (x.pc) tpf_comm_destroy(x.pc);
  if (x.dmem) bench_mem_free(rk->g, x.dmem);
  if (x.scales) bench_mem_free(rk->g, x.scales);
  return TPF_OK;
}

/* Runs job j on group g (src must cover it). */
static tpf_status run_job(bench_group *g, bench_job *j) {
  pthread_mutex_init(&j->mu, NULL);
  atomic_store(&j->failed, 0);
  j->st = TPF_OK;
  j->err[0] = 0;
  for (int i = 0; i < j->nts; i++) {
    j->us[i] = NAN;
    j->pair_us[i] = j->spd[i] = j->spd_q1[i] = j->spd_q3[i] = NAN;
    atomic_store(&j->wrong[i], 0);
    atomic_store(&j->checked[i], 0);
    for (int r = 0; r < TPF_MAX_RANKS; r++)
      for (int f = 0; f < BENCH_ENQ_NF; f++)
        j->enq_rank[i][r][f] = NAN;
    for (int f = 0; f < BENCH_ENQ_NF; f++)
      j->enq_mean[i][f] = NAN;
    j->enq_max[i] = NAN;
  }
  tpf_status st = bench_src_reserve(g, job_src_elems(j, g->tp));
  if (st == TPF_OK && job_fp8(j)) st = bench_src8_reserve(g, job_src_elems(j, g->tp));
  if (st == TPF_OK) st = bench_group_run(g, op_rank, j);
  if (st != TPF_OK && j->st == TPF_OK) job_fail(j, st, "run");
  if (atomic_load(&j->failed) && j->st == TPF_OK) { /* only an agreement saw it */
    j->st = atomic_load(&g->xfail) ? TPF_ETIMEOUT : TPF_EBACKEND;
    snprintf(j->err, sizeof j->err, "%s",
             g->xerr[0] ? g->xerr : "a rank in another process failed (its message is above)");
  }
  pthread_mutex_destroy(&j->mu);
  return j->st;
}

static void job_init(bench_job *j, const bench_opts *o, bench_op op, int P, int nts,
                     const uint64_t *ts) {
  memset(j, 0, sizeof(*j));
  j->op = op;
  j->C = o->capacity;
  j->H = o->hidden;
  j->N = o->n;
  j->iters = o->iters;
  j->warmup = o->warmup;
  j->margin = o->cuda ? (8ull << 20) : (64ull << 10);
  for (int i = 0; i < nts; i++)
    if (ts[i] % (uint64_t)P == 0 && ts[i] <= o->capacity) j->ts[j->nts++] = ts[i];
}

tpf_status bench_run_variants(bench_group *g, bench_variants *v) {
  bench_job *j = calloc(1, sizeof(*j));
  if (!j) return tpf_set_error(TPF_ENOMEM, "bench: no memory");
  j->op = v->algo == TPF_ALGO_PIPELINE ? BOP_PIPE_RS
          : v->coll == TPF_COLL_RS     ? BOP_RING_RS
                                       : BOP_RING_AG;
  j->C = v->C;
  j->H = v->H;
  j->N = v->N;
  j->iters = v->iters;
  j->warmup = v->warmup;
  j->margin = g->cuda ? (8ull << 20) : (64ull << 10);
  j->nts = v->nts;
  memcpy(j->ts, v->ts, sizeof j->ts);
  j->var = v;
  for (int i = 0; i < v->nts; i++) {
    for (int k = 0; k < v->nvar; k++)
      v->us[k][i] = NAN;
    memset(&v->plan[i], 0, sizeof v->plan[i]);
  }
  tpf_status st = run_job(g, j);
  for (int i = 0; i < v->nts; i++)
    v->wrong[i] = atomic_load(&j->wrong[i]);
  snprintf(v->err, sizeof v->err, "%s", j->err);
  free(j);
  return st;
}

static const bench_op kDop[BENCH_DOP_COUNT] = {
    [BENCH_DOP_RING_AG] = BOP_RING_AG,          [BENCH_DOP_BULK_AG] = BOP_BULK_AG,
    [BENCH_DOP_SERIAL_AG] = BOP_RING_AG_SERIAL, [BENCH_DOP_RING_RS] = BOP_RING_RS,
    [BENCH_DOP_PIPE_RS] = BOP_PIPE_RS,          [BENCH_DOP_SERIAL_RS] = BOP_PIPE_RS_SERIAL};

const char *bench_dop_name(bench_dop op) {
  return op >= 0 && op < BENCH_DOP_COUNT ? kOps[kDop[op]].name : "?";
}

tpf_status bench_run_dtype(bench_group *g, const bench_opts *o, bench_dtype_run *r) {
  if (r->op < 0 || r->op >= BENCH_DOP_COUNT || (r->dtype != TPF_BF16 && r->dtype != TPF_FP8_E4M3))
    return tpf_set_error(TPF_EINVAL, "bench: operation %d in %s: not one of the fp8 section's",
                         (int)r->op, tpf_dtype_name(r->dtype));
  bench_job *j = calloc(1, sizeof *j);
  if (!j) return tpf_set_error(TPF_ENOMEM, "bench: no memory");
  job_init(j, o, kDop[r->op], g->tp, r->nts, r->ts);
  j->dt = r->dtype;
  tpf_status st = run_job(g, j);
  r->nts = j->nts;
  memcpy(r->ts, j->ts, sizeof r->ts);
  for (int i = 0; i < BENCH_MAX_TS; i++) {
    r->us[i] = i < j->nts ? j->us[i] : NAN;
    r->wrong[i] = i < j->nts ? atomic_load(&j->wrong[i]) : 0;
    r->checked[i] = i < j->nts ? atomic_load(&j->checked[i]) : 0;
  }
  snprintf(r->err, sizeof r->err, "%s", st != TPF_OK ? j->err : "");
  free(j);
  return st;
}

/* Time of one GEMM d[T, n] = x[T, k] * w[n, k]^T: cuBLASLt on CUDA; on the simulator, its own
 * GEMM through a P = 1 RING AG with one split (one GEMM, no exchange). */
static tpf_status layer_gemm(const bench_opts *o, bench_group *g1, uint64_t T, uint64_t n,
                             uint64_t k, double *us) {
  if (o->cuda) return bench_cuda_gemm_us(g1, T, n, k, us);
  bench_job j;
  bench_opts o1 = *o;
  o1.hidden = k;
  o1.n = n;
  o1.capacity = T;
  job_init(&j, &o1, BOP_RING_AG_SERIAL, 1, 1, &T);
  tpf_status st = run_job(g1, &j);
  if (st == TPF_OK) *us = j.us[0];
  return st;
}

/* ---- section 1: set_active_shape cost ------------------------------------------------------ */

typedef struct {
  const bench_opts *o;
  int phase; /* 0 create, 1 time set_active_shape, 2 time destroy + create, 3 destroy */
  tpf_comm *comm[64];
  tpf_manager *mgr[64];
  long calls;
  double comm_med_ns, comm_p99_ns, mgr_med_ns, mgr_p99_ns;
  long long comm_allocs, mgr_allocs, live_delta;
  long long dev_delta;
  int realloc_n;
  double realloc_med_ns, realloc_p99_ns;
  long long realloc_allocs;
  atomic_int failed;
  tpf_status st;
  char err[300];
} bench_ss;

static uint64_t ss_rows(const bench_opts *o, long i) {
  static const uint64_t div[4] = {8, 4, 2, 1};
  return o->capacity / div[i & 3];
}

static void ss_fail(bench_ss *s, tpf_status st, const char *what) {
  if (!atomic_exchange(&s->failed, 1)) {
    s->st = st;
    snprintf(s->err, sizeof(s->err), "%s: %s (%s)", what, tpf_status_name(st), tpf_last_error());
  }
}

/* Times `calls` calls in batches of 100; per-call median and p99 over the batches. */
static void ss_loop(bench_ss *s, tpf_comm *c, tpf_manager *m, double *med, double *p99,
                    long long *allocs) {
  const int B = 100;
  int nb = (int)(s->calls / B);
  double *v = malloc((size_t)nb * sizeof(double));
  long long a0 = bench_alloc_calls();
  long k = 0;
  for (int b = 0; b < nb && v; b++) {
    double t0 = bench_now_ns();
    for (int i = 0; i < B; i++, k++) {
      tpf_shape sh = {ss_rows(s->o, k), s->o->hidden};
      tpf_status st = c ? tpf_comm_set_active_shape(c, sh) : tpf_manager_set_active_shape(m, sh);
      if (st != TPF_OK) {
        ss_fail(s, st, "set_active_shape");
        free(v);
        return;
      }
    }
    v[b] = (bench_now_ns() - t0) / B;
  }
  *allocs = bench_alloc_calls() - a0;
  if (v) {
    *med = bench_median(v, nb);
    *p99 = bench_quantile(v, nb, 0.99);
  }
  free(v);
}

static tpf_status ss_rank(bench_rank *rk, void *arg) {
  bench_ss *s = arg;
  const bench_opts *o = s->o;
  const int r = rk->rank;
  tpf_status st = TPF_OK;
  if (s->phase == 0) {
    tpf_comm_config cfg = {.name = "fc1_fprop",
                           .algo = TPF_ALGO_RING,
                           .coll = TPF_COLL_AG,
                           .dtype = TPF_BF16,
                           .capacity = {o->capacity, o->hidden}};
    st = tpf_comm_create(rk->be, &cfg, &s->comm[r]);
    if (st == TPF_OK) st = tpf_manager_create(rk->be, &s->mgr[r]);
    static const struct {
      const char *name;
      tpf_algo a;
      tpf_coll c;
    } sites[4] = {{"qkv_fprop", TPF_ALGO_RING, TPF_COLL_AG},
                  {"proj_fprop", TPF_ALGO_RING, TPF_COLL_RS},
                  {"fc1_fprop", TPF_ALGO_BULK, TPF_COLL_AG},
                  {"fc2_fprop", TPF_ALGO_PIPELINE, TPF_COLL_RS}};
    for (int i = 0; i < 4 && st == TPF_OK; i++) {
      tpf_comm_config mc = {.name = sites[i].name,
                            .algo = sites[i].a,
                            .coll = sites[i].c,
                            .dtype = TPF_BF16,
                            .capacity = {o->capacity, o->hidden}};
      tpf_comm *dummy;
      st = tpf_manager_add(s->mgr[r], &mc, &dummy);
    }
    if (st != TPF_OK) ss_fail(s, st, "create");
  } else if (s->phase == 1) {
    /* Rank 0 times; the others wait, so the timing host threads do not compete. */
    bench_barrier(rk);
    if (r == 0 && !atomic_load(&s->failed)) {
      long long live0 = tpf__alloc_live_count();
      long long d0 = rk->g->cuda ? bench_cuda_dev_used() : -1;
      ss_loop(s, s->comm[0], NULL, &s->comm_med_ns, &s->comm_p99_ns, &s->comm_allocs);
      ss_loop(s, NULL, s->mgr[0], &s->mgr_med_ns, &s->mgr_p99_ns, &s->mgr_allocs);
      s->live_delta = tpf__alloc_live_count() - live0;
      s->dev_delta = rk->g->cuda ? bench_cuda_dev_used() - d0 : 0;
    }
    bench_barrier(rk);
  } else if (s->phase == 2) {
    double *v = calloc((size_t)s->realloc_n, sizeof(double));
    long long a0 = bench_alloc_calls();
    int done = 0;
    for (int i = 0; i < s->realloc_n; i++) {
      bench_barrier(rk);
      if (atomic_load(&s->failed)) continue;
      double t0 = bench_now_ns();
      tpf_comm_config cfg = {.name = "fc1_fprop",
                             .algo = TPF_ALGO_RING,
                             .coll = TPF_COLL_AG,
                             .dtype = TPF_BF16,
                             .capacity = {ss_rows(o, i), o->hidden}};
      st = tpf_comm_destroy(s->comm[r]);
      s->comm[r] = NULL;
      if (st == TPF_OK) st = tpf_comm_create(rk->be, &cfg, &s->comm[r]);
      if (st != TPF_OK) {
        ss_fail(s, st, "destroy + create");
        continue;
      }
      if (v) v[done++] = bench_now_ns() - t0;
    }
    bench_barrier(rk);
    if (r == 0) {
      s->realloc_allocs = bench_alloc_calls() - a0;
      s->realloc_med_ns = bench_median(v, done);
      s->realloc_p99_ns = bench_quantile(v, done, 0.99);
    }
    free(v);
  } else {
    if (s->comm[r]) tpf_comm_destroy(s->comm[r]);
    if (s->mgr[r]) tpf_manager_destroy(s->mgr[r]);
    s->comm[r] = NULL;
    s->mgr[r] = NULL;
  }
  return TPF_OK;
}

static void ss_row(const char *method, int P, const bench_opts *o, long long calls, double med,
                   double p99, double allocs, double regs, double devmb, const char *what) {
  bench_cell_s(method);
  bench_cell_i(P);
  bench_cell_i((long long)o->capacity);
  bench_cell_i((long long)o->hidden);
  bench_cell_i(calls);
  bench_cell_f(med, med < 1e4 ? 1 : 0);
  bench_cell_f(p99, p99 < 1e4 ? 1 : 0);
  bench_cell_f(allocs, 2);
  bench_cell_f(regs, 2);
  bench_cell_f(devmb, 1);
  bench_cell_s(what);
  bench_row_end();
}

/* Section 1's rows after the timed set_active_shape loops (phase 1): the communicator's and
 * the manager's, then phase 2 (destroy + create) and its row; regs0 is the registrations count
 * before phase 1 (< 0: not counted). The status of the group's run. */
static tpf_status ss_table_rows(bench_group *g, bench_ss *s, long long regs0) {
  const bench_opts *o = s->o;
  const int P = o->tp;
  long long regs1 = bench_group_registrations(g);
  double nregs = regs0 < 0 ? NAN : (double)(regs1 - regs0) / (double)(2 * s->calls);
  ss_row("tpf_comm_set_active_shape", P, o, s->calls, s->comm_med_ns, s->comm_p99_ns,
         (double)s->comm_allocs / (double)s->calls, nregs,
         o->cuda ? (double)s->dev_delta / 1048576.0 / (double)(2 * s->calls) : NAN,
         o->cuda ? "tpflex: one communicator"
                 : "tpflex: one communicator (+ sim canary fill of inactive bytes)");
  ss_row("tpf_manager_set_active_shape", P, o, s->calls, s->mgr_med_ns, s->mgr_p99_ns,
         (double)s->mgr_allocs / (double)s->calls, nregs, NAN,
         o->cuda ? "tpflex: manager of 4 communicators"
                 : "tpflex: manager of 4 communicators (+ sim canary fill)");
  bench_progress("[1/4 setshape] timing %d destroy + create (re-registration)", s->realloc_n);
  s->phase = 2;
  tpf_status st = bench_group_run(g, ss_rank, s);
  long long regs2 = bench_group_registrations(g);
  if (st == TPF_OK && !s->failed)
    ss_row("tpf_comm_destroy+create", P, o, s->realloc_n, s->realloc_med_ns, s->realloc_p99_ns,
           (double)s->realloc_allocs / (double)(s->realloc_n * P),
           regs0 < 0 ? NAN : (double)(regs2 - regs1) / (double)s->realloc_n, NAN,
           o->cuda ? "alternative: re-register at the new size (cudaMalloc path)"
                   : "alternative: re-register at the new size (arena path)");
  bench_note("allocs/call: allocations through tpflex's allocator per call (all ranks for "
             "destroy+create, per rank); live allocations changed by %lld over the "
             "set_active_shape loops",
             s->live_delta);
  if (regs0 >= 0)
    bench_note("regs/call: collective registrations the simulator counted per call");
  else
    bench_note("regs/call: not counted by this backend; devMB/call: device memory in use "
               "(cudaMemGetInfo) before minus after, per call");
  return st;
}

int bench_section_setshape(const bench_opts *o0) {
  /* The simulator's reg_activate writes a canary over every inactive byte (a check only the
   * simulator makes), so its set_active_shape costs O(C*H); a narrow buffer keeps 1e5 calls
   * quick there. The CUDA backend's activation touches no memory: it runs at the full shape. */
  bench_opts o1 = *o0;
  if (!o0->cuda) o1.hidden = 16;
  const bench_opts *o = &o1;
  const int P = o->tp;
  static const char *const cols[] = {"method",    "P",          "C",      "H",
                                     "calls",     "median_ns",  "p99_ns", "allocs/call",
                                     "regs/call", "devMB/call", "what"};
  bench_table("setshape",
              "Section 1: cost of changing T (host time per call; T cycles C/8, C/4, "
              "C/2, C)",
              11, cols);
  if (!o->cuda)
    bench_note("simulator: H=16 here; its set_active_shape writes a canary over every inactive "
               "byte (a simulator-only check), O(C*H) per call");
  if (o->capacity % (8ull * (uint64_t)P) != 0) {
    bench_note("skipped: capacity %llu is not a multiple of 8*P", (unsigned long long)o->capacity);
    return 1;
  }
  bench_group *g = NULL;
  bench_progress("[1/4 setshape] creating a group of %d ranks", P);
  tpf_status st = bench_group_create(o, P, &g);
  if (st != TPF_OK) {
    bench_note("FAILED: group: %s (%s)", tpf_status_name(st), tpf_last_error());
    return 1;
  }
  bench_ss *s = calloc(1, sizeof(*s));
  s->o = o;
  s->calls = o->setshape_calls;
  s->realloc_n = o->realloc_iters;
  int rc = 0;
  s->phase = 0;
  st = bench_group_run(g, ss_rank, s);
  long long regs0 = bench_group_registrations(g);
  if (st == TPF_OK && !s->failed) {
    bench_progress("[1/4 setshape] timing %ld set_active_shape calls", s->calls);
    s->phase = 1;
    st = bench_group_run(g, ss_rank, s);
  }
  if (st == TPF_OK && !s->failed) st = ss_table_rows(g, s, regs0);
  if (st != TPF_OK || s->failed) {
    bench_note("FAILED: %s", s->failed ? s->err : tpf_last_error());
    rc = 1;
  }
  s->phase = 3;
  bench_group_run(g, ss_rank, s);
  if (o->cuda && rc == 0) rc |= bench_cuda_setshape_alternatives(o);
  free(s);
  bench_group_destroy(g);
  return rc;
}

/* ---- section 2: dynamic versus padded ------------------------------------------------------ */

static double job_flops(const bench_job *j, uint64_t T) {
  return 2.0 * (double)T * (double)j->H * (double)j->N;
}

int bench_section_dynamic(const bench_opts *o) {
  const int P = o->tp;
  const bool gpu = o->cuda;
  const char *cols[] = {"op",
                        "P",
                        "T",
                        "T/C",
                        "size(B)",
                        "count",
                        "time(us)",
                        "algbw(GB/s)",
                        "busbw(GB/s)",
                        "#wrong",
                        gpu ? "rankTFLOP/s" : "rankGFLOP/s",
                        "padded(us)",
                        "time/padded"};
  char title[200];
  snprintf(title, sizeof(title),
           "Section 2: dynamic T versus padded to capacity C=%llu (P=%d, H=%llu, N=%llu)",
           (unsigned long long)o->capacity, P, (unsigned long long)o->hidden,
           (unsigned long long)o->n);
  bench_table("dynamic", title, 13, cols);
  uint64_t ts[4] = {o->capacity / 8, o->capacity / 4, o->capacity / 2, o->capacity};
  bench_group *g = NULL;
  tpf_status st = bench_group_create(o, P, &g);
  if (st != TPF_OK) {
    bench_note("FAILED: group: %s (%s)", tpf_status_name(st), tpf_last_error());
    return 1;
  }
  static const bench_op ops[] = {BOP_RING_AG, BOP_RING_RS, BOP_PIPE_RS};
  int rc = 0;
  for (size_t oi = 0; oi < sizeof(ops) / sizeof(ops[0]); oi++) {
    bench_job *j = calloc(1, sizeof(*j));
    job_init(j, o, ops[oi], P, 4, ts);
    bench_progress("[2/4 dynamic] %s P=%d, T = C/8 .. C", kOps[ops[oi]].name, P);
    st = run_job(g, j);
    double pad = j->nts ? j->us[j->nts - 1] : NAN; /* the last T is C: the padded run */
    for (int i = 0; i < j->nts; i++) {
      uint64_t T = j->ts[i];
      double size = (double)T * (double)o->hidden * 2.0, t = j->us[i];
      bench_cell_s(kOps[ops[oi]].name);
      bench_cell_i(P);
      bench_cell_i((long long)T);
      bench_cell_f((double)T / (double)o->capacity, 3);
      bench_cell_i((long long)size);
      bench_cell_i((long long)(T * o->hidden));
      bench_cell_f(t, 1);
      bench_cell_f(size / (t * 1e3), 2);
      bench_cell_f(size / (t * 1e3) * (P - 1) / P, 2);
      bench_cell_i(atomic_load(&j->wrong[i]));
      bench_cell_f(job_flops(j, T) / (t * 1e-6) / (gpu ? 1e12 : 1e9), gpu ? 1 : 3);
      bench_cell_f(pad, 1);
      bench_cell_f(t / pad, 3);
      bench_row_end();
      if (atomic_load(&j->wrong[i]) != 0) rc = 1;
    }
    if (st != TPF_OK) {
      bench_note("FAILED %s: %s", kOps[ops[oi]].name, j->err);
      rc = 1;
    }
    free(j);
  }
  bench_note("padded(us): the same operation at T = C (pad-to-max); time/padded should track T/C");
  if (gpu)
    bench_note("all %d ranks are threads on one GPU: their 'peer' copies are device-local (HBM), "
               "not NVLink, so algbw/busbw here are not comparable with multi-GPU nccl-tests "
               "figures; they are for comparing T against C",
               P);
  bench_group_destroy(g);
  return rc;
}

/* ---- section 4/5: TP emulation, serial baseline, whole-layer GEMM ------------------------- */

/* What --ops selects, in bench_tp_sel_name order. */
static const bench_op kSel[BENCH_TP_NSEL] = {BOP_RING_AG, BOP_RING_AG_AGGR, BOP_RING_RS,
                                             BOP_PIPE_RS};

const char *bench_tp_sel_name(int i) {
  return i >= 0 && i < BENCH_TP_NSEL ? kOps[kSel[i]].name : NULL;
}

static bool selected(const bench_opts *o, bench_op op) {
  for (int i = 0; i < BENCH_TP_NSEL; i++)
    if (kSel[i] == op) return (o->tp_sel & (1u << i)) != 0;
  return false;
}

/* One row of the tp section: an operation, on a FIXED or (adaptive) a TPF_PLAN_ADAPTIVE
 * communicator. */
typedef struct {
  bench_op op;
  bool adaptive;
} tp_entry;

/* Appends op (when selected) and, with --adaptive, its adaptive version right after it. Every
 * selectable operation is one the planner handles (core/plan.c: RING AG, with or without
 * aggregate, RING RS and PIPELINE RS), so each gets one. */
static void tp_add(const bench_opts *o, bench_op op, tp_entry *ops, int *n) {
  if (!selected(o, op)) return;
  ops[(*n)++] = (tp_entry){op, false};
  if (o->adaptive) ops[(*n)++] = (tp_entry){op, true};
}

/* The operations of the tp section at P, in table order: the selected ones (each followed by
 * its adaptive version with --adaptive), and the serial baseline of each collective that has one
 * selected. At most BENCH_TP_MAX_OPS. */
static int tp_ops(const bench_opts *o, int P, tp_entry *ops) {
  int n = 0;
  tp_add(o, BOP_RING_AG, ops, &n);
  if (P % 2 == 0 && P > 2) tp_add(o, BOP_RING_AG_AGGR, ops, &n);
  if (n > 0) ops[n++] = (tp_entry){BOP_RING_AG_SERIAL, false};
  const int nag = n;
  tp_add(o, BOP_RING_RS, ops, &n);
  tp_add(o, BOP_PIPE_RS, ops, &n);
  if (n > nag) ops[n++] = (tp_entry){BOP_PIPE_RS_SERIAL, false};
  return n;
}

int bench_tp_nops(const bench_opts *o, int P) {
  tp_entry ops[BENCH_TP_MAX_OPS];
  return tp_ops(o, P, ops);
}

/* Shared (the default): one GEMM queue for all ranks (shared_device: their GEMMs take the device
 * one at a time) and a peer copy that is a copy within the device. Replayed against the measured
 * schedules of the H200 run of 2026-12-03 (bench/RESULTS.md section 6), this model's median error
 * was 13 %, against 20-23 % for the earlier approximation (GEMM times x P, bandwidths / P). */
void bench_cost_model(const bench_opts *o, tpf_cost_table *out) {
  *out = *o->cost;
  if (!o->dedicated) {
    out->peer = o->cost->local;
    out->shared_device = 1;
  }
}

tpf_status bench_tp_run(bench_group *g, const bench_opts *o, bool events, bench_tp_result *res,
                        void (*done)(const bench_tp_result *res, void *arg), void *done_arg) {
  const int P = g->tp;
  tp_entry ops[BENCH_TP_MAX_OPS];
  const int nops = tp_ops(o, P, ops);
  bench_job *j = calloc(1, sizeof *j);
  /* The adaptive communicators' table: the one the planner section uses (bench_cost_model). */
  tpf_cost_table *model = o->adaptive ? malloc(sizeof *model) : NULL;
  if (!j || (o->adaptive && !model)) {
    free(j);
    free(model);
    return tpf_set_error(TPF_ENOMEM, "bench: no memory");
  }
  if (model) bench_cost_model(o, model);
  /* Every operation's row exists from the start (n/a until it ran), so a result written after
   * each operation (done) is whole at every point. */
  memset(res, 0, sizeof *res);
  res->magic = BENCH_TP_MAGIC;
  res->bytes = (uint32_t)sizeof *res;
  res->P = P;
  res->nops = nops;
  /* The T values P divides: the same for every op. */
  job_init(j, o, BOP_RING_AG, P, o->ntps, o->tps);
  res->nts = j->nts;
  memcpy(res->ts, j->ts, sizeof res->ts);
  for (int k = 0; k < nops; k++) {
    snprintf(res->op[k], sizeof res->op[k], "%s%s", kOps[ops[k].op].name,
             ops[k].adaptive ? "[adaptive]" : "");
    res->ag[k] = is_ag(ops[k].op);
    res->adaptive[k] = ops[k].adaptive;
    for (int m = 0; m < nops; m++)
      if (ops[m].op == (res->ag[k] ? BOP_RING_AG_SERIAL : BOP_PIPE_RS_SERIAL)) res->serial[k] = m;
    for (int i = 0; i < BENCH_MAX_TS; i++) {
      res->dev_us[k][i] = res->host_us[k][i] = res->enq_us[k][i] = NAN;
      res->pair_us[k][i] = res->spd[k][i] = res->spd_q1[k][i] = res->spd_q3[k][i] = NAN;
      res->enq_host_max[k][i] = NAN;
      for (int f = 0; f < BENCH_ENQ_NF; f++)
        res->enq[k][i][f] = NAN;
    }
  }
  const bool chatty = !g->xboot || g->xboot->rank == 0;
  tpf_status first = TPF_OK;
  for (int k = 0; k < nops; k++) {
    job_init(j, o, ops[k].op, P, o->ntps, o->tps);
    j->iters = events ? o->iters : 0;
    j->host_iters = o->iters;
    j->cost = ops[k].adaptive ? model : NULL;
    j->pair = true;
    for (int i = 0; i < j->nts; i++)
      j->host_us[i] = j->enq_us[i] = NAN;
    if (chatty)
      bench_progress("[4/4 tp] P=%d %s%s over %d values of T", P, res->op[k],
                     g->xboot ? " (processes)" : "", j->nts);
    tpf_status st = run_job(g, j);
    for (int i = 0; i < j->nts; i++) {
      res->dev_us[k][i] = events ? j->us[i] : NAN;
      res->host_us[k][i] = j->host_us[i];
      res->enq_us[k][i] = j->enq_us[i];
      res->pair_us[k][i] = j->pair_us[i];
      res->spd[k][i] = j->spd[i];
      res->spd_q1[k][i] = j->spd_q1[i];
      res->spd_q3[k][i] = j->spd_q3[i];
      res->wrong[k][i] = atomic_load(&j->wrong[i]);
      res->chose[k][i] = j->chose[i];
      memcpy(res->enq[k][i], j->enq_mean[i], sizeof res->enq[k][i]);
      res->enq_host_max[k][i] = j->enq_max[i];
      res->chose_aggr[k][i] = j->chose_aggr[i];
      res->chose_pull[k][i] = j->chose_pull[i];
    }
    if (st != TPF_OK) {
      res->failed[k] = true;
      snprintf(res->err[k], sizeof res->err[k], "%s", j->err);
      if (first == TPF_OK) first = st;
    }
    if (done) done(res, done_arg);
  }
  free(j);
  free(model);
  return first;
}

/* The threads table's rows of one P (result rs): per T the whole-layer GEMMs (AG layer and RS
 * layer) on the one-rank group g1, then one row per operation. 1 when a row has wrong elements. */
static int tp_rows(const bench_opts *o, bench_group *g1, const bench_tp_result *rs) {
  const bool gpu = o->cuda;
  const int P = rs->P;
  int rc = 0;
  for (int i = 0; i < rs->nts; i++) {
    const uint64_t T = rs->ts[i];
    double lay_ag = NAN, lay_rs = NAN;
    bench_progress("[4/4 tp] P=%d whole-layer GEMMs at T=%llu", P, (unsigned long long)T);
    if (layer_gemm(o, g1, T, o->n * (uint64_t)P, o->hidden, &lay_ag) != TPF_OK ||
        layer_gemm(o, g1, T, o->hidden, o->n * (uint64_t)P, &lay_rs) != TPF_OK) {
      bench_note("layer GEMM at T=%llu failed: %s", (unsigned long long)T, tpf_last_error());
    }
    for (int k = 0; k < rs->nops; k++) {
      const bool ag = rs->ag[k];
      double t = rs->dev_us[k][i], size = (double)T * (double)o->hidden * 2.0;
      double lay = ag ? lay_ag : lay_rs, ser = rs->dev_us[rs->serial[k]][i];
      const double flops = 2.0 * (double)T * (double)o->hidden * (double)o->n;
      bench_cell_s(rs->op[k]);
      bench_cell_i(P);
      bench_cell_i((long long)T);
      bench_cell_i((long long)size);
      bench_cell_i((long long)(T * o->hidden));
      bench_cell_f(t, 1);
      bench_cell_f(size / (t * 1e3), 2);
      bench_cell_f(size / (t * 1e3) * (P - 1) / P, 2);
      bench_cell_i(rs->wrong[k][i]);
      bench_cell_f(flops * P / (t * 1e-6) / (gpu ? 1e12 : 1e9), gpu ? 1 : 3);
      bench_cell_f(lay, 1);
      bench_cell_f(lay / t, 3);
      bench_cell_f(ser, 1);
      bench_cell_f(ser / t, 3);
      bench_row_end();
      if (rs->wrong[k][i] != 0) rc = 1;
    }
  }
  return rc;
}

int bench_tp_threads_table(const bench_opts *o, bench_tp_result *res) {
  const bool gpu = o->cuda;
  const char *cols[] = {"op",
                        "P",
                        "T",
                        "size(B)",
                        "count",
                        "time(us)",
                        "algbw(GB/s)",
                        "busbw(GB/s)",
                        "#wrong",
                        gpu ? "TFLOP/s" : "GFLOP/s",
                        "layer_gemm(us)",
                        "efficiency",
                        "serial(us)",
                        "speedup"};
  char title[240];
  snprintf(title, sizeof(title),
           "Section 4/5: %s TP emulation, C=%llu H=%llu N=%llu per rank (layer GEMM: AG "
           "[T,H]x[P*N,H]^T, RS [T,P*N]x[H,P*N]^T)",
           gpu ? "one-GPU" : "simulator", (unsigned long long)o->capacity,
           (unsigned long long)o->hidden, (unsigned long long)o->n);
  bench_table("tp", title, 14, cols);
  int rc = 0;
  bench_group *g1 = NULL;
  tpf_status st = bench_group_create(o, gpu ? 0 : 1, &g1);
  if (st != TPF_OK) {
    bench_note("FAILED: group of 1: %s (%s)", tpf_status_name(st), tpf_last_error());
    return 1;
  }
  for (int pi = 0; pi < o->nps; pi++) {
    const int P = o->ps[pi];
    bench_tp_result *rs = &res[pi];
    memset(rs, 0, sizeof *rs);
    rs->P = P;
    if (bench_tp_nops(o, P) == 0) continue; /* none of --ops runs at P (bench_section_tp says) */
    bench_group *g = NULL;
    st = bench_group_create(o, P, &g);
    if (st != TPF_OK) {
      bench_note("FAILED: group of %d: %s (%s)", P, tpf_status_name(st), tpf_last_error());
      snprintf(rs->setup_err, sizeof rs->setup_err, "group of %d: %s", P, tpf_last_error());
      rc = 1;
      continue;
    }
    bench_tp_run(g, o, true, rs, NULL, NULL);
    bench_group_destroy(g);
    for (int k = 0; k < rs->nops; k++)
      if (rs->failed[k]) {
        bench_note("FAILED P=%d %s: %s", P, rs->op[k], rs->err[k]);
        rc = 1;
      }
    if (tp_rows(o, g1, rs) != 0) rc = 1;
  }
  bench_note("all P ranks share one %s: FLOP/s counts every rank's GEMMs together; efficiency = "
             "one GEMM of the whole layer / the P-rank run",
             gpu ? "GPU" : "host (the simulator)");
  bench_note("serial: serial_ag,gemm = RING AG with 1 split (the whole exchange, then one GEMM); "
             "serial_gemm,rs = PIPELINE RS with 1 split (one GEMM, then the reduce-scatter); "
             "speedup = serial / op");
  if (gpu)
    bench_note("NCCL serial baseline: not run here: NCCL <= 2.29 rejects several ranks on one GPU "
               "(\"Duplicate GPU detected\"), so the serial baseline is tpflex's own 1-split "
               "schedule (copy-engine exchange, then one cuBLASLt GEMM)");
  bench_group_destroy(g1);
  return rc;
}

/* One row of the modes table. */
static void modes_row(const bench_opts *o, const char *mode, const bench_tp_result *rs, int k,
                      int i, const bench_tp_result *threads) {
  const uint64_t T = rs->ts[i], C = o->capacity;
  const double t = rs->host_us[k][i], ser = rs->pair_us[k][i];
  double tc = NAN; /* the same operation at T = C */
  for (int q = 0; q < rs->nts; q++)
    if (rs->ts[q] == C) tc = rs->host_us[k][q];
  const double tc_ratio = t / tc, tok = (double)T / (double)C;
  double thr = NAN;
  if (threads)
    for (int m = 0; m < threads->nops; m++)
      for (int q = 0; q < threads->nts; q++)
        if (strcmp(threads->op[m], rs->op[k]) == 0 && threads->ts[q] == T)
          thr = threads->host_us[m][q];
  bench_cell_s(rs->op[k]);
  bench_cell_s(mode);
  bench_cell_i(rs->P);
  bench_cell_i((long long)T);
  bench_cell_f(tok, 3);
  bench_cell_f(t, 1);
  bench_cell_f(ser, 1);
  bench_cell_f(rs->spd[k][i], 3);
  bench_cell_f(rs->spd_q1[k][i], 3);
  bench_cell_f(rs->spd_q3[k][i], 3);
  bench_cell_f(tc_ratio, 3);
  bench_cell_f(tc_ratio / tok, 3);
  bench_cell_f(rs->enq_us[k][i], 1);
  bench_cell_f(t / thr, 3);
  bench_cell_i(rs->wrong[k][i]);
  bench_row_end();
}

int bench_tp_modes_rows(const bench_opts *o, const bench_tp_result *threads,
                        const bench_tp_result *procs) {
  int rc = 0;
  const bench_tp_result *ref = threads && threads->nops ? threads : procs;
  const bench_tp_result *any = threads ? threads : procs;
  if (any && bench_tp_nops(o, any->P) == 0) return 0; /* --ops: none at P (a note says) */
  if (!ref || ref->nops == 0) return 1;               /* nothing ran: the notes say why */
  for (int i = 0; i < ref->nts; i++)
    for (int k = 0; k < ref->nops; k++) {
      if (threads && threads->nops) {
        modes_row(o, "threads", threads, k, i, threads);
        rc |= threads->wrong[k][i] != 0;
      }
      /* The procs result has the same operations and T values (the same P and options). */
      if (procs && k < procs->nops && i < procs->nts) {
        modes_row(o, "procs", procs, k, i, threads && threads->nops ? threads : NULL);
        rc |= procs->wrong[k][i] != 0;
      }
    }
  const bench_tp_result *both[2] = {threads, procs};
  for (int m = 0; m < 2; m++) {
    rc |= both[m] && both[m]->setup_err[0];
    for (int k = 0; both[m] && k < BENCH_TP_MAX_OPS; k++)
      rc |= both[m]->failed[k];
  }
  return rc;
}

void bench_pt_lists_of(const bench_opts *o, bench_pt_lists *l) {
  l->ps[0] = l->ts[0] = '\0';
  for (int i = 0, n = 0; i < o->nps; i++)
    n += snprintf(l->ps + n, sizeof l->ps - (size_t)n, "%s%d", i ? "," : "", o->ps[i]);
  for (int i = 0, n = 0; i < o->ntps; i++)
    n += snprintf(l->ts + n, sizeof l->ts - (size_t)n, "%s%llu", i ? "," : "",
                  (unsigned long long)o->tps[i]);
}
