/* Fuzz target (c): schedules pass the core checker, and a symbolic replay of all ranks' steps in
 * a fuzzer-chosen interleaving ends with every rank holding the right chunks or sums.
 *
 * Method: the input decodes one operation (RING AG plain / single-GEMM / aggregate, RING RS,
 * PIPELINE RS, BULK AG / RS; P up to 8; small T, C, H and GEMM dims). The target builds every
 * rank's schedule twice (deterministic, field by field), checks the headers against the layout
 * queries, runs tpf_schedule_check, then replays the P schedules on symbolic memory:
 *  - every element of every rank's registration, and of its output D, holds a symbol
 *    {mask, row, col}: mask is the set of ranks whose contribution it carries (0: nothing valid
 *    yet; all ones: the canary beyond the active layout), row/col its position in the logical
 *    matrix (AG(X) for all-gathers, the summed product for reduce-scatters);
 *  - a step may run when its stream's previous step and its deps have completed; RECV also needs
 *    the matching SEND's flag, BARRIER and HANDSHAKE need every rank to have arrived. Among the
 *    runnable steps of all ranks the input picks the next one (then a generator seeded by the
 *    input), so the fuzzer explores interleavings, and a missing dependency shows as a read of
 *    data that has not arrived or has been overwritten;
 *  - SEND copies symbols into the peer and raises its flag; GEMM reads whole rows of AG(X) (or X)
 *    and writes product symbols; REDUCE / PEER_REDUCE require addends of one position with
 *    disjoint, non-empty masks and write their union (each contribution exactly once);
 *  - nothing may read or write outside the active layout, and the canary beyond it must survive.
 * Finally: AG — every rank's chunk j holds rank j's shard and every D row t was computed once
 * from row t of AG(X); RS — each rank's output rows hold the contributions of all P ranks exactly
 * once (BULK RS: in place in its chunk r); BULK's independent GEMM wrote D exactly once.
 */
#include "tpflex/tpflex.h"
#include "tpflex/tpflex_backend.h"

#include "fuzz_input.h"

#include <string.h>

#define MAX_P 8
#define MAX_REG_ELEMS (1u << 14)
#define MAX_D_ELEMS (1u << 12)
#define CANARY UINT64_MAX

typedef unsigned long long ull;

typedef struct {
  uint64_t mask; /* contributing ranks; 0 = no valid data; CANARY beyond the active layout */
  uint32_t row, col;
} sym;

typedef struct {
  /* inputs */
  const tpf_schedule *s; /* s[r]: rank r's schedule */
  int p;
  uint64_t e, H, R, T;
  uint64_t active_elems, reg_elems;
  uint64_t d_rows, d_cols; /* user output D per rank */
  uint64_t x_rows;         /* rows of the user input X (RS, BULK) */
  uint64_t w_rows;         /* rows of W (AG: N; RS: H; BULK: n) */
  uint64_t k_full;         /* the reduction dimension a GEMM must cover */
  /* state */
  sym *reg[MAX_P];
  sym *d[MAX_P];
  uint8_t *d_writes[MAX_P];
  uint8_t *done[MAX_P]; /* per step: 0 not started, 1 arrived (barrier/handshake), 2 done */
  uint32_t flags[MAX_P][MAX_P][TPF_MAX_TAGS]; /* [receiver][sender][tag]: raises */
  uint8_t arrived[MAX_P][TPF_MAX_TAGS + 1];   /* barrier tag t / handshake (TPF_MAX_TAGS) */
  int next[MAX_P][TPF_NUM_STREAMS];           /* next unfinished step on each stream, -1: none */
} machine;

static const char *kind_name(int k) {
  return tpf_step_kind_name(k);
}

/* Next step on `stream` at or after index `from`, or -1. */
static int next_on_stream(const tpf_schedule *s, int stream, int from) {
  for (int i = from; i < s->nsteps; i++)
    if (s->steps[i].stream == stream) return i;
  return -1;
}

/* Element index of (i, j) of a BUF view (every rank's layout is the same); r and step name the
 * executing rank and step for messages. */
