/* Packed active layouts and the active-shape rules of SPEC §3.
 *
 * Method: a layout is a pure function of the descriptor. Validation runs the rules in a fixed
 * order (argument errors, shape, capacity, divisibility, 64-bit overflow, alignment; fp8 layouts
 * follow the same rules with 1-byte elements) over both the capacity and the active shape, so that
 * a given bad descriptor always reports the same status and the same detail. Every size and offset
 * is computed once, with the checked helpers, by compute_sizes(); the queries below only read its
 * result. Chunk j of the active layout starts at j * S_T (packed), never at j * S_C: the gathered
 * result is a contiguous [T, H] prefix of the registration.
 */
#include "internal.h"

#include <string.h>

typedef unsigned long long ull;

/* Every size of one shape (capacity or active) that the rules and queries need. */
typedef struct {
  uint64_t rows;        /* T (or C) */
  uint64_t chunk_rows;  /* rows / P */
  uint64_t chunk_bytes; /* (rows / P) * H * e */
  uint64_t total_bytes; /* bytes the layout names: rows*H*e, or (2P-1) slots for RING RS */
  uint64_t block_bytes; /* PIPELINE: rows * (H/S) * e */
  uint64_t part_bytes;  /* PIPELINE: (rows/P) * (H/S) * e, the per-rank row offset in a block */
} shape_sizes;

size_t tpf_dtype_size(tpf_dtype t) {
  switch (t) {
  case TPF_BF16:
  case TPF_FP16:
    return 2;
  case TPF_FP32:
    return 4;
  case TPF_FP8_E4M3:
  case TPF_FP8_E5M2:
    return 1;
  default:
    return 0;
  }
}

const char *tpf_dtype_name(tpf_dtype t) {
  switch (t) {
  case TPF_BF16:
    return "bf16";
  case TPF_FP16:
    return "fp16";
  case TPF_FP32:
    return "fp32";
  case TPF_FP8_E4M3:
    return "fp8_e4m3";
  case TPF_FP8_E5M2:
    return "fp8_e5m2";
  default:
    return "?";
  }
}

const char *tpf_algo_name(tpf_algo a) {
  switch (a) {
  case TPF_ALGO_BULK:
    return "bulk";
  case TPF_ALGO_PIPELINE:
    return "pipeline";
  case TPF_ALGO_RING:
    return "ring";
  default:
    return "?";
  }
}

const char *tpf_coll_name(tpf_coll c) {
  switch (c) {
  case TPF_COLL_AG:
    return "ag";
  case TPF_COLL_RS:
    return "rs";
  default:
    return "?";
  }
}

bool tpf__dtype_quantized(tpf_dtype t) {
  return t == TPF_FP8_E4M3 || t == TPF_FP8_E5M2;
}

/* The ring-RS slot rule, the one place it is written (the core, the communicator's views and,
 * through tpf_manager_geometry, the Python package read it from here): RING RS registers 2P-1
 * chunk slots (each rank's partials travel through the P-1 slots after its own) and this rank's
 * reduced shard is slot P-1; every other layout names P chunks, and the local shard is chunk
 * `rank`. d's enums must be valid. */
static bool ring_rs(const tpf_layout_desc *d) {
  return d->algo == TPF_ALGO_RING && d->coll == TPF_COLL_RS;
}

int tpf__layout_slots(const tpf_layout_desc *d) {
  return ring_rs(d) ? 2 * d->tp_size - 1 : d->tp_size;
}

int tpf__layout_local_slot(const tpf_layout_desc *d) {
  return ring_rs(d) ? d->tp_size - 1 : d->rank;
}

int tpf__layout_splits(const tpf_layout_desc *d) {
  switch (d->algo) {
  case TPF_ALGO_RING:
    if (d->coll == TPF_COLL_RS) return d->num_splits == 1 ? 1 : d->tp_size; /* 1: no overlap */
    if (d->num_splits != 0) return d->num_splits;
    return d->aggregate ? d->tp_size / 2 : d->tp_size;
  case TPF_ALGO_PIPELINE:
    if (d->num_splits != 0) return d->num_splits;
    return d->capacity.cols % 4 == 0 ? 4 : 1;
  default:
    return 1; /* BULK: one independent GEMM */
  }
}

