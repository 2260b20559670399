/* Systematic mutation test of the independent schedule checker.
 *
 * Method: build the correct schedules of every algorithm/collective variant for P = 1..4 (and
 * the ring variants at P = 5; fp32, plus bf16 headers and structure at P = 4) with
 * tpf_schedule_build, then apply one mutation at a time to a copy and run tpf_schedule_check:
 *  - one field of one step (kind, stream, ndeps, each used dep, peer, tag, chunk, src_off,
 *    dst_off, bytes, every tpf_mref field of a, w and d, m, n, k, stride_bytes, count, and the
 *    mechanism: xport, sm_budget), on one
 *    rank and, as a second mutation class, on the same step of every rank (a builder bug would
 *    break every rank alike, so cross-rank disagreement cannot give it away);
 *  - one header field (tp_size, rank, algo, coll, dtype, num_splits, aggregate, rows, cols,
 *    chunk_rows, chunk_bytes, registered/active bytes, gemm dims, compute streams, nsteps,
 *    handshake_peers), on one rank and on every rank;
 *  - delete a step, duplicate a step, swap two neighbouring steps (one rank, every rank).
 * Each mutation has a verdict decided here, not by the checker:
 *  - MUST_REJECT: the checker must return TPF_EINVAL with a detail naming a rank.
 *  - HARMLESS: provably harmless, for a reason given where the verdict is made (a field no
 *    backend reads for that kind, the informational `chunk`, ...). Either outcome is fine; the
 *    counts say how many the checker accepted.
 *  - ORDER: only the order changed (stream, deps, step order). An independent byte-level oracle
 *    below decides: the mutation is harmful exactly when a step may now read a byte before the
 *    step that produces it, a peer may read before the producer's barrier, a pulled byte is no
 *    longer read before a barrier its owner waits on, or a structural rule breaks; otherwise it is
 *    harmless, and the checker may still reject it only as a deadlock (extra waits can hang).
 * Values per field: neighbours (+-1, +element, +-chunk bytes, +row pitch, +chunk rows), 0, the
 * active bytes and values near 2^64 (the overflow paths); every enum value and one past it;
 * deps: the handshake, the old dep +-1, the step itself and the next.
 */
#include "tpf_test.h"

#include <stddef.h>

#define MAXP 5
#define MAXSTEPS 64
#define MAXB 4096 /* active bytes of every group built here */
#define EXTRA 2   /* spare zeroed steps behind each copy (nsteps + 1, duplicate) */

typedef struct {
  const char *name;
  tpf_algo algo;
  tpf_coll coll;
  int splits;
  bool aggregate;
} variant;

static const variant variants[] = {
    {"ring ag", TPF_ALGO_RING, TPF_COLL_AG, 0, false},
    {"ring ag splits=1", TPF_ALGO_RING, TPF_COLL_AG, 1, false},
    {"ring ag aggregate", TPF_ALGO_RING, TPF_COLL_AG, 0, true},
    {"ring rs", TPF_ALGO_RING, TPF_COLL_RS, 0, false},
    {"pipeline rs S=1", TPF_ALGO_PIPELINE, TPF_COLL_RS, 1, false},
    {"pipeline rs S=2", TPF_ALGO_PIPELINE, TPF_COLL_RS, 2, false},
    {"pipeline rs S=4", TPF_ALGO_PIPELINE, TPF_COLL_RS, 4, false},
    {"bulk ag", TPF_ALGO_BULK, TPF_COLL_AG, 0, false},
    {"bulk rs", TPF_ALGO_BULK, TPF_COLL_RS, 0, false},
};

enum { MUST_REJECT, HARMLESS, ORDER, UNDETECTABLE, MECH /* decided on the mutated group */ };

typedef struct {
  const variant *v;
  int P;
  tpf_dtype dt;
  uint64_t e, R, S, pitch; /* element, chunk rows, chunk bytes, row pitch H*e */
  tpf_schedule orig[MAXP], mut[MAXP];
  tpf_step buf[MAXP][MAXSTEPS + EXTRA];
} group;

static struct {
  long tried, rejected, harmless_accepted, harmless_rejected, order_accepted, deadlocks;
  long undetectable; /* accepted header relabellings no schedule checker can see */
  long bad;          /* verdict violations */
} cnt;

static group g_grp;
static char g_desc[256];
static char g_key[96]; /* class of the current mutation, for the violation summary */

/* Violations are summarised per class (first example and a count) rather than one line each. */
static struct {
  char key[96], first[320];
  long n;
} viol[256];
static int nviol;

static void violation(const char *what) {
  cnt.bad++;
  for (int i = 0; i < nviol; i++)
    if (strcmp(viol[i].key, g_key) == 0) {
      viol[i].n++;
      return;
    }
  if (nviol == (int)TPF_ARRAY_SIZE(viol)) return;
  snprintf(viol[nviol].key, sizeof viol[nviol].key, "%s", g_key);
  snprintf(viol[nviol].first, sizeof viol[nviol].first, "%s: %s", g_desc, what);
  viol[nviol++].n = 1;
}

/* ---- building and copying ---- */

static void build_group(group *g, const variant *v, int P, tpf_dtype dt) {
  const uint64_t H = 8, T = 4 * (uint64_t)P;
  memset(g, 0, sizeof *g);
  g->v = v;
  g->P = P;
  g->dt = dt;
  g->e = tpf_dtype_size(dt);
  g->R = T / (uint64_t)P;
  g->pitch = H * g->e;
  g->S = g->R * g->pitch;
  for (int r = 0; r < P; r++) {
    tpf_layout_desc d;
    memset(&d, 0, sizeof d);
    d.tp_size = P;
    d.rank = r;
    d.algo = v->algo;
    d.coll = v->coll;
    d.dtype = dt;
    d.capacity.rows = 2 * T; /* registered bytes beyond the active layout */
    d.capacity.cols = d.active.cols = H;
    d.active.rows = T;
    d.num_splits = v->splits;
    d.aggregate = v->aggregate;
    tpf_gemm_dims gd = {T, 16, H};
    if (v->algo == TPF_ALGO_BULK)
      gd = (tpf_gemm_dims){8, 12, 16};
    else if (v->coll == TPF_COLL_RS)
      gd = (tpf_gemm_dims){T, H, 24};
    TPF_ASSERT_OK(tpf_schedule_build(&d, &gd, &g->orig[r]));
    assert_true(g->orig[r].nsteps <= MAXSTEPS);
    assert_true(g->orig[r].active_bytes <= MAXB);
  }
  if (tpf_schedule_check(g->orig, P) != TPF_OK)
    fail_msg("%s P=%d: the unmutated group fails: %s", v->name, P, tpf_last_error());
}

