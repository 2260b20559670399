/* The communicator state machine on a mock backend: registration once at capacity, shape
 * changes that allocate nothing and change nothing on failure, operand checks, and the failed
 * state after a timeout. */
#include "tpf_test.h"

enum { P = 4, C = 64, H = 32 };

typedef struct {
  tpf_mock_backend be;
  tpf_comm *c;
} fixture;

static tpf_comm_config cfg_of(tpf_algo a, tpf_coll k, tpf_dtype t) {
  return tpf_test_config("fc1_fprop", a, k, t, C, H);
}

static int setup_ring_ag(void **state) {
  fixture *f = calloc(1, sizeof *f);
  tpf_mock_init(&f->be, P, 1);
  tpf_comm_config cfg = cfg_of(TPF_ALGO_RING, TPF_COLL_AG, TPF_BF16);
  if (tpf_comm_create(&f->be.hdr, &cfg, &f->c) != TPF_OK) return -1;
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fixture *f = *state;
  int rc = tpf_comm_destroy(f->c) == TPF_OK && f->be.reg_live == 0 ? 0 : -1;
  free(f);
  return rc;
}

static void test_comm__registers_once_at_capacity(void **state) {
  fixture *f = *state;
  void *base = NULL;
  uint64_t bytes = 0;
  TPF_ASSERT_OK(tpf_comm_registration(f->c, &base, &bytes));
  assert_int_equal(bytes, (uint64_t)C * H * 2);
  assert_int_equal(f->be.reg_total, 1);
  tpf_shape a = tpf_comm_active_shape(f->c);
  assert_int_equal(a.rows, C);
  assert_int_equal(a.cols, H);
  assert_int_equal(tpf_comm_epoch(f->c), 0);
  for (uint64_t t = P; t <= C; t += P) {
    tpf_shape s = {t, H};
    TPF_ASSERT_OK(tpf_comm_set_active_shape(f->c, s));
    assert_int_equal(f->be.last_active_bytes, t * H * 2);
  }
  assert_int_equal(f->be.reg_total, 1); /* never re-registered */
  assert_int_equal(tpf_comm_epoch(f->c), C / P);
}

static void test_comm__set_active_shape_allocates_nothing(void **state) {
  fixture *f = *state;
  long live = tpf__alloc_live_count();
  tpf__alloc_set_budget(0); /* any allocation would now fail */
  tpf_shape s = {8, H};
  tpf_status rc = tpf_comm_set_active_shape(f->c, s);
  tpf__alloc_set_budget(-1);
  TPF_ASSERT_STATUS(rc, TPF_OK);
  assert_int_equal(tpf__alloc_live_count(), live);
}

typedef struct {
  uint64_t rows, cols;
  tpf_status want;
  const char *needle; /* must appear in the detail */
} bad_shape;

static void test_comm__bad_shapes_change_nothing(void **state) {
  fixture *f = *state;
  tpf_shape keep = {16, H};
  TPF_ASSERT_OK(tpf_comm_set_active_shape(f->c, keep));
  uint64_t epoch = tpf_comm_epoch(f->c);
  int acts = f->be.activations;
  const bad_shape cases[] = {
      {C + P, H, TPF_ECAPACITY, "68"}, /* T = C + P */
      {10, H, TPF_EDIVISIBLE, "10"},   /* T % P != 0 */
      {16, H + 8, TPF_ESHAPE, "40"},   /* cols != H */
      {0, H, TPF_ESHAPE, "fc1_fprop"}, /* T = 0 */
      {16, 0, TPF_ESHAPE, "fc1_fprop"},
  };
  for (size_t i = 0; i < TPF_ARRAY_SIZE(cases); i++) {
    tpf_shape s = {cases[i].rows, cases[i].cols};
    TPF_ASSERT_STATUS(tpf_comm_set_active_shape(f->c, s), cases[i].want);
    if (!strstr(tpf_last_error(), cases[i].needle))
      fail_msg("case %zu: detail '%s' lacks '%s'", i, tpf_last_error(), cases[i].needle);
    tpf_shape a = tpf_comm_active_shape(f->c);
    assert_int_equal(a.rows, keep.rows);
    assert_int_equal(a.cols, keep.cols);
    assert_int_equal(tpf_comm_epoch(f->c), epoch);
    assert_int_equal(f->be.activations, acts);
  }
  TPF_ASSERT_STATUS(tpf_comm_set_active_shape(NULL, keep), TPF_EINVAL);
}

