/* The CUDA backend's parameter registry (backend_cuda/cuda_param.c), without a GPU: every knob's
 * default when its variable is unset, overrides, the kinds' rules (BOOL "0" is off, FLAG is the
 * variable's presence), invalid values (a WARN line naming the variable and the default used,
 * then the default; numbers out of range clamped or defaulted as the knob says), TPF_DEBUG=INFO
 * printing the table, TPF_DEBUG=NONE silencing the warnings, the legacy TPF_CUDA_DEBUG, "read
 * once" (a later change of the environment is not seen until a reload), and one consumer: the
 * threads bootstrap's barrier bounded by TPF_CUDA_BOOT_TIMEOUT_MS. */
#define _POSIX_C_SOURCE 200809L
#include "cuda_internal.h"
#include "cuda_param.h"
#include "tpf_test.h"

#include <unistd.h>

static FILE *sink;

static void unset_all(void) {
  for (int i = 0; i < TPF_CUDA_PARAM_COUNT; i++)
    unsetenv(tpf_cuda__param((tpf_cuda_param_id)i)->name);
}

static int setup(void **state) {
  (void)state;
  sink = tmpfile();
  if (sink == NULL) return -1;
  tpf_cuda__log_set_file(sink);
  unset_all();
  tpf_cuda__param_reload(-1);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  unset_all();
  tpf_cuda__param_reload(-1);
  tpf_cuda__log_set_file(NULL);
  fclose(sink);
  return 0;
}

static const char *drain(void) {
  static char buf[1 << 16];
  fflush(sink);
  const long end = ftell(sink);
  rewind(sink);
  size_t n = fread(buf, 1, (size_t)end < sizeof buf - 1 ? (size_t)end : sizeof buf - 1, sink);
  buf[n] = '\0';
  rewind(sink);
  if (ftruncate(fileno(sink), 0) != 0) fail_msg("cannot truncate the log sink");
  return buf;
}

static void expect_line(const char *log, const char *line) {
  if (strstr(log, line) == NULL) fail_msg("log lacks '%s'; it is:\n%s", line, log);
}

static void test_cuda_param__defaults(void **state) {
  (void)state;
  assert_int_equal(tpf_cuda__param_u64(TPF_CUDA_PARAM_TIMEOUT_MS), 30000);
  assert_int_equal(tpf_cuda__param_u64(TPF_CUDA_PARAM_COMM_CTAS), 16);
  assert_int_equal(tpf_cuda__param_u64(TPF_CUDA_PARAM_COMPUTE_STREAMS), TPF_MAX_COMPUTE_STREAMS);
  assert_int_equal(tpf_cuda__param_u64(TPF_CUDA_PARAM_WORKSPACE_BYTES), 32ull << 20);
  assert_false(tpf_cuda__param_on(TPF_CUDA_PARAM_GEMM_FALLBACK));
  assert_false(tpf_cuda__param_on(TPF_CUDA_PARAM_DEVICE_FLAGS));
  assert_int_equal(tpf_cuda__param_u64(TPF_CUDA_PARAM_BOOT_TIMEOUT_MS), 120000);
  assert_int_equal(tpf_cuda__param_u64(TPF_CUDA_PARAM_MAX_CONNECTIONS), 8);
  assert_int_equal(tpf_cuda__param_u64(TPF_CUDA_PARAM_DEBUG_LEVEL), TPF_CUDA_LOG_WARN);
  assert_int_equal(tpf_cuda__param_u64(TPF_CUDA_PARAM_DEBUG_SUBSYS), TPF_CUDA_LOG_ALL);
  assert_false(tpf_cuda__param_on(TPF_CUDA_PARAM_CUDA_DEBUG));
  for (int i = 0; i < TPF_CUDA_PARAM_COUNT; i++) {
    const tpf_cuda_param *p = tpf_cuda__param((tpf_cuda_param_id)i);
    assert_false(p->set);
    assert_true(p->valid);
    assert_int_equal(p->value, p->dflt);
    assert_non_null(p->what);
  }
  assert_string_equal(tpf_cuda__param(TPF_CUDA_PARAM_TIMEOUT_MS)->name, "TPF_CUDA_TIMEOUT_MS");
  assert_string_equal(drain(), ""); /* nothing to warn about, INFO is off */
}

