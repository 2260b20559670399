/* Ranks as processes: the launcher and the socket bootstrap (launcher.h).
 *
 * Method (bootstrap). Rank 0 holds one stream connection per other rank. A call is numbered
 * (seq) on every rank; a rank q > 0 sends {DATA, seq, bytes} and its bytes, then waits for rank
 * 0's answer {DATA, seq, P * bytes} with everybody's bytes, or {ERROR, status} with a reason.
 * Rank 0 polls every connection until each rank has delivered call seq, checks that the calls
 * match (same seq, same size), and answers all. Every socket is non-blocking and every wait polls
 * with the time left to the call's deadline, so no read or write can block past the timeout.
 * A closed connection is a dead (or finished) peer: rank 0 then fails the call, tells every
 * other rank why, and closes everything; a rank q whose connection to rank 0 closes fails too.
 * The first failure is kept and returned by every later call at once, so a group with a dead
 * member stops within one timeout, and collective cleanup (barriers in destroy) does not wait
 * again.
 */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS */
#define _POSIX_C_SOURCE 200809L
#include "launcher.h"

#include "internal.h" /* TPF_RETURN_IF, TPF_CHECK */

#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
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

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void sleep_ms(unsigned ms) {
  struct timespec t = {(time_t)(ms / 1000u), (long)(ms % 1000u) * 1000000L};
  while (nanosleep(&t, &t) != 0 && errno == EINTR) {
  }
}

static int set_nonblocking(int fd) {
  int fl = fcntl(fd, F_GETFL);
  return fl < 0 ? -1 : fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

/* "@name" is Linux's abstract namespace (sun_path[0] == '\0'); anything else a socket path. */
static int fill_addr(const char *addr, struct sockaddr_un *sa, socklen_t *len) {
  memset(sa, 0, sizeof *sa);
  sa->sun_family = AF_UNIX;
  const size_t n = strlen(addr);
  if (n == 0 || n >= sizeof sa->sun_path) return -1;
  if (addr[0] == '@') {
    memcpy(sa->sun_path + 1, addr + 1, n - 1);
    *len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n);
  } else {
    memcpy(sa->sun_path, addr, n);
    *len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n + 1);
  }
  return 0;
}

/* A listening socket at addr; -1 with errno on failure. */
static int listen_at(const char *addr) {
  struct sockaddr_un sa;
  socklen_t len;
  if (fill_addr(addr, &sa, &len) != 0) {
    errno = ENAMETOOLONG;
    return -1;
  }
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (bind(fd, (struct sockaddr *)&sa, len) != 0 || listen(fd, SOMAXCONN) != 0) {
    int e = errno;
    close(fd);
    errno = e;
    return -1;
  }
  return fd;
}

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
           atomic_fetch_add(&counter, 1u), (unsigned long long)(now_ns() & 0xFFFFFFFFull));
  l->listen_fd = listen_at(l->addr);
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
  const uint64_t t0 = now_ns();
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
          if (grace_ms) grace_deadline = now_ns() + grace_ms * 1000000ull;
        }
      } else {
        running++;
      }
    }
    if (running == 0) break;
    const uint64_t t = now_ns();
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
    sleep_ms(pause_ms);
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

/* ---- socket bootstrap ---- */

#define SB_MAGIC 0x74706662u /* "tpfb" */
enum { SB_HELLO = 1, SB_ACK = 2, SB_DATA = 3, SB_ERROR = 4 };
#define SB_WHY 640

typedef struct {
  uint32_t magic, kind;
  int32_t rank, aux; /* HELLO: aux = group size; ERROR: aux = status */
  uint64_t seq, bytes;
} sb_hdr;

typedef struct {
  int rank, nranks;
  int fd;                       /* rank > 0: the connection to rank 0 */
  int peers[TPF_MAX_RANKS];     /* rank 0: each rank's connection (-1: none or closed) */
  uint64_t gone[TPF_MAX_RANKS]; /* rank 0: call after which a rank's connection closed */
  uint64_t seq;                 /* calls made */
  uint64_t timeout_ms;
  tpf_status failed; /* first failure, returned by every later call */
  char why[SB_WHY];
  unsigned char *buf; /* rank 0: P * cap_per_rank bytes */
  size_t cap;
} sockboot;

/* Outcome of an I/O helper. */
enum { IO_OK = 0, IO_CLOSED = 1, IO_TIMEOUT = 2, IO_ERROR = 3 };

