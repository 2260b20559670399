/* tpf_layout_legal_rows / tpf_comm_legal_rows: the answer equals a brute-force search over every
 * row count with the validator set_active_shape uses, for every algorithm, dtype and small P, H. */
#include "tpf_test.h"

/* The smallest t' >= t (t 0 counts as 1) that tpf_layout_check accepts, or 0 when none <= C. */
static uint64_t brute(tpf_layout_desc d, uint64_t t) {
  if (t == 0) t = 1;
  for (uint64_t r = t; r <= d.capacity.rows; r++) {
    d.active.rows = r;
    if (tpf_layout_check(&d) == TPF_OK) return r;
  }
  return 0;
}

static void test_matches_brute_force(void **state) {
  (void)state;
  const tpf_algo algos[] = {TPF_ALGO_RING, TPF_ALGO_RING, TPF_ALGO_PIPELINE, TPF_ALGO_BULK,
                            TPF_ALGO_BULK};
  const tpf_coll colls[] = {TPF_COLL_AG, TPF_COLL_RS, TPF_COLL_RS, TPF_COLL_AG, TPF_COLL_RS};
  const tpf_dtype dtypes[] = {TPF_BF16, TPF_FP32, TPF_FP8_E4M3};
  const uint64_t hs[] = {1, 3, 4, 8, 12};
  long checked = 0, legal = 0;
  for (int p = 1; p <= 8; p++)
    for (size_t a = 0; a < TPF_ARRAY_SIZE(algos); a++)
      for (size_t t = 0; t < TPF_ARRAY_SIZE(dtypes); t++)
        for (size_t h = 0; h < TPF_ARRAY_SIZE(hs); h++) {
          tpf_layout_desc d;
          memset(&d, 0, sizeof d);
          d.tp_size = p;
          d.algo = algos[a];
          d.coll = colls[a];
          d.dtype = dtypes[t];
          d.capacity.rows = (uint64_t)p * 64;
          d.capacity.cols = hs[h];
          d.active = d.capacity;
          d.num_splits = d.algo == TPF_ALGO_PIPELINE && hs[h] % 4 == 0 ? 4 : 0;
          if (d.algo == TPF_ALGO_PIPELINE && hs[h] % 4 != 0) d.num_splits = 1;
          bool cap_ok = tpf_layout_check(&d) == TPF_OK;
          for (uint64_t want = 0; want <= d.capacity.rows + 1; want++) {
            uint64_t got = 0, expect = cap_ok ? brute(d, want) : 0;
            tpf_status s = tpf_layout_legal_rows(&d, want, &got);
            checked++;
            if (expect == 0) {
              if (s == TPF_OK)
                fail_msg("P=%d %s %s %s H=%llu want %llu: got %llu, expected a failure", p,
                         tpf_algo_name(d.algo), tpf_coll_name(d.coll), tpf_dtype_name(d.dtype),
                         (unsigned long long)hs[h], (unsigned long long)want,
                         (unsigned long long)got);
              assert_int_equal(got, 0); /* out untouched on failure */
              assert_true(strlen(tpf_last_error()) > 0);
            } else {
              legal++;
              if (s != TPF_OK || got != expect)
                fail_msg("P=%d %s %s %s H=%llu want %llu: got %llu (%s: %s), expected %llu", p,
                         tpf_algo_name(d.algo), tpf_coll_name(d.coll), tpf_dtype_name(d.dtype),
                         (unsigned long long)hs[h], (unsigned long long)want,
                         (unsigned long long)got, tpf_status_name(s), tpf_last_error(),
                         (unsigned long long)expect);
            }
          }
        }
  printf("legal rows: %ld queries, %ld with an answer, all equal to the brute-force search\n",
         checked, legal);
}

static void test_examples_and_errors(void **state) {
  (void)state;
  tpf_layout_desc d;
  memset(&d, 0, sizeof d);
  d.tp_size = 8;
  d.algo = TPF_ALGO_RING;
  d.coll = TPF_COLL_AG;
  d.dtype = TPF_BF16;
  d.capacity = (tpf_shape){4096, 4};
  d.active = d.capacity;
  uint64_t t = 0;
  TPF_ASSERT_OK(tpf_layout_legal_rows(&d, 1000, &t));
  assert_int_equal(t, 1008); /* 125 rows per rank * 4 * 2 bytes = 1000 bytes: not 16-aligned */
  TPF_ASSERT_STATUS(tpf_layout_legal_rows(&d, 4097, &t), TPF_ECAPACITY);
  assert_non_null(strstr(tpf_last_error(), "4097"));
  assert_non_null(strstr(tpf_last_error(), "4096"));
  TPF_ASSERT_STATUS(tpf_layout_legal_rows(NULL, 1, &t), TPF_EINVAL);
  TPF_ASSERT_STATUS(tpf_layout_legal_rows(&d, 1, NULL), TPF_EINVAL);
  d.capacity.rows = 4095; /* an illegal capacity is reported as such */
  TPF_ASSERT_STATUS(tpf_layout_legal_rows(&d, 1, &t), TPF_EDIVISIBLE);
}

static void test_comm(void **state) {
  (void)state;
  tpf_mock_backend be;
  tpf_mock_init(&be, 4, 1);
  tpf_comm_config cfg = tpf_test_config("fc1_fprop", TPF_ALGO_RING, TPF_COLL_AG, TPF_BF16, 64, 8);
  tpf_comm *c = NULL;
  TPF_ASSERT_OK(tpf_comm_create(&be.hdr, &cfg, &c));
  uint64_t t = 0;
  TPF_ASSERT_OK(tpf_comm_legal_rows(c, 5, &t));
  assert_int_equal(t, 8);
  TPF_ASSERT_OK(tpf_comm_set_active_shape(c, (tpf_shape){t, 8}));
  TPF_ASSERT_STATUS(tpf_comm_legal_rows(c, 65, &t), TPF_ECAPACITY);
  TPF_ASSERT_STATUS(tpf_comm_legal_rows(NULL, 1, &t), TPF_EINVAL);
  /* a NULL out-pointer is refused (it used to be written through) */
  TPF_ASSERT_STATUS(tpf_comm_legal_rows(c, 5, NULL), TPF_EINVAL);
  assert_non_null(strstr(tpf_last_error(), "NULL"));
  assert_non_null(strstr(tpf_last_error(), "fc1_fprop"));
  TPF_ASSERT_OK(tpf_comm_destroy(c));
  cfg.external = true;
  TPF_ASSERT_OK(tpf_comm_create(&be.hdr, &cfg, &c));
  TPF_ASSERT_OK(tpf_comm_legal_rows(c, 5, &t));
  assert_int_equal(t, 64);
  TPF_ASSERT_OK(tpf_comm_destroy(c));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_matches_brute_force),
      cmocka_unit_test(test_examples_and_errors),
      cmocka_unit_test(test_comm),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
