/* tpflex simulator backend: P ranks as threads of one process, all registrations in one shared
 * arena, worker threads standing for each rank's streams. Built with TPF_WITH_SIM (default ON).
 * Or ranks as processes (tpf_sim_backend_create, below): one rank per process, as torchrun and
 * the CUDA backend run them, with registrations in POSIX shared memory. */
#ifndef TPFLEX_SIM_H
#define TPFLEX_SIM_H

#include "tpflex.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tpf_sim_world tpf_sim_world;

/* Versioned like tpf_comm_config: size is sizeof(tpf_sim_config) (TPF_SIM_CONFIG_INIT), the
 * size of an older released layout (fields it lacks take their defaults; none yet) or 0 for
 * this header's layout; any other size is TPF_EINVAL. */
typedef struct {
  size_t size;           /* see above */
  int tp_size;           /* P, 1..64 */
  uint64_t seed;         /* seeds the random step delays */
  unsigned max_delay_us; /* each step sleeps a random 0..max_delay_us first; 0 = none */
  unsigned timeout_ms;   /* bound on every wait; 0 = default (10000) */
  uint64_t arena_bytes;  /* addition: virtual size of the shared arena; 0 = default (1 GiB) */
} tpf_sim_config;
#define TPF_SIM_CONFIG_INIT                                                                        \
  { sizeof(tpf_sim_config), 1, 0, 0, 0, 0 }

/* Creates a world of P ranks. TPF_EINVAL for P outside 1..64, TPF_ENOMEM, TPF_EBACKEND. */
TPF_API tpf_status tpf_sim_world_create(const tpf_sim_config *cfg, tpf_sim_world **out);
/* Runs fn(be, rank, arg) once per rank, each on its own thread, and joins them. Returns TPF_OK
 * if every rank returned TPF_OK, else the status of the lowest failing rank (its detail is kept
 * in tpf_last_error() of the calling thread). Rank r gets the same backend object in every run,
 * valid until tpf_sim_world_destroy, so objects created in one run may be used in the next. */
TPF_API tpf_status tpf_sim_run(tpf_sim_world *w,
                               tpf_status (*fn)(tpf_backend *be, int rank, void *arg), void *arg);
/* TPF_EINVAL for a world of ranks as processes (destroy it with tpf_sim_backend_destroy). */
TPF_API tpf_status tpf_sim_world_destroy(tpf_sim_world *w);

/* ---- Addition (0.3): ranks as processes ----------------------------------------------------
 *
 * One rank per process, created from a bootstrap exactly as tpf_cuda_backend_create (over the
 * launcher's sockets in C, over a gloo process group in Python), so one program runs on a laptop
 * and on GPUs by changing only the backend. The execution is the threads world's: the same
 * stream workers, steps, flags, handshake and canary, on registrations that live in POSIX shared
 * memory that every rank maps (one segment per registration, "/dev/shm/tpflex-sim-<pid of rank
 * 0>-<nonce>-<k>", unlinked once every rank has mapped it, so nothing stays behind on any exit
 * path; a job killed whole between a segment's creation and its unlink leaves it until a
 * creation on the machine a minute later or more sweeps it). What is different:
 *   - Creation agreement (the k-th registration of every rank meets, sizes and names compared,
 *     the configuration fingerprint of tpf_comm_create) goes through the bootstrap, bounded by
 *     the bootstrap's own timeout; a failure on one rank fails every rank, naming it.
 *   - Waits for a peer are bounded by the world's timeout (tpf_sim_set_timeout on
 *     tpf_sim_backend_world's world) and check the peers' processes every 100 ms: a peer that
 *     exited or was killed fails the waiting operation with TPF_ETIMEOUT naming its rank and pid
 *     well before the bound. A stopped peer (SIGSTOP) is alive: the bound applies.
 *   - Destroy (tpf_comm_destroy, tpf_sim_backend_destroy) is local: no peer is waited for.
 *   - Counters, traces and fault plans of the world count this process's rank only.
 * The segments need /dev/shm room for every registration's P blocks (reserved at creation:
 * TPF_ENOMEM naming the fix when it is too small, e.g. docker's default of 64 MiB). */

/* Creates this process's rank (boot->rank of boot->tp_size; boot->device is ignored) and returns
 * its backend. Collective over the bootstrap group. cfg may be NULL (defaults, tp_size from the
 * bootstrap); otherwise its tp_size must equal boot->tp_size; arena_bytes is unused (every
 * registration is a segment of its own). TPF_EINVAL (NULL, no allgather/barrier, rank outside
 * 0..P-1, tp_size differs), TPF_EMISMATCH (ranks disagree on P), a local failure on any rank
 * (every rank returns its status naming that rank), or the bootstrap's failure (TPF_ETIMEOUT
 * naming a rank that never came). The bootstrap must stay valid until tpf_sim_backend_destroy:
 * every later tpf_comm_create calls it. */
TPF_API tpf_status tpf_sim_backend_create(const tpf_sim_config *cfg, const tpf_bootstrap *boot,
                                          tpf_backend **out);
/* Frees this process's rank (local: destroy its communicators first). TPF_EINVAL for anything
 * but a backend of tpf_sim_backend_create. */
TPF_API tpf_status tpf_sim_backend_destroy(tpf_backend *be);
/* The world of such a backend, for the observation and test hooks below (valid until
 * tpf_sim_backend_destroy; tpf_sim_run and tpf_sim_world_destroy refuse it). TPF_EINVAL for
 * anything but a backend of tpf_sim_backend_create. */
