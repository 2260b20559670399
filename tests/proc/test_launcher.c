/* The launcher and the socket bootstrap (harness/launcher.c, sockboot.c), real processes, no GPU:
 * allgather and barrier results in rank order for P up to 8 and messages up to 200 KB, a peer
 * killed with SIGKILL (also rank 0, the hub), a peer that is alive but late, disagreeing calls, a
 * rank that never joins, ranks started by exec, the launcher's bound on stragglers, and nothing
 * left behind (the rendezvous socket is gone from /proc/net/unix), and results written by forked
 * ranks merged back into the caller's memory. Each case runs its ranks as
 * forked processes that record statuses, messages and times in the launch's shared memory; the
 * parent asserts. */
#define _DEFAULT_SOURCE
#define _POSIX_C_SOURCE 200809L
#include "launcher.h"
#include "tpf_test.h"

#include <signal.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

enum { MAXP = 8, MSG = 400 };

typedef struct {
  int status[MAXP][4];
  double ms[MAXP][4];
  char msg[MAXP][4][MSG];
  int failures[MAXP];
  char first_failure[MAXP][MSG];
} shared;

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e3 + (double)t.tv_nsec * 1e-6;
}

static void note(shared *sh, int rank, int slot, tpf_status st, double t0) {
  sh->status[rank][slot] = (int)st;
  sh->ms[rank][slot] = now_ms() - t0;
  snprintf(sh->msg[rank][slot], MSG, "%s", st == TPF_OK ? "" : tpf_last_error());
}

static void bad(shared *sh, int rank, const char *what) {
  if (sh->failures[rank]++ == 0) snprintf(sh->first_failure[rank], MSG, "%s", what);
}

/* Whether the rendezvous name is still bound (Linux lists abstract sockets as "@name"). */
static bool socket_listed(const char *addr) {
  FILE *f = fopen("/proc/net/unix", "r");
  if (!f) return false;
  char line[512];
  bool found = false;
  while (!found && fgets(line, sizeof line, f))
    found = strstr(line, addr) != NULL;
  fclose(f);
  return found;
}

static void run(int P, tpf_launch_fn fn, void *arg, uint64_t bound_ms, int *codes, shared **sh,
                tpf_launch **out) {
  tpf_launch *l = NULL;
  TPF_ASSERT_OK(tpf_launch_fork(P, sizeof(shared), fn, arg, &l));
  *sh = tpf_launch_shared(l);
  TPF_ASSERT_OK(tpf_launch_wait(l, bound_ms, 0, codes));
  *out = l;
}

/* ---- allgather and barrier ---- */

static unsigned char pattern(int rank, size_t i, size_t size) {
  return (unsigned char)(rank * 37 + (int)(i % 251) + (int)(size % 13));
}

static int gather_rank(const tpf_launch_rank *me, void *arg) {
  (void)arg;
  shared *sh = me->shared;
  tpf_bootstrap b;
  tpf_status st = tpf_sockboot_create(me, 0, 10000, &b);
  if (st != TPF_OK) {
    bad(sh, me->rank, tpf_last_error());
    return 1;
  }
  if (b.tp_size != me->nranks || b.rank != me->rank) bad(sh, me->rank, "tp_size/rank");
  static const size_t sizes[] = {0, 1, 7, 48, 4096, 200000};
  for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
    const size_t n = sizes[si];
    unsigned char *send = malloc(n + 1), *recv = malloc(n * (size_t)me->nranks + 1);
    for (size_t i = 0; i < n; i++)
      send[i] = pattern(me->rank, i, n);
    st = b.allgather(b.ctx, n ? send : NULL, n ? recv : NULL, n);
    if (st != TPF_OK) bad(sh, me->rank, tpf_last_error());
    for (int q = 0; st == TPF_OK && q < me->nranks; q++)
      for (size_t i = 0; i < n; i++)
        if (recv[(size_t)q * n + i] != pattern(q, i, n)) {
          bad(sh, me->rank, "allgather bytes out of rank order");
          break;
        }
    free(send);
    free(recv);
  }
  for (int i = 0; i < 50; i++)
    if (b.barrier(b.ctx) != TPF_OK) bad(sh, me->rank, tpf_last_error());
  tpf_sockboot_free(&b);
  tpf_sockboot_free(&b); /* a second free is a no-op */
  return sh->failures[me->rank] ? 1 : 0;
}

