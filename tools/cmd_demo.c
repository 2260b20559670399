/* tpflex demo: packed-sequence microbatches of varying T through one fixed-capacity manager.
 *
 * Method: the host draws a stream of microbatches (random sequence lengths packed up to a random
 * fill of the capacity C; T is the packed length rounded up to a multiple of P). Every rank
 * creates one manager once, with the communicators of a TransformerEngine layer under their TE
 * names and default methods (te-userbuffers.md §8): ring-exchange AG for qkv_fprop, fc1_fprop,
 * proj_dgrad and fc2_dgrad; pipeline RS for proj_fprop and fc2_fprop; bulk AG for qkv_dgrad and
 * fc1_dgrad and bulk RS for qkv_wgrad and fc1_wgrad, each beside its independent GEMM; proj_wgrad
 * and fc2_wgrad are external and stay at capacity. Those registrations are the only ones the
 * run makes. For each microbatch every rank sets the manager's active shape [T, H] and runs the
 * ten operations with the tensor-parallel shapes of a transformer layer, then checks each result
 * against the independent host reference (tests/support/reference.c) with SPEC §7's rule;
 * gathered buffers must match byte for byte.
 *
 * Bytes: for every operation the demo builds every rank's schedule at T and at C with the core's
 * builder and sums what crosses ranks (SEND payloads, peer reads of PEER_REDUCE); on the
 * simulator it also reads the bytes the backend actually moved and requires them to equal the
 * schedule's. The capacity figure is what padding every microbatch to C would have moved.
 *
 * Ranks meet at a barrier after each microbatch so that rank 0 prints a complete table row.
 */
#define _POSIX_C_SOURCE 200809L
#include "cmds.h"

#include "cli_args.h"
#include "rank_env.h"
#include "reference.h"
#include "staging.h"
#include "trace.h"
#include "tpflex/tpflex_backend.h"
#ifdef TPF_HAVE_SIM
#include "tpflex/tpflex_sim.h"
#endif

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "internal.h" /* TPF_CHECK, TPF_CHECK_GOTO */

/* ---- the layer ---- */

enum { OP_AG_GEMM, OP_GEMM_RS, OP_BULK, OP_NONE };

typedef struct {
  const char *name;
  tpf_algo algo;
  tpf_coll coll;
  bool external;
  int op;
  /* Dimensions in units of H/P (the TP shard of the hidden size); see site_dims. */
  int mult;
} demo_site;

/* Registration order (the manager's); ops run in kOrder. mult: qkv 3, attention/proj 1, fc 4. */
static const demo_site kSites[] = {
    {"qkv_fprop", TPF_ALGO_RING, TPF_COLL_AG, false, OP_AG_GEMM, 3},
    {"proj_fprop", TPF_ALGO_PIPELINE, TPF_COLL_RS, false, OP_GEMM_RS, 1},
    {"fc1_fprop", TPF_ALGO_RING, TPF_COLL_AG, false, OP_AG_GEMM, 4},
    {"fc2_fprop", TPF_ALGO_PIPELINE, TPF_COLL_RS, false, OP_GEMM_RS, 4},
    {"qkv_dgrad", TPF_ALGO_BULK, TPF_COLL_AG, false, OP_BULK, 3},
    {"qkv_wgrad", TPF_ALGO_BULK, TPF_COLL_RS, false, OP_BULK, 3},
    {"fc1_dgrad", TPF_ALGO_BULK, TPF_COLL_AG, false, OP_BULK, 4},
    {"fc1_wgrad", TPF_ALGO_BULK, TPF_COLL_RS, false, OP_BULK, 4},
    {"proj_dgrad", TPF_ALGO_RING, TPF_COLL_AG, false, OP_AG_GEMM, 1},
    {"fc2_dgrad", TPF_ALGO_RING, TPF_COLL_AG, false, OP_AG_GEMM, 4},
    {"proj_wgrad", TPF_ALGO_BULK, TPF_COLL_AG, true, OP_NONE, 1},
    {"fc2_wgrad", TPF_ALGO_BULK, TPF_COLL_AG, true, OP_NONE, 4},
};
#define NSITES ((int)(sizeof kSites / sizeof kSites[0]))
/* Forward, then backward (TE's order within a layer). */
static const int kOrder[] = {0, 1, 2, 3, 9, 6, 7, 8, 4, 5};
#define NOPS ((int)(sizeof kOrder / sizeof kOrder[0]))

/* GEMM dims of a site at T. AG: d[T, N] = AG(X)[T, H] w[N, H]^T with N = mult*H/P (the
 * column-parallel output shard). RS: x[T, K] w[H, K]^T with K = mult*H/P (the row-parallel input
 * shard). BULK dgrad (AG): d[T, H] = a[T, K] b[H, K]^T, K = mult*H/P; BULK wgrad (RS):
 * d[M, H] = a[M, T] b[H, T]^T, M = mult*H/P. */
static tpf_gemm_dims site_dims(const demo_site *s, uint64_t H, int P, uint64_t T) {
  uint64_t shard = (uint64_t)s->mult * H / (uint64_t)P;
  tpf_gemm_dims g = {T, shard, H};
  if (s->op == OP_GEMM_RS) {
    g.n = H;
    g.k = shard;
  } else if (s->op == OP_BULK && s->coll == TPF_COLL_AG) {
    g.m = T;
    g.n = H;
    g.k = shard;
  } else if (s->op == OP_BULK) {
    g.m = shard;
    g.n = H;
    g.k = T;
  }
  return g;
}

/* ---- options and run state ---- */

typedef struct {
  const char *backend;
  int P;
  uint64_t C, H;
  int mbs;
  uint64_t seed;
  unsigned delay_us, timeout_ms;
  uint64_t arena_bytes; /* simulator arena; 0 = its default */
  const char *trace;
  tpf_dtype dtype;
  bool check;
  int rows; /* table rows to print: all when the run is short */
} demo_opts;

typedef struct {
  uint64_t T, tokens, seqs;
  uint64_t sched_bytes, padded_bytes;
} demo_mb;

typedef struct {
  bool ok;
  double op_ms;
  char why[400];
} demo_rank_mb;

