/* The CUDA backend's device-flags transport: ranks in other processes of the node (CUDA IPC),
 * and in-process ranks under TPF_CUDA_DEVICE_FLAGS (a diagnostic: spinning waits of ranks that
 * share one GPU can stall, docs/results/h200.md).
 *
 * Method. The flag protocol of tpflex_backend.h on the flags and ready words of every rank's
 * registration (layout in cuda_internal.h), mapped into this rank's context by cuda_reg.c:
 *   HANDSHAKE   1-thread kernel: ready word into every peer, wait for every peer's, compare the
 *               body (operation key: kind and split count; active rows).
 *   SEND        after the bytes, a 1-thread kernel that stores seq into the peer's flag
 *               [me][tag] (one store per message).
 *   RECV        1-thread kernel waiting until my flag [peer][tag] >= seq.
 *   BARRIER     1-thread kernel: store seq into every peer's flag [me][tag], wait for all.
 * The kernels (cuda_kernels.cu) bound every wait by the backend's timeout and report into the
 * status area (cuda_status.c). Ranks in other processes first agree on the host through a
 * shared-memory table per registration (cuda_hostsync.c), so that a disagreement moves no byte;
 * where that table cannot be set up, only the device handshake remains.
 */
#define _POSIX_C_SOURCE 200809L
#include "cuda_state.h"
#include "cuda_error.h"

#include "cuda_log.h"

#include "tpflex/tpflex_backend_support.h"

#include <cuda.h> /* driver types of the stream memory operations only: no link to libcuda */
#include <pthread.h>
#include <string.h>

static uint64_t *tpf_cuda__flags(const tpf_reg *r, int owner) {
  return (uint64_t *)(r->peer_base[owner] + r->flags_off);
}

/* The ready word `sender` writes into `owner`'s registration. */
static uint64_t *tpf_cuda__ready(const tpf_reg *r, int owner, int sender, uint64_t seq) {
  /* Two words per sender, by sequence parity: a peer may announce seq+1 before this rank's
   * handshake kernel has read seq (never seq+2, which needs this rank's seq+1). */
  return (uint64_t *)(r->peer_base[owner] + r->ready_off +
                      (uint64_t)sender * TPF_CUDA_READY_STRIDE + (seq & 1u) * sizeof(uint64_t));
}

static void tpf_cuda__flag_init(tpf_cuda_backend *b, const tpf_reg *r, const tpf_exec_args *a,
                                tpf_step_kind kind, uint32_t tag, tpf_cuda_flag_args *f) {
  memset(f, 0, sizeof(*f));
  f->status = r->status_dev; /* the registration's own area */
  f->claim = r->claim_dev;
  f->timeout_ns = b->timeout_ns;
  f->seq = a->seq;
  f->store_value = a->seq;
  f->wait_value = a->seq;
  f->nranks = b->base.tp_size;
  f->kind = (uint32_t)kind;
  f->tag = tag;
}

static tpf_status tpf_cuda__launch_flags_checked(const tpf_cuda_flag_args *f, cudaStream_t s) {
  TPF_CUDA_TRY(tpf_cuda__launch_flags(f, s), "flag kernel launch");
  return TPF_OK;
}

/* The words of a sender's captured operations in the owner's ready slot (cuda_state.h). */
static uint64_t *tpf_cuda__slot(const tpf_reg *r, int owner, int sender, uint64_t off) {
  return (uint64_t *)(r->peer_base[owner] + r->ready_off +
                      (uint64_t)sender * TPF_CUDA_READY_STRIDE + off);
}

/* The flag `sender` raises in `owner`'s registration for tag: the eager one, or under capture
 * the captured one (the "graph" section below). */
static uint64_t *tpf_cuda__flag_word(const tpf_reg *r, int owner, int sender, uint32_t tag,
                                     bool graph) {
  if (graph) return tpf_cuda__slot(r, owner, sender, TPF_CUDA_SLOT_GRAPH_FLAGS) + tag;
  return tpf_cuda__flags(r, owner) + (uint64_t)sender * TPF_MAX_TAGS + tag;
}

/* The kernel arguments of a step; graph: a captured operation's (its sequence number is read on
 * the device from this rank's counter). */
static void tpf_cuda__kn_init(tpf_cuda_backend *b, const tpf_reg *r, const tpf_exec_args *a,
                              tpf_step_kind kind, uint32_t tag, bool graph, tpf_cuda_flag_args *f) {
  const int me = b->base.rank;
  tpf_cuda__flag_init(b, r, a, kind, tag, f);
  if (graph) f->dev_seq = tpf_cuda__slot(r, me, me, TPF_CUDA_SLOT_GRAPH_SEQ);
}

