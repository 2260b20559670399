/* The CUDA backend's execution room: the step mapping of a schedule onto CUDA streams, and the
 * two enqueuers (schedule order; and the polling one of host-ordered transports).
 *
 * Method. Each rank's backend owns TPF_NUM_STREAMS non-blocking streams (compute 0..2 at normal
 * priority, send and receive at the highest). An operation forks them from the caller's stream
 * (one event recorded there, waited on by every stream the schedule uses), enqueues its steps in
 * schedule order on the step's stream, records a pooled event after every step that a step on
 * another stream depends on and makes that stream wait on it, and finally joins every used
 * stream back into the caller's stream. Nothing waits on the host: execute only enqueues (the
 * host-ordered transport of in-process ranks waits on the host only for its peers to reach the
 * same point of their programs, cuda_transport_events.c).
 *
 * The lean enqueue (b->lean, TPF_CUDA_LEAN_ENQUEUE=1, the default) issues fewer calls for the
 * same order. (1) Virtual RECVs: with a transport that publishes its events (recv_event, the
 * in-process one), a RECV on a schedule stream that holds RECVs alone and has a CUDA stream of
 * its own makes no call; a step that depends on it waits on the sender's event, then on what the
 * RECV stood behind (its deps and the previous RECV of its stream), and the join waits the same
 * way; that stream is neither forked nor joined. (2) No repeated waits: per waiting stream, the
 * latest step waited on per schedule stream (steps of one schedule stream are enqueued, and their
 * events recorded, in index order) and the latest publication waited on per peer and peer stream
 * (tpf_cuda_slot.order); a wait on an earlier one is implied and skipped. (3) A SEND's transport
 * records step_ev[i] right after the bytes, so no second record. (4) The handshake's device
 * waits cover b->hs_peers only: the schedule's handshake_peers, which the core computed. Each
 * operation's host cost is counted per kind of call (TPF_CUDA_ENQ, tpf_cuda_backend_enqueue_stats).
 *
 * Step mapping (the signals are the registration's transports', cuda_transport*.c):
 *   HANDSHAKE    nothing at P = 1; else the transport's handshake: the ready word (sequence
 *                number, operation key: kind and split count, active rows) to every peer, a wait
 *                for every peer's, and the comparison.
 *   GEMM         cuBLASLt (cuda_gemm.c) with the step's transposes (TPF_STEP_TRANS_A/W: the
 *                operand's stored block, used transposed) and, on steps flagged
 *                TPF_STEP_EPILOGUE, the operation's epilogue (alpha, beta, bias from d.col,
 *                GELU). A GEMM whose SM budget is TPF_SMS_LEAVE_COMM leaves comm_ctas SMs to
 *                the operation's communication kernels.
 *   SEND         the bytes into the peer's registration, then the transport's send signal (device
 *                flags: a 1-thread kernel storing seq into the peer's flag [me][tag]; events: an
 *                event published for the peer). The bytes move by the step's transport class
 *                (kSendCopy): TPF_XPORT_COPY_KERNEL, and every SEND under graph capture, with a
 *                kernel of at most comm_ctas CTAs that skips its bytes once the registration's
 *                status holds a failure; TPF_XPORT_COPY_ENGINE with cudaMemcpyAsync (no SMs),
 *                which runs even after a failed handshake (cuda_status.c, Failures).
 *   RECV         the transport's recv: a wait for that signal. Host-ordered transports never
 *                enqueue one: their enqueuer (tpf_cuda__enqueue_local) handles RECV and BARRIER.
 *   BARRIER      nothing at P = 1; else the transport's barrier: signal every peer, wait for all.
 *   REDUCE       a vectorised fp32-accumulating kernel of at most comm_ctas CTAs over `count`
 *                views of this rank's registration, stride_bytes apart.
 *   PEER_REDUCE  the same kernel over view a of ranks me, me + 1, ... (mod P), read through
 *                their mapped pointers.
 * A reduction flagged with the epilogue (it writes D) applies it to the sum before rounding.
 */
#define _POSIX_C_SOURCE 200809L
#include "cuda_state.h"
#include "cuda_error.h"
#include "cuda_log.h"

#include "tpflex/tpflex_backend_support.h"

#include <sched.h>
#include <stdatomic.h>
#include <string.h>

/* A resolved operand: pointer to element (row, col), leading dimension, dtype. */
typedef struct {
  char *ptr;
  uint64_t ld;
  tpf_dtype dtype;
} tpf_cuda_view;

