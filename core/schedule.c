/* Schedule builders: one rank's step list for one operation, as data.
 *
 * Method: every schedule is the list of docs/DESIGN.md, built for the active shape with the
 * packed chunk size S_T in place of the capacity chunk size.
 *  - P = 1: the one GEMM of the operation and nothing else, no handshake (build_single).
 *  - Step 0 is HANDSHAKE on the comm stream (P > 1). The first step of every other stream
 *    lists step 0 in its deps, so nothing moves before every rank agreed on (seq, key, rows).
 *  - RING AG, plain (splits = P): step i computes chunk cs = (r-i) mod P while forwarding it to
 *    r+1 and receiving chunk (r-i-1) mod P from r-1; every chunk lands at its natural offset, so
 *    after P-1 steps the buffer is the gathered [T, H]. splits = 1: the P-1 forwards, then one
 *    GEMM over T rows. Aggregate (even P): a swap with the pair partner r^1, then P/2 GEMMs of
 *    2R rows while 2-chunk messages travel two ranks ahead.
 *  - RING RS: step i computes the partial of chunk (r+i+1) mod P into slot i and ships slot i-1
 *    directly to its owner (r+i) mod P, landing in the owner's slot i-1+P (shift-by-i exchange,
 *    every partial travels once). Slots P-1..2P-2 then hold P partials of my rows: REDUCE sums
 *    them in fp32.
 *  - PIPELINE RS: S column blocks; GEMM i writes block i, a BARRIER makes block i of every rank
 *    complete, then each rank pulls and sums its rows of block i from all ranks (PEER_REDUCE);
 *    a last BARRIER keeps owners from reusing the buffer while peers still read it.
 *  - BULK: one independent GEMM on compute 0 beside an in-place AG (direct sends of chunk r to
 *    every peer) or RS (pull-reduce of chunk r from every peer, then a BARRIER).
 * GEMM i runs on compute stream i % min(3, splits). Same-stream order is implicit; deps name
 * only cross-stream waits (and step 0). Offsets come from the layout queries, so the builder
 * and the layout cannot disagree; tpf_schedule_check verifies the result independently.
 */
#include "internal.h"

#include <string.h>

typedef unsigned long long ull;

#define MAX_CHUNKS (2 * TPF_MAX_RANKS)

typedef struct {
  tpf_step *steps;
  int n, cap;
  int last[TPF_NUM_STREAMS]; /* last step on each stream, -1 when none */
} builder;

static tpf_mref mref(tpf_operand_id id, uint64_t off, uint64_t ld, uint64_t row, uint64_t col) {
  tpf_mref m;
  memset(&m, 0, sizeof m);
  m.id = (uint8_t)id;
  m.off_bytes = off;
  m.ld = ld;
  m.row = row;
  m.col = col;
  return m;
}

static void add_dep(builder *b, int step, int dep) {
  tpf_step *s = &b->steps[step];
  if (dep < 0) return;
  for (int i = 0; i < s->ndeps; i++)
    if (s->deps[i] == dep) return;
  /* The builders never need more than TPF_STEP_MAX_DEPS (at most 0 plus two cross waits). */
  if (s->ndeps < TPF_STEP_MAX_DEPS) s->deps[s->ndeps++] = (uint16_t)dep;
}

/* Appends a step on `stream`; it depends on step 0 when it is the first of a non-comm stream. */
static int add_step(builder *b, tpf_step_kind kind, tpf_stream_id stream, int32_t chunk) {
  int i = b->n++;
  tpf_step *s = &b->steps[i];
  memset(s, 0, sizeof *s);
  s->kind = (uint8_t)kind;
  s->stream = (uint8_t)stream;
  s->peer = -1;
  s->chunk = chunk;
  if (i > 0 && stream != TPF_STREAM_COMM && b->last[stream] < 0) add_dep(b, i, 0);
  b->last[stream] = i;
  return i;
}

static int add_xfer(builder *b, tpf_step_kind kind, int peer, uint32_t tag, int32_t chunk,
                    uint64_t src, uint64_t dst, uint64_t bytes) {
  int i = add_step(b, kind, kind == TPF_STEP_SEND ? TPF_STREAM_COMM : TPF_STREAM_RECV, chunk);
  tpf_step *s = &b->steps[i];
  s->peer = peer;
  s->tag = tag;
  s->src_off = src;
  s->dst_off = dst;
  s->bytes = bytes;
  return i;
}

