/* Telemetry per communicator: what the operations ran, for a user asking where a step's time and
 * bytes went (SPEC §16).
 *
 * Method: comm.c calls tpf__stats_op once per operation the backend accepted, with the schedule
 * it ran. The counters are plain sums (operations, rows, bytes) and, per power-of-two bucket of
 * T, a short list of the distinct schedules chosen with their counts. The bytes are read off the
 * schedule's own steps (SEND payloads, PEER_REDUCE's peer views), the same rule the simulator
 * uses for its bytes_moved, so the sum over ranks of one counts what the other measures. What a
 * pad-to-capacity run would have moved scales the operation's figures by C / T: a schedule's
 * payload is a whole number of chunks of T/P rows, hence proportional to T at a fixed split
 * count. Everything is O(steps) additions with no allocation and no lock: the counters belong to
 * the rank's one thread (tpflex.h).
 */
#include "stats.h"

#include "comm_internal.h"

#include <string.h>

int tpf_stats_bucket_of(uint64_t rows) {
  int b = 0;
  while (rows > 1 && b < TPF_STATS_BUCKETS - 1) {
    rows >>= 1;
    b++;
  }
  return b;
}

uint64_t tpf__stats_schedule_bytes(const tpf_schedule *s) {
  const uint64_t esz = tpf_dtype_size(s->dtype);
  uint64_t bytes = 0;
  for (int i = 0; i < s->nsteps; i++) {
    const tpf_step *st = &s->steps[i];
    if (st->kind == TPF_STEP_SEND)
      bytes += st->bytes;
    else if (st->kind == TPF_STEP_PEER_REDUCE && st->count > 1)
      /* View t of rank (me + t) % P: t = 0 is this rank's own. */
      bytes += (uint64_t)(st->count - 1) * st->m * st->n * esz;
  }
  return bytes;
}

/* v * C / T without overflow for any sizes a layout accepts (C, T < 2^63 and v a payload of a
 * registration): split v into its whole multiples of T and the rest. */
static uint64_t scaled(uint64_t v, uint64_t C, uint64_t T) {
  if (T == 0) return 0;
  uint64_t q = v / T, r = v % T, hi, lo;
  if (!tpf__mul_u64(q, C, &hi)) return UINT64_MAX;
  /* r < T <= C: r * C may overflow 64 bits only for registrations beyond 2^32 rows. */
  if (!tpf__mul_u64(r, C, &lo)) return UINT64_MAX;
  uint64_t sum;
  return tpf__add_u64(hi, lo / T, &sum) ? sum : UINT64_MAX;
}

void tpf__stats_op(tpf_comm_stats *st, const tpf_schedule *s, uint64_t capacity_rows) {
  const uint64_t T = s->rows, bytes = tpf__stats_schedule_bytes(s);
  st->ops++;
  st->rows += T;
  st->padded_rows += capacity_rows;
  st->bytes += bytes;
  st->padded_bytes += scaled(bytes, capacity_rows, T);
  tpf_stats_bucket *b = &st->buckets[tpf_stats_bucket_of(T)];
  b->ops++;
  b->rows += T;
  const int32_t splits = s->num_splits > 0 ? s->num_splits : 1, agg = s->aggregate ? 1 : 0;
  for (int i = 0; i < TPF_STATS_SCHEDULES; i++) {
    tpf_stats_schedule *k = &b->schedules[i];
    if (k->num_splits == 0) { /* the first free slot: a new schedule for this bucket */
      k->num_splits = splits;
      k->aggregate = agg;
    }
    if (k->num_splits == splits && k->aggregate == agg) {
      k->ops++;
      return;
    }
  }
  b->other_ops++;
}

tpf_status tpf_comm_get_stats(const tpf_comm *c, tpf_comm_stats *out) {
  TPF_CHECK(tpf__handle_check(c, TPF_HANDLE_COMM, "tpf_comm_get_stats"));
  TPF_RETURN_IF(!out, TPF_EINVAL, "tpf_comm_get_stats: out is NULL");
  /* Released layouts, oldest first; a field appended later adds its sizeof here. */
  static const size_t released[] = {sizeof(tpf_comm_stats)};
  const size_t size = out->size ? out->size : sizeof *out;
  TPF_CHECK(tpf__check_struct_size("tpf_comm_get_stats", "stats", "tpf_comm_stats", out->size,
                                   released, TPF_ARRAY_SIZE(released)));
  tpf_comm_stats s = c->telemetry;
  s.size = size;
  memcpy(out, &s, size);
  return TPF_OK;
}

tpf_status tpf_comm_reset_stats(tpf_comm *c) {
  TPF_CHECK(tpf__handle_check(c, TPF_HANDLE_COMM, "tpf_comm_reset_stats"));
  memset(&c->telemetry, 0, sizeof c->telemetry);
  return TPF_OK;
}