static tpf_status tpf_cuda__kn_handshake(tpf_cuda_backend *b, tpf_reg *r, const tpf_exec_args *a,
                                         cudaStream_t s, bool graph) {
  const tpf_schedule *sc = a->sched;
  const int P = b->base.tp_size, me = b->base.rank;
  tpf_cuda_flag_args f;
  tpf_cuda__kn_init(b, r, a, TPF_STEP_HANDSHAKE, 0, graph, &f);
  f.handshake = 1;
  f.store_value = TPF_READY_WORD(a->seq, sc->op_key, sc->rows);
  f.wait_value = a->seq & TPF_READY_SEQ_MASK;
  f.rows = TPF_READY_BODY(f.store_value);
  for (int q = 0; q < P; q++) {
    if (q == me) continue;
    /* Captured: the parity-0 word; the kernel adds the device sequence number's parity. */
    f.remote[q] = graph ? tpf_cuda__slot(r, q, me, TPF_CUDA_SLOT_GRAPH_READY)
                        : tpf_cuda__ready(r, q, me, a->seq);
    f.local[q] = graph ? tpf_cuda__slot(r, me, q, TPF_CUDA_SLOT_GRAPH_READY)
                       : tpf_cuda__ready(r, me, q, a->seq);
  }
  return TPF_CUDA_ENQ(b, SIGNAL, tpf_cuda__launch_flags_checked(&f, s));
}

static tpf_status tpf_cuda__kn_send(tpf_cuda_backend *b, tpf_reg *r, const tpf_exec_args *a,
                                    const tpf_step *st, cudaStream_t s, bool graph) {
  tpf_cuda_flag_args f;
  tpf_cuda__kn_init(b, r, a, TPF_STEP_SEND, st->tag, graph, &f);
  f.remote[st->peer] = tpf_cuda__flag_word(r, st->peer, b->base.rank, st->tag, graph);
  return TPF_CUDA_ENQ(b, SIGNAL, tpf_cuda__launch_flags_checked(&f, s));
}

static tpf_status tpf_cuda__kn_recv(tpf_cuda_backend *b, tpf_reg *r, const tpf_exec_args *a,
                                    const tpf_step *st, cudaStream_t s, bool graph) {
  tpf_cuda_flag_args f;
  tpf_cuda__kn_init(b, r, a, TPF_STEP_RECV, st->tag, graph, &f);
  f.local[st->peer] = tpf_cuda__flag_word(r, b->base.rank, st->peer, st->tag, graph);
  return TPF_CUDA_ENQ(b, SIGNAL, tpf_cuda__launch_flags_checked(&f, s));
}

static tpf_status tpf_cuda__kn_barrier(tpf_cuda_backend *b, tpf_reg *r, const tpf_exec_args *a,
                                       const tpf_step *st, cudaStream_t s, bool graph) {
  const int P = b->base.tp_size, me = b->base.rank;
  tpf_cuda_flag_args f;
  tpf_cuda__kn_init(b, r, a, TPF_STEP_BARRIER, st->tag, graph, &f);
  for (int q = 0; q < P; q++) {
    if (q == me) continue;
    f.remote[q] = tpf_cuda__flag_word(r, q, me, st->tag, graph);
    f.local[q] = tpf_cuda__flag_word(r, me, q, st->tag, graph);
  }
  return TPF_CUDA_ENQ(b, SIGNAL, tpf_cuda__launch_flags_checked(&f, s));
}

static tpf_status tpf_cuda__fl_handshake(tpf_cuda_backend *b, tpf_reg *r, const tpf_exec_args *a,
                                         cudaStream_t s) {
  return tpf_cuda__kn_handshake(b, r, a, s, false);
}

static tpf_status tpf_cuda__fl_send(tpf_cuda_backend *b, tpf_reg *r, const tpf_exec_args *a,
                                    int idx, const tpf_step *st, cudaStream_t s) {
  (void)idx;
  return tpf_cuda__kn_send(b, r, a, st, s, false);
}

static tpf_status tpf_cuda__fl_recv(tpf_cuda_backend *b, tpf_reg *r, const tpf_exec_args *a,
                                    int idx, const tpf_step *st, cudaStream_t s) {
  (void)idx;
  return tpf_cuda__kn_recv(b, r, a, st, s, false);
}

