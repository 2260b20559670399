/* The simulator's arithmetic: a portable CPU GEMM and the fp32 reductions.
 *
 * Method: operands of any of bf16/fp16/fp32/fp8 (E4M3, E5M2) are staged row by row into fp32
 * scratch with the core's element conversions (tpf_elem_to_float, round-to-nearest-even on the way
 * back), so every GEMM accumulates in fp32 over k in increasing order and rounds once to the output
 * dtype, as SPEC §1 asks. The weight block is staged once per step; the activation one row at a
 * time, which keeps the scratch at (n + 1) * k floats. Reductions sum their sources in the order
 * given (the schedule's order) in fp32 and round once.
 */
#include "sim_internal.h"

#include <stdlib.h>
#include <string.h>

tpf_status tpf_sim__scratch_reserve(tpf_sim_scratch *s, size_t floats) {
  if (floats <= s->cap) return TPF_OK;
  float *p = tpf_realloc(s->buf, floats * sizeof(float));
  if (!p) return tpf_set_error(TPF_ENOMEM, "simulator scratch of %zu floats", floats);
  s->buf = p;
  s->cap = floats;
  return TPF_OK;
}

void tpf_sim__scratch_free(tpf_sim_scratch *s) {
  tpf_free(s->buf);
  s->buf = NULL;
  s->cap = 0;
}

static inline const unsigned char *view_elem(const tpf_sim_view *v, size_t esz, uint64_t i,
                                             uint64_t j) {
  return v->base + (i * v->ld + j) * esz;
}

/* Stages row i of v (n elements) as fp32. fp32 rows are copied; 16-bit ones converted. */
static void load_row(const tpf_sim_view *v, uint64_t i, uint64_t n, float *out) {
  size_t esz = tpf_dtype_size(v->dtype);
  const unsigned char *p = view_elem(v, esz, i, 0);
  if (v->dtype == TPF_FP32) {
    memcpy(out, p, (size_t)n * sizeof(float));
    return;
  }
  for (uint64_t j = 0; j < n; j++)
    out[j] = tpf_elem_to_float(v->dtype, p + j * esz);
}

static void store_row(const tpf_sim_view *v, uint64_t i, uint64_t n, const float *in) {
  size_t esz = tpf_dtype_size(v->dtype);
  unsigned char *p = v->base + (i * v->ld) * esz;
  if (v->dtype == TPF_FP32) {
    memcpy(p, in, (size_t)n * sizeof(float));
    return;
  }
  for (uint64_t j = 0; j < n; j++)
    tpf_float_to_elem(v->dtype, in[j], p + j * esz);
}

/* Applies the epilogue to one output row: v -> act(alpha v + beta old + bias). `old` is d's row
 * before the write (read only when beta != 0). */
static void epilogue_row(const tpf_sim_epi *e, const tpf_sim_view *d, uint64_t i, uint64_t n,
                         float *v, float *old) {
  if (!e || !e->epi) return;
  const tpf_epilogue *p = e->epi;
  if (p->beta != 0.0f) load_row(d, i, n, old);
  size_t esz = tpf_dtype_size(d->dtype);
  for (uint64_t j = 0; j < n; j++) {
    float x = p->alpha * v[j];
    if (p->beta != 0.0f) x += p->beta * old[j];
    if (p->bias)
      x += tpf_elem_to_float(d->dtype, (const unsigned char *)p->bias + (e->bias_col + j) * esz);
    v[j] = p->gelu ? tpf_gelu(x) : x;
  }
}

tpf_status tpf_sim__gemm(tpf_sim_scratch *s, tpf_sim_view a, tpf_sim_view w, tpf_sim_view d,
                         uint64_t m, uint64_t n, uint64_t k, unsigned flags,
                         const tpf_sim_epi *epi) {
  if (m == 0 || n == 0) return TPF_OK;
  /* Scratch: the weight block (n*k), one activation row (k), one output row (n), the old output
   * row (n), a stored row of a transposed weight (n). */
  TPF_CHECK(tpf_sim__scratch_reserve(s, (size_t)(n * k + k + 3 * n)));
  float *wf = s->buf, *xf = wf + n * k, *df = xf + k, *old = df + n, *tmp = old + n;
  if (flags & TPF_STEP_TRANS_W) {
    /* Stored [k, n]: row p holds w'[*, p]; scatter it into the [n, k] staging. */
    for (uint64_t p = 0; p < k; p++) {
      load_row(&w, p, n, tmp);
      for (uint64_t j = 0; j < n; j++)
        wf[j * k + p] = tmp[j];
    }
  } else {
    for (uint64_t j = 0; j < n; j++)
      load_row(&w, j, k, wf + j * k);
  }
  size_t aesz = tpf_dtype_size(a.dtype);
  for (uint64_t i = 0; i < m; i++) {
    if (flags & TPF_STEP_TRANS_A) {
      for (uint64_t p = 0; p < k; p++) /* stored [k, m]: column i */
        xf[p] = tpf_elem_to_float(a.dtype, view_elem(&a, aesz, p, i));
    } else {
      load_row(&a, i, k, xf);
    }
    for (uint64_t j = 0; j < n; j++) {
      const float *wr = wf + j * k;
      float acc = 0.0f;
      for (uint64_t p = 0; p < k; p++)
        acc += xf[p] * wr[p];
      df[j] = acc;
    }
    if (epi && epi->scale != 1.0f)
      for (uint64_t j = 0; j < n; j++)
        df[j] *= epi->scale;
    epilogue_row(epi, &d, i, n, df, old);
    store_row(&d, i, n, df);
  }
  return TPF_OK;
}

tpf_status tpf_sim__reduce(tpf_sim_scratch *s, const tpf_sim_view *src, uint32_t count,
                           tpf_sim_view d, uint64_t m, uint64_t n, const tpf_sim_epi *epi) {
  if (m == 0 || n == 0) return TPF_OK;
  TPF_CHECK(tpf_sim__scratch_reserve(s, (size_t)(3 * n)));
  float *acc = s->buf, *row = acc + n, *old = row + n;
  for (uint64_t i = 0; i < m; i++) {
    /* Read every source row before writing d's: d may be one of them (BULK RS in place). */
    memset(acc, 0, (size_t)n * sizeof(float));
    for (uint32_t t = 0; t < count; t++) {
      load_row(&src[t], i, n, row);
      for (uint64_t j = 0; j < n; j++)
        acc[j] += row[j];
    }
    epilogue_row(epi, &d, i, n, acc, old);
    store_row(&d, i, n, acc);
  }
  return TPF_OK;
}
