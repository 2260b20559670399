/* Ranks that disagree on anything that shapes the bytes fail, never corrupt,
 * and the 0.2 versioned structs and per-operation options refuse bad input.
 *
 * Method: two simulator ranks create communicators whose configurations differ in exactly one
 * field, for every field of the fingerprint; both ranks must get TPF_EMISMATCH naming the field
 * and both values, nothing may be registered, and the world must pair up again for the next
 * communicator. Then two ranks run one PIPELINE operation with different per-operation split
 * counts: the handshake must refuse it on both ranks before any byte moves (the output keeps its
 * sentinel) and the communicator must stay usable.
 */
#include "tpf_test.h"
#include "comm_internal.h"
#include "tpflex/tpflex_cost.h"
#include "tpflex/tpflex_fault.h"
#include "tpflex/tpflex_sim.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#define C 16
#define H 32

typedef struct {
  tpf_comm_config cfg[2];
  tpf_comm *c[2];
  tpf_status st[2];
  char msg[2][512];
} pair;

static tpf_status pair_create(tpf_backend *be, int r, void *arg) {
  (void)be;
  pair *p = arg;
  p->c[r] = NULL;
  p->st[r] = tpf_comm_create(be, &p->cfg[r], &p->c[r]);
  snprintf(p->msg[r], sizeof p->msg[r], "%s", tpf_last_error());
  return TPF_OK;
}

static tpf_status pair_destroy(tpf_backend *be, int r, void *arg) {
  (void)be;
  pair *p = arg;
  return p->c[r] ? tpf_comm_destroy(p->c[r]) : TPF_OK;
}

static tpf_sim_world *world(void) {
  tpf_sim_config cfg = TPF_SIM_CONFIG_INIT;
  cfg.tp_size = 2;
  cfg.timeout_ms = 2000;
  tpf_sim_world *w = NULL;
  TPF_ASSERT_OK(tpf_sim_world_create(&cfg, &w));
  return w;
}

static tpf_cost_table g_t1, g_t2;

/* Field names and how to make rank 1 differ; `want` are substrings of the message. */
typedef struct {
  const char *field;
  void (*alter)(tpf_comm_config *c);
  const char *want0, *want1;
} alteration;

static void alt_algo(tpf_comm_config *c) {
  c->algo = TPF_ALGO_RING;
}
static void alt_coll(tpf_comm_config *c) {
  c->coll = TPF_COLL_AG;
}
static void alt_dtype(tpf_comm_config *c) {
  c->dtype = TPF_FP16;
}
static void alt_rows(tpf_comm_config *c) {
  c->capacity.rows = 2 * C;
}
static void alt_cols(tpf_comm_config *c) {
  c->capacity.cols = 2 * H;
}
static void alt_splits(tpf_comm_config *c) {
  c->num_splits = 8;
}
static void alt_aggregate(tpf_comm_config *c) {
  c->aggregate = true;
}
static void alt_external(tpf_comm_config *c) {
  c->external = true;
}
static void alt_plan(tpf_comm_config *c) {
  c->plan = TPF_PLAN_ADAPTIVE;
  c->cost = &g_t1;
}
static void alt_name(tpf_comm_config *c) {
  c->name = "fc2_fprop";
}

/* The base: PIPELINE RS bf16 [16, 32] with 4 splits (the cases differ from it in one field). */
static tpf_comm_config base(void) {
  tpf_comm_config c = TPF_COMM_CONFIG_INIT;
  c.name = "fc1_fprop";
  c.algo = TPF_ALGO_PIPELINE;
  c.coll = TPF_COLL_RS;
  c.dtype = TPF_BF16;
  c.capacity.rows = C;
  c.capacity.cols = H;
  c.num_splits = 4;
  return c;
}

