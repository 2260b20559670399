/* Every public function x every invalid-argument class: NULL, out-of-range enum, zero, overflow,
 * wrong dtype/shape/ld, wrong-state object. Each case must return its documented status, leave a
 * detail message, and change nothing (out-parameters keep a sentinel, the communicator keeps its
 * shape and epoch, the backend sees no call). The number of cases is printed. */
#include "tpf_test.h"

#ifdef TPF_HAVE_SIM
#include "tpflex/tpflex_sim.h"
#endif
#ifdef TPF_HAVE_CUDA
#include "tpflex/tpflex_cuda.h"
#endif

enum { P = 4, C = 64, H = 32, N = 8, K = 8 };

typedef struct {
  tpf_mock_backend be;
  tpf_comm *ag, *rs, *pipe, *bulk, *failed;
  tpf_manager *m;
  uint16_t w[N * H], d[C * N], x[C * K], wr[H * K], out[C * H], a[C * K], b[N * K];
} world;

static int cases_run;

static tpf_comm_config cfg_of(const char *n, tpf_algo al, tpf_coll co) {
  return tpf_test_config(n, al, co, TPF_BF16, C, H);
}

static int setup(void **state) {
  world *wd = calloc(1, sizeof *wd);
  tpf_mock_init(&wd->be, P, 1);
  tpf_comm_config c1 = cfg_of("ag", TPF_ALGO_RING, TPF_COLL_AG);
  tpf_comm_config c2 = cfg_of("rs", TPF_ALGO_RING, TPF_COLL_RS);
  tpf_comm_config c3 = cfg_of("pipe", TPF_ALGO_PIPELINE, TPF_COLL_RS);
  tpf_comm_config c4 = cfg_of("bulk", TPF_ALGO_BULK, TPF_COLL_AG);
  tpf_comm_config c5 = cfg_of("failed", TPF_ALGO_RING, TPF_COLL_AG);
  if (tpf_comm_create(&wd->be.hdr, &c1, &wd->ag) || tpf_comm_create(&wd->be.hdr, &c2, &wd->rs) ||
      tpf_comm_create(&wd->be.hdr, &c3, &wd->pipe) ||
      tpf_comm_create(&wd->be.hdr, &c4, &wd->bulk) ||
      tpf_comm_create(&wd->be.hdr, &c5, &wd->failed) || tpf_manager_create(&wd->be.hdr, &wd->m))
    return -1;
  /* Put one communicator into the failed state through a (mock) timeout. */
  tpf_matrix mw = {wd->w, N, H, H, TPF_BF16}, md = {wd->d, C, N, N, TPF_BF16};
  wd->be.fail_execute = TPF_ETIMEOUT;
  if (tpf_ag_gemm(wd->failed, &mw, &md, NULL) != TPF_ETIMEOUT) return -1;
  wd->be.fail_execute = TPF_OK;
  *state = wd;
  return 0;
}

static int teardown(void **state) {
  world *wd = *state;
  tpf_comm_destroy(wd->ag);
  tpf_comm_destroy(wd->rs);
  tpf_comm_destroy(wd->pipe);
  tpf_comm_destroy(wd->bulk);
  tpf_comm_destroy(wd->failed);
  tpf_manager_destroy(wd->m);
  int rc = wd->be.reg_live == 0 ? 0 : -1;
  free(wd);
  return rc;
}

/* One case: the status must match and a detail must exist. */
static void expect(const char *what, tpf_status got, tpf_status want) {
  cases_run++;
  if (got != want)
    fail_msg("%s: got %s, expected %s (detail: %s)", what, tpf_status_name(got),
             tpf_status_name(want), tpf_last_error());
  if (want != TPF_OK && tpf_last_error()[0] == '\0')
    fail_msg("%s: %s without a detail message", what, tpf_status_name(got));
  tpf__clear_error();
}

