/* cuBLASLt GEMMs of the CUDA backend, with the heuristic's choice cached per shape.
 *
 * Method: tpflex's GEMM is row-major d[m, n] = op(a) op(w) with op(a) = a [m, k] (TRANS_A: a
 * stored [k, m], used transposed) and op(w) = w^T for w [n, k] (TRANS_W: w stored [k, n], used
 * as is). A row-major matrix with leading dimension ld is the column-major transpose with the
 * same ld, so the call computes, in column-major terms, D^T[n, m] = op(w)^T op(a)^T with
 *   cuBLASLt A := w  stored k x n, op T  (TRANS_W: stored n x k, op N)  -> n x k
 *   cuBLASLt B := a  stored k x m, op N  (TRANS_A: stored m x k, op T)  -> k x m
 *   cuBLASLt C = D := d  (stored n x m, ld ldd)
 * i.e. the "TN" GEMM with M = n, N = m, K = k ("NN", "TT", "NT" with the flags). Accumulation
 * and scaling are fp32 (CUBLAS_COMPUTE_32F, also for fp32 inputs: no TF32, so fp32 results match
 * to 1e-5).
 *
 * Epilogue (steps flagged TPF_STEP_EPILOGUE): alpha and beta are cuBLASLt's own (C = D, read
 * only when beta != 0: in place, same layout); the bias is CUBLASLT_EPILOGUE_BIAS, whose vector
 * follows the rows of the column-major D^T, i.e. our row-major columns n, and is broadcast along
 * its columns (our rows): bias[j] is added to d[i, j], as tpflex wants. Its dtype is D's
 * (cuBLASLt's default bias type is D's type for these kernels); its pointer is offset by the
 * step's d.col by the caller. GELU is CUBLASLT_EPILOGUE_GELU / GELU_BIAS (the tanh form, applied
 * after the bias): together D = act(alpha * product + beta * D + bias), rounded once.
 *
 * Cache: the matmul descriptor, the three layouts and the heuristic's first algorithm are kept
 * per key (dims, leading dimensions, dtypes, transposes, epilogue kind, pointer alignments, SM
 * target), so an operation with a new T costs one heuristic query the first time and a table
 * lookup after. The alignments are part of the key because the heuristic must be told them
 * (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*; the bias pointer's alignment is read from the
 * descriptor's CUBLASLT_MATMUL_DESC_BIAS_POINTER, so the descriptor is built with the first
 * call's pointer and every call sets its own, of the same alignment): a chunk of D at row cs*R
 * may be less aligned than D itself. alpha and beta are arguments of the call, not of the key.
 * Each compute stream has its own workspace, since GEMMs on different compute streams run at the
 * same time. When the heuristic has no algorithm for a key (a row chunk of D aligned to 2 bytes,
 * say, or an epilogue the kernels lack), the key is cached as "fallback" and a plain tiled kernel
 * (cuda_kernels.cu) computes it with the same flags and epilogue. TPF_CUDA_GEMM_FALLBACK=1 (read
 * at creation) sends every GEMM there: a diagnostic that lets tests run the plain kernel on any
 * shape. With no flags and no epilogue, descriptor, layouts and call are exactly 0.1's.
 *
 * FP8 (SPEC §11): fp8 a and w (E4M3 x E4M3, E4M3 x E5M2, E5M2 x E4M3; cuBLASLt on Hopper has no
 * E5M2 x E5M2) with D bf16, fp16 or fp32, fp32 accumulation (no fast accumulation). cuBLASLt takes
 * fp8 only in the "TN" layout, which is exactly the flag-free mapping above (A' := w op T,
 * B' := a op N); a transposed fp8 operand is refused with TPF_EUNSUPPORTED before anything is
 * enqueued (tpf_cuda__gemm_fp8_prepare, called by execute before the handshake), as are fp8
 * leading dimensions that are not multiples of 16 elements (cuBLASLt's 16-byte rule) and a bias
 * on an fp32 D (cuBLASLt wants a bf16 bias there). The per-tensor scales are cuBLASLt's
 * CUBLASLT_MATMUL_DESC_A_SCALE_POINTER (w's scale_inv: A' is w) and B_SCALE_POINTER (a's), set on
 * the descriptor before every call like the bias pointer (NULL = 1). The plain kernel has no fp8
 * path: an fp8 key the heuristic has no algorithm for is refused (TPF_EUNSUPPORTED naming the
 * dims), and TPF_CUDA_GEMM_FALLBACK leaves fp8 GEMMs on cuBLASLt.
 */
