/* An operation whose output overlaps one of its other operands (D on top of W
 * in ag_gemm, D on top of A in bulk, the bias inside D, out on x or w in gemm_rs) is TPF_EINVAL
 * naming both operands, before anything runs; an output that ends one element before an input
 * starts, and inputs overlapping each other (only read), still run. The extents come from each
 * operand's shape, ld and dtype. The simulator case shows the refused call used to return
 * TPF_OK with wrong results. The fp8 scales (a_scale_inv, w_scale_inv: one float each) are
 * inputs too: inside the output or the registration they are refused naming both (they used to
 * return TPF_OK, the GEMMs reading a scale the operation was overwriting). */
#include "comm_internal.h"
#include "tpf_test.h"
#include "tpflex/tpflex_sim.h"

enum { T = 16, H = 8, N = 8, K = 8 };
static float g_mem[4096]; /* one arena for every operand, so they can overlap on purpose */

static tpf_matrix mat(size_t off, uint64_t rows, uint64_t cols, tpf_dtype t) {
  tpf_matrix m = {&g_mem[off], rows, cols, cols, t};
  return m;
}

static void expect_overlap(tpf_status st, const tpf_mock_backend *be, int execs, const char *a,
                           const char *b) {
  TPF_ASSERT_STATUS(st, TPF_EINVAL);
  char wa[64], wb[64];
  snprintf(wa, sizeof wa, ": %s [", a);
  snprintf(wb, sizeof wb, " and %s [", b);
  if (!strstr(tpf_last_error(), "overlap") || !strstr(tpf_last_error(), wa) ||
      !strstr(tpf_last_error(), wb))
    fail_msg("detail '%s' does not name both '%s' and '%s'", tpf_last_error(), a, b);
  assert_int_equal(be->executions, execs); /* nothing ran */
}

static void test_overlap__ag_gemm(void **state) {
  (void)state;
  tpf_mock_backend be;
  tpf_mock_init(&be, 1, 0);
  tpf_comm_config cfg = tpf_test_config("fc1_fprop", TPF_ALGO_RING, TPF_COLL_AG, TPF_FP32, T, H);
  tpf_comm *c = NULL;
  TPF_ASSERT_OK(tpf_comm_create(&be.hdr, &cfg, &c));
  tpf_op_options o = TPF_OP_OPTIONS_INIT;
  /* w is [N, H] at 0 (N*H = 64 floats); d [T, N] on top of it, at its last element, just past
   * its end. */
  tpf_matrix w = mat(0, N, H, TPF_FP32);
  tpf_matrix d = mat(0, T, N, TPF_FP32);
  expect_overlap(tpf_ag_gemm(c, &w, &d, NULL), &be, 0, "output d", "weight w");
  d = mat(N * H - 1, T, N, TPF_FP32);
  expect_overlap(tpf_ag_gemm(c, &w, &d, NULL), &be, 0, "output d", "weight w");
  d = mat(N * H, T, N, TPF_FP32);
  TPF_ASSERT_OK(tpf_ag_gemm(c, &w, &d, NULL));
  assert_int_equal(be.executions, 1);
  /* d before w, ending exactly where w starts (d is [T, N] = 128 floats). */
  w = mat(1024, N, H, TPF_FP32);
  d = mat(1024 - T * N, T, N, TPF_FP32);
  TPF_ASSERT_OK(tpf_ag_gemm(c, &w, &d, NULL));
  d = mat(1024 - T * N + 1, T, N, TPF_FP32);
  expect_overlap(tpf_ag_gemm(c, &w, &d, NULL), &be, 2, "output d", "weight w");
  /* ld counts: a d of ld 2N whose last row ends inside w. */
  d = mat(1024 - T * N, T, N, TPF_FP32);
  d.ld = 2 * N;
  d.ptr = &g_mem[1024 - (T - 1) * 2 * N - N + 1];
  expect_overlap(tpf_ag_gemm(c, &w, &d, NULL), &be, 2, "output d", "weight w");
  /* The bias inside d, at its start and at its last element; bias just past d is fine. */
  d = mat(2048, T, N, TPF_FP32);
  o.bias = &g_mem[2048];
  expect_overlap(tpf_ag_gemm_ex(c, &w, &d, &o, NULL), &be, 2, "output d", "bias");
  o.bias = &g_mem[2048 + T * N - 1];
  expect_overlap(tpf_ag_gemm_ex(c, &w, &d, &o, NULL), &be, 2, "output d", "bias");
  o.bias = &g_mem[2048 - N + 1]; /* its N elements end inside d */
  expect_overlap(tpf_ag_gemm_ex(c, &w, &d, &o, NULL), &be, 2, "output d", "bias");
  o.bias = &g_mem[2048 + T * N];
  TPF_ASSERT_OK(tpf_ag_gemm_ex(c, &w, &d, &o, NULL));
  /* An fp32 d over a bias counted in d's dtype: 8 fp32 elements = 32 bytes. */
  o.bias = &g_mem[2048 - N];
  TPF_ASSERT_OK(tpf_ag_gemm_ex(c, &w, &d, &o, NULL));
  /* A bias inside the registration is refused too. */
  void *base = NULL;
  uint64_t bytes = 0;
  TPF_ASSERT_OK(tpf_comm_registration(c, &base, &bytes));
  o.bias = base;
  TPF_ASSERT_STATUS(tpf_ag_gemm_ex(c, &w, &d, &o, NULL), TPF_EINVAL);
  assert_non_null(strstr(tpf_last_error(), "bias overlaps the registered buffer"));
  assert_int_equal(be.executions, 4);
  TPF_ASSERT_OK(tpf_comm_destroy(c));
}

