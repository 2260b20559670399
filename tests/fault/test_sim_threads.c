/* One thread per rank, and bounded waits, on the simulator.
 *
 * A rank's calls are not thread-safe (tpflex.h): one thread at a time issues them. The simulator
 * used to have one job slot per rank and a wait with no deadline: a second operation submitted for
 * the rank while one ran overwrote the slot, and both callers waited forever. Now every
 * rank-thread entry of the backend claims the rank, the slot refuses a second job, and the
 * second caller gets TPF_ESTATE naming the rule, while the first operation completes.
 *
 * Method: the second caller is made to overlap deterministically: it is the trace callback of
 * rank 0's first finished step, which runs on one of rank 0's stream workers while rank 0's own
 * thread is inside the operation (the callback returns before the operation can finish). On the
 * old code that call never returned; a watchdog (alarm) turns such a hang into a failure.
 *
 * Also: a wait in progress ends at a bound lowered while it waits (tpf_sim_set_timeout), and the
 * fault timeout (tpf_sim_set_fault_timeout) bounds the waits a lost signal makes expire, while
 * the world's generous timeout stays in force for everything else. */
#define _POSIX_C_SOURCE 200809L
#include "tpf_test.h"

#include "tpflex/tpflex_sim.h"

#include <signal.h>
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>

enum { P = 2, T = 4, H = 16, N = 8, WATCHDOG_S = 120 };
#define GENEROUS_MS 60000u
#define SHORT_MS 150u

static void watchdog(int sig) {
  (void)sig;
  static const char msg[] = "test_sim_threads: watchdog: a call did not return (hang)\n";
  ssize_t n = write(2, msg, sizeof msg - 1);
  (void)n;
  _exit(1);
}

static bool has(const char *s, const char *needle) {
  return strstr(s, needle) != NULL;
}

static tpf_sim_world *world(unsigned timeout_ms) {
  tpf_sim_config cfg = TPF_SIM_CONFIG_INIT;
  cfg.tp_size = P;
  cfg.seed = 7;
  cfg.timeout_ms = timeout_ms;
  cfg.arena_bytes = 4u << 20;
  tpf_sim_world *w = NULL;
  TPF_ASSERT_OK(tpf_sim_world_create(&cfg, &w));
  return w;
}

typedef struct {
  tpf_sim_world *w;
  tpf_backend *be[P];
  tpf_comm *one[P], *two[P];
  float wt[P][N * H], d[P][T * N], d2[T * N];
  /* What the intruding calls on rank 0's worker got. */
  atomic_int fired;
  tpf_status op_st, create_st;
  char op_msg[512], create_msg[512];
  tpf_status first[P], second[P];
  char first_msg[P][512];
  bool first_right[P], second_right[P];
} thr_ctx;

static tpf_status make(tpf_backend *be, const char *name, tpf_comm **out) {
  tpf_comm_config cfg =
      tpf_test_config(name, TPF_ALGO_RING, TPF_COLL_AG, TPF_FP32, 2u * T, (uint64_t)H);
  TPF_CHECK(tpf_comm_create(be, &cfg, out));
  tpf_shape s = {T, H};
  return tpf_comm_set_active_shape(*out, s);
}

/* Rank r's shard is all (r + 1), W all ones: D(i, n) = H * (owner of row i + 1). */
static tpf_status run_ag(thr_ctx *x, tpf_comm *c, int rank, bool *right) {
  tpf_matrix loc;
  TPF_CHECK(tpf_comm_local_chunk(c, &loc));
  for (uint64_t i = 0; i < loc.rows; i++)
    for (uint64_t j = 0; j < loc.cols; j++)
      ((float *)loc.ptr)[i * loc.ld + j] = (float)(rank + 1);
  for (int i = 0; i < N * H; i++)
    x->wt[rank][i] = 1.0f;
  memset(x->d[rank], 0, sizeof x->d[rank]);
  tpf_matrix wm = {x->wt[rank], N, H, H, TPF_FP32}, dm = {x->d[rank], T, N, N, TPF_FP32};
  tpf_status st = tpf_ag_gemm(c, &wm, &dm, NULL);
  *right = true;
  for (int i = 0; i < T && st == TPF_OK; i++)
    for (int n = 0; n < N; n++)
      *right = *right && x->d[rank][i * N + n] == (float)(H * (i / (T / P) + 1));
  return st;
}

/* The intruder: rank 0's first finished step of 't.one', on a worker of rank 0, while rank 0's
 * thread waits inside tpf_ag_gemm. */
