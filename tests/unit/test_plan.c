/* The planner: synthetic cost tables that make each candidate win, the same choice on every
 * rank, the tie rule, and refusals; measured schedule points (sched lines): interpolation and
 * scaling against hand-computed values, points that overturn the model's choice, the same
 * choice on every simulator rank, and no allocation per operation. */
#include "tpflex/tpflex_cost.h"
#include "tpflex/tpflex_sim.h"
#include "tpf_test.h"

#include <math.h>
#include <stdio.h>

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

  /* RS: overlap wins with slow links, a slow reduction and no tax; a baseline with huge
   * launches. */
  tpf_gemm_dims grs = {1024, 256, 256};
  tpf_layout_desc rs = desc(4, TPF_ALGO_RING, TPF_COLL_RS, 1024, 256);
  t = table_of(OVERLAP);
  t.barrier_us = 1e5; /* the pull baseline's two barriers; its bytes equal the ring's reduction */
  TPF_ASSERT_OK(tpf_plan_predict(&t, &rs, &grs, &r));
  print_message("ring rs, overlap table, slow barrier: %s\n", r.why);
  assert_false(chosen(&r)->baseline);
  assert_int_equal(chosen(&r)->algo, TPF_ALGO_RING);
  t = table_of(FEWEST);
  TPF_ASSERT_OK(tpf_plan_predict(&t, &rs, &grs, &r));
  print_message("ring rs, fewest-steps table: %s\n", r.why);
  /* 0.2: the RS baselines are runnable schedules, and one of them wins: with one launch per
   * step, the pull (GEMM, barrier, pull, barrier) beats the ring's 2 (P - 1) transfers. */
  assert_true(chosen(&r)->baseline);
  assert_true(chosen(&r)->runnable);
  assert_int_equal(chosen(&r)->num_splits, 1);
  assert_int_equal(chosen(&r)->algo, TPF_ALGO_PIPELINE);
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

/* RING RS has two no-overlap schedules: the ring exchange after one GEMM (RING, splits 1) and
 * the pull (PIPELINE, one block, on the RING RS registration). Both are candidates and
 * baselines; the result's baseline is the faster predicted; an adaptive RING RS communicator
 * hands the backend the pull schedule when it wins, and the ring one when the copies are the
 * cheaper. */
static void test_ring_rs_two_baselines(void **state) {
  (void)state;
  enum { P = 4, C = 4096, H = 256, K = 256 };
  tpf_gemm_dims g = {1024, H, K};
  tpf_layout_desc d = desc(P, TPF_ALGO_RING, TPF_COLL_RS, 1024, H);
  tpf_cost_table pull = table_of(FEWEST), ring = table_of(FEWEST);
  /* The pull reads the same bytes through the reduction as the ring's final sum, so only its
   * two barriers can make it the slower. */
  ring.barrier_us = 1e5;
  tpf_plan_result r;
  TPF_ASSERT_OK(tpf_plan_predict(&pull, &d, &g, &r));
  assert_int_equal(r.ncand, 3);
  assert_int_equal(r.cand[0].algo, TPF_ALGO_RING);
  assert_int_equal(r.cand[0].num_splits, P);
  assert_false(r.cand[0].baseline);
  assert_int_equal(r.cand[1].algo, TPF_ALGO_RING);
  assert_int_equal(r.cand[1].num_splits, 1);
  assert_true(r.cand[1].baseline);
  assert_int_equal(r.cand[2].algo, TPF_ALGO_PIPELINE);
  assert_int_equal(r.cand[2].num_splits, 1);
  assert_true(r.cand[2].baseline);
  assert_non_null(strstr(r.cand[2].label, "pull"));
  assert_int_equal(r.baseline, 2);
  assert_int_equal(r.chosen, 2);
  TPF_ASSERT_OK(tpf_plan_predict(&ring, &d, &g, &r));
  print_message("ring rs, slow barrier: %s\n", r.why);
  assert_int_equal(r.baseline, 1);
  assert_int_equal(r.chosen, 1);
  assert_int_equal(chosen(&r)->algo, TPF_ALGO_RING);
  /* P = 1: no exchange at all, so no baseline to add. */
  tpf_layout_desc one = desc(1, TPF_ALGO_RING, TPF_COLL_RS, 1024, H);
  TPF_ASSERT_OK(tpf_plan_predict(&pull, &one, &g, &r));
  assert_int_equal(r.ncand, 1);

  /* An adaptive communicator runs what the planner chose, on its own registration. */
  static uint16_t xbuf[C * K], wbuf[H * K], obuf[C / P * H];
  tpf_mock_backend be;
  tpf_mock_init(&be, P, 1);
  tpf_comm_config cfg = tpf_test_config("fc2_fprop", TPF_ALGO_RING, TPF_COLL_RS, TPF_BF16, C, H);
  cfg.plan = TPF_PLAN_ADAPTIVE;
  const tpf_cost_table *tables[2] = {&pull, &ring};
  const tpf_algo want[2] = {TPF_ALGO_PIPELINE, TPF_ALGO_RING};
  for (int i = 0; i < 2; i++) {
    cfg.cost = tables[i];
    tpf_comm *c = NULL;
    TPF_ASSERT_OK(tpf_comm_create(&be.hdr, &cfg, &c));
    TPF_ASSERT_OK(tpf_comm_set_active_shape(c, (tpf_shape){1024, H}));
    tpf_matrix x = {xbuf, 1024, K, K, TPF_BF16}, w = {wbuf, H, K, K, TPF_BF16};
    tpf_matrix o = {obuf, 1024 / P, H, H, TPF_BF16};
    tpf__alloc_set_budget(0);
    TPF_ASSERT_OK(tpf_gemm_rs(c, &x, &w, &o, NULL));
    tpf__alloc_set_budget(-1);
    assert_int_equal(be.last_sched.algo, want[i]);
    assert_int_equal(be.last_sched.num_splits, 1);
    TPF_ASSERT_OK(tpf_comm_destroy(c));
  }
  assert_int_equal(be.reg_live, 0);
}

