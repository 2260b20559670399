/* The independent schedule checker.
 *
 * Method: the checker never calls the builders and never uses their formulas. It takes all P
 * ranks' step lists of one operation and re-derives what must hold from the layout queries
 * (active bytes, the local shard, chunk rows) and from what each algorithm means:
 *  1. Headers: every rank describes the same operation, the layout they name is valid, and a
 *     collective's GEMM is over the T rows with H as its k (AG) or n (RS).
 *  2. Structure: kinds, streams, peers, tags and counts in range; deps point backwards; step 0
 *     is the only HANDSHAKE and every other step is ordered after it (P = 1 may have none: its
 *     schedule is the operation's one GEMM, into D for RS); references to user
 *     matrices carry no offset and no ld of their own.
 *  3. Matching: every SEND meets exactly one RECV on its peer with the same tag, bytes and
 *     destination; a (peer, tag) pair is used once per direction; barrier tags agree across
 *     ranks and never double as transfer tags.
 *  4. Progress: a cross-rank simulation (RECV waits for its SEND, BARRIER for every rank's
 *     arrival) completes every step, so the schedule cannot hang.
 *  5. Bytes: per rank, the initial content (the local shard for AG, the whole prefix for BULK
 *     RS, nothing otherwise) and all writes (RECV, GEMM into the buffer, in-place reductions)
 *     tile [0, active_bytes) exactly once; every read lies in [0, active_bytes) and only reads
 *     bytes that were initial or written by a step ordered before it (deps, same-stream order,
 *     transitively; peers' bytes through a BARRIER both sides passed); a pull from peers is
 *     followed by a BARRIER, so no owner reuses bytes a peer still reads.
 *  6. Outputs and meaning: GEMM/REDUCE outputs tile the user output exactly once; AG moves
 *     chunks without relocating them; every RS reduction sums, for its output rows and columns,
 *     the partials of all P ranks for exactly those token rows and weight rows (partials are
 *     tracked from the GEMM that produced them through the transfers that carried them); BULK
 *     RS reduces every rank's chunk (its partials are initial data, so no byte tiling sees a
 *     missing reduction).
 * Every failure returns TPF_EINVAL with the rank, the step and what was wrong.
 */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

typedef unsigned long long ull;

#define BAD(r, i, kind, fmt, ...)                                                                  \
  tpf_set_error(TPF_EINVAL, "schedule check: rank %d step %d (%s): " fmt, (r), (i),                \
                tpf_step_kind_name(kind), __VA_ARGS__)
#define BADH(r, fmt, ...)                                                                          \
  tpf_set_error(TPF_EINVAL, "schedule check: rank %d: " fmt, (r), __VA_ARGS__)

typedef struct {
  uint64_t lo, hi;
} ivl;

typedef struct {
  ivl *v;
  size_t n, cap;
} ivec;

typedef struct {
  uint64_t lo, hi;
  int step;
} wrt;

/* A partial product held in a buffer view: element (row0+i, col0+j) of view (off, ld) holds
 * origin's X row xrow0+i times W row wrow0+j. */
typedef struct {
  int origin;
  uint64_t off, ld, row0, col0, m, n, xrow0, wrow0, lo, hi;
} prod;

typedef struct {
  const tpf_schedule *s;
  uint64_t *anc; /* nsteps x words bitset: transitive predecessors */
  int *prev;     /* previous step on the same stream, -1 if none */
  int *match;    /* SEND: the peer's RECV; RECV: the peer's SEND; else -1 */
  int *send_at;  /* P x TPF_MAX_TAGS: my SEND to q with tag t */
  int *recv_at;  /* P x TPF_MAX_TAGS: my RECV from q with tag t */
  int barrier[TPF_MAX_TAGS];
  bool has_init;
  ivl init;
  wrt *w;
  size_t nw;
  uint64_t (*wtags)[2]; /* per write: barrier tags of this rank it precedes */
  prod *pr;
  size_t npr, cappr;
} rank_state;

enum { MODE_RING_AG, MODE_BULK_AG, MODE_BULK_RS, MODE_RS };

typedef struct {
  int P, words, mode;
  uint64_t e, T, H, R, active;
  uint64_t out_rows, out_cols; /* the user output D */
  rank_state *rk;
} chk;

/* ---- interval helpers ---- */

static tpf_status ivec_push(ivec *a, uint64_t lo, uint64_t hi) {
  if (a->n == a->cap) {
    size_t cap = a->cap ? 2 * a->cap : 16;
    ivl *v = tpf__realloc(a->v, cap * sizeof *v);
    TPF_RETURN_IF(!v, TPF_ENOMEM, "schedule check: out of memory (%zu intervals)", cap);
    a->v = v;
    a->cap = cap;
  }
  a->v[a->n].lo = lo;
  a->v[a->n].hi = hi;
  a->n++;
  return TPF_OK;
}

static int cmp_ivl(const void *x, const void *y) {
  const ivl *a = x, *b = y;
  return a->lo < b->lo ? -1 : a->lo > b->lo ? 1 : 0;
}

/* Sorts and merges touching intervals. */
static void ivec_normalize(ivec *a) {
  if (a->n == 0) return;
  qsort(a->v, a->n, sizeof *a->v, cmp_ivl);
  size_t k = 0;
  for (size_t i = 1; i < a->n; i++) {
    if (a->v[i].lo <= a->v[k].hi) {
      if (a->v[i].hi > a->v[k].hi) a->v[k].hi = a->v[i].hi;
    } else {
      a->v[++k] = a->v[i];
    }
  }
  a->n = k + 1;
}

static bool ivec_covers(const ivec *norm, uint64_t lo, uint64_t hi) {
  size_t a = 0, b = norm->n;
  while (a < b) { /* first interval with lo > `lo` */
    size_t mid = (a + b) / 2;
    if (norm->v[mid].lo <= lo)
      a = mid + 1;
    else
      b = mid;
  }
  return a > 0 && norm->v[a - 1].hi >= hi;
}

