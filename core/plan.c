/* The planner's candidates and their predicted times (include/tpflex/tpflex_cost.h).
 *
 * Method: for each candidate the communicator's algorithm admits, build every rank's schedule
 * with the candidate's split count, replay them with the cost model, keep the latest end (the
 * model's time). Then, where the table has measured points of that candidate (sched lines),
 * its time comes from them: interpolated linearly in T between the two bracketing points, or,
 * outside the measured range, the model's time scaled by measured / model at the nearest
 * measured T (one more replay, at that T, in the same workspace). Everything depends only on
 * the table, the layout and the GEMM dims, so every rank computes the same.
 */
#include "tpflex/tpflex_cost.h"

#include "internal.h"

#include <stdio.h>
#include <string.h>

typedef unsigned long long ull;

/* Storage for planning one shape: P schedules of up to max_steps steps and their spans. */
typedef struct {
  int p, max_steps;
  tpf_schedule *s;   /* p */
  tpf_step *steps;   /* p * max_steps */
  tpf_cost_span *sp; /* p * max_steps */
} workspace;

static void ws_free(workspace *w) {
  tpf__free(w->s);
  tpf__free(w->steps);
  tpf__free(w->sp);
  memset(w, 0, sizeof *w);
}

static tpf_status ws_alloc(workspace *w, const tpf_layout_desc *d) {
  memset(w, 0, sizeof *w);
  tpf_layout_desc cap = *d;
  cap.active = d->capacity;
  w->p = d->tp_size;
  w->max_steps = tpf__schedule_max_steps(&cap);
  size_t n = (size_t)w->p * (size_t)w->max_steps;
  w->s = tpf__calloc((size_t)w->p, sizeof *w->s);
  w->steps = tpf__calloc(n, sizeof *w->steps);
  w->sp = tpf__calloc(n, sizeof *w->sp);
  if (!w->s || !w->steps || !w->sp) {
    ws_free(w);
    return tpf_set_error(TPF_ENOMEM, "plan: out of memory for %d schedules of %d steps", d->tp_size,
                         w->max_steps);
  }
  return TPF_OK;
}

/* What is planned: the layout, the GEMM dims and the dtype of the operation's x (the dtype of
 * GEMMs whose A is x; tpf_cost_predict_x). */
typedef struct {
  const tpf_layout_desc *d;
  const tpf_gemm_dims *g;
  tpf_dtype x;
} op_in;

/* Replays candidate (algo, splits, aggregate) of op->d in w; TPF_OK with *us, or the
 * build/replay status. algo is d's own, or PIPELINE for the pull baseline of a RING RS
 * communicator. */
static tpf_status predict_schedule(const tpf_cost_table *t, const op_in *op, tpf_algo algo,
                                   int splits, bool aggregate, workspace *w, double *us) {
  const tpf_layout_desc *d = op->d;
  for (int q = 0; q < w->p; q++) {
    tpf_layout_desc dq = *d;
    dq.rank = q;
    dq.algo = algo;
    dq.num_splits = splits;
    dq.aggregate = aggregate;
    TPF_CHECK(tpf__schedule_build_into(&dq, op->g, w->steps + (size_t)q * (size_t)w->max_steps,
                                       w->max_steps, &w->s[q]));
  }
  return tpf_cost_predict_x(t, w->s, w->p, op->x, w->sp, w->max_steps, us);
}

/* Whether the operation's GEMMs run on another dtype than the buffer's: an x of another dtype
 * where a GEMM reads x (RS and BULK; an all-gather GEMM reads the buffer). Measured schedule
 * points are keyed by the buffer's dtype and were measured with GEMMs of it: they do not apply
 * then. */
static bool gemm_dtype_differs(const op_in *op) {
  return op->x != op->d->dtype && (op->d->coll == TPF_COLL_RS || op->d->algo == TPF_ALGO_BULK);
}

const char *tpf_plan_source_name(tpf_plan_source s) {
  switch (s) {
  case TPF_PLAN_SRC_MODEL:
    return "model";
  case TPF_PLAN_SRC_MEASURED:
    return "measured";
  case TPF_PLAN_SRC_SCALED:
    return "scaled";
  default:
    return "?";
  }
}

