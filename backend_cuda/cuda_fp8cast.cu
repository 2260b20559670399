/* Device code of the FP8 casts the modules run inside autocast (SPEC §14; the public calls are in
 * cuda_fp8cast.c): one pass over a high-precision tensor that scales, saturates and rounds every
 * element to FP8 (and records its amax), a transposed variant through shared-memory tiles, the
 * amax alone, and a byte transpose of FP8 data. torch's way is five kernels per cast, each
 * reading and writing fp32 (tens of bytes per element); this is one, reading the input once and
 * writing one byte.
 *
 * Method. An element becomes fp8(sat(float(x) * scale)) with cuda_fp8.h's round-to-nearest-even,
 * saturating-to-finite conversion: the same bits as torch's fp32 product, clamp to the format's
 * largest finite value and conversion (NaN stays NaN). The scale is read from the device (delayed
 * scaling) or computed from an amax on the device (current scaling: fp8_max / amax, correctly
 * rounded, amax below epsilon raised to it; 1 where amax is 0, inf or NaN; fp32's max where the
 * quotient overflows; the exponent alone with pow2), and thread 0 of block 0 writes 1 / scale.
 * Aligned inputs move in 16-byte vectors (8 bf16/fp16 or 4 fp32 elements, one 8- or 4-byte
 * store); the byte transpose moves 4 bytes per thread through 64 x 64 tiles where rows and
 * columns are multiples of 4. Other shapes take the element-wise kernels (the same results).
 * An amax is the NaN-propagating max of |x|: per block, then an integer atomicMax on the fp32
 * bits (non-negative floats order as their bits; a NaN's bits are above every number's). This
 * file calls no other file of the backend. */
#include "cuda_internal.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>