/* The byte intervals of an m x ncols view of a registration, starting at `off`. */
static tpf_status view_bytes(const chk *c, int r, int i, int kind, const tpf_mref *v, uint64_t off,
                             uint64_t m, uint64_t ncols, ivec *out) {
  uint64_t end_col, start, row_bytes, len, t;
  if (v->ld == 0 || !tpf__add_u64(v->col, ncols, &end_col) || end_col > v->ld)
    return BAD(r, i, kind, "buffer view ld %llu cannot hold columns [%llu, %llu + %llu)",
               (ull)v->ld, (ull)v->col, (ull)v->col, (ull)ncols);
  bool ok = tpf__mul_u64(v->row, v->ld, &t) && tpf__add_u64(t, v->col, &t) &&
            tpf__mul_u64(t, c->e, &t) && tpf__add_u64(off, t, &start) &&
            tpf__mul_u64(v->ld, c->e, &row_bytes) && tpf__mul_u64(ncols, c->e, &len);
  uint64_t span;
  ok = ok && tpf__mul_u64(m, row_bytes, &span) && tpf__add_u64(start, span, &t);
  if (!ok)
    return BAD(r, i, kind, "buffer view at %llu row %llu overflows 64 bits", (ull)off, (ull)v->row);
  if (ncols == v->ld) return ivec_push(out, start, start + span);
  for (uint64_t k = 0; k < m; k++)
    TPF_CHECK(ivec_push(out, start + k * row_bytes, start + k * row_bytes + len));
  return TPF_OK;
}

static bool anc_has(const chk *c, int r, int i, int j) {
  return (c->rk[r].anc[(size_t)i * (size_t)c->words + (size_t)(j / 64)] >> (j % 64)) & 1u;
}

/* ---- 1. headers ---- */

static tpf_status check_headers(chk *c, const tpf_schedule *sc) {
  const tpf_schedule *z = &sc[0];
  for (int r = 0; r < c->P; r++) {
    const tpf_schedule *s = &sc[r];
    if (s->tp_size != c->P || s->rank != r)
      return BADH(r, "header says tp_size %d rank %d, expected %d and %d", s->tp_size, s->rank,
                  c->P, r);
    if (s->nsteps < 1 || !s->steps || s->nsteps > 65535)
      return BADH(r, "%d steps (steps %s)", s->nsteps, s->steps ? "set" : "NULL");
    if (s->algo != z->algo || s->coll != z->coll || s->dtype != z->dtype ||
        s->num_splits != z->num_splits || s->aggregate != z->aggregate || s->rows != z->rows ||
        s->cols != z->cols || s->chunk_rows != z->chunk_rows || s->chunk_bytes != z->chunk_bytes ||
        s->registered_bytes != z->registered_bytes || s->active_bytes != z->active_bytes ||
        s->gemm_m != z->gemm_m || s->gemm_n != z->gemm_n || s->gemm_k != z->gemm_k ||
        s->num_compute_streams != z->num_compute_streams)
      return BADH(r, "header differs from rank 0's (rows %llu vs %llu, algo %d vs %d)",
                  (ull)s->rows, (ull)z->rows, (int)s->algo, (int)z->algo);
  }
  tpf_layout_desc d;
  memset(&d, 0, sizeof d);
  d.tp_size = c->P;
  d.algo = z->algo;
  d.coll = z->coll;
  d.dtype = z->dtype;
  d.capacity.rows = d.active.rows = z->rows;
  d.capacity.cols = d.active.cols = z->cols;
  d.num_splits = z->algo == TPF_ALGO_BULK ? 0 : z->num_splits;
  d.aggregate = z->aggregate;
  for (int r = 0; r < c->P; r++) {
    tpf_region local;
    uint64_t active;
    d.rank = r;
    tpf_status rc = tpf__layout_check_align(&d, 1);
    if (rc != TPF_OK) return BADH(r, "header names an invalid layout: %s", tpf_status_name(rc));
    TPF_CHECK(tpf_layout_local(&d, &local));
    TPF_CHECK(tpf_layout_active_bytes(&d, &active));
    const tpf_schedule *s = &sc[r];
    if (s->chunk_rows != local.rows || s->chunk_bytes != local.bytes)
      return BADH(r, "chunk %llu rows / %llu bytes, the layout says %llu / %llu",
                  (ull)s->chunk_rows, (ull)s->chunk_bytes, (ull)local.rows, (ull)local.bytes);
    if (s->active_bytes != active || s->registered_bytes < active)
      return BADH(r, "active bytes %llu (registered %llu), the layout says %llu",
                  (ull)s->active_bytes, (ull)s->registered_bytes, (ull)active);
    if (s->num_compute_streams < 1 || s->num_compute_streams > TPF_MAX_COMPUTE_STREAMS)
      return BADH(r, "%d compute streams", s->num_compute_streams);
    rank_state *k = &c->rk[r];
    k->s = s;
    k->has_init = false;
    if (c->mode == MODE_RING_AG || c->mode == MODE_BULK_AG) {
      k->has_init = true;
      k->init.lo = local.offset_bytes;
      k->init.hi = local.offset_bytes + local.bytes;
    } else if (c->mode == MODE_BULK_RS) {
      k->has_init = true;
      k->init.lo = 0;
      k->init.hi = active;
    }
  }
  c->e = tpf_dtype_size(z->dtype);
  c->T = z->rows;
  c->H = z->cols;
  c->R = z->chunk_rows;
  c->active = z->active_bytes;
  if (c->mode == MODE_RS) {
    c->out_rows = c->R;
    c->out_cols = c->H;
  } else {
    c->out_rows = z->gemm_m;
    c->out_cols = z->gemm_n;
  }
  if (z->gemm_m == 0 || z->gemm_n == 0 || z->gemm_k == 0)
    return BADH(0, "gemm dims %llu x %llu x %llu", (ull)z->gemm_m, (ull)z->gemm_n, (ull)z->gemm_k);
  /* The collective's GEMM is over all T rows, and H is its k (AG) or its n (RS): a header that
   * says otherwise describes another operation than its own rows and cols. */
  if (z->algo != TPF_ALGO_BULK &&
      (z->gemm_m != z->rows || (z->coll == TPF_COLL_AG ? z->gemm_k : z->gemm_n) != z->cols))
    return BADH(0, "gemm dims %llu x %llu x %llu do not fit rows %llu, cols %llu of the %s",
                (ull)z->gemm_m, (ull)z->gemm_n, (ull)z->gemm_k, (ull)z->rows, (ull)z->cols,
                tpf_coll_name(z->coll));
  return TPF_OK;
}

/* ---- 2. structure and ordering ---- */