static int add_gemm(builder *b, int idx, int ns, int32_t chunk, tpf_mref a, tpf_mref w, tpf_mref d,
                    uint64_t m, uint64_t n, uint64_t k) {
  int i = add_step(b, TPF_STEP_GEMM, (tpf_stream_id)(idx % ns), chunk);
  tpf_step *s = &b->steps[i];
  s->a = a;
  s->w = w;
  s->d = d;
  s->m = m;
  s->n = n;
  s->k = k;
  return i;
}

static int mod(int a, int p) {
  return ((a % p) + p) % p;
}

/* Shared context of one build. */
typedef struct {
  const tpf_layout_desc *d;
  tpf_schedule *h;
  tpf_region ch[MAX_CHUNKS]; /* the active layout's chunks/slots/blocks */
  int p, r;
  uint64_t R, S, H; /* chunk rows, chunk bytes, columns */
} ctx;

static void build_ring_ag(builder *b, const ctx *c) {
  int p = c->p, r = c->r, ns = c->h->num_compute_streams;
  uint64_t H = c->H, R = c->R, S = c->S, N = c->h->gemm_n;
  tpf_mref w = mref(TPF_MAT_W, 0, 0, 0, 0);

  if (c->h->aggregate) {
    int partner = r ^ 1, base = r - (r % 2), next = mod(r + 2, p), prev = mod(r - 2, p);
    add_xfer(b, TPF_STEP_SEND, partner, 0, r, c->ch[r].offset_bytes, c->ch[r].offset_bytes, S);
    int last_recv = add_xfer(b, TPF_STEP_RECV, partner, 0, partner, c->ch[partner].offset_bytes,
                             c->ch[partner].offset_bytes, S);
    for (int i = 0; i < p / 2; i++) {
      int cs = mod(base - 2 * i, p), cr = mod(base - 2 * i - 2, p);
      uint64_t row = (uint64_t)cs * R; /* <= T: no overflow */
      int gi = add_gemm(b, i, ns, cs, mref(TPF_MAT_BUF, 0, H, row, 0), w,
                        mref(TPF_MAT_D, 0, 0, row, 0), 2 * R, N, H);
      add_dep(b, gi, last_recv);
      if (i < p / 2 - 1) {
        uint64_t cs_off = c->ch[cs].offset_bytes, cr_off = c->ch[cr].offset_bytes;
        int si = add_xfer(b, TPF_STEP_SEND, next, (uint32_t)(i + 1), cs, cs_off, cs_off, 2 * S);
        add_dep(b, si, last_recv);
        last_recv = add_xfer(b, TPF_STEP_RECV, prev, (uint32_t)(i + 1), cr, cr_off, cr_off, 2 * S);
      }
    }
    return;
  }

  int last_recv = -1;
  bool single = c->h->num_splits == 1 && p > 1;
  for (int i = 0; i < p; i++) {
    int cs = mod(r - i, p), cr = mod(r - i - 1, p);
    if (!single) {
      uint64_t row = (uint64_t)cs * R;
      int gi = add_gemm(b, i, ns, cs, mref(TPF_MAT_BUF, 0, H, row, 0), w,
                        mref(TPF_MAT_D, 0, 0, row, 0), R, N, H);
      add_dep(b, gi, last_recv);
    }
    if (i < p - 1) {
      uint64_t cs_off = c->ch[cs].offset_bytes, cr_off = c->ch[cr].offset_bytes;
      int si = add_xfer(b, TPF_STEP_SEND, mod(r + 1, p), (uint32_t)i, cs, cs_off, cs_off, S);
      add_dep(b, si, last_recv);
      last_recv = add_xfer(b, TPF_STEP_RECV, mod(r - 1, p), (uint32_t)i, cr, cr_off, cr_off, S);
    }
  }
  if (single) {
    int gi = add_gemm(b, 0, ns, -1, mref(TPF_MAT_BUF, 0, H, 0, 0), w, mref(TPF_MAT_D, 0, 0, 0, 0),
                      c->h->rows, N, H);
    add_dep(b, gi, last_recv);
  }
}

