/* The CUDA backend's in-process transport: host-ordered CUDA events between ranks that are
 * threads of this process (one or several GPUs).
 *
 * Method. When every rank of the group lives in this process, cross-rank ordering uses no
 * device-side spinning at all: HANDSHAKE, SEND/RECV and BARRIER are host-ordered CUDA events. A
 * rank records an event on its stream and publishes (event, sequence number) in a host table shared
 * by the group (one per registration, owned by rank 0); a waiting rank waits on the host, bounded
 * by the timeout, until the peer has published, then makes its stream wait on that event. Every
 * device-side wait is thus on work that was already submitted when the wait was enqueued, so no
 * hardware queue can hold a wait in front of the work it waits for, however many streams share the
 * queues, and cudaFree or a device-wide synchronisation can never deadlock against a spinning peer.
 * The handshake compares the operation key (kind, split count) and the active rows on the host
 * before anything is enqueued: a disagreement is TPF_EMISMATCH on every rank at once, naming both,
 * and no byte moves. Why events may be reused: a rank starts enqueuing operation n+1 only after
 * every peer announced n+1, i.e. finished enqueuing operation n, so a peer's wait on an event of
 * operation n is enqueued before the event is recorded again. The ready words alone are
 * double-buffered by sequence parity, because a peer may announce n+1 before a slow rank has read
 * its announcement of n.
 *
 * Used for every peer when the whole group lives in this process, unless TPF_CUDA_DEVICE_FLAGS
 * asks for the device flags (cuda_transport.c). The table is allocated by rank 0 at setup and
 * reaches the other ranks through the registration records (tpf_cuda_reg_info.sync).
 */
#define _POSIX_C_SOURCE 200809L
#include "cuda_state.h"
#include "cuda_error.h"

#include "tpflex/tpflex_backend_support.h"

#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

static tpf_cuda_sync *tpf_cuda__sync_new(int P) {
  const size_t nslots =
      (size_t)P * 2 + (size_t)P * (size_t)P * TPF_MAX_TAGS + (size_t)P * TPF_MAX_TAGS;
  tpf_cuda_sync *t = tpf_calloc(1, sizeof(*t) + nslots * sizeof(tpf_cuda_slot));
  if (t == NULL) return NULL;
  tpf_cuda_slot *slots = (tpf_cuda_slot *)(t + 1);
  for (size_t i = 0; i < nslots; i++)
    atomic_init(&slots[i].word, 0);
  t->nranks = P;
  atomic_init(&t->failed_claim, 0);
  atomic_init(&t->failed, 0);
  t->ready = slots;
  t->sent = t->ready + (size_t)P * 2;
  t->barrier = t->sent + (size_t)P * (size_t)P * TPF_MAX_TAGS;
  return t;
}

void tpf_cuda__events_fail(tpf_cuda_backend *b, tpf_reg *r, const tpf_exec_args *a, tpf_status rc) {
  tpf_cuda_sync *t = r->sync;
  if (t == NULL) return;
  uint32_t expected = 0;
  if (!atomic_compare_exchange_strong(&t->failed_claim, &expected, 1u)) return;
  t->failed_status = (int32_t)rc;
  t->failed_seq = a->seq;
  snprintf(t->failed_msg, sizeof t->failed_msg, "%s", tpf_last_error());
  atomic_store_explicit(&t->failed, (uint32_t)b->base.rank + 1u, memory_order_release);
}

tpf_status tpf_cuda__events_peer_failed(tpf_cuda_backend *b, const tpf_reg *r,
                                        const tpf_exec_args *a, int step, const char *what,
                                        int peer) {
  const tpf_cuda_sync *t = r->sync;
  if (t == NULL) return TPF_OK;
  const uint32_t f = atomic_load_explicit(&t->failed, memory_order_acquire);
  if (f == 0 || (int)f - 1 == b->base.rank) return TPF_OK;
  return tpf_set_error(TPF_ESTATE,
                       "'%s' rank %d gave up at step %d (%s) waiting for rank %d: rank %d's "
                       "operation %llu failed (%s: %s); destroy the communicator on every rank",
                       a->comm_name, b->base.rank, step, what, peer, (int)f - 1,
                       (unsigned long long)t->failed_seq,
                       tpf_status_name((tpf_status)t->failed_status), t->failed_msg);
}

