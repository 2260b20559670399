/* Executing one rank's schedule on its stream workers.
 *
 * Method: execute publishes the operation to the rank's TPF_NUM_STREAMS workers and sleeps until
 * all of them let go of it. Worker s walks the schedule in order and runs the steps whose stream
 * is s, which gives CUDA's in-stream order; before a step it waits for the steps named in deps
 * (events between streams), then sleeps a seeded random 0..max_delay_us so that interleavings
 * differ from run to run, then runs the step. GEMM chunks on compute workers and transfers on
 * the comm worker therefore really overlap.
 *
 * Cross-rank protocol (tpflex_backend.h): a SEND copies into the peer's block of the shared
 * registration and then stores seq into the peer's flag [me][tag] with release order; a RECV
 * waits for its flag >= seq with acquire order, so the bytes are visible after it. BARRIER
 * raises its flag on every peer and waits for all of theirs. HANDSHAKE (P > 1 only) publishes
 * TPF_READY_WORD(seq, op_key, rows) to every peer and waits for theirs; different rows or a
 * different operation key (kind, split count) fail the operation with TPF_EMISMATCH on every rank
 * (each rank sees at least one different word) before any byte moves. Every cross-rank wait
 * sleeps on the rank's doorbell, re-reading the bound in force (tpf_sim__timeout_ms) at each
 * wakeup, and fails at it with TPF_ETIMEOUT naming the rank, the step and the peer awaited. The
 * waits between a rank's own streams, and execute's wait for its workers, are nets with the same
 * message form (the rank itself is the one awaited).
 *
 * One thread per rank: every rank-thread entry claims the rank (tpf_sim__enter), and the job slot
 * refuses a second operation while one runs (TPF_ESTATE naming the rule), so a second thread
 * gets an error instead of overwriting the slot and leaving the first caller waiting forever.
 *
 * Failure: the first failing step records its status and message in the operation, marks it
 * failed and rings the rank's doorbell, so the other workers of the rank stop at their next
 * wait; execute re-raises the message on the calling thread (tpf_last_error is thread-local).
 */
#define _POSIX_C_SOURCE 200809L
#include "sim_internal.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct {
  tpf_sim_worker *wk;
  tpf_sim_rank *rk;
  tpf_sim_world *w;
  tpf_sim_op *op;
  const tpf_schedule *sched;
  const tpf_exec_args *args;
  tpf_sim_shared *sh;
  int me;
  int step_index;
  unsigned waited_ms; /* the bound a wait ran out of (TPF_ETIMEOUT) */
  uint64_t moved;     /* bytes this step moved between ranks */
  uint64_t flops;
} sim_ctx;

static struct timespec mono_ts(uint64_t ns) {
  struct timespec ts;
  ts.tv_sec = (time_t)(ns / 1000000000ull);
  ts.tv_nsec = (long)(ns % 1000000000ull);
  return ts;
}

static const char *comm_name(const sim_ctx *c) {
  return c->args->comm_name ? c->args->comm_name : c->sh->name;
}