static tpf_layout_desc good_desc(void) {
  tpf_layout_desc d;
  memset(&d, 0, sizeof d);
  d.tp_size = P;
  d.rank = 1;
  d.algo = TPF_ALGO_RING;
  d.coll = TPF_COLL_AG;
  d.dtype = TPF_BF16;
  d.capacity.rows = C;
  d.capacity.cols = H;
  d.active.rows = 16;
  d.active.cols = H;
  return d;
}

static void test_bad_input__layout_queries(void **state) {
  (void)state;
  const uint64_t sentinel = 0xDEADBEEFull;
  struct {
    const char *what;
    tpf_layout_desc d;
    tpf_status want;
  } cases[40];
  int n = 0;
#define ADD(label, field_expr, status)                                                             \
  do {                                                                                             \
    cases[n].what = label;                                                                         \
    cases[n].d = good_desc();                                                                      \
    {                                                                                              \
      tpf_layout_desc *dd = &cases[n].d;                                                           \
      field_expr;                                                                                  \
    }                                                                                              \
    cases[n].want = status;                                                                        \
    n++;                                                                                           \
  } while (0)
  ADD("tp_size 0", dd->tp_size = 0, TPF_EINVAL);
  ADD("tp_size 65", dd->tp_size = TPF_MAX_RANKS + 1, TPF_EINVAL);
  ADD("rank -1", dd->rank = -1, TPF_EINVAL);
  ADD("rank == P", dd->rank = P, TPF_EINVAL);
  ADD("algo out of range", dd->algo = (tpf_algo)9, TPF_EINVAL);
  ADD("coll out of range", dd->coll = (tpf_coll)5, TPF_EINVAL);
  ADD("dtype out of range", dd->dtype = (tpf_dtype)9, TPF_EINVAL);
  ADD("num_splits -1", dd->num_splits = -1, TPF_EINVAL);
  ADD("num_splits 65", dd->num_splits = TPF_MAX_SPLITS + 1, TPF_EINVAL);
  ADD("capacity rows 0", dd->capacity.rows = 0, TPF_ESHAPE);
  ADD("capacity cols 0", (dd->capacity.cols = 0, dd->active.cols = 0), TPF_ESHAPE);
  ADD("active rows 0", dd->active.rows = 0, TPF_ESHAPE);
  ADD("active cols 0", dd->active.cols = 0, TPF_ESHAPE);
  ADD("active cols != H", dd->active.cols = H + 16, TPF_ESHAPE);
  ADD("active rows > capacity", dd->active.rows = C + P, TPF_ECAPACITY);
  ADD("active rows % P", dd->active.rows = 18, TPF_EDIVISIBLE);
  ADD("capacity rows % P", (dd->capacity.rows = 66, dd->active.rows = 66), TPF_EDIVISIBLE);
  ADD("pipeline H % S", (dd->algo = TPF_ALGO_PIPELINE, dd->coll = TPF_COLL_RS, dd->num_splits = 3),
      TPF_EDIVISIBLE);
  ADD("overflow cols", (dd->capacity.cols = 1ull << 62, dd->active.cols = 1ull << 62),
      TPF_EOVERFLOW);
  ADD("rows beyond 2^40",
      (dd->capacity.rows = 1ull << 41, dd->capacity.cols = 8, dd->active.cols = 8), TPF_EOVERFLOW);
  ADD("misaligned chunk", (dd->capacity.cols = 4, dd->active.cols = 4, dd->active.rows = 4),
      TPF_EALIGN);
  ADD("aggregate odd P",
      (dd->tp_size = 3, dd->rank = 0, dd->capacity.rows = 48, dd->active.rows = 12,
       dd->aggregate = true),
      TPF_EUNSUPPORTED);
  ADD("aggregate on RS", (dd->coll = TPF_COLL_RS, dd->aggregate = true), TPF_EUNSUPPORTED);
  /* fp8 follows the active shape (SPEC §11); its 1-byte chunks still obey the 16-byte rule. */
  ADD("fp8 misaligned chunk",
      (dd->dtype = TPF_FP8_E4M3, dd->capacity.cols = 8, dd->active.cols = 8, dd->active.rows = 4),
      TPF_EALIGN);
#undef ADD
  for (int i = 0; i < n; i++) {
    uint64_t bytes = sentinel;
    tpf_region r = {sentinel, sentinel, sentinel};
    int cnt = -7;
    char what[96];
    snprintf(what, sizeof what, "tpf_layout_check(%s)", cases[i].what);
    expect(what, tpf_layout_check(&cases[i].d), cases[i].want);
    /* Alignment belongs to the backend; the pure queries do not apply it. */
    if (cases[i].want == TPF_EALIGN) continue;
    /* The queries of an invalid descriptor fail the same way and write nothing. */
    expect(what, tpf_layout_active_bytes(&cases[i].d, &bytes), cases[i].want);
    expect(what, tpf_layout_chunk(&cases[i].d, 0, &r), cases[i].want);
    expect(what, tpf_layout_local(&cases[i].d, &r), cases[i].want);
    expect(what, tpf_layout_chunk_count(&cases[i].d, &cnt), cases[i].want);
    assert_int_equal(bytes, sentinel);
    assert_int_equal(r.offset_bytes, sentinel);
    assert_int_equal(cnt, -7);
  }
  tpf_layout_desc g = good_desc();
  uint64_t bytes = sentinel;
  tpf_region r = {sentinel, sentinel, sentinel};
  int cnt;
  expect("tpf_layout_check(NULL)", tpf_layout_check(NULL), TPF_EINVAL);
  expect("registered_bytes(NULL desc)", tpf_layout_registered_bytes(NULL, &bytes), TPF_EINVAL);
  expect("registered_bytes(NULL out)", tpf_layout_registered_bytes(&g, NULL), TPF_EINVAL);
  expect("active_bytes(NULL out)", tpf_layout_active_bytes(&g, NULL), TPF_EINVAL);
  expect("chunk_count(NULL out)", tpf_layout_chunk_count(&g, NULL), TPF_EINVAL);
  expect("chunk(j = -1)", tpf_layout_chunk(&g, -1, &r), TPF_EINVAL);
  expect("chunk(j = P)", tpf_layout_chunk(&g, P, &r), TPF_EINVAL);
  expect("chunk(NULL out)", tpf_layout_chunk(&g, 0, NULL), TPF_EINVAL);
  expect("local(NULL out)", tpf_layout_local(&g, NULL), TPF_EINVAL);
  expect("chunk_count ok", tpf_layout_chunk_count(&g, &cnt), TPF_OK);
  assert_int_equal(bytes, sentinel);
  assert_int_equal(r.offset_bytes, sentinel);
  assert_int_equal(tpf_dtype_size((tpf_dtype)9), 0);
  assert_string_equal(tpf_dtype_name((tpf_dtype)9), "?");
  assert_string_equal(tpf_algo_name((tpf_algo)9), "?");
  assert_string_equal(tpf_coll_name((tpf_coll)9), "?");
  assert_string_equal(tpf_status_name((tpf_status)99), "TPF_UNKNOWN");
}