namespace {

constexpr int kThreads = 256;
constexpr int kTile = 32;

__device__ __forceinline__ float tpf_fp8__load(const void *x, int xt, uint64_t i) {
  if (xt == TPF_BF16) return __bfloat162float(static_cast<const __nv_bfloat16 *>(x)[i]);
  if (xt == TPF_FP16) return __half2float(static_cast<const __half *>(x)[i]);
  return static_cast<const float *>(x)[i];
}

__device__ __forceinline__ float tpf_fp8__max_nan(float a, float b) {
  return (b > a || b != b) ? b : a;
}

__device__ __forceinline__ unsigned char tpf_fp8__cvt(float v, int ot) {
  return static_cast<unsigned char>(
      __nv_cvt_float_to_fp8(v, __NV_SATFINITE, ot == TPF_FP8_E4M3 ? __NV_E4M3 : __NV_E5M2));
}

/* The scale of this cast (see the file comment). */
__device__ float tpf_fp8__scale(const tpf_cuda_fp8_cast_args &a) {
  if (a.scale) return *a.scale;
  float m = *a.amax;
  if (a.epsilon > 0.0f && m < a.epsilon) m = a.epsilon;
  float s = __fdiv_rn(a.fmax, m);
  if (s != s)
    s = 1.0f;
  else if (isinf(s))
    s = 3.402823466e38f;
  if (m == 0.0f || s == 0.0f) s = 1.0f;
  if (a.pow2) s = __int_as_float(__float_as_int(s) & (int)0xFF800000u);
  return s;
}

/* Folds this block's amax into *dst (all threads call it; v is the thread's amax). */
__device__ void tpf_fp8__block_amax(float v, float *dst) {
  __shared__ float warp_max[32];
  for (int o = 16; o > 0; o >>= 1)
    v = tpf_fp8__max_nan(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int tid = threadIdx.x + threadIdx.y * blockDim.x;
  const int nthreads = blockDim.x * blockDim.y;
  if ((tid & 31) == 0) warp_max[tid >> 5] = v;
  __syncthreads();
  if (tid == 0) {
    float m = 0.0f;
    for (int w = 0; w < (nthreads + 31) / 32; w++)
      m = tpf_fp8__max_nan(m, warp_max[w]);
    atomicMax(reinterpret_cast<int *>(dst), __float_as_int(m));
  }
}

__global__ void tpf_fp8__cast_kernel(tpf_cuda_fp8_cast_args a) {
  const float s = tpf_fp8__scale(a);
  if (blockIdx.x == 0 && threadIdx.x == 0 && a.scale_inv) *a.scale_inv = __frcp_rn(s);
  const uint64_t n = a.rows * a.cols;
  float m = 0.0f;
  unsigned char *out = static_cast<unsigned char *>(a.out);
  for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (uint64_t)gridDim.x * blockDim.x) {
    const float v = tpf_fp8__load(a.x, a.x_dtype, i);
    m = tpf_fp8__max_nan(m, fabsf(v));
    out[i] = tpf_fp8__cvt(__fmul_rn(v, s), a.out_dtype);
  }
  if (a.amax_record) tpf_fp8__block_amax(m, a.amax_record);
}

/* out_t[c, r] = cast(x[r, c]) through a 32 x 32 tile; blocks of 32 x 8 threads. */
__global__ void tpf_fp8__cast_t_kernel(tpf_cuda_fp8_cast_args a) {
  __shared__ unsigned char tile[kTile][kTile + 1];
  const float s = tpf_fp8__scale(a);
  if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0 && threadIdx.y == 0 && a.scale_inv)
    *a.scale_inv = __frcp_rn(s);
  const uint64_t r0 = (uint64_t)blockIdx.y * kTile, c0 = (uint64_t)blockIdx.x * kTile;
  float m = 0.0f;
  for (int k = threadIdx.y; k < kTile; k += blockDim.y) {
    const uint64_t r = r0 + k, c = c0 + threadIdx.x;
    if (r < a.rows && c < a.cols) {
      const float v = tpf_fp8__load(a.x, a.x_dtype, r * a.cols + c);
      m = tpf_fp8__max_nan(m, fabsf(v));
      tile[k][threadIdx.x] = tpf_fp8__cvt(__fmul_rn(v, s), a.out_dtype);
    }
  }
  __syncthreads();
  unsigned char *out = static_cast<unsigned char *>(a.out_t);
  for (int k = threadIdx.y; k < kTile; k += blockDim.y) {
    const uint64_t c = c0 + k, r = r0 + threadIdx.x;
    if (r < a.rows && c < a.cols) out[c * a.rows + r] = tile[threadIdx.x][k];
  }
  if (a.amax_record) tpf_fp8__block_amax(m, a.amax_record);
}

__global__ void tpf_fp8__amax_kernel(const void *x, int xt, uint64_t n, float *amax) {
  float m = 0.0f;
  for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (uint64_t)gridDim.x * blockDim.x)
    m = tpf_fp8__max_nan(m, fabsf(tpf_fp8__load(x, xt, i)));
  tpf_fp8__block_amax(m, amax);
}

__global__ void tpf_fp8__transpose_bytes_kernel(const unsigned char *src, uint64_t rows,
                                                uint64_t cols, unsigned char *dst) {
  __shared__ unsigned char tile[kTile][kTile + 1];
  const uint64_t r0 = (uint64_t)blockIdx.y * kTile, c0 = (uint64_t)blockIdx.x * kTile;
  for (int k = threadIdx.y; k < kTile; k += blockDim.y) {
    const uint64_t r = r0 + k, c = c0 + threadIdx.x;
    if (r < rows && c < cols) tile[k][threadIdx.x] = src[r * cols + c];
  }
  __syncthreads();
  for (int k = threadIdx.y; k < kTile; k += blockDim.y) {
    const uint64_t c = c0 + k, r = r0 + threadIdx.x;
    if (r < rows && c < cols) dst[c * rows + r] = tile[threadIdx.x][k];
  }
}

