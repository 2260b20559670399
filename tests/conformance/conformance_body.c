/* The conformance sweep, compiled once per backend (conformance_sim.c, conformance_cuda.c).
 *
 * Method: for every P the environment can run, one collective run executes, on every rank, the
 * whole sweep for that P: every algorithm/collective variant (RING AG plain, with one GEMM and
 * aggregate; RING RS; PIPELINE RS with 4 and 2 splits; BULK AG and RS) times every buffer dtype
 * (bf16, fp16, fp32, fp8_e4m3, fp8_e5m2: see "FP8" below) times every T that is a multiple of P up
 * to the capacity C. Each rank generates every rank's inputs from seeds that depend only on (P,
 * variant, dtype, T, role, owner), so it can compute its own expected result with the independent
 * host reference (harness/reference.c) without talking to the others; nothing here is backend
 * specific: operand memory goes through the environment (harness/staging.h over env->mem_alloc,
 * upload, download) and streams through env->stream.
 *
 * Checked per case: the GEMM output against the reference with SPEC §7's per-element rule (one
 * element out of tolerance fails the case; tolerance of the buffer dtype or the output dtype,
 * the coarser of the two), gathered buffers byte for byte (a transfer must not
 * change a bit), reduced chunks against the fp32 sum of the partials rounded as the buffer
 * stores them. The backend checks its canary itself after every operation. Shape histories
 * (capacity, shrink, grow, shrink, repeat, back to capacity) on one communicator must give
 * results bitwise equal to a fresh communicator's at the same T, which is what "results do not
 * depend on T's history" means.
 *
 * Outputs alternate per T between the buffer dtype and fp32, and between ld == cols and a padded
 * ld, so both paths of every operand are exercised.
 *
 * FP8 (SPEC §11): an fp8 sweep dtype is the buffer's on AG sites (RING AG moves fp8 bytes, BULK
 * AG gathers them) and the GEMM operands' everywhere: x/a in that dtype, w/b in fp8_e4m3 (for an
 * e4m3 sweep alternately e4m3 and e5m2 with T, so both cuBLASLt pairs run), with per-tensor scales
 * a_scale_inv 0.75 and w_scale_inv 2 (in backend memory); D alternates bf16 / fp32 / fp16. RS
 * sites keep a bf16 buffer (an fp8 one would hold fp8 partial sums; the core refuses it), so
 * their partials are reduced in fp32 and written in D's dtype. The options sweep runs the fp8
 * dtypes too, with the same operand dtypes and scales: a bias case writes a 16-bit D there, and
 * on an environment whose fp8 GEMM is TN only (CUDA: tpf_conf_env.fp8_tn_only) every trans_a /
 * trans_w case must be refused with TPF_EUNSUPPORTED, changing nothing.
 *
 * A backend that sums a GEMM's products in its own order (the CUDA driver says so:
 * tpf_conformance_main's own_order) gets SPEC §7's fp32 accumulation-order slack on every GEMM
 * result, gamma_K sum_k |a_ik b_jk| per element (of every partial, for GEMM+RS); the simulator
 * sums in the reference's order and is judged without it.
 */
#define _POSIX_C_SOURCE 200809L
#include "conformance.h"

#include "internal.h" /* TPF_CHECK, TPF_CHECK_GOTO */
#include "reference.h"

#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct {
  const char *label;
  tpf_algo algo;
  tpf_coll coll;
  int splits;
  bool aggregate;
} conf_kind;

static const conf_kind kKinds[] = {
    {"ring-ag", TPF_ALGO_RING, TPF_COLL_AG, 0, false},
    {"ring-ag-1gemm", TPF_ALGO_RING, TPF_COLL_AG, 1, false},
    {"ring-ag-aggregate", TPF_ALGO_RING, TPF_COLL_AG, 0, true},
    {"ring-rs", TPF_ALGO_RING, TPF_COLL_RS, 0, false},
    {"pipeline-rs", TPF_ALGO_PIPELINE, TPF_COLL_RS, 0, false},
    {"pipeline-rs-2", TPF_ALGO_PIPELINE, TPF_COLL_RS, 2, false},
    {"bulk-ag", TPF_ALGO_BULK, TPF_COLL_AG, 0, false},
    {"bulk-rs", TPF_ALGO_BULK, TPF_COLL_RS, 0, false},
};
#define NKINDS ((int)(sizeof kKinds / sizeof kKinds[0]))
static const tpf_dtype kDtypes[] = {TPF_BF16, TPF_FP16, TPF_FP32, TPF_FP8_E4M3, TPF_FP8_E5M2};
#define NDTYPES 5

#define CONF_MSG 600
#define CONF_MAX_PRINTED 20

typedef struct {
  uint64_t cases, failed;
  char first[CONF_MSG + 200];
} conf_rank_result;

typedef struct {
  tpf_conf_env *env;
  int P;
  uint64_t C, H, K, N; /* capacity rows, buffer columns, RS inner dim, AG weight rows */
  bool histories;
  bool options;     /* the API 0.2 options sweep (on unless --no-options) */
  bool own_order;   /* the backend sums over k in its own order: GEMMs get the order slack */
  bool fp8_tn_only; /* the environment's: fp8 with trans_a / trans_w is refused (cuBLASLt) */
  int only_kind;    /* -1: all */
  uint64_t seed;
  int verbose;
  conf_rank_result rk[TPF_MAX_RANKS];
} conf_run;

typedef struct {
  conf_run *run;
  tpf_backend *be;
  int rank;
  void *stream;
  conf_rank_result *res;
} conf_ctx;

/* ---- small helpers ---- */