#include "cuda_error.h"
#include "cuda_internal.h"
#include "cuda_param.h"

#include "tpflex/tpflex_backend_support.h"

#include <cublasLt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TPF_CUDA_GEMM_CACHE 256

typedef struct {
  uint64_t m, n, k, lda, ldw, ldd;
  int at, wt, dt;
  int align_a, align_w, align_d;
  int sm_target;
  int trans_a, trans_w; /* TPF_STEP_TRANS_A / TRANS_W */
  uint32_t epilogue;    /* cublasLtEpilogue_t; 0 (not a valid value) for "not set" */
  int align_bias;       /* 0 without a bias */
} tpf_cuda_gemm_key;

typedef struct {
  bool used;
  bool fallback; /* cuBLASLt has no algorithm: the plain kernel serves this key */
  tpf_cuda_gemm_key key;
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t la, lb, ld;
  cublasLtMatmulAlgo_t algo;
} tpf_cuda_gemm_entry;

/* Bytes of fp32 scratch per workspace for a 16-bit D accumulated into (beta != 0): see
 * tpf_cuda__gemm_beta16. */
#define TPF_CUDA_EPI_SCRATCH_BYTES (16ull << 20)

struct tpf_cuda_gemm {
  cublasLtHandle_t handle;
  void *ws;                   /* nworkspaces * ws_bytes of device memory */
  uint64_t ws_bytes;          /* per workspace */
  void *scratch;              /* nworkspaces * TPF_CUDA_EPI_SCRATCH_BYTES of device memory (fp32) */
  tpf_cuda_status *ok_status; /* device memory, always TPF_CUDA_DEV_OK: the reduce kernel's */
  int nworkspaces;
  bool force_fallback; /* TPF_CUDA_GEMM_FALLBACK: every GEMM by the plain kernel */
  uint64_t lookups, hits, fallbacks;
  const float *fp8_sa, *fp8_sw; /* this operation's fp8 scales (device; NULL = 1), see FP8 */
  unsigned next_victim;
  tpf_cuda_gemm_entry cache[TPF_CUDA_GEMM_CACHE];
};

tpf_status tpf_cuda__gemm_create(int nworkspaces, uint64_t ws_bytes, tpf_cuda_gemm **out) {
  tpf_cuda_gemm *g = tpf_calloc(1, sizeof(*g));
  if (g == NULL) return tpf_set_error(TPF_ENOMEM, "cannot allocate the cuBLASLt GEMM state");
  cublasStatus_t st = cublasLtCreate(&g->handle);
  if (st != CUBLAS_STATUS_SUCCESS) {
    tpf_free(g);
    return tpf_cuda__lt_err(st, "cublasLtCreate");
  }
  g->ws_bytes = ws_bytes;
  g->nworkspaces = nworkspaces;
  g->force_fallback = tpf_cuda__param_on(TPF_CUDA_PARAM_GEMM_FALLBACK);
  cudaError_t e = cudaMalloc(&g->ws, (size_t)ws_bytes * (size_t)nworkspaces);
  if (e == cudaSuccess)
    e = cudaMalloc(&g->scratch, (size_t)TPF_CUDA_EPI_SCRATCH_BYTES * (size_t)nworkspaces);
  if (e == cudaSuccess) e = cudaMalloc((void **)&g->ok_status, sizeof(tpf_cuda_status));
  if (e == cudaSuccess) e = cudaMemset(g->ok_status, 0, sizeof(tpf_cuda_status));
  if (e != cudaSuccess) {
    cudaFree(g->ok_status);
    cudaFree(g->scratch);
    cudaFree(g->ws);
    cublasLtDestroy(g->handle);
    tpf_free(g);
    return tpf_cuda__err(e, "cudaMalloc(cuBLASLt workspace and epilogue scratch)");
  }
  *out = g;
  return TPF_OK;
}

static void tpf_cuda__gemm_entry_free(tpf_cuda_gemm_entry *en) {
  if (!en->used) return;
  cublasLtMatrixLayoutDestroy(en->la);
  cublasLtMatrixLayoutDestroy(en->lb);
  cublasLtMatrixLayoutDestroy(en->ld);
  cublasLtMatmulDescDestroy(en->desc);
  memset(en, 0, sizeof(*en));
}

