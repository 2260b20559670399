/* The lean enqueue's host-side decisions (backend_cuda/cuda_exec.c, tpf_cuda__lean_prepare), on
 * the CPU with the core's real schedules and stand-in stream handles: which RECVs are virtual
 * (only those of a stream that holds RECVs alone, has a CUDA stream of its own, in a host-ordered
 * group), which peers the handshake's device wait covers (a ring's SEND and RECV peers; every
 * peer with PEER_REDUCE or BULK), each step's predecessor on its stream; and the enqueue
 * statistics call's argument checks and kind names. */
#define _POSIX_C_SOURCE 200809L
#include "cuda_state.h"
#include "tpf_test.h"

#include <stdlib.h>

typedef struct {
  tpf_cuda_backend b;
  tpf_reg r;
  tpf_schedule s;
  bool virt[TPF_NUM_STREAMS];
  int last[TPF_NUM_STREAMS];
} lean_case;

/* Distinct stand-in handles: never passed to CUDA. */
static char handles[TPF_NUM_STREAMS];

/* Builds rank r's schedule of P ranks and runs lean_prepare on it. compute_streams: distinct
 * compute streams (the rest alias stream 0, as the backend does when ranks share a device). */
static void run_case(lean_case *c, tpf_algo algo, tpf_coll coll, int splits, bool aggregate, int P,
                     int r, const tpf_cuda_transport *tp, int compute_streams) {
  memset(c, 0, sizeof *c);
  tpf_layout_desc d =
      tpf_test_layout_desc(algo, coll, P, r, 32 * (uint64_t)P, 16, splits, aggregate);
  tpf_gemm_dims g = {d.active.rows, 16, 16};
  if (algo == TPF_ALGO_BULK)
    g = (tpf_gemm_dims){24, 40, 56};
  else if (coll == TPF_COLL_RS)
    g = (tpf_gemm_dims){d.active.rows, 16, 72};
  TPF_ASSERT_OK(tpf_schedule_build(&d, &g, &c->s));
  c->b.base.tp_size = P;
  c->b.base.rank = r;
  for (int k = 0; k < TPF_NUM_STREAMS; k++)
    c->b.streams[k] = (cudaStream_t)(void *)&handles[k];
  for (int k = compute_streams; k < TPF_MAX_COMPUTE_STREAMS; k++)
    c->b.streams[k] = c->b.streams[0];
  c->b.step_virt = calloc((size_t)c->s.nsteps, 1);
  c->b.step_prev = calloc((size_t)c->s.nsteps, sizeof(int16_t));
  assert_non_null(c->b.step_virt);
  assert_non_null(c->b.step_prev);
  c->r.tp = tp;
  for (int q = 0; q < P; q++)
    c->r.peer_tp[q] = q == r ? NULL : tp;
  tpf_cuda__lean_prepare(&c->b, &c->r, &c->s, c->virt, c->last);
}

static void free_case(lean_case *c) {
  free(c->b.step_virt);
  free(c->b.step_prev);
  tpf_schedule_free(&c->s);
}

static uint64_t bit(int q) {
  return 1ull << (unsigned)q;
}

/* step_prev and last agree with the schedule's streams; every virtual step is a RECV on a virtual
 * stream and every RECV on a virtual stream is virtual. */
static void check_structure(const lean_case *c) {
  int last[TPF_NUM_STREAMS];
  for (int k = 0; k < TPF_NUM_STREAMS; k++)
    last[k] = -1;
  for (int i = 0; i < c->s.nsteps; i++) {
    const tpf_step *st = &c->s.steps[i];
    assert_int_equal(c->b.step_prev[i], last[st->stream]);
    last[st->stream] = i;
    assert_int_equal(c->b.step_virt[i] != 0, c->virt[st->stream]);
    if (c->b.step_virt[i]) assert_int_equal(st->kind, TPF_STEP_RECV);
  }
  for (int k = 0; k < TPF_NUM_STREAMS; k++)
    assert_int_equal(c->last[k], last[k]);
}

static int count_virtual(const lean_case *c) {
  int n = 0;
  for (int i = 0; i < c->s.nsteps; i++)
    n += c->b.step_virt[i];
  return n;
}

