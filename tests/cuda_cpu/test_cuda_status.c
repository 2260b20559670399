/* The CUDA backend's deferred errors belong to the registration whose operation caused them,
 * on the CPU: every registration has its own host-mapped status area, and
 * reading one (tpf_cuda__check_status, reg_async_error: host reads, no CUDA call) never reports
 * another's failure. The old backend had one status area per backend: a failure written by one
 * communicator's kernel was seen by every other communicator's execute, which the core then left
 * failed for good. (The device side is tests/gpu/test_cuda_two_comms.c.)
 *
 * Also the step scratch of execute (tpf_cuda__grow_step_scratch): after an allocation failure
 * part-way, the count it keeps still says what every array holds, so the next call grows them
 * again. (The old ensure_events raised the event count first and returned early on it, and
 * execute then wrote past a scratch array that had never grown.) */
#define _POSIX_C_SOURCE 200809L
#include "tpf_test.h"

#include "cuda_state.h"

static tpf_cuda_backend *fake_backend(void) {
  tpf_cuda_backend *b = calloc(1, sizeof *b);
  assert_non_null(b);
  b->base.tp_size = 1; /* no peer processes to look for (tpf_cuda__blame_gone) */
  b->base.rank = 0;
  b->timeout_ns = 2000000000ull;
  return b;
}

static tpf_reg *fake_reg(const char *name) {
  tpf_reg *r = calloc(1, sizeof *r);
  assert_non_null(r);
  snprintf(r->name, sizeof r->name, "%s", name);
  r->status_host = calloc(1, sizeof *r->status_host); /* stands for the mapped area */
  assert_non_null(r->status_host);
  return r;
}

static void free_reg(tpf_reg *r) {
  free(r->status_host);
  free(r);
}

static void test_status__each_registration_keeps_its_own_failure(void **state) {
  (void)state;
  tpf_cuda_backend *b = fake_backend();
  tpf_reg *one = fake_reg("fc1_fprop"), *two = fake_reg("fc2_fprop");
  tpf_status st = TPF_EINVAL;
  /* Nothing failed: both clean. */
  TPF_ASSERT_OK(tpf_cuda__reg_async_error(&b->base, one, &st));
  TPF_ASSERT_STATUS(st, TPF_OK);
  /* A handshake wait of fc1's operation 3 timed out waiting for rank 1 (what the flag kernel
   * writes into fc1's area). */
  one->status_host->kind = TPF_STEP_HANDSHAKE;
  one->status_host->peer = 1;
  one->status_host->seq = 3;
  one->status_host->code = TPF_CUDA_DEV_TIMEOUT;
  TPF_ASSERT_OK(tpf_cuda__reg_async_error(&b->base, one, &st));
  TPF_ASSERT_STATUS(st, TPF_ETIMEOUT);
  if (!strstr(tpf_last_error(), "'fc1_fprop': rank 0, operation 3: HANDSHAKE waiting for rank 1"))
    fail_msg("fc1's detail: %s", tpf_last_error());
  /* fc2 sees nothing of it: its operations would run, its sync succeed. */
  TPF_ASSERT_OK(tpf_cuda__reg_async_error(&b->base, two, &st));
  TPF_ASSERT_STATUS(st, TPF_OK);
  TPF_ASSERT_OK(tpf_cuda__check_status(b, two));
  /* A mismatch on fc2 is fc2's; fc1 keeps its own timeout. */
  two->status_host->kind = TPF_STEP_HANDSHAKE;
  two->status_host->peer = 1;
  two->status_host->seq = 7;
  two->status_host->mine = TPF_READY_BODY(TPF_READY_WORD(7, 0, 64));
  two->status_host->theirs = TPF_READY_BODY(TPF_READY_WORD(7, 0, 32));
  two->status_host->code = TPF_CUDA_DEV_MISMATCH;
  TPF_ASSERT_STATUS(tpf_cuda__check_status(b, two), TPF_EMISMATCH);
  if (!strstr(tpf_last_error(), "'fc2_fprop': rank 0, operation 7: active rows 64") ||
      !strstr(tpf_last_error(), "but 32"))
    fail_msg("fc2's detail: %s", tpf_last_error());
  TPF_ASSERT_STATUS(tpf_cuda__check_status(b, one), TPF_ETIMEOUT);
  /* A failure already taken into the registration's deferred status is what async_error says. */
  one->status_host->code = TPF_CUDA_DEV_OK;
  one->deferred = TPF_ETIMEOUT;
  TPF_ASSERT_OK(tpf_cuda__reg_async_error(&b->base, one, &st));
  TPF_ASSERT_STATUS(st, TPF_ETIMEOUT);
  two->status_host->code = TPF_CUDA_DEV_OK;
  TPF_ASSERT_OK(tpf_cuda__reg_async_error(&b->base, two, &st));
  TPF_ASSERT_STATUS(st, TPF_OK);
  free_reg(one);
  free_reg(two);
  free(b);
}

