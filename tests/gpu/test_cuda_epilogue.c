/* GPU test of the 0.2 operation options on the CUDA backend, ranks as threads on one GPU:
 * transposes (trans_a, trans_w), alpha, beta, bias and GELU on every path that writes D: the
 * cuBLASLt GEMM (BULK, RING AG: CUBLASLT_MATMUL_DESC_TRANSA/B, the BIAS / GELU / GELU_BIAS
 * epilogues, C = D), the reduction kernels (RING RS, PIPELINE RS: bias from the block's column),
 * and the plain fallback kernel (run with TPF_CUDA_GEMM_FALLBACK=1, as the CTest
 * test_cuda_epilogue_fallback does). Every result is compared with a host reference written from
 * the definition in tpflex.h; odd shapes and a bias that is not 16-byte aligned are included. A
 * plain operation on a shape that then ran with epilogues gives the same bytes again (the plan
 * cache keys on flags and epilogue). P = 1 and 2. Exit 77 ("skipped: no GPU") without a device. */
#define _POSIX_C_SOURCE 200809L
#include "reference.h"
#include "tpflex/tpflex_backend.h"
#include "tpflex/tpflex_cuda.h"

#include <cuda_runtime.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MAXP = 2, ROWS_PER_RANK = 16, H = 64, AG_N = 40, RS_K = 48 };

typedef struct {
  tpf_cuda_threads *group;
  int P, rank;
  bool fallback_mode;
  int cases, failures;
  char log[16384];
} job;

static void say(job *j, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(job *j, const char *fmt, ...) {
  size_t n = strlen(j->log);
  if (n + 1 >= sizeof j->log) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(j->log + n, sizeof j->log - n, fmt, ap);
  va_end(ap);
}

/* An API or CUDA failure: stop this rank (its peers then time out). */
#define REQUIRE(cond, ...)                                                                         \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      say(j, "  rank %d: FAIL line %d: ", j->rank, __LINE__);                                      \
      say(j, __VA_ARGS__);                                                                         \
      say(j, " (%s)\n", tpf_last_error());                                                         \
      j->failures++;                                                                               \
      return -1;                                                                                   \
    }                                                                                              \
  } while (0)

/* ---- options and the host reference ---- */

typedef struct {
  const char *name;
  float alpha, beta;
  bool bias, gelu;
} opt_case;

static const opt_case kOpts[] = {
    {"plain", 1.0f, 0.0f, false, false}, {"alpha", 0.5f, 0.0f, false, false},
    {"beta", 1.0f, 0.75f, false, false}, {"bias", 1.0f, 0.0f, true, false},
    {"gelu", 1.0f, 0.0f, false, true},   {"all", -1.5f, 1.25f, true, true},
};
#define NOPTS ((int)(sizeof kOpts / sizeof kOpts[0]))

static float ref_gelu(float x) {
  const float u = 0.7978845608f * (x + 0.044715f * x * x * x);
  return 0.5f * x * (1.0f + tanhf(u));
}

static float ref_epi(const opt_case *o, float v, float old, float bias) {
  float x = o->alpha * v;
  if (o->beta != 0.0f) x += o->beta * old;
  if (o->bias) x += bias;
  return o->gelu ? ref_gelu(x) : x;
}

/* op(a)(i, p) for a [M, K] or, with ta, stored [K, M]; op(w)(j, p) for w [N, K] or stored [K, N].
 */
static float opa(const tpf_matrix *a, bool ta, uint64_t i, uint64_t p) {
  return ta ? tpf_ref_get(a, p, i) : tpf_ref_get(a, i, p);
}

static tpf_op_options options_of(const opt_case *o, bool ta, bool tw, const void *bias) {
  tpf_op_options opt = TPF_OP_OPTIONS_INIT;
  opt.trans_a = ta;
  opt.trans_w = tw;
  opt.alpha = o->alpha;
  opt.beta = o->beta;
  opt.bias = o->bias ? bias : NULL;
  opt.gelu = o->gelu;
  return opt;
}

/* ---- matrices with a host and a device copy ---- */

typedef struct {
  tpf_matrix h, d;
} mat2;

