/* core/exec_check.c, the checker of what reaches a backend, is itself tested: every schedule the
 * builder makes passes it, and each of a list of single-field corruptions of those schedules is
 * refused with TPF_EINVAL (or TPF_EOVERFLOW) naming the step. */
#include "tpf_test.h"

#include <stdio.h>

#define P 4
#define C 32
#define H 16
#define N 8
#define K 12

static float xbuf[C * K], wbuf[H * K], dbuf[C * N + C * H];

typedef struct {
  tpf_layout_desc d;
  tpf_gemm_dims g;
  tpf_schedule s;
  tpf_exec_args a;
  uint64_t reg;
} built;

static void build(built *b, tpf_algo algo, tpf_coll coll, int rank, bool trans) {
  memset(b, 0, sizeof *b);
  b->d.tp_size = P;
  b->d.rank = rank;
  b->d.algo = algo;
  b->d.coll = coll;
  b->d.dtype = TPF_FP32;
  b->d.capacity = (tpf_shape){C, H};
  b->d.active = (tpf_shape){C, H};
  const bool ag = algo == TPF_ALGO_RING && coll == TPF_COLL_AG;
  const bool bulk = algo == TPF_ALGO_BULK;
  b->g = ag ? (tpf_gemm_dims){C, N, H} : bulk ? (tpf_gemm_dims){C, N, K} : (tpf_gemm_dims){C, H, K};
  TPF_ASSERT_OK(tpf_schedule_build(&b->d, &b->g, &b->s));
  TPF_ASSERT_OK(tpf_layout_registered_bytes(&b->d, &b->reg));
  b->a.sched = &b->s;
  b->a.comm_name = "chk";
  b->a.seq = 1;
  tpf_matrix x = {xbuf, C, K, K, TPF_FP32}, xt = {xbuf, K, C, C, TPF_FP32};
  tpf_matrix w = {wbuf, ag ? N : bulk ? N : H, ag ? H : K, ag ? H : K, TPF_FP32};
  tpf_matrix d = {dbuf, (ag || bulk) ? C : C / P, (ag || bulk) ? N : H, (ag || bulk) ? N : H,
                  TPF_FP32};
  if (!ag) b->a.x = trans ? xt : x;
  b->a.w = w;
  b->a.d = d;
  if (trans && !ag) {
    /* What the core's option pass does for trans_a: stored-block coordinates and the flag. */
    for (int i = 0; i < b->s.nsteps; i++) {
      tpf_step *st = &b->s.steps[i];
      if (st->kind == TPF_STEP_GEMM && st->a.id == TPF_MAT_X) {
        uint64_t t = st->a.row;
        st->a.row = st->a.col;
        st->a.col = t;
        st->flags |= TPF_STEP_TRANS_A;
      }
    }
  }
}

static int first_of(const tpf_schedule *s, int kind) {
  for (int i = 0; i < s->nsteps; i++)
    if (s->steps[i].kind == kind) return i;
  return -1;
}

static void expect_refused(built *b, const char *what, tpf_status want) {
  tpf_status st = tpf__exec_check(&b->a, b->reg);
  if (st != want)
    fail_msg("%s: got %s, expected %s", what, tpf_status_name(st), tpf_status_name(want));
  if (!strstr(tpf_last_error(), "'chk'"))
    fail_msg("%s: detail lacks the name: %s", what, tpf_last_error());
}

static void test_exec_check__builder_output_passes(void **state) {
  (void)state;
  const struct {
    tpf_algo a;
    tpf_coll c;
  } k[] = {{TPF_ALGO_RING, TPF_COLL_AG},
           {TPF_ALGO_RING, TPF_COLL_RS},
           {TPF_ALGO_PIPELINE, TPF_COLL_RS},
           {TPF_ALGO_BULK, TPF_COLL_AG},
           {TPF_ALGO_BULK, TPF_COLL_RS}};
  int n = 0;
  for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
    for (int r = 0; r < P; r++)
      for (int t = 0; t < 2; t++) {
        built b;
        build(&b, k[i].a, k[i].c, r, t != 0);
        tpf_status st = tpf__exec_check(&b.a, b.reg);
        if (st != TPF_OK)
          fail_msg("%s %s rank %d trans %d: %s", tpf_algo_name(k[i].a), tpf_coll_name(k[i].c), r, t,
                   tpf_last_error());
        tpf_schedule_free(&b.s);
        n++;
      }
  print_message("%d built schedules pass\n", n);
}

