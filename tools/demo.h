/* Private declarations of `tpflex demo`. The rooms:
 *   cmd_demo.c     the flow, read as the API example: the layer's communicators (kSites), one
 *                  manager per rank, set_active_shape per microbatch, the operations
 *   demo_layer.c   options, the layer's layouts and schedules: microbatch sizes, bytes moved
 *   demo_env.c     the backends: simulator world and counters, the CUDA environment, clocks
 *   demo_checks.c  per-rank operands, inputs and the checks against the harness reference
 *   demo_report.c  the table rows and the summary (rank 0)
 * Calls go one way: cmd_demo.c uses the others; they use only the harness and the library. */
#ifndef TPF_DEMO_H
#define TPF_DEMO_H

#include "rank_env.h"
#include "staging.h"
#include "trace.h"
#include "tpflex/tpflex_backend.h"
#ifdef TPF_HAVE_SIM
#include "tpflex/tpflex_sim.h"
#endif

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- the layer ---- */

enum { DEMO_OP_AG_GEMM, DEMO_OP_GEMM_RS, DEMO_OP_BULK, DEMO_OP_NONE };

typedef struct {
  const char *name;
  tpf_algo algo;
  tpf_coll coll;
  bool external;
  int op;
  /* Dimensions in units of H/P (the TP shard of the hidden size); see demo_site_dims. */
  int mult;
} demo_site;

/* The communicators in registration order, and the operations of one microbatch. */
typedef struct {
  const demo_site *sites;
  int nsites;
  const int *order; /* indices into sites */
  int nops;
} demo_layer;

/* ---- options and run state ---- */

typedef struct {
  const char *backend;
  bool procs; /* --mode procs: one process per rank (simulator) */
  int P;
  uint64_t C, H;
  int mbs;
  uint64_t seed;
  unsigned delay_us, timeout_ms;
  uint64_t arena_bytes; /* simulator arena; 0 = its default */
  const char *trace;
  tpf_dtype dtype;
  bool check;
  int rows; /* table rows to print: all when the run is short */
} demo_opts;

typedef struct {
  uint64_t T, tokens, seqs;
  uint64_t sched_bytes, padded_bytes;
} demo_mb;

/* One rank's verdict on one microbatch. */
typedef struct {
  bool ok;
  double op_ms;
  char why[400];
} demo_rank_mb;

typedef struct demo_ctx demo_ctx;
struct demo_ctx {
  demo_opts o;
  demo_layer layer;
  tpf_conf_env *env;
  demo_mb *mb;
  demo_rank_mb *res;         /* [mb][rank] */
  pthread_barrier_t barrier; /* ranks as threads: where they meet (demo_meet) */
  atomic_int abort_run;      /* ranks as threads: some rank failed */
  void *procs;               /* a rank's process (--mode procs): its state in demo_env.c */
  /* Filled by rank 0 between the barriers. */
  uint64_t measured_total, sched_total, padded_total, tokens_total, rows_total;
  uint64_t ops_total, ok_mbs, failed_mbs;
  double op_ms_total;
  bool measured_ok;
  double t_start, t_progress;
  /* Backend hooks (demo_env.c). */
  uint64_t (*bytes_moved)(demo_ctx *d); /* NULL: not measurable */
  uint64_t (*now_ns)(demo_ctx *d);
  uint64_t (*registrations)(demo_ctx *d); /* NULL: not measurable */
  tpf_trace *trace;
  /* Collective registrations: when the managers were built, and during the microbatches. */
  uint64_t regs_setup, regs_loop;
  bool have_registrations;
#ifdef TPF_HAVE_SIM
  tpf_sim_world *world;
#endif
  uint64_t t0_ns; /* host clock origin when the backend has none */
};

/* ---- demo_layer.c ---- */

