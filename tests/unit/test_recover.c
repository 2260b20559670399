/* The core's part: one failed communicator must not brick its manager. A write
 * through a stale view beyond the active layout (the simulator's canary) fails the operation on
 * that rank and leaves the communicator failed; the manager's set_active_shape then refuses
 * (all-or-nothing), naming the communicator, the original failure and the way out. The way out:
 * tpf_comm_destroy the failed communicator on every rank (a managed one leaves its manager) and
 * tpf_manager_add it again; afterwards the manager's shape changes and every operation work. */
#include "tpf_test.h"
#include "tpflex/tpflex_sim.h"

enum { C = 64, H = 8, N = 8 };

typedef struct {
  tpf_manager *m[2];
  tpf_matrix stale[2];
  tpf_status op[2], shape_after[2], recovered_shape[2], recovered_op[2];
  char msg_op[2][512], msg_shape[2][512];
  int count_after_destroy[2];
  float w[2][N * H], d[2][C * N];
} rec;

static tpf_comm_config cfg_of(const char *name, tpf_algo algo, tpf_coll coll) {
  tpf_comm_config c = TPF_COMM_CONFIG_INIT;
  c.name = name;
  c.algo = algo;
  c.coll = coll;
  c.dtype = TPF_FP32;
  c.capacity = (tpf_shape){C, H};
  return c;
}

static tpf_status ag(rec *s, int r, tpf_comm *c, uint64_t T) {
  tpf_matrix w = {s->w[r], N, H, H, TPF_FP32}, d = {s->d[r], T, N, N, TPF_FP32};
  return tpf_ag_gemm(c, &w, &d, NULL);
}

static tpf_status rank_fn(tpf_backend *be, int r, void *arg) {
  rec *s = arg;
  const tpf_comm_config a = cfg_of("fc1_fprop", TPF_ALGO_RING, TPF_COLL_AG);
  const tpf_comm_config b = cfg_of("fc2_fprop", TPF_ALGO_RING, TPF_COLL_RS);
  const tpf_comm_config k = cfg_of("proj_fprop", TPF_ALGO_BULK, TPF_COLL_AG);
  tpf_manager *m = NULL;
  TPF_CHECK(tpf_manager_create(be, &m));
  s->m[r] = m;
  tpf_comm *fc1 = NULL;
  TPF_CHECK(tpf_manager_add(m, &a, &fc1));
  TPF_CHECK(tpf_manager_add(m, &b, NULL));
  TPF_CHECK(tpf_manager_add(m, &k, NULL));
  /* A view taken at T = C, kept after T shrinks to 32 (a stale view). */
  TPF_CHECK(tpf_comm_buffer(fc1, &s->stale[r]));
  TPF_CHECK(tpf_manager_set_active_shape(m, (tpf_shape){32, H}));
  if (r == 1) { /* rank 1 writes rows 40..47 through it: beyond the active layout */
    float *p = s->stale[r].ptr;
    for (uint64_t i = 40 * H; i < 48 * H; i++)
      p[i] = 1.0f;
  }
  s->op[r] = ag(s, r, fc1, 32);
  snprintf(s->msg_op[r], sizeof s->msg_op[r], "%s", tpf_last_error());
  s->shape_after[r] = tpf_manager_set_active_shape(m, (tpf_shape){16, H});
  snprintf(s->msg_shape[r], sizeof s->msg_shape[r], "%s", tpf_last_error());
  /* Recovery, on every rank: destroy the communicator (collective), add it again. */
  TPF_CHECK(tpf_comm_destroy(fc1));
  s->count_after_destroy[r] = tpf_manager_count(m);
  TPF_CHECK(tpf_manager_add(m, &a, &fc1));
  s->recovered_shape[r] = tpf_manager_set_active_shape(m, (tpf_shape){16, H});
  s->recovered_op[r] = ag(s, r, fc1, 16);
  return tpf_manager_destroy(m);
}

