/* Structural validation of an operation before any backend sees it.
 *
 * Method: one pass over the rank's steps, rules in a fixed order, each failure naming the step
 * and the numbers: the schedule header is sane and starts with the handshake; every step has a
 * known kind, stream and flag set and depends only on earlier steps; every peer and tag is in
 * range; every byte range of the registration (SEND/RECV offsets, BUF operand views, REDUCE
 * sources shifted by their stride) lies inside the registered bytes; every user operand block
 * (transposed blocks with their stored extent) lies inside its matrix; every step's transport
 * class and SM budget are ones its kind admits, and the handshake's peer set covers every peer
 * the schedule needs (tpflex_backend.h). All arithmetic is overflow-checked. A backend may then
 * map steps to its calls without re-deriving or re-checking any of this.
 * The core's own builder never trips a rule (the conformance sweep and the schedule fuzzer run
 * through here); a rule firing means a core bug or memory corruption, and nothing is enqueued.
 */
#include "internal.h"

#include <string.h>

typedef unsigned long long ull;

#define KNOWN_FLAGS (TPF_STEP_TRANS_A | TPF_STEP_TRANS_W | TPF_STEP_EPILOGUE)

static const tpf_matrix *user(const tpf_exec_args *a, uint8_t id) {
  switch (id) {
  case TPF_MAT_X:
    return &a->x;
  case TPF_MAT_W:
    return &a->w;
  case TPF_MAT_D:
    return &a->d;
  default:
    return NULL;
  }
}

/* A [rows, cols] access through r: inside the registration (BUF, shifted by `shift` bytes) or
 * inside its user matrix. */
static tpf_status operand(const tpf_exec_args *a, int i, const char *what, const tpf_mref *r,
                          uint64_t rows, uint64_t cols, uint64_t shift, uint64_t reg_bytes) {
  const char *n = a->comm_name ? a->comm_name : "?";
  if (rows == 0 || cols == 0) return TPF_OK;
  if (r->id == TPF_MAT_BUF) {
    const uint64_t esz = tpf_dtype_size(a->sched->dtype);
    uint64_t last, end, off;
    TPF_RETURN_IF(r->ld < cols, TPF_EINVAL, "'%s' step %d: %s view has ld %llu < %llu columns", n,
                  i, what, (ull)r->ld, (ull)cols);
    bool ok = tpf__add_u64(r->row, rows - 1, &last) && tpf__mul_u64(last, r->ld, &last) &&
              tpf__add_u64(last, r->col, &last) && tpf__add_u64(last, cols, &end) &&
              tpf__mul_u64(end, esz, &end) && tpf__add_u64(end, r->off_bytes, &end) &&
              tpf__add_u64(end, shift, &end);
    off = r->off_bytes;
    TPF_RETURN_IF(!ok || end > reg_bytes, TPF_EINVAL,
                  "'%s' step %d: %s view at byte %llu (rows %llu+%llu, ld %llu) ends past the "
                  "%llu registered bytes",
                  n, i, what, (ull)(off + shift), (ull)r->row, (ull)rows, (ull)r->ld,
                  (ull)reg_bytes);
    return TPF_OK;
  }
  const tpf_matrix *m = user(a, r->id);
  TPF_RETURN_IF(!m || !m->ptr, TPF_EINVAL, "'%s' step %d: %s names operand %u, not given", n, i,
                what, (unsigned)r->id);
  TPF_RETURN_IF(r->ld != 0 || r->off_bytes != 0, TPF_EINVAL,
                "'%s' step %d: %s of a user matrix has ld %llu, offset %llu (must be 0)", n, i,
                what, (ull)r->ld, (ull)r->off_bytes);
  uint64_t re, ce;
  TPF_RETURN_IF(
      !tpf__add_u64(r->row, rows, &re) || !tpf__add_u64(r->col, cols, &ce) || re > m->rows ||
          ce > m->cols,
      TPF_EINVAL, "'%s' step %d: %s block [%llu+%llu, %llu+%llu] exceeds its [%llu, %llu] matrix",
      n, i, what, (ull)r->row, (ull)rows, (ull)r->col, (ull)cols, (ull)m->rows, (ull)m->cols);
  return TPF_OK;
}