static void test_overlap__gemm_rs_and_bulk(void **state) {
  (void)state;
  tpf_mock_backend be;
  tpf_mock_init(&be, 1, 0);
  tpf_comm_config cfg = tpf_test_config("fc2_fprop", TPF_ALGO_RING, TPF_COLL_RS, TPF_FP32, T, H);
  tpf_comm *c = NULL;
  TPF_ASSERT_OK(tpf_comm_create(&be.hdr, &cfg, &c));
  tpf_matrix x = mat(0, T, K, TPF_FP32), w = mat(512, H, K, TPF_FP32);
  tpf_matrix out = mat(100, T, H, TPF_FP32); /* inside x */
  expect_overlap(tpf_gemm_rs(c, &x, &w, &out, NULL), &be, 0, "output out", "input x");
  out = mat(512 + 3, T, H, TPF_FP32); /* inside w */
  expect_overlap(tpf_gemm_rs(c, &x, &w, &out, NULL), &be, 0, "output out", "weight w");
  out = mat(1024, T, H, TPF_FP32);
  tpf_op_options o = TPF_OP_OPTIONS_INIT;
  o.bias = &g_mem[1024 + 5];
  expect_overlap(tpf_gemm_rs_ex(c, &x, &w, &out, &o, NULL), &be, 0, "output out", "bias");
  /* x and w may overlap (both only read). */
  w = mat(0, H, K, TPF_FP32);
  TPF_ASSERT_OK(tpf_gemm_rs(c, &x, &w, &out, NULL));
  TPF_ASSERT_OK(tpf_comm_destroy(c));

  cfg = tpf_test_config("bulk_ag", TPF_ALGO_BULK, TPF_COLL_AG, TPF_FP32, T, H);
  TPF_ASSERT_OK(tpf_comm_create(&be.hdr, &cfg, &c));
  const int e0 = be.executions;
  tpf_matrix a = mat(0, 8, 8, TPF_FP32), b = mat(64, 8, 8, TPF_FP32);
  tpf_matrix d = mat(32, 8, 8, TPF_FP32); /* on a's second half and b's first */
  expect_overlap(tpf_bulk_overlap(c, &a, &b, &d, NULL), &be, e0, "output d", "a");
  d = mat(64 + 63, 8, 8, TPF_FP32); /* on b's last element */
  expect_overlap(tpf_bulk_overlap(c, &a, &b, &d, NULL), &be, e0, "output d", "b");
  /* trans_a: a stored [K, M] = [8, 8]; the extent is the stored one. */
  o = (tpf_op_options)TPF_OP_OPTIONS_INIT;
  o.trans_a = true;
  d = mat(7, 8, 8, TPF_FP32);
  expect_overlap(tpf_bulk_overlap_ex(c, &a, &b, &d, &o, NULL), &be, e0, "output d", "a");
  d = mat(128, 8, 8, TPF_FP32);
  o.bias = &g_mem[128 + 63];
  expect_overlap(tpf_bulk_overlap_ex(c, &a, &b, &d, &o, NULL), &be, e0, "output d", "bias");
  /* a == b (a Gram matrix) is allowed. */
  TPF_ASSERT_OK(tpf_bulk_overlap(c, &a, &a, &d, NULL));
  assert_int_equal(be.executions, e0 + 1);
  TPF_ASSERT_OK(tpf_comm_destroy(c));
}

