/* tpflex plan's schedules as printed: the layout and every rank's steps as a table
 * (plan_print_text) or one JSON object (plan_print_json); cmd_plan.c builds and checks them.
 */
#include "plan.h"

#include <stdbool.h>
#include <stdio.h>

#include "tpflex/tpflex.h"
#include "tpflex/tpflex_backend.h"

#include "cli_args.h"

/* "BUF@off[r,c]/ld", "X[r,c]", ... for one operand. */
static void fmt_mref(char *buf, size_t len, const tpf_mref *m) {
  static const char *const ids[] = {"-", "BUF", "X", "W", "D"};
  const char *id = m->id < 5 ? ids[m->id] : "?";
  if (m->id == TPF_MAT_BUF)
    snprintf(buf, len, "BUF@%llu[%llu,%llu]/%llu", (ull)m->off_bytes, (ull)m->row, (ull)m->col,
             (ull)m->ld);
  else
    snprintf(buf, len, "%s[%llu,%llu]", id, (ull)m->row, (ull)m->col);
}

static void fmt_deps(char *buf, size_t len, const tpf_step *st) {
  size_t used = 0;
  buf[0] = '\0';
  for (int j = 0; j < st->ndeps && used < len; j++) {
    int w = snprintf(buf + used, len - used, "%s%u", j ? "," : "", (unsigned)st->deps[j]);
    if (w < 0) break;
    used += (size_t)w;
  }
  if (st->ndeps == 0) snprintf(buf, len, "-");
}

static void fmt_work(char *buf, size_t len, const tpf_step *st) {
  char a[64], w[64], d[64];
  fmt_mref(a, sizeof a, &st->a);
  fmt_mref(w, sizeof w, &st->w);
  fmt_mref(d, sizeof d, &st->d);
  switch (st->kind) {
  case TPF_STEP_GEMM:
    snprintf(buf, len, "%llux%llux%llu %s * %s^T -> %s", (ull)st->m, (ull)st->n, (ull)st->k, a, w,
             d);
    break;
  case TPF_STEP_REDUCE:
    snprintf(buf, len, "%llux%llu sum %u of %s stride %llu -> %s", (ull)st->m, (ull)st->n,
             st->count, a, (ull)st->stride_bytes, d);
    break;
  case TPF_STEP_PEER_REDUCE:
    snprintf(buf, len, "%llux%llu sum %u ranks' %s -> %s", (ull)st->m, (ull)st->n, st->count, a, d);
    break;
  default:
    snprintf(buf, len, "-");
    break;
  }
}

static bool moves(const tpf_step *st) {
  return st->kind == TPF_STEP_SEND || st->kind == TPF_STEP_RECV;
}

void plan_print_text(const plan_args *a, const tpf_schedule *s, int P, tpf_status check) {
  const tpf_schedule *z = &s[a->only_rank < 0 ? 0 : a->only_rank];
  int count = 0;
  tpf_layout_desc d = a->d;
  d.rank = z->rank;
  printf("plan: %s %s, tp %d, %s, capacity [%llu, %llu], active [%llu, %llu], splits %d%s\n",
         tpf_algo_name(z->algo), tpf_coll_name(z->coll), P, tpf_dtype_name(z->dtype),
         (ull)d.capacity.rows, (ull)d.capacity.cols, (ull)z->rows, (ull)z->cols, z->num_splits,
         z->aggregate ? ", aggregate" : "");
  printf("registered bytes: %llu\nactive bytes:     %llu (%.1f%% of registered)\n",
         (ull)z->registered_bytes, (ull)z->active_bytes,
         z->registered_bytes ? 100.0 * (double)z->active_bytes / (double)z->registered_bytes : 0.0);
  printf("chunk: %llu rows, %llu bytes; gemm m %llu n %llu k %llu\n", (ull)z->chunk_rows,
         (ull)z->chunk_bytes, (ull)z->gemm_m, (ull)z->gemm_n, (ull)z->gemm_k);
  if (tpf_layout_chunk_count(&d, &count) == TPF_OK) {
    printf("active layout (%d %s):\n  %5s %14s %14s %10s\n", count,
           z->algo == TPF_ALGO_PIPELINE                           ? "blocks"
           : (z->algo == TPF_ALGO_RING && z->coll == TPF_COLL_RS) ? "slots"
                                                                  : "chunks",
           "chunk", "offset", "bytes", "rows");
    for (int j = 0; j < count; j++) {
      tpf_region r;
      if (tpf_layout_chunk(&d, j, &r) == TPF_OK)
        printf("  %5d %14llu %14llu %10llu\n", j, (ull)r.offset_bytes, (ull)r.bytes, (ull)r.rows);
    }
  }
  for (int r = 0; r < P; r++) {
    if (a->only_rank >= 0 && r != a->only_rank) continue;
    tpf_region local;
    d.rank = r;
    tpf_layout_local(&d, &local);
    printf("\nrank %d: %d steps, %d compute streams, local shard at %llu (%llu bytes)\n", r,
           s[r].nsteps, s[r].num_compute_streams, (ull)local.offset_bytes, (ull)local.bytes);
    printf("  %4s %-8s %-11s %5s %4s %3s %12s %12s %12s  %-10s %s\n", "step", "stream", "kind",
           "chunk", "peer", "tag", "src_off", "dst_off", "bytes", "deps", "work");
    for (int i = 0; i < s[r].nsteps; i++) {
      const tpf_step *st = &s[r].steps[i];
      char deps[48], work[256], src[24] = "-", dst[24] = "-", bytes[24] = "-", tag[16] = "-",
                                peer[16] = "-", chunk[16] = "-";
      fmt_deps(deps, sizeof deps, st);
      fmt_work(work, sizeof work, st);
      if (moves(st)) {
        snprintf(src, sizeof src, "%llu", (ull)st->src_off);
        snprintf(dst, sizeof dst, "%llu", (ull)st->dst_off);
        snprintf(bytes, sizeof bytes, "%llu", (ull)st->bytes);
      }
      if (moves(st) || st->kind == TPF_STEP_BARRIER) snprintf(tag, sizeof tag, "%u", st->tag);
      if (st->peer >= 0) snprintf(peer, sizeof peer, "%d", (int)st->peer);
      if (st->chunk >= 0) snprintf(chunk, sizeof chunk, "%d", (int)st->chunk);
      printf("  %4d %-8s %-11s %5s %4s %3s %12s %12s %12s  %-10s %s\n", i,
             tpf_stream_name(st->stream), tpf_step_kind_name(st->kind), chunk, peer, tag, src, dst,
             bytes, deps, work);
    }
  }
  if (check == TPF_OK)
    printf("\nschedule check: OK\n");
  else
    printf("\nschedule check: FAILED: %s: %s\n", tpf_status_name(check), tpf_last_error());
}

