/* The CUDA backend's parameter registry (cuda_param.h): the only getenv calls of backend_cuda/.
 *
 * Method: tpf_cuda__param_load reads and parses every knob of TPF_CUDA_PARAMS under a mutex the
 * first time it is called, then publishes the table with a release store, so readers need no
 * lock. It first settles the log's level and subsystems (TPF_DEBUG, TPF_DEBUG_SUBSYS, the legacy
 * TPF_CUDA_DEBUG) and configures cuda_log.c, so that the WARN lines about invalid values, and
 * the INFO table, obey them. */
#define _POSIX_C_SOURCE 200809L
#include "cuda_param.h"

#include "cuda_log.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static tpf_cuda_param tpf_cuda__params[TPF_CUDA_PARAM_COUNT] = {
#define TPF_CUDA_PARAM_INIT_(id_, var_, kind_, dflt_, lo_, hi_, what_)                             \
  [TPF_CUDA_PARAM_##id_] = {.name = var_,                                                          \
                            .kind = TPF_CUDA_PARAM_##kind_,                                        \
                            .dflt = (uint64_t)(dflt_),                                             \
                            .lo = (uint64_t)(lo_),                                                 \
                            .hi = (uint64_t)(hi_),                                                 \
                            .what = what_},
    TPF_CUDA_PARAMS(TPF_CUDA_PARAM_INIT_)
#undef TPF_CUDA_PARAM_INIT_
};
static pthread_mutex_t tpf_cuda__param_mu = PTHREAD_MUTEX_INITIALIZER;
static atomic_bool tpf_cuda__param_loaded;

/* Parses one knob; a problem is written into warn (empty: none). */
static void tpf_cuda__param_parse(tpf_cuda_param *p, char *warn, size_t nwarn) {
  const char *v = getenv(p->name);
  warn[0] = '\0';
  p->set = v != NULL;
  p->valid = true;
  p->value = p->dflt;
  snprintf(p->raw, sizeof p->raw, "%s", v != NULL ? v : "");
  switch (p->kind) {
  case TPF_CUDA_PARAM_U64:
  case TPF_CUDA_PARAM_CLAMP: {
    if (v == NULL || *v == '\0') return;
    char *end = NULL;
    const unsigned long long x = strtoull(v, &end, 10);
    if (end == NULL || *end != '\0') {
      p->valid = false;
      snprintf(warn, nwarn, "%s='%s' is not a decimal number: using the default %llu", p->name,
               p->raw, (unsigned long long)p->dflt);
      return;
    }
    if ((uint64_t)x >= p->lo && (uint64_t)x <= p->hi) {
      p->value = (uint64_t)x;
      return;
    }
    p->valid = false;
    if (p->kind == TPF_CUDA_PARAM_CLAMP) {
      p->value = (uint64_t)x < p->lo ? p->lo : p->hi;
      snprintf(warn, nwarn, "%s=%llu is outside %llu..%llu: using %llu", p->name, x,
               (unsigned long long)p->lo, (unsigned long long)p->hi, (unsigned long long)p->value);
    } else {
      snprintf(warn, nwarn, "%s=%llu is outside %llu..%llu: using the default %llu", p->name, x,
               (unsigned long long)p->lo, (unsigned long long)p->hi, (unsigned long long)p->dflt);
    }
    return;
  }
  case TPF_CUDA_PARAM_BOOL:
    p->value = v != NULL && v[0] != '\0' && strcmp(v, "0") != 0;
    return;
  case TPF_CUDA_PARAM_FLAG:
    p->value = v != NULL;
    /* Presence is the setting, so "=0" turns the feature ON: say so (session 6: a script that
     * set TPF_CUDA_DEVICE_FLAGS=0 to compare against the default measured the flags twice). */
    if (v != NULL && (strcmp(v, "0") == 0 || strcasecmp(v, "off") == 0 ||
                      strcasecmp(v, "false") == 0 || strcasecmp(v, "no") == 0))
      snprintf(warn, nwarn,
               "%s='%s' turns it ON: a flag is set by its presence; unset the variable to turn "
               "it off",
               p->name, p->raw);
    return;
  case TPF_CUDA_PARAM_LEVEL: {
    if (v == NULL || *v == '\0') return;
    tpf_cuda_log_level l;
    if (tpf_cuda__log_parse_level(v, &l)) {
      p->value = (uint64_t)l;
      return;
    }
    p->valid = false;
    snprintf(warn, nwarn, "%s='%s' is not NONE, WARN, INFO or TRACE: using the default %s", p->name,
             p->raw, tpf_cuda__log_level_name((tpf_cuda_log_level)p->dflt));
    return;
  }
  case TPF_CUDA_PARAM_SUBSYS: {
    if (v == NULL || *v == '\0') return;
    unsigned mask;
    if (tpf_cuda__log_parse_subsys(v, &mask)) {
      p->value = mask;
      return;
    }
    p->valid = false;
    snprintf(warn, nwarn,
             "%s='%s' names an unknown subsystem (INIT, ENV, BOOT, REG, TRANSPORT, EXEC, STATUS, "
             "GEMM, ALL): using the default ALL",
             p->name, p->raw);
    return;
  }
  }
}

