/* `tpflex bench`: the options, the run header, the sections in order and the output files. The
 * sections, tables and statistics are the bench library's (tools/bench/, bench.h; see
 * tools/bench/README.md, "Rooms"); the option parsing and the checked writing of files are
 * cli_args.c's, shared with the other commands. */
#define _POSIX_C_SOURCE 200809L
#include "bench.h"
#include "cli_args.h"
#include "cmds.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- options ------------------------------------------------------------------------------ */

enum {
  B_BACKEND,
  B_TP,
  B_CAP,
  B_HIDDEN,
  B_N,
  B_ITERS,
  B_WARMUP,
  B_CALLS,
  B_CSV,
  B_JSON,
  B_QUICK,
  B_SECTION,
  B_IPC_PEER,
  B_COST,
  B_MODEL,
  B_MODE,
  B_TOKENS,
  B_TP_LIST,
  B_TIMEOUT,
  B_PROC_WORKER,
  B_ARENA,
  B_OPS,
  B_ADAPTIVE,
  B_NOPTS
};
static const cli_opt kBenchOpts[B_NOPTS] = {
    [B_BACKEND] = {"--backend", CLI_CHOICE, 0, 0, "sim|cuda", NULL,
                   "simulator (default; CPU times) or the CUDA backend", 0, false},
    [B_TP] = {"--tp", CLI_U64, 1, TPF_MAX_RANKS, NULL, "P",
              "TP size of the dynamic section; the tp section runs P = 2,4,8 up to it (sim 4, "
              "cuda 8)",
              0, false},
    [B_CAP] = {"--capacity", CLI_U64, 1, 1u << 20, NULL, "C",
               "registered rows (sim default 1024, cuda 32768)", 0, false},
    [B_HIDDEN] = {"--hidden", CLI_U64, 1, 1u << 16, NULL, "H",
                  "buffer columns (sim 256, cuda 8192)", 0, false},
    [B_N] = {"--n", CLI_U64, 1, 1u << 16, NULL, "N",
             "per-rank GEMM width: AG weight rows, RS reduction dim (sim 256, cuda 3584)", 0,
             false},
    [B_ITERS] = {"--iters", CLI_U64, 1, BENCH_MAX_ITERS, NULL, "I",
                 "timed repetitions per configuration (sim 5, cuda 30)", 0, false},
    [B_WARMUP] = {"--warmup", CLI_U64, 0, 1000, NULL, "W",
                  "warm-up runs per configuration (sim 1, cuda 5)", 0, false},
    [B_CALLS] = {"--calls", CLI_U64, 100, 1000000000, NULL, "K",
                 "set_active_shape calls timed in section 1 (default 100000)", 0, false},
    [B_CSV] = {"--csv", CLI_STR, 0, 0, NULL, "FILE", "also write every table there as CSV", 0,
               false},
    [B_JSON] = {"--json", CLI_STR, 0, 0, NULL, "FILE", "also write every table there as JSON", 0,
                false},
    [B_QUICK] = {"--quick", CLI_FLAG, 0, 0, NULL, NULL,
                 "fewer sizes and repetitions (a smoke test)", 0, false},
    [B_SECTION] = {"--section", CLI_CHOICE, 0, 0,
                   "setshape|dynamic|chunking|tp|serial|all|planner|host|fp8", NULL,
                   "sections to run (repeatable; default all = 1-5; serial = tp; planner = 6, "
                   "host = the host cost per operation and fp8 = FP8 against bf16, only when "
                   "named)",
                   0, true},
    [B_IPC_PEER] = {"--ipc-peer", CLI_FLAG, 0, 0, NULL, NULL,
                    "internal: the peer process of the CUDA IPC check", 0, false},
    [B_COST] = {"--cost", CLI_STR, 0, 0, NULL, "FILE",
                "planner and tp --adaptive: cost table of the adaptive communicators and the "
                "predictions (default the shipped table: cuda data/cost/h200.txt, sim sim.txt)",
                0, false},
    [B_MODEL] = {"--model", CLI_CHOICE, 0, 0, "shared|dedicated", NULL,
                 "planner and tp --adaptive: shared (default: the table as P ranks sharing one "
                 "device see it) or dedicated (the table as is)",
                 0, false},
    [B_MODE] = {"--mode", CLI_CHOICE, 0, 0, "threads|procs|both", NULL,
                "tp section: ranks as threads of this process, as processes (each exec'd by the "
                "launcher; on cuda sharing the GPU through CUDA IPC), or both side by side "
                "(default: cuda both, sim threads); the fp8 section: threads only",
                0, false},
    [B_TOKENS] = {"--tokens", CLI_STR, 0, 0, NULL, "LIST",
                  "tp and fp8 sections: the T values, comma-separated decimals in [1, C], "
                  "ascending, each "
                  "a multiple of every P; C is always added (default cuda 1024, 2048, .. C; sim "
                  "C/8 .. C); also the host section's CUDA table (default 1024, 4096, 16384)",
                  0, false},
    [B_TP_LIST] = {"--tp-list", CLI_STR, 0, 0, NULL, "LIST",
                   "tp and fp8 sections: the P values, comma-separated decimals in [1, 64], "
                   "ascending "
                   "(default 2,4,8 up to --tp); also the host section's CUDA table (default "
                   "1,2)",
                   0, false},
    [B_TIMEOUT] = {"--timeout", CLI_U64, 1, 86400, NULL, "S",
                   "procs mode: bound of one process group's run in seconds, after which its "
                   "ranks are killed (default 900)",
                   0, false},
    [B_PROC_WORKER] = {"--proc-worker", CLI_STR, 0, 0, NULL, "FILE",
                       "internal: one rank of the tp section's procs mode (the launcher starts "
                       "it)",
                       0, false},
    [B_ARENA] = {"--arena-mib", CLI_U64, 1, 1u << 20, NULL, "MIB",
                 "simulator: size of the shared arena all registrations live in (default 1024)", 0,
                 false},
    [B_OPS] = {"--ops", CLI_STR, 0, 0, NULL, "LIST",
               "tp section: the operations to run, comma-separated, of ring_ag+gemm, "
               "ring_ag_aggr+gemm, gemm+ring_rs, gemm+pipeline_rs (default all; the serial "
               "baselines they need always run)",
               0, false},
    [B_ADAPTIVE] = {"--adaptive", CLI_FLAG, 0, 0, NULL, NULL,
                    "tp section: also run each selected operation on a T-adaptive communicator "
                    "(TPF_PLAN_ADAPTIVE; rows 'op[adaptive]'), planning with --cost and --model",
                    0, false},
};
static const char kIntro[] = "usage: tpflex bench [options]   (every option is optional)";
static const char kOutro[] =
    "Sections, numbered as the tables print them: 1 setshape  set_active_shape cost vs\n"
    "re-registration; 2 dynamic  active T vs padded to C; 3 chunking  P row-chunk cuBLASLt GEMMs\n"
    "vs one GEMM (GPU only); 4/5 tp (or serial)  P ranks as threads on one device, overlapped (4)\n"
    "vs the serial baseline (5), with one whole-layer GEMM, then the modes table: ranks as\n"
    "threads and ranks as processes side by side (--mode), host wall, serial baseline, speedup,\n"
    "time(T)/time(C) against T/C and the host enqueue cost per operation; 6 planner (only with "
    "--section\n"
    "planner)  P = 2,4,8 and T = C/64 .. C: fixed split, no overlap and the T-adaptive planner\n"
    "side by side, adaptive / min(fixed, no overlap), and the cost model's prediction and error\n"
    "(N = 3584 and 1024 on cuda, 256 and 64 on sim, or --n; --iters default cuda 15, sim 3).\n"
    "fp8 (only with --section fp8): per P of --tp-list and T of --tokens (ranks as threads) each\n"
    "operation that runs in FP8 (ring_ag+gemm, bulk_ag+gemm, gemm+ring_rs, gemm+pipeline_rs and\n"
    "the serial baselines) in bf16 and in fp8_e4m3 side by side: bytes per rank, time, the serial\n"
    "baseline of the same dtype, speedup, fp8/bf16 and #wrong.\n"
    "On the simulator every registration lives in one shared arena (--arena-mib, default\n"
    "1024): about P x C x H x 2 bytes per communicator must fit; a shape that does not is\n"
    "reported naming --arena-mib and its value. --capacity is checked up front against every\n"
    "layout the sections use (P of --tp and the tp section, C/8 steps of section 1, the fp8\n"
    "section's 1-byte layouts at C and every T), and a bad\n"
    "one is refused with the smallest capacity that fits.\n";