/* Waits on the host until the ready word in `slot` carries operation `want`'s sequence number,
 * bounded by the backend's timeout. The peer only has to reach the same point of its program,
 * not finish any device work, so the wait is short unless a rank is late or missing. Returns the
 * word seen. */
static tpf_status tpf_cuda__host_wait(tpf_cuda_backend *b, tpf_reg *r, const tpf_exec_args *a,
                                      int step, const char *what, int peer, tpf_cuda_slot *slot,
                                      uint64_t want, uint64_t *seen) {
  const uint64_t start = tpf_cuda__now_ns();
  for (unsigned spins = 0;; spins++) {
    uint64_t w = atomic_load_explicit(&slot->word, memory_order_acquire);
    if (TPF_READY_SEQ(w) == (want & TPF_READY_SEQ_MASK)) {
      if (spins > 0) tpf_cuda__enq_peer_wait(b, start);
      *seen = w;
      return TPF_OK;
    }
    if ((spins & 63u) == 63u) {
      TPF_CHECK(tpf_cuda__events_peer_failed(b, r, a, step, what, peer));
      if (atomic_load(&r->aborted))
        return tpf_set_error(TPF_ESTATE,
                             "'%s' was aborted (tpf_comm_abort): rank %d gave up at step %d (%s) "
                             "waiting for rank %d",
                             a->comm_name, b->base.rank, step, what, peer);
      if (tpf_cuda__now_ns() - start > b->timeout_ns)
        return tpf_set_error(TPF_ETIMEOUT,
                             "'%s' rank %d, operation %llu, step %d (%s): waited %llu ms for rank "
                             "%d, which never reached it",
                             a->comm_name, b->base.rank, (unsigned long long)a->seq, step, what,
                             (unsigned long long)(b->timeout_ns / 1000000ull), peer);
      sched_yield();
    }
  }
}

/* Publishes ev, just recorded on this rank's schedule stream `stream`, with its order among this
 * rank's publications of the operation (the receiver's lean enqueuer compares them: of two events
 * of one stream, the later one implies the earlier). */
static void tpf_cuda__publish(tpf_cuda_backend *b, tpf_cuda_slot *slot, cudaEvent_t ev, int stream,
                              uint64_t word) {
  slot->ev = ev;
  slot->stream = stream;
  slot->order = ++b->pub_order;
  atomic_store_explicit(&slot->word, word, memory_order_release);
}

/* HANDSHAKE: announce (seq, op key, rows) with this operation's start event, compare every
 * peer's key and rows on the host, then order the stream after every peer's start (no peer's
 * earlier operation may still read or write what this one touches). */
