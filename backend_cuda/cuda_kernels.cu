/* Device code of the CUDA backend: the 1-thread flag kernels (HANDSHAKE, SEND signal, RECV,
 * BARRIER), the reduction kernel of REDUCE and PEER_REDUCE, and the bounded-grid copy of the
 * bulk collective.
 *
 * Method: flags are monotonic 64-bit words with exactly one writer each (see cuda_internal.h).
 * A signal is a system-scope release store of the operation's sequence number, issued after
 * __threadfence_system(), once per message: the receiver waits for `flag >= seq`, so a message is
 * never counted twice and a skipped operation cannot leave a counter drifting (TE's per-block
 * adder of te-userbuffers §7.2 is the bug this avoids). Waits are acquire loads bounded by
 * %globaltimer; the first wait that fails records the reason in the host-mapped status area, and
 * every later kernel of the backend sees the code and returns without touching memory. Copy
 * engine transfers (cudaMemcpyAsync) cannot see that code and still run: a known limitation,
 * documented in cuda_status.c (Failures). Everything a kernel needs comes in its arguments: this
 * file calls no other file of the backend.
 *
 * Reductions accumulate in fp32 and round once to the output dtype. They move 16-byte vectors
 * when every row start of every view is 16-byte aligned and a row is a whole number of vectors,
 * and fall back to scalar accesses otherwise. A reduction flagged with the epilogue (it writes
 * the operation's output D) applies it to the fp32 sum before that one rounding:
 * act(alpha * sum + beta * D_old + bias[j]), D_old read from the destination only when beta != 0,
 * the bias (D's dtype) read with scalar loads since a column block's bias need not be 16-byte
 * aligned. Without the flag the kernels store the sum exactly as in 0.1.
 *
 * The fallback GEMM (cuBLASLt has no algorithm for a call) does the same math as the cuBLASLt
 * path: the step's transposes (tiles are loaded along the stored matrix's contiguous dimension
 * either way) and the same epilogue.
 */
#include "cuda_internal.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#include <string.h>

