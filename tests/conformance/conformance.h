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

/* Writes this rank's shard (rows [rank*R, (rank+1)*R) of the host matrix x, R = the local chunk's
 * rows) into the communicator's local chunk, through the environment's upload. */
static inline tpf_status tpf_conf_put_local(tpf_conf_env *env, int rank, tpf_comm *c,
                                            const tpf_matrix *x) {
  tpf_matrix loc;
  tpf_status st = tpf_comm_local_chunk(c, &loc);
  if (st != TPF_OK) return st;
  const size_t esz = tpf_dtype_size(x->dtype);
  const char *src = (const char *)x->ptr + (uint64_t)rank * loc.rows * x->ld * esz;
  return env->upload(env, rank, loc.ptr, src, (size_t)(loc.rows * loc.cols * esz));
}

/* Downloads the communicator's active buffer view (tpf_comm_buffer) into host, which must hold
 * full->rows * full->cols elements; *full receives the view. */
static inline tpf_status tpf_conf_get_buffer(tpf_conf_env *env, int rank, tpf_comm *c, void *host,
                                             tpf_matrix *full) {
  tpf_status st = tpf_comm_buffer(c, full);
  if (st != TPF_OK) return st;
  return env->download(env, rank, host, full->ptr,
                       (size_t)(full->rows * full->cols * tpf_dtype_size(full->dtype)));
}

/* Runs the sweep (P, T, algo/coll, dtype, shape histories); prints cases and wall time; returns
 * 0 when every case passed. argv may narrow the sweep (--quick, --tp N). */
int tpf_conformance_main(tpf_conf_env *env, int argc, char **argv);

#endif