void tpf_cuda__gemm_destroy(tpf_cuda_gemm *g) {
  if (g == NULL) return;
  for (int i = 0; i < TPF_CUDA_GEMM_CACHE; i++)
    tpf_cuda__gemm_entry_free(&g->cache[i]);
  cudaFree(g->ok_status);
  cudaFree(g->scratch);
  cudaFree(g->ws);
  cublasLtDestroy(g->handle);
  tpf_free(g);
}

void tpf_cuda__gemm_stats(const tpf_cuda_gemm *g, uint64_t *lookups, uint64_t *hits,
                          uint64_t *fallbacks) {
  *lookups = g->lookups;
  *hits = g->hits;
  *fallbacks = g->fallbacks;
}

static cudaDataType_t tpf_cuda__data_type(int t) {
  switch (t) {
  case TPF_BF16:
    return CUDA_R_16BF;
  case TPF_FP16:
    return CUDA_R_16F;
  case TPF_FP8_E4M3:
    return CUDA_R_8F_E4M3;
  case TPF_FP8_E5M2:
    return CUDA_R_8F_E5M2;
  default:
    return CUDA_R_32F;
  }
}

/* Largest power of two (<= 256) dividing the address: what the heuristic may assume. */
static int tpf_cuda__ptr_align(const void *p) {
  uintptr_t v = (uintptr_t)p;
  int a = 256;
  while (a > 1 && (v % (uintptr_t)a) != 0)
    a /= 2;
  return a;
}

static bool tpf_cuda__key_eq(const tpf_cuda_gemm_key *x, const tpf_cuda_gemm_key *y) {
  return memcmp(x, y, sizeof(*x)) == 0;
}

static uint64_t tpf_cuda__key_hash(const tpf_cuda_gemm_key *k) {
  const unsigned char *p = (const unsigned char *)k;
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < sizeof(*k); i++)
    h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

static bool tpf_cuda__epi_on(const tpf_cuda_epi *e) {
  return e != NULL && e->on != 0;
}

void tpf_cuda__gemm_plan_of(uint64_t m, uint64_t n, uint64_t k, uint64_t lda, uint64_t ldw,
                            uint64_t ldd, unsigned flags, const tpf_cuda_epi *e,
                            tpf_cuda_gemm_plan *out) {
  const bool ta = (flags & TPF_STEP_TRANS_A) != 0, tw = (flags & TPF_STEP_TRANS_W) != 0;
  memset(out, 0, sizeof(*out));
  /* A' := w: row-major [n, k] is column-major k x n (op T); stored [k, n] is n x k (op N). */
  out->op_a = tw ? 0 : 1;
  out->a_rows = tw ? n : k;
  out->a_cols = tw ? k : n;
  out->a_ld = ldw;
  /* B' := a: row-major [m, k] is column-major k x m (op N); stored [k, m] is m x k (op T). */
  out->op_b = ta ? 1 : 0;
  out->b_rows = ta ? m : k;
  out->b_cols = ta ? k : m;
  out->b_ld = lda;
  out->d_rows = n;
  out->d_cols = m;
  out->d_ld = ldd;
  const bool bias = tpf_cuda__epi_on(e) && e->bias != NULL;
  const bool gelu = tpf_cuda__epi_on(e) && e->gelu != 0;
  out->epilogue = (uint32_t)(bias && gelu ? CUBLASLT_EPILOGUE_GELU_BIAS
                             : bias       ? CUBLASLT_EPILOGUE_BIAS
                             : gelu       ? CUBLASLT_EPILOGUE_GELU
                                          : CUBLASLT_EPILOGUE_DEFAULT);
}

/* Builds the entry of `key`; bias is the first call's bias pointer (the heuristic reads its
 * alignment from the descriptor), NULL without one. */
