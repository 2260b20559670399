/* Ranks as processes: the launcher (launcher.h), which starts P ranks (fork, or fork + exec)
 * and supervises them: bounded waits, exit codes, a rank that dies with its launcher, the
 * three-way merge of forked ranks' results. The ranks meet through the socket bootstrap
 * (sockboot.c), whose rendezvous socket the launcher creates before starting any rank.
 */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS */
#define _POSIX_C_SOURCE 200809L
#include "launcher.h"

#include "internal.h" /* TPF_RETURN_IF, TPF_CHECK */

#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* LeakSanitizer asks this at exit (a weak hook of its runtime; unused elsewhere). A forked rank
 * exits holding its copy of the parent's heap, which is not a leak of its own: its leak check
 * is off, the parent's stays on. exit() (not _exit) still runs gcov's and CUDA's atexit work. */
static volatile int in_child;
__attribute__((visibility("default"), used)) int __lsan_is_turned_off(void);
int __lsan_is_turned_off(void) {
  return in_child;
}

extern char **environ;

/* ---- launcher ---- */

struct tpf_launch {
  int nranks;
  void *merge_arg; /* tpf_launch_fork_merging: the caller's argument, and its extent */
  size_t merge_bytes;
  unsigned char *snaps; /* nranks copies of merge_bytes, then one "returned" byte per rank */
  size_t snaps_bytes;
  pid_t pids[TPF_MAX_RANKS];
  bool reaped[TPF_MAX_RANKS];
  int codes[TPF_MAX_RANKS];
  int listen_fd;
  char addr[TPF_LAUNCH_ADDR_BYTES];
  void *shared;
  size_t shared_bytes;
};

static tpf_status launch_new(int nranks, size_t shared_bytes, tpf_launch **out) {
  TPF_RETURN_IF(nranks < 1 || nranks > TPF_MAX_RANKS, TPF_EINVAL,
                "launcher: %d ranks outside 1..%d", nranks, TPF_MAX_RANKS);
  tpf_launch *l = calloc(1, sizeof *l);
  TPF_RETURN_IF(l == NULL, TPF_ENOMEM, "launcher: out of memory");
  l->nranks = nranks;
  l->listen_fd = -1;
  for (int r = 0; r < nranks; r++)
    l->pids[r] = -1;
  if (shared_bytes > 0) {
    void *p = mmap(NULL, shared_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      free(l);
      return tpf_set_error(TPF_ENOMEM, "launcher: mmap of %zu shared bytes failed: %s",
                           shared_bytes, strerror(errno));
    }
    l->shared = p;
    l->shared_bytes = shared_bytes;
  }
  static _Atomic unsigned counter;
  snprintf(l->addr, sizeof l->addr, "@tpflex-boot-%ld-%u-%llx", (long)getpid(),
           atomic_fetch_add(&counter, 1u),
           (unsigned long long)(tpf_sockboot_now_ns() & 0xFFFFFFFFull));
  l->listen_fd = tpf_sockboot_listen(l->addr);
  if (l->listen_fd < 0) {
    tpf_status st = tpf_set_error(TPF_EBACKEND, "launcher: cannot listen on '%s': %s", l->addr,
                                  strerror(errno));
    tpf_launch_free(l);
    return st;
  }
  *out = l;
  return TPF_OK;
}

/* After the ranks started, only rank 0 holds the listening socket: when it closes it (or dies),
 * the name is gone and pending connections are refused. */
static void launch_started(tpf_launch *l) {
  if (l->listen_fd >= 0) close(l->listen_fd);
  l->listen_fd = -1;
}

static void kill_started(tpf_launch *l, int n) {
  for (int r = 0; r < n; r++)
    if (l->pids[r] > 0 && !l->reaped[r]) {
      kill(l->pids[r], SIGKILL);
      waitpid(l->pids[r], NULL, 0);
      l->reaped[r] = true;
    }
}

/* In a rank, first: a rank dies with its launcher (SIGKILL when the parent goes, e.g. killed by
 * a harness's timeout), so no rank outlives it holding a GPU or waiting for peers. Kept across
 * exec. A parent already gone before the prctl is seen by getppid. */
static void orphan_guard(pid_t parent) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(127);
}

