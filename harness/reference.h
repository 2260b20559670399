/* The independent host reference of tpflex's tests and demo.
 *
 * Everything here is written from the definitions in SPEC §1 and §7 and shares no code with the
 * library: its own bf16/fp16 conversions (round-to-nearest-even), its own GEMM (fp32 accumulation
 * in k order, rounded once to the output dtype) and the per-element comparison of SPEC §7 (one
 * element out of tolerance fails the result; TE's tests judge only the max-abs-diff element,
 * tpflex is stricter). The library's tpf_elem_to_float/tpf_float_to_elem are
 * deliberately not used, so a bug in them cannot cancel out. Part of the harness library
 * (harness/, tpf_harness), which the tests and the tpflex CLI (demo, bench, calibrate) link.
 */
#ifndef TPF_REFERENCE_H
#define TPF_REFERENCE_H

#include "tpflex/tpflex.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- element conversions (round-to-nearest-even; NaN stays NaN, overflow goes to inf) ---- */
float tpf_ref_bf16_to_float(uint16_t h);
uint16_t tpf_ref_float_to_bf16(float f);
float tpf_ref_fp16_to_float(uint16_t h);
uint16_t tpf_ref_float_to_fp16(float f);
/* Element idx (in elements) of an array of dtype t (bf16, fp16 or fp32; others read as 0). */
/* FP8 E4M3 (fn) / E5M2 (SPEC §11): decode any code; encode with round-to-nearest-even and
 * saturation to the largest finite value (infinities too); NaN encodes as 0x7f / 0x7e. */
float tpf_ref_fp8_to_float(tpf_dtype t, uint8_t v);
uint8_t tpf_ref_float_to_fp8(tpf_dtype t, float v);
float tpf_ref_load(tpf_dtype t, const void *base, size_t idx);
void tpf_ref_store(tpf_dtype t, void *base, size_t idx, float v);
/* v rounded to dtype t and back (fp32: unchanged). */
float tpf_ref_round(tpf_dtype t, float v);

/* ---- matrices ---- */
/* Element (i, j) of m as float. */
float tpf_ref_get(const tpf_matrix *m, uint64_t i, uint64_t j);
void tpf_ref_set(tpf_matrix *m, uint64_t i, uint64_t j, float v);

/* splitmix64: a tiny seeded generator, the same on every platform. */
uint64_t tpf_ref_rand_u64(uint64_t *state);
/* A seed derived from h and v (a hash combine, then splitmix64): chains of it name one input of
 * a sweep, so every rank can regenerate every other rank's operands. */
uint64_t tpf_ref_mix(uint64_t h, uint64_t v);
/* Uniform in [lo, hi). */
float tpf_ref_rand_uniform(uint64_t *state, float lo, float hi);
/* Fills m (rows x cols, respecting ld) with uniform values in [lo, hi) rounded to m's dtype, from
 * a generator seeded with `seed`. Same seed, same values. */
void tpf_ref_fill(tpf_matrix *m, uint64_t seed, float lo, float hi);

/* d = x * w^T: x [m, k], w [n, k], d [m, n]; any mix of bf16/fp16/fp32; fp32 accumulation over
 * k in increasing order, rounded once to d's dtype. TPF_EINVAL when dimensions disagree or a
 * dtype is not bf16/fp16/fp32. */
tpf_status tpf_ref_gemm(const tpf_matrix *x, const tpf_matrix *w, tpf_matrix *d);
/* Same product into an fp32 array out[m * n] (row-major, ld n), without the final rounding. */
tpf_status tpf_ref_gemm_f32(const tpf_matrix *x, const tpf_matrix *w, float *out);

/* ---- API 0.2 options (tpflex.h, tpf_op_options) ---- */
/* dst = src^T: src [r, c] (any ld), dst [c, r] of src's dtype with ld >= r. TPF_EINVAL when the
 * shapes do not fit. Exact (a copy). */
tpf_status tpf_ref_transpose(const tpf_matrix *src, tpf_matrix *dst);
/* GELU, tanh form, computed in double: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). */
float tpf_ref_gelu(float x);
/* The epilogue of tpf_op_options on an fp32 product v [out->rows * out->cols] (row-major, ld
 * cols): out[i, j] = act(alpha v + beta old[i, j] + bias[j]) rounded once to out's dtype. old
 * (same shape as out) is read only when beta != 0; bias (out->cols elements of out's dtype) may
 * be NULL. out and old may be the same matrix. */
tpf_status tpf_ref_epilogue(const float *v, float alpha, float beta, const tpf_matrix *old,
                            const void *bias, bool gelu, tpf_matrix *out);

