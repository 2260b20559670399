/* Section 1 of `tpflex bench`: the cost of set_active_shape on a communicator and on a manager
 * against destroying and creating them at the new shape (median and p99 per call, allocations
 * per call, live allocations before and after), and on CUDA the alternatives
 * (bench_cuda_setshape_alternatives).
 */
#define _POSIX_C_SOURCE 200809L
#include "bench.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h" /* tpf__alloc_live_count */

/* ---- section 1: set_active_shape cost ------------------------------------------------------ */

typedef struct {
  const bench_opts *o;
  int phase; /* 0 create, 1 time set_active_shape, 2 time destroy + create, 3 destroy */
  tpf_comm *comm[64];
  tpf_manager *mgr[64];
  long calls;
  double comm_med_ns, comm_p99_ns, mgr_med_ns, mgr_p99_ns;
  long long comm_allocs, mgr_allocs, live_delta;
  long long dev_delta;
  int realloc_n;
  double realloc_med_ns, realloc_p99_ns;
  long long realloc_allocs;
  atomic_int failed;
  tpf_status st;
  char err[300];
} bench_ss;

static uint64_t ss_rows(const bench_opts *o, long i) {
  static const uint64_t div[4] = {8, 4, 2, 1};
  return o->capacity / div[i & 3];
}

static void ss_fail(bench_ss *s, tpf_status st, const char *what) {
  if (!atomic_exchange(&s->failed, 1)) {
    s->st = st;
    snprintf(s->err, sizeof(s->err), "%s: %s (%s)", what, tpf_status_name(st), tpf_last_error());
  }
}

/* Times `calls` calls in batches of 100; per-call median and p99 over the batches. */
static void ss_loop(bench_ss *s, tpf_comm *c, tpf_manager *m, double *med, double *p99,
                    long long *allocs) {
  const int B = 100;
  int nb = (int)(s->calls / B);
  double *v = malloc((size_t)nb * sizeof(double));
  long long a0 = bench_alloc_calls();
  long k = 0;
  for (int b = 0; b < nb && v; b++) {
    double t0 = bench_now_ns();
    for (int i = 0; i < B; i++, k++) {
      tpf_shape sh = {ss_rows(s->o, k), s->o->hidden};
      tpf_status st = c ? tpf_comm_set_active_shape(c, sh) : tpf_manager_set_active_shape(m, sh);
      if (st != TPF_OK) {
        ss_fail(s, st, "set_active_shape");
        free(v);
        return;
      }
    }
    v[b] = (bench_now_ns() - t0) / B;
  }
  *allocs = bench_alloc_calls() - a0;
  if (v) {
    *med = bench_median(v, nb);
    *p99 = bench_quantile(v, nb, 0.99);
  }
  free(v);
}

