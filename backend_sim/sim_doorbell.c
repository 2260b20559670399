/* The simulator's doorbell: a rank's mutex + condition + generation, rung after every store into
 * that rank's flags or ready words, so waiters sleep instead of spinning. A leaf. */
#include "sim_internal.h"

void tpf_sim__ring(tpf_sim_rank *rk) {
  pthread_mutex_lock(&rk->bell_mu);
  rk->bell_gen++;
  pthread_cond_broadcast(&rk->bell_cv);
  pthread_mutex_unlock(&rk->bell_mu);
}