static void test_cuda_param__overrides(void **state) {
  (void)state;
  setenv("TPF_CUDA_TIMEOUT_MS", "5000", 1);
  setenv("TPF_CUDA_COMM_CTAS", "64", 1);
  setenv("TPF_CUDA_COMPUTE_STREAMS", "2", 1);
  setenv("TPF_CUDA_WORKSPACE_BYTES", "1048576", 1);
  setenv("TPF_CUDA_GEMM_FALLBACK", "1", 1);
  setenv("TPF_CUDA_DEVICE_FLAGS", "", 1); /* presence is the setting */
  setenv("TPF_CUDA_BOOT_TIMEOUT_MS", "250", 1);
  setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 1);
  tpf_cuda__param_reload(0);
  assert_int_equal(tpf_cuda__param_u64(TPF_CUDA_PARAM_TIMEOUT_MS), 5000);
  assert_int_equal(tpf_cuda__param_u64(TPF_CUDA_PARAM_COMM_CTAS), 64);
  assert_int_equal(tpf_cuda__param_u64(TPF_CUDA_PARAM_COMPUTE_STREAMS), 2);
  assert_true(tpf_cuda__param_is_set(TPF_CUDA_PARAM_COMPUTE_STREAMS));
  assert_int_equal(tpf_cuda__param_u64(TPF_CUDA_PARAM_WORKSPACE_BYTES), 1048576);
  assert_true(tpf_cuda__param_on(TPF_CUDA_PARAM_GEMM_FALLBACK));
  assert_true(tpf_cuda__param_on(TPF_CUDA_PARAM_DEVICE_FLAGS));
  assert_int_equal(tpf_cuda__param_u64(TPF_CUDA_PARAM_BOOT_TIMEOUT_MS), 250);
  assert_int_equal(tpf_cuda__param_u64(TPF_CUDA_PARAM_MAX_CONNECTIONS), 32);
  assert_false(tpf_cuda__param_is_set(TPF_CUDA_PARAM_DEBUG_LEVEL));
  assert_string_equal(drain(), "");

  /* BOOL: "0" and empty are off, anything else on; FLAG: any value, "0" included, is on, and
   * a value that reads as "off" is warned about. */
  setenv("TPF_CUDA_GEMM_FALLBACK", "0", 1);
  setenv("TPF_CUDA_DEVICE_FLAGS", "0", 1);
  tpf_cuda__param_reload(0);
  assert_false(tpf_cuda__param_on(TPF_CUDA_PARAM_GEMM_FALLBACK));
  assert_true(tpf_cuda__param_on(TPF_CUDA_PARAM_DEVICE_FLAGS));
  expect_line(drain(), "WARN ENV TPF_CUDA_DEVICE_FLAGS='0' turns it ON: a flag is set by its "
                       "presence; unset the variable to turn it off\n");
  setenv("TPF_CUDA_DEVICE_FLAGS", "Off", 1);
  tpf_cuda__param_reload(0);
  assert_true(tpf_cuda__param_on(TPF_CUDA_PARAM_DEVICE_FLAGS));
  expect_line(drain(), "TPF_CUDA_DEVICE_FLAGS='Off' turns it ON");
  setenv("TPF_CUDA_DEVICE_FLAGS", "1", 1);
  tpf_cuda__param_reload(0);
  assert_string_equal(drain(), "");
  setenv("TPF_CUDA_DEVICE_FLAGS", "", 1); /* set, quietly */
  tpf_cuda__param_reload(0);
  assert_true(tpf_cuda__param_on(TPF_CUDA_PARAM_DEVICE_FLAGS));
  assert_string_equal(drain(), "");
  setenv("TPF_CUDA_GEMM_FALLBACK", "", 1);
  tpf_cuda__param_reload(0);
  assert_false(tpf_cuda__param_on(TPF_CUDA_PARAM_GEMM_FALLBACK));
  setenv("TPF_CUDA_GEMM_FALLBACK", "yes", 1);
  tpf_cuda__param_reload(0);
  assert_true(tpf_cuda__param_on(TPF_CUDA_PARAM_GEMM_FALLBACK));

  /* Empty numbers are the default, quietly; the variable still counts as set. */
  setenv("TPF_CUDA_COMPUTE_STREAMS", "", 1);
  tpf_cuda__param_reload(0);
  assert_int_equal(tpf_cuda__param_u64(TPF_CUDA_PARAM_COMPUTE_STREAMS), TPF_MAX_COMPUTE_STREAMS);
  assert_true(tpf_cuda__param_is_set(TPF_CUDA_PARAM_COMPUTE_STREAMS));
  assert_true(tpf_cuda__param(TPF_CUDA_PARAM_COMPUTE_STREAMS)->valid);
  assert_string_equal(drain(), "");
}