static tpf_status ss_rank(bench_rank *rk, void *arg) {
  bench_ss *s = arg;
  const bench_opts *o = s->o;
  const int r = rk->rank;
  tpf_status st = TPF_OK;
  if (s->phase == 0) {
    tpf_comm_config cfg = {.name = "fc1_fprop",
                           .algo = TPF_ALGO_RING,
                           .coll = TPF_COLL_AG,
                           .dtype = TPF_BF16,
                           .capacity = {o->capacity, o->hidden}};
    st = tpf_comm_create(rk->be, &cfg, &s->comm[r]);
    if (st == TPF_OK) st = tpf_manager_create(rk->be, &s->mgr[r]);
    static const struct {
      const char *name;
      tpf_algo a;
      tpf_coll c;
    } sites[4] = {{"qkv_fprop", TPF_ALGO_RING, TPF_COLL_AG},
                  {"proj_fprop", TPF_ALGO_RING, TPF_COLL_RS},
                  {"fc1_fprop", TPF_ALGO_BULK, TPF_COLL_AG},
                  {"fc2_fprop", TPF_ALGO_PIPELINE, TPF_COLL_RS}};
    for (int i = 0; i < 4 && st == TPF_OK; i++) {
      tpf_comm_config mc = {.name = sites[i].name,
                            .algo = sites[i].a,
                            .coll = sites[i].c,
                            .dtype = TPF_BF16,
                            .capacity = {o->capacity, o->hidden}};
      tpf_comm *dummy;
      st = tpf_manager_add(s->mgr[r], &mc, &dummy);
    }
    if (st != TPF_OK) ss_fail(s, st, "create");
  } else if (s->phase == 1) {
    /* Rank 0 times; the others wait, so the timing host threads do not compete. */
    bench_barrier(rk);
    if (r == 0 && !atomic_load(&s->failed)) {
      long long live0 = tpf__alloc_live_count();
      long long d0 = rk->g->cuda ? bench_cuda_dev_used() : -1;
      ss_loop(s, s->comm[0], NULL, &s->comm_med_ns, &s->comm_p99_ns, &s->comm_allocs);
      ss_loop(s, NULL, s->mgr[0], &s->mgr_med_ns, &s->mgr_p99_ns, &s->mgr_allocs);
      s->live_delta = tpf__alloc_live_count() - live0;
      s->dev_delta = rk->g->cuda ? bench_cuda_dev_used() - d0 : 0;
    }
    bench_barrier(rk);
  } else if (s->phase == 2) {
    double *v = calloc((size_t)s->realloc_n, sizeof(double));
    long long a0 = bench_alloc_calls();
    int done = 0;
    for (int i = 0; i < s->realloc_n; i++) {
      bench_barrier(rk);
      if (atomic_load(&s->failed)) continue;
      double t0 = bench_now_ns();
      tpf_comm_config cfg = {.name = "fc1_fprop",
                             .algo = TPF_ALGO_RING,
                             .coll = TPF_COLL_AG,
                             .dtype = TPF_BF16,
                             .capacity = {ss_rows(o, i), o->hidden}};
      st = tpf_comm_destroy(s->comm[r]);
      s->comm[r] = NULL;
      if (st == TPF_OK) st = tpf_comm_create(rk->be, &cfg, &s->comm[r]);
      if (st != TPF_OK) {
        ss_fail(s, st, "destroy + create");
        continue;
      }
      if (v) v[done++] = bench_now_ns() - t0;
    }
    bench_barrier(rk);
    if (r == 0) {
      s->realloc_allocs = bench_alloc_calls() - a0;
      s->realloc_med_ns = bench_median(v, done);
      s->realloc_p99_ns = bench_quantile(v, done, 0.99);
    }
    free(v);
  } else {
    if (s->comm[r]) tpf_comm_destroy(s->comm[r]);
    if (s->mgr[r]) tpf_manager_destroy(s->mgr[r]);
    s->comm[r] = NULL;
    s->mgr[r] = NULL;
  }
  return TPF_OK;
}

static void ss_row(const char *method, int P, const bench_opts *o, long long calls, double med,
                   double p99, double allocs, double regs, double devmb, const char *what) {
  bench_cell_s(method);
  bench_cell_i(P);
  bench_cell_i((long long)o->capacity);
  bench_cell_i((long long)o->hidden);
  bench_cell_i(calls);
  bench_cell_f(med, med < 1e4 ? 1 : 0);
  bench_cell_f(p99, p99 < 1e4 ? 1 : 0);
  bench_cell_f(allocs, 2);
  bench_cell_f(regs, 2);
  bench_cell_f(devmb, 1);
  bench_cell_s(what);
  bench_row_end();
}

/* Section 1's rows after the timed set_active_shape loops (phase 1): the communicator's and
 * the manager's, then phase 2 (destroy + create) and its row; regs0 is the registrations count
 * before phase 1 (< 0: not counted). The status of the group's run. */
