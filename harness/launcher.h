/* Ranks as processes for tests and benchmarks (harness library; `tpflex bench --mode procs`,
 * `tpflex demo --mode procs` and the process-mode tests): a launcher that starts P processes,
 * each a rank (fork for a function, or fork + exec for a command), supervises them (bounded
 * waits, exit codes, ranks that die with their launcher) and brings forked ranks' results back.
 * Implemented in launcher.c. The ranks meet through the socket bootstrap (sockboot.h, included
 * here: the rendezvous, tpf_launch_rank and tpf_sockboot_create), whose listening socket the
 * launcher creates before starting any rank.
 *
 * Plain POSIX; no CUDA, so the CPU tests use it with forked processes and the GPU tests with
 * ranks that each own a CUDA context.
 */
#ifndef TPF_LAUNCHER_H
#define TPF_LAUNCHER_H

#include "sockboot.h" /* tpf_launch_rank, the bootstrap */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Environment of an exec'd rank (and of a forked one, for commands it may exec itself). */
#define TPF_LAUNCH_ENV_RANK "TPF_LAUNCH_RANK"
#define TPF_LAUNCH_ENV_NRANKS "TPF_LAUNCH_NRANKS"
#define TPF_LAUNCH_ENV_ADDR "TPF_LAUNCH_ADDR"
#define TPF_LAUNCH_ENV_FD "TPF_LAUNCH_LISTEN_FD"

/* What a forked rank runs; its return value is the process's exit status (0..255). */
typedef int (*tpf_launch_fn)(const tpf_launch_rank *me, void *arg);

typedef struct tpf_launch tpf_launch;

/* Starts nranks (1..TPF_MAX_RANKS) forked processes, rank r running fn(me, arg) and exiting with
 * its return value. A rank dies (SIGKILL) when the process that launched it dies (strictly, the
 * launching thread: Linux's PR_SET_PDEATHSIG), so a launcher killed by a harness leaves no ranks
 * behind. shared_bytes > 0 maps that many zeroed bytes MAP_SHARED before the fork:
 * the parent (tpf_launch_shared) and every rank (me->shared) see the same memory, which is how
 * results come back. The parent must not have initialised CUDA (a forked child of such a process
 * cannot use it); tpf_launch_in_child probes a device without touching CUDA here. TPF_EINVAL,
 * TPF_ENOMEM, TPF_EBACKEND (socket, mmap or fork failed; ranks already started are killed). */
tpf_status tpf_launch_fork(int nranks, size_t shared_bytes, tpf_launch_fn fn, void *arg,
                           tpf_launch **out);
/* tpf_launch_fork for code written for ranks as threads, which leave their results in memory the
 * caller reads afterwards: results points to results_bytes bytes (0: the extent of the heap
 * block it starts, tpf_launch_heap_extent) that the ranks write into, each its own parts. A rank
 * that returns from fn copies its final bytes of *results into shared memory; tpf_launch_merge
 * then brings them into the caller's *results. */
tpf_status tpf_launch_fork_merging(int nranks, size_t shared_bytes, tpf_launch_fn fn, void *arg,
                                   void *results, size_t results_bytes, tpf_launch **out);
/* After tpf_launch_wait: a three-way merge of every finished rank's copy of *results against the
 * unchanged original (a byte takes the value a rank wrote; ranks that died before returning from
 * fn contribute nothing, and *merged tells which did, when not NULL). Exact when ranks write
 * disjoint bytes, as threads must to avoid a data race; two ranks writing different values into
 * one byte fail with TPF_EINVAL naming both and the byte, leaving *results unchanged. */
tpf_status tpf_launch_merge(tpf_launch *l, void *results, bool *merged);
/* The extent of the heap block that starts at p: malloc's usable size, when p lies in the heap
 * or in an anonymous writable mapping (malloc's large blocks). TPF_EINVAL otherwise (a stack or
 * static address, where no extent can be known). p must be a block's start, as malloc returned
 * it. */
tpf_status tpf_launch_heap_extent(void *p, size_t *bytes);

/* Starts nranks processes of the command argv (argv[0] a path, or a name looked up in PATH), each
 * with TPF_LAUNCH_RANK, TPF_LAUNCH_NRANKS and TPF_LAUNCH_ADDR in its environment (rank 0 also
 * TPF_LAUNCH_LISTEN_FD); the rank reads them with tpf_launch_rank_from_env. Statuses as above. */
tpf_status tpf_launch_exec(int nranks, char *const argv[], tpf_launch **out);
/* Waits for every rank, at most timeout_ms in all (0: no bound). When a rank ends abnormally (a
 * signal, or an exit status other than 0 and 77) and grace_ms > 0, the others get grace_ms more,
 * then are killed. Ranks still running at a bound are killed with SIGKILL and reaped. codes[r]
 * (may be NULL) receives each rank's exit status, or 128 + signal. TPF_OK when every rank ended
 * by itself (whatever its status), TPF_ETIMEOUT naming the ranks that had to be killed. */
tpf_status tpf_launch_wait(tpf_launch *l, uint64_t timeout_ms, uint64_t grace_ms, int *codes);
/* The launch's shared memory (NULL without) and its process ids. */
void *tpf_launch_shared(const tpf_launch *l);
pid_t tpf_launch_pid(const tpf_launch *l, int rank);
/* The rendezvous name ("@tpflex-boot-..."), e.g. to check that nothing is left of it. */
const char *tpf_launch_addr(const tpf_launch *l);
/* Kills (SIGKILL) and reaps ranks still running, closes the socket, unmaps the shared memory. */
void tpf_launch_free(tpf_launch *l);

/* Runs fn(arg) in a forked child and returns its exit status (0..255; 128 + signal when it was
 * killed; -1 when fork failed). For questions the parent must not ask itself, such as the CUDA
 * device count before forking ranks that use CUDA. */
int tpf_launch_in_child(int (*fn)(void *arg), void *arg);

/* The device of a rank when device_count GPUs are visible: rank % device_count (0 without). */
int tpf_launch_device(int rank, int device_count);

/* Fills *me from the TPF_LAUNCH_* environment of an exec'd rank. TPF_EINVAL when it is absent or
 * malformed. */
tpf_status tpf_launch_rank_from_env(tpf_launch_rank *me);

#ifdef __cplusplus
}
#endif
#endif /* TPF_LAUNCHER_H */
