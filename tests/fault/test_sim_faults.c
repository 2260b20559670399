/* Fault injection on the simulator (SQLite's test VFS, "fail the k-th operation").
 *
 * Method: one case is one fresh world of P ranks running the same script on every rank: create
 * a communicator (capacity 3P rows), set the active shape to 2P rows, run the operation, set P
 * rows, run it again, and, if the communicator failed, check that it refuses work; then destroy.
 * A case faults one rank f (tpf_sim_fault_ex.rank_mask) in one mode. A fault-free run per (kind, P,
 * f) reads from tpf_sim_get_fault_report how many backend calls, entries and signals the script
 * makes on f; the loops then run one case per k = 1..count (f rotates with k). The script reacts
 * as a careful user would: a failed set_active_shape is retried once, and a rank whose retry
 * fails too gives up (destroys its communicator and leaves), which its peers must see as a rank
 * that never arrives.
 *
 * Modes: fail-kth-call transient and persistent (every step of an executed schedule is a call,
 * numbered at execute entry, so a loop covers every step of every operation), drop / delay /
 * duplicate (at once and late, in a later operation) / reorder the k-th signal, a rank that
 * arrives past the timeout at its k-th entry, and a rank that never arrives (at the
 * registration, or at either operation).
 *
 * Every case asserts (fk_check): statuses are clean and in the set the mode allows; TPF_EBACKEND
 * only where a fault was injected (or, at the registration rendezvous, on peers of the rank that
 * failed); every TPF_ETIMEOUT message names the waiting rank, the step (or registration) and the
 * awaited peer; after an operation fails (anything but TPF_EMISMATCH) the communicator refuses
 * set_active_shape and operations with TPF_ESTATE; an operation succeeds on one rank only if
 * every rank reached it; every successful operation's result is exactly right (small integers,
 * so fp32 sums are exact) and no byte beyond the active layout changed in any operation; signal
 * faults that lose nothing (delay below the timeout, duplicate, reorder) change nothing at all;
 * the world holds no registration, arena byte or rendezvous afterwards; no wait ran out the
 * generous bound (the case ends well within it). After each loop the core's live allocation count
 * is back to its baseline.
 *
 * Cases run concurrently (TPF_FAULT_JOBS worlds at a time, default 12, 4 under TSan): most cases
 * wait out the 200 ms fault timeout, and the waits sleep; every other wait has a generous bound
 * (TIMEOUT_MS below), so the machine's load decides no verdict. A pool thread keeps its world for
 * the next case when the case left it clean, so worlds are also checked to stay usable after
 * faults. */
#define _POSIX_C_SOURCE 200809L
#include "tpf_test.h"

#include "tpflex/tpflex_sim.h"

#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

enum { H = 16, K = 8, N = 8, NOPS = 2, FK_MSG = 400, MAXP = 4 };
/* Timing never decides a verdict: every wait that must not expire has the generous
 * bound GENEROUS_MS, which no load makes a healthy wait reach. The short bound TIMEOUT_MS applies
 * only once the case's fault has made waits expire on purpose: the simulator switches to it when
 * a lossy fault fires (tpf_sim_set_fault_timeout: a failed call, a lost signal, a late entry),
 * and an absent rank lowers the world's timeout itself, once every other rank has reached the
 * call where it waits for the absent one (so no wait between live ranks is left to expire). */
#define TIMEOUT_MS 200u
#define GENEROUS_MS 60000u
#define LATE_MS (TIMEOUT_MS + 100u)
#define DELAY_US 5000u

typedef struct {
  const char *label;
  tpf_algo algo;
  tpf_coll coll;
  bool aggregate;
} fk_kind;

static const fk_kind kKinds[] = {
    {"ring-ag", TPF_ALGO_RING, TPF_COLL_AG, false},
    {"ring-ag-aggregate", TPF_ALGO_RING, TPF_COLL_AG, true},
    {"ring-rs", TPF_ALGO_RING, TPF_COLL_RS, false},
    {"pipeline-rs", TPF_ALGO_PIPELINE, TPF_COLL_RS, false},
    {"bulk-ag", TPF_ALGO_BULK, TPF_COLL_AG, false},
    {"bulk-rs", TPF_ALGO_BULK, TPF_COLL_RS, false},
};
#define NKINDS ((int)(sizeof kKinds / sizeof kKinds[0]))

typedef enum {
  M_NONE,
  M_FAIL,
  M_FAIL_PERSIST,
  M_DROP,
  M_DELAY,
  M_DUP,
  M_DUP_LATE,
  M_REORDER,
  M_LATE,
  M_ABSENT,
  M_COUNT
} fk_mode;

static const char *const kModeNames[M_COUNT] = {
    "none",       "fail-transient",  "fail-persistent", "drop-signal", "delay-signal",
    "dup-signal", "dup-late-signal", "reorder-signal",  "late-rank",   "absent-rank"};

typedef struct {
  tpf_status st;
  char msg[FK_MSG];
} fk_rec;

typedef struct {
  fk_rec create;
  bool created;
  fk_rec shape[NOPS][2]; /* first attempt, retry */
  bool retried[NOPS];
  bool attempted[NOPS]; /* called the operation */
  fk_rec op[NOPS];
  bool wrong[NOPS];
  char why[NOPS][FK_MSG];
  bool canary_bad[NOPS];
  bool refusal_checked;
  fk_rec refuse_shape, refuse_op;
  int gave_up_at; /* -1, or 0 (registration) / j+1 (operation j) where it left */
  fk_rec destroy;
} fk_rank;

typedef struct {
  int kind, P, f;
  fk_mode mode;
  uint64_t k;
  int absent_at;
  /* The absent rank's wait for the others (set up by fk_run_on): reached[a] counts the ranks that
   * reached point a (0: the creation, j + 1: operation j). */
  tpf_sim_world *world;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int reached[NOPS + 1];
  tpf_sim_fault_ex fault;
  fk_rank rk[MAXP];
  tpf_sim_fault_report rep;
  double secs;
  bool world_ok;
  uint64_t baseline_calls; /* for the fail modes: the script's calls on f (sync is the last) */
  bool pass;
  char verdict[1200];
} fk_case;

/* ---- helpers ---- */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void rec(fk_rec *r, tpf_status st) {
  r->st = st;
  snprintf(r->msg, sizeof r->msg, "%s", st == TPF_OK ? "" : tpf_last_error());
}

enum { ROLE_X = 1, ROLE_W, ROLE_A, ROLE_B, ROLE_PART };

