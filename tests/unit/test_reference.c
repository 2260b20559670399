/* The independent reference's own checks: SPEC §7's per-element verdict and tolerance table, ulp
 * spacing, the reduce-scatter rounding slack and the fp32 accumulation-order slack, so that
 * neither the comparison nor a slack can silently excuse real errors. */
#include "reference.h"
#include "tpf_test.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* One-row fp32 matrix over v. */
static tpf_matrix row_f32(float *v, uint64_t n) {
  tpf_matrix m = {v, 1, n, n, TPF_FP32};
  return m;
}

static void test_reference__tolerance_table_is_spec7(void **state) {
  (void)state;
  tpf_ref_tol t = tpf_ref_tolerance(TPF_BF16);
  assert_true(t.rtol == 0.02 && t.atol == 0.002);
  t = tpf_ref_tolerance(TPF_FP16);
  assert_true(t.rtol == 0.01 && t.atol == 0.001);
  t = tpf_ref_tolerance(TPF_FP32);
  assert_true(t.rtol == 1e-5 && t.atol == 1e-6);
  t = tpf_ref_tolerance_pair(TPF_FP32, TPF_BF16); /* the looser one */
  assert_true(t.rtol == 0.02 && t.atol == 0.002);
  t = tpf_ref_tolerance_pair(TPF_FP16, TPF_FP32);
  assert_true(t.rtol == 0.01 && t.atol == 0.001);
}

/* The max-abs-diff element (0, 0) is within tolerance (rel 0.005), the other
 * element is 4000x off. The verdict used to be the max-diff element's: "1 of 2 elements out of
 * tolerance: PASS". */
static void test_reference__one_wrong_element_fails(void **state) {
  (void)state;
  float want[2] = {100.0f, 0.0001f}, got[2] = {100.5f, 0.4f};
  tpf_matrix g = row_f32(got, 2), w = row_f32(want, 2);
  tpf_ref_result r;
  assert_int_equal(tpf_ref_compare(&g, &w, tpf_ref_tolerance(TPF_BF16), &r), TPF_OK);
  assert_false(r.pass);
  assert_int_equal(r.wrong, 1);
  assert_int_equal(r.compared, 2);
  assert_int_equal(r.nonfinite, 0);
  assert_int_equal(r.col, 0);       /* the max-abs-diff element is still reported ... */
  assert_int_equal(r.wrong_col, 1); /* ... and so is the wrong one */
  assert_true(r.wrong_got == (double)0.4f && r.wrong_want == (double)0.0001f);
  char line[TPF_REF_FORMAT_LEN];
  tpf_ref_format(&r, line, sizeof line);
  assert_non_null(strstr(line, "1 of 2 elements out of tolerance"));
  assert_non_null(strstr(line, "worst at (0, 1)"));
  assert_non_null(strstr(line, "FAIL"));
  assert_null(strstr(line, "PASS"));
  char why[TPF_REF_FORMAT_LEN + 40];
  assert_false(tpf_ref_check(&g, &w, NULL, tpf_ref_tolerance(TPF_BF16), "D", why, sizeof why));
  assert_non_null(strstr(why, "D: 1 of 2 elements"));
  /* The same with the slack comparison (zero slack): still wrong. */
  float slack[2] = {0.0f, 0.0f};
  assert_int_equal(tpf_ref_compare_slack(&g, &w, slack, tpf_ref_tolerance(TPF_BF16), &r), TPF_OK);
  assert_false(r.pass);
  assert_int_equal(r.wrong, 1);
  /* Fixed, the result passes and says so. */
  got[1] = 0.0001f;
  assert_int_equal(tpf_ref_compare(&g, &w, tpf_ref_tolerance(TPF_BF16), &r), TPF_OK);
  assert_true(r.pass);
  assert_int_equal(r.wrong, 0);
  tpf_ref_format(&r, line, sizeof line);
  assert_non_null(strstr(line, "0 of 2 elements out of tolerance (rtol 0.02, atol 0.002): PASS"));
  assert_true(tpf_ref_check(&g, &w, NULL, tpf_ref_tolerance(TPF_BF16), "D", why, sizeof why));
}