static void test_agreement__every_field_fails_on_every_rank(void **state) {
  (void)state;
  const alteration alts[] = {
      {"algo", alt_algo, "algo is pipeline on rank 0", "ring on rank 1"},
      {"coll", alt_coll, "coll is rs on rank 0", "ag on rank 1"},
      {"dtype", alt_dtype, "dtype is bf16 on rank 0", "fp16 on rank 1"},
      {"capacity rows", alt_rows, "capacity is [16, 32] on rank 0", "[32, 32] on rank 1"},
      {"capacity cols", alt_cols, "capacity is [16, 32] on rank 0", "[16, 64] on rank 1"},
      {"num_splits", alt_splits, "num_splits is 4 on rank 0", "8 on rank 1"},
      {"aggregate", alt_aggregate, "aggregate is false on rank 0", "true on rank 1"},
      {"external", alt_external, "external is false on rank 0", "true on rank 1"},
      {"plan", alt_plan, "plan is fixed on rank 0", "adaptive on rank 1"},
      {"name", alt_name, "name is 'fc1_fprop' on rank 0", "'fc2_fprop' on rank 1"},
  };
  tpf_sim_world *w = world();
  for (size_t i = 0; i < sizeof alts / sizeof alts[0]; i++) {
    pair p;
    memset(&p, 0, sizeof p);
    p.cfg[0] = p.cfg[1] = base();
    alts[i].alter(&p.cfg[1]);
    tpf_sim_stats before, after;
    TPF_ASSERT_OK(tpf_sim_get_stats(w, &before));
    TPF_ASSERT_OK(tpf_sim_run(w, pair_create, &p));
    TPF_ASSERT_OK(tpf_sim_get_stats(w, &after));
    for (int r = 0; r < 2; r++) {
      if (p.st[r] != TPF_EMISMATCH)
        fail_msg("%s: rank %d got %s (%s)", alts[i].field, r, tpf_status_name(p.st[r]), p.msg[r]);
      if (!strstr(p.msg[r], alts[i].want0) || !strstr(p.msg[r], alts[i].want1))
        fail_msg("%s: rank %d message lacks '%s' / '%s': %s", alts[i].field, r, alts[i].want0,
                 alts[i].want1, p.msg[r]);
      assert_null(p.c[r]);
    }
    /* The same message on both ranks: each sees every fingerprint. */
    assert_string_equal(p.msg[0], p.msg[1]);
    assert_int_equal(after.registrations, before.registrations);
    print_message("%-13s -> %s\n", alts[i].field, p.msg[0]);
  }
  /* Adaptive on both ranks with different cost tables: they would plan differently. */
  pair p;
  memset(&p, 0, sizeof p);
  p.cfg[0] = p.cfg[1] = base();
  p.cfg[0].plan = p.cfg[1].plan = TPF_PLAN_ADAPTIVE;
  p.cfg[0].cost = &g_t1;
  p.cfg[1].cost = &g_t2;
  TPF_ASSERT_OK(tpf_sim_run(w, pair_create, &p));
  for (int r = 0; r < 2; r++) {
    TPF_ASSERT_STATUS(p.st[r], TPF_EMISMATCH);
    if (!strstr(p.msg[r], "cost table on rank 1 is not rank 0's"))
      fail_msg("cost: rank %d: %s", r, p.msg[r]);
  }
  /* After all that the ranks still pair up: equal configurations create and work. */
  memset(&p, 0, sizeof p);
  p.cfg[0] = p.cfg[1] = base();
  TPF_ASSERT_OK(tpf_sim_run(w, pair_create, &p));
  TPF_ASSERT_OK(p.st[0]);
  TPF_ASSERT_OK(p.st[1]);
  TPF_ASSERT_OK(tpf_sim_run(w, pair_destroy, &p));
  tpf_sim_fault_report rep;
  TPF_ASSERT_OK(tpf_sim_get_fault_report(w, &rep));
  assert_int_equal(rep.live_registrations, 0);
  assert_int_equal(rep.pending_rendezvous, 0);
  TPF_ASSERT_OK(tpf_sim_world_destroy(w));
}

/* ---- per-operation split counts that differ between ranks ---- */

typedef struct {
  tpf_comm *c[2];
  float x[2][C * 16], wt[2][H * 16], out[2][(C / 2) * H];
  int splits[2];
  tpf_status st[2];
  char msg[2][512];
} split_run;

static tpf_status sr_create(tpf_backend *be, int r, void *arg) {
  split_run *s = arg;
  tpf_comm_config cfg = base();
  cfg.dtype = TPF_FP32;
  return tpf_comm_create(be, &cfg, &s->c[r]);
}