/* Small integers in [-2, 2]: every product and sum below is exact in fp32. */
static float val(int role, int owner, uint64_t i, uint64_t j) {
  uint64_t h = (uint64_t)role * 0x9E3779B97F4A7C15ull ^
               (uint64_t)(owner + 1) * 0xC2B2AE3D27D4EB4Full ^ (i + 1) * 0x165667B19E3779F9ull ^
               (j + 7) * 0x27D4EB2F165667C5ull;
  h ^= h >> 29;
  h *= 0xBF58476D1CE4E5B9ull;
  h ^= h >> 32;
  return (float)((int)(h % 5u) - 2);
}

static float *fill(int role, int owner, uint64_t rows, uint64_t cols) {
  float *p = calloc((size_t)(rows * cols) + 1, sizeof *p);
  if (p)
    for (uint64_t i = 0; i < rows; i++)
      for (uint64_t j = 0; j < cols; j++)
        p[i * cols + j] = val(role, owner, i, j);
  return p;
}

static tpf_matrix mat(float *p, uint64_t rows, uint64_t cols) {
  tpf_matrix m = {p, rows, cols, cols, TPF_FP32};
  return m;
}

static void why(fk_rank *me, int j, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
static void why(fk_rank *me, int j, const char *fmt, ...) {
  if (me->wrong[j]) return;
  me->wrong[j] = true;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(me->why[j], sizeof me->why[j], fmt, ap);
  va_end(ap);
}

/* Compares got [rows, cols] (ld gld) with want(i, j) exactly. */
#define FK_EXPECT(me, j, what, got, gld, rows, cols, want_expr)                                    \
  do {                                                                                             \
    for (uint64_t i_ = 0; i_ < (rows) && !(me)->wrong[j]; i_++)                                    \
      for (uint64_t c_ = 0; c_ < (cols); c_++) {                                                   \
        uint64_t i = i_, col = c_;                                                                 \
        float w_ = (want_expr);                                                                    \
        float g_ = (got)[i * (gld) + col];                                                         \
        if (g_ != w_) {                                                                            \
          why(me, j, "%s (%llu, %llu) is %g, expected %g", what, (unsigned long long)i,            \
              (unsigned long long)col, (double)g_, (double)w_);                                    \
          break;                                                                                   \
        }                                                                                          \
      }                                                                                            \
  } while (0)

static float dot_xw(int rx, int ox, uint64_t i, int rw, int ow, uint64_t n, uint64_t kk) {
  float s = 0.0f;
  for (uint64_t t = 0; t < kk; t++)
    s += val(rx, ox, i, t) * val(rw, ow, n, t);
  return s;
}

/* Row `row`, column c of the sum over ranks of the bulk RS partials. */
static float part_sum(int P, uint64_t row, uint64_t c) {
  float s = 0.0f;
  for (int q = 0; q < P; q++)
    s += val(ROLE_PART, q, row, c);
  return s;
}

/* ---- the script of one rank ---- */

/* Runs operation j at T rows; prep: write this rank's input into the buffer (skipped once the
 * communicator failed: a peer may still be reading it). */
static void fk_op(fk_case *cs, tpf_comm *c, int rank, int j, uint64_t T, bool prep) {
  const fk_kind *kd = &kKinds[cs->kind];
  fk_rank *me = &cs->rk[rank];
  const int P = cs->P;
  const uint64_t R = T / (uint64_t)P;
  me->attempted[j] = true;

  /* The bytes beyond the current active layout, to compare after the operation whatever it
   * returned: no backend may write there, failed operations included. */
  void *base = NULL;
  uint64_t reg_bytes = 0, active_bytes = 0;
  tpf_comm_registration(c, &base, &reg_bytes);
  tpf_layout_desc desc;
  memset(&desc, 0, sizeof desc);
  desc.tp_size = P;
  desc.rank = rank;
  desc.algo = kd->algo;
  desc.coll = kd->coll;
  desc.dtype = TPF_FP32;
  desc.capacity.rows = 3u * (uint64_t)P;
  desc.capacity.cols = H;
  desc.active = tpf_comm_active_shape(c);
  desc.aggregate = kd->aggregate;
  if (tpf_layout_active_bytes(&desc, &active_bytes) != TPF_OK) active_bytes = reg_bytes;
  size_t tail = (size_t)(reg_bytes - active_bytes);
  unsigned char *snap = malloc(tail + 1);
  if (snap) memcpy(snap, (unsigned char *)base + active_bytes, tail);

  float *x = NULL, *w = NULL, *d = NULL, *a = NULL, *b = NULL;
  tpf_status st = TPF_ENOMEM;
  tpf_matrix loc, full;
  if (kd->algo == TPF_ALGO_RING && kd->coll == TPF_COLL_AG) {
    w = fill(ROLE_W, rank, N, H);
    d = calloc((size_t)(T * N), sizeof *d);
    if (w && d) {
      if (prep && tpf_comm_local_chunk(c, &loc) == TPF_OK)
        for (uint64_t i = 0; i < R; i++)
          for (uint64_t cc = 0; cc < H; cc++)
            ((float *)loc.ptr)[i * loc.ld + cc] = val(ROLE_X, 0, (uint64_t)rank * R + i, cc);
      tpf_matrix wm = mat(w, N, H), dm = mat(d, T, N);
      st = tpf_ag_gemm(c, &wm, &dm, NULL);
    }
  } else if (kd->algo != TPF_ALGO_BULK) { /* ring or pipeline RS */
    x = fill(ROLE_X, rank, T, K);
    w = fill(ROLE_W, rank, H, K);
    d = calloc((size_t)(R * H), sizeof *d);
    if (x && w && d) {
      tpf_matrix xm = mat(x, T, K), wm = mat(w, H, K), om = mat(d, R, H);
      st = tpf_gemm_rs(c, &xm, &wm, &om, NULL);
    }
  } else {
    a = fill(ROLE_A, rank, T, K);
    b = fill(ROLE_B, rank, N, K);
    d = calloc((size_t)(T * N), sizeof *d);
    if (a && b && d) {
      if (prep && kd->coll == TPF_COLL_AG && tpf_comm_local_chunk(c, &loc) == TPF_OK)
        for (uint64_t i = 0; i < R; i++)
          for (uint64_t cc = 0; cc < H; cc++)
            ((float *)loc.ptr)[i * loc.ld + cc] = val(ROLE_X, 0, (uint64_t)rank * R + i, cc);
      if (prep && kd->coll == TPF_COLL_RS && tpf_comm_buffer(c, &full) == TPF_OK)
        for (uint64_t i = 0; i < T; i++)
          for (uint64_t cc = 0; cc < H; cc++)
            ((float *)full.ptr)[i * full.ld + cc] = val(ROLE_PART, rank, i, cc);
      tpf_matrix am = mat(a, T, K), bm = mat(b, N, K), dm = mat(d, T, N);
      st = tpf_bulk_overlap(c, &am, &bm, &dm, NULL);
    }
  }
  rec(&me->op[j], st);

  if (snap && memcmp(snap, (unsigned char *)base + active_bytes, tail) != 0)
    me->canary_bad[j] = true;
  free(snap);

  if (st == TPF_OK) {
    if (kd->algo == TPF_ALGO_RING && kd->coll == TPF_COLL_AG) {
      FK_EXPECT(me, j, "D = AG(X) W^T", d, N, T, N, dot_xw(ROLE_X, 0, i, ROLE_W, rank, col, H));
      if (tpf_comm_buffer(c, &full) == TPF_OK)
        FK_EXPECT(me, j, "gathered buffer", (float *)full.ptr, full.ld, T, H,
                  val(ROLE_X, 0, i, col));
    } else if (kd->algo != TPF_ALGO_BULK) {
      float *want = calloc((size_t)(R * H), sizeof *want);
      if (want) {
        for (int q = 0; q < P; q++)
          for (uint64_t i = 0; i < R; i++)
            for (uint64_t cc = 0; cc < H; cc++)
              want[i * H + cc] += dot_xw(ROLE_X, q, (uint64_t)rank * R + i, ROLE_W, q, cc, K);
        FK_EXPECT(me, j, "out = RS(X W^T)", d, H, R, H, want[i * H + col]);
      }
      free(want);
    } else {
      FK_EXPECT(me, j, "bulk D = A B^T", d, N, T, N, dot_xw(ROLE_A, rank, i, ROLE_B, rank, col, K));
      if (tpf_comm_buffer(c, &full) == TPF_OK) {
        if (kd->coll == TPF_COLL_AG) {
          FK_EXPECT(me, j, "bulk gathered buffer", (float *)full.ptr, full.ld, T, H,
                    val(ROLE_X, 0, i, col));
        } else {
          const float *mine = (const float *)full.ptr + (uint64_t)rank * R * full.ld;
          FK_EXPECT(me, j, "bulk reduced chunk", mine, full.ld, R, H,
                    part_sum(P, (uint64_t)rank * R + i, col));
        }
      }
    }
  }
  free(x);
  free(w);
  free(d);
  free(a);
  free(b);
}

/* A live rank about to make the call where, in M_ABSENT, it waits for the absent rank. */
static void fk_reach(fk_case *cs, int point) {
  if (cs->mode != M_ABSENT) return;
  pthread_mutex_lock(&cs->mu);
  cs->reached[point]++;
  pthread_cond_broadcast(&cs->cv);
  pthread_mutex_unlock(&cs->mu);
}

/* The absent rank leaves at `point`: once every other rank has reached it (each has finished all
 * it does without the absent rank), the world's bound drops to TIMEOUT_MS, so exactly the waits
 * for the absent rank expire. The wait for the others is itself bounded (generous). */
static void fk_leave(fk_case *cs, int point) {
  struct timespec dl;
  clock_gettime(CLOCK_REALTIME, &dl);
  dl.tv_sec += GENEROUS_MS / 1000u;
  pthread_mutex_lock(&cs->mu);
  while (cs->reached[point] < cs->P - 1)
    if (pthread_cond_timedwait(&cs->cv, &cs->mu, &dl) != 0) break;
  pthread_mutex_unlock(&cs->mu);
  tpf_sim_set_timeout(cs->world, TIMEOUT_MS);
}

static tpf_status fk_rank_main(tpf_backend *be, int rank, void *arg) {
  fk_case *cs = arg;
  fk_rank *me = &cs->rk[rank];
  const fk_kind *kd = &kKinds[cs->kind];
  const int P = cs->P;
  const bool absent = cs->mode == M_ABSENT && rank == cs->f;
  me->gave_up_at = -1;
  if (absent && cs->absent_at == 0) {
    me->gave_up_at = 0;
    fk_leave(cs, 0);
    return TPF_OK;
  }
  fk_reach(cs, 0);
  char name[64];
  snprintf(name, sizeof name, "fk.%s", kd->label);
  tpf_comm_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.name = name;
  cfg.algo = kd->algo;
  cfg.coll = kd->coll;
  cfg.dtype = TPF_FP32;
  cfg.capacity.rows = 3u * (uint64_t)P;
  cfg.capacity.cols = H;
  cfg.aggregate = kd->aggregate;
  tpf_comm *c = NULL;
  rec(&me->create, tpf_comm_create(be, &cfg, &c));
  if (me->create.st != TPF_OK) return TPF_OK;
  me->created = true;

  bool failed = false;
  for (int j = 0; j < NOPS; j++) {
    if (absent && cs->absent_at == j + 1) {
      me->gave_up_at = j + 1;
      fk_leave(cs, j + 1);
      break;
    }
    fk_reach(cs, j + 1);
    uint64_t T = (j == 0 ? 2u : 1u) * (uint64_t)P;
    tpf_shape s = {T, H};
    tpf_status st = tpf_comm_set_active_shape(c, s);
    rec(&me->shape[j][0], st);
    if (st == TPF_EBACKEND) {
      me->retried[j] = true;
      st = tpf_comm_set_active_shape(c, s);
      rec(&me->shape[j][1], st);
    }
    if (st == TPF_EBACKEND) {
      me->gave_up_at = j + 1;
      break;
    }
    fk_op(cs, c, rank, j, T, st == TPF_OK && !failed);
    if (me->op[j].st != TPF_OK && me->op[j].st != TPF_EMISMATCH) failed = true;
  }
  if (failed) {
    me->refusal_checked = true;
    tpf_shape s = {(uint64_t)P, H};
    rec(&me->refuse_shape, tpf_comm_set_active_shape(c, s));
    if (kd->algo == TPF_ALGO_BULK)
      rec(&me->refuse_op, tpf_bulk_overlap(c, NULL, NULL, NULL, NULL));
    else if (kd->coll == TPF_COLL_AG)
      rec(&me->refuse_op, tpf_ag_gemm(c, NULL, NULL, NULL));
    else
      rec(&me->refuse_op, tpf_gemm_rs(c, NULL, NULL, NULL, NULL));
  }
  rec(&me->destroy, tpf_comm_destroy(c));
  return TPF_OK;
}

/* ---- running a case ---- */

/* Runs a case on *slot, a world of cs->P ranks kept between cases (created when NULL). A world
 * is reused only if the case left it clean: no registration, no rendezvous some rank missed
 * (which would leave the ranks' registration counts out of step). Reuse is itself a check: the
 * next case on that world must pass too. */
static void fk_run_on(fk_case *cs, tpf_sim_world **slot) {
  for (int r = 0; r < MAXP; r++) {
    memset(&cs->rk[r], 0, sizeof cs->rk[r]);
    cs->rk[r].gave_up_at = -1;
  }
  cs->world_ok = false;
  if (!*slot) {
    tpf_sim_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.tp_size = cs->P;
    cfg.seed = cs->k * 1315423911u + (uint64_t)cs->mode * 977u + (uint64_t)cs->kind * 31u +
               (uint64_t)cs->P;
    cfg.max_delay_us = 20;
    cfg.timeout_ms = GENEROUS_MS;
    cfg.arena_bytes = 4u << 20;
    if (tpf_sim_world_create(&cfg, slot) != TPF_OK) return;
  }
  tpf_sim_world *w = *slot;
  /* A reused world may have been left at the short bound by an absent rank. */
  if (tpf_sim_set_timeout(w, GENEROUS_MS) != TPF_OK ||
      tpf_sim_set_fault_timeout(w, TIMEOUT_MS) != TPF_OK ||
      tpf_sim_set_fault_ex(w, &cs->fault) != TPF_OK)
    return;
  cs->world = w;
  memset(cs->reached, 0, sizeof cs->reached);
  pthread_mutex_init(&cs->mu, NULL);
  pthread_cond_init(&cs->cv, NULL);
  double t0 = now_s();
  tpf_status st = tpf_sim_run(w, fk_rank_main, cs);
  cs->secs = now_s() - t0;
  pthread_cond_destroy(&cs->cv);
  pthread_mutex_destroy(&cs->mu);
  cs->world = NULL;
  cs->world_ok = st == TPF_OK && tpf_sim_get_fault_report(w, &cs->rep) == TPF_OK;
  if (!cs->world_ok || cs->rep.live_registrations != 0 || cs->rep.pending_rendezvous != 0) {
    tpf_sim_world_destroy(w);
    *slot = NULL;
  }
}

static void fk_run(fk_case *cs) {
  tpf_sim_world *w = NULL;
  fk_run_on(cs, &w);
  if (w) tpf_sim_world_destroy(w);
}

/* ---- checking a case ---- */

static void bad(fk_case *cs, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
static void bad(fk_case *cs, const char *fmt, ...) {
  if (!cs->pass) return; /* keep the first reason */
  cs->pass = false;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(cs->verdict, sizeof cs->verdict, fmt, ap);
  va_end(ap);
}

static bool has(const char *s, const char *needle) {
  return strstr(s, needle) != NULL;
}

/* The timeout contract: "timeout after 200 ms: rank <me>, step <n> (...) ... waits for rank
 * <peer>" or the registration form "rank <me>, registration <k> (...) waits for rank(s) <..>",
 * or a late arrival naming itself. Returns whether the message names `peer` as awaited (peer
 * -1: any). */
static bool timeout_msg_ok(fk_case *cs, int r, const char *where, const char *m, int peer,
                           bool *names_peer) {
  char head[96], step[48], reg[48], late[96];
  /* The bound it ran out of: TIMEOUT_MS, or a multiple for the nets between a rank's own
   * streams (which name the rank itself as the one awaited). */
  snprintf(head, sizeof head, " ms: rank %d", r);
  snprintf(step, sizeof step, "rank %d, step ", r);
  snprintf(reg, sizeof reg, "rank %d, registration ", r);
  snprintf(late, sizeof late, "rank %d arrived at registration", r);
  /* 0.2: creation meets first at the configuration exchange (same forms). */
  char xreg[64], xlate[96];
  snprintf(xreg, sizeof xreg, "rank %d, communicator creation ", r);
  snprintf(xlate, sizeof xlate, "rank %d arrived at communicator creation", r);
  char generous[48];
  snprintf(generous, sizeof generous, "timeout after %u ms", GENEROUS_MS);
  if (has(m, generous)) {
    bad(cs, "rank %d %s: ran out of the generous %u ms bound, not the short one: %s", r, where,
        GENEROUS_MS, m);
    return false;
  }
  bool form = has(m, "timeout after ") && has(m, head) &&
              ((has(m, step) && has(m, "waits for rank ")) ||
               ((has(m, reg) || has(m, xreg)) && has(m, "waits for rank(s) ")) || has(m, late) ||
               has(m, xlate));
  if (!form) {
    bad(cs, "rank %d %s: ETIMEOUT message lacks rank/step/peer: %s", r, where, m);
    return false;
  }
  if (names_peer) {
    char a[48], b[48];
    snprintf(a, sizeof a, "waits for rank %d", peer);
    snprintf(b, sizeof b, "waits for rank(s) %d", peer);
    *names_peer = has(m, a) || has(m, b);
  }
  return true;
}

static const char *sn(tpf_status s) {
  return tpf_status_name(s);
}

/* The first failure of a rank in script order, or NULL. */
static const fk_rec *first_failure(const fk_rank *rk, const char **where) {
  if (rk->create.st != TPF_OK) {
    *where = "create";
    return &rk->create;
  }
  for (int j = 0; j < NOPS; j++) {
    if (rk->shape[j][0].st != TPF_OK && rk->shape[j][0].msg[0]) {
      *where = j ? "shape 2" : "shape 1";
      return &rk->shape[j][0];
    }
    if (rk->attempted[j] && rk->op[j].st != TPF_OK) {
      *where = j ? "op 2" : "op 1";
      return &rk->op[j];
    }
  }
  if (rk->destroy.st != TPF_OK) {
    *where = "destroy";
    return &rk->destroy;
  }
  return NULL;
}

static bool fail_mode(fk_mode m) {
  return m == M_FAIL || m == M_FAIL_PERSIST;
}

static void fk_check(fk_case *cs) {
  cs->pass = true;
  cs->verdict[0] = '\0';
  const int P = cs->P, f = cs->f;
  if (!cs->world_ok) {
    bad(cs, "world create/run/report failed");
    return;
  }
  /* No hang: decided by logic, not the wall clock (a ThreadSanitizer build on a loaded 2-core
   * machine ran a fault-free case for 37 s). A wait that should have had the short bound and ran
   * out of the generous one says so in its message ("timeout after 60000 ms"): timeout_msg_ok
   * refuses it. cs->secs is only reported (the slowest case). */
  /* No leak in the world. */
  uint64_t want_pending = cs->mode == M_ABSENT && cs->absent_at == 0 ? 1u : 0u;
  if (cs->rep.live_registrations != 0 || cs->rep.arena_used_bytes != 0 ||
      cs->rep.pending_rendezvous != want_pending)
    bad(cs, "world still holds %llu registrations, %llu arena bytes, %llu rendezvous",
        (unsigned long long)cs->rep.live_registrations,
        (unsigned long long)cs->rep.arena_used_bytes,
        (unsigned long long)cs->rep.pending_rendezvous);

  bool any_failure = false;
  for (int r = 0; r < P; r++) {
    const fk_rank *rk = &cs->rk[r];
    const bool isf = r == f;
    /* Allowed statuses. */
    tpf_status cst = rk->create.st;
    if (rk->gave_up_at != 0 && !(cst == TPF_OK || cst == TPF_ETIMEOUT || cst == TPF_EBACKEND))
      bad(cs, "rank %d create: %s (%s)", r, sn(cst), rk->create.msg);
    if (cst == TPF_EBACKEND) {
      char want[64];
      snprintf(want, sizeof want, isf ? "injected fault" : "rank %d failed", f);
      if (!fail_mode(cs->mode) || !has(rk->create.msg, want))
        bad(cs, "rank %d create: EBACKEND without the injected fault: %s", r, rk->create.msg);
    }
    if (cst == TPF_ETIMEOUT) timeout_msg_ok(cs, r, "create", rk->create.msg, -1, NULL);
    if (cst != TPF_OK || rk->gave_up_at == 0) any_failure = true;
    bool comm_failed = false;
    for (int j = 0; j < NOPS; j++) {
      for (int t = 0; t < 2; t++) {
        const fk_rec *s = &rk->shape[j][t];
        if (t == 1 && !rk->retried[j]) continue;
        if (!rk->attempted[j] && !rk->retried[j] && s->st == TPF_OK && !s->msg[0]) continue;
        if (s->st == TPF_EBACKEND && !(isf && fail_mode(cs->mode) && has(s->msg, "injected fault")))
          bad(cs, "rank %d shape %d: EBACKEND not injected: %s", r, j + 1, s->msg);
        else if (s->st == TPF_ESTATE && !comm_failed)
          bad(cs, "rank %d shape %d: ESTATE on a healthy communicator: %s", r, j + 1, s->msg);
        else if (s->st == TPF_OK && comm_failed)
          bad(cs, "rank %d shape %d: failed communicator accepted a shape", r, j + 1);
        else if (s->st != TPF_OK && s->st != TPF_EBACKEND && s->st != TPF_ESTATE)
          bad(cs, "rank %d shape %d: %s (%s)", r, j + 1, sn(s->st), s->msg);
        if (s->st != TPF_OK) any_failure = true;
      }
      if (!rk->attempted[j]) continue;
      const fk_rec *o = &rk->op[j];
      if (comm_failed && o->st != TPF_ESTATE)
        bad(cs, "rank %d op %d: %s on a failed communicator, expected ESTATE", r, j + 1, sn(o->st));
      switch (o->st) {
      case TPF_OK:
        if (rk->wrong[j])
          bad(cs, "rank %d op %d succeeded with a wrong result: %s", r, j + 1, rk->why[j]);
        break;
      case TPF_EBACKEND:
        if (!(isf && fail_mode(cs->mode) && has(o->msg, "injected fault")))
          bad(cs, "rank %d op %d: EBACKEND not injected: %s", r, j + 1, o->msg);
        break;
      case TPF_ETIMEOUT:
        timeout_msg_ok(cs, r, j ? "op 2" : "op 1", o->msg, -1, NULL);
        break;
      case TPF_ESTATE:
        if (!comm_failed)
          bad(cs, "rank %d op %d: ESTATE on a healthy communicator: %s", r, j + 1, o->msg);
        break;
      default:
        bad(cs, "rank %d op %d: unexpected %s (%s)", r, j + 1, sn(o->st), o->msg);
      }
      if (rk->canary_bad[j])
        bad(cs, "rank %d op %d (%s): bytes beyond the active layout changed", r, j + 1, sn(o->st));
      if (o->st != TPF_OK) {
        any_failure = true;
        comm_failed = true;
      }
    }
    if (comm_failed != rk->refusal_checked)
      bad(cs, "rank %d: refusal check %s", r, comm_failed ? "missing" : "unexpected");
    if (rk->refusal_checked &&
        (rk->refuse_shape.st != TPF_ESTATE || rk->refuse_op.st != TPF_ESTATE))
      bad(cs, "rank %d: failed communicator answered %s / %s, expected ESTATE", r,
          sn(rk->refuse_shape.st), sn(rk->refuse_op.st));
    if (rk->created) {
      if (rk->destroy.st == TPF_EBACKEND) {
        if (!(isf && fail_mode(cs->mode) && has(rk->destroy.msg, "injected fault")))
          bad(cs, "rank %d destroy: %s", r, rk->destroy.msg);
        any_failure = true;
      } else if (rk->destroy.st != TPF_OK) {
        bad(cs, "rank %d destroy: %s (%s)", r, sn(rk->destroy.st), rk->destroy.msg);
      }
    }
    if (rk->gave_up_at >= 0) any_failure = true;
  }

  /* An operation succeeds on one rank only if every rank reached it (the handshake). */
  for (int j = 0; j < NOPS; j++) {
    bool some_ok = false;
    for (int r = 0; r < P; r++)
      some_ok |= cs->rk[r].attempted[j] && cs->rk[r].op[j].st == TPF_OK;
    if (!some_ok) continue;
    for (int r = 0; r < P; r++) {
      const fk_rank *rk = &cs->rk[r];
      if (!rk->attempted[j] || rk->op[j].st == TPF_ESTATE)
        bad(cs, "op %d succeeded on some rank although rank %d never ran it", j + 1, r);
    }
  }

  /* Mode-specific expectations. */
  const fk_rank *fr = &cs->rk[f];
  const char *where = "";
  const fk_rec *ff = first_failure(fr, &where);
  switch (cs->mode) {
  case M_NONE:
  case M_DELAY:
  case M_DUP:
  case M_DUP_LATE:
  case M_REORDER:
    /* Nothing is lost: everything succeeds, results exact. */
    if (any_failure) {
      for (int r = 0; r < P; r++) {
        const fk_rec *x = first_failure(&cs->rk[r], &where);
        if (x) {
          bad(cs, "rank %d %s: %s (%s), expected every call to succeed", r, where, sn(x->st),
              x->msg);
          break;
        }
      }
      bad(cs, "a rank failed although nothing was lost");
    }
    if (cs->rep.injected != (cs->mode == M_NONE ? 0u : 1u))
      bad(cs, "%llu faults injected", (unsigned long long)cs->rep.injected);
    break;
  case M_FAIL:
  case M_FAIL_PERSIST:
    if (cs->mode == M_FAIL ? cs->rep.injected != 1 : cs->rep.injected < 1)
      bad(cs, "%llu faults injected", (unsigned long long)cs->rep.injected);
    if (!ff) {
      bad(cs, "the faulted rank saw no failure");
      break;
    }
    if (ff->st != TPF_EBACKEND || !has(ff->msg, "injected fault"))
      bad(cs, "faulted rank %d first failed at %s with %s (%s), expected the injected fault", f,
          where, sn(ff->st), ff->msg);
    /* Persistent: every later call fails too, down to the sync of the destroy. */
    if (cs->mode == M_FAIL_PERSIST && fr->created && fr->destroy.st != TPF_EBACKEND)
      bad(cs, "persistent fault, but rank %d's destroy returned %s", f, sn(fr->destroy.st));
    /* Transient: only the chosen call fails; the destroy's sync is the script's last call. */
    if (cs->mode == M_FAIL && fr->created &&
        (fr->destroy.st == TPF_EBACKEND) != (cs->k == cs->baseline_calls))
      bad(cs, "transient fault %llu of %llu: destroy returned %s", (unsigned long long)cs->k,
          (unsigned long long)cs->baseline_calls, sn(fr->destroy.st));
    /* A failed registration fails every peer at once, naming the rank. */
    if (fr->create.st == TPF_EBACKEND)
      for (int r = 0; r < P; r++)
        if (cs->rk[r].create.st != TPF_EBACKEND)
          bad(cs, "rank %d create %s after rank %d's registration failed", r,
              sn(cs->rk[r].create.st), f);
    /* Once the faulted rank stopped running operations, no peer completes a later one. */
    for (int j = 0; j < NOPS; j++) {
      bool f_out = fr->gave_up_at >= 0 && fr->gave_up_at <= j + 1;
      for (int i = 0; i < j; i++)
        f_out |= fr->attempted[i] && fr->op[i].st != TPF_OK;
      if (!f_out) continue;
      for (int r = 0; r < P; r++)
        if (r != f && cs->rk[r].attempted[j] && cs->rk[r].op[j].st == TPF_OK)
          bad(cs, "rank %d op %d succeeded after rank %d stopped", r, j + 1, f);
    }
    break;
  case M_DROP:
  case M_LATE:
  case M_ABSENT: {
    if (cs->mode != M_ABSENT && cs->rep.injected != 1)
      bad(cs, "%llu faults injected", (unsigned long long)cs->rep.injected);
    /* A late sync (the destroy) loses nothing. */
    bool harmless = cs->mode == M_LATE && !any_failure;
    if (harmless) break;
    /* Some peer's first failure is a timeout naming the faulted rank as the one awaited. */
    bool named = false;
    for (int r = 0; r < P; r++) {
      if (r == f) continue;
      const fk_rec *x = first_failure(&cs->rk[r], &where);
      bool np = false;
      if (x && x->st == TPF_ETIMEOUT && timeout_msg_ok(cs, r, where, x->msg, f, &np) && np)
        named = true;
    }
    if (!named) {
      const fk_rec *x = NULL;
      int r = 0;
      for (; r < P && !x; r++)
        if (r != f) x = first_failure(&cs->rk[r], &where);
      bad(cs, "no peer's first failure is a timeout waiting for rank %d (rank %d %s: %s)", f, r - 1,
          x ? sn(x->st) : "-", x ? x->msg : "no failure");
    }
    if (cs->mode == M_LATE && ff && ff->st != TPF_ETIMEOUT)
      bad(cs, "late rank %d first failed with %s (%s)", f, sn(ff->st), ff->msg);
    break;
  }
  default:
    break;
  }
}

/* ---- the case pool ---- */

typedef struct {
  fk_case *cases;
  size_t n;
  atomic_size_t next;
} fk_pool;

static void *fk_worker(void *arg) {
  fk_pool *p = arg;
  tpf_sim_world *worlds[MAXP + 1] = {NULL};
  for (;;) {
    size_t i = atomic_fetch_add(&p->next, 1);
    if (i >= p->n) break;
    fk_run_on(&p->cases[i], &worlds[p->cases[i].P]);
  }
  for (int P = 0; P <= MAXP; P++)
    if (worlds[P]) tpf_sim_world_destroy(worlds[P]);
  return NULL;
}

/* ThreadSanitizer makes thread creation and every wake-up slow, and its memory grows with the
 * threads alive: fewer worlds at a time there (no verdict depends on it: see TIMEOUT_MS). */
#if defined(__SANITIZE_THREAD__)
#define FK_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define FK_TSAN 1
#endif
#endif
#ifdef FK_TSAN
#define FK_DEFAULT_JOBS 4
#else
#define FK_DEFAULT_JOBS 12
#endif

static int fk_jobs(void) {
  const char *e = getenv("TPF_FAULT_JOBS");
  int j = e ? atoi(e) : FK_DEFAULT_JOBS;
  return j < 1 ? 1 : j > 64 ? 64 : j;
}

static void fk_run_all(fk_case *cases, size_t n) {
  fk_pool p = {cases, n, 0};
  int jobs = fk_jobs();
  pthread_t th[64];
  int started = 0;
  for (; started < jobs && (size_t)started < n; started++)
    if (pthread_create(&th[started], NULL, fk_worker, &p) != 0) break;
  if (started == 0) fk_worker(&p);
  for (int i = 0; i < started; i++)
    pthread_join(th[i], NULL);
}

/* ---- building the loops ---- */

typedef struct {
  uint64_t calls[MAXP], entries[MAXP], signals[MAXP];
} fk_counts;

static bool kind_runs(int kind, int P) {
  return !(kKinds[kind].aggregate && P % 2 != 0);
}

static fk_case fk_case_new(int kind, int P, int f, fk_mode mode, uint64_t k) {
  fk_case c;
  memset(&c, 0, sizeof c);
  c.kind = kind;
  c.P = P;
  c.f = f;
  c.mode = mode;
  c.k = k;
  c.absent_at = -1;
  c.fault.rank_mask = 1ull << (unsigned)f;
  return c;
}

/* Fault-free runs with each rank counted: how many calls, entries and signals the script makes. */
static void fk_baseline(int kind, int P, fk_counts *out) {
  fk_case c[MAXP];
  for (int f = 0; f < P; f++)
    c[f] = fk_case_new(kind, P, f, M_NONE, 0);
  fk_run_all(c, (size_t)P);
  for (int f = 0; f < P; f++) {
    fk_check(&c[f]);
    if (!c[f].pass)
      fail_msg("fault-free %s P=%d (rank %d counted): %s", kKinds[kind].label, P, f, c[f].verdict);
    out->calls[f] = c[f].rep.calls;
    out->entries[f] = c[f].rep.entries;
    out->signals[f] = c[f].rep.signals;
  }
}

/* The faulted rank of loop index k: rotates, skipping ranks that make fewer than k counted
 * events (-1 when none makes k). */
static int rotate(const uint64_t *count, int P, uint64_t k) {
  for (int t = 0; t < P; t++) {
    int f = (int)((k - 1 + (uint64_t)t) % (uint64_t)P);
    if (count[f] >= k) return f;
  }
  return -1;
}

typedef struct {
  fk_case *v;
  size_t n, cap;
} fk_list;

static void push(fk_list *l, fk_case c) {
  if (l->n == l->cap) {
    l->cap = l->cap ? 2 * l->cap : 256;
    l->v = realloc(l->v, l->cap * sizeof *l->v);
    assert_non_null(l->v);
  }
  l->v[l->n++] = c;
}

/* Adds the loop of one mode for every kind and P. */
static void add_loop(fk_list *l, fk_mode mode) {
  for (int P = 2; P <= MAXP; P++) {
    for (int kind = 0; kind < NKINDS; kind++) {
      if (!kind_runs(kind, P)) continue;
      fk_counts n;
      memset(&n, 0, sizeof n);
      if (mode != M_ABSENT) fk_baseline(kind, P, &n);
      const uint64_t *count = fail_mode(mode) ? n.calls : mode == M_LATE ? n.entries : n.signals;
      uint64_t most = 0;
      for (int f = 0; f < P; f++)
        most = count[f] > most ? count[f] : most;
      if (mode == M_ABSENT) most = NOPS + 1;
      for (uint64_t k = 1; k <= most; k++) {
        int f = mode == M_ABSENT ? (int)((k - 1) % (uint64_t)P) : rotate(count, P, k);
        if (f < 0) continue;
        fk_case c = fk_case_new(kind, P, f, mode, k);
        c.baseline_calls = n.calls[f];
        switch (mode) {
        case M_FAIL:
        case M_FAIL_PERSIST:
          c.fault.base.fail_call = k;
          c.fault.base.fail_status = TPF_EBACKEND;
          c.fault.fail_persistent = mode == M_FAIL_PERSIST;
          break;
        case M_DROP:
          c.fault.base.drop_signal = k;
          break;
        case M_DELAY:
          c.fault.delay_signal = k;
          c.fault.delay_us = DELAY_US;
          break;
        case M_DUP:
        case M_DUP_LATE:
          c.fault.dup_signal = k;
          c.fault.dup_late = mode == M_DUP_LATE;
          break;
        case M_REORDER:
          c.fault.reorder_signal = k;
          break;
        case M_LATE:
          c.fault.late_entry = k;
          c.fault.late_ms = LATE_MS;
          break;
        case M_ABSENT:
          c.absent_at = (int)(k - 1);
          c.fault.rank_mask = 0;
          break;
        default:
          break;
        }
        push(l, c);
      }
    }
  }
}

/* Runs the loops of the given modes, checks every case, prints counts per mode, fails on the
 * first bad case (after printing up to 10). */
static void run_modes(const fk_mode *modes, int nmodes) {
  long live0 = tpf__alloc_live_count();
  fk_list l = {NULL, 0, 0};
  size_t start[M_COUNT + 1];
  for (int i = 0; i < nmodes; i++) {
    start[i] = l.n;
    add_loop(&l, modes[i]);
  }
  start[nmodes] = l.n;
  double t0 = now_s();
  fk_run_all(l.v, l.n);
  double dt = now_s() - t0;
  assert_int_equal(tpf__alloc_live_count(), live0);
  int printed = 0;
  size_t nbad = 0;
  for (int i = 0; i < nmodes; i++) {
    size_t ok_all = 0, absorbed = 0, failed = 0, bad_n = 0;
    double worst = 0.0;
    for (size_t c = start[i]; c < start[i + 1]; c++) {
      fk_case *cs = &l.v[c];
      fk_check(cs);
      bool any = false, ops_ok = true;
      for (int r = 0; r < cs->P; r++) {
        const char *w;
        any |= first_failure(&cs->rk[r], &w) != NULL || cs->rk[r].gave_up_at >= 0;
        for (int j = 0; j < NOPS; j++)
          ops_ok &= cs->rk[r].attempted[j] && cs->rk[r].op[j].st == TPF_OK;
      }
      if (!any)
        ok_all++;
      else if (ops_ok)
        absorbed++; /* e.g. a failed set_active_shape retried, a failed or late final sync */
      else
        failed++;
      worst = cs->secs > worst ? cs->secs : worst;
      if (!cs->pass) {
        bad_n++;
        if (printed++ < 10) {
          print_message("BAD %s %s P=%d rank %d k=%llu (%.2f s): %s\n", kModeNames[cs->mode],
                        kKinds[cs->kind].label, cs->P, cs->f, (unsigned long long)cs->k, cs->secs,
                        cs->verdict);
          for (int r = 0; r < cs->P; r++) {
            const char *w = "";
            const fk_rec *x = first_failure(&cs->rk[r], &w);
            print_message("    rank %d: %s %s %s\n", r, x ? w : "all ok", x ? sn(x->st) : "",
                          x ? x->msg : "");
          }
        }
      }
    }
    nbad += bad_n;
    print_message("fault mode %-16s %4zu cases: %4zu all ok, %3zu fault absorbed (every op "
                  "ok), %4zu ops failed; %zu bad; slowest case %.2f s\n",
                  kModeNames[modes[i]], start[i + 1] - start[i], ok_all, absorbed, failed, bad_n,
                  worst);
  }
  print_message("  %zu cases in %.1f s with %d concurrent worlds\n", l.n, dt, fk_jobs());
  free(l.v);
  if (nbad) fail_msg("%zu bad cases", nbad);
}

/* ---- tests ---- */

static void test_fault__kth_call_transient(void **state) {
  (void)state;
  const fk_mode m[] = {M_FAIL};
  run_modes(m, 1);
}

static void test_fault__kth_call_persistent(void **state) {
  (void)state;
  const fk_mode m[] = {M_FAIL_PERSIST};
  run_modes(m, 1);
}

static void test_fault__signals(void **state) {
  (void)state;
  const fk_mode m[] = {M_DROP, M_DELAY, M_DUP, M_DUP_LATE, M_REORDER};
  run_modes(m, 5);
}

static void test_fault__late_and_absent_ranks(void **state) {
  (void)state;
  const fk_mode m[] = {M_LATE, M_ABSENT};
  run_modes(m, 2);
}

/* SPEC §3 on the simulator: a rank that never arrives makes its peers' wait expire
 * with TPF_ETIMEOUT, within the timeout, naming the waiting rank, the step and the awaited peer;
 * the communicator then refuses work with TPF_ESTATE until destroyed. */
static void test_fault__timeout_names_rank_step_and_peer(void **state) {
  (void)state;
  long live0 = tpf__alloc_live_count();
  fk_case c = fk_case_new(0 /* ring-ag */, 3, 2, M_ABSENT, 2);
  c.absent_at = 1; /* rank 2 creates, then leaves before the first operation */
  c.fault.rank_mask = 0;
  fk_run(&c);
  fk_check(&c);
  if (!c.pass) fail_msg("%s", c.verdict);
  for (int r = 0; r < 2; r++) {
    char want[160];
    snprintf(want, sizeof want,
             "timeout after %u ms: rank %d, step 0 (HANDSHAKE) of 'fk.ring-ag' operation 1 "
             "waits for rank 2",
             TIMEOUT_MS, r);
    TPF_ASSERT_STATUS(c.rk[r].op[0].st, TPF_ETIMEOUT);
    if (!has(c.rk[r].op[0].msg, want)) fail_msg("rank %d: '%s'", r, c.rk[r].op[0].msg);
    TPF_ASSERT_STATUS(c.rk[r].refuse_shape.st, TPF_ESTATE);
    TPF_ASSERT_STATUS(c.rk[r].refuse_op.st, TPF_ESTATE);
    TPF_ASSERT_STATUS(c.rk[r].op[1].st, TPF_ESTATE);
  }
  /* At least the short bound: a wait never ends early (load only lengthens it). That it was the
   * short bound and not the generous one, the message above says. */
  assert_true(c.secs >= TIMEOUT_MS / 1000.0);

  /* A lost SEND flag: the receiver's RECV expires naming its step, chunk, tag and the sender. */
  fk_case d = fk_case_new(0, 2, 0, M_DROP, 1);
  d.fault.base.drop_signal = 1;
  fk_run(&d);
  fk_check(&d);
  if (!d.pass) fail_msg("%s", d.verdict);
  TPF_ASSERT_STATUS(d.rk[1].op[0].st, TPF_ETIMEOUT);
  const char *m = d.rk[1].op[0].msg;
  if (!has(m, "timeout after 200 ms: rank 1, step ") || !has(m, "(RECV chunk 0, tag 0)") ||
      !has(m, "waits for rank 0 (its flag is at 0)"))
    fail_msg("drop message: '%s'", m);

  /* Never arriving at the registration: the peers' rendezvous expires naming it. */
  fk_case e = fk_case_new(0, 3, 1, M_ABSENT, 1);
  e.absent_at = 0;
  e.fault.rank_mask = 0;
  fk_run(&e);
  fk_check(&e);
  if (!e.pass) fail_msg("%s", e.verdict);
  for (int r = 0; r < 3; r += 2) {
    TPF_ASSERT_STATUS(e.rk[r].create.st, TPF_ETIMEOUT);
    if (!has(e.rk[r].create.msg, "waits for rank(s) 1; only 2 of 3 ranks arrived"))
      fail_msg("rank %d: '%s'", r, e.rk[r].create.msg);
  }
  assert_int_equal(tpf__alloc_live_count(), live0);
}

/* A registration that fails on one rank fails every rank at once (no timeout) and keeps the
 * ranks' registration counts in step: the next communicator of the same world pairs up. */
typedef struct {
  tpf_status first[MAXP], second[MAXP];
  char msg[MAXP][FK_MSG];
} fk_reg_arg;

static tpf_status fk_reg_rank(tpf_backend *be, int rank, void *p) {
  fk_reg_arg *a = p;
  tpf_comm_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.name = "fk.reg";
  cfg.algo = TPF_ALGO_RING;
  cfg.coll = TPF_COLL_AG;
  cfg.dtype = TPF_FP32;
  cfg.capacity.rows = 3u * (uint64_t)be->tp_size;
  cfg.capacity.cols = H;
  tpf_comm *c = NULL;
  a->first[rank] = tpf_comm_create(be, &cfg, &c);
  snprintf(a->msg[rank], FK_MSG, "%s", tpf_last_error());
  if (a->first[rank] == TPF_OK) tpf_comm_destroy(c);
  a->second[rank] = tpf_comm_create(be, &cfg, &c);
  if (a->second[rank] == TPF_OK) tpf_comm_destroy(c);
  return TPF_OK;
}

static void test_fault__failed_registration_keeps_ranks_in_step(void **state) {
  (void)state;
  tpf_sim_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.tp_size = 3;
  cfg.timeout_ms = GENEROUS_MS; /* a timeout here would be the bug (the statuses say so) */
  cfg.arena_bytes = 4u << 20;
  tpf_sim_world *w = NULL;
  TPF_ASSERT_OK(tpf_sim_world_create(&cfg, &w));
  tpf_sim_fault_ex f;
  memset(&f, 0, sizeof f);
  f.rank_mask = 1u << 1;
  f.base.fail_call = 1; /* rank 1's first call: its reg_create */
  TPF_ASSERT_OK(tpf_sim_set_fault_ex(w, &f));
  fk_reg_arg a;
  memset(&a, 0, sizeof a);
  TPF_ASSERT_OK(tpf_sim_run(w, fk_reg_rank, &a));
  for (int r = 0; r < 3; r++) {
    TPF_ASSERT_STATUS(a.first[r], TPF_EBACKEND);
    if (!has(a.msg[r], r == 1 ? "injected fault" : "rank 1 failed"))
      fail_msg("rank %d: %s", r, a.msg[r]);
    TPF_ASSERT_STATUS(a.second[r], TPF_OK);
  }
  tpf_sim_fault_report rep;
  TPF_ASSERT_OK(tpf_sim_get_fault_report(w, &rep));
  assert_int_equal(rep.live_registrations, 0);
  assert_int_equal(rep.arena_used_bytes, 0);
  assert_int_equal(rep.pending_rendezvous, 0);
  TPF_ASSERT_OK(tpf_sim_world_destroy(w));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fault__timeout_names_rank_step_and_peer),
      cmocka_unit_test(test_fault__failed_registration_keeps_ranks_in_step),
      cmocka_unit_test(test_fault__kth_call_transient),
      cmocka_unit_test(test_fault__kth_call_persistent),
      cmocka_unit_test(test_fault__signals),
      cmocka_unit_test(test_fault__late_and_absent_ranks),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
