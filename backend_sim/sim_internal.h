/* Private structures of the simulator backend. See sim_world.c for the overall method. */
#ifndef TPF_SIM_INTERNAL_H
#define TPF_SIM_INTERNAL_H

#include "tpflex/tpflex_backend_support.h"
#include "tpflex/tpflex_backend.h"
#include "tpflex/tpflex_sim.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#define TPF_SIM_DEFAULT_TIMEOUT_MS 10000u
#define TPF_SIM_DEFAULT_ARENA_BYTES (1ull << 30)
#define TPF_SIM_ARENA_ALIGN 4096u
#define TPF_SIM_MSG_LEN 512
#define TPF_SIM_NAME_LEN 64
#define TPF_SIM_MAX_STEPS 65535 /* steps of one schedule (the pre-check's limit) */
/* Longest sleep of any wait before it re-checks its predicate and its bound (a bound lowered
 * while it sleeps, tpf_sim_set_timeout, takes effect within this). */
#define TPF_SIM_POLL_NS 20000000ull
/* Process mode: how often a cross-rank wait checks that its peers' processes still exist. */
#define TPF_SIM_LIVE_NS 100000000ull
/* Process mode: a registration's proposal (what every rank exchanges first through the
 * bootstrap: its status, size and name) and the creator's outcome that follows it; the fault
 * tests kill the creator between the two (tests/proc/test_proc_faults_sim.c). */
typedef struct {
  int32_t status; /* TPF_OK, or this rank's local failure */
  uint32_t pad;
  uint64_t bytes;
  char name[64]; /* TPF_SIM_NAME_LEN */
  char msg[120]; /* the local failure's detail */
} tpf_sim_proposal;
typedef struct {
  int32_t status; /* rank 0: creating the segment; others: mapping it */
  char msg[124];
} tpf_sim_outcome;

typedef struct tpf_sim_rank tpf_sim_rank;

/* One collective registration: P per-rank blocks in the arena (threads) or in one POSIX shared
 * memory segment of its own (process mode). Block r holds rank r's data (data_bytes, rounded up
 * to 64), then its incoming flags [sender][TPF_MAX_TAGS], its incoming ready words [sender][seq
 * parity] and its doorbell word (process mode: a futex): everything a rank waits on lives in its
 * own block, so a writer knows whose doorbell to ring. */
typedef struct tpf_sim_shared {
  char name[TPF_SIM_NAME_LEN];
  int tp_size;
  uint64_t data_bytes;  /* registered bytes */
  uint64_t data_span;   /* data_bytes rounded up to 64 */
  uint64_t block_bytes; /* one rank's block */
  uint64_t arena_off;   /* start in the arena */
  uint64_t arena_len;   /* reserved length */
  unsigned char *base;  /* arena + arena_off, or the mapped segment (process mode) */
  int refs;             /* ranks that still hold it; world mutex */
  bool mapped;          /* process mode: base is this process's mapping of arena_len bytes */
} tpf_sim_shared;

/* A rank's handle on a registration (what the core calls tpf_reg). */
typedef struct tpf_sim_reg {
  tpf_sim_shared *sh;
  int rank;
  uint64_t canary_off; /* bytes from here to data_bytes hold the canary */
  bool canary_dirty;   /* a verify found stray bytes: the next activate refills all of it */
  atomic_int aborted;  /* tpf_comm_abort: every wait of an operation on this handle gives up */
  tpf_status deferred; /* first failure of an operation on this handle (rank thread only) */
} tpf_sim_reg;

/* Registration rendezvous: the k-th reg_create of every rank meets in group k. */
typedef struct tpf_sim_exchange tpf_sim_exchange;

typedef struct tpf_sim_group {
  struct tpf_sim_group *next;
  uint64_t k;
  int arrived, taken;
  bool decided;
  tpf_status status;
  char msg[TPF_SIM_MSG_LEN];
  uint64_t bytes[TPF_MAX_RANKS];
  uint64_t arrived_mask; /* bit r: rank r arrived */
  uint64_t missing_mask; /* ranks that had not arrived when the group timed out */
  unsigned bound_ms;     /* the bound the group ran out of (TPF_ETIMEOUT) */
  char names[TPF_MAX_RANKS][TPF_SIM_NAME_LEN];
  tpf_sim_shared *sh;
} tpf_sim_group;

/* A free extent of the arena (sorted by offset, coalesced). */
typedef struct tpf_sim_extent {
  struct tpf_sim_extent *next;
  uint64_t off, len;
} tpf_sim_extent;

/* One operation being executed by a rank's stream workers. Lives on the stack of execute, which
 * waits until every worker has let go of it. */
