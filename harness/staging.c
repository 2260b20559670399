/* Operand staging through a rank environment (staging.h). */
#include "staging.h"

#include <stdlib.h>
#include <string.h>

static size_t matrix_bytes(uint64_t rows, uint64_t ld, tpf_dtype dt) {
  return (size_t)(rows * ld * tpf_dtype_size(dt));
}

tpf_status tpf_stage_new(tpf_conf_env *env, int rank, tpf_stage_mat *m, uint64_t rows,
                         uint64_t cols, uint64_t ld, tpf_dtype dt) {
  memset(m, 0, sizeof *m);
  m->bytes = matrix_bytes(rows, ld, dt);
  void *h = calloc(1, m->bytes ? m->bytes : 1);
  void *d = env->mem_alloc(env, rank, m->bytes ? m->bytes : 1);
  if (!h || !d) {
    free(h);
    if (d) env->mem_free(env, rank, d);
    size_t bytes = m->bytes;
    memset(m, 0, sizeof *m);
    return tpf_set_error(TPF_ENOMEM, "%s: operand of %zu bytes", env->name, bytes);
  }
  const tpf_matrix t = {NULL, rows, cols, ld, dt};
  m->host = t;
  m->host.ptr = h;
  m->dev = t;
  m->dev.ptr = d;
  return TPF_OK;
}

void tpf_stage_free(tpf_conf_env *env, int rank, tpf_stage_mat *m) {
  if (m->dev.ptr) env->mem_free(env, rank, m->dev.ptr);
  free(m->host.ptr);
  memset(m, 0, sizeof *m);
}

tpf_status tpf_stage_upload(tpf_conf_env *env, int rank, tpf_stage_mat *m, uint64_t rows) {
  return env->upload(env, rank, m->dev.ptr, m->host.ptr,
                     matrix_bytes(rows, m->host.ld, m->host.dtype));
}

tpf_status tpf_stage_download(tpf_conf_env *env, int rank, tpf_stage_mat *m, uint64_t rows) {
  return env->download(env, rank, m->host.ptr, m->dev.ptr,
                       matrix_bytes(rows, m->host.ld, m->host.dtype));
}

tpf_status tpf_stage_host_new(tpf_matrix *m, uint64_t rows, uint64_t cols, tpf_dtype dt) {
  /* One spare byte: an empty matrix still has a pointer to free. */
  const tpf_matrix t = {calloc(1, matrix_bytes(rows, cols, dt) + 1), rows, cols, cols, dt};
  if (!t.ptr)
    return tpf_set_error(TPF_ENOMEM, "host matrix [%llu, %llu]", (unsigned long long)rows,
                         (unsigned long long)cols);
  *m = t;
  return TPF_OK;
}

tpf_matrix tpf_stage_rows(const tpf_matrix *m, uint64_t r0, uint64_t n) {
  tpf_matrix v = *m;
  v.ptr = (unsigned char *)m->ptr + r0 * m->ld * tpf_dtype_size(m->dtype);
  v.rows = n;
  return v;
}

tpf_matrix tpf_stage_view(const tpf_matrix *m, uint64_t rows, uint64_t cols) {
  tpf_matrix v = *m;
  v.rows = rows;
  v.cols = cols;
  return v;
}

tpf_status tpf_stage_put_local(tpf_conf_env *env, int rank, tpf_comm *c, const tpf_matrix *x) {
  tpf_matrix loc;
  tpf_status st = tpf_comm_local_chunk(c, &loc);
  if (st != TPF_OK) return st;
  const size_t esz = tpf_dtype_size(x->dtype);
  const char *src = (const char *)x->ptr + (uint64_t)rank * loc.rows * x->ld * esz;
  return env->upload(env, rank, loc.ptr, src, (size_t)(loc.rows * loc.cols * esz));
}

tpf_status tpf_stage_put_buffer(tpf_conf_env *env, int rank, tpf_comm *c, const tpf_matrix *x) {
  tpf_matrix full;
  tpf_status st = tpf_comm_buffer(c, &full);
  if (st != TPF_OK) return st;
  return env->upload(env, rank, full.ptr, x->ptr, matrix_bytes(x->rows, x->cols, x->dtype));
}

tpf_status tpf_stage_get_buffer(tpf_conf_env *env, int rank, tpf_comm *c, tpf_matrix *host) {
  tpf_matrix full, h;
  tpf_status st = tpf_comm_buffer(c, &full);
  if (st == TPF_OK) st = tpf_stage_host_new(&h, full.rows, full.cols, full.dtype);
  if (st != TPF_OK) return st;
  st = env->download(env, rank, h.ptr, full.ptr, matrix_bytes(full.rows, full.cols, full.dtype));
  if (st != TPF_OK) {
    free(h.ptr);
    return st;
  }
  *host = h;
  return TPF_OK;
}
