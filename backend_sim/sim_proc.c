/* Process mode's operating-system edge (a leaf): POSIX shared memory segments for registrations,
 * the sweep of segments a killed job left, and whether a peer's process still runs. Every
 * failure is translated here, with errno's text and the fix in the detail.
 *
 * Liveness: kill(pid, 0) fails with ESRCH once the process is gone and reaped; a process that
 * ended but is not reaped yet (a zombie, until torchrun or the launcher waits for it) still
 * answers, so on Linux its state in /proc/<pid>/stat ('Z' or 'X') counts as gone too. Ranks share
 * a machine (they share memory), hence one pid namespace. */
#define _DEFAULT_SOURCE
#define _POSIX_C_SOURCE 200809L
#include "sim_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static tpf_status shm_error(int err, const char *what, const char *name, uint64_t bytes) {
  const tpf_status st = (err == ENOSPC || err == ENOMEM) ? TPF_ENOMEM : TPF_EBACKEND;
  return tpf_set_error(st,
                       "simulator (ranks as processes): %s of shared memory segment %s (%llu "
                       "bytes) failed: %s%s",
                       what, name, (unsigned long long)bytes, strerror(err),
                       st == TPF_ENOMEM ? " (/dev/shm is too small for the registrations: "
                                          "enlarge it, e.g. docker run --shm-size=2g, or "
                                          "register less capacity)"
                                        : "");
}

tpf_status tpf_sim__shm_create(const char *name, uint64_t bytes, unsigned char **base) {
  int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0) return shm_error(errno, "shm_open (create)", name, bytes);
  /* Reserve every page now: tmpfs otherwise hands out pages on first touch and a full /dev/shm
   * would be a SIGBUS in the middle of an operation. */
  int err = (off_t)bytes < 0 ? EOVERFLOW : posix_fallocate(fd, 0, (off_t)bytes);
  if (err == EINVAL || err == EOPNOTSUPP) /* a file system without fallocate: size it only */
    err = ftruncate(fd, (off_t)bytes) == 0 ? 0 : errno;
  if (err != 0) {
    close(fd);
    shm_unlink(name);
    return shm_error(err, "sizing", name, bytes);
  }
  void *p = mmap(NULL, (size_t)bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  err = p == MAP_FAILED ? errno : 0;
  close(fd);
  if (err != 0) {
    shm_unlink(name);
    return shm_error(err, "mmap", name, bytes);
  }
  *base = p;
  return TPF_OK;
}

tpf_status tpf_sim__shm_map(const char *name, uint64_t bytes, unsigned char **base) {
  int fd = shm_open(name, O_RDWR, 0);
  if (fd < 0) return shm_error(errno, "shm_open", name, bytes);
  struct stat st;
  if (fstat(fd, &st) != 0 || (uint64_t)st.st_size != bytes) {
    int err = errno;
    close(fd);
    if ((uint64_t)st.st_size != bytes)
      return tpf_set_error(TPF_EBACKEND,
                           "simulator (ranks as processes): shared memory segment %s holds %llu "
                           "bytes, %llu expected (another job's segment of the same name?)",
                           name, (unsigned long long)st.st_size, (unsigned long long)bytes);
    return shm_error(err, "fstat", name, bytes);
  }
  void *p = mmap(NULL, (size_t)bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int err = p == MAP_FAILED ? errno : 0;
  close(fd);
  if (err != 0) return shm_error(err, "mmap", name, bytes);
  *base = p;
  return TPF_OK;
}

void tpf_sim__shm_unlink(const char *name) {
  shm_unlink(name); /* ENOENT: already unlinked by a peer, or never created */
}

void tpf_sim__shm_unmap(unsigned char *base, uint64_t bytes) {
  if (base) munmap(base, (size_t)bytes);
}

static bool pid_gone(long pid) {
  if (pid <= 0) return false;
  if (kill((pid_t)pid, 0) != 0 && errno == ESRCH) return true;
#ifdef __linux__
  char path[64], buf[512];
  snprintf(path, sizeof path, "/proc/%ld/stat", pid);
  FILE *f = fopen(path, "r");
  if (!f) return false; /* no /proc: kill's answer stands */
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  const char *rp = strrchr(buf, ')'); /* the command name may hold spaces and parentheses */
  if (rp && rp[1] == ' ' && (rp[2] == 'Z' || rp[2] == 'X')) return true;
#endif
  return false;
}

int tpf_sim__peers_gone(const tpf_sim_world *w, char *names, size_t n) {
  int count = 0;
  size_t at = 0;
  names[0] = '\0';
  for (int r = 0; r < w->tp_size; r++) {
    if (r == w->proc_rank || !pid_gone((long)w->pids[r])) continue;
    if (at + 40 < n)
      at += (size_t)snprintf(names + at, n - at, "%srank %d (pid %ld)", count ? " and " : "", r,
                             (long)w->pids[r]);
    count++;
  }
  return count;
}

/* Age (seconds since the last change) below which a segment is never swept. */
#define TPF_SIM_SWEEP_AGE_S 60

int tpf_sim__shm_sweep(void) {
  int removed = 0;
#ifdef __linux__
  DIR *d = opendir("/dev/shm");
  if (!d) return 0;
  static const char prefix[] = "tpflex-sim-";
  for (struct dirent *e; (e = readdir(d)) != NULL;) {
    if (strncmp(e->d_name, prefix, sizeof prefix - 1) != 0) continue;
    char *end = NULL;
    long pid = strtol(e->d_name + sizeof prefix - 1, &end, 10);
    if (!end || *end != '-' || !pid_gone(pid)) continue;
    /* Only segments older than a creation takes: a job in another pid namespace that shares
     * /dev/shm (docker --ipc=host) shows a pid that is not ours, and its segment lives for the
     * moment between its creation and its unlink only. */
    char path[300], name[300];
    snprintf(path, sizeof path, "/dev/shm/%s", e->d_name);
    struct stat st;
    if (stat(path, &st) != 0 || time(NULL) - st.st_mtime < TPF_SIM_SWEEP_AGE_S) continue;
    snprintf(name, sizeof name, "/%s", e->d_name);
    if (shm_unlink(name) == 0) removed++;
  }
  closedir(d);
#endif
  return removed;
}