/* The time of candidate (splits, aggregate) at d's T from the table's sched points, given its
 * model time there: *src MEASURED (interpolated), SCALED (model x measured / model at the
 * nearest measured T) or MODEL (no point; BULK; or the nearest T is no layout of d, e.g. beyond
 * its capacity, so there is nothing to scale by). Never fails: the model is always there. */
static void refine(const tpf_cost_table *t, const op_in *op, tpf_algo algo, int splits,
                   bool aggregate, double model_us, workspace *w, double *us,
                   tpf_plan_source *src) {
  const tpf_layout_desc *d = op->d;
  const tpf_gemm_dims *g = op->g;
  *us = model_us;
  *src = TPF_PLAN_SRC_MODEL;
  if (t->nsched == 0 || algo == TPF_ALGO_BULK) return; /* BULK: nothing to choose */
  if (gemm_dtype_differs(op)) return; /* e.g. fp8 GEMMs: the points timed the buffer's dtype */
  tpf_cost_sched_point key;
  memset(&key, 0, sizeof key);
  key.shared = t->shared_device != 0;
  key.algo = algo; /* the schedule's: a pull baseline takes PIPELINE points */
  key.coll = d->coll;
  key.tp_size = d->tp_size;
  key.num_splits = splits;
  key.aggregate = aggregate;
  key.dtype = d->dtype;
  key.hidden = d->active.cols;
  key.n = d->coll == TPF_COLL_AG ? g->n : g->k;
  key.rows = d->active.rows;
  int lo, hi;
  if (tpf__cost_sched_bracket(t, &key, &lo, &hi) == 0) return;
  if (lo >= 0 && hi >= 0) {
    const tpf_cost_sched_point *a = &t->sched[lo], *b = &t->sched[hi];
    *us = a->us;
    if (b->rows > a->rows)
      *us += (b->us - a->us) * (double)(key.rows - a->rows) / (double)(b->rows - a->rows);
    *src = TPF_PLAN_SRC_MEASURED;
    return;
  }
  /* One more replay, at the nearest measured T, in the same workspace (sized for the
   * capacity; the build checks the layout, so a T beyond it fails here and the model stays). */
  const tpf_cost_sched_point *near = &t->sched[lo >= 0 ? lo : hi];
  tpf_layout_desc dn = *d;
  dn.active.rows = near->rows;
  tpf_gemm_dims gn = *g;
  gn.m = near->rows;
  const op_in opn = {&dn, &gn, op->x};
  double model_near = 0; /* > 0: every schedule has a GEMM, and gemm points have us > 0 */
  if (predict_schedule(t, &opn, algo, splits, aggregate, w, &model_near) != TPF_OK) return;
  *us = model_us * near->us / model_near;
  *src = TPF_PLAN_SRC_SCALED;
}

/* Adds candidate (algo, splits, aggregate) with model time model_us, refined by the sched
 * points. */
static void add(const tpf_cost_table *t, const op_in *op, workspace *w, tpf_plan_result *r,
                tpf_algo algo, int splits, bool aggregate, bool baseline, double model_us,
                const char *label) {
  tpf_plan_candidate *c = &r->cand[r->ncand++];
  memset(c, 0, sizeof *c);
  c->algo = algo;
  c->num_splits = splits;
  c->aggregate = aggregate;
  c->baseline = baseline;
  c->model_us = model_us;
  c->runnable = true;
  snprintf(c->label, sizeof c->label, "%s", label);
  refine(t, op, algo, splits, aggregate, model_us, w, &c->predicted_us, &c->source);
}

