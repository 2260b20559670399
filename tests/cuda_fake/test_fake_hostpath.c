/* The CUDA backend's host path on the CPU, over the counting fake CUDA (fake_cuda.h): every call
 * an operation makes is seen, nothing it computes is (kernels and GEMMs do not run).
 *
 * Checked, per operation kind (ring_ag+gemm, gemm+ring_rs, gemm+pipeline_rs, bulk_ag+gemm,
 * bulk_rs+gemm, and the aggregate ring AG), ranks as threads of this process:
 *  - P = 1 (issue 24 item 2): an operation is exactly its one GEMM, of the whole layer's shape:
 *    one cublasLtMatmul (M, N, K of the operation at active T), no kernel, no copy, no memset, no
 *    stream memory operation, no stream wait, no allocation, no host synchronisation, no cuBLASLt
 *    setup once the shape was seen, at most one event record; for every active T tried.
 *  - P = 2 and 4 (item 3): from creation to destruction, through shape changes and repeated
 *    operations, no device or pinned allocation and no free (registered once, at capacity), no
 *    host synchronisation inside an operation, and cuBLASLt setup only for a shape not seen
 *    before; the backend's own enqueue statistics (what `tpflex bench --section host` prints as
 *    "calls") agree with the calls the fake saw, kind by kind.
 *  - Destruction gives back every allocation made since the backend's creation.
 *  - A cublasLtMatmul failure (injected) is TPF_EBACKEND naming cublasLtMatmul, and the
 *    communicator reports it again at sync, then refuses operations with TPF_ESTATE.
 * The per-operation call counts are printed (figures, not judged: they change with the design).
 */
#define _POSIX_C_SOURCE 200809L
#include "fake_cuda.h"
#include "tpflex/tpflex.h"
#include "tpflex/tpflex_backend.h"
#include "tpflex/tpflex_cuda.h"

#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { C = 512, H = 64, NN = 32, MAXP = 4 };

typedef enum { K_RING_AG, K_AGG_AG, K_RING_RS, K_PIPE_RS, K_BULK_AG, K_BULK_RS, K_COUNT } kind;
static const struct {
  const char *name;
  tpf_algo algo;
  tpf_coll coll;
  bool aggregate;
} kKinds[K_COUNT] = {
    {"ring_ag+gemm", TPF_ALGO_RING, TPF_COLL_AG, false},
    {"ring_ag(aggregate)+gemm", TPF_ALGO_RING, TPF_COLL_AG, true},
    {"gemm+ring_rs", TPF_ALGO_RING, TPF_COLL_RS, false},
    {"gemm+pipeline_rs", TPF_ALGO_PIPELINE, TPF_COLL_RS, false},
    {"bulk_ag+gemm", TPF_ALGO_BULK, TPF_COLL_AG, false},
    {"bulk_rs+gemm", TPF_ALGO_BULK, TPF_COLL_RS, false},
};

static int g_failures;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;

static void fail(int rank, int line, const char *fmt, ...) {
  pthread_mutex_lock(&g_mu);
  g_failures++;
  fprintf(stderr, "FAIL rank %d line %d: ", rank, line);
  va_list ap;
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fprintf(stderr, "\n");
  pthread_mutex_unlock(&g_mu);
}

#define CHECK(rank, cond, ...)                                                                     \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      fail(rank, __LINE__, __VA_ARGS__);                                                           \
      return 1;                                                                                    \
    }                                                                                              \
  } while (0)
#define OK(rank, call) CHECK(rank, (call) == TPF_OK, "%s: %s", #call, tpf_last_error())

/* ---- one rank ------------------------------------------------------------------------------ */

typedef struct {
  int rank, P;
  tpf_cuda_threads *g;
  int (*body)(int rank, int P, tpf_backend *be, void *arg);
  void *arg;
  int rc;
  bool tolerant;         /* a failed backend creation is recorded, not a test failure */
  tpf_status create_st;  /* the backend creation's status */
  tpf_status destroy_st; /* the backend destruction's */
  char create_err[256];
} rank_job;

static void *rank_main(void *p) {
  rank_job *j = p;
  tpf_bootstrap boot;
  tpf_backend *be = NULL;
  j->rc = 1;
  j->create_st = tpf_cuda_threads_bootstrap(j->g, j->rank, 0, &boot);
  if (j->create_st == TPF_OK) j->create_st = tpf_cuda_backend_create(&boot, &be);
  if (j->create_st != TPF_OK) {
    snprintf(j->create_err, sizeof j->create_err, "%s", tpf_last_error());
    if (j->tolerant)
      j->rc = 0;
    else
      fail(j->rank, __LINE__, "backend creation: %s", tpf_last_error());
    return NULL;
  }
  j->rc = j->body(j->rank, j->P, be, j->arg);
  j->destroy_st = tpf_cuda_backend_destroy(be);
  if (j->destroy_st != TPF_OK && !j->tolerant) {
    fail(j->rank, __LINE__, "tpf_cuda_backend_destroy: %s", tpf_last_error());
    j->rc = 1;
  }
  return NULL;
}

