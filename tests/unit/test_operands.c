/* The operand rulebook (core/operands.c): tpf_check_operands on a table of descriptors, each bad
 * one refused with its status and a detail naming the operand; the output's shape for good
 * ones; the descriptor's own checks. The operations run the same function (test_comm,
 * test_fp8, test_coverage_gaps check their messages); the Python binding's agreement is
 * tests/python/test_rulebook.py. */
#include "tpf_test.h"

enum { T = 16, H = 32, P = 2 };

typedef struct {
  const char *label;
  tpf_op_kind op;
  tpf_dtype buffer;
  bool trans_a, trans_w, a_scale, w_scale;
  tpf_matrix a, w, d; /* rows 0: absent (NULL in the descriptor) */
  tpf_status want;
  const char *needle; /* in the detail */
} row;

#define M(r, c, t)                                                                                 \
  { NULL, (r), (c), (c), (t) }
#define NONE                                                                                       \
  { NULL, 0, 0, 0, TPF_BF16 }

static tpf_status check(const row *r, tpf_shape *out) {
  tpf_operands o = {sizeof o,
                    r->op,
                    r->buffer,
                    {T, H},
                    P,
                    r->trans_a,
                    r->trans_w,
                    r->a_scale,
                    r->w_scale,
                    r->a.rows ? &r->a : NULL,
                    r->w.rows ? &r->w : NULL,
                    r->d.rows ? &r->d : NULL,
                    NULL,
                    NULL,
                    NULL};
  return tpf_check_operands(&o, out);
}

