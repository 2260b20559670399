/* The independent checker rejects broken schedules: each case builds a valid group, breaks one
 * thing by hand, and expects TPF_EINVAL with a detail naming the rank, the step and the fault. */
#include "tpf_test.h"

#define MAXP 8

static tpf_schedule g_s[MAXP];
static int g_p;

static void build(tpf_algo algo, tpf_coll coll, int P, uint64_t T, uint64_t H, int splits) {
  g_p = P;
  for (int r = 0; r < P; r++) {
    tpf_layout_desc d = tpf_test_layout_desc(algo, coll, P, r, T, H, splits, false);
    tpf_gemm_dims g = {T, H, H};
    if (algo == TPF_ALGO_BULK) g = (tpf_gemm_dims){8, 8, 8};
    TPF_ASSERT_OK(tpf_schedule_build(&d, &g, &g_s[r]));
  }
  TPF_ASSERT_OK(tpf_schedule_check(g_s, P)); /* valid before it is broken */
}

static void free_all(void) {
  for (int r = 0; r < g_p; r++)
    tpf_schedule_free(&g_s[r]);
}

static int find(const tpf_schedule *s, tpf_step_kind kind, int nth) {
  for (int i = 0; i < s->nsteps; i++)
    if (s->steps[i].kind == kind && nth-- == 0) return i;
  fail_msg("rank %d has no %s #%d", s->rank, tpf_step_kind_name(kind), nth);
  return -1;
}

static void expect_reject(const char *what, const char *detail1, const char *detail2) {
  tpf_status rc = tpf_schedule_check(g_s, g_p);
  if (rc != TPF_EINVAL)
    fail_msg("%s: checker returned %s (%s)", what, tpf_status_name(rc), tpf_last_error());
  const char *msg = tpf_last_error();
  if (!strstr(msg, detail1) || (detail2 && !strstr(msg, detail2)))
    fail_msg("%s: detail '%s' lacks '%s' / '%s'", what, msg, detail1, detail2 ? detail2 : "");
  printf("  rejected %-32s %s\n", what, msg);
  free_all();
}

/* RING AG, P = 4, T = 16, H = 8, fp32: chunk bytes 128. Steps per rank: 0 HANDSHAKE, then per
 * i: GEMM, SEND, RECV (3i+1, 3i+2, 3i+3), and the last GEMM at 10. */
static void ring_ag(void) {
  build(TPF_ALGO_RING, TPF_COLL_AG, 4, 16, 8, 0);
}

static void test_missing_recv(void **state) {
  (void)state;
  ring_ag();
  tpf_test_remove_step(&g_s[2], find(&g_s[2], TPF_STEP_RECV, 0));
  tpf_step *first = &g_s[2].steps[find(&g_s[2], TPF_STEP_RECV, 0)];
  first->deps[first->ndeps++] = 0; /* the next RECV is now first on its stream */
  expect_reject("missing recv", "rank 1 step 2 (SEND): no matching RECV on rank 2 with tag 0",
                NULL);
}

static void test_missing_send(void **state) {
  (void)state;
  ring_ag();
  tpf_test_remove_step(&g_s[3], find(&g_s[3], TPF_STEP_SEND, 2));
  expect_reject("missing send", "rank 0 step", "(RECV): no matching SEND on rank 3 with tag 2");
}

static void test_duplicate_send(void **state) {
  (void)state;
  ring_ag();
  g_s[0].steps[find(&g_s[0], TPF_STEP_SEND, 1)].tag = 0;
  expect_reject("duplicate send",
                "rank 0 step 5 (SEND): duplicate: step 2 already uses peer 1 tag 0", NULL);
}

static void test_wrong_bytes(void **state) {
  (void)state;
  ring_ag();
  g_s[0].steps[2].bytes = 64;
  expect_reject("wrong bytes", "rank 0 step 2 (SEND): rank 1 step 3 disagrees: bytes 64 vs 128",
                NULL);
}

static void test_wrong_dst(void **state) {
  (void)state;
  ring_ag();
  g_s[0].steps[2].dst_off = 256;
  expect_reject("wrong dst offset", "rank 0 step 2 (SEND)", "dst_off 256 vs 0");
}

static void test_write_outside_active(void **state) {
  (void)state;
  build(TPF_ALGO_RING, TPF_COLL_AG, 2, 8, 8, 0); /* active bytes 8*8*4 = 256 */
  g_s[0].steps[2].dst_off = 256;                 /* rank 0 SEND_0 -> rank 1 RECV_0 */
  g_s[1].steps[3].dst_off = 256;
  expect_reject("write outside active layout",
                "rank 1 step 3 (RECV): writes bytes [256, 384) outside the active layout [0, 256)",
                NULL);
}

static void test_read_outside_active(void **state) {
  (void)state;
  build(TPF_ALGO_RING, TPF_COLL_AG, 2, 8, 8, 0);
  g_s[0].steps[2].src_off = 200;
  expect_reject("send from outside active", "rank 0 step 2 (SEND)",
                "reads bytes [200, 328) of rank 0 outside the active layout [0, 256)");
}

