/* Simulator ranks as processes for a harness program (sim_procs.h).
 *
 * Method: the launcher forks P ranks (tpf_launch_fork, or tpf_launch_fork_merging when the
 * caller's results come back); each joins the socket bootstrap, creates its simulator rank from
 * it, runs the job's function between enter and leave, destroys its rank and writes its status
 * and detail into its own slot of the launch's shared memory. The parent waits with the job's
 * bounds, reads every slot (a rank that never wrote its slot ended without reporting: it is
 * named with its exit status), merges the results and returns the lowest failing rank's status.
 */
#define _POSIX_C_SOURCE 200809L
#include "sim_procs.h"

#include "launcher.h"

#include "tpflex/tpflex_backend_support.h" /* TPF_RETURN_IF */

#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#define PROC_DETAIL 600

typedef struct {
  _Atomic int32_t reported; /* 1 once status and detail are written */
  int32_t status;
  char detail[PROC_DETAIL];
} proc_report;

static int rank_main(const tpf_launch_rank *me, void *p) {
  const tpf_sim_procs_job *job = p;
  proc_report *rep = (proc_report *)me->shared + me->rank;
  tpf_backend *be = NULL;
  tpf_bootstrap boot;
  tpf_sim_config cfg = job->cfg;
  cfg.tp_size = me->nranks;
  tpf_status rc = tpf_sockboot_create(me, 0, job->bootstrap_timeout_ms, &boot);
  const bool have_boot = rc == TPF_OK;
  if (rc == TPF_OK) rc = tpf_sim_backend_create(&cfg, &boot, &be);
  bool entered = false;
  if (rc == TPF_OK && job->enter) rc = job->enter(job->arg, me->rank, be, &boot);
  entered = rc == TPF_OK;
  if (rc == TPF_OK) rc = job->fn(be, me->rank, job->arg);
  if (entered && job->leave) job->leave(job->arg, me->rank);
  char saved[PROC_DETAIL];
  snprintf(saved, sizeof saved, "%s", rc == TPF_OK ? "" : tpf_last_error());
  if (be != NULL) {
    tpf_status rc2 = tpf_sim_backend_destroy(be);
    if (rc == TPF_OK && rc2 != TPF_OK) {
      rc = rc2;
      snprintf(saved, sizeof saved, "%s", tpf_last_error());
    }
  }
  if (have_boot) tpf_sockboot_free(&boot);
  rep->status = (int32_t)rc;
  snprintf(rep->detail, sizeof rep->detail, "%s", saved);
  atomic_store_explicit(&rep->reported, 1, memory_order_release);
  return rc == TPF_OK ? 0 : 1;
}

tpf_status tpf_sim_procs_run(int P, const tpf_sim_procs_job *job) {
  TPF_RETURN_IF(job == NULL || job->fn == NULL, TPF_EINVAL, "sim procs: no rank function");
  TPF_RETURN_IF(P < 1 || P > TPF_MAX_RANKS, TPF_EINVAL, "sim procs: P=%d outside 1..%d", P,
                TPF_MAX_RANKS);
  const char *who = job->who ? job->who : "sim procs";
  const size_t shared_bytes = (size_t)P * sizeof(proc_report);
  tpf_launch *l = NULL;
  tpf_status rc =
      job->results != NULL
          ? tpf_launch_fork_merging(P, shared_bytes, rank_main, (void *)job, job->results, 0, &l)
          : tpf_launch_fork(P, shared_bytes, rank_main, (void *)job, &l);
  if (rc != TPF_OK) return rc;
  int codes[TPF_MAX_RANKS];
  tpf_status wst = tpf_launch_wait(l, job->wait_ms, job->grace_ms, codes);
  char wait_why[PROC_DETAIL / 2];
  snprintf(wait_why, sizeof wait_why, "%s", wst == TPF_OK ? "" : tpf_last_error());
  const proc_report *rep = tpf_launch_shared(l);
  tpf_status rs[TPF_MAX_RANKS];
  char why[TPF_MAX_RANKS][PROC_DETAIL];
  for (int r = 0; r < P; r++) {
    if (atomic_load_explicit(&rep[r].reported, memory_order_acquire) == 1) {
      rs[r] = (tpf_status)rep[r].status;
      snprintf(why[r], sizeof why[r], "%s", rep[r].detail);
      if (rs[r] == TPF_OK && codes[r] != 0) { /* it reported, then died in its exit */
        rs[r] = TPF_EBACKEND;
        snprintf(why[r], sizeof why[r],
                 "rank %d's process reported success, then ended with "
                 "status %d",
                 r, codes[r]);
      }
    } else {
      rs[r] = wst == TPF_ETIMEOUT ? TPF_ETIMEOUT : TPF_EBACKEND;
      snprintf(why[r], sizeof why[r], "rank %d's process ended (status %d) before reporting%s%s", r,
               codes[r], wait_why[0] ? ": " : "", wait_why);
    }
  }
  rc = job->results != NULL ? tpf_launch_merge(l, job->results, NULL) : TPF_OK;
  tpf_launch_free(l);
  if (rc != TPF_OK) return rc;
  int first = -1;
  for (int r = 0; r < P; r++) {
    if (rs[r] == TPF_OK) continue;
    fprintf(stderr, "%s P=%d rank %d: %s: %s\n", who, P, r, tpf_status_name(rs[r]), why[r]);
    if (first < 0) first = r;
  }
  if (first >= 0) return tpf_set_error(rs[first], "rank %d: %s", first, why[first]);
  return TPF_OK;
}
