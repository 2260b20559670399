/* See gpu_check.h. Method: every rank regenerates every rank's inputs on the host from seeds
 * (rank, T, case), so it can compute the expected result alone; device results are read back
 * with the whole registration, whose bytes past the active layout must still hold the canary
 * written before the operation. */
#define _POSIX_C_SOURCE 200809L
#include "gpu_check.h"

#include "internal.h"
#include "reference.h"
#include "tpflex/tpflex.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CANARY 0xA5

/* cuBLASLt sums a GEMM's products in its own order, not the reference's: every GEMM result is
 * judged with SPEC §7's fp32 accumulation-order slack gamma_K sum_k |a_ik b_jk|
 * (tpf_ref_order_slack; for GEMM+RS, of every partial). */
static const bool kOwnOrder = true;

static tpf_matrix host_mat(uint64_t rows, uint64_t cols, tpf_dtype dt) {
  tpf_matrix m = {calloc(rows * cols, tpf_dtype_size(dt)), rows, cols, cols, dt};
  return m;
}

static tpf_status cu(cudaError_t e, const char *what) {
  return e == cudaSuccess ? TPF_OK
                          : tpf_set_error(TPF_EBACKEND, "%s: %s", what, cudaGetErrorString(e));
}

static tpf_status dev_alloc(tpf_matrix *d, const tpf_matrix *h, cudaStream_t s) {
  *d = *h;
  d->ptr = NULL;
  size_t bytes = h->rows * h->ld * tpf_dtype_size(h->dtype);
  tpf_status rc = cu(cudaMallocAsync(&d->ptr, bytes, s), "cudaMallocAsync");
  if (rc == TPF_OK)
    rc = cu(cudaMemcpyAsync(d->ptr, h->ptr, bytes, cudaMemcpyHostToDevice, s), "upload");
  if (rc == TPF_OK) rc = cu(cudaStreamSynchronize(s), "sync");
  return rc;
}

static tpf_status dev_download(tpf_matrix *h, const tpf_matrix *d, cudaStream_t s) {
  size_t bytes = d->rows * d->ld * tpf_dtype_size(d->dtype);
  tpf_status rc = cu(cudaMemcpyAsync(h->ptr, d->ptr, bytes, cudaMemcpyDeviceToHost, s), "download");
  if (rc == TPF_OK) rc = cu(cudaStreamSynchronize(s), "sync");
  return rc;
}

static uint64_t seed_of(int what, int rank, uint64_t T, int c) {
  return 0x9E3779B97F4A7C15ull ^ ((uint64_t)what << 48) ^ ((uint64_t)rank << 40) ^ (T << 8) ^
         (uint64_t)c;
}

/* Rows [r0, r0+n) of a host matrix as a view. */
static tpf_matrix rows_of(const tpf_matrix *m, uint64_t r0, uint64_t n) {
  tpf_matrix v = *m;
  v.ptr = (char *)m->ptr + r0 * m->ld * tpf_dtype_size(m->dtype);
  v.rows = n;
  return v;
}

/* SPEC §7, per element (slack: GEMM+RS's per-partial rounding slack and the accumulation-order
 * slack, tpf_ref_compare_slack; NULL: SPEC §7 alone). */
static int compare(const tpf_matrix *got, const tpf_matrix *want, const float *slack,
                   const char *what, int rank, const char *name, uint64_t T) {
  char why[TPF_REF_FORMAT_LEN + 64];
  if (!tpf_ref_check(got, want, slack, tpf_ref_tolerance_pair(got->dtype, want->dtype), what, why,
                     sizeof why)) {
    printf("FAIL rank %d %s T=%llu %s\n", rank, name, (unsigned long long)T, why);
    return 1;
  }
  return 0;
}

typedef struct {
  const char *name;
  tpf_algo algo;
  tpf_coll coll;
  bool aggregate;
  int splits;
} gpu_case;

static const gpu_case kCases[] = {
    {"ring_ag", TPF_ALGO_RING, TPF_COLL_AG, false, 0},
    {"ring_ag_agg", TPF_ALGO_RING, TPF_COLL_AG, true, 0},
    {"ring_ag_1split", TPF_ALGO_RING, TPF_COLL_AG, false, 1},
    {"ring_rs", TPF_ALGO_RING, TPF_COLL_RS, false, 0},
    {"pipeline_rs", TPF_ALGO_PIPELINE, TPF_COLL_RS, false, 0},
    {"bulk_ag", TPF_ALGO_BULK, TPF_COLL_AG, false, 0},
    {"bulk_rs", TPF_ALGO_BULK, TPF_COLL_RS, false, 0},
};

enum { C_ROWS_PER_RANK = 16, H = 64, N = 40, K = 48 };