typedef struct tpf_sim_op {
  const tpf_schedule *sched;
  const tpf_exec_args *args;
  tpf_sim_reg *reg;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  unsigned char *done; /* per step; mu */
  int workers_left;    /* mu */
  atomic_int failed;
  tpf_status status; /* first failure; mu */
  char msg[TPF_SIM_MSG_LEN];
  uint64_t fault_step_base; /* fault number of step 0 (0: this rank is not counted) */
  /* The nets (waits of a rank on its own steps and workers) fire only when no cross-rank wait of
   * the operation is in progress (those are bounded and fail the operation themselves) and
   * nothing happened for their bound: progress_ns is when a step last finished, a cross-rank
   * wait last ended, or the operation started. */
  _Atomic uint64_t progress_ns;
  atomic_int cross_waits; /* workers inside a cross-rank wait now */
} tpf_sim_op;

/* Scratch of one stream worker (fp32 staging for GEMM and reductions). */
typedef struct {
  float *buf;
  size_t cap;
} tpf_sim_scratch;

typedef struct {
  tpf_sim_rank *rank;
  int stream;
  pthread_t thread;
  uint64_t rng;
  tpf_sim_scratch scratch;
} tpf_sim_worker;

/* A flag store the fault hook holds back (reorder, late duplicate). */
typedef struct {
  bool on;
  tpf_sim_shared *sh;
  int receiver;
  uint32_t tag;
  uint64_t seq;
} tpf_sim_held_signal;

/* A rank: the backend object the core sees, its stream workers and its doorbell. */
struct tpf_sim_rank {
  struct tpf_backend hdr; /* must stay first: the core casts */
  tpf_sim_world *world;
  int rank;
  uint64_t reg_count;      /* registrations requested so far (rank thread only) */
  uint64_t exchange_count; /* allgathers so far (rank thread only; sim_exchange.c) */
  tpf_sim_worker workers[TPF_NUM_STREAMS];
  /* Per-step completion flags of the operation being executed, reused by every operation so
   * execute allocates nothing; guarded by that operation's mutex. */
  unsigned char done[TPF_SIM_MAX_STEPS + 1];
  bool workers_started[TPF_NUM_STREAMS];
  /* The rank's calling thread: the backend entry that holds the rank (NULL: none). One thread
   * per rank at a time (tpflex.h): a second thread entering while this is set is refused with
   * TPF_ESTATE instead of overwriting the job slot below. */
  _Atomic(const char *) busy;
  /* Job dispatch to the workers. */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  uint64_t job_gen;
  tpf_sim_op *job;
  bool shutdown;
  /* Doorbell: rung after every store into this rank's flags or ready words. */
  pthread_mutex_t bell_mu;
  pthread_cond_t bell_cv;
  uint64_t bell_gen;
  /* tpf_sim_run: the rank function's result and detail. */
  tpf_status run_status;
  char run_msg[TPF_SIM_MSG_LEN];
  void *run_arg;
  tpf_status (*run_fn)(tpf_backend *be, int rank, void *arg);
  pthread_t run_thread;
  /* Fault hook: signals held back (fault_mu). */
  pthread_mutex_t fault_mu;
  tpf_sim_held_signal held_reorder, held_dup;
};

struct tpf_sim_world {
  int tp_size;
  uint64_t seed;
  unsigned max_delay_us;
  /* The bound on every wait (tpf_sim_set_timeout may change it while ranks run: every wait
   * re-reads it through tpf_sim__timeout_ms at each wakeup), and the bound once a lossy fault
   * fired (tpf_sim_set_fault_timeout; 0: off). */
  _Atomic unsigned timeout_ms;
  _Atomic unsigned fault_timeout_ms;
  uint64_t t0_ns;
  /* Arena. */
  unsigned char *arena;
  uint64_t arena_bytes;
  tpf_sim_extent *free_list; /* mu */
  /* Registration rendezvous. */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  tpf_sim_group *groups;
  tpf_sim_exchange *exchanges; /* allgather rendezvous (sim_exchange.c) */
  /* Observation. */
  tpf_sim_trace_fn trace_fn;
  void *trace_ctx;
  atomic_uint_fast64_t ops, steps, bytes_moved, flops, registrations, backend_calls, signals;
  /* Faults. */
  tpf_sim_fault_ex fault;
  atomic_uint_fast64_t fault_calls, fault_signals, fault_entries, fault_injected;
  atomic_uint_fast64_t fault_lossy; /* injected faults that lose something: failed calls, lost
                                     * signals, late entries (what arms fault_timeout_ms) */
  uint64_t live_regs, arena_used;   /* mu */
  tpf_sim_rank *ranks;              /* nlocal entries: ranks 0..P-1, or this process's rank */
  int nlocal;
  /* Process mode (tpf_sim_backend_create): this process holds rank proc_rank of P, peers are
   * other processes; registrations are shared memory segments named job-k, rendezvous and
   * agreement go through boot, and the waits watch the peers' pids. */
  bool procs;
  int proc_rank;
  tpf_bootstrap boot;
  int32_t pids[TPF_MAX_RANKS];
  char job[64]; /* "/tpflex-sim-<pid of rank 0>-<nonce>" */
};

