/* The pictures of `tpflex plan --svg` (tools/svg.h).
 *
 * Method: the schedule picture puts each rank in a band with one lane per stream its steps use
 * (compute0..2, comm, recv, in the streams' order) and draws every step as a box from its start
 * to its end on the cost model's replay clock (tpf_cost_predict), coloured by kind: GEMM, copy
 * (SEND), wait (RECV), reduce (REDUCE, PEER_REDUCE), sync (BARRIER, HANDSHAKE). The prediction
 * picture plots each candidate's predicted time against T as one path (a gap where a schedule is
 * no candidate at that T) and marks the planner's choice at every T with a circle.
 */
#include "svg.h"

#include <math.h>
#include <string.h>

enum { SCHED_W = 1100, LEFT = 120, RIGHT = 30, TOP = 62, LANE_H = 18, RANK_HEAD = 20, AXIS_H = 44 };

typedef struct {
  const char *cls, *fill;
} kind_style;

static kind_style style_of(int kind) {
  switch (kind) {
  case TPF_STEP_GEMM:
    return (kind_style){"gemm", "#4c78a8"};
  case TPF_STEP_SEND:
    return (kind_style){"copy", "#f58518"};
  case TPF_STEP_RECV:
    return (kind_style){"wait", "#bab0ac"};
  case TPF_STEP_REDUCE:
  case TPF_STEP_PEER_REDUCE:
    return (kind_style){"reduce", "#54a24b"};
  default: /* BARRIER, HANDSHAKE */
    return (kind_style){"sync", "#9d755d"};
  }
}

/* Lane of each stream rank s uses (-1: unused); returns the number of lanes. */
static int lanes_of(const tpf_schedule *s, int lane[TPF_NUM_STREAMS]) {
  bool used[TPF_NUM_STREAMS] = {false};
  for (int i = 0; i < s->nsteps; i++)
    if (s->steps[i].stream < TPF_NUM_STREAMS) used[s->steps[i].stream] = true;
  int n = 0;
  for (int k = 0; k < TPF_NUM_STREAMS; k++)
    lane[k] = used[k] ? n++ : -1;
  return n;
}

static void legend(FILE *f, double y) {
  static const int kinds[] = {TPF_STEP_GEMM, TPF_STEP_SEND, TPF_STEP_RECV, TPF_STEP_REDUCE,
                              TPF_STEP_BARRIER};
  static const char *const names[] = {"GEMM", "copy (send)", "wait (recv)", "reduce",
                                      "sync (handshake, barrier)"};
  double x = LEFT;
  for (int i = 0; i < 5; i++) {
    kind_style k = style_of(kinds[i]);
    fprintf(f,
            "<rect class=\"legend\" x=\"%.1f\" y=\"%.1f\" width=\"12\" height=\"12\" "
            "fill=\"%s\"/>\n",
            x, y - 10, k.fill);
    svg_text(f, x + 16, y, 11, "start", "legend-label", names[i]);
    x += 30 + 7.0 * (double)strlen(names[i]);
  }
}

static void time_axis(FILE *f, double y, double total_us) {
  const double pw = SCHED_W - LEFT - RIGHT;
  fprintf(f, "<line class=\"axis\" x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#333\"/>\n",
          LEFT, y, SCHED_W - RIGHT, y);
  for (int k = 0; k <= 5; k++) {
    const double x = LEFT + pw * k / 5.0;
    char lab[32];
    snprintf(lab, sizeof lab, "%.1f", total_us * k / 5.0);
    fprintf(f,
            "<line class=\"tick\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" "
            "stroke=\"#333\"/>\n",
            x, y, x, y + 4);
    svg_text(f, x, y + 16, 10, "middle", "tick-label", lab);
  }
  svg_text(f, LEFT + pw / 2, y + 32, 11, "middle", "axis-label",
           "predicted time (us, cost model replay)");
}

