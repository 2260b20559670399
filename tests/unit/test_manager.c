/* The manager: lookup by name, one shape for every eligible communicator, all-or-nothing. */
#include "tpf_test.h"

enum { P = 2, H = 64 };

static tpf_comm_config cfg_of(const char *name, tpf_algo a, tpf_coll k, tpf_dtype t, uint64_t c) {
  return tpf_test_config(name, a, k, t, c, H);
}

typedef struct {
  tpf_mock_backend be;
  tpf_manager *m;
} fixture;

/* TransformerEngine's default sites (te-userbuffers §8), plus one fp8 and one external. */
static int setup(void **state) {
  fixture *f = calloc(1, sizeof *f);
  tpf_mock_init(&f->be, P, 0);
  if (tpf_manager_create(&f->be.hdr, &f->m) != TPF_OK) return -1;
  const tpf_comm_config cfgs[] = {
      cfg_of("qkv_fprop", TPF_ALGO_RING, TPF_COLL_AG, TPF_BF16, 128),
      cfg_of("proj_fprop", TPF_ALGO_PIPELINE, TPF_COLL_RS, TPF_BF16, 128),
      cfg_of("fc1_dgrad", TPF_ALGO_BULK, TPF_COLL_AG, TPF_BF16, 128),
      cfg_of("fc1_wgrad", TPF_ALGO_BULK, TPF_COLL_RS, TPF_BF16, 64),
      cfg_of("fc2_fprop_fp8", TPF_ALGO_RING, TPF_COLL_RS, TPF_FP8_E4M3, 128),
  };
  for (size_t i = 0; i < TPF_ARRAY_SIZE(cfgs); i++)
    if (tpf_manager_add(f->m, &cfgs[i], NULL) != TPF_OK) return -1;
  tpf_comm_config ext = cfg_of("proj_wgrad", TPF_ALGO_BULK, TPF_COLL_AG, TPF_BF16, 128);
  ext.external = true;
  if (tpf_manager_add(f->m, &ext, NULL) != TPF_OK) return -1;
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fixture *f = *state;
  int rc = tpf_manager_destroy(f->m) == TPF_OK && f->be.reg_live == 0 ? 0 : -1;
  free(f);
  return rc;
}

static uint64_t rows_of(tpf_manager *m, const char *name) {
  tpf_comm *c = NULL;
  if (tpf_manager_get(m, name, &c) != TPF_OK) return 0;
  return tpf_comm_active_shape(c).rows;
}

static void test_manager__lookup_by_name(void **state) {
  fixture *f = *state;
  tpf_comm *c = NULL;
  TPF_ASSERT_OK(tpf_manager_get(f->m, "proj_fprop", &c));
  assert_string_equal(tpf_comm_config_of(c)->name, "proj_fprop");
  c = NULL;
  TPF_ASSERT_STATUS(tpf_manager_get(f->m, "nope", &c), TPF_EINVAL);
  assert_null(c);
  assert_non_null(strstr(tpf_last_error(), "nope"));
  assert_int_equal(tpf_manager_count(f->m), 6);
  tpf_comm_config dup = cfg_of("qkv_fprop", TPF_ALGO_RING, TPF_COLL_AG, TPF_BF16, 128);
  TPF_ASSERT_STATUS(tpf_manager_add(f->m, &dup, NULL), TPF_EINVAL);
  assert_int_equal(tpf_manager_count(f->m), 6);
  assert_int_equal(f->be.reg_total, 6); /* one registration per communicator, ever */
}

static void test_manager__applies_to_eligible_only(void **state) {
  fixture *f = *state;
  tpf_shape s = {40, H};
  TPF_ASSERT_OK(tpf_manager_set_active_shape(f->m, s));
  assert_int_equal(rows_of(f->m, "qkv_fprop"), 40);
  assert_int_equal(rows_of(f->m, "proj_fprop"), 40);
  assert_int_equal(rows_of(f->m, "fc1_dgrad"), 40);
  assert_int_equal(rows_of(f->m, "fc1_wgrad"), 40);
  assert_int_equal(rows_of(f->m, "fc2_fprop_fp8"), 40); /* fp8 follows the shape (SPEC §11) */
  assert_int_equal(rows_of(f->m, "proj_wgrad"), 128);   /* external: capacity */
  assert_int_equal(f->be.reg_total, 6);
}

