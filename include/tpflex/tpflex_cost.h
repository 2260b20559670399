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
 *   gemm <dtype> <m> <n> <k> <us>          a measured GEMM (dtype as tpf_dtype_name: bf16, ...;
 *                                          fp8_e4m3: E4M3 x E4M3 operands -> bf16 D, see below)
 *   shared_device 1                        all P ranks share one GPU: their GEMMs run one at a
 *                                          time across ranks (default 0: a GPU per rank)
 *   prefer_margin 0.05                     the planner keeps the better of the communicator's
 *                                          own split count and no overlap unless another
 *                                          candidate is predicted faster by more than this
 *                                          fraction (default 0; [0, 0.5)): run-to-run spread
 *                                          of measured points should not pick a schedule
 *   baseline_margin 0.05                   an overlap schedule replaces the fastest no-overlap
 *                                          baseline only when predicted faster than it by more
 *                                          than this fraction (default 0; [0, 0.5)), applied
 *                                          after prefer_margin: "never slower than no overlap"
 *                                          holds within the points' run-to-run spread
 *   sched <device> <algo> <coll> <P> <splits> <aggregate> <dtype> <H> <N> <T> <us>
 *                                          a MEASURED schedule (tpflex calibrate --schedules):
 *                                          one whole operation, all P ranks, earliest start to
 *                                          latest end, in us
 * Every key but gemm and sched appears at most once. GB/s means 1e9 bytes per second.
 * Every key is optional, but a prediction that must price a transfer over a link the table
 * lacks (a SEND to a peer: copy peer; to the rank itself: copy local; a REDUCE or PEER_REDUCE:
 * reduce) is TPF_EINVAL naming the line to add, never inf or nan; an adaptive communicator
 * (P > 1, not bulk) refuses such a table at creation: copy peer always, reduce for RS.
 *
 * Which points price a GEMM (tpf_cost_gemm_dtype): those of its dtype when the table has any.
 * bf16, fp16 and fp32 GEMMs need points of their own dtype. An fp8 GEMM without points of its
 * own dtype takes, in this order, the first of: the other fp8 dtype's points, bf16's, fp16's,
 * fp32's. `tpflex calibrate` writes fp8_e4m3 points only (E4M3 x E4M3 -> bf16): a GEMM with an
 * E5M2 operand (E5M2 x E4M3; E5M2 x E5M2 is refused) runs at the same rate in cuBLASLt on
 * Hopper, so fp8_e5m2 shares them. A table without fp8 points prices fp8 GEMMs on its bf16 ones:
 * an upper bound, since FP8 GEMMs are never slower than bf16 ones on the devices we know (one
 * H200: 1.45-1.94x faster at K 8192, N 3584, T 1k-32k). Deterministic: the same table always
 * prices a dtype on the same points.
 *
 * A GEMM's dtype is the dtype of its A operand: the schedule's (buffer) dtype when A is the
 * registration (the all-gather sites: fp8 buffer, fp8 GEMM), the operation's x (TPF_MAT_X: a
 * gemm_rs x, a bulk a) otherwise, as tpf_cost_predict_x and tpf_plan_predict_x are told. Message
 * and reduction bytes always use the buffer's element size: an fp8 all-gather moves 1-byte
 * elements, the reduce-scatter site of an fp8 GEMM keeps bf16 (fp16, fp32) partials in its
 * buffer (an fp8 RS registration is refused at run time, SPEC §11).
 *
 * Measured schedule points (offline tuning on top of the model, as Flux tunes its kernels):
 *   device     shared (all P ranks on one device, as `tpflex bench` runs them) or dedicated (a
 *              device per rank); a point applies only to a table of the same kind, i.e. shared
 *              points when the table says shared_device 1, dedicated points when it does not
 *   algo coll  ring|pipeline ag|rs (bulk has nothing to choose and takes no points)
 *   P splits   tp_size in [1, TPF_MAX_RANKS], num_splits in [1, TPF_MAX_SPLITS]
 *   aggregate  0 or 1 (1: the RING AG 2-chunk schedule)
 *   dtype      as tpf_dtype_name
 *   H N        H: the buffer's columns; N: RING AG the GEMM's n (weight rows per rank), RS the
 *              GEMM's k (K per rank)
 *   T us       the active rows and the measured time; the capacity is not part of the key (a
 *              dynamic layout's time depends on the active rows only)
 * Integers are plain decimal; us is a number > 0. A (device, algo, coll, P, splits, aggregate,
 * dtype, H, N, T) given twice is refused, as are more than TPF_COST_MAX_SCHED_POINTS lines.
 * How the planner uses them: see tpf_plan_predict. */
#ifndef TPFLEX_COST_H
#define TPFLEX_COST_H

#include "tpflex_backend.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TPF_COST_MAX_GEMM_POINTS 512
#define TPF_COST_MAX_SCHED_POINTS 512 /* the default --schedules grid writes at most 364 */

typedef struct {
  tpf_dtype dtype;
  uint64_t m, n, k;
  double us;
} tpf_cost_gemm_point;

/* One measured schedule ("sched" line; the fields are described in the file comment). */
typedef struct {
  bool shared; /* measured with all P ranks on one device */
  tpf_algo algo;
  tpf_coll coll;
  int tp_size, num_splits;
  bool aggregate;
  tpf_dtype dtype;
  uint64_t hidden; /* H */
  uint64_t n;      /* RING AG: the GEMM's n; RS: the GEMM's k */
  uint64_t rows;   /* T */
  double us;
} tpf_cost_sched_point;

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
  int nsched;        /* measured schedules, in the order of the file */
  tpf_cost_sched_point sched[TPF_COST_MAX_SCHED_POINTS];
  double prefer_margin;   /* "prefer_margin F": another candidate wins over the better of the
                           * communicator's own split count and no overlap only when predicted
                           * faster by more than the fraction F (default 0) */
  double baseline_margin; /* "baseline_margin F": an overlap candidate wins over the fastest
                           * no-overlap baseline only when predicted faster by more than F
                           * (default 0), after prefer_margin */
};

