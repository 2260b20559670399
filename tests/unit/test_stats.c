/* Telemetry per communicator (core/stats.c, SPEC §16): counted at the one point where the backend
 * accepted an operation; rows, pad-to-capacity rows and bytes against independent formulas (mock
 * backend) and against the simulator's own count of bytes that crossed between ranks; schedules
 * per power-of-two T bucket; refused operations count nothing; reset; bad arguments. */
#include "tpf_test.h"
#include "tpflex/tpflex_sim.h"

#include <stdatomic.h>

enum { P = 4, C = 64, H = 32, N = 16 };

typedef struct {
  tpf_mock_backend be;
  tpf_comm *c;
} fixture;

static int setup_ring_ag(void **state) {
  fixture *f = calloc(1, sizeof *f);
  tpf_mock_init(&f->be, P, 1);
  tpf_comm_config cfg = tpf_test_config("fc1_fprop", TPF_ALGO_RING, TPF_COLL_AG, TPF_BF16, C, H);
  if (tpf_comm_create(&f->be.hdr, &cfg, &f->c) != TPF_OK) return -1;
  *state = f;
  return 0;
}

static int setup_pipe_rs(void **state) {
  fixture *f = calloc(1, sizeof *f);
  tpf_mock_init(&f->be, P, 1);
  tpf_comm_config cfg =
      tpf_test_config("fc2_fprop", TPF_ALGO_PIPELINE, TPF_COLL_RS, TPF_BF16, C, 256);
  if (tpf_comm_create(&f->be.hdr, &cfg, &f->c) != TPF_OK) return -1;
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fixture *f = *state;
  int rc = tpf_comm_destroy(f->c) == TPF_OK && f->be.reg_live == 0 ? 0 : -1;
  free(f);
  return rc;
}

static tpf_comm_stats get(tpf_comm *c) {
  tpf_comm_stats s;
  memset(&s, 0xab, sizeof s);
  s.size = sizeof s;
  TPF_ASSERT_OK(tpf_comm_get_stats(c, &s));
  return s;
}

static void test_stats__bucket_of_is_floor_log2(void **state) {
  (void)state;
  assert_int_equal(tpf_stats_bucket_of(0), 0);
  assert_int_equal(tpf_stats_bucket_of(1), 0);
  assert_int_equal(tpf_stats_bucket_of(2), 1);
  assert_int_equal(tpf_stats_bucket_of(3), 1);
  assert_int_equal(tpf_stats_bucket_of(4), 2);
  assert_int_equal(tpf_stats_bucket_of(1023), 9);
  assert_int_equal(tpf_stats_bucket_of(1024), 10);
  assert_int_equal(tpf_stats_bucket_of((uint64_t)1 << 31), 31);
  assert_int_equal(tpf_stats_bucket_of(UINT64_MAX), TPF_STATS_BUCKETS - 1);
}

/* RING AG on rank 1 of 4: each rank sends its own chunk and forwards P-2 others, so P-1 chunks
 * of T/P rows leave it: (P-1) * (T/P) * H * 2 bytes (bf16). */
static uint64_t ring_ag_bytes(uint64_t T) {
  return (uint64_t)(P - 1) * (T / P) * H * 2;
}

static tpf_status ag_at(fixture *f, uint64_t T, int splits) {
  static uint16_t w[N * H], d[C * N];
  tpf_matrix mw = {w, N, H, H, TPF_BF16};
  tpf_matrix md = {d, T, N, N, TPF_BF16};
  tpf_shape s = {T, H};
  TPF_CHECK(tpf_comm_set_active_shape(f->c, s));
  tpf_op_options o = TPF_OP_OPTIONS_INIT;
  o.num_splits = splits;
  return tpf_ag_gemm_ex(f->c, &mw, &md, &o, NULL);
}