static uint64_t buf_index(const machine *m, int r, int step, const tpf_mref *v, uint64_t extra_off,
                          uint64_t i, uint64_t j) {
  FUZZ_ASSERT_MSG((v->off_bytes + extra_off) % m->e == 0,
                  "rank %d step %d: BUF view offset %llu not element aligned", r, step,
                  (ull)(v->off_bytes + extra_off));
  uint64_t x = (v->off_bytes + extra_off) / m->e + (v->row + i) * v->ld + v->col + j;
  FUZZ_ASSERT_MSG(v->col + j < v->ld || v->ld == 0,
                  "rank %d step %d: column %llu beyond the view's ld %llu", r, step,
                  (ull)(v->col + j), (ull)v->ld);
  FUZZ_ASSERT_MSG(x < m->active_elems,
                  "rank %d step %d (%s): element %llu outside the active layout (%llu elements)", r,
                  step, kind_name(m->s[r].steps[step].kind), (ull)x, (ull)m->active_elems);
  return x;
}

static void write_d(machine *m, int r, int step, const tpf_mref *v, uint64_t i, uint64_t j,
                    sym val) {
  if (v->id == TPF_MAT_BUF) {
    uint64_t x = buf_index(m, r, step, v, 0, i, j);
    m->reg[r][x] = val;
    return;
  }
  FUZZ_ASSERT_MSG(v->id == TPF_MAT_D, "rank %d step %d writes operand %d", r, step, v->id);
  uint64_t row = v->row + i, col = v->col + j;
  FUZZ_ASSERT_MSG(row < m->d_rows && col < m->d_cols,
                  "rank %d step %d: D element (%llu, %llu) outside [%llu, %llu]", r, step, (ull)row,
                  (ull)col, (ull)m->d_rows, (ull)m->d_cols);
  m->d[r][row * m->d_cols + col] = val;
  m->d_writes[r][row * m->d_cols + col]++;
}

static void exec_gemm(machine *m, int r, int si) {
  const tpf_step *st = &m->s[r].steps[si];
  FUZZ_ASSERT_MSG(st->w.id == TPF_MAT_W && st->w.col == 0 && st->w.row + st->n <= m->w_rows,
                  "rank %d step %d: weight rows %llu..+%llu outside W's %llu", r, si,
                  (ull)st->w.row, (ull)st->n, (ull)m->w_rows);
  FUZZ_ASSERT_MSG(st->k == m->k_full, "rank %d step %d: k %llu, the operation's is %llu", r, si,
                  (ull)st->k, (ull)m->k_full);
  for (uint64_t i = 0; i < st->m; i++) {
    sym out;
    out.mask = 1;
    if (st->a.id == TPF_MAT_BUF) {
      /* A row of AG(X): k = H elements of one gathered row, in order, all arrived. */
      uint64_t x0 = buf_index(m, r, si, &st->a, 0, i, 0);
      sym first = m->reg[r][x0];
      for (uint64_t c = 0; c < st->k; c++) {
        sym v = m->reg[r][buf_index(m, r, si, &st->a, 0, i, c)];
        FUZZ_ASSERT_MSG(v.mask != 0 && v.mask != CANARY,
                        "rank %d step %d: GEMM reads row %llu col %llu before it arrived", r, si,
                        (ull)(st->a.row + i), (ull)c);
        FUZZ_ASSERT_MSG(v.row == first.row && v.col == c && v.mask == first.mask,
                        "rank %d step %d: GEMM row %llu mixes gathered rows", r, si, (ull)i);
      }
      FUZZ_ASSERT_MSG((first.mask & (first.mask - 1)) == 0 &&
                          first.mask == 1ull << (first.row / m->R),
                      "rank %d step %d: gathered row %u carries mask %llx, not its owner's", r, si,
                      first.row, (ull)first.mask);
      out.row = first.row;
    } else {
      FUZZ_ASSERT_MSG(st->a.id == TPF_MAT_X && st->a.col == 0 && st->a.row + st->m <= m->x_rows,
                      "rank %d step %d: GEMM input rows %llu..+%llu outside X's %llu", r, si,
                      (ull)st->a.row, (ull)st->m, (ull)m->x_rows);
      out.row = (uint32_t)(st->a.row + i);
      if (st->d.id == TPF_MAT_BUF)
        out.mask = 1ull << r; /* a partial product: this rank's contribution */
    }
    for (uint64_t j = 0; j < st->n; j++) {
      out.col = (uint32_t)(st->w.row + j);
      write_d(m, r, si, &st->d, i, j, out);
    }
  }
}

