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
#include "tpflex/tpflex_sim.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>

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

/* ---- Every call that reaches the backend holds the rank (SPEC §4: a refused call changes
 * nothing) ----
 *
 * A backend may guard its own entries (the simulator's rank guard: one thread inside a rank's
 * backend at a time). When only operations held the rank in the core, a second thread's call
 * reached that guard in the middle of its work: an operation after the core had counted it
 * (the communicator failed here, its peers waited out their timeout), a manager's shape change
 * after it had changed some communicators (rows 64 128 128 128; its rollback refused too), a
 * destroy after it had freed the communicator (registration leaked), a manager's destroy after
 * it had destroyed some. The mock below has such a guard on every entry, and blocks the entry
 * named by g_block until the test releases it; the tests show the refused call changes nothing. */
enum { BLOCK_NONE, BLOCK_EXECUTE, BLOCK_SYNC };
static atomic_int g_guard;          /* a thread is inside a guarded backend entry */
static int g_block;                 /* BLOCK_*: the entry that waits for g_release */
static int g_blocked;               /* threads waiting inside the blocked entry (under g_mu) */
static void (*g_on_activate)(void); /* run inside reg_activate once, after its work */

static tpf_status guard_in(const char *what) {
  int none = 0;
  if (atomic_compare_exchange_strong(&g_guard, &none, 1)) return TPF_OK;
  return tpf_set_error(TPF_ESTATE, "guarded mock: %s while another thread is in the backend", what);
}

static void guard_out(void) {
  atomic_store(&g_guard, 0);
}

static void maybe_block(int which) {
  if (g_block != which) return;
  pthread_mutex_lock(&g_mu);
  g_blocked++;
  pthread_cond_broadcast(&g_cv);
  while (!g_release)
    pthread_cond_wait(&g_cv, &g_mu);
  g_blocked--;
  pthread_mutex_unlock(&g_mu);
}

static tpf_status gd_execute(tpf_backend *be, tpf_reg *reg, const tpf_exec_args *a, void *st) {
  TPF_CHECK(guard_in("execute"));
  maybe_block(BLOCK_EXECUTE);
  tpf_status rc = tpf_mock_ops.execute(be, reg, a, st);
  guard_out();
  return rc;
}
static tpf_status gd_sync(tpf_backend *be, void *st) {
  TPF_CHECK(guard_in("sync"));
  maybe_block(BLOCK_SYNC);
  tpf_status rc = tpf_mock_ops.sync(be, st);
  guard_out();
  return rc;
}
static tpf_status gd_activate(tpf_backend *be, tpf_reg *reg, uint64_t bytes) {
  TPF_CHECK(guard_in("reg_activate"));
  tpf_status rc = tpf_mock_ops.reg_activate(be, reg, bytes);
  guard_out();
  void (*hook)(void) = g_on_activate;
  g_on_activate = NULL;
  if (hook) hook();
  return rc;
}
static tpf_status gd_reg_create(tpf_backend *be, const char *name, uint64_t bytes, tpf_reg **reg,
                                void **local) {
  TPF_CHECK(guard_in("reg_create"));
  tpf_status rc = tpf_mock_ops.reg_create(be, name, bytes, reg, local);
  guard_out();
  return rc;
}
static tpf_status gd_reg_destroy(tpf_backend *be, tpf_reg *reg) {
  TPF_CHECK(guard_in("reg_destroy"));
  tpf_status rc = tpf_mock_ops.reg_destroy(be, reg);
  guard_out();
  return rc;
}

static void guarded_backend(tpf_backend_ops *ops, tpf_mock_backend *be) {
  *ops = tpf_mock_ops;
  ops->execute = gd_execute;
  ops->sync = gd_sync;
  ops->reg_activate = gd_activate;
  ops->reg_create = gd_reg_create;
  ops->reg_destroy = gd_reg_destroy;
  tpf_mock_init(be, 1, 0);
  be->hdr.ops = ops;
  atomic_store(&g_guard, 0);
  g_block = BLOCK_NONE;
  g_blocked = 0;
  g_release = 0;
  g_on_activate = NULL;
}

/* A second thread's call: an operation on c (kind 0; kind 2 at 128 active rows) or
 * tpf_comm_sync(c) (kind 1). */
