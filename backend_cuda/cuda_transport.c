/* The CUDA backend's transport table and the choice of a transport per registration
 * (cuda_state.h).
 *
 * Method. As NCCL walks its transports (P2P, SHM, NET) asking each whether it can connect a
 * pair of ranks, registration walks the rows of kTransports in order and takes the first whose
 * can_connect accepts the group: all peers of a registration share one transport, since the
 * collective steps (HANDSHAKE, BARRIER) run one protocol over all peers at once, and r->tp
 * names it. The rows, in order:
 *   memops  under TPF_CUDA_MEMOPS=1 for groups that span processes, on a device with 64-bit
 *           stream memory operations: the flag words of cuda_transport_flags.c, signalled by
 *           stream memory operations instead of spinning kernels (a warning where the device
 *           has none: the next row then serves);
 *   events  when every rank of the group lives in this process (the host-ordered CUDA events of
 *           cuda_transport_events.c), unless TPF_CUDA_DEVICE_FLAGS asks for the device flags;
 *   flags   every group (cuda_transport_flags.c): peers in other processes through CUDA IPC with
 *           the host agreement, and in-process peers of a group that spans processes.
 * Every row signals over memory the peers map; a transport that moves the bytes itself (ncclSend
 * and ncclRecv on the caller's communicator, for peers without P2P access or on other nodes)
 * would be a row of its own before flags. There is none: such peers are refused where the
 * mapping is made (cuda_reg.c, TPF_EUNSUPPORTED). */
#define _POSIX_C_SOURCE 200809L
#include "cuda_state.h"
#include "cuda_log.h"
#include "cuda_param.h"

static bool tpf_cuda__memops_connect(const tpf_cuda_backend *b, const tpf_reg *r) {
  if (!r->remote || !tpf_cuda__param_on(TPF_CUDA_PARAM_MEMOPS)) return false;
  if (tpf_cuda__memops_available(b->device)) return true;
  TPF_CUDA_WARN(TRANSPORT, b->base.rank,
                "TPF_CUDA_MEMOPS=1 but device %d has no 64-bit stream memory operations: "
                "'%s' uses the flag kernels",
                b->device, r->name);
  return false;
}

/* TPF_CUDA_DEVICE_FLAGS forces the device flag kernels on in-process ranks too: a diagnostic
 * only, since spinning waits of ranks sharing one GPU can stall (docs/results/h200.md). */
static bool tpf_cuda__events_connect(const tpf_cuda_backend *b, const tpf_reg *r) {
  (void)b;
  return !r->remote && !tpf_cuda__param_on(TPF_CUDA_PARAM_DEVICE_FLAGS);
}

static bool tpf_cuda__flags_connect(const tpf_cuda_backend *b, const tpf_reg *r) {
  (void)b;
  (void)r;
  return true;
}

static const struct {
  tpf_cuda_tp_kind kind;
  bool (*can_connect)(const tpf_cuda_backend *b, const tpf_reg *r);
} kTransports[] = {
    {TPF_CUDA_TP_MEMOPS, tpf_cuda__memops_connect},
    {TPF_CUDA_TP_EVENTS, tpf_cuda__events_connect},
    {TPF_CUDA_TP_FLAGS, tpf_cuda__flags_connect},
};

const tpf_cuda_transport *const tpf_cuda__transports[TPF_CUDA_TP_COUNT] = {
    [TPF_CUDA_TP_EVENTS] = &tpf_cuda__transport_events,
    [TPF_CUDA_TP_FLAGS] = &tpf_cuda__transport_flags,
    [TPF_CUDA_TP_MEMOPS] = &tpf_cuda__transport_memops,
};

void tpf_cuda__transport_select(const tpf_cuda_backend *b, tpf_reg *r) {
  const int P = b->base.tp_size, me = b->base.rank;
  tpf_cuda_tp_kind kind = TPF_CUDA_TP_FLAGS;
  for (size_t i = 0; i < sizeof kTransports / sizeof kTransports[0]; i++)
    if (kTransports[i].can_connect(b, r)) {
      kind = kTransports[i].kind;
      break;
    }
  r->tp = NULL;
  for (int q = 0; q < P; q++) {
    r->peer_tp[q] = q == me ? NULL : tpf_cuda__transports[kind];
    if (q != me) r->tp = r->peer_tp[q];
  }
}
