/* FP8 E4M3 (fn) and E5M2 (SPEC §11): the library's conversions (core/dtype.c, used by the
 * simulator) and the independent reference's (harness/reference.c) against the formats'
 * definitions: every one of the 256 codes of each format decodes to the value written out here
 * from first principles, and encoding rounds to nearest even with saturation to the largest
 * finite value at the boundaries and ties. */
#include "tpf_test.h"

#include "reference.h"

#include <math.h>
#include <stddef.h>
#include <string.h>

/* The expected value of code v, from the format: sign, exponent field e, mantissa m. */
static double fmt_value(tpf_dtype t, unsigned v) {
  const bool e4 = t == TPF_FP8_E4M3;
  const unsigned mb = e4 ? 3 : 2, eb = e4 ? 4 : 5, bias = e4 ? 7 : 15;
  const unsigned e = (v >> mb) & ((1u << eb) - 1u), m = v & ((1u << mb) - 1u);
  const double s = (v & 0x80u) ? -1.0 : 1.0;
  if (e4 && e == 15 && m == 7) return NAN;
  if (!e4 && e == 31) return m ? NAN : s * INFINITY;
  if (e == 0) return s * (double)m * pow(2.0, 1.0 - (double)bias - (double)mb);
  return s * (1.0 + (double)m / (double)(1u << mb)) * pow(2.0, (double)e - (double)bias);
}

static float lib_decode(tpf_dtype t, uint8_t v) {
  return tpf_elem_to_float(t, &v);
}
static uint8_t lib_encode(tpf_dtype t, float f) {
  uint8_t v = 0;
  tpf_float_to_elem(t, f, &v);
  return v;
}

static void check_decode_all(tpf_dtype t) {
  for (unsigned v = 0; v < 256; v++) {
    const double want = fmt_value(t, v);
    const float lib = lib_decode(t, (uint8_t)v), ref = tpf_ref_fp8_to_float(t, (uint8_t)v);
    if (isnan(want)) {
      if (!isnan(lib) || !isnan(ref))
        fail_msg("%s code 0x%02x: want NaN, lib %g ref %g", tpf_dtype_name(t), v, (double)lib,
                 (double)ref);
      continue;
    }
    if ((double)lib != want || (double)ref != want || !signbit(lib) != !signbit(want) ||
        !signbit(ref) != !signbit(want))
      fail_msg("%s code 0x%02x: want %.9g, lib %.9g ref %.9g", tpf_dtype_name(t), v, want,
               (double)lib, (double)ref);
    /* Every finite code round-trips through both encoders (-0 stays 0x80). */
    if (isfinite(want) &&
        (lib_encode(t, (float)want) != v || tpf_ref_float_to_fp8(t, (float)want) != v))
      fail_msg("%s code 0x%02x (%g) encodes to lib 0x%02x ref 0x%02x", tpf_dtype_name(t), v, want,
               lib_encode(t, (float)want), tpf_ref_float_to_fp8(t, (float)want));
  }
}

static void test_fp8__decode_every_e4m3_code(void **state) {
  (void)state;
  check_decode_all(TPF_FP8_E4M3);
  assert_true(fmt_value(TPF_FP8_E4M3, 0x7e) == 448.0);          /* max */
  assert_true(fmt_value(TPF_FP8_E4M3, 0x01) == ldexp(1.0, -9)); /* min subnormal */
  assert_true(fmt_value(TPF_FP8_E4M3, 0x08) == ldexp(1.0, -6)); /* min normal */
  assert_true(isnan(lib_decode(TPF_FP8_E4M3, 0xff)) && isnan(lib_decode(TPF_FP8_E4M3, 0x7f)));
}

