/* The measurement probes (tpf_cuda_probe_reduce, tpf_cuda_probe_empty_launch) refuse every bad
 * argument with TPF_EINVAL naming it, before any CUDA call: on a machine without a GPU a call
 * that got as far as CUDA would fail with TPF_EBACKEND instead, so each refusal below also shows
 * that nothing was enqueued. The backend is a zeroed tpf_cuda_backend whose ops are the CUDA
 * backend's (what the probes check); the launches themselves run in scripts/gpu.sh tools-smoke
 * (tpflex calibrate --quick). */
#define _POSIX_C_SOURCE 200809L
#include "tpf_test.h"

#include "cuda_state.h"

#include <string.h>

static tpf_cuda_backend *fake_backend(void) {
  tpf_cuda_backend *b = calloc(1, sizeof *b);
  assert_non_null(b);
  b->base.ops = &tpf_cuda__ops;
  b->base.tp_size = 1;
  b->comm_ctas = 16;
  b->timeout_ns = 1000000000ull;
  return b;
}

/* rc is TPF_EINVAL and the detail contains `want`. */
static void expect_einval(tpf_status rc, const char *want) {
  assert_int_equal(rc, TPF_EINVAL);
  if (strstr(tpf_last_error(), want) == NULL)
    fail_msg("detail '%s' does not name '%s'", tpf_last_error(), want);
}

static void test_probe__reduce_refuses_bad_arguments(void **state) {
  (void)state;
  tpf_cuda_backend *b = fake_backend();
  tpf_backend *be = &b->base;
  char x0[64], x1[64], y[64]; /* never dereferenced: the refusals come first */
  const void *srcs[2] = {x0, x1};
  const void *holes[2] = {x0, NULL};
  void *s = NULL;
  expect_einval(tpf_cuda_probe_reduce(NULL, srcs, 2, 8, y, 8, 4, 8, TPF_BF16, s), "be is NULL");
  tpf_backend_ops other;
  memset(&other, 0, sizeof other);
  other.name = "sim";
  tpf_backend fake_sim;
  memset(&fake_sim, 0, sizeof fake_sim);
  fake_sim.ops = &other;
  expect_einval(tpf_cuda_probe_reduce(&fake_sim, srcs, 2, 8, y, 8, 4, 8, TPF_BF16, s),
                "backend 'sim' is not a CUDA backend");
  expect_einval(tpf_cuda_probe_reduce(be, srcs, 0, 8, y, 8, 4, 8, TPF_BF16, s),
                "count 0 is outside 1..64");
  expect_einval(tpf_cuda_probe_reduce(be, srcs, 65, 8, y, 8, 4, 8, TPF_BF16, s),
                "count 65 is outside 1..64");
  expect_einval(tpf_cuda_probe_reduce(be, NULL, 2, 8, y, 8, 4, 8, TPF_BF16, s),
                "srcs is NULL (count 2)");
  expect_einval(tpf_cuda_probe_reduce(be, holes, 2, 8, y, 8, 4, 8, TPF_BF16, s),
                "srcs[1] is NULL (count 2)");
  expect_einval(tpf_cuda_probe_reduce(be, srcs, 2, 8, NULL, 8, 4, 8, TPF_BF16, s), "dst is NULL");
  char dt[32];
  snprintf(dt, sizeof dt, "dtype %d is not", (int)TPF_FP8_E4M3);
  expect_einval(tpf_cuda_probe_reduce(be, srcs, 2, 8, y, 8, 4, 8, TPF_FP8_E4M3, s), dt);
  expect_einval(tpf_cuda_probe_reduce(be, srcs, 2, 8, y, 8, 4, 8, (tpf_dtype)99, s),
                "dtype 99 is not");
  expect_einval(tpf_cuda_probe_reduce(be, srcs, 2, 8, y, 8, 0, 8, TPF_BF16, s),
                "[rows 0, cols 8] is empty");
  expect_einval(tpf_cuda_probe_reduce(be, srcs, 2, 8, y, 8, 4, 0, TPF_FP32, s),
                "[rows 4, cols 0] is empty");
  expect_einval(tpf_cuda_probe_reduce(be, srcs, 2, 7, y, 8, 4, 8, TPF_FP16, s),
                "src_ld 7 and dst_ld 8 must be >= cols 8");
  expect_einval(tpf_cuda_probe_reduce(be, srcs, 2, 8, y, 5, 4, 8, TPF_FP16, s),
                "src_ld 8 and dst_ld 5 must be >= cols 8");
  free(b);
}

static void test_probe__empty_launch_refuses_a_non_cuda_backend(void **state) {
  (void)state;
  expect_einval(tpf_cuda_probe_empty_launch(NULL, NULL), "be is NULL");
  tpf_backend_ops other;
  memset(&other, 0, sizeof other);
  other.name = "sim";
  tpf_backend fake_sim;
  memset(&fake_sim, 0, sizeof fake_sim);
  fake_sim.ops = &other;
  expect_einval(tpf_cuda_probe_empty_launch(&fake_sim, NULL),
                "tpf_cuda_probe_empty_launch: backend 'sim' is not a CUDA backend");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_probe__reduce_refuses_bad_arguments),
      cmocka_unit_test(test_probe__empty_launch_refuses_a_non_cuda_backend),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
