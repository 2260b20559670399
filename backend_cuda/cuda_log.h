/* The CUDA backend's log (NCCL_DEBUG style): one line per event on stderr,
 *   "tpflex:rank 3 INFO REG registered 'fc1' ..."
 * ("tpflex:rank ?" where no rank is known yet). The level comes from TPF_DEBUG (NONE, WARN,
 * INFO or TRACE, case-insensitive; default WARN, so only warnings print) and the subsystems
 * from TPF_DEBUG_SUBSYS (a comma-separated list of the names below, ALL by default; a leading
 * '^' selects every subsystem but those listed), which filters INFO and TRACE lines: warnings
 * print whatever it says. The legacy TPF_CUDA_DEBUG (any value) means
 * TPF_DEBUG=INFO when TPF_DEBUG is unset. The variables are read by the parameter registry
 * (cuda_param.c), which configures this file once per process: this file reads no environment
 * and calls no other file of backend_cuda/ (a leaf of the call graph, cuda_backend.c).
 *
 * Lines are formatted whole and written with one call under the stream's lock, so lines of rank
 * threads never interleave. A disabled level costs one relaxed atomic load (the macros test it
 * before formatting anything). */
#ifndef TPF_CUDA_LOG_H
#define TPF_CUDA_LOG_H

#include <stdbool.h>
#include <stdio.h>

typedef enum {
  TPF_CUDA_LOG_NONE = 0,
  TPF_CUDA_LOG_WARN = 1,
  TPF_CUDA_LOG_INFO = 2,
  TPF_CUDA_LOG_TRACE = 3
} tpf_cuda_log_level;

/* Subsystems: name and bit. */
#define TPF_CUDA_LOG_SUBSYSTEMS(X)                                                                 \
  X(INIT, 0)      /* backend creation and destruction */                                           \
  X(ENV, 1)       /* the parameter registry: values, invalid settings */                           \
  X(BOOT, 2)      /* bootstraps and the configuration exchange */                                  \
  X(REG, 3)       /* registrations, peer mapping, the host agreement */                            \
  X(TRANSPORT, 4) /* the per-peer transports */                                                    \
  X(EXEC, 5)      /* step mapping and the enqueuers */                                             \
  X(STATUS, 6)    /* the device status area, deferred errors */                                    \
  X(GEMM, 7)      /* cuBLASLt and the fallback GEMM */

enum {
#define TPF_CUDA_LOG_BIT_(name, bit) TPF_CUDA_LOG_##name = 1u << (bit),
  TPF_CUDA_LOG_SUBSYSTEMS(TPF_CUDA_LOG_BIT_)
#undef TPF_CUDA_LOG_BIT_
      TPF_CUDA_LOG_ALL = (1u << 8) - 1u
};

/* Whether a line of `level` for subsystem bit `subsys` would be written. */
bool tpf_cuda__log_enabled(tpf_cuda_log_level level, unsigned subsys);
/* Writes one line (printf-style, no trailing newline needed) if enabled. rank < 0: unknown. */
void tpf_cuda__log(tpf_cuda_log_level level, unsigned subsys, int rank, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;

#define TPF_CUDA_LOG(level, subsys, rank, ...)                                                     \
  do {                                                                                             \
    if (tpf_cuda__log_enabled((level), (subsys)))                                                  \
      tpf_cuda__log((level), (subsys), (rank), __VA_ARGS__);                                       \
  } while (0)
#define TPF_CUDA_WARN(subsys, rank, ...)                                                           \
  TPF_CUDA_LOG(TPF_CUDA_LOG_WARN, TPF_CUDA_LOG_##subsys, rank, __VA_ARGS__)
#define TPF_CUDA_INFO(subsys, rank, ...)                                                           \
  TPF_CUDA_LOG(TPF_CUDA_LOG_INFO, TPF_CUDA_LOG_##subsys, rank, __VA_ARGS__)
#define TPF_CUDA_TRACE(subsys, rank, ...)                                                          \
  TPF_CUDA_LOG(TPF_CUDA_LOG_TRACE, TPF_CUDA_LOG_##subsys, rank, __VA_ARGS__)

/* Sets the level and the subsystem mask (the registry does, once per process). */
void tpf_cuda__log_configure(tpf_cuda_log_level level, unsigned subsys_mask);
/* Parses a TPF_DEBUG value; false (out untouched) when it names no level. */
bool tpf_cuda__log_parse_level(const char *s, tpf_cuda_log_level *out);
/* Parses a TPF_DEBUG_SUBSYS value; false (out untouched) when a name is unknown. */
bool tpf_cuda__log_parse_subsys(const char *s, unsigned *out);
/* "WARN", "INFO", ...; "INIT", "REG", ... for one subsystem bit ("?" otherwise). */
const char *tpf_cuda__log_level_name(tpf_cuda_log_level level);
const char *tpf_cuda__log_subsys_name(unsigned subsys);
/* Tests: where lines go (NULL: stderr, the default). */
void tpf_cuda__log_set_file(FILE *f);

#endif /* TPF_CUDA_LOG_H */