static tpf_status sr_op(tpf_backend *be, int r, void *arg) {
  (void)be;
  split_run *s = arg;
  tpf_matrix x = {s->x[r], C, 16, 16, TPF_FP32}, w = {s->wt[r], H, 16, 16, TPF_FP32};
  tpf_matrix o = {s->out[r], C / 2, H, H, TPF_FP32};
  for (int i = 0; i < C * 16; i++)
    s->x[r][i] = (float)((i + r) % 7) - 3.0f;
  for (int i = 0; i < H * 16; i++)
    s->wt[r][i] = (float)((i * 3 + r) % 5) - 2.0f;
  for (int i = 0; i < (C / 2) * H; i++)
    s->out[r][i] = 1234.5f; /* sentinel: a refused operation must not touch it */
  tpf_op_options opt = TPF_OP_OPTIONS_INIT;
  opt.num_splits = s->splits[r];
  s->st[r] = tpf_gemm_rs_ex(s->c[r], &x, &w, &o, &opt, NULL);
  snprintf(s->msg[r], sizeof s->msg[r], "%s", tpf_last_error());
  return TPF_OK;
}

static tpf_status sr_destroy(tpf_backend *be, int r, void *arg) {
  (void)be;
  split_run *s = arg;
  return tpf_comm_destroy(s->c[r]);
}

/* Long names that differ only after their first 63 bytes (a model path prefix, then the layer
 * and site) used to print as two identical truncated names. The message now shows each from a
 * little before their first difference, with both lengths and that byte: the two differ. Also
 * names that differ only in length (one a prefix of the other), and the longest names (255). */
static void test_agreement__long_names_differ_visibly(void **state) {
  (void)state;
  static char n0[3][256], n1[3][256];
  const char *prefix = "model.language_model.encoder.transformer_block.decoder.layers";
  snprintf(n0[0], sizeof n0[0], "%s.layer_17.self_attention.linear_qkv.fc1_fprop", prefix);
  snprintf(n1[0], sizeof n1[0], "%s.layer_18.self_attention.linear_qkv.fc1_fprop", prefix);
  snprintf(n0[1], sizeof n0[1], "%s.layer_17.mlp.fc1_fprop", prefix);
  snprintf(n1[1], sizeof n1[1], "%s.layer_17.mlp.fc1_fprop_2", prefix);
  memset(n0[2], 'a', 255);
  memset(n1[2], 'a', 255);
  n1[2][254] = 'b';
  const char *want0[3] = {"layer_17.self_attention", ".mlp.fc1_fprop' on rank 0", "ab' on rank 1"};
  const char *want1[3] = {"layer_18.self_attention", ".mlp.fc1_fprop_2' on rank 1",
                          "(255 and 255 bytes, first difference at byte 254)"};
  tpf_sim_world *w = world();
  for (int i = 0; i < 3; i++) {
    pair p;
    memset(&p, 0, sizeof p);
    p.cfg[0] = p.cfg[1] = base();
    p.cfg[0].name = n0[i];
    p.cfg[1].name = n1[i];
    TPF_ASSERT_OK(tpf_sim_run(w, pair_create, &p));
    for (int r = 0; r < 2; r++) {
      if (p.st[r] != TPF_EMISMATCH || !strstr(p.msg[r], want0[i]) || !strstr(p.msg[r], want1[i]))
        fail_msg("names %d: rank %d got %s (%s), expected TPF_EMISMATCH showing '%s' and '%s'", i,
                 r, tpf_status_name(p.st[r]), p.msg[r], want0[i], want1[i]);
      assert_null(p.c[r]);
    }
    assert_string_equal(p.msg[0], p.msg[1]);
    print_message("names %d -> %s\n", i, p.msg[0]);
  }
  /* Still paired: the same long name on both ranks creates. */
  pair p;
  memset(&p, 0, sizeof p);
  p.cfg[0] = p.cfg[1] = base();
  p.cfg[0].name = p.cfg[1].name = n0[2];
  TPF_ASSERT_OK(tpf_sim_run(w, pair_create, &p));
  TPF_ASSERT_OK(p.st[0]);
  TPF_ASSERT_OK(p.st[1]);
  TPF_ASSERT_OK(tpf_sim_run(w, pair_destroy, &p));
  TPF_ASSERT_OK(tpf_sim_world_destroy(w));
}

