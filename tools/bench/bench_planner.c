/* `tpflex bench --section planner`: the proof of the T-adaptive planner. For P = 2, 4,
 * 8 ranks, N in {3584, 1024} (or --n) and T = C/64 .. C, one adaptive communicator per
 * (operation, P, N) runs, in every repetition, the fixed split count (RING AG: P; PIPELINE RS:
 * 4; RING RS: P), the other candidates (RING AG: P/2 with aggregate; PIPELINE RS: 2 and 8), no
 * overlap (splits 1: RING AG the exchange, then one GEMM; PIPELINE RS one GEMM, then the pull
 * reduce-scatter; RING RS one GEMM, then the ring exchange) and the planner's own choice
 * (num_splits 0), each timed on its own. (RING RS's third candidate, the pull baseline, is
 * PIPELINE RS's no overlap: measured there.) The first
 * table gives, per (operation, P, N, T), the medians, adaptive / min(fixed, no overlap), the best
 * measured schedule, and the model's prediction for the adaptive choice with its error; the
 * second gives the prediction and its error for every schedule.
 *
 * The model: the cost table (--cost, or the shipped table: h200.txt on CUDA, sim.txt on the
 * simulator) replayed by tpf_cost_predict. Here every rank shares one device (one GPU, or the
 * simulator's host), so by default (--model shared) the table says so: shared_device 1 (every
 * rank's GEMMs take the device one at a time) and the peer link is the device-local one. The
 * adaptive communicators get that same table, so they plan for the machine they run on.
 * --model dedicated uses the table as it is (one device per rank).
 *
 * Measured schedule points: when the table has sched lines (tpflex calibrate --schedules, which
 * measures them with bench_planner_sched below: the same runner, timing and grid as this
 * section), the adaptive communicators' decisions use them where they match (tpf_plan_predict).
 * The pred(us) and err(%) columns and the whole planner_model table stay the MODEL's own
 * prediction (tpf_plan_candidate.model_us), so the model's error is measured as before; src and
 * plan(us) say where the decision's time came from and what it was.
 */
#define _POSIX_C_SOURCE 200809L
#include "bench.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef unsigned long long ull;

enum { PL_AG = 0, PL_PIPE = 1, PL_RING_RS = 2, PL_NOPS = 3 };

static tpf_algo op_algo(int op) {
  return op == PL_PIPE ? TPF_ALGO_PIPELINE : TPF_ALGO_RING;
}
static tpf_coll op_coll(int op) {
  return op == PL_AG ? TPF_COLL_AG : TPF_COLL_RS;
}

/* One measured schedule, for the model table printed at the end. */
typedef struct {
  int op, P;
  uint64_t N, T;
  char label[48];
  double meas, pred; /* pred: the model's */
  double tuned;      /* the planner's time (sched points where they match) */
  tpf_plan_source src;
} pl_entry;

/* "8", "4a" (aggregate), "1"; "?" for none. */
static void splits_label(char *buf, size_t len, int splits, bool aggregate) {
  if (splits <= 0)
    snprintf(buf, len, "?");
  else
    snprintf(buf, len, "%d%s", splits, aggregate ? "a" : "");
}

static bool is_aggr(int op, int P, int splits) {
  return op == PL_AG && P > 2 && P % 2 == 0 && splits == P / 2;
}

/* The layout of variant `splits` (0: the communicator's default) at T. */
static tpf_layout_desc layout_of(int op, int P, uint64_t C, uint64_t H, uint64_t T, int splits) {
  tpf_layout_desc d;
  memset(&d, 0, sizeof d);
  d.tp_size = P;
  d.rank = 0;
  d.algo = op_algo(op);
  d.coll = op_coll(op);
  d.dtype = TPF_BF16;
  d.capacity = (tpf_shape){C, H};
  d.active = (tpf_shape){T, H};
  d.num_splits = splits;
  d.aggregate = is_aggr(op, P, splits);
  return d;
}

