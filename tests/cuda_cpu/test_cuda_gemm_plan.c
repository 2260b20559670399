/* How the CUDA backend maps a step GEMM onto cuBLASLt (backend_cuda/cuda_gemm.c,
 * tpf_cuda__gemm_plan_of), checked without a GPU: the plan's column-major operands, ops and
 * epilogue are evaluated on the host exactly as cuBLASLt defines them (D' = act(alpha op(A')
 * op(B') + beta C' + bias broadcast along the columns of D', bias of D' rows elements)), and the
 * bytes of D' must be the row-major d that tpflex asks for, for every transpose and epilogue
 * combination, with leading dimensions larger than the columns. Both sides accumulate in fp32 in
 * k order, so they must agree exactly. Also: with no flags and no epilogue the plan is 0.1's
 * "TN" GEMM. */
#include "cuda_internal.h"
#include "tpf_test.h"

#include <cublasLt.h>
#include <math.h>
#include <string.h>

enum { M = 5, N = 7, K = 6, PAD = 3 };

static float lcg(uint32_t *s) {
  *s = *s * 1664525u + 1013904223u;
  return (float)((*s >> 8) % 2001u) / 1000.0f - 1.0f; /* in [-1, 1], 3 decimals */
}

/* cuBLASLt's definition, column-major: D'(i, j) at d[i + j * ld]. */
static void lt_eval(const tpf_cuda_gemm_plan *p, const float *A, const float *B, float *D,
                    float alpha, float beta, const float *bias, bool gelu) {
  const uint64_t rows = p->d_rows, cols = p->d_cols;
  const uint64_t kk = p->op_a ? p->a_rows : p->a_cols;
  assert_int_equal(p->op_a ? p->a_cols : p->a_rows, rows); /* op(A') is rows x kk */
  assert_int_equal(p->op_b ? p->b_cols : p->b_rows, kk);   /* op(B') is kk x cols */
  assert_int_equal(p->op_b ? p->b_rows : p->b_cols, cols);
  for (uint64_t j = 0; j < cols; j++)
    for (uint64_t i = 0; i < rows; i++) {
      float acc = 0.0f;
      for (uint64_t q = 0; q < kk; q++) {
        const float a = p->op_a ? A[q + i * p->a_ld] : A[i + q * p->a_ld];
        const float b = p->op_b ? B[j + q * p->b_ld] : B[q + j * p->b_ld];
        acc += a * b;
      }
      float x = alpha * acc;
      if (beta != 0.0f) x += beta * D[i + j * p->d_ld];
      if (bias) x += bias[i]; /* D' rows */
      D[i + j * p->d_ld] = gelu ? tpf_gelu(x) : x;
    }
}

/* tpflex's definition, row-major: d[i, j] = act(alpha sum_p op(a)(i, p) op(w)(j, p) + beta d +
 * bias[j]), op(a)(i, p) = a[i, p] or, stored [k, m], a[p, i]; op(w)(j, p) = w[j, p] or, stored
 * [k, n], w[p, j]. */
static void tpf_eval(const float *a, uint64_t lda, bool ta, const float *w, uint64_t ldw, bool tw,
                     float *d, uint64_t ldd, float alpha, float beta, const float *bias,
                     bool gelu) {
  for (uint64_t i = 0; i < M; i++)
    for (uint64_t j = 0; j < N; j++) {
      float acc = 0.0f;
      for (uint64_t p = 0; p < K; p++) {
        const float av = ta ? a[p * lda + i] : a[i * lda + p];
        const float wv = tw ? w[p * ldw + j] : w[j * ldw + p];
        acc += wv * av; /* cuBLASLt's A' is w: same products, same order */
      }
      float x = alpha * acc;
      if (beta != 0.0f) x += beta * d[i * ldd + j];
      if (bias) x += bias[j];
      d[i * ldd + j] = gelu ? tpf_gelu(x) : x;
    }
}

