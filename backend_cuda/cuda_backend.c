/* The CUDA backend: creation over a bootstrap (the lifetime room), and the map of its rooms.
 *
 * Rooms. One concern per file; cuda_state.h holds the state they share and the calls between
 * them, cuda_internal.h what the device code and the host agreement also see.
 *   cuda_backend.c           lifetime: tpf_cuda_backend_create/destroy/set_timeout/stats, the
 *                            ops table, the allgather op (configuration exchange)
 *   cuda_reg.c               registration: reg_create/reg_destroy, the IPC cache, peer mapping
 *   cuda_exec.c              execution: step mapping, the two enqueuers, execute
 *   cuda_status.c            status: device status areas (one per registration), deferred
 *                            errors, sync, reg_sync, reg_async_error, reg_abort
 *   cuda_transport.c         the transport table (memops, events, flags: the first row that can
 *                            connect the group serves every peer of a registration)
 *   cuda_transport_events.c  in-process ranks: host-ordered CUDA events
 *   cuda_transport_flags.c   device flags over mapped memory (CUDA IPC), the host agreement;
 *                            signalled by flag kernels, or by stream memory ops (memops)
 *   cuda_gemm.c              cuBLASLt GEMMs, the per-shape cache, the fallback
 *   cuda_kernels.cu          device code: flag, reduction, copy and fallback GEMM kernels
 *   cuda_hostsync.c          host agreement of ranks in different processes (no CUDA calls)
 *   cuda_bootstrap.c         threads and NCCL bootstraps, the backend's bounded allgather
 *   cuda_param.c             every environment knob, read once (TPF_DEBUG=INFO prints them)
 *   cuda_log.c               the TPF_DEBUG log ("tpflex:rank N LEVEL SUBSYS ...")
 *   cuda_error.c             cudaError_t / cublasStatus_t / ncclResult_t -> tpf_status
 *   cuda_nvtx.c              profiler ranges: NVTX per operation and shape change (SPEC §16)
 *   cuda_timing.c            device timing while profiling: exposed / hidden communication
 *   cuda_probe.c             the measurement probes (tpf_cuda_probe_*: one kernel each, for
 *                            tpflex calibrate)
 *   cuda_fp8cast.cu          device code of the modules' FP8 casts (SPEC §14): cast, amax,
 *                            byte transpose
 *   cuda_fp8cast.c           their public calls (tpf_cuda_fp8_cast, _amax, transpose_bytes)
 *
 * Who calls whom (link-time references between the files, as tests/cuda_cpu/check_cuda_rooms.sh
 * lists them from the objects; it fails the build's tests on a cycle). By layer, each file
 * calling only files of lower layers:
 *   0  cuda_error.c, cuda_log.c, cuda_kernels.cu,        -> (none)
 *      cuda_nvtx.c, cuda_fp8cast.cu
 *   1  cuda_param.c                                      -> log
 *      cuda_timing.c                                     -> nvtx (the switch)
 *      cuda_fp8cast.c                                    -> fp8cast.cu, error
 *   2  cuda_gemm.c                                       -> kernels, param, error
 *      cuda_bootstrap.c                                  -> param, error
 *      cuda_hostsync.c                                   -> param, log
 *   3  cuda_transport_events.c                           -> error
 *      cuda_transport_flags.c                            -> kernels, hostsync, log, error
 *   4  cuda_transport.c                                  -> transport_events, transport_flags,
 *                                                           param, log
 *      cuda_status.c                                     -> transport_flags (memops release),
 *                                                           hostsync (a peer that exited), error
 *   5  cuda_exec.c                                       -> gemm, kernels, status,
 *                                                           transport_events (a failure for the
 *                                                           peers), log, error
 *      cuda_reg.c                                        -> transport, status, bootstrap
 *                                                           (creation outcomes), log, error
 *   6  cuda_backend.c                                    -> reg, exec, status, gemm, bootstrap,
 *                                                           param, log, error
 *   7  cuda_probe.c                                      -> backend (the ops table), kernels,
 *                                                           error
 * cuda_exec.c and cuda_reg.c also call the transports through r->peer_tp / r->tp (function
 * pointers, not link-time edges; downwards all the same). Kernels get everything they need as
 * arguments (tpf_cuda_flag_args, tpf_cuda_reduce_args and the status pointer) and call nothing
 * back.
 *
 * Several ranks on one GPU. A spinning wait occupies the device until its peer's next operation
 * arrives, so a rank must not call a CUDA function that waits for the whole device (cudaFree,
 * cudaFreeHost, cudaDeviceSynchronize, sometimes cudaMalloc) while a peer may be waiting for it:
 * the same rule NCCL states for its kernels. The backend keeps such calls inside collective
 * creation/destruction, fenced by bootstrap barriers; callers should allocate operands up front or
 * with the stream-ordered allocator (cudaMallocAsync with a pool that keeps its memory).
 *
 * Configuration exchange. tpf_comm_create compares the ranks' configuration fingerprints before
 * reg_create through the allgather op, which runs over the bootstrap (sizes first, then bytes)
 * and waits at most the backend's timeout when the bootstrap is tpflex's threads or NCCL one; a
 * caller's bootstrap cannot be bounded (cuda_bootstrap.c).
 */