typedef struct {
  tpf_comm *c;
  int kind;
  tpf_status st;
  char msg[400];
  int done; /* under g_mu */
} call_job;

static void *call_thread(void *arg) {
  call_job *j = arg;
  static float big_d[128 * N]; /* kind 2: an operation at 128 active rows */
  tpf_matrix w = {g_w, N, H, H, TPF_FP32}, d = {big_d, 128, N, N, TPF_FP32};
  tpf_status st = j->kind == 0   ? ag(j->c)
                  : j->kind == 1 ? tpf_comm_sync(j->c)
                                 : tpf_ag_gemm(j->c, &w, &d, NULL);
  pthread_mutex_lock(&g_mu);
  j->st = st;
  snprintf(j->msg, sizeof j->msg, "%s", tpf_last_error());
  j->done = 1;
  pthread_cond_broadcast(&g_cv);
  pthread_mutex_unlock(&g_mu);
  return NULL;
}

/* Starts j and returns once it waits inside the blocked entry, or has returned. */
static void start_call(call_job *j, pthread_t *t) {
  j->done = 0;
  assert_int_equal(pthread_create(t, NULL, call_thread, j), 0);
  pthread_mutex_lock(&g_mu);
  while (g_blocked == 0 && !j->done)
    pthread_cond_wait(&g_cv, &g_mu);
  pthread_mutex_unlock(&g_mu);
}

static void finish_call(pthread_t t) {
  pthread_mutex_lock(&g_mu);
  g_release = 1;
  pthread_cond_broadcast(&g_cv);
  pthread_mutex_unlock(&g_mu);
  assert_int_equal(pthread_join(t, NULL), 0);
}

/* The core's refusal: TPF_ESTATE naming the rule (not the backend's guard) and the call. */
static void expect_core_rule(tpf_status st, const char *msg, const char *call) {
  if (st != TPF_ESTATE || !strstr(msg, "one thread per rank at a time") || !strstr(msg, call) ||
      strstr(msg, "guarded mock"))
    fail_msg("%s while another thread is inside a call of the rank: %s (%s), expected the core's "
             "TPF_ESTATE naming the rule and the call",
             call, tpf_status_name(st), msg);
}

/* Item 8 of issue 41 (mock): thread 2 inside tpf_comm_sync(a); this thread's operation on b is
 * refused by the core, and b is not failed and keeps its sequence number (it used to reach the
 * backend's guard after the core had counted it, and b was failed). */
static void test_one_thread__operation_refused_changes_nothing(void **state) {
  (void)state;
  tpf_backend_ops ops;
  tpf_mock_backend be;
  guarded_backend(&ops, &be);
  tpf_comm_config ca = tpf_test_config("fc1_fprop", TPF_ALGO_RING, TPF_COLL_AG, TPF_FP32, T, H);
  tpf_comm_config cb = tpf_test_config("qkv_fprop", TPF_ALGO_RING, TPF_COLL_AG, TPF_FP32, T, H);
  tpf_comm *a = NULL, *b = NULL;
  TPF_ASSERT_OK(tpf_comm_create(&be.hdr, &ca, &a));
  TPF_ASSERT_OK(tpf_comm_create(&be.hdr, &cb, &b));
  g_block = BLOCK_SYNC;
  call_job j = {a, 1, TPF_EINVAL, "", 0};
  pthread_t t;
  start_call(&j, &t);
  assert_false(j.done); /* inside sync */
  const uint64_t seq = b->seq, epoch = b->epoch;
  tpf_status st = ag(b);
  expect_core_rule(st, tpf_last_error(), "'qkv_fprop'");
  assert_int_equal(b->seq, seq);
  assert_int_equal(b->failed, TPF_OK);
  st = tpf_comm_set_active_shape(b, (tpf_shape){8, H});
  expect_core_rule(st, tpf_last_error(), "set_active_shape");
  assert_int_equal(b->epoch, epoch);
  st = tpf_comm_sync(b);
  expect_core_rule(st, tpf_last_error(), "tpf_comm_sync");
  assert_int_equal(be.executions, 0);
  finish_call(t);
  TPF_ASSERT_OK(j.st);
  TPF_ASSERT_OK(ag(b)); /* usable: it was refused, not failed */
  assert_int_equal(b->seq, seq + 1);
  TPF_ASSERT_OK(tpf_comm_destroy(b));
  TPF_ASSERT_OK(tpf_comm_destroy(a));
  assert_int_equal(be.reg_live, 0);
}

