/* Private declarations of the CUDA backend that its device code, tools and tests see too: the
 * kernel launchers and their argument structs (cuda_kernels.cu), the host agreement
 * (cuda_hostsync.c), the cuBLASLt GEMM cache (cuda_gemm.c) and the bootstrap's bounded allgather
 * (cuda_bootstrap.c). The rooms' shared state is cuda_state.h; errors, the log and the
 * environment are cuda_error.h, cuda_log.h and cuda_param.h (the map of rooms: cuda_backend.c).
 * Nothing here is public.
 *
 * Device-visible layout of one registration (one cudaMalloc, so one CUDA IPC handle):
 *   [0, data_bytes)                   data (the registered buffer the core lays out)
 *   guard                             >= 4 KiB, flags_off 4 KiB aligned
 *   [flags_off, +P*TPF_MAX_TAGS*8)    flags[sender][tag], uint64, written by the senders
 *   [ready_off, +P*1024)              ready word of each sender, in a 1 KiB slot of its own
 *   guard                             >= 4 KiB to the end of the allocation
 * A rank only ever writes into a peer's flags/ready rows indexed by its own rank, and only reads
 * its own rows, so every word has exactly one writer.
 */
#ifndef TPF_CUDA_INTERNAL_H
#define TPF_CUDA_INTERNAL_H

#include "tpflex/tpflex_backend.h"
#include "tpflex/tpflex_cuda.h"

#include <cuda_runtime.h>
#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Error codes a device-side wait writes into the host-mapped status area. */
enum { TPF_CUDA_DEV_OK = 0, TPF_CUDA_DEV_MISMATCH = 1, TPF_CUDA_DEV_TIMEOUT = 2 };

/* Per-backend status area in mapped pinned host memory. The first failing device-side wait wins
 * a claim word in device memory (no atomics on host memory, which PCIe may not support), stores
 * its details and then `code` (after a system fence), so the host reads `code` first and the
 * details only when it is non-zero. Every kernel reads `code` at entry and skips its work while
 * it is set. */
typedef struct {
  volatile uint32_t code;   /* TPF_CUDA_DEV_* */
  volatile uint32_t kind;   /* tpf_step_kind of the failing wait */
  volatile int32_t peer;    /* the peer waited for */
  volatile uint32_t tag;    /* flag tag (RECV/BARRIER) */
  volatile uint64_t seq;    /* operation sequence number */
  volatile uint64_t mine;   /* HANDSHAKE: my rows; waits: the value waited for */
  volatile uint64_t theirs; /* HANDSHAKE: the peer's rows; waits: the last value seen */
  volatile uint64_t addr;   /* device address of the word waited on */
} tpf_cuda_status;

/* Arguments of the 1-thread flag kernels. Pointers are device pointers valid in this rank's
 * context (peer pointers included). */
#define TPF_CUDA_MAX_PEERS TPF_MAX_RANKS
typedef struct {
  tpf_cuda_status *status;                   /* device view of the status area */
  unsigned int *claim;                       /* device word: first failing wait wins it */
  uint64_t *remote[TPF_CUDA_MAX_PEERS];      /* word to store into, per peer (NULL: none) */
  const uint64_t *local[TPF_CUDA_MAX_PEERS]; /* own word to wait on, per peer (NULL: none) */
  uint64_t store_value;                      /* value stored into every remote word */
  uint64_t wait_value;                       /* HANDSHAKE: expected seq (16 bits); else >= */
  uint64_t rows;                             /* HANDSHAKE: TPF_READY_BODY of my word */
  uint64_t timeout_ns;                       /* bound of every wait */
  uint64_t seq;                              /* for the error record */
  int32_t nranks;                            /* entries of remote/local considered */
  int32_t handshake;                         /* 1: compare ready words; 0: flag >= wait_value */
  uint32_t kind, tag;                        /* for the error record */
  /* Captured operations: the sequence number is read on the device from this word (the rank's
   * counter, bumped once per operation by tpf_cuda__launch_seq_bump), so that a replay uses the
   * replay's; store_value, wait_value and seq are then derived from it (HANDSHAKE: rows holds
   * the ready word's body and the words are at remote/local[q] + seq parity). NULL: as given. */
  const uint64_t *dev_seq;
} tpf_cuda_flag_args;

