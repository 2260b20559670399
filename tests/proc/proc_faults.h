/* Faults with ranks as processes: the cases, shared by the CPU binaries (a host backend built
 * on the CUDA backend's host agreement, test_proc_faults.c; the simulator with ranks as
 * processes, test_proc_faults_sim.c) and the GPU binary (the CUDA backend). Each case forks P ranks
 * through the launcher (harness/launcher.h), every rank records statuses, messages and times in
 * shared memory, and the parent checks them, the exit statuses and what is left behind (/dev/shm,
 * the rendezvous socket).
 *
 * Cases (argv[1] of the binaries; "all" runs every case and "list" names them):
 *   kill-host        P=4, rank 2 SIGKILLed between operations: every survivor's next operation
 *                    fails with TPF_ETIMEOUT naming rank 2 within the timeout, the one after with
 *                    TPF_ESTATE, destroy returns (no hang), nothing is left behind
 *   kill-hub         the same with rank 0 killed (the bootstrap's hub and the owner of the host
 *                    agreement tables)
 *   kill-inflight    P=4, rank 1 killed inside an operation (GPU: right after enqueueing it; CPU:
 *                    after the host agreement): survivors TPF_ETIMEOUT naming rank 1, then
 *                    TPF_ESTATE
 *   kill-in-create   P=3, rank 0 killed inside tpf_comm_create, after it created the host
 *                    agreement table and before it unlinked the name: survivors TPF_ETIMEOUT
 *                    naming rank 0, and nothing may be left in /dev/shm
 *   exit-early       P=3, rank 2 exits before tpf_comm_create: every survivor's create fails with
 *                    TPF_ETIMEOUT naming rank 2, promptly
 *   exit-before-be   P=3, rank 1 exits before creating its backend: the others' backend creation
 *                    fails with TPF_ETIMEOUT naming rank 1
 *   capacity         P=3, rank 2 asks for twice the capacity: TPF_EMISMATCH naming "capacity" on
 *                    every rank (the configuration fingerprint, exchanged through the backend's
 *                    allgather op); then the group creates an agreeing communicator and runs
 *   mismatch         P=3, rank 0 runs half the rows: TPF_EMISMATCH naming both row counts on every
 *                    rank before the timeout, no byte of any registration changed; then agreed
 *                    operations work (GPU: the gathered buffer holds every shard)
 *   absent           P=3, rank 2 alive but skipping an operation: the others TPF_ETIMEOUT naming
 *                    it, then TPF_ESTATE; the collective destroy still completes on every rank
 * Exit status: 0 passed, 1 failed (a known defect included: the message names it), 77 skipped
 * only where the case cannot run at all (no GPU), with the reason printed. */
#ifndef TPF_PROC_FAULTS_H
#define TPF_PROC_FAULTS_H

#include "launcher.h"
#include "tpflex/tpflex_backend.h"

#include <stdbool.h>

/* Shapes of every case: RING AG, bf16, capacity [PROC_C_PER_RANK * P, PROC_H], weight [N, H]. */
enum { PROC_C_PER_RANK = 24, PROC_H = 64, PROC_N = 32, PROC_MAXP = 8 };

typedef struct proc_kit proc_kit;
struct proc_kit {
  const char *name;
  bool moves_data;     /* operations move bytes (GPU): the gathered buffer is checked */
  unsigned timeout_ms; /* backend timeout of every rank */
  /* In the rank's process, first (picks the rank's device) and last. */
  tpf_status (*rank_begin)(int rank, int *device);
  void (*rank_end)(void);
  tpf_status (*backend_create)(const tpf_bootstrap *boot, tpf_backend **out);
  tpf_status (*backend_destroy)(tpf_backend *be);
  tpf_status (*set_timeout)(tpf_backend *be, unsigned timeout_ms);
  /* One tpf_ag_gemm on c at its active shape, then tpf_comm_sync; returns the first failure.
   * die_inside: this rank is killed (SIGKILL) inside the operation, after its peers can see that
   * it arrived (GPU: enqueued behind a host callback that sleeps, so none of its device work
   * runs; CPU: after the host agreement) and never returns. */
  tpf_status (*ag_op)(tpf_backend *be, tpf_comm *c, bool die_inside);
  /* Copies between host memory and the backend's (registrations). */
  tpf_status (*write_bytes)(void *dst, const void *src, size_t bytes);
  tpf_status (*read_bytes)(void *dst, const void *src, size_t bytes);
  /* kill-in-create: the victim dies on entering the bootstrap allgather of create_outcome_bytes
   * that follows one of create_name_bytes (the exchange after which the name of the shared
   * memory a registration was created in is unlinked). 0, 0: the CUDA backend's host agreement
   * table (PROC_TABLE_NAME_BYTES, then an int32 outcome). */
  size_t create_name_bytes, create_outcome_bytes;
};

/* Runs the case named argv[1] (or all) with the kit; returns the exit status above. */
int proc_faults_main(const proc_kit *kit, int argc, char **argv);

#endif
