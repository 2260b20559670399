/* The CUDA backend's log facility (cuda_log.h). */
#define _POSIX_C_SOURCE 200809L
#include "cuda_log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <strings.h>

static _Atomic int tpf_cuda__log_level = TPF_CUDA_LOG_WARN;
static _Atomic unsigned tpf_cuda__log_mask = TPF_CUDA_LOG_ALL;
static _Atomic(FILE *) tpf_cuda__log_file = NULL;

static const char *const tpf_cuda__log_levels[] = {"NONE", "WARN", "INFO", "TRACE"};

static const struct {
  const char *name;
  unsigned bit;
} tpf_cuda__log_subsys[] = {
#define TPF_CUDA_LOG_NAME_(name, bit) {#name, 1u << (bit)},
    TPF_CUDA_LOG_SUBSYSTEMS(TPF_CUDA_LOG_NAME_)
#undef TPF_CUDA_LOG_NAME_
};
enum { TPF_CUDA_LOG_NSUBSYS = sizeof tpf_cuda__log_subsys / sizeof tpf_cuda__log_subsys[0] };

/* Warnings pass whatever the subsystem filter says (NCCL's WARN does too): the filter selects
 * what to trace, not what may go wrong. */
bool tpf_cuda__log_enabled(tpf_cuda_log_level level, unsigned subsys) {
  if (level == TPF_CUDA_LOG_NONE ||
      (int)level > atomic_load_explicit(&tpf_cuda__log_level, memory_order_relaxed))
    return false;
  return level == TPF_CUDA_LOG_WARN ||
         (atomic_load_explicit(&tpf_cuda__log_mask, memory_order_relaxed) & subsys) != 0;
}

void tpf_cuda__log(tpf_cuda_log_level level, unsigned subsys, int rank, const char *fmt, ...) {
  if (!tpf_cuda__log_enabled(level, subsys)) return;
  char line[2048];
  const size_t cap = sizeof line - 1; /* keeps room for the newline; the NUL is counted in cap */
  const int n = rank >= 0
                    ? snprintf(line, cap, "tpflex:rank %d %s %s ", rank,
                               tpf_cuda__log_level_name(level), tpf_cuda__log_subsys_name(subsys))
                    : snprintf(line, cap, "tpflex:rank ? %s %s ", tpf_cuda__log_level_name(level),
                               tpf_cuda__log_subsys_name(subsys));
  if (n < 0) return;
  size_t used = (size_t)n < cap ? (size_t)n : cap - 1;
  va_list ap;
  va_start(ap, fmt);
  int m = vsnprintf(line + used, cap - used, fmt, ap);
  va_end(ap);
  if (m < 0) m = 0;
  if ((size_t)m >= cap - used) { /* truncated: mark it, keep the newline */
    used = cap - 1;
    memcpy(line + used - 3, "...", 3);
  } else {
    used += (size_t)m;
  }
  line[used] = '\n';
  line[used + 1] = '\0';
  FILE *f = atomic_load_explicit(&tpf_cuda__log_file, memory_order_acquire);
  if (f == NULL) f = stderr;
  flockfile(f);
  fputs(line, f);
  fflush(f);
  funlockfile(f);
}

void tpf_cuda__log_configure(tpf_cuda_log_level level, unsigned subsys_mask) {
  atomic_store_explicit(&tpf_cuda__log_level, (int)level, memory_order_relaxed);
  atomic_store_explicit(&tpf_cuda__log_mask, subsys_mask & TPF_CUDA_LOG_ALL, memory_order_relaxed);
}

bool tpf_cuda__log_parse_level(const char *s, tpf_cuda_log_level *out) {
  if (s == NULL) return false;
  for (int l = TPF_CUDA_LOG_NONE; l <= TPF_CUDA_LOG_TRACE; l++)
    if (strcasecmp(s, tpf_cuda__log_levels[l]) == 0) {
      *out = (tpf_cuda_log_level)l;
      return true;
    }
  return false;
}

bool tpf_cuda__log_parse_subsys(const char *s, unsigned *out) {
  if (s == NULL) return false;
  bool invert = false;
  if (*s == '^') {
    invert = true;
    s++;
  }
  unsigned mask = 0;
  while (*s != '\0') {
    const char *end = strchr(s, ',');
    const size_t len = end != NULL ? (size_t)(end - s) : strlen(s);
    bool known = false;
    if (len == 3 && strncasecmp(s, "ALL", 3) == 0) {
      mask |= TPF_CUDA_LOG_ALL;
      known = true;
    }
    for (int i = 0; i < TPF_CUDA_LOG_NSUBSYS && !known; i++) {
      const char *name = tpf_cuda__log_subsys[i].name;
      if (strlen(name) == len && strncasecmp(s, name, len) == 0) {
        mask |= tpf_cuda__log_subsys[i].bit;
        known = true;
      }
    }
    if (!known) return false;
    if (end == NULL) break;
    s = end + 1;
  }
  *out = invert ? TPF_CUDA_LOG_ALL & ~mask : mask;
  return true;
}

const char *tpf_cuda__log_level_name(tpf_cuda_log_level level) {
  return (int)level >= TPF_CUDA_LOG_NONE && (int)level <= TPF_CUDA_LOG_TRACE
             ? tpf_cuda__log_levels[level]
             : "?";
}

const char *tpf_cuda__log_subsys_name(unsigned subsys) {
  for (int i = 0; i < TPF_CUDA_LOG_NSUBSYS; i++)
    if (tpf_cuda__log_subsys[i].bit == subsys) return tpf_cuda__log_subsys[i].name;
  return "?";
}

void tpf_cuda__log_set_file(FILE *f) {
  atomic_store_explicit(&tpf_cuda__log_file, f, memory_order_release);
}