static void test_agreement__per_op_splits_differ(void **state) {
  (void)state;
  tpf_sim_world *w = world();
  static split_run s;
  memset(&s, 0, sizeof s);
  TPF_ASSERT_OK(tpf_sim_run(w, sr_create, &s));
  s.splits[0] = 4;
  s.splits[1] = 2;
  TPF_ASSERT_OK(tpf_sim_run(w, sr_op, &s));
  for (int r = 0; r < 2; r++) {
    TPF_ASSERT_STATUS(s.st[r], TPF_EMISMATCH);
    if (!strstr(s.msg[r], "gemm_rs/4 splits") || !strstr(s.msg[r], "gemm_rs/2 splits"))
      fail_msg("rank %d: message lacks both operations: %s", r, s.msg[r]);
    for (int i = 0; i < (C / 2) * H; i++)
      if (s.out[r][i] != 1234.5f) fail_msg("rank %d: output element %d was written", r, i);
  }
  print_message("splits 4 vs 2: %s\n", s.msg[0]);
  /* The group stays in step: the same split count on both ranks now works, and gives the
   * result the default split count gives. */
  s.splits[0] = s.splits[1] = 2;
  TPF_ASSERT_OK(tpf_sim_run(w, sr_op, &s));
  TPF_ASSERT_OK(s.st[0]);
  TPF_ASSERT_OK(s.st[1]);
  float two[2][(C / 2) * H];
  memcpy(two, s.out, sizeof two);
  s.splits[0] = s.splits[1] = 0;
  TPF_ASSERT_OK(tpf_sim_run(w, sr_op, &s));
  TPF_ASSERT_OK(s.st[0]);
  for (int r = 0; r < 2; r++)
    for (int i = 0; i < (C / 2) * H; i++)
      if (two[r][i] != s.out[r][i])
        fail_msg("rank %d element %d: splits 2 gave %g, default %g", r, i, (double)two[r][i],
                 (double)s.out[r][i]);
  TPF_ASSERT_OK(tpf_sim_run(w, sr_destroy, &s));
  TPF_ASSERT_OK(tpf_sim_world_destroy(w));
}

/* ---- refused options and versioned structs (all ranks make the same refused call) ---- */

typedef struct {
  tpf_comm *ag[2], *bulk[2];
  tpf_status st[2][8];
  char msg[2][8][400];
  uint64_t epoch_before[2], epoch_after[2];
} refuse_run;

static tpf_status rf_create(tpf_backend *be, int r, void *arg) {
  refuse_run *s = arg;
  tpf_comm_config a = base();
  a.algo = TPF_ALGO_RING;
  a.coll = TPF_COLL_AG;
  a.num_splits = 0;
  a.dtype = TPF_FP32;
  TPF_CHECK(tpf_comm_create(be, &a, &s->ag[r]));
  tpf_comm_config b = a;
  b.name = "bulk";
  b.algo = TPF_ALGO_BULK;
  return tpf_comm_create(be, &b, &s->bulk[r]);
}

