/* The core's two edges that every other module relies on: the backend wrappers (core/backend.c,
 * the only call path into a backend, which must refuse a malformed ops table with a detail that
 * names the backend) and the hookable allocator (core/alloc.c: hooks all-or-none, zero-size
 * requests, the test budget on every allocation path, live accounting). */
#include "tpf_test.h"

/* ---- backend wrappers ----------------------------------------------------------------------- */

static tpf_status ok_reg_create(tpf_backend *be, const char *name, uint64_t bytes, tpf_reg **reg,
                                void **local) {
  (void)be;
  (void)name;
  (void)bytes;
  *reg = NULL;
  *local = NULL;
  return TPF_OK;
}
static tpf_status ok_reg_destroy(tpf_backend *be, tpf_reg *reg) {
  (void)be;
  (void)reg;
  return TPF_OK;
}
static tpf_status ok_execute(tpf_backend *be, tpf_reg *reg, const tpf_exec_args *a, void *s) {
  (void)be;
  (void)reg;
  (void)a;
  (void)s;
  return TPF_OK;
}
static tpf_status ok_sync(tpf_backend *be, void *s) {
  (void)be;
  (void)s;
  return TPF_OK;
}

static tpf_backend_ops full_ops(void) {
  tpf_backend_ops o;
  memset(&o, 0, sizeof o);
  o.abi_version = TPF_BACKEND_ABI_VERSION;
  o.name = "edge";
  o.align_bytes = 16;
  o.max_ranks = 8;
  o.reg_create = ok_reg_create;
  o.reg_destroy = ok_reg_destroy;
  o.execute = ok_execute;
  o.sync = ok_sync;
  return o;
}

static void expect_invalid(tpf_backend *be, tpf_status want, const char *needle) {
  TPF_ASSERT_STATUS(tpf__be_validate(be), want);
  if (!strstr(tpf_last_error(), needle))
    fail_msg("detail '%s' lacks '%s'", tpf_last_error(), needle);
}

static void test_backend__validate_refuses_malformed_tables(void **state) {
  (void)state;
  tpf_backend_ops o = full_ops();
  tpf_backend be = {&o, 4, 1};
  TPF_ASSERT_OK(tpf__be_validate(&be));

  expect_invalid(NULL, TPF_EINVAL, "NULL");
  tpf_backend no_ops = {NULL, 4, 1};
  expect_invalid(&no_ops, TPF_EINVAL, "ops");

  /* ABI mismatch, with and without a backend name. */
  o.abi_version = TPF_BACKEND_ABI_VERSION + 1;
  expect_invalid(&be, TPF_EUNSUPPORTED, "'edge'");
  o.abi_version = TPF_BACKEND_ABI_MIN - 1;
  expect_invalid(&be, TPF_EUNSUPPORTED, "speaks 1..2");
  o.abi_version = TPF_BACKEND_ABI_VERSION + 1;
  o.name = NULL;
  expect_invalid(&be, TPF_EUNSUPPORTED, "'?'");

  /* Each required op missing on its own. */
  for (int missing = 0; missing < 4; missing++) {
    o = full_ops();
    if (missing == 0)
      o.reg_create = NULL;
    else if (missing == 1)
      o.reg_destroy = NULL;
    else if (missing == 2)
      o.execute = NULL;
    else
      o.sync = NULL;
    expect_invalid(&be, TPF_EINVAL, "lacks a required op");
    o.name = NULL;
    expect_invalid(&be, TPF_EINVAL, "'?'");
  }

  /* Group size against the backend's limit, and the default limit when it gives none. */
  o = full_ops();
  be.tp_size = 9;
  expect_invalid(&be, TPF_EINVAL, "outside 1..8");
  o.name = NULL;
  expect_invalid(&be, TPF_EINVAL, "'?'");
  o = full_ops();
  o.max_ranks = 0;
  be.tp_size = TPF_MAX_RANKS;
  be.rank = TPF_MAX_RANKS - 1;
  TPF_ASSERT_OK(tpf__be_validate(&be));
  be.tp_size = TPF_MAX_RANKS + 1;
  expect_invalid(&be, TPF_EINVAL, "outside 1..64");

  /* Rank outside the group, with and without a name. */
  o = full_ops();
  be.tp_size = 4;
  be.rank = 4;
  expect_invalid(&be, TPF_EINVAL, "rank 4 outside 0..3");
  be.rank = -1;
  o.name = NULL;
  expect_invalid(&be, TPF_EINVAL, "'?'");
}

