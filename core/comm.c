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
#include "stats.h"

#include "tpflex/tpflex_cost.h"

#include <math.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

/* For the calls that return a value, not a status: false (and the detail set) when c is not a
 * live communicator. */
static bool comm_ok(const tpf_comm *c, const char *call) {
  return tpf__handle_check(c, TPF_HANDLE_COMM, call) == TPF_OK;
}

/* One thread per rank at a time (tpflex.h): an operation, set_active_shape, sync or destroy (and
 * a manager's shape change or destroy, for each of its communicators) marks the communicator
 * busy at entry with an atomic exchange; a second thread arriving meanwhile is refused at once
 * with TPF_ESTATE and changes nothing (on the simulator it used to overwrite the first job in the
 * rank's job slot, and the loser waited forever). The rank as a whole is held with
 * tpf__be_claim (core/backend.c) around each backend call. */
static tpf_status enter(tpf_comm *c, const char *call) {
  TPF_RETURN_IF(atomic_exchange(&tpf__comm_full(c)->busy, 1) != 0, TPF_ESTATE,
                "%s: another thread is inside a call on '%s' for this rank right now; the rule is "
                "one thread per rank at a time (tpflex.h, Threads): serialize the calls",
                call, c->cfg.name);
  return TPF_OK;
}
/* Leaves c failed with status rc, keeping the detail for the messages of later calls (they name
 * the original failure and the way out). */
void tpf__comm_mark_failed(tpf_comm *c, tpf_status rc) {
  c->failed = rc;
  const char *e = tpf_last_error();
  const size_t n = strlen(e) < sizeof c->fail_detail - 1 ? strlen(e) : sizeof c->fail_detail - 1;
  memcpy(c->fail_detail, e, n);
  c->fail_detail[n] = '\0';
}

static tpf_status leave(tpf_comm *c, tpf_status rc) {
  atomic_store(&tpf__comm_full(c)->busy, 0);
  return rc;
}

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

/* Prefixes the current detail with the communicator's name, keeping the status; a detail that
 * already starts with it (a backend that names its registration, as CUDA's reg_sync does) is
 * left as it is, so the name never appears twice (tpf_prefix_error). */
tpf_status tpf__comm_named(const tpf_comm *c, tpf_status s) {
  return tpf_prefix_error(s, "'%s': ", c->cfg.name);
}

static tpf_status check_config(const tpf_comm_config *cfg) {
  TPF_RETURN_IF(!cfg, TPF_EINVAL, "communicator config is NULL");
  /* Released layouts, oldest first: 0.2 (the size field's first release). A field appended later
   * adds the new sizeof here and keeps the old entries. */
  static const size_t released[] = {sizeof(tpf_comm_config)};
  TPF_CHECK(tpf__check_struct_size("tpf_comm_create", "communicator config", "tpf_comm_config",
                                   cfg->size, released, TPF_ARRAY_SIZE(released)));
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

/* The caller's config as this library's struct: fields beyond a smaller (older) size take their
 * defaults (TPF_COMM_CONFIG_INIT). */
static tpf_comm_config normalized(const tpf_comm_config *cfg) {
  tpf_comm_config n = TPF_COMM_CONFIG_INIT;
  size_t size = cfg->size ? cfg->size : sizeof n;
  memcpy(&n, cfg, size);
  n.size = sizeof n;
  return n;
}

/* ---- Configuration agreement ---- */

/* Everything that shapes the bytes, in a fixed layout with no padding, compared field by field
 * in this order so every rank reports the same first difference. */
#define FP_NAME_LEN 256 /* the whole name (at most 255 bytes, check_config) and its NUL */
typedef struct {
  uint64_t magic; /* "tpfcfg04": a rank built from another library version differs here */
  uint64_t cap_rows, cap_cols, name_hash, cost_hash;
  int32_t algo, coll, dtype, num_splits, aggregate, external, plan, name_len;
  /* 1: this rank's call failed a local check; name then holds the start of
   * its detail and every other field is 0. */
  int32_t invalid, reserved;
  char name[FP_NAME_LEN]; /* for the message: names that differ only after their first 63 bytes
                           * used to print as two identical truncated names */
} fingerprint;
#define FP_MAGIC 0x7470666366673034ull

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++)
    h = (h ^ b[i]) * 0x100000001b3ull;
  return h;
}