static size_t mat_bytes(const tpf_matrix *m) {
  return (size_t)(m->rows * m->ld) * tpf_dtype_size(m->dtype);
}

static int mat_new(job *j, mat2 *m, uint64_t rows, uint64_t cols, tpf_dtype dt, uint64_t seed) {
  memset(m, 0, sizeof *m);
  m->h = (tpf_matrix){calloc(rows * cols, tpf_dtype_size(dt)), rows, cols, cols, dt};
  REQUIRE(m->h.ptr != NULL, "host matrix");
  tpf_ref_fill(&m->h, seed, -1.0f, 1.0f);
  m->d = m->h;
  m->d.ptr = NULL;
  REQUIRE(cudaMalloc(&m->d.ptr, mat_bytes(&m->h)) == cudaSuccess, "cudaMalloc");
  REQUIRE(cudaMemcpy(m->d.ptr, m->h.ptr, mat_bytes(&m->h), cudaMemcpyHostToDevice) == cudaSuccess,
          "upload");
  return 0;
}

/* The stored transpose of a host matrix, uploaded. */
static int mat_transposed(job *j, mat2 *t, const mat2 *m) {
  if (mat_new(j, t, m->h.cols, m->h.rows, m->h.dtype, 1) != 0) return -1;
  for (uint64_t i = 0; i < m->h.rows; i++)
    for (uint64_t c = 0; c < m->h.cols; c++)
      tpf_ref_set(&t->h, c, i, tpf_ref_get(&m->h, i, c));
  REQUIRE(cudaMemcpy(t->d.ptr, t->h.ptr, mat_bytes(&t->h), cudaMemcpyHostToDevice) == cudaSuccess,
          "upload");
  return 0;
}

static int mat_upload(job *j, const mat2 *m) {
  REQUIRE(cudaMemcpy(m->d.ptr, m->h.ptr, mat_bytes(&m->h), cudaMemcpyHostToDevice) == cudaSuccess,
          "upload");
  return 0;
}

static int mat_download(job *j, tpf_matrix *host, const mat2 *m) {
  REQUIRE(cudaMemcpy(host->ptr, m->d.ptr, mat_bytes(&m->h), cudaMemcpyDeviceToHost) == cudaSuccess,
          "download");
  return 0;
}

static void mat_free(mat2 *m) {
  free(m->h.ptr);
  if (m->d.ptr) cudaFree(m->d.ptr);
  memset(m, 0, sizeof *m);
}

/* Compares got (D's dtype) with want (fp32); GELU through cuBLASLt may use a faster tanh than
 * the host's, so fp32 results with GELU get 1e-3. Returns 1 on a wrong result. */
static int check_slack(job *j, const tpf_matrix *got, const tpf_matrix *want, const float *slack,
                       const opt_case *o, const char *what) {
  tpf_ref_tol tol = tpf_ref_tolerance_pair(got->dtype, got->dtype);
  if (o->gelu && tol.rtol < 1e-3) tol = (tpf_ref_tol){1e-3, 1e-4};
  tpf_ref_result res;
  j->cases++;
  tpf_status st = slack ? tpf_ref_compare_slack(got, want, slack, tol, &res)
                        : tpf_ref_compare(got, want, tol, &res);
  if (st != TPF_OK || !res.pass) {
    char buf[256];
    tpf_ref_format(&res, buf, sizeof buf);
    say(j, "  rank %d: FAIL %s: %s\n", j->rank, what, buf);
    j->failures++;
    return 1;
  }
  return 0;
}

static int check(job *j, const tpf_matrix *got, const tpf_matrix *want, const opt_case *o,
                 const char *what) {
  return check_slack(j, got, want, NULL, o, what);
}

/* ---- BULK: d = op(a) op(b) beside the collective, every dtype pair, two shapes ---- */

