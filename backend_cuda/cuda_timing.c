/* Device timing of operations while profiling is on (SPEC §16): exposed and hidden communication
 * per registration, read lazily from CUDA events, never with a sync.
 *
 * Method: with profiling on (tpf_cuda_profile_enabled), execute records a timing event at the
 * operation's start on the caller's stream (before the fork), one before and one after every
 * GEMM and communication step (SEND, REDUCE, PEER_REDUCE) on the step's stream, and one after the
 * join. The events of an operation fill one of TPF_CUDA_TSLOTS slots of its registration; a slot
 * is read when its end event has completed (cudaEventQuery, never a wait) at the next timed
 * operation or when the counters are read. Times are offsets from the start event
 * (cudaEventElapsedTime); per operation: op = end - start; gemm = the length of the union of its
 * GEMM intervals; comm = that of its communication intervals; exposed = op - gemm (the time the
 * operation's GEMMs did not cover); hidden = comm + gemm - union(all): communication that ran
 * while a GEMM ran. An operation finding every slot pending, under CUDA-graph capture, or
 * meeting an event error is counted untimed; timing never fails an operation. Off, it costs one
 * relaxed atomic load per operation and per step.
 */
#define _POSIX_C_SOURCE 200809L
#include "cuda_state.h"

#include "tpflex/tpflex_backend_support.h"

#include <math.h>
#include <string.h>

#define TPF_CUDA_TSLOTS 16 /* operations in flight per registration that can be timed */

typedef struct {
  cudaEvent_t *ev; /* [0] start, [1] end, then [2 + 2j], [3 + 2j]: timed step j's before/after */
  uint8_t *kind;   /* per timed step: 1 GEMM, 2 communication */
  int cap;         /* timed steps the created events cover */
  int nev;         /* events created */
  int nalloc;      /* entries of ev allocated (kind: nalloc / 2 - 1) */
  int n;           /* timed steps recorded */
  bool pending;    /* recorded, not read yet */
} tslot;

struct tpf_cuda_timing {
  tslot slot[TPF_CUDA_TSLOTS];
  int cur;  /* the slot of the operation being enqueued, -1: none */
  int next; /* the slot the next operation takes */
  tpf_cuda_comm_timing acc;
};

static int timed_kind(int kind) {
  if (kind == TPF_STEP_GEMM) return 1;
  if (kind == TPF_STEP_SEND || kind == TPF_STEP_REDUCE || kind == TPF_STEP_PEER_REDUCE) return 2;
  return 0;
}

/* Length of the union of n intervals [lo[i], hi[i]] (sorted here by lo). */
static double union_len(double *lo, double *hi, int n) {
  for (int i = 1; i < n; i++) /* insertion sort: a schedule has tens of steps */
    for (int j = i; j > 0 && lo[j] < lo[j - 1]; j--) {
      double t = lo[j];
      lo[j] = lo[j - 1];
      lo[j - 1] = t;
      t = hi[j];
      hi[j] = hi[j - 1];
      hi[j - 1] = t;
    }
  double len = 0, a = 0, z = -1;
  for (int i = 0; i < n; i++) {
    if (lo[i] > z) {
      if (z > a) len += z - a;
      a = lo[i];
      z = hi[i];
    } else if (hi[i] > z) {
      z = hi[i];
    }
  }
  if (z > a) len += z - a;
  return len;
}

/* Milliseconds from ev0 to ev as microseconds; NAN on an error. */
static double since_us(cudaEvent_t ev0, cudaEvent_t ev) {
  float ms = 0;
  if (cudaEventElapsedTime(&ms, ev0, ev) != cudaSuccess) {
    (void)cudaGetLastError();
    return NAN;
  }
  return 1000.0 * (double)ms;
}

/* Adds slot s's operation to acc; false when its times cannot be read. */
static bool account(tpf_cuda_comm_timing *acc, const tslot *s) {
  enum { MAXI = 512 };
  double glo[MAXI], ghi[MAXI], clo[MAXI], chi[MAXI], alo[2 * MAXI], ahi[2 * MAXI];
  int ng = 0, nc = 0, na = 0;
  const double op = since_us(s->ev[0], s->ev[1]);
  if (isnan(op)) return false;
  for (int j = 0; j < s->n && j < MAXI; j++) {
    const double lo = since_us(s->ev[0], s->ev[2 + 2 * j]),
                 hi = since_us(s->ev[0], s->ev[3 + 2 * j]);
    if (isnan(lo) || isnan(hi)) return false;
    if (s->kind[j] == 1) {
      glo[ng] = lo;
      ghi[ng++] = hi;
    } else {
      clo[nc] = lo;
      chi[nc++] = hi;
    }
    alo[na] = lo;
    ahi[na++] = hi;
  }
  const double g = union_len(glo, ghi, ng), c = union_len(clo, chi, nc),
               all = union_len(alo, ahi, na);
  acc->timed_ops++;
  acc->op_us += op;
  acc->gemm_us += g;
  acc->comm_us += c;
  acc->exposed_us += op > g ? op - g : 0;
  acc->hidden_us += c + g - all > 0 ? c + g - all : 0;
  return true;
}