static int wait_fd(int fd, short events, uint64_t deadline) {
  for (;;) {
    const uint64_t t = now_ns();
    if (t >= deadline) return IO_TIMEOUT;
    uint64_t left_ms = (deadline - t + 999999u) / 1000000u;
    struct pollfd p = {fd, events, 0};
    int k = poll(&p, 1, left_ms > 60000u ? 60000 : (int)left_ms);
    if (k > 0) return IO_OK; /* readable, writable, hung up or failed: the call says which */
    if (k < 0 && errno != EINTR) return IO_ERROR;
  }
}

static int io_read(int fd, void *buf, size_t n, uint64_t deadline) {
  unsigned char *p = buf;
  while (n > 0) {
    ssize_t k = recv(fd, p, n, 0);
    if (k > 0) {
      p += k;
      n -= (size_t)k;
      continue;
    }
    if (k == 0) return IO_CLOSED;
    if (errno == EINTR) continue;
    if (errno == ECONNRESET || errno == EPIPE) return IO_CLOSED;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return IO_ERROR;
    int w = wait_fd(fd, POLLIN, deadline);
    if (w != IO_OK) return w;
  }
  return IO_OK;
}

static int io_write(int fd, const void *buf, size_t n, uint64_t deadline) {
  const unsigned char *p = buf;
  while (n > 0) {
    ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
    if (k > 0) {
      p += k;
      n -= (size_t)k;
      continue;
    }
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && (errno == EPIPE || errno == ECONNRESET)) return IO_CLOSED;
    if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return IO_ERROR;
    int w = wait_fd(fd, POLLOUT, deadline);
    if (w != IO_OK) return w;
  }
  return IO_OK;
}

static int io_send_msg(int fd, uint32_t kind, int32_t rank, int32_t aux, uint64_t seq,
                       const void *payload, uint64_t bytes, uint64_t deadline) {
  sb_hdr h = {SB_MAGIC, kind, rank, aux, seq, bytes};
  int rc = io_write(fd, &h, sizeof h, deadline);
  if (rc == IO_OK && bytes > 0) rc = io_write(fd, payload, (size_t)bytes, deadline);
  return rc;
}

static void sb_close_all(sockboot *sb) {
  if (sb->fd >= 0) close(sb->fd);
  sb->fd = -1;
  for (int q = 0; q < sb->nranks; q++)
    if (sb->peers[q] >= 0) {
      close(sb->peers[q]);
      sb->peers[q] = -1;
    }
}

/* Records the first failure, tells the group (rank 0: an ERROR message to every rank still
 * connected, written without waiting: it is small and the sockets are otherwise idle) and closes
 * every connection, so the other ranks fail at once too. */
static tpf_status sb_fail(sockboot *sb, tpf_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static tpf_status sb_fail(sockboot *sb, tpf_status st, const char *fmt, ...) {
  if (sb->failed == TPF_OK) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(sb->why, sizeof sb->why, fmt, ap);
    va_end(ap);
    sb->failed = st;
    if (sb->rank == 0) {
      const uint64_t soon = now_ns() + 200000000ull;
      for (int q = 1; q < sb->nranks; q++)
        if (sb->peers[q] >= 0)
          (void)io_send_msg(sb->peers[q], SB_ERROR, 0, (int32_t)st, sb->seq, sb->why,
                            strlen(sb->why) + 1, soon);
    }
    sb_close_all(sb);
  }
  return tpf_set_error(sb->failed, "%s", sb->why);
}

static uint64_t sb_bound_ms(const sockboot *sb);

static tpf_status sb_io_fail(sockboot *sb, int io, int peer, const char *what) {
  if (io == IO_CLOSED)
    return sb_fail(sb, TPF_ETIMEOUT,
                   "bootstrap call #%llu: rank %d left the group during %s (its connection "
                   "closed: the process exited or was killed)",
                   (unsigned long long)sb->seq, peer, what);
  if (io == IO_TIMEOUT)
    return sb_fail(sb, TPF_ETIMEOUT,
                   "bootstrap call #%llu: rank %d waited %llu ms for rank %d during %s (a rank "
                   "never arrived; TPF_BOOT_TIMEOUT_MS sets the bound)",
                   (unsigned long long)sb->seq, sb->rank, (unsigned long long)sb_bound_ms(sb), peer,
                   what);
  return sb_fail(sb, TPF_EBACKEND, "bootstrap call #%llu: socket error with rank %d during %s: %s",
                 (unsigned long long)sb->seq, peer, what, strerror(errno));
}

