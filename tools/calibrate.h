/* The measurement of a cost table on one CUDA device (calibrate_cuda.c), below the command
 * `tpflex calibrate` (cmd_calibrate.c: options, the simulator's table, --schedules through the
 * bench library, the writer). Includes nothing of the backends: the CUDA backend is measured
 * through the public API and the probes of tpflex_cuda.h.
 */
#ifndef TPF_CALIBRATE_H
#define TPF_CALIBRATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tpflex/tpflex.h"
#include "tpflex/tpflex_cost.h"

/* Whether this build measures CUDA devices (calibrate_cuda.c is a stub without CUDA). */
#ifdef TPF_HAVE_CUDA
#define CAL_HAVE_CUDA 1
#else
#define CAL_HAVE_CUDA 0
#endif

/* The command's options (cmd_calibrate.c parses them). */
typedef struct {
  bool cuda;
  const char *out;
  tpf_dtype dtype;
  bool quick;
  int device, peer;
  uint64_t hidden;
  int nns;
  uint64_t ns[2];
  int iters;
  bool fp8;          /* --fp8 on: E4M3 x E4M3 -> bf16 GEMM points too */
  bool schedules;    /* --schedules */
  uint64_t capacity; /* the grid of --schedules */
  int tp;
  int sched_iters, sched_warmup;
  char cmdline[512];
} cal_opts;

/* What a measurement saw, for the table's comments and the summary. */
typedef struct {
  char gpu[400];
  double gemm_tf_lo, gemm_tf_hi;
  double fp8_tf_lo, fp8_tf_hi; /* --fp8: the E4M3 GEMMs' range */
  int nfp8;                    /* --fp8: points measured */
  double peer_res, local_res, reduce_res;
  double h_gemm, h_copy, h_event, h_kernel;
  int ctas;
  bool peer_other;
  double seconds;
} cal_report;

/* CUDA devices this process can use (0: none, or a build without CUDA; *why then says so, in
 * a buffer of len bytes). */
int cal_cuda_device_count(char *why, size_t len);

/* Measures the cost table of o->device into *t (gemm points in o->dtype and, with o->fp8,
 * fp8_e4m3; copy peer/local, reduce, launch, handshake, barrier), the report into *rep. Progress
 * lines go to stderr. TPF_OK, or the failure's status with tpf_last_error() naming it
 * (TPF_EUNSUPPORTED in a build without CUDA). */
tpf_status cal_cuda_measure(const cal_opts *o, tpf_cost_table *t, cal_report *rep);

#endif