/* An output file that cannot be opened or written (a full disk, /dev/full) fails the command
 * before the benchmark runs: one line is written and flushed through to the file. The tables
 * replace it at the end, where every write is checked again (bench_report_write_*). */
static int check_writable(const cli_ctx *ctx, const char *opt, const char *path) {
  FILE *f = fopen(path, "w");
  if (!f) return cli_error(ctx, "%s '%s' cannot be written: %s", opt, path, strerror(errno));
  fputs("# tpflex bench: running; the tables are written here when it finishes\n", f);
  char what[1100];
  snprintf(what, sizeof what, "%s '%s'", opt, path);
  if (cli_finish_output(ctx->cmd, f, what) != 0) return 1;
  return -1;
}

/* "a,b,c": strict decimals (cli_parse_u64) in [lo, hi], ascending without repeats, at most max.
 * Returns the count, or -1 after reporting through cli_error. */
static int parse_list(const cli_ctx *ctx, const char *opt, const char *text, uint64_t lo,
                      uint64_t hi, uint64_t *out, int max) {
  int n = 0;
  const char *p = text;
  for (;;) {
    const char *e = strchr(p, ',');
    size_t len = e ? (size_t)(e - p) : strlen(p);
    char item[32];
    uint64_t v = 0;
    if (len >= sizeof item ||
        (memcpy(item, p, len), item[len] = 0, !cli_parse_u64(item, lo, hi, &v))) {
      cli_error(ctx, "%s '%s': '%.*s' is not a decimal number in [%llu, %llu]", opt, text,
                (int)(len > 40 ? 40 : len), p, (unsigned long long)lo, (unsigned long long)hi);
      return -1;
    }
    if (n == max) {
      cli_error(ctx, "%s '%s': at most %d values", opt, text, max);
      return -1;
    }
    if (n > 0 && v <= out[n - 1]) {
      cli_error(ctx, "%s '%s': the values must be ascending without repeats", opt, text);
      return -1;
    }
    out[n++] = v;
    if (!e) return n;
    p = e + 1;
  }
}