/* GEMM dims of a site at T (see the definition for the shapes). */
tpf_gemm_dims demo_site_dims(const demo_site *s, uint64_t H, int P, uint64_t T);
/* Parses argv into *o, checking the shapes against every site of layer. Returns -1 to run, else
 * the exit status (0 after --help, 2 after printing the error). */
int demo_parse(int argc, char **argv, const demo_layer *layer, demo_opts *o);
/* True when every site's layout accepts T rows (tpf_last_error() says why not). */
bool demo_layouts_accept(const demo_layer *layer, const demo_opts *o, uint64_t T);
/* Draws the microbatches (d->mb) and the bytes their schedules and the padded ones move. 0, or
 * 1 after printing why. */
int demo_plan(demo_ctx *d);

/* ---- demo_env.c ---- */

/* Opens the environment of d->o.backend into *env and sets d's backend hooks. -1 on success,
 * else the exit status after printing why. */
int demo_env_open(demo_ctx *d, tpf_conf_env *env);
void demo_env_close(tpf_conf_env *env);
/* Host monotonic clock, seconds. */
double demo_now_s(void);
/* Every rank meets every other after the setup (mb = -1) or after microbatch mb, bringing
 * whether it failed. On return every rank knows whether all may go on (*go), and rank 0 holds
 * every rank's results of mb (d->res) and the backend's counters over all ranks, for the table.
 * Ranks as threads: a barrier. Ranks as processes: an allgather through the bootstrap (its
 * failure, a peer that went away, is returned, naming the rank; *go is then false). */
tpf_status demo_meet(demo_ctx *d, int rank, int mb, bool failed, bool *go);
/* Rank 0 has read what demo_meet brought: the ranks may go on (threads: a second barrier, so
 * that no rank moves bytes while rank 0 reads the counters; processes: nothing to wait for). */
void demo_meet_done(demo_ctx *d);

/* ---- demo_checks.c ---- */

/* A rank's operand memory for one site, allocated once at capacity and viewed at T. */
typedef struct {
  demo_ctx *d;
  tpf_backend *be;
  int rank;
  void *stream;
  tpf_stage_mat x, w, o; /* AG: w, o(=d); RS: x, w, o(=out); BULK: x(=a), w(=b), o(=d) */
  bool weights_ready;
} demo_site_mem;

/* The operands of one operation at T: device views for the call, host inputs for the check. */
typedef struct {
  tpf_matrix xd, wd, od; /* views of the site's capacity operands */
  tpf_matrix xg;         /* AG and bulk AG: the whole [T, H] input every rank gathers */
  tpf_matrix part;       /* bulk RS: this rank's [T, H] partial */
} demo_operands;

tpf_status demo_site_mem_init(demo_site_mem *sm, const demo_site *s);
void demo_site_mem_free(demo_site_mem *sm);
/* Fills site si's inputs for microbatch mbi at T (weights once per run) and puts them where the
 * operation reads them. Free io with demo_operands_free, also after a failure. */
tpf_status demo_stage_inputs(demo_site_mem *sm, int si, tpf_comm *c, uint64_t mbi, uint64_t T,
                             demo_operands *io);
/* Checks the operation's results against the independent reference; API failures are returned,
 * wrong results recorded in r. */
tpf_status demo_check_site(demo_site_mem *sm, int si, tpf_comm *c, uint64_t mbi, uint64_t T,
                           demo_operands *io, demo_rank_mb *r);
void demo_operands_free(demo_operands *io);
/* Records the first reason r failed. */
void demo_fail(demo_rank_mb *r, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* ---- demo_report.c ---- */

/* The run's header and the table's column line. */
void demo_print_header(const demo_ctx *d);
/* Rank 0, between the end-of-microbatch barriers: every rank's results of mb are in. */
void demo_report_mb(demo_ctx *d, int mb);
/* The summary after the run (st: the run's status); writes the trace. True when it passed. */
bool demo_print_summary(demo_ctx *d, tpf_status st, double wall);

#endif /* TPF_DEMO_H */