/* The candidate with this split count (and aggregate flag), NULL if none. */
static const tpf_plan_candidate *cand_of(const tpf_plan_result *r, int splits, bool aggregate) {
  for (int i = 0; i < r->ncand; i++)
    if (r->cand[i].runnable && r->cand[i].num_splits == splits && r->cand[i].aggregate == aggregate)
      return &r->cand[i];
  return NULL;
}

/* The T sweep of the section: C/64 .. C doubling (quick: C/64, C/8 and C). */
static int t_sweep(const bench_opts *o, uint64_t *ts) {
  const uint64_t C = o->capacity;
  int nts = 0;
  for (uint64_t t = C / 64; t <= C && nts < BENCH_MAX_TS; t *= 2) {
    if (t == 0) continue;
    if (o->quick && t != C / 64 && t != C / 8 && t != C) continue;
    ts[nts++] = t;
  }
  if (nts == 0) ts[nts++] = C;
  return nts;
}

/* The variants of (op, P, N) over ts: the fixed split count first, no overlap, the other
 * candidates of the planner (RING AG: P/2 aggregate; PIPELINE RS: 2 and 8), and with `adaptive`
 * the planner's own choice (num_splits 0) last. With the fixed one and no overlap these are all
 * of tpf_plan_predict's candidates for these two operations; a variant is marked illegal at a T
 * where its layout is not. names[k] names variant k. Returns the index of the adaptive variant
 * (or nvar when there is none). */
static int variants_of(const bench_opts *o, int op, int P, uint64_t N, const uint64_t *ts, int nts,
                       bool adaptive, bench_variants *v, const char **names) {
  const uint64_t C = o->capacity, H = o->hidden;
  v->algo = op_algo(op);
  v->coll = op_coll(op);
  v->C = C;
  v->H = H;
  v->N = N;
  v->iters = o->planner_iters;
  v->warmup = o->planner_warmup;
  v->splits[v->nvar] = op == PL_PIPE ? 4 : P;
  names[v->nvar++] = "fixed";
  v->splits[v->nvar] = 1;
  names[v->nvar++] = "no overlap";
  if (op == PL_AG && P > 2 && P % 2 == 0) {
    v->splits[v->nvar] = P / 2;
    names[v->nvar++] = "aggregate";
  }
  if (op == PL_PIPE) {
    v->splits[v->nvar] = 2;
    names[v->nvar++] = "splits 2";
    v->splits[v->nvar] = 8;
    names[v->nvar++] = "splits 8";
  }
  const int adapt = v->nvar;
  if (adaptive) {
    v->splits[v->nvar] = 0;
    names[v->nvar++] = "adaptive";
  }
  for (int i = 0; i < nts; i++) {
    if (ts[i] % (uint64_t)P != 0) continue;
    tpf_layout_desc d = layout_of(op, P, C, H, ts[i], 0);
    if (tpf_layout_check(&d) != TPF_OK) continue; /* T not legal for this layout */
    v->ts[v->nts] = ts[i];
    for (int k = 0; k < v->nvar; k++) {
      d = layout_of(op, P, C, H, ts[i], v->splits[k]);
      v->legal[k][v->nts] = v->splits[k] == 0 || tpf_layout_check(&d) == TPF_OK;
    }
    v->nts++;
  }
  return adapt;
}

static const char *op_name(int op) {
  return op == PL_AG ? "ring_ag" : op == PL_PIPE ? "pipeline_rs" : "ring_rs";
}

/* The operation's name in the tables. */
static const char *op_row(int op) {
  return op == PL_AG ? "ring_ag+gemm" : op == PL_PIPE ? "gemm+pipeline_rs" : "gemm+ring_rs";
}

/* What the planner section gathers across its rows: the model table's entries and the adaptive
 * rows' summary. */
typedef struct {
  pl_entry *ents;
  int nent, rc, rows, within, beat, nsrc[3];
  double worst, lsum;
  char worst_at[96];
} pl_state;

