/* Communicators: the capacity/active-shape state machine and the three operations.
 *
 * Method: a communicator registers its buffer once, at capacity, in tpf_comm_create. Its active
 * shape starts equal to the capacity; tpf_comm_set_active_shape validates a new shape against
 * every rule of SPEC §3 with the backend's alignment and, only when all pass, tells the backend
 * the new active prefix and bumps the epoch. An operation validates its operands against the
 * active shape, builds this rank's schedule for that shape (so an operation keeps the shape it
 * was enqueued with, whatever happens to the communicator afterwards) and hands it to the
 * backend with the next sequence number. A timeout or backend failure leaves the communicator
 * failed: it refuses every later operation with TPF_ESTATE rather than run on bad data.
 */
#include "comm_internal.h"

#include <stdatomic.h>
#include <string.h>

/* The communicator as allocated: the shared struct (comm_internal.h) followed by what only this
 * file needs: the abort flag and the schedule storage, sized at creation for the largest
 * schedule any active shape T <= C can need, so an operation builds its schedule without
 * allocating (issue 11 item 4). */
typedef struct {
  struct tpf_comm c; /* must stay first */
  atomic_int aborted;
  int max_steps;
  tpf_step steps[]; /* max_steps entries */
} comm_full;

static comm_full *full_of(const tpf_comm *c) {
  return (comm_full *)(void *)(uintptr_t)c;
}

static bool aborted(const tpf_comm *c) {
  return atomic_load(&full_of(c)->aborted) != 0;
}

#define TPF_RETURN_IF_ABORTED(c)                                                                   \
  TPF_RETURN_IF(aborted(c), TPF_ESTATE,                                                            \
                "'%s' was aborted (tpf_comm_abort); destroy it and create a new one",              \
                (c)->cfg.name)

tpf_layout_desc tpf__comm_desc(const tpf_comm *c, tpf_shape active) {
  tpf_layout_desc d;
  memset(&d, 0, sizeof d);
  d.tp_size = c->be->tp_size;
  d.rank = c->be->rank;
  d.algo = c->cfg.algo;
  d.coll = c->cfg.coll;
  d.dtype = c->cfg.dtype;
  d.capacity = c->cfg.capacity;
  d.active = active;
  d.num_splits = c->cfg.num_splits;
  d.aggregate = c->cfg.aggregate;
  return d;
}

/* Prefixes the current detail with the communicator's name, keeping the status. */
static tpf_status named(const tpf_comm *c, tpf_status s) {
  char detail[400];
  strncpy(detail, tpf_last_error(), sizeof detail - 1);
  detail[sizeof detail - 1] = '\0';
  return tpf_set_error(s, "'%s': %s", c->cfg.name, detail);
}

static tpf_status check_config(const tpf_comm_config *cfg) {
  TPF_RETURN_IF(!cfg, TPF_EINVAL, "communicator config is NULL");
  TPF_RETURN_IF(!cfg->name || !cfg->name[0], TPF_EINVAL, "communicator config has no name");
  TPF_RETURN_IF(strlen(cfg->name) > 255, TPF_EINVAL, "communicator name longer than 255 bytes");
  TPF_RETURN_IF((unsigned)cfg->algo >= TPF_ALGO_COUNT, TPF_EINVAL,
                "'%s': algo %d is not a tpf_algo", cfg->name, (int)cfg->algo);
  TPF_RETURN_IF((unsigned)cfg->coll >= TPF_COLL_COUNT, TPF_EINVAL,
                "'%s': coll %d is not a tpf_coll", cfg->name, (int)cfg->coll);
  TPF_RETURN_IF((unsigned)cfg->dtype >= TPF_DTYPE_COUNT, TPF_EINVAL,
                "'%s': dtype %d is not a tpf_dtype", cfg->name, (int)cfg->dtype);
  return TPF_OK;
}

