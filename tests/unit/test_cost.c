/* The cost model: the text format, GEMM interpolation, and the replay against timelines worked
 * out by hand (docs in include/tpflex/tpflex_cost.h). */
#include "tpflex/tpflex_cost.h"
#include "tpf_test.h"

#include <math.h>

static const char *TABLE = "# test table\n"
                           "launch_us 1\n"
                           "handshake_us 2   # beside the launch\n"
                           "barrier_us 3\n"
                           "copy peer 1 1\n"
                           "copy local 0.5 4\n"
                           "reduce 2 2\n"
                           "gemm bf16 1 1 500 1\n"
                           "gemm bf16 1 1 50000 10\n"
                           "gemm fp32 8 8 8 10\n";

static tpf_cost_table table;

static tpf_step step(tpf_step_kind kind, tpf_stream_id stream, int peer, uint32_t tag) {
  tpf_step s;
  memset(&s, 0, sizeof s);
  s.kind = (uint8_t)kind;
  s.stream = (uint8_t)stream;
  s.peer = peer;
  s.tag = tag;
  return s;
}
static void dep(tpf_step *s, int d) {
  s->deps[s->ndeps++] = (uint16_t)d;
}

static void test_parse(void **state) {
  (void)state;
  TPF_ASSERT_OK(tpf_cost_table_parse(TABLE, &table));
  assert_true(table.launch_us == 1 && table.handshake_us == 2 && table.barrier_us == 3);
  assert_true(table.peer.latency_us == 1 && table.peer.gbps == 1);
  assert_true(table.local.latency_us == 0.5 && table.reduce.gbps == 2);
  assert_int_equal(table.ngemm, 3);
  assert_int_equal(table.gemm[2].dtype, TPF_FP32);
  struct {
    const char *text, *needle;
  } bad[] = {
      {"launch_us 1\nlaunch_us 2\n", "line 2: 'launch_us' given twice"},
      {"launch_us -1\n", "line 1"},
      {"launch_us 1 2\n", "line 1"},
      {"launch_us abc\n", "line 1"},
      {"launch_us nan\n", "line 1"},
      {"copy peer 1\n", "latency_us, GB/s"},
      {"copy peer 1 0\n", "bandwidth must be > 0"},
      {"\n\nfrobnicate 3\n", "line 3: unknown key"},
      {"gemm bf17 1 1 1 1\n", "unknown dtype 'bf17'"},
      {"gemm bf16 0 1 1 1\n", "m, n, k >= 1"},
      {"gemm bf16 1 1 1 0\n", "us > 0"},
  };
  for (size_t i = 0; i < TPF_ARRAY_SIZE(bad); i++) {
    tpf_cost_table t;
    memset(&t, 0x5a, sizeof t);
    TPF_ASSERT_STATUS(tpf_cost_table_parse(bad[i].text, &t), TPF_EINVAL);
    if (!strstr(tpf_last_error(), bad[i].needle))
      fail_msg("case %zu: detail '%s' lacks '%s'", i, tpf_last_error(), bad[i].needle);
    assert_true(t.ngemm == 0x5a5a5a5a); /* untouched */
  }
  TPF_ASSERT_STATUS(tpf_cost_table_parse(NULL, &table), TPF_EINVAL);
}

static void test_gemm_interpolation(void **state) {
  (void)state;
  double us = 0;
  /* Rates 1000 flops/us at 1e3 flops and 1e4 at 1e5; 1e4 flops is halfway in log: 5500. */
  TPF_ASSERT_OK(tpf_cost_gemm_us(&table, TPF_BF16, 1, 1, 5000, &us));
  assert_true(fabs(us - 1e4 / 5500.0) < 1e-9);
  TPF_ASSERT_OK(tpf_cost_gemm_us(&table, TPF_BF16, 1, 1, 500, &us));
  assert_true(fabs(us - 1.0) < 1e-12);
  TPF_ASSERT_OK(tpf_cost_gemm_us(&table, TPF_BF16, 1, 10, 50000, &us)); /* beyond: rate held */
  assert_true(fabs(us - 100.0) < 1e-9);
  TPF_ASSERT_OK(tpf_cost_gemm_us(&table, TPF_BF16, 1, 1, 50, &us));
  assert_true(fabs(us - 0.1) < 1e-12);
  TPF_ASSERT_STATUS(tpf_cost_gemm_us(&table, TPF_FP16, 1, 1, 1, &us), TPF_EINVAL);
  assert_non_null(strstr(tpf_last_error(), "fp16"));
}

