/* The operand rulebook: the shape and dtype rules of the three operations, as one pure function
 * (tpf_check_operands) that the operations (core/comm_ops.c) and the Python binding both run.
 *
 * Method: an operation names its operands by role (a: the activation, w: the weight, d: the
 * output) and the communicator's facts (buffer dtype, active shape, P). The GEMM dimensions come
 * from the active shape and the operands themselves (ag_gemm: N from w; gemm_rs: K from x; bulk:
 * M and K from a, N from b), each operand is checked against its expected stored shape and its
 * allowed dtypes, then the fp8 pairing (SPEC §11) and the scales. Nothing here reads a pointer
 * or an object: what depends on addresses (NULL data, overlaps, the registration) and on the
 * backend (fp8 capability, options) is checked by the operation.
 */
#include "internal.h"

#include <stddef.h>

static bool gemm_dtype(tpf_dtype t) {
  return t == TPF_BF16 || t == TPF_FP16 || t == TPF_FP32;
}

bool tpf__fp8_dtype(tpf_dtype t) {
  return t == TPF_FP8_E4M3 || t == TPF_FP8_E5M2;
}

/* Rows and columns of a matrix as stored, for an operand used as [rows, cols] (transposed when
 * `trans`). */
static void stored(bool trans, uint64_t rows, uint64_t cols, uint64_t *sr, uint64_t *sc) {
  *sr = trans ? cols : rows;
  *sc = trans ? rows : cols;
}

/* The dtypes an operand may have: `want`, or (fp8_ok) any fp8 dtype (check_fp8 then pairs
 * them), or (fp32_ok, an output) fp32. */
typedef struct {
  tpf_dtype want;
  bool fp8_ok, fp32_ok;
} dtypes;

static const char *expected(const dtypes *k) {
  if (k->fp8_ok && tpf__fp8_dtype(k->want)) return "fp8_e4m3 or fp8_e5m2";
  return tpf_dtype_name(k->want);
}

/* One operand: a known dtype, the expected stored shape [rows, cols], ld >= cols, an allowed
 * dtype, and rows * ld elements addressable in 64 bits. `active` (0: none, bulk) only names the
 * active rows in the message. */
static tpf_status check_matrix(const char *what, const tpf_matrix *m, uint64_t rows, uint64_t cols,
                               const dtypes *k, uint64_t active) {
  TPF_RETURN_IF((unsigned)m->dtype >= TPF_DTYPE_COUNT, TPF_EINVAL, "%s dtype %d is not a tpf_dtype",
                what, (int)m->dtype);
  TPF_RETURN_IF(m->rows != rows || m->cols != cols, TPF_ESHAPE,
                "%s has shape [%llu, %llu], expected [%llu, %llu]%s%.0llu", what,
                (unsigned long long)m->rows, (unsigned long long)m->cols, (unsigned long long)rows,
                (unsigned long long)cols, active ? " for active rows " : "",
                (unsigned long long)active);
  TPF_RETURN_IF(m->ld < m->cols, TPF_ESHAPE, "%s has ld %llu < cols %llu", what,
                (unsigned long long)m->ld, (unsigned long long)m->cols);
  const bool ok = m->dtype == k->want || (k->fp8_ok && tpf__fp8_dtype(m->dtype)) ||
                  (k->fp32_ok && m->dtype == TPF_FP32);
  TPF_RETURN_IF(!ok, TPF_EINVAL, "%s has dtype %s, expected %s%s", what, tpf_dtype_name(m->dtype),
                expected(k), k->fp32_ok && k->want != TPF_FP32 ? " or fp32" : "");
  uint64_t span;
  TPF_RETURN_IF(!tpf__mul3_u64(m->rows, m->ld, tpf_dtype_size(m->dtype), &span), TPF_EOVERFLOW,
                "%s of %llu rows x ld %llu overflows 64 bits", what, (unsigned long long)m->rows,
                (unsigned long long)m->ld);
  return TPF_OK;
}

/* The dtype rules of an fp8 GEMM (SPEC §11): a and w both fp8, not both E5M2 (cuBLASLt on Hopper
 * has no E5M2 x E5M2), D (when given) bf16, fp16 or fp32. */
static tpf_status check_fp8(const char *an, tpf_dtype a, const char *wn, tpf_dtype w,
                            const char *dn, const tpf_matrix *d) {
  const bool a8 = tpf__fp8_dtype(a);
  TPF_RETURN_IF(!a8 || !tpf__fp8_dtype(w), TPF_EINVAL,
                "%s has dtype %s but %s has %s: an fp8 GEMM takes two fp8 operands (fp8_e4m3 or "
                "fp8_e5m2)",
                a8 ? an : wn, tpf_dtype_name(a8 ? a : w), a8 ? wn : an, tpf_dtype_name(a8 ? w : a));
  TPF_RETURN_IF(a == TPF_FP8_E5M2 && w == TPF_FP8_E5M2, TPF_EUNSUPPORTED,
                "%s and %s are both fp8_e5m2; fp8 GEMMs take e4m3 x e4m3, e4m3 x e5m2 or e5m2 x "
                "e4m3 (cuBLASLt has no e5m2 x e5m2)",
                an, wn);
  TPF_RETURN_IF(d && !gemm_dtype(d->dtype), TPF_EINVAL,
                "%s has dtype %s; the output of an fp8 GEMM (%s x %s) is bf16, fp16 or fp32", dn,
                tpf_dtype_name(d->dtype), tpf_dtype_name(a), tpf_dtype_name(w));
  return TPF_OK;
}

