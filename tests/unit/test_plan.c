/* The planner: synthetic cost tables that make each candidate win, the same choice on every
 * rank, the tie rule, and refusals. */
#include "tpflex/tpflex_cost.h"
#include "tpf_test.h"

static tpf_cost_table table_of(const char *text) {
  tpf_cost_table t;
  if (tpf_cost_table_parse(text, &t) != TPF_OK) fail_msg("table: %s", tpf_last_error());
  return t;
}

static tpf_layout_desc desc(int p, tpf_algo a, tpf_coll c, uint64_t t, uint64_t h) {
  tpf_layout_desc d;
  memset(&d, 0, sizeof d);
  d.tp_size = p, d.algo = a, d.coll = c, d.dtype = TPF_BF16;
  d.capacity = (tpf_shape){4096, h};
  d.active = (tpf_shape){t, h};
  return d;
}

static const tpf_plan_candidate *chosen(const tpf_plan_result *r) {
  return &r->cand[r->chosen];
}

/* T = 1024, H = N = 256, bf16, P = 8: the whole GEMM costs 1000 us (one point: a constant
 * rate, no chunking tax) and a 64 KiB chunk takes 125 us to send, about one chunk's GEMM:
 * overlapping every chunk wins. */
static const char *OVERLAP = "launch_us 0\nhandshake_us 0\nbarrier_us 0\ncopy peer 0 0.524288\n"
                             "copy local 0 1000\nreduce 0 0.5\ngemm bf16 1024 256 256 1000\n";
/* A steep chunking tax (a 128-row chunk costs as much as all 1024 rows) and cheap transfers:
 * one GEMM after the exchange (the baseline) wins. */
static const char *FEWEST = "launch_us 1\nhandshake_us 0\nbarrier_us 0\ncopy peer 0 1000\n"
                            "copy local 0 1000\nreduce 0 1000\ngemm bf16 128 256 256 100\n"
                            "gemm bf16 1024 256 256 100\n";
/* 300 us of latency per message: the aggregate's fewer, larger messages win. */
static const char *AGGREGATE = "launch_us 0\nhandshake_us 0\nbarrier_us 0\ncopy peer 300 1000\n"
                               "copy local 0 1000\nreduce 0 1000\ngemm bf16 1024 256 256 1000\n";

static void test_each_candidate_wins(void **state) {
  (void)state;
  tpf_gemm_dims g = {1024, 256, 256};
  tpf_plan_result r;
  tpf_layout_desc d = desc(8, TPF_ALGO_RING, TPF_COLL_AG, 1024, 256);
  tpf_cost_table t = table_of(OVERLAP);
  TPF_ASSERT_OK(tpf_plan_predict(&t, &d, &g, &r));
  assert_int_equal(r.ncand, 3);
  print_message("overlap table: %s\n", r.why);
  assert_int_equal(chosen(&r)->num_splits, 8);
  assert_false(chosen(&r)->aggregate);
  t = table_of(FEWEST);
  TPF_ASSERT_OK(tpf_plan_predict(&t, &d, &g, &r));
  print_message("fewest-steps table: %s\n", r.why);
  assert_true(chosen(&r)->baseline);
  assert_int_equal(r.chosen, r.baseline);
  t = table_of(AGGREGATE);
  TPF_ASSERT_OK(tpf_plan_predict(&t, &d, &g, &r));
  print_message("latency table: %s\n", r.why);
  assert_true(chosen(&r)->aggregate);
  assert_int_equal(chosen(&r)->num_splits, 4);

  /* RS: overlap wins with slow links and no tax; the baseline with huge launches. */
  tpf_gemm_dims grs = {1024, 256, 256};
  tpf_layout_desc rs = desc(4, TPF_ALGO_RING, TPF_COLL_RS, 1024, 256);
  t = table_of(OVERLAP);
  TPF_ASSERT_OK(tpf_plan_predict(&t, &rs, &grs, &r));
  print_message("ring rs, overlap table: %s\n", r.why);
  assert_false(chosen(&r)->baseline);
  t = table_of(FEWEST);
  TPF_ASSERT_OK(tpf_plan_predict(&t, &rs, &grs, &r));
  print_message("ring rs, fewest-steps table: %s\n", r.why);
  /* 0.2: the RS baseline is a runnable schedule (RING RS with num_splits 1), and it wins. */
  assert_true(chosen(&r)->baseline);
  assert_true(chosen(&r)->runnable);
  assert_int_equal(chosen(&r)->num_splits, 1);
  assert_int_equal(r.chosen, r.baseline);
  tpf_layout_desc pl = desc(4, TPF_ALGO_PIPELINE, TPF_COLL_RS, 1024, 256);
  t = table_of(OVERLAP);
  TPF_ASSERT_OK(tpf_plan_predict(&t, &pl, &grs, &r));
  print_message("pipeline, overlap table: %s\n", r.why);
  assert_int_equal(r.ncand, 4); /* S = 8, 4, 2 and 1, which is the baseline */
  assert_true(r.cand[r.baseline].num_splits == 1 && r.cand[r.baseline].runnable);
  assert_true(chosen(&r)->num_splits > 1);
  tpf_layout_desc bulk = desc(4, TPF_ALGO_BULK, TPF_COLL_AG, 1024, 256);
  tpf_gemm_dims gb = {512, 256, 256};
  TPF_ASSERT_OK(tpf_plan_predict(&t, &bulk, &gb, &r));
  assert_int_equal(r.ncand, 1);
  assert_int_equal(r.baseline, -1);
  assert_non_null(strstr(r.why, "the only schedule"));
}

