/* Sections 2 (dynamic versus padded: the same operation at T against at the capacity) and 4/5
 * (TP emulation: every operation against its serial baseline, in one or both rank modes, the
 * whole-layer GEMM, the enqueue breakdown) of `tpflex bench`: the jobs they build
 * (bench_job.h) and their tables.
 */
#define _POSIX_C_SOURCE 200809L
#include "bench_job.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    bench_job_init(j, o, ops[oi], P, 4, ts);
    bench_progress("[2/4 dynamic] %s P=%d, T = C/8 .. C", bench_kops[ops[oi]].name, P);
    st = bench_run_job(g, j);
    double pad = j->nts ? j->us[j->nts - 1] : NAN; /* the last T is C: the padded run */
    for (int i = 0; i < j->nts; i++) {
      uint64_t T = j->ts[i];
      double size = (double)T * (double)o->hidden * 2.0, t = j->us[i];
      bench_cell_s(bench_kops[ops[oi]].name);
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
      bench_note("FAILED %s: %s", bench_kops[ops[oi]].name, j->err);
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
  return i >= 0 && i < BENCH_TP_NSEL ? bench_kops[kSel[i]].name : NULL;
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
 * schedules of the H200 run of 2026-12-03 (docs/results/h200.md, session 3), this model's median
 * error was 13 %, against 20-23 % for the earlier approximation (GEMM times x P, bandwidths / P).
 */
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
  bench_job_init(j, o, BOP_RING_AG, P, o->ntps, o->tps);
  res->nts = j->nts;
  memcpy(res->ts, j->ts, sizeof res->ts);
  for (int k = 0; k < nops; k++) {
    snprintf(res->op[k], sizeof res->op[k], "%s%s", bench_kops[ops[k].op].name,
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
    bench_job_init(j, o, ops[k].op, P, o->ntps, o->tps);
    j->iters = events ? o->iters : 0;
    j->host_iters = o->iters;
    j->cost = ops[k].adaptive ? model : NULL;
    j->pair = true;
    for (int i = 0; i < j->nts; i++)
      j->host_us[i] = j->enq_us[i] = NAN;
    if (chatty)
      bench_progress("[4/4 tp] P=%d %s%s over %d values of T", P, res->op[k],
                     g->xboot ? " (processes)" : "", j->nts);
    tpf_status st = bench_run_job(g, j);
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
    if (bench_layer_gemm(o, g1, T, o->n * (uint64_t)P, o->hidden, &lay_ag) != TPF_OK ||
        bench_layer_gemm(o, g1, T, o->hidden, o->n * (uint64_t)P, &lay_rs) != TPF_OK) {
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
                        "bench_layer_gemm(us)",
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