/* Rank r of 2: a bf16 schedule of nsteps over st whose first steps are the HANDSHAKE and a
 * 10 us GEMM (k = 50000 at the table's rate) after it; the caller fills the rest. */
static void two_rank_start(tpf_schedule *s, int r, tpf_step *st, int nsteps) {
  memset(s, 0, sizeof *s);
  s->tp_size = 2;
  s->rank = r;
  s->dtype = TPF_BF16;
  s->nsteps = nsteps;
  s->steps = st;
  st[0] = step(TPF_STEP_HANDSHAKE, TPF_STREAM_COMM, -1, 0);
  st[1] = step(TPF_STEP_GEMM, TPF_STREAM_COMPUTE0, -1, 0);
  st[1].m = 1, st[1].n = 1, st[1].k = 50000;
  dep(&st[1], 0);
}

/* Two ranks; rank 1's send waits for its first GEMM. Worked out by hand: launch 1 means step i
 * is enqueued at i + 1. HANDSHAKE: ready 1 on both, ends 1 + 2 = 3. GEMM (k = 50000: 10 us)
 * 3 -> 13. rank 0 SEND of 2000 bytes at 1 GB/s (1 + 2 us): 3 -> 6; rank 1's after its GEMM:
 * 13 -> 16. rank 1 RECV: ready 4, rank 0's SEND ended 6 -> [4, 6]; rank 0 RECV: [4, 16].
 * Second GEMMs: rank 0 after its RECV 16 -> 26; rank 1 after compute0 is free 13 -> 23.
 * BARRIER tag 9: ready 26 and 23, both end 26 + 3 = 29. Total 29. */
static void test_replay_by_hand(void **state) {
  (void)state;
  tpf_step st[2][6];
  tpf_schedule s[2];
  for (int r = 0; r < 2; r++) {
    two_rank_start(&s[r], r, st[r], 6);
    st[r][2] = step(TPF_STEP_SEND, TPF_STREAM_COMM, 1 - r, 0);
    st[r][2].bytes = 2000;
    if (r == 1) dep(&st[r][2], 1);
    st[r][3] = step(TPF_STEP_RECV, TPF_STREAM_RECV, 1 - r, 0);
    dep(&st[r][3], 0);
    st[r][4] = st[r][1];
    st[r][4].ndeps = 0;
    dep(&st[r][4], 3);
    st[r][5] = step(TPF_STEP_BARRIER, TPF_STREAM_COMM, -1, 9);
    dep(&st[r][5], 4);
  }
  tpf_cost_span sp[2 * 8];
  double total = 0;
  TPF_ASSERT_OK(tpf_cost_predict(&table, s, 2, sp, 8, &total));
  const double want[2][6][2] = {
      {{1, 3}, {3, 13}, {3, 6}, {4, 16}, {16, 26}, {26, 29}},
      {{1, 3}, {3, 13}, {13, 16}, {4, 6}, {13, 23}, {23, 29}},
  };
  for (int r = 0; r < 2; r++)
    for (int i = 0; i < 6; i++)
      if (fabs(sp[r * 8 + i].start_us - want[r][i][0]) > 1e-9 ||
          fabs(sp[r * 8 + i].end_us - want[r][i][1]) > 1e-9)
        fail_msg("rank %d step %d: [%g, %g], expected [%g, %g]", r, i, sp[r * 8 + i].start_us,
                 sp[r * 8 + i].end_us, want[r][i][0], want[r][i][1]);
  assert_true(fabs(total - 29) < 1e-9);

  /* A wait cycle: each rank receives first and sends only after its RECV. */
  for (int r = 0; r < 2; r++) {
    tpf_step send = st[r][2];
    st[r][2] = st[r][3];
    st[r][3] = send;
    st[r][3].ndeps = 0;
    dep(&st[r][3], 2);
  }
  TPF_ASSERT_STATUS(tpf_cost_predict(&table, s, 2, sp, 8, &total), TPF_EINVAL);
  assert_non_null(strstr(tpf_last_error(), "can never start"));
  /* A RECV whose SEND does not exist. */
  st[1][3].tag = 7;
  TPF_ASSERT_STATUS(tpf_cost_predict(&table, s, 2, sp, 8, &total), TPF_EINVAL);
  assert_non_null(strstr(tpf_last_error(), "has no SEND"));
  TPF_ASSERT_STATUS(tpf_cost_predict(&table, s, 2, sp, 5, &total), TPF_EINVAL);
  TPF_ASSERT_STATUS(tpf_cost_predict(NULL, s, 2, sp, 8, &total), TPF_EINVAL);
}

