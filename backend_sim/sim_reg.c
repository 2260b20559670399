/* Collective registrations in the shared arena, and the canary beyond the active layout.
 *
 * Method: reg_create is a rendezvous. The k-th call of every rank meets in group k; the last rank
 * to arrive compares every rank's size and name (any difference: TPF_EMISMATCH on all ranks),
 * takes one arena extent for all P blocks, zeroes the data and the flags, and wakes the others.
 * An arrival waits at most the world's timeout (TPF_ETIMEOUT, and the group is marked failed so
 * that late ranks fail too instead of waiting). The extent is returned when the last rank
 * destroys its handle, so a peer that is slow to let go never finds its memory reused.
 *
 * Canary: after every reg_activate the owner fills data[active_bytes, data_bytes) with a pattern
 * that depends on the offset, and after every successful operation it checks the pattern. A
 * write outside the active layout (through a view taken before the active shape shrank, or by a
 * schedule) is caught on the next operation: TPF_ESTATE, "bytes beyond the active layout were
 * written: rows a..b of 'name'" with the rank and the first offset.
 */
#define _POSIX_C_SOURCE 200809L
#include "sim_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

unsigned char *tpf_sim__data(const tpf_sim_shared *sh, int rank) {
  return sh->base + (uint64_t)rank * sh->block_bytes;
}

_Atomic uint64_t *tpf_sim__flag(const tpf_sim_shared *sh, int receiver, int sender, uint32_t tag) {
  unsigned char *p = tpf_sim__data(sh, receiver) + sh->data_span;
  return (_Atomic uint64_t *)(void *)p + (size_t)sender * TPF_MAX_TAGS + tag;
}

/* Two ready words per sender, by sequence parity: a peer may announce operation n+1 before this
 * rank has read its announcement of n (it cannot get two ahead: announcing n+2 needs this rank's
 * announcement of n+1). */
_Atomic uint64_t *tpf_sim__ready(const tpf_sim_shared *sh, int receiver, int sender, uint64_t seq) {
  unsigned char *p = tpf_sim__data(sh, receiver) + sh->data_span;
  return (_Atomic uint64_t *)(void *)p + (size_t)sh->tp_size * TPF_MAX_TAGS + (size_t)sender * 2 +
         (size_t)(seq & 1u);
}

bool tpf_sim__shared_layout(tpf_sim_shared *sh, int P, uint64_t bytes) {
  sh->tp_size = P;
  sh->data_bytes = bytes;
  if (bytes > UINT64_MAX - 4096u) return false;
  sh->data_span = (bytes + 63u) / 64u * 64u;
  /* flags [P][tags], ready words [P][2], the doorbell word (one u64 slot) */
  uint64_t sync_bytes = ((uint64_t)P * TPF_MAX_TAGS + 2u * (uint64_t)P + 1u) * sizeof(uint64_t);
  sh->block_bytes = (sh->data_span + sync_bytes + 63u) / 64u * 64u;
  return tpf_mul_u64(sh->block_bytes, (uint64_t)P, &sh->arena_len);
}

void tpf_sim__free_groups(tpf_sim_world *w) {
  while (w->groups) {
    tpf_sim_group *g = w->groups;
    w->groups = g->next;
    tpf_free(g);
  }
}

/* The world condition's next wakeup: one poll period from now (it runs on CLOCK_REALTIME). Whether
 * a wait ran out is judged on the monotonic clock by tpf_sim__expired, against the bound in force
 * at each wakeup. */
void tpf_sim__poll_deadline(struct timespec *ts) {
  clock_gettime(CLOCK_REALTIME, ts);
  ts->tv_nsec += (long)TPF_SIM_POLL_NS;
  while (ts->tv_nsec >= 1000000000L) {
    ts->tv_sec++;
    ts->tv_nsec -= 1000000000L;
  }
}

