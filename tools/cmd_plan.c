/* tpflex plan: the layout and schedule of one operation, as a table or JSON.
 *
 * Parses the options (plan.h's plan_args), builds every rank's schedule with tpf_schedule_build
 * (or one rank's with --rank, though the checker always sees all ranks), prints them
 * (plan_print.c) and runs tpf_schedule_check over the group; --predict and --svg go to
 * plan_predict.c, --project to plan_project.c.
 * Exit status: 0 when the check passes, 1 when it fails, 2 for bad arguments.
 */
#include "cmds.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tpflex/tpflex.h"
#include "tpflex/tpflex_backend.h"
#include "tpflex/tpflex_cost.h"

#include "cli_args.h"
#include "plan.h"

static const char *const plan_usage =
    "usage: tpflex plan --tp P --capacity C --hidden H --algo ring|pipeline|bulk --coll ag|rs "
    "[options]\n"
    "Prints the registered bytes, the active layout and every rank's schedule of one operation,\n"
    "then runs the schedule checker over all ranks. Exit 0 check OK, 1 check failed, 2 bad input.";

/* Algorithms an option applies to (cli_opt.applies); 0 = every algorithm. */
enum { A_RING = 1u << 0, A_PIPE = 1u << 1, A_BULK = 1u << 2 };

enum {
  O_TP,
  O_CAP,
  O_TOKENS,
  O_HIDDEN,
  O_ALGO,
  O_COLL,
  O_SPLITS,
  O_AGG,
  O_DTYPE,
  O_N,
  O_K,
  O_RANK,
  O_JSON,
  O_PREDICT,
  O_COST,
  O_PROJECT,
  O_SVG,
  O_NOPTS
};
#define PLAN_MAX_DIM (1ull << 40)
/* Rows travel in the 40-bit field of the handshake's ready word (tpflex_backend.h). */
#define PLAN_MAX_ROWS ((1ull << 40) - 1)
static const cli_opt kPlanOpts[O_NOPTS] = {
    [O_TP] = {"--tp", CLI_U64, 1, TPF_MAX_RANKS, NULL, "P",
              "required (--project: optional, default 8): tensor-parallel ranks", 0, false},
    [O_CAP] = {"--capacity", CLI_U64, 1, PLAN_MAX_ROWS, NULL, "C",
               "required (--project: optional, default 32768): registered rows (tokens)", 0, false},
    [O_TOKENS] = {"--tokens", CLI_U64, 1, PLAN_MAX_ROWS, NULL, "T",
                  "optional: active rows, <= C (default C)", 0, false},
    [O_HIDDEN] = {"--hidden", CLI_U64, 1, 1ull << 24, NULL, "H",
                  "required (--project: optional, default 8192): buffer columns (hidden size)", 0,
                  false},
    [O_ALGO] = {"--algo", CLI_CHOICE, 0, 0, "ring|pipeline|bulk", NULL,
                "required (--project: optional): ring exchange, pipeline or bulk overlap", 0,
                false},
    [O_COLL] = {"--coll", CLI_CHOICE, 0, 0, "ag|rs", NULL,
                "required (--project: optional): all-gather or reduce-scatter", 0, false},
    [O_SPLITS] = {"--splits", CLI_U64, 0, 1024, NULL, "S",
                  "optional, ring and pipeline: GEMM chunks (0 = default: ring P, pipeline 4)",
                  A_RING | A_PIPE, false},
    [O_AGG] = {"--aggregate", CLI_FLAG, 0, 0, NULL, NULL,
               "optional, ring ag only: 2-chunk messages after a pair swap (even P)", A_RING,
               false},
    [O_DTYPE] = {"--dtype", CLI_CHOICE, 0, 0, "bf16|fp16|fp32|fp8_e4m3|fp8_e5m2", NULL,
                 "optional: buffer dtype (default bf16; fp8: 1-byte elements; fp8 with rs and "
                 "--predict or --project: the RS site of an fp8 GEMM, a bf16 buffer)",
                 0, false},
    [O_N] = {"--n", CLI_U64, 1, PLAN_MAX_DIM, NULL, "N",
             "optional, ag and bulk: GEMM output columns (default H)", 0, false},
    [O_K] = {"--k", CLI_U64, 1, PLAN_MAX_DIM, NULL, "K",
             "optional, rs and bulk: GEMM reduction dim (default H)", 0, false},
    [O_RANK] = {"--rank", CLI_U64, 0, TPF_MAX_RANKS - 1, NULL, "r",
                "optional: print only this rank's schedule, < P (the check sees all ranks)", 0,
                false},
    [O_JSON] = {"--json", CLI_FLAG, 0, 0, NULL, NULL,
                "optional: JSON on stdout (errors too: {\"status\", \"message\"})", 0, false},
    [O_PREDICT] = {"--predict", CLI_FLAG, 0, 0, NULL, NULL,
                   "optional: instead of the schedule, every planner candidate with its predicted "
                   "time and timeline, the choice and why (with --json: as one JSON object)",
                   0, false},
    [O_COST] = {"--cost", CLI_STR, 0, 0, NULL, "FILE",
                "optional, with --predict or --project: cost table (default: the shipped H200 "
                "table, data/cost/h200.txt)",
                0, false},
    [O_PROJECT] = {"--project", CLI_FLAG, 0, 0, NULL, NULL,
                   "optional: the multi-GPU PROJECTION: for every T = C/64 .. C (or --tokens), N = "
                   "3584 and 1024 (or --n), RING AG, RING RS and PIPELINE RS (or --algo/--coll), "
                   "the predicted overlap efficiency and speedup over no overlap on the cost table",
                   0, false},
    [O_SVG] = {"--svg", CLI_STR, 0, 0, NULL, "FILE",
               "optional: also draw an SVG picture: each rank's schedule as a timeline (streams "
               "as lanes, steps as boxes sized by the cost model); with --predict, predicted time "
               "against T for every candidate with the planner's choice marked",
               0, false},
};