static tpf_status tpf_cuda__gemm_build(tpf_cuda_gemm *g, const tpf_cuda_gemm_key *key,
                                       const tpf_cuda_gemm_plan *plan, const void *bias,
                                       tpf_cuda_gemm_entry *en) {
  tpf_status rc = TPF_OK;
  cublasLtMatmulPreference_t pref = NULL;
  memset(en, 0, sizeof(*en));
  en->key = *key;
  const cublasOperation_t opa = plan->op_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t opb = plan->op_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  TPF_LT_TRY_GOTO(cublasLtMatmulDescCreate(&en->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F),
                  "cublasLtMatmulDescCreate", rc, fail);
  TPF_LT_TRY_GOTO(
      cublasLtMatmulDescSetAttribute(en->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa)),
      "set TRANSA", rc, fail);
  TPF_LT_TRY_GOTO(
      cublasLtMatmulDescSetAttribute(en->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb)),
      "set TRANSB", rc, fail);
  if (key->sm_target > 0) {
    int32_t sms = key->sm_target;
    TPF_LT_TRY_GOTO(cublasLtMatmulDescSetAttribute(en->desc, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET,
                                                   &sms, sizeof(sms)),
                    "set SM_COUNT_TARGET", rc, fail);
  }
  /* Left unset without an epilogue, so that the 0.1 descriptor is unchanged. */
  if (plan->epilogue != (uint32_t)CUBLASLT_EPILOGUE_DEFAULT) {
    const uint32_t epi = plan->epilogue;
    TPF_LT_TRY_GOTO(
        cublasLtMatmulDescSetAttribute(en->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)),
        "set EPILOGUE", rc, fail);
  }
  if (bias != NULL)
    TPF_LT_TRY_GOTO(cublasLtMatmulDescSetAttribute(en->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                   &bias, sizeof(bias)),
                    "set BIAS_POINTER", rc, fail);
  /* Column-major layouts of the Method: A' := w, B' := a, D' := d. */
  TPF_LT_TRY_GOTO(cublasLtMatrixLayoutCreate(&en->la, tpf_cuda__data_type(key->wt), plan->a_rows,
                                             plan->a_cols, (int64_t)plan->a_ld),
                  "layout(w)", rc, fail);
  TPF_LT_TRY_GOTO(cublasLtMatrixLayoutCreate(&en->lb, tpf_cuda__data_type(key->at), plan->b_rows,
                                             plan->b_cols, (int64_t)plan->b_ld),
                  "layout(a)", rc, fail);
  TPF_LT_TRY_GOTO(cublasLtMatrixLayoutCreate(&en->ld, tpf_cuda__data_type(key->dt), plan->d_rows,
                                             plan->d_cols, (int64_t)plan->d_ld),
                  "layout(d)", rc, fail);
  TPF_LT_TRY_GOTO(cublasLtMatmulPreferenceCreate(&pref), "preference create", rc, fail);
  uint64_t ws = g->ws_bytes;
  TPF_LT_TRY_GOTO(cublasLtMatmulPreferenceSetAttribute(
                      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)),
                  "set MAX_WORKSPACE_BYTES", rc, fail);
  uint32_t al_w = (uint32_t)key->align_w, al_a = (uint32_t)key->align_a,
           al_d = (uint32_t)key->align_d;
  TPF_LT_TRY_GOTO(cublasLtMatmulPreferenceSetAttribute(
                      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_w, sizeof(al_w)),
                  "set MIN_ALIGNMENT_A", rc, fail);
  TPF_LT_TRY_GOTO(cublasLtMatmulPreferenceSetAttribute(
                      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_a, sizeof(al_a)),
                  "set MIN_ALIGNMENT_B", rc, fail);
  TPF_LT_TRY_GOTO(cublasLtMatmulPreferenceSetAttribute(
                      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_d, sizeof(al_d)),
                  "set MIN_ALIGNMENT_C", rc, fail);
  TPF_LT_TRY_GOTO(cublasLtMatmulPreferenceSetAttribute(
                      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d, sizeof(al_d)),
                  "set MIN_ALIGNMENT_D", rc, fail);
  /* SPEC §1: fp32 accumulation, one rounding. A split-K algorithm whose partial sums are reduced
   * in the output type (OUTPUT_TYPE) or in place in D (INPLACE) rounds bf16/fp16 partial sums
   * before adding them; allow only the compute-type reduction (and no split at all), as PyTorch
   * does when reduced-precision reductions are off. The H200 conformance run of 2026-12-03 saw
   * 9 of 6,510 bf16 cases off by 1-2 ulps beyond the reference's slack on small PIPELINE blocks
   * with cuBLASLt and none with the fallback kernel; this is the suspected cause (to verify). */
  uint32_t reduction = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
  TPF_LT_TRY_GOTO(cublasLtMatmulPreferenceSetAttribute(pref,
                                                       CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                                       &reduction, sizeof(reduction)),
                  "set REDUCTION_SCHEME_MASK", rc, fail);
  cublasLtMatmulHeuristicResult_t res;
  memset(&res, 0, sizeof(res));
  int found = 0;
  g->lookups++;
  cublasStatus_t hst = cublasLtMatmulAlgoGetHeuristic(g->handle, en->desc, en->la, en->lb, en->ld,
                                                      en->ld, pref, 1, &res, &found);
  if (hst == CUBLAS_STATUS_NOT_SUPPORTED)
    found = 0;
  else if (hst != CUBLAS_STATUS_SUCCESS)
    TPF_LT_TRY_GOTO(hst, "cublasLtMatmulAlgoGetHeuristic", rc, fail);
  if (found < 1)
    en->fallback = true; /* e.g. a 2-byte aligned chunk: the plain kernel computes it */
  else
    en->algo = res.algo;
  en->used = true;
  cublasLtMatmulPreferenceDestroy(pref);
  return TPF_OK;
