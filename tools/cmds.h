/* Subcommands of the tpflex command-line tool; tools/tpflex_main.c dispatches to them. Each takes
 * the arguments after the subcommand name (argv[0] is the subcommand) and returns the process
 * exit status: 0 success, 1 a failed check or run, 2 bad arguments. */
#ifndef TPF_CMDS_H
#define TPF_CMDS_H

/* tpflex plan: prints the layout and every rank's schedule, then runs the schedule checker. */
int tpf_cmd_plan(int argc, char **argv);
/* tpflex demo: packed-sequence microbatches through one fixed-capacity manager. */
int tpf_cmd_demo(int argc, char **argv);
/* tpflex bench: nccl-tests style timing tables. */
int tpf_cmd_bench(int argc, char **argv);
/* tpflex calibrate: measures this machine's cost table for the planner. */
int tpf_cmd_calibrate(int argc, char **argv);

#ifdef TPF_HAVE_CUDA
/* The demo's CUDA environment (written with the CUDA backend, e.g. in backend_cuda/ or tools/):
 * fills *env (tests/conformance/conformance.h's tpf_conf_env: run P rank threads each with its
 * own CUDA backend, device memory, uploads/downloads, streams) for tp_size ranks on the GPUs of
 * this machine. Declared weak so that a build without it still links; tpflex demo --backend cuda
 * then says so. TPF_EUNSUPPORTED when fewer GPUs than needed, TPF_EBACKEND. */
struct tpf_conf_env;
#include "tpflex/tpflex.h"
tpf_status tpf_demo_cuda_env(struct tpf_conf_env *env, int tp_size)
#if defined(__GNUC__)
    __attribute__((weak))
#endif
    ;
#endif

#endif /* TPF_CMDS_H */