/* ---- measured schedule points ---------------------------------------------------------------
 * OVERLAP (one device per rank, so the points are "dedicated") with RING AG P = 4 splits 4
 * measured at T = 1024 (100 us) and 2048 (300 us), H = N = 256. */
static const char *SCHED_POINTS = "sched dedicated ring ag 4 4 0 bf16 256 256 1024 100\n"
                                  "sched dedicated ring ag 4 4 0 bf16 256 256 2048 300\n";

static tpf_cost_table with_points(const char *base, const char *points) {
  char text[4096];
  snprintf(text, sizeof text, "%s%s", base, points);
  return table_of(text);
}

static tpf_plan_result predict_at(const tpf_cost_table *t, int p, uint64_t T) {
  tpf_layout_desc d = desc(p, TPF_ALGO_RING, TPF_COLL_AG, T, 256);
  tpf_gemm_dims g = {T, 256, 256};
  tpf_plan_result r;
  TPF_ASSERT_OK(tpf_plan_predict(t, &d, &g, &r));
  return r;
}

static bool close_to(double a, double b) {
  return fabs(a - b) <= 1e-9 * fmax(1.0, fabs(b));
}

static void test_sched_interpolation(void **state) {
  (void)state;
  tpf_cost_table model = table_of(OVERLAP), t = with_points(OVERLAP, SCHED_POINTS);
  assert_int_equal(t.nsched, 2);
  /* Candidate 0 is splits 4, 1 the aggregate (splits 2), 2 the baseline. */
  static const struct {
    uint64_t T;
    double us;
  } in_range[] = {{1024, 100}, {1280, 150}, {1536, 200}, {2048, 300}};
  for (size_t i = 0; i < TPF_ARRAY_SIZE(in_range); i++) {
    tpf_plan_result r = predict_at(&t, 4, in_range[i].T), m = predict_at(&model, 4, in_range[i].T);
    assert_int_equal(r.cand[0].num_splits, 4);
    assert_int_equal(r.cand[0].source, TPF_PLAN_SRC_MEASURED);
    if (!close_to(r.cand[0].predicted_us, in_range[i].us))
      fail_msg("T=%llu: %.6f us, hand-computed %.6f", (unsigned long long)in_range[i].T,
               r.cand[0].predicted_us, in_range[i].us);
    /* The model's own time is kept, and the other candidates are the model's. */
    assert_true(close_to(r.cand[0].model_us, m.cand[0].predicted_us));
    for (int c = 1; c < r.ncand; c++) {
      assert_int_equal(r.cand[c].source, TPF_PLAN_SRC_MODEL);
      assert_true(r.cand[c].predicted_us == r.cand[c].model_us);
      assert_true(r.cand[c].predicted_us == m.cand[c].predicted_us);
    }
  }
  /* Outside the measured range: the model at T x measured / model at the nearest measured T. */
  tpf_plan_result m512 = predict_at(&model, 4, 512), m1024 = predict_at(&model, 4, 1024);
  tpf_plan_result m2048 = predict_at(&model, 4, 2048), m4096 = predict_at(&model, 4, 4096);
  tpf_plan_result r512 = predict_at(&t, 4, 512), r4096 = predict_at(&t, 4, 4096);
  assert_int_equal(r512.cand[0].source, TPF_PLAN_SRC_SCALED);
  assert_int_equal(r4096.cand[0].source, TPF_PLAN_SRC_SCALED);
  assert_true(close_to(r512.cand[0].predicted_us,
                       m512.cand[0].predicted_us * 100 / m1024.cand[0].predicted_us));
  assert_true(close_to(r4096.cand[0].predicted_us,
                       m4096.cand[0].predicted_us * 300 / m2048.cand[0].predicted_us));
  assert_true(close_to(r4096.cand[0].model_us, m4096.cand[0].predicted_us));
  print_message("scaled: T=512 %.1f us (model %.1f), T=4096 %.1f us (model %.1f)\n",
                r512.cand[0].predicted_us, r512.cand[0].model_us, r4096.cand[0].predicted_us,
                r4096.cand[0].model_us);
  assert_string_equal(tpf_plan_source_name(TPF_PLAN_SRC_MODEL), "model");
  assert_string_equal(tpf_plan_source_name(TPF_PLAN_SRC_MEASURED), "measured");
  assert_string_equal(tpf_plan_source_name(TPF_PLAN_SRC_SCALED), "scaled");
  assert_string_equal(tpf_plan_source_name((tpf_plan_source)9), "?");

  /* Points that do not apply leave the model alone: another device kind (shared points, a
   * table of one device per rank), another N, another P; and a nearest point beyond this
   * capacity (4096) cannot be scaled from. */
  static const char *const other[] = {
      "sched shared ring ag 4 4 0 bf16 256 256 1024 100\n",
      "sched dedicated ring ag 4 4 0 bf16 256 512 1024 100\n",
      "sched dedicated ring ag 8 4 0 bf16 256 256 1024 100\n",
      "sched dedicated ring ag 4 4 0 bf16 256 256 8192 100\n",
  };
  for (size_t i = 0; i < TPF_ARRAY_SIZE(other); i++) {
    tpf_cost_table o = with_points(OVERLAP, other[i]);
    tpf_plan_result r = predict_at(&o, 4, 1024);
    for (int c = 0; c < r.ncand; c++) {
      assert_int_equal(r.cand[c].source, TPF_PLAN_SRC_MODEL);
      assert_true(r.cand[c].predicted_us == m1024.cand[c].predicted_us);
    }
  }
  /* Shared points apply to a shared_device table. */
  char shared[1024];
  snprintf(shared, sizeof shared, "%sshared_device 1\n", OVERLAP);
  tpf_cost_table sh = with_points(shared, "sched shared ring ag 4 4 0 bf16 256 256 1024 7\n");
  tpf_plan_result r = predict_at(&sh, 4, 1024);
  assert_int_equal(r.cand[0].source, TPF_PLAN_SRC_MEASURED);
  assert_true(r.cand[0].predicted_us == 7);
  /* PIPELINE and RING RS candidates take points too (N is the GEMM's k for RS). */
  tpf_cost_table rs = with_points(OVERLAP, "sched dedicated pipeline rs 4 2 0 bf16 256 128 1024 1\n"
                                           "sched dedicated ring rs 4 1 0 bf16 256 128 1024 2\n");
  tpf_layout_desc pl = desc(4, TPF_ALGO_PIPELINE, TPF_COLL_RS, 1024, 256);
  tpf_gemm_dims grs = {1024, 256, 128};
  TPF_ASSERT_OK(tpf_plan_predict(&rs, &pl, &grs, &r));
  assert_int_equal(chosen(&r)->num_splits, 2);
  assert_int_equal(chosen(&r)->source, TPF_PLAN_SRC_MEASURED);
  tpf_layout_desc rr = desc(4, TPF_ALGO_RING, TPF_COLL_RS, 1024, 256);
  TPF_ASSERT_OK(tpf_plan_predict(&rs, &rr, &grs, &r));
  assert_true(chosen(&r)->baseline && chosen(&r)->predicted_us == 2);
  /* BULK has nothing to choose: its one schedule keeps the model's time. */
  tpf_layout_desc bulk = desc(4, TPF_ALGO_BULK, TPF_COLL_AG, 1024, 256);
  tpf_gemm_dims gb = {512, 256, 256};
  TPF_ASSERT_OK(tpf_plan_predict(&t, &bulk, &gb, &r));
  assert_int_equal(r.cand[0].source, TPF_PLAN_SRC_MODEL);
}