/* Every wrong element counts, wherever the max diff is; an element is wrong only when BOTH the
 * relative and the absolute error exceed their tolerance. */
static void test_reference__wrong_needs_rel_and_abs(void **state) {
  (void)state;
  /* bf16 tolerances. (0) abs 0.5 rel 0.005: right (rel small). (1) want 0, got 0.0019: right (abs
   * <= atol although rel is huge). (2) want 0, got 0.0021: wrong. (3) want 0.5, got 0.512: abs
   * 0.012 > atol, rel 0.024 > rtol: wrong. (4) want 0.5, got 0.509: rel 0.018, right. */
  float want[5] = {100.0f, 0.0f, 0.0f, 0.5f, 0.5f};
  float got[5] = {100.5f, 0.0019f, 0.0021f, 0.512f, 0.509f};
  tpf_matrix g = row_f32(got, 5), w = row_f32(want, 5);
  tpf_ref_result r;
  assert_int_equal(tpf_ref_compare(&g, &w, tpf_ref_tolerance(TPF_BF16), &r), TPF_OK);
  assert_false(r.pass);
  assert_int_equal(r.wrong, 2);
  assert_int_equal(r.col, 0);
  assert_int_equal(r.wrong_col, 3); /* the worst wrong one: abs 0.012 */
  /* fp16 tolerances (rtol 0.01, atol 0.001) also reject (4) and (1). */
  assert_int_equal(tpf_ref_compare(&g, &w, tpf_ref_tolerance(TPF_FP16), &r), TPF_OK);
  assert_int_equal(r.wrong, 4);
  /* fp32 tolerances (rtol 1e-5, atol 1e-6): 0.1 off by 5e-6 is wrong (it passed the old atol
   * 1e-5), off by 5e-7 is right (abs <= atol). */
  float w32[2] = {0.1f, 1e-3f}, g32[2] = {0.1f + 5e-6f, 1e-3f + 5e-7f};
  tpf_matrix g2 = row_f32(g32, 2), w2 = row_f32(w32, 2);
  assert_int_equal(tpf_ref_compare(&g2, &w2, tpf_ref_tolerance(TPF_FP32), &r), TPF_OK);
  assert_false(r.pass);
  assert_int_equal(r.wrong, 1);
  assert_int_equal(r.wrong_col, 0);
}

/* NaN and inf must agree element by element; a mismatch is wrong even where the max-abs-diff
 * element (an inf diff) is elsewhere. */
static void test_reference__nan_and_inf_agree_per_element(void **state) {
  (void)state;
  float want[4] = {NAN, INFINITY, -INFINITY, 1.0f}, got[4] = {NAN, INFINITY, -INFINITY, 1.0f};
  tpf_matrix g = row_f32(got, 4), w = row_f32(want, 4);
  tpf_ref_result r;
  assert_int_equal(tpf_ref_compare(&g, &w, tpf_ref_tolerance(TPF_BF16), &r), TPF_OK);
  assert_true(r.pass);
  got[3] = NAN;
  assert_int_equal(tpf_ref_compare(&g, &w, tpf_ref_tolerance(TPF_BF16), &r), TPF_OK);
  assert_false(r.pass);
  assert_int_equal(r.wrong, 1);
  assert_int_equal(r.nonfinite, 1);
  assert_int_equal(r.wrong_col, 3);
  got[3] = 1.0f;
  got[1] = -INFINITY; /* infinities of opposite sign */
  got[0] = 1.0f;      /* a number where a NaN was expected */
  assert_int_equal(tpf_ref_compare(&g, &w, tpf_ref_tolerance(TPF_BF16), &r), TPF_OK);
  assert_false(r.pass);
  assert_int_equal(r.wrong, 2);
  assert_int_equal(r.nonfinite, 2);
  char line[TPF_REF_FORMAT_LEN];
  tpf_ref_format(&r, line, sizeof line);
  assert_non_null(strstr(line, "2 of 4 elements out of tolerance (rtol 0.02, atol 0.002, 2 of them "
                               "NaN/inf mismatches)"));
  /* Shapes that differ: TPF_EINVAL, and tpf_ref_check says so. */
  tpf_matrix short_g = row_f32(got, 3);
  assert_int_equal(tpf_ref_compare(&short_g, &w, tpf_ref_tolerance(TPF_BF16), &r), TPF_EINVAL);
  char why[64];
  assert_false(
      tpf_ref_check(&short_g, &w, NULL, tpf_ref_tolerance(TPF_BF16), "D", why, sizeof why));
  assert_string_equal(why, "D: shapes differ");
}

