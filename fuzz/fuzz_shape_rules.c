/* Fuzz target (a): active-shape validation against an independent model of SPEC §3.
 *
 * Method: the input decodes a layout descriptor whose every field may be out of range (P, rank,
 * enum values, split count, dimensions drawn from values that break size arithmetic), plus a
 * backend alignment and a second active shape. A model written here from SPEC §3 — with 128-bit
 * arithmetic instead of the core's checked 64-bit helpers — predicts the status, and the target
 * asserts that
 *  - tpf_layout_check (16-byte alignment) and the layout queries (alignment 1) return exactly the
 *    predicted status, leave their out-parameters untouched on failure, record a detail, and
 *    return the formula's byte counts on success;
 *  - a communicator created on a host-only test backend with that alignment obeys the same rules
 *    at creation (capacity shape) and in tpf_comm_set_active_shape, which on failure changes
 *    nothing (shape, epoch, no backend activation) and on success tells the backend exactly the
 *    active bytes of the formula;
 *  - every answer is deterministic (asked twice, same status and same detail).
 *
 * Precedence when several rules fail follows the documented order (core/layout.c): arguments,
 * shape, capacity, divisibility, 64-bit overflow, alignment, quantized communicators.
 */
#include "tpflex/tpflex.h"
#include "tpflex/tpflex_backend.h"

#include "fuzz_input.h"

#include <string.h>

__extension__ typedef unsigned __int128 u128;

#define U64_LIMIT ((u128)UINT64_MAX)
#define SMALL_REG_BYTES (64u * 1024u)

/* ---- The model ---------------------------------------------------------------------------- */

static uint64_t model_elem_bytes(tpf_dtype t) {
  switch (t) {
  case TPF_FP32:
    return 4;
  case TPF_FP8_E4M3:
  case TPF_FP8_E5M2:
    return 1;
  default:
    return 2;
  }
}

static bool model_quantized(tpf_dtype t) { return t == TPF_FP8_E4M3 || t == TPF_FP8_E5M2; }

static bool model_ring_rs(const tpf_layout_desc *d) {
  return d->algo == TPF_ALGO_RING && d->coll == TPF_COLL_RS;
}

/* The pipeline's column split count S (num_splits, or 4 when it divides H, else 1). */
static uint64_t model_pipeline_splits(const tpf_layout_desc *d) {
  if (d->num_splits > 0)
    return (uint64_t)d->num_splits;
  return d->capacity.cols % 4 == 0 ? 4 : 1;
}

/* Byte sizes of one shape, exact (128-bit). */
typedef struct {
  u128 chunk, total, block, part;
} model_sizes;

static model_sizes model_sizes_of(const tpf_layout_desc *d, uint64_t rows) {
  model_sizes z;
  u128 p = (u128)d->tp_size, h = d->capacity.cols, e = model_elem_bytes(d->dtype);
  z.chunk = (u128)(rows / (uint64_t)d->tp_size) * h * e;
  z.total = z.chunk * (model_ring_rs(d) ? 2 * p - 1 : p);
  z.block = z.part = 0;
  if (d->algo == TPF_ALGO_PIPELINE) {
    u128 hs = h / model_pipeline_splits(d);
    z.block = (u128)rows * hs * e;
    z.part = (u128)(rows / (uint64_t)d->tp_size) * hs * e;
  }
  return z;
}

/* True when a * b * c does not fit 64 bits (exact: the 128-bit product of the first two factors
 * is checked against the headroom the third one needs). */
static bool model_product_exceeds(uint64_t a, uint64_t b, uint64_t c) {
  u128 ab = (u128)a * b;
  if (c != 0 && ab > U64_LIMIT / c)
    return true;
  return false;
}

static bool model_sizes_overflow(const tpf_layout_desc *d, const model_sizes *z) {
  if (z->chunk > U64_LIMIT || z->total > U64_LIMIT)
    return true;
  return d->algo == TPF_ALGO_PIPELINE && (z->block > U64_LIMIT || z->part > U64_LIMIT);
}