typedef struct demo_ctx demo_ctx;
struct demo_ctx {
  demo_opts o;
  tpf_conf_env *env;
  demo_mb *mb;
  demo_rank_mb *res; /* [mb][rank] */
  pthread_barrier_t barrier;
  atomic_int abort_run;
  /* Filled by rank 0 between the barriers. */
  uint64_t measured_total, sched_total, padded_total, tokens_total, rows_total;
  uint64_t ops_total, ok_mbs, failed_mbs;
  double op_ms_total;
  bool measured_ok;
  double t_start, t_progress;
  /* Backend hooks. */
  uint64_t (*bytes_moved)(demo_ctx *d); /* NULL: not measurable */
  uint64_t (*now_ns)(demo_ctx *d);
  uint64_t (*registrations)(demo_ctx *d); /* NULL: not measurable */
  tpf_trace *trace;
  /* Collective registrations: when the managers were built, and during the microbatches. */
  uint64_t regs_setup, regs_loop;
  bool have_registrations;
#ifdef TPF_HAVE_SIM
  tpf_sim_world *world;
#endif
  uint64_t t0_ns; /* host clock origin when the backend has none */
};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t host_now_ns(demo_ctx *d) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec - d->t0_ns;
}

static uint64_t mix(uint64_t h, uint64_t v) {
  uint64_t s = h ^ (v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2));
  return tpf_ref_rand_u64(&s);
}

enum { ROLE_X = 1, ROLE_W, ROLE_A, ROLE_B, ROLE_PART };

/* Seed of one input; mb = UINT64_MAX for inputs fixed over the run (weights). */
static uint64_t seed_of(const demo_ctx *d, uint64_t mb, int site, int role, int owner) {
  return mix(mix(mix(mix(mix(d->o.seed, mb), (uint64_t)site), (uint64_t)role), (uint64_t)owner),
             0x7470666c6578ull);
}

/* ---- per-rank operand memory: allocated once at capacity, viewed at T ---- */

typedef struct {
  tpf_matrix dev, host; /* at capacity; views take rows/cols */
  size_t bytes;
} demo_buf;

typedef struct {
  demo_ctx *d;
  tpf_backend *be;
  int rank;
  void *stream;
  demo_buf x, w, o; /* AG: w, o(=d); RS: x, w, o(=out); BULK: x(=a), w(=b), o(=d) */
  bool weights_ready;
} demo_site_mem;

static tpf_status buf_new(demo_site_mem *sm, demo_buf *b, uint64_t rows, uint64_t ld,
                          tpf_dtype dt) {
  tpf_conf_env *env = sm->d->env;
  b->bytes = (size_t)(rows * ld * tpf_dtype_size(dt));
  b->host.ptr = calloc(1, b->bytes);
  b->dev.ptr = env->mem_alloc(env, sm->rank, b->bytes);
  if (!b->host.ptr || !b->dev.ptr)
    return tpf_set_error(TPF_ENOMEM, "demo: operand of %zu bytes", b->bytes);
  b->host.rows = b->dev.rows = rows;
  b->host.cols = b->dev.cols = ld;
  b->host.ld = b->dev.ld = ld;
  b->host.dtype = b->dev.dtype = dt;
  return TPF_OK;
}

static void buf_free(demo_site_mem *sm, demo_buf *b) {
  if (b->dev.ptr) sm->d->env->mem_free(sm->d->env, sm->rank, b->dev.ptr);
  free(b->host.ptr);
  memset(b, 0, sizeof *b);
}

/* A rows x cols view of b (ld stays the capacity one). */
static tpf_matrix view(const tpf_matrix *m, uint64_t rows, uint64_t cols) {
  tpf_matrix v = *m;
  v.rows = rows;
  v.cols = cols;
  return v;
}

static tpf_status up(demo_site_mem *sm, demo_buf *b, uint64_t rows) {
  return sm->d->env->upload(sm->d->env, sm->rank, b->dev.ptr, b->host.ptr,
                            (size_t)(rows * b->host.ld * tpf_dtype_size(b->host.dtype)));
}

static tpf_status down(demo_site_mem *sm, demo_buf *b, uint64_t rows) {
  return sm->d->env->download(sm->d->env, sm->rank, b->host.ptr, b->dev.ptr,
                              (size_t)(rows * b->host.ld * tpf_dtype_size(b->host.dtype)));
}

static tpf_status site_mem_init(demo_site_mem *sm, const demo_site *s) {
  const demo_opts *o = &sm->d->o;
  tpf_gemm_dims g = site_dims(s, o->H, o->P, o->C);
  tpf_dtype dt = o->dtype;
  switch (s->op) {
  case OP_AG_GEMM: /* w [N, H], d [C, N] */
    TPF_CHECK(buf_new(sm, &sm->w, g.n, o->H, dt));
    return buf_new(sm, &sm->o, o->C, g.n, dt);
  case OP_GEMM_RS: /* x [C, K], w [H, K], out [C/P, H] */
    TPF_CHECK(buf_new(sm, &sm->x, o->C, g.k, dt));
    TPF_CHECK(buf_new(sm, &sm->w, o->H, g.k, dt));
    return buf_new(sm, &sm->o, o->C / (uint64_t)o->P, o->H, dt);
  case OP_BULK: /* a [m, k], b [n, k], d [m, n] at capacity (ld = capacity columns) */
    TPF_CHECK(buf_new(sm, &sm->x, g.m, g.k, dt));
    TPF_CHECK(buf_new(sm, &sm->w, g.n, g.k, dt));
    return buf_new(sm, &sm->o, g.m, g.n, dt);
  default:
    return TPF_OK;
  }
}

/* ---- checks ---- */

