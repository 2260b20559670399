/* Fuzz target (b): every packed active layout tiles exactly the bytes it names.
 *
 * Method: the input decodes a descriptor biased towards valid ones (any algorithm/collective,
 * P up to 64, T a multiple of P up to C, dimensions up to near-overflow sizes). When the layout
 * queries accept it, the target asserts, with 128-bit arithmetic written from SPEC §2:
 *  - the chunks/slots/blocks, in order, tile [0, active_bytes) exactly: chunk 0 starts at 0, each
 *    starts where the previous one ends, the last ends at active_bytes (no gap, no overlap);
 *  - every chunk equals its formula (RING/BULK: j * S_T, S_T bytes, T/P rows; RING RS: 2P-1 slots
 *    of S_T; PIPELINE: block j at j * T * (H/S) * e, T rows) and lies inside the registration;
 *  - the local shard equals its formula (chunk r; RING RS: slot P-1) and lies inside the active
 *    bytes;
 *  - the layout depends on T only: the same query for another rank, or for another capacity that
 *    still holds T, gives identical chunks (packed layouts do not remember the capacity or the
 *    history of T), and asking twice gives identical answers (determinism);
 *  - out-of-range chunk indices are refused with TPF_EINVAL and leave the output untouched.
 * When the queries refuse the descriptor, all of them refuse it with the same status.
 */
#include "tpflex/tpflex.h"

#include "fuzz_input.h"

#include <string.h>

__extension__ typedef unsigned __int128 u128;

#define MAX_CHUNKS (2 * 64)

static uint64_t elem_bytes(tpf_dtype t) {
  return t == TPF_FP32 ? 4 : t >= TPF_FP8_E4M3 ? 1 : 2;
}

static bool ring_rs(const tpf_layout_desc *d) {
  return d->algo == TPF_ALGO_RING && d->coll == TPF_COLL_RS;
}

static uint64_t pipeline_splits(const tpf_layout_desc *d) {
  return d->num_splits > 0 ? (uint64_t)d->num_splits : d->capacity.cols % 4 == 0 ? 4 : 1;
}

/* The whole layout as the queries report it. */
typedef struct {
  tpf_status status;
  uint64_t reg_bytes, active_bytes;
  int count;
  tpf_region chunk[MAX_CHUNKS];
  tpf_region local;
} layout;

static void query(const tpf_layout_desc *d, layout *l) {
  memset(l, 0, sizeof *l);
  tpf_status s[4];
  s[0] = tpf_layout_registered_bytes(d, &l->reg_bytes);
  s[1] = tpf_layout_active_bytes(d, &l->active_bytes);
  s[2] = tpf_layout_chunk_count(d, &l->count);
  s[3] = tpf_layout_local(d, &l->local);
  for (int i = 1; i < 4; i++)
    FUZZ_ASSERT_MSG(s[i] == s[0], "layout queries disagree: %s vs %s", tpf_status_name(s[0]),
                    tpf_status_name(s[i]));
  l->status = s[0];
  if (s[0] != TPF_OK) return;
  FUZZ_ASSERT_MSG(l->count >= 1 && l->count <= MAX_CHUNKS, "chunk count %d", l->count);
  for (int j = 0; j < l->count; j++)
    FUZZ_ASSERT_STATUS(tpf_layout_chunk(d, j, &l->chunk[j]), TPF_OK);
}

static bool same_region(const tpf_region *a, const tpf_region *b) {
  return a->offset_bytes == b->offset_bytes && a->bytes == b->bytes && a->rows == b->rows;
}

static bool same_chunks(const layout *a, const layout *b) {
  if (a->count != b->count || a->active_bytes != b->active_bytes) return false;
  for (int j = 0; j < a->count; j++)
    if (!same_region(&a->chunk[j], &b->chunk[j])) return false;
  return true;
}

