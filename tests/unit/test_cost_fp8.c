/* FP8 in the cost model and the planner (include/tpflex/tpflex_cost.h, "Which points price a
 * GEMM"): fp8 gemm lines, the deterministic fallback of tables without fp8 points, GEMMs priced on
 * the dtype of their A operand (tpf_cost_predict_x, tpf_plan_predict_x) while bytes stay the
 * buffer's, the creation check of adaptive communicators, and adaptive FP8 communicators on the
 * simulator: an FP8 all-gather site on a table without fp8 points plans and runs, and the bf16
 * reduce-scatter site of an fp8 GEMM plans with fp8 prices (cache entries apart from bf16's). */
#include "tpflex/tpflex_cost.h"
#include "tpflex/tpflex_sim.h"
#include "tpf_test.h"

#include "reference.h"

#include <math.h>
#include <stdio.h>

static tpf_cost_table table_of(const char *text) {
  tpf_cost_table t;
  if (tpf_cost_table_parse(text, &t) != TPF_OK) fail_msg("table: %s", tpf_last_error());
  return t;
}

static bool close_to(double a, double b) {
  return fabs(a - b) <= 1e-9 * fmax(1.0, fabs(b));
}

#define LINKS                                                                                      \
  "launch_us 1\nhandshake_us 2\nbarrier_us 2\ncopy peer 1 10\ncopy local 1 40\nreduce 1 10\n"

/* bf16 at a constant 1e3 flops/us, fp8_e4m3 at 4e3, fp8_e5m2 at 2e3: each dtype's price differs,
 * so which points priced a GEMM shows in its time. 2 * 100 * 10 * 10 = 2e4 flops. */
static const char *ALL = LINKS "gemm bf16 100 10 10 20\n"
                               "gemm fp8_e4m3 100 10 10 5\n"
                               "gemm fp8_e5m2 100 10 10 10\n";

/* fp8 gemm lines parse into fp8 points, which price their GEMMs. */
static void test_fp8_lines(void **state) {
  (void)state;
  tpf_cost_table t = table_of(ALL);
  assert_int_equal(t.ngemm, 3);
  assert_int_equal(t.gemm[1].dtype, TPF_FP8_E4M3);
  assert_int_equal(t.gemm[2].dtype, TPF_FP8_E5M2);
  assert_true(t.gemm[1].m == 100 && t.gemm[1].n == 10 && t.gemm[1].k == 10 && t.gemm[1].us == 5);
  tpf_dtype used = TPF_BF16;
  double us = 0;
  /* Points of its own dtype price each fp8 kind (1e5 flops). */
  TPF_ASSERT_OK(tpf_cost_gemm_dtype(&t, TPF_FP8_E4M3, &used));
  assert_int_equal(used, TPF_FP8_E4M3);
  TPF_ASSERT_OK(tpf_cost_gemm_us(&t, TPF_FP8_E4M3, 500, 10, 10, &us));
  assert_true(close_to(us, 25.0));
  TPF_ASSERT_OK(tpf_cost_gemm_us(&t, TPF_FP8_E5M2, 500, 10, 10, &us));
  assert_true(close_to(us, 50.0));
  TPF_ASSERT_OK(tpf_cost_gemm_us(&t, TPF_BF16, 500, 10, 10, &us));
  assert_true(close_to(us, 100.0));
  /* A table as `tpflex calibrate` writes it: bf16 and fp8_e4m3 lines, no fp8_e5m2 ones. Both fp8
   * kinds are priced on the fp8_e4m3 points (cuBLASLt on Hopper: one rate). */
  tpf_cost_table cal = table_of(LINKS "gemm bf16 100 10 10 20\ngemm fp8_e4m3 100 10 10 5\n"
                                      "gemm fp8_e4m3 1000 10 10 40\n");
  assert_int_equal(cal.ngemm, 3);
  assert_true(cal.gemm[2].dtype == TPF_FP8_E4M3 && cal.gemm[2].m == 1000 && cal.gemm[2].us == 40);
  TPF_ASSERT_OK(tpf_cost_gemm_dtype(&cal, TPF_FP8_E5M2, &used));
  assert_int_equal(used, TPF_FP8_E4M3);
  double e4 = 0, e5 = 0;
  TPF_ASSERT_OK(tpf_cost_gemm_us(&cal, TPF_FP8_E4M3, 500, 10, 10, &e4));
  TPF_ASSERT_OK(tpf_cost_gemm_us(&cal, TPF_FP8_E5M2, 500, 10, 10, &e5));
  /* 1e5 flops, between 2e4 (rate 4e3) and 2e5 (5e3): rate 4e3 + log10(5) * 1e3 */
  assert_true(e5 == e4 && close_to(e4, 1e5 / (4e3 + (log(1e5) - log(2e4)) / log(10) * 1e3)));
  /* A misspelt fp8 name is refused with the dtypes it could have been. */
  tpf_cost_table bad;
  TPF_ASSERT_STATUS(tpf_cost_table_parse("gemm fp8_e4m4 1 1 1 1\n", &bad), TPF_EINVAL);
  assert_non_null(strstr(tpf_last_error(), "unknown dtype 'fp8_e4m4'"));
  assert_non_null(strstr(tpf_last_error(), "fp8_e4m3, fp8_e5m2"));
}

