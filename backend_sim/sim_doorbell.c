/* The simulator's doorbell: a rank's mutex + condition + generation, rung after every store into
 * that rank's flags or ready words, so waiters sleep instead of spinning. And the rank's entry
 * guard: one thread per rank at a time. A leaf. */
#include "sim_internal.h"

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

void tpf_sim__ring(tpf_sim_rank *rk) {
  pthread_mutex_lock(&rk->bell_mu);
  rk->bell_gen++;
  pthread_cond_broadcast(&rk->bell_cv);
  pthread_mutex_unlock(&rk->bell_mu);
}
