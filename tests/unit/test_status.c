/* Status names, meanings and the thread-local detail. */
#include "tpf_test.h"

static void test_status__names_and_texts_cover_the_enum(void **state) {
  (void)state;
  for (int s = 0; s < TPF_STATUS_COUNT; s++) {
    const char *n = tpf_status_name((tpf_status)s);
    assert_non_null(n);
    assert_true(strncmp(n, "TPF_", 4) == 0);
    assert_string_not_equal(n, "TPF_UNKNOWN");
    assert_true(strlen(tpf_strerror((tpf_status)s)) > 5);
  }
  assert_string_equal(tpf_status_name(TPF_ECAPACITY), "TPF_ECAPACITY");
  assert_string_equal(tpf_status_name(TPF_OK), "TPF_OK");
  assert_string_equal(tpf_status_name((tpf_status)999), "TPF_UNKNOWN");
  assert_string_equal(tpf_strerror((tpf_status)-1), "unknown status");
  assert_int_equal(TPF_EBACKEND, 12); /* values are never renumbered */
}

static void test_status__detail_is_recorded_and_cleared(void **state) {
  (void)state;
  assert_int_equal(tpf_set_error(TPF_ECAPACITY, "active rows %d exceed capacity %d", 4100, 4096),
                   TPF_ECAPACITY);
  assert_string_equal(tpf_last_error(), "active rows 4100 exceed capacity 4096");
  tpf__clear_error();
  assert_string_equal(tpf_last_error(), "");
}

/* tpf_prefix_error puts context in front of the detail in place: the detail stays whole (it is
 * not re-formatted from the buffer it lives in), a prefix already there is not doubled, and a
 * detail too long for the buffer loses its tail, never the prefix. */
static void test_status__prefix_keeps_the_detail(void **state) {
  (void)state;
  tpf_set_error(TPF_ESHAPE, "weight w has shape [%d, %d]", 8, 12);
  assert_int_equal(tpf_prefix_error(TPF_ESHAPE, "'%s' %s: ", "fc1", "tpf_ag_gemm"), TPF_ESHAPE);
  assert_string_equal(tpf_last_error(), "'fc1' tpf_ag_gemm: weight w has shape [8, 12]");
  assert_int_equal(tpf_prefix_error(TPF_EINVAL, "'%s' ", "fc1"), TPF_EINVAL);
  assert_string_equal(tpf_last_error(), "'fc1' tpf_ag_gemm: weight w has shape [8, 12]");
  tpf__clear_error();
  tpf_prefix_error(TPF_EINVAL, "ctx: ");
  assert_string_equal(tpf_last_error(), "ctx: ");
  char long_detail[600];
  memset(long_detail, 'x', sizeof long_detail - 1);
  long_detail[sizeof long_detail - 1] = '\0';
  tpf_set_error(TPF_EINVAL, "%s", long_detail);
  tpf_prefix_error(TPF_EINVAL, "front: ");
  const char *e = tpf_last_error();
  assert_int_equal(strncmp(e, "front: xxx", 10), 0);
  assert_int_equal(strlen(e), 511); /* the buffer's 512 bytes with the NUL */
}

static void test_status__dtype_conversions_round_trip(void **state) {
  (void)state;
  const float vals[] = {0.0f, 1.0f, -2.5f, 0.15625f, 1000.0f, -0.0009765625f};
  for (size_t i = 0; i < TPF_ARRAY_SIZE(vals); i++) {
    unsigned char buf[4];
    tpf_float_to_elem(TPF_BF16, vals[i], buf);
    assert_float_equal(tpf_elem_to_float(TPF_BF16, buf), vals[i], 1e-6);
    tpf_float_to_elem(TPF_FP16, vals[i], buf);
    assert_float_equal(tpf_elem_to_float(TPF_FP16, buf), vals[i], 1e-6);
    tpf_float_to_elem(TPF_FP32, vals[i], buf);
    assert_float_equal(tpf_elem_to_float(TPF_FP32, buf), vals[i], 0.0);
  }
  /* Round to nearest even: 1 + 2^-8 is halfway between two bf16 values; even mantissa wins. */
  unsigned char b[2];
  tpf_float_to_elem(TPF_BF16, 1.00390625f, b);
  assert_float_equal(tpf_elem_to_float(TPF_BF16, b), 1.0f, 0.0);
  tpf_float_to_elem(TPF_FP16, 70000.0f, b);
  assert_true(tpf_elem_to_float(TPF_FP16, b) > 65504.0f); /* overflow to +Inf */
  tpf_float_to_elem(TPF_FP8_E4M3, 1000.0f, b);
  assert_float_equal(tpf_elem_to_float(TPF_FP8_E4M3, b), 448.0f, 0.0); /* saturates */
  tpf_float_to_elem(TPF_FP8_E5M2, -3.0f, b);
  assert_float_equal(tpf_elem_to_float(TPF_FP8_E5M2, b), -3.0f, 0.0);
  /* NaN codes: E4M3 S.1111.111, E5M2 exponent all ones; NaN encodes to NaN. */
  unsigned char nan_e4m3 = 0x7F, inf_e5m2 = 0x7C, nan_e5m2 = 0x7E;
  float v = tpf_elem_to_float(TPF_FP8_E4M3, &nan_e4m3);
  assert_true(v != v);
  assert_true(tpf_elem_to_float(TPF_FP8_E5M2, &inf_e5m2) > 1e30f);
  v = tpf_elem_to_float(TPF_FP8_E5M2, &nan_e5m2);
  assert_true(v != v);
  tpf_float_to_elem(TPF_FP8_E4M3, nan_e4m3 == 0x7F ? v : 0.0f, b);
  assert_int_equal(b[0], 0x7F);
  tpf_float_to_elem(TPF_FP8_E5M2, 1e9f, b); /* saturates, never encodes infinity */
  assert_float_equal(tpf_elem_to_float(TPF_FP8_E5M2, b), 57344.0f, 0.0);
}

static void test_status__allocator_hooks_need_all_four(void **state) {
  (void)state;
  TPF_ASSERT_STATUS(tpf_set_allocator(malloc, NULL, NULL, NULL), TPF_EINVAL);
  assert_non_null(strstr(tpf_last_error(), "calloc=NULL"));
  TPF_ASSERT_OK(tpf_set_allocator(malloc, calloc, realloc, free));
  TPF_ASSERT_OK(tpf_set_allocator(NULL, NULL, NULL, NULL));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_status__names_and_texts_cover_the_enum),
      cmocka_unit_test(test_status__detail_is_recorded_and_cleared),
      cmocka_unit_test(test_status__prefix_keeps_the_detail),
      cmocka_unit_test(test_status__dtype_conversions_round_trip),
      cmocka_unit_test(test_status__allocator_hooks_need_all_four),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
