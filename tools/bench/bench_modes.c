/* Section 4/5 of `tpflex bench` in both modes: ranks as threads of this process
 * (bench_ops.c's table, with the host-wall figures taken in the same run) and ranks as processes,
 * each started by the launcher (harness/launcher.h) as `tpflex bench --proc-worker FILE ...`,
 * then the modes table that puts them side by side. Calls bench_ops.c, bench_group.c and
 * bench_util.c.
 *
 * Method (procs mode). This process never hands a CUDA context to a child: the workers are
 * exec'd (fork + exec of /proc/self/exe), so whatever CUDA state the threads mode left here is
 * not inherited. Every worker reads its rank from the launcher's environment, joins the socket
 * bootstrap, creates its CUDA backend over it (ranks in different processes share GPU `device`
 * through CUDA IPC) and runs the operations with host-wall timing only: CUDA events of different
 * processes cannot be timed against each other, so each rank reads CLOCK_MONOTONIC (one clock
 * for the whole machine) around enqueue + stream synchronisation after an agreement of all
 * ranks, and a repetition is max t1 - min t0 over the ranks, exchanged through the bootstrap.
 * Rank 0 writes the whole result (bench_tp_result) to FILE after every operation; this process
 * reads it after every worker ended (or was killed at --timeout: the operations that finished
 * are kept). Every wait is bounded: the bootstrap's calls (TPF_BOOT_TIMEOUT_MS, default 120 s),
 * the backend's peer waits (TPF_CUDA_TIMEOUT_MS), and here --timeout for the whole group, after
 * which the launcher kills the workers (and a worker dies with this process: PR_SET_PDEATHSIG).
 *
 * On the simulator every worker is one simulator rank (tpf_sim_backend_create over the same
 * bootstrap, registrations in POSIX shared memory), as on CUDA.
 */
#define _POSIX_C_SOURCE 200809L
#include "bench.h"

#include "launcher.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- the launching side ------------------------------------------------------------------- */

/* The worker's command line: the shape and repetitions of this run, explicitly (so no default
 * can differ), P alone, the T values, and the result file. */
typedef struct {
  char num[8][24];
  char tokens[BENCH_MAX_TS * 21];
  char ops[BENCH_TP_NSEL * 32];
  char *argv[48];
} worker_cmd;

static void worker_argv(const bench_opts *o, int P, const char *exe, const char *path,
                        worker_cmd *w) {
  int a = 0, n = 0;
  w->argv[a++] = (char *)exe;
  w->argv[a++] = "bench";
  w->argv[a++] = "--backend";
  w->argv[a++] = o->cuda ? "cuda" : "sim";
  w->argv[a++] = "--section";
  w->argv[a++] = "tp";
  const struct {
    const char *opt;
    unsigned long long v;
  } nums[] = {{"--capacity", o->capacity},
              {"--hidden", o->hidden},
              {"--n", o->n},
              {"--iters", (unsigned)o->iters},
              {"--warmup", (unsigned)o->warmup},
              {"--tp-list", (unsigned)P}};
  for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++) {
    snprintf(w->num[n], sizeof w->num[n], "%llu", nums[i].v);
    w->argv[a++] = (char *)nums[i].opt;
    w->argv[a++] = w->num[n++];
  }
  size_t len = 0;
  w->tokens[0] = 0;
  for (int i = 0; i < o->ntps; i++)
    len += (size_t)snprintf(w->tokens + len, sizeof w->tokens - len, "%s%llu", i ? "," : "",
                            (unsigned long long)o->tps[i]);
  w->argv[a++] = "--tokens";
  w->argv[a++] = w->tokens;
  len = 0;
  w->ops[0] = 0;
  for (int i = 0; i < BENCH_TP_NSEL; i++)
    if (o->tp_sel & (1u << i))
      len += (size_t)snprintf(w->ops + len, sizeof w->ops - len, "%s%s", len ? "," : "",
                              bench_tp_sel_name(i));
  w->argv[a++] = "--ops";
  w->argv[a++] = w->ops;
  if (o->adaptive) { /* the same table, resolved here: no default can differ */
    w->argv[a++] = "--adaptive";
    w->argv[a++] = "--cost";
    w->argv[a++] = (char *)o->cost_used;
    w->argv[a++] = "--model";
    w->argv[a++] = o->dedicated ? "dedicated" : "shared";
  }
  if (!o->cuda && o->arena_bytes != 0) {
    snprintf(w->num[n], sizeof w->num[n], "%llu", (unsigned long long)(o->arena_bytes >> 20));
    w->argv[a++] = "--arena-mib";
    w->argv[a++] = w->num[n++];
  }
  w->argv[a++] = "--proc-worker";
  w->argv[a++] = (char *)path;
  w->argv[a] = NULL;
}

