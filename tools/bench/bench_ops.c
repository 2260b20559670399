/* The job runner of the sections of `tpflex bench` that go through the public tpflex API, on
 * either backend (bench_job.h): sections 2 and 4/5 (bench_tp.c), the variants runner of the
 * planner section and the fp8 section's dtype runner build jobs that this file runs; the check of
 * their output and the gather of their results are bench_check.c's. Calls the groups
 * (bench_group.c), the GPU baselines (bench_cuda_sections.c) and bench_util.c.
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
 * counts and first failure are exchanged (bench_job_gather), so every process holds the whole
 * result.
 */
#define _POSIX_C_SOURCE 200809L
#include "bench_job.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- operations --------------------------------------------------------------------------- */

const bench_op_info bench_kops[BOP_COUNT] = {
    [BOP_RING_AG] = {"ring_ag+gemm", TPF_ALGO_RING, TPF_COLL_AG, 0, false},
    [BOP_RING_AG_AGGR] = {"ring_ag_aggr+gemm", TPF_ALGO_RING, TPF_COLL_AG, 0, true},
    [BOP_RING_AG_SERIAL] = {"serial_ag,gemm", TPF_ALGO_RING, TPF_COLL_AG, 1, false},
    [BOP_RING_RS] = {"gemm+ring_rs", TPF_ALGO_RING, TPF_COLL_RS, 0, false},
    [BOP_PIPE_RS] = {"gemm+pipeline_rs", TPF_ALGO_PIPELINE, TPF_COLL_RS, 0, false},
    [BOP_PIPE_RS_SERIAL] = {"serial_gemm,rs", TPF_ALGO_PIPELINE, TPF_COLL_RS, 1, false},
    [BOP_BULK_AG] = {"bulk_ag+gemm", TPF_ALGO_BULK, TPF_COLL_AG, 0, false},
};

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
    bench_job_fail(j, st, "input copy (the paired serial baseline)");
    skip = true;
  }
  tpf_cuda_enqueue_stats x0, x1;
  const bool snap = have_enq0 && bench_enq_snap(rk, &x0);
  skip = bench_host_begin(rk, pslot, &j->failed) || skip;
  if (!skip) {
    const double e0 = bench_now_ns();
    st = ag ? tpf_ag_gemm_ex(pc, w, d, opt, rk->stream)
            : tpf_gemm_rs_ex(pc, x, w, d, opt, rk->stream);
    g->enq[rk->rank * BENCH_MAX_ITERS + pslot] = bench_now_ns() - e0;
    if (st != TPF_OK) {
      bench_job_fail(j, st, "the paired serial baseline");
      skip = true;
    }
  }
  bench_host_end(rk, pslot);
  if (snap && bench_enq_snap(rk, &x1)) bench_enq_add(excl, &x0, &x1);
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
  snprintf(name, sizeof(name), "bench_%s%s", bench_kops[j->op].name, j->cost ? "_adaptive" : "");
  tpf_comm_config cfg = {.name = name,
                         .algo = bench_kops[j->op].algo,
                         .coll = bench_kops[j->op].coll,
                         .dtype = buf_dtype(j),
                         .capacity = {j->C, j->H},
                         .num_splits = bench_kops[j->op].splits,
                         .aggregate = bench_kops[j->op].aggregate};
  if ((x->var && x->var->cost) || j->cost) {
    cfg.plan = TPF_PLAN_ADAPTIVE;
    cfg.cost = x->var ? x->var->cost : j->cost;
  }
  tpf_status st = tpf_comm_create(rk->be, &cfg, &x->c);
  if (st != TPF_OK) bench_job_fail(j, st, "tpf_comm_create");
  /* Output: AG d [C, N]; RS out [C/P, H]. */
  uint64_t drows = x->ag ? j->C : j->C / (uint64_t)rk->tp;
  x->dcols = x->ag ? j->N : j->H;
  if (st == TPF_OK) {
    x->dmem = bench_mem_alloc(rk->g, drows * x->dcols * 2);
    if (!x->dmem) bench_job_fail(j, TPF_ENOMEM, "output allocation");
  }
  if (st == TPF_OK && job_fp8(j)) { /* the scales, in backend memory (SPEC §11) */
    const float host[2] = {BENCH_FP8_SCALE_A, BENCH_FP8_SCALE_W};
    x->scales = bench_mem_alloc(rk->g, sizeof host);
    if (!x->scales) {
      bench_job_fail(j, TPF_ENOMEM, "FP8 scale allocation");
    } else if (rk->g->cuda) {
      if ((st = bench_cuda_tile(x->scales, host, sizeof host, sizeof host)) != TPF_OK)
        bench_job_fail(j, st, "FP8 scale upload");
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
                            .algo = bench_kops[sop].algo,
                            .coll = bench_kops[sop].coll,
                            .dtype = buf_dtype(j),
                            .capacity = {j->C, j->H},
                            .num_splits = bench_kops[sop].splits};
    st = tpf_comm_create(rk->be, &pcfg, &x->pc);
    if (st != TPF_OK) bench_job_fail(j, st, "tpf_comm_create (the paired serial baseline)");
  }
  x->us = calloc((size_t)j->iters * (size_t)x->nv + 1, sizeof(double));
  x->one = calloc((size_t)j->iters + 1, sizeof(double));
  x->hus = calloc((size_t)j->host_iters + 1, sizeof(double));
  x->pus = calloc((size_t)j->host_iters + 1, sizeof(double));
  x->ratio = calloc((size_t)j->host_iters + 1, sizeof(double));
  if (!x->us || !x->one || !x->hus || !x->pus || !x->ratio)
    bench_job_fail(j, TPF_ENOMEM, "timing arrays");
}

