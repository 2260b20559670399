/* tpflex plan: the layout and schedule of one operation, as a table or JSON.
 *
 * Builds every rank's schedule with tpf_schedule_build (or one rank's with --rank, though the
 * checker always sees all ranks), prints them and runs tpf_schedule_check over the group.
 * Exit status: 0 when the check passes, 1 when it fails, 2 for bad arguments.
 */
#include "cmds.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tpflex/tpflex.h"
#include "tpflex/tpflex_backend.h"

typedef unsigned long long ull;

static const char *const plan_usage =
    "usage: tpflex plan --tp P --capacity C --tokens T --hidden H --algo ring|pipeline|bulk "
    "--coll ag|rs [--splits S] [--aggregate] [--dtype bf16|fp16|fp32] [--n N] [--k K] "
    "[--rank r] [--json]";

typedef struct {
  tpf_layout_desc d;
  tpf_gemm_dims g;
  int only_rank; /* -1: all */
  bool json;
} plan_args;

static int bad_args(tpf_status s) {
  fprintf(stderr, "%s\n%s: %s\n", plan_usage, tpf_status_name(s), tpf_last_error());
  return 2;
}

static tpf_status parse_u64(const char *opt, const char *v, uint64_t *out) {
  char *end = NULL;
  if (!v || !*v || *v == '-')
    return tpf_set_error(TPF_EINVAL, "%s needs a non-negative integer", opt);
  errno = 0;
  unsigned long long x = strtoull(v, &end, 10);
  if (errno || *end) return tpf_set_error(TPF_EINVAL, "%s: '%s' is not an integer", opt, v);
  *out = (uint64_t)x;
  return TPF_OK;
}

static tpf_status parse_int(const char *opt, const char *v, int *out) {
  uint64_t x;
  tpf_status rc = parse_u64(opt, v, &x);
  if (rc != TPF_OK) return rc;
  if (x > 1000000) return tpf_set_error(TPF_EINVAL, "%s %llu is too large", opt, (ull)x);
  *out = (int)x;
  return TPF_OK;
}

static tpf_status parse_args(int argc, char **argv, plan_args *a) {
  bool have_tp = false, have_cap = false, have_hidden = false, have_algo = false, have_coll = false,
       have_tokens = false;
  uint64_t n = 0, k = 0;
  memset(a, 0, sizeof *a);
  a->d.dtype = TPF_BF16;
  a->only_rank = -1;
  for (int i = 1; i < argc; i++) {
    const char *o = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    tpf_status rc = TPF_OK;
    if (strcmp(o, "--aggregate") == 0) {
      a->d.aggregate = true;
      continue;
    }
    if (strcmp(o, "--json") == 0) {
      a->json = true;
      continue;
    }
    if (!v) return tpf_set_error(TPF_EINVAL, "%s needs a value (or is unknown)", o);
    i++;
    if (strcmp(o, "--tp") == 0) {
      rc = parse_int(o, v, &a->d.tp_size);
      have_tp = true;
    } else if (strcmp(o, "--capacity") == 0) {
      rc = parse_u64(o, v, &a->d.capacity.rows);
      have_cap = true;
    } else if (strcmp(o, "--tokens") == 0) {
      rc = parse_u64(o, v, &a->d.active.rows);
      have_tokens = true;
    } else if (strcmp(o, "--hidden") == 0) {
      rc = parse_u64(o, v, &a->d.capacity.cols);
      have_hidden = true;
    } else if (strcmp(o, "--splits") == 0) {
      rc = parse_int(o, v, &a->d.num_splits);
    } else if (strcmp(o, "--n") == 0) {
      rc = parse_u64(o, v, &n);
    } else if (strcmp(o, "--k") == 0) {
      rc = parse_u64(o, v, &k);
    } else if (strcmp(o, "--rank") == 0) {
      rc = parse_int(o, v, &a->only_rank);
    } else if (strcmp(o, "--algo") == 0) {
      have_algo = true;
      if (strcmp(v, "ring") == 0)
        a->d.algo = TPF_ALGO_RING;
      else if (strcmp(v, "pipeline") == 0)
        a->d.algo = TPF_ALGO_PIPELINE;
      else if (strcmp(v, "bulk") == 0)
        a->d.algo = TPF_ALGO_BULK;
      else
        rc = tpf_set_error(TPF_EINVAL, "unknown algo '%s' (ring, pipeline or bulk)", v);
    } else if (strcmp(o, "--coll") == 0) {
      have_coll = true;
      if (strcmp(v, "ag") == 0)
        a->d.coll = TPF_COLL_AG;
      else if (strcmp(v, "rs") == 0)
        a->d.coll = TPF_COLL_RS;
      else
        rc = tpf_set_error(TPF_EINVAL, "unknown coll '%s' (ag or rs)", v);
    } else if (strcmp(o, "--dtype") == 0) {
      if (strcmp(v, "bf16") == 0)
        a->d.dtype = TPF_BF16;
      else if (strcmp(v, "fp16") == 0)
        a->d.dtype = TPF_FP16;
      else if (strcmp(v, "fp32") == 0)
        a->d.dtype = TPF_FP32;
      else
        rc = tpf_set_error(TPF_EINVAL, "unknown dtype '%s' (bf16, fp16 or fp32)", v);
    } else {
      rc = tpf_set_error(TPF_EINVAL, "unknown option '%s'", o);
    }
    if (rc != TPF_OK) return rc;
  }
  if (!have_tp || !have_cap || !have_hidden || !have_algo || !have_coll)
    return tpf_set_error(TPF_EINVAL, "--tp, --capacity, --hidden, --algo and --coll are required");
  if (!have_tokens) a->d.active.rows = a->d.capacity.rows;
  a->d.active.cols = a->d.capacity.cols;
  if (a->only_rank >= a->d.tp_size)
    return tpf_set_error(TPF_EINVAL, "--rank %d outside [0, %d)", a->only_rank, a->d.tp_size);
  uint64_t H = a->d.capacity.cols, T = a->d.active.rows;
  if (n == 0) n = H;
  if (k == 0) k = H;
  if (a->d.algo == TPF_ALGO_BULK) {
    a->g.m = T;
    a->g.n = n;
    a->g.k = k;
  } else if (a->d.coll == TPF_COLL_AG) {
    a->g.m = T;
    a->g.n = n;
    a->g.k = H;
  } else {
    a->g.m = T;
    a->g.n = H;
    a->g.k = k;
  }
  return tpf_layout_check(&a->d);
}

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

