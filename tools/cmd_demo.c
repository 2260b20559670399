/* tpflex demo: packed-sequence microbatches of varying T through one fixed-capacity manager.
 *
 * Method: the host draws a stream of microbatches (random sequence lengths packed up to a random
 * fill of the capacity C; T is the packed length rounded up to a multiple of P). Every rank
 * creates one manager once, with the communicators of a TransformerEngine layer under their TE
 * names and default methods (te-userbuffers.md §8): ring-exchange AG for qkv_fprop, fc1_fprop,
 * proj_dgrad and fc2_dgrad; pipeline RS for proj_fprop and fc2_fprop; bulk AG for qkv_dgrad and
 * fc1_dgrad and bulk RS for qkv_wgrad and fc1_wgrad, each beside its independent GEMM; proj_wgrad
 * and fc2_wgrad are external and stay at capacity. Those registrations are the only ones the
 * run makes. For each microbatch every rank sets the manager's active shape [T, H] and runs the
 * ten operations with the tensor-parallel shapes of a transformer layer, then checks each result
 * against the independent host reference (harness/reference.c) with SPEC §7's rule;
 * gathered buffers must match byte for byte.
 *
 * Bytes: for every operation the demo builds every rank's schedule at T and at C with the core's
 * builder and sums what crosses ranks (SEND payloads, peer reads of PEER_REDUCE); on the
 * simulator it also reads the bytes the backend actually moved and requires them to equal the
 * schedule's. The capacity figure is what padding every microbatch to C would have moved.
 *
 * Ranks meet after each microbatch so that rank 0 prints a complete table row: at a barrier as
 * threads of this process, through the bootstrap as processes (--mode procs, the simulator with
 * one process per rank, as torchrun launches them).
 *
 * This file is the flow, to be read as an example of the API (examples/hello_tpflex.c is the
 * one-page version): the layer's communicators, one manager per rank, set_active_shape and the
 * operations per microbatch. The rest of the demo is in the rooms demo.h lists.
 */
#define _POSIX_C_SOURCE 200809L
#include "cmds.h"
#include "demo.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the layer ---- */

/* Registration order (the manager's); ops run in kOrder. mult: qkv 3, attention/proj 1, fc 4. */
static const demo_site kSites[] = {
    {"qkv_fprop", TPF_ALGO_RING, TPF_COLL_AG, false, DEMO_OP_AG_GEMM, 3},
    {"proj_fprop", TPF_ALGO_PIPELINE, TPF_COLL_RS, false, DEMO_OP_GEMM_RS, 1},
    {"fc1_fprop", TPF_ALGO_RING, TPF_COLL_AG, false, DEMO_OP_AG_GEMM, 4},
    {"fc2_fprop", TPF_ALGO_PIPELINE, TPF_COLL_RS, false, DEMO_OP_GEMM_RS, 4},
    {"qkv_dgrad", TPF_ALGO_BULK, TPF_COLL_AG, false, DEMO_OP_BULK, 3},
    {"qkv_wgrad", TPF_ALGO_BULK, TPF_COLL_RS, false, DEMO_OP_BULK, 3},
    {"fc1_dgrad", TPF_ALGO_BULK, TPF_COLL_AG, false, DEMO_OP_BULK, 4},
    {"fc1_wgrad", TPF_ALGO_BULK, TPF_COLL_RS, false, DEMO_OP_BULK, 4},
    {"proj_dgrad", TPF_ALGO_RING, TPF_COLL_AG, false, DEMO_OP_AG_GEMM, 1},
    {"fc2_dgrad", TPF_ALGO_RING, TPF_COLL_AG, false, DEMO_OP_AG_GEMM, 4},
    {"proj_wgrad", TPF_ALGO_BULK, TPF_COLL_AG, true, DEMO_OP_NONE, 1},
    {"fc2_wgrad", TPF_ALGO_BULK, TPF_COLL_AG, true, DEMO_OP_NONE, 4},
};
#define NSITES ((int)(sizeof kSites / sizeof kSites[0]))
/* Forward, then backward (TE's order within a layer). */
static const int kOrder[] = {0, 1, 2, 3, 9, 6, 7, 8, 4, 5};
#define NOPS ((int)(sizeof kOrder / sizeof kOrder[0]))