static void test_fp8__decode_every_e5m2_code(void **state) {
  (void)state;
  check_decode_all(TPF_FP8_E5M2);
  assert_true(fmt_value(TPF_FP8_E5M2, 0x7b) == 57344.0);
  assert_true(isinf(lib_decode(TPF_FP8_E5M2, 0x7c)) && lib_decode(TPF_FP8_E5M2, 0xfc) < 0.0f);
  assert_true(isnan(lib_decode(TPF_FP8_E5M2, 0x7d)) && isnan(lib_decode(TPF_FP8_E5M2, 0xff)));
  assert_true(fmt_value(TPF_FP8_E5M2, 0x01) == ldexp(1.0, -16));
}

typedef struct {
  float in;
  uint8_t want;
} enc_case;

static void check_encode(tpf_dtype t, const enc_case *cs, size_t n) {
  for (size_t i = 0; i < n; i++) {
    uint8_t lib = lib_encode(t, cs[i].in), ref = tpf_ref_float_to_fp8(t, cs[i].in);
    if (lib != cs[i].want || ref != cs[i].want)
      fail_msg("%s encode(%.9g): want 0x%02x, lib 0x%02x ref 0x%02x", tpf_dtype_name(t),
               (double)cs[i].in, cs[i].want, lib, ref);
  }
}

static void test_fp8__encode_ties_and_saturation_e4m3(void **state) {
  (void)state;
  const enc_case cs[] = {
      {1.0625f, 0x38},    /* 1 + 1/16: tie between 1 (0x38, even) and 1.125 -> 1 */
      {1.1875f, 0x3a},    /* tie between 1.125 (0x39) and 1.25 (0x3a, even) -> 1.25 */
      {1.0625001f, 0x39}, /* just above the tie -> 1.125 */
      {432.0f, 0x7e},     /* tie 416 (0x7d) / 448 (0x7e, even) -> 448 */
      {400.0f, 0x7c},     /* tie 384 (0x7c, even) / 416 (0x7d) -> 384 */
      {464.0f, 0x7e},     /* between 448 and the missing 480: saturates */
      {1e6f, 0x7e},       /* saturation */
      {INFINITY, 0x7e},   /* infinities saturate too (no infinity code) */
      {-INFINITY, 0xfe},  {-500.0f, 0xfe},
      {0x1p-10f, 0x00},   /* half the smallest subnormal: tie to 0 (even) */
      {0x1.8p-10f, 0x01}, /* above half: the smallest subnormal */
      {0x1.8p-9f, 0x02},  /* 1.5 * 2^-9: tie 1 (odd) / 2 (even) -> 2 */
      {0x1.ep-7f, 0x08},  /* 0.9375 * 2^-6 rounds up into the smallest normal 2^-6 */
      {-0.0f, 0x80},      {0.0f, 0x00},
  };
  check_encode(TPF_FP8_E4M3, cs, sizeof cs / sizeof cs[0]);
  assert_int_equal(lib_encode(TPF_FP8_E4M3, NAN) & 0x7f, 0x7f);
  assert_int_equal(tpf_ref_float_to_fp8(TPF_FP8_E4M3, NAN) & 0x7f, 0x7f);
}

static void test_fp8__encode_ties_and_saturation_e5m2(void **state) {
  (void)state;
  const enc_case cs[] = {
      {1.125f, 0x3c},                       /* tie 1 (0x3c, even) / 1.25 -> 1 */
      {1.375f, 0x3e},                       /* tie 1.25 (0x3d) / 1.5 (0x3e, even) -> 1.5 */
      {53248.0f, 0x7a},                     /* tie 49152 (0x7a, even) / 57344 (0x7b) -> 49152 */
      {60000.0f, 0x7b},                     /* past the max: saturates, not infinity */
      {INFINITY, 0x7b},                     /* satfinite */
      {-1e30f, 0xfb},     {0x1p-17f, 0x00}, /* half the smallest subnormal 2^-16: tie to 0 */
      {0x1.8p-16f, 0x02},                   /* tie 1 / 2 subnormal quanta -> 2 (even) */
      {0x1.cp-15f, 0x04}, /* 3.5 quanta of 2^-16 round up into the smallest normal 2^-14 */
  };
  check_encode(TPF_FP8_E5M2, cs, sizeof cs / sizeof cs[0]);
  assert_true(isnan(lib_decode(TPF_FP8_E5M2, lib_encode(TPF_FP8_E5M2, NAN))));
  assert_true(isnan(tpf_ref_fp8_to_float(TPF_FP8_E5M2, tpf_ref_float_to_fp8(TPF_FP8_E5M2, NAN))));
}

