/* Schedule builders: every schedule of every variant for P in {1..8, 16} and every T (strided
 * for P = 16) passes the independent checker; the P = 4, r = 1 step tables of the reference
 * (te-userbuffers §5.1 and §5.3) come out literally; builds are deterministic. */
#include "tpf_test.h"

#define MAXP 16

typedef struct {
  const char *name;
  tpf_algo algo;
  tpf_coll coll;
  int splits; /* -1: P/2-aggregate */
  bool aggregate;
} variant;

static const variant variants[] = {
    {"ring ag", TPF_ALGO_RING, TPF_COLL_AG, 0, false},
    {"ring ag splits=1", TPF_ALGO_RING, TPF_COLL_AG, 1, false},
    {"ring ag aggregate", TPF_ALGO_RING, TPF_COLL_AG, 0, true},
    {"ring rs", TPF_ALGO_RING, TPF_COLL_RS, 0, false},
    {"pipeline rs S=1", TPF_ALGO_PIPELINE, TPF_COLL_RS, 1, false},
    {"pipeline rs S=2", TPF_ALGO_PIPELINE, TPF_COLL_RS, 2, false},
    {"pipeline rs S=4", TPF_ALGO_PIPELINE, TPF_COLL_RS, 4, false},
    {"pipeline rs S=8", TPF_ALGO_PIPELINE, TPF_COLL_RS, 8, false},
    {"bulk ag", TPF_ALGO_BULK, TPF_COLL_AG, 0, false},
    {"bulk rs", TPF_ALGO_BULK, TPF_COLL_RS, 0, false},
    {"ring rs serial", TPF_ALGO_RING, TPF_COLL_RS, 1, false}, /* no overlap (0.2) */
};

static tpf_layout_desc make_desc(const variant *v, int P, int r, uint64_t T, uint64_t H) {
  tpf_layout_desc d;
  memset(&d, 0, sizeof d);
  d.tp_size = P;
  d.rank = r;
  d.algo = v->algo;
  d.coll = v->coll;
  d.dtype = TPF_FP32;
  d.capacity.rows = 64 * (uint64_t)P;
  d.capacity.cols = d.active.cols = H;
  d.active.rows = T;
  d.num_splits = v->splits;
  d.aggregate = v->aggregate;
  return d;
}

static tpf_gemm_dims dims_for(const variant *v, uint64_t T, uint64_t H) {
  tpf_gemm_dims g;
  if (v->algo == TPF_ALGO_BULK) {
    g.m = 24;
    g.n = 40;
    g.k = 56;
  } else if (v->coll == TPF_COLL_AG) {
    g.m = T;
    g.n = 48;
    g.k = H;
  } else {
    g.m = T;
    g.n = H;
    g.k = 72;
  }
  return g;
}

static void free_all(tpf_schedule *s, int P) {
  for (int r = 0; r < P; r++)
    tpf_schedule_free(&s[r]);
}

static void build_all(const variant *v, int P, uint64_t T, uint64_t H, tpf_schedule *s) {
  tpf_gemm_dims g = dims_for(v, T, H);
  for (int r = 0; r < P; r++) {
    tpf_layout_desc d = make_desc(v, P, r, T, H);
    TPF_ASSERT_OK(tpf_schedule_build(&d, &g, &s[r]));
  }
}