/* a * b * c fits in 64 bits. */
static bool fits3(uint64_t a, uint64_t b, uint64_t c) {
  uint64_t ab;
  if (__builtin_mul_overflow(a, b, &ab)) return false;
  uint64_t abc;
  return !__builtin_mul_overflow(ab, c, &abc);
}

/* The smallest capacity >= C that every layout (d with each algo/coll pair; active = capacity)
 * accepts, in *out; false when none does within the search (a rule C cannot fix, such as
 * PIPELINE's H % S). T/P a multiple of 16 meets every alignment rule (core/legal_rows.c's
 * argument), so 16 steps of P past the first multiple of P are enough. */
static bool smallest_capacity(const tpf_layout_desc *base, const tpf_algo *algos,
                              const tpf_coll *colls, int nops, uint64_t C, uint64_t *out) {
  const uint64_t P = (uint64_t)base->tp_size;
  for (uint64_t c = (C + P - 1) / P * P, i = 0; i <= 16 && c <= PLAN_MAX_ROWS; c += P, i++) {
    bool ok = true;
    for (int k = 0; k < nops && ok; k++) {
      tpf_layout_desc d = *base;
      d.algo = algos[k];
      d.coll = colls[k];
      d.capacity.rows = d.active.rows = c;
      ok = tpf_layout_check(&d) == TPF_OK;
    }
    if (ok) {
      *out = c;
      return true;
    }
  }
  return false;
}

/* An input error for a capacity that breaks a layout rule (status and detail of that layout):
 * it names --capacity and the smallest capacity every layout accepts when there is one, else
 * (another option breaks the rule at every capacity, e.g. --splits) only the detail. */