/* shared_device: two ranks on one GPU. Each runs HANDSHAKE (1 -> 3) then one 10 us GEMM: apart
 * they end at 13; sharing the device, the second GEMM waits for the first: 3 -> 13, 13 -> 23. On
 * the example above the GEMM spans of different ranks never overlap and the total only grows. */
static void test_shared_device(void **state) {
  (void)state;
  tpf_cost_table sh = table;
  tpf_cost_table parsed;
  TPF_ASSERT_OK(tpf_cost_table_parse("shared_device 1\ngemm bf16 1 1 1 1\n", &parsed));
  assert_int_equal(parsed.shared_device, 1);
  TPF_ASSERT_STATUS(tpf_cost_table_parse("shared_device 2\n", &parsed), TPF_EINVAL);
  sh.shared_device = 1;
  tpf_step st[2][2];
  tpf_schedule s[2];
  for (int r = 0; r < 2; r++) {
    two_rank_start(&s[r], r, st[r], 2);
  }
  tpf_cost_span sp[2 * 4];
  double apart = 0, shared = 0;
  TPF_ASSERT_OK(tpf_cost_predict(&table, s, 2, sp, 4, &apart));
  assert_true(fabs(apart - 13) < 1e-9);
  TPF_ASSERT_OK(tpf_cost_predict(&sh, s, 2, sp, 4, &shared));
  assert_true(fabs(shared - 23) < 1e-9);
  const double a0 = sp[0 * 4 + 1].start_us, a1 = sp[1 * 4 + 1].start_us;
  assert_true(fabs(fmin(a0, a1) - 3) < 1e-9 && fabs(fmax(a0, a1) - 13) < 1e-9);
}

/* Real schedules: every algorithm replays to the end; RING AG time grows with T. */
static void test_real_schedules(void **state) {
  (void)state;
  const int P = 4;
  const tpf_algo algos[] = {TPF_ALGO_RING, TPF_ALGO_RING, TPF_ALGO_PIPELINE, TPF_ALGO_BULK,
                            TPF_ALGO_BULK};
  const tpf_coll colls[] = {TPF_COLL_AG, TPF_COLL_RS, TPF_COLL_RS, TPF_COLL_AG, TPF_COLL_RS};
  static tpf_cost_span sp[TPF_MAX_RANKS * 256];
  for (size_t a = 0; a < TPF_ARRAY_SIZE(algos); a++) {
    double prev = 0;
    for (uint64_t t = 64; t <= 1024; t *= 2) {
      tpf_schedule s[4];
      memset(s, 0, sizeof s);
      for (int r = 0; r < P; r++) {
        tpf_layout_desc d;
        memset(&d, 0, sizeof d);
        d.tp_size = P, d.rank = r, d.algo = algos[a], d.coll = colls[a], d.dtype = TPF_BF16;
        d.capacity = (tpf_shape){1024, 256};
        d.active = (tpf_shape){t, 256};
        tpf_gemm_dims g = {t, 256, 256};
        TPF_ASSERT_OK(tpf_schedule_build(&d, &g, &s[r]));
      }
      double total = 0;
      TPF_ASSERT_OK(tpf_cost_predict(&table, s, P, sp, 256, &total));
      if (!(total > prev))
        fail_msg("%s %s T=%llu: %g us, not more than %g at T/2", tpf_algo_name(algos[a]),
                 tpf_coll_name(colls[a]), (unsigned long long)t, total, prev);
      prev = total;
      for (int r = 0; r < P; r++)
        tpf_schedule_free(&s[r]);
    }
  }
}