static void test_cuda_gemm_plan__row_major_results_for_every_flag_and_epilogue(void **state) {
  (void)state;
  static const struct {
    float alpha, beta;
    bool bias, gelu;
  } epis[] = {{1.0f, 0.0f, false, false}, {0.5f, 0.0f, false, false}, {1.0f, 0.75f, false, false},
              {1.0f, 0.0f, true, false},  {1.0f, 0.0f, false, true},  {0.5f, -1.25f, true, true}};
  int cases = 0;
  for (int ta = 0; ta < 2; ta++)
    for (int tw = 0; tw < 2; tw++)
      for (size_t ei = 0; ei < sizeof epis / sizeof epis[0]; ei++) {
        /* Stored shapes: a [M, K] or [K, M]; w [N, K] or [K, N]; d [M, N]; ld = cols + PAD. */
        const uint64_t a_rows = ta ? K : M, a_cols = ta ? M : K;
        const uint64_t w_rows = tw ? K : N, w_cols = tw ? N : K;
        const uint64_t lda = a_cols + PAD, ldw = w_cols + PAD, ldd = N + PAD;
        float a[K * (M + PAD) + M * (K + PAD)], w[K * (N + PAD) + N * (K + PAD)];
        float d_lt[M * (N + PAD)], d_tpf[M * (N + PAD)], bias[N];
        uint32_t seed = (uint32_t)(ta * 100 + tw * 10 + (int)ei + 1);
        for (uint64_t i = 0; i < a_rows * lda; i++)
          a[i] = lcg(&seed);
        for (uint64_t i = 0; i < w_rows * ldw; i++)
          w[i] = lcg(&seed);
        for (uint64_t i = 0; i < M * ldd; i++)
          d_lt[i] = d_tpf[i] = lcg(&seed);
        for (int j = 0; j < N; j++)
          bias[j] = lcg(&seed);
        tpf_cuda_epi e = {1, epis[ei].gelu ? 1 : 0, epis[ei].alpha, epis[ei].beta,
                          epis[ei].bias ? (const void *)bias : NULL};
        const bool on =
            epis[ei].alpha != 1.0f || epis[ei].beta != 0.0f || epis[ei].bias || epis[ei].gelu;
        unsigned flags = (ta ? TPF_STEP_TRANS_A : 0u) | (tw ? TPF_STEP_TRANS_W : 0u);
        tpf_cuda_gemm_plan p;
        tpf_cuda__gemm_plan_of(M, N, K, lda, ldw, ldd, flags, on ? &e : NULL, &p);
        const uint32_t want_epi = epis[ei].bias && epis[ei].gelu ? CUBLASLT_EPILOGUE_GELU_BIAS
                                  : epis[ei].bias                ? CUBLASLT_EPILOGUE_BIAS
                                  : epis[ei].gelu                ? CUBLASLT_EPILOGUE_GELU
                                                                 : CUBLASLT_EPILOGUE_DEFAULT;
        assert_int_equal(p.epilogue, want_epi);
        /* cuBLASLt's A' is w and B' is a; the epilogue's alpha/beta are call arguments. */
        lt_eval(&p, w, a, d_lt, epis[ei].alpha, epis[ei].beta, epis[ei].bias ? bias : NULL,
                epis[ei].gelu);
        tpf_eval(a, lda, ta, w, ldw, tw, d_tpf, ldd, epis[ei].alpha, epis[ei].beta,
                 epis[ei].bias ? bias : NULL, epis[ei].gelu);
        for (uint64_t i = 0; i < M * ldd; i++)
          if (memcmp(&d_lt[i], &d_tpf[i], sizeof(float)) != 0)
            fail_msg("ta %d tw %d epilogue %zu: element %llu: cuBLASLt plan gives %.9g, tpflex "
                     "wants %.9g",
                     ta, tw, ei, (unsigned long long)i, (double)d_lt[i], (double)d_tpf[i]);
        cases++;
      }
  assert_int_equal(cases, 24);
}