/* The fallback, in its documented order, and the refusals. */
static void test_fp8_fallback(void **state) {
  (void)state;
  struct {
    const char *gemm;     /* the table's gemm lines (rate: flops / us) */
    tpf_dtype want, used; /* priced dtype, whose points price it */
    double us;            /* at 1e5 flops */
  } ok[] = {
      {"gemm bf16 100 10 10 20\n", TPF_FP8_E4M3, TPF_BF16, 100}, /* h200.txt today */
      {"gemm bf16 100 10 10 20\n", TPF_FP8_E5M2, TPF_BF16, 100},
      {"gemm bf16 100 10 10 20\ngemm fp8_e4m3 100 10 10 5\n", TPF_FP8_E5M2, TPF_FP8_E4M3, 25},
      {"gemm bf16 100 10 10 20\ngemm fp8_e5m2 100 10 10 10\n", TPF_FP8_E4M3, TPF_FP8_E5M2, 50},
      {"gemm fp16 100 10 10 40\ngemm bf16 100 10 10 20\n", TPF_FP8_E4M3, TPF_BF16, 100},
      {"gemm fp32 100 10 10 80\ngemm fp16 100 10 10 40\n", TPF_FP8_E4M3, TPF_FP16, 200},
      {"gemm fp32 100 10 10 80\n", TPF_FP8_E5M2, TPF_FP32, 400},
  };
  for (size_t i = 0; i < TPF_ARRAY_SIZE(ok); i++) {
    char text[512];
    snprintf(text, sizeof text, "%s%s", LINKS, ok[i].gemm);
    tpf_cost_table t = table_of(text);
    tpf_dtype used = TPF_FP32;
    double us = 0;
    TPF_ASSERT_OK(tpf_cost_gemm_dtype(&t, ok[i].want, &used));
    if (used != ok[i].used)
      fail_msg("case %zu: %s priced on %s, want %s", i, tpf_dtype_name(ok[i].want),
               tpf_dtype_name(used), tpf_dtype_name(ok[i].used));
    TPF_ASSERT_OK(tpf_cost_gemm_us(&t, ok[i].want, 500, 10, 10, &us));
    if (!close_to(us, ok[i].us)) fail_msg("case %zu: %g us, want %g", i, us, ok[i].us);
    /* Deterministic: asked again, the same points and the same time. */
    double again = 0;
    TPF_ASSERT_OK(tpf_cost_gemm_us(&t, ok[i].want, 500, 10, 10, &again));
    assert_true(again == us);
  }
  /* No fallback for bf16, fp16 and fp32: a table of fp8 points only cannot price them. */
  tpf_cost_table f8 = table_of(LINKS "gemm fp8_e4m3 100 10 10 5\n");
  tpf_dtype used = TPF_FP32;
  double us = -1;
  TPF_ASSERT_STATUS(tpf_cost_gemm_dtype(&f8, TPF_BF16, &used), TPF_EINVAL);
  assert_non_null(strstr(tpf_last_error(), "no gemm point for bf16"));
  assert_int_equal(used, TPF_FP32); /* untouched */
  TPF_ASSERT_STATUS(tpf_cost_gemm_us(&f8, TPF_FP16, 1, 1, 1, &us), TPF_EINVAL);
  assert_non_null(strstr(tpf_last_error(), "fp16"));
  /* A table with no gemm point at all: a clear error naming the fp8 dtype and what was tried. */
  tpf_cost_table none = table_of(LINKS);
  TPF_ASSERT_STATUS(tpf_cost_gemm_us(&none, TPF_FP8_E4M3, 1, 1, 1, &us), TPF_EINVAL);
  assert_non_null(strstr(tpf_last_error(), "no gemm point for fp8_e4m3"));
  assert_non_null(strstr(tpf_last_error(), "fp8_e5m2, bf16, fp16, fp32"));
  assert_true(us == -1);
  TPF_ASSERT_STATUS(tpf_cost_gemm_dtype(&none, (tpf_dtype)TPF_DTYPE_COUNT, &used), TPF_EINVAL);
  TPF_ASSERT_STATUS(tpf_cost_gemm_dtype(NULL, TPF_BF16, &used), TPF_EINVAL);
  TPF_ASSERT_STATUS(tpf_cost_gemm_dtype(&none, TPF_BF16, NULL), TPF_EINVAL);
}