extern const tpf_backend_ops tpf_sim_ops;

/* sim_world.c */
uint64_t tpf_sim__now_ns(void);
tpf_status tpf_sim__arena_alloc(tpf_sim_world *w, uint64_t len, uint64_t *off);
void tpf_sim__arena_free(tpf_sim_world *w, uint64_t off, uint64_t len);
/* Rings rank's doorbell for a store into its words of sh (threads: the rank's condition; process
 * mode: the futex word in sh). */
void tpf_sim__ring(tpf_sim_world *w, const tpf_sim_shared *sh, int rank);
/* The doorbell's generation now; tpf_sim__bell_wait sleeps until it moves on from gen, at most
 * ns. Read the generation before checking what is awaited, so that no ring is lost. */
uint64_t tpf_sim__bell_gen(tpf_sim_world *w, const tpf_sim_shared *sh, int rank);
void tpf_sim__bell_wait(tpf_sim_world *w, const tpf_sim_shared *sh, int rank, uint64_t gen,
                        uint64_t ns);
/* The local rank object of rank r (NULL: held by another process). */
tpf_sim_rank *tpf_sim__local(tpf_sim_world *w, int r);
/* Counts one backend call (an entry); returns the injected failure when it is the chosen one. */
tpf_status tpf_sim__fault_call(tpf_sim_world *w, const char *what, int rank);
/* The same for an entry that also owns `steps` numbered calls after it (execute): *step_base
 * gets the number of its step 0, or 0 when the rank is not counted. */
tpf_status tpf_sim__fault_enter(tpf_sim_world *w, const char *what, int rank, uint64_t steps,
                                uint64_t *step_base);
/* True when counted call k (1-based) is to fail; counts the injection. */
bool tpf_sim__fault_fires(tpf_sim_world *w, uint64_t k);
/* Counts an injected fault that loses something (arms the fault timeout). */
void tpf_sim__fault_lossy(tpf_sim_world *w);
/* The bound in force for waits, in ms: the fault timeout once a lossy fault fired, else the
 * world's timeout. Waits re-read it at every wakeup. */
unsigned tpf_sim__timeout_ms(tpf_sim_world *w);
/* True (and *bound_ms set) when a wait that started at start_ns has run out of the bound in
 * force now. */
bool tpf_sim__expired(tpf_sim_world *w, uint64_t start_ns, unsigned *bound_ms);
/* Claims rank rk for the calling thread's backend entry `what`; TPF_ESTATE naming the rule when
 * another thread holds it. tpf_sim__leave releases it. */
tpf_status tpf_sim__enter(tpf_sim_rank *rk, const char *what);
void tpf_sim__leave(tpf_sim_rank *rk);
/* True when rank's calls and signals are counted. */
bool tpf_sim__fault_counts(const tpf_sim_world *w, int rank);
/* Drops held signals of rank rk that point into sh (its handle is going away). */
void tpf_sim__fault_forget(tpf_sim_rank *rk, const tpf_sim_shared *sh);

/* sim_reg.c */
tpf_status tpf_sim__reg_create(tpf_backend *be, const char *name, uint64_t bytes, tpf_reg **reg,
                               void **local);
tpf_status tpf_sim__reg_destroy(tpf_backend *be, tpf_reg *reg);
tpf_status tpf_sim__reg_activate(tpf_backend *be, tpf_reg *reg, uint64_t active_bytes);
/* TPF_ESTATE naming the rows (of row_bytes each) of the registration that hold bytes written
 * beyond the active layout, if any. */
tpf_status tpf_sim__canary_verify(tpf_sim_reg *r, const char *comm, uint64_t row_bytes);
unsigned char *tpf_sim__data(const tpf_sim_shared *sh, int rank);
_Atomic uint64_t *tpf_sim__flag(const tpf_sim_shared *sh, int receiver, int sender, uint32_t tag);
_Atomic uint64_t *tpf_sim__ready(const tpf_sim_shared *sh, int receiver, int sender, uint64_t seq);
/* The doorbell word of a rank (process mode), after its ready words (tpf_sim__shared_layout
 * reserves it); inline, so that the doorbell room needs nothing of sim_reg.c. */