static int bulk_shape(job *j, tpf_comm *c, cudaStream_t s, tpf_dtype in, tpf_dtype out, uint64_t M,
                      uint64_t N, uint64_t K, int shape) {
  const uint64_t seed =
      ((uint64_t)j->rank << 32) ^ ((uint64_t)in << 24) ^ ((uint64_t)out << 16) ^ (uint64_t)shape;
  mat2 a, at, b, bt, d, bias;
  memset(&a, 0, sizeof a);
  memset(&at, 0, sizeof at);
  memset(&b, 0, sizeof b);
  memset(&bt, 0, sizeof bt);
  memset(&d, 0, sizeof d);
  memset(&bias, 0, sizeof bias);
  int rc = -1;
  if (mat_new(j, &a, M, K, in, seed ^ 1) || mat_new(j, &b, N, K, in, seed ^ 2) ||
      mat_new(j, &d, M, N, out, seed ^ 3) || mat_new(j, &bias, 1, N + 1, out, seed ^ 4) ||
      mat_transposed(j, &at, &a) || mat_transposed(j, &bt, &b))
    goto done;
  tpf_matrix old = d.h, got = d.h, want = {calloc(M * N, sizeof(float)), M, N, N, TPF_FP32};
  old.ptr = malloc(mat_bytes(&d.h));
  got.ptr = malloc(mat_bytes(&d.h));
  void *plain0 = malloc(mat_bytes(&d.h));
  if (!old.ptr || !got.ptr || !want.ptr || !plain0) goto free_host;
  memcpy(old.ptr, d.h.ptr, mat_bytes(&d.h));
  /* The odd shape takes its bias one element in: a pointer that is not 16-byte aligned. */
  const uint64_t b0 = shape == 1 ? 1 : 0;
  const void *dbias = (const char *)bias.d.ptr + b0 * tpf_dtype_size(out);
  /* Plain first: its bytes must come back after the epilogue variants of the same shape. */
  if (tpf_bulk_overlap(c, &a.d, &b.d, &d.d, s) != TPF_OK ||
      cudaStreamSynchronize(s) != cudaSuccess) {
    say(j, "  rank %d: FAIL bulk plain: %s\n", j->rank, tpf_last_error());
    j->failures++;
    goto free_host;
  }
  {
    tpf_matrix p0 = d.h;
    p0.ptr = plain0;
    if (mat_download(j, &p0, &d)) goto free_host;
  }
  for (int ta = 0; ta < 2; ta++)
    for (int tw = 0; tw < 2; tw++)
      for (int oi = 0; oi < NOPTS; oi++) {
        const opt_case *o = &kOpts[oi];
        const mat2 *A = ta ? &at : &a, *B = tw ? &bt : &b;
        if (mat_upload(j, &d)) goto free_host; /* D_old */
        tpf_op_options opt = options_of(o, ta, tw, dbias);
        tpf_status st = tpf_bulk_overlap_ex(c, &A->d, &B->d, &d.d, &opt, s);
        if (st != TPF_OK || cudaStreamSynchronize(s) != cudaSuccess) {
          say(j, "  rank %d: FAIL bulk %s ta %d tw %d: %s\n", j->rank, o->name, ta, tw,
              tpf_last_error());
          j->failures++;
          goto free_host;
        }
        if (mat_download(j, &got, &d)) goto free_host;
        for (uint64_t i = 0; i < M; i++)
          for (uint64_t q = 0; q < N; q++) {
            float acc = 0.0f;
            for (uint64_t p = 0; p < K; p++)
              acc +=
                  opa(&A->h, ta, i, p) * (tw ? tpf_ref_get(&B->h, p, q) : tpf_ref_get(&B->h, q, p));
            tpf_ref_set(&want, i, q,
                        ref_epi(o, acc, tpf_ref_get(&old, i, q), tpf_ref_get(&bias.h, 0, b0 + q)));
          }
        char what[128];
        snprintf(what, sizeof what, "bulk %s->%s [%llu,%llu,%llu] %s ta %d tw %d",
                 tpf_dtype_name(in), tpf_dtype_name(out), (unsigned long long)M,
                 (unsigned long long)N, (unsigned long long)K, o->name, ta, tw);
        check(j, &got, &want, o, what);
      }
  /* Plain again: the same bytes as before the epilogue variants. */
  if (tpf_bulk_overlap(c, &a.d, &b.d, &d.d, s) != TPF_OK ||
      cudaStreamSynchronize(s) != cudaSuccess || mat_download(j, &got, &d)) {
    say(j, "  rank %d: FAIL bulk plain again: %s\n", j->rank, tpf_last_error());
    j->failures++;
    goto free_host;
  }
  j->cases++;
  if (memcmp(got.ptr, plain0, mat_bytes(&d.h)) != 0) {
    say(j, "  rank %d: FAIL bulk %s->%s shape %d: a plain GEMM after epilogue variants differs\n",
        j->rank, tpf_dtype_name(in), tpf_dtype_name(out), shape);
    j->failures++;
  }
  rc = 0;
free_host:
  free(old.ptr);
  free(got.ptr);
  free(want.ptr);
  free(plain0);
done:
  mat_free(&a);
  mat_free(&at);
  mat_free(&b);
  mat_free(&bt);
  mat_free(&d);
  mat_free(&bias);
  return rc;
}