static tpf_status check_structure(chk *c, int r) {
  rank_state *k = &c->rk[r];
  const tpf_schedule *s = k->s;
  int last[TPF_NUM_STREAMS];
  for (int j = 0; j < TPF_NUM_STREAMS; j++)
    last[j] = -1;
  for (int t = 0; t < TPF_MAX_TAGS; t++)
    k->barrier[t] = -1;
  for (int i = 0; i < s->nsteps; i++) {
    const tpf_step *st = &s->steps[i];
    int kind = st->kind;
    if (kind >= TPF_STEP_KIND_COUNT) return BAD(r, i, kind, "bad kind %d", kind);
    if (st->stream >= TPF_NUM_STREAMS) return BAD(r, i, kind, "bad stream %d", st->stream);
    /* P = 1 may omit the handshake (no peer): its schedule is the operation's one GEMM. */
    if (kind == TPF_STEP_HANDSHAKE ? i != 0 : (i == 0 && s->tp_size > 1))
      return BAD(r, i, kind, "%s", "step 0, and only step 0, must be the HANDSHAKE");
    bool compute = st->stream < TPF_STREAM_COMM;
    if ((kind == TPF_STEP_GEMM || kind == TPF_STEP_REDUCE) &&
        (!compute || st->stream >= s->num_compute_streams))
      return BAD(r, i, kind, "runs on stream %s, not one of the %d compute streams",
                 tpf_stream_name(st->stream), s->num_compute_streams);
    if ((kind == TPF_STEP_SEND || kind == TPF_STEP_BARRIER || kind == TPF_STEP_HANDSHAKE) &&
        st->stream != TPF_STREAM_COMM)
      return BAD(r, i, kind, "runs on stream %s, not send", tpf_stream_name(st->stream));
    if (kind == TPF_STEP_RECV && st->stream != TPF_STREAM_RECV)
      return BAD(r, i, kind, "runs on stream %s, not recv", tpf_stream_name(st->stream));
    if (st->ndeps > TPF_STEP_MAX_DEPS)
      return BAD(r, i, kind, "%d deps exceed %d", st->ndeps, TPF_STEP_MAX_DEPS);
    for (int j = 0; j < st->ndeps; j++)
      if (st->deps[j] >= i)
        return BAD(r, i, kind, "dep %d does not point to an earlier step", st->deps[j]);
    bool xfer = kind == TPF_STEP_SEND || kind == TPF_STEP_RECV;
    if (xfer && (st->peer < 0 || st->peer >= c->P || st->peer == r))
      return BAD(r, i, kind, "peer %d is not another rank of [0, %d)", st->peer, c->P);
    if (!xfer && st->peer != -1)
      return BAD(r, i, kind, "peer %d where none applies (want -1)", st->peer);
    if (st->tag >= TPF_MAX_TAGS) return BAD(r, i, kind, "tag %u >= %d", st->tag, TPF_MAX_TAGS);
    if (xfer && st->bytes == 0) return BAD(r, i, kind, "%s", "moves 0 bytes");
    if (kind == TPF_STEP_BARRIER) {
      if (k->barrier[st->tag] >= 0)
        return BAD(r, i, kind, "barrier tag %u already used by step %d", st->tag,
                   k->barrier[st->tag]);
      k->barrier[st->tag] = i;
    }
    if (kind == TPF_STEP_GEMM && (st->m == 0 || st->n == 0 || st->k == 0))
      return BAD(r, i, kind, "empty GEMM %llu x %llu x %llu", (ull)st->m, (ull)st->n, (ull)st->k);
    if ((kind == TPF_STEP_REDUCE || kind == TPF_STEP_PEER_REDUCE) &&
        (st->m == 0 || st->n == 0 || st->count == 0 ||
         (kind == TPF_STEP_PEER_REDUCE && st->count > (uint32_t)c->P)))
      return BAD(r, i, kind, "reduce %llu x %llu over %u views", (ull)st->m, (ull)st->n, st->count);
    /* A user matrix is addressed from its own base and ld: its reference carries off_bytes 0
     * and ld 0 ("the matrix's own"). Backends honour a nonzero ld and ignore off_bytes, so
     * either would silently move the access. */
    if (kind == TPF_STEP_GEMM || kind == TPF_STEP_REDUCE || kind == TPF_STEP_PEER_REDUCE) {
      const tpf_mref *ops[3] = {&st->a, &st->d, kind == TPF_STEP_GEMM ? &st->w : NULL};
      for (int j = 0; j < 3; j++)
        if (ops[j] && ops[j]->id != TPF_MAT_BUF && (ops[j]->off_bytes != 0 || ops[j]->ld != 0))
          return BAD(r, i, kind,
                     "user matrix %d referenced with off_bytes %llu, ld %llu "
                     "(want 0, 0)",
                     ops[j]->id, (ull)ops[j]->off_bytes, (ull)ops[j]->ld);
    }
    /* Transitive predecessors: deps and the previous step on the same stream. */
    uint64_t *row = &k->anc[(size_t)i * (size_t)c->words];
    k->prev[i] = last[st->stream];
    int preds[TPF_STEP_MAX_DEPS + 1], np = 0;
    for (int j = 0; j < st->ndeps; j++)
      preds[np++] = st->deps[j];
    if (k->prev[i] >= 0) preds[np++] = k->prev[i];
    for (int j = 0; j < np; j++) {
      const uint64_t *pr = &k->anc[(size_t)preds[j] * (size_t)c->words];
      for (int wd = 0; wd < c->words; wd++)
        row[wd] |= pr[wd];
      row[preds[j] / 64] |= 1ull << (preds[j] % 64);
    }
    last[st->stream] = i;
    if (i > 0 && !anc_has(c, r, i, 0))
      return BAD(r, i, kind, "%s", "is not ordered after the handshake (step 0)");
  }
  return TPF_OK;
}

/* ---- 3. matching ---- */

