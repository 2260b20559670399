/* The three operations: their operand tail (one for all three), the schedule cache and the
 * hand-off to the backend. The lifecycle of a communicator is comm.c's; the shape and dtype
 * rules of the operands are core/operands.c's (tpf_check_operands, also run by the Python
 * binding).
 *
 * Method: an operation checks the communicator (live, not aborted or failed, of the right kind)
 * and its options, then its operands in one tail shared by the three (NULL operands, the
 * rulebook, the backend's fp8 capability, then every address rule: nothing in the registration,
 * the output disjoint from every input, bias and scales), builds or reuses this rank's schedule
 * for the active shape and hands it to the backend with the next sequence number.
 */
#include "comm_internal.h"
#include "stats.h"

#include <math.h>
#include <stddef.h>
#include <string.h>

static tpf_status leave(tpf_comm *c, tpf_status rc) {
  tpf__comm_leave(c);
  return rc;
}

/* True when [p, p+bytes) overlaps the registration. */
static bool aliases(const tpf_comm *c, const tpf_matrix *m) {
  uintptr_t lo = (uintptr_t)m->ptr;
  uintptr_t hi = lo + (uintptr_t)(m->rows * m->ld * tpf_dtype_size(m->dtype));
  uintptr_t blo = (uintptr_t)c->base;
  uintptr_t bhi = blo + (uintptr_t)c->reg_bytes;
  return lo < bhi && blo < hi;
}

/* ---- Operands overlapping each other ---- */

/* One operand's byte extent [lo, hi): from its first element to one past its last, i.e.
 * ((rows - 1) * ld + cols) elements of its dtype (check_matrix has bounded rows * ld * e). */
typedef struct {
  const char *what;
  uint64_t lo, hi;
} extent;

static extent matrix_extent(const char *what, const tpf_matrix *m) {
  extent e = {what, (uint64_t)(uintptr_t)m->ptr, 0};
  const uint64_t n = ((m->rows ? m->rows - 1 : 0) * m->ld + m->cols) * tpf_dtype_size(m->dtype);
  e.hi = e.lo > UINT64_MAX - n ? UINT64_MAX : e.lo + n;
  return e;
}

/* bias: n elements of D's dtype (NULL: an empty extent, which overlaps nothing). */
static extent bias_extent(const void *bias, uint64_t n, tpf_dtype t) {
  extent e = {"bias", (uint64_t)(uintptr_t)bias, (uint64_t)(uintptr_t)bias};
  uint64_t bytes = 0;
  if (bias && tpf__mul_u64(n, tpf_dtype_size(t), &bytes))
    e.hi = e.lo > UINT64_MAX - bytes ? UINT64_MAX : e.lo + bytes;
  return e;
}

/* The output must share no byte with any other operand: a GEMM that reads W, A or the bias
 * while it writes D over them computes from half-written data (errors of 300 to 4e5
 * came back as TPF_OK). Inputs may overlap each other (both are only read, e.g. bulk a == b for
 * a Gram matrix); D's own read with beta != 0 is the same operand. */
static tpf_status check_disjoint(const tpf_comm *c, const char *op, const extent *out,
                                 const extent *in, int n) {
  for (int i = 0; i < n; i++) {
    const extent *e = &in[i];
    if (e->lo == e->hi) continue;
    TPF_RETURN_IF(e->lo < out->hi && out->lo < e->hi, TPF_EINVAL,
                  "'%s' %s: operands overlap: %s [0x%llx, 0x%llx) and %s [0x%llx, 0x%llx) share "
                  "bytes; the output must not overlap any input",
                  c->cfg.name, op, out->what, (unsigned long long)out->lo,
                  (unsigned long long)out->hi, e->what, (unsigned long long)e->lo,
                  (unsigned long long)e->hi);
  }
  return TPF_OK;
}

/* The bias is read while the collective writes the registration: it must lie outside it. */
static bool bias_aliases(const tpf_comm *c, const extent *b) {
  const uint64_t blo = (uint64_t)(uintptr_t)c->base, bhi = blo + c->reg_bytes;
  return b->lo != b->hi && b->lo < bhi && blo < b->hi;
}