/* A measured point overturns the model: at P = 8, T = 1024 on OVERLAP the model picks splits 8;
 * a fast measured baseline, then a faster measured aggregate, win instead. */
static void test_sched_overturns_model(void **state) {
  (void)state;
  tpf_cost_table model = table_of(OVERLAP);
  tpf_plan_result m = predict_at(&model, 8, 1024);
  assert_int_equal(chosen(&m)->num_splits, 8);
  assert_int_equal(chosen(&m)->source, TPF_PLAN_SRC_MODEL);
  char pts[256];
  snprintf(pts, sizeof pts, "sched dedicated ring ag 8 1 0 bf16 256 256 1024 %.3f\n",
           0.5 * chosen(&m)->predicted_us);
  tpf_cost_table t = with_points(OVERLAP, pts);
  tpf_plan_result r = predict_at(&t, 8, 1024);
  print_message("measured baseline: %s\n", r.why);
  assert_true(chosen(&r)->baseline);
  assert_int_equal(chosen(&r)->source, TPF_PLAN_SRC_MEASURED);
  assert_non_null(strstr(r.why, "(measured)"));
  assert_non_null(strstr(r.why, ", model)")); /* the runner-up is the model's */
  size_t used = strlen(pts);
  snprintf(pts + used, sizeof pts - used, "sched dedicated ring ag 8 4 1 bf16 256 256 1024 %.3f\n",
           0.25 * chosen(&m)->predicted_us);
  t = with_points(OVERLAP, pts);
  r = predict_at(&t, 8, 1024);
  assert_true(chosen(&r)->aggregate && chosen(&r)->num_splits == 4);
  assert_int_equal(chosen(&r)->source, TPF_PLAN_SRC_MEASURED);
  /* Within 0.5 % the simpler one still wins: a measured near-tie goes to the baseline. */
  t = with_points(OVERLAP, "sched dedicated ring ag 8 1 0 bf16 256 256 1024 100.4\n"
                           "sched dedicated ring ag 8 8 0 bf16 256 256 1024 100\n");
  r = predict_at(&t, 8, 1024);
  assert_true(chosen(&r)->baseline);
}

