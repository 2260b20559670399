/* The bench's plain cuBLASLt matmul (CUDA builds only): row-major d[m, n] = x[m, k] w[n, k]^T,
 * bf16 in and out, fp32 accumulation, the heuristic's first algorithm for a 32 MiB workspace.
 * The baseline the GPU sections time tpflex's operations against: the tp section's whole-layer
 * GEMM and section 3's row chunks (bench_cuda_sections.c), the host section's same-shape matmul
 * (bench_host_cuda.c). */
#ifndef TPF_BENCH_LT_H
#define TPF_BENCH_LT_H

#include "tpflex/tpflex.h"

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <stdint.h>

typedef struct {
  cublasLtHandle_t h;
  void *ws;
  size_t ws_bytes;
} bench_lt;

/* One shape's descriptor, layouts and algorithm. */
typedef struct {
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t lw, lx, ld;
  cublasLtMatmulAlgo_t algo;
} bench_lt_plan;

/* A handle and its workspace on the current device; bench_lt_fini frees what was made, also after
 * a failed init. */
tpf_status bench_lt_init(bench_lt *lt);
void bench_lt_fini(bench_lt *lt);
/* The plan of one shape; on failure nothing is left to free (TPF_EBACKEND naming the shape). */
tpf_status bench_lt_plan_make(const bench_lt *lt, uint64_t m, uint64_t n, uint64_t k,
                              bench_lt_plan *p);
void bench_lt_plan_free(bench_lt_plan *p);
/* Enqueues d = x w^T on stream s. */
tpf_status bench_lt_exec(const bench_lt *lt, const bench_lt_plan *p, const void *x, const void *w,
                         void *d, cudaStream_t s);

#endif /* TPF_BENCH_LT_H */