/* All P ranks' schedules of d (GEMM dims g). */
static void build_all(const tpf_layout_desc *d, const tpf_gemm_dims *g, tpf_schedule *s) {
  for (int r = 0; r < d->tp_size; r++) {
    tpf_layout_desc dr = *d;
    dr.rank = r;
    TPF_ASSERT_OK(tpf_schedule_build(&dr, g, &s[r]));
  }
}

/* The summed durations of rank 0's steps of one kind. */
static double kind_us(const tpf_schedule *s, const tpf_cost_span *sp, tpf_step_kind kind) {
  double sum = 0;
  for (int i = 0; i < s[0].nsteps; i++)
    if (s[0].steps[i].kind == kind) sum += sp[i].end_us - sp[i].start_us;
  return sum;
}

/* GEMMs take the dtype of their A operand; bytes stay the buffer's. */
static void test_predict_x(void **state) {
  (void)state;
  enum { P = 4, MAXS = 64 };
  tpf_cost_table t = table_of(ALL);
  static tpf_cost_span sp[2][P * MAXS];
  tpf_schedule s[P];
  double tot[2];
  /* The bf16 reduce-scatter site of an fp8 GEMM: x fp8 prices its GEMMs 4x faster; its
   * reductions read bf16 partials either way. */
  tpf_layout_desc rs = tpf_test_layout_desc(TPF_ALGO_RING, TPF_COLL_RS, P, 0, 128, 64, P, false);
  rs.dtype = TPF_BF16;
  tpf_gemm_dims g = {128, 64, 64};
  build_all(&rs, &g, s);
  TPF_ASSERT_OK(tpf_cost_predict_x(&t, s, P, TPF_BF16, sp[0], MAXS, &tot[0]));
  TPF_ASSERT_OK(tpf_cost_predict_x(&t, s, P, TPF_FP8_E4M3, sp[1], MAXS, &tot[1]));
  const double gb = kind_us(s, sp[0], TPF_STEP_GEMM), g8 = kind_us(s, sp[1], TPF_STEP_GEMM);
  assert_true(gb > 0 && close_to(g8 * 4, gb));
  const double red = kind_us(s, sp[0], TPF_STEP_REDUCE) + kind_us(s, sp[0], TPF_STEP_PEER_REDUCE);
  assert_true(red > 0);
  assert_true(
      close_to(red, kind_us(s, sp[1], TPF_STEP_REDUCE) + kind_us(s, sp[1], TPF_STEP_PEER_REDUCE)));
  assert_true(close_to(kind_us(s, sp[0], TPF_STEP_SEND), kind_us(s, sp[1], TPF_STEP_SEND)));
  assert_true(tot[1] < tot[0]);
  /* tpf_cost_predict is x = the schedule's dtype. */
  double plain = 0;
  TPF_ASSERT_OK(tpf_cost_predict(&t, s, P, sp[0], MAXS, &plain));
  assert_true(plain == tot[0]);
  TPF_ASSERT_STATUS(tpf_cost_predict_x(&t, s, P, (tpf_dtype)99, sp[0], MAXS, &plain), TPF_EINVAL);
  for (int r = 0; r < P; r++)
    tpf_schedule_free(&s[r]);

  /* An fp8 all-gather: its GEMMs read the fp8 buffer (x does not matter), its messages carry
   * 1-byte elements: half a bf16 buffer's bytes. */
  tpf_layout_desc ag = tpf_test_layout_desc(TPF_ALGO_RING, TPF_COLL_AG, P, 0, 128, 64, P, false);
  tpf_gemm_dims ga = {128, 64, 64};
  double send[2], gemm[2];
  const tpf_dtype dts[2] = {TPF_BF16, TPF_FP8_E4M3};
  for (int i = 0; i < 2; i++) {
    ag.dtype = dts[i];
    build_all(&ag, &ga, s);
    TPF_ASSERT_OK(tpf_cost_predict_x(&t, s, P, TPF_BF16, sp[i], MAXS, &tot[i]));
    double x8 = 0;
    TPF_ASSERT_OK(tpf_cost_predict_x(&t, s, P, TPF_FP8_E5M2, sp[1 - i], MAXS, &x8));
    assert_true(x8 == tot[i]); /* x plays no part in an all-gather */
    TPF_ASSERT_OK(tpf_cost_predict_x(&t, s, P, TPF_BF16, sp[i], MAXS, &tot[i]));
    send[i] = kind_us(s, sp[i], TPF_STEP_SEND);
    gemm[i] = kind_us(s, sp[i], TPF_STEP_GEMM);
    uint64_t bytes = 0;
    for (int k = 0; k < s[0].nsteps; k++)
      if (s[0].steps[k].kind == TPF_STEP_SEND) bytes += s[0].steps[k].bytes;
    assert_int_equal(bytes, (uint64_t)(P - 1) * 32 * 64 * tpf_dtype_size(dts[i]));
    for (int r = 0; r < P; r++)
      tpf_schedule_free(&s[r]);
  }
  /* copy peer 1 us + bytes / 10 GB/s: (P - 1) sends of 32 x 64 elements. */
  assert_true(close_to(send[0], 3 * (1 + 4096 / 1e4)));
  assert_true(close_to(send[1], 3 * (1 + 2048 / 1e4)));
  assert_true(close_to(gemm[1] * 4, gemm[0]));
}