static void free_group(group *g) {
  for (int r = 0; r < g->P; r++)
    tpf_schedule_free(&g->orig[r]);
}

static void reset(group *g) {
  for (int r = 0; r < g->P; r++) {
    g->mut[r] = g->orig[r];
    g->mut[r].steps = g->buf[r];
    memset(g->buf[r], 0, sizeof g->buf[r]);
    memcpy(g->buf[r], g->orig[r].steps, (size_t)g->orig[r].nsteps * sizeof(tpf_step));
  }
}

/* ---- the order oracle (independent of the checker: byte by byte, from first principles) ---- */

static bool anc[MAXP][MAXSTEPS + EXTRA][MAXSTEPS + EXTRA]; /* anc[r][i][j]: j runs before i */
static int writer[MAXP][MAXB];                             /* producing step, -1: initial */

/* True when an m x ncols view lies inside the first lim bytes. */
static bool view_ok(const tpf_mref *v, uint64_t off, uint64_t m, uint64_t ncols, uint64_t e,
                    uint64_t lim) {
  return v->ld >= ncols && v->col + ncols <= v->ld &&
         off + ((v->row + m - 1) * v->ld + v->col + ncols) * e <= lim;
}

#define FOR_VIEW_BYTES(v, off, m, ncols, e, b)                                                     \
  for (uint64_t vi_ = 0; vi_ < (m); vi_++)                                                         \
    for (uint64_t vj_ = 0; vj_ < (ncols) * (e); vj_++)                                             \
      for (uint64_t b = (off) + (((v)->row + vi_) * (v)->ld + (v)->col) * (e) + vj_, once_ = 1;    \
           once_; once_ = 0)

static bool order_fail(char *why, size_t n, const char *fmt, int r, int i) {
  snprintf(why, n, fmt, r, i);
  return false;
}

static bool oracle_order(const group *g, char *why, size_t wn) {
  int P = g->P;
  int bar[MAXP][TPF_MAX_TAGS];
  for (int r = 0; r < P; r++) {
    const tpf_schedule *s = &g->mut[r];
    int last[TPF_NUM_STREAMS] = {-1, -1, -1, -1, -1};
    memset(anc[r], 0, sizeof anc[r]);
    for (int t = 0; t < TPF_MAX_TAGS; t++)
      bar[r][t] = -1;
    for (int i = 0; i < s->nsteps; i++) {
      const tpf_step *st = &s->steps[i];
      if (st->stream >= TPF_NUM_STREAMS || st->ndeps > TPF_STEP_MAX_DEPS)
        return order_fail(why, wn, "rank %d step %d: stream or ndeps out of range", r, i);
      bool compute = st->stream < s->num_compute_streams;
      bool legal = st->kind == TPF_STEP_GEMM || st->kind == TPF_STEP_REDUCE ? compute
                   : st->kind == TPF_STEP_RECV        ? st->stream == TPF_STREAM_RECV
                   : st->kind == TPF_STEP_PEER_REDUCE ? true
                                                      : st->stream == TPF_STREAM_COMM;
      /* Step 0 is the HANDSHAKE, except at P = 1 (one GEMM, no handshake). */
      if (!legal || (st->kind == TPF_STEP_HANDSHAKE ? i != 0 : (i == 0 && s->tp_size > 1)))
        return order_fail(why, wn, "rank %d step %d: kind not allowed there", r, i);
      for (int j = 0; j < st->ndeps; j++) {
        if (st->deps[j] >= i) return order_fail(why, wn, "rank %d step %d: dep not earlier", r, i);
        int d = st->deps[j];
        anc[r][i][d] = true;
        for (int k = 0; k < i; k++)
          anc[r][i][k] |= anc[r][d][k];
      }
      int p = last[st->stream];
      if (p >= 0) {
        anc[r][i][p] = true;
        for (int k = 0; k < i; k++)
          anc[r][i][k] |= anc[r][p][k];
      }
      last[st->stream] = i;
      if (i > 0 && !anc[r][i][0])
        return order_fail(why, wn, "rank %d step %d: not after the handshake", r, i);
      if (st->kind == TPF_STEP_BARRIER) bar[r][st->tag] = i;
    }
  }
  /* Producers: RECV (the bytes have landed once it completes) and buffer-writing compute. */
  for (int r = 0; r < P; r++) {
    const tpf_schedule *s = &g->mut[r];
    memset(writer[r], 0xff, sizeof writer[r]); /* every entry -1 */
    for (int i = 0; i < s->nsteps; i++) {
      const tpf_step *st = &s->steps[i];
      if (st->kind == TPF_STEP_RECV)
        for (uint64_t b = st->dst_off; b < st->dst_off + st->bytes; b++)
          writer[r][b] = i;
      bool comp = st->kind == TPF_STEP_GEMM || st->kind == TPF_STEP_REDUCE ||
                  st->kind == TPF_STEP_PEER_REDUCE;
      if (comp && st->d.id == TPF_MAT_BUF) {
        assert_true(view_ok(&st->d, st->d.off_bytes, st->m, st->n, g->e, MAXB));
        FOR_VIEW_BYTES(&st->d, st->d.off_bytes, st->m, st->n, g->e, b) writer[r][b] = i;
      }
    }
  }
  /* Consumers. */
  for (int r = 0; r < P; r++) {
    const tpf_schedule *s = &g->mut[r];
    for (int i = 0; i < s->nsteps; i++) {
      const tpf_step *st = &s->steps[i];
      int views = 0;
      if (st->kind == TPF_STEP_SEND) {
        for (uint64_t b = st->src_off; b < st->src_off + st->bytes; b++) {
          int w = writer[r][b];
          if (w >= 0 && !anc[r][i][w])
            return order_fail(why, wn, "rank %d step %d: sends a byte before it is produced", r, i);
        }
        continue;
      }
      if (st->kind == TPF_STEP_GEMM && st->a.id == TPF_MAT_BUF) views = 1;
      if (st->kind == TPF_STEP_REDUCE || st->kind == TPF_STEP_PEER_REDUCE) views = (int)st->count;
      /* The barriers this step comes after, and whether one comes after it. */
      int passed[TPF_MAX_TAGS], np = 0;
      bool done = false;
      for (int tg = 0; tg < TPF_MAX_TAGS && views > 0; tg++) {
        int br = bar[r][tg];
        if (br < 0) continue;
        if (anc[r][i][br]) passed[np++] = tg;
        done = done || anc[r][br][i];
      }
      for (int t = 0; t < views; t++) {
        int q = st->kind == TPF_STEP_PEER_REDUCE ? (r + t) % P : r;
        int last_ok = -2; /* producer already found published */
        uint64_t shift = st->kind == TPF_STEP_REDUCE ? (uint64_t)t * st->stride_bytes : 0;
        uint64_t off = st->a.off_bytes + shift;
        uint64_t cols = st->kind == TPF_STEP_GEMM ? st->k : st->n;
        assert_true(view_ok(&st->a, off, st->m, cols, g->e, MAXB));
        FOR_VIEW_BYTES(&st->a, off, st->m, cols, g->e, b) {
          int w = writer[q][b];
          if (q == r) {
            if (w >= 0 && w != i && !anc[r][i][w])
              return order_fail(why, wn, "rank %d step %d: reads a byte before it is produced", r,
                                i);
            continue;
          }
          bool seen = w < 0 || w == last_ok;
          for (int j = 0; j < np && !seen; j++)
            seen = bar[q][passed[j]] >= 0 && anc[q][bar[q][passed[j]]][w];
          if (seen) last_ok = w;
          if (!seen)
            return order_fail(why, wn, "rank %d step %d: pulls a byte not published by a barrier",
                              r, i);
          if (!done)
            return order_fail(why, wn, "rank %d step %d: pulls a byte no later barrier protects", r,
                              i);
        }
      }
    }
  }
  return true;
}

