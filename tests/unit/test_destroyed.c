/* Every public call on a destroyed communicator, manager, simulator world or
 * fault wrapper is TPF_EINVAL saying it was destroyed (the value-returning calls give their
 * NULL value and set the same detail), double destroy included, and nothing freed is read: the
 * handle table (core/handle.c) answers before the object is touched, which the ASan build of
 * this test proves (it reported heap-use-after-free on the old code). */
#include "comm_internal.h"
#include "tpf_test.h"
#include "tpflex/tpflex_cost.h"
#include "tpflex/tpflex_fault.h"
#include "tpflex/tpflex_sim.h"

static void expect_destroyed(tpf_status st, const char *call, const char *name) {
  if (st != TPF_EINVAL)
    fail_msg("%s on a destroyed handle returned %s (%s), expected TPF_EINVAL", call,
             tpf_status_name(st), tpf_last_error());
  if (!strstr(tpf_last_error(), "destroyed") || !strstr(tpf_last_error(), call))
    fail_msg("%s: detail '%s' does not say the handle was destroyed", call, tpf_last_error());
  if (name && !strstr(tpf_last_error(), name))
    fail_msg("%s: detail '%s' does not name '%s'", call, tpf_last_error(), name);
}

/* The value-returning calls: the NULL value, and the detail. */
static void expect_detail(const char *call, const char *name) {
  expect_destroyed(TPF_EINVAL, call, name);
  tpf__clear_error();
}

static int every_comm_call(tpf_comm *c, const char *name) {
  int n = 0;
  static float buf[64];
  tpf_matrix m = {buf, 4, 4, 4, TPF_FP32};
  tpf_op_options o = TPF_OP_OPTIONS_INIT;
  tpf_shape sh = {8, 4};
  tpf_matrix v;
  void *base = NULL;
  uint64_t u = 0;
  tpf_status st = TPF_OK;
  tpf_plan_result pr;
#define CALL(expr, call)                                                                           \
  do {                                                                                             \
    tpf__clear_error();                                                                            \
    expect_destroyed((expr), call, name);                                                          \
    n++;                                                                                           \
  } while (0)
  CALL(tpf_comm_set_active_shape(c, sh), "set_active_shape");
  CALL(tpf_comm_buffer(c, &v), "tpf_comm_buffer");
  CALL(tpf_comm_local_chunk(c, &v), "tpf_comm_local_chunk");
  CALL(tpf_comm_legal_rows(c, 5, &u), "tpf_comm_legal_rows");
  CALL(tpf_comm_registration(c, &base, &u), "tpf_comm_registration");
  CALL(tpf_comm_sync(c), "tpf_comm_sync");
  CALL(tpf_comm_async_error(c, &st), "tpf_comm_async_error");
  CALL(tpf_comm_abort(c), "tpf_comm_abort");
  CALL(tpf_comm_plan_info(c, &pr), "tpf_comm_plan_info");
  CALL(tpf_ag_gemm(c, &m, &m, NULL), "tpf_ag_gemm");
  CALL(tpf_ag_gemm_ex(c, &m, &m, &o, NULL), "tpf_ag_gemm");
  CALL(tpf_gemm_rs(c, &m, &m, &m, NULL), "tpf_gemm_rs");
  CALL(tpf_gemm_rs_ex(c, &m, &m, &m, &o, NULL), "tpf_gemm_rs");
  CALL(tpf_bulk_overlap(c, &m, &m, &m, NULL), "tpf_bulk_overlap");
  CALL(tpf_bulk_overlap_ex(c, &m, &m, &m, &o, NULL), "tpf_bulk_overlap");
  CALL(tpf_comm_destroy(c), "tpf_comm_destroy"); /* double destroy */
  CALL(tpf_comm_destroy(c), "tpf_comm_destroy"); /* ... and again */
#undef CALL
  /* Value-returning calls. */
  tpf__clear_error();
  tpf_shape z = tpf_comm_active_shape(c);
  assert_true(z.rows == 0 && z.cols == 0);
  expect_detail("tpf_comm_active_shape", name);
  z = tpf_comm_capacity_shape(c);
  assert_true(z.rows == 0 && z.cols == 0);
  expect_detail("tpf_comm_capacity_shape", name);
  assert_int_equal(tpf_comm_epoch(c), 0);
  expect_detail("tpf_comm_epoch", name);
  assert_null(tpf_comm_config_of(c));
  expect_detail("tpf_comm_config_of", name);
  assert_null(tpf_comm_backend_name(c));
  expect_detail("tpf_comm_backend_name", name);
  assert_int_equal(tpf_comm_backend_caps(c), 0);
  expect_detail("tpf_comm_backend_caps", name);
  return n + 6;
}