/* prefer_margin: RING AG P = 8 at T = 1024 with measured splits 8 (the communicator's own split
 * count: desc leaves num_splits 0), aggregate 4 and baseline 1. The aggregate is 3 % faster than
 * the better anchor (the baseline): it wins with no margin and with 2 %, not with 5 %; 10 %
 * faster wins with 5 % too. */
static void test_prefer_margin(void **state) {
  (void)state;
  char base[1024], text[2048];
  for (int k = 0; k < 4; k++) {
    static const double margin[] = {0, 0.02, 0.05, 0.05};
    static const double aggr_us[] = {97, 97, 97, 90};
    static const bool aggr_wins[] = {true, true, false, true};
    snprintf(base, sizeof base, "%s%s", OVERLAP,
             margin[k] > 0 ? (k == 1 ? "prefer_margin 0.02\n" : "prefer_margin 0.05\n") : "");
    snprintf(text, sizeof text,
             "sched dedicated ring ag 8 8 0 bf16 256 256 1024 120\n"
             "sched dedicated ring ag 8 1 0 bf16 256 256 1024 100\n"
             "sched dedicated ring ag 8 4 1 bf16 256 256 1024 %.1f\n",
             aggr_us[k]);
    tpf_cost_table t = with_points(base, text);
    assert_true(t.prefer_margin == margin[k]);
    tpf_plan_result r = predict_at(&t, 8, 1024);
    print_message("margin %.2f, aggregate %.0f us: %s\n", margin[k], aggr_us[k], r.why);
    if (aggr_wins[k]) {
      assert_true(chosen(&r)->aggregate);
    } else {
      assert_true(chosen(&r)->baseline);
      assert_non_null(strstr(r.why, "prefer_margin"));
    }
  }
  /* The own split count is an anchor too: splits 8 at 99 us beats the baseline, and the
   * aggregate at 97 us (2 % faster) does not displace it under a 5 % margin. */
  snprintf(base, sizeof base, "%sprefer_margin 0.05\n", OVERLAP);
  tpf_cost_table t = with_points(base, "sched dedicated ring ag 8 8 0 bf16 256 256 1024 99\n"
                                       "sched dedicated ring ag 8 1 0 bf16 256 256 1024 100\n"
                                       "sched dedicated ring ag 8 4 1 bf16 256 256 1024 97\n");
  tpf_plan_result r = predict_at(&t, 8, 1024);
  assert_int_equal(chosen(&r)->num_splits, 8);
  assert_false(chosen(&r)->aggregate);
  /* baseline_margin: leaving no overlap takes a predicted gain above the margin. Splits 8 at
   * 96 us and the aggregate at 97 beat the baseline's 100 by 3-4 %: kept at 5 %, left at 3 %
   * (for the faster, 8), and left at 5 % once splits 8 is at 94. */
  static const struct {
    const char *margin;
    double s8;
    bool held;
  } bm[] = {{"baseline_margin 0.05\n", 96, true},
            {"baseline_margin 0.03\n", 96, false},
            {"baseline_margin 0.05\n", 94, false}};
  for (size_t i = 0; i < TPF_ARRAY_SIZE(bm); i++) {
    snprintf(base, sizeof base, "%s%s", OVERLAP, bm[i].margin);
    snprintf(text, sizeof text,
             "sched dedicated ring ag 8 8 0 bf16 256 256 1024 %.1f\n"
             "sched dedicated ring ag 8 1 0 bf16 256 256 1024 100\n"
             "sched dedicated ring ag 8 4 1 bf16 256 256 1024 97\n",
             bm[i].s8);
    t = with_points(base, text);
    r = predict_at(&t, 8, 1024);
    print_message("%.*s, splits 8 %.0f us: %s\n", (int)strlen(bm[i].margin) - 1, bm[i].margin,
                  bm[i].s8, r.why);
    if (bm[i].held) {
      assert_true(chosen(&r)->baseline);
      assert_non_null(strstr(r.why, "baseline_margin"));
    } else {
      assert_int_equal(chosen(&r)->num_splits, 8);
      assert_false(chosen(&r)->aggregate);
    }
  }
  /* Refused values, and the hash: unchanged without the key, changed with it. */
  static const char *const bad[] = {"prefer_margin 0.5\n",
                                    "prefer_margin -0.1\n",
                                    "prefer_margin\n",
                                    "prefer_margin 0.1\nprefer_margin 0.1\n",
                                    "baseline_margin 0.5\n",
                                    "baseline_margin -1\n",
                                    "baseline_margin 0.1\nbaseline_margin 0.2\n"};
  for (size_t i = 0; i < TPF_ARRAY_SIZE(bad); i++) {
    tpf_cost_table out;
    snprintf(text, sizeof text, "%s%s", OVERLAP, bad[i]);
    assert_int_equal(tpf_cost_table_parse(text, &out), TPF_EINVAL);
    assert_non_null(strstr(tpf_last_error(), i < 4 ? "prefer_margin" : "baseline_margin"));
  }
  tpf_cost_table plain = table_of(OVERLAP), zero, with;
  snprintf(text, sizeof text, "%sprefer_margin 0\n", OVERLAP);
  zero = table_of(text);
  snprintf(text, sizeof text, "%sprefer_margin 0.05\n", OVERLAP);
  with = table_of(text);
  assert_true(tpf__cost_table_hash(&plain) == tpf__cost_table_hash(&zero));
  assert_true(tpf__cost_table_hash(&plain) != tpf__cost_table_hash(&with));
  snprintf(text, sizeof text, "%sbaseline_margin 0.05\n", OVERLAP);
  tpf_cost_table bmt = table_of(text);
  assert_true(bmt.baseline_margin == 0.05);
  assert_true(tpf__cost_table_hash(&plain) != tpf__cost_table_hash(&bmt));
  assert_true(tpf__cost_table_hash(&with) != tpf__cost_table_hash(&bmt));
}

