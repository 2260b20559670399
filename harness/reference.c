/* The independent host reference: conversions, GEMM, reduce-scatter sums, SPEC §7 comparison,
 * seeded fill.
 *
 * Method: conversions are bit manipulations written from the IEEE formats (bf16 is the top half
 * of an fp32; fp16 has 5 exponent bits, bias 15) with round-to-nearest-even; fp16 subnormals are
 * rounded by the FPU itself (adding 0.5f aligns the value so that one fp32 ulp is one fp16
 * subnormal ulp). The GEMM converts W once to fp32 and accumulates every dot product in fp32 in
 * increasing k, which is what "fp32 accumulation" means in SPEC §1; a backend that sums in
 * another order (CUDA) is judged with the accumulation-order slack gamma_K sum_k |a_ik b_jk|
 * (tpf_ref_order_slack_add), which bounds any order's fp32 rounding. The comparison is SPEC §7's
 * per-element verdict: one wrong element fails the result. Nothing here calls into the library, so
 * the reference cannot share a bug with it.
 */
#include "reference.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint32_t f2u(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}
static float u2f(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

float tpf_ref_bf16_to_float(uint16_t h) {
  return u2f((uint32_t)h << 16);
}

uint16_t tpf_ref_float_to_bf16(float f) {
  uint32_t x = f2u(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) /* NaN: keep it quiet and a NaN after truncation */
    return (uint16_t)((x >> 16) | 0x40u);
  x += 0x7fffu + ((x >> 16) & 1u); /* ties to even; a carry into the exponent is correct */
  return (uint16_t)(x >> 16);
}

float tpf_ref_fp16_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0) {
    float v = ldexpf((float)m, -24); /* zero or subnormal: exact */
    return sign ? -v : v;
  }
  if (e == 31) return u2f(sign | 0x7f800000u | (m << 13));
  return u2f(sign | ((e + 112u) << 23) | (m << 13));
}

uint16_t tpf_ref_float_to_fp16(float f) {
  uint32_t x = f2u(f);
  uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
  uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);  /* NaN */
  if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds beyond 65504: inf */
  if (ax < 0x38800000u) {
    /* Below 2^-14: fp16 subnormal (or zero). In a + 0.5f one fp32 ulp is 2^-24, the fp16
     * subnormal step, so the FPU's own round-to-nearest-even does the work. A result of 0x400
     * is the smallest normal, which is the right encoding too. */
    float a = u2f(ax) + 0.5f;
    return (uint16_t)(sign | (uint16_t)(f2u(a) - f2u(0.5f)));
  }
  uint32_t odd = (ax >> 13) & 1u;
  ax += 0xc8000fffu + odd; /* rebias the exponent by -112 and round to nearest even */
  return (uint16_t)(sign | (uint16_t)(ax >> 13));
}

/* FP8 (OCP 8-bit floating point, SPEC §11), written from the formats' definitions: E4M3 ("fn":
 * bias 7, no infinities, S.1111.111 the only NaN, max 448) and E5M2 (bias 15, IEEE-like: exponent
 * 31 is infinity or NaN, max 57344). Decoding is m * 2^(e - bias - mbits) with ldexpf. Encoding
 * (unlike the library's nearest-code search) scales the magnitude by the quantum of its binade,
 * rounds with rintf (the FPU's round-to-nearest-even) and rebuilds the code; magnitudes beyond
 * the largest finite value, infinities included, saturate to it (__NV_SATFINITE). */
typedef struct {
  int ebits, mbits, bias;
  float maxv;
} ref_fp8_fmt;

static ref_fp8_fmt ref_fp8(tpf_dtype t) {
  ref_fp8_fmt e4 = {4, 3, 7, 448.0f}, e5 = {5, 2, 15, 57344.0f};
  return t == TPF_FP8_E5M2 ? e5 : e4;
}

float tpf_ref_fp8_to_float(tpf_dtype t, uint8_t v) {
  const ref_fp8_fmt f = ref_fp8(t);
  const int sign = (v & 0x80u) != 0;
  const int e = (v >> f.mbits) & ((1 << f.ebits) - 1), m = v & ((1 << f.mbits) - 1);
  const int emax = (1 << f.ebits) - 1;
  float r;
  if (f.ebits == 4 && e == emax && m == (1 << f.mbits) - 1) {
    r = NAN;
  } else if (f.ebits == 5 && e == emax) {
    r = m ? NAN : INFINITY;
  } else if (e == 0) {
    r = ldexpf((float)m, 1 - f.bias - f.mbits);
  } else {
    r = ldexpf((float)((1 << f.mbits) + m), e - f.bias - f.mbits);
  }
  return sign ? -r : r;
}