/* One (op, P, N) of the planner section: its variants, the names and the adaptive one. */
typedef struct {
  int op, P;
  uint64_t N;
  const bench_variants *v;
  const char *names[BENCH_MAX_VARIANTS];
  int adapt;
} pl_case;

/* The planner table's title and columns, and the note on the table's sched points. */
static void planner_table(const bench_opts *o) {
  static const char *const cols[] = {
      "op",           "P",        "N",      "T",         "fixed(us)", "no_ovl(us)",
      "adaptive(us)", "chose",    "src",    "adapt/min", "best",      "best(us)",
      "adapt/best",   "pred(us)", "err(%)", "plan(us)",  "#wrong"};
  char title[400];
  snprintf(title, sizeof title,
           "Section 6: T-adaptive planner vs fixed split vs no overlap, P ranks on one %s, C=%llu "
           "H=%llu (medians; model: %s, %s%s)",
           o->cuda ? "GPU" : "host (simulator)", (ull)o->capacity, (ull)o->hidden,
           o->dedicated ? "dedicated" : "shared", o->cost_used,
           o->cost->nsched > 0 ? "; tuned: the table has measured schedule points" : "");
  bench_table("planner", title, 17, cols);
  if (o->cost->nsched > 0) {
    int nshared = 0;
    for (int i = 0; i < o->cost->nsched; i++)
      nshared += o->cost->sched[i].shared;
    bench_note("cost table %s has %d measured schedule points (sched lines; %d shared, %d "
               "dedicated): the adaptive communicators take a candidate's time from them where "
               "they match (src measured or scaled), else from the model (src model); with --model "
               "%s the %s points apply",
               o->cost_used, o->cost->nsched, nshared, o->cost->nsched - nshared,
               o->dedicated ? "dedicated" : "shared",
               !o->dedicated || o->cost->shared_device ? "shared" : "dedicated");
  }
}

/* Every schedule's prediction at T index i, for the model table. */
static void planner_entries(pl_state *st, const pl_case *pc, int i, const tpf_plan_result *pr,
                            const tpf_plan_candidate *cc, const char *chose) {
  const bench_variants *v = pc->v;
  for (int k = 0; k < v->nvar; k++) {
    if (!v->legal[k][i]) continue;
    pl_entry *e = &st->ents[st->nent++];
    const bool aggr = is_aggr(pc->op, pc->P, v->splits[k]);
    e->op = pc->op;
    e->P = pc->P;
    e->N = pc->N;
    e->T = v->ts[i];
    char sl[16];
    if (k == pc->adapt)
      snprintf(e->label, sizeof e->label, "adaptive (%s)", chose);
    else {
      splits_label(sl, sizeof sl, v->splits[k], aggr);
      snprintf(e->label, sizeof e->label, "%s (%s)", pc->names[k], sl);
    }
    e->meas = v->us[k][i];
    const tpf_plan_candidate *c = k == pc->adapt ? cc : cand_of(pr, v->splits[k], aggr);
    e->pred = c ? c->model_us : NAN;
    e->tuned = c ? c->predicted_us : NAN;
    e->src = c ? c->source : TPF_PLAN_SRC_MODEL;
  }
}

/* The adaptive row's ratio q = adaptive / min(fixed, no overlap) into the summary. */
static void planner_count(pl_state *st, const pl_case *pc, uint64_t T, double q) {
  if (isnan(q)) return;
  st->rows++;
  st->within += q <= 1.03;
  st->beat += q < 0.97;
  st->lsum += log(q);
  if (q > st->worst) {
    st->worst = q;
    snprintf(st->worst_at, sizeof st->worst_at, "%s P=%d N=%llu T=%llu", op_name(pc->op), pc->P,
             (ull)pc->N, (ull)T);
  }
}

/* The fastest measured schedule at T index i other than the adaptive one: its time (NaN for
 * none) and its label in bl. */
