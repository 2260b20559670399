/* tpflex plan on a cost table: --predict (every planner candidate with its predicted time and
 * timeline, the choice and why; text or JSON) and --svg's two pictures (every rank's schedule on
 * the cost model's clock; predicted time against T per candidate), drawn by svg_plan.c.
 */
#include "plan.h"

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tpflex/tpflex.h"
#include "tpflex/tpflex_backend.h"
#include "tpflex/tpflex_cost.h"

#include "cli_args.h"
#include "svg.h"

/* ---- --predict: the planner's candidates on a cost table ---- */

static bool plan_fp8(tpf_dtype t) {
  return t == TPF_FP8_E4M3 || t == TPF_FP8_E5M2;
}

/* What --predict and --project price for layout in: *out, the layout, and the GEMMs' dtype
 * (returned: the operation's x, tpf_plan_predict_x). --dtype fp8 with rs means the reduce-scatter
 * site of an fp8 GEMM: an fp8 RS registration is refused at run time (SPEC §11), so its buffer
 * holds bf16 partials and its GEMMs take fp8 x and w. */
tpf_dtype plan_priced_desc(const tpf_layout_desc *in, tpf_layout_desc *out) {
  *out = *in;
  if (plan_fp8(in->dtype) && in->coll == TPF_COLL_RS) out->dtype = TPF_BF16;
  return in->dtype;
}

/* The lines saying what --predict / --project price, where that is not what was asked: the RS
 * site of an fp8 GEMM, and GEMMs priced on another dtype's points (tpf_cost_gemm_dtype). */
void plan_priced_notes(const tpf_cost_table *t, const tpf_layout_desc *in) {
  tpf_layout_desc d;
  const tpf_dtype x = plan_priced_desc(in, &d);
  if (d.dtype != in->dtype)
    printf("note: --dtype %s with rs is the reduce-scatter site of an %s GEMM: an fp8 RS buffer is "
           "refused at run time (SPEC 11), so the buffer holds %s partials (priced so) and the "
           "GEMMs take %s x and w\n",
           tpf_dtype_name(x), tpf_dtype_name(x), tpf_dtype_name(d.dtype), tpf_dtype_name(x));
  tpf_dtype pts;
  if (tpf_cost_gemm_dtype(t, x, &pts) != TPF_OK || pts == x) return;
  printf("note: the cost table has no %s gemm points: %s GEMMs are priced on its %s points (%s)\n",
         tpf_dtype_name(x), tpf_dtype_name(x), tpf_dtype_name(pts),
         plan_fp8(pts) ? "cuBLASLt on Hopper runs both fp8 kinds at one rate"
                       : "an upper bound: FP8 GEMMs are never slower on the devices we know; "
                         "`tpflex calibrate --backend cuda` measures fp8_e4m3 points");
}

/* Rank r's steps of one candidate with their predicted spans: text lines, or (json) the value of
 * the candidate's "timeline" key (null when it has none: a candidate priced by formula). */
static void print_timeline(const plan_args *a, const tpf_cost_table *t,
                           const tpf_plan_candidate *c) {
  int P = a->d.tp_size, r = a->only_rank < 0 ? 0 : a->only_rank;
  tpf_schedule *s = calloc((size_t)P, sizeof *s);
  int built = 0, max_steps = 0;
  tpf_status rc = s ? TPF_OK : TPF_ENOMEM;
  tpf_layout_desc pd;
  const tpf_dtype x = plan_priced_desc(&a->d, &pd);
  for (; rc == TPF_OK && built < P; built++) {
    tpf_layout_desc d = pd;
    d.rank = built;
    d.algo = c->algo; /* a RING RS communicator's pull baseline is PIPELINE */
    d.num_splits = c->num_splits;
    d.aggregate = c->aggregate;
    rc = tpf_schedule_build(&d, &a->g, &s[built]);
    if (rc != TPF_OK) break;
    if (s[built].nsteps > max_steps) max_steps = s[built].nsteps;
  }
  tpf_cost_span *sp = rc == TPF_OK ? calloc((size_t)P * (size_t)max_steps, sizeof *sp) : NULL;
  double total = 0;
  if (rc == TPF_OK && sp) rc = tpf_cost_predict_x(t, s, P, x, sp, max_steps, &total);
  if (a->json) {
    if (rc == TPF_OK && sp) {
      printf("{\"rank\":%d,\"steps\":[", r);
      for (int i = 0; i < s[r].nsteps; i++) {
        const tpf_step *st = &s[r].steps[i];
        char chunk[16] = "null";
        if (st->chunk >= 0) snprintf(chunk, sizeof chunk, "%d", (int)st->chunk);
        printf("%s{\"step\":%d,\"kind\":\"%s\",\"stream\":\"%s\",\"chunk\":%s,"
               "\"start_us\":%.3f,\"end_us\":%.3f}",
               i ? "," : "", i, tpf_step_kind_name(st->kind), tpf_stream_name(st->stream), chunk,
               sp[r * max_steps + i].start_us, sp[r * max_steps + i].end_us);
      }
      printf("]}");
    } else {
      printf("null");
    }
  } else if (rc == TPF_OK && sp) {
    printf("  timeline of rank %d (us; chunk '-': the step works on no one chunk):\n", r);
    for (int i = 0; i < s[r].nsteps; i++) {
      const tpf_step *st = &s[r].steps[i];
      char chunk[16] = "-";
      if (st->chunk >= 0) snprintf(chunk, sizeof chunk, "%d", (int)st->chunk);
      printf("    %3d %-11s %-8s chunk %3s  %10.1f .. %10.1f\n", i, tpf_step_kind_name(st->kind),
             tpf_stream_name(st->stream), chunk, sp[r * max_steps + i].start_us,
             sp[r * max_steps + i].end_us);
    }
  } else if (!c->runnable) {
    printf(
        "  (priced by formula: handshake, one GEMM of all rows, P-1 peer copies, one reduction)\n");
  }
  free(sp);
  for (int q = 0; q < built; q++)
    tpf_schedule_free(&s[q]);
  free(s);
}

