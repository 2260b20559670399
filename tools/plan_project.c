/* tpflex plan --project: the multi-GPU PROJECTION, the predicted overlap efficiency and speedup
 * over no overlap of a grid of operations, T and N on a cost table (predicted, never measured).
 */
#include "plan.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tpflex/tpflex.h"
#include "tpflex/tpflex_cost.h"

#include "cli_args.h"

/* ---- --project: predicted overlap efficiency and speedup over a grid ---- */

/* The candidate a FIXED communicator with num_splits 0 runs (RING: P; PIPELINE: 4 when it is a
 * candidate, else 1), or -1. */
static int default_candidate(const tpf_plan_result *r, tpf_algo algo, int P) {
  int want = algo == TPF_ALGO_RING ? P : 4;
  for (int i = 0; i < r->ncand; i++)
    if (!r->cand[i].baseline && !r->cand[i].aggregate && r->cand[i].num_splits == want) return i;
  for (int i = 0; i < r->ncand; i++)
    if (r->cand[i].runnable && r->cand[i].num_splits == 1) return i;
  return -1;
}

/* v with prec decimals, or "n/a" for NaN (a value that does not exist for this row). */
static void fmt_or_na(char *buf, size_t len, double v, int prec) {
  if (isnan(v))
    snprintf(buf, len, "n/a");
  else
    snprintf(buf, len, "%.*f", prec, v);
}

/* One row of the projection: computed first, so that the choice column fits the longest
 * label. */
typedef struct {
  char op[16];
  uint64_t N, T;
  bool ok;
  char err[300];
  double gemm, comm, serial, fixed, planned, e, ef, sp;
  char choice[sizeof(((tpf_plan_candidate *)0)->label)];
} prow;

/* The projection's header: what is projected, with which table, and how to read the columns. */
static void project_header(const plan_args *a, const tpf_cost_table *t, const char *used) {
  printf("PROJECTION (predicted by the cost model, not measured): P=%d ranks, each on its own GPU, "
         "C=%llu, H=%llu, %s\n",
         a->d.tp_size, (ull)a->d.capacity.rows, (ull)a->d.capacity.cols,
         tpf_dtype_name(a->d.dtype));
  printf("cost table: %s\n", used);
  for (int i = 0; i < a->nops; i++) { /* the notes of the first RS op (if any) say it all */
    tpf_layout_desc d = a->d;
    d.coll = a->pcoll[i];
    if (i == a->nops - 1 || d.coll == TPF_COLL_RS) {
      plan_priced_notes(t, &d);
      break;
    }
  }
  printf("links: peer %.2f us + bytes / %.1f GB/s (the table's 'copy peer': in the shipped H200 "
         "table the documented NVLink4 parameter, 374 GB/s per direction), local %.2f us + %.1f "
         "GB/s, reduce %.2f us + %.1f GB/s; launch %.2f us/step, handshake %.2f us\n",
         t->peer.latency_us, t->peer.gbps, t->local.latency_us, t->local.gbps, t->reduce.latency_us,
         t->reduce.gbps, t->launch_us, t->handshake_us);
  printf(
      "gemm = the no-overlap schedule's one GEMM of all T rows (AG [T,H]x[N,H]^T, RS "
      "[T,N]x[H,N]^T: K = N); serial = the no-overlap schedule (RING AG: splits 1, the exchange, "
      "then the GEMM; RING RS: the faster of splits 1 (the GEMM of all rows, then the ring "
      "exchange) and the pull (the GEMM, then each rank sums its rows from every peer); "
      "PIPELINE RS: splits 1, the GEMM, then the pull reduce-scatter); comm = serial - gemm "
      "(handshake, launches, copies, reduction);\n");
  printf("planned = the planner's choice; fixed = the default split count (RING P, PIPELINE 4); "
         "E = (gemm + comm - t) / min(gemm, comm) for t = planned (E) and fixed (E_fixed); "
         "speedup = serial / planned; E > 1 where the chunked GEMMs are predicted faster than the "
         "one GEMM, E < 0 where the schedule is predicted slower than no overlap\n");
}

/* The projected row of layout d (active T rows) and GEMM width N; w->ok false with w->err when it
 * cannot be projected. */