static void fingerprint_of(const tpf_comm_config *cfg, fingerprint *fp) {
  memset(fp, 0, sizeof *fp);
  fp->magic = FP_MAGIC;
  fp->cap_rows = cfg->capacity.rows;
  fp->cap_cols = cfg->capacity.cols;
  size_t len = strlen(cfg->name);
  fp->name_hash = fnv(0xcbf29ce484222325ull, cfg->name, len);
  fp->cost_hash = cfg->plan == TPF_PLAN_ADAPTIVE ? tpf__cost_table_hash(cfg->cost) : 0;
  fp->algo = (int32_t)cfg->algo;
  fp->coll = (int32_t)cfg->coll;
  fp->dtype = (int32_t)cfg->dtype;
  fp->num_splits = cfg->num_splits;
  fp->aggregate = cfg->aggregate;
  fp->external = cfg->external;
  fp->plan = (int32_t)cfg->plan;
  fp->name_len = (int32_t)len;
  memcpy(fp->name, cfg->name, len < FP_NAME_LEN - 1 ? len : FP_NAME_LEN - 1);
}

static const char *enum_text(const char *field, int32_t v, char *buf, size_t n) {
  if (!strcmp(field, "algo")) return tpf_algo_name((tpf_algo)v);
  if (!strcmp(field, "coll")) return tpf_coll_name((tpf_coll)v);
  if (!strcmp(field, "dtype")) return tpf_dtype_name((tpf_dtype)v);
  if (!strcmp(field, "plan")) return v == TPF_PLAN_ADAPTIVE ? "adaptive" : "fixed";
  if (!strcmp(field, "aggregate") || !strcmp(field, "external")) return v ? "true" : "false";
  snprintf(buf, n, "%d", (int)v);
  return buf;
}

/* Two names that differ, shown from a little before their first differing byte, so that long
 * names sharing a long prefix (TE's site names with a layer prefix) print as two different
 * strings; with both lengths and the byte where they part. */
static tpf_status name_mismatch(const fingerprint *a, const fingerprint *b, int q) {
  size_t i = 0;
  while (i < FP_NAME_LEN - 1 && a->name[i] && a->name[i] == b->name[i])
    i++;
  const size_t from = i > 16 ? i - 16 : 0;
  return tpf_set_error(TPF_EMISMATCH,
                       "configuration differs between ranks: name is '%s%.80s' on rank 0, "
                       "'%s%.80s' on rank %d (%d and %d bytes, first difference at byte %zu); "
                       "communicators must be created in the same order on every rank",
                       from ? "..." : "", a->name + from, from ? "..." : "", b->name + from, q,
                       (int)a->name_len, (int)b->name_len, i);
}

/* A locally invalid rank first (the lowest), so that every rank reports the same; then the
 * first field in which rank q's fingerprint differs from rank 0's, in the fixed order. */
static tpf_status compare_fingerprints(const char *name, const fingerprint *all, int P) {
  for (int q = 0; q < P; q++)
    TPF_RETURN_IF(all[q].magic == FP_MAGIC && all[q].invalid, TPF_EMISMATCH,
                  "'%s' was not created on any rank: rank %d refused its call locally (%.200s)",
                  name, q, all[q].name);
  for (int q = 1; q < P; q++) {
    const fingerprint *a = &all[0], *b = &all[q];
    char va[32], vb[32];
    TPF_RETURN_IF(a->magic != b->magic, TPF_EMISMATCH,
                  "'%s': ranks 0 and %d run different tpflex versions (configuration formats "
                  "differ)",
                  name, q);
    if (a->name_hash != b->name_hash || a->name_len != b->name_len ||
        memcmp(a->name, b->name, FP_NAME_LEN))
      return name_mismatch(a, b, q);
    const struct {
      const char *field;
      int32_t x, y;
    } ints[] = {{"algo", a->algo, b->algo},
                {"coll", a->coll, b->coll},
                {"dtype", a->dtype, b->dtype},
                {"num_splits", a->num_splits, b->num_splits},
                {"aggregate", a->aggregate, b->aggregate},
                {"external", a->external, b->external},
                {"plan", a->plan, b->plan}};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
      if (i == 3) { /* capacity sits between dtype and num_splits in the documented order */
        TPF_RETURN_IF(a->cap_rows != b->cap_rows || a->cap_cols != b->cap_cols, TPF_EMISMATCH,
                      "configuration of '%s' differs between ranks: capacity is [%llu, %llu] "
                      "on rank 0, [%llu, %llu] on rank %d",
                      name, (unsigned long long)a->cap_rows, (unsigned long long)a->cap_cols,
                      (unsigned long long)b->cap_rows, (unsigned long long)b->cap_cols, q);
      }
      TPF_RETURN_IF(ints[i].x != ints[i].y, TPF_EMISMATCH,
                    "configuration of '%s' differs between ranks: %s is %s on rank 0, %s on "
                    "rank %d",
                    name, ints[i].field, enum_text(ints[i].field, ints[i].x, va, sizeof va),
                    enum_text(ints[i].field, ints[i].y, vb, sizeof vb), q);
    }
    TPF_RETURN_IF(a->cost_hash != b->cost_hash, TPF_EMISMATCH,
                  "configuration of '%s' differs between ranks: the adaptive cost table on rank "
                  "%d is not rank 0's (hash %016llx vs %016llx): ranks would plan differently",
                  name, q, (unsigned long long)b->cost_hash, (unsigned long long)a->cost_hash);
  }
  return TPF_OK;
}