static void test_launcher__allgather_and_barrier_in_rank_order(void **state) {
  (void)state;
  static const int Ps[] = {1, 2, 3, 5, 8};
  for (size_t pi = 0; pi < sizeof Ps / sizeof Ps[0]; pi++) {
    const int P = Ps[pi];
    int codes[MAXP];
    shared *sh = NULL;
    tpf_launch *l = NULL;
    run(P, gather_rank, NULL, 60000, codes, &sh, &l);
    for (int r = 0; r < P; r++)
      if (codes[r] != 0 || sh->failures[r])
        fail_msg("P=%d rank %d: exit %d, %d failures, first: %s", P, r, codes[r], sh->failures[r],
                 sh->first_failure[r]);
    assert_false(socket_listed(tpf_launch_addr(l) + 1));
    tpf_launch_free(l);
  }
}

/* ---- a peer killed with SIGKILL ---- */

typedef struct {
  int victim;
} kill_arg;

static int kill_rank(const tpf_launch_rank *me, void *arg) {
  const kill_arg *ka = arg;
  shared *sh = me->shared;
  tpf_bootstrap b;
  if (tpf_sockboot_create(me, 0, 10000, &b) != TPF_OK) {
    bad(sh, me->rank, tpf_last_error());
    return 1;
  }
  int x = me->rank, all[MAXP];
  double t0 = now_ms();
  note(sh, me->rank, 0, b.allgather(b.ctx, &x, all, sizeof x), t0);
  if (me->rank == ka->victim) kill(getpid(), SIGKILL);
  t0 = now_ms();
  note(sh, me->rank, 1, b.allgather(b.ctx, &x, all, sizeof x), t0);
  /* Later calls fail at once with the same reason (collective cleanup must not wait again). */
  t0 = now_ms();
  note(sh, me->rank, 2, b.barrier(b.ctx), t0);
  tpf_sockboot_free(&b);
  return 0;
}

static void check_killed(int P, int victim) {
  kill_arg ka = {victim};
  int codes[MAXP];
  shared *sh = NULL;
  tpf_launch *l = NULL;
  run(P, kill_rank, &ka, 30000, codes, &sh, &l);
  char who[16];
  snprintf(who, sizeof who, "rank %d", victim);
  for (int r = 0; r < P; r++) {
    assert_int_equal(sh->status[r][0], TPF_OK);
    if (r == victim) {
      assert_int_equal(codes[r], 128 + SIGKILL);
      continue;
    }
    assert_int_equal(codes[r], 0);
    if (sh->status[r][1] != TPF_ETIMEOUT || !strstr(sh->msg[r][1], who))
      fail_msg("P=%d victim %d, rank %d: %s: %s", P, victim, r,
               tpf_status_name((tpf_status)sh->status[r][1]), sh->msg[r][1]);
    /* Seen when the connection closes, long before the 10 s timeout. */
    assert_true(sh->ms[r][1] < 3000.0);
    assert_int_equal(sh->status[r][2], TPF_ETIMEOUT);
    assert_non_null(strstr(sh->msg[r][2], who));
    assert_true(sh->ms[r][2] < 500.0);
  }
  print_message("P=%d, rank %d killed; rank %d: %s (%.1f ms)\n", P, victim, victim ? 0 : 1,
                sh->msg[victim ? 0 : 1][1], sh->ms[victim ? 0 : 1][1]);
  assert_false(socket_listed(tpf_launch_addr(l) + 1));
  tpf_launch_free(l);
}

static void test_launcher__killed_peer_fails_every_rank_at_once(void **state) {
  (void)state;
  check_killed(4, 2);
  check_killed(3, 1);
}

static void test_launcher__killed_hub_fails_every_rank_at_once(void **state) {
  (void)state;
  check_killed(4, 0);
}

/* ---- a peer that is alive but late ---- */