static tpf_status tpf_cuda__resolve(const tpf_reg *r, const tpf_exec_args *a, const tpf_mref *m,
                                    int owner, tpf_cuda_view *out) {
  const tpf_matrix *um = NULL;
  switch (m->id) {
  case TPF_MAT_BUF: {
    const tpf_dtype dt = a->sched->dtype;
    const uint64_t e = tpf_dtype_size(dt);
    out->ptr = r->peer_base[owner] + m->off_bytes + (m->row * m->ld + m->col) * e;
    out->ld = m->ld;
    out->dtype = dt;
    return TPF_OK;
  }
  case TPF_MAT_X:
    um = &a->x;
    break;
  case TPF_MAT_W:
    um = &a->w;
    break;
  default: /* TPF_MAT_D: core/exec_check.c proved every operand id names a given matrix */
    um = &a->d;
    break;
  }
  const uint64_t ld = m->ld != 0 ? m->ld : um->ld;
  out->ptr = (char *)um->ptr + (m->row * ld + m->col) * tpf_dtype_size(um->dtype);
  out->ld = ld;
  out->dtype = um->dtype;
  return TPF_OK;
}

/* The epilogue of a step as the kernels take it: off unless the core flagged the step; the bias
 * starts at the step's first column of D (d.col elements of D's dtype into the user's vector). */
static void tpf_cuda__step_epi(const tpf_exec_args *a, const tpf_step *st, const tpf_cuda_view *vd,
                               tpf_cuda_epi *e) {
  memset(e, 0, sizeof(*e));
  if ((st->flags & TPF_STEP_EPILOGUE) == 0) return;
  e->on = 1;
  e->alpha = a->epi.alpha;
  e->beta = a->epi.beta;
  e->gelu = a->epi.gelu ? 1 : 0;
  if (a->epi.bias != NULL)
    e->bias = (const char *)a->epi.bias + st->d.col * tpf_dtype_size(vd->dtype);
}

/* The transport of a step with `peer` (-1: the collective ones): the graph transport under
 * capture, the registration's otherwise. */
static const tpf_cuda_transport *tpf_cuda__tp(const tpf_cuda_backend *b, const tpf_reg *r,
                                              int peer) {
  if (b->capturing) return &tpf_cuda__transport_graph;
  return peer < 0 ? r->tp : r->peer_tp[peer];
}

/* The copy of a SEND's bytes per transport class (tpf_xport, chosen by the core): the copy
 * engine (no SMs; it runs even after a failed handshake, cuda_status.c, Failures), or a kernel of
 * at most comm_ctas CTAs that skips its bytes once the registration's status holds a failure:
 * under replay that is how a mismatched HANDSHAKE moves no byte (cuda_transport_flags.c), so
 * every SEND under graph capture takes the kernel whatever its class. */
static cudaError_t tpf_cuda__copy_engine(const tpf_reg *r, char *dst, const char *src,
                                         uint64_t bytes, int ctas, cudaStream_t s) {
  (void)r;
  (void)ctas;
  return cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s);
}
static cudaError_t tpf_cuda__copy_kernel(const tpf_reg *r, char *dst, const char *src,
                                         uint64_t bytes, int ctas, cudaStream_t s) {
  return tpf_cuda__launch_copy(dst, src, bytes, r->status_dev, ctas, s);
}
typedef cudaError_t (*tpf_cuda_copy_fn)(const tpf_reg *r, char *dst, const char *src,
                                        uint64_t bytes, int ctas, cudaStream_t s);
static const struct {
  tpf_cuda_copy_fn copy;
  const char *what;
} kSendCopy[TPF_XPORT_COUNT] = {
    [TPF_XPORT_COPY_ENGINE] = {tpf_cuda__copy_engine, "cudaMemcpyAsync(send)"},
    [TPF_XPORT_COPY_KERNEL] = {tpf_cuda__copy_kernel, "copy kernel launch"},
};

static tpf_status tpf_cuda__step_run(tpf_cuda_backend *b, tpf_reg *r, const tpf_exec_args *a,
                                     int idx, const tpf_step *st, cudaStream_t s);

/* One step, between its timing events while profiling (cuda_timing.c). */
static tpf_status tpf_cuda__step(tpf_cuda_backend *b, tpf_reg *r, const tpf_exec_args *a, int idx,
                                 const tpf_step *st, cudaStream_t s) {
  tpf_cuda__timing_step(r, st, s, false);
  const tpf_status rc = tpf_cuda__step_run(b, r, a, idx, st, s);
  if (rc == TPF_OK) tpf_cuda__timing_step(r, st, s, true);
  return rc;
}

/* One step, mapped by its kind and its mechanism (transport class, SM budget): the core chose
 * them and core/exec_check.c proved every peer, tag, count, operand and class in range. */
