/* The bench library's declarations (tpf_bench; the `tpflex bench` command around it is
 * tools/cmd_bench.c): options, rank groups (simulator world or in-process CUDA ranks),
 * device-neutral memory and timing, the CUDA primitives, and the sections. The rooms, each calling
 * only the ones above it (tools/bench/README.md, "Rooms"; scripts/check_rooms.py checks):
 *
 *   bench_util.c           leaf: clock, statistics, allocator counts, the report (bench_util.h)
 *   bench_cuda_dev.c       leaf: CUDA rank groups (harness tpf_cuda_ranks), device memory,
 *                          event timing (stubs without CUDA)
 *   bench_group.c          rank groups, the random source, memory and timing on either backend
 *   bench_lt.c             CUDA-only: the plain cuBLASLt matmul of every GPU baseline (bench_lt.h)
 *   bench_cuda_sections.c  GPU-only: cuBLASLt baselines, section 3, section 1's IPC alternative
 *   bench_ops.c            the operation jobs' runner (bench_job.h) and the variants runner
 *   bench_check.c          a job's output check, results across processes, enqueue breakdown
 *   bench_setshape.c       section 1 (set_active_shape cost)
 *   bench_tp.c             sections 2 and 4/5, through the public API
 *   bench_planner.c        section 6, the planner
 *   bench_host_cuda.c      --section host on CUDA: host and device cost against a plain matmul
 *   bench_host.c           --section host: the core's host cost per operation (then the above)
 *   bench_fp8.c            --section fp8: FP8 operations against bf16 (through bench_ops.c)
 *   bench_modes.c          section 4/5 in both modes: ranks as threads, ranks as processes (the
 *                          launcher, the hidden worker), the modes table
 */
#ifndef TPF_BENCH_H
#define TPF_BENCH_H

#include "bench_util.h"
#include "tpflex/tpflex.h"
#include "tpflex/tpflex_backend.h" /* tpf_set_error */
#include "tpflex/tpflex_cost.h"    /* the planner section */
#include "tpflex/tpflex_cuda.h"    /* tpf_bootstrap (procs mode) */

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h> /* snprintf in bench_barrier */

enum {
  BENCH_SEC_SETSHAPE = 1u << 0,
  BENCH_SEC_DYNAMIC = 1u << 1,
  BENCH_SEC_CHUNKING = 1u << 2,
  BENCH_SEC_TP = 1u << 3, /* one-GPU TP emulation and the serial baseline */
  BENCH_SEC_ALL = 0xFu,   /* sections 1-5; the planner section runs only when named */
  BENCH_SEC_PLANNER = 1u << 4,
  BENCH_SEC_HOST = 1u << 5, /* bench_host.c: host cost per operation; only when named */
  BENCH_SEC_FP8 = 1u << 6   /* bench_fp8.c: FP8 against bf16 per operation; only when named */
};

#define BENCH_MAX_ITERS 1000
#define BENCH_MAX_TS 16
#define BENCH_MAX_PS 8 /* P values of the tp section */

/* How the tp section places its ranks (--mode; bits). */
enum {
  BENCH_MODE_THREADS = 1u << 0, /* P ranks as threads of this process */
  BENCH_MODE_PROCS = 1u << 1,   /* every rank its own process (the launcher, CUDA IPC) */
  BENCH_MODE_BOTH = 3u
};