static tpf_status rf_ops(tpf_backend *be, int r, void *arg) {
  (void)be;
  refuse_run *s = arg;
  static float wbuf[2][8 * H], dbuf[2][C * 8];
  tpf_matrix w = {wbuf[r], 8, H, H, TPF_FP32}, d = {dbuf[r], C, 8, 8, TPF_FP32};
  s->epoch_before[r] = tpf_comm_epoch(s->ag[r]);
  tpf_op_options o = TPF_OP_OPTIONS_INIT;
  int i = 0;
  o.size = sizeof o + 8; /* from a newer header */
  s->st[r][i] = tpf_ag_gemm_ex(s->ag[r], &w, &d, &o, NULL);
  snprintf(s->msg[r][i++], 400, "%s", tpf_last_error());
  o = (tpf_op_options)TPF_OP_OPTIONS_INIT;
  o.alpha = NAN;
  s->st[r][i] = tpf_ag_gemm_ex(s->ag[r], &w, &d, &o, NULL);
  snprintf(s->msg[r][i++], 400, "%s", tpf_last_error());
  o = (tpf_op_options)TPF_OP_OPTIONS_INIT;
  o.trans_a = true;
  s->st[r][i] = tpf_ag_gemm_ex(s->ag[r], &w, &d, &o, NULL);
  snprintf(s->msg[r][i++], 400, "%s", tpf_last_error());
  o = (tpf_op_options)TPF_OP_OPTIONS_INIT;
  o.num_splits = 3; /* RING AG with P = 2: P, P/2 = 1 only */
  s->st[r][i] = tpf_ag_gemm_ex(s->ag[r], &w, &d, &o, NULL);
  snprintf(s->msg[r][i++], 400, "%s", tpf_last_error());
  o = (tpf_op_options)TPF_OP_OPTIONS_INIT;
  o.num_splits = 2;
  static float abuf[2][C * 8]; /* not d's memory: an output on its input is refused first */
  tpf_matrix a = {abuf[r], C, 8, 8, TPF_FP32}, b = {wbuf[r], 8, 8, 8, TPF_FP32};
  s->st[r][i] = tpf_bulk_overlap_ex(s->bulk[r], &a, &b, &d, &o, NULL);
  snprintf(s->msg[r][i++], 400, "%s", tpf_last_error());
  /* After the refusals the sequence numbers are unconsumed: a real operation pairs up. */
  memset(wbuf[r], 0, sizeof wbuf[r]);
  s->st[r][i] = tpf_ag_gemm_ex(s->ag[r], &w, &d, NULL, NULL);
  snprintf(s->msg[r][i++], 400, "%s", tpf_last_error());
  s->epoch_after[r] = tpf_comm_epoch(s->ag[r]);
  return TPF_OK;
}

static tpf_status rf_destroy(tpf_backend *be, int r, void *arg) {
  (void)be;
  refuse_run *s = arg;
  tpf_status a = tpf_comm_destroy(s->ag[r]);
  tpf_status b = tpf_comm_destroy(s->bulk[r]);
  return a != TPF_OK ? a : b;
}

static void test_agreement__refused_options_change_nothing(void **state) {
  (void)state;
  tpf_sim_world *w = world();
  static refuse_run s;
  memset(&s, 0, sizeof s);
  TPF_ASSERT_OK(tpf_sim_run(w, rf_create, &s));
  TPF_ASSERT_OK(tpf_sim_run(w, rf_ops, &s));
  const struct {
    tpf_status st;
    const char *want;
  } exp[] = {{TPF_EINVAL, "options size"},
             {TPF_EINVAL, "must be finite"},
             {TPF_EUNSUPPORTED, "trans_a is not available"},
             {TPF_EDIVISIBLE, "num_splits 3 is not legal for active rows 16"},
             {TPF_EUNSUPPORTED, "a bulk operation has no splits"},
             {TPF_OK, ""}};
  for (int r = 0; r < 2; r++) {
    for (size_t i = 0; i < sizeof exp / sizeof exp[0]; i++) {
      if (s.st[r][i] != exp[i].st || !strstr(s.msg[r][i], exp[i].want))
        fail_msg("rank %d call %zu: %s '%s', expected %s with '%s'", r, i,
                 tpf_status_name(s.st[r][i]), s.msg[r][i], tpf_status_name(exp[i].st), exp[i].want);
    }
    assert_int_equal(s.epoch_before[r], s.epoch_after[r]);
  }
  for (size_t i = 0; i + 1 < sizeof exp / sizeof exp[0]; i++)
    print_message("refused: %s: %s\n", tpf_status_name(s.st[0][i]), s.msg[0][i]);
  TPF_ASSERT_OK(tpf_sim_run(w, rf_destroy, &s));
  TPF_ASSERT_OK(tpf_sim_world_destroy(w));
}

typedef struct {
  tpf_comm_config cfg;
  tpf_comm *c[2];
  tpf_status st[2];
  tpf_plan_mode plan[2];
} size_run;

static tpf_status sz_create(tpf_backend *be, int r, void *arg) {
  size_run *s = arg;
  s->c[r] = NULL;
  s->st[r] = tpf_comm_create(be, &s->cfg, &s->c[r]);
  if (s->c[r]) s->plan[r] = tpf_comm_config_of(s->c[r])->plan;
  return TPF_OK;
}

static tpf_status sz_destroy(tpf_backend *be, int r, void *arg) {
  (void)be;
  size_run *s = arg;
  return s->c[r] ? tpf_comm_destroy(s->c[r]) : TPF_OK;
}

