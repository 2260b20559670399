/* The sections of `tpflex bench` that only a GPU can run: the cuBLASLt baselines (one GEMM of
 * the whole layer for the tp section; section 3, the chunking tax) and the re-registration
 * alternative of section 1 (cudaFree + cudaMalloc + cudaIpcGetMemHandle + a peer's
 * cudaIpcOpenMemHandle in a helper process), and the GPU lines of the run header. Plain C: CUDA
 * runtime and cuBLASLt host calls only, no kernels. Without the CUDA backend, stubs. Calls the
 * groups (bench_group.c) and bench_util.c.
 *
 * GEMM timing: a 1 GiB memset before each repetition evicts the L2, events around the GEMMs,
 * inputs rotated through the group's random source; the median of the repetitions. */
#define _POSIX_C_SOURCE 200809L
#include "bench.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef TPF_HAVE_CUDA

#include "bench_lt.h"
#include "reference.h"

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <math.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

/* ---- cuBLASLt: d[m, n] = x[m, k] * w[n, k]^T, row-major, bf16 in/out, fp32 accumulation
 * (bench_lt.c), with this file's stream, events and L2 flush ---- */

typedef struct {
  bench_lt mm;
  cudaStream_t s;
  cudaEvent_t e0[BENCH_MAX_ITERS], e1[BENCH_MAX_ITERS];
  void *flush;
} lt_ctx;

static tpf_status lt_init(lt_ctx *lt, int iters) {
  memset(lt, 0, sizeof(*lt));
  tpf_status st = bench_lt_init(&lt->mm);
  if (st != TPF_OK) return st;
  BENCH_CU(cudaMalloc(&lt->flush, BENCH_FLUSH_BYTES), "cudaMalloc(flush)");
  BENCH_CU(cudaStreamCreateWithFlags(&lt->s, cudaStreamNonBlocking), "cudaStreamCreate");
  for (int i = 0; i < iters && i < BENCH_MAX_ITERS; i++) {
    BENCH_CU(cudaEventCreate(&lt->e0[i]), "cudaEventCreate");
    BENCH_CU(cudaEventCreate(&lt->e1[i]), "cudaEventCreate");
  }
  return TPF_OK;
}
static void lt_fini(lt_ctx *lt) {
  for (int i = 0; i < BENCH_MAX_ITERS; i++) {
    if (lt->e0[i]) cudaEventDestroy(lt->e0[i]);
    if (lt->e1[i]) cudaEventDestroy(lt->e1[i]);
  }
  if (lt->s) cudaStreamDestroy(lt->s);
  if (lt->flush) cudaFree(lt->flush);
  bench_lt_fini(&lt->mm);
}

/* Checks d[m, n] (device) = x * w^T on sampled rows (3 per block of m/parts rows) and 64 columns;
 * x and w are src views starting at element offsets xo and wo. Returns elements wrong. */
