/* tpflex plan: the layout and schedule of one operation, as a table or JSON.
 *
 * Builds every rank's schedule with tpf_schedule_build (or one rank's with --rank, though the
 * checker always sees all ranks), prints them and runs tpf_schedule_check over the group.
 * Exit status: 0 when the check passes, 1 when it fails, 2 for bad arguments.
 */
#include "cmds.h"

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

typedef unsigned long long ull;

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

/* "BUF@off[r,c]/ld", "X[r,c]", ... for one operand. */
static void fmt_mref(char *buf, size_t len, const tpf_mref *m) {
  static const char *const ids[] = {"-", "BUF", "X", "W", "D"};
  const char *id = m->id < 5 ? ids[m->id] : "?";
  if (m->id == TPF_MAT_BUF)
    snprintf(buf, len, "BUF@%llu[%llu,%llu]/%llu", (ull)m->off_bytes, (ull)m->row, (ull)m->col,
             (ull)m->ld);
  else
    snprintf(buf, len, "%s[%llu,%llu]", id, (ull)m->row, (ull)m->col);
}

static void fmt_deps(char *buf, size_t len, const tpf_step *st) {
  size_t used = 0;
  buf[0] = '\0';
  for (int j = 0; j < st->ndeps && used < len; j++) {
    int w = snprintf(buf + used, len - used, "%s%u", j ? "," : "", (unsigned)st->deps[j]);
    if (w < 0) break;
    used += (size_t)w;
  }
  if (st->ndeps == 0) snprintf(buf, len, "-");
}

static void fmt_work(char *buf, size_t len, const tpf_step *st) {
  char a[64], w[64], d[64];
  fmt_mref(a, sizeof a, &st->a);
  fmt_mref(w, sizeof w, &st->w);
  fmt_mref(d, sizeof d, &st->d);
  switch (st->kind) {
  case TPF_STEP_GEMM:
    snprintf(buf, len, "%llux%llux%llu %s * %s^T -> %s", (ull)st->m, (ull)st->n, (ull)st->k, a, w,
             d);
    break;
  case TPF_STEP_REDUCE:
    snprintf(buf, len, "%llux%llu sum %u of %s stride %llu -> %s", (ull)st->m, (ull)st->n,
             st->count, a, (ull)st->stride_bytes, d);
    break;
  case TPF_STEP_PEER_REDUCE:
    snprintf(buf, len, "%llux%llu sum %u ranks' %s -> %s", (ull)st->m, (ull)st->n, st->count, a, d);
    break;
  default:
    snprintf(buf, len, "-");
    break;
  }
}

static bool moves(const tpf_step *st) {
  return st->kind == TPF_STEP_SEND || st->kind == TPF_STEP_RECV;
}

static void print_text(const plan_args *a, const tpf_schedule *s, int P, tpf_status check) {
  const tpf_schedule *z = &s[a->only_rank < 0 ? 0 : a->only_rank];
  int count = 0;
  tpf_layout_desc d = a->d;
  d.rank = z->rank;
  printf("plan: %s %s, tp %d, %s, capacity [%llu, %llu], active [%llu, %llu], splits %d%s\n",
         tpf_algo_name(z->algo), tpf_coll_name(z->coll), P, tpf_dtype_name(z->dtype),
         (ull)d.capacity.rows, (ull)d.capacity.cols, (ull)z->rows, (ull)z->cols, z->num_splits,
         z->aggregate ? ", aggregate" : "");
  printf("registered bytes: %llu\nactive bytes:     %llu (%.1f%% of registered)\n",
         (ull)z->registered_bytes, (ull)z->active_bytes,
         z->registered_bytes ? 100.0 * (double)z->active_bytes / (double)z->registered_bytes : 0.0);
  printf("chunk: %llu rows, %llu bytes; gemm m %llu n %llu k %llu\n", (ull)z->chunk_rows,
         (ull)z->chunk_bytes, (ull)z->gemm_m, (ull)z->gemm_n, (ull)z->gemm_k);
  if (tpf_layout_chunk_count(&d, &count) == TPF_OK) {
    printf("active layout (%d %s):\n  %5s %14s %14s %10s\n", count,
           z->algo == TPF_ALGO_PIPELINE                           ? "blocks"
           : (z->algo == TPF_ALGO_RING && z->coll == TPF_COLL_RS) ? "slots"
                                                                  : "chunks",
           "chunk", "offset", "bytes", "rows");
    for (int j = 0; j < count; j++) {
      tpf_region r;
      if (tpf_layout_chunk(&d, j, &r) == TPF_OK)
        printf("  %5d %14llu %14llu %10llu\n", j, (ull)r.offset_bytes, (ull)r.bytes, (ull)r.rows);
    }
  }
  for (int r = 0; r < P; r++) {
    if (a->only_rank >= 0 && r != a->only_rank) continue;
    tpf_region local;
    d.rank = r;
    tpf_layout_local(&d, &local);
    printf("\nrank %d: %d steps, %d compute streams, local shard at %llu (%llu bytes)\n", r,
           s[r].nsteps, s[r].num_compute_streams, (ull)local.offset_bytes, (ull)local.bytes);
    printf("  %4s %-8s %-11s %5s %4s %3s %12s %12s %12s  %-10s %s\n", "step", "stream", "kind",
           "chunk", "peer", "tag", "src_off", "dst_off", "bytes", "deps", "work");
    for (int i = 0; i < s[r].nsteps; i++) {
      const tpf_step *st = &s[r].steps[i];
      char deps[48], work[256], src[24] = "-", dst[24] = "-", bytes[24] = "-", tag[16] = "-",
                                peer[16] = "-", chunk[16] = "-";
      fmt_deps(deps, sizeof deps, st);
      fmt_work(work, sizeof work, st);
      if (moves(st)) {
        snprintf(src, sizeof src, "%llu", (ull)st->src_off);
        snprintf(dst, sizeof dst, "%llu", (ull)st->dst_off);
        snprintf(bytes, sizeof bytes, "%llu", (ull)st->bytes);
      }
      if (moves(st) || st->kind == TPF_STEP_BARRIER) snprintf(tag, sizeof tag, "%u", st->tag);
      if (st->peer >= 0) snprintf(peer, sizeof peer, "%d", (int)st->peer);
      if (st->chunk >= 0) snprintf(chunk, sizeof chunk, "%d", (int)st->chunk);
      printf("  %4d %-8s %-11s %5s %4s %3s %12s %12s %12s  %-10s %s\n", i,
             tpf_stream_name(st->stream), tpf_step_kind_name(st->kind), chunk, peer, tag, src, dst,
             bytes, deps, work);
    }
  }
  if (check == TPF_OK)
    printf("\nschedule check: OK\n");
  else
    printf("\nschedule check: FAILED: %s: %s\n", tpf_status_name(check), tpf_last_error());
}