/* An adaptive communicator on a table with points: choices equal tpf_plan_predict's, and
 * neither a miss (which may replay a second T for the scaling) nor a hit allocates. */
static void test_sched_adaptive_no_alloc(void **state) {
  (void)state;
  enum { P = 4, C = 4096, H = 256, N = 256 };
  static uint16_t wbuf[N * H], dbuf[C * N];
  tpf_mock_backend be;
  tpf_mock_init(&be, P, 1);
  tpf_cost_table t = with_points(OVERLAP, SCHED_POINTS);
  tpf_comm_config cfg = tpf_test_config("fc1_fprop", TPF_ALGO_RING, TPF_COLL_AG, TPF_BF16, C, H);
  cfg.plan = TPF_PLAN_ADAPTIVE;
  cfg.cost = &t;
  tpf_comm *c = NULL;
  TPF_ASSERT_OK(tpf_comm_create(&be.hdr, &cfg, &c));
  static tpf_plan_result want[C / 256 + 1];
  for (uint64_t T = 256; T <= C; T += 256)
    want[T / 256] = predict_at(&t, P, T);
  tpf_matrix w = {wbuf, N, H, H, TPF_BF16};
  int nsrc[3] = {0, 0, 0};
  tpf__alloc_set_budget(0);
  for (uint64_t T = 256; T <= C; T += 256) {
    TPF_ASSERT_OK(tpf_comm_set_active_shape(c, (tpf_shape){T, H}));
    tpf_matrix d = {dbuf, T, N, N, TPF_BF16};
    TPF_ASSERT_OK(tpf_ag_gemm(c, &w, &d, NULL));
    TPF_ASSERT_OK(tpf_ag_gemm(c, &w, &d, NULL)); /* a hit */
    tpf_plan_result r;
    TPF_ASSERT_OK(tpf_comm_plan_info(c, &r));
    const tpf_plan_result *x = &want[T / 256];
    assert_int_equal(r.chosen, x->chosen);
    for (int i = 0; i < r.ncand; i++) {
      assert_true(r.cand[i].predicted_us == x->cand[i].predicted_us);
      assert_int_equal(r.cand[i].source, x->cand[i].source);
    }
    assert_int_equal(be.last_sched.num_splits, r.cand[r.chosen].num_splits);
    nsrc[r.cand[0].source]++;
  }
  tpf__alloc_set_budget(-1);
  /* T = 1024 .. 2048 (5 values) measured; 256, 512, 768 and 2304 .. 4096 (11) scaled. */
  assert_int_equal(nsrc[TPF_PLAN_SRC_MEASURED], 5);
  assert_int_equal(nsrc[TPF_PLAN_SRC_SCALED], 11);
  TPF_ASSERT_OK(tpf_comm_destroy(c));
}