/* Parses the text format into *out (which needs no freeing). TPF_EINVAL with the line number
 * and the offending text for a syntax error, an unknown key, a repeated key, a negative or
 * non-finite number, a zero bandwidth, too many gemm or sched lines, a sched field out of its
 * range (the message names the field) or a sched point given twice (naming the first line).
 * *out is written only on success. */
TPF_API tpf_status tpf_cost_table_parse(const char *text, tpf_cost_table *out);

/* The dtype whose gemm points price GEMMs of `dtype` on t (see "Which points price a GEMM"
 * above): `dtype` itself when t has points of it, for fp8 the fallback otherwise. TPF_EINVAL,
 * naming the dtype (and for fp8 every dtype tried), when t has none of them; an invalid dtype
 * or NULL pointer is TPF_EINVAL too. *used is written only on success. */
TPF_API tpf_status tpf_cost_gemm_dtype(const tpf_cost_table *t, tpf_dtype dtype, tpf_dtype *used);

/* Predicted GEMM time in microseconds (without the launch overhead), on the points
 * tpf_cost_gemm_dtype picks for `dtype`. Those points are ordered by flops (2mnk); the achieved
 * rate (flops/us) is interpolated linearly in log(flops) between the two neighbours and held
 * constant beyond the ends. TPF_EINVAL when the table has no point that can price `dtype`. */
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

/* tpf_cost_predict with the dtype of the operation's x (TPF_MAT_X: gemm_rs x, bulk a): GEMM
 * steps whose A operand is x are priced as GEMMs of x_dtype (an fp8 gemm_rs on a bf16 RS site:
 * fp8 points, bf16 partials), those whose A is the registration as the schedule's dtype.
 * tpf_cost_predict is this with x_dtype = the schedule's dtype. TPF_EINVAL for an x_dtype that
 * is not a tpf_dtype, else as tpf_cost_predict. */
TPF_API tpf_status tpf_cost_predict_x(const tpf_cost_table *t, const tpf_schedule *scheds,
                                      int tp_size, tpf_dtype x_dtype, tpf_cost_span *spans,
                                      int max_steps, double *total_us);

/* ---- The planner's candidates ---------------------------------------------------------------
 * For one operation of a communicator at one active shape, the schedules its algorithm admits
 * and the no-overlap baseline, each with its predicted time:
 *   RING AG:  splits P (a GEMM per chunk), P/2 with aggregate (even P >= 4), and splits 1, which
 *             is the baseline itself (the whole exchange, then one GEMM);
 *   RING RS:  splits P; splits 1 (every partial in one GEMM, then the ring exchange); and, where
 *             the layout admits PIPELINE with one block, the pull baseline: the one GEMM of all
 *             rows into the buffer, then each rank pulls and sums its rows from every peer
 *             (algo PIPELINE, splits 1; its T x H bytes lie inside the RING RS registration, so
 *             the communicator runs it as is). Both no-overlap schedules are baselines (flag
 *             `baseline`); the result's `baseline` index is the faster predicted of the two;
 *   PIPELINE: S in {8, 4, 2, 1} where H and the alignment allow; S = 1 is the baseline (the
 *             GEMM, then the pull reduce-scatter);
 *   BULK:     its one schedule (the GEMM is independent of the collective: nothing to choose).
 * Every candidate's model time is the replay of all P ranks' schedules over the table.
 *
 * Measured points refine the model (offline tuning): a candidate whose (device kind, algo, coll,
 * P, splits, aggregate, dtype, H, N) has sched points in the table takes its time from them:
 *   - T between two measured T (or equal to one): linear interpolation in T between the two
 *     bracketing points (TPF_PLAN_SRC_MEASURED);
 *   - T outside the measured range: the model at T times measured / model at the nearest
 *     measured T (TPF_PLAN_SRC_SCALED), so the model's shape in T carries the measurement's
 *     level; where the nearest T is not a legal layout of this communicator, the model alone;
 *   - no point: the model alone (TPF_PLAN_SRC_MODEL).
 * Points apply only to a table of their device kind (shared points to shared_device 1). The
 * model's own time stays in model_us, whatever the source, so its error can still be measured.
 *
 * The choice is the fastest predicted_us; within 0.5 % the simpler schedule (fewer splits, then
 * the baseline) wins, so tiny differences never flip a decision. Depends only on the table, the
 * layout and the GEMM dims, which every rank agrees on, so every rank chooses the same. */
