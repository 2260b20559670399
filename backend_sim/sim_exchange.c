/* The simulator's allgather (tpf_backend_ops.allgather): the fingerprint exchange of
 * tpf_comm_create.
 *
 * Method: a rendezvous like reg_create's, in its own list. The k-th allgather of every rank meets
 * in exchange k; each arrival copies its bytes into slot r of the exchange, the last one wakes
 * the others, and every rank copies all P slots out. Ranks as processes (tpf_sim_backend_create):
 * the bootstrap's allgather instead. Ranks that pass different sizes fail with
 * TPF_EMISMATCH; an arrival waits at most the world's timeout (TPF_ETIMEOUT naming the missing
 * ranks, and the exchange is marked failed so a late rank fails at once). Not a counted backend
 * call for fault injection: the fault plans count what they did in 0.1.
 */
#define _POSIX_C_SOURCE 200809L
#include "sim_internal.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

struct tpf_sim_exchange {
  struct tpf_sim_exchange *next;
  uint64_t k;
  int arrived, taken;
  bool decided;
  tpf_status status;
  size_t bytes; /* per rank, as the first arrival gave it */
  uint64_t arrived_mask, missing_mask;
  unsigned bound_ms; /* the bound the exchange ran out of */
  char msg[TPF_SIM_MSG_LEN];
  unsigned char *data; /* P * bytes */
};

void tpf_sim__free_exchanges(tpf_sim_world *w) {
  while (w->exchanges) {
    tpf_sim_exchange *x = w->exchanges;
    w->exchanges = x->next;
    tpf_free(x->data);
    tpf_free(x);
  }
}

uint64_t tpf_sim__pending_exchanges(const tpf_sim_world *w) {
  uint64_t n = 0;
  for (const tpf_sim_exchange *x = w->exchanges; x; x = x->next)
    n++;
  return n;
}

static void release(tpf_sim_world *w, tpf_sim_exchange *x) {
  if (++x->taken < w->tp_size) return;
  for (tpf_sim_exchange **pp = &w->exchanges; *pp; pp = &(*pp)->next) {
    if (*pp == x) {
      *pp = x->next;
      tpf_free(x->data);
      tpf_free(x);
      return;
    }
  }
}

static tpf_sim_exchange *find_or_add(tpf_sim_world *w, uint64_t k, size_t bytes) {
  for (tpf_sim_exchange *x = w->exchanges; x; x = x->next)
    if (x->k == k) return x;
  tpf_sim_exchange *x = tpf_calloc(1, sizeof *x);
  if (!x) return NULL;
  x->data = tpf_calloc((size_t)w->tp_size, bytes);
  if (!x->data) {
    tpf_free(x);
    return NULL;
  }
  x->k = k;
  x->bytes = bytes;
  x->next = w->exchanges;
  w->exchanges = x;
  return x;
}

static tpf_status allgather_held(tpf_sim_rank *rk, const void *mine, void *all, size_t bytes) {
  tpf_sim_world *w = rk->world;
  if (!mine || !all || bytes == 0)
    return tpf_set_error(TPF_EINVAL, "sim allgather: %s", bytes ? "NULL buffer" : "zero bytes");
  const uint64_t k = rk->exchange_count++;
  pthread_mutex_lock(&w->mu);
  tpf_sim_exchange *x = find_or_add(w, k, bytes);
  if (!x) {
    pthread_mutex_unlock(&w->mu);
    return tpf_set_error(TPF_ENOMEM, "sim allgather: %d x %zu bytes", w->tp_size, bytes);
  }
  const bool late = x->decided;
  x->arrived++;
  x->arrived_mask |= 1ull << (unsigned)rk->rank;
  if (!x->decided && bytes != x->bytes) {
    x->decided = true;
    x->status = TPF_EMISMATCH;
    snprintf(x->msg, sizeof x->msg,
             "exchange %llu: rank %d contributes %zu bytes, another rank %zu (different tpflex "
             "versions?)",
             (unsigned long long)k, rk->rank, bytes, x->bytes);
    pthread_cond_broadcast(&w->cv);
  }
  if (!x->decided) {
    memcpy(x->data + (size_t)rk->rank * x->bytes, mine, bytes);
    if (x->arrived == w->tp_size) {
      x->decided = true;
      x->status = TPF_OK;
      pthread_cond_broadcast(&w->cv);
    }
  }
  const uint64_t start = tpf_sim__now_ns();
  while (!x->decided) {
    struct timespec dl;
    tpf_sim__poll_deadline(&dl);
    pthread_cond_timedwait(&w->cv, &w->mu, &dl);
    unsigned bound = 0;
    if (!x->decided && tpf_sim__expired(w, start, &bound)) {
      x->decided = true;
      x->bound_ms = bound;
      x->status = TPF_ETIMEOUT;
      x->missing_mask = ~x->arrived_mask & (w->tp_size >= 64 ? ~0ull : (1ull << w->tp_size) - 1);
      pthread_cond_broadcast(&w->cv);
    }
  }
  /* A rank arriving after the others gave up fails too (the exchange stays failed). */
  tpf_status st = x->status;
  char msg[TPF_SIM_MSG_LEN];
  if (st == TPF_ETIMEOUT) {
    char missing[200] = "";
    size_t n = 0;
    for (int r = 0; r < w->tp_size && n + 8 < sizeof missing; r++)
      if ((x->missing_mask >> (unsigned)r) & 1u)
        n += (size_t)snprintf(missing + n, sizeof missing - n, "%s%d", n ? ", " : "", r);
    int came = 0;
    for (uint64_t m = ~x->missing_mask & ((w->tp_size >= 64) ? ~0ull : (1ull << w->tp_size) - 1); m;
         m &= m - 1)
      came++;
    if (late)
      snprintf(msg, sizeof msg,
               "timeout after %u ms: rank %d arrived at communicator creation %llu "
               "(configuration exchange) after the other ranks gave up waiting for rank(s) %s",
               x->bound_ms, rk->rank, (unsigned long long)k, missing);
    else
      snprintf(msg, sizeof msg,
               "timeout after %u ms: rank %d, communicator creation %llu (configuration "
               "exchange) waits for rank(s) %s; only %d of %d ranks arrived",
               x->bound_ms, rk->rank, (unsigned long long)k, missing, came, w->tp_size);
  } else {
    snprintf(msg, sizeof msg, "%s", x->msg);
  }
  if (st == TPF_OK) memcpy(all, x->data, (size_t)w->tp_size * bytes);
  release(w, x);
  pthread_mutex_unlock(&w->mu);
  return st == TPF_OK ? TPF_OK : tpf_set_error(st, "%s", msg);
}

tpf_status tpf_sim__allgather(tpf_backend *be, const void *mine, void *all, size_t bytes) {
  tpf_sim_rank *rk = (tpf_sim_rank *)be;
  TPF_CHECK(tpf_sim__enter(rk, "allgather"));
  tpf_sim_world *w = rk->world;
  tpf_status st;
  if (!w->procs)
    st = allgather_held(rk, mine, all, bytes);
  else if (!mine || !all || bytes == 0)
    st = tpf_set_error(TPF_EINVAL, "sim allgather: %s", bytes ? "NULL buffer" : "zero bytes");
  else /* ranks as processes: the bootstrap is the rendezvous (bounded by its own timeout) */
    st = w->boot.allgather(w->boot.ctx, mine, all, bytes);
  tpf_sim__leave(rk);
  return st;
}