__device__ __forceinline__ float tpf_fp8__f(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
__device__ __forceinline__ float tpf_fp8__f(__half v) {
  return __half2float(v);
}
__device__ __forceinline__ float tpf_fp8__f(float v) {
  return v;
}

/* The cast of 16-byte vectors of x (V elements of T) into V-byte stores; the tail (n % V
 * elements) element by element. Launched when x is 16-byte and out V-byte aligned. */
template <typename T, int V> __global__ void tpf_fp8__cast_vec_kernel(tpf_cuda_fp8_cast_args a) {
  const float s = tpf_fp8__scale(a);
  if (blockIdx.x == 0 && threadIdx.x == 0 && a.scale_inv) *a.scale_inv = __frcp_rn(s);
  const uint64_t n = a.rows * a.cols, nv = n / V;
  const uint4 *xv = static_cast<const uint4 *>(a.x);
  unsigned char *out = static_cast<unsigned char *>(a.out);
  float m = 0.0f;
  const uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
  for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < nv; i += stride) {
    const uint4 raw = xv[i];
    const T *e = reinterpret_cast<const T *>(&raw);
    unsigned char o[V];
#pragma unroll
    for (int j = 0; j < V; j++) {
      const float v = tpf_fp8__f(e[j]);
      m = tpf_fp8__max_nan(m, fabsf(v));
      o[j] = tpf_fp8__cvt(__fmul_rn(v, s), a.out_dtype);
    }
    uint32_t w[V / 4];
#pragma unroll
    for (int j = 0; j < V / 4; j++)
      w[j] = (uint32_t)o[4 * j] | ((uint32_t)o[4 * j + 1] << 8) | ((uint32_t)o[4 * j + 2] << 16) |
             ((uint32_t)o[4 * j + 3] << 24);
    if (V == 8)
      *reinterpret_cast<uint2 *>(out + i * 8) = make_uint2(w[0], w[V / 4 - 1]);
    else
      *reinterpret_cast<uint32_t *>(out + i * 4) = w[0];
  }
  for (uint64_t i = nv * V + (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float v = tpf_fp8__load(a.x, a.x_dtype, i);
    m = tpf_fp8__max_nan(m, fabsf(v));
    out[i] = tpf_fp8__cvt(__fmul_rn(v, s), a.out_dtype);
  }
  if (a.amax_record) tpf_fp8__block_amax(m, a.amax_record);
}

/* The byte transpose in 64 x 64 tiles with 4-byte accesses (rows and cols multiples of 4, both
 * pointers 4-byte aligned): blocks of 16 x 16 threads, a thread moving 4 bytes per pass. */
__global__ void tpf_fp8__transpose_bytes_vec_kernel(const uint32_t *src, uint64_t rows,
                                                    uint64_t cols, uint32_t *dst) {
  __shared__ unsigned char tile[64][64 + 4];
  const uint64_t r0 = (uint64_t)blockIdx.y * 64, c0 = (uint64_t)blockIdx.x * 64;
  const int tx = threadIdx.x, ty = threadIdx.y;
  for (int k = ty; k < 64; k += 16) {
    const uint64_t r = r0 + k, c = c0 + 4 * tx;
    if (r < rows && c < cols) {
      const uint32_t v = src[(r * cols + c) >> 2];
      tile[k][4 * tx + 0] = (unsigned char)(v & 0xffu);
      tile[k][4 * tx + 1] = (unsigned char)((v >> 8) & 0xffu);
      tile[k][4 * tx + 2] = (unsigned char)((v >> 16) & 0xffu);
      tile[k][4 * tx + 3] = (unsigned char)(v >> 24);
    }
  }
  __syncthreads();
  for (int k = ty; k < 64; k += 16) {
    const uint64_t c = c0 + k, r = r0 + 4 * tx;
    if (c < cols && r < rows) {
      const uint32_t v = (uint32_t)tile[4 * tx][k] | ((uint32_t)tile[4 * tx + 1][k] << 8) |
                         ((uint32_t)tile[4 * tx + 2][k] << 16) |
                         ((uint32_t)tile[4 * tx + 3][k] << 24);
      dst[(c * rows + r) >> 2] = v;
    }
  }
}

unsigned tpf_fp8__grid(uint64_t n) {
  uint64_t b = (n + kThreads - 1) / kThreads;
  if (b > 4096) b = 4096; /* grid-stride beyond: enough blocks to fill any GPU */
  return b ? (unsigned)b : 1u;
}

/* Tiles in y (rows) are capped at CUDA's 65535; a larger tensor is refused by the caller. */
dim3 tpf_fp8__tiles(uint64_t rows, uint64_t cols) {
  return dim3((unsigned)((cols + kTile - 1) / kTile), (unsigned)((rows + kTile - 1) / kTile));
}

} // namespace