/* ---- reduce-scatter references ---- */
/* Adds one rank's partial of GEMM+RS to the expected rows of the calling rank's chunk:
 * acc[i * n + j] += p(i, j) rounded to the buffer dtype buf (a partial lives in the buffer's slots
 * before it is summed, SPEC §2) and slack[i * n + j] += one ulp of p(i, j) (tpf_ref_ulp; for
 * tpf_ref_compare_slack), where p = x_rows * w^T in fp32 (tpf_ref_gemm_f32): x_rows [R, k] are the
 * chunk's rows of that rank's x, w [n, k] that rank's weight. TPF_EINVAL as tpf_ref_gemm_f32,
 * TPF_ENOMEM. */
tpf_status tpf_ref_rs_add_partial(const tpf_matrix *x_rows, const tpf_matrix *w, tpf_dtype buf,
                                  float *acc, float *slack);
/* Same as tpf_ref_rs_add_partial, and when own_order (the backend sums over k in its own order:
 * the CUDA backend) also adds the partial's accumulation-order slack to slack
 * (tpf_ref_order_slack_add with scale 1): SPEC §7's reduce-scatter slack is then one ulp per
 * rounded partial plus gamma_K sum_q sum_k |x_q(i, k) w_q(j, k)| over the partials q. */
tpf_status tpf_ref_rs_add_partial_order(const tpf_matrix *x_rows, const tpf_matrix *w,
                                        tpf_dtype buf, bool own_order, float *acc, float *slack);
/* Adds rows [r0, r0 + rows) of part to acc[rows * part->cols] (row-major, ld part->cols), in fp32
 * and without rounding: one rank's contribution to a bulk reduce-scatter chunk, whose partials
 * are already stored in the buffer dtype. */
/* tpf_ref_rs_add_partial_order with the product scaled by `scale` (fp8 a_scale_inv * w_scale_inv)
 * before it is rounded to buf. */
tpf_status tpf_ref_rs_add_partial_scaled(const tpf_matrix *x_rows, const tpf_matrix *w,
                                         tpf_dtype buf, float scale, bool own_order, float *acc,
                                         float *slack);
void tpf_ref_add_rows(const tpf_matrix *part, uint64_t r0, uint64_t rows, float *acc);
/* out(i, j) = v[i * out->cols + j], rounded once to out's dtype. */
void tpf_ref_set_f32(tpf_matrix *out, const float *v);

/* ---- SPEC §7 comparison ---- */
typedef struct {
  double rtol, atol;
} tpf_ref_tol;
/* SPEC §7: bf16 rtol 0.02 / atol 0.002, fp16 0.01 / 0.001, fp32 1e-5 / 1e-6 (any other dtype:
 * bf16's, which SPEC §7 also gives FP8 inputs). */
tpf_ref_tol tpf_ref_tolerance(tpf_dtype t);

/* One comparison. An element is wrong iff rel > rtol and abs > atol (rel = abs / max(|want|,
 * 1e-5)), or its NaN/inf does not agree (a NaN against a NaN, or equal infinities, agree); with a
 * slack (tpf_ref_compare_slack) an element within its slack is not wrong. pass == (wrong == 0). */
typedef struct {
  uint64_t row, col;  /* the max-abs-diff element m (0, 0 for an empty matrix); decides nothing */
  double got, want;   /* values at m */
  double abs_diff;    /* |got - want| at m (inf for a NaN/inf mismatch) */
  double rel;         /* abs_diff / max(|want|, 1e-5) */
  uint64_t wrong;     /* wrong elements (nccl-tests' #wrong), NaN/inf mismatches included */
  uint64_t nonfinite; /* of them, NaN/inf mismatches */
  uint64_t compared;  /* elements compared */
  /* The worst wrong element (largest abs among the wrong ones); zero when wrong == 0. */
  uint64_t wrong_row, wrong_col;
  double wrong_got, wrong_want, wrong_abs, wrong_rel;
  tpf_ref_tol tol; /* the tolerance applied */
  bool pass;       /* no element is wrong */
} tpf_ref_result;

/* Room tpf_ref_format needs for any result. */
#define TPF_REF_FORMAT_LEN 400

/* Compares got against want (same rows and cols; dtypes may differ) with tolerance tol, element
 * by element (SPEC §7): the result passes only when no element is wrong. TPF_EINVAL (res
 * untouched) when the shapes differ or an argument is NULL. */
tpf_status tpf_ref_compare(const tpf_matrix *got, const tpf_matrix *want, tpf_ref_tol tol,
                           tpf_ref_result *res);