/* An fp8 scale: one float (NULL: an empty extent). */
static extent scale_extent(const char *what, const float *p) {
  extent e = {what, (uint64_t)(uintptr_t)p, (uint64_t)(uintptr_t)p};
  if (p) e.hi = e.lo > UINT64_MAX - sizeof *p ? UINT64_MAX : e.lo + sizeof *p;
  return e;
}

/* The fp8 scales are inputs like the others (SPEC §4): every GEMM of the operation reads them,
 * so a scale inside the output or the registration is read while it is being written (it came
 * back TPF_OK with wrong results). Checked after the bias, in the same two rules: the output
 * first, then the registration. */
static tpf_status check_scale_overlap(const tpf_comm *c, const char *op, const extent *out,
                                      const tpf_op_options *o) {
  const extent s[] = {scale_extent("a_scale_inv", o->a_scale_inv),
                      scale_extent("w_scale_inv", o->w_scale_inv)};
  TPF_CHECK(check_disjoint(c, op, out, s, 2));
  for (int i = 0; i < 2; i++)
    TPF_RETURN_IF(bias_aliases(c, &s[i]), TPF_EINVAL,
                  "'%s' %s: %s [0x%llx, 0x%llx) overlaps the registered buffer [0x%llx, "
                  "0x%llx), which the collective writes while the GEMMs read the scale; keep "
                  "scales in memory of their own",
                  c->cfg.name, op, s[i].what, (unsigned long long)s[i].lo,
                  (unsigned long long)s[i].hi, (unsigned long long)(uintptr_t)c->base,
                  (unsigned long long)((uintptr_t)c->base + c->reg_bytes));
  return TPF_OK;
}

static tpf_status check_op(const tpf_comm *c, const char *op, bool ok_kind, const char *want) {
  TPF_CHECK_COMM(c, op);
  TPF_RETURN_IF_ABORTED(c);
  TPF_RETURN_IF(c->failed != TPF_OK, TPF_ESTATE,
                "'%s' failed earlier (%s); destroy it and create a new one", c->cfg.name,
                tpf_status_name(c->failed));
  TPF_RETURN_IF(!ok_kind, TPF_EUNSUPPORTED, "%s needs a %s communicator; '%s' is %s %s", op, want,
                c->cfg.name, tpf_algo_name(c->cfg.algo), tpf_coll_name(c->cfg.coll));
  TPF_RETURN_IF(tpf__fp8_dtype(c->cfg.dtype) && c->cfg.coll == TPF_COLL_RS, TPF_EUNSUPPORTED,
                "'%s': %s on an %s RS buffer: it would hold the partial sums in fp8; register "
                "the RS site in bf16, fp16 or fp32 (fp8 x and w are taken there, SPEC §11)",
                c->cfg.name, op, tpf_dtype_name(c->cfg.dtype));
  return TPF_OK;
}

/* ---- Per-operation options ---- */

/* The caller's options as this library's struct (NULL: the defaults), checked. */
static tpf_status op_options(const tpf_comm *c, const char *op, const tpf_op_options *in,
                             tpf_op_options *o) {
  const tpf_op_options def = TPF_OP_OPTIONS_INIT;
  *o = def;
  if (!in) return TPF_OK;
  const char *n = c->cfg.name;
  static const size_t released[] = {offsetof(tpf_op_options, a_scale_inv), /* 0.2 */
                                    sizeof(tpf_op_options)}; /* + fp8 scales; see check_config */
  if (tpf__check_struct_size(op, "options", "tpf_op_options", in->size, released,
                             TPF_ARRAY_SIZE(released)) != TPF_OK)
    return tpf_prefix_error(TPF_EINVAL, "'%s' ", n);
  memcpy(o, in, in->size ? in->size : sizeof *o);
  o->size = sizeof *o;
  TPF_RETURN_IF(!isfinite(o->alpha) || !isfinite(o->beta), TPF_EINVAL,
                "'%s' %s: alpha %g and beta %g must be finite", n, op, (double)o->alpha,
                (double)o->beta);
  TPF_RETURN_IF(o->num_splits < 0 || o->num_splits > TPF_MAX_SPLITS, TPF_EINVAL,
                "'%s' %s: num_splits %d outside 0..%d", n, op, o->num_splits, TPF_MAX_SPLITS);
  return TPF_OK;
}