TPF_API tpf_status tpf_sim_backend_world(tpf_backend *be, tpf_sim_world **out);

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
TPF_API tpf_status tpf_sim_set_trace(tpf_sim_world *w, tpf_sim_trace_fn fn, void *ctx);

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
TPF_API tpf_status tpf_sim_get_stats(const tpf_sim_world *w, tpf_sim_stats *out);
/* Nanoseconds since the world was created: the clock of tpf_sim_trace_event, so that a caller
 * can put its own spans on the same time line. 0 for NULL. Thread-safe. */
TPF_API uint64_t tpf_sim_elapsed_ns(const tpf_sim_world *w);

/* Fault injection for the fault tests (SQLite's test VFS): counts are world-wide, 1-based, in
 * the order the calls happen. 0 disables a fault. What counts as a backend call and as a signal
 * is said at tpf_sim_fault_ex below. */
typedef struct {
  uint64_t fail_call;     /* the fail_call-th backend call returns fail_status */
  tpf_status fail_status; /* TPF_OK means TPF_EBACKEND */
  uint64_t drop_signal;   /* the drop_signal-th flag raise is silently lost (the peer times out) */
} tpf_sim_fault;
/* Installs f (copied; NULL clears) and resets the fault counters. TPF_EINVAL for a NULL world.
 * The same as tpf_sim_set_fault_ex with only `base` set. */
TPF_API tpf_status tpf_sim_set_fault(tpf_sim_world *w, const tpf_sim_fault *f);

/* Addition: the full fault plan. Counts are 1-based, in the order the calls happen, over the
 * ranks in rank_mask (0: every rank, counted world-wide). 0 disables a fault.
 *
 * Backend calls (base.fail_call): reg_create, reg_activate, sync, the entry of execute, and each
 * step of an executed schedule. An execute numbers its steps at entry, in schedule order: an
 * execute that is call n owns calls n+1 .. n+nsteps whether or not a step ever runs, so the
 * numbering of a faulted rank is the same in every run however its streams interleave. A failing
 * step fails instead of running. reg_destroy is never failed. Entries (late_entry) are the
 * API-level calls only: reg_create, reg_activate, execute, sync. Signals are flag raises (a
 * SEND's completion, one per peer of a BARRIER); handshake ready words are not signals. */
typedef struct {
  tpf_sim_fault base;    /* fail_call, fail_status, drop_signal as above */
  uint64_t rank_mask;    /* bit r: rank r's calls and signals are counted and faulted; 0 = all */
  bool fail_persistent;  /* the fail_call-th call and every later counted call fail */
  uint64_t delay_signal; /* the delay_signal-th flag raise is stored delay_us late (the sending
                          * stream waits, as a slow copy engine would) */
  unsigned delay_us;
  uint64_t dup_signal; /* the dup_signal-th flag raise is stored twice: at once, or with
                        * dup_late at the rank's next raise on the same registration, possibly
                        * in a later operation (a stale duplicate: flags never move back) */
  bool dup_late;
  uint64_t reorder_signal; /* the reorder_signal-th flag raise is held back and stored after the
                            * rank's next raise, or when its operation ends if none follows */
  uint64_t late_entry;     /* the late_entry-th entry (see above) first sleeps late_ms: a rank
                            * that arrives late, or, past the timeout, never in time */
  unsigned late_ms;
} tpf_sim_fault_ex;
/* Installs f (copied; NULL clears) and resets the fault counters and held signals. TPF_EINVAL
 * for a NULL world. */
TPF_API tpf_status tpf_sim_set_fault_ex(tpf_sim_world *w, const tpf_sim_fault_ex *f);

/* Addition (0.2): the bound on every wait, changed at any time, also while ranks run
 * (thread-safe). Every wait re-reads the bound in force at each wakeup (at least every 20 ms) and
 * ends once it has waited that long since it began, so lowering it also ends waits in progress
 * that already waited longer. 0 = the default (10000). TPF_EINVAL for a NULL world. */
TPF_API tpf_status tpf_sim_set_timeout(tpf_sim_world *w, unsigned timeout_ms);
/* Addition (0.2): once a fault of the plan that loses something has fired (a failed
 * call, a lost signal, a late entry; not a delayed, duplicated or reordered signal), every wait is
 * bounded by fault_timeout_ms instead of the world's timeout, waits in progress included; 0 (the
 * default) turns this off. tpf_sim_set_fault(_ex) re-arms it (the plan's faults have not fired
 * yet). A fault test keeps a generous timeout for every wait that must not expire and a short
 * one for the waits its fault makes expire. Thread-safe. TPF_EINVAL for a NULL world. */
TPF_API tpf_status tpf_sim_set_fault_timeout(tpf_sim_world *w, unsigned fault_timeout_ms);

/* What the fault hook counted since the last tpf_sim_set_fault(_ex), and what the world still
 * holds: run an operation fault-free, read calls/entries/signals, then loop k over 1..count. */
typedef struct {
  uint64_t calls;              /* backend calls counted (the numbering of fail_call) */
  uint64_t entries;            /* entries counted (the numbering of late_entry) */
  uint64_t signals;            /* flag raises counted (drop/delay/dup/reorder numbering) */
  uint64_t injected;           /* faults that fired: failed calls, lost, delayed, duplicated or
                                * reordered signals, late entries */
  uint64_t live_registrations; /* collective registrations not yet released by every rank */
  uint64_t arena_used_bytes;   /* arena bytes they hold */
  uint64_t pending_rendezvous; /* reg_create / creation-exchange rendezvous some rank has not
                                * reached yet */
} tpf_sim_fault_report;
/* TPF_EINVAL for NULL. Call between runs. */
TPF_API tpf_status tpf_sim_get_fault_report(const tpf_sim_world *w, tpf_sim_fault_report *out);

#ifdef __cplusplus
}
#endif
#endif /* TPFLEX_SIM_H */