static void rank_of(const tpf_launch *l, int r, tpf_launch_rank *me) {
  memset(me, 0, sizeof *me);
  me->rank = r;
  me->nranks = l->nranks;
  snprintf(me->addr, sizeof me->addr, "%s", l->addr);
  me->listen_fd = r == 0 ? l->listen_fd : -1;
  me->shared = l->shared;
  me->shared_bytes = l->shared_bytes;
}

static tpf_status fork_common(int nranks, size_t shared_bytes, tpf_launch_fn fn, void *arg,
                              void *merge_arg, size_t merge_bytes, tpf_launch **out) {
  TPF_RETURN_IF(fn == NULL || out == NULL, TPF_EINVAL, "tpf_launch_fork: NULL argument");
  tpf_launch *l = NULL;
  TPF_CHECK(launch_new(nranks, shared_bytes, &l));
  if (merge_arg != NULL && merge_bytes > 0) {
    l->snaps_bytes = merge_bytes * (size_t)nranks + (size_t)nranks;
    void *p = mmap(NULL, l->snaps_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      tpf_status st =
          tpf_set_error(TPF_ENOMEM, "launcher: mmap of %zu bytes for results failed: %s",
                        l->snaps_bytes, strerror(errno));
      l->snaps_bytes = 0;
      tpf_launch_free(l);
      return st;
    }
    l->snaps = p;
    l->merge_arg = merge_arg;
    l->merge_bytes = merge_bytes;
  }
  const pid_t parent = getpid();
  for (int r = 0; r < nranks; r++) {
    fflush(NULL); /* buffered output would be written by every child too */
    pid_t pid = fork();
    if (pid < 0) {
      tpf_status st =
          tpf_set_error(TPF_EBACKEND, "launcher: fork of rank %d failed: %s", r, strerror(errno));
      kill_started(l, r);
      tpf_launch_free(l);
      return st;
    }
    if (pid == 0) {
      orphan_guard(parent);
      tpf_launch_rank me;
      rank_of(l, r, &me);
      if (r != 0) close(l->listen_fd);
      char v[32];
      snprintf(v, sizeof v, "%d", r);
      setenv(TPF_LAUNCH_ENV_RANK, v, 1);
      snprintf(v, sizeof v, "%d", nranks);
      setenv(TPF_LAUNCH_ENV_NRANKS, v, 1);
      setenv(TPF_LAUNCH_ENV_ADDR, l->addr, 1);
      unsetenv(TPF_LAUNCH_ENV_FD);
      in_child = 1;
      int code = fn(&me, arg);
      if (l->snaps != NULL) {
        memcpy(l->snaps + (size_t)r * l->merge_bytes, l->merge_arg, l->merge_bytes);
        atomic_thread_fence(memory_order_release);
        l->snaps[l->merge_bytes * (size_t)nranks + (size_t)r] = 1;
      }
      /* exit, not _exit: atexit work of this process (gcov's counters, CUDA's teardown) runs. */
      fflush(NULL);
      exit(code & 255);
    }
    l->pids[r] = pid;
  }
  launch_started(l);
  *out = l;
  return TPF_OK;
}

tpf_status tpf_launch_fork(int nranks, size_t shared_bytes, tpf_launch_fn fn, void *arg,
                           tpf_launch **out) {
  return fork_common(nranks, shared_bytes, fn, arg, NULL, 0, out);
}

tpf_status tpf_launch_fork_merging(int nranks, size_t shared_bytes, tpf_launch_fn fn, void *arg,
                                   void *results, size_t results_bytes, tpf_launch **out) {
  TPF_RETURN_IF(results == NULL, TPF_EINVAL, "tpf_launch_fork_merging: results is NULL");
  if (results_bytes == 0) TPF_CHECK(tpf_launch_heap_extent(results, &results_bytes));
  return fork_common(nranks, shared_bytes, fn, arg, results, results_bytes, out);
}