/* Records the first failure of the operation and wakes every waiter of this rank. */
static tpf_status op_fail(sim_ctx *c, tpf_status st, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
static tpf_status op_fail(sim_ctx *c, tpf_status st, const char *fmt, ...) {
  char msg[TPF_SIM_MSG_LEN];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  pthread_mutex_lock(&c->op->mu);
  if (!atomic_load(&c->op->failed)) {
    c->op->status = st;
    snprintf(c->op->msg, sizeof c->op->msg, "%s", msg);
    atomic_store(&c->op->failed, 1);
  }
  pthread_cond_broadcast(&c->op->cv);
  pthread_mutex_unlock(&c->op->mu);
  tpf_sim__ring(c->w, c->sh, c->me);
  return st;
}

/* ---- bounded waits on this rank's doorbell ---- */

typedef struct {
  _Atomic uint64_t *word;
  uint64_t want;
  bool ready_word; /* compare TPF_READY_SEQ (mod 2^16) instead of >= */
} sim_pred;

static bool pred_holds(const sim_pred *p) {
  uint64_t v = atomic_load_explicit(p->word, memory_order_acquire);
  if (p->ready_word) {
    /* Equal, or ahead by less than half the 16-bit space (a protocol break, reported by the
     * caller as a mismatch rather than waited on forever). */
    uint64_t d = (TPF_READY_SEQ(v) - (p->want & TPF_READY_SEQ_MASK)) & TPF_READY_SEQ_MASK;
    return v != 0 && d < (TPF_READY_SEQ_MASK + 1) / 2;
  }
  return v >= p->want;
}

/* TPF_OK when the predicate holds, TPF_ETIMEOUT once start_ns is the bound in force ago
 * (c->waited_ms says which bound), TPF_ESTATE when the operation failed elsewhere meanwhile (the
 * caller then stops without a message of its own). The bound is re-read at every wakeup, so a
 * fault timeout armed meanwhile (tpf_sim_set_fault_timeout) applies to this wait too. */
static tpf_status wait_pred_loop(sim_ctx *c, const sim_pred *p, uint64_t start_ns);
static tpf_status wait_pred(sim_ctx *c, const sim_pred *p, uint64_t start_ns) {
  atomic_fetch_add(&c->op->cross_waits, 1);
  tpf_status st = wait_pred_loop(c, p, start_ns);
  atomic_store(&c->op->progress_ns, tpf_sim__now_ns());
  atomic_fetch_sub(&c->op->cross_waits, 1);
  return st;
}

static tpf_status wait_pred_loop(sim_ctx *c, const sim_pred *p, uint64_t start_ns) {
  uint64_t next_live = tpf_sim__now_ns() + TPF_SIM_LIVE_NS;
  for (;;) {
    uint64_t gen = tpf_sim__bell_gen(c->w, c->sh, c->me);
    if (pred_holds(p)) return TPF_OK;
    if (atomic_load(&c->op->failed)) return TPF_ESTATE;
    if (atomic_load(&c->op->reg->aborted))
      return op_fail(c, TPF_ESTATE, "'%s' was aborted (tpf_comm_abort): rank %d gave up at step %d",
                     comm_name(c), c->me, c->step_index);
    if (tpf_sim__expired(c->w, start_ns, &c->waited_ms)) return TPF_ETIMEOUT;
    /* Process mode: a peer whose process ended never raises another flag; name it now instead
     * of at the bound (what it stored before it died still counts: the predicate is read again
     * after the check). */
    if (c->w->procs && tpf_sim__now_ns() >= next_live) {
      next_live = tpf_sim__now_ns() + TPF_SIM_LIVE_NS;
      char gone[200];
      const int ngone = tpf_sim__peers_gone(c->w, gone, sizeof gone);
      if (ngone > 0 && !pred_holds(p)) {
        op_fail(c, TPF_ETIMEOUT,
                "%s %s gone (the process exited or was killed): rank %d, step %d (%s) of '%s' "
                "operation %llu cannot complete without %s",
                gone, ngone > 1 ? "are" : "is", c->me, c->step_index,
                tpf_step_kind_name(c->sched->steps[c->step_index].kind), comm_name(c),
                (unsigned long long)c->args->seq, ngone > 1 ? "them" : "it");
        return TPF_ESTATE; /* failed, with the message above */
      }
    }
    tpf_sim__bell_wait(c->w, c->sh, c->me, gen, TPF_SIM_POLL_NS);
  }
}

/* Raises flag [sender][tag] of receiver to seq (release) and rings the receiver. Flags only
 * move forward: a stale store (a duplicate delivered late, after the next operation raised the
 * same flag) must not take a flag back, or the waiter of the newer value would miss it. */
static void store_flag(tpf_sim_world *w, tpf_sim_shared *sh, int receiver, int sender, uint32_t tag,
                       uint64_t seq) {
  _Atomic uint64_t *f = tpf_sim__flag(sh, receiver, sender, tag);
  uint64_t cur = atomic_load_explicit(f, memory_order_relaxed);
  while (cur < seq && !atomic_compare_exchange_weak_explicit(f, &cur, seq, memory_order_release,
                                                             memory_order_relaxed)) {
  }
  tpf_sim__ring(w, sh, receiver);
}

static void sleep_us(unsigned us) {
  struct timespec ts = {(time_t)(us / 1000000u), (long)(us % 1000000u) * 1000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

/* Delivers a held signal (fault_mu held). */
static void deliver_held(tpf_sim_world *w, int sender, tpf_sim_held_signal *h) {
  if (!h->on) return;
  h->on = false;
  store_flag(w, h->sh, h->receiver, sender, h->tag, h->seq);
}

/* Stores seq into a flag the peer waits on, through the fault hook: the chosen raise may be
 * dropped, delayed, duplicated (at once or late) or held back until the rank's next raise. */
static void raise_flag(sim_ctx *c, int receiver, uint32_t tag) {
  tpf_sim_world *w = c->w;
  const tpf_sim_fault_ex *f = &w->fault;
  atomic_fetch_add(&w->signals, 1);
  uint64_t k = 0;
  if (tpf_sim__fault_counts(w, c->me)) k = atomic_fetch_add(&w->fault_signals, 1) + 1;
  tpf_sim_held_signal me = {true, c->sh, receiver, tag, c->args->seq};
  pthread_mutex_lock(&c->rk->fault_mu);
  if (k != 0 && k == f->base.drop_signal) {
    atomic_fetch_add(&w->fault_injected, 1);
    tpf_sim__fault_lossy(w);
    me.on = false;
  } else if (k != 0 && k == f->reorder_signal) {
    atomic_fetch_add(&w->fault_injected, 1);
    c->rk->held_reorder = me; /* delivered after the next raise, or at the end of execute */
    pthread_mutex_unlock(&c->rk->fault_mu);
    return;
  }
  if (me.on && k != 0 && k == f->delay_signal && f->delay_us != 0) {
    atomic_fetch_add(&w->fault_injected, 1);
    sleep_us(f->delay_us);
  }
  if (me.on) store_flag(w, c->sh, receiver, c->me, tag, c->args->seq);
  /* What this raise releases: an earlier reordered one, then a late duplicate of this
   * registration. */
  deliver_held(w, c->me, &c->rk->held_reorder);
  if (c->rk->held_dup.on && c->rk->held_dup.sh == c->sh) deliver_held(w, c->me, &c->rk->held_dup);
  if (me.on && k != 0 && k == f->dup_signal) {
    atomic_fetch_add(&w->fault_injected, 1);
    if (f->dup_late)
      c->rk->held_dup = me;
    else
      store_flag(w, c->sh, receiver, c->me, tag, c->args->seq);
  }
  pthread_mutex_unlock(&c->rk->fault_mu);
}

/* ---- operands ---- */

static tpf_status span_check(sim_ctx *c, const char *what, uint64_t off, uint64_t len,
                             uint64_t limit) {
  uint64_t end;
  if (!tpf_add_u64(off, len, &end) || end > limit)
    return op_fail(c, TPF_EINVAL,
                   "'%s' rank %d step %d: %s bytes [%llu, +%llu) outside the %llu registered "
                   "bytes",
                   comm_name(c), c->me, c->step_index, what, (unsigned long long)off,
                   (unsigned long long)len, (unsigned long long)limit);
  return TPF_OK;
}

/* Resolves an operand reference for an m x n access. BUF views are taken in rank buf_rank's
 * block and bounds-checked against the registration; user matrices against their shape. */
static tpf_status resolve(sim_ctx *c, const tpf_mref *r, int buf_rank, uint64_t m, uint64_t n,
                          const char *which, tpf_sim_view *out) {
  if (r->id == TPF_MAT_BUF) {
    size_t esz = tpf_dtype_size(c->sched->dtype);
    uint64_t first, last, start, len;
    if (r->ld < n || !tpf_mul_u64(r->row, r->ld, &first) || !tpf_add_u64(first, r->col, &first) ||
        !tpf_mul_u64(first, esz, &start) || !tpf_add_u64(start, r->off_bytes, &start) ||
        !tpf_mul_u64(m - 1, r->ld, &last) || !tpf_add_u64(last, n, &last) ||
        !tpf_mul_u64(last, esz, &len))
      return op_fail(c, TPF_EINVAL, "'%s' rank %d step %d: operand %s has ld %llu < %llu columns",
                     comm_name(c), c->me, c->step_index, which, (unsigned long long)r->ld,
                     (unsigned long long)n);
    TPF_CHECK(span_check(c, which, start, len, c->sh->data_bytes));
    out->base = tpf_sim__data(c->sh, buf_rank) + start;
    out->ld = r->ld;
    out->dtype = c->sched->dtype;
    return TPF_OK;
  }
  const tpf_matrix *mat = r->id == TPF_MAT_X   ? &c->args->x
                          : r->id == TPF_MAT_W ? &c->args->w
                          : r->id == TPF_MAT_D ? &c->args->d
                                               : NULL;
  if (!mat || !mat->ptr)
    return op_fail(c, TPF_EINVAL, "'%s' rank %d step %d: operand %s names matrix %d, not given",
                   comm_name(c), c->me, c->step_index, which, (int)r->id);
  uint64_t ld = r->ld ? r->ld : mat->ld;
  if (r->ld == 0 && (r->row + m > mat->rows || r->col + n > mat->cols))
    return op_fail(c, TPF_EINVAL,
                   "'%s' rank %d step %d: operand %s [%llu+%llu, %llu+%llu] exceeds its matrix "
                   "[%llu, %llu]",
                   comm_name(c), c->me, c->step_index, which, (unsigned long long)r->row,
                   (unsigned long long)m, (unsigned long long)r->col, (unsigned long long)n,
                   (unsigned long long)mat->rows, (unsigned long long)mat->cols);
  out->base = (unsigned char *)mat->ptr + (r->row * ld + r->col) * tpf_dtype_size(mat->dtype);
  out->ld = ld;
  out->dtype = mat->dtype;
  return TPF_OK;
}

/* ---- steps ---- */

/* The step's epilogue (tpf_exec_args.epi) when the core flagged it. */
static tpf_sim_epi step_epi(const sim_ctx *c, const tpf_step *s) {
  tpf_sim_epi e;
  e.epi = (s->flags & TPF_STEP_EPILOGUE) ? &c->args->epi : NULL;
  e.bias_col = s->d.col;
  /* fp8 scales (host memory here): sa * sw in fp32, as cuBLASLt folds A/B_SCALE into alpha. */
  e.scale = (c->args->a_scale_inv ? *c->args->a_scale_inv : 1.0f) *
            (c->args->w_scale_inv ? *c->args->w_scale_inv : 1.0f);
  return e;
}

static tpf_status step_gemm(sim_ctx *c, const tpf_step *s) {
  tpf_sim_view a, wv, d;
  /* A transposed operand's stored block is [k, m] / [k, n]. */
  const bool ta = (s->flags & TPF_STEP_TRANS_A) != 0, tw = (s->flags & TPF_STEP_TRANS_W) != 0;
  TPF_CHECK(resolve(c, &s->a, c->me, ta ? s->k : s->m, ta ? s->m : s->k, "a", &a));
  TPF_CHECK(resolve(c, &s->w, c->me, tw ? s->k : s->n, tw ? s->n : s->k, "w", &wv));
  TPF_CHECK(resolve(c, &s->d, c->me, s->m, s->n, "d", &d));
  tpf_sim_epi e = step_epi(c, s);
  tpf_status st = tpf_sim__gemm(&c->wk->scratch, a, wv, d, s->m, s->n, s->k, s->flags, &e);
  if (st != TPF_OK)
    return op_fail(c, st, "'%s' rank %d step %d: %s", comm_name(c), c->me, c->step_index,
                   tpf_last_error());
  c->flops = 2ull * s->m * s->n * s->k;
  return TPF_OK;
}

static tpf_status check_peer(sim_ctx *c, const tpf_step *s) {
  if (s->peer < 0 || s->peer >= c->sched->tp_size || s->peer == c->me || s->tag >= TPF_MAX_TAGS)
    return op_fail(c, TPF_EINVAL, "'%s' rank %d step %d: peer %d or tag %u invalid", comm_name(c),
                   c->me, c->step_index, (int)s->peer, (unsigned)s->tag);
  return TPF_OK;
}

static tpf_status step_send(sim_ctx *c, const tpf_step *s) {
  TPF_CHECK(check_peer(c, s));
  TPF_CHECK(span_check(c, "SEND source", s->src_off, s->bytes, c->sh->data_bytes));
  TPF_CHECK(span_check(c, "SEND destination", s->dst_off, s->bytes, c->sh->data_bytes));
  /* The copy engine: straight into the peer's block, then the flag (release). */
  memcpy(tpf_sim__data(c->sh, s->peer) + s->dst_off, tpf_sim__data(c->sh, c->me) + s->src_off,
         (size_t)s->bytes);
  raise_flag(c, s->peer, s->tag);
  c->moved = s->bytes;
  return TPF_OK;
}

static tpf_status step_recv(sim_ctx *c, const tpf_step *s) {
  TPF_CHECK(check_peer(c, s));
  sim_pred p = {tpf_sim__flag(c->sh, c->me, s->peer, s->tag), c->args->seq, false};
  tpf_status st = wait_pred(c, &p, tpf_sim__now_ns());
  if (st == TPF_ETIMEOUT)
    return op_fail(c, st,
                   "timeout after %u ms: rank %d, step %d (RECV chunk %d, tag %u) of '%s' "
                   "operation %llu waits for rank %d (its flag is at %llu)",
                   c->waited_ms, c->me, c->step_index, (int)s->chunk, (unsigned)s->tag,
                   comm_name(c), (unsigned long long)c->args->seq, (int)s->peer,
                   (unsigned long long)atomic_load(p.word));
  return st;
}

static tpf_status step_barrier(sim_ctx *c, const tpf_step *s) {
  int P = c->sched->tp_size;
  if (s->tag >= TPF_MAX_TAGS)
    return op_fail(c, TPF_EINVAL, "'%s' rank %d step %d: tag %u invalid", comm_name(c), c->me,
                   c->step_index, (unsigned)s->tag);
  for (int q = 0; q < P; q++)
    if (q != c->me) raise_flag(c, q, s->tag);
  uint64_t start = tpf_sim__now_ns();
  for (int q = 0; q < P; q++) {
    if (q == c->me) continue;
    sim_pred p = {tpf_sim__flag(c->sh, c->me, q, s->tag), c->args->seq, false};
    tpf_status st = wait_pred(c, &p, start);
    if (st == TPF_ETIMEOUT)
      return op_fail(c, st,
                     "timeout after %u ms: rank %d, step %d (BARRIER tag %u) of '%s' operation "
                     "%llu waits for rank %d (its flag is at %llu)",
                     c->waited_ms, c->me, c->step_index, (unsigned)s->tag, comm_name(c),
                     (unsigned long long)c->args->seq, q, (unsigned long long)atomic_load(p.word));
    if (st != TPF_OK) return st;
  }
  return TPF_OK;
}

static tpf_status step_handshake(sim_ctx *c) {
  int P = c->sched->tp_size;
  uint64_t seq = c->args->seq, rows = c->sched->rows;
  uint64_t word = TPF_READY_WORD(seq, c->sched->op_key, rows);
  for (int q = 0; q < P; q++) {
    if (q == c->me) continue;
    atomic_store_explicit(tpf_sim__ready(c->sh, q, c->me, seq), word, memory_order_release);
    tpf_sim__ring(c->w, c->sh, q);
  }
  uint64_t start = tpf_sim__now_ns();
  for (int q = 0; q < P; q++) {
    if (q == c->me) continue;
    sim_pred p = {tpf_sim__ready(c->sh, c->me, q, seq), seq, true};
    tpf_status st = wait_pred(c, &p, start);
    uint64_t got = atomic_load_explicit(p.word, memory_order_acquire);
    if (st == TPF_ETIMEOUT)
      return op_fail(c, st,
                     "timeout after %u ms: rank %d, step %d (HANDSHAKE) of '%s' operation %llu "
                     "waits for rank %d (its last operation announced is %llu)",
                     c->waited_ms, c->me, c->step_index, comm_name(c), (unsigned long long)seq, q,
                     (unsigned long long)TPF_READY_SEQ(got));
    if (st != TPF_OK) return st;
    if (TPF_READY_SEQ(got) != (seq & TPF_READY_SEQ_MASK))
      return op_fail(c, TPF_EMISMATCH,
                     "ranks disagree on the operation sequence of '%s': rank %d is at operation "
                     "%llu, rank %d already announced %llu",
                     comm_name(c), c->me, (unsigned long long)seq, q,
                     (unsigned long long)TPF_READY_SEQ(got));
    if (TPF_READY_ROWS(got) != TPF_READY_ROWS(word))
      return op_fail(c, TPF_EMISMATCH,
                     "active shapes differ on '%s' operation %llu: rank %d has [%llu, %llu], "
                     "rank %d has [%llu, %llu]",
                     comm_name(c), (unsigned long long)seq, c->me, (unsigned long long)rows,
                     (unsigned long long)c->sched->cols, q, (unsigned long long)TPF_READY_ROWS(got),
                     (unsigned long long)c->sched->cols);
    if (TPF_READY_KEY(got) != TPF_READY_KEY(word)) {
      char mine[40], theirs[40];
      return op_fail(c, TPF_EMISMATCH,
                     "operations differ on '%s' operation %llu (active rows %llu): rank %d runs "
                     "%s, rank %d runs %s",
                     comm_name(c), (unsigned long long)seq, (unsigned long long)rows, c->me,
                     tpf_op_key_name(c->sched->op_key, mine, sizeof mine), q,
                     tpf_op_key_name((uint8_t)TPF_READY_KEY(got), theirs, sizeof theirs));
    }
  }
  return TPF_OK;
}

static tpf_status step_reduce(sim_ctx *c, const tpf_step *s, bool peers) {
  int P = c->sched->tp_size;
  tpf_sim_view src[TPF_MAX_RANKS], d;
  if (s->count == 0 || s->count > TPF_MAX_RANKS || (peers && s->count > (uint32_t)P))
    return op_fail(c, TPF_EINVAL, "'%s' rank %d step %d: reduction count %u invalid", comm_name(c),
                   c->me, c->step_index, (unsigned)s->count);
  size_t esz = tpf_dtype_size(c->sched->dtype);
  for (uint32_t t = 0; t < s->count; t++) {
    tpf_mref r = s->a;
    int owner = c->me;
    if (peers) {
      owner = (c->me + (int)t) % P;
    } else {
      uint64_t shift;
      if (!tpf_mul_u64(t, s->stride_bytes, &shift) ||
          !tpf_add_u64(r.off_bytes, shift, &r.off_bytes))
        return op_fail(c, TPF_EOVERFLOW, "'%s' rank %d step %d: reduction stride overflows",
                       comm_name(c), c->me, c->step_index);
    }
    TPF_CHECK(resolve(c, &r, owner, s->m, s->n, "a", &src[t]));
    if (owner != c->me) c->moved += s->m * s->n * esz;
  }
  TPF_CHECK(resolve(c, &s->d, c->me, s->m, s->n, "d", &d));
  tpf_sim_epi e = step_epi(c, s);
  tpf_status st = tpf_sim__reduce(&c->wk->scratch, src, s->count, d, s->m, s->n, &e);
  if (st != TPF_OK)
    return op_fail(c, st, "'%s' rank %d step %d: %s", comm_name(c), c->me, c->step_index,
                   tpf_last_error());
  return TPF_OK;
}

static tpf_status run_step(sim_ctx *c, const tpf_step *s) {
  switch (s->kind) {
  case TPF_STEP_HANDSHAKE:
    return step_handshake(c);
  case TPF_STEP_GEMM:
    return step_gemm(c, s);
  case TPF_STEP_SEND:
    return step_send(c, s);
  case TPF_STEP_RECV:
    return step_recv(c, s);
  case TPF_STEP_REDUCE:
    return step_reduce(c, s, false);
  case TPF_STEP_PEER_REDUCE:
    return step_reduce(c, s, true);
  case TPF_STEP_BARRIER:
    return step_barrier(c, s);
  default:
    return op_fail(c, TPF_EINVAL, "'%s' rank %d step %d: unknown step kind %d", comm_name(c), c->me,
                   c->step_index, (int)s->kind);
  }
}

/* Waits until step `dep` of this rank has finished. The awaited step's own waits are bounded and
 * a failure anywhere in the operation fails it and wakes this wait, so this is only a net against
 * a step that can never finish: it fires when no cross-rank wait of the operation is in progress
 * and nothing progressed (no step finished, no such wait ended) for two bounds in force, and says
 * so in the timeout contract's form (this rank is the one awaited). */
static tpf_status wait_dep(sim_ctx *c, int dep) {
  tpf_status st = TPF_OK;
  unsigned bound = 0;
  uint64_t since = 0;
  pthread_mutex_lock(&c->op->mu);
  while (!c->op->done[dep]) {
    if (atomic_load(&c->op->failed)) {
      st = TPF_ESTATE;
      break;
    }
    bound = tpf_sim__timeout_ms(c->w);
    since = atomic_load(&c->op->progress_ns);
    uint64_t now = tpf_sim__now_ns();
    if (atomic_load(&c->op->cross_waits) == 0 && now > since &&
        now - since >= 2ull * bound * 1000000ull) {
      st = TPF_ETIMEOUT;
      break;
    }
    struct timespec ts = mono_ts(now + TPF_SIM_POLL_NS);
    pthread_cond_timedwait(&c->op->cv, &c->op->mu, &ts);
  }
  pthread_mutex_unlock(&c->op->mu);
  if (st == TPF_ETIMEOUT)
    return op_fail(c, st,
                   "timeout after %u ms: rank %d, step %d (after step %d, %s) of '%s' operation "
                   "%llu waits for rank %d (itself: nothing of the operation progressed for "
                   "two bounds of %u ms)",
                   2u * bound, c->me, c->step_index, dep,
                   tpf_step_kind_name(c->sched->steps[dep].kind), comm_name(c),
                   (unsigned long long)c->args->seq, c->me, bound);
  return st;
}

static void random_delay(tpf_sim_worker *wk, unsigned max_us) {
  if (max_us == 0) return;
  uint64_t z = (wk->rng += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  uint64_t us = z % ((uint64_t)max_us + 1);
  if (us == 0) return;
  struct timespec ts = {(time_t)(us / 1000000u), (long)(us % 1000000u) * 1000L};
  nanosleep(&ts, NULL);
}

static void run_stream(tpf_sim_worker *wk, tpf_sim_op *op) {
  tpf_sim_rank *rk = wk->rank;
  sim_ctx c;
  memset(&c, 0, sizeof c);
  c.wk = wk;
  c.rk = rk;
  c.w = rk->world;
  c.op = op;
  c.sched = op->sched;
  c.args = op->args;
  c.sh = op->reg->sh;
  c.me = rk->rank;
  for (int i = 0; i < c.sched->nsteps; i++) {
    const tpf_step *s = &c.sched->steps[i];
    if (s->stream != wk->stream) continue;
    if (atomic_load(&op->failed)) return;
    c.step_index = i;
    for (int j = 0; j < s->ndeps; j++)
      if (wait_dep(&c, s->deps[j]) != TPF_OK) return;
    random_delay(wk, c.w->max_delay_us);
    if (op->fault_step_base != 0 && tpf_sim__fault_fires(c.w, op->fault_step_base + (uint64_t)i)) {
      op_fail(&c,
              c.w->fault.base.fail_status != TPF_OK ? c.w->fault.base.fail_status : TPF_EBACKEND,
              "injected fault: backend call %llu (step %d %s on rank %d) of '%s' operation %llu "
              "fails%s",
              (unsigned long long)(op->fault_step_base + (uint64_t)i), i,
              tpf_step_kind_name(s->kind), c.me, comm_name(&c), (unsigned long long)c.args->seq,
              c.w->fault.fail_persistent ? " (persistent)" : "");
      return;
    }
    c.moved = 0;
    c.flops = 0;
    uint64_t t0 = tpf_sim__now_ns();
    if (run_step(&c, s) != TPF_OK) return;
    uint64_t t1 = tpf_sim__now_ns();
    atomic_fetch_add(&c.w->steps, 1);
    if (c.moved) atomic_fetch_add(&c.w->bytes_moved, c.moved);
    if (c.flops) atomic_fetch_add(&c.w->flops, c.flops);
    if (c.w->trace_fn) {
      tpf_sim_trace_event ev;
      ev.rank = c.me;
      ev.stream = s->stream;
      ev.step = i;
      ev.kind = s->kind;
      ev.peer = s->peer;
      ev.chunk = s->chunk;
      ev.tag = s->tag;
      ev.comm = comm_name(&c);
      ev.seq = c.args->seq;
      ev.bytes = c.moved;
      ev.flops = c.flops;
      ev.t0_ns = t0 - c.w->t0_ns;
      ev.t1_ns = t1 - c.w->t0_ns;
      c.w->trace_fn(c.w->trace_ctx, &ev);
    }
    pthread_mutex_lock(&op->mu);
    op->done[i] = 1;
    atomic_store(&op->progress_ns, tpf_sim__now_ns());
    pthread_cond_broadcast(&op->cv);
    pthread_mutex_unlock(&op->mu);
  }
}

void *tpf_sim__worker_main(void *arg) {
  tpf_sim_worker *wk = arg;
  tpf_sim_rank *rk = wk->rank;
  uint64_t seen = 0;
  for (;;) {
    pthread_mutex_lock(&rk->mu);
    while (rk->job_gen == seen && !rk->shutdown)
      pthread_cond_wait(&rk->cv, &rk->mu);
    if (rk->shutdown) {
      pthread_mutex_unlock(&rk->mu);
      return NULL;
    }
    seen = rk->job_gen;
    tpf_sim_op *op = rk->job;
    pthread_mutex_unlock(&rk->mu);

    run_stream(wk, op);

    pthread_mutex_lock(&op->mu);
    if (--op->workers_left == 0) pthread_cond_broadcast(&op->cv);
    pthread_mutex_unlock(&op->mu);
  }
}

/* Structural pre-check: what the workers rely on to never deadlock or index out of range. */
/* The core validated the schedule's structure and every byte range before calling
 * (core/exec_check.c); what is left is this backend's own question: is it for this rank. */
static tpf_status precheck(const tpf_sim_rank *rk, const tpf_exec_args *a) {
  const tpf_schedule *s = a->sched;
  if (s->tp_size != rk->hdr.tp_size || s->rank != rk->rank)
    return tpf_set_error(
        TPF_EINVAL, "sim execute '%s': schedule is for rank %d of %d, backend is rank %d of %d",
        a->comm_name ? a->comm_name : "?", s->rank, s->tp_size, rk->rank, rk->hdr.tp_size);
  return TPF_OK;
}

static tpf_status execute_held(tpf_sim_rank *rk, tpf_reg *reg, const tpf_exec_args *a) {
  tpf_sim_reg *h = (tpf_sim_reg *)reg;
  uint64_t step_base = 0;
  uint64_t nsteps = a && a->sched && a->sched->nsteps > 0 ? (uint64_t)a->sched->nsteps : 0;
  TPF_CHECK(tpf_sim__fault_enter(rk->world, "execute", rk->rank, nsteps, &step_base));
  if (!h || !a || !a->sched)
    return tpf_set_error(TPF_EINVAL, "sim execute: NULL %s", !h ? "registration" : "arguments");
  TPF_CHECK(precheck(rk, a));

  tpf_sim_op op;
  memset(&op, 0, sizeof op);
  op.sched = a->sched;
  op.args = a;
  op.reg = h;
  op.workers_left = TPF_NUM_STREAMS;
  op.fault_step_base = step_base;
  atomic_init(&op.failed, 0);
  /* The rank's own flag array (no allocation per operation): only one operation of a rank runs
   * at a time, and its workers have all let go of the previous one. */
  op.done = rk->done;
  memset(op.done, 0, (size_t)a->sched->nsteps + 1);
  pthread_mutex_init(&op.mu, NULL);
  tpf_sim__cond_init_mono(&op.cv);
  atomic_init(&op.progress_ns, tpf_sim__now_ns());
  atomic_init(&op.cross_waits, 0);

  /* The job slot holds one operation: a second one while it is taken would overwrite it and
   * leave this one's caller waiting for workers that never ran it. tpf_sim__enter already keeps
   * a second thread out; this is the slot's own check. */
  pthread_mutex_lock(&rk->mu);
  if (rk->job != NULL) {
    pthread_mutex_unlock(&rk->mu);
    pthread_cond_destroy(&op.cv);
    pthread_mutex_destroy(&op.mu);
    return tpf_set_error(TPF_ESTATE,
                         "simulator rank %d: '%s' operation %llu submitted while operation %llu "
                         "of '%s' still runs; one thread per rank at a time",
                         rk->rank, a->comm_name ? a->comm_name : "?", (unsigned long long)a->seq,
                         (unsigned long long)rk->job->args->seq,
                         rk->job->args->comm_name ? rk->job->args->comm_name : "?");
  }
  rk->job = &op;
  rk->job_gen++;
  pthread_cond_broadcast(&rk->cv);
  pthread_mutex_unlock(&rk->mu);

  /* Bounded: every wait of a worker ends at its bound and a failure stops them all. The net
   * fails the operation when nothing progressed for three bounds with no cross-rank wait in
   * progress (as wait_dep's), and then still waits
   * for the workers to let go of op (it lives on this stack); they stop at their next wakeup. */
  pthread_mutex_lock(&op.mu);
  while (op.workers_left > 0) {
    unsigned bound = tpf_sim__timeout_ms(rk->world);
    uint64_t now = tpf_sim__now_ns();
    uint64_t since = atomic_load(&op.progress_ns);
    if (!atomic_load(&op.failed) && atomic_load(&op.cross_waits) == 0 && now > since &&
        now - since >= 3ull * bound * 1000000ull) {
      op.status = TPF_ETIMEOUT;
      snprintf(op.msg, sizeof op.msg,
               "timeout after %u ms: rank %d, operation %llu of '%s' (nothing progressed for three "
               "bounds of %u ms) waits for rank %d (itself: its stream workers)",
               3u * bound, rk->rank, (unsigned long long)a->seq,
               a->comm_name ? a->comm_name : h->sh->name, bound, rk->rank);
      atomic_store(&op.failed, 1);
      pthread_cond_broadcast(&op.cv);
      pthread_mutex_unlock(&op.mu);
      tpf_sim__ring(rk->world, h->sh, rk->rank);
      pthread_mutex_lock(&op.mu);
      continue;
    }
    struct timespec ts = mono_ts(now + TPF_SIM_POLL_NS);
    pthread_cond_timedwait(&op.cv, &op.mu, &ts);
  }
  pthread_mutex_unlock(&op.mu);
  pthread_mutex_lock(&rk->mu);
  rk->job = NULL;
  pthread_mutex_unlock(&rk->mu);
  /* A signal held back for reordering with no later raise to follow goes out now: held
   * forever it would be a lost signal, which is a different fault. */
  pthread_mutex_lock(&rk->fault_mu);
  if (rk->held_reorder.on) {
    rk->held_reorder.on = false;
    store_flag(rk->world, rk->held_reorder.sh, rk->held_reorder.receiver, rk->rank,
               rk->held_reorder.tag, rk->held_reorder.seq);
  }
  pthread_mutex_unlock(&rk->fault_mu);

  atomic_fetch_add(&rk->world->ops, 1);
  tpf_status st = TPF_OK;
  if (atomic_load(&op.failed))
    st = tpf_set_error(op.status, "%s", op.msg);
  else
    st = tpf_sim__canary_verify(h, a->comm_name,
                                a->sched->cols * (uint64_t)tpf_dtype_size(a->sched->dtype));
  pthread_cond_destroy(&op.cv);
  pthread_mutex_destroy(&op.mu);
  if (st != TPF_OK && st != TPF_EMISMATCH && h->deferred == TPF_OK) h->deferred = st;
  return st;
}

tpf_status tpf_sim__execute(tpf_backend *be, tpf_reg *reg, const tpf_exec_args *a, void *stream) {
  tpf_sim_rank *rk = (tpf_sim_rank *)be;
  (void)stream; /* the simulator completes every operation before returning */
  TPF_CHECK(tpf_sim__enter(rk, "execute"));
  tpf_status st = execute_held(rk, reg, a);
  tpf_sim__leave(rk);
  return st;
}

/* The simulator completes every operation inside execute: nothing is left to wait for, and the
 * deferred status is what the handle's operations already reported. */
tpf_status tpf_sim__reg_sync(tpf_backend *be, tpf_reg *reg) {
  (void)be;
  tpf_sim_reg *h = (tpf_sim_reg *)reg;
  if (!h) return tpf_set_error(TPF_EINVAL, "sim reg_sync: NULL registration");
  if (h->deferred != TPF_OK)
    return tpf_set_error(h->deferred, "sim: an operation on '%s' failed earlier (%s)", h->sh->name,
                         tpf_status_name(h->deferred));
  return TPF_OK;
}

tpf_status tpf_sim__reg_async_error(tpf_backend *be, tpf_reg *reg, tpf_status *out) {
  (void)be;
  tpf_sim_reg *h = (tpf_sim_reg *)reg;
  if (!h || !out) return tpf_set_error(TPF_EINVAL, "sim reg_async_error: NULL argument");
  *out = h->deferred;
  return TPF_OK;
}

/* Thread-safe: an atomic store and a doorbell, so a rank blocked in a wait on this handle sees
 * it within one wakeup. */
tpf_status tpf_sim__reg_abort(tpf_backend *be, tpf_reg *reg) {
  tpf_sim_rank *rk = (tpf_sim_rank *)be;
  tpf_sim_reg *h = (tpf_sim_reg *)reg;
  if (!h) return tpf_set_error(TPF_EINVAL, "sim reg_abort: NULL registration");
  atomic_store(&h->aborted, 1);
  tpf_sim__ring(rk->world, h->sh, rk->rank);
  /* A step waiting on another step of its own operation waits on the operation's condition
   * variable; the aborted wait above fails the operation, which broadcasts it. */
  return TPF_OK;
}

tpf_status tpf_sim__sync(tpf_backend *be, void *stream) {
  tpf_sim_rank *rk = (tpf_sim_rank *)be;
  (void)stream; /* nothing is ever left in flight */
  TPF_CHECK(tpf_sim__enter(rk, "sync"));
  tpf_status st = tpf_sim__fault_call(rk->world, "sync", rk->rank);
  tpf_sim__leave(rk);
  return st;
}