/* --ops "a,b": names of bench_tp_sel_name, each at most once, into *sel. -1, or 2 after naming
 * the bad item and the valid names. */
static int parse_ops(const cli_ctx *ctx, const char *text, unsigned *sel) {
  char valid[BENCH_TP_NSEL * 32] = "";
  for (int i = 0, l = 0; i < BENCH_TP_NSEL; i++)
    l += snprintf(valid + l, sizeof valid - (size_t)l, "%s%s", i ? ", " : "", bench_tp_sel_name(i));
  *sel = 0;
  for (const char *p = text;;) {
    const char *e = strchr(p, ',');
    const size_t len = e ? (size_t)(e - p) : strlen(p);
    int found = -1;
    for (int i = 0; i < BENCH_TP_NSEL && found < 0; i++)
      if (strlen(bench_tp_sel_name(i)) == len && strncmp(bench_tp_sel_name(i), p, len) == 0)
        found = i;
    if (found < 0)
      return cli_error(ctx, "--ops '%s': unknown operation '%.*s' (the operations: %s)", text,
                       (int)(len > 40 ? 40 : len), p, valid);
    if (*sel & (1u << found))
      return cli_error(ctx, "--ops '%s': '%s' given twice", text, bench_tp_sel_name(found));
    *sel |= 1u << found;
    if (!e) return -1;
    p = e + 1;
  }
}

/* Whether every layout the sections use accepts capacity c: RING AG, RING RS and PIPELINE RS
 * (their default split counts, bf16, H columns, 16-byte alignment as the CUDA backend and the
 * simulator's default) for P = --tp and every P of the tp section, and, for section 1, C/8
 * divisible by P (it cycles T over C/8, C/4, C/2, C). On failure `why` holds the first rule. */
