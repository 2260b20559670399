/* The CUDA rank environment (cuda_env.c), the one that the tests (conformance_cuda), `tpflex
 * demo`, `tpflex bench` and their GPU checks share. Two layers:
 *   - tpf_cuda_ranks: P ranks as persistent threads of this process on one GPU, each with its own
 *     tpflex CUDA backend (made through the public API only: tpflex_cuda.h) and non-blocking
 *     stream, bootstrapped in-process (tpf_cuda_threads) or, in process mode, over a bootstrap
 *     between processes with one rank here; a run calls a function on every rank at once;
 *   - tpf_conf_env (rank_env.h) on top of it: operand memory and transfers on the device, one
 *     stream per rank, or (process mode, conformance_cuda --procs) the per-rank half of it inside
 *     each rank's own process.
 * Part of the harness library, compiled only with the CUDA backend. */
#ifndef TPF_CUDA_ENV_H
#define TPF_CUDA_ENV_H

#include "rank_env.h"
#include "tpflex/tpflex_cuda.h"

/* ---- rank threads ---- */

typedef struct tpf_cuda_ranks tpf_cuda_ranks;
/* What a run calls on each rank's thread: the global rank, its backend and its stream (a
 * cudaStream_t). */
typedef tpf_status (*tpf_cuda_rank_fn)(int rank, tpf_backend *be, void *stream, void *arg);

typedef struct {
  int device; /* the GPU every rank of this process uses */
  int tp;     /* P: ranks of the group, in all processes */
  int nlocal; /* rank threads in this process: tp, or 1 in process mode */
  int rank0;  /* the global rank of this process's first rank thread */
  /* Process mode: the bootstrap between the processes (this process's rank); NULL: every rank is
   * a thread here, bootstrapped through tpf_cuda_threads. */
  const tpf_bootstrap *xboot;
  /* The local ranks' streams, owned by the caller; NULL: each rank thread creates its own
   * non-blocking stream and destroys it at the end. */
  void *const *streams;
} tpf_cuda_ranks_config;

/* Starts the rank threads; each selects the device, bootstraps and creates its backend (and
 * stream). TPF_EINVAL for a bad configuration (nlocal outside 1..TPF_MAX_RANKS or above tp;
 * without xboot, not all tp ranks from rank 0), TPF_ENOMEM, or the first rank's failure as
 * "CUDA rank group of P: rank r: why"; nothing is left running then. */
tpf_status tpf_cuda_ranks_create(const tpf_cuda_ranks_config *cfg, tpf_cuda_ranks **out);
/* Calls fn on every local rank concurrently and waits for all. The first failing rank's status,
 * with the error "rank r: why" (tpf_cuda_ranks_status names every rank's). */
tpf_status tpf_cuda_ranks_run(tpf_cuda_ranks *g, tpf_cuda_rank_fn fn, void *arg);
/* Local rank i's status in the last run, and its error text (empty when TPF_OK). */
tpf_status tpf_cuda_ranks_status(const tpf_cuda_ranks *g, int i, const char **why);
/* Stops the threads: each waits for its stream, destroys its backend (and its own stream). The
 * first backend destroy's failure, else TPF_OK. NULL is a no-op. */
tpf_status tpf_cuda_ranks_destroy(tpf_cuda_ranks *g);

/* ---- the rank environment (rank_env.h) ---- */

/* Fills env for ranks as threads on GPU TPF_CUDA_TEST_DEVICE (default 0). TPF_EUNSUPPORTED when
 * no GPU is usable, TPF_ENOMEM. Free with tpf_cuda_conf_env_free. */
tpf_status tpf_cuda_conf_env_init(tpf_conf_env *env);
void tpf_cuda_conf_env_free(tpf_conf_env *env);

/* Process mode: fills env like tpf_cuda_conf_env_init but makes no CUDA call in this process (a
 * process that has initialised CUDA cannot fork children that use it). The caller replaces
 * env->run with one that starts a process per rank; each rank's process calls
 * tpf_cuda_conf_env_enter_rank before using the environment, and tpf_cuda_conf_env_leave_rank at
 * the end. TPF_ENOMEM. */
tpf_status tpf_cuda_conf_env_init_lazy(tpf_conf_env *env);
/* In rank's own process: selects `device`, keeps its stream-ordered pool memory and creates the
 * rank's stream. TPF_EBACKEND with CUDA's text. */
tpf_status tpf_cuda_conf_env_enter_rank(tpf_conf_env *env, int rank, int device);
void tpf_cuda_conf_env_leave_rank(tpf_conf_env *env, int rank);

#endif
