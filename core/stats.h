/* Telemetry per communicator (SPEC §16, tpflex.h "Telemetry"): the counters' storage lives in the
 * communicator (comm_internal.h), the logic here, so that comm.c calls one function per event. */
#ifndef TPF_STATS_H
#define TPF_STATS_H

#include "internal.h"

/* Counts one operation the backend accepted: T = s->rows of capacity rows C, the schedule it
 * ran (its split count, aggregate flag and this rank's steps give the bytes). Never fails,
 * allocates nothing. */
void tpf__stats_op(tpf_comm_stats *st, const tpf_schedule *s, uint64_t capacity_rows);
/* This rank's bytes to or from peers in s: SEND payloads and PEER_REDUCE's peer views. */
uint64_t tpf__stats_schedule_bytes(const tpf_schedule *s);

#endif
