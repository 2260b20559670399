/* The CUDA backend's log facility (backend_cuda/cuda_log.c), without a GPU: the levels (NONE
 * prints nothing, WARN only warnings, INFO and TRACE more), the subsystem filter (it selects INFO
 * and TRACE lines, warnings pass), the "tpflex:rank N LEVEL SUBSYS" prefix ("rank ?" without a
 * rank), the parsers of TPF_DEBUG and TPF_DEBUG_SUBSYS, truncation of long lines, and whole
 * lines from concurrent threads. Lines go to a temporary file (tpf_cuda__log_set_file). */
#define _POSIX_C_SOURCE 200809L
#include "cuda_log.h"
#include "tpf_test.h"

#include <pthread.h>
#include <unistd.h>

static FILE *sink;

static int setup(void **state) {
  (void)state;
  sink = tmpfile();
  if (sink == NULL) return -1;
  tpf_cuda__log_set_file(sink);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  tpf_cuda__log_set_file(NULL);
  tpf_cuda__log_configure(TPF_CUDA_LOG_WARN, TPF_CUDA_LOG_ALL);
  fclose(sink);
  return 0;
}

/* Everything written since the last call, NUL-terminated (static buffer). */
static const char *drain(void) {
  static char buf[1 << 20];
  fflush(sink);
  const long end = ftell(sink);
  rewind(sink);
  size_t n = fread(buf, 1, (size_t)end < sizeof buf - 1 ? (size_t)end : sizeof buf - 1, sink);
  buf[n] = '\0';
  rewind(sink);
  if (ftruncate(fileno(sink), 0) != 0) fail_msg("cannot truncate the log sink");
  return buf;
}

static void test_cuda_log__levels_and_prefix(void **state) {
  (void)state;
  tpf_cuda__log_configure(TPF_CUDA_LOG_WARN, TPF_CUDA_LOG_ALL);
  TPF_CUDA_WARN(REG, 3, "peer %d is %s", 1, "late");
  TPF_CUDA_INFO(REG, 3, "not shown");
  TPF_CUDA_TRACE(EXEC, 3, "not shown");
  assert_string_equal(drain(), "tpflex:rank 3 WARN REG peer 1 is late\n");

  tpf_cuda__log_configure(TPF_CUDA_LOG_INFO, TPF_CUDA_LOG_ALL);
  TPF_CUDA_INFO(INIT, 0, "up");
  TPF_CUDA_TRACE(EXEC, 0, "not shown");
  TPF_CUDA_INFO(ENV, -1, "no rank yet");
  assert_string_equal(drain(), "tpflex:rank 0 INFO INIT up\ntpflex:rank ? INFO ENV no rank yet\n");

  tpf_cuda__log_configure(TPF_CUDA_LOG_TRACE, TPF_CUDA_LOG_ALL);
  TPF_CUDA_TRACE(EXEC, 7, "operation %llu", 42ull);
  assert_string_equal(drain(), "tpflex:rank 7 TRACE EXEC operation 42\n");

  tpf_cuda__log_configure(TPF_CUDA_LOG_NONE, TPF_CUDA_LOG_ALL);
  TPF_CUDA_WARN(ENV, 0, "not even warnings");
  TPF_CUDA_INFO(ENV, 0, "nor this");
  assert_string_equal(drain(), "");
  assert_false(tpf_cuda__log_enabled(TPF_CUDA_LOG_WARN, TPF_CUDA_LOG_ENV));
}

static void test_cuda_log__subsystem_filter(void **state) {
  (void)state;
  tpf_cuda__log_configure(TPF_CUDA_LOG_INFO, TPF_CUDA_LOG_REG | TPF_CUDA_LOG_EXEC);
  TPF_CUDA_INFO(REG, 1, "reg");
  TPF_CUDA_INFO(GEMM, 1, "gemm filtered");
  TPF_CUDA_INFO(EXEC, 1, "exec");
  TPF_CUDA_WARN(GEMM, 1, "warnings pass the filter");
  assert_string_equal(drain(), "tpflex:rank 1 INFO REG reg\ntpflex:rank 1 INFO EXEC exec\n"
                               "tpflex:rank 1 WARN GEMM warnings pass the filter\n");
  assert_true(tpf_cuda__log_enabled(TPF_CUDA_LOG_INFO, TPF_CUDA_LOG_REG));
  assert_false(tpf_cuda__log_enabled(TPF_CUDA_LOG_INFO, TPF_CUDA_LOG_INIT));
  assert_false(tpf_cuda__log_enabled(TPF_CUDA_LOG_TRACE, TPF_CUDA_LOG_REG));
}

