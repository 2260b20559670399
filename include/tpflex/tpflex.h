/* tpflex — tensor-parallel communication/GEMM overlap with dynamic token counts.
 *
 * A communicator registers its buffer once, at capacity [C, H], and every microbatch runs on a
 * packed active prefix [T, H] of it (T <= C). set_active_shape changes views, offsets and message
 * sizes, never allocations. This header is the whole public API; backends add a create function
 * each (tpflex_sim.h, tpflex_cuda.h), backend authors read tpflex_backend.h.
 *
 * Conventions: every fallible function returns tpf_status; out-parameters are written only on
 * success; on failure tpf_last_error() holds a one-line detail with the numbers involved. Sizes
 * and offsets are uint64_t, in bytes when the name ends in _bytes or _off, in elements otherwise.
 * Destroyed handles: every call on a destroyed communicator, manager or simulator world (double
 * destroy included) returns TPF_EINVAL with "... was destroyed" in the detail, without reading
 * the freed object (a table of live handles, docs/DESIGN.md); calls that return a value give
 * the value they give for NULL.
 *
 * Contracts (docs/SPEC.md has the layouts, rules, statuses and oracle; its §6 says where a
 * backend comes from and what the stream argument is on each backend):
 * - Collective calls: tpf_comm_create / tpf_manager_add, tpf_ag_gemm, tpf_gemm_rs,
 *   tpf_bulk_overlap, tpf_comm_destroy / tpf_manager_destroy. Every rank of the group makes them
 *   with the same arguments (apart from rank-local pointers) in the same global order across all
 *   its communicators. Everything else is local: set_active_shape, views, layout queries,
 *   tpf_comm_legal_rows, status and name functions.
 * - Threads: one thread at a time issues a rank's calls (a rank's communicators and manager are
 *   not thread-safe). A second thread's call that reaches the rank's backend (an operation,
 *   set_active_shape, sync, creation or destroy, of any communicator or manager of the rank)
 *   while another thread is inside one is refused with TPF_ESTATE naming this rule before
 *   anything changes: no sequence number is used and the communicator is not failed (its peers,
 *   waiting in that operation, pair with the call made again), a manager's shape change or
 *   destroy changes none of its communicators, a destroy frees nothing. Different ranks may be
 *   different threads of one process (the simulator, tpf_cuda_threads_*) or different processes.
 *   tpf_last_error() is per thread.
 *   tpf_set_allocator must be called before any object exists.
 * - Views: the matrices from tpf_comm_buffer, tpf_comm_local_chunk and tpf_comm_registration
 *   point into the registration and stay valid until tpf_comm_destroy, but their rows describe
 *   the active shape of the moment they were taken: after a set_active_shape, take them again.
 * - CUDA graphs (docs/SPEC.md §10): an operation enqueued on a stream under capture is
 *   captured; replaying the graph re-runs it at the active shape of capture time with no host
 *   work. Every rank must replay the same graphs in the same order as the others (each rank its
 *   own graph); a disagreement (another T or operation) is TPF_EMISMATCH at tpf_comm_sync /
 *   tpf_comm_async_error, with no byte moved. Set the active shape of the graph before replaying
 *   it, so that views and later eager operations agree with it. The operands' pointers are part
 *   of the graph (static buffers).
 */
#ifndef TPFLEX_H
#define TPFLEX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Marks the public API: the shared library exports these names and nothing else (it is built
 * with hidden visibility by default). */
#if defined(__GNUC__) || defined(__clang__)
#define TPF_API __attribute__((visibility("default")))
#else
#define TPF_API
#endif

#define TPF_VERSION_MAJOR 0
#define TPF_VERSION_MINOR 2
#define TPF_VERSION_PATCH 0

/* Status codes: one list generates the enum, tpf_status_name() and tpf_strerror(), so the three
 * cannot drift. Values are explicit and never renumbered. */
#define TPF_STATUS_MAP(XX)                                                                         \
  XX(OK, 0, "success")                                                                             \
  XX(EINVAL, 1, "invalid argument (NULL pointer, bad enum value or destroyed object)")             \
  XX(ESHAPE, 2, "shape is empty or its columns differ from the capacity columns")                  \
  XX(ECAPACITY, 3, "active rows exceed the registered capacity")                                   \
  XX(EDIVISIBLE, 4, "rows (or columns for a pipeline split) not divisible as the layout needs")    \
  XX(EALIGN, 5, "chunk size or offset misses the backend's required alignment")                    \
  XX(EUNSUPPORTED, 6, "operation not supported for this communicator or backend")                  \
  XX(ESTATE, 7, "object is in the wrong state for this call (e.g. failed after a timeout)")        \
  XX(EMISMATCH, 8, "ranks disagree on the configuration, active shape or operation")               \
  XX(ETIMEOUT, 9, "a wait for a peer exceeded the configured timeout")                             \
  XX(ENOMEM, 10, "out of memory")                                                                  \
  XX(EOVERFLOW, 11, "a size or offset overflows 64 bits")                                          \
  XX(EBACKEND, 12, "backend failure (CUDA, NCCL, cuBLASLt or pthreads); see tpf_last_error()")