#define _POSIX_C_SOURCE 200809L
#include "cuda_state.h"
#include "cuda_error.h"
#include "cuda_internal.h"
#include "cuda_log.h"
#include "cuda_param.h"

#include "tpflex/tpflex_backend_support.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* Host name hash and pid: equal exactly for ranks of one process (fork gives a new pid). */
static uint64_t tpf_cuda__host_hash(void) {
  char host[256];
  memset(host, 0, sizeof(host));
  if (gethostname(host, sizeof(host) - 1) != 0) host[0] = '\0';
  uint64_t h = 1469598103934665603ull;
  for (const char *p = host; *p; p++)
    h = (h ^ (unsigned char)*p) * 1099511628211ull;
  return h;
}

static uint64_t tpf_cuda__proc_token(void) {
  return (tpf_cuda__host_hash() << 20) ^ (uint64_t)getpid();
}

/* ---- backend lifetime ---- */

static tpf_status tpf_cuda__allgather(tpf_backend *be, const void *mine, void *all, size_t bytes);

/* One thread per rank (tpflex.h, Threads): the ops table's rank-thread entries claim the
 * rank first, so a second thread gets TPF_ESTATE naming the rule instead of racing on the
 * backend's per-rank scratch (step events, enqueuer state, the bootstrap's exchange order). The
 * core refuses a second thread on one communicator; this also covers two communicators of one
 * rank used from two threads. reg_abort and reg_async_error stay callable from any thread. */
static tpf_status g_reg_create(tpf_backend *be, const char *name, uint64_t bytes, tpf_reg **reg,
                               void **local) {
  TPF_CHECK(tpf_cuda__enter(tpf_cuda__of(be), "reg_create"));
  const tpf_status rc = tpf_cuda__reg_create(be, name, bytes, reg, local);
  tpf_cuda__leave(tpf_cuda__of(be));
  return rc;
}
static tpf_status g_reg_destroy(tpf_backend *be, tpf_reg *r) {
  TPF_CHECK(tpf_cuda__enter(tpf_cuda__of(be), "reg_destroy"));
  const tpf_status rc = tpf_cuda__reg_destroy(be, r);
  tpf_cuda__leave(tpf_cuda__of(be));
  return rc;
}
static tpf_status g_execute(tpf_backend *be, tpf_reg *r, const tpf_exec_args *a, void *stream) {
  TPF_CHECK(tpf_cuda__enter(tpf_cuda__of(be), "execute"));
  const bool ranged = tpf_cuda__nvtx_op_push(a); /* profiler range (cuda_nvtx.c) */
  const tpf_status rc = tpf_cuda__execute(be, r, a, stream);
  if (ranged) tpf_cuda__nvtx_op_pop();
  tpf_cuda__leave(tpf_cuda__of(be));
  return rc;
}
static tpf_status g_sync(tpf_backend *be, void *stream) {
  TPF_CHECK(tpf_cuda__enter(tpf_cuda__of(be), "sync"));
  const tpf_status rc = tpf_cuda__sync(be, stream);
  tpf_cuda__leave(tpf_cuda__of(be));
  return rc;
}
static tpf_status g_reg_sync(tpf_backend *be, tpf_reg *r) {
  TPF_CHECK(tpf_cuda__enter(tpf_cuda__of(be), "reg_sync"));
  const tpf_status rc = tpf_cuda__reg_sync(be, r);
  tpf_cuda__leave(tpf_cuda__of(be));
  return rc;
}
static tpf_status g_allgather(tpf_backend *be, const void *mine, void *all, size_t bytes) {
  TPF_CHECK(tpf_cuda__enter(tpf_cuda__of(be), "allgather"));
  const tpf_status rc = tpf_cuda__allgather(be, mine, all, bytes);
  tpf_cuda__leave(tpf_cuda__of(be));
  return rc;
}