static void test_cuda_param__invalid_values_warn_and_fall_back(void **state) {
  (void)state;
  setenv("TPF_CUDA_TIMEOUT_MS", "abc", 1);
  setenv("TPF_CUDA_COMM_CTAS", "5000", 1);
  setenv("TPF_CUDA_COMPUTE_STREAMS", "0", 1);
  setenv("TPF_CUDA_WORKSPACE_BYTES", "32M", 1);
  setenv("TPF_CUDA_BOOT_TIMEOUT_MS", "0", 1);
  setenv("CUDA_DEVICE_MAX_CONNECTIONS", "-", 1);
  setenv("TPF_DEBUG", "LOUD", 1);
  setenv("TPF_DEBUG_SUBSYS", "INIT,BOGUS", 1);
  tpf_cuda__param_reload(2);
  assert_int_equal(tpf_cuda__param_u64(TPF_CUDA_PARAM_TIMEOUT_MS), 30000);
  assert_int_equal(tpf_cuda__param_u64(TPF_CUDA_PARAM_COMM_CTAS), 1024);    /* clamped */
  assert_int_equal(tpf_cuda__param_u64(TPF_CUDA_PARAM_COMPUTE_STREAMS), 1); /* clamped */
  assert_int_equal(tpf_cuda__param_u64(TPF_CUDA_PARAM_WORKSPACE_BYTES), 32ull << 20);
  assert_int_equal(tpf_cuda__param_u64(TPF_CUDA_PARAM_BOOT_TIMEOUT_MS), 120000);
  assert_int_equal(tpf_cuda__param_u64(TPF_CUDA_PARAM_MAX_CONNECTIONS), 8);
  assert_int_equal(tpf_cuda__param_u64(TPF_CUDA_PARAM_DEBUG_LEVEL), TPF_CUDA_LOG_WARN);
  assert_int_equal(tpf_cuda__param_u64(TPF_CUDA_PARAM_DEBUG_SUBSYS), TPF_CUDA_LOG_ALL);
  for (int i = 0; i < TPF_CUDA_PARAM_COUNT; i++) {
    const tpf_cuda_param *p = tpf_cuda__param((tpf_cuda_param_id)i);
    assert_int_equal(p->valid, !p->set);
  }
  const char *log = drain();
  expect_line(log, "tpflex:rank 2 WARN ENV TPF_CUDA_TIMEOUT_MS='abc' is not a decimal number: "
                   "using the default 30000\n");
  expect_line(log, "tpflex:rank 2 WARN ENV TPF_CUDA_COMM_CTAS=5000 is outside 1..1024: using "
                   "1024\n");
  expect_line(log, "tpflex:rank 2 WARN ENV TPF_CUDA_COMPUTE_STREAMS=0 is outside 1..3: using 1\n");
  expect_line(log, "tpflex:rank 2 WARN ENV TPF_CUDA_WORKSPACE_BYTES='32M' is not a decimal "
                   "number: using the default 33554432\n");
  expect_line(log, "WARN ENV TPF_CUDA_BOOT_TIMEOUT_MS=0 is outside 1..18446744073709551615: using "
                   "the default 120000\n");
  expect_line(log, "WARN ENV CUDA_DEVICE_MAX_CONNECTIONS='-' is not a decimal number: using the "
                   "default 8\n");
  expect_line(log, "WARN ENV TPF_DEBUG='LOUD' is not NONE, WARN, INFO or TRACE: using the "
                   "default WARN\n");
  expect_line(log, "WARN ENV TPF_DEBUG_SUBSYS='INIT,BOGUS' names an unknown subsystem");
  int lines = 0;
  for (const char *p = log; (p = strchr(p, '\n')) != NULL; p++)
    lines++;
  assert_int_equal(lines, 8); /* one per invalid variable, nothing else at WARN */

  /* TPF_DEBUG=NONE silences them; the values fall back all the same. */
  setenv("TPF_DEBUG", "none", 1);
  tpf_cuda__param_reload(2);
  assert_int_equal(tpf_cuda__param_u64(TPF_CUDA_PARAM_TIMEOUT_MS), 30000);
  assert_string_equal(drain(), "");
}

