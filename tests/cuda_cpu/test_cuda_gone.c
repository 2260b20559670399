/* Naming a peer whose process exited (backend_cuda/cuda_hostsync.c, tpf_cuda__peer_gone and
 * tpf_cuda__blame_gone), on the CPU with forked stand-in peers: a running peer is not named; a
 * killed one is, whether its parent has reaped it or it is still a zombie; a peer on another host
 * or in this process is never checked; a TPF_ETIMEOUT's detail gets the dead rank appended, any
 * other status is left as it was. */
#define _POSIX_C_SOURCE 200809L
#include "cuda_state.h"
#include "tpf_test.h"

#include <signal.h>
#include <stdio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* A child that sleeps until killed. */
static pid_t sleeper(void) {
  pid_t pid = fork();
  if (pid == 0) {
    for (;;)
      pause();
  }
  assert_true(pid > 0);
  return pid;
}

/* Rank 0 is this process; ranks 1..3 the given pids, all on host 7. */
static void setup(tpf_cuda_backend *b, const pid_t *pids) {
  memset(b, 0, sizeof *b);
  b->base.tp_size = 4;
  b->base.rank = 0;
  b->peers[0] = (tpf_cuda_peer_info){.rank = 0, .host = 7, .pid = (int64_t)getpid()};
  for (int q = 1; q < 4; q++)
    b->peers[q] = (tpf_cuda_peer_info){.rank = q, .host = 7, .pid = (int64_t)pids[q - 1]};
}

static void test_running_peers_not_named(void **state) {
  (void)state;
  pid_t p[3] = {sleeper(), sleeper(), sleeper()};
  tpf_cuda_backend b;
  setup(&b, p);
  int64_t pid = -5;
  assert_int_equal(tpf_cuda__peer_gone(b.peers, b.base.tp_size, b.base.rank, &pid), -1);
  assert_int_equal(pid, -5);
  tpf_set_error(TPF_ETIMEOUT, "rank 0: RECV waiting for rank 3 exceeded 10 ms");
  TPF_ASSERT_STATUS(tpf_cuda__blame_gone(b.peers, b.base.tp_size, b.base.rank, TPF_ETIMEOUT),
                    TPF_ETIMEOUT);
  assert_string_equal(tpf_last_error(), "rank 0: RECV waiting for rank 3 exceeded 10 ms");
  for (int i = 0; i < 3; i++) {
    kill(p[i], SIGKILL);
    waitpid(p[i], NULL, 0);
  }
}

static void test_killed_peer_named(void **state) {
  (void)state;
  pid_t p[3] = {sleeper(), sleeper(), sleeper()};
  tpf_cuda_backend b;
  setup(&b, p);
  /* Rank 2 killed and still a zombie (not reaped): named. */
  kill(p[1], SIGKILL);
  int64_t pid = 0;
  int q = -1;
  for (int i = 0; i < 200 && q < 0; i++) { /* the kill is asynchronous */
    q = tpf_cuda__peer_gone(b.peers, b.base.tp_size, b.base.rank, &pid);
    if (q < 0) {
      const struct timespec ts = {0, 5000000};
      nanosleep(&ts, NULL);
    }
  }
  assert_int_equal(q, 2);
  assert_int_equal(pid, (int64_t)p[1]);
  /* The detail of a timeout that blamed a live peer (a cascade) gets the dead one. */
  tpf_set_error(TPF_ETIMEOUT, "rank 0: RECV waiting for rank 3 exceeded 10 ms");
  TPF_ASSERT_STATUS(tpf_cuda__blame_gone(b.peers, b.base.tp_size, b.base.rank, TPF_ETIMEOUT),
                    TPF_ETIMEOUT);
  char want[160];
  snprintf(want, sizeof want,
           "rank 0: RECV waiting for rank 3 exceeded 10 ms; rank 2's process (pid %lld) has "
           "exited",
           (long long)p[1]);
  assert_string_equal(tpf_last_error(), want);
  /* Other statuses are left alone. */
  tpf_set_error(TPF_EMISMATCH, "rows differ");
  TPF_ASSERT_STATUS(tpf_cuda__blame_gone(b.peers, b.base.tp_size, b.base.rank, TPF_EMISMATCH),
                    TPF_EMISMATCH);
  assert_string_equal(tpf_last_error(), "rows differ");
  TPF_ASSERT_OK(tpf_cuda__blame_gone(b.peers, b.base.tp_size, b.base.rank, TPF_OK));
  /* Reaped: still named (ESRCH). */
  waitpid(p[1], NULL, 0);
  assert_int_equal(tpf_cuda__peer_gone(b.peers, b.base.tp_size, b.base.rank, &pid), 2);
  /* The lowest dead rank wins. */
  kill(p[0], SIGKILL);
  waitpid(p[0], NULL, 0);
  assert_int_equal(tpf_cuda__peer_gone(b.peers, b.base.tp_size, b.base.rank, &pid), 1);
  assert_int_equal(pid, (int64_t)p[0]);
  /* A peer on another host, or in this very process, is never checked. */
  b.peers[1].host = 8;
  b.peers[2].pid = b.peers[0].pid;
  assert_int_equal(tpf_cuda__peer_gone(b.peers, b.base.tp_size, b.base.rank, &pid), -1);
  /* Nor is anything outside the group. */
  b.base.rank = 4;
  assert_int_equal(tpf_cuda__peer_gone(b.peers, b.base.tp_size, b.base.rank, &pid), -1);
  kill(p[2], SIGKILL);
  waitpid(p[2], NULL, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_running_peers_not_named),
      cmocka_unit_test(test_killed_peer_named),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