/* Every malformed input the replay and the parser refuse, one by one. */
static void test_refusals(void **state) {
  (void)state;
  static char big[64 * 1024];
  memset(big, 'x', 600);
  big[600] = '\0';
  TPF_ASSERT_STATUS(tpf_cost_table_parse(big, &table), TPF_EINVAL);
  assert_non_null(strstr(tpf_last_error(), "longer than"));
  big[0] = '\0';
  for (int i = 0; i <= TPF_COST_MAX_GEMM_POINTS; i++)
    strcat(big, "gemm fp16 1 1 1 1\n");
  TPF_ASSERT_STATUS(tpf_cost_table_parse(big, &table), TPF_EINVAL);
  assert_non_null(strstr(tpf_last_error(), "more than"));
  TPF_ASSERT_OK(tpf_cost_table_parse(TABLE, &table));

  tpf_step st[2][2];
  tpf_schedule s[2];
  tpf_cost_span sp[2 * 4];
  double total = 0;
  for (int r = 0; r < 2; r++) {
    memset(&s[r], 0, sizeof s[r]);
    s[r].tp_size = 2, s[r].rank = r, s[r].dtype = TPF_BF16, s[r].nsteps = 2, s[r].steps = st[r];
    st[r][0] = step(TPF_STEP_HANDSHAKE, TPF_STREAM_COMM, -1, 0);
    st[r][1] = step(TPF_STEP_SEND, TPF_STREAM_COMM, r, 0); /* to itself: the local link */
    st[r][1].bytes = 4000;
  }
  TPF_ASSERT_OK(tpf_cost_predict(&table, s, 2, sp, 4, &total));
  assert_true(fabs(total - (3 + 0.5 + 1)) < 1e-9);
  TPF_ASSERT_STATUS(tpf_cost_predict(&table, s, 0, sp, 4, &total), TPF_EINVAL);
  TPF_ASSERT_STATUS(tpf_cost_predict(&table, s, 2, sp, 1, &total), TPF_EINVAL);
  st[1][1].stream = TPF_NUM_STREAMS;
  TPF_ASSERT_STATUS(tpf_cost_predict(&table, s, 2, sp, 4, &total), TPF_EINVAL);
  st[1][1].stream = TPF_STREAM_COMM;
  dep(&st[1][1], 1);
  TPF_ASSERT_STATUS(tpf_cost_predict(&table, s, 2, sp, 4, &total), TPF_EINVAL);
  st[1][1].ndeps = 0;
  st[1][1].kind = TPF_STEP_KIND_COUNT;
  TPF_ASSERT_STATUS(tpf_cost_predict(&table, s, 2, sp, 4, &total), TPF_EINVAL);
  assert_non_null(strstr(tpf_last_error(), "unknown"));
  st[1][1] = step(TPF_STEP_RECV, TPF_STREAM_RECV, 5, 0);
  TPF_ASSERT_STATUS(tpf_cost_predict(&table, s, 2, sp, 4, &total), TPF_EINVAL);
  assert_non_null(strstr(tpf_last_error(), "peer 5"));
  st[1][1] = step(TPF_STEP_BARRIER, TPF_STREAM_COMM, -1, 3); /* rank 0 has no barrier 3 */
  TPF_ASSERT_STATUS(tpf_cost_predict(&table, s, 2, sp, 4, &total), TPF_EINVAL);
  assert_non_null(strstr(tpf_last_error(), "no match on rank 0"));
  st[1][1] = step(TPF_STEP_GEMM, TPF_STREAM_COMPUTE0, -1, 0);
  st[1][1].m = 1, st[1][1].n = 1, st[1][1].k = 1;
  s[1].dtype = TPF_FP16; /* no fp16 point */
  TPF_ASSERT_STATUS(tpf_cost_predict(&table, s, 2, sp, 4, &total), TPF_EINVAL);
  s[1].dtype = TPF_BF16;
  st[1][1].m = 0; /* an empty GEMM costs nothing beyond its enqueue */
  TPF_ASSERT_OK(tpf_cost_predict(&table, s, 2, sp, 4, &total));
  assert_true(sp[4 + 1].end_us == sp[4 + 1].start_us);
}

