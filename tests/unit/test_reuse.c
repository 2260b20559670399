/* Schedule reuse: what depends only on (communicator, T, operation key) is computed once.
 *
 * The schedule cache (core/comm.c) on the mock backend: the first operation of a key builds
 * (a miss), the same key again reuses it (a hit) with no layout validation and no allocation; a
 * changed T, split count, transpose or epilogue is another key and builds; going back to an
 * earlier T hits again; a schedule build validates the layout once. On the simulator, P = 2:
 * ring AG and ring RS at T1, T2, T1 (hits on the way back) give the exact results (fp32, values
 * that are multiples of 0.5), with the cache on and off. */
#include "comm_internal.h"
#include "tpf_test.h"
#include "tpflex/tpflex_sim.h"

enum { P = 4, C = 64, H = 32, K = 16 };

static float g_x[C * K], g_w[H * K], g_out[C * H], g_bias[H];

static tpf_status rs(tpf_comm *c, uint64_t T, int splits, bool trans_w, bool epi) {
  tpf_op_options o = TPF_OP_OPTIONS_INIT;
  o.num_splits = splits;
  o.trans_w = trans_w;
  if (epi) o.bias = g_bias;
  tpf_matrix x = {g_x, T, K, K, TPF_FP32};
  tpf_matrix w =
      trans_w ? (tpf_matrix){g_w, K, H, H, TPF_FP32} : (tpf_matrix){g_w, H, K, K, TPF_FP32};
  tpf_matrix out = {g_out, T / P, H, H, TPF_FP32};
  return tpf_gemm_rs_ex(c, &x, &w, &out, &o, NULL);
}

static void expect(tpf_comm *c, uint64_t hits, uint64_t misses) {
  tpf_comm_cache_stats s = tpf__comm_cache_stats(c);
  if (s.hits != hits || s.misses != misses)
    fail_msg("cache: %llu hits %llu misses, want %llu and %llu", (unsigned long long)s.hits,
             (unsigned long long)s.misses, (unsigned long long)hits, (unsigned long long)misses);
}

static void set_rows(tpf_comm *c, uint64_t T) {
  tpf_shape s = {T, H};
  TPF_ASSERT_OK(tpf_comm_set_active_shape(c, s));
}

static void test_reuse__hits_misses_and_keys(void **state) {
  (void)state;
  tpf_mock_backend be;
  tpf_mock_init(&be, P, 1);
  tpf_comm_config cfg = tpf_test_config("fc2_fprop", TPF_ALGO_RING, TPF_COLL_RS, TPF_FP32, C, H);
  tpf_comm *c = NULL;
  TPF_ASSERT_OK(tpf_comm_create(&be.hdr, &cfg, &c));
  set_rows(c, 16);
  uint64_t v0 = tpf__layout_validations();
  TPF_ASSERT_OK(rs(c, 16, 0, false, false));
  expect(c, 0, 1);
  const uint64_t per_build = tpf__layout_validations() - v0;
  print_message("layout validations per schedule build (ring rs P=%d): %llu\n", P,
                (unsigned long long)per_build);
  assert_int_equal(per_build, 1); /* one per (T, op key) */
  /* The same key again: reused, nothing validated, nothing allocated. */
  long live = tpf__alloc_live_count();
  tpf__alloc_set_budget(0);
  v0 = tpf__layout_validations();
  for (int i = 0; i < 5; i++)
    TPF_ASSERT_OK(rs(c, 16, 0, false, false));
  tpf__alloc_set_budget(-1);
  assert_int_equal(tpf__layout_validations() - v0, 0);
  assert_int_equal(tpf__alloc_live_count(), live);
  expect(c, 5, 1);
  assert_int_equal(be.last_sched.rows, 16);
  /* Each part of the key builds anew: T, split count, transpose, epilogue. */
  set_rows(c, 32);
  TPF_ASSERT_OK(rs(c, 32, 0, false, false));
  expect(c, 5, 2);
  assert_int_equal(be.last_sched.rows, 32);
  TPF_ASSERT_OK(rs(c, 32, 1, false, false));
  expect(c, 5, 3);
  assert_int_equal(be.last_sched.num_splits, 1);
  TPF_ASSERT_OK(rs(c, 32, 0, true, false));
  expect(c, 5, 4);
  TPF_ASSERT_OK(rs(c, 32, 0, false, true));
  expect(c, 5, 5);
  /* Back to T = 16: still cached, the schedule of 16 rows again. */
  set_rows(c, 16);
  TPF_ASSERT_OK(rs(c, 16, 0, false, false));
  expect(c, 6, 5);
  assert_int_equal(be.last_sched.rows, 16);
  assert_int_equal(be.last_sched.num_splits, P);
  /* A refused request is refused before the cache and counts nothing. */
  TPF_ASSERT_STATUS(rs(c, 16, 3, false, false), TPF_EDIVISIBLE);
  expect(c, 6, 5);
  /* Off: every operation builds. */
  tpf__comm_set_schedule_cache(c, false);
  TPF_ASSERT_OK(rs(c, 16, 0, false, false));
  TPF_ASSERT_OK(rs(c, 16, 0, false, false));
  expect(c, 6, 7);
  TPF_ASSERT_OK(tpf_comm_destroy(c));
}

/* ---- the simulator: T1, T2, T1 with exact results ---- */

enum { SP = 2, N = 8 };
typedef struct {
  tpf_comm *ag[SP], *rs[SP];
  int bad[SP];
  char msg[SP][200];
  bool cache;
} sim_state;

static float v(int seed, uint64_t i, uint64_t j) {
  return (float)((int)(((uint64_t)seed * 31u + i * 7u + j * 3u) % 9u) - 4) * 0.5f;
}

