/* The CUDA backend's shared state: what its rooms (cuda_backend.c lists them and who calls whom)
 * know of one another. The backend object and the registration are plain structs here, so that
 * each room reads the fields it needs; the functions below are the only calls between rooms.
 * C only (C11 atomics): the device code (cuda_kernels.cu) sees cuda_internal.h, not this. Files
 * that include it define _POSIX_C_SOURCE 200809L first (clock_gettime). */
#ifndef TPF_CUDA_STATE_H
#define TPF_CUDA_STATE_H

#include "cuda_internal.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

/* Flags live in 4 KiB-aligned blocks of their own, 4 KiB away from any data byte of this or a
 * neighbouring allocation (cudaMalloc packs small allocations next to each other), and every
 * sender's ready word has a 1 KiB slot of its own, like its row of flags: no transfer or kernel
 * that writes data ever shares a cache line or DMA block with a flag. */
#define TPF_CUDA_GUARD_BYTES 4096ull
#define TPF_CUDA_READY_STRIDE 2048ull

/* A sender's ready slot (TPF_CUDA_READY_STRIDE bytes in the owner's registration), by byte offset:
 *   0, 8     eager HANDSHAKE ready words, by sequence parity (host sequence numbers)
 *   16       memops HANDSHAKE word (monotonic host sequence number)
 *   32, 40   captured HANDSHAKE ready words, by device sequence parity
 *   48       in the owner's own slot only: the device sequence counter of captured operations
 *   1024     captured flags [tag] (TPF_MAX_TAGS words): SEND/RECV and BARRIER under replay
 * Captured operations (cuda_transport_flags.c, "graph") count on the device, so they have words
 * of their own: eager and replayed operations may alternate on one registration and each kind
 * stays monotonic. */
#define TPF_CUDA_SLOT_GRAPH_READY 32ull
#define TPF_CUDA_SLOT_GRAPH_SEQ 48ull
#define TPF_CUDA_SLOT_GRAPH_FLAGS 1024ull

/* One published event: the sequence number (or ready word) it was recorded for, and the event. */
typedef struct {
  _Atomic uint64_t word; /* sequence number (SEND, BARRIER) or TPF_READY_WORD (HANDSHAKE) */
  cudaEvent_t ev;        /* recorded before word was stored (release) */
  int32_t stream;        /* the publisher's schedule stream ev was recorded on */
  uint32_t order;        /* the publisher's count of events published in this operation, from 1:
                          * of two events on one stream, the larger order was recorded later */
} tpf_cuda_slot;

/* A virtual RECV's peer event as the lean enqueuer saw it published (cuda_exec.c). */
typedef struct {
  cudaEvent_t ev;
  int32_t peer, stream;
  uint32_t order;
} tpf_cuda_peer_ev;

/* The host table of an in-process group (cuda_transport_events.c). */
typedef struct {
  int nranks;
  tpf_cuda_slot *ready;   /* [rank][2]: by sequence parity */
  tpf_cuda_slot *sent;    /* [sender][receiver][tag] */
  tpf_cuda_slot *barrier; /* [rank][tag] */
  /* The first failed operation of the group on this registration (tpf_cuda__events_fail): the
   * claim goes to one rank, which fills the record and then stores failed = 1 + its rank. */
  _Atomic uint32_t failed_claim, failed;
  int32_t failed_status;
  uint64_t failed_seq;
  char failed_msg[200];
} tpf_cuda_sync;

typedef struct {
  uint64_t base;        /* the owner's device pointer (valid in the owner's process) */
  uint64_t alloc_bytes; /* whole allocation */
  uint64_t data_bytes;  /* registered data bytes */
  cudaIpcMemHandle_t handle;
  int32_t has_handle;
  int32_t rank;
  uint64_t sync; /* rank 0's tpf_cuda_sync * when the whole group is in this process */
} tpf_cuda_reg_info;

typedef struct tpf_cuda_transport tpf_cuda_transport;

/* The most events one dependency can need waits on (tpf_cuda__wait_plan). */
#define TPF_CUDA_WAIT_MAX 1024