/* Runs body on P rank threads (jobs[r] filled, out of the caller's array when given); 0 when every
 * rank returned 0. */
static int run_group_jobs(int P, int (*body)(int, int, tpf_backend *, void *), void *arg,
                          bool tolerant, rank_job *jobs);

static int run_group(int P, int (*body)(int, int, tpf_backend *, void *), void *arg) {
  rank_job jobs[MAXP];
  return run_group_jobs(P, body, arg, false, jobs);
}

static int run_group_jobs(int P, int (*body)(int, int, tpf_backend *, void *), void *arg,
                          bool tolerant, rank_job *jobs) {
  tpf_cuda_threads *g = NULL;
  if (tpf_cuda_threads_create(P, &g) != TPF_OK) {
    fail(-1, __LINE__, "tpf_cuda_threads_create(%d): %s", P, tpf_last_error());
    return 1;
  }
  pthread_t th[MAXP];
  for (int r = 0; r < P; r++) {
    jobs[r] = (rank_job){.rank = r, .P = P, .g = g, .body = body, .arg = arg, .tolerant = tolerant};
    pthread_create(&th[r], NULL, rank_main, &jobs[r]);
  }
  int rc = 0;
  for (int r = 0; r < P; r++) {
    pthread_join(th[r], NULL);
    rc |= jobs[r].rc;
  }
  tpf_cuda_threads_destroy(g);
  return rc;
}

/* ---- one communicator and its operation ---------------------------------------------------- */

typedef struct {
  kind k;
  tpf_comm *c;
  void *x, *w, *d, *bias; /* operands ("device" memory of the fake: host memory) */
  cudaStream_t s;
  tpf_matrix a, wm, dm;
  uint64_t gm, gn, gk; /* the operation's whole GEMM at the current T */
} op_ctx;

static bool rs_gemm(kind k) {
  return kKinds[k].coll == TPF_COLL_RS && kKinds[k].algo != TPF_ALGO_BULK;
}

static int op_open(op_ctx *o, kind k, int rank, tpf_backend *be) {
  memset(o, 0, sizeof *o);
  o->k = k;
  tpf_comm_config cfg = TPF_COMM_CONFIG_INIT;
  cfg.name = kKinds[k].name;
  cfg.algo = kKinds[k].algo;
  cfg.coll = kKinds[k].coll;
  cfg.aggregate = kKinds[k].aggregate;
  cfg.dtype = TPF_BF16;
  cfg.capacity = (tpf_shape){C, H};
  OK(rank, tpf_comm_create(be, &cfg, &o->c));
  CHECK(rank, cudaStreamCreate(&o->s) == cudaSuccess, "cudaStreamCreate");
  CHECK(rank,
        cudaMalloc(&o->x, (size_t)C * H * 2) == cudaSuccess &&
            cudaMalloc(&o->w, (size_t)H * H * 2) == cudaSuccess &&
            cudaMalloc(&o->d, (size_t)C * H * 2) == cudaSuccess &&
            cudaMalloc(&o->bias, (size_t)H * 2) == cudaSuccess,
        "operand allocation");
  return 0;
}

static int op_shape(op_ctx *o, int rank, int P, uint64_t T) {
  OK(rank, tpf_comm_set_active_shape(o->c, (tpf_shape){T, H}));
  const bool rs = rs_gemm(o->k);
  o->gm = T;
  o->gn = rs ? H : NN;
  o->gk = rs ? NN : H;
  o->a = (tpf_matrix){o->x, o->gm, o->gk, o->gk, TPF_BF16};
  o->wm = (tpf_matrix){o->w, o->gn, o->gk, o->gk, TPF_BF16};
  o->dm = rs ? (tpf_matrix){o->d, T / (uint64_t)P, H, H, TPF_BF16}
             : (tpf_matrix){o->d, T, NN, NN, TPF_BF16};
  return 0;
}