static int capacity_error(const cli_ctx *ctx, const tpf_layout_desc *base, const tpf_algo *algos,
                          const tpf_coll *colls, int nops, tpf_status st) {
  char why[512];
  snprintf(why, sizeof why, "%s", tpf_last_error());
  const uint64_t C = base->capacity.rows;
  uint64_t legal = 0;
  if (smallest_capacity(base, algos, colls, nops, C, &legal))
    return cli_error(ctx,
                     "--capacity %llu with --tp %d --hidden %llu: %s: %s (the smallest legal "
                     "--capacity >= %llu is %llu)",
                     (ull)C, base->tp_size, (ull)base->capacity.cols, tpf_status_name(st), why,
                     (ull)C, (ull)legal);
  return cli_error(ctx, "%s: %s", tpf_status_name(st), why); /* no capacity fixes it */
}

/* --project's T values: --tokens (checked against every projected layout), else C/64 .. C.
 * -1 on success; else the exit status after reporting. */
static int project_tokens(const cli_ctx *ctx, const cli_val *v, plan_args *a) {
  const uint64_t C = a->d.capacity.rows;
  if (v[O_TOKENS].set) {
    if (v[O_TOKENS].u > C)
      return cli_error(ctx, "--tokens '%s' is above the capacity %llu", v[O_TOKENS].s, (ull)C);
    for (int i = 0; i < a->nops; i++) {
      tpf_layout_desc d = a->d;
      d.algo = a->palgo[i];
      d.coll = a->pcoll[i];
      d.active.rows = v[O_TOKENS].u;
      tpf_status st = tpf_layout_check(&d);
      uint64_t legal = 0;
      if (st != TPF_OK) {
        char detail[512];
        snprintf(detail, sizeof detail, "%s", tpf_last_error());
        if (tpf_layout_legal_rows(&d, d.active.rows, &legal) == TPF_OK)
          return cli_error(ctx,
                           "--tokens '%s' (%s %s): %s: %s (the smallest legal --tokens >= %s "
                           "is %llu)",
                           v[O_TOKENS].s, tpf_algo_name(d.algo), tpf_coll_name(d.coll),
                           tpf_status_name(st), detail, v[O_TOKENS].s, (ull)legal);
        return cli_error(ctx, "--tokens '%s' (%s %s): %s: %s", v[O_TOKENS].s, tpf_algo_name(d.algo),
                         tpf_coll_name(d.coll), tpf_status_name(st), detail);
      }
    }
    a->ts[a->nts++] = v[O_TOKENS].u;
    return -1;
  }
  /* C/64, 2C/64, ... up to C; from 1 when C < 64 (doubling 0 would never end). */
  for (uint64_t t = C / 64 ? C / 64 : 1; t <= C && a->nts < 16; t *= 2)
    a->ts[a->nts++] = t;
  if (a->nts == 0 || a->ts[a->nts - 1] != C) a->ts[a->nts < 16 ? a->nts++ : 15] = C;
  return -1;
}