/* Midpoints between every pair of adjacent finite magnitudes go to the even code; a hair either
 * side goes to the nearer one. Both encoders, every binade, both formats. */
static void check_midpoints(tpf_dtype t) {
  const unsigned top = t == TPF_FP8_E4M3 ? 0x7e : 0x7b;
  for (unsigned v = 0; v < top; v++) {
    const float lo = (float)fmt_value(t, v), hi = (float)fmt_value(t, v + 1);
    const float mid = (lo + hi) / 2.0f; /* exact in fp32 */
    const uint8_t even = (uint8_t)((v & 1u) ? v + 1 : v);
    const enc_case cs[] = {{mid, even},
                           {nextafterf(mid, 0.0f), (uint8_t)v},
                           {nextafterf(mid, INFINITY), (uint8_t)(v + 1)},
                           {-mid, (uint8_t)(0x80u | even)}};
    check_encode(t, cs, sizeof cs / sizeof cs[0]);
  }
}

static void test_fp8__every_midpoint(void **state) {
  (void)state;
  check_midpoints(TPF_FP8_E4M3);
  check_midpoints(TPF_FP8_E5M2);
}

/* The core's operand rules for fp8 (SPEC §11), on the mock backend (which lacks TPF_BE_CAP_FP8):
 * every refusal is decided before the backend sees anything, and names what is wrong. */
enum { MP = 2, MC = 64, MH = 32, MK = 16, MN = 24 };
static unsigned char g_buf[4][MC * 64 * 4];

static tpf_comm *mk(tpf_mock_backend *be, tpf_algo algo, tpf_coll coll, tpf_dtype dt) {
  tpf_comm_config cfg = tpf_test_config("fc1_fprop", algo, coll, dt, MC, MH);
  tpf_comm *c = NULL;
  TPF_ASSERT_OK(tpf_comm_create(&be->hdr, &cfg, &c));
  tpf_shape s = {16, MH};
  TPF_ASSERT_OK(tpf_comm_set_active_shape(c, s)); /* fp8 follows the shape */
  return c;
}

static void expect_err(tpf_status got, tpf_status want, const char *needle) {
  TPF_ASSERT_STATUS(got, want);
  if (!strstr(tpf_last_error(), needle))
    fail_msg("detail '%s' lacks '%s'", tpf_last_error(), needle);
}

