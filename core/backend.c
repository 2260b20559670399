/* The only call path from the core into a backend (SQLite's sqlite3OsXxx): argument checks,
 * defaults for optional ops, and the place to hang tracing. Backends translate their foreign
 * errors themselves and record the detail with tpf_set_error before returning. */
#include "internal.h"

#include <threads.h>

#include <stdatomic.h>

tpf_status tpf__be_validate(const tpf_backend *be) {
  TPF_RETURN_IF(!be, TPF_EINVAL, "backend is NULL");
  TPF_RETURN_IF(!be->ops, TPF_EINVAL, "backend has no ops table");
  const tpf_backend_ops *o = be->ops;
  TPF_RETURN_IF(o->abi_version < TPF_BACKEND_ABI_MIN || o->abi_version > TPF_BACKEND_ABI_VERSION,
                TPF_EUNSUPPORTED, "backend '%s' has ABI version %d, this core speaks %d..%d",
                o->name ? o->name : "?", o->abi_version, TPF_BACKEND_ABI_MIN,
                TPF_BACKEND_ABI_VERSION);
  TPF_RETURN_IF(!o->reg_create || !o->reg_destroy || !o->execute || !o->sync, TPF_EINVAL,
                "backend '%s' lacks a required op (reg_create, reg_destroy, execute, sync)",
                o->name ? o->name : "?");
  int max_ranks = o->max_ranks > 0 ? o->max_ranks : TPF_MAX_RANKS;
  TPF_RETURN_IF(be->tp_size < 1 || be->tp_size > max_ranks, TPF_EINVAL,
                "backend '%s' tp_size %d outside 1..%d", o->name ? o->name : "?", be->tp_size,
                max_ranks);
  TPF_RETURN_IF(be->rank < 0 || be->rank >= be->tp_size, TPF_EINVAL,
                "backend '%s' rank %d outside 0..%d", o->name ? o->name : "?", be->rank,
                be->tp_size - 1);
  return TPF_OK;
}

tpf_status tpf__be_reg_create(tpf_backend *be, const char *name, uint64_t bytes, tpf_reg **reg,
                              void **local) {
  TPF_RETURN_IF(bytes == 0, TPF_EINVAL, "registration of 0 bytes for '%s'", name);
  return be->ops->reg_create(be, name, bytes, reg, local);
}

tpf_status tpf__be_reg_destroy(tpf_backend *be, tpf_reg *reg) {
  return be->ops->reg_destroy(be, reg);
}

tpf_status tpf__be_reg_activate(tpf_backend *be, tpf_reg *reg, uint64_t active_bytes) {
  /* Optional op: a backend without a canary has nothing to do on a shape change. */
  if (!be->ops->reg_activate) return TPF_OK;
  return be->ops->reg_activate(be, reg, active_bytes);
}

/* One thread per rank at a time, across communicators (tpflex.h, Threads): a communicator's own
 * busy flag keeps a second thread off that communicator; this keeps a second thread off the
 * rank's backend while another thread is inside any call that reaches it (an operation on
 * another communicator, a shape change, sync, a creation or a destroy). Refused here, before the
 * backend sees the call, the call has no effect: no sequence number is used, no shape or
 * registration changes and the communicator stays usable. A backend's own entry guard (the
 * simulator's) would refuse only a step later, in the middle of the call: an operation after the
 * core had counted it and marked the communicator failed (its peers then waited out their
 * timeout), a manager's shape change after it had changed some communicators, a destroy after it
 * had freed the communicator but not its registration. A small table of the backends inside a
 * call, under a C11 spin lock (the core uses no pthreads); a critical section scans the slots
 * used so far (g_used <= kMaxBusy), in practice the ranks of this process. A full table leaves
 * the check to the backend. */
enum { kMaxBusy = 256 };
static atomic_flag g_busy_lock = ATOMIC_FLAG_INIT;
static const tpf_backend *g_busy[kMaxBusy];
static int g_used; /* 1 + the highest slot ever taken: the scans stop there */

tpf_status tpf__be_claim(const tpf_backend *be, const char *call, const char *comm, bool *claimed) {
  *claimed = false;
  int free_slot = -1;
  bool taken = false;
  while (atomic_flag_test_and_set_explicit(&g_busy_lock, memory_order_acquire)) {
    thrd_yield(); /* a preempted holder gets the core back (2 cores, many rank threads) */
  }
  for (int i = 0; i < g_used; i++) {
    if (g_busy[i] == be) taken = true;
    if (!g_busy[i] && free_slot < 0) free_slot = i;
  }
  if (free_slot < 0 && g_used < kMaxBusy) free_slot = g_used;
  if (!taken && free_slot >= 0) {
    g_busy[free_slot] = be;
    if (free_slot >= g_used) g_used = free_slot + 1;
    *claimed = true;
  }
  atomic_flag_clear_explicit(&g_busy_lock, memory_order_release);
  TPF_RETURN_IF(taken, TPF_ESTATE,
                "%s%s%s%s%sanother thread is inside a call for rank %d (an operation, a shape "
                "change, sync, creation or destroy on one of its communicators); one thread per "
                "rank at a time (tpflex.h, Threads): refused, nothing changed; serialize the "
                "calls and call again",
                call ? call : "", call ? ": " : "", comm ? "'" : "", comm ? comm : "",
                comm ? "': " : "", be->rank);
  return TPF_OK;
}

void tpf__be_release(const tpf_backend *be) {
  while (atomic_flag_test_and_set_explicit(&g_busy_lock, memory_order_acquire)) {
    thrd_yield(); /* a preempted holder gets the core back (2 cores, many rank threads) */
  }
  for (int i = 0; i < g_used; i++)
    if (g_busy[i] == be) {
      g_busy[i] = NULL;
      break;
    }
  atomic_flag_clear_explicit(&g_busy_lock, memory_order_release);
}

tpf_status tpf__be_execute(tpf_backend *be, tpf_reg *reg, uint64_t reg_bytes,
                           const tpf_exec_args *a, void *stream) {
  TPF_CHECK(tpf__exec_check(a, reg_bytes));
  return be->ops->execute(be, reg, a, stream);
}

tpf_status tpf__be_sync(tpf_backend *be, void *stream) {
  return be->ops->sync(be, stream);
}

/* Fields added in ABI 2 exist only in tables of version 2 or later: an older table ends before
 * them, so they are never read. */
static bool v2(const tpf_backend *be) {
  return be->ops->abi_version >= 2;
}

tpf_status (*tpf__be_reg_sync_op(const tpf_backend *be))(tpf_backend *, tpf_reg *) {
  return v2(be) ? be->ops->reg_sync : NULL;
}

tpf_status (*tpf__be_reg_async_error_op(const tpf_backend *be))(tpf_backend *, tpf_reg *,
                                                                tpf_status *) {
  return v2(be) ? be->ops->reg_async_error : NULL;
}

tpf_status (*tpf__be_reg_abort_op(const tpf_backend *be))(tpf_backend *, tpf_reg *) {
  return v2(be) ? be->ops->reg_abort : NULL;
}

tpf_status (*tpf__be_allgather_op(const tpf_backend *be))(tpf_backend *, const void *, void *,
                                                          size_t) {
  return v2(be) ? be->ops->allgather : NULL;
}

unsigned tpf__be_caps(const tpf_backend *be) {
  unsigned caps = be->ops->caps;
  if (!v2(be)) caps &= ~(unsigned)TPF_BE_CAP_OPTIONS; /* a 0.1 backend ignores step flags */
  return caps;
}