/* An ABI 1 (0.1) table is accepted: the core reads none of the fields version 2 added (here they
 * hold garbage that would crash if called), and refuses transposes and epilogues, which a 0.1
 * backend would silently ignore. */
static tpf_status crash_reg_sync(tpf_backend *be, tpf_reg *reg) {
  (void)be;
  (void)reg;
  fail_msg("an ABI 1 table's reg_sync was called");
  return TPF_EBACKEND;
}

static void test_backend__abi1_table(void **state) {
  (void)state;
  tpf_mock_backend m;
  tpf_mock_init(&m, 1, 0);
  tpf_backend_ops o = tpf_mock_ops;
  o.abi_version = 1;
  o.reg_sync = crash_reg_sync;
  o.caps |= TPF_BE_CAP_OPTIONS; /* claimed, but ABI 1 cannot mean it */
  m.hdr.ops = &o;
  tpf_comm_config cfg = tpf_test_config("v1", TPF_ALGO_RING, TPF_COLL_AG, TPF_FP32, 16, 32);
  tpf_comm *c = NULL;
  TPF_ASSERT_OK(tpf_comm_create(&m.hdr, &cfg, &c));
  assert_int_equal(tpf_comm_backend_caps(c) & TPF_BE_CAP_OPTIONS, 0);
  assert_string_equal(tpf_comm_backend_name(c), "mock");
  static float wbuf[8 * 32], dbuf[16 * 8];
  tpf_matrix w = {wbuf, 8, 32, 32, TPF_FP32}, d = {dbuf, 16, 8, 8, TPF_FP32};
  TPF_ASSERT_OK(tpf_ag_gemm(c, &w, &d, NULL));
  tpf_op_options opt = TPF_OP_OPTIONS_INIT;
  opt.trans_w = true;
  tpf_matrix wt = {wbuf, 32, 8, 8, TPF_FP32};
  TPF_ASSERT_STATUS(tpf_ag_gemm_ex(c, &wt, &d, &opt, NULL), TPF_EUNSUPPORTED);
  if (!strstr(tpf_last_error(), "ABI 1")) fail_msg("%s", tpf_last_error());
  opt = (tpf_op_options)TPF_OP_OPTIONS_INIT;
  opt.num_splits = 1; /* a split count needs no backend support */
  TPF_ASSERT_OK(tpf_ag_gemm_ex(c, &w, &d, &opt, NULL));
  TPF_ASSERT_OK(tpf_comm_sync(c)); /* falls back to sync(be, NULL), never reg_sync */
  TPF_ASSERT_OK(tpf_comm_abort(c));
  TPF_ASSERT_OK(tpf_comm_destroy(c));
  assert_int_equal(tpf_comm_backend_caps(NULL), 0);
  assert_null(tpf_comm_backend_name(NULL));
}

/* A reg_sync whose detail already names the registration (as CUDA's does). */
static tpf_status naming_reg_sync(tpf_backend *be, tpf_reg *reg) {
  (void)be;
  (void)reg;
  return tpf_set_error(TPF_ETIMEOUT, "'fc1': rank 0: a peer never signalled");
}
static tpf_status plain_reg_sync(tpf_backend *be, tpf_reg *reg) {
  (void)be;
  (void)reg;
  return tpf_set_error(TPF_ETIMEOUT, "rank 0: a peer never signalled");
}

/* tpf_comm_sync names the communicator once: it prefixes a backend's detail with it unless the
 * detail already starts with it (until session 6 the CUDA backend's read "'fc1': 'fc1': ..."). */
static void test_backend__sync_names_once(void **state) {
  (void)state;
  tpf_status (*fns[2])(tpf_backend *, tpf_reg *) = {naming_reg_sync, plain_reg_sync};
  for (int i = 0; i < 2; i++) {
    tpf_mock_backend m;
    tpf_mock_init(&m, 1, 0);
    tpf_backend_ops o = tpf_mock_ops;
    o.reg_sync = fns[i];
    m.hdr.ops = &o;
    tpf_comm_config cfg = tpf_test_config("fc1", TPF_ALGO_RING, TPF_COLL_AG, TPF_FP32, 16, 32);
    tpf_comm *c = NULL;
    TPF_ASSERT_OK(tpf_comm_create(&m.hdr, &cfg, &c));
    TPF_ASSERT_STATUS(tpf_comm_sync(c), TPF_ETIMEOUT);
    assert_string_equal(tpf_last_error(), "'fc1': rank 0: a peer never signalled");
    TPF_ASSERT_OK(tpf_comm_destroy(c));
  }
}