/* REDUCE (peer = false: my views shifted by stride) and PEER_REDUCE (view t on rank r+t). */
static void exec_reduce(machine *m, int r, int si, bool peer) {
  const tpf_step *st = &m->s[r].steps[si];
  FUZZ_ASSERT_MSG(st->a.id == TPF_MAT_BUF && st->count >= 1 && st->count <= (uint32_t)m->p,
                  "rank %d step %d: reduce of %u views", r, si, st->count);
  /* Read everything first: an in-place reduction writes what it reads. */
  uint64_t n = st->m * st->n;
  FUZZ_ASSERT(n <= MAX_REG_ELEMS);
  static sym out[MAX_REG_ELEMS];
  for (uint64_t i = 0; i < st->m; i++) {
    for (uint64_t j = 0; j < st->n; j++) {
      sym acc = {0, 0, 0};
      for (uint32_t t = 0; t < st->count; t++) {
        int q = peer ? (r + (int)t) % m->p : r;
        uint64_t shift = peer ? 0 : (uint64_t)t * st->stride_bytes;
        sym v = m->reg[q][buf_index(m, r, si, &st->a, shift, i, j)];
        FUZZ_ASSERT_MSG(v.mask != 0 && v.mask != CANARY,
                        "rank %d step %d: %s addend %u (rank %d) at (%llu, %llu) holds no data", r,
                        si, kind_name(st->kind), t, q, (ull)i, (ull)j);
        if (t == 0) {
          acc = v;
          continue;
        }
        FUZZ_ASSERT_MSG(v.row == acc.row && v.col == acc.col,
                        "rank %d step %d: sums (%u, %u) with (%u, %u)", r, si, acc.row, acc.col,
                        v.row, v.col);
        FUZZ_ASSERT_MSG((v.mask & acc.mask) == 0,
                        "rank %d step %d: contributions %llx counted twice at (%u, %u)", r, si,
                        (ull)(v.mask & acc.mask), v.row, v.col);
        acc.mask |= v.mask;
      }
      out[i * st->n + j] = acc;
    }
  }
  for (uint64_t i = 0; i < st->m; i++)
    for (uint64_t j = 0; j < st->n; j++)
      write_d(m, r, si, &st->d, i, j, out[i * st->n + j]);
}

static void exec_send(machine *m, int r, int si) {
  const tpf_step *st = &m->s[r].steps[si];
  int q = st->peer;
  FUZZ_ASSERT_MSG(q >= 0 && q < m->p && q != r, "rank %d step %d: SEND to rank %d", r, si, q);
  FUZZ_ASSERT_MSG(st->tag < TPF_MAX_TAGS, "rank %d step %d: tag %u", r, si, st->tag);
  FUZZ_ASSERT_MSG(st->src_off % m->e == 0 && st->dst_off % m->e == 0 && st->bytes % m->e == 0,
                  "rank %d step %d: SEND not element aligned", r, si);
  uint64_t src = st->src_off / m->e, dst = st->dst_off / m->e, n = st->bytes / m->e;
  FUZZ_ASSERT_MSG(src + n <= m->active_elems && dst + n <= m->active_elems && n > 0,
                  "rank %d step %d: SEND [%llu, +%llu) -> [%llu, +%llu) outside the active "
                  "layout (%llu elements)",
                  r, si, (ull)src, (ull)n, (ull)dst, (ull)n, (ull)m->active_elems);
  for (uint64_t i = 0; i < n; i++) {
    FUZZ_ASSERT_MSG(m->reg[r][src + i].mask != 0,
                    "rank %d step %d: SEND of element %llu that holds no data yet", r, si,
                    (ull)(src + i));
    m->reg[q][dst + i] = m->reg[r][src + i];
  }
  m->flags[q][r][st->tag]++;
}

