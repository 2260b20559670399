/* tpflex cost model: predicts an operation's time from its schedules and a cost table.
 *
 * A cost table says what each kind of step costs on a machine: GEMM time from measured points
 * (m, n, k, dtype) -> microseconds, interpolated in between; transfers as latency + bytes over
 * bandwidth for peer copies, same-device copies and reduction kernels; a launch overhead per
 * step (host time: one thread enqueues a rank's steps in order, so step i cannot start before
 * (i + 1) * launch_us); the cost of a handshake and of a barrier. tpf_cost_predict replays all P
 * ranks' schedules of one operation over their streams: steps of one stream run in order, a step
 * starts when its stream is free and its deps have ended, a RECV ends when the matching SEND on
 * the sender has ended, and a HANDSHAKE or BARRIER ends when the last rank has reached it. The
 * result is every step's predicted start and end and the operation's time (the last end).
 *
 * Text format (one item per line, '#' starts a comment, units in the key names):
 *   launch_us 3.5                          host enqueue time per step
 *   handshake_us 8                         HANDSHAKE step (beside its launch)
 *   barrier_us 6                           BARRIER step
 *   copy peer <latency_us> <GB/s>          SEND to another rank (NVLink or a shared GPU)
 *   copy local <latency_us> <GB/s>         same-device copy
 *   reduce <latency_us> <GB/s>             REDUCE/PEER_REDUCE, bytes read over the time
 *   gemm <dtype> <m> <n> <k> <us>          a measured GEMM (dtype as tpf_dtype_name: bf16, ...)
 *   shared_device 1                        all P ranks share one GPU: their GEMMs run one at a
 *                                          time across ranks (default 0: a GPU per rank)
 * Every key but gemm appears at most once; at least one gemm line of a dtype is needed to price
 * GEMMs of that dtype. GB/s means 1e9 bytes per second.
 */
#ifndef TPFLEX_COST_H
#define TPFLEX_COST_H

#include "tpflex_backend.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TPF_COST_MAX_GEMM_POINTS 512

typedef struct {
  tpf_dtype dtype;
  uint64_t m, n, k;
  double us;
} tpf_cost_gemm_point;

typedef struct {
  double latency_us;
  double gbps; /* 1e9 bytes per second */
} tpf_cost_link;

struct tpf_cost_table {
  double launch_us, handshake_us, barrier_us;
  tpf_cost_link peer, local, reduce;
  int ngemm;
  tpf_cost_gemm_point gemm[TPF_COST_MAX_GEMM_POINTS];
  int shared_device; /* "shared_device 1": all ranks run on one GPU, whose GEMMs go one at a
                      * time across ranks (default 0: one GPU per rank) */
};

/* Parses the text format into *out (which needs no freeing). TPF_EINVAL with the line number
 * and the offending text for a syntax error, an unknown key, a repeated key, a negative or
 * non-finite number, a zero bandwidth or too many gemm lines. *out is written only on success. */
TPF_API tpf_status tpf_cost_table_parse(const char *text, tpf_cost_table *out);

/* Predicted GEMM time in microseconds (without the launch overhead). Points of the same dtype
 * are ordered by flops (2mnk); the achieved rate (flops/us) is interpolated linearly in
 * log(flops) between the two neighbours and held constant beyond the ends. TPF_EINVAL when the
 * table has no point of that dtype. */
TPF_API tpf_status tpf_cost_gemm_us(const tpf_cost_table *t, tpf_dtype dtype, uint64_t m,
                                    uint64_t n, uint64_t k, double *us);

typedef struct {
  double start_us, end_us;
} tpf_cost_span;

/* Replays scheds[0..tp_size) (rank r's schedule of one operation at index r, as
 * tpf_schedule_check takes them). spans, when not NULL, receives rank r's step i at
 * spans[r * max_steps + i] (max_steps >= every nsteps). *total_us is the latest end.
 * TPF_EINVAL for bad arguments, a RECV without its SEND, or schedules that cannot finish
 * (a wait cycle), naming the rank and step. Allocates nothing. */
TPF_API tpf_status tpf_cost_predict(const tpf_cost_table *t, const tpf_schedule *scheds,
                                    int tp_size, tpf_cost_span *spans, int max_steps,
                                    double *total_us);

/* ---- The planner's candidates ---------------------------------------------------------------
 * For one operation of a communicator at one active shape, the schedules its algorithm admits
 * and the no-overlap baseline, each with its predicted time:
 *   RING AG:  splits P (a GEMM per chunk), P/2 with aggregate (even P), and splits 1, which is
 *             the baseline itself (the whole exchange, then one GEMM);
 *   RING RS:  splits P, and the baseline (one GEMM, then the reduce-scatter);
 *   PIPELINE: S in {1, 2, 4, 8} where H and the alignment allow, and the baseline;
 *   BULK:     its one schedule (the GEMM is independent of the collective: nothing to choose).
 * The baseline of RS is priced analytically with the same table: handshake, one GEMM of all T
 * rows, P-1 peer copies of S_T and one reduction of P partials. The choice is the fastest
 * prediction; within 0.5 % the simpler schedule (fewer splits, then the baseline) wins, so tiny
 * differences of the model never flip a decision. Depends only on the table, the layout and
 * the GEMM dims, which every rank agrees on, so every rank chooses the same. */
#define TPF_PLAN_MAX_CANDIDATES 8

typedef struct {
  tpf_algo algo;       /* the schedule's algorithm (the communicator's) */
  int num_splits;      /* its split count; the baseline has 1 */
  bool aggregate;      /* RING AG 2-chunk messages */
  bool baseline;       /* the no-overlap baseline */
  double predicted_us; /* the replayed (or, for the RS baseline, computed) time */
  bool runnable;       /* a schedule tpflex runs (the RS baseline is only priced) */
  char label[40];      /* "ring ag splits 8", "baseline: ag, then one gemm", ... */
} tpf_plan_candidate;

typedef struct {
  int ncand;
  tpf_plan_candidate cand[TPF_PLAN_MAX_CANDIDATES];
  int chosen;    /* index into cand */
  int baseline;  /* index of the baseline candidate, -1 for BULK */
  char why[200]; /* one line: the winner, its time, and its margin over the runner-up */
} tpf_plan_result;

/* Predicts every candidate for d (any rank; all P ranks' schedules are built and replayed) and
 * the GEMM dims g (as tpf_schedule_build takes them). TPF_EINVAL and layout statuses for a bad
 * d, the cost-model statuses for a table that cannot price a step. Allocates while it builds
 * schedules: call it once per (communicator, T) and keep the result, never per operation. */
TPF_API tpf_status tpf_plan_predict(const tpf_cost_table *t, const tpf_layout_desc *d,
                                    const tpf_gemm_dims *g, tpf_plan_result *out);

/* An adaptive communicator's decision for its last operation (or, before any, none: ncand 0):
 * the candidates with their predictions, the one that ran and why. Decisions are cached per
 * (T, GEMM size) in TPF_PLAN_CACHE entries per communicator, and a miss is planned in storage
 * reserved at creation, so neither a hit nor a miss allocates. TPF_EUNSUPPORTED for a FIXED
 * communicator. */
#define TPF_PLAN_CACHE 32
TPF_API tpf_status tpf_comm_plan_info(const tpf_comm *c, tpf_plan_result *out);

#ifdef __cplusplus
}
#endif
#endif /* TPFLEX_COST_H */