tpf_status tpf_comm_create(tpf_backend *be, const tpf_comm_config *cfg, tpf_comm **out) {
  TPF_RETURN_IF(!out, TPF_EINVAL, "tpf_comm_create: out is NULL");
  TPF_CHECK(tpf__be_validate(be));
  TPF_CHECK(check_config(cfg));

  tpf_layout_desc cap_desc;
  memset(&cap_desc, 0, sizeof cap_desc);
  cap_desc.tp_size = be->tp_size;
  cap_desc.algo = cfg->algo;
  cap_desc.capacity = cfg->capacity;
  int max_steps = tpf__schedule_max_steps(&cap_desc);
  comm_full *f = tpf__calloc(1, sizeof *f + (size_t)max_steps * sizeof(tpf_step));
  TPF_RETURN_IF(!f, TPF_ENOMEM, "'%s': cannot allocate the communicator", cfg->name);
  atomic_init(&f->aborted, 0);
  f->max_steps = max_steps;
  tpf_comm *c = &f->c;
  tpf_status rc = TPF_OK;
  c->be = be;
  c->cfg = *cfg;
  c->cfg.name = c->name = tpf__strdup(cfg->name);
  if (!c->name) {
    rc = tpf_set_error(TPF_ENOMEM, "'%s': cannot copy the name", cfg->name);
    goto fail;
  }
  c->active = cfg->capacity;

  /* The capacity shape obeys the same rules as an active shape (SPEC §3). */
  tpf_layout_desc d = tpf__comm_desc(c, cfg->capacity);
  rc = tpf__layout_check_align(&d, be->ops->align_bytes);
  if (rc != TPF_OK) {
    rc = named(c, rc);
    goto fail;
  }
  TPF_CHECK_GOTO(tpf_layout_registered_bytes(&d, &c->reg_bytes), rc, fail);
  TPF_CHECK_GOTO(tpf__planner_create(cfg, &d, &c->planner), rc, fail);
  if (c->planner) c->cfg.cost = tpf__planner_table(c->planner); /* our copy */
  rc = tpf__be_reg_create(be, c->name, c->reg_bytes, &c->reg, &c->base);
  if (rc != TPF_OK) goto fail;
  *out = c;
  return TPF_OK;

fail:
  tpf__planner_destroy(c->planner);
  tpf__free(c->name);
  tpf__free(f);
  return rc;
}

tpf_status tpf_comm_destroy(tpf_comm *c) {
  TPF_RETURN_IF(!c, TPF_EINVAL, "tpf_comm_destroy: communicator is NULL");
  /* Wait for what is in flight before the memory goes; keep going on error so nothing leaks. */
  tpf_status rc = tpf__be_sync(c->be, NULL);
  tpf_status rc2 = tpf__be_reg_destroy(c->be, c->reg);
  tpf__planner_destroy(c->planner);
  tpf__free(c->name);
  tpf__free(full_of(c));
  return rc != TPF_OK ? rc : rc2;
}

tpf_status tpf__comm_check_shape(const tpf_comm *c, tpf_shape active, uint64_t *active_bytes) {
  TPF_RETURN_IF(!c, TPF_EINVAL, "communicator is NULL");
  TPF_RETURN_IF_ABORTED(c);
  TPF_RETURN_IF(c->failed != TPF_OK, TPF_ESTATE,
                "'%s' failed earlier (%s) and accepts no shape change; destroy it", c->cfg.name,
                tpf_status_name(c->failed));
  TPF_RETURN_IF(tpf__dtype_quantized(c->cfg.dtype), TPF_EUNSUPPORTED,
                "'%s' is quantized (%s) and stays at its capacity shape [%llu, %llu]", c->cfg.name,
                tpf_dtype_name(c->cfg.dtype), (unsigned long long)c->cfg.capacity.rows,
                (unsigned long long)c->cfg.capacity.cols);
  TPF_RETURN_IF(c->cfg.external, TPF_EUNSUPPORTED,
                "'%s' is external and stays at its capacity shape [%llu, %llu]", c->cfg.name,
                (unsigned long long)c->cfg.capacity.rows, (unsigned long long)c->cfg.capacity.cols);
  tpf_layout_desc d = tpf__comm_desc(c, active);
  tpf_status rc = tpf__layout_check_align(&d, c->be->ops->align_bytes);
  if (rc != TPF_OK) return named(c, rc);
  return tpf_layout_active_bytes(&d, active_bytes);
}