static void tpf_cuda__param_read(int rank) {
  static char warn[TPF_CUDA_PARAM_COUNT][256]; /* under the mutex */
  for (int i = 0; i < TPF_CUDA_PARAM_COUNT; i++)
    tpf_cuda__param_parse(&tpf_cuda__params[i], warn[i], sizeof warn[i]);
  tpf_cuda_param *lvl = &tpf_cuda__params[TPF_CUDA_PARAM_DEBUG_LEVEL];
  /* The legacy switch: TPF_CUDA_DEBUG alone means INFO. */
  if (!lvl->set && tpf_cuda__params[TPF_CUDA_PARAM_CUDA_DEBUG].value != 0)
    lvl->value = TPF_CUDA_LOG_INFO;
  tpf_cuda__log_configure((tpf_cuda_log_level)lvl->value,
                          (unsigned)tpf_cuda__params[TPF_CUDA_PARAM_DEBUG_SUBSYS].value);
  for (int i = 0; i < TPF_CUDA_PARAM_COUNT; i++)
    if (warn[i][0] != '\0') TPF_CUDA_WARN(ENV, rank, "%s", warn[i]);
  if (!tpf_cuda__log_enabled(TPF_CUDA_LOG_INFO, TPF_CUDA_LOG_ENV)) return;
  for (int i = 0; i < TPF_CUDA_PARAM_COUNT; i++) {
    const tpf_cuda_param *p = &tpf_cuda__params[i];
    char val[32];
    if (p->kind == TPF_CUDA_PARAM_LEVEL)
      snprintf(val, sizeof val, "%s", tpf_cuda__log_level_name((tpf_cuda_log_level)p->value));
    else if (p->kind == TPF_CUDA_PARAM_SUBSYS)
      snprintf(val, sizeof val, "0x%02llx", (unsigned long long)p->value);
    else
      snprintf(val, sizeof val, "%llu", (unsigned long long)p->value);
    TPF_CUDA_INFO(ENV, rank, "%s = %s (%s%s%s%s): %s", p->name, val,
                  !p->set    ? "default"
                  : p->valid ? "set"
                             : "invalid, set",
                  p->set ? " '" : "", p->set ? p->raw : "", p->set ? "'" : "", p->what);
  }
}

void tpf_cuda__param_load(int rank) {
  if (atomic_load_explicit(&tpf_cuda__param_loaded, memory_order_acquire)) return;
  pthread_mutex_lock(&tpf_cuda__param_mu);
  if (!atomic_load_explicit(&tpf_cuda__param_loaded, memory_order_relaxed)) {
    tpf_cuda__param_read(rank);
    atomic_store_explicit(&tpf_cuda__param_loaded, true, memory_order_release);
  }
  pthread_mutex_unlock(&tpf_cuda__param_mu);
}

void tpf_cuda__param_reload(int rank) {
  pthread_mutex_lock(&tpf_cuda__param_mu);
  tpf_cuda__param_read(rank);
  atomic_store_explicit(&tpf_cuda__param_loaded, true, memory_order_release);
  pthread_mutex_unlock(&tpf_cuda__param_mu);
}

const tpf_cuda_param *tpf_cuda__param(tpf_cuda_param_id id) {
  tpf_cuda__param_load(-1);
  return &tpf_cuda__params[id];
}

uint64_t tpf_cuda__param_u64(tpf_cuda_param_id id) {
  return tpf_cuda__param(id)->value;
}

bool tpf_cuda__param_on(tpf_cuda_param_id id) {
  return tpf_cuda__param(id)->value != 0;
}

bool tpf_cuda__param_is_set(tpf_cuda_param_id id) {
  return tpf_cuda__param(id)->set;
}
