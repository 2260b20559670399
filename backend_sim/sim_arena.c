/* The simulator's arena: every collective registration takes one extent of the world's shared
 * mmap. A leaf: it calls no other simulator file. */
#include "sim_internal.h"

/* ---- arena: first fit over a sorted, coalesced free list (world mutex held by callers) ---- */

tpf_status tpf_sim__arena_alloc(tpf_sim_world *w, uint64_t len, uint64_t *off) {
  len = (len + TPF_SIM_ARENA_ALIGN - 1) / TPF_SIM_ARENA_ALIGN * TPF_SIM_ARENA_ALIGN;
  for (tpf_sim_extent **pp = &w->free_list; *pp; pp = &(*pp)->next) {
    tpf_sim_extent *e = *pp;
    if (e->len < len) continue;
    *off = e->off;
    e->off += len;
    e->len -= len;
    if (e->len == 0) {
      *pp = e->next;
      tpf_free(e);
    }
    w->arena_used += len;
    return TPF_OK;
  }
  return tpf_set_error(TPF_ENOMEM,
                       "simulator arena exhausted: no free extent of %llu bytes in an arena of "
                       "%llu bytes (raise tpf_sim_config.arena_bytes)",
                       (unsigned long long)len, (unsigned long long)w->arena_bytes);
}

void tpf_sim__arena_free(tpf_sim_world *w, uint64_t off, uint64_t len) {
  len = (len + TPF_SIM_ARENA_ALIGN - 1) / TPF_SIM_ARENA_ALIGN * TPF_SIM_ARENA_ALIGN;
  w->arena_used -= len;
  tpf_sim_extent **pp = &w->free_list;
  while (*pp && (*pp)->off < off)
    pp = &(*pp)->next;
  tpf_sim_extent *next = *pp;
  /* Merge with the predecessor (found by a second walk: the list is short). */
  tpf_sim_extent *prev = NULL;
  for (tpf_sim_extent *e = w->free_list; e && e != next; e = e->next)
    prev = e;
  if (prev && prev->off + prev->len == off) {
    prev->len += len;
    if (next && prev->off + prev->len == next->off) {
      prev->len += next->len;
      prev->next = next->next;
      tpf_free(next);
    }
    return;
  }
  if (next && off + len == next->off) {
    next->off = off;
    next->len += len;
    return;
  }
  tpf_sim_extent *e = tpf_malloc(sizeof *e);
  if (!e) return; /* the extent is lost to the arena, nothing else: better than failing a destroy */
  e->off = off;
  e->len = len;
  e->next = next;
  *pp = e;
}