static int late_rank(const tpf_launch_rank *me, void *arg) {
  (void)arg;
  shared *sh = me->shared;
  tpf_bootstrap b;
  if (tpf_sockboot_create(me, 0, 10000, &b) != TPF_OK) {
    bad(sh, me->rank, tpf_last_error());
    return 1;
  }
  if (tpf_sockboot_set_timeout(&b, 300) != TPF_OK) bad(sh, me->rank, tpf_last_error());
  if (me->rank == 1) {
    struct timespec t = {1, 200 * 1000 * 1000};
    nanosleep(&t, NULL);
  }
  int x = me->rank, all[MAXP];
  double t0 = now_ms();
  note(sh, me->rank, 0, b.allgather(b.ctx, &x, all, sizeof x), t0);
  tpf_sockboot_free(&b);
  return 0;
}

static void test_launcher__late_peer_times_out_within_the_bound(void **state) {
  (void)state;
  int codes[MAXP];
  shared *sh = NULL;
  tpf_launch *l = NULL;
  run(3, late_rank, NULL, 30000, codes, &sh, &l);
  for (int r = 0; r < 3; r++) {
    assert_int_equal(codes[r], 0);
    if (sh->status[r][0] != TPF_ETIMEOUT)
      fail_msg("rank %d: %s: %s", r, tpf_status_name((tpf_status)sh->status[r][0]), sh->msg[r][0]);
  }
  /* Rank 0 names the late rank, within the 300 ms bound; rank 2 hears it from rank 0. */
  assert_non_null(strstr(sh->msg[0][0], "rank(s) 1"));
  assert_non_null(strstr(sh->msg[2][0], "rank(s) 1"));
  assert_true(sh->ms[0][0] >= 290.0 && sh->ms[0][0] < 1500.0);
  assert_true(sh->ms[2][0] < 1500.0);
  print_message("late rank: rank 0: %s\nrank 1 (late): %s\n", sh->msg[0][0], sh->msg[1][0]);
  tpf_launch_free(l);
}

/* ---- calls that disagree ---- */

static int mismatch_rank(const tpf_launch_rank *me, void *arg) {
  (void)arg;
  shared *sh = me->shared;
  tpf_bootstrap b;
  if (tpf_sockboot_create(me, 0, 10000, &b) != TPF_OK) {
    bad(sh, me->rank, tpf_last_error());
    return 1;
  }
  uint64_t x[2] = {1, 2}, all[2 * MAXP];
  double t0 = now_ms();
  note(sh, me->rank, 0, b.allgather(b.ctx, x, all, me->rank == 1 ? 8 : 16), t0);
  tpf_sockboot_free(&b);
  return 0;
}

static void test_launcher__disagreeing_calls_fail_every_rank(void **state) {
  (void)state;
  int codes[MAXP];
  shared *sh = NULL;
  tpf_launch *l = NULL;
  run(3, mismatch_rank, NULL, 30000, codes, &sh, &l);
  for (int r = 0; r < 3; r++) {
    assert_int_equal(codes[r], 0);
    if (sh->status[r][0] != TPF_EMISMATCH || !strstr(sh->msg[r][0], "rank 1"))
      fail_msg("rank %d: %s: %s", r, tpf_status_name((tpf_status)sh->status[r][0]), sh->msg[r][0]);
  }
  tpf_launch_free(l);
}

/* ---- a rank that never joins ---- */

static int nojoin_rank(const tpf_launch_rank *me, void *arg) {
  (void)arg;
  shared *sh = me->shared;
  if (me->rank == 2) return 0; /* exits without joining */
  tpf_bootstrap b;
  double t0 = now_ms();
  tpf_status st = tpf_sockboot_create(me, 0, 400, &b);
  note(sh, me->rank, 0, st, t0);
  if (st == TPF_OK) tpf_sockboot_free(&b);
  return 0;
}

static void test_launcher__rank_that_never_joins_fails_setup(void **state) {
  (void)state;
  int codes[MAXP];
  shared *sh = NULL;
  tpf_launch *l = NULL;
  run(3, nojoin_rank, NULL, 30000, codes, &sh, &l);
  for (int r = 0; r < 2; r++) {
    assert_int_equal(codes[r], 0);
    if (sh->status[r][0] != TPF_ETIMEOUT || !strstr(sh->msg[r][0], "rank(s) 2"))
      fail_msg("rank %d: %s: %s", r, tpf_status_name((tpf_status)sh->status[r][0]), sh->msg[r][0]);
    assert_true(sh->ms[r][0] < 2000.0);
  }
  assert_false(socket_listed(tpf_launch_addr(l) + 1));
  tpf_launch_free(l);
}

