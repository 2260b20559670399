/* Profiler ranges (SPEC §16): an NVTX range around every operation this backend enqueues and an
 * NVTX mark at every shape change, so that Nsight Systems (and torch.profiler's emit_nvtx) show
 * tpflex's work beside the model's. NVTX3 is header-only (the CUDA toolkit's nvtx3/): without a
 * tool attached each call returns at once.
 *
 * The switch: off by default; TPFLEX_PROFILE=1 (read at the first check) or
 * tpf_cuda_set_profile(1) turns it on for the process. Off, an operation pays one relaxed atomic
 * load. Range names: "tpflex.<op> <site> T=<rows> <algo> splits=<n>[ aggregate]", the schedule
 * as it ran (after the planner's choice); colour by kind: AG GEMM blue, GEMM RS orange, bulk
 * green, shape change grey.
 */
#define _POSIX_C_SOURCE 200809L
#include "cuda_state.h"

#include <nvtx3/nvToolsExt.h>

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static atomic_int g_profile = -1; /* -1: the environment not read yet */

int tpf_cuda_profile_enabled(void) {
  int on = atomic_load_explicit(&g_profile, memory_order_relaxed);
  if (on >= 0) return on;
  const char *e = getenv("TPFLEX_PROFILE");
  on = e && e[0] && strcmp(e, "0") != 0 ? 1 : 0;
  int unread = -1; /* a concurrent tpf_cuda_set_profile wins over the environment */
  atomic_compare_exchange_strong(&g_profile, &unread, on);
  return atomic_load(&g_profile);
}

void tpf_cuda_set_profile(int on) {
  atomic_store(&g_profile, on ? 1 : 0);
}

static void put(const char *msg, uint32_t argb, bool range) {
  nvtxEventAttributes_t ev;
  memset(&ev, 0, sizeof ev);
  ev.version = NVTX_VERSION;
  ev.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
  ev.colorType = NVTX_COLOR_ARGB;
  ev.color = argb;
  ev.messageType = NVTX_MESSAGE_TYPE_ASCII;
  ev.message.ascii = msg;
  if (range)
    nvtxRangePushEx(&ev);
  else
    nvtxMarkEx(&ev);
}

int tpf_cuda__nvtx_name(const tpf_exec_args *a, char *buf, size_t len, uint32_t *argb) {
  const tpf_schedule *s = a->sched;
  const char *op = "bulk_overlap";
  *argb = 0xFF54A24Bu;
  if (s->algo != TPF_ALGO_BULK && s->coll == TPF_COLL_AG) {
    op = "ag_gemm";
    *argb = 0xFF4C78A8u;
  } else if (s->algo != TPF_ALGO_BULK) {
    op = "gemm_rs";
    *argb = 0xFFF58518u;
  }
  return snprintf(buf, len, "tpflex.%s %s T=%llu %s splits=%d%s", op,
                  a->comm_name ? a->comm_name : "?", (unsigned long long)s->rows,
                  tpf_algo_name(s->algo), s->num_splits, s->aggregate ? " aggregate" : "");
}

bool tpf_cuda__nvtx_op_push(const tpf_exec_args *a) {
  if (!tpf_cuda_profile_enabled()) return false;
  char name[320];
  uint32_t argb = 0;
  tpf_cuda__nvtx_name(a, name, sizeof name, &argb);
  put(name, argb, true);
  return true;
}

void tpf_cuda__nvtx_op_pop(void) {
  nvtxRangePop();
}

tpf_status tpf_cuda__nvtx_reg_activate(tpf_backend *be, tpf_reg *r, uint64_t active_bytes) {
  (void)be;
  if (!tpf_cuda_profile_enabled()) return TPF_OK; /* a shape change needs no device work */
  char name[160];
  snprintf(name, sizeof name, "tpflex.set_active_shape %s active_bytes=%llu", r->name,
           (unsigned long long)active_bytes);
  put(name, 0xFF9D9D9Du, false);
  return TPF_OK;
}