/* Called by the last arrival, world mutex held: checks agreement and builds the shared region. */
static void group_decide(tpf_sim_world *w, tpf_sim_group *g) {
  int P = w->tp_size;
  g->decided = true;
  for (int r = 1; r < P; r++) {
    if (g->bytes[r] != g->bytes[0] || strcmp(g->names[r], g->names[0]) != 0) {
      g->status = TPF_EMISMATCH;
      snprintf(g->msg, sizeof g->msg,
               "registration %llu differs between ranks: rank 0 registers '%s' with %llu bytes, "
               "rank %d '%s' with %llu bytes",
               (unsigned long long)g->k, g->names[0], (unsigned long long)g->bytes[0], r,
               g->names[r], (unsigned long long)g->bytes[r]);
      return;
    }
  }
  tpf_sim_shared *sh = tpf_calloc(1, sizeof *sh);
  if (!sh) {
    g->status = TPF_ENOMEM;
    snprintf(g->msg, sizeof g->msg, "registration '%s': shared descriptor", g->names[0]);
    return;
  }
  snprintf(sh->name, sizeof sh->name, "%s", g->names[0]);
  if (!tpf_sim__shared_layout(sh, P, g->bytes[0]) ||
      tpf_sim__arena_alloc(w, sh->arena_len, &sh->arena_off) != TPF_OK) {
    g->status = TPF_ENOMEM;
    snprintf(g->msg, sizeof g->msg,
             "registration '%s' of %llu bytes x %d ranks does not fit the simulator arena (%llu "
             "bytes; raise tpf_sim_config.arena_bytes)",
             g->names[0], (unsigned long long)g->bytes[0], P, (unsigned long long)w->arena_bytes);
    tpf_free(sh);
    return;
  }
  sh->base = w->arena + sh->arena_off;
  sh->refs = P;
  for (int r = 0; r < P; r++) {
    memset(tpf_sim__data(sh, r), 0, (size_t)sh->data_span);
    for (int s = 0; s < P; s++) {
      for (uint32_t t = 0; t < TPF_MAX_TAGS; t++)
        atomic_init(tpf_sim__flag(sh, r, s, t), 0);
      atomic_init(tpf_sim__ready(sh, r, s, 0), 0);
      atomic_init(tpf_sim__ready(sh, r, s, 1), 0);
    }
    atomic_init(tpf_sim__bell(sh, r), 0u);
  }
  atomic_fetch_add(&w->registrations, 1);
  w->live_regs++;
  g->sh = sh;
  g->status = TPF_OK;
}

static void group_release(tpf_sim_world *w, tpf_sim_group *g) {
  if (++g->taken < w->tp_size) return;
  for (tpf_sim_group **pp = &w->groups; *pp; pp = &(*pp)->next) {
    if (*pp == g) {
      *pp = g->next;
      tpf_free(g);
      return;
    }
  }
}

/* Formats the ranks of a mask ("1, 3") into buf. */
static void mask_list(uint64_t mask, int P, char *buf, size_t len) {
  size_t n = 0;
  buf[0] = '\0';
  for (int r = 0; r < P && n + 8 < len; r++)
    if ((mask >> (unsigned)r) & 1u)
      n += (size_t)snprintf(buf + n, len - n, "%s%d", n ? ", " : "", r);
}

static int mask_count(uint64_t mask) {
  int n = 0;
  for (; mask; mask &= mask - 1)
    n++;
  return n;
}