/* Measured schedule points: accepted fields, and every refusal naming its line and field. */
static void test_sched_parse(void **state) {
  (void)state;
  static const char *ok = "launch_us 1\n"
                          "sched shared ring ag 4 2 1 bf16 8192 3584 4096 1234.5  # aggregate\n"
                          "sched\tdedicated pipeline rs 8 8 0 fp16 256 64 512 7\n"
                          "sched shared ring ag 4 2 1 bf16 8192 3584 8192 2000\n"
                          "sched shared ring ag 4 2 1 bf16 8192 1024 4096 99\n";
  tpf_cost_table t;
  TPF_ASSERT_OK(tpf_cost_table_parse(ok, &t));
  assert_int_equal(t.nsched, 4);
  const tpf_cost_sched_point *a = &t.sched[0], *b = &t.sched[1];
  assert_true(a->shared && a->algo == TPF_ALGO_RING && a->coll == TPF_COLL_AG);
  assert_true(a->tp_size == 4 && a->num_splits == 2 && a->aggregate && a->dtype == TPF_BF16);
  assert_true(a->hidden == 8192 && a->n == 3584 && a->rows == 4096 && a->us == 1234.5);
  assert_true(!b->shared && b->algo == TPF_ALGO_PIPELINE && b->coll == TPF_COLL_RS);
  assert_true(b->tp_size == 8 && b->num_splits == 8 && !b->aggregate && b->dtype == TPF_FP16);
  assert_true(b->hidden == 256 && b->n == 64 && b->rows == 512 && b->us == 7);
  struct {
    const char *text, *needle;
  } const bad[] = {
      {"sched gpu ring ag 4 4 0 bf16 8 8 8 1\n", "line 1: sched field 'device' must be shared"},
      {"sched shared bulk ag 4 4 0 bf16 8 8 8 1\n", "field 'algo' must be ring or pipeline, not "
                                                    "'bulk'"},
      {"sched shared ring xy 4 4 0 bf16 8 8 8 1\n", "field 'coll' must be ag or rs, not 'xy'"},
      {"sched shared ring ag 0 4 0 bf16 8 8 8 1\n", "field 'P' must be an integer in [1, 64]"},
      {"sched shared ring ag 65 4 0 bf16 8 8 8 1\n", "not '65'"},
      {"sched shared ring ag 4 0 0 bf16 8 8 8 1\n", "field 'splits' must be an integer in [1, 64]"},
      {"sched shared ring ag 4 4 2 bf16 8 8 8 1\n", "field 'aggregate' must be 0 or 1, not '2'"},
      {"sched shared ring ag 4 4 0 bf17 8 8 8 1\n", "field 'dtype' must be bf16"},
      {"sched shared ring ag 4 4 0 bf16 0 8 8 1\n", "field 'H' must be an integer >= 1"},
      {"sched shared ring ag 4 4 0 bf16 8 08 8 1\n", "field 'N' must be an integer >= 1, not '08'"},
      {"sched shared ring ag 4 4 0 bf16 8 8 -8 1\n", "field 'T' must be an integer >= 1"},
      {"sched shared ring ag 4 4 0 bf16 8 8 8.5 1\n",
       "field 'T' must be an integer >= 1, not '8.5'"},
      {"sched shared ring ag 4 4 0 bf16 8 8 8 0\n", "field 'us' must be a number > 0, not '0'"},
      {"sched shared ring ag 4 4 0 bf16 8 8 8 nan\n", "field 'us'"},
      {"sched shared ring ag 4 4 0 bf16 8 8 8 12345678901234567890123456789012345\n", "'us'"},
      {"sched shared ring ag 4 4 0 bf16 8 8 8\n", "needs 11 fields"},
      {"sched shared ring ag 4 4 0 bf16 8 8 8 1 2\n", "more than 11 fields"},
      {"sched shared pipeline rs 4 4 1 bf16 8 8 8 1\n", "'aggregate' 1 needs ring ag"},
      {"launch_us 1\nsched shared ring ag 4 2 1 bf16 8192 3584 4096 1\n\n"
       "sched shared ring ag 4 2 1 bf16 8192 3584 4096 2\n",
       "line 4: sched point given twice (first on line 2)"},
      {"sched shared ring rs 4 4 1 bf16 8 8 8 1\n", "'aggregate' 1 needs ring ag"},
      {"sched shared ring ag 4 4 0 bf16 8 8 12345678901234567890 1\n", "field 'T'"},
      {"schedule shared ring ag 4 4 0 bf16 8 8 8 1\n", "line 1: unknown key"},
  };
  for (size_t i = 0; i < TPF_ARRAY_SIZE(bad); i++) {
    memset(&t, 0x5a, sizeof t);
    TPF_ASSERT_STATUS(tpf_cost_table_parse(bad[i].text, &t), TPF_EINVAL);
    if (!strstr(tpf_last_error(), bad[i].needle))
      fail_msg("case %zu: detail '%s' lacks '%s'", i, tpf_last_error(), bad[i].needle);
    assert_true(t.nsched == 0x5a5a5a5a); /* untouched */
  }
  /* A point differing from another in T only, or in the key only, is not a duplicate (above);
   * more than TPF_COST_MAX_SCHED_POINTS are refused. */
  static char big[TPF_COST_MAX_SCHED_POINTS * 64];
  big[0] = '\0';
  for (int i = 1; i <= TPF_COST_MAX_SCHED_POINTS + 1; i++) {
    char line[64];
    snprintf(line, sizeof line, "sched shared ring ag 2 2 0 bf16 8 8 %d 1\n", i);
    strcat(big, line);
  }
  TPF_ASSERT_STATUS(tpf_cost_table_parse(big, &t), TPF_EINVAL);
  assert_non_null(strstr(tpf_last_error(), "line 513: more than 512 sched points"));
  /* Points that differ from the first in one key field each are all distinct. */
  static const char *const one_field[] = {
      "sched shared ring ag 4 4 0 bf16 8 8 8 1\n",
      "sched dedicated ring ag 4 4 0 bf16 8 8 8 1\n",
      "sched shared pipeline ag 4 4 0 bf16 8 8 8 1\n",
      "sched shared ring rs 4 4 0 bf16 8 8 8 1\n",
      "sched shared ring ag 8 4 0 bf16 8 8 8 1\n",
      "sched shared ring ag 4 2 0 bf16 8 8 8 1\n",
      "sched shared ring ag 4 4 1 bf16 8 8 8 1\n",
      "sched shared ring ag 4 4 0 fp16 8 8 8 1\n",
      "sched shared ring ag 4 4 0 bf16 16 8 8 1\n",
      "sched shared ring ag 4 4 0 bf16 8 16 8 1\n",
      "sched\tshared  ring\tag 4 4 0 bf16 8 8 16 1\t# a comment\n",
  };
  big[0] = '\0';
  for (size_t i = 0; i < TPF_ARRAY_SIZE(one_field); i++)
    strcat(big, one_field[i]);
  TPF_ASSERT_OK(tpf_cost_table_parse(big, &t));
  assert_int_equal(t.nsched, (int)TPF_ARRAY_SIZE(one_field));
  assert_true(t.sched[10].rows == 16 && t.sched[10].us == 1);
}