static void test_stats__counts_rows_padding_and_bytes(void **state) {
  fixture *f = *state;
  tpf_comm_stats s = get(f->c);
  assert_int_equal(s.ops, 0);
  assert_int_equal(s.rows, 0);
  assert_int_equal(s.shape_changes, 0);
  const uint64_t Ts[] = {16, 32, 32, 64, 8};
  uint64_t rows = 0, bytes = 0;
  for (size_t i = 0; i < TPF_ARRAY_SIZE(Ts); i++) {
    TPF_ASSERT_OK(ag_at(f, Ts[i], 0));
    rows += Ts[i];
    bytes += ring_ag_bytes(Ts[i]);
  }
  s = get(f->c);
  assert_int_equal(s.size, sizeof s);
  assert_int_equal(s.ops, 5);
  assert_int_equal(s.rows, rows);
  assert_int_equal(s.padded_rows, 5 * C);
  assert_int_equal(s.bytes, bytes);
  assert_int_equal(s.padded_bytes, 5 * ring_ag_bytes(C));
  assert_int_equal(s.shape_changes, 5);
  /* Buckets: 8 -> 3, 16 -> 4, 32 -> 5 (twice), 64 -> 6; the schedule is the one the backend ran. */
  const int want_ops[TPF_STATS_BUCKETS] = {[3] = 1, [4] = 1, [5] = 2, [6] = 1};
  for (int b = 0; b < TPF_STATS_BUCKETS; b++) {
    assert_int_equal(s.buckets[b].ops, want_ops[b]);
    assert_int_equal(s.buckets[b].schedules[0].ops, want_ops[b]);
    assert_int_equal(s.buckets[b].other_ops, 0);
  }
  assert_int_equal(s.buckets[5].rows, 64);
  assert_int_equal(s.buckets[6].schedules[0].num_splits, f->be.last_sched.num_splits);
  assert_int_equal(s.buckets[6].schedules[0].aggregate, f->be.last_sched.aggregate ? 1 : 0);
  assert_int_equal(s.buckets[6].schedules[1].num_splits, 0); /* unused */
}

static void test_stats__schedules_per_bucket_and_aggregate(void **state) {
  fixture *f = *state;
  /* T = 32 and 48 share bucket 5: the plain ring (splits P), then the aggregate (P/2). */
  TPF_ASSERT_OK(ag_at(f, 32, P));
  TPF_ASSERT_OK(ag_at(f, 48, P / 2));
  assert_true(f->be.last_sched.aggregate);
  TPF_ASSERT_OK(ag_at(f, 48, P / 2));
  tpf_comm_stats s = get(f->c);
  const tpf_stats_bucket *b = &s.buckets[5];
  assert_int_equal(b->ops, 3);
  assert_int_equal(b->rows, 32 + 48 + 48);
  assert_int_equal(b->schedules[0].num_splits, P);
  assert_int_equal(b->schedules[0].aggregate, 0);
  assert_int_equal(b->schedules[0].ops, 1);
  assert_int_equal(b->schedules[1].num_splits, P / 2);
  assert_int_equal(b->schedules[1].aggregate, 1);
  assert_int_equal(b->schedules[1].ops, 2);
}

static void test_stats__more_schedules_than_slots_count_as_other(void **state) {
  fixture *f = *state;
  static uint16_t x[C * 8], w[256 * 8], out[(C / P) * 256];
  tpf_shape sh = {C, 256};
  TPF_ASSERT_OK(tpf_comm_set_active_shape(f->c, sh));
  const int splits[] = {1, 2, 4, 8, 16, 2};
  for (size_t i = 0; i < TPF_ARRAY_SIZE(splits); i++) {
    tpf_matrix mx = {x, C, 8, 8, TPF_BF16}, mw = {w, 256, 8, 8, TPF_BF16};
    tpf_matrix mo = {out, C / P, 256, 256, TPF_BF16};
    tpf_op_options o = TPF_OP_OPTIONS_INIT;
    o.num_splits = splits[i];
    if (tpf_gemm_rs_ex(f->c, &mx, &mw, &mo, &o, NULL) != TPF_OK)
      fail_msg("splits %d: %s", splits[i], tpf_last_error());
  }
  tpf_comm_stats s = get(f->c);
  const tpf_stats_bucket *b = &s.buckets[6];
  assert_int_equal(b->ops, 6);
  for (int i = 0; i < TPF_STATS_SCHEDULES; i++)
    assert_int_equal(b->schedules[i].num_splits, splits[i]);
  assert_int_equal(b->schedules[1].ops, 2); /* the second 2 */
  assert_int_equal(b->other_ops, 1);        /* 16: no slot left */
}

