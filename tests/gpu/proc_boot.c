#define _DEFAULT_SOURCE /* MAP_ANONYMOUS */
#include "proc_boot.h"

#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

struct proc_boot {
  pthread_barrier_t bar;
  int P;
  int rank[PROC_BOOT_MAXP]; /* the ctx each rank's bootstrap points at: its own rank */
  unsigned char buf[PROC_BOOT_MAXP][PROC_BOOT_SLOT];
};

/* A rank's ctx is &pb->rank[r]: the mapping and the rank follow from it. */
static proc_boot *of(void *ctx, int *rank) {
  *rank = *(int *)ctx;
  return (proc_boot *)((char *)ctx - offsetof(proc_boot, rank) - (size_t)*rank * sizeof(int));
}

static tpf_status pb_barrier(void *ctx) {
  int r;
  pthread_barrier_wait(&of(ctx, &r)->bar);
  return TPF_OK;
}

static tpf_status pb_allgather(void *ctx, const void *send, void *recv, size_t bytes) {
  int me;
  proc_boot *pb = of(ctx, &me);
  if (bytes > PROC_BOOT_SLOT)
    return tpf_set_error(TPF_EINVAL, "allgather of %zu bytes exceeds the %d-byte slot", bytes,
                         PROC_BOOT_SLOT);
  memcpy(pb->buf[me], send, bytes);
  pthread_barrier_wait(&pb->bar);
  for (int r = 0; r < pb->P; r++)
    memcpy((unsigned char *)recv + (size_t)r * bytes, pb->buf[r], bytes);
  pthread_barrier_wait(&pb->bar);
  return TPF_OK;
}

proc_boot *proc_boot_create(int P) {
  if (P < 1 || P > PROC_BOOT_MAXP) return NULL;
  proc_boot *pb =
      mmap(NULL, sizeof(proc_boot), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (pb == MAP_FAILED) {
    perror("mmap");
    return NULL;
  }
  pb->P = P;
  for (int r = 0; r < P; r++)
    pb->rank[r] = r;
  pthread_barrierattr_t ba;
  pthread_barrierattr_init(&ba);
  pthread_barrierattr_setpshared(&ba, PTHREAD_PROCESS_SHARED);
  pthread_barrier_init(&pb->bar, &ba, (unsigned)P);
  return pb;
}

void proc_boot_fill(proc_boot *pb, int rank, int device, tpf_bootstrap *out) {
  memset(out, 0, sizeof(*out));
  out->tp_size = pb->P;
  out->rank = rank;
  out->device = device;
  out->allgather = pb_allgather;
  out->barrier = pb_barrier;
  out->ctx = &pb->rank[rank];
}

void proc_boot_barrier(proc_boot *pb) {
  pthread_barrier_wait(&pb->bar);
}

int proc_boot_run(proc_boot *pb, int (*child)(proc_boot *pb, int rank)) {
  pid_t pids[PROC_BOOT_MAXP];
  int reaped[PROC_BOOT_MAXP] = {0};
  for (int r = 0; r < pb->P; r++) {
    fflush(stdout);
    pids[r] = fork();
    if (pids[r] < 0) {
      perror("fork");
      return 1;
    }
    if (pids[r] == 0) _exit(child(pb, r));
  }
  int worst = 0, skipped = 0;
  for (int done = 0; done < pb->P; done++) {
    int status = 0;
    const pid_t p = wait(&status);
    if (p < 0) break;
    for (int r = 0; r < pb->P; r++)
      if (pids[r] == p) reaped[r] = 1;
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (code == 77) {
      skipped++;
    } else if (code != 0 && worst == 0) {
      worst = code;
      for (int r = 0; r < pb->P; r++)
        if (!reaped[r]) kill(pids[r], SIGTERM);
    }
  }
  if (skipped == pb->P) return 77;
  return worst;
}