typedef enum {
#define TPF_STATUS_ENUM_(name, value, text) TPF_##name = value,
  TPF_STATUS_MAP(TPF_STATUS_ENUM_)
#undef TPF_STATUS_ENUM_
      TPF_STATUS_COUNT
} tpf_status;

/* "TPF_ECAPACITY" for TPF_ECAPACITY; "TPF_UNKNOWN" for a value outside the enum. */
TPF_API const char *tpf_status_name(tpf_status s);
/* One-line meaning of a status; never NULL. */
TPF_API const char *tpf_strerror(tpf_status s);
/* Detail of the last failure on the calling thread ("active rows 4100 exceed capacity 4096 for
 * 'fc1_fprop'"); "" when none. The string is thread-local and valid until the next failing call. */
TPF_API const char *tpf_last_error(void);

/* Allocator hooks (libuv style). All four NULL restores the C library's. Must be called before
 * any object exists: while allocations of the current hooks are live (any communicator, manager
 * or world), a change is refused with TPF_ESTATE naming the live count (setting the same four
 * hooks again is allowed). Returns TPF_EINVAL if only some are given. */
typedef void *(*tpf_malloc_fn)(size_t);
typedef void *(*tpf_calloc_fn)(size_t, size_t);
typedef void *(*tpf_realloc_fn)(void *, size_t);
typedef void (*tpf_free_fn)(void *);
TPF_API tpf_status tpf_set_allocator(tpf_malloc_fn m, tpf_calloc_fn c, tpf_realloc_fn r,
                                     tpf_free_fn f);

typedef enum {
  TPF_BF16 = 0,
  TPF_FP16,
  TPF_FP32,
  TPF_FP8_E4M3,
  TPF_FP8_E5M2,
  TPF_DTYPE_COUNT
} tpf_dtype;
typedef enum { TPF_ALGO_BULK = 0, TPF_ALGO_PIPELINE, TPF_ALGO_RING, TPF_ALGO_COUNT } tpf_algo;
typedef enum { TPF_COLL_AG = 0, TPF_COLL_RS, TPF_COLL_COUNT } tpf_coll;

typedef struct {
  uint64_t rows; /* first dimension: tokens */
  uint64_t cols; /* second dimension: hidden size */
} tpf_shape;

/* A row-major matrix view: element (i, j) is at ptr + (i * ld + j) * dtype_size. */
typedef struct {
  void *ptr;       /* host pointer (simulator) or device pointer (CUDA) */
  uint64_t rows;   /* number of rows */
  uint64_t cols;   /* number of columns */
  uint64_t ld;     /* leading dimension in elements, >= cols */
  tpf_dtype dtype; /* element type */
} tpf_matrix;

/* Bytes per element: 2 for bf16/fp16, 4 for fp32, 1 for fp8; 0 for an invalid value. */
TPF_API size_t tpf_dtype_size(tpf_dtype t);
/* "bf16", "fp16", "fp32", "fp8_e4m3", "fp8_e5m2"; "?" for an invalid value. */
TPF_API const char *tpf_dtype_name(tpf_dtype t);
/* "bulk", "pipeline", "ring" / "ag", "rs"; "?" for an invalid value. */
TPF_API const char *tpf_algo_name(tpf_algo a);
TPF_API const char *tpf_coll_name(tpf_coll c);

/* ---- Pure layout queries (no backend) ------------------------------------------------------ */

/* Everything that determines one rank's packed active layout. num_splits: GEMM chunks (RING AG:
 * P, P/2 with aggregate, or 1; RING RS: P; PIPELINE: S column blocks, H % S == 0; BULK: ignored);
 * 0 selects the default (RING: P or P/2 with aggregate; PIPELINE: 4 if it divides H, else 1). */
typedef struct {
  int tp_size;        /* P >= 1 */
  int rank;           /* 0 <= rank < P */
  tpf_algo algo;      /* algorithm */
  tpf_coll coll;      /* collective */
  tpf_dtype dtype;    /* buffer element type */
  tpf_shape capacity; /* registered shape [C, H] */
  tpf_shape active;   /* active shape [T, H] */
  int num_splits;     /* see above; 0 = default */
  bool aggregate;     /* RING AG: 2-chunk messages after a pair swap (even P only) */
} tpf_layout_desc;

typedef struct {
  uint64_t offset_bytes; /* from the start of the registration */
  uint64_t bytes;        /* length */
  uint64_t rows; /* rows of the buffer's columns it holds (PIPELINE blocks: T rows of H/S) */
} tpf_region;

