/* A backend written for tpflex 0.1 (ABI version 1), compiled against the released 0.1 headers
 * next to this file (see README.md): it must keep working with today's core. It registers host
 * memory, records what it reads from each schedule, and executes nothing. */
#include "abi1_backend.h"

#include "tpflex/tpflex_backend.h" /* ./tpflex/: the 0.1 copy, found before any -I path */

#include <stdlib.h>
#include <string.h>

#if TPF_BACKEND_ABI_VERSION != 1
#error "abi1_backend.c must see the 0.1 header (TPF_BACKEND_ABI_VERSION 1)"
#endif

typedef struct {
  tpf_backend hdr;
  tpf_abi1_seen *seen;
} abi1_be;

struct tpf_reg {
  void *mem;
};

static tpf_status a_reg_create(tpf_backend *be, const char *name, uint64_t bytes, tpf_reg **reg,
                               void **local) {
  (void)be;
  (void)name;
  tpf_reg *r = calloc(1, sizeof *r);
  void *mem = calloc(1, (size_t)bytes);
  if (!r || !mem) {
    free(r);
    free(mem);
    return tpf_set_error(TPF_ENOMEM, "abi1: registration");
  }
  r->mem = mem;
  *reg = r;
  *local = mem;
  return TPF_OK;
}

static tpf_status a_reg_destroy(tpf_backend *be, tpf_reg *reg) {
  (void)be;
  free(reg->mem);
  free(reg);
  return TPF_OK;
}

static tpf_status a_execute(tpf_backend *be, tpf_reg *reg, const tpf_exec_args *a, void *stream) {
  (void)reg;
  (void)stream;
  tpf_abi1_seen *s = ((abi1_be *)(void *)be)->seen;
  const tpf_schedule *sc = a->sched;
  s->executes++;
  s->tp_size = sc->tp_size;
  s->rank = sc->rank;
  s->algo = (int)sc->algo;
  s->coll = (int)sc->coll;
  s->dtype = (int)sc->dtype;
  s->num_splits = sc->num_splits;
  s->aggregate = sc->aggregate;
  s->num_compute_streams = sc->num_compute_streams;
  s->nsteps = sc->nsteps;
  s->rows = sc->rows;
  s->cols = sc->cols;
  s->chunk_rows = sc->chunk_rows;
  s->chunk_bytes = sc->chunk_bytes;
  s->registered_bytes = sc->registered_bytes;
  s->active_bytes = sc->active_bytes;
  s->gemm_m = sc->gemm_m;
  s->gemm_n = sc->gemm_n;
  s->gemm_k = sc->gemm_k;
  if (sc->nsteps < 0 || sc->nsteps > TPF_ABI1_MAX_STEPS)
    return tpf_set_error(TPF_EBACKEND, "abi1: nsteps %d is not a step count", sc->nsteps);
  for (int i = 0; i < sc->nsteps; i++) {
    const tpf_step *st = &sc->steps[i];
    s->kind[i] = st->kind;
    s->stream[i] = st->stream;
    s->ndeps[i] = st->ndeps;
    s->m[i] = st->m;
    s->n[i] = st->n;
    s->k[i] = st->k;
  }
  s->seq = a->seq;
  strncpy(s->comm_name, a->comm_name ? a->comm_name : "", sizeof s->comm_name - 1);
  s->x = a->x.ptr;
  s->w = a->w.ptr;
  s->d = a->d.ptr;
  return TPF_OK;
}

static tpf_status a_sync(tpf_backend *be, void *stream) {
  (void)be;
  (void)stream;
  return TPF_OK;
}

static const tpf_backend_ops abi1_ops = {
    .abi_version = TPF_BACKEND_ABI_VERSION, /* 1: this header's */
    .name = "abi1",
    .caps = TPF_BE_CAP_HOST_MEMORY,
    .align_bytes = 16,
    .max_ranks = 1,
    .reg_create = a_reg_create,
    .reg_destroy = a_reg_destroy,
    .execute = a_execute,
    .sync = a_sync,
};

void *tpf_abi1_backend_new(tpf_abi1_seen *seen) {
  abi1_be *b = calloc(1, sizeof *b);
  if (!b) return NULL;
  b->hdr.ops = &abi1_ops;
  b->hdr.tp_size = 1;
  b->hdr.rank = 0;
  b->seen = seen;
  return &b->hdr;
}

void tpf_abi1_backend_free(void *be) {
  free(be);
}

size_t tpf_abi1_layout(const char **names, size_t *values, size_t max) {
  size_t n = 0;
#define L(name, value)                                                                             \
  do {                                                                                             \
    if (n < max) {                                                                                 \
      names[n] = name;                                                                             \
      values[n] = value;                                                                           \
    }                                                                                              \
    n++;                                                                                           \
  } while (0)
#include "abi1_layout.inc"
#undef L
  return n < max ? n : max;
}