static tpf_status range(const tpf_exec_args *a, int i, const char *what, uint64_t off,
                        uint64_t bytes, uint64_t reg_bytes) {
  uint64_t end;
  TPF_RETURN_IF(!tpf__add_u64(off, bytes, &end) || end > reg_bytes, TPF_EINVAL,
                "'%s' step %d: %s bytes [%llu, +%llu) outside the %llu registered bytes",
                a->comm_name ? a->comm_name : "?", i, what, (ull)off, (ull)bytes, (ull)reg_bytes);
  return TPF_OK;
}

/* The step's mechanism (tpflex_backend.h: tpf_xport, tpf_sm_budget): a class its kind admits. */
static tpf_status mech_ok(const tpf_exec_args *a, int i) {
  const tpf_step *st = &a->sched->steps[i];
  const char *n = a->comm_name ? a->comm_name : "?";
  bool ok;
  switch (st->kind) {
  case TPF_STEP_SEND:
    ok = st->xport == TPF_XPORT_COPY_ENGINE || st->xport == TPF_XPORT_COPY_KERNEL;
    break;
  case TPF_STEP_REDUCE:
  case TPF_STEP_PEER_REDUCE:
    ok = st->xport == TPF_XPORT_REDUCE_KERNEL;
    break;
  default:
    ok = st->xport == TPF_XPORT_NONE;
    break;
  }
  TPF_RETURN_IF(!ok, TPF_EINVAL, "'%s' step %d: transport class %u on a %s step", n, i,
                (unsigned)st->xport, tpf_step_kind_name(st->kind));
  TPF_RETURN_IF(st->sm_budget >= TPF_SMS_COUNT ||
                    (st->kind != TPF_STEP_GEMM && st->sm_budget != TPF_SMS_ALL),
                TPF_EINVAL, "'%s' step %d: SM budget %u on a %s step", n, i,
                (unsigned)st->sm_budget, tpf_step_kind_name(st->kind));
  return TPF_OK;
}

/* The handshake's peer set covers every peer the schedule needs to have started (the rule of
 * tpf_schedule.handshake_peers), names no rank outside the group and not this one. */
static tpf_status peers_ok(const tpf_exec_args *a) {
  const tpf_schedule *s = a->sched;
  const int P = s->tp_size;
  const uint64_t group = P >= 64 ? ~0ull : (1ull << (unsigned)P) - 1u,
                 me = 1ull << (unsigned)s->rank;
  uint64_t need = 0;
  bool all = false;
  for (int i = 0; i < s->nsteps; i++) {
    const tpf_step *st = &s->steps[i];
    if (st->kind == TPF_STEP_SEND || st->kind == TPF_STEP_RECV) need |= 1ull << (unsigned)st->peer;
    all = all || st->kind == TPF_STEP_BARRIER || st->kind == TPF_STEP_PEER_REDUCE ||
          st->xport == TPF_XPORT_COPY_KERNEL;
  }
  if (all) need = group;
  need &= ~me;
  TPF_RETURN_IF((s->handshake_peers & ~group) != 0 || (s->handshake_peers & me) != 0 ||
                    (need & ~s->handshake_peers) != 0,
                TPF_EINVAL,
                "'%s': handshake peers 0x%llx of rank %d of %d: they must cover 0x%llx, within "
                "the group and without this rank",
                a->comm_name ? a->comm_name : "?", (ull)s->handshake_peers, s->rank, P, (ull)need);
  return TPF_OK;
}