/* ---- ranks started by exec ---- */

static int exec_child(void) {
  tpf_launch_rank me;
  if (tpf_launch_rank_from_env(&me) != TPF_OK) {
    fprintf(stderr, "exec child: %s\n", tpf_last_error());
    return 2;
  }
  tpf_bootstrap b;
  if (tpf_sockboot_create(&me, 0, 10000, &b) != TPF_OK) {
    fprintf(stderr, "exec child %d: %s\n", me.rank, tpf_last_error());
    return 3;
  }
  int x = 1000 + me.rank, all[MAXP];
  tpf_status st = b.allgather(b.ctx, &x, all, sizeof x);
  int rc = st == TPF_OK ? 0 : 4;
  for (int q = 0; rc == 0 && q < me.nranks; q++)
    if (all[q] != 1000 + q) rc = 5;
  if (rc == 0 && b.barrier(b.ctx) != TPF_OK) rc = 6;
  tpf_sockboot_free(&b);
  return rc;
}

static void test_launcher__exec_mode_ranks_rendezvous(void **state) {
  (void)state;
  char *argv[] = {"/proc/self/exe", "--exec-child", NULL};
  tpf_launch *l = NULL;
  TPF_ASSERT_OK(tpf_launch_exec(4, argv, &l));
  int codes[MAXP];
  TPF_ASSERT_OK(tpf_launch_wait(l, 30000, 5000, codes));
  for (int r = 0; r < 4; r++)
    if (codes[r] != 0) fail_msg("exec rank %d exited %d", r, codes[r]);
  assert_false(socket_listed(tpf_launch_addr(l) + 1));
  tpf_launch_free(l);
  char *missing[] = {"no-such-command-tpflex", NULL};
  TPF_ASSERT_STATUS(tpf_launch_exec(2, missing, &l), TPF_EINVAL);
}

/* ---- the launcher's own bounds ---- */

static int straggler_rank(const tpf_launch_rank *me, void *arg) {
  (void)arg;
  if (me->rank == 0) return 3;
  struct timespec t = {30, 0};
  nanosleep(&t, NULL);
  return 0;
}

static void test_launcher__wait_kills_stragglers(void **state) {
  (void)state;
  int codes[MAXP];
  tpf_launch *l = NULL;
  TPF_ASSERT_OK(tpf_launch_fork(2, 0, straggler_rank, NULL, &l));
  double t0 = now_ms();
  TPF_ASSERT_STATUS(tpf_launch_wait(l, 300, 0, codes), TPF_ETIMEOUT);
  assert_true(now_ms() - t0 < 3000.0);
  assert_int_equal(codes[0], 3);
  assert_int_equal(codes[1], 128 + SIGKILL);
  assert_non_null(strstr(tpf_last_error(), "rank(s) 1"));
  tpf_launch_free(l);
  /* With a grace period, an abnormal exit ends the launch without waiting for the bound. */
  TPF_ASSERT_OK(tpf_launch_fork(2, 0, straggler_rank, NULL, &l));
  t0 = now_ms();
  TPF_ASSERT_STATUS(tpf_launch_wait(l, 0, 200, codes), TPF_ETIMEOUT);
  assert_true(now_ms() - t0 < 3000.0);
  assert_non_null(strstr(tpf_last_error(), "rank 0 ended abnormally"));
  tpf_launch_free(l);
  /* A launch freed while running kills its ranks. */
  TPF_ASSERT_OK(tpf_launch_fork(2, 0, straggler_rank, NULL, &l));
  pid_t p1 = tpf_launch_pid(l, 1);
  assert_true(p1 > 0);
  tpf_launch_free(l);
  assert_int_equal(kill(p1, 0), -1);
}

/* ---- results written by the ranks, merged back (fork mode for code written for threads) ---- */

typedef struct {
  int cases[MAXP];
  char first[MAXP][32];
  int same;     /* every rank writes the same value: no conflict */
  int conflict; /* ranks write different values when asked to */
  int ask_conflict;
  int victim;
} results;