typedef struct {
  bool cuda;              /* --backend cuda */
  int tp;                 /* --tp: P of the dynamic section and the largest P of the tp section */
  uint64_t capacity;      /* C */
  uint64_t hidden;        /* H (AG: K of the GEMM; RS: buffer columns) */
  uint64_t n;             /* N per rank (AG: weight rows; RS: K per rank) */
  int iters, warmup;      /* timed repetitions and warm-up runs per configuration */
  long setshape_calls;    /* calls timed in section 1 (>= 1e5 unless --quick) */
  int realloc_iters;      /* destroy + create repetitions in section 1 */
  const char *csv, *json; /* output files or NULL */
  bool quick;
  unsigned sections; /* BENCH_SEC_* */
  int device;        /* CUDA device */
  int ntps;          /* T sweep of the tp section (ascending; the last is C) */
  uint64_t tps[BENCH_MAX_TS];
  int nps; /* P values of the tp section */
  int ps[BENCH_MAX_PS];
  bool ps_given, tps_given; /* --tp-list, --tokens given (the CUDA host table's own defaults) */
  unsigned modes;           /* BENCH_MODE_* of the tp section */
  uint64_t proc_timeout_ms; /* bound of one process group's run (procs mode) */
  uint64_t arena_bytes;     /* --arena-mib: the simulator's arena (0: its default, 1 GiB) */
  unsigned tp_sel;          /* --ops: bit i set = bench_tp_sel_name(i) runs (all by default) */
  bool adaptive; /* --adaptive: each tp operation also on a TPF_PLAN_ADAPTIVE communicator */
  /* the planner section (and the tp section's --adaptive rows: cost, cost_used, dedicated) */
  const tpf_cost_table *cost; /* the table of the adaptive communicators and the predictions */
  const char *cost_used;      /* the file it came from */
  bool dedicated;             /* --model dedicated: the table as is (one device per rank) */
  int planner_iters, planner_warmup;
  int pnns; /* N values */
  uint64_t pns[2];
} bench_opts;

/* --arena-mib as typed (default 1024): bench_note adds it to an arena failure's message. */
extern uint64_t bench_sim_arena_mib;

/* ---- rank groups (bench_group.c) ----------------------------------------------------------- */

typedef struct bench_group bench_group;
typedef struct bench_rank bench_rank;
typedef tpf_status (*bench_rank_fn)(bench_rank *rk, void *arg);
/* A group of P ranks. The simulator's is a tpf_sim_world; CUDA's is P persistent threads with a
 * backend and a stream each (harness/cuda_env.h, through bench_cuda_dev.c), all on one device. */
struct bench_group {
  const bench_opts *o;
  bool cuda;
  int tp;     /* P: ranks of the group, in all processes */
  int nlocal; /* rank threads in this process: tp, or 1 for a process-mode rank */
  int rank0;  /* the global rank of this process's first rank thread */
  /* Ranks in other processes (procs mode): the bootstrap between the processes (one per process;
   * NULL when every rank is here). The rank's backend is created over it (CUDA, or the simulator
   * with ranks as processes: tpf_sim_backend_create). */
  const tpf_bootstrap *xboot;
  atomic_int xfail;      /* a bootstrap call failed (sticky): every later agreement fails */
  char xerr[300];        /* its message */
  pthread_barrier_t bar; /* the nlocal rank threads of this process */
  /* Random inputs: src[i] = pool[i % pool_elems] for i < src_elems, so any element of any
   * operand view into src is known on the host without copying it back. */
  uint16_t *pool;
  uint64_t pool_elems;
  void *src; /* host (simulator) or device (CUDA) */
  uint64_t src_elems;
  /* The FP8 (E4M3) source: src8[i] = pool8[i % pool_elems], pool8[i] = pool[i] rounded to E4M3
   * (bench_src8_reserve; NULL until an FP8 operation needs it). */
  uint8_t *pool8;
  void *src8;
  uint64_t src8_elems;
  double *t0, *t1;     /* simulator timing: [rank * BENCH_MAX_ITERS + it], ns */
  double *h0, *h1;     /* host-wall timing, either backend: [rank * BENCH_MAX_ITERS + it], ns */
  double *enq;         /* host time of the operation call: [rank * BENCH_MAX_ITERS + it], ns */
  void *sim_world;     /* the simulator world (procs mode: the world of sim_be) */
  tpf_backend *sim_be; /* procs mode on the simulator: this process's rank */
  void *cu;            /* bench_cuda_dev.c's state */
};
struct bench_rank {
  int rank, tp;
  void *stream; /* cudaStream_t (CUDA) or NULL (simulator) */
  bench_group *g;
  tpf_backend *be;
};

/* tp == 0 makes a group without ranks: inputs only (the CUDA GEMM baselines). */
tpf_status bench_group_create(const bench_opts *o, int tp, bench_group **out);
/* This process's part of a group of tp ranks spread over xboot->tp_size processes (procs mode;
 * xboot outlives the group): CUDA, one rank thread, rank xboot->rank, its backend created over
 * xboot; simulator, likewise (tpf_sim_backend_create over xboot). Collective over xboot. */