/* Runs (or, for BARRIER/HANDSHAKE, arrives at / completes) step si of rank r. */
static void act(machine *m, int r, int si) {
  const tpf_step *st = &m->s[r].steps[si];
  switch (st->kind) {
  case TPF_STEP_HANDSHAKE:
  case TPF_STEP_BARRIER: {
    int slot = st->kind == TPF_STEP_HANDSHAKE ? TPF_MAX_TAGS : (int)st->tag;
    if (m->done[r][si] == 0) {
      m->arrived[r][slot] = 1;
      m->done[r][si] = 1;
      return;
    }
    break; /* completion: every rank arrived (checked by the caller) */
  }
  case TPF_STEP_GEMM:
    exec_gemm(m, r, si);
    break;
  case TPF_STEP_SEND:
    exec_send(m, r, si);
    break;
  case TPF_STEP_RECV:
    break; /* the data landed with the SEND; the flag was checked by the caller */
  case TPF_STEP_REDUCE:
    exec_reduce(m, r, si, false);
    break;
  case TPF_STEP_PEER_REDUCE:
    exec_reduce(m, r, si, true);
    break;
  default:
    FUZZ_ASSERT_MSG(false, "rank %d step %d: unknown kind %d", r, si, st->kind);
  }
  m->done[r][si] = 2;
  m->next[r][st->stream] = next_on_stream(&m->s[r], st->stream, si + 1);
}

/* Whether step si of rank r can act now. */
static bool enabled(const machine *m, int r, int si) {
  const tpf_step *st = &m->s[r].steps[si];
  if (m->done[r][si] == 1) { /* arrived at a barrier: wait for everyone */
    int slot = st->kind == TPF_STEP_HANDSHAKE ? TPF_MAX_TAGS : (int)st->tag;
    for (int q = 0; q < m->p; q++)
      if (!m->arrived[q][slot]) return false;
    return true;
  }
  for (int k = 0; k < st->ndeps; k++) {
    FUZZ_ASSERT_MSG(st->deps[k] < si, "rank %d step %d depends on a later step %d", r, si,
                    st->deps[k]);
    if (m->done[r][st->deps[k]] != 2) return false;
  }
  if (st->kind == TPF_STEP_RECV) {
    FUZZ_ASSERT(st->peer >= 0 && st->peer < m->p && st->tag < TPF_MAX_TAGS);
    return m->flags[r][st->peer][st->tag] > 0;
  }
  if (st->kind == TPF_STEP_BARRIER)
    FUZZ_ASSERT_MSG(st->tag < TPF_MAX_TAGS, "rank %d step %d: barrier tag %u", r, si, st->tag);
  return true;
}

static bool sym_is(sym v, uint64_t mask, uint64_t row, uint64_t col) {
  return v.mask == mask && v.row == row && v.col == col;
}

/* The gathered value of element x of [T, H]: rank (row / R)'s shard. */
static sym gathered(const machine *m, uint64_t x) {
  sym v;
  v.row = (uint32_t)(x / m->H);
  v.col = (uint32_t)(x % m->H);
  v.mask = 1ull << (v.row / m->R);
  return v;
}