tpf_status tpf__comm_apply_shape(tpf_comm *c, tpf_shape active, uint64_t active_bytes) {
  TPF_CHECK(tpf__be_reg_activate(c->be, c->reg, active_bytes));
  c->active = active;
  c->epoch++;
  return TPF_OK;
}

tpf_status tpf_comm_set_active_shape(tpf_comm *c, tpf_shape active) {
  uint64_t bytes = 0;
  TPF_CHECK(tpf__comm_check_shape(c, active, &bytes));
  return tpf__comm_apply_shape(c, active, bytes);
}

tpf_shape tpf_comm_active_shape(const tpf_comm *c) {
  tpf_shape none = {0, 0};
  return c ? c->active : none;
}

tpf_shape tpf_comm_capacity_shape(const tpf_comm *c) {
  tpf_shape none = {0, 0};
  return c ? c->cfg.capacity : none;
}

uint64_t tpf_comm_epoch(const tpf_comm *c) {
  return c ? c->epoch : 0;
}

const tpf_comm_config *tpf_comm_config_of(const tpf_comm *c) {
  return c ? &c->cfg : NULL;
}

static tpf_matrix view(const tpf_comm *c, uint64_t off, uint64_t rows) {
  tpf_matrix m;
  m.ptr = (char *)c->base + off;
  m.rows = rows;
  m.cols = c->cfg.capacity.cols;
  m.ld = c->cfg.capacity.cols;
  m.dtype = c->cfg.dtype;
  return m;
}

tpf_status tpf_comm_buffer(tpf_comm *c, tpf_matrix *full) {
  TPF_RETURN_IF(!c || !full, TPF_EINVAL, "tpf_comm_buffer: NULL argument");
  uint64_t rows = c->active.rows;
  if (c->cfg.algo == TPF_ALGO_RING && c->cfg.coll == TPF_COLL_RS) {
    uint64_t p = (uint64_t)c->be->tp_size;
    rows = (2 * p - 1) * (c->active.rows / p); /* validated: no overflow below capacity */
  }
  *full = view(c, 0, rows);
  return TPF_OK;
}

tpf_status tpf_comm_local_chunk(tpf_comm *c, tpf_matrix *local) {
  TPF_RETURN_IF(!c || !local, TPF_EINVAL, "tpf_comm_local_chunk: NULL argument");
  tpf_layout_desc d = tpf__comm_desc(c, c->active);
  tpf_region r;
  TPF_CHECK(tpf_layout_local(&d, &r));
  *local = view(c, r.offset_bytes, r.rows);
  return TPF_OK;
}

tpf_status tpf_comm_registration(tpf_comm *c, void **base, uint64_t *bytes) {
  TPF_RETURN_IF(!c || !base || !bytes, TPF_EINVAL, "tpf_comm_registration: NULL argument");
  *base = c->base;
  *bytes = c->reg_bytes;
  return TPF_OK;
}

/* ---- Operations ---- */

static bool gemm_dtype(tpf_dtype t) {
  return t == TPF_BF16 || t == TPF_FP16 || t == TPF_FP32;
}

