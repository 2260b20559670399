/* The fault-injecting wrapper backend (tpflex_fault.h): SQLite's test VFS, over any backend.
 *
 * Method: the wrapper is a backend object whose ops table is its own copy of the wrapped
 * backend's, with every op it intercepts pointing here. An intercepted op counts the call,
 * applies the plan (fail, or sleep first) and otherwise calls the wrapped backend's op with the
 * wrapped backend object, so registrations (tpf_reg) are the wrapped backend's own and pass
 * through untouched. Optional ops of the wrapped table stay absent in the copy (read through the
 * core's version-aware accessors, so an older table's missing fields are never read). A planned
 * dropped SEND is removed from a private copy of that one schedule, dependencies renumbered, and
 * the copy is executed instead: the peer's RECV never completes, whatever the backend.
 */
#define _POSIX_C_SOURCE 200809L
#include "internal.h"

#include "tpflex/tpflex_fault.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

typedef struct {
  tpf_backend hdr;     /* must stay first: the core sees this */
  tpf_backend_ops ops; /* the wrapped table, intercepted */
  tpf_backend *inner;
  tpf_fault_plan plan;
  tpf_fault_report rep;
  char name[64];
  uint32_t magic;
} fault_be;

#define FAULT_MAGIC 0x74706666u /* "tpff" */

static fault_be *of(tpf_backend *be) {
  return (fault_be *)(void *)be;
}