/* --project: the grid of the projection. -1 on success; else the exit status after reporting. */
static int parse_project(const cli_ctx *ctx, const cli_val *v, plan_args *a) {
  static const int refused[] = {O_SPLITS, O_AGG, O_RANK, O_JSON, O_K, O_SVG};
  static const char *const why[] = {
      "it prices every candidate", "it prices every candidate",
      "it replays all ranks",      "it prints text",
      "RS rows use K = N",         "it draws nothing; --predict --svg draws one operation"};
  for (size_t i = 0; i < sizeof refused / sizeof *refused; i++)
    if (v[refused[i]].set)
      return cli_error(ctx, "%s does not apply with --project (%s)", kPlanOpts[refused[i]].name,
                       why[i]);
  if (v[O_ALGO].set && v[O_ALGO].u == 2)
    return cli_error(ctx, "--algo bulk has nothing to project (its GEMM is independent of the "
                          "collective: no overlap schedule to choose)");
  static const tpf_dtype dts[] = {TPF_BF16, TPF_FP16, TPF_FP32, TPF_FP8_E4M3, TPF_FP8_E5M2};
  a->project = true;
  a->predict = true;
  a->cost = v[O_COST].set ? v[O_COST].s : NULL;
  a->d.tp_size = v[O_TP].set ? (int)v[O_TP].u : 8;
  a->d.capacity.rows = v[O_CAP].set ? v[O_CAP].u : 32768;
  a->d.capacity.cols = v[O_HIDDEN].set ? v[O_HIDDEN].u : 8192;
  a->d.active.cols = a->d.capacity.cols;
  a->d.dtype = v[O_DTYPE].set ? dts[v[O_DTYPE].u] : TPF_BF16;
  static const tpf_algo algos[3] = {TPF_ALGO_RING, TPF_ALGO_RING, TPF_ALGO_PIPELINE};
  static const tpf_coll colls[3] = {TPF_COLL_AG, TPF_COLL_RS, TPF_COLL_RS};
  for (int i = 0; i < 3; i++) {
    if (v[O_ALGO].set && (v[O_ALGO].u == 0) != (algos[i] == TPF_ALGO_RING)) continue;
    if (v[O_COLL].set && (v[O_COLL].u == 0) != (colls[i] == TPF_COLL_AG)) continue;
    a->palgo[a->nops] = algos[i];
    a->pcoll[a->nops++] = colls[i];
  }
  if (a->nops == 0)
    return cli_error(ctx, "--algo %s --coll %s: pipeline has no all-gather to project", v[O_ALGO].s,
                     v[O_COLL].s);
  const uint64_t C = a->d.capacity.rows, H = a->d.capacity.cols;
  /* Every projected layout must accept the capacity and --tokens: input errors, reported here
   * (exit 2) rather than as rows that could not be projected. */
  for (int i = 0; i < a->nops; i++) {
    tpf_layout_desc d = a->d;
    d.algo = a->palgo[i];
    d.coll = a->pcoll[i];
    d.active = d.capacity;
    tpf_status st = tpf_layout_check(&d);
    if (st != TPF_OK) return capacity_error(ctx, &a->d, a->palgo, a->pcoll, a->nops, st);
  }
  int rc = project_tokens(ctx, v, a);
  if (rc >= 0) return rc;
  if (v[O_N].set) {
    a->ns[a->nns++] = v[O_N].u;
  } else {
    a->ns[a->nns++] = 3584;
    a->ns[a->nns++] = 1024;
  }
  for (int i = 0; i < a->nns; i++)
    if (!fits3(C, a->ns[i], 4) || !fits3(C, H, 4) || !fits3(a->ns[i], H, 4) ||
        !fits3(C, (uint64_t)a->d.tp_size * 2, H * 4))
      return cli_error(ctx, "--capacity %llu, --hidden %llu, --n %llu: sizes overflow 64 bits",
                       (ull)C, (ull)H, (ull)a->ns[i]);
  return -1;
}

/* The GEMM of the layout (--n, --k, else H), its operand sizes checked for overflow. -1 on
 * success; else the exit status after reporting. */
static int plan_gemm_dims(const cli_ctx *ctx, const cli_val *v, plan_args *a) {
  uint64_t H = a->d.capacity.cols, T = a->d.active.rows, C = a->d.capacity.rows;
  uint64_t n = v[O_N].set ? v[O_N].u : H, k = v[O_K].set ? v[O_K].u : H;
  const uint64_t e = 4; /* the widest element any operand or the fp32 accumulation uses */
  if (!fits3(C, H, e) || !fits3(C, (uint64_t)a->d.tp_size * 2, H * e))
    return cli_error(ctx, "--capacity %llu x --hidden %llu bytes overflow 64 bits", (ull)C, (ull)H);
  if (v[O_N].set && (!fits3(C, n, e) || !fits3(n, k, e) || !fits3(n, H, e)))
    return cli_error(ctx, "--n '%s': the GEMM operand sizes (n x m, n x k) overflow 64 bits",
                     v[O_N].s);
  if (v[O_K].set && (!fits3(C, k, e) || !fits3(n, k, e) || !fits3(k, H, e)))
    return cli_error(ctx, "--k '%s': the GEMM operand sizes (k x m, n x k) overflow 64 bits",
                     v[O_K].s);
  if (a->d.algo == TPF_ALGO_BULK) {
    a->g.m = T;
    a->g.n = n;
    a->g.k = k;
  } else if (a->d.coll == TPF_COLL_AG) {
    a->g.m = T;
    a->g.n = n;
    a->g.k = H;
  } else {
    a->g.m = T;
    a->g.n = H;
    a->g.k = k;
  }
  return -1;
}