static void json_str(const char *s) {
  putchar('"');
  cli_json_escaped(s);
  putchar('"');
}

static void json_mref(const char *name, const tpf_mref *m) {
  printf("\"%s\":{\"id\":%u,\"off_bytes\":%llu,\"ld\":%llu,\"row\":%llu,\"col\":%llu}", name,
         (unsigned)m->id, (ull)m->off_bytes, (ull)m->ld, (ull)m->row, (ull)m->col);
}

static void print_json(const plan_args *a, const tpf_schedule *s, int P, tpf_status check) {
  const tpf_schedule *z = &s[a->only_rank < 0 ? 0 : a->only_rank];
  tpf_layout_desc d = a->d;
  d.rank = z->rank;
  int count = 0;
  printf("{\"algo\":\"%s\",\"coll\":\"%s\",\"tp\":%d,\"dtype\":\"%s\",", tpf_algo_name(z->algo),
         tpf_coll_name(z->coll), P, tpf_dtype_name(z->dtype));
  printf("\"capacity\":[%llu,%llu],\"active\":[%llu,%llu],\"num_splits\":%d,\"aggregate\":%s,",
         (ull)d.capacity.rows, (ull)d.capacity.cols, (ull)z->rows, (ull)z->cols, z->num_splits,
         z->aggregate ? "true" : "false");
  printf(
      "\"registered_bytes\":%llu,\"active_bytes\":%llu,\"chunk_rows\":%llu,\"chunk_bytes\":%llu,",
      (ull)z->registered_bytes, (ull)z->active_bytes, (ull)z->chunk_rows, (ull)z->chunk_bytes);
  printf("\"gemm\":[%llu,%llu,%llu],\"layout\":[", (ull)z->gemm_m, (ull)z->gemm_n, (ull)z->gemm_k);
  if (tpf_layout_chunk_count(&d, &count) != TPF_OK) count = 0;
  for (int j = 0; j < count; j++) {
    tpf_region r;
    if (tpf_layout_chunk(&d, j, &r) != TPF_OK) continue;
    printf("%s{\"chunk\":%d,\"offset_bytes\":%llu,\"bytes\":%llu,\"rows\":%llu}", j ? "," : "", j,
           (ull)r.offset_bytes, (ull)r.bytes, (ull)r.rows);
  }
  printf("],\"schedules\":[");
  bool first_rank = true;
  for (int r = 0; r < P; r++) {
    if (a->only_rank >= 0 && r != a->only_rank) continue;
    printf("%s{\"rank\":%d,\"num_compute_streams\":%d,\"steps\":[", first_rank ? "" : ",", r,
           s[r].num_compute_streams);
    first_rank = false;
    for (int i = 0; i < s[r].nsteps; i++) {
      const tpf_step *st = &s[r].steps[i];
      /* chunk/peer: null where the step has none (the schedule's -1). */
      char chunk[16] = "null", peer[16] = "null";
      if (st->chunk >= 0) snprintf(chunk, sizeof chunk, "%d", (int)st->chunk);
      if (st->peer >= 0) snprintf(peer, sizeof peer, "%d", (int)st->peer);
      printf("%s{\"step\":%d,\"stream\":\"%s\",\"kind\":\"%s\",\"chunk\":%s,\"peer\":%s,"
             "\"tag\":%u,\"src_off\":%llu,\"dst_off\":%llu,\"bytes\":%llu,\"m\":%llu,\"n\":%llu,"
             "\"k\":%llu,\"count\":%u,\"stride_bytes\":%llu,",
             i ? "," : "", i, tpf_stream_name(st->stream), tpf_step_kind_name(st->kind), chunk,
             peer, st->tag, (ull)st->src_off, (ull)st->dst_off, (ull)st->bytes, (ull)st->m,
             (ull)st->n, (ull)st->k, st->count, (ull)st->stride_bytes);
      json_mref("a", &st->a);
      putchar(',');
      json_mref("w", &st->w);
      putchar(',');
      json_mref("d", &st->d);
      printf(",\"deps\":[");
      for (int j = 0; j < st->ndeps; j++)
        printf("%s%u", j ? "," : "", (unsigned)st->deps[j]);
      printf("]}");
    }
    printf("]}");
  }
  printf("],\"check\":");
  json_str(check == TPF_OK ? "OK" : tpf_last_error());
  printf("}\n");
}

