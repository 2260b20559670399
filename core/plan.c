/* The planner's candidates and their predicted times (include/tpflex/tpflex_cost.h).
 *
 * Method: for each candidate the communicator's algorithm admits, build every rank's schedule
 * with the candidate's split count, replay them with the cost model, keep the latest end. The RS
 * baseline (one GEMM, then the reduce-scatter) is not a schedule tpflex runs, so it is priced
 * from the same table by formula. The AG baseline is a schedule (splits 1) and is replayed.
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

/* Replays candidate (splits, aggregate) of d in w; TPF_OK with *us, or the build/replay status. */
static tpf_status predict_schedule(const tpf_cost_table *t, const tpf_layout_desc *d,
                                   const tpf_gemm_dims *g, int splits, bool aggregate, workspace *w,
                                   double *us) {
  for (int q = 0; q < w->p; q++) {
    tpf_layout_desc dq = *d;
    dq.rank = q;
    dq.num_splits = splits;
    dq.aggregate = aggregate;
    TPF_CHECK(tpf__schedule_build_into(&dq, g, w->steps + (size_t)q * (size_t)w->max_steps,
                                       w->max_steps, &w->s[q]));
  }
  return tpf_cost_predict(t, w->s, w->p, w->sp, w->max_steps, us);
}

static void add(tpf_plan_result *r, tpf_algo algo, int splits, bool aggregate, bool baseline,
                bool runnable, double us, const char *label) {
  tpf_plan_candidate *c = &r->cand[r->ncand++];
  memset(c, 0, sizeof *c);
  c->algo = algo;
  c->num_splits = splits;
  c->aggregate = aggregate;
  c->baseline = baseline;
  c->predicted_us = us;
  c->runnable = runnable;
  snprintf(c->label, sizeof c->label, "%s", label);
}

