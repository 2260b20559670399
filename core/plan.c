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

static void free_all(tpf_schedule *s, int n) {
  for (int q = 0; q < n; q++)
    tpf_schedule_free(&s[q]);
}

/* Replays candidate (splits, aggregate) of d; TPF_OK with *us, or the build/replay status. */
static tpf_status predict_schedule(const tpf_cost_table *t, const tpf_layout_desc *d,
                                   const tpf_gemm_dims *g, int splits, bool aggregate, double *us) {
  int p = d->tp_size;
  tpf_schedule *s = tpf__calloc((size_t)p, sizeof *s);
  TPF_RETURN_IF(!s, TPF_ENOMEM, "plan: out of memory for %d schedules", p);
  tpf_status rc = TPF_OK;
  int built = 0, max_steps = 0;
  for (int q = 0; q < p && rc == TPF_OK; q++) {
    tpf_layout_desc dq = *d;
    dq.rank = q;
    dq.num_splits = splits;
    dq.aggregate = aggregate;
    rc = tpf_schedule_build(&dq, g, &s[q]);
    if (rc == TPF_OK) {
      built++;
      if (s[q].nsteps > max_steps) max_steps = s[q].nsteps;
    }
  }
  tpf_cost_span *sp = NULL;
  if (rc == TPF_OK) {
    sp = tpf__calloc((size_t)p * (size_t)max_steps, sizeof *sp);
    rc = sp ? tpf_cost_predict(t, s, p, sp, max_steps, us)
            : tpf_set_error(TPF_ENOMEM, "plan: out of memory for the replay");
  }
  tpf__free(sp);
  free_all(s, built);
  tpf__free(s);
  return rc;
}

static double link_us(const tpf_cost_link *l, double bytes) {
  return l->latency_us + bytes / (l->gbps * 1e3);
}

/* One GEMM of all T rows, then P-1 peer copies of S_T and a reduction of P partials. */
static tpf_status rs_baseline(const tpf_cost_table *t, const tpf_layout_desc *d,
                              const tpf_gemm_dims *g, double *us) {
  double e = (double)tpf_dtype_size(d->dtype), rows = (double)d->active.rows;
  double p = (double)d->tp_size, h = (double)d->capacity.cols, gemm = 0;
  TPF_CHECK(tpf_cost_gemm_us(t, d->dtype, d->active.rows, d->capacity.cols, g->k, &gemm));
  double chunk = rows / p * h * e;
  double c = t->launch_us + t->handshake_us + t->launch_us + gemm;
  c += (p - 1) * (t->launch_us + link_us(&t->peer, chunk));
  c += t->launch_us + link_us(&t->reduce, p * chunk);
  *us = c;
  return TPF_OK;
}

static void add(tpf_plan_result *r, tpf_algo algo, int splits, bool aggregate, bool baseline,
                double us, const char *label) {
  tpf_plan_candidate *c = &r->cand[r->ncand++];
  memset(c, 0, sizeof *c);
  c->algo = algo;
  c->num_splits = splits;
  c->aggregate = aggregate;
  c->baseline = baseline;
  c->predicted_us = us;
  snprintf(c->label, sizeof c->label, "%s", label);
}

tpf_status tpf_plan_predict(const tpf_cost_table *t, const tpf_layout_desc *d,
                            const tpf_gemm_dims *g, tpf_plan_result *out) {
  TPF_RETURN_IF(!t || !d || !g || !out, TPF_EINVAL, "plan: NULL argument");
  TPF_CHECK(tpf_layout_check(d));
  tpf_plan_result r;
  memset(&r, 0, sizeof r);
  r.baseline = -1;
  int p = d->tp_size;
  double us = 0;
  char label[40];
  if (d->algo == TPF_ALGO_RING && d->coll == TPF_COLL_AG) {
    TPF_CHECK(predict_schedule(t, d, g, p, false, &us));
    snprintf(label, sizeof label, "ring ag splits %d", p);
    add(&r, d->algo, p, false, false, us, label);
    if (p % 2 == 0 && p >= 4) {
      TPF_CHECK(predict_schedule(t, d, g, p / 2, true, &us));
      snprintf(label, sizeof label, "ring ag aggregate splits %d", p / 2);
      add(&r, d->algo, p / 2, true, false, us, label);
    }
    TPF_CHECK(predict_schedule(t, d, g, 1, false, &us));
    r.baseline = r.ncand;
    add(&r, d->algo, 1, false, true, us, "baseline: ag, then one gemm");
  } else if (d->algo == TPF_ALGO_RING) {
    TPF_CHECK(predict_schedule(t, d, g, p, false, &us));
    snprintf(label, sizeof label, "ring rs splits %d", p);
    add(&r, d->algo, p, false, false, us, label);
  } else if (d->algo == TPF_ALGO_PIPELINE) {
    static const int S[] = {8, 4, 2, 1}; /* most split first: later = simpler */
    for (size_t i = 0; i < sizeof S / sizeof *S; i++) {
      tpf_layout_desc ds = *d;
      ds.num_splits = S[i];
      if (tpf_layout_check(&ds) != TPF_OK) continue; /* H % S or alignment: not a candidate */
      TPF_CHECK(predict_schedule(t, d, g, S[i], false, &us));
      snprintf(label, sizeof label, "pipeline rs splits %d", S[i]);
      add(&r, d->algo, S[i], false, false, us, label);
    }
  } else {
    TPF_CHECK(predict_schedule(t, d, g, d->num_splits, false, &us));
    snprintf(label, sizeof label, "bulk %s", tpf_coll_name(d->coll));
    add(&r, d->algo, 0, false, false, us, label);
  }
  if (d->coll == TPF_COLL_RS && d->algo != TPF_ALGO_BULK) {
    TPF_CHECK(rs_baseline(t, d, g, &us));
    r.baseline = r.ncand;
    add(&r, d->algo, 1, false, true, us, "baseline: one gemm, then rs");
  }
  /* Fastest wins; of those within 0.5 % of the fastest, the last listed (the simplest). */
  double fastest = r.cand[0].predicted_us;
  for (int i = 1; i < r.ncand; i++)
    if (r.cand[i].predicted_us < fastest) fastest = r.cand[i].predicted_us;
  int best = 0;
  for (int i = 0; i < r.ncand; i++)
    if (r.cand[i].predicted_us <= fastest * 1.005) best = i;
  r.chosen = best;
  int second = -1;
  for (int i = 0; i < r.ncand; i++)
    if (i != best && (second < 0 || r.cand[i].predicted_us < r.cand[second].predicted_us))
      second = i;
  if (second < 0)
    snprintf(r.why, sizeof r.why, "%s: %.1f us, the only schedule", r.cand[best].label,
             r.cand[best].predicted_us);
  else
    snprintf(r.why, sizeof r.why, "%s: %.1f us, %.3fx the next best (%s, %.1f us)",
             r.cand[best].label, r.cand[best].predicted_us,
             r.cand[best].predicted_us / r.cand[second].predicted_us, r.cand[second].label,
             r.cand[second].predicted_us);
  *out = r;
  return TPF_OK;
}