/* Item 7: thread 2 inside an operation on a; tpf_comm_destroy(b) and tpf_manager_destroy are
 * refused and change nothing (the destroy used to free b and leak its registration; the
 * manager's destroyed the communicators after the busy one and freed the manager). */
static void test_one_thread__destroy_refused_changes_nothing(void **state) {
  (void)state;
  tpf_backend_ops ops;
  tpf_mock_backend be;
  guarded_backend(&ops, &be);
  tpf_comm_config ca = tpf_test_config("fc1_fprop", TPF_ALGO_RING, TPF_COLL_AG, TPF_FP32, T, H);
  tpf_comm_config cb = tpf_test_config("qkv_fprop", TPF_ALGO_RING, TPF_COLL_AG, TPF_FP32, T, H);
  tpf_comm *a = NULL, *b = NULL;
  TPF_ASSERT_OK(tpf_comm_create(&be.hdr, &ca, &a));
  TPF_ASSERT_OK(tpf_comm_create(&be.hdr, &cb, &b));
  tpf_manager *m = NULL;
  TPF_ASSERT_OK(tpf_manager_create(&be.hdr, &m));
  const char *names[3] = {"proj_fprop", "fc2_fprop", "proj_dgrad"};
  tpf_comm *mc[3];
  for (int i = 0; i < 3; i++) {
    tpf_comm_config c = tpf_test_config(names[i], TPF_ALGO_RING, TPF_COLL_AG, TPF_FP32, T, H);
    TPF_ASSERT_OK(tpf_manager_add(m, &c, &mc[i]));
  }
  assert_int_equal(be.reg_live, 5);
  g_block = BLOCK_EXECUTE;
  call_job j = {a, 0, TPF_EINVAL, "", 0};
  pthread_t t;
  start_call(&j, &t);
  assert_false(j.done); /* inside the operation */
  tpf_status st = tpf_comm_destroy(b);
  expect_core_rule(st, tpf_last_error(), "tpf_comm_destroy");
  assert_int_equal(tpf_comm_capacity_shape(b).rows, T); /* b is alive */
  assert_int_equal(be.reg_live, 5);
  st = tpf_manager_destroy(m);
  expect_core_rule(st, tpf_last_error(), "tpf_manager_destroy");
  assert_int_equal(tpf_manager_count(m), 3);
  for (int i = 0; i < 3; i++)
    assert_int_equal(tpf_comm_capacity_shape(mc[i]).rows, T);
  assert_int_equal(be.reg_live, 5);
  /* The same with thread 2 inside an operation on a communicator of the manager. */
  finish_call(t);
  TPF_ASSERT_OK(j.st);
  g_release = 0;
  call_job k = {mc[1], 0, TPF_EINVAL, "", 0};
  start_call(&k, &t);
  assert_false(k.done);
  st = tpf_manager_destroy(m);
  expect_core_rule(st, tpf_last_error(), "tpf_manager_destroy");
  assert_int_equal(tpf_manager_count(m), 3);
  st = tpf_manager_set_active_shape(m, (tpf_shape){8, H});
  expect_core_rule(st, tpf_last_error(), "tpf_manager_set_active_shape");
  for (int i = 0; i < 3; i++)
    assert_int_equal(tpf_comm_active_shape(mc[i]).rows, T);
  assert_int_equal(be.reg_live, 5);
  finish_call(t);
  TPF_ASSERT_OK(k.st);
  TPF_ASSERT_OK(tpf_comm_destroy(b));
  TPF_ASSERT_OK(tpf_manager_destroy(m));
  TPF_ASSERT_OK(tpf_comm_destroy(a));
  assert_int_equal(be.reg_live, 0);
}

/* Item 6: another thread's operation on a communicator of the manager starts while
 * tpf_manager_set_active_shape applies the shape (right after the first communicator's
 * activation). The call is all or nothing: it used to leave rows 64 128 128 128 (the backend's
 * guard refused the second activation, and the rollback's). */
static tpf_manager *g_m;
static call_job g_mid;
static pthread_t g_mid_thread;
static void start_mid_operation(void) {
  start_call(&g_mid, &g_mid_thread);
}

