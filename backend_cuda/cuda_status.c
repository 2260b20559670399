/* The CUDA backend's status room: the device status areas, the deferred errors of operations,
 * and the ops table's sync, reg_sync, reg_async_error and reg_abort.
 *
 * Failures. Device-side waits are bounded (timeout_ns, %globaltimer). Every registration has its
 * own host-mapped status area (it was one per backend once, so a failure of one
 * communicator failed every other one of the rank, permanently once the core saw it at their
 * next execute). The first failing wait of an operation writes a code into its registration's
 * area; every later kernel of that registration sees it and returns without touching memory, and
 * the host reports it (TPF_EMISMATCH or TPF_ETIMEOUT) at the registration's next execute,
 * reg_sync or reg_async_error; reg_sync takes it (into the registration's deferred status) and
 * clears the area. The backend-wide sync waits for the streams and reports what it waited for
 * (CUDA errors, the memops bound), never a registration's failure: tpf_comm_destroy of one
 * communicator must not report, or clear, another's. Known limitation: copy-engine transfers cannot
 * observe the code, so the cudaMemcpyAsync of a RING SEND still runs after a failed handshake, with
 * this rank's offsets and sizes (always inside the peer's registration, since both are bounded by
 * the capacity the core validated). A peer whose operation failed may therefore find its buffer
 * overwritten. Ranks in other processes therefore agree on the host first (cuda_hostsync.c), so
 * the limitation remains only where that shared table could not be set up.
 */
#define _POSIX_C_SOURCE 200809L
#include "cuda_state.h"
#include "cuda_error.h"

#include "tpflex/tpflex_backend_support.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

tpf_status tpf_cuda__status_init(tpf_cuda_backend *b, tpf_reg *r) {
  void *host = NULL;
  TPF_CUDA_TRY(cudaHostAlloc(&host, sizeof(tpf_cuda_status), cudaHostAllocMapped),
               "cudaHostAlloc(status)");
  r->status_host = host;
  memset(host, 0, sizeof(tpf_cuda_status));
  void *dev = NULL;
  TPF_CUDA_TRY(cudaHostGetDevicePointer(&dev, host, 0), "cudaHostGetDevicePointer");
  r->status_dev = dev;
  void *claim = NULL;
  TPF_CUDA_TRY(cudaMalloc(&claim, sizeof(unsigned int)), "cudaMalloc(claim)");
  r->claim_dev = claim;
  TPF_CUDA_TRY(cudaMemsetAsync(claim, 0, sizeof(unsigned int), b->streams[TPF_STREAM_SEND]),
               "cudaMemsetAsync");
  TPF_CUDA_TRY(cudaStreamSynchronize(b->streams[TPF_STREAM_SEND]), "cudaStreamSynchronize");
  return TPF_OK;
}

void tpf_cuda__status_free(tpf_reg *r) {
  if (r->claim_dev != NULL) cudaFree(r->claim_dev);
  if (r->status_host != NULL) cudaFreeHost(r->status_host);
  r->claim_dev = NULL;
  r->status_host = NULL;
  r->status_dev = NULL;
}

tpf_status tpf_cuda__check_status(tpf_cuda_backend *b, const tpf_reg *r) {
  if (r->status_host == NULL) return TPF_OK;
  const uint32_t code = r->status_host->code;
  if (code == TPF_CUDA_DEV_OK) return TPF_OK;
  const tpf_cuda_status *st = r->status_host;
  const char *kind = tpf_step_kind_name((int)st->kind);
  if (code == TPF_CUDA_DEV_MISMATCH) {
    char mine[40], theirs[40];
    return tpf_set_error(
        TPF_EMISMATCH,
        "'%s': rank %d, operation %llu: active rows %llu (%s) here but %llu (%s) on "
        "rank %d (detected by the handshake before any byte moved on this rank)",
        r->name, b->base.rank, (unsigned long long)st->seq,
        (unsigned long long)TPF_READY_ROWS(st->mine),
        tpf_op_key_name((uint8_t)TPF_READY_KEY(st->mine), mine, sizeof mine),
        (unsigned long long)TPF_READY_ROWS(st->theirs),
        tpf_op_key_name((uint8_t)TPF_READY_KEY(st->theirs), theirs, sizeof theirs), (int)st->peer);
  }
  tpf_set_error(TPF_ETIMEOUT,
                "'%s': rank %d, operation %llu: %s waiting for rank %d (tag %u) exceeded %llu ms "
                "(wanted %llu, saw %llu at %p)",
                r->name, b->base.rank, (unsigned long long)st->seq, kind ? kind : "?",
                (int)st->peer, (unsigned)st->tag, (unsigned long long)(b->timeout_ns / 1000000ull),
                (unsigned long long)st->mine, (unsigned long long)st->theirs,
                (void *)(uintptr_t)st->addr);
  return tpf_cuda__blame_gone(b->peers, b->base.tp_size, b->base.rank, TPF_ETIMEOUT);
}