/* The seed of one input: the same on every rank and in every history. */
static uint64_t seed_of(const conf_ctx *cx, int kind, tpf_dtype dt, uint64_t T, int role,
                        int owner) {
  uint64_t h = cx->run->seed;
  h = tpf_ref_mix(h, (uint64_t)cx->run->P);
  h = tpf_ref_mix(h, (uint64_t)kind);
  h = tpf_ref_mix(h, (uint64_t)dt);
  h = tpf_ref_mix(h, T);
  h = tpf_ref_mix(h, (uint64_t)role);
  return tpf_ref_mix(h, (uint64_t)owner);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Operands in backend memory with their host mirrors (harness/staging.h), for this rank. */
static tpf_status mat_new(conf_ctx *cx, tpf_stage_mat *m, uint64_t rows, uint64_t cols, uint64_t ld,
                          tpf_dtype dt) {
  return tpf_stage_new(cx->run->env, cx->rank, m, rows, cols, ld, dt);
}

static void mat_free(conf_ctx *cx, tpf_stage_mat *m) {
  tpf_stage_free(cx->run->env, cx->rank, m);
}

static tpf_status mat_upload(conf_ctx *cx, tpf_stage_mat *m) {
  return tpf_stage_upload(cx->run->env, cx->rank, m, m->host.rows);
}

static tpf_status mat_download(conf_ctx *cx, tpf_stage_mat *m) {
  return tpf_stage_download(cx->run->env, cx->rank, m, m->host.rows);
}

/* A signature of a case's results, for history-versus-fresh comparisons. */
typedef struct {
  unsigned char *bytes;
  size_t len, cap;
} conf_sig;

static void sig_add(conf_sig *s, const tpf_matrix *m) {
  if (!s) return;
  size_t esz = tpf_dtype_size(m->dtype), row = (size_t)m->cols * esz;
  size_t need = s->len + (size_t)m->rows * row;
  if (need > s->cap) {
    unsigned char *p = realloc(s->bytes, need);
    if (!p) return;
    s->bytes = p;
    s->cap = need;
  }
  for (uint64_t i = 0; i < m->rows; i++) {
    memcpy(s->bytes + s->len, (unsigned char *)m->ptr + i * m->ld * esz, row);
    s->len += row;
  }
}

/* Case verdicts. */
typedef struct {
  bool pass;
  char why[CONF_MSG];
} conf_verdict;

static void verdict_fail(conf_verdict *v, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
static void verdict_fail(conf_verdict *v, const char *fmt, ...) {
  if (!v->pass) return; /* keep the first reason */
  v->pass = false;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(v->why, sizeof v->why, fmt, ap);
  va_end(ap);
}

/* --self-test: every tolerance check judges a copy of the result in which ONE element (the one
 * with the smallest |want|) was moved out of tolerance by 4x the larger of atol, rtol |want| and
 * its RS slack, and the largest |want| within it; every such check must fail. It proves that the
 * checks of this suite see one wrong element (the oracle used to judge only the
 * max-abs-diff element). Counted over all ranks (threads of this process). */
static bool g_self_test;
static atomic_ullong g_self_checks, g_self_missed, g_self_maxdiff_blind;

static bool tol_check(const tpf_matrix *got, const tpf_matrix *want, const float *slack,
                      tpf_ref_tol tol, const char *what, char *why, size_t len) {
  if (!g_self_test || got->rows == 0 || got->cols == 0)
    return tpf_ref_check(got, want, slack, tol, what, why, len);
  const size_t esz = tpf_dtype_size(got->dtype);
  tpf_matrix bad = *got;
  bad.ptr = malloc((size_t)(got->rows * got->ld) * esz);
  if (!bad.ptr) {
    snprintf(why, len, "%s: self-test: out of memory", what);
    return false;
  }
  memcpy(bad.ptr, got->ptr, (size_t)(got->rows * got->ld) * esz);
  uint64_t bi = 0, bj = 0, mi = 0, mj = 0;
  double bw = INFINITY, mw = -1.0;
  for (uint64_t i = 0; i < got->rows; i++)
    for (uint64_t j = 0; j < got->cols; j++) {
      const double w = fabs((double)tpf_ref_get(want, i, j));
      if (w < bw) {
        bw = w;
        bi = i;
        bj = j;
      }
      if (w > mw) {
        mw = w;
        mi = i;
        mj = j;
      }
    }
  const double w = tpf_ref_get(want, bi, bj);
  double d = fmax(4.0 * tol.atol, 4.0 * tol.rtol * fabs(w));
  if (slack) d = fmax(d, 4.0 * ((double)slack[bi * got->cols + bj] + tpf_ref_ulp(got->dtype, w)));
  tpf_ref_set(&bad, bi, bj, (float)(w + d));
  /* The largest |want| moves too, within tolerance (rtol / 2): where that move is the larger,
   * the max-abs-diff element is a right one, which the old max-diff verdict passed. */
  if (mi != bi || mj != bj) {
    const double m = tpf_ref_get(want, mi, mj);
    tpf_ref_set(&bad, mi, mj, (float)(m * (1.0 + 0.5 * tol.rtol)));
  }
  const bool ok = tpf_ref_check(&bad, want, slack, tol, what, why, len);
  /* How many of these a verdict at the max-abs-diff element alone (the old oracle,
   * for checks without slack) would have passed: the wrong element is not the max-diff one. */
  tpf_ref_result r;
  if (!slack && tpf_ref_compare(&bad, want, tol, &r) == TPF_OK &&
      !(r.rel > tol.rtol && r.abs_diff > tol.atol) && !isinf(r.abs_diff))
    atomic_fetch_add(&g_self_maxdiff_blind, 1);
  free(bad.ptr);
  atomic_fetch_add(&g_self_checks, 1);
  if (ok) {
    atomic_fetch_add(&g_self_missed, 1);
    fprintf(stdout, "SELF-TEST MISSED %s: element (%llu, %llu) moved from %g by %g passed\n", what,
            (unsigned long long)bi, (unsigned long long)bj, w, d);
  }
  return ok;
}

static void check_close(conf_verdict *v, const char *what, const tpf_matrix *got,
                        const tpf_matrix *want, const float *slack, tpf_dtype buf_dtype) {
  char why[TPF_REF_FORMAT_LEN + 100];
  if (!tol_check(got, want, slack, tpf_ref_tolerance_pair(buf_dtype, got->dtype), what, why,
                 sizeof why))
    verdict_fail(v, "%s", why);
}

static void check_exact(conf_verdict *v, const char *what, const tpf_matrix *got,
                        const tpf_matrix *want) {
  char why[400];
  if (!tpf_ref_check_exact(got, want, what, why, sizeof why)) verdict_fail(v, "%s", why);
}

static bool is_fp8(tpf_dtype t) {
  return t == TPF_FP8_E4M3 || t == TPF_FP8_E5M2;
}

/* Output dtype and ld padding of a case: alternate with T so both paths run. An fp8 GEMM writes
 * bf16, fp32 or fp16. */
static tpf_dtype out_dtype(tpf_dtype buf, uint64_t T, int P) {
  if (is_fp8(buf)) {
    static const tpf_dtype outs[] = {TPF_BF16, TPF_FP32, TPF_FP16};
    return outs[(T / (uint64_t)P) % 3];
  }
  return ((T / (uint64_t)P) % 2 == 1) ? buf : TPF_FP32;
}

/* The communicator's dtype for a sweep dtype: fp8 RS sites keep a bf16 buffer (SPEC §11). */
static tpf_dtype comm_dtype(int kind, tpf_dtype dt);

/* w's (bulk: b's) dtype: the sweep dtype, or for fp8 the pair cuBLASLt takes (never e5m2 x e5m2);
 * an e4m3 sweep alternates e4m3 / e5m2 weights with T. */
static tpf_dtype w_dtype(tpf_dtype dt, uint64_t T, int P) {
  if (dt == TPF_FP8_E5M2) return TPF_FP8_E4M3;
  if (dt == TPF_FP8_E4M3) return ((T / (uint64_t)P) % 2 == 1) ? TPF_FP8_E5M2 : TPF_FP8_E4M3;
  return dt;
}

/* The fp8 per-tensor scales of a case (backend memory; TE's scale_inv) and their product. */
static const float kScaleA = 0.75f, kScaleW = 2.0f;
typedef struct {
  tpf_stage_mat sa, sw;
  tpf_op_options o;
  float scale; /* sa * sw, 1 without fp8 */
} fp8_opts;

static tpf_status fp8_opts_new(conf_ctx *cx, tpf_dtype a, fp8_opts *f) {
  const tpf_op_options def = TPF_OP_OPTIONS_INIT;
  memset(f, 0, sizeof *f);
  f->o = def;
  f->scale = 1.0f;
  if (!is_fp8(a)) return TPF_OK;
  TPF_CHECK(mat_new(cx, &f->sa, 1, 1, 1, TPF_FP32));
  TPF_CHECK(mat_new(cx, &f->sw, 1, 1, 1, TPF_FP32));
  tpf_ref_set(&f->sa.host, 0, 0, kScaleA);
  tpf_ref_set(&f->sw.host, 0, 0, kScaleW);
  TPF_CHECK(mat_upload(cx, &f->sa));
  TPF_CHECK(mat_upload(cx, &f->sw));
  f->o.a_scale_inv = f->sa.dev.ptr;
  f->o.w_scale_inv = f->sw.dev.ptr;
  f->scale = kScaleA * kScaleW;
  return TPF_OK;
}

static void fp8_opts_free(conf_ctx *cx, fp8_opts *f) {
  mat_free(cx, &f->sa);
  mat_free(cx, &f->sw);
}

/* d = round(scale * x w^T), the product in fp32 scaled once, as a backend folds the scales. */
static tpf_status ref_gemm_scaled(const tpf_matrix *x, const tpf_matrix *w, float scale,
                                  tpf_matrix *d) {
  if (scale == 1.0f) return tpf_ref_gemm(x, w, d);
  float *p = malloc((size_t)(x->rows * w->rows + 1) * sizeof(float));
  if (!p) return tpf_set_error(TPF_ENOMEM, "conformance: scaled reference");
  tpf_status rc = tpf_ref_gemm_f32(x, w, p);
  for (uint64_t i = 0; rc == TPF_OK && i < x->rows * w->rows; i++)
    p[i] *= scale;
  if (rc == TPF_OK) tpf_ref_set_f32(d, p);
  free(p);
  return rc;
}
static uint64_t pad_ld(uint64_t cols, uint64_t T, int P) {
  return ((T / (uint64_t)P) % 3 == 2) ? cols + 3 : cols;
}
/* An fp8 case pads by 16 elements: cuBLASLt's fp8 GEMM wants 16-byte multiples for every
 * leading dimension and row offset (bf16/fp16/fp32 D of an fp8 GEMM included). */
static uint64_t pad_ld_dt(uint64_t cols, uint64_t T, int P, tpf_dtype dt) {
  const uint64_t ld = pad_ld(cols, T, P);
  return (dt == TPF_FP8_E4M3 || dt == TPF_FP8_E5M2) && ld != cols ? cols + 16 : ld;
}

enum { ROLE_X = 1, ROLE_W, ROLE_A, ROLE_B, ROLE_PART };

/* ---- the cases ---- */

static tpf_status get_buffer(conf_ctx *cx, tpf_comm *c, tpf_matrix *host) {
  return tpf_stage_get_buffer(cx->run->env, cx->rank, c, host);
}

static tpf_status case_ag(conf_ctx *cx, tpf_comm *c, int kind, tpf_dtype dt, uint64_t T,
                          conf_verdict *v, conf_sig *sig) {
  conf_run *run = cx->run;
  const uint64_t H = run->H, N = run->N;
  tpf_matrix x = {0}, dref = {0}, bufh = {0};
  float *osl = NULL; /* the order slack (own_order), else NULL */
  tpf_stage_mat w, d;
  memset(&w, 0, sizeof w);
  memset(&d, 0, sizeof d);
  tpf_status rc;
  fp8_opts f8;
  TPF_CHECK_GOTO(fp8_opts_new(cx, dt, &f8), rc, out);
  TPF_CHECK_GOTO(tpf_stage_host_new(&x, T, H, dt), rc, out);
  tpf_ref_fill(&x, seed_of(cx, kind, dt, T, ROLE_X, 0), -1.0f, 1.0f);
  TPF_CHECK_GOTO(mat_new(cx, &w, N, H, pad_ld_dt(H, T, run->P, dt), w_dtype(dt, T, run->P)), rc,
                 out);
  tpf_ref_fill(&w.host, seed_of(cx, kind, dt, T, ROLE_W, cx->rank), -1.0f, 1.0f);
  TPF_CHECK_GOTO(mat_upload(cx, &w), rc, out);
  tpf_dtype od = out_dtype(dt, T, run->P);
  TPF_CHECK_GOTO(mat_new(cx, &d, T, N, pad_ld_dt(N, T, run->P, dt), od), rc, out);
  TPF_CHECK_GOTO(tpf_stage_put_local(cx->run->env, cx->rank, c, &x), rc, out);

  TPF_CHECK_GOTO(tpf_ag_gemm_ex(c, &w.dev, &d.dev, &f8.o, cx->stream), rc, out);
  TPF_CHECK_GOTO(run->env->sync(run->env, cx->rank, cx->be), rc, out);

  TPF_CHECK_GOTO(mat_download(cx, &d), rc, out);
  TPF_CHECK_GOTO(tpf_stage_host_new(&dref, T, N, od), rc, out);
  TPF_CHECK_GOTO(ref_gemm_scaled(&x, &w.host, f8.scale, &dref), rc, out);
  TPF_CHECK_GOTO(tpf_ref_order_slack(&x, &w.host, f8.scale, run->own_order, &osl), rc, out);
  check_close(v, "D = AG(X) W^T", &d.host, &dref, osl, dt);
  TPF_CHECK_GOTO(get_buffer(cx, c, &bufh), rc, out);
  check_exact(v, "gathered buffer", &bufh, &x);
  sig_add(sig, &d.host);
  sig_add(sig, &bufh);
out:
  fp8_opts_free(cx, &f8);
  free(osl);
  free(x.ptr);
  free(dref.ptr);
  free(bufh.ptr);
  mat_free(cx, &w);
  mat_free(cx, &d);
  return rc;
}

/* Expected rows [r*R, (r+1)*R) of sum_q round_buf(X_q W_q^T), rounded to out's dtype; slack[]
 * (R*H) gets one ulp of each rounded partial (tpf_ref_compare_slack), and with own_order each
 * partial's accumulation-order slack (tpf_ref_rs_add_partial_order). */
static tpf_status expected_rs(conf_ctx *cx, int kind, tpf_dtype dt, uint64_t T, tpf_matrix *out,
                              float *slack) {
  conf_run *run = cx->run;
  const uint64_t H = run->H, K = run->K, R = T / (uint64_t)run->P;
  tpf_matrix xq = {0}, wq = {0};
  float *acc = calloc((size_t)(R * H), sizeof(float));
  tpf_status rc = TPF_OK;
  if (!acc) {
    rc = tpf_set_error(TPF_ENOMEM, "conformance: RS reference");
    goto out;
  }
  TPF_CHECK_GOTO(tpf_stage_host_new(&xq, T, K, dt), rc, out);
  TPF_CHECK_GOTO(tpf_stage_host_new(&wq, H, K, w_dtype(dt, T, run->P)), rc, out);
  for (int q = 0; q < run->P; q++) {
    tpf_ref_fill(&xq, seed_of(cx, kind, dt, T, ROLE_X, q), -1.0f, 1.0f);
    tpf_ref_fill(&wq, seed_of(cx, kind, dt, T, ROLE_W, q), -1.0f, 1.0f);
    tpf_matrix mine = tpf_stage_rows(&xq, (uint64_t)cx->rank * R, R);
    rc = tpf_ref_rs_add_partial_scaled(&mine, &wq, comm_dtype(kind, dt),
                                       is_fp8(dt) ? kScaleA * kScaleW : 1.0f, run->own_order, acc,
                                       slack);
    if (rc != TPF_OK) {
      rc = tpf_set_error(rc, "conformance: RS reference partial of rank %d", q);
      goto out;
    }
  }
  tpf_ref_set_f32(out, acc);
out:
  free(acc);
  free(xq.ptr);
  free(wq.ptr);
  return rc;
}

static tpf_status case_rs(conf_ctx *cx, tpf_comm *c, int kind, tpf_dtype dt, uint64_t T,
                          conf_verdict *v, conf_sig *sig) {
  conf_run *run = cx->run;
  const uint64_t H = run->H, K = run->K, R = T / (uint64_t)run->P;
  tpf_stage_mat x, w, o;
  memset(&x, 0, sizeof x);
  memset(&w, 0, sizeof w);
  memset(&o, 0, sizeof o);
  tpf_matrix oref = {0};
  float *slack = NULL;
  tpf_status rc;
  fp8_opts f8;
  TPF_CHECK_GOTO(fp8_opts_new(cx, dt, &f8), rc, out);
  TPF_CHECK_GOTO(mat_new(cx, &x, T, K, pad_ld_dt(K, T, run->P, dt), dt), rc, out);
  TPF_CHECK_GOTO(mat_new(cx, &w, H, K, K, w_dtype(dt, T, run->P)), rc, out);
  tpf_ref_fill(&x.host, seed_of(cx, kind, dt, T, ROLE_X, cx->rank), -1.0f, 1.0f);
  tpf_ref_fill(&w.host, seed_of(cx, kind, dt, T, ROLE_W, cx->rank), -1.0f, 1.0f);
  TPF_CHECK_GOTO(mat_upload(cx, &x), rc, out);
  TPF_CHECK_GOTO(mat_upload(cx, &w), rc, out);
  tpf_dtype od = out_dtype(comm_dtype(kind, dt), T, run->P);
  TPF_CHECK_GOTO(mat_new(cx, &o, R, H, pad_ld_dt(H, T, run->P, dt), od), rc, out);

  TPF_CHECK_GOTO(tpf_gemm_rs_ex(c, &x.dev, &w.dev, &o.dev, &f8.o, cx->stream), rc, out);
  TPF_CHECK_GOTO(run->env->sync(run->env, cx->rank, cx->be), rc, out);
  TPF_CHECK_GOTO(mat_download(cx, &o), rc, out);

  TPF_CHECK_GOTO(tpf_stage_host_new(&oref, R, H, od), rc, out);
  slack = calloc((size_t)(R * H), sizeof *slack);
  if (!slack) {
    rc = tpf_set_error(TPF_ENOMEM, "conformance: RS slack");
    goto out;
  }
  TPF_CHECK_GOTO(expected_rs(cx, kind, dt, T, &oref, slack), rc, out);
  check_close(v, "out = RS(X W^T)", &o.host, &oref, slack, dt);
  sig_add(sig, &o.host);
out:
  fp8_opts_free(cx, &f8);
  free(slack);
  free(oref.ptr);
  mat_free(cx, &x);
  mat_free(cx, &w);
  mat_free(cx, &o);
  return rc;
}

static tpf_status case_bulk(conf_ctx *cx, tpf_comm *c, int kind, tpf_dtype dt, uint64_t T, bool rs,
                            conf_verdict *v, conf_sig *sig) {
  conf_run *run = cx->run;
  const uint64_t H = run->H, K = run->K, N = run->N, R = T / (uint64_t)run->P;
  const int P = run->P;
  tpf_matrix x = {0}, dref = {0}, bufh = {0}, want = {0}, part = {0};
  float *osl = NULL; /* the independent GEMM's order slack (own_order), else NULL */
  tpf_stage_mat a, b, d;
  memset(&a, 0, sizeof a);
  memset(&b, 0, sizeof b);
  memset(&d, 0, sizeof d);
  tpf_status rc;
  const tpf_dtype cd = comm_dtype(kind, dt); /* the buffer's */
  fp8_opts f8;
  TPF_CHECK_GOTO(fp8_opts_new(cx, dt, &f8), rc, out);
  /* The independent GEMM: a [T, K] x b [N, K]^T (a dgrad/wgrad stand-in). */
  TPF_CHECK_GOTO(mat_new(cx, &a, T, K, pad_ld_dt(K, T, P, dt), dt), rc, out);
  TPF_CHECK_GOTO(mat_new(cx, &b, N, K, K, w_dtype(dt, T, P)), rc, out);
  tpf_ref_fill(&a.host, seed_of(cx, kind, dt, T, ROLE_A, cx->rank), -1.0f, 1.0f);
  tpf_ref_fill(&b.host, seed_of(cx, kind, dt, T, ROLE_B, cx->rank), -1.0f, 1.0f);
  TPF_CHECK_GOTO(mat_upload(cx, &a), rc, out);
  TPF_CHECK_GOTO(mat_upload(cx, &b), rc, out);
  tpf_dtype od = out_dtype(dt, T, P);
  TPF_CHECK_GOTO(mat_new(cx, &d, T, N, pad_ld_dt(N, T, P, dt), od), rc, out);

  if (!rs) {
    TPF_CHECK_GOTO(tpf_stage_host_new(&x, T, H, cd), rc, out);
    tpf_ref_fill(&x, seed_of(cx, kind, dt, T, ROLE_X, 0), -1.0f, 1.0f);
    TPF_CHECK_GOTO(tpf_stage_put_local(cx->run->env, cx->rank, c, &x), rc, out);
  } else {
    /* Every rank's [T, H] partial fills its whole active buffer. */
    TPF_CHECK_GOTO(tpf_stage_host_new(&part, T, H, cd), rc, out);
    tpf_ref_fill(&part, seed_of(cx, kind, dt, T, ROLE_PART, cx->rank), -1.0f, 1.0f);
    TPF_CHECK_GOTO(tpf_stage_put_buffer(run->env, cx->rank, c, &part), rc, out);
  }

  TPF_CHECK_GOTO(tpf_bulk_overlap_ex(c, &a.dev, &b.dev, &d.dev, &f8.o, cx->stream), rc, out);
  TPF_CHECK_GOTO(run->env->sync(run->env, cx->rank, cx->be), rc, out);

  TPF_CHECK_GOTO(mat_download(cx, &d), rc, out);
  TPF_CHECK_GOTO(tpf_stage_host_new(&dref, T, N, od), rc, out);
  TPF_CHECK_GOTO(ref_gemm_scaled(&a.host, &b.host, f8.scale, &dref), rc, out);
  TPF_CHECK_GOTO(tpf_ref_order_slack(&a.host, &b.host, f8.scale, run->own_order, &osl), rc, out);
  check_close(v, "independent D = A B^T", &d.host, &dref, osl, dt);
  sig_add(sig, &d.host);

  TPF_CHECK_GOTO(get_buffer(cx, c, &bufh), rc, out);
  if (!rs) {
    check_exact(v, "bulk all-gathered buffer", &bufh, &x);
    sig_add(sig, &bufh);
  } else {
    /* Chunk r = sum over ranks of rows [r*R, (r+1)*R) of their partials, in the buffer dtype. */
    TPF_CHECK_GOTO(tpf_stage_host_new(&want, R, H, cd), rc, out);
    float *acc = calloc((size_t)(R * H), sizeof(float));
    if (!acc) {
      rc = tpf_set_error(TPF_ENOMEM, "conformance: bulk RS reference");
      goto out;
    }
    for (int q = 0; q < P; q++) {
      tpf_ref_fill(&part, seed_of(cx, kind, dt, T, ROLE_PART, q), -1.0f, 1.0f);
      tpf_ref_add_rows(&part, (uint64_t)cx->rank * R, R, acc);
    }
    tpf_ref_set_f32(&want, acc);
    free(acc);
    tpf_matrix mine = tpf_stage_rows(&bufh, (uint64_t)cx->rank * R, R);
    check_close(v, "bulk reduce-scattered chunk", &mine, &want, NULL, cd);
    sig_add(sig, &mine);
  }
out:
  fp8_opts_free(cx, &f8);
  free(osl);
  free(x.ptr);
  free(dref.ptr);
  free(bufh.ptr);
  free(want.ptr);
  free(part.ptr);
  mat_free(cx, &a);
  mat_free(cx, &b);
  mat_free(cx, &d);
  return rc;
}

/* Sets the shape and runs one case; API failures are returned, wrong results go to v. */
static tpf_status run_case(conf_ctx *cx, tpf_comm *c, int kind, tpf_dtype dt, uint64_t T,
                           conf_verdict *v, conf_sig *sig) {
  tpf_shape s = {T, cx->run->H};
  TPF_CHECK(tpf_comm_set_active_shape(c, s));
  const conf_kind *k = &kKinds[kind];
  if (k->algo == TPF_ALGO_BULK)
    return case_bulk(cx, c, kind, dt, T, k->coll == TPF_COLL_RS, v, sig);
  if (k->coll == TPF_COLL_AG) return case_ag(cx, c, kind, dt, T, v, sig);
  return case_rs(cx, c, kind, dt, T, v, sig);
}

static bool kind_runs(const conf_kind *k, int P) {
  return !(k->aggregate && P % 2 != 0);
}

/* --adaptive: every communicator plans its schedules (TPF_PLAN_ADAPTIVE) on this synthetic
 * table, whose steep chunking tax at small GEMMs and per-message latency make the choice change
 * with T; the results must still match the reference exactly as in fixed mode. */
static bool g_adaptive;
static tpf_cost_table g_table;
static const char *kAdaptiveTable = "launch_us 2\nhandshake_us 5\nbarrier_us 5\n"
                                    "copy peer 20 10\ncopy local 5 40\nreduce 5 20\n"
                                    "gemm bf16 1 32 32 50\ngemm bf16 512 32 32 60\n"
                                    "gemm fp16 1 32 32 50\ngemm fp16 512 32 32 60\n"
                                    "gemm fp32 1 32 32 50\ngemm fp32 512 32 32 60\n"
                                    "gemm fp8_e4m3 1 32 32 50\ngemm fp8_e4m3 512 32 32 60\n"
                                    "gemm fp8_e5m2 1 32 32 50\ngemm fp8_e5m2 512 32 32 60\n";

static tpf_dtype comm_dtype(int kind, tpf_dtype dt) {
  return is_fp8(dt) && kKinds[kind].coll == TPF_COLL_RS ? TPF_BF16 : dt;
}

static tpf_status comm_new(conf_ctx *cx, int kind, tpf_dtype dt, tpf_comm **out) {
  const conf_kind *k = &kKinds[kind];
  char name[64];
  snprintf(name, sizeof name, "%s.%s", k->label, tpf_dtype_name(dt));
  tpf_comm_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.name = name;
  cfg.algo = k->algo;
  cfg.coll = k->coll;
  cfg.dtype = comm_dtype(kind, dt);
  cfg.capacity.rows = cx->run->C;
  cfg.capacity.cols = cx->run->H;
  cfg.num_splits = k->splits;
  cfg.aggregate = k->aggregate;
  if (g_adaptive) {
    cfg.plan = TPF_PLAN_ADAPTIVE;
    cfg.cost = &g_table;
  }
  return tpf_comm_create(cx->be, &cfg, out);
}

static void record(conf_ctx *cx, int kind, tpf_dtype dt, uint64_t T, const char *what,
                   const conf_verdict *v) {
  if (cx->rank == 0) cx->res->cases++;
  if (v->pass) return;
  cx->res->failed++;
  char line[CONF_MSG + 200];
  snprintf(line, sizeof line, "FAIL P=%d rank %d %s %s T=%llu%s: %s", cx->run->P, cx->rank,
           kKinds[kind].label, tpf_dtype_name(dt), (unsigned long long)T, what, v->why);
  if (cx->res->failed == 1) snprintf(cx->res->first, sizeof cx->res->first, "%s", line);
  if (cx->res->failed <= CONF_MAX_PRINTED) fprintf(stdout, "%s\n", line);
}

/* ---- API 0.2 options: every option on every operation ---- */

/* One combination of options. Splits are swept separately (opts_splits). */
typedef struct {
  const char *label;
  bool trans_a, trans_w, bias, gelu;
  float alpha, beta;
} conf_opt;

static const conf_opt kOpts[] = {
    {"trans_w", false, true, false, false, 1.0f, 0.0f},
    {"trans_a", true, false, false, false, 1.0f, 0.0f},
    {"wgrad-accumulate", true, true, false, false, 1.0f, 1.0f},
    {"alpha-beta", false, false, false, false, 0.5f, -0.75f},
    {"bias", false, false, true, false, 1.0f, 0.0f},
    {"bias-gelu", false, true, true, true, 1.0f, 0.0f},
    {"gelu-accumulate", true, false, false, true, 2.0f, 0.5f},
};
#define NOPTS ((int)(sizeof kOpts / sizeof kOpts[0]))

/* A [rows, cols] matrix stored as given or transposed ([cols, rows]) in backend memory, filled
 * from `seed`; logical gets the [rows, cols] host copy the reference multiplies. */
static tpf_status opt_operand(conf_ctx *cx, bool trans, uint64_t rows, uint64_t cols, tpf_dtype dt,
                              uint64_t seed, uint64_t pad, tpf_stage_mat *stored,
                              tpf_matrix *logical) {
  const uint64_t sr = trans ? cols : rows, sc = trans ? rows : cols;
  TPF_CHECK(mat_new(cx, stored, sr, sc, sc + pad, dt));
  tpf_ref_fill(&stored->host, seed, -1.0f, 1.0f);
  TPF_CHECK(tpf_stage_host_new(logical, rows, cols, dt));
  if (trans) {
    TPF_CHECK(tpf_ref_transpose(&stored->host, logical));
  } else {
    for (uint64_t i = 0; i < rows; i++)
      for (uint64_t j = 0; j < cols; j++)
        tpf_ref_set(logical, i, j, tpf_ref_get(&stored->host, i, j));
  }
  return mat_upload(cx, stored);
}

/* The logical [n, k] form of a weight whose op(w) = w^T (stored [n, k]) or w (stored [k, n]):
 * what tpf_ref_gemm_f32 multiplies as x * w^T. */
static tpf_status opt_weight(conf_ctx *cx, bool trans, uint64_t n, uint64_t k, tpf_dtype dt,
                             uint64_t seed, tpf_stage_mat *stored, tpf_matrix *nk) {
  /* trans_w: stored [k, n], and the [n, k] form is its transpose. */
  return opt_operand(cx, trans, n, k, dt, seed, 0, stored, nk);
}

/* Runs one options case on c at its active shape T. splits: 0, or the operation's split count.
 * expect: TPF_OK, or the status a refused split count must return (nothing may change). */
static tpf_status case_opts(conf_ctx *cx, tpf_comm *c, int kind, tpf_dtype dt, uint64_t T,
                            const conf_opt *o, int splits, tpf_status expect, conf_verdict *v) {
  conf_run *run = cx->run;
  const conf_kind *k = &kKinds[kind];
  const int P = run->P;
  const uint64_t R = T / (uint64_t)P;
  const bool ag = k->algo == TPF_ALGO_RING && k->coll == TPF_COLL_AG;
  const bool bulk = k->algo == TPF_ALGO_BULK;
  const bool trans_a = o->trans_a && !ag; /* ag_gemm's activation is the buffer */
  /* Logical GEMM dims: op(a) [M, Kd], op(w) [Kd, Nd]; the output has Mo rows (RS: this rank's). */
  const uint64_t M = T, Kd = ag ? run->H : run->K, Nd = (ag || bulk) ? run->N : run->H;
  const uint64_t Mo = (!ag && !bulk) ? R : T;
  const uint64_t seed_base =
      tpf_ref_mix(seed_of(cx, kind, dt, T, 77, 0), (uint64_t)(o - kOpts) * 131u + (uint64_t)splits);
  tpf_matrix x = {0}, al = {0}, wl = {0}, want = {0}, oldh = {0}, bufh = {0}, biash = {0};
  tpf_stage_mat a, w, d, bias;
  memset(&a, 0, sizeof a);
  memset(&w, 0, sizeof w);
  memset(&d, 0, sizeof d);
  memset(&bias, 0, sizeof bias);
  float *prod = NULL, *acc = NULL, *slack = NULL;
  tpf_status rc = TPF_OK;
  const tpf_dtype cd = comm_dtype(kind, dt); /* the buffer's (fp8 RS sites: bf16) */
  const tpf_dtype wd = w_dtype(dt, T, P);
  /* An fp8 GEMM's bias is in a 16-bit D (cuBLASLt has no fp32-D bias for fp8): a bias case of an
   * fp8 sweep writes bf16 where the T rotation would give fp32. */
  tpf_dtype od = out_dtype(ag || bulk ? dt : cd, T, P); /* an RS D is the buffer's or fp32 */
  if (is_fp8(dt) && o->bias && od == TPF_FP32) od = TPF_BF16;
  /* A backend whose fp8 GEMM is TN only must refuse a transposed fp8 operand, before anything
   * moves (the layout's refusal of a split count comes first: the core checks it). */
  if (expect == TPF_OK && is_fp8(dt) && run->fp8_tn_only && (trans_a || o->trans_w))
    expect = TPF_EUNSUPPORTED;
  fp8_opts f8;
  memset(&f8, 0, sizeof f8);

  TPF_CHECK_GOTO(fp8_opts_new(cx, dt, &f8), rc, out);
  if (ag) {
    TPF_CHECK_GOTO(tpf_stage_host_new(&x, T, run->H, cd), rc, out);
    tpf_ref_fill(&x, tpf_ref_mix(seed_base, 1), -1.0f, 1.0f);
    TPF_CHECK_GOTO(tpf_stage_put_local(run->env, cx->rank, c, &x), rc, out);
  } else {
    TPF_CHECK_GOTO(opt_operand(cx, trans_a, M, Kd, dt,
                               tpf_ref_mix(seed_base, 2 + (uint64_t)cx->rank),
                               pad_ld_dt(trans_a ? M : Kd, T, P, dt), &a, &al),
                   rc, out);
  }
  TPF_CHECK_GOTO(opt_weight(cx, o->trans_w, Nd, Kd, wd,
                            tpf_ref_mix(seed_base, 100 + (uint64_t)cx->rank), &w, &wl),
                 rc, out);
  TPF_CHECK_GOTO(mat_new(cx, &d, Mo, Nd, pad_ld_dt(Nd, T, P, dt), od), rc, out);
  if (o->beta != 0.0f) { /* D holds what the operation accumulates into */
    tpf_ref_fill(&d.host, tpf_ref_mix(seed_base, 200 + (uint64_t)cx->rank), -1.0f, 1.0f);
    TPF_CHECK_GOTO(mat_upload(cx, &d), rc, out);
    TPF_CHECK_GOTO(tpf_stage_host_new(&oldh, Mo, Nd, od), rc, out);
    for (uint64_t i = 0; i < Mo; i++)
      for (uint64_t j = 0; j < Nd; j++)
        tpf_ref_set(&oldh, i, j, tpf_ref_get(&d.host, i, j));
  }
  if (o->bias) {
    TPF_CHECK_GOTO(mat_new(cx, &bias, 1, Nd, Nd, od), rc, out);
    tpf_ref_fill(&bias.host, tpf_ref_mix(seed_base, 300), -1.0f, 1.0f); /* the same on every rank */
    TPF_CHECK_GOTO(mat_upload(cx, &bias), rc, out);
  }
  if (bulk && k->coll == TPF_COLL_AG) {
    TPF_CHECK_GOTO(tpf_stage_host_new(&x, T, run->H, cd), rc, out);
    tpf_ref_fill(&x, tpf_ref_mix(seed_base, 1), -1.0f, 1.0f);
    TPF_CHECK_GOTO(tpf_stage_put_local(run->env, cx->rank, c, &x), rc, out);
  }

  tpf_op_options opt = TPF_OP_OPTIONS_INIT;
  opt.trans_a = trans_a;
  opt.trans_w = o->trans_w;
  opt.alpha = o->alpha;
  opt.beta = o->beta;
  opt.bias = o->bias ? bias.dev.ptr : NULL;
  opt.gelu = o->gelu;
  opt.num_splits = splits;
  opt.a_scale_inv = f8.o.a_scale_inv; /* fp8: the per-tensor scales (NULL otherwise) */
  opt.w_scale_inv = f8.o.w_scale_inv;
  const uint64_t epoch = tpf_comm_epoch(c);
  tpf_status st;
  if (ag)
    st = tpf_ag_gemm_ex(c, &w.dev, &d.dev, &opt, cx->stream);
  else if (bulk)
    st = tpf_bulk_overlap_ex(c, &a.dev, &w.dev, &d.dev, &opt, cx->stream);
  else
    st = tpf_gemm_rs_ex(c, &a.dev, &w.dev, &d.dev, &opt, cx->stream);
  if (expect != TPF_OK) {
    if (st != expect)
      verdict_fail(v, "splits %d: got %s, expected the refusal %s (%s)", splits,
                   tpf_status_name(st), tpf_status_name(expect), tpf_last_error());
    if (tpf_comm_epoch(c) != epoch) verdict_fail(v, "a refused operation changed the epoch");
    goto out;
  }
  TPF_CHECK_GOTO(st, rc, out);
  TPF_CHECK_GOTO(run->env->sync(run->env, cx->rank, cx->be), rc, out);
  TPF_CHECK_GOTO(mat_download(cx, &d), rc, out);

  /* The reference: the fp32 product (RS: the sum over ranks of this rank's rows of every
   * rank's partial, each rounded to the buffer dtype as its slot stores it), then the
   * epilogue, rounded once. */
  prod = calloc((size_t)(Mo * Nd), sizeof(float));
  if (!prod) {
    rc = tpf_set_error(TPF_ENOMEM, "conformance: options reference");
    goto out;
  }
  /* own_order: the accumulation-order slack of the product, scaled as the epilogue scales it
   * (|alpha|, GELU's slope bound 1.2), as the RS slack below. */
  /* fp8: the GEMM's product is scaled by a_scale_inv * w_scale_inv (f8.scale, 1 otherwise)
   * before the epilogue, as a backend folds the scales into the GEMM. */
  const double oscale = fabs((double)o->alpha) * (o->gelu ? 1.2 : 1.0) * f8.scale;
  if (ag || bulk) {
    const tpf_matrix *lhs = ag ? &x : &al;
    TPF_CHECK_GOTO(tpf_ref_gemm_f32(lhs, &wl, prod), rc, out);
    for (uint64_t i = 0; i < Mo * Nd; i++)
      prod[i] *= f8.scale;
    TPF_CHECK_GOTO(tpf_ref_order_slack(lhs, &wl, oscale, run->own_order, &slack), rc, out);
  } else {
    acc = calloc((size_t)(Mo * Nd), sizeof(float));
    slack = calloc((size_t)(Mo * Nd), sizeof(float));
    if (!acc || !slack) {
      rc = tpf_set_error(TPF_ENOMEM, "conformance: options RS reference");
      goto out;
    }
    for (int q = 0; q < P; q++) {
      tpf_stage_mat aq, wq;
      tpf_matrix alq = {0}, wlq = {0};
      memset(&aq, 0, sizeof aq);
      memset(&wq, 0, sizeof wq);
      /* Rank q's operands, regenerated from its seeds (host only: the uploads are unused). */
      rc = opt_operand(cx, trans_a, M, Kd, dt, tpf_ref_mix(seed_base, 2 + (uint64_t)q),
                       pad_ld_dt(trans_a ? M : Kd, T, P, dt), &aq, &alq);
      if (rc == TPF_OK)
        rc = opt_weight(cx, o->trans_w, Nd, Kd, wd, tpf_ref_mix(seed_base, 100 + (uint64_t)q), &wq,
                        &wlq);
      if (rc == TPF_OK) {
        tpf_matrix mine = tpf_stage_rows(&alq, (uint64_t)cx->rank * R, R);
        rc = tpf_ref_gemm_f32(&mine, &wlq, prod);
      }
      /* Each partial is the scaled product rounded to the buffer dtype, as its slot stores it. */
      for (uint64_t i = 0; rc == TPF_OK && i < Mo * Nd; i++) {
        const float p = prod[i] * f8.scale;
        acc[i] += tpf_ref_round(cd, p);
        slack[i] += (float)tpf_ref_ulp(cd, p) * fabsf(o->alpha) * (o->gelu ? 1.2f : 1.0f);
      }
      if (rc == TPF_OK && run->own_order) {
        tpf_matrix mine = tpf_stage_rows(&alq, (uint64_t)cx->rank * R, R);
        rc = tpf_ref_order_slack_add(&mine, &wlq, oscale, slack);
      }
      mat_free(cx, &aq);
      mat_free(cx, &wq);
      free(alq.ptr);
      free(wlq.ptr);
      if (rc != TPF_OK) goto out;
    }
    memcpy(prod, acc, (size_t)(Mo * Nd) * sizeof(float));
  }
  TPF_CHECK_GOTO(tpf_stage_host_new(&want, Mo, Nd, od), rc, out);
  TPF_CHECK_GOTO(tpf_ref_epilogue(prod, o->alpha, o->beta, o->beta != 0.0f ? &oldh : NULL,
                                  o->bias ? bias.host.ptr : NULL, o->gelu, &want),
                 rc, out);
  if (o->gelu) {
    /* cuBLASLt's GELU epilogue evaluates tanh with a fast approximation: fp32 results may differ
     * from the reference's double-precision tanh by ~1e-4 relative, so a GELU case gets at least
     * rtol 1e-3 / atol 1e-4 (bf16/fp16 tolerances are already looser). */
    tpf_ref_tol tol = tpf_ref_tolerance_pair(dt, d.host.dtype);
    if (tol.rtol < 1e-3) tol.rtol = 1e-3;
    if (tol.atol < 1e-4) tol.atol = 1e-4;
    char why[TPF_REF_FORMAT_LEN + 100];
    if (!tol_check(&d.host, &want, slack, tol, "D = act(alpha op(a) op(w) + beta D + bias)", why,
                   sizeof why))
      verdict_fail(v, "%s", why);
  } else {
    check_close(v, "D = act(alpha op(a) op(w) + beta D + bias)", &d.host, &want, slack, dt);
  }
  if (ag) {
    TPF_CHECK_GOTO(get_buffer(cx, c, &bufh), rc, out);
    check_exact(v, "gathered buffer", &bufh, &x);
  }
out:
  fp8_opts_free(cx, &f8);
  free(prod);
  free(acc);
  free(slack);
  free(x.ptr);
  free(al.ptr);
  free(wl.ptr);
  free(want.ptr);
  free(oldh.ptr);
  free(bufh.ptr);
  free(biash.ptr);
  mat_free(cx, &a);
  mat_free(cx, &w);
  mat_free(cx, &d);
  mat_free(cx, &bias);
  return rc;
}

/* The split counts a RING/PIPELINE operation may name, legal or not for this T (the layout
 * decides; an illegal one must be refused with the layout's status and change nothing). */
static int split_candidates(const conf_kind *k, int P, int *out) {
  int n = 0;
  if (k->algo == TPF_ALGO_RING && k->coll == TPF_COLL_AG) {
    out[n++] = P;
    if (P > 2 && P % 2 == 0) out[n++] = P / 2;
    if (P > 1) out[n++] = 1;
    if (P > 2) out[n++] = P - 1; /* never legal for P > 2: must be refused */
  } else if (k->algo == TPF_ALGO_RING) {
    out[n++] = P;
    if (P > 1) out[n++] = 1; /* no overlap: all partials, then the exchange */
    if (P > 2) out[n++] = 2; /* never legal: refused */
  } else if (k->algo == TPF_ALGO_PIPELINE) {
    static const int s[] = {1, 2, 3, 4, 8, 16};
    for (size_t i = 0; i < sizeof s / sizeof s[0]; i++)
      out[n++] = s[i];
  }
  return n;
}

/* What an operation with `splits` must return at active rows T: TPF_OK when the layout accepts
 * it (with the strictest backend alignment, 16 bytes), else the layout's status. */
static tpf_status split_expect(conf_ctx *cx, const tpf_comm *c, int splits) {
  tpf_layout_desc d;
  memset(&d, 0, sizeof d);
  const tpf_comm_config *cfg = tpf_comm_config_of(c);
  d.tp_size = cx->run->P;
  d.rank = cx->rank;
  d.algo = cfg->algo;
  d.coll = cfg->coll;
  d.dtype = cfg->dtype;
  d.capacity = cfg->capacity;
  d.active = tpf_comm_active_shape(c);
  d.num_splits = splits;
  d.aggregate = cfg->algo == TPF_ALGO_RING && cfg->coll == TPF_COLL_AG && d.tp_size > 2 &&
                d.tp_size % 2 == 0 && splits == d.tp_size / 2;
  return tpf_layout_check(&d);
}

/* Every option combination and every split count on one communicator at a few T. */
static tpf_status options_one(conf_ctx *cx, int kind, tpf_dtype dt) {
  const uint64_t P = (uint64_t)cx->run->P, C = cx->run->C;
  const uint64_t Ts[] = {P, (C / P / 2 > 0 ? C / P / 2 : 1) * P, C};
  const conf_kind *k = &kKinds[kind];
  tpf_comm *c = NULL;
  TPF_CHECK(comm_new(cx, kind, dt, &c));
  tpf_status rc = TPF_OK;
  for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0] && rc == TPF_OK; ti++) {
    const uint64_t T = Ts[ti];
    tpf_shape s = {T, cx->run->H};
    rc = tpf_comm_set_active_shape(c, s);
    for (int oi = 0; oi < NOPTS && rc == TPF_OK; oi++) {
      conf_verdict v = {true, ""};
      rc = case_opts(cx, c, kind, dt, T, &kOpts[oi], 0, TPF_OK, &v);
      char what[64];
      snprintf(what, sizeof what, " options %s", kOpts[oi].label);
      if (rc == TPF_OK) record(cx, kind, dt, T, what, &v);
    }
    int splits[8];
    const int ns = k->algo == TPF_ALGO_BULK ? 0 : split_candidates(k, cx->run->P, splits);
    for (int si = 0; si < ns && rc == TPF_OK; si++) {
      /* Each split count with a rotating option combination, so splits meet options too. */
      const conf_opt *o = &kOpts[(si + ti) % NOPTS];
      conf_verdict v = {true, ""};
      rc = case_opts(cx, c, kind, dt, T, o, splits[si], split_expect(cx, c, splits[si]), &v);
      char what[64];
      snprintf(what, sizeof what, " num_splits %d with %s", splits[si], o->label);
      if (rc == TPF_OK) record(cx, kind, dt, T, what, &v);
    }
  }
  tpf_status rc2 = tpf_comm_destroy(c);
  return rc != TPF_OK ? rc : rc2;
}

