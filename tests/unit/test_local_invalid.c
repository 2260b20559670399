/* A rank whose tpf_comm_create / tpf_manager_add fails a local check (bad
 * dtype, bad size, NULL name, duplicate name) still takes part in the creation's fingerprint
 * exchange, with an "invalid" fingerprint: every rank fails that creation (the invalid one with
 * its own TPF_EINVAL, the others with TPF_EMISMATCH naming it), and the next valid creation
 * succeeds on every rank. It used to skip the exchange, so its exchange counter fell one behind
 * and every later creation failed with "names differ" on every rank. On the simulator, P = 2..4,
 * the invalid rank being each rank in turn. */
#include "tpf_test.h"
#include "tpflex/tpflex_sim.h"

enum { KIND_DTYPE, KIND_SIZE, KIND_NULL_NAME, KIND_DUP_NAME, KIND_COUNT };
static const char *const kind_name[KIND_COUNT] = {"bad dtype", "bad size", "NULL name",
                                                  "duplicate name"};

typedef struct {
  int kind, bad_rank;
  tpf_manager *m[4];
  tpf_status first[4], second[4], third[4];
  char msg[4][512];
} run_state;

static tpf_comm_config cfg_named(const char *name) {
  tpf_comm_config c = TPF_COMM_CONFIG_INIT;
  c.name = name;
  c.algo = TPF_ALGO_RING;
  c.coll = TPF_COLL_AG;
  c.dtype = TPF_FP32;
  c.capacity = (tpf_shape){96, 8}; /* divisible by P = 2, 3, 4 */
  return c;
}

static tpf_status rank_fn(tpf_backend *be, int r, void *arg) {
  run_state *s = arg;
  TPF_CHECK(tpf_manager_create(be, &s->m[r]));
  const tpf_comm_config c1 = cfg_named("fc1_fprop"), c2 = cfg_named("fc2_fprop");
  TPF_CHECK(tpf_manager_add(s->m[r], &c1, NULL));
  /* The creation one rank gets wrong locally. */
  tpf_comm_config c = cfg_named("fc2_fprop");
  if (r == s->bad_rank) {
    switch (s->kind) {
    case KIND_DTYPE:
      c.dtype = (tpf_dtype)77;
      break;
    case KIND_SIZE:
      c.size = 13;
      break;
    case KIND_NULL_NAME:
      c.name = NULL;
      break;
    case KIND_DUP_NAME:
      c.name = "fc1_fprop";
      break;
    }
  }
  s->first[r] = tpf_manager_add(s->m[r], &c, NULL);
  snprintf(s->msg[r], sizeof s->msg[r], "%s", tpf_last_error());
  /* The next valid creations succeed everywhere: via the manager, and a plain communicator. */
  s->second[r] = tpf_manager_add(s->m[r], &c2, NULL);
  tpf_comm *plain = NULL;
  tpf_comm_config p = cfg_named("proj_fprop");
  s->third[r] = tpf_comm_create(be, &p, &plain);
  if (plain) TPF_CHECK(tpf_comm_destroy(plain));
  return tpf_manager_destroy(s->m[r]);
}

/* The same through tpf_comm_create directly (no manager): bad dtype, size, NULL name, and NULL
 * out, on rank bad_rank. */
static tpf_status plain_fn(tpf_backend *be, int r, void *arg) {
  run_state *s = arg;
  tpf_comm_config c = cfg_named("fc1_fprop");
  tpf_comm *cm = NULL;
  tpf_comm **out = &cm;
  if (r == s->bad_rank) {
    switch (s->kind) {
    case KIND_DTYPE:
      c.dtype = (tpf_dtype)-1;
      break;
    case KIND_SIZE:
      c.size = sizeof c + 8;
      break;
    case KIND_NULL_NAME:
      c.name = NULL;
      break;
    case KIND_DUP_NAME: /* no manager here: a NULL out stands in */
      out = NULL;
      break;
    }
  }
  s->first[r] = tpf_comm_create(be, &c, out);
  snprintf(s->msg[r], sizeof s->msg[r], "%s", tpf_last_error());
  if (cm) TPF_CHECK(tpf_comm_destroy(cm));
  c = cfg_named("fc1_fprop");
  cm = NULL;
  s->second[r] = tpf_comm_create(be, &c, &cm);
  if (cm) TPF_CHECK(tpf_comm_destroy(cm));
  s->third[r] = TPF_OK;
  return TPF_OK;
}