/* Rank q > 0: an ERROR message from rank 0 (its reason), read after the header. */
static tpf_status sb_take_error(sockboot *sb, const sb_hdr *h, uint64_t deadline) {
  char text[SB_WHY];
  size_t n = h->bytes < sizeof text ? (size_t)h->bytes : sizeof text - 1;
  memset(text, 0, sizeof text);
  if (io_read(sb->fd, text, n, deadline) != IO_OK) snprintf(text, sizeof text, "(reason lost)");
  text[sizeof text - 1] = '\0';
  tpf_status st = (h->aux > 0 && h->aux < TPF_STATUS_COUNT) ? (tpf_status)h->aux : TPF_EBACKEND;
  return sb_fail(sb, st, "%s (reported by rank 0 to rank %d)", text, sb->rank);
}

/* Rank 0 waits for the ranks for timeout_ms; the others wait for rank 0 a quarter longer, so
 * that when a rank is missing they hear rank 0's reason (which names it) instead of timing out
 * at the same moment with less to say. */
static uint64_t sb_bound_ms(const sockboot *sb) {
  return sb->rank == 0 ? sb->timeout_ms : sb->timeout_ms + sb->timeout_ms / 4 + 50;
}

static uint64_t sb_deadline(const sockboot *sb) {
  return now_ns() + sb_bound_ms(sb) * 1000000ull;
}

static tpf_status sb_allgather_hub(sockboot *sb, const void *send, void *recv, size_t bytes) {
  const int P = sb->nranks;
  const uint64_t deadline = sb_deadline(sb);
  for (int q = 1; q < P; q++)
    if (sb->gone[q])
      return sb_fail(sb, TPF_ETIMEOUT,
                     "bootstrap call #%llu: rank %d left the group after call #%llu (its "
                     "connection closed: the process exited or was killed)",
                     (unsigned long long)sb->seq, q, (unsigned long long)sb->gone[q]);
  if (sb->cap < bytes) {
    unsigned char *nb = realloc(sb->buf, bytes * (size_t)P);
    if (nb == NULL)
      return sb_fail(sb, TPF_ENOMEM, "bootstrap: cannot allocate %zu bytes", bytes * (size_t)P);
    sb->buf = nb;
    sb->cap = bytes;
  }
  if (bytes) memcpy(sb->buf, send, bytes);
  bool got[TPF_MAX_RANKS] = {false};
  int pending = P - 1;
  struct pollfd pf[TPF_MAX_RANKS];
  int who[TPF_MAX_RANKS];
  while (pending > 0) {
    int n = 0;
    for (int q = 1; q < P; q++)
      if (!got[q]) {
        pf[n] = (struct pollfd){sb->peers[q], POLLIN, 0};
        who[n++] = q;
      }
    const uint64_t t = now_ns();
    if (t >= deadline) {
      char missing[256] = "";
      size_t m = 0;
      for (int i = 0; i < n && m < sizeof missing - 8; i++)
        m += (size_t)snprintf(missing + m, sizeof missing - m, "%s%d", i ? ", " : "", who[i]);
      return sb_fail(sb, TPF_ETIMEOUT,
                     "bootstrap call #%llu (allgather of %zu bytes): rank 0 waited %llu ms for "
                     "rank(s) %s, which never arrived (TPF_BOOT_TIMEOUT_MS sets the bound)",
                     (unsigned long long)sb->seq, bytes, (unsigned long long)sb->timeout_ms,
                     missing);
    }
    uint64_t left_ms = (deadline - t + 999999u) / 1000000u;
    int k = poll(pf, (nfds_t)n, left_ms > 60000u ? 60000 : (int)left_ms);
    if (k < 0 && errno != EINTR)
      return sb_fail(sb, TPF_EBACKEND, "bootstrap: poll failed: %s", strerror(errno));
    for (int i = 0; k > 0 && i < n; i++) {
      if (pf[i].revents == 0) continue;
      const int q = who[i];
      sb_hdr h;
      int io = io_read(sb->peers[q], &h, sizeof h, deadline);
      if (io != IO_OK) return sb_io_fail(sb, io, q, "an allgather");
      if (h.magic != SB_MAGIC || h.kind != SB_DATA)
        return sb_fail(sb, TPF_EBACKEND, "bootstrap call #%llu: rank %d sent a malformed message",
                       (unsigned long long)sb->seq, q);
      if (h.seq != sb->seq || h.bytes != bytes)
        return sb_fail(sb, TPF_EMISMATCH,
                       "bootstrap call #%llu: rank %d made call #%llu with %llu bytes per rank, "
                       "rank 0 call #%llu with %zu (every rank must make the same bootstrap "
                       "calls in the same order)",
                       (unsigned long long)sb->seq, q, (unsigned long long)h.seq,
                       (unsigned long long)h.bytes, (unsigned long long)sb->seq, bytes);
      if (bytes != 0) { /* a barrier carries no payload (and buf may be NULL) */
        io = io_read(sb->peers[q], sb->buf + (size_t)q * bytes, bytes, deadline);
        if (io != IO_OK) return sb_io_fail(sb, io, q, "an allgather");
      }
      got[q] = true;
      pending--;
    }
  }
  const uint64_t total = (uint64_t)bytes * (uint64_t)P;
  for (int q = 1; q < P; q++) {
    int io = io_send_msg(sb->peers[q], SB_DATA, 0, 0, sb->seq, sb->buf, total, deadline);
    if (io == IO_CLOSED) {
      /* It delivered and then went away: the call completes for the others, the next fails. */
      sb->gone[q] = sb->seq;
      close(sb->peers[q]);
      sb->peers[q] = -1;
    } else if (io != IO_OK) {
      return sb_io_fail(sb, io, q, "the answer to an allgather");
    }
  }
  if (recv != NULL && total) memcpy(recv, sb->buf, (size_t)total);
  return TPF_OK;
}

