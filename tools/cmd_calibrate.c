/* tpflex calibrate: measures the cost table of this machine (include/tpflex/tpflex_cost.h) and
 * writes it in the text format tpf_cost_table_parse reads.
 *
 * Method. On CUDA the table's GEMM, copy, reduction, launch and handshake figures are measured
 * by calibrate_cuda.c (calibrate.h; its opening comment says how), then:
 *   sched    (--schedules, opt-in: about 100 s at the default grid) every candidate schedule of
 *            the planner, as whole operations: RING AG (splits P, P/2 aggregate, 1), PIPELINE
 *            RS (splits 8, 4, 2, 1) and RING RS (splits P, 1; its pull baseline is PIPELINE RS
 *            splits 1) for P = 2, 4, 8 ranks as threads sharing the device (up to
 *            --tp), C = --capacity (default 32768), H = --hidden, N in {3584, 1024} (or --n),
 *            T = C/64 .. C doubling (--quick: C/64, C/8, C), bf16. The planner benchmark's own
 *            runner measures them (bench_planner_sched in tools/bench/bench_planner.c: every
 *            repetition runs each schedule once, in turn, each timed with CUDA events from the
 *            earliest rank's start to the latest rank's end after a 1 GiB L2 flush; medians of
 *            15 repetitions after 3 warm-up rounds, --quick 5 after 1; every output checked), so
 *            the points and `tpflex bench --section planner` time the same thing. Written as
 *            'shared' sched lines, which the planner uses where the table is used with
 *            shared_device 1 (the planner benchmark's default --model shared).
 * The table is re-parsed before it is written. --backend sim writes the simulator's synthetic
 * table (data/cost/sim.txt, fp8_e4m3 points included; --fp8 off drops them), which is not a
 * measurement; with --schedules it adds sched lines
 * measured on the simulator (C = 1024, H = 256, N in {256, 64}, P up to 4 by default): CPU times
 * of the host simulator, which exercise the path and describe no GPU.
 */
#define _POSIX_C_SOURCE 200809L
#include "cmds.h"

#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tpflex/tpflex.h"
#include "tpflex/tpflex_cost.h"

#include "bench.h" /* bench_planner_sched: the planner benchmark's runner, for --schedules */
#include "calibrate.h"
#include "cli_args.h"

typedef unsigned long long ull;

