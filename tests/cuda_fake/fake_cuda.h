/* A counting stand-in for the CUDA runtime, cuBLASLt and the driver entry points that the CUDA
 * backend calls, so that its HOST path runs on a machine without a GPU (CI).
 *
 * What it is. libtpf_fake_cuda.so defines the cudart / cuBLASLt functions libtpflex's CUDA objects
 * reference (tests run with it in LD_PRELOAD, so its definitions come before the real libraries').
 * Memory is host memory (cudaMalloc is an aligned malloc), streams and events complete at once,
 * copies and memsets are done on the host at the call, stream memory operations write their
 * words at the call and never wait, kernels and GEMMs are counted and NOT run. So a test of it
 * sees every call the backend makes and in what order, its allocations and frees, its errors'
 * paths (fault injection below), and never a result: nothing numeric an operation computes can be
 * judged here, and no figure of it is a GPU figure.
 *
 * Exec mode. With TPF_FAKE_CUDA_EXEC=1 the backend's reduction, copy and sequence kernels run on
 * the host at their launch (kernels recognised by name, arguments as cuda_internal.h defines
 * them), and every cublasLtMatmul computes cuBLASLt's definition (column-major, transposes,
 * alpha, beta, bias and GELU epilogues, fp8 operands with their scale pointers; fp32 sums, one
 * rounding), so results can be judged. Everything runs in enqueue order, which is a valid order
 * for in-process ranks (host-ordered events: a peer's event is published only after the work
 * before it was enqueued, i.e. here, done). Flag kernels (device waits) and the fallback GEMM
 * are not emulated: launching one fails with cudaErrorNotSupported. A pass here says the host
 * path and the mapping onto cuBLASLt are right; the device code's own arithmetic is not tested
 * (the emulation is written from its definition, not compiled from it). cudaEventElapsedTime
 * gives the host time between two records, i.e. the fake's own execution on this CPU, so that
 * the benches' code runs end to end: no such figure says anything about a GPU. Memsets of 256 MiB
 * or more (the benches' L2 flush) are counted, not written.
 *
 * Counters. Every call is counted twice: in the calling thread's counters (a rank thread sees
 * only its own calls) and in the process's totals. tpf_fake_cuda_counts reads either.
 *
 * Faults. TPF_FAKE_CUDA_FAIL=<call>:<n>[:<code>] makes the n-th call (1-based, counted over the
 * process, from the last tpf_fake_cuda_reset) of <call> (e.g. cublasLtMatmul, cudaMemcpyAsync,
 * launch) fail with <code> (cudaErrorLaunchFailure / CUBLAS_STATUS_EXECUTION_FAILED by default),
 * or tpf_fake_cuda_fail_at(call, n) from a test. */
#ifndef TPF_FAKE_CUDA_H
#define TPF_FAKE_CUDA_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  TPF_FAKE_MATMUL,       /* cublasLtMatmul */
  TPF_FAKE_LAUNCH,       /* kernel launches (every kernel) */
  TPF_FAKE_MEMCPY,       /* cudaMemcpyAsync */
  TPF_FAKE_MEMSET,       /* cudaMemsetAsync, cudaMemset */
  TPF_FAKE_EVENT_RECORD, /* cudaEventRecord(WithFlags) */
  TPF_FAKE_STREAM_WAIT,  /* cudaStreamWaitEvent */
  TPF_FAKE_QUERY,        /* cudaEventQuery, cudaStreamQuery, cudaStreamIsCapturing */
  TPF_FAKE_SYNC,         /* cudaStreamSynchronize, cudaDeviceSynchronize */
  TPF_FAKE_MEMOP,        /* cuStreamWriteValue64, cuStreamWaitValue64, cuStreamBatchMemOp */
  TPF_FAKE_ALLOC,        /* cudaMalloc, cudaHostAlloc */
  TPF_FAKE_FREE,         /* cudaFree, cudaFreeHost */
  TPF_FAKE_LT_SETUP,     /* cuBLASLt descriptor, layout, preference and heuristic calls */
  TPF_FAKE_LT_ATTR,      /* cublasLtMatmulDescSetAttribute (per-call pointers: bias, scales) */
  TPF_FAKE_OTHER,        /* everything else (device, stream and event creation, errors) */
  TPF_FAKE_NUM_KINDS
} tpf_fake_kind;

typedef struct {
  uint64_t calls[TPF_FAKE_NUM_KINDS];
  uint64_t total;       /* every call of the kinds above */
  uint64_t live_allocs; /* cudaMalloc/cudaHostAlloc not yet freed (process scope only) */
  uint64_t matmul_m, matmul_n, matmul_k; /* the last cublasLtMatmul's D rows, D cols, inner dim
                                            (as cuBLASLt sees them: column-major) */
} tpf_fake_counts;

enum { TPF_FAKE_THREAD = 0, TPF_FAKE_PROCESS = 1 };

/* Reads the calling thread's counters (TPF_FAKE_THREAD) or the process's (TPF_FAKE_PROCESS). */
void tpf_fake_cuda_counts(int scope, tpf_fake_counts *out);
/* Zeroes the calling thread's counters and, with TPF_FAKE_PROCESS, the process's too (and the
 * fault's call count). Live allocations are never reset. */
void tpf_fake_cuda_reset(int scope);
/* The kernel launches by name since the last reset of the calling thread: writes up to cap
 * "name count" entries into names/counts and returns how many distinct kernels launched. */
int tpf_fake_cuda_launches(const char **names, uint64_t *counts, int cap);
/* Fails the n-th call (n >= 1) of `call` from now on (process-wide count); call NULL clears. */
void tpf_fake_cuda_fail_at(const char *call, uint64_t n);
/* Nonzero when the armed fault has fired (the n-th call happened) since it was armed. */
int tpf_fake_cuda_fault_fired(void);
/* Nonzero: this library's definitions are the ones the process calls (LD_PRELOAD worked). */
int tpf_fake_cuda_active(void);
/* A one-line summary of counters into buf ("matmul 1 launch 0 ..."). */
const char *tpf_fake_cuda_format(const tpf_fake_counts *c, char *buf, int cap);

#ifdef __cplusplus
}
#endif

#endif