static tpf_status tpf_cuda__fl_barrier(tpf_cuda_backend *b, tpf_reg *r, const tpf_exec_args *a,
                                       int idx, const tpf_step *st, cudaStream_t s) {
  (void)idx;
  return tpf_cuda__kn_barrier(b, r, a, st, s, false);
}

/* Ranks in other processes agree on the host before anything is enqueued (cuda_hostsync.c). */
static tpf_status tpf_cuda__fl_connect(tpf_cuda_backend *b, tpf_reg *r,
                                       const tpf_cuda_reg_info *infos) {
  (void)infos;
  if (!r->remote) return TPF_OK;
  return tpf_cuda__hostsync_create(&b->boot, r->name, &r->hostsync);
}

static void tpf_cuda__fl_free(tpf_cuda_backend *b, tpf_reg *r) {
  (void)b;
  tpf_cuda__hostsync_destroy(r->hostsync);
}

static tpf_status tpf_cuda__fl_agree(tpf_cuda_backend *b, tpf_reg *r, const tpf_exec_args *a) {
  const tpf_schedule *sc = a->sched;
  if (r->hostsync == NULL) return TPF_OK;
  const uint64_t t0 = tpf_cuda__now_ns();
  tpf_status rc = tpf_cuda__hostsync_agree(r->hostsync, a->comm_name, a->seq,
                                           TPF_READY_BODY(TPF_READY_WORD(0, sc->op_key, sc->rows)),
                                           b->timeout_ns);
  tpf_cuda__enq_peer_wait(b, t0);
  return tpf_cuda__blame_gone(b->peers, b->base.tp_size, b->base.rank, rc);
}

const tpf_cuda_transport tpf_cuda__transport_flags = {
    .name = "flags",
    .host_ordered = false,
    .setup = NULL, /* the peers' flags live in their registrations: nothing more to exchange */
    .connect = tpf_cuda__fl_connect,
    .free = tpf_cuda__fl_free,
    .agree = tpf_cuda__fl_agree,
    .handshake = tpf_cuda__fl_handshake,
    .send = tpf_cuda__fl_send,
    .recv_ready = NULL, /* waits are on the device: enqueued at once */
    .recv = tpf_cuda__fl_recv,
    .barrier_arrive = NULL,
    .barrier_missing = NULL,
    .barrier = tpf_cuda__fl_barrier,
};

/* ---- memops: the same flags, signalled by stream memory operations ----
 *
 * Method. SEND's signal is cuStreamWriteValue64 of seq into the peer's flag [me][tag] (the write
 * is preceded by a memory barrier, so the bytes the stream copied before it land first); RECV is
 * cuStreamWaitValue64 on my flag [peer][tag] >= seq; BARRIER and HANDSHAKE are one
 * cuStreamBatchMemOp each: a write into every peer, then a wait on every peer's word. The
 * handshake uses a monotonic word per sender (offset 16 of its ready slot, holding the latest
 * operation's seq) and leaves the comparison of operation key and rows to the host agreement
 * (cuda_hostsync.c), which runs before anything is enqueued; without that table the flag
 * kernel's handshake runs instead. Why: a wait in the GPU's front end occupies no SM and, with
 * ranks in other processes sharing one GPU, does not keep the waiting process's time slice busy
 * as a spinning kernel does (docs/results/h200.md, session 4). The cost: the device does not bound
 * these waits. The host does: sync, reg_sync and destroy poll with the backend's timeout and on
 * expiry release every wait of this rank (tpf_cuda__memops_release). A wait cannot see which
 * peer stopped, and a ring's waits cascade behind a dead rank, so every timeout also checks the
 * peers' processes and names one that exited (tpf_cuda__blame_gone, cuda_hostsync.c); the next
 * operation's host agreement names it too. Opt-in (TPF_CUDA_MEMOPS=1) while it is measured. */

typedef CUresult (*tpf_cuda_wait64_fn)(CUstream, CUdeviceptr, cuuint64_t, unsigned int);
typedef CUresult (*tpf_cuda_write64_fn)(CUstream, CUdeviceptr, cuuint64_t, unsigned int);
typedef CUresult (*tpf_cuda_batch_fn)(CUstream, unsigned int, CUstreamBatchMemOpParams *,
                                      unsigned int);
typedef CUresult (*tpf_cuda_attr_fn)(int *, CUdevice_attribute, CUdevice);