static inline _Atomic uint32_t *tpf_sim__bell(const tpf_sim_shared *sh, int rank) {
  unsigned char *p = sh->base + (uint64_t)rank * sh->block_bytes + sh->data_span;
  return (_Atomic uint32_t *)(void *)((_Atomic uint64_t *)(void *)p +
                                      (size_t)sh->tp_size * TPF_MAX_TAGS +
                                      2u * (size_t)sh->tp_size);
}
/* Fills sh's layout (block sizes) for P ranks of `bytes` registered bytes; false on overflow. */
bool tpf_sim__shared_layout(tpf_sim_shared *sh, int P, uint64_t bytes);
void tpf_sim__free_groups(tpf_sim_world *w);
/* The next wakeup of a wait on the world condition (CLOCK_REALTIME): one poll period ahead. */
void tpf_sim__poll_deadline(struct timespec *ts);
/* sim_exchange.c: the allgather op and its rendezvous list. */
tpf_status tpf_sim__allgather(tpf_backend *be, const void *mine, void *all, size_t bytes);
void tpf_sim__free_exchanges(tpf_sim_world *w);
/* Exchanges some rank has not reached yet (world mutex held). */
uint64_t tpf_sim__pending_exchanges(const tpf_sim_world *w);

/* sim_proc.c (a leaf): process mode's shared memory segments and peer liveness. */
/* Creates (O_EXCL) and maps the segment `name` of `bytes` zeroed bytes. */
tpf_status tpf_sim__shm_create(const char *name, uint64_t bytes, unsigned char **base);
/* Maps the existing segment `name`, which must hold exactly `bytes`. */
tpf_status tpf_sim__shm_map(const char *name, uint64_t bytes, unsigned char **base);
void tpf_sim__shm_unlink(const char *name);
void tpf_sim__shm_unmap(unsigned char *base, uint64_t bytes);
/* Removes segments "tpflex-sim-<pid>-*" whose pid no longer runs and that have not changed for
 * a minute (left by a job whose every rank was killed between creating and unlinking a segment);
 * returns how many. */
int tpf_sim__shm_sweep(void);
/* How many peers' processes have ended (exited, killed, a zombie), named in names ("rank 1 (pid
 * 123) and rank 2 (pid 456)": every one, since which ended first cannot be known). */
int tpf_sim__peers_gone(const tpf_sim_world *w, char *names, size_t n);

/* sim_exec.c */
tpf_status tpf_sim__execute(tpf_backend *be, tpf_reg *reg, const tpf_exec_args *a, void *stream);
tpf_status tpf_sim__sync(tpf_backend *be, void *stream);
tpf_status tpf_sim__reg_sync(tpf_backend *be, tpf_reg *reg);
tpf_status tpf_sim__reg_async_error(tpf_backend *be, tpf_reg *reg, tpf_status *out);
tpf_status tpf_sim__reg_abort(tpf_backend *be, tpf_reg *reg);
void *tpf_sim__worker_main(void *arg);
/* Condition variable timed against CLOCK_MONOTONIC (deadlines from tpf_sim__now_ns). */
void tpf_sim__cond_init_mono(pthread_cond_t *cv);

/* sim_math.c */
tpf_status tpf_sim__scratch_reserve(tpf_sim_scratch *s, size_t floats);
void tpf_sim__scratch_free(tpf_sim_scratch *s);
/* A strided view of elements: element (i, j) at base + (i * ld + j) * elem size. */
typedef struct {
  unsigned char *base;
  uint64_t ld;
  tpf_dtype dtype;
} tpf_sim_view;
/* The epilogue of one step (NULL: none): v -> act(alpha v + beta d + bias[bias_col + j]). */
typedef struct {
  const tpf_epilogue *epi;
  uint64_t bias_col;
  float scale; /* GEMM: the fp8 operands' sa * sw (1 without fp8), applied to every product */
} tpf_sim_epi;
/* d[m, n] = op(a)[m, k] * op(w)[k, n] with fp32 accumulation, rounded to d's dtype; op(a) = a,
 * or the transpose of the stored [k, m] block with TPF_STEP_TRANS_A in flags; op(w) = w^T of
 * the stored [n, k] block, or the stored [k, n] block itself with TPF_STEP_TRANS_W. */
tpf_status tpf_sim__gemm(tpf_sim_scratch *s, tpf_sim_view a, tpf_sim_view w, tpf_sim_view d,
                         uint64_t m, uint64_t n, uint64_t k, unsigned flags,
                         const tpf_sim_epi *epi);
/* d[m, n] = sum over t < count of src[t][m, n] in fp32 (in t order), then the epilogue, rounded
 * once. */
tpf_status tpf_sim__reduce(tpf_sim_scratch *s, const tpf_sim_view *src, uint32_t count,
                           tpf_sim_view d, uint64_t m, uint64_t n, const tpf_sim_epi *epi);

#endif /* TPF_SIM_INTERNAL_H */