static bool capacity_fits(const bench_opts *o, uint64_t c, char *why, size_t len) {
  int ps[BENCH_MAX_PS + 1], np = 0;
  ps[np++] = o->tp;
  for (int i = 0; i < o->nps; i++)
    ps[np++] = o->ps[i];
  static const tpf_algo algos[] = {TPF_ALGO_RING, TPF_ALGO_RING, TPF_ALGO_PIPELINE};
  static const tpf_coll colls[] = {TPF_COLL_AG, TPF_COLL_RS, TPF_COLL_RS};
  for (int i = 0; i < np; i++) {
    const int P = ps[i];
    if ((o->sections & BENCH_SEC_SETSHAPE) && (c % 8 != 0 || (c / 8) % (uint64_t)P != 0)) {
      snprintf(why, len, "section 1 cycles T over C/8 .. C, so C/8 must be a multiple of P = %d",
               P);
      return false;
    }
    if ((o->sections & BENCH_SEC_FP8) && !bench_fp8_layouts_fit(o, P, c, why, len)) return false;
    for (int k = 0; k < 3; k++) {
      tpf_layout_desc d;
      memset(&d, 0, sizeof d);
      d.tp_size = P;
      d.algo = algos[k];
      d.coll = colls[k];
      d.dtype = TPF_BF16;
      d.capacity = (tpf_shape){c, o->hidden};
      d.active = d.capacity;
      if (tpf_layout_check(&d) != TPF_OK) {
        snprintf(why, len, "P = %d %s %s: %s", P, tpf_algo_name(d.algo), tpf_coll_name(d.coll),
                 tpf_last_error());
        return false;
      }
    }
  }
  return true;
}

/* -1 when --capacity fits every layout; else 2 after naming the rule it breaks and the smallest
 * capacity at or above it that fits (or saying there is none up to the option's maximum). */
static int check_capacity(const cli_ctx *ctx, const bench_opts *o) {
  char why[384];
  if (capacity_fits(o, o->capacity, why, sizeof why)) return -1;
  char scratch[384];
  const uint64_t max = kBenchOpts[B_CAP].max;
  for (uint64_t c = o->capacity + 1; c <= max; c++)
    if (capacity_fits(o, c, scratch, sizeof scratch))
      return cli_error(ctx,
                       "--capacity %llu does not fit: %s; the smallest capacity >= %llu that every "
                       "section accepts is %llu (or change --hidden, --tp, --tp-list, --section)",
                       (unsigned long long)o->capacity, why, (unsigned long long)o->capacity,
                       (unsigned long long)c);
  return cli_error(ctx, "--capacity %llu does not fit: %s; no capacity up to %llu does",
                   (unsigned long long)o->capacity, why, (unsigned long long)max);
}

/* The options that apply to one section (or mode) only, refused when it does not run. Returns
 * -1, or the command's exit status after reporting. */
static int check_scope(const cli_ctx *ctx, const cli_val *v, unsigned sections, bench_opts *o) {
  const bool planner = (sections & BENCH_SEC_PLANNER) != 0;
  int prc;
  if (!planner && !o->adaptive)
    for (int k = B_COST; k <= B_MODEL; k++)
      if (v[k].set)
        return cli_error(ctx,
                         "%s applies to --section planner only (or to the tp section with "
                         "--adaptive)",
                         kBenchOpts[k].name);
  if (planner && v[B_ITERS].u > BENCH_MAX_ITERS / BENCH_MAX_VARIANTS)
    return cli_error(ctx,
                     "--iters '%s': the planner section times up to %d schedules per repetition, "
                     "so at most %d repetitions",
                     v[B_ITERS].s, BENCH_MAX_VARIANTS, BENCH_MAX_ITERS / BENCH_MAX_VARIANTS);
  const bool tp_sec = sections == 0 || (sections & BENCH_SEC_TP) != 0;
  const bool fp8_sec = (sections & BENCH_SEC_FP8) != 0;
  /* The host section's CUDA table takes its P and T values from --tp-list and --tokens. */
  const bool host_cuda = (sections & BENCH_SEC_HOST) != 0 && o->cuda;
  static const int tp_only[] = {B_MODE, B_TOKENS, B_TP_LIST, B_TIMEOUT, B_OPS, B_ADAPTIVE};
  for (size_t i = 0; i < sizeof tp_only / sizeof tp_only[0] && !tp_sec; i++) {
    const bool shared = tp_only[i] == B_MODE || tp_only[i] == B_TOKENS || tp_only[i] == B_TP_LIST;
    const bool host = host_cuda && (tp_only[i] == B_TOKENS || tp_only[i] == B_TP_LIST);
    if (v[tp_only[i]].set && !(fp8_sec && shared) && !host)
      return cli_error(ctx, "%s applies to --section tp only%s", kBenchOpts[tp_only[i]].name,
                       !shared                ? ""
                       : tp_only[i] == B_MODE ? " (and to --section fp8)"
                                              : " (and to --section fp8, and to --section host "
                                                "with --backend cuda)");
  }
  /* The fp8 section runs its ranks as threads of this process. */
  if (fp8_sec && !tp_sec && v[B_MODE].set && v[B_MODE].u != 0)
    return cli_error(ctx, "--mode %s: the fp8 section runs ranks as threads only (--mode threads)",
                     v[B_MODE].s);
  o->tp_sel = BENCH_TP_SEL_ALL;
  if (v[B_OPS].set && (prc = parse_ops(ctx, v[B_OPS].s, &o->tp_sel)) >= 0) return prc;
  o->modes =
      v[B_MODE].set ? (unsigned)v[B_MODE].u + 1u : (o->cuda ? BENCH_MODE_BOTH : BENCH_MODE_THREADS);
  if (v[B_TIMEOUT].set && !(o->modes & BENCH_MODE_PROCS))
    return cli_error(ctx, "--timeout applies to --mode procs or both only");
  o->proc_timeout_ms = (v[B_TIMEOUT].set ? v[B_TIMEOUT].u : 900) * 1000u;
  if (o->csv && (prc = check_writable(ctx, "--csv", o->csv)) >= 0) return prc;
  if (o->json && (prc = check_writable(ctx, "--json", o->json)) >= 0) return prc;
  return -1;
}