static void check(const run_state *s, int P, const char *how) {
  for (int r = 0; r < P; r++) {
    const tpf_status want = r == s->bad_rank ? TPF_EINVAL : TPF_EMISMATCH;
    if (s->first[r] != want)
      fail_msg("%s P=%d %s on rank %d: rank %d got %s (%s), expected %s", how, P,
               kind_name[s->kind], s->bad_rank, r, tpf_status_name(s->first[r]), s->msg[r],
               tpf_status_name(want));
    if (r != s->bad_rank) {
      char want_msg[64];
      snprintf(want_msg, sizeof want_msg, "rank %d refused its call locally", s->bad_rank);
      if (!strstr(s->msg[r], want_msg))
        fail_msg("%s P=%d %s: rank %d's detail '%s' lacks '%s'", how, P, kind_name[s->kind], r,
                 s->msg[r], want_msg);
    }
    if (s->second[r] != TPF_OK || s->third[r] != TPF_OK)
      fail_msg("%s P=%d %s on rank %d: the next creations on rank %d returned %s, %s", how, P,
               kind_name[s->kind], s->bad_rank, r, tpf_status_name(s->second[r]),
               tpf_status_name(s->third[r]));
  }
}

static void test_local_invalid__group_stays_paired(void **state) {
  (void)state;
  int runs = 0;
  for (int P = 2; P <= 4; P++) {
    tpf_sim_config sc = TPF_SIM_CONFIG_INIT;
    sc.tp_size = P;
    tpf_sim_world *w = NULL;
    TPF_ASSERT_OK(tpf_sim_world_create(&sc, &w));
    for (int kind = 0; kind < KIND_COUNT; kind++)
      for (int bad = 0; bad < P; bad++) {
        static run_state s;
        memset(&s, 0, sizeof s);
        s.kind = kind;
        s.bad_rank = bad;
        TPF_ASSERT_OK(tpf_sim_run(w, rank_fn, &s));
        check(&s, P, "tpf_manager_add");
        memset(&s, 0, sizeof s);
        s.kind = kind;
        s.bad_rank = bad;
        TPF_ASSERT_OK(tpf_sim_run(w, plain_fn, &s));
        check(&s, P, "tpf_comm_create");
        runs += 2;
      }
    tpf_sim_fault_report rep;
    TPF_ASSERT_OK(tpf_sim_get_fault_report(w, &rep));
    assert_int_equal(rep.live_registrations, 0);
    assert_int_equal(rep.pending_rendezvous, 0);
    TPF_ASSERT_OK(tpf_sim_world_destroy(w));
  }
  print_message("%d runs: every rank failed the locally invalid creation, the next succeeded\n",
                runs);
}

/* An operation one rank refuses before its handshake (here a NULL weight, TPF_EINVAL) uses no
 * sequence number there: the rank calls again with the right arguments and pairs with its peers,
 * which waited in that operation's handshake (SPEC §4). The peers' calls succeed, the refusing
 * rank's second call too, and so does the next operation on every rank. */
typedef struct {
  int bad_rank;
  tpf_status refused, again[4], next[4];
  float w[4][8 * 8], d[4][96 * 8];
} op_state;

static tpf_status op_fn(tpf_backend *be, int r, void *arg) {
  op_state *s = arg;
  const tpf_comm_config c = cfg_named("fc1_fprop");
  tpf_comm *cm = NULL;
  TPF_CHECK(tpf_comm_create(be, &c, &cm));
  tpf_matrix w = {s->w[r], 8, 8, 8, TPF_FP32}, d = {s->d[r], 96, 8, 8, TPF_FP32};
  if (r == s->bad_rank) s->refused = tpf_ag_gemm(cm, NULL, &d, NULL);
  s->again[r] = tpf_ag_gemm(cm, &w, &d, NULL);
  s->next[r] = tpf_ag_gemm(cm, &w, &d, NULL);
  return tpf_comm_destroy(cm);
}

static void test_local_invalid__refused_operation_pairs_again(void **state) {
  (void)state;
  tpf_sim_config sc = TPF_SIM_CONFIG_INIT;
  sc.tp_size = 3;
  sc.timeout_ms = 3000;
  tpf_sim_world *w = NULL;
  TPF_ASSERT_OK(tpf_sim_world_create(&sc, &w));
  for (int bad = 0; bad < 3; bad++) {
    static op_state s;
    memset(&s, 0, sizeof s);
    s.bad_rank = bad;
    TPF_ASSERT_OK(tpf_sim_run(w, op_fn, &s));
    TPF_ASSERT_STATUS(s.refused, TPF_EINVAL);
    for (int r = 0; r < 3; r++)
      if (s.again[r] != TPF_OK || s.next[r] != TPF_OK)
        fail_msg("rank %d refused locally; rank %d then got %s and %s", bad, r,
                 tpf_status_name(s.again[r]), tpf_status_name(s.next[r]));
  }
  TPF_ASSERT_OK(tpf_sim_world_destroy(w));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_local_invalid__group_stays_paired),
      cmocka_unit_test(test_local_invalid__refused_operation_pairs_again),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
