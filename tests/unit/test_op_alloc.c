/* No allocation per microbatch, and completion and errors, on the simulator.
 *
 * No allocation on the per-microbatch path. Counting allocator hooks (tpf_set_allocator)
 * see every allocation of the core and the simulator; after a warm-up operation of each kind,
 * set_active_shape + every operation (ring ag_gemm, ring and pipeline gemm_rs, bulk AG and RS)
 * at every legal T <= C runs with a zero allocation budget and must make zero allocations, for
 * P in {1, 2, 4}; results are checked exactly against harness/reference.h (fp32, values
 * that are multiples of 0.5, so every sum is exact).
 *
 * Completion and errors: tpf_comm_sync, tpf_comm_async_error (per communicator: a fault on one
 * never shows on another) and tpf_comm_abort (a rank waiting for a peer that never arrives
 * returns promptly; afterwards every call on that communicator is TPF_ESTATE, "aborted").
 */
#define _POSIX_C_SOURCE 200809L
#include "reference.h"
#include "tpf_test.h"
#include "tpflex/tpflex_sim.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

/* ---- counting allocator hooks ---- */

static atomic_long g_allocs;
static void *count_malloc(size_t n) {
  atomic_fetch_add(&g_allocs, 1);
  return malloc(n);
}
static void *count_calloc(size_t c, size_t n) {
  atomic_fetch_add(&g_allocs, 1);
  return calloc(c, n);
}
static void *count_realloc(void *p, size_t n) {
  atomic_fetch_add(&g_allocs, 1);
  return realloc(p, n);
}

enum { C = 16, H = 8, N = 4, K = 4, NCOMM = 5 };
enum { RING_AG, RING_RS, PIPE_RS, BULK_AG, BULK_RS };
static const char *const kNames[NCOMM] = {"ring_ag", "ring_rs", "pipe_rs", "bulk_ag", "bulk_rs"};

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* Deterministic values, multiples of 0.5 in [-2, 2]. */
static float val(int seed, uint64_t i, uint64_t j) {
  return (float)((int)(((uint64_t)seed * 31u + i * 7u + j * 3u) % 9u) - 4) * 0.5f;
}

static tpf_matrix mat(float *p, uint64_t rows, uint64_t cols) {
  tpf_matrix m = {p, rows, cols, cols, TPF_FP32};
  return m;
}

static void fill(tpf_matrix *m, int seed, uint64_t row0) {
  for (uint64_t i = 0; i < m->rows; i++)
    for (uint64_t j = 0; j < m->cols; j++)
      ((float *)m->ptr)[i * m->ld + j] = val(seed, row0 + i, j);
}

typedef struct {
  int P;
  tpf_comm *comm[TPF_MAX_RANKS][NCOMM];
  long ops[TPF_MAX_RANKS];
  int bad[TPF_MAX_RANKS]; /* first mismatch found, 0 = none */
  char msg[TPF_MAX_RANKS][200];
} world_state;

typedef struct {
  float w[N * H], d[C * N], x[C * K], wr[H * K], out[C * H], a[4 * K], b[4 * K], bd[4 * 4];
} rank_mem;
static rank_mem g_mem[TPF_MAX_RANKS];

static int check_close(world_state *s, int r, const char *what, float got, float want) {
  if (fabsf(got - want) <= 1e-4f) return 0;
  if (!s->bad[r]) {
    s->bad[r] = 1;
    snprintf(s->msg[r], sizeof s->msg[r], "rank %d %s: got %g want %g", r, what, got, want);
  }
  return 1;
}

/* The gathered buffer [T, H]: row i comes from rank i / R. */
static void check_gathered(world_state *s, int r, tpf_comm *c, uint64_t T, int seed0) {
  tpf_matrix buf;
  if (tpf_comm_buffer(c, &buf) != TPF_OK) return;
  uint64_t R = T / (uint64_t)s->P;
  for (uint64_t i = 0; i < T; i++)
    for (uint64_t j = 0; j < H; j++)
      check_close(s, r, "gathered buffer", ((float *)buf.ptr)[i * buf.ld + j],
                  val(seed0 + (int)(i / R), i, j));
}

/* out [T/P, H] == rows of rank r of sum_q x_q * w_q^T. */
static void check_rs(world_state *s, int r, const float *out, uint64_t T) {
  uint64_t R = T / (uint64_t)s->P;
  for (uint64_t ii = 0; ii < R; ii++)
    for (uint64_t h = 0; h < H; h++) {
      float want = 0;
      for (int q = 0; q < s->P; q++)
        for (uint64_t k = 0; k < K; k++)
          want += val(300 + q, (uint64_t)r * R + ii, k) * val(400 + q, h, k);
      check_close(s, r, "gemm_rs out", out[ii * H + h], want);
    }
}