static tpf_status tpf_cuda__step_run(tpf_cuda_backend *b, tpf_reg *r, const tpf_exec_args *a,
                                     int idx, const tpf_step *st, cudaStream_t s) {
  const int P = b->base.tp_size, me = b->base.rank;
  switch (st->kind) {
  case TPF_STEP_HANDSHAKE:
    if (P == 1) return TPF_OK;
    return tpf_cuda__tp(b, r, -1)->handshake(b, r, a, s);
  case TPF_STEP_GEMM: {
    tpf_cuda_view va, vw, vd;
    TPF_CHECK(tpf_cuda__resolve(r, a, &st->a, me, &va));
    TPF_CHECK(tpf_cuda__resolve(r, a, &st->w, me, &vw));
    TPF_CHECK(tpf_cuda__resolve(r, a, &st->d, me, &vd));
    /* TPF_SMS_LEAVE_COMM: the operation's copy or reduction kernels run beside this GEMM. */
    int sm_target = 0;
    if (st->sm_budget == TPF_SMS_LEAVE_COMM && b->num_sms > b->comm_ctas)
      sm_target = b->num_sms - b->comm_ctas;
    const int ws = st->stream < TPF_MAX_COMPUTE_STREAMS ? (int)st->stream : 0;
    tpf_cuda_epi e;
    tpf_cuda__step_epi(a, st, &vd, &e);
    /* Transposed operands: resolve gave the stored block's first element and the stored ld. */
    return TPF_CUDA_ENQ(b, GEMM,
                        tpf_cuda__gemm_run_ex(b->gemm, va.ptr, va.dtype, va.ld, vw.ptr, vw.dtype,
                                              vw.ld, vd.ptr, vd.dtype, vd.ld, st->m, st->n, st->k,
                                              st->flags, &e, sm_target, ws, s));
  }
  case TPF_STEP_SEND: {
    char *dst = r->peer_base[st->peer] + st->dst_off;
    const char *src = r->base + st->src_off;
    const int xport = b->capturing ? TPF_XPORT_COPY_KERNEL : st->xport;
    TPF_CUDA_TRY(
        TPF_CUDA_ENQ(b, COPY, kSendCopy[xport].copy(r, dst, src, st->bytes, b->comm_ctas, s)),
        kSendCopy[xport].what);
    return tpf_cuda__tp(b, r, st->peer)->send(b, r, a, idx, st, s);
  }
  case TPF_STEP_RECV:
    /* Host-ordered transports never get here: tpf_cuda__enqueue_local handles RECV and BARRIER. */
    return tpf_cuda__tp(b, r, st->peer)->recv(b, r, a, idx, st, s);
  case TPF_STEP_BARRIER:
    if (P == 1) return TPF_OK;
    return tpf_cuda__tp(b, r, -1)->barrier(b, r, a, idx, st, s);
  case TPF_STEP_REDUCE:
  case TPF_STEP_PEER_REDUCE: {
    tpf_cuda_reduce_args ra;
    memset(&ra, 0, sizeof(ra));
    tpf_cuda_view vd;
    TPF_CHECK(tpf_cuda__resolve(r, a, &st->d, me, &vd));
    for (uint32_t t = 0; t < st->count; t++) {
      tpf_cuda_view va;
      if (st->kind == TPF_STEP_REDUCE) {
        TPF_CHECK(tpf_cuda__resolve(r, a, &st->a, me, &va));
        va.ptr += (uint64_t)t * st->stride_bytes;
      } else {
        TPF_CHECK(tpf_cuda__resolve(r, a, &st->a, (me + (int)t) % P, &va));
      }
      ra.srcs[t] = va.ptr;
      ra.src_ld = va.ld;
      ra.src_dtype = (int32_t)va.dtype;
    }
    ra.dst = vd.ptr;
    ra.dst_ld = vd.ld;
    ra.dst_dtype = (int32_t)vd.dtype;
    ra.rows = st->m;
    ra.cols = st->n;
    ra.count = (int32_t)st->count;
    tpf_cuda__step_epi(a, st, &vd, &ra.epi);
    TPF_CUDA_TRY(
        TPF_CUDA_ENQ(b, COPY, tpf_cuda__launch_reduce(&ra, r->status_dev, b->comm_ctas, s)),
        "reduce kernel launch");
    return TPF_OK;
  }
  default: /* every kind is one of the above (core/exec_check.c) */
    return TPF_OK;
  }
}