static tpf_status op_run(op_ctx *o, bool bias) {
  tpf_op_options opt = TPF_OP_OPTIONS_INIT;
  if (bias) opt.bias = o->bias;
  if (kKinds[o->k].algo == TPF_ALGO_BULK)
    return tpf_bulk_overlap_ex(o->c, &o->a, &o->wm, &o->dm, &opt, o->s);
  if (kKinds[o->k].coll == TPF_COLL_AG) return tpf_ag_gemm_ex(o->c, &o->wm, &o->dm, &opt, o->s);
  return tpf_gemm_rs_ex(o->c, &o->a, &o->wm, &o->dm, &opt, o->s);
}

static int op_close(op_ctx *o, int rank) {
  if (o->c) OK(rank, tpf_comm_destroy(o->c));
  cudaFree(o->x), cudaFree(o->w), cudaFree(o->d), cudaFree(o->bias);
  if (o->s) cudaStreamDestroy(o->s);
  return 0;
}

static void print_counts(const char *what, int P, uint64_t T, const tpf_fake_counts *c) {
  char buf[256];
  pthread_mutex_lock(&g_mu);
  printf("  %-24s P=%d T=%-4llu per op: %s\n", what, P, (unsigned long long)T,
         tpf_fake_cuda_format(c, buf, sizeof buf));
  pthread_mutex_unlock(&g_mu);
}

/* ---- P = 1: an operation is its GEMM -------------------------------------------------------- */

static const uint64_t kTs[] = {C, 256, 40, 8};
enum { NTS = sizeof kTs / sizeof kTs[0] };

static int p1_body(int rank, int P, tpf_backend *be, void *arg) {
  (void)arg;
  for (int k = 0; k < K_COUNT; k++) {
    if (kKinds[k].aggregate) continue; /* needs P >= 4 (P/2 splits) */
    op_ctx o;
    if (op_open(&o, (kind)k, rank, be)) return 1;
    for (int ti = 0; ti < NTS; ti++) {
      for (int bias = 0; bias < 2; bias++) {
        if (op_shape(&o, rank, P, kTs[ti])) return 1;
        CHECK(rank, op_run(&o, bias) == TPF_OK, "%s T=%llu warm-up: %s", kKinds[k].name,
              (unsigned long long)kTs[ti], tpf_last_error());
        tpf_fake_cuda_reset(TPF_FAKE_THREAD);
        CHECK(rank, op_run(&o, bias) == TPF_OK, "%s: %s", kKinds[k].name, tpf_last_error());
        tpf_fake_counts c;
        tpf_fake_cuda_counts(TPF_FAKE_THREAD, &c);
        if (ti == 0 && bias == 0) print_counts(kKinds[k].name, P, kTs[ti], &c);
        const char *n = kKinds[k].name;
        const unsigned long long T = (unsigned long long)kTs[ti];
        CHECK(rank, c.calls[TPF_FAKE_MATMUL] == 1, "%s T=%llu bias=%d: %llu GEMMs, want 1", n, T,
              bias, (unsigned long long)c.calls[TPF_FAKE_MATMUL]);
        const uint64_t m = c.matmul_m, nn = c.matmul_n, kk = c.matmul_k;
        CHECK(rank, ((m == o.gn && nn == o.gm) || (m == o.gm && nn == o.gn)) && kk == o.gk,
              "%s T=%llu: the GEMM is %llux%llux%llu (cuBLASLt m n k), want the layer's %llu x "
              "%llu x %llu",
              n, T, (unsigned long long)m, (unsigned long long)nn, (unsigned long long)kk,
              (unsigned long long)o.gm, (unsigned long long)o.gn, (unsigned long long)o.gk);
        static const tpf_fake_kind none[] = {
            TPF_FAKE_LAUNCH, TPF_FAKE_MEMCPY,      TPF_FAKE_MEMSET,
            TPF_FAKE_MEMOP,  TPF_FAKE_STREAM_WAIT, TPF_FAKE_ALLOC,
            TPF_FAKE_FREE,   TPF_FAKE_SYNC,        TPF_FAKE_LT_SETUP};
        for (size_t i = 0; i < sizeof none / sizeof none[0]; i++)
          CHECK(rank, c.calls[none[i]] == 0, "%s T=%llu bias=%d: %llu calls of kind %d, want 0", n,
                T, bias, (unsigned long long)c.calls[none[i]], (int)none[i]);
        CHECK(rank, c.calls[TPF_FAKE_LT_ATTR] == (uint64_t)bias,
              "%s T=%llu bias=%d: %llu descriptor attributes set", n, T, bias,
              (unsigned long long)c.calls[TPF_FAKE_LT_ATTR]);
        CHECK(rank, c.calls[TPF_FAKE_EVENT_RECORD] <= 1, "%s T=%llu: %llu event records", n, T,
              (unsigned long long)c.calls[TPF_FAKE_EVENT_RECORD]);
      }
    }
    OK(rank, tpf_comm_sync(o.c));
    if (op_close(&o, rank)) return 1;
  }
  return 0;
}

