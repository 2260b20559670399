/* tpflex backend ABI: schedules as data, and the ops table a backend implements.
 *
 * The core computes; backends move bytes. Every offset, length, peer, stream and dependency of
 * an operation is produced by the core as a tpf_schedule (a list of steps per rank) and checked
 * by the core's independent checker in tests and fuzzing. A backend executes the steps in the
 * stream/event pattern a GPU would use: steps on one stream run in order; a step also waits for
 * the steps listed in deps (which may be on other streams of the same rank). Cross-rank ordering
 * comes only from SEND/RECV/BARRIER/HANDSHAKE flags.
 *
 * Flags. Every registration carries, per peer, TPF_MAX_TAGS monotonic 64-bit flags and two ready
 * words (one per sequence parity, see Handshake). The k-th operation on a communicator has sequence
 * number seq = k (1-based). A SEND with tag t to peer q raises q's flag [me][t] to seq after its
 * bytes have landed; the matching RECV on q waits until flag [sender][t] >= seq. BARRIER with tag t
 * raises flag [me][t] on every peer and waits for every peer's flag [peer][t] >= seq. Monotonic
 * values mean no counter is ever reset, so an operation that is retried or skipped cannot leave a
 * flag drifting (TE's adder bug).
 *
 * Handshake. Step 0 of every schedule of P > 1 is HANDSHAKE (at P = 1 the schedule is the
 * operation's one GEMM, with no handshake and no peer step): the rank writes its ready word
 * TPF_READY_WORD(seq, op_key, active_rows) into every peer's registration and waits until every
 * peer's ready word carries seq, then compares the key (operation kind, split count) and rows.
 * Ready words are kept per sequence parity (slot seq & 1): a peer may announce seq+1 before a slow
 * rank has read its announcement of seq, but never seq+2, which needs the slow rank's own
 * announcement of seq+1. Any difference fails the operation with TPF_EMISMATCH on every rank before
 * any byte moves. A rank writes ready(seq) only after its operation seq-1 finished, so no peer
 * writes into a buffer its owner still reads (the WAR hazard TE leaves open). Pull-style schedules
 * (PIPELINE RS, BULK RS) end with a BARRIER so that peers finish reading a buffer before its owner
 * may reuse it.
 */
#ifndef TPFLEX_BACKEND_H
#define TPFLEX_BACKEND_H

#include "tpflex.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The ops table's version (SQLite's iVersion): a backend fills abi_version with the version it
 * was written for, and the core accepts every version from TPF_BACKEND_ABI_MIN: it reads only
 * the fields that version has, and treats the later ones as absent (NULL, no capability).
 * Every struct a backend sees (tpf_step, tpf_mref, tpf_schedule, tpf_exec_args, the ops table,
 * tpf_backend) is append-only: a field is added at the end (or in padding the old layout left
 * unused, as tpf_step.flags), never between two existing ones, so a backend compiled against
 * the 0.1 header reads every field it knows at its 0.1 offset. tests/unit/test_abi1.c compiles a
 * backend against the released 0.1 header (tests/support/abi1/) and checks it.
 *   1 (0.1): up to `sync`.
 *   2 (0.2): reg_sync, reg_async_error, reg_abort, allgather; step flags and the epilogue (only
 *            with TPF_BE_CAP_OPTIONS); the ready word with the operation key. */
#define TPF_BACKEND_ABI_VERSION 2
#define TPF_BACKEND_ABI_MIN 1
#define TPF_MAX_RANKS 64    /* P limit of every backend */
#define TPF_MAX_TAGS 128    /* flags per (sender, receiver) pair per registration */
#define TPF_MAX_SPLITS 64   /* num_splits limit */
#define TPF_STEP_MAX_DEPS 4 /* cross-stream dependencies per step */
#define TPF_NUM_STREAMS 5   /* see tpf_stream_id */
#define TPF_MAX_COMPUTE_STREAMS 3

/* The ready word (0.2): sequence number in the top 16 bits (mod 2^16), the operation key in the
 * next 8 and the active rows in the low 40. Rows are limited to 2^40 - 1 at communicator
 * creation. The key (tpf_schedule.op_key, TPF_OP_KEY) names the operation kind and its split
 * count, so ranks whose operations would move different bytes for the same rows fail the
 * handshake: a backend compares TPF_READY_BODY (key and rows) and reports both halves. */