static void test_comm__views_follow_the_active_shape(void **state) {
  fixture *f = *state;
  tpf_shape s = {24, H};
  TPF_ASSERT_OK(tpf_comm_set_active_shape(f->c, s));
  void *base;
  uint64_t bytes;
  TPF_ASSERT_OK(tpf_comm_registration(f->c, &base, &bytes));
  tpf_matrix full, local;
  TPF_ASSERT_OK(tpf_comm_buffer(f->c, &full));
  assert_ptr_equal(full.ptr, base);
  assert_int_equal(full.rows, 24);
  assert_int_equal(full.ld, H);
  TPF_ASSERT_OK(tpf_comm_local_chunk(f->c, &local));
  /* rank 1 of 4: chunk 1 of the packed layout starts at 1 * (24/4) * H * 2 bytes */
  assert_ptr_equal(local.ptr, (char *)base + 6 * H * 2);
  assert_int_equal(local.rows, 6);
}

static void test_comm__operations_keep_their_shape_and_check_operands(void **state) {
  fixture *f = *state;
  enum { N = 16 };
  static uint16_t w[N * H], d[C * N];
  tpf_matrix mw = {w, N, H, H, TPF_BF16};
  tpf_matrix md = {d, 32, N, N, TPF_BF16};
  tpf_shape s = {32, H};
  TPF_ASSERT_OK(tpf_comm_set_active_shape(f->c, s));
  TPF_ASSERT_OK(tpf_ag_gemm(f->c, &mw, &md, NULL));
  assert_int_equal(f->be.last_seq, 1);
  assert_int_equal(f->be.last_sched.rows, 32);
  assert_int_equal(f->be.last_sched.chunk_bytes, 8 * H * 2);
  assert_int_equal(f->be.last_sched.gemm_n, N);

  /* Wrong output rows for the active shape. */
  md.rows = 28;
  TPF_ASSERT_STATUS(tpf_ag_gemm(f->c, &mw, &md, NULL), TPF_ESHAPE);
  assert_non_null(strstr(tpf_last_error(), "expected [32, 16]"));
  md.rows = 32;
  /* Wrong dtype, NULL pointer, bad ld. */
  mw.dtype = TPF_FP16;
  TPF_ASSERT_STATUS(tpf_ag_gemm(f->c, &mw, &md, NULL), TPF_EINVAL);
  mw.dtype = TPF_BF16;
  md.ptr = NULL;
  TPF_ASSERT_STATUS(tpf_ag_gemm(f->c, &mw, &md, NULL), TPF_EINVAL);
  md.ptr = d;
  md.ld = N - 1;
  TPF_ASSERT_STATUS(tpf_ag_gemm(f->c, &mw, &md, NULL), TPF_ESHAPE);
  md.ld = N;
  /* Wrong operation for the communicator. */
  TPF_ASSERT_STATUS(tpf_gemm_rs(f->c, &md, &mw, &md, NULL), TPF_EUNSUPPORTED);
  TPF_ASSERT_STATUS(tpf_bulk_overlap(f->c, &md, &mw, &md, NULL), TPF_EUNSUPPORTED);
  assert_int_equal(f->be.executions, 1); /* none of the rejected calls reached the backend */

  /* After a shape change the next operation uses the new shape. */
  s.rows = 8;
  TPF_ASSERT_OK(tpf_comm_set_active_shape(f->c, s));
  md.rows = 8;
  TPF_ASSERT_OK(tpf_ag_gemm(f->c, &mw, &md, NULL));
  assert_int_equal(f->be.last_sched.rows, 8);
  assert_int_equal(f->be.last_seq, 2);
}

static void test_comm__timeout_leaves_it_failed_mismatch_does_not(void **state) {
  fixture *f = *state;
  enum { N = 8 };
  static uint16_t w[N * H], d[C * N];
  tpf_matrix mw = {w, N, H, H, TPF_BF16};
  tpf_matrix md = {d, C, N, N, TPF_BF16};
  f->be.fail_execute = TPF_EMISMATCH;
  TPF_ASSERT_STATUS(tpf_ag_gemm(f->c, &mw, &md, NULL), TPF_EMISMATCH);
  f->be.fail_execute = TPF_OK;
  TPF_ASSERT_OK(tpf_ag_gemm(f->c, &mw, &md, NULL));
  f->be.fail_execute = TPF_ETIMEOUT;
  TPF_ASSERT_STATUS(tpf_ag_gemm(f->c, &mw, &md, NULL), TPF_ETIMEOUT);
  f->be.fail_execute = TPF_OK;
  TPF_ASSERT_STATUS(tpf_ag_gemm(f->c, &mw, &md, NULL), TPF_ESTATE);
  assert_non_null(strstr(tpf_last_error(), "TPF_ETIMEOUT"));
  tpf_shape s = {8, H};
  TPF_ASSERT_STATUS(tpf_comm_set_active_shape(f->c, s), TPF_ESTATE);
}

