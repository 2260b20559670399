/* The manager: named communicators of one TP group that share one active shape.
 *
 * tpf_manager_set_active_shape is all-or-nothing: it first takes the thread rule's guards of
 * every communicator and of the rank (hold_all; another thread inside a call on any of them is
 * TPF_ESTATE before anything changed), then validates every eligible communicator (every one not
 * external, fp8 included), and only when all accept the shape applies it. Holding the rank, no
 * other thread's call can make the backend refuse half-way (it used to: a simulator rank busy in
 * another thread's operation refused the second communicator's activation, leaving rows 64 128
 * 128 128, and the rollback's too). Should a backend still refuse while applying (it must not,
 * but a fault-injecting backend may), the communicators already changed are put back to their
 * previous shapes. tpf_manager_destroy takes the same guards before it destroys anything. */
#include "comm_internal.h"

#include <string.h>

#define TPF_CHECK_MANAGER(m, call) TPF_CHECK(tpf__handle_check((m), TPF_HANDLE_MANAGER, (call)))

static void forget(tpf_manager *m, tpf_comm *c); /* each managed communicator's leave_manager */

struct tpf_manager {
  tpf_backend *be;  /* shared by every communicator */
  tpf_comm **comms; /* in creation order */
  int count;        /* communicators */
  int cap;          /* allocated entries of comms */
};

tpf_status tpf_manager_create(tpf_backend *be, tpf_manager **out) {
  TPF_RETURN_IF(!out, TPF_EINVAL, "tpf_manager_create: out is NULL");
  TPF_CHECK(tpf__be_validate(be));
  tpf_manager *m = tpf__calloc(1, sizeof *m);
  TPF_RETURN_IF(!m, TPF_ENOMEM, "cannot allocate the manager");
  m->be = be;
  tpf_status rc = tpf__handle_add(m, TPF_HANDLE_MANAGER);
  if (rc != TPF_OK) {
    tpf__free(m);
    return rc;
  }
  *out = m;
  return TPF_OK;
}

static tpf_comm *find(const tpf_manager *m, const char *name) {
  for (int i = 0; i < m->count; i++)
    if (strcmp(m->comms[i]->cfg.name, name) == 0) return m->comms[i];
  return NULL;
}

tpf_status tpf_manager_add(tpf_manager *m, const tpf_comm_config *cfg, tpf_comm **out) {
  TPF_CHECK_MANAGER(m, "tpf_manager_add");
  /* Local failures (NULL config, duplicate name, no room) still take part in the creation
   * exchange (tpf__comm_create_after), so the other ranks fail this add too and stay paired. */
  tpf_status local = TPF_OK;
  if (!cfg)
    local = tpf_set_error(TPF_EINVAL, "tpf_manager_add: config is NULL");
  else if (cfg->name && find(m, cfg->name))
    local =
        tpf_set_error(TPF_EINVAL, "the manager already has a communicator named '%s'", cfg->name);
  if (local == TPF_OK && m->count == m->cap) {
    int cap = m->cap ? 2 * m->cap : 8;
    tpf_comm **grown = tpf__realloc(m->comms, (size_t)cap * sizeof *grown);
    if (!grown) {
      local = tpf_set_error(TPF_ENOMEM, "cannot grow the manager to %d communicators", cap);
    } else {
      m->comms = grown;
      m->cap = cap;
    }
  }
  tpf_comm *c = NULL;
  TPF_CHECK(tpf__comm_create_after(m->be, cfg, &c, local));
  c->manager = m;
  c->leave_manager = forget;
  m->comms[m->count++] = c;
  if (out) *out = c;
  return TPF_OK;
}

tpf_status tpf_manager_get(tpf_manager *m, const char *name, tpf_comm **out) {
  TPF_CHECK_MANAGER(m, "tpf_manager_get");
  TPF_RETURN_IF(!name || !out, TPF_EINVAL, "tpf_manager_get: NULL argument");
  tpf_comm *c = find(m, name);
  TPF_RETURN_IF(!c, TPF_EINVAL, "the manager has no communicator named '%s'", name);
  *out = c;
  return TPF_OK;
}