/* ---- the same choice on every simulator rank, and tables that differ refused ---- */

#define SIM_P 4
#define SIM_C 1024
#define SIM_H 256
#define SIM_N 64
#define SIM_NTS 5

typedef struct {
  tpf_cost_table table[SIM_P];
  tpf_status st[SIM_P];
  char msg[SIM_P][512];
  uint64_t ts[SIM_NTS];
  tpf_plan_result got[SIM_P][SIM_NTS];
  uint16_t w[SIM_P][SIM_N * SIM_H], d[SIM_P][SIM_C * SIM_N];
} sim_run;

static tpf_status sim_rank(tpf_backend *be, int r, void *arg) {
  sim_run *s = arg;
  tpf_comm_config cfg =
      tpf_test_config("fc1_sched", TPF_ALGO_RING, TPF_COLL_AG, TPF_BF16, SIM_C, SIM_H);
  cfg.plan = TPF_PLAN_ADAPTIVE;
  cfg.cost = &s->table[r];
  tpf_comm *c = NULL;
  s->st[r] = tpf_comm_create(be, &cfg, &c);
  snprintf(s->msg[r], sizeof s->msg[r], "%s", tpf_last_error());
  if (s->st[r] != TPF_OK) return TPF_OK;
  tpf_matrix w = {s->w[r], SIM_N, SIM_H, SIM_H, TPF_BF16};
  for (int i = 0; i < SIM_NTS && s->st[r] == TPF_OK; i++) {
    tpf_matrix d = {s->d[r], s->ts[i], SIM_N, SIM_N, TPF_BF16};
    s->st[r] = tpf_comm_set_active_shape(c, (tpf_shape){s->ts[i], SIM_H});
    if (s->st[r] == TPF_OK) s->st[r] = tpf_ag_gemm(c, &w, &d, NULL);
    if (s->st[r] == TPF_OK) s->st[r] = tpf_comm_plan_info(c, &s->got[r][i]);
  }
  tpf_status dst = tpf_comm_destroy(c);
  return s->st[r] != TPF_OK ? s->st[r] : dst;
}

