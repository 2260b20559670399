/* `tpflex bench --section fp8` (only when named): every operation that runs in FP8 (SPEC §11)
 * beside its bf16 version, same shape, same group, same run. Calls bench_ops.c (the runner,
 * bench_run_dtype), bench_group.c and bench_util.c.
 *
 * Per P of the tp section's list (ranks as threads) and per operation, in this order:
 * ring_ag+gemm, bulk_ag+gemm, serial_ag,gemm, gemm+ring_rs, gemm+pipeline_rs, serial_gemm,rs, the
 * bf16 job and then the fp8 job (each over every T: warm-up, timed repetitions, a checked run),
 * so the two dtypes of one operation run back to back. FP8 (E4M3): the AG buffer and every GEMM
 * operand, a_scale_inv 0.75 and w_scale_inv 2 in backend memory; RS buffers (the partials) and D
 * stay bf16. The rows pair each bf16 row with its fp8 row: bytes each rank receives, the median
 * time, the serial baseline of the same dtype (RING AG with 1 split for the AG operations,
 * PIPELINE RS with 1 split for the RS ones), speedup = serial / time, fp8/bf16 (time ratio) and
 * vs_bf16 = bf16 time / fp8 time, and #wrong from the same run (bench_ops.c's check against
 * harness/reference.c, SPEC §7).
 */
#define _POSIX_C_SOURCE 200809L
#include "bench.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The table's order; the serial baseline of the AG operations comes after them, the RS ones'
 * last. */
static const bench_dop kOrder[BENCH_DOP_COUNT] = {BENCH_DOP_RING_AG,   BENCH_DOP_BULK_AG,
                                                  BENCH_DOP_SERIAL_AG, BENCH_DOP_RING_RS,
                                                  BENCH_DOP_PIPE_RS,   BENCH_DOP_SERIAL_RS};
static const tpf_dtype kDtypes[2] = {TPF_BF16, TPF_FP8_E4M3};

static bool dop_ag(bench_dop op) {
  return op == BENCH_DOP_RING_AG || op == BENCH_DOP_BULK_AG || op == BENCH_DOP_SERIAL_AG;
}

bool bench_fp8_layouts_fit(const bench_opts *o, int P, uint64_t rows, char *why, size_t len) {
  static const struct {
    tpf_algo algo;
    tpf_coll coll;
    tpf_dtype dtype;
    int splits; /* 0: the default */
  } kLayouts[] = {
      {TPF_ALGO_RING, TPF_COLL_AG, TPF_FP8_E4M3, 0}, {TPF_ALGO_RING, TPF_COLL_AG, TPF_FP8_E4M3, 1},
      {TPF_ALGO_BULK, TPF_COLL_AG, TPF_FP8_E4M3, 0}, {TPF_ALGO_RING, TPF_COLL_AG, TPF_BF16, 0},
      {TPF_ALGO_RING, TPF_COLL_AG, TPF_BF16, 1},     {TPF_ALGO_BULK, TPF_COLL_AG, TPF_BF16, 0},
      {TPF_ALGO_RING, TPF_COLL_RS, TPF_BF16, 0},     {TPF_ALGO_PIPELINE, TPF_COLL_RS, TPF_BF16, 0},
      {TPF_ALGO_PIPELINE, TPF_COLL_RS, TPF_BF16, 1},
  };
  for (size_t i = 0; i < sizeof kLayouts / sizeof kLayouts[0]; i++) {
    tpf_layout_desc d;
    memset(&d, 0, sizeof d);
    d.tp_size = P;
    d.algo = kLayouts[i].algo;
    d.coll = kLayouts[i].coll;
    d.dtype = kLayouts[i].dtype;
    d.num_splits = kLayouts[i].splits;
    d.capacity = (tpf_shape){rows, o->hidden};
    d.active = d.capacity;
    if (tpf_layout_check(&d) != TPF_OK) {
      snprintf(why, len, "P = %d %s %s %s at %llu rows: %s", P, tpf_algo_name(d.algo),
               tpf_coll_name(d.coll), tpf_dtype_name(d.dtype), (unsigned long long)rows,
               tpf_last_error());
      return false;
    }
  }
  return true;
}

void bench_fp8_header(const bench_opts *o) {
  bench_pt_lists pt;
  bench_pt_lists_of(o, &pt);
  printf("# fp8 section: ranks as threads  P=%s  T=%s  dtypes bf16 and fp8_e4m3 (FP8: the AG "
         "buffer and\n#   every GEMM operand in E4M3, a_scale_inv 0.75, w_scale_inv 2; RS buffers "
         "and D in bf16)\n",
         pt.ps, pt.ts);
}

/* The results of one P: [operation][dtype]. */
typedef struct {
  bench_dtype_run r[BENCH_DOP_COUNT][2];
  bool ran[BENCH_DOP_COUNT][2];
} fp8_p;

/* Runs every operation in both dtypes on g; 1 after a failure (noted). */
static int fp8_run_p(bench_group *g, const bench_opts *o, fp8_p *res) {
  int rc = 0;
  for (int k = 0; k < BENCH_DOP_COUNT; k++)
    for (int d = 0; d < 2; d++) {
      bench_dtype_run *r = &res->r[k][d];
      memset(r, 0, sizeof *r);
      r->op = kOrder[k];
      r->dtype = kDtypes[d];
      r->nts = o->ntps;
      memcpy(r->ts, o->tps, sizeof r->ts);
      bench_progress("[fp8] P=%d %s %s over %d values of T", g->tp, bench_dop_name(r->op),
                     tpf_dtype_name(r->dtype), o->ntps);
      if (bench_run_dtype(g, o, r) != TPF_OK) {
        bench_note("FAILED P=%d %s %s: %s", g->tp, bench_dop_name(r->op), tpf_dtype_name(r->dtype),
                   r->err[0] ? r->err : tpf_last_error());
        rc = 1;
      }
      res->ran[k][d] = true;
    }
  return rc;
}