static tpf_status check_matching(chk *c) {
  int P = c->P;
  for (int r = 0; r < P; r++) {
    rank_state *k = &c->rk[r];
    for (int i = 0; i < k->s->nsteps; i++) {
      const tpf_step *st = &k->s->steps[i];
      k->match[i] = -1;
      if (st->kind != TPF_STEP_SEND && st->kind != TPF_STEP_RECV) continue;
      int *tab = st->kind == TPF_STEP_SEND ? k->send_at : k->recv_at;
      size_t slot = (size_t)st->peer * TPF_MAX_TAGS + st->tag;
      if (tab[slot] >= 0)
        return BAD(r, i, st->kind, "duplicate: step %d already uses peer %d tag %u", tab[slot],
                   st->peer, st->tag);
      tab[slot] = i;
      if (k->barrier[st->tag] >= 0)
        return BAD(r, i, st->kind, "tag %u is also a barrier tag", st->tag);
    }
  }
  for (int r = 0; r < P; r++) {
    rank_state *k = &c->rk[r];
    for (int t = 0; t < TPF_MAX_TAGS; t++)
      if ((k->barrier[t] >= 0) != (c->rk[0].barrier[t] >= 0))
        return BADH(r, "barrier tag %d used by %s but not by %s", t,
                    k->barrier[t] >= 0 ? "it" : "rank 0", k->barrier[t] >= 0 ? "rank 0" : "it");
    for (int i = 0; i < k->s->nsteps; i++) {
      const tpf_step *st = &k->s->steps[i];
      if (st->kind != TPF_STEP_SEND && st->kind != TPF_STEP_RECV) continue;
      bool send = st->kind == TPF_STEP_SEND;
      rank_state *q = &c->rk[st->peer];
      int j = (send ? q->recv_at : q->send_at)[(size_t)r * TPF_MAX_TAGS + st->tag];
      if (j < 0)
        return BAD(r, i, st->kind, "no matching %s on rank %d with tag %u", send ? "RECV" : "SEND",
                   st->peer, st->tag);
      const tpf_step *o = &q->s->steps[j];
      if (o->bytes != st->bytes || o->dst_off != st->dst_off)
        return BAD(r, i, st->kind,
                   "rank %d step %d disagrees: bytes %llu vs %llu, dst_off %llu vs %llu", st->peer,
                   j, (ull)st->bytes, (ull)o->bytes, (ull)st->dst_off, (ull)o->dst_off);
      k->match[i] = j;
    }
  }
  return TPF_OK;
}

/* ---- 4. progress ---- */

static bool preds_done(const chk *c, bool *const *done, int r, int i) {
  const tpf_step *st = &c->rk[r].s->steps[i];
  for (int j = 0; j < st->ndeps; j++)
    if (!done[r][st->deps[j]]) return false;
  return c->rk[r].prev[i] < 0 || done[r][c->rk[r].prev[i]];
}

static tpf_status check_progress(chk *c) {
  int P = c->P;
  tpf_status rc = TPF_OK;
  bool **done = tpf__calloc((size_t)P, sizeof *done);
  TPF_RETURN_IF(!done, TPF_ENOMEM, "%s", "schedule check: out of memory");
  for (int r = 0; r < P; r++) {
    done[r] = tpf__calloc((size_t)c->rk[r].s->nsteps, sizeof **done);
    if (!done[r]) {
      rc = tpf_set_error(TPF_ENOMEM, "%s", "schedule check: out of memory");
      goto out;
    }
  }
  for (bool changed = true; changed;) {
    changed = false;
    for (int r = 0; r < P; r++) {
      const rank_state *k = &c->rk[r];
      for (int i = 0; i < k->s->nsteps; i++) {
        if (done[r][i] || !preds_done(c, done, r, i)) continue;
        const tpf_step *st = &k->s->steps[i];
        if (st->kind == TPF_STEP_RECV && !done[st->peer][k->match[i]]) continue;
        if (st->kind == TPF_STEP_BARRIER) {
          bool all = true;
          for (int q = 0; q < P && all; q++)
            all = preds_done(c, done, q, c->rk[q].barrier[st->tag]);
          if (!all) continue;
        }
        done[r][i] = true;
        changed = true;
      }
    }
  }
  for (int r = 0; r < P && rc == TPF_OK; r++)
    for (int i = 0; i < c->rk[r].s->nsteps; i++)
      if (!done[r][i]) {
        rc = BAD(r, i, c->rk[r].s->steps[i].kind, "%s", "can never run: the schedule deadlocks");
        break;
      }
out:
  for (int r = 0; r < P; r++)
    tpf__free(done[r]);
  tpf__free(done);
  return rc;
}

/* ---- 5. bytes ---- */

/* The buffer bytes a step writes (RECV, GEMM into the buffer, reductions into the buffer). */
static tpf_status step_writes(const chk *c, int r, int i, ivec *out) {
  const tpf_step *st = &c->rk[r].s->steps[i];
  out->n = 0;
  if (st->kind == TPF_STEP_RECV) {
    uint64_t hi;
    if (!tpf__add_u64(st->dst_off, st->bytes, &hi))
      return BAD(r, i, st->kind, "dst %llu + %llu bytes overflows", (ull)st->dst_off,
                 (ull)st->bytes);
    return ivec_push(out, st->dst_off, hi);
  }
  if ((st->kind == TPF_STEP_GEMM || st->kind == TPF_STEP_REDUCE ||
       st->kind == TPF_STEP_PEER_REDUCE) &&
      st->d.id == TPF_MAT_BUF)
    return view_bytes(c, r, i, st->kind, &st->d, st->d.off_bytes, st->m, st->n, out);
  return TPF_OK;
}

static int cmp_wrt(const void *x, const void *y) {
  const wrt *a = x, *b = y;
  return a->lo < b->lo ? -1 : a->lo > b->lo ? 1 : 0;
}