/* Grows the per-step scratch arrays to at least n steps. nneed_ev is raised only once every
 * array holds the new count: after a failed allocation it still says what all of them hold, so
 * the next call grows again instead of trusting a count only some arrays reached (the old code
 * raised the event count first and returned early on it, and execute then wrote n bytes into a
 * scratch array that had never grown). No CUDA call. */
tpf_status tpf_cuda__grow_step_scratch(tpf_cuda_backend *b, int n) {
  if (n <= b->nneed_ev) return TPF_OK;
  int want = b->nneed_ev > 0 ? b->nneed_ev : 32;
  while (want < n)
    want *= 2;
  uint8_t *need = tpf_realloc(b->need_ev, (size_t)want);
  TPF_RETURN_IF(need == NULL, TPF_ENOMEM, "cannot grow the event scratch to %d", want);
  b->need_ev = need;
  uint8_t *state = tpf_realloc(b->step_state, (size_t)want);
  TPF_RETURN_IF(state == NULL, TPF_ENOMEM, "cannot grow the step scratch to %d", want);
  b->step_state = state;
  uint8_t *virt = tpf_realloc(b->step_virt, (size_t)want);
  TPF_RETURN_IF(virt == NULL, TPF_ENOMEM, "cannot grow the step scratch to %d", want);
  b->step_virt = virt;
  int16_t *prev = tpf_realloc(b->step_prev, (size_t)want * sizeof(*prev));
  TPF_RETURN_IF(prev == NULL, TPF_ENOMEM, "cannot grow the step scratch to %d", want);
  b->step_prev = prev;
  tpf_cuda_peer_ev *pev = tpf_realloc(b->step_pev, (size_t)want * sizeof(*pev));
  TPF_RETURN_IF(pev == NULL, TPF_ENOMEM, "cannot grow the step scratch to %d", want);
  b->step_pev = pev;
  b->nneed_ev = want;
  return TPF_OK;
}

static tpf_status tpf_cuda__ensure_events(tpf_cuda_backend *b, int n) {
  if (n > b->nstep_ev) {
    int want = b->nstep_ev > 0 ? b->nstep_ev : 32;
    while (want < n)
      want *= 2;
    cudaEvent_t *ev = tpf_realloc(b->step_ev, (size_t)want * sizeof(*ev));
    TPF_RETURN_IF(ev == NULL, TPF_ENOMEM, "cannot grow the event pool to %d", want);
    b->step_ev = ev;
    /* nstep_ev counts the events created, so a failure part-way leaves it true. */
    for (; b->nstep_ev < want; b->nstep_ev++)
      TPF_CUDA_TRY(cudaEventCreateWithFlags(&b->step_ev[b->nstep_ev], cudaEventDisableTiming),
                   "cudaEventCreate");
  }
  /* Both counts decide: the events and the scratch grow (and may fail) separately. */
  return tpf_cuda__grow_step_scratch(b, n);
}

/* Orders stream s (waiter w: its schedule stream, or TPF_NUM_STREAMS for the caller's stream)
 * after step d. A real step on another CUDA stream: a wait on its event, skipped in the lean
 * enqueue when s already waits on a later step of the same schedule stream (whose event was
 * recorded after d's). A virtual RECV (lean, in-process groups): a wait on the peer's published
 * event, skipped when s already waits on a later event of the same stream of that peer; then on
 * what the RECV would have been ordered after on its own stream: its dependencies and the
 * previous step of its stream. */
int tpf_cuda__wait_plan(tpf_cuda_backend *b, const tpf_schedule *sc, int w, cudaStream_t s, int d,
                        cudaEvent_t *out, int n, int cap) {
  const tpf_step *sd = &sc->steps[d];
  if (b->lean && b->step_virt[d]) {
    /* A stream of virtual RECVs has no events of its own: its waited_step entry says up to which
     * RECV s is already ordered after (everything before it on the stream included); it is set
     * once the whole chain below d is planned. */
    int32_t *covered = &b->waited_step[w][sd->stream];
    if (*covered >= d) return n;
    const tpf_cuda_peer_ev *pe = &b->step_pev[d];
    uint32_t *seen = &b->waited_peer[w][pe->peer][pe->stream];
    if (*seen < pe->order) {
      if (n >= cap) return -1;
      out[n++] = pe->ev;
      *seen = pe->order;
    }
    for (int k = 0; k < sd->ndeps && n >= 0; k++)
      n = tpf_cuda__wait_plan(b, sc, w, s, sd->deps[k], out, n, cap);
    if (n >= 0 && b->step_prev[d] >= 0)
      n = tpf_cuda__wait_plan(b, sc, w, s, b->step_prev[d], out, n, cap);
    if (n >= 0) *covered = d;
    return n;
  }
  if (b->streams[sd->stream] == s) return n; /* stream order */
  if (b->lean) {
    int32_t *seen = &b->waited_step[w][sd->stream];
    if (*seen >= d) return n;
    *seen = d;
  }
  if (n >= cap) return -1;
  out[n++] = b->step_ev[d];
  return n;
}

