/* loopback: a tpflex backend written outside the tree, from the installed headers only. It runs
 * one rank (P = 1), where every schedule is the operation's one GEMM step, on the host in fp32;
 * any other step is TPF_EUNSUPPORTED. main() registers a communicator on it and runs ag_gemm at
 * an active T below capacity. Build: examples/loopback_backend/CMakeLists.txt (find_package). */
#include <stdio.h>
#include <tpflex/tpflex.h>
#include <tpflex/tpflex_backend.h>
#include <tpflex/tpflex_backend_support.h> /* TPF_RETURN_IF, TPF_CHECK, tpf_calloc, tpf_mul_u64 */

struct tpf_reg {
  void *data;
};

static tpf_status lb_reg_create(tpf_backend *be, const char *name, uint64_t bytes, tpf_reg **reg,
                                void **local) {
  (void)be;
  tpf_reg *r = tpf_calloc(1, sizeof *r);
  void *data = bytes <= SIZE_MAX ? tpf_calloc(1, (size_t)bytes) : NULL;
  if (!r || !data) {
    tpf_free(r);
    tpf_free(data);
    return tpf_set_error(TPF_ENOMEM, "loopback: registration '%s' of %llu bytes", name,
                         (unsigned long long)bytes);
  }
  r->data = data;
  *reg = r;
  *local = data;
  return TPF_OK;
}

static tpf_status lb_reg_destroy(tpf_backend *be, tpf_reg *reg) {
  (void)be;
  tpf_free(reg->data);
  tpf_free(reg);
  return TPF_OK;
}

/* The view a step's operand names: the registration, or one of the user's matrices. */
static tpf_status view(tpf_reg *reg, const tpf_exec_args *a, const tpf_mref *m, char **p,
                       uint64_t *ld, tpf_dtype *t) {
  const tpf_matrix *u = m->id == TPF_MAT_X ? &a->x : m->id == TPF_MAT_W ? &a->w : &a->d;
  *t = m->id == TPF_MAT_BUF ? a->sched->dtype : u->dtype;
  *ld = m->id == TPF_MAT_BUF ? m->ld : m->ld ? m->ld : u->ld;
  uint64_t el, off;
  TPF_RETURN_IF(!tpf_mul_u64(m->row, *ld, &el) || !tpf_add_u64(el, m->col, &el) ||
                    !tpf_mul_u64(el, tpf_dtype_size(*t), &off),
                TPF_EOVERFLOW, "loopback: operand offset overflows");
  *p = (m->id == TPF_MAT_BUF ? (char *)reg->data + m->off_bytes : (char *)u->ptr) + off;
  return TPF_OK;
}

static tpf_status lb_execute(tpf_backend *be, tpf_reg *reg, const tpf_exec_args *a, void *stream) {
  (void)be, (void)stream;
  for (int i = 0; i < a->sched->nsteps; i++) {
    const tpf_step *s = &a->sched->steps[i];
    TPF_RETURN_IF(s->kind != TPF_STEP_GEMM, TPF_EUNSUPPORTED,
                  "loopback: step %d is %s; this backend runs only GEMM steps (P = 1)", i,
                  tpf_step_kind_name(s->kind));
    char *pa, *pw, *pd;
    uint64_t la, lw, ld;
    tpf_dtype ta, tw, td;
    TPF_CHECK(view(reg, a, &s->a, &pa, &la, &ta));
    TPF_CHECK(view(reg, a, &s->w, &pw, &lw, &tw));
    TPF_CHECK(view(reg, a, &s->d, &pd, &ld, &td));
    for (uint64_t r = 0; r < s->m; r++) /* d[m, n] = a[m, k] * w[n, k]^T */
      for (uint64_t c = 0; c < s->n; c++) {
        float acc = 0.0f;
        for (uint64_t k = 0; k < s->k; k++)
          acc += tpf_elem_to_float(ta, pa + (r * la + k) * tpf_dtype_size(ta)) *
                 tpf_elem_to_float(tw, pw + (c * lw + k) * tpf_dtype_size(tw));
        tpf_float_to_elem(td, acc, pd + (r * ld + c) * tpf_dtype_size(td));
      }
  }
  return TPF_OK;
}

static tpf_status lb_sync(tpf_backend *be, void *stream) {
  (void)be, (void)stream;
  return TPF_OK; /* execute is synchronous */
}

static const tpf_backend_ops lb_ops = {.abi_version = TPF_BACKEND_ABI_VERSION,
                                       .name = "loopback",
                                       .caps = TPF_BE_CAP_HOST_MEMORY,
                                       .align_bytes = 1,
                                       .max_ranks = 1,
                                       .reg_create = lb_reg_create,
                                       .reg_destroy = lb_reg_destroy,
                                       .execute = lb_execute,
                                       .sync = lb_sync};

enum { C = 8, T = 5, H = 4, N = 3 };

int main(void) {
  tpf_backend be = {.ops = &lb_ops, .tp_size = 1, .rank = 0};
  tpf_comm_config cfg = TPF_COMM_CONFIG_INIT;
  cfg.name = "fc1_fprop";
  cfg.algo = TPF_ALGO_RING;
  cfg.dtype = TPF_FP32;
  cfg.capacity = (tpf_shape){C, H};
  tpf_comm *c = NULL;
  tpf_matrix x;
  float w[N * H], d[T * N];
  tpf_status s = tpf_comm_create(&be, &cfg, &c);
  if (s == TPF_OK) s = tpf_comm_set_active_shape(c, (tpf_shape){T, H});
  if (s == TPF_OK) s = tpf_comm_local_chunk(c, &x); /* P = 1: the whole [T, H] input */
  for (int i = 0; s == TPF_OK && i < T * H; i++)
    ((float *)x.ptr)[i / H * x.ld + i % H] = (float)(i % 7);
  for (int i = 0; i < N * H; i++)
    w[i] = (float)(i % 5) - 2.0f;
  tpf_matrix wm = {w, N, H, H, TPF_FP32}, dm = {d, T, N, N, TPF_FP32};
  if (s == TPF_OK) s = tpf_ag_gemm(c, &wm, &dm, NULL);
  int wrong = 0;
  for (int i = 0; s == TPF_OK && i < T * N; i++) {
    float want = 0.0f;
    for (int k = 0; k < H; k++)
      want += (float)((i / N * H + k) % 7) * w[i % N * H + k];
    wrong += d[i] != want;
  }
  tpf_status ds = tpf_comm_destroy(c);
  if (s == TPF_OK) s = ds;
  if (s != TPF_OK || wrong) {
    printf("loopback: %s (%s), %d wrong elements\n", tpf_status_name(s), tpf_last_error(), wrong);
    return 1;
  }
  printf("loopback: ag_gemm [%d, %d] x [%d, %d]^T on an out-of-tree backend OK\n", T, H, N, H);
  return 0;
}