static void test_cuda_log__parsers(void **state) {
  (void)state;
  tpf_cuda_log_level l = TPF_CUDA_LOG_TRACE;
  assert_true(tpf_cuda__log_parse_level("info", &l));
  assert_int_equal(l, TPF_CUDA_LOG_INFO);
  assert_true(tpf_cuda__log_parse_level("WARN", &l));
  assert_int_equal(l, TPF_CUDA_LOG_WARN);
  assert_true(tpf_cuda__log_parse_level("Trace", &l));
  assert_int_equal(l, TPF_CUDA_LOG_TRACE);
  assert_true(tpf_cuda__log_parse_level("NONE", &l));
  assert_int_equal(l, TPF_CUDA_LOG_NONE);
  assert_false(tpf_cuda__log_parse_level("verbose", &l));
  assert_false(tpf_cuda__log_parse_level("", &l));
  assert_int_equal(l, TPF_CUDA_LOG_NONE); /* untouched on failure */

  unsigned m = 0xdead;
  assert_true(tpf_cuda__log_parse_subsys("INIT,REG", &m));
  assert_int_equal(m, TPF_CUDA_LOG_INIT | TPF_CUDA_LOG_REG);
  assert_true(tpf_cuda__log_parse_subsys("exec,transport,status", &m));
  assert_int_equal(m, TPF_CUDA_LOG_EXEC | TPF_CUDA_LOG_TRANSPORT | TPF_CUDA_LOG_STATUS);
  assert_true(tpf_cuda__log_parse_subsys("ALL", &m));
  assert_int_equal(m, TPF_CUDA_LOG_ALL);
  assert_true(tpf_cuda__log_parse_subsys("^GEMM,ENV", &m));
  assert_int_equal(m, TPF_CUDA_LOG_ALL & ~(unsigned)(TPF_CUDA_LOG_GEMM | TPF_CUDA_LOG_ENV));
  m = 5;
  assert_false(tpf_cuda__log_parse_subsys("INIT,BOGUS", &m));
  assert_false(tpf_cuda__log_parse_subsys("INITX", &m));
  assert_int_equal(m, 5); /* untouched on failure */
  assert_string_equal(tpf_cuda__log_subsys_name(TPF_CUDA_LOG_BOOT), "BOOT");
  assert_string_equal(tpf_cuda__log_subsys_name(TPF_CUDA_LOG_REG | TPF_CUDA_LOG_BOOT), "?");
  assert_string_equal(tpf_cuda__log_level_name(TPF_CUDA_LOG_INFO), "INFO");
}

static void test_cuda_log__long_lines_are_cut(void **state) {
  (void)state;
  tpf_cuda__log_configure(TPF_CUDA_LOG_INFO, TPF_CUDA_LOG_ALL);
  static char big[5000];
  memset(big, 'x', sizeof big - 1);
  big[sizeof big - 1] = '\0';
  TPF_CUDA_INFO(REG, 12, "%s", big);
  const char *out = drain();
  const size_t n = strlen(out);
  assert_true(n > 1000 && n < sizeof big);
  assert_int_equal(strncmp(out, "tpflex:rank 12 INFO REG xxx", 27), 0);
  assert_string_equal(out + n - 4, "...\n");
  assert_true(strchr(out, '\n') == out + n - 1); /* one line */
}

enum { NTHREADS = 4, NLINES = 300 };

static void *writer(void *arg) {
  const int rank = (int)(intptr_t)arg;
  for (int i = 0; i < NLINES; i++)
    TPF_CUDA_INFO(EXEC, rank, "line %d of rank %d %s", i, rank, "payload-payload-payload");
  return NULL;
}

static void test_cuda_log__threads_write_whole_lines(void **state) {
  (void)state;
  tpf_cuda__log_configure(TPF_CUDA_LOG_INFO, TPF_CUDA_LOG_ALL);
  pthread_t t[NTHREADS];
  for (int r = 0; r < NTHREADS; r++)
    assert_int_equal(pthread_create(&t[r], NULL, writer, (void *)(intptr_t)r), 0);
  for (int r = 0; r < NTHREADS; r++)
    pthread_join(t[r], NULL);
  const char *out = drain();
  int count[NTHREADS] = {0};
  for (const char *p = out; *p != '\0';) {
    const char *nl = strchr(p, '\n');
    assert_non_null(nl);
    int rank = -1, i = -1, rank2 = -2;
    char tail[64];
    if (sscanf(p, "tpflex:rank %d INFO EXEC line %d of rank %d %63s", &rank, &i, &rank2, tail) !=
            4 ||
        rank != rank2 || rank < 0 || rank >= NTHREADS || strcmp(tail, "payload-payload-payload"))
      fail_msg("torn line: %.*s", (int)(nl - p), p);
    assert_int_equal(i, count[rank]); /* each thread's lines in its order */
    count[rank]++;
    p = nl + 1;
  }
  for (int r = 0; r < NTHREADS; r++)
    assert_int_equal(count[r], NLINES);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_cuda_log__levels_and_prefix, setup, teardown),
      cmocka_unit_test_setup_teardown(test_cuda_log__subsystem_filter, setup, teardown),
      cmocka_unit_test_setup_teardown(test_cuda_log__parsers, setup, teardown),
      cmocka_unit_test_setup_teardown(test_cuda_log__long_lines_are_cut, setup, teardown),
      cmocka_unit_test_setup_teardown(test_cuda_log__threads_write_whole_lines, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