static bool has_epilogue(const tpf_op_options *o) {
  return o->alpha != 1.0f || o->beta != 0.0f || o->bias != NULL || o->gelu;
}

/* The layout of this operation: the communicator's, with the operation's split count when it
 * names one (RING AG: P/2 is the aggregate variant, P and 1 the plain ring), checked against
 * the active shape with the backend's alignment. */
static tpf_status op_desc(const tpf_comm *c, const tpf_op_options *o, tpf_layout_desc *d) {
  *d = tpf__comm_desc(c, c->active);
  TPF_RETURN_IF((o->trans_a || o->trans_w || has_epilogue(o)) &&
                    !(tpf__be_caps(c->be) & TPF_BE_CAP_OPTIONS),
                TPF_EUNSUPPORTED,
                "'%s': backend '%s' (ABI %d) does not implement transposes or epilogues "
                "(TPF_BE_CAP_OPTIONS); only num_splits may be set",
                c->cfg.name, c->be->ops->name ? c->be->ops->name : "?", c->be->ops->abi_version);
  if (o->num_splits == 0) return TPF_OK;
  TPF_RETURN_IF(d->algo == TPF_ALGO_BULK, TPF_EUNSUPPORTED,
                "'%s': a bulk operation has no splits (num_splits %d given; use 0)", c->cfg.name,
                o->num_splits);
  d->num_splits = o->num_splits;
  if (d->algo == TPF_ALGO_RING && d->coll == TPF_COLL_AG) {
    const int P = d->tp_size;
    d->aggregate = P > 2 && P % 2 == 0 && o->num_splits == P / 2;
  }
  tpf_status rc = tpf__layout_check_align(d, c->be->ops->align_bytes);
  if (rc == TPF_OK) return TPF_OK;
  return tpf_prefix_error(rc,
                          "'%s': num_splits %d is not legal for active rows %llu: ", c->cfg.name,
                          o->num_splits, (unsigned long long)c->active.rows);
}

/* Operand resolution, done once here so a backend only maps steps: a GEMM
 * operand of a stored-transposed user matrix names the stored element where its block starts
 * and carries the flag; the steps that write D carry the epilogue flag. */
static void apply_options(tpf_schedule *s, const tpf_op_options *o) {
  const bool epi = has_epilogue(o);
  for (int i = 0; i < s->nsteps; i++) {
    tpf_step *st = &s->steps[i];
    if (st->kind == TPF_STEP_GEMM) {
      if (o->trans_a && st->a.id == TPF_MAT_X) {
        uint64_t t = st->a.row;
        st->a.row = st->a.col;
        st->a.col = t;
        st->flags |= TPF_STEP_TRANS_A;
      }
      if (o->trans_w && st->w.id == TPF_MAT_W) {
        uint64_t t = st->w.row;
        st->w.row = st->w.col;
        st->w.col = t;
        st->flags |= TPF_STEP_TRANS_W;
      }
    }
    if (epi && st->d.id == TPF_MAT_D &&
        (st->kind == TPF_STEP_GEMM || st->kind == TPF_STEP_REDUCE ||
         st->kind == TPF_STEP_PEER_REDUCE))
      st->flags |= TPF_STEP_EPILOGUE;
  }
}

/* The schedule of this operation: the cached one of its key, or built into the storage of the
 * entry it replaces (no allocation either way). */