/* With one rank a BARRIER synchronises with nobody (both backends return at once) and an
 * in-place PEER_REDUCE sums one view into itself: deleting either changes nothing. */
static bool p1_noop(const group *g, const tpf_step *st) {
  if (g->P != 1) return false;
  if (st->kind == TPF_STEP_BARRIER) return true;
  return st->kind == TPF_STEP_PEER_REDUCE && st->count == 1 && st->d.id == TPF_MAT_BUF &&
         st->d.off_bytes == st->a.off_bytes && st->d.ld == st->a.ld && st->d.row == st->a.row &&
         st->d.col == st->a.col;
}

/* ---- running one mutation ---- */

static int mech_verdict(const group *g, const char **why);

static void verdict_check(group *g, int verdict, const char *why) {
  char owhy[160] = "";
  if (verdict == MECH) verdict = mech_verdict(g, &why);
  cnt.tried++;
  tpf_status rc = tpf_schedule_check(g->mut, g->P);
  const char *msg = tpf_last_error();
  bool rejected = rc == TPF_EINVAL && strstr(msg, "schedule check: rank ") != NULL;
  if (rc != TPF_OK && !rejected) {
    char w[200];
    snprintf(w, sizeof w, "BAD STATUS %s (%s)", tpf_status_name(rc), msg);
    violation(w);
    return;
  }
  if (verdict == ORDER) {
    if (!oracle_order(g, owhy, sizeof owhy)) {
      verdict = MUST_REJECT;
      why = owhy;
    } else {
      if (rejected && strstr(msg, "deadlocks"))
        cnt.deadlocks++;
      else if (rejected) {
        char w[200];
        snprintf(w, sizeof w, "OVER-STRICT: the oracle finds no hazard but: %s", msg);
        violation(w);
      } else
        cnt.order_accepted++;
      if (rejected) cnt.rejected++;
      return;
    }
  }
  if (verdict == MUST_REJECT) {
    if (rejected) {
      cnt.rejected++;
    } else {
      violation(why ? why : "ACCEPTED, must be rejected");
    }
    return;
  }
  if (verdict == UNDETECTABLE) {
    if (rejected)
      cnt.rejected++;
    else
      cnt.undetectable++;
    return;
  }
  if (rejected) {
    cnt.rejected++;
    cnt.harmless_rejected++;
  } else {
    cnt.harmless_accepted++;
  }
}

/* ---- step fields ---- */

enum {
  F_KIND,
  F_STREAM,
  F_NDEPS,
  F_DEP0,
  F_DEP1,
  F_DEP2,
  F_DEP3,
  F_PEER,
  F_TAG,
  F_CHUNK,
  F_SRC,
  F_DST,
  F_BYTES,
  F_A_ID,
  F_A_OFF,
  F_A_LD,
  F_A_ROW,
  F_A_COL,
  F_W_ID,
  F_W_OFF,
  F_W_LD,
  F_W_ROW,
  F_W_COL,
  F_D_ID,
  F_D_OFF,
  F_D_LD,
  F_D_ROW,
  F_D_COL,
  F_M,
  F_N,
  F_K,
  F_STRIDE,
  F_COUNT,
  F_XPORT,
  F_SMS,
  F_NUM
};

typedef struct {
  const char *name;
  size_t off;
  int width; /* bytes; negative: signed */
} sfield;

