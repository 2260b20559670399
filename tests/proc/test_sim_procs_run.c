/* The harness's simulator ranks as processes (harness/sim_procs.h), which conformance_sim
 * --procs and `tpflex demo --mode procs` run on: every rank's function runs in its own process
 * over a simulator rank, results come back by the merge, enter and leave run around it, a
 * failing rank is named with its status, a rank killed before reporting is named with its exit
 * status, and a rank that reported success and then died in its exit fails the run. */
#define _DEFAULT_SOURCE
#define _POSIX_C_SOURCE 200809L
#include "sim_procs.h"
#include "tpf_test.h"

#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

enum { P = 3 };

typedef struct {
  int mode;           /* what rank 1 does (below) */
  int ran[P];         /* 1 + rank: fn ran there (merged back) */
  int entered[P];     /* enter ran (merged back) */
  int left_before[P]; /* leave ran while entered was still set (merged back) */
  int tp_size[P];     /* the backend's P as the rank saw it */
} job_state;

enum { RANK1_OK, RANK1_FAILS, RANK1_KILLED, RANK1_ABORTS_AT_EXIT, RANK1_ENTER_FAILS };

static void abort_now(void) {
  abort();
}

static tpf_status rank_fn(tpf_backend *be, int rank, void *arg) {
  job_state *s = arg;
  tpf_sim_world *w = NULL;
  if (tpf_sim_backend_world(be, &w) != TPF_OK) return tpf_set_error(TPF_EINVAL, "no world");
  s->ran[rank] = 1 + rank;
  s->tp_size[rank] = P;
  if (rank != 1) return TPF_OK;
  switch (s->mode) {
  case RANK1_FAILS:
    return tpf_set_error(TPF_EINVAL, "rank 1's own failure");
  case RANK1_KILLED:
    raise(SIGKILL);
    return TPF_OK;
  case RANK1_ABORTS_AT_EXIT:
    atexit(abort_now); /* after the rank has reported */
    return TPF_OK;
  default:
    return TPF_OK;
  }
}

static tpf_status enter(void *arg, int rank, tpf_backend *be, const tpf_bootstrap *boot) {
  job_state *s = arg;
  if (be == NULL || boot == NULL || boot->tp_size != P || boot->rank != rank)
    return tpf_set_error(TPF_EINVAL, "enter: wrong backend or bootstrap");
  if (s->mode == RANK1_ENTER_FAILS && rank == 1)
    return tpf_set_error(TPF_EBACKEND, "rank 1's enter failed");
  s->entered[rank] = 1;
  return TPF_OK;
}

static void leave(void *arg, int rank) {
  job_state *s = arg;
  s->left_before[rank] = s->entered[rank];
}

static tpf_status run(job_state *s, int mode) {
  memset(s, 0, sizeof *s);
  s->mode = mode;
  tpf_sim_procs_job job;
  memset(&job, 0, sizeof job);
  job.cfg.timeout_ms = 5000;
  job.fn = rank_fn;
  job.arg = s;
  job.results = s;
  job.enter = enter;
  job.leave = leave;
  job.wait_ms = 60000;
  job.grace_ms = 10000;
  job.who = "test_sim_procs_run";
  return tpf_sim_procs_run(P, &job);
}

static void test_sim_procs_run__every_rank_runs_and_results_merge(void **state) {
  (void)state;
  job_state *s = malloc(sizeof *s);
  assert_non_null(s);
  assert_int_equal(run(s, RANK1_OK), TPF_OK);
  for (int r = 0; r < P; r++) {
    assert_int_equal(s->ran[r], 1 + r);
    assert_int_equal(s->entered[r], 1);
    assert_int_equal(s->left_before[r], 1);
    assert_int_equal(s->tp_size[r], P);
  }
  free(s);
}

static void test_sim_procs_run__failing_rank_is_named(void **state) {
  (void)state;
  job_state *s = malloc(sizeof *s);
  assert_non_null(s);
  assert_int_equal(run(s, RANK1_FAILS), TPF_EINVAL);
  assert_non_null(strstr(tpf_last_error(), "rank 1: rank 1's own failure"));
  free(s);
}

static void test_sim_procs_run__killed_rank_is_named(void **state) {
  (void)state;
  job_state *s = malloc(sizeof *s);
  assert_non_null(s);
  assert_int_equal(run(s, RANK1_KILLED), TPF_EBACKEND);
  assert_non_null(strstr(tpf_last_error(), "rank 1's process ended (status 137) before reporting"));
  assert_int_equal(s->ran[0], 1); /* the others' results still come back */
  assert_int_equal(s->ran[2], 3);
  free(s);
}

/* Reported TPF_OK, then died in its exit (an atexit handler aborts): a failure, not a pass. */
static void test_sim_procs_run__death_after_reporting_fails(void **state) {
  (void)state;
  job_state *s = malloc(sizeof *s);
  assert_non_null(s);
  assert_int_equal(run(s, RANK1_ABORTS_AT_EXIT), TPF_EBACKEND);
  assert_non_null(strstr(tpf_last_error(), "rank 1's process reported success, then ended with "
                                           "status 134"));
  free(s);
}

static void test_sim_procs_run__failing_enter_skips_fn(void **state) {
  (void)state;
  job_state *s = malloc(sizeof *s);
  assert_non_null(s);
  assert_int_equal(run(s, RANK1_ENTER_FAILS), TPF_EBACKEND);
  assert_non_null(strstr(tpf_last_error(), "rank 1: rank 1's enter failed"));
  assert_int_equal(s->ran[1], 0);
  assert_int_equal(s->left_before[1], 0);
  free(s);
}

static void test_sim_procs_run__bad_arguments(void **state) {
  (void)state;
  tpf_sim_procs_job job;
  memset(&job, 0, sizeof job);
  assert_int_equal(tpf_sim_procs_run(2, NULL), TPF_EINVAL);
  assert_int_equal(tpf_sim_procs_run(2, &job), TPF_EINVAL); /* no function */
  job.fn = rank_fn;
  assert_int_equal(tpf_sim_procs_run(0, &job), TPF_EINVAL);
  assert_non_null(strstr(tpf_last_error(), "P=0 outside 1.."));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sim_procs_run__every_rank_runs_and_results_merge),
      cmocka_unit_test(test_sim_procs_run__failing_rank_is_named),
      cmocka_unit_test(test_sim_procs_run__killed_rank_is_named),
      cmocka_unit_test(test_sim_procs_run__death_after_reporting_fails),
      cmocka_unit_test(test_sim_procs_run__failing_enter_skips_fn),
      cmocka_unit_test(test_sim_procs_run__bad_arguments),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