static void test_gemm_before_arrival(void **state) {
  (void)state;
  ring_ag();
  tpf_step *g1 = &g_s[1].steps[4]; /* GEMM_1 on compute1: deps {0, RECV_0 = 3} */
  assert_int_equal(g1->kind, TPF_STEP_GEMM);
  assert_int_equal(g1->ndeps, 2);
  g1->ndeps = 1;
  expect_reject("GEMM before its chunk arrived",
                "rank 1 step 4 (GEMM): reads bytes [0, 128) of rank 1 before they arrived", NULL);
}

static void test_forward_before_arrival(void **state) {
  (void)state;
  ring_ag();
  g_s[2].steps[5].ndeps = 0; /* SEND_1 forwards the chunk RECV_0 brings */
  expect_reject("forward before arrival", "rank 2 step 5 (SEND): reads bytes [128, 256)",
                "before they arrived");
}

static void test_forward_dep(void **state) {
  (void)state;
  ring_ag();
  g_s[3].steps[4].deps[0] = 4;
  expect_reject("self dep", "rank 3 step 4 (GEMM): dep 4 does not point to an earlier step", NULL);
  ring_ag();
  g_s[0].steps[5].deps[0] = 9;
  expect_reject("forward dep", "rank 0 step 5 (SEND): dep 9 does not point to an earlier step",
                NULL);
}

static void test_double_output(void **state) {
  (void)state;
  ring_ag();
  g_s[2].steps[4].d.row = g_s[2].steps[1].d.row;
  expect_reject("double-written D rows", "rank 2 step 4 (GEMM): writes output rows [8, +4)",
                "that step 1 also writes: not exactly once");
}

static void test_double_buffer_write(void **state) {
  (void)state;
  build(TPF_ALGO_RING, TPF_COLL_RS, 4, 16, 8, 0);
  int g0 = find(&g_s[1], TPF_STEP_GEMM, 0), g2 = find(&g_s[1], TPF_STEP_GEMM, 2);
  g_s[1].steps[g2].d.off_bytes = g_s[1].steps[g0].d.off_bytes;
  expect_reject("double-written slot", "rank 1 step", "also writes: not exactly once");
}

static void test_never_produced(void **state) {
  (void)state;
  build(TPF_ALGO_BULK, TPF_COLL_AG, 2, 8, 8, 0);
  tpf_test_remove_step(&g_s[1], find(&g_s[1], TPF_STEP_SEND, 0));
  tpf_test_remove_step(&g_s[0], find(&g_s[0], TPF_STEP_RECV, 0));
  expect_reject("chunk never received", "rank 0: active byte 128 of [0, 256) is never produced",
                NULL);
}

static void test_deadlock(void **state) {
  (void)state;
  build(TPF_ALGO_BULK, TPF_COLL_AG, 2, 8, 8, 0); /* 0 HS, 1 GEMM, 2 SEND, 3 RECV */
  for (int r = 0; r < 2; r++) {
    tpf_step *st = g_s[r].steps, tmp = st[2];
    st[2] = st[3]; /* RECV first (deps {0}) */
    st[3] = tmp;   /* then SEND, waiting for that RECV */
    st[3].ndeps = 1;
    st[3].deps[0] = 2;
  }
  expect_reject("deadlock", "rank 0 step 2 (RECV): can never run: the schedule deadlocks", NULL);
}

static void test_header_mismatch(void **state) {
  (void)state;
  ring_ag();
  g_s[1].rows = 32;
  expect_reject("header mismatch", "rank 1: header differs from rank 0's (rows 32 vs 16", NULL);
  ring_ag();
  g_s[2].rank = 1;
  expect_reject("wrong rank", "rank 2: header says tp_size 4 rank 1", NULL);
  ring_ag();
  g_s[0].chunk_bytes = 64;
  g_s[1].chunk_bytes = g_s[2].chunk_bytes = g_s[3].chunk_bytes = 64;
  expect_reject("chunk bytes vs layout", "rank 0: chunk 4 rows / 64 bytes, the layout says 4 / 128",
                NULL);
}

static void test_bad_fields(void **state) {
  (void)state;
  ring_ag();
  g_s[0].steps[2].tag = 200;
  expect_reject("tag too large", "rank 0 step 2 (SEND): tag 200 >= 128", NULL);
  ring_ag();
  g_s[0].steps[1].peer = 2;
  expect_reject("peer on a GEMM", "rank 0 step 1 (GEMM): peer 2 where none applies", NULL);
  ring_ag();
  g_s[0].steps[2].peer = 0;
  expect_reject("send to self", "rank 0 step 2 (SEND): peer 0 is not another rank", NULL);
  ring_ag();
  g_s[0].steps[0].kind = TPF_STEP_BARRIER;
  expect_reject("no handshake", "rank 0 step 0 (BARRIER): step 0, and only step 0", NULL);
  ring_ag();
  g_s[0].steps[1].stream = TPF_STREAM_RECV;
  expect_reject("GEMM on recv stream", "rank 0 step 1 (GEMM): runs on stream recv", NULL);
  ring_ag();
  g_s[1].steps[1].ndeps = 0; /* GEMM_0: first on compute0, no longer after the handshake */
  expect_reject("not after handshake", "rank 1 step 1 (GEMM): is not ordered after the handshake",
                NULL);
}