/* Literal structural rules of DESIGN.md that the checker does not insist on. */
static void check_literal_rules(const tpf_schedule *s, const variant *v, int P) {
  if (P == 1) {
    /* One rank is exactly the operation's one GEMM, into D, on compute 0; no
     * handshake, no split, no copy, whatever split count the variant asked for. */
    assert_int_equal(s->nsteps, 1);
    assert_int_equal(s->steps[0].kind, TPF_STEP_GEMM);
    assert_int_equal(s->steps[0].stream, TPF_STREAM_COMPUTE0);
    assert_int_equal(s->steps[0].d.id, TPF_MAT_D);
    assert_int_equal(s->steps[0].m, s->gemm_m);
    assert_int_equal(s->steps[0].n, s->gemm_n);
    assert_int_equal(s->steps[0].k, s->gemm_k);
    assert_int_equal(s->steps[0].ndeps, 0);
    assert_int_equal(s->num_splits, 1);
    assert_int_equal(s->num_compute_streams, 1);
    return;
  }
  assert_int_equal(s->steps[0].kind, TPF_STEP_HANDSHAKE);
  assert_int_equal(s->steps[0].stream, TPF_STREAM_COMM);
  bool seen[TPF_NUM_STREAMS] = {false};
  int gemms = 0;
  for (int i = 1; i < s->nsteps; i++) {
    const tpf_step *st = &s->steps[i];
    if (st->stream != TPF_STREAM_COMM && !seen[st->stream]) {
      bool has0 = false;
      for (int j = 0; j < st->ndeps; j++)
        has0 = has0 || st->deps[j] == 0;
      if (!has0)
        fail_msg("%s P=%d rank %d: step %d is the first on %s but does not depend on step 0",
                 v->name, P, s->rank, i, tpf_stream_name(st->stream));
    }
    seen[st->stream] = true;
    if (st->kind == TPF_STEP_GEMM) {
      assert_int_equal(st->stream, gemms % s->num_compute_streams);
      gemms++;
    }
    if (st->kind != TPF_STEP_SEND && st->kind != TPF_STEP_RECV) assert_int_equal(st->peer, -1);
  }
  int want_gemms = v->algo == TPF_ALGO_BULK ? 1 : s->num_splits;
  /* RING RS without overlap: all T rows, as two row ranges unless the rotation starts at 0. */
  if (v->algo == TPF_ALGO_RING && v->coll == TPF_COLL_RS && s->num_splits == 1 && P > 1)
    want_gemms = s->rank == P - 1 ? 1 : 2;
  assert_int_equal(gemms, want_gemms);
  int ns = s->num_splits < 3 ? s->num_splits : 3;
  assert_int_equal(s->num_compute_streams, v->algo == TPF_ALGO_BULK ? 1 : ns);
}

static void test_all_schedules(void **state) {
  (void)state;
  static const int ps[] = {1, 2, 3, 4, 5, 6, 7, 8, 16};
  static tpf_schedule s[MAXP];
  long groups = 0, steps = 0;
  for (size_t pi = 0; pi < TPF_ARRAY_SIZE(ps); pi++) {
    int P = ps[pi];
    uint64_t stride = P == 16 ? 5 * (uint64_t)P : (uint64_t)P;
    for (size_t vi = 0; vi < TPF_ARRAY_SIZE(variants); vi++) {
      const variant *v = &variants[vi];
      if (v->aggregate && P % 2) continue;
      for (uint64_t T = (uint64_t)P; T <= 64 * (uint64_t)P; T += stride) {
        build_all(v, P, T, 32, s);
        tpf_status rc = tpf_schedule_check(s, P);
        if (rc != TPF_OK)
          fail_msg("%s P=%d T=%llu: %s", v->name, P, (unsigned long long)T, tpf_last_error());
        for (int r = 0; r < P; r++) {
          check_literal_rules(&s[r], v, P);
          steps += s[r].nsteps;
          assert_int_equal(s[r].rows, T);
          assert_int_equal(s[r].cols, 32);
          assert_int_equal(s[r].chunk_rows, T / (uint64_t)P);
          assert_int_equal(s[r].chunk_bytes, T / (uint64_t)P * 32 * 4);
        }
        free_all(s, P);
        groups++;
      }
    }
  }
  printf("schedules: %ld groups built and checked (%ld steps)\n", groups, steps);
}