/* Checks every rule of docs/SPEC.md §3 for capacity and active shape (alignment: 16 bytes, the
 * strictest backend). TPF_EINVAL, TPF_ESHAPE, TPF_ECAPACITY, TPF_EDIVISIBLE, TPF_EALIGN,
 * TPF_EUNSUPPORTED, TPF_EOVERFLOW as in docs/SPEC.md §3. */
TPF_API tpf_status tpf_layout_check(const tpf_layout_desc *d);
/* Bytes registered at capacity: C*H*e, or (2P-1)*(C/P)*H*e for RING RS. */
TPF_API tpf_status tpf_layout_registered_bytes(const tpf_layout_desc *d, uint64_t *bytes);
/* Bytes the active layout names (a prefix of the registration): T*H*e or (2P-1)*(T/P)*H*e. */
TPF_API tpf_status tpf_layout_active_bytes(const tpf_layout_desc *d, uint64_t *bytes);
/* Number of chunks/slots/blocks of the active layout: P, 2P-1 (RING RS) or S (PIPELINE). */
TPF_API tpf_status tpf_layout_chunk_count(const tpf_layout_desc *d, int *count);
/* Chunk/slot/block j of the active layout (packed: chunk j at j*S_T). TPF_EINVAL for j out of
 * range. */
TPF_API tpf_status tpf_layout_chunk(const tpf_layout_desc *d, int j, tpf_region *out);
/* This rank's shard: AG/BULK chunk r (the local input); RING RS: slot P-1 (its own partial);
 * PIPELINE and BULK RS: rows [r*T/P, (r+1)*T/P) of the buffer = chunk r of a [T, H] layout. */
TPF_API tpf_status tpf_layout_local(const tpf_layout_desc *d, tpf_region *out);
/* The smallest legal active row count >= rows for d's capacity (d->active is ignored): divisible
 * by P, every chunk, slot and pipeline block 16-byte aligned (docs/SPEC.md §3); rows 0 counts as
 * 1 (fp8 layouts too: 1-byte elements, so chunks of 16 elements). Use it to pad a microbatch: T =
 * 1000 with P = 8, H = 4, bf16 gives 1008. TPF_ECAPACITY when no legal count <= C exists, with both
 * numbers in the detail. */
TPF_API tpf_status tpf_layout_legal_rows(const tpf_layout_desc *d, uint64_t rows, uint64_t *legal);

/* ---- Communicators -------------------------------------------------------------------------- */

typedef struct tpf_backend tpf_backend;
typedef struct tpf_comm tpf_comm;

/* How the ranks of a group that live in different processes find each other: the CUDA backend's
 * (tpf_cuda_backend_create) and the simulator's process mode (tpf_sim_backend_create). allgather:
 * every rank contributes bytes_per_rank bytes from send; recv receives tp_size * bytes_per_rank
 * bytes in rank order. Both calls are collective, bounded by the bootstrap's own timeout, and
 * return TPF_OK or a failure naming the rank that did not come (tpf_last_error). device is the
 * CUDA device of the rank (the simulator ignores it). */
typedef struct {
  int tp_size, rank, device; /* P, r, the CUDA device this rank uses */
  tpf_status (*allgather)(void *ctx, const void *send, void *recv, size_t bytes_per_rank);
  tpf_status (*barrier)(void *ctx);
  void *ctx;
} tpf_bootstrap;
typedef struct tpf_cost_table tpf_cost_table; /* tpflex_cost.h */

/* How a communicator picks an operation's schedule. FIXED: num_splits and aggregate as
 * configured (the 0.1 behaviour). ADAPTIVE: per active shape and GEMM size, the fastest
 * candidate the cost model predicts (tpflex_cost.h: tpf_plan_predict, tpf_comm_plan_info). */
typedef enum { TPF_PLAN_FIXED = 0, TPF_PLAN_ADAPTIVE = 1 } tpf_plan_mode;

/* Versioned (NCCL's ncclConfig_t style): start from TPF_COMM_CONFIG_INIT, which sets size.
 * Only the sizes of released layouts are accepted (today 0.2's, sizeof(tpf_comm_config)); a
 * caller built against an older released header passes its smaller size and gets the defaults
 * of the fields it does not know; size 0 means "this header's layout" (code written for 0.1,
 * whose struct had no size field, keeps compiling and working with designated initializers).
 * Any other size (one that ends inside a field, or a newer library's) is refused with
 * TPF_EINVAL naming the size and the accepted ones. The same holds for every versioned struct
 * (tpf_op_options, tpf_sim_config, tpf_fault_plan, tpf_cuda_enqueue_stats). */
