/* The independent reference's own checks: ulp spacing and the reduce-scatter rounding slack, so
 * that the slack cannot silently excuse real errors. */
#include "reference.h"
#include "tpf_test.h"

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
      cmocka_unit_test(test_reference__ulp_spacing),
      cmocka_unit_test(test_reference__rs_slack_excuses_only_partial_rounding),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