static void test_sched_same_on_sim_ranks(void **state) {
  (void)state;
  tpf_sim_config sc = TPF_SIM_CONFIG_INIT;
  sc.tp_size = SIM_P;
  sc.timeout_ms = 5000;
  tpf_sim_world *w = NULL;
  TPF_ASSERT_OK(tpf_sim_world_create(&sc, &w));
  static sim_run s;
  memset(&s, 0, sizeof s);
  /* Points at T = 256 and 512 for splits 4 and the aggregate, fast enough to win there. */
  const char *pts = "sched dedicated ring ag 4 4 0 bf16 256 64 256 1\n"
                    "sched dedicated ring ag 4 4 0 bf16 256 64 512 2\n"
                    "sched dedicated ring ag 4 2 1 bf16 256 64 512 1.5\n";
  for (int r = 0; r < SIM_P; r++)
    s.table[r] = with_points(OVERLAP, pts); /* each rank's own copy, equal */
  const uint64_t ts[SIM_NTS] = {128, 256, 384, 512, 1024};
  memcpy(s.ts, ts, sizeof ts);
  TPF_ASSERT_OK(tpf_sim_run(w, sim_rank, &s));
  for (int i = 0; i < SIM_NTS; i++) {
    const tpf_plan_result *a = &s.got[0][i];
    assert_int_equal(a->ncand, 3);
    for (int r = 1; r < SIM_P; r++) {
      const tpf_plan_result *b = &s.got[r][i];
      assert_int_equal(b->chosen, a->chosen);
      for (int c = 0; c < a->ncand; c++) {
        assert_true(b->cand[c].predicted_us == a->cand[c].predicted_us);
        assert_int_equal(b->cand[c].source, a->cand[c].source);
      }
    }
    print_message("T=%llu: %s\n", (unsigned long long)ts[i], a->why);
  }
  assert_true(s.got[0][3].cand[s.got[0][3].chosen].aggregate); /* T = 512: the measured 1.5 */
  assert_int_equal(s.got[0][1].cand[0].source, TPF_PLAN_SRC_MEASURED);
  assert_int_equal(s.got[0][4].cand[0].source, TPF_PLAN_SRC_SCALED);

  /* Rank 3's table differs in one sched point's time only: every rank refuses the config. */
  s.table[3].sched[2].us = 1.25;
  TPF_ASSERT_OK(tpf_sim_run(w, sim_rank, &s));
  for (int r = 0; r < SIM_P; r++) {
    TPF_ASSERT_STATUS(s.st[r], TPF_EMISMATCH);
    if (!strstr(s.msg[r], "cost table on rank")) fail_msg("rank %d: %s", r, s.msg[r]);
  }
  print_message("sched point differs: %s\n", s.msg[0]);
  TPF_ASSERT_OK(tpf_sim_world_destroy(w));
}

/* A table without a link line (it parses: every key is optional) used to price every transfer
 * over it at bytes / 0 GB/s: inf and nan predictions returned as TPF_OK. Now a prediction that
 * needs the missing link is TPF_EINVAL naming the line to add, and an adaptive communicator
 * refuses such a table at creation (registering nothing), as it refuses one without gemm points. */
