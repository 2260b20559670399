/* The simulator's doorbell: rung after every store into a rank's flags or ready words, so waiters
 * sleep instead of spinning. Ranks as threads: the rank's mutex + condition + generation. Ranks
 * as processes: a 32-bit generation word in the rank's block of the registration (shared memory)
 * with Linux's futex, which works across processes on a shared mapping and holds no lock, so a
 * peer killed at any point cannot leave it held; elsewhere a short sleep stands for the futex.
 * And the rank's entry guard: one thread per rank at a time. A leaf. */
#define _DEFAULT_SOURCE /* syscall */
#include "sim_internal.h"

#include <limits.h>
#include <time.h>
#ifdef __linux__
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

tpf_status tpf_sim__enter(tpf_sim_rank *rk, const char *what) {
  const char *none = NULL;
  if (atomic_compare_exchange_strong(&rk->busy, &none, what)) return TPF_OK;
  return tpf_set_error(TPF_ESTATE,
                       "simulator rank %d: %s called while another thread is in %s on the same "
                       "rank; one thread per rank at a time (a rank's calls are not thread-safe)",
                       rk->rank, what, none ? none : "a call");
}

void tpf_sim__leave(tpf_sim_rank *rk) {
  atomic_store(&rk->busy, (const char *)NULL);
}

tpf_sim_rank *tpf_sim__local(tpf_sim_world *w, int r) {
  if (!w->procs) return r >= 0 && r < w->tp_size ? &w->ranks[r] : NULL;
  return r == w->proc_rank ? &w->ranks[0] : NULL;
}

void tpf_sim__ring(tpf_sim_world *w, const tpf_sim_shared *sh, int rank) {
  if (w->procs) {
    _Atomic uint32_t *bell = tpf_sim__bell(sh, rank);
    atomic_fetch_add_explicit(bell, 1u, memory_order_release);
#ifdef __linux__
    syscall(SYS_futex, (uint32_t *)(void *)bell, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
#endif
    return;
  }
  tpf_sim_rank *rk = &w->ranks[rank];
  pthread_mutex_lock(&rk->bell_mu);
  rk->bell_gen++;
  pthread_cond_broadcast(&rk->bell_cv);
  pthread_mutex_unlock(&rk->bell_mu);
}

uint64_t tpf_sim__bell_gen(tpf_sim_world *w, const tpf_sim_shared *sh, int rank) {
  if (w->procs) return atomic_load_explicit(tpf_sim__bell(sh, rank), memory_order_acquire);
  tpf_sim_rank *rk = &w->ranks[rank];
  pthread_mutex_lock(&rk->bell_mu);
  uint64_t gen = rk->bell_gen;
  pthread_mutex_unlock(&rk->bell_mu);
  return gen;
}

void tpf_sim__bell_wait(tpf_sim_world *w, const tpf_sim_shared *sh, int rank, uint64_t gen,
                        uint64_t ns) {
  if (w->procs) {
    _Atomic uint32_t *bell = tpf_sim__bell(sh, rank);
#ifdef __linux__
    /* Returns at once when the word already moved on (EAGAIN), at a wake, or after ns. */
    struct timespec rel = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
    syscall(SYS_futex, (uint32_t *)(void *)bell, FUTEX_WAIT, (uint32_t)gen, &rel, NULL, 0);
#else
    struct timespec rel = {0, 200000L}; /* 200 us: a poll where there is no futex */
    if (atomic_load(bell) == (uint32_t)gen && ns > 200000ull) nanosleep(&rel, NULL);
#endif
    return;
  }
  tpf_sim_rank *rk = &w->ranks[rank];
  uint64_t dl = tpf_sim__now_ns() + ns;
  struct timespec ts = {(time_t)(dl / 1000000000ull), (long)(dl % 1000000000ull)};
  pthread_mutex_lock(&rk->bell_mu);
  if (rk->bell_gen == gen) /* nothing rung since the caller looked: sleep */
    pthread_cond_timedwait(&rk->bell_cv, &rk->bell_mu, &ts);
  pthread_mutex_unlock(&rk->bell_mu);
}
