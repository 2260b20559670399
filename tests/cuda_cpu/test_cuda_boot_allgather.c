/* The CUDA backend's allgather op over its bootstrap (backend_cuda/cuda_bootstrap.c,
 * tpf_cuda__boot_allgather: the configuration exchange of tpf_comm_create), with ranks as
 * threads and no GPU: the threads bootstrap gathers in rank order; an absent rank is
 * TPF_ETIMEOUT after the backend's bound, not the bootstrap's own 120 s; a caller's bootstrap is
 * used as is, and ranks contributing different sizes fail with TPF_EMISMATCH on every rank
 * before the data exchange. */
#define _POSIX_C_SOURCE 200809L
#include "cuda_internal.h"
#include "cuda_param.h"
#include "tpf_test.h"

#include <pthread.h>
#include <time.h>

enum { MAXP = 4, REC = 40 };

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* ---- a caller's bootstrap: a pthread barrier and a shared buffer ---- */

typedef struct {
  pthread_barrier_t bar;
  unsigned char buf[MAXP][64];
  int calls; /* allgather calls of rank 0 */
} user_group;

typedef struct {
  user_group *g;
  int rank, P;
} user_ctx;

static tpf_status user_allgather(void *c, const void *send, void *recv, size_t bytes) {
  user_ctx *x = c;
  if (bytes > sizeof x->g->buf[0]) return tpf_set_error(TPF_EINVAL, "user allgather: too big");
  if (x->rank == 0) x->g->calls++;
  pthread_barrier_wait(&x->g->bar);
  memcpy(x->g->buf[x->rank], send, bytes);
  pthread_barrier_wait(&x->g->bar);
  for (int q = 0; q < x->P; q++)
    memcpy((unsigned char *)recv + (size_t)q * bytes, x->g->buf[q], bytes);
  pthread_barrier_wait(&x->g->bar);
  return TPF_OK;
}

static tpf_status user_barrier(void *c) {
  pthread_barrier_wait(&((user_ctx *)c)->g->bar);
  return TPF_OK;
}

/* ---- one rank's call ---- */

typedef struct {
  tpf_bootstrap boot;
  size_t bytes;   /* what this rank contributes */
  uint64_t ms;    /* the bound */
  bool absent;    /* never calls */
  tpf_status st;  /* result */
  double seconds; /* time the call took */
  char msg[256];  /* tpf_last_error() on failure */
  unsigned char all[MAXP * REC];
} rank_job;

static void *rank_main(void *p) {
  rank_job *j = p;
  if (j->absent) return NULL;
  unsigned char mine[REC];
  for (int i = 0; i < REC; i++)
    mine[i] = (unsigned char)(j->boot.rank * 16 + i);
  const double t0 = now_s();
  j->st = tpf_cuda__boot_allgather(&j->boot, mine, j->all, j->bytes, j->ms);
  j->seconds = now_s() - t0;
  snprintf(j->msg, sizeof j->msg, "%s", j->st == TPF_OK ? "" : tpf_last_error());
  return NULL;
}

static void run_ranks(rank_job *jobs, int P) {
  pthread_t th[MAXP];
  for (int r = 0; r < P; r++)
    assert_int_equal(pthread_create(&th[r], NULL, rank_main, &jobs[r]), 0);
  for (int r = 0; r < P; r++)
    pthread_join(th[r], NULL);
}

static void threads_jobs(tpf_cuda_threads *g, int P, rank_job *jobs, uint64_t ms) {
  memset(jobs, 0, sizeof(rank_job) * (size_t)P);
  for (int r = 0; r < P; r++) {
    TPF_ASSERT_OK(tpf_cuda_threads_bootstrap(g, r, 0, &jobs[r].boot));
    jobs[r].bytes = REC;
    jobs[r].ms = ms;
  }
}

static void test_cuda_boot_allgather__threads_gather_in_rank_order(void **state) {
  (void)state;
  unsetenv("TPF_CUDA_BOOT_TIMEOUT_MS");
  tpf_cuda__param_reload(-1); /* the registry reads the environment once */
  enum { P = 3 };
  tpf_cuda_threads *g = NULL;
  TPF_ASSERT_OK(tpf_cuda_threads_create(P, &g));
  rank_job jobs[P];
  threads_jobs(g, P, jobs, 2000);
  run_ranks(jobs, P);
  for (int r = 0; r < P; r++) {
    if (jobs[r].st != TPF_OK) fail_msg("rank %d: %s", r, jobs[r].msg);
    for (int q = 0; q < P; q++)
      for (int i = 0; i < REC; i++)
        assert_int_equal(jobs[r].all[q * REC + i], (unsigned char)(q * 16 + i));
  }
  /* Twice in a row (creation of a second communicator): the group stays in step. */
  threads_jobs(g, P, jobs, 2000);
  run_ranks(jobs, P);
  for (int r = 0; r < P; r++)
    if (jobs[r].st != TPF_OK) fail_msg("rank %d, second exchange: %s", r, jobs[r].msg);
  TPF_ASSERT_OK(tpf_cuda_threads_destroy(g));
}

