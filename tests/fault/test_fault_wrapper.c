/* The fault-injecting wrapper backend (tpflex_fault.h) over the simulator: the k-th call loop.
 *
 * Method: one rank's backend is wrapped; its k-th counted call fails (transient or persistent)
 * for every k the script reaches, for two algorithms, two group sizes and the first and last
 * rank. The script is what a training step does: create (allgather + reg_create), then per
 * microbatch set_active_shape (reg_activate), one operation (execute) and tpf_comm_sync
 * (reg_sync), then destroy. Checked per case:
 *   - the faulted rank's calls before k succeed, and its first failure is the injected one,
 *     with its call number in the detail;
 *   - every other rank either succeeds or first fails with a status the fault explains
 *     (TPF_ETIMEOUT naming the faulted rank, or TPF_EMISMATCH when the faulted rank skipped a
 *     shape change or an operation), never a wrong result: an operation that returns TPF_OK on
 *     a rank gathered or reduced exactly the right values;
 *   - every case ends within its bound, and destroy leaves no registration in the world.
 * Then a dropped SEND (a lost completion): the receiver's RECV times out naming the sender.
 */
#define _POSIX_C_SOURCE 200809L
#include "tpf_test.h"
#include "tpflex/tpflex_fault.h"
#include "tpflex/tpflex_sim.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

#define H 16
#define TIMEOUT_MS 150
#define NMB 2 /* microbatches per script */

typedef struct {
  tpf_status st;
  char msg[320];
} rec;

typedef struct {
  int P, f; /* group size, faulted rank */
  tpf_algo algo;
  tpf_coll coll;
  tpf_fault_plan plan;
  struct {
    rec create, shape[NMB], op[NMB], sync[NMB], destroy;
    bool wrong; /* an op returned TPF_OK with wrong values */
    char wrong_msg[200];
    uint64_t calls;
  } rk[4];
} wcase;

static void put(rec *r, tpf_status st) {
  r->st = st;
  snprintf(r->msg, sizeof r->msg, "%s", st == TPF_OK ? "" : tpf_last_error());
}

static float xval(int owner, uint64_t i, uint64_t j) {
  return (float)((owner * 7 + (int)i * 3 + (int)j) % 11) - 5.0f;
}

/* One microbatch: RING AG gathers rank-valued rows (checked exactly); PIPELINE RS reduces x·w^T
 * with w = identity-like so that each output is a sum of small integers (exact in fp32). */