static void project_row(const tpf_cost_table *t, const tpf_layout_desc *asked, uint64_t N,
                        prow *w) {
  tpf_layout_desc pd;
  const tpf_dtype x = plan_priced_desc(asked, &pd);
  const tpf_layout_desc *d = &pd;
  const uint64_t T = d->active.rows, H = d->capacity.cols;
  w->N = N;
  w->T = T;
  tpf_gemm_dims g = {T, d->coll == TPF_COLL_AG ? N : H, d->coll == TPF_COLL_AG ? H : N};
  snprintf(w->op, sizeof w->op, "%s %s", tpf_algo_name(d->algo), tpf_coll_name(d->coll));
  tpf_plan_result r;
  tpf_status rc = tpf_layout_check(d);
  if (rc == TPF_OK) rc = tpf_plan_predict_x(t, d, &g, x, &r);
  if (rc == TPF_OK && r.baseline < 0) rc = TPF_EUNSUPPORTED;
  double gemm = 0;
  if (rc == TPF_OK) rc = tpf_cost_gemm_us(t, x, g.m, g.n, g.k, &gemm);
  if (rc != TPF_OK) {
    snprintf(w->err, sizeof w->err, "%s: %s", tpf_status_name(rc), tpf_last_error());
    return;
  }
  const tpf_plan_candidate *ch = &r.cand[r.chosen];
  const int fi = default_candidate(&r, d->algo, d->tp_size);
  /* PIPELINE with one block is its own no-overlap schedule (the GEMM, then the pull
   * reduce-scatter), the one tpflex bench measures; the priced RS baseline models a ring
   * exchange instead. */
  int si = r.baseline;
  for (int i = 0; d->algo == TPF_ALGO_PIPELINE && i < r.ncand; i++)
    if (r.cand[i].runnable && !r.cand[i].baseline && r.cand[i].num_splits == 1) si = i;
  w->ok = true;
  w->gemm = gemm;
  w->serial = r.cand[si].predicted_us;
  w->comm = w->serial - gemm;
  w->planned = ch->predicted_us;
  w->fixed = fi >= 0 ? r.cand[fi].predicted_us : NAN;
  double lo = gemm < w->comm ? gemm : w->comm;
  w->e = lo > 0 ? (w->serial - w->planned) / lo : NAN;
  w->ef = lo > 0 ? (w->serial - w->fixed) / lo : NAN;
  w->sp = w->serial / w->planned;
  snprintf(w->choice, sizeof w->choice, "%s", ch->label);
}

/* The table of the n rows (choice column cw wide) and its summary; the exit status. */
static int project_print(const prow *pr, int n, int cw) {
  printf("%-12s %6s %7s %10s %10s %10s %10s %11s  %-*s %7s %7s %8s\n", "op", "N", "T", "gemm(us)",
         "comm(us)", "serial(us)", "fixed(us)", "planned(us)", cw, "choice", "E", "E_fixed",
         "speedup");
  int rows = 0, skipped = 0;
  double emin = 1e300, emax = -1e300, smin = 1e300, smax = -1e300;
  for (int i = 0; i < n; i++) {
    const prow *w = &pr[i];
    if (!w->ok) {
      printf("%-12s %6llu %7llu  not projected: %s\n", w->op, (ull)w->N, (ull)w->T, w->err);
      skipped++;
      continue;
    }
    char fixed[24], e[24], ef[24]; /* n/a: no default candidate, or no overlap to measure E by */
    fmt_or_na(fixed, sizeof fixed, w->fixed, 1);
    fmt_or_na(e, sizeof e, w->e, 3);
    fmt_or_na(ef, sizeof ef, w->ef, 3);
    printf("%-12s %6llu %7llu %10.1f %10.1f %10.1f %10s %11.1f  %-*s %7s %7s %8.3f\n", w->op,
           (ull)w->N, (ull)w->T, w->gemm, w->comm, w->serial, fixed, w->planned, cw, w->choice, e,
           ef, w->sp);
    rows++;
    if (!isnan(w->e) && w->e < emin) emin = w->e;
    if (!isnan(w->e) && w->e > emax) emax = w->e;
    if (w->sp < smin) smin = w->sp;
    if (w->sp > smax) smax = w->sp;
  }
  char erange[64] = "n/a";
  if (emin <= emax) snprintf(erange, sizeof erange, "%.3f .. %.3f", emin, emax);
  if (rows > 0)
    printf("summary: %d rows%s; planned E %s, speedup over no overlap %.3f .. %.3f "
           "(PROJECTION: predicted, not measured)\n",
           rows, skipped ? " (some not projected, see above)" : "", erange, smin, smax);
  else
    printf("summary: nothing could be projected\n");
  return rows > 0 ? 0 : 1;
}

int plan_project(const cli_ctx *ctx, const plan_args *a) {
  static tpf_cost_table t;
  static char used[1024];
  int lrc = cli_load_cost(ctx, "--cost", a->cost, "h200.txt", &t, used, sizeof used);
  if (lrc >= 0) return lrc;
  project_header(a, &t, used);
  const int nrows = a->nops * a->nns * a->nts;
  prow *pr = calloc((size_t)(nrows > 0 ? nrows : 1), sizeof *pr);
  if (!pr) {
    fprintf(stderr, "tpflex plan: out of memory\n");
    return 1;
  }
  int n = 0, cw = (int)strlen("choice");
  for (int oi = 0; oi < a->nops; oi++)
    for (int ni = 0; ni < a->nns; ni++)
      for (int ti = 0; ti < a->nts; ti++) {
        prow *w = &pr[n++];
        tpf_layout_desc d = a->d;
        d.algo = a->palgo[oi];
        d.coll = a->pcoll[oi];
        d.active.rows = a->ts[ti];
        project_row(&t, &d, a->ns[ni], w);
        if (w->ok && (int)strlen(w->choice) > cw) cw = (int)strlen(w->choice);
      }
  int rc = project_print(pr, n, cw);
  free(pr);
  return rc;
}