static void test_bad_input__communicator_calls(void **state) {
  world *wd = *state;
  tpf_backend *be = &wd->be.hdr;
  tpf_comm *sent = (tpf_comm *)0x1;
  tpf_comm_config cfg = cfg_of("new", TPF_ALGO_RING, TPF_COLL_AG);
  int regs = wd->be.reg_total;

  expect("create(NULL be)", tpf_comm_create(NULL, &cfg, &sent), TPF_EINVAL);
  expect("create(NULL cfg)", tpf_comm_create(be, NULL, &sent), TPF_EINVAL);
  expect("create(NULL out)", tpf_comm_create(be, &cfg, NULL), TPF_EINVAL);
  tpf_comm_config bad = cfg;
  bad.name = NULL;
  expect("create(NULL name)", tpf_comm_create(be, &bad, &sent), TPF_EINVAL);
  bad.name = "";
  expect("create(empty name)", tpf_comm_create(be, &bad, &sent), TPF_EINVAL);
  bad = cfg;
  bad.dtype = (tpf_dtype)42;
  expect("create(bad dtype)", tpf_comm_create(be, &bad, &sent), TPF_EINVAL);
  bad = cfg;
  bad.coll = (tpf_coll)42;
  expect("create(bad coll)", tpf_comm_create(be, &bad, &sent), TPF_EINVAL);
  bad = cfg;
  bad.capacity.rows = 0;
  expect("create(zero capacity)", tpf_comm_create(be, &bad, &sent), TPF_ESHAPE);
  bad = cfg;
  bad.capacity.cols = 1ull << 61;
  expect("create(overflowing capacity)", tpf_comm_create(be, &bad, &sent), TPF_EOVERFLOW);
  bad = cfg;
  bad.num_splits = 3;
  expect("create(splits 3 for ring AG of P 4)", tpf_comm_create(be, &bad, &sent), TPF_EDIVISIBLE);
  tpf_mock_backend other;
  tpf_mock_init(&other, 0, 0);
  expect("create(backend with tp_size 0)", tpf_comm_create(&other.hdr, &cfg, &sent), TPF_EINVAL);
  tpf_mock_init(&other, P, P);
  expect("create(backend rank out of range)", tpf_comm_create(&other.hdr, &cfg, &sent), TPF_EINVAL);
  assert_ptr_equal(sent, (tpf_comm *)0x1);
  assert_int_equal(wd->be.reg_total, regs);

  /* set_active_shape: the shape statuses are covered in test_comm; here NULL and state. */
  tpf_shape s = {8, H};
  expect("set_active_shape(NULL)", tpf_comm_set_active_shape(NULL, s), TPF_EINVAL);
  expect("set_active_shape(failed comm)", tpf_comm_set_active_shape(wd->failed, s), TPF_ESTATE);
  assert_int_equal(tpf_comm_active_shape(wd->failed).rows, C);
  assert_int_equal(tpf_comm_active_shape(NULL).rows, 0);
  assert_int_equal(tpf_comm_capacity_shape(NULL).rows, 0);
  assert_null(tpf_comm_config_of(NULL));
  assert_int_equal(tpf_comm_epoch(NULL), 0);

  tpf_matrix m = {(void *)0x5, 1, 1, 1, TPF_BF16};
  void *base = (void *)0x5;
  uint64_t bytes = 7;
  expect("buffer(NULL comm)", tpf_comm_buffer(NULL, &m), TPF_EINVAL);
  expect("buffer(NULL out)", tpf_comm_buffer(wd->ag, NULL), TPF_EINVAL);
  expect("local_chunk(NULL comm)", tpf_comm_local_chunk(NULL, &m), TPF_EINVAL);
  expect("local_chunk(NULL out)", tpf_comm_local_chunk(wd->ag, NULL), TPF_EINVAL);
  expect("registration(NULL comm)", tpf_comm_registration(NULL, &base, &bytes), TPF_EINVAL);
  expect("registration(NULL base)", tpf_comm_registration(wd->ag, NULL, &bytes), TPF_EINVAL);
  expect("registration(NULL bytes)", tpf_comm_registration(wd->ag, &base, NULL), TPF_EINVAL);
  assert_ptr_equal(m.ptr, (void *)0x5);
  assert_ptr_equal(base, (void *)0x5);
  assert_int_equal(bytes, 7);
  expect("destroy(NULL)", tpf_comm_destroy(NULL), TPF_EINVAL);
}

