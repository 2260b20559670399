/* The CUDA backend's device-flags transport: ranks in other processes of the node (CUDA IPC),
 * and in-process ranks under TPF_CUDA_DEVICE_FLAGS (a diagnostic: spinning waits of ranks that
 * share one GPU can stall, docs/GPU_RUNS.md).
 *
 * Method. The flag protocol of tpflex_backend.h on the flags and ready words of every rank's
 * registration (layout in cuda_internal.h), mapped into this rank's context by cuda_reg.c:
 *   HANDSHAKE   1-thread kernel: ready word into every peer, wait for every peer's, compare the
 *               body (operation key: kind and split count; active rows).
 *   SEND        after the bytes, a 1-thread kernel that stores seq into the peer's flag
 *               [me][tag] (one store per message).
 *   RECV        1-thread kernel waiting until my flag [peer][tag] >= seq.
 *   BARRIER     1-thread kernel: store seq into every peer's flag [me][tag], wait for all.
 * The kernels (cuda_kernels.cu) bound every wait by the backend's timeout and report into the
 * status area (cuda_status.c). Ranks in other processes first agree on the host through a
 * shared-memory table per registration (cuda_hostsync.c), so that a disagreement moves no byte;
 * where that table cannot be set up, only the device handshake remains.
 */
#define _POSIX_C_SOURCE 200809L
#include "cuda_backend.h"
#include "cuda_error.h"

#include "internal.h"

#include <string.h>

static uint64_t *tpf_cuda__flags(const tpf_reg *r, int owner) {
  return (uint64_t *)(r->peer_base[owner] + r->flags_off);
}

/* The ready word `sender` writes into `owner`'s registration. */
static uint64_t *tpf_cuda__ready(const tpf_reg *r, int owner, int sender, uint64_t seq) {
  /* Two words per sender, by sequence parity: a peer may announce seq+1 before this rank's
   * handshake kernel has read seq (never seq+2, which needs this rank's seq+1). */
  return (uint64_t *)(r->peer_base[owner] + r->ready_off +
                      (uint64_t)sender * TPF_CUDA_READY_STRIDE + (seq & 1u) * sizeof(uint64_t));
}

static void tpf_cuda__flag_init(tpf_cuda_backend *b, const tpf_exec_args *a, tpf_step_kind kind,
                                uint32_t tag, tpf_cuda_flag_args *f) {
  memset(f, 0, sizeof(*f));
  f->status = b->status_dev;
  f->claim = b->claim_dev;
  f->timeout_ns = b->timeout_ns;
  f->seq = a->seq;
  f->store_value = a->seq;
  f->wait_value = a->seq;
  f->nranks = b->base.tp_size;
  f->kind = (uint32_t)kind;
  f->tag = tag;
}

static tpf_status tpf_cuda__launch_flags_checked(const tpf_cuda_flag_args *f, cudaStream_t s) {
  TPF_CUDA_TRY(tpf_cuda__launch_flags(f, s), "flag kernel launch");
  return TPF_OK;
}

static tpf_status tpf_cuda__fl_handshake(tpf_cuda_backend *b, tpf_reg *r, const tpf_exec_args *a,
                                         cudaStream_t s) {
  const tpf_schedule *sc = a->sched;
  const int P = b->base.tp_size, me = b->base.rank;
  tpf_cuda_flag_args f;
  tpf_cuda__flag_init(b, a, TPF_STEP_HANDSHAKE, 0, &f);
  f.handshake = 1;
  f.store_value = TPF_READY_WORD(a->seq, sc->op_key, sc->rows);
  f.wait_value = a->seq & TPF_READY_SEQ_MASK;
  f.rows = TPF_READY_BODY(f.store_value);
  for (int q = 0; q < P; q++) {
    if (q == me) continue;
    f.remote[q] = tpf_cuda__ready(r, q, me, a->seq);
    f.local[q] = tpf_cuda__ready(r, me, q, a->seq);
  }
  return tpf_cuda__launch_flags_checked(&f, s);
}