static void intrude(void *ctx, const tpf_sim_trace_event *ev) {
  thr_ctx *x = ctx;
  if (ev->rank != 0 || strcmp(ev->comm, "t.one") != 0 || atomic_exchange(&x->fired, 1)) return;
  float w[N * H];
  for (int i = 0; i < N * H; i++)
    w[i] = 1.0f;
  tpf_matrix wm = {w, N, H, H, TPF_FP32}, dm = {x->d2, T, N, N, TPF_FP32};
  x->op_st = tpf_ag_gemm(x->two[0], &wm, &dm, NULL);
  snprintf(x->op_msg, sizeof x->op_msg, "%s", tpf_last_error());
  /* A creation (the configuration exchange, then the registration) is refused the same way. */
  tpf_comm_config cfg = tpf_test_config("t.three", TPF_ALGO_RING, TPF_COLL_AG, TPF_FP32, 2u * T, H);
  tpf_comm *c3 = NULL;
  x->create_st = tpf_comm_create(x->be[0], &cfg, &c3);
  snprintf(x->create_msg, sizeof x->create_msg, "%s", tpf_last_error());
}

static tpf_status rank_two_ops(tpf_backend *be, int rank, void *arg) {
  thr_ctx *x = arg;
  x->be[rank] = be;
  TPF_CHECK(make(be, "t.one", &x->one[rank]));
  TPF_CHECK(make(be, "t.two", &x->two[rank]));
  x->first[rank] = run_ag(x, x->one[rank], rank, &x->first_right[rank]);
  snprintf(x->first_msg[rank], sizeof x->first_msg[rank], "%s", tpf_last_error());
  /* The rank keeps working afterwards. */
  x->second[rank] = run_ag(x, x->one[rank], rank, &x->second_right[rank]);
  return TPF_OK;
}

static void test_threads__second_operation_is_refused(void **state) {
  (void)state;
  thr_ctx *x = calloc(1, sizeof *x);
  assert_non_null(x);
  x->w = world(GENEROUS_MS);
  TPF_ASSERT_OK(tpf_sim_set_trace(x->w, intrude, x));
  TPF_ASSERT_OK(tpf_sim_run(x->w, rank_two_ops, x));
  TPF_ASSERT_OK(tpf_sim_set_trace(x->w, NULL, NULL));
  assert_int_equal(atomic_load(&x->fired), 1);
  TPF_ASSERT_STATUS(x->op_st, TPF_ESTATE);
  if (!has(x->op_msg, "one thread per rank at a time")) fail_msg("op refusal: '%s'", x->op_msg);
  TPF_ASSERT_STATUS(x->create_st, TPF_ESTATE);
  if (!has(x->create_msg, "one thread per rank at a time"))
    fail_msg("create refusal: '%s'", x->create_msg);
  for (int r = 0; r < P; r++) {
    TPF_ASSERT_STATUS(x->first[r], TPF_OK);
    assert_true(x->first_right[r]);
    TPF_ASSERT_STATUS(x->second[r], TPF_OK);
    assert_true(x->second_right[r]);
  }
  for (int r = 0; r < P; r++) {
    tpf_comm_destroy(x->one[r]);
    tpf_comm_destroy(x->two[r]);
  }
  tpf_sim_fault_report rep;
  TPF_ASSERT_OK(tpf_sim_get_fault_report(x->w, &rep));
  assert_int_equal(rep.live_registrations, 0);
  TPF_ASSERT_OK(tpf_sim_world_destroy(x->w));
  free(x);
}

/* A wait in progress ends at a bound lowered while it waits: rank 1 leaves without the
 * operation and lowers the world's timeout; rank 0's handshake, begun under the generous bound,
 * ends at the short one, naming itself, the step and rank 1. (Old code: no such call; the wait
 * kept its deadline.) */
typedef struct {
  tpf_sim_world *w;
  tpf_status st[P];
  char msg[P][512];
  double secs;
} low_ctx;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static tpf_status rank_lowered(tpf_backend *be, int rank, void *arg) {
  low_ctx *x = arg;
  tpf_comm *c = NULL;
  TPF_CHECK(make(be, "t.low", &c));
  if (rank == 1) {
    TPF_CHECK(tpf_sim_set_timeout(x->w, SHORT_MS));
  } else {
    float w[N * H] = {0}, d[T * N];
    tpf_matrix wm = {w, N, H, H, TPF_FP32}, dm = {d, T, N, N, TPF_FP32};
    double t0 = now_s();
    x->st[rank] = tpf_ag_gemm(c, &wm, &dm, NULL);
    x->secs = now_s() - t0;
    snprintf(x->msg[rank], sizeof x->msg[rank], "%s", tpf_last_error());
  }
  return tpf_comm_destroy(c);
}