static void test_backend__wrappers_check_arguments(void **state) {
  (void)state;
  tpf_backend_ops o = full_ops();
  tpf_backend be = {&o, 2, 0};
  tpf_reg *reg = NULL;
  void *local = NULL;
  TPF_ASSERT_STATUS(tpf__be_reg_create(&be, "site", 0, &reg, &local), TPF_EINVAL);
  assert_non_null(strstr(tpf_last_error(), "0 bytes for 'site'"));
  TPF_ASSERT_OK(tpf__be_reg_create(&be, "site", 64, &reg, &local));

  /* reg_activate is optional: without it a shape change has nothing to tell. */
  TPF_ASSERT_OK(tpf__be_reg_activate(&be, reg, 32));

  /* An empty schedule never reaches the backend. */
  tpf_exec_args a;
  memset(&a, 0, sizeof a);
  a.comm_name = "site";
  TPF_ASSERT_STATUS(tpf__be_execute(&be, reg, 64, &a, NULL), TPF_EINVAL);
  tpf_schedule s;
  memset(&s, 0, sizeof s);
  s.tp_size = 2;
  s.dtype = TPF_FP32;
  a.sched = &s;
  TPF_ASSERT_STATUS(tpf__be_execute(&be, reg, 64, &a, NULL), TPF_EINVAL);
  assert_non_null(strstr(tpf_last_error(), "empty schedule for 'site'"));
  tpf_step hs;
  memset(&hs, 0, sizeof hs);
  hs.kind = TPF_STEP_HANDSHAKE;
  hs.stream = TPF_STREAM_COMM;
  hs.peer = -1;
  s.steps = &hs;
  s.nsteps = 1;
  TPF_ASSERT_OK(tpf__be_execute(&be, reg, 64, &a, NULL));
  TPF_ASSERT_OK(tpf__be_sync(&be, NULL));
  TPF_ASSERT_OK(tpf__be_reg_destroy(&be, reg));
}

/* ---- allocator ------------------------------------------------------------------------------ */

static int hook_calls;
static void *hook_malloc(size_t n) {
  hook_calls++;
  return malloc(n);
}
static void *hook_calloc(size_t c, size_t n) {
  hook_calls++;
  return calloc(c, n);
}
static void *hook_realloc(void *p, size_t n) {
  hook_calls++;
  return realloc(p, n);
}
static void hook_free(void *p) {
  hook_calls++;
  free(p);
}
static void *null_malloc(size_t n) {
  (void)n;
  return NULL;
}
static void *null_calloc(size_t c, size_t n) {
  (void)c;
  (void)n;
  return NULL;
}

static void test_alloc__hooks_all_or_none(void **state) {
  (void)state;
  /* Every partial set is refused, and the detail says which hooks were missing. */
  for (int mask = 1; mask < 15; mask++) {
    tpf_status s = tpf_set_allocator(mask & 1 ? hook_malloc : NULL, mask & 2 ? hook_calloc : NULL,
                                     mask & 4 ? hook_realloc : NULL, mask & 8 ? hook_free : NULL);
    TPF_ASSERT_STATUS(s, TPF_EINVAL);
    assert_non_null(strstr(tpf_last_error(), "NULL"));
    assert_non_null(strstr(tpf_last_error(), "set"));
  }
  TPF_ASSERT_OK(tpf_set_allocator(hook_malloc, hook_calloc, hook_realloc, hook_free));
  hook_calls = 0;
  long live = tpf__alloc_live_count();
  void *a = tpf__malloc(0); /* zero-size requests still give a unique pointer */
  void *b = tpf__calloc(0, 0);
  void *c = tpf__realloc(NULL, 8); /* realloc of NULL is a malloc */
  assert_non_null(a);
  assert_non_null(b);
  assert_non_null(c);
  c = tpf__realloc(c, 0);
  assert_non_null(c);
  char *d = tpf__strdup("fc1_fprop");
  assert_string_equal(d, "fc1_fprop");
  assert_int_equal(tpf__alloc_live_count(), live + 4);
  tpf__free(a);
  tpf__free(b);
  tpf__free(c);
  tpf__free(d);
  tpf__free(NULL); /* no-op, not counted */
  assert_int_equal(tpf__alloc_live_count(), live);
  assert_int_equal(hook_calls, 9);
  TPF_ASSERT_OK(tpf_set_allocator(NULL, NULL, NULL, NULL));
}