/* Exchanges fingerprints over the backend (when it can) and compares them; every rank sees all
 * of them, so every rank fails with the same message. cfg NULL: this rank's call already failed
 * a local check (`local`, detail in tpf_last_error()): it still takes part, with an "invalid"
 * fingerprint, so that every rank fails this creation and the exchanges stay paired; it
 * returns its own local status and detail. The fingerprints live on the stack
 * (P <= TPF_MAX_RANKS): an allocation failing on one rank only would unpair the group too. */
static tpf_status agree(tpf_backend *be, const tpf_comm_config *cfg, tpf_status local) {
  tpf_status (*allgather)(tpf_backend *, const void *, void *, size_t) = tpf__be_allgather_op(be);
  if (be->tp_size < 2 || !allgather) return local;
  char local_detail[400];
  strncpy(local_detail, tpf_last_error(), sizeof local_detail - 1);
  local_detail[sizeof local_detail - 1] = '\0';
  fingerprint mine;
  if (cfg) {
    fingerprint_of(cfg, &mine);
  } else {
    memset(&mine, 0, sizeof mine);
    mine.magic = FP_MAGIC;
    mine.invalid = 1;
    const size_t n = strlen(local_detail);
    memcpy(mine.name, local_detail, n < FP_NAME_LEN - 1 ? n : FP_NAME_LEN - 1);
  }
  fingerprint all[TPF_MAX_RANKS];
  const char *name = cfg ? cfg->name : "?";
  tpf_status rc = allgather(be, &mine, all, sizeof mine);
  if (rc != TPF_OK) {
    if (!cfg) /* the local failure comes first; the exchange's fate follows it */
      return tpf_prefix_error(local, "%s; the creation exchange failed too: ", local_detail);
    return tpf_prefix_error(rc, "'%s': ", name);
  }
  if (!cfg) return tpf_set_error(local, "%s", local_detail);
  return compare_fingerprints(name, all, be->tp_size);
}

tpf_status tpf_comm_create(tpf_backend *be, const tpf_comm_config *user_cfg, tpf_comm **out) {
  return tpf__comm_create_after(be, user_cfg, out, TPF_OK);
}

static tpf_status create_body(tpf_backend *be, const tpf_comm_config *user_cfg, tpf_comm **out,
                              tpf_status local);

/* The creation holds the rank (tpf__be_claim) from its exchange to its registration, so that a
 * second thread's call on another communicator of the rank is refused by the core, changing
 * nothing, instead of by the backend in the middle of that call. */
tpf_status tpf__comm_create_after(tpf_backend *be, const tpf_comm_config *user_cfg, tpf_comm **out,
                                  tpf_status local) {
  TPF_CHECK(tpf__be_validate(be));
  bool claimed = false;
  TPF_CHECK(tpf__be_claim(be, "tpf_comm_create", NULL, &claimed));
  const tpf_status rc = create_body(be, user_cfg, out, local);
  if (claimed) tpf__be_release(be);
  return rc;
}

