/* Mechanisms as data: what a backend must do beside each step's bytes (tpflex_backend.h,
 * tpf_xport and tpf_sm_budget; tpf_schedule.handshake_peers).
 *
 * Method. One table row per algorithm names the transport class of its SENDs and the SM budget
 * of its GEMMs, as NCCL picks a protocol per collective from a table rather than in each
 * backend. RING moves its chunks with the copy engine and gives its GEMMs every SM (a RING RS
 * reduction runs between the GEMMs it sums). PIPELINE moves its blocks with the copy engine too,
 * but its reductions run beside the next block's GEMM, so the GEMMs leave the communication CTAs
 * to them. BULK copies with a kernel (the copy of the whole buffer runs beside the independent
 * GEMM, which leaves it those CTAs). At P = 1 nothing communicates: the GEMM takes every SM.
 * Every REDUCE and PEER_REDUCE is the reduction kernel. The handshake's device waits cover
 * every peer the rank exchanges bytes with (its SENDs write into their registrations, their
 * SENDs into its own), and every peer where a BARRIER, a PEER_REDUCE (it reads peers'
 * registrations) or a copy kernel is in the schedule. tpf_schedule_check verifies the result
 * independently (core/schedule_check.c, part 7) and core/exec_check.c before every execute.
 */
#include "internal.h"

typedef struct {
  uint8_t send;     /* tpf_xport of a SEND */
  uint8_t gemm_sms; /* tpf_sm_budget of a GEMM at P > 1 */
} mech_row;

static const mech_row kMech[TPF_ALGO_COUNT] = {
    [TPF_ALGO_RING] = {TPF_XPORT_COPY_ENGINE, TPF_SMS_ALL},
    [TPF_ALGO_PIPELINE] = {TPF_XPORT_COPY_ENGINE, TPF_SMS_LEAVE_COMM},
    [TPF_ALGO_BULK] = {TPF_XPORT_COPY_KERNEL, TPF_SMS_LEAVE_COMM},
};

void tpf__schedule_mechanisms(tpf_schedule *s) {
  const mech_row *row = &kMech[s->algo];
  const int P = s->tp_size;
  bool all = false;
  uint64_t peers = 0;
  for (int i = 0; i < s->nsteps; i++) {
    tpf_step *st = &s->steps[i];
    st->xport = TPF_XPORT_NONE;
    st->sm_budget = TPF_SMS_ALL;
    switch (st->kind) {
    case TPF_STEP_SEND:
      st->xport = row->send;
      all = all || st->xport == TPF_XPORT_COPY_KERNEL;
      peers |= 1ull << (unsigned)st->peer;
      break;
    case TPF_STEP_RECV:
      peers |= 1ull << (unsigned)st->peer;
      break;
    case TPF_STEP_REDUCE:
      st->xport = TPF_XPORT_REDUCE_KERNEL;
      break;
    case TPF_STEP_PEER_REDUCE:
      st->xport = TPF_XPORT_REDUCE_KERNEL;
      all = true;
      break;
    case TPF_STEP_BARRIER:
      all = true;
      break;
    case TPF_STEP_GEMM:
      st->sm_budget = P > 1 ? row->gemm_sms : (uint8_t)TPF_SMS_ALL;
      break;
    default:
      break;
    }
  }
  if (all) peers = P >= 64 ? ~0ull : (1ull << (unsigned)P) - 1u;
  s->handshake_peers = P > 1 ? peers & ~(1ull << (unsigned)s->rank) : 0;
}