/* A backend this build lacks: 2 after saying so, else -1. */
static int check_backend(const bench_opts *o) {
#ifndef TPF_HAVE_CUDA
  if (o->cuda) {
    fprintf(stderr, "tpflex bench: this build has no CUDA backend (configure with "
                    "-DTPF_WITH_CUDA=ON on a machine with the CUDA toolkit)\n");
    return 2;
  }
#endif
#ifndef TPF_HAVE_SIM
  if (!o->cuda) {
    fprintf(stderr, "tpflex bench: this build has no simulator backend\n");
    return 2;
  }
#endif
  (void)o;
  return -1;
}

/* The shape, repetitions and sections: the options given, else the backend's defaults. */
static void set_defaults(const cli_val *v, unsigned sections, bench_opts *o) {
  const uint64_t iters = v[B_ITERS].u, warm = v[B_WARMUP].u, calls = v[B_CALLS].u;
  const bool have_warm = v[B_WARMUP].set;
  o->arena_bytes = v[B_ARENA].set ? v[B_ARENA].u << 20 : 0;
  o->ps_given = v[B_TP_LIST].set;
  o->tps_given = v[B_TOKENS].set;
  bench_sim_arena_mib = v[B_ARENA].set ? v[B_ARENA].u : 1024;
  o->tp = v[B_TP].u ? (int)v[B_TP].u : (o->cuda ? 8 : 4);
  o->capacity = v[B_CAP].u ? v[B_CAP].u : (o->cuda ? 32768 : 1024);
  o->hidden = v[B_HIDDEN].u ? v[B_HIDDEN].u : (o->cuda ? 8192 : 256);
  o->n = v[B_N].u ? v[B_N].u : (o->cuda ? 3584 : 256);
  o->iters = iters ? (int)iters : (o->cuda ? (o->quick ? 10 : 30) : (o->quick ? 3 : 5));
  o->warmup = have_warm ? (int)warm : (o->cuda ? (o->quick ? 2 : 5) : 1);
  o->setshape_calls = calls ? (long)calls : (o->quick ? 10000 : 100000);
  o->realloc_iters = o->cuda ? (o->quick ? 20 : 100) : (o->quick ? 20 : 200);
  o->sections = sections ? sections : BENCH_SEC_ALL;
  if (sections & BENCH_SEC_PLANNER) {
    o->planner_iters = iters ? (int)iters : (o->cuda ? (o->quick ? 5 : 15) : (o->quick ? 2 : 3));
    o->planner_warmup = have_warm ? (int)warm : (o->cuda ? (o->quick ? 1 : 3) : 1);
    if (v[B_N].u) {
      o->pns[o->pnns++] = v[B_N].u;
    } else {
      o->pns[o->pnns++] = o->cuda ? 3584 : 256;
      o->pns[o->pnns++] = o->cuda ? 1024 : 64;
    }
  }
  o->device = 0;
}

/* The tp section's P values: --tp-list, else 2, 4, 8 up to --tp (2 always). -1, or the exit
 * status after reporting. */
