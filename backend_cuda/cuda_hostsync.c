/* Host-side agreement for ranks in different processes of one node (CUDA IPC).
 *
 * Method. Before a rank enqueues anything of an operation, it publishes TPF_READY_WORD(seq, op
 * key, rows) in a small POSIX shared-memory table of the registration and waits, on the host and
 * bounded by the timeout, until every peer has published the same sequence number; then it
 * compares the bodies (operation kind and split count, active rows). A disagreement is
 * TPF_EMISMATCH on every rank before any device work is enqueued, so no byte moves (the copy
 * engine cannot be stopped once a transfer is enqueued). The peer only has to reach the same
 * operation on the host, not finish device work, so the wait is short. Words
 * are kept per sequence parity: a peer may announce seq+1 before a slow rank has read seq, never
 * seq+2 (that needs the slow rank's announcement of seq+1).
 *
 * Rank 0 creates the table and passes its name through the bootstrap; the others open it; after
 * an exchange of the outcomes rank 0 unlinks the name, so nothing is left in /dev/shm even if a
 * process dies. If any rank cannot create or open the table, every rank goes without it (*out
 * NULL): the device handshake still detects a disagreement. No CUDA call is made here, so the
 * CPU tests exercise it with forked processes.
 */
#define _POSIX_C_SOURCE 200809L
#include "cuda_internal.h"
#include "cuda_log.h"
#include "cuda_param.h"

#include "tpflex/tpflex_backend_support.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

struct tpf_cuda_hostsync {
  int nranks, rank;
  size_t bytes;
  _Atomic uint64_t *words; /* [rank][2], in the shared mapping */
};

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static tpf_status map_table(int fd, size_t bytes, _Atomic uint64_t **out) {
  void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED)
    return tpf_set_error(TPF_EBACKEND, "mmap of the host agreement table failed: %s",
                         strerror(errno));
  *out = p;
  return TPF_OK;
}

tpf_status tpf_cuda__hostsync_create(const tpf_bootstrap *boot, const char *tag,
                                     tpf_cuda_hostsync **out) {
  static _Atomic unsigned counter;
  tpf_cuda__param_load(boot->rank); /* the log's settings */
  const int P = boot->tp_size;
  char names[TPF_MAX_RANKS][TPF_CUDA_HOSTSYNC_NAME];
  char mine[TPF_CUDA_HOSTSYNC_NAME];
  memset(mine, 0, sizeof mine);
  tpf_cuda_hostsync *h = tpf_calloc(1, sizeof *h);
  TPF_RETURN_IF(h == NULL, TPF_ENOMEM, "cannot allocate the host agreement of '%s'", tag);
  h->nranks = P;
  h->rank = boot->rank;
  h->bytes = (size_t)P * 2 * sizeof(uint64_t);
  tpf_status rc = TPF_OK;
  int fd = -1;
  if (boot->rank == 0) {
    snprintf(mine, sizeof mine, "/tpflex-%ld-%u-%llx", (long)getpid(),
             atomic_fetch_add(&counter, 1u), (unsigned long long)(now_ns() & 0xFFFFFFull));
    fd = shm_open(mine, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0 || ftruncate(fd, (off_t)h->bytes) != 0) {
      /* Every rank still joins the exchange below and fails there. */
      rc = tpf_set_error(TPF_EBACKEND, "shm_open/ftruncate of '%s' for '%s' failed: %s", mine, tag,
                         strerror(errno));
      if (fd >= 0) {
        close(fd);
        fd = -1;
        shm_unlink(mine);
      }
      mine[0] = '\0';
    }
  }
  tpf_status ex = boot->allgather(boot->ctx, mine, names, sizeof mine);
  if (rc == TPF_OK && ex != TPF_OK) rc = ex;
  if (rc == TPF_OK && names[0][0] == '\0')
    rc = tpf_set_error(TPF_EBACKEND, "rank 0 could not create the host agreement of '%s'", tag);
  if (rc == TPF_OK && boot->rank != 0) {
    names[0][TPF_CUDA_HOSTSYNC_NAME - 1] = '\0';
    fd = shm_open(names[0], O_RDWR, 0600);
    if (fd < 0)
      rc = tpf_set_error(TPF_EBACKEND, "shm_open of '%s' for '%s' failed: %s", names[0], tag,
                         strerror(errno));
  }
  if (rc == TPF_OK) rc = map_table(fd, h->bytes, &h->words);
  if (fd >= 0) close(fd);
  /* Everyone has opened it or failed; the allgather of the outcomes is also the barrier after
   * which the name can go. All ranks take the same decision from the same outcomes. */
  int32_t ok = rc == TPF_OK, oks[TPF_MAX_RANKS];
  tpf_status ag = boot->allgather(boot->ctx, &ok, oks, sizeof ok);
  /* Every rank that knows the name unlinks it (ENOENT after the first is fine): if rank 0 died
   * after creating the table, the survivors still remove it from /dev/shm. Mapped tables stay
   * valid after the unlink. (A rank 0 that dies before the name exchange leaves it behind.) */
  if (boot->rank == 0 && mine[0] != '\0') shm_unlink(mine);
  if (boot->rank != 0 && ex == TPF_OK && names[0][0] != '\0') shm_unlink(names[0]);
  if (ag != TPF_OK) {
    tpf_cuda__hostsync_destroy(h);
    return ag;
  }
  for (int q = 0; q < P; q++)
    if (!oks[q]) {
      /* Without the table the device handshake still detects a disagreement; only the
       * guarantee that no byte moves is lost. Every rank falls back alike. */
      TPF_CUDA_INFO(REG, boot->rank, "no host agreement for '%s' (rank %d failed%s%s)", tag, q,
                    rc != TPF_OK ? ": " : "", rc != TPF_OK ? tpf_last_error() : "");
      tpf_cuda__hostsync_destroy(h);
      *out = NULL;
      return TPF_OK;
    }
  *out = h;
  return TPF_OK;
}