static int count_kind(const lean_case *c, tpf_step_kind kind) {
  int n = 0;
  for (int i = 0; i < c->s.nsteps; i++)
    n += c->s.steps[i].kind == kind;
  return n;
}

/* RING AG: the RECV stream is virtual (all P-1 RECVs); the handshake covers next and prev only. */
static void test_ring_ag(void **state) {
  (void)state;
  for (int P = 2; P <= 8; P++)
    for (int r = 0; r < P; r++)
      for (int splits = 0; splits <= 1; splits++) {
        lean_case c;
        run_case(&c, TPF_ALGO_RING, TPF_COLL_AG, splits, false, P, r, &tpf_cuda__transport_events,
                 1);
        check_structure(&c);
        assert_true(c.virt[TPF_STREAM_RECV]);
        assert_false(c.virt[TPF_STREAM_COMM]);
        assert_false(c.virt[TPF_STREAM_COMPUTE0]);
        assert_int_equal(count_virtual(&c), P - 1);
        assert_int_equal(count_kind(&c, TPF_STEP_RECV), P - 1);
        assert_int_equal(c.b.hs_peers, bit((r + 1) % P) | bit((r + P - 1) % P));
        free_case(&c);
      }
}

/* The aggregate ring: the partner and the ranks two away. */
static void test_ring_ag_aggregate(void **state) {
  (void)state;
  for (int P = 4; P <= 8; P += 2)
    for (int r = 0; r < P; r++) {
      lean_case c;
      run_case(&c, TPF_ALGO_RING, TPF_COLL_AG, 0, true, P, r, &tpf_cuda__transport_events, 3);
      check_structure(&c);
      assert_true(c.virt[TPF_STREAM_RECV]);
      /* The pair swap with r ^ 1, then 2-chunk messages to r + 2 and from r - 2. */
      assert_int_equal(c.b.hs_peers, bit(r ^ 1) | bit((r + 2) % P) | bit((r - 2 + P) % P));
      free_case(&c);
    }
}

/* RING RS: every RECV virtual; the handshake covers the peers it sends to and receives from. */
static void test_ring_rs(void **state) {
  (void)state;
  for (int P = 2; P <= 8; P++)
    for (int r = 0; r < P; r++) {
      lean_case c;
      run_case(&c, TPF_ALGO_RING, TPF_COLL_RS, 0, false, P, r, &tpf_cuda__transport_events, 3);
      check_structure(&c);
      uint64_t want = 0;
      for (int i = 0; i < c.s.nsteps; i++) {
        const tpf_step *st = &c.s.steps[i];
        if (st->kind == TPF_STEP_SEND || st->kind == TPF_STEP_RECV) want |= bit(st->peer);
      }
      assert_int_not_equal(want, 0);
      assert_int_equal(c.b.hs_peers, want);
      assert_int_equal(count_virtual(&c), count_kind(&c, TPF_STEP_RECV));
      free_case(&c);
    }
}

/* PIPELINE RS (PEER_REDUCE reads every peer) and BULK: every peer; no RECV stream of RECVs. */
static void test_every_peer(void **state) {
  (void)state;
  const struct {
    tpf_algo algo;
    tpf_coll coll;
    int splits;
  } v[] = {{TPF_ALGO_PIPELINE, TPF_COLL_RS, 4},
           {TPF_ALGO_PIPELINE, TPF_COLL_RS, 1},
           {TPF_ALGO_BULK, TPF_COLL_AG, 0},
           {TPF_ALGO_BULK, TPF_COLL_RS, 0}};
  for (size_t i = 0; i < sizeof v / sizeof v[0]; i++)
    for (int P = 2; P <= 8; P += 3) {
      lean_case c;
      run_case(&c, v[i].algo, v[i].coll, v[i].splits, false, P, 1, &tpf_cuda__transport_events, 3);
      check_structure(&c);
      for (int q = 0; q < P; q++)
        if (q != 1) assert_true((c.b.hs_peers >> q) & 1u);
      free_case(&c);
    }
}

/* No virtual RECV with the device flags (not host-ordered), nor when the RECV stream shares its
 * CUDA stream, nor for a peer whose transport publishes no events; one rank has none at all. */
