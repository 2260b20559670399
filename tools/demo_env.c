/* `tpflex demo`: the backends. The simulator runs the ranks as threads of one simulator world
 * per run, on host memory (harness/rank_env.c), with the demo's seed, step delays, wait bound,
 * arena and trace hook; while it runs, the demo reads the world's clock and its counters of bytes
 * moved and registrations made. CUDA runs them as threads on one GPU through the harness's CUDA
 * environment (harness/cuda_env.c), timed by the host clock, with nothing counted. */
#define _POSIX_C_SOURCE 200809L
#include "demo.h"

#ifdef TPF_HAVE_CUDA
#include "cuda_env.h"
#endif
#include "tpflex/tpflex_backend_support.h" /* TPF_CHECK */

#include <stdio.h>
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
    env->run = sim_run;
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