/* te-userbuffers §5.1, P = 4, r = 1: compute chunk, send chunk -> rank, receive chunk <- rank. */
static void test_ring_ag_example(void **state) {
  (void)state;
  static const int compute[] = {1, 0, 3, 2};
  static const int send_chunk[] = {1, 0, 3}, recv_chunk[] = {0, 3, 2};
  tpf_layout_desc d = make_desc(&variants[0], 4, 1, 16, 8); /* R = 4 rows, S = 128 bytes */
  tpf_gemm_dims g = {16, 48, 8};
  tpf_schedule s;
  TPF_ASSERT_OK(tpf_schedule_build(&d, &g, &s));
  int gi = 0, si = 0, ri = 0;
  for (int i = 0; i < s.nsteps; i++) {
    const tpf_step *st = &s.steps[i];
    if (st->kind == TPF_STEP_GEMM) {
      assert_int_equal(st->chunk, compute[gi]);
      assert_int_equal(st->a.id, TPF_MAT_BUF);
      assert_int_equal(st->a.row, (uint64_t)compute[gi] * 4);
      assert_int_equal(st->d.row, (uint64_t)compute[gi] * 4);
      assert_int_equal(st->m, 4);
      assert_int_equal(st->n, 48);
      assert_int_equal(st->k, 8);
      assert_int_equal(st->stream, gi % 3);
      gi++;
    } else if (st->kind == TPF_STEP_SEND) {
      assert_int_equal(st->chunk, send_chunk[si]);
      assert_int_equal(st->peer, 2);
      assert_int_equal(st->src_off, (uint64_t)send_chunk[si] * 128);
      assert_int_equal(st->dst_off, (uint64_t)send_chunk[si] * 128);
      assert_int_equal(st->bytes, 128);
      assert_int_equal(st->tag, (uint32_t)si);
      si++;
    } else if (st->kind == TPF_STEP_RECV) {
      assert_int_equal(st->chunk, recv_chunk[ri]);
      assert_int_equal(st->peer, 0);
      assert_int_equal(st->dst_off, (uint64_t)recv_chunk[ri] * 128);
      assert_int_equal(st->tag, (uint32_t)ri);
      ri++;
    }
  }
  assert_int_equal(gi, 4);
  assert_int_equal(si, 3);
  assert_int_equal(ri, 3);
  assert_int_equal(s.nsteps, 1 + 4 + 3 + 3);
  tpf_schedule_free(&s);

  /* Aggregate: the swap with rank 0 yields {0,1}; step 0 computes {0,1}, sends {0,1} to rank 3
   * and receives {2,3} from rank 3; step 1 computes {2,3}. */
  d.aggregate = true;
  TPF_ASSERT_OK(tpf_schedule_build(&d, &g, &s));
  assert_int_equal(s.num_splits, 2);
  assert_int_equal(s.nsteps, 7);
  const tpf_step *st = s.steps;
  assert_int_equal(st[1].kind, TPF_STEP_SEND);
  assert_int_equal(st[1].peer, 0);
  assert_int_equal(st[1].src_off, 128);
  assert_int_equal(st[1].bytes, 128);
  assert_int_equal(st[2].kind, TPF_STEP_RECV);
  assert_int_equal(st[2].peer, 0);
  assert_int_equal(st[2].dst_off, 0);
  assert_int_equal(st[3].kind, TPF_STEP_GEMM);
  assert_int_equal(st[3].a.row, 0);
  assert_int_equal(st[3].m, 8);
  assert_int_equal(st[4].kind, TPF_STEP_SEND);
  assert_int_equal(st[4].peer, 3);
  assert_int_equal(st[4].src_off, 0);
  assert_int_equal(st[4].bytes, 256);
  assert_int_equal(st[5].kind, TPF_STEP_RECV);
  assert_int_equal(st[5].peer, 3);
  assert_int_equal(st[5].dst_off, 256);
  assert_int_equal(st[5].bytes, 256);
  assert_int_equal(st[6].kind, TPF_STEP_GEMM);
  assert_int_equal(st[6].a.row, 8);
  assert_int_equal(st[6].m, 8);
  tpf_schedule_free(&s);

  /* splits = 1: the three forwards, then one GEMM over all rows after the last receive. */
  d.aggregate = false;
  d.num_splits = 1;
  TPF_ASSERT_OK(tpf_schedule_build(&d, &g, &s));
  assert_int_equal(s.nsteps, 1 + 6 + 1);
  st = &s.steps[s.nsteps - 1];
  assert_int_equal(st->kind, TPF_STEP_GEMM);
  assert_int_equal(st->m, 16);
  assert_int_equal(st->a.row, 0);
  bool dep_last_recv = false;
  for (int j = 0; j < st->ndeps; j++)
    dep_last_recv = dep_last_recv || st->deps[j] == s.nsteps - 2;
  assert_true(dep_last_recv);
  tpf_schedule_free(&s);
}