/* The planner: tpf_plan_predict_x prices the RS site of an fp8 GEMM with fp8 GEMMs; measured
 * schedule points (bf16 GEMMs) do not apply to it; plan --predict's fp8 all-gather works on a
 * table without fp8 points. */
static void test_plan_predict_x(void **state) {
  (void)state;
  enum { P = 4 };
  tpf_layout_desc rs = tpf_test_layout_desc(TPF_ALGO_RING, TPF_COLL_RS, P, 0, 128, 64, P, false);
  rs.dtype = TPF_BF16;
  tpf_gemm_dims g = {128, 64, 64};
  const char *pts = "sched dedicated ring rs 4 4 0 bf16 64 64 128 1\n";
  char text[1024];
  snprintf(text, sizeof text, "%s%s", ALL, pts);
  tpf_cost_table t = table_of(text);
  tpf_plan_result rb, r8, rd;
  TPF_ASSERT_OK(tpf_plan_predict_x(&t, &rs, &g, TPF_BF16, &rb));
  TPF_ASSERT_OK(tpf_plan_predict(&t, &rs, &g, &rd));
  TPF_ASSERT_OK(tpf_plan_predict_x(&t, &rs, &g, TPF_FP8_E4M3, &r8));
  assert_int_equal(rb.ncand, r8.ncand);
  assert_int_equal(rb.cand[0].source, TPF_PLAN_SRC_MEASURED); /* the bf16 point */
  assert_true(rb.cand[0].predicted_us == 1);
  for (int i = 0; i < rb.ncand; i++) {
    assert_true(rd.cand[i].predicted_us == rb.cand[i].predicted_us);
    assert_int_equal(r8.cand[i].source, TPF_PLAN_SRC_MODEL); /* measured with bf16 GEMMs */
    assert_true(r8.cand[i].model_us < rb.cand[i].model_us);  /* 4x faster GEMMs */
  }
  TPF_ASSERT_STATUS(tpf_plan_predict_x(&t, &rs, &g, (tpf_dtype)-1, &r8), TPF_EINVAL);

  /* The all-gather of issue 28's plan --predict, on a table like h200.txt (bf16 points only):
   * priced on bf16's points, exactly as a bf16 GEMM of the same dims. */
  tpf_cost_table b16 = table_of(LINKS "gemm bf16 100 10 10 20\ngemm bf16 1000 10 10 100\n");
  tpf_layout_desc ag = tpf_test_layout_desc(TPF_ALGO_RING, TPF_COLL_AG, P, 0, 128, 64, P, false);
  ag.dtype = TPF_FP8_E4M3;
  tpf_plan_result ra;
  TPF_ASSERT_OK(tpf_plan_predict(&b16, &ag, &g, &ra));
  assert_int_equal(ra.ncand, 3);
  double gemm8 = 0, gemm16 = 0;
  TPF_ASSERT_OK(tpf_cost_gemm_us(&b16, TPF_FP8_E4M3, 128, 64, 64, &gemm8));
  TPF_ASSERT_OK(tpf_cost_gemm_us(&b16, TPF_BF16, 128, 64, 64, &gemm16));
  assert_true(gemm8 == gemm16);
  /* No point at all: the planner's error names the dtype. */
  tpf_cost_table none = table_of(LINKS);
  TPF_ASSERT_STATUS(tpf_plan_predict(&none, &ag, &g, &ra), TPF_EINVAL);
  assert_non_null(strstr(tpf_last_error(), "fp8_e4m3"));
}

