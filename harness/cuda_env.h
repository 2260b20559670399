/* The CUDA rank environment (cuda_env.c; rank_env.h): P ranks as threads on one GPU, or (process
 * mode, conformance_cuda --procs) the per-rank half of it inside each rank's own process. Part of
 * the harness library, compiled only with the CUDA backend. */
#ifndef TPF_CUDA_ENV_H
#define TPF_CUDA_ENV_H

#include "rank_env.h"

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
