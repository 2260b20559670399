/* Simulator ranks as processes for a harness program (conformance_sim --procs, `tpflex demo
 * --mode procs`): P forked processes (the launcher, launcher.h), each joining the socket
 * bootstrap and creating its simulator rank over it (tpf_sim_backend_create), then running the
 * program's rank function as a thread-mode world would run it; every rank's status and detail
 * come back through the launch's shared memory, and the caller's results through the launcher's
 * three-way merge. Simulator builds only (TPF_HAVE_SIM). Implemented in sim_procs.c. */
#ifndef TPF_SIM_PROCS_H
#define TPF_SIM_PROCS_H

#include "rank_env.h" /* tpf_conf_rank_fn */

#include "tpflex/tpflex_cuda.h" /* tpf_bootstrap */
#include "tpflex/tpflex_sim.h"

#include <stdint.h>

typedef struct {
  tpf_sim_config cfg; /* every rank's; tp_size is set to P */
  tpf_conf_rank_fn fn;
  void *arg;
  /* A heap block the ranks write their results into, each its own bytes, as threads would
   * (tpf_launch_fork_merging): merged back into the caller's copy. NULL: nothing comes back. */
  void *results;
  /* In each rank's process: enter once its backend exists (before fn; a failure is the rank's
   * status and fn does not run), leave after fn (before the backend is destroyed). Optional. */
  tpf_status (*enter)(void *arg, int rank, tpf_backend *be, const tpf_bootstrap *boot);
  void (*leave)(void *arg, int rank);
  uint64_t bootstrap_timeout_ms; /* tpf_sockboot_create's bound (0: its default) */
  uint64_t wait_ms, grace_ms;    /* tpf_launch_wait's bounds */
  const char *who;               /* prefix of the per-rank failure lines on stderr */
} tpf_sim_procs_job;

/* Runs job->fn on P (1..TPF_MAX_RANKS) simulator ranks, each its own process, and waits for them.
 * TPF_OK when every rank's fn and teardown returned TPF_OK; else each failing rank is printed
 * on stderr ("<who> P=<P> rank <r>: <status>: <detail>") and the lowest one's status is
 * returned with its detail; a rank whose process ended without reporting (killed, crashed) is
 * named with its exit status. The launcher's own failures (fork, the merge) are returned as
 * they are. */
tpf_status tpf_sim_procs_run(int P, const tpf_sim_procs_job *job);

#endif /* TPF_SIM_PROCS_H */