typedef void (*corrupt_fn)(built *b);
static void c_no_steps(built *b) {
  b->s.nsteps = 0;
}
static void c_rank(built *b) {
  b->s.rank = P;
}
static void c_kind(built *b) {
  b->s.steps[1].kind = TPF_STEP_KIND_COUNT;
}
static void c_stream(built *b) {
  b->s.steps[1].stream = TPF_NUM_STREAMS;
}
static void c_flags(built *b) {
  b->s.steps[1].flags = 0x80;
}
static void c_dep_forward(built *b) {
  b->s.steps[1].deps[0] = 1;
  b->s.steps[1].ndeps = 1;
}
static void c_handshake_late(built *b) {
  b->s.steps[0].kind = TPF_STEP_BARRIER;
}
static void c_send_peer(built *b) {
  b->s.steps[first_of(&b->s, TPF_STEP_SEND)].peer = b->s.rank;
}
static void c_send_tag(built *b) {
  b->s.steps[first_of(&b->s, TPF_STEP_SEND)].tag = TPF_MAX_TAGS;
}
static void c_send_span(built *b) {
  b->s.steps[first_of(&b->s, TPF_STEP_SEND)].dst_off = b->reg;
}
static void c_send_wrap(built *b) {
  b->s.steps[first_of(&b->s, TPF_STEP_SEND)].src_off = UINT64_MAX;
}
static void c_gemm_rows(built *b) {
  b->s.steps[first_of(&b->s, TPF_STEP_GEMM)].m = C + 1;
}
static void c_gemm_ld(built *b) {
  b->s.steps[first_of(&b->s, TPF_STEP_GEMM)].a.ld = 1;
}
static void c_gemm_user_ld(built *b) {
  b->s.steps[first_of(&b->s, TPF_STEP_GEMM)].w.ld = 3;
}
static void c_gemm_absent(built *b) {
  b->a.w.ptr = NULL;
}
static void c_epi_on_buf(built *b) {
  b->s.steps[first_of(&b->s, TPF_STEP_GEMM)].flags = TPF_STEP_EPILOGUE;
}
static void c_trans_on_send(built *b) {
  b->s.steps[first_of(&b->s, TPF_STEP_SEND)].flags = TPF_STEP_TRANS_A;
}

static void c_reduce_count(built *b) {
  b->s.steps[first_of(&b->s, TPF_STEP_REDUCE)].count = 0;
}
static void c_reduce_stride(built *b) {
  b->s.steps[first_of(&b->s, TPF_STEP_REDUCE)].stride_bytes = b->reg;
}
static void c_reduce_overflow(built *b) {
  b->s.steps[first_of(&b->s, TPF_STEP_REDUCE)].stride_bytes = UINT64_MAX;
}
static void c_barrier_tag(built *b) {
  b->s.steps[first_of(&b->s, TPF_STEP_BARRIER)].tag = TPF_MAX_TAGS;
}
static void c_peer_count(built *b) {
  b->s.steps[first_of(&b->s, TPF_STEP_PEER_REDUCE)].count = P + 1;
}

/* The mechanisms (0.3): the CUDA backend maps them without a check of its own. */
static void c_send_no_xport(built *b) {
  b->s.steps[first_of(&b->s, TPF_STEP_SEND)].xport = TPF_XPORT_NONE;
}
static void c_reduce_copy(built *b) {
  b->s.steps[first_of(&b->s, TPF_STEP_REDUCE)].xport = TPF_XPORT_COPY_ENGINE;
}
static void c_gemm_xport(built *b) {
  b->s.steps[first_of(&b->s, TPF_STEP_GEMM)].xport = TPF_XPORT_COPY_KERNEL;
}
static void c_sms_range(built *b) {
  b->s.steps[first_of(&b->s, TPF_STEP_GEMM)].sm_budget = TPF_SMS_COUNT;
}
static void c_sms_on_send(built *b) {
  b->s.steps[first_of(&b->s, TPF_STEP_SEND)].sm_budget = TPF_SMS_LEAVE_COMM;
}
static void c_hs_skips_peer(built *b) {
  const tpf_step *st = &b->s.steps[first_of(&b->s, TPF_STEP_SEND)];
  b->s.handshake_peers &= ~(1ull << (unsigned)st->peer);
}
static void c_hs_self(built *b) {
  b->s.handshake_peers |= 1ull << (unsigned)b->s.rank;
}
static void c_hs_outside(built *b) {
  b->s.handshake_peers |= 1ull << P;
}

