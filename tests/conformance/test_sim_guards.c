/* The simulator's guards, end to end through the public API: a shape disagreement fails every
 * rank with TPF_EMISMATCH and leaves the communicator usable; a lost signal ends in TPF_ETIMEOUT
 * naming rank, step and peer, within the timeout, and leaves the communicator failed; an
 * injected backend failure surfaces with its status; a write beyond the active layout is caught
 * by the canary with communicator, rank and offset; registrations that differ between ranks fail
 * on every rank. */
#define _POSIX_C_SOURCE 200809L
#include "tpf_test.h"

#include "tpflex/tpflex_sim.h"

#include <time.h>

enum { H = 32 };

typedef struct {
  uint64_t rows[TPF_MAX_RANKS];     /* per-rank active rows of the first operation */
  uint64_t capacity[TPF_MAX_RANKS]; /* per-rank capacity (registration test) */
  bool poke_canary;                 /* rank 1 writes one byte past its active layout */
  tpf_status st[TPF_MAX_RANKS];     /* first operation */
  tpf_status st2[TPF_MAX_RANKS];    /* second operation (all agree on rows P) */
  char msg[TPF_MAX_RANKS][512];
  uint64_t poke_off;
} guard_arg;

static tpf_status guard_rank(tpf_backend *be, int rank, void *p) {
  guard_arg *g = p;
  int P = be->tp_size;
  tpf_comm_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.name = "fc1_fprop";
  cfg.algo = TPF_ALGO_RING;
  cfg.coll = TPF_COLL_AG;
  cfg.dtype = TPF_BF16;
  cfg.capacity.rows = g->capacity[rank] ? g->capacity[rank] : (uint64_t)(8 * P);
  cfg.capacity.cols = H;
  tpf_comm *c = NULL;
  tpf_status st = tpf_comm_create(be, &cfg, &c);
  if (st != TPF_OK) {
    g->st[rank] = st;
    snprintf(g->msg[rank], sizeof g->msg[rank], "%s", tpf_last_error());
    return TPF_OK;
  }
  uint16_t w[4 * H], d[8 * 64 * 4];
  memset(w, 0, sizeof w);
  tpf_matrix wm = {w, 4, H, H, TPF_BF16};
  tpf_shape s = {g->rows[rank], H};
  st = tpf_comm_set_active_shape(c, s);
  if (st == TPF_OK && g->poke_canary && rank == 1) {
    void *base;
    uint64_t bytes;
    tpf_comm_registration(c, &base, &bytes);
    g->poke_off = g->rows[rank] * H * 2 + 5;
    ((unsigned char *)base)[g->poke_off] ^= 0xFF;
  }
  if (st == TPF_OK) {
    tpf_matrix dm = {d, s.rows, 4, 4, TPF_BF16};
    st = tpf_ag_gemm(c, &wm, &dm, NULL);
  }
  g->st[rank] = st;
  snprintf(g->msg[rank], sizeof g->msg[rank], "%s", st == TPF_OK ? "" : tpf_last_error());
  /* Second operation with agreeing shapes. */
  tpf_shape s2 = {(uint64_t)P, H};
  st = tpf_comm_set_active_shape(c, s2);
  if (st == TPF_OK) {
    tpf_matrix dm = {d, s2.rows, 4, 4, TPF_BF16};
    st = tpf_ag_gemm(c, &wm, &dm, NULL);
  }
  g->st2[rank] = st;
  tpf_comm_destroy(c);
  return TPF_OK;
}