static tpf_status one_op(tpf_backend *be, tpf_comm *c, const gpu_case *gc, int ci, uint64_t T,
                         cudaStream_t s, gpu_check_stats *st) {
  const int P = be->tp_size, r = be->rank;
  const tpf_dtype dt = TPF_BF16;
  const size_t e = tpf_dtype_size(dt);
  const uint64_t R = T / (uint64_t)P;
  tpf_status rc = TPF_OK;
  void *base = NULL;
  uint64_t reg_bytes = 0;
  TPF_CHECK(tpf_comm_registration(c, &base, &reg_bytes));
  tpf_layout_desc d;
  memset(&d, 0, sizeof d);
  d.tp_size = P;
  d.rank = r;
  d.algo = gc->algo;
  d.coll = gc->coll;
  d.dtype = dt;
  d.capacity = tpf_comm_capacity_shape(c);
  d.active = tpf_comm_active_shape(c);
  d.num_splits = gc->splits;
  d.aggregate = gc->aggregate;
  uint64_t active_bytes = 0;
  TPF_CHECK(tpf_layout_active_bytes(&d, &active_bytes));
  /* Canary past the active layout; the active prefix gets a different junk pattern so that a
   * stale value cannot pass as a result. */
  TPF_CHECK(cu(cudaMemsetAsync(base, 0x3C, active_bytes, s), "memset"));
  TPF_CHECK(cu(cudaMemsetAsync((char *)base + active_bytes, CANARY, reg_bytes - active_bytes, s),
               "memset"));
  TPF_CHECK(cu(cudaStreamSynchronize(s), "sync"));

  tpf_matrix hx[TPF_MAX_RANKS], hw[TPF_MAX_RANKS];
  memset(hx, 0, sizeof hx);
  memset(hw, 0, sizeof hw);
  tpf_matrix dx = {0}, dw = {0}, dd = {0}, hd = {0}, want = {0};
  unsigned char *regh = NULL;
  float *slack = NULL; /* RS: per-partial and order slack; GEMMs: order slack */
  int bad = 0;

  if (gc->algo == TPF_ALGO_RING && gc->coll == TPF_COLL_AG) {
    /* X = concat of every rank's [R, H] shard; w [N, H] shared. */
    tpf_matrix X = host_mat(T, H, dt);
    for (int q = 0; q < P; q++) {
      tpf_matrix v = rows_of(&X, (uint64_t)q * R, R);
      tpf_ref_fill(&v, seed_of(1, q, T, ci), -1.0f, 1.0f);
    }
    hw[0] = host_mat(N, H, dt);
    tpf_ref_fill(&hw[0], seed_of(2, 0, T, ci), -1.0f, 1.0f);
    tpf_matrix local;
    TPF_CHECK_GOTO(tpf_comm_local_chunk(c, &local), rc, out);
    tpf_matrix mine = rows_of(&X, (uint64_t)r * R, R);
    TPF_CHECK_GOTO(
        cu(cudaMemcpyAsync(local.ptr, mine.ptr, R * H * e, cudaMemcpyHostToDevice, s), "upload"),
        rc, out);
    TPF_CHECK_GOTO(dev_alloc(&dw, &hw[0], s), rc, out);
    hd = host_mat(T, N, dt);
    TPF_CHECK_GOTO(dev_alloc(&dd, &hd, s), rc, out);
    TPF_CHECK_GOTO(tpf_ag_gemm(c, &dw, &dd, s), rc, out);
    TPF_CHECK_GOTO(be->ops->sync(be, s), rc, out);
    TPF_CHECK_GOTO(dev_download(&hd, &dd, s), rc, out);
    want = host_mat(T, N, TPF_FP32);
    TPF_CHECK_GOTO(tpf_ref_gemm(&X, &hw[0], &want), rc, out);
    TPF_CHECK_GOTO(tpf_ref_order_slack(&X, &hw[0], 1.0, kOwnOrder, &slack), rc, out);
    bad |= compare(&hd, &want, slack, "d", r, gc->name, T);
    /* The buffer holds AG(X). */
    tpf_matrix buf;
    TPF_CHECK_GOTO(tpf_comm_buffer(c, &buf), rc, out);
    tpf_matrix hb = host_mat(T, H, dt);
    TPF_CHECK_GOTO(dev_download(&hb, &buf, s), rc, out);
    if (memcmp(hb.ptr, X.ptr, T * H * e) != 0) {
      printf("FAIL rank %d %s T=%llu: buffer is not AG(X)\n", r, gc->name, (unsigned long long)T);
      bad = 1;
    }
    free(hb.ptr);
    free(X.ptr);
  } else if (gc->coll == TPF_COLL_RS && gc->algo != TPF_ALGO_BULK) {
    /* Every rank: x_q [T, K], w_q [H, K]; out = rows r of sum_q x_q w_q^T. */
    /* Partials are rounded to the buffer dtype before the fp32 sum; a partial whose rounding
     * differs by one ulp (another accumulation order) is excused by the slack, and so is each
     * partial's fp32 accumulation-order error, gamma_K sum_k |x_ik w_jk| (SPEC §7). */
    want = host_mat(R, H, TPF_FP32);
    slack = calloc(R * H + 1, sizeof(float));
    if (!slack) {
      rc = tpf_set_error(TPF_ENOMEM, "gpu_check: RS slack");
      goto out;
    }
    for (int q = 0; q < P; q++) {
      hx[q] = host_mat(T, K, dt);
      hw[q] = host_mat(H, K, dt);
      tpf_ref_fill(&hx[q], seed_of(3, q, T, ci), -1.0f, 1.0f);
      tpf_ref_fill(&hw[q], seed_of(4, q, T, ci), -1.0f, 1.0f);
      tpf_matrix mine = rows_of(&hx[q], (uint64_t)r * R, R);
      TPF_CHECK_GOTO(tpf_ref_rs_add_partial_order(&mine, &hw[q], dt, kOwnOrder, want.ptr, slack),
                     rc, out);
    }
    TPF_CHECK_GOTO(dev_alloc(&dx, &hx[r], s), rc, out);
    TPF_CHECK_GOTO(dev_alloc(&dw, &hw[r], s), rc, out);
    hd = host_mat(R, H, dt);
    TPF_CHECK_GOTO(dev_alloc(&dd, &hd, s), rc, out);
    TPF_CHECK_GOTO(tpf_gemm_rs(c, &dx, &dw, &dd, s), rc, out);
    TPF_CHECK_GOTO(be->ops->sync(be, s), rc, out);
    TPF_CHECK_GOTO(dev_download(&hd, &dd, s), rc, out);
    bad |= compare(&hd, &want, slack, "out", r, gc->name, T);
  } else {
    /* BULK: the collective on the buffer, and an independent GEMM d = a b^T beside it. */
    tpf_matrix buf;
    TPF_CHECK_GOTO(tpf_comm_buffer(c, &buf), rc, out);
    tpf_matrix all[TPF_MAX_RANKS];
    memset(all, 0, sizeof all);
    for (int q = 0; q < P; q++) {
      all[q] = host_mat(T, H, dt);
      tpf_ref_fill(&all[q], seed_of(5, q, T, ci), -1.0f, 1.0f);
    }
    tpf_matrix hb = host_mat(T, H, dt);
    if (gc->coll == TPF_COLL_AG) {
      /* Rank q's shard is rows q of all[q]. */
      tpf_matrix mine = rows_of(&all[r], (uint64_t)r * R, R);
      TPF_CHECK_GOTO(cu(cudaMemcpyAsync((char *)buf.ptr + (uint64_t)r * R * H * e, mine.ptr,
                                        R * H * e, cudaMemcpyHostToDevice, s),
                        "upload"),
                     rc, out);
    } else {
      TPF_CHECK_GOTO(
          cu(cudaMemcpyAsync(buf.ptr, all[r].ptr, T * H * e, cudaMemcpyHostToDevice, s), "upload"),
          rc, out);
    }
    hx[0] = host_mat(24, K, dt);
    hw[0] = host_mat(N, K, dt);
    tpf_ref_fill(&hx[0], seed_of(6, r, T, ci), -1.0f, 1.0f);
    tpf_ref_fill(&hw[0], seed_of(7, r, T, ci), -1.0f, 1.0f);
    TPF_CHECK_GOTO(dev_alloc(&dx, &hx[0], s), rc, out);
    TPF_CHECK_GOTO(dev_alloc(&dw, &hw[0], s), rc, out);
    hd = host_mat(24, N, dt);
    TPF_CHECK_GOTO(dev_alloc(&dd, &hd, s), rc, out);
    TPF_CHECK_GOTO(tpf_bulk_overlap(c, &dx, &dw, &dd, s), rc, out);
    TPF_CHECK_GOTO(be->ops->sync(be, s), rc, out);
    TPF_CHECK_GOTO(dev_download(&hd, &dd, s), rc, out);
    want = host_mat(24, N, TPF_FP32);
    TPF_CHECK_GOTO(tpf_ref_gemm(&hx[0], &hw[0], &want), rc, out);
    TPF_CHECK_GOTO(tpf_ref_order_slack(&hx[0], &hw[0], 1.0, kOwnOrder, &slack), rc, out);
    bad |= compare(&hd, &want, slack, "gemm d", r, gc->name, T);
    TPF_CHECK_GOTO(dev_download(&hb, &buf, s), rc, out);
    if (gc->coll == TPF_COLL_AG) {
      for (int q = 0; q < P; q++) {
        tpf_matrix g = rows_of(&hb, (uint64_t)q * R, R), w = rows_of(&all[q], (uint64_t)q * R, R);
        if (memcmp(g.ptr, w.ptr, R * H * e) != 0) {
          printf("FAIL rank %d %s T=%llu: chunk %d is not rank %d's shard\n", r, gc->name,
                 (unsigned long long)T, q, q);
          bad = 1;
        }
      }
    } else {
      tpf_matrix ws = host_mat(R, H, TPF_FP32);
      for (uint64_t i = 0; i < R; i++)
        for (uint64_t j = 0; j < H; j++) {
          float sum = 0.0f;
          for (int q = 0; q < P; q++)
            sum += tpf_ref_get(&all[q], (uint64_t)r * R + i, j);
          tpf_ref_set(&ws, i, j, sum);
        }
      tpf_matrix g = rows_of(&hb, (uint64_t)r * R, R);
      bad |= compare(&g, &ws, NULL, "reduced chunk", r, gc->name, T);
      free(ws.ptr);
    }
    for (int q = 0; q < P; q++)
      free(all[q].ptr);
    free(hb.ptr);
  }
  /* The canary: every byte past the active layout is untouched. */
  regh = malloc(reg_bytes);
  TPF_CHECK_GOTO(cu(cudaMemcpyAsync(regh, base, reg_bytes, cudaMemcpyDeviceToHost, s), "download"),
                 rc, out);
  TPF_CHECK_GOTO(cu(cudaStreamSynchronize(s), "sync"), rc, out);
  for (uint64_t i = active_bytes; i < reg_bytes; i++) {
    if (regh[i] != CANARY) {
      printf("FAIL rank %d %s T=%llu: canary byte %llu of %llu (active %llu) is 0x%02x\n", r,
             gc->name, (unsigned long long)T, (unsigned long long)i, (unsigned long long)reg_bytes,
             (unsigned long long)active_bytes, regh[i]);
      bad = 1;
      break;
    }
  }
out:
  st->cases++;
  if (rc != TPF_OK || bad) st->failures++;
  if (st->verbose && r == 0)
    printf("  P=%d %-15s T=%-4llu %s\n", P, gc->name, (unsigned long long)T,
           rc != TPF_OK ? tpf_status_name(rc)
           : bad        ? "FAIL"
                        : "ok");
  free(regh);
  free(slack);
  for (int q = 0; q < TPF_MAX_RANKS; q++) {
    free(hx[q].ptr);
    free(hw[q].ptr);
  }
  free(hd.ptr);
  free(want.ptr);
  if (dx.ptr) cudaFreeAsync(dx.ptr, s);
  if (dw.ptr) cudaFreeAsync(dw.ptr, s);
  if (dd.ptr) cudaFreeAsync(dd.ptr, s);
  return rc;
}

