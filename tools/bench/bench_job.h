/* The operation jobs of the bench library's API sections (internal to tools/bench): one
 * operation over a sweep of T at one capacity, its inputs and results (bench_job), the operand
 * helpers every part shares, and the functions the parts call across files:
 *   bench_ops.c    runs a job on a group (the per-rank repetitions, timing, the paired baseline)
 *   bench_check.c  the sampled output check, the gather of results across processes, the CUDA
 *                  enqueue breakdown
 *   bench_tp.c     sections 2 (dynamic versus padded) and 4/5 (TP emulation), which build jobs
 */
#ifndef TPF_BENCH_JOB_H
#define TPF_BENCH_JOB_H

#include "bench.h"

#include <pthread.h>
#include <stdatomic.h>

typedef enum {
  BOP_RING_AG = 0,
  BOP_RING_AG_AGGR,
  BOP_RING_AG_SERIAL,
  BOP_RING_RS,
  BOP_PIPE_RS,
  BOP_PIPE_RS_SERIAL,
  BOP_BULK_AG, /* the fp8 section's (bench_run_dtype): BULK AG beside d = a w^T */
  BOP_COUNT
} bench_op;

typedef struct {
  const char *name;
  tpf_algo algo;
  tpf_coll coll;
  int splits; /* 0: the default (P, P/2 aggregate, pipeline 4) */
  bool aggregate;
} bench_op_info;

/* Every operation: its name, algorithm, collective, split count, aggregate flag. */
extern const bench_op_info bench_kops[BOP_COUNT];

/* One operation over a sweep of T at one capacity: inputs, results. */
typedef struct {
  bench_op op;
  /* The GEMM operands' dtype: TPF_BF16 (0, every section), or TPF_FP8_E4M3 (bench_run_dtype):
   * then x/a, w and the AG buffer are E4M3 with BENCH_FP8_SCALE_A/W, RS buffers and D stay bf16. */
  tpf_dtype dt;
  uint64_t C, H, N; /* AG: buffer [C, H], w [N, H]. RS: buffer cols H, x [C, N], w [H, N] */
  int nts;
  uint64_t ts[BENCH_MAX_TS];
  int iters, warmup;
  int host_iters;             /* host-wall repetitions after the `iters` timed ones (0: none) */
  uint64_t margin;            /* rotation span of operand offsets, elements */
  bench_variants *var;        /* NULL: one schedule, the communicator's (no options) */
  const tpf_cost_table *cost; /* without var: an ADAPTIVE communicator planning with it */
  bool pair; /* without var, host_iters > 0: the serial baseline alternated with the op */
  /* results */
  double us[BENCH_MAX_TS];
  double host_us[BENCH_MAX_TS], enq_us[BENCH_MAX_TS]; /* host wall, enqueue: medians */
  double pair_us[BENCH_MAX_TS], spd[BENCH_MAX_TS], spd_q1[BENCH_MAX_TS], spd_q3[BENCH_MAX_TS];
  atomic_llong wrong[BENCH_MAX_TS];
  atomic_llong checked[BENCH_MAX_TS];
  int chose[BENCH_MAX_TS]; /* with cost: rank 0's planner choice per T (0: none) */
  /* The enqueue breakdown (BENCH_ENQ_*) over the host-wall repetitions: per global rank (NaN:
   * not measured), then the mean over ranks and the largest host us (bench_job_enq_reduce). */
  double enq_rank[BENCH_MAX_TS][TPF_MAX_RANKS][BENCH_ENQ_NF];
  double enq_mean[BENCH_MAX_TS][BENCH_ENQ_NF], enq_max[BENCH_MAX_TS];
  bool chose_aggr[BENCH_MAX_TS];
  bool chose_pull[BENCH_MAX_TS]; /* RING RS: the planner chose the pull baseline (PIPELINE) */
  atomic_int failed;
  tpf_status st;
  char err[300];
  pthread_mutex_t mu;
} bench_job;

/* Offset (elements) of an operand of rank r at repetition it; salt tells operands apart. */
static inline uint64_t operand_off(const bench_job *j, int r, int it, int salt) {
  uint64_t v = (uint64_t)it * 1009u + (uint64_t)r * 7919u + (uint64_t)salt * 104729u;
  return (v * 4096u) % (j->margin ? j->margin : 1) / 64u * 64u;
}