/* An adaptive communicator whose table cannot price its GEMMs is refused at creation (so a
 * created one never fails to plan); an fp8 one is created on a table of bf16 points. */
static void test_adaptive_creation(void **state) {
  (void)state;
  tpf_mock_backend be;
  tpf_mock_init(&be, 4, 0);
  tpf_cost_table none = table_of(LINKS), f8 = table_of(LINKS "gemm fp8_e4m3 100 10 10 5\n"),
                 b16 = table_of(LINKS "gemm bf16 100 10 10 20\n");
  tpf_comm_config cfg =
      tpf_test_config("fc1_fp8", TPF_ALGO_RING, TPF_COLL_AG, TPF_FP8_E4M3, 256, 64);
  cfg.plan = TPF_PLAN_ADAPTIVE;
  tpf_comm *c = NULL;
  cfg.cost = &none;
  TPF_ASSERT_STATUS(tpf_comm_create(&be.hdr, &cfg, &c), TPF_EINVAL);
  assert_non_null(strstr(tpf_last_error(), "'fc1_fp8'"));
  assert_non_null(strstr(tpf_last_error(), "no gemm point for fp8_e4m3"));
  assert_null(c);
  cfg.cost = &b16;
  TPF_ASSERT_OK(tpf_comm_create(&be.hdr, &cfg, &c));
  TPF_ASSERT_OK(tpf_comm_destroy(c));
  c = NULL;
  cfg.dtype = TPF_BF16; /* fp8 points do not price bf16 GEMMs */
  cfg.cost = &f8;
  TPF_ASSERT_STATUS(tpf_comm_create(&be.hdr, &cfg, &c), TPF_EINVAL);
  assert_non_null(strstr(tpf_last_error(), "no gemm point for bf16"));
  cfg.algo = TPF_ALGO_BULK; /* never planned: any table */
  TPF_ASSERT_OK(tpf_comm_create(&be.hdr, &cfg, &c));
  TPF_ASSERT_OK(tpf_comm_destroy(c));
  assert_int_equal(be.reg_live, 0);
}

/* ---- on the simulator ------------------------------------------------------------------------
 * P = 4, C = 256, H = 64, N = K = 32. The all-gather site is fp8_e4m3 and plans on a table of
 * bf16 points only (the shipped h200.txt's situation); the reduce-scatter site is bf16 and runs
 * one bf16 and one fp8 gemm_rs per T on a table where fp8 GEMMs are 4x faster. Every output is
 * checked against a product computed here from the fp8 codes (fp32 sums, bf16 tolerances). */
#define SP 4
#define SC 256
#define SH 64
#define SN 32
#define SNT 3
static const uint64_t kTs[SNT] = {64, 128, 256};
static const float kSa = 0.5f, kSw = 0.25f;