static tpf_status create_body(tpf_backend *be, const tpf_comm_config *user_cfg, tpf_comm **out,
                              tpf_status local) {
  /* Without a valid backend there is no group to stay paired with. */
  TPF_CHECK(tpf__be_validate(be));
  /* Local checks: a failure still takes part in the collective exchange below. */
  if (local == TPF_OK && !out) local = tpf_set_error(TPF_EINVAL, "tpf_comm_create: out is NULL");
  if (local == TPF_OK) local = check_config(user_cfg);
  if (local != TPF_OK) return agree(be, NULL, local);
  const tpf_comm_config norm = normalized(user_cfg);
  const tpf_comm_config *cfg = &norm;
  /* Collective: before anything is registered, so a disagreement registers nothing. */
  TPF_CHECK(agree(be, cfg, TPF_OK));

  tpf_layout_desc cap_desc;
  memset(&cap_desc, 0, sizeof cap_desc);
  cap_desc.tp_size = be->tp_size;
  cap_desc.algo = cfg->algo;
  cap_desc.capacity = cfg->capacity;
  int max_steps = tpf__schedule_max_steps(&cap_desc);
  comm_full *f =
      tpf__calloc(1, sizeof *f + (size_t)TPF_SCHED_CACHE * (size_t)max_steps * sizeof(tpf_step));
  TPF_RETURN_IF(!f, TPF_ENOMEM, "'%s': cannot allocate the communicator", cfg->name);
  atomic_init(&f->aborted, 0);
  atomic_init(&f->busy, 0);
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
    rc = tpf__comm_named(c, rc);
    goto fail;
  }
  TPF_CHECK_GOTO(tpf_layout_registered_bytes(&d, &c->reg_bytes), rc, fail);
  TPF_CHECK_GOTO(tpf__planner_create(cfg, &d, &c->planner), rc, fail);
  if (c->planner) c->cfg.cost = tpf__planner_table(c->planner); /* our copy */
  TPF_CHECK_GOTO(tpf__handle_add(c, TPF_HANDLE_COMM), rc, fail);
  rc = tpf__be_reg_create(be, c->name, c->reg_bytes, &c->reg, &c->base);
  if (rc != TPF_OK) {
    tpf__handle_remove(c, NULL);
    goto fail;
  }
  *out = c;
  return TPF_OK;

fail:
  tpf__planner_destroy(c->planner);
  tpf__free(c->name);
  tpf__free(f);
  return rc;
}

tpf_status tpf__comm_enter(tpf_comm *c, const char *call) {
  return enter(c, call);
}

void tpf__comm_leave(tpf_comm *c) {
  (void)leave(c, TPF_OK);
}

/* A refused destroy changes nothing: c is entered (no other thread is inside a call on it) and
 * the rank is held (none is inside a call on another communicator of the rank, whose backend
 * entry would refuse this destroy's sync and reg_destroy after c had been freed and its
 * registration leaked) before anything is taken apart. */
tpf_status tpf_comm_destroy(tpf_comm *c) {
  TPF_CHECK_COMM(c, "tpf_comm_destroy");
  TPF_CHECK(enter(c, "tpf_comm_destroy"));
  bool claimed = false;
  tpf_status rc = tpf__be_claim(c->be, "tpf_comm_destroy", c->cfg.name, &claimed);
  if (rc != TPF_OK) return leave(c, rc);
  tpf_backend *be = c->be;
  rc = tpf__comm_destroy_held(c);
  if (claimed) tpf__be_release(be);
  return rc;
}

tpf_status tpf__comm_destroy_held(tpf_comm *c) {
  /* A managed communicator leaves its manager (how a failed one is replaced
   * without bricking the manager); the manager never holds a destroyed pointer. */
  if (c->manager) c->leave_manager(c->manager, c);
  /* Out of the table first: from here on every call on c is refused without reading it. */
  tpf__handle_remove(c, c->cfg.name);
  /* Wait for what is in flight before the memory goes; keep going on error so nothing leaks. */
  tpf_status rc = tpf__be_sync(c->be, NULL);
  tpf_status rc2 = tpf__be_reg_destroy(c->be, c->reg);
  tpf__planner_destroy(c->planner);
  tpf__free(c->name);
  tpf__free(tpf__comm_full(c));
  return rc != TPF_OK ? rc : rc2;
}