uint8_t tpf_ref_float_to_fp8(tpf_dtype t, float v) {
  const ref_fp8_fmt f = ref_fp8(t);
  if (isnan(v)) return f.ebits == 4 ? 0x7fu : 0x7eu;
  const uint8_t sign = signbit(v) ? 0x80u : 0u;
  float a = fabsf(v);
  const int emin = 1 - f.bias; /* exponent of the smallest normal */
  /* The largest finite code: E4M3 S.1111.110, E5M2 S.11110.11. */
  const uint8_t maxcode = f.ebits == 4 ? 0x7eu : 0x7bu;
  if (a >= f.maxv) return (uint8_t)(sign | maxcode);
  if (a == 0.0f) return sign;
  int e2;
  (void)frexpf(a, &e2); /* a = fr * 2^e2, fr in [0.5, 1): binade exponent e2 - 1 */
  int e = e2 - 1;
  if (e < emin) e = emin;                        /* subnormal range: the quantum stays */
  const float n = rintf(ldexpf(a, f.mbits - e)); /* in quanta of 2^(e - mbits), RNE */
  if (ldexpf(n, e - f.mbits) > f.maxv) return (uint8_t)(sign | maxcode); /* rounded past max */
  long q = (long)n;
  if (q < (1l << f.mbits)) return (uint8_t)(sign | (uint8_t)q); /* subnormal (e == emin) */
  if (q == (1l << (f.mbits + 1))) { /* rounded up into the next binade */
    e++;
    q >>= 1;
  }
  return (uint8_t)(sign | (uint8_t)((e + f.bias) << f.mbits) | (uint8_t)(q - (1l << f.mbits)));
}

float tpf_ref_load(tpf_dtype t, const void *base, size_t idx) {
  switch (t) {
  case TPF_BF16: {
    uint16_t h;
    memcpy(&h, (const unsigned char *)base + idx * 2, 2);
    return tpf_ref_bf16_to_float(h);
  }
  case TPF_FP16: {
    uint16_t h;
    memcpy(&h, (const unsigned char *)base + idx * 2, 2);
    return tpf_ref_fp16_to_float(h);
  }
  case TPF_FP32: {
    float f;
    memcpy(&f, (const unsigned char *)base + idx * 4, 4);
    return f;
  }
  case TPF_FP8_E4M3:
  case TPF_FP8_E5M2:
    return tpf_ref_fp8_to_float(t, ((const uint8_t *)base)[idx]);
  default:
    return 0.0f;
  }
}

void tpf_ref_store(tpf_dtype t, void *base, size_t idx, float v) {
  switch (t) {
  case TPF_BF16: {
    uint16_t h = tpf_ref_float_to_bf16(v);
    memcpy((unsigned char *)base + idx * 2, &h, 2);
    break;
  }
  case TPF_FP16: {
    uint16_t h = tpf_ref_float_to_fp16(v);
    memcpy((unsigned char *)base + idx * 2, &h, 2);
    break;
  }
  case TPF_FP32:
    memcpy((unsigned char *)base + idx * 4, &v, 4);
    break;
  case TPF_FP8_E4M3:
  case TPF_FP8_E5M2:
    ((uint8_t *)base)[idx] = tpf_ref_float_to_fp8(t, v);
    break;
  default:
    break;
  }
}

float tpf_ref_round(tpf_dtype t, float v) {
  switch (t) {
  case TPF_BF16:
    return tpf_ref_bf16_to_float(tpf_ref_float_to_bf16(v));
  case TPF_FP16:
    return tpf_ref_fp16_to_float(tpf_ref_float_to_fp16(v));
  case TPF_FP8_E4M3:
  case TPF_FP8_E5M2:
    return tpf_ref_fp8_to_float(t, tpf_ref_float_to_fp8(t, v));
  default:
    return v;
  }
}

float tpf_ref_get(const tpf_matrix *m, uint64_t i, uint64_t j) {
  return tpf_ref_load(m->dtype, m->ptr, (size_t)(i * m->ld + j));
}

void tpf_ref_set(tpf_matrix *m, uint64_t i, uint64_t j, float v) {
  tpf_ref_store(m->dtype, m->ptr, (size_t)(i * m->ld + j), v);
}