static tpf_status check_writes(chk *c, int r, ivec *tmp) {
  rank_state *k = &c->rk[r];
  size_t cap = 0;
  for (int i = 0; i < k->s->nsteps; i++) {
    TPF_CHECK(step_writes(c, r, i, tmp));
    for (size_t j = 0; j < tmp->n; j++) {
      const ivl *v = &tmp->v[j];
      int kind = k->s->steps[i].kind;
      if (v->hi > c->active)
        return BAD(r, i, kind, "writes bytes [%llu, %llu) outside the active layout [0, %llu)",
                   (ull)v->lo, (ull)v->hi, (ull)c->active);
      bool in_place = kind == TPF_STEP_REDUCE || kind == TPF_STEP_PEER_REDUCE;
      if (k->has_init && !in_place && v->lo < k->init.hi && k->init.lo < v->hi)
        return BAD(r, i, kind, "writes bytes [%llu, %llu) over the initial data [%llu, %llu)",
                   (ull)v->lo, (ull)v->hi, (ull)k->init.lo, (ull)k->init.hi);
      if (k->nw == cap) {
        cap = cap ? 2 * cap : 32;
        wrt *nw = tpf__realloc(k->w, cap * sizeof *nw);
        TPF_RETURN_IF(!nw, TPF_ENOMEM, "%s", "schedule check: out of memory");
        k->w = nw;
      }
      k->w[k->nw].lo = v->lo;
      k->w[k->nw].hi = v->hi;
      k->w[k->nw].step = i;
      k->nw++;
    }
  }
  /* Exactly once: sorted writes must not overlap; with the initial data they tile the layout. */
  wrt *sorted = tpf__malloc((k->nw ? k->nw : 1) * sizeof *sorted);
  TPF_RETURN_IF(!sorted, TPF_ENOMEM, "%s", "schedule check: out of memory");
  if (k->nw) memcpy(sorted, k->w, k->nw * sizeof *sorted);
  qsort(sorted, k->nw, sizeof *sorted, cmp_wrt);
  tpf_status rc = TPF_OK;
  tmp->n = 0;
  for (size_t j = 0; j < k->nw && rc == TPF_OK; j++) {
    if (j > 0 && sorted[j].lo < sorted[j - 1].hi) {
      int i = sorted[j].step;
      rc = BAD(r, i, k->s->steps[i].kind,
               "writes bytes [%llu, %llu) that step %d also writes: not exactly once",
               (ull)sorted[j].lo, (ull)sorted[j].hi, sorted[j - 1].step);
    }
    if (rc == TPF_OK) rc = ivec_push(tmp, sorted[j].lo, sorted[j].hi);
  }
  tpf__free(sorted);
  TPF_CHECK(rc);
  /* Which of my barriers each write precedes: peers may read it after passing those. */
  k->wtags = tpf__calloc(k->nw ? k->nw : 1, sizeof *k->wtags);
  TPF_RETURN_IF(!k->wtags, TPF_ENOMEM, "%s", "schedule check: out of memory");
  for (size_t j = 0; j < k->nw; j++)
    for (int t = 0; t < TPF_MAX_TAGS; t++)
      if (k->barrier[t] >= 0 && anc_has(c, r, k->barrier[t], k->w[j].step))
        k->wtags[j][t / 64] |= 1ull << (t % 64);
  /* P = 1 RS: the one GEMM writes D directly; the buffer, the reduction's scratch, is unused. */
  if (c->mode == MODE_RS && c->P == 1 && k->nw == 0) return TPF_OK;
  if (k->has_init) TPF_CHECK(ivec_push(tmp, k->init.lo, k->init.hi));
  ivec_normalize(tmp);
  if (!(tmp->n == 1 && tmp->v[0].lo == 0 && tmp->v[0].hi == c->active)) {
    uint64_t gap = 0; /* first byte not produced */
    for (size_t j = 0; j < tmp->n && tmp->v[j].lo <= gap; j++)
      gap = tmp->v[j].hi;
    return BADH(r, "active byte %llu of [0, %llu) is never produced", (ull)gap, (ull)c->active);
  }
  return TPF_OK;
}

/* Bytes of rank q's buffer that step i of rank r may read: q's initial data, and writes ordered
 * before the read (same rank: predecessors; a peer: predecessors of a barrier both passed). */
static tpf_status readable(const chk *c, int r, int i, int q, ivec *out) {
  const rank_state *kq = &c->rk[q];
  uint64_t passed[2] = {0, 0}; /* barrier tags step i of rank r comes after */
  out->n = 0;
  if (kq->has_init) TPF_CHECK(ivec_push(out, kq->init.lo, kq->init.hi));
  if (q != r)
    for (int t = 0; t < TPF_MAX_TAGS; t++)
      if (c->rk[r].barrier[t] >= 0 && anc_has(c, r, i, c->rk[r].barrier[t]))
        passed[t / 64] |= 1ull << (t % 64);
  for (size_t j = 0; j < kq->nw; j++) {
    bool ok = q == r ? anc_has(c, r, i, kq->w[j].step)
                     : ((kq->wtags[j][0] & passed[0]) | (kq->wtags[j][1] & passed[1])) != 0;
    if (ok) TPF_CHECK(ivec_push(out, kq->w[j].lo, kq->w[j].hi));
  }
  ivec_normalize(out);
  return TPF_OK;
}

static tpf_status check_read(const chk *c, int r, int i, int q, const ivec *rd, ivec *allowed) {
  int kind = c->rk[r].s->steps[i].kind;
  for (size_t j = 0; j < rd->n; j++)
    if (rd->v[j].hi > c->active)
      return BAD(r, i, kind,
                 "reads bytes [%llu, %llu) of rank %d outside the active layout [0, %llu)",
                 (ull)rd->v[j].lo, (ull)rd->v[j].hi, q, (ull)c->active);
  TPF_CHECK(readable(c, r, i, q, allowed));
  for (size_t j = 0; j < rd->n; j++)
    if (!ivec_covers(allowed, rd->v[j].lo, rd->v[j].hi))
      return BAD(r, i, kind, "reads bytes [%llu, %llu) of rank %d before they arrived",
                 (ull)rd->v[j].lo, (ull)rd->v[j].hi, q);
  return TPF_OK;
}

/* True when some barrier of rank r is ordered after step i. */
static bool barrier_after(const chk *c, int r, int i) {
  for (int t = 0; t < TPF_MAX_TAGS; t++)
    if (c->rk[r].barrier[t] >= 0 && anc_has(c, r, c->rk[r].barrier[t], i)) return true;
  return false;
}

static tpf_status check_reads(const chk *c, int r, ivec *rd, ivec *allowed) {
  const tpf_schedule *s = c->rk[r].s;
  for (int i = 0; i < s->nsteps; i++) {
    const tpf_step *st = &s->steps[i];
    rd->n = 0;
    switch (st->kind) {
    case TPF_STEP_SEND: {
      uint64_t hi;
      if (!tpf__add_u64(st->src_off, st->bytes, &hi))
        return BAD(r, i, st->kind, "src %llu + %llu bytes overflows", (ull)st->src_off,
                   (ull)st->bytes);
      TPF_CHECK(ivec_push(rd, st->src_off, hi));
      TPF_CHECK(check_read(c, r, i, r, rd, allowed));
      break;
    }
    case TPF_STEP_GEMM:
      if (st->a.id == TPF_MAT_BUF) {
        TPF_CHECK(view_bytes(c, r, i, st->kind, &st->a, st->a.off_bytes, st->m, st->k, rd));
        TPF_CHECK(check_read(c, r, i, r, rd, allowed));
      }
      break;
    case TPF_STEP_REDUCE:
    case TPF_STEP_PEER_REDUCE:
      if (st->a.id != TPF_MAT_BUF)
        return BAD(r, i, st->kind, "reduces operand %d, not the buffer", st->a.id);
      for (uint32_t t = 0; t < st->count; t++) {
        uint64_t off = st->a.off_bytes, shift;
        int q = r;
        if (st->kind == TPF_STEP_REDUCE) {
          if (!tpf__mul_u64(t, st->stride_bytes, &shift) || !tpf__add_u64(off, shift, &off))
            return BAD(r, i, st->kind, "view %u overflows", t);
        } else {
          q = (r + (int)t) % c->P;
        }
        rd->n = 0;
        TPF_CHECK(view_bytes(c, r, i, st->kind, &st->a, off, st->m, st->n, rd));
        TPF_CHECK(check_read(c, r, i, q, rd, allowed));
      }
      /* A pull must end before a barrier: the owner's operation completes only when every
       * peer has passed each barrier, so afterwards it may reuse the bytes (the WAR hazard the
       * closing BARRIER of the pull schedules exists for). */
      if (st->kind == TPF_STEP_PEER_REDUCE && st->count > 1 && !barrier_after(c, r, i))
        return BAD(r, i, st->kind,
                   "pulls from %u ranks, but no barrier follows it: the owners "
                   "may reuse their bytes while it reads them",
                   st->count);
      break;
    default:
      break;
    }
  }
  return TPF_OK;
}