static void print_text(const plan_args *a, const tpf_schedule *s, int P, tpf_status check) {
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

static void json_str(const char *s) {
  putchar('"');
  for (; *s; s++) {
    unsigned char ch = (unsigned char)*s;
    if (ch == '"' || ch == '\\')
      printf("\\%c", ch);
    else if (ch < 0x20)
      printf("\\u%04x", ch);
    else
      putchar(ch);
  }
  putchar('"');
}

static void json_mref(const char *name, const tpf_mref *m) {
  printf("\"%s\":{\"id\":%u,\"off_bytes\":%llu,\"ld\":%llu,\"row\":%llu,\"col\":%llu}", name,
         (unsigned)m->id, (ull)m->off_bytes, (ull)m->ld, (ull)m->row, (ull)m->col);
}

static void print_json(const plan_args *a, const tpf_schedule *s, int P, tpf_status check) {
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
      printf("%s{\"step\":%d,\"stream\":\"%s\",\"kind\":\"%s\",\"chunk\":%d,\"peer\":%d,"
             "\"tag\":%u,\"src_off\":%llu,\"dst_off\":%llu,\"bytes\":%llu,\"m\":%llu,\"n\":%llu,"
             "\"k\":%llu,\"count\":%u,\"stride_bytes\":%llu,",
             i ? "," : "", i, tpf_stream_name(st->stream), tpf_step_kind_name(st->kind),
             (int)st->chunk, (int)st->peer, st->tag, (ull)st->src_off, (ull)st->dst_off,
             (ull)st->bytes, (ull)st->m, (ull)st->n, (ull)st->k, st->count, (ull)st->stride_bytes);
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
  json_str(check == TPF_OK ? "OK" : tpf_last_error());
  printf("}\n");
}

int tpf_cmd_plan(int argc, char **argv) {
  for (int i = 1; i < argc; i++)
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      printf("%s\n", plan_usage);
      return 0;
    }
  plan_args a;
  tpf_status rc = parse_args(argc, argv, &a);
  if (rc != TPF_OK) return bad_args(rc);
  int P = a.d.tp_size;
  tpf_schedule *s = calloc((size_t)P, sizeof *s);
  if (!s) {
    fprintf(stderr, "tpflex plan: out of memory\n");
    return 1;
  }
  int built = 0;
  for (; built < P; built++) {
    tpf_layout_desc d = a.d;
    d.rank = built;
    rc = tpf_schedule_build(&d, &a.g, &s[built]);
    if (rc != TPF_OK) break;
  }
  int ret = 0;
  if (rc != TPF_OK) {
    ret = bad_args(rc);
  } else {
    tpf_status check = tpf_schedule_check(s, P);
    if (a.json)
      print_json(&a, s, P, check);
    else
      print_text(&a, s, P, check);
    ret = check == TPF_OK ? 0 : 1;
  }
  for (int r = 0; r < built; r++)
    tpf_schedule_free(&s[r]);
  free(s);
  return ret;
}