/* The end of every RING RS: this rank's chunk is the sum of slot P-1 (its own partial) and the
 * P-1 received slots after it, into D; after `dep` (the last GEMM) and the last receive. */
static void add_ring_rs_reduce(builder *b, const ctx *c, int dep, int last_recv) {
  int ri = add_step(b, TPF_STEP_REDUCE, TPF_STREAM_COMPUTE0, c->p - 1);
  tpf_step *s = &b->steps[ri];
  s->a = mref(TPF_MAT_BUF, c->ch[c->p - 1].offset_bytes, c->H, 0, 0);
  s->d = mref(TPF_MAT_D, 0, 0, 0, 0);
  s->m = c->R;
  s->n = c->H;
  s->stride_bytes = c->S;
  s->count = (uint32_t)c->p;
  add_dep(b, ri, dep);
  add_dep(b, ri, last_recv);
}

/* RING RS without overlap (num_splits 1, the planner's baseline): every partial first, then the
 * exchange. Slot i holds chunk (r + i + 1) % P as in the ring, so the partials of chunks r+1..P-1
 * (slots 0..P-r-2) and of chunks 0..r (slots P-r-1..P-1) are two contiguous row ranges of X and
 * of the buffer: at most two GEMM steps, whose sum is the one GEMM of all T rows. Then the same
 * sends, receives and reduction as the ring, all after the GEMMs. */
static void build_ring_rs_serial(builder *b, const ctx *c) {
  int p = c->p, r = c->r;
  uint64_t H = c->H, R = c->R, S = c->S, K = c->h->gemm_k;
  int g_hi = -1, g_lo = -1;
  if (r + 1 < p) /* chunks r+1 .. p-1 into slots 0 .. p-r-2 */
    g_hi = add_gemm(b, 0, 1, r + 1, mref(TPF_MAT_X, 0, 0, (uint64_t)(r + 1) * R, 0),
                    mref(TPF_MAT_W, 0, 0, 0, 0), mref(TPF_MAT_BUF, c->ch[0].offset_bytes, H, 0, 0),
                    (uint64_t)(p - r - 1) * R, H, K);
  /* chunks 0 .. r into slots p-r-1 .. p-1 */
  g_lo = add_gemm(b, 0, 1, 0, mref(TPF_MAT_X, 0, 0, 0, 0), mref(TPF_MAT_W, 0, 0, 0, 0),
                  mref(TPF_MAT_BUF, c->ch[p - r - 1].offset_bytes, H, 0, 0), (uint64_t)(r + 1) * R,
                  H, K);
  int last_recv = -1;
  for (int i = 1; i < p; i++) {
    uint64_t src = c->ch[i - 1].offset_bytes, dst = c->ch[i - 1 + p].offset_bytes;
    int si = add_xfer(b, TPF_STEP_SEND, mod(r + i, p), (uint32_t)i, i - 1, src, dst, S);
    add_dep(b, si, g_lo);
    add_dep(b, si, g_hi);
    last_recv = add_xfer(b, TPF_STEP_RECV, mod(r - i, p), (uint32_t)i, i - 1 + p, src, dst, S);
  }
  add_ring_rs_reduce(b, c, -1, last_recv);
}

static void build_ring_rs(builder *b, const ctx *c) {
  if (c->h->num_splits == 1 && c->p > 1) {
    build_ring_rs_serial(b, c);
    return;
  }
  int p = c->p, r = c->r, ns = c->h->num_compute_streams;
  uint64_t H = c->H, R = c->R, S = c->S, K = c->h->gemm_k;
  int prev_gemm = -1, last_recv = -1;
  for (int i = 0; i < p; i++) {
    int chunk = mod(r + i + 1, p);
    int gi = add_gemm(b, i, ns, i, mref(TPF_MAT_X, 0, 0, (uint64_t)chunk * R, 0),
                      mref(TPF_MAT_W, 0, 0, 0, 0),
                      mref(TPF_MAT_BUF, c->ch[i].offset_bytes, H, 0, 0), R, H, K);
    if (i > 0) {
      uint64_t src = c->ch[i - 1].offset_bytes, dst = c->ch[i - 1 + p].offset_bytes;
      int si = add_xfer(b, TPF_STEP_SEND, mod(r + i, p), (uint32_t)i, i - 1, src, dst, S);
      add_dep(b, si, prev_gemm);
      last_recv = add_xfer(b, TPF_STEP_RECV, mod(r - i, p), (uint32_t)i, i - 1 + p, src, dst, S);
    }
    prev_gemm = gi;
  }
  add_ring_rs_reduce(b, c, prev_gemm, last_recv);
}