static tpf_status ss_table_rows(bench_group *g, bench_ss *s, long long regs0) {
  const bench_opts *o = s->o;
  const int P = o->tp;
  long long regs1 = bench_group_registrations(g);
  double nregs = regs0 < 0 ? NAN : (double)(regs1 - regs0) / (double)(2 * s->calls);
  ss_row("tpf_comm_set_active_shape", P, o, s->calls, s->comm_med_ns, s->comm_p99_ns,
         (double)s->comm_allocs / (double)s->calls, nregs,
         o->cuda ? (double)s->dev_delta / 1048576.0 / (double)(2 * s->calls) : NAN,
         o->cuda ? "tpflex: one communicator"
                 : "tpflex: one communicator (+ sim canary fill of inactive bytes)");
  ss_row("tpf_manager_set_active_shape", P, o, s->calls, s->mgr_med_ns, s->mgr_p99_ns,
         (double)s->mgr_allocs / (double)s->calls, nregs, NAN,
         o->cuda ? "tpflex: manager of 4 communicators"
                 : "tpflex: manager of 4 communicators (+ sim canary fill)");
  bench_progress("[1/4 setshape] timing %d destroy + create (re-registration)", s->realloc_n);
  s->phase = 2;
  tpf_status st = bench_group_run(g, ss_rank, s);
  long long regs2 = bench_group_registrations(g);
  if (st == TPF_OK && !s->failed)
    ss_row("tpf_comm_destroy+create", P, o, s->realloc_n, s->realloc_med_ns, s->realloc_p99_ns,
           (double)s->realloc_allocs / (double)(s->realloc_n * P),
           regs0 < 0 ? NAN : (double)(regs2 - regs1) / (double)s->realloc_n, NAN,
           o->cuda ? "alternative: re-register at the new size (cudaMalloc path)"
                   : "alternative: re-register at the new size (arena path)");
  bench_note("allocs/call: allocations through tpflex's allocator per call (all ranks for "
             "destroy+create, per rank); live allocations changed by %lld over the "
             "set_active_shape loops",
             s->live_delta);
  if (regs0 >= 0)
    bench_note("regs/call: collective registrations the simulator counted per call");
  else
    bench_note("regs/call: not counted by this backend; devMB/call: device memory in use "
               "(cudaMemGetInfo) before minus after, per call");
  return st;
}

int bench_section_setshape(const bench_opts *o0) {
  /* The simulator's reg_activate writes a canary over every inactive byte (a check only the
   * simulator makes), so its set_active_shape costs O(C*H); a narrow buffer keeps 1e5 calls
   * quick there. The CUDA backend's activation touches no memory: it runs at the full shape. */
  bench_opts o1 = *o0;
  if (!o0->cuda) o1.hidden = 16;
  const bench_opts *o = &o1;
  const int P = o->tp;
  static const char *const cols[] = {"method",    "P",          "C",      "H",
                                     "calls",     "median_ns",  "p99_ns", "allocs/call",
                                     "regs/call", "devMB/call", "what"};
  bench_table("setshape",
              "Section 1: cost of changing T (host time per call; T cycles C/8, C/4, "
              "C/2, C)",
              11, cols);
  if (!o->cuda)
    bench_note("simulator: H=16 here; its set_active_shape writes a canary over every inactive "
               "byte (a simulator-only check), O(C*H) per call");
  if (o->capacity % (8ull * (uint64_t)P) != 0) {
    bench_note("skipped: capacity %llu is not a multiple of 8*P", (unsigned long long)o->capacity);
    return 1;
  }
  bench_group *g = NULL;
  bench_progress("[1/4 setshape] creating a group of %d ranks", P);
  tpf_status st = bench_group_create(o, P, &g);
  if (st != TPF_OK) {
    bench_note("FAILED: group: %s (%s)", tpf_status_name(st), tpf_last_error());
    return 1;
  }
  bench_ss *s = calloc(1, sizeof(*s));
  s->o = o;
  s->calls = o->setshape_calls;
  s->realloc_n = o->realloc_iters;
  int rc = 0;
  s->phase = 0;
  st = bench_group_run(g, ss_rank, s);
  long long regs0 = bench_group_registrations(g);
  if (st == TPF_OK && !s->failed) {
    bench_progress("[1/4 setshape] timing %ld set_active_shape calls", s->calls);
    s->phase = 1;
    st = bench_group_run(g, ss_rank, s);
  }
  if (st == TPF_OK && !s->failed) st = ss_table_rows(g, s, regs0);
  if (st != TPF_OK || s->failed) {
    bench_note("FAILED: %s", s->failed ? s->err : tpf_last_error());
    rc = 1;
  }
  s->phase = 3;
  bench_group_run(g, ss_rank, s);
  if (o->cuda && rc == 0) rc |= bench_cuda_setshape_alternatives(o);
  free(s);
  bench_group_destroy(g);
  return rc;
}
