/* The conformance sweep on the CUDA backend (environment in cuda_env.c). Exit status 77 (CTest
 * SKIP_RETURN_CODE) with "skipped: no GPU" when no CUDA device is usable. */
#include "cuda_env.h"

#include <stdio.h>

int main(int argc, char **argv) {
  tpf_conf_env env;
  tpf_status st = tpf_cuda_conf_env_init(&env);
  if (st == TPF_EUNSUPPORTED) {
    printf("skipped: %s\n", tpf_last_error());
    return 77;
  }
  if (st != TPF_OK) {
    printf("conformance[cuda]: %s: %s\n", tpf_status_name(st), tpf_last_error());
    return 1;
  }
  int rc = tpf_conformance_main(&env, argc, argv);
  tpf_cuda_conf_env_free(&env);
  return rc;
}