/* ---- P > 1: no allocation per operation, the backend's statistics agree ---------------------- */

/* The backend's enqueue kinds against the fake's: GEMM = matmuls (+ fallback GEMM kernels, none
 * here); COPY + SIGNAL = copies, kernel launches and stream memory operations; RECORD; WAIT. */
static int stats_agree(int rank, const char *n, uint64_t T, const tpf_cuda_enqueue_stats *s0,
                       const tpf_cuda_enqueue_stats *s1, const tpf_fake_counts *c) {
#define D(kind) (s1->calls[kind] - s0->calls[kind])
  const uint64_t gemm = D(TPF_CUDA_ENQ_GEMM), copy = D(TPF_CUDA_ENQ_COPY),
                 sig = D(TPF_CUDA_ENQ_SIGNAL), rec = D(TPF_CUDA_ENQ_RECORD),
                 wait = D(TPF_CUDA_ENQ_WAIT);
#undef D
  const uint64_t fake_copy_sig =
      c->calls[TPF_FAKE_MEMCPY] + c->calls[TPF_FAKE_LAUNCH] + c->calls[TPF_FAKE_MEMOP];
  CHECK(rank, gemm == c->calls[TPF_FAKE_MATMUL],
        "%s T=%llu: the backend counted %llu GEMMs, the fake saw %llu", n, (unsigned long long)T,
        (unsigned long long)gemm, (unsigned long long)c->calls[TPF_FAKE_MATMUL]);
  CHECK(rank, copy + sig == fake_copy_sig,
        "%s T=%llu: the backend counted %llu copies + signals, the fake saw %llu", n,
        (unsigned long long)T, (unsigned long long)(copy + sig), (unsigned long long)fake_copy_sig);
  CHECK(rank, rec == c->calls[TPF_FAKE_EVENT_RECORD],
        "%s T=%llu: the backend counted %llu records, the fake saw %llu", n, (unsigned long long)T,
        (unsigned long long)rec, (unsigned long long)c->calls[TPF_FAKE_EVENT_RECORD]);
  CHECK(rank, wait == c->calls[TPF_FAKE_STREAM_WAIT],
        "%s T=%llu: the backend counted %llu waits, the fake saw %llu", n, (unsigned long long)T,
        (unsigned long long)wait, (unsigned long long)c->calls[TPF_FAKE_STREAM_WAIT]);
  return 0;
}

static const uint64_t kTsP[] = {C, 256, 128, C, 64, 256};
enum { NTSP = sizeof kTsP / sizeof kTsP[0] };

static int pn_body(int rank, int P, tpf_backend *be, void *arg) {
  (void)arg;
  for (int k = 0; k < K_COUNT; k++) {
    if (kKinds[k].aggregate && P < 4) continue;
    const char *n = kKinds[k].name;
    op_ctx o;
    if (op_open(&o, (kind)k, rank, be)) return 1;
    /* From here to the destruction: no allocation, no free, on this rank's thread. */
    tpf_fake_counts whole;
    tpf_fake_cuda_reset(TPF_FAKE_THREAD);
    for (int ti = 0; ti < NTSP; ti++) {
      const uint64_t T = kTsP[ti];
      if (op_shape(&o, rank, P, T)) return 1;
      CHECK(rank, op_run(&o, false) == TPF_OK, "%s T=%llu: %s", n, (unsigned long long)T,
            tpf_last_error());
      tpf_fake_cuda_counts(TPF_FAKE_THREAD, &whole);
      /* The second operation at this T: setup is cached, the statistics must agree. */
      tpf_cuda_enqueue_stats s0 = {0}, s1 = {0};
      OK(rank, tpf_cuda_backend_enqueue_stats(be, &s0));
      tpf_fake_counts before = whole, c;
      CHECK(rank, op_run(&o, false) == TPF_OK, "%s T=%llu: %s", n, (unsigned long long)T,
            tpf_last_error());
      OK(rank, tpf_cuda_backend_enqueue_stats(be, &s1));
      tpf_fake_cuda_counts(TPF_FAKE_THREAD, &whole);
      for (int i = 0; i < TPF_FAKE_NUM_KINDS; i++)
        c.calls[i] = whole.calls[i] - before.calls[i];
      if (rank == 0 && ti == 0) print_counts(n, P, T, &c);
      CHECK(rank, c.calls[TPF_FAKE_LT_SETUP] == 0,
            "%s T=%llu: %llu cuBLASLt setup calls in the second operation of a shape", n,
            (unsigned long long)T, (unsigned long long)c.calls[TPF_FAKE_LT_SETUP]);
      CHECK(rank, c.calls[TPF_FAKE_SYNC] == 0, "%s T=%llu: %llu host synchronisations", n,
            (unsigned long long)T, (unsigned long long)c.calls[TPF_FAKE_SYNC]);
      CHECK(rank, c.calls[TPF_FAKE_MATMUL] >= 1, "%s T=%llu: no GEMM", n, (unsigned long long)T);
      if (stats_agree(rank, n, T, &s0, &s1, &c)) return 1;
    }
    CHECK(rank, whole.calls[TPF_FAKE_ALLOC] == 0 && whole.calls[TPF_FAKE_FREE] == 0,
          "%s P=%d: %llu allocations and %llu frees between creation and destruction", n, P,
          (unsigned long long)whole.calls[TPF_FAKE_ALLOC],
          (unsigned long long)whole.calls[TPF_FAKE_FREE]);
    OK(rank, tpf_comm_sync(o.c));
    if (op_close(&o, rank)) return 1;
  }
  return 0;
}