/* The options that do not apply to --algo or --coll. -1, or the exit status after reporting. */
static int plan_scope(const cli_ctx *ctx, const cli_val *v) {
  const unsigned amask = 1u << v[O_ALGO].u;
  const bool ag = v[O_COLL].u == 0;
  for (int i = 0; i < O_NOPTS; i++)
    if (v[i].set && kPlanOpts[i].applies && !(kPlanOpts[i].applies & amask))
      return cli_error(ctx, "%s does not apply to --algo %s", kPlanOpts[i].name, v[O_ALGO].s);
  if (v[O_AGG].set && !ag) return cli_error(ctx, "--aggregate applies to --coll ag only");
  if (v[O_N].set && !ag && amask != A_BULK)
    return cli_error(ctx, "--n does not apply to --coll rs with --algo %s (its N is H)",
                     v[O_ALGO].s);
  if (v[O_K].set && ag && amask != A_BULK)
    return cli_error(ctx, "--k does not apply to --coll ag with --algo %s (its K is H)",
                     v[O_ALGO].s);
  return -1;
}

/* -1 on success; else the exit status after reporting. */
static int parse_args(const cli_ctx *ctx, int argc, char **argv, plan_args *a) {
  cli_val v[O_NOPTS];
  memset(a, 0, sizeof *a);
  int rc = cli_parse(ctx, kPlanOpts, O_NOPTS, argc, argv, v, plan_usage);
  if (rc >= 0) return rc;
  if (v[O_PROJECT].set) return parse_project(ctx, v, a);
  static const char *const req[] = {"--tp", "--capacity", "--hidden", "--algo", "--coll"};
  static const int reqi[] = {O_TP, O_CAP, O_HIDDEN, O_ALGO, O_COLL};
  for (int i = 0; i < 5; i++)
    if (!v[reqi[i]].set)
      return cli_error(ctx,
                       "%s is required (--tp, --capacity, --hidden, --algo and --coll are; "
                       "see --help)",
                       req[i]);
  static const tpf_algo algos[] = {TPF_ALGO_RING, TPF_ALGO_PIPELINE, TPF_ALGO_BULK};
  static const tpf_dtype dts[] = {TPF_BF16, TPF_FP16, TPF_FP32, TPF_FP8_E4M3, TPF_FP8_E5M2};
  const bool ag = v[O_COLL].u == 0;
  rc = plan_scope(ctx, v);
  if (rc >= 0) return rc;
  a->json = v[O_JSON].set;
  a->predict = v[O_PREDICT].set;
  a->cost = v[O_COST].set ? v[O_COST].s : NULL;
  a->svg = v[O_SVG].set ? v[O_SVG].s : NULL;
  if (a->cost && !a->predict && !a->svg)
    return cli_error(ctx, "--cost applies with --predict, --project or --svg only");
  if (a->svg && !cli_path_writable(a->svg))
    return cli_error(ctx, "--svg '%s' cannot be written (%s)", a->svg, strerror(errno));
  if (a->predict && (v[O_SPLITS].set || v[O_AGG].set))
    return cli_error(ctx, "%s does not apply with --predict (it prices every candidate)",
                     v[O_SPLITS].set ? "--splits" : "--aggregate");
  a->d.tp_size = (int)v[O_TP].u;
  a->d.capacity.rows = v[O_CAP].u;
  a->d.capacity.cols = v[O_HIDDEN].u;
  a->d.active.rows = v[O_TOKENS].set ? v[O_TOKENS].u : v[O_CAP].u;
  a->d.active.cols = a->d.capacity.cols;
  a->d.algo = algos[v[O_ALGO].u];
  a->d.coll = ag ? TPF_COLL_AG : TPF_COLL_RS;
  a->d.num_splits = (int)v[O_SPLITS].u;
  a->d.aggregate = v[O_AGG].set;
  a->d.dtype = v[O_DTYPE].set ? dts[v[O_DTYPE].u] : TPF_BF16;
  a->only_rank = v[O_RANK].set ? (int)v[O_RANK].u : -1;
  if (a->d.active.rows > a->d.capacity.rows)
    return cli_error(ctx, "--tokens '%s' is above --capacity %llu", v[O_TOKENS].s,
                     (ull)a->d.capacity.rows);
  if (a->only_rank >= a->d.tp_size)
    return cli_error(ctx, "--rank '%s' is not below --tp %d", v[O_RANK].s, a->d.tp_size);
  rc = plan_gemm_dims(ctx, v, a);
  if (rc >= 0) return rc;
  const uint64_t T = a->d.active.rows;
  tpf_layout_desc at_cap = a->d;
  at_cap.active = at_cap.capacity;
  tpf_status st = tpf_layout_check(&at_cap);
  if (st != TPF_OK) return capacity_error(ctx, &a->d, &a->d.algo, &a->d.coll, 1, st);
  st = tpf_layout_check(&a->d);
  if (st != TPF_OK) {
    char why[512];
    snprintf(why, sizeof why, "%s", tpf_last_error());
    uint64_t legal = 0;
    if (tpf_layout_legal_rows(&a->d, T, &legal) == TPF_OK && legal != T)
      return cli_error(ctx, "%s: %s (the smallest legal --tokens >= %llu is %llu)",
                       tpf_status_name(st), why, (ull)T, (ull)legal);
    return cli_error(ctx, "%s: %s", tpf_status_name(st), why);
  }
  return -1;
}