tpf_status bench_group_create_procs(const bench_opts *o, int tp, const tpf_bootstrap *xboot,
                                    bench_group **out);
/* Runs fn once per rank, each on its own thread; the same backend objects in every run. */
tpf_status bench_group_run(bench_group *g, bench_rank_fn fn, void *arg);
void bench_group_destroy(bench_group *g);
/* Registrations created so far (simulator statistics; -1 when the backend does not count). */
long long bench_group_registrations(bench_group *g);
/* Every rank of the group waits for all others: this process's rank threads, then (procs
 * mode) the first of them joins the other processes through the bootstrap. A failed bootstrap
 * call is kept in xfail (the agreements below then fail) and waits no more. */
static inline void bench_barrier(bench_rank *rk) {
  bench_group *g = rk->g;
  pthread_barrier_wait(&g->bar);
  if (g->xboot) {
    if (rk->rank == g->rank0 && !atomic_load(&g->xfail) &&
        g->xboot->barrier(g->xboot->ctx) != TPF_OK) {
      snprintf(g->xerr, sizeof g->xerr, "bootstrap barrier: %s", tpf_last_error());
      atomic_store(&g->xfail, 1);
    }
    pthread_barrier_wait(&g->bar);
  }
}
/* A barrier that also agrees on a failure flag: true (and *flag set) on every rank of every
 * process when any rank's *flag was set or a bootstrap call failed. */
bool bench_agree_failed(bench_rank *rk, atomic_int *flag);
/* The first rank thread of this process (procs mode): every process's xboot->allgather of
 * `bytes` from mine into all (xboot->tp_size * bytes). TPF_OK, or the bootstrap's status (kept
 * in xfail). */
tpf_status bench_xallgather(bench_group *g, const void *mine, void *all, size_t bytes);

/* Device-neutral memory: host memory on the simulator, device memory on CUDA. */
void *bench_mem_alloc(bench_group *g, uint64_t bytes);
void bench_mem_free(bench_group *g, void *p);
tpf_status bench_mem_copy(bench_rank *rk, void *dst, const void *src,
                          uint64_t bytes); /* dev->dev */
tpf_status bench_mem_download(bench_rank *rk, void *host, const void *dev, uint64_t bytes);
tpf_status bench_mem_poison(bench_rank *rk, void *dev, uint64_t bytes); /* 0xFF: bf16 NaN */
/* Makes g->src hold at least `elems` elements (see struct bench_group). Call between runs. */
tpf_status bench_src_reserve(bench_group *g, uint64_t elems);
/* Host value of src element i. */
float bench_src_value(const bench_group *g, uint64_t i);
/* The same for g->src8 (1-byte E4M3 elements; pool8 made on first use). Call between runs. */
tpf_status bench_src8_reserve(bench_group *g, uint64_t elems);

/* Timing of one repetition across all ranks: every rank calls begin, its operation, then end.
 * Afterwards rank 0's bench_time_collect gives the time from the earliest start to the latest
 * end of each repetition, in microseconds. On CUDA the interval is measured with events and
 * begins after a 1 GiB memset (BENCH_FLUSH_BYTES) that flushes the L2 and lets the host run
 * ahead. */
tpf_status bench_time_begin(bench_rank *rk, int it);
tpf_status bench_time_end(bench_rank *rk, int it);
tpf_status bench_time_collect(bench_rank *rk, int n, double *us);
tpf_status bench_sync(bench_rank *rk);
/* Host-wall timing of one repetition, the same in both modes: begin flushes the L2 (CUDA: global
 * rank 0's 1 GiB memset, synchronised), agrees on *failed with every rank (bench_agree_failed:
 * a barrier) and reads CLOCK_MONOTONIC (t0); it returns the agreement. end synchronises the
 * rank's stream and reads the clock (t1). collect (every rank thread calls it) gives the first
 * rank thread of each process us[it] = max over all ranks of t1 - min over all ranks of t0, and
 * *enq_us = the median over ranks and repetitions of the enqueue times in g->enq, microseconds. */
