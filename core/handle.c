/* The handle table: which communicators, managers and simulator worlds are
 * live, so that a call on a destroyed one is TPF_EINVAL instead of a use-after-free.
 *
 * Method: every object is entered here when it is created and removed when it is destroyed;
 * every public call looks its handle up before it reads a byte of the object. A destroyed (or
 * never created) handle is not found, so nothing freed is ever read: AddressSanitizer sees no
 * access at all. A magic word in the object could not do that (reading it after free is the
 * use-after-free), and a tombstone kept allocated per destroyed object would grow without bound.
 * A small ring of the most recently destroyed handles keeps their kind and name for the message
 * ("communicator 'fc1_fprop' was destroyed"). Limit: the allocator may hand a destroyed object's
 * address to a later object of the same kind; a stale handle then names that new object (it is
 * live again), which no pointer-based scheme can tell apart.
 *
 * The table is an open-addressing hash set (linear probing, backward-shift deletion) behind a
 * C11 atomic_flag spin lock (the core uses no pthreads); every critical section is a few probes
 * and never calls out. It is allocated with the C library's calloc/free, not the hookable
 * allocator: it is bookkeeping of the library, and counting it as live would make
 * tpf_set_allocator refuse forever. It is freed when the last handle goes. */
#include "internal.h"

#include <threads.h>

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  const void *p;
  int kind;
} slot;

static atomic_flag g_lock = ATOMIC_FLAG_INIT;
static slot *g_tab;    /* g_cap entries, NULL p = empty */
static size_t g_cap;   /* power of two, or 0 */
static size_t g_count; /* live handles */

#define GRAVE_COUNT 64
#define GRAVE_NAME 64
typedef struct {
  const void *p;
  int kind;
  char name[GRAVE_NAME];
} grave;
static grave g_graves[GRAVE_COUNT];
static size_t g_grave_next;

static void lock(void) {
  while (atomic_flag_test_and_set_explicit(&g_lock, memory_order_acquire)) {
    thrd_yield(); /* a preempted holder gets the core back (2 cores, many rank threads) */
  }
}
static void unlock(void) {
  atomic_flag_clear_explicit(&g_lock, memory_order_release);
}

static size_t hash(const void *p, size_t cap) {
  uint64_t x = (uint64_t)(uintptr_t)p;
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return (size_t)x & (cap - 1);
}

/* Index of p in the table, or g_cap when absent. Lock held. */
static size_t find(const void *p) {
  if (!g_cap) return 0;
  for (size_t i = hash(p, g_cap);; i = (i + 1) & (g_cap - 1)) {
    if (g_tab[i].p == p) return i;
    if (!g_tab[i].p) return g_cap;
  }
}

static void insert(slot *tab, size_t cap, slot s) {
  size_t i = hash(s.p, cap);
  while (tab[i].p)
    i = (i + 1) & (cap - 1);
  tab[i] = s;
}

const char *tpf__handle_kind_name(int kind) {
  switch (kind) {
  case TPF_HANDLE_COMM:
    return "communicator";
  case TPF_HANDLE_MANAGER:
    return "manager";
  case TPF_HANDLE_WORLD:
    return "simulator world";
  case TPF_HANDLE_FAULT:
    return "fault backend";
  default:
    return "object";
  }
}

tpf_status tpf_handle_add(const void *p, int kind) {
  TPF_RETURN_IF(!p, TPF_EINVAL, "handle table: NULL %s", tpf__handle_kind_name(kind));
  lock();
  if (2 * (g_count + 1) > g_cap) { /* keep the load at most 1/2 */
    size_t cap = g_cap ? 2 * g_cap : 64;
    slot *tab = calloc(cap, sizeof *tab);
    if (!tab) {
      unlock();
      return tpf_set_error(TPF_ENOMEM, "handle table: cannot grow to %zu entries", cap);
    }
    for (size_t i = 0; i < g_cap; i++)
      if (g_tab[i].p) insert(tab, cap, g_tab[i]);
    free(g_tab);
    g_tab = tab;
    g_cap = cap;
  }
  slot s = {p, kind};
  insert(g_tab, g_cap, s);
  g_count++;
  /* The address is live again: it no longer names a destroyed object. */
  for (size_t i = 0; i < GRAVE_COUNT; i++)
    if (g_graves[i].p == p) g_graves[i].p = NULL;
  unlock();
  return TPF_OK;
}

void tpf_handle_remove(const void *p, const char *name) {
  lock();
  size_t i = find(p);
  if (g_cap && i < g_cap) {
    grave *g = &g_graves[g_grave_next++ % GRAVE_COUNT];
    g->p = p;
    g->kind = g_tab[i].kind;
    snprintf(g->name, sizeof g->name, "%s", name ? name : "");
    /* Backward-shift deletion: pull later entries of the probe run into the gap. */
    size_t gap = i;
    for (size_t j = (i + 1) & (g_cap - 1); g_tab[j].p; j = (j + 1) & (g_cap - 1)) {
      size_t home = hash(g_tab[j].p, g_cap);
      /* j's entry may move to the gap when its home is not cyclically in (gap, j]. */
      bool stays = gap <= j ? (gap < home && home <= j) : (gap < home || home <= j);
      if (!stays) {
        g_tab[gap] = g_tab[j];
        gap = j;
      }
    }
    g_tab[gap].p = NULL;
    g_count--;
    if (g_count == 0) {
      free(g_tab);
      g_tab = NULL;
      g_cap = 0;
    }
  }
  unlock();
}

bool tpf_handle_live(const void *p, int kind) {
  if (!p) return false;
  lock();
  size_t i = find(p);
  bool live = g_cap && i < g_cap && g_tab[i].kind == kind;
  unlock();
  return live;
}

tpf_status tpf_handle_check(const void *p, int kind, const char *call) {
  const char *what = tpf__handle_kind_name(kind);
  TPF_RETURN_IF(!p, TPF_EINVAL, "%s: %s is NULL", call, what);
  if (tpf__handle_live(p, kind)) return TPF_OK;
  char name[GRAVE_NAME] = "";
  bool dead = false;
  lock();
  /* The most recent grave of this address. */
  for (size_t k = 1; k <= GRAVE_COUNT; k++) {
    const grave *g = &g_graves[(g_grave_next - k) % GRAVE_COUNT];
    if (g->p == p && g->kind == kind) {
      dead = true;
      memcpy(name, g->name, sizeof name);
      break;
    }
  }
  unlock();
  if (dead && name[0])
    return tpf_set_error(TPF_EINVAL, "%s: %s '%s' (%p) was destroyed; create a new one", call, what,
                         name, p);
  if (dead)
    return tpf_set_error(TPF_EINVAL, "%s: %s %p was destroyed; create a new one", call, what, p);
  return tpf_set_error(
      TPF_EINVAL, "%s: %p is not a live %s (destroyed, or never created by tpflex)", call, p, what);
}

size_t tpf__handle_count(void) {
  lock();
  size_t n = g_count;
  unlock();
  return n;
}