static void test_operands__table(void **state) {
  (void)state;
  const row rows[] = {
      {"ag ok", TPF_OP_AG_GEMM, TPF_BF16, 0, 0, 0, 0, NONE, M(8, H, TPF_BF16), M(T, 8, TPF_FP32),
       TPF_OK, ""},
      {"ag weight cols", TPF_OP_AG_GEMM, TPF_BF16, 0, 0, 0, 0, NONE, M(8, 12, TPF_BF16), NONE,
       TPF_ESHAPE, "weight w has shape [8, 12], expected [8, 32] for active rows 16"},
      {"ag out rows", TPF_OP_AG_GEMM, TPF_BF16, 0, 0, 0, 0, NONE, M(8, H, TPF_BF16),
       M(T - 1, 8, TPF_BF16), TPF_ESHAPE, "output d has shape [15, 8], expected [16, 8]"},
      {"ag trans_a", TPF_OP_AG_GEMM, TPF_BF16, 1, 0, 0, 0, NONE, M(8, H, TPF_BF16), NONE,
       TPF_EUNSUPPORTED, "trans_a is not available"},
      {"ag weight dtype", TPF_OP_AG_GEMM, TPF_BF16, 0, 0, 0, 0, NONE, M(8, H, TPF_FP16), NONE,
       TPF_EINVAL, "weight w has dtype fp16, expected bf16"},
      {"ag out dtype", TPF_OP_AG_GEMM, TPF_BF16, 0, 0, 0, 0, NONE, M(8, H, TPF_BF16),
       M(T, 8, TPF_FP16), TPF_EINVAL, "output d has dtype fp16, expected bf16 or fp32"},
      {"ag fp8 bf16 weight", TPF_OP_AG_GEMM, TPF_FP8_E4M3, 0, 0, 0, 0, NONE, M(8, H, TPF_BF16),
       NONE, TPF_EINVAL, "expected fp8_e4m3 or fp8_e5m2"},
      {"ag scale on bf16", TPF_OP_AG_GEMM, TPF_BF16, 0, 0, 1, 0, NONE, M(8, H, TPF_BF16), NONE,
       TPF_EINVAL, "a_scale_inv is set but the buffer has dtype bf16"},
      {"ag weight ld",
       TPF_OP_AG_GEMM,
       TPF_BF16,
       0,
       0,
       0,
       0,
       NONE,
       {NULL, 8, H, H - 1, TPF_BF16},
       NONE,
       TPF_ESHAPE,
       "weight w has ld 31 < cols 32"},
      {"rs ok", TPF_OP_GEMM_RS, TPF_BF16, 0, 0, 0, 0, M(T, 8, TPF_BF16), M(H, 8, TPF_BF16),
       M(T / P, H, TPF_BF16), TPF_OK, ""},
      {"rs x NULL", TPF_OP_GEMM_RS, TPF_BF16, 0, 0, 0, 0, NONE, M(H, 8, TPF_BF16), NONE, TPF_EINVAL,
       "input x is NULL"},
      {"rs x rows", TPF_OP_GEMM_RS, TPF_BF16, 0, 0, 0, 0, M(T + 1, 8, TPF_BF16), M(H, 8, TPF_BF16),
       NONE, TPF_ESHAPE, "input x has shape [17, 8], expected [16, 8]"},
      {"rs out rows", TPF_OP_GEMM_RS, TPF_BF16, 0, 0, 0, 0, M(T, 8, TPF_BF16), M(H, 8, TPF_BF16),
       M(T, H, TPF_BF16), TPF_ESHAPE, "output out has shape [16, 32], expected [8, 32]"},
      {"rs fp8 x bf16 w", TPF_OP_GEMM_RS, TPF_BF16, 0, 0, 0, 0, M(T, 8, TPF_FP8_E4M3),
       M(H, 8, TPF_BF16), NONE, TPF_EINVAL,
       "input x has dtype fp8_e4m3 but weight w has bf16: an fp8 GEMM takes two fp8"},
      {"rs x no K", TPF_OP_GEMM_RS, TPF_BF16, 0, 0, 0, 0, M(T, 0, TPF_BF16), M(H, 8, TPF_BF16),
       NONE, TPF_ESHAPE, "input x has 0 columns"},
      {"bulk ok", TPF_OP_BULK, TPF_BF16, 0, 1, 0, 0, M(T, 8, TPF_FP32), M(8, 12, TPF_FP32),
       M(T, 12, TPF_FP32), TPF_OK, ""},
      {"bulk e5m2", TPF_OP_BULK, TPF_BF16, 0, 0, 0, 0, M(T, 8, TPF_FP8_E5M2),
       M(12, 8, TPF_FP8_E5M2), NONE, TPF_EUNSUPPORTED, "a and b are both fp8_e5m2"},
      {"bulk fp8 out", TPF_OP_BULK, TPF_BF16, 0, 0, 0, 0, M(T, 8, TPF_FP8_E4M3),
       M(12, 8, TPF_FP8_E4M3), M(T, 12, TPF_FP8_E4M3), TPF_EINVAL,
       "output d has dtype fp8_e4m3; the output of an fp8 GEMM"},
      {"bulk b K", TPF_OP_BULK, TPF_BF16, 0, 0, 0, 0, M(T, 8, TPF_FP32), M(12, 9, TPF_FP32), NONE,
       TPF_ESHAPE, "b has shape [12, 9], expected [12, 8]"},
  };
  for (size_t i = 0; i < TPF_ARRAY_SIZE(rows); i++) {
    tpf_shape out = {7, 7};
    const tpf_status rc = check(&rows[i], &out);
    if (rc != rows[i].want)
      fail_msg("%s: %s (%s), expected %s", rows[i].label, tpf_status_name(rc), tpf_last_error(),
               tpf_status_name(rows[i].want));
    if (rc != TPF_OK && !strstr(tpf_last_error(), rows[i].needle))
      fail_msg("%s: detail '%s' lacks '%s'", rows[i].label, tpf_last_error(), rows[i].needle);
    if (rc != TPF_OK) assert_true(out.rows == 7 && out.cols == 7); /* written only on success */
  }
  tpf_shape out;
  TPF_ASSERT_OK(check(&rows[0], &out)); /* ag: [T, N] */
  assert_true(out.rows == T && out.cols == 8);
  TPF_ASSERT_OK(check(&rows[9], &out)); /* rs: [T/P, H] */
  assert_true(out.rows == T / P && out.cols == H);
  TPF_ASSERT_OK(check(&rows[15], &out)); /* bulk with trans_w: [M, N] */
  assert_true(out.rows == T && out.cols == 12);
}

static void test_operands__descriptor(void **state) {
  (void)state;
  TPF_ASSERT_STATUS(tpf_check_operands(NULL, NULL), TPF_EINVAL);
  const tpf_matrix w = M(8, H, TPF_BF16);
  tpf_operands o = {sizeof o, TPF_OP_AG_GEMM, TPF_BF16, {T, H}, P,    0,        0,   0,
                    0,        NULL,           &w,       NULL,   NULL, "weight", NULL};
  TPF_ASSERT_OK(tpf_check_operands(&o, NULL)); /* out may be NULL */
  o.size = 3;
  TPF_ASSERT_STATUS(tpf_check_operands(&o, NULL), TPF_EINVAL);
  assert_non_null(strstr(tpf_last_error(), "tpf_operands"));
  o.size = 0; /* this header's */
  o.op = (tpf_op_kind)7;
  TPF_ASSERT_STATUS(tpf_check_operands(&o, NULL), TPF_EINVAL);
  assert_non_null(strstr(tpf_last_error(), "not a tpf_op_kind"));
  o.op = TPF_OP_AG_GEMM;
  o.active.cols = H + 1; /* the caller's names are used */
  TPF_ASSERT_STATUS(tpf_check_operands(&o, NULL), TPF_ESHAPE);
  assert_non_null(strstr(tpf_last_error(), "weight has shape [8, 32], expected [8, 33]"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_operands__table),
      cmocka_unit_test(test_operands__descriptor),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