#define TPF_READY_SEQ_BITS 16
#define TPF_READY_KEY_BITS 8
#define TPF_READY_ROWS_BITS 40
#define TPF_READY_SEQ_MASK 0xFFFFull
#define TPF_READY_BODY_MASK ((1ull << (TPF_READY_KEY_BITS + TPF_READY_ROWS_BITS)) - 1)
#define TPF_READY_WORD(seq, key, rows)                                                             \
  ((((uint64_t)(seq)&TPF_READY_SEQ_MASK) << (TPF_READY_KEY_BITS + TPF_READY_ROWS_BITS)) |          \
   (((uint64_t)(key)&0xFFull) << TPF_READY_ROWS_BITS) |                                            \
   ((uint64_t)(rows) & ((1ull << TPF_READY_ROWS_BITS) - 1)))
#define TPF_READY_SEQ(word) ((uint64_t)(word) >> (TPF_READY_KEY_BITS + TPF_READY_ROWS_BITS))
#define TPF_READY_KEY(word) (((uint64_t)(word) >> TPF_READY_ROWS_BITS) & 0xFFull)
#define TPF_READY_ROWS(word) ((uint64_t)(word) & ((1ull << TPF_READY_ROWS_BITS) - 1))
#define TPF_READY_BODY(word) ((uint64_t)(word)&TPF_READY_BODY_MASK)

/* The operation key: its kind (tpf_op_kind, tpflex.h) in the top 2 bits, splits - 1 in the low
 * 6 (splits 1..TPF_MAX_SPLITS). */
#define TPF_OP_KEY(kind, splits)                                                                   \
  ((uint8_t)((((unsigned)(kind)&3u) << 6) | (((unsigned)(splits)-1u) & 63u)))
#define TPF_OP_KEY_KIND(key) (((unsigned)(key) >> 6) & 3u)
#define TPF_OP_KEY_SPLITS(key) (((unsigned)(key)&63u) + 1u)

typedef enum {
  TPF_STEP_HANDSHAKE = 0, /* P > 1: ready word (seq, op key, rows) to every peer; compare theirs */
  TPF_STEP_GEMM,          /* d[m, n] = a[m, k] * w[n, k]^T in fp32 (flags: transposes, epilogue) */
  TPF_STEP_SEND,          /* bytes at src_off to peer's dst_off, then its flag [me][tag] = seq */
  TPF_STEP_RECV,          /* wait until my flag [peer][tag] >= seq: the matching SEND landed */
  TPF_STEP_REDUCE,        /* d[m, n] = sum_{t<count} my view a shifted by t*stride_bytes */
  TPF_STEP_PEER_REDUCE,   /* d[m, n] = sum_{t<count} view a of rank (me+t)%P's registration */
  TPF_STEP_BARRIER,       /* flag [me][tag] = seq on every peer; wait for all of theirs >= seq */
  TPF_STEP_KIND_COUNT
} tpf_step_kind;

typedef enum {
  TPF_STREAM_COMPUTE0 = 0, /* compute streams 0..2 (min(3, splits) are used) */
  TPF_STREAM_COMPUTE1 = 1,
  TPF_STREAM_COMPUTE2 = 2,
  TPF_STREAM_COMM = 3, /* communication: sends, barriers, the handshake and the collective
                        * (pull) reductions ("comm") */
  TPF_STREAM_RECV = 4, /* receive waits */
  TPF_STREAM_SEND = TPF_STREAM_COMM /* the 0.1 name, which undersold what the stream runs */
} tpf_stream_id;

typedef enum {
  TPF_MAT_NONE = 0,
  TPF_MAT_BUF, /* this rank's registration (PEER_REDUCE: the peer's), as a view */
  TPF_MAT_X,   /* the operation's activation input (gemm_rs x, bulk a) */
  TPF_MAT_W,   /* the weight (ag_gemm w, gemm_rs w, bulk b) */
  TPF_MAT_D    /* the operation's output (ag_gemm d, gemm_rs out, bulk d) */
} tpf_operand_id;

/* A sub-matrix reference. For TPF_MAT_BUF the view starts at off_bytes with leading dimension ld
 * (elements, buffer dtype); for user matrices off_bytes is 0 and ld 0 means "the matrix's own
 * ld". Element (i, j) of the reference is element (row + i, col + j) of that view. */
typedef struct {
  uint8_t id;         /* tpf_operand_id */
  uint64_t off_bytes; /* BUF: view start in the registration */
  uint64_t ld;        /* BUF: view leading dimension in elements */
  uint64_t row, col;  /* first element */
} tpf_mref;