struct tpf_reg {
  char name[64];
  uint64_t data_bytes, alloc_bytes, flags_off, ready_off;
  char *base;                     /* my allocation */
  char *peer_base[TPF_MAX_RANKS]; /* each rank's allocation, mapped in my context */
  bool peer_ipc[TPF_MAX_RANKS];   /* imported through CUDA IPC (closed at destroy) */
  bool remote;                    /* some rank of the group lives in another process */
  /* The transport to each peer (NULL for this rank), and the one the group's collective steps
   * (HANDSHAKE, BARRIER) use: every peer's today (tpf_cuda__transport_select). NULL when P = 1. */
  const tpf_cuda_transport *peer_tp[TPF_MAX_RANKS];
  const tpf_cuda_transport *tp;
  /* Transport state. */
  tpf_cuda_sync *sync;         /* events: the group's host table (rank 0's); else NULL */
  bool sync_owner;             /* events: this rank allocated sync (rank 0) */
  tpf_cuda_hostsync *hostsync; /* flags, ranks in other processes: host agreement; else NULL */
  cudaEvent_t ready_ev[2];     /* this rank's operation-start events, by parity */
  cudaEvent_t done_ev;         /* recorded on the caller's stream at the end of every operation (an
                                * external record node under capture, so replays record it too):
                                * reg_sync waits for it */
  atomic_int aborted;          /* tpf_comm_abort: host waits on this registration give up */
  tpf_status deferred;         /* first device-side failure of its operations (rank thread) */
  /* Its own device status area: the kernels of its operations report into it
   * and skip their work while it is set; no other registration reads it, so a failure belongs to
   * the communicator whose operation caused it. Mapped pinned memory and a device claim word. */
  tpf_cuda_status *status_host;
  tpf_cuda_status *status_dev;
  unsigned int *claim_dev;
  struct tpf_reg *next_memops;    /* memops transport: the backend's list (b->memops_regs) */
  struct tpf_cuda_timing *timing; /* device timing while profiling (cuda_timing.c), or NULL */
  struct tpf_reg *next_timed;     /* the backend's list of timed registrations (b->timed_regs) */
  atomic_int released;            /* memops: tpf_cuda__memops_release ran */
};

typedef struct {
  tpf_backend base;
  tpf_bootstrap boot;
  int device;
  int num_sms;
  int comm_ctas;
  int compute_streams; /* distinct compute streams (TPF_CUDA_COMPUTE_STREAMS may lower it) */
  uint64_t timeout_ns;
  cudaStream_t streams[TPF_NUM_STREAMS];
  cudaEvent_t fork_ev;
  cudaEvent_t join_ev[TPF_NUM_STREAMS];
  cudaEvent_t *step_ev; /* pool, one per step of the longest schedule so far */
  int nstep_ev;
  uint8_t *need_ev;           /* scratch: step needs an event */
  uint8_t *step_state;        /* scratch of the in-process enqueuer, one per step */
  int nneed_ev;               /* steps the scratch arrays (need_ev .. step_pev) hold: all of them */
  _Atomic(const char *) busy; /* the backend entry that holds the rank (tpf_cuda__enter) */
  tpf_cuda_gemm *gemm;
  tpf_cuda_peer_info peers[TPF_MAX_RANKS];
  /* Memops transport (cuda_transport_flags.c): its waits on the device are unbounded, so the
   * host bounds them: sync polls (tpf_cuda__stream_wait_bounded) and releases on a timeout. */
  tpf_reg *memops_regs;        /* registrations on the memops transport */
  tpf_reg *timed_regs;         /* registrations with device timing (cuda_timing.c) */
  cudaStream_t release_stream; /* created with the first of them */
  /* Host cost of execute (tpf_cuda_backend_enqueue_stats): the rank's thread only. */
  tpf_cuda_enqueue_stats enq;
  /* The operation being enqueued is captured into a CUDA graph (cuda_exec.c): every step uses
   * the graph transport, whatever the registration's. */
  bool capturing;
  /* The lean enqueue of in-process groups (cuda_exec.c, TPF_CUDA_LEAN_ENQUEUE). */
  bool lean;
  uint8_t *step_virt;         /* per step: 1 virtual RECV (no call of its own) */
  int16_t *step_prev;         /* per step: the previous step on its stream, or -1 */
  tpf_cuda_peer_ev *step_pev; /* per step: a virtual RECV's peer event */
  uint64_t hs_peers;          /* peers whose start the handshake waits for on the device (bits) */
  uint32_t pub_order;         /* events this rank published in the current operation */
  /* Waits already enqueued in the current operation, per waiting stream (TPF_NUM_STREAMS: the
   * caller's): on steps of each stream (the latest step index, -1: none), and on each peer's
   * events of each of its streams (the latest order, 0: none). A wait on an earlier event of the
   * same stream adds nothing and is skipped. */
  int32_t waited_step[TPF_NUM_STREAMS + 1][TPF_NUM_STREAMS];
  uint32_t waited_peer[TPF_NUM_STREAMS + 1][TPF_MAX_RANKS][TPF_NUM_STREAMS];
  cudaEvent_t wait_buf[TPF_CUDA_WAIT_MAX]; /* tpf_cuda__wait_plan's output */
} tpf_cuda_backend;