static tpf_status cached_schedule(tpf_comm *c, comm_full *f, const tpf_layout_desc *desc,
                                  const tpf_gemm_dims *g, const tpf_op_options *o,
                                  const tpf_schedule **out) {
  sched_key key;
  memset(&key, 0, sizeof key);
  key.rows = desc->active.rows;
  key.m = g->m;
  key.n = g->n;
  key.k = g->k;
  key.num_splits = desc->num_splits;
  key.aggregate = desc->aggregate ? 1 : 0;
  key.flags = (o->trans_a ? 1u : 0u) | (o->trans_w ? 2u : 0u) | (has_epilogue(o) ? 4u : 0u);
  key.valid = 1;
  if (!f->cache_off)
    for (int i = 0; i < TPF_SCHED_CACHE; i++)
      if (memcmp(&f->cache[i].key, &key, sizeof key) == 0) {
        f->stats.hits++;
        *out = &f->cache[i].sched;
        return TPF_OK;
      }
  f->stats.misses++;
  const int slot = f->next_slot;
  sched_entry *e = &f->cache[slot];
  e->key.valid = 0; /* a failed build leaves the entry empty */
  tpf_status rc = tpf__schedule_build_into(desc, g, f->steps + (size_t)slot * (size_t)f->max_steps,
                                           f->max_steps, &e->sched);
  if (rc != TPF_OK) return tpf__comm_named(c, rc);
  apply_options(&e->sched, o);
  e->key = key;
  f->next_slot = (slot + 1) % TPF_SCHED_CACHE;
  *out = &e->sched;
  return TPF_OK;
}

void tpf__comm_set_schedule_cache(tpf_comm *c, bool on) {
  comm_full *f = tpf__comm_full(c);
  f->cache_off = !on;
  for (int i = 0; i < TPF_SCHED_CACHE; i++)
    f->cache[i].key.valid = 0;
}

tpf_comm_cache_stats tpf__comm_cache_stats(const tpf_comm *c) {
  return tpf__comm_full(c)->stats;
}

/* Builds (or reuses) the schedule for the current active shape in the communicator's storage
 * (no allocation) and runs it on the backend. The backend is done with the steps when execute
 * returns: synchronous backends have run them, asynchronous ones have enqueued them. */
static tpf_status run_op(tpf_comm *c, const tpf_gemm_dims *g, const tpf_matrix *x,
                         const tpf_matrix *w, const tpf_matrix *d, const tpf_op_options *o,
                         void *stream) {
  tpf_layout_desc desc;
  TPF_CHECK(op_desc(c, o, &desc));
  comm_full *f = tpf__comm_full(c);
  tpf_status rc = TPF_OK;
  /* Adaptive: the split count (and aggregate) the planner chose for this T, GEMM size and x
   * dtype (an fp8 gemm_rs prices fp8 GEMMs). It depends only on the configuration, the agreed
   * shape, the GEMM dims and x's dtype: every rank chooses the same, and the handshake would
   * still catch a rank that did not. An operation that names its split count is not planned. (The
   * planner caches its own choice; it is asked every time so that tpf_comm_plan_info reports the
   * last operation's.) */
  if (c->planner && desc.algo != TPF_ALGO_BULK && o->num_splits == 0)
    rc = tpf__planner_apply(c->planner, &desc, g, x ? x->dtype : desc.dtype);
  if (rc != TPF_OK) return tpf__comm_named(c, rc);
  const tpf_schedule *sched = NULL;
  TPF_CHECK(cached_schedule(c, f, &desc, g, o, &sched));
  tpf_exec_args a;
  memset(&a, 0, sizeof a);
  a.sched = sched;
  a.comm_name = c->cfg.name;
  a.seq = c->seq + 1;
  if (x) a.x = *x;
  if (w) a.w = *w;
  if (d) a.d = *d;
  a.epi.alpha = o->alpha;
  a.epi.beta = o->beta;
  a.epi.bias = o->bias;
  a.epi.gelu = o->gelu;
  a.a_scale_inv = o->a_scale_inv;
  a.w_scale_inv = o->w_scale_inv;
  bool claimed = false;
  TPF_CHECK(tpf__be_claim(c->be, NULL, c->cfg.name, &claimed));
  rc = tpf__be_execute(c->be, c->reg, c->reg_bytes, &a, stream);
  if (claimed) tpf__be_release(c->be);
  /* Refused before the handshake (e.g. a stream under CUDA-graph capture): nothing was enqueued
   * and no peer saw this sequence number, so the communicator stays as it was. */
  if (rc == TPF_EUNSUPPORTED) return rc;
  /* Every rank consumed this sequence number once the backend ran the handshake; a mismatch is
   * detected there, before any byte moves, so the group stays in step and usable. Anything else
   * may have left partial data behind: refuse to continue. */
  c->seq = a.seq;
  if (rc != TPF_OK && rc != TPF_EMISMATCH) tpf__comm_mark_failed(c, rc);
  c->ops++;
  if (rc == TPF_OK) tpf__stats_op(&c->telemetry, sched, c->cfg.capacity.rows); /* accepted */
  return rc;
}

