/* The CUDA backend's translation of foreign errors (backend_cuda/cuda_error.c), without a GPU:
 * every table entry and a sample of unlisted codes map onto the documented tpf_status, the
 * detail names the failing call and keeps the library's own text and code, and the macro set
 * returns (TPF_*_TRY) or jumps to its cleanup label with rc set (TPF_*_TRY_GOTO). The native
 * strings come from the libraries themselves (cudaGetErrorString, cublasLtGetStatusString,
 * ncclGetErrorString need no device), so the test does not depend on their wording. */
#include "cuda_error.h"
#include "tpf_test.h"

static void expect_detail(const char *prefix, const char *native, const char *code) {
  const char *msg = tpf_last_error();
  if (strncmp(msg, prefix, strlen(prefix)) != 0) fail_msg("detail '%s' lacks '%s'", msg, prefix);
  if (strstr(msg, native) == NULL) fail_msg("detail '%s' lacks the native text '%s'", msg, native);
  if (strstr(msg, code) == NULL) fail_msg("detail '%s' lacks the code '%s'", msg, code);
}

static void test_cuda_error__cuda_codes(void **state) {
  (void)state;
  assert_int_equal(tpf_cuda__status_of_cuda(cudaSuccess), TPF_OK);
  assert_int_equal(tpf_cuda__status_of_cuda(cudaErrorMemoryAllocation), TPF_ENOMEM);
  const cudaError_t backend[] = {cudaErrorInvalidValue,   cudaErrorNoDevice,
                                 cudaErrorInvalidDevice,  cudaErrorLaunchFailure,
                                 cudaErrorIllegalAddress, cudaErrorPeerAccessUnsupported,
                                 cudaErrorNotReady};
  for (size_t i = 0; i < sizeof backend / sizeof backend[0]; i++)
    assert_int_equal(tpf_cuda__status_of_cuda(backend[i]), TPF_EBACKEND);

  assert_int_equal(tpf_cuda__err(cudaErrorMemoryAllocation, "cudaMalloc(claim)"), TPF_ENOMEM);
  expect_detail("CUDA cudaMalloc(claim) failed: ", cudaGetErrorString(cudaErrorMemoryAllocation),
                "(cudaErrorMemoryAllocation)");
  assert_int_equal(tpf_cuda__err(cudaErrorInvalidValue, "cudaMemcpyAsync(send)"), TPF_EBACKEND);
  expect_detail("CUDA cudaMemcpyAsync(send) failed: ", cudaGetErrorString(cudaErrorInvalidValue),
                "(cudaErrorInvalidValue)");
}

static void test_cuda_error__cublaslt_codes(void **state) {
  (void)state;
  assert_int_equal(tpf_cuda__status_of_lt(CUBLAS_STATUS_SUCCESS), TPF_OK);
  assert_int_equal(tpf_cuda__status_of_lt(CUBLAS_STATUS_ALLOC_FAILED), TPF_ENOMEM);
  const cublasStatus_t backend[] = {CUBLAS_STATUS_NOT_INITIALIZED, CUBLAS_STATUS_INVALID_VALUE,
                                    CUBLAS_STATUS_ARCH_MISMATCH,   CUBLAS_STATUS_EXECUTION_FAILED,
                                    CUBLAS_STATUS_INTERNAL_ERROR,  CUBLAS_STATUS_NOT_SUPPORTED};
  for (size_t i = 0; i < sizeof backend / sizeof backend[0]; i++)
    assert_int_equal(tpf_cuda__status_of_lt(backend[i]), TPF_EBACKEND);

  char code[32];
  assert_int_equal(tpf_cuda__lt_err(CUBLAS_STATUS_ALLOC_FAILED, "cublasLtCreate"), TPF_ENOMEM);
  snprintf(code, sizeof code, "(%d)", (int)CUBLAS_STATUS_ALLOC_FAILED);
  expect_detail("cuBLASLt cublasLtCreate failed: ",
                cublasLtGetStatusString(CUBLAS_STATUS_ALLOC_FAILED), code);
  assert_int_equal(tpf_cuda__lt_err(CUBLAS_STATUS_NOT_SUPPORTED, "cublasLtMatmul"), TPF_EBACKEND);
  snprintf(code, sizeof code, "(%d)", (int)CUBLAS_STATUS_NOT_SUPPORTED);
  expect_detail("cuBLASLt cublasLtMatmul failed: ",
                cublasLtGetStatusString(CUBLAS_STATUS_NOT_SUPPORTED), code);
}