typedef struct {
  tpf_cost_table ag_table, rs_table;
  tpf_status st[SP];
  char msg[SP][400];
  tpf_plan_result ag_got[SP][SNT], rs_got[SP][SNT][2]; /* [.][.][0]: bf16 x, [1]: fp8 x */
  int bad[SP];                                         /* wrong output elements */
  uint8_t w8[SN * SH], x8[SC * SN], wr8[SH * SN];
  uint16_t x16[SC * SN], wr16[SH * SN];
  uint16_t d[SP][SC * SN], out[SP][SC / SP * SH];
} sim_state;

/* The fp8 code of A's element (i, j) (every rank's view of the gathered rows). */
static uint8_t a_code(uint64_t i, uint64_t j) {
  uint64_t s = tpf_ref_mix(0xA11CE, i * SH + j);
  return tpf_ref_float_to_fp8(TPF_FP8_E4M3, tpf_ref_rand_uniform(&s, -1.0f, 1.0f));
}

/* Elements of got (bf16, [rows, cols]) off want(i, j) = scale * sum_k a(i, k) b(j, k). */
static int check_bf16(const uint16_t *got, uint64_t rows, uint64_t cols, uint64_t k,
                      float (*a)(const sim_state *, uint64_t, uint64_t),
                      float (*b)(const sim_state *, uint64_t, uint64_t), const sim_state *s,
                      uint64_t row0, double scale) {
  int bad = 0;
  for (uint64_t i = 0; i < rows; i++)
    for (uint64_t j = 0; j < cols; j++) {
      double want = 0;
      for (uint64_t q = 0; q < k; q++)
        want += (double)a(s, row0 + i, q) * (double)b(s, j, q);
      want *= scale;
      const double v = tpf_ref_bf16_to_float(got[i * cols + j]), err = fabs(v - want);
      if (err > 0.002 && err > 0.02 * fmax(fabs(want), 1e-5)) bad++;
    }
  return bad;
}

static float ag_a(const sim_state *s, uint64_t i, uint64_t j) {
  (void)s;
  return tpf_ref_fp8_to_float(TPF_FP8_E4M3, a_code(i, j));
}
static float ag_w(const sim_state *s, uint64_t i, uint64_t j) {
  return tpf_ref_fp8_to_float(TPF_FP8_E4M3, s->w8[i * SH + j]);
}
static float rs_x8(const sim_state *s, uint64_t i, uint64_t j) {
  return tpf_ref_fp8_to_float(TPF_FP8_E4M3, s->x8[i * SN + j]);
}
static float rs_w8(const sim_state *s, uint64_t i, uint64_t j) {
  return tpf_ref_fp8_to_float(TPF_FP8_E4M3, s->wr8[i * SN + j]);
}
static float rs_x16(const sim_state *s, uint64_t i, uint64_t j) {
  return tpf_ref_bf16_to_float(s->x16[i * SN + j]);
}
static float rs_w16(const sim_state *s, uint64_t i, uint64_t j) {
  return tpf_ref_bf16_to_float(s->wr16[i * SN + j]);
}

static tpf_status sim_ag(tpf_backend *be, int r, sim_state *s) {
  tpf_comm_config cfg =
      tpf_test_config("fc1_fp8", TPF_ALGO_RING, TPF_COLL_AG, TPF_FP8_E4M3, SC, SH);
  cfg.plan = TPF_PLAN_ADAPTIVE;
  cfg.cost = &s->ag_table;
  tpf_comm *c = NULL;
  TPF_CHECK(tpf_comm_create(be, &cfg, &c));
  tpf_status st = TPF_OK;
  for (int i = 0; i < SNT && st == TPF_OK; i++) {
    const uint64_t T = kTs[i], R = T / SP;
    st = tpf_comm_set_active_shape(c, (tpf_shape){T, SH});
    tpf_matrix local;
    if (st == TPF_OK) st = tpf_comm_local_chunk(c, &local);
    if (st != TPF_OK) break;
    for (uint64_t a = 0; a < R; a++)
      for (uint64_t j = 0; j < SH; j++)
        ((uint8_t *)local.ptr)[a * local.ld + j] = a_code((uint64_t)r * R + a, j);
    tpf_matrix w = {s->w8, SN, SH, SH, TPF_FP8_E4M3}, d = {s->d[r], T, SN, SN, TPF_BF16};
    tpf_op_options o = TPF_OP_OPTIONS_INIT;
    o.a_scale_inv = &kSa;
    o.w_scale_inv = &kSw;
    st = tpf_ag_gemm_ex(c, &w, &d, &o, NULL);
    if (st == TPF_OK) st = tpf_comm_plan_info(c, &s->ag_got[r][i]);
    if (st == TPF_OK)
      s->bad[r] += check_bf16(s->d[r], T, SN, SH, ag_a, ag_w, s, 0, (double)kSa * kSw);
  }
  tpf_status dst = tpf_comm_destroy(c);
  return st != TPF_OK ? st : dst;
}