static tpf_status plan(const tpf_cost_table *t, const op_in *op, workspace *w,
                       tpf_plan_result *out) {
  const tpf_layout_desc *d = op->d;
  tpf_plan_result r;
  memset(&r, 0, sizeof r);
  r.baseline = -1;
  int p = d->tp_size;
  double us = 0;
  char label[40];
  const tpf_algo own = d->algo;
  if (own == TPF_ALGO_RING && d->coll == TPF_COLL_AG) {
    TPF_CHECK(predict_schedule(t, op, own, p, false, w, &us));
    snprintf(label, sizeof label, "ring ag splits %d", p);
    add(t, op, w, &r, own, p, false, false, us, label);
    if (p % 2 == 0 && p >= 4) {
      TPF_CHECK(predict_schedule(t, op, own, p / 2, true, w, &us));
      snprintf(label, sizeof label, "ring ag aggregate splits %d", p / 2);
      add(t, op, w, &r, own, p / 2, true, false, us, label);
    }
    TPF_CHECK(predict_schedule(t, op, own, 1, false, w, &us));
    r.baseline = r.ncand;
    add(t, op, w, &r, own, 1, false, true, us, "baseline: ag, then one gemm");
  } else if (own == TPF_ALGO_RING) {
    TPF_CHECK(predict_schedule(t, op, own, p, false, w, &us));
    snprintf(label, sizeof label, "ring rs splits %d", p);
    add(t, op, w, &r, own, p, false, false, us, label);
    if (p > 1) { /* the no-overlap ring: every partial in one GEMM, then the exchange */
      TPF_CHECK(predict_schedule(t, op, own, 1, false, w, &us));
      r.baseline = r.ncand;
      add(t, op, w, &r, own, 1, false, true, us, "baseline: one gemm, then ring rs");
      /* The other no-overlap reduce-scatter: the one GEMM of all rows into the buffer, then
       * every rank pulls and sums its rows from all peers (PIPELINE with one block). Its bytes
       * (T x H) lie inside the RING RS layout's ((2P - 1) chunks of T/P rows), so a RING RS
       * communicator runs it on its own registration. Where it is the faster of the two, it is
       * the baseline that "never slower than no overlap" is measured against. */
      tpf_layout_desc dp = *d;
      dp.algo = TPF_ALGO_PIPELINE;
      dp.num_splits = 1;
      dp.aggregate = false;
      if (tpf_layout_check(&dp) == TPF_OK) {
        TPF_CHECK(predict_schedule(t, op, TPF_ALGO_PIPELINE, 1, false, w, &us));
        add(t, op, w, &r, TPF_ALGO_PIPELINE, 1, false, true, us,
            "baseline: one gemm, then pull rs");
        if (r.cand[r.ncand - 1].predicted_us <= r.cand[r.baseline].predicted_us)
          r.baseline = r.ncand - 1;
      }
    }
  } else if (own == TPF_ALGO_PIPELINE) {
    static const int S[] = {8, 4, 2, 1}; /* most split first: later = simpler */
    for (size_t i = 0; i < sizeof S / sizeof *S; i++) {
      tpf_layout_desc ds = *d;
      ds.num_splits = S[i];
      if (tpf_layout_check(&ds) != TPF_OK) continue; /* H % S or alignment: not a candidate */
      TPF_CHECK(predict_schedule(t, op, own, S[i], false, w, &us));
      snprintf(label, sizeof label,
               S[i] == 1 ? "baseline: pipeline splits 1" : "pipeline rs splits %d", S[i]);
      if (S[i] == 1) r.baseline = r.ncand; /* one block: the GEMM, then the pull RS */
      add(t, op, w, &r, own, S[i], false, S[i] == 1, us, label);
    }
  } else {
    TPF_CHECK(predict_schedule(t, op, own, d->num_splits, false, w, &us));
    snprintf(label, sizeof label, "bulk %s", tpf_coll_name(d->coll));
    add(t, op, w, &r, own, 0, false, false, us, label);
  }
  /* The fastest wins; of those within 0.5 % of it, the last listed (the simplest). Every
   * candidate is runnable. */
  double fastest = -1;
  for (int i = 0; i < r.ncand; i++)
    if (fastest < 0 || r.cand[i].predicted_us < fastest) fastest = r.cand[i].predicted_us;
  int best = 0;
  for (int i = 0; i < r.ncand; i++)
    if (r.cand[i].predicted_us <= fastest * 1.005) best = i;
  /* prefer_margin: the anchors are no overlap and the communicator's own split count (what a
   * fixed communicator runs). Another candidate replaces the better anchor only when predicted
   * faster by more than the margin, so that points within run-to-run spread do not decide. */
  bool anchored = false;
  if (t->prefer_margin > 0) {
    const int own_splits = tpf__layout_splits(d);
    int anchor = -1;
    for (int i = 0; i < r.ncand; i++) {
      const tpf_plan_candidate *c = &r.cand[i];
      const bool is_anchor = c->baseline || (c->algo == own && c->num_splits == own_splits &&
                                             c->aggregate == (d->aggregate != 0));
      if (is_anchor && (anchor < 0 || c->predicted_us < r.cand[anchor].predicted_us)) anchor = i;
    }
    if (anchor >= 0 && anchor != best &&
        r.cand[best].predicted_us > r.cand[anchor].predicted_us * (1.0 - t->prefer_margin)) {
      best = anchor;
      anchored = true;
    }
  }
  /* baseline_margin: leaving no overlap needs a predicted gain larger than the margin. */
  bool held = false;
  if (t->baseline_margin > 0 && !r.cand[best].baseline) {
    int bb = -1;
    for (int i = 0; i < r.ncand; i++)
      if (r.cand[i].baseline && (bb < 0 || r.cand[i].predicted_us < r.cand[bb].predicted_us))
        bb = i;
    if (bb >= 0 &&
        r.cand[best].predicted_us > r.cand[bb].predicted_us * (1.0 - t->baseline_margin)) {
      best = bb;
      held = true;
    }
  }
  r.chosen = best;
  int second = -1;
  for (int i = 0; i < r.ncand; i++)
    if (i != best && (second < 0 || r.cand[i].predicted_us < r.cand[second].predicted_us))
      second = i;
  const tpf_plan_candidate *b = &r.cand[best];
  if (second < 0)
    snprintf(r.why, sizeof r.why, "%s: %.1f us (%s), the only schedule", b->label, b->predicted_us,
             tpf_plan_source_name(b->source));
  else
    snprintf(r.why, sizeof r.why,
             "%s: %.1f us (%s); the next best, %s (%.1f us, %s), takes %.3fx as long%s", b->label,
             b->predicted_us, tpf_plan_source_name(b->source), r.cand[second].label,
             r.cand[second].predicted_us, tpf_plan_source_name(r.cand[second].source),
             r.cand[second].predicted_us / b->predicted_us,
             held       ? "; no overlap kept: the faster one is within baseline_margin"
             : anchored ? "; kept: the faster one is within prefer_margin"
                        : "");
  *out = r;
  return TPF_OK;
}