static void test_manager__set_allocates_nothing(void **state) {
  fixture *f = *state;
  long live = tpf__alloc_live_count();
  tpf__alloc_set_budget(0); /* any allocation would fail */
  tpf_shape s = {24, H};
  tpf_status rc = tpf_manager_set_active_shape(f->m, s);
  tpf__alloc_set_budget(-1);
  TPF_ASSERT_STATUS(rc, TPF_OK);
  assert_int_equal(tpf__alloc_live_count(), live);
  assert_int_equal(rows_of(f->m, "qkv_fprop"), 24);
}

static void test_manager__all_or_nothing(void **state) {
  fixture *f = *state;
  tpf_shape ok = {32, H};
  TPF_ASSERT_OK(tpf_manager_set_active_shape(f->m, ok));
  int acts = f->be.activations;
  /* 96 fits every capacity but fc1_wgrad's (64): nothing may change. */
  tpf_shape big = {96, H};
  TPF_ASSERT_STATUS(tpf_manager_set_active_shape(f->m, big), TPF_ECAPACITY);
  assert_non_null(strstr(tpf_last_error(), "fc1_wgrad"));
  assert_int_equal(rows_of(f->m, "qkv_fprop"), 32);
  assert_int_equal(rows_of(f->m, "proj_fprop"), 32);
  assert_int_equal(rows_of(f->m, "fc1_wgrad"), 32);
  assert_int_equal(f->be.activations, acts);
  tpf_shape odd = {33, H};
  TPF_ASSERT_STATUS(tpf_manager_set_active_shape(f->m, odd), TPF_EDIVISIBLE);
  assert_int_equal(rows_of(f->m, "qkv_fprop"), 32);
}

static void test_manager__backend_refusal_rolls_back(void **state) {
  fixture *f = *state;
  tpf_shape a = {16, H};
  TPF_ASSERT_OK(tpf_manager_set_active_shape(f->m, a));
  /* The third activation of the next change fails: the two before it must be undone. */
  f->be.fail_activate = TPF_EBACKEND;
  f->be.fail_activate_at = f->be.activate_calls + 2;
  tpf_shape b = {48, H};
  TPF_ASSERT_STATUS(tpf_manager_set_active_shape(f->m, b), TPF_EBACKEND);
  f->be.fail_activate = TPF_OK;
  assert_int_equal(rows_of(f->m, "qkv_fprop"), 16);
  assert_int_equal(rows_of(f->m, "proj_fprop"), 16);
  assert_int_equal(rows_of(f->m, "fc1_dgrad"), 16);
  assert_int_equal(f->be.last_active_bytes, 16 * H * 2); /* backend told the old prefix again */
}

static void test_manager__null_arguments(void **state) {
  (void)state;
  tpf_shape s = {2, H};
  tpf_comm *c;
  TPF_ASSERT_STATUS(tpf_manager_create(NULL, NULL), TPF_EINVAL);
  TPF_ASSERT_STATUS(tpf_manager_set_active_shape(NULL, s), TPF_EINVAL);
  TPF_ASSERT_STATUS(tpf_manager_get(NULL, "x", &c), TPF_EINVAL);
  TPF_ASSERT_STATUS(tpf_manager_add(NULL, NULL, &c), TPF_EINVAL);
  TPF_ASSERT_STATUS(tpf_manager_destroy(NULL), TPF_EINVAL);
  TPF_ASSERT_STATUS(tpf_manager_at(NULL, 0, &c), TPF_EINVAL);
  assert_int_equal(tpf_manager_count(NULL), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_manager__lookup_by_name, setup, teardown),
      cmocka_unit_test_setup_teardown(test_manager__applies_to_eligible_only, setup, teardown),
      cmocka_unit_test_setup_teardown(test_manager__set_allocates_nothing, setup, teardown),
      cmocka_unit_test_setup_teardown(test_manager__all_or_nothing, setup, teardown),
      cmocka_unit_test_setup_teardown(test_manager__backend_refusal_rolls_back, setup, teardown),
      cmocka_unit_test(test_manager__null_arguments),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
