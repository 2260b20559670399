/* The core's part: while one thread is inside an operation for a rank of a
 * communicator, a second thread's operation, set_active_shape, sync or destroy on it is refused
 * at once with TPF_ESTATE naming the rule ("one thread per rank at a time") and changes nothing;
 * the first thread's operation completes normally and the communicator stays usable. On the
 * simulator the second job used to overwrite the first in the rank's job slot and the loser
 * waited forever.
 *
 * Deterministic: the backend's execute blocks on a condition variable until the test releases
 * it, so the first operation is in flight for as long as the test needs; no sleep, no timing. */
#include "comm_internal.h"
#include "tpf_test.h"

#include <pthread.h>

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;
static int g_entered, g_release;

static tpf_status blocking_execute(tpf_backend *be, tpf_reg *reg, const tpf_exec_args *a,
                                   void *stream) {
  pthread_mutex_lock(&g_mu);
  g_entered++;
  pthread_cond_broadcast(&g_cv);
  if (g_entered > 1 && !g_release) { /* a second thread got in: the old code (no hang here) */
    pthread_mutex_unlock(&g_mu);
    return tpf_set_error(TPF_EBACKEND, "two threads inside execute for one rank at once");
  }
  while (!g_release)
    pthread_cond_wait(&g_cv, &g_mu);
  pthread_mutex_unlock(&g_mu);
  return tpf_mock_ops.execute(be, reg, a, stream);
}

typedef struct {
  tpf_comm *c;
  tpf_status st;
} job;

enum { T = 16, H = 8, N = 8 };
static float g_w[N * H], g_d[T * N];

static tpf_status ag(tpf_comm *c) {
  tpf_matrix w = {g_w, N, H, H, TPF_FP32}, d = {g_d, T, N, N, TPF_FP32};
  return tpf_ag_gemm(c, &w, &d, NULL);
}

static void *first_thread(void *arg) {
  job *j = arg;
  j->st = ag(j->c);
  return NULL;
}

/* A one-rank mock backend whose execute blocks until release_first. */
static void blocking_backend(tpf_backend_ops *ops, tpf_mock_backend *be) {
  *ops = tpf_mock_ops;
  ops->execute = blocking_execute;
  tpf_mock_init(be, 1, 0);
  be->hdr.ops = ops;
}

/* Starts first_thread on j and returns once its operation is inside the backend. */
static void start_first(job *j, pthread_t *t) {
  g_entered = g_release = 0;
  assert_int_equal(pthread_create(t, NULL, first_thread, j), 0);
  pthread_mutex_lock(&g_mu);
  while (g_entered == 0)
    pthread_cond_wait(&g_cv, &g_mu);
  pthread_mutex_unlock(&g_mu);
}

/* Lets the first operation finish and checks it succeeded. */
static void release_first(job *j, pthread_t t) {
  pthread_mutex_lock(&g_mu);
  g_release = 1;
  pthread_cond_broadcast(&g_cv);
  pthread_mutex_unlock(&g_mu);
  assert_int_equal(pthread_join(t, NULL), 0);
  TPF_ASSERT_OK(j->st);
}

static void expect_rule(tpf_status st, const char *call) {
  if (st != TPF_ESTATE || !strstr(tpf_last_error(), "one thread per rank at a time") ||
      !strstr(tpf_last_error(), "'fc1_fprop'") || !strstr(tpf_last_error(), call))
    fail_msg("%s while another thread is in an operation: %s (%s), expected TPF_ESTATE naming "
             "the rule",
             call, tpf_status_name(st), tpf_last_error());
}