static void test_table_without_links(void **state) {
  (void)state;
  static const char *no_peer = "launch_us 1\nhandshake_us 2\nbarrier_us 3\nreduce 0 100\n"
                               "gemm bf16 1024 256 256 100\n";
  static const char *no_reduce = "launch_us 1\nhandshake_us 2\nbarrier_us 3\ncopy peer 1 100\n"
                                 "gemm bf16 1024 256 256 100\n";
  tpf_gemm_dims g = {1024, 256, 256};
  tpf_plan_result r;
  tpf_layout_desc ag = desc(4, TPF_ALGO_RING, TPF_COLL_AG, 1024, 256);
  tpf_layout_desc rs = desc(4, TPF_ALGO_RING, TPF_COLL_RS, 1024, 256);
  tpf_layout_desc pipe = desc(4, TPF_ALGO_PIPELINE, TPF_COLL_RS, 1024, 256);
  tpf_cost_table t = table_of(no_peer);
  TPF_ASSERT_STATUS(tpf_plan_predict(&t, &ag, &g, &r), TPF_EINVAL);
  if (!strstr(tpf_last_error(), "no 'copy peer' line") ||
      !strstr(tpf_last_error(), "add 'copy peer <latency_us> <GB/s>'"))
    fail_msg("no copy peer: %s", tpf_last_error());
  t = table_of(no_reduce);
  TPF_ASSERT_OK(tpf_plan_predict(&t, &ag, &g, &r)); /* an all-gather reduces nothing */
  assert_true(isfinite(r.cand[r.chosen].predicted_us));
  g = (tpf_gemm_dims){1024, 256, 256};
  TPF_ASSERT_STATUS(tpf_plan_predict(&t, &rs, &g, &r), TPF_EINVAL);
  assert_non_null(strstr(tpf_last_error(), "no 'reduce' line"));
  TPF_ASSERT_STATUS(tpf_plan_predict(&t, &pipe, &g, &r), TPF_EINVAL);
  assert_non_null(strstr(tpf_last_error(), "no 'reduce' line"));

  tpf_mock_backend be;
  tpf_mock_init(&be, 4, 0);
  tpf_comm_config cfg =
      tpf_test_config("fc1_fprop", TPF_ALGO_RING, TPF_COLL_AG, TPF_BF16, 4096, 256);
  cfg.plan = TPF_PLAN_ADAPTIVE;
  t = table_of(no_peer);
  cfg.cost = &t;
  tpf_comm *c = NULL;
  TPF_ASSERT_STATUS(tpf_comm_create(&be.hdr, &cfg, &c), TPF_EINVAL);
  if (!strstr(tpf_last_error(), "'fc1_fprop'") || !strstr(tpf_last_error(), "'copy peer'"))
    fail_msg("adaptive comm on a table without copy peer: %s", tpf_last_error());
  assert_null(c);
  assert_int_equal(be.reg_total, 0);
  tpf_cost_table t2 = table_of(no_reduce);
  cfg.cost = &t2;
  TPF_ASSERT_OK(tpf_comm_create(&be.hdr, &cfg, &c)); /* AG: no reduction to price */
  TPF_ASSERT_OK(tpf_comm_destroy(c));
  cfg.coll = TPF_COLL_RS;
  c = NULL;
  TPF_ASSERT_STATUS(tpf_comm_create(&be.hdr, &cfg, &c), TPF_EINVAL);
  assert_non_null(strstr(tpf_last_error(), "'reduce'"));
  assert_int_equal(be.reg_live, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_each_candidate_wins),
      cmocka_unit_test(test_same_on_every_rank),
      cmocka_unit_test(test_refusals),
      cmocka_unit_test(test_adaptive_comm),
      cmocka_unit_test(test_table_without_links),
      cmocka_unit_test(test_ring_rs_two_baselines),
      cmocka_unit_test(test_sched_interpolation),
      cmocka_unit_test(test_sched_overturns_model),
      cmocka_unit_test(test_prefer_margin),
      cmocka_unit_test(test_sched_adaptive_no_alloc),
      cmocka_unit_test(test_sched_same_on_sim_ranks),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