static tpf_status step_ok(const tpf_exec_args *a, int i, uint64_t reg_bytes) {
  const tpf_schedule *s = a->sched;
  const tpf_step *st = &s->steps[i];
  const char *n = a->comm_name ? a->comm_name : "?";
  const int P = s->tp_size;
  TPF_RETURN_IF(st->kind >= TPF_STEP_KIND_COUNT || st->stream >= TPF_NUM_STREAMS ||
                    st->ndeps > TPF_STEP_MAX_DEPS || (st->flags & ~KNOWN_FLAGS) != 0,
                TPF_EINVAL, "'%s' step %d: kind %u, stream %u, %u deps, flags 0x%x", n, i,
                (unsigned)st->kind, (unsigned)st->stream, (unsigned)st->ndeps, (unsigned)st->flags);
  /* P = 1 has no peer to agree with: its schedule may omit the handshake (one GEMM). */
  TPF_RETURN_IF(st->kind == TPF_STEP_HANDSHAKE ? i != 0 : (i == 0 && P > 1), TPF_EINVAL,
                "'%s' step %d: the handshake must be step 0 and only step 0 (kind %s)", n, i,
                tpf_step_kind_name(st->kind));
  for (int j = 0; j < st->ndeps; j++)
    TPF_RETURN_IF(st->deps[j] >= i, TPF_EINVAL,
                  "'%s' step %d depends on step %u, not an earlier one", n, i,
                  (unsigned)st->deps[j]);
  TPF_RETURN_IF((st->flags & TPF_STEP_EPILOGUE) && st->d.id != TPF_MAT_D, TPF_EINVAL,
                "'%s' step %d: epilogue on a step that does not write the output", n, i);
  TPF_RETURN_IF((st->flags & (TPF_STEP_TRANS_A | TPF_STEP_TRANS_W)) && st->kind != TPF_STEP_GEMM,
                TPF_EINVAL, "'%s' step %d: transpose flags on a %s step", n, i,
                tpf_step_kind_name(st->kind));
  TPF_CHECK(mech_ok(a, i));
  switch (st->kind) {
  case TPF_STEP_SEND:
  case TPF_STEP_RECV:
    TPF_RETURN_IF(st->peer < 0 || st->peer >= P || st->peer == s->rank || st->tag >= TPF_MAX_TAGS,
                  TPF_EINVAL, "'%s' step %d: peer %d or tag %u invalid for rank %d of %d", n, i,
                  (int)st->peer, (unsigned)st->tag, s->rank, P);
    TPF_CHECK(range(a, i, "source", st->src_off, st->bytes, reg_bytes));
    return range(a, i, "destination", st->dst_off, st->bytes, reg_bytes);
  case TPF_STEP_BARRIER:
    TPF_RETURN_IF(st->tag >= TPF_MAX_TAGS, TPF_EINVAL, "'%s' step %d: tag %u invalid", n, i,
                  (unsigned)st->tag);
    return TPF_OK;
  case TPF_STEP_GEMM: {
    const bool ta = (st->flags & TPF_STEP_TRANS_A) != 0, tw = (st->flags & TPF_STEP_TRANS_W) != 0;
    TPF_CHECK(operand(a, i, "a", &st->a, ta ? st->k : st->m, ta ? st->m : st->k, 0, reg_bytes));
    TPF_CHECK(operand(a, i, "w", &st->w, tw ? st->k : st->n, tw ? st->n : st->k, 0, reg_bytes));
    return operand(a, i, "d", &st->d, st->m, st->n, 0, reg_bytes);
  }
  case TPF_STEP_REDUCE:
  case TPF_STEP_PEER_REDUCE: {
    const bool peers = st->kind == TPF_STEP_PEER_REDUCE;
    TPF_RETURN_IF(st->count == 0 || st->count > (uint32_t)(peers ? P : TPF_MAX_RANKS) ||
                      st->a.id != TPF_MAT_BUF,
                  TPF_EINVAL, "'%s' step %d: reduction of %u views of operand %u", n, i,
                  (unsigned)st->count, (unsigned)st->a.id);
    uint64_t shift = 0;
    TPF_RETURN_IF(!peers && !tpf__mul_u64(st->count - 1u, st->stride_bytes, &shift), TPF_EOVERFLOW,
                  "'%s' step %d: reduction stride overflows", n, i);
    TPF_CHECK(operand(a, i, "reduction source", &st->a, st->m, st->n, shift, reg_bytes));
    return operand(a, i, "d", &st->d, st->m, st->n, 0, reg_bytes);
  }
  default:
    return TPF_OK;
  }
}

tpf_status tpf__exec_check(const tpf_exec_args *a, uint64_t reg_bytes) {
  TPF_RETURN_IF(!a || !a->sched, TPF_EINVAL, "execute: no schedule");
  const tpf_schedule *s = a->sched;
  const char *n = a->comm_name ? a->comm_name : "?";
  TPF_RETURN_IF(s->nsteps < 1 || s->nsteps > 65535 || !s->steps, TPF_EINVAL,
                "empty schedule for '%s' (%d steps)", n, s->nsteps);
  TPF_RETURN_IF(s->tp_size < 1 || s->tp_size > TPF_MAX_RANKS || s->rank < 0 ||
                    s->rank >= s->tp_size || tpf_dtype_size(s->dtype) == 0,
                TPF_EINVAL, "'%s': schedule header: rank %d of %d, dtype %d", n, s->rank,
                s->tp_size, (int)s->dtype);
  for (int i = 0; i < s->nsteps; i++)
    TPF_CHECK(step_ok(a, i, reg_bytes));
  return peers_ok(a);
}