const tpf_backend_ops tpf_cuda__ops = {
    .abi_version = TPF_BACKEND_ABI_VERSION,
    .name = "cuda",
    .caps = TPF_BE_CAP_OPTIONS | TPF_BE_CAP_FP8, /* step flags, epilogue, fp8: cuda_gemm.c */
    .align_bytes = 16,
    .max_ranks = TPF_MAX_RANKS,
    .reg_create = g_reg_create,
    .reg_destroy = g_reg_destroy,
    .reg_activate = tpf_cuda__nvtx_reg_activate, /* no device work: a profiler mark, when on */
    .execute = g_execute,
    .sync = g_sync,
    .reg_sync = g_reg_sync,
    .reg_async_error = tpf_cuda__reg_async_error,
    .reg_abort = tpf_cuda__reg_abort,
    .allgather = g_allgather,
};

/* Frees everything, also after a failure; returns the first failure of a wait (a device error the
 * caller should hear of), TPF_OK otherwise. */
static tpf_status tpf_cuda__backend_free(tpf_cuda_backend *b) {
  tpf_status rc = TPF_OK;
  cudaError_t e = cudaSetDevice(b->device);
  if (e != cudaSuccess) rc = tpf_cuda__err(e, "cudaSetDevice");
  for (int i = 0; i < TPF_NUM_STREAMS; i++) {
    if (b->streams[i] == NULL) continue;
    e = cudaStreamSynchronize(b->streams[i]);
    if (e != cudaSuccess && rc == TPF_OK) rc = tpf_cuda__err(e, "cudaStreamSynchronize(destroy)");
  }
  for (int i = 0; i < b->nstep_ev; i++)
    cudaEventDestroy(b->step_ev[i]);
  tpf_free(b->step_ev);
  tpf_free(b->need_ev);
  tpf_free(b->step_state);
  tpf_free(b->step_virt);
  tpf_free(b->step_prev);
  tpf_free(b->step_pev);
  for (int i = 0; i < TPF_NUM_STREAMS; i++) {
    if (b->join_ev[i] != NULL) cudaEventDestroy(b->join_ev[i]);
    if (b->streams[i] != NULL && (i < b->compute_streams || i >= TPF_STREAM_SEND))
      cudaStreamDestroy(b->streams[i]);
  }
  if (b->fork_ev != NULL) cudaEventDestroy(b->fork_ev);
  if (b->release_stream != NULL) cudaStreamDestroy(b->release_stream);
  tpf_cuda__gemm_destroy(b->gemm);
  tpf_free(b);
  (void)cudaGetLastError(); /* failed frees: reported by nothing, left to no later launch check */
  return rc;
}

/* The device and its properties: the part of the creation before anything is known of the
 * peers. */
static tpf_status tpf_cuda__backend_device(tpf_cuda_backend *b) {
  TPF_CUDA_TRY(cudaSetDevice(b->device), "cudaSetDevice");
  TPF_CUDA_TRY(cudaDeviceGetAttribute(&b->num_sms, cudaDevAttrMultiProcessorCount, b->device),
               "cudaDeviceGetAttribute(multiProcessorCount)");
  return TPF_OK;
}