static double planner_best(const pl_case *pc, int i, char *bl, size_t len) {
  const bench_variants *v = pc->v;
  double best = NAN;
  int bi = -1;
  for (int k = 0; k < pc->adapt; k++)
    if (!isnan(v->us[k][i]) && (bi < 0 || v->us[k][i] < best)) {
      best = v->us[k][i];
      bi = k;
    }
  snprintf(bl, len, "-");
  if (bi >= 0) splits_label(bl, len, v->splits[bi], is_aggr(pc->op, pc->P, v->splits[bi]));
  return best;
}

/* The planner row of T index i: the fixed, no-overlap and adaptive times, the decision, the best
 * schedule and the model's prediction. */
static void planner_row(pl_state *st, const pl_case *pc, const tpf_cost_table *model, int i,
                        const bench_opts *o) {
  const bench_variants *v = pc->v;
  const int op = pc->op, P = pc->P;
  const uint64_t T = v->ts[i], N = pc->N;
  tpf_layout_desc d = layout_of(op, P, o->capacity, o->hidden, T, 0);
  tpf_gemm_dims gd = {T, op == PL_AG ? N : o->hidden, op == PL_AG ? o->hidden : N};
  tpf_plan_result pr; /* the same table as the communicators': the same choice */
  if (tpf_plan_predict(model, &d, &gd, &pr) != TPF_OK) pr.ncand = 0;
  const tpf_plan_result *cr = &v->plan[i]; /* what the communicator decided */
  const tpf_plan_candidate *cc = cr->ncand ? &cr->cand[cr->chosen] : NULL;
  int cs = cc ? cc->num_splits : 0;
  bool ca = cc ? cc->aggregate : false;
  char chose[16];
  splits_label(chose, sizeof chose, cs, ca);
  if (cc && cc->algo != op_algo(op)) /* RING RS: the pull baseline (PIPELINE, 1 block) */
    snprintf(chose, sizeof chose, "%dp", cs);
  /* pa: the MODEL's time of the choice; plan: the time the decision used. */
  double pa = cc ? cc->model_us : NAN, plan = cc ? cc->predicted_us : NAN;
  if (cc) st->nsrc[cc->source <= TPF_PLAN_SRC_SCALED ? cc->source : 0]++;
  if (pr.ncand && cr->ncand &&
      (pr.cand[pr.chosen].num_splits != cs || pr.cand[pr.chosen].aggregate != ca))
    bench_note("P=%d N=%llu T=%llu: the communicator chose %s, tpf_plan_predict %d%s", P, (ull)N,
               (ull)T, chose, pr.cand[pr.chosen].num_splits,
               pr.cand[pr.chosen].aggregate ? "a" : "");
  double tf = v->us[0][i], tn = v->us[1][i], ta = v->us[pc->adapt][i]; /* fixed, no overlap */
  char bl[16];
  double best = planner_best(pc, i, bl, sizeof bl);
  bench_cell_s(op_row(op));
  bench_cell_i(P);
  bench_cell_i((long long)N);
  bench_cell_i((long long)T);
  bench_cell_f(tf, 1);
  bench_cell_f(tn, 1);
  bench_cell_f(ta, 1);
  bench_cell_s(chose);
  bench_cell_s(cc ? tpf_plan_source_name(cc->source) : "-");
  bench_cell_f(ta / fmin(tf, tn), 3);
  bench_cell_s(bl);
  bench_cell_f(best, 1);
  bench_cell_f(ta / best, 3);
  bench_cell_f(pa, 1);
  bench_cell_f(100.0 * (pa - ta) / ta, 1);
  bench_cell_f(plan, 1);
  bench_cell_i(v->wrong[i]);
  bench_row_end();
  if (v->wrong[i] != 0) st->rc = 1;
  planner_count(st, pc, T, ta / fmin(tf, tn));
  planner_entries(st, pc, i, &pr, cc, chose);
}