/* --predict --json: one object with the operation, the candidates (each with its timeline of
 * rank --rank or 0), the choice and why. */
static void predict_json(const plan_args *a, const tpf_cost_table *t, const char *used,
                         const tpf_plan_result *r) {
  printf("{\"cost_table\":");
  plan_json_str(used);
  printf(",\"algo\":\"%s\",\"coll\":\"%s\",\"tp\":%d,\"dtype\":\"%s\",\"capacity\":[%llu,%llu],"
         "\"active\":[%llu,%llu],\"gemm\":[%llu,%llu,%llu],",
         tpf_algo_name(a->d.algo), tpf_coll_name(a->d.coll), a->d.tp_size,
         tpf_dtype_name(a->d.dtype), (ull)a->d.capacity.rows, (ull)a->d.capacity.cols,
         (ull)a->d.active.rows, (ull)a->d.active.cols, (ull)a->g.m, (ull)a->g.n, (ull)a->g.k);
  tpf_layout_desc pd; /* what is priced: the buffer's dtype, the GEMMs' and their points' */
  const tpf_dtype x = plan_priced_desc(&a->d, &pd);
  tpf_dtype pts = x;
  (void)tpf_cost_gemm_dtype(t, x, &pts); /* the prediction succeeded: it can */
  printf("\"buffer_dtype\":\"%s\",\"gemm_dtype\":\"%s\",\"gemm_points_dtype\":\"%s\",",
         tpf_dtype_name(pd.dtype), tpf_dtype_name(x), tpf_dtype_name(pts));
  int kind = 0;
  for (int i = 0; i < t->nsched; i++)
    kind += t->sched[i].shared == (t->shared_device != 0);
  printf("\"measured_schedule_points\":%d,\"measured_schedule_points_of_this_kind\":%d,", t->nsched,
         kind);
  printf("\"candidates\":[");
  const double best = r->cand[r->chosen].predicted_us;
  for (int i = 0; i < r->ncand; i++) {
    const tpf_plan_candidate *c = &r->cand[i];
    printf("%s{\"index\":%d,\"label\":", i ? "," : "", i);
    plan_json_str(c->label);
    printf(",\"num_splits\":%d,\"aggregate\":%s,\"baseline\":%s,\"runnable\":%s,"
           "\"predicted_us\":%.3f,\"source\":\"%s\",\"model_us\":%.3f,\"vs_best\":%.4f,"
           "\"chosen\":%s,\"timeline\":",
           c->num_splits, c->aggregate ? "true" : "false", c->baseline ? "true" : "false",
           c->runnable ? "true" : "false", c->predicted_us, tpf_plan_source_name(c->source),
           c->model_us, c->predicted_us / best, i == r->chosen ? "true" : "false");
    print_timeline(a, t, c);
    printf("}");
  }
  printf("],\"chosen\":%d,\"why\":", r->chosen);
  plan_json_str(r->why);
  printf("}\n");
}

static int predict_svg(const cli_ctx *ctx, const plan_args *a, const tpf_cost_table *t,
                       const char *used);

