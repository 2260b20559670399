/* The simulator with ranks as processes (tpf_sim_backend_create), beyond the fault cases of
 * test_proc_faults_sim: bad arguments, what a process world refuses, a local failure in a
 * registration failing every rank (and the next registration pairing up again), a stopped peer
 * (alive: the bound applies, it is not called gone), the sweep of segments a killed job left, and
 * nothing left in /dev/shm. Ranks are forked by the launcher (harness/launcher.h) over its socket
 * bootstrap; each records into the launch's shared memory and the parent asserts. */
#define _DEFAULT_SOURCE
#define _POSIX_C_SOURCE 200809L
#include "launcher.h"
#include "tpf_test.h"
#include "tpflex/tpflex_sim.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { MAXP = 4, MSG = 400, NSLOT = 6 };

typedef struct {
  int32_t status[MAXP][NSLOT];
  double ms[MAXP][NSLOT];
  char msg[MAXP][NSLOT][MSG];
  _Atomic int32_t ran[MAXP][NSLOT];
  _Atomic int32_t stopped_pid;
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
  atomic_store(&sh->ran[rank][slot], 1);
}

/* Segments of the job whose rank 0 is pid (tests running in parallel have their own). */
static int count_shm(pid_t pid) {
  char prefix[48];
  snprintf(prefix, sizeof prefix, "tpflex-sim-%ld-", (long)pid);
  DIR *d = opendir("/dev/shm");
  if (!d) return 0;
  int n = 0;
  for (struct dirent *e; (e = readdir(d)) != NULL;)
    n += strncmp(e->d_name, prefix, strlen(prefix)) == 0;
  closedir(d);
  return n;
}

static tpf_comm_config ring_ag(uint64_t rows) {
  tpf_comm_config cfg = TPF_COMM_CONFIG_INIT;
  cfg.name = "fc1_fprop";
  cfg.algo = TPF_ALGO_RING;
  cfg.coll = TPF_COLL_AG;
  cfg.dtype = TPF_BF16;
  cfg.capacity.rows = rows;
  cfg.capacity.cols = 64;
  return cfg;
}

static tpf_status no_allgather(void *ctx, const void *s, void *r, size_t n) {
  (void)ctx, (void)s, (void)r, (void)n;
  return TPF_OK;
}
static tpf_status no_barrier(void *ctx) {
  (void)ctx;
  return TPF_OK;
}

/* ---- arguments: each refused with TPF_EINVAL naming the cause, nothing created ---- */

static void test_sim_procs__bad_arguments_are_refused(void **state) {
  (void)state;
  tpf_backend *be = (tpf_backend *)0x1;
  tpf_bootstrap boot = {2, 0, 0, no_allgather, no_barrier, NULL};
  TPF_ASSERT_STATUS(tpf_sim_backend_create(NULL, NULL, &be), TPF_EINVAL);
  assert_non_null(strstr(tpf_last_error(), "NULL bootstrap"));
  TPF_ASSERT_STATUS(tpf_sim_backend_create(NULL, &boot, NULL), TPF_EINVAL);
  boot.barrier = NULL;
  TPF_ASSERT_STATUS(tpf_sim_backend_create(NULL, &boot, &be), TPF_EINVAL);
  assert_non_null(strstr(tpf_last_error(), "barrier"));
  boot.barrier = no_barrier;
  boot.rank = 2;
  TPF_ASSERT_STATUS(tpf_sim_backend_create(NULL, &boot, &be), TPF_EINVAL);
  assert_non_null(strstr(tpf_last_error(), "rank 2 of 2"));
  boot.rank = 0;
  tpf_sim_config cfg = TPF_SIM_CONFIG_INIT;
  cfg.tp_size = 3;
  TPF_ASSERT_STATUS(tpf_sim_backend_create(&cfg, &boot, &be), TPF_EINVAL);
  assert_non_null(strstr(tpf_last_error(), "tp_size 3"));
  assert_ptr_equal(be, (tpf_backend *)0x1); /* out untouched */
  TPF_ASSERT_STATUS(tpf_sim_backend_destroy(NULL), TPF_EINVAL);
  tpf_sim_world *w = NULL;
  TPF_ASSERT_STATUS(tpf_sim_backend_world(NULL, &w), TPF_EINVAL);
}