static tpf_status reg_create_held(tpf_sim_rank *rk, const char *name, uint64_t bytes, tpf_reg **reg,
                                  void **local) {
  tpf_sim_world *w = rk->world;
  if (!reg || !local || bytes == 0)
    return tpf_set_error(TPF_EINVAL, "sim reg_create: %s", bytes ? "NULL out" : "zero bytes");
  /* A rank that fails locally still takes its place in rendezvous k and fails the group at once:
   * the peers get TPF_EBACKEND now instead of a timeout, and every rank's registration count
   * stays in step, so the next registration of the world pairs up again. */
  tpf_status local_st = tpf_sim__fault_call(w, "reg_create", rk->rank);
  tpf_sim_reg *h = NULL;
  if (local_st == TPF_OK) {
    h = tpf_calloc(1, sizeof *h);
    if (!h) local_st = tpf_set_error(TPF_ENOMEM, "sim reg_create: handle");
  }
  char local_msg[TPF_SIM_MSG_LEN];
  snprintf(local_msg, sizeof local_msg, "%s", local_st == TPF_OK ? "" : tpf_last_error());
  uint64_t k = rk->reg_count++;

  pthread_mutex_lock(&w->mu);
  tpf_sim_group *g = w->groups;
  while (g && g->k != k)
    g = g->next;
  if (!g) {
    g = tpf_calloc(1, sizeof *g);
    if (!g) {
      pthread_mutex_unlock(&w->mu);
      tpf_free(h);
      return tpf_set_error(TPF_ENOMEM, "sim reg_create: rendezvous");
    }
    g->k = k;
    g->next = w->groups;
    w->groups = g;
  }
  g->bytes[rk->rank] = bytes;
  snprintf(g->names[rk->rank], TPF_SIM_NAME_LEN, "%s", name ? name : "");
  g->arrived++;
  g->arrived_mask |= 1ull << (unsigned)rk->rank;
  if (local_st != TPF_OK) {
    if (!g->decided) {
      g->decided = true;
      g->status = TPF_EBACKEND;
      snprintf(g->msg, sizeof g->msg, "registration %llu ('%s'): rank %d failed: %.380s",
               (unsigned long long)k, g->names[rk->rank], rk->rank, local_msg);
      pthread_cond_broadcast(&w->cv);
    }
    group_release(w, g);
    pthread_mutex_unlock(&w->mu);
    return tpf_set_error(local_st, "%s", local_msg);
  }
  bool late = g->decided; /* the group gave up (or failed) before this rank arrived */
  if (!g->decided && g->arrived == w->tp_size) {
    group_decide(w, g);
    pthread_cond_broadcast(&w->cv);
  }
  const uint64_t start = tpf_sim__now_ns();
  unsigned bound = tpf_sim__timeout_ms(w);
  while (!g->decided) {
    struct timespec dl;
    tpf_sim__poll_deadline(&dl);
    pthread_cond_timedwait(&w->cv, &w->mu, &dl);
    if (!g->decided && tpf_sim__expired(w, start, &bound)) {
      g->decided = true;
      g->bound_ms = bound;
      g->status = TPF_ETIMEOUT;
      g->missing_mask = ~g->arrived_mask & (w->tp_size >= 64 ? ~0ull : (1ull << w->tp_size) - 1);
      snprintf(g->msg, sizeof g->msg, "registration %llu ('%s') timed out", (unsigned long long)k,
               g->names[rk->rank]);
      pthread_cond_broadcast(&w->cv);
    }
  }
  tpf_status st = g->status;
  char msg[TPF_SIM_MSG_LEN];
  if (st == TPF_ETIMEOUT) {
    /* Each rank names itself and the ranks it waited for (the timeout contract). */
    char missing[200];
    mask_list(g->missing_mask, w->tp_size, missing, sizeof missing);
    if (late)
      snprintf(msg, sizeof msg,
               "timeout after %u ms: rank %d arrived at registration %llu ('%s') after the other "
               "ranks gave up waiting for rank(s) %s",
               g->bound_ms, rk->rank, (unsigned long long)k, g->names[rk->rank], missing);
    else
      snprintf(msg, sizeof msg,
               "timeout after %u ms: rank %d, registration %llu ('%s') waits for rank(s) %s; "
               "only %d of %d ranks arrived",
               g->bound_ms, rk->rank, (unsigned long long)k, g->names[rk->rank], missing,
               w->tp_size - mask_count(g->missing_mask), w->tp_size);
  } else {
    snprintf(msg, sizeof msg, "%s", g->msg);
  }
  tpf_sim_shared *sh = g->sh;
  group_release(w, g);
  pthread_mutex_unlock(&w->mu);

  if (st != TPF_OK) {
    tpf_free(h);
    return tpf_set_error(st, "%s", msg);
  }
  h->sh = sh;
  h->rank = rk->rank;
  h->canary_off = sh->data_bytes; /* active == capacity until the first set */
  *reg = (tpf_reg *)h;
  *local = tpf_sim__data(sh, rk->rank);
  return TPF_OK;
}

/* ---- process mode ----
 *
 * Method: the k-th reg_create of every process is one registration, in a POSIX shared memory
 * segment of its own named "<job>-k" (job: "/tpflex-sim-<pid of rank 0>-<nonce>", agreed when
 * the backend was created), so every rank knows the name without being told. Three exchanges
 * over the bootstrap: (1) every rank's proposal (its local status, size and name): any local
 * failure fails every rank naming the rank, any difference is TPF_EMISMATCH on every rank, as in
 * threads mode, and nothing is created; (2) rank 0 creates, sizes (posix_fallocate: a full
 * /dev/shm is a clean TPF_ENOMEM, not a SIGBUS later) and maps the segment, and says how that
 * went; (3) every other rank maps it and says how that went. After (3), and on every failure
 * path after (1), every rank unlinks the name (ENOENT is fine), so the segment has no name once
 * every rank has mapped it: it goes away with the last mapping whatever way the processes end.
 * The one window where a name exists is between rank 0's creation and the others' unlink; a
 * rank killed there is survived by the others, who unlink it when their exchange fails, and a
 * job killed whole there is swept by a backend creation on the machine a minute later or more
 * (the pid in the name no longer runs: tpf_sim__shm_sweep). Destroy is local: each process unmaps
 * its mapping, so a peer still writing into this rank's block writes into memory it maps itself. */