/* te-userbuffers §5.3, P = 4, r = 1: GEMM input chunk -> slot, send slot -> rank, recv. */
static void test_ring_rs_example(void **state) {
  (void)state;
  static const int in_chunk[] = {2, 3, 0, 1};
  static const int send_to[] = {2, 3, 0}, recv_from[] = {0, 3, 2}, recv_slot[] = {4, 5, 6};
  tpf_layout_desc d = make_desc(&variants[3], 4, 1, 16, 8); /* S = 4*8*4 = 128 bytes */
  tpf_gemm_dims g = {16, 8, 72};
  tpf_schedule s;
  TPF_ASSERT_OK(tpf_schedule_build(&d, &g, &s));
  int gi = 0, si = 0, ri = 0, reduces = 0;
  for (int i = 0; i < s.nsteps; i++) {
    const tpf_step *st = &s.steps[i];
    switch (st->kind) {
    case TPF_STEP_GEMM:
      assert_int_equal(st->a.id, TPF_MAT_X);
      assert_int_equal(st->a.row, (uint64_t)in_chunk[gi] * 4);
      assert_int_equal(st->d.id, TPF_MAT_BUF);
      assert_int_equal(st->d.off_bytes, (uint64_t)gi * 128);
      assert_int_equal(st->k, 72);
      gi++;
      break;
    case TPF_STEP_SEND:
      assert_int_equal(st->peer, send_to[si]);
      assert_int_equal(st->src_off, (uint64_t)si * 128);
      assert_int_equal(st->dst_off, (uint64_t)(si + 4) * 128);
      assert_int_equal(st->tag, (uint32_t)si + 1);
      si++;
      break;
    case TPF_STEP_RECV:
      assert_int_equal(st->peer, recv_from[ri]);
      assert_int_equal(st->dst_off, (uint64_t)recv_slot[ri] * 128);
      ri++;
      break;
    case TPF_STEP_REDUCE:
      /* rs_out = sum of slots 3, 4, 5, 6 */
      assert_int_equal(st->a.off_bytes, 3 * 128);
      assert_int_equal(st->stride_bytes, 128);
      assert_int_equal(st->count, 4);
      assert_int_equal(st->m, 4);
      assert_int_equal(st->n, 8);
      assert_int_equal(st->stream, TPF_STREAM_COMPUTE0);
      assert_int_equal(i, s.nsteps - 1);
      reduces++;
      break;
    default:
      break;
    }
  }
  assert_int_equal(gi, 4);
  assert_int_equal(si, 3);
  assert_int_equal(ri, 3);
  assert_int_equal(reduces, 1);
  assert_int_equal(s.registered_bytes, 7 * (256 / 4) * 8 * 4); /* C = 256 */
  assert_int_equal(s.active_bytes, 7 * 128);
  tpf_schedule_free(&s);
}

static void test_pipeline_and_bulk_shape(void **state) {
  (void)state;
  tpf_layout_desc d = make_desc(&variants[6], 2, 1, 16, 32); /* S = 4, Hs = 8 */
  tpf_gemm_dims g = {16, 32, 72};
  tpf_schedule s;
  TPF_ASSERT_OK(tpf_schedule_build(&d, &g, &s));
  assert_int_equal(s.nsteps, 1 + 3 * 4 + 1);
  for (int i = 0; i < 4; i++) {
    const tpf_step *gm = &s.steps[1 + 3 * i], *b = gm + 1, *pr = gm + 2;
    assert_int_equal(gm->kind, TPF_STEP_GEMM);
    assert_int_equal(gm->w.row, (uint64_t)i * 8);
    assert_int_equal(gm->d.off_bytes, (uint64_t)i * 16 * 8 * 4);
    assert_int_equal(gm->m, 16);
    assert_int_equal(gm->n, 8);
    assert_int_equal(b->kind, TPF_STEP_BARRIER);
    assert_int_equal(b->tag, (uint32_t)i);
    assert_int_equal(pr->kind, TPF_STEP_PEER_REDUCE);
    assert_int_equal(pr->a.row, 8); /* rank 1's rows */
    assert_int_equal(pr->d.col, (uint64_t)i * 8);
    assert_int_equal(pr->count, 2);
  }
  assert_int_equal(s.steps[s.nsteps - 1].kind, TPF_STEP_BARRIER);
  assert_int_equal(s.steps[s.nsteps - 1].tag, 4);
  tpf_schedule_free(&s);

  d = make_desc(&variants[8], 3, 0, 12, 32);
  g.m = 5;
  g.n = 6;
  g.k = 7;
  TPF_ASSERT_OK(tpf_schedule_build(&d, &g, &s));
  assert_int_equal(s.gemm_m, 5);
  assert_int_equal(s.gemm_n, 6);
  assert_int_equal(s.gemm_k, 7);
  assert_int_equal(s.nsteps, 1 + 1 + 2 * 2);
  tpf_schedule_free(&s);

  /* P = 1: no transfers at all. */
  for (size_t vi = 0; vi < TPF_ARRAY_SIZE(variants); vi++) {
    if (variants[vi].aggregate) continue;
    d = make_desc(&variants[vi], 1, 0, 8, 32);
    g = dims_for(&variants[vi], 8, 32);
    TPF_ASSERT_OK(tpf_schedule_build(&d, &g, &s));
    for (int i = 0; i < s.nsteps; i++)
      assert_true(s.steps[i].kind != TPF_STEP_SEND && s.steps[i].kind != TPF_STEP_RECV);
    TPF_ASSERT_OK(tpf_schedule_check(&s, 1));
    tpf_schedule_free(&s);
  }
}