typedef struct {
  size_t size;                /* sizeof(tpf_comm_config), or 0 (see above) */
  const char *name;           /* site name ("fc1_fprop"); copied; unique within a manager */
  tpf_algo algo;              /* algorithm */
  tpf_coll coll;              /* collective */
  tpf_dtype dtype;            /* buffer dtype (fp8: 1-byte elements, SPEC §11) */
  tpf_shape capacity;         /* [C, H], registered once */
  int num_splits;             /* see tpf_layout_desc; 0 = default */
  bool aggregate;             /* RING AG only */
  bool external;              /* managed outside tpflex: stays at capacity under the manager */
  tpf_plan_mode plan;         /* FIXED (0, default) or ADAPTIVE */
  const tpf_cost_table *cost; /* ADAPTIVE: the cost table, copied at creation */
} tpf_comm_config;
#define TPF_COMM_CONFIG_INIT                                                                       \
  {                                                                                                \
    sizeof(tpf_comm_config), NULL, TPF_ALGO_BULK, TPF_COLL_AG, TPF_BF16, {0, 0}, 0, false, false,  \
        TPF_PLAN_FIXED, NULL                                                                       \
  }

/* Creates a communicator and registers its buffer at capacity. Collective: every rank of the
 * group calls it with the same configuration, in the same order. The registration is zeroed.
 * Before registering, the ranks exchange a fingerprint of everything that shapes the bytes (algo,
 * coll, dtype, capacity, num_splits, aggregate, plan mode and cost table, external, name): any
 * difference fails the call on every rank with TPF_EMISMATCH naming the first differing field
 * and both values ("num_splits differs: 4 on rank 0, 8 on rank 1"); nothing is registered.
 * A rank whose call fails a local check (NULL out or name, bad enum or size; in
 * tpf_manager_add a duplicate name) still takes part in the exchange: it returns its own
 * TPF_EINVAL, every other rank TPF_EMISMATCH naming it, and the next creation works on all.
 * A registration that fails on one rank (out of device memory, a CUDA error) fails on every
 * rank too: the failed rank returns its status, the others the same status naming that rank
 * (CUDA backend: tpflex_cuda.h); nothing stays registered, and the next creation works.
 * TPF_EINVAL (NULL, bad enum, bad size), shape statuses for a capacity that breaks
 * docs/SPEC.md §3, TPF_EMISMATCH, TPF_ETIMEOUT (a rank never arrived), TPF_ENOMEM,
 * TPF_EBACKEND. */
TPF_API tpf_status tpf_comm_create(tpf_backend *be, const tpf_comm_config *cfg, tpf_comm **out);
/* Waits for its operations, deregisters and frees. NULL and a destroyed communicator are
 * TPF_EINVAL. A communicator of a manager leaves it (tpf_manager_count drops by one): that is
 * how a failed one is replaced, on every rank: tpf_comm_destroy, then tpf_manager_add again.
 * Refused by the thread rule (TPF_ESTATE, another thread inside a call of the rank), it changes
 * nothing: c stays usable and registered; call it again. */
TPF_API tpf_status tpf_comm_destroy(tpf_comm *c);
/* Makes `active` the shape of the operations enqueued after this call; local, no communication,
 * no allocation. On failure nothing changes. Statuses of docs/SPEC.md §3; TPF_ESTATE after a
 * timeout. */
TPF_API tpf_status tpf_comm_set_active_shape(tpf_comm *c, tpf_shape active);
/* Current active shape (== capacity until the first set); {0,0} for NULL or destroyed. */
TPF_API tpf_shape tpf_comm_active_shape(const tpf_comm *c);
TPF_API tpf_shape tpf_comm_capacity_shape(const tpf_comm *c);
/* Number of successful set_active_shape calls (the shape epoch); 0 for NULL or destroyed. */
TPF_API uint64_t tpf_comm_epoch(const tpf_comm *c);
/* The configuration it was created with (name points into the communicator). */
TPF_API const tpf_comm_config *tpf_comm_config_of(const tpf_comm *c);
/* Active buffer view: [T, H] (RING RS: all 2P-1 slots, [(2P-1)*T/P, H]). */
TPF_API tpf_status tpf_comm_buffer(tpf_comm *c, tpf_matrix *full);
/* This rank's [T/P, H] view (see tpf_layout_local). */
TPF_API tpf_status tpf_comm_local_chunk(tpf_comm *c, tpf_matrix *local);
/* As tpf_layout_legal_rows for this communicator, with its backend's alignment; external
 * communicators answer their capacity rows. */
TPF_API tpf_status tpf_comm_legal_rows(const tpf_comm *c, uint64_t rows, uint64_t *legal);
/* The whole registered data region (capacity bytes). */
TPF_API tpf_status tpf_comm_registration(tpf_comm *c, void **base, uint64_t *bytes);
/* The backend's name ("sim", "cuda") and capability bits (tpflex_backend.h, TPF_BE_CAP_*: e.g.
 * whether the registration is host memory). NULL / 0 for NULL or a destroyed communicator. */