/* Reads every slot whose end event completed (no wait). */
static void drain(tpf_cuda_timing *t) {
  t->acc.pending_ops = 0;
  for (int i = 0; i < TPF_CUDA_TSLOTS; i++) {
    tslot *s = &t->slot[i];
    if (!s->pending) continue;
    const cudaError_t q = cudaEventQuery(s->ev[1]);
    if (q == cudaErrorNotReady) {
      t->acc.pending_ops++;
      continue;
    }
    if (q != cudaSuccess || !account(&t->acc, s)) {
      (void)cudaGetLastError();
      t->acc.untimed_ops++;
    }
    s->pending = false;
  }
}

/* Grows slot s to hold n timed steps (events created with timing). A failure keeps what was
 * created (nev counts it), so a later call goes on from there. */
static bool grow(tslot *s, int n) {
  const int need = 2 + 2 * n;
  if (s->nev >= need) return true;
  if (need > s->nalloc) {
    cudaEvent_t *ev = tpf_realloc(s->ev, (size_t)need * sizeof *ev);
    if (!ev) return false;
    s->ev = ev;
    uint8_t *kind = tpf_realloc(s->kind, (size_t)n);
    if (!kind) return false;
    s->kind = kind;
    s->nalloc = need;
  }
  for (; s->nev < need; s->nev++)
    if (cudaEventCreate(&s->ev[s->nev]) != cudaSuccess) {
      (void)cudaGetLastError();
      s->cap = s->nev >= 2 ? (s->nev - 2) / 2 : 0;
      return false;
    }
  s->cap = n;
  return true;
}

void tpf_cuda__timing_begin(tpf_cuda_backend *b, tpf_reg *r, const tpf_exec_args *a,
                            cudaStream_t user) {
  if (r->timing) r->timing->cur = -1;
  if (!tpf_cuda_profile_enabled()) return;
  if (!r->timing) {
    r->timing = tpf_calloc(1, sizeof *r->timing);
    if (!r->timing) return;
    r->timing->cur = -1;
    r->next_timed = b->timed_regs;
    b->timed_regs = r;
  }
  tpf_cuda_timing *t = r->timing;
  drain(t);
  tslot *s = &t->slot[t->next];
  int steps = 0;
  for (int i = 0; i < a->sched->nsteps; i++)
    steps += timed_kind(a->sched->steps[i].kind) != 0;
  enum cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
  const bool capturing = cudaStreamIsCapturing(user, &cap) != cudaSuccess ||
                         cap != cudaStreamCaptureStatusNone; /* execute sets b->capturing later */
  if (capturing || s->pending || !grow(s, steps > 0 ? steps : 1) ||
      cudaEventRecord(s->ev[0], user) != cudaSuccess) {
    (void)cudaGetLastError();
    t->acc.untimed_ops++;
    return;
  }
  s->n = 0;
  t->cur = t->next;
  t->next = (t->next + 1) % TPF_CUDA_TSLOTS;
}

void tpf_cuda__timing_step(tpf_reg *r, const tpf_step *st, cudaStream_t s, bool after) {
  tpf_cuda_timing *t = r->timing;
  if (!t || t->cur < 0) return;
  const int k = timed_kind(st->kind);
  if (!k) return;
  tslot *sl = &t->slot[t->cur];
  if (sl->n >= sl->cap) return; /* not counted at begin: cannot happen */
  if (cudaEventRecord(sl->ev[(after ? 3 : 2) + 2 * sl->n], s) != cudaSuccess) {
    (void)cudaGetLastError();
    t->cur = -1; /* this operation stays untimed */
    t->acc.untimed_ops++;
    return;
  }
  if (after) sl->kind[sl->n++] = (uint8_t)k;
}

void tpf_cuda__timing_end(tpf_reg *r, cudaStream_t user, tpf_status rc) {
  tpf_cuda_timing *t = r->timing;
  if (!t || t->cur < 0) return;
  tslot *s = &t->slot[t->cur];
  t->cur = -1;
  if (rc != TPF_OK || cudaEventRecord(s->ev[1], user) != cudaSuccess) {
    (void)cudaGetLastError();
    t->acc.untimed_ops++;
    return;
  }
  s->pending = true;
}

void tpf_cuda__timing_read(tpf_reg *r, tpf_cuda_comm_timing *out, bool reset) {
  memset(out, 0, sizeof *out);
  if (!r->timing) return;
  drain(r->timing);
  *out = r->timing->acc;
  if (reset) {
    memset(&r->timing->acc, 0, sizeof r->timing->acc);
    for (int i = 0; i < TPF_CUDA_TSLOTS; i++)
      r->timing->slot[i].pending = false; /* recorded before the reset: not counted after it */
  }
}

void tpf_cuda__timing_free(tpf_cuda_backend *b, tpf_reg *r) {
  if (!r->timing) return;
  for (tpf_reg **p = &b->timed_regs; *p; p = &(*p)->next_timed)
    if (*p == r) {
      *p = r->next_timed;
      break;
    }
  for (int i = 0; i < TPF_CUDA_TSLOTS; i++) {
    tslot *s = &r->timing->slot[i];
    for (int k = 0; k < s->nev; k++)
      cudaEventDestroy(s->ev[k]);
    tpf_free(s->ev);
    tpf_free(s->kind);
  }
  tpf_free(r->timing);
  r->timing = NULL;
  (void)cudaGetLastError();
}