static void check_gemm(world_state *s, int r, const char *what, tpf_matrix *x, tpf_matrix *w,
                       tpf_matrix *got) {
  static _Thread_local float want[C * N];
  tpf_matrix wm = {want, got->rows, got->cols, got->cols, TPF_FP32};
  if (tpf_ref_gemm(x, w, &wm) != TPF_OK) {
    check_close(s, r, what, 0, 1);
    return;
  }
  for (uint64_t i = 0; i < got->rows; i++)
    for (uint64_t j = 0; j < got->cols; j++)
      check_close(s, r, what, ((float *)got->ptr)[i * got->ld + j], want[i * got->cols + j]);
}

/* One operation of comm k at its current active shape T, with inputs filled and results checked
 * (verify=false: warm-up, no checks). */
static tpf_status one_op(world_state *s, int r, int k, uint64_t T, bool verify) {
  tpf_comm *c = s->comm[r][k];
  rank_mem *m = &g_mem[r];
  uint64_t R = T / (uint64_t)s->P;
  tpf_matrix local, buf;
  tpf_status rc = TPF_OK;
  switch (k) {
  case RING_AG:
  case BULK_AG: {
    TPF_CHECK(tpf_comm_local_chunk(c, &local));
    fill(&local, (k == RING_AG ? 100 : 500) + r, (uint64_t)r * R);
    if (k == RING_AG) {
      tpf_matrix w = mat(m->w, N, H), d = mat(m->d, T, N);
      fill(&w, 200 + r, 0);
      rc = tpf_ag_gemm(c, &w, &d, NULL);
      if (rc == TPF_OK && verify) {
        check_gathered(s, r, c, T, 100);
        TPF_CHECK(tpf_comm_buffer(c, &buf));
        check_gemm(s, r, "ag_gemm d", &buf, &w, &d);
      }
    } else {
      tpf_matrix a = mat(m->a, 4, K), b = mat(m->b, 4, K), d = mat(m->bd, 4, 4);
      fill(&a, 600 + r, 0);
      fill(&b, 700 + r, 0);
      rc = tpf_bulk_overlap(c, &a, &b, &d, NULL);
      if (rc == TPF_OK && verify) {
        check_gathered(s, r, c, T, 500);
        check_gemm(s, r, "bulk d", &a, &b, &d);
      }
    }
    break;
  }
  case RING_RS:
  case PIPE_RS: {
    tpf_matrix x = mat(m->x, T, K), w = mat(m->wr, H, K), out = mat(m->out, R, H);
    fill(&x, 300 + r, 0);
    fill(&w, 400 + r, 0);
    rc = tpf_gemm_rs(c, &x, &w, &out, NULL);
    if (rc == TPF_OK && verify) check_rs(s, r, m->out, T);
    break;
  }
  default: {
    TPF_CHECK(tpf_comm_buffer(c, &buf));
    for (uint64_t i = 0; i < T; i++)
      for (uint64_t j = 0; j < H; j++)
        ((float *)buf.ptr)[i * buf.ld + j] = val(800 + r, i, j);
    tpf_matrix a = mat(m->a, 4, K), b = mat(m->b, 4, K), d = mat(m->bd, 4, 4);
    fill(&a, 600 + r, 0);
    fill(&b, 700 + r, 0);
    rc = tpf_bulk_overlap(c, &a, &b, &d, NULL);
    if (rc == TPF_OK && verify) {
      check_gemm(s, r, "bulk d", &a, &b, &d);
      TPF_CHECK(tpf_comm_local_chunk(c, &local));
      for (uint64_t ii = 0; ii < R; ii++)
        for (uint64_t j = 0; j < H; j++) {
          float want = 0;
          for (int q = 0; q < s->P; q++)
            want += val(800 + q, (uint64_t)r * R + ii, j);
          check_close(s, r, "bulk rs chunk", ((float *)local.ptr)[ii * local.ld + j], want);
        }
    }
    break;
  }
  }
  s->ops[r]++;
  return rc;
}