/* ---- an injected GEMM failure ---------------------------------------------------------------- */

static int fault_body(int rank, int P, tpf_backend *be, void *arg) {
  (void)arg;
  op_ctx o;
  if (op_open(&o, K_RING_RS, rank, be) || op_shape(&o, rank, P, 256)) return 1;
  OK(rank, op_run(&o, false));
  tpf_fake_cuda_fail_at("cublasLtMatmul", 1);
  const tpf_status st = op_run(&o, false);
  tpf_fake_cuda_fail_at(NULL, 0);
  CHECK(rank, st == TPF_EBACKEND, "the failed GEMM returned %s, want TPF_EBACKEND",
        tpf_status_name(st));
  CHECK(rank, strstr(tpf_last_error(), "cublasLtMatmul") != NULL,
        "the failed GEMM's message does not name cublasLtMatmul: %s", tpf_last_error());
  const tpf_status sy = tpf_comm_sync(o.c);
  CHECK(rank, sy == TPF_EBACKEND, "sync after the failed GEMM returned %s, want TPF_EBACKEND",
        tpf_status_name(sy));
  const tpf_status again = op_run(&o, false);
  CHECK(rank, again == TPF_ESTATE, "an operation on the failed communicator returned %s",
        tpf_status_name(again));
  return op_close(&o, rank);
}

/* ---- creation under injected faults: every rank agrees, nothing is lost --------------------- */

/* The calls a creation makes that can fail on a real machine (out of memory, a lost device). */
static const char *const kCreateCalls[] = {"cudaSetDevice",
                                           "cudaMalloc",
                                           "cudaHostAlloc",
                                           "cudaEventCreateWithFlags",
                                           "cudaStreamCreateWithPriority",
                                           "cudaStreamCreateWithFlags",
                                           "cudaMemsetAsync",
                                           "cudaStreamSynchronize",
                                           "cublasLtCreate"};
enum { NCREATE = sizeof kCreateCalls / sizeof kCreateCalls[0] };

typedef struct {
  const char *call; /* armed by rank 0 after the barrier (comm phase) */
  uint64_t n;
  pthread_barrier_t bar;
  bool fired; /* the fault fired in the first cycle (read by rank 0 before it is cleared) */
  tpf_status create_st[MAXP], cycle_st[MAXP], again_st[MAXP];
  char err[MAXP][256];
} sweep_ctx;

static tpf_status comm_create_sweep(op_ctx *o, tpf_backend *be) {
  tpf_comm_config cfg = TPF_COMM_CONFIG_INIT;
  cfg.name = "sweep";
  cfg.algo = TPF_ALGO_RING;
  cfg.coll = TPF_COLL_RS;
  cfg.capacity = (tpf_shape){C, H};
  o->c = NULL;
  const tpf_status st = tpf_comm_create(be, &cfg, &o->c);
  if (st != TPF_OK) o->c = NULL;
  return st;
}

/* An operation, sync and the destruction of o->c. */
static tpf_status comm_use(op_ctx *o, int rank, int P) {
  tpf_status st = op_shape(o, rank, P, 256) ? TPF_EBACKEND : TPF_OK;
  if (st == TPF_OK) st = op_run(o, false);
  if (st == TPF_OK) st = tpf_comm_sync(o->c);
  const tpf_status d = tpf_comm_destroy(o->c);
  o->c = NULL;
  return st != TPF_OK ? st : d;
}