static tpf_status tpf_cuda__wait_for(tpf_cuda_backend *b, const tpf_schedule *sc, int w,
                                     cudaStream_t s, int d) {
  const int n = tpf_cuda__wait_plan(b, sc, w, s, d, b->wait_buf, 0, TPF_CUDA_WAIT_MAX);
  TPF_RETURN_IF(n < 0, TPF_ESTATE, "rank %d: more than %d events to wait for before step %d",
                b->base.rank, TPF_CUDA_WAIT_MAX, d);
  for (int k = 0; k < n; k++)
    TPF_CUDA_TRY(TPF_CUDA_ENQ(b, WAIT, cudaStreamWaitEvent(s, b->wait_buf[k], 0)),
                 "cudaStreamWaitEvent(dep)");
  return TPF_OK;
}

static tpf_status tpf_cuda__wait_deps(tpf_cuda_backend *b, const tpf_schedule *sc, int i,
                                      cudaStream_t s) {
  const tpf_step *st = &sc->steps[i];
  for (int k = 0; k < st->ndeps; k++)
    TPF_CHECK(tpf_cuda__wait_for(b, sc, (int)st->stream, s, st->deps[k]));
  return TPF_OK;
}

/* Host-ordered transports (in-process ranks): enqueue the schedule in a dependency order that lets
 * communication go first and never blocks the host on one peer while other work could be
 * enqueued. A RECV or BARRIER whose peer has not published yet (the transport's recv_ready,
 * barrier_missing) is passed over and retried; each pass visits the send and receive
 * streams before the compute streams, so a chunk is forwarded as soon as it may be, instead of
 * after the GEMM the schedule lists before it. The streams' order and every dependency are kept:
 * a step is enqueued only after every step it depends on and the previous step of its stream. */