static tpf_status tpf_cuda__ev_handshake(tpf_cuda_backend *b, tpf_reg *r, const tpf_exec_args *a,
                                         cudaStream_t s) {
  const int P = b->base.tp_size, me = b->base.rank;
  const int par = (int)(a->seq & 1u);
  const uint64_t rows = a->sched->rows;
  cudaEvent_t ev = r->ready_ev[par];
  TPF_CUDA_TRY(TPF_CUDA_ENQ(b, RECORD, cudaEventRecord(ev, s)), "cudaEventRecord(handshake)");
  const uint64_t word = TPF_READY_WORD(a->seq, a->sched->op_key, rows);
  tpf_cuda__publish(b, &r->sync->ready[me * 2 + par], ev, TPF_STREAM_COMM, word);
  int bad = -1;
  uint64_t bad_body = 0;
  for (int q = 0; q < P; q++) {
    if (q == me) continue;
    uint64_t w = 0;
    TPF_CHECK(
        tpf_cuda__host_wait(b, r, a, 0, "HANDSHAKE", q, &r->sync->ready[q * 2 + par], a->seq, &w));
    if (TPF_READY_BODY(w) != TPF_READY_BODY(word) && bad < 0) {
      bad = q;
      bad_body = TPF_READY_BODY(w);
    }
  }
  char mine[40], theirs[40];
  TPF_RETURN_IF(bad >= 0, TPF_EMISMATCH,
                "'%s' rank %d, operation %llu: active rows %llu (%s) here but %llu (%s) on rank %d "
                "(host handshake: nothing was enqueued, no byte moved)",
                a->comm_name, me, (unsigned long long)a->seq,
                (unsigned long long)TPF_READY_ROWS(word),
                tpf_op_key_name(a->sched->op_key, mine, sizeof mine),
                (unsigned long long)TPF_READY_ROWS(bad_body),
                tpf_op_key_name((uint8_t)TPF_READY_KEY(bad_body), theirs, sizeof theirs), bad);
  /* Lean: only the peers whose buffers this schedule writes or reads, or who write into this
   * rank's (b->hs_peers, cuda_exec.c); every other peer's earlier operation touches nothing of
   * this one. The host waits above still cover every peer (agreement, event reuse). */
  for (int q = 0; q < P; q++)
    if (q != me && (!b->lean || (b->hs_peers >> q) & 1u))
      TPF_CUDA_TRY(TPF_CUDA_ENQ(b, WAIT, cudaStreamWaitEvent(s, r->sync->ready[q * 2 + par].ev, 0)),
                   "cudaStreamWaitEvent(handshake)");
  return TPF_OK;
}

/* SEND: the event after the bytes, published in the (me, peer, tag) slot. */
static tpf_status tpf_cuda__ev_send(tpf_cuda_backend *b, tpf_reg *r, const tpf_exec_args *a,
                                    int idx, const tpf_step *st, cudaStream_t s) {
  const int P = b->base.tp_size, me = b->base.rank;
  TPF_CUDA_TRY(TPF_CUDA_ENQ(b, RECORD, cudaEventRecord(b->step_ev[idx], s)),
               "cudaEventRecord(send)");
  tpf_cuda__publish(
      b, &r->sync->sent[((size_t)me * (size_t)P + (size_t)st->peer) * TPF_MAX_TAGS + st->tag],
      b->step_ev[idx], (int)st->stream, a->seq);
  return TPF_OK;
}

static tpf_cuda_slot *tpf_cuda__ev_recv_slot(tpf_cuda_backend *b, tpf_reg *r, const tpf_step *st) {
  const int P = b->base.tp_size, me = b->base.rank;
  return &r->sync->sent[((size_t)st->peer * (size_t)P + (size_t)me) * TPF_MAX_TAGS + st->tag];
}

/* RECV: ready once the sender published this operation's event. */
static bool tpf_cuda__ev_recv_ready(tpf_cuda_backend *b, tpf_reg *r, const tpf_exec_args *a,
                                    const tpf_step *st) {
  tpf_cuda_slot *slot = tpf_cuda__ev_recv_slot(b, r, st);
  return atomic_load_explicit(&slot->word, memory_order_acquire) >= a->seq;
}

static void tpf_cuda__ev_recv_event(tpf_cuda_backend *b, tpf_reg *r, const tpf_step *st,
                                    tpf_cuda_peer_ev *out) {
  const tpf_cuda_slot *slot = tpf_cuda__ev_recv_slot(b, r, st);
  out->ev = slot->ev; /* read after recv_ready's acquire of the word */
  out->peer = st->peer;
  out->stream = slot->stream;
  out->order = slot->order;
}

static tpf_status tpf_cuda__ev_recv(tpf_cuda_backend *b, tpf_reg *r, const tpf_exec_args *a,
                                    int idx, const tpf_step *st, cudaStream_t s) {
  (void)a;
  (void)idx;
  tpf_cuda_slot *slot = tpf_cuda__ev_recv_slot(b, r, st);
  TPF_CUDA_TRY(TPF_CUDA_ENQ(b, WAIT, cudaStreamWaitEvent(s, slot->ev, 0)),
               "cudaStreamWaitEvent(recv)");
  return TPF_OK;
}