static tpf_status sb_allgather_leaf(sockboot *sb, const void *send, void *recv, size_t bytes) {
  const uint64_t deadline = sb_deadline(sb);
  int io = io_send_msg(sb->fd, SB_DATA, sb->rank, 0, sb->seq, send, bytes, deadline);
  sb_hdr h;
  if (io == IO_CLOSED) {
    /* Rank 0 may have closed after writing its reason: read it if it is there. */
    if (io_read(sb->fd, &h, sizeof h, now_ns() + 10000000ull) == IO_OK && h.magic == SB_MAGIC &&
        h.kind == SB_ERROR)
      return sb_take_error(sb, &h, now_ns() + 10000000ull);
  }
  if (io != IO_OK) return sb_io_fail(sb, io, 0, "an allgather");
  io = io_read(sb->fd, &h, sizeof h, deadline);
  if (io == IO_TIMEOUT)
    return sb_fail(sb, TPF_ETIMEOUT,
                   "bootstrap call #%llu (allgather of %zu bytes): rank %d waited %llu ms for "
                   "rank 0's answer (a rank never arrived; TPF_BOOT_TIMEOUT_MS sets the bound)",
                   (unsigned long long)sb->seq, bytes, sb->rank,
                   (unsigned long long)sb_bound_ms(sb));
  if (io != IO_OK) return sb_io_fail(sb, io, 0, "an allgather");
  if (h.magic == SB_MAGIC && h.kind == SB_ERROR) return sb_take_error(sb, &h, deadline);
  const uint64_t total = (uint64_t)bytes * (uint64_t)sb->nranks;
  if (h.magic != SB_MAGIC || h.kind != SB_DATA || h.seq != sb->seq || h.bytes != total)
    return sb_fail(sb, TPF_EMISMATCH,
                   "bootstrap call #%llu: rank 0 answered call #%llu with %llu bytes, rank %d "
                   "expected %llu",
                   (unsigned long long)sb->seq, (unsigned long long)h.seq,
                   (unsigned long long)h.bytes, sb->rank, (unsigned long long)total);
  if (total) {
    io = io_read(sb->fd, recv, (size_t)total, deadline);
    if (io != IO_OK) return sb_io_fail(sb, io, 0, "the answer to an allgather");
  }
  return TPF_OK;
}

static tpf_status sb_allgather(void *ctx, const void *send, void *recv, size_t bytes) {
  sockboot *sb = ctx;
  if (sb->failed != TPF_OK) return tpf_set_error(sb->failed, "%s", sb->why);
  if (bytes > 0 && (send == NULL || recv == NULL))
    return tpf_set_error(TPF_EINVAL, "bootstrap allgather: NULL buffer");
  sb->seq++;
  if (sb->nranks == 1) {
    if (bytes) memcpy(recv, send, bytes);
    return TPF_OK;
  }
  return sb->rank == 0 ? sb_allgather_hub(sb, send, recv, bytes)
                       : sb_allgather_leaf(sb, send, recv, bytes);
}

static tpf_status sb_barrier(void *ctx) {
  return sb_allgather(ctx, NULL, NULL, 0);
}