/* Every operation and N at P ranks on group g: the variants run, then one row per T. */
static void planner_group(pl_state *st, const bench_opts *o, bench_group *g, int P,
                          tpf_cost_table *model, const uint64_t *ts, int nts) {
  for (int op = 0; op < PL_NOPS; op++)
    for (int ni = 0; ni < o->pnns; ni++) {
      const uint64_t N = o->pns[ni];
      bench_variants *v = calloc(1, sizeof *v);
      if (!v) {
        st->rc = 1;
        continue;
      }
      v->cost = model;
      /* Variants: fixed first, no overlap, the other candidates, the planner's choice last. */
      pl_case pc = {op, P, N, v, {NULL}, 0};
      pc.adapt = variants_of(o, op, P, N, ts, nts, true, v, pc.names);
      bench_progress("[planner] P=%d %s N=%llu: %d schedules x %d values of T", P, op_name(op),
                     (ull)N, v->nvar, v->nts);
      if (bench_run_variants(g, v) != TPF_OK) {
        bench_note("FAILED P=%d %s N=%llu: %s", P, op_name(op), (ull)N, v->err);
        st->rc = 1;
      }
      for (int i = 0; i < v->nts; i++)
        planner_row(st, &pc, model, i, o);
      free(v);
    }
}

/* The notes under the planner table: what the columns mean and the adaptive rows' summary. */
static void planner_notes(const bench_opts *o, const pl_state *st) {
  bench_note("fixed: the communicator's default split count (RING AG P, PIPELINE RS 4, RING RS "
             "P); no_ovl: splits 1 (RING AG: the whole exchange, then one GEMM; PIPELINE RS: one "
             "GEMM, then the pull reduce-scatter; RING RS: one GEMM, then the ring exchange); "
             "adaptive: num_splits 0 on a TPF_PLAN_ADAPTIVE communicator, chose = its decision "
             "(tpf_comm_plan_info; 'a' = aggregate; '1p' = RING RS running the pull baseline, "
             "whose measured time is PIPELINE RS's no_ovl)");
  bench_note("adapt/min = adaptive / min(fixed, no_ovl); best = the fastest measured schedule "
             "(including the other candidates: RING AG P/2 aggregate, PIPELINE RS 2 and 8); "
             "pred = the MODEL's time of the adaptive choice (without sched points), err = (pred "
             "- measured) / measured; src = where the decision's time came from (measured: "
             "sched points, interpolated in T; scaled: the model x measured/model at the nearest "
             "measured T; model: the model alone), plan = that time");
  if (st->rows > 0)
    bench_note("decisions by source: %d measured, %d scaled, %d model",
               st->nsrc[TPF_PLAN_SRC_MEASURED], st->nsrc[TPF_PLAN_SRC_SCALED],
               st->nsrc[TPF_PLAN_SRC_MODEL]);
  bench_note("model %s: %s", o->dedicated ? "dedicated" : "shared",
             o->dedicated ? "the cost table as it is (one device per rank)"
                          : "the cost table with shared_device 1 (every rank's GEMMs take the "
                            "one device in turn) and peer link = the local link; the adaptive "
                            "communicators plan with the same table");
  bench_note("every schedule runs once per repetition, in turn, each timed on its own; %d timed "
             "repetitions after %d warm-up rounds; #wrong: all schedules' outputs checked",
             o->planner_iters, o->planner_warmup);
  if (st->rows > 0)
    bench_note("adaptive <= 1.03 x min(fixed, no_ovl) in %d of %d rows (< 0.97 x in %d); "
               "geometric mean %.3f; worst %.3f at %s",
               st->within, st->rows, st->beat, exp(st->lsum / st->rows), st->worst, st->worst_at);
  if (o->cuda)
    bench_note("all P ranks share one GPU: 'peer' copies are device-local and the ranks' GEMMs "
               "share its SMs; not a multi-GPU measurement (for that, see tpflex plan --project)");
  else
    bench_note("simulator: CPU times of a host simulator (its GEMM is a CPU loop); they exercise "
               "the path, they do not predict a GPU");
}