enum {
  C_BACKEND,
  C_OUT,
  C_DTYPE,
  C_QUICK,
  C_DEVICE,
  C_PEER,
  C_HIDDEN,
  C_N,
  C_ITERS,
  C_SCHED,
  C_CAP,
  C_TP,
  C_FP8,
  C_NOPTS
};
static const cli_opt kCalOpts[C_NOPTS] = {
    [C_BACKEND] = {"--backend", CLI_CHOICE, 0, 0, "cuda|sim", NULL,
                   "optional: cuda (default) measures this GPU; sim writes the simulator's "
                   "synthetic table (not a measurement)",
                   0, false},
    [C_OUT] = {"--out", CLI_STR, 0, 0, NULL, "FILE",
               "optional: write the table there (default: stdout; the summary then goes to stderr)",
               0, false},
    [C_DTYPE] = {"--dtype", CLI_CHOICE, 0, 0, "bf16|fp16|fp32", NULL,
                 "optional: GEMM and reduction element type (default bf16)", 0, false},
    [C_QUICK] = {"--quick", CLI_FLAG, 0, 0, NULL, NULL,
                 "optional: fewer shapes, sizes and repetitions (a smoke test, ~10 s)", 0, false},
    [C_DEVICE] = {"--device", CLI_U64, 0, 63, NULL, "D", "optional: CUDA device (default 0)", 0,
                  false},
    [C_PEER] = {"--peer-device", CLI_U64, 0, 63, NULL, "D",
                "optional: destination of the peer copies (default: --device, as when the ranks "
                "share one GPU; another device measures its link, e.g. NVLink)",
                0, false},
    [C_HIDDEN] = {"--hidden", CLI_U64, 64, 1u << 16, NULL, "H",
                  "optional: hidden size H of the GEMM shapes (default 8192)", 0, false},
    [C_N] = {"--n", CLI_U64, 64, 1u << 16, NULL, "N",
             "optional: per-rank GEMM width N (default: both 3584 and 1024)", 0, false},
    [C_ITERS] = {"--iters", CLI_U64, 3, 1000, NULL, "I",
                 "optional: timed repetitions per point, medians reported (default 25, quick 7; "
                 "--schedules: per schedule, at most 166, default cuda 15, quick 5, sim 3)",
                 0, false},
    [C_SCHED] =
        {"--schedules", CLI_FLAG, 0, 0, NULL, NULL,
         "optional: also measure the planner's candidate schedules (RING AG, PIPELINE RS, RING RS; "
         "P = 2, 4, 8 ranks sharing the device, T = C/64 .. C) as sched lines (cuda: "
         "~100 s at the default grid)",
         0, false},
    [C_CAP] = {"--capacity", CLI_U64, 64, 1u << 20, NULL, "C",
               "optional, --schedules: the grid's capacity C (default cuda 32768, sim 1024)", 0,
               false},
    [C_TP] = {"--tp", CLI_U64, 2, 8, NULL, "P",
              "optional, --schedules: the largest P of 2, 4, 8 measured (default cuda 8, sim 4)", 0,
              false},
    [C_FP8] = {"--fp8", CLI_CHOICE, 0, 0, "on|off", NULL,
               "optional: fp8 GEMM points, E4M3 x E4M3 -> bf16 as 'gemm fp8_e4m3' lines (default "
               "on; fp8_e5m2 GEMMs are priced on them; off: none, so fp8 GEMMs are priced on the "
               "--dtype points; sim: on keeps, off drops the synthetic table's fp8 points)",
               0, false},
};
static const char kCalIntro[] =
    "usage: tpflex calibrate [--backend cuda|sim] [--out FILE] [--dtype bf16|fp16|fp32] [--quick] "
    "[--fp8 on|off] [options]\n"
    "Measures this machine's cost table (GEMM times, copy and reduction links, launch and\n"
    "handshake costs) for the planner (TPF_PLAN_ADAPTIVE, tpflex plan --predict --cost FILE,\n"
    "tpflex bench --section planner --cost FILE); --schedules adds the planner's candidate\n"
    "schedules measured as whole operations (sched lines). Exit 0 OK, 1 a failed measurement,\n"
    "2 bad input.";

/* ---- the text writer ---------------------------------------------------------------------- */

/* Writes the table, after `comments` (lines already starting with '#'). */
static void cal_write(FILE *f, const char *comments, const tpf_cost_table *t) {
  fputs(comments, f);
  fprintf(f, "launch_us %.2f\nhandshake_us %.2f\nbarrier_us %.2f\n", t->launch_us, t->handshake_us,
          t->barrier_us);
  fprintf(f, "copy peer %.2f %.1f\ncopy local %.2f %.1f\nreduce %.2f %.1f\n", t->peer.latency_us,
          t->peer.gbps, t->local.latency_us, t->local.gbps, t->reduce.latency_us, t->reduce.gbps);
  for (int i = 0; i < t->ngemm; i++) {
    const tpf_cost_gemm_point *g = &t->gemm[i];
    fprintf(f, "gemm %s %llu %llu %llu %.2f\n", tpf_dtype_name(g->dtype), (ull)g->m, (ull)g->n,
            (ull)g->k, g->us);
  }
  if (t->prefer_margin > 0) fprintf(f, "prefer_margin %.3f\n", t->prefer_margin);
  if (t->baseline_margin > 0) fprintf(f, "baseline_margin %.3f\n", t->baseline_margin);
  if (t->nsched > 0)
    fprintf(f,
            "# sched <device> <algo> <coll> <P> <splits> <aggregate> <dtype> <H> <N> <T> <us>\n");
  for (int i = 0; i < t->nsched; i++) {
    const tpf_cost_sched_point *p = &t->sched[i];
    fprintf(f, "sched %s %s %s %d %d %d %s %llu %llu %llu %.3f\n",
            p->shared ? "shared" : "dedicated", tpf_algo_name(p->algo), tpf_coll_name(p->coll),
            p->tp_size, p->num_splits, p->aggregate ? 1 : 0, tpf_dtype_name(p->dtype),
            (ull)p->hidden, (ull)p->n, (ull)p->rows, p->us);
  }
}