/* Both communicators at active T and the views of this T (x->skip after a failure). */
static void op_shape(op_ctx *x, uint64_t T) {
  bench_job *j = x->j;
  tpf_status st;
  x->skip = bench_agree_failed(x->rk, &j->failed);
  if (!x->skip && (st = tpf_comm_set_active_shape(x->c, (tpf_shape){T, j->H})) != TPF_OK) {
    bench_job_fail(j, st, "tpf_comm_set_active_shape");
    x->skip = true;
  }
  x->buf = x->local = x->plocal = (tpf_matrix){0};
  if (!x->skip && ((st = tpf_comm_buffer(x->c, &x->buf)) != TPF_OK ||
                   (x->ag && (st = tpf_comm_local_chunk(x->c, &x->local)) != TPF_OK))) {
    bench_job_fail(j, st, "tpf_comm_buffer");
    x->skip = true;
  }
  if (!x->skip && x->pc &&
      ((st = tpf_comm_set_active_shape(x->pc, (tpf_shape){T, j->H})) != TPF_OK ||
       (x->ag && (st = tpf_comm_local_chunk(x->pc, &x->plocal)) != TPF_OK))) {
    bench_job_fail(j, st, "the paired serial baseline's shape");
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
    bench_job_fail(j, st, "input copy");
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
      j->chose_pull[ti] = pr.cand[pr.chosen].algo != bench_kops[j->op].algo;
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
    bench_job_fail(x->j, st, bench_kops[x->j->op].name);
    x->skip = true;
  }
}

/* The checked repetition's end: the output against the reference, counted into the job. */
static void op_check_end(op_ctx *x, uint64_t T, int it, int ti) {
  bench_job *j = x->j;
  tpf_status st = bench_sync(x->rk);
  if (st != TPF_OK) {
    bench_job_fail(j, st, "synchronize");
    x->skip = true;
    return;
  }
  long long checked = 0;
  long long wr = bench_check_output(x->rk, j, T, it, &x->d, x->ag ? &x->buf : NULL, &checked);
  if (wr < 0) {
    bench_job_fail(j, TPF_ENOMEM, "check");
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
  if (htimed && hslot == 0) x->have_enq0 = bench_enq_snap(rk, &x->enq0);
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
    bench_enq_record(rk, j, ti, &x->enq0, &x->excl);
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
    bench_job_fail(j, TPF_ETIMEOUT, "host timing exchange");
  double penq = NAN;
  if (x->pair && bench_host_collect_at(rk, j->host_iters, j->host_iters, x->pus, &penq) != TPF_OK)
    bench_job_fail(j, TPF_ETIMEOUT, "host timing exchange (the paired serial baseline)");
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
  bench_job_enq_reduce(rk, j);
  bench_job_gather(rk, j);
  bench_barrier(rk);
  if (x.c) tpf_comm_destroy(x.c);
  if (x.pc) tpf_comm_destroy(x.pc);
  if (x.dmem) bench_mem_free(rk->g, x.dmem);
  if (x.scales) bench_mem_free(rk->g, x.scales);
  return TPF_OK;
}

/* Runs job j on group g (src must cover it). */
tpf_status bench_run_job(bench_group *g, bench_job *j) {
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
  if (st != TPF_OK && j->st == TPF_OK) bench_job_fail(j, st, "run");
  if (atomic_load(&j->failed) && j->st == TPF_OK) { /* only an agreement saw it */
    j->st = atomic_load(&g->xfail) ? TPF_ETIMEOUT : TPF_EBACKEND;
    snprintf(j->err, sizeof j->err, "%s",
             g->xerr[0] ? g->xerr : "a rank in another process failed (its message is above)");
  }
  pthread_mutex_destroy(&j->mu);
  return j->st;
}

void bench_job_init(bench_job *j, const bench_opts *o, bench_op op, int P, int nts,
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
  tpf_status st = bench_run_job(g, j);
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
  return op >= 0 && op < BENCH_DOP_COUNT ? bench_kops[kDop[op]].name : "?";
}

tpf_status bench_run_dtype(bench_group *g, const bench_opts *o, bench_dtype_run *r) {
  if (r->op < 0 || r->op >= BENCH_DOP_COUNT || (r->dtype != TPF_BF16 && r->dtype != TPF_FP8_E4M3))
    return tpf_set_error(TPF_EINVAL, "bench: operation %d in %s: not one of the fp8 section's",
                         (int)r->op, tpf_dtype_name(r->dtype));
  bench_job *j = calloc(1, sizeof *j);
  if (!j) return tpf_set_error(TPF_ENOMEM, "bench: no memory");
  bench_job_init(j, o, kDop[r->op], g->tp, r->nts, r->ts);
  j->dt = r->dtype;
  tpf_status st = bench_run_job(g, j);
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
tpf_status bench_layer_gemm(const bench_opts *o, bench_group *g1, uint64_t T, uint64_t n,
                            uint64_t k, double *us) {
  if (o->cuda) return bench_cuda_gemm_us(g1, T, n, k, us);
  bench_job j;
  bench_opts o1 = *o;
  o1.hidden = k;
  o1.n = n;
  o1.capacity = T;
  bench_job_init(&j, &o1, BOP_RING_AG_SERIAL, 1, 1, &T);
  tpf_status st = bench_run_job(g1, &j);
  if (st == TPF_OK) *us = j.us[0];
  return st;
}