static void sleep_us(unsigned us) {
  struct timespec ts = {(time_t)(us / 1000000u), (long)(us % 1000000u) * 1000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

/* Counts one call and applies the plan: TPF_OK to go on, else the injected failure. */
static tpf_status enter(fault_be *f, const char *what) {
  const uint64_t k = ++f->rep.calls;
  const tpf_fault_plan *p = &f->plan;
  if (p->delay_call != 0 && k == p->delay_call && p->delay_us != 0) {
    f->rep.injected++;
    sleep_us(p->delay_us);
  }
  if (p->fail_call == 0 || !(k == p->fail_call || (p->fail_persistent && k > p->fail_call)))
    return TPF_OK;
  f->rep.injected++;
  tpf_status st = p->fail_status != TPF_OK ? p->fail_status : TPF_EBACKEND;
  return tpf_set_error(st, "injected fault: call %llu (%s on rank %d of %s) fails%s",
                       (unsigned long long)k, what, f->hdr.rank, f->name,
                       p->fail_persistent ? " (persistent)" : "");
}

static tpf_status w_reg_create(tpf_backend *be, const char *name, uint64_t bytes, tpf_reg **reg,
                               void **local) {
  fault_be *f = of(be);
  TPF_CHECK(enter(f, "reg_create"));
  return f->inner->ops->reg_create(f->inner, name, bytes, reg, local);
}

static tpf_status w_reg_destroy(tpf_backend *be, tpf_reg *reg) {
  fault_be *f = of(be);
  return f->inner->ops->reg_destroy(f->inner, reg);
}

static tpf_status w_reg_activate(tpf_backend *be, tpf_reg *reg, uint64_t active_bytes) {
  fault_be *f = of(be);
  TPF_CHECK(enter(f, "reg_activate"));
  return f->inner->ops->reg_activate ? f->inner->ops->reg_activate(f->inner, reg, active_bytes)
                                     : TPF_OK;
}

/* Copies s without step `drop`: dependencies on it vanish, later indices shift down. */
static tpf_status without_step(const tpf_schedule *s, int drop, tpf_schedule *out) {
  *out = *s;
  out->steps = tpf__calloc((size_t)s->nsteps, sizeof *out->steps);
  TPF_RETURN_IF(!out->steps, TPF_ENOMEM, "fault wrapper: copy of a %d-step schedule", s->nsteps);
  int n = 0;
  for (int i = 0; i < s->nsteps; i++) {
    if (i == drop) continue;
    tpf_step st = s->steps[i];
    uint8_t nd = 0;
    for (int j = 0; j < st.ndeps; j++) {
      if (st.deps[j] == drop) continue;
      st.deps[nd++] = (uint16_t)(st.deps[j] > drop ? st.deps[j] - 1 : st.deps[j]);
    }
    st.ndeps = nd;
    out->steps[n++] = st;
  }
  out->nsteps = n;
  return TPF_OK;
}

static tpf_status w_execute(tpf_backend *be, tpf_reg *reg, const tpf_exec_args *a, void *stream) {
  fault_be *f = of(be);
  TPF_CHECK(enter(f, "execute"));
  int drop = -1;
  for (int i = 0; i < a->sched->nsteps; i++) {
    if (a->sched->steps[i].kind != TPF_STEP_SEND) continue;
    if (++f->rep.sends == f->plan.drop_send && f->plan.drop_send != 0) drop = i;
  }
  if (drop < 0) return f->inner->ops->execute(f->inner, reg, a, stream);
  f->rep.injected++;
  tpf_schedule copy;
  TPF_CHECK(without_step(a->sched, drop, &copy));
  tpf_exec_args b = *a;
  b.sched = &copy;
  tpf_status rc = f->inner->ops->execute(f->inner, reg, &b, stream);
  /* Synchronous backends are done with the steps; asynchronous ones have enqueued them (the
   * core's contract for its own storage is the same). */
  tpf__free(copy.steps);
  return rc;
}

static tpf_status w_sync(tpf_backend *be, void *stream) {
  fault_be *f = of(be);
  TPF_CHECK(enter(f, "sync"));
  return f->inner->ops->sync(f->inner, stream);
}

static tpf_status w_reg_sync(tpf_backend *be, tpf_reg *reg) {
  fault_be *f = of(be);
  TPF_CHECK(enter(f, "reg_sync"));
  return tpf__be_reg_sync_op(f->inner)(f->inner, reg);
}

static tpf_status w_reg_async_error(tpf_backend *be, tpf_reg *reg, tpf_status *out) {
  fault_be *f = of(be);
  return tpf__be_reg_async_error_op(f->inner)(f->inner, reg, out);
}

static tpf_status w_reg_abort(tpf_backend *be, tpf_reg *reg) {
  fault_be *f = of(be);
  return tpf__be_reg_abort_op(f->inner)(f->inner, reg);
}

static tpf_status w_allgather(tpf_backend *be, const void *mine, void *all, size_t bytes) {
  fault_be *f = of(be);
  TPF_CHECK(enter(f, "allgather"));
  return tpf__be_allgather_op(f->inner)(f->inner, mine, all, bytes);
}

static tpf_status take_plan(fault_be *f, const tpf_fault_plan *plan) {
  tpf_fault_plan p = TPF_FAULT_PLAN_INIT;
  if (plan) {
    static const size_t released[] = {sizeof(tpf_fault_plan)}; /* 0.2 */
    TPF_CHECK(tpf__check_struct_size("fault backend", "fault plan", "tpf_fault_plan", plan->size,
                                     released, TPF_ARRAY_SIZE(released)));
    p = *plan;
    p.size = sizeof p;
  }
  f->plan = p;
  memset(&f->rep, 0, sizeof f->rep);
  return TPF_OK;
}

tpf_status tpf_fault_backend_create(tpf_backend *inner, const tpf_fault_plan *plan,
                                    tpf_backend **out) {
  TPF_RETURN_IF(!out, TPF_EINVAL, "tpf_fault_backend_create: out is NULL");
  TPF_CHECK(tpf__be_validate(inner));
  fault_be *f = tpf__calloc(1, sizeof *f);
  TPF_RETURN_IF(!f, TPF_ENOMEM, "tpf_fault_backend_create: wrapper");
  tpf_status rc = take_plan(f, plan);
  if (rc != TPF_OK) {
    tpf__free(f);
    return rc;
  }
  const tpf_backend_ops *in = inner->ops;
  snprintf(f->name, sizeof f->name, "fault(%s)", in->name ? in->name : "?");
  memset(&f->ops, 0, sizeof f->ops);
  f->ops.abi_version = TPF_BACKEND_ABI_VERSION;
  f->ops.name = f->name;
  f->ops.caps = tpf__be_caps(inner);
  f->ops.align_bytes = in->align_bytes;
  f->ops.max_ranks = in->max_ranks;
  f->ops.reg_create = w_reg_create;
  f->ops.reg_destroy = w_reg_destroy;
  f->ops.reg_activate = w_reg_activate;
  f->ops.execute = w_execute;
  f->ops.sync = w_sync;
  f->ops.reg_sync = tpf__be_reg_sync_op(inner) ? w_reg_sync : NULL;
  f->ops.reg_async_error = tpf__be_reg_async_error_op(inner) ? w_reg_async_error : NULL;
  f->ops.reg_abort = tpf__be_reg_abort_op(inner) ? w_reg_abort : NULL;
  f->ops.allgather = tpf__be_allgather_op(inner) ? w_allgather : NULL;
  f->hdr.ops = &f->ops;
  f->hdr.tp_size = inner->tp_size;
  f->hdr.rank = inner->rank;
  f->inner = inner;
  f->magic = FAULT_MAGIC;
  rc = tpf__handle_add(&f->hdr, TPF_HANDLE_FAULT);
  if (rc != TPF_OK) {
    tpf__free(f);
    return rc;
  }
  *out = &f->hdr;
  return TPF_OK;
}

static tpf_status check_wrapper(const tpf_backend *fb, const char *fn) {
  /* The handle table first: a destroyed wrapper is never read. */
  TPF_RETURN_IF(fb && !tpf__handle_live(fb, TPF_HANDLE_FAULT), TPF_EINVAL,
                "%s: not a fault wrapper backend (destroyed, or never created by "
                "tpf_fault_backend_create)",
                fn);
  TPF_RETURN_IF(!fb || !fb->ops || fb->ops->reg_create != w_reg_create ||
                    ((const fault_be *)(const void *)fb)->magic != FAULT_MAGIC,
                TPF_EINVAL, "%s: not a fault wrapper backend", fn);
  return TPF_OK;
}

tpf_status tpf_fault_backend_set_plan(tpf_backend *fb, const tpf_fault_plan *plan) {
  TPF_CHECK(check_wrapper(fb, "tpf_fault_backend_set_plan"));
  return take_plan(of(fb), plan);
}

tpf_status tpf_fault_backend_report(const tpf_backend *fb, tpf_fault_report *out) {
  TPF_CHECK(check_wrapper(fb, "tpf_fault_backend_report"));
  TPF_RETURN_IF(!out, TPF_EINVAL, "tpf_fault_backend_report: out is NULL");
  *out = ((const fault_be *)(const void *)fb)->rep;
  return TPF_OK;
}

tpf_status tpf_fault_backend_destroy(tpf_backend *fb) {
  TPF_CHECK(check_wrapper(fb, "tpf_fault_backend_destroy"));
  fault_be *f = of(fb);
  tpf__handle_remove(fb, f->name);
  f->magic = 0;
  tpf__free(f);
  return TPF_OK;
}