/* Section 6b: the model against every measured schedule of the planner table's runs. */
static void planner_model_table(const pl_entry *ents, int nent) {
  static const char *const mcols[] = {
      "op",        "P",        "N",   "T",        "measured(us)", "predicted(us)",
      "pred/meas", "schedule", "src", "plan(us)", "plan/meas"};
  bench_table("planner_model",
              "Section 6b: the cost model against every measured schedule (same runs)", 11, mcols);
  double abs_sum = 0;
  int nabs = 0, nabs2k = 0, ntuned = 0;
  enum { NE = 3 * 2 * 2 * BENCH_MAX_TS * BENCH_MAX_VARIANTS };
  static double errs[NE], errs2k[NE], terrs[NE];
  for (int i = 0; i < nent; i++) {
    const pl_entry *e = &ents[i];
    bench_cell_s(op_row(e->op));
    bench_cell_i(e->P);
    bench_cell_i((long long)e->N);
    bench_cell_i((long long)e->T);
    bench_cell_f(e->meas, 1);
    bench_cell_f(e->pred, 1);
    bench_cell_f(e->pred / e->meas, 3);
    bench_cell_s(e->label);
    bench_cell_s(tpf_plan_source_name(e->src));
    bench_cell_f(e->tuned, 1);
    bench_cell_f(e->tuned / e->meas, 3);
    bench_row_end();
    double r = e->pred / e->meas;
    if (!isnan(r) && r > 0) {
      errs[nabs++] = fabs(r - 1);
      abs_sum += fabs(r - 1);
      if (e->T >= 2048) errs2k[nabs2k++] = fabs(r - 1);
    }
    double q = e->tuned / e->meas;
    if (e->src != TPF_PLAN_SRC_MODEL && !isnan(q) && q > 0) terrs[ntuned++] = fabs(q - 1);
  }
  if (nabs > 0)
    bench_note("|pred/meas - 1| over %d schedules: median %.1f %%, mean %.1f %%", nabs,
               100 * bench_median(errs, nabs), 100 * abs_sum / nabs);
  if (nabs2k > 0)
    bench_note("model |pred/meas - 1| for T >= 2048 over %d schedules: median %.1f %% (target: "
               "within 15 %%)",
               nabs2k, 100 * bench_median(errs2k, nabs2k));
  if (ntuned > 0)
    bench_note("sched points (src measured or scaled) |plan/meas - 1| over %d schedules: median "
               "%.1f %% (the calibration run against this one: run-to-run spread, not the model)",
               ntuned, 100 * bench_median(terrs, ntuned));
}

/* A group of P ranks whose timing storage holds every variant of every repetition. */
static tpf_status planner_group_create(const bench_opts *o, int P, bench_group **g) {
  bench_opts og = *o;
  og.iters = o->planner_iters * BENCH_MAX_VARIANTS;
  return bench_group_create(&og, P, g);
}

int bench_section_planner(const bench_opts *o) {
  planner_table(o);
  uint64_t ts[BENCH_MAX_TS];
  const int nts = t_sweep(o, ts);
  pl_state st = {0};
  st.ents = calloc(3 * PL_NOPS * 2 * BENCH_MAX_TS * BENCH_MAX_VARIANTS, sizeof *st.ents);
  tpf_cost_table *model = malloc(sizeof *model);
  if (!st.ents || !model) {
    bench_note("FAILED: no memory");
    free(st.ents);
    free(model);
    return 1;
  }
  static const int Ps[] = {2, 4, 8};
  for (size_t pi = 0; pi < 3; pi++) {
    const int P = Ps[pi];
    if (P > o->tp && P > 2) continue;
    bench_cost_model(o, model); /* --model shared: as P ranks on one device see it */
    bench_group *g = NULL;
    tpf_status gs = planner_group_create(o, P, &g);
    if (gs != TPF_OK) {
      bench_note("FAILED: group of %d: %s (%s)", P, tpf_status_name(gs), tpf_last_error());
      st.rc = 1;
      continue;
    }
    planner_group(&st, o, g, P, model, ts, nts);
    bench_group_destroy(g);
  }
  free(model);
  planner_notes(o, &st);
  planner_model_table(st.ents, st.nent);
  free(st.ents);
  return st.rc;
}

