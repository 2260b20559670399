/* A rank environment: how a harness program (the conformance body, `tpflex demo`) runs P ranks of
 * one backend and moves operand bytes between the host and where that backend computes, without
 * knowing which backend it is (libuv runs one test on two I/O backends). The simulator's
 * environment is host memory (tpf_conf_host_env, rank_env.c); CUDA's is device memory and one
 * stream per rank (cuda_env.c). */
#ifndef TPF_RANK_ENV_H
#define TPF_RANK_ENV_H

#include "tpflex/tpflex_backend.h"

#include <stdbool.h>
#include <stddef.h>

typedef struct tpf_conf_env tpf_conf_env;
typedef tpf_status (*tpf_conf_rank_fn)(tpf_backend *be, int rank, void *arg);

struct tpf_conf_env {
  const char *name; /* "sim", "cuda" */
  int max_ranks;    /* largest P this environment can run */
  /* Runs fn on P ranks concurrently (one thread each), each with its own backend; returns the
   * first non-OK status. */
  tpf_status (*run)(tpf_conf_env *env, int P, tpf_conf_rank_fn fn, void *arg);
  /* Operand memory where the backend computes (host for sim, device for CUDA). */
  void *(*mem_alloc)(tpf_conf_env *env, int rank, size_t bytes);
  void (*mem_free)(tpf_conf_env *env, int rank, void *p);
  /* Copies between host and backend memory (registrations included). */
  tpf_status (*upload)(tpf_conf_env *env, int rank, void *dst, const void *src, size_t bytes);
  tpf_status (*download)(tpf_conf_env *env, int rank, void *dst, const void *src, size_t bytes);
  /* The stream a rank passes to operations (NULL for sim), and a wait for it. */
  void *(*stream)(tpf_conf_env *env, int rank);
  tpf_status (*sync)(tpf_conf_env *env, int rank, tpf_backend *be);
  /* The backend's fp8 GEMM takes only the TN layout (cuBLASLt on Hopper): an fp8 operation with
   * trans_a or trans_w is refused with TPF_EUNSUPPORTED, and a bias needs a 16-bit D. */
  bool fp8_tn_only;
  void *ctx; /* environment's own state */
};

/* Fills env with the host-memory half of an environment (malloc'd operands, memcpy transfers, no
 * stream, the backend's own sync), for a backend that computes on host memory (the simulator).
 * The caller sets name, max_ranks, run and ctx afterwards. */
void tpf_conf_host_env(tpf_conf_env *env);

#endif /* TPF_RANK_ENV_H */
