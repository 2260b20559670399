/* The independent schedule checker's state and helpers (core/schedule_check.c runs the checks;
 * core/schedule_check_meaning.c is its part 6, outputs and meaning). Internal to those two files.
 */
#ifndef TPF_SCHEDULE_CHECK_STATE_H
#define TPF_SCHEDULE_CHECK_STATE_H

#include "internal.h"

#include <stdlib.h>

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

static inline tpf_status ivec_push(ivec *a, uint64_t lo, uint64_t hi) {
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

static inline int cmp_ivl(const void *x, const void *y) {
  const ivl *a = x, *b = y;
  return a->lo < b->lo ? -1 : a->lo > b->lo ? 1 : 0;
}

/* Sorts and merges touching intervals. */
static inline void ivec_normalize(ivec *a) {
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

static inline bool ivec_covers(const ivec *norm, uint64_t lo, uint64_t hi) {
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
static inline tpf_status view_bytes(const chk *c, int r, int i, int kind, const tpf_mref *v,
                                    uint64_t off, uint64_t m, uint64_t ncols, ivec *out) {
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

static inline bool anc_has(const chk *c, int r, int i, int j) {
  return (c->rk[r].anc[(size_t)i * (size_t)c->words + (size_t)(j / 64)] >> (j % 64)) & 1u;
}

/* ---- 6. outputs and meaning (schedule_check_meaning.c) ---- */

/* GEMM/REDUCE outputs tile the user output exactly once. */
tpf_status tpf__sc_outputs(const chk *c, int r);
/* GEMM operand rules per mode, and the partials the RS GEMMs produce. */
tpf_status tpf__sc_gemms(chk *c, int r);
/* Partials carried along transfers (after every rank's tpf__sc_gemms). */
tpf_status tpf__sc_carry_partials(chk *c);
/* Every RS reduction sums all P ranks' partials of exactly its rows. */
tpf_status tpf__sc_reductions(const chk *c, int r);
/* All-gather transfers keep every chunk in its place. */
tpf_status tpf__sc_moves(const chk *c, int r);

#endif