static uint64_t default_timeout_ms(void) {
  const char *names[] = {TPF_LAUNCH_ENV_TIMEOUT, "TPF_CUDA_BOOT_TIMEOUT_MS"};
  for (size_t i = 0; i < 2; i++) {
    const char *v = getenv(names[i]);
    if (v != NULL && *v) {
      unsigned long long x = strtoull(v, NULL, 10);
      if (x > 0) return (uint64_t)x;
    }
  }
  return 120000u;
}

/* Rank 0: accept every other rank's HELLO, then ACK them all. */
static tpf_status sb_setup_hub(sockboot *sb, int lfd) {
  const int P = sb->nranks;
  const uint64_t deadline = sb_deadline(sb);
  int joined = 0;
  set_nonblocking(lfd);
  while (joined < P - 1) {
    int w = wait_fd(lfd, POLLIN, deadline);
    if (w == IO_TIMEOUT) {
      char missing[256] = "";
      size_t m = 0;
      for (int q = 1; q < P && m < sizeof missing - 8; q++)
        if (sb->peers[q] < 0)
          m += (size_t)snprintf(missing + m, sizeof missing - m, "%s%d", m ? ", " : "", q);
      return sb_fail(sb, TPF_ETIMEOUT,
                     "bootstrap setup: rank 0 waited %llu ms for rank(s) %s, which never joined "
                     "(%d of %d did)",
                     (unsigned long long)sb->timeout_ms, missing, joined + 1, P);
    }
    if (w != IO_OK) return sb_fail(sb, TPF_EBACKEND, "bootstrap setup: poll: %s", strerror(errno));
    int fd = accept(lfd, NULL, NULL);
    if (fd < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED)
        continue;
      return sb_fail(sb, TPF_EBACKEND, "bootstrap setup: accept: %s", strerror(errno));
    }
    fcntl(fd, F_SETFD, FD_CLOEXEC);
    set_nonblocking(fd);
    sb_hdr h;
    int io = io_read(fd, &h, sizeof h, deadline);
    if (io != IO_OK) {
      close(fd); /* a rank that died while joining: the wait above names whoever is missing */
      continue;
    }
    if (h.magic != SB_MAGIC || h.kind != SB_HELLO) {
      close(fd);
      continue;
    }
    if (h.aux != P || h.rank < 1 || h.rank >= P || sb->peers[h.rank] >= 0) {
      /* A rank of another group, or a rank number taken twice: the whole group fails. */
      char why[160];
      if (h.aux != P)
        snprintf(why, sizeof why,
                 "bootstrap setup: rank %d joined a group of %d ranks, rank 0's "
                 "has %d",
                 (int)h.rank, (int)h.aux, P);
      else
        snprintf(why, sizeof why, "bootstrap setup: rank %d joined twice (or is outside 1..%d)",
                 (int)h.rank, P - 1);
      (void)io_send_msg(fd, SB_ERROR, 0, TPF_EMISMATCH, 0, why, strlen(why) + 1,
                        now_ns() + 200000000ull);
      close(fd);
      return sb_fail(sb, TPF_EMISMATCH, "%s", why);
    }
    sb->peers[h.rank] = fd;
    joined++;
  }
  for (int q = 1; q < P; q++) {
    int io = io_send_msg(sb->peers[q], SB_ACK, 0, P, 0, NULL, 0, deadline);
    if (io != IO_OK) return sb_io_fail(sb, io, q, "setup");
  }
  return TPF_OK;
}