static void test_not_virtual(void **state) {
  (void)state;
  lean_case c;
  run_case(&c, TPF_ALGO_RING, TPF_COLL_AG, 0, false, 4, 1, &tpf_cuda__transport_flags, 3);
  check_structure(&c);
  assert_int_equal(count_virtual(&c), 0);
  free_case(&c);

  run_case(&c, TPF_ALGO_RING, TPF_COLL_AG, 0, false, 4, 1, &tpf_cuda__transport_events, 3);
  c.b.streams[TPF_STREAM_RECV] = c.b.streams[TPF_STREAM_COMM];
  tpf_cuda__lean_prepare(&c.b, &c.r, &c.s, c.virt, c.last);
  check_structure(&c);
  assert_int_equal(count_virtual(&c), 0);
  free_case(&c);

  run_case(&c, TPF_ALGO_RING, TPF_COLL_AG, 0, false, 4, 1, &tpf_cuda__transport_events, 3);
  c.r.peer_tp[0] = &tpf_cuda__transport_flags; /* the RECV peer of rank 1 */
  tpf_cuda__lean_prepare(&c.b, &c.r, &c.s, c.virt, c.last);
  check_structure(&c);
  assert_int_equal(count_virtual(&c), 0);
  free_case(&c);

  run_case(&c, TPF_ALGO_RING, TPF_COLL_AG, 0, false, 1, 0, &tpf_cuda__transport_events, 3);
  check_structure(&c);
  assert_int_equal(count_virtual(&c), 0);
  assert_int_equal(c.b.hs_peers, 0);
  free_case(&c);
}

/* Stand-in events: the address of an entry (never passed to CUDA). */
static char fake_ev[4096];

/* Prepares the wait plan's state of an operation: every virtual RECV's peer event (a stand-in per
 * step, its sender's order in the step order, the sender's COMM stream), step events, nothing
 * waited yet. */
static void plan_setup(lean_case *c, cudaEvent_t *step_ev, tpf_cuda_peer_ev *pev) {
  memset(c->b.waited_step, 0xff, sizeof c->b.waited_step);
  memset(c->b.waited_peer, 0, sizeof c->b.waited_peer);
  c->b.lean = true;
  c->b.step_ev = step_ev;
  c->b.step_pev = pev;
  for (int i = 0; i < c->s.nsteps; i++) {
    step_ev[i] = (cudaEvent_t)(void *)&fake_ev[i];
    pev[i] = (tpf_cuda_peer_ev){(cudaEvent_t)(void *)&fake_ev[2048 + i], c->s.steps[i].peer,
                                TPF_STREAM_COMM, (uint32_t)(i + 1)};
  }
}

static bool planned(const cudaEvent_t *ev, int n, cudaEvent_t want) {
  for (int k = 0; k < n; k++)
    if (ev[k] == want) return true;
  return false;
}

/* The step a RING RS REDUCE (the last step) waits for: every RECV's peer event, though it names
 * only the last RECV (the stream order of the RECV stream stands behind the others), each once.
 * A regression test: a first version marked the chain covered before walking it and waited for
 * the last RECV's sender only (wrong sums on the H200, session 5 round 3). */
static void test_plan_ring_rs(void **state) {
  (void)state;
  static cudaEvent_t step_ev[512], out[TPF_CUDA_WAIT_MAX];
  static tpf_cuda_peer_ev pev[512];
  for (int P = 2; P <= 8; P++)
    for (int r = 0; r < P; r++) {
      lean_case c;
      run_case(&c, TPF_ALGO_RING, TPF_COLL_RS, 0, false, P, r, &tpf_cuda__transport_events, 1);
      plan_setup(&c, step_ev, pev);
      const int red = c.s.nsteps - 1;
      const tpf_step *st = &c.s.steps[red];
      assert_int_equal(st->kind, TPF_STEP_REDUCE);
      int n = 0;
      for (int k = 0; k < st->ndeps; k++)
        n = tpf_cuda__wait_plan(&c.b, &c.s, (int)st->stream, c.b.streams[st->stream], st->deps[k],
                                out, n, TPF_CUDA_WAIT_MAX);
      int recvs = 0;
      for (int i = 0; i < c.s.nsteps; i++)
        if (c.b.step_virt[i]) {
          recvs++;
          assert_true(planned(out, n, pev[i].ev));
        }
      assert_int_equal(recvs, P - 1);
      /* the peers' events and the handshake's (a dependency of the first RECV) */
      assert_true(n >= recvs && n <= recvs + 1);
      for (int a = 0; a < n; a++)
        for (int b2 = a + 1; b2 < n; b2++)
          assert_ptr_not_equal(out[a], out[b2]);
      /* Planned once: asking again adds nothing. */
      assert_int_equal(tpf_cuda__wait_plan(&c.b, &c.s, (int)st->stream, c.b.streams[st->stream],
                                           st->deps[st->ndeps - 1], out, 0, TPF_CUDA_WAIT_MAX),
                       0);
      /* Too small an output: refused, not cut. */
      memset(c.b.waited_step, 0xff, sizeof c.b.waited_step);
      memset(c.b.waited_peer, 0, sizeof c.b.waited_peer);
      if (P > 2)
        assert_int_equal(tpf_cuda__wait_plan(&c.b, &c.s, (int)st->stream, c.b.streams[st->stream],
                                             st->deps[st->ndeps - 1], out, 0, 1),
                         -1);
      free_case(&c);
    }
}

