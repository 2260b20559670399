/* Translation of foreign errors at the CUDA backend's edge (STYLE.md, Errors): the CUDA runtime's
 * cudaError_t, cuBLASLt's cublasStatus_t and NCCL's ncclResult_t become a tpf_status with a
 * detail for tpf_last_error() that names the failing call and keeps the native text:
 *   "CUDA <what> failed: <cudaGetErrorString> (<cudaGetErrorName>)"
 *   "cuBLASLt <what> failed: <cublasLtGetStatusString> (<code>)"
 *   "NCCL <what> failed: <ncclGetErrorString> (<code>)"
 * Which tpf_status a native code becomes is one table per library (cuda_error.c): out of memory
 * is TPF_ENOMEM (SPEC: "out of memory, host or device"), every other failure TPF_EBACKEND.
 *
 * One macro set propagates them, like TPF_CHECK / TPF_CHECK_GOTO (tpflex_backend_support.h):
 * TPF_CUDA_TRY, TPF_LT_TRY and TPF_NCCL_TRY return the translated status; the _GOTO forms store
 * it in rc and jump to a cleanup label. A leaf of the backend's call graph (cuda_backend.c): it
 * calls no other file of backend_cuda/. */
#ifndef TPF_CUDA_ERROR_H
#define TPF_CUDA_ERROR_H

#include "tpflex/tpflex_backend_support.h" /* TPF_CHECK, TPF_CHECK_GOTO */

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <nccl.h>

/* The tpf_status a native failure code maps to (TPF_OK for the library's success code). */
tpf_status tpf_cuda__status_of_cuda(cudaError_t e);
tpf_status tpf_cuda__status_of_lt(cublasStatus_t st);
tpf_status tpf_cuda__status_of_nccl(ncclResult_t r);

/* Record the detail of a failed call `what` and return its status (see the file comment). The
 * code must not be the success code. */
tpf_status tpf_cuda__err(cudaError_t e, const char *what);
tpf_status tpf_cuda__lt_err(cublasStatus_t st, const char *what);
tpf_status tpf_cuda__nccl_err(ncclResult_t r, const char *what);

#define TPF_CUDA_TRY(call, what)                                                                   \
  do {                                                                                             \
    cudaError_t tpf_cuda_e_ = (call);                                                              \
    if (tpf_cuda_e_ != cudaSuccess) return tpf_cuda__err(tpf_cuda_e_, what);                       \
  } while (0)
#define TPF_CUDA_TRY_GOTO(call, what, rc, label)                                                   \
  do {                                                                                             \
    cudaError_t tpf_cuda_e_ = (call);                                                              \
    if (tpf_cuda_e_ != cudaSuccess) {                                                              \
      (rc) = tpf_cuda__err(tpf_cuda_e_, what);                                                     \
      goto label;                                                                                  \
    }                                                                                              \
  } while (0)
#define TPF_LT_TRY(call, what)                                                                     \
  do {                                                                                             \
    cublasStatus_t tpf_lt_st_ = (call);                                                            \
    if (tpf_lt_st_ != CUBLAS_STATUS_SUCCESS) return tpf_cuda__lt_err(tpf_lt_st_, what);            \
  } while (0)
#define TPF_LT_TRY_GOTO(call, what, rc, label)                                                     \
  do {                                                                                             \
    cublasStatus_t tpf_lt_st_ = (call);                                                            \
    if (tpf_lt_st_ != CUBLAS_STATUS_SUCCESS) {                                                     \
      (rc) = tpf_cuda__lt_err(tpf_lt_st_, what);                                                   \
      goto label;                                                                                  \
    }                                                                                              \
  } while (0)
#define TPF_NCCL_TRY(call, what)                                                                   \
  do {                                                                                             \
    ncclResult_t tpf_nccl_r_ = (call);                                                             \
    if (tpf_nccl_r_ != ncclSuccess) return tpf_cuda__nccl_err(tpf_nccl_r_, what);                  \
  } while (0)
#define TPF_NCCL_TRY_GOTO(call, what, rc, label)                                                   \
  do {                                                                                             \
    ncclResult_t tpf_nccl_r_ = (call);                                                             \
    if (tpf_nccl_r_ != ncclSuccess) {                                                              \
      (rc) = tpf_cuda__nccl_err(tpf_nccl_r_, what);                                                \
      goto label;                                                                                  \
    }                                                                                              \
  } while (0)

#endif /* TPF_CUDA_ERROR_H */