static int run_bulk(job *j, tpf_backend *be, cudaStream_t s) {
  tpf_comm_config cfg = TPF_COMM_CONFIG_INIT;
  cfg.name = "bulk_epilogue";
  cfg.algo = TPF_ALGO_BULK;
  cfg.coll = TPF_COLL_AG;
  cfg.dtype = TPF_BF16;
  cfg.capacity = (tpf_shape){(uint64_t)j->P * ROWS_PER_RANK, H};
  tpf_comm *c = NULL;
  REQUIRE(tpf_comm_create(be, &cfg, &c) == TPF_OK, "bulk create");
  static const tpf_dtype pairs[][2] = {
      {TPF_BF16, TPF_BF16}, {TPF_BF16, TPF_FP32}, {TPF_FP16, TPF_FP16}, {TPF_FP32, TPF_FP32}};
  static const uint64_t shapes[][3] = {{40, 48, 56}, {37, 41, 23}};
  int rc = 0;
  for (size_t p = 0; p < sizeof pairs / sizeof pairs[0] && rc == 0; p++)
    for (int sh = 0; sh < 2 && rc == 0; sh++)
      rc = bulk_shape(j, c, s, pairs[p][0], pairs[p][1], shapes[sh][0], shapes[sh][1],
                      shapes[sh][2], sh);
  tpf_comm_destroy(c);
  return rc;
}

/* ---- RING AG: d = AG(X) op(w), trans_w and every epilogue, bf16 and fp32 outputs ---- */

