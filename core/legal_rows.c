/* The smallest legal active row count at or above a wanted one, so that callers can pad a
 * microbatch correctly without reading docs/SPEC.md §3.
 *
 * Method: a row count T is legal when T % P == 0, T <= C and every chunk, slot or pipeline block
 * of the layout meets the alignment. All three byte sizes are (T/P) times a fixed per-layout
 * factor (H*e, P*(H/S)*e, (H/S)*e), so T/P a multiple of the alignment always satisfies them:
 * starting at the first multiple of P at or above the wanted rows, at most `align` candidates
 * are tried, and the capacity (legal, a multiple of P) bounds the walk in any case. Every candidate
 * is checked by the same validator as set_active_shape, so the answer can never disagree with it.
 */
#include "comm_internal.h"

typedef unsigned long long ull;

static tpf_status legal_rows(const tpf_layout_desc *d, uint64_t align, uint64_t want,
                             uint64_t *out) {
  TPF_RETURN_IF(!d || !out, TPF_EINVAL, "legal rows: descriptor or out pointer is NULL");
  tpf_layout_desc probe = *d;
  probe.active = d->capacity;
  TPF_CHECK(tpf__layout_check_align(&probe, align)); /* the capacity itself must be legal */
  uint64_t p = (uint64_t)d->tp_size, c = d->capacity.rows;
  if (want == 0) want = 1;
  TPF_RETURN_IF(want > c, TPF_ECAPACITY, "wanted rows %llu exceed capacity %llu", (ull)want,
                (ull)c);
  uint64_t t = (want + p - 1) / p * p; /* want <= c and c % p == 0, so t <= c: no overflow */
  /* C itself is legal (checked above) and a multiple of P, so the walk ends at C at the latest;
   * by the argument in the header comment it ends within `align` steps. */
  probe.active.rows = t;
  while (tpf__layout_check_align(&probe, align) != TPF_OK)
    probe.active.rows += p;
  tpf__clear_error();
  *out = probe.active.rows;
  return TPF_OK;
}

tpf_status tpf_layout_legal_rows(const tpf_layout_desc *d, uint64_t rows, uint64_t *legal) {
  return legal_rows(d, 16, rows, legal);
}

tpf_status tpf_comm_legal_rows(const tpf_comm *c, uint64_t rows, uint64_t *legal) {
  TPF_CHECK(tpf__handle_check(c, TPF_HANDLE_COMM, "tpf_comm_legal_rows"));
  TPF_RETURN_IF(!legal, TPF_EINVAL, "tpf_comm_legal_rows: out pointer 'legal' is NULL ('%s')",
                c->cfg.name);
  tpf_layout_desc d = tpf__comm_desc(c, c->cfg.capacity);
  uint64_t t = 0;
  TPF_CHECK(legal_rows(&d, c->be->ops->align_bytes, rows, &t));
  *legal = c->cfg.external ? c->cfg.capacity.rows : t; /* external: stays at capacity */
  return TPF_OK;
}