/* ---- one operation ---- */

/* Runs site si at T on this rank: inputs, the operation, the checks. API failures are returned,
 * wrong results recorded in r. */
static tpf_status run_site(demo_site_mem *sm, int si, tpf_comm *c, uint64_t mbi, uint64_t T,
                           demo_rank_mb *r, double *op_ms) {
  demo_ctx *d = sm->d;
  const demo_site *s = &kSites[si];
  demo_operands io;
  tpf_status rc = demo_stage_inputs(sm, si, c, mbi, T, &io);
  if (rc == TPF_OK) {
    const double t0 = demo_now_s();
    const uint64_t o0 = d->now_ns(d);
    if (s->op == DEMO_OP_AG_GEMM) /* D = AG(X) W^T: X is this rank's chunk of the buffer */
      rc = tpf_ag_gemm(c, &io.wd, &io.od, sm->stream);
    else if (s->op == DEMO_OP_GEMM_RS) /* this rank's rows of RS(X W^T) */
      rc = tpf_gemm_rs(c, &io.xd, &io.wd, &io.od, sm->stream);
    else /* D = A B^T beside the bulk AG or RS of the buffer */
      rc = tpf_bulk_overlap(c, &io.xd, &io.wd, &io.od, sm->stream);
    if (rc == TPF_OK) rc = d->env->sync(d->env, sm->rank, sm->be); /* the stream's work is done */
    *op_ms += (demo_now_s() - t0) * 1e3;
    if (d->trace)
      tpf_trace_span(d->trace, sm->rank, TPF_TRACE_HOST_TID, s->name, s->name, o0, d->now_ns(d), 0,
                     0);
  }
  if (rc == TPF_OK && d->o.check) rc = demo_check_site(sm, si, c, mbi, T, &io, r);
  demo_operands_free(&io);
  return rc;
}

/* ---- the rank function ---- */

/* One microbatch on this rank: one set_active_shape, then the operations. API failures are
 * returned (the first), wrong results recorded in the rank's row of d->res. */
static tpf_status run_microbatch(demo_ctx *d, tpf_manager *m, tpf_comm **comm, demo_site_mem *mem,
                                 int rank, int mb) {
  const demo_opts *o = &d->o;
  tpf_status rc = TPF_OK;
  demo_rank_mb *res = &d->res[(size_t)mb * (size_t)o->P + (size_t)rank];
  res->ok = true;
  uint64_t T = d->mb[mb].T;
  uint64_t h0 = d->now_ns(d);
  tpf_shape active = {T, o->H};
  tpf_status st = tpf_manager_set_active_shape(m, active);
  if (st != TPF_OK) {
    demo_fail(res, "set_active_shape [%llu, %llu]: %s: %s", (unsigned long long)T,
              (unsigned long long)o->H, tpf_status_name(st), tpf_last_error());
    rc = st;
  }
  for (int k = 0; k < NOPS && st == TPF_OK; k++) {
    int si = kOrder[k];
    st = run_site(&mem[si], si, comm[si], (uint64_t)mb, T, res, &res->op_ms);
    if (st != TPF_OK) {
      demo_fail(res, "%s: %s: %s", kSites[si].name, tpf_status_name(st), tpf_last_error());
      rc = st;
    }
  }
  if (d->trace) {
    char name[48];
    snprintf(name, sizeof name, "microbatch %d T=%llu", mb + 1, (unsigned long long)T);
    tpf_trace_span(d->trace, rank, TPF_TRACE_HOST_TID, name, "microbatch", h0, d->now_ns(d), 0,
                   (uint64_t)mb + 1);
  }
  return rc;
}

/* One rank: a manager registers every communicator once at capacity (collective); then per
 * microbatch one set_active_shape (local: views and offsets only) and the operations. */
