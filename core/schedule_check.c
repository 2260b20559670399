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
 *  7. Mechanisms (tpflex_backend.h, 0.3): every step's transport class is one its kind admits
 *     (a SEND: the copy engine or a copy kernel; a reduction: the reduction kernel; nothing
 *     else moves bytes) and every rank's SENDs use one class; a GEMM leaves the communication
 *     CTAs only beside a kernel transport of its own schedule, other steps have no SM budget;
 *     the handshake's peer set names no rank outside the group nor the rank itself and covers
 *     every peer it sends to or receives from, and every peer where a BARRIER, a PEER_REDUCE or
 *     a copy kernel is in the schedule (their bytes or waits reach every peer).
 * Every failure returns TPF_EINVAL with the rank, the step and what was wrong.
 */
#include "schedule_check_state.h"

#include <stdlib.h>
#include <string.h>

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

/* ---- 7. mechanisms ---- */

static bool xport_admitted(int kind, int xport) {
  switch (kind) {
  case TPF_STEP_SEND:
    return xport == TPF_XPORT_COPY_ENGINE || xport == TPF_XPORT_COPY_KERNEL;
  case TPF_STEP_REDUCE:
  case TPF_STEP_PEER_REDUCE:
    return xport == TPF_XPORT_REDUCE_KERNEL;
  default:
    return xport == TPF_XPORT_NONE;
  }
}

static tpf_status check_mechanisms(const chk *c, int r, int *send_class) {
  const tpf_schedule *s = c->rk[r].s;
  const uint64_t group = c->P >= 64 ? ~0ull : (1ull << (unsigned)c->P) - 1u;
  const uint64_t me = 1ull << (unsigned)r;
  uint64_t need = 0;
  bool all = false, kernels = false;
  for (int i = 0; i < s->nsteps; i++) {
    const tpf_step *st = &s->steps[i];
    if (!xport_admitted(st->kind, st->xport))
      return BAD(r, i, st->kind, "transport class %u is not one this kind admits",
                 (unsigned)st->xport);
    if (st->kind == TPF_STEP_SEND) {
      if (*send_class >= 0 && st->xport != *send_class)
        return BAD(r, i, st->kind,
                   "sends by transport class %u where the operation's other "
                   "SENDs use %d: one class per operation",
                   (unsigned)st->xport, *send_class);
      *send_class = st->xport;
    }
    if (st->kind == TPF_STEP_SEND || st->kind == TPF_STEP_RECV) need |= 1ull << (unsigned)st->peer;
    kernels = kernels || st->xport == TPF_XPORT_COPY_KERNEL || st->xport == TPF_XPORT_REDUCE_KERNEL;
    all = all || st->kind == TPF_STEP_BARRIER || st->kind == TPF_STEP_PEER_REDUCE ||
          st->xport == TPF_XPORT_COPY_KERNEL;
  }
  for (int i = 0; i < s->nsteps; i++) {
    const tpf_step *st = &s->steps[i];
    const bool gemm = st->kind == TPF_STEP_GEMM;
    if (st->sm_budget >= TPF_SMS_COUNT || (!gemm && st->sm_budget != TPF_SMS_ALL) ||
        (st->sm_budget == TPF_SMS_LEAVE_COMM && !kernels))
      return BAD(r, i, st->kind, "SM budget %u: %s", (unsigned)st->sm_budget,
                 gemm ? "leaves SMs to communication kernels this schedule does not run"
                      : "only a GEMM has one");
  }
  if (all) need = group;
  need &= ~me;
  if ((s->handshake_peers & ~group) || (s->handshake_peers & me) || (need & ~s->handshake_peers))
    return BADH(r,
                "handshake peers 0x%llx must cover 0x%llx, within the %d ranks and without "
                "this rank",
                (ull)s->handshake_peers, (ull)need, c->P);
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
    TPF_CHECK(tpf__sc_outputs(c, r));
    TPF_CHECK(tpf__sc_moves(c, r));
    TPF_CHECK(tpf__sc_gemms(c, r));
  }
  TPF_CHECK(tpf__sc_carry_partials(c));
  for (int r = 0; r < P; r++)
    TPF_CHECK(tpf__sc_reductions(c, r));
  int send_class = -1;
  for (int r = 0; r < P; r++)
    TPF_CHECK(check_mechanisms(c, r, &send_class));
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
