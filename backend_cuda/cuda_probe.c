/* The measurement probes (include/tpflex/tpflex_cuda.h, tpf_cuda_probe_*): the backend's own
 * kernels enqueued alone, as its steps launch them, so that `tpflex calibrate` measures what the
 * backend runs without seeing its internals.
 *
 * Status area. The reduction and flag kernels read a tpf_cuda_status at entry (and skip their
 * work while its code is set); only device-side waits write it, and a probe has none. So the
 * probes share one area per device, zeroed and never written: device memory allocated the first
 * time a probe runs on that device (cudaMalloc, which may wait for the device: the first call is
 * not one to time) and kept until the process exits, as cuda_gemm.c's ok_status is for the
 * GEMM's fp32 reduction.
 *
 * Every argument is checked before any CUDA call, so the refusals are testable without a GPU
 * (tests/cuda_cpu/test_cuda_probe.c). */
#define _POSIX_C_SOURCE 200809L
#include "cuda_state.h"
#include "cuda_error.h"

#include <pthread.h>
#include <stdint.h>
#include <string.h>

#define TPF_PROBE_MAX_DEVICES 64

static pthread_mutex_t g_probe_mu = PTHREAD_MUTEX_INITIALIZER;
static tpf_cuda_status *g_probe_status[TPF_PROBE_MAX_DEVICES];

/* The zeroed status area of the backend's device (allocated on first use). */
static tpf_status probe_status(const tpf_cuda_backend *b, const char *what, tpf_cuda_status **out) {
  TPF_RETURN_IF(b->device < 0 || b->device >= TPF_PROBE_MAX_DEVICES, TPF_EINVAL,
                "%s: the backend's device %d is outside 0..%d", what, b->device,
                TPF_PROBE_MAX_DEVICES - 1);
  pthread_mutex_lock(&g_probe_mu);
  tpf_status rc = TPF_OK;
  if (g_probe_status[b->device] == NULL) {
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, sizeof(tpf_cuda_status));
    if (e == cudaSuccess) e = cudaMemset(p, 0, sizeof(tpf_cuda_status));
    if (e != cudaSuccess) {
      if (p) cudaFree(p);
      rc = tpf_cuda__err(e, "probe status area (cudaMalloc/cudaMemset)");
    } else {
      g_probe_status[b->device] = p;
    }
  }
  *out = g_probe_status[b->device];
  pthread_mutex_unlock(&g_probe_mu);
  return rc;
}

static tpf_status probe_backend(tpf_backend *be, const char *what) {
  TPF_RETURN_IF(be == NULL, TPF_EINVAL, "%s: be is NULL", what);
  TPF_RETURN_IF(be->ops != &tpf_cuda__ops, TPF_EINVAL, "%s: backend '%s' is not a CUDA backend",
                what, be->ops && be->ops->name ? be->ops->name : "?");
  return TPF_OK;
}

tpf_status tpf_cuda_probe_reduce(tpf_backend *be, const void *const *srcs, int count,
                                 uint64_t src_ld, void *dst, uint64_t dst_ld, uint64_t rows,
                                 uint64_t cols, tpf_dtype dtype, void *stream) {
  static const char what[] = "tpf_cuda_probe_reduce";
  TPF_CHECK(probe_backend(be, what));
  TPF_RETURN_IF(count < 1 || count > TPF_CUDA_MAX_PEERS, TPF_EINVAL,
                "%s: count %d is outside 1..%d (the views one reduction sums)", what, count,
                TPF_CUDA_MAX_PEERS);
  TPF_RETURN_IF(srcs == NULL, TPF_EINVAL, "%s: srcs is NULL (count %d)", what, count);
  for (int t = 0; t < count; t++)
    TPF_RETURN_IF(srcs[t] == NULL, TPF_EINVAL, "%s: srcs[%d] is NULL (count %d)", what, t, count);
  TPF_RETURN_IF(dst == NULL, TPF_EINVAL, "%s: dst is NULL", what);
  TPF_RETURN_IF(dtype != TPF_BF16 && dtype != TPF_FP16 && dtype != TPF_FP32, TPF_EINVAL,
                "%s: dtype %d is not bf16 (%d), fp16 (%d) or fp32 (%d)", what, (int)dtype,
                (int)TPF_BF16, (int)TPF_FP16, (int)TPF_FP32);
  TPF_RETURN_IF(rows == 0 || cols == 0, TPF_EINVAL, "%s: [rows %llu, cols %llu] is empty", what,
                (unsigned long long)rows, (unsigned long long)cols);
  TPF_RETURN_IF(src_ld < cols || dst_ld < cols, TPF_EINVAL,
                "%s: src_ld %llu and dst_ld %llu must be >= cols %llu", what,
                (unsigned long long)src_ld, (unsigned long long)dst_ld, (unsigned long long)cols);
  tpf_cuda_backend *b = tpf_cuda__of(be);
  tpf_cuda_reduce_args ra;
  memset(&ra, 0, sizeof ra);
  for (int t = 0; t < count; t++)
    ra.srcs[t] = srcs[t];
  ra.dst = dst;
  ra.src_ld = src_ld;
  ra.dst_ld = dst_ld;
  ra.rows = rows;
  ra.cols = cols;
  ra.count = count;
  ra.src_dtype = ra.dst_dtype = (int32_t)dtype; /* epi.on == 0: a plain store of the sum */
  TPF_CUDA_TRY(cudaSetDevice(b->device), "cudaSetDevice");
  tpf_cuda_status *status = NULL;
  TPF_CHECK(probe_status(b, what, &status));
  /* As cuda_exec.c's TPF_STEP_REDUCE: b->comm_ctas CTAs (TPF_CUDA_COMM_CTAS). */
  TPF_CUDA_TRY(tpf_cuda__launch_reduce(&ra, status, b->comm_ctas, (cudaStream_t)stream),
               "reduce kernel launch");
  return TPF_OK;
}

tpf_status tpf_cuda_probe_empty_launch(tpf_backend *be, void *stream) {
  static const char what[] = "tpf_cuda_probe_empty_launch";
  TPF_CHECK(probe_backend(be, what));
  tpf_cuda_backend *b = tpf_cuda__of(be);
  TPF_CUDA_TRY(cudaSetDevice(b->device), "cudaSetDevice");
  tpf_cuda_status *status = NULL;
  TPF_CHECK(probe_status(b, what, &status));
  /* The backend's 1-thread flag kernel with no peer to signal or wait for: it does nothing. */
  tpf_cuda_flag_args f;
  memset(&f, 0, sizeof f);
  f.status = status;
  f.timeout_ns = b->timeout_ns;
  TPF_CUDA_TRY(tpf_cuda__launch_flags(&f, (cudaStream_t)stream), "flag kernel launch");
  return TPF_OK;
}