static void check_layout(const tpf_layout_desc *d, const layout *l) {
  const u128 p = (u128)d->tp_size, T = d->active.rows, C = d->capacity.rows, H = d->capacity.cols;
  const u128 e = elem_bytes(d->dtype);
  const u128 st = (T / p) * H * e; /* S_T */
  const u128 slots = ring_rs(d) ? 2 * p - 1 : p;

  FUZZ_ASSERT_MSG((u128)l->reg_bytes == slots * (C / p) * H * e, "registered %llu bytes",
                  (unsigned long long)l->reg_bytes);
  FUZZ_ASSERT_MSG((u128)l->active_bytes == slots * st, "active %llu bytes",
                  (unsigned long long)l->active_bytes);
  FUZZ_ASSERT(l->active_bytes <= l->reg_bytes);

  int want_count = d->algo == TPF_ALGO_PIPELINE ? (int)pipeline_splits(d) : (int)slots;
  FUZZ_ASSERT_MSG(l->count == want_count, "%d chunks, expected %d", l->count, want_count);

  /* Exact tiling of [0, active_bytes), in index order. */
  u128 at = 0;
  for (int j = 0; j < l->count; j++) {
    const tpf_region *c = &l->chunk[j];
    FUZZ_ASSERT_MSG((u128)c->offset_bytes == at, "chunk %d starts at %llu, previous ends at %llu",
                    j, (unsigned long long)c->offset_bytes, (unsigned long long)at);
    FUZZ_ASSERT_MSG(c->bytes > 0, "chunk %d is empty", j);
    at += c->bytes;
    FUZZ_ASSERT_MSG(at <= (u128)l->reg_bytes, "chunk %d ends past the registration", j);
    if (d->algo == TPF_ALGO_PIPELINE) {
      u128 block = T * (H / pipeline_splits(d)) * e;
      FUZZ_ASSERT((u128)c->offset_bytes == (u128)j * block && (u128)c->bytes == block &&
                  (u128)c->rows == T);
    } else {
      FUZZ_ASSERT((u128)c->offset_bytes == (u128)j * st && (u128)c->bytes == st &&
                  (u128)c->rows == T / p);
    }
  }
  FUZZ_ASSERT_MSG(at == (u128)l->active_bytes, "chunks end at %llu, active bytes %llu",
                  (unsigned long long)at, (unsigned long long)l->active_bytes);

  /* This rank's shard: chunk r of [T, H] (RING RS: slot P-1, its own partial). */
  u128 j = ring_rs(d) ? p - 1 : (u128)d->rank;
  FUZZ_ASSERT_MSG((u128)l->local.offset_bytes == j * st && (u128)l->local.bytes == st &&
                      (u128)l->local.rows == T / p,
                  "local shard at %llu, %llu bytes", (unsigned long long)l->local.offset_bytes,
                  (unsigned long long)l->local.bytes);
  FUZZ_ASSERT((u128)l->local.offset_bytes + l->local.bytes <= (u128)l->active_bytes);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  tpf_fuzz_input in;
  tpf_fuzz_init(&in, data, size);

  tpf_layout_desc d;
  memset(&d, 0, sizeof d);
  d.tp_size = tpf_fuzz_int(&in, 1, 64);
  d.rank = tpf_fuzz_int(&in, 0, d.tp_size - 1);
  d.algo = (tpf_algo)tpf_fuzz_int(&in, 0, TPF_ALGO_COUNT - 1);
  d.coll = d.algo == TPF_ALGO_PIPELINE ? TPF_COLL_RS : (tpf_coll)tpf_fuzz_int(&in, 0, 1);
  d.dtype = (tpf_dtype)tpf_fuzz_int(&in, 0, TPF_DTYPE_COUNT - 1);
  d.aggregate =
      d.algo == TPF_ALGO_RING && d.coll == TPF_COLL_AG && d.tp_size % 2 == 0 && tpf_fuzz_bool(&in);
  unsigned split_mode = (unsigned)tpf_fuzz_range(&in, 0, 3);
  d.num_splits = split_mode == 0   ? 0
                 : split_mode == 1 ? 1
                 : split_mode == 2 ? (d.aggregate ? d.tp_size / 2 : d.tp_size)
                                   : tpf_fuzz_int(&in, 0, 64);
  uint64_t p = (uint64_t)d.tp_size;
  bool huge = tpf_fuzz_range(&in, 0, 7) == 0;
  d.capacity.rows = huge ? tpf_fuzz_dim(&in, p) : p * tpf_fuzz_range(&in, 1, 4096);
  d.capacity.cols = huge ? tpf_fuzz_dim(&in, 16) : 8 * tpf_fuzz_range(&in, 1, 2048);
  uint64_t cap_chunks = d.capacity.rows / p;
  d.active.rows = p * tpf_fuzz_range(&in, 1, cap_chunks ? cap_chunks : 1);
  d.active.cols = d.capacity.cols;

  layout l, again;
  query(&d, &l);
  query(&d, &again);
  FUZZ_ASSERT_MSG(l.status == again.status && memcmp(&l, &again, sizeof l) == 0,
                  "layout queries are not deterministic");
  if (l.status != TPF_OK) {
    tpf_region untouched = {1, 2, 3};
    tpf_region r = untouched;
    FUZZ_ASSERT_STATUS(tpf_layout_chunk(&d, 0, &r), l.status);
    FUZZ_ASSERT(same_region(&r, &untouched));
    return 0;
  }
  check_layout(&d, &l);

  /* Out-of-range chunk indices. */
  tpf_region untouched = {1, 2, 3}, r = untouched;
  FUZZ_ASSERT_STATUS(tpf_layout_chunk(&d, -1, &r), TPF_EINVAL);
  FUZZ_ASSERT_STATUS(tpf_layout_chunk(&d, l.count, &r), TPF_EINVAL);
  FUZZ_ASSERT_STATUS(tpf_layout_chunk(&d, 0, NULL), TPF_EINVAL);
  FUZZ_ASSERT(same_region(&r, &untouched));

  /* Chunks do not depend on the rank asking. */
  tpf_layout_desc other = d;
  other.rank = tpf_fuzz_int(&in, 0, d.tp_size - 1);
  layout lo;
  query(&other, &lo);
  FUZZ_ASSERT_STATUS(lo.status, TPF_OK);
  FUZZ_ASSERT_MSG(same_chunks(&l, &lo), "rank %d and rank %d see different chunks", d.rank,
                  other.rank);

  /* Packed: another capacity that still holds T gives the same active chunks (fp8 too). */
  {
    tpf_layout_desc bigger = d;
    bigger.capacity.rows = d.active.rows + p * tpf_fuzz_range(&in, 0, 64);
    layout lb;
    query(&bigger, &lb);
    if (lb.status == TPF_OK) {
      check_layout(&bigger, &lb);
      FUZZ_ASSERT_MSG(same_chunks(&l, &lb),
                      "capacity %llu and %llu give different chunks for T %llu",
                      (unsigned long long)d.capacity.rows, (unsigned long long)bigger.capacity.rows,
                      (unsigned long long)d.active.rows);
    }
  }
  return 0;
}