static void test_stats__refused_operations_count_nothing(void **state) {
  fixture *f = *state;
  TPF_ASSERT_OK(ag_at(f, 32, 0));
  tpf_comm_stats before = get(f->c);
  static uint16_t w[N * H], d[C * N];
  tpf_matrix mw = {w, N, H, H, TPF_BF16};
  tpf_matrix md = {d, 28, N, N, TPF_BF16}; /* wrong rows for T = 32 */
  TPF_ASSERT_STATUS(tpf_ag_gemm(f->c, &mw, &md, NULL), TPF_ESHAPE);
  tpf_op_options o = TPF_OP_OPTIONS_INIT;
  o.num_splits = 3; /* not a legal split count for 4 ranks */
  md.rows = 32;
  assert_int_not_equal(tpf_ag_gemm_ex(f->c, &mw, &md, &o, NULL), TPF_OK);
  tpf_shape bad = {30, H}; /* not divisible by P */
  TPF_ASSERT_STATUS(tpf_comm_set_active_shape(f->c, bad), TPF_EDIVISIBLE);
  tpf_comm_stats after = get(f->c);
  assert_memory_equal(&before, &after, sizeof before);
}

static void test_stats__reset_and_bad_arguments(void **state) {
  fixture *f = *state;
  TPF_ASSERT_OK(ag_at(f, 16, 0));
  assert_int_equal(get(f->c).ops, 1);
  TPF_ASSERT_OK(tpf_comm_reset_stats(f->c));
  tpf_comm_stats s = get(f->c), zero;
  memset(&zero, 0, sizeof zero);
  zero.size = sizeof zero;
  assert_memory_equal(&s, &zero, sizeof s);
  /* size 0: this header's layout. */
  TPF_ASSERT_OK(ag_at(f, 16, 0));
  memset(&s, 0, sizeof s);
  TPF_ASSERT_OK(tpf_comm_get_stats(f->c, &s));
  assert_int_equal(s.ops, 1);
  assert_int_equal(s.size, sizeof s);
  /* A size that is no released layout: refused, naming it, and *out untouched. */
  memset(&s, 0x5a, sizeof s);
  s.size = sizeof s - 8;
  tpf_comm_stats copy = s;
  TPF_ASSERT_STATUS(tpf_comm_get_stats(f->c, &s), TPF_EINVAL);
  assert_non_null(strstr(tpf_last_error(), "tpf_comm_stats"));
  assert_memory_equal(&s, &copy, sizeof s);
  TPF_ASSERT_STATUS(tpf_comm_get_stats(f->c, NULL), TPF_EINVAL);
  TPF_ASSERT_STATUS(tpf_comm_get_stats(NULL, &s), TPF_EINVAL);
  TPF_ASSERT_STATUS(tpf_comm_reset_stats(NULL), TPF_EINVAL);
}

/* ---- On the simulator: the bytes every rank counted add up to the bytes the simulator saw
 * cross between registrations, for every schedule kind. ---- */

enum { SP = 4, SC = 32, SH = 8, SK = 8, NK = 5 };
static const char *kNames[NK] = {"ring_ag", "ring_rs", "pipe_rs", "bulk_ag", "bulk_rs"};
typedef struct {
  tpf_comm *c[SP][NK];
  uint64_t bytes[SP];
  uint64_t ops[SP];
} sim_state;
static float g_x[SP][SC * SK], g_w[SP][SC * SK], g_d[SP][SC * SC], g_out[SP][SC * SH];