static inline tpf_cuda_backend *tpf_cuda__of(tpf_backend *be) {
  return (tpf_cuda_backend *)be;
}

/* The ops table (cuda_backend.c). */
extern const tpf_backend_ops tpf_cuda__ops;

/* Claims the rank for the calling thread's backend entry `what` (the ops table's entries do,
 * cuda_backend.c); TPF_ESTATE naming the rule while another thread holds it. */
static inline tpf_status tpf_cuda__enter(tpf_cuda_backend *b, const char *what) {
  const char *none = NULL;
  if (atomic_compare_exchange_strong(&b->busy, &none, what)) return TPF_OK;
  return tpf_set_error(TPF_ESTATE,
                       "CUDA backend rank %d: %s called while another thread is in %s on the same "
                       "rank; one thread per rank at a time (a rank's calls are not thread-safe)",
                       b->base.rank, what, none ? none : "a call");
}
static inline void tpf_cuda__leave(tpf_cuda_backend *b) {
  atomic_store(&b->busy, (const char *)NULL);
}

static inline uint64_t tpf_cuda__now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Counts one CUDA or cuBLASLt call of execute under kind k with the host time it took:
 *   TPF_CUDA_TRY(TPF_CUDA_ENQ(b, RECORD, cudaEventRecord(ev, s)), "cudaEventRecord(x)");
 * evaluates to the call's value. A GNU statement expression (gcc and clang, as the rest of the
 * backend's host code is built). */