static void test_cuda_gemm_plan__no_flags_is_the_0_1_tn_gemm(void **state) {
  (void)state;
  tpf_cuda_gemm_plan p;
  tpf_cuda__gemm_plan_of(64, 40, 48, 56, 50, 44, 0u, NULL, &p);
  /* w: k x n column-major (op T); a: k x m (op N); d: n x m. */
  assert_int_equal(p.op_a, 1);
  assert_int_equal(p.op_b, 0);
  assert_int_equal(p.a_rows, 48);
  assert_int_equal(p.a_cols, 40);
  assert_int_equal(p.a_ld, 50);
  assert_int_equal(p.b_rows, 48);
  assert_int_equal(p.b_cols, 64);
  assert_int_equal(p.b_ld, 56);
  assert_int_equal(p.d_rows, 40);
  assert_int_equal(p.d_cols, 64);
  assert_int_equal(p.d_ld, 44);
  assert_int_equal(p.epilogue, CUBLASLT_EPILOGUE_DEFAULT);
  /* An epilogue that is off (a step the core did not flag) changes nothing. */
  tpf_cuda_epi off = {0, 1, 2.0f, 1.0f, &p};
  tpf_cuda_gemm_plan q;
  tpf_cuda__gemm_plan_of(64, 40, 48, 56, 50, 44, TPF_STEP_EPILOGUE, &off, &q);
  assert_memory_equal(&p, &q, sizeof p);
}

/* FP8 (cuda_gemm.c, FP8): what cuBLASLt cannot run is refused before anything is enqueued, with
 * TPF_EUNSUPPORTED naming the reason; the TN layout with 16-element leading dimensions passes. */
static void test_cuda_gemm_plan__fp8_refusals_before_enqueue(void **state) {
  (void)state;
  tpf_step st;
  memset(&st, 0, sizeof st);
  st.kind = TPF_STEP_GEMM;
  st.a.id = TPF_MAT_BUF; /* ag_gemm: the buffer (fp8) times w */
  st.w.id = TPF_MAT_W;
  st.d.id = TPF_MAT_D;
  st.m = 16;
  st.n = 32;
  st.k = 64;
  tpf_schedule sc;
  memset(&sc, 0, sizeof sc);
  sc.dtype = TPF_FP8_E4M3;
  sc.cols = 64;
  sc.nsteps = 1;
  sc.steps = &st;
  static unsigned char mem[1];
  tpf_exec_args a;
  memset(&a, 0, sizeof a);
  a.sched = &sc;
  a.comm_name = "fc1_fprop";
  a.w = (tpf_matrix){mem, 32, 64, 64, TPF_FP8_E4M3};
  a.d = (tpf_matrix){mem, 16, 32, 32, TPF_FP32};
  TPF_ASSERT_OK(tpf_cuda__gemm_fp8_prepare(NULL, &a));
  st.flags = TPF_STEP_TRANS_W;
  TPF_ASSERT_STATUS(tpf_cuda__gemm_fp8_prepare(NULL, &a), TPF_EUNSUPPORTED);
  assert_non_null(strstr(tpf_last_error(), "TN layout"));
  st.flags = 0;
  a.w.ld = 72; /* not a multiple of 16 */
  TPF_ASSERT_STATUS(tpf_cuda__gemm_fp8_prepare(NULL, &a), TPF_EUNSUPPORTED);
  assert_non_null(strstr(tpf_last_error(), "ld 72"));
  a.w.ld = 64;
  st.flags = TPF_STEP_EPILOGUE;
  a.epi.bias = mem;
  TPF_ASSERT_STATUS(tpf_cuda__gemm_fp8_prepare(NULL, &a), TPF_EUNSUPPORTED);
  assert_non_null(strstr(tpf_last_error(), "bias"));
  a.d.dtype = TPF_BF16; /* a bf16 D takes a bias */
  TPF_ASSERT_OK(tpf_cuda__gemm_fp8_prepare(NULL, &a));
  /* Not fp8: nothing to check, whatever the flags. */
  sc.dtype = TPF_BF16;
  a.w.dtype = TPF_BF16;
  st.flags = TPF_STEP_TRANS_W;
  a.w.ld = 72;
  TPF_ASSERT_OK(tpf_cuda__gemm_fp8_prepare(NULL, &a));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cuda_gemm_plan__row_major_results_for_every_flag_and_epilogue),
      cmocka_unit_test(test_cuda_gemm_plan__no_flags_is_the_0_1_tn_gemm),
      cmocka_unit_test(test_cuda_gemm_plan__fp8_refusals_before_enqueue),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