static int run_ring_ag(job *j, tpf_backend *be, cudaStream_t s) {
  const int P = j->P, r = j->rank;
  const uint64_t T = (uint64_t)P * ROWS_PER_RANK, R = ROWS_PER_RANK;
  tpf_comm_config cfg = TPF_COMM_CONFIG_INIT;
  cfg.name = "ag_epilogue";
  cfg.algo = TPF_ALGO_RING;
  cfg.coll = TPF_COLL_AG;
  cfg.dtype = TPF_BF16;
  cfg.capacity = (tpf_shape){T, H};
  tpf_comm *c = NULL;
  REQUIRE(tpf_comm_create(be, &cfg, &c) == TPF_OK, "ring ag create");
  int rc = -1;
  tpf_matrix X = {calloc(T * H, 2), T, H, H, TPF_BF16};
  mat2 w, wt, d, bias;
  memset(&w, 0, sizeof w);
  memset(&wt, 0, sizeof wt);
  memset(&d, 0, sizeof d);
  memset(&bias, 0, sizeof bias);
  tpf_matrix got = {0}, old = {0},
             want = {calloc(T * AG_N, sizeof(float)), T, AG_N, AG_N, TPF_FP32};
  if (!X.ptr || !want.ptr) goto out;
  for (int q = 0; q < P; q++) {
    tpf_matrix v = X;
    v.ptr = (char *)X.ptr + (uint64_t)q * R * H * 2;
    v.rows = R;
    tpf_ref_fill(&v, 0xA6000ull + (uint64_t)q, -1.0f, 1.0f);
  }
  if (mat_new(j, &w, AG_N, H, TPF_BF16, 0xA6100ull + (uint64_t)r) || mat_transposed(j, &wt, &w))
    goto out;
  tpf_matrix local;
  if (tpf_comm_local_chunk(c, &local) != TPF_OK) goto out;
  static const tpf_dtype outs[] = {TPF_BF16, TPF_FP32};
  for (int oi_d = 0; oi_d < 2; oi_d++) {
    const tpf_dtype out = outs[oi_d];
    mat_free(&d);
    mat_free(&bias);
    free(got.ptr);
    free(old.ptr);
    got.ptr = old.ptr = NULL;
    if (mat_new(j, &d, T, AG_N, out, 0xA6200ull + (uint64_t)r * 8 + (uint64_t)oi_d) ||
        mat_new(j, &bias, 1, AG_N, out, 0xA6300ull + (uint64_t)oi_d))
      goto out;
    got = d.h;
    old = d.h;
    got.ptr = malloc(mat_bytes(&d.h));
    old.ptr = malloc(mat_bytes(&d.h));
    if (!got.ptr || !old.ptr) goto out;
    memcpy(old.ptr, d.h.ptr, mat_bytes(&d.h));
    for (int tw = 0; tw < 2; tw++)
      for (int oi = 0; oi < NOPTS; oi++) {
        const opt_case *o = &kOpts[oi];
        const mat2 *W = tw ? &wt : &w;
        if (cudaMemcpy(local.ptr, (char *)X.ptr + (uint64_t)r * R * H * 2, R * H * 2,
                       cudaMemcpyHostToDevice) != cudaSuccess ||
            mat_upload(j, &d))
          goto out;
        tpf_op_options opt = options_of(o, false, tw, bias.d.ptr);
        tpf_status st = tpf_ag_gemm_ex(c, &W->d, &d.d, &opt, s);
        if (st != TPF_OK || cudaStreamSynchronize(s) != cudaSuccess) {
          say(j, "  rank %d: FAIL ring ag %s tw %d: %s\n", r, o->name, tw, tpf_last_error());
          j->failures++;
          goto out;
        }
        if (mat_download(j, &got, &d)) goto out;
        for (uint64_t i = 0; i < T; i++)
          for (uint64_t q = 0; q < AG_N; q++) {
            float acc = 0.0f;
            for (uint64_t p = 0; p < H; p++)
              acc += tpf_ref_get(&X, i, p) *
                     (tw ? tpf_ref_get(&W->h, p, q) : tpf_ref_get(&W->h, q, p));
            tpf_ref_set(&want, i, q,
                        ref_epi(o, acc, tpf_ref_get(&old, i, q), tpf_ref_get(&bias.h, 0, q)));
          }
        char what[96];
        snprintf(what, sizeof what, "ring ag ->%s %s tw %d", tpf_dtype_name(out), o->name, tw);
        check(j, &got, &want, o, what);
      }
  }
  rc = 0;
out:
  if (rc != 0 && j->failures == 0) {
    say(j, "  rank %d: FAIL ring ag setup: %s\n", r, tpf_last_error());
    j->failures++;
  }
  free(X.ptr);
  free(want.ptr);
  free(got.ptr);
  free(old.ptr);
  mat_free(&w);
  mat_free(&wt);
  mat_free(&d);
  mat_free(&bias);
  tpf_comm_destroy(c);
  return rc;
}

/* ---- RS (RING, PIPELINE): out = epi(alpha sum_q op(x_q) op(w_q), out, bias), fp32 ---- */

