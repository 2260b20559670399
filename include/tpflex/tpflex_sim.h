/* tpflex simulator backend: P ranks as threads of one process, all registrations in one shared
 * arena, worker threads standing for each rank's streams. Built with TPF_WITH_SIM (default ON). */
#ifndef TPFLEX_SIM_H
#define TPFLEX_SIM_H

#include "tpflex.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tpf_sim_world tpf_sim_world;

typedef struct {
  int tp_size;           /* P, 1..64 */
  uint64_t seed;         /* seeds the random step delays */
  unsigned max_delay_us; /* each step sleeps a random 0..max_delay_us first; 0 = none */
  unsigned timeout_ms;   /* bound on every wait; 0 = default (10000) */
} tpf_sim_config;

/* Creates a world of P ranks. TPF_EINVAL for P outside 1..64, TPF_ENOMEM, TPF_EBACKEND. */
tpf_status tpf_sim_world_create(const tpf_sim_config *cfg, tpf_sim_world **out);
/* Runs fn(be, rank, arg) once per rank, each on its own thread, and joins them. Returns TPF_OK
 * if every rank returned TPF_OK, else the status of the lowest failing rank (its detail is kept
 * in tpf_last_error() of the calling thread). Rank r gets the same backend object in every run,
 * valid until tpf_sim_world_destroy, so objects created in one run may be used in the next. */
tpf_status tpf_sim_run(tpf_sim_world *w, tpf_status (*fn)(tpf_backend *be, int rank, void *arg),
                       void *arg);
tpf_status tpf_sim_world_destroy(tpf_sim_world *w);

#ifdef __cplusplus
}
#endif
#endif /* TPFLEX_SIM_H */