fail:
  if (pref != NULL) cublasLtMatmulPreferenceDestroy(pref);
  if (en->la != NULL) cublasLtMatrixLayoutDestroy(en->la);
  if (en->lb != NULL) cublasLtMatrixLayoutDestroy(en->lb);
  if (en->ld != NULL) cublasLtMatrixLayoutDestroy(en->ld);
  if (en->desc != NULL) cublasLtMatmulDescDestroy(en->desc);
  memset(en, 0, sizeof(*en));
  return rc;
}

static tpf_status tpf_cuda__gemm_lookup(tpf_cuda_gemm *g, const tpf_cuda_gemm_key *key,
                                        const tpf_cuda_gemm_plan *plan, const void *bias,
                                        tpf_cuda_gemm_entry **out) {
  const unsigned start = (unsigned)(tpf_cuda__key_hash(key) % TPF_CUDA_GEMM_CACHE);
  /* Open addressing over a small window; when the window is full, evict round-robin in it. */
  enum { WINDOW = 8 };
  for (unsigned i = 0; i < WINDOW; i++) {
    tpf_cuda_gemm_entry *en = &g->cache[(start + i) % TPF_CUDA_GEMM_CACHE];
    if (en->used && tpf_cuda__key_eq(&en->key, key)) {
      g->hits++;
      *out = en;
      return TPF_OK;
    }
  }
  tpf_cuda_gemm_entry *slot = NULL;
  for (unsigned i = 0; i < WINDOW && slot == NULL; i++) {
    tpf_cuda_gemm_entry *en = &g->cache[(start + i) % TPF_CUDA_GEMM_CACHE];
    if (!en->used) slot = en;
  }
  if (slot == NULL) {
    slot = &g->cache[(start + (g->next_victim++ % WINDOW)) % TPF_CUDA_GEMM_CACHE];
    tpf_cuda__gemm_entry_free(slot);
  }
  TPF_CHECK(tpf_cuda__gemm_build(g, key, plan, bias, slot));
  *out = slot;
  return TPF_OK;
}

static tpf_status tpf_cuda__gemm_fallback(tpf_cuda_gemm *g, const void *a, tpf_dtype at,
                                          uint64_t lda, const void *w, uint64_t ldw, void *d,
                                          tpf_dtype dt, uint64_t ldd, uint64_t m, uint64_t n,
                                          uint64_t k, unsigned flags, const tpf_cuda_epi *e,
                                          cudaStream_t s) {
  g->fallbacks++;
  TPF_CUDA_TRY(tpf_cuda__launch_gemm_fallback(a, (int)at, lda, w, ldw, d, (int)dt, ldd, m, n, k,
                                              flags, e, s),
               "fallback GEMM launch");
  return TPF_OK;
}

/* A 16-bit D accumulated into (beta != 0). cuBLASLt's kernels round the product to D's type
 * before they add beta * C (two roundings: on the H200 bf16 results where product and old value
 * cancel were off by 2-4e-3, docs/results/h200.md, session 7), where SPEC §5 wants
 * act(alpha * product + beta * D + bias) rounded once. So the product goes to fp32 scratch
 * (cuBLASLt, no epilogue) and the reduce kernel (count 1, fp32 in) applies the whole epilogue in
 * fp32 and rounds once, row block by row block of the scratch. With rows too wide for the
 * scratch, the plain kernel does it all. */