/* ---- 6. outputs and meaning ---- */

typedef struct {
  uint64_t row, col, m, n;
  int step;
} rect;

static tpf_status check_outputs(const chk *c, int r) {
  const tpf_schedule *s = c->rk[r].s;
  rect *rs = tpf__malloc((size_t)s->nsteps * sizeof *rs);
  TPF_RETURN_IF(!rs, TPF_ENOMEM, "%s", "schedule check: out of memory");
  size_t n = 0;
  uint64_t area = 0, want;
  tpf_status rc = TPF_OK;
  for (int i = 0; i < s->nsteps && rc == TPF_OK; i++) {
    const tpf_step *st = &s->steps[i];
    bool writer = st->kind == TPF_STEP_GEMM || st->kind == TPF_STEP_REDUCE ||
                  st->kind == TPF_STEP_PEER_REDUCE;
    if (!writer || st->d.id != TPF_MAT_D) continue;
    uint64_t re, ce, a;
    if (!tpf__add_u64(st->d.row, st->m, &re) || !tpf__add_u64(st->d.col, st->n, &ce) ||
        re > c->out_rows || ce > c->out_cols || !tpf__mul_u64(st->m, st->n, &a)) {
      rc = BAD(r, i, st->kind,
               "writes output rows [%llu, +%llu) cols [%llu, +%llu) outside [%llu, %llu]",
               (ull)st->d.row, (ull)st->m, (ull)st->d.col, (ull)st->n, (ull)c->out_rows,
               (ull)c->out_cols);
      break;
    }
    for (size_t j = 0; j < n; j++) {
      const rect *o = &rs[j];
      if (st->d.row < o->row + o->m && o->row < re && st->d.col < o->col + o->n && o->col < ce) {
        rc = BAD(r, i, st->kind,
                 "writes output rows [%llu, +%llu) cols [%llu, +%llu) that step %d "
                 "also writes: not exactly once",
                 (ull)st->d.row, (ull)st->m, (ull)st->d.col, (ull)st->n, o->step);
        break;
      }
    }
    rs[n].row = st->d.row;
    rs[n].col = st->d.col;
    rs[n].m = st->m;
    rs[n].n = st->n;
    rs[n].step = i;
    n++;
    area += a; /* disjoint rectangles inside the output: the sum cannot overflow */
  }
  tpf__free(rs);
  TPF_CHECK(rc);
  if (!tpf__mul_u64(c->out_rows, c->out_cols, &want) || area != want)
    return BADH(r, "the output [%llu, %llu] is produced for %llu of its %llu elements",
                (ull)c->out_rows, (ull)c->out_cols, (ull)area, (ull)c->out_rows * c->out_cols);
  return TPF_OK;
}

static tpf_status add_prod(rank_state *k, const prod *p) {
  if (k->npr == k->cappr) {
    size_t cap = k->cappr ? 2 * k->cappr : 16;
    prod *v = tpf__realloc(k->pr, cap * sizeof *v);
    TPF_RETURN_IF(!v, TPF_ENOMEM, "%s", "schedule check: out of memory");
    k->pr = v;
    k->cappr = cap;
  }
  k->pr[k->npr++] = *p;
  return TPF_OK;
}