tpf_status tpf__comm_check_shape(const tpf_comm *c, tpf_shape active, uint64_t *active_bytes) {
  TPF_CHECK_COMM(c, "set_active_shape");
  TPF_RETURN_IF_ABORTED(c);
  TPF_RETURN_IF(c->failed != TPF_OK, TPF_ESTATE,
                "'%s' failed earlier (%s: %s) and accepts no shape change; to recover, "
                "tpf_comm_destroy it on every rank (a managed one leaves its manager) and create "
                "it again (tpf_manager_add)",
                c->cfg.name, tpf_status_name(c->failed), c->fail_detail);
  tpf_layout_desc d = tpf__comm_desc(c, active);
  tpf_status rc = tpf__layout_check_align(&d, c->be->ops->align_bytes);
  if (rc != TPF_OK) return tpf__comm_named(c, rc);
  /* Last, as in SPEC §3's table: a shape that breaks an earlier rule gets that rule's status. */
  TPF_RETURN_IF(c->cfg.external, TPF_EUNSUPPORTED,
                "'%s' is external and stays at its capacity shape [%llu, %llu]", c->cfg.name,
                (unsigned long long)c->cfg.capacity.rows, (unsigned long long)c->cfg.capacity.cols);
  return tpf_layout_active_bytes(&d, active_bytes);
}

tpf_status tpf__comm_apply_shape(tpf_comm *c, tpf_shape active, uint64_t active_bytes) {
  TPF_CHECK(tpf__be_reg_activate(c->be, c->reg, active_bytes));
  c->active = active;
  c->epoch++;
  c->telemetry.shape_changes++;
  return TPF_OK;
}

tpf_status tpf_comm_set_active_shape(tpf_comm *c, tpf_shape active) {
  uint64_t bytes = 0;
  TPF_CHECK_COMM(c, "set_active_shape");
  TPF_CHECK(enter(c, "set_active_shape"));
  bool claimed = false;
  tpf_status rc = tpf__be_claim(c->be, "set_active_shape", c->cfg.name, &claimed);
  if (rc == TPF_OK) rc = tpf__comm_check_shape(c, active, &bytes);
  if (rc == TPF_OK) rc = tpf__comm_apply_shape(c, active, bytes);
  if (claimed) tpf__be_release(c->be);
  return leave(c, rc);
}

tpf_shape tpf_comm_active_shape(const tpf_comm *c) {
  tpf_shape none = {0, 0};
  return comm_ok(c, "tpf_comm_active_shape") ? c->active : none;
}

tpf_shape tpf_comm_capacity_shape(const tpf_comm *c) {
  tpf_shape none = {0, 0};
  return comm_ok(c, "tpf_comm_capacity_shape") ? c->cfg.capacity : none;
}

uint64_t tpf_comm_epoch(const tpf_comm *c) {
  return comm_ok(c, "tpf_comm_epoch") ? c->epoch : 0;
}

const tpf_comm_config *tpf_comm_config_of(const tpf_comm *c) {
  return comm_ok(c, "tpf_comm_config_of") ? &c->cfg : NULL;
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
  TPF_CHECK_COMM(c, "tpf_comm_buffer");
  TPF_RETURN_IF(!full, TPF_EINVAL, "tpf_comm_buffer: NULL argument");
  tpf_layout_desc d = tpf__comm_desc(c, c->active);
  /* Every slot of the active layout (layout.c's slot rule); validated: no overflow. */
  uint64_t p = (uint64_t)c->be->tp_size;
  *full = view(c, 0, (uint64_t)tpf__layout_slots(&d) * (c->active.rows / p));
  return TPF_OK;
}

tpf_status tpf_comm_local_chunk(tpf_comm *c, tpf_matrix *local) {
  TPF_CHECK_COMM(c, "tpf_comm_local_chunk");
  TPF_RETURN_IF(!local, TPF_EINVAL, "tpf_comm_local_chunk: NULL argument");
  tpf_layout_desc d = tpf__comm_desc(c, c->active);
  tpf_region r;
  TPF_CHECK(tpf_layout_local(&d, &r));
  *local = view(c, r.offset_bytes, r.rows);
  return TPF_OK;
}