static void test_exec_check__corruptions_refused(void **state) {
  (void)state;
  const struct {
    const char *what;
    tpf_algo algo;
    tpf_coll coll;
    corrupt_fn fn;
    tpf_status want;
  } cases[] = {
      {"no steps", TPF_ALGO_RING, TPF_COLL_AG, c_no_steps, TPF_EINVAL},
      {"rank out of range", TPF_ALGO_RING, TPF_COLL_AG, c_rank, TPF_EINVAL},
      {"unknown kind", TPF_ALGO_RING, TPF_COLL_AG, c_kind, TPF_EINVAL},
      {"unknown stream", TPF_ALGO_RING, TPF_COLL_AG, c_stream, TPF_EINVAL},
      {"unknown flag", TPF_ALGO_RING, TPF_COLL_AG, c_flags, TPF_EINVAL},
      {"forward dependency", TPF_ALGO_RING, TPF_COLL_AG, c_dep_forward, TPF_EINVAL},
      {"no handshake first", TPF_ALGO_RING, TPF_COLL_AG, c_handshake_late, TPF_EINVAL},
      {"send to self", TPF_ALGO_RING, TPF_COLL_AG, c_send_peer, TPF_EINVAL},
      {"send tag", TPF_ALGO_RING, TPF_COLL_AG, c_send_tag, TPF_EINVAL},
      {"send past the registration", TPF_ALGO_RING, TPF_COLL_AG, c_send_span, TPF_EINVAL},
      {"send offset wraps", TPF_ALGO_RING, TPF_COLL_AG, c_send_wrap, TPF_EINVAL},
      {"gemm rows past the buffer", TPF_ALGO_RING, TPF_COLL_AG, c_gemm_rows, TPF_EINVAL},
      {"buffer view ld", TPF_ALGO_RING, TPF_COLL_AG, c_gemm_ld, TPF_EINVAL},
      {"user operand with an ld", TPF_ALGO_RING, TPF_COLL_AG, c_gemm_user_ld, TPF_EINVAL},
      {"absent operand", TPF_ALGO_RING, TPF_COLL_AG, c_gemm_absent, TPF_EINVAL},
      {"epilogue not on the output", TPF_ALGO_RING, TPF_COLL_RS, c_epi_on_buf, TPF_EINVAL},
      {"transpose on a send", TPF_ALGO_RING, TPF_COLL_AG, c_trans_on_send, TPF_EINVAL},
      {"reduce of 0 views", TPF_ALGO_RING, TPF_COLL_RS, c_reduce_count, TPF_EINVAL},
      {"reduce stride past the buffer", TPF_ALGO_RING, TPF_COLL_RS, c_reduce_stride, TPF_EINVAL},
      {"reduce stride overflow", TPF_ALGO_RING, TPF_COLL_RS, c_reduce_overflow, TPF_EOVERFLOW},
      {"barrier tag", TPF_ALGO_PIPELINE, TPF_COLL_RS, c_barrier_tag, TPF_EINVAL},
      {"peer reduce of P+1", TPF_ALGO_PIPELINE, TPF_COLL_RS, c_peer_count, TPF_EINVAL},
      {"rs x block past its matrix", TPF_ALGO_PIPELINE, TPF_COLL_RS, c_gemm_rows, TPF_EINVAL},
      {"send without a transport", TPF_ALGO_RING, TPF_COLL_AG, c_send_no_xport, TPF_EINVAL},
      {"reduce by the copy engine", TPF_ALGO_RING, TPF_COLL_RS, c_reduce_copy, TPF_EINVAL},
      {"gemm with a transport", TPF_ALGO_BULK, TPF_COLL_AG, c_gemm_xport, TPF_EINVAL},
      {"sm budget out of range", TPF_ALGO_PIPELINE, TPF_COLL_RS, c_sms_range, TPF_EINVAL},
      {"sm budget on a send", TPF_ALGO_BULK, TPF_COLL_AG, c_sms_on_send, TPF_EINVAL},
      {"handshake skips a send peer", TPF_ALGO_RING, TPF_COLL_AG, c_hs_skips_peer, TPF_EINVAL},
      {"handshake names itself", TPF_ALGO_RING, TPF_COLL_AG, c_hs_self, TPF_EINVAL},
      {"handshake past the group", TPF_ALGO_BULK, TPF_COLL_AG, c_hs_outside, TPF_EINVAL},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    built b;
    build(&b, cases[i].algo, cases[i].coll, 1, false);
    TPF_ASSERT_OK(tpf__exec_check(&b.a, b.reg));
    cases[i].fn(&b);
    expect_refused(&b, cases[i].what, cases[i].want);
    print_message("%-30s -> %s\n", cases[i].what, tpf_last_error());
    tpf_schedule_free(&b.s);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_exec_check__builder_output_passes),
      cmocka_unit_test(test_exec_check__corruptions_refused),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