#define SF(id, member, w) [id] = {#member, offsetof(tpf_step, member), w}
static const sfield sfields[F_NUM] = {
    SF(F_KIND, kind, 1),
    SF(F_STREAM, stream, 1),
    SF(F_NDEPS, ndeps, 1),
    SF(F_DEP0, deps[0], 2),
    SF(F_DEP1, deps[1], 2),
    SF(F_DEP2, deps[2], 2),
    SF(F_DEP3, deps[3], 2),
    SF(F_PEER, peer, -4),
    SF(F_TAG, tag, 4),
    SF(F_CHUNK, chunk, -4),
    SF(F_SRC, src_off, 8),
    SF(F_DST, dst_off, 8),
    SF(F_BYTES, bytes, 8),
    SF(F_A_ID, a.id, 1),
    SF(F_A_OFF, a.off_bytes, 8),
    SF(F_A_LD, a.ld, 8),
    SF(F_A_ROW, a.row, 8),
    SF(F_A_COL, a.col, 8),
    SF(F_W_ID, w.id, 1),
    SF(F_W_OFF, w.off_bytes, 8),
    SF(F_W_LD, w.ld, 8),
    SF(F_W_ROW, w.row, 8),
    SF(F_W_COL, w.col, 8),
    SF(F_D_ID, d.id, 1),
    SF(F_D_OFF, d.off_bytes, 8),
    SF(F_D_LD, d.ld, 8),
    SF(F_D_ROW, d.row, 8),
    SF(F_D_COL, d.col, 8),
    SF(F_M, m, 8),
    SF(F_N, n, 8),
    SF(F_K, k, 8),
    SF(F_STRIDE, stride_bytes, 8),
    SF(F_COUNT, count, 4),
    SF(F_XPORT, xport, 1),
    SF(F_SMS, sm_budget, 1),
};

static uint64_t get_field(const tpf_step *st, int f) {
  const unsigned char *p = (const unsigned char *)st + sfields[f].off;
  switch (sfields[f].width) {
  case 1:
    return *p;
  case 2: {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
  }
  case 4: {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
  }
  case -4: {
    int32_t v;
    memcpy(&v, p, 4);
    return (uint64_t)(int64_t)v;
  }
  default: {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
  }
  }
}

static void set_field(tpf_step *st, int f, uint64_t v) {
  unsigned char *p = (unsigned char *)st + sfields[f].off;
  switch (sfields[f].width) {
  case 1:
    *p = (unsigned char)v;
    break;
  case 2: {
    uint16_t x = (uint16_t)v;
    memcpy(p, &x, 2);
    break;
  }
  case 4:
  case -4: {
    uint32_t x = (uint32_t)v;
    memcpy(p, &x, 4);
    break;
  }
  default:
    memcpy(p, &v, 8);
    break;
  }
}

/* Whether the step's kind uses the field at all (tpflex_backend.h; both backends read exactly
 * these). A field a kind does not use cannot change what a backend does: HARMLESS. */
static bool field_used(const tpf_step *st, int f) {
  int k = st->kind;
  bool xfer = k == TPF_STEP_SEND || k == TPF_STEP_RECV;
  bool red = k == TPF_STEP_REDUCE || k == TPF_STEP_PEER_REDUCE;
  bool comp = k == TPF_STEP_GEMM || red;
  switch (f) {
  case F_KIND:
  case F_STREAM:
  case F_NDEPS:
    return true;
  case F_DEP0:
  case F_DEP1:
  case F_DEP2:
  case F_DEP3:
    return f - F_DEP0 < st->ndeps; /* entries past ndeps are never read */
  case F_PEER:
    return xfer; /* elsewhere the checker insists on -1, which is stricter than needed */
  case F_TAG:
    return xfer || k == TPF_STEP_BARRIER;
  case F_CHUNK:
    return false; /* informational: only printed in timeout messages and traces */
  case F_SRC:
    return k == TPF_STEP_SEND; /* a RECV's src_off is descriptive: nothing reads it */
  case F_DST:
  case F_BYTES:
    return xfer; /* the RECV's copy describes what lands; it must agree with the SEND */
  case F_A_ID:
  case F_A_OFF:
  case F_A_LD:
  case F_A_ROW:
  case F_A_COL:
  case F_D_ID:
  case F_D_OFF:
  case F_D_LD:
  case F_D_ROW:
  case F_D_COL:
  case F_M:
  case F_N:
    return comp;
  case F_W_ID:
  case F_W_OFF:
  case F_W_LD:
  case F_W_ROW:
  case F_W_COL:
  case F_K:
    return k == TPF_STEP_GEMM;
  case F_STRIDE:
    return k == TPF_STEP_REDUCE && st->count > 1; /* view t starts at t * stride: t = 0 only */
  case F_COUNT:
    return red;
  case F_XPORT:
    return k == TPF_STEP_SEND || red; /* how the bytes move; nothing else moves any */
  case F_SMS:
    return k == TPF_STEP_GEMM;
  default:
    return true;
  }
}

static bool order_field(int f) {
  return f >= F_STREAM && f <= F_DEP3;
}

/* Candidate new values: ADD applies a delta to each rank's own value, SET writes a constant. */
typedef struct {
  bool add;
  uint64_t v; /* delta (two's complement) or value */
} cand;