tpf_status tpf_launch_merge(tpf_launch *l, void *results, bool *merged) {
  TPF_RETURN_IF(l == NULL || results == NULL || results != l->merge_arg, TPF_EINVAL,
                "tpf_launch_merge: not the results of a merging launch");
  void *arg = results;
  const size_t n = l->merge_bytes;
  const int P = l->nranks;
  const unsigned char *done = l->snaps + n * (size_t)P;
  unsigned char *orig = arg;
  unsigned char *out = malloc(n);
  unsigned char *owner = calloc(n, 1);
  if (out == NULL || owner == NULL) {
    free(out);
    free(owner);
    return tpf_set_error(TPF_ENOMEM, "launcher: cannot merge %zu bytes of results", n);
  }
  memcpy(out, orig, n);
  tpf_status rc = TPF_OK;
  atomic_thread_fence(memory_order_acquire);
  for (int r = 0; r < P && rc == TPF_OK; r++) {
    if (!done[r]) continue;
    const unsigned char *s = l->snaps + (size_t)r * n;
    for (size_t i = 0; i < n; i++) {
      if (s[i] == orig[i]) continue;
      if (owner[i] && out[i] != s[i]) {
        rc = tpf_set_error(TPF_EINVAL,
                           "launcher: ranks %d and %d wrote different values into byte %zu of "
                           "the %zu-byte argument; their results cannot be merged",
                           owner[i] - 1, r, i, n);
        break;
      }
      out[i] = s[i];
      owner[i] = (unsigned char)(r + 1 > 255 ? 255 : r + 1);
    }
  }
  if (rc == TPF_OK) {
    memcpy(orig, out, n);
    if (merged)
      for (int r = 0; r < P; r++)
        merged[r] = done[r] != 0;
  }
  free(out);
  free(owner);
  return rc;
}

tpf_status tpf_launch_heap_extent(void *p, size_t *bytes) {
  TPF_RETURN_IF(p == NULL || bytes == NULL, TPF_EINVAL, "tpf_launch_heap_extent: NULL argument");
  FILE *f = fopen("/proc/self/maps", "r");
  TPF_RETURN_IF(f == NULL, TPF_EBACKEND, "launcher: cannot read /proc/self/maps");
  const uintptr_t a = (uintptr_t)p;
  char line[512];
  bool ok = false;
  uintptr_t hi = 0;
  while (fgets(line, sizeof line, f)) {
    unsigned long long lo_v = 0, hi_v = 0;
    char perms[8] = "";
    int path_at = 0;
    if (sscanf(line, "%llx-%llx %7s %*s %*s %*s %n", &lo_v, &hi_v, perms, &path_at) < 3) continue;
    if (a < (uintptr_t)lo_v || a >= (uintptr_t)hi_v) continue;
    const char *path = line + path_at;
    ok = perms[0] == 'r' && perms[1] == 'w' &&
         (strncmp(path, "[heap]", 6) == 0 || path[0] == '\n' || path[0] == '\0');
    hi = (uintptr_t)hi_v;
    break;
  }
  fclose(f);
  TPF_RETURN_IF(!ok, TPF_EINVAL,
                "launcher: %p is not in the heap (a stack or static address?): the extent of what "
                "the ranks write cannot be known",
                p);
  const size_t n = malloc_usable_size(p);
  TPF_RETURN_IF(n == 0 || n > hi - a, TPF_EINVAL, "launcher: %p has no usable extent", p);
  *bytes = n;
  return TPF_OK;
}

/* argv[0] as an executable path: itself when it has a '/', else the first match in PATH. */
static int resolve_exe(const char *name, char *path, size_t n) {
  if (strchr(name, '/') != NULL) {
    snprintf(path, n, "%s", name);
    return access(path, X_OK);
  }
  const char *p = getenv("PATH");
  if (p == NULL) p = "/usr/bin:/bin";
  while (*p) {
    const char *e = strchr(p, ':');
    size_t len = e ? (size_t)(e - p) : strlen(p);
    snprintf(path, n, "%.*s/%s", (int)len, len ? p : ".", name);
    if (access(path, X_OK) == 0) return 0;
    p += len + (e ? 1 : 0);
  }
  return -1;
}