/* BARRIER: the arrival is an event published in (me, tag); the barrier waits for every peer's. */
static tpf_status tpf_cuda__ev_barrier_arrive(tpf_cuda_backend *b, tpf_reg *r,
                                              const tpf_exec_args *a, int idx, const tpf_step *st,
                                              cudaStream_t s) {
  const int me = b->base.rank;
  TPF_CUDA_TRY(TPF_CUDA_ENQ(b, RECORD, cudaEventRecord(b->step_ev[idx], s)),
               "cudaEventRecord(barrier)");
  tpf_cuda__publish(b, &r->sync->barrier[(size_t)me * TPF_MAX_TAGS + st->tag], b->step_ev[idx],
                    (int)st->stream, a->seq);
  return TPF_OK;
}

static int tpf_cuda__ev_barrier_missing(tpf_cuda_backend *b, tpf_reg *r, const tpf_exec_args *a,
                                        const tpf_step *st) {
  const int P = b->base.tp_size, me = b->base.rank;
  int missing = -1;
  for (int q = 0; q < P && missing < 0; q++)
    if (q != me && atomic_load_explicit(&r->sync->barrier[(size_t)q * TPF_MAX_TAGS + st->tag].word,
                                        memory_order_acquire) < a->seq)
      missing = q;
  return missing;
}

static tpf_status tpf_cuda__ev_barrier(tpf_cuda_backend *b, tpf_reg *r, const tpf_exec_args *a,
                                       int idx, const tpf_step *st, cudaStream_t s) {
  (void)a;
  (void)idx;
  const int P = b->base.tp_size, me = b->base.rank;
  for (int q = 0; q < P; q++)
    if (q != me)
      TPF_CUDA_TRY(TPF_CUDA_ENQ(b, WAIT,
                                cudaStreamWaitEvent(
                                    s, r->sync->barrier[(size_t)q * TPF_MAX_TAGS + st->tag].ev, 0)),
                   "cudaStreamWaitEvent(barrier)");
  return TPF_OK;
}

/* Rank 0 allocates the group's table and passes its address in its registration record. */
static tpf_status tpf_cuda__ev_setup(tpf_cuda_backend *b, tpf_reg *r, tpf_cuda_reg_info *mine) {
  if (b->base.rank != 0) return TPF_OK;
  r->sync = tpf_cuda__sync_new(b->base.tp_size);
  TPF_RETURN_IF(r->sync == NULL, TPF_ENOMEM, "cannot allocate the host sync table of '%s'",
                r->name);
  r->sync_owner = true;
  mine->sync = (uint64_t)(uintptr_t)r->sync;
  return TPF_OK;
}

static tpf_status tpf_cuda__ev_connect(tpf_cuda_backend *b, tpf_reg *r,
                                       const tpf_cuda_reg_info *infos) {
  (void)b;
  r->sync = (tpf_cuda_sync *)(uintptr_t)infos[0].sync;
  return TPF_OK;
}

static void tpf_cuda__ev_free(tpf_cuda_backend *b, tpf_reg *r) {
  (void)b;
  if (r->sync_owner) tpf_free(r->sync);
}

const tpf_cuda_transport tpf_cuda__transport_events = {
    .name = "events",
    .host_ordered = true,
    .setup = tpf_cuda__ev_setup,
    .connect = tpf_cuda__ev_connect,
    .free = tpf_cuda__ev_free,
    .agree = NULL, /* the handshake itself agrees on the host */
    .handshake = tpf_cuda__ev_handshake,
    .send = tpf_cuda__ev_send,
    .recv_ready = tpf_cuda__ev_recv_ready,
    .recv_event = tpf_cuda__ev_recv_event,
    .recv = tpf_cuda__ev_recv,
    .barrier_arrive = tpf_cuda__ev_barrier_arrive,
    .barrier_missing = tpf_cuda__ev_barrier_missing,
    .barrier = tpf_cuda__ev_barrier,
};