static int cands_for(const group *g, const tpf_step *st, int f, int i, cand *c) {
  int n = 0;
#define ADD(d) (c[n++] = (cand){true, (uint64_t)(d)})
#define SET(x) (c[n++] = (cand){false, (uint64_t)(x)})
  uint64_t act = g->orig[0].active_bytes;
  switch (f) {
  case F_KIND:
    for (int k = 0; k <= TPF_STEP_KIND_COUNT; k++)
      SET(k);
    SET(255);
    break;
  case F_STREAM:
    for (int k = 0; k <= TPF_NUM_STREAMS; k++)
      SET(k);
    break;
  case F_NDEPS:
    for (int k = 0; k <= TPF_STEP_MAX_DEPS + 1; k++)
      SET(k);
    break;
  case F_DEP0:
  case F_DEP1:
  case F_DEP2:
  case F_DEP3:
    /* the handshake, neighbours of the old dep, the step itself and the next (forward) */
    SET(0);
    ADD(1);
    ADD(-1);
    SET(i);
    SET(i + 1);
    SET(65535);
    break;
  case F_PEER:
    for (int k = -2; k <= g->P; k++)
      SET((int64_t)k);
    break;
  case F_TAG:
    ADD(1);
    ADD(-1);
    SET(0);
    SET(g->v->splits > 0 ? g->v->splits : 1);
    SET(TPF_MAX_TAGS - 1);
    SET(TPF_MAX_TAGS);
    SET(UINT32_MAX);
    break;
  case F_CHUNK:
    ADD(1);
    SET(-1);
    break;
  case F_A_ID:
  case F_W_ID:
  case F_D_ID:
    for (int k = 0; k <= TPF_MAT_D + 1; k++)
      SET(k);
    break;
  case F_COUNT:
    ADD(1);
    ADD(-1);
    SET(0);
    SET(1);
    SET(g->P);
    SET(TPF_MAX_RANKS + 1);
    SET(UINT32_MAX);
    break;
  case F_XPORT:
    for (int k = 0; k <= TPF_XPORT_COUNT; k++)
      SET(k);
    SET(255);
    break;
  case F_SMS:
    for (int k = 0; k <= TPF_SMS_COUNT; k++)
      SET(k);
    SET(255);
    break;
  default: {
    const int64_t d[] = {
        1, -1, (int64_t)g->e, (int64_t)g->S, -(int64_t)g->S, (int64_t)g->pitch, (int64_t)g->R};
    for (size_t j = 0; j < TPF_ARRAY_SIZE(d); j++)
      ADD(d[j]);
    SET(0);
    SET(act);
    SET(UINT64_MAX);
    SET(1ull << 62);
    (void)st;
    break;
  }
  }
#undef ADD
#undef SET
  return n;
}

static uint64_t apply(cand c, uint64_t old) {
  return c.add ? old + c.v : c.v;
}

/* The mechanism oracle (tpflex_backend.h, decided here from what each value means): harmful when
 * a step moves bytes by a class its kind cannot use, the operation's SENDs use two classes, a
 * GEMM leaves SMs to kernels its schedule does not run, or a rank's handshake skips a peer it
 * must see start (one it exchanges bytes with; every peer beside a BARRIER, a PEER_REDUCE or a
 * copy kernel), names itself or a rank outside the group. */
static int mech_verdict(const group *g, const char **why) {
  int send_class = -1;
  for (int r = 0; r < g->P; r++) {
    const tpf_schedule *s = &g->mut[r];
    uint64_t need = 0, grp = (1ull << (unsigned)g->P) - 1u, me = 1ull << (unsigned)r;
    bool all = false, kernels = false;
    for (int i = 0; i < s->nsteps; i++) {
      const tpf_step *st = &s->steps[i];
      const int k = st->kind;
      const bool red = k == TPF_STEP_REDUCE || k == TPF_STEP_PEER_REDUCE;
      const bool fits = k == TPF_STEP_SEND ? st->xport == TPF_XPORT_COPY_ENGINE ||
                                                 st->xport == TPF_XPORT_COPY_KERNEL
                        : red ? st->xport == TPF_XPORT_REDUCE_KERNEL
                              : st->xport == TPF_XPORT_NONE;
      if (!fits) return *why = "a transport class the step's kind cannot use", MUST_REJECT;
      if (k == TPF_STEP_SEND && send_class >= 0 && st->xport != send_class)
        return *why = "two copy classes in one operation", MUST_REJECT;
      if (k == TPF_STEP_SEND) send_class = st->xport;
      if ((k == TPF_STEP_SEND || k == TPF_STEP_RECV) && st->peer >= 0 && st->peer < 64)
        need |= 1ull << (unsigned)st->peer;
      kernels = kernels || st->xport == TPF_XPORT_COPY_KERNEL || red;
      all = all || k == TPF_STEP_BARRIER || k == TPF_STEP_PEER_REDUCE ||
            st->xport == TPF_XPORT_COPY_KERNEL;
    }
    for (int i = 0; i < s->nsteps; i++) {
      const tpf_step *st = &s->steps[i];
      if (st->sm_budget >= TPF_SMS_COUNT ||
          (st->kind != TPF_STEP_GEMM && st->sm_budget != TPF_SMS_ALL) ||
          (st->sm_budget == TPF_SMS_LEAVE_COMM && !kernels))
        return *why = "an SM budget no kernel of the schedule uses", MUST_REJECT;
    }
    need = (all ? grp : need) & ~me;
    if ((s->handshake_peers & ~grp) || (s->handshake_peers & me) || (need & ~s->handshake_peers))
      return *why = "a handshake that skips a peer it must see start", MUST_REJECT;
  }
  *why = "another mechanism the backend runs correctly (a superset of peers, another class)";
  return HARMLESS;
}

/* Special verdicts for value changes of used fields that are harmless after all. */
static int value_verdict(const group *g, const tpf_step *st, int f, uint64_t nv, const char **why) {
  *why = NULL;
  if (order_field(f)) return ORDER;
  if (f == F_XPORT || f == F_SMS) return MECH;
  if (!field_used(st, f)) {
    *why = "field unused by this kind";
    return HARMLESS;
  }
  if (f == F_TAG && p1_noop(g, st)) {
    *why = "P = 1: the barrier waits for nobody";
    return HARMLESS;
  }
  /* With P = 1 a REDUCE and a PEER_REDUCE of count 1 both sum the one view of this rank. */
  if (f == F_KIND && g->P == 1 && st->count == 1 &&
      ((st->kind == TPF_STEP_REDUCE && nv == TPF_STEP_PEER_REDUCE) ||
       (st->kind == TPF_STEP_PEER_REDUCE && nv == TPF_STEP_REDUCE))) {
    *why = "P = 1: REDUCE and PEER_REDUCE of one view are the same";
    return HARMLESS;
  }
  return MUST_REJECT;
}