/* One ulp of dtype t at magnitude |v| (bf16, fp16, else fp32), subnormal spacing near zero. */
double tpf_ref_ulp(tpf_dtype t, double v);
/* Reduce-scatter results: every partial passes through the buffer dtype before the fp32 sum, and
 * a backend whose fp32 accumulation order differs from the reference's may round a partial to
 * the neighbouring value: one ulp of that partial, which can far exceed SPEC §7's tolerance when
 * partials cancel. slack[i * cols + j] holds the sum of one ulp of each partial of element (i, j)
 * (accumulate it with tpf_ref_ulp), plus, for a backend that sums in its own order, the
 * accumulation-order slack (tpf_ref_order_slack_add; alone, without partials, for a plain GEMM).
 * An element is wrong when it misses SPEC §7's tolerance AND differs by more than its slack plus
 * one ulp of the result; the verdict is that none is wrong. TPF_EINVAL when shapes differ or
 * slack is NULL. */
tpf_status tpf_ref_compare_slack(const tpf_matrix *got, const tpf_matrix *want, const float *slack,
                                 tpf_ref_tol tol, tpf_ref_result *res);
/* ---- accumulation-order slack (SPEC §7) ----
 * The reference sums over k in increasing order in fp32. A backend that sums in another order
 * (the CUDA backend: cuBLASLt's kernels split and tree-sum k) gets another fp32 rounding of every
 * partial sum; where the products cancel, that differs from the reference by far more than fp32's
 * 1e-5 / 1e-6 (e.g. 2e-6 on an element of 0.01 whose products sum to 4 in magnitude). Any order
 * of an fp32 sum of K products is within gamma_K sum_k |a_ik b_jk| of the exact value (Higham,
 * "Accuracy and Stability of Numerical Algorithms", 3.1), and so is the reference's: such a
 * backend's element is not wrong when it is within gamma_K sum_k |a_ik b_jk| (plus one ulp of the
 * result, tpf_ref_compare_slack) of the reference. Only a caller whose backend sums in its own
 * order adds this slack; the simulator sums in the reference's order and is held exact. The rule
 * is the Python oracle's (tests/python/cases.py, Env.order_slack). */
/* gamma_k = k u / (1 - k u) with u = 2^-24 (fp32's unit roundoff); +inf when k u >= 1. */
double tpf_ref_gamma(uint64_t k);
/* bound[i * n + j] += sum_p |x(i, p) w(j, p)| for x [m, k], w [n, k] (bound [m * n], row-major),
 * summed in double and rounded up to float. TPF_EINVAL as tpf_ref_gemm_f32, TPF_ENOMEM. */
tpf_status tpf_ref_gemm_abs_add(const tpf_matrix *x, const tpf_matrix *w, float *bound);
/* The accumulation-order slack of x w^T: slack[i * n + j] += scale gamma_k sum_p |x(i, p) w(j, p)|
 * (k = x->cols), rounded up to float. scale: what the caller's epilogue multiplies the product by
 * (|alpha|, GELU's slope bound 1.2), else 1; a negative or NaN scale is TPF_EINVAL. For a
 * reduce-scatter, add it for every partial (tpf_ref_rs_add_partial_order). */
tpf_status tpf_ref_order_slack_add(const tpf_matrix *x, const tpf_matrix *w, double scale,
                                   float *slack);
/* *slack = NULL when !own_order (judge with SPEC §7 alone), else a new zeroed array (free() it)
 * of x->rows * w->rows elements holding tpf_ref_order_slack_add's slack of x w^T times scale;
 * pass it to tpf_ref_check / tpf_ref_compare_slack. On failure *slack is NULL. */
tpf_status tpf_ref_order_slack(const tpf_matrix *x, const tpf_matrix *w, double scale,
                               bool own_order, float **slack);

/* Tolerance for comparing results stored in these dtypes: the looser of the two. */
tpf_ref_tol tpf_ref_tolerance_pair(tpf_dtype a, tpf_dtype b);
/* Checks got against want with SPEC §7 (slack NULL) or tpf_ref_compare_slack; on failure writes
 * "<what>: <the tpf_ref_format line>" into why and returns false. */
bool tpf_ref_check(const tpf_matrix *got, const tpf_matrix *want, const float *slack,
                   tpf_ref_tol tol, const char *what, char *why, size_t len);
/* Byte-exact comparison (data that is only copied); on failure names the first differing
 * element in why and returns false. */
bool tpf_ref_check_exact(const tpf_matrix *got, const tpf_matrix *want, const char *what, char *why,
                         size_t len);
/* Formats a result as one line: on a pass "max diff at (3, 7): got 1.5 want 1.49 abs 0.01 rel
 * 0.0067; 0 of 64 elements out of tolerance (rtol 0.02, atol 0.002): PASS"; on a failure the
 * wrong count, the worst wrong element and the max-abs-diff element, ending in "FAIL". Fits in
 * TPF_REF_FORMAT_LEN characters. */
void tpf_ref_format(const tpf_ref_result *res, char *buf, size_t len);

#ifdef __cplusplus
}
#endif
#endif /* TPF_REFERENCE_H */