static void test_destroyed__communicator(void **state) {
  (void)state;
  const size_t handles = tpf__handle_count();
  tpf_mock_backend be;
  tpf_mock_init(&be, 1, 0);
  const tpf_algo algos[] = {TPF_ALGO_RING, TPF_ALGO_RING, TPF_ALGO_BULK};
  const tpf_coll colls[] = {TPF_COLL_AG, TPF_COLL_RS, TPF_COLL_AG};
  const char *names[] = {"fc1_fprop", "fc2_fprop", "qkv_dgrad"};
  int calls = 0;
  for (int k = 0; k < 3; k++) {
    tpf_comm_config cfg = tpf_test_config(names[k], algos[k], colls[k], TPF_FP32, 16, 4);
    tpf_comm *c = NULL;
    TPF_ASSERT_OK(tpf_comm_create(&be.hdr, &cfg, &c));
    assert_int_equal(tpf__handle_count(), handles + 1);
    TPF_ASSERT_OK(tpf_comm_destroy(c));
    assert_int_equal(tpf__handle_count(), handles);
    calls += every_comm_call(c, names[k]);
  }
  print_message("%d calls on destroyed communicators refused\n", calls);
  /* A pointer that was never a communicator is refused the same way. */
  int not_a_comm = 0;
  TPF_ASSERT_STATUS(tpf_comm_sync((tpf_comm *)(void *)&not_a_comm), TPF_EINVAL);
  assert_non_null(strstr(tpf_last_error(), "not a live communicator"));
  TPF_ASSERT_STATUS(tpf_comm_destroy(NULL), TPF_EINVAL);
  assert_non_null(strstr(tpf_last_error(), "NULL"));
}

static void test_destroyed__manager(void **state) {
  (void)state;
  tpf_mock_backend be;
  tpf_mock_init(&be, 1, 0);
  tpf_manager *m = NULL;
  TPF_ASSERT_OK(tpf_manager_create(&be.hdr, &m));
  tpf_comm_config cfg = tpf_test_config("fc1_fprop", TPF_ALGO_RING, TPF_COLL_AG, TPF_FP32, 16, 4);
  tpf_comm *c = NULL, *got = NULL;
  TPF_ASSERT_OK(tpf_manager_add(m, &cfg, &c));
  /* tpf_comm_destroy of a managed communicator takes it out of its manager, so the manager
   * never holds a destroyed pointer (the recovery path of test_manager's canary case). */
  tpf_comm_config cfg2 = cfg;
  cfg2.name = "fc2_fprop";
  tpf_comm *c2 = NULL;
  TPF_ASSERT_OK(tpf_manager_add(m, &cfg2, &c2));
  TPF_ASSERT_OK(tpf_comm_destroy(c2));
  assert_int_equal(tpf_manager_count(m), 1);
  TPF_ASSERT_STATUS(tpf_manager_get(m, "fc2_fprop", &got), TPF_EINVAL);
  TPF_ASSERT_OK(tpf_manager_set_active_shape(m, (tpf_shape){8, 4}));
  assert_int_equal(tpf_comm_active_shape(c).rows, 8);
  every_comm_call(c2, "fc2_fprop");
  TPF_ASSERT_OK(tpf_manager_destroy(m));
  got = NULL;
  expect_destroyed(tpf_manager_add(m, &cfg, &got), "tpf_manager_add", NULL);
  expect_destroyed(tpf_manager_get(m, "fc1_fprop", &got), "tpf_manager_get", NULL);
  expect_destroyed(tpf_manager_at(m, 0, &got), "tpf_manager_at", NULL);
  expect_destroyed(tpf_manager_set_active_shape(m, (tpf_shape){8, 4}),
                   "tpf_manager_set_active_shape", NULL);
  expect_destroyed(tpf_manager_destroy(m), "tpf_manager_destroy", NULL);
  tpf__clear_error();
  assert_int_equal(tpf_manager_count(m), 0);
  expect_detail("tpf_manager_count", NULL);
  assert_null(got);
  /* Its communicators went with it. */
  every_comm_call(c, "fc1_fprop");
}