bool bench_host_begin(bench_rank *rk, int it, atomic_int *failed);
void bench_host_end(bench_rank *rk, int it);
tpf_status bench_host_collect(bench_rank *rk, int n, double *us, double *enq_us);
/* The same over slots [first, first + n) (first + n <= BENCH_MAX_ITERS): a second series of
 * repetitions timed alternately with the first (the paired serial baseline of the tp section). */
tpf_status bench_host_collect_at(bench_rank *rk, int first, int n, double *us, double *enq_us);

/* ---- CUDA primitives (bench_cuda_dev.c; stubs returning TPF_EUNSUPPORTED without CUDA) ------- */
/* What the timing flush writes before each timed repetition: more than the L2 holds. */
#define BENCH_FLUSH_BYTES (1ull << 30)
tpf_status bench_cuda_group_init(bench_group *g);
tpf_status bench_cuda_group_run(bench_group *g, bench_rank_fn fn, void *arg);
void bench_cuda_group_fini(bench_group *g);
void *bench_cuda_alloc(uint64_t bytes);
void bench_cuda_free(void *p);
tpf_status bench_cuda_copy(bench_rank *rk, void *dst, const void *src, uint64_t bytes);
/* dst[0, total) = host[0, unit) repeated (one upload, then device copies). */
tpf_status bench_cuda_tile(void *dst, const void *host, uint64_t unit_bytes, uint64_t total_bytes);
tpf_status bench_cuda_download(bench_rank *rk, void *host, const void *dev, uint64_t bytes);
tpf_status bench_cuda_poison(bench_rank *rk, void *dev, uint64_t bytes);
tpf_status bench_cuda_time_begin(bench_rank *rk, int it);
tpf_status bench_cuda_time_end(bench_rank *rk, int it);
tpf_status bench_cuda_time_collect(bench_rank *rk, int n, double *us);
tpf_status bench_cuda_sync(bench_rank *rk);
/* The L2 flush of host-wall timing: rank 0's 1 GiB memset, then its stream synchronised. */
tpf_status bench_cuda_flush(bench_rank *rk, int it);
/* This rank's tpf_cuda_backend_enqueue_stats (cumulative), read on the rank's own thread. */
tpf_status bench_cuda_enq_stats(bench_rank *rk, tpf_cuda_enqueue_stats *out);
/* CUDA devices visible (0 without a usable GPU or without CUDA; why gets CUDA's text then). */
int bench_cuda_device_count(char *why, size_t len);
long long bench_cuda_dev_used(void); /* bytes in use on the device, -1 without CUDA */

#ifdef TPF_HAVE_CUDA
#include <cuda_runtime.h>
/* A CUDA runtime failure as TPF_EBACKEND naming the call, CUDA's error name and text. */
tpf_status bench_cuda_err(cudaError_t e, const char *what);
/* Returns bench_cuda_err from the enclosing function when `call` fails. */
#define BENCH_CU(call, what)                                                                       \
  do {                                                                                             \
    cudaError_t e_ = (call);                                                                       \
    if (e_ != cudaSuccess) return bench_cuda_err(e_, what);                                        \
  } while (0)
#endif

/* ---- GPU-only sections and baselines (bench_cuda_sections.c; stubs without CUDA) ---------- */
/* Median time of one cuBLASLt GEMM d[m, n] = x[m, k] * w[n, k]^T (bf16, fp32 accumulation) on
 * pool inputs; the whole-layer baseline of the tp section. */
tpf_status bench_cuda_gemm_us(bench_group *g, uint64_t m, uint64_t n, uint64_t k, double *us);
void bench_cuda_header(const bench_opts *o);
int bench_cuda_section_chunking(const bench_opts *o);
/* Rows of section 1's table for cudaFree + cudaMalloc (+ IPC export, + a peer's open). */
int bench_cuda_setshape_alternatives(const bench_opts *o);
/* The hidden helper process of the IPC alternative (`tpflex bench --ipc-peer`). */
int bench_cuda_ipc_peer(void);

/* ---- several schedules of one operation side by side (bench_ops.c; the planner section) --- */

#define BENCH_MAX_VARIANTS 6
/* One communicator (ADAPTIVE when cost is set) over a T sweep; every repetition runs each
 * variant once, in order, each timed on its own (so drift spreads over all of them), with the
 * operation's num_splits set per variant (tpf_op_options; 0 = the planner's choice). */