static int run_rs(job *j, tpf_backend *be, cudaStream_t s, tpf_algo algo) {
  const int P = j->P, r = j->rank;
  const uint64_t T = (uint64_t)P * ROWS_PER_RANK, R = ROWS_PER_RANK;
  tpf_comm_config cfg = TPF_COMM_CONFIG_INIT;
  cfg.name = algo == TPF_ALGO_RING ? "ring_rs_epilogue" : "pipeline_rs_epilogue";
  cfg.algo = algo;
  cfg.coll = TPF_COLL_RS;
  cfg.dtype = TPF_FP32;
  cfg.capacity = (tpf_shape){T, H};
  tpf_comm *c = NULL;
  REQUIRE(tpf_comm_create(be, &cfg, &c) == TPF_OK, "rs create");
  int rc = -1;
  mat2 x[MAXP], xt[MAXP], w[MAXP], wt[MAXP], out, bias;
  memset(x, 0, sizeof x);
  memset(xt, 0, sizeof xt);
  memset(w, 0, sizeof w);
  memset(wt, 0, sizeof wt);
  memset(&out, 0, sizeof out);
  memset(&bias, 0, sizeof bias);
  tpf_matrix got = {0}, old = {0}, want = {calloc(R * H, sizeof(float)), R, H, H, TPF_FP32};
  /* SPEC §7 for a CUDA reduce-scatter of fp32 partials: one ulp per partial plus the
   * accumulation-order slack gamma_K sum_k |x w| of each (cuBLASLt sums k in its own order),
   * times what the epilogue multiplies the sum by (|alpha|, GELU's slope bound 1.2). */
  float *slack = calloc(R * H, sizeof(float));
  const double gamma = tpf_ref_gamma(RS_K);
  /* Every rank's inputs (device copies too: simplest), regenerated from seeds. */
  for (int q = 0; q < P; q++)
    if (mat_new(j, &x[q], T, RS_K, TPF_FP32, 0xB5000ull + (uint64_t)q) ||
        mat_new(j, &w[q], H, RS_K, TPF_FP32, 0xB5100ull + (uint64_t)q) ||
        mat_transposed(j, &xt[q], &x[q]) || mat_transposed(j, &wt[q], &w[q]))
      goto out;
  if (mat_new(j, &out, R, H, TPF_FP32, 0xB5200ull + (uint64_t)r) ||
      mat_new(j, &bias, 1, H, TPF_FP32, 0xB5300ull))
    goto out;
  got = out.h;
  old = out.h;
  got.ptr = malloc(mat_bytes(&out.h));
  old.ptr = malloc(mat_bytes(&out.h));
  if (!got.ptr || !old.ptr || !want.ptr || !slack) goto out;
  memcpy(old.ptr, out.h.ptr, mat_bytes(&out.h));
  for (int ta = 0; ta < 2; ta++)
    for (int tw = 0; tw < 2; tw++)
      for (int oi = 0; oi < NOPTS; oi++) {
        const opt_case *o = &kOpts[oi];
        if (mat_upload(j, &out)) goto out;
        tpf_op_options opt = options_of(o, ta, tw, bias.d.ptr);
        tpf_status st =
            tpf_gemm_rs_ex(c, ta ? &xt[r].d : &x[r].d, tw ? &wt[r].d : &w[r].d, &out.d, &opt, s);
        if (st != TPF_OK || cudaStreamSynchronize(s) != cudaSuccess) {
          say(j, "  rank %d: FAIL %s %s ta %d tw %d: %s\n", r, cfg.name, o->name, ta, tw,
              tpf_last_error());
          j->failures++;
          goto out;
        }
        if (mat_download(j, &got, &out)) goto out;
        for (uint64_t i = 0; i < R; i++)
          for (uint64_t q = 0; q < H; q++) {
            float sum = 0.0f;
            double sl = 0.0;
            for (int k = 0; k < P; k++) {
              float acc = 0.0f; /* the partial, fp32 as the buffer */
              double bound = 0.0;
              for (uint64_t p = 0; p < RS_K; p++) {
                const float prod =
                    tpf_ref_get(&x[k].h, (uint64_t)r * R + i, p) * tpf_ref_get(&w[k].h, q, p);
                acc += prod;
                bound += fabs((double)prod);
              }
              sum += acc;
              sl += tpf_ref_ulp(TPF_FP32, acc) + gamma * bound;
            }
            slack[i * H + q] = (float)(sl * fabs((double)o->alpha) * (o->gelu ? 1.2 : 1.0));
            tpf_ref_set(&want, i, q,
                        ref_epi(o, sum, tpf_ref_get(&old, i, q), tpf_ref_get(&bias.h, 0, q)));
          }
        char what[96];
        snprintf(what, sizeof what, "%s %s ta %d tw %d", cfg.name, o->name, ta, tw);
        check_slack(j, &got, &want, slack, o, what);
      }
  rc = 0;
out:
  if (rc != 0 && j->failures == 0) {
    say(j, "  rank %d: FAIL %s setup: %s\n", r, cfg.name, tpf_last_error());
    j->failures++;
  }
  for (int q = 0; q < MAXP; q++) {
    mat_free(&x[q]);
    mat_free(&xt[q]);
    mat_free(&w[q]);
    mat_free(&wt[q]);
  }
  mat_free(&out);
  mat_free(&bias);
  free(got.ptr);
  free(old.ptr);
  free(slack);
  free(want.ptr);
  tpf_comm_destroy(c);
  return rc;
}