/* A process world of one rank (P = 1: no peer, the bootstrap answers alone). */
static tpf_status solo_allgather(void *ctx, const void *s, void *r, size_t n) {
  (void)ctx;
  memcpy(r, s, n);
  return TPF_OK;
}

static tpf_status count_rank(tpf_backend *be, int rank, void *arg) {
  (void)be, (void)rank, (void)arg;
  return TPF_OK;
}

static tpf_status grab_rank(tpf_backend *be, int rank, void *arg) {
  (void)rank;
  *(tpf_backend **)arg = be;
  return TPF_OK;
}

static void test_sim_procs__world_kinds_are_kept_apart(void **state) {
  (void)state;
  tpf_bootstrap boot = {1, 0, 0, solo_allgather, no_barrier, NULL};
  tpf_backend *be = NULL;
  TPF_ASSERT_OK(tpf_sim_backend_create(NULL, &boot, &be));
  tpf_sim_world *w = NULL;
  TPF_ASSERT_OK(tpf_sim_backend_world(be, &w));
  TPF_ASSERT_STATUS(tpf_sim_run(w, count_rank, NULL), TPF_EINVAL);
  assert_non_null(strstr(tpf_last_error(), "tpf_sim_backend_create"));
  TPF_ASSERT_STATUS(tpf_sim_world_destroy(w), TPF_EINVAL);
  assert_non_null(strstr(tpf_last_error(), "tpf_sim_backend_destroy"));
  /* The world still works: a communicator, an operation, stats. */
  tpf_comm_config cfg = ring_ag(16);
  tpf_comm *c = NULL;
  TPF_ASSERT_OK(tpf_comm_create(be, &cfg, &c));
  TPF_ASSERT_OK(tpf_comm_destroy(c));
  tpf_sim_stats st;
  TPF_ASSERT_OK(tpf_sim_get_stats(w, &st));
  assert_int_equal(st.registrations, 1);
  TPF_ASSERT_OK(tpf_sim_backend_destroy(be));
  /* A threads world's rank is not a process backend: destroying it that way is refused. */
  tpf_sim_config tc = TPF_SIM_CONFIG_INIT;
  tc.tp_size = 1;
  tpf_sim_world *tw = NULL;
  TPF_ASSERT_OK(tpf_sim_world_create(&tc, &tw));
  tpf_backend *tb = NULL;
  TPF_ASSERT_OK(tpf_sim_run(tw, grab_rank, &tb));
  TPF_ASSERT_STATUS(tpf_sim_backend_destroy(tb), TPF_EINVAL);
  assert_non_null(strstr(tpf_last_error(), "tpf_sim_world_destroy"));
  TPF_ASSERT_OK(tpf_sim_world_destroy(tw));
}

/* ---- forked ranks ---- */

typedef struct {
  int stop_rank; /* stopped-peer case: the rank that stops itself */
} case_arg;

static bool rank_setup(const tpf_launch_rank *me, shared *sh, tpf_bootstrap *boot, tpf_backend **be,
                       unsigned timeout_ms) {
  double t0 = now_ms();
  tpf_status st = tpf_sockboot_create(me, 0, 20000, boot);
  if (st == TPF_OK) {
    st = tpf_sim_backend_create(NULL, boot, be);
    if (st != TPF_OK) tpf_sockboot_free(boot);
  }
  tpf_sim_world *w = NULL;
  if (st == TPF_OK && (st = tpf_sim_backend_world(*be, &w)) == TPF_OK)
    st = tpf_sim_set_timeout(w, timeout_ms);
  note(sh, me->rank, 0, st, t0);
  return st == TPF_OK;
}

/* Rank 1's reg_create fails (its fault plan): every rank's create fails naming rank 1, at once;
 * the next create pairs up (every rank's registration count stayed in step) and runs. */