static void test_bad_input__operations(void **state) {
  world *wd = *state;
  int execs = wd->be.executions;
  tpf_matrix w = {wd->w, N, H, H, TPF_BF16}, d = {wd->d, C, N, N, TPF_BF16};
  tpf_matrix x = {wd->x, C, K, K, TPF_BF16}, wr = {wd->wr, H, K, K, TPF_BF16};
  tpf_matrix out = {wd->out, C / P, H, H, TPF_BF16};
  tpf_matrix a = {wd->a, C, K, K, TPF_BF16}, b = {wd->b, N, K, K, TPF_BF16};
  tpf_matrix t;
  void *reg;
  uint64_t reg_bytes;
  TPF_ASSERT_OK(tpf_comm_registration(wd->ag, &reg, &reg_bytes));

  /* tpf_ag_gemm */
  expect("ag_gemm(NULL comm)", tpf_ag_gemm(NULL, &w, &d, NULL), TPF_EINVAL);
  expect("ag_gemm(NULL w)", tpf_ag_gemm(wd->ag, NULL, &d, NULL), TPF_EINVAL);
  expect("ag_gemm(NULL d)", tpf_ag_gemm(wd->ag, &w, NULL, NULL), TPF_EINVAL);
  t = w, t.ptr = NULL;
  expect("ag_gemm(w.ptr NULL)", tpf_ag_gemm(wd->ag, &t, &d, NULL), TPF_EINVAL);
  t = w, t.dtype = (tpf_dtype)17;
  expect("ag_gemm(w dtype out of range)", tpf_ag_gemm(wd->ag, &t, &d, NULL), TPF_EINVAL);
  t = w, t.dtype = TPF_FP32;
  expect("ag_gemm(w wrong dtype)", tpf_ag_gemm(wd->ag, &t, &d, NULL), TPF_EINVAL);
  t = w, t.cols = H - 8, t.ld = H - 8;
  expect("ag_gemm(w cols != H)", tpf_ag_gemm(wd->ag, &t, &d, NULL), TPF_ESHAPE);
  t = w, t.rows = 0;
  expect("ag_gemm(w zero rows)", tpf_ag_gemm(wd->ag, &t, &d, NULL), TPF_ESHAPE);
  t = d, t.rows = C - P;
  expect("ag_gemm(d rows != T)", tpf_ag_gemm(wd->ag, &w, &t, NULL), TPF_ESHAPE);
  t = d, t.ld = N - 1;
  expect("ag_gemm(d ld < cols)", tpf_ag_gemm(wd->ag, &w, &t, NULL), TPF_ESHAPE);
  t = d, t.ld = 1ull << 62;
  expect("ag_gemm(d span overflows)", tpf_ag_gemm(wd->ag, &w, &t, NULL), TPF_EOVERFLOW);
  t = d, t.ptr = reg;
  expect("ag_gemm(d aliases the registration)", tpf_ag_gemm(wd->ag, &w, &t, NULL), TPF_EINVAL);
  expect("ag_gemm(on a RS communicator)", tpf_ag_gemm(wd->rs, &w, &d, NULL), TPF_EUNSUPPORTED);
  expect("ag_gemm(failed communicator)", tpf_ag_gemm(wd->failed, &w, &d, NULL), TPF_ESTATE);

  /* tpf_gemm_rs */
  expect("gemm_rs(NULL comm)", tpf_gemm_rs(NULL, &x, &wr, &out, NULL), TPF_EINVAL);
  expect("gemm_rs(NULL x)", tpf_gemm_rs(wd->rs, NULL, &wr, &out, NULL), TPF_EINVAL);
  expect("gemm_rs(NULL w)", tpf_gemm_rs(wd->rs, &x, NULL, &out, NULL), TPF_EINVAL);
  expect("gemm_rs(NULL out)", tpf_gemm_rs(wd->rs, &x, &wr, NULL, NULL), TPF_EINVAL);
  t = x, t.rows = C / 2;
  expect("gemm_rs(x rows != T)", tpf_gemm_rs(wd->rs, &t, &wr, &out, NULL), TPF_ESHAPE);
  t = wr, t.rows = H / 2;
  expect("gemm_rs(w rows != H)", tpf_gemm_rs(wd->pipe, &x, &t, &out, NULL), TPF_ESHAPE);
  t = out, t.rows = C;
  expect("gemm_rs(out rows != T/P)", tpf_gemm_rs(wd->rs, &x, &wr, &t, NULL), TPF_ESHAPE);
  t = out, t.dtype = TPF_FP16;
  expect("gemm_rs(out wrong dtype)", tpf_gemm_rs(wd->rs, &x, &wr, &t, NULL), TPF_EINVAL);
  expect("gemm_rs(on an AG communicator)", tpf_gemm_rs(wd->ag, &x, &wr, &out, NULL),
         TPF_EUNSUPPORTED);
  expect("gemm_rs(on bulk)", tpf_gemm_rs(wd->bulk, &x, &wr, &out, NULL), TPF_EUNSUPPORTED);

  /* tpf_bulk_overlap */
  expect("bulk(NULL comm)", tpf_bulk_overlap(NULL, &a, &b, &d, NULL), TPF_EINVAL);
  expect("bulk(NULL a)", tpf_bulk_overlap(wd->bulk, NULL, &b, &d, NULL), TPF_EINVAL);
  expect("bulk(NULL b)", tpf_bulk_overlap(wd->bulk, &a, NULL, &d, NULL), TPF_EINVAL);
  expect("bulk(NULL d)", tpf_bulk_overlap(wd->bulk, &a, &b, NULL, NULL), TPF_EINVAL);
  t = a, t.dtype = TPF_FP8_E5M2;
  expect("bulk(fp8 a)", tpf_bulk_overlap(wd->bulk, &t, &b, &d, NULL), TPF_EINVAL);
  t = b, t.cols = K + 8, t.ld = K + 8;
  expect("bulk(b cols != a cols)", tpf_bulk_overlap(wd->bulk, &a, &t, &d, NULL), TPF_ESHAPE);
  t = d, t.cols = N + 1, t.ld = N + 1;
  expect("bulk(d cols != b rows)", tpf_bulk_overlap(wd->bulk, &a, &b, &t, NULL), TPF_ESHAPE);
  expect("bulk(on ring)", tpf_bulk_overlap(wd->ag, &a, &b, &d, NULL), TPF_EUNSUPPORTED);
  assert_int_equal(wd->be.executions, execs); /* no rejected call reached the backend */
}