/* One rank's band starting at y; returns the y below it. */
static double rank_band(FILE *f, const tpf_schedule *s, int r, const tpf_cost_span *sp,
                        double total_us, double y) {
  int lane[TPF_NUM_STREAMS];
  const int nl = lanes_of(s, lane);
  const double pw = SCHED_W - LEFT - RIGHT, scale = total_us > 0 ? pw / total_us : 0;
  char buf[160];
  fprintf(f, "<g class=\"rank\" data-rank=\"%d\" data-steps=\"%d\" data-lanes=\"%d\">\n", r,
          s->nsteps, nl);
  snprintf(buf, sizeof buf, "rank %d (%d steps)", r, s->nsteps);
  svg_text(f, 8, y + 14, 12, "start", "rank-label", buf);
  y += RANK_HEAD;
  for (int k = 0; k < TPF_NUM_STREAMS; k++) {
    if (lane[k] < 0) continue;
    const double ly = y + lane[k] * LANE_H;
    fprintf(f,
            "<rect class=\"lane\" data-stream=\"%s\" x=\"%d\" y=\"%.1f\" width=\"%.1f\" "
            "height=\"%d\" fill=\"%s\"/>\n",
            tpf_stream_name(k), LEFT, ly, pw, LANE_H - 2, lane[k] % 2 ? "#f4f4f4" : "#e9e9e9");
    svg_text(f, LEFT - 6, ly + 12, 11, "end", "lane-label", tpf_stream_name(k));
  }
  for (int i = 0; i < s->nsteps; i++) {
    const tpf_step *st = &s->steps[i];
    const kind_style k = style_of(st->kind);
    const double x0 = LEFT + sp[i].start_us * scale, w = (sp[i].end_us - sp[i].start_us) * scale;
    const double ly = y + (st->stream < TPF_NUM_STREAMS ? lane[st->stream] : 0) * LANE_H;
    fprintf(f,
            "<rect class=\"box %s\" x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%d\" "
            "fill=\"%s\" stroke=\"white\" stroke-width=\"0.5\"><title>",
            k.cls, x0, ly + 1, w > 1.0 ? w : 1.0, LANE_H - 4, k.fill);
    snprintf(buf, sizeof buf, "rank %d step %d: %s chunk %d on %s, %.2f .. %.2f us", r, i,
             tpf_step_kind_name(st->kind), (int)st->chunk, tpf_stream_name(st->stream),
             sp[i].start_us, sp[i].end_us);
    svg_escaped(f, buf);
    fputs("</title></rect>\n", f);
  }
  fputs("</g>\n", f);
  return y + nl * LANE_H + 6;
}

int svg_plan_schedule(const char *path, const char *title, const tpf_schedule *s, int P,
                      const tpf_cost_span *spans, int max_steps, double total_us, int only_rank) {
  double h = TOP + AXIS_H + 10;
  for (int r = 0; r < P; r++) {
    int lane[TPF_NUM_STREAMS];
    if (only_rank < 0 || r == only_rank) h += RANK_HEAD + lanes_of(&s[r], lane) * LANE_H + 6;
  }
  FILE *f = svg_begin(path, SCHED_W, (int)ceil(h), title);
  if (!f) return -1;
  svg_text(f, 8, 20, 14, "start", "title", title);
  legend(f, 44);
  double y = TOP;
  for (int r = 0; r < P; r++)
    if (only_rank < 0 || r == only_rank)
      y = rank_band(f, &s[r], r, spans + (size_t)r * (size_t)max_steps, total_us, y);
  time_axis(f, y + 4, total_us);
  return svg_end(f, "tpflex plan", path);
}

/* ---- predicted time against T ---- */

enum { PRED_W = 980, PRED_H = 520, PL = 80, PR = 290, PT = 50, PB = 60 };

static const char *const kPalette[] = {"#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2",
                                       "#b279a2", "#ff9da6", "#9d755d", "#bab0ac", "#eeca3b"};

typedef struct {
  double t0, t1, ymax;
} pred_scale;

static double px(const pred_scale *s, double T) {
  const double w = PRED_W - PL - PR;
  return s->t1 > s->t0 ? PL + (T - s->t0) / (s->t1 - s->t0) * w : PL + w / 2;
}

static double py(const pred_scale *s, double us) {
  return PRED_H - PB - (s->ymax > 0 ? us / s->ymax : 0) * (PRED_H - PT - PB);
}