/* Argument errors (EINVAL) and unsupported combinations that are visible without any size. */
static tpf_status check_args(const tpf_layout_desc *d) {
  TPF_RETURN_IF(!d, TPF_EINVAL, "layout descriptor is NULL");
  TPF_RETURN_IF(d->tp_size < 1 || d->tp_size > TPF_MAX_RANKS, TPF_EINVAL,
                "tp_size %d outside [1, %d]", d->tp_size, TPF_MAX_RANKS);
  TPF_RETURN_IF(d->rank < 0 || d->rank >= d->tp_size, TPF_EINVAL, "rank %d outside [0, %d)",
                d->rank, d->tp_size);
  TPF_RETURN_IF((unsigned)d->algo >= (unsigned)TPF_ALGO_COUNT, TPF_EINVAL, "bad algo value %d",
                (int)d->algo);
  TPF_RETURN_IF((unsigned)d->coll >= (unsigned)TPF_COLL_COUNT, TPF_EINVAL, "bad coll value %d",
                (int)d->coll);
  TPF_RETURN_IF((unsigned)d->dtype >= (unsigned)TPF_DTYPE_COUNT, TPF_EINVAL, "bad dtype value %d",
                (int)d->dtype);
  TPF_RETURN_IF(d->num_splits < 0 || d->num_splits > TPF_MAX_SPLITS, TPF_EINVAL,
                "num_splits %d outside [0, %d]", d->num_splits, TPF_MAX_SPLITS);
  TPF_RETURN_IF(d->algo == TPF_ALGO_PIPELINE && d->coll != TPF_COLL_RS, TPF_EUNSUPPORTED,
                "the pipeline algorithm only implements rs, not %s", tpf_coll_name(d->coll));
  if (d->aggregate) {
    TPF_RETURN_IF(d->algo != TPF_ALGO_RING || d->coll != TPF_COLL_AG, TPF_EUNSUPPORTED,
                  "aggregate needs ring ag, not %s %s", tpf_algo_name(d->algo),
                  tpf_coll_name(d->coll));
    TPF_RETURN_IF(d->tp_size % 2 != 0, TPF_EUNSUPPORTED, "aggregate needs an even tp_size, not %d",
                  d->tp_size);
  }
  return TPF_OK;
}

static tpf_status check_shape(const char *what, tpf_shape s) {
  TPF_RETURN_IF(s.rows == 0 || s.cols == 0, TPF_ESHAPE, "%s shape [%llu, %llu] is empty", what,
                (ull)s.rows, (ull)s.cols);
  return TPF_OK;
}

/* The split-count rules (EDIVISIBLE) that depend on P, H and the algorithm. */
static tpf_status check_splits(const tpf_layout_desc *d) {
  int p = d->tp_size, s = d->num_splits;
  if (d->algo == TPF_ALGO_RING && d->coll == TPF_COLL_RS) {
    TPF_RETURN_IF(s != 0 && s != p && s != 1, TPF_EDIVISIBLE,
                  "ring rs needs num_splits tp_size %d, 1 (no overlap) (or 0), not %d", p, s);
  } else if (d->algo == TPF_ALGO_RING) {
    if (d->aggregate)
      TPF_RETURN_IF(s != 0 && s != p / 2, TPF_EDIVISIBLE,
                    "aggregate ring ag needs num_splits == tp_size/2 = %d (or 0), not %d", p / 2,
                    s);
    else
      TPF_RETURN_IF(s != 0 && s != p && s != 1, TPF_EDIVISIBLE,
                    "ring ag needs num_splits tp_size %d, 1 (or 0), not %d", p, s);
  } else if (d->algo == TPF_ALGO_PIPELINE) {
    uint64_t splits = (uint64_t)tpf__layout_splits(d);
    TPF_RETURN_IF(d->capacity.cols % splits != 0, TPF_EDIVISIBLE,
                  "hidden %llu not divisible by num_splits %llu", (ull)d->capacity.cols,
                  (ull)splits);
  }
  return TPF_OK;
}

/* Sizes of one shape; EOVERFLOW when any of them overflows 64 bits. Divisibility holds. */
static tpf_status compute_sizes(const tpf_layout_desc *d, const char *what, uint64_t rows,
                                shape_sizes *out) {
  uint64_t p = (uint64_t)d->tp_size, h = d->capacity.cols, e = tpf_dtype_size(d->dtype);
  shape_sizes z;
  memset(&z, 0, sizeof z);
  z.rows = rows;
  z.chunk_rows = rows / p;
  TPF_RETURN_IF(!tpf__mul3_u64(z.chunk_rows, h, e, &z.chunk_bytes), TPF_EOVERFLOW,
                "%s chunk bytes %llu * %llu * %llu overflow 64 bits", what, (ull)z.chunk_rows,
                (ull)h, (ull)e);
  uint64_t slots = (uint64_t)tpf__layout_slots(d);
  TPF_RETURN_IF(!tpf__mul_u64(slots, z.chunk_bytes, &z.total_bytes), TPF_EOVERFLOW,
                "%s layout bytes %llu * %llu overflow 64 bits", what, (ull)slots,
                (ull)z.chunk_bytes);
  if (d->algo == TPF_ALGO_PIPELINE) {
    uint64_t hs = h / (uint64_t)tpf__layout_splits(d);
    TPF_RETURN_IF(!tpf__mul3_u64(rows, hs, e, &z.block_bytes), TPF_EOVERFLOW,
                  "%s block bytes %llu * %llu * %llu overflow 64 bits", what, (ull)rows, (ull)hs,
                  (ull)e);
    TPF_RETURN_IF(!tpf__mul3_u64(z.chunk_rows, hs, e, &z.part_bytes), TPF_EOVERFLOW,
                  "%s block row offset bytes overflow 64 bits", what);
  }
  *out = z;
  return TPF_OK;
}