tpf_status gpu_check_rank(tpf_backend *be, int rank, cudaStream_t s, gpu_check_stats *st) {
  (void)rank;
  const int P = be->tp_size;
  const uint64_t C = (uint64_t)P * C_ROWS_PER_RANK;
  /* A shape history: capacity, small, middle, smallest, capacity again. */
  const uint64_t Ts[] = {C, (uint64_t)P * 2, (uint64_t)P * 10, (uint64_t)P, C};
  for (int ci = 0; ci < (int)(sizeof kCases / sizeof kCases[0]); ci++) {
    const gpu_case *gc = &kCases[ci];
    if (gc->aggregate && P % 2 != 0) continue;
    tpf_comm_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.name = gc->name;
    cfg.algo = gc->algo;
    cfg.coll = gc->coll;
    cfg.dtype = TPF_BF16;
    cfg.capacity.rows = C;
    cfg.capacity.cols = H;
    cfg.num_splits = gc->splits;
    cfg.aggregate = gc->aggregate;
    tpf_comm *c = NULL;
    TPF_CHECK(tpf_comm_create(be, &cfg, &c));
    tpf_status rc = TPF_OK;
    for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0] && rc == TPF_OK; ti++) {
      tpf_shape sh = {Ts[ti], H};
      rc = tpf_comm_set_active_shape(c, sh);
      if (rc == TPF_OK) rc = one_op(be, c, gc, ci, Ts[ti], s, st);
    }
    tpf_status rc2 = tpf_comm_destroy(c);
    if (rc != TPF_OK) return rc;
    TPF_CHECK(rc2);
  }
  return TPF_OK;
}