/* Rank 0 arms the fault for the communicator's creation only (a fault inside an operation
 * leaves the peers waiting for the failed rank until their timeout: documented, not tested
 * here), then the communicator is used and destroyed, then a second one must work. */
static int sweep_comm_body(int rank, int P, tpf_backend *be, void *arg) {
  sweep_ctx *x = arg;
  op_ctx o;
  memset(&o, 0, sizeof o);
  o.k = K_RING_RS;
  CHECK(rank,
        cudaStreamCreate(&o.s) == cudaSuccess &&
            cudaMalloc(&o.x, (size_t)C * H * 2) == cudaSuccess &&
            cudaMalloc(&o.w, (size_t)H * H * 2) == cudaSuccess &&
            cudaMalloc(&o.d, (size_t)C * H * 2) == cudaSuccess,
        "operands");
  pthread_barrier_wait(&x->bar);
  if (rank == 0) tpf_fake_cuda_fail_at(x->call, x->n);
  pthread_barrier_wait(&x->bar);
  x->create_st[rank] = comm_create_sweep(&o, be);
  if (x->create_st[rank] != TPF_OK) snprintf(x->err[rank], 256, "%s", tpf_last_error());
  pthread_barrier_wait(&x->bar);
  if (rank == 0) {
    x->fired = tpf_fake_cuda_fault_fired();
    tpf_fake_cuda_fail_at(NULL, 0);
  }
  pthread_barrier_wait(&x->bar);
  x->cycle_st[rank] = o.c != NULL ? comm_use(&o, rank, P) : TPF_OK;
  tpf_status again = comm_create_sweep(&o, be);
  if (again == TPF_OK) again = comm_use(&o, rank, P);
  x->again_st[rank] = again;
  char err2[256];
  snprintf(err2, sizeof err2, "%s", tpf_last_error());
  op_close(&o, rank);
  CHECK(rank, x->cycle_st[rank] == TPF_OK || x->create_st[rank] != TPF_OK,
        "a communicator created while %s call %llu was failing does not work: %s", x->call,
        (unsigned long long)x->n, tpf_status_name(x->cycle_st[rank]));
  CHECK(rank, again == TPF_OK,
        "after %s call %llu failed, a new communicator's cycle failed: %s: %s", x->call,
        (unsigned long long)x->n, tpf_status_name(again), err2);
  return 0;
}

static int nothing_body(int rank, int P, tpf_backend *be, void *arg) {
  (void)rank, (void)P, (void)be, (void)arg;
  return 0;
}

/* Judges one attempt: statuses[r] of every rank (and their messages). */
static int judge(int P, const char *phase, const char *call, uint64_t n, bool fired,
                 const tpf_status *st, char err[][256], bool reported_later, uint64_t live0) {
  int bad = 0, failed = 0;
  for (int r = 0; r < P; r++) {
    failed += st[r] != TPF_OK;
    if (st[r] == TPF_ETIMEOUT) {
      fail(r, __LINE__,
           "%s with %s call %llu failing: TPF_ETIMEOUT (a rank waited for a peer "
           "that had given up): %s",
           phase, call, (unsigned long long)n, err[r]);
      bad = 1;
    }
  }
  if (fired && failed == 0 && !reported_later) {
    fail(-1, __LINE__, "%s with %s call %llu failing: no rank reported it", phase, call,
         (unsigned long long)n);
    bad = 1;
  }
  if (!fired && failed != 0) {
    fail(-1, __LINE__, "%s without a fault: %d ranks failed", phase, failed);
    bad = 1;
  }
  if (failed != 0 && failed != P) {
    fail(-1, __LINE__,
         "%s with %s call %llu failing: %d of %d ranks failed, the others "
         "succeeded (a creation must fail on every rank or none)",
         phase, call, (unsigned long long)n, failed, P);
    bad = 1;
  }
  tpf_fake_counts c;
  tpf_fake_cuda_counts(TPF_FAKE_PROCESS, &c);
  if (c.live_allocs != live0) {
    fail(-1, __LINE__, "%s with %s call %llu failing: %lld allocations lost", phase, call,
         (unsigned long long)n, (long long)(c.live_allocs - live0));
    bad = 1;
  }
  return bad;
}

/* Fails the n-th call of every creation call in turn, n = 1, 2, ... until a run makes fewer
 * calls than n: in the backend's creation (phase "backend") and the communicator's ("comm"). */