/* Chunk sizes of both shapes first, then the pipeline block sizes, so that a misaligned active
 * chunk is reported as such whatever the algorithm. */
static tpf_status check_align(const tpf_layout_desc *d, const shape_sizes *c, const shape_sizes *a,
                              uint64_t align) {
  const shape_sizes *z[2] = {c, a};
  const char *what[2] = {"capacity", "active"};
  for (int i = 0; i < 2; i++)
    TPF_RETURN_IF(z[i]->chunk_bytes % align != 0, TPF_EALIGN,
                  "%s chunk bytes %llu (%llu rows) not a multiple of the %llu-byte alignment",
                  what[i], (ull)z[i]->chunk_bytes, (ull)z[i]->chunk_rows, (ull)align);
  if (d->algo != TPF_ALGO_PIPELINE) return TPF_OK;
  for (int i = 0; i < 2; i++) {
    TPF_RETURN_IF(z[i]->block_bytes % align != 0, TPF_EALIGN,
                  "%s pipeline block bytes %llu not a multiple of the %llu-byte alignment", what[i],
                  (ull)z[i]->block_bytes, (ull)align);
    TPF_RETURN_IF(z[i]->part_bytes % align != 0, TPF_EALIGN,
                  "%s pipeline per-rank block offset %llu bytes not a multiple of the %llu-byte "
                  "alignment",
                  what[i], (ull)z[i]->part_bytes, (ull)align);
  }
  return TPF_OK;
}

/* Validations run by this thread (tpf__layout_validations: tests/unit/test_reuse.c counts
 * them per schedule build). Thread-local: ranks as threads do not share a cache line for it. */
static _Thread_local uint64_t g_validations;

uint64_t tpf__layout_validations(void) {
  return g_validations;
}

/* Runs every rule; on success fills the capacity and active sizes (either may be NULL). */
static tpf_status validate(const tpf_layout_desc *d, uint64_t align, shape_sizes *cap,
                           shape_sizes *act) {
  g_validations++;
  TPF_CHECK(check_args(d));
  if (align == 0) align = 1;
  uint64_t p = (uint64_t)d->tp_size;

  TPF_CHECK(check_shape("capacity", d->capacity));
  TPF_CHECK(check_shape("active", d->active));
  TPF_RETURN_IF(d->active.cols != d->capacity.cols, TPF_ESHAPE,
                "active cols %llu differ from capacity cols %llu", (ull)d->active.cols,
                (ull)d->capacity.cols);

  TPF_RETURN_IF(d->active.rows > d->capacity.rows, TPF_ECAPACITY,
                "active rows %llu exceed capacity %llu", (ull)d->active.rows,
                (ull)d->capacity.rows);

  TPF_RETURN_IF(d->capacity.rows % p != 0, TPF_EDIVISIBLE,
                "capacity rows %llu not divisible by tp_size %llu", (ull)d->capacity.rows, (ull)p);
  TPF_RETURN_IF(d->active.rows % p != 0, TPF_EDIVISIBLE, "rows %llu not divisible by tp_size %llu",
                (ull)d->active.rows, (ull)p);
  TPF_CHECK(check_splits(d));

  TPF_RETURN_IF(d->capacity.rows >= (1ull << TPF_READY_ROWS_BITS), TPF_EOVERFLOW,
                "capacity rows %llu do not fit the %d-bit rows of the ready word",
                (ull)d->capacity.rows, TPF_READY_ROWS_BITS);
  shape_sizes c, a;
  TPF_CHECK(compute_sizes(d, "capacity", d->capacity.rows, &c));
  TPF_CHECK(compute_sizes(d, "active", d->active.rows, &a));

  TPF_CHECK(check_align(d, &c, &a, align));

  if (cap) *cap = c;
  if (act) *act = a;
  return TPF_OK;
}

tpf_status tpf__layout_check_align(const tpf_layout_desc *d, uint64_t align_bytes) {
  return validate(d, align_bytes, NULL, NULL);
}

