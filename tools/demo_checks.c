/* `tpflex demo`: per-rank operands, inputs and checks. Every input is drawn from a seed that
 * depends only on (run seed, microbatch, site, role, owner rank), so each rank regenerates the
 * other ranks' inputs and computes its expected result with the independent host reference
 * (harness/reference.c) without talking to them. Results are checked with SPEC §7's rule
 * (tolerance of the coarser dtype), GEMM+RS with the per-partial rounding slack
 * (tpf_ref_compare_slack); gathered buffers must match byte for byte. Operands are allocated once
 * at capacity in backend memory with host mirrors (harness/staging.h) and viewed at T. */
#define _POSIX_C_SOURCE 200809L
#include "demo.h"

#include "reference.h"

#include "tpflex/tpflex_backend_support.h" /* TPF_CHECK, TPF_CHECK_GOTO */

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { ROLE_X = 1, ROLE_W, ROLE_A, ROLE_B, ROLE_PART };

/* Seed of one input; mb = UINT64_MAX for inputs fixed over the run (weights). */
static uint64_t seed_of(const demo_ctx *d, uint64_t mb, int site, int role, int owner) {
  uint64_t h = tpf_ref_mix(d->o.seed, mb);
  h = tpf_ref_mix(h, (uint64_t)site);
  h = tpf_ref_mix(h, (uint64_t)role);
  h = tpf_ref_mix(h, (uint64_t)owner);
  return tpf_ref_mix(h, 0x7470666c6578ull);
}

/* ---- operand memory ---- */

static tpf_status mat_new(demo_site_mem *sm, tpf_stage_mat *m, uint64_t rows, uint64_t ld,
                          tpf_dtype dt) {
  return tpf_stage_new(sm->d->env, sm->rank, m, rows, ld, ld, dt);
}

/* Transfers the first `rows` rows of a capacity operand. */
static tpf_status up(demo_site_mem *sm, tpf_stage_mat *m, uint64_t rows) {
  return tpf_stage_upload(sm->d->env, sm->rank, m, rows);
}

static tpf_status down(demo_site_mem *sm, tpf_stage_mat *m, uint64_t rows) {
  return tpf_stage_download(sm->d->env, sm->rank, m, rows);
}

tpf_status demo_site_mem_init(demo_site_mem *sm, const demo_site *s) {
  const demo_opts *o = &sm->d->o;
  tpf_gemm_dims g = demo_site_dims(s, o->H, o->P, o->C);
  tpf_dtype dt = o->dtype;
  switch (s->op) {
  case DEMO_OP_AG_GEMM: /* w [N, H], d [C, N] */
    TPF_CHECK(mat_new(sm, &sm->w, g.n, o->H, dt));
    return mat_new(sm, &sm->o, o->C, g.n, dt);
  case DEMO_OP_GEMM_RS: /* x [C, K], w [H, K], out [C/P, H] */
    TPF_CHECK(mat_new(sm, &sm->x, o->C, g.k, dt));
    TPF_CHECK(mat_new(sm, &sm->w, o->H, g.k, dt));
    return mat_new(sm, &sm->o, o->C / (uint64_t)o->P, o->H, dt);
  case DEMO_OP_BULK: /* a [m, k], b [n, k], d [m, n] at capacity (ld = capacity columns) */
    TPF_CHECK(mat_new(sm, &sm->x, g.m, g.k, dt));
    TPF_CHECK(mat_new(sm, &sm->w, g.n, g.k, dt));
    return mat_new(sm, &sm->o, g.m, g.n, dt);
  default:
    return TPF_OK;
  }
}

void demo_site_mem_free(demo_site_mem *sm) {
  if (!sm->d) return;
  tpf_stage_free(sm->d->env, sm->rank, &sm->x);
  tpf_stage_free(sm->d->env, sm->rank, &sm->w);
  tpf_stage_free(sm->d->env, sm->rank, &sm->o);
}

void demo_operands_free(demo_operands *io) {
  free(io->xg.ptr);
  free(io->part.ptr);
  memset(io, 0, sizeof *io);
}

/* ---- inputs ---- */

/* The whole [T, H] input of an all-gather (the same on every rank), with this rank's shard put
 * into the communicator's local chunk. */
