/* `tpflex demo`: the backends, and where the ranks meet. The simulator runs the ranks as threads
 * of one simulator world per run, on host memory (harness/rank_env.c), with the demo's seed, step
 * delays, wait bound, arena and trace hook; while it runs, the demo reads the world's clock and
 * its counters of bytes moved and registrations made. With --mode procs every rank is a process
 * of its own (harness/sim_procs.h: forked by the launcher, a simulator rank over the socket
 * bootstrap); the ranks meet through that bootstrap, where rank 0 gathers every rank's results
 * and counters (each process's simulator counts its own rank only), and the counters the
 * summary needs come back to this process by the launcher's merge (only rank 0 writes them).
 * CUDA runs them as threads on one GPU through the harness's CUDA environment
 * (harness/cuda_env.c), timed by the host clock, with nothing counted. */
#define _POSIX_C_SOURCE 200809L
#include "demo.h"

#ifdef TPF_HAVE_CUDA
#include "cuda_env.h"
#endif
#ifdef TPF_HAVE_SIM
#include "sim_procs.h"
#endif
#include "tpflex/tpflex_backend_support.h" /* TPF_CHECK */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static uint64_t host_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

double demo_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t host_now_ns(demo_ctx *d) {
  return host_ns() - d->t0_ns;
}

#ifdef TPF_HAVE_SIM
static uint64_t sim_bytes_moved(demo_ctx *d) {
  tpf_sim_stats s;
  return tpf_sim_get_stats(d->world, &s) == TPF_OK ? s.bytes_moved : 0;
}
static uint64_t sim_now_ns(demo_ctx *d) {
  return tpf_sim_elapsed_ns(d->world);
}
static uint64_t sim_registrations(demo_ctx *d) {
  tpf_sim_stats s;
  return tpf_sim_get_stats(d->world, &s) == TPF_OK ? s.registrations : 0;
}

static tpf_status sim_run(tpf_conf_env *env, int P, tpf_conf_rank_fn fn, void *arg) {
  demo_ctx *d = env->ctx;
  tpf_sim_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.tp_size = P;
  cfg.seed = d->o.seed;
  cfg.max_delay_us = d->o.delay_us;
  cfg.timeout_ms = d->o.timeout_ms;
  cfg.arena_bytes = d->o.arena_bytes;
  TPF_CHECK(tpf_sim_world_create(&cfg, &d->world));
  if (d->trace) tpf_sim_set_trace(d->world, tpf_trace_sim_event, d->trace);
  d->bytes_moved = sim_bytes_moved;
  d->now_ns = sim_now_ns;
  d->registrations = sim_registrations;
  tpf_status st = tpf_sim_run(d->world, fn, arg);
  char detail[1024];
  snprintf(detail, sizeof detail, "%s", tpf_last_error());
  d->bytes_moved = NULL;
  d->registrations = NULL;
  d->now_ns = host_now_ns;
  tpf_sim_world_destroy(d->world);
  d->world = NULL;
  return st != TPF_OK ? tpf_set_error(st, "%s", detail) : TPF_OK;
}

/* ---- ranks as processes (--mode procs) ---- */

/* One rank's process: its bootstrap and world, and the group's counters at the last meeting. */
typedef struct {
  tpf_bootstrap boot;
  tpf_sim_world *world;
  uint64_t bytes, regs;
} demo_procs;

/* What every rank brings to a meeting. */
typedef struct {
  demo_rank_mb res;
  uint64_t bytes_moved, registrations;
  int32_t failed, pad;
} meet_msg;

static uint64_t procs_bytes_moved(demo_ctx *d) {
  return ((demo_procs *)d->procs)->bytes;
}
static uint64_t procs_registrations(demo_ctx *d) {
  return ((demo_procs *)d->procs)->regs;
}

static tpf_status procs_enter(void *arg, int rank, tpf_backend *be, const tpf_bootstrap *boot) {
  (void)rank;
  demo_ctx *d = arg;
  demo_procs *p = calloc(1, sizeof *p);
  if (!p) return tpf_set_error(TPF_ENOMEM, "tpflex demo: out of memory");
  p->boot = *boot;
  tpf_status st = tpf_sim_backend_world(be, &p->world);
  if (st != TPF_OK) {
    free(p);
    return st;
  }
  d->procs = p;
  d->world = p->world;
  d->bytes_moved = procs_bytes_moved;
  d->registrations = procs_registrations;
  d->now_ns = sim_now_ns;
  return TPF_OK;
}

/* Puts back what procs_enter changed, so that the merge brings only rank 0's results. */
static void procs_leave(void *arg, int rank) {
  (void)rank;
  demo_ctx *d = arg;
  free(d->procs);
  d->procs = NULL;
  d->world = NULL;
  d->bytes_moved = NULL;
  d->registrations = NULL;
  d->now_ns = host_now_ns;
}

/* The group's bytes moved are the sum of what every rank's process moved; its registrations
 * are counted once per rank, so the group has the largest count (equal on every rank when the
 * ranks registered alike). */
