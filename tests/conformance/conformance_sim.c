/* The conformance sweep on the simulator backend: fills a tpf_conf_env with host memory
 * (tpf_conf_host_env) and one simulator world per run, then hands over to the shared body
 * (conformance_body.c).
 *
 *   conformance_sim [options] [body options]           ranks as threads of this process
 *   conformance_sim --procs [options] [body options]   every rank its own process
 *                                                      (tpf_sim_backend_create), as torchrun
 *                                                      launches them
 *
 * Options of its own, removed before the body sees argv: --delay-us N (random delay before each
 * step, default 20: interleavings differ from run to run), --sim-seed N (seed of those delays,
 * default: from the clock, printed), --timeout-ms N (bound of every wait, default 20000),
 * --procs.
 *
 * Method (process mode), as conformance_cuda's: run() forks P ranks through the harness's
 * simulator process runner (harness/sim_procs.h, over the launcher), each joins the socket
 * bootstrap and creates its simulator rank from it; the body's per-P state is brought back from
 * the ranks' copies by a three-way merge (ranks write disjoint fields). Every rank's status
 * comes back through the launch's shared memory; a rank that died is named.
 */
#define _DEFAULT_SOURCE
#define _POSIX_C_SOURCE 200809L
#include "conformance.h"
#include "sim_procs.h"
#include "tpflex/tpflex_sim.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct {
  unsigned delay_us, timeout_ms;
  uint64_t seed;
  unsigned runs;
} sim_env_ctx;

static tpf_sim_config run_config(sim_env_ctx *ctx, int P) {
  tpf_sim_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.tp_size = P;
  cfg.seed = ctx->seed + 1000003u * ctx->runs++;
  cfg.max_delay_us = ctx->delay_us;
  cfg.timeout_ms = ctx->timeout_ms;
  cfg.arena_bytes = 256ull << 20;
  return cfg;
}

static tpf_status sim_run(tpf_conf_env *env, int P, tpf_conf_rank_fn fn, void *arg) {
  tpf_sim_config cfg = run_config(env->ctx, P);
  tpf_sim_world *w = NULL;
  tpf_status st = tpf_sim_world_create(&cfg, &w);
  if (st != TPF_OK) return st;
  st = tpf_sim_run(w, fn, arg);
  char detail[1024];
  snprintf(detail, sizeof detail, "%s", tpf_last_error());
  tpf_status st2 = tpf_sim_world_destroy(w);
  if (st != TPF_OK) return tpf_set_error(st, "%s", detail);
  return st2;
}

/* ---- process mode ---- */

static tpf_status proc_run(tpf_conf_env *env, int P, tpf_conf_rank_fn fn, void *arg) {
  if (P < 1 || P > env->max_ranks)
    return tpf_set_error(TPF_EINVAL, "sim-procs env: P=%d outside 1..%d", P, env->max_ranks);
  tpf_sim_procs_job job;
  memset(&job, 0, sizeof job);
  job.cfg = run_config(env->ctx, P);
  job.fn = fn;
  job.arg = arg;
  job.results = arg;
  /* A rank that dies makes the others fail within the timeout; one that hangs is killed. */
  job.wait_ms = 600000;
  job.grace_ms = 30000;
  job.who = "conformance[sim-procs]";
  return tpf_sim_procs_run(P, &job);
}

int main(int argc, char **argv) {
  sim_env_ctx ctx = {20, 20000, (uint64_t)time(NULL), 0};
  bool procs = false;
  char **rest = calloc((size_t)argc + 1, sizeof *rest);
  int nrest = 0;
  if (!rest) return 1;
  rest[nrest++] = argv[0];
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--delay-us") && i + 1 < argc)
      ctx.delay_us = (unsigned)strtoul(argv[++i], NULL, 0);
    else if (!strcmp(argv[i], "--sim-seed") && i + 1 < argc)
      ctx.seed = strtoull(argv[++i], NULL, 0);
    else if (!strcmp(argv[i], "--timeout-ms") && i + 1 < argc)
      ctx.timeout_ms = (unsigned)strtoul(argv[++i], NULL, 0);
    else if (!strcmp(argv[i], "--procs"))
      procs = true;
    else
      rest[nrest++] = argv[i];
  }
  printf("simulator%s: delays 0..%u us before each step, delay seed %llu, timeout %u ms\n",
         procs ? " (every rank its own process)" : "", ctx.delay_us, (unsigned long long)ctx.seed,
         ctx.timeout_ms);
  tpf_conf_env env;
  tpf_conf_host_env(&env); /* operands in host memory, where the simulator computes */
  env.name = procs ? "sim-procs" : "sim";
  env.max_ranks = 8;
  env.run = procs ? proc_run : sim_run;
  env.ctx = &ctx;
  /* The simulator sums every GEMM over k in the reference's order: held exact (no order slack). */
  int rc = tpf_conformance_main(&env, false, nrest, rest);
  free(rest);
  return rc;
}