static void test_rs_wrong_partials(void **state) {
  (void)state;
  build(TPF_ALGO_RING, TPF_COLL_RS, 4, 16, 8, 0);
  int red = find(&g_s[2], TPF_STEP_REDUCE, 0);
  g_s[2].steps[red].count = 3;
  expect_reject("reduce misses a rank", "rank 2 step", "(REDUCE): sums 3 partials, not all 4");

  build(TPF_ALGO_RING, TPF_COLL_RS, 4, 16, 8, 0);
  g_s[0].steps[find(&g_s[0], TPF_STEP_GEMM, 0)].a.row = 8; /* chunk 1's partial computed on 2 */
  expect_reject("partial of the wrong rows", "rank 1 step",
                "holds rank 0's partial of token row 8 weight row 0; output row 0 col 0 needs "
                "token row 4");

  build(TPF_ALGO_RING, TPF_COLL_RS, 4, 16, 8, 0);
  red = find(&g_s[3], TPF_STEP_REDUCE, 0);
  g_s[3].steps[red].stride_bytes = 0; /* sums its own partial four times */
  expect_reject("same partial twice", "rank 3 step", "(REDUCE): sums rank 3's partial twice");
}

static void test_pull_before_barrier(void **state) {
  (void)state;
  build(TPF_ALGO_PIPELINE, TPF_COLL_RS, 2, 8, 8, 2);
  int pr = find(&g_s[0], TPF_STEP_PEER_REDUCE, 0);
  g_s[0].steps[pr].stream = TPF_STREAM_COMPUTE0; /* after GEMM_0, but not after the barrier */
  expect_reject("pull before barrier", "rank 0 step 3 (PEER_REDUCE): reads bytes",
                "of rank 1 before they arrived");
}

static void test_bulk_rs_wrong_chunk(void **state) {
  (void)state;
  build(TPF_ALGO_BULK, TPF_COLL_RS, 2, 8, 8, 0);
  int pr = find(&g_s[1], TPF_STEP_PEER_REDUCE, 0);
  g_s[1].steps[pr].a.row = 0;
  g_s[1].steps[pr].d.row = 0; /* reduces rank 0's chunk, not its own */
  expect_reject("bulk rs reduces the wrong chunk", "rank 1 step",
                "bulk rs must sum chunk 1 of all 2 ranks in place");
}

static void test_ag_relocates(void **state) {
  (void)state;
  /* P = 3: rank 1 receives chunk 0 (from rank 0) and chunk 2 (from rank 2) swapped. Every byte
   * is still produced once, but the gathered rows are in the wrong places. */
  build(TPF_ALGO_BULK, TPF_COLL_AG, 3, 12, 8, 0);
  g_s[0].steps[2].dst_off = 256;
  g_s[1].steps[3].dst_off = 256;
  g_s[2].steps[4].dst_off = 0;
  g_s[1].steps[5].dst_off = 0;
  expect_reject("ag relocates bytes", "rank 0 step 2 (SEND): all-gather moves bytes 0 to 256",
                NULL);
}

static void test_bad_args(void **state) {
  (void)state;
  TPF_ASSERT_STATUS(tpf_schedule_check(NULL, 2), TPF_EINVAL);
  ring_ag();
  TPF_ASSERT_STATUS(tpf_schedule_check(g_s, 0), TPF_EINVAL);
  TPF_ASSERT_STATUS(tpf_schedule_check(g_s, 65), TPF_EINVAL);
  TPF_ASSERT_STATUS(tpf_schedule_check(g_s, 3), TPF_EINVAL); /* headers say 4 */
  assert_non_null(strstr(tpf_last_error(), "header says tp_size 4 rank 0, expected 3 and 0"));
  free_all();
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_missing_recv),
      cmocka_unit_test(test_missing_send),
      cmocka_unit_test(test_duplicate_send),
      cmocka_unit_test(test_wrong_bytes),
      cmocka_unit_test(test_wrong_dst),
      cmocka_unit_test(test_write_outside_active),
      cmocka_unit_test(test_read_outside_active),
      cmocka_unit_test(test_gemm_before_arrival),
      cmocka_unit_test(test_forward_before_arrival),
      cmocka_unit_test(test_forward_dep),
      cmocka_unit_test(test_double_output),
      cmocka_unit_test(test_double_buffer_write),
      cmocka_unit_test(test_never_produced),
      cmocka_unit_test(test_deadlock),
      cmocka_unit_test(test_header_mismatch),
      cmocka_unit_test(test_bad_fields),
      cmocka_unit_test(test_rs_wrong_partials),
      cmocka_unit_test(test_pull_before_barrier),
      cmocka_unit_test(test_bulk_rs_wrong_chunk),
      cmocka_unit_test(test_ag_relocates),
      cmocka_unit_test(test_bad_args),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