/* RING AG: every RECV from the same peer's COMM stream; the last GEMM's wait needs the latest
 * publication only (it implies the earlier ones), and a later wait on an earlier RECV adds
 * nothing. Without the lean enqueue every RECV would be a real step: no virtual events. */
static void test_plan_ring_ag(void **state) {
  (void)state;
  static cudaEvent_t step_ev[512], out[TPF_CUDA_WAIT_MAX];
  static tpf_cuda_peer_ev pev[512];
  lean_case c;
  run_case(&c, TPF_ALGO_RING, TPF_COLL_AG, 0, false, 8, 3, &tpf_cuda__transport_events, 1);
  plan_setup(&c, step_ev, pev);
  int last_recv = -1, first_recv = -1;
  for (int i = 0; i < c.s.nsteps; i++)
    if (c.b.step_virt[i]) {
      if (first_recv < 0) first_recv = i;
      last_recv = i;
    }
  cudaStream_t cs = c.b.streams[TPF_STREAM_COMPUTE0];
  int n = tpf_cuda__wait_plan(&c.b, &c.s, TPF_STREAM_COMPUTE0, cs, last_recv, out, 0,
                              TPF_CUDA_WAIT_MAX);
  assert_true(planned(out, n, pev[last_recv].ev));
  for (int i = first_recv; i < last_recv; i++)
    if (c.b.step_virt[i]) assert_false(planned(out, n, pev[i].ev));
  assert_int_equal(tpf_cuda__wait_plan(&c.b, &c.s, TPF_STREAM_COMPUTE0, cs, first_recv, out, 0, 8),
                   0);
  free_case(&c);
}

/* tpf_cuda_backend_enqueue_stats refuses what is not a CUDA backend and bad sizes; the kind
 * names. */
static void test_stats_api(void **state) {
  (void)state;
  tpf_backend fake;
  memset(&fake, 0, sizeof fake);
  tpf_cuda_enqueue_stats st = {0};
  assert_int_equal(tpf_cuda_backend_enqueue_stats(NULL, &st), TPF_EINVAL);
  assert_int_equal(tpf_cuda_backend_enqueue_stats(&fake, &st), TPF_EINVAL);
  assert_non_null(strstr(tpf_last_error(), "not a CUDA backend"));
  const char *want[TPF_CUDA_ENQ_COUNT] = {"gemm", "copy", "signal", "record", "wait", "peer_wait"};
  for (int k = 0; k < TPF_CUDA_ENQ_COUNT; k++)
    assert_string_equal(tpf_cuda_enq_kind_name((tpf_cuda_enq_kind)k), want[k]);
  assert_string_equal(tpf_cuda_enq_kind_name(TPF_CUDA_ENQ_COUNT), "?");
  assert_string_equal(tpf_cuda_enq_kind_name((tpf_cuda_enq_kind)-1), "?");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_ring_ag),      cmocka_unit_test(test_ring_ag_aggregate),
      cmocka_unit_test(test_ring_rs),      cmocka_unit_test(test_every_peer),
      cmocka_unit_test(test_not_virtual),  cmocka_unit_test(test_plan_ring_rs),
      cmocka_unit_test(test_plan_ring_ag), cmocka_unit_test(test_stats_api),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