int plan_predict(const cli_ctx *ctx, const plan_args *a) {
  static tpf_cost_table t;
  static char used[1024];
  int lrc = cli_load_cost(ctx, "--cost", a->cost, "h200.txt", &t, used, sizeof used);
  if (lrc >= 0) return lrc;
  tpf_status rc;
  tpf_plan_result r;
  tpf_layout_desc pd;
  const tpf_dtype x = plan_priced_desc(&a->d, &pd);
  rc = tpf_plan_predict_x(&t, &pd, &a->g, x, &r);
  if (rc != TPF_OK) return cli_error(ctx, "%s: %s", tpf_status_name(rc), tpf_last_error());
  if (a->json) {
    predict_json(a, &t, used, &r);
    return a->svg ? predict_svg(ctx, a, &t, used) : 0;
  }
  printf("cost table: %s\n", used);
  printf("operation: %s %s, P=%d, T=%llu of C=%llu, H=%llu, GEMM m=%llu n=%llu k=%llu, %s\n",
         tpf_algo_name(a->d.algo), tpf_coll_name(a->d.coll), a->d.tp_size, (ull)a->d.active.rows,
         (ull)a->d.capacity.rows, (ull)a->d.capacity.cols, (ull)a->g.m, (ull)a->g.n, (ull)a->g.k,
         tpf_dtype_name(a->d.dtype));
  plan_priced_notes(&t, &a->d);
  if (t.nsched > 0) {
    int kind = 0; /* points of this table's device kind: the only ones that can apply */
    for (int i = 0; i < t.nsched; i++)
      kind += t.sched[i].shared == (t.shared_device != 0);
    printf("measured schedule points: %d, %d of them %s (this table's kind: only those apply%s)\n",
           t.nsched, kind, t.shared_device ? "shared" : "dedicated",
           t.shared_device ? ""
                           : "; 'shared' points, measured with the ranks sharing one GPU, apply "
                             "to a table with shared_device 1, as tpflex bench --section planner "
                             "uses it");
  }
  /* source: where predicted(us) came from (measured: sched points, interpolated in T; scaled:
   * the model x measured/model at the nearest measured T; model: the replay); model(us) is the
   * replay's own time whatever the source. */
  int lw = (int)strlen("candidate"); /* the candidate column fits the longest label */
  for (int i = 0; i < r.ncand; i++)
    if ((int)strlen(r.cand[i].label) > lw) lw = (int)strlen(r.cand[i].label);
  printf("%-3s %-*s %14s %-9s %12s %10s %s\n", "#", lw, "candidate", "predicted(us)", "source",
         "model(us)", "vs_best", "runs");
  double best = r.cand[r.chosen].predicted_us;
  for (int i = 0; i < r.ncand; i++)
    printf("%-3d %-*s %14.1f %-9s %12.1f %10.3f %s%s\n", i, lw, r.cand[i].label,
           r.cand[i].predicted_us, tpf_plan_source_name(r.cand[i].source), r.cand[i].model_us,
           r.cand[i].predicted_us / best, r.cand[i].runnable ? "yes" : "no (priced only)",
           i == r.chosen ? "  <- chosen" : "");
  printf("choice: %s\n", r.why);
  for (int i = 0; i < r.ncand; i++) {
    printf("candidate %d: %s\n", i, r.cand[i].label);
    print_timeline(a, &t, &r.cand[i]);
  }
  return a->svg ? predict_svg(ctx, a, &t, used) : 0;
}

/* ---- --svg: the pictures (tools/svg_plan.c) ---- */

/* "ring ag, P=4, T=1000 of C=4096, H=1024, bf16" (what both pictures are of). */
static void op_title(const plan_args *a, char *buf, size_t len) {
  snprintf(buf, len, "%s %s, P=%d, T=%llu of C=%llu, H=%llu, %s", tpf_algo_name(a->d.algo),
           tpf_coll_name(a->d.coll), a->d.tp_size, (ull)a->d.active.rows, (ull)a->d.capacity.rows,
           (ull)a->d.capacity.cols, tpf_dtype_name(a->d.dtype));
}

static const char *base_name(const char *path) {
  const char *slash = strrchr(path, '/');
  return slash ? slash + 1 : path;
}

/* Every rank's schedule s[0..P) as a timeline on the cost table's replay clock. 0, or the exit
 * status after reporting. */