uint64_t tpf_ref_rand_u64(uint64_t *state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t tpf_ref_mix(uint64_t h, uint64_t v) {
  uint64_t s = h ^ (v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2));
  return tpf_ref_rand_u64(&s);
}

float tpf_ref_rand_uniform(uint64_t *state, float lo, float hi) {
  /* 24 random bits: every value is an exact fp32 in [0, 1). */
  float u = (float)(tpf_ref_rand_u64(state) >> 40) * (1.0f / 16777216.0f);
  return lo + (hi - lo) * u;
}

void tpf_ref_fill(tpf_matrix *m, uint64_t seed, float lo, float hi) {
  uint64_t st = seed;
  for (uint64_t i = 0; i < m->rows; i++)
    for (uint64_t j = 0; j < m->cols; j++)
      tpf_ref_set(m, i, j, tpf_ref_rand_uniform(&st, lo, hi));
}

static bool dtype_ok(tpf_dtype t) {
  return t == TPF_BF16 || t == TPF_FP16 || t == TPF_FP32 || t == TPF_FP8_E4M3 || t == TPF_FP8_E5M2;
}

static tpf_status gemm_impl(const tpf_matrix *x, const tpf_matrix *w, tpf_matrix *d, float *out) {
  if (!x || !w || !x->ptr || !w->ptr || !dtype_ok(x->dtype) || !dtype_ok(w->dtype))
    return TPF_EINVAL;
  if (x->cols != w->cols) return TPF_EINVAL;
  if (d && (!d->ptr || !dtype_ok(d->dtype) || d->rows != x->rows || d->cols != w->rows))
    return TPF_EINVAL;
  uint64_t m = x->rows, n = w->rows, k = x->cols;
  float *wf = malloc((size_t)(n * k + k + 1) * sizeof(float));
  if (!wf) return TPF_ENOMEM;
  float *xf = wf + n * k;
  for (uint64_t j = 0; j < n; j++)
    for (uint64_t p = 0; p < k; p++)
      wf[j * k + p] = tpf_ref_get(w, j, p);
  for (uint64_t i = 0; i < m; i++) {
    for (uint64_t p = 0; p < k; p++)
      xf[p] = tpf_ref_get(x, i, p);
    for (uint64_t j = 0; j < n; j++) {
      const float *wr = wf + j * k;
      float acc = 0.0f;
      for (uint64_t p = 0; p < k; p++)
        acc += xf[p] * wr[p];
      if (d)
        tpf_ref_set(d, i, j, acc);
      else
        out[i * n + j] = acc;
    }
  }
  free(wf);
  return TPF_OK;
}

tpf_status tpf_ref_gemm(const tpf_matrix *x, const tpf_matrix *w, tpf_matrix *d) {
  if (!d) return TPF_EINVAL;
  return gemm_impl(x, w, d, NULL);
}

tpf_status tpf_ref_gemm_f32(const tpf_matrix *x, const tpf_matrix *w, float *out) {
  if (!out) return TPF_EINVAL;
  return gemm_impl(x, w, NULL, out);
}

tpf_status tpf_ref_rs_add_partial(const tpf_matrix *x_rows, const tpf_matrix *w, tpf_dtype buf,
                                  float *acc, float *slack) {
  /* Scale 1 multiplies exactly: the unscaled partial. */
  return tpf_ref_rs_add_partial_scaled(x_rows, w, buf, 1.0f, false, acc, slack);
}

tpf_status tpf_ref_rs_add_partial_scaled(const tpf_matrix *x_rows, const tpf_matrix *w,
                                         tpf_dtype buf, float scale, bool own_order, float *acc,
                                         float *slack) {
  if (!x_rows || !w || !acc || !slack) return TPF_EINVAL;
  const uint64_t n = x_rows->rows * w->rows;
  float *p = malloc((size_t)(n ? n : 1) * sizeof(float));
  if (!p) return TPF_ENOMEM;
  tpf_status st = tpf_ref_gemm_f32(x_rows, w, p);
  for (uint64_t i = 0; st == TPF_OK && i < n; i++) {
    const float v = p[i] * scale; /* the fp8 scales, applied once to the fp32 product */
    acc[i] += tpf_ref_round(buf, v);
    slack[i] += (float)tpf_ref_ulp(buf, v);
  }
  free(p);
  if (st == TPF_OK && own_order) st = tpf_ref_order_slack_add(x_rows, w, (double)scale, slack);
  return st;
}