/* A scale given for an operand that is not fp8 means the caller's data is not what they think. */
static tpf_status check_scales(const tpf_operands *o, const char *an, tpf_dtype a, const char *wn,
                               tpf_dtype w) {
  TPF_RETURN_IF(o->a_scale && !tpf__fp8_dtype(a), TPF_EINVAL,
                "a_scale_inv is set but %s has dtype %s; scales apply to fp8 operands only", an,
                tpf_dtype_name(a));
  TPF_RETURN_IF(o->w_scale && !tpf__fp8_dtype(w), TPF_EINVAL,
                "w_scale_inv is set but %s has dtype %s; scales apply to fp8 operands only", wn,
                tpf_dtype_name(w));
  return TPF_OK;
}

static const char *name_or(const char *given, const char *dflt) {
  return given ? given : dflt;
}

/* ag_gemm: the activation is the buffer [T, H]; w is [N, H] ([H, N] with trans_w); d [T, N]. */
static tpf_status ag_gemm_rules(const tpf_operands *o, tpf_shape *out) {
  const char *wn = name_or(o->w_name, o->trans_w ? "weight w (trans_w: [H, N])" : "weight w");
  const char *dn = name_or(o->d_name, "output d");
  TPF_RETURN_IF(o->trans_a, TPF_EUNSUPPORTED,
                "ag_gemm's activation is the gathered buffer [T, H]; trans_a is not available "
                "(use trans_w for a weight stored [H, N])");
  const tpf_dtype bt = o->buffer_dtype;
  TPF_RETURN_IF((unsigned)bt >= TPF_DTYPE_COUNT, TPF_EINVAL, "buffer dtype %d is not a tpf_dtype",
                (int)bt);
  const uint64_t T = o->active.rows, H = o->active.cols;
  const tpf_matrix *w = o->w, *d = o->d;
  const uint64_t N = o->trans_w ? w->cols : w->rows;
  uint64_t wr, wc;
  stored(o->trans_w, N, H, &wr, &wc);
  const bool f8 = tpf__fp8_dtype(bt);
  const dtypes kw = {bt, f8, false};
  TPF_CHECK(check_matrix(wn, w, wr, wc, &kw, T));
  TPF_RETURN_IF(N == 0, TPF_ESHAPE, "%s has 0 %s", wn, o->trans_w ? "columns (trans_w)" : "rows");
  /* fp8: D's dtype is checked by check_fp8, whose message names the fp8 rule. */
  const dtypes kd = {f8 && d ? d->dtype : bt, false, true};
  if (d) TPF_CHECK(check_matrix(dn, d, T, N, &kd, T));
  if (f8) TPF_CHECK(check_fp8("the buffer", bt, wn, w->dtype, dn, d));
  TPF_CHECK(check_scales(o, "the buffer", bt, wn, w->dtype));
  out->rows = T;
  out->cols = N;
  return TPF_OK;
}

/* gemm_rs: x is [T, K] ([K, T] with trans_a), w [H, K] ([K, H] with trans_w), d [T/P, H]; x and
 * w may be fp8 on a bf16/fp16/fp32 buffer (its partials). */
static tpf_status gemm_rs_rules(const tpf_operands *o, tpf_shape *out) {
  const char *xn = name_or(o->a_name, o->trans_a ? "input x (trans_a: [K, T])" : "input x");
  const char *wn = name_or(o->w_name, o->trans_w ? "weight w (trans_w: [K, H])" : "weight w");
  const char *dn = name_or(o->d_name, "output out");
  const tpf_dtype bt = o->buffer_dtype;
  TPF_RETURN_IF((unsigned)bt >= TPF_DTYPE_COUNT, TPF_EINVAL, "buffer dtype %d is not a tpf_dtype",
                (int)bt);
  TPF_RETURN_IF(o->tp_size < 1, TPF_EINVAL, "tp_size %d: a group has at least one rank",
                o->tp_size);
  const uint64_t T = o->active.rows, H = o->active.cols, P = (uint64_t)o->tp_size;
  const tpf_matrix *x = o->a, *w = o->w, *d = o->d;
  const uint64_t K = o->trans_a ? x->rows : x->cols;
  uint64_t xr, xc, wr, wc;
  stored(o->trans_a, T, K, &xr, &xc);
  stored(o->trans_w, H, K, &wr, &wc);
  const bool f8 = tpf__fp8_dtype(x->dtype) || tpf__fp8_dtype(w->dtype);
  const dtypes kx = {bt, f8, false};
  TPF_CHECK(check_matrix(xn, x, xr, xc, &kx, T));
  TPF_RETURN_IF(K == 0, TPF_ESHAPE, "%s has 0 %s", xn, o->trans_a ? "rows (trans_a)" : "columns");
  TPF_CHECK(check_matrix(wn, w, wr, wc, &kx, T));
  const dtypes kd = {bt, false, true};
  if (d) TPF_CHECK(check_matrix(dn, d, T / P, H, &kd, T));
  if (f8) TPF_CHECK(check_fp8(xn, x->dtype, wn, w->dtype, dn, d));
  TPF_CHECK(check_scales(o, xn, x->dtype, wn, w->dtype));
  out->rows = T / P;
  out->cols = H;
  return TPF_OK;
}

