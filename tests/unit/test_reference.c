/* The independent reference's own checks: SPEC §7's per-element verdict and tolerance table, ulp
 * spacing and the reduce-scatter rounding slack, so that neither the comparison nor the slack can
 * silently excuse real errors. */
#include "reference.h"
#include "tpf_test.h"

#include <math.h>
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

/* Issue 22's example: the max-abs-diff element (0, 0) is within tolerance (rel 0.005), the other
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

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_reference__tolerance_table_is_spec7),
      cmocka_unit_test(test_reference__one_wrong_element_fails),
      cmocka_unit_test(test_reference__wrong_needs_rel_and_abs),
      cmocka_unit_test(test_reference__nan_and_inf_agree_per_element),
      cmocka_unit_test(test_reference__ulp_spacing),
      cmocka_unit_test(test_reference__rs_slack_excuses_only_partial_rounding),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