static int rank_body(job *j, tpf_backend *be, cudaStream_t s) {
  if (run_bulk(j, be, s) != 0) return -1;
  if (run_ring_ag(j, be, s) != 0) return -1;
  if (run_rs(j, be, s, TPF_ALGO_RING) != 0) return -1;
  if (run_rs(j, be, s, TPF_ALGO_PIPELINE) != 0) return -1;
  tpf_cuda_stats st;
  REQUIRE(tpf_cuda_backend_stats(be, &st) == TPF_OK, "stats");
  say(j,
      "  rank %d: %d results checked; cuBLASLt heuristic queries %llu, cache hits %llu, "
      "fallback GEMMs %llu\n",
      j->rank, j->cases, (unsigned long long)st.gemm_heuristic_queries,
      (unsigned long long)st.gemm_cache_hits, (unsigned long long)st.gemm_fallbacks);
  if (j->fallback_mode)
    REQUIRE(st.gemm_fallbacks > 0 && st.gemm_heuristic_queries == 0,
            "TPF_CUDA_GEMM_FALLBACK: every GEMM should take the plain kernel");
  return 0;
}

static void *rank_main(void *p) {
  job *j = p;
  tpf_backend *be = NULL;
  cudaStream_t s = NULL;
  tpf_bootstrap boot;
  if (cudaSetDevice(0) != cudaSuccess ||
      cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess ||
      tpf_cuda_threads_bootstrap(j->group, j->rank, 0, &boot) != TPF_OK ||
      tpf_cuda_backend_create(&boot, &be) != TPF_OK ||
      tpf_cuda_backend_set_timeout(be, 20000) != TPF_OK) {
    say(j, "  rank %d: FAIL setup: %s\n", j->rank, tpf_last_error());
    j->failures++;
  } else {
    rank_body(j, be, s);
  }
  if (be) tpf_cuda_backend_destroy(be);
  if (s) cudaStreamDestroy(s);
  return NULL;
}

int main(void) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count < 1) {
    printf("skipped: no GPU (%s)\n", e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    return 77;
  }
  const char *ff = getenv("TPF_CUDA_GEMM_FALLBACK");
  const bool fallback = ff != NULL && ff[0] != '\0' && strcmp(ff, "0") != 0;
  int failures = 0;
  for (int P = 1; P <= MAXP; P++) {
    tpf_cuda_threads *g = NULL;
    if (tpf_cuda_threads_create(P, &g) != TPF_OK) {
      printf("FAIL tpf_cuda_threads_create: %s\n", tpf_last_error());
      return 1;
    }
    static job jobs[MAXP];
    pthread_t th[MAXP];
    memset(jobs, 0, sizeof jobs);
    for (int r = 0; r < P; r++) {
      jobs[r].group = g;
      jobs[r].P = P;
      jobs[r].rank = r;
      jobs[r].fallback_mode = fallback;
      pthread_create(&th[r], NULL, rank_main, &jobs[r]);
    }
    printf("P=%d%s:\n", P, fallback ? " (TPF_CUDA_GEMM_FALLBACK)" : "");
    for (int r = 0; r < P; r++) {
      pthread_join(th[r], NULL);
      fputs(jobs[r].log, stdout);
      failures += jobs[r].failures;
    }
    tpf_cuda_threads_destroy(g);
  }
  printf("%s: %d failures\n", failures ? "FAILED" : "PASSED", failures);
  return failures ? 1 : 0;
}