/* ---- --predict: the planner's candidates on a cost table ---- */

static bool plan_fp8(tpf_dtype t) {
  return t == TPF_FP8_E4M3 || t == TPF_FP8_E5M2;
}

/* What --predict and --project price for layout in: *out, the layout, and the GEMMs' dtype
 * (returned: the operation's x, tpf_plan_predict_x). --dtype fp8 with rs means the reduce-scatter
 * site of an fp8 GEMM: an fp8 RS registration is refused at run time (SPEC §11), so its buffer
 * holds bf16 partials and its GEMMs take fp8 x and w. */
static tpf_dtype priced_desc(const tpf_layout_desc *in, tpf_layout_desc *out) {
  *out = *in;
  if (plan_fp8(in->dtype) && in->coll == TPF_COLL_RS) out->dtype = TPF_BF16;
  return in->dtype;
}

/* The lines saying what --predict / --project price, where that is not what was asked: the RS
 * site of an fp8 GEMM, and GEMMs priced on another dtype's points (tpf_cost_gemm_dtype). */
static void priced_notes(const tpf_cost_table *t, const tpf_layout_desc *in) {
  tpf_layout_desc d;
  const tpf_dtype x = priced_desc(in, &d);
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
  const tpf_dtype x = priced_desc(&a->d, &pd);
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
  json_str(used);
  printf(",\"algo\":\"%s\",\"coll\":\"%s\",\"tp\":%d,\"dtype\":\"%s\",\"capacity\":[%llu,%llu],"
         "\"active\":[%llu,%llu],\"gemm\":[%llu,%llu,%llu],",
         tpf_algo_name(a->d.algo), tpf_coll_name(a->d.coll), a->d.tp_size,
         tpf_dtype_name(a->d.dtype), (ull)a->d.capacity.rows, (ull)a->d.capacity.cols,
         (ull)a->d.active.rows, (ull)a->d.active.cols, (ull)a->g.m, (ull)a->g.n, (ull)a->g.k);
  tpf_layout_desc pd; /* what is priced: the buffer's dtype, the GEMMs' and their points' */
  const tpf_dtype x = priced_desc(&a->d, &pd);
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
    json_str(c->label);
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
  json_str(r->why);
  printf("}\n");
}

static int predict_svg(const cli_ctx *ctx, const plan_args *a, const tpf_cost_table *t,
                       const char *used);

static int predict(const cli_ctx *ctx, const plan_args *a) {
  static tpf_cost_table t;
  static char used[1024];
  int lrc = cli_load_cost(ctx, "--cost", a->cost, "h200.txt", &t, used, sizeof used);
  if (lrc >= 0) return lrc;
  tpf_status rc;
  tpf_plan_result r;
  tpf_layout_desc pd;
  const tpf_dtype x = priced_desc(&a->d, &pd);
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
  priced_notes(&t, &a->d);
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
      priced_notes(t, &d);
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
  const tpf_dtype x = priced_desc(asked, &pd);
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

static int project(const cli_ctx *ctx, const plan_args *a) {
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
static int plan_svg(const cli_ctx *ctx, const plan_args *a, const tpf_schedule *s, int P) {
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
  const tpf_dtype x = priced_desc(&a->d, &pd);
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
    const tpf_dtype x = priced_desc(&at.d, &pd);
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

int tpf_cmd_plan(int argc, char **argv) {
  const cli_ctx ctx = {"tpflex plan", cli_has_word(argc, argv, "--json"), NULL};
  plan_args a;
  int prc = parse_args(&ctx, argc, argv, &a);
  if (prc >= 0) return prc;
  if (a.project) return project(&ctx, &a);
  if (a.predict) return predict(&ctx, &a);
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
      print_json(&a, s, P, check);
    else
      print_text(&a, s, P, check);
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