static tpf_status procs_meet(demo_ctx *d, int rank, int mb, bool failed, bool *go) {
  demo_procs *p = d->procs;
  const int P = d->o.P;
  meet_msg mine;
  memset(&mine, 0, sizeof mine);
  if (mb >= 0) mine.res = d->res[(size_t)mb * (size_t)P + (size_t)rank];
  mine.failed = failed;
  tpf_sim_stats s;
  if (tpf_sim_get_stats(p->world, &s) == TPF_OK) {
    mine.bytes_moved = s.bytes_moved;
    mine.registrations = s.registrations;
  }
  meet_msg *all = calloc((size_t)P, sizeof *all);
  *go = false;
  if (!all) return tpf_set_error(TPF_ENOMEM, "tpflex demo: out of memory");
  tpf_status st = p->boot.allgather(p->boot.ctx, &mine, all, sizeof mine);
  if (st == TPF_OK) {
    *go = true;
    p->bytes = 0;
    p->regs = 0;
    for (int q = 0; q < P; q++) {
      if (all[q].failed) *go = false;
      p->bytes += all[q].bytes_moved;
      if (all[q].registrations > p->regs) p->regs = all[q].registrations;
      if (mb >= 0) d->res[(size_t)mb * (size_t)P + (size_t)q] = all[q].res;
    }
  }
  free(all);
  return st;
}

static tpf_status procs_run(tpf_conf_env *env, int P, tpf_conf_rank_fn fn, void *arg) {
  demo_ctx *d = env->ctx;
  tpf_sim_procs_job job;
  memset(&job, 0, sizeof job);
  job.cfg.tp_size = P;
  job.cfg.seed = d->o.seed;
  job.cfg.max_delay_us = d->o.delay_us;
  job.cfg.timeout_ms = d->o.timeout_ms;
  job.fn = fn;
  job.arg = arg;
  job.results = d; /* the summary's counters, written by rank 0 */
  job.enter = procs_enter;
  job.leave = procs_leave;
  /* Every wait inside is bounded; after a rank ends abnormally the others get the wait bound
   * and 5 s more to fail by themselves, then are killed. */
  job.grace_ms = (uint64_t)d->o.timeout_ms + 5000u;
  job.who = "tpflex demo";
  return tpf_sim_procs_run(P, &job);
}
#endif

int demo_env_open(demo_ctx *d, tpf_conf_env *env) {
  memset(env, 0, sizeof *env);
  d->env = env;
  d->now_ns = host_now_ns;
  d->t0_ns = host_ns();
  if (!strcmp(d->o.backend, "sim")) {
#ifdef TPF_HAVE_SIM
    tpf_conf_host_env(env);
    env->name = "sim";
    env->max_ranks = TPF_MAX_RANKS;
    env->run = d->o.procs ? procs_run : sim_run;
    env->ctx = d;
#else
    fprintf(stderr,
            "tpflex demo: this build has no simulator (configure with -DTPF_WITH_SIM=ON)\n");
    return 2;
#endif
  } else if (!strcmp(d->o.backend, "cuda")) {
#ifdef TPF_HAVE_CUDA
    tpf_status st = tpf_cuda_conf_env_init(env); /* any P up to its max_ranks; checked below */
    if (st != TPF_OK) {
      fprintf(stderr, "tpflex demo: --backend cuda: %s: %s\n", tpf_status_name(st),
              tpf_last_error());
      return 1;
    }
#else
    fprintf(stderr, "tpflex demo: --backend cuda: this tpflex was built without the CUDA backend "
                    "(needs nvcc; configure with -DTPF_WITH_CUDA=ON, e.g. make test-cuda)\n");
    return 2;
#endif
  } else {
    fprintf(stderr, "tpflex demo: unknown backend '%s' (sim or cuda)\n", d->o.backend);
    return 2;
  }
  if (d->o.P > env->max_ranks) {
    fprintf(stderr, "tpflex demo: backend %s runs at most %d ranks\n", env->name, env->max_ranks);
    demo_env_close(env);
    return 2;
  }
  return -1;
}

void demo_env_close(tpf_conf_env *env) {
#ifdef TPF_HAVE_CUDA
  if (env->name && !strcmp(env->name, "cuda")) tpf_cuda_conf_env_free(env);
#else
  (void)env;
#endif
}

tpf_status demo_meet(demo_ctx *d, int rank, int mb, bool failed, bool *go) {
#ifdef TPF_HAVE_SIM
  if (d->procs) return procs_meet(d, rank, mb, failed, go);
#else
  (void)rank;
  (void)mb;
#endif
  if (failed) atomic_store(&d->abort_run, 1);
  pthread_barrier_wait(&d->barrier);
  *go = !atomic_load(&d->abort_run);
  return TPF_OK;
}

void demo_meet_done(demo_ctx *d) {
  if (!d->procs) pthread_barrier_wait(&d->barrier);
}