static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int create_sweep(int P) {
  int bad = 0, attempts = 0, fired_n = 0;
  const double t0 = now_s();
  for (int ci = 0; ci < NCREATE; ci++) {
    for (uint64_t n = 1; n <= 64; n++) {
      tpf_fake_counts c0;
      tpf_fake_cuda_counts(TPF_FAKE_PROCESS, &c0);
      rank_job jobs[MAXP];
      tpf_fake_cuda_fail_at(kCreateCalls[ci], n);
      run_group_jobs(P, nothing_body, NULL, true, jobs);
      const bool fired = tpf_fake_cuda_fault_fired();
      tpf_fake_cuda_fail_at(NULL, 0);
      tpf_status st[MAXP];
      char err[MAXP][256];
      bool later = false; /* the fault hit the destruction, which reported it */
      for (int r = 0; r < P; r++) {
        st[r] = jobs[r].create_st;
        snprintf(err[r], 256, "%s", jobs[r].create_err);
        later = later || (st[r] == TPF_OK && jobs[r].destroy_st != TPF_OK);
      }
      attempts++;
      fired_n += fired;
      bad |=
          judge(P, "backend creation", kCreateCalls[ci], n, fired, st, err, later, c0.live_allocs);
      if (!fired) break;
    }
    for (uint64_t n = 1; n <= 64; n++) {
      tpf_fake_counts c0;
      tpf_fake_cuda_counts(TPF_FAKE_PROCESS, &c0);
      sweep_ctx x;
      memset(&x, 0, sizeof x);
      x.call = kCreateCalls[ci];
      x.n = n;
      pthread_barrier_init(&x.bar, NULL, (unsigned)P);
      bad |= run_group(P, sweep_comm_body, &x);
      pthread_barrier_destroy(&x.bar);
      const bool fired = x.fired;
      const bool later = false; /* armed for the creation only */
      attempts++;
      fired_n += fired;
      bad |= judge(P, "communicator creation", kCreateCalls[ci], n, fired, x.create_st, x.err,
                   later, c0.live_allocs);
      if (!fired) break;
    }
  }
  printf("%s P=%d: %d creations with one failing CUDA call (%d attempts, %.1f s): every rank "
         "agrees, nothing lost, the next creation works\n",
         bad ? "FAIL" : "ok  ", P, fired_n, attempts, (now_s() - t0));
  return bad;
}

/* ---- an operation failing on one rank: its peers give up at once ------------------------------
 */

static const char *const kOpCalls[] = {"cublasLtMatmul", "cudaMemcpyAsync", "cudaEventRecord",
                                       "cudaStreamWaitEvent", "launch"};
enum { NOPCALLS = sizeof kOpCalls / sizeof kOpCalls[0] };

typedef struct {
  kind k;
  const char *call;
  uint64_t n;
  bool fired;
  pthread_barrier_t bar;
  tpf_status first[MAXP], second[MAXP];
  char msg[MAXP][2][256];
} opfault_ctx;

/* One operation of kind x->k whose n-th `call` fails (on whichever rank makes it), then a second
 * operation on every rank: no rank may wait for its timeout in either. */
static int opfault_body(int rank, int P, tpf_backend *be, void *arg) {
  opfault_ctx *x = arg;
  op_ctx o;
  if (op_open(&o, x->k, rank, be) || op_shape(&o, rank, P, 256)) return 1;
  OK(rank, op_run(&o, false));
  OK(rank, tpf_comm_sync(o.c));
  pthread_barrier_wait(&x->bar);
  if (rank == 0) tpf_fake_cuda_fail_at(x->call, x->n);
  pthread_barrier_wait(&x->bar);
  x->first[rank] = op_run(&o, false);
  snprintf(x->msg[rank][0], 256, "%s", tpf_last_error());
  pthread_barrier_wait(&x->bar);
  if (rank == 0) {
    x->fired = tpf_fake_cuda_fault_fired();
    tpf_fake_cuda_fail_at(NULL, 0);
  }
  pthread_barrier_wait(&x->bar);
  x->second[rank] = op_run(&o, false);
  snprintf(x->msg[rank][1], 256, "%s", tpf_last_error());
  (void)tpf_comm_sync(o.c);
  return op_close(&o, rank);
}