typedef struct {
  tpf_algo algo; /* TPF_ALGO_RING: RING AG or RING RS (coll); TPF_ALGO_PIPELINE: PIPELINE RS */
  tpf_coll coll;
  uint64_t C, H, N; /* as bench_job: AG buffer [C, H], w [N, H]; RS x [C, N], w [H, N] */
  int nts;
  uint64_t ts[BENCH_MAX_TS];
  int iters, warmup;
  const tpf_cost_table *cost; /* NULL: a FIXED communicator */
  int nvar;
  int splits[BENCH_MAX_VARIANTS];
  bool legal[BENCH_MAX_VARIANTS][BENCH_MAX_TS]; /* false: that variant is skipped at that T */
  /* results (NaN where not run or failed) */
  double us[BENCH_MAX_VARIANTS][BENCH_MAX_TS];
  long long wrong[BENCH_MAX_TS];
  tpf_plan_result plan[BENCH_MAX_TS]; /* rank 0's adaptive decision per T (ncand 0: none) */
  char err[300];
} bench_variants;
/* The group's timing storage must hold iters * nvar repetitions (create it with o->iters at
 * least that). */
tpf_status bench_run_variants(bench_group *g, bench_variants *v);

/* ---- the tp section's operations on one group (bench_tp.c; bench_modes.c) ----------------- */

/* The enqueue breakdown of one operation (bench_tp_result.enq): from the differences of
 * tpf_cuda_enqueue_stats over the host-wall repetitions, per operation: host us inside the
 * backend's execute, CUDA calls (every kind but peer_wait), host us in each kind. */
enum {
  BENCH_ENQ_HOST = 0,
  BENCH_ENQ_CALLS = 1,
  BENCH_ENQ_KIND = 2, /* + tpf_cuda_enq_kind */
  BENCH_ENQ_NF = 2 + TPF_CUDA_ENQ_COUNT
};

#define BENCH_TP_MAX_OPS 10 /* 4 operations, their 4 adaptive versions, 2 serial baselines */
/* The operations of the tp section that --ops can select (the serial baselines run whenever a
 * selected operation needs one). */
#define BENCH_TP_NSEL 4
#define BENCH_TP_SEL_ALL ((1u << BENCH_TP_NSEL) - 1u)
/* The name of selectable operation i (ring_ag+gemm, ring_ag_aggr+gemm, gemm+ring_rs,
 * gemm+pipeline_rs), as the tables print it; NULL for i out of range. */
const char *bench_tp_sel_name(int i);
/* Operations (rows, serial baselines included) the tp section runs at P with o->tp_sel: 0 when
 * none of the selected ones applies at P (ring_ag_aggr+gemm needs an even P >= 4). */
int bench_tp_nops(const bench_opts *o, int P);
/* The table every adaptive communicator of the bench plans with: o->cost as it is (--model
 * dedicated) or as P ranks sharing one device see it (the default, --model shared: shared_device
 * 1, every rank's GEMMs take the device in turn, and the peer link is the device-local one). */
void bench_cost_model(const bench_opts *o, tpf_cost_table *out);
/* What one P of the tp section measured in one mode. Written whole to a file by a process-mode
 * worker and read back by the launching process (the same executable: the same layout). */
