/* The process-mode fault cases (proc_faults.h) on the simulator with ranks as processes
 * (tpf_sim_backend_create): P forked processes over the launcher's socket bootstrap, each one
 * simulator rank, registrations in POSIX shared memory. Operations move real bytes (the
 * mismatch case checks the gathered buffer). kill-inflight kills the victim from the simulator's
 * trace hook right after its HANDSHAKE step finished (its peers saw it arrive, none of its sends
 * ran); kill-in-create kills rank 0 between creating a registration's segment and the exchange
 * after which every rank unlinks its name (the proposal, then the creator's outcome:
 * sim_reg.c), so a segment that outlives its job is caught by the leftover check.
 *
 *   test_proc_faults_sim CASE | all | list
 */
#define _DEFAULT_SOURCE
#define _POSIX_C_SOURCE 200809L
#include "proc_faults.h"
#include "sim_internal.h" /* tpf_sim_proposal, tpf_sim_outcome: the exchanges kill-in-create hits */
#include "tpflex/tpflex_sim.h"

#include <signal.h>
#include <string.h>
#include <unistd.h>

static uint16_t g_w[PROC_N * PROC_H], g_d[PROC_C_PER_RANK * PROC_MAXP * 2 * PROC_N];

static tpf_status kit_rank_begin(int rank, int *device) {
  (void)rank;
  *device = 0;
  return TPF_OK;
}

static void kit_rank_end(void) {}

static tpf_status kit_backend_create(const tpf_bootstrap *boot, tpf_backend **out) {
  return tpf_sim_backend_create(NULL, boot, out);
}

static tpf_status kit_set_timeout(tpf_backend *be, unsigned ms) {
  tpf_sim_world *w = NULL;
  TPF_CHECK(tpf_sim_backend_world(be, &w));
  return tpf_sim_set_timeout(w, ms);
}

/* Dies when its HANDSHAKE step has finished: every peer has seen this rank arrive. */
static void die_after_handshake(void *ctx, const tpf_sim_trace_event *ev) {
  (void)ctx;
  if (ev->kind == TPF_STEP_HANDSHAKE) kill(getpid(), SIGKILL);
}

static tpf_status kit_ag_op(tpf_backend *be, tpf_comm *c, bool die_inside) {
  const tpf_shape a = tpf_comm_active_shape(c);
  tpf_matrix w = {g_w, PROC_N, PROC_H, PROC_H, TPF_BF16};
  tpf_matrix d = {g_d, a.rows, PROC_N, PROC_N, TPF_BF16};
  if (die_inside) {
    tpf_sim_world *world = NULL;
    TPF_CHECK(tpf_sim_backend_world(be, &world));
    TPF_CHECK(tpf_sim_set_trace(world, die_after_handshake, NULL));
  }
  TPF_CHECK(tpf_ag_gemm(c, &w, &d, NULL));
  return tpf_comm_sync(c);
}

static tpf_status kit_copy(void *dst, const void *src, size_t n) {
  memcpy(dst, src, n);
  return TPF_OK;
}

int main(int argc, char **argv) {
  const proc_kit kit = {
      .name = "simulator, ranks as processes",
      .moves_data = true,
      .timeout_ms = 2000,
      .rank_begin = kit_rank_begin,
      .rank_end = kit_rank_end,
      .backend_create = kit_backend_create,
      .backend_destroy = tpf_sim_backend_destroy,
      .set_timeout = kit_set_timeout,
      .ag_op = kit_ag_op,
      .write_bytes = kit_copy,
      .read_bytes = kit_copy,
      .create_name_bytes = sizeof(tpf_sim_proposal),
      .create_outcome_bytes = sizeof(tpf_sim_outcome),
  };
  return proc_faults_main(&kit, argc, argv);
}