/* Every rank reaches the same choice, for every T of a sweep, on the simulator's table. */
static void test_same_on_every_rank(void **state) {
  (void)state;
  tpf_cost_table t = table_of(OVERLAP);
  const tpf_coll colls[] = {TPF_COLL_AG, TPF_COLL_RS};
  for (size_t c = 0; c < 2; c++)
    for (uint64_t T = 64; T <= 4096; T *= 4) {
      tpf_plan_result first;
      for (int rank = 0; rank < 4; rank++) {
        tpf_layout_desc d = desc(4, TPF_ALGO_RING, colls[c], T, 256);
        d.rank = rank;
        tpf_gemm_dims g = {T, 256, 256};
        tpf_plan_result r;
        TPF_ASSERT_OK(tpf_plan_predict(&t, &d, &g, &r));
        if (rank == 0) first = r;
        assert_int_equal(r.chosen, first.chosen);
        for (int i = 0; i < r.ncand; i++)
          assert_true(r.cand[i].predicted_us == first.cand[i].predicted_us);
      }
    }
}

static void test_refusals(void **state) {
  (void)state;
  tpf_cost_table t = table_of(OVERLAP);
  tpf_gemm_dims g = {1024, 256, 256};
  tpf_plan_result r;
  tpf_layout_desc d = desc(4, TPF_ALGO_RING, TPF_COLL_AG, 1000, 256);
  d.active.rows = 1002; /* not divisible by P */
  TPF_ASSERT_STATUS(tpf_plan_predict(&t, &d, &g, &r), TPF_EDIVISIBLE);
  TPF_ASSERT_STATUS(tpf_plan_predict(NULL, &d, &g, &r), TPF_EINVAL);
  d.active.rows = 1024;
  d.dtype = TPF_FP16; /* the table prices bf16 only */
  TPF_ASSERT_STATUS(tpf_plan_predict(&t, &d, &g, &r), TPF_EINVAL);
  assert_non_null(strstr(tpf_last_error(), "fp16"));
}

/* An adaptive communicator: the schedule handed to the backend carries the planner's choice,
 * tpf_comm_plan_info shows it, neither a miss nor a hit allocates, more distinct T than cache
 * entries keep working, and the configuration is validated. */