void plan_json_str(const char *s) {
  putchar('"');
  cli_json_escaped(s);
  putchar('"');
}

static void json_mref(const char *name, const tpf_mref *m) {
  printf("\"%s\":{\"id\":%u,\"off_bytes\":%llu,\"ld\":%llu,\"row\":%llu,\"col\":%llu}", name,
         (unsigned)m->id, (ull)m->off_bytes, (ull)m->ld, (ull)m->row, (ull)m->col);
}

void plan_print_json(const plan_args *a, const tpf_schedule *s, int P, tpf_status check) {
  const tpf_schedule *z = &s[a->only_rank < 0 ? 0 : a->only_rank];
  tpf_layout_desc d = a->d;
  d.rank = z->rank;
  int count = 0;
  printf("{\"algo\":\"%s\",\"coll\":\"%s\",\"tp\":%d,\"dtype\":\"%s\",", tpf_algo_name(z->algo),
         tpf_coll_name(z->coll), P, tpf_dtype_name(z->dtype));
  printf("\"capacity\":[%llu,%llu],\"active\":[%llu,%llu],\"num_splits\":%d,\"aggregate\":%s,",
         (ull)d.capacity.rows, (ull)d.capacity.cols, (ull)z->rows, (ull)z->cols, z->num_splits,
         z->aggregate ? "true" : "false");
  printf(
      "\"registered_bytes\":%llu,\"active_bytes\":%llu,\"chunk_rows\":%llu,\"chunk_bytes\":%llu,",
      (ull)z->registered_bytes, (ull)z->active_bytes, (ull)z->chunk_rows, (ull)z->chunk_bytes);
  printf("\"gemm\":[%llu,%llu,%llu],\"layout\":[", (ull)z->gemm_m, (ull)z->gemm_n, (ull)z->gemm_k);
  if (tpf_layout_chunk_count(&d, &count) != TPF_OK) count = 0;
  for (int j = 0; j < count; j++) {
    tpf_region r;
    if (tpf_layout_chunk(&d, j, &r) != TPF_OK) continue;
    printf("%s{\"chunk\":%d,\"offset_bytes\":%llu,\"bytes\":%llu,\"rows\":%llu}", j ? "," : "", j,
           (ull)r.offset_bytes, (ull)r.bytes, (ull)r.rows);
  }
  printf("],\"schedules\":[");
  bool first_rank = true;
  for (int r = 0; r < P; r++) {
    if (a->only_rank >= 0 && r != a->only_rank) continue;
    printf("%s{\"rank\":%d,\"num_compute_streams\":%d,\"steps\":[", first_rank ? "" : ",", r,
           s[r].num_compute_streams);
    first_rank = false;
    for (int i = 0; i < s[r].nsteps; i++) {
      const tpf_step *st = &s[r].steps[i];
      /* chunk/peer: null where the step has none (the schedule's -1). */
      char chunk[16] = "null", peer[16] = "null";
      if (st->chunk >= 0) snprintf(chunk, sizeof chunk, "%d", (int)st->chunk);
      if (st->peer >= 0) snprintf(peer, sizeof peer, "%d", (int)st->peer);
      printf("%s{\"step\":%d,\"stream\":\"%s\",\"kind\":\"%s\",\"chunk\":%s,\"peer\":%s,"
             "\"tag\":%u,\"src_off\":%llu,\"dst_off\":%llu,\"bytes\":%llu,\"m\":%llu,\"n\":%llu,"
             "\"k\":%llu,\"count\":%u,\"stride_bytes\":%llu,",
             i ? "," : "", i, tpf_stream_name(st->stream), tpf_step_kind_name(st->kind), chunk,
             peer, st->tag, (ull)st->src_off, (ull)st->dst_off, (ull)st->bytes, (ull)st->m,
             (ull)st->n, (ull)st->k, st->count, (ull)st->stride_bytes);
      json_mref("a", &st->a);
      putchar(',');
      json_mref("w", &st->w);
      putchar(',');
      json_mref("d", &st->d);
      printf(",\"deps\":[");
      for (int j = 0; j < st->ndeps; j++)
        printf("%s%u", j ? "," : "", (unsigned)st->deps[j]);
      printf("]}");
    }
    printf("]}");
  }
  printf("],\"check\":");
  plan_json_str(check == TPF_OK ? "OK" : tpf_last_error());
  printf("}\n");
}