static tpf_status procs_fail(const char *seg, tpf_sim_reg *h, tpf_sim_shared *sh, tpf_status st,
                             const char *msg) {
  if (seg) tpf_sim__shm_unlink(seg);
  tpf_free(h);
  tpf_free(sh);
  return tpf_set_error(st, "%s", msg);
}

/* Exchange (1)'s verdict, the same on every rank: a rank's local failure (its status; this rank's
 * own message when it is the one), else the first size or name that differs from rank 0's. */
static tpf_status procs_agree(int P, int me, uint64_t k, tpf_sim_proposal *all,
                              const tpf_sim_proposal *mine, char *msg, size_t n) {
  for (int q = 0; q < P; q++) {
    if (all[q].status == TPF_OK) continue;
    all[q].msg[sizeof all[q].msg - 1] = '\0';
    all[q].name[sizeof all[q].name - 1] = '\0';
    if (q == me)
      snprintf(msg, n, "%s", mine->msg);
    else
      snprintf(msg, n, "registration %llu ('%.60s'): rank %d failed: %.120s", (unsigned long long)k,
               all[q].name, q, all[q].msg);
    return (tpf_status)all[q].status;
  }
  for (int q = 1; q < P; q++) {
    all[q].name[sizeof all[q].name - 1] = '\0';
    if (all[q].bytes != all[0].bytes || strcmp(all[q].name, all[0].name) != 0) {
      snprintf(msg, n,
               "registration %llu differs between ranks: rank 0 registers '%s' with %llu bytes, "
               "rank %d '%s' with %llu bytes",
               (unsigned long long)k, all[0].name, (unsigned long long)all[0].bytes, q, all[q].name,
               (unsigned long long)all[q].bytes);
      return TPF_EMISMATCH;
    }
  }
  return TPF_OK;
}

/* Exchanges (2) and (3): rank 0 creates the segment, then the others map it; every rank learns
 * how each went. On failure nothing stays mapped here (the caller unlinks the name). */
static tpf_status procs_map(tpf_sim_world *w, uint64_t k, const char *seg, const char *name,
                            uint64_t bytes, unsigned char **base_out, char *msg, size_t n) {
  const int P = w->tp_size, me = w->proc_rank;
  unsigned char *base = NULL;
  for (int phase = 0; phase < 2; phase++) {
    tpf_sim_outcome out, outs[TPF_MAX_RANKS];
    memset(&out, 0, sizeof out);
    if ((phase == 0) == (me == 0)) {
      tpf_status ms =
          phase == 0 ? tpf_sim__shm_create(seg, bytes, &base) : tpf_sim__shm_map(seg, bytes, &base);
      out.status = (int32_t)ms;
      if (ms != TPF_OK) snprintf(out.msg, sizeof out.msg, "%s", tpf_last_error());
    }
    tpf_status st = w->boot.allgather(w->boot.ctx, &out, outs, sizeof out);
    if (st != TPF_OK)
      snprintf(msg, n, "registration %llu ('%s'): %s", (unsigned long long)k, name,
               tpf_last_error());
    for (int q = 0; st == TPF_OK && q < P; q++) {
      if (outs[q].status == TPF_OK) continue;
      st = (tpf_status)outs[q].status;
      outs[q].msg[sizeof outs[q].msg - 1] = '\0';
      if (q == me)
        snprintf(msg, n, "%s", outs[q].msg);
      else
        snprintf(msg, n, "registration %llu ('%s'): rank %d failed to %s its shared memory: %s",
                 (unsigned long long)k, name, q, phase == 0 ? "create" : "map", outs[q].msg);
    }
    if (st != TPF_OK) {
      if (base) tpf_sim__shm_unmap(base, bytes);
      return st;
    }
  }
  *base_out = base;
  return TPF_OK;
}

