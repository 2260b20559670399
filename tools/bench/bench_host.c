/* `tpflex bench --section host`: the host cost of one operation: what the core and a backend
 * spend on the host per call, apart from the device work.
 *
 * Per operation kind, P and T: the median host microseconds per call (median over blocks of
 * calls, each block timed as a whole), the calls into the backend per operation, and the core's
 * own cost isolated on a backend that does nothing (execute returns at once: rank 0 of P with no
 * peer, so only the core's validation, planning and schedule work is timed), with the schedule
 * cache on and off side by side (tpf__comm_set_schedule_cache). Then the same operations on the
 * simulator (its threads included) at P = 1 and 2. CPU only; figures are printed, not judged.
 * With --backend cuda a third table follows: the CUDA backend's cost per operation against a
 * plain cuBLASLt matmul of the same shape (bench_host_cuda.c). */
#define _POSIX_C_SOURCE 200809L
#include "bench.h"
#include "comm_internal.h"
#include "tpflex/tpflex_sim.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

/* ---- a backend that does nothing (counts its calls) ---- */
typedef struct {
  tpf_backend hdr;
  long calls;
} noop_be;
struct tpf_reg {
  void *data;
};
static tpf_status noop_reg_create(tpf_backend *be, const char *name, uint64_t bytes, tpf_reg **reg,
                                  void **local) {
  (void)name;
  ((noop_be *)be)->calls++;
  tpf_reg *r = calloc(1, sizeof *r);
  if (!r || !(r->data = calloc(1, (size_t)bytes))) {
    free(r);
    return tpf_set_error(TPF_ENOMEM, "bench noop backend: no memory");
  }
  *reg = r;
  *local = r->data;
  return TPF_OK;
}
static tpf_status noop_reg_destroy(tpf_backend *be, tpf_reg *reg) {
  ((noop_be *)be)->calls++;
  free(reg->data);
  free(reg);
  return TPF_OK;
}
static tpf_status noop_reg_activate(tpf_backend *be, tpf_reg *reg, uint64_t b) {
  (void)reg;
  (void)b;
  ((noop_be *)be)->calls++;
  return TPF_OK;
}
static tpf_status noop_execute(tpf_backend *be, tpf_reg *reg, const tpf_exec_args *a, void *s) {
  (void)reg;
  (void)a;
  (void)s;
  ((noop_be *)be)->calls++;
  return TPF_OK;
}
static tpf_status noop_sync(tpf_backend *be, void *s) {
  (void)s;
  ((noop_be *)be)->calls++;
  return TPF_OK;
}
static const tpf_backend_ops noop_ops = {
    .abi_version = TPF_BACKEND_ABI_VERSION,
    .name = "noop",
    .caps = TPF_BE_CAP_HOST_MEMORY | TPF_BE_CAP_OPTIONS,
    .align_bytes = 16,
    .max_ranks = TPF_MAX_RANKS,
    .reg_create = noop_reg_create,
    .reg_destroy = noop_reg_destroy,
    .reg_activate = noop_reg_activate,
    .execute = noop_execute,
    .sync = noop_sync,
};

enum { H = 256, C = 1024, K = 64, N = 64, NKIND = 5 };
static const char *const kKind[NKIND] = {"ring_ag", "ring_rs", "pipe_rs", "bulk_ag", "bulk_rs"};
static const tpf_algo kAlgo[NKIND] = {TPF_ALGO_RING, TPF_ALGO_RING, TPF_ALGO_PIPELINE,
                                      TPF_ALGO_BULK, TPF_ALGO_BULK};
static const tpf_coll kColl[NKIND] = {TPF_COLL_AG, TPF_COLL_RS, TPF_COLL_RS, TPF_COLL_AG,
                                      TPF_COLL_RS};

typedef struct {
  float *x, *w, *d;
} operands;