static void test_adaptive_comm(void **state) {
  (void)state;
  enum { P = 8, C = 4096, H = 256, N = 256 };
  static uint16_t wbuf[N * H], dbuf[C * N];
  tpf_mock_backend be;
  tpf_mock_init(&be, P, 3);
  tpf_cost_table lat = table_of(AGGREGATE), few = table_of(FEWEST);
  tpf_comm_config cfg = tpf_test_config("fc1_fprop", TPF_ALGO_RING, TPF_COLL_AG, TPF_BF16, C, H);
  cfg.plan = TPF_PLAN_ADAPTIVE;
  cfg.cost = &lat;
  tpf_comm *c = NULL;
  TPF_ASSERT_OK(tpf_comm_create(&be.hdr, &cfg, &c));
  tpf_plan_result r;
  TPF_ASSERT_OK(tpf_comm_plan_info(c, &r));
  assert_int_equal(r.ncand, 0); /* nothing planned yet */
  tpf_matrix w = {wbuf, N, H, H, TPF_BF16};
  tpf__alloc_set_budget(0);                /* from here on, any allocation fails the test */
  for (uint64_t T = 64; T <= C; T += 64) { /* 64 distinct T: more than the cache holds */
    TPF_ASSERT_OK(tpf_comm_set_active_shape(c, (tpf_shape){T, H}));
    tpf_matrix d = {dbuf, T, N, N, TPF_BF16};
    TPF_ASSERT_OK(tpf_ag_gemm(c, &w, &d, NULL));
    TPF_ASSERT_OK(tpf_comm_plan_info(c, &r));
    assert_true(r.ncand == 3);
    assert_int_equal(be.last_sched.num_splits, r.cand[r.chosen].num_splits);
    assert_int_equal(be.last_sched.aggregate, r.cand[r.chosen].aggregate);
    TPF_ASSERT_OK(tpf_ag_gemm(c, &w, &d, NULL)); /* a hit */
  }
  TPF_ASSERT_OK(tpf_comm_set_active_shape(c, (tpf_shape){1024, H}));
  tpf_matrix d = {dbuf, 1024, N, N, TPF_BF16};
  TPF_ASSERT_OK(tpf_ag_gemm(c, &w, &d, NULL));
  tpf__alloc_set_budget(-1);
  assert_true(be.last_sched.aggregate); /* the latency table's winner at T = 1024 */
  assert_int_equal(be.last_sched.num_splits, 4);
  TPF_ASSERT_OK(tpf_comm_destroy(c));

  cfg.cost = &few; /* the table is copied at creation: a later change of `few` would not matter */
  TPF_ASSERT_OK(tpf_comm_create(&be.hdr, &cfg, &c));
  memset(&few, 0, sizeof few);
  TPF_ASSERT_OK(tpf_comm_set_active_shape(c, (tpf_shape){1024, H}));
  TPF_ASSERT_OK(tpf_ag_gemm(c, &w, &d, NULL));
  assert_int_equal(be.last_sched.num_splits, 1);
  TPF_ASSERT_OK(tpf_comm_plan_info(c, &r));
  assert_true(r.cand[r.chosen].baseline);
  print_message("adaptive comm, fewest-steps table: %s\n", r.why);
  TPF_ASSERT_OK(tpf_comm_destroy(c));

  cfg.cost = NULL;
  TPF_ASSERT_STATUS(tpf_comm_create(&be.hdr, &cfg, &c), TPF_EINVAL);
  assert_non_null(strstr(tpf_last_error(), "needs a cost table"));
  cfg.plan = (tpf_plan_mode)7;
  TPF_ASSERT_STATUS(tpf_comm_create(&be.hdr, &cfg, &c), TPF_EINVAL);
  cfg.plan = TPF_PLAN_FIXED;
  TPF_ASSERT_OK(tpf_comm_create(&be.hdr, &cfg, &c));
  TPF_ASSERT_STATUS(tpf_comm_plan_info(c, &r), TPF_EUNSUPPORTED);
  assert_non_null(strstr(tpf_last_error(), "TPF_PLAN_FIXED"));
  TPF_ASSERT_STATUS(tpf_comm_plan_info(NULL, &r), TPF_EINVAL);
  TPF_ASSERT_OK(tpf_comm_destroy(c));
  assert_int_equal(be.reg_live, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_each_candidate_wins),
      cmocka_unit_test(test_same_on_every_rank),
      cmocka_unit_test(test_refusals),
      cmocka_unit_test(test_adaptive_comm),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