static int set_tp_list(const cli_ctx *ctx, const cli_val *v, bench_opts *o) {
  if (v[B_TP_LIST].set) {
    uint64_t ps[BENCH_MAX_PS];
    int np = parse_list(ctx, "--tp-list", v[B_TP_LIST].s, 1, TPF_MAX_RANKS, ps, BENCH_MAX_PS);
    if (np < 0) return 2;
    for (int i = 0; i < np; i++)
      o->ps[o->nps++] = (int)ps[i];
  } else {
    for (int P = 2; P <= 8; P *= 2)
      if (P <= o->tp || P == 2) o->ps[o->nps++] = P;
  }
  if (v[B_OPS].set) {
    int any = 0;
    for (int i = 0; i < o->nps; i++)
      any += bench_tp_nops(o, o->ps[i]);
    if (any == 0)
      return cli_error(ctx,
                       "--ops '%s': no operation runs at any P of the tp section "
                       "(ring_ag_aggr+gemm needs an even P >= 4; the P values: --tp-list, default "
                       "2,4,8 up to --tp)",
                       v[B_OPS].s);
  }
  return -1;
}

/* The tp section's T sweep: --tokens (C added), else GPU {1k, 2k, ..., C} (at most 32k steps of
 * 2), simulator C/8..C. -1, or the exit status after reporting. */
static int set_tokens(const cli_ctx *ctx, const cli_val *v, bench_opts *o) {
  if (v[B_TOKENS].set) {
    int nt = parse_list(ctx, "--tokens", v[B_TOKENS].s, 1, o->capacity, o->tps, BENCH_MAX_TS);
    if (nt < 0) return 2;
    o->ntps = nt;
    /* The worker gets its parent's checked list (with C, whatever P divides). */
    for (int i = 0; i < nt && !v[B_PROC_WORKER].set; i++)
      for (int pi = 0; pi < o->nps; pi++)
        if (o->tps[i] % (uint64_t)o->ps[pi] != 0)
          return cli_error(ctx,
                           "--tokens '%s': %llu is not a multiple of P = %d (the tp "
                           "section's P values: --tp-list, default 2,4,8 up to --tp)",
                           v[B_TOKENS].s, (unsigned long long)o->tps[i], o->ps[pi]);
    if (o->tps[nt - 1] != o->capacity && nt == BENCH_MAX_TS)
      return cli_error(ctx, "--tokens '%s': at most %d values below C (C is added)", v[B_TOKENS].s,
                       BENCH_MAX_TS - 1);
  } else if (o->cuda) {
    for (uint64_t t = 1024; t <= o->capacity && o->ntps < BENCH_MAX_TS; t *= 2)
      if (!o->quick || t >= o->capacity / 8) o->tps[o->ntps++] = t;
  } else {
    /* From 1 when C < 8 (doubling 0 would never end). */
    for (uint64_t t = o->capacity >= 8 ? o->capacity / 8 : 1;
         t <= o->capacity && o->ntps < BENCH_MAX_TS; t *= 2)
      if (!o->quick || t >= o->capacity / 4) o->tps[o->ntps++] = t;
  }
  if (o->ntps == 0 || o->tps[o->ntps - 1] != o->capacity)
    o->tps[o->ntps < BENCH_MAX_TS ? o->ntps++ : o->ntps - 1] = o->capacity;
  /* The fp8 section's 1-byte layouts at every T (16-byte chunks: SPEC §11). */
  char why[384];
  for (int i = 0; (o->sections & BENCH_SEC_FP8) && i < o->ntps; i++)
    for (int pi = 0; pi < o->nps; pi++)
      if (!bench_fp8_layouts_fit(o, o->ps[pi], o->tps[i], why, sizeof why))
        return cli_error(ctx, "--section fp8: T = %llu does not fit: %s%s",
                         (unsigned long long)o->tps[i], why,
                         v[B_TOKENS].set ? " (choose other --tokens)" : "");
  return -1;
}

/* Parses and checks every option into o. -1 when the benchmark is to run, else the command's
 * exit status (0 after --help, the worker's or the IPC peer's status). */