/* ---- --schedules: the planner's candidates, by the planner benchmark's runner ------------- */

typedef struct {
  int points;
  double seconds;
  uint64_t tmin, tmax;
  int pmax;
} cal_sched_report;

/* Appends the measured schedules of o's grid to t (bench_planner_sched). 0, or 1 after a failed
 * measurement (reported on stderr). */
static int cal_schedules(const cal_opts *o, tpf_cost_table *t, cal_sched_report *rep) {
  bench_opts b;
  memset(&b, 0, sizeof b);
  b.cuda = o->cuda;
  b.tp = o->tp;
  b.capacity = o->capacity;
  b.hidden = o->hidden;
  b.n = o->ns[0];
  b.quick = o->quick;
  b.device = o->device;
  b.iters = o->sched_iters;
  b.warmup = o->sched_warmup;
  b.planner_iters = o->sched_iters;
  b.planner_warmup = o->sched_warmup;
  b.pnns = o->nns;
  for (int i = 0; i < o->nns; i++)
    b.pns[i] = o->ns[i];
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  const int before = t->nsched;
  char err[400];
  fprintf(stderr,
          "calibrate: schedules: P = 2 .. %d ranks sharing the %s, C=%llu H=%llu, %d "
          "repetitions after %d warm-up round%s per schedule\n",
          o->tp, o->cuda ? "GPU" : "simulator's host", (ull)o->capacity, (ull)o->hidden,
          o->sched_iters, o->sched_warmup, o->sched_warmup == 1 ? "" : "s");
  int rc = bench_planner_sched(&b, t, err, sizeof err);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  if (rc != 0) {
    fprintf(stderr, "tpflex calibrate: --schedules FAILED: %s\n", err);
    return 1;
  }
  /* Measured points decide the planner's choice, but one schedule's time varies between runs
   * (the session-4 H200 runs, docs/results/: median 1.7-2.3 %, some small-T rows 5-13 %): keep the
   * better of the communicator's own split count and no overlap unless another candidate is faster
   * by more than 5 % (include/tpflex/tpflex_cost.h, prefer_margin). */
  t->prefer_margin = 0.05;
  /* And the promise of the adaptive planner, never slower than no overlap: an overlap schedule
   * must be predicted more than 5 % faster than the fastest no-overlap one (baseline_margin). In
   * the session-5 H200 runs (docs/results/) RING AG splits 8, measured 2 % faster than no overlap
   * at T = 4096, ran 1-4 % slower than the serial baseline in `tpflex bench`. */
  t->baseline_margin = 0.05;
  memset(rep, 0, sizeof *rep);
  rep->points = t->nsched - before;
  rep->seconds = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
  for (int i = before; i < t->nsched; i++) {
    const tpf_cost_sched_point *p = &t->sched[i];
    if (rep->tmin == 0 || p->rows < rep->tmin) rep->tmin = p->rows;
    if (p->rows > rep->tmax) rep->tmax = p->rows;
    if (p->tp_size > rep->pmax) rep->pmax = p->tp_size;
  }
  return 0;
}

/* The comment block of the sched lines. */
static void cal_sched_comments(const cal_opts *o, const cal_sched_report *r, char *buf,
                               size_t len) {
  char ns[64];
  if (o->nns == 2)
    snprintf(ns, sizeof ns, "%llu and %llu", (ull)o->ns[0], (ull)o->ns[1]);
  else
    snprintf(ns, sizeof ns, "%llu", (ull)o->ns[0]);
  snprintf(
      buf, len,
      "# sched: %d MEASURED schedules (--schedules, %.1f s): every planner candidate of RING AG, "
      "PIPELINE RS and RING RS as\n"
      "#   whole operations, P = 2 .. %d ranks as threads sharing %s, C=%llu, H=%llu, N = %s, "
      "T = %llu .. %llu, bf16;\n"
      "#   the planner benchmark's runner (tools/bench/bench_planner.c, bench_planner_sched): each "
      "schedule timed on its own,\n"
      "#   earliest rank's start to latest rank's end, median of %d repetitions after %d warm-up "
      "round%s, outputs checked.\n"
      "#   'shared' points apply where the table is used with shared_device 1 (tpflex bench "
      "--section planner, --model shared).\n%s",
      r->points, r->seconds, r->pmax, o->cuda ? "one GPU" : "the SIMULATOR's host",
      (ull)o->capacity, (ull)o->hidden, ns, (ull)r->tmin, (ull)r->tmax, o->sched_iters,
      o->sched_warmup, o->sched_warmup == 1 ? "" : "s",
      o->cuda ? ""
              : "#   SIMULATOR: CPU times of the host simulator; they exercise the path and "
                "describe no GPU.\n");
}