#define TPF_PLAN_MAX_CANDIDATES 8

/* Where a candidate's predicted_us came from. */
typedef enum {
  TPF_PLAN_SRC_MODEL = 0,    /* the cost model's replay */
  TPF_PLAN_SRC_MEASURED = 1, /* sched points: a measured T, or interpolated between two */
  TPF_PLAN_SRC_SCALED = 2    /* the model scaled by the nearest sched point's measured / model */
} tpf_plan_source;

/* "model", "measured", "scaled" ("?" for anything else). */
TPF_API const char *tpf_plan_source_name(tpf_plan_source s);

typedef struct {
  tpf_algo algo;       /* the schedule's algorithm: the communicator's, or PIPELINE for the
                        * pull baseline of a RING RS communicator */
  int num_splits;      /* its split count; the baseline has 1 */
  bool aggregate;      /* RING AG 2-chunk messages */
  bool baseline;       /* the no-overlap baseline */
  double predicted_us; /* the time the choice used: measured, scaled or the model's */
  bool runnable;       /* a schedule tpflex runs (every candidate since API 0.2) */
  char label[40];      /* "ring ag splits 8", "baseline: ag, then one gemm", ... */
  double model_us;     /* the cost model's replay alone (equal to predicted_us for SRC_MODEL) */
  tpf_plan_source source;
} tpf_plan_candidate;

typedef struct {
  int ncand;
  tpf_plan_candidate cand[TPF_PLAN_MAX_CANDIDATES];
  int chosen;    /* index into cand */
  int baseline;  /* index of the baseline candidate (RING RS: the faster predicted of its two
                  * no-overlap schedules), -1 for BULK */
  char why[200]; /* one line: the winner, its time, and its margin over the runner-up */
} tpf_plan_result;

/* Predicts every candidate for d (any rank; all P ranks' schedules are built and replayed) and
 * the GEMM dims g (as tpf_schedule_build takes them), with the table's sched points where they
 * match (see above). TPF_EINVAL and layout statuses for a bad d, the cost-model statuses for a
 * table that cannot price a step. Allocates while it builds schedules: call it once per
 * (communicator, T) and keep the result, never per operation. */
TPF_API tpf_status tpf_plan_predict(const tpf_cost_table *t, const tpf_layout_desc *d,
                                    const tpf_gemm_dims *g, tpf_plan_result *out);

/* tpf_plan_predict for an operation whose x (gemm_rs x, bulk a) is x_dtype, e.g. an fp8 GEMM on
 * a bf16 RS site: its GEMMs are priced as x_dtype GEMMs (tpf_cost_predict_x). An all-gather
 * site's GEMM reads the registration, so x_dtype does not matter there. Measured schedule points
 * (keyed by one dtype, measured with GEMMs of the buffer's dtype) apply only when x_dtype is
 * d's dtype or x_dtype does not matter; otherwise every candidate is the model's. tpf_plan_predict
 * is this with x_dtype = d->dtype. An adaptive communicator plans each operation with its x's
 * dtype (and keeps the decisions of different x dtypes apart in its cache). */
TPF_API tpf_status tpf_plan_predict_x(const tpf_cost_table *t, const tpf_layout_desc *d,
                                      const tpf_gemm_dims *g, tpf_dtype x_dtype,
                                      tpf_plan_result *out);

/* An adaptive communicator's decision for its last operation (or, before any, none: ncand 0):
 * the candidates with their predictions, the one that ran and why. Decisions are cached per
 * (T, GEMM size, x dtype) in TPF_PLAN_CACHE entries per communicator, and a miss is planned in
 * storage reserved at creation, so neither a hit nor a miss allocates. Creating an adaptive
 * (non-bulk) communicator whose table cannot price GEMMs of its dtype (tpf_cost_gemm_dtype) is
 * TPF_EINVAL, so a created one never fails to plan: an fp8 one plans on any table with gemm
 * points. TPF_EUNSUPPORTED for a FIXED communicator. */
#define TPF_PLAN_CACHE 32
TPF_API tpf_status tpf_comm_plan_info(const tpf_comm *c, tpf_plan_result *out);

#ifdef __cplusplus
}
#endif
#endif /* TPFLEX_COST_H */
