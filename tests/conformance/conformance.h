/* The conformance body, compiled once per backend (libuv runs one test on two I/O backends).
 * A backend's test file fills a tpf_conf_env (harness/rank_env.h) and calls
 * tpf_conformance_main. */
#ifndef TPF_CONFORMANCE_H
#define TPF_CONFORMANCE_H

#include "rank_env.h" /* tpf_conf_env: the backend's ranks and operand memory */
#include "staging.h"

#include <stdbool.h>

/* Runs the sweep (P, T, algo/coll, dtype, shape histories); prints cases and wall time; returns
 * 0 when every case passed. argv may narrow the sweep (--quick, --tp N). own_order: the backend
 * sums a GEMM's products in its own order (CUDA: cuBLASLt), so every GEMM result is judged with
 * SPEC §7's fp32 accumulation-order slack gamma_K sum_k |a_ik b_jk| (tpf_ref_order_slack); false
 * for the simulator, which sums in the reference's order and is held exact. */
int tpf_conformance_main(tpf_conf_env *env, bool own_order, int argc, char **argv);

#endif
