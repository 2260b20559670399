/* P = 1 on the core (mock backend, which records the schedule it is handed): at P = 1
 * every operation is exactly its one GEMM, whatever algorithm, split count or epilogue, with no
 * handshake, and the caller's request is validated exactly as at P > 1: a split count the layout
 * refuses is refused at P = 1 too, before anything reaches the backend. (On the old core a P = 1
 * schedule still had its HANDSHAKE and, for RS, its chunked GEMMs, REDUCE/PEER_REDUCE and
 * BARRIERs: nsteps 3 to 12.) */
#include "tpf_test.h"

enum { C = 64, H = 32, T = 8, K = 16, N = 24 };

typedef struct {
  tpf_algo algo;
  tpf_coll coll;
  int splits[6]; /* requested per operation; -1 ends */
} kind;

static const kind kinds[] = {
    {TPF_ALGO_RING, TPF_COLL_AG, {0, 1, -1}},
    {TPF_ALGO_RING, TPF_COLL_RS, {0, 1, -1}},
    {TPF_ALGO_PIPELINE, TPF_COLL_RS, {0, 1, 2, 4, 8, -1}},
    {TPF_ALGO_BULK, TPF_COLL_AG, {0, -1}},
    {TPF_ALGO_BULK, TPF_COLL_RS, {0, -1}},
};

/* g_w holds ag_gemm's w [N, H] and gemm_rs's / bulk's [H, K], [N, K]: the largest of them. */
enum { W_ELEMS = N * H > H *K ? N *H : H *K };
static float g_x[C * K], g_w[W_ELEMS > N *K ? W_ELEMS : N *K], g_d[C * (N > H ? N : H)],
    g_bias[H > N ? H : N];

static tpf_status run(tpf_comm *c, const kind *k, const tpf_op_options *o) {
  if (k->algo == TPF_ALGO_BULK) {
    tpf_matrix a = {g_x, T, K, K, TPF_FP32}, b = {g_w, N, K, K, TPF_FP32},
               d = {g_d, T, N, N, TPF_FP32};
    return tpf_bulk_overlap_ex(c, &a, &b, &d, o, NULL);
  }
  if (k->coll == TPF_COLL_AG) {
    tpf_matrix w = {g_w, N, H, H, TPF_FP32}, d = {g_d, T, N, N, TPF_FP32};
    return tpf_ag_gemm_ex(c, &w, &d, o, NULL);
  }
  tpf_matrix x = {g_x, T, K, K, TPF_FP32}, w = {g_w, H, K, K, TPF_FP32},
             out = {g_d, T, H, H, TPF_FP32};
  return tpf_gemm_rs_ex(c, &x, &w, &out, o, NULL);
}

/* Every kind, every split count it accepts, with and without an epilogue: one GEMM step. */
static void test_p1__one_gemm_for_every_operation(void **state) {
  (void)state;
  for (size_t i = 0; i < TPF_ARRAY_SIZE(kinds); i++) {
    const kind *k = &kinds[i];
    tpf_mock_backend be;
    tpf_mock_init(&be, 1, 0);
    tpf_comm_config cfg = tpf_test_config("p1", k->algo, k->coll, TPF_FP32, C, H);
    tpf_comm *c = NULL;
    TPF_ASSERT_OK(tpf_comm_create(&be.hdr, &cfg, &c));
    tpf_shape s = {T, H};
    TPF_ASSERT_OK(tpf_comm_set_active_shape(c, s));
    for (int j = 0; k->splits[j] >= 0; j++)
      for (int epi = 0; epi < 2; epi++) {
        tpf_op_options o = TPF_OP_OPTIONS_INIT;
        o.num_splits = k->splits[j];
        if (epi) {
          o.alpha = 2.0f;
          o.bias = g_bias;
          o.gelu = true;
        }
        const int before = be.executions;
        tpf_status rc = run(c, k, &o);
        if (rc != TPF_OK)
          fail_msg("%s %s splits %d epi %d: %s", tpf_algo_name(k->algo), tpf_coll_name(k->coll),
                   k->splits[j], epi, tpf_last_error());
        assert_int_equal(be.executions, before + 1);
        const tpf_schedule *h = &be.last_sched;
        if (h->nsteps != 1)
          fail_msg("%s %s splits %d: %d steps at P = 1, want the one GEMM", tpf_algo_name(k->algo),
                   tpf_coll_name(k->coll), k->splits[j], h->nsteps);
        assert_int_equal(h->num_splits, 1);
        assert_int_equal(h->num_compute_streams, 1);
        assert_int_equal(h->gemm_m, T);
      }
    TPF_ASSERT_OK(tpf_comm_destroy(c));
  }
}