static tpf_status gathered_input(demo_site_mem *sm, int si, tpf_comm *c, uint64_t mbi, uint64_t T,
                                 tpf_matrix *xg) {
  demo_ctx *d = sm->d;
  TPF_CHECK(tpf_stage_host_new(xg, T, d->o.H, d->o.dtype));
  tpf_ref_fill(xg, seed_of(d, mbi, si, ROLE_X, 0), -1.0f, 1.0f);
  return tpf_stage_put_local(d->env, sm->rank, c, xg);
}

tpf_status demo_stage_inputs(demo_site_mem *sm, int si, tpf_comm *c, uint64_t mbi, uint64_t T,
                             demo_operands *io) {
  demo_ctx *d = sm->d;
  const demo_site *s = &d->layer.sites[si];
  const uint64_t H = d->o.H, R = T / (uint64_t)d->o.P;
  const tpf_gemm_dims g = demo_site_dims(s, H, d->o.P, T);
  memset(io, 0, sizeof *io);
  /* Weights are fixed for the run (filled once); activations change per microbatch. */
  if (!sm->weights_ready && s->op != DEMO_OP_BULK) {
    tpf_ref_fill(&sm->w.host, seed_of(d, UINT64_MAX, si, ROLE_W, sm->rank), -0.5f, 0.5f);
    TPF_CHECK(up(sm, &sm->w, sm->w.host.rows));
    sm->weights_ready = true;
  }
  if (s->op == DEMO_OP_AG_GEMM) {
    TPF_CHECK(gathered_input(sm, si, c, mbi, T, &io->xg));
    io->wd = tpf_stage_view(&sm->w.dev, g.n, H);
    io->od = tpf_stage_view(&sm->o.dev, T, g.n);
  } else if (s->op == DEMO_OP_GEMM_RS) {
    tpf_matrix xh = tpf_stage_view(&sm->x.host, T, g.k);
    tpf_ref_fill(&xh, seed_of(d, mbi, si, ROLE_X, sm->rank), -1.0f, 1.0f);
    TPF_CHECK(up(sm, &sm->x, T));
    io->xd = tpf_stage_view(&sm->x.dev, T, g.k);
    io->wd = tpf_stage_view(&sm->w.dev, H, g.k);
    io->od = tpf_stage_view(&sm->o.dev, R, H);
  } else {
    tpf_matrix ah = tpf_stage_view(&sm->x.host, g.m, g.k);
    tpf_matrix bh = tpf_stage_view(&sm->w.host, g.n, g.k);
    tpf_ref_fill(&ah, seed_of(d, mbi, si, ROLE_A, sm->rank), -1.0f, 1.0f);
    tpf_ref_fill(&bh, seed_of(d, mbi, si, ROLE_B, sm->rank), -0.5f, 0.5f);
    TPF_CHECK(up(sm, &sm->x, g.m));
    TPF_CHECK(up(sm, &sm->w, g.n));
    io->xd = tpf_stage_view(&sm->x.dev, g.m, g.k);
    io->wd = tpf_stage_view(&sm->w.dev, g.n, g.k);
    io->od = tpf_stage_view(&sm->o.dev, g.m, g.n);
    if (s->coll == TPF_COLL_AG) {
      TPF_CHECK(gathered_input(sm, si, c, mbi, T, &io->xg));
    } else {
      /* The dgrad partial [T, H] this rank's GEMM left in the buffer. */
      TPF_CHECK(tpf_stage_host_new(&io->part, T, H, d->o.dtype));
      tpf_ref_fill(&io->part, seed_of(d, mbi, si, ROLE_PART, sm->rank), -1.0f, 1.0f);
      TPF_CHECK(tpf_stage_put_buffer(d->env, sm->rank, c, &io->part));
    }
  }
  return TPF_OK;
}

/* ---- checks ---- */

void demo_fail(demo_rank_mb *r, const char *fmt, ...) {
  if (!r->ok) return;
  r->ok = false;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(r->why, sizeof r->why, fmt, ap);
  va_end(ap);
}

/* The CUDA backend sums over k in its own order (cuBLASLt): its fp32 results get SPEC §7's
 * accumulation-order slack; the simulator sums in the reference's order and is held exact. */