/* Streams, events and the GEMM state, once the peers are known. */
static tpf_status tpf_cuda__backend_streams(tpf_cuda_backend *b, const tpf_cuda_peer_info *me) {
  const tpf_bootstrap *boot = &b->boot;
  /* Hardware queues: CUDA maps streams onto CUDA_DEVICE_MAX_CONNECTIONS queues (default 8) per
   * process and device. Streams that share a queue are ordered behind each other, so a spinning
   * wait could block the very signal it waits for. When several ranks of this process share the
   * device, use fewer compute streams so that every rank's streams (and its caller's) get queues of
   * their own where possible; aliased compute streams keep every dependency, only GEMM overlap is
   * lost. TPF_CUDA_COMPUTE_STREAMS overrides. */
  int sharing = 0;
  for (int q = 0; q < boot->tp_size; q++)
    sharing += b->peers[q].proc_token == me->proc_token && b->peers[q].device == boot->device;
  if (!tpf_cuda__param_is_set(TPF_CUDA_PARAM_COMPUTE_STREAMS) && sharing > 1) {
    const int conns = (int)tpf_cuda__param_u64(TPF_CUDA_PARAM_MAX_CONNECTIONS);
    int per_rank = conns / sharing - 3; /* send, recv and the caller's stream */
    b->compute_streams = per_rank < 1                    ? 1
                         : per_rank > b->compute_streams ? b->compute_streams
                                                         : per_rank;
  }
  int lo = 0, hi = 0;
  TPF_CUDA_TRY(cudaDeviceGetStreamPriorityRange(&lo, &hi), "cudaDeviceGetStreamPriorityRange");
  for (int i = 0; i < b->compute_streams; i++)
    TPF_CUDA_TRY(cudaStreamCreateWithPriority(&b->streams[i], cudaStreamNonBlocking, lo),
                 "cudaStreamCreateWithPriority(compute)");
  /* Fewer distinct compute streams alias the rest onto stream 0 (see above). */
  for (int i = b->compute_streams; i < TPF_MAX_COMPUTE_STREAMS; i++)
    b->streams[i] = b->streams[0];
  TPF_CUDA_TRY(
      cudaStreamCreateWithPriority(&b->streams[TPF_STREAM_SEND], cudaStreamNonBlocking, hi),
      "cudaStreamCreateWithPriority(send)");
  TPF_CUDA_TRY(
      cudaStreamCreateWithPriority(&b->streams[TPF_STREAM_RECV], cudaStreamNonBlocking, hi),
      "cudaStreamCreateWithPriority(recv)");
  TPF_CUDA_TRY(cudaEventCreateWithFlags(&b->fork_ev, cudaEventDisableTiming), "cudaEventCreate");
  for (int i = 0; i < TPF_NUM_STREAMS; i++)
    TPF_CUDA_TRY(cudaEventCreateWithFlags(&b->join_ev[i], cudaEventDisableTiming),
                 "cudaEventCreate");
  return tpf_cuda__gemm_create(TPF_MAX_COMPUTE_STREAMS,
                               tpf_cuda__param_u64(TPF_CUDA_PARAM_WORKSPACE_BYTES), &b->gemm);
}

/* Collective: the device, who is where, then the streams. After each local part every rank
 * learns every other's outcome (tpf_cuda__boot_outcome), so a CUDA failure on one rank fails the
 * creation on all of them at once, naming it, instead of leaving them in the bootstrap until its
 * timeout. */
static tpf_status tpf_cuda__backend_init(tpf_cuda_backend *b) {
  const tpf_bootstrap *boot = &b->boot;
  const uint64_t ms = tpf_cuda__param_u64(TPF_CUDA_PARAM_BOOT_TIMEOUT_MS);
  const char *what = "create its CUDA backend";
  TPF_CHECK(tpf_cuda__boot_outcome(boot, tpf_cuda__backend_device(b), what, ms));
  /* Who is where: decides direct pointers versus CUDA IPC at registration. */
  tpf_cuda_peer_info me;
  memset(&me, 0, sizeof(me));
  me.proc_token = tpf_cuda__proc_token();
  me.device = boot->device;
  me.rank = boot->rank;
  me.host = tpf_cuda__host_hash();
  me.pid = (int64_t)getpid();
  TPF_CHECK(boot->allgather(boot->ctx, &me, b->peers, sizeof(me)));
  for (int q = 0; q < boot->tp_size; q++)
    TPF_RETURN_IF(b->peers[q].rank != q, TPF_EINVAL,
                  "bootstrap allgather put rank %d's record in slot %d", (int)b->peers[q].rank, q);
  return tpf_cuda__boot_outcome(boot, tpf_cuda__backend_streams(b, &me), what, ms);
}

