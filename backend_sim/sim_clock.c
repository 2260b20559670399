/* The simulator's clock: monotonic nanoseconds and condition variables timed against it. A leaf:
 * it calls no other simulator file. */
#define _POSIX_C_SOURCE 200809L
#include "sim_internal.h"

#include <time.h>

uint64_t tpf_sim__now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void tpf_sim__cond_init_mono(pthread_cond_t *cv) {
  pthread_condattr_t at;
  pthread_condattr_init(&at);
  pthread_condattr_setclock(&at, CLOCK_MONOTONIC);
  pthread_cond_init(cv, &at);
  pthread_condattr_destroy(&at);
}