void tpf_cuda__hostsync_destroy(tpf_cuda_hostsync *h) {
  if (h == NULL) return;
  if (h->words != NULL) munmap((void *)h->words, h->bytes);
  tpf_free(h);
}

tpf_status tpf_cuda__hostsync_agree(tpf_cuda_hostsync *h, const char *name, uint64_t seq,
                                    uint64_t body, uint64_t timeout_ns) {
  const int P = h->nranks, me = h->rank, par = (int)(seq & 1u);
  body &= TPF_READY_BODY_MASK;
  atomic_store_explicit(&h->words[me * 2 + par], TPF_READY_WORD(seq, 0, 0) | body,
                        memory_order_release);
  const uint64_t start = now_ns();
  int bad = -1;
  uint64_t bad_body = 0;
  for (int q = 0; q < P; q++) {
    if (q == me) continue;
    uint64_t w;
    for (unsigned spins = 0;; spins++) {
      w = atomic_load_explicit(&h->words[q * 2 + par], memory_order_acquire);
      if (TPF_READY_SEQ(w) == (seq & TPF_READY_SEQ_MASK)) break;
      if ((spins & 63u) == 63u) {
        if (now_ns() - start > timeout_ns)
          return tpf_set_error(TPF_ETIMEOUT,
                               "'%s' rank %d, operation %llu (host agreement): waited %llu ms "
                               "for rank %d, which never reached it",
                               name, me, (unsigned long long)seq,
                               (unsigned long long)(timeout_ns / 1000000ull), q);
        sched_yield();
      }
    }
    if (TPF_READY_BODY(w) != body && bad < 0) {
      bad = q;
      bad_body = TPF_READY_BODY(w);
    }
  }
  char mine[40], theirs[40];
  TPF_RETURN_IF(bad >= 0, TPF_EMISMATCH,
                "'%s' rank %d, operation %llu: active rows %llu (%s) here but %llu (%s) on rank %d "
                "(host agreement: nothing was enqueued, no byte moved)",
                name, me, (unsigned long long)seq, (unsigned long long)TPF_READY_ROWS(body),
                tpf_op_key_name((uint8_t)TPF_READY_KEY(body), mine, sizeof mine),
                (unsigned long long)TPF_READY_ROWS(bad_body),
                tpf_op_key_name((uint8_t)TPF_READY_KEY(bad_body), theirs, sizeof theirs), bad);
  return TPF_OK;
}

/* ---- naming a peer that exited ---- */

/* True when pid is no running process: gone (ESRCH), or a zombie (killed, not yet reaped by its
 * parent: kill(pid, 0) still succeeds on it). */
static bool tpf_cuda__pid_gone(int64_t pid) {
  if (pid <= 0) return false;
  if (kill((pid_t)pid, 0) != 0) return errno == ESRCH;
  char path[64], buf[256];
  snprintf(path, sizeof path, "/proc/%lld/stat", (long long)pid);
  FILE *f = fopen(path, "r");
  if (f == NULL) return false; /* no /proc: only ESRCH can tell */
  const size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  /* "pid (comm) S ...": the state follows the last ')' (comm may hold spaces and parens). */
  const char *p = strrchr(buf, ')');
  return p != NULL && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X');
}

int tpf_cuda__peer_gone(const tpf_cuda_peer_info *peers, int P, int me, int64_t *pid) {
  if (peers == NULL || me < 0 || me >= P || P > TPF_MAX_RANKS) return -1;
  const tpf_cuda_peer_info *mine = &peers[me];
  for (int q = 0; q < P; q++) {
    const tpf_cuda_peer_info *p = &peers[q];
    if (q == me || p->host != mine->host || p->pid == mine->pid) continue;
    if (tpf_cuda__pid_gone(p->pid)) {
      if (pid != NULL) *pid = p->pid;
      return q;
    }
  }
  return -1;
}

tpf_status tpf_cuda__blame_gone(const tpf_cuda_peer_info *peers, int P, int me, tpf_status rc) {
  if (rc != TPF_ETIMEOUT) return rc;
  int64_t pid = 0;
  const int q = tpf_cuda__peer_gone(peers, P, me, &pid);
  if (q < 0) return rc;
  char msg[512]; /* the detail is formatted into the buffer it is read from: copy it first */
  snprintf(msg, sizeof msg, "%s", tpf_last_error());
  return tpf_set_error(rc, "%s; rank %d's process (pid %lld) has exited", msg, q, (long long)pid);
}