/* fp8 communicators follow the active shape like any other (SPEC §11); external ones stay. */
static void test_comm__fp8_follows_and_external_stays_at_capacity(void **state) {
  (void)state;
  tpf_mock_backend be;
  tpf_mock_init(&be, P, 0);
  tpf_comm_config q = cfg_of(TPF_ALGO_RING, TPF_COLL_AG, TPF_FP8_E4M3);
  q.capacity.cols = 64; /* fp8: 16-byte chunks need (C/P)*H multiple of 16 */
  tpf_comm_config x = cfg_of(TPF_ALGO_BULK, TPF_COLL_RS, TPF_BF16);
  x.external = true;
  tpf_comm *cq, *cx;
  TPF_ASSERT_OK(tpf_comm_create(&be.hdr, &q, &cq));
  TPF_ASSERT_OK(tpf_comm_create(&be.hdr, &x, &cx));
  tpf_shape s = {16, 64};
  TPF_ASSERT_OK(tpf_comm_set_active_shape(cq, s));
  assert_int_equal(tpf_comm_active_shape(cq).rows, 16);
  uint64_t legal = 0; /* 1-byte elements: 1 row of 64 per rank is a 64-byte chunk */
  TPF_ASSERT_OK(tpf_comm_legal_rows(cq, 1, &legal));
  assert_int_equal(legal, P);
  s.rows = C;
  TPF_ASSERT_OK(tpf_comm_set_active_shape(cq, s));
  s.cols = H;
  TPF_ASSERT_STATUS(tpf_comm_set_active_shape(cx, s), TPF_EUNSUPPORTED);
  assert_non_null(strstr(tpf_last_error(), "external"));
  assert_int_equal(tpf_comm_active_shape(cq).rows, C);
  assert_int_equal(tpf_comm_active_shape(cx).rows, C);
  TPF_ASSERT_OK(tpf_comm_destroy(cq));
  TPF_ASSERT_OK(tpf_comm_destroy(cx));
  assert_int_equal(be.reg_live, 0);
}

/* SPEC §3 checks its rules in order and the first that fails decides: "not external" is the
 * last rule, so a shape an external communicator could never take for an earlier reason gets
 * that reason's status (it used to be TPF_EUNSUPPORTED whatever the shape). Nothing changes. */
static void test_comm__external_after_the_earlier_shape_rules(void **state) {
  (void)state;
  tpf_mock_backend be;
  tpf_mock_init(&be, P, 0);
  tpf_comm_config x = cfg_of(TPF_ALGO_BULK, TPF_COLL_AG, TPF_BF16);
  x.external = true;
  tpf_comm *cx = NULL;
  TPF_ASSERT_OK(tpf_comm_create(&be.hdr, &x, &cx));
  const struct {
    tpf_shape s;
    tpf_status want;
  } cases[] = {{{0, H}, TPF_ESHAPE},
               {{8, H + 1}, TPF_ESHAPE},
               {{C + P, H}, TPF_ECAPACITY},
               {{P + 1, H}, TPF_EDIVISIBLE},
               {{P, H}, TPF_EUNSUPPORTED}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const tpf_status st = tpf_comm_set_active_shape(cx, cases[i].s);
    if (st != cases[i].want)
      fail_msg("external communicator, shape [%llu, %llu]: %s (%s), expected %s",
               (unsigned long long)cases[i].s.rows, (unsigned long long)cases[i].s.cols,
               tpf_status_name(st), tpf_last_error(), tpf_status_name(cases[i].want));
    assert_int_equal(tpf_comm_active_shape(cx).rows, C);
    assert_int_equal(tpf_comm_epoch(cx), 0);
  }
  assert_non_null(strstr(tpf_last_error(), "external"));
  TPF_ASSERT_OK(tpf_comm_destroy(cx));
  assert_int_equal(be.reg_live, 0);
}