tpf_status tpf_launch_exec(int nranks, char *const argv[], tpf_launch **out) {
  TPF_RETURN_IF(argv == NULL || argv[0] == NULL || out == NULL, TPF_EINVAL,
                "tpf_launch_exec: NULL argument");
  char exe[4096];
  TPF_RETURN_IF(resolve_exe(argv[0], exe, sizeof exe) != 0, TPF_EINVAL,
                "launcher: cannot execute '%s'", argv[0]);
  tpf_launch *l = NULL;
  TPF_CHECK(launch_new(nranks, 0, &l));
  /* The environment of every rank is built here: between fork and exec only async-signal-safe
   * calls are allowed. Inherited TPF_LAUNCH_* variables are replaced. */
  size_t nenv = 0;
  while (environ[nenv] != NULL)
    nenv++;
  char **envp = calloc(nenv + 5, sizeof *envp);
  char vars[4][TPF_LAUNCH_ADDR_BYTES + 40];
  if (envp == NULL) {
    tpf_launch_free(l);
    return tpf_set_error(TPF_ENOMEM, "launcher: out of memory");
  }
  size_t k = 0;
  for (size_t i = 0; i < nenv; i++)
    if (strncmp(environ[i], "TPF_LAUNCH_", 11) != 0) envp[k++] = environ[i];
  envp[k] = vars[0];
  envp[k + 1] = vars[1];
  envp[k + 2] = vars[2];
  snprintf(vars[1], sizeof vars[1], "%s=%d", TPF_LAUNCH_ENV_NRANKS, nranks);
  snprintf(vars[2], sizeof vars[2], "%s=%s", TPF_LAUNCH_ENV_ADDR, l->addr);
  snprintf(vars[3], sizeof vars[3], "%s=%d", TPF_LAUNCH_ENV_FD, l->listen_fd);
  const pid_t parent = getpid();
  for (int r = 0; r < nranks; r++) {
    snprintf(vars[0], sizeof vars[0], "%s=%d", TPF_LAUNCH_ENV_RANK, r);
    envp[k + 3] = r == 0 ? vars[3] : NULL;
    envp[k + 4] = NULL;
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
      tpf_status st =
          tpf_set_error(TPF_EBACKEND, "launcher: fork of rank %d failed: %s", r, strerror(errno));
      kill_started(l, r);
      free(envp);
      tpf_launch_free(l);
      return st;
    }
    if (pid == 0) {
      orphan_guard(parent);
      /* Rank 0 keeps the listening socket across exec; the others lose it (close-on-exec). */
      if (r == 0) fcntl(l->listen_fd, F_SETFD, 0);
      execve(exe, argv, envp);
      static const char msg[] = "launcher: execve failed\n";
      ssize_t ignored = write(2, msg, sizeof msg - 1);
      (void)ignored;
      _exit(127);
    }
    l->pids[r] = pid;
  }
  free(envp);
  launch_started(l);
  *out = l;
  return TPF_OK;
}

static int code_of(int ws) {
  return WIFEXITED(ws) ? WEXITSTATUS(ws) : WIFSIGNALED(ws) ? 128 + WTERMSIG(ws) : 255;
}

tpf_status tpf_launch_wait(tpf_launch *l, uint64_t timeout_ms, uint64_t grace_ms, int *codes) {
  TPF_RETURN_IF(l == NULL, TPF_EINVAL, "tpf_launch_wait: launch is NULL");
  const uint64_t t0 = tpf_sockboot_now_ns();
  const uint64_t deadline = timeout_ms ? t0 + timeout_ms * 1000000ull : 0;
  uint64_t grace_deadline = 0;
  int abnormal = -1;
  unsigned pause_ms = 1;
  for (;;) {
    int running = 0;
    for (int r = 0; r < l->nranks; r++) {
      if (l->reaped[r]) continue;
      int ws = 0;
      pid_t p = waitpid(l->pids[r], &ws, WNOHANG);
      if (p == l->pids[r] || (p < 0 && errno == ECHILD)) {
        l->reaped[r] = true;
        l->codes[r] = p < 0 ? 255 : code_of(ws);
        const int c = l->codes[r];
        if (c != 0 && c != 77 && abnormal < 0) {
          abnormal = r;
          if (grace_ms) grace_deadline = tpf_sockboot_now_ns() + grace_ms * 1000000ull;
        }
      } else {
        running++;
      }
    }
    if (running == 0) break;
    const uint64_t t = tpf_sockboot_now_ns();
    if ((deadline && t >= deadline) || (grace_deadline && t >= grace_deadline)) {
      char who[256] = "";
      size_t n = 0;
      for (int r = 0; r < l->nranks; r++) {
        if (l->reaped[r]) continue;
        kill(l->pids[r], SIGKILL);
        int ws = 0;
        waitpid(l->pids[r], &ws, 0);
        l->reaped[r] = true;
        l->codes[r] = 128 + SIGKILL;
        n += (size_t)snprintf(who + n, n < sizeof who ? sizeof who - n : 0, "%s%d", n ? ", " : "",
                              r);
        if (n >= sizeof who) n = sizeof who - 1;
      }
      if (codes)
        for (int r = 0; r < l->nranks; r++)
          codes[r] = l->codes[r];
      if (grace_deadline && t >= grace_deadline)
        return tpf_set_error(TPF_ETIMEOUT,
                             "launcher: rank %d ended abnormally (status %d) and rank(s) %s were "
                             "still running %llu ms later: killed",
                             abnormal, l->codes[abnormal], who, (unsigned long long)grace_ms);
      return tpf_set_error(TPF_ETIMEOUT, "launcher: rank(s) %s still running after %llu ms: killed",
                           who, (unsigned long long)timeout_ms);
    }
    tpf_sockboot_sleep_ms(pause_ms);
    if (pause_ms < 20) pause_ms *= 2;
  }
  if (codes)
    for (int r = 0; r < l->nranks; r++)
      codes[r] = l->codes[r];
  return TPF_OK;
}