static long long lt_check(bench_group *g, const void *d, uint64_t m, uint64_t n, uint64_t k,
                          uint64_t xo, uint64_t wo, int parts) {
  uint64_t R = m / (uint64_t)parts, rows[3 * 64];
  int nr = 0;
  for (int p = 0; p < parts; p++) {
    uint64_t c[3] = {0, R / 2, R - 1};
    for (int i = 0; i < 3; i++)
      if (nr == 0 || rows[nr - 1] != p * R + c[i]) rows[nr++] = p * R + c[i];
  }
  uint64_t nc = n < 64 ? n : 64;
  uint16_t *xs = malloc((size_t)nr * k * 2), *ws = malloc(nc * k * 2), *row = malloc(n * 2),
           *got = malloc((size_t)nr * nc * 2);
  float *want = malloc((size_t)nr * nc * sizeof(float)), *osl = NULL;
  long long wrong = -1;
  if (!xs || !ws || !row || !got || !want) goto out;
  for (int i = 0; i < nr; i++) {
    for (uint64_t kk = 0; kk < k; kk++)
      xs[(uint64_t)i * k + kk] = g->pool[(xo + rows[i] * k + kk) % g->pool_elems];
    if (cudaMemcpy(row, (const uint16_t *)d + rows[i] * n, n * 2, cudaMemcpyDeviceToHost) !=
        cudaSuccess)
      goto out;
    for (uint64_t c = 0; c < nc; c++)
      got[(uint64_t)i * nc + c] = row[c * n / nc];
  }
  for (uint64_t c = 0; c < nc; c++)
    for (uint64_t kk = 0; kk < k; kk++)
      ws[c * k + kk] = g->pool[(wo + (c * n / nc) * k + kk) % g->pool_elems];
  tpf_matrix mx = {xs, (uint64_t)nr, k, k, TPF_BF16}, mw = {ws, nc, k, k, TPF_BF16};
  tpf_matrix mg = {got, (uint64_t)nr, nc, nc, TPF_BF16},
             mwant = {want, (uint64_t)nr, nc, nc, TPF_FP32};
  tpf_ref_result res;
  /* cuBLASLt sums over k in its own order: SPEC §7 with the accumulation-order slack
   * gamma_K sum_k |x_ik w_jk| per element (tpf_ref_order_slack). */
  if (tpf_ref_gemm_f32(&mx, &mw, want) != TPF_OK ||
      tpf_ref_order_slack(&mx, &mw, 1.0, true, &osl) != TPF_OK ||
      tpf_ref_compare_slack(&mg, &mwant, osl, tpf_ref_tolerance(TPF_BF16), &res) != TPF_OK)
    goto out;
  wrong = (long long)res.wrong; /* SPEC §7 per element: res.pass is res.wrong == 0 */
out:
  free(xs);
  free(ws);
  free(row);
  free(got);
  free(want);
  free(osl);
  return wrong;
}

static uint64_t lt_off(int it, int salt, uint64_t margin) {
  return (((uint64_t)it * 1009u + (uint64_t)salt * 104729u) * 4096u) % margin / 64u * 64u;
}

/* Median time of `parts` row-chunk GEMMs covering d[m, n] = x[m, k] w^T, back to back on one
 * stream (parts == 1: one GEMM). Inputs rotate through src; a 1 GiB memset before each
 * repetition evicts the L2. *wrong gets the check of the last repetition. */
static tpf_status lt_time(bench_group *g, lt_ctx *lt, uint64_t m, uint64_t n, uint64_t k, int parts,
                          int warmup, int iters, double *us, long long *wrong) {
  const uint64_t margin = 8ull << 20;
  tpf_status st = bench_src_reserve(g, (m > n ? m : n) * k + margin);
  if (st != TPF_OK) return st;
  void *d = NULL;
  BENCH_CU(cudaMalloc(&d, m * n * 2), "cudaMalloc(d)");
  bench_lt_plan p;
  st = bench_lt_plan_make(&lt->mm, m / (uint64_t)parts, n, k, &p);
  double *v = calloc((size_t)iters, sizeof(double));
  const uint16_t *src = g->src;
  int total = warmup + iters;
  for (int it = 0; st == TPF_OK && it <= total; it++) {
    uint64_t xo = lt_off(it, 0, margin), wo = lt_off(it, 1, margin);
    bool timed = it >= warmup && it < total;
    if (it == total)
      cudaMemsetAsync(d, 0xFF, m * n * 2, lt->s); /* poison, then the checked repetition */
    if (timed) {
      cudaMemsetAsync(lt->flush, it & 0xFF, BENCH_FLUSH_BYTES, lt->s);
      cudaEventRecord(lt->e0[it - warmup], lt->s);
    }
    for (int c = 0; c < parts && st == TPF_OK; c++) {
      uint64_t r0 = (uint64_t)c * (m / (uint64_t)parts);
      st = bench_lt_exec(&lt->mm, &p, src + xo + r0 * k, src + wo, (uint16_t *)d + r0 * n, lt->s);
    }
    if (timed) cudaEventRecord(lt->e1[it - warmup], lt->s);
    if (it == total && st == TPF_OK) {
      cudaError_t e = cudaStreamSynchronize(lt->s);
      if (e != cudaSuccess)
        st = bench_cuda_err(e, "GEMM");
      else
        *wrong = lt_check(g, d, m, n, k, xo, wo, parts);
    }
  }
  for (int i = 0; st == TPF_OK && i < iters; i++) {
    float ms;
    cudaError_t e = cudaEventElapsedTime(&ms, lt->e0[i], lt->e1[i]);
    if (e != cudaSuccess) st = bench_cuda_err(e, "cudaEventElapsedTime");
    v[i] = ms * 1e3;
  }
  if (st == TPF_OK) *us = bench_median(v, iters);
  free(v);
  bench_lt_plan_free(&p);
  cudaFree(d);
  return st;
}

