/* `tpflex demo --backend cuda`: the demo's ranks as threads on one GPU, through the same
 * environment the CUDA conformance test uses (tests/conformance/cuda_env.c). */
#ifdef TPF_HAVE_CUDA
#include "cmds.h"
#include "cuda_env.h"

tpf_status tpf_demo_cuda_env(struct tpf_conf_env *env, int tp_size) {
  (void)tp_size; /* the environment runs any P up to its max_ranks; the demo checks */
  return tpf_cuda_conf_env_init(env);
}
#else
/* Keeps ISO C happy: a translation unit must declare something. */
typedef int tpf_demo_cuda_unused;
#endif