static void test_agreement__versioned_structs(void **state) {
  (void)state;
  /* A simulator config from a newer header is refused. */
  tpf_sim_config sc = TPF_SIM_CONFIG_INIT;
  sc.size = sizeof sc + 16;
  sc.tp_size = 2;
  tpf_sim_world *bad = NULL;
  TPF_ASSERT_STATUS(tpf_sim_world_create(&sc, &bad), TPF_EINVAL);
  if (!strstr(tpf_last_error(), "config size")) fail_msg("%s", tpf_last_error());
  assert_null(bad);

  tpf_sim_world *w = world();
  static size_run s;
  /* Too large: refused locally on both ranks (nothing collective happens). */
  memset(&s, 0, sizeof s);
  s.cfg = base();
  s.cfg.size = sizeof s.cfg + 8;
  TPF_ASSERT_OK(tpf_sim_run(w, sz_create, &s));
  TPF_ASSERT_STATUS(s.st[0], TPF_EINVAL);
  TPF_ASSERT_STATUS(s.st[1], TPF_EINVAL);
  /* A size that is no released layout (here the old window's offsetof(plan), which used to be
   * accepted with the later fields defaulted) is refused on both ranks; nothing is created. */
  memset(&s, 0, sizeof s);
  s.cfg = base();
  s.cfg.size = offsetof(tpf_comm_config, plan);
  TPF_ASSERT_OK(tpf_sim_run(w, sz_create, &s));
  TPF_ASSERT_STATUS(s.st[0], TPF_EINVAL);
  TPF_ASSERT_STATUS(s.st[1], TPF_EINVAL);
  assert_null(s.c[0]);
  assert_null(s.c[1]);
  /* size 0: this header's layout (0.1-style designated initializers). */
  memset(&s, 0, sizeof s);
  s.cfg = base();
  s.cfg.size = 0;
  TPF_ASSERT_OK(tpf_sim_run(w, sz_create, &s));
  TPF_ASSERT_OK(s.st[0]);
  TPF_ASSERT_OK(tpf_sim_run(w, sz_destroy, &s));
  TPF_ASSERT_OK(tpf_sim_world_destroy(w));
}

/* Every size that is not 0 or a released layout's is refused, naming the size
 * and the accepted ones, and changes nothing; a size that ends inside a field (options size 13
 * ended inside alpha and silently ignored it) included. */
static void expect_size_refused(tpf_status st, size_t size, size_t accepted, const char *type) {
  char want[64];
  TPF_ASSERT_STATUS(st, TPF_EINVAL);
  snprintf(want, sizeof want, "size %zu ", size);
  if (!strstr(tpf_last_error(), want)) fail_msg("%s size %zu: %s", type, size, tpf_last_error());
  snprintf(want, sizeof want, "0 (this header's layout) or %zu", accepted);
  if (!strstr(tpf_last_error(), want) || !strstr(tpf_last_error(), type))
    fail_msg("%s size %zu: %s", type, size, tpf_last_error());
}