static tpf_status reg_create_procs(tpf_sim_rank *rk, const char *name, uint64_t bytes,
                                   tpf_reg **reg, void **local) {
  tpf_sim_world *w = rk->world;
  const int P = w->tp_size, me = w->proc_rank;
  if (!reg || !local || bytes == 0)
    return tpf_set_error(TPF_EINVAL, "sim reg_create: %s", bytes ? "NULL out" : "zero bytes");
  /* A local failure still takes part in the exchanges, so that the peers fail at once naming
   * this rank and every rank's registration count stays in step. */
  tpf_status local_st = tpf_sim__fault_call(w, "reg_create", me);
  tpf_sim_reg *h = NULL;
  tpf_sim_shared *sh = NULL;
  if (local_st == TPF_OK) {
    h = tpf_calloc(1, sizeof *h);
    sh = tpf_calloc(1, sizeof *sh);
    if (!h || !sh) local_st = tpf_set_error(TPF_ENOMEM, "sim reg_create: handle");
  }
  if (local_st == TPF_OK && !tpf_sim__shared_layout(sh, P, bytes))
    local_st = tpf_set_error(TPF_EOVERFLOW, "sim reg_create '%s': %llu bytes x %d ranks overflow",
                             name ? name : "", (unsigned long long)bytes, P);
  tpf_sim_proposal mine, all[TPF_MAX_RANKS];
  memset(&mine, 0, sizeof mine);
  mine.status = (int32_t)local_st;
  mine.bytes = bytes;
  snprintf(mine.name, sizeof mine.name, "%s", name ? name : "");
  if (local_st != TPF_OK) snprintf(mine.msg, sizeof mine.msg, "%s", tpf_last_error());
  const uint64_t k = rk->reg_count++;
  char seg[sizeof w->job + 24], msg[TPF_SIM_MSG_LEN];
  snprintf(seg, sizeof seg, "%s-%llu", w->job, (unsigned long long)k);

  tpf_status st = w->boot.allgather(w->boot.ctx, &mine, all, sizeof mine); /* (1) */
  if (st != TPF_OK)
    snprintf(msg, sizeof msg, "registration %llu ('%s'): %s", (unsigned long long)k, mine.name,
             tpf_last_error());
  else
    st = procs_agree(P, me, k, all, &mine, msg, sizeof msg);
  unsigned char *base = NULL;
  if (st == TPF_OK) st = procs_map(w, k, seg, mine.name, sh->arena_len, &base, msg, sizeof msg);
  if (st != TPF_OK) return procs_fail(seg, h, sh, local_st != TPF_OK ? local_st : st, msg);
  tpf_sim__shm_unlink(seg); /* every rank has it mapped: no name is left */
  snprintf(sh->name, sizeof sh->name, "%s", mine.name);
  sh->base = base;
  sh->mapped = true;
  sh->refs = 1;
  pthread_mutex_lock(&w->mu);
  w->live_regs++;
  w->arena_used += sh->arena_len;
  pthread_mutex_unlock(&w->mu);
  atomic_fetch_add(&w->registrations, 1);
  h->sh = sh;
  h->rank = me;
  h->canary_off = sh->data_bytes;
  *reg = (tpf_reg *)h;
  *local = tpf_sim__data(sh, me);
  return TPF_OK;
}

tpf_status tpf_sim__reg_create(tpf_backend *be, const char *name, uint64_t bytes, tpf_reg **reg,
                               void **local) {
  tpf_sim_rank *rk = (tpf_sim_rank *)be;
  TPF_CHECK(tpf_sim__enter(rk, "reg_create"));
  tpf_status st = rk->world->procs ? reg_create_procs(rk, name, bytes, reg, local)
                                   : reg_create_held(rk, name, bytes, reg, local);
  tpf_sim__leave(rk);
  return st;
}

tpf_status tpf_sim__reg_destroy(tpf_backend *be, tpf_reg *reg) {
  tpf_sim_rank *rk = (tpf_sim_rank *)be;
  tpf_sim_world *w = rk->world;
  tpf_sim_reg *h = (tpf_sim_reg *)reg;
  /* Counted for the fault loop, but a destroy never fails: the caller could not recover. */
  atomic_fetch_add(&w->backend_calls, 1);
  if (!h) return tpf_set_error(TPF_EINVAL, "sim reg_destroy: NULL registration");
  TPF_CHECK(tpf_sim__enter(rk, "reg_destroy"));
  tpf_sim__fault_forget(rk, h->sh); /* no held signal may outlive this rank's handle */
  pthread_mutex_lock(&w->mu);
  tpf_sim_shared *sh = h->sh;
  if (--sh->refs == 0) {
    if (sh->mapped) { /* process mode: this process's mapping; the peers keep theirs */
      tpf_sim__shm_unmap(sh->base, sh->arena_len);
      w->arena_used -= sh->arena_len;
    } else {
      tpf_sim__arena_free(w, sh->arena_off, sh->arena_len);
    }
    w->live_regs--;
    tpf_free(sh);
  }
  pthread_mutex_unlock(&w->mu);
  tpf_free(h);
  tpf_sim__leave(rk);
  return TPF_OK;
}