/* GEMM operand rules per mode, and the partials the RS GEMMs produce. */
static tpf_status check_gemms(chk *c, int r) {
  rank_state *k = &c->rk[r];
  const tpf_schedule *s = k->s;
  for (int i = 0; i < s->nsteps; i++) {
    const tpf_step *st = &s->steps[i];
    if (st->kind != TPF_STEP_GEMM) continue;
    int kind = st->kind;
    uint64_t wend;
    if (st->w.id != TPF_MAT_W || st->w.col != 0 || !tpf__add_u64(st->w.row, st->n, &wend) ||
        wend > s->gemm_n || st->k != s->gemm_k)
      return BAD(r, i, kind, "weight rows [%llu, +%llu) col %llu, k %llu do not fit W [%llu, %llu]",
                 (ull)st->w.row, (ull)st->n, (ull)st->w.col, (ull)st->k, (ull)s->gemm_n,
                 (ull)s->gemm_k);
    if (c->mode == MODE_RING_AG) {
      /* Reads the gathered [T, H] rows it writes to D: token row = byte offset / row pitch. */
      uint64_t pitch = c->H * c->e; /* <= active bytes: no overflow */
      if (st->a.id != TPF_MAT_BUF || st->d.id != TPF_MAT_D || st->a.ld != c->H || st->a.col != 0 ||
          st->a.off_bytes % pitch != 0 || st->a.off_bytes / pitch + st->a.row != st->d.row ||
          st->w.row != st->d.col)
        return BAD(r, i, kind,
                   "GEMM reads buffer rows %llu (off %llu, ld %llu) for output row %llu "
                   "col %llu: not the gathered token rows",
                   (ull)st->a.row, (ull)st->a.off_bytes, (ull)st->a.ld, (ull)st->d.row,
                   (ull)st->d.col);
    } else if (c->mode == MODE_BULK_AG || c->mode == MODE_BULK_RS || c->P == 1) {
      /* BULK's independent GEMM; at P = 1 an RS is D = op(X) op(W) itself (no partials). */
      uint64_t aend;
      if (st->a.id != TPF_MAT_X || st->d.id != TPF_MAT_D || st->a.col != 0 ||
          st->a.row != st->d.row || st->w.row != st->d.col ||
          !tpf__add_u64(st->a.row, st->m, &aend) || aend > s->gemm_m)
        return BAD(r, i, kind, "independent GEMM rows %llu -> output row %llu col %llu mismatch",
                   (ull)st->a.row, (ull)st->d.row, (ull)st->d.col);
    } else {
      uint64_t aend;
      if (st->a.id != TPF_MAT_X || st->d.id != TPF_MAT_BUF || st->a.col != 0 ||
          !tpf__add_u64(st->a.row, st->m, &aend) || aend > c->T)
        return BAD(r, i, kind,
                   "rs GEMM must read X rows inside [0, %llu) and write the buffer "
                   "(a %d row %llu, d %d)",
                   (ull)c->T, st->a.id, (ull)st->a.row, st->d.id);
      /* A GEMM over several chunks of full-width rows (RING RS without overlap) holds one
       * partial per R-row band: record each band as its own contiguous view, as a per-chunk
       * GEMM would have, so transfers and reductions are matched band by band. */
      uint64_t band = st->m, bands = 1;
      if (s->algo == TPF_ALGO_RING && st->d.ld == st->n && st->d.col == 0 && c->R > 0 &&
          st->m > c->R && st->m % c->R == 0) {
        band = c->R;
        bands = st->m / c->R;
      }
      for (uint64_t b = 0; b < bands; b++) {
        prod p;
        ivec tmp = {NULL, 0, 0};
        uint64_t off = st->d.off_bytes + (st->d.row + b * band) * st->d.ld * c->e; /* in view */
        tpf_mref dv = st->d;
        dv.off_bytes = off;
        dv.row = 0;
        tpf_status rc = view_bytes(c, r, i, kind, &dv, off, band, st->n, &tmp);
        if (rc == TPF_OK) {
          p.origin = r;
          p.off = bands > 1 ? off : st->d.off_bytes;
          p.ld = st->d.ld;
          p.row0 = bands > 1 ? 0 : st->d.row;
          p.col0 = st->d.col;
          p.m = band;
          p.n = st->n;
          p.xrow0 = st->a.row + b * band;
          p.wrow0 = st->w.row;
          p.lo = tmp.v[0].lo;
          p.hi = tmp.v[tmp.n - 1].hi;
          rc = add_prod(k, &p);
        }
        tpf__free(tmp.v);
        TPF_CHECK(rc);
      }
    }
  }
  return TPF_OK;
}

/* Carries partials along transfers: a RECV whose SEND ships exactly one partial's bytes holds it.
 */
static tpf_status carry_partials(chk *c) {
  for (int pass = 0; pass < c->P; pass++) {
    bool changed = false;
    for (int r = 0; r < c->P; r++) {
      rank_state *k = &c->rk[r];
      for (int i = 0; i < k->s->nsteps; i++) {
        const tpf_step *st = &k->s->steps[i];
        if (st->kind != TPF_STEP_RECV) continue;
        bool have = false;
        for (size_t j = 0; j < k->npr && !have; j++)
          have = k->pr[j].lo == st->dst_off && k->pr[j].hi == st->dst_off + st->bytes;
        if (have) continue;
        const rank_state *q = &c->rk[st->peer];
        const tpf_step *snd = &q->s->steps[k->match[i]];
        for (size_t j = 0; j < q->npr; j++) {
          prod p = q->pr[j];
          if (p.lo != snd->src_off || p.hi != snd->src_off + snd->bytes) continue;
          uint64_t back = p.lo - p.off; /* view start to first byte */
          if (st->dst_off < back) break;
          p.off = st->dst_off - back;
          p.lo = st->dst_off;
          p.hi = st->dst_off + st->bytes;
          TPF_CHECK(add_prod(k, &p));
          changed = true;
          break;
        }
      }
    }
    if (!changed) break;
  }
  return TPF_OK;
}

/* Every reduction input is one rank's partial of exactly the token and weight rows of the
 * output elements it is summed into; the inputs come from P distinct ranks. */
static tpf_status check_reductions(const chk *c, int r) {
  const rank_state *k = &c->rk[r];
  const tpf_schedule *s = k->s;
  bool reduced = false; /* BULK RS: the in-place reduction of chunk r was seen */
  for (int i = 0; i < s->nsteps; i++) {
    const tpf_step *st = &s->steps[i];
    int kind = st->kind;
    if (kind != TPF_STEP_REDUCE && kind != TPF_STEP_PEER_REDUCE) continue;
    if (c->mode == MODE_RING_AG || c->mode == MODE_BULK_AG)
      return BAD(r, i, kind, "%s", "an all-gather has nothing to reduce");
    if (c->mode == MODE_BULK_RS) {
      tpf_layout_desc d;
      tpf_region local;
      memset(&d, 0, sizeof d);
      d.tp_size = c->P;
      d.rank = r;
      d.algo = s->algo;
      d.coll = s->coll;
      d.dtype = s->dtype;
      d.capacity.rows = d.active.rows = c->T;
      d.capacity.cols = d.active.cols = c->H;
      TPF_CHECK(tpf_layout_local(&d, &local));
      uint64_t start = 0;
      bool ok = kind == TPF_STEP_PEER_REDUCE && st->count == (uint32_t)c->P &&
                st->d.id == TPF_MAT_BUF && st->a.off_bytes == st->d.off_bytes &&
                st->a.ld == st->d.ld && st->a.row == st->d.row && st->a.col == st->d.col &&
                st->d.ld == c->H && st->d.col == 0 && st->n == c->H;
      ok = ok && tpf__mul_u64(st->d.row, c->H * c->e, &start) &&
           tpf__add_u64(start, st->d.off_bytes, &start) && start == local.offset_bytes &&
           st->m == local.rows;
      if (!ok)
        return BAD(r, i, kind,
                   "bulk rs must sum chunk %d of all %d ranks in place at bytes %llu "
                   "(got count %u, output row %llu)",
                   r, c->P, (ull)local.offset_bytes, st->count, (ull)st->d.row);
      reduced = true; /* a second one writes the chunk twice: check_writes refused it */
      continue;
    }
    if (st->d.id != TPF_MAT_D)
      return BAD(r, i, kind, "writes operand %d, not the rs output", st->d.id);
    uint64_t want_x = 0, seen = 0;
    if (!tpf__mul_u64((uint64_t)r, c->R, &want_x) || !tpf__add_u64(want_x, st->d.row, &want_x))
      return BAD(r, i, kind, "%s", "token row overflows");
    for (uint32_t t = 0; t < st->count; t++) {
      int h = kind == TPF_STEP_REDUCE ? r : (r + (int)t) % c->P;
      uint64_t off = st->a.off_bytes + (kind == TPF_STEP_REDUCE ? t * st->stride_bytes : 0);
      const rank_state *kh = &c->rk[h];
      const prod *p = NULL;
      for (size_t j = 0; j < kh->npr && !p; j++) {
        const prod *x = &kh->pr[j];
        if (x->off == off && x->ld == st->a.ld && st->a.row >= x->row0 &&
            st->a.row + st->m <= x->row0 + x->m && st->a.col >= x->col0 &&
            st->a.col + st->n <= x->col0 + x->n)
          p = x;
      }
      if (!p)
        return BAD(r, i, kind, "input %u (rank %d, view at %llu) holds no GEMM partial", t, h,
                   (ull)off);
      uint64_t xrow = p->xrow0 + (st->a.row - p->row0), wrow = p->wrow0 + (st->a.col - p->col0);
      if (xrow != want_x || wrow != st->d.col)
        return BAD(r, i, kind,
                   "input %u holds rank %d's partial of token row %llu weight row %llu; "
                   "output row %llu col %llu needs token row %llu weight row %llu",
                   t, p->origin, (ull)xrow, (ull)wrow, (ull)st->d.row, (ull)st->d.col, (ull)want_x,
                   (ull)st->d.col);
      if ((seen >> p->origin) & 1u)
        return BAD(r, i, kind, "sums rank %d's partial twice", p->origin);
      seen |= 1ull << p->origin;
    }
    if (st->count != (uint32_t)c->P)
      return BAD(r, i, kind, "sums %u partials, not all %d ranks'", st->count, c->P);
  }
  /* BULK RS produces no new bytes (the partials are the initial data), so the byte tiling
   * cannot notice a missing reduction: require it here. One rank sums nothing. */
  if (c->mode == MODE_BULK_RS && c->P > 1 && !reduced)
    return BADH(r, "bulk rs never reduces its chunk %d over the %d ranks", r, c->P);
  return TPF_OK;
}

