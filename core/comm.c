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

/* The communicator as allocated: the shared struct (comm_internal.h) followed by what only this
 * file needs: the abort flag and the schedule storage, sized at creation for the largest
 * schedule any active shape T <= C can need, so an operation builds its schedule without
 * allocating. */
/* Schedule reuse: the schedule of an operation depends only on the communicator, the active rows
 * T and the operation key (the resolved split count and aggregate, the transposes, whether an
 * epilogue is on, the GEMM dims). The last TPF_SCHED_CACHE of them are kept, built and resolved
 * (apply_options done), in storage reserved at creation; an operation whose key is cached hands
 * the backend that schedule without building anything or validating the layout again. */
#define TPF_SCHED_CACHE 8
typedef struct {
  uint64_t rows, m, n, k;
  int32_t num_splits, aggregate;
  uint32_t flags; /* bit 0 trans_a, 1 trans_w, 2 epilogue */
  int valid;
} sched_key;
typedef struct {
  sched_key key;
  tpf_schedule sched; /* steps point into comm_full.steps */
} sched_entry;

typedef struct {
  struct tpf_comm c; /* must stay first */
  atomic_int aborted;
  atomic_int busy; /* a thread is inside an operation, set_active_shape or sync (item 5) */
  int max_steps;
  int next_slot;  /* the entry a miss replaces next (round robin) */
  bool cache_off; /* tpf__comm_set_schedule_cache(c, false): build every time */
  tpf_comm_cache_stats stats;
  sched_entry cache[TPF_SCHED_CACHE];
  tpf_step steps[]; /* TPF_SCHED_CACHE * max_steps entries: entry i owns [i * max_steps, ..) */
} comm_full;

static comm_full *full_of(const tpf_comm *c) {
  return (comm_full *)(void *)(uintptr_t)c;
}

/* The handle check of every public call (core/handle.c): reads nothing of a destroyed c. */
#define TPF_CHECK_COMM(c, call) TPF_CHECK(tpf__handle_check((c), TPF_HANDLE_COMM, (call)))
/* For the calls that return a value, not a status: false (and the detail set) when c is not a
 * live communicator. */
static bool comm_ok(const tpf_comm *c, const char *call) {
  return tpf__handle_check(c, TPF_HANDLE_COMM, call) == TPF_OK;
}

static bool aborted(const tpf_comm *c) {
  return atomic_load(&full_of(c)->aborted) != 0;
}

#define TPF_RETURN_IF_ABORTED(c)                                                                   \
  TPF_RETURN_IF(aborted(c), TPF_ESTATE,                                                            \
                "'%s' was aborted (tpf_comm_abort); destroy it and create a new one",              \
                (c)->cfg.name)

/* One thread per rank at a time (tpflex.h): an operation, set_active_shape, sync or destroy (and
 * a manager's shape change or destroy, for each of its communicators) marks the communicator
 * busy at entry with an atomic exchange; a second thread arriving meanwhile is refused at once
 * with TPF_ESTATE and changes nothing (on the simulator it used to overwrite the first job in the
 * rank's job slot, and the loser waited forever). The rank as a whole is held with
 * tpf__be_claim (core/backend.c) around each backend call. */
static tpf_status enter(tpf_comm *c, const char *call) {
  TPF_RETURN_IF(atomic_exchange(&full_of(c)->busy, 1) != 0, TPF_ESTATE,
                "%s: another thread is inside a call on '%s' for this rank right now; the rule is "
                "one thread per rank at a time (tpflex.h, Threads): serialize the calls",
                call, c->cfg.name);
  return TPF_OK;
}
/* Leaves c failed with status rc, keeping the detail for the messages of later calls (they name
 * the original failure and the way out). */
static void mark_failed(tpf_comm *c, tpf_status rc) {
  c->failed = rc;
  const char *e = tpf_last_error();
  const size_t n = strlen(e) < sizeof c->fail_detail - 1 ? strlen(e) : sizeof c->fail_detail - 1;
  memcpy(c->fail_detail, e, n);
  c->fail_detail[n] = '\0';
}