static void test_bad_input__manager_calls(void **state) {
  world *wd = *state;
  tpf_comm *c = (tpf_comm *)0x1;
  tpf_manager *m = (tpf_manager *)0x1;
  tpf_comm_config cfg = cfg_of("site", TPF_ALGO_BULK, TPF_COLL_RS);
  tpf_shape s = {8, H};
  expect("manager_create(NULL be)", tpf_manager_create(NULL, &m), TPF_EINVAL);
  expect("manager_create(NULL out)", tpf_manager_create(&wd->be.hdr, NULL), TPF_EINVAL);
  expect("manager_add(NULL m)", tpf_manager_add(NULL, &cfg, &c), TPF_EINVAL);
  expect("manager_add(NULL cfg)", tpf_manager_add(wd->m, NULL, &c), TPF_EINVAL);
  TPF_ASSERT_OK(tpf_manager_add(wd->m, &cfg, NULL));
  expect("manager_add(duplicate)", tpf_manager_add(wd->m, &cfg, &c), TPF_EINVAL);
  expect("manager_get(NULL name)", tpf_manager_get(wd->m, NULL, &c), TPF_EINVAL);
  expect("manager_get(unknown)", tpf_manager_get(wd->m, "nope", &c), TPF_EINVAL);
  expect("manager_get(NULL out)", tpf_manager_get(wd->m, "site", NULL), TPF_EINVAL);
  expect("manager_at(-1)", tpf_manager_at(wd->m, -1, &c), TPF_EINVAL);
  expect("manager_at(count)", tpf_manager_at(wd->m, 1, &c), TPF_EINVAL);
  s.rows = 0;
  expect("manager_set(zero rows)", tpf_manager_set_active_shape(wd->m, s), TPF_ESHAPE);
  s.rows = 8, s.cols = 7;
  expect("manager_set(wrong cols)", tpf_manager_set_active_shape(wd->m, s), TPF_ESHAPE);
  expect("manager_set(NULL)", tpf_manager_set_active_shape(NULL, s), TPF_EINVAL);
  expect("manager_destroy(NULL)", tpf_manager_destroy(NULL), TPF_EINVAL);
  assert_ptr_equal(c, (tpf_comm *)0x1);
  assert_ptr_equal(m, (tpf_manager *)0x1);
  tpf_comm *site;
  TPF_ASSERT_OK(tpf_manager_get(wd->m, "site", &site));
  assert_int_equal(tpf_comm_active_shape(site).rows, C);
  assert_int_equal(tpf_comm_epoch(site), 0);
  print_message("bad-input cases: %d, each with its status, a detail, and nothing changed\n",
                cases_run);
}