/* Rank q > 0: connect (retrying while nobody listens yet), HELLO, wait for the ACK. */
static tpf_status sb_setup_leaf(sockboot *sb, const char *addr) {
  const uint64_t deadline = sb_deadline(sb);
  struct sockaddr_un sa;
  socklen_t len;
  if (fill_addr(addr, &sa, &len) != 0)
    return sb_fail(sb, TPF_EINVAL, "bootstrap: bad address '%s'", addr);
  for (;;) {
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return sb_fail(sb, TPF_EBACKEND, "bootstrap: socket: %s", strerror(errno));
    set_nonblocking(fd);
    if (connect(fd, (struct sockaddr *)&sa, len) == 0) {
      sb->fd = fd;
      break;
    }
    const int e = errno;
    close(fd);
    if (e != ECONNREFUSED && e != ENOENT && e != EAGAIN && e != EINTR)
      return sb_fail(sb, TPF_EBACKEND, "bootstrap: connect to '%s': %s", addr, strerror(e));
    if (now_ns() >= deadline)
      return sb_fail(sb, TPF_ETIMEOUT,
                     "bootstrap setup: rank %d could not reach rank 0 at '%s' within %llu ms (%s)",
                     sb->rank, addr, (unsigned long long)sb->timeout_ms, strerror(e));
    sleep_ms(5);
  }
  int io = io_send_msg(sb->fd, SB_HELLO, sb->rank, sb->nranks, 0, NULL, 0, deadline);
  sb_hdr h;
  if (io == IO_OK) io = io_read(sb->fd, &h, sizeof h, deadline);
  if (io == IO_TIMEOUT)
    return sb_fail(sb, TPF_ETIMEOUT,
                   "bootstrap setup: rank %d waited %llu ms for rank 0 to complete the group (a "
                   "rank never joined)",
                   sb->rank, (unsigned long long)sb_bound_ms(sb));
  if (io != IO_OK) return sb_io_fail(sb, io, 0, "setup");
  if (h.magic == SB_MAGIC && h.kind == SB_ERROR) return sb_take_error(sb, &h, deadline);
  if (h.magic != SB_MAGIC || h.kind != SB_ACK)
    return sb_fail(sb, TPF_EBACKEND, "bootstrap setup: rank 0 sent a malformed answer");
  return TPF_OK;
}

tpf_status tpf_sockboot_create(const tpf_launch_rank *me, int device, uint64_t timeout_ms,
                               tpf_bootstrap *out) {
  TPF_RETURN_IF(me == NULL || out == NULL, TPF_EINVAL, "tpf_sockboot_create: NULL argument");
  TPF_RETURN_IF(me->nranks < 1 || me->nranks > TPF_MAX_RANKS || me->rank < 0 ||
                    me->rank >= me->nranks,
                TPF_EINVAL, "tpf_sockboot_create: rank %d of %d", me->rank, me->nranks);
  TPF_RETURN_IF(device < 0, TPF_EINVAL, "tpf_sockboot_create: device %d", device);
  sockboot *sb = calloc(1, sizeof *sb);
  TPF_RETURN_IF(sb == NULL, TPF_ENOMEM, "bootstrap: out of memory");
  sb->rank = me->rank;
  sb->nranks = me->nranks;
  sb->fd = -1;
  for (int q = 0; q < TPF_MAX_RANKS; q++)
    sb->peers[q] = -1;
  sb->timeout_ms = timeout_ms ? timeout_ms : default_timeout_ms();
  tpf_status st = TPF_OK;
  if (sb->nranks > 1) {
    if (sb->rank == 0) {
      int lfd = me->listen_fd;
      if (lfd < 0) lfd = listen_at(me->addr);
      if (lfd < 0)
        st = sb_fail(sb, TPF_EBACKEND, "bootstrap: rank 0 cannot listen on '%s': %s", me->addr,
                     strerror(errno));
      else
        st = sb_setup_hub(sb, lfd);
      /* Joined or failed: nobody else may connect. A path-named socket is removed too. */
      if (lfd >= 0) close(lfd);
      if (me->listen_fd < 0 && me->addr[0] != '@') unlink(me->addr);
    } else {
      st = sb_setup_leaf(sb, me->addr);
    }
  }
  if (st != TPF_OK) {
    char why[SB_WHY];
    snprintf(why, sizeof why, "%s", sb->why);
    sb_close_all(sb);
    free(sb);
    return tpf_set_error(st, "%s", why);
  }
  memset(out, 0, sizeof *out);
  out->tp_size = me->nranks;
  out->rank = me->rank;
  out->device = device;
  out->allgather = sb_allgather;
  out->barrier = sb_barrier;
  out->ctx = sb;
  return TPF_OK;
}

void tpf_sockboot_free(tpf_bootstrap *b) {
  if (b == NULL || b->ctx == NULL || b->allgather != sb_allgather) return;
  sockboot *sb = b->ctx;
  sb_close_all(sb);
  free(sb->buf);
  free(sb);
  b->ctx = NULL;
}

tpf_status tpf_sockboot_set_timeout(tpf_bootstrap *b, uint64_t timeout_ms) {
  TPF_RETURN_IF(b == NULL || b->ctx == NULL || b->allgather != sb_allgather || timeout_ms == 0,
                TPF_EINVAL, "tpf_sockboot_set_timeout: not a socket bootstrap, or 0 ms");
  ((sockboot *)b->ctx)->timeout_ms = timeout_ms;
  return TPF_OK;
}