TPF_API const char *tpf_comm_backend_name(const tpf_comm *c);
TPF_API unsigned tpf_comm_backend_caps(const tpf_comm *c);

/* Completion and errors (NCCL's ncclCommGetAsyncError / ncclCommAbort model). Errors of enqueued
 * operations are deferred per communicator: a failure is reported only on the communicator whose
 * operation caused it, never on another communicator of the same backend.
 *
 * tpf_comm_sync: waits on the host until every operation enqueued on c has completed (CUDA:
 * its streams; the simulator completes operations before returning, so nothing is waited for)
 * and returns the deferred status: TPF_OK, or the first failure of those operations (which also
 * leaves c failed: later operations return TPF_ESTATE). Local, not collective. Call it from the
 * thread that issues c's operations.
 *
 * tpf_comm_async_error: stores in *out the deferred status of the operations already enqueued
 * on c, without waiting (TPF_OK while none has failed so far). Returns TPF_EINVAL for NULL
 * arguments and TPF_ESTATE after an abort; otherwise TPF_OK. Same thread rule as sync.
 *
 * A rank's own failure of an operation (a CUDA or cuBLASLt error, out of memory) leaves its
 * communicator failed; on the CUDA backend with the ranks as threads of one process, its peers'
 * waits on that communicator then give up at once with TPF_ESTATE naming the rank and quoting its
 * failure (in that operation or the next), instead of waiting for their timeout.
 *
 * tpf_comm_abort: unblocks a group stuck on a dead peer. A rank of c blocked in a wait for a
 * peer (handshake, receive, barrier) gives up promptly with TPF_ESTATE instead of waiting for
 * its timeout, and from then on every call on c (operations, set_active_shape, sync,
 * async_error) returns TPF_ESTATE with a detail saying it was aborted; only tpf_comm_destroy
 * remains useful (it is still collective). Call it on every rank that should stop: each rank's
 * communicator is aborted separately. Thread-safe: may be called from any thread, also while
 * the rank's own thread is blocked in an operation on c (a watchdog); it never blocks and
 * allocates nothing. Idempotent. TPF_EINVAL for NULL. */
TPF_API tpf_status tpf_comm_sync(tpf_comm *c);
TPF_API tpf_status tpf_comm_async_error(tpf_comm *c, tpf_status *out);
TPF_API tpf_status tpf_comm_abort(tpf_comm *c);

/* ---- Operations ------------------------------------------------------------------------------
 * `stream` is a cudaStream_t for CUDA and NULL for the simulator (which completes the operation
 * before returning). Operand rules: w and x have the buffer's dtype (bf16, fp16 or fp32); outputs
 * may be the buffer dtype or fp32. FP8 (SPEC §11): an fp8 GEMM takes two fp8 operands, E4M3 x
 * E4M3, E4M3 x E5M2 or E5M2 x E4M3 (E5M2 x E5M2: TPF_EUNSUPPORTED, as cuBLASLt on Hopper), and
 * writes D in bf16, fp16 or fp32; ag_gemm on an fp8 buffer takes an fp8 w; gemm_rs takes fp8 x
 * and w on a bf16/fp16/fp32 communicator (the partials are kept and reduced in fp32/its dtype),
 * an fp8 RS buffer is refused (TPF_EUNSUPPORTED); bulk takes fp8 a and b. A scale set for an
 * operand that is not fp8 is TPF_EINVAL. Shapes are checked against the active shape: TPF_ESHAPE
 * with the expected and given shapes in the detail. An operation failing with TPF_ETIMEOUT leaves
 * the communicator failed: every later operation returns TPF_ESTATE. The output must not share a
 * byte with any other operand (w, x, a, b, the bias, the fp8 scales a_scale_inv and
 * w_scale_inv; extents from each operand's rows, ld and dtype, one float for a scale):
 * TPF_EINVAL naming both, before anything runs. Inputs may overlap each other (both are only
 * read); no operand (bias and scales included) may overlap the registration. */

/* Per-operation options (0.2), versioned like tpf_comm_config: start from TPF_OP_OPTIONS_INIT.
 * A NULL options pointer means the defaults, which are the 0.1 behaviour. With op(a) = a, or a^T
 * when trans_a, and op(w) = w^T, or w when trans_w, every operation computes
 *
 *     D = act(alpha * op(a) op(w) + beta * D + bias)      (fp32 math, one rounding to D's dtype)
 *
 * where a is the operation's activation (ag_gemm: the gathered buffer; gemm_rs: x; bulk: a), w
 * its weight (bulk: b), bias is added to every row, act is GELU (tanh form, as cuBLASLt's
 * epilogue) when gelu is set and the identity otherwise. For gemm_rs, alpha * op(a) op(w) is the
 * sum over ranks, and beta, bias and GELU apply once, to the reduced rows this rank owns. The
 * output dtype is D's own dtype field (the buffer's dtype or fp32): a second field could only
 * contradict the matrix. */