static void test_alloc__failures_are_not_counted(void **state) {
  (void)state;
  long live = tpf__alloc_live_count();
  /* A hook that fails: nothing is counted as live. */
  TPF_ASSERT_OK(tpf_set_allocator(null_malloc, null_calloc, hook_realloc, hook_free));
  assert_null(tpf__malloc(16));
  assert_null(tpf__calloc(2, 16));
  assert_null(tpf__strdup("x"));
  assert_int_equal(tpf__alloc_live_count(), live);
  TPF_ASSERT_OK(tpf_set_allocator(NULL, NULL, NULL, NULL));

  /* The budget: every path fails once it is spent, and the budget counts down exactly. */
  void *p = tpf__malloc(8);
  assert_non_null(p);
  tpf__alloc_set_budget(2);
  void *q = tpf__calloc(1, 8);
  assert_non_null(q);
  void *r = tpf__realloc(p, 64);
  assert_non_null(r);
  assert_null(tpf__malloc(8));
  assert_null(tpf__calloc(1, 8));
  assert_null(tpf__realloc(r, 128)); /* r stays valid */
  assert_null(tpf__strdup("y"));
  tpf__alloc_set_budget(-7); /* any negative value means unlimited */
  void *s = tpf__malloc(8);
  assert_non_null(s);
  tpf__free(q);
  tpf__free(r);
  tpf__free(s);
  assert_int_equal(tpf__alloc_live_count(), live);
}

/* Changing the hooks while objects are live is refused (a block of the old
 * allocator freed by the new one aborted with "free(): invalid pointer"), and nothing changes. */
static void test_alloc__refused_while_objects_live(void **state) {
  (void)state;
  assert_int_equal(tpf__alloc_live_count(), 0);
  tpf_mock_backend be;
  tpf_mock_init(&be, 1, 0);
  tpf_comm_config cfg = tpf_test_config("fc1_fprop", TPF_ALGO_BULK, TPF_COLL_AG, TPF_BF16, 64, 8);
  tpf_comm *c = NULL;
  TPF_ASSERT_OK(tpf_comm_create(&be.hdr, &cfg, &c));
  const long live = tpf__alloc_live_count();
  assert_true(live > 0);
  hook_calls = 0;
  TPF_ASSERT_STATUS(tpf_set_allocator(hook_malloc, hook_calloc, hook_realloc, hook_free),
                    TPF_ESTATE);
  char want[32];
  snprintf(want, sizeof want, "%ld allocations", live);
  assert_non_null(strstr(tpf_last_error(), want));
  assert_non_null(strstr(tpf_last_error(), "live"));
  /* The hooks did not change: an allocation does not reach hook_malloc. */
  void *p = tpf__malloc(8);
  assert_non_null(p);
  assert_int_equal(hook_calls, 0);
  tpf__free(p);
  /* Setting the hooks already in place (here the C library's) is harmless and allowed. */
  TPF_ASSERT_OK(tpf_set_allocator(NULL, NULL, NULL, NULL));
  TPF_ASSERT_OK(tpf_comm_destroy(c)); /* freed by the allocator that made it */
  assert_int_equal(tpf__alloc_live_count(), 0);
  TPF_ASSERT_OK(tpf_set_allocator(hook_malloc, hook_calloc, hook_realloc, hook_free));
  TPF_ASSERT_OK(tpf_set_allocator(NULL, NULL, NULL, NULL));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_backend__validate_refuses_malformed_tables),
      cmocka_unit_test(test_backend__wrappers_check_arguments),
      cmocka_unit_test(test_backend__abi1_table),
      cmocka_unit_test(test_backend__sync_names_once),
      cmocka_unit_test(test_alloc__hooks_all_or_none),
      cmocka_unit_test(test_alloc__failures_are_not_counted),
      cmocka_unit_test(test_alloc__refused_while_objects_live),
  };
  return cmocka_run_group_tests_name("backend_edge", tests, NULL, NULL);
}
