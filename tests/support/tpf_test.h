/* The one header tests include for CMocka (CMocka 2.0 changed its API; this is the only place
 * that knows). Also pulls in the public and internal headers and the mock backend. */
#ifndef TPF_TEST_H
#define TPF_TEST_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "internal.h"
#include "tpflex/tpflex.h"
#include "tpflex/tpflex_backend.h"

/* Asserts a status, printing both names and the detail on failure. */
#define TPF_ASSERT_STATUS(expr, want)                                                              \
  do {                                                                                             \
    tpf_status tpf_got_ = (expr);                                                                  \
    if (tpf_got_ != (want))                                                                        \
      fail_msg("%s returned %s, expected %s (detail: %s)", #expr, tpf_status_name(tpf_got_),       \
               tpf_status_name(want), tpf_last_error());                                           \
  } while (0)
#define TPF_ASSERT_OK(expr) TPF_ASSERT_STATUS(expr, TPF_OK)

/* Rank r's layout description of P ranks: fp32, capacity 64 * P rows, T active rows, H columns,
 * the given split count and aggregate flag, everything else zero (schedule tests). */
static inline tpf_layout_desc tpf_test_layout_desc(tpf_algo algo, tpf_coll coll, int P, int r,
                                                   uint64_t T, uint64_t H, int splits,
                                                   bool aggregate) {
  tpf_layout_desc d;
  memset(&d, 0, sizeof d);
  d.tp_size = P;
  d.rank = r;
  d.algo = algo;
  d.coll = coll;
  d.dtype = TPF_FP32;
  d.capacity.rows = 64 * (uint64_t)P;
  d.capacity.cols = d.active.cols = H;
  d.active.rows = T;
  d.num_splits = splits;
  d.aggregate = aggregate;
  return d;
}

/* A communicator configuration with the given fields and everything else zero. */
static inline tpf_comm_config tpf_test_config(const char *name, tpf_algo algo, tpf_coll coll,
                                              tpf_dtype dtype, uint64_t rows, uint64_t cols) {
  tpf_comm_config c;
  memset(&c, 0, sizeof c);
  c.name = name;
  c.algo = algo;
  c.coll = coll;
  c.dtype = dtype;
  c.capacity.rows = rows;
  c.capacity.cols = cols;
  return c;
}

/* Deletes step idx of a schedule, dropping deps on it and renumbering later ones (for building
 * broken schedules the checker must reject). */
static inline void tpf_test_remove_step(tpf_schedule *s, int idx) {
  memmove(&s->steps[idx], &s->steps[idx + 1], (size_t)(s->nsteps - idx - 1) * sizeof *s->steps);
  s->nsteps--;
  for (int i = 0; i < s->nsteps; i++) {
    tpf_step *st = &s->steps[i];
    int n = 0;
    for (int j = 0; j < st->ndeps; j++) {
      int dep = st->deps[j];
      if (dep == idx) continue;
      st->deps[n++] = (uint16_t)(dep > idx ? dep - 1 : dep);
    }
    st->ndeps = (uint8_t)n;
  }
}

/* ---- mock_backend.c: a host-memory backend that records calls and executes nothing ---- */
typedef struct {
  tpf_backend hdr; /* core-visible header */
  int reg_live;    /* registrations alive */
  int reg_total;   /* registrations ever made */
  int activations; /* reg_activate calls */
  int executions;  /* execute calls */
  uint64_t last_active_bytes;
  uint64_t last_seq;
  tpf_schedule last_sched;  /* header fields of the last executed schedule (steps = NULL) */
  tpf_status fail_execute;  /* returned by execute when not TPF_OK */
  tpf_status fail_activate; /* returned by reg_activate when not TPF_OK */
  int fail_activate_at;     /* only the activation with this index fails (-1: every one) */
  int activate_calls;       /* reg_activate calls, failed ones included */
  int fail_reg_after;       /* reg_create fails once reg_total reaches it (-1: never) */
} tpf_mock_backend;

void tpf_mock_init(tpf_mock_backend *m, int tp_size, int rank);
extern const tpf_backend_ops tpf_mock_ops;

#endif