static struct {
  pthread_once_t once;
  tpf_cuda_wait64_fn wait64;
  tpf_cuda_write64_fn write64;
  tpf_cuda_batch_fn batch;
  tpf_cuda_attr_fn attr;
} tpf_cuda__mo = {.once = PTHREAD_ONCE_INIT};

static void *tpf_cuda__entry(const char *sym) {
  void *fn = NULL;
  enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPointByVersion(sym, &fn, 12000, cudaEnableDefault, &q) != cudaSuccess ||
      q != cudaDriverEntryPointSuccess)
    return NULL;
  return fn;
}

static void tpf_cuda__mo_load(void) {
  tpf_cuda__mo.wait64 = (tpf_cuda_wait64_fn)tpf_cuda__entry("cuStreamWaitValue64");
  tpf_cuda__mo.write64 = (tpf_cuda_write64_fn)tpf_cuda__entry("cuStreamWriteValue64");
  tpf_cuda__mo.batch = (tpf_cuda_batch_fn)tpf_cuda__entry("cuStreamBatchMemOp");
  tpf_cuda__mo.attr = (tpf_cuda_attr_fn)tpf_cuda__entry("cuDeviceGetAttribute");
  (void)cudaGetLastError();
}

bool tpf_cuda__memops_available(int device) {
  pthread_once(&tpf_cuda__mo.once, tpf_cuda__mo_load);
  if (!tpf_cuda__mo.wait64 || !tpf_cuda__mo.write64 || !tpf_cuda__mo.batch || !tpf_cuda__mo.attr)
    return false;
  int ok = 0;
  if (tpf_cuda__mo.attr(&ok, CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, device) !=
      CUDA_SUCCESS)
    return false;
  return ok != 0;
}

static tpf_status tpf_cuda__cu(CUresult rc, const char *what) {
  if (rc == CUDA_SUCCESS) return TPF_OK;
  return tpf_set_error(TPF_EBACKEND, "%s failed: CUresult %d", what, (int)rc);
}

static CUdeviceptr tpf_cuda__dptr(const void *p) {
  return (CUdeviceptr)(uintptr_t)p;
}

/* The monotonic handshake word `sender` writes into `owner`'s ready slot. */
static uint64_t *tpf_cuda__hs_word(const tpf_reg *r, int owner, int sender) {
  return (uint64_t *)(r->peer_base[owner] + r->ready_off +
                      (uint64_t)sender * TPF_CUDA_READY_STRIDE + 2 * sizeof(uint64_t));
}

/* Writes value into every remote word and then waits for every local word >= value, in one
 * call. */
static tpf_status tpf_cuda__mo_exchange(uint64_t *const remote[], const uint64_t *const local[],
                                        int n, uint64_t value, cudaStream_t s, const char *what) {
  CUstreamBatchMemOpParams ops[2 * TPF_CUDA_MAX_PEERS];
  memset(ops, 0, sizeof ops);
  int k = 0;
  for (int q = 0; q < n; q++) {
    if (remote[q] == NULL) continue;
    ops[k].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_64;
    ops[k].writeValue.address = tpf_cuda__dptr(remote[q]);
    ops[k].writeValue.value64 = value;
    ops[k].writeValue.flags = CU_STREAM_WRITE_VALUE_DEFAULT;
    k++;
  }
  for (int q = 0; q < n; q++) {
    if (local[q] == NULL) continue;
    ops[k].waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_64;
    ops[k].waitValue.address = tpf_cuda__dptr(local[q]);
    ops[k].waitValue.value64 = value;
    ops[k].waitValue.flags = CU_STREAM_WAIT_VALUE_GEQ;
    k++;
  }
  if (k == 0) return TPF_OK;
  return tpf_cuda__cu(tpf_cuda__mo.batch((CUstream)s, (unsigned)k, ops, 0), what);
}

static tpf_status tpf_cuda__mo_handshake(tpf_cuda_backend *b, tpf_reg *r, const tpf_exec_args *a,
                                         cudaStream_t s) {
  if (r->hostsync == NULL) return tpf_cuda__fl_handshake(b, r, a, s); /* the device compares */
  const int P = b->base.tp_size, me = b->base.rank;
  uint64_t *remote[TPF_CUDA_MAX_PEERS] = {NULL};
  const uint64_t *local[TPF_CUDA_MAX_PEERS] = {NULL};
  for (int q = 0; q < P; q++) {
    if (q == me) continue;
    remote[q] = tpf_cuda__hs_word(r, q, me);
    local[q] = tpf_cuda__hs_word(r, me, q);
  }
  return TPF_CUDA_ENQ(
      b, SIGNAL,
      tpf_cuda__mo_exchange(remote, local, P, a->seq, s, "cuStreamBatchMemOp(handshake)"));
}