static tpf_status create_rank(tpf_backend *be, int r, void *arg) {
  world_state *s = arg;
  const tpf_algo algo[NCOMM] = {TPF_ALGO_RING, TPF_ALGO_RING, TPF_ALGO_PIPELINE, TPF_ALGO_BULK,
                                TPF_ALGO_BULK};
  const tpf_coll coll[NCOMM] = {TPF_COLL_AG, TPF_COLL_RS, TPF_COLL_RS, TPF_COLL_AG, TPF_COLL_RS};
  for (int k = 0; k < NCOMM; k++) {
    tpf_comm_config cfg = tpf_test_config(kNames[k], algo[k], coll[k], TPF_FP32, C, H);
    TPF_CHECK(tpf_comm_create(be, &cfg, &s->comm[r][k]));
  }
  /* Warm-up at capacity: the simulator's fp32 scratch grows to these operand sizes once. */
  for (int k = 0; k < NCOMM; k++)
    TPF_CHECK(one_op(s, r, k, C, false));
  return TPF_OK;
}

/* Every legal T <= C, for every communicator: set_active_shape, then its operation. */
static tpf_status sweep_rank(tpf_backend *be, int r, void *arg) {
  (void)be;
  world_state *s = arg;
  for (uint64_t t = 1; t <= C; t++)
    for (int k = 0; k < NCOMM; k++) {
      uint64_t legal = 0;
      TPF_CHECK(tpf_comm_legal_rows(s->comm[r][k], t, &legal));
      if (legal != t) continue;
      tpf_shape sh = {t, H};
      TPF_CHECK(tpf_comm_set_active_shape(s->comm[r][k], sh));
      TPF_CHECK(one_op(s, r, k, t, true));
    }
  return TPF_OK;
}

static tpf_status destroy_rank(tpf_backend *be, int r, void *arg) {
  (void)be;
  world_state *s = arg;
  for (int k = 0; k < NCOMM; k++)
    TPF_CHECK(tpf_comm_destroy(s->comm[r][k]));
  return TPF_OK;
}

static void test_op_alloc__zero_allocations_every_op_every_T(void **state) {
  (void)state;
  TPF_ASSERT_OK(tpf_set_allocator(count_malloc, count_calloc, count_realloc, free));
  const int Ps[] = {1, 2, 4};
  for (size_t pi = 0; pi < TPF_ARRAY_SIZE(Ps); pi++) {
    static world_state s;
    memset(&s, 0, sizeof s);
    s.P = Ps[pi];
    tpf_sim_config cfg = {0, s.P, 7, 0, 0, 0};
    tpf_sim_world *w = NULL;
    long live0 = tpf__alloc_live_count();
    long a0 = atomic_load(&g_allocs);
    TPF_ASSERT_OK(tpf_sim_world_create(&cfg, &w));
    TPF_ASSERT_OK(tpf_sim_run(w, create_rank, &s));
    long a1 = atomic_load(&g_allocs);
    tpf__alloc_set_budget(0); /* any allocation now fails the operation that makes it */
    tpf_status rc = tpf_sim_run(w, sweep_rank, &s);
    tpf__alloc_set_budget(-1);
    long a2 = atomic_load(&g_allocs);
    TPF_ASSERT_STATUS(rc, TPF_OK);
    for (int r = 0; r < s.P; r++)
      if (s.bad[r]) fail_msg("P=%d: %s", s.P, s.msg[r]);
    print_message("P=%d: setup %ld allocations; sweep of %ld operations (set_active_shape + op, "
                  "every legal T <= %d): %ld allocations\n",
                  s.P, a1 - a0, s.ops[0], (int)C, a2 - a1);
    assert_int_equal(a2 - a1, 0);
    assert_true(s.ops[0] > NCOMM * 2);
    TPF_ASSERT_OK(tpf_sim_run(w, destroy_rank, &s));
    TPF_ASSERT_OK(tpf_sim_world_destroy(w));
    assert_int_equal(tpf__alloc_live_count(), live0); /* the simulator's memory is counted too */
    assert_true(a1 - a0 > 0);                         /* ... and goes through the hooks */
  }
  TPF_ASSERT_OK(tpf_set_allocator(NULL, NULL, NULL, NULL));
}

/* ---- item 2: sync, async_error, abort ---- */

typedef struct {
  tpf_comm *a[2], *b[2];
  tpf_status op_a[2], err_a[2], err_b[2], sync_a[2], sync_b[2], op_b[2];
} two_comm;