int tpf_manager_count(const tpf_manager *m) {
  return tpf__handle_check(m, TPF_HANDLE_MANAGER, "tpf_manager_count") == TPF_OK ? m->count : 0;
}

tpf_status tpf_manager_at(tpf_manager *m, int i, tpf_comm **out) {
  TPF_CHECK_MANAGER(m, "tpf_manager_at");
  TPF_RETURN_IF(!out, TPF_EINVAL, "tpf_manager_at: NULL argument");
  TPF_RETURN_IF(i < 0 || i >= m->count, TPF_EINVAL, "communicator index %d outside 0..%d", i,
                m->count - 1);
  *out = m->comms[i];
  return TPF_OK;
}

/* The thread rule for a call on the whole manager: enters every communicator, then holds the
 * rank; on a refusal, lets go of what it took and returns TPF_ESTATE naming the rule (nothing
 * changed). */
static tpf_status hold_all(tpf_manager *m, const char *call, bool *claimed) {
  *claimed = false;
  tpf_status rc = TPF_OK;
  int i = 0;
  for (; i < m->count && rc == TPF_OK; i++)
    rc = tpf__comm_enter(m->comms[i], call);
  if (rc != TPF_OK) i--; /* the refused one was not entered */
  if (rc == TPF_OK) rc = tpf__be_claim(m->be, call, NULL, claimed);
  if (rc == TPF_OK) return TPF_OK;
  while (i-- > 0)
    tpf__comm_leave(m->comms[i]);
  return rc;
}

static void release_all(tpf_manager *m, bool claimed) {
  if (claimed) tpf__be_release(m->be);
  for (int i = 0; i < m->count; i++)
    tpf__comm_leave(m->comms[i]);
}

static bool eligible(const tpf_comm *c) {
  return !c->cfg.external; /* fp8 communicators follow the shape too (SPEC §11) */
}

/* Phase 1: validate all; nothing changes on failure. Like the per-communicator call, this
 * allocates nothing: the scratch lives in each communicator. Phase 2: apply; roll back on the
 * (unexpected) failure of a backend. */
static tpf_status set_shape_held(tpf_manager *m, tpf_shape active) {
  for (int i = 0; i < m->count; i++) {
    tpf_comm *c = m->comms[i];
    if (eligible(c)) TPF_CHECK(tpf__comm_check_shape(c, active, &c->pending_bytes));
  }
  for (int i = 0; i < m->count; i++) {
    tpf_comm *c = m->comms[i];
    c->prev_active = c->active;
    if (!eligible(c)) continue;
    tpf_status rc = tpf__comm_apply_shape(c, active, c->pending_bytes);
    if (rc == TPF_OK) continue;
    for (int j = i - 1; j >= 0; j--) {
      tpf_comm *u = m->comms[j];
      uint64_t ob = 0;
      if (eligible(u) && tpf__comm_check_shape(u, u->prev_active, &ob) == TPF_OK &&
          tpf__be_reg_activate(u->be, u->reg, ob) == TPF_OK) {
        u->active = u->prev_active;
        u->epoch--;
      }
    }
    return rc;
  }
  return TPF_OK;
}

tpf_status tpf_manager_set_active_shape(tpf_manager *m, tpf_shape active) {
  TPF_CHECK_MANAGER(m, "tpf_manager_set_active_shape");
  bool claimed = false;
  TPF_CHECK(hold_all(m, "tpf_manager_set_active_shape", &claimed));
  const tpf_status rc = set_shape_held(m, active);
  release_all(m, claimed);
  return rc;
}

/* One record from the layout rules (tpf__layout_geometry), nothing re-derived here. The shape
 * was validated when it was applied; alignment belongs to the backend and was checked then. */