/* Checks one operand: present, sane, of the expected shape and an allowed dtype. */
static tpf_status check_matrix(const tpf_comm *c, const char *what, const tpf_matrix *m,
                               uint64_t rows, uint64_t cols, tpf_dtype want, bool fp32_ok) {
  const char *n = c->cfg.name;
  TPF_RETURN_IF(!m, TPF_EINVAL, "'%s': %s is NULL", n, what);
  TPF_RETURN_IF(!m->ptr, TPF_EINVAL, "'%s': %s has a NULL data pointer", n, what);
  TPF_RETURN_IF((unsigned)m->dtype >= TPF_DTYPE_COUNT, TPF_EINVAL,
                "'%s': %s dtype %d is not a tpf_dtype", n, what, (int)m->dtype);
  TPF_RETURN_IF(m->rows != rows || m->cols != cols, TPF_ESHAPE,
                "'%s': %s is [%llu, %llu], expected [%llu, %llu] for active rows %llu", n, what,
                (unsigned long long)m->rows, (unsigned long long)m->cols, (unsigned long long)rows,
                (unsigned long long)cols, (unsigned long long)c->active.rows);
  TPF_RETURN_IF(m->ld < m->cols, TPF_ESHAPE, "'%s': %s has ld %llu < cols %llu", n, what,
                (unsigned long long)m->ld, (unsigned long long)m->cols);
  TPF_RETURN_IF(m->dtype != want && !(fp32_ok && m->dtype == TPF_FP32), TPF_EINVAL,
                "'%s': %s dtype %s, expected %s%s", n, what, tpf_dtype_name(m->dtype),
                tpf_dtype_name(want), fp32_ok ? " or fp32" : "");
  uint64_t span;
  TPF_RETURN_IF(!tpf__mul3_u64(m->rows, m->ld, tpf_dtype_size(m->dtype), &span), TPF_EOVERFLOW,
                "'%s': %s of %llu rows x ld %llu overflows 64 bits", n, what,
                (unsigned long long)m->rows, (unsigned long long)m->ld);
  return TPF_OK;
}

/* True when [p, p+bytes) overlaps the registration. */
static bool aliases(const tpf_comm *c, const tpf_matrix *m) {
  uintptr_t lo = (uintptr_t)m->ptr;
  uintptr_t hi = lo + (uintptr_t)(m->rows * m->ld * tpf_dtype_size(m->dtype));
  uintptr_t blo = (uintptr_t)c->base;
  uintptr_t bhi = blo + (uintptr_t)c->reg_bytes;
  return lo < bhi && blo < hi;
}

static tpf_status check_op(const tpf_comm *c, const char *op, bool ok_kind, const char *want) {
  TPF_RETURN_IF(!c, TPF_EINVAL, "%s: communicator is NULL", op);
  TPF_RETURN_IF_ABORTED(c);
  TPF_RETURN_IF(c->failed != TPF_OK, TPF_ESTATE,
                "'%s' failed earlier (%s); destroy it and create a new one", c->cfg.name,
                tpf_status_name(c->failed));
  TPF_RETURN_IF(!ok_kind, TPF_EUNSUPPORTED, "%s needs a %s communicator; '%s' is %s %s", op, want,
                c->cfg.name, tpf_algo_name(c->cfg.algo), tpf_coll_name(c->cfg.coll));
  TPF_RETURN_IF(!gemm_dtype(c->cfg.dtype), TPF_EUNSUPPORTED,
                "'%s': operations on quantized (%s) buffers are not implemented", c->cfg.name,
                tpf_dtype_name(c->cfg.dtype));
  return TPF_OK;
}

/* Builds the schedule for the current active shape into the communicator's storage (no
 * allocation) and runs it on the backend. The backend is done with the steps when execute
 * returns: synchronous backends have run them, asynchronous ones have enqueued them. */