const char *tpf_comm_backend_name(const tpf_comm *c) {
  return comm_ok(c, "tpf_comm_backend_name") && c->be->ops->name ? c->be->ops->name : NULL;
}

unsigned tpf_comm_backend_caps(const tpf_comm *c) {
  return comm_ok(c, "tpf_comm_backend_caps") ? tpf__be_caps(c->be) : 0u;
}

tpf_status tpf_comm_registration(tpf_comm *c, void **base, uint64_t *bytes) {
  TPF_CHECK_COMM(c, "tpf_comm_registration");
  TPF_RETURN_IF(!base || !bytes, TPF_EINVAL, "tpf_comm_registration: NULL argument");
  *base = c->base;
  *bytes = c->reg_bytes;
  return TPF_OK;
}

/* ---- Completion and errors ---- */

/* The deferred status of what was enqueued: the failure that left the communicator failed, else
 * what the backend holds for this registration (optional op). Never waits. */
static tpf_status deferred(tpf_comm *c) {
  if (c->failed != TPF_OK) return c->failed;
  tpf_status st = TPF_OK;
  tpf_status (*async_error)(tpf_backend *, tpf_reg *, tpf_status *) =
      tpf__be_reg_async_error_op(c->be);
  if (async_error) {
    tpf_status rc = async_error(c->be, c->reg, &st);
    if (rc != TPF_OK) return rc;
  }
  return st;
}

static tpf_status sync_body(tpf_comm *c) {
  TPF_RETURN_IF_ABORTED(c);
  tpf_status rc = tpf__be_reg_sync_op(c->be) ? tpf__be_reg_sync_op(c->be)(c->be, c->reg)
                                             : tpf__be_sync(c->be, NULL);
  if (rc != TPF_OK) {
    if (c->failed == TPF_OK && rc != TPF_EMISMATCH) tpf__comm_mark_failed(c, rc);
    return tpf__comm_named(c, rc);
  }
  TPF_RETURN_IF(c->failed != TPF_OK, c->failed,
                "'%s': an enqueued operation failed earlier (%s); destroy the communicator",
                c->cfg.name, tpf_status_name(c->failed));
  return TPF_OK;
}

tpf_status tpf_comm_sync(tpf_comm *c) {
  TPF_CHECK_COMM(c, "tpf_comm_sync");
  TPF_CHECK(enter(c, "tpf_comm_sync"));
  bool claimed = false;
  tpf_status rc = tpf__be_claim(c->be, "tpf_comm_sync", c->cfg.name, &claimed);
  if (rc == TPF_OK) rc = sync_body(c);
  if (claimed) tpf__be_release(c->be);
  return leave(c, rc);
}

tpf_status tpf_comm_async_error(tpf_comm *c, tpf_status *out) {
  TPF_CHECK_COMM(c, "tpf_comm_async_error");
  TPF_RETURN_IF(!out, TPF_EINVAL, "tpf_comm_async_error: NULL argument");
  TPF_RETURN_IF_ABORTED(c);
  tpf_status st = deferred(c);
  *out = st;
  return TPF_OK;
}

tpf_status tpf_comm_abort(tpf_comm *c) {
  TPF_CHECK_COMM(c, "tpf_comm_abort");
  /* Only an atomic store and the backend's thread-safe abort: callable from any thread while the
   * rank's own thread is blocked in an operation on c. */
  atomic_store(&tpf__comm_full(c)->aborted, 1);
  tpf_status (*abort_op)(tpf_backend *, tpf_reg *) = tpf__be_reg_abort_op(c->be);
  if (abort_op) return abort_op(c->be, c->reg);
  return TPF_OK;
}

tpf_status tpf_comm_plan_info(const tpf_comm *c, tpf_plan_result *out) {
  TPF_CHECK_COMM(c, "tpf_comm_plan_info");
  TPF_RETURN_IF(!out, TPF_EINVAL, "tpf_comm_plan_info: out is NULL");
  TPF_RETURN_IF(!c->planner, TPF_EUNSUPPORTED,
                "'%s' plans nothing: it was created with TPF_PLAN_FIXED (splits %d)", c->cfg.name,
                c->cfg.num_splits);
  return tpf__planner_last(c->planner, out);
}