static int results_rank(const tpf_launch_rank *me, void *arg) {
  results *res = arg;
  res->cases[me->rank] = 10 * me->rank + 1;
  snprintf(res->first[me->rank], sizeof res->first[me->rank], "rank %d was here", me->rank);
  res->same = 5;
  if (res->ask_conflict) res->conflict = me->rank + 1;
  if (me->rank == res->victim) kill(getpid(), SIGKILL); /* dies before returning */
  return 0;
}

static void test_launcher__results_merge_back(void **state) {
  (void)state;
  results *res = calloc(1, sizeof *res);
  res->victim = 2;
  tpf_launch *l = NULL;
  TPF_ASSERT_OK(tpf_launch_fork_merging(4, 0, results_rank, res, res, 0, &l));
  int codes[MAXP];
  TPF_ASSERT_OK(tpf_launch_wait(l, 30000, 0, codes));
  bool merged[MAXP];
  TPF_ASSERT_OK(tpf_launch_merge(l, res, merged));
  for (int r = 0; r < 4; r++) {
    assert_int_equal(merged[r], r != 2);
    assert_int_equal(res->cases[r], r == 2 ? 0 : 10 * r + 1);
    if (r != 2) assert_non_null(strstr(res->first[r], "was here"));
  }
  assert_int_equal(res->same, 5);
  assert_int_equal(codes[2], 128 + SIGKILL);
  tpf_launch_free(l);
  /* Different values in one byte: refused, nothing changes. */
  memset(res, 0, sizeof *res);
  res->ask_conflict = 1;
  res->victim = -1;
  TPF_ASSERT_OK(tpf_launch_fork_merging(3, 0, results_rank, res, res, sizeof *res, &l));
  TPF_ASSERT_OK(tpf_launch_wait(l, 30000, 0, codes));
  TPF_ASSERT_STATUS(tpf_launch_merge(l, res, NULL), TPF_EINVAL);
  assert_non_null(strstr(tpf_last_error(), "different values"));
  assert_int_equal(res->cases[1], 0);
  tpf_launch_free(l);
  free(res);
  /* A stack address has no extent; a large (mmap'd) heap block has one. */
  results local;
  memset(&local, 0, sizeof local);
  TPF_ASSERT_STATUS(tpf_launch_fork_merging(2, 0, results_rank, &local, &local, 0, &l), TPF_EINVAL);
  size_t n = 0;
  void *big = calloc(1, 4u << 20);
  TPF_ASSERT_OK(tpf_launch_heap_extent(big, &n));
  assert_true(n >= (4u << 20));
  free(big);
}

/* A launcher that dies takes its ranks with it. */
static int sleeper_rank(const tpf_launch_rank *me, void *arg) {
  (void)me;
  (void)arg;
  struct timespec t = {30, 0};
  nanosleep(&t, NULL);
  return 0;
}

/* The doomed launcher's ranks: process ids and start times (a pid alone may be reused by
 * another process once the rank is gone and reaped, on a busy machine within seconds). */
typedef struct {
  pid_t pid[2];
  unsigned long long start[2];
} doomed_ranks;

/* Field 22 of /proc/pid/stat (the start time in clock ticks since boot) and the state letter;
 * false when the process does not exist. */
static bool proc_stat(pid_t pid, char *state, unsigned long long *start) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%ld/stat", (long)pid);
  FILE *f = fopen(path, "r");
  if (!f) return false;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  const char *p = strrchr(buf, ')'); /* the name may hold spaces and parentheses */
  if (!p || p[1] != ' ') return false;
  *state = p[2];
  *start = 0;
  p += 2; /* field 3, the state */
  for (int field = 3; field < 22 && p; field++) {
    p = strchr(p, ' ');
    if (p) p++;
  }
  if (p) *start = strtoull(p, NULL, 10);
  return true;
}

static int doomed_launcher(void *arg) {
  doomed_ranks *d = arg;
  tpf_launch *l = NULL;
  if (tpf_launch_fork(2, 0, sleeper_rank, NULL, &l) != TPF_OK) return 1;
  for (int r = 0; r < 2; r++) {
    char state = 0;
    d->pid[r] = tpf_launch_pid(l, r);
    if (!proc_stat(d->pid[r], &state, &d->start[r])) d->start[r] = 0;
  }
  kill(getpid(), SIGKILL);
  return 0;
}