static void test_cuda_boot_allgather__absent_rank_times_out_at_the_backend_bound(void **state) {
  (void)state;
  unsetenv("TPF_CUDA_BOOT_TIMEOUT_MS"); /* the bootstrap's own bound: 120 s */
  tpf_cuda__param_reload(-1);
  enum { P = 2 };
  tpf_cuda_threads *g = NULL;
  TPF_ASSERT_OK(tpf_cuda_threads_create(P, &g));
  rank_job jobs[P];
  threads_jobs(g, P, jobs, 150);
  jobs[1].absent = true;
  run_ranks(jobs, P);
  if (jobs[0].st != TPF_ETIMEOUT)
    fail_msg("rank 0 without rank 1: %s (%s)", tpf_status_name(jobs[0].st), jobs[0].msg);
  assert_non_null(strstr(jobs[0].msg, "150 ms"));
  assert_true(jobs[0].seconds < 5.0);
  print_message("absent rank: %s after %.0f ms\n", jobs[0].msg, jobs[0].seconds * 1000);
  TPF_ASSERT_OK(tpf_cuda_threads_destroy(g));
}

static void user_jobs(user_group *ug, int P, rank_job *jobs, user_ctx *ctx) {
  memset(jobs, 0, sizeof(rank_job) * (size_t)P);
  for (int r = 0; r < P; r++) {
    ctx[r].g = ug;
    ctx[r].rank = r;
    ctx[r].P = P;
    jobs[r].boot.tp_size = P;
    jobs[r].boot.rank = r;
    jobs[r].boot.allgather = user_allgather;
    jobs[r].boot.barrier = user_barrier;
    jobs[r].boot.ctx = &ctx[r];
    jobs[r].bytes = REC;
    jobs[r].ms = 1000;
  }
}

static void test_cuda_boot_allgather__callers_bootstrap_sizes_checked_first(void **state) {
  (void)state;
  enum { P = 2 };
  user_group ug;
  memset(&ug, 0, sizeof ug);
  pthread_barrier_init(&ug.bar, NULL, P);
  user_ctx ctx[P];
  rank_job jobs[P];
  /* Agreement: the sizes, then the data, through the caller's callbacks. */
  user_jobs(&ug, P, jobs, ctx);
  run_ranks(jobs, P);
  for (int r = 0; r < P; r++) {
    if (jobs[r].st != TPF_OK) fail_msg("rank %d: %s", r, jobs[r].msg);
    for (int q = 0; q < P; q++)
      assert_int_equal(jobs[r].all[q * REC + 5], (unsigned char)(q * 16 + 5));
  }
  assert_int_equal(ug.calls, 2);
  /* Different sizes (different tpflex versions): every rank fails naming both, and the unequal
   * data exchange never happens. */
  ug.calls = 0;
  user_jobs(&ug, P, jobs, ctx);
  jobs[1].bytes = REC - 8;
  run_ranks(jobs, P);
  for (int r = 0; r < P; r++) {
    if (jobs[r].st != TPF_EMISMATCH)
      fail_msg("rank %d, sizes differ: %s (%s)", r, tpf_status_name(jobs[r].st), jobs[r].msg);
    assert_non_null(strstr(jobs[r].msg, "40"));
    assert_non_null(strstr(jobs[r].msg, "32"));
  }
  assert_int_equal(ug.calls, 1);
  print_message("sizes differ: %s\n", jobs[0].msg);
  pthread_barrier_destroy(&ug.bar);
}

static void test_cuda_boot_allgather__bad_arguments(void **state) {
  (void)state;
  tpf_cuda_threads *g = NULL;
  TPF_ASSERT_OK(tpf_cuda_threads_create(1, &g));
  tpf_bootstrap boot;
  TPF_ASSERT_OK(tpf_cuda_threads_bootstrap(g, 0, 0, &boot));
  unsigned char in[4] = {1, 2, 3, 4}, out[4] = {0};
  TPF_ASSERT_STATUS(tpf_cuda__boot_allgather(&boot, in, out, 0, 100), TPF_EINVAL);
  TPF_ASSERT_STATUS(tpf_cuda__boot_allgather(&boot, NULL, out, 4, 100), TPF_EINVAL);
  TPF_ASSERT_STATUS(tpf_cuda__boot_allgather(NULL, in, out, 4, 100), TPF_EINVAL);
  /* P = 1: the exchange is a copy. */
  TPF_ASSERT_OK(tpf_cuda__boot_allgather(&boot, in, out, 4, 100));
  assert_memory_equal(in, out, 4);
  TPF_ASSERT_OK(tpf_cuda_threads_destroy(g));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cuda_boot_allgather__threads_gather_in_rank_order),
      cmocka_unit_test(test_cuda_boot_allgather__absent_rank_times_out_at_the_backend_bound),
      cmocka_unit_test(test_cuda_boot_allgather__callers_bootstrap_sizes_checked_first),
      cmocka_unit_test(test_cuda_boot_allgather__bad_arguments),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