typedef struct {
  size_t size;      /* sizeof(tpf_op_options) or 0 (this header's); others: TPF_EINVAL */
  bool trans_a;     /* a is stored [K, M] and used transposed (gemm_rs x, bulk a; not ag_gemm) */
  bool trans_w;     /* w is stored [K, N] and used as is: dgrad dY*W, wgrad dY^T*X (trans_a too) */
  float alpha;      /* scales the product; default 1 */
  float beta;       /* != 0 reads D before writing it (accumulation, e.g. wgrad); default 0 */
  const void *bias; /* NULL, or N elements of D's dtype (host memory for the simulator, device
                     * memory for CUDA), added to every row before act */
  bool gelu;        /* act = GELU (0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))) */
  int num_splits;   /* this operation's split count (any the active shape allows: see
                     * tpf_layout_desc; RING AG P/2 is the aggregate variant); 0 = the
                     * communicator's (or the adaptive planner's) choice */
  /* ---- Appended after 0.2 (SPEC §11); 0.2's size, offsetof(a_scale_inv), stays accepted ---- */
  const float *a_scale_inv; /* fp8 a (ag_gemm: the buffer; gemm_rs: x; bulk: a): one float,
                             * the per-tensor dequantisation scale (TE's Float8Tensor scale_inv),
                             * device memory for CUDA, host memory for the simulator; NULL = 1 */
  const float *w_scale_inv; /* the same for an fp8 w (bulk: b) */
} tpf_op_options;
#define TPF_OP_OPTIONS_INIT                                                                        \
  { sizeof(tpf_op_options), false, false, 1.0f, 0.0f, NULL, false, 0, NULL, NULL }

/* RING AG: the local shard is already in tpf_comm_local_chunk; w is [N, H] ([H, N] with
 * trans_w); d is [T, N]. Afterwards the buffer holds AG(X) = [T, H] and d = AG(X) * op(w). */
TPF_API tpf_status tpf_ag_gemm_ex(tpf_comm *c, const tpf_matrix *w, tpf_matrix *d,
                                  const tpf_op_options *opt, void *stream);
/* RING RS or PIPELINE RS: x is [T, K] ([K, T] with trans_a), w is [H, K] ([K, H] with trans_w),
 * out is [T/P, H]: out = rows [r*T/P, (r+1)*T/P) of sum over ranks of op(x) * op(w). */
TPF_API tpf_status tpf_gemm_rs_ex(tpf_comm *c, const tpf_matrix *x, const tpf_matrix *w,
                                  tpf_matrix *out, const tpf_op_options *opt, void *stream);
/* BULK: the collective runs on the buffer in place (AG: local chunk r in, [T, H] out; RS: [T, H]
 * partials in, chunk r reduced) while d = op(a) * op(b) runs beside it. op(a) is [M, K], op(b)
 * is [K, N], d is [M, N]; a, b, d must not alias the registration. num_splits must be 0. */
TPF_API tpf_status tpf_bulk_overlap_ex(tpf_comm *c, const tpf_matrix *a, const tpf_matrix *b,
                                       tpf_matrix *d, const tpf_op_options *opt, void *stream);
/* The 0.1 names: the same operations with the default options. */
TPF_API tpf_status tpf_ag_gemm(tpf_comm *c, const tpf_matrix *w, tpf_matrix *d, void *stream);
TPF_API tpf_status tpf_gemm_rs(tpf_comm *c, const tpf_matrix *x, const tpf_matrix *w,
                               tpf_matrix *out, void *stream);
TPF_API tpf_status tpf_bulk_overlap(tpf_comm *c, const tpf_matrix *a, const tpf_matrix *b,
                                    tpf_matrix *d, void *stream);

/* ---- Operand rules ---------------------------------------------------------------------------
 * The operations' rules on their operands' shapes and dtypes (the paragraphs above), as one pure
 * function of a descriptor: the operations run it on their arguments, and a binding runs it
 * before it allocates an output (Python calls it once per new operand signature), so the two
 * cannot differ. It reads no pointer and no object: operand pointers (a matrix's ptr, NULL
 * checks, overlaps, the registration) and the backend's capabilities are the operation's own
 * checks. */
/* The three operations (also the kind of a backend's operation key, tpflex_backend.h). */
typedef enum { TPF_OP_AG_GEMM = 1, TPF_OP_GEMM_RS = 2, TPF_OP_BULK = 3 } tpf_op_kind;