static void build_pipeline_rs(builder *b, const ctx *c) {
  int splits = c->h->num_splits, ns = c->h->num_compute_streams;
  uint64_t hs = c->H / (uint64_t)splits, R = c->R, K = c->h->gemm_k, T = c->h->rows;
  uint64_t my_row = (uint64_t)c->r * R; /* < T */
  for (int i = 0; i < splits; i++) {
    uint64_t off = c->ch[i].offset_bytes, col = (uint64_t)i * hs; /* col < H */
    int gi = add_gemm(b, i, ns, i, mref(TPF_MAT_X, 0, 0, 0, 0), mref(TPF_MAT_W, 0, 0, col, 0),
                      mref(TPF_MAT_BUF, off, hs, 0, 0), T, hs, K);
    int bi = add_step(b, TPF_STEP_BARRIER, TPF_STREAM_COMM, i);
    b->steps[bi].tag = (uint32_t)i;
    add_dep(b, bi, gi);
    int pi = add_step(b, TPF_STEP_PEER_REDUCE, TPF_STREAM_COMM, i);
    tpf_step *s = &b->steps[pi];
    s->a = mref(TPF_MAT_BUF, off, hs, my_row, 0);
    s->d = mref(TPF_MAT_D, 0, 0, 0, col);
    s->m = R;
    s->n = hs;
    s->count = (uint32_t)c->p;
  }
  int bi = add_step(b, TPF_STEP_BARRIER, TPF_STREAM_COMM, -1);
  b->steps[bi].tag = (uint32_t)splits;
}

static void build_bulk(builder *b, const ctx *c) {
  int p = c->p, r = c->r;
  const tpf_schedule *h = c->h;
  add_gemm(b, 0, 1, -1, mref(TPF_MAT_X, 0, 0, 0, 0), mref(TPF_MAT_W, 0, 0, 0, 0),
           mref(TPF_MAT_D, 0, 0, 0, 0), h->gemm_m, h->gemm_n, h->gemm_k);
  if (h->coll == TPF_COLL_AG) {
    uint64_t mine = c->ch[r].offset_bytes;
    for (int j = 1; j < p; j++) {
      int q = mod(r - j, p);
      add_xfer(b, TPF_STEP_SEND, mod(r + j, p), 0, r, mine, mine, c->S);
      add_xfer(b, TPF_STEP_RECV, q, 0, q, c->ch[q].offset_bytes, c->ch[q].offset_bytes, c->S);
    }
    return;
  }
  uint64_t row = (uint64_t)r * c->R;
  int pi = add_step(b, TPF_STEP_PEER_REDUCE, TPF_STREAM_COMM, r);
  tpf_step *s = &b->steps[pi];
  s->a = mref(TPF_MAT_BUF, 0, c->H, row, 0);
  s->d = mref(TPF_MAT_BUF, 0, c->H, row, 0);
  s->m = c->R;
  s->n = c->H;
  s->count = (uint32_t)p;
  add_step(b, TPF_STEP_BARRIER, TPF_STREAM_COMM, -1); /* tag 0 */
}

/* P = 1: nothing to gather or reduce and no peer to agree with, so the operation is exactly its
 * one GEMM, with no handshake. RING AG: the gathered buffer is the local chunk,
 * [T, H], times W into D. RING and PIPELINE RS: D = op(X) op(W) straight into the output (the
 * epilogue rides on it; the buffer, scratch of the reduction, is not written). BULK: its
 * independent GEMM; the collective over one rank moves nothing. */