extern "C" cudaError_t tpf_cuda__launch_fp8_cast(const tpf_cuda_fp8_cast_args *a, cudaStream_t s) {
  tpf_cuda_fp8_cast_args k = *a;
  const uint64_t n = a->rows * a->cols;
  if (a->out || n == 0) {
    const uintptr_t xa = (uintptr_t)a->x, oa = (uintptr_t)a->out;
    if (a->x_dtype == TPF_FP32 && xa % 16 == 0 && oa % 4 == 0)
      tpf_fp8__cast_vec_kernel<float, 4><<<tpf_fp8__grid((n + 3) / 4), kThreads, 0, s>>>(k);
    else if (a->x_dtype == TPF_BF16 && xa % 16 == 0 && oa % 8 == 0)
      tpf_fp8__cast_vec_kernel<__nv_bfloat16, 8><<<tpf_fp8__grid((n + 7) / 8), kThreads, 0, s>>>(k);
    else if (a->x_dtype == TPF_FP16 && xa % 16 == 0 && oa % 8 == 0)
      tpf_fp8__cast_vec_kernel<__half, 8><<<tpf_fp8__grid((n + 7) / 8), kThreads, 0, s>>>(k);
    else
      tpf_fp8__cast_kernel<<<tpf_fp8__grid(n), kThreads, 0, s>>>(k);
    k.scale_inv = nullptr;   /* written once */
    k.amax_record = nullptr; /* recorded once */
  }
  if (a->out_t && n)
    tpf_fp8__cast_t_kernel<<<tpf_fp8__tiles(a->rows, a->cols), dim3(kTile, 8), 0, s>>>(k);
  return cudaGetLastError();
}

extern "C" cudaError_t tpf_cuda__launch_fp8_amax(const void *x, int xt, uint64_t n, float *amax,
                                                 cudaStream_t s) {
  if (n) tpf_fp8__amax_kernel<<<tpf_fp8__grid(n), kThreads, 0, s>>>(x, xt, n, amax);
  return cudaGetLastError();
}

extern "C" cudaError_t tpf_cuda__launch_transpose_bytes(const void *src, uint64_t rows,
                                                        uint64_t cols, void *dst, cudaStream_t s) {
  if (!rows || !cols) return cudaGetLastError();
  if (rows % 4 == 0 && cols % 4 == 0 && (uintptr_t)src % 4 == 0 && (uintptr_t)dst % 4 == 0)
    tpf_fp8__transpose_bytes_vec_kernel<<<
        dim3((unsigned)((cols + 63) / 64), (unsigned)((rows + 63) / 64)), dim3(16, 16), 0, s>>>(
        static_cast<const uint32_t *>(src), rows, cols, static_cast<uint32_t *>(dst));
  else
    tpf_fp8__transpose_bytes_kernel<<<tpf_fp8__tiles(rows, cols), dim3(kTile, 8), 0, s>>>(
        static_cast<const unsigned char *>(src), rows, cols, static_cast<unsigned char *>(dst));
  return cudaGetLastError();
}
