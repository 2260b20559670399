/* Chrome trace (Perfetto / chrome://tracing) writer for the demo: one process per rank, one
 * thread (track) per stream plus a "host" track for the rank's own spans (microbatches). */
#ifndef TPF_TRACE_H
#define TPF_TRACE_H

#include "tpflex/tpflex.h"
#ifdef TPF_HAVE_SIM
#include "tpflex/tpflex_sim.h"
#endif

#include <stdint.h>

typedef struct tpf_trace tpf_trace;

/* The track of a rank's host thread (after the TPF_NUM_STREAMS stream tracks). */
#define TPF_TRACE_HOST_TID 5

/* Creates an empty, thread-safe collector. TPF_ENOMEM. */
tpf_status tpf_trace_create(tpf_trace **out);
void tpf_trace_destroy(tpf_trace *t);
/* Adds one complete span ("ph":"X") on track (pid = rank, tid); times in nanoseconds of any one
 * clock used for the whole trace. name and cat are copied. Never fails loudly: a span that
 * cannot be stored is counted in dropped. */
void tpf_trace_span(tpf_trace *t, int rank, int tid, const char *name, const char *cat,
                    uint64_t t0_ns, uint64_t t1_ns, uint64_t bytes, uint64_t seq);
#ifdef TPF_HAVE_SIM
/* A tpf_sim_trace_fn: ctx is the tpf_trace. */
void tpf_trace_sim_event(void *ctx, const tpf_sim_trace_event *ev);
#endif
/* Number of spans stored. */
uint64_t tpf_trace_count(const tpf_trace *t);
/* Writes {"traceEvents": [...]} with track names for tp_size ranks. TPF_EINVAL, TPF_EBACKEND
 * (I/O error, with errno's text in the detail). */
tpf_status tpf_trace_write(tpf_trace *t, const char *path, int tp_size);

#endif /* TPF_TRACE_H */