/* On the simulator: bulk d on top of a used to return TPF_OK with a wrong product.
 * Now it is refused on every rank, and the same operation on separate memory is exact. */
typedef struct {
  tpf_comm *c[2];
  tpf_status st[2], ok[2];
  float mem[2][512];
} sim_run;

static tpf_status sim_rank(tpf_backend *be, int r, void *arg) {
  sim_run *s = arg;
  tpf_comm_config cfg = tpf_test_config("bulk_ag", TPF_ALGO_BULK, TPF_COLL_AG, TPF_FP32, T, H);
  TPF_CHECK(tpf_comm_create(be, &cfg, &s->c[r]));
  float *m = s->mem[r];
  for (int i = 0; i < 512; i++)
    m[i] = (float)(i % 5);
  tpf_matrix a = {m, 8, 8, 8, TPF_FP32}, b = {m + 64, 8, 8, 8, TPF_FP32};
  tpf_matrix d = {m + 32, 8, 8, 8, TPF_FP32};
  s->st[r] = tpf_bulk_overlap(s->c[r], &a, &b, &d, NULL);
  d.ptr = m + 256;
  s->ok[r] = tpf_bulk_overlap(s->c[r], &a, &b, &d, NULL);
  for (int i = 0; i < 8 && s->ok[r] == TPF_OK; i++)
    for (int j = 0; j < 8; j++) {
      float want = 0;
      for (int k = 0; k < 8; k++)
        want += m[i * 8 + k] * m[64 + j * 8 + k];
      if (m[256 + i * 8 + j] != want) s->ok[r] = TPF_EINVAL;
    }
  return tpf_comm_destroy(s->c[r]);
}

static void test_overlap__simulator(void **state) {
  (void)state;
  tpf_sim_config sc = TPF_SIM_CONFIG_INIT;
  sc.tp_size = 2;
  tpf_sim_world *w = NULL;
  TPF_ASSERT_OK(tpf_sim_world_create(&sc, &w));
  static sim_run s;
  TPF_ASSERT_OK(tpf_sim_run(w, sim_rank, &s));
  for (int r = 0; r < 2; r++) {
    TPF_ASSERT_STATUS(s.st[r], TPF_EINVAL);
    TPF_ASSERT_OK(s.ok[r]);
  }
  TPF_ASSERT_OK(tpf_sim_world_destroy(w));
}

/* fp8 scales on the simulator (it runs fp8 GEMMs): a_scale_inv inside the bulk output d, and
 * w_scale_inv inside the registration of a RING AG communicator (gathered into while the chunks'
 * GEMMs read the scale), are refused on every rank naming both; scales just past d run exactly. */
enum { F8_M = 8, F8_K = 16, F8_N = 8 };
typedef struct {
  tpf_status in_d[2], in_reg[2], ok[2];
  char msg_d[2][400], msg_reg[2][400];
  float d[2][256]; /* d (at most 128 floats), the scales past it */
  uint8_t a[2][F8_M * F8_K], b[2][F8_N * F8_K];
} f8_run;

