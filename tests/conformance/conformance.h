/* The conformance body, compiled once per backend (libuv runs one test on two I/O backends).
 * A backend's test file fills a tpf_conf_env and calls tpf_conformance_main. */
#ifndef TPF_CONFORMANCE_H
#define TPF_CONFORMANCE_H

#include "tpflex/tpflex_backend.h"

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
  void *ctx; /* environment's own state */
};

/* Runs the sweep (P, T, algo/coll, dtype, shape histories); prints cases and wall time; returns
 * 0 when every case passed. argv may narrow the sweep (--quick, --tp N). */
int tpf_conformance_main(tpf_conf_env *env, int argc, char **argv);

#endif