tpf_status tpf_ref_rs_add_partial_order(const tpf_matrix *x_rows, const tpf_matrix *w,
                                        tpf_dtype buf, bool own_order, float *acc, float *slack) {
  return tpf_ref_rs_add_partial_scaled(x_rows, w, buf, 1.0f, own_order, acc, slack);
}

double tpf_ref_gamma(uint64_t k) {
  const double ku = (double)k * 0x1p-24;
  return ku >= 1.0 ? INFINITY : ku / (1.0 - ku);
}

/* v as a float no smaller than v (v >= 0): a bound stays a bound after the rounding. */
static float round_up(double v) {
  float f = (float)v;
  if ((double)f < v) f = nextafterf(f, INFINITY);
  return f;
}

/* bound[i * n + j] += scale * sum_p |x(i, p) w(j, p)| in double, rounded up. */
static tpf_status abs_gemm_add(const tpf_matrix *x, const tpf_matrix *w, double scale,
                               float *bound) {
  if (!x || !w || !bound || !x->ptr || !w->ptr || !dtype_ok(x->dtype) || !dtype_ok(w->dtype) ||
      x->cols != w->cols || !(scale >= 0.0))
    return TPF_EINVAL;
  const uint64_t m = x->rows, n = w->rows, k = x->cols;
  double *wa = malloc((size_t)(n * k + k + 1) * sizeof(double));
  if (!wa) return TPF_ENOMEM;
  double *xa = wa + n * k;
  for (uint64_t j = 0; j < n; j++)
    for (uint64_t p = 0; p < k; p++)
      wa[j * k + p] = fabs((double)tpf_ref_get(w, j, p));
  for (uint64_t i = 0; i < m; i++) {
    for (uint64_t p = 0; p < k; p++)
      xa[p] = fabs((double)tpf_ref_get(x, i, p));
    for (uint64_t j = 0; j < n; j++) {
      double s = 0.0;
      for (uint64_t p = 0; p < k; p++)
        s += xa[p] * wa[j * k + p];
      /* Double's own rounding of s (k ulps of double at most) is far below a float ulp; the
       * bound is rounded up once more on the way to float. */
      bound[i * n + j] = round_up((double)bound[i * n + j] + scale * s);
    }
  }
  free(wa);
  return TPF_OK;
}

tpf_status tpf_ref_gemm_abs_add(const tpf_matrix *x, const tpf_matrix *w, float *bound) {
  return abs_gemm_add(x, w, 1.0, bound);
}

tpf_status tpf_ref_order_slack_add(const tpf_matrix *x, const tpf_matrix *w, double scale,
                                   float *slack) {
  if (!x || !(scale >= 0.0)) return TPF_EINVAL;
  return abs_gemm_add(x, w, scale == 0.0 ? 0.0 : scale * tpf_ref_gamma(x->cols), slack);
}

tpf_status tpf_ref_order_slack(const tpf_matrix *x, const tpf_matrix *w, double scale,
                               bool own_order, float **slack) {
  if (!slack) return TPF_EINVAL;
  *slack = NULL;
  if (!own_order) return TPF_OK;
  if (!x || !w) return TPF_EINVAL;
  const uint64_t n = x->rows * w->rows;
  float *s = calloc((size_t)(n ? n : 1), sizeof(float));
  if (!s) return TPF_ENOMEM;
  tpf_status st = tpf_ref_order_slack_add(x, w, scale, s);
  if (st != TPF_OK) {
    free(s);
    return st;
  }
  *slack = s;
  return TPF_OK;
}

void tpf_ref_add_rows(const tpf_matrix *part, uint64_t r0, uint64_t rows, float *acc) {
  for (uint64_t i = 0; i < rows; i++)
    for (uint64_t j = 0; j < part->cols; j++)
      acc[i * part->cols + j] += tpf_ref_get(part, r0 + i, j);
}

void tpf_ref_set_f32(tpf_matrix *out, const float *v) {
  for (uint64_t i = 0; i < out->rows; i++)
    for (uint64_t j = 0; j < out->cols; j++)
      tpf_ref_set(out, i, j, v[i * out->cols + j]);
}

tpf_status tpf_ref_transpose(const tpf_matrix *src, tpf_matrix *dst) {
  if (!src || !dst || dst->rows != src->cols || dst->cols != src->rows || dst->ld < dst->cols)
    return TPF_EINVAL;
  for (uint64_t i = 0; i < src->rows; i++)
    for (uint64_t j = 0; j < src->cols; j++)
      tpf_ref_set(dst, j, i, tpf_ref_get(src, i, j));
  return TPF_OK;
}