/* The predicted status of validating d with alignment `align` (0 means 1). */
static tpf_status model_check(const tpf_layout_desc *d, uint64_t align) {
  if (align == 0)
    align = 1;
  int p = d->tp_size;
  if (p < 1 || p > TPF_MAX_RANKS || d->rank < 0 || d->rank >= p)
    return TPF_EINVAL;
  if ((unsigned)d->algo > (unsigned)TPF_ALGO_RING || (unsigned)d->coll > (unsigned)TPF_COLL_RS ||
      (unsigned)d->dtype > (unsigned)TPF_FP8_E5M2)
    return TPF_EINVAL;
  if (d->num_splits < 0 || d->num_splits > TPF_MAX_SPLITS)
    return TPF_EINVAL;
  /* The pipeline implements only RS; aggregate exists only for ring AG with an even P. */
  if (d->algo == TPF_ALGO_PIPELINE && d->coll != TPF_COLL_RS)
    return TPF_EUNSUPPORTED;
  if (d->aggregate && (d->algo != TPF_ALGO_RING || d->coll != TPF_COLL_AG || p % 2 != 0))
    return TPF_EUNSUPPORTED;

  /* rows >= 1 and cols >= 1, for capacity and active; cols == H. */
  if (d->capacity.rows < 1 || d->capacity.cols < 1 || d->active.rows < 1 || d->active.cols < 1)
    return TPF_ESHAPE;
  if (d->active.cols != d->capacity.cols)
    return TPF_ESHAPE;
  /* rows <= C. */
  if (d->active.rows > d->capacity.rows)
    return TPF_ECAPACITY;
  /* rows % P == 0 (capacity too); the split count the algorithm allows; PIPELINE: H % S == 0. */
  uint64_t up = (uint64_t)p;
  if (d->capacity.rows % up != 0 || d->active.rows % up != 0)
    return TPF_EDIVISIBLE;
  int s = d->num_splits;
  if (model_ring_rs(d)) {
    if (s != 0 && s != p)
      return TPF_EDIVISIBLE;
  } else if (d->algo == TPF_ALGO_RING) {
    if (d->aggregate ? (s != 0 && s != p / 2) : (s != 0 && s != p && s != 1))
      return TPF_EDIVISIBLE;
  } else if (d->algo == TPF_ALGO_PIPELINE) {
    if (d->capacity.cols % model_pipeline_splits(d) != 0)
      return TPF_EDIVISIBLE;
  }
  /* No size or offset overflows 64 bits; capacity rows must fit the ready word's 40 bits. */
  if (d->capacity.rows >= (1ull << TPF_READY_ROWS_BITS))
    return TPF_EOVERFLOW;
  uint64_t e = model_elem_bytes(d->dtype);
  const uint64_t rows_of[2] = {d->capacity.rows, d->active.rows};
  for (int i = 0; i < 2; i++) {
    if (model_product_exceeds(rows_of[i] / up, d->capacity.cols, e))
      return TPF_EOVERFLOW;
    if (d->algo == TPF_ALGO_PIPELINE &&
        model_product_exceeds(rows_of[i], d->capacity.cols / model_pipeline_splits(d), e))
      return TPF_EOVERFLOW;
    model_sizes z = model_sizes_of(d, rows_of[i]);
    if (model_sizes_overflow(d, &z))
      return TPF_EOVERFLOW;
  }
  /* Chunk bytes (and pipeline block and per-rank offsets) meet the alignment. */
  for (int i = 0; i < 2; i++) {
    model_sizes z = model_sizes_of(d, rows_of[i]);
    if (z.chunk % align != 0)
      return TPF_EALIGN;
    if (d->algo == TPF_ALGO_PIPELINE && (z.block % align != 0 || z.part % align != 0))
      return TPF_EALIGN;
  }
  /* A quantized layout stays at its capacity shape. */
  if (model_quantized(d->dtype) && d->active.rows != d->capacity.rows)
    return TPF_EUNSUPPORTED;
  return TPF_OK;
}

/* ---- A host-only test backend: registrations are bookkeeping, nothing is executed --------- */

struct tpf_reg {
  void *data; /* real memory for small registrations (views are checked), else NULL */
  uint64_t bytes;
  uint64_t active_bytes;
  int activations;
};

typedef struct {
  tpf_backend hdr;
  tpf_backend_ops ops;
  int live;
  struct tpf_reg *last;
  unsigned char byte; /* the "data" every registration points at; never dereferenced */
} fz_backend;

static tpf_status fz_reg_create(tpf_backend *be, const char *name, uint64_t bytes, tpf_reg **reg,
                                void **local) {
  fz_backend *b = (fz_backend *)be;
  (void)name;
  tpf_reg *r = calloc(1, sizeof *r);
  FUZZ_ASSERT(r != NULL);
  /* Views point into the registration, so pointer arithmetic on them is only defined when the
   * memory exists: small registrations get real (untouched) memory and their views are checked;
   * large ones point at one dummy byte and their views are not formed. */
  if (bytes <= SMALL_REG_BYTES) {
    r->data = malloc((size_t)bytes);
    FUZZ_ASSERT(r->data != NULL);
  }
  r->bytes = bytes;
  r->active_bytes = bytes;
  b->live++;
  b->last = r;
  *reg = r;
  *local = r->data ? r->data : &b->byte;
  return TPF_OK;
}