/* The bracketing points of a key, whatever the order of the lines; a count beyond the storage
 * (a table filled by hand) reads only the storage. */
static void test_sched_bracket(void **state) {
  (void)state;
  tpf_cost_table t;
  TPF_ASSERT_OK(tpf_cost_table_parse("sched shared ring ag 4 4 0 bf16 8 8 4096 4\n"
                                     "sched shared ring ag 4 4 0 bf16 8 8 1024 1\n"
                                     "sched shared ring ag 4 4 0 bf16 8 8 2048 2\n"
                                     "sched shared ring ag 4 4 0 bf16 8 8 512 0.5\n"
                                     "sched shared ring ag 4 2 1 bf16 8 8 1024 9\n",
                                     &t));
  tpf_cost_sched_point key = t.sched[0];
  int lo = -2, hi = -2;
  key.rows = 1536;
  assert_int_equal(tpf__cost_sched_bracket(&t, &key, &lo, &hi), 4);
  assert_int_equal(lo, 1);
  assert_int_equal(hi, 2);
  key.rows = 2048; /* a measured T: both ends */
  tpf__cost_sched_bracket(&t, &key, &lo, &hi);
  assert_true(lo == 2 && hi == 2);
  key.rows = 100;
  tpf__cost_sched_bracket(&t, &key, &lo, &hi);
  assert_true(lo == -1 && hi == 3);
  key.rows = 9000;
  tpf__cost_sched_bracket(&t, &key, &lo, &hi);
  assert_true(lo == 0 && hi == -1);
  key.num_splits = 8; /* no point of this key */
  assert_int_equal(tpf__cost_sched_bracket(&t, &key, &lo, &hi), 0);
  assert_true(lo == -1 && hi == -1);
  static tpf_cost_table big;
  memset(&big, 0, sizeof big);
  big.nsched = TPF_COST_MAX_SCHED_POINTS + 7;
  memset(&key, 0, sizeof key);
  assert_int_equal(tpf__cost_sched_bracket(&big, &key, &lo, &hi), TPF_COST_MAX_SCHED_POINTS);
  big.ngemm = TPF_COST_MAX_GEMM_POINTS + 7;
  assert_true(tpf__cost_table_hash(&big) != 0);
}