static int op_fault_sweep(int P) {
  int bad = 0, fired_n = 0;
  for (int k = K_RING_AG; k <= K_PIPE_RS; k++) {
    if (kKinds[k].aggregate) continue;
    for (int ci = 0; ci < NOPCALLS; ci++) {
      for (uint64_t n = 1; n <= 64; n++) {
        tpf_fake_counts c0;
        tpf_fake_cuda_counts(TPF_FAKE_PROCESS, &c0);
        opfault_ctx x;
        memset(&x, 0, sizeof x);
        x.k = (kind)k;
        x.call = kOpCalls[ci];
        x.n = n;
        pthread_barrier_init(&x.bar, NULL, (unsigned)P);
        bad |= run_group(P, opfault_body, &x);
        pthread_barrier_destroy(&x.bar);
        if (!x.fired) break;
        fired_n++;
        for (int r = 0; r < P; r++) {
          for (int i = 0; i < 2; i++) {
            const tpf_status st = i ? x.second[r] : x.first[r];
            if (st == TPF_ETIMEOUT) {
              fail(r, __LINE__, "%s, %s call %llu failing: operation %d waited for its timeout: %s",
                   kKinds[k].name, x.call, (unsigned long long)n, i + 1, x.msg[r][i]);
              bad = 1;
            }
          }
          if (x.second[r] == TPF_OK) {
            fail(r, __LINE__,
                 "%s, %s call %llu failed on a rank: the next operation succeeded "
                 "here",
                 kKinds[k].name, x.call, (unsigned long long)n);
            bad = 1;
          }
        }
        tpf_fake_counts c1;
        tpf_fake_cuda_counts(TPF_FAKE_PROCESS, &c1);
        if (c1.live_allocs != c0.live_allocs) {
          fail(-1, __LINE__, "%s, %s call %llu failing: %lld allocations lost", kKinds[k].name,
               x.call, (unsigned long long)n, (long long)(c1.live_allocs - c0.live_allocs));
          bad = 1;
        }
      }
    }
  }
  printf("%s P=%d: %d operations with one failing CUDA call on one rank: no rank waits for its "
         "timeout, the communicator fails on every rank, nothing lost\n",
         bad ? "FAIL" : "ok  ", P, fired_n);
  return bad;
}

int main(void) {
  /* Short bounds: a rank left waiting for a peer that gave up shows as TPF_ETIMEOUT quickly. */
  setenv("TPF_CUDA_TIMEOUT_MS", "1500", 0);
  setenv("TPF_CUDA_BOOT_TIMEOUT_MS", "1500", 0);
  if (!tpf_fake_cuda_active()) {
    fprintf(stderr, "FAIL: the fake CUDA is not the CUDA this process calls (run with "
                    "LD_PRELOAD=libtpf_fake_cuda.so, as CTest does)\n");
    return 1;
  }
  tpf_fake_counts base;
  tpf_fake_cuda_counts(TPF_FAKE_PROCESS, &base);
  printf("fake CUDA host path (calls counted, nothing computed)\n");
  int rc = run_group(1, p1_body, NULL);
  printf("%s P=1: an operation is exactly its one GEMM\n", rc ? "FAIL" : "ok  ");
  for (int P = 2; P <= MAXP; P *= 2) {
    int r = run_group(P, pn_body, NULL);
    printf("%s P=%d: no allocation per operation, statistics agree with the calls\n",
           r ? "FAIL" : "ok  ", P);
    rc |= r;
  }
  int r = run_group(1, fault_body, NULL);
  printf("%s P=1: an injected cublasLtMatmul failure\n", r ? "FAIL" : "ok  ");
  rc |= r;
  for (int P = 1; P <= 2; P++)
    rc |= create_sweep(P);
  /* The promise is the host-ordered transport's: with the device flags, a peer waits on the
   * device (its flag kernel's timeout), which the fake does not run. */
  const char *flags = getenv("TPF_CUDA_DEVICE_FLAGS");
  if (flags != NULL && flags[0] == '1')
    printf("n/a  P=2: an operation failing on one rank (TPF_CUDA_DEVICE_FLAGS=1: its peers wait "
           "on the device, which the fake does not run)\n");
  else
    rc |= op_fault_sweep(2);
  tpf_fake_counts end;
  tpf_fake_cuda_counts(TPF_FAKE_PROCESS, &end);
  if (end.live_allocs != base.live_allocs) {
    fprintf(stderr, "FAIL: %llu allocations live after every backend was destroyed (%llu before)\n",
            (unsigned long long)end.live_allocs, (unsigned long long)base.live_allocs);
    rc = 1;
  }
  if (end.total == base.total) {
    fprintf(stderr, "FAIL: the fake saw no call at all\n");
    rc = 1;
  }
  printf("%s (%d failures)\n", rc || g_failures ? "FAILED" : "fake hostpath: OK", g_failures);
  return rc || g_failures ? 1 : 0;
}