static void test_fp8__operand_rules(void **state) {
  (void)state;
  tpf_mock_backend be;
  tpf_mock_init(&be, MP, 0);
  tpf_comm *ag = mk(&be, TPF_ALGO_RING, TPF_COLL_AG, TPF_FP8_E5M2);
  tpf_comm *rs = mk(&be, TPF_ALGO_PIPELINE, TPF_COLL_RS, TPF_BF16);
  tpf_comm *rs8 = mk(&be, TPF_ALGO_RING, TPF_COLL_RS, TPF_FP8_E4M3);
  tpf_comm *bk = mk(&be, TPF_ALGO_BULK, TPF_COLL_AG, TPF_BF16);
  const int execs = be.executions;
  tpf_matrix w = {g_buf[0], MN, MH, MH, TPF_FP8_E4M3}, d = {g_buf[1], 16, MN, MN, TPF_BF16};
  const float one = 1.0f;
  tpf_op_options o = TPF_OP_OPTIONS_INIT;
  /* e5m2 buffer x e4m3 w is a pair cuBLASLt takes: refused only for the mock's missing cap. */
  expect_err(tpf_ag_gemm_ex(ag, &w, &d, NULL, NULL), TPF_EUNSUPPORTED, "TPF_BE_CAP_FP8");
  w.dtype = TPF_FP8_E5M2;
  expect_err(tpf_ag_gemm_ex(ag, &w, &d, NULL, NULL), TPF_EUNSUPPORTED, "both fp8_e5m2");
  w.dtype = TPF_BF16;
  expect_err(tpf_ag_gemm_ex(ag, &w, &d, NULL, NULL), TPF_EINVAL,
             "weight w has dtype bf16, expected fp8_e4m3 or fp8_e5m2");
  w.dtype = TPF_FP8_E4M3;
  d.dtype = TPF_FP8_E4M3;
  expect_err(tpf_ag_gemm_ex(ag, &w, &d, NULL, NULL), TPF_EINVAL,
             "output d has dtype fp8_e4m3; the output of an fp8 GEMM");
  d.dtype = TPF_BF16;
  /* gemm_rs: fp8 x and w on a bf16 RS buffer; mixed operands and stray scales refused. */
  tpf_matrix x = {g_buf[2], 16, MK, MK, TPF_FP8_E4M3}, wr = {g_buf[0], MH, MK, MK, TPF_BF16},
             out = {g_buf[1], 16 / MP, MH, MH, TPF_BF16};
  expect_err(tpf_gemm_rs_ex(rs, &x, &wr, &out, NULL, NULL), TPF_EINVAL,
             "input x has dtype fp8_e4m3 but weight w has bf16");
  wr.dtype = TPF_FP8_E5M2;
  expect_err(tpf_gemm_rs_ex(rs, &x, &wr, &out, NULL, NULL), TPF_EUNSUPPORTED, "TPF_BE_CAP_FP8");
  x.dtype = wr.dtype = TPF_BF16;
  o.a_scale_inv = &one;
  expect_err(tpf_gemm_rs_ex(rs, &x, &wr, &out, &o, NULL), TPF_EINVAL,
             "a_scale_inv is set but input x has dtype bf16");
  o.a_scale_inv = NULL;
  expect_err(tpf_gemm_rs_ex(rs8, &x, &wr, &out, NULL, NULL), TPF_EUNSUPPORTED,
             "fp8_e4m3 RS buffer");
  /* bulk: fp8 a with a bf16 b; a w scale on a bf16 b. */
  tpf_matrix a = {g_buf[2], 8, MK, MK, TPF_FP8_E4M3}, b = {g_buf[0], MN, MK, MK, TPF_BF16},
             db = {g_buf[1], 8, MN, MN, TPF_FP32};
  expect_err(tpf_bulk_overlap_ex(bk, &a, &b, &db, NULL, NULL), TPF_EINVAL,
             "b has dtype bf16, expected fp8_e4m3 or fp8_e5m2");
  a.dtype = TPF_BF16;
  o.w_scale_inv = &one;
  expect_err(tpf_bulk_overlap_ex(bk, &a, &b, &db, &o, NULL), TPF_EINVAL,
             "w_scale_inv is set but b has dtype bf16");
  assert_int_equal(be.executions, execs); /* nothing reached the backend */
  /* 0.2's options size (without the scales) is still accepted. */
  tpf_op_options o2 = TPF_OP_OPTIONS_INIT;
  o2.size = offsetof(tpf_op_options, a_scale_inv);
  TPF_ASSERT_OK(tpf_bulk_overlap_ex(bk, &a, &b, &db, &o2, NULL));
  assert_int_equal(be.executions, execs + 1);
  TPF_ASSERT_OK(tpf_comm_destroy(ag));
  TPF_ASSERT_OK(tpf_comm_destroy(rs));
  TPF_ASSERT_OK(tpf_comm_destroy(rs8));
  TPF_ASSERT_OK(tpf_comm_destroy(bk));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fp8__decode_every_e4m3_code),
      cmocka_unit_test(test_fp8__decode_every_e5m2_code),
      cmocka_unit_test(test_fp8__encode_ties_and_saturation_e4m3),
      cmocka_unit_test(test_fp8__encode_ties_and_saturation_e5m2),
      cmocka_unit_test(test_fp8__every_midpoint),
      cmocka_unit_test(test_fp8__operand_rules),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