static void test_cuda_param__info_prints_the_table(void **state) {
  (void)state;
  setenv("TPF_DEBUG", "INFO", 1);
  setenv("TPF_DEBUG_SUBSYS", "ENV", 1);
  setenv("TPF_CUDA_COMM_CTAS", "8", 1);
  tpf_cuda__param_reload(1);
  const char *log = drain();
  expect_line(log, "tpflex:rank 1 INFO ENV TPF_CUDA_TIMEOUT_MS = 30000 (default): ");
  expect_line(log, "tpflex:rank 1 INFO ENV TPF_CUDA_COMM_CTAS = 8 (set '8'): ");
  expect_line(log, "tpflex:rank 1 INFO ENV TPF_DEBUG = INFO (set 'INFO'): ");
  expect_line(log, "tpflex:rank 1 INFO ENV TPF_DEBUG_SUBSYS = 0x02 (set 'ENV'): ");
  int lines = 0;
  for (const char *p = log; (p = strchr(p, '\n')) != NULL; p++)
    lines++;
  assert_int_equal(lines, TPF_CUDA_PARAM_COUNT); /* one line per knob */
  /* The log now filters to ENV at INFO. */
  assert_true(tpf_cuda__log_enabled(TPF_CUDA_LOG_INFO, TPF_CUDA_LOG_ENV));
  assert_false(tpf_cuda__log_enabled(TPF_CUDA_LOG_INFO, TPF_CUDA_LOG_REG));

  /* The table is only printed at INFO with ENV selected. */
  setenv("TPF_DEBUG_SUBSYS", "REG", 1);
  tpf_cuda__param_reload(1);
  assert_string_equal(drain(), "");

  /* The legacy switch: TPF_CUDA_DEBUG alone is INFO; TPF_DEBUG wins when both are set. */
  unsetenv("TPF_DEBUG");
  unsetenv("TPF_DEBUG_SUBSYS");
  setenv("TPF_CUDA_DEBUG", "1", 1);
  tpf_cuda__param_reload(1);
  assert_int_equal(tpf_cuda__param_u64(TPF_CUDA_PARAM_DEBUG_LEVEL), TPF_CUDA_LOG_INFO);
  assert_true(tpf_cuda__log_enabled(TPF_CUDA_LOG_INFO, TPF_CUDA_LOG_REG));
  expect_line(drain(), "INFO ENV TPF_CUDA_DEBUG = 1 (set '1'): ");
  setenv("TPF_DEBUG", "WARN", 1);
  tpf_cuda__param_reload(1);
  assert_false(tpf_cuda__log_enabled(TPF_CUDA_LOG_INFO, TPF_CUDA_LOG_REG));
}

static void test_cuda_param__read_once(void **state) {
  (void)state;
  setenv("TPF_CUDA_TIMEOUT_MS", "777", 1);
  tpf_cuda__param_reload(0);
  setenv("TPF_CUDA_TIMEOUT_MS", "888", 1);
  tpf_cuda__param_load(0); /* already loaded: nothing is read again */
  assert_int_equal(tpf_cuda__param_u64(TPF_CUDA_PARAM_TIMEOUT_MS), 777);
  tpf_cuda__param_reload(0);
  assert_int_equal(tpf_cuda__param_u64(TPF_CUDA_PARAM_TIMEOUT_MS), 888);
}

/* A consumer: the threads bootstrap reads its bound from the registry. */
static void test_cuda_param__boot_timeout_bounds_the_threads_bootstrap(void **state) {
  (void)state;
  setenv("TPF_CUDA_BOOT_TIMEOUT_MS", "200", 1);
  tpf_cuda__param_reload(-1);
  tpf_cuda_threads *g = NULL;
  TPF_ASSERT_OK(tpf_cuda_threads_create(2, &g));
  tpf_bootstrap b;
  TPF_ASSERT_OK(tpf_cuda_threads_bootstrap(g, 0, 0, &b));
  /* Rank 1 never arrives. */
  TPF_ASSERT_STATUS(b.barrier(b.ctx), TPF_ETIMEOUT);
  assert_non_null(strstr(tpf_last_error(), "waited 200 ms"));
  TPF_ASSERT_OK(tpf_cuda_threads_destroy(g));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_cuda_param__defaults, setup, teardown),
      cmocka_unit_test_setup_teardown(test_cuda_param__overrides, setup, teardown),
      cmocka_unit_test_setup_teardown(test_cuda_param__invalid_values_warn_and_fall_back, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_cuda_param__info_prints_the_table, setup, teardown),
      cmocka_unit_test_setup_teardown(test_cuda_param__read_once, setup, teardown),
      cmocka_unit_test_setup_teardown(test_cuda_param__boot_timeout_bounds_the_threads_bootstrap,
                                      setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
