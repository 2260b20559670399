/* A mock backend for core tests: registrations are plain host memory (through the core's
 * allocator, so budget loops cover them), execute records the call and runs nothing. */
#include "tpf_test.h"

struct tpf_reg {
  void *data;
  uint64_t bytes;
};

static tpf_status mock_reg_create(tpf_backend *be, const char *name, uint64_t bytes, tpf_reg **reg,
                                  void **local) {
  tpf_mock_backend *m = (tpf_mock_backend *)be;
  (void)name;
  if (m->fail_reg_after >= 0 && m->reg_total >= m->fail_reg_after)
    return tpf_set_error(TPF_EBACKEND, "mock: registration %d refused", m->reg_total);
  tpf_reg *r = tpf__calloc(1, sizeof *r);
  if (!r) return tpf_set_error(TPF_ENOMEM, "mock: no memory for a registration");
  r->data = tpf__calloc(1, (size_t)bytes);
  if (!r->data) {
    tpf__free(r);
    return tpf_set_error(TPF_ENOMEM, "mock: no memory for %llu bytes", (unsigned long long)bytes);
  }
  r->bytes = bytes;
  m->reg_live++;
  m->reg_total++;
  *reg = r;
  *local = r->data;
  return TPF_OK;
}

static tpf_status mock_reg_destroy(tpf_backend *be, tpf_reg *reg) {
  tpf_mock_backend *m = (tpf_mock_backend *)be;
  tpf__free(reg->data);
  tpf__free(reg);
  m->reg_live--;
  return TPF_OK;
}

static tpf_status mock_reg_activate(tpf_backend *be, tpf_reg *reg, uint64_t active_bytes) {
  tpf_mock_backend *m = (tpf_mock_backend *)be;
  int call = m->activate_calls++;
  if (m->fail_activate != TPF_OK && (m->fail_activate_at < 0 || m->fail_activate_at == call))
    return tpf_set_error(m->fail_activate, "mock: activation %d refused", call);
  if (active_bytes > reg->bytes)
    return tpf_set_error(TPF_EINVAL, "mock: active bytes %llu beyond registration %llu",
                         (unsigned long long)active_bytes, (unsigned long long)reg->bytes);
  m->activations++;
  m->last_active_bytes = active_bytes;
  return TPF_OK;
}

static tpf_status mock_execute(tpf_backend *be, tpf_reg *reg, const tpf_exec_args *a,
                               void *stream) {
  tpf_mock_backend *m = (tpf_mock_backend *)be;
  (void)reg;
  (void)stream;
  m->executions++;
  m->last_seq = a->seq;
  m->last_sched = *a->sched;
  m->last_sched.steps = NULL;
  if (m->fail_execute != TPF_OK)
    return tpf_set_error(m->fail_execute, "mock: execution failed as configured");
  return TPF_OK;
}

static tpf_status mock_sync(tpf_backend *be, void *stream) {
  (void)be;
  (void)stream;
  return TPF_OK;
}

const tpf_backend_ops tpf_mock_ops = {
    .abi_version = TPF_BACKEND_ABI_VERSION,
    .name = "mock",
    .caps = TPF_BE_CAP_HOST_MEMORY | TPF_BE_CAP_OPTIONS,
    .align_bytes = 16,
    .max_ranks = TPF_MAX_RANKS,
    .reg_create = mock_reg_create,
    .reg_destroy = mock_reg_destroy,
    .reg_activate = mock_reg_activate,
    .execute = mock_execute,
    .sync = mock_sync,
};

void tpf_mock_init(tpf_mock_backend *m, int tp_size, int rank) {
  memset(m, 0, sizeof *m);
  m->hdr.ops = &tpf_mock_ops;
  m->hdr.tp_size = tp_size;
  m->hdr.rank = rank;
  m->fail_reg_after = -1;
  m->fail_activate_at = -1;
}
