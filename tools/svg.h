/* Plain SVG 1.1 for the tpflex tool's pictures, written with stdio (no plotting dependency), and
 * the two pictures of `tpflex plan --svg` (tools/svg_plan.c). Every element the pictures draw
 * carries a class ("rank", "lane", "box gemm", "series", "chosen", ...) so that a test or a
 * stylesheet can find it. */
#ifndef TPF_SVG_H
#define TPF_SVG_H

#include <stdbool.h>
#include <stdio.h>

#include "tpflex/tpflex_backend.h"
#include "tpflex/tpflex_cost.h"

/* Opens path and writes the document header (width x height pixels) with title as its <title>.
 * NULL (errno set) when the file cannot be opened. */
FILE *svg_begin(const char *path, int width, int height, const char *title);
/* Closes the document and the file; 0, or 1 after reporting a write error on stderr as
 * "<cmd>: writing 'PATH' failed: ..." (cli_finish_output). */
int svg_end(FILE *f, const char *cmd, const char *path);
/* Text with XML's five special characters escaped. */
void svg_escaped(FILE *f, const char *s);
/* <text>; anchor "start", "middle" or "end". */
void svg_text(FILE *f, double x, double y, int size, const char *anchor, const char *cls,
              const char *text);

/* tpflex plan --svg: each rank's schedule as a timeline on the cost model's clock. spans[r *
 * max_steps + i] is rank r's step i (tpf_cost_predict); total_us the latest end; only_rank >= 0
 * draws that rank alone (-1: every rank). One <g class="rank"> per rank drawn, one rect
 * class="lane" per stream the rank's steps use, one rect class="box KIND" (gemm, copy, wait,
 * reduce, sync) per step, with a <title> naming the step. */
int svg_plan_schedule(const char *path, const char *title, const tpf_schedule *s, int P,
                      const tpf_cost_span *spans, int max_steps, double total_us, int only_rank);

/* One candidate schedule's predicted time at each T of the grid (NaN where it is not a candidate
 * at that T), and the T where the planner chose it. */
typedef struct {
  char label[40];
  double *us;   /* ngrid entries */
  bool *chosen; /* ngrid entries */
} svg_series;
/* tpflex plan --predict --svg: predicted time against T, one polyline class="series" per
 * candidate (data-label its label), a circle class="chosen" at each T on the series the planner
 * chose, and a dashed line class="asked" at asked_T (0: none). */
int svg_plan_predict(const char *path, const char *title, const uint64_t *ts, int ngrid,
                     const svg_series *series, int nseries, uint64_t asked_T);

#endif /* TPF_SVG_H */
