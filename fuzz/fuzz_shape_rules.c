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
 * shape, capacity, divisibility, 64-bit overflow, alignment (fp8: 1-byte elements), external
 * communicators.
 */
#include "tpflex/tpflex.h"
#include "tpflex/tpflex_backend.h"

#include "fuzz_input.h"
#include "shape_model.h"

#include <string.h>
#define SMALL_REG_BYTES (64u * 1024u)

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
  FUZZ_ASSERT_MSG(s1 == s2, "tpf_layout_check not deterministic: %s then %s", tpf_status_name(s1),
                  tpf_status_name(s2));
  if (s1 != TPF_OK) {
    FUZZ_ASSERT_MSG(first[0] != '\0', "%s without a detail", tpf_status_name(s1));
    FUZZ_ASSERT_MSG(strcmp(first, tpf_last_error()) == 0, "detail differs: '%s' vs '%s'", first,
                    tpf_last_error());
  }
  return s1;
}

static void check_numbers_in_detail(const tpf_layout_desc *d, tpf_status s) {
  char num[32];
  if (s != TPF_ECAPACITY) return;
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
    if (cfg.external && w == TPF_OK) w = TPF_EUNSUPPORTED; /* SPEC §3's last rule */
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