static inline bool is_ag(bench_op op) {
  return bench_kops[op].coll == TPF_COLL_AG;
}

/* FP8 jobs (SPEC §11): the per-tensor scales (a_scale_inv, w_scale_inv; the conformance sweep's
 * values) and their product, applied once to the fp32 product. */
#define BENCH_FP8_SCALE_A 0.75f
#define BENCH_FP8_SCALE_W 2.0f
static inline bool job_fp8(const bench_job *j) {
  return j->dt == TPF_FP8_E4M3;
}
/* The buffer's dtype: an FP8 job's AG buffer is E4M3, an RS buffer holds bf16 partials. */
static inline tpf_dtype buf_dtype(const bench_job *j) {
  return is_ag(j->op) ? j->dt : TPF_BF16;
}
/* Operand element `off` of the job's source (src, or src8 for FP8). */
static inline const void *src_at(const bench_group *g, const bench_job *j, uint64_t off) {
  return job_fp8(j) ? (const void *)((const uint8_t *)g->src8 + off)
                    : (const void *)((const uint16_t *)g->src + off);
}
/* dst[at] = the source's element i as stored (bf16 or E4M3 code). */
static inline void pool_get(const bench_group *g, bool fp8, uint64_t i, void *dst, uint64_t at) {
  if (fp8)
    ((uint8_t *)dst)[at] = g->pool8[i % g->pool_elems];
  else
    ((uint16_t *)dst)[at] = g->pool[i % g->pool_elems];
}

/* Elements of src the job's operands can reach. */
static inline uint64_t job_src_elems(const bench_job *j, int P) {
  uint64_t need;
  if (is_ag(j->op)) {
    /* BULK AG's GEMM reads a [T, H] of its own. */
    uint64_t chunk = j->op == BOP_BULK_AG ? j->C * j->H : j->C / (uint64_t)P * j->H,
             w = j->N * j->H;
    need = chunk > w ? chunk : w;
  } else {
    uint64_t x = j->C * j->N, w = j->H * j->N;
    need = x > w ? x : w;
  }
  return need + j->margin;
}

/* Records the job's first failure (status, what, the library's detail) and marks it failed. */
void bench_job_fail(bench_job *j, tpf_status st, const char *what);
/* A job for operation op at P ranks with the Ts of ts that P divides and the capacity holds. */
void bench_job_init(bench_job *j, const bench_opts *o, bench_op op, int P, int nts,
                    const uint64_t *ts);
/* Runs job j on group g (src must cover it); the job's status. */
tpf_status bench_run_job(bench_group *g, bench_job *j);
/* Time of one GEMM d[T, n] = x[T, k] * w[n, k]^T on g1 (P = 1), in *us. */
tpf_status bench_layer_gemm(const bench_opts *o, bench_group *g1, uint64_t T, uint64_t n,
                            uint64_t k, double *us);
/* Elements wrong of this rank's output of the checked repetition `it` (-1: the check failed);
 * *checked gets the elements compared. */
long long bench_check_output(bench_rank *rk, bench_job *j, uint64_t T, int it, const tpf_matrix *d,
                             const tpf_matrix *buf, long long *checked);
/* Procs mode: every process's #wrong, checked counts and first failure, in every process. */
void bench_job_gather(bench_rank *rk, bench_job *j);
/* The CUDA enqueue statistics of this rank now (false on the simulator). */
bool bench_enq_snap(bench_rank *rk, tpf_cuda_enqueue_stats *s);
/* *acc += b - a. */
void bench_enq_add(tpf_cuda_enqueue_stats *acc, const tpf_cuda_enqueue_stats *a,
                   const tpf_cuda_enqueue_stats *b);
/* This rank's enqueue breakdown at T index ti since s0, less ex. */
void bench_enq_record(bench_rank *rk, bench_job *j, int ti, const tpf_cuda_enqueue_stats *s0,
                      const tpf_cuda_enqueue_stats *ex);
/* The breakdown over every rank of every process into j->enq_mean / enq_max. */
void bench_job_enq_reduce(bench_rank *rk, bench_job *j);

#endif