/* Step flags (0.2), set by the core from the operation's options before the backend sees the
 * schedule. TRANS_A / TRANS_W: the GEMM operand a / w is a sub-matrix of a stored-transposed
 * user matrix: its reference (row, col) names the stored element where the [k, m] / [k, n]
 * block starts, and the backend uses the block transposed (cuBLASLt's op flags). EPILOGUE: the
 * step writes the operation's output D and applies tpf_exec_args.epi to what it writes. */
enum { TPF_STEP_TRANS_A = 1u << 0, TPF_STEP_TRANS_W = 1u << 1, TPF_STEP_EPILOGUE = 1u << 2 };

/* Mechanisms as data (0.3): what a backend must do beside a step's bytes, chosen by the core when
 * it builds the schedule (core/schedule_mech.c, one table row per algorithm, as NCCL picks a
 * protocol per collective), checked by tpf_schedule_check and before every execute, so a backend
 * maps each value to its mechanism and decides nothing from the algorithm.
 * Transport classes: how a step that moves or combines bytes runs. */
typedef enum {
  TPF_XPORT_NONE = 0,      /* moves no bytes itself: HANDSHAKE, GEMM, RECV, BARRIER */
  TPF_XPORT_COPY_ENGINE,   /* SEND: a DMA copy (no SMs), which runs even after a failed handshake */
  TPF_XPORT_COPY_KERNEL,   /* SEND: a copy kernel of the backend's communication CTAs, which
                            * skips its bytes once the registration holds a failure */
  TPF_XPORT_REDUCE_KERNEL, /* REDUCE, PEER_REDUCE: the reduction kernel of those CTAs */
  TPF_XPORT_COUNT
} tpf_xport;

/* SM budgets of a GEMM step. */
typedef enum {
  TPF_SMS_ALL = 0,    /* every SM: nothing of this operation runs on SMs beside it */
  TPF_SMS_LEAVE_COMM, /* all but the backend's communication CTAs, which this operation's copy
                       * or reduction kernels use at the same time */
  TPF_SMS_COUNT
} tpf_sm_budget;

typedef struct {
  uint8_t kind;                     /* tpf_step_kind */
  uint8_t stream;                   /* tpf_stream_id */
  uint8_t ndeps;                    /* entries used in deps */
  uint8_t flags;                    /* TPF_STEP_* flags above; 0 = 0.1 semantics */
  uint16_t deps[TPF_STEP_MAX_DEPS]; /* indices of earlier steps of this rank to wait for */
  int32_t peer;                     /* SEND/RECV: the other rank; else -1 */
  uint32_t tag;                     /* SEND/RECV/BARRIER flag index, < TPF_MAX_TAGS */
  int32_t chunk;                    /* informational: chunk/slot/block this step is about */
  uint64_t src_off, dst_off, bytes; /* SEND/RECV: registration byte ranges */
  tpf_mref a, w, d;                 /* GEMM operands; REDUCE/PEER_REDUCE use a (source) and d */
  uint64_t m, n, k;                 /* GEMM dims; REDUCE: m rows x n cols, k unused */
  uint64_t stride_bytes;            /* REDUCE: distance between summed views */
  uint32_t count;                   /* REDUCE/PEER_REDUCE: number of summed views */
  /* ---- 0.3, in the tail padding 0.1 left (every size and offset above unchanged) ---- */
  uint8_t xport;     /* tpf_xport: SEND, REDUCE, PEER_REDUCE; TPF_XPORT_NONE elsewhere */
  uint8_t sm_budget; /* tpf_sm_budget: GEMM; TPF_SMS_ALL elsewhere */
} tpf_step;

/* One rank's schedule of one operation. */
typedef struct {
  int tp_size, rank;               /* P and r */
  tpf_algo algo;                   /* algorithm */
  tpf_coll coll;                   /* collective */
  tpf_dtype dtype;                 /* buffer dtype */
  int num_splits;                  /* resolved split count (GEMM chunks) */
  bool aggregate;                  /* RING AG aggregate variant */
  uint64_t rows, cols;             /* active T and H */
  uint64_t chunk_rows;             /* T/P */
  uint64_t chunk_bytes;            /* S_T = (T/P)*H*e */
  uint64_t registered_bytes;       /* capacity bytes */
  uint64_t active_bytes;           /* prefix the active layout names */
  uint64_t gemm_m, gemm_n, gemm_k; /* the operation's GEMM: [m,k] x [n,k]^T */
  int num_compute_streams;         /* compute streams used */
  int nsteps;                      /* steps used */
  tpf_step *steps;                 /* nsteps entries, owned by the schedule */
  /* ---- Appended in 0.2: every field above keeps its 0.1 offset (tests/unit/test_abi1.c) ---- */
  uint8_t op_key; /* TPF_OP_KEY of the operation (handshake) */
  /* ---- Appended in 0.3 ---- */
  /* The ranks whose ready word this rank's handshake must see on the device before its steps
   * run (bit q: rank q; never this rank; 0 at P = 1): every peer it exchanges bytes with, and
   * every peer when a BARRIER, a PEER_REDUCE or a copy kernel is in the schedule. A backend may
   * wait on more, never on fewer. */
  uint64_t handshake_peers;
} tpf_schedule;