static tpf_status tpf_cuda__mo_send(tpf_cuda_backend *b, tpf_reg *r, const tpf_exec_args *a,
                                    int idx, const tpf_step *st, cudaStream_t s) {
  (void)idx;
  uint64_t *w = tpf_cuda__flags(r, st->peer) + (uint64_t)b->base.rank * TPF_MAX_TAGS + st->tag;
  return TPF_CUDA_ENQ(b, SIGNAL,
                      tpf_cuda__cu(tpf_cuda__mo.write64((CUstream)s, tpf_cuda__dptr(w), a->seq,
                                                        CU_STREAM_WRITE_VALUE_DEFAULT),
                                   "cuStreamWriteValue64(send)"));
}

static tpf_status tpf_cuda__mo_recv(tpf_cuda_backend *b, tpf_reg *r, const tpf_exec_args *a,
                                    int idx, const tpf_step *st, cudaStream_t s) {
  (void)idx;
  uint64_t *w = tpf_cuda__flags(r, b->base.rank) + (uint64_t)st->peer * TPF_MAX_TAGS + st->tag;
  return TPF_CUDA_ENQ(b, SIGNAL,
                      tpf_cuda__cu(tpf_cuda__mo.wait64((CUstream)s, tpf_cuda__dptr(w), a->seq,
                                                       CU_STREAM_WAIT_VALUE_GEQ),
                                   "cuStreamWaitValue64(recv)"));
}

static tpf_status tpf_cuda__mo_barrier(tpf_cuda_backend *b, tpf_reg *r, const tpf_exec_args *a,
                                       int idx, const tpf_step *st, cudaStream_t s) {
  (void)idx;
  const int P = b->base.tp_size, me = b->base.rank;
  uint64_t *remote[TPF_CUDA_MAX_PEERS] = {NULL};
  const uint64_t *local[TPF_CUDA_MAX_PEERS] = {NULL};
  for (int q = 0; q < P; q++) {
    if (q == me) continue;
    remote[q] = tpf_cuda__flags(r, q) + (uint64_t)me * TPF_MAX_TAGS + st->tag;
    local[q] = tpf_cuda__flags(r, me) + (uint64_t)q * TPF_MAX_TAGS + st->tag;
  }
  return TPF_CUDA_ENQ(
      b, SIGNAL, tpf_cuda__mo_exchange(remote, local, P, a->seq, s, "cuStreamBatchMemOp(barrier)"));
}

static tpf_status tpf_cuda__mo_connect(tpf_cuda_backend *b, tpf_reg *r,
                                       const tpf_cuda_reg_info *infos) {
  TPF_CHECK(tpf_cuda__fl_connect(b, r, infos));
  if (b->release_stream == NULL)
    TPF_CUDA_TRY(cudaStreamCreateWithFlags(&b->release_stream, cudaStreamNonBlocking),
                 "cudaStreamCreate(release)");
  r->next_memops = b->memops_regs;
  b->memops_regs = r;
  return TPF_OK;
}

static void tpf_cuda__mo_free(tpf_cuda_backend *b, tpf_reg *r) {
  for (tpf_reg **pp = &b->memops_regs; *pp != NULL; pp = &(*pp)->next_memops)
    if (*pp == r) {
      *pp = r->next_memops;
      break;
    }
  tpf_cuda__fl_free(b, r);
}

tpf_status tpf_cuda__memops_release(tpf_cuda_backend *b, tpf_reg *r) {
  if (atomic_exchange(&r->released, 1)) return TPF_OK;
  /* Bytes of 0x40: every 64-bit word reads 0x4040404040404040, >= any sequence number in the
   * cyclic comparison of CU_STREAM_WAIT_VALUE_GEQ. Flags and ready slots are contiguous. */
  char *lo = r->base + r->flags_off;
  const uint64_t bytes =
      r->ready_off - r->flags_off + (uint64_t)b->base.tp_size * TPF_CUDA_READY_STRIDE;
  TPF_CUDA_TRY(cudaMemsetAsync(lo, 0x40, bytes, b->release_stream), "cudaMemsetAsync(release)");
  TPF_CUDA_WARN(TRANSPORT, b->base.rank,
                "'%s': released every pending stream-memory wait of this rank (a peer never "
                "signalled within %llu ms)",
                r->name, (unsigned long long)(b->timeout_ns / 1000000ull));
  return TPF_OK;
}