int tpf_cmd_plan(int argc, char **argv) {
  const cli_ctx ctx = {"tpflex plan", cli_has_word(argc, argv, "--json"), NULL};
  plan_args a;
  int prc = parse_args(&ctx, argc, argv, &a);
  if (prc >= 0) return prc;
  if (a.project) return plan_project(&ctx, &a);
  if (a.predict) return plan_predict(&ctx, &a);
  int P = a.d.tp_size;
  tpf_schedule *s = calloc((size_t)P, sizeof *s);
  if (!s) {
    fprintf(stderr, "tpflex plan: out of memory\n");
    return 1;
  }
  int built = 0;
  tpf_status rc = TPF_OK;
  for (; built < P; built++) {
    tpf_layout_desc d = a.d;
    d.rank = built;
    rc = tpf_schedule_build(&d, &a.g, &s[built]);
    if (rc != TPF_OK) break;
  }
  int ret = 0;
  if (rc != TPF_OK) {
    ret = cli_error(&ctx, "%s: %s", tpf_status_name(rc), tpf_last_error());
  } else {
    tpf_status check = tpf_schedule_check(s, P);
    if (a.json)
      plan_print_json(&a, s, P, check);
    else
      plan_print_text(&a, s, P, check);
    ret = check == TPF_OK ? 0 : 1;
    if (a.svg) {
      const int src = plan_svg(&ctx, &a, s, P);
      if (src != 0) ret = src;
    }
  }
  for (int r = 0; r < built; r++)
    tpf_schedule_free(&s[r]);
  free(s);
  return ret;
}
