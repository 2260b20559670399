/* The communicator object, shared by comm.c and manager.c. */
#ifndef TPF_COMM_INTERNAL_H
#define TPF_COMM_INTERNAL_H

#include "internal.h"

#include <stdatomic.h>

struct tpf_comm {
  tpf_backend *be;             /* the rank's backend */
  tpf_comm_config cfg;         /* as created; cfg.name points to name */
  char *name;                  /* owned copy of the name */
  tpf_shape active;            /* active shape; == capacity until the first set */
  uint64_t epoch;              /* successful set_active_shape calls */
  uint64_t seq;                /* operations handed to the backend (the flag sequence number) */
  uint64_t ops;                /* operations attempted on the backend */
  tpf_status failed;           /* TPF_OK, or the status that made it refuse further work */
  struct tpf_manager *manager; /* the owning manager, or NULL */
  char fail_detail[240];       /* tpf_last_error() of the failure that set `failed` */
  tpf_reg *reg;                /* backend registration */
  tpf_planner *planner;        /* TPF_PLAN_ADAPTIVE: its planner; NULL for FIXED */
  void *base;                  /* this rank's registered data */
  uint64_t reg_bytes;          /* registered (capacity) bytes */
  /* Scratch of a manager shape change (validated bytes, shape to roll back to), kept here so
   * that tpf_manager_set_active_shape allocates nothing. */
  uint64_t pending_bytes;
  tpf_shape prev_active;
  /* Set with manager: drops c from the manager's list at tpf_comm_destroy. A pointer, so that
   * comm.c (below the manager) calls nothing of manager.c (scripts/check_rooms.py). */
  void (*leave_manager)(struct tpf_manager *m, struct tpf_comm *c);
  tpf_comm_stats telemetry; /* tpf_comm_get_stats (core/stats.c): updated by tpf__stats_op */
};

/* tpf_comm_create for a caller that already found a local failure (`local` != TPF_OK, detail in
 * tpf_last_error(), e.g. the manager's duplicate name): the rank still takes part in the
 * creation exchange, so every rank fails this creation and the group stays paired. */
tpf_status tpf__comm_create_after(tpf_backend *be, const tpf_comm_config *cfg, tpf_comm **out,
                                  tpf_status local);

/* The thread rule of a manager's calls (tpflex.h, Threads): tpf__comm_enter marks c busy as an
 * operation does (TPF_ESTATE naming the rule and `call` when another thread is inside a call on
 * c), tpf__comm_leave clears it. */
tpf_status tpf__comm_enter(tpf_comm *c, const char *call);
void tpf__comm_leave(tpf_comm *c);
/* tpf_comm_destroy's work, for a caller that has entered c and holds the rank (tpf__be_claim):
 * it changes nothing before those two guards have passed. */
tpf_status tpf__comm_destroy_held(tpf_comm *c);

/* The layout descriptor of c (this rank, its configuration) for the given active shape. */
tpf_layout_desc tpf__comm_desc(const tpf_comm *c, tpf_shape active);
/* Validates `active` for c without changing anything; yields the active layout's bytes. */
tpf_status tpf__comm_check_shape(const tpf_comm *c, tpf_shape active, uint64_t *active_bytes);
/* Commits a shape that tpf__comm_check_shape accepted. */
tpf_status tpf__comm_apply_shape(tpf_comm *c, tpf_shape active, uint64_t active_bytes);

/* The schedule cache of an operation's key (comm.c): hits and misses since
 * creation, read by tests and the host benchmark. */
typedef struct {
  uint64_t hits, misses;
} tpf_comm_cache_stats;
tpf_comm_cache_stats tpf__comm_cache_stats(const tpf_comm *c);
/* Turns the cache on (the default) or off (every operation builds its schedule: the benchmark's
 * side-by-side baseline); either way the cached entries are dropped. */
void tpf__comm_set_schedule_cache(tpf_comm *c, bool on);

/* The communicator as allocated: the shared struct above followed by what only comm.c and
 * comm_ops.c need: the abort flag and the schedule storage, sized at creation for the largest
 * schedule any active shape T <= C can need, so an operation builds its schedule without
 * allocating. */
/* Schedule reuse: the schedule of an operation depends only on the communicator, the active rows
 * T and the operation key (the resolved split count and aggregate, the transposes, whether an
 * epilogue is on, the GEMM dims). The last TPF_SCHED_CACHE of them are kept, built and resolved
 * (apply_options done), in storage reserved at creation; an operation whose key is cached hands
 * the backend that schedule without building anything or validating the layout again. */
#define TPF_SCHED_CACHE 8
typedef struct {
  uint64_t rows, m, n, k;
  int32_t num_splits, aggregate;
  uint32_t flags; /* bit 0 trans_a, 1 trans_w, 2 epilogue */
  int valid;
} sched_key;
typedef struct {
  sched_key key;
  tpf_schedule sched; /* steps point into comm_full.steps */
} sched_entry;

typedef struct {
  struct tpf_comm c; /* must stay first */
  atomic_int aborted;
  atomic_int busy; /* a thread is inside an operation, set_active_shape or sync (item 5) */
  int max_steps;
  int next_slot;  /* the entry a miss replaces next (round robin) */
  bool cache_off; /* tpf__comm_set_schedule_cache(c, false): build every time */
  tpf_comm_cache_stats stats;
  sched_entry cache[TPF_SCHED_CACHE];
  tpf_step steps[]; /* TPF_SCHED_CACHE * max_steps entries: entry i owns [i * max_steps, ..) */
} comm_full;

static inline comm_full *tpf__comm_full(const tpf_comm *c) {
  return (comm_full *)(void *)(uintptr_t)c;
}

/* The handle check of every public call (core/handle.c): reads nothing of a destroyed c. */
#define TPF_CHECK_COMM(c, call) TPF_CHECK(tpf__handle_check((c), TPF_HANDLE_COMM, (call)))

static inline bool tpf__comm_aborted(const tpf_comm *c) {
  return atomic_load(&tpf__comm_full(c)->aborted) != 0;
}

#define TPF_RETURN_IF_ABORTED(c)                                                                   \
  TPF_RETURN_IF(tpf__comm_aborted(c), TPF_ESTATE,                                                  \
                "'%s' was aborted (tpf_comm_abort); destroy it and create a new one",              \
                (c)->cfg.name)

/* Leaves c failed with status rc, keeping the detail for the messages of later calls (they name
 * the original failure and the way out). */
void tpf__comm_mark_failed(tpf_comm *c, tpf_status rc);
/* Prefixes tpf_last_error() with "'name': " (once) and returns s. */
tpf_status tpf__comm_named(const tpf_comm *c, tpf_status s);

#endif