/* The epilogue of one step flagged TPF_STEP_EPILOGUE, as the kernels and cuBLASLt take it: the
 * step writes D[i, j] = act(alpha * v + beta * D_old[i, j] + bias[j]) in fp32 with one rounding
 * (v: the product or the sum; act: tanh GELU when gelu). bias already points at the step's first
 * column (tpf_exec_args.epi.bias + d.col elements) and has D's dtype. on == 0: a plain store of
 * v, the 0.1 semantics (every other field is ignored). */
typedef struct {
  int32_t on;
  int32_t gelu;
  float alpha, beta;
  const void *bias; /* device memory, NULL: none */
} tpf_cuda_epi;

/* A strided view for the reduction kernels: element (i, j) at base + (i * ld + j) * esize. */
typedef struct {
  const void *srcs[TPF_CUDA_MAX_PEERS]; /* count views (REDUCE: base + t*stride) */
  void *dst;
  uint64_t src_ld, dst_ld; /* elements */
  uint64_t rows, cols;
  int32_t count;
  int32_t src_dtype, dst_dtype; /* tpf_dtype */
  tpf_cuda_epi epi;             /* applied to every element written (bias in dst's dtype) */
} tpf_cuda_reduce_args;

/* ---- cuda_kernels.cu (launchers return the cudaError_t of the launch) ---- */
cudaError_t tpf_cuda__launch_flags(const tpf_cuda_flag_args *a, cudaStream_t s);
/* One thread: *counter += 1 (the device sequence number of the next captured operation). */
cudaError_t tpf_cuda__launch_seq_bump(uint64_t *counter, cudaStream_t s);
cudaError_t tpf_cuda__launch_reduce(const tpf_cuda_reduce_args *a, tpf_cuda_status *status,
                                    int ctas, cudaStream_t s);
/* Copies `bytes` from src to dst (a peer's buffer) with a bounded grid; skipped on error. */
cudaError_t tpf_cuda__launch_copy(void *dst, const void *src, uint64_t bytes,
                                  tpf_cuda_status *status, int ctas, cudaStream_t s);

/* Plain tiled GEMM for calls cuBLASLt cannot serve: row-major d[m, n] = op(a) * op(w) with the
 * step's flags (TPF_STEP_TRANS_A: a stored [k, m]; TPF_STEP_TRANS_W: w stored [k, n]; else a
 * [m, k] and w [n, k], d = a * w^T) and the epilogue e (NULL or e->on == 0: none). */
cudaError_t tpf_cuda__launch_gemm_fallback(const void *a, int at, uint64_t lda, const void *w,
                                           uint64_t ldw, void *d, int dt, uint64_t ldd, uint64_t m,
                                           uint64_t n, uint64_t k, unsigned flags,
                                           const tpf_cuda_epi *e, cudaStream_t s);

/* ---- cuda_fp8cast.cu: the modules' FP8 casts (cuda_fp8cast.c checks the arguments) ---- */
typedef struct {
  const void *x; /* [rows, cols] row-major, x_dtype (bf16, fp16, fp32) */
  int x_dtype;   /* tpf_dtype */
  uint64_t rows, cols;
  void *out;          /* [rows, cols] fp8, or NULL */
  void *out_t;        /* [cols, rows] fp8, or NULL */
  int out_dtype;      /* TPF_FP8_E4M3 or TPF_FP8_E5M2 */
  const float *scale; /* the scale (delayed scaling), or NULL: computed from *amax */
  const float *amax;  /* current scaling's amax, with fmax, epsilon and pow2 */
  float fmax, epsilon;
  int pow2;
  float *scale_inv;   /* receives 1 / scale */
  float *amax_record; /* max(*amax_record, max |x|), or NULL */
} tpf_cuda_fp8_cast_args;
cudaError_t tpf_cuda__launch_fp8_cast(const tpf_cuda_fp8_cast_args *a, cudaStream_t s);
/* *amax = max(*amax, max |x|) over n elements. */
cudaError_t tpf_cuda__launch_fp8_amax(const void *x, int xt, uint64_t n, float *amax,
                                      cudaStream_t s);