static void test_agreement__only_released_sizes(void **state) {
  (void)state;
  tpf_mock_backend be;
  tpf_mock_init(&be, 1, 0);
  const long live = tpf__alloc_live_count();
  long refused = 0;
  /* Options: a RING AG communicator refuses before anything runs; epoch and seq unchanged. */
  tpf_comm_config cfg = tpf_test_config("fc1_fprop", TPF_ALGO_RING, TPF_COLL_AG, TPF_FP32, 16, 4);
  tpf_comm *c = NULL;
  TPF_ASSERT_OK(tpf_comm_create(&be.hdr, &cfg, &c));
  static float wbuf[4 * 4], dbuf[16 * 4];
  tpf_matrix w = {wbuf, 4, 4, 4, TPF_FP32}, d = {dbuf, 16, 4, 4, TPF_FP32};
  const uint64_t seq0 = c->seq;
  /* Released: 0.2's layout (up to num_splits) and today's (with the fp8 scales, SPEC §11). */
  const size_t opt02 = offsetof(tpf_op_options, a_scale_inv);
  for (size_t size = 1; size <= sizeof(tpf_op_options) + 8; size++) {
    if (size == sizeof(tpf_op_options) || size == opt02) continue;
    tpf_op_options o = TPF_OP_OPTIONS_INIT;
    o.size = size;
    expect_size_refused(tpf_ag_gemm_ex(c, &w, &d, &o, NULL), size, opt02, "tpf_op_options");
    assert_non_null(strstr(tpf_last_error(), "'fc1_fprop'"));
    refused++;
  }
  assert_int_equal(c->seq, seq0);
  tpf_op_options o13 = TPF_OP_OPTIONS_INIT;
  o13.size = 13; /* ends inside alpha */
  TPF_ASSERT_STATUS(tpf_ag_gemm_ex(c, &w, &d, &o13, NULL), TPF_EINVAL);
  assert_non_null(strstr(tpf_last_error(), "size 13"));
  TPF_ASSERT_OK(tpf_comm_destroy(c));
  /* Communicator config. */
  for (size_t size = 1; size <= sizeof(tpf_comm_config) + 8; size++) {
    if (size == sizeof(tpf_comm_config)) continue;
    tpf_comm_config k = cfg;
    k.size = size;
    c = NULL;
    expect_size_refused(tpf_comm_create(&be.hdr, &k, &c), size, sizeof(tpf_comm_config),
                        "tpf_comm_config");
    assert_null(c);
    refused++;
  }
  /* Simulator config. */
  for (size_t size = 1; size <= sizeof(tpf_sim_config) + 8; size++) {
    if (size == sizeof(tpf_sim_config)) continue;
    tpf_sim_config sc = TPF_SIM_CONFIG_INIT;
    sc.size = size;
    sc.tp_size = 2;
    tpf_sim_world *wd = NULL;
    expect_size_refused(tpf_sim_world_create(&sc, &wd), size, sizeof(tpf_sim_config),
                        "tpf_sim_config");
    assert_null(wd);
    refused++;
  }
  /* Fault plan. */
  for (size_t size = 1; size <= sizeof(tpf_fault_plan) + 8; size++) {
    if (size == sizeof(tpf_fault_plan)) continue;
    tpf_fault_plan fp = TPF_FAULT_PLAN_INIT;
    fp.size = size;
    tpf_backend *fb = NULL;
    expect_size_refused(tpf_fault_backend_create(&be.hdr, &fp, &fb), size, sizeof(tpf_fault_plan),
                        "tpf_fault_plan");
    assert_null(fb);
    refused++;
  }
  assert_int_equal(tpf__alloc_live_count(), live);
  /* The released sizes and 0 are accepted. */
  tpf_sim_config sc = TPF_SIM_CONFIG_INIT;
  tpf_sim_world *wd = NULL;
  TPF_ASSERT_OK(tpf_sim_world_create(&sc, &wd));
  TPF_ASSERT_OK(tpf_sim_world_destroy(wd));
  sc.size = 0;
  TPF_ASSERT_OK(tpf_sim_world_create(&sc, &wd));
  TPF_ASSERT_OK(tpf_sim_world_destroy(wd));
  cfg.size = sizeof cfg;
  TPF_ASSERT_OK(tpf_comm_create(&be.hdr, &cfg, &c));
  TPF_ASSERT_OK(tpf_comm_destroy(c));
  print_message("%ld unreleased struct sizes refused\n", refused);
}

static int setup(void **state) {
  (void)state;
  const char *t1 = "launch_us 2\nhandshake_us 5\nbarrier_us 5\ncopy peer 20 10\n"
                   "copy local 5 40\nreduce 5 20\ngemm bf16 1 32 32 50\n";
  const char *t2 = "launch_us 3\nhandshake_us 5\nbarrier_us 5\ncopy peer 20 10\n"
                   "copy local 5 40\nreduce 5 20\ngemm bf16 1 32 32 50\n";
  if (tpf_cost_table_parse(t1, &g_t1) != TPF_OK || tpf_cost_table_parse(t2, &g_t2) != TPF_OK)
    return -1;
  return 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_agreement__every_field_fails_on_every_rank),
      cmocka_unit_test(test_agreement__long_names_differ_visibly),
      cmocka_unit_test(test_agreement__per_op_splits_differ),
      cmocka_unit_test(test_agreement__refused_options_change_nothing),
      cmocka_unit_test(test_agreement__versioned_structs),
      cmocka_unit_test(test_agreement__only_released_sizes),
  };
  return cmocka_run_group_tests(tests, setup, NULL);
}