static int parse_bench(const cli_ctx *ctx, int argc, char **argv, bench_opts *o) {
  cli_val v[B_NOPTS];
  int prc = cli_parse(ctx, kBenchOpts, B_NOPTS, argc, argv, v, kIntro);
  if (prc == 0) {
    printf("%s", kOutro);
    return 0;
  }
  if (prc > 0) return prc;
  if (v[B_IPC_PEER].set) return bench_cuda_ipc_peer();
  o->quick = v[B_QUICK].set;
  o->cuda = v[B_BACKEND].set && v[B_BACKEND].u == 1;
  o->csv = v[B_CSV].set ? v[B_CSV].s : NULL;
  o->json = v[B_JSON].set ? v[B_JSON].s : NULL;
  unsigned sections = 0;
  static const unsigned sec_bits[] = {BENCH_SEC_SETSHAPE, BENCH_SEC_DYNAMIC, BENCH_SEC_CHUNKING,
                                      BENCH_SEC_TP,       BENCH_SEC_TP,      BENCH_SEC_ALL,
                                      BENCH_SEC_PLANNER,  BENCH_SEC_HOST,    BENCH_SEC_FP8};
  for (unsigned b = 0; b < 9; b++)
    if (v[B_SECTION].u & (1ull << b)) sections |= sec_bits[b];
  o->adaptive = v[B_ADAPTIVE].set;
  if ((prc = check_scope(ctx, v, sections, o)) >= 0) return prc;
  if ((prc = check_backend(o)) >= 0) return prc;
  /* Many streams (P ranks x 5 streams) with device-side flag waits: give every stream its own
   * hardware queue, as `make test-cuda` does, so no wait can sit in front of the copy it waits
   * for. Read when the CUDA context is created, so set before any CUDA call. */
  if (o->cuda) setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);
  /* Count every allocation tpflex makes. Only possible before any tpflex object exists, which
   * is the case here: bench is the whole process. */
  if (bench_alloc_count_start() != TPF_OK)
    fprintf(stderr, "tpflex bench: allocator hooks refused (%s); allocation counts are void\n",
            tpf_last_error());
  if (v[B_ARENA].set && o->cuda) return cli_error(ctx, "--arena-mib applies to --backend sim only");
  set_defaults(v, sections, o);
  static tpf_cost_table cost;
  static char cost_used[1024];
  if ((sections & BENCH_SEC_PLANNER) || o->adaptive) {
    int lrc = cli_load_cost(ctx, "--cost", v[B_COST].set ? v[B_COST].s : NULL,
                            o->cuda ? "h200.txt" : "sim.txt", &cost, cost_used, sizeof cost_used);
    if (lrc >= 0) return lrc;
    o->cost = &cost;
    o->cost_used = cost_used;
    o->dedicated = v[B_MODEL].set && v[B_MODEL].u == 1;
  }
  if ((prc = set_tp_list(ctx, v, o)) >= 0) return prc;
  if (!v[B_PROC_WORKER].set && (prc = check_capacity(ctx, o)) >= 0) return prc;
  if ((prc = set_tokens(ctx, v, o)) >= 0) return prc;
  if (o->cuda) {
    char why[256] = "";
    if (bench_cuda_device_count(why, sizeof why) <= o->device) {
      fprintf(stderr, "tpflex bench: --backend cuda needs a GPU (%s)\n", why);
      return 1;
    }
  }
  if (v[B_PROC_WORKER].set) return bench_proc_worker(o, v[B_PROC_WORKER].s);
  return -1;
}

/* The run's header: command, date, shape and how to read the tables (and the JSON/CSV meta). */
static void print_header(const bench_opts *o, int argc, char **argv) {
  char date[64];
  time_t now = time(NULL);
  struct tm tmv;
  gmtime_r(&now, &tmv);
  strftime(date, sizeof(date), "%Y-%m-%d %H:%M:%S UTC", &tmv);
  char cmdline[512] = "tpflex";
  for (int i = 0; i < argc; i++) {
    size_t l = strlen(cmdline);
    snprintf(cmdline + l, sizeof(cmdline) - l, " %s", argv[i]);
  }
  char meta[2048];
  snprintf(meta, sizeof(meta),
           "%s | %s | backend=%s P=%d C=%llu H=%llu N=%llu dtype=bf16 iters=%d warmup=%d", cmdline,
           date, o->cuda ? "cuda" : "sim", o->tp, (unsigned long long)o->capacity,
           (unsigned long long)o->hidden, (unsigned long long)o->n, o->iters, o->warmup);
  bench_report_set_meta(meta);
  printf("# tpflex bench %d.%d.%d\n# command: %s\n# date: %s\n", TPF_VERSION_MAJOR,
         TPF_VERSION_MINOR, TPF_VERSION_PATCH, cmdline, date);
  printf(
      "# backend=%s  P=%d  capacity C=%llu  hidden H=%llu  N=%llu  dtype=bf16 (fp32 accumulation)"
      "  iters=%d  warmup=%d\n",
      o->cuda ? "cuda" : "sim", o->tp, (unsigned long long)o->capacity,
      (unsigned long long)o->hidden, (unsigned long long)o->n, o->iters, o->warmup);
  if (o->cuda) {
    bench_cuda_header(o);
  } else {
    printf(
        "# NOTE: simulator times are CPU times of a pthread simulator on this host (its GEMM is a "
        "CPU loop and its\n#       'copy engine' is memcpy). They show the shape of the "
        "costs, not GPU performance: do not\n#       read them as predictions for a GPU.\n");
  }
  printf("# size = T*H*2 bytes (the whole [T, H] array), time = median us, algbw = size/time, "
         "busbw = algbw*(P-1)/P,\n# #wrong = result elements outside SPEC §7 tolerance (checked "
         "in the same run on sampled rows).\n");
}