static void test_reference__ulp_spacing(void **state) {
  (void)state;
  assert_true(tpf_ref_ulp(TPF_BF16, 1.0) == 1.0 / 128); /* 8 significant bits */
  assert_true(tpf_ref_ulp(TPF_BF16, 1.5) == 1.0 / 128);
  assert_true(tpf_ref_ulp(TPF_BF16, -3.0) == 1.0 / 64);
  assert_true(tpf_ref_ulp(TPF_FP16, 1.0) == 1.0 / 1024); /* 11 significant bits */
  assert_true(tpf_ref_ulp(TPF_FP32, 1.0) == 1.0 / 8388608);
  assert_true(tpf_ref_ulp(TPF_FP16, 0.0) == 1.0 / 16777216); /* fp16 subnormal spacing */
}

static void test_reference__rs_slack_excuses_only_partial_rounding(void **state) {
  (void)state;
  /* want = -0.265625; two partials of magnitude ~4 (bf16 ulp 1/32 each): slack 1/16. */
  float want[2] = {-0.265625f, 1.0f}, slack[2] = {1.0f / 16, 0.0f};
  uint16_t got[2];
  got[0] = tpf_ref_float_to_bf16(-0.25f); /* off by 1/64: within the slack */
  got[1] = tpf_ref_float_to_bf16(1.0f);
  tpf_matrix g = {got, 1, 2, 2, TPF_BF16}, w = {want, 1, 2, 2, TPF_FP32};
  tpf_ref_result r;
  assert_int_equal(tpf_ref_compare(&g, &w, tpf_ref_tolerance(TPF_BF16), &r), TPF_OK);
  assert_false(r.pass); /* SPEC §7 alone rejects it: rel 0.059, abs 0.0156 */
  assert_int_equal(tpf_ref_compare_slack(&g, &w, slack, tpf_ref_tolerance(TPF_BF16), &r), TPF_OK);
  assert_true(r.pass);
  /* An error beyond the slack still fails, and so does any error where there is no slack. */
  got[0] = tpf_ref_float_to_bf16(-0.125f);
  assert_int_equal(tpf_ref_compare_slack(&g, &w, slack, tpf_ref_tolerance(TPF_BF16), &r), TPF_OK);
  assert_false(r.pass);
  got[0] = tpf_ref_float_to_bf16(-0.265625f);
  got[1] = tpf_ref_float_to_bf16(1.0625f);
  assert_int_equal(tpf_ref_compare_slack(&g, &w, slack, tpf_ref_tolerance(TPF_BF16), &r), TPF_OK);
  assert_false(r.pass);
  assert_int_equal(r.wrong, 1);
  assert_int_equal(tpf_ref_compare_slack(&g, &w, NULL, tpf_ref_tolerance(TPF_BF16), &r),
                   TPF_EINVAL);
}

/* x w^T in fp32 in ANOTHER order than the reference's: the even k summed, the odd k summed, then
 * the two added (a split-k GEMM, as cuBLASLt's kernels may run). x [m, k], w [n, k] fp32. */
