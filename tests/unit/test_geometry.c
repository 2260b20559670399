/* tpf_manager_geometry: every site's geometry record for the active shapes, equal to what the
 * per-communicator queries answer; bad inputs are TPF_EINVAL with nothing written. */
#include "tpf_test.h"

enum { P = 4, RANK = 1, H = 64, CAP = 128 };

typedef struct {
  tpf_mock_backend be;
  tpf_manager *m;
} fixture;

/* One site of each layout (the ring RS slot rule among them), an fp8 one and an external one. */
static int setup(void **state) {
  fixture *f = calloc(1, sizeof *f);
  tpf_mock_init(&f->be, P, RANK);
  if (tpf_manager_create(&f->be.hdr, &f->m) != TPF_OK) return -1;
  tpf_comm_config cfgs[] = {
      tpf_test_config("ring_ag", TPF_ALGO_RING, TPF_COLL_AG, TPF_BF16, CAP, H),
      tpf_test_config("pipe_rs", TPF_ALGO_PIPELINE, TPF_COLL_RS, TPF_BF16, CAP, H),
      tpf_test_config("bulk_ag", TPF_ALGO_BULK, TPF_COLL_AG, TPF_FP32, CAP, H),
      tpf_test_config("ring_rs", TPF_ALGO_RING, TPF_COLL_RS, TPF_BF16, CAP, H),
      tpf_test_config("ring_rs_fp8", TPF_ALGO_RING, TPF_COLL_RS, TPF_FP8_E4M3, CAP, H),
      tpf_test_config("external", TPF_ALGO_BULK, TPF_COLL_RS, TPF_BF16, CAP, H),
  };
  cfgs[5].external = true;
  for (size_t i = 0; i < TPF_ARRAY_SIZE(cfgs); i++)
    if (tpf_manager_add(f->m, &cfgs[i], NULL) != TPF_OK) return -1;
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fixture *f = *state;
  int rc = tpf_manager_destroy(f->m) == TPF_OK && f->be.reg_live == 0 ? 0 : -1;
  free(f);
  return rc;
}

/* Each record against the per-communicator calls (buffer, local chunk, shape, epoch,
 * registration), and the ring RS slot rule written out once more here as the test's oracle. */
static void check_records(tpf_manager *m, const tpf_site_geometry *g, int n) {
  assert_int_equal(n, tpf_manager_count(m));
  for (int i = 0; i < n; i++) {
    tpf_comm *c = NULL;
    TPF_ASSERT_OK(tpf_manager_at(m, i, &c));
    assert_ptr_equal(g[i].comm, c);
    assert_int_equal(g[i].size, sizeof(tpf_site_geometry));
    const tpf_comm_config *cfg = tpf_comm_config_of(c);
    assert_string_equal(g[i].name, cfg->name);
    assert_int_equal(g[i].epoch, tpf_comm_epoch(c));
    assert_int_equal(g[i].active.rows, tpf_comm_active_shape(c).rows);
    assert_int_equal(g[i].active.cols, H);
    assert_int_equal(g[i].dtype, cfg->dtype);
    void *base = NULL;
    uint64_t reg = 0;
    TPF_ASSERT_OK(tpf_comm_registration(c, &base, &reg));
    assert_ptr_equal(g[i].base, base);
    assert_int_equal(g[i].registered_bytes, reg);
    tpf_matrix buf, loc;
    TPF_ASSERT_OK(tpf_comm_buffer(c, &buf));
    TPF_ASSERT_OK(tpf_comm_local_chunk(c, &loc));
    const uint64_t e = tpf_dtype_size(cfg->dtype), T = g[i].active.rows, R = T / P;
    assert_int_equal(g[i].ld, buf.ld);
    assert_int_equal(g[i].buffer_off_bytes, (uint64_t)((char *)buf.ptr - (char *)base));
    assert_int_equal(g[i].buffer_rows, buf.rows);
    assert_int_equal(g[i].buffer_bytes, buf.rows * H * e);
    assert_int_equal(g[i].chunk_off_bytes, (uint64_t)((char *)loc.ptr - (char *)base));
    assert_int_equal(g[i].chunk_rows, loc.rows);
    assert_int_equal(g[i].chunk_bytes, loc.rows * H * e);
    assert_int_equal(g[i].chunk_row_off * H * e, g[i].chunk_off_bytes);
    const bool ring_rs = cfg->algo == TPF_ALGO_RING && cfg->coll == TPF_COLL_RS;
    assert_int_equal(g[i].buffer_rows, ring_rs ? (2 * P - 1) * R : T);
    assert_int_equal(g[i].chunk_row_off, (ring_rs ? P - 1 : RANK) * R);
    assert_int_equal(g[i].chunk_rows, R);
  }
}

