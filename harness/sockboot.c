/* Ranks as processes: the socket bootstrap (sockboot.h). The launcher (launcher.c) starts the
 * processes and hands each its tpf_launch_rank; this file is what a rank runs to join its group.
 *
 * Method. Rank 0 holds one stream connection per other rank. A call is numbered
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
#define _POSIX_C_SOURCE 200809L
#include "sockboot.h"

#include "internal.h" /* TPF_RETURN_IF */

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

uint64_t tpf_sockboot_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void tpf_sockboot_sleep_ms(unsigned ms) {
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

int tpf_sockboot_listen(const char *addr) {
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
    const uint64_t t = tpf_sockboot_now_ns();
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
      const uint64_t soon = tpf_sockboot_now_ns() + 200000000ull;
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
  return tpf_sockboot_now_ns() + sb_bound_ms(sb) * 1000000ull;
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
    const uint64_t t = tpf_sockboot_now_ns();
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
    if (io_read(sb->fd, &h, sizeof h, tpf_sockboot_now_ns() + 10000000ull) == IO_OK &&
        h.magic == SB_MAGIC && h.kind == SB_ERROR)
      return sb_take_error(sb, &h, tpf_sockboot_now_ns() + 10000000ull);
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
                        tpf_sockboot_now_ns() + 200000000ull);
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
    if (tpf_sockboot_now_ns() >= deadline)
      return sb_fail(sb, TPF_ETIMEOUT,
                     "bootstrap setup: rank %d could not reach rank 0 at '%s' within %llu ms (%s)",
                     sb->rank, addr, (unsigned long long)sb->timeout_ms, strerror(e));
    tpf_sockboot_sleep_ms(5);
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
      if (lfd < 0) lfd = tpf_sockboot_listen(me->addr);
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
