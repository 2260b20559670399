/* The CUDA backend's profiler ranges (backend_cuda/cuda_nvtx.c, SPEC §16), on the CPU: a static
 * NVTX injection (the documented InitializeInjectionNvtx2_fnptr hook of NVTX3) records what the
 * backend emits. Off by default (nothing emitted); TPFLEX_PROFILE=1 read at the first check;
 * tpf_cuda_set_profile wins over it; one range per operation named with the operation, site, T,
 * algorithm and split count of the schedule as it ran, coloured by kind, popped again; a mark
 * per shape change naming the registration. */
#define _POSIX_C_SOURCE 200809L
#include "cuda_state.h"
#include "tpf_test.h"

#include <nvtx3/nvToolsExt.h>
#include <stdlib.h>

/* ---- the recording tool ---- */
static char g_last[400];
static uint32_t g_color;
static int g_pushes, g_pops, g_marks;

static void take(const nvtxEventAttributes_t *ev) {
  snprintf(g_last, sizeof g_last, "%s",
           ev->messageType == NVTX_MESSAGE_TYPE_ASCII ? ev->message.ascii : "?");
  g_color = ev->color;
}
static int NVTX_API rec_push(const nvtxEventAttributes_t *ev) {
  take(ev);
  return ++g_pushes;
}
static int NVTX_API rec_pop(void) {
  return ++g_pops;
}
static void NVTX_API rec_mark(const nvtxEventAttributes_t *ev) {
  take(ev);
  g_marks++;
}
static int NVTX_API rec_init(NvtxGetExportTableFunc_t get) {
  const NvtxExportTableCallbacks *cb = (const NvtxExportTableCallbacks *)get(NVTX_ETID_CALLBACKS);
  NvtxFunctionTable table = NULL;
  unsigned size = 0;
  if (!cb || !cb->GetModuleFunctionTable(NVTX_CB_MODULE_CORE, &table, &size)) return 0;
  *table[NVTX_CBID_CORE_RangePushEx] = (NvtxFunctionPointer)rec_push;
  *table[NVTX_CBID_CORE_RangePop] = (NvtxFunctionPointer)rec_pop;
  *table[NVTX_CBID_CORE_MarkEx] = (NvtxFunctionPointer)rec_mark;
  return 1;
}
NvtxInitializeInjectionNvtxFunc_t InitializeInjectionNvtx2_fnptr = rec_init;

static void reset(void) {
  g_last[0] = '\0';
  g_pushes = g_pops = g_marks = 0;
}

static tpf_schedule sched_of(tpf_algo algo, tpf_coll coll, int splits, bool aggregate) {
  tpf_layout_desc d = tpf_test_layout_desc(algo, coll, 4, 1, 128, 16, splits, aggregate);
  tpf_gemm_dims g = {d.active.rows, 16, 16};
  tpf_schedule s;
  TPF_ASSERT_OK(tpf_schedule_build(&d, &g, &s));
  return s;
}

/* One operation through the push/pop pair g_execute wraps around execute. */
static bool one_op(const tpf_schedule *s, const char *site) {
  tpf_exec_args a;
  memset(&a, 0, sizeof a);
  a.sched = s;
  a.comm_name = site;
  const bool ranged = tpf_cuda__nvtx_op_push(&a);
  if (ranged) tpf_cuda__nvtx_op_pop();
  return ranged;
}

static void test_cuda_nvtx__switch_env_and_call(void **state) {
  (void)state;
  tpf_schedule s = sched_of(TPF_ALGO_RING, TPF_COLL_AG, 4, false);
  /* The environment is read at the first check. */
  setenv("TPFLEX_PROFILE", "1", 1);
  assert_int_equal(tpf_cuda_profile_enabled(), 1);
  unsetenv("TPFLEX_PROFILE");
  assert_int_equal(tpf_cuda_profile_enabled(), 1); /* read once */
  reset();
  assert_true(one_op(&s, "fc1_fprop"));
  assert_int_equal(g_pushes, 1);
  assert_int_equal(g_pops, 1);
  tpf_cuda_set_profile(0);
  assert_int_equal(tpf_cuda_profile_enabled(), 0);
  reset();
  assert_false(one_op(&s, "fc1_fprop"));
  tpf_reg r;
  memset(&r, 0, sizeof r);
  snprintf(r.name, sizeof r.name, "fc1_fprop");
  TPF_ASSERT_OK(tpf_cuda__nvtx_reg_activate(NULL, &r, 4096));
  assert_int_equal(g_pushes + g_pops + g_marks, 0); /* off: nothing emitted */
  tpf_cuda_set_profile(1);
  TPF_ASSERT_OK(tpf_cuda__nvtx_reg_activate(NULL, &r, 4096));
  assert_int_equal(g_marks, 1);
  assert_string_equal(g_last, "tpflex.set_active_shape fc1_fprop active_bytes=4096");
  tpf_schedule_free(&s);
}

static void test_cuda_nvtx__names_and_colours_by_kind(void **state) {
  (void)state;
  tpf_cuda_set_profile(1);
  struct {
    tpf_algo algo;
    tpf_coll coll;
    int splits;
    bool agg;
    const char *want;
    uint32_t color;
  } cases[] = {
      {TPF_ALGO_RING, TPF_COLL_AG, 4, false, "tpflex.ag_gemm site T=128 ring splits=4",
       0xFF4C78A8u},
      {TPF_ALGO_RING, TPF_COLL_AG, 2, true, "tpflex.ag_gemm site T=128 ring splits=2 aggregate",
       0xFF4C78A8u},
      {TPF_ALGO_PIPELINE, TPF_COLL_RS, 2, false, "tpflex.gemm_rs site T=128 pipeline splits=2",
       0xFFF58518u},
      {TPF_ALGO_BULK, TPF_COLL_AG, 0, false, "tpflex.bulk_overlap site T=128 bulk", 0xFF54A24Bu},
  };
  for (size_t i = 0; i < TPF_ARRAY_SIZE(cases); i++) {
    tpf_schedule s = sched_of(cases[i].algo, cases[i].coll, cases[i].splits, cases[i].agg);
    reset();
    assert_true(one_op(&s, "site"));
    if (strncmp(g_last, cases[i].want, strlen(cases[i].want)) != 0)
      fail_msg("case %zu: range '%s', want '%s...'", i, g_last, cases[i].want);
    assert_int_equal(g_color, cases[i].color);
    assert_int_equal(g_pushes, 1);
    assert_int_equal(g_pops, 1);
    tpf_schedule_free(&s);
  }
  tpf_cuda_set_profile(0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cuda_nvtx__switch_env_and_call),
      cmocka_unit_test(test_cuda_nvtx__names_and_colours_by_kind),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
