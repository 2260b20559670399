/* The CUDA backend's transport table and the choice of a transport per peer (cuda_state.h).
 *
 * Method. At registration every peer q gets one of the table's transports:
 *   events  when every rank of the group lives in this process (the host-ordered CUDA events of
 *           cuda_transport_events.c), unless TPF_CUDA_DEVICE_FLAGS asks for the device flags;
 *   flags   otherwise (cuda_transport_flags.c): peers in other processes (CUDA IPC, with the
 *           host agreement), and in-process peers of a group that spans processes, since the
 *           collective steps (HANDSHAKE, BARRIER) run one protocol over all peers at once;
 *   memops  instead of flags under TPF_CUDA_MEMOPS=1 for groups that span processes: the same
 *           flag words, signalled by stream memory operations instead of spinning kernels.
 * So today all peers of a registration share one transport, and r->tp names it. The NCCL slot
 * is empty: peers that cannot map each other's memory are refused where the mapping is made
 * (cuda_reg.c, TPF_EUNSUPPORTED). */
#define _POSIX_C_SOURCE 200809L
#include "cuda_state.h"
#include "cuda_log.h"
#include "cuda_param.h"

const tpf_cuda_transport *const tpf_cuda__transports[TPF_CUDA_TP_COUNT] = {
    [TPF_CUDA_TP_EVENTS] = &tpf_cuda__transport_events,
    [TPF_CUDA_TP_FLAGS] = &tpf_cuda__transport_flags,
    /* A transport that moves the bytes too (ncclSend/ncclRecv over the caller's communicator)
     * for peers without P2P access or on other nodes: not implemented. */
    [TPF_CUDA_TP_NCCL] = NULL,
    [TPF_CUDA_TP_MEMOPS] = &tpf_cuda__transport_memops,
};

void tpf_cuda__transport_select(const tpf_cuda_backend *b, tpf_reg *r) {
  const int P = b->base.tp_size, me = b->base.rank;
  /* TPF_CUDA_DEVICE_FLAGS forces the device flag kernels on in-process ranks too: a diagnostic
   * only, since spinning waits of ranks sharing one GPU can stall (docs/results/h200.md). */
  tpf_cuda_tp_kind kind = !r->remote && !tpf_cuda__param_on(TPF_CUDA_PARAM_DEVICE_FLAGS)
                              ? TPF_CUDA_TP_EVENTS
                              : TPF_CUDA_TP_FLAGS;
  /* TPF_CUDA_MEMOPS: groups that span processes signal with stream memory operations where the
   * device has them (cuda_transport_flags.c), else the flag kernels. */
  if (kind == TPF_CUDA_TP_FLAGS && r->remote && tpf_cuda__param_on(TPF_CUDA_PARAM_MEMOPS)) {
    if (tpf_cuda__memops_available(b->device))
      kind = TPF_CUDA_TP_MEMOPS;
    else
      TPF_CUDA_WARN(TRANSPORT, me,
                    "TPF_CUDA_MEMOPS=1 but device %d has no 64-bit stream memory operations: "
                    "'%s' uses the flag kernels",
                    b->device, r->name);
  }
  r->tp = NULL;
  for (int q = 0; q < P; q++) {
    r->peer_tp[q] = q == me ? NULL : tpf_cuda__transports[kind];
    if (q != me) r->tp = r->peer_tp[q];
  }
}