/* Clears r's status after everything that could write it has finished (the caller waited for
 * the streams). */
static tpf_status tpf_cuda__clear_status(tpf_cuda_backend *b, tpf_reg *r) {
  cudaStream_t s = b->streams[TPF_STREAM_SEND];
  TPF_CUDA_TRY(cudaMemsetAsync(r->claim_dev, 0, sizeof(unsigned int), s), "cudaMemsetAsync");
  TPF_CUDA_TRY(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  r->status_host->code = TPF_CUDA_DEV_OK;
  return TPF_OK;
}

/* Polls s until it is idle or the deadline passes: true when idle. */
static bool tpf_cuda__poll_until(cudaStream_t s, uint64_t deadline, cudaError_t *err) {
  for (unsigned spins = 0;; spins++) {
    const cudaError_t e = cudaStreamQuery(s);
    if (e != cudaErrorNotReady) {
      *err = e;
      return true;
    }
    if (tpf_cuda__now_ns() > deadline) return false;
    if (spins > 64) {
      const struct timespec ts = {0, 20000}; /* 20 us: a wait can be long; keep a core free */
      nanosleep(&ts, NULL);
    }
  }
}

tpf_status tpf_cuda__stream_wait_bounded(tpf_cuda_backend *b, cudaStream_t s) {
  if (b->memops_regs == NULL) {
    TPF_CUDA_TRY(cudaStreamSynchronize(s), "cudaStreamSynchronize");
    return TPF_OK;
  }
  cudaError_t e = cudaSuccess;
  if (tpf_cuda__poll_until(s, tpf_cuda__now_ns() + b->timeout_ns, &e)) {
    TPF_CUDA_TRY(e, "cudaStreamQuery");
    return TPF_OK;
  }
  for (tpf_reg *r = b->memops_regs; r != NULL; r = r->next_memops) {
    TPF_CHECK(tpf_cuda__memops_release(b, r));
    if (r->deferred == TPF_OK) r->deferred = TPF_ETIMEOUT;
  }
  const bool drained = tpf_cuda__poll_until(s, tpf_cuda__now_ns() + b->timeout_ns, &e);
  tpf_set_error(TPF_ETIMEOUT,
                "rank %d: the operations enqueued did not complete within %llu ms: a peer never "
                "signalled (stream-memory waits released%s)",
                b->base.rank, (unsigned long long)(b->timeout_ns / 1000000ull),
                drained ? "" : "; the stream still did not drain");
  return tpf_cuda__blame_gone(b->peers, b->base.tp_size, b->base.rank, TPF_ETIMEOUT);
}

tpf_status tpf_cuda__event_wait_bounded(tpf_cuda_backend *b, cudaEvent_t ev) {
  const uint64_t deadline = tpf_cuda__now_ns() + b->timeout_ns;
  for (unsigned spins = 0;; spins++) {
    const cudaError_t e = cudaEventQuery(ev);
    if (e != cudaErrorNotReady) {
      TPF_CUDA_TRY(e, "cudaEventQuery(done)");
      return TPF_OK;
    }
    if (tpf_cuda__now_ns() > deadline)
      return tpf_set_error(TPF_ETIMEOUT,
                           "rank %d: the last operation did not complete within %llu ms on the "
                           "stream it was enqueued (or its graph replayed) on",
                           b->base.rank, (unsigned long long)(b->timeout_ns / 1000000ull));
    if (spins > 64) {
      const struct timespec ts = {0, 20000};
      nanosleep(&ts, NULL);
    }
  }
}

tpf_status tpf_cuda__sync(tpf_backend *be, void *stream) {
  tpf_cuda_backend *b = tpf_cuda__of(be);
  TPF_CUDA_TRY(cudaSetDevice(b->device), "cudaSetDevice");
  if (stream != NULL) {
    TPF_CHECK(tpf_cuda__stream_wait_bounded(b, (cudaStream_t)stream));
  } else {
    /* Only this backend's streams: other ranks may share the device, and a device-wide
     * synchronisation would wait for their spinning waits, which may wait for this thread. */
    for (int k = 0; k < TPF_NUM_STREAMS; k++)
      TPF_CHECK(tpf_cuda__stream_wait_bounded(b, b->streams[k]));
  }
  /* A registration's device failure stays with it (its reg_sync, execute, async_error). */
  return TPF_OK;
}

/* ---- per-registration completion and errors ----
 * Each registration's failure lives in its own status area (see Failures above). */
tpf_status tpf_cuda__reg_async_error(tpf_backend *be, tpf_reg *r, tpf_status *out) {
  tpf_cuda_backend *b = tpf_cuda__of(be);
  TPF_RETURN_IF(r == NULL || out == NULL, TPF_EINVAL, "cuda reg_async_error: NULL argument");
  tpf_status st = r->deferred;
  /* A host-mapped read: never waits for the device. */
  if (st == TPF_OK) st = tpf_cuda__check_status(b, r);
  *out = st;
  return TPF_OK;
}

tpf_status tpf_cuda__reg_sync(tpf_backend *be, tpf_reg *r) {
  tpf_cuda_backend *b = tpf_cuda__of(be);
  TPF_RETURN_IF(r == NULL, TPF_EINVAL, "cuda reg_sync: NULL registration");
  TPF_CUDA_TRY(cudaSetDevice(b->device), "cudaSetDevice");
  /* The registration's operations run on the backend's streams and end on the caller's, where
   * done_ev marks the last one (replays of captured operations included; P = 1 runs there
   * only). */
  for (int k = 0; k <= TPF_NUM_STREAMS; k++) {
    const tpf_status rc = k < TPF_NUM_STREAMS ? tpf_cuda__stream_wait_bounded(b, b->streams[k])
                                              : tpf_cuda__event_wait_bounded(b, r->done_ev);
    if (rc != TPF_OK) {
      return tpf_prefix_error(rc, "'%s': ", r->name);
    }
  }
  if (r->deferred == TPF_OK && tpf_cuda__check_status(b, r) != TPF_OK) {
    r->deferred = tpf_cuda__check_status(b, r);
    char msg[512]; /* the detail already names the registration */
    snprintf(msg, sizeof msg, "%s", tpf_last_error());
    TPF_CHECK(tpf_cuda__clear_status(b, r));
    return tpf_set_error(r->deferred, "%s", msg);
  }
  TPF_RETURN_IF(r->deferred != TPF_OK, r->deferred, "'%s': an operation failed earlier (%s)",
                r->name, tpf_status_name(r->deferred));
  return TPF_OK;
}

/* Thread-safe: one atomic store. The in-process host waits (handshake, event tables) poll it.
 * Device-side waits of the multi-process path end at their own timeout (flag kernels) or are
 * released here (memops). */
tpf_status tpf_cuda__reg_abort(tpf_backend *be, tpf_reg *r) {
  TPF_RETURN_IF(r == NULL, TPF_EINVAL, "cuda reg_abort: NULL registration");
  atomic_store(&r->aborted, 1);
  /* Stream-memory waits have no device-side bound: release this rank's. */
  if (r->tp == &tpf_cuda__transport_memops) {
    tpf_cuda_backend *b = tpf_cuda__of(be);
    cudaSetDevice(b->device);
    TPF_CHECK(tpf_cuda__memops_release(b, r));
  }
  return TPF_OK;
}