static bool own_order(const demo_ctx *d) {
  return d->o.backend && !strcmp(d->o.backend, "cuda");
}

/* slack: NULL for SPEC §7, else GEMM+RS's per-partial rounding slack (tpf_ref_compare_slack). */
static void check_close(demo_rank_mb *r, const char *site, const char *what, const tpf_matrix *got,
                        const tpf_matrix *want, const float *slack) {
  char why[400];
  if (!tpf_ref_check(got, want, slack, tpf_ref_tolerance_pair(got->dtype, want->dtype), what, why,
                     sizeof why))
    demo_fail(r, "%s: %s", site, why);
}

static void check_exact(demo_rank_mb *r, const char *site, const char *what, const tpf_matrix *got,
                        const tpf_matrix *want) {
  char why[400];
  if (!tpf_ref_check_exact(got, want, what, why, sizeof why)) demo_fail(r, "%s: %s", site, why);
}

/* D = AG(X) W^T, and the gathered buffer. */
static tpf_status check_ag(demo_site_mem *sm, const demo_site *s, tpf_comm *c, uint64_t T,
                           const tpf_gemm_dims *g, const demo_operands *io, demo_rank_mb *r) {
  tpf_matrix ref = {0}, bufh = {0};
  float *slack = NULL;
  tpf_status rc;
  TPF_CHECK_GOTO(down(sm, &sm->o, T), rc, out);
  tpf_matrix got = tpf_stage_view(&sm->o.host, T, g->n);
  tpf_matrix w = tpf_stage_view(&sm->w.host, g->n, sm->d->o.H);
  TPF_CHECK_GOTO(tpf_stage_host_new(&ref, T, g->n, sm->d->o.dtype), rc, out);
  TPF_CHECK_GOTO(tpf_ref_gemm(&io->xg, &w, &ref), rc, out);
  TPF_CHECK_GOTO(tpf_ref_order_slack(&io->xg, &w, 1.0, own_order(sm->d), &slack), rc, out);
  check_close(r, s->name, "D = AG(X) W^T", &got, &ref, slack);
  TPF_CHECK_GOTO(tpf_stage_get_buffer(sm->d->env, sm->rank, c, &bufh), rc, out);
  check_exact(r, s->name, "gathered buffer", &bufh, &io->xg);
out:
  free(ref.ptr);
  free(bufh.ptr);
  free(slack);
  return rc;
}

/* This rank's chunk of RS(X W^T): the sum over ranks q of rows [rank*R, (rank+1)*R) of
 * X_q W_q^T, each partial rounded to the buffer dtype. */
static tpf_status check_rs(demo_site_mem *sm, int si, uint64_t mbi, uint64_t T,
                           const tpf_gemm_dims *g, demo_rank_mb *r) {
  demo_ctx *d = sm->d;
  const int P = d->o.P;
  const uint64_t H = d->o.H, R = T / (uint64_t)P;
  const tpf_dtype dt = d->o.dtype;
  tpf_matrix ref = {0}, xq = {0}, wq = {0};
  float *acc = calloc((size_t)(R * H), sizeof(float));
  float *slack = calloc((size_t)(R * H), sizeof(float));
  tpf_status rc = TPF_OK;
  if (!acc || !slack) {
    rc = tpf_set_error(TPF_ENOMEM, "demo: RS reference");
    goto out;
  }
  TPF_CHECK_GOTO(down(sm, &sm->o, R), rc, out);
  TPF_CHECK_GOTO(tpf_stage_host_new(&ref, R, H, dt), rc, out);
  TPF_CHECK_GOTO(tpf_stage_host_new(&xq, T, g->k, dt), rc, out);
  TPF_CHECK_GOTO(tpf_stage_host_new(&wq, H, g->k, dt), rc, out);
  for (int q = 0; q < P; q++) {
    tpf_ref_fill(&xq, seed_of(d, mbi, si, ROLE_X, q), -1.0f, 1.0f);
    tpf_ref_fill(&wq, seed_of(d, UINT64_MAX, si, ROLE_W, q), -0.5f, 0.5f);
    tpf_matrix mine = tpf_stage_rows(&xq, (uint64_t)sm->rank * R, R);
    rc = tpf_ref_rs_add_partial_order(&mine, &wq, dt, own_order(d), acc, slack);
    if (rc != TPF_OK) {
      rc = tpf_set_error(rc, "demo: RS reference partial of rank %d", q);
      goto out;
    }
  }
  tpf_ref_set_f32(&ref, acc);
  tpf_matrix got = tpf_stage_view(&sm->o.host, R, H);
  check_close(r, d->layer.sites[si].name, "out = RS(X W^T)", &got, &ref, slack);
out:
  free(ref.ptr);
  free(xq.ptr);
  free(wq.ptr);
  free(acc);
  free(slack);
  return rc;
}