/* dst [cols, rows] = src [rows, cols]^T, one byte per element. */
cudaError_t tpf_cuda__launch_transpose_bytes(const void *src, uint64_t rows, uint64_t cols,
                                             void *dst, cudaStream_t s);

/* ---- cuda_hostsync.c: host agreement of ranks in different processes (no CUDA calls) ---- */
/* Who is where, one record per rank (the backend's peers[], exchanged at creation). */
typedef struct {
  uint64_t proc_token; /* identifies the process (host and pid) */
  int32_t device;      /* CUDA ordinal in that process */
  int32_t rank;
  uint64_t host; /* hash of the host name */
  int64_t pid;   /* the process, for naming a peer that exited (tpf_cuda__peer_gone) */
} tpf_cuda_peer_info;
/* A peer whose process has exited: the lowest rank q != me of peers[0..P) that is on me's host
 * and in another process, and whose pid no longer runs (kill(pid, 0) fails with ESRCH) or is a
 * zombie (/proc/<pid>/stat state Z or X: killed, not yet reaped). Its pid in *pid (when not
 * NULL). -1 when every such peer runs, or me is outside 0..P-1. */
int tpf_cuda__peer_gone(const tpf_cuda_peer_info *peers, int P, int me, int64_t *pid);
/* rc unchanged, except that a TPF_ETIMEOUT gets "; rank q's process (pid N) has exited" appended
 * to the current detail when tpf_cuda__peer_gone finds such a peer. A device wait sees only the
 * peer it waits on, which may be a survivor stuck behind the dead rank (a ring's waits cascade);
 * the liveness check names the one that is gone. */
tpf_status tpf_cuda__blame_gone(const tpf_cuda_peer_info *peers, int P, int me, tpf_status rc);
#define TPF_CUDA_HOSTSYNC_NAME 48
typedef struct tpf_cuda_hostsync tpf_cuda_hostsync;
/* Collective over the bootstrap. *out is NULL (and TPF_OK) when some rank could not set the
 * shared table up: then every rank goes without. */
tpf_status tpf_cuda__hostsync_create(const tpf_bootstrap *boot, const char *tag,
                                     tpf_cuda_hostsync **out);
void tpf_cuda__hostsync_destroy(tpf_cuda_hostsync *h);
/* Announces (seq, body) and waits, bounded, for every peer's announcement of seq: TPF_OK,
 * TPF_EMISMATCH naming both rows and operation keys, or TPF_ETIMEOUT naming the missing rank.
 * body is TPF_READY_BODY of the operation's ready word (its op key and active rows). */
tpf_status tpf_cuda__hostsync_agree(tpf_cuda_hostsync *h, const char *name, uint64_t seq,
                                    uint64_t body, uint64_t timeout_ns);

/* ---- cuda_gemm.c ---- */
typedef struct tpf_cuda_gemm tpf_cuda_gemm;
/* One cuBLASLt handle, `nworkspaces` workspaces of ws_bytes each (one per compute stream, since
 * GEMMs on different streams may run at once) and the algorithm cache. */
tpf_status tpf_cuda__gemm_create(int nworkspaces, uint64_t ws_bytes, tpf_cuda_gemm **out);
void tpf_cuda__gemm_destroy(tpf_cuda_gemm *g);
/* Row-major d[m, n] = op(a)[m, k] * op(w)[n, k]^T with fp32 accumulation and a step's flags
 * (transposes, as tpf_cuda__launch_gemm_fallback: lda/ldw of the stored matrices) and epilogue
 * (e NULL or e->on == 0: none). lda/ldw/ldd in elements. sm_target 0: all SMs. ws: which
 * workspace (the compute stream index). */
