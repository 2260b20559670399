/* tpflex plan's rooms. cmd_plan.c parses the options into a plan_args and dispatches; plan_print.c
 * prints the schedules (table, JSON); plan_predict.c prices them on a cost table (--predict, and
 * --svg's pictures through svg_plan.c); plan_project.c projects a grid (--project). Each entry
 * point returns the command's exit status (0, 1 a failed check, 2 bad input) unless it says not.
 */
#ifndef TPF_PLAN_H
#define TPF_PLAN_H

#include <stdbool.h>
#include <stdint.h>

#include "tpflex/tpflex.h"
#include "tpflex/tpflex_backend.h"
#include "tpflex/tpflex_cost.h"

#include "cli_args.h"

typedef unsigned long long ull;

/* The parsed command: one operation (d, g), or with project the grid of --project. */
typedef struct {
  tpf_layout_desc d;
  tpf_gemm_dims g;
  int only_rank; /* -1: all */
  bool json;
  bool predict;
  const char *cost; /* NULL: the default table */
  const char *svg;  /* --svg FILE, or NULL */
  /* --project: the grid */
  bool project;
  int nops;
  tpf_algo palgo[3];
  tpf_coll pcoll[3];
  int nts, nns;
  uint64_t ts[16], ns[2];
} plan_args;

/* The layout and every rank's schedule s[0..P) (only a->only_rank's when >= 0) and the schedule
 * check's verdict, as a table or as one JSON object, on stdout. */
void plan_print_text(const plan_args *a, const tpf_schedule *s, int P, tpf_status check);
void plan_print_json(const plan_args *a, const tpf_schedule *s, int P, tpf_status check);
/* s as a quoted, escaped JSON string on stdout. */
void plan_json_str(const char *s);

/* What --predict and --project price for layout in: *out, the layout, and the GEMMs' dtype
 * (returned). --dtype fp8 with rs is the RS site of an fp8 GEMM: a bf16 buffer, fp8 GEMMs. */
tpf_dtype plan_priced_desc(const tpf_layout_desc *in, tpf_layout_desc *out);
/* The "note:" lines saying what is priced where it is not what was asked. */
void plan_priced_notes(const tpf_cost_table *t, const tpf_layout_desc *in);

/* --predict: every planner candidate on the cost table (a->cost, default h200.txt), then
 * --predict --svg's picture when a->svg is set. */
int plan_predict(const cli_ctx *ctx, const plan_args *a);
/* --svg without --predict: every rank's schedule s[0..P) on the cost model's clock. 0, or the
 * exit status after reporting. */
int plan_svg(const cli_ctx *ctx, const plan_args *a, const tpf_schedule *s, int P);
/* --project: the projection table over a's grid. */
int plan_project(const cli_ctx *ctx, const plan_args *a);

#endif /* TPF_PLAN_H */
