/* The communicator object, shared by comm.c and manager.c. */
#ifndef TPF_COMM_INTERNAL_H
#define TPF_COMM_INTERNAL_H

#include "internal.h"

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

#endif