static tpf_status fz_reg_destroy(tpf_backend *be, tpf_reg *reg) {
  fz_backend *b = (fz_backend *)be;
  b->live--;
  free(reg->data);
  free(reg);
  return TPF_OK;
}

static tpf_status fz_reg_activate(tpf_backend *be, tpf_reg *reg, uint64_t active_bytes) {
  (void)be;
  FUZZ_ASSERT_MSG(active_bytes <= reg->bytes, "activated %llu bytes of a %llu-byte registration",
                  (unsigned long long)active_bytes, (unsigned long long)reg->bytes);
  reg->active_bytes = active_bytes;
  reg->activations++;
  return TPF_OK;
}

static tpf_status fz_execute(tpf_backend *be, tpf_reg *reg, const tpf_exec_args *a, void *s) {
  (void)be;
  (void)reg;
  (void)a;
  (void)s;
  return TPF_OK;
}

static tpf_status fz_sync(tpf_backend *be, void *stream) {
  (void)be;
  (void)stream;
  return TPF_OK;
}

/* ---- Checks ------------------------------------------------------------------------------- */

/* A status and its detail, asked twice: the same both times (determinism). */
static tpf_status checked_twice(const tpf_layout_desc *d) {
  char first[512];
  tpf_status s1 = tpf_layout_check(d);
  snprintf(first, sizeof first, "%s", tpf_last_error());
  tpf_status s2 = tpf_layout_check(d);
  FUZZ_ASSERT_MSG(s1 == s2, "tpf_layout_check not deterministic: %s then %s",
                  tpf_status_name(s1), tpf_status_name(s2));
  if (s1 != TPF_OK) {
    FUZZ_ASSERT_MSG(first[0] != '\0', "%s without a detail", tpf_status_name(s1));
    FUZZ_ASSERT_MSG(strcmp(first, tpf_last_error()) == 0, "detail differs: '%s' vs '%s'", first,
                    tpf_last_error());
  }
  return s1;
}

static void check_numbers_in_detail(const tpf_layout_desc *d, tpf_status s) {
  char num[32];
  if (s != TPF_ECAPACITY)
    return;
  /* "active rows 4100 exceed capacity 4096": both numbers appear. */
  snprintf(num, sizeof num, "%llu", (unsigned long long)d->active.rows);
  FUZZ_ASSERT_MSG(strstr(tpf_last_error(), num), "detail '%s' lacks the active rows %s",
                  tpf_last_error(), num);
  snprintf(num, sizeof num, "%llu", (unsigned long long)d->capacity.rows);
  FUZZ_ASSERT_MSG(strstr(tpf_last_error(), num), "detail '%s' lacks the capacity %s",
                  tpf_last_error(), num);
}

/* The byte-count queries use alignment 1 and must agree with the model and the formulas. */
static void check_queries(const tpf_layout_desc *d) {
  const uint64_t sentinel = 0xdeadbeefcafef00dull;
  tpf_status want = model_check(d, 1);
  uint64_t reg = sentinel, act = sentinel;
  int count = -7;
  FUZZ_ASSERT_STATUS(tpf_layout_registered_bytes(d, &reg), want);
  FUZZ_ASSERT_STATUS(tpf_layout_active_bytes(d, &act), want);
  FUZZ_ASSERT_STATUS(tpf_layout_chunk_count(d, &count), want);
  FUZZ_ASSERT_STATUS(tpf_layout_registered_bytes(d, NULL), TPF_EINVAL);
  if (want != TPF_OK) {
    FUZZ_ASSERT_MSG(reg == sentinel && act == sentinel && count == -7,
                    "an out-parameter was written on failure (%s)", tpf_status_name(want));
    return;
  }
  model_sizes c = model_sizes_of(d, d->capacity.rows), a = model_sizes_of(d, d->active.rows);
  FUZZ_ASSERT_MSG((u128)reg == c.total, "registered bytes %llu differ from the formula",
                  (unsigned long long)reg);
  FUZZ_ASSERT_MSG((u128)act == a.total, "active bytes %llu differ from the formula",
                  (unsigned long long)act);
  FUZZ_ASSERT(act <= reg);
  int want_count = d->algo == TPF_ALGO_PIPELINE ? (int)model_pipeline_splits(d)
                   : model_ring_rs(d)           ? 2 * d->tp_size - 1
                                                : d->tp_size;
  FUZZ_ASSERT_MSG(count == want_count, "chunk count %d, expected %d", count, want_count);
}