/* The fingerprint's hash covers the sched points, field by field; a table without them hashes
 * as before (the same fields as the older hash). */
static void test_sched_hash(void **state) {
  (void)state;
  tpf_cost_table a, b;
  TPF_ASSERT_OK(tpf_cost_table_parse(TABLE, &a));
  const uint64_t h0 = tpf__cost_table_hash(&a);
  assert_true(h0 != 0);
  assert_true(tpf__cost_table_hash(NULL) == 0);
  b = a; /* a copy by value hashes the same */
  assert_true(tpf__cost_table_hash(&b) == h0);
  static const char *const variants[] = {
      "sched shared ring ag 4 4 0 bf16 8 8 8 1\n",
      "sched shared ring ag 4 4 0 bf16 8 8 8 2\n",
      "sched dedicated ring ag 4 4 0 bf16 8 8 8 1\n",
      "sched shared ring rs 4 4 0 bf16 8 8 8 1\n",
      "sched shared ring ag 4 2 1 bf16 8 8 8 1\n",
      "sched shared ring ag 4 4 0 bf16 8 8 16 1\n",
      "sched shared ring ag 4 4 0 bf16 8 16 8 1\n",
      "sched shared ring ag 4 4 0 bf16 16 8 8 1\n",
      "sched shared ring ag 8 4 0 bf16 8 8 8 1\n",
      "sched shared pipeline ag 4 4 0 bf16 8 8 8 1\n",
      "sched shared ring ag 4 4 0 fp16 8 8 8 1\n",
  };
  uint64_t seen[TPF_ARRAY_SIZE(variants)];
  for (size_t i = 0; i < TPF_ARRAY_SIZE(variants); i++) {
    char text[1024];
    snprintf(text, sizeof text, "%s%s", TABLE, variants[i]);
    TPF_ASSERT_OK(tpf_cost_table_parse(text, &b));
    assert_int_equal(b.nsched, 1);
    seen[i] = tpf__cost_table_hash(&b);
    assert_true(seen[i] != h0);
    for (size_t j = 0; j < i; j++)
      if (seen[j] == seen[i]) fail_msg("variants %zu and %zu hash alike", j, i);
  }
}