static void test_comm__bad_configs_are_rejected(void **state) {
  (void)state;
  tpf_mock_backend be;
  tpf_mock_init(&be, P, 0);
  tpf_comm *c = (tpf_comm *)0x1;
  tpf_comm_config cfg = cfg_of(TPF_ALGO_RING, TPF_COLL_RS, TPF_BF16);
  cfg.capacity.rows = 62; /* C % P != 0 */
  TPF_ASSERT_STATUS(tpf_comm_create(&be.hdr, &cfg, &c), TPF_EDIVISIBLE);
  assert_ptr_equal(c, (tpf_comm *)0x1); /* out untouched on failure */
  cfg.capacity.rows = C;
  cfg.algo = (tpf_algo)7;
  TPF_ASSERT_STATUS(tpf_comm_create(&be.hdr, &cfg, &c), TPF_EINVAL);
  cfg.algo = TPF_ALGO_RING;
  cfg.name = NULL;
  TPF_ASSERT_STATUS(tpf_comm_create(&be.hdr, &cfg, &c), TPF_EINVAL);
  cfg.name = "x";
  TPF_ASSERT_STATUS(tpf_comm_create(NULL, &cfg, &c), TPF_EINVAL);
  TPF_ASSERT_STATUS(tpf_comm_create(&be.hdr, NULL, &c), TPF_EINVAL);
  be.fail_reg_after = 0;
  TPF_ASSERT_STATUS(tpf_comm_create(&be.hdr, &cfg, &c), TPF_EBACKEND);
  assert_int_equal(be.reg_live, 0);
  assert_ptr_equal(c, (tpf_comm *)0x1);
}

/* Allocator-budget loop (libuv's OOM test): fail the k-th allocation for every k until the whole
 * sequence succeeds; every failure is a clean TPF_ENOMEM and nothing leaks. */
static void test_comm__allocator_budget_loop(void **state) {
  (void)state;
  long base = tpf__alloc_live_count();
  int failures = 0;
  for (long k = 0; k < 1000; k++) {
    tpf_mock_backend be;
    tpf_mock_init(&be, P, 2);
    tpf_comm_config cfg = cfg_of(TPF_ALGO_PIPELINE, TPF_COLL_RS, TPF_BF16);
    tpf_manager *m = NULL;
    tpf_comm *c = NULL;
    tpf__alloc_set_budget(k);
    tpf_status rc = tpf_manager_create(&be.hdr, &m);
    if (rc == TPF_OK) {
      rc = tpf_manager_add(m, &cfg, &c);
      if (rc == TPF_OK) {
        tpf_shape s = {32, H};
        rc = tpf_manager_set_active_shape(m, s);
      }
      if (rc == TPF_OK) {
        static uint16_t x[C * 8], w[H * 8], o[C * H];
        tpf_matrix mx = {x, 32, 8, 8, TPF_BF16}, mw = {w, H, 8, 8, TPF_BF16};
        tpf_matrix mo = {o, 8, H, H, TPF_BF16};
        rc = tpf_gemm_rs(c, &mx, &mw, &mo, NULL);
      }
      tpf__alloc_set_budget(-1);
      TPF_ASSERT_OK(tpf_manager_destroy(m));
    }
    tpf__alloc_set_budget(-1);
    assert_int_equal(tpf__alloc_live_count(), base);
    assert_int_equal(be.reg_live, 0);
    if (rc == TPF_OK) {
      print_message("allocator budget loop: %d failing budgets, all clean; success at %ld\n",
                    failures, k);
      assert_true(failures > 3);
      return;
    }
    TPF_ASSERT_STATUS(rc, TPF_ENOMEM);
    failures++;
  }
  fail_msg("the sequence never succeeded within 1000 allocations");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_comm__registers_once_at_capacity, setup_ring_ag,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_comm__set_active_shape_allocates_nothing, setup_ring_ag,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_comm__bad_shapes_change_nothing, setup_ring_ag,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_comm__views_follow_the_active_shape, setup_ring_ag,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_comm__operations_keep_their_shape_and_check_operands,
                                      setup_ring_ag, teardown),
      cmocka_unit_test_setup_teardown(test_comm__timeout_leaves_it_failed_mismatch_does_not,
                                      setup_ring_ag, teardown),
      cmocka_unit_test(test_comm__fp8_follows_and_external_stays_at_capacity),
      cmocka_unit_test(test_comm__external_after_the_earlier_shape_rules),
      cmocka_unit_test(test_comm__bad_configs_are_rejected),
      cmocka_unit_test(test_comm__allocator_budget_loop),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
