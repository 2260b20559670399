/* The simulator's fault plan (tpf_sim_set_fault_ex): which backend call fails, which entry comes
 * late, and the counters of tpf_sim_get_fault_report; and the bound of every wait in force
 * (tpf_sim_set_timeout, tpf_sim_set_fault_timeout: a lossy fault that fired switches the world to
 * the fault timeout). A leaf: it reads and counts, and calls no
 * other simulator file. The signal faults (drop, delay, duplicate, reorder) act where flags are
 * raised, in sim_exec.c, and only read the plan from here. */
#define _POSIX_C_SOURCE 200809L
#include "sim_internal.h"

#include <errno.h>
#include <string.h>
#include <time.h>

bool tpf_sim__fault_counts(const tpf_sim_world *w, int rank) {
  return w->fault.rank_mask == 0 ||
         (rank >= 0 && rank < 64 && ((w->fault.rank_mask >> (unsigned)rank) & 1u));
}

void tpf_sim__fault_lossy(tpf_sim_world *w) {
  atomic_fetch_add(&w->fault_lossy, 1);
}

unsigned tpf_sim__timeout_ms(tpf_sim_world *w) {
  unsigned f = atomic_load(&w->fault_timeout_ms);
  if (f != 0 && atomic_load(&w->fault_lossy) != 0) return f;
  return atomic_load(&w->timeout_ms);
}

bool tpf_sim__expired(tpf_sim_world *w, uint64_t start_ns, unsigned *bound_ms) {
  unsigned b = tpf_sim__timeout_ms(w);
  if (bound_ms) *bound_ms = b;
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  uint64_t now = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
  return now >= start_ns && now - start_ns >= (uint64_t)b * 1000000ull;
}

bool tpf_sim__fault_fires(tpf_sim_world *w, uint64_t k) {
  uint64_t f = w->fault.base.fail_call;
  if (f == 0 || k == 0 || !(k == f || (w->fault.fail_persistent && k > f))) return false;
  atomic_fetch_add(&w->fault_injected, 1);
  tpf_sim__fault_lossy(w);
  return true;
}

tpf_status tpf_sim__fault_enter(tpf_sim_world *w, const char *what, int rank, uint64_t steps,
                                uint64_t *step_base) {
  atomic_fetch_add(&w->backend_calls, 1);
  if (step_base) *step_base = 0;
  if (!tpf_sim__fault_counts(w, rank)) return TPF_OK;
  uint64_t e = atomic_fetch_add(&w->fault_entries, 1) + 1;
  if (w->fault.late_entry != 0 && e == w->fault.late_entry && w->fault.late_ms != 0) {
    atomic_fetch_add(&w->fault_injected, 1);
    tpf_sim__fault_lossy(w);
    struct timespec ts = {(time_t)(w->fault.late_ms / 1000u),
                          (long)(w->fault.late_ms % 1000u) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
  }
  /* Numbers are reserved for the steps too, so that step numbering never depends on timing. */
  uint64_t k = atomic_fetch_add(&w->fault_calls, 1 + steps) + 1;
  if (step_base) *step_base = k + 1;
  if (!tpf_sim__fault_fires(w, k)) return TPF_OK;
  tpf_status st = w->fault.base.fail_status != TPF_OK ? w->fault.base.fail_status : TPF_EBACKEND;
  return tpf_set_error(st, "injected fault: backend call %llu (%s on rank %d) fails%s",
                       (unsigned long long)k, what, rank,
                       w->fault.fail_persistent ? " (persistent)" : "");
}

tpf_status tpf_sim__fault_call(tpf_sim_world *w, const char *what, int rank) {
  return tpf_sim__fault_enter(w, what, rank, 0, NULL);
}

void tpf_sim__fault_forget(tpf_sim_rank *rk, const tpf_sim_shared *sh) {
  pthread_mutex_lock(&rk->fault_mu);
  if (rk->held_reorder.on && rk->held_reorder.sh == sh) rk->held_reorder.on = false;
  if (rk->held_dup.on && rk->held_dup.sh == sh) rk->held_dup.on = false;
  pthread_mutex_unlock(&rk->fault_mu);
}

tpf_status tpf_sim_set_timeout(tpf_sim_world *w, unsigned timeout_ms) {
  TPF_CHECK(tpf_handle_check(w, TPF_HANDLE_WORLD, "tpf_sim_set_timeout"));
  atomic_store(&w->timeout_ms, timeout_ms ? timeout_ms : TPF_SIM_DEFAULT_TIMEOUT_MS);
  return TPF_OK;
}

tpf_status tpf_sim_set_fault_timeout(tpf_sim_world *w, unsigned timeout_ms) {
  TPF_CHECK(tpf_handle_check(w, TPF_HANDLE_WORLD, "tpf_sim_set_fault_timeout"));
  atomic_store(&w->fault_timeout_ms, timeout_ms);
  return TPF_OK;
}

tpf_status tpf_sim_set_fault(tpf_sim_world *w, const tpf_sim_fault *f) {
  TPF_CHECK(tpf_handle_check(w, TPF_HANDLE_WORLD, "tpf_sim_set_fault"));
  tpf_sim_fault_ex x;
  memset(&x, 0, sizeof x);
  if (f) x.base = *f;
  return tpf_sim_set_fault_ex(w, &x);
}

tpf_status tpf_sim_set_fault_ex(tpf_sim_world *w, const tpf_sim_fault_ex *f) {
  TPF_CHECK(tpf_handle_check(w, TPF_HANDLE_WORLD, "tpf_sim_set_fault_ex"));
  if (f)
    w->fault = *f;
  else
    memset(&w->fault, 0, sizeof w->fault);
  atomic_store(&w->fault_calls, 0);
  atomic_store(&w->fault_signals, 0);
  atomic_store(&w->fault_entries, 0);
  atomic_store(&w->fault_injected, 0);
  atomic_store(&w->fault_lossy, 0);
  for (int i = 0; i < w->nlocal; i++) {
    tpf_sim_rank *rk = &w->ranks[i];
    pthread_mutex_lock(&rk->fault_mu);
    rk->held_reorder.on = false;
    rk->held_dup.on = false;
    pthread_mutex_unlock(&rk->fault_mu);
  }
  return TPF_OK;
}