namespace {

__device__ __forceinline__ uint64_t tpf_cuda__now_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ uint64_t tpf_cuda__ld_acquire(const uint64_t *p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void tpf_cuda__st_release(uint64_t *p, uint64_t v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ uint32_t tpf_cuda__status_code(const tpf_cuda_status *st) {
  return st->code;
}

/* Records the first failure of this backend; later failures keep the first one's details. */
__device__ void tpf_cuda__fail(const tpf_cuda_flag_args &a, uint32_t code, int peer, uint64_t mine,
                               uint64_t theirs, const void *addr) {
  if (atomicCAS(a.claim, 0u, 1u) != 0u) return;
  tpf_cuda_status *st = a.status;
  st->kind = a.kind;
  st->peer = peer;
  st->tag = a.tag;
  st->seq = a.seq;
  st->mine = mine;
  st->theirs = theirs;
  st->addr = (uint64_t)(uintptr_t)addr;
  __threadfence_system();
  st->code = code;
  __threadfence_system();
}

/* One thread: store into every remote word, then wait on every local word. */
__global__ void tpf_cuda__flag_kernel(tpf_cuda_flag_args a) {
  if (tpf_cuda__status_code(a.status) != TPF_CUDA_DEV_OK) return;
  if (a.dev_seq != nullptr) { /* a captured operation: this execution's sequence number */
    a.seq = *(const volatile uint64_t *)a.dev_seq;
    if (a.handshake) {
      a.store_value = TPF_READY_WORD(a.seq, 0, 0) | a.rows;
      a.wait_value = a.seq & TPF_READY_SEQ_MASK;
      const unsigned par = (unsigned)(a.seq & 1u);
      for (int q = 0; q < a.nranks; q++) {
        if (a.remote[q] != nullptr) a.remote[q] += par;
        if (a.local[q] != nullptr) a.local[q] += par;
      }
    } else {
      a.store_value = a.seq;
      a.wait_value = a.seq;
    }
  }
  /* Make this stream's earlier writes (kernel outputs, completed copies) visible system-wide
   * before any peer can observe the flag. */
  __threadfence_system();
  for (int q = 0; q < a.nranks; q++)
    if (a.remote[q] != nullptr) tpf_cuda__st_release(a.remote[q], a.store_value);
  const uint64_t start = tpf_cuda__now_ns();
  unsigned spins = 0;
  for (int q = 0; q < a.nranks; q++) {
    const uint64_t *w = a.local[q];
    if (w == nullptr) continue;
    for (;;) {
      const uint64_t v = tpf_cuda__ld_acquire(w);
      if (a.handshake) {
        if (TPF_READY_SEQ(v) == a.wait_value) {
          if (TPF_READY_BODY(v) != a.rows) {
            tpf_cuda__fail(a, TPF_CUDA_DEV_MISMATCH, q, a.rows, TPF_READY_BODY(v), w);
            return;
          }
          break;
        }
      } else if (v >= a.wait_value) {
        break;
      }
      if ((++spins & 255u) == 0u) {
        /* Another wait of this backend failed: give up quietly, the first reason stands. */
        if (tpf_cuda__status_code(a.status) != TPF_CUDA_DEV_OK) return;
        if (tpf_cuda__now_ns() - start > a.timeout_ns) {
          tpf_cuda__fail(a, TPF_CUDA_DEV_TIMEOUT, q, a.wait_value, v, w);
          return;
        }
      }
      __nanosleep(64);
    }
  }
}

/* ---- reductions ---- */

template <typename T> struct tpf_cuda__elem;
template <> struct tpf_cuda__elem<float> {
  static __device__ __forceinline__ float load(float v) {
    return v;
  }
  static __device__ __forceinline__ float store(float v) {
    return v;
  }
};
template <> struct tpf_cuda__elem<__nv_bfloat16> {
  static __device__ __forceinline__ float load(__nv_bfloat16 v) {
    return __bfloat162float(v);
  }
  static __device__ __forceinline__ __nv_bfloat16 store(float v) {
    return __float2bfloat16_rn(v);
  }
};
template <> struct tpf_cuda__elem<__half> {
  static __device__ __forceinline__ float load(__half v) {
    return __half2float(v);
  }
  static __device__ __forceinline__ __half store(float v) {
    return __float2half_rn(v);
  }
};

/* The epilogue's activation, tpf_gelu's formula (core/dtype.c): tanh GELU, as cuBLASLt's. */
__device__ __forceinline__ float tpf_cuda__gelu(float x) {
  const float u = 0.7978845608f * (x + 0.044715f * x * x * x);
  return 0.5f * x * (1.0f + tanhf(u));
}

/* act(alpha * v + beta * old + bias) in the simulator's order (backend_sim/sim_math.c): the beta
 * and bias terms are only added when present, so that e.g. -0.0 stays -0.0 without them. */
__device__ __forceinline__ float tpf_cuda__epi_apply(const tpf_cuda_epi &e, float v, float old,
                                                     float bias) {
  float x = e.alpha * v;
  if (e.beta != 0.0f) x += e.beta * old;
  if (e.bias != nullptr) x += bias;
  return e.gelu ? tpf_cuda__gelu(x) : x;
}

/* The epilogue of element (i, j) of a D of type Tout: old value read only when beta != 0. */
template <typename Tout>
__device__ __forceinline__ float tpf_cuda__epi_elem(const tpf_cuda_epi &e, float v, const Tout *dij,
                                                    uint64_t j) {
  const float old = e.beta != 0.0f ? tpf_cuda__elem<Tout>::load(*dij) : 0.0f;
  const float bias =
      e.bias != nullptr ? tpf_cuda__elem<Tout>::load(static_cast<const Tout *>(e.bias)[j]) : 0.0f;
  return tpf_cuda__epi_apply(e, v, old, bias);
}

/* Vector path: VEC = 16 / sizeof(Tin) elements per unit; one 16-byte load per source and unit,
 * sizeof(Tout) * VEC bytes stored (16 or 32: whole uint4 stores). */
template <typename Tin, typename Tout>
__global__ void tpf_cuda__reduce_vec_kernel(tpf_cuda_reduce_args a, const tpf_cuda_status *st) {
  __shared__ uint32_t skip;
  if (threadIdx.x == 0) skip = tpf_cuda__status_code(st);
  __syncthreads();
  if (skip != TPF_CUDA_DEV_OK) return;
  constexpr int VEC = 16 / sizeof(Tin);
  constexpr int OUT_U4 = (int)(sizeof(Tout) * VEC / 16);
  const uint64_t upr = a.cols / VEC;
  const uint64_t units = a.rows * upr;
  for (uint64_t u = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; u < units;
       u += (uint64_t)gridDim.x * blockDim.x) {
    const uint64_t i = u / upr, j = (u % upr) * VEC;
    float acc[VEC];
#pragma unroll
    for (int e = 0; e < VEC; e++)
      acc[e] = 0.0f;
    const uint64_t soff = i * a.src_ld + j;
    for (int t = 0; t < a.count; t++) {
      union {
        uint4 v;
        Tin x[VEC];
      } in;
      in.v = *reinterpret_cast<const uint4 *>(static_cast<const Tin *>(a.srcs[t]) + soff);
#pragma unroll
      for (int e = 0; e < VEC; e++)
        acc[e] += tpf_cuda__elem<Tin>::load(in.x[e]);
    }
    union {
      uint4 v[OUT_U4];
      Tout x[VEC];
    } out;
    uint4 *d = reinterpret_cast<uint4 *>(static_cast<Tout *>(a.dst) + i * a.dst_ld + j);
    if (a.epi.on) {
      /* The old values of D (beta != 0) come in as whole vectors, like the store. */
      if (a.epi.beta != 0.0f) {
#pragma unroll
        for (int e = 0; e < OUT_U4; e++)
          out.v[e] = d[e];
      }
#pragma unroll
      for (int e = 0; e < VEC; e++)
        acc[e] = tpf_cuda__epi_elem<Tout>(a.epi, acc[e], &out.x[e], j + (uint64_t)e);
    }
#pragma unroll
    for (int e = 0; e < VEC; e++)
      out.x[e] = tpf_cuda__elem<Tout>::store(acc[e]);
#pragma unroll
    for (int e = 0; e < OUT_U4; e++)
      d[e] = out.v[e];
  }
}

template <typename Tin, typename Tout>
__global__ void tpf_cuda__reduce_scalar_kernel(tpf_cuda_reduce_args a, const tpf_cuda_status *st) {
  __shared__ uint32_t skip;
  if (threadIdx.x == 0) skip = tpf_cuda__status_code(st);
  __syncthreads();
  if (skip != TPF_CUDA_DEV_OK) return;
  const uint64_t n = a.rows * a.cols;
  for (uint64_t u = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; u < n;
       u += (uint64_t)gridDim.x * blockDim.x) {
    const uint64_t i = u / a.cols, j = u % a.cols;
    float acc = 0.0f;
    for (int t = 0; t < a.count; t++)
      acc += tpf_cuda__elem<Tin>::load(static_cast<const Tin *>(a.srcs[t])[i * a.src_ld + j]);
    Tout *dij = static_cast<Tout *>(a.dst) + i * a.dst_ld + j;
    if (a.epi.on) acc = tpf_cuda__epi_elem<Tout>(a.epi, acc, dij, j);
    *dij = tpf_cuda__elem<Tout>::store(acc);
  }
}

__global__ void tpf_cuda__copy_kernel(uint4 *dst, const uint4 *src, uint64_t n16,
                                      unsigned char *dtail, const unsigned char *stail,
                                      uint64_t ntail, const tpf_cuda_status *st) {
  __shared__ uint32_t skip;
  if (threadIdx.x == 0) skip = tpf_cuda__status_code(st);
  __syncthreads();
  if (skip != TPF_CUDA_DEV_OK) return;
  const uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
  const uint64_t first = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
  for (uint64_t u = first; u < n16; u += stride)
    dst[u] = src[u];
  for (uint64_t u = first; u < ntail; u += stride)
    dtail[u] = stail[u];
}

constexpr int kThreads = 512;

bool tpf_cuda__aligned16(const void *p) {
  return ((uintptr_t)p & 15u) == 0;
}

int tpf_cuda__grid(uint64_t work, int ctas) {
  uint64_t g = (work + kThreads - 1) / kThreads;
  if (g < 1) g = 1;
  if (g > (uint64_t)ctas) g = (uint64_t)ctas;
  return (int)g;
}

template <typename Tin, typename Tout>
cudaError_t tpf_cuda__reduce_typed(const tpf_cuda_reduce_args &a, tpf_cuda_status *st, int ctas,
                                   cudaStream_t s) {
  constexpr int VEC = 16 / sizeof(Tin);
  /* The vector path stores whole uint4s: VEC outputs must fill them (fp32 in, 16-bit out has 8
   * bytes per unit, so the scalar path serves it: it stored nothing before this check). */
  constexpr bool whole_out = (sizeof(Tout) * VEC) % 16 == 0;
  bool vec = whole_out && (a.cols % VEC) == 0 && ((a.src_ld * sizeof(Tin)) % 16) == 0 &&
             ((a.dst_ld * sizeof(Tout)) % 16) == 0 && tpf_cuda__aligned16(a.dst);
  for (int t = 0; vec && t < a.count; t++)
    vec = tpf_cuda__aligned16(a.srcs[t]);
  if (vec) {
    tpf_cuda__reduce_vec_kernel<Tin, Tout>
        <<<tpf_cuda__grid(a.rows * (a.cols / VEC), ctas), kThreads, 0, s>>>(a, st);
  } else {
    tpf_cuda__reduce_scalar_kernel<Tin, Tout>
        <<<tpf_cuda__grid(a.rows * a.cols, ctas), kThreads, 0, s>>>(a, st);
  }
  return cudaGetLastError();
}

template <typename Tin>
cudaError_t tpf_cuda__reduce_out(const tpf_cuda_reduce_args &a, tpf_cuda_status *st, int ctas,
                                 cudaStream_t s) {
  switch (a.dst_dtype) {
  case TPF_BF16:
    return tpf_cuda__reduce_typed<Tin, __nv_bfloat16>(a, st, ctas, s);
  case TPF_FP16:
    return tpf_cuda__reduce_typed<Tin, __half>(a, st, ctas, s);
  case TPF_FP32:
    return tpf_cuda__reduce_typed<Tin, float>(a, st, ctas, s);
  default:
    return cudaErrorInvalidValue;
  }
}

} // namespace

extern "C" cudaError_t tpf_cuda__launch_flags(const tpf_cuda_flag_args *a, cudaStream_t s) {
  tpf_cuda__flag_kernel<<<1, 1, 0, s>>>(*a);
  return cudaGetLastError();
}

__global__ void tpf_cuda__seq_bump_kernel(uint64_t *counter) {
  *(volatile uint64_t *)counter = *(volatile uint64_t *)counter + 1u;
}

extern "C" cudaError_t tpf_cuda__launch_seq_bump(uint64_t *counter, cudaStream_t s) {
  tpf_cuda__seq_bump_kernel<<<1, 1, 0, s>>>(counter);
  return cudaGetLastError();
}

extern "C" cudaError_t tpf_cuda__launch_reduce(const tpf_cuda_reduce_args *a,
                                               tpf_cuda_status *status, int ctas, cudaStream_t s) {
  if (a->rows == 0 || a->cols == 0) return cudaSuccess;
  switch (a->src_dtype) {
  case TPF_BF16:
    return tpf_cuda__reduce_out<__nv_bfloat16>(*a, status, ctas, s);
  case TPF_FP16:
    return tpf_cuda__reduce_out<__half>(*a, status, ctas, s);
  case TPF_FP32:
    return tpf_cuda__reduce_out<float>(*a, status, ctas, s);
  default:
    return cudaErrorInvalidValue;
  }
}

extern "C" cudaError_t tpf_cuda__launch_copy(void *dst, const void *src, uint64_t bytes,
                                             tpf_cuda_status *status, int ctas, cudaStream_t s) {
  if (bytes == 0) return cudaSuccess;
  uint64_t n16 = 0;
  if (tpf_cuda__aligned16(dst) && tpf_cuda__aligned16(src)) n16 = bytes / 16;
  const uint64_t head = n16 * 16;
  tpf_cuda__copy_kernel<<<tpf_cuda__grid(n16 > 0 ? n16 : bytes, ctas), kThreads, 0, s>>>(
      static_cast<uint4 *>(dst), static_cast<const uint4 *>(src), n16,
      static_cast<unsigned char *>(dst) + head, static_cast<const unsigned char *>(src) + head,
      bytes - head, status);
  return cudaGetLastError();
}

/* ---- fallback GEMM ----
 * Used only when cuBLASLt has no algorithm for a call (for instance a chunk of D whose rows start
 * at an address aligned to less than the heuristic supports), or for every GEMM under
 * TPF_CUDA_GEMM_FALLBACK. One thread per output element, operands staged through shared-memory
 * tiles; fp32 accumulation in k order, the epilogue, one rounding. A tile of a transposed operand
 * is loaded with threadIdx.x along its stored rows, so loads stay coalesced either way; the
 * tiles' contents, and so the arithmetic, do not depend on the flags. */
namespace {

constexpr int kTile = 16;

template <typename Tin, typename Tout>
__global__ void tpf_cuda__gemm_fallback_kernel(const Tin *a, uint64_t lda, const Tin *w,
                                               uint64_t ldw, Tout *d, uint64_t ldd, uint64_t m,
                                               uint64_t n, uint64_t k, int ta, int tw,
                                               tpf_cuda_epi e) {
  __shared__ float as[kTile][kTile + 1]; /* as[r][c] = op(a)(i0 + r, k0 + c) */
  __shared__ float ws[kTile][kTile + 1]; /* ws[r][c] = w(j0 + r, k0 + c), w [n, k] as used */
  const uint64_t i0 = (uint64_t)blockIdx.y * kTile, j0 = (uint64_t)blockIdx.x * kTile;
  const uint64_t i = i0 + threadIdx.y;
  const uint64_t j = j0 + threadIdx.x;
  float acc = 0.0f;
  for (uint64_t k0 = 0; k0 < k; k0 += kTile) {
    if (!ta) { /* a stored [m, k] */
      const uint64_t r = i0 + threadIdx.y, c = k0 + threadIdx.x;
      as[threadIdx.y][threadIdx.x] =
          (r < m && c < k) ? tpf_cuda__elem<Tin>::load(a[r * lda + c]) : 0.0f;
    } else { /* a stored [k, m] */
      const uint64_t r = i0 + threadIdx.x, c = k0 + threadIdx.y;
      as[threadIdx.x][threadIdx.y] =
          (r < m && c < k) ? tpf_cuda__elem<Tin>::load(a[c * lda + r]) : 0.0f;
    }
    if (!tw) { /* w stored [n, k] */
      const uint64_t r = j0 + threadIdx.y, c = k0 + threadIdx.x;
      ws[threadIdx.y][threadIdx.x] =
          (r < n && c < k) ? tpf_cuda__elem<Tin>::load(w[r * ldw + c]) : 0.0f;
    } else { /* w stored [k, n] */
      const uint64_t r = j0 + threadIdx.x, c = k0 + threadIdx.y;
      ws[threadIdx.x][threadIdx.y] =
          (r < n && c < k) ? tpf_cuda__elem<Tin>::load(w[c * ldw + r]) : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int t = 0; t < kTile; t++)
      acc += as[threadIdx.y][t] * ws[threadIdx.x][t];
    __syncthreads();
  }
  if (i < m && j < n) {
    Tout *dij = d + i * ldd + j;
    if (e.on) acc = tpf_cuda__epi_elem<Tout>(e, acc, dij, j);
    *dij = tpf_cuda__elem<Tout>::store(acc);
  }
}

template <typename Tin, typename Tout>
cudaError_t tpf_cuda__gemm_fallback_typed(const void *a, uint64_t lda, const void *w, uint64_t ldw,
                                          void *d, uint64_t ldd, uint64_t m, uint64_t n, uint64_t k,
                                          int ta, int tw, const tpf_cuda_epi &e, cudaStream_t s) {
  const dim3 block(kTile, kTile);
  const dim3 grid((unsigned)((n + kTile - 1) / kTile), (unsigned)((m + kTile - 1) / kTile));
  tpf_cuda__gemm_fallback_kernel<Tin, Tout>
      <<<grid, block, 0, s>>>(static_cast<const Tin *>(a), lda, static_cast<const Tin *>(w), ldw,
                              static_cast<Tout *>(d), ldd, m, n, k, ta, tw, e);
  return cudaGetLastError();
}

} // namespace

extern "C" cudaError_t tpf_cuda__launch_gemm_fallback(const void *a, int at, uint64_t lda,
                                                      const void *w, uint64_t ldw, void *d, int dt,
                                                      uint64_t ldd, uint64_t m, uint64_t n,
                                                      uint64_t k, unsigned flags,
                                                      const tpf_cuda_epi *e, cudaStream_t s) {
  if ((m + kTile - 1) / kTile > 65535u) return cudaErrorInvalidConfiguration;
  const int ta = (flags & TPF_STEP_TRANS_A) != 0, tw = (flags & TPF_STEP_TRANS_W) != 0;
  tpf_cuda_epi ep;
  memset(&ep, 0, sizeof(ep));
  if (e != nullptr && e->on) ep = *e;
  switch (at * 8 + dt) {
  case TPF_BF16 * 8 + TPF_BF16:
    return tpf_cuda__gemm_fallback_typed<__nv_bfloat16, __nv_bfloat16>(a, lda, w, ldw, d, ldd, m, n,
                                                                       k, ta, tw, ep, s);
  case TPF_BF16 * 8 + TPF_FP32:
    return tpf_cuda__gemm_fallback_typed<__nv_bfloat16, float>(a, lda, w, ldw, d, ldd, m, n, k, ta,
                                                               tw, ep, s);
  case TPF_FP16 * 8 + TPF_FP16:
    return tpf_cuda__gemm_fallback_typed<__half, __half>(a, lda, w, ldw, d, ldd, m, n, k, ta, tw,
                                                         ep, s);
  case TPF_FP16 * 8 + TPF_FP32:
    return tpf_cuda__gemm_fallback_typed<__half, float>(a, lda, w, ldw, d, ldd, m, n, k, ta, tw, ep,
                                                        s);
  case TPF_FP32 * 8 + TPF_FP32:
    return tpf_cuda__gemm_fallback_typed<float, float>(a, lda, w, ldw, d, ldd, m, n, k, ta, tw, ep,
                                                       s);
  default:
    return cudaErrorInvalidValue;
  }
}