static void build_single(builder *b, const ctx *c) {
  const tpf_schedule *h = c->h;
  tpf_mref w = mref(TPF_MAT_W, 0, 0, 0, 0), d = mref(TPF_MAT_D, 0, 0, 0, 0);
  if (h->algo != TPF_ALGO_BULK && h->coll == TPF_COLL_AG)
    add_gemm(b, 0, 1, -1, mref(TPF_MAT_BUF, 0, c->H, 0, 0), w, d, h->rows, h->gemm_n, c->H);
  else
    add_gemm(b, 0, 1, -1, mref(TPF_MAT_X, 0, 0, 0, 0), w, d, h->gemm_m, h->gemm_n, h->gemm_k);
}

static tpf_status check_dims(const tpf_layout_desc *d, const tpf_gemm_dims *g) {
  uint64_t H = d->active.cols;
  TPF_RETURN_IF(g->m == 0 || g->n == 0 || g->k == 0, TPF_EINVAL,
                "gemm dims m %llu, n %llu, k %llu must be nonzero", (ull)g->m, (ull)g->n,
                (ull)g->k);
  if (d->algo == TPF_ALGO_BULK) return TPF_OK;
  if (d->coll == TPF_COLL_AG)
    TPF_RETURN_IF(g->k != H, TPF_EINVAL, "ag gemm k %llu must equal the hidden size %llu",
                  (ull)g->k, (ull)H);
  else
    TPF_RETURN_IF(g->n != H, TPF_EINVAL, "rs gemm n %llu must equal the hidden size %llu",
                  (ull)g->n, (ull)H);
  return TPF_OK;
}

/* Upper bound on the steps of every builder: handshake, 3 per ring step or block, extras. */
static int step_bound(int p, int splits) {
  return 8 + 4 * p + 3 * splits;
}

int tpf__schedule_max_steps(const tpf_layout_desc *d) {
  if (!d || d->tp_size < 1 || d->tp_size > TPF_MAX_RANKS) return 0;
  /* Every split count a shape of this capacity may resolve to: RING at most P, PIPELINE at most
   * TPF_MAX_SPLITS (and H), BULK 1. */
  int splits = 1;
  if (d->algo == TPF_ALGO_RING) splits = d->tp_size;
  if (d->algo == TPF_ALGO_PIPELINE)
    splits = d->capacity.cols < TPF_MAX_SPLITS ? (int)d->capacity.cols : TPF_MAX_SPLITS;
  if (splits < 1) splits = 1;
  return step_bound(d->tp_size, splits);
}

static tpf_status build(const tpf_layout_desc *d, const tpf_gemm_dims *g, tpf_step *storage,
                        int storage_cap, tpf_schedule *s);

tpf_status tpf_schedule_build(const tpf_layout_desc *d, const tpf_gemm_dims *g, tpf_schedule *s) {
  return build(d, g, NULL, 0, s);
}

tpf_status tpf__schedule_build_into(const tpf_layout_desc *d, const tpf_gemm_dims *g,
                                    tpf_step *storage, int storage_cap, tpf_schedule *s) {
  TPF_RETURN_IF(!storage || storage_cap < 1, TPF_EINVAL, "schedule_build_into: no storage");
  return build(d, g, storage, storage_cap, s);
}