static tpf_status plan(const tpf_cost_table *t, const tpf_layout_desc *d, const tpf_gemm_dims *g,
                       workspace *w, tpf_plan_result *out) {
  tpf_plan_result r;
  memset(&r, 0, sizeof r);
  r.baseline = -1;
  int p = d->tp_size;
  double us = 0;
  char label[40];
  if (d->algo == TPF_ALGO_RING && d->coll == TPF_COLL_AG) {
    TPF_CHECK(predict_schedule(t, d, g, p, false, w, &us));
    snprintf(label, sizeof label, "ring ag splits %d", p);
    add(&r, d->algo, p, false, false, true, us, label);
    if (p % 2 == 0 && p >= 4) {
      TPF_CHECK(predict_schedule(t, d, g, p / 2, true, w, &us));
      snprintf(label, sizeof label, "ring ag aggregate splits %d", p / 2);
      add(&r, d->algo, p / 2, true, false, true, us, label);
    }
    TPF_CHECK(predict_schedule(t, d, g, 1, false, w, &us));
    r.baseline = r.ncand;
    add(&r, d->algo, 1, false, true, true, us, "baseline: ag, then one gemm");
  } else if (d->algo == TPF_ALGO_RING) {
    TPF_CHECK(predict_schedule(t, d, g, p, false, w, &us));
    snprintf(label, sizeof label, "ring rs splits %d", p);
    add(&r, d->algo, p, false, false, true, us, label);
    if (p > 1) { /* the no-overlap ring: every partial in one GEMM, then the exchange */
      TPF_CHECK(predict_schedule(t, d, g, 1, false, w, &us));
      r.baseline = r.ncand;
      add(&r, d->algo, 1, false, true, true, us, "baseline: one gemm, then rs");
    }
  } else if (d->algo == TPF_ALGO_PIPELINE) {
    static const int S[] = {8, 4, 2, 1}; /* most split first: later = simpler */
    for (size_t i = 0; i < sizeof S / sizeof *S; i++) {
      tpf_layout_desc ds = *d;
      ds.num_splits = S[i];
      if (tpf_layout_check(&ds) != TPF_OK) continue; /* H % S or alignment: not a candidate */
      TPF_CHECK(predict_schedule(t, d, g, S[i], false, w, &us));
      snprintf(label, sizeof label,
               S[i] == 1 ? "baseline: pipeline splits 1" : "pipeline rs splits %d", S[i]);
      if (S[i] == 1) r.baseline = r.ncand; /* one block: the GEMM, then the pull RS */
      add(&r, d->algo, S[i], false, S[i] == 1, true, us, label);
    }
  } else {
    TPF_CHECK(predict_schedule(t, d, g, d->num_splits, false, w, &us));
    snprintf(label, sizeof label, "bulk %s", tpf_coll_name(d->coll));
    add(&r, d->algo, 0, false, false, true, us, label);
  }
  /* The fastest runnable wins; of those within 0.5 % of it, the last listed (the simplest). */
  double fastest = -1;
  for (int i = 0; i < r.ncand; i++)
    if (r.cand[i].runnable && (fastest < 0 || r.cand[i].predicted_us < fastest))
      fastest = r.cand[i].predicted_us;
  int best = 0;
  for (int i = 0; i < r.ncand; i++)
    if (r.cand[i].runnable && r.cand[i].predicted_us <= fastest * 1.005) best = i;
  r.chosen = best;
  int second = -1;
  for (int i = 0; i < r.ncand; i++)
    if (i != best && (second < 0 || r.cand[i].predicted_us < r.cand[second].predicted_us))
      second = i;
  const tpf_plan_candidate *b = &r.cand[best];
  if (second < 0)
    snprintf(r.why, sizeof r.why, "%s: %.1f us, the only schedule", b->label, b->predicted_us);
  else if (!r.cand[second].runnable && r.cand[second].predicted_us < b->predicted_us)
    snprintf(r.why, sizeof r.why,
             "%s: %.1f us, the fastest tpflex runs (%s would take %.1f us, %.3fx)", b->label,
             b->predicted_us, r.cand[second].label, r.cand[second].predicted_us,
             b->predicted_us / r.cand[second].predicted_us);
  else
    snprintf(r.why, sizeof r.why, "%s: %.1f us, %.3fx the next best (%s, %.1f us)", b->label,
             b->predicted_us, b->predicted_us / r.cand[second].predicted_us, r.cand[second].label,
             r.cand[second].predicted_us);
  *out = r;
  return TPF_OK;
}

tpf_status tpf_plan_predict(const tpf_cost_table *t, const tpf_layout_desc *d,
                            const tpf_gemm_dims *g, tpf_plan_result *out) {
  TPF_RETURN_IF(!t || !d || !g || !out, TPF_EINVAL, "plan: NULL argument");
  TPF_CHECK(tpf_layout_check(d));
  workspace w;
  TPF_CHECK(ws_alloc(&w, d));
  tpf_status rc = plan(t, d, g, &w, out);
  ws_free(&w);
  return rc;
}

/* ---- an adaptive communicator's planner: a copy of the table, a workspace and a cache ----- */

typedef struct {
  uint64_t rows, n, k; /* key; rows 0 = empty entry */
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

tpf_status tpf__planner_apply(tpf_planner *p, tpf_layout_desc *d, const tpf_gemm_dims *g) {
  int hit = -1;
  for (int i = 0; i < TPF_PLAN_CACHE && hit < 0; i++)
    if (p->cache[i].rows == d->active.rows && p->cache[i].n == g->n && p->cache[i].k == g->k)
      hit = i;
  if (hit < 0) {
    cache_entry *e = &p->cache[p->next];
    e->rows = 0; /* invalid until planned */
    TPF_CHECK(plan(&p->table, d, g, &p->w, &e->r));
    e->rows = d->active.rows;
    e->n = g->n;
    e->k = g->k;
    hit = p->next;
    p->next = (p->next + 1) % TPF_PLAN_CACHE;
  }
  const tpf_plan_candidate *c = &p->cache[hit].r.cand[p->cache[hit].r.chosen];
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