static const uint64_t alignments[] = {1, 2, 4, 16, 64, 256};

/* A communicator on the test backend follows the same rules at creation and on a shape change. */
static void check_comm(tpf_fuzz_input *in, const tpf_layout_desc *d) {
  if (d->tp_size < 1 || d->tp_size > TPF_MAX_RANKS || d->rank < 0 || d->rank >= d->tp_size)
    return; /* the backend itself would be invalid: covered by the layout checks */
  fz_backend b;
  memset(&b, 0, sizeof b);
  b.ops.abi_version = TPF_BACKEND_ABI_VERSION;
  b.ops.name = "fuzz";
  b.ops.align_bytes = alignments[tpf_fuzz_range(in, 0, 5)];
  b.ops.max_ranks = TPF_MAX_RANKS;
  b.ops.reg_create = fz_reg_create;
  b.ops.reg_destroy = fz_reg_destroy;
  b.ops.reg_activate = fz_reg_activate;
  b.ops.execute = fz_execute;
  b.ops.sync = fz_sync;
  b.hdr.ops = &b.ops;
  b.hdr.tp_size = d->tp_size;
  b.hdr.rank = d->rank;

  tpf_comm_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.name = "fuzz_site";
  cfg.algo = d->algo;
  cfg.coll = d->coll;
  cfg.dtype = d->dtype;
  cfg.capacity = d->capacity;
  cfg.num_splits = d->num_splits;
  cfg.aggregate = d->aggregate;
  cfg.external = tpf_fuzz_bool(in);

  tpf_layout_desc cap = *d;
  cap.active = d->capacity;
  tpf_comm *c = (tpf_comm *)&b; /* sentinel: must stay untouched on failure */
  tpf_status want = model_check(&cap, b.ops.align_bytes);
  FUZZ_ASSERT_STATUS(tpf_comm_create(&b.hdr, &cfg, &c), want);
  if (want != TPF_OK) {
    FUZZ_ASSERT(c == (tpf_comm *)&b && b.live == 0);
    return;
  }
  FUZZ_ASSERT(b.live == 1);
  uint64_t reg_bytes = 0;
  void *base = NULL;
  FUZZ_ASSERT_STATUS(tpf_comm_registration(c, &base, &reg_bytes), TPF_OK);
  FUZZ_ASSERT((u128)reg_bytes == model_sizes_of(&cap, cap.capacity.rows).total);
  FUZZ_ASSERT(b.last->bytes == reg_bytes);
  FUZZ_ASSERT(base == (b.last->data ? b.last->data : (void *)&b.byte));

  /* Two shape changes in a row: each is judged from the state the previous one left. */
  tpf_shape cur = d->capacity;
  uint64_t epoch = 0;
  for (int round = 0; round < 2; round++) {
    tpf_shape next = d->active;
    if (round == 1) {
      next.rows = tpf_fuzz_dim(in, (uint64_t)d->tp_size);
      next.cols = tpf_fuzz_bool(in) ? d->capacity.cols : tpf_fuzz_dim(in, 1);
    }
    tpf_layout_desc nd = *d;
    nd.active = next;
    tpf_status w = model_check(&nd, b.ops.align_bytes);
    if (model_quantized(d->dtype) || cfg.external)
      w = TPF_EUNSUPPORTED;
    int acts = b.last->activations;
    FUZZ_ASSERT_STATUS(tpf_comm_set_active_shape(c, next), w);
    tpf_shape got = tpf_comm_active_shape(c);
    if (w == TPF_OK) {
      cur = next;
      epoch++;
      FUZZ_ASSERT(b.last->activations == acts + 1);
      FUZZ_ASSERT_MSG((u128)b.last->active_bytes == model_sizes_of(&nd, next.rows).total,
                      "backend told %llu active bytes", (unsigned long long)b.last->active_bytes);
    } else {
      FUZZ_ASSERT_MSG(b.last->activations == acts, "a refused shape reached the backend");
      FUZZ_ASSERT_MSG(tpf_last_error()[0] != '\0', "no detail for %s", tpf_status_name(w));
    }
    FUZZ_ASSERT_MSG(got.rows == cur.rows && got.cols == cur.cols,
                    "active shape [%llu, %llu], model [%llu, %llu]", (unsigned long long)got.rows,
                    (unsigned long long)got.cols, (unsigned long long)cur.rows,
                    (unsigned long long)cur.cols);
    FUZZ_ASSERT(tpf_comm_epoch(c) == epoch);
    tpf_shape capshape = tpf_comm_capacity_shape(c);
    FUZZ_ASSERT(capshape.rows == d->capacity.rows && capshape.cols == d->capacity.cols);
  }

  /* The views follow the current active shape (formed only over real memory, see above). */
  tpf_matrix full, local;
  if (!b.last->data) {
    FUZZ_ASSERT_STATUS(tpf_comm_destroy(c), TPF_OK);
    FUZZ_ASSERT(b.live == 0);
    return;
  }
  FUZZ_ASSERT_STATUS(tpf_comm_buffer(c, &full), TPF_OK);
  FUZZ_ASSERT_STATUS(tpf_comm_local_chunk(c, &local), TPF_OK);
  uint64_t p = (uint64_t)d->tp_size;
  uint64_t want_rows = model_ring_rs(d) ? (2 * p - 1) * (cur.rows / p) : cur.rows;
  FUZZ_ASSERT(full.ptr == base && full.rows == want_rows && full.cols == cur.cols);
  FUZZ_ASSERT(local.rows == cur.rows / p && local.cols == cur.cols);
  uint64_t j = model_ring_rs(d) ? p - 1 : (uint64_t)d->rank;
  u128 off = (u128)j * (cur.rows / p) * cur.cols * model_elem_bytes(d->dtype);
  uint64_t got_off = (uint64_t)((uintptr_t)local.ptr - (uintptr_t)base);
  FUZZ_ASSERT_MSG((u128)got_off == off, "local chunk at +%llu, expected +%llu",
                  (unsigned long long)got_off, (unsigned long long)off);

  FUZZ_ASSERT_STATUS(tpf_comm_destroy(c), TPF_OK);
  FUZZ_ASSERT(b.live == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  tpf_fuzz_input in;
  tpf_fuzz_init(&in, data, size);

  tpf_layout_desc d;
  memset(&d, 0, sizeof d);
  d.tp_size = tpf_fuzz_int(&in, -1, TPF_MAX_RANKS + 2);
  d.rank = tpf_fuzz_int(&in, -1, d.tp_size > 0 ? d.tp_size : 1);
  d.algo = (tpf_algo)tpf_fuzz_int(&in, 0, TPF_ALGO_COUNT);
  d.coll = (tpf_coll)tpf_fuzz_int(&in, 0, TPF_COLL_COUNT);
  d.dtype = (tpf_dtype)tpf_fuzz_int(&in, 0, TPF_DTYPE_COUNT);
  d.num_splits = tpf_fuzz_int(&in, -1, TPF_MAX_SPLITS + 1);
  d.aggregate = tpf_fuzz_bool(&in);
  uint64_t unit = d.tp_size > 0 ? (uint64_t)d.tp_size : 1;
  d.capacity.rows = tpf_fuzz_dim(&in, unit);
  d.capacity.cols = tpf_fuzz_dim(&in, 8);
  d.active.rows = tpf_fuzz_bool(&in) ? tpf_fuzz_dim(&in, unit) : d.capacity.rows / 2;
  d.active.cols = tpf_fuzz_range(&in, 0, 7) != 0 ? d.capacity.cols : tpf_fuzz_dim(&in, 8);

  FUZZ_ASSERT_STATUS(tpf_layout_check(NULL), TPF_EINVAL);
  tpf_status want = model_check(&d, 16);
  tpf_status got = checked_twice(&d);
  FUZZ_ASSERT_MSG(got == want,
                  "tpf_layout_check = %s, model = %s (P %d r %d %s %s %s splits %d agg %d "
                  "C [%llu, %llu] T [%llu, %llu]; detail: %s)",
                  tpf_status_name(got), tpf_status_name(want), d.tp_size, d.rank,
                  tpf_algo_name(d.algo), tpf_coll_name(d.coll), tpf_dtype_name(d.dtype),
                  d.num_splits, (int)d.aggregate, (unsigned long long)d.capacity.rows,
                  (unsigned long long)d.capacity.cols, (unsigned long long)d.active.rows,
                  (unsigned long long)d.active.cols, tpf_last_error());
  check_numbers_in_detail(&d, got);
  check_queries(&d);
  check_comm(&in, &d);
  return 0;
}