static bool tag_in_use(const tpf_schedule *s, uint32_t tag, int except) {
  for (int i = 0; i < s->nsteps; i++)
    if (i != except && s->steps[i].tag == tag &&
        (s->steps[i].kind == TPF_STEP_BARRIER || s->steps[i].kind == TPF_STEP_SEND ||
         s->steps[i].kind == TPF_STEP_RECV))
      return true;
  return false;
}

static void step_field_mutations(group *g, int mr) {
  const tpf_schedule *o = &g->orig[mr];
  for (int i = 0; i < o->nsteps; i++) {
    const tpf_step *st = &o->steps[i];
    for (int f = 0; f < F_NUM; f++) {
      cand c[32];
      int n = cands_for(g, st, f, i, c);
      if (!field_used(st, f) && !order_field(f) && n > 1)
        n = 1; /* an unused field: one value documents it */
      for (int j = 0; j < n; j++) {
        uint64_t old = get_field(st, f), nv = apply(c[j], old);
        if (f != F_PEER && f != F_CHUNK && sfields[f].width != 8 &&
            nv >= (1ull << (8 * (unsigned)sfields[f].width)))
          nv &= (1ull << (8 * (unsigned)sfields[f].width)) - 1;
        if (nv == old || (sfields[f].width == -4 && (int32_t)nv == (int32_t)old)) continue;
        const char *why;
        int verdict = value_verdict(g, st, f, nv, &why);
        /* One rank. */
        reset(g);
        set_field(&g->mut[mr].steps[i], f, nv);
        snprintf(g_desc, sizeof g_desc, "%s P=%d %s rank %d step %d (%s) %s: %llu -> %llu",
                 g->v->name, g->P, tpf_dtype_name(g->dt), mr, i, tpf_step_kind_name(st->kind),
                 sfields[f].name, (unsigned long long)old, (unsigned long long)nv);
        snprintf(g_key, sizeof g_key, "one %s %s", tpf_step_kind_name(st->kind), sfields[f].name);
        verdict_check(g, verdict, why);
        if (g->P == 1) continue;
        /* Every rank alike (the same step index has the same kind on every rank here). */
        bool uniform = true;
        for (int r = 0; r < g->P; r++)
          uniform = uniform && i < g->orig[r].nsteps && g->orig[r].steps[i].kind == st->kind;
        /* Every-rank variants of the wide fields: the consistent shifts only (a constant
         * written on every rank is mostly a one-rank fault many times over). */
        if (!uniform || (!field_used(st, f) && !order_field(f)) ||
            (sfields[f].width == 8 && !c[j].add))
          continue;
        reset(g);
        int v2 = verdict;
        for (int r = 0; r < g->P; r++) {
          uint64_t o2 = get_field(&g->orig[r].steps[i], f);
          set_field(&g->mut[r].steps[i], f, apply(c[j], o2));
        }
        /* A barrier tag renamed on every rank to a tag nobody uses is the same barrier. */
        if (f == F_TAG && st->kind == TPF_STEP_BARRIER && nv < TPF_MAX_TAGS &&
            !tag_in_use(o, (uint32_t)nv, i)) {
          v2 = HARMLESS;
          why = "barrier renamed consistently";
        }
        /* A transfer tag renamed on every rank to a tag nobody uses keeps every pair matched
         * (the peer's RECV is renamed with the same delta only if it has the same index; else
         * the pairs break and the checker must say so). */
        if (f == F_TAG && (st->kind == TPF_STEP_SEND || st->kind == TPF_STEP_RECV))
          v2 = MUST_REJECT;
        snprintf(g_desc, sizeof g_desc, "%s P=%d %s every rank step %d (%s) %s %s %llu", g->v->name,
                 g->P, tpf_dtype_name(g->dt), i, tpf_step_kind_name(st->kind), sfields[f].name,
                 c[j].add ? "+=" : "=", (unsigned long long)c[j].v);
        snprintf(g_key, sizeof g_key, "all %s %s", tpf_step_kind_name(st->kind), sfields[f].name);
        verdict_check(g, v2, why);
      }
    }
  }
}

/* ---- structural mutations ---- */

static void duplicate_step(tpf_schedule *s, int idx) {
  memmove(&s->steps[idx + 1], &s->steps[idx], (size_t)(s->nsteps - idx) * sizeof *s->steps);
  s->nsteps++;
  for (int i = idx + 2; i < s->nsteps; i++)
    for (int j = 0; j < s->steps[i].ndeps; j++)
      if (s->steps[i].deps[j] > idx) s->steps[i].deps[j]++;
}

static void swap_steps(tpf_schedule *s, int a) {
  tpf_step t = s->steps[a];
  s->steps[a] = s->steps[a + 1];
  s->steps[a + 1] = t;
  for (int i = 0; i < s->nsteps; i++)
    for (int j = 0; j < s->steps[i].ndeps; j++) {
      uint16_t *d = &s->steps[i].deps[j];
      *d = *d == a ? (uint16_t)(a + 1) : *d == a + 1 ? (uint16_t)a : *d;
    }
}