static int local_failure_rank(const tpf_launch_rank *me, void *arg) {
  (void)arg;
  shared *sh = me->shared;
  tpf_bootstrap boot;
  tpf_backend *be = NULL;
  if (!rank_setup(me, sh, &boot, &be, 5000)) return 1;
  tpf_sim_world *w = NULL;
  tpf_sim_backend_world(be, &w);
  if (me->rank == 1) {
    tpf_sim_fault f = {1, TPF_ENOMEM, 0}; /* its first counted backend call: reg_create */
    tpf_sim_set_fault(w, &f);
  }
  tpf_comm_config cfg = ring_ag(8u * (uint64_t)me->nranks);
  tpf_comm *c = NULL;
  double t0 = now_ms();
  tpf_status st = tpf_comm_create(be, &cfg, &c);
  note(sh, me->rank, 1, st, t0);
  if (st == TPF_OK) tpf_comm_destroy(c);
  tpf_sim_set_fault(w, NULL);
  t0 = now_ms();
  st = tpf_comm_create(be, &cfg, &c);
  note(sh, me->rank, 2, st, t0);
  if (st == TPF_OK) {
    static uint16_t wgt[16 * 64], d[8 * MAXP * 16];
    tpf_matrix wm = {wgt, 16, 64, 64, TPF_BF16};
    tpf_matrix dm = {d, 8u * (uint64_t)me->nranks, 16, 16, TPF_BF16};
    t0 = now_ms();
    note(sh, me->rank, 3, tpf_ag_gemm(c, &wm, &dm, NULL), t0);
    tpf_comm_destroy(c);
  }
  tpf_sim_backend_destroy(be);
  tpf_sockboot_free(&boot);
  return 0;
}

static void test_sim_procs__local_failure_fails_every_rank(void **state) {
  (void)state;
  tpf_launch *l = NULL;
  TPF_ASSERT_OK(tpf_launch_fork(3, sizeof(shared), local_failure_rank, NULL, &l));
  int codes[3];
  TPF_ASSERT_OK(tpf_launch_wait(l, 60000, 0, codes));
  shared *sh = tpf_launch_shared(l);
  for (int r = 0; r < 3; r++) {
    assert_int_equal(codes[r], 0);
    for (int s = 0; s <= 3; s++)
      assert_int_equal(atomic_load(&sh->ran[r][s]), 1);
    assert_int_equal(sh->status[r][1], TPF_ENOMEM);
    if (r != 1) assert_non_null(strstr(sh->msg[r][1], "rank 1 failed"));
    assert_true(sh->ms[r][1] < 2000.0); /* at once, not at a timeout */
    assert_int_equal(sh->status[r][2], TPF_OK);
    assert_int_equal(sh->status[r][3], TPF_OK);
  }
  assert_int_equal(count_shm(tpf_launch_pid(l, 0)), 0);
  tpf_launch_free(l);
}

/* A stopped peer (SIGSTOP) is alive: its peers wait out the bound and then fail with
 * TPF_ETIMEOUT naming it, never earlier as "gone". The parent continues it afterwards. */
static int stopped_rank(const tpf_launch_rank *me, void *arg) {
  const case_arg *ca = arg;
  shared *sh = me->shared;
  tpf_bootstrap boot;
  tpf_backend *be = NULL;
  if (!rank_setup(me, sh, &boot, &be, 1500)) return 1;
  tpf_comm_config cfg = ring_ag(8u * (uint64_t)me->nranks);
  tpf_comm *c = NULL;
  double t0 = now_ms();
  tpf_status st = tpf_comm_create(be, &cfg, &c);
  note(sh, me->rank, 1, st, t0);
  static uint16_t wgt[16 * 64], d[8 * MAXP * 16];
  tpf_matrix wm = {wgt, 16, 64, 64, TPF_BF16};
  tpf_matrix dm = {d, 8u * (uint64_t)me->nranks, 16, 16, TPF_BF16};
  if (st == TPF_OK && me->rank == ca->stop_rank) {
    atomic_store(&sh->stopped_pid, (int32_t)getpid());
    raise(SIGSTOP); /* the parent continues it once the others are done */
  } else if (st == TPF_OK) {
    t0 = now_ms();
    note(sh, me->rank, 2, tpf_ag_gemm(c, &wm, &dm, NULL), t0);
  }
  if (c) tpf_comm_destroy(c);
  tpf_sim_backend_destroy(be);
  tpf_sockboot_free(&boot);
  return 0;
}