static lt_ctx lt_main;
static bool lt_ready;

tpf_status bench_cuda_gemm_us(bench_group *g, uint64_t m, uint64_t n, uint64_t k, double *us) {
  if (!lt_ready) {
    tpf_status st = lt_init(&lt_main, g->o->iters);
    if (st != TPF_OK) return st;
    lt_ready = true;
  }
  long long wrong = 0;
  tpf_status st = lt_time(g, &lt_main, m, n, k, 1, g->o->warmup, g->o->iters, us, &wrong);
  if (st == TPF_OK && wrong != 0)
    return tpf_set_error(TPF_EBACKEND, "layer GEMM check failed (%lld wrong)", wrong);
  return st;
}

void bench_cuda_header(const bench_opts *o) {
  struct cudaDeviceProp prop;
  int rt = 0, drv = 0;
  cudaRuntimeGetVersion(&rt);
  cudaDriverGetVersion(&drv);
  if (cudaGetDeviceProperties(&prop, o->device) == cudaSuccess)
    printf("# GPU %d: %s, %d SMs, %.1f GiB, compute capability %d.%d; CUDA runtime %d, driver %d, "
           "cuBLASLt %zu\n",
           o->device, prop.name, prop.multiProcessorCount,
           (double)prop.totalGlobalMem / (1024.0 * 1024.0 * 1024.0), prop.major, prop.minor, rt,
           drv, cublasLtGetVersion());
  else
    printf("# GPU %d: cudaGetDeviceProperties failed\n", o->device);
  printf("# timing: CUDA events around each repetition, a 1 GiB memset before each one (L2 "
         "eviction), inputs rotated\n# through a random bf16 array, median of the repetitions; "
         "P ranks are threads sharing this one GPU.\n");
}

/* ---- section 3: chunking tax ---------------------------------------------------------------- */

int bench_cuda_section_chunking(const bench_opts *o) {
  static const char *const cols[] = {
      "T",   "N",     "H", "P", "chunk_rows", "one(us)", "one_TF/s", "chunked(us)", "chunked_TF/s",
      "tax", "#wrong"};
  char title[200];
  snprintf(title, sizeof(title),
           "Section 3: chunking tax on one GPU: P row-chunk cuBLASLt GEMMs [T/P,H]x[N,H]^T back "
           "to back vs one [T,H]x[N,H]^T (H=%llu)",
           (unsigned long long)o->hidden);
  bench_table("chunking", title, 11, cols);
  bench_group *g = NULL;
  tpf_status st = bench_group_create(o, 0, &g);
  lt_ctx lt;
  if (st == TPF_OK) st = lt_init(&lt, o->iters);
  if (st != TPF_OK) {
    bench_note("FAILED: %s", tpf_last_error());
    bench_group_destroy(g);
    return 1;
  }
  int rc = 0;
  const uint64_t Ns[2] = {o->n, 1024};
  for (int ni = 0; ni < 2; ni++) {
    if (ni == 1 && Ns[1] == Ns[0]) continue;
    for (uint64_t T = 512; T <= 32768; T *= 2) {
      if (o->quick && T != 1024 && T != 8192 && T != 32768) continue;
      double one = NAN;
      long long w1 = 0;
      bench_progress("[3/4 chunking] N=%llu T=%llu", (unsigned long long)Ns[ni],
                     (unsigned long long)T);
      st = lt_time(g, &lt, T, Ns[ni], o->hidden, 1, o->warmup, o->iters, &one, &w1);
      if (st != TPF_OK) {
        bench_note("FAILED T=%llu N=%llu: %s", (unsigned long long)T, (unsigned long long)Ns[ni],
                   tpf_last_error());
        rc = 1;
        continue;
      }
      for (int P = 2; P <= 8; P *= 2) {
        double ch = NAN;
        long long w = 0;
        st = lt_time(g, &lt, T, Ns[ni], o->hidden, P, o->warmup, o->iters, &ch, &w);
        if (st != TPF_OK) {
          bench_note("FAILED T=%llu P=%d: %s", (unsigned long long)T, P, tpf_last_error());
          rc = 1;
          continue;
        }
        double fl = 2.0 * (double)T * (double)Ns[ni] * (double)o->hidden;
        bench_cell_i((long long)T);
        bench_cell_i((long long)Ns[ni]);
        bench_cell_i((long long)o->hidden);
        bench_cell_i(P);
        bench_cell_i((long long)(T / (uint64_t)P));
        bench_cell_f(one, 1);
        bench_cell_f(fl / (one * 1e-6) / 1e12, 1);
        bench_cell_f(ch, 1);
        bench_cell_f(fl / (ch * 1e-6) / 1e12, 1);
        bench_cell_f(ch / one, 3);
        bench_cell_i(w + w1);
        bench_row_end();
        if (w + w1 != 0) rc = 1;
      }
    }
  }
  bench_note("tax = chunked / one; #wrong counts both runs' sampled elements outside tolerance");
  lt_fini(&lt);
  bench_group_destroy(g);
  return rc;
}