static tpf_status one_op(wcase *cs, tpf_comm *c, int rank, uint64_t T, int mb) {
  const uint64_t R = T / (uint64_t)cs->P;
  static _Thread_local float d[64 * 8], w[16 * 16], x[64 * 16], out[64 * 16];
  if (cs->algo == TPF_ALGO_RING) {
    tpf_matrix loc;
    TPF_CHECK(tpf_comm_local_chunk(c, &loc));
    for (uint64_t i = 0; i < R; i++)
      for (uint64_t j = 0; j < H; j++)
        ((float *)loc.ptr)[i * loc.ld + j] = xval(0, (uint64_t)rank * R + i, j);
    memset(w, 0, sizeof w);
    tpf_matrix wm = {w, 8, H, H, TPF_FP32}, dm = {d, T, 8, 8, TPF_FP32};
    TPF_CHECK(tpf_ag_gemm(c, &wm, &dm, NULL));
    tpf_matrix full;
    TPF_CHECK(tpf_comm_buffer(c, &full));
    for (uint64_t i = 0; i < T; i++)
      for (uint64_t j = 0; j < H; j++)
        if (((float *)full.ptr)[i * full.ld + j] != xval(0, i, j)) {
          cs->rk[rank].wrong = true;
          snprintf(cs->rk[rank].wrong_msg, sizeof cs->rk[rank].wrong_msg,
                   "microbatch %d: gathered (%llu, %llu) is %g, expected %g", mb,
                   (unsigned long long)i, (unsigned long long)j,
                   (double)((float *)full.ptr)[i * full.ld + j], (double)xval(0, i, j));
          return TPF_OK;
        }
    return TPF_OK;
  }
  /* out = rows of sum_q x_q · I^T: element (i, j) = sum_q xval(q, i, j). */
  for (uint64_t i = 0; i < T; i++)
    for (uint64_t j = 0; j < H; j++)
      x[i * H + j] = xval(rank, i, j);
  memset(w, 0, sizeof w);
  for (int j = 0; j < H; j++)
    w[j * H + j] = 1.0f;
  tpf_matrix xm = {x, T, H, H, TPF_FP32}, wm = {w, H, H, H, TPF_FP32};
  tpf_matrix om = {out, R, H, H, TPF_FP32};
  TPF_CHECK(tpf_gemm_rs(c, &xm, &wm, &om, NULL));
  for (uint64_t i = 0; i < R; i++)
    for (uint64_t j = 0; j < H; j++) {
      float want = 0.0f;
      for (int q = 0; q < cs->P; q++)
        want += xval(q, (uint64_t)rank * R + i, j);
      if (out[i * H + j] != want) {
        cs->rk[rank].wrong = true;
        snprintf(cs->rk[rank].wrong_msg, sizeof cs->rk[rank].wrong_msg,
                 "microbatch %d: reduced (%llu, %llu) is %g, expected %g", mb,
                 (unsigned long long)i, (unsigned long long)j, (double)out[i * H + j],
                 (double)want);
        return TPF_OK;
      }
    }
  return TPF_OK;
}

static tpf_status script(tpf_backend *inner, int rank, void *arg) {
  wcase *cs = arg;
  tpf_backend *be = inner;
  tpf_fault_plan none = TPF_FAULT_PLAN_INIT;
  TPF_CHECK(tpf_fault_backend_create(inner, rank == cs->f ? &cs->plan : &none, &be));
  tpf_comm_config cfg =
      tpf_test_config("wrapped", cs->algo, cs->coll, TPF_FP32, 4u * (uint64_t)cs->P, H);
  tpf_comm *c = NULL;
  put(&cs->rk[rank].create, tpf_comm_create(be, &cfg, &c));
  if (c) {
    for (int mb = 0; mb < NMB; mb++) {
      uint64_t T = (uint64_t)(mb + 1) * (uint64_t)cs->P;
      put(&cs->rk[rank].shape[mb], tpf_comm_set_active_shape(c, (tpf_shape){T, H}));
      put(&cs->rk[rank].op[mb],
          cs->rk[rank].shape[mb].st == TPF_OK ? one_op(cs, c, rank, T, mb) : TPF_ESTATE);
      put(&cs->rk[rank].sync[mb], tpf_comm_sync(c));
    }
    put(&cs->rk[rank].destroy, tpf_comm_destroy(c));
  }
  tpf_fault_report rep;
  TPF_CHECK(tpf_fault_backend_report(be, &rep));
  cs->rk[rank].calls = rep.calls;
  return tpf_fault_backend_destroy(be);
}

