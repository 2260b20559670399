/* An independent model of the active-shape rules of SPEC §3 and the layout sizes of SPEC §2,
 * shared by the fuzz targets (fuzz_shape_rules.c predicts statuses with it, fuzz_api_sim.c keeps
 * its model of communicators with it). It is written from the specification, not from
 * core/layout.c, and uses exact 128-bit arithmetic instead of the core's checked 64-bit helpers.
 *
 * Precedence when several rules fail follows the documented order (core/layout.c, "Method"):
 * arguments, shape, capacity, divisibility, 64-bit overflow, alignment (fp8 layouts follow the
 * active shape like any other, with 1-byte elements: SPEC §11).
 */
#ifndef TPF_FUZZ_SHAPE_MODEL_H
#define TPF_FUZZ_SHAPE_MODEL_H

#include "tpflex/tpflex.h"
#include "tpflex/tpflex_backend.h"

#include <stdbool.h>
#include <stdint.h>

__extension__ typedef unsigned __int128 u128;

#define U64_LIMIT ((u128)UINT64_MAX)

static inline uint64_t model_elem_bytes(tpf_dtype t) {
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

/* fp8 dtypes: 1-byte elements; operations on an fp8 RS buffer are refused (SPEC §11). */
static inline bool model_fp8(tpf_dtype t) {
  return t == TPF_FP8_E4M3 || t == TPF_FP8_E5M2;
}

static inline bool model_ring_rs(const tpf_layout_desc *d) {
  return d->algo == TPF_ALGO_RING && d->coll == TPF_COLL_RS;
}

/* The pipeline's column split count S (num_splits, or 4 when it divides H, else 1). */
static inline uint64_t model_pipeline_splits(const tpf_layout_desc *d) {
  if (d->num_splits > 0) return (uint64_t)d->num_splits;
  return d->capacity.cols % 4 == 0 ? 4 : 1;
}

/* Byte sizes of one shape, exact (128-bit). */
typedef struct {
  u128 chunk, total, block, part;
} model_sizes;

static inline model_sizes model_sizes_of(const tpf_layout_desc *d, uint64_t rows) {
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
static inline bool model_product_exceeds(uint64_t a, uint64_t b, uint64_t c) {
  u128 ab = (u128)a * b;
  if (c != 0 && ab > U64_LIMIT / c) return true;
  return false;
}

static inline bool model_sizes_overflow(const tpf_layout_desc *d, const model_sizes *z) {
  if (z->chunk > U64_LIMIT || z->total > U64_LIMIT) return true;
  return d->algo == TPF_ALGO_PIPELINE && (z->block > U64_LIMIT || z->part > U64_LIMIT);
}

/* The predicted status of validating d with alignment `align` (0 means 1). */
static inline tpf_status model_check(const tpf_layout_desc *d, uint64_t align) {
  if (align == 0) align = 1;
  int p = d->tp_size;
  if (p < 1 || p > TPF_MAX_RANKS || d->rank < 0 || d->rank >= p) return TPF_EINVAL;
  if ((unsigned)d->algo > (unsigned)TPF_ALGO_RING || (unsigned)d->coll > (unsigned)TPF_COLL_RS ||
      (unsigned)d->dtype > (unsigned)TPF_FP8_E5M2)
    return TPF_EINVAL;
  if (d->num_splits < 0 || d->num_splits > TPF_MAX_SPLITS) return TPF_EINVAL;
  /* The pipeline implements only RS; aggregate exists only for ring AG with an even P. */
  if (d->algo == TPF_ALGO_PIPELINE && d->coll != TPF_COLL_RS) return TPF_EUNSUPPORTED;
  if (d->aggregate && (d->algo != TPF_ALGO_RING || d->coll != TPF_COLL_AG || p % 2 != 0))
    return TPF_EUNSUPPORTED;

  /* rows >= 1 and cols >= 1, for capacity and active; cols == H. */
  if (d->capacity.rows < 1 || d->capacity.cols < 1 || d->active.rows < 1 || d->active.cols < 1)
    return TPF_ESHAPE;
  if (d->active.cols != d->capacity.cols) return TPF_ESHAPE;
  /* rows <= C. */
  if (d->active.rows > d->capacity.rows) return TPF_ECAPACITY;
  /* rows % P == 0 (capacity too); the split count the algorithm allows; PIPELINE: H % S == 0. */
  uint64_t up = (uint64_t)p;
  if (d->capacity.rows % up != 0 || d->active.rows % up != 0) return TPF_EDIVISIBLE;
  int s = d->num_splits;
  if (model_ring_rs(d)) {
    if (s != 0 && s != p && s != 1) return TPF_EDIVISIBLE; /* 1: no overlap (0.2) */
  } else if (d->algo == TPF_ALGO_RING) {
    if (d->aggregate ? (s != 0 && s != p / 2) : (s != 0 && s != p && s != 1)) return TPF_EDIVISIBLE;
  } else if (d->algo == TPF_ALGO_PIPELINE) {
    if (d->capacity.cols % model_pipeline_splits(d) != 0) return TPF_EDIVISIBLE;
  }
  /* No size or offset overflows 64 bits; capacity rows must fit the ready word's 40 bits. */
  if (d->capacity.rows >= (1ull << TPF_READY_ROWS_BITS)) return TPF_EOVERFLOW;
  uint64_t e = model_elem_bytes(d->dtype);
  const uint64_t rows_of[2] = {d->capacity.rows, d->active.rows};
  for (int i = 0; i < 2; i++) {
    if (model_product_exceeds(rows_of[i] / up, d->capacity.cols, e)) return TPF_EOVERFLOW;
    if (d->algo == TPF_ALGO_PIPELINE &&
        model_product_exceeds(rows_of[i], d->capacity.cols / model_pipeline_splits(d), e))
      return TPF_EOVERFLOW;
    model_sizes z = model_sizes_of(d, rows_of[i]);
    if (model_sizes_overflow(d, &z)) return TPF_EOVERFLOW;
  }
  /* Chunk bytes (and pipeline block and per-rank offsets) meet the alignment. */
  for (int i = 0; i < 2; i++) {
    model_sizes z = model_sizes_of(d, rows_of[i]);
    if (z.chunk % align != 0) return TPF_EALIGN;
    if (d->algo == TPF_ALGO_PIPELINE && (z.block % align != 0 || z.part % align != 0))
      return TPF_EALIGN;
  }
  return TPF_OK;
}

#endif /* TPF_FUZZ_SHAPE_MODEL_H */