static tpf_status tpf_cuda__enqueue_local(tpf_cuda_backend *b, tpf_reg *r, const tpf_exec_args *a) {
  const tpf_schedule *sc = a->sched;
  const int n = sc->nsteps, me = b->base.rank;
  static const int order[TPF_NUM_STREAMS] = {TPF_STREAM_SEND, TPF_STREAM_RECV, TPF_STREAM_COMPUTE0,
                                             TPF_STREAM_COMPUTE1, TPF_STREAM_COMPUTE2};
  /* State per step: 0 pending, 1 barrier arrival published (waiting for peers), 2 enqueued. */
  uint8_t *state = b->step_state;
  memset(state, 0, (size_t)n);
  int next[TPF_NUM_STREAMS]; /* the next step of each stream, or n */
  for (int k = 0; k < TPF_NUM_STREAMS; k++) {
    next[k] = n;
    for (int i = 0; i < n; i++)
      if (sc->steps[i].stream == k) {
        next[k] = i;
        break;
      }
  }
  int remaining = n;
  uint64_t idle_since = 0;
  unsigned spins = 0;
  while (remaining > 0) {
    bool progress = false;
    int blocked = -1, blocked_peer = -1;
    for (int o = 0; o < TPF_NUM_STREAMS; o++) {
      const int k = order[o];
      const int i = next[k];
      if (i >= n) continue;
      const tpf_step *st = &sc->steps[i];
      bool deps_done = true;
      for (int d = 0; d < st->ndeps; d++)
        deps_done = deps_done && state[st->deps[d]] == 2;
      if (!deps_done) continue;
      cudaStream_t s = b->streams[k];
      if (st->kind == TPF_STEP_RECV) {
        const tpf_cuda_transport *tp = r->peer_tp[st->peer];
        if (tp->recv_ready != NULL && !tp->recv_ready(b, r, a, st)) {
          blocked = i;
          blocked_peer = st->peer;
          continue;
        }
        if (b->step_virt[i]) {
          tp->recv_event(b, r, st, &b->step_pev[i]); /* no call: dependents wait on it */
        } else {
          TPF_CHECK(tpf_cuda__wait_deps(b, sc, i, s));
          TPF_CHECK(tp->recv(b, r, a, i, st, s));
        }
      } else if (st->kind == TPF_STEP_BARRIER) {
        const tpf_cuda_transport *tp = r->tp;
        if (state[i] == 0) {
          TPF_CHECK(tpf_cuda__wait_deps(b, sc, i, s));
          if (tp->barrier_arrive != NULL) TPF_CHECK(tp->barrier_arrive(b, r, a, i, st, s));
          state[i] = 1;
          progress = true;
        }
        const int missing = tp->barrier_missing != NULL ? tp->barrier_missing(b, r, a, st) : -1;
        if (missing >= 0) {
          blocked = i;
          blocked_peer = missing;
          continue;
        }
        TPF_CHECK(tp->barrier(b, r, a, i, st, s));
      } else {
        TPF_CHECK(tpf_cuda__wait_deps(b, sc, i, s));
        TPF_CHECK(tpf_cuda__step(b, r, a, i, st, s));
      }
      /* A virtual RECV has no event of its own; a SEND's transport recorded step_ev[i] right
       * after its bytes (the event it published), which is the same point of the stream. */
      const bool recorded = b->lean && (b->step_virt[i] || st->kind == TPF_STEP_SEND);
      if (b->need_ev[i] && !recorded)
        TPF_CUDA_TRY(TPF_CUDA_ENQ(b, RECORD, cudaEventRecord(b->step_ev[i], s)),
                     "cudaEventRecord(step)");
      state[i] = 2;
      remaining--;
      progress = true;
      int j = i + 1;
      while (j < n && sc->steps[j].stream != k)
        j++;
      next[k] = j;
    }
    if (progress) {
      if (idle_since != 0) tpf_cuda__enq_peer_wait(b, idle_since);
      idle_since = 0;
      continue;
    }
    if (blocked < 0)
      return tpf_set_error(TPF_EINVAL, "'%s' rank %d: schedule cannot progress (cyclic deps)",
                           a->comm_name, me);
    if (idle_since == 0) idle_since = tpf_cuda__now_ns();
    if ((++spins & 63u) == 0) {
      TPF_CHECK(tpf_cuda__events_peer_failed(
          b, r, a, blocked, tpf_step_kind_name(sc->steps[blocked].kind), blocked_peer));
      if (atomic_load(&r->aborted))
        return tpf_set_error(TPF_ESTATE,
                             "'%s' was aborted (tpf_comm_abort): rank %d gave up at step %d (%s) "
                             "waiting for rank %d",
                             a->comm_name, me, blocked, tpf_step_kind_name(sc->steps[blocked].kind),
                             blocked_peer);
      if (tpf_cuda__now_ns() - idle_since > b->timeout_ns)
        return tpf_set_error(TPF_ETIMEOUT,
                             "'%s' rank %d, operation %llu, step %d (%s): waited %llu ms for rank "
                             "%d, which never reached it",
                             a->comm_name, me, (unsigned long long)a->seq, blocked,
                             tpf_step_kind_name(sc->steps[blocked].kind),
                             (unsigned long long)(b->timeout_ns / 1000000ull), blocked_peer);
      sched_yield();
    }
  }
  return TPF_OK;
}

/* The lean enqueue's view of a schedule (Method; the contract is in cuda_state.h). */
void tpf_cuda__lean_prepare(tpf_cuda_backend *b, const tpf_reg *r, const tpf_schedule *sc,
                            bool virt[TPF_NUM_STREAMS], int last[TPF_NUM_STREAMS]) {
  const int P = b->base.tp_size, n = sc->nsteps;
  b->hs_peers = sc->handshake_peers; /* the core's peer set (tpflex_backend.h) */
  for (int k = 0; k < TPF_NUM_STREAMS; k++)
    last[k] = -1;
  bool only_recv[TPF_NUM_STREAMS];
  for (int k = 0; k < TPF_NUM_STREAMS; k++)
    only_recv[k] = P > 1 && r->tp != NULL && r->tp->host_ordered;
  for (int i = 0; i < n; i++) {
    const tpf_step *st = &sc->steps[i];
    const int k = (int)st->stream;
    b->step_prev[i] = (int16_t)last[k];
    last[k] = i;
    only_recv[k] = only_recv[k] && st->kind == TPF_STEP_RECV && r->peer_tp[st->peer] != NULL &&
                   r->peer_tp[st->peer]->recv_event != NULL;
  }
  for (int k = 0; k < TPF_NUM_STREAMS; k++) {
    bool own = true;
    for (int j = 0; j < TPF_NUM_STREAMS; j++)
      own = own && (j == k || b->streams[j] != b->streams[k]);
    virt[k] = last[k] >= 0 && only_recv[k] && own;
  }
  for (int i = 0; i < n; i++)
    b->step_virt[i] = virt[sc->steps[i].stream] ? 1u : 0u;
}

/* The operation's end on the caller's stream, for reg_sync: under capture an external record
 * node, so that every replay records it. */
