/* tpflex fault-injecting backend: wraps any backend's ops table (SQLite's test VFS over any VFS).
 *
 * The wrapper is itself a backend: create a communicator on it exactly as on the backend it
 * wraps, and every call the core makes passes through it. A plan says which call fails, which is
 * late and which completion is lost. Wrap only the ranks that should misbehave; each wrapper
 * counts its own rank's calls, in the order the calls happen, from 1.
 *
 * Counted calls: reg_create, reg_activate, execute, sync, reg_sync and allgather. reg_destroy,
 * reg_abort and reg_async_error pass through uncounted and never fail, so cleanup always
 * reaches the wrapped backend. A failed call returns before the wrapped backend sees it, so its
 * peers meet a rank that never arrived (a timeout) or, at a rendezvous that the backend
 * fails fast, the backend's own error.
 */
#ifndef TPFLEX_FAULT_H
#define TPFLEX_FAULT_H

#include "tpflex_backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Versioned like tpf_comm_config: start from TPF_FAULT_PLAN_INIT (or size 0). */
typedef struct {
  size_t size;
  uint64_t fail_call;     /* this counted call returns fail_status instead of running (0: none) */
  tpf_status fail_status; /* TPF_OK means TPF_EBACKEND */
  bool fail_persistent;   /* ... and so does every later counted call */
  uint64_t delay_call;    /* this counted call first sleeps delay_us (a slow rank) (0: none) */
  unsigned delay_us;
  uint64_t drop_send; /* this SEND step (counted over executed schedules, from 1) is removed from
                       * its schedule: its bytes never leave and its flag is never raised, so the
                       * receiver's RECV times out (a lost completion). Works over any backend
                       * (0: none). Dropping allocates a copy of that one schedule. */
} tpf_fault_plan;
#define TPF_FAULT_PLAN_INIT                                                                        \
  { sizeof(tpf_fault_plan), 0, TPF_OK, false, 0, 0, 0 }

typedef struct {
  uint64_t calls;    /* counted calls so far */
  uint64_t sends;    /* SEND steps seen in executed schedules */
  uint64_t injected; /* faults injected (failed calls, delays, dropped sends) */
} tpf_fault_report;

/* Wraps `inner` (which must outlive the wrapper). The wrapper reports the inner backend's
 * tp_size, rank, alignment and capabilities, and names itself "fault(<inner>)". plan may be NULL
 * (no fault). TPF_EINVAL for a NULL or malformed inner backend or plan, TPF_ENOMEM. */
TPF_API tpf_status tpf_fault_backend_create(tpf_backend *inner, const tpf_fault_plan *plan,
                                            tpf_backend **out);
/* Replaces the plan (NULL: none) and resets the counters. Call it between operations. */
TPF_API tpf_status tpf_fault_backend_set_plan(tpf_backend *fb, const tpf_fault_plan *plan);
TPF_API tpf_status tpf_fault_backend_report(const tpf_backend *fb, tpf_fault_report *out);
/* Frees the wrapper, not the inner backend. TPF_EINVAL for NULL or a backend that is not a
 * fault wrapper. */
TPF_API tpf_status tpf_fault_backend_destroy(tpf_backend *fb);

#ifdef __cplusplus
}
#endif
#endif /* TPFLEX_FAULT_H */