static inline unsigned char canary_byte(uint64_t off, int rank) {
  /* Depends on the offset and the owner, so that bytes copied from elsewhere in a canary, or from
   * the same offset of a peer's canary (an over-long transfer), are still seen. */
  return (unsigned char)(0xA5u ^ (unsigned)(off & 0xFFu) ^ (unsigned)((off >> 8) * 0x3Bu) ^
                         (unsigned)(rank * 0x6Du + 1));
}

static tpf_status reg_activate_held(tpf_sim_rank *rk, tpf_sim_reg *h, uint64_t active_bytes) {
  TPF_CHECK(tpf_sim__fault_call(rk->world, "reg_activate", rk->rank));
  if (!h) return tpf_set_error(TPF_EINVAL, "sim reg_activate: NULL registration");
  if (active_bytes > h->sh->data_bytes)
    return tpf_set_error(TPF_ECAPACITY,
                         "sim reg_activate: active layout of %llu bytes exceeds the %llu bytes "
                         "registered for '%s'",
                         (unsigned long long)active_bytes, (unsigned long long)h->sh->data_bytes,
                         h->sh->name);
  /* Bytes from canary_off on hold the canary already (every operation verifies them): a shrink
   * fills the rows it gives up, a grow fills nothing, and only a registration whose canary was
   * found overwritten is filled whole. So a set_active_shape costs what changed, not capacity. */
  unsigned char *d = tpf_sim__data(h->sh, h->rank);
  const uint64_t end = h->canary_dirty ? h->sh->data_bytes : h->canary_off;
  for (uint64_t o = active_bytes; o < end; o++)
    d[o] = canary_byte(o, h->rank);
  h->canary_off = active_bytes;
  h->canary_dirty = false;
  return TPF_OK;
}

tpf_status tpf_sim__reg_activate(tpf_backend *be, tpf_reg *reg, uint64_t active_bytes) {
  tpf_sim_rank *rk = (tpf_sim_rank *)be;
  TPF_CHECK(tpf_sim__enter(rk, "reg_activate"));
  tpf_status st = reg_activate_held(rk, (tpf_sim_reg *)reg, active_bytes);
  tpf_sim__leave(rk);
  return st;
}

tpf_status tpf_sim__canary_verify(tpf_sim_reg *h, const char *comm, uint64_t row_bytes) {
  const unsigned char *d = tpf_sim__data(h->sh, h->rank);
  uint64_t first = UINT64_MAX, last = 0;
  for (uint64_t o = h->canary_off; o < h->sh->data_bytes; o++)
    if (d[o] != canary_byte(o, h->rank)) {
      if (first == UINT64_MAX) first = o;
      last = o;
    }
  if (first == UINT64_MAX) return TPF_OK;
  h->canary_dirty = true;
  /* The registration is a sequence of rows of the communicator's width (every layout's chunks
   * are whole rows); name the rows the stray bytes fall in. Not a backend failure: most often a
   * view taken before the active shape shrank (TPF_ESTATE, as for any stale object). */
  const uint64_t rb = row_bytes ? row_bytes : 1;
  return tpf_set_error(TPF_ESTATE,
                       "bytes beyond the active layout were written: rows %llu..%llu of '%s' on "
                       "rank %d (the active layout ends at row %llu of the %llu registered; the "
                       "canary first differs at byte offset %llu: found 0x%02x, expected 0x%02x). "
                       "A view taken before the active shape shrank is stale: take views again "
                       "after every set_active_shape",
                       (unsigned long long)(first / rb), (unsigned long long)(last / rb),
                       comm ? comm : h->sh->name, h->rank, (unsigned long long)(h->canary_off / rb),
                       (unsigned long long)(h->sh->data_bytes / rb), (unsigned long long)first,
                       d[first], canary_byte(first, h->rank));
}