/* bulk: a is [M, K] ([K, M] with trans_a), b [N, K] ([K, N] with trans_w), d [M, N]; the buffer
 * plays no part in the GEMM. */
static tpf_status bulk_rules(const tpf_operands *o, tpf_shape *out) {
  const char *an = name_or(o->a_name, "a");
  const char *bn = name_or(o->w_name, o->trans_w ? "b (trans_w: [K, N])" : "b");
  const char *dn = name_or(o->d_name, "output d");
  const tpf_matrix *a = o->a, *b = o->w, *d = o->d;
  TPF_RETURN_IF((unsigned)a->dtype >= TPF_DTYPE_COUNT, TPF_EINVAL, "%s dtype %d is not a tpf_dtype",
                an, (int)a->dtype);
  const bool f8 = tpf__fp8_dtype(a->dtype) || tpf__fp8_dtype(b->dtype);
  const uint64_t M = o->trans_a ? a->cols : a->rows, K = o->trans_a ? a->rows : a->cols;
  const dtypes ka = {a->dtype, false, false};
  TPF_CHECK(check_matrix(an, a, a->rows, a->cols, &ka, 0));
  TPF_RETURN_IF(M == 0 || K == 0, TPF_ESHAPE, "%s is [%llu, %llu]: a GEMM needs M, K > 0", an,
                (unsigned long long)a->rows, (unsigned long long)a->cols);
  const uint64_t N = o->trans_w ? b->cols : b->rows;
  uint64_t br, bc;
  stored(o->trans_w, N, K, &br, &bc);
  const dtypes kb = {a->dtype, f8, false};
  TPF_CHECK(check_matrix(bn, b, br, bc, &kb, 0));
  TPF_RETURN_IF(N == 0, TPF_ESHAPE, "%s has 0 %s", bn, o->trans_w ? "columns (trans_w)" : "rows");
  const dtypes kd = {f8 && d ? d->dtype : a->dtype, false, true};
  if (d) TPF_CHECK(check_matrix(dn, d, M, N, &kd, 0));
  if (f8) TPF_CHECK(check_fp8(an, a->dtype, bn, b->dtype, dn, d));
  TPF_CHECK(check_scales(o, an, a->dtype, bn, b->dtype));
  out->rows = M;
  out->cols = N;
  return TPF_OK;
}

tpf_status tpf_check_operands(const tpf_operands *o, tpf_shape *out) {
  TPF_RETURN_IF(!o, TPF_EINVAL, "tpf_check_operands: the descriptor is NULL");
  static const size_t released[] = {sizeof(tpf_operands)};
  TPF_CHECK(tpf__check_struct_size("tpf_check_operands", "descriptor", "tpf_operands", o->size,
                                   released, TPF_ARRAY_SIZE(released)));
  TPF_RETURN_IF(o->op != TPF_OP_AG_GEMM && o->op != TPF_OP_GEMM_RS && o->op != TPF_OP_BULK,
                TPF_EINVAL, "tpf_check_operands: op %d is not a tpf_op_kind", (int)o->op);
  static const char *const a_default[] = {NULL, NULL, "input x", "a"};
  static const char *const w_default[] = {NULL, "weight w", "weight w", "b"};
  const char *an = name_or(o->a_name, a_default[o->op]);
  TPF_RETURN_IF(o->op != TPF_OP_AG_GEMM && !o->a, TPF_EINVAL, "%s is NULL", an);
  TPF_RETURN_IF(!o->w, TPF_EINVAL, "%s is NULL", name_or(o->w_name, w_default[o->op]));
  tpf_shape shape = {0, 0};
  tpf_status rc = o->op == TPF_OP_AG_GEMM   ? ag_gemm_rules(o, &shape)
                  : o->op == TPF_OP_GEMM_RS ? gemm_rs_rules(o, &shape)
                                            : bulk_rules(o, &shape);
  if (rc == TPF_OK && out) *out = shape;
  return rc;
}