static void test_cuda_error__nccl_codes(void **state) {
  (void)state;
  assert_int_equal(tpf_cuda__status_of_nccl(ncclSuccess), TPF_OK);
  const ncclResult_t backend[] = {ncclUnhandledCudaError, ncclSystemError,  ncclInternalError,
                                  ncclInvalidArgument,    ncclInvalidUsage, ncclRemoteError};
  for (size_t i = 0; i < sizeof backend / sizeof backend[0]; i++)
    assert_int_equal(tpf_cuda__status_of_nccl(backend[i]), TPF_EBACKEND);
  char code[32];
  assert_int_equal(tpf_cuda__nccl_err(ncclSystemError, "ncclAllGather"), TPF_EBACKEND);
  snprintf(code, sizeof code, "(%d)", (int)ncclSystemError);
  expect_detail("NCCL ncclAllGather failed: ", ncclGetErrorString(ncclSystemError), code);
}

/* ---- the macro set ---- */

static int cleanups;

static tpf_status try_cuda(cudaError_t e) {
  TPF_CUDA_TRY(e, "first");
  return TPF_OK;
}
static tpf_status try_cuda_goto(cudaError_t e) {
  tpf_status rc = TPF_OK;
  TPF_CUDA_TRY_GOTO(e, "second", rc, out);
  rc = TPF_OK;
out:
  cleanups++;
  return rc;
}
static tpf_status try_lt(cublasStatus_t st) {
  TPF_LT_TRY(st, "lt");
  return TPF_OK;
}
static tpf_status try_lt_goto(cublasStatus_t st) {
  tpf_status rc = TPF_OK;
  TPF_LT_TRY_GOTO(st, "lt goto", rc, out);
out:
  cleanups++;
  return rc;
}
static tpf_status try_nccl(ncclResult_t r) {
  TPF_NCCL_TRY(r, "nccl");
  return TPF_OK;
}
static tpf_status try_nccl_goto(ncclResult_t r) {
  tpf_status rc = TPF_OK;
  TPF_NCCL_TRY_GOTO(r, "nccl goto", rc, out);
out:
  cleanups++;
  return rc;
}

static void test_cuda_error__macros(void **state) {
  (void)state;
  cleanups = 0;
  assert_int_equal(try_cuda(cudaSuccess), TPF_OK);
  assert_int_equal(try_cuda(cudaErrorMemoryAllocation), TPF_ENOMEM);
  assert_non_null(strstr(tpf_last_error(), "CUDA first failed"));
  assert_int_equal(try_cuda_goto(cudaSuccess), TPF_OK);
  assert_int_equal(try_cuda_goto(cudaErrorInvalidValue), TPF_EBACKEND);
  assert_non_null(strstr(tpf_last_error(), "CUDA second failed"));
  assert_int_equal(try_lt(CUBLAS_STATUS_SUCCESS), TPF_OK);
  assert_int_equal(try_lt(CUBLAS_STATUS_INTERNAL_ERROR), TPF_EBACKEND);
  assert_non_null(strstr(tpf_last_error(), "cuBLASLt lt failed"));
  assert_int_equal(try_lt_goto(CUBLAS_STATUS_ALLOC_FAILED), TPF_ENOMEM);
  assert_non_null(strstr(tpf_last_error(), "cuBLASLt lt goto failed"));
  assert_int_equal(try_nccl(ncclSuccess), TPF_OK);
  assert_int_equal(try_nccl(ncclInternalError), TPF_EBACKEND);
  assert_non_null(strstr(tpf_last_error(), "NCCL nccl failed"));
  assert_int_equal(try_nccl_goto(ncclInvalidUsage), TPF_EBACKEND);
  assert_non_null(strstr(tpf_last_error(), "NCCL nccl goto failed"));
  assert_int_equal(cleanups, 4); /* every _GOTO form ran its cleanup, on success and failure */
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cuda_error__cuda_codes),
      cmocka_unit_test(test_cuda_error__cublaslt_codes),
      cmocka_unit_test(test_cuda_error__nccl_codes),
      cmocka_unit_test(test_cuda_error__macros),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