static tpf_sim_world *world(int P, unsigned timeout_ms) {
  tpf_sim_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.tp_size = P;
  cfg.seed = 3;
  cfg.max_delay_us = 20;
  cfg.timeout_ms = timeout_ms;
  cfg.arena_bytes = 16u << 20;
  tpf_sim_world *w = NULL;
  TPF_ASSERT_OK(tpf_sim_world_create(&cfg, &w));
  return w;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void test_sim__shape_mismatch_fails_every_rank_and_stays_usable(void **state) {
  (void)state;
  enum { P = 3 };
  tpf_sim_world *w = world(P, 5000);
  guard_arg g;
  memset(&g, 0, sizeof g);
  for (int r = 0; r < P; r++)
    g.rows[r] = r == 1 ? 2 * P : P;
  TPF_ASSERT_OK(tpf_sim_run(w, guard_rank, &g));
  for (int r = 0; r < P; r++) {
    if (g.st[r] != TPF_EMISMATCH)
      fail_msg("rank %d: %s (%s), expected TPF_EMISMATCH", r, tpf_status_name(g.st[r]), g.msg[r]);
    assert_non_null(strstr(g.msg[r], "active shapes differ"));
    assert_non_null(strstr(g.msg[r], "[6, 32]")); /* names both shapes */
    assert_non_null(strstr(g.msg[r], "[3, 32]"));
    TPF_ASSERT_STATUS(g.st2[r], TPF_OK);
  }
  TPF_ASSERT_OK(tpf_sim_world_destroy(w));
}

static void test_sim__lost_signal_times_out_and_fails_the_comm(void **state) {
  (void)state;
  enum { P = 2 };
  tpf_sim_world *w = world(P, 300);
  tpf_sim_fault f = {0, TPF_OK, 1};
  TPF_ASSERT_OK(tpf_sim_set_fault(w, &f));
  guard_arg g;
  memset(&g, 0, sizeof g);
  g.rows[0] = g.rows[1] = 2 * P;
  double t0 = now_s();
  TPF_ASSERT_OK(tpf_sim_run(w, guard_rank, &g));
  double dt = now_s() - t0;
  int timed_out = -1;
  for (int r = 0; r < P; r++)
    if (g.st[r] == TPF_ETIMEOUT) timed_out = r;
  if (timed_out < 0)
    fail_msg("no rank timed out: %s / %s", tpf_status_name(g.st[0]), tpf_status_name(g.st[1]));
  const char *m = g.msg[timed_out];
  assert_non_null(strstr(m, "timeout after 300 ms"));
  assert_non_null(strstr(m, "step"));
  assert_non_null(strstr(m, "waits for rank"));
  TPF_ASSERT_STATUS(g.st2[timed_out], TPF_ESTATE);
  assert_true(dt < 5.0);
  TPF_ASSERT_OK(tpf_sim_world_destroy(w));
}

static void test_sim__injected_failure_surfaces(void **state) {
  (void)state;
  enum { P = 2 };
  tpf_sim_world *w = world(P, 300);
  /* Calls: 2 reg_create, 2 reg_activate, then the executes; fail the first execute. */
  tpf_sim_fault f = {5, TPF_EBACKEND, 0};
  TPF_ASSERT_OK(tpf_sim_set_fault(w, &f));
  guard_arg g;
  memset(&g, 0, sizeof g);
  g.rows[0] = g.rows[1] = P;
  TPF_ASSERT_OK(tpf_sim_run(w, guard_rank, &g));
  int injected = 0;
  for (int r = 0; r < P; r++)
    if (g.st[r] == TPF_EBACKEND && strstr(g.msg[r], "injected fault")) injected++;
  assert_int_equal(injected, 1);
  TPF_ASSERT_OK(tpf_sim_world_destroy(w));
}

static void test_sim__canary_names_comm_rank_offset(void **state) {
  (void)state;
  enum { P = 2 };
  tpf_sim_world *w = world(P, 2000);
  guard_arg g;
  memset(&g, 0, sizeof g);
  g.rows[0] = g.rows[1] = 2 * P;
  g.poke_canary = true;
  TPF_ASSERT_OK(tpf_sim_run(w, guard_rank, &g));
  TPF_ASSERT_STATUS(g.st[0], TPF_OK);
  /* Not a backend failure: TPF_ESTATE, naming the rows. The poke is byte 5 of
   * row 2P (bf16 rows of H columns). */
  TPF_ASSERT_STATUS(g.st[1], TPF_ESTATE);
  char want[320];
  snprintf(want, sizeof want,
           "bytes beyond the active layout were written: rows %d..%d of 'fc1_fprop' on rank 1 "
           "(the active layout ends at row %d of the %d registered; the canary first differs at "
           "byte offset %llu",
           2 * P, 2 * P, 2 * P, 8 * P, (unsigned long long)g.poke_off);
  if (!strstr(g.msg[1], want)) fail_msg("canary message: %s\nwanted: %s", g.msg[1], want);
  TPF_ASSERT_OK(tpf_sim_world_destroy(w));
}

static void test_sim__differing_registrations_fail_every_rank(void **state) {
  (void)state;
  enum { P = 3 };
  tpf_sim_world *w = world(P, 2000);
  guard_arg g;
  memset(&g, 0, sizeof g);
  for (int r = 0; r < P; r++) {
    g.capacity[r] = r == 2 ? 16 * P : 8 * P;
    g.rows[r] = P;
  }
  TPF_ASSERT_OK(tpf_sim_run(w, guard_rank, &g));
  for (int r = 0; r < P; r++) {
    TPF_ASSERT_STATUS(g.st[r], TPF_EMISMATCH);
    assert_non_null(strstr(g.msg[r], "differs between ranks"));
  }
  TPF_ASSERT_OK(tpf_sim_world_destroy(w));
}

static tpf_status rank_fails(tpf_backend *be, int rank, void *arg) {
  (void)be;
  (void)arg;
  return rank == 2 ? tpf_set_error(TPF_ESHAPE, "rank two says no") : TPF_OK;
}

static void test_sim__run_reports_the_failing_rank(void **state) {
  (void)state;
  tpf_sim_world *w = world(4, 1000);
  TPF_ASSERT_STATUS(tpf_sim_run(w, rank_fails, NULL), TPF_ESHAPE);
  assert_non_null(strstr(tpf_last_error(), "rank 2: rank two says no"));
  TPF_ASSERT_OK(tpf_sim_world_destroy(w));
  tpf_sim_config bad = {0, 0, 0, 0, 0, 0};
  tpf_sim_world *x = NULL;
  TPF_ASSERT_STATUS(tpf_sim_world_create(&bad, &x), TPF_EINVAL);
  bad.tp_size = TPF_MAX_RANKS + 1;
  TPF_ASSERT_STATUS(tpf_sim_world_create(&bad, &x), TPF_EINVAL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sim__shape_mismatch_fails_every_rank_and_stays_usable),
      cmocka_unit_test(test_sim__lost_signal_times_out_and_fails_the_comm),
      cmocka_unit_test(test_sim__injected_failure_surfaces),
      cmocka_unit_test(test_sim__canary_names_comm_rank_offset),
      cmocka_unit_test(test_sim__differing_registrations_fail_every_rank),
      cmocka_unit_test(test_sim__run_reports_the_failing_rank),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