tpf_status tpf_cuda_backend_create(const tpf_bootstrap *boot, tpf_backend **out) {
  TPF_RETURN_IF(boot == NULL || out == NULL, TPF_EINVAL, "tpf_cuda_backend_create: NULL argument");
  TPF_RETURN_IF(boot->tp_size < 1 || boot->tp_size > TPF_MAX_RANKS, TPF_EINVAL,
                "tp_size %d outside 1..%d", boot->tp_size, TPF_MAX_RANKS);
  TPF_RETURN_IF(boot->rank < 0 || boot->rank >= boot->tp_size, TPF_EINVAL, "rank %d outside 0..%d",
                boot->rank, boot->tp_size - 1);
  TPF_RETURN_IF(boot->allgather == NULL || boot->barrier == NULL, TPF_EINVAL,
                "bootstrap lacks allgather or barrier");
  TPF_RETURN_IF(boot->device < 0, TPF_EINVAL, "device %d is negative", boot->device);
  tpf_cuda__param_load(boot->rank); /* the environment, once per process */
  tpf_cuda_backend *b = tpf_calloc(1, sizeof(*b));
  if (b == NULL) /* still part of the first exchange: the peers learn it there */
    return tpf_cuda__boot_outcome(
        boot, tpf_set_error(TPF_ENOMEM, "cannot allocate the CUDA backend"),
        "create its CUDA backend", tpf_cuda__param_u64(TPF_CUDA_PARAM_BOOT_TIMEOUT_MS));
  b->base.ops = &tpf_cuda__ops;
  b->base.tp_size = boot->tp_size;
  b->base.rank = boot->rank;
  b->boot = *boot;
  b->device = boot->device;
  b->timeout_ns = tpf_cuda__param_u64(TPF_CUDA_PARAM_TIMEOUT_MS) * 1000000ull;
  /* Clamped by the registry: 1..1024 CTAs, 1..TPF_MAX_COMPUTE_STREAMS streams. */
  b->comm_ctas = (int)tpf_cuda__param_u64(TPF_CUDA_PARAM_COMM_CTAS);
  b->compute_streams = (int)tpf_cuda__param_u64(TPF_CUDA_PARAM_COMPUTE_STREAMS);
  b->lean = tpf_cuda__param_u64(TPF_CUDA_PARAM_LEAN_ENQUEUE) != 0;
  tpf_status rc = tpf_cuda__backend_init(b);
  if (rc != TPF_OK) {
    (void)tpf_cuda__backend_free(b); /* rc says what went wrong */
    return rc;
  }
  TPF_CUDA_INFO(INIT, b->base.rank,
                "backend of %d ranks on device %d (%d SMs): %d compute streams, %d comm CTAs, "
                "timeout %llu ms, %s enqueue%s",
                b->base.tp_size, b->device, b->num_sms, b->compute_streams, b->comm_ctas,
                (unsigned long long)(b->timeout_ns / 1000000ull), b->lean ? "lean" : "full",
                tpf_cuda__param_on(TPF_CUDA_PARAM_GEMM_FALLBACK) ? ", every GEMM by the fallback"
                                                                 : "");
  *out = &b->base;
  return TPF_OK;
}

tpf_status tpf_cuda_backend_destroy(tpf_backend *be) {
  TPF_RETURN_IF(be == NULL || be->ops != &tpf_cuda__ops, TPF_EINVAL,
                "tpf_cuda_backend_destroy: not a CUDA backend");
  tpf_cuda_backend *b = tpf_cuda__of(be);
  tpf_status rc = tpf_cuda__sync(be, NULL);
  const tpf_status rc2 = tpf_cuda__backend_free(b);
  return rc != TPF_OK ? rc : rc2;
}

tpf_status tpf_cuda_backend_set_timeout(tpf_backend *be, unsigned timeout_ms) {
  TPF_RETURN_IF(be == NULL || be->ops != &tpf_cuda__ops, TPF_EINVAL,
                "tpf_cuda_backend_set_timeout: not a CUDA backend");
  TPF_RETURN_IF(timeout_ms == 0, TPF_EINVAL, "timeout of 0 ms");
  tpf_cuda__of(be)->timeout_ns = (uint64_t)timeout_ms * 1000000ull;
  return TPF_OK;
}