#define TPF_CUDA_ENQ(b, k, call)                                                                   \
  __extension__({                                                                                  \
    const uint64_t tpf_enq_t0_ = tpf_cuda__now_ns();                                               \
    __typeof__(call) tpf_enq_rv_ = (call);                                                         \
    (b)->enq.calls[TPF_CUDA_ENQ_##k]++;                                                            \
    (b)->enq.ns[TPF_CUDA_ENQ_##k] += tpf_cuda__now_ns() - tpf_enq_t0_;                             \
    tpf_enq_rv_;                                                                                   \
  })
/* Adds a host wait for a peer that started at t0 (now_ns) to the PEER_WAIT kind. */
static inline void tpf_cuda__enq_peer_wait(tpf_cuda_backend *b, uint64_t t0) {
  b->enq.calls[TPF_CUDA_ENQ_PEER_WAIT]++;
  b->enq.ns[TPF_CUDA_ENQ_PEER_WAIT] += tpf_cuda__now_ns() - t0;
}

/* ---- transports (cuda_transport*.c): what orders a rank's steps after its peers' ----
 * NCCL style, a registration holds a table of transports, one per peer. The bytes themselves
 * always move through the peers' mapped registrations (cuda_reg.c): RING SENDs on the copy
 * engine, BULK SENDs and PEER_REDUCE in kernels. A transport carries the signals around them:
 * the HANDSHAKE's ready words, the flag a SEND raises for its RECV, the BARRIER's arrivals, and
 * any host-side agreement before an operation is enqueued. Every op gets the backend, the
 * registration, the operation and, for steps, the step, its index (its pooled event
 * b->step_ev[idx]) and the stream it runs on. NULL ops do nothing. */
struct tpf_cuda_transport {
  const char *name;
  /* Waits are resolved on the host (an event is waited on only once its peer recorded it):
   * execute then uses the polling enqueuer, which asks recv_ready and barrier_missing before it
   * enqueues a RECV or BARRIER, instead of the schedule-order one. */
  bool host_ordered;
  /* Registration, collective: setup before the bootstrap exchange of the registration records
   * (fill in what the peers need into *mine), connect after it (infos: every rank's record),
   * free at destruction or failure (also after a failed setup or connect). */
  tpf_status (*setup)(tpf_cuda_backend *b, tpf_reg *r, tpf_cuda_reg_info *mine);
  tpf_status (*connect)(tpf_cuda_backend *b, tpf_reg *r, const tpf_cuda_reg_info *infos);
  void (*free)(tpf_cuda_backend *b, tpf_reg *r);
  /* Before anything of operation a is enqueued: agree with the peers on the host (TPF_EMISMATCH
   * on every rank, no byte moved). */
  tpf_status (*agree)(tpf_cuda_backend *b, tpf_reg *r, const tpf_exec_args *a);
  /* HANDSHAKE with every peer. */
  tpf_status (*handshake)(tpf_cuda_backend *b, tpf_reg *r, const tpf_exec_args *a, cudaStream_t s);
  /* After a SEND's bytes are enqueued on s: tell st->peer that they will have landed. */
  tpf_status (*send)(tpf_cuda_backend *b, tpf_reg *r, const tpf_exec_args *a, int idx,
                     const tpf_step *st, cudaStream_t s);
  /* Host-ordered: whether the RECV st may be enqueued now. NULL: always. */
  bool (*recv_ready)(tpf_cuda_backend *b, tpf_reg *r, const tpf_exec_args *a, const tpf_step *st);
  /* Host-ordered, lean enqueue: once recv_ready, the peer's published event of the SEND that st
   * receives (a virtual RECV: the steps that depend on st wait on it directly). NULL: none. */
  void (*recv_event)(tpf_cuda_backend *b, tpf_reg *r, const tpf_step *st, tpf_cuda_peer_ev *out);
  /* Orders s after the SEND that st receives. */
  tpf_status (*recv)(tpf_cuda_backend *b, tpf_reg *r, const tpf_exec_args *a, int idx,
                     const tpf_step *st, cudaStream_t s);
  /* Host-ordered BARRIER: announce this rank's arrival (once), then the first peer that has not
   * arrived yet, -1 when all have. NULL: no separate arrival. */
  tpf_status (*barrier_arrive)(tpf_cuda_backend *b, tpf_reg *r, const tpf_exec_args *a, int idx,
                               const tpf_step *st, cudaStream_t s);
  int (*barrier_missing)(tpf_cuda_backend *b, tpf_reg *r, const tpf_exec_args *a,
                         const tpf_step *st);
  /* BARRIER: orders s after every peer's arrival (flags: arrives and waits in one kernel). */
  tpf_status (*barrier)(tpf_cuda_backend *b, tpf_reg *r, const tpf_exec_args *a, int idx,
                        const tpf_step *st, cudaStream_t s);
};

/* The transport kinds, chosen per registration from the table of cuda_transport.c (the first
 * row whose can_connect accepts the group). Every one signals over memory the peers map; peers
 * whose devices cannot map each other's memory are refused at registration (TPF_EUNSUPPORTED). */
typedef enum {
  TPF_CUDA_TP_EVENTS, /* cuda_transport_events.c: in-process ranks, host-ordered CUDA events */
  TPF_CUDA_TP_FLAGS,  /* cuda_transport_flags.c: device flags over mapped memory (CUDA IPC) */
  TPF_CUDA_TP_MEMOPS, /* cuda_transport_flags.c: the same flags, signalled by stream memory ops */
  TPF_CUDA_TP_COUNT
} tpf_cuda_tp_kind;
extern const tpf_cuda_transport tpf_cuda__transport_events;
/* In-process groups (r->sync): records that this rank's operation a->seq failed with rc (the
 * current detail), once per registration, so that every peer waiting on the host for this rank
 * gives up at once (tpf_cuda__events_peer_failed) instead of at its timeout. No-op without the
 * table. */
void tpf_cuda__events_fail(tpf_cuda_backend *b, tpf_reg *r, const tpf_exec_args *a, tpf_status rc);
/* TPF_ESTATE naming the failed rank and its failure when another rank recorded one on r;
 * TPF_OK otherwise (and without the table). `step`/`what`/`peer`: where this rank waits. */
tpf_status tpf_cuda__events_peer_failed(tpf_cuda_backend *b, const tpf_reg *r,
                                        const tpf_exec_args *a, int step, const char *what,
                                        int peer);
extern const tpf_cuda_transport tpf_cuda__transport_flags;
extern const tpf_cuda_transport tpf_cuda__transport_memops;
/* The transport of every operation enqueued under CUDA-graph capture, whatever the
 * registration's (cuda_transport_flags.c): the flag kernels on the captured words of the ready
 * slots, with device sequence numbers, so that a replay signals and waits as the capture did. */
extern const tpf_cuda_transport tpf_cuda__transport_graph;
/* Before the first step of a captured operation, on the caller's stream: bumps this rank's
 * device sequence counter of registration r (no call at P = 1). */
tpf_status tpf_cuda__graph_begin(tpf_cuda_backend *b, tpf_reg *r, cudaStream_t s);
/* Whether this process can use stream memory operations on `device` (64-bit waits and writes,
 * reached through the runtime's driver entry points; no link to libcuda). */
bool tpf_cuda__memops_available(int device);
/* Memops registrations only: makes every pending wait on this rank's own flags and ready words
 * pass (a pattern larger than any sequence number, written on the backend's release stream), so
 * that streams stuck behind a peer that never signals drain. The registration is unusable after
 * it (its operations report TPF_ESTATE or the timeout that caused it). */
tpf_status tpf_cuda__memops_release(tpf_cuda_backend *b, tpf_reg *r);
extern const tpf_cuda_transport *const tpf_cuda__transports[TPF_CUDA_TP_COUNT];
/* cuda_transport.c: fills r->peer_tp and r->tp for the group as the backend sees it (b->peers,
 * r->remote). */
void tpf_cuda__transport_select(const tpf_cuda_backend *b, tpf_reg *r);

/* ---- cuda_reg.c: registrations and peer mapping ---- */
/* The ops table's reg_create and reg_destroy (collective over the bootstrap). */
tpf_status tpf_cuda__reg_create(tpf_backend *be, const char *name, uint64_t bytes, tpf_reg **reg,
                                void **local);
tpf_status tpf_cuda__reg_destroy(tpf_backend *be, tpf_reg *reg);

/* ---- cuda_exec.c: step mapping and the enqueuers ---- */
/* The ops table's execute. */
tpf_status tpf_cuda__execute(tpf_backend *be, tpf_reg *reg, const tpf_exec_args *a, void *stream);

/* The lean enqueue's view of schedule sc for this rank (no CUDA call; tested on the CPU):
 * last[k] the last step of each schedule stream (-1: none) and b->step_prev[i] each step's
 * predecessor on its stream; virt[k] whether stream k holds RECVs alone, has a CUDA stream of its
 * own (b->streams) and every one of its RECVs' peers has a transport that publishes its events
 * (recv_event) in a host-ordered group: its RECVs are virtual (b->step_virt); b->hs_peers the
 * peers the handshake's device wait covers: SEND and RECV peers, every peer with a PEER_REDUCE,
 * a BARRIER or BULK. b->step_prev and b->step_virt must hold sc->nsteps entries. */
void tpf_cuda__lean_prepare(tpf_cuda_backend *b, const tpf_reg *r, const tpf_schedule *sc,
                            bool virt[TPF_NUM_STREAMS], int last[TPF_NUM_STREAMS]);

/* The events stream s (the waiter: schedule stream w, or TPF_NUM_STREAMS for the caller's
 * stream) must wait on to be ordered after step d of the current operation, appended to out[n..]
 * (no CUDA call; tested on the CPU): a real step on another CUDA stream, its step event (lean:
 * unless s already waits on a later step of that schedule stream); a virtual RECV, the sender's
 * published event (lean: unless s already waits on a later publication of the same peer stream),
 * then the RECV's deps and the previous step of its stream, recursively. Updates the lean
 * enqueue's record of what s waits on as if the events were waited. Returns the new count, or
 * -1 when more than cap would be needed. */
int tpf_cuda__wait_plan(tpf_cuda_backend *b, const tpf_schedule *sc, int w, cudaStream_t s, int d,
                        cudaEvent_t *out, int n, int cap);

/* Grows the per-step scratch arrays (need_ev, step_state, step_virt, step_prev, step_pev) to at
 * least n steps; nneed_ev says how many all of them hold, also after a failed allocation
 * (TPF_ENOMEM). No CUDA call (cuda_exec.c). */
tpf_status tpf_cuda__grow_step_scratch(tpf_cuda_backend *b, int n);

/* ---- cuda_status.c: the device status areas, deferred errors, sync, abort ---- */
/* Allocates registration r's status area (mapped pinned memory) and its claim word, zeroed;
 * freed by status_free (which accepts a partly initialised registration). */
tpf_status tpf_cuda__status_init(tpf_cuda_backend *b, tpf_reg *r);
void tpf_cuda__status_free(tpf_reg *r);
/* Reads r's device-side status; on a failure fills the detail (naming r) and returns its
 * status. Does not clear it. No CUDA call (a host-mapped read): testable on the CPU. */
tpf_status tpf_cuda__check_status(tpf_cuda_backend *b, const tpf_reg *r);
/* The ops table's sync, reg_sync, reg_async_error and reg_abort. */
tpf_status tpf_cuda__sync(tpf_backend *be, void *stream);
tpf_status tpf_cuda__reg_sync(tpf_backend *be, tpf_reg *r);
tpf_status tpf_cuda__reg_async_error(tpf_backend *be, tpf_reg *r, tpf_status *out);
tpf_status tpf_cuda__reg_abort(tpf_backend *be, tpf_reg *r);
/* Waits for stream s on the host. Without memops registrations: cudaStreamSynchronize. With
 * them: polls, bounded by the backend's timeout; on expiry releases every memops registration
 * (tpf_cuda__memops_release), waits once more (bounded) and returns TPF_ETIMEOUT. */
tpf_status tpf_cuda__stream_wait_bounded(tpf_cuda_backend *b, cudaStream_t s);
/* Waits for event ev on the host, polling, bounded by the backend's timeout (TPF_ETIMEOUT). */
tpf_status tpf_cuda__event_wait_bounded(tpf_cuda_backend *b, cudaEvent_t ev);

/* ---- device timing while profiling (cuda_timing.c, SPEC §16) ---- */
typedef struct tpf_cuda_timing tpf_cuda_timing;
/* Around execute: begin on the caller's stream before the fork, step before (after = false) and
 * after every step on its stream, end after the join (rc: execute's status). No-ops while
 * profiling is off; never fail the operation. */
void tpf_cuda__timing_begin(tpf_cuda_backend *b, tpf_reg *r, const tpf_exec_args *a,
                            cudaStream_t user);
void tpf_cuda__timing_step(tpf_reg *r, const tpf_step *st, cudaStream_t s, bool after);
void tpf_cuda__timing_end(tpf_reg *r, cudaStream_t user, tpf_status rc);
/* r's counters with every completed operation read (no wait); reset: zero them after. */
void tpf_cuda__timing_read(tpf_reg *r, tpf_cuda_comm_timing *out, bool reset);
/* At reg destroy: the events and the list entry. */
void tpf_cuda__timing_free(tpf_cuda_backend *b, tpf_reg *r);

/* ---- profiler ranges (cuda_nvtx.c, SPEC §16) ---- */
/* Opens the operation's NVTX range when profiling is on (true: close it with op_pop). */
bool tpf_cuda__nvtx_op_push(const tpf_exec_args *a);
void tpf_cuda__nvtx_op_pop(void);
/* The range's name ("tpflex.ag_gemm fc1_fprop T=1024 ring splits=4") and colour (ARGB), as
 * snprintf returns. */
int tpf_cuda__nvtx_name(const tpf_exec_args *a, char *buf, size_t len, uint32_t *argb);
/* The ops table's reg_activate: an NVTX mark naming the registration when profiling is on. */
tpf_status tpf_cuda__nvtx_reg_activate(tpf_backend *be, tpf_reg *r, uint64_t active_bytes);

#endif /* TPF_CUDA_STATE_H */