static bool mref_eq(const tpf_mref *a, const tpf_mref *b) {
  return a->id == b->id && a->off_bytes == b->off_bytes && a->ld == b->ld && a->row == b->row &&
         a->col == b->col;
}

static bool step_eq(const tpf_step *a, const tpf_step *b) {
  if (a->kind != b->kind || a->stream != b->stream || a->ndeps != b->ndeps || a->peer != b->peer ||
      a->tag != b->tag || a->chunk != b->chunk || a->src_off != b->src_off ||
      a->dst_off != b->dst_off || a->bytes != b->bytes || a->m != b->m || a->n != b->n ||
      a->k != b->k || a->stride_bytes != b->stride_bytes || a->count != b->count ||
      !mref_eq(&a->a, &b->a) || !mref_eq(&a->w, &b->w) || !mref_eq(&a->d, &b->d))
    return false;
  for (int j = 0; j < a->ndeps; j++)
    if (a->deps[j] != b->deps[j]) return false;
  return true;
}

static void test_determinism(void **state) {
  (void)state;
  int compared = 0;
  for (size_t vi = 0; vi < TPF_ARRAY_SIZE(variants); vi++)
    for (int P = 2; P <= 8; P += 2)
      for (int r = 0; r < P; r++) {
        tpf_layout_desc d = make_desc(&variants[vi], P, r, 8 * (uint64_t)P, 32);
        tpf_gemm_dims g = dims_for(&variants[vi], d.active.rows, 32);
        tpf_schedule a, b;
        TPF_ASSERT_OK(tpf_schedule_build(&d, &g, &a));
        /* Something else in between must not matter. */
        tpf_layout_desc other =
            make_desc(&variants[(vi + 3) % TPF_ARRAY_SIZE(variants)], 2, 0, 64, 32);
        other.aggregate = false;
        tpf_schedule o;
        tpf_gemm_dims og = dims_for(&variants[(vi + 3) % TPF_ARRAY_SIZE(variants)], 64, 32);
        if (tpf_schedule_build(&other, &og, &o) == TPF_OK) tpf_schedule_free(&o);
        TPF_ASSERT_OK(tpf_schedule_build(&d, &g, &b));
        assert_int_equal(a.nsteps, b.nsteps);
        assert_int_equal(a.registered_bytes, b.registered_bytes);
        assert_int_equal(a.active_bytes, b.active_bytes);
        for (int i = 0; i < a.nsteps; i++)
          assert_true(step_eq(&a.steps[i], &b.steps[i]));
        tpf_schedule_free(&a);
        tpf_schedule_free(&b);
        compared++;
      }
  printf("determinism: %d schedule pairs identical\n", compared);
}