static void fail_why(demo_rank_mb *r, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
static void fail_why(demo_rank_mb *r, const char *fmt, ...) {
  if (!r->ok) return;
  r->ok = false;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(r->why, sizeof r->why, fmt, ap);
  va_end(ap);
}

/* slack: NULL for SPEC §7, else GEMM+RS's per-partial rounding slack (tpf_ref_compare_slack). */
static void check_close(demo_rank_mb *r, const char *site, const char *what, const tpf_matrix *got,
                        const tpf_matrix *want, const float *slack) {
  char why[400];
  if (!tpf_ref_check(got, want, slack, tpf_ref_tolerance_pair(got->dtype, want->dtype), what, why,
                     sizeof why))
    fail_why(r, "%s: %s", site, why);
}

static void check_exact(demo_rank_mb *r, const char *site, const char *what, const tpf_matrix *got,
                        const tpf_matrix *want) {
  char why[400];
  if (!tpf_ref_check_exact(got, want, what, why, sizeof why)) fail_why(r, "%s: %s", site, why);
}

static tpf_matrix host_matrix(uint64_t rows, uint64_t cols, tpf_dtype dt) {
  tpf_matrix m = {calloc(1, (size_t)(rows * cols * tpf_dtype_size(dt)) + 1), rows, cols, cols, dt};
  return m;
}

static tpf_matrix rows_view(const tpf_matrix *m, uint64_t r0, uint64_t n) {
  tpf_matrix v = *m;
  v.ptr = (char *)m->ptr + r0 * m->ld * tpf_dtype_size(m->dtype);
  v.rows = n;
  return v;
}

/* ---- one operation ---- */

static tpf_status get_buffer(demo_site_mem *sm, tpf_comm *c, tpf_matrix *host) {
  return tpf_stage_get_buffer(sm->d->env, sm->rank, c, host);
}

/* Runs site s at T on this rank; API failures are returned, wrong results recorded in r. */
static tpf_status run_site(demo_site_mem *sm, int si, tpf_comm *c, uint64_t mbi, uint64_t T,
                           demo_rank_mb *r, double *op_ms) {
  demo_ctx *d = sm->d;
  const demo_site *s = &kSites[si];
  const demo_opts *o = &d->o;
  const int P = o->P;
  const uint64_t H = o->H, R = T / (uint64_t)P;
  const tpf_dtype dt = o->dtype;
  tpf_gemm_dims g = site_dims(s, H, P, T);
  tpf_matrix xg = {0}, ref = {0}, bufh = {0}, part = {0};
  float *acc = NULL, *tmp = NULL, *slack = NULL;
  tpf_status rc = TPF_OK;
  double t0 = 0;

  /* Inputs. Weights are fixed for the run (filled once); activations change per microbatch. */
  if (!sm->weights_ready && s->op != OP_BULK) {
    tpf_matrix w = view(&sm->w.host, sm->w.host.rows, sm->w.host.cols);
    tpf_ref_fill(&w, seed_of(d, UINT64_MAX, si, ROLE_W, sm->rank), -0.5f, 0.5f);
    TPF_CHECK_GOTO(up(sm, &sm->w, w.rows), rc, out);
    sm->weights_ready = true;
  }
  tpf_matrix xd = {0}, wd = {0}, od = {0};
  if (s->op == OP_AG_GEMM) {
    xg = host_matrix(T, H, dt);
    tpf_ref_fill(&xg, seed_of(d, mbi, si, ROLE_X, 0), -1.0f, 1.0f);
    TPF_CHECK_GOTO(tpf_stage_put_local(sm->d->env, sm->rank, c, &xg), rc, out);
    wd = view(&sm->w.dev, g.n, H);
    od = view(&sm->o.dev, T, g.n);
  } else if (s->op == OP_GEMM_RS) {
    tpf_matrix xh = view(&sm->x.host, T, g.k);
    tpf_ref_fill(&xh, seed_of(d, mbi, si, ROLE_X, sm->rank), -1.0f, 1.0f);
    TPF_CHECK_GOTO(up(sm, &sm->x, T), rc, out);
    xd = view(&sm->x.dev, T, g.k);
    wd = view(&sm->w.dev, H, g.k);
    od = view(&sm->o.dev, R, H);
  } else {
    tpf_matrix ah = view(&sm->x.host, g.m, g.k), bh = view(&sm->w.host, g.n, g.k);
    tpf_ref_fill(&ah, seed_of(d, mbi, si, ROLE_A, sm->rank), -1.0f, 1.0f);
    tpf_ref_fill(&bh, seed_of(d, mbi, si, ROLE_B, sm->rank), -0.5f, 0.5f);
    TPF_CHECK_GOTO(up(sm, &sm->x, g.m), rc, out);
    TPF_CHECK_GOTO(up(sm, &sm->w, g.n), rc, out);
    xd = view(&sm->x.dev, g.m, g.k);
    wd = view(&sm->w.dev, g.n, g.k);
    od = view(&sm->o.dev, g.m, g.n);
    if (s->coll == TPF_COLL_AG) {
      xg = host_matrix(T, H, dt);
      tpf_ref_fill(&xg, seed_of(d, mbi, si, ROLE_X, 0), -1.0f, 1.0f);
      TPF_CHECK_GOTO(tpf_stage_put_local(sm->d->env, sm->rank, c, &xg), rc, out);
    } else {
      /* The dgrad partial [T, H] this rank's GEMM left in the buffer. */
      tpf_matrix full;
      TPF_CHECK_GOTO(tpf_comm_buffer(c, &full), rc, out);
      part = host_matrix(T, H, dt);
      tpf_ref_fill(&part, seed_of(d, mbi, si, ROLE_PART, sm->rank), -1.0f, 1.0f);
      TPF_CHECK_GOTO(d->env->upload(d->env, sm->rank, full.ptr, part.ptr,
                                    (size_t)(T * H * tpf_dtype_size(dt))),
                     rc, out);
    }
  }

  /* The operation. */
  t0 = now_s();
  uint64_t o0 = d->now_ns(d);
  if (s->op == OP_AG_GEMM)
    rc = tpf_ag_gemm(c, &wd, &od, sm->stream);
  else if (s->op == OP_GEMM_RS)
    rc = tpf_gemm_rs(c, &xd, &wd, &od, sm->stream);
  else
    rc = tpf_bulk_overlap(c, &xd, &wd, &od, sm->stream);
  if (rc == TPF_OK) rc = d->env->sync(d->env, sm->rank, sm->be);
  *op_ms += (now_s() - t0) * 1e3;
  if (d->trace)
    tpf_trace_span(d->trace, sm->rank, TPF_TRACE_HOST_TID, s->name, s->name, o0, d->now_ns(d), 0,
                   0);
  if (rc != TPF_OK) goto out;
  if (!d->o.check) goto out;

  /* Checks against the independent reference. */
  if (s->op == OP_AG_GEMM) {
    TPF_CHECK_GOTO(down(sm, &sm->o, T), rc, out);
    tpf_matrix got = view(&sm->o.host, T, g.n);
    ref = host_matrix(T, g.n, dt);
    tpf_matrix w = view(&sm->w.host, g.n, H);
    TPF_CHECK_GOTO(tpf_ref_gemm(&xg, &w, &ref), rc, out);
    check_close(r, s->name, "D = AG(X) W^T", &got, &ref, NULL);
    TPF_CHECK_GOTO(get_buffer(sm, c, &bufh), rc, out);
    check_exact(r, s->name, "gathered buffer", &bufh, &xg);
  } else if (s->op == OP_GEMM_RS) {
    TPF_CHECK_GOTO(down(sm, &sm->o, R), rc, out);
    tpf_matrix got = view(&sm->o.host, R, H);
    ref = host_matrix(R, H, dt);
    acc = calloc((size_t)(R * H), sizeof(float));
    slack = calloc((size_t)(R * H), sizeof(float));
    tmp = malloc((size_t)(R * H) * sizeof(float));
    tpf_matrix xq = host_matrix(T, g.k, dt), wq = host_matrix(H, g.k, dt);
    if (!acc || !slack || !tmp || !xq.ptr || !wq.ptr) {
      free(xq.ptr);
      free(wq.ptr);
      rc = tpf_set_error(TPF_ENOMEM, "demo: RS reference");
      goto out;
    }
    for (int q = 0; q < P && rc == TPF_OK; q++) {
      tpf_ref_fill(&xq, seed_of(d, mbi, si, ROLE_X, q), -1.0f, 1.0f);
      tpf_ref_fill(&wq, seed_of(d, UINT64_MAX, si, ROLE_W, q), -0.5f, 0.5f);
      tpf_matrix mine = rows_view(&xq, (uint64_t)sm->rank * R, R);
      rc = tpf_ref_gemm_f32(&mine, &wq, tmp);
      for (uint64_t i = 0; i < R * H; i++) {
        acc[i] += tpf_ref_round(dt, tmp[i]); /* partials live in the buffer dtype */
        slack[i] += (float)tpf_ref_ulp(dt, tmp[i]);
      }
    }
    free(xq.ptr);
    free(wq.ptr);
    if (rc != TPF_OK) goto out;
    for (uint64_t i = 0; i < R; i++)
      for (uint64_t j = 0; j < H; j++)
        tpf_ref_set(&ref, i, j, acc[i * H + j]);
    check_close(r, s->name, "out = RS(X W^T)", &got, &ref, slack);
  } else {
    TPF_CHECK_GOTO(down(sm, &sm->o, g.m), rc, out);
    tpf_matrix got = view(&sm->o.host, g.m, g.n);
    ref = host_matrix(g.m, g.n, dt);
    tpf_matrix ah = view(&sm->x.host, g.m, g.k), bh = view(&sm->w.host, g.n, g.k);
    TPF_CHECK_GOTO(tpf_ref_gemm(&ah, &bh, &ref), rc, out);
    check_close(r, s->name, "independent GEMM", &got, &ref, NULL);
    TPF_CHECK_GOTO(get_buffer(sm, c, &bufh), rc, out);
    if (s->coll == TPF_COLL_AG) {
      check_exact(r, s->name, "all-gathered buffer", &bufh, &xg);
    } else {
      acc = calloc((size_t)(R * H), sizeof(float));
      if (!acc) {
        rc = tpf_set_error(TPF_ENOMEM, "demo: bulk RS reference");
        goto out;
      }
      for (int q = 0; q < P; q++) {
        tpf_ref_fill(&part, seed_of(d, mbi, si, ROLE_PART, q), -1.0f, 1.0f);
        for (uint64_t i = 0; i < R; i++)
          for (uint64_t j = 0; j < H; j++)
            acc[i * H + j] += tpf_ref_get(&part, (uint64_t)sm->rank * R + i, j);
      }
      tpf_matrix want = host_matrix(R, H, dt);
      if (!want.ptr) {
        rc = tpf_set_error(TPF_ENOMEM, "demo: bulk RS reference");
        goto out;
      }
      for (uint64_t i = 0; i < R; i++)
        for (uint64_t j = 0; j < H; j++)
          tpf_ref_set(&want, i, j, acc[i * H + j]);
      tpf_matrix mine = rows_view(&bufh, (uint64_t)sm->rank * R, R);
      check_close(r, s->name, "reduce-scattered chunk", &mine, &want, NULL);
      free(want.ptr);
    }
  }
out:
  free(xg.ptr);
  free(ref.ptr);
  free(bufh.ptr);
  free(part.ptr);
  free(acc);
  free(slack);
  free(tmp);
  return rc;
}

/* ---- schedule bytes ---- */

static tpf_status sched_bytes(const demo_opts *o, const demo_site *s, uint64_t T, uint64_t *out) {
  uint64_t total = 0;
  for (int r = 0; r < o->P; r++) {
    tpf_layout_desc desc;
    memset(&desc, 0, sizeof desc);
    desc.tp_size = o->P;
    desc.rank = r;
    desc.algo = s->algo;
    desc.coll = s->coll;
    desc.dtype = o->dtype;
    desc.capacity.rows = o->C;
    desc.capacity.cols = o->H;
    desc.active.rows = T;
    desc.active.cols = o->H;
    tpf_gemm_dims g = site_dims(s, o->H, o->P, T);
    tpf_schedule sch;
    TPF_CHECK(tpf_schedule_build(&desc, &g, &sch));
    size_t esz = tpf_dtype_size(o->dtype);
    for (int i = 0; i < sch.nsteps; i++) {
      const tpf_step *st = &sch.steps[i];
      if (st->kind == TPF_STEP_SEND)
        total += st->bytes;
      else if (st->kind == TPF_STEP_PEER_REDUCE && st->count > 1)
        total += (uint64_t)(st->count - 1) * st->m * st->n * esz;
    }
    tpf_schedule_free(&sch);
  }
  *out = total;
  return TPF_OK;
}

/* ---- printing ---- */

static void fmt_bytes(uint64_t b, char *buf, size_t len) {
  if (b >= (1ull << 30))
    snprintf(buf, len, "%.2f GiB", (double)b / (double)(1ull << 30));
  else if (b >= (1ull << 20))
    snprintf(buf, len, "%.2f MiB", (double)b / (double)(1ull << 20));
  else if (b >= 1024)
    snprintf(buf, len, "%.1f KiB", (double)b / 1024.0);
  else
    snprintf(buf, len, "%llu B", (unsigned long long)b);
}

static bool row_printed(const demo_ctx *d, int mb, bool ok) {
  int n = d->o.mbs;
  if (!ok || n <= d->o.rows || mb < 10 || mb == n - 1) return true;
  int every = (n + d->o.rows - 1) / d->o.rows;
  return mb % every == 0;
}

/* Rank 0, between the end-of-microbatch barriers: every rank's results of mb are in. */
static void report_mb(demo_ctx *d, int mb) {
  demo_mb *m = &d->mb[mb];
  bool ok = true;
  const char *why = "";
  int bad_rank = -1;
  double op_ms = d->res[(size_t)mb * (size_t)d->o.P].op_ms;
  for (int r = 0; r < d->o.P; r++) {
    demo_rank_mb *x = &d->res[(size_t)mb * (size_t)d->o.P + (size_t)r];
    if (!x->ok && ok) {
      ok = false;
      why = x->why;
      bad_rank = r;
    }
  }
  uint64_t moved = m->sched_bytes;
  char note[64] = "";
  if (d->bytes_moved) {
    uint64_t now = d->bytes_moved(d);
    uint64_t meas = now - d->measured_total;
    d->measured_total = now;
    if (meas != m->sched_bytes) {
      d->measured_ok = false;
      if (ok) {
        ok = false;
        bad_rank = 0;
        why = "bytes moved by the backend differ from the schedule";
      }
      snprintf(note, sizeof note, " (measured %llu)", (unsigned long long)meas);
    }
    moved = meas;
  }
  d->sched_total += m->sched_bytes;
  d->padded_total += m->padded_bytes;
  d->tokens_total += m->tokens;
  d->rows_total += m->T;
  d->ops_total += NOPS;
  d->op_ms_total += op_ms;
  if (ok)
    d->ok_mbs++;
  else
    d->failed_mbs++;
  if (row_printed(d, mb, ok)) {
    char mv[32], pd[32];
    fmt_bytes(moved, mv, sizeof mv);
    fmt_bytes(m->padded_bytes, pd, sizeof pd);
    printf("%5d %7llu %7llu %8llu %5llu %6.1f%% %4d %12s %12s %9.2f  %s%s\n", mb + 1,
           (unsigned long long)m->tokens, (unsigned long long)m->T,
           (unsigned long long)(m->T / (uint64_t)d->o.P), (unsigned long long)m->seqs,
           100.0 * (double)m->T / (double)d->o.C, NOPS, mv, pd, op_ms, ok ? "OK" : "FAIL", note);
    if (!ok) printf("        rank %d: %s\n", bad_rank, why);
    fflush(stdout);
  }
  double t = now_s();
  if (d->o.mbs > d->o.rows && t - d->t_progress > 2.0) {
    d->t_progress = t;
    fprintf(stderr, "progress: %d/%d microbatches, %llu tokens, %.1f s\n", mb + 1, d->o.mbs,
            (unsigned long long)d->tokens_total, t - d->t_start);
  }
}

/* ---- the rank function ---- */

static tpf_status demo_rank(tpf_backend *be, int rank, void *arg) {
  demo_ctx *d = arg;
  const demo_opts *o = &d->o;
  tpf_manager *m = NULL;
  tpf_comm *comm[NSITES] = {0};
  demo_site_mem mem[NSITES];
  memset(mem, 0, sizeof mem);
  void *stream = d->env->stream(d->env, rank);
  tpf_status rc = tpf_manager_create(be, &m);
  for (int i = 0; i < NSITES && rc == TPF_OK; i++) {
    tpf_comm_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.name = kSites[i].name;
    cfg.algo = kSites[i].algo;
    cfg.coll = kSites[i].coll;
    cfg.dtype = o->dtype;
    cfg.capacity.rows = o->C;
    cfg.capacity.cols = o->H;
    cfg.external = kSites[i].external;
    rc = tpf_manager_add(m, &cfg, &comm[i]);
    mem[i].d = d;
    mem[i].be = be;
    mem[i].rank = rank;
    mem[i].stream = stream;
    if (rc == TPF_OK) rc = site_mem_init(&mem[i], &kSites[i]);
  }
  if (rc != TPF_OK) atomic_store(&d->abort_run, 1);
  pthread_barrier_wait(&d->barrier);
  uint64_t regs0 = 0;
  if (rank == 0 && d->bytes_moved) d->measured_total = d->bytes_moved(d);
  if (rank == 0 && d->registrations) regs0 = d->regs_setup = d->registrations(d);
  pthread_barrier_wait(&d->barrier);

  for (int mb = 0; mb < o->mbs && !atomic_load(&d->abort_run); mb++) {
    demo_rank_mb *res = &d->res[(size_t)mb * (size_t)o->P + (size_t)rank];
    res->ok = true;
    uint64_t T = d->mb[mb].T;
    uint64_t h0 = d->now_ns(d);
    tpf_shape active = {T, o->H};
    tpf_status st = tpf_manager_set_active_shape(m, active);
    if (st != TPF_OK) {
      fail_why(res, "set_active_shape [%llu, %llu]: %s: %s", (unsigned long long)T,
               (unsigned long long)o->H, tpf_status_name(st), tpf_last_error());
      rc = st;
    }
    for (int k = 0; k < NOPS && st == TPF_OK; k++) {
      int si = kOrder[k];
      st = run_site(&mem[si], si, comm[si], (uint64_t)mb, T, res, &res->op_ms);
      if (st != TPF_OK) {
        fail_why(res, "%s: %s: %s", kSites[si].name, tpf_status_name(st), tpf_last_error());
        rc = st;
      }
    }
    if (d->trace) {
      char name[48];
      snprintf(name, sizeof name, "microbatch %d T=%llu", mb + 1, (unsigned long long)T);
      tpf_trace_span(d->trace, rank, TPF_TRACE_HOST_TID, name, "microbatch", h0, d->now_ns(d), 0,
                     (uint64_t)mb + 1);
    }
    if (rc != TPF_OK) atomic_store(&d->abort_run, 1);
    pthread_barrier_wait(&d->barrier);
    if (rank == 0) report_mb(d, mb);
    pthread_barrier_wait(&d->barrier);
  }

  /* Every rank has finished its microbatches once rank 0 has passed the last barrier. */
  if (rank == 0 && d->registrations) {
    d->regs_loop = d->registrations(d) - regs0;
    d->have_registrations = true;
  }
  for (int i = 0; i < NSITES; i++) {
    buf_free(&mem[i], &mem[i].x);
    buf_free(&mem[i], &mem[i].w);
    buf_free(&mem[i], &mem[i].o);
  }
  if (m) {
    tpf_status st = tpf_manager_destroy(m);
    if (rc == TPF_OK) rc = st;
  }
  return rc;
}

/* ---- backends ---- */

static void *host_alloc(tpf_conf_env *env, int rank, size_t bytes) {
  (void)env;
  (void)rank;
  return malloc(bytes ? bytes : 1);
}
static void host_free(tpf_conf_env *env, int rank, void *p) {
  (void)env;
  (void)rank;
  free(p);
}
static tpf_status host_copy(tpf_conf_env *env, int rank, void *dst, const void *src, size_t n) {
  (void)env;
  (void)rank;
  memcpy(dst, src, n);
  return TPF_OK;
}
static void *null_stream(tpf_conf_env *env, int rank) {
  (void)env;
  (void)rank;
  return NULL;
}
static tpf_status be_sync(tpf_conf_env *env, int rank, tpf_backend *be) {
  (void)env;
  (void)rank;
  return tpf__be_sync(be, NULL); /* the core's (internal) path into the backend */
}

#ifdef TPF_HAVE_SIM
static uint64_t sim_bytes_moved(demo_ctx *d) {
  tpf_sim_stats s;
  return tpf_sim_get_stats(d->world, &s) == TPF_OK ? s.bytes_moved : 0;
}
static uint64_t sim_now_ns(demo_ctx *d) {
  return tpf_sim_elapsed_ns(d->world);
}
static uint64_t sim_registrations(demo_ctx *d) {
  tpf_sim_stats s;
  return tpf_sim_get_stats(d->world, &s) == TPF_OK ? s.registrations : 0;
}

static tpf_status sim_run(tpf_conf_env *env, int P, tpf_conf_rank_fn fn, void *arg) {
  demo_ctx *d = env->ctx;
  tpf_sim_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.tp_size = P;
  cfg.seed = d->o.seed;
  cfg.max_delay_us = d->o.delay_us;
  cfg.timeout_ms = d->o.timeout_ms;
  cfg.arena_bytes = d->o.arena_bytes;
  TPF_CHECK(tpf_sim_world_create(&cfg, &d->world));
  if (d->trace) tpf_sim_set_trace(d->world, tpf_trace_sim_event, d->trace);
  d->bytes_moved = sim_bytes_moved;
  d->now_ns = sim_now_ns;
  d->registrations = sim_registrations;
  tpf_status st = tpf_sim_run(d->world, fn, arg);
  char detail[1024];
  snprintf(detail, sizeof detail, "%s", tpf_last_error());
  d->bytes_moved = NULL;
  d->registrations = NULL;
  d->now_ns = host_now_ns;
  tpf_sim_world_destroy(d->world);
  d->world = NULL;
  return st != TPF_OK ? tpf_set_error(st, "%s", detail) : TPF_OK;
}
#endif

/* ---- command line ---- */

enum {
  D_BACKEND,
  D_TP,
  D_MBS,
  D_CAP,
  D_HIDDEN,
  D_DTYPE,
  D_SEED,
  D_DELAY,
  D_TIMEOUT,
  D_ARENA,
  D_TRACE,
  D_ROWS,
  D_NOCHECK,
  D_NOPTS
};
static const cli_opt kDemoOpts[D_NOPTS] = {
    [D_BACKEND] = {"--backend", CLI_CHOICE, 0, 0, "sim|cuda", NULL, "backend (default sim)", 0,
                   false},
    [D_TP] = {"--tp", CLI_U64, 1, TPF_MAX_RANKS, NULL, "P", "tensor-parallel ranks (default 4)", 0,
              false},
    [D_MBS] = {"--microbatches", CLI_U64, 1, 100000, NULL, "N", "microbatches to run (default 12)",
               0, false},
    [D_CAP] = {"--capacity", CLI_U64, 1, 1ull << 24, NULL, "C",
               "max tokens per microbatch, a multiple of P (default 1024)", 0, false},
    [D_HIDDEN] = {"--hidden", CLI_U64, 4, 1ull << 16, NULL, "H",
                  "hidden size, a multiple of P (default 128)", 0, false},
    [D_DTYPE] = {"--dtype", CLI_CHOICE, 0, 0, "bf16|fp16|fp32", NULL,
                 "buffer and operand dtype (default bf16)", 0, false},
    [D_SEED] = {"--seed", CLI_U64, 0, UINT64_MAX, NULL, "S",
                "seed of sequence lengths, data and delays (default 1)", 0, false},
    [D_DELAY] = {"--max-delay-us", CLI_U64, 0, 1000000, NULL, "U",
                 "simulator: random delay before each step (default 0)", 0, false},
    [D_TIMEOUT] = {"--timeout-ms", CLI_U64, 1, 3600000, NULL, "MS",
                   "bound on every wait (default 10000)", 0, false},
    [D_ARENA] = {"--arena-mib", CLI_U64, 1, 1u << 20, NULL, "MIB",
                 "simulator: size of the shared arena all registrations live in (default 1024)", 0,
                 false},
    [D_TRACE] = {"--trace", CLI_STR, 0, 0, NULL, "FILE",
                 "write a Chrome trace JSON (open in ui.perfetto.dev)", 0, false},
    [D_ROWS] = {"--rows", CLI_U64, 1, 1000000, NULL, "N",
                "table rows to print on long runs (default 40)", 0, false},
    [D_NOCHECK] = {"--no-check", CLI_FLAG, 0, 0, NULL, NULL,
                   "skip the reference checks (timing only)", 0, false},
};

static bool layouts_accept(const demo_opts *o, uint64_t T);

static int parse(int argc, char **argv, demo_opts *o) {
  static const cli_ctx ctx = {"tpflex demo", false, NULL};
  cli_val v[D_NOPTS];
  int rc = cli_parse(&ctx, kDemoOpts, D_NOPTS, argc, argv, v,
                     "usage: tpflex demo [options]   "
                     "(every option is optional)");
  if (rc >= 0) return rc;
  static const tpf_dtype dts[] = {TPF_BF16, TPF_FP16, TPF_FP32};
  o->backend = v[D_BACKEND].set ? v[D_BACKEND].s : "sim";
  o->P = v[D_TP].set ? (int)v[D_TP].u : 4;
  o->mbs = v[D_MBS].set ? (int)v[D_MBS].u : 12;
  o->C = v[D_CAP].set ? v[D_CAP].u : 1024;
  o->H = v[D_HIDDEN].set ? v[D_HIDDEN].u : 128;
  o->dtype = v[D_DTYPE].set ? dts[v[D_DTYPE].u] : TPF_BF16;
  o->seed = v[D_SEED].set ? v[D_SEED].u : 1;
  o->delay_us = v[D_DELAY].set ? (unsigned)v[D_DELAY].u : 0;
  o->timeout_ms = v[D_TIMEOUT].set ? (unsigned)v[D_TIMEOUT].u : 10000;
  o->arena_bytes = v[D_ARENA].set ? v[D_ARENA].u << 20 : 0;
  o->trace = v[D_TRACE].set ? v[D_TRACE].s : NULL;
  o->rows = v[D_ROWS].set ? (int)v[D_ROWS].u : 40;
  o->check = !v[D_NOCHECK].set;
  const unsigned long long P = (unsigned long long)o->P;
  if (o->C < P || o->C % P != 0)
    return cli_error(&ctx, "--capacity '%llu' is not a multiple of --tp %llu (try %llu)",
                     (unsigned long long)o->C, P, (o->C + P - 1) / P * P);
  if (o->H % P != 0)
    return cli_error(&ctx, "--hidden '%llu' is not a multiple of --tp %llu (try %llu)",
                     (unsigned long long)o->H, P, (o->H + P - 1) / P * P);
  if (!layouts_accept(o, o->C)) {
    demo_opts t = *o;
    char why[512];
    snprintf(why, sizeof why, "%s", tpf_last_error());
    for (t.C = o->C + P; t.C <= o->C + 4096 * P && t.C <= (1ull << 24); t.C += P)
      if (layouts_accept(&t, t.C))
        return cli_error(&ctx,
                         "--capacity '%llu' with --hidden %llu --tp %llu breaks a layout rule "
                         "(%s); the smallest capacity above it that every layout accepts is %llu",
                         (unsigned long long)o->C, (unsigned long long)o->H, P, why,
                         (unsigned long long)t.C);
    return cli_error(&ctx,
                     "--capacity '%llu' with --hidden %llu --tp %llu breaks a layout rule (%s)",
                     (unsigned long long)o->C, (unsigned long long)o->H, P, why);
  }
  if (o->arena_bytes && strcmp(o->backend, "sim") != 0)
    return cli_error(&ctx, "--arena-mib applies to --backend sim only");
  if (v[D_DELAY].set && strcmp(o->backend, "sim") != 0)
    return cli_error(&ctx, "--max-delay-us applies to --backend sim only");
  return -1;
}

/* True when every site's layout accepts T rows (SPEC §3 with the strictest alignment, 16 bytes:
 * a pipeline block of T x H/4 elements must start 16-byte aligned, which can need more than
 * T % P == 0). */
static bool layouts_accept(const demo_opts *o, uint64_t T) {
  for (int i = 0; i < NSITES; i++) {
    tpf_layout_desc desc;
    memset(&desc, 0, sizeof desc);
    desc.tp_size = o->P;
    desc.algo = kSites[i].algo;
    desc.coll = kSites[i].coll;
    desc.dtype = o->dtype;
    desc.capacity.rows = o->C;
    desc.capacity.cols = o->H;
    desc.active.rows = T;
    desc.active.cols = o->H;
    if (tpf_layout_check(&desc) != TPF_OK) return false;
  }
  return true;
}

/* Packed-sequence microbatches: each packs random sequence lengths up to a random fill of the
 * capacity (a packer with a token budget); T is rounded up to a multiple of P, and further when a
 * layout needs it for 16-byte alignment. */
static void plan_microbatches(demo_ctx *d) {
  uint64_t st = mix(d->o.seed, 0x6d62ull);
  const uint64_t C = d->o.C, P = (uint64_t)d->o.P;
  uint64_t max_seq = C / 4 > P ? C / 4 : P;
  for (int i = 0; i < d->o.mbs; i++) {
    double fill = 0.1 + 0.9 * (double)(tpf_ref_rand_u64(&st) >> 11) / 9007199254740992.0;
    uint64_t budget = (uint64_t)(fill * (double)C);
    if (budget < 1) budget = 1;
    uint64_t tokens = 0, seqs = 0;
    for (;;) {
      uint64_t len = 1 + tpf_ref_rand_u64(&st) % max_seq;
      if (tokens + len > budget) {
        if (seqs == 0) { /* a first sequence longer than the budget is cut to it */
          tokens = budget;
          seqs = 1;
        }
        break;
      }
      tokens += len;
      seqs++;
    }
    uint64_t T = (tokens + P - 1) / P * P;
    while (T < C && !layouts_accept(&d->o, T))
      T += P;
    if (T > C) T = C;
    d->mb[i].T = T;
    d->mb[i].tokens = tokens;
    d->mb[i].seqs = seqs;
  }
}

int tpf_cmd_demo(int argc, char **argv) {
  demo_ctx *d = calloc(1, sizeof *d);
  if (!d) return 1;
  int prc = parse(argc, argv, &d->o);
  if (prc >= 0) {
    free(d);
    return prc;
  }
  const demo_opts *o = &d->o;
  tpf_conf_env env;
  memset(&env, 0, sizeof env);
  env.ctx = d;
  d->env = &env;
  d->now_ns = host_now_ns;
  d->measured_ok = true;
  {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    d->t0_ns = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
  }
  if (!strcmp(o->backend, "sim")) {
#ifdef TPF_HAVE_SIM
    env.name = "sim";
    env.max_ranks = TPF_MAX_RANKS;
    env.run = sim_run;
    env.mem_alloc = host_alloc;
    env.mem_free = host_free;
    env.upload = host_copy;
    env.download = host_copy;
    env.stream = null_stream;
    env.sync = be_sync;
#else
    fprintf(stderr,
            "tpflex demo: this build has no simulator (configure with -DTPF_WITH_SIM=ON)\n");
    free(d);
    return 2;
#endif
  } else if (!strcmp(o->backend, "cuda")) {
#ifdef TPF_HAVE_CUDA
    if (!tpf_demo_cuda_env) {
      fprintf(stderr,
              "tpflex demo: --backend cuda: this build has the CUDA backend but not its "
              "demo environment (tpf_demo_cuda_env); run the GPU conformance test instead\n");
      free(d);
      return 2;
    }
    tpf_status st = tpf_demo_cuda_env(&env, o->P);
    if (st != TPF_OK) {
      fprintf(stderr, "tpflex demo: --backend cuda: %s: %s\n", tpf_status_name(st),
              tpf_last_error());
      free(d);
      return 1;
    }
    env.ctx = env.ctx ? env.ctx : d;
#else
    fprintf(stderr, "tpflex demo: --backend cuda: this tpflex was built without the CUDA backend "
                    "(needs nvcc; configure with -DTPF_WITH_CUDA=ON, e.g. make test-cuda)\n");
    free(d);
    return 2;
#endif
  } else {
    fprintf(stderr, "tpflex demo: unknown backend '%s' (sim or cuda)\n", o->backend);
    free(d);
    return 2;
  }
  if (o->P > env.max_ranks) {
    fprintf(stderr, "tpflex demo: backend %s runs at most %d ranks\n", env.name, env.max_ranks);
    free(d);
    return 2;
  }

  d->mb = calloc((size_t)o->mbs, sizeof *d->mb);
  d->res = calloc((size_t)o->mbs * (size_t)o->P, sizeof *d->res);
  if (!d->mb || !d->res) {
    fprintf(stderr, "tpflex demo: out of memory\n");
    return 1;
  }
  plan_microbatches(d);
  uint64_t padded = 0;
  for (int k = 0; k < NOPS; k++) {
    uint64_t b = 0;
    if (sched_bytes(o, &kSites[kOrder[k]], o->C, &b) != TPF_OK) {
      fprintf(stderr, "tpflex demo: schedule of %s at capacity: %s\n", kSites[kOrder[k]].name,
              tpf_last_error());
      return 1;
    }
    padded += b;
  }
  for (int i = 0; i < o->mbs; i++) {
    d->mb[i].padded_bytes = padded;
    for (int k = 0; k < NOPS; k++) {
      uint64_t b = 0;
      if (sched_bytes(o, &kSites[kOrder[k]], d->mb[i].T, &b) != TPF_OK) {
        fprintf(stderr, "tpflex demo: schedule of %s at T=%llu: %s\n", kSites[kOrder[k]].name,
                (unsigned long long)d->mb[i].T, tpf_last_error());
        return 1;
      }
      d->mb[i].sched_bytes += b;
    }
  }
  if (o->trace && tpf_trace_create(&d->trace) != TPF_OK) {
    fprintf(stderr, "tpflex demo: %s\n", tpf_last_error());
    return 1;
  }
  pthread_barrier_init(&d->barrier, NULL, (unsigned)o->P);

  printf("tpflex demo: backend %s, TP %d, one manager per rank, capacity [%llu, %llu] %s, %d "
         "microbatches of packed sequences\n",
         env.name, o->P, (unsigned long long)o->C, (unsigned long long)o->H,
         tpf_dtype_name(o->dtype), o->mbs);
  printf("communicators (TransformerEngine defaults):");
  for (int i = 0; i < NSITES; i++)
    printf("%s %s=%s%s%s", i ? "," : "", kSites[i].name,
           kSites[i].algo == TPF_ALGO_RING       ? "ring-exchange "
           : kSites[i].algo == TPF_ALGO_PIPELINE ? "pipeline "
                                                 : "bulk ",
           tpf_coll_name(kSites[i].coll), kSites[i].external ? " (external)" : "");
  printf("\n  (external: registered by the manager but filled outside tpflex, so it is never "
         "resized and stays at capacity)");
  printf(
      "\nper microbatch: set_active_shape once, then %d operations (4 fprop, 6 dgrad/wgrad), each "
      "checked against the host reference%s\n\n",
      NOPS, o->check ? "" : " (checks off)");
  printf("tokens = packed sequence tokens; rows T = tokens padded to a row count every layout "
         "accepts; rows/rank = T/P; fill = T/C\n");
  printf("%5s %7s %7s %8s %5s %7s %4s %12s %12s %9s  %s\n", "mb", "tokens", "rows T", "rows/rank",
         "seqs", "fill", "ops", "moved", "padded-to-C", "ops ms", "check");

  d->t_start = now_s();
  d->t_progress = d->t_start;
  tpf_status st = env.run(&env, o->P, demo_rank, d);
  double wall = now_s() - d->t_start;

  int done = (int)(d->ok_mbs + d->failed_mbs);
  char mv[32], pd[32];
  fmt_bytes(d->sched_total, mv, sizeof mv);
  fmt_bytes(d->padded_total, pd, sizeof pd);
  printf("\nsummary\n");
  printf("  microbatches      %d of %d run, %llu checked OK, %llu failed\n", done, o->mbs,
         (unsigned long long)d->ok_mbs, (unsigned long long)d->failed_mbs);
  uint64_t q = 0; /* the row multiple every layout accepts at this shape, when there is one */
  for (uint64_t t = (uint64_t)o->P; t <= o->C && !q; t += (uint64_t)o->P)
    if (layouts_accept(o, t)) q = t;
  for (uint64_t t = q; q && t <= o->C && t <= 16 * q; t += q)
    if (!layouts_accept(o, t)) q = 0;
  if (q)
    printf("  tokens            %llu in packed sequences; %llu rows run (T = tokens rounded up to "
           "a multiple of %llu, the smallest row step every layout aligns); %llu rows if padded "
           "to capacity\n",
           (unsigned long long)d->tokens_total, (unsigned long long)d->rows_total,
           (unsigned long long)q, (unsigned long long)((uint64_t)done * o->C));
  else
    printf("  tokens            %llu in packed sequences; %llu rows run (T = tokens rounded up to "
           "the next multiple of %d that every layout aligns); %llu rows if padded to "
           "capacity\n",
           (unsigned long long)d->tokens_total, (unsigned long long)d->rows_total, o->P,
           (unsigned long long)((uint64_t)done * o->C));
  printf("  operations        %llu (%d per microbatch), ops time %.1f ms on rank 0, wall %.2f s\n",
         (unsigned long long)d->ops_total, NOPS, d->op_ms_total, wall);
  if (d->have_registrations)
    printf("  registrations     %s per communicator: %d communicators, %llu registrations at "
           "capacity before the first microbatch, %llu during the %d microbatches\n",
           d->regs_setup == (uint64_t)NSITES && d->regs_loop == 0 ? "1" : "NOT 1", NSITES,
           (unsigned long long)d->regs_setup, (unsigned long long)d->regs_loop, done);
  else
    printf("  registrations     not counted by this backend (%d communicators, each registered "
           "once at capacity by the demo)\n",
           NSITES);
  printf("  bytes moved       %s here vs %s padded to capacity (%.1f%% saved)%s\n", mv, pd,
         d->padded_total ? 100.0 * (1.0 - (double)d->sched_total / (double)d->padded_total) : 0.0,
         d->measured_ok && d->have_registrations ? "; backend-measured bytes equal the schedule's"
                                                 : "");
  bool trace_failed = false;
  if (d->trace) {
    tpf_status ts = tpf_trace_write(d->trace, o->trace, o->P);
    if (ts == TPF_OK)
      printf("  trace             %s (%llu spans; one track per rank and stream; "
             "ui.perfetto.dev)\n",
             o->trace, (unsigned long long)tpf_trace_count(d->trace));
    else {
      printf("  trace             not written: %s\n", tpf_last_error());
      fprintf(stderr, "tpflex demo: --trace '%s' could not be written: %s\n", o->trace,
              tpf_last_error());
      trace_failed = true;
    }
  }
  bool pass = st == TPF_OK && !trace_failed && d->failed_mbs == 0 && done == o->mbs &&
              (!d->have_registrations || (d->regs_setup == (uint64_t)NSITES && d->regs_loop == 0));
  if (st != TPF_OK)
    printf("  error             %s: %s%s\n", tpf_status_name(st), tpf_last_error(),
           strstr(tpf_last_error(), "arena") ? " (the simulator arena: raise it with --arena-mib)"
                                             : "");
  printf("  result            %s\n", pass ? "every check OK" : "FAILED");
  pthread_barrier_destroy(&d->barrier);
  tpf_trace_destroy(d->trace);
  free(d->mb);
  free(d->res);
  free(d);
  return pass ? 0 : 1;
}