/* The tp section's line of the header: modes, P and T values, operations, the adaptive table. */
static void print_tp_header(const bench_opts *o) {
  bench_pt_lists pt;
  bench_pt_lists_of(o, &pt);
  static const char *const mode_names[] = {"", "threads", "procs", "both"};
  char ops[BENCH_TP_NSEL * 32] = "";
  for (int i = 0, l = 0; i < BENCH_TP_NSEL && o->tp_sel != BENCH_TP_SEL_ALL; i++)
    if (o->tp_sel & (1u << i))
      l += snprintf(ops + l, sizeof ops - (size_t)l, "%s%s",
                    l ? "," : "  ops=", bench_tp_sel_name(i));
  printf("# tp section: mode=%s  P=%s  T=%s%s", mode_names[o->modes & 3u], pt.ps, pt.ts, ops);
  if (o->adaptive)
    printf("  adaptive: cost table %s, model %s", o->cost_used,
           o->dedicated ? "dedicated" : "shared");
  printf("\n");
}

/* Every selected section in order; nonzero when one failed. */
static int run_sections(const bench_opts *o) {
  int rc = 0;
  if (o->sections & BENCH_SEC_SETSHAPE) rc |= bench_section_setshape(o);
  if (o->sections & BENCH_SEC_DYNAMIC) rc |= bench_section_dynamic(o);
  if (o->sections & BENCH_SEC_CHUNKING) {
    if (o->cuda) {
      rc |= bench_cuda_section_chunking(o);
    } else {
      bench_table("chunking", "Section 3: chunking tax (one GPU, cuBLASLt)", 1,
                  (const char *const[]){"status"});
      bench_note("skipped on the simulator: the chunking tax is a property of cuBLASLt on a GPU; "
                 "run with --backend cuda");
    }
  }
  if (o->sections & BENCH_SEC_TP) rc |= bench_section_tp(o);
  if (o->sections & BENCH_SEC_PLANNER) rc |= bench_section_planner(o);
  if (o->sections & BENCH_SEC_HOST) rc |= bench_section_host(o);
  if (o->sections & BENCH_SEC_FP8) rc |= bench_section_fp8(o);
  return rc;
}

/* Every table into one of the files (--csv, --json); 0, or 1 after saying why. */
static int write_file(const char *opt, const char *path, void (*write)(FILE *)) {
  FILE *f = fopen(path, "w");
  if (!f) {
    fprintf(stderr, "tpflex bench: cannot write '%s': %s\n", path, strerror(errno));
    return 1;
  }
  write(f);
  char what[1100];
  snprintf(what, sizeof what, "%s '%s'", opt, path);
  return cli_finish_output("tpflex bench", f, what);
}

int tpf_cmd_bench(int argc, char **argv) {
  static const cli_ctx ctx = {"tpflex bench", false, NULL};
  bench_opts o;
  memset(&o, 0, sizeof(o));
  int prc = parse_bench(&ctx, argc, argv, &o);
  if (prc >= 0) return prc;
  print_header(&o, argc, argv);
  if (o.sections & BENCH_SEC_TP) print_tp_header(&o);
  if (o.sections & BENCH_SEC_FP8) bench_fp8_header(&o);
  int rc = run_sections(&o);
  bench_progress_done();
  if (o.csv) rc |= write_file("--csv", o.csv, bench_report_write_csv);
  if (o.json) rc |= write_file("--json", o.json, bench_report_write_json);
  printf("\n# %s\n",
         rc ? "bench finished with failures (see above)" : "bench finished: all checks passed");
  bench_report_free();
  return rc ? 1 : 0;
}