float tpf_ref_gelu(float x) {
  const double d = (double)x;
  return (float)(0.5 * d * (1.0 + tanh(0.79788456080286535588 * (d + 0.044715 * d * d * d))));
}

tpf_status tpf_ref_epilogue(const float *v, float alpha, float beta, const tpf_matrix *old,
                            const void *bias, bool gelu, tpf_matrix *out) {
  if (!v || !out || (beta != 0.0f && (!old || old->rows != out->rows || old->cols != out->cols)))
    return TPF_EINVAL;
  for (uint64_t i = 0; i < out->rows; i++)
    for (uint64_t j = 0; j < out->cols; j++) {
      float x = alpha * v[i * out->cols + j];
      if (beta != 0.0f) x += beta * tpf_ref_get(old, i, j);
      if (bias) x += tpf_ref_load(out->dtype, bias, (size_t)j);
      tpf_ref_set(out, i, j, gelu ? tpf_ref_gelu(x) : x);
    }
  return TPF_OK;
}

tpf_ref_tol tpf_ref_tolerance(tpf_dtype t) {
  /* SPEC §7's table; the Python oracle (tests/python) uses the same numbers. */
  tpf_ref_tol tol;
  switch (t) {
  case TPF_FP32:
    tol.rtol = 1e-5;
    tol.atol = 1e-6;
    break;
  case TPF_FP16:
    tol.rtol = 0.01;
    tol.atol = 0.001;
    break;
  default: /* bf16, and the bf16 tolerances SPEC §7 gives FP8 inputs */
    tol.rtol = 0.02;
    tol.atol = 0.002;
    break;
  }
  return tol;
}

tpf_ref_tol tpf_ref_tolerance_pair(tpf_dtype a, tpf_dtype b) {
  tpf_ref_tol ta = tpf_ref_tolerance(a), tb = tpf_ref_tolerance(b);
  return ta.rtol >= tb.rtol ? ta : tb;
}

double tpf_ref_ulp(tpf_dtype t, double v) {
  int e = 0;
  double m = frexp(fabs(v), &e); /* |v| = m * 2^e, m in [0.5, 1) */
  (void)m;
  int mant = t == TPF_BF16       ? 7
             : t == TPF_FP16     ? 10
             : t == TPF_FP8_E4M3 ? 3
             : t == TPF_FP8_E5M2 ? 2
                                 : 23;
  int emin = t == TPF_BF16       ? -125
             : t == TPF_FP16     ? -13
             : t == TPF_FP8_E4M3 ? -5
             : t == TPF_FP8_E5M2 ? -13
                                 : -125; /* smallest normal exponent + 1 */
  if (v == 0.0 || e < emin) e = emin;
  return ldexp(1.0, e - 1 - mant);
}

/* SPEC §7, per element: an element is wrong iff rel > rtol and abs > atol (rel = abs /
 * max(|want|, 1e-5)), or exactly one of got/want is NaN/inf, or both are infinities of different
 * sign. With slack, an element that misses the tolerance is still right when it differs by no more
 * than its slack plus one ulp of the result in got's dtype. The verdict is that no element is
 * wrong; the max-abs-diff element is reported as well, but it decides nothing. */
static tpf_status compare(const tpf_matrix *got, const tpf_matrix *want, const float *slack,
                          tpf_ref_tol tol, tpf_ref_result *res) {
  if (!got || !want || !res || got->rows != want->rows || got->cols != want->cols)
    return TPF_EINVAL;
  tpf_ref_result r;
  memset(&r, 0, sizeof r);
  r.tol = tol;
  double best = -1.0, worst = -1.0;
  for (uint64_t i = 0; i < got->rows; i++) {
    for (uint64_t j = 0; j < got->cols; j++) {
      double g = tpf_ref_get(got, i, j), w = tpf_ref_get(want, i, j);
      double diff;
      bool bad;
      if (isfinite(g) && isfinite(w)) {
        diff = fabs(g - w);
        double rel = diff / fmax(fabs(w), 1e-5);
        bad = rel > tol.rtol && diff > tol.atol;
        if (bad && slack)
          bad = diff > (double)slack[i * got->cols + j] + tpf_ref_ulp(got->dtype, w);
      } else {
        /* Equal infinities or two NaNs agree; anything else is the worst possible element. */
        bool same = (isnan(g) && isnan(w)) || g == w;
        diff = same ? 0.0 : INFINITY;
        bad = !same;
        if (bad) r.nonfinite++;
      }
      r.compared++;
      if (diff > best) {
        best = diff;
        r.row = i;
        r.col = j;
        r.got = g;
        r.want = w;
        r.abs_diff = diff;
      }
      if (bad) {
        r.wrong++;
        if (diff > worst) {
          worst = diff;
          r.wrong_row = i;
          r.wrong_col = j;
          r.wrong_got = g;
          r.wrong_want = w;
          r.wrong_abs = diff;
          r.wrong_rel = isinf(diff) ? INFINITY : diff / fmax(fabs(w), 1e-5);
        }
      }
    }
  }
  if (r.compared) r.rel = isinf(r.abs_diff) ? INFINITY : r.abs_diff / fmax(fabs(r.want), 1e-5);
  r.pass = r.wrong == 0;
  *res = r;
  return TPF_OK;
}