static void test_sim_procs__stopped_peer_runs_into_the_bound(void **state) {
  (void)state;
  case_arg ca = {2};
  tpf_launch *l = NULL;
  TPF_ASSERT_OK(tpf_launch_fork(3, sizeof(shared), stopped_rank, &ca, &l));
  shared *sh = tpf_launch_shared(l);
  const double t0 = now_ms();
  while ((!atomic_load(&sh->ran[0][2]) || !atomic_load(&sh->ran[1][2])) && now_ms() - t0 < 30000)
    usleep(10000);
  const pid_t stopped = (pid_t)atomic_load(&sh->stopped_pid);
  if (stopped > 0) kill(stopped, SIGCONT);
  int codes[3];
  TPF_ASSERT_OK(tpf_launch_wait(l, 30000, 0, codes));
  assert_true(stopped > 0);
  for (int r = 0; r < 2; r++) {
    assert_int_equal(codes[r], 0);
    assert_int_equal(sh->status[r][2], TPF_ETIMEOUT);
    assert_non_null(strstr(sh->msg[r][2], "rank 2"));
    assert_null(strstr(sh->msg[r][2], "gone"));
    assert_true(sh->ms[r][2] >= 1400.0 && sh->ms[r][2] < 6000.0);
  }
  tpf_launch_free(l);
}

/* A segment whose creator's pid no longer runs and that is old is swept by the next creation. */
static void test_sim_procs__stale_segments_are_swept(void **state) {
  (void)state;
  pid_t child = fork();
  if (child == 0) _exit(0);
  assert_true(child > 0);
  waitpid(child, NULL, 0); /* now a pid that no longer runs */
  char name[96], live[96];
  snprintf(name, sizeof name, "/tpflex-sim-%ld-deadbeef-0", (long)child);
  snprintf(live, sizeof live, "/tpflex-sim-%ld-deadbeef-0", (long)getpid());
  char fresh[96];
  snprintf(fresh, sizeof fresh, "/tpflex-sim-%ld-deadbeef-1", (long)child);
  /* An hour old: stale. The live job's and the fresh one (possibly a job of another pid
   * namespace between creation and unlink) are kept. */
  const struct timespec old[2] = {{time(NULL) - 3600, 0}, {time(NULL) - 3600, 0}};
  int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
  assert_true(fd >= 0);
  assert_int_equal(futimens(fd, old), 0);
  close(fd);
  fd = shm_open(live, O_RDWR | O_CREAT | O_EXCL, 0600);
  assert_true(fd >= 0);
  assert_int_equal(futimens(fd, old), 0);
  close(fd);
  fd = shm_open(fresh, O_RDWR | O_CREAT | O_EXCL, 0600);
  assert_true(fd >= 0);
  close(fd);
  tpf_bootstrap boot = {1, 0, 0, solo_allgather, no_barrier, NULL};
  tpf_backend *be = NULL;
  TPF_ASSERT_OK(tpf_sim_backend_create(NULL, &boot, &be));
  TPF_ASSERT_OK(tpf_sim_backend_destroy(be));
  fd = shm_open(name, O_RDWR, 0);
  const bool stale_left = fd >= 0;
  if (fd >= 0) close(fd);
  shm_unlink(name);
  fd = shm_open(live, O_RDWR, 0);
  const bool live_kept = fd >= 0;
  if (fd >= 0) close(fd);
  shm_unlink(live);
  fd = shm_open(fresh, O_RDWR, 0);
  const bool fresh_kept = fd >= 0;
  if (fd >= 0) close(fd);
  shm_unlink(fresh);
  assert_false(stale_left);
  assert_true(live_kept);
  assert_true(fresh_kept);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sim_procs__bad_arguments_are_refused),
      cmocka_unit_test(test_sim_procs__world_kinds_are_kept_apart),
      cmocka_unit_test(test_sim_procs__local_failure_fails_every_rank),
      cmocka_unit_test(test_sim_procs__stopped_peer_runs_into_the_bound),
      cmocka_unit_test(test_sim_procs__stale_segments_are_swept),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