static tpf_status tpf_cuda__record_done(tpf_cuda_backend *b, tpf_reg *r, cudaStream_t user) {
  TPF_CUDA_TRY(TPF_CUDA_ENQ(b, RECORD,
                            b->capturing ? cudaEventRecordWithFlags(r->done_ev, user,
                                                                    cudaEventRecordExternal)
                                         : cudaEventRecord(r->done_ev, user)),
               "cudaEventRecord(done)");
  return TPF_OK;
}

static tpf_status tpf_cuda__execute_p1(tpf_cuda_backend *b, tpf_reg *r, const tpf_exec_args *a,
                                       cudaStream_t user) {
  const tpf_schedule *sc = a->sched;
  for (int i = 0; i < sc->nsteps; i++) {
    TPF_CHECK(tpf_cuda__step(b, r, a, i, &sc->steps[i], user));
  }
  return tpf_cuda__record_done(b, r, user);
}

static tpf_status tpf_cuda__execute_body(tpf_backend *be, tpf_reg *r, const tpf_exec_args *a,
                                         void *stream) {
  tpf_cuda_backend *b = tpf_cuda__of(be);
  const tpf_schedule *sc = a->sched;
  TPF_RETURN_IF(sc->tp_size != be->tp_size || sc->rank != be->rank, TPF_EINVAL,
                "'%s': schedule for rank %d of %d on backend rank %d of %d", a->comm_name, sc->rank,
                sc->tp_size, be->rank, be->tp_size);
  TPF_CUDA_TRY(cudaSetDevice(b->device), "cudaSetDevice");
  /* Under CUDA-graph capture every step goes through the graph transport (device sequence
   * numbers, device handshake: cuda_transport_flags.c) and the schedule-order enqueuer. */
  enum cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  TPF_CUDA_TRY(cudaStreamIsCapturing((cudaStream_t)stream, &capture), "cudaStreamIsCapturing");
  TPF_RETURN_IF(capture == cudaStreamCaptureStatusInvalidated, TPF_ESTATE,
                "'%s': the stream's CUDA-graph capture was invalidated (an error earlier in the "
                "capture); end it and capture again",
                a->comm_name);
  b->capturing = capture == cudaStreamCaptureStatusActive;
  /* A failure of an earlier operation on this registration is reported here until its sync
   * takes it; another registration's failure is that one's. */
  TPF_CHECK(tpf_cuda__check_status(b, r));
  /* fp8 scales, and fp8 GEMMs cuBLASLt cannot run refused before anything is enqueued. */
  TPF_CHECK(tpf_cuda__gemm_fp8_prepare(b->gemm, a));
  /* Released stream-memory waits would pass at once: the registration runs nothing more. */
  TPF_RETURN_IF(atomic_load(&r->released), TPF_ESTATE,
                "'%s': its stream-memory waits were released after a timeout or abort; it runs "
                "no more operations (destroy it)",
                a->comm_name);
  /* P = 1: the schedule's steps in order on the caller's stream (one GEMM, core/schedule.c):
   * no fork, no join, no event. */
  if (be->tp_size == 1) return tpf_cuda__execute_p1(b, r, a, (cudaStream_t)stream);
  /* The transport's host agreement (ranks in other processes: cuda_transport_flags.c): agree on
   * the operation (key) and shape before anything is enqueued, so that a disagreement moves no
   * byte (the device handshake still orders the buffers). */
  if (!b->capturing && r->tp->agree != NULL) TPF_CHECK(r->tp->agree(b, r, a));
  TPF_CHECK(tpf_cuda__ensure_events(b, sc->nsteps));
  const int n = sc->nsteps;
  bool used[TPF_NUM_STREAMS] = {false};
  memset(b->need_ev, 0, (size_t)n);
  for (int i = 0; i < n; i++) {
    const tpf_step *st = &sc->steps[i];
    used[st->stream] = true; /* streams, deps (earlier steps only): core/exec_check.c */
    for (int k = 0; k < st->ndeps; k++) {
      const int d = st->deps[k];
      if (b->streams[sc->steps[d].stream] != b->streams[st->stream]) b->need_ev[d] = 1;
    }
  }
  /* The lean enqueue's state of this operation (Method). */
  bool virt[TPF_NUM_STREAMS] = {false};
  int last[TPF_NUM_STREAMS];
  memset(b->step_virt, 0, (size_t)n);
  b->pub_order = 0;
  if (b->lean) {
    memset(b->waited_step, 0xff, sizeof b->waited_step); /* -1: nothing waited */
    memset(b->waited_peer, 0, sizeof b->waited_peer);
  }
  /* last[] is needed by the join in both modes; the rest only counts when lean. */
  tpf_cuda__lean_prepare(b, r, sc, virt, last);
  if (!b->lean || b->capturing) { /* no virtual RECV: the graph transport publishes no event */
    memset(virt, 0, sizeof virt);
    memset(b->step_virt, 0, (size_t)n);
  }
  cudaStream_t user = (cudaStream_t)stream;
  const bool polling = r->tp->host_ordered && !b->capturing;
  TPF_CUDA_TRACE(EXEC, be->rank, "'%s' operation %llu: %d steps, %s enqueuer%s", a->comm_name,
                 (unsigned long long)a->seq, n, polling ? "polling" : "schedule-order",
                 b->capturing ? ", captured" : "");
  if (b->capturing) TPF_CHECK(tpf_cuda__graph_begin(b, r, user));
  TPF_CUDA_TRY(TPF_CUDA_ENQ(b, RECORD, cudaEventRecord(b->fork_ev, user)), "cudaEventRecord(fork)");
  for (int k = 0; k < TPF_NUM_STREAMS; k++) {
    /* Aliased compute streams are forked once; a stream of virtual RECVs runs nothing. */
    if (used[k] && !virt[k] && (k == 0 || b->streams[k] != b->streams[0] || !used[0]))
      TPF_CUDA_TRY(TPF_CUDA_ENQ(b, WAIT, cudaStreamWaitEvent(b->streams[k], b->fork_ev, 0)),
                   "cudaStreamWaitEvent(fork)");
  }
  if (polling) {
    TPF_CHECK(tpf_cuda__enqueue_local(b, r, a));
  } else {
    for (int i = 0; i < n; i++) {
      const tpf_step *st = &sc->steps[i];
      cudaStream_t s = b->streams[st->stream];
      TPF_CHECK(tpf_cuda__wait_deps(b, sc, i, s));
      tpf_status rc = tpf_cuda__step(b, r, a, i, st, s);
      if (rc != TPF_OK)
        return rc; /* the enqueued prefix joins nothing: the caller's stream is not ordered */
      if (b->need_ev[i])
        TPF_CUDA_TRY(TPF_CUDA_ENQ(b, RECORD, cudaEventRecord(b->step_ev[i], s)),
                     "cudaEventRecord(step)");
    }
  }
  for (int k = 0; k < TPF_NUM_STREAMS; k++) {
    if (!used[k] ||
        (k > 0 && k < TPF_MAX_COMPUTE_STREAMS && b->streams[k] == b->streams[0] && used[0]))
      continue;
    if (virt[k]) { /* the peers' events its RECVs stand for */
      TPF_CHECK(tpf_cuda__wait_for(b, sc, TPF_NUM_STREAMS, user, last[k]));
      continue;
    }
    TPF_CUDA_TRY(TPF_CUDA_ENQ(b, RECORD, cudaEventRecord(b->join_ev[k], b->streams[k])),
                 "cudaEventRecord(join)");
    TPF_CUDA_TRY(TPF_CUDA_ENQ(b, WAIT, cudaStreamWaitEvent(user, b->join_ev[k], 0)),
                 "cudaStreamWaitEvent(join)");
  }
  return tpf_cuda__record_done(b, r, user);
}