static void replay(machine *m, tpf_fuzz_input *in, tpf_fuzz_rng *g) {
  const tpf_schedule *s0 = &m->s[0];
  bool ag = s0->coll == TPF_COLL_AG;
  bool bulk = s0->algo == TPF_ALGO_BULK;
  uint64_t all = m->p == 64 ? UINT64_MAX : (1ull << m->p) - 1;

  for (int r = 0; r < m->p; r++) {
    for (uint64_t x = 0; x < m->reg_elems; x++) {
      sym v = {0, 0, 0};
      if (x >= m->active_elems)
        v.mask = CANARY;
      else if (ag && x / (m->R * m->H) == (uint64_t)r)
        v = gathered(m, x); /* the local shard */
      else if (!ag && bulk && x < m->T * m->H) {
        v.row = (uint32_t)(x / m->H); /* this rank's [T, H] partials, reduced in place */
        v.col = (uint32_t)(x % m->H);
        v.mask = 1ull << r;
      }
      m->reg[r][x] = v;
    }
    for (int k = 0; k < TPF_NUM_STREAMS; k++)
      m->next[r][k] = next_on_stream(&m->s[r], k, 0);
  }

  /* The interleaving: the input (then the generator) picks among the enabled actions. */
  /* Every action completes a step or arrives at a barrier, so the loop ends. */
  for (;;) {
    int cand_r[MAX_P * TPF_NUM_STREAMS], cand_s[MAX_P * TPF_NUM_STREAMS], n = 0;
    bool finished = true;
    for (int r = 0; r < m->p; r++) {
      for (int k = 0; k < TPF_NUM_STREAMS; k++) {
        int si = m->next[r][k];
        if (si < 0) continue;
        finished = false;
        if (enabled(m, r, si)) {
          cand_r[n] = r;
          cand_s[n] = si;
          n++;
        }
      }
    }
    if (finished) break;
    if (n == 0) {
      for (int r = 0; r < m->p; r++)
        for (int k = 0; k < TPF_NUM_STREAMS; k++)
          if (m->next[r][k] >= 0)
            fprintf(stderr, "  rank %d stream %s stuck at step %d (%s)\n", r, tpf_stream_name(k),
                    m->next[r][k], kind_name(m->s[r].steps[m->next[r][k]].kind));
      FUZZ_ASSERT_MSG(false, "the schedules deadlock");
    }
    unsigned pick = tpf_fuzz_choose(in, g, (unsigned)n);
    act(m, cand_r[pick], cand_s[pick]);
  }

  /* Final state. */
  for (int r = 0; r < m->p; r++) {
    for (int i = 0; i < m->s[r].nsteps; i++)
      FUZZ_ASSERT(m->done[r][i] == 2);
    for (uint64_t x = m->active_elems; x < m->reg_elems; x++)
      FUZZ_ASSERT_MSG(m->reg[r][x].mask == CANARY, "rank %d: canary at element %llu overwritten", r,
                      (ull)x);
    uint64_t lo = (uint64_t)r * m->R; /* this rank's output rows */
    if (ag) {
      for (uint64_t x = 0; x < m->T * m->H; x++) {
        sym want = gathered(m, x), got = m->reg[r][x];
        FUZZ_ASSERT_MSG(sym_is(got, want.mask, want.row, want.col),
                        "AG rank %d: element %llu holds {%llx, %u, %u}, expected rank %llu's "
                        "(%u, %u)",
                        r, (ull)x, (ull)got.mask, got.row, got.col, (ull)(x / (m->R * m->H)),
                        want.row, want.col);
      }
    } else if (bulk) {
      for (uint64_t i = 0; i < m->R; i++)
        for (uint64_t c = 0; c < m->H; c++) {
          sym got = m->reg[r][(lo + i) * m->H + c];
          FUZZ_ASSERT_MSG(sym_is(got, all, lo + i, c),
                          "BULK RS rank %d: (%llu, %llu) holds {%llx, %u, %u}", r, (ull)(lo + i),
                          (ull)c, (ull)got.mask, got.row, got.col);
        }
    }
    /* D: every element written exactly once with the right symbol. */
    for (uint64_t i = 0; i < m->d_rows; i++) {
      for (uint64_t c = 0; c < m->d_cols; c++) {
        sym got = m->d[r][i * m->d_cols + c];
        uint8_t w = m->d_writes[r][i * m->d_cols + c];
        FUZZ_ASSERT_MSG(w == 1, "rank %d: D (%llu, %llu) written %u times", r, (ull)i, (ull)c, w);
        if (bulk || ag)
          FUZZ_ASSERT_MSG(sym_is(got, 1, i, c), "rank %d: D (%llu, %llu) = {%llx, %u, %u}", r,
                          (ull)i, (ull)c, (ull)got.mask, got.row, got.col);
        else
          FUZZ_ASSERT_MSG(sym_is(got, all, lo + i, c),
                          "RS rank %d: out (%llu, %llu) = {%llx, %u, %u}, expected all %d ranks "
                          "of row %llu",
                          r, (ull)i, (ull)c, (ull)got.mask, got.row, got.col, m->p, (ull)(lo + i));
      }
    }
  }
}

static bool step_equal(const tpf_step *a, const tpf_step *b) {
  if (a->kind != b->kind || a->stream != b->stream || a->ndeps != b->ndeps || a->peer != b->peer ||
      a->tag != b->tag || a->chunk != b->chunk || a->src_off != b->src_off ||
      a->dst_off != b->dst_off || a->bytes != b->bytes || a->m != b->m || a->n != b->n ||
      a->k != b->k || a->stride_bytes != b->stride_bytes || a->count != b->count)
    return false;
  for (int i = 0; i < a->ndeps && i < TPF_STEP_MAX_DEPS; i++)
    if (a->deps[i] != b->deps[i]) return false;
  const tpf_mref *x[3] = {&a->a, &a->w, &a->d}, *y[3] = {&b->a, &b->w, &b->d};
  for (int i = 0; i < 3; i++)
    if (x[i]->id != y[i]->id || x[i]->off_bytes != y[i]->off_bytes || x[i]->ld != y[i]->ld ||
        x[i]->row != y[i]->row || x[i]->col != y[i]->col)
      return false;
  return true;
}