typedef struct {
  size_t size;            /* sizeof(tpf_operands) or 0 (this header's); others: TPF_EINVAL */
  tpf_op_kind op;         /* which operation's rules */
  tpf_dtype buffer_dtype; /* the communicator's dtype (bulk: unused) */
  tpf_shape active;       /* the communicator's active shape [T, H] (bulk: unused) */
  int tp_size;            /* P (gemm_rs: out has T/P rows) */
  bool trans_a, trans_w;  /* as in tpf_op_options */
  bool a_scale, w_scale;  /* a_scale_inv / w_scale_inv is set */
  /* The operands, by role, with ptr ignored: a = gemm_rs x or bulk a (ag_gemm: unused, its
   * activation is the buffer), w = the weight (bulk: b), d = the output; NULL a or w is
   * TPF_EINVAL, NULL d means not given yet (a binding allocates it; *out is its shape). */
  const tpf_matrix *a, *w, *d;
  /* How the messages name them; NULL: this API's names ("input x", "weight w", ...). */
  const char *a_name, *w_name, *d_name;
} tpf_operands;

/* Checks the operands of one operation (see above); on success writes the output's shape
 * ([T, N] for ag_gemm, [T/P, H] for gemm_rs, [M, N] for bulk) to *out when out is not NULL.
 * Changes nothing but tpf_last_error(); the detail names the operand, its shape or dtype and
 * what was expected, without a communicator name (the operations prefix theirs). Returns
 * TPF_ESHAPE (shapes, leading dimensions), TPF_EINVAL (dtypes, fp8 pairs, scales, a NULL
 * descriptor or operand), TPF_EUNSUPPORTED (ag_gemm's trans_a, e5m2 x e5m2) or TPF_EOVERFLOW
 * (an operand's rows times ld beyond 64 bits). */
TPF_API tpf_status tpf_check_operands(const tpf_operands *ops, tpf_shape *out);

/* ---- Manager -------------------------------------------------------------------------------- */

typedef struct tpf_manager tpf_manager;
TPF_API tpf_status tpf_manager_create(tpf_backend *be, tpf_manager **out);
/* Creates a communicator owned by the manager; TPF_EINVAL for a duplicate name. */
TPF_API tpf_status tpf_manager_add(tpf_manager *m, const tpf_comm_config *cfg, tpf_comm **out);
/* TPF_EINVAL when no communicator has that name. */
TPF_API tpf_status tpf_manager_get(tpf_manager *m, const char *name, tpf_comm **out);
/* Applies `active` to every eligible communicator (every one not external), all-or-nothing:
 * all are validated first; on any failure none changes and the detail names the communicator.
 * A communicator left failed by an earlier operation (a timeout, a canary violation) refuses
 * with TPF_ESTATE naming its original failure; the manager recovers when that communicator is
 * replaced (tpf_comm_destroy it and tpf_manager_add it again, on every rank). Another thread
 * inside a call on any communicator of the rank: TPF_ESTATE naming the thread rule, before any
 * communicator changed. */
TPF_API tpf_status tpf_manager_set_active_shape(tpf_manager *m, tpf_shape active);
/* Number of communicators, and the i-th in creation order. */
TPF_API int tpf_manager_count(const tpf_manager *m);
TPF_API tpf_status tpf_manager_at(tpf_manager *m, int i, tpf_comm **out);
/* Destroys every communicator, then the manager. Refused by the thread rule (TPF_ESTATE), it
 * changes nothing: the manager and all its communicators stay. */
TPF_API tpf_status tpf_manager_destroy(tpf_manager *m);

/* One site's geometry for its active shape: everything tpf_comm_buffer, tpf_comm_local_chunk,
 * tpf_comm_active_shape, tpf_comm_epoch and tpf_comm_registration answer, computed by the core's
 * layout rules (core/layout.c) in one place. Offsets are bytes from `base`; every view is
 * row-major with ld = H elements. Versioned as tpf_comm_stats: the caller sets size. */
typedef struct {
  size_t size;               /* sizeof(tpf_site_geometry) as the caller compiled it; 0: this one */
  tpf_comm *comm;            /* the site */
  const char *name;          /* its name (points into the communicator) */
  uint64_t epoch;            /* tpf_comm_epoch: successful shape changes so far */
  tpf_shape active;          /* [T, H]: the active shape (an external site: its capacity) */
  tpf_dtype dtype;           /* element type of every view */
  void *base;                /* first byte of the registration (tpf_comm_registration) */
  uint64_t registered_bytes; /* the whole registration (capacity) */
  uint64_t ld;               /* elements between rows of every view: H */
  uint64_t buffer_off_bytes; /* tpf_comm_buffer: always 0 */
  uint64_t buffer_bytes;     /* every slot of the active layout */
  uint64_t buffer_rows;      /* T (RING RS: all 2P-1 slots, (2P-1) * T/P) */
  uint64_t chunk_off_bytes;  /* tpf_comm_local_chunk: this rank's shard */
  uint64_t chunk_bytes;      /* (T/P) * H * element size */
  uint64_t chunk_rows;       /* T/P */
  uint64_t chunk_row_off;    /* chunk_off_bytes in rows of H elements (RING RS: (P-1) * T/P) */
} tpf_site_geometry;
/* Fills out[0 .. *n) with the geometry record of every communicator of m, in creation order
 * (tpf_manager_at), for the shapes active now: one call after a shape change gives a binding
 * every view it needs. out[0].size is the caller's sizeof(tpf_site_geometry) (0: this header's);
 * the records are that many bytes apart, and each gets that size. out == NULL with cap == 0 only
 * sets *n to the number of communicators. A read: call it from the thread that changes shapes.
 * TPF_EINVAL (nothing written, *n untouched): m not live, n NULL, cap < 0, out NULL with
 * cap > 0, out[0].size not 0 or a released size, or cap below the number of communicators (the
 * detail names both counts). */
