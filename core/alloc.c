/* The hookable allocator (libuv's uv_replace_allocator) with live-allocation accounting and a
 * test-only budget, so allocator-failure loops can prove every failure is clean and leak-free.
 * The counters are C11 atomics because simulator ranks allocate from several threads. */
#include "internal.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* The allocator hooks: the only globals of the core. */
static tpf_malloc_fn tpf_alloc_m = malloc;
static tpf_calloc_fn tpf_alloc_c = calloc;
static tpf_realloc_fn tpf_alloc_r = realloc;
static tpf_free_fn tpf_alloc_f = free;
static atomic_long tpf_alloc_live;
static atomic_long tpf_alloc_budget = -1;

tpf_status tpf_set_allocator(tpf_malloc_fn m, tpf_calloc_fn c, tpf_realloc_fn r, tpf_free_fn f) {
  if (!m && !c && !r && !f) {
    m = malloc;
    c = calloc;
    r = realloc;
    f = free;
  }
  TPF_RETURN_IF(!m || !c || !r || !f, TPF_EINVAL,
                "tpf_set_allocator needs all four functions or none (got malloc=%s calloc=%s "
                "realloc=%s free=%s)",
                m ? "set" : "NULL", c ? "set" : "NULL", r ? "set" : "NULL", f ? "set" : "NULL");
  /* A block from the old hooks freed by the new ones is undefined behaviour ("free(): invalid
   * pointer"): refuse while any allocation is live. Setting the same four
   * hooks again changes nothing and is allowed at any time. */
  const long live = atomic_load(&tpf_alloc_live);
  const bool same = m == tpf_alloc_m && c == tpf_alloc_c && r == tpf_alloc_r && f == tpf_alloc_f;
  TPF_RETURN_IF(live != 0 && !same, TPF_ESTATE,
                "tpf_set_allocator: %ld allocations of the current allocator are still live; "
                "destroy every tpflex object (communicators, managers, worlds) first",
                live);
  tpf_alloc_m = m;
  tpf_alloc_c = c;
  tpf_alloc_r = r;
  tpf_alloc_f = f;
  return TPF_OK;
}

/* Takes one unit of the budget; false when it is exhausted. */
static bool budget_take(void) {
  long left = atomic_load(&tpf_alloc_budget);
  while (left >= 0) {
    if (left == 0) return false;
    if (atomic_compare_exchange_weak(&tpf_alloc_budget, &left, left - 1)) return true;
  }
  return true;
}

void *tpf_malloc(size_t n) {
  if (!budget_take()) return NULL;
  void *p = tpf_alloc_m(n ? n : 1);
  if (p) atomic_fetch_add(&tpf_alloc_live, 1);
  return p;
}

void *tpf_calloc(size_t count, size_t n) {
  if (!budget_take()) return NULL;
  void *p = tpf_alloc_c(count ? count : 1, n ? n : 1);
  if (p) atomic_fetch_add(&tpf_alloc_live, 1);
  return p;
}

void *tpf_realloc(void *p, size_t n) {
  if (!p) return tpf__malloc(n);
  if (!budget_take()) return NULL;
  return tpf_alloc_r(p, n ? n : 1);
}

void tpf_free(void *p) {
  if (!p) return;
  atomic_fetch_sub(&tpf_alloc_live, 1);
  tpf_alloc_f(p);
}

char *tpf__strdup(const char *s) {
  size_t n = strlen(s) + 1;
  char *d = tpf__malloc(n);
  if (d) memcpy(d, s, n);
  return d;
}

long tpf__alloc_live_count(void) {
  return atomic_load(&tpf_alloc_live);
}

void tpf__alloc_set_budget(long allocations_left) {
  atomic_store(&tpf_alloc_budget, allocations_left < 0 ? -1 : allocations_left);
}