static void test_threads__lowered_timeout_ends_a_wait_in_progress(void **state) {
  (void)state;
  low_ctx x;
  memset(&x, 0, sizeof x);
  x.w = world(GENEROUS_MS);
  TPF_ASSERT_OK(tpf_sim_run(x.w, rank_lowered, &x));
  TPF_ASSERT_STATUS(x.st[0], TPF_ETIMEOUT);
  if (!has(x.msg[0], "timeout after 150 ms: rank 0, step 0 (HANDSHAKE) of 't.low' operation 1 "
                     "waits for rank 1"))
    fail_msg("'%s'", x.msg[0]);
  /* It waited at least the short bound; it did not wait out the generous one. */
  assert_true(x.secs >= SHORT_MS / 1000.0 && x.secs < GENEROUS_MS / 2000.0);
  TPF_ASSERT_OK(tpf_sim_world_destroy(x.w));
}

/* The fault timeout: rank 0's first signal is lost; rank 1's RECV waits for it under the fault
 * timeout, not the world's generous one. A fault that loses nothing (a delayed signal) leaves the
 * generous bound in force: that case completes. */
typedef struct {
  tpf_status st[P];
  char msg[P][512];
  bool right[P];
  float wt[P][N * H], d[P][T * N];
} ft_ctx;

static tpf_status rank_one_op(tpf_backend *be, int rank, void *arg) {
  ft_ctx *x = arg;
  tpf_comm *c = NULL;
  TPF_CHECK(make(be, "t.fault", &c));
  tpf_matrix loc;
  TPF_CHECK(tpf_comm_local_chunk(c, &loc));
  for (uint64_t i = 0; i < loc.rows; i++)
    for (uint64_t j = 0; j < loc.cols; j++)
      ((float *)loc.ptr)[i * loc.ld + j] = (float)(rank + 1);
  for (int i = 0; i < N * H; i++)
    x->wt[rank][i] = 1.0f;
  tpf_matrix wm = {x->wt[rank], N, H, H, TPF_FP32}, dm = {x->d[rank], T, N, N, TPF_FP32};
  x->st[rank] = tpf_ag_gemm(c, &wm, &dm, NULL);
  snprintf(x->msg[rank], sizeof x->msg[rank], "%s", tpf_last_error());
  x->right[rank] = true;
  for (int i = 0; i < T && x->st[rank] == TPF_OK; i++)
    for (int n = 0; n < N; n++)
      x->right[rank] = x->right[rank] && x->d[rank][i * N + n] == (float)(H * (i / (T / P) + 1));
  return tpf_comm_destroy(c);
}

static void test_threads__fault_timeout_bounds_only_lossy_faults(void **state) {
  (void)state;
  tpf_sim_world *w = world(GENEROUS_MS);
  TPF_ASSERT_OK(tpf_sim_set_fault_timeout(w, SHORT_MS));
  tpf_sim_fault_ex f;
  memset(&f, 0, sizeof f);
  f.rank_mask = 1u; /* rank 0's signals */
  f.base.drop_signal = 1;
  TPF_ASSERT_OK(tpf_sim_set_fault_ex(w, &f));
  ft_ctx *x = calloc(1, sizeof *x);
  assert_non_null(x);
  double t0 = now_s();
  TPF_ASSERT_OK(tpf_sim_run(w, rank_one_op, x));
  double secs = now_s() - t0;
  TPF_ASSERT_STATUS(x->st[1], TPF_ETIMEOUT);
  if (!has(x->msg[1], "timeout after 150 ms: rank 1, step ") || !has(x->msg[1], "(RECV chunk 0") ||
      !has(x->msg[1], "waits for rank 0"))
    fail_msg("'%s'", x->msg[1]);
  assert_true(secs < GENEROUS_MS / 2000.0);

  /* A delayed signal loses nothing: the generous bound stays, every result is right. */
  memset(&f, 0, sizeof f);
  f.rank_mask = 1u;
  f.delay_signal = 1;
  f.delay_us = 2u * SHORT_MS * 1000u; /* longer than the fault timeout */
  TPF_ASSERT_OK(tpf_sim_set_fault_ex(w, &f));
  memset(x, 0, sizeof *x);
  TPF_ASSERT_OK(tpf_sim_run(w, rank_one_op, x));
  for (int r = 0; r < P; r++) {
    TPF_ASSERT_STATUS(x->st[r], TPF_OK);
    assert_true(x->right[r]);
  }
  free(x);
  TPF_ASSERT_OK(tpf_sim_world_destroy(w));
}

int main(void) {
  signal(SIGALRM, watchdog);
  alarm(WATCHDOG_S);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_threads__second_operation_is_refused),
      cmocka_unit_test(test_threads__lowered_timeout_ends_a_wait_in_progress),
      cmocka_unit_test(test_threads__fault_timeout_bounds_only_lossy_faults),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