/* ---- The operand tail ---- */

/* One operation's operands by role (a: the activation, NULL for ag_gemm; w: the weight; d: the
 * output) with the names its messages use. */
typedef struct {
  tpf_op_kind kind;
  const char *op; /* "tpf_ag_gemm", ... */
  const tpf_matrix *a, *w;
  tpf_matrix *d;
  const char *an, *wn, *dn;
} operands;

static tpf_status null_operand(const tpf_comm *c, const char *what, const tpf_matrix *m) {
  TPF_RETURN_IF(!m, TPF_EINVAL, "'%s': %s is NULL", c->cfg.name, what);
  TPF_RETURN_IF(!m->ptr, TPF_EINVAL, "'%s': %s has a NULL data pointer", c->cfg.name, what);
  return TPF_OK;
}

/* Everything the three operations check of their operands, in one order: presence, the
 * rulebook (tpf_check_operands, prefixed with the communicator and the operation), the
 * backend's fp8 GEMMs, then the addresses: no operand in the registration, the output disjoint
 * from the inputs, the bias and the scales (SPEC §4). Yields the GEMM's dims. */
static tpf_status operand_tail(const tpf_comm *c, const operands *p, const tpf_op_options *o,
                               tpf_gemm_dims *g) {
  if (p->a)
    TPF_CHECK(null_operand(c, p->an, p->a));
  else
    TPF_RETURN_IF(p->kind != TPF_OP_AG_GEMM, TPF_EINVAL, "'%s': %s is NULL", c->cfg.name, p->an);
  TPF_CHECK(null_operand(c, p->wn, p->w));
  TPF_CHECK(null_operand(c, p->dn, p->d));
  const tpf_operands r = {.size = sizeof r,
                          .op = p->kind,
                          .buffer_dtype = c->cfg.dtype,
                          .active = c->active,
                          .tp_size = c->be->tp_size,
                          .trans_a = o->trans_a,
                          .trans_w = o->trans_w,
                          .a_scale = o->a_scale_inv != NULL,
                          .w_scale = o->w_scale_inv != NULL,
                          .a = p->a,
                          .w = p->w,
                          .d = p->d};
  tpf_shape dshape;
  tpf_status rc = tpf_check_operands(&r, &dshape);
  if (rc != TPF_OK) return tpf_prefix_error(rc, "'%s' %s: ", c->cfg.name, p->op);
  const tpf_dtype at = p->a ? p->a->dtype : c->cfg.dtype;
  TPF_RETURN_IF((tpf__fp8_dtype(at) || tpf__fp8_dtype(p->w->dtype)) &&
                    !(tpf__be_caps(c->be) & TPF_BE_CAP_FP8),
                TPF_EUNSUPPORTED, "'%s' %s: backend '%s' does not run fp8 GEMMs (TPF_BE_CAP_FP8)",
                c->cfg.name, p->op, c->be->ops->name ? c->be->ops->name : "?");
  const struct {
    const char *what;
    const tpf_matrix *m;
  } all[] = {{p->an, p->a}, {p->wn, p->w}, {p->dn, p->d}};
  for (int i = 0; i < 3; i++)
    TPF_RETURN_IF(all[i].m && aliases(c, all[i].m), TPF_EINVAL,
                  "'%s' %s: %s overlaps the registered buffer", c->cfg.name, p->op, all[i].what);
  const extent dx = matrix_extent(p->dn, p->d);
  const extent bias = bias_extent(o->bias, dshape.cols, p->d->dtype);
  const extent none = {p->an, 0, 0}; /* ag_gemm: no activation operand (empty: skipped) */
  const extent ins[] = {p->a ? matrix_extent(p->an, p->a) : none, matrix_extent(p->wn, p->w), bias};
  TPF_CHECK(check_disjoint(c, p->op, &dx, ins, 3));
  TPF_RETURN_IF(bias_aliases(c, &bias), TPF_EINVAL, "'%s': bias overlaps the registered buffer",
                c->cfg.name);
  TPF_CHECK(check_scale_overlap(c, p->op, &dx, o));
  /* [M, N] = D's shape; K from the activation (ag_gemm: the buffer's H). */
  g->m = dshape.rows;
  g->n = dshape.cols;
  g->k = !p->a ? c->cfg.capacity.cols : o->trans_a ? p->a->rows : p->a->cols;
  if (p->kind == TPF_OP_GEMM_RS) g->m = c->active.rows; /* the GEMM covers all T rows */
  return TPF_OK;
}

