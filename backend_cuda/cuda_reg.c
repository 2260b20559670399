/* The CUDA backend's registration room: reg_create and reg_destroy of the ops table, and the
 * mapping of every peer's registration into this rank's context.
 *
 * Method. One cudaMalloc per communicator holds data, flags and ready words (layout in
 * cuda_internal.h), zeroed before the bootstrap exchange so no peer can see stale flags. Peers in
 * this process use the raw pointer (with peer access enabled when the devices differ); peers in
 * other processes open a CUDA IPC handle, through a process-wide reference-counted cache because
 * several ranks of one process may import the same allocation.
 *
 */
#define _POSIX_C_SOURCE 200809L
#include "cuda_state.h"
#include "cuda_error.h"
#include "cuda_log.h"

#include "tpflex/tpflex_backend_support.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

/* ---- process-wide cache of imported IPC allocations ---- */

typedef struct tpf_cuda_ipc_entry {
  struct tpf_cuda_ipc_entry *next;
  cudaIpcMemHandle_t handle;
  int device; /* importing device */
  void *ptr;
  int refs;
} tpf_cuda_ipc_entry;

static pthread_mutex_t tpf_cuda__ipc_mu = PTHREAD_MUTEX_INITIALIZER;
static tpf_cuda_ipc_entry *tpf_cuda__ipc_list;

static tpf_status tpf_cuda__ipc_open(const cudaIpcMemHandle_t *h, int device, void **out) {
  tpf_status rc = TPF_OK;
  pthread_mutex_lock(&tpf_cuda__ipc_mu);
  for (tpf_cuda_ipc_entry *e = tpf_cuda__ipc_list; e != NULL; e = e->next) {
    if (e->device == device && memcmp(&e->handle, h, sizeof(*h)) == 0) {
      e->refs++;
      *out = e->ptr;
      pthread_mutex_unlock(&tpf_cuda__ipc_mu);
      return TPF_OK;
    }
  }
  tpf_cuda_ipc_entry *e = tpf_calloc(1, sizeof(*e));
  if (e == NULL) {
    rc = tpf_set_error(TPF_ENOMEM, "cannot allocate an IPC cache entry");
    goto out;
  }
  cudaError_t ce = cudaIpcOpenMemHandle(&e->ptr, *h, cudaIpcMemLazyEnablePeerAccess);
  if (ce != cudaSuccess) {
    tpf_free(e);
    rc = tpf_cuda__err(ce, "cudaIpcOpenMemHandle");
    goto out;
  }
  e->handle = *h;
  e->device = device;
  e->refs = 1;
  e->next = tpf_cuda__ipc_list;
  tpf_cuda__ipc_list = e;
  *out = e->ptr;
out:
  pthread_mutex_unlock(&tpf_cuda__ipc_mu);
  return rc;
}

static void tpf_cuda__ipc_close(void *ptr) {
  pthread_mutex_lock(&tpf_cuda__ipc_mu);
  for (tpf_cuda_ipc_entry **pp = &tpf_cuda__ipc_list; *pp != NULL; pp = &(*pp)->next) {
    tpf_cuda_ipc_entry *e = *pp;
    if (e->ptr != ptr) continue;
    if (--e->refs == 0) {
      *pp = e->next;
      cudaIpcCloseMemHandle(e->ptr);
      tpf_free(e);
    }
    break;
  }
  pthread_mutex_unlock(&tpf_cuda__ipc_mu);
}

/* ---- registration ---- */

static uint64_t tpf_cuda__round_up(uint64_t x, uint64_t a) {
  return (x + a - 1) / a * a;
}

static tpf_status tpf_cuda__reg_map_peers(tpf_cuda_backend *b, tpf_reg *r,
                                          const tpf_cuda_reg_info *infos) {
  const int P = b->base.tp_size, me = b->base.rank;
  for (int q = 0; q < P; q++) {
    const tpf_cuda_reg_info *in = &infos[q];
    TPF_RETURN_IF(in->data_bytes != r->data_bytes, TPF_EMISMATCH,
                  "registration '%s': rank %d registers %llu bytes, rank %d %llu", r->name, me,
                  (unsigned long long)r->data_bytes, q, (unsigned long long)in->data_bytes);
    if (q == me) {
      r->peer_base[q] = r->base;
      continue;
    }
    const tpf_cuda_peer_info *pi = &b->peers[q];
    if (pi->proc_token == b->peers[me].proc_token) {
      if (pi->device != b->device) {
        int can = 0;
        TPF_CUDA_TRY(cudaDeviceCanAccessPeer(&can, b->device, pi->device),
                     "cudaDeviceCanAccessPeer");
        TPF_RETURN_IF(!can, TPF_EUNSUPPORTED,
                      "device %d cannot access peer device %d (rank %d); NCCL transport for "
                      "such peers is not implemented",
                      b->device, pi->device, q);
        cudaError_t e = cudaDeviceEnablePeerAccess(pi->device, 0);
        if (e == cudaErrorPeerAccessAlreadyEnabled)
          (void)cudaGetLastError();
        else if (e != cudaSuccess)
          return tpf_cuda__err(e, "cudaDeviceEnablePeerAccess");
      }
      r->peer_base[q] = (char *)(uintptr_t)in->base;
    } else {
      TPF_RETURN_IF(!in->has_handle, TPF_EBACKEND, "rank %d exported no IPC handle for '%s'", q,
                    r->name);
      void *p = NULL;
      TPF_CHECK(tpf_cuda__ipc_open(&in->handle, b->device, &p));
      r->peer_base[q] = p;
      r->peer_ipc[q] = true;
    }
  }
  return TPF_OK;
}

