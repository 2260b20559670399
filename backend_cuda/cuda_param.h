/* The CUDA backend's environment knobs, in one registry read once per process (NCCL_PARAM
 * style): every getenv of backend_cuda/ is here. Each knob has a name, a kind, a default and a
 * parsed value; TPF_DEBUG=INFO (subsystem ENV) prints the table when it is read.
 *
 * Kinds:
 *   U64    decimal (strtoull, the whole string); empty or unset: the default. A value that is no
 *          number, or lies outside [lo, hi], is a WARN line naming the variable and the default
 *          used instead.
 *   CLAMP  as U64, but a number outside [lo, hi] is clamped to it (with a WARN line).
 *   BOOL   on when set, non-empty and not "0".
 *   FLAG   on when set at all, to any value (the variable's presence is the setting).
 *   LEVEL  a log level for cuda_log.c: NONE, WARN, INFO or TRACE.
 *   SUBSYS a cuda_log.c subsystem list ("INIT,REG", "^GEMM", "ALL").
 * The variables are read at the first tpf_cuda__param_load (the first backend, bootstrap or host
 * agreement of the process to be created); changes of the environment after that are not seen
 * (tpf_cuda__param_reload exists for tests). Calls only cuda_log.c, which it configures. */
#ifndef TPF_CUDA_PARAM_H
#define TPF_CUDA_PARAM_H

#include "cuda_log.h"
#include "tpflex/tpflex_backend.h" /* TPF_MAX_COMPUTE_STREAMS */

#include <stdbool.h>
#include <stdint.h>

/* X(id, variable, kind, default, lo, hi, what) */
#define TPF_CUDA_PARAMS(X)                                                                         \
  X(TIMEOUT_MS, "TPF_CUDA_TIMEOUT_MS", U64, 30000, 0, UINT64_MAX,                                  \
    "bound of every wait for a peer, ms (tpf_cuda_backend_set_timeout overrides)")                 \
  X(COMM_CTAS, "TPF_CUDA_COMM_CTAS", CLAMP, 16, 1, 1024,                                           \
    "CTAs of the reduction and bulk copy kernels; SMs left to them by PIPELINE/BULK GEMMs")        \
  X(COMPUTE_STREAMS, "TPF_CUDA_COMPUTE_STREAMS", CLAMP, TPF_MAX_COMPUTE_STREAMS, 1,                \
    TPF_MAX_COMPUTE_STREAMS, "distinct compute streams (set: also when ranks share a device)")     \
  X(WORKSPACE_BYTES, "TPF_CUDA_WORKSPACE_BYTES", U64, 32ull << 20, 0, UINT64_MAX,                  \
    "cuBLASLt workspace per compute stream, bytes")                                                \
  X(GEMM_FALLBACK, "TPF_CUDA_GEMM_FALLBACK", BOOL, 0, 0, 1,                                        \
    "every GEMM by the plain fallback kernel (diagnostic)")                                        \
  X(DEVICE_FLAGS, "TPF_CUDA_DEVICE_FLAGS", FLAG, 0, 0, 1,                                          \
    "in-process ranks use the device-flags transport, not host-ordered events (diagnostic)")       \
  X(MEMOPS, "TPF_CUDA_MEMOPS", FLAG, 0, 0, 1,                                                      \
    "ranks in other processes signal with stream memory operations, not spinning flag kernels")    \
  X(LEAN_ENQUEUE, "TPF_CUDA_LEAN_ENQUEUE", U64, 1, 0, 1,                                           \
    "1: in-process groups enqueue fewer calls (virtual RECVs, deduplicated waits, handshake "      \
    "waits "                                                                                       \
    "on the peers a schedule touches); 0: every step's own calls, for comparison")                 \
  X(BOOT_TIMEOUT_MS, "TPF_CUDA_BOOT_TIMEOUT_MS", U64, 120000, 1, UINT64_MAX,                       \
    "bound of the threads and NCCL bootstraps' collectives, ms")                                   \
  X(MAX_CONNECTIONS, "CUDA_DEVICE_MAX_CONNECTIONS", U64, 8, 0, UINT64_MAX,                         \
    "CUDA's hardware queues per device (read to size compute streams of ranks sharing one)")       \
  X(DEBUG_LEVEL, "TPF_DEBUG", LEVEL, TPF_CUDA_LOG_WARN, 0, 3,                                      \
    "log level: NONE, WARN, INFO, TRACE")                                                          \
  X(DEBUG_SUBSYS, "TPF_DEBUG_SUBSYS", SUBSYS, TPF_CUDA_LOG_ALL, 0, TPF_CUDA_LOG_ALL,               \
    "logged subsystems: INIT,ENV,BOOT,REG,TRANSPORT,EXEC,STATUS,GEMM, ALL or ^list")               \
  X(CUDA_DEBUG, "TPF_CUDA_DEBUG", FLAG, 0, 0, 1, "legacy: TPF_DEBUG=INFO when TPF_DEBUG is unset")

typedef enum {
#define TPF_CUDA_PARAM_ID_(id, var, kind, dflt, lo, hi, what) TPF_CUDA_PARAM_##id,
  TPF_CUDA_PARAMS(TPF_CUDA_PARAM_ID_)
#undef TPF_CUDA_PARAM_ID_
      TPF_CUDA_PARAM_COUNT
} tpf_cuda_param_id;

typedef enum {
  TPF_CUDA_PARAM_U64,
  TPF_CUDA_PARAM_CLAMP,
  TPF_CUDA_PARAM_BOOL,
  TPF_CUDA_PARAM_FLAG,
  TPF_CUDA_PARAM_LEVEL,
  TPF_CUDA_PARAM_SUBSYS
} tpf_cuda_param_kind;

/* One knob as read. */
typedef struct {
  const char *name; /* the environment variable */
  tpf_cuda_param_kind kind;
  uint64_t dflt, lo, hi;
  const char *what;
  bool set;       /* the variable was present (even empty) */
  bool valid;     /* false: a WARN line said so and value is the default (or the clamp) */
  uint64_t value; /* what the backend uses */
  char raw[64];   /* the variable's text (truncated), for printing */
} tpf_cuda_param;

/* Reads every knob once per process (later calls return at once); rank names the caller in
 * log lines (-1: not known). Thread-safe. */
void tpf_cuda__param_load(int rank);
/* Tests only, not thread-safe against concurrent readers: forget and read again. */
void tpf_cuda__param_reload(int rank);
/* The knob's record / value (loading the registry first if needed). */
const tpf_cuda_param *tpf_cuda__param(tpf_cuda_param_id id);
uint64_t tpf_cuda__param_u64(tpf_cuda_param_id id);
bool tpf_cuda__param_on(tpf_cuda_param_id id);     /* value != 0 */
bool tpf_cuda__param_is_set(tpf_cuda_param_id id); /* the variable was present */

#endif /* TPF_CUDA_PARAM_H */