static void gemm_split2(const tpf_matrix *x, const tpf_matrix *w, float *out) {
  for (uint64_t i = 0; i < x->rows; i++)
    for (uint64_t j = 0; j < w->rows; j++) {
      float even = 0.0f, odd = 0.0f;
      for (uint64_t p = 0; p < x->cols; p++) {
        const float t = tpf_ref_get(x, i, p) * tpf_ref_get(w, j, p);
        if (p % 2 == 0)
          even += t;
        else
          odd += t;
      }
      out[i * w->rows + j] = even + odd;
    }
}

static void test_reference__gamma_and_abs_bound(void **state) {
  (void)state;
  const double u = 0x1p-24;
  assert_true(tpf_ref_gamma(0) == 0.0);
  assert_true(tpf_ref_gamma(1) == u / (1.0 - u));
  assert_true(tpf_ref_gamma(48) == 48.0 * u / (1.0 - 48.0 * u));
  assert_true(isinf(tpf_ref_gamma(1ull << 24)));
  /* sum_p |x(i, p) w(j, p)| exactly, for small integers; added to what bound holds. */
  float xv[4] = {1.0f, -2.0f, 3.0f, -4.0f}, wv[2] = {-1.0f, 5.0f};
  tpf_matrix x = {xv, 2, 2, 2, TPF_FP32}, w = {wv, 1, 2, 2, TPF_FP32};
  float bound[2] = {0.5f, 0.0f};
  assert_int_equal(tpf_ref_gemm_abs_add(&x, &w, bound), TPF_OK);
  assert_true(bound[0] == 11.5f && bound[1] == 23.0f); /* 0.5 + 1 + 10, 3 + 20 */
  float sl[2] = {0.0f, 0.0f};
  assert_int_equal(tpf_ref_order_slack_add(&x, &w, 2.0, sl), TPF_OK);
  assert_true((double)sl[0] >= 2.0 * tpf_ref_gamma(2) * 11.0 &&
              (double)sl[0] <= 2.0 * tpf_ref_gamma(2) * 11.0 * (1.0 + 1e-6));
  /* Bad arguments: TPF_EINVAL and nothing written. */
  tpf_matrix w3 = {wv, 1, 1, 1, TPF_FP32}; /* k disagrees */
  assert_int_equal(tpf_ref_gemm_abs_add(&x, &w3, bound), TPF_EINVAL);
  assert_int_equal(tpf_ref_order_slack_add(&x, &w, -1.0, sl), TPF_EINVAL);
  assert_int_equal(tpf_ref_order_slack_add(&x, &w, NAN, sl), TPF_EINVAL);
  assert_true(bound[0] == 11.5f && bound[1] == 23.0f);
  /* tpf_ref_order_slack: NULL when the backend sums in the reference's order. */
  float *s = (float *)1;
  assert_int_equal(tpf_ref_order_slack(&x, &w, 1.0, false, &s), TPF_OK);
  assert_null(s);
  assert_int_equal(tpf_ref_order_slack(&x, &w, 1.0, true, &s), TPF_OK);
  assert_non_null(s);
  assert_true((double)s[1] >= tpf_ref_gamma(2) * 23.0);
  free(s);
  s = (float *)1;
  assert_int_equal(tpf_ref_order_slack(&x, &w3, 1.0, true, &s), TPF_EINVAL);
  assert_null(s);
}

/* fp32 GEMM, summed in another order than the reference's: where products cancel, one element
 * differs by far more than fp32's 1e-5 / 1e-6 although nothing is wrong; the accumulation-order
 * slack gamma_K sum_k |x_ik w_jk| excuses it, and only it. */