tpf_status tpf_layout_check(const tpf_layout_desc *d) {
  return validate(d, 16, NULL, NULL);
}

/* The queries validate with every rule except alignment, which belongs to the backend (the
 * communicator checked it with the backend's value before it asks). */
tpf_status tpf_layout_registered_bytes(const tpf_layout_desc *d, uint64_t *bytes) {
  shape_sizes c;
  TPF_RETURN_IF(!bytes, TPF_EINVAL, "bytes out-parameter is NULL");
  TPF_CHECK(validate(d, 1, &c, NULL));
  *bytes = c.total_bytes;
  return TPF_OK;
}

tpf_status tpf_layout_active_bytes(const tpf_layout_desc *d, uint64_t *bytes) {
  shape_sizes a;
  TPF_RETURN_IF(!bytes, TPF_EINVAL, "bytes out-parameter is NULL");
  TPF_CHECK(validate(d, 1, NULL, &a));
  *bytes = a.total_bytes;
  return TPF_OK;
}

tpf_status tpf_layout_chunk_count(const tpf_layout_desc *d, int *count) {
  TPF_RETURN_IF(!count, TPF_EINVAL, "count out-parameter is NULL");
  TPF_CHECK(validate(d, 1, NULL, NULL));
  *count = d->algo == TPF_ALGO_PIPELINE ? tpf__layout_splits(d) : tpf__layout_slots(d);
  return TPF_OK;
}

tpf_status tpf_layout_chunk(const tpf_layout_desc *d, int j, tpf_region *out) {
  shape_sizes a;
  int count;
  TPF_RETURN_IF(!out, TPF_EINVAL, "region out-parameter is NULL");
  TPF_CHECK(tpf_layout_chunk_count(d, &count));
  TPF_RETURN_IF(j < 0 || j >= count, TPF_EINVAL, "chunk %d outside [0, %d)", j, count);
  TPF_CHECK(validate(d, 1, NULL, &a));
  tpf_region r;
  /* No overflow: every chunk lies inside total_bytes, which was computed checked. */
  if (d->algo == TPF_ALGO_PIPELINE) {
    r.offset_bytes = (uint64_t)j * a.block_bytes;
    r.bytes = a.block_bytes;
    r.rows = a.rows;
  } else {
    r.offset_bytes = (uint64_t)j * a.chunk_bytes;
    r.bytes = a.chunk_bytes;
    r.rows = a.chunk_rows;
  }
  *out = r;
  return TPF_OK;
}

tpf_status tpf_layout_local(const tpf_layout_desc *d, tpf_region *out) {
  shape_sizes a;
  TPF_RETURN_IF(!out, TPF_EINVAL, "region out-parameter is NULL");
  TPF_CHECK(validate(d, 1, NULL, &a));
  uint64_t j = (uint64_t)tpf__layout_local_slot(d);
  tpf_region r;
  r.offset_bytes = j * a.chunk_bytes;
  r.bytes = a.chunk_bytes;
  r.rows = a.chunk_rows;
  *out = r;
  return TPF_OK;
}

tpf_status tpf__layout_geometry(const tpf_layout_desc *d, uint64_t align_bytes,
                                tpf_layout_geom *out) {
  shape_sizes c, a;
  TPF_RETURN_IF(!out, TPF_EINVAL, "geometry out-parameter is NULL");
  TPF_CHECK(validate(d, align_bytes, &c, &a));
  tpf_layout_geom g;
  memset(&g, 0, sizeof g);
  const bool pipe = d->algo == TPF_ALGO_PIPELINE;
  g.count = pipe ? tpf__layout_splits(d) : tpf__layout_slots(d);
  /* As tpf_layout_chunk and tpf_layout_local, from the sizes of the one validation. */
  for (int j = 0; j < g.count; j++) {
    g.chunk[j].offset_bytes = (uint64_t)j * (pipe ? a.block_bytes : a.chunk_bytes);
    g.chunk[j].bytes = pipe ? a.block_bytes : a.chunk_bytes;
    g.chunk[j].rows = pipe ? a.rows : a.chunk_rows;
  }
  const uint64_t j = (uint64_t)tpf__layout_local_slot(d);
  g.local.offset_bytes = j * a.chunk_bytes;
  g.local.bytes = a.chunk_bytes;
  g.local.rows = a.chunk_rows;
  /* The whole active buffer: every slot (RING RS: 2P-1 of them; otherwise the [T, H] prefix). */
  g.buffer.offset_bytes = 0;
  g.buffer.bytes = a.total_bytes;
  g.buffer.rows = (uint64_t)tpf__layout_slots(d) * a.chunk_rows;
  g.registered_bytes = c.total_bytes;
  g.active_bytes = a.total_bytes;
  *out = g;
  return TPF_OK;
}