tpf_status tpf_cuda__gemm_run_ex(tpf_cuda_gemm *g, const void *a, tpf_dtype at, uint64_t lda,
                                 const void *w, tpf_dtype wt, uint64_t ldw, void *d, tpf_dtype dt,
                                 uint64_t ldd, uint64_t m, uint64_t n, uint64_t k, unsigned flags,
                                 const tpf_cuda_epi *e, int sm_target, int ws, cudaStream_t s);
/* FP8 (cuda_gemm.c, FP8): before an operation is enqueued, takes its scales (used by the fp8
 * GEMMs run_ex enqueues next) and refuses, with TPF_EUNSUPPORTED and nothing enqueued, fp8 GEMM
 * steps cuBLASLt cannot run (transposed operands, leading dimensions not multiples of 16, a bias
 * on an fp32 D). */
tpf_status tpf_cuda__gemm_fp8_prepare(tpf_cuda_gemm *g,
                                      const tpf_exec_args *a); /* g NULL: checks */
/* How one step GEMM maps onto cuBLASLt's column-major D' = op(A') op(B') (the Method of
 * cuda_gemm.c), as plain numbers so that CPU tests can check the mapping without a GPU. Layouts
 * are column-major (rows, cols, ld); op_a / op_b are 1 for CUBLAS_OP_T. epilogue is the
 * cublasLtEpilogue_t value; bias (when present) has d_rows elements, broadcast along d_cols. */
typedef struct {
  int op_a, op_b; /* cuBLASLt A' := w, B' := a */
  uint64_t a_rows, a_cols, a_ld;
  uint64_t b_rows, b_cols, b_ld;
  uint64_t d_rows, d_cols, d_ld; /* C' = D' := d */
  uint32_t epilogue;
} tpf_cuda_gemm_plan;
void tpf_cuda__gemm_plan_of(uint64_t m, uint64_t n, uint64_t k, uint64_t lda, uint64_t ldw,
                            uint64_t ldd, unsigned flags, const tpf_cuda_epi *e,
                            tpf_cuda_gemm_plan *out);
/* Statistics for tests: heuristic queries made, cache hits, fallback GEMMs. */
void tpf_cuda__gemm_stats(const tpf_cuda_gemm *g, uint64_t *lookups, uint64_t *hits,
                          uint64_t *fallbacks);

/* ---- cuda_bootstrap.c ---- */
/* The backend's allgather op over its bootstrap: first the sizes (TPF_EMISMATCH on every rank
 * when they differ), then the bytes. tpflex's own bootstraps (threads, NCCL) wait at most
 * timeout_ms (TPF_ETIMEOUT); a caller's bootstrap cannot be bounded from here and waits as long
 * as its allgather does. */
tpf_status tpf_cuda__boot_allgather(const tpf_bootstrap *boot, const void *send, void *recv,
                                    size_t bytes, uint64_t timeout_ms);
/* The outcome of one step of a collective creation (the backend's, a registration's): every rank
 * calls it with its local status, also after a local failure (that is the point), so that a
 * failure on one rank fails the step on every rank at once instead of leaving its peers waiting
 * for it until their timeout. Returns TPF_OK when every rank succeeded; `mine` with this rank's
 * message when it failed here; otherwise the status of the lowest failed rank, with a message
 * naming it and quoting its own ("rank 1 could not <what>: <its message>"). A failure of the
 * exchange itself is returned as such. Bounded like tpf_cuda__boot_allgather. */
tpf_status tpf_cuda__boot_outcome(const tpf_bootstrap *boot, tpf_status mine, const char *what,
                                  uint64_t timeout_ms);

#ifdef __cplusplus
}
#endif
#endif /* TPF_CUDA_INTERNAL_H */
