/* tpflex simulator backend: P ranks as threads of one process, all registrations in one shared
 * arena, worker threads standing for each rank's streams. Built with TPF_WITH_SIM (default ON). */
#ifndef TPFLEX_SIM_H
#define TPFLEX_SIM_H

#include "tpflex.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tpf_sim_world tpf_sim_world;

typedef struct {
  int tp_size;           /* P, 1..64 */
  uint64_t seed;         /* seeds the random step delays */
  unsigned max_delay_us; /* each step sleeps a random 0..max_delay_us first; 0 = none */
  unsigned timeout_ms;   /* bound on every wait; 0 = default (10000) */
  uint64_t arena_bytes;  /* addition: virtual size of the shared arena; 0 = default (1 GiB) */
} tpf_sim_config;

/* Creates a world of P ranks. TPF_EINVAL for P outside 1..64, TPF_ENOMEM, TPF_EBACKEND. */
tpf_status tpf_sim_world_create(const tpf_sim_config *cfg, tpf_sim_world **out);
/* Runs fn(be, rank, arg) once per rank, each on its own thread, and joins them. Returns TPF_OK
 * if every rank returned TPF_OK, else the status of the lowest failing rank (its detail is kept
 * in tpf_last_error() of the calling thread). Rank r gets the same backend object in every run,
 * valid until tpf_sim_world_destroy, so objects created in one run may be used in the next. */
tpf_status tpf_sim_run(tpf_sim_world *w, tpf_status (*fn)(tpf_backend *be, int rank, void *arg),
                       void *arg);
tpf_status tpf_sim_world_destroy(tpf_sim_world *w);

/* ---- Additions: observation and test hooks. Call them between runs (no rank running). ------ */

/* One executed step, reported after it finished. Times are nanoseconds since the world was
 * created; for waits (RECV, BARRIER, HANDSHAKE) the interval is the time spent waiting. */
typedef struct {
  int rank;         /* r */
  int stream;       /* tpf_stream_id */
  int step;         /* index in the rank's schedule */
  int kind;         /* tpf_step_kind */
  int peer;         /* SEND/RECV peer, else -1 */
  int chunk;        /* the step's informational chunk/slot/block */
  uint32_t tag;     /* flag tag */
  const char *comm; /* communicator name; valid during the call only */
  uint64_t seq;     /* operation sequence number on that communicator */
  uint64_t bytes;   /* bytes moved between ranks by this step (SEND, PEER_REDUCE) */
  uint64_t flops;   /* 2*m*n*k for GEMM steps */
  uint64_t t0_ns, t1_ns;
} tpf_sim_trace_event;
/* fn is called from the worker threads of every rank (concurrently): it must be thread-safe.
 * NULL turns tracing off. TPF_EINVAL for a NULL world. */
typedef void (*tpf_sim_trace_fn)(void *ctx, const tpf_sim_trace_event *ev);
tpf_status tpf_sim_set_trace(tpf_sim_world *w, tpf_sim_trace_fn fn, void *ctx);

/* Counters since the world was created. bytes_moved counts bytes that crossed from one rank's
 * registration to another's (SEND payloads and the peer reads of PEER_REDUCE). */
typedef struct {
  uint64_t ops;           /* executed operations, all ranks */
  uint64_t steps;         /* executed steps, all ranks */
  uint64_t bytes_moved;   /* see above */
  uint64_t flops;         /* GEMM flops (2*m*n*k), all ranks */
  uint64_t registrations; /* collective registrations created (one per group, not per rank) */
  uint64_t backend_calls; /* reg_create/reg_destroy/reg_activate/execute/sync calls, all ranks */
  uint64_t signals;       /* flag raises (SEND completions and BARRIER arrivals), all ranks */
} tpf_sim_stats;
tpf_status tpf_sim_get_stats(const tpf_sim_world *w, tpf_sim_stats *out);
/* Nanoseconds since the world was created: the clock of tpf_sim_trace_event, so that a caller
 * can put its own spans on the same time line. 0 for NULL. Thread-safe. */
uint64_t tpf_sim_elapsed_ns(const tpf_sim_world *w);

/* Fault injection for the fault tests (SQLite's test VFS): counts are world-wide, 1-based, in
 * the order the calls happen. 0 disables a fault. */
typedef struct {
  uint64_t fail_call;     /* the fail_call-th backend call returns fail_status */
  tpf_status fail_status; /* TPF_OK means TPF_EBACKEND */
  uint64_t drop_signal;   /* the drop_signal-th flag raise is silently lost (the peer times out) */
} tpf_sim_fault;
/* Installs f (copied; NULL clears) and resets the fault counters. TPF_EINVAL for a NULL world. */
tpf_status tpf_sim_set_fault(tpf_sim_world *w, const tpf_sim_fault *f);

#ifdef __cplusplus
}
#endif
#endif /* TPFLEX_SIM_H */