TPF_API tpf_status tpf_manager_geometry(tpf_manager *m, tpf_site_geometry *out, int cap, int *n);

/* ---- Telemetry (SPEC §16) -------------------------------------------------------------------
 * Counters per communicator and rank, kept by the core at the one point where an operation is
 * accepted (the backend took it: on CUDA enqueued, on the simulator run). Cheap enough to leave
 * on: a few additions and one pass over this rank's schedule steps per operation, no allocation,
 * no lock, no synchronization. An operation refused before it reached the backend (bad operands,
 * an illegal split count, a mismatch) counts nothing.
 *
 * Bytes moved are this rank's payload to or from its peers as the schedule names it: SEND bytes
 * plus the peer views a PEER_REDUCE reads (the simulator's tpf_sim_stats.bytes_moved, summed
 * over the ranks, counts the same). padded_rows and padded_bytes are what a pad-to-capacity run
 * (T = C for every operation) would have run and moved: the operation's rows and bytes scaled
 * by C / T (every schedule's payload is proportional to T at a fixed split count).
 *
 * Schedules chosen: per power-of-two bucket of T (bucket b holds 2^b <= T < 2^(b+1); the last
 * bucket holds every larger T), the first TPF_STATS_SCHEDULES distinct (num_splits, aggregate)
 * the operations of that bucket ran, each with its count; later distinct ones count in
 * other_ops. An adaptive communicator's choice shows here; a fixed one shows its own.
 *
 * Threads: the counters belong to the rank's thread that runs c's operations (tpflex.h, one
 * thread per rank at a time); read and reset them from that thread, between operations. */
#define TPF_STATS_BUCKETS 32
#define TPF_STATS_SCHEDULES 4
typedef struct {
  int32_t num_splits; /* 0: unused slot */
  int32_t aggregate;  /* 1: the RING AG aggregate variant */
  uint64_t ops;       /* operations of the bucket that ran this schedule */
} tpf_stats_schedule;
typedef struct {
  uint64_t ops;                                      /* operations with T in the bucket */
  uint64_t rows;                                     /* their T, summed */
  tpf_stats_schedule schedules[TPF_STATS_SCHEDULES]; /* first distinct schedules, in order */
  uint64_t other_ops;                                /* operations that ran none of those */
} tpf_stats_bucket;
typedef struct {
  size_t size;            /* sizeof(tpf_comm_stats) as the caller compiled it; 0: this header's */
  uint64_t ops;           /* operations accepted */
  uint64_t rows;          /* active rows T, summed over them */
  uint64_t padded_rows;   /* capacity rows C, summed over them: the pad-to-capacity run */
  uint64_t bytes;         /* bytes this rank moved to or from peers (see above) */
  uint64_t padded_bytes;  /* the same at capacity (see above) */
  uint64_t shape_changes; /* successful set_active_shape calls (direct or by the manager) */
  tpf_stats_bucket buckets[TPF_STATS_BUCKETS];
} tpf_comm_stats;
/* The bucket of T (floor(log2 T), at most TPF_STATS_BUCKETS - 1; 0 for T <= 1). */
TPF_API int tpf_stats_bucket_of(uint64_t rows);
/* Fills *out (up to out->size bytes; the caller sets size, or 0 for this header's layout) with
 * c's counters since creation or the last reset. TPF_EINVAL for a communicator that is not live,
 * NULL out, or a size that is not 0 or sizeof(tpf_comm_stats) (the detail names both); *out is
 * untouched then. */
TPF_API tpf_status tpf_comm_get_stats(const tpf_comm *c, tpf_comm_stats *out);
/* Zeroes c's counters. TPF_EINVAL for a communicator that is not live. */
TPF_API tpf_status tpf_comm_reset_stats(tpf_comm *c);

#ifdef __cplusplus
}
#endif
#endif /* TPFLEX_H */
