/* The process-mode fault cases (proc_faults.h) on the CPU: P forked processes, each with a host
 * backend built on the CUDA backend's own host logic for ranks in different processes: its host
 * agreement (tpf_cuda__hostsync_*, POSIX shared memory, as in backend_cuda/cuda_hostsync.c) and a
 * bootstrap exchange at creation (as tpf_cuda_backend_create's), over the launcher's socket
 * bootstrap; the core above it is the real one (fingerprint exchange, failed state, collective
 * destroy). No GPU: operations move no bytes, they only agree.
 *
 * Method (host backend). execute = host agreement on (seq, op key, rows) through the
 * registration's table, then a second agreement through another table, which stands for the
 * device part of an operation (a rank that dies after the first and before the second has died
 * with its operation in flight); reg_create = a size exchange (TPF_EMISMATCH as the CUDA backend's
 * reg_map_peers) and the two tables; reg_destroy = barrier, free, barrier, as the CUDA backend.
 *
 *   test_proc_faults CASE | all | list
 */
#define _DEFAULT_SOURCE
#define _POSIX_C_SOURCE 200809L
#include "cuda_internal.h" /* tpf_cuda__hostsync_* */
#include "internal.h"
#include "proc_faults.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct tpf_reg {
  char name[64];
  void *mem;
  uint64_t bytes;
  tpf_cuda_hostsync *agree, *done;
};

typedef struct {
  tpf_backend base;
  tpf_bootstrap boot;
  uint64_t timeout_ns;
  bool die_inside; /* kill this process in the next execute, after the agreement */
} host_backend;

static host_backend *host_of(tpf_backend *be) {
  return (host_backend *)be;
}

static tpf_status host_reg_destroy(tpf_backend *be, tpf_reg *r);

static tpf_status host_reg_create(tpf_backend *be, const char *name, uint64_t bytes, tpf_reg **reg,
                                  void **local) {
  host_backend *b = host_of(be);
  const int P = be->tp_size;
  tpf_reg *r = calloc(1, sizeof *r);
  TPF_RETURN_IF(r == NULL, TPF_ENOMEM, "host backend: out of memory");
  snprintf(r->name, sizeof r->name, "%s", name);
  r->bytes = bytes;
  r->mem = calloc(1, bytes ? bytes : 1);
  uint64_t *sizes = calloc((size_t)P, sizeof *sizes);
  tpf_status rc = r->mem && sizes ? TPF_OK : tpf_set_error(TPF_ENOMEM, "host backend: no memory");
  if (rc == TPF_OK) rc = b->boot.allgather(b->boot.ctx, &bytes, sizes, sizeof bytes);
  for (int q = 0; rc == TPF_OK && q < P; q++)
    if (sizes[q] != bytes)
      rc =
          tpf_set_error(TPF_EMISMATCH,
                        "registration '%s': rank %d registers %llu bytes, rank %d "
                        "%llu",
                        name, be->rank, (unsigned long long)bytes, q, (unsigned long long)sizes[q]);
  free(sizes);
  if (rc == TPF_OK) rc = tpf_cuda__hostsync_create(&b->boot, name, &r->agree);
  if (rc == TPF_OK) rc = tpf_cuda__hostsync_create(&b->boot, name, &r->done);
  if (rc == TPF_OK && (r->agree == NULL || r->done == NULL))
    rc = tpf_set_error(TPF_EBACKEND, "registration '%s': no host agreement table", name);
  if (rc != TPF_OK) {
    tpf_cuda__hostsync_destroy(r->agree);
    tpf_cuda__hostsync_destroy(r->done);
    free(r->mem);
    free(r);
    return rc;
  }
  *reg = r;
  *local = r->mem;
  return TPF_OK;
}

static tpf_status host_reg_destroy(tpf_backend *be, tpf_reg *r) {
  host_backend *b = host_of(be);
  tpf_status rc = b->boot.barrier(b->boot.ctx);
  tpf_cuda__hostsync_destroy(r->agree);
  tpf_cuda__hostsync_destroy(r->done);
  free(r->mem);
  free(r);
  tpf_status rc2 = b->boot.barrier(b->boot.ctx);
  return rc != TPF_OK ? rc : rc2;
}

