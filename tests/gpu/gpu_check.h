/* A self-contained end-to-end check of one rank of the CUDA backend, shared by the GPU tests
 * (threads on one GPU, and processes through CUDA IPC): every algorithm/collective on a small
 * fixed-capacity communicator through a history of active shapes, each result compared with the
 * independent host reference, and the registered bytes beyond the active layout checked against
 * a canary after every operation (device memory read back). */
#ifndef TPF_GPU_CHECK_H
#define TPF_GPU_CHECK_H

#include "tpflex/tpflex_backend.h"

#include <cuda_runtime.h>

typedef struct {
  int cases;    /* operations checked */
  int failures; /* operations with a wrong result or a damaged canary */
  int verbose;  /* print one line per operation (rank 0) */
} gpu_check_stats;

/* Runs the sweep on this rank; every rank of the group must call it with the same arguments
 * except rank-local ones. Returns the first API failure (results are counted in st). */
tpf_status gpu_check_rank(tpf_backend *be, int rank, cudaStream_t stream, gpu_check_stats *st);

#endif