typedef struct {
  float w[N * H], d[C * N], x[C * K], wr[H * K], out[C * H];
} mem;
static mem g_mem[SP];

static void bad(sim_state *s, int r, const char *what, uint64_t T, float got, float want) {
  if (s->bad[r]) return;
  s->bad[r] = 1;
  snprintf(s->msg[r], sizeof s->msg[r], "rank %d T=%llu %s: got %g want %g", r,
           (unsigned long long)T, what, got, want);
}

static tpf_status ops_at(sim_state *s, int r, uint64_t T) {
  mem *m = &g_mem[r];
  const uint64_t R = T / SP;
  tpf_shape sh = {T, H};
  TPF_CHECK(tpf_comm_set_active_shape(s->ag[r], sh));
  TPF_CHECK(tpf_comm_set_active_shape(s->rs[r], sh));
  tpf_matrix local;
  TPF_CHECK(tpf_comm_local_chunk(s->ag[r], &local));
  for (uint64_t i = 0; i < R; i++)
    for (uint64_t j = 0; j < H; j++)
      ((float *)local.ptr)[i * local.ld + j] = v(10 + r, (uint64_t)r * R + i, j + T);
  for (uint64_t i = 0; i < N; i++)
    for (uint64_t j = 0; j < H; j++)
      m->w[i * H + j] = v(20, i, j);
  tpf_matrix w = {m->w, N, H, H, TPF_FP32}, d = {m->d, T, N, N, TPF_FP32};
  TPF_CHECK(tpf_ag_gemm(s->ag[r], &w, &d, NULL));
  for (uint64_t i = 0; i < T; i++)
    for (uint64_t n = 0; n < N; n++) {
      float want = 0;
      for (uint64_t h = 0; h < H; h++)
        want += v(10 + (int)(i / R), i, h + T) * v(20, n, h);
      if (m->d[i * N + n] != want) bad(s, r, "ag_gemm", T, m->d[i * N + n], want);
    }
  for (uint64_t i = 0; i < T; i++)
    for (uint64_t k = 0; k < K; k++)
      m->x[i * K + k] = v(30 + r, i, k + T);
  for (uint64_t h = 0; h < H; h++)
    for (uint64_t k = 0; k < K; k++)
      m->wr[h * K + k] = v(40 + r, h, k);
  tpf_matrix x = {m->x, T, K, K, TPF_FP32}, wr = {m->wr, H, K, K, TPF_FP32},
             out = {m->out, R, H, H, TPF_FP32};
  TPF_CHECK(tpf_gemm_rs(s->rs[r], &x, &wr, &out, NULL));
  for (uint64_t i = 0; i < R; i++)
    for (uint64_t h = 0; h < H; h++) {
      float want = 0;
      for (int q = 0; q < SP; q++)
        for (uint64_t k = 0; k < K; k++)
          want += v(30 + q, (uint64_t)r * R + i, k + T) * v(40 + q, h, k);
      if (m->out[i * H + h] != want) bad(s, r, "gemm_rs", T, m->out[i * H + h], want);
    }
  return TPF_OK;
}

static tpf_status rank_body(tpf_backend *be, int r, void *arg) {
  sim_state *s = arg;
  tpf_comm_config a = tpf_test_config("ag", TPF_ALGO_RING, TPF_COLL_AG, TPF_FP32, C, H);
  tpf_comm_config b = tpf_test_config("rs", TPF_ALGO_RING, TPF_COLL_RS, TPF_FP32, C, H);
  TPF_CHECK(tpf_comm_create(be, &a, &s->ag[r]));
  TPF_CHECK(tpf_comm_create(be, &b, &s->rs[r]));
  tpf__comm_set_schedule_cache(s->ag[r], s->cache);
  tpf__comm_set_schedule_cache(s->rs[r], s->cache);
  const uint64_t Ts[] = {16, 40, 16, 40, 8, 16};
  for (size_t i = 0; i < TPF_ARRAY_SIZE(Ts); i++)
    TPF_CHECK(ops_at(s, r, Ts[i]));
  tpf_comm_cache_stats st = tpf__comm_cache_stats(s->rs[r]);
  /* Cache on: 16, 40, 8 build; the other three reuse. Off: all six build. */
  if (st.hits != (s->cache ? 3u : 0u) || st.misses != (s->cache ? 3u : 6u))
    return tpf_set_error(TPF_EINVAL, "rank %d: %llu hits %llu misses", r,
                         (unsigned long long)st.hits, (unsigned long long)st.misses);
  TPF_CHECK(tpf_comm_destroy(s->ag[r]));
  TPF_CHECK(tpf_comm_destroy(s->rs[r]));
  return TPF_OK;
}

static void test_reuse__sim_t1_t2_t1_exact(void **state) {
  (void)state;
  for (int on = 0; on < 2; on++) {
    static sim_state s;
    memset(&s, 0, sizeof s);
    s.cache = on != 0;
    tpf_sim_config cfg = {0, SP, 11, 0, 0, 0};
    tpf_sim_world *w = NULL;
    TPF_ASSERT_OK(tpf_sim_world_create(&cfg, &w));
    TPF_ASSERT_OK(tpf_sim_run(w, rank_body, &s));
    for (int r = 0; r < SP; r++)
      if (s.bad[r]) fail_msg("cache %s: %s", on ? "on" : "off", s.msg[r]);
    TPF_ASSERT_OK(tpf_sim_world_destroy(w));
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_reuse__hits_misses_and_keys),
      cmocka_unit_test(test_reuse__sim_t1_t2_t1_exact),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