static void test_errors(void **state) {
  (void)state;
  tpf_layout_desc d = make_desc(&variants[0], 4, 1, 16, 8);
  tpf_gemm_dims g = {16, 48, 8};
  tpf_schedule s, keep;
  memset(&keep, 0x5a, sizeof keep);
  s = keep;
  TPF_ASSERT_STATUS(tpf_schedule_build(NULL, &g, &s), TPF_EINVAL);
  TPF_ASSERT_STATUS(tpf_schedule_build(&d, NULL, &s), TPF_EINVAL);
  TPF_ASSERT_STATUS(tpf_schedule_build(&d, &g, NULL), TPF_EINVAL);
  /* Layout failures keep their status. */
  d.active.rows = 18;
  TPF_ASSERT_STATUS(tpf_schedule_build(&d, &g, &s), TPF_EDIVISIBLE);
  assert_non_null(strstr(tpf_last_error(), "rows 18 not divisible by tp_size 4"));
  d.active.rows = 16;
  d.aggregate = true;
  d.tp_size = 3;
  d.capacity.rows = 192;
  d.active.rows = 12;
  TPF_ASSERT_STATUS(tpf_schedule_build(&d, &g, &s), TPF_EUNSUPPORTED);
  d = make_desc(&variants[0], 4, 1, 4, 2); /* chunk bytes 1*2*4 = 8: misses 16 */
  g.k = 2;
  TPF_ASSERT_STATUS(tpf_schedule_build(&d, &g, &s), TPF_EALIGN);
  /* GEMM dims. */
  d = make_desc(&variants[0], 4, 1, 16, 8);
  g = (tpf_gemm_dims){16, 0, 8};
  TPF_ASSERT_STATUS(tpf_schedule_build(&d, &g, &s), TPF_EINVAL);
  assert_non_null(strstr(tpf_last_error(), "nonzero"));
  g = (tpf_gemm_dims){16, 48, 9};
  TPF_ASSERT_STATUS(tpf_schedule_build(&d, &g, &s), TPF_EINVAL);
  assert_non_null(strstr(tpf_last_error(), "ag gemm k 9 must equal the hidden size 8"));
  d = make_desc(&variants[3], 4, 1, 16, 8);
  g = (tpf_gemm_dims){16, 7, 72};
  TPF_ASSERT_STATUS(tpf_schedule_build(&d, &g, &s), TPF_EINVAL);
  assert_non_null(strstr(tpf_last_error(), "rs gemm n 7 must equal the hidden size 8"));
  d = make_desc(&variants[8], 4, 1, 16, 8);
  g = (tpf_gemm_dims){0, 7, 72};
  TPF_ASSERT_STATUS(tpf_schedule_build(&d, &g, &s), TPF_EINVAL);
  assert_memory_equal(&s, &keep, sizeof s);
  /* Out of memory. */
  g = (tpf_gemm_dims){16, 7, 72};
  tpf__alloc_set_budget(0);
  tpf_status rc = tpf_schedule_build(&d, &g, &s);
  tpf__alloc_set_budget(-1);
  assert_int_equal(rc, TPF_ENOMEM);
  assert_memory_equal(&s, &keep, sizeof s);
  /* free is NULL-safe and idempotent. */
  tpf_schedule_free(NULL);
  TPF_ASSERT_OK(tpf_schedule_build(&d, &g, &s));
  tpf_schedule_free(&s);
  tpf_schedule_free(&s);
  assert_null(s.steps);
}

static void test_names(void **state) {
  (void)state;
  assert_string_equal(tpf_step_kind_name(TPF_STEP_HANDSHAKE), "HANDSHAKE");
  assert_string_equal(tpf_step_kind_name(TPF_STEP_GEMM), "GEMM");
  assert_string_equal(tpf_step_kind_name(TPF_STEP_SEND), "SEND");
  assert_string_equal(tpf_step_kind_name(TPF_STEP_RECV), "RECV");
  assert_string_equal(tpf_step_kind_name(TPF_STEP_REDUCE), "REDUCE");
  assert_string_equal(tpf_step_kind_name(TPF_STEP_PEER_REDUCE), "PEER_REDUCE");
  assert_string_equal(tpf_step_kind_name(TPF_STEP_BARRIER), "BARRIER");
  assert_string_equal(tpf_step_kind_name(-1), "?");
  assert_string_equal(tpf_step_kind_name(TPF_STEP_KIND_COUNT), "?");
  assert_string_equal(tpf_stream_name(TPF_STREAM_COMPUTE0), "compute0");
  assert_string_equal(tpf_stream_name(TPF_STREAM_COMPUTE2), "compute2");
  assert_string_equal(tpf_stream_name(TPF_STREAM_COMM), "comm");
  assert_int_equal(TPF_STREAM_SEND, TPF_STREAM_COMM); /* the 0.1 name still compiles */
  assert_string_equal(tpf_stream_name(TPF_STREAM_RECV), "recv");
  assert_string_equal(tpf_stream_name(5), "?");
}

