/* The backend ABI is append-only. A backend compiled against the released 0.1
 * header (tests/support/abi1/, verbatim from commit 7fbea2d) reads every field it knows at the
 * offset today's core writes it: the two headers' offsets and sizes are compared field by field,
 * and an operation run through the 0.1 backend shows it the core's schedule (step count, every
 * step's kind and GEMM dims, the header fields). Inserting op_key before nsteps (moving it from
 * 108 to 112) broke exactly this: an ABI 1 backend read garbage as its step count. */
#include "../support/abi1/abi1_backend.h" /* by path: -I abi1 would shadow today's headers */
#include "comm_internal.h"
#include "tpf_test.h"

static void test_abi1__layouts_match_the_released_header(void **state) {
  (void)state;
  enum { MAX = 128 };
  const char *old_names[MAX], *new_names[MAX];
  size_t old_vals[MAX], new_vals[MAX];
  const size_t n_old = tpf_abi1_layout(old_names, old_vals, MAX);
  size_t n_new = 0;
#define L(name, value)                                                                             \
  do {                                                                                             \
    new_names[n_new] = name;                                                                       \
    new_vals[n_new] = value;                                                                       \
    n_new++;                                                                                       \
  } while (0)
#include "../support/abi1/abi1_layout.inc"
#undef L
  assert_int_equal(n_old, n_new);
  assert_true(n_old > 60);
  int diffs = 0;
  for (size_t i = 0; i < n_old; i++) {
    assert_string_equal(old_names[i], new_names[i]);
    if (old_vals[i] != new_vals[i]) {
      print_error("%s: %zu in the 0.1 header, %zu today\n", old_names[i], old_vals[i], new_vals[i]);
      diffs++;
    }
  }
  if (diffs) fail_msg("%d fields moved since 0.1: the backend ABI must be append-only", diffs);
  print_message("%zu offsets and sizes equal in the 0.1 and today's backend headers\n", n_old);
}

static void test_abi1__operations_through_a_01_backend(void **state) {
  (void)state;
  static tpf_abi1_seen seen;
  memset(&seen, 0, sizeof seen);
  tpf_backend *be = tpf_abi1_backend_new(&seen);
  assert_non_null(be);
  enum { T = 16, H = 32, N = 8 };
  tpf_comm_config cfg = tpf_test_config("fc1_fprop", TPF_ALGO_RING, TPF_COLL_AG, TPF_FP32, T, H);
  tpf_comm *c = NULL;
  TPF_ASSERT_OK(tpf_comm_create(be, &cfg, &c));
  static float wbuf[N * H], dbuf[T * N];
  tpf_matrix w = {wbuf, N, H, H, TPF_FP32}, d = {dbuf, T, N, N, TPF_FP32};
  for (int round = 0; round < 2; round++) {
    const uint64_t rows = round == 0 ? T : 8;
    TPF_ASSERT_OK(tpf_comm_set_active_shape(c, (tpf_shape){rows, H}));
    d.rows = rows;
    TPF_ASSERT_OK(tpf_ag_gemm(c, &w, &d, NULL));
    assert_int_equal(seen.executes, round + 1);
    /* The schedule the core built, from today's header, against what the 0.1 backend read. */
    tpf_layout_desc desc = tpf__comm_desc(c, (tpf_shape){rows, H});
    tpf_gemm_dims g = {rows, N, H};
    tpf_schedule s;
    TPF_ASSERT_OK(tpf_schedule_build(&desc, &g, &s));
    assert_int_equal(seen.nsteps, s.nsteps);
    assert_true(seen.nsteps >= 1); /* P = 1: the one GEMM, no handshake */
    for (int i = 0; i < s.nsteps; i++) {
      assert_int_equal(seen.kind[i], s.steps[i].kind);
      assert_int_equal(seen.stream[i], s.steps[i].stream);
      assert_int_equal(seen.ndeps[i], s.steps[i].ndeps);
      assert_int_equal(seen.m[i], s.steps[i].m);
      assert_int_equal(seen.n[i], s.steps[i].n);
      assert_int_equal(seen.k[i], s.steps[i].k);
    }
    assert_int_equal(seen.kind[0], TPF_STEP_GEMM);
    assert_int_equal(seen.tp_size, 1);
    assert_int_equal(seen.algo, TPF_ALGO_RING);
    assert_int_equal(seen.coll, TPF_COLL_AG);
    assert_int_equal(seen.dtype, TPF_FP32);
    assert_int_equal(seen.num_splits, s.num_splits);
    assert_int_equal(seen.num_compute_streams, s.num_compute_streams);
    assert_int_equal(seen.rows, rows);
    assert_int_equal(seen.cols, H);
    assert_int_equal(seen.chunk_bytes, s.chunk_bytes);
    assert_int_equal(seen.registered_bytes, s.registered_bytes);
    assert_int_equal(seen.active_bytes, s.active_bytes);
    assert_int_equal(seen.gemm_m, rows);
    assert_int_equal(seen.gemm_n, N);
    assert_int_equal(seen.gemm_k, H);
    assert_int_equal(seen.seq, (uint64_t)round + 1);
    assert_string_equal(seen.comm_name, "fc1_fprop");
    assert_ptr_equal(seen.w, wbuf);
    assert_ptr_equal(seen.d, dbuf);
    assert_null(seen.x);
    tpf_schedule_free(&s);
  }
  /* ABI 1 knows no options: refused before the backend sees anything. */
  tpf_op_options o = TPF_OP_OPTIONS_INIT;
  o.alpha = 2.0f;
  TPF_ASSERT_STATUS(tpf_ag_gemm_ex(c, &w, &d, &o, NULL), TPF_EUNSUPPORTED);
  assert_int_equal(seen.executes, 2);
  TPF_ASSERT_OK(tpf_comm_sync(c));
  TPF_ASSERT_OK(tpf_comm_destroy(c));
  tpf_abi1_backend_free(be);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_abi1__layouts_match_the_released_header),
      cmocka_unit_test(test_abi1__operations_through_a_01_backend),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