static tpf_status tpf_cuda__gemm_beta16(tpf_cuda_gemm *g, const void *a, tpf_dtype at, uint64_t lda,
                                        const void *w, tpf_dtype wt, uint64_t ldw, void *d,
                                        tpf_dtype dt, uint64_t ldd, uint64_t m, uint64_t n,
                                        uint64_t k, unsigned flags, const tpf_cuda_epi *e,
                                        int sm_target, int ws, cudaStream_t s) {
  const uint64_t block = TPF_CUDA_EPI_SCRATCH_BYTES / (n * sizeof(float));
  if (block == 0)
    return tpf_cuda__gemm_fallback(g, a, at, lda, w, ldw, d, dt, ldd, m, n, k, flags, e, s);
  float *scratch = (float *)((char *)g->scratch +
                             (size_t)TPF_CUDA_EPI_SCRATCH_BYTES * (size_t)(ws % g->nworkspaces));
  const uint64_t ea = tpf_dtype_size(at), ed = tpf_dtype_size(dt);
  for (uint64_t r0 = 0; r0 < m; r0 += block) {
    const uint64_t rows = m - r0 < block ? m - r0 : block;
    /* Row r0 of op(a): column r0 of the stored [k, m] when TRANS_A, row r0 otherwise. */
    const char *ar = (const char *)a + ((flags & TPF_STEP_TRANS_A) ? r0 : r0 * lda) * ea;
    TPF_CHECK(tpf_cuda__gemm_run_ex(g, ar, at, lda, w, wt, ldw, scratch, TPF_FP32, n, rows, n, k,
                                    flags, NULL, sm_target, ws, s));
    tpf_cuda_reduce_args ra;
    memset(&ra, 0, sizeof(ra));
    ra.srcs[0] = scratch;
    ra.dst = (char *)d + r0 * ldd * ed;
    ra.src_ld = n;
    ra.dst_ld = ldd;
    ra.rows = rows;
    ra.cols = n;
    ra.count = 1;
    ra.src_dtype = TPF_FP32;
    ra.dst_dtype = (int32_t)dt;
    ra.epi = *e;
    TPF_CUDA_TRY(tpf_cuda__launch_reduce(&ra, g->ok_status, sm_target > 0 ? sm_target : 1024, s),
                 "epilogue kernel launch");
  }
  return TPF_OK;
}

static bool tpf_cuda__fp8(tpf_dtype t) {
  return t == TPF_FP8_E4M3 || t == TPF_FP8_E5M2;
}

/* The dtype and leading dimension of a GEMM step operand (FP8 checks before enqueueing). */
static void tpf_cuda__operand(const tpf_exec_args *a, const tpf_mref *r, tpf_dtype *t,
                              uint64_t *ld) {
  const tpf_matrix *mat = r->id == TPF_MAT_X   ? &a->x
                          : r->id == TPF_MAT_W ? &a->w
                          : r->id == TPF_MAT_D ? &a->d
                                               : NULL;
  if (r->id == TPF_MAT_BUF || mat == NULL) {
    *t = a->sched->dtype;
    *ld = r->ld ? r->ld : a->sched->cols;
    return;
  }
  *t = mat->dtype;
  *ld = r->ld ? r->ld : mat->ld;
}