/* The records of one rank in script order. */
static int records(wcase *cs, int r, rec **out) {
  int n = 0;
  out[n++] = &cs->rk[r].create;
  for (int mb = 0; mb < NMB; mb++) {
    out[n++] = &cs->rk[r].shape[mb];
    out[n++] = &cs->rk[r].op[mb];
    out[n++] = &cs->rk[r].sync[mb];
  }
  out[n++] = &cs->rk[r].destroy;
  return n;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Runs one case in a fresh world; returns the faulted rank's counted calls. */
static uint64_t run_case(wcase *cs, char *why, size_t len) {
  why[0] = '\0';
  tpf_sim_config sc = TPF_SIM_CONFIG_INIT;
  sc.tp_size = cs->P;
  sc.timeout_ms = TIMEOUT_MS;
  tpf_sim_world *w = NULL;
  if (tpf_sim_world_create(&sc, &w) != TPF_OK) {
    snprintf(why, len, "world: %s", tpf_last_error());
    return 0;
  }
  double t0 = now_s();
  tpf_status st = tpf_sim_run(w, script, cs);
  double secs = now_s() - t0;
  tpf_sim_fault_report rep;
  tpf_sim_get_fault_report(w, &rep);
  tpf_sim_world_destroy(w);
  if (st != TPF_OK) snprintf(why, len, "run: %s", tpf_last_error());
  if (secs > 12.0 * TIMEOUT_MS / 1000.0)
    snprintf(why, len, "took %.2f s (bound %.2f s)", secs, 12.0 * TIMEOUT_MS / 1000.0);
  if (rep.live_registrations != 0)
    snprintf(why, len, "%llu registrations left after destroy",
             (unsigned long long)rep.live_registrations);
  /* The faulted rank: OK before the injected call, then the injected failure first. */
  const uint64_t k = cs->plan.fail_call;
  char want[64];
  snprintf(want, sizeof want, "injected fault: call %llu (", (unsigned long long)k);
  rec *rs[16];
  for (int r = 0; r < cs->P && !why[0]; r++) {
    int n = records(cs, r, rs);
    if (cs->rk[r].wrong) {
      snprintf(why, len, "rank %d returned TPF_OK with a wrong result: %s", r, cs->rk[r].wrong_msg);
      break;
    }
    int first = -1;
    for (int i = 0; i < n && first < 0; i++)
      if (rs[i]->st != TPF_OK) first = i;
    if (r == cs->f) {
      if (k <= cs->rk[r].calls && (first < 0 || !strstr(rs[first]->msg, want)))
        snprintf(why, len, "rank %d: first failure %s '%s' is not the injected call %llu", r,
                 first < 0 ? "none" : tpf_status_name(rs[first]->st),
                 first < 0 ? "" : rs[first]->msg, (unsigned long long)k);
      continue;
    }
    /* A peer's first failure must be one the fault explains: a wait that timed out naming the
     * faulted rank, a disagreement detected before any byte moved (the faulted rank skipped a
     * shape change or an operation), or the refusal of a communicator already failed. Later
     * records repeat the deferred status; wrong results were checked above. */
    if (first < 0) continue;
    tpf_status s = rs[first]->st;
    char dead[32], dead2[32];
    snprintf(dead, sizeof dead, "rank(s) %d", cs->f);
    snprintf(dead2, sizeof dead2, "rank %d", cs->f);
    bool names = strstr(rs[first]->msg, dead) || strstr(rs[first]->msg, dead2);
    if (!((s == TPF_ETIMEOUT && names) || s == TPF_EMISMATCH || s == TPF_ESTATE))
      snprintf(why, len, "rank %d call %d: %s '%s' is not explained by rank %d's fault", r, first,
               tpf_status_name(s), rs[first]->msg, cs->f);
  }
  return cs->rk[cs->f].calls;
}

static void test_wrapper__kth_call_loop(void **state) {
  (void)state;
  const struct {
    int P;
    tpf_algo algo;
    tpf_coll coll;
  } groups[] = {{2, TPF_ALGO_RING, TPF_COLL_AG}, {3, TPF_ALGO_PIPELINE, TPF_COLL_RS}};
  int cases = 0, bad = 0, absorbed = 0;
  for (size_t g = 0; g < sizeof groups / sizeof groups[0]; g++)
    for (int persistent = 0; persistent < 2; persistent++)
      for (int fi = 0; fi < 2; fi++) {
        const int P = groups[g].P, f = fi ? P - 1 : 0;
        for (uint64_t k = 1;; k++) {
          static wcase cs;
          memset(&cs, 0, sizeof cs);
          cs.P = P;
          cs.f = f;
          cs.algo = groups[g].algo;
          cs.coll = groups[g].coll;
          cs.plan = (tpf_fault_plan)TPF_FAULT_PLAN_INIT;
          cs.plan.fail_call = k;
          cs.plan.fail_persistent = persistent != 0;
          cs.plan.fail_status = TPF_EBACKEND;
          char why[400];
          uint64_t calls = run_case(&cs, why, sizeof why);
          cases++;
          if (why[0]) {
            bad++;
            if (bad <= 10)
              print_message("BAD P=%d %s f=%d k=%llu%s: %s\n", P, tpf_algo_name(cs.algo), f,
                            (unsigned long long)k, persistent ? " persistent" : "", why);
          }
          if (k > calls) { /* the script made fewer calls: the fault never fired */
            absorbed++;
            break;
          }
        }
      }
  print_message("wrapper k-th call loop: %d cases (%d past the script's last call), %d bad\n",
                cases, absorbed, bad);
  assert_int_equal(bad, 0);
  assert_true(cases > 40);
}

static void test_wrapper__dropped_send_times_out(void **state) {
  (void)state;
  static wcase cs;
  memset(&cs, 0, sizeof cs);
  cs.P = 2;
  cs.f = 0;
  cs.algo = TPF_ALGO_RING;
  cs.coll = TPF_COLL_AG;
  cs.plan = (tpf_fault_plan)TPF_FAULT_PLAN_INIT;
  cs.plan.drop_send = 1; /* rank 0's first SEND: rank 1's RECV never completes */
  tpf_sim_config sc = TPF_SIM_CONFIG_INIT;
  sc.tp_size = 2;
  sc.timeout_ms = TIMEOUT_MS;
  tpf_sim_world *w = NULL;
  TPF_ASSERT_OK(tpf_sim_world_create(&sc, &w));
  TPF_ASSERT_OK(tpf_sim_run(w, script, &cs));
  TPF_ASSERT_OK(tpf_sim_world_destroy(w));
  TPF_ASSERT_OK(cs.rk[0].op[0].st); /* the sender finishes: it waits only for its own RECV */
  TPF_ASSERT_STATUS(cs.rk[1].op[0].st, TPF_ETIMEOUT);
  if (!strstr(cs.rk[1].op[0].msg, "RECV") || !strstr(cs.rk[1].op[0].msg, "waits for rank 0"))
    fail_msg("receiver's timeout does not name the RECV and rank 0: %s", cs.rk[1].op[0].msg);
  TPF_ASSERT_STATUS(cs.rk[1].op[1].st, TPF_ESTATE); /* failed communicator refuses */
  print_message("dropped SEND: rank 1: %s\n", cs.rk[1].op[0].msg);
}

static void test_wrapper__bad_arguments(void **state) {
  (void)state;
  tpf_backend *fb = NULL;
  TPF_ASSERT_STATUS(tpf_fault_backend_create(NULL, NULL, &fb), TPF_EINVAL);
  tpf_mock_backend m;
  tpf_mock_init(&m, 1, 0);
  tpf_fault_plan p = TPF_FAULT_PLAN_INIT;
  p.size = sizeof p + 4;
  TPF_ASSERT_STATUS(tpf_fault_backend_create(&m.hdr, &p, &fb), TPF_EINVAL);
  TPF_ASSERT_OK(tpf_fault_backend_create(&m.hdr, NULL, &fb));
  assert_string_equal(fb->ops->name, "fault(mock)");
  assert_int_equal(fb->ops->caps, m.hdr.ops->caps);
  TPF_ASSERT_STATUS(tpf_fault_backend_destroy(&m.hdr), TPF_EINVAL); /* not a wrapper */
  TPF_ASSERT_STATUS(tpf_fault_backend_report(fb, NULL), TPF_EINVAL);
  TPF_ASSERT_STATUS(tpf_fault_backend_set_plan(fb, &p), TPF_EINVAL);
  TPF_ASSERT_OK(tpf_fault_backend_destroy(fb));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_wrapper__kth_call_loop),
      cmocka_unit_test(test_wrapper__dropped_send_times_out),
      cmocka_unit_test(test_wrapper__bad_arguments),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
