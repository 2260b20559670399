/* The interface of the ABI-1 backend (abi1_backend.c, compiled against the released 0.1
 * headers) to tests compiled against today's: plain C types only, no tpflex struct. */
#ifndef TPF_ABI1_BACKEND_H
#define TPF_ABI1_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#define TPF_ABI1_MAX_STEPS 64

/* What the 0.1 backend read from the last schedule and arguments it was given. */
typedef struct {
  int executes;
  int tp_size, rank, algo, coll, dtype, num_splits, aggregate, num_compute_streams, nsteps;
  uint64_t rows, cols, chunk_rows, chunk_bytes, registered_bytes, active_bytes;
  uint64_t gemm_m, gemm_n, gemm_k;
  int kind[TPF_ABI1_MAX_STEPS], stream[TPF_ABI1_MAX_STEPS], ndeps[TPF_ABI1_MAX_STEPS];
  uint64_t m[TPF_ABI1_MAX_STEPS], n[TPF_ABI1_MAX_STEPS], k[TPF_ABI1_MAX_STEPS];
  uint64_t seq;
  char comm_name[64];
  const void *x, *w, *d;
} tpf_abi1_seen;

/* A P = 1 backend (tpf_backend *, as void *) that records into *seen; free with _free. */
void *tpf_abi1_backend_new(tpf_abi1_seen *seen);
void tpf_abi1_backend_free(void *be);

/* Offsets and sizes as the 0.1 header lays them out: names[i] ("tpf_schedule.nsteps",
 * "sizeof tpf_step") and values[i]; returns the count (at most max). */
size_t tpf_abi1_layout(const char **names, size_t *values, size_t max);

#endif