static void tpf_cuda__reg_free(tpf_cuda_backend *b, tpf_reg *r) {
  for (int q = 0; q < b->base.tp_size; q++)
    if (r->peer_ipc[q]) tpf_cuda__ipc_close(r->peer_base[q]);
  if (r->base != NULL) cudaFree(r->base);
  for (int i = 0; i < 2; i++)
    if (r->ready_ev[i] != NULL) cudaEventDestroy(r->ready_ev[i]);
  if (r->done_ev != NULL) cudaEventDestroy(r->done_ev);
  if (r->tp != NULL && r->tp->free != NULL) r->tp->free(b, r);
  tpf_cuda__status_free(r);
  tpf_cuda__timing_free(b, r);
  tpf_free(r);
  /* A failed free is not reported (everything else is still freed); it must not stay behind as
   * the thread's last error for the next launch's check either. */
  (void)cudaGetLastError();
}

/* This rank's part of a registration before any exchange: the device memory (zeroed), its
 * events and status area, the transport, the IPC handle and the record for the peers (*mine). */
static tpf_status tpf_cuda__reg_local(tpf_cuda_backend *b, tpf_reg *r, tpf_cuda_reg_info *mine) {
  const int P = b->base.tp_size, me = b->base.rank;
  TPF_CUDA_TRY(cudaSetDevice(b->device), "cudaSetDevice");
  r->flags_off = tpf_cuda__round_up(r->data_bytes, TPF_CUDA_GUARD_BYTES) + TPF_CUDA_GUARD_BYTES;
  r->ready_off = r->flags_off + (uint64_t)P * TPF_MAX_TAGS * sizeof(uint64_t);
  r->alloc_bytes =
      tpf_cuda__round_up(r->ready_off + (uint64_t)P * TPF_CUDA_READY_STRIDE, TPF_CUDA_GUARD_BYTES) +
      TPF_CUDA_GUARD_BYTES;
  void *p = NULL;
  cudaError_t e = cudaMalloc(&p, r->alloc_bytes);
  if (e != cudaSuccess)
    return e == cudaErrorMemoryAllocation
               ? tpf_set_error(TPF_ENOMEM, "cudaMalloc of %llu bytes for '%s' failed: %s",
                               (unsigned long long)r->alloc_bytes, r->name, cudaGetErrorString(e))
               : tpf_cuda__err(e, "cudaMalloc(registration)");
  r->base = p;
  for (int i = 0; i < 2; i++)
    TPF_CUDA_TRY(cudaEventCreateWithFlags(&r->ready_ev[i], cudaEventDisableTiming),
                 "cudaEventCreate(ready)");
  TPF_CUDA_TRY(cudaEventCreateWithFlags(&r->done_ev, cudaEventDisableTiming),
               "cudaEventCreate(done)");
  /* Its own device status area (cuda_status.c): failures of its operations stay its own. */
  TPF_CHECK(tpf_cuda__status_init(b, r));
  /* Zero data and flags before any peer learns the address. */
  cudaStream_t s = b->streams[TPF_STREAM_SEND];
  e = cudaMemsetAsync(r->base, 0, r->alloc_bytes, s);
  if (e == cudaSuccess) e = cudaStreamSynchronize(s);
  if (e != cudaSuccess) return tpf_cuda__err(e, "cudaMemsetAsync(registration)");
  mine->base = (uint64_t)(uintptr_t)r->base;
  mine->alloc_bytes = r->alloc_bytes;
  mine->data_bytes = r->data_bytes;
  mine->rank = me;
  bool remote = false;
  for (int q = 0; q < P; q++)
    remote = remote || b->peers[q].proc_token != b->peers[me].proc_token;
  r->remote = remote;
  tpf_cuda__transport_select(b, r);
  if (remote) {
    TPF_CUDA_TRY(cudaIpcGetMemHandle(&mine->handle, r->base), "cudaIpcGetMemHandle");
    mine->has_handle = 1;
  }
  /* The transport's part of the record (cuda_transport.c chose it): the in-process events'
   * table. */
  if (r->tp != NULL && r->tp->setup != NULL) TPF_CHECK(r->tp->setup(b, r, mine));
  return TPF_OK;
}