static tpf_status rank_main(tpf_backend *be, int rank, void *arg) {
  demo_ctx *d = arg;
  const demo_opts *o = &d->o;
  tpf_manager *m = NULL;
  tpf_comm *comm[NSITES] = {0};
  demo_site_mem mem[NSITES];
  memset(mem, 0, sizeof mem);
  void *stream = d->env->stream(d->env, rank);
  tpf_status rc = tpf_manager_create(be, &m);
  for (int i = 0; i < NSITES && rc == TPF_OK; i++) {
    tpf_comm_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.name = kSites[i].name;
    cfg.algo = kSites[i].algo;
    cfg.coll = kSites[i].coll;
    cfg.dtype = o->dtype;
    cfg.capacity.rows = o->C;
    cfg.capacity.cols = o->H;
    cfg.external = kSites[i].external;
    rc = tpf_manager_add(m, &cfg, &comm[i]);
    mem[i].d = d;
    mem[i].be = be;
    mem[i].rank = rank;
    mem[i].stream = stream;
    if (rc == TPF_OK) rc = demo_site_mem_init(&mem[i], &kSites[i]);
  }
  bool go = true;
  tpf_status mt = demo_meet(d, rank, -1, rc != TPF_OK, &go); /* every rank's managers exist */
  if (rc == TPF_OK) rc = mt;
  uint64_t regs0 = 0;
  if (rank == 0 && d->bytes_moved) d->measured_total = d->bytes_moved(d);
  if (rank == 0 && d->registrations) regs0 = d->regs_setup = d->registrations(d);
  demo_meet_done(d);

  for (int mb = 0; mb < o->mbs && go; mb++) {
    tpf_status st = run_microbatch(d, m, comm, mem, rank, mb);
    if (rc == TPF_OK) rc = st;
    mt = demo_meet(d, rank, mb, rc != TPF_OK, &go); /* every rank's results of mb */
    if (mt != TPF_OK) {
      rc = rc == TPF_OK ? mt : rc;
      break; /* a peer went away: there is no complete row to print */
    }
    if (rank == 0) demo_report_mb(d, mb);
    demo_meet_done(d);
  }

  /* Every rank has finished its microbatches once rank 0 has passed the last meeting. */
  if (rank == 0 && d->registrations) {
    d->regs_loop = d->registrations(d) - regs0;
    d->have_registrations = true;
  }
  for (int i = 0; i < NSITES; i++)
    demo_site_mem_free(&mem[i]);
  if (m) {
    tpf_status st = tpf_manager_destroy(m);
    if (rc == TPF_OK) rc = st;
  }
  return rc;
}

/* ---- the command ---- */

/* Plans the microbatches, runs them on every rank and prints the summary: the exit status. */
static int run(demo_ctx *d, tpf_conf_env *env) {
  const demo_opts *o = &d->o;
  d->mb = calloc((size_t)o->mbs, sizeof *d->mb);
  d->res = calloc((size_t)o->mbs * (size_t)o->P, sizeof *d->res);
  if (!d->mb || !d->res) {
    fprintf(stderr, "tpflex demo: out of memory\n");
    return 1;
  }
  if (demo_plan(d) != 0) return 1;
  if (o->trace && tpf_trace_create(&d->trace) != TPF_OK) {
    fprintf(stderr, "tpflex demo: %s\n", tpf_last_error());
    return 1;
  }
  pthread_barrier_init(&d->barrier, NULL, (unsigned)o->P);
  demo_print_header(d);
  d->t_start = demo_now_s();
  d->t_progress = d->t_start;
  tpf_status st = env->run(env, o->P, rank_main, d);
  double wall = demo_now_s() - d->t_start;
  bool pass = demo_print_summary(d, st, wall);
  pthread_barrier_destroy(&d->barrier);
  return pass ? 0 : 1;
}

int tpf_cmd_demo(int argc, char **argv) {
  demo_ctx *d = calloc(1, sizeof *d);
  if (!d) return 1;
  d->layer = (demo_layer){kSites, NSITES, kOrder, NOPS};
  d->measured_ok = true;
  tpf_conf_env env;
  int rc = demo_parse(argc, argv, &d->layer, &d->o);
  if (rc < 0) rc = demo_env_open(d, &env);
  if (rc < 0) {
    rc = run(d, &env);
    demo_env_close(&env);
  }
  tpf_trace_destroy(d->trace);
  free(d->mb);
  free(d->res);
  free(d);
  return rc;
}
