/* tpflex CUDA backend: registrations through cudaMalloc + CUDA IPC (or direct pointers for ranks
 * in one process), copy-engine ring exchange ordered by host-ordered CUDA events between ranks of
 * one process and by device flags (with a host agreement first) between processes, cuBLASLt GEMMs
 * and reduction kernels. Built when TPF_WITH_CUDA is ON (AUTO: when a CUDA compiler is found).
 * Environment knobs (TPF_CUDA_*, read once per process, the first time a backend or bootstrap is
 * created) and the log (TPF_DEBUG=WARN|INFO|TRACE, TPF_DEBUG_SUBSYS) are listed in
 * backend_cuda/cuda_param.h. */
#ifndef TPFLEX_CUDA_H
#define TPFLEX_CUDA_H

#include "tpflex.h"

#ifdef __cplusplus
extern "C" {
#endif

/* tpf_bootstrap (how the ranks of a group find each other) is declared in tpflex.h. */

/* Creates this rank's backend (collective over the bootstrap group). A CUDA failure on any rank
 * fails the creation on every rank, promptly (the ranks exchange their outcomes, also after a
 * local failure): the failed rank returns its own status and message, every other rank the same
 * status with a message naming the failed rank and quoting it; nothing is kept on any rank.
 * Communicator creation on this backend does the same for its registration. */
TPF_API tpf_status tpf_cuda_backend_create(const tpf_bootstrap *boot, tpf_backend **out);
TPF_API tpf_status tpf_cuda_backend_destroy(tpf_backend *be);

/* Bound of every wait of this backend for a peer: device-side flag waits and the host waits of
 * in-process ranks (default 30000 ms, or the environment variable TPF_CUDA_TIMEOUT_MS as read
 * once per process). Applies to operations enqueued afterwards. TPF_EINVAL for a non-CUDA
 * backend or 0. */
TPF_API tpf_status tpf_cuda_backend_set_timeout(tpf_backend *be, unsigned timeout_ms);

/* Counters for tests and tuning. gemm_heuristic_queries counts cuBLASLt heuristic calls (one per
 * new GEMM shape); gemm_cache_hits the GEMMs served from the per-shape cache. TPF_EINVAL for a
 * non-CUDA backend or NULL out. */
typedef struct {
  uint64_t gemm_heuristic_queries;
  uint64_t gemm_cache_hits;
  uint64_t gemm_fallbacks; /* GEMMs cuBLASLt had no algorithm for, done by a plain kernel */
} tpf_cuda_stats;
TPF_API tpf_status tpf_cuda_backend_stats(tpf_backend *be, tpf_cuda_stats *out);

/* Where tpf_* calls of this rank spend host time: cumulative since the backend was
 * created; take differences around the operations you time. Every CUDA and cuBLASLt call an
 * operation makes is counted in one kind, with the host time it took (CLOCK_MONOTONIC around the
 * call); PEER_WAIT is host time spent waiting for a peer rank to reach the same point of its
 * program (in-process handshake, the polling enqueuer's idle time, the host agreement of ranks in
 * other processes), counted once per wait that had to wait. host_ns is the whole time inside the
 * backend's execute, so host_ns minus the kinds' ns is the backend's own bookkeeping. Read it
 * from the rank's own thread (the counters are the rank's, not atomic). */
typedef enum {
  TPF_CUDA_ENQ_GEMM,      /* cublasLtMatmul, fallback GEMM kernels */
  TPF_CUDA_ENQ_COPY,      /* cudaMemcpyAsync, copy and reduction kernels */
  TPF_CUDA_ENQ_SIGNAL,    /* flag kernels and stream memory operations (ranks in other processes) */
  TPF_CUDA_ENQ_RECORD,    /* cudaEventRecord */
  TPF_CUDA_ENQ_WAIT,      /* cudaStreamWaitEvent */
  TPF_CUDA_ENQ_PEER_WAIT, /* host waits for a peer (no CUDA call) */
  TPF_CUDA_ENQ_COUNT
} tpf_cuda_enq_kind;
typedef struct {
  size_t size;      /* sizeof(tpf_cuda_enqueue_stats) as the caller compiled it; 0: this header's */
  uint64_t ops;     /* operations executed (calls of the backend's execute) */
  uint64_t host_ns; /* host time inside them */
  uint64_t calls[TPF_CUDA_ENQ_COUNT];
  uint64_t ns[TPF_CUDA_ENQ_COUNT];
} tpf_cuda_enqueue_stats;
/* Fills *out (up to out->size bytes). TPF_EINVAL for a non-CUDA backend, NULL out or a size
 * that is not 0 or a released layout's (today only sizeof(tpf_cuda_enqueue_stats)). */
TPF_API tpf_status tpf_cuda_backend_enqueue_stats(tpf_backend *be, tpf_cuda_enqueue_stats *out);
/* The kind's short name ("gemm", "copy", "signal", "record", "wait", "peer_wait"), or "?". */
TPF_API const char *tpf_cuda_enq_kind_name(tpf_cuda_enq_kind k);

/* Profiler ranges (SPEC §16): with profiling on, every operation this backend enqueues runs in
 * an NVTX range ("tpflex.ag_gemm fc1_fprop T=1024 ring splits=4", the schedule as it ran; colour
 * by kind) and every shape change leaves an NVTX mark, for Nsight Systems. Off by default; the
 * environment variable TPFLEX_PROFILE=1 (read at the first operation) or tpf_cuda_set_profile(1)
 * turns it on for the whole process (tpflex.torch.profile calls it). Thread-safe. */
TPF_API void tpf_cuda_set_profile(int on);
TPF_API int tpf_cuda_profile_enabled(void);

/* Device timing while profiling is on (SPEC §16): per registration (communicator name) and rank,
 * from CUDA events read lazily (cudaEventQuery: a completed operation is read at the next timed
 * operation or at this call; nothing ever waits). Per operation: its span on the caller's stream
 * (start before the fork, end after the join), the union of its GEMM steps' spans, the union of
 * its communication steps' spans (copies, reductions); exposed = span - GEMMs (the operation's
 * time its GEMMs did not cover), hidden = communication that ran while a GEMM ran. Profiling
 * adds two timing events per GEMM or communication step. Sums over the timed operations, in
 * microseconds. */
typedef struct {
  size_t size;          /* sizeof(tpf_cuda_comm_timing) as the caller compiled it; 0: this one */
  uint64_t timed_ops;   /* operations read */
  uint64_t pending_ops; /* recorded, not complete on the device yet */
  uint64_t untimed_ops; /* ran while profiling but not timed: every slot pending, CUDA-graph
                         * capture, an event error */
  double op_us, gemm_us, comm_us, exposed_us, hidden_us;
} tpf_cuda_comm_timing;
/* Fills *out for the communicator named `name` on this rank's backend (zeros when none of its
 * operations was timed); reset != 0 zeroes its counters afterwards. Call from the rank's thread.
 * TPF_EINVAL for a non-CUDA backend, a NULL name or out, or a size that is not 0 or
 * sizeof(tpf_cuda_comm_timing). */
TPF_API tpf_status tpf_cuda_backend_comm_timing(tpf_backend *be, const char *name,
                                                tpf_cuda_comm_timing *out, int reset);

/* FP8 casts for the modules (SPEC §14; python/tpflex/_quant.py calls them on CUDA tensors): one
 * kernel per cast where torch takes five, each element fp8(saturate(float(x) * scale)) rounded to
 * nearest even, bit for bit torch's fp32 product, clamp and conversion. All pointers are device
 * memory; the work is enqueued on `stream` (a cudaStream_t; NULL: the legacy default stream) and
 * nothing waits. They need no backend object.
 *
 * tpf_cuda_fp8_cast: x [rows, cols] row-major in x_dtype (TPF_BF16, TPF_FP16 or TPF_FP32) into
 * out [rows, cols] and/or out_t [cols, rows] (either may be NULL, not both) in out_dtype
 * (TPF_FP8_E4M3 or TPF_FP8_E5M2). The scale is *scale (delayed scaling), or, with scale NULL,
 * computed from *amax as current scaling does (fp8_max / amax correctly rounded, amax below
 * epsilon raised to it; 1 where amax is 0, inf or NaN; fp32's max where the quotient overflows;
 * its exponent alone with pow2 != 0): exactly one of scale and amax is given. *scale_inv
 * receives 1 / scale; amax_record (or NULL) receives max(*amax_record, max |x|) (NaN-propagating).
 * TPF_EINVAL naming the argument for NULL x, scale_inv, both or neither of scale / amax, both
 * outputs NULL, another dtype, negative epsilon, rows * cols overflowing, or out_t with more than
 * 2,096,000 rows; TPF_EBACKEND with CUDA's message when the launch fails. */
TPF_API tpf_status tpf_cuda_fp8_cast(const void *x, tpf_dtype x_dtype, uint64_t rows, uint64_t cols,
                                     void *out, void *out_t, tpf_dtype out_dtype,
                                     const float *scale, const float *amax, float epsilon, int pow2,
                                     float *scale_inv, float *amax_record, void *stream);
/* *amax = max(*amax, max |x|) over x's n elements (x_dtype TPF_BF16, TPF_FP16 or TPF_FP32):
 * current scaling's amax, into a zeroed or running one-element buffer. */
TPF_API tpf_status tpf_cuda_fp8_amax(const void *x, tpf_dtype x_dtype, uint64_t n, float *amax,
                                     void *stream);
/* dst [cols, rows] = src [rows, cols]^T, one byte per element (FP8 data): the TN layout
 * cuBLASLt's FP8 GEMMs take. TPF_EINVAL for NULL pointers, overflow or over 2,096,000 rows. */
TPF_API tpf_status tpf_cuda_transpose_bytes(const void *src, uint64_t rows, uint64_t cols,
                                            void *dst, void *stream);

/* In-process ranks (threads, possibly several on one GPU): one group object shared by the
 * threads; each thread fills its tpf_bootstrap with tpf_cuda_threads_bootstrap. */
typedef struct tpf_cuda_threads tpf_cuda_threads;
TPF_API tpf_status tpf_cuda_threads_create(int tp_size, tpf_cuda_threads **out);
TPF_API tpf_status tpf_cuda_threads_bootstrap(tpf_cuda_threads *g, int rank, int device,
                                              tpf_bootstrap *out);
TPF_API tpf_status tpf_cuda_threads_destroy(tpf_cuda_threads *g);

/* Bootstrap over an existing NCCL communicator (ncclComm_t passed as void *), one process per
 * rank; `device` is the rank's CUDA device. The returned bootstrap's ctx is owned by the caller
 * and freed with tpf_cuda_nccl_bootstrap_free. */
TPF_API tpf_status tpf_cuda_nccl_bootstrap(void *nccl_comm, int device, tpf_bootstrap *out);
TPF_API void tpf_cuda_nccl_bootstrap_free(tpf_bootstrap *b);

/* Measurement probes (what `tpflex calibrate` times; backend_cuda/cuda_probe.c). Each enqueues
 * one of the backend's own kernels on `stream` (a cudaStream_t, NULL: the legacy default stream)
 * exactly as the backend's steps launch it, and returns without waiting; the caller times it
 * (CUDA events around it, or the host time of the call). They make the backend's device current
 * (cudaSetDevice). The kernels read a status area that only device-side waits write; the probes
 * share one per device, allocated the first time a probe runs there (cudaMalloc: do not time the
 * first call) and kept until the process exits. Every argument is checked before any CUDA call:
 * TPF_EINVAL naming the bad value; TPF_EBACKEND for a failed launch.
 *
 * tpf_cuda_probe_reduce: the reduction kernel of a reduce-scatter step (TPF_STEP_REDUCE),
 * TPF_CUDA_COMM_CTAS CTAs as the backend launches it: dst[i, j] = sum over t < count of
 * srcs[t][i, j] for i < rows, j < cols, accumulated in fp32 and rounded once to dtype (bf16,
 * fp16 or fp32, the same for sources and destination). Row-major, leading dimensions src_ld
 * (every source) and dst_ld in elements (>= cols); count 1..64 (TPF_MAX_RANKS); device pointers. */
TPF_API tpf_status tpf_cuda_probe_reduce(tpf_backend *be, const void *const *srcs, int count,
                                         uint64_t src_ld, void *dst, uint64_t dst_ld, uint64_t rows,
                                         uint64_t cols, tpf_dtype dtype, void *stream);
/* The backend's 1-thread flag kernel with no peer to signal or wait for: a kernel launch that
 * does nothing (the host cost of one launch). */
TPF_API tpf_status tpf_cuda_probe_empty_launch(tpf_backend *be, void *stream);

#ifdef __cplusplus
}
#endif
#endif /* TPFLEX_CUDA_H */