static void test_one_thread__second_thread_refused(void **state) {
  (void)state;
  tpf_backend_ops ops;
  tpf_mock_backend be;
  blocking_backend(&ops, &be);
  tpf_comm_config cfg = tpf_test_config("fc1_fprop", TPF_ALGO_RING, TPF_COLL_AG, TPF_FP32, T, H);
  tpf_comm *c = NULL;
  TPF_ASSERT_OK(tpf_comm_create(&be.hdr, &cfg, &c));
  job j = {c, TPF_EINVAL};
  pthread_t t;
  start_first(&j, &t);
  /* The first operation is inside the backend now. */
  const uint64_t seq = c->seq, epoch = c->epoch;
  tpf_matrix w = {g_w, N, H, H, TPF_FP32}, d = {g_d, T, N, N, TPF_FP32}, x = d;
  expect_rule(ag(c), "tpf_ag_gemm");
  expect_rule(tpf_gemm_rs(c, &x, &w, &d, NULL), "tpf_gemm_rs");
  expect_rule(tpf_bulk_overlap(c, &x, &w, &d, NULL), "tpf_bulk_overlap");
  expect_rule(tpf_comm_set_active_shape(c, (tpf_shape){8, H}), "set_active_shape");
  expect_rule(tpf_comm_sync(c), "tpf_comm_sync");
  expect_rule(tpf_comm_destroy(c), "tpf_comm_destroy");
  assert_int_equal(g_entered, 1); /* nothing of the refused calls reached the backend */
  assert_int_equal(c->seq, seq);
  assert_int_equal(c->epoch, epoch);
  /* Local queries stay available (they change nothing). */
  assert_int_equal(tpf_comm_active_shape(c).rows, T);
  release_first(&j, t);
  assert_int_equal(c->seq, seq + 1);
  /* The communicator is usable: the next calls from this thread run. */
  TPF_ASSERT_OK(tpf_comm_set_active_shape(c, (tpf_shape){8, H}));
  tpf_matrix d8 = {g_d, 8, N, N, TPF_FP32};
  TPF_ASSERT_OK(tpf_ag_gemm(c, &w, &d8, NULL));
  TPF_ASSERT_OK(tpf_comm_sync(c));
  TPF_ASSERT_OK(tpf_comm_destroy(c));
  assert_int_equal(be.reg_live, 0);
}

/* Two communicators of one rank, used from two threads: the second thread's operation on the
 * other communicator is refused by the core before the backend sees it (the backend's own entry
 * guard would refuse it only after the core had used a sequence number and marked that
 * communicator failed). Nothing changes: the refused communicator's sequence stays, it is not
 * failed, and it runs once the first thread is out. */
static void test_one_thread__second_communicator_of_the_rank_refused(void **state) {
  (void)state;
  tpf_backend_ops ops;
  tpf_mock_backend be;
  blocking_backend(&ops, &be);
  tpf_comm_config ca = tpf_test_config("fc1_fprop", TPF_ALGO_RING, TPF_COLL_AG, TPF_FP32, T, H);
  tpf_comm_config cb = tpf_test_config("qkv_fprop", TPF_ALGO_RING, TPF_COLL_AG, TPF_FP32, T, H);
  tpf_comm *a = NULL, *b = NULL;
  TPF_ASSERT_OK(tpf_comm_create(&be.hdr, &ca, &a));
  TPF_ASSERT_OK(tpf_comm_create(&be.hdr, &cb, &b));
  job j = {a, TPF_EINVAL};
  pthread_t t;
  start_first(&j, &t);
  const uint64_t seq = b->seq;
  const tpf_status st = ag(b);
  if (st != TPF_ESTATE || !strstr(tpf_last_error(), "one thread per rank at a time") ||
      !strstr(tpf_last_error(), "'qkv_fprop'"))
    fail_msg("an operation on another communicator of a busy rank: %s (%s), expected TPF_ESTATE "
             "naming the rule and the communicator",
             tpf_status_name(st), tpf_last_error());
  assert_int_equal(g_entered, 1); /* the backend never saw it */
  assert_int_equal(b->seq, seq);
  assert_int_equal(b->failed, TPF_OK);
  release_first(&j, t);
  TPF_ASSERT_OK(ag(b)); /* usable: it was refused, not failed */
  assert_int_equal(b->seq, seq + 1);
  TPF_ASSERT_OK(tpf_comm_destroy(b));
  TPF_ASSERT_OK(tpf_comm_destroy(a));
  assert_int_equal(be.reg_live, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_one_thread__second_thread_refused),
      cmocka_unit_test(test_one_thread__second_communicator_of_the_rank_refused),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