typedef struct {
  uint32_t magic, bytes; /* BENCH_TP_MAGIC, sizeof(bench_tp_result) */
  int P, nops, nts;
  uint64_t ts[BENCH_MAX_TS];
  char op[BENCH_TP_MAX_OPS][32];
  bool ag[BENCH_TP_MAX_OPS];
  bool adaptive[BENCH_TP_MAX_OPS];                 /* on a TPF_PLAN_ADAPTIVE communicator */
  int chose[BENCH_TP_MAX_OPS][BENCH_MAX_TS];       /* adaptive: the planner's split count (0: ?) */
  bool chose_aggr[BENCH_TP_MAX_OPS][BENCH_MAX_TS]; /* and whether with aggregate */
  bool chose_pull[BENCH_TP_MAX_OPS][BENCH_MAX_TS]; /* RING RS: the pull baseline (PIPELINE) */
  int serial[BENCH_TP_MAX_OPS];                    /* index of the op's serial baseline */
  double dev_us[BENCH_TP_MAX_OPS][BENCH_MAX_TS];   /* device events, median (NaN: not taken) */
  double host_us[BENCH_TP_MAX_OPS][BENCH_MAX_TS];  /* host wall, median */
  double enq_us[BENCH_TP_MAX_OPS][BENCH_MAX_TS];   /* operation call to return, median */
  /* The paired serial baseline: every host-wall repetition runs the operation and the serial
   * baseline on its own communicator, in alternating order, each timed alike (the serial rows pair
   * with themselves: an A/A control of the method). pair_us: the baseline's median; spd: the median
   * over repetitions of serial_i / op_i, and its quartiles. NaN where not measured. */
  double pair_us[BENCH_TP_MAX_OPS][BENCH_MAX_TS];
  double spd[BENCH_TP_MAX_OPS][BENCH_MAX_TS], spd_q1[BENCH_TP_MAX_OPS][BENCH_MAX_TS],
      spd_q3[BENCH_TP_MAX_OPS][BENCH_MAX_TS];
  /* The CUDA backend's enqueue breakdown (BENCH_ENQ_*), mean over ranks, and the largest rank's
   * host us; NaN where not measured (the simulator, a failure). */
  double enq[BENCH_TP_MAX_OPS][BENCH_MAX_TS][BENCH_ENQ_NF];
  double enq_host_max[BENCH_TP_MAX_OPS][BENCH_MAX_TS];
  long long wrong[BENCH_TP_MAX_OPS][BENCH_MAX_TS];
  bool failed[BENCH_TP_MAX_OPS];
  char err[BENCH_TP_MAX_OPS][300];
  char setup_err[300]; /* the group, the bootstrap or the launch failed ("" when not) */
} bench_tp_result;
#define BENCH_TP_MAGIC 0x54504D34u /* "TPM4" */
/* Runs every operation of the tp section at P = g->tp over the T values of o->tps that P divides,
 * each job o->warmup warm-up runs, then (events) o->iters device-event repetitions, then o->iters
 * host-wall repetitions, then the check. events is false in procs mode (no interprocess event
 * timing). Called by this process's main thread; the group runs the ranks. *res is complete on
 * every process; its rows are there from the start (n/a until their operation ran), and done
 * (NULL: none) is called with it after each operation. The status of the first failing
 * operation (res->failed/err say which). */
tpf_status bench_tp_run(bench_group *g, const bench_opts *o, bool events, bench_tp_result *res,
                        void (*done)(const bench_tp_result *res, void *arg), void *done_arg);
/* Section 4/5's device-event table for ranks as threads: for every P of o->ps a group, the
 * operations (bench_tp_run with events, filling res[pi]; the host-wall figures come along) and
 * the whole-layer GEMMs. Returns 0, or 1 after a failure (the rows say which). */
int bench_tp_threads_table(const bench_opts *o, bench_tp_result *res);
/* Rows of the modes table for one P: threads (NULL: not run) and procs (NULL: not run) side by
 * side per (T, operation). Returns 1 when a row has #wrong != 0 or a failure, else 0. */
int bench_tp_modes_rows(const bench_opts *o, const bench_tp_result *threads,
                        const bench_tp_result *procs);

/* ---- one operation in a chosen dtype (bench_ops.c; the fp8 section, bench_fp8.c) ---------- */

/* The operations that run in FP8 (SPEC §11): RING AG + GEMM, BULK AG beside an independent GEMM
 * of the same size ([T, H] x [N, H]^T), the AG serial baseline (RING AG, 1 split), GEMM + RING
 * RS, GEMM + PIPELINE RS and the RS serial baseline (PIPELINE RS, 1 split). */