tpf_status tpf_plan_predict_x(const tpf_cost_table *t, const tpf_layout_desc *d,
                              const tpf_gemm_dims *g, tpf_dtype x_dtype, tpf_plan_result *out) {
  TPF_RETURN_IF(!t || !d || !g || !out, TPF_EINVAL, "plan: NULL argument");
  TPF_RETURN_IF((unsigned)x_dtype >= TPF_DTYPE_COUNT, TPF_EINVAL,
                "plan: x dtype %d is not a tpf_dtype", (int)x_dtype);
  TPF_CHECK(tpf_layout_check(d));
  workspace w;
  TPF_CHECK(ws_alloc(&w, d));
  const op_in op = {d, g, x_dtype};
  tpf_status rc = plan(t, &op, &w, out);
  ws_free(&w);
  return rc;
}

tpf_status tpf_plan_predict(const tpf_cost_table *t, const tpf_layout_desc *d,
                            const tpf_gemm_dims *g, tpf_plan_result *out) {
  TPF_RETURN_IF(!d, TPF_EINVAL, "plan: NULL argument");
  return tpf_plan_predict_x(t, d, g, d->dtype, out);
}

/* ---- an adaptive communicator's planner: a copy of the table, a workspace and a cache ----- */

typedef struct {
  uint64_t rows, n, k; /* key; rows 0 = empty entry */
  tpf_dtype x;         /* key: the operation's x dtype (gemm_rs with fp8 or wide x) */
  tpf_plan_result r;   /* the whole decision, so that tpf_comm_plan_info can show it */
} cache_entry;

struct tpf_planner {
  tpf_cost_table table;
  workspace w;
  cache_entry cache[TPF_PLAN_CACHE];
  int next; /* round-robin replacement */
  int last; /* the entry of the last operation, -1 before any */
};