/* The main sweep for one (kind, dtype): one communicator, every T ascending. */
static tpf_status sweep_one(conf_ctx *cx, int kind, tpf_dtype dt) {
  tpf_comm *c = NULL;
  TPF_CHECK(comm_new(cx, kind, dt, &c));
  tpf_status rc = TPF_OK;
  for (uint64_t T = (uint64_t)cx->run->P; T <= cx->run->C; T += (uint64_t)cx->run->P) {
    conf_verdict v = {true, ""};
    rc = run_case(cx, c, kind, dt, T, &v, NULL);
    if (rc != TPF_OK) break;
    record(cx, kind, dt, T, "", &v);
  }
  tpf_status rc2 = tpf_comm_destroy(c);
  return rc != TPF_OK ? rc : rc2;
}

/* A shape history on one communicator versus a fresh communicator per step. */
static tpf_status history_one(conf_ctx *cx, int kind, tpf_dtype dt) {
  const uint64_t P = (uint64_t)cx->run->P, C = cx->run->C, u = C / P; /* units of P rows */
  /* capacity, shrink, grow, shrink, repeat, grow, back to capacity */
  uint64_t units[] = {u, (u + 1) / 2, u > 1 ? u - 1 : 1, 1, 1, u > 2 ? 3 : u, u};
  tpf_comm *hist = NULL;
  TPF_CHECK(comm_new(cx, kind, dt, &hist));
  tpf_status rc = TPF_OK;
  for (size_t i = 0; i < sizeof units / sizeof units[0] && rc == TPF_OK; i++) {
    uint64_t T = units[i] * P;
    conf_sig sh = {0}, sf = {0};
    conf_verdict v = {true, ""};
    rc = run_case(cx, hist, kind, dt, T, &v, &sh);
    tpf_comm *fresh = NULL;
    if (rc == TPF_OK) rc = comm_new(cx, kind, dt, &fresh);
    if (rc == TPF_OK) {
      conf_verdict vf = {true, ""};
      rc = run_case(cx, fresh, kind, dt, T, &vf, &sf);
      tpf_status rd = tpf_comm_destroy(fresh);
      if (rc == TPF_OK) rc = rd;
      if (!vf.pass) verdict_fail(&v, "fresh communicator: %s", vf.why);
    }
    if (rc == TPF_OK) {
      if (sh.len != sf.len || memcmp(sh.bytes, sf.bytes, sh.len) != 0) {
        size_t at = 0;
        while (at < sh.len && at < sf.len && sh.bytes[at] == sf.bytes[at])
          at++;
        verdict_fail(&v,
                     "result after history step %zu differs from a fresh communicator's at "
                     "result byte %zu of %zu",
                     i, at, sh.len);
      }
      char what[48];
      snprintf(what, sizeof what, " (history step %zu)", i);
      record(cx, kind, dt, T, what, &v);
    }
    free(sh.bytes);
    free(sf.bytes);
  }
  tpf_status rc2 = tpf_comm_destroy(hist);
  return rc != TPF_OK ? rc : rc2;
}