/* Writes the table to o->out (or stdout) after checking that it parses back. */
static int cal_emit(const cli_ctx *ctx, const cal_opts *o, const char *comments,
                    const tpf_cost_table *t) {
  char *buf = NULL;
  size_t len = 0;
  FILE *mem = open_memstream(&buf, &len);
  if (!mem) return cli_error(ctx, "out of memory");
  cal_write(mem, comments, t);
  fclose(mem);
  static tpf_cost_table back;
  tpf_status rc = tpf_cost_table_parse(buf, &back);
  if (rc != TPF_OK) {
    fprintf(stderr, "tpflex calibrate: the table does not parse back: %s\n", tpf_last_error());
    free(buf);
    return 1;
  }
  FILE *f = o->out ? fopen(o->out, "w") : stdout;
  if (!f) {
    free(buf);
    return cli_error(ctx, "--out '%s' cannot be written", o->out);
  }
  fputs(buf, f);
  free(buf);
  if (o->out) { /* standard output is checked once, as the command ends (tpflex_main.c) */
    char what[1100];
    snprintf(what, sizeof what, "--out '%s'", o->out);
    if (cli_finish_output(ctx->cmd, f, what) != 0) return 1;
  }
  return -1;
}

static void cal_cmdline(cal_opts *o, int argc, char **argv) {
  snprintf(o->cmdline, sizeof o->cmdline, "tpflex");
  for (int i = 0; i < argc; i++) {
    size_t l = strlen(o->cmdline);
    snprintf(o->cmdline + l, sizeof o->cmdline - l, " %s", argv[i]);
  }
}

static void cal_date(char *buf, size_t len) {
  time_t now = time(NULL);
  struct tm tmv;
  gmtime_r(&now, &tmv);
  strftime(buf, len, "%Y-%m-%d %H:%M:%S UTC", &tmv);
}

/* ---- --backend sim: the simulator's synthetic table --------------------------------------- */

static int cal_sim(const cli_ctx *ctx, const cal_opts *o) {
  static tpf_cost_table t;
  char used[1024];
  int rc = cli_load_cost(ctx, "--backend sim", NULL, "sim.txt", &t, used, sizeof used);
  if (rc >= 0) return rc;
  int nfp8 = 0; /* --fp8 off: the synthetic fp8 points dropped (fp8 then priced on bf16's) */
  for (int i = 0, j = 0; i < t.ngemm; i++) {
    const bool f8 = t.gemm[i].dtype == TPF_FP8_E4M3 || t.gemm[i].dtype == TPF_FP8_E5M2;
    nfp8 += f8;
    if (o->fp8 || !f8) t.gemm[j++] = t.gemm[i];
  }
  if (!o->fp8) {
    t.ngemm -= nfp8;
    nfp8 = 0;
  }
  cal_sched_report sr;
  memset(&sr, 0, sizeof sr);
  if (o->schedules && cal_schedules(o, &t, &sr) != 0) return 1;
  char date[64], comments[4096], sched[1024] = "";
  cal_date(date, sizeof date);
  if (o->schedules) cal_sched_comments(o, &sr, sched, sizeof sched);
  snprintf(comments, sizeof comments,
           "# tpflex cost table written by `%s`, %s.\n"
           "# SYNTHETIC, not a measurement: the simulator's table (%s), round numbers chosen so\n"
           "# that every planner candidate can win somewhere in a T sweep. Format:\n"
           "# include/tpflex/tpflex_cost.h.\n%s%s",
           o->cmdline, date, used,
           o->fp8 ? "" : "# --fp8 off: no fp8 gemm points (fp8 GEMMs are priced on bf16's).\n",
           sched);
  rc = cal_emit(ctx, o, comments, &t);
  if (rc >= 0) return rc;
  FILE *s = o->out ? stdout : stderr;
  fprintf(s,
          "calibrate: backend sim: wrote the synthetic table of %s (%d gemm points, %d of them "
          "fp8) to %s\n",
          used, t.ngemm, nfp8, o->out ? o->out : "stdout");
  if (o->schedules)
    fprintf(s, "  schedules  %d points measured on the simulator, P 2..%d, T %llu..%llu, %.1f s\n",
            sr.points, sr.pmax, (ull)sr.tmin, (ull)sr.tmax, sr.seconds);
  return 0;
}