static tpf_status f8_rank(tpf_backend *be, int r, void *arg) {
  f8_run *s = arg;
  tpf_comm_config cfg = tpf_test_config("bulk_ag", TPF_ALGO_BULK, TPF_COLL_AG, TPF_FP32, T, H);
  tpf_comm *c = NULL, *ag = NULL;
  TPF_CHECK(tpf_comm_create(be, &cfg, &c));
  memset(s->a[r], 0x38, sizeof s->a[r]); /* E4M3 1.0 */
  memset(s->b[r], 0x38, sizeof s->b[r]);
  float *dm = s->d[r];
  tpf_matrix a = {s->a[r], F8_M, F8_K, F8_K, TPF_FP8_E4M3};
  tpf_matrix b = {s->b[r], F8_N, F8_K, F8_K, TPF_FP8_E4M3};
  tpf_matrix d = {dm, F8_M, F8_N, F8_N, TPF_FP32};
  tpf_op_options o = TPF_OP_OPTIONS_INIT;
  o.a_scale_inv = &dm[5]; /* inside d */
  o.w_scale_inv = &dm[F8_M * F8_N + 1];
  dm[5] = 2.0f;
  dm[F8_M * F8_N + 1] = 0.5f;
  s->in_d[r] = tpf_bulk_overlap_ex(c, &a, &b, &d, &o, NULL);
  snprintf(s->msg_d[r], sizeof s->msg_d[r], "%s", tpf_last_error());
  o.a_scale_inv = &dm[F8_M * F8_N]; /* just past d: fine */
  dm[F8_M * F8_N] = 2.0f;
  s->ok[r] = tpf_bulk_overlap_ex(c, &a, &b, &d, &o, NULL);
  for (int i = 0; i < F8_M * F8_N && s->ok[r] == TPF_OK; i++)
    if (dm[i] != (float)F8_K) s->ok[r] = tpf_set_error(TPF_EINVAL, "d[%d] = %g", i, (double)dm[i]);
  /* w_scale_inv in the registration of an fp8 RING AG buffer. */
  tpf_comm_config ca =
      tpf_test_config("qkv_fprop", TPF_ALGO_RING, TPF_COLL_AG, TPF_FP8_E4M3, 2 * F8_K, F8_K);
  TPF_CHECK(tpf_comm_create(be, &ca, &ag));
  void *base = NULL;
  uint64_t bytes = 0;
  TPF_CHECK(tpf_comm_registration(ag, &base, &bytes));
  tpf_matrix d2 = {dm, 2 * F8_K, F8_N / 2, F8_N / 2, TPF_FP32};
  tpf_matrix w = {s->b[r], F8_N / 2, F8_K, F8_K, TPF_FP8_E4M3};
  o.a_scale_inv = &dm[200];
  dm[200] = 1.0f;
  o.w_scale_inv = (const float *)((char *)base + bytes - sizeof(float));
  s->in_reg[r] = tpf_ag_gemm_ex(ag, &w, &d2, &o, NULL);
  snprintf(s->msg_reg[r], sizeof s->msg_reg[r], "%s", tpf_last_error());
  TPF_CHECK(tpf_comm_destroy(ag));
  return tpf_comm_destroy(c);
}

static void test_overlap__fp8_scales(void **state) {
  (void)state;
  tpf_sim_config sc = TPF_SIM_CONFIG_INIT;
  sc.tp_size = 2;
  tpf_sim_world *w = NULL;
  TPF_ASSERT_OK(tpf_sim_world_create(&sc, &w));
  static f8_run s;
  TPF_ASSERT_OK(tpf_sim_run(w, f8_rank, &s));
  for (int r = 0; r < 2; r++) {
    if (s.in_d[r] != TPF_EINVAL || !strstr(s.msg_d[r], "output d [") ||
        !strstr(s.msg_d[r], "and a_scale_inv ["))
      fail_msg("rank %d: a_scale_inv inside d: %s (%s), expected TPF_EINVAL naming both", r,
               tpf_status_name(s.in_d[r]), s.msg_d[r]);
    if (s.in_reg[r] != TPF_EINVAL || !strstr(s.msg_reg[r], "w_scale_inv [") ||
        !strstr(s.msg_reg[r], "overlaps the registered buffer"))
      fail_msg("rank %d: w_scale_inv inside the registration: %s (%s), expected TPF_EINVAL "
               "naming it",
               r, tpf_status_name(s.in_reg[r]), s.msg_reg[r]);
    TPF_ASSERT_OK(s.ok[r]);
  }
  TPF_ASSERT_OK(tpf_sim_world_destroy(w));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_overlap__ag_gemm),
      cmocka_unit_test(test_overlap__gemm_rs_and_bulk),
      cmocka_unit_test(test_overlap__simulator),
      cmocka_unit_test(test_overlap__fp8_scales),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