tpf_status tpf_cuda_backend_stats(tpf_backend *be, tpf_cuda_stats *out) {
  TPF_RETURN_IF(be == NULL || be->ops != &tpf_cuda__ops || out == NULL, TPF_EINVAL,
                "tpf_cuda_backend_stats: not a CUDA backend, or out is NULL");
  tpf_cuda_stats s;
  tpf_cuda__gemm_stats(tpf_cuda__of(be)->gemm, &s.gemm_heuristic_queries, &s.gemm_cache_hits,
                       &s.gemm_fallbacks);
  *out = s;
  return TPF_OK;
}

tpf_status tpf_cuda_backend_enqueue_stats(tpf_backend *be, tpf_cuda_enqueue_stats *out) {
  TPF_RETURN_IF(be == NULL || be->ops != &tpf_cuda__ops || out == NULL, TPF_EINVAL,
                "tpf_cuda_backend_enqueue_stats: not a CUDA backend, or out is NULL");
  static const size_t released[] = {sizeof(*out)}; /* 0.2's layout */
  TPF_CHECK(tpf_check_struct_size("tpf_cuda_backend_enqueue_stats", "stats",
                                  "tpf_cuda_enqueue_stats", out->size, released,
                                  TPF_ARRAY_SIZE(released)));
  const size_t size = out->size == 0 ? sizeof(*out) : out->size;
  tpf_cuda_enqueue_stats s = tpf_cuda__of(be)->enq;
  s.size = size;
  memcpy(out, &s, size);
  return TPF_OK;
}

tpf_status tpf_cuda_backend_comm_timing(tpf_backend *be, const char *name,
                                        tpf_cuda_comm_timing *out, int reset) {
  TPF_RETURN_IF(be == NULL || be->ops != &tpf_cuda__ops || name == NULL || out == NULL, TPF_EINVAL,
                "tpf_cuda_backend_comm_timing: not a CUDA backend, or name or out is NULL");
  static const size_t released[] = {sizeof(*out)};
  TPF_CHECK(tpf_check_struct_size("tpf_cuda_backend_comm_timing", "timing", "tpf_cuda_comm_timing",
                                  out->size, released, TPF_ARRAY_SIZE(released)));
  const size_t size = out->size == 0 ? sizeof(*out) : out->size;
  tpf_cuda_comm_timing t;
  memset(&t, 0, sizeof t);
  for (tpf_reg *r = tpf_cuda__of(be)->timed_regs; r != NULL; r = r->next_timed)
    if (strcmp(r->name, name) == 0) {
      tpf_cuda__timing_read(r, &t, reset != 0);
      break;
    }
  t.size = size;
  memcpy(out, &t, size);
  return TPF_OK;
}

const char *tpf_cuda_enq_kind_name(tpf_cuda_enq_kind k) {
  static const char *const names[TPF_CUDA_ENQ_COUNT] = {
      [TPF_CUDA_ENQ_GEMM] = "gemm",     [TPF_CUDA_ENQ_COPY] = "copy",
      [TPF_CUDA_ENQ_SIGNAL] = "signal", [TPF_CUDA_ENQ_RECORD] = "record",
      [TPF_CUDA_ENQ_WAIT] = "wait",     [TPF_CUDA_ENQ_PEER_WAIT] = "peer_wait"};
  return (unsigned)k < TPF_CUDA_ENQ_COUNT ? names[k] : "?";
}

/* The configuration exchange of tpf_comm_create (tpf_backend_ops.allgather): over the bootstrap,
 * bounded by this backend's timeout where the bootstrap allows it (tpflex's threads and NCCL
 * bootstraps; a caller's own bootstrap waits as its allgather does: cuda_bootstrap.c). No device
 * work is enqueued, so nothing of any registration is touched. */
static tpf_status tpf_cuda__allgather(tpf_backend *be, const void *mine, void *all, size_t bytes) {
  tpf_cuda_backend *b = tpf_cuda__of(be);
  const uint64_t ms = b->timeout_ns / 1000000ull;
  tpf_status rc = tpf_cuda__boot_allgather(&b->boot, mine, all, bytes, ms > 0 ? ms : 1);
  if (rc == TPF_OK || rc == TPF_EMISMATCH) return rc; /* a mismatch already says what */
  return tpf_prefix_error(rc, "rank %d, configuration exchange at creation: ", be->rank);
}