static tpf_status two_create(tpf_backend *be, int r, void *arg) {
  two_comm *t = arg;
  tpf_comm_config ca = tpf_test_config("faulty", TPF_ALGO_RING, TPF_COLL_AG, TPF_FP32, C, H);
  tpf_comm_config cb = tpf_test_config("healthy", TPF_ALGO_RING, TPF_COLL_AG, TPF_FP32, C, H);
  TPF_CHECK(tpf_comm_create(be, &ca, &t->a[r]));
  TPF_CHECK(tpf_comm_create(be, &cb, &t->b[r]));
  return TPF_OK;
}

static tpf_status ag_once(tpf_comm *c, int r) {
  tpf_matrix w = mat(g_mem[r].w, N, H), d = mat(g_mem[r].d, C, N);
  fill(&w, 1, 0);
  return tpf_ag_gemm(c, &w, &d, NULL);
}

static tpf_status two_sync_ok(tpf_backend *be, int r, void *arg) {
  (void)be;
  two_comm *t = arg;
  TPF_CHECK(ag_once(t->a[r], r));
  TPF_CHECK(ag_once(t->b[r], r));
  TPF_CHECK(tpf_comm_sync(t->a[r]));
  TPF_CHECK(tpf_comm_sync(t->b[r]));
  tpf_status e = TPF_EINVAL;
  TPF_CHECK(tpf_comm_async_error(t->a[r], &e));
  return e;
}

static tpf_status two_fault(tpf_backend *be, int r, void *arg) {
  (void)be;
  two_comm *t = arg;
  t->op_a[r] = ag_once(t->a[r], r); /* rank 0 fails a step; rank 1 may time out waiting */
  return TPF_OK;
}

/* A separate run, so that both ranks are past the faulty operation (rank 1 may have waited a
 * whole timeout) before the healthy communicator's operation starts. */
static tpf_status two_after(tpf_backend *be, int r, void *arg) {
  (void)be;
  two_comm *t = arg;
  t->op_b[r] = ag_once(t->b[r], r);
  TPF_CHECK(tpf_comm_async_error(t->a[r], &t->err_a[r]));
  TPF_CHECK(tpf_comm_async_error(t->b[r], &t->err_b[r]));
  t->sync_a[r] = tpf_comm_sync(t->a[r]);
  t->sync_b[r] = tpf_comm_sync(t->b[r]);
  return TPF_OK;
}

static tpf_status two_destroy(tpf_backend *be, int r, void *arg) {
  (void)be;
  two_comm *t = arg;
  tpf_status r1 = tpf_comm_destroy(t->a[r]);
  tpf_status r2 = tpf_comm_destroy(t->b[r]);
  (void)r1; /* a failed communicator may report its failure again here */
  return r2;
}

static void test_op_alloc__sync_and_async_error_per_comm(void **state) {
  (void)state;
  tpf_sim_config cfg = {0, 2, 3, 0, 300, 0};
  tpf_sim_world *w = NULL;
  two_comm t;
  memset(&t, 0, sizeof t);
  TPF_ASSERT_OK(tpf_sim_world_create(&cfg, &w));
  TPF_ASSERT_OK(tpf_sim_run(w, two_create, &t));
  TPF_ASSERT_OK(tpf_sim_run(w, two_sync_ok, &t));
  /* Fail step 1 of rank 0's next execute (call 1 is its entry, call 2 its step 0). */
  tpf_sim_fault_ex f;
  memset(&f, 0, sizeof f);
  f.base.fail_call = 3;
  f.base.fail_status = TPF_EBACKEND;
  f.rank_mask = 1;
  TPF_ASSERT_OK(tpf_sim_set_fault_ex(w, &f));
  TPF_ASSERT_OK(tpf_sim_run(w, two_fault, &t));
  TPF_ASSERT_OK(tpf_sim_set_fault_ex(w, NULL));
  TPF_ASSERT_OK(tpf_sim_run(w, two_after, &t));
  TPF_ASSERT_STATUS(t.op_a[0], TPF_EBACKEND);
  TPF_ASSERT_STATUS(t.err_a[0], TPF_EBACKEND);
  TPF_ASSERT_STATUS(t.sync_a[0], TPF_EBACKEND);
  for (int r = 0; r < 2; r++) {
    /* whatever the faulty communicator did, the healthy one never shows it */
    TPF_ASSERT_STATUS(t.op_b[r], TPF_OK);
    TPF_ASSERT_STATUS(t.err_b[r], TPF_OK);
    TPF_ASSERT_STATUS(t.sync_b[r], TPF_OK);
    TPF_ASSERT_STATUS(t.err_a[r], t.op_a[r]); /* the deferred status is the op's own failure */
  }
  print_message("fault on 'faulty': rank 0 %s, rank 1 %s; 'healthy' OK on both\n",
                tpf_status_name(t.op_a[0]), tpf_status_name(t.op_a[1]));
  TPF_ASSERT_OK(tpf_sim_run(w, two_destroy, &t));
  TPF_ASSERT_OK(tpf_sim_world_destroy(w));
}

