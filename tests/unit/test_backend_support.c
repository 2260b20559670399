/* tpflex/tpflex_backend_support.h: the contract a backend outside the tree relies on. The
 * allocator counts as the core's (tpf_set_allocator refuses while a backend's block is live, a
 * test budget reaches it), sizes and counts of 0 allocate, the struct-size check names the sizes,
 * the live-object table names a destroyed object, the checked arithmetic stops at 2^64 - 1, and
 * the error macros propagate. (symbols_exported checks that the shared library exports these
 * functions: they are TPF_API in a public header.) */
#include "tpf_test.h"

#include "tpflex/tpflex_backend_support.h"

static void *count_malloc(size_t n) {
  return malloc(n);
}

static void test_allocator_counts_as_live(void **state) {
  (void)state;
  const long live0 = tpf__alloc_live_count();
  void *p = tpf_malloc(0), *q = tpf_calloc(0, 8), *r = tpf_realloc(NULL, 16);
  assert_non_null(p);
  assert_non_null(q);
  assert_non_null(r);
  assert_int_equal(tpf__alloc_live_count(), live0 + 3);
  /* Other hooks are refused while a backend's block is live, naming the count. */
  TPF_ASSERT_STATUS(tpf_set_allocator(count_malloc, calloc, realloc, free), TPF_ESTATE);
  assert_non_null(strstr(tpf_last_error(), "allocations of the current allocator are still live"));
  r = tpf_realloc(r, 4096);
  assert_non_null(r);
  assert_int_equal(tpf__alloc_live_count(), live0 + 3);
  tpf_free(p);
  tpf_free(q);
  tpf_free(r);
  tpf_free(NULL);
  assert_int_equal(tpf__alloc_live_count(), live0);
  /* The test budget reaches a backend's allocations. */
  tpf__alloc_set_budget(1);
  p = tpf_malloc(8);
  assert_non_null(p);
  assert_null(tpf_calloc(1, 8));
  tpf__alloc_set_budget(-1);
  tpf_free(p);
  assert_int_equal(tpf__alloc_live_count(), live0);
}

static void test_struct_size(void **state) {
  (void)state;
  const size_t released[] = {24, 40};
  TPF_ASSERT_OK(tpf_check_struct_size("my_create", "options", "my_options", 0, released, 2));
  TPF_ASSERT_OK(tpf_check_struct_size("my_create", "options", "my_options", 24, released, 2));
  TPF_ASSERT_OK(tpf_check_struct_size("my_create", "options", "my_options", 40, released, 2));
  TPF_ASSERT_STATUS(tpf_check_struct_size("my_create", "options", "my_options", 32, released, 2),
                    TPF_EINVAL);
  const char *e = tpf_last_error();
  assert_non_null(strstr(e, "my_create: options size 32 is not the size of a released my_options"));
  assert_non_null(strstr(e, "accepted sizes: 0 (this header's layout) or 24, 40"));
}

static void test_handles(void **state) {
  (void)state;
  const size_t n0 = tpf__handle_count();
  int obj = 0, other = 0;
  enum { MY_KIND = 100 };
  TPF_ASSERT_OK(tpf_handle_add(&obj, MY_KIND));
  assert_true(tpf_handle_live(&obj, MY_KIND));
  assert_false(tpf_handle_live(&obj, TPF_HANDLE_WORLD)); /* another kind */
  TPF_ASSERT_OK(tpf_handle_check(&obj, MY_KIND, "my_call"));
  TPF_ASSERT_STATUS(tpf_handle_check(&other, MY_KIND, "my_call"), TPF_EINVAL);
  assert_non_null(strstr(tpf_last_error(), "my_call: "));
  assert_non_null(strstr(tpf_last_error(), "is not a live object (destroyed, or never created"));
  tpf_handle_remove(&obj, "mine");
  assert_false(tpf_handle_live(&obj, MY_KIND));
  TPF_ASSERT_STATUS(tpf_handle_check(&obj, MY_KIND, "my_call"), TPF_EINVAL);
  assert_non_null(strstr(tpf_last_error(), "my_call: object 'mine'"));
  assert_non_null(strstr(tpf_last_error(), "was destroyed"));
  TPF_ASSERT_STATUS(tpf_handle_check(NULL, MY_KIND, "my_call"), TPF_EINVAL);
  assert_string_equal(tpf_last_error(), "my_call: object is NULL");
  TPF_ASSERT_STATUS(tpf_handle_add(NULL, MY_KIND), TPF_EINVAL);
  tpf_handle_remove(&other, NULL); /* absent: nothing happens */
  assert_int_equal(tpf__handle_count(), n0);
}

static void test_checked_arithmetic(void **state) {
  (void)state;
  uint64_t out = 7;
  assert_true(tpf_add_u64(UINT64_MAX - 1, 1, &out));
  assert_true(out == UINT64_MAX);
  out = 7;
  assert_false(tpf_add_u64(UINT64_MAX, 1, &out));
  assert_true(out == 7);
  assert_true(tpf_mul_u64(1ull << 32, (1ull << 32) - 1, &out));
  assert_true(out == (1ull << 32) * ((1ull << 32) - 1));
  out = 7;
  assert_false(tpf_mul_u64(1ull << 32, 1ull << 32, &out));
  assert_true(out == 7);
  assert_true(tpf_mul_u64(0, UINT64_MAX, &out) && out == 0);
  assert_true(tpf_mul3_u64(1ull << 20, 1ull << 20, 1ull << 23, &out) && out == 1ull << 63);
  out = 7;
  assert_false(tpf_mul3_u64(1ull << 20, 1ull << 20, 1ull << 24, &out));
  assert_true(out == 7);
}

static tpf_status fails_with(tpf_status s) {
  TPF_RETURN_IF(s != TPF_OK, s, "failed with %s", tpf_status_name(s));
  return TPF_OK;
}
static tpf_status check_twice(tpf_status first, int *reached) {
  TPF_CHECK(fails_with(first));
  *reached = 1;
  return TPF_OK;
}
static tpf_status check_goto(tpf_status first, int *cleaned) {
  tpf_status rc = TPF_OK;
  TPF_CHECK_GOTO(fails_with(first), rc, out);
  rc = TPF_EBACKEND; /* not reached when first fails */
out:
  *cleaned = 1;
  return rc;
}

static void test_error_macros(void **state) {
  (void)state;
  int reached = 0, cleaned = 0;
  TPF_ASSERT_STATUS(check_twice(TPF_ENOMEM, &reached), TPF_ENOMEM);
  assert_int_equal(reached, 0);
  assert_string_equal(tpf_last_error(), "failed with TPF_ENOMEM");
  TPF_ASSERT_OK(check_twice(TPF_OK, &reached));
  assert_int_equal(reached, 1);
  TPF_ASSERT_STATUS(check_goto(TPF_ETIMEOUT, &cleaned), TPF_ETIMEOUT);
  assert_int_equal(cleaned, 1);
  assert_int_equal(TPF_ARRAY_SIZE(((int[5]){0})), 5);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_allocator_counts_as_live),
      cmocka_unit_test(test_struct_size),
      cmocka_unit_test(test_handles),
      cmocka_unit_test(test_checked_arithmetic),
      cmocka_unit_test(test_error_macros),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