static tpf_status rank_main(tpf_backend *be, int rank, void *arg) {
  conf_run *run = arg;
  conf_ctx cx = {run, be, rank, run->env->stream(run->env, rank), &run->rk[rank]};
  for (int kind = 0; kind < NKINDS; kind++) {
    if (!kind_runs(&kKinds[kind], run->P) || (run->only_kind >= 0 && kind != run->only_kind))
      continue;
    for (int di = 0; di < NDTYPES; di++) {
      TPF_CHECK(sweep_one(&cx, kind, kDtypes[di]));
      if (run->histories) TPF_CHECK(history_one(&cx, kind, kDtypes[di]));
      if (run->options) TPF_CHECK(options_one(&cx, kind, kDtypes[di]));
    }
  }
  return TPF_OK;
}

static void usage(const char *env) {
  printf("conformance[%s] options: --quick (capacity 4P instead of 16P), --tp N (only P = N), "
         "--kind NAME (one variant), --seed N, --no-history, --no-options (skip the per-operation "
         "options sweep), --adaptive (TPF_PLAN_ADAPTIVE), --self-test (one element of every "
         "checked result is moved out of tolerance: every check must catch it)\n",
         env);
}

int tpf_conformance_main(tpf_conf_env *env, bool own_order, int argc, char **argv) {
  static const int kPs[] = {1, 2, 3, 4, 5, 6, 8};
  bool quick = false, histories = true, options = true;
  int only_tp = 0, only_kind = -1;
  uint64_t seed = 42;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--quick")) {
      quick = true;
    } else if (!strcmp(argv[i], "--adaptive")) {
      if (tpf_cost_table_parse(kAdaptiveTable, &g_table) != TPF_OK) {
        fprintf(stderr, "conformance: adaptive table: %s\n", tpf_last_error());
        return 2;
      }
      g_adaptive = true;
    } else if (!strcmp(argv[i], "--self-test")) {
      g_self_test = true;
    } else if (!strcmp(argv[i], "--no-history")) {
      histories = false;
    } else if (!strcmp(argv[i], "--no-options")) {
      options = false;
    } else if (!strcmp(argv[i], "--tp") && i + 1 < argc) {
      only_tp = atoi(argv[++i]);
    } else if (!strcmp(argv[i], "--seed") && i + 1 < argc) {
      seed = strtoull(argv[++i], NULL, 0);
    } else if (!strcmp(argv[i], "--kind") && i + 1 < argc) {
      const char *n = argv[++i];
      for (int k = 0; k < NKINDS; k++)
        if (!strcmp(n, kKinds[k].label)) only_kind = k;
      if (only_kind < 0) {
        fprintf(stderr, "unknown --kind %s\n", n);
        return 2;
      }
    } else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      usage(env->name);
      return 0;
    } else {
      fprintf(stderr, "conformance: unknown argument %s\n", argv[i]);
      usage(env->name);
      return 2;
    }
  }

  printf("conformance[%s]: P in {1,2,3,4,5,6,8} (up to %d), capacity %s, H 32, %d variants x "
         "bf16/fp16/fp32/fp8_e4m3/fp8_e5m2, every T multiple of P%s\n",
         env->name, env->max_ranks, quick ? "4P" : "16P", NKINDS,
         histories ? ", shape histories vs fresh communicators" : "");
  if (options)
    printf("conformance[%s]: per-operation options: %d combinations (transposes, alpha/beta "
           "accumulation, bias, GELU) and every split count at 3 T per variant\n",
           env->name, NOPTS);
  if (g_adaptive)
    printf("conformance[%s]: adaptive planning on (synthetic cost table)\n", env->name);
  printf("conformance[%s]: %s\n", env->name,
         own_order ? "the backend sums over k in its own order: GEMM results get SPEC §7's fp32 "
                     "accumulation-order slack gamma_K sum_k |a_ik b_jk|"
                   : "the backend sums over k in the reference's order: no accumulation-order "
                     "slack");
  fflush(stdout);
  double t_all = now_s();
  uint64_t cases = 0, failed = 0, run_errors = 0;
  for (size_t pi = 0; pi < sizeof kPs / sizeof kPs[0]; pi++) {
    int P = kPs[pi];
    if (P > env->max_ranks || (only_tp && P != only_tp)) continue;
    conf_run *run = calloc(1, sizeof *run);
    if (!run) {
      fprintf(stderr, "conformance: out of memory\n");
      return 1;
    }
    run->env = env;
    run->P = P;
    run->C = (uint64_t)P * (quick ? 4u : 16u);
    run->H = 32;
    run->K = 16;
    run->N = 24;
    run->histories = histories;
    run->options = options;
    run->own_order = own_order;
    run->fp8_tn_only = env->fp8_tn_only;
    run->only_kind = only_kind;
    run->seed = seed;
    double t0 = now_s();
    tpf_status st = env->run(env, P, rank_main, run);
    double dt = now_s() - t0;
    uint64_t pf = 0;
    for (int r = 0; r < P; r++)
      pf += run->rk[r].failed;
    printf("  P=%d: %llu cases, %llu failed checks, %.2f s%s%s\n", P,
           (unsigned long long)run->rk[0].cases, (unsigned long long)pf, dt,
           st != TPF_OK ? ", run error: " : "", st != TPF_OK ? tpf_status_name(st) : "");
    if (st != TPF_OK) {
      printf("    %s\n", tpf_last_error());
      run_errors++;
    }
    fflush(stdout);
    cases += run->rk[0].cases;
    failed += pf;
    free(run);
  }
  double total = now_s() - t_all;
  if (g_self_test) {
    const unsigned long long n = atomic_load(&g_self_checks), m = atomic_load(&g_self_missed);
    const bool ok = n > 0 && m == 0 && run_errors == 0;
    printf("conformance[%s] self-test: %llu tolerance checks, each given one element out of "
           "tolerance (%llu of them where a max-abs-diff verdict would pass); %llu caught, %llu "
           "missed, %llu run errors: %s\n",
           env->name, n, (unsigned long long)atomic_load(&g_self_maxdiff_blind), n - m, m,
           (unsigned long long)run_errors, ok ? "every wrong element caught" : "FAILED");
    return ok ? 0 : 1;
  }
  printf("conformance[%s]: %llu cases, %llu failed checks, %llu run errors, wall %.2f s: %s\n",
         env->name, (unsigned long long)cases, (unsigned long long)failed,
         (unsigned long long)run_errors, total, (failed || run_errors) ? "FAILED" : "PASSED");
  return (failed || run_errors) ? 1 : 0;
}