static tpf_status op(tpf_comm *c, int k, uint64_t T, int P, const operands *m) {
  if (kAlgo[k] == TPF_ALGO_BULK) {
    tpf_matrix a = {m->x, 64, K, K, TPF_FP32}, b = {m->w, N, K, K, TPF_FP32},
               d = {m->d, 64, N, N, TPF_FP32};
    return tpf_bulk_overlap(c, &a, &b, &d, NULL);
  }
  if (kColl[k] == TPF_COLL_AG) {
    tpf_matrix w = {m->w, N, H, H, TPF_FP32}, d = {m->d, T, N, N, TPF_FP32};
    return tpf_ag_gemm(c, &w, &d, NULL);
  }
  tpf_matrix x = {m->x, T, K, K, TPF_FP32}, w = {m->w, H, K, K, TPF_FP32},
             out = {m->d, T / (uint64_t)P, H, H, TPF_FP32};
  return tpf_gemm_rs(c, &x, &w, &out, NULL);
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* Median over `blocks` blocks of `calls` calls: microseconds per call. */
static double timed(tpf_comm *c, int k, uint64_t T, int P, const operands *m, int blocks, int calls,
                    tpf_status *rc) {
  double v[64];
  *rc = TPF_OK;
  for (int b = 0; b < blocks && b < 64; b++) {
    double t0 = now_us();
    for (int i = 0; i < calls && *rc == TPF_OK; i++)
      *rc = op(c, k, T, P, m);
    v[b] = (now_us() - t0) / calls;
  }
  qsort(v, (size_t)(blocks < 64 ? blocks : 64), sizeof v[0], cmp_d);
  return v[(blocks < 64 ? blocks : 64) / 2];
}

static operands alloc_operands(void) {
  operands m = {calloc((size_t)C * K, sizeof(float)), calloc((size_t)C * H, sizeof(float)),
                calloc((size_t)C * H, sizeof(float))};
  return m;
}

/* ---- the simulator: rank threads, every rank times its own calls ---- */
#ifdef TPF_HAVE_SIM
typedef struct {
  int k, P, blocks, calls;
  uint64_t T;
  double us[TPF_MAX_RANKS];
  tpf_status rc;
} sim_job;

static tpf_status sim_rank(tpf_backend *be, int r, void *arg) {
  sim_job *j = arg;
  tpf_comm_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.name = "host";
  cfg.algo = kAlgo[j->k];
  cfg.coll = kColl[j->k];
  cfg.dtype = TPF_FP32;
  cfg.capacity = (tpf_shape){C, H};
  tpf_comm *c = NULL;
  TPF_CHECK(tpf_comm_create(be, &cfg, &c));
  operands m = alloc_operands();
  tpf_status rc = tpf_comm_set_active_shape(c, (tpf_shape){j->T, H});
  if (rc == TPF_OK) rc = op(c, j->k, j->T, j->P, &m); /* warm-up */
  if (rc == TPF_OK) j->us[r] = timed(c, j->k, j->T, j->P, &m, j->blocks, j->calls, &rc);
  free(m.x);
  free(m.w);
  free(m.d);
  tpf_status d = tpf_comm_destroy(c);
  return rc != TPF_OK ? rc : d;
}
#endif

/* One row of the core-only table: operation kind k at P ranks and T rows on a backend that does
 * nothing (rank 0 of P), timed with the schedule cache on and off. 1 when it failed (printed). */
static int host_core_row(int k, int P, uint64_t T, operands *mp, int blocks, int calls) {
  int failed = 0;
  noop_be be;
  memset(&be, 0, sizeof be);
  be.hdr.ops = &noop_ops;
  be.hdr.tp_size = P;
  be.hdr.rank = 0;
  tpf_comm_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.name = kKind[k];
  cfg.algo = kAlgo[k];
  cfg.coll = kColl[k];
  cfg.dtype = TPF_FP32;
  cfg.capacity = (tpf_shape){C, H};
  tpf_comm *c = NULL;
  tpf_status rc = tpf_comm_create(&be.hdr, &cfg, &c);
  if (rc == TPF_OK) rc = tpf_comm_set_active_shape(c, (tpf_shape){T, H});
  double on = 0, off = 0;
  long per_op = 0;
  int steps = 0;
  if (rc == TPF_OK) {
    long c0 = be.calls;
    rc = op(c, k, T, P, mp);
    per_op = be.calls - c0;
    on = timed(c, k, T, P, mp, blocks, calls, &rc);
  }
  if (rc == TPF_OK) {
    tpf__comm_set_schedule_cache(c, false);
    off = timed(c, k, T, P, mp, blocks, calls, &rc);
    tpf__comm_set_schedule_cache(c, true);
    tpf_layout_desc d = tpf__comm_desc(c, (tpf_shape){T, H});
    tpf_gemm_dims g = {kAlgo[k] == TPF_ALGO_BULK ? 64 : T,
                       kColl[k] == TPF_COLL_AG && kAlgo[k] != TPF_ALGO_BULK ? N
                       : kAlgo[k] == TPF_ALGO_BULK                          ? N
                                                                            : H,
                       kColl[k] == TPF_COLL_AG && kAlgo[k] != TPF_ALGO_BULK ? H : K};
    tpf_schedule s;
    if (tpf_schedule_build(&d, &g, &s) == TPF_OK) {
      steps = s.nsteps;
      tpf_schedule_free(&s);
    }
  }
  if (rc != TPF_OK) {
    printf("%-8s %3d %5llu  FAILED: %s\n", kKind[k], P, (unsigned long long)T, tpf_last_error());
    failed = 1;
  } else {
    printf("%-8s %3d %5llu %10.3f %10.3f %7.2fx %14ld %9d\n", kKind[k], P, (unsigned long long)T,
           on, off, on > 0 ? off / on : 0.0, per_op, steps);
  }
  if (c) tpf_comm_destroy(c);
  return failed;
}

int bench_section_host(const bench_opts *o) {
  const bool quick = o->quick;
  const int blocks = quick ? 5 : 15, calls = quick ? 200 : 2000;
  const int Ps[] = {1, 2, 4, 8};
  const uint64_t Ts[] = {64, C};
  int fails = 0;
  printf("\n## Section host: host cost per operation (CPU; figures printed, not judged)\n");
  printf("# core only: a backend that does nothing (rank 0 of P, no peer); median of %d blocks "
         "of %d calls; H %d, C %d, fp32; K %d (rs), N %d (ag), bulk GEMM 64x%dx%d\n",
         blocks, calls, H, C, K, N, N, K);
  printf("%-8s %3s %5s %10s %10s %8s %14s %9s\n", "op", "P", "T", "cached_us", "build_us",
         "speedup", "backend_calls", "steps");
  operands m = alloc_operands();
  for (int k = 0; k < NKIND; k++)
    for (size_t pi = 0; pi < TPF_ARRAY_SIZE(Ps); pi++)
      for (size_t ti = 0; ti < TPF_ARRAY_SIZE(Ts); ti++) {
        fails += host_core_row(k, Ps[pi], Ts[ti], &m, blocks, calls);
      }
  free(m.x);
  free(m.w);
  free(m.d);
#ifdef TPF_HAVE_SIM
  /* The simulator: what a call costs with its stream workers (cache on). */
  printf("# simulator (ranks as threads; includes its workers' hand-off and the fp32 GEMM): "
         "median of %d blocks of %d calls, rank 0 and the slowest rank\n",
         blocks, calls / 10);
  printf("%-8s %3s %5s %12s %12s\n", "op", "P", "T", "rank0_us", "max_us");
  for (int k = 0; k < NKIND; k++)
    for (int P = 1; P <= 2; P++) {
      static sim_job j;
      memset(&j, 0, sizeof j);
      j.k = k;
      j.P = P;
      j.T = 64;
      j.blocks = blocks;
      j.calls = calls / 10;
      tpf_sim_config cfg = {0, P, 1, 0, 0, 0};
      tpf_sim_world *w = NULL;
      tpf_status rc = tpf_sim_world_create(&cfg, &w);
      if (rc == TPF_OK) rc = tpf_sim_run(w, sim_rank, &j);
      if (w) tpf_sim_world_destroy(w);
      if (rc != TPF_OK) {
        printf("%-8s %3d %5d  FAILED: %s\n", kKind[k], P, 64, tpf_last_error());
        fails++;
        continue;
      }
      double mx = 0;
      for (int r = 0; r < P; r++)
        mx = j.us[r] > mx ? j.us[r] : mx;
      printf("%-8s %3d %5d %12.2f %12.2f\n", kKind[k], P, 64, j.us[0], mx);
    }
#else
  printf("# simulator: not built (-DTPF_WITH_SIM=OFF)\n");
#endif
  if (o->cuda) fails += bench_host_cuda_table(o);
  return fails ? 1 : 0;
}