static void test_reference__order_slack_excuses_only_fp32_order(void **state) {
  (void)state;
  /* Row 0: 100 + 3e-6 rounds to 100 in fp32 (half an ulp of 100 is 3.8e-6), so the reference
   * gives 0; the split order gives (100 - 100) + 3e-6. Bound 200, gamma_3 * 200 = 3.6e-5.
   * Row 1: no cancellation (bound ~1e-6): both orders agree. */
  float xv[6] = {100.0f, 3e-6f, -100.0f, 2e-7f, 3e-7f, 5e-7f}, wv[3] = {1.0f, 1.0f, 1.0f};
  tpf_matrix x = {xv, 2, 3, 3, TPF_FP32}, w = {wv, 1, 3, 3, TPF_FP32};
  float want[2], got[2];
  assert_int_equal(tpf_ref_gemm_f32(&x, &w, want), TPF_OK);
  gemm_split2(&x, &w, got);
  assert_true(want[0] == 0.0f && got[0] == 3e-6f);
  tpf_matrix g = {got, 2, 1, 1, TPF_FP32}, wm = {want, 2, 1, 1, TPF_FP32};
  tpf_ref_result r;
  const tpf_ref_tol tol = tpf_ref_tolerance(TPF_FP32);
  assert_int_equal(tpf_ref_compare(&g, &wm, tol, &r), TPF_OK);
  assert_false(r.pass); /* SPEC §7 alone: abs 3e-6 > 1e-6, rel 0.3 */
  assert_int_equal(r.wrong, 1);
  float *sl = NULL;
  assert_int_equal(tpf_ref_order_slack(&x, &w, 1.0, true, &sl), TPF_OK);
  assert_int_equal(tpf_ref_compare_slack(&g, &wm, sl, tol, &r), TPF_OK);
  assert_true(r.pass);
  char why[TPF_REF_FORMAT_LEN + 40];
  assert_true(tpf_ref_check(&g, &wm, sl, tol, "D", why, sizeof why));
  /* A real error still fails: 1e-4 on row 0 (beyond gamma_3 * 200), 1e-4 on row 1 (bound 1e-6). */
  got[0] = 3e-6f + 1e-4f;
  assert_int_equal(tpf_ref_compare_slack(&g, &wm, sl, tol, &r), TPF_OK);
  assert_false(r.pass);
  assert_int_equal(r.wrong_row, 0);
  got[0] = 3e-6f;
  got[1] = want[1] + 1e-4f;
  assert_false(tpf_ref_check(&g, &wm, sl, tol, "D", why, sizeof why));
  assert_non_null(strstr(why, "1 of 2 elements out of tolerance"));
  assert_non_null(strstr(why, "worst at (1, 0)"));
  free(sl);

  /* Seeded operands in [-1, 1], K 256: the split order makes some elements wrong by SPEC §7
   * alone (sums of ~5 whose elements near 0 carry a few ulps of ~5); the order slack excuses them
   * all; moved by 10x its slack plus tolerance, any element fails again. */
  enum { M = 32, N = 32, K = 256 };
  static float xr[M * K], wr[N * K], wantr[M * N], gotr[M * N];
  tpf_matrix X = {xr, M, K, K, TPF_FP32}, W = {wr, N, K, K, TPF_FP32};
  tpf_ref_fill(&X, 7, -1.0f, 1.0f);
  tpf_ref_fill(&W, 8, -1.0f, 1.0f);
  assert_int_equal(tpf_ref_gemm_f32(&X, &W, wantr), TPF_OK);
  gemm_split2(&X, &W, gotr);
  tpf_matrix G = {gotr, M, N, N, TPF_FP32}, WM = {wantr, M, N, N, TPF_FP32};
  assert_int_equal(tpf_ref_compare(&G, &WM, tol, &r), TPF_OK);
  assert_true(r.wrong > 0);
  const uint64_t wr0 = r.wrong_row, wc0 = r.wrong_col;
  assert_int_equal(tpf_ref_order_slack(&X, &W, 1.0, true, &sl), TPF_OK);
  assert_int_equal(tpf_ref_compare_slack(&G, &WM, sl, tol, &r), TPF_OK);
  assert_true(r.pass);
  const size_t e = (size_t)(wr0 * N + wc0);
  gotr[e] = wantr[e] + 10.0f * (sl[e] + (float)tol.atol + (float)tol.rtol * fabsf(wantr[e]));
  assert_int_equal(tpf_ref_compare_slack(&G, &WM, sl, tol, &r), TPF_OK);
  assert_false(r.pass);
  assert_int_equal(r.wrong, 1);
  assert_true(r.wrong_row == wr0 && r.wrong_col == wc0);
  free(sl);
}