static void check_header(const tpf_layout_desc *d, const tpf_schedule *s) {
  uint64_t reg = 0, act = 0;
  tpf_region local;
  FUZZ_ASSERT_STATUS(tpf_layout_registered_bytes(d, &reg), TPF_OK);
  FUZZ_ASSERT_STATUS(tpf_layout_active_bytes(d, &act), TPF_OK);
  FUZZ_ASSERT_STATUS(tpf_layout_local(d, &local), TPF_OK);
  FUZZ_ASSERT(s->tp_size == d->tp_size && s->rank == d->rank && s->algo == d->algo &&
              s->coll == d->coll && s->dtype == d->dtype);
  FUZZ_ASSERT(s->rows == d->active.rows && s->cols == d->active.cols);
  FUZZ_ASSERT(s->chunk_rows == local.rows && s->chunk_bytes == local.bytes);
  FUZZ_ASSERT(s->registered_bytes == reg && s->active_bytes == act);
  /* P = 1: the operation's one GEMM, no handshake. */
  FUZZ_ASSERT(s->nsteps >= 1 && s->steps &&
              (d->tp_size == 1 ? s->nsteps == 1 && s->steps[0].kind == TPF_STEP_GEMM
                               : s->steps[0].kind == TPF_STEP_HANDSHAKE));
  FUZZ_ASSERT(s->num_compute_streams >= 1 && s->num_compute_streams <= TPF_MAX_COMPUTE_STREAMS);
  for (int i = 0; i < s->nsteps; i++)
    FUZZ_ASSERT_MSG(
        s->steps[i].stream < TPF_NUM_STREAMS &&
            (s->steps[i].stream >= TPF_STREAM_COMM || s->steps[i].stream < s->num_compute_streams),
        "step %d on stream %d", i, s->steps[i].stream);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  tpf_fuzz_input in;
  tpf_fuzz_rng g;
  tpf_fuzz_init(&in, data, size);
  tpf_fuzz_rng_seed(&g, data, size);

  tpf_layout_desc d;
  memset(&d, 0, sizeof d);
  d.tp_size = tpf_fuzz_int(&in, 1, MAX_P);
  int p = d.tp_size;
  unsigned variant = (unsigned)tpf_fuzz_range(&in, 0, 6);
  switch (variant) {
  case 0: /* RING AG, P GEMM chunks (or the default) */
  case 1: /* RING AG, one GEMM after the exchange */
  case 2: /* RING AG aggregate */
    d.algo = TPF_ALGO_RING;
    d.coll = TPF_COLL_AG;
    d.aggregate = variant == 2 && p % 2 == 0;
    d.num_splits = variant == 1 ? 1 : tpf_fuzz_bool(&in) ? 0 : (d.aggregate ? p / 2 : p);
    break;
  case 3:
    d.algo = TPF_ALGO_RING;
    d.coll = TPF_COLL_RS;
    d.num_splits = tpf_fuzz_bool(&in) ? 0 : p;
    break;
  case 4:
    d.algo = TPF_ALGO_PIPELINE;
    d.coll = TPF_COLL_RS;
    d.num_splits = tpf_fuzz_int(&in, 0, 8);
    break;
  default:
    d.algo = TPF_ALGO_BULK;
    d.coll = variant == 5 ? TPF_COLL_AG : TPF_COLL_RS;
    break;
  }
  d.dtype = (tpf_dtype)tpf_fuzz_int(&in, 0, TPF_DTYPE_COUNT - 1);
  uint64_t up = (uint64_t)p;
  d.active.rows = up * tpf_fuzz_range(&in, 1, 4);
  d.capacity.rows = d.active.rows + up * tpf_fuzz_range(&in, 0, 3); /* fp8 too (SPEC §11) */
  d.capacity.cols = d.active.cols = 8 * tpf_fuzz_range(&in, 1, 12);

  uint64_t H = d.capacity.cols;
  tpf_gemm_dims gd;
  uint64_t small = tpf_fuzz_range(&in, 1, 4);
  if (d.algo == TPF_ALGO_BULK) {
    gd.m = tpf_fuzz_range(&in, 1, 8);
    gd.n = tpf_fuzz_range(&in, 1, 8);
    gd.k = tpf_fuzz_range(&in, 1, 8);
  } else if (d.coll == TPF_COLL_AG) {
    gd.m = d.active.rows;
    gd.n = small;
    gd.k = H;
  } else {
    gd.m = d.active.rows;
    gd.n = H;
    gd.k = small;
  }
  bool bad_dims = tpf_fuzz_range(&in, 0, 15) == 0;
  if (bad_dims) {
    if (tpf_fuzz_bool(&in))
      gd.k = 0;
    else if (d.algo == TPF_ALGO_BULK)
      gd.n = 0;
    else if (d.coll == TPF_COLL_AG)
      gd.k = H + 1;
    else
      gd.n = H + 1;
  }

  tpf_schedule scheds[MAX_P], again;
  memset(scheds, 0, sizeof scheds);
  tpf_status layout_status = tpf_layout_check(&d);
  for (int r = 0; r < p; r++) {
    d.rank = r;
    tpf_status want = layout_status != TPF_OK ? layout_status : bad_dims ? TPF_EINVAL : TPF_OK;
    FUZZ_ASSERT_STATUS(tpf_schedule_build(&d, &gd, &scheds[r]), want);
    if (want != TPF_OK) {
      FUZZ_ASSERT(r == 0 || scheds[r - 1].steps == NULL);
      continue;
    }
    check_header(&d, &scheds[r]);
    FUZZ_ASSERT_STATUS(tpf_schedule_build(&d, &gd, &again), TPF_OK);
    FUZZ_ASSERT_MSG(again.nsteps == scheds[r].nsteps && again.num_splits == scheds[r].num_splits &&
                        again.gemm_m == scheds[r].gemm_m && again.gemm_n == scheds[r].gemm_n &&
                        again.gemm_k == scheds[r].gemm_k,
                    "rank %d: schedule header differs between two builds", r);
    for (int i = 0; i < again.nsteps; i++)
      FUZZ_ASSERT_MSG(step_equal(&again.steps[i], &scheds[r].steps[i]),
                      "rank %d: step %d differs between two builds", r, i);
    tpf_schedule_free(&again);
    FUZZ_ASSERT(again.steps == NULL && again.nsteps == 0);
  }
  if (scheds[0].steps == NULL) return 0;

  FUZZ_ASSERT_STATUS(tpf_schedule_check(scheds, p), TPF_OK);

  machine *m = calloc(1, sizeof *m);
  FUZZ_ASSERT(m != NULL);
  m->s = scheds;
  m->p = p;
  m->e = tpf_dtype_size(d.dtype);
  m->H = H;
  m->T = d.active.rows;
  m->R = d.active.rows / up;
  m->active_elems = scheds[0].active_bytes / m->e;
  m->reg_elems = scheds[0].registered_bytes / m->e;
  if (d.algo == TPF_ALGO_BULK) {
    m->d_rows = gd.m;
    m->d_cols = gd.n;
    m->x_rows = gd.m;
    m->w_rows = gd.n;
    m->k_full = gd.k;
  } else if (d.coll == TPF_COLL_AG) {
    m->d_rows = m->T;
    m->d_cols = gd.n;
    m->w_rows = gd.n;
    m->k_full = H;
  } else {
    m->d_rows = m->R;
    m->d_cols = H;
    m->x_rows = m->T;
    m->w_rows = H;
    m->k_full = gd.k;
  }
  FUZZ_ASSERT(m->reg_elems <= MAX_REG_ELEMS && m->d_rows * m->d_cols <= MAX_D_ELEMS);
  for (int r = 0; r < p; r++) {
    m->reg[r] = calloc(m->reg_elems, sizeof(sym));
    m->d[r] = calloc(m->d_rows * m->d_cols, sizeof(sym));
    m->d_writes[r] = calloc(m->d_rows * m->d_cols, 1);
    m->done[r] = calloc((size_t)scheds[r].nsteps, 1);
    FUZZ_ASSERT(m->reg[r] && m->d[r] && m->d_writes[r] && m->done[r]);
  }
  replay(m, &in, &g);
  for (int r = 0; r < p; r++) {
    free(m->reg[r]);
    free(m->d[r]);
    free(m->d_writes[r]);
    free(m->done[r]);
    tpf_schedule_free(&scheds[r]);
  }
  free(m);
  return 0;
}