/* ---- --backend cuda: calibrate_cuda.c measures, the command writes ---------------------- */

/* The measured table's comment lines: the command, the machine and the method. */
static void cal_cuda_comments(const cal_opts *o, const cal_report *rep, const cal_sched_report *sr,
                              char *comments, size_t len) {
  char date[64], sched[1024] = "";
  if (o->schedules) cal_sched_comments(o, sr, sched, sizeof sched);
  cal_date(date, sizeof date);
  snprintf(
      comments, len,
      "# tpflex cost table MEASURED by `%s`, %s.\n"
      "# Machine: %s.\n"
      "# Format: include/tpflex/tpflex_cost.h. Method (tools/cmd_calibrate.c): medians of %d "
      "repetitions timed\n"
      "# with CUDA events, each after a 256 MiB memset that evicts the L2.\n"
      "# gemm: the CUDA backend's GEMM (a P = 1 operation: one cuBLASLt call), %s [m,k]x[n,k]^T; "
      "AG shapes [m, N, H] then RS shapes [m, H, N];\n"
      "#   one sample = min(4, 32768/m) GEMMs back to back / their count. The cost model "
      "interpolates by flops\n"
      "#   alone over every point of a dtype (equal flops: the first line listed wins).\n"
      "%s"
      "# copy local: cudaMemcpyAsync device to device on device %d (fit: worst residual %.1f %%).\n"
      "# copy peer: cudaMemcpyPeerAsync device %d -> device %d%s (fit: worst residual %.1f %%).\n"
      "# reduce: the backend's reduction kernel, %d CTAs, over bytes read (fit: worst residual "
      "%.1f %%).\n"
      "# launch_us: host time per step = (GEMM enqueue %.2f + cudaMemcpyAsync enqueue %.2f) / 2 "
      "+ event record\n"
      "#   and stream wait %.2f us (empty kernel launch: %.2f us, not used).\n"
      "# handshake_us, barrier_us: host rendezvous of 2 in-process rank threads (event record, "
      "publish, wait\n"
      "#   for the peer, stream wait), per round.\n%s",
      o->cmdline, date, rep->gpu, o->iters, tpf_dtype_name(o->dtype),
      o->fp8
          ? "# gemm fp8_e4m3: the same shapes as E4M3 x E4M3 -> bf16 (tpf_bulk_overlap_ex, fp8 a "
            "and b with valid E4M3\n"
            "#   values, a_scale_inv = w_scale_inv = 1 on the device); fp8_e5m2 GEMMs are priced "
            "on these points\n"
            "#   (cuBLASLt on Hopper runs E4M3 x E5M2 at the E4M3 x E4M3 rate).\n"
          : "# --fp8 off: no fp8 gemm points; fp8 GEMMs are priced on the points above (an "
            "upper bound).\n",
      o->device, 100 * rep->local_res, o->device, o->peer,
      rep->peer_other ? "" : " (the same device: ranks sharing one GPU copy through its HBM)",
      100 * rep->peer_res, rep->ctas, 100 * rep->reduce_res, rep->h_gemm, rep->h_copy, rep->h_event,
      rep->h_kernel, sched);
}