tpf_status tpf_cuda__gemm_fp8_prepare(tpf_cuda_gemm *g, const tpf_exec_args *a) {
  if (g != NULL) { /* NULL: only the checks (CPU tests) */
    g->fp8_sa = a->a_scale_inv;
    g->fp8_sw = a->w_scale_inv;
  }
  const tpf_schedule *sc = a->sched;
  for (int i = 0; i < sc->nsteps; i++) {
    const tpf_step *st = &sc->steps[i];
    if (st->kind != TPF_STEP_GEMM) continue;
    tpf_dtype at, wt, dt;
    uint64_t lda, ldw, ldd;
    tpf_cuda__operand(a, &st->a, &at, &lda);
    tpf_cuda__operand(a, &st->w, &wt, &ldw);
    tpf_cuda__operand(a, &st->d, &dt, &ldd);
    if (!tpf_cuda__fp8(at) && !tpf_cuda__fp8(wt)) continue;
    TPF_RETURN_IF(st->flags & (TPF_STEP_TRANS_A | TPF_STEP_TRANS_W), TPF_EUNSUPPORTED,
                  "'%s': cuBLASLt runs fp8 GEMMs (%s x %s) only in the TN layout: a stored "
                  "[m, k] and w stored [n, k]; trans_a / trans_w are not available with fp8 on "
                  "CUDA (transpose the fp8 data first)",
                  a->comm_name, tpf_dtype_name(at), tpf_dtype_name(wt));
    TPF_RETURN_IF(lda % 16 != 0 || ldw % 16 != 0, TPF_EUNSUPPORTED,
                  "'%s': cuBLASLt's fp8 GEMM needs leading dimensions that are multiples of 16 "
                  "elements (16 bytes): a (%s) has ld %llu, w (%s) ld %llu",
                  a->comm_name, tpf_dtype_name(at), (unsigned long long)lda, tpf_dtype_name(wt),
                  (unsigned long long)ldw);
    TPF_RETURN_IF((st->flags & TPF_STEP_EPILOGUE) && a->epi.bias != NULL && dt == TPF_FP32,
                  TPF_EUNSUPPORTED,
                  "'%s': cuBLASLt's fp8 GEMM takes a bias only for a bf16 or fp16 D (this D is "
                  "fp32: its bias would have to be bf16)",
                  a->comm_name);
    (void)ldd;
  }
  return TPF_OK;
}

