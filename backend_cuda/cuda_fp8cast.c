/* The FP8 casts' public calls (tpflex_cuda.h; the kernels are in cuda_fp8cast.cu): the
 * arguments are checked in a fixed order, each refusal naming its argument and changing nothing,
 * then one launch on the caller's stream. No backend object: python/tpflex/_quant.py calls them
 * for the modules' casts inside autocast. */
#include "cuda_error.h"
#include "cuda_internal.h"

#include <math.h>

/* The tiled kernels' grid has one block row per 32 rows: CUDA caps grid y at 65535. */
#define TPF_FP8_MAX_TILED_ROWS (65500ull * 32ull)

static bool tpf_fp8__high(tpf_dtype t) {
  return t == TPF_BF16 || t == TPF_FP16 || t == TPF_FP32;
}
static bool tpf_fp8__low(tpf_dtype t) {
  return t == TPF_FP8_E4M3 || t == TPF_FP8_E5M2;
}

tpf_status tpf_cuda_fp8_cast(const void *x, tpf_dtype x_dtype, uint64_t rows, uint64_t cols,
                             void *out, void *out_t, tpf_dtype out_dtype, const float *scale,
                             const float *amax, float epsilon, int pow2, float *scale_inv,
                             float *amax_record, void *stream) {
  const char *f = "tpf_cuda_fp8_cast";
  uint64_t n = 0;
  TPF_RETURN_IF(!x, TPF_EINVAL, "%s: x is NULL", f);
  TPF_RETURN_IF(!tpf_fp8__high(x_dtype), TPF_EINVAL,
                "%s: x_dtype %d is not TPF_BF16, TPF_FP16 or TPF_FP32", f, (int)x_dtype);
  TPF_RETURN_IF(!tpf_mul_u64(rows, cols, &n), TPF_EINVAL, "%s: rows %llu x cols %llu overflows", f,
                (unsigned long long)rows, (unsigned long long)cols);
  TPF_RETURN_IF(!out && !out_t, TPF_EINVAL, "%s: out and out_t are both NULL (give one or both)",
                f);
  TPF_RETURN_IF(out_t && rows > TPF_FP8_MAX_TILED_ROWS, TPF_EINVAL,
                "%s: out_t for %llu rows (at most %llu)", f, (unsigned long long)rows,
                (unsigned long long)TPF_FP8_MAX_TILED_ROWS);
  TPF_RETURN_IF(!tpf_fp8__low(out_dtype), TPF_EINVAL,
                "%s: out_dtype %d is not TPF_FP8_E4M3 or TPF_FP8_E5M2", f, (int)out_dtype);
  TPF_RETURN_IF(!scale == !amax, TPF_EINVAL,
                "%s: give exactly one of scale (delayed scaling) and amax (current scaling)", f);
  TPF_RETURN_IF(!(epsilon >= 0.0f), TPF_EINVAL, "%s: epsilon %g is negative or NaN", f,
                (double)epsilon);
  TPF_RETURN_IF(!scale_inv, TPF_EINVAL, "%s: scale_inv is NULL", f);
  tpf_cuda_fp8_cast_args a = {
      .x = x,
      .x_dtype = (int)x_dtype,
      .rows = rows,
      .cols = cols,
      .out = out,
      .out_t = out_t,
      .out_dtype = (int)out_dtype,
      .scale = scale,
      .amax = amax,
      .fmax = out_dtype == TPF_FP8_E4M3 ? 448.0f : 57344.0f,
      .epsilon = epsilon,
      .pow2 = pow2 != 0,
      .scale_inv = scale_inv,
      .amax_record = amax_record,
  };
  TPF_CUDA_TRY(tpf_cuda__launch_fp8_cast(&a, (cudaStream_t)stream), "launch of the fp8 cast");
  return TPF_OK;
}

tpf_status tpf_cuda_fp8_amax(const void *x, tpf_dtype x_dtype, uint64_t n, float *amax,
                             void *stream) {
  const char *f = "tpf_cuda_fp8_amax";
  TPF_RETURN_IF(!x, TPF_EINVAL, "%s: x is NULL", f);
  TPF_RETURN_IF(!tpf_fp8__high(x_dtype), TPF_EINVAL,
                "%s: x_dtype %d is not TPF_BF16, TPF_FP16 or TPF_FP32", f, (int)x_dtype);
  TPF_RETURN_IF(!amax, TPF_EINVAL, "%s: amax is NULL", f);
  TPF_CUDA_TRY(tpf_cuda__launch_fp8_amax(x, (int)x_dtype, n, amax, (cudaStream_t)stream),
               "launch of the amax kernel");
  return TPF_OK;
}

tpf_status tpf_cuda_transpose_bytes(const void *src, uint64_t rows, uint64_t cols, void *dst,
                                    void *stream) {
  const char *f = "tpf_cuda_transpose_bytes";
  uint64_t n = 0;
  TPF_RETURN_IF(!src || !dst, TPF_EINVAL, "%s: %s is NULL", f, !src ? "src" : "dst");
  TPF_RETURN_IF(!tpf_mul_u64(rows, cols, &n), TPF_EINVAL, "%s: rows %llu x cols %llu overflows", f,
                (unsigned long long)rows, (unsigned long long)cols);
  TPF_RETURN_IF(rows > TPF_FP8_MAX_TILED_ROWS, TPF_EINVAL, "%s: %llu rows (at most %llu)", f,
                (unsigned long long)rows, (unsigned long long)TPF_FP8_MAX_TILED_ROWS);
  TPF_CUDA_TRY(tpf_cuda__launch_transpose_bytes(src, rows, cols, dst, (cudaStream_t)stream),
               "launch of the byte transpose");
  return TPF_OK;
}