void *tpf_launch_shared(const tpf_launch *l) {
  return l ? l->shared : NULL;
}

pid_t tpf_launch_pid(const tpf_launch *l, int rank) {
  return (l && rank >= 0 && rank < l->nranks) ? l->pids[rank] : -1;
}

const char *tpf_launch_addr(const tpf_launch *l) {
  return l ? l->addr : "";
}

void tpf_launch_free(tpf_launch *l) {
  if (l == NULL) return;
  kill_started(l, l->nranks);
  if (l->listen_fd >= 0) close(l->listen_fd);
  if (l->shared != NULL) munmap(l->shared, l->shared_bytes);
  if (l->snaps != NULL) munmap(l->snaps, l->snaps_bytes);
  free(l);
}

int tpf_launch_in_child(int (*fn)(void *arg), void *arg) {
  fflush(NULL);
  pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    in_child = 1;
    int code = fn(arg);
    fflush(NULL);
    exit(code & 255);
  }
  int ws = 0;
  while (waitpid(pid, &ws, 0) < 0)
    if (errno != EINTR) return -1;
  return code_of(ws);
}

int tpf_launch_device(int rank, int device_count) {
  return device_count > 0 && rank >= 0 ? rank % device_count : 0;
}

static bool env_int(const char *name, long lo, long hi, long *out) {
  const char *v = getenv(name);
  if (v == NULL || *v == '\0') return false;
  char *end = NULL;
  long x = strtol(v, &end, 10);
  if (end == NULL || *end != '\0' || x < lo || x > hi) return false;
  *out = x;
  return true;
}

tpf_status tpf_launch_rank_from_env(tpf_launch_rank *me) {
  TPF_RETURN_IF(me == NULL, TPF_EINVAL, "tpf_launch_rank_from_env: NULL argument");
  long rank = 0, n = 0, fd = -1;
  TPF_RETURN_IF(!env_int(TPF_LAUNCH_ENV_NRANKS, 1, TPF_MAX_RANKS, &n), TPF_EINVAL,
                "launcher: %s is not set to 1..%d", TPF_LAUNCH_ENV_NRANKS, TPF_MAX_RANKS);
  TPF_RETURN_IF(!env_int(TPF_LAUNCH_ENV_RANK, 0, n - 1, &rank), TPF_EINVAL,
                "launcher: %s is not set to 0..%ld", TPF_LAUNCH_ENV_RANK, n - 1);
  const char *addr = getenv(TPF_LAUNCH_ENV_ADDR);
  TPF_RETURN_IF(addr == NULL || *addr == '\0' || strlen(addr) >= TPF_LAUNCH_ADDR_BYTES, TPF_EINVAL,
                "launcher: %s is not set", TPF_LAUNCH_ENV_ADDR);
  if (!env_int(TPF_LAUNCH_ENV_FD, 0, 1 << 20, &fd) || rank != 0) fd = -1;
  memset(me, 0, sizeof *me);
  me->rank = (int)rank;
  me->nranks = (int)n;
  snprintf(me->addr, sizeof me->addr, "%s", addr);
  me->listen_fd = (int)fd;
  return TPF_OK;
}
