/* Ranks as processes: the socket bootstrap, tpf_bootstrap between processes without MPI
 * (harness library; implemented in sockboot.c). The launcher (launcher.h, which includes this
 * header) starts the processes and hands each its tpf_launch_rank; a rank started by something
 * else may fill one itself.
 *
 * Rendezvous. The launcher creates a listening Unix socket (Linux abstract namespace: no file,
 * nothing to clean up) before starting any rank; rank 0 inherits it, every other rank connects to
 * its name. A connection is queued by the kernel even before rank 0 accepts, so there is no start
 * race. Ranks started by something else may use the same bootstrap: rank 0 then binds the name
 * itself and the others retry their connect until the timeout.
 *
 * Bootstrap. Rank 0 is the hub: an allgather is every rank sending its bytes to rank 0, which
 * answers each with all of them in rank order; a barrier is an allgather of nothing. Every wait is
 * bounded by the bootstrap's timeout, and a dead peer is seen at once (its connection closes):
 * the call fails with TPF_ETIMEOUT naming the rank, never hangs. A failure is sticky and spreads:
 * the failing rank closes its connection (rank 0 first sends the reason to everyone), so every
 * rank's next bootstrap call fails promptly with a message naming the rank that went away.
 *
 * Plain POSIX plus Linux's abstract sockets; no CUDA.
 */
#ifndef TPF_SOCKBOOT_H
#define TPF_SOCKBOOT_H

#include "tpflex/tpflex_backend.h" /* TPF_MAX_RANKS */
#include "tpflex/tpflex_cuda.h"    /* tpf_bootstrap */

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TPF_LAUNCH_ADDR_BYTES 108 /* sizeof sockaddr_un.sun_path */
/* Bound of every bootstrap wait in ms when the caller passes 0 (default 120000, as the CUDA
 * backend's own bootstraps; TPF_CUDA_BOOT_TIMEOUT_MS is read too). */
#define TPF_LAUNCH_ENV_TIMEOUT "TPF_BOOT_TIMEOUT_MS"

/* Who a rank is and where its group meets. */
typedef struct {
  int rank, nranks;
  char addr[TPF_LAUNCH_ADDR_BYTES]; /* "@name" (abstract socket) or a socket path */
  int listen_fd;                    /* rank 0 started by a launcher: the listening socket; or -1 */
  void *shared;                     /* fork mode: the launch's shared memory, or NULL */
  size_t shared_bytes;
} tpf_launch_rank;

/* Joins the group as me->rank and fills *out for tpf_cuda_backend_create (tp_size, rank, device,
 * allgather, barrier, ctx). Collective: returns once every rank has joined. timeout_ms bounds
 * each bootstrap call (0: TPF_BOOT_TIMEOUT_MS, TPF_CUDA_BOOT_TIMEOUT_MS, else 120000). TPF_EINVAL,
 * TPF_ENOMEM, TPF_ETIMEOUT (a rank never joined, or left), TPF_EMISMATCH (ranks disagree on the
 * group size or two claim one rank), TPF_EBACKEND (socket errors, with errno's text). */
tpf_status tpf_sockboot_create(const tpf_launch_rank *me, int device, uint64_t timeout_ms,
                               tpf_bootstrap *out);
/* Closes the connections and frees the context; NULL or an already freed bootstrap is a no-op. */
void tpf_sockboot_free(tpf_bootstrap *b);
/* Changes the bound of later bootstrap calls (ms, > 0). TPF_EINVAL otherwise. */
tpf_status tpf_sockboot_set_timeout(tpf_bootstrap *b, uint64_t timeout_ms);

/* A listening socket at addr ("@name": Linux's abstract namespace; else a path), close-on-exec:
 * the launcher's rendezvous. -1 with errno on failure. */
int tpf_sockboot_listen(const char *addr);
/* The monotonic clock in nanoseconds, and a sleep that resumes after signals (the launcher's
 * supervision loop uses them too). */
uint64_t tpf_sockboot_now_ns(void);
void tpf_sockboot_sleep_ms(unsigned ms);

#ifdef __cplusplus
}
#endif
#endif /* TPF_SOCKBOOT_H */