tpf_status tpf_cuda__execute(tpf_backend *be, tpf_reg *r, const tpf_exec_args *a, void *stream) {
  tpf_cuda_backend *b = tpf_cuda__of(be);
  const uint64_t t0 = tpf_cuda__now_ns();
  tpf_cuda__timing_begin(b, r, a, (cudaStream_t)stream); /* profiling only (cuda_timing.c) */
  tpf_status rc = tpf_cuda__execute_body(be, r, a, stream);
  tpf_cuda__timing_end(r, (cudaStream_t)stream, rc);
  /* A failure of this rank's own (a CUDA or cuBLASLt error, out of memory, a bad schedule)
   * releases the peers' host waits at once. Not: a mismatch (every rank sees it at the
   * handshake), a refusal before the handshake, a timeout (the peers wait for the same absent
   * rank and report it themselves) or a TPF_ESTATE (an abort, a peer's failure, a released
   * registration: nothing for the peers to learn). */
  if (rc != TPF_OK && rc != TPF_EMISMATCH && rc != TPF_EUNSUPPORTED && rc != TPF_ETIMEOUT &&
      rc != TPF_ESTATE)
    tpf_cuda__events_fail(b, r, a, rc);
  b->enq.ops++;
  b->enq.host_ns += tpf_cuda__now_ns() - t0;
  return rc;
}