/* The shipped tables parse, price every dtype they name and fp8, and order candidates sensibly:
 * on the H200 table a [512, 8192] x [3584, 8192]^T GEMM costs less whole than as 8 row chunks. */
static void test_shipped_tables(void **state) {
  (void)state;
  const char *names[] = {TPF_DATA_DIR "/cost/h200.txt", TPF_DATA_DIR "/cost/sim.txt"};
  static char text[64 * 1024];
  for (size_t i = 0; i < TPF_ARRAY_SIZE(names); i++) {
    FILE *f = fopen(names[i], "r");
    if (!f) fail_msg("cannot open %s", names[i]);
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    tpf_cost_table t;
    TPF_ASSERT_OK(tpf_cost_table_parse(text, &t));
    assert_true(t.ngemm >= 4 && t.peer.gbps > 0 && t.local.gbps > 0 && t.reduce.gbps > 0);
    /* fp8 GEMMs are priced on every shipped table: on its own fp8_e4m3 points (sim.txt, and
     * h200.txt once measured: faster than bf16 at 4096 rows), else on its bf16 points, exactly
     * (h200.txt until measured); fp8_e5m2 on the same points as fp8_e4m3. */
    tpf_dtype e4 = TPF_FP32, e5 = TPF_FP32;
    TPF_ASSERT_OK(tpf_cost_gemm_dtype(&t, TPF_FP8_E4M3, &e4));
    TPF_ASSERT_OK(tpf_cost_gemm_dtype(&t, TPF_FP8_E5M2, &e5));
    assert_int_equal(e4, e5);
    double f8 = 0, b16 = 0;
    TPF_ASSERT_OK(tpf_cost_gemm_us(&t, TPF_FP8_E4M3, 4096, 1024, 8192, &f8));
    TPF_ASSERT_OK(tpf_cost_gemm_us(&t, TPF_BF16, 4096, 1024, 8192, &b16));
    if (i == 1) assert_int_equal(e4, TPF_FP8_E4M3); /* the synthetic table has fp8 points */
    if (e4 == TPF_FP8_E4M3)
      assert_true(f8 < b16);
    else
      assert_true(e4 == TPF_BF16 && f8 == b16);
    if (i == 0) {
      double one = 0, chunk = 0;
      TPF_ASSERT_OK(tpf_cost_gemm_us(&t, TPF_BF16, 512, 3584, 8192, &one));
      TPF_ASSERT_OK(tpf_cost_gemm_us(&t, TPF_BF16, 64, 3584, 8192, &chunk));
      assert_true(fabs(one - 41.94) < 1e-9); /* a measured point (2026-12-03) comes back exactly */
      assert_true(8 * chunk > 4 * one); /* the chunking tax (docs/results/h200.md, 2026-12-02) */
    }
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_parse),          cmocka_unit_test(test_gemm_interpolation),
      cmocka_unit_test(test_replay_by_hand), cmocka_unit_test(test_shared_device),
      cmocka_unit_test(test_real_schedules), cmocka_unit_test(test_refusals),
      cmocka_unit_test(test_shipped_tables), cmocka_unit_test(test_sched_parse),
      cmocka_unit_test(test_sched_hash),     cmocka_unit_test(test_sched_bracket),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