static tpf_status sim_rs(tpf_backend *be, int r, sim_state *s) {
  tpf_comm_config cfg = tpf_test_config("fc2_fp8", TPF_ALGO_RING, TPF_COLL_RS, TPF_BF16, SC, SH);
  cfg.plan = TPF_PLAN_ADAPTIVE;
  cfg.cost = &s->rs_table;
  tpf_comm *c = NULL;
  TPF_CHECK(tpf_comm_create(be, &cfg, &c));
  tpf_status st = TPF_OK;
  for (int i = 0; i < SNT && st == TPF_OK; i++) {
    const uint64_t T = kTs[i], R = T / SP;
    st = tpf_comm_set_active_shape(c, (tpf_shape){T, SH});
    for (int f = 0; f < 2 && st == TPF_OK; f++) { /* every rank: the same x and w */
      const tpf_dtype dt = f ? TPF_FP8_E4M3 : TPF_BF16;
      tpf_matrix x = {f ? (void *)s->x8 : (void *)s->x16, T, SN, SN, dt};
      tpf_matrix w = {f ? (void *)s->wr8 : (void *)s->wr16, SH, SN, SN, dt};
      tpf_matrix out = {s->out[r], R, SH, SH, TPF_BF16};
      tpf_op_options o = TPF_OP_OPTIONS_INIT;
      o.a_scale_inv = f ? &kSa : NULL;
      o.w_scale_inv = f ? &kSw : NULL;
      st = tpf_gemm_rs_ex(c, &x, &w, &out, &o, NULL);
      if (st == TPF_OK) st = tpf_comm_plan_info(c, &s->rs_got[r][i][f]);
      if (st == TPF_OK)
        s->bad[r] += check_bf16(s->out[r], R, SH, SN, f ? rs_x8 : rs_x16, f ? rs_w8 : rs_w16, s,
                                (uint64_t)r * R, SP * (f ? (double)kSa * kSw : 1.0));
    }
  }
  tpf_status dst = tpf_comm_destroy(c);
  return st != TPF_OK ? st : dst;
}

static tpf_status sim_rank(tpf_backend *be, int r, void *arg) {
  sim_state *s = arg;
  tpf_status st = sim_ag(be, r, s);
  if (st == TPF_OK) st = sim_rs(be, r, s);
  s->st[r] = st;
  snprintf(s->msg[r], sizeof s->msg[r], "%s", st == TPF_OK ? "" : tpf_last_error());
  return st;
}