static void tpf_cuda__reg_log(tpf_cuda_backend *b, const tpf_reg *r) {
  if (!tpf_cuda__log_enabled(TPF_CUDA_LOG_INFO, TPF_CUDA_LOG_REG)) return;
  char peers[TPF_MAX_RANKS * 28];
  size_t used = 0;
  peers[0] = '\0';
  for (int q = 0; q < b->base.tp_size && used < sizeof peers; q++) {
    const int n =
        snprintf(peers + used, sizeof peers - used, " %p(%s%s)", (void *)r->peer_base[q],
                 r->peer_tp[q] ? r->peer_tp[q]->name : "self", r->peer_ipc[q] ? ", ipc" : "");
    used += n > 0 ? (size_t)n : 0;
  }
  TPF_CUDA_INFO(REG, b->base.rank,
                "registered '%s' %llu bytes at %p (flags +%llu, ready +%llu); peers:%s", r->name,
                (unsigned long long)r->data_bytes, (void *)r->base,
                (unsigned long long)r->flags_off, (unsigned long long)r->ready_off, peers);
}

/* Collective. Every rank takes part in every exchange, also after a local failure: the local
 * part's outcome first, then the records, then the outcome of connecting to the peers; so a
 * failure on one rank (out of memory, a CUDA error) fails the registration on every rank at once,
 * naming that rank, and no rank keeps anything (tpf_cuda__boot_outcome). */
tpf_status tpf_cuda__reg_create(tpf_backend *be, const char *name, uint64_t bytes, tpf_reg **reg,
                                void **local) {
  tpf_cuda_backend *b = tpf_cuda__of(be);
  const uint64_t ms = b->timeout_ns / 1000000ull;
  char what[96];
  snprintf(what, sizeof what, "register '%s'", name ? name : "?");
  tpf_cuda_reg_info mine;
  memset(&mine, 0, sizeof(mine));
  tpf_reg *r = tpf_calloc(1, sizeof(*r));
  tpf_cuda_reg_info *infos = tpf_calloc((size_t)be->tp_size, sizeof(*infos));
  tpf_status rc = TPF_OK;
  if (r == NULL || infos == NULL) {
    rc = tpf_set_error(TPF_ENOMEM, "cannot allocate registration '%s'", name ? name : "?");
  } else {
    snprintf(r->name, sizeof(r->name), "%s", name ? name : "?");
    r->data_bytes = bytes;
    rc = tpf_cuda__reg_local(b, r, &mine);
  }
  rc = tpf_cuda__boot_outcome(&b->boot, rc, what, ms);
  if (rc == TPF_OK) rc = b->boot.allgather(b->boot.ctx, &mine, infos, sizeof(mine));
  /* Connecting is collective for the flags transport (its host agreement table): every rank
   * that reached here calls it; mapping the peers is local. */
  if (rc == TPF_OK) {
    tpf_status lc = TPF_OK;
    if (r->tp != NULL && r->tp->connect != NULL) lc = r->tp->connect(b, r, infos);
    if (lc == TPF_OK) lc = tpf_cuda__reg_map_peers(b, r, infos);
    rc = tpf_cuda__boot_outcome(&b->boot, lc, what, ms);
  }
  tpf_free(infos);
  if (rc != TPF_OK) {
    if (r != NULL) tpf_cuda__reg_free(b, r);
    return rc;
  }
  tpf_cuda__reg_log(b, r);
  *reg = r;
  *local = r->base;
  return TPF_OK;
}

tpf_status tpf_cuda__reg_destroy(tpf_backend *be, tpf_reg *r) {
  tpf_cuda_backend *b = tpf_cuda__of(be);
  TPF_RETURN_IF(r == NULL, TPF_EINVAL, "registration is NULL");
  const cudaError_t dev = cudaSetDevice(b->device);
  tpf_status rc =
      dev != cudaSuccess ? tpf_cuda__err(dev, "cudaSetDevice") : tpf_cuda__sync(be, NULL);
  /* First barrier: no peer still reads or writes this memory. Importers then unmap and owners
   * free. cudaFree (and cudaIpcCloseMemHandle) may wait for the whole device to go idle; with
   * several ranks on one GPU, a rank that left early and enqueued its next operation would spin
   * waiting for this rank, which waits for the device: so the second barrier keeps everyone here
   * until every rank has freed. */
  tpf_status rc2 = b->boot.barrier(b->boot.ctx);
  for (int q = 0; q < be->tp_size; q++) {
    if (r->peer_ipc[q]) {
      tpf_cuda__ipc_close(r->peer_base[q]);
      r->peer_ipc[q] = false;
    }
  }
  tpf_cuda__reg_free(b, r);
  tpf_status rc3 = b->boot.barrier(b->boot.ctx);
  return rc != TPF_OK ? rc : rc2 != TPF_OK ? rc2 : rc3;
}