/* ---- section 1 alternative: cudaFree + cudaMalloc + IPC handle + a peer's open ------------- */

/* The peer: opens every handle it reads on stdin (closing the previous one) and answers one
 * byte per handle: 1 on success, 0 on failure. */
int bench_cuda_ipc_peer(void) {
  if (cudaSetDevice(0) != cudaSuccess || cudaFree(NULL) != cudaSuccess) return 1;
  unsigned char ok = 1;
  if (write(1, &ok, 1) != 1) return 1;
  void *open = NULL;
  cudaIpcMemHandle_t h;
  for (;;) {
    size_t got = 0;
    while (got < sizeof(h)) {
      ssize_t n = read(0, (char *)&h + got, sizeof(h) - got);
      if (n <= 0) goto done;
      got += (size_t)n;
    }
    if (open) cudaIpcCloseMemHandle(open);
    open = NULL;
    ok = cudaIpcOpenMemHandle(&open, h, cudaIpcMemLazyEnablePeerAccess) == cudaSuccess;
    if (write(1, &ok, 1) != 1) break;
  }
done:
  if (open) cudaIpcCloseMemHandle(open);
  return 0;
}

/* Starts the IPC peer (`tpflex bench --ipc-peer`) on pipes: to[1] writes to it, from[0] reads
 * its answers. True when it started and could use CUDA. */
static bool ipc_peer_spawn(int to[2], int from[2], pid_t *pid) {
  bool peer = false;
  if (pipe(to) != 0 || pipe(from) != 0) return false;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, to[0], 0);
  posix_spawn_file_actions_adddup2(&fa, from[1], 1);
  posix_spawn_file_actions_addclose(&fa, to[1]);
  posix_spawn_file_actions_addclose(&fa, from[0]);
  char *argv[] = {"tpflex", "bench", "--ipc-peer", NULL};
  if (posix_spawn(pid, "/proc/self/exe", &fa, NULL, argv, environ) == 0) {
    unsigned char ok = 0;
    close(to[0]);
    close(from[1]);
    to[0] = from[1] = -1;
    peer = read(from[0], &ok, 1) == 1 && ok == 1;
  }
  posix_spawn_file_actions_destroy(&fa);
  return peer;
}

/* One row of section 1's table for an alternative: n samples, median and p99 of v (sorted). */
static void alt_row(const bench_opts *o, const char *method, int P, double *v, int n,
                    const char *what) {
  double med = bench_median(v, n), p99 = bench_quantile(v, n, 0.99);
  bench_cell_s(method);
  bench_cell_i(P);
  bench_cell_i((long long)o->capacity);
  bench_cell_i((long long)o->hidden);
  bench_cell_i(n);
  bench_cell_f(med, 0);
  bench_cell_f(p99, 0);
  bench_cell_f(NAN, 2);
  bench_cell_f(1, 2);
  bench_cell_f(NAN, 1);
  bench_cell_s(what);
  bench_row_end();
}

