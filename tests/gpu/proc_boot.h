/* A bootstrap between forked processes for the GPU tests (ranks as processes sharing one GPU):
 * a shared anonymous mapping with a process-shared barrier and one slot per rank for the
 * allgather. Create it before forking; each child fills a tpf_bootstrap from it. */
#ifndef TPF_GPU_PROC_BOOT_H
#define TPF_GPU_PROC_BOOT_H

#include "tpflex/tpflex_backend.h"
#include "tpflex/tpflex_cuda.h"

#define PROC_BOOT_MAXP 8
#define PROC_BOOT_SLOT 8192

typedef struct proc_boot proc_boot;

/* The mapping for P processes (1..PROC_BOOT_MAXP); NULL on failure (perror'd). */
proc_boot *proc_boot_create(int P);
/* Rank `rank`'s bootstrap over it (device: the CUDA device the rank uses). */
void proc_boot_fill(proc_boot *pb, int rank, int device, tpf_bootstrap *out);
/* The processes' barrier, as a test's own synchronisation point. */
void proc_boot_barrier(proc_boot *pb);
/* Forks the P processes, each exiting with child(pb, rank), and reaps them: 77 when every child
 * returned 77 (skipped: no GPU), else the first non-zero exit code (a failing child's partners
 * are stopped: they may wait in a barrier for it), 0 when all passed. */
int proc_boot_run(proc_boot *pb, int (*child)(proc_boot *pb, int rank));

#endif
