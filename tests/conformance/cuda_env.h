/* The CUDA conformance environment (cuda_env.c): P ranks as threads on one GPU. */
#ifndef TPF_CUDA_ENV_H
#define TPF_CUDA_ENV_H

#include "conformance.h"

/* Fills env for ranks as threads on GPU TPF_CUDA_TEST_DEVICE (default 0). TPF_EUNSUPPORTED when
 * no GPU is usable, TPF_ENOMEM. Free with tpf_cuda_conf_env_free. */
tpf_status tpf_cuda_conf_env_init(tpf_conf_env *env);
void tpf_cuda_conf_env_free(tpf_conf_env *env);

#endif