static void pred_axes(FILE *f, const pred_scale *s) {
  fprintf(f, "<path class=\"axis\" d=\"M%d %d V%d H%d\" fill=\"none\" stroke=\"#333\"/>\n", PL, PT,
          PRED_H - PB, PRED_W - PR);
  char lab[40];
  for (int k = 0; k <= 5; k++) {
    const double T = s->t0 + (s->t1 - s->t0) * k / 5.0, us = s->ymax * k / 5.0;
    snprintf(lab, sizeof lab, "%.0f", T);
    svg_text(f, px(s, T), PRED_H - PB + 16, 10, "middle", "tick-label", lab);
    snprintf(lab, sizeof lab, "%.1f", us);
    svg_text(f, PL - 6, py(s, us) + 4, 10, "end", "tick-label", lab);
    fprintf(f,
            "<line class=\"grid\" x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#ddd\"/>\n",
            PL, py(s, us), PRED_W - PR, py(s, us));
  }
  svg_text(f, PL + (PRED_W - PL - PR) / 2.0, PRED_H - PB + 34, 11, "middle", "axis-label",
           "T (active rows)");
  svg_text(f, 14, PT - 12, 11, "start", "axis-label", "predicted time (us)");
}

/* One series: its path (segments where it is a candidate), its chosen points, its legend entry. */
static void pred_series(FILE *f, const pred_scale *s, const uint64_t *ts, int n,
                        const svg_series *se, int idx) {
  const char *col = kPalette[idx % (int)(sizeof kPalette / sizeof *kPalette)];
  fputs("<path class=\"series\" data-label=\"", f);
  svg_escaped(f, se->label);
  fprintf(f, "\" fill=\"none\" stroke=\"%s\" stroke-width=\"1.8\" d=\"", col);
  bool pen = false;
  for (int i = 0; i < n; i++) {
    if (isnan(se->us[i])) {
      pen = false;
      continue;
    }
    fprintf(f, "%s%.1f %.1f ", pen ? "L" : "M", px(s, (double)ts[i]), py(s, se->us[i]));
    pen = true;
  }
  fputs("\"/>\n", f);
  for (int i = 0; i < n; i++)
    if (se->chosen[i] && !isnan(se->us[i])) {
      fprintf(f, "<circle class=\"chosen\" data-t=\"%llu\" data-label=\"",
              (unsigned long long)ts[i]);
      svg_escaped(f, se->label);
      fprintf(f, "\" cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" fill=\"%s\" stroke=\"black\"><title>",
              px(s, (double)ts[i]), py(s, se->us[i]), col);
      fprintf(f, "T %llu: the planner chooses ", (unsigned long long)ts[i]);
      svg_escaped(f, se->label);
      fprintf(f, " (%.1f us)</title></circle>\n", se->us[i]);
    }
  const double ly = PT + 10 + 18.0 * idx;
  fprintf(f,
          "<line class=\"legend\" x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"%s\" "
          "stroke-width=\"3\"/>\n",
          PRED_W - PR + 14, ly, PRED_W - PR + 38, ly, col);
  svg_text(f, PRED_W - PR + 44, ly + 4, 11, "start", "legend-label", se->label);
}

int svg_plan_predict(const char *path, const char *title, const uint64_t *ts, int ngrid,
                     const svg_series *series, int nseries, uint64_t asked_T) {
  pred_scale s = {(double)ts[0], (double)ts[ngrid - 1], 0};
  for (int k = 0; k < nseries; k++)
    for (int i = 0; i < ngrid; i++)
      if (!isnan(series[k].us[i]) && series[k].us[i] > s.ymax) s.ymax = series[k].us[i];
  s.ymax *= 1.05;
  FILE *f = svg_begin(path, PRED_W, PRED_H, title);
  if (!f) return -1;
  svg_text(f, 8, 20, 14, "start", "title", title);
  pred_axes(f, &s);
  if (asked_T)
    fprintf(f,
            "<line class=\"asked\" data-t=\"%llu\" x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" "
            "stroke=\"#555\" stroke-dasharray=\"4 3\"/>\n",
            (unsigned long long)asked_T, px(&s, (double)asked_T), PT, px(&s, (double)asked_T),
            PRED_H - PB);
  for (int k = 0; k < nseries; k++)
    pred_series(f, &s, ts, ngrid, &series[k], k);
  svg_text(f, PRED_W - PR + 14, PT + 14 + 18.0 * nseries, 10, "start", "legend-note",
           "circles: the planner's choice at each T");
  return svg_end(f, "tpflex plan", path);
}