static tpf_status run_op(tpf_comm *c, const tpf_gemm_dims *g, const tpf_matrix *x,
                         const tpf_matrix *w, const tpf_matrix *d, void *stream) {
  tpf_layout_desc desc = tpf__comm_desc(c, c->active);
  tpf_schedule s;
  comm_full *f = full_of(c);
  tpf_status rc = TPF_OK;
  /* Adaptive: the split count (and aggregate) the planner chose for this T and GEMM size. It
   * depends only on the configuration, the agreed shape and the GEMM dims: every rank chooses
   * the same, and the handshake would still catch a rank that did not. */
  if (c->planner && desc.algo != TPF_ALGO_BULK) rc = tpf__planner_apply(c->planner, &desc, g);
  if (rc != TPF_OK) return named(c, rc);
  rc = tpf__schedule_build_into(&desc, g, f->steps, f->max_steps, &s);
  if (rc != TPF_OK) return named(c, rc);
  tpf_exec_args a;
  memset(&a, 0, sizeof a);
  a.sched = &s;
  a.comm_name = c->cfg.name;
  a.seq = c->seq + 1;
  if (x) a.x = *x;
  if (w) a.w = *w;
  if (d) a.d = *d;
  rc = tpf__be_execute(c->be, c->reg, &a, stream);
  /* Refused before the handshake (e.g. a stream under CUDA-graph capture): nothing was enqueued
   * and no peer saw this sequence number, so the communicator stays as it was. */
  if (rc == TPF_EUNSUPPORTED) return rc;
  /* Every rank consumed this sequence number once the backend ran the handshake; a mismatch is
   * detected there, before any byte moves, so the group stays in step and usable. Anything else
   * may have left partial data behind: refuse to continue. */
  c->seq = a.seq;
  if (rc != TPF_OK && rc != TPF_EMISMATCH) c->failed = rc;
  c->ops++;
  return rc;
}

tpf_status tpf_ag_gemm(tpf_comm *c, const tpf_matrix *w, tpf_matrix *d, void *stream) {
  TPF_CHECK(check_op(c, "tpf_ag_gemm",
                     c && c->cfg.algo == TPF_ALGO_RING && c->cfg.coll == TPF_COLL_AG, "ring ag"));
  const uint64_t T = c->active.rows, H = c->cfg.capacity.cols;
  TPF_CHECK(check_matrix(c, "weight w", w, w ? w->rows : 0, H, c->cfg.dtype, false));
  TPF_RETURN_IF(w->rows == 0, TPF_ESHAPE, "'%s': weight w has 0 rows", c->cfg.name);
  TPF_CHECK(check_matrix(c, "output d", d, T, w->rows, c->cfg.dtype, true));
  TPF_RETURN_IF(aliases(c, w) || aliases(c, d), TPF_EINVAL,
                "'%s': w or d overlaps the registered buffer", c->cfg.name);
  tpf_gemm_dims g = {T, w->rows, H};
  return run_op(c, &g, NULL, w, d, stream);
}

tpf_status tpf_gemm_rs(tpf_comm *c, const tpf_matrix *x, const tpf_matrix *w, tpf_matrix *out,
                       void *stream) {
  TPF_CHECK(check_op(c, "tpf_gemm_rs",
                     c && c->cfg.coll == TPF_COLL_RS &&
                         (c->cfg.algo == TPF_ALGO_RING || c->cfg.algo == TPF_ALGO_PIPELINE),
                     "ring rs or pipeline rs"));
  const uint64_t T = c->active.rows, H = c->cfg.capacity.cols;
  const uint64_t P = (uint64_t)c->be->tp_size;
  TPF_CHECK(check_matrix(c, "input x", x, T, x ? x->cols : 0, c->cfg.dtype, false));
  TPF_RETURN_IF(x->cols == 0, TPF_ESHAPE, "'%s': input x has 0 columns", c->cfg.name);
  TPF_CHECK(check_matrix(c, "weight w", w, H, x->cols, c->cfg.dtype, false));
  TPF_CHECK(check_matrix(c, "output out", out, T / P, H, c->cfg.dtype, true));
  TPF_RETURN_IF(aliases(c, x) || aliases(c, w) || aliases(c, out), TPF_EINVAL,
                "'%s': x, w or out overlaps the registered buffer", c->cfg.name);
  tpf_gemm_dims g = {T, H, x->cols};
  return run_op(c, &g, x, w, out, stream);
}