/* The mechanism table (core/schedule_mech.c): per algorithm the SENDs' transport class and the
 * GEMMs' SM budget, the reductions' kernel, and the handshake's peers (RING AG: the two
 * neighbours it exchanges with; RING RS (a barrier), PIPELINE and BULK: every peer); at P = 1
 * every SM and no peer. */
static void mech_expect(tpf_algo algo, tpf_coll coll, int P, int r, int send, int sms,
                        uint64_t peers) {
  tpf_layout_desc d = tpf_test_layout_desc(algo, coll, P, r, 16 * (uint64_t)P, 8, 0, false);
  tpf_gemm_dims g = {16 * (uint64_t)P, 8, 8};
  tpf_schedule s;
  TPF_ASSERT_OK(tpf_schedule_build(&d, &g, &s));
  int sends = 0, gemms = 0;
  for (int i = 0; i < s.nsteps; i++) {
    const tpf_step *st = &s.steps[i];
    if (st->kind == TPF_STEP_SEND) {
      assert_int_equal(st->xport, send);
      sends++;
    } else if (st->kind == TPF_STEP_REDUCE || st->kind == TPF_STEP_PEER_REDUCE) {
      assert_int_equal(st->xport, TPF_XPORT_REDUCE_KERNEL);
    } else {
      assert_int_equal(st->xport, TPF_XPORT_NONE);
    }
    if (st->kind == TPF_STEP_GEMM) {
      assert_int_equal(st->sm_budget, sms);
      gemms++;
    } else {
      assert_int_equal(st->sm_budget, TPF_SMS_ALL);
    }
  }
  assert_true(gemms > 0);
  assert_true(P == 1 || algo != TPF_ALGO_RING || sends > 0);
  assert_int_equal(s.handshake_peers, peers);
  tpf_schedule_free(&s);
}

static void test_mechanisms(void **state) {
  (void)state;
  mech_expect(TPF_ALGO_RING, TPF_COLL_AG, 4, 1, TPF_XPORT_COPY_ENGINE, TPF_SMS_ALL, 0x5);
  mech_expect(TPF_ALGO_RING, TPF_COLL_RS, 4, 0, TPF_XPORT_COPY_ENGINE, TPF_SMS_ALL, 0xE);
  mech_expect(TPF_ALGO_PIPELINE, TPF_COLL_RS, 4, 2, TPF_XPORT_COPY_ENGINE, TPF_SMS_LEAVE_COMM, 0xB);
  mech_expect(TPF_ALGO_BULK, TPF_COLL_AG, 4, 3, TPF_XPORT_COPY_KERNEL, TPF_SMS_LEAVE_COMM, 0x7);
  mech_expect(TPF_ALGO_BULK, TPF_COLL_RS, 2, 0, TPF_XPORT_COPY_KERNEL, TPF_SMS_LEAVE_COMM, 0x2);
  mech_expect(TPF_ALGO_PIPELINE, TPF_COLL_RS, 1, 0, TPF_XPORT_NONE, TPF_SMS_ALL, 0);
  mech_expect(TPF_ALGO_BULK, TPF_COLL_AG, 1, 0, TPF_XPORT_NONE, TPF_SMS_ALL, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_all_schedules),   cmocka_unit_test(test_ring_ag_example),
      cmocka_unit_test(test_ring_rs_example), cmocka_unit_test(test_pipeline_and_bulk_shape),
      cmocka_unit_test(test_determinism),     cmocka_unit_test(test_errors),
      cmocka_unit_test(test_names),           cmocka_unit_test(test_mechanisms),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