/* Appends "; " (when dst is not empty, and txt does not continue a "...: " label) and txt to dst
 * (n bytes), cutting what does not fit. */
static void append(char *dst, size_t n, const char *txt) {
  size_t l = strlen(dst);
  if (!txt[0] || l + 1 >= n) return;
  if (l > 0 && (l < 2 || strcmp(dst + l - 2, ": ") != 0)) {
    memcpy(dst + l, "; ", n - l >= 3 ? 2 : 0);
    l += n - l >= 3 ? 2 : 0;
  }
  size_t t = strlen(txt);
  if (t > n - 1 - l) t = n - 1 - l;
  memcpy(dst + l, txt, t);
  dst[l + t] = 0;
}

/* Runs the tp section's operations at P with every rank its own process; *res gets the result
 * rank 0 wrote (nops 0 and err[0] saying why when there is none). Returns 0, or 1 on failure. */
static int procs_run(const bench_opts *o, int P, bench_tp_result *res) {
  memset(res, 0, sizeof *res);
  res->P = P;
  char exe[4096];
  ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (len <= 0) {
    snprintf(res->setup_err, sizeof res->setup_err, "cannot read /proc/self/exe");
    return 1;
  }
  exe[len] = 0;
  const char *tmp = getenv("TMPDIR");
  char path[1024];
  snprintf(path, sizeof path, "%s/tpflex-bench-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  int fd = mkstemp(path);
  if (fd < 0) {
    snprintf(res->setup_err, sizeof res->setup_err, "cannot create a result file in %s",
             tmp && *tmp ? tmp : "/tmp");
    return 1;
  }
  close(fd);
  worker_cmd w;
  worker_argv(o, P, exe, path, &w);
  bench_progress("[4/4 tp] P=%d: starting %d processes", P, P);
  tpf_launch *l = NULL;
  int codes[TPF_MAX_RANKS];
  char why[300] = "";
  tpf_status st = tpf_launch_exec(P, w.argv, &l);
  const bool launched = st == TPF_OK;
  if (!launched) {
    snprintf(why, sizeof why, "launch: %s", tpf_last_error());
  } else {
    /* A rank that ends abnormally leaves the others 10 s to fail by themselves. */
    st = tpf_launch_wait(l, o->proc_timeout_ms, 10000, codes);
    if (st != TPF_OK) snprintf(why, sizeof why, "%s", tpf_last_error());
    tpf_launch_free(l);
  }
  FILE *f = fopen(path, "rb");
  bool have = false;
  if (f) {
    have = fread(res, sizeof *res, 1, f) == 1 && res->magic == BENCH_TP_MAGIC &&
           res->bytes == (uint32_t)sizeof *res && res->P == P;
    fclose(f);
  }
  unlink(path);
  char part[1100];
  snprintf(part, sizeof part, "%s.part", path);
  unlink(part); /* a worker killed while writing */
  if (!have) {
    memset(res, 0, sizeof *res);
    res->P = P;
  }
  /* How every worker ended, whatever rank 0 wrote: a rank that failed before it could say why
   * (a signal, an exit before the bootstrap) is named here. */
  char ends[200] = "";
  for (int r = 0, cl = 0; launched && r < P && cl < (int)sizeof ends; r++)
    if (codes[r] != 0)
      cl += snprintf(ends + cl, sizeof ends - (size_t)cl, "%srank %d: %s %d", cl ? ", " : "", r,
                     codes[r] > 128 ? "signal" : "exit status",
                     codes[r] > 128 ? codes[r] - 128 : codes[r]);
  if (!why[0] && !ends[0] && have) return res->setup_err[0] ? 1 : 0;
  append(res->setup_err, sizeof res->setup_err, why);
  if (ends[0]) append(res->setup_err, sizeof res->setup_err, "workers ended: ");
  append(res->setup_err, sizeof res->setup_err, ends);
  if (!have) append(res->setup_err, sizeof res->setup_err, "no result written");
  return 1;
}

/* ---- the section -------------------------------------------------------------------------- */

/* One row of the enqueue breakdown: operation k of rs at T index i. */
static void enq_row(const bench_tp_result *rs, const char *mode, int k, int i) {
  const double *e = rs->enq[k][i];
  bench_cell_s(rs->op[k]);
  bench_cell_s(mode);
  bench_cell_i(rs->P);
  bench_cell_i((long long)rs->ts[i]);
  bench_cell_f(e[BENCH_ENQ_HOST], 1);
  bench_cell_f(e[BENCH_ENQ_CALLS], 1);
  for (int kind = 0; kind < TPF_CUDA_ENQ_COUNT; kind++)
    bench_cell_f(e[BENCH_ENQ_KIND + kind], 2);
  bench_cell_f(rs->enq_host_max[k][i], 1);
  bench_row_end();
}

/* The CUDA backend's enqueue breakdown of every row of the modes table, in its order. */
static void enq_table(const bench_opts *o, const bench_tp_result *thr, const bench_tp_result *prc) {
  /* The kinds in tpf_cuda_enq_kind order (tpf_cuda_enq_kind_name's names). */
  static const char *const cols[] = {"op",    "mode",      "P",           "T",      "host(us)",
                                     "calls", "gemm",      "copy",        "signal", "record",
                                     "wait",  "peer_wait", "host_max(us)"};
  bench_table("tp_enqueue",
              "Section 4/5 enqueue breakdown (CUDA backend, per operation, mean over ranks)", 13,
              cols);
  for (int pi = 0; pi < o->nps; pi++) {
    const bench_tp_result *t = thr && thr[pi].nops ? &thr[pi] : NULL;
    const bench_tp_result *p = prc && prc[pi].nops ? &prc[pi] : NULL;
    const bench_tp_result *ref = t ? t : p;
    for (int i = 0; ref && i < ref->nts; i++)
      for (int k = 0; k < ref->nops; k++) {
        if (t) enq_row(t, "threads", k, i);
        if (p && k < p->nops && i < p->nts) enq_row(p, "procs", k, i);
      }
  }
  bench_note("over the %d host-wall repetitions of the modes table: every rank reads "
             "tpf_cuda_backend_enqueue_stats on its own thread before the first and after the "
             "last; mean over ranks, host_max(us) = the largest rank's host(us)",
             o->iters);
  bench_note("per operation: host(us) = host time inside the backend's execute, calls = CUDA and "
             "cuBLASLt calls (every kind but peer_wait), gemm .. wait = host us inside those "
             "calls, peer_wait = host us waiting for a peer rank (in-process handshake, the "
             "polling enqueuer's idle time, the host agreement of ranks in other processes)");
  bench_note("host(us) - (gemm + copy + signal + record + wait + peer_wait) = the backend's own "
             "bookkeeping; enqueue(us) of the modes table (the whole tpf_* call, a median) minus "
             "host(us) is roughly the core's part (planning, checks, schedule); n/a: not read "
             "(a failed operation or backend)");
}

/* One note per adaptive row of rs: the split count its planner chose at each T. */
static void chose_notes(const bench_tp_result *rs, const char *mode) {
  for (int k = 0; k < rs->nops; k++) {
    if (!rs->adaptive[k]) continue;
    char line[BENCH_MAX_TS * 32] = "";
    for (int i = 0, l = 0; i < rs->nts; i++) {
      char lab[16] = "?";
      if (rs->chose[k][i] > 0)
        snprintf(lab, sizeof lab, "%d%s", rs->chose[k][i],
                 rs->chose_aggr[k][i]   ? "a"
                 : rs->chose_pull[k][i] ? "p"
                                        : "");
      l += snprintf(line + l, sizeof line - (size_t)l, "%sT=%llu: %s", i ? ", " : "",
                    (unsigned long long)rs->ts[i], lab);
    }
    bench_note("%s %s P=%d: planner chose splits %s", rs->op[k], mode, rs->P, line);
  }
}

/* The modes table's notes: the method, the columns, the modes' caveats and the adaptive rows'
 * decisions (thr, prc: the modes' results, NULL for a mode not run). */
static void modes_notes(const bench_opts *o, const bench_tp_result *thr,
                        const bench_tp_result *prc) {
  bench_note("time(us): host wall, median of %d repetitions; each: %san agreement of every rank "
             "(threads: a barrier; procs: the socket bootstrap's allgather), t0 = CLOCK_MONOTONIC, "
             "the tpf_* call, %s, t1; time = max t1 - min t0 over all ranks",
             o->iters, o->cuda ? "rank 0's 1 GiB memset synchronised (L2 eviction), " : "",
             o->cuda ? "cudaStreamSynchronize"
                     : "(the simulator returns with the operation complete)");
  bench_note(
      "serial(us): the serial baseline (serial_ag,gemm for AG, serial_gemm,rs for RS) on its "
      "own communicator, PAIRED: every repetition runs the operation and the baseline on "
      "the same operands, in alternating order (even repetitions the operation first), "
      "each timed as above; serial(us) is the baseline's median; "
      "speedup = the median over repetitions of serial_i / time_i, spd_q1 and spd_q3 its "
      "quartiles; the serial rows pair with themselves (an A/A control: their speedup "
      "spread is the method's own); tT/tC = time / time at T = C; tT/tC/(T/C) = 1 when the "
      "time scales with T");
  bench_note("enqueue(us): host time of the tpf_* call itself (call to return), median over ranks "
             "and repetitions; vs_threads = time / the threads row's time");
  if (o->cuda)
    bench_note("procs: every rank its own process (exec'd by the launcher), all sharing GPU %d "
               "through CUDA IPC: P CUDA contexts on one GPU, whose kernels do not run "
               "concurrently unless MPS is on; the device-event table above is threads only",
               o->device);
  else if (prc)
    bench_note("simulator procs rows: every rank its own process (exec'd by the launcher), one "
               "simulator rank each over the socket bootstrap, registrations in POSIX shared "
               "memory; CPU times of this host");
  if (o->adaptive) {
    bench_note("[adaptive]: the operation on a TPF_PLAN_ADAPTIVE communicator (num_splits 0: per "
               "T the planner picks an overlap schedule or no overlap), cost table %s, model %s; "
               "speedup against the same serial baseline as the fixed rows; 'planner chose "
               "splits': rank 0's tpf_comm_plan_info after its check run (1 = no overlap, 'a' = "
               "aggregate, '1p' = the pull baseline on a RING RS communicator, '?' = not run)",
               o->cost_used, o->dedicated ? "dedicated" : "shared");
    for (int pi = 0; pi < o->nps; pi++) {
      if (thr) chose_notes(&thr[pi], "threads");
      if (prc) chose_notes(&prc[pi], "procs");
    }
  }
}

int bench_section_tp(const bench_opts *o) {
  const bool thr_on = (o->modes & BENCH_MODE_THREADS) != 0,
             prc_on = (o->modes & BENCH_MODE_PROCS) != 0;
  bench_tp_result *thr = calloc(BENCH_MAX_PS, sizeof *thr);
  bench_tp_result *prc = calloc(BENCH_MAX_PS, sizeof *prc);
  if (!thr || !prc) {
    free(thr);
    free(prc);
    fprintf(stderr, "tpflex bench: no memory for the tp section\n");
    return 1;
  }
  int rc = 0;
  if (thr_on) rc |= bench_tp_threads_table(o, thr);
  for (int pi = 0; pi < o->nps && prc_on; pi++) {
    prc[pi].P = o->ps[pi];
    if (bench_tp_nops(o, o->ps[pi]) > 0) rc |= procs_run(o, o->ps[pi], &prc[pi]);
  }

  static const char *const cols[] = {"op",          "mode",       "P",          "T",
                                     "T/C",         "time(us)",   "serial(us)", "speedup",
                                     "spd_q1",      "spd_q3",     "tT/tC",      "tT/tC/(T/C)",
                                     "enqueue(us)", "vs_threads", "#wrong"};
  char title[300];
  snprintf(title, sizeof title,
           "Section 4/5 modes: ranks as threads and ranks as processes on one %s, host wall "
           "(C=%llu H=%llu N=%llu)",
           o->cuda ? "GPU" : "host", (unsigned long long)o->capacity, (unsigned long long)o->hidden,
           (unsigned long long)o->n);
  bench_table("tp_modes", title, 15, cols);
  for (int pi = 0; pi < o->nps; pi++) {
    const bench_tp_result *t = thr_on ? &thr[pi] : NULL, *p = prc_on ? &prc[pi] : NULL;
    rc |= bench_tp_modes_rows(o, t, p);
  }
  for (int pi = 0; pi < o->nps; pi++)
    for (int m = 0; m < 2; m++) {
      const bench_tp_result *rs = m == 0 ? (thr_on ? &thr[pi] : NULL) : (prc_on ? &prc[pi] : NULL);
      const char *mode = m == 0 ? "threads" : "procs";
      if (rs && rs->setup_err[0]) bench_note("FAILED %s P=%d: %s", mode, rs->P, rs->setup_err);
      for (int k = 0; rs && k < rs->nops; k++)
        if (rs->failed[k]) bench_note("FAILED %s P=%d %s: %s", mode, rs->P, rs->op[k], rs->err[k]);
    }
  modes_notes(o, thr_on ? thr : NULL, prc_on ? prc : NULL);
  for (int pi = 0; pi < o->nps; pi++)
    if (bench_tp_nops(o, o->ps[pi]) == 0)
      bench_note("P=%d: no operation of --ops runs at this P (ring_ag_aggr+gemm needs an even "
                 "P >= 4)",
                 o->ps[pi]);
  if (!thr_on) bench_note("threads mode not run (--mode procs)");
  if (!prc_on) bench_note("procs mode not run (--mode threads)");
  if (o->cuda)
    enq_table(o, thr_on ? thr : NULL, prc_on ? prc : NULL);
  else
    bench_note("enqueue breakdown: not measured: it needs the CUDA backend's counters "
               "(tpf_cuda_backend_enqueue_stats); run with --backend cuda");
  free(thr);
  free(prc);
  return rc;
}

/* ---- the worker --------------------------------------------------------------------------- */

/* Rank 0 writes the result after every operation (to a new file, renamed over the old one), so a
 * group killed at its bound still reports the operations that finished. */
typedef struct {
  const char *path;
  int rank;
  bool bad;
} result_out;

static void write_result(const bench_tp_result *res, void *arg) {
  result_out *w = arg;
  if (w->rank != 0) return;
  char tmp[1100];
  snprintf(tmp, sizeof tmp, "%s.part", w->path);
  FILE *f = fopen(tmp, "wb");
  bool ok = f && fwrite(res, sizeof *res, 1, f) == 1;
  if (f && fclose(f) != 0) ok = false;
  if (ok && rename(tmp, w->path) != 0) ok = false;
  if (!ok) {
    if (!w->bad) fprintf(stderr, "tpflex bench worker: cannot write '%s'\n", w->path);
    unlink(tmp);
    w->bad = true;
  }
}

int bench_proc_worker(const bench_opts *o, const char *path) {
  tpf_launch_rank me;
  if (tpf_launch_rank_from_env(&me) != TPF_OK) {
    fprintf(stderr,
            "tpflex bench --proc-worker: %s (internal: only the tp section's procs mode "
            "starts it)\n",
            tpf_last_error());
    return 1;
  }
  bench_tp_result *res = calloc(1, sizeof *res);
  if (!res) return 1;
  res->magic = BENCH_TP_MAGIC;
  res->bytes = (uint32_t)sizeof *res;
  res->P = me.nranks;
  tpf_bootstrap boot;
  tpf_status st = tpf_sockboot_create(&me, o->device, 0, &boot);
  const bool have_boot = st == TPF_OK;
  bench_group *g = NULL;
  if (st == TPF_OK) st = bench_group_create_procs(o, me.nranks, &boot, &g);
  result_out w = {path, me.rank, false};
  if (st == TPF_OK) {
    bench_tp_run(g, o, false, res, write_result, &w);
  } else {
    snprintf(res->setup_err, sizeof res->setup_err, "rank %d: %s: %s", me.rank,
             have_boot ? "group" : "bootstrap", tpf_last_error());
    fprintf(stderr, "tpflex bench worker: %s\n", res->setup_err);
  }
  if (st != TPF_OK) write_result(res, &w);
  int rc = w.bad ? 1 : 0;
  if (g) bench_group_destroy(g);
  if (have_boot) tpf_sockboot_free(&boot);
  bench_progress_done();
  free(res);
  return rc | (st != TPF_OK);
}
