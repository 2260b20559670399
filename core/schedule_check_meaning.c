/* The independent schedule checker, part 6: outputs and meaning (the method is core/
 * schedule_check.c's). GEMM/REDUCE outputs tile the user output exactly once; AG moves chunks
 * without relocating them; every RS reduction sums, for its output rows and columns, the partials
 * of all P ranks for exactly those token rows and weight rows (partials are tracked from the GEMM
 * that produced them through the transfers that carried them); BULK RS reduces every rank's
 * chunk.
 */
#include "schedule_check_state.h"

#include <string.h>

/* ---- 6. outputs and meaning ---- */

typedef struct {
  uint64_t row, col, m, n;
  int step;
} rect;

tpf_status tpf__sc_outputs(const chk *c, int r) {
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
tpf_status tpf__sc_gemms(chk *c, int r) {
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
tpf_status tpf__sc_carry_partials(chk *c) {
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
tpf_status tpf__sc_reductions(const chk *c, int r) {
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

tpf_status tpf__sc_moves(const chk *c, int r) {
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