/* The independent GEMM beside the bulk collective, then the collective's buffer: the gathered
 * input (AG) or this rank's reduce-scattered chunk of every rank's partial (RS). */
static tpf_status check_bulk(demo_site_mem *sm, int si, tpf_comm *c, uint64_t mbi, uint64_t T,
                             const tpf_gemm_dims *g, demo_operands *io, demo_rank_mb *r) {
  demo_ctx *d = sm->d;
  const demo_site *s = &d->layer.sites[si];
  const int P = d->o.P;
  const uint64_t H = d->o.H, R = T / (uint64_t)P;
  const tpf_dtype dt = d->o.dtype;
  tpf_matrix ref = {0}, bufh = {0}, want = {0};
  float *acc = NULL, *slack = NULL;
  tpf_status rc;
  TPF_CHECK_GOTO(down(sm, &sm->o, g->m), rc, out);
  tpf_matrix got = tpf_stage_view(&sm->o.host, g->m, g->n);
  tpf_matrix ah = tpf_stage_view(&sm->x.host, g->m, g->k);
  tpf_matrix bh = tpf_stage_view(&sm->w.host, g->n, g->k);
  TPF_CHECK_GOTO(tpf_stage_host_new(&ref, g->m, g->n, dt), rc, out);
  TPF_CHECK_GOTO(tpf_ref_gemm(&ah, &bh, &ref), rc, out);
  TPF_CHECK_GOTO(tpf_ref_order_slack(&ah, &bh, 1.0, own_order(d), &slack), rc, out);
  check_close(r, s->name, "independent GEMM", &got, &ref, slack);
  TPF_CHECK_GOTO(tpf_stage_get_buffer(d->env, sm->rank, c, &bufh), rc, out);
  if (s->coll == TPF_COLL_AG) {
    check_exact(r, s->name, "all-gathered buffer", &bufh, &io->xg);
    goto out;
  }
  acc = calloc((size_t)(R * H), sizeof(float));
  if (!acc) {
    rc = tpf_set_error(TPF_ENOMEM, "demo: bulk RS reference");
    goto out;
  }
  for (int q = 0; q < P; q++) {
    tpf_ref_fill(&io->part, seed_of(d, mbi, si, ROLE_PART, q), -1.0f, 1.0f);
    tpf_ref_add_rows(&io->part, (uint64_t)sm->rank * R, R, acc);
  }
  TPF_CHECK_GOTO(tpf_stage_host_new(&want, R, H, dt), rc, out);
  tpf_ref_set_f32(&want, acc);
  tpf_matrix mine = tpf_stage_rows(&bufh, (uint64_t)sm->rank * R, R);
  check_close(r, s->name, "reduce-scattered chunk", &mine, &want, NULL);
out:
  free(ref.ptr);
  free(bufh.ptr);
  free(want.ptr);
  free(acc);
  free(slack);
  return rc;
}

tpf_status demo_check_site(demo_site_mem *sm, int si, tpf_comm *c, uint64_t mbi, uint64_t T,
                           demo_operands *io, demo_rank_mb *r) {
  const demo_site *s = &sm->d->layer.sites[si];
  const tpf_gemm_dims g = demo_site_dims(s, sm->d->o.H, sm->d->o.P, T);
  if (s->op == DEMO_OP_AG_GEMM) return check_ag(sm, s, c, T, &g, io, r);
  if (s->op == DEMO_OP_GEMM_RS) return check_rs(sm, si, mbi, T, &g, r);
  return check_bulk(sm, si, c, mbi, T, &g, io, r);
}