static tpf_status leave(tpf_comm *c, tpf_status rc) {
  atomic_store(&full_of(c)->busy, 0);
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
 * left as it is, so the name never appears twice. */
static tpf_status named(const tpf_comm *c, tpf_status s) {
  char detail[400], prefix[264]; /* names are at most 255 bytes (check_config) */
  strncpy(detail, tpf_last_error(), sizeof detail - 1);
  detail[sizeof detail - 1] = '\0';
  const int n = snprintf(prefix, sizeof prefix, "'%s': ", c->cfg.name);
  if (n > 0 && (size_t)n < sizeof prefix && strncmp(detail, prefix, (size_t)n) == 0)
    return tpf_set_error(s, "%s", detail);
  return tpf_set_error(s, "'%s': %s", c->cfg.name, detail);
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
    char detail[400];
    strncpy(detail, tpf_last_error(), sizeof detail - 1);
    detail[sizeof detail - 1] = '\0';
    if (!cfg) /* the local failure comes first; the exchange's fate follows it */
      return tpf_set_error(local, "%s (and the creation exchange failed: %s)", local_detail,
                           detail);
    return tpf_set_error(rc, "'%s': %s", name, detail);
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
    rc = named(c, rc);
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
  tpf__free(full_of(c));
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
  if (rc != TPF_OK) return named(c, rc);
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

/* ---- Operations ---- */

static bool gemm_dtype(tpf_dtype t) {
  return t == TPF_BF16 || t == TPF_FP16 || t == TPF_FP32;
}

static bool fp8_dtype(tpf_dtype t) {
  return t == TPF_FP8_E4M3 || t == TPF_FP8_E5M2;
}

/* The dtype rules of an fp8 GEMM (SPEC §11), checked after check_matrix has passed the operands'
 * shapes with the dtype checks relaxed: a and w both fp8, not both E5M2 (cuBLASLt on Hopper has
 * no E5M2 x E5M2), D bf16, fp16 or fp32; the backend must run fp8 GEMMs. */
static tpf_status check_fp8_gemm(const tpf_comm *c, const char *op, const char *an, tpf_dtype a,
                                 const char *wn, tpf_dtype w, const char *dn, tpf_dtype d) {
  const char *n = c->cfg.name;
  TPF_RETURN_IF(!fp8_dtype(a) || !fp8_dtype(w), TPF_EINVAL,
                "'%s' %s: %s is %s but %s is %s: an fp8 GEMM takes two fp8 operands "
                "(fp8_e4m3 or fp8_e5m2)",
                n, op, fp8_dtype(a) ? an : wn, tpf_dtype_name(fp8_dtype(a) ? a : w),
                fp8_dtype(a) ? wn : an, tpf_dtype_name(fp8_dtype(a) ? w : a));
  TPF_RETURN_IF(a == TPF_FP8_E5M2 && w == TPF_FP8_E5M2, TPF_EUNSUPPORTED,
                "'%s' %s: %s and %s are both fp8_e5m2; fp8 GEMMs take e4m3 x e4m3, e4m3 x e5m2 "
                "or e5m2 x e4m3 (cuBLASLt has no e5m2 x e5m2)",
                n, op, an, wn);
  TPF_RETURN_IF(!gemm_dtype(d), TPF_EINVAL,
                "'%s' %s: %s dtype %s; the output of an fp8 GEMM (%s x %s) is bf16, fp16 or fp32",
                n, op, dn, tpf_dtype_name(d), tpf_dtype_name(a), tpf_dtype_name(w));
  TPF_RETURN_IF(!(tpf__be_caps(c->be) & TPF_BE_CAP_FP8), TPF_EUNSUPPORTED,
                "'%s' %s: backend '%s' does not run fp8 GEMMs (TPF_BE_CAP_FP8)", n, op,
                c->be->ops->name ? c->be->ops->name : "?");
  return TPF_OK;
}

/* A scale given for an operand that is not fp8 means the caller's data is not what they think. */
static tpf_status check_scales(const tpf_comm *c, const char *op, const tpf_op_options *o,
                               const char *an, tpf_dtype a, const char *wn, tpf_dtype w) {
  TPF_RETURN_IF(o->a_scale_inv && !fp8_dtype(a), TPF_EINVAL,
                "'%s' %s: a_scale_inv is set but %s is %s; scales apply to fp8 operands only",
                c->cfg.name, op, an, tpf_dtype_name(a));
  TPF_RETURN_IF(o->w_scale_inv && !fp8_dtype(w), TPF_EINVAL,
                "'%s' %s: w_scale_inv is set but %s is %s; scales apply to fp8 operands only",
                c->cfg.name, op, wn, tpf_dtype_name(w));
  return TPF_OK;
}

/* A dtype check_matrix accepts for an operand of an fp8-capable site: `want`, or (fp8_ok) any
 * fp8 dtype, which check_fp8_gemm then pairs. */
static tpf_dtype want_or_fp8(tpf_dtype want, bool fp8_ok, const tpf_matrix *m) {
  return fp8_ok && m && fp8_dtype(m->dtype) ? m->dtype : want;
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
  TPF_RETURN_IF(fp8_dtype(c->cfg.dtype) && c->cfg.coll == TPF_COLL_RS, TPF_EUNSUPPORTED,
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
                             TPF_ARRAY_SIZE(released)) != TPF_OK) {
    char detail[400];
    strncpy(detail, tpf_last_error(), sizeof detail - 1);
    detail[sizeof detail - 1] = '\0';
    return tpf_set_error(TPF_EINVAL, "'%s' %s", n, detail);
  }
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
  char detail[300];
  strncpy(detail, tpf_last_error(), sizeof detail - 1);
  detail[sizeof detail - 1] = '\0';
  return tpf_set_error(rc, "'%s': num_splits %d is not legal for active rows %llu: %s", c->cfg.name,
                       o->num_splits, (unsigned long long)c->active.rows, detail);
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
  if (rc != TPF_OK) return named(c, rc);
  apply_options(&e->sched, o);
  e->key = key;
  f->next_slot = (slot + 1) % TPF_SCHED_CACHE;
  *out = &e->sched;
  return TPF_OK;
}

void tpf__comm_set_schedule_cache(tpf_comm *c, bool on) {
  comm_full *f = full_of(c);
  f->cache_off = !on;
  for (int i = 0; i < TPF_SCHED_CACHE; i++)
    f->cache[i].key.valid = 0;
}

tpf_comm_cache_stats tpf__comm_cache_stats(const tpf_comm *c) {
  return full_of(c)->stats;
}

/* Builds (or reuses) the schedule for the current active shape in the communicator's storage
 * (no allocation) and runs it on the backend. The backend is done with the steps when execute
 * returns: synchronous backends have run them, asynchronous ones have enqueued them. */
static tpf_status run_op(tpf_comm *c, const tpf_gemm_dims *g, const tpf_matrix *x,
                         const tpf_matrix *w, const tpf_matrix *d, const tpf_op_options *o,
                         void *stream) {
  tpf_layout_desc desc;
  TPF_CHECK(op_desc(c, o, &desc));
  comm_full *f = full_of(c);
  tpf_status rc = TPF_OK;
  /* Adaptive: the split count (and aggregate) the planner chose for this T, GEMM size and x
   * dtype (an fp8 gemm_rs prices fp8 GEMMs). It depends only on the configuration, the agreed
   * shape, the GEMM dims and x's dtype: every rank chooses the same, and the handshake would
   * still catch a rank that did not. An operation that names its split count is not planned. (The
   * planner caches its own choice; it is asked every time so that tpf_comm_plan_info reports the
   * last operation's.) */
  if (c->planner && desc.algo != TPF_ALGO_BULK && o->num_splits == 0)
    rc = tpf__planner_apply(c->planner, &desc, g, x ? x->dtype : desc.dtype);
  if (rc != TPF_OK) return named(c, rc);
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
  if (rc != TPF_OK && rc != TPF_EMISMATCH) mark_failed(c, rc);
  c->ops++;
  if (rc == TPF_OK) tpf__stats_op(&c->telemetry, sched, c->cfg.capacity.rows); /* accepted */
  return rc;
}

/* Rows and columns of a matrix as stored, for an operand used as [rows, cols] (transposed when
 * `trans`). */
static void stored(bool trans, uint64_t rows, uint64_t cols, uint64_t *sr, uint64_t *sc) {
  *sr = trans ? cols : rows;
  *sc = trans ? rows : cols;
}

static tpf_status ag_gemm_body(tpf_comm *c, const tpf_matrix *w, tpf_matrix *d,
                               const tpf_op_options *opt, void *stream) {
  TPF_CHECK_COMM(c, "tpf_ag_gemm"); /* before ok_kind reads c */
  TPF_CHECK(check_op(c, "tpf_ag_gemm",
                     c && c->cfg.algo == TPF_ALGO_RING && c->cfg.coll == TPF_COLL_AG, "ring ag"));
  tpf_op_options o;
  TPF_CHECK(op_options(c, "tpf_ag_gemm", opt, &o));
  TPF_RETURN_IF(o.trans_a, TPF_EUNSUPPORTED,
                "'%s': tpf_ag_gemm's activation is the gathered buffer [T, H]; trans_a is not "
                "available (use trans_w for a weight stored [H, N])",
                c->cfg.name);
  const uint64_t T = c->active.rows, H = c->cfg.capacity.cols;
  TPF_RETURN_IF(!w, TPF_EINVAL, "'%s': weight w is NULL", c->cfg.name);
  const uint64_t N = o.trans_w ? w->cols : w->rows;
  uint64_t wr, wc;
  stored(o.trans_w, N, H, &wr, &wc);
  const bool f8 = fp8_dtype(c->cfg.dtype);
  TPF_CHECK(check_matrix(c, o.trans_w ? "weight w (trans_w: [H, N])" : "weight w", w, wr, wc,
                         want_or_fp8(c->cfg.dtype, f8, w), false));
  TPF_RETURN_IF(N == 0, TPF_ESHAPE, "'%s': weight w has 0 %s", c->cfg.name,
                o.trans_w ? "columns (trans_w)" : "rows");
  /* fp8: D's dtype is checked by check_fp8_gemm, whose message names the fp8 rule. */
  TPF_CHECK(check_matrix(c, "output d", d, T, N, f8 && d ? d->dtype : c->cfg.dtype, true));
  if (f8)
    TPF_CHECK(check_fp8_gemm(c, "tpf_ag_gemm", "the buffer", c->cfg.dtype, "weight w", w->dtype,
                             "output d", d->dtype));
  TPF_CHECK(check_scales(c, "tpf_ag_gemm", &o, "the buffer", c->cfg.dtype, "weight w", w->dtype));
  TPF_RETURN_IF(aliases(c, w) || aliases(c, d), TPF_EINVAL,
                "'%s': w or d overlaps the registered buffer", c->cfg.name);
  const extent dx = matrix_extent("output d", d);
  const extent ins[] = {matrix_extent("weight w", w), bias_extent(o.bias, N, d->dtype)};
  TPF_CHECK(check_disjoint(c, "tpf_ag_gemm", &dx, ins, 2));
  TPF_RETURN_IF(bias_aliases(c, &ins[1]), TPF_EINVAL, "'%s': bias overlaps the registered buffer",
                c->cfg.name);
  TPF_CHECK(check_scale_overlap(c, "tpf_ag_gemm", &dx, &o));
  tpf_gemm_dims g = {T, N, H};
  return run_op(c, &g, NULL, w, d, &o, stream);
}

static tpf_status gemm_rs_body(tpf_comm *c, const tpf_matrix *x, const tpf_matrix *w,
                               tpf_matrix *out, const tpf_op_options *opt, void *stream) {
  TPF_CHECK_COMM(c, "tpf_gemm_rs");
  TPF_CHECK(check_op(c, "tpf_gemm_rs",
                     c && c->cfg.coll == TPF_COLL_RS &&
                         (c->cfg.algo == TPF_ALGO_RING || c->cfg.algo == TPF_ALGO_PIPELINE),
                     "ring rs or pipeline rs"));
  tpf_op_options o;
  TPF_CHECK(op_options(c, "tpf_gemm_rs", opt, &o));
  const uint64_t T = c->active.rows, H = c->cfg.capacity.cols;
  const uint64_t P = (uint64_t)c->be->tp_size;
  TPF_RETURN_IF(!x, TPF_EINVAL, "'%s': input x is NULL", c->cfg.name);
  const uint64_t K = o.trans_a ? x->rows : x->cols;
  uint64_t xr, xc, wr, wc;
  stored(o.trans_a, T, K, &xr, &xc);
  stored(o.trans_w, H, K, &wr, &wc);
  const bool f8 = fp8_dtype(x->dtype) || (w && fp8_dtype(w->dtype));
  TPF_CHECK(check_matrix(c, o.trans_a ? "input x (trans_a: [K, T])" : "input x", x, xr, xc,
                         want_or_fp8(c->cfg.dtype, f8, x), false));
  TPF_RETURN_IF(K == 0, TPF_ESHAPE, "'%s': input x has 0 %s", c->cfg.name,
                o.trans_a ? "rows (trans_a)" : "columns");
  TPF_CHECK(check_matrix(c, o.trans_w ? "weight w (trans_w: [K, H])" : "weight w", w, wr, wc,
                         want_or_fp8(c->cfg.dtype, f8, w), false));
  TPF_CHECK(check_matrix(c, "output out", out, T / P, H, c->cfg.dtype, true));
  if (f8)
    TPF_CHECK(check_fp8_gemm(c, "tpf_gemm_rs", "input x", x->dtype, "weight w", w->dtype,
                             "output out", out->dtype));
  TPF_CHECK(check_scales(c, "tpf_gemm_rs", &o, "input x", x->dtype, "weight w", w->dtype));
  TPF_RETURN_IF(aliases(c, x) || aliases(c, w) || aliases(c, out), TPF_EINVAL,
                "'%s': x, w or out overlaps the registered buffer", c->cfg.name);
  const extent ox = matrix_extent("output out", out);
  const extent ins[] = {matrix_extent("input x", x), matrix_extent("weight w", w),
                        bias_extent(o.bias, H, out->dtype)};
  TPF_CHECK(check_disjoint(c, "tpf_gemm_rs", &ox, ins, 3));
  TPF_RETURN_IF(bias_aliases(c, &ins[2]), TPF_EINVAL, "'%s': bias overlaps the registered buffer",
                c->cfg.name);
  TPF_CHECK(check_scale_overlap(c, "tpf_gemm_rs", &ox, &o));
  tpf_gemm_dims g = {T, H, K};
  return run_op(c, &g, x, w, out, &o, stream);
}

static tpf_status bulk_body(tpf_comm *c, const tpf_matrix *a, const tpf_matrix *b, tpf_matrix *d,
                            const tpf_op_options *opt, void *stream) {
  TPF_CHECK_COMM(c, "tpf_bulk_overlap");
  TPF_CHECK(check_op(c, "tpf_bulk_overlap", c && c->cfg.algo == TPF_ALGO_BULK, "bulk"));
  tpf_op_options o;
  TPF_CHECK(op_options(c, "tpf_bulk_overlap", opt, &o));
  TPF_RETURN_IF(!a || !b, TPF_EINVAL, "'%s': a or b is NULL", c->cfg.name);
  TPF_RETURN_IF((unsigned)a->dtype >= TPF_DTYPE_COUNT, TPF_EINVAL,
                "'%s': a dtype %d is not a tpf_dtype", c->cfg.name, (int)a->dtype);
  const bool f8 = fp8_dtype(a->dtype) || fp8_dtype(b->dtype);
  const uint64_t M = o.trans_a ? a->cols : a->rows, K = o.trans_a ? a->rows : a->cols;
  TPF_CHECK(check_matrix(c, "a", a, a->rows, a->cols, a->dtype, false));
  TPF_RETURN_IF(M == 0 || K == 0, TPF_ESHAPE, "'%s': a is [%llu, %llu]", c->cfg.name,
                (unsigned long long)a->rows, (unsigned long long)a->cols);
  const uint64_t N = o.trans_w ? b->cols : b->rows;
  uint64_t br, bc;
  stored(o.trans_w, N, K, &br, &bc);
  TPF_CHECK(check_matrix(c, o.trans_w ? "b (trans_w: [K, N])" : "b", b, br, bc,
                         want_or_fp8(a->dtype, f8, b), false));
  TPF_RETURN_IF(N == 0, TPF_ESHAPE, "'%s': b has 0 %s", c->cfg.name,
                o.trans_w ? "columns (trans_w)" : "rows");
  TPF_CHECK(check_matrix(c, "d", d, M, N, f8 && d ? d->dtype : a->dtype, true));
  if (f8)
    TPF_CHECK(check_fp8_gemm(c, "tpf_bulk_overlap", "a", a->dtype, "b", b->dtype, "d", d->dtype));
  TPF_CHECK(check_scales(c, "tpf_bulk_overlap", &o, "a", a->dtype, "b", b->dtype));
  TPF_RETURN_IF(aliases(c, a) || aliases(c, b) || aliases(c, d), TPF_EINVAL,
                "'%s': a, b or d overlaps the registered buffer", c->cfg.name);
  const extent dx = matrix_extent("output d", d);
  const extent ins[] = {matrix_extent("a", a), matrix_extent("b", b),
                        bias_extent(o.bias, N, d->dtype)};
  TPF_CHECK(check_disjoint(c, "tpf_bulk_overlap", &dx, ins, 3));
  TPF_RETURN_IF(bias_aliases(c, &ins[2]), TPF_EINVAL, "'%s': bias overlaps the registered buffer",
                c->cfg.name);
  TPF_CHECK(check_scale_overlap(c, "tpf_bulk_overlap", &dx, &o));
  tpf_gemm_dims g = {M, N, K};
  return run_op(c, &g, a, b, d, &o, stream);
}

tpf_status tpf_ag_gemm_ex(tpf_comm *c, const tpf_matrix *w, tpf_matrix *d,
                          const tpf_op_options *opt, void *stream) {
  TPF_CHECK_COMM(c, "tpf_ag_gemm");
  TPF_CHECK(enter(c, "tpf_ag_gemm"));
  return leave(c, ag_gemm_body(c, w, d, opt, stream));
}

tpf_status tpf_gemm_rs_ex(tpf_comm *c, const tpf_matrix *x, const tpf_matrix *w, tpf_matrix *out,
                          const tpf_op_options *opt, void *stream) {
  TPF_CHECK_COMM(c, "tpf_gemm_rs");
  TPF_CHECK(enter(c, "tpf_gemm_rs"));
  return leave(c, gemm_rs_body(c, x, w, out, opt, stream));
}

tpf_status tpf_bulk_overlap_ex(tpf_comm *c, const tpf_matrix *a, const tpf_matrix *b, tpf_matrix *d,
                               const tpf_op_options *opt, void *stream) {
  TPF_CHECK_COMM(c, "tpf_bulk_overlap");
  TPF_CHECK(enter(c, "tpf_bulk_overlap"));
  return leave(c, bulk_body(c, a, b, d, opt, stream));
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
    if (c->failed == TPF_OK && rc != TPF_EMISMATCH) mark_failed(c, rc);
    return named(c, rc);
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
  atomic_store(&full_of(c)->aborted, 1);
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