static tpf_status sim_rank(tpf_backend *be, int r, void *arg) {
  sim_state *s = arg;
  const tpf_algo algo[NK] = {TPF_ALGO_RING, TPF_ALGO_RING, TPF_ALGO_PIPELINE, TPF_ALGO_BULK,
                             TPF_ALGO_BULK};
  const tpf_coll coll[NK] = {TPF_COLL_AG, TPF_COLL_RS, TPF_COLL_RS, TPF_COLL_AG, TPF_COLL_RS};
  for (int k = 0; k < NK; k++) {
    tpf_comm_config cfg = tpf_test_config(kNames[k], algo[k], coll[k], TPF_FP32, SC, SH);
    TPF_CHECK(tpf_comm_create(be, &cfg, &s->c[r][k]));
  }
  const uint64_t Ts[] = {8, 16, 32, 24};
  for (size_t i = 0; i < TPF_ARRAY_SIZE(Ts); i++)
    for (int k = 0; k < NK; k++) {
      const uint64_t T = Ts[i];
      tpf_comm *c = s->c[r][k];
      tpf_shape sh = {T, SH};
      TPF_CHECK(tpf_comm_set_active_shape(c, sh));
      if (k == 0) {
        tpf_matrix w = {g_w[r], SH, SH, SH, TPF_FP32}, d = {g_d[r], T, SH, SH, TPF_FP32};
        TPF_CHECK(tpf_ag_gemm(c, &w, &d, NULL));
      } else if (k <= 2) {
        tpf_matrix x = {g_x[r], T, SK, SK, TPF_FP32}, w = {g_w[r], SH, SK, SK, TPF_FP32};
        tpf_matrix out = {g_out[r], T / SP, SH, SH, TPF_FP32};
        TPF_CHECK(tpf_gemm_rs(c, &x, &w, &out, NULL));
      } else {
        tpf_matrix a = {g_x[r], 4, SK, SK, TPF_FP32}, b = {g_w[r], 4, SK, SK, TPF_FP32};
        tpf_matrix d = {g_d[r], 4, 4, 4, TPF_FP32};
        TPF_CHECK(tpf_bulk_overlap(c, &a, &b, &d, NULL));
      }
    }
  for (int k = 0; k < NK; k++) {
    tpf_comm_stats st;
    memset(&st, 0, sizeof st);
    TPF_CHECK(tpf_comm_get_stats(s->c[r][k], &st));
    s->bytes[r] += st.bytes;
    s->ops[r] += st.ops;
    TPF_CHECK(tpf_comm_destroy(s->c[r][k]));
  }
  return TPF_OK;
}

static void test_stats__bytes_match_the_simulators_count(void **state) {
  (void)state;
  tpf_sim_config cfg = {.tp_size = SP, .seed = 7, .timeout_ms = 10000};
  tpf_sim_world *w = NULL;
  TPF_ASSERT_OK(tpf_sim_world_create(&cfg, &w));
  static sim_state s;
  memset(&s, 0, sizeof s);
  TPF_ASSERT_OK(tpf_sim_run(w, sim_rank, &s));
  tpf_sim_stats ws;
  TPF_ASSERT_OK(tpf_sim_get_stats(w, &ws));
  uint64_t bytes = 0, ops = 0;
  for (int r = 0; r < SP; r++) {
    bytes += s.bytes[r];
    ops += s.ops[r];
  }
  assert_int_equal(ops, ws.ops);
  assert_true(bytes > 0);
  assert_int_equal(bytes, ws.bytes_moved);
  TPF_ASSERT_OK(tpf_sim_world_destroy(w));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_stats__bucket_of_is_floor_log2),
      cmocka_unit_test_setup_teardown(test_stats__counts_rows_padding_and_bytes, setup_ring_ag,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_stats__schedules_per_bucket_and_aggregate, setup_ring_ag,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_stats__more_schedules_than_slots_count_as_other,
                                      setup_pipe_rs, teardown),
      cmocka_unit_test_setup_teardown(test_stats__refused_operations_count_nothing, setup_ring_ag,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_stats__reset_and_bad_arguments, setup_ring_ag, teardown),
      cmocka_unit_test(test_stats__bytes_match_the_simulators_count),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