const tpf_cuda_transport tpf_cuda__transport_memops = {
    .name = "memops",
    .host_ordered = false,
    .setup = NULL,
    .connect = tpf_cuda__mo_connect,
    .free = tpf_cuda__mo_free,
    .agree = tpf_cuda__fl_agree,
    .handshake = tpf_cuda__mo_handshake,
    .send = tpf_cuda__mo_send,
    .recv_ready = NULL,
    .recv = tpf_cuda__mo_recv,
    .barrier_arrive = NULL,
    .barrier_missing = NULL,
    .barrier = tpf_cuda__mo_barrier,
};

/* ---- graph: operations captured into a CUDA graph ----
 *
 * Method. Everything a captured operation does is replayed as captured, so nothing of it may
 * depend on the host at enqueue time: no host agreement, no host-ordered events, no sequence
 * number in a kernel's arguments. Each rank keeps a device counter per registration (its own
 * ready slot, TPF_CUDA_SLOT_GRAPH_SEQ), bumped by a 1-thread kernel on the caller's stream before
 * the operation forks (tpf_cuda__graph_begin), so every step of the operation reads the same
 * value and the next operation's bump waits for the join. The flag kernels read it (dev_seq) and
 * signal and wait on words of their own (the captured ready words and flags of the ready slots,
 * cuda_state.h): all ranks run the same operations in the same order, so their counters agree,
 * and eager operations, which count on the host, keep their own words. The HANDSHAKE kernel
 * compares the operation key and the active rows, which the capture fixed, so ranks that replay
 * different graphs (another T, another operation) fail with TPF_CUDA_DEV_MISMATCH; every later
 * kernel of the registration (the copy kernels included: captured SENDs copy with them, not the
 * copy engine, cuda_exec.c) sees the status and skips, so no byte moves, and sync reports
 * TPF_EMISMATCH. Waits are bounded on the device as the flag kernels' always are. Used by every
 * rank mode: in-process ranks, whose eager transport is host-ordered, too. */

tpf_status tpf_cuda__graph_begin(tpf_cuda_backend *b, tpf_reg *r, cudaStream_t s) {
  const int me = b->base.rank;
  if (b->base.tp_size == 1) return TPF_OK;
  TPF_CUDA_TRY(TPF_CUDA_ENQ(b, SIGNAL,
                            tpf_cuda__launch_seq_bump(
                                tpf_cuda__slot(r, me, me, TPF_CUDA_SLOT_GRAPH_SEQ), s)),
               "sequence kernel launch");
  return TPF_OK;
}

static tpf_status tpf_cuda__gr_handshake(tpf_cuda_backend *b, tpf_reg *r, const tpf_exec_args *a,
                                         cudaStream_t s) {
  return tpf_cuda__kn_handshake(b, r, a, s, true);
}

static tpf_status tpf_cuda__gr_send(tpf_cuda_backend *b, tpf_reg *r, const tpf_exec_args *a,
                                    int idx, const tpf_step *st, cudaStream_t s) {
  (void)idx;
  return tpf_cuda__kn_send(b, r, a, st, s, true);
}

static tpf_status tpf_cuda__gr_recv(tpf_cuda_backend *b, tpf_reg *r, const tpf_exec_args *a,
                                    int idx, const tpf_step *st, cudaStream_t s) {
  (void)idx;
  return tpf_cuda__kn_recv(b, r, a, st, s, true);
}

static tpf_status tpf_cuda__gr_barrier(tpf_cuda_backend *b, tpf_reg *r, const tpf_exec_args *a,
                                       int idx, const tpf_step *st, cudaStream_t s) {
  (void)idx;
  return tpf_cuda__kn_barrier(b, r, a, st, s, true);
}

const tpf_cuda_transport tpf_cuda__transport_graph = {
    .name = "graph",
    .host_ordered = false,
    .setup = NULL,
    .connect = NULL, /* never a registration's own transport */
    .free = NULL,
    .agree = NULL, /* the device handshake compares: a replay runs no host code */
    .handshake = tpf_cuda__gr_handshake,
    .send = tpf_cuda__gr_send,
    .recv_ready = NULL,
    .recv = tpf_cuda__gr_recv,
    .barrier_arrive = NULL,
    .barrier_missing = NULL,
    .barrier = tpf_cuda__gr_barrier,
};