/* A reduce-scatter of fp32 partials, each summed in another order: the per-partial rounding
 * slack (one fp32 ulp of each partial) is too small; with the partials' order slack
 * (tpf_ref_rs_add_partial_order, own_order) the element passes; a real error still fails. */
static void test_reference__rs_order_slack_fp32(void **state) {
  (void)state;
  float x0v[3] = {100.0f, 3e-6f, -100.0f}, x1v[3] = {1e-3f, 0.0f, 0.0f}, wv[3] = {1, 1, 1};
  tpf_matrix x0 = {x0v, 1, 3, 3, TPF_FP32}, x1 = {x1v, 1, 3, 3, TPF_FP32};
  tpf_matrix w = {wv, 1, 3, 3, TPF_FP32};
  float want[1] = {0}, slack[1] = {0}, want2[1] = {0}, slack2[1] = {0}, p0[1], p1[1];
  assert_int_equal(tpf_ref_rs_add_partial_order(&x0, &w, TPF_FP32, false, want, slack), TPF_OK);
  assert_int_equal(tpf_ref_rs_add_partial_order(&x1, &w, TPF_FP32, false, want, slack), TPF_OK);
  assert_int_equal(tpf_ref_rs_add_partial(&x0, &w, TPF_FP32, want2, slack2), TPF_OK);
  assert_int_equal(tpf_ref_rs_add_partial(&x1, &w, TPF_FP32, want2, slack2), TPF_OK);
  assert_true(want[0] == want2[0] && slack[0] == slack2[0]); /* !own_order: the plain partial */
  assert_true(want[0] == 1e-3f);
  gemm_split2(&x0, &w, p0);
  gemm_split2(&x1, &w, p1);
  float got[1] = {p0[0] + p1[0]}; /* 1.003e-3 */
  tpf_matrix g = {got, 1, 1, 1, TPF_FP32}, wm = {want, 1, 1, 1, TPF_FP32};
  const tpf_ref_tol tol = tpf_ref_tolerance(TPF_FP32);
  tpf_ref_result r;
  assert_int_equal(tpf_ref_compare_slack(&g, &wm, slack, tol, &r), TPF_OK);
  assert_false(r.pass); /* abs 3e-6 against a slack of ~1e-10 */
  float want3[1] = {0}, slack3[1] = {0};
  assert_int_equal(tpf_ref_rs_add_partial_order(&x0, &w, TPF_FP32, true, want3, slack3), TPF_OK);
  assert_int_equal(tpf_ref_rs_add_partial_order(&x1, &w, TPF_FP32, true, want3, slack3), TPF_OK);
  assert_true(want3[0] == want[0]);
  assert_true((double)slack3[0] >= (double)slack[0] + tpf_ref_gamma(3) * 200.0);
  assert_int_equal(tpf_ref_compare_slack(&g, &wm, slack3, tol, &r), TPF_OK);
  assert_true(r.pass);
  got[0] += 1e-4f;
  assert_int_equal(tpf_ref_compare_slack(&g, &wm, slack3, tol, &r), TPF_OK);
  assert_false(r.pass);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_reference__tolerance_table_is_spec7),
      cmocka_unit_test(test_reference__one_wrong_element_fails),
      cmocka_unit_test(test_reference__wrong_needs_rel_and_abs),
      cmocka_unit_test(test_reference__nan_and_inf_agree_per_element),
      cmocka_unit_test(test_reference__ulp_spacing),
      cmocka_unit_test(test_reference__rs_slack_excuses_only_partial_rounding),
      cmocka_unit_test(test_reference__gamma_and_abs_bound),
      cmocka_unit_test(test_reference__order_slack_excuses_only_fp32_order),
      cmocka_unit_test(test_reference__rs_order_slack_fp32),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