static tpf_status check_moves(const chk *c, int r) {
  const tpf_schedule *s = c->rk[r].s;
  if (c->mode != MODE_RING_AG && c->mode != MODE_BULK_AG) return TPF_OK;
  for (int i = 0; i < s->nsteps; i++) {
    const tpf_step *st = &s->steps[i];
    if (st->kind == TPF_STEP_SEND && st->src_off != st->dst_off)
      return BAD(r, i, st->kind,
                 "all-gather moves bytes %llu to %llu: chunks must keep their place",
                 (ull)st->src_off, (ull)st->dst_off);
  }
  return TPF_OK;
}

static void free_state(chk *c) {
  if (!c->rk) return;
  for (int r = 0; r < c->P; r++) {
    rank_state *k = &c->rk[r];
    tpf__free(k->anc);
    tpf__free(k->prev);
    tpf__free(k->match);
    tpf__free(k->send_at);
    tpf__free(k->recv_at);
    tpf__free(k->w);
    tpf__free(k->wtags);
    tpf__free(k->pr);
  }
  tpf__free(c->rk);
}

static tpf_status run_checks(chk *c, const tpf_schedule *scheds) {
  int P = c->P;
  TPF_CHECK(check_headers(c, scheds));
  int maxn = 0;
  for (int r = 0; r < P; r++)
    if (scheds[r].nsteps > maxn) maxn = scheds[r].nsteps;
  c->words = (maxn + 63) / 64;
  for (int r = 0; r < P; r++) {
    rank_state *k = &c->rk[r];
    size_t n = (size_t)k->s->nsteps, tags = (size_t)P * TPF_MAX_TAGS;
    k->anc = tpf__calloc(n * (size_t)c->words, sizeof *k->anc);
    k->prev = tpf__calloc(n, sizeof *k->prev);
    k->match = tpf__calloc(n, sizeof *k->match);
    k->send_at = tpf__malloc(tags * sizeof *k->send_at);
    k->recv_at = tpf__malloc(tags * sizeof *k->recv_at);
    TPF_RETURN_IF(!k->anc || !k->prev || !k->match || !k->send_at || !k->recv_at, TPF_ENOMEM, "%s",
                  "schedule check: out of memory");
    for (size_t j = 0; j < tags; j++)
      k->send_at[j] = k->recv_at[j] = -1;
    TPF_CHECK(check_structure(c, r));
  }
  TPF_CHECK(check_matching(c));
  TPF_CHECK(check_progress(c));

  ivec a = {NULL, 0, 0}, b = {NULL, 0, 0};
  tpf_status rc = TPF_OK;
  for (int r = 0; r < P && rc == TPF_OK; r++)
    rc = check_writes(c, r, &a);
  for (int r = 0; r < P && rc == TPF_OK; r++)
    rc = check_reads(c, r, &a, &b);
  tpf__free(a.v);
  tpf__free(b.v);
  TPF_CHECK(rc);
  for (int r = 0; r < P; r++) {
    TPF_CHECK(check_outputs(c, r));
    TPF_CHECK(check_moves(c, r));
    TPF_CHECK(check_gemms(c, r));
  }
  TPF_CHECK(carry_partials(c));
  for (int r = 0; r < P; r++)
    TPF_CHECK(check_reductions(c, r));
  return TPF_OK;
}

tpf_status tpf_schedule_check(const tpf_schedule *scheds, int tp_size) {
  TPF_RETURN_IF(!scheds, TPF_EINVAL, "%s", "schedule check: schedules are NULL");
  TPF_RETURN_IF(tp_size < 1 || tp_size > TPF_MAX_RANKS, TPF_EINVAL,
                "schedule check: tp_size %d outside [1, %d]", tp_size, TPF_MAX_RANKS);
  chk c;
  memset(&c, 0, sizeof c);
  c.P = tp_size;
  const tpf_schedule *z = &scheds[0];
  if (z->coll == TPF_COLL_AG)
    c.mode = z->algo == TPF_ALGO_BULK ? MODE_BULK_AG : MODE_RING_AG;
  else
    c.mode = z->algo == TPF_ALGO_BULK ? MODE_BULK_RS : MODE_RS;
  c.rk = tpf__calloc((size_t)tp_size, sizeof *c.rk);
  TPF_RETURN_IF(!c.rk, TPF_ENOMEM, "%s", "schedule check: out of memory");
  tpf_status rc = run_checks(&c, scheds);
  free_state(&c);
  return rc;
}
