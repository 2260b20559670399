/* The bench's plain cuBLASLt matmul (bench_lt.h). CUDA builds only. */
#define _POSIX_C_SOURCE 200809L
#ifdef TPF_HAVE_CUDA

#include "bench_lt.h"
#include "tpflex/tpflex_backend.h" /* tpf_set_error */

#include <string.h>

static tpf_status lt_err(cublasStatus_t s, const char *what) {
  return tpf_set_error(TPF_EBACKEND, "%s: cuBLASLt status %d", what, (int)s);
}
#define BENCH_LT(call, what)                                                                       \
  do {                                                                                             \
    cublasStatus_t s_ = (call);                                                                    \
    if (s_ != CUBLAS_STATUS_SUCCESS) return lt_err(s_, what);                                      \
  } while (0)

tpf_status bench_lt_init(bench_lt *lt) {
  memset(lt, 0, sizeof(*lt));
  BENCH_LT(cublasLtCreate(&lt->h), "cublasLtCreate");
  lt->ws_bytes = 32u << 20;
  cudaError_t e = cudaMalloc(&lt->ws, lt->ws_bytes);
  if (e != cudaSuccess) {
    lt->ws = NULL;
    return tpf_set_error(TPF_EBACKEND, "cudaMalloc(matmul workspace of %zu bytes): %s",
                         lt->ws_bytes, cudaGetErrorString(e));
  }
  return TPF_OK;
}

void bench_lt_fini(bench_lt *lt) {
  if (lt->ws) cudaFree(lt->ws);
  if (lt->h) cublasLtDestroy(lt->h);
  memset(lt, 0, sizeof(*lt));
}

void bench_lt_plan_free(bench_lt_plan *p) {
  if (p->lw) cublasLtMatrixLayoutDestroy(p->lw);
  if (p->lx) cublasLtMatrixLayoutDestroy(p->lx);
  if (p->ld) cublasLtMatrixLayoutDestroy(p->ld);
  if (p->desc) cublasLtMatmulDescDestroy(p->desc);
  memset(p, 0, sizeof(*p));
}

/* Row-major d[m,n] = x[m,k] w[n,k]^T is column-major d^T[n,m] = (w as k x n)^T (x as k x m). */
static tpf_status plan_make(const bench_lt *lt, uint64_t m, uint64_t n, uint64_t k,
                            bench_lt_plan *p) {
  const cublasOperation_t opT = CUBLAS_OP_T, opN = CUBLAS_OP_N;
  BENCH_LT(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc");
  BENCH_LT(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opT, sizeof(opT)),
           "transa");
  BENCH_LT(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opN, sizeof(opN)),
           "transb");
  BENCH_LT(cublasLtMatrixLayoutCreate(&p->lw, CUDA_R_16BF, k, n, (int64_t)k), "layout w");
  BENCH_LT(cublasLtMatrixLayoutCreate(&p->lx, CUDA_R_16BF, k, m, (int64_t)k), "layout x");
  BENCH_LT(cublasLtMatrixLayoutCreate(&p->ld, CUDA_R_16BF, n, m, (int64_t)n), "layout d");
  cublasLtMatmulPreference_t pref;
  BENCH_LT(cublasLtMatmulPreferenceCreate(&pref), "preference");
  uint64_t ws = lt->ws_bytes;
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                       sizeof(ws));
  cublasLtMatmulHeuristicResult_t res;
  int found = 0;
  cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(lt->h, p->desc, p->lw, p->lx, p->ld, p->ld,
                                                    pref, 1, &res, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (s != CUBLAS_STATUS_SUCCESS || found < 1)
    return tpf_set_error(TPF_EBACKEND, "cuBLASLt has no algorithm for [%llu,%llu]x[%llu,%llu]^T",
                         (unsigned long long)m, (unsigned long long)k, (unsigned long long)n,
                         (unsigned long long)k);
  p->algo = res.algo;
  return TPF_OK;
}

tpf_status bench_lt_plan_make(const bench_lt *lt, uint64_t m, uint64_t n, uint64_t k,
                              bench_lt_plan *p) {
  memset(p, 0, sizeof(*p));
  tpf_status st = plan_make(lt, m, n, k, p);
  if (st != TPF_OK) bench_lt_plan_free(p);
  return st;
}

tpf_status bench_lt_exec(const bench_lt *lt, const bench_lt_plan *p, const void *x, const void *w,
                         void *d, cudaStream_t s) {
  const float one = 1.0f, zero = 0.0f;
  BENCH_LT(cublasLtMatmul(lt->h, p->desc, &one, w, p->lw, x, p->lx, &zero, d, p->ld, d, p->ld,
                          &p->algo, lt->ws, lt->ws_bytes, s),
           "cublasLtMatmul");
  return TPF_OK;
}

#else
typedef int bench_lt_needs_cuda; /* ISO C: a translation unit declares something */
#endif