#ifdef TPF_HAVE_SIM
static tpf_status noop_rank(tpf_backend *be, int rank, void *arg) {
  (void)be;
  (void)rank;
  (void)arg;
  return TPF_OK;
}
#endif

/* The backends' own entry points: rejected before they touch a thread or a device. */
static void test_bad_input__backend_entry_points(void **state) {
  (void)state;
#ifdef TPF_HAVE_SIM
  tpf_sim_world *w = (tpf_sim_world *)0x1;
  tpf_sim_config cfg;
  memset(&cfg, 0, sizeof cfg);
  expect("sim_world_create(NULL cfg)", tpf_sim_world_create(NULL, &w), TPF_EINVAL);
  expect("sim_world_create(tp_size 0)", tpf_sim_world_create(&cfg, &w), TPF_EINVAL);
  cfg.tp_size = TPF_MAX_RANKS + 1;
  expect("sim_world_create(tp_size 65)", tpf_sim_world_create(&cfg, &w), TPF_EINVAL);
  cfg.tp_size = 2;
  expect("sim_world_create(NULL out)", tpf_sim_world_create(&cfg, NULL), TPF_EINVAL);
  assert_ptr_equal(w, (tpf_sim_world *)0x1);
  expect("sim_run(NULL world)", tpf_sim_run(NULL, noop_rank, NULL), TPF_EINVAL);
  tpf_sim_world *ok = NULL;
  TPF_ASSERT_OK(tpf_sim_world_create(&cfg, &ok));
  expect("sim_run(NULL fn)", tpf_sim_run(ok, NULL, NULL), TPF_EINVAL);
  expect("sim_world_destroy(NULL)", tpf_sim_world_destroy(NULL), TPF_EINVAL);
  TPF_ASSERT_OK(tpf_sim_world_destroy(ok));
#endif
#ifdef TPF_HAVE_CUDA
  tpf_backend *be = (tpf_backend *)0x1;
  tpf_bootstrap boot;
  memset(&boot, 0, sizeof boot);
  expect("cuda_backend_create(NULL boot)", tpf_cuda_backend_create(NULL, &be), TPF_EINVAL);
  expect("cuda_backend_create(tp_size 0)", tpf_cuda_backend_create(&boot, &be), TPF_EINVAL);
  boot.tp_size = 2;
  boot.rank = 2;
  expect("cuda_backend_create(rank 2 of 2)", tpf_cuda_backend_create(&boot, &be), TPF_EINVAL);
  boot.rank = 0;
  expect("cuda_backend_create(no callbacks)", tpf_cuda_backend_create(&boot, &be), TPF_EINVAL);
  expect("cuda_backend_destroy(NULL)", tpf_cuda_backend_destroy(NULL), TPF_EINVAL);
  assert_ptr_equal(be, (tpf_backend *)0x1);
#endif
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bad_input__backend_entry_points),
      cmocka_unit_test(test_bad_input__layout_queries),
      cmocka_unit_test(test_bad_input__communicator_calls),
      cmocka_unit_test(test_bad_input__operations),
      cmocka_unit_test(test_bad_input__manager_calls),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