int bench_cuda_setshape_alternatives(const bench_opts *o) {
  const int n = o->realloc_iters;
  double *a = calloc((size_t)n, sizeof(double)), *b = calloc((size_t)n, sizeof(double)),
         *c = calloc((size_t)n, sizeof(double));
  int to_child[2] = {-1, -1}, from_child[2] = {-1, -1};
  pid_t pid = -1;
  bool peer = ipc_peer_spawn(to_child, from_child, &pid);
  int rc = 0;
  void *buf = NULL;
  int done = 0;
  const uint64_t flags_bytes = 64ull * 128 * 8 + 64 * 8; /* tpflex's flag area, for realism */
  for (int i = 0; i < n && a && b && c; i++) {
    static const uint64_t div[4] = {8, 4, 2, 1};
    uint64_t bytes = o->capacity / div[i & 3] * o->hidden * 2 + flags_bytes;
    double t0 = bench_now_ns();
    if (buf) cudaFree(buf);
    buf = NULL;
    if (cudaMalloc(&buf, bytes) != cudaSuccess) {
      rc = 1;
      break;
    }
    double t1 = bench_now_ns();
    cudaIpcMemHandle_t h;
    if (cudaIpcGetMemHandle(&h, buf) != cudaSuccess) {
      rc = 1;
      break;
    }
    double t2 = bench_now_ns();
    double t3 = t2;
    if (peer) {
      unsigned char ok = 0;
      if (write(to_child[1], &h, sizeof(h)) != (ssize_t)sizeof(h) ||
          read(from_child[0], &ok, 1) != 1 || ok != 1) {
        peer = false;
        rc = 1;
      }
      t3 = bench_now_ns();
    }
    a[done] = t1 - t0;
    b[done] = t2 - t0;
    c[done] = t3 - t0;
    done++;
  }
  if (to_child[1] >= 0) close(to_child[1]);
  if (pid > 0) {
    int status;
    waitpid(pid, &status, 0);
  }
  if (from_child[0] >= 0) close(from_child[0]);
  if (buf) cudaFree(buf);
  if (done > 0) {
    alt_row(o, "cudaFree+cudaMalloc", 1, a, done, "alternative: new buffer of T*H*2 bytes");
    alt_row(o, "+cudaIpcGetMemHandle", 1, b, done, "alternative: ... and export it");
    if (peer) {
      alt_row(o, "+peer cudaIpcOpenMemHandle", 2, c, done,
              "alternative: ... one peer process closes old, opens new");
      bench_note("the +peer row is one peer process on the same GPU (pipe round trip included); "
                 "a TP group repeats the open on P-1 peers");
    } else {
      bench_note("peer open not measured: the helper process could not open CUDA IPC handles "
                 "here");
    }
  } else {
    bench_note("cudaMalloc/IPC alternative FAILED");
    rc = 1;
  }
  free(a);
  free(b);
  free(c);
  return rc;
}

#else /* !TPF_HAVE_CUDA: stubs, so the simulator-only CLI links */

static tpf_status no_cuda(void) {
  return tpf_set_error(TPF_EUNSUPPORTED, "this build has no CUDA backend");
}
tpf_status bench_cuda_gemm_us(bench_group *g, uint64_t m, uint64_t n, uint64_t k, double *us) {
  (void)g;
  (void)m;
  (void)n;
  (void)k;
  (void)us;
  return no_cuda();
}
void bench_cuda_header(const bench_opts *o) {
  (void)o;
}
int bench_cuda_section_chunking(const bench_opts *o) {
  (void)o;
  return 1;
}
int bench_cuda_setshape_alternatives(const bench_opts *o) {
  (void)o;
  return 1;
}
int bench_cuda_ipc_peer(void) {
  fprintf(stderr, "tpflex bench: --ipc-peer needs a CUDA build\n");
  return 2;
}

#endif /* TPF_HAVE_CUDA */