static void structural_mutations(group *g, int mr) {
  int n = g->orig[mr].nsteps;
  for (int i = 0; i < n; i++) {
    const char *kn = tpf_step_kind_name(g->orig[mr].steps[i].kind);
    /* Deleting a step loses its effect (a produced byte, a matched transfer, a barrier). */
    int dv = p1_noop(g, &g->orig[mr].steps[i]) ? HARMLESS : MUST_REJECT;
    reset(g);
    tpf_test_remove_step(&g->mut[mr], i);
    snprintf(g_desc, sizeof g_desc, "%s P=%d delete rank %d step %d (%s)", g->v->name, g->P, mr, i,
             kn);
    snprintf(g_key, sizeof g_key, "delete-one %s %s", g->v->name, kn);
    verdict_check(g, dv, NULL);
    reset(g);
    for (int r = 0; r < g->P; r++)
      if (i < g->orig[r].nsteps) tpf_test_remove_step(&g->mut[r], i);
    snprintf(g_desc, sizeof g_desc, "%s P=%d delete step %d (%s) on every rank", g->v->name, g->P,
             i, kn);
    snprintf(g_key, sizeof g_key, "delete-all %s %s", g->v->name, kn);
    verdict_check(g, dv, NULL);
    /* Duplicating a step repeats a write, a transfer tag, a barrier tag or the handshake. */
    reset(g);
    duplicate_step(&g->mut[mr], i);
    snprintf(g_desc, sizeof g_desc, "%s P=%d duplicate rank %d step %d (%s)", g->v->name, g->P, mr,
             i, kn);
    snprintf(g_key, sizeof g_key, "duplicate %s %s", g->v->name, kn);
    verdict_check(g, MUST_REJECT, NULL);
    /* Swapping neighbours changes only the order. */
    if (i + 1 < n) {
      reset(g);
      swap_steps(&g->mut[mr], i);
      snprintf(g_desc, sizeof g_desc, "%s P=%d swap rank %d steps %d, %d", g->v->name, g->P, mr, i,
               i + 1);
      snprintf(g_key, sizeof g_key, "swap %s %s", g->v->name, kn);
      verdict_check(g, ORDER, NULL);
    }
  }
}

/* ---- header mutations ---- */

enum {
  H_TP,
  H_RANK,
  H_ALGO,
  H_COLL,
  H_DTYPE,
  H_SPLITS,
  H_AGG,
  H_ROWS,
  H_COLS,
  H_CROWS,
  H_CBYTES,
  H_REG,
  H_ACT,
  H_GM,
  H_GN,
  H_GK,
  H_NCS,
  H_NSTEPS,
  H_HSPEERS,
  H_NUM
};
static const char *const hnames[H_NUM] = {"tp_size",
                                          "rank",
                                          "algo",
                                          "coll",
                                          "dtype",
                                          "num_splits",
                                          "aggregate",
                                          "rows",
                                          "cols",
                                          "chunk_rows",
                                          "chunk_bytes",
                                          "registered_bytes",
                                          "active_bytes",
                                          "gemm_m",
                                          "gemm_n",
                                          "gemm_k",
                                          "num_compute_streams",
                                          "nsteps",
                                          "handshake_peers"};

static uint64_t hget(const tpf_schedule *s, int f) {
  switch (f) {
  case H_TP:
    return (uint64_t)(int64_t)s->tp_size;
  case H_RANK:
    return (uint64_t)(int64_t)s->rank;
  case H_ALGO:
    return (uint64_t)s->algo;
  case H_COLL:
    return (uint64_t)s->coll;
  case H_DTYPE:
    return (uint64_t)s->dtype;
  case H_SPLITS:
    return (uint64_t)(int64_t)s->num_splits;
  case H_AGG:
    return s->aggregate;
  case H_ROWS:
    return s->rows;
  case H_COLS:
    return s->cols;
  case H_CROWS:
    return s->chunk_rows;
  case H_CBYTES:
    return s->chunk_bytes;
  case H_REG:
    return s->registered_bytes;
  case H_ACT:
    return s->active_bytes;
  case H_GM:
    return s->gemm_m;
  case H_GN:
    return s->gemm_n;
  case H_GK:
    return s->gemm_k;
  case H_NCS:
    return (uint64_t)(int64_t)s->num_compute_streams;
  case H_HSPEERS:
    return s->handshake_peers;
  default:
    return (uint64_t)(int64_t)s->nsteps;
  }
}

static void hset(tpf_schedule *s, int f, uint64_t v) {
  switch (f) {
  case H_TP:
    s->tp_size = (int)(int64_t)v;
    break;
  case H_RANK:
    s->rank = (int)(int64_t)v;
    break;
  case H_ALGO:
    s->algo = (tpf_algo)v;
    break;
  case H_COLL:
    s->coll = (tpf_coll)v;
    break;
  case H_DTYPE:
    s->dtype = (tpf_dtype)v;
    break;
  case H_SPLITS:
    s->num_splits = (int)(int64_t)v;
    break;
  case H_AGG:
    s->aggregate = v != 0;
    break;
  case H_ROWS:
    s->rows = v;
    break;
  case H_COLS:
    s->cols = v;
    break;
  case H_CROWS:
    s->chunk_rows = v;
    break;
  case H_CBYTES:
    s->chunk_bytes = v;
    break;
  case H_REG:
    s->registered_bytes = v;
    break;
  case H_ACT:
    s->active_bytes = v;
    break;
  case H_GM:
    s->gemm_m = v;
    break;
  case H_GN:
    s->gemm_n = v;
    break;
  case H_GK:
    s->gemm_k = v;
    break;
  case H_NCS:
    s->num_compute_streams = (int)(int64_t)v;
    break;
  case H_HSPEERS:
    s->handshake_peers = v;
    break;
  default:
    s->nsteps = (int)(int64_t)v;
    break;
  }
}

static int header_cands(const group *g, int f, uint64_t v, uint64_t *out) {
  int n = 0;
  switch (f) {
  case H_HSPEERS: /* every bit flipped in turn (this rank's, one past the group), none, all */
    for (int q = 0; q <= g->P; q++)
      out[n++] = v ^ (1ull << (unsigned)q);
    out[n++] = 0;
    out[n++] = UINT64_MAX;
    break;
  case H_ALGO:
    for (int k = 0; k <= TPF_ALGO_COUNT; k++)
      out[n++] = (uint64_t)k;
    break;
  case H_COLL:
    for (int k = 0; k <= TPF_COLL_COUNT; k++)
      out[n++] = (uint64_t)k;
    break;
  case H_DTYPE:
    for (int k = 0; k <= TPF_DTYPE_COUNT; k++)
      out[n++] = (uint64_t)k;
    break;
  case H_AGG:
    out[n++] = !v;
    break;
  case H_NSTEPS: /* the copies have EXTRA zeroed steps behind the last one */
    out[n++] = v - 1;
    out[n++] = v + 1;
    out[n++] = 0;
    out[n++] = (uint64_t)-1;
    out[n++] = 65536;
    break;
  case H_TP:
  case H_RANK:
  case H_SPLITS:
  case H_NCS:
    for (int k = -1; k <= 2 * g->P + 1; k++)
      out[n++] = (uint64_t)(int64_t)k;
    out[n++] = 65;
    break;
  default:
    out[n++] = v + 1;
    out[n++] = v - 1;
    out[n++] = v + (uint64_t)g->P;
    out[n++] = v + g->e;
    out[n++] = v + g->S;
    out[n++] = 2 * v;
    out[n++] = 0;
    out[n++] = UINT64_MAX;
    out[n++] = 1ull << 62;
    break;
  }
  return n;
}

