/* Paths the module tests leave out, each checked against an independent expectation: element
 * conversions against known bit patterns (IEEE binary16, bfloat16, OCP fp8 E4M3/E5M2), the
 * manager's rollback and destroy when the backend refuses, operand checks of tpf_gemm_rs and
 * tpf_bulk_overlap, name and layout queries on bad values, and the schedule checker under an
 * allocation budget and on 64-bit overflowing views. */
#include "tpf_test.h"

#include <math.h>

/* ---- element conversions ---- */

/* 2^e for a normal float exponent, exactly (no libm). */
static float pow2(int e) {
  uint32_t u = (uint32_t)(127 + e) << 23;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static uint16_t to_half(float v) {
  uint16_t h;
  tpf_float_to_elem(TPF_FP16, v, &h);
  return h;
}

static uint16_t to_bf16(float v) {
  uint16_t h;
  tpf_float_to_elem(TPF_BF16, v, &h);
  return h;
}

static uint8_t to_fp8(tpf_dtype t, float v) {
  uint8_t b;
  tpf_float_to_elem(t, v, &b);
  return b;
}

static float from_u16(tpf_dtype t, uint16_t h) {
  return tpf_elem_to_float(t, &h);
}
static float from_u8(tpf_dtype t, uint8_t b) {
  return tpf_elem_to_float(t, &b);
}

static float bits_f(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static void test_gaps__fp16_rounding(void **state) {
  (void)state;
  const float u = pow2(-24); /* the smallest subnormal half */
  /* Subnormals: round to nearest, ties to the even count of 2^-24 units. */
  assert_int_equal(to_half(u), 0x0001);
  assert_int_equal(to_half(-u), 0x8001);
  assert_int_equal(to_half(0.5f * u), 0x0000);    /* tie 0 | 1: even 0 */
  assert_int_equal(to_half(0.75f * u), 0x0001);   /* above the tie */
  assert_int_equal(to_half(1.5f * u), 0x0002);    /* tie 1 | 2: even 2 */
  assert_int_equal(to_half(2.5f * u), 0x0002);    /* tie 2 | 3: even 2 */
  assert_int_equal(to_half(1023.0f * u), 0x03FF); /* the largest subnormal */
  assert_int_equal(to_half(1023.5f * u), 0x0400); /* rounds up into the smallest normal */
  assert_int_equal(to_half(pow2(-14)), 0x0400);
  assert_int_equal(to_half(pow2(-26)), 0x0000); /* underflow to +0 */
  /* Normals: ties to even, and a mantissa carry into the exponent. */
  assert_int_equal(to_half(1.0f), 0x3C00);
  assert_int_equal(to_half(1.0f + pow2(-11)), 0x3C00);        /* tie, even stays */
  assert_int_equal(to_half(1.0f + 3.0f * pow2(-11)), 0x3C02); /* tie, odd goes up */
  assert_int_equal(to_half(bits_f(0x3FFFF000u)), 0x4000);     /* 1.99988 -> 2.0 */
  assert_int_equal(to_half(-2.0f), 0xC000);
  /* Overflow: 65504 is the largest finite half; from 65520 on everything rounds to Inf. */
  assert_int_equal(to_half(65504.0f), 0x7BFF);
  assert_int_equal(to_half(65519.0f), 0x7BFF);
  assert_int_equal(to_half(65520.0f), 0x7C00);
  assert_int_equal(to_half(-1e9f), 0xFC00);
  /* Inf and NaN keep their class and sign; NaN is quiet. */
  assert_int_equal(to_half(INFINITY), 0x7C00);
  assert_int_equal(to_half(-INFINITY), 0xFC00);
  assert_int_equal(to_half(bits_f(0x7FC00000u)), 0x7E00);
  assert_int_equal(to_half(bits_f(0xFF800001u)), 0xFE00); /* signalling, negative */
  /* Decoding. */
  assert_true(from_u16(TPF_FP16, 0x0001) == u);
  assert_true(from_u16(TPF_FP16, 0x03FF) == 1023.0f * u);
  assert_true(from_u16(TPF_FP16, 0x8000) == 0.0f && signbit(from_u16(TPF_FP16, 0x8000)));
  assert_true(from_u16(TPF_FP16, 0x7BFF) == 65504.0f);
  assert_true(isinf(from_u16(TPF_FP16, 0xFC00)) && from_u16(TPF_FP16, 0xFC00) < 0.0f);
  assert_true(isnan(from_u16(TPF_FP16, 0x7E00)));
}

static void test_gaps__bf16_nan_and_ties(void **state) {
  (void)state;
  assert_int_equal(to_bf16(bits_f(0x7FC00001u)), 0x7FC0);    /* quiet NaN stays quiet */
  assert_int_equal(to_bf16(bits_f(0x7F800001u)), 0x7FC0);    /* signalling NaN is quieted */
  assert_int_equal(to_bf16(bits_f(0xFF800001u)), 0xFFC0);    /* and keeps its sign */
  assert_int_equal(to_bf16(INFINITY), 0x7F80);               /* Inf is not a NaN */
  assert_int_equal(to_bf16(1.0f + pow2(-8)), 0x3F80);        /* tie, even stays */
  assert_int_equal(to_bf16(1.0f + 3.0f * pow2(-8)), 0x3F82); /* tie, odd goes up */
  assert_true(isnan(from_u16(TPF_BF16, 0x7FC0)));
}

static void test_gaps__fp8_ties_and_saturation(void **state) {
  (void)state;
  /* E4M3: bias 7, 3 mantissa bits, largest finite 448 = 0x7E (0x7F is NaN, never produced). */
  assert_int_equal(to_fp8(TPF_FP8_E4M3, 1.0f), 0x38);
  assert_int_equal(to_fp8(TPF_FP8_E4M3, 1.0625f), 0x38); /* tie 1.0 | 1.125: even code */
  assert_int_equal(to_fp8(TPF_FP8_E4M3, 1.1875f), 0x3A); /* tie 1.125 | 1.25: even code */
  assert_int_equal(to_fp8(TPF_FP8_E4M3, 448.0f), 0x7E);
  assert_int_equal(to_fp8(TPF_FP8_E4M3, 464.0f), 0x7E); /* saturates, never 480 */
  assert_int_equal(to_fp8(TPF_FP8_E4M3, 1e6f), 0x7E);
  assert_int_equal(to_fp8(TPF_FP8_E4M3, -1e6f), 0xFE);
  assert_int_equal(to_fp8(TPF_FP8_E4M3, pow2(-9)), 0x01);         /* smallest subnormal */
  assert_int_equal(to_fp8(TPF_FP8_E4M3, pow2(-10)), 0x00);        /* tie 0 | 1: 0 */
  assert_int_equal(to_fp8(TPF_FP8_E4M3, 3.0f * pow2(-10)), 0x02); /* tie 1 | 2: 2 */
  assert_true(from_u8(TPF_FP8_E4M3, 0x7E) == 448.0f);
  assert_true(from_u8(TPF_FP8_E4M3, 0x01) == pow2(-9));
  assert_true(from_u8(TPF_FP8_E4M3, 0xB8) == -1.0f);
  /* E5M2: bias 15, 2 mantissa bits, largest finite 57344 = 0x7B. */
  assert_int_equal(to_fp8(TPF_FP8_E5M2, 1.0f), 0x3C);
  assert_int_equal(to_fp8(TPF_FP8_E5M2, 1.125f), 0x3C); /* tie 1.0 | 1.25 */
  assert_int_equal(to_fp8(TPF_FP8_E5M2, 1.375f), 0x3E); /* tie 1.25 | 1.5 */
  assert_int_equal(to_fp8(TPF_FP8_E5M2, 57344.0f), 0x7B);
  assert_int_equal(to_fp8(TPF_FP8_E5M2, 1e9f), 0x7B);
  assert_int_equal(to_fp8(TPF_FP8_E5M2, -1e9f), 0xFB);
  assert_int_equal(to_fp8(TPF_FP8_E5M2, pow2(-16)), 0x01);
  assert_true(from_u8(TPF_FP8_E5M2, 0x7B) == 57344.0f);
  assert_true(from_u8(TPF_FP8_E5M2, 0x01) == pow2(-16));
}

static void test_gaps__invalid_dtype_converts_nothing(void **state) {
  (void)state;
  const tpf_dtype bad[] = {TPF_DTYPE_COUNT, (tpf_dtype)42};
  for (size_t i = 0; i < TPF_ARRAY_SIZE(bad); i++) {
    unsigned char buf[4] = {0xA5, 0xA5, 0xA5, 0xA5};
    tpf_float_to_elem(bad[i], 3.0f, buf);
    for (int j = 0; j < 4; j++)
      assert_int_equal(buf[j], 0xA5); /* nothing written */
    assert_true(tpf_elem_to_float(bad[i], buf) == 0.0f);
    assert_int_equal(tpf_dtype_size(bad[i]), 0);
  }
}

/* ---- names ---- */

static void test_gaps__names_of_bad_values(void **state) {
  (void)state;
  assert_string_equal(tpf_status_name(TPF_STATUS_COUNT), "TPF_UNKNOWN");
  assert_string_equal(tpf_strerror(TPF_STATUS_COUNT), "unknown status");
  assert_string_equal(tpf_step_kind_name(-1), "?");
  assert_string_equal(tpf_step_kind_name(TPF_STEP_KIND_COUNT), "?");
  assert_string_equal(tpf_stream_name(-1), "?");
  assert_string_equal(tpf_stream_name(TPF_NUM_STREAMS), "?");
  assert_string_equal(tpf_stream_name(TPF_STREAM_RECV), "recv");
}

static void test_gaps__layout_local_validates(void **state) {
  (void)state;
  tpf_layout_desc d;
  memset(&d, 0, sizeof d);
  d.tp_size = 4;
  d.rank = 1;
  d.algo = TPF_ALGO_BULK;
  d.coll = TPF_COLL_RS;
  d.dtype = TPF_BF16;
  d.capacity = (tpf_shape){64, 32};
  d.active = (tpf_shape){32, 32};
  tpf_region r, keep;
  memset(&keep, 0x5a, sizeof keep);
  TPF_ASSERT_OK(tpf_layout_local(&d, &r));
  assert_int_equal(r.offset_bytes, 8 * 32 * 2); /* rows [8, 16) of [32, 32] bf16 */
  d.active.rows = 30;                           /* not divisible by 4 */
  r = keep;
  TPF_ASSERT_STATUS(tpf_layout_local(&d, &r), TPF_EDIVISIBLE);
  assert_memory_equal(&r, &keep, sizeof r);
  d.active.rows = 32;
  d.rank = 4;
  TPF_ASSERT_STATUS(tpf_layout_local(&d, &r), TPF_EINVAL);
  assert_memory_equal(&r, &keep, sizeof r);
}

/* ---- a backend that refuses chosen activations and its syncs ---- */

typedef struct {
  tpf_mock_backend m;  /* first: the mock's functions cast the backend to it */
  int from, to, calls; /* reg_activate calls in [from, to) are refused */
  bool fail_sync;
} flaky;

static tpf_backend_ops flaky_ops;

static tpf_status flaky_activate(tpf_backend *be, tpf_reg *reg, uint64_t bytes) {
  flaky *f = (flaky *)be;
  int call = f->calls++;
  if (call >= f->from && call < f->to)
    return tpf_set_error(TPF_EBACKEND, "flaky: activation %d refused", call);
  return tpf_mock_ops.reg_activate(be, reg, bytes);
}

static tpf_status flaky_sync(tpf_backend *be, void *stream) {
  if (((flaky *)be)->fail_sync) return tpf_set_error(TPF_EBACKEND, "flaky: sync failed");
  return tpf_mock_ops.sync(be, stream);
}

static void flaky_init(flaky *f, int P, int rank) {
  memset(f, 0, sizeof *f);
  tpf_mock_init(&f->m, P, rank);
  flaky_ops = tpf_mock_ops;
  flaky_ops.reg_activate = flaky_activate;
  flaky_ops.sync = flaky_sync;
  f->m.hdr.ops = &flaky_ops;
  f->from = f->to = -1;
}

enum { MP = 2, MH = 64 };

static tpf_comm *add(tpf_manager *m, const char *name, tpf_algo a, tpf_coll k, tpf_dtype t) {
  tpf_comm_config cfg = tpf_test_config(name, a, k, t, 128, MH);
  tpf_comm *c = NULL;
  TPF_ASSERT_OK(tpf_manager_add(m, &cfg, &c));
  return c;
}

/* Rollback when the backend also refuses to restore one communicator: each communicator's shape
 * stays what its backend was last told successfully. */
static void test_gaps__manager_rollback_with_refused_restore(void **state) {
  (void)state;
  flaky be;
  flaky_init(&be, MP, 0);
  tpf_manager *m = NULL;
  TPF_ASSERT_OK(tpf_manager_create(&be.m.hdr, &m));
  tpf_comm *a = add(m, "a", TPF_ALGO_RING, TPF_COLL_AG, TPF_BF16);
  tpf_comm *b = add(m, "b", TPF_ALGO_BULK, TPF_COLL_RS, TPF_BF16);
  tpf_comm *c = add(m, "c", TPF_ALGO_BULK, TPF_COLL_AG, TPF_BF16);
  tpf_shape s16 = {16, MH}, s48 = {48, MH};
  TPF_ASSERT_OK(tpf_manager_set_active_shape(m, s16));
  uint64_t ea = tpf_comm_epoch(a), eb = tpf_comm_epoch(b), ec = tpf_comm_epoch(c);
  /* Next change: a (call n), b (n+1), c (n+2, refused); rollback b (n+3, refused), a (n+4). */
  be.from = be.calls + 2;
  be.to = be.calls + 4;
  TPF_ASSERT_STATUS(tpf_manager_set_active_shape(m, s48), TPF_EBACKEND);
  assert_non_null(strstr(tpf_last_error(), "activation"));
  assert_int_equal(be.calls, be.from + 3); /* a's restore was attempted after b's */
  assert_int_equal(tpf_comm_active_shape(a).rows, 16);
  assert_int_equal(tpf_comm_epoch(a), ea);
  assert_int_equal(tpf_comm_active_shape(b).rows, 48); /* its backend still has 48 rows */
  assert_int_equal(tpf_comm_epoch(b), eb + 1);
  assert_int_equal(tpf_comm_active_shape(c).rows, 16);
  assert_int_equal(tpf_comm_epoch(c), ec);
  assert_int_equal(be.m.last_active_bytes, 16 * MH * 2); /* a's restore came last */
  be.from = be.to = -1;
  TPF_ASSERT_OK(tpf_manager_set_active_shape(m, s48)); /* the group is usable again */
  assert_int_equal(tpf_comm_active_shape(c).rows, 48);
  TPF_ASSERT_OK(tpf_manager_destroy(m));
  assert_int_equal(be.m.reg_live, 0);
}

static void test_gaps__manager_at_and_add(void **state) {
  (void)state;
  tpf_mock_backend be;
  tpf_mock_init(&be, MP, 1);
  tpf_manager *m = NULL;
  TPF_ASSERT_OK(tpf_manager_create(&be.hdr, &m));
  tpf_comm *a = add(m, "first", TPF_ALGO_RING, TPF_COLL_AG, TPF_BF16);
  tpf_comm *b = add(m, "second", TPF_ALGO_PIPELINE, TPF_COLL_RS, TPF_BF16);
  tpf_comm *got = (tpf_comm *)0x1;
  TPF_ASSERT_OK(tpf_manager_at(m, 0, &got));
  assert_ptr_equal(got, a);
  TPF_ASSERT_OK(tpf_manager_at(m, 1, &got));
  assert_ptr_equal(got, b);
  got = (tpf_comm *)0x1;
  TPF_ASSERT_STATUS(tpf_manager_at(m, 2, &got), TPF_EINVAL);
  assert_non_null(strstr(tpf_last_error(), "index 2 outside 0..1"));
  TPF_ASSERT_STATUS(tpf_manager_at(m, -1, &got), TPF_EINVAL);
  TPF_ASSERT_STATUS(tpf_manager_at(m, 0, NULL), TPF_EINVAL);
  TPF_ASSERT_STATUS(tpf_manager_at(NULL, 0, &got), TPF_EINVAL);
  assert_ptr_equal(got, (tpf_comm *)0x1); /* untouched on failure */
  assert_int_equal(tpf_manager_count(NULL), 0);
  /* A configuration without a name is refused by the communicator, not by the lookup. */
  tpf_comm_config noname = tpf_test_config(NULL, TPF_ALGO_BULK, TPF_COLL_AG, TPF_BF16, 128, MH);
  TPF_ASSERT_STATUS(tpf_manager_add(m, &noname, NULL), TPF_EINVAL);
  assert_non_null(strstr(tpf_last_error(), "no name"));
  assert_int_equal(tpf_manager_count(m), 2);
  assert_int_equal(be.reg_total, 2);
  TPF_ASSERT_OK(tpf_manager_destroy(m));
}

static void test_gaps__manager_destroy_reports_first_failure(void **state) {
  (void)state;
  long live = tpf__alloc_live_count();
  flaky be;
  flaky_init(&be, MP, 0);
  tpf_manager *m = NULL;
  TPF_ASSERT_OK(tpf_manager_create(&be.m.hdr, &m));
  add(m, "a", TPF_ALGO_RING, TPF_COLL_AG, TPF_BF16);
  add(m, "b", TPF_ALGO_BULK, TPF_COLL_RS, TPF_BF16);
  be.fail_sync = true; /* every communicator's destroy fails its sync */
  TPF_ASSERT_STATUS(tpf_manager_destroy(m), TPF_EBACKEND);
  assert_int_equal(be.m.reg_live, 0); /* deregistered anyway */
  assert_int_equal(tpf__alloc_live_count(), live);
}

/* ---- operand checks of gemm_rs and bulk_overlap ---- */

enum { P = 4, C = 64, H = 32, K = 8, M = 8, N = 4 };

typedef struct {
  tpf_mock_backend be;
  tpf_comm *rs, *bulk, *bulk_rs, *ag;
  void *reg_rs, *reg_bulk, *reg_ag;
} world;

static void *reg_of(tpf_comm *c) {
  void *base;
  uint64_t bytes;
  TPF_ASSERT_OK(tpf_comm_registration(c, &base, &bytes));
  return base;
}

static int world_setup(void **state) {
  world *w = calloc(1, sizeof *w);
  tpf_mock_init(&w->be, P, 1);
  tpf_comm_config rs = tpf_test_config("rs", TPF_ALGO_RING, TPF_COLL_RS, TPF_BF16, C, H);
  tpf_comm_config bulk = tpf_test_config("bulk", TPF_ALGO_BULK, TPF_COLL_AG, TPF_BF16, C, H);
  tpf_comm_config brs = tpf_test_config("brs", TPF_ALGO_BULK, TPF_COLL_RS, TPF_BF16, C, H);
  tpf_comm_config ag = tpf_test_config("ag", TPF_ALGO_RING, TPF_COLL_AG, TPF_BF16, C, H);
  if (tpf_comm_create(&w->be.hdr, &rs, &w->rs) != TPF_OK ||
      tpf_comm_create(&w->be.hdr, &bulk, &w->bulk) != TPF_OK ||
      tpf_comm_create(&w->be.hdr, &brs, &w->bulk_rs) != TPF_OK ||
      tpf_comm_create(&w->be.hdr, &ag, &w->ag) != TPF_OK)
    return -1;
  w->reg_rs = reg_of(w->rs);
  w->reg_bulk = reg_of(w->bulk);
  w->reg_ag = reg_of(w->ag);
  *state = w;
  return 0;
}

static int world_teardown(void **state) {
  world *w = *state;
  int rc = 0;
  tpf_comm *cs[] = {w->rs, w->bulk, w->bulk_rs, w->ag};
  for (size_t i = 0; i < TPF_ARRAY_SIZE(cs); i++)
    rc |= tpf_comm_destroy(cs[i]) == TPF_OK ? 0 : -1;
  rc |= w->be.reg_live == 0 ? 0 : -1;
  free(w);
  return rc;
}

#define EXPECT(call, want, needle)                                                                 \
  do {                                                                                             \
    TPF_ASSERT_STATUS(call, want);                                                                 \
    if (!strstr(tpf_last_error(), needle))                                                         \
      fail_msg("%s: detail '%s' lacks '%s'", #call, tpf_last_error(), needle);                     \
  } while (0)

static void test_gaps__gemm_rs_operands(void **state) {
  world *w = *state;
  static uint16_t xb[C * K], wb[H * K], ob[C / P * H];
  tpf_matrix x = {xb, C, K, K, TPF_BF16}, wt = {wb, H, K, K, TPF_BF16};
  tpf_matrix out = {ob, C / P, H, H, TPF_BF16}, t;
  int execs = w->be.executions;
  TPF_ASSERT_OK(tpf_gemm_rs(w->rs, &x, &wt, &out, NULL)); /* the operands are valid as given */
  assert_int_equal(w->be.executions, ++execs);
  t = x, t.cols = 0;
  EXPECT(tpf_gemm_rs(w->rs, &t, &wt, &out, NULL), TPF_ESHAPE, "input x has 0 columns");
  t = x, t.ptr = w->reg_rs;
  EXPECT(tpf_gemm_rs(w->rs, &t, &wt, &out, NULL), TPF_EINVAL, "overlaps the registered buffer");
  t = wt, t.ptr = (char *)w->reg_rs + 64;
  EXPECT(tpf_gemm_rs(w->rs, &x, &t, &out, NULL), TPF_EINVAL, "overlaps the registered buffer");
  t = out, t.ptr = (char *)w->reg_rs + 128;
  EXPECT(tpf_gemm_rs(w->rs, &x, &wt, &t, NULL), TPF_EINVAL, "overlaps the registered buffer");
  EXPECT(tpf_gemm_rs(w->bulk_rs, &x, &wt, &out, NULL), TPF_EUNSUPPORTED,
         "needs a ring rs or pipeline rs communicator");
  /* ag_gemm: a weight inside the registration. */
  static uint16_t d[C * N];
  tpf_matrix aw = {w->reg_ag, N, H, H, TPF_BF16}, ad = {d, C, N, N, TPF_BF16};
  EXPECT(tpf_ag_gemm(w->ag, &aw, &ad, NULL), TPF_EINVAL, "weight w overlaps the registered buffer");
  assert_int_equal(w->be.executions, execs); /* no refused call reached the backend */
}

static void test_gaps__bulk_operands(void **state) {
  world *w = *state;
  static float ab[M * K], bb[N * K], db[M * N];
  tpf_matrix a = {ab, M, K, K, TPF_FP32}, b = {bb, N, K, K, TPF_FP32}, d = {db, M, N, N, TPF_FP32};
  tpf_matrix t;
  int execs = w->be.executions;
  TPF_ASSERT_OK(tpf_bulk_overlap(w->bulk, &a, &b, &d, NULL));
  assert_int_equal(w->be.executions, ++execs);
  assert_int_equal(w->be.last_sched.gemm_m, M);
  assert_int_equal(w->be.last_sched.gemm_n, N);
  assert_int_equal(w->be.last_sched.gemm_k, K);
  t = a, t.ptr = NULL;
  EXPECT(tpf_bulk_overlap(w->bulk, &t, &b, &d, NULL), TPF_EINVAL, "a has a NULL data pointer");
  t = a, t.rows = 0;
  EXPECT(tpf_bulk_overlap(w->bulk, &t, &b, &d, NULL), TPF_ESHAPE, "a is [0, 8]");
  t = a, t.cols = 0;
  EXPECT(tpf_bulk_overlap(w->bulk, &t, &b, &d, NULL), TPF_ESHAPE, "a is [8, 0]");
  t = b, t.rows = 0;
  EXPECT(tpf_bulk_overlap(w->bulk, &a, &t, &d, NULL), TPF_ESHAPE, "b has 0 rows");
  /* The message names the operand inside the registration. */
  t = a, t.ptr = w->reg_bulk;
  EXPECT(tpf_bulk_overlap(w->bulk, &t, &b, &d, NULL), TPF_EINVAL, ": a overlaps the registered");
  t = b, t.ptr = (char *)w->reg_bulk + 256;
  EXPECT(tpf_bulk_overlap(w->bulk, &a, &t, &d, NULL), TPF_EINVAL, ": b overlaps the registered");
  t = d, t.ptr = (char *)w->reg_bulk + 512;
  EXPECT(tpf_bulk_overlap(w->bulk, &a, &b, &t, NULL), TPF_EINVAL,
         "output d overlaps the registered");
  assert_int_equal(w->be.executions, execs);
}

static void test_gaps__long_name(void **state) {
  (void)state;
  tpf_mock_backend be;
  tpf_mock_init(&be, P, 0);
  char name[300];
  memset(name, 'n', sizeof name - 1);
  name[sizeof name - 1] = '\0';
  tpf_comm_config cfg = tpf_test_config(name, TPF_ALGO_BULK, TPF_COLL_AG, TPF_BF16, C, H);
  tpf_comm *c = (tpf_comm *)0x1;
  EXPECT(tpf_comm_create(&be.hdr, &cfg, &c), TPF_EINVAL, "longer than 255 bytes");
  assert_ptr_equal(c, (tpf_comm *)0x1);
  name[255] = '\0'; /* exactly 255 bytes is fine */
  TPF_ASSERT_OK(tpf_comm_create(&be.hdr, &cfg, &c));
  assert_int_equal(strlen(tpf_comm_config_of(c)->name), 255);
  TPF_ASSERT_OK(tpf_comm_destroy(c));
}

/* ---- schedule checker ---- */

#define GP 3
static tpf_schedule g_s[GP];

static void build(tpf_algo algo, tpf_coll coll, int Pn, int splits) {
  for (int r = 0; r < Pn; r++) {
    tpf_layout_desc d;
    memset(&d, 0, sizeof d);
    d.tp_size = Pn;
    d.rank = r;
    d.algo = algo;
    d.coll = coll;
    d.dtype = TPF_FP32;
    d.capacity = (tpf_shape){8 * (uint64_t)Pn, 8};
    d.active = (tpf_shape){4 * (uint64_t)Pn, 8};
    d.num_splits = splits;
    bool ag = coll == TPF_COLL_AG;
    tpf_gemm_dims g = {4 * (uint64_t)Pn, ag ? 16 : 8, ag ? 8 : 24};
    if (algo == TPF_ALGO_BULK) g = (tpf_gemm_dims){8, 12, 16};
    TPF_ASSERT_OK(tpf_schedule_build(&d, &g, &g_s[r]));
  }
  TPF_ASSERT_OK(tpf_schedule_check(g_s, Pn));
}

static void free_all(int Pn) {
  for (int r = 0; r < Pn; r++)
    tpf_schedule_free(&g_s[r]);
}

/* Fail the k-th allocation for every k: each failure is a clean TPF_ENOMEM, nothing leaks, and
 * with enough budget the verdict is the same as without a budget. */
static void test_gaps__checker_allocation_budget(void **state) {
  (void)state;
  struct {
    tpf_algo algo;
    tpf_coll coll;
    int P, splits;
  } cases[] = {{TPF_ALGO_RING, TPF_COLL_RS, 3, 0},
               {TPF_ALGO_PIPELINE, TPF_COLL_RS, 2, 2},
               {TPF_ALGO_RING, TPF_COLL_AG, 3, 0},
               {TPF_ALGO_BULK, TPF_COLL_RS, 2, 0}};
  for (size_t ci = 0; ci < TPF_ARRAY_SIZE(cases); ci++) {
    build(cases[ci].algo, cases[ci].coll, cases[ci].P, cases[ci].splits);
    long live = tpf__alloc_live_count();
    long k;
    for (k = 0; k < 10000; k++) {
      tpf__alloc_set_budget(k);
      tpf_status rc = tpf_schedule_check(g_s, cases[ci].P);
      tpf__alloc_set_budget(-1);
      assert_int_equal(tpf__alloc_live_count(), live);
      if (rc == TPF_OK) break;
      TPF_ASSERT_STATUS(rc, TPF_ENOMEM);
    }
    assert_true(k > 5 && k < 10000);
    free_all(cases[ci].P);
  }
}

static void expect_reject(int Pn, const char *needle) {
  tpf_status rc = tpf_schedule_check(g_s, Pn);
  if (rc != TPF_EINVAL || !strstr(tpf_last_error(), needle))
    fail_msg("checker returned %s (%s), expected TPF_EINVAL with '%s'", tpf_status_name(rc),
             tpf_last_error(), needle);
}

static void test_gaps__checker_headers_and_overflowing_views(void **state) {
  (void)state;
  build(TPF_ALGO_RING, TPF_COLL_AG, 2, 0);
  tpf_step *keep = g_s[1].steps;
  g_s[1].steps = NULL;
  expect_reject(2, "rank 1: 5 steps (steps NULL)");
  g_s[1].steps = keep;
  g_s[0].nsteps = 65536;
  expect_reject(2, "rank 0: 65536 steps (steps set)");
  g_s[0].nsteps = g_s[1].nsteps;
  /* Rank 0's GEMM_0 reads buffer rows from 0 (steps: 0 HS, 1 GEMM). A view whose row pitch in
   * bytes overflows, and one whose first element's index overflows. */
  tpf_step *gm = &g_s[0].steps[1];
  assert_int_equal(gm->kind, TPF_STEP_GEMM);
  assert_int_equal(gm->a.row, 0);
  gm->a.ld = 1ull << 63;
  expect_reject(2, "rank 0 step 1 (GEMM): buffer view at 0 row 0 overflows 64 bits");
  gm->a.ld = (1ull << 62) + 100; /* row * ld fits, + col does not */
  gm->a.row = 3;
  gm->a.col = gm->a.ld - 8;
  expect_reject(2, "rank 0 step 1 (GEMM): buffer view at 0 row 3 overflows 64 bits");
  free_all(2);
  /* The header's GEMM must be the collective's: rows x cols. */
  build(TPF_ALGO_RING, TPF_COLL_RS, 2, 0);
  for (int r = 0; r < 2; r++)
    g_s[r].gemm_m = 16;
  expect_reject(2, "rank 0: gemm dims 16 x 8 x 24 do not fit rows 8, cols 8 of the rs");
  free_all(2);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_gaps__fp16_rounding),
      cmocka_unit_test(test_gaps__bf16_nan_and_ties),
      cmocka_unit_test(test_gaps__fp8_ties_and_saturation),
      cmocka_unit_test(test_gaps__invalid_dtype_converts_nothing),
      cmocka_unit_test(test_gaps__names_of_bad_values),
      cmocka_unit_test(test_gaps__layout_local_validates),
      cmocka_unit_test(test_gaps__manager_rollback_with_refused_restore),
      cmocka_unit_test(test_gaps__manager_at_and_add),
      cmocka_unit_test(test_gaps__manager_destroy_reports_first_failure),
      cmocka_unit_test_setup_teardown(test_gaps__gemm_rs_operands, world_setup, world_teardown),
      cmocka_unit_test_setup_teardown(test_gaps__bulk_operands, world_setup, world_teardown),
      cmocka_unit_test(test_gaps__long_name),
      cmocka_unit_test(test_gaps__checker_allocation_budget),
      cmocka_unit_test(test_gaps__checker_headers_and_overflowing_views),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