static tpf_status site_geometry(tpf_comm *c, tpf_site_geometry *g) {
  tpf_layout_desc d = tpf__comm_desc(c, c->active);
  tpf_layout_geom lg;
  TPF_CHECK(tpf__layout_geometry(&d, 1, &lg));
  const uint64_t row_bytes = c->cfg.capacity.cols * (uint64_t)tpf_dtype_size(c->cfg.dtype);
  memset(g, 0, sizeof *g);
  g->size = sizeof *g;
  g->comm = c;
  g->name = c->cfg.name;
  g->epoch = c->epoch;
  g->active = c->active;
  g->dtype = c->cfg.dtype;
  g->base = c->base;
  g->registered_bytes = c->reg_bytes;
  g->ld = c->cfg.capacity.cols;
  g->buffer_off_bytes = lg.buffer.offset_bytes;
  g->buffer_bytes = lg.buffer.bytes;
  g->buffer_rows = lg.buffer.rows;
  g->chunk_off_bytes = lg.local.offset_bytes;
  g->chunk_bytes = lg.local.bytes;
  g->chunk_rows = lg.local.rows;
  g->chunk_row_off = lg.local.offset_bytes / row_bytes; /* row_bytes > 0: validated shape */
  return TPF_OK;
}

tpf_status tpf_manager_geometry(tpf_manager *m, tpf_site_geometry *out, int cap, int *n) {
  TPF_CHECK_MANAGER(m, "tpf_manager_geometry");
  TPF_RETURN_IF(!n, TPF_EINVAL, "tpf_manager_geometry: n is NULL");
  TPF_RETURN_IF(cap < 0, TPF_EINVAL, "tpf_manager_geometry: cap %d is negative", cap);
  if (!out) {
    TPF_RETURN_IF(cap != 0, TPF_EINVAL,
                  "tpf_manager_geometry: out is NULL with cap %d (pass cap 0 to read the count)",
                  cap);
    *n = m->count;
    return TPF_OK;
  }
  /* Released layouts, oldest first; a field appended later adds its sizeof here. */
  static const size_t released[] = {sizeof(tpf_site_geometry)};
  const size_t size = out->size ? out->size : sizeof *out;
  TPF_CHECK(tpf__check_struct_size("tpf_manager_geometry", "out[0]", "tpf_site_geometry", out->size,
                                   released, TPF_ARRAY_SIZE(released)));
  TPF_RETURN_IF(cap < m->count, TPF_EINVAL,
                "tpf_manager_geometry: cap %d is below the manager's %d communicators: pass an "
                "array of at least %d records (out = NULL, cap = 0 reads the count)",
                cap, m->count, m->count);
  /* Every record is computed before any is written: a failure leaves out untouched. */
  for (int i = 0; i < m->count; i++) {
    tpf_site_geometry g;
    TPF_CHECK(site_geometry(m->comms[i], &g));
  }
  for (int i = 0; i < m->count; i++) {
    tpf_site_geometry g;
    (void)site_geometry(m->comms[i], &g); /* succeeded above on the same, unchanged state */
    g.size = size;
    memcpy((char *)out + (size_t)i * size, &g, size);
  }
  *n = m->count;
  return TPF_OK;
}

/* tpf_comm_destroy of a managed communicator (the recovery path of a failed one: destroy it on
 * every rank, then tpf_manager_add it again). Keeps the creation order of the others. */
static void forget(tpf_manager *m, tpf_comm *c) {
  for (int i = 0; i < m->count; i++) {
    if (m->comms[i] != c) continue;
    memmove(&m->comms[i], &m->comms[i + 1], (size_t)(m->count - i - 1) * sizeof *m->comms);
    m->count--;
    return;
  }
}

/* Refused by the thread rule (hold_all), it changes nothing: the manager and every communicator
 * stay as they were (it used to destroy the communicators up to the busy one). */
tpf_status tpf_manager_destroy(tpf_manager *m) {
  TPF_CHECK_MANAGER(m, "tpf_manager_destroy");
  bool claimed = false;
  TPF_CHECK(hold_all(m, "tpf_manager_destroy", &claimed));
  tpf__handle_remove(m, NULL);
  tpf_status rc = TPF_OK;
  /* Reverse creation order, so registrations unwind as they were made on every rank. */
  for (int i = m->count - 1; i >= 0; i--) {
    m->comms[i]->manager = NULL; /* destroyed as the manager's, not forgotten one by one */
    tpf_status r = tpf__comm_destroy_held(m->comms[i]);
    if (rc == TPF_OK) rc = r;
  }
  if (claimed) tpf__be_release(m->be);
  tpf__free(m->comms);
  tpf__free(m);
  return rc;
}