int plan_svg(const cli_ctx *ctx, const plan_args *a, const tpf_schedule *s, int P) {
  static tpf_cost_table t;
  static char used[1024];
  int lrc = cli_load_cost(ctx, "--cost", a->cost, "h200.txt", &t, used, sizeof used);
  if (lrc >= 0) return lrc;
  int max_steps = 1;
  for (int r = 0; r < P; r++)
    if (s[r].nsteps > max_steps) max_steps = s[r].nsteps;
  tpf_cost_span *sp = calloc((size_t)P * (size_t)max_steps, sizeof *sp);
  if (!sp) return cli_error(ctx, "--svg: out of memory");
  double total = 0;
  tpf_layout_desc pd;
  const tpf_dtype x = plan_priced_desc(&a->d, &pd);
  tpf_status rc = tpf_cost_predict_x(&t, s, P, x, sp, max_steps, &total);
  if (rc != TPF_OK) {
    free(sp);
    return cli_error(ctx, "--svg: the cost model cannot replay this schedule: %s: %s",
                     tpf_status_name(rc), tpf_last_error());
  }
  char op[200], title[1400];
  op_title(a, op, sizeof op);
  snprintf(title, sizeof title, "%s, splits %d%s: %.1f us predicted (cost table %s)", op,
           s[0].num_splits, s[0].aggregate ? " aggregate" : "", total, base_name(used));
  int ret = svg_plan_schedule(a->svg, title, s, P, sp, max_steps, total, a->only_rank);
  free(sp);
  if (ret < 0) return cli_error(ctx, "--svg '%s' cannot be written (%s)", a->svg, strerror(errno));
  if (ret == 0 && !a->json)
    printf("svg: %s (%d ranks' timelines)\n", a->svg, a->only_rank < 0 ? P : 1);
  return ret;
}

/* --predict --svg's T grid: 40 legal T from C/32 to C and the asked T, ascending, no repeats.
 * Returns the count. */
static int predict_grid(const plan_args *a, uint64_t *ts, int cap) {
  const uint64_t C = a->d.capacity.rows, lo = C / 32 ? C / 32 : 1;
  int n = 0;
  for (int i = 0; i < 40 && n < cap - 1; i++) {
    uint64_t want = lo + (C - lo) * (uint64_t)i / 39, legal = 0;
    tpf_layout_desc d = a->d;
    if (tpf_layout_legal_rows(&d, want, &legal) != TPF_OK || legal > C) continue;
    if (n == 0 || legal > ts[n - 1]) ts[n++] = legal;
  }
  const uint64_t T = a->d.active.rows;
  int at = 0;
  while (at < n && ts[at] < T)
    at++;
  if (at == n || ts[at] != T) {
    memmove(ts + at + 1, ts + at, (size_t)(n - at) * sizeof *ts);
    ts[at] = T;
    n++;
  }
  return n;
}

enum { SVG_MAX_SERIES = 32, SVG_MAX_GRID = 48 };

/* The series of label in ser[0..*n), added when new (NULL when there is no room). */
static svg_series *series_of(svg_series *ser, int *n, const char *label, double *us, bool *ch) {
  for (int k = 0; k < *n; k++)
    if (strcmp(ser[k].label, label) == 0) return &ser[k];
  if (*n == SVG_MAX_SERIES) return NULL;
  svg_series *s = &ser[(*n)++];
  snprintf(s->label, sizeof s->label, "%s", label);
  s->us = us;
  s->chosen = ch;
  for (int i = 0; i < SVG_MAX_GRID; i++) {
    s->us[i] = NAN;
    s->chosen[i] = false;
  }
  return s;
}

/* Predicted time against T for every candidate, the planner's choice marked. 0, or the exit
 * status after reporting. */
static int predict_svg(const cli_ctx *ctx, const plan_args *a, const tpf_cost_table *t,
                       const char *used) {
  static double us[SVG_MAX_SERIES][SVG_MAX_GRID];
  static bool chosen[SVG_MAX_SERIES][SVG_MAX_GRID];
  static svg_series ser[SVG_MAX_SERIES];
  uint64_t ts[SVG_MAX_GRID];
  const int n = predict_grid(a, ts, SVG_MAX_GRID);
  int ns = 0;
  for (int i = 0; i < n; i++) {
    plan_args at = *a;
    at.d.active.rows = ts[i];
    at.g.m = ts[i];
    tpf_layout_desc pd;
    const tpf_dtype x = plan_priced_desc(&at.d, &pd);
    tpf_plan_result r;
    if (tpf_plan_predict_x(t, &pd, &at.g, x, &r) != TPF_OK) continue; /* a gap at this T */
    for (int j = 0; j < r.ncand; j++) {
      svg_series *se = series_of(ser, &ns, r.cand[j].label, us[ns], chosen[ns]);
      if (!se) continue;
      se->us[i] = r.cand[j].predicted_us;
      se->chosen[i] = j == r.chosen;
    }
  }
  char op[200], title[1400];
  op_title(a, op, sizeof op);
  snprintf(title, sizeof title, "%s: predicted time against T per candidate (cost table %s)", op,
           base_name(used));
  int ret = svg_plan_predict(a->svg, title, ts, n, ser, ns, a->d.active.rows);
  if (ret < 0) return cli_error(ctx, "--svg '%s' cannot be written (%s)", a->svg, strerror(errno));
  if (ret == 0 && !a->json) printf("svg: %s (%d candidates over %d values of T)\n", a->svg, ns, n);
  return ret;
}