/* The summary of what was measured (stdout with --out, else stderr). */
static void cal_cuda_summary(const cal_opts *o, const cal_report *rep, const cal_sched_report *sr,
                             const tpf_cost_table *t) {
  FILE *s = o->out ? stdout : stderr;
  fprintf(s, "calibrate summary (%s, %.1f s):\n", rep->gpu, rep->seconds);
  fprintf(s, "  gemm       %d points, %s, %.1f .. %.1f TFLOP/s\n", t->ngemm - rep->nfp8,
          tpf_dtype_name(o->dtype), rep->gemm_tf_lo, rep->gemm_tf_hi);
  if (o->fp8)
    fprintf(s, "  gemm fp8   %d points, fp8_e4m3 x fp8_e4m3 -> bf16, %.1f .. %.1f TFLOP/s\n",
            rep->nfp8, rep->fp8_tf_lo, rep->fp8_tf_hi);
  fprintf(s, "  copy local %.2f us + bytes / %.1f GB/s (worst fit residual %.1f %%)\n",
          t->local.latency_us, t->local.gbps, 100 * rep->local_res);
  fprintf(
      s,
      "  copy peer  %.2f us + bytes / %.1f GB/s (worst fit residual %.1f %%), device %d -> %d%s\n",
      t->peer.latency_us, t->peer.gbps, 100 * rep->peer_res, o->device, o->peer,
      rep->peer_other ? "" : " (same device)");
  fprintf(s,
          "  reduce     %.2f us + bytes read / %.1f GB/s (worst fit residual %.1f %%), %d CTAs\n",
          t->reduce.latency_us, t->reduce.gbps, 100 * rep->reduce_res, rep->ctas);
  fprintf(s, "  launch_us  %.2f (GEMM %.2f, copy %.2f, event pair %.2f; empty kernel %.2f)\n",
          t->launch_us, rep->h_gemm, rep->h_copy, rep->h_event, rep->h_kernel);
  fprintf(s, "  handshake_us %.2f, barrier_us %.2f\n", t->handshake_us, t->barrier_us);
  if (o->schedules)
    fprintf(s, "  schedules  %d points, P 2..%d sharing the GPU, T %llu..%llu, %.1f s\n",
            sr->points, sr->pmax, (ull)sr->tmin, (ull)sr->tmax, sr->seconds);
  fprintf(s, "  table written to %s\n", o->out ? o->out : "stdout");
}

static int cal_cuda(const cli_ctx *ctx, const cal_opts *o) {
  if (!CAL_HAVE_CUDA) {
    fprintf(stderr,
            "tpflex calibrate: --backend cuda: this build has no CUDA backend (configure with "
            "-DTPF_WITH_CUDA=ON on a machine with the CUDA toolkit); --backend sim writes the "
            "simulator's synthetic table\n");
    return 2;
  }
  char why[256] = "";
  const int count = cal_cuda_device_count(why, sizeof why);
  if (count == 0) {
    fprintf(stderr,
            "tpflex calibrate: --backend cuda: no CUDA device usable (%s); without a GPU, "
            "--backend sim writes the simulator's synthetic table\n",
            why);
    return 1;
  }
  if (o->device >= count)
    return cli_error(ctx, "--device %d: this machine has %d CUDA device%s", o->device, count,
                     count == 1 ? "" : "s");
  if (o->peer >= count)
    return cli_error(ctx, "--peer-device %d: this machine has %d CUDA device%s", o->peer, count,
                     count == 1 ? "" : "s");
  static tpf_cost_table t;
  memset(&t, 0, sizeof t);
  cal_report rep;
  memset(&rep, 0, sizeof rep);
  tpf_status st = cal_cuda_measure(o, &t, &rep);
  if (st != TPF_OK) {
    fprintf(stderr, "tpflex calibrate: FAILED: %s: %s\n", tpf_status_name(st), tpf_last_error());
    return 1;
  }
  cal_sched_report sr;
  memset(&sr, 0, sizeof sr);
  if (o->schedules && cal_schedules(o, &t, &sr) != 0) return 1;
  char comments[6144];
  cal_cuda_comments(o, &rep, &sr, comments, sizeof comments);
  int rc = cal_emit(ctx, o, comments, &t);
  if (rc >= 0) return rc;
  cal_cuda_summary(o, &rep, &sr, &t);
  return 0;
}