tpf_status tpf_cuda__gemm_run_ex(tpf_cuda_gemm *g, const void *a, tpf_dtype at, uint64_t lda,
                                 const void *w, tpf_dtype wt, uint64_t ldw, void *d, tpf_dtype dt,
                                 uint64_t ldd, uint64_t m, uint64_t n, uint64_t k, unsigned flags,
                                 const tpf_cuda_epi *e, int sm_target, int ws, cudaStream_t s) {
  if (m == 0 || n == 0) return TPF_OK;
  const bool f8 = tpf_cuda__fp8(at) || tpf_cuda__fp8(wt);
  if (f8) {
    TPF_RETURN_IF(!tpf_cuda__fp8(at) || !tpf_cuda__fp8(wt), TPF_EUNSUPPORTED,
                  "fp8 GEMM needs two fp8 operands: a %s, w %s", tpf_dtype_name(at),
                  tpf_dtype_name(wt));
    TPF_RETURN_IF(at == TPF_FP8_E5M2 && wt == TPF_FP8_E5M2, TPF_EUNSUPPORTED,
                  "cuBLASLt has no fp8_e5m2 x fp8_e5m2 GEMM (e4m3 x e4m3, e4m3 x e5m2, e5m2 x "
                  "e4m3)");
    TPF_RETURN_IF(dt != TPF_BF16 && dt != TPF_FP16 && dt != TPF_FP32, TPF_EUNSUPPORTED,
                  "fp8 GEMM output dtype %s is not supported (bf16, fp16, fp32)",
                  tpf_dtype_name(dt));
    TPF_RETURN_IF(flags & (TPF_STEP_TRANS_A | TPF_STEP_TRANS_W), TPF_EUNSUPPORTED,
                  "cuBLASLt runs fp8 GEMMs only in the TN layout (no trans_a / trans_w)");
  }
  TPF_RETURN_IF(!f8 && at != wt, TPF_EUNSUPPORTED, "GEMM operand dtypes differ: a %s, w %s",
                tpf_dtype_name(at), tpf_dtype_name(wt));
  TPF_RETURN_IF(!f8 && at != TPF_BF16 && at != TPF_FP16 && at != TPF_FP32, TPF_EUNSUPPORTED,
                "GEMM input dtype %s is not supported (bf16, fp16, fp32)", tpf_dtype_name(at));
  TPF_RETURN_IF(!f8 && dt != at && dt != TPF_FP32, TPF_EUNSUPPORTED,
                "GEMM output dtype %s with input %s is not supported", tpf_dtype_name(dt),
                tpf_dtype_name(at));
  flags &= (unsigned)(TPF_STEP_TRANS_A | TPF_STEP_TRANS_W);
  const bool epi = tpf_cuda__epi_on(e);
  const void *bias = epi ? e->bias : NULL;
  if (g->force_fallback && !f8) /* the plain kernel has no fp8 path */
    return tpf_cuda__gemm_fallback(g, a, at, lda, w, ldw, d, dt, ldd, m, n, k, flags, e, s);
  if (epi && e->beta != 0.0f && dt != TPF_FP32)
    return tpf_cuda__gemm_beta16(g, a, at, lda, w, wt, ldw, d, dt, ldd, m, n, k, flags, e,
                                 sm_target, ws, s);
  tpf_cuda_gemm_plan plan;
  tpf_cuda__gemm_plan_of(m, n, k, lda, ldw, ldd, flags, e, &plan);
  tpf_cuda_gemm_key key;
  memset(&key, 0, sizeof(key)); /* padding too: the key is compared and hashed bytewise */
  key.m = m;
  key.n = n;
  key.k = k;
  key.lda = lda;
  key.ldw = ldw;
  key.ldd = ldd;
  key.at = (int)at;
  key.wt = (int)wt;
  key.dt = (int)dt;
  key.align_a = tpf_cuda__ptr_align(a);
  key.align_w = tpf_cuda__ptr_align(w);
  key.align_d = tpf_cuda__ptr_align(d);
  key.sm_target = sm_target;
  /* Zero for 0.1 calls, so that their keys hash and compare as before. */
  key.trans_a = (flags & TPF_STEP_TRANS_A) != 0;
  key.trans_w = (flags & TPF_STEP_TRANS_W) != 0;
  key.epilogue = plan.epilogue == (uint32_t)CUBLASLT_EPILOGUE_DEFAULT ? 0u : plan.epilogue;
  key.align_bias = bias != NULL ? tpf_cuda__ptr_align(bias) : 0;
  tpf_cuda_gemm_entry *en = NULL;
  TPF_CHECK(tpf_cuda__gemm_lookup(g, &key, &plan, bias, &en));
  TPF_RETURN_IF(f8 && en->fallback, TPF_EUNSUPPORTED,
                "cuBLASLt has no fp8 GEMM algorithm for %s x %s -> %s, m %llu n %llu k %llu, "
                "lda %llu ldw %llu ldd %llu, alignments a %d w %d d %d bytes (fp8 wants 16-byte "
                "aligned operands); the plain kernel has no fp8 path",
                tpf_dtype_name(at), tpf_dtype_name(wt), tpf_dtype_name(dt), (unsigned long long)m,
                (unsigned long long)n, (unsigned long long)k, (unsigned long long)lda,
                (unsigned long long)ldw, (unsigned long long)ldd, key.align_a, key.align_w,
                key.align_d);
  if (en->fallback)
    return tpf_cuda__gemm_fallback(g, a, at, lda, w, ldw, d, dt, ldd, m, n, k, flags, e, s);
  if (f8) {
    /* A' is w, B' is a (Method): w's scale is cuBLASLt's A scale. Set on every call, like the
     * bias pointer: the descriptor is read when the call is enqueued. */
    const void *sa = g->fp8_sw, *sb = g->fp8_sa;
    TPF_LT_TRY(cublasLtMatmulDescSetAttribute(en->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa,
                                              sizeof(sa)),
               "set A_SCALE_POINTER");
    TPF_LT_TRY(cublasLtMatmulDescSetAttribute(en->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb,
                                              sizeof(sb)),
               "set B_SCALE_POINTER");
  }
  if (bias != NULL) {
    /* This call's bias (same alignment as the one the entry was built with: it is in the key).
     * The descriptor is read when the call is enqueued, so changing it afterwards is safe. */
    TPF_LT_TRY(cublasLtMatmulDescSetAttribute(en->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                              sizeof(bias)),
               "set BIAS_POINTER");
  }
  const float alpha = epi ? e->alpha : 1.0f, beta = epi ? e->beta : 0.0f;
  void *wsp = (char *)g->ws + (size_t)g->ws_bytes * (size_t)(ws % g->nworkspaces);
  cublasStatus_t st = cublasLtMatmul(g->handle, en->desc, &alpha, w, en->la, a, en->lb, &beta, d,
                                     en->ld, d, en->ld, &en->algo, wsp, g->ws_bytes, s);
  if (st == CUBLAS_STATUS_NOT_SUPPORTED && epi && !f8) {
    /* The heuristic offered an algorithm the call then refuses (nothing was enqueued): serve
     * this key by the plain kernel from now on. */
    en->fallback = true;
    return tpf_cuda__gemm_fallback(g, a, at, lda, w, ldw, d, dt, ldd, m, n, k, flags, e, s);
  }
  if (st != CUBLAS_STATUS_SUCCESS) return tpf_cuda__lt_err(st, "cublasLtMatmul");
  return TPF_OK;
}
