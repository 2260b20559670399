/* The conformance body, compiled once per backend (libuv runs one test on two I/O backends).
 * A backend's test file fills a tpf_conf_env (harness/rank_env.h) and calls
 * tpf_conformance_main. */
#ifndef TPF_CONFORMANCE_H
#define TPF_CONFORMANCE_H

#include "rank_env.h" /* tpf_conf_env: the backend's ranks and operand memory */
#include "staging.h"

/* Runs the sweep (P, T, algo/coll, dtype, shape histories); prints cases and wall time; returns
 * 0 when every case passed. argv may narrow the sweep (--quick, --tp N). */
int tpf_conformance_main(tpf_conf_env *env, int argc, char **argv);

#endif
