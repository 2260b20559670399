/* Translation of cudaError_t, cublasStatus_t and ncclResult_t into tpf_status (cuda_error.h).
 * The tables list the native codes that mean something other than "the backend failed"; every
 * code not listed is TPF_EBACKEND. The detail keeps the native text, so nothing is lost by the
 * coarser status. */
#include "cuda_error.h"

#include "tpflex/tpflex_backend.h"

#include <stddef.h>

typedef struct {
  int code;
  tpf_status status;
} tpf_cuda_err_map;

static const tpf_cuda_err_map tpf_cuda__cuda_map[] = {
    {(int)cudaErrorMemoryAllocation, TPF_ENOMEM},
};
static const tpf_cuda_err_map tpf_cuda__lt_map[] = {
    {(int)CUBLAS_STATUS_ALLOC_FAILED, TPF_ENOMEM},
};

static tpf_status tpf_cuda__map(const tpf_cuda_err_map *m, size_t n, int code) {
  for (size_t i = 0; i < n; i++)
    if (m[i].code == code) return m[i].status;
  return TPF_EBACKEND;
}

tpf_status tpf_cuda__status_of_cuda(cudaError_t e) {
  if (e == cudaSuccess) return TPF_OK;
  return tpf_cuda__map(tpf_cuda__cuda_map, sizeof tpf_cuda__cuda_map / sizeof tpf_cuda__cuda_map[0],
                       (int)e);
}

tpf_status tpf_cuda__status_of_lt(cublasStatus_t st) {
  if (st == CUBLAS_STATUS_SUCCESS) return TPF_OK;
  return tpf_cuda__map(tpf_cuda__lt_map, sizeof tpf_cuda__lt_map / sizeof tpf_cuda__lt_map[0],
                       (int)st);
}

tpf_status tpf_cuda__status_of_nccl(ncclResult_t r) {
  /* NCCL has no out-of-memory code of its own (it reports ncclSystemError or a CUDA error). */
  return r == ncclSuccess ? TPF_OK : TPF_EBACKEND;
}

tpf_status tpf_cuda__err(cudaError_t e, const char *what) {
  /* The runtime also keeps e as the thread's last error, which the next kernel launch's check
   * (cudaGetLastError, cuda_kernels.cu) would report as its own: it is reported here, so take it.
   * A sticky error (a lost context) stays: every later call returns it anyway. */
  (void)cudaGetLastError();
  return tpf_set_error(tpf_cuda__status_of_cuda(e), "CUDA %s failed: %s (%s)", what,
                       cudaGetErrorString(e), cudaGetErrorName(e));
}

tpf_status tpf_cuda__lt_err(cublasStatus_t st, const char *what) {
  return tpf_set_error(tpf_cuda__status_of_lt(st), "cuBLASLt %s failed: %s (%d)", what,
                       cublasLtGetStatusString(st), (int)st);
}

tpf_status tpf_cuda__nccl_err(ncclResult_t r, const char *what) {
  return tpf_set_error(tpf_cuda__status_of_nccl(r), "NCCL %s failed: %s (%d)", what,
                       ncclGetErrorString(r), (int)r);
}