static tpf_status host_execute(tpf_backend *be, tpf_reg *r, const tpf_exec_args *a, void *stream) {
  (void)stream;
  host_backend *b = host_of(be);
  const tpf_schedule *sc = a->sched;
  if (be->tp_size < 2) return TPF_OK;
  TPF_CHECK(tpf_cuda__hostsync_agree(r->agree, a->comm_name, a->seq,
                                     TPF_READY_BODY(TPF_READY_WORD(0, sc->op_key, sc->rows)),
                                     b->timeout_ns));
  if (b->die_inside) kill(getpid(), SIGKILL);
  return tpf_cuda__hostsync_agree(r->done, a->comm_name, a->seq, 0, b->timeout_ns);
}

static tpf_status host_sync(tpf_backend *be, void *stream) {
  (void)be;
  (void)stream;
  return TPF_OK;
}

static tpf_status host_allgather(tpf_backend *be, const void *mine, void *all, size_t bytes) {
  host_backend *b = host_of(be);
  return b->boot.allgather(b->boot.ctx, mine, all, bytes);
}

static const tpf_backend_ops host_ops = {
    .abi_version = TPF_BACKEND_ABI_VERSION,
    .name = "host-procs",
    .caps = 0,
    .align_bytes = 16,
    .max_ranks = TPF_MAX_RANKS,
    .reg_create = host_reg_create,
    .reg_destroy = host_reg_destroy,
    .execute = host_execute,
    .sync = host_sync,
    .allgather = host_allgather,
};

static tpf_status host_backend_create(const tpf_bootstrap *boot, tpf_backend **out) {
  host_backend *b = calloc(1, sizeof *b);
  TPF_RETURN_IF(b == NULL, TPF_ENOMEM, "host backend: out of memory");
  b->base.ops = &host_ops;
  b->base.tp_size = boot->tp_size;
  b->base.rank = boot->rank;
  b->boot = *boot;
  b->timeout_ns = 30000ull * 1000000ull;
  /* Who is where, as tpf_cuda_backend_create exchanges it, then a barrier. */
  int32_t me = boot->rank, all[TPF_MAX_RANKS];
  tpf_status rc = boot->allgather(boot->ctx, &me, all, sizeof me);
  if (rc == TPF_OK) rc = boot->barrier(boot->ctx);
  if (rc != TPF_OK) {
    free(b);
    return rc;
  }
  *out = &b->base;
  return TPF_OK;
}

static tpf_status host_backend_destroy(tpf_backend *be) {
  free(be);
  return TPF_OK;
}

static tpf_status host_set_timeout(tpf_backend *be, unsigned ms) {
  host_of(be)->timeout_ns = (uint64_t)ms * 1000000ull;
  return TPF_OK;
}

/* ---- the kit ---- */

static uint16_t g_w[PROC_N * PROC_H], g_d[PROC_C_PER_RANK * PROC_MAXP * 2 * PROC_N];

static tpf_status kit_rank_begin(int rank, int *device) {
  (void)rank;
  *device = 0;
  return TPF_OK;
}

static void kit_rank_end(void) {}

static tpf_status kit_ag_op(tpf_backend *be, tpf_comm *c, bool die_inside) {
  const tpf_shape a = tpf_comm_active_shape(c);
  tpf_matrix w = {g_w, PROC_N, PROC_H, PROC_H, TPF_BF16};
  tpf_matrix d = {g_d, a.rows, PROC_N, PROC_N, TPF_BF16};
  host_of(be)->die_inside = die_inside;
  TPF_CHECK(tpf_ag_gemm(c, &w, &d, NULL));
  return tpf_comm_sync(c);
}

static tpf_status kit_copy(void *dst, const void *src, size_t n) {
  memcpy(dst, src, n);
  return TPF_OK;
}

int main(int argc, char **argv) {
  const proc_kit kit = {
      .name = "host backend, CPU",
      .moves_data = false,
      .timeout_ms = 2000,
      .rank_begin = kit_rank_begin,
      .rank_end = kit_rank_end,
      .backend_create = host_backend_create,
      .backend_destroy = host_backend_destroy,
      .set_timeout = host_set_timeout,
      .ag_op = kit_ag_op,
      .write_bytes = kit_copy,
      .read_bytes = kit_copy,
  };
  return proc_faults_main(&kit, argc, argv);
}
