/* The host-memory half of a rank environment (rank_env.h): what a backend that computes on host
 * memory, the simulator, needs from a harness program. */
#include "rank_env.h"

#include "internal.h" /* tpf__be_sync */

#include <stdlib.h>
#include <string.h>

static void *host_alloc(tpf_conf_env *env, int rank, size_t bytes) {
  (void)env;
  (void)rank;
  return malloc(bytes ? bytes : 1);
}

static void host_free(tpf_conf_env *env, int rank, void *p) {
  (void)env;
  (void)rank;
  free(p);
}

static tpf_status host_copy(tpf_conf_env *env, int rank, void *dst, const void *src, size_t n) {
  (void)env;
  (void)rank;
  memcpy(dst, src, n);
  return TPF_OK;
}

static void *no_stream(tpf_conf_env *env, int rank) {
  (void)env;
  (void)rank;
  return NULL;
}

static tpf_status backend_sync(tpf_conf_env *env, int rank, tpf_backend *be) {
  (void)env;
  (void)rank;
  return tpf__be_sync(be, NULL); /* the core's (internal) path into the backend */
}

void tpf_conf_host_env(tpf_conf_env *env) {
  env->mem_alloc = host_alloc;
  env->mem_free = host_free;
  env->upload = host_copy;
  env->download = host_copy;
  env->stream = no_stream;
  env->sync = backend_sync;
  env->fp8_tn_only = false;
}