tpf_status tpf__planner_create(const tpf_comm_config *cfg, const tpf_layout_desc *cap,
                               tpf_planner **out) {
  *out = NULL;
  if (cfg->plan == TPF_PLAN_FIXED) return TPF_OK;
  TPF_RETURN_IF(cfg->plan != TPF_PLAN_ADAPTIVE, TPF_EINVAL,
                "'%s': plan mode %d is not a tpf_plan_mode", cfg->name, (int)cfg->plan);
  TPF_RETURN_IF(!cfg->cost, TPF_EINVAL, "'%s': an adaptive communicator needs a cost table",
                cfg->name);
  /* Refused here rather than at every operation: a created adaptive communicator always plans
   * (fp8: on any table with a gemm point, tpf_cost_gemm_dtype). BULK is never planned. */
  tpf_dtype used;
  if (cfg->algo != TPF_ALGO_BULK && tpf_cost_gemm_dtype(cfg->cost, cfg->dtype, &used) != TPF_OK) {
    return tpf_prefix_error(TPF_EINVAL,
                            "'%s': an adaptive %s communicator's cost table cannot price its "
                            "GEMMs: ",
                            cfg->name, tpf_dtype_name(cfg->dtype));
  }
  /* The same for its transfers: every schedule of P > 1 sends to peers, and a reduce-scatter's
   * reduces (a table without those lines priced them at inf). */
  tpf_status lrc = TPF_OK;
  if (cfg->algo != TPF_ALGO_BULK && cap->tp_size > 1) {
    lrc = tpf__cost_link_check(cfg->cost, TPF_STEP_SEND);
    if (lrc == TPF_OK && cfg->coll == TPF_COLL_RS)
      lrc = tpf__cost_link_check(cfg->cost, TPF_STEP_REDUCE);
  }
  if (lrc != TPF_OK)
    return tpf_prefix_error(lrc,
                            "'%s': an adaptive communicator's cost table cannot price its "
                            "transfers: ",
                            cfg->name);
  tpf_planner *p = tpf__calloc(1, sizeof *p);
  TPF_RETURN_IF(!p, TPF_ENOMEM, "'%s': cannot allocate the planner", cfg->name);
  p->table = *cfg->cost;
  p->last = -1;
  tpf_status rc = ws_alloc(&p->w, cap);
  if (rc != TPF_OK) {
    tpf__free(p);
    return rc;
  }
  *out = p;
  return TPF_OK;
}

void tpf__planner_destroy(tpf_planner *p) {
  if (!p) return;
  ws_free(&p->w);
  tpf__free(p);
}

const tpf_cost_table *tpf__planner_table(const tpf_planner *p) {
  return &p->table;
}

tpf_status tpf__planner_apply(tpf_planner *p, tpf_layout_desc *d, const tpf_gemm_dims *g,
                              tpf_dtype x_dtype) {
  /* An all-gather GEMM reads the buffer: its x dtype does not matter (one entry per shape). */
  const tpf_dtype x = d->coll == TPF_COLL_AG && d->algo != TPF_ALGO_BULK ? d->dtype : x_dtype;
  int hit = -1;
  for (int i = 0; i < TPF_PLAN_CACHE && hit < 0; i++)
    if (p->cache[i].rows == d->active.rows && p->cache[i].n == g->n && p->cache[i].k == g->k &&
        p->cache[i].x == x)
      hit = i;
  if (hit < 0) {
    cache_entry *e = &p->cache[p->next];
    e->rows = 0; /* invalid until planned */
    const op_in op = {d, g, x};
    TPF_CHECK(plan(&p->table, &op, &p->w, &e->r));
    e->rows = d->active.rows;
    e->n = g->n;
    e->k = g->k;
    e->x = x;
    hit = p->next;
    p->next = (p->next + 1) % TPF_PLAN_CACHE;
  }
  const tpf_plan_candidate *c = &p->cache[hit].r.cand[p->cache[hit].r.chosen];
  d->algo = c->algo; /* a RING RS communicator may run the pull baseline (PIPELINE, 1 block) */
  d->num_splits = c->num_splits;
  d->aggregate = c->aggregate;
  p->last = hit;
  return TPF_OK;
}

tpf_status tpf__planner_last(const tpf_planner *p, tpf_plan_result *out) {
  if (p->last < 0)
    memset(out, 0, sizeof *out);
  else
    *out = p->cache[p->last].r;
  return TPF_OK;
}
