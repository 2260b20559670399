/* Element conversions between the buffer dtypes and float, used by the simulator's GEMM and
 * reductions (host reference numerics). Round-to-nearest-even, as the GPU's conversions do.
 * Tests use their own, independent conversions. */
#include "internal.h"

#include <string.h>
#include <math.h>
#include <stdio.h>

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

static float half_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h >> 15) << 31;
  uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t man = h & 0x3FFu;
  if (exp == 0) {
    if (man == 0) return u2f(sign);
    /* Subnormal: value = man * 2^-24. */
    float v = (float)man * (1.0f / 16777216.0f);
    return sign ? -v : v;
  }
  if (exp == 31) return u2f(sign | 0x7F800000u | (man << 13));
  return u2f(sign | ((exp + 112u) << 23) | (man << 13));
}

static uint16_t float_to_half(float f) {
  uint32_t u = f2u(f);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t absu = u & 0x7FFFFFFFu;
  if (absu >= 0x7F800000u) /* Inf or NaN */
    return (uint16_t)(sign | 0x7C00u | (absu > 0x7F800000u ? 0x200u : 0u));
  if (absu >= 0x477FF000u) /* rounds to >= 65520: overflow to Inf */
    return (uint16_t)(sign | 0x7C00u);
  if (absu < 0x38800000u) {            /* below the smallest normal half: subnormal or zero */
    float a = u2f(absu) * 16777216.0f; /* in units of 2^-24 */
    uint32_t q = (uint32_t)a;
    float rem = a - (float)q;
    if (rem > 0.5f || (rem == 0.5f && (q & 1u))) q++;
    return (uint16_t)(sign | q);
  }
  uint32_t exp = ((absu >> 23) - 112u) << 10;
  uint32_t man = (absu >> 13) & 0x3FFu;
  uint32_t h = exp | man;
  uint32_t rest = absu & 0x1FFFu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++;
  return (uint16_t)(sign | h);
}

static uint16_t float_to_bf16(float f) {
  uint32_t u = f2u(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
  uint32_t lsb = (u >> 16) & 1u;
  u += 0x7FFFu + lsb;
  return (uint16_t)(u >> 16);
}

/* fp8 (OCP E4M3 / E5M2) decode; encode saturates to the largest finite value. */
static float fp8_to_float(uint8_t v, int ebits, int mbits, int bias) {
  /* Unsigned throughout: under -fsanitize=undefined gcc 12 instruments the shifts and no longer
   * proves a promoted uint8_t non-negative, so (v >> mbits) warned -Wsign-conversion. */
  const uint32_t u = (uint32_t)v;
  uint32_t sign = u >> 7;
  uint32_t exp = (u >> (unsigned)mbits) & ((1u << (unsigned)ebits) - 1u);
  uint32_t man = u & ((1u << (unsigned)mbits) - 1u);
  float r;
  /* E4M3 (the "fn" variant) has no infinities and one NaN code per sign, S.1111.111; E5M2
   * follows IEEE: exponent all ones is infinity (mantissa 0) or NaN. */
  if (ebits == 4 && exp == 15u && man == 7u) return u2f(0x7FC00000u | (sign << 31));
  if (ebits == 5 && exp == 31u) return u2f((sign << 31) | (man ? 0x7FC00000u : 0x7F800000u));
  if (exp == 0)
    r = (float)man / (float)(1u << mbits) * u2f((uint32_t)(127 + 1 - bias) << 23);
  else
    r = (1.0f + (float)man / (float)(1u << mbits)) * u2f((uint32_t)(127 + (int)exp - bias) << 23);
  return sign ? -r : r;
}

static uint8_t float_to_fp8(float f, int ebits, int mbits, int bias, float maxv) {
  /* Exhaustive nearest search over the 128 magnitudes: simple and exact (ties to the even code,
   * i.e. round to nearest even); the simulator is the reference, not a fast path. Values beyond
   * the largest finite one, infinities included, saturate to it (__NV_SATFINITE, TE's casts). */
  if (f != f) /* NaN stays NaN */
    return ebits == 4 ? 0x7Fu : 0x7Eu;
  uint8_t sign = signbit(f) ? 0x80u : 0u; /* -0 keeps its sign (0x80), as the GPU's cvt */
  float a = fabsf(f);
  if (a > maxv) a = maxv;
  uint8_t best = 0;
  float bestd = a;
  for (unsigned c = 1; c < 128u; c++) {
    float v = fp8_to_float((uint8_t)c, ebits, mbits, bias);
    if (v != v || v > maxv) /* skip NaN and infinity codes */
      continue;
    float d = v > a ? v - a : a - v;
    if (d < bestd || (d == bestd && (c & 1u) == 0u)) {
      bestd = d;
      best = (uint8_t)c;
    }
  }
  return (uint8_t)(sign | best);
}

float tpf_elem_to_float(tpf_dtype t, const void *p) {
  uint16_t h;
  float f;
  switch (t) {
  case TPF_BF16:
    memcpy(&h, p, 2);
    return u2f((uint32_t)h << 16);
  case TPF_FP16:
    memcpy(&h, p, 2);
    return half_to_float(h);
  case TPF_FP32:
    memcpy(&f, p, 4);
    return f;
  case TPF_FP8_E4M3:
    return fp8_to_float(*(const uint8_t *)p, 4, 3, 7);
  case TPF_FP8_E5M2:
    return fp8_to_float(*(const uint8_t *)p, 5, 2, 15);
  case TPF_DTYPE_COUNT:
    break;
  }
  return 0.0f;
}

void tpf_float_to_elem(tpf_dtype t, float v, void *p) {
  uint16_t h;
  switch (t) {
  case TPF_BF16:
    h = float_to_bf16(v);
    memcpy(p, &h, 2);
    return;
  case TPF_FP16:
    h = float_to_half(v);
    memcpy(p, &h, 2);
    return;
  case TPF_FP32:
    memcpy(p, &v, 4);
    return;
  case TPF_FP8_E4M3:
    *(uint8_t *)p = float_to_fp8(v, 4, 3, 7, 448.0f);
    return;
  case TPF_FP8_E5M2:
    *(uint8_t *)p = float_to_fp8(v, 5, 2, 15, 57344.0f);
    return;
  case TPF_DTYPE_COUNT:
    break;
  }
}

float tpf_gelu(float x) {
  /* The tanh form cuBLASLt's GELU epilogue computes; sqrt(2/pi) = 0.7978845608. */
  const float u = 0.7978845608f * (x + 0.044715f * x * x * x);
  return 0.5f * x * (1.0f + tanhf(u));
}

const char *tpf_op_key_name(uint8_t key, char *buf, size_t n) {
  static const char *const kinds[] = {"?", "ag_gemm", "gemm_rs", "bulk"};
  if (!buf || n == 0) return "";
  unsigned s = TPF_OP_KEY_SPLITS(key);
  snprintf(buf, n, "%s/%u split%s", kinds[TPF_OP_KEY_KIND(key)], s, s == 1 ? "" : "s");
  return buf;
}