typedef struct {
  tpf_comm *c[2];
  tpf_status op_rc, later[4];
  char op_msg[512], later_msg[512];
  double op_ms;
} abort_state;

static tpf_status ab_create(tpf_backend *be, int r, void *arg) {
  abort_state *s = arg;
  tpf_comm_config cfg = tpf_test_config("stuck", TPF_ALGO_RING, TPF_COLL_AG, TPF_FP32, C, H);
  return tpf_comm_create(be, &cfg, &s->c[r]);
}

/* Rank 0 starts an operation; rank 1 never arrives (a dead peer). */
static tpf_status ab_stuck(tpf_backend *be, int r, void *arg) {
  (void)be;
  abort_state *s = arg;
  if (r != 0) return TPF_OK;
  double t0 = now_ms();
  s->op_rc = ag_once(s->c[0], 0);
  s->op_ms = now_ms() - t0;
  snprintf(s->op_msg, sizeof s->op_msg, "%s", tpf_last_error());
  tpf_shape sh = {8, H};
  s->later[0] = tpf_comm_set_active_shape(s->c[0], sh);
  s->later[1] = ag_once(s->c[0], 0);
  s->later[2] = tpf_comm_sync(s->c[0]);
  tpf_status e;
  s->later[3] = tpf_comm_async_error(s->c[0], &e);
  snprintf(s->later_msg, sizeof s->later_msg, "%s", tpf_last_error());
  return TPF_OK;
}

static void *aborter(void *arg) {
  abort_state *s = arg;
  struct timespec d = {0, 100 * 1000000L};
  nanosleep(&d, NULL); /* let rank 0 block in its handshake */
  tpf_status rc = tpf_comm_abort(s->c[0]);
  return (void *)(intptr_t)rc;
}

static tpf_status ab_destroy(tpf_backend *be, int r, void *arg) {
  (void)be;
  abort_state *s = arg;
  (void)tpf_comm_destroy(s->c[r]);
  return TPF_OK;
}

static void test_op_alloc__abort_unblocks_dead_peer_wait(void **state) {
  (void)state;
  const unsigned timeout_ms = 5000;
  tpf_sim_config cfg = {0, 2, 5, 0, timeout_ms, 0};
  tpf_sim_world *w = NULL;
  abort_state s;
  memset(&s, 0, sizeof s);
  TPF_ASSERT_OK(tpf_sim_world_create(&cfg, &w));
  TPF_ASSERT_OK(tpf_sim_run(w, ab_create, &s));
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, aborter, &s), 0);
  TPF_ASSERT_OK(tpf_sim_run(w, ab_stuck, &s));
  void *ret = NULL;
  pthread_join(th, &ret);
  assert_int_equal((int)(intptr_t)ret, TPF_OK);
  print_message("abort: rank 0's operation returned %s after %.1f ms (timeout %u ms): %s\n",
                tpf_status_name(s.op_rc), s.op_ms, timeout_ms, s.op_msg);
  TPF_ASSERT_STATUS(s.op_rc, TPF_ESTATE);
  assert_non_null(strstr(s.op_msg, "abort"));
  assert_true(s.op_ms < 1000.0); /* ~100 ms of sleep, then one doorbell */
  for (int i = 0; i < 4; i++)
    TPF_ASSERT_STATUS(s.later[i], TPF_ESTATE);
  assert_non_null(strstr(s.later_msg, "aborted"));
  TPF_ASSERT_STATUS(tpf_comm_abort(NULL), TPF_EINVAL);
  TPF_ASSERT_STATUS(tpf_comm_sync(NULL), TPF_EINVAL);
  TPF_ASSERT_STATUS(tpf_comm_async_error(s.c[1], NULL), TPF_EINVAL);
  TPF_ASSERT_OK(tpf_sim_run(w, ab_destroy, &s));
  TPF_ASSERT_OK(tpf_sim_world_destroy(w));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_op_alloc__zero_allocations_every_op_every_T),
      cmocka_unit_test(test_op_alloc__sync_and_async_error_per_comm),
      cmocka_unit_test(test_op_alloc__abort_unblocks_dead_peer_wait),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