static void test_geometry__records_follow_the_shape(void **state) {
  fixture *f = *state;
  tpf_site_geometry g[8];
  memset(g, 0, sizeof g);
  int n = -1;
  g[0].size = sizeof g[0];
  TPF_ASSERT_OK(tpf_manager_geometry(f->m, g, 8, &n));
  assert_int_equal(n, 6);
  check_records(f->m, g, n);
  assert_int_equal(g[0].active.rows, CAP); /* capacity until the first shape change */
  const uint64_t rows[] = {40, 8, 128, 64};
  for (size_t k = 0; k < TPF_ARRAY_SIZE(rows); k++) {
    TPF_ASSERT_OK(tpf_manager_set_active_shape(f->m, (tpf_shape){rows[k], H}));
    TPF_ASSERT_OK(tpf_manager_geometry(f->m, g, 8, &n));
    check_records(f->m, g, n);
    assert_int_equal(g[3].active.rows, rows[k]);
    assert_int_equal(g[3].epoch, k + 1);
    assert_int_equal(g[5].active.rows, CAP); /* external: stays at capacity, epoch 0 */
    assert_int_equal(g[5].epoch, 0);
  }
  /* size 0 means this header's layout; the count alone with out NULL and cap 0 */
  g[0].size = 0;
  TPF_ASSERT_OK(tpf_manager_geometry(f->m, g, 6, &n));
  assert_int_equal(g[0].size, sizeof g[0]);
  n = -1;
  TPF_ASSERT_OK(tpf_manager_geometry(f->m, NULL, 0, &n));
  assert_int_equal(n, 6);
}

static void test_geometry__bad_inputs_change_nothing(void **state) {
  fixture *f = *state;
  tpf_site_geometry g[8], before[8];
  memset(g, 0x5a, sizeof g);
  g[0].size = sizeof g[0];
  memcpy(before, g, sizeof g);
  int n = 77;
  struct {
    tpf_manager *m;
    tpf_site_geometry *out;
    int cap;
    int *n;
    const char *detail;
  } bad[] = {
      {NULL, g, 8, &n, "tpf_manager_geometry"},
      {f->m, g, 8, NULL, "n is NULL"},
      {f->m, g, -1, &n, "cap -1 is negative"},
      {f->m, NULL, 3, &n, "out is NULL with cap 3"},
      {f->m, g, 5, &n, "cap 5 is below the manager's 6 communicators"},
      {f->m, g, 0, &n, "cap 0 is below the manager's 6 communicators"},
  };
  for (size_t i = 0; i < TPF_ARRAY_SIZE(bad); i++) {
    tpf_set_error(TPF_OK, "%s", "-");
    TPF_ASSERT_STATUS(tpf_manager_geometry(bad[i].m, bad[i].out, bad[i].cap, bad[i].n), TPF_EINVAL);
    assert_non_null(strstr(tpf_last_error(), bad[i].detail));
    assert_int_equal(n, 77);
    assert_memory_equal(g, before, sizeof g);
  }
  /* a size that is no released layout (one that ends inside a field) */
  g[0].size = sizeof g[0] - 4;
  memcpy(before, g, sizeof g);
  TPF_ASSERT_STATUS(tpf_manager_geometry(f->m, g, 8, &n), TPF_EINVAL);
  assert_non_null(strstr(tpf_last_error(), "tpf_site_geometry"));
  assert_int_equal(n, 77);
  assert_memory_equal(g, before, sizeof g);
  /* a destroyed manager's handle is refused, not read */
  tpf_manager *m2 = NULL;
  TPF_ASSERT_OK(tpf_manager_create(&f->be.hdr, &m2));
  TPF_ASSERT_OK(tpf_manager_destroy(m2));
  g[0].size = sizeof g[0];
  TPF_ASSERT_STATUS(tpf_manager_geometry(m2, g, 8, &n), TPF_EINVAL);
  assert_int_equal(n, 77);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_geometry__records_follow_the_shape, setup, teardown),
      cmocka_unit_test_setup_teardown(test_geometry__bad_inputs_change_nothing, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