int tpf_cmd_calibrate(int argc, char **argv) {
  static const cli_ctx ctx = {"tpflex calibrate", false, NULL};
  cli_val v[C_NOPTS];
  int prc = cli_parse(&ctx, kCalOpts, C_NOPTS, argc, argv, v, kCalIntro);
  if (prc >= 0) return prc;
  cal_opts o;
  memset(&o, 0, sizeof o);
  static const tpf_dtype dts[] = {TPF_BF16, TPF_FP16, TPF_FP32};
  o.cuda = !v[C_BACKEND].set || v[C_BACKEND].u == 0;
  o.out = v[C_OUT].set ? v[C_OUT].s : NULL;
  o.dtype = v[C_DTYPE].set ? dts[v[C_DTYPE].u] : TPF_BF16;
  o.quick = v[C_QUICK].set;
  o.device = v[C_DEVICE].set ? (int)v[C_DEVICE].u : 0;
  o.peer = v[C_PEER].set ? (int)v[C_PEER].u : o.device;
  o.hidden = v[C_HIDDEN].set ? v[C_HIDDEN].u : 8192;
  if (v[C_N].set) {
    o.ns[o.nns++] = v[C_N].u;
  } else {
    o.ns[o.nns++] = 3584;
    o.ns[o.nns++] = 1024;
  }
  o.iters = v[C_ITERS].set ? (int)v[C_ITERS].u : (o.quick ? 7 : 25);
  o.schedules = v[C_SCHED].set;
  o.fp8 = !v[C_FP8].set || v[C_FP8].u == 0;
  cal_cmdline(&o, argc, argv);
  if (!o.schedules)
    for (int k = C_CAP; k <= C_TP; k++)
      if (v[k].set) return cli_error(&ctx, "%s applies to --schedules only", kCalOpts[k].name);
  if (!o.cuda) {
    /* sim writes a fixed table; with --schedules it measures the grid's shapes too */
    static const int cuda_only[] = {C_DTYPE, C_DEVICE, C_PEER, C_HIDDEN, C_N, C_ITERS, C_QUICK};
    for (size_t i = 0; i < sizeof cuda_only / sizeof *cuda_only; i++) {
      const int k = cuda_only[i];
      if (v[k].set && (!o.schedules || k == C_DTYPE || k == C_DEVICE || k == C_PEER))
        return cli_error(&ctx, "%s applies to --backend cuda only (sim writes a fixed table%s)",
                         kCalOpts[k].name,
                         o.schedules ? ""
                                     : "; with --schedules it takes --hidden, --n, --iters, "
                                       "--quick, --capacity and --tp");
    }
  }
  if (o.schedules) {
    if (o.dtype != TPF_BF16)
      return cli_error(&ctx,
                       "--dtype '%s' with --schedules: the schedules are measured in bf16 (the "
                       "planner benchmark's operations), so the table's GEMMs must be bf16 too",
                       v[C_DTYPE].s);
    if (v[C_ITERS].set && v[C_ITERS].u > BENCH_MAX_ITERS / BENCH_MAX_VARIANTS)
      return cli_error(&ctx,
                       "--iters '%s' with --schedules: up to %d schedules are timed per "
                       "repetition, so at most %d repetitions",
                       v[C_ITERS].s, BENCH_MAX_VARIANTS, BENCH_MAX_ITERS / BENCH_MAX_VARIANTS);
    o.capacity = v[C_CAP].set ? v[C_CAP].u : (o.cuda ? 32768 : 1024);
    o.tp = v[C_TP].set ? (int)v[C_TP].u : (o.cuda ? 8 : 4);
    if (!o.cuda) {
      o.hidden = v[C_HIDDEN].set ? v[C_HIDDEN].u : 256;
      if (!v[C_N].set) {
        o.ns[0] = 256;
        o.ns[1] = 64;
      }
    }
    o.sched_iters =
        v[C_ITERS].set ? (int)v[C_ITERS].u : (o.cuda ? (o.quick ? 5 : 15) : (o.quick ? 2 : 3));
    o.sched_warmup = o.cuda ? (o.quick ? 1 : 3) : 1;
    /* Many streams (P ranks x 5 streams) with device-side waits: a hardware queue each, as
     * `tpflex bench` sets it. Read when the CUDA context is created, so before any CUDA call. */
    if (o.cuda) setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);
  }
  if (o.out) { /* fail before measuring, not after; leave no empty file behind */
    const bool existed = access(o.out, F_OK) == 0;
    FILE *f = fopen(o.out, "a");
    if (!f) return cli_error(&ctx, "--out '%s' cannot be written", o.out);
    fclose(f);
    if (!existed) remove(o.out);
  }
  return o.cuda ? cal_cuda(&ctx, &o) : cal_sim(&ctx, &o);
}