static void test_one_thread__manager_shape_all_or_nothing(void **state) {
  (void)state;
  enum { CAP = 128, ROWS = 64 };
  tpf_backend_ops ops;
  tpf_mock_backend be;
  guarded_backend(&ops, &be);
  TPF_ASSERT_OK(tpf_manager_create(&be.hdr, &g_m));
  const char *names[4] = {"qkv_fprop", "proj_fprop", "fc1_fprop", "fc2_fprop"};
  tpf_comm *mc[4];
  for (int i = 0; i < 4; i++) {
    tpf_comm_config c = tpf_test_config(names[i], TPF_ALGO_BULK, TPF_COLL_AG, TPF_FP32, CAP, H);
    TPF_ASSERT_OK(tpf_manager_add(g_m, &c, &mc[i]));
  }
  tpf_comm_config cr = tpf_test_config("ring_ag", TPF_ALGO_RING, TPF_COLL_AG, TPF_FP32, CAP, H);
  TPF_ASSERT_OK(tpf_manager_add(g_m, &cr, NULL));
  tpf_comm *ring = NULL;
  TPF_ASSERT_OK(tpf_manager_get(g_m, "ring_ag", &ring));
  g_block = BLOCK_EXECUTE;
  memset(&g_mid, 0, sizeof g_mid);
  g_mid.c = ring;
  g_mid.kind = 2;
  g_on_activate = start_mid_operation;
  const tpf_status st = tpf_manager_set_active_shape(g_m, (tpf_shape){ROWS, H});
  char msg[400];
  snprintf(msg, sizeof msg, "%s", tpf_last_error());
  assert_null(g_on_activate); /* the operation was started mid-way */
  finish_call(g_mid_thread);
  uint64_t rows[4];
  for (int i = 0; i < 4; i++)
    rows[i] = tpf_comm_active_shape(mc[i]).rows;
  print_message("manager shape change with an operation started mid-way: %s (%s); rows %llu %llu "
                "%llu %llu; the operation: %s (%s)\n",
                tpf_status_name(st), msg, (unsigned long long)rows[0], (unsigned long long)rows[1],
                (unsigned long long)rows[2], (unsigned long long)rows[3], tpf_status_name(g_mid.st),
                g_mid.msg);
  const uint64_t want = st == TPF_OK ? ROWS : CAP;
  for (int i = 0; i < 4; i++)
    if (rows[i] != want)
      fail_msg("half-applied: %s, rows %llu %llu %llu %llu", tpf_status_name(st),
               (unsigned long long)rows[0], (unsigned long long)rows[1],
               (unsigned long long)rows[2], (unsigned long long)rows[3]);
  /* Holding the rank, the manager is not refused half-way: it succeeds, and the operation that
   * tried to start meanwhile is the refused one, naming the rule. */
  TPF_ASSERT_OK(st);
  expect_core_rule(g_mid.st, g_mid.msg, "one thread per rank");
  TPF_ASSERT_OK(tpf_manager_destroy(g_m));
  assert_int_equal(be.reg_live, 0);
}

/* Item 8 on the simulator, P = 2: rank 0's second thread creates a communicator (it waits in the
 * creation's exchange for rank 1) while rank 0's own thread runs an operation on another one.
 * The operation is refused by the core and changes nothing, so once the creation is done rank 0
 * runs it again and it pairs with rank 1's (it used to be refused by the simulator's rank guard
 * after the core had counted it: failed on rank 0, and rank 1 waited out its timeout). */
typedef struct {
  tpf_backend *be;
  tpf_comm *z;
  tpf_status st;
} create_job;

static void *create_thread(void *arg) {
  create_job *j = arg;
  tpf_comm_config cz = tpf_test_config("late_site", TPF_ALGO_RING, TPF_COLL_AG, TPF_FP32, T, H);
  do /* a refusal by the thread rule changed nothing: call again */
    j->st = tpf_comm_create(j->be, &cz, &j->z);
  while (j->st == TPF_ESTATE && strstr(tpf_last_error(), "one thread per rank"));
  return NULL;
}

typedef struct {
  atomic_int go; /* rank 0 lets rank 1 create late_site */
  tpf_status refused, again[2], created[2];
  char refused_msg[400], again_msg[2][400];
  uint64_t seq_after_refusal;
  int failed_after_refusal;
  float w[2][N * H], d[2][T * N];
} sim_state;