static tpf_status tpf_cuda__fl_send(tpf_cuda_backend *b, tpf_reg *r, const tpf_exec_args *a,
                                    int idx, const tpf_step *st, cudaStream_t s) {
  (void)idx;
  const int me = b->base.rank;
  tpf_cuda_flag_args f;
  tpf_cuda__flag_init(b, a, TPF_STEP_SEND, st->tag, &f);
  f.remote[st->peer] = tpf_cuda__flags(r, st->peer) + (uint64_t)me * TPF_MAX_TAGS + st->tag;
  return tpf_cuda__launch_flags_checked(&f, s);
}

static tpf_status tpf_cuda__fl_recv(tpf_cuda_backend *b, tpf_reg *r, const tpf_exec_args *a,
                                    int idx, const tpf_step *st, cudaStream_t s) {
  (void)idx;
  const int me = b->base.rank;
  tpf_cuda_flag_args f;
  tpf_cuda__flag_init(b, a, TPF_STEP_RECV, st->tag, &f);
  f.local[st->peer] = tpf_cuda__flags(r, me) + (uint64_t)st->peer * TPF_MAX_TAGS + st->tag;
  return tpf_cuda__launch_flags_checked(&f, s);
}

static tpf_status tpf_cuda__fl_barrier(tpf_cuda_backend *b, tpf_reg *r, const tpf_exec_args *a,
                                       int idx, const tpf_step *st, cudaStream_t s) {
  (void)idx;
  const int P = b->base.tp_size, me = b->base.rank;
  tpf_cuda_flag_args f;
  tpf_cuda__flag_init(b, a, TPF_STEP_BARRIER, st->tag, &f);
  for (int q = 0; q < P; q++) {
    if (q == me) continue;
    f.remote[q] = tpf_cuda__flags(r, q) + (uint64_t)me * TPF_MAX_TAGS + st->tag;
    f.local[q] = tpf_cuda__flags(r, me) + (uint64_t)q * TPF_MAX_TAGS + st->tag;
  }
  return tpf_cuda__launch_flags_checked(&f, s);
}

/* Ranks in other processes agree on the host before anything is enqueued (cuda_hostsync.c). */
static tpf_status tpf_cuda__fl_connect(tpf_cuda_backend *b, tpf_reg *r,
                                       const tpf_cuda_reg_info *infos) {
  (void)infos;
  if (!r->remote) return TPF_OK;
  return tpf_cuda__hostsync_create(&b->boot, r->name, &r->hostsync);
}

static void tpf_cuda__fl_free(tpf_cuda_backend *b, tpf_reg *r) {
  (void)b;
  tpf_cuda__hostsync_destroy(r->hostsync);
}

static tpf_status tpf_cuda__fl_agree(tpf_cuda_backend *b, tpf_reg *r, const tpf_exec_args *a) {
  const tpf_schedule *sc = a->sched;
  if (r->hostsync == NULL) return TPF_OK;
  return tpf_cuda__hostsync_agree(r->hostsync, a->comm_name, a->seq,
                                  TPF_READY_BODY(TPF_READY_WORD(0, sc->op_key, sc->rows)),
                                  b->timeout_ns);
}

const tpf_cuda_transport tpf_cuda__transport_flags = {
    .name = "flags",
    .host_ordered = false,
    .setup = NULL, /* the peers' flags live in their registrations: nothing more to exchange */
    .connect = tpf_cuda__fl_connect,
    .free = tpf_cuda__fl_free,
    .agree = tpf_cuda__fl_agree,
    .handshake = tpf_cuda__fl_handshake,
    .send = tpf_cuda__fl_send,
    .recv_ready = NULL, /* waits are on the device: enqueued at once */
    .recv = tpf_cuda__fl_recv,
    .barrier_arrive = NULL,
    .barrier_missing = NULL,
    .barrier = tpf_cuda__fl_barrier,
};