/* Time of operation k in dtype d at T index i (NaN when it did not run there). */
static double fp8_us(const fp8_p *res, int k, int d, int i) {
  return res->ran[k][d] && i < res->r[k][d].nts ? res->r[k][d].us[i] : NAN;
}

/* The rows of one P: per T, per operation, the bf16 row then the fp8 row. 1 when a row has
 * wrong elements. */
static int fp8_rows(const bench_opts *o, int P, const fp8_p *res) {
  const bool gpu = o->cuda;
  const int ser_ag = 2, ser_rs = 5; /* kOrder's serial baselines */
  const bench_dtype_run *r0 = &res->r[0][0];
  int rc = 0;
  for (int i = 0; i < r0->nts; i++) {
    const uint64_t T = r0->ts[i];
    for (int k = 0; k < BENCH_DOP_COUNT; k++) {
      const bool ag = dop_ag(kOrder[k]);
      const double bf = fp8_us(res, k, 0, i);
      for (int d = 0; d < 2; d++) {
        const tpf_dtype dt = kDtypes[d], buf = ag ? dt : TPF_BF16;
        const double t = fp8_us(res, k, d, i), ser = fp8_us(res, ag ? ser_ag : ser_rs, d, i);
        /* What each rank receives: P - 1 chunks of (T/P) rows of H elements of the buffer. */
        const double bytes =
            (double)(P - 1) * (double)(T / (uint64_t)P) * (double)o->hidden * tpf_dtype_size(buf);
        const double flops = 2.0 * (double)T * (double)o->hidden * (double)o->n * P;
        const long long wrong = res->ran[k][d] ? res->r[k][d].wrong[i] : 0;
        bench_cell_s(bench_dop_name(kOrder[k]));
        bench_cell_s(tpf_dtype_name(dt));
        bench_cell_i(P);
        bench_cell_i((long long)T);
        bench_cell_i((long long)bytes);
        bench_cell_f(t, 1);
        bench_cell_f(ser, 1);
        bench_cell_f(ser / t, 3);
        bench_cell_f(d == 1 ? t / bf : NAN, 3);
        bench_cell_f(d == 1 ? bf / t : NAN, 3);
        bench_cell_f(flops / (t * 1e-6) / (gpu ? 1e12 : 1e9), gpu ? 1 : 3);
        bench_cell_i(wrong);
        bench_row_end();
        if (wrong != 0) rc = 1;
      }
    }
  }
  return rc;
}

int bench_section_fp8(const bench_opts *o) {
  const bool gpu = o->cuda;
  const char *cols[] = {"op",
                        "dtype",
                        "P",
                        "T",
                        "bytes/rank",
                        "time(us)",
                        "serial(us)",
                        "speedup",
                        "fp8/bf16",
                        "vs_bf16",
                        gpu ? "TFLOP/s" : "GFLOP/s",
                        "#wrong"};
  char title[240];
  snprintf(title, sizeof title,
           "FP8 against bf16: %s, C=%llu H=%llu N=%llu per rank, ranks as threads (AG: [T,H] x "
           "[N,H]^T; RS: [T,N] x [H,N]^T)",
           gpu ? "one GPU" : "simulator", (unsigned long long)o->capacity,
           (unsigned long long)o->hidden, (unsigned long long)o->n);
  bench_table("fp8", title, 12, cols);
  fp8_p *res = malloc(sizeof *res);
  if (!res) {
    bench_note("FAILED: no memory");
    return 1;
  }
  int rc = 0;
  for (int pi = 0; pi < o->nps; pi++) {
    const int P = o->ps[pi];
    memset(res, 0, sizeof *res);
    bench_group *g = NULL;
    tpf_status st = bench_group_create(o, P, &g);
    if (st != TPF_OK) {
      bench_note("FAILED: group of %d: %s (%s)", P, tpf_status_name(st), tpf_last_error());
      rc = 1;
      continue;
    }
    rc |= fp8_run_p(g, o, res);
    bench_group_destroy(g);
    rc |= fp8_rows(o, P, res);
  }
  free(res);
  bench_note("bytes/rank: what each rank receives, (P-1) chunks of (T/P)*H elements of the "
             "buffer's dtype: AG 1 byte in fp8, 2 in bf16; RS 2 in both (its buffer holds bf16 "
             "partials, SPEC §11)");
  bench_note("serial: serial_ag,gemm (RING AG, 1 split) for ring_ag+gemm and bulk_ag+gemm, "
             "serial_gemm,rs (PIPELINE RS, 1 split) for the RS operations, in the row's dtype; "
             "speedup = serial / time");
  bench_note("fp8/bf16 = fp8 time / bf16 time of the same operation, P and T; vs_bf16 = bf16 time "
             "/ fp8 time; per operation the bf16 job runs first, then the fp8 job, on one group");
  bench_note("bulk_ag+gemm: BULK AG of the buffer beside an independent GEMM [T,H] x [N,H]^T (the "
             "same bytes and FLOPs as ring_ag+gemm)");
  bench_note("fp8 inputs: the bf16 source rounded to E4M3 (round to nearest even); checked against "
             "harness/reference.c, which decodes E4M3 exactly; D within SPEC §7's bf16 tolerance");
  if (gpu)
    bench_note("all P ranks are threads on one GPU: their 'peer' copies are device-local (HBM), "
               "not NVLink; FLOP/s counts every rank's GEMMs together");
  else
    bench_note("simulator: CPU times; its FP8 GEMM is a host loop like its bf16 one, so fp8/bf16 "
               "says nothing of a GPU's FP8 throughput");
  return rc;
}