/* GEMM dimensions an operation's schedule needs beside the layout. RING AG: n = N (weight rows),
 * k = H. RS: n = H, k = K. BULK: the independent GEMM's m, n, k. */
typedef struct {
  uint64_t m, n, k;
} tpf_gemm_dims;

/* Builds rank d->rank's schedule for the active shape of d (which must pass tpf_layout_check).
 * Allocates s->steps; free with tpf_schedule_free. TPF_EINVAL, layout statuses,
 * TPF_EUNSUPPORTED (e.g. aggregate with odd P), TPF_ENOMEM. */
TPF_API tpf_status tpf_schedule_build(const tpf_layout_desc *d, const tpf_gemm_dims *g,
                                      tpf_schedule *s);
TPF_API void tpf_schedule_free(tpf_schedule *s);
/* The independent checker: given all P ranks' schedules of one operation (scheds[r] is rank r's),
 * verifies that every output byte is produced exactly once, nothing touches bytes outside the
 * active layout, every SEND matches exactly one RECV (same bytes, offsets and tag), no step reads
 * a chunk before it has arrived, and the dependency lists only point backwards. On failure
 * returns TPF_EINVAL with the first violation in tpf_last_error(). */
TPF_API tpf_status tpf_schedule_check(const tpf_schedule *scheds, int tp_size);
/* Short names for printing: "GEMM", "SEND", ...; "compute0", "send", "recv". */
TPF_API const char *tpf_step_kind_name(int kind);
TPF_API const char *tpf_stream_name(int stream);

/* ---- The ops table -------------------------------------------------------------------------- */

typedef struct tpf_reg tpf_reg; /* a backend's registration (opaque to the core) */

/* Capabilities, reported by tpf_comm_backend_caps. Bits 0 and 2 were 0.1's ASYNC and CANARY,
 * which nothing read: they stay unused, so a 0.1 backend that sets them means nothing new. */
enum {
  TPF_BE_CAP_HOST_MEMORY = 1u << 1, /* registrations are host memory the caller may touch
                                     * (bindings read it: tensor views on the host) */
  TPF_BE_CAP_OPTIONS = 1u << 3,     /* honours step flags and tpf_exec_args.epi (ABI 2): without
                                     * it the core refuses non-default tpf_op_options with
                                     * TPF_EUNSUPPORTED before anything is enqueued */
  TPF_BE_CAP_FP8 = 1u << 4          /* runs fp8 GEMMs and honours tpf_exec_args.a_scale_inv /
                                     * w_scale_inv (SPEC §11); without it the core refuses
                                     * operations with fp8 GEMM operands (TPF_EUNSUPPORTED) */
};

/* The epilogue of the steps flagged TPF_STEP_EPILOGUE: they write
 * D[i, j] = act(alpha * v + beta * D[i, j] + bias[d.col + j]) for the value v they computed (the
 * GEMM product, or the sum of a REDUCE / PEER_REDUCE), in fp32, rounded once to D's dtype. */
typedef struct {
  float alpha, beta; /* 1 and 0 by default */
  const void *bias;  /* NULL or N elements of D's dtype; a step adds bias[d.col + j] */
  bool gelu;         /* tanh GELU, as tpf_gelu below */
} tpf_epilogue;

/* The operands of one operation, as the user passed them (already validated by the core). */
typedef struct {
  const tpf_schedule *sched; /* this rank's steps */
  const char *comm_name;     /* for messages */
  uint64_t seq;              /* operation sequence number on this communicator, from 1 */
  tpf_matrix x, w, d;        /* user operands (stored layout); ptr NULL when absent */
  tpf_epilogue epi;          /* for steps flagged TPF_STEP_EPILOGUE */
  /* ---- Appended after 0.2 (TPF_BE_CAP_FP8): the fp8 operands' per-tensor scales (NULL = 1):
   * every GEMM step computes sa * sw * sum(a * w) in fp32 before anything else (partials and D
   * alike), where sa = *a_scale_inv when its a is fp8, sw likewise for w ---- */
  const float *a_scale_inv;
  const float *w_scale_inv;
} tpf_exec_args;