tpf_status tpf_ref_compare(const tpf_matrix *got, const tpf_matrix *want, tpf_ref_tol tol,
                           tpf_ref_result *res) {
  return compare(got, want, NULL, tol, res);
}

tpf_status tpf_ref_compare_slack(const tpf_matrix *got, const tpf_matrix *want, const float *slack,
                                 tpf_ref_tol tol, tpf_ref_result *res) {
  if (!slack) return TPF_EINVAL;
  return compare(got, want, slack, tol, res);
}

void tpf_ref_format(const tpf_ref_result *res, char *buf, size_t len) {
  if (res->pass) {
    snprintf(buf, len,
             "max diff at (%llu, %llu): got %.6g want %.6g abs %.3g rel %.3g; 0 of %llu elements "
             "out of tolerance (rtol %g, atol %g): PASS",
             (unsigned long long)res->row, (unsigned long long)res->col, res->got, res->want,
             res->abs_diff, res->rel, (unsigned long long)res->compared, res->tol.rtol,
             res->tol.atol);
    return;
  }
  char nf[64] = "";
  if (res->nonfinite)
    snprintf(nf, sizeof nf, ", %llu of them NaN/inf mismatches",
             (unsigned long long)res->nonfinite);
  snprintf(buf, len,
           "%llu of %llu elements out of tolerance (rtol %g, atol %g%s), worst at (%llu, %llu): "
           "got %.6g want %.6g abs %.3g rel %.3g; max diff at (%llu, %llu): got %.6g want %.6g "
           "abs %.3g: FAIL",
           (unsigned long long)res->wrong, (unsigned long long)res->compared, res->tol.rtol,
           res->tol.atol, nf, (unsigned long long)res->wrong_row,
           (unsigned long long)res->wrong_col, res->wrong_got, res->wrong_want, res->wrong_abs,
           res->wrong_rel, (unsigned long long)res->row, (unsigned long long)res->col, res->got,
           res->want, res->abs_diff);
}

bool tpf_ref_check(const tpf_matrix *got, const tpf_matrix *want, const float *slack,
                   tpf_ref_tol tol, const char *what, char *why, size_t len) {
  tpf_ref_result r;
  tpf_status st = slack ? tpf_ref_compare_slack(got, want, slack, tol, &r)
                        : tpf_ref_compare(got, want, tol, &r);
  if (st != TPF_OK) {
    snprintf(why, len, "%s: shapes differ", what);
    return false;
  }
  if (r.pass) return true;
  char line[TPF_REF_FORMAT_LEN];
  tpf_ref_format(&r, line, sizeof line);
  snprintf(why, len, "%s: %s", what, line);
  return false;
}

bool tpf_ref_check_exact(const tpf_matrix *got, const tpf_matrix *want, const char *what, char *why,
                         size_t len) {
  size_t esz = tpf_dtype_size(got->dtype);
  for (uint64_t i = 0; i < got->rows; i++) {
    const unsigned char *g = (const unsigned char *)got->ptr + i * got->ld * esz;
    const unsigned char *w = (const unsigned char *)want->ptr + i * want->ld * esz;
    if (memcmp(g, w, (size_t)got->cols * esz) == 0) continue;
    uint64_t j = 0;
    while (j < got->cols && memcmp(g + j * esz, w + j * esz, esz) == 0)
      j++;
    snprintf(why, len, "%s: element (%llu, %llu) is %g, expected %g (bytes must be copied exactly)",
             what, (unsigned long long)i, (unsigned long long)j, (double)tpf_ref_get(got, i, j),
             (double)tpf_ref_get(want, i, j));
    return false;
  }
  return true;
}