static void test_recover__failed_communicator_does_not_brick_the_manager(void **state) {
  (void)state;
  tpf_sim_config sc = TPF_SIM_CONFIG_INIT;
  sc.tp_size = 2;
  tpf_sim_world *w = NULL;
  TPF_ASSERT_OK(tpf_sim_world_create(&sc, &w));
  static rec s;
  TPF_ASSERT_OK(tpf_sim_run(w, rank_fn, &s));
  /* Rank 1's operation saw its canary overwritten; rank 0's was fine. */
  TPF_ASSERT_OK(s.op[0]);
  if (s.op[1] == TPF_OK) fail_msg("the write beyond the active layout went unnoticed");
  TPF_ASSERT_OK(s.shape_after[0]);
  /* Rank 1's manager refuses the shape change, naming the communicator, the original failure
   * and the way out. */
  TPF_ASSERT_STATUS(s.shape_after[1], TPF_ESTATE);
  const char *want[] = {"'fc1_fprop'", "failed earlier", tpf_status_name(s.op[1]),
                        "tpf_comm_destroy", "tpf_manager_add"};
  for (size_t i = 0; i < TPF_ARRAY_SIZE(want); i++)
    if (!strstr(s.msg_shape[1], want[i]))
      fail_msg("manager refusal '%s' lacks '%s'", s.msg_shape[1], want[i]);
  for (int r = 0; r < 2; r++) {
    assert_int_equal(s.count_after_destroy[r], 2); /* the destroyed one left its manager */
    TPF_ASSERT_OK(s.recovered_shape[r]);
    TPF_ASSERT_OK(s.recovered_op[r]);
  }
  print_message("rank 1's failure: %s\nmanager refusal: %s\n", s.msg_op[1], s.msg_shape[1]);
  tpf_sim_fault_report rep;
  TPF_ASSERT_OK(tpf_sim_get_fault_report(w, &rep));
  assert_int_equal(rep.live_registrations, 0);
  TPF_ASSERT_OK(tpf_sim_world_destroy(w));
}

/* The simulator refills only the rows a shrink gives up (a grow fills nothing): through a history
 * of shrinks and grows, in which operations write every active row, no operation may see a false
 * canary failure, and a stray write into rows the last shrink gave up is still caught. */
typedef struct {
  tpf_status ops[6], stray;
  char msg[512];
  float w[N * H], d[C * N];
} delta_rec;

static tpf_status delta_fn(tpf_backend *be, int r, void *arg) {
  (void)r;
  delta_rec *s = arg;
  const tpf_comm_config a = cfg_of("fc1_fprop", TPF_ALGO_RING, TPF_COLL_AG);
  tpf_comm *c = NULL;
  TPF_CHECK(tpf_comm_create(be, &a, &c));
  tpf_matrix whole;
  TPF_CHECK(tpf_comm_buffer(c, &whole)); /* taken at T = C: later a stale view */
  const uint64_t Ts[] = {32, 48, 16, 64, 8, 40};
  for (size_t i = 0; i < TPF_ARRAY_SIZE(Ts); i++) {
    TPF_CHECK(tpf_comm_set_active_shape(c, (tpf_shape){Ts[i], H}));
    tpf_matrix w = {s->w, N, H, H, TPF_FP32}, d = {s->d, Ts[i], N, N, TPF_FP32};
    s->ops[i] = tpf_ag_gemm(c, &w, &d, NULL);
  }
  /* T = 40 after T = 8 (a grow): shrink to 24 and write row 30, given up by this shrink. */
  TPF_CHECK(tpf_comm_set_active_shape(c, (tpf_shape){24, H}));
  ((float *)whole.ptr)[30 * H + 3] = 2.0f;
  tpf_matrix w = {s->w, N, H, H, TPF_FP32}, d = {s->d, 24, N, N, TPF_FP32};
  s->stray = tpf_ag_gemm(c, &w, &d, NULL);
  snprintf(s->msg, sizeof s->msg, "%s", tpf_last_error());
  return tpf_comm_destroy(c);
}

static void test_recover__canary_follows_shrinks_and_grows(void **state) {
  (void)state;
  tpf_sim_config sc = TPF_SIM_CONFIG_INIT;
  sc.tp_size = 1;
  tpf_sim_world *w = NULL;
  TPF_ASSERT_OK(tpf_sim_world_create(&sc, &w));
  static delta_rec s;
  for (int i = 0; i < N * H; i++)
    s.w[i] = (float)(i % 5) - 2.0f;
  TPF_ASSERT_OK(tpf_sim_run(w, delta_fn, &s));
  for (int i = 0; i < 6; i++)
    TPF_ASSERT_OK(s.ops[i]);
  TPF_ASSERT_STATUS(s.stray, TPF_ESTATE);
  if (!strstr(s.msg, "rows 30..30 of 'fc1_fprop'"))
    fail_msg("the stray write is reported as '%s' (want rows 30..30 of 'fc1_fprop')", s.msg);
  TPF_ASSERT_OK(tpf_sim_world_destroy(w));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_recover__failed_communicator_does_not_brick_the_manager),
      cmocka_unit_test(test_recover__canary_follows_shrinks_and_grows),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