tpf_status tpf_bulk_overlap(tpf_comm *c, const tpf_matrix *a, const tpf_matrix *b, tpf_matrix *d,
                            void *stream) {
  TPF_CHECK(check_op(c, "tpf_bulk_overlap", c && c->cfg.algo == TPF_ALGO_BULK, "bulk"));
  TPF_RETURN_IF(!a || !b, TPF_EINVAL, "'%s': a or b is NULL", c->cfg.name);
  TPF_RETURN_IF(!gemm_dtype(a->dtype), TPF_EINVAL, "'%s': a dtype %s is not bf16, fp16 or fp32",
                c->cfg.name, tpf_dtype_name(a->dtype));
  TPF_CHECK(check_matrix(c, "a", a, a->rows, a->cols, a->dtype, false));
  TPF_RETURN_IF(a->rows == 0 || a->cols == 0, TPF_ESHAPE, "'%s': a is [%llu, %llu]", c->cfg.name,
                (unsigned long long)a->rows, (unsigned long long)a->cols);
  TPF_CHECK(check_matrix(c, "b", b, b->rows, a->cols, a->dtype, false));
  TPF_RETURN_IF(b->rows == 0, TPF_ESHAPE, "'%s': b has 0 rows", c->cfg.name);
  TPF_CHECK(check_matrix(c, "d", d, a->rows, b->rows, a->dtype, true));
  TPF_RETURN_IF(aliases(c, a) || aliases(c, b) || aliases(c, d), TPF_EINVAL,
                "'%s': a, b or d overlaps the registered buffer", c->cfg.name);
  tpf_gemm_dims g = {a->rows, b->rows, a->cols};
  return run_op(c, &g, a, b, d, stream);
}

/* ---- Completion and errors (issue 11 item 2) ---- */

/* The deferred status of what was enqueued: the failure that left the communicator failed, else
 * what the backend holds for this registration (optional op). Never waits. */
static tpf_status deferred(tpf_comm *c) {
  if (c->failed != TPF_OK) return c->failed;
  tpf_status st = TPF_OK;
  if (c->be->ops->reg_async_error) {
    tpf_status rc = c->be->ops->reg_async_error(c->be, c->reg, &st);
    if (rc != TPF_OK) return rc;
  }
  return st;
}

tpf_status tpf_comm_sync(tpf_comm *c) {
  TPF_RETURN_IF(!c, TPF_EINVAL, "tpf_comm_sync: communicator is NULL");
  TPF_RETURN_IF_ABORTED(c);
  tpf_status rc =
      c->be->ops->reg_sync ? c->be->ops->reg_sync(c->be, c->reg) : tpf__be_sync(c->be, NULL);
  if (rc != TPF_OK) {
    if (c->failed == TPF_OK && rc != TPF_EMISMATCH) c->failed = rc;
    return named(c, rc);
  }
  TPF_RETURN_IF(c->failed != TPF_OK, c->failed,
                "'%s': an enqueued operation failed earlier (%s); destroy the communicator",
                c->cfg.name, tpf_status_name(c->failed));
  return TPF_OK;
}

tpf_status tpf_comm_async_error(tpf_comm *c, tpf_status *out) {
  TPF_RETURN_IF(!c || !out, TPF_EINVAL, "tpf_comm_async_error: NULL argument");
  TPF_RETURN_IF_ABORTED(c);
  tpf_status st = deferred(c);
  *out = st;
  return TPF_OK;
}

tpf_status tpf_comm_abort(tpf_comm *c) {
  TPF_RETURN_IF(!c, TPF_EINVAL, "tpf_comm_abort: communicator is NULL");
  /* Only an atomic store and the backend's thread-safe abort: callable from any thread while the
   * rank's own thread is blocked in an operation on c. */
  atomic_store(&full_of(c)->aborted, 1);
  if (c->be->ops->reg_abort) return c->be->ops->reg_abort(c->be, c->reg);
  return TPF_OK;
}

tpf_status tpf_comm_plan_info(const tpf_comm *c, tpf_plan_result *out) {
  TPF_RETURN_IF(!c || !out, TPF_EINVAL, "tpf_comm_plan_info: communicator or out is NULL");
  TPF_RETURN_IF(!c->planner, TPF_EUNSUPPORTED,
                "'%s' plans nothing: it was created with TPF_PLAN_FIXED (splits %d)", c->cfg.name,
                c->cfg.num_splits);
  return tpf__planner_last(c->planner, out);
}