/* Header fields no backend reads and the checker cannot pin down beyond validity: the split
 * count and the aggregate flag describe how the builder cut the work (the steps are verified on
 * their own), registered bytes only bound the active bytes, and extra declared compute streams
 * that no step uses change nothing. */
static int header_verdict(const group *g, int f, uint64_t nv, bool all) {
  if (f == H_HSPEERS) return MECH; /* per rank, not a header every rank must share */
  int used = 0;
  for (int r = 0; r < g->P; r++)
    for (int i = 0; i < g->orig[r].nsteps; i++) {
      const tpf_step *st = &g->orig[r].steps[i];
      if ((st->kind == TPF_STEP_GEMM || st->kind == TPF_STEP_REDUCE) && st->stream + 1 > used)
        used = st->stream + 1;
    }
  if (!all && g->P > 1) return MUST_REJECT; /* one rank disagrees with the others */
  /* One rank: AG and RS leave the buffer as it is, RING RS's one slot is the PIPELINE layout;
   * an accepted relabelling was verified step by step against the operation it names. */
  if (g->P == 1 && (f == H_ALGO || f == H_COLL)) return HARMLESS;
  /* nsteps - 1 drops the last step; with one rank a closing BARRIER is a no-op. */
  if (f == H_NSTEPS && nv + 1 == (uint64_t)g->orig[0].nsteps && p1_noop(g, &g->orig[0].steps[nv]))
    return HARMLESS;
  /* Relabelling the element type as another of the same size moves no byte: no step and no
   * other header field can contradict it, so only the communicator (which the checker never
   * sees) knows better. Counted apart: harmful, but outside what a checker of schedules can
   * know. */
  if (f == H_DTYPE && nv < TPF_DTYPE_COUNT && tpf_dtype_size((tpf_dtype)nv) == g->e)
    return UNDETECTABLE;
  if (f == H_SPLITS || f == H_AGG) return HARMLESS;
  if (f == H_REG && nv >= g->orig[0].active_bytes) return HARMLESS;
  if (f == H_NCS && (int64_t)nv >= used && (int64_t)nv <= TPF_MAX_COMPUTE_STREAMS) return HARMLESS;
  return MUST_REJECT;
}

static void header_mutations(group *g, int mr) {
  for (int f = 0; f < H_NUM; f++) {
    uint64_t vals[32];
    int n = header_cands(g, f, hget(&g->orig[mr], f), vals);
    for (int j = 0; j < n; j++) {
      for (int all = 0; all < 2; all++) {
        if (all && g->P == 1) continue;
        reset(g);
        bool changed = false;
        for (int r = 0; r < g->P; r++) {
          if (!all && r != mr) continue;
          uint64_t old = hget(&g->orig[r], f);
          /* rank and tp_size: offsets keep their meaning relative to each rank */
          uint64_t nv = (f == H_RANK && all) ? old + vals[j] - hget(&g->orig[mr], f) : vals[j];
          hset(&g->mut[r], f, nv);
          changed = changed || hget(&g->mut[r], f) != old;
        }
        if (!changed) continue;
        snprintf(g_desc, sizeof g_desc, "%s P=%d header %s = %llu on %s", g->v->name, g->P,
                 hnames[f], (unsigned long long)vals[j], all ? "every rank" : "one rank");
        snprintf(g_key, sizeof g_key, "header %s %s", hnames[f], all ? "all" : "one");
        verdict_check(g, header_verdict(g, f, vals[j], all || g->P == 1), NULL);
      }
    }
  }
}

/* ---- the test ---- */

static void test_schedule_mutations(void **state) {
  (void)state;
  group *g = &g_grp;
  int groups = 0;
  memset(&cnt, 0, sizeof cnt);
  for (int P = 1; P <= MAXP; P++) {
    for (size_t vi = 0; vi < TPF_ARRAY_SIZE(variants); vi++) {
      const variant *v = &variants[vi];
      if (v->aggregate && P % 2) continue;
      if (P == 5 && v->algo != TPF_ALGO_RING)
        continue; /* runtime: P = 3 is the odd case of the others */
      tpf_dtype dts[2] = {TPF_FP32, TPF_BF16};
      for (int di = 0; di < (P == 4 ? 2 : 1); di++) {
        build_group(g, v, P, dts[di]);
        int mr = (int)(vi + (size_t)P) % P; /* the mutated rank rotates over the groups */
        if (di == 0) /* bf16 (P = 4): the element size matters to headers and views only */
          step_field_mutations(g, mr);
        structural_mutations(g, mr);
        header_mutations(g, mr);
        free_group(g);
        groups++;
      }
    }
  }
  printf("schedule mutations: %d groups, %ld tried, %ld rejected (%ld of them harmless or "
         "deadlocking), %ld accepted as harmless, %ld order changes accepted as hazard-free, "
         "%ld same-size dtype relabellings accepted (undetectable), %ld verdict violations\n",
         groups, cnt.tried, cnt.rejected, cnt.harmless_rejected + cnt.deadlocks,
         cnt.harmless_accepted, cnt.order_accepted, cnt.undetectable, cnt.bad);
  for (int i = 0; i < nviol; i++)
    printf("  VIOLATION x%ld [%s] e.g. %s\n", viol[i].n, viol[i].key, viol[i].first);
  assert_int_equal(cnt.bad, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_schedule_mutations),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