/* The P = 1 schedule itself, as built and as the independent checker sees it. */
static void test_p1__schedule_is_the_gemm(void **state) {
  (void)state;
  for (size_t i = 0; i < TPF_ARRAY_SIZE(kinds); i++) {
    const kind *k = &kinds[i];
    for (int j = 0; k->splits[j] >= 0; j++) {
      tpf_layout_desc d = tpf_test_layout_desc(k->algo, k->coll, 1, 0, T, H, k->splits[j], false);
      tpf_gemm_dims g = {T, k->coll == TPF_COLL_AG ? (uint64_t)N : H,
                         k->coll == TPF_COLL_AG ? H : (uint64_t)K};
      if (k->algo == TPF_ALGO_BULK) g = (tpf_gemm_dims){T, N, K};
      tpf_schedule s;
      TPF_ASSERT_OK(tpf_schedule_build(&d, &g, &s));
      assert_int_equal(s.nsteps, 1);
      const tpf_step *st = &s.steps[0];
      assert_int_equal(st->kind, TPF_STEP_GEMM);
      assert_int_equal(st->d.id, TPF_MAT_D);
      assert_int_equal(st->a.id, (k->algo != TPF_ALGO_BULK && k->coll == TPF_COLL_AG) ? TPF_MAT_BUF
                                                                                      : TPF_MAT_X);
      assert_int_equal(st->m, g.m);
      assert_int_equal(st->n, g.n);
      assert_int_equal(st->k, g.k);
      TPF_ASSERT_OK(tpf_schedule_check(&s, 1));
      tpf_schedule_free(&s);
    }
  }
}

/* A split count the layout refuses is refused at P = 1 exactly as at P = 2 (pipeline RS with
 * H = 32: 3 does not divide it), naming it, and nothing reaches the backend. */
static void test_p1__refused_splits_as_at_p2(void **state) {
  (void)state;
  for (int P = 1; P <= 2; P++) {
    tpf_mock_backend be;
    tpf_mock_init(&be, P, 0);
    tpf_comm_config cfg =
        tpf_test_config("fc2_fprop", TPF_ALGO_PIPELINE, TPF_COLL_RS, TPF_FP32, C, H);
    tpf_comm *c = NULL;
    TPF_ASSERT_OK(tpf_comm_create(&be.hdr, &cfg, &c));
    tpf_shape s = {T, H};
    TPF_ASSERT_OK(tpf_comm_set_active_shape(c, s));
    tpf_op_options o = TPF_OP_OPTIONS_INIT;
    o.num_splits = 3;
    tpf_matrix x = {g_x, T, K, K, TPF_FP32}, w = {g_w, H, K, K, TPF_FP32},
               out = {g_d, T / (uint64_t)P, H, H, TPF_FP32};
    TPF_ASSERT_STATUS(tpf_gemm_rs_ex(c, &x, &w, &out, &o, NULL), TPF_EDIVISIBLE);
    assert_non_null(strstr(tpf_last_error(), "num_splits 3"));
    assert_non_null(strstr(tpf_last_error(), "fc2_fprop"));
    assert_int_equal(be.executions, 0);
    /* A ring's split count other than P or 1 too (ring rs at P = 1 takes 0 and 1 only). */
    tpf_comm *r = NULL;
    tpf_comm_config rc = tpf_test_config("ring_rs", TPF_ALGO_RING, TPF_COLL_RS, TPF_FP32, C, H);
    TPF_ASSERT_OK(tpf_comm_create(&be.hdr, &rc, &r));
    TPF_ASSERT_OK(tpf_comm_set_active_shape(r, s));
    o.num_splits = P + 2;
    TPF_ASSERT_STATUS(tpf_gemm_rs_ex(r, &x, &w, &out, &o, NULL), TPF_EDIVISIBLE);
    assert_int_equal(be.executions, 0);
    TPF_ASSERT_OK(tpf_comm_destroy(r));
    TPF_ASSERT_OK(tpf_comm_destroy(c));
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_p1__one_gemm_for_every_operation),
      cmocka_unit_test(test_p1__schedule_is_the_gemm),
      cmocka_unit_test(test_p1__refused_splits_as_at_p2),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