static tpf_status build(const tpf_layout_desc *d, const tpf_gemm_dims *g, tpf_step *storage,
                        int storage_cap, tpf_schedule *s) {
  TPF_RETURN_IF(!d || !g || !s, TPF_EINVAL, "schedule_build: NULL argument");
  /* One validation (tpf_layout_check's rules, its 16-byte alignment) yields every region the
   * builders read (it was 5 + 2 per chunk: 21-259 per build). */
  tpf_layout_geom geo;
  TPF_CHECK(tpf__layout_geometry(d, 16, &geo));
  TPF_CHECK(check_dims(d, g));

  ctx c;
  memset(&c, 0, sizeof c);
  tpf_schedule h;
  memset(&h, 0, sizeof h);
  c.d = d;
  c.h = &h;
  c.p = d->tp_size;
  c.r = d->rank;
  c.H = d->active.cols;

  for (int j = 0; j < geo.count && j < MAX_CHUNKS; j++)
    c.ch[j] = geo.chunk[j];
  c.R = geo.local.rows;
  c.S = geo.local.bytes;

  h.tp_size = d->tp_size;
  h.rank = d->rank;
  h.algo = d->algo;
  h.coll = d->coll;
  h.dtype = d->dtype;
  h.num_splits = tpf__layout_splits(d);
  h.aggregate = d->aggregate;
  /* The handshake compares this key next to the rows: ranks whose operations differ in kind or
   * split count would move different bytes. */
  h.op_key = TPF_OP_KEY(d->algo == TPF_ALGO_BULK ? TPF_OP_BULK
                        : d->coll == TPF_COLL_AG ? TPF_OP_AG_GEMM
                                                 : TPF_OP_GEMM_RS,
                        h.num_splits);
  h.rows = d->active.rows;
  h.cols = d->active.cols;
  h.chunk_rows = c.R;
  h.chunk_bytes = c.S;
  h.registered_bytes = geo.registered_bytes;
  h.active_bytes = geo.active_bytes;
  if (d->algo == TPF_ALGO_BULK) {
    h.gemm_m = g->m;
    h.gemm_n = g->n;
    h.gemm_k = g->k;
  } else {
    h.gemm_m = d->active.rows;
    h.gemm_n = d->coll == TPF_COLL_AG ? g->n : c.H;
    h.gemm_k = d->coll == TPF_COLL_AG ? c.H : g->k;
  }
  h.num_compute_streams =
      h.num_splits < TPF_MAX_COMPUTE_STREAMS ? h.num_splits : TPF_MAX_COMPUTE_STREAMS;

  builder b;
  memset(&b, 0, sizeof b);
  b.cap = step_bound(c.p, h.num_splits);
  for (int i = 0; i < TPF_NUM_STREAMS; i++)
    b.last[i] = -1;
  if (storage) {
    /* Caller-owned storage (the communicator's): no allocation on the per-operation path. */
    TPF_RETURN_IF(storage_cap < b.cap, TPF_ESTATE,
                  "schedule of up to %d steps does not fit the %d reserved steps", b.cap,
                  storage_cap);
    b.steps = storage;
  } else {
    b.steps = tpf__calloc((size_t)b.cap, sizeof *b.steps);
    TPF_RETURN_IF(!b.steps, TPF_ENOMEM, "schedule of %d steps: out of memory", b.cap);
  }

  if (c.p == 1) {
    /* One GEMM on compute 0 (build_single); the layout above was still validated with the
     * caller's split count, so a request the layout refuses is refused at every P. */
    h.num_splits = 1;
    h.num_compute_streams = 1;
    h.op_key = TPF_OP_KEY(TPF_OP_KEY_KIND(h.op_key), 1);
    build_single(&b, &c);
    h.nsteps = b.n;
    h.steps = b.steps;
    tpf__schedule_mechanisms(&h);
    *s = h;
    return TPF_OK;
  }
  add_step(&b, TPF_STEP_HANDSHAKE, TPF_STREAM_COMM, -1);
  switch (d->algo) {
  case TPF_ALGO_RING:
    if (d->coll == TPF_COLL_AG)
      build_ring_ag(&b, &c);
    else
      build_ring_rs(&b, &c);
    break;
  case TPF_ALGO_PIPELINE:
    build_pipeline_rs(&b, &c);
    break;
  default:
    build_bulk(&b, &c);
    break;
  }
  h.nsteps = b.n;
  h.steps = b.steps;
  tpf__schedule_mechanisms(&h);
  *s = h;
  return TPF_OK;
}

void tpf_schedule_free(tpf_schedule *s) {
  if (!s) return;
  tpf__free(s->steps);
  s->steps = NULL;
  s->nsteps = 0;
}

const char *tpf_step_kind_name(int kind) {
  static const char *const names[] = {"HANDSHAKE", "GEMM",        "SEND",   "RECV",
                                      "REDUCE",    "PEER_REDUCE", "BARRIER"};
  if (kind < 0 || kind >= TPF_STEP_KIND_COUNT) return "?";
  return names[kind];
}

const char *tpf_stream_name(int stream) {
  static const char *const names[] = {"compute0", "compute1", "compute2", "comm", "recv"};
  if (stream < 0 || stream >= TPF_NUM_STREAMS) return "?";
  return names[stream];
}