typedef struct tpf_backend_ops {
  int abi_version;      /* TPF_BACKEND_ABI_VERSION */
  const char *name;     /* "sim", "cuda" */
  unsigned caps;        /* TPF_BE_CAP_* */
  uint64_t align_bytes; /* required alignment of chunk sizes and offsets */
  int max_ranks;        /* largest P */
  /* Collective over the group: allocate and register `bytes` of zeroed data plus flags; return
   * the backend's handle and this rank's data pointer. */
  tpf_status (*reg_create)(tpf_backend *be, const char *name, uint64_t bytes, tpf_reg **reg,
                           void **local);
  tpf_status (*reg_destroy)(tpf_backend *be, tpf_reg *reg);
  /* Told the prefix an active layout names after each successful set_active_shape (the sim fills
   * the rest with a canary). Must not allocate. May be NULL. */
  tpf_status (*reg_activate)(tpf_backend *be, tpf_reg *reg, uint64_t active_bytes);
  /* Execute one rank's schedule. Synchronous backends return when it is complete; asynchronous
   * ones when it is enqueued on `stream`. TPF_EUNSUPPORTED means "refused before the handshake,
   * nothing enqueued" (e.g. a capture the backend cannot record): the core then leaves the
   * communicator usable and does not consume the sequence number. */
  tpf_status (*execute)(tpf_backend *be, tpf_reg *reg, const tpf_exec_args *a, void *stream);
  /* Wait for everything enqueued on `stream` (NULL: all) and report a deferred error. */
  tpf_status (*sync)(tpf_backend *be, void *stream);
  /* ---- Added in 0.2 (same ABI version: appended, optional; NULL = unsupported/no-op) ---- */
  /* Wait on the host for every operation enqueued on `reg` and return its deferred status (the
   * first failure of those operations, TPF_OK if none). NULL: the core calls sync(be, NULL). */
  tpf_status (*reg_sync)(tpf_backend *be, tpf_reg *reg);
  /* The deferred status of operations already enqueued on `reg`, without waiting: *out gets
   * TPF_OK or the first failure. Kept per registration: a failure of another registration never
   * shows here. NULL: only failures returned by execute/sync are reported. */
  tpf_status (*reg_async_error)(tpf_backend *be, tpf_reg *reg, tpf_status *out);
  /* Thread-safe, callable while this rank's thread is blocked in execute on `reg`: make every
   * present and future wait of operations on `reg` give up promptly (TPF_ESTATE). Must not
   * allocate or block. NULL: waits end only at their timeout. */
  tpf_status (*reg_abort)(tpf_backend *be, tpf_reg *reg);
  /* Collective over the group, not tied to a registration, bounded by the backend's timeout:
   * every rank contributes `bytes` from mine; all receives P * bytes in rank order. The core
   * calls it at communicator creation, before reg_create, to compare configuration
   * fingerprints (a rank that never arrives is TPF_ETIMEOUT). NULL: no agreement check. */
  tpf_status (*allgather)(tpf_backend *be, const void *mine, void *all, size_t bytes);
} tpf_backend_ops;

/* Every backend object starts with this header; the core reads only these fields. */
struct tpf_backend {
  const tpf_backend_ops *ops; /* the backend's table */
  int tp_size;                /* P */
  int rank;                   /* r */
};

/* Records a failure detail for tpf_last_error() (printf-style); returns `s` for tail calls.
 * Backends use it at the edge where they translate a foreign error. */
TPF_API tpf_status tpf_set_error(tpf_status s, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Prepends a printf-style prefix to the current detail in place and returns `s`: the detail of a
 * failure below is kept whole, with the caller's context in front ("'fc1': " + "weight w ...").
 * The detail is never copied out first (formatting into the buffer one reads from was the bug
 * that made every caller copy it); a prefix the detail already starts with is not added twice.
 * The result is cut at the detail buffer's size, the prefix kept. */
TPF_API tpf_status tpf_prefix_error(tpf_status s, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Host reference numerics shared by backends and tests: convert one element to/from float. */
TPF_API float tpf_elem_to_float(tpf_dtype t, const void *p);
TPF_API void tpf_float_to_elem(tpf_dtype t, float v, void *p);
/* The epilogue's activation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). */
TPF_API float tpf_gelu(float x);
/* "ag_gemm/4 splits" for an op key, into buf (n >= 32); returns buf. For mismatch messages. */
TPF_API const char *tpf_op_key_name(uint8_t key, char *buf, size_t n);

#ifdef __cplusplus
}
#endif
#endif /* TPFLEX_BACKEND_H */