static void test_adaptive_fp8_on_sim(void **state) {
  (void)state;
  static sim_state s;
  memset(&s, 0, sizeof s);
  s.ag_table = table_of(LINKS "gemm bf16 16 32 64 10\ngemm bf16 256 32 64 40\n");
  s.rs_table = table_of(LINKS "gemm bf16 16 64 32 10\ngemm bf16 256 64 32 40\n"
                              "gemm fp8_e4m3 16 64 32 2.5\ngemm fp8_e4m3 256 64 32 10\n");
  uint64_t seed = 7;
  for (size_t i = 0; i < sizeof s.w8; i++)
    s.w8[i] = tpf_ref_float_to_fp8(TPF_FP8_E4M3, tpf_ref_rand_uniform(&seed, -1.0f, 1.0f));
  for (size_t i = 0; i < sizeof s.x8; i++)
    s.x8[i] = tpf_ref_float_to_fp8(TPF_FP8_E4M3, tpf_ref_rand_uniform(&seed, -1.0f, 1.0f));
  for (size_t i = 0; i < sizeof s.wr8; i++)
    s.wr8[i] = tpf_ref_float_to_fp8(TPF_FP8_E4M3, tpf_ref_rand_uniform(&seed, -1.0f, 1.0f));
  for (size_t i = 0; i < SC * SN; i++)
    s.x16[i] = tpf_ref_float_to_bf16(tpf_ref_rand_uniform(&seed, -1.0f, 1.0f));
  for (size_t i = 0; i < SH * SN; i++)
    s.wr16[i] = tpf_ref_float_to_bf16(tpf_ref_rand_uniform(&seed, -1.0f, 1.0f));
  tpf_sim_config sc = TPF_SIM_CONFIG_INIT;
  sc.tp_size = SP;
  sc.timeout_ms = 10000;
  tpf_sim_world *w = NULL;
  TPF_ASSERT_OK(tpf_sim_world_create(&sc, &w));
  tpf_status st = tpf_sim_run(w, sim_rank, &s);
  TPF_ASSERT_OK(tpf_sim_world_destroy(w));
  for (int r = 0; r < SP; r++)
    if (s.st[r] != TPF_OK) fail_msg("rank %d: %s: %s", r, tpf_status_name(s.st[r]), s.msg[r]);
  TPF_ASSERT_OK(st);
  for (int r = 0; r < SP; r++)
    if (s.bad[r]) fail_msg("rank %d: %d output elements off the reference", r, s.bad[r]);
  for (int i = 0; i < SNT; i++) {
    const uint64_t T = kTs[i];
    /* The all-gather's decision is tpf_plan_predict's for its fp8 layout (bf16's points). */
    tpf_layout_desc ag = tpf_test_layout_desc(TPF_ALGO_RING, TPF_COLL_AG, SP, 0, T, SH, 0, false);
    ag.dtype = TPF_FP8_E4M3;
    ag.capacity.rows = SC;
    tpf_gemm_dims g = {T, SN, SH};
    tpf_plan_result want;
    TPF_ASSERT_OK(tpf_plan_predict(&s.ag_table, &ag, &g, &want));
    tpf_layout_desc rs = ag;
    rs.coll = TPF_COLL_RS;
    rs.dtype = TPF_BF16;
    tpf_gemm_dims gr = {T, SH, SN};
    tpf_plan_result wb, w8;
    TPF_ASSERT_OK(tpf_plan_predict_x(&s.rs_table, &rs, &gr, TPF_BF16, &wb));
    TPF_ASSERT_OK(tpf_plan_predict_x(&s.rs_table, &rs, &gr, TPF_FP8_E4M3, &w8));
    for (int r = 0; r < SP; r++) {
      const tpf_plan_result *a = &s.ag_got[r][i], *b = &s.rs_got[r][i][0], *f = &s.rs_got[r][i][1];
      assert_int_equal(a->ncand, want.ncand);
      assert_int_equal(a->chosen, want.chosen);
      assert_int_equal(b->ncand, wb.ncand);
      assert_int_equal(f->ncand, w8.ncand);
      assert_int_equal(b->chosen, wb.chosen);
      assert_int_equal(f->chosen, w8.chosen);
      for (int k = 0; k < want.ncand; k++)
        assert_true(a->cand[k].predicted_us == want.cand[k].predicted_us);
      for (int k = 0; k < wb.ncand; k++) {
        assert_true(b->cand[k].predicted_us == wb.cand[k].predicted_us);
        assert_true(f->cand[k].predicted_us == w8.cand[k].predicted_us);
        assert_true(f->cand[k].predicted_us < b->cand[k].predicted_us); /* fp8 GEMMs priced */
      }
    }
    print_message("T=%llu fp8 ag: %s\n", (unsigned long long)T, s.ag_got[0][i].why);
    print_message("T=%llu rs, fp8 x: %s\n", (unsigned long long)T, s.rs_got[0][i][1].why);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fp8_lines),         cmocka_unit_test(test_fp8_fallback),
      cmocka_unit_test(test_predict_x),         cmocka_unit_test(test_plan_predict_x),
      cmocka_unit_test(test_adaptive_creation), cmocka_unit_test(test_adaptive_fp8_on_sim),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