/* Gone, a zombie waiting for whoever adopted it, or its pid taken by another process. */
static bool process_gone(const doomed_ranks *d, int r) {
  char state = 0;
  unsigned long long start = 0;
  if (!proc_stat(d->pid[r], &state, &start)) return true;
  return state == 'Z' || state == 'X' || start != d->start[r];
}

static void test_launcher__ranks_die_with_their_launcher(void **state) {
  (void)state;
  doomed_ranks *d = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  assert_true(d != MAP_FAILED);
  memset(d, 0, sizeof *d);
  assert_int_equal(tpf_launch_in_child(doomed_launcher, d), 128 + SIGKILL);
  assert_true(d->pid[0] > 0 && d->pid[1] > 0 && d->start[0] > 0 && d->start[1] > 0);
  const double t0 = now_ms();
  while ((!process_gone(d, 0) || !process_gone(d, 1)) && now_ms() - t0 < 5000.0) {
    struct timespec t = {0, 10 * 1000 * 1000};
    nanosleep(&t, NULL);
  }
  assert_true(process_gone(d, 0));
  assert_true(process_gone(d, 1));
  munmap(d, 4096);
}

static int seven(void *arg) {
  return *(int *)arg + 7;
}

static void test_launcher__helpers(void **state) {
  (void)state;
  int x = 35;
  assert_int_equal(tpf_launch_in_child(seven, &x), 42);
  assert_int_equal(tpf_launch_device(5, 2), 1);
  assert_int_equal(tpf_launch_device(5, 8), 5);
  assert_int_equal(tpf_launch_device(3, 0), 0);
  tpf_launch *l = NULL;
  TPF_ASSERT_STATUS(tpf_launch_fork(0, 0, straggler_rank, NULL, &l), TPF_EINVAL);
  TPF_ASSERT_STATUS(tpf_launch_fork(TPF_MAX_RANKS + 1, 0, straggler_rank, NULL, &l), TPF_EINVAL);
  unsetenv(TPF_LAUNCH_ENV_RANK);
  tpf_launch_rank me;
  TPF_ASSERT_STATUS(tpf_launch_rank_from_env(&me), TPF_EINVAL);
  tpf_bootstrap b;
  memset(&me, 0, sizeof me);
  me.nranks = 2;
  me.rank = 2;
  TPF_ASSERT_STATUS(tpf_sockboot_create(&me, 0, 100, &b), TPF_EINVAL);
  TPF_ASSERT_STATUS(tpf_sockboot_set_timeout(NULL, 5), TPF_EINVAL);
  /* One rank needs nobody. */
  me.nranks = 1;
  me.rank = 0;
  me.listen_fd = -1;
  snprintf(me.addr, sizeof me.addr, "@tpflex-test-single-%ld", (long)getpid());
  TPF_ASSERT_OK(tpf_sockboot_create(&me, 3, 100, &b));
  assert_int_equal(b.device, 3);
  int v = 9, all = 0;
  TPF_ASSERT_OK(b.allgather(b.ctx, &v, &all, sizeof v));
  assert_int_equal(all, 9);
  TPF_ASSERT_OK(b.barrier(b.ctx));
  tpf_sockboot_free(&b);
}

int main(int argc, char **argv) {
  if (argc > 1 && !strcmp(argv[1], "--exec-child")) return exec_child();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_launcher__allgather_and_barrier_in_rank_order),
      cmocka_unit_test(test_launcher__killed_peer_fails_every_rank_at_once),
      cmocka_unit_test(test_launcher__killed_hub_fails_every_rank_at_once),
      cmocka_unit_test(test_launcher__late_peer_times_out_within_the_bound),
      cmocka_unit_test(test_launcher__disagreeing_calls_fail_every_rank),
      cmocka_unit_test(test_launcher__rank_that_never_joins_fails_setup),
      cmocka_unit_test(test_launcher__exec_mode_ranks_rendezvous),
      cmocka_unit_test(test_launcher__wait_kills_stragglers),
      cmocka_unit_test(test_launcher__results_merge_back),
      cmocka_unit_test(test_launcher__ranks_die_with_their_launcher),
      cmocka_unit_test(test_launcher__helpers),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