/* The body every operation shares: the communicator of the right kind, its options, its
 * operands, the run. */
static tpf_status op_body(tpf_comm *c, const operands *p, bool ok_kind, const char *want,
                          const tpf_op_options *opt, void *stream) {
  TPF_CHECK(check_op(c, p->op, ok_kind, want));
  tpf_op_options o;
  TPF_CHECK(op_options(c, p->op, opt, &o));
  tpf_gemm_dims g;
  TPF_CHECK(operand_tail(c, p, &o, &g));
  return run_op(c, &g, p->a, p->w, p->d, &o, stream);
}

tpf_status tpf_ag_gemm_ex(tpf_comm *c, const tpf_matrix *w, tpf_matrix *d,
                          const tpf_op_options *opt, void *stream) {
  TPF_CHECK_COMM(c, "tpf_ag_gemm");
  TPF_CHECK(tpf__comm_enter(c, "tpf_ag_gemm"));
  const operands p = {TPF_OP_AG_GEMM, "tpf_ag_gemm", NULL,      w, d,
                      "the buffer",   "weight w",    "output d"};
  const bool kind = c->cfg.algo == TPF_ALGO_RING && c->cfg.coll == TPF_COLL_AG;
  return leave(c, op_body(c, &p, kind, "ring ag", opt, stream));
}

tpf_status tpf_gemm_rs_ex(tpf_comm *c, const tpf_matrix *x, const tpf_matrix *w, tpf_matrix *out,
                          const tpf_op_options *opt, void *stream) {
  TPF_CHECK_COMM(c, "tpf_gemm_rs");
  TPF_CHECK(tpf__comm_enter(c, "tpf_gemm_rs"));
  const operands p = {TPF_OP_GEMM_RS, "tpf_gemm_rs", x,           w, out,
                      "input x",      "weight w",    "output out"};
  const bool kind = c->cfg.coll == TPF_COLL_RS &&
                    (c->cfg.algo == TPF_ALGO_RING || c->cfg.algo == TPF_ALGO_PIPELINE);
  return leave(c, op_body(c, &p, kind, "ring rs or pipeline rs", opt, stream));
}

tpf_status tpf_bulk_overlap_ex(tpf_comm *c, const tpf_matrix *a, const tpf_matrix *b, tpf_matrix *d,
                               const tpf_op_options *opt, void *stream) {
  TPF_CHECK_COMM(c, "tpf_bulk_overlap");
  TPF_CHECK(tpf__comm_enter(c, "tpf_bulk_overlap"));
  const operands p = {TPF_OP_BULK, "tpf_bulk_overlap", a, b, d, "a", "b", "output d"};
  return leave(c, op_body(c, &p, c->cfg.algo == TPF_ALGO_BULK, "bulk", opt, stream));
}

tpf_status tpf_ag_gemm(tpf_comm *c, const tpf_matrix *w, tpf_matrix *d, void *stream) {
  return tpf_ag_gemm_ex(c, w, d, NULL, stream);
}

tpf_status tpf_gemm_rs(tpf_comm *c, const tpf_matrix *x, const tpf_matrix *w, tpf_matrix *out,
                       void *stream) {
  return tpf_gemm_rs_ex(c, x, w, out, NULL, stream);
}

tpf_status tpf_bulk_overlap(tpf_comm *c, const tpf_matrix *a, const tpf_matrix *b, tpf_matrix *d,
                            void *stream) {
  return tpf_bulk_overlap_ex(c, a, b, d, NULL, stream);
}