/* ---- measured schedule points (tpflex calibrate --schedules) ------------------------------- */

/* The measured times of v's first nvar variants (every legal, timed T) as sched points of t.
 * 0, or 1 with err set when t is full. */
static int sched_points(tpf_cost_table *t, const bench_variants *v, int op, int P, uint64_t N,
                        int nvar, char *err, size_t errlen) {
  for (int k = 0; k < nvar; k++)
    for (int i = 0; i < v->nts; i++) {
      if (!v->legal[k][i] || !(v->us[k][i] > 0)) continue; /* not run (or not timed) */
      if (t->nsched >= TPF_COST_MAX_SCHED_POINTS) {
        snprintf(err, errlen, "more than %d sched points (TPF_COST_MAX_SCHED_POINTS)",
                 TPF_COST_MAX_SCHED_POINTS);
        return 1;
      }
      tpf_cost_sched_point *p = &t->sched[t->nsched++];
      memset(p, 0, sizeof *p);
      p->shared = true; /* bench groups run every rank on the one device */
      p->algo = v->algo;
      p->coll = op_coll(op);
      p->tp_size = P;
      p->num_splits = v->splits[k];
      p->aggregate = is_aggr(op, P, v->splits[k]);
      p->dtype = TPF_BF16;
      p->hidden = v->H;
      p->n = N;
      p->rows = v->ts[i];
      p->us = v->us[k][i];
    }
  return 0;
}

int bench_planner_sched(const bench_opts *o, tpf_cost_table *t, char *err, size_t errlen) {
  uint64_t ts[BENCH_MAX_TS];
  const int nts = t_sweep(o, ts);
  int before = t->nsched;
  err[0] = '\0';
  static const int Ps[] = {2, 4, 8};
  for (size_t pi = 0; pi < 3; pi++) {
    const int P = Ps[pi];
    if (P > o->tp && P > 2) continue;
    bench_group *g = NULL;
    tpf_status st = planner_group_create(o, P, &g);
    if (st != TPF_OK) {
      snprintf(err, errlen, "group of %d ranks: %s (%s)", P, tpf_status_name(st), tpf_last_error());
      return 1;
    }
    for (int op = 0; op < PL_NOPS; op++)
      for (int ni = 0; ni < o->pnns; ni++) {
        const uint64_t N = o->pns[ni];
        bench_variants *v = calloc(1, sizeof *v);
        if (!v) {
          bench_group_destroy(g);
          snprintf(err, errlen, "no memory");
          return 1;
        }
        const char *names[BENCH_MAX_VARIANTS];
        const int nvar = variants_of(o, op, P, N, ts, nts, false, v, names);
        v->cost = NULL; /* FIXED: every variant names its split count */
        bench_progress("[schedules] P=%d %s N=%llu: %d schedules x %d values of T", P, op_name(op),
                       (ull)N, nvar, v->nts);
        st = bench_run_variants(g, v);
        int bad_t = -1; /* a T with wrong elements: its times are not written */
        for (int i = 0; i < v->nts && bad_t < 0; i++)
          if (v->wrong[i] != 0) bad_t = i;
        if (st != TPF_OK || bad_t >= 0) {
          if (st != TPF_OK)
            snprintf(err, errlen, "P=%d %s N=%llu: %s", P, op_name(op), (ull)N, v->err);
          else
            snprintf(err, errlen, "P=%d %s N=%llu T=%llu: %lld wrong elements", P, op_name(op),
                     (ull)N, (ull)v->ts[bad_t], v->wrong[bad_t]);
          free(v);
          bench_group_destroy(g);
          return 1;
        }
        if (sched_points(t, v, op, P, N, nvar, err, errlen) != 0) {
          free(v);
          bench_group_destroy(g);
          return 1;
        }
        free(v);
      }
    bench_group_destroy(g);
  }
  bench_progress_done();
  if (t->nsched == before) {
    snprintf(err, errlen, "no schedule could be measured (no legal T for this grid)");
    return 1;
  }
  return 0;
}