typedef enum {
  BENCH_DOP_RING_AG = 0,
  BENCH_DOP_BULK_AG,
  BENCH_DOP_SERIAL_AG,
  BENCH_DOP_RING_RS,
  BENCH_DOP_PIPE_RS,
  BENCH_DOP_SERIAL_RS,
  BENCH_DOP_COUNT
} bench_dop;
/* The name the tables print (ring_ag+gemm, bulk_ag+gemm, serial_ag,gemm, ...). */
const char *bench_dop_name(bench_dop op);
/* One operation over a T sweep at dtype: TPF_BF16, or TPF_FP8_E4M3 for every GEMM operand and
 * the AG buffer (RS buffers and D stay bf16; a_scale_inv 0.75, w_scale_inv 2 in backend memory),
 * timed like the tp section's device-event table (o->warmup, then o->iters repetitions; CUDA
 * events, the simulator's clock), then the output poisoned, run again and checked against
 * harness/reference.c (SPEC §7, as every section). */
typedef struct {
  bench_dop op;
  tpf_dtype dtype;
  int nts; /* in: T values (those P divides and <= C run); out: the ones run */
  uint64_t ts[BENCH_MAX_TS];
  double us[BENCH_MAX_TS]; /* median, NaN where not run */
  long long wrong[BENCH_MAX_TS], checked[BENCH_MAX_TS];
  char err[300]; /* the first failure ("" when none) */
} bench_dtype_run;
/* Runs r on group g (P = g->tp; shape, repetitions from o). The status of the run. */
tpf_status bench_run_dtype(bench_group *g, const bench_opts *o, bench_dtype_run *r);

/* ---- sections (bench_setshape.c, bench_tp.c, bench_planner.c, bench_modes.c; 3 is
 * bench_cuda_sections.c) ---------------------------------------------------------------------- */
int bench_section_setshape(const bench_opts *o);
int bench_section_dynamic(const bench_opts *o);
int bench_section_tp(const bench_opts *o); /* bench_modes.c: both modes */
int bench_section_planner(const bench_opts *o);
int bench_section_host(const bench_opts *o); /* bench_host.c */
/* Its CUDA table (bench_host_cuda.c; a stub without CUDA): per operation kind, P and T, the
 * tpf_* call's host cost and device time against one cuBLASLt matmul of the same shape. */
int bench_host_cuda_table(const bench_opts *o);
int bench_section_fp8(const bench_opts *o); /* bench_fp8.c */
/* The fp8 section's line of the run header (P, T, operations, scales). */
/* The P and T lists of the tp and fp8 sections as printed in their header lines ("2,4,8"). */
typedef struct {
  char ps[64];
  char ts[BENCH_MAX_TS * 21];
} bench_pt_lists;
void bench_pt_lists_of(const bench_opts *o, bench_pt_lists *l);
void bench_fp8_header(const bench_opts *o);
/* Whether the fp8 section's layouts (RING AG and BULK AG on an E4M3 buffer; RING RS and PIPELINE
 * RS on bf16) accept `rows` active rows at P with o->hidden columns; why gets the first rule
 * broken. For the capacity and every T of --tokens (tools/cmd_bench.c). */
bool bench_fp8_layouts_fit(const bench_opts *o, int P, uint64_t rows, char *why, size_t len);

/* ---- measured schedule points (bench_planner.c; tpflex calibrate --schedules) -------------- */
/* Times every candidate of the planner for RING AG and PIPELINE RS, for P = 2, 4, 8 (those <=
 * o->tp; 2 always), N in o->pns, T = C/64 .. C (o->quick: C/64, C/8, C) with C = o->capacity,
 * H = o->hidden, bf16, with the planner section's runner and timing (bench_run_variants: every
 * repetition runs each schedule once, in turn, each timed on its own from the earliest rank's
 * start to the latest rank's end; o->planner_iters after o->planner_warmup; outputs checked) on
 * a FIXED communicator per (operation, P, N). Appends one shared sched point per (schedule, T)
 * to t (medians; all ranks share the one device). Returns 0, or 1 with err filled for a failed
 * run, wrong outputs or a full table (t then holds the points added before). Progress on
 * stderr; nothing on stdout. */
int bench_planner_sched(const bench_opts *o, tpf_cost_table *t, char *err, size_t errlen);

/* The hidden process-mode worker (`tpflex bench --proc-worker FILE`, started by the launcher):
 * one rank of the tp section at P = TPF_LAUNCH_NRANKS; rank 0 writes the bench_tp_result to FILE.
 * Exit status 0 when the result was written (whatever it says), else 1. */
int bench_proc_worker(const bench_opts *o, const char *path);

#endif /* TPF_BENCH_H */