static void test_status__scratch_count_is_true_after_a_failed_growth(void **state) {
  (void)state;
  tpf_cuda_backend *b = fake_backend();
  TPF_ASSERT_OK(tpf_cuda__grow_step_scratch(b, 10));
  assert_int_equal(b->nneed_ev, 32);
  /* Each of the five arrays' allocation fails in turn: the count stays 32. */
  for (long k = 0; k < 5; k++) {
    tpf__alloc_set_budget(k);
    TPF_ASSERT_STATUS(tpf_cuda__grow_step_scratch(b, 100), TPF_ENOMEM);
    tpf__alloc_set_budget(-1);
    assert_int_equal(b->nneed_ev, 32);
    /* A schedule that fits the count still needs no growth. */
    TPF_ASSERT_OK(tpf_cuda__grow_step_scratch(b, 32));
  }
  /* Then the growth succeeds and every array holds the new count (ASan builds check the
   * writes). */
  TPF_ASSERT_OK(tpf_cuda__grow_step_scratch(b, 100));
  assert_int_equal(b->nneed_ev, 128);
  memset(b->need_ev, 1, 128);
  memset(b->step_state, 1, 128);
  memset(b->step_virt, 1, 128);
  memset(b->step_prev, 1, 128 * sizeof *b->step_prev);
  memset(b->step_pev, 1, 128 * sizeof *b->step_pev);
  tpf__free(b->need_ev);
  tpf__free(b->step_state);
  tpf__free(b->step_virt);
  tpf__free(b->step_prev);
  tpf__free(b->step_pev);
  free(b);
}

/* One thread per rank (the CUDA backend's own defense): while one thread is
 * inside a rank-thread entry of the ops table, every other such entry is TPF_ESTATE naming the
 * rule and touches nothing (here: NULL arguments, which the entries would dereference), and the
 * rank stays claimed by the first. reg_async_error and reg_abort stay callable. */
static void test_status__second_thread_is_refused(void **state) {
  (void)state;
  tpf_cuda_backend *b = fake_backend();
  b->base.ops = &tpf_cuda__ops;
  atomic_store(&b->busy, "execute"); /* another thread is inside execute */
  tpf_backend *be = &b->base;
  const tpf_backend_ops *o = &tpf_cuda__ops;
  TPF_ASSERT_STATUS(o->execute(be, NULL, NULL, NULL), TPF_ESTATE);
  if (!strstr(tpf_last_error(), "CUDA backend rank 0: execute called while another thread is in "
                                "execute on the same rank; one thread per rank at a time"))
    fail_msg("detail: %s", tpf_last_error());
  TPF_ASSERT_STATUS(o->sync(be, NULL), TPF_ESTATE);
  TPF_ASSERT_STATUS(o->reg_sync(be, NULL), TPF_ESTATE);
  TPF_ASSERT_STATUS(o->reg_create(be, "x", 64, NULL, NULL), TPF_ESTATE);
  TPF_ASSERT_STATUS(o->reg_destroy(be, NULL), TPF_ESTATE);
  char one = 0, all[1];
  TPF_ASSERT_STATUS(o->allgather(be, &one, all, 1), TPF_ESTATE);
  assert_string_equal(atomic_load(&b->busy), "execute");
  /* Thread-safe entries are not claimed. */
  tpf_reg *r = fake_reg("fc1_fprop");
  tpf_status st = TPF_EINVAL;
  TPF_ASSERT_OK(o->reg_async_error(be, r, &st));
  TPF_ASSERT_STATUS(st, TPF_OK);
  /* Released: the next entry claims the rank (and is refused past the claim only by its own
   * checks; reg_destroy of NULL is TPF_EINVAL, no CUDA call), then lets go. */
  atomic_store(&b->busy, (const char *)NULL);
  TPF_ASSERT_STATUS(o->reg_destroy(be, NULL), TPF_EINVAL);
  assert_null(atomic_load(&b->busy));
  free_reg(r);
  free(b);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_status__each_registration_keeps_its_own_failure),
      cmocka_unit_test(test_status__scratch_count_is_true_after_a_failed_growth),
      cmocka_unit_test(test_status__second_thread_is_refused),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