static tpf_status sim_rank_fn(tpf_backend *be, int r, void *arg) {
  sim_state *s = arg;
  tpf_comm_config cp = tpf_test_config("probe", TPF_ALGO_RING, TPF_COLL_AG, TPF_FP32, T, H);
  tpf_comm_config cy = tpf_test_config("fc1_fprop", TPF_ALGO_RING, TPF_COLL_AG, TPF_FP32, T, H);
  tpf_comm *probe = NULL, *y = NULL;
  TPF_CHECK(tpf_comm_create(be, &cp, &probe));
  TPF_CHECK(tpf_comm_create(be, &cy, &y));
  for (int i = 0; i < N * H; i++)
    s->w[r][i] = (float)(i % 3);
  tpf_matrix w = {s->w[r], N, H, H, TPF_FP32}, d = {s->d[r], T, N, N, TPF_FP32};
  tpf_comm *z = NULL;
  if (r == 0) {
    create_job j = {be, NULL, TPF_EINVAL};
    pthread_t t;
    if (pthread_create(&t, NULL, create_thread, &j) != 0)
      return tpf_set_error(TPF_EBACKEND, "pthread_create");
    /* Until the creating thread is inside the rank: a sync on the probe is refused. */
    for (int i = 0; i < 200000 && tpf_comm_sync(probe) != TPF_ESTATE; i++)
      sched_yield();
    const uint64_t seq = y->seq;
    s->refused = tpf_ag_gemm(y, &w, &d, NULL);
    snprintf(s->refused_msg, sizeof s->refused_msg, "%s", tpf_last_error());
    s->seq_after_refusal = y->seq - seq;
    s->failed_after_refusal = y->failed != TPF_OK;
    atomic_store(&s->go, 1);
    pthread_join(t, NULL);
    s->created[r] = j.st;
    z = j.z;
  } else {
    while (!atomic_load(&s->go))
      sched_yield();
    tpf_comm_config cz = tpf_test_config("late_site", TPF_ALGO_RING, TPF_COLL_AG, TPF_FP32, T, H);
    s->created[r] = tpf_comm_create(be, &cz, &z);
  }
  s->again[r] = tpf_ag_gemm(y, &w, &d, NULL);
  snprintf(s->again_msg[r], sizeof s->again_msg[r], "%s", tpf_last_error());
  if (z) (void)tpf_comm_destroy(z);
  (void)tpf_comm_destroy(y);
  (void)tpf_comm_destroy(probe);
  return TPF_OK;
}

static void test_one_thread__simulator_peer_stays_paired(void **state) {
  (void)state;
  tpf_sim_config sc = TPF_SIM_CONFIG_INIT;
  sc.tp_size = 2;
  sc.timeout_ms = 3000;
  tpf_sim_world *w = NULL;
  TPF_ASSERT_OK(tpf_sim_world_create(&sc, &w));
  static sim_state s;
  memset(&s, 0, sizeof s);
  atomic_init(&s.go, 0);
  TPF_ASSERT_OK(tpf_sim_run(w, sim_rank_fn, &s));
  print_message("rank 0's operation during the creation: %s (%s)\n", tpf_status_name(s.refused),
                s.refused_msg);
  for (int r = 1; r >= 0; r--) { /* the peer first: it used to wait out its timeout */
    TPF_ASSERT_OK(s.created[r]);
    if (s.again[r] != TPF_OK)
      fail_msg("rank %d: the operation after the refusal: %s (%s)", r, tpf_status_name(s.again[r]),
               s.again_msg[r]);
  }
  assert_int_equal(s.seq_after_refusal, 0);
  assert_int_equal(s.failed_after_refusal, 0);
  expect_core_rule(s.refused, s.refused_msg, "'fc1_fprop'");
  TPF_ASSERT_OK(tpf_sim_world_destroy(w));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_one_thread__second_thread_refused),
      cmocka_unit_test(test_one_thread__second_communicator_of_the_rank_refused),
      cmocka_unit_test(test_one_thread__operation_refused_changes_nothing),
      cmocka_unit_test(test_one_thread__destroy_refused_changes_nothing),
      cmocka_unit_test(test_one_thread__manager_shape_all_or_nothing),
      cmocka_unit_test(test_one_thread__simulator_peer_stays_paired),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