static void test_destroyed__world_and_fault_wrapper(void **state) {
  (void)state;
  tpf_sim_config sc = TPF_SIM_CONFIG_INIT;
  sc.tp_size = 2;
  tpf_sim_world *w = NULL;
  TPF_ASSERT_OK(tpf_sim_world_create(&sc, &w));
  TPF_ASSERT_OK(tpf_sim_world_destroy(w));
  tpf_sim_stats stats;
  tpf_sim_fault f;
  memset(&f, 0, sizeof f);
  tpf_sim_fault_ex fx;
  memset(&fx, 0, sizeof fx);
  tpf_sim_fault_report rep;
  expect_destroyed(tpf_sim_world_destroy(w), "tpf_sim_world_destroy", NULL);
  expect_destroyed(tpf_sim_run(w, NULL, NULL), "tpf_sim_run", NULL);
  expect_destroyed(tpf_sim_set_trace(w, NULL, NULL), "tpf_sim_set_trace", NULL);
  expect_destroyed(tpf_sim_get_stats(w, &stats), "tpf_sim_get_stats", NULL);
  expect_destroyed(tpf_sim_set_fault(w, &f), "tpf_sim_set_fault", NULL);
  expect_destroyed(tpf_sim_set_fault_ex(w, &fx), "tpf_sim_set_fault_ex", NULL);
  expect_destroyed(tpf_sim_get_fault_report(w, &rep), "tpf_sim_get_fault_report", NULL);
  assert_int_equal(tpf_sim_elapsed_ns(w), 0);

  tpf_mock_backend be;
  tpf_mock_init(&be, 1, 0);
  tpf_backend *fb = NULL;
  TPF_ASSERT_OK(tpf_fault_backend_create(&be.hdr, NULL, &fb));
  TPF_ASSERT_OK(tpf_fault_backend_destroy(fb));
  tpf_fault_report fr;
  expect_destroyed(tpf_fault_backend_destroy(fb), "tpf_fault_backend_destroy", NULL);
  expect_destroyed(tpf_fault_backend_report(fb, &fr), "tpf_fault_backend_report", NULL);
  expect_destroyed(tpf_fault_backend_set_plan(fb, NULL), "tpf_fault_backend_set_plan", NULL);
  /* A live backend that is not a wrapper is still told so. */
  TPF_ASSERT_STATUS(tpf_fault_backend_destroy(&be.hdr), TPF_EINVAL);
  assert_non_null(strstr(tpf_last_error(), "not a fault wrapper"));
}

/* The table itself: many live handles of several kinds, removed in another order, each
 * looked up after every removal (the backward-shift deletion keeps every probe run intact). */
static void test_destroyed__table_grows_and_shrinks(void **state) {
  (void)state;
  enum { N = 1000 };
  static char objs[N];
  const size_t before = tpf__handle_count();
  for (int i = 0; i < N; i++)
    TPF_ASSERT_OK(tpf__handle_add(&objs[i], i % 2 ? TPF_HANDLE_COMM : TPF_HANDLE_MANAGER));
  assert_int_equal(tpf__handle_count(), before + N);
  for (int i = 0; i < N; i++)
    assert_true(tpf__handle_live(&objs[i], i % 2 ? TPF_HANDLE_COMM : TPF_HANDLE_MANAGER));
  assert_false(tpf__handle_live(&objs[1], TPF_HANDLE_MANAGER)); /* the kind is checked too */
  for (int k = 0; k < N; k++) {
    const int i = (k * 7919) % N; /* a permutation: 7919 is prime and does not divide N */
    tpf__handle_remove(&objs[i], NULL);
    assert_false(tpf__handle_live(&objs[i], i % 2 ? TPF_HANDLE_COMM : TPF_HANDLE_MANAGER));
    if (k % 97 == 0)
      for (int j = 0; j < N; j++) {
        bool gone = false;
        for (int q = 0; q <= k && !gone; q++)
          gone = (q * 7919) % N == j;
        if (tpf__handle_live(&objs[j], j % 2 ? TPF_HANDLE_COMM : TPF_HANDLE_MANAGER) == gone)
          fail_msg("after %d removals: object %d live=%d, removed=%d", k + 1, j, !gone, gone);
      }
  }
  assert_int_equal(tpf__handle_count(), before);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_destroyed__communicator),
      cmocka_unit_test(test_destroyed__manager),
      cmocka_unit_test(test_destroyed__world_and_fault_wrapper),
      cmocka_unit_test(test_destroyed__table_grows_and_shrinks),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
