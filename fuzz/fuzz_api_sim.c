/* Fuzz target (d): random API sequences on the simulator, checked against a model.
 *
 * Method: the input decodes a world (P = 1..4, a seed, small random step delays) and a program of
 * up to MAX_CMDS commands over six communicator slots and one manager: create / destroy a
 * communicator, add to / create / destroy the manager, set an active shape on one communicator or
 * on the manager (all-or-nothing), look communicators up, run the communicator's operation (or a
 * wrong one), and a deliberate disagreement (rank 0 sets another shape than the others, the
 * operation must fail with TPF_EMISMATCH on every rank and leave the communicator usable). Shapes
 * and configurations are tiny and often invalid.
 *
 * Before the world runs, the model (this file plus shape_model.h, written from SPEC §3) walks the
 * program once and records, for every command, the status each rank must get and the state the
 * communicator must be in afterwards (active shape, capacity, epoch, registered bytes, manager
 * count). Every rank then executes the same program on its own thread (two tpf_sim_run calls, so
 * objects cross runs) and asserts after each command that its status and state equal the model.
 * Successful operations are also checked numerically on exact small integers (AG: the gathered
 * buffer and D; RS: the reduced rows; BULK: the collective and the independent GEMM).
 * At the end everything is destroyed and every allocation the core made has been freed (a
 * counting allocator installed with tpf_set_allocator; LeakSanitizer covers the rest).
 */
#include "tpflex/tpflex.h"
#include "tpflex/tpflex_backend.h"
#include "tpflex/tpflex_sim.h"

#include "fuzz_input.h"
#include "shape_model.h"

#include <stdatomic.h>
#include <string.h>

#define MAX_P 4
#define SLOTS 6
#define MAX_CMDS 24
#define SIM_ALIGN 16 /* the simulator's align_bytes (backend_sim/sim_world.c) */

typedef unsigned long long ull;

/* ---- A counting allocator (public hook), so a leak in the core fails the input ------------- */

static atomic_long live_allocs;

static void *count_malloc(size_t n) {
  void *p = malloc(n);
  if (p) atomic_fetch_add(&live_allocs, 1);
  return p;
}
static void *count_calloc(size_t c, size_t n) {
  void *p = calloc(c, n);
  if (p) atomic_fetch_add(&live_allocs, 1);
  return p;
}
static void *count_realloc(void *p, size_t n) {
  return realloc(p, n);
} /* never called with NULL */
static void count_free(void *p) {
  if (p) atomic_fetch_sub(&live_allocs, 1);
  free(p);
}

/* ---- The program and its model -------------------------------------------------------------- */

typedef enum {
  CMD_CREATE,      /* standalone communicator in slot */
  CMD_DESTROY,     /* standalone communicator in slot */
  CMD_MGR_CREATE,  /* the manager */
  CMD_MGR_ADD,     /* communicator in slot, owned by the manager (the name may be a duplicate) */
  CMD_MGR_SET,     /* manager-wide active shape */
  CMD_MGR_GET,     /* look up slot's name in the manager */
  CMD_MGR_DESTROY, /* the manager and its communicators */
  CMD_SET,         /* active shape of slot */
  CMD_OP,          /* slot's operation */
  CMD_WRONG_OP,    /* an operation of another kind on slot */
  CMD_MISMATCH,    /* rank 0 sets rows_a, the others rows_b; op; everyone sets the old shape */
  CMD_COUNT
} cmd_kind;

/* The model's view of one slot. */
typedef struct {
  bool live, managed;
  tpf_comm_config cfg;
  tpf_shape active;
  uint64_t epoch, reg_bytes;
  int stamp; /* order of creation inside the manager */
} model_comm;

typedef struct {
  cmd_kind kind;
  int slot;
  int name_slot;       /* whose name CMD_CREATE / CMD_MGR_ADD / CMD_MGR_GET use */
  tpf_comm_config cfg; /* CMD_CREATE / CMD_MGR_ADD (name filled in at run time) */
  tpf_shape shape;     /* CMD_SET / CMD_MGR_SET; CMD_MISMATCH: the other ranks' shape */
  uint64_t rows_a;     /* CMD_MISMATCH: rank 0's rows */
  uint64_t gm, gn, gk; /* operation dims (AG: N = gn; RS: K = gk; BULK: M, N, K) */
  bool out_fp32;       /* operation output in fp32 rather than the buffer dtype */
  /* Expectations, recorded by the model. */
  tpf_status want;         /* every rank's status */
  bool check_values;       /* a successful operation: check the numbers */
  model_comm after[SLOTS]; /* every slot afterwards */
  int mgr_count;           /* manager size afterwards; -1 without a manager */
} cmd;

typedef struct {
  int p;
  int ncmds, split; /* commands [0, split) run in the first tpf_sim_run, the rest in a second */
  cmd cmds[MAX_CMDS];
  char names[SLOTS][8];
  /* Per-rank objects. */
  tpf_comm *comm[MAX_P][SLOTS];
  tpf_manager *mgr[MAX_P];
  int from, to; /* the commands of the current run */
} program;

static tpf_layout_desc desc_of(int p, const tpf_comm_config *cfg, tpf_shape active) {
  tpf_layout_desc d;
  memset(&d, 0, sizeof d);
  d.tp_size = p;
  d.algo = cfg->algo;
  d.coll = cfg->coll;
  d.dtype = cfg->dtype;
  d.capacity = cfg->capacity;
  d.active = active;
  d.num_splits = cfg->num_splits;
  d.aggregate = cfg->aggregate;
  return d;
}

static bool eligible(const model_comm *c) {
  return !c->cfg.external; /* fp8 communicators follow the shape too (SPEC §11) */
}

/* The status tpf_comm_set_active_shape must return (SPEC §3, simulator alignment; "not
 * external" is the table's last rule). */
static tpf_status model_set(int p, const model_comm *c, tpf_shape s) {
  tpf_layout_desc d = desc_of(p, &c->cfg, s);
  const tpf_status st = model_check(&d, SIM_ALIGN);
  return st == TPF_OK && !eligible(c) ? TPF_EUNSUPPORTED : st;
}

/* 0: tpf_ag_gemm, 1: tpf_gemm_rs, 2: tpf_bulk_overlap. */
static int op_of(const tpf_comm_config *cfg) {
  if (cfg->algo == TPF_ALGO_BULK) return 2;
  return cfg->coll == TPF_COLL_AG ? 0 : 1;
}

static tpf_comm_config decode_cfg(tpf_fuzz_input *in, int p) {
  static const tpf_algo algos[] = {TPF_ALGO_RING, TPF_ALGO_RING, TPF_ALGO_PIPELINE, TPF_ALGO_BULK,
                                   TPF_ALGO_BULK};
  static const tpf_coll colls[] = {TPF_COLL_AG, TPF_COLL_RS, TPF_COLL_RS, TPF_COLL_AG, TPF_COLL_RS};
  static const tpf_dtype dtypes[] = {TPF_BF16, TPF_BF16, TPF_FP16, TPF_FP32, TPF_FP8_E4M3};
  tpf_comm_config c;
  memset(&c, 0, sizeof c);
  int kind = tpf_fuzz_int(in, 0, 5);
  if (kind == 5) { /* any combination, valid or not */
    c.algo = (tpf_algo)tpf_fuzz_int(in, 0, TPF_ALGO_COUNT - 1);
    c.coll = (tpf_coll)tpf_fuzz_int(in, 0, TPF_COLL_COUNT - 1);
  } else {
    c.algo = algos[kind];
    c.coll = colls[kind];
  }
  c.dtype = dtypes[tpf_fuzz_int(in, 0, 4)];
  uint64_t up = (uint64_t)p;
  c.capacity.rows =
      tpf_fuzz_range(in, 0, 7) == 0 ? tpf_fuzz_range(in, 0, 9) : up * tpf_fuzz_range(in, 1, 4);
  c.capacity.cols =
      tpf_fuzz_range(in, 0, 7) == 0 ? tpf_fuzz_range(in, 0, 12) : 8 * tpf_fuzz_range(in, 1, 4);
  c.num_splits = tpf_fuzz_range(in, 0, 3) == 0 ? tpf_fuzz_int(in, 0, 4) : 0;
  c.aggregate = tpf_fuzz_range(in, 0, 3) == 0;
  c.external = tpf_fuzz_range(in, 0, 7) == 0;
  return c;
}

static tpf_shape decode_shape(tpf_fuzz_input *in, int p, const model_comm *c) {
  uint64_t cap = c->live ? c->cfg.capacity.rows : 8, H = c->live ? c->cfg.capacity.cols : 8;
  uint64_t up = (uint64_t)p, chunks = cap / up ? cap / up : 1;
  tpf_shape s;
  s.rows = tpf_fuzz_range(in, 0, 3) != 0 ? up * tpf_fuzz_range(in, 1, chunks)
                                         : tpf_fuzz_range(in, 0, cap + up);
  s.cols = tpf_fuzz_range(in, 0, 7) != 0 ? H : tpf_fuzz_range(in, 0, H + 8);
  return s;
}

/* Decodes one command and applies it to the model. */
static void model_step(tpf_fuzz_input *in, int p, model_comm *m, bool *mgr, int *stamp, cmd *c) {
  c->kind = (cmd_kind)tpf_fuzz_int(in, 0, CMD_COUNT - 1);
  c->slot = tpf_fuzz_int(in, 0, SLOTS - 1);
  c->name_slot = c->slot;
  model_comm *mc = &m[c->slot];
  c->want = TPF_OK;

  /* Commands that make no sense in the current state turn into ones that do. */
  if ((c->kind == CMD_CREATE || c->kind == CMD_MGR_ADD) && mc->live) c->kind = CMD_SET;
  if (c->kind == CMD_MGR_ADD && !*mgr) c->kind = CMD_MGR_CREATE;
  if (c->kind == CMD_MGR_CREATE && *mgr) c->kind = CMD_MGR_GET;
  if (c->kind == CMD_DESTROY && (!mc->live || mc->managed)) c->kind = CMD_MGR_GET;

  switch (c->kind) {
  case CMD_CREATE:
  case CMD_MGR_ADD: {
    c->cfg = decode_cfg(in, p);
    if (c->kind == CMD_MGR_ADD) { /* sometimes the name of a communicator already managed */
      int other = tpf_fuzz_int(in, 0, SLOTS - 1);
      if (m[other].live && m[other].managed && tpf_fuzz_bool(in)) {
        c->name_slot = other;
        c->want = TPF_EINVAL;
        break;
      }
    }
    tpf_layout_desc d = desc_of(p, &c->cfg, c->cfg.capacity);
    c->want = model_check(&d, SIM_ALIGN);
    if (c->want != TPF_OK) break;
    mc->live = true;
    mc->managed = c->kind == CMD_MGR_ADD;
    mc->cfg = c->cfg;
    mc->active = c->cfg.capacity;
    mc->epoch = 0;
    mc->reg_bytes = (uint64_t)model_sizes_of(&d, d.capacity.rows).total;
    mc->stamp = (*stamp)++;
    break;
  }
  case CMD_DESTROY:
    mc->live = false;
    break;
  case CMD_MGR_CREATE:
    *mgr = true;
    break;
  case CMD_MGR_GET:
    c->want = *mgr && mc->live && mc->managed ? TPF_OK : TPF_EINVAL;
    break;
  case CMD_MGR_DESTROY:
    if (!*mgr) {
      c->want = TPF_EINVAL; /* tpf_manager_destroy(NULL) */
      break;
    }
    for (int i = 0; i < SLOTS; i++)
      if (m[i].managed) m[i].live = m[i].managed = false;
    *mgr = false;
    break;
  case CMD_MGR_SET: {
    c->shape = decode_shape(in, p, mc);
    if (!*mgr) {
      c->want = TPF_EINVAL;
      break;
    }
    /* All-or-nothing: validated in creation order; the first refusal decides, nothing changes. */
    int last = -1;
    for (;;) {
      int best = -1;
      for (int i = 0; i < SLOTS; i++)
        if (m[i].live && m[i].managed && m[i].stamp > last &&
            (best < 0 || m[i].stamp < m[best].stamp))
          best = i;
      if (best < 0) break;
      last = m[best].stamp;
      if (eligible(&m[best]) && (c->want = model_set(p, &m[best], c->shape)) != TPF_OK) break;
    }
    if (c->want == TPF_OK)
      for (int i = 0; i < SLOTS; i++)
        if (m[i].live && m[i].managed && eligible(&m[i])) {
          m[i].active = c->shape;
          m[i].epoch++;
        }
    break;
  }
  case CMD_SET:
    c->shape = decode_shape(in, p, mc);
    if (!mc->live) {
      c->want = TPF_EINVAL; /* tpf_comm_set_active_shape(NULL, ...) */
      break;
    }
    c->want = model_set(p, mc, c->shape);
    if (c->want == TPF_OK) {
      mc->active = c->shape;
      mc->epoch++;
    }
    break;
  case CMD_OP:
  case CMD_WRONG_OP:
  case CMD_MISMATCH:
    c->gm = tpf_fuzz_range(in, 1, 3);
    c->gn = tpf_fuzz_range(in, 1, 3);
    c->gk = tpf_fuzz_range(in, 1, 3);
    c->out_fp32 = tpf_fuzz_bool(in);
    if (!mc->live) {
      c->kind = CMD_OP;
      c->want = TPF_EINVAL; /* NULL communicator */
      break;
    }
    if (c->kind == CMD_WRONG_OP) {
      c->want = TPF_EUNSUPPORTED;
      break;
    }
    if (model_fp8(mc->cfg.dtype) && mc->cfg.coll == TPF_COLL_RS) { /* fp8 partial sums */
      c->kind = CMD_OP;
      c->want = TPF_EUNSUPPORTED;
      break;
    }
    if (c->kind == CMD_MISMATCH) {
      uint64_t up = (uint64_t)p, chunks = mc->cfg.capacity.rows / up;
      c->rows_a = up * tpf_fuzz_range(in, 1, chunks);
      c->shape.rows = up * tpf_fuzz_range(in, 1, chunks);
      c->shape.cols = mc->cfg.capacity.cols;
      tpf_shape sa = {c->rows_a, c->shape.cols};
      if (p > 1 && c->rows_a != c->shape.rows && model_set(p, mc, sa) == TPF_OK &&
          model_set(p, mc, c->shape) == TPF_OK) {
        c->want = TPF_EMISMATCH;
        mc->epoch += 2; /* set, refused operation, set back */
        break;
      }
      c->kind = CMD_OP; /* no disagreement possible: a plain operation */
    }
    c->check_values = true;
    break;
  default:
    break;
  }
  memcpy(c->after, m, sizeof c->after);
  int count = 0;
  for (int i = 0; i < SLOTS; i++)
    count += m[i].live && m[i].managed;
  c->mgr_count = *mgr ? count : -1;
}

/* ---- Operands with exact small-integer values ------------------------------------------------ */

typedef struct {
  tpf_matrix m;
} mat;

static mat mat_new(uint64_t rows, uint64_t cols, tpf_dtype t) {
  mat x;
  x.m.rows = rows;
  x.m.cols = cols;
  x.m.ld = cols;
  x.m.dtype = t;
  x.m.ptr = calloc((size_t)((rows * cols) != 0 ? rows * cols : 1), tpf_dtype_size(t));
  FUZZ_ASSERT(x.m.ptr != NULL);
  return x;
}

static void *elem(const tpf_matrix *m, uint64_t i, uint64_t j) {
  return (char *)m->ptr + (i * m->ld + j) * tpf_dtype_size(m->dtype);
}
static void put(const tpf_matrix *m, uint64_t i, uint64_t j, float v) {
  tpf_float_to_elem(m->dtype, v, elem(m, i, j));
}
static float get(const tpf_matrix *m, uint64_t i, uint64_t j) {
  return tpf_elem_to_float(m->dtype, elem(m, i, j));
}

/* Values: small integers, exact in bf16, fp16 and fp32, and so are all their sums here. */
static float shard_v(int r, uint64_t i, uint64_t c) {
  return (float)((r * 5 + (int)i * 3 + (int)c) % 11) - 5.f;
}
static float x_v(int r, uint64_t t, uint64_t k) {
  return (float)((r + 2 * (int)t + (int)k) % 5) - 2.f;
}
static float w_v(uint64_t h, uint64_t k) {
  return (float)(((int)h + (int)k) % 3) - 1.f;
}
static float part_v(int r, uint64_t t, uint64_t c) {
  return (float)((r + 2 * (int)t + (int)c) % 7) - 3.f;
}

#define EXPECT_VAL(got, want, ...)                                                                 \
  FUZZ_ASSERT_MSG((got) == (want), "got %g, expected %g: " __VA_ARGS__)

/* Runs slot's operation on this rank with operands for its current active shape; checks the
 * numbers when the model says it succeeds. */
static void run_op(const program *pg, int rank, tpf_comm *cm, const cmd *c, bool wrong) {
  if (!cm || c->want == TPF_EUNSUPPORTED) {
    /* NULL communicator, wrong kind or an fp8 RS buffer: refused before any operand is looked
     * at. */
    int op = cm ? op_of(tpf_comm_config_of(cm)) : 0;
    if (wrong) op = (op + 1) % 3;
    tpf_status st = op == 0   ? tpf_ag_gemm(cm, NULL, NULL, NULL)
                    : op == 1 ? tpf_gemm_rs(cm, NULL, NULL, NULL, NULL)
                              : tpf_bulk_overlap(cm, NULL, NULL, NULL, NULL);
    FUZZ_ASSERT_STATUS(st, c->want);
    return;
  }
  const tpf_comm_config *cfg = tpf_comm_config_of(cm);
  tpf_shape act = tpf_comm_active_shape(cm);
  const int P = pg->p;
  const uint64_t T = act.rows, H = act.cols, R = T / (uint64_t)P;
  /* fp8 buffers (AG, BULK AG): fp8 operands (the values here are small integers, exact in
   * e4m3 and e5m2) and a bf16 D unless fp32 (an fp8 GEMM's D is bf16, fp16 or fp32). */
  const tpf_dtype bt = cfg->dtype,
                  ot = c->out_fp32     ? TPF_FP32
                       : model_fp8(bt) ? TPF_BF16
                                       : bt,
                  wt = bt == TPF_FP8_E5M2 ? TPF_FP8_E4M3 : bt; /* no e5m2 x e5m2 */
  tpf_matrix buf, local;
  FUZZ_ASSERT_STATUS(tpf_comm_buffer(cm, &buf), TPF_OK);
  FUZZ_ASSERT_STATUS(tpf_comm_local_chunk(cm, &local), TPF_OK);
  tpf_status st;
  int op = op_of(cfg);

  if (op == 0) { /* RING AG: D[T, N] = AG(X) W^T with W picking column n % H */
    for (uint64_t i = 0; i < local.rows; i++)
      for (uint64_t j = 0; j < H; j++)
        put(&local, i, j, shard_v(rank, i, j));
    mat w = mat_new(c->gn, H, wt), d = mat_new(T, c->gn, ot);
    for (uint64_t n = 0; n < c->gn; n++)
      put(&w.m, n, n % H, 1.f);
    st = tpf_ag_gemm(cm, &w.m, &d.m, NULL);
    FUZZ_ASSERT_STATUS(st, c->want);
    if (st == TPF_OK && c->check_values) {
      for (uint64_t t = 0; t < T; t++) {
        int owner = (int)(t / R);
        for (uint64_t j = 0; j < H; j++)
          EXPECT_VAL(get(&buf, t, j), shard_v(owner, t % R, j), "AG rank %d buffer (%llu, %llu)",
                     (double)get(&buf, t, j), (double)shard_v(owner, t % R, j), rank, (ull)t,
                     (ull)j);
        for (uint64_t n = 0; n < c->gn; n++)
          EXPECT_VAL(get(&d.m, t, n), shard_v(owner, t % R, n % H), "AG rank %d D (%llu, %llu)",
                     (double)get(&d.m, t, n), (double)shard_v(owner, t % R, n % H), rank, (ull)t,
                     (ull)n);
      }
    }
    free(w.m.ptr);
    free(d.m.ptr);
  } else if (op == 1) { /* RS: out[R, H] = rows of this rank of sum_q X_q W^T */
    uint64_t K = c->gk;
    mat x = mat_new(T, K, bt), w = mat_new(H, K, bt), o = mat_new(R, H, ot);
    for (uint64_t t = 0; t < T; t++)
      for (uint64_t k = 0; k < K; k++)
        put(&x.m, t, k, x_v(rank, t, k));
    for (uint64_t h = 0; h < H; h++)
      for (uint64_t k = 0; k < K; k++)
        put(&w.m, h, k, w_v(h, k));
    st = tpf_gemm_rs(cm, &x.m, &w.m, &o.m, NULL);
    FUZZ_ASSERT_STATUS(st, c->want);
    if (st == TPF_OK && c->check_values) {
      for (uint64_t i = 0; i < R; i++)
        for (uint64_t h = 0; h < H; h++) {
          float want = 0;
          for (int q = 0; q < P; q++)
            for (uint64_t k = 0; k < K; k++)
              want += x_v(q, (uint64_t)rank * R + i, k) * w_v(h, k);
          EXPECT_VAL(get(&o.m, i, h), want, "RS rank %d out (%llu, %llu)", (double)get(&o.m, i, h),
                     (double)want, rank, (ull)i, (ull)h);
        }
    }
    free(x.m.ptr);
    free(w.m.ptr);
    free(o.m.ptr);
  } else { /* BULK: the collective on the buffer beside D = A B^T */
    bool ag = cfg->coll == TPF_COLL_AG;
    if (ag) {
      for (uint64_t i = 0; i < local.rows; i++)
        for (uint64_t j = 0; j < H; j++)
          put(&local, i, j, shard_v(rank, i, j));
    } else {
      for (uint64_t t = 0; t < T; t++)
        for (uint64_t j = 0; j < H; j++)
          put(&buf, t, j, part_v(rank, t, j));
    }
    mat a = mat_new(c->gm, c->gk, bt), b = mat_new(c->gn, c->gk, wt), d = mat_new(c->gm, c->gn, ot);
    for (uint64_t i = 0; i < c->gm; i++)
      for (uint64_t k = 0; k < c->gk; k++)
        put(&a.m, i, k, w_v(i, k));
    for (uint64_t j = 0; j < c->gn; j++)
      for (uint64_t k = 0; k < c->gk; k++)
        put(&b.m, j, k, w_v(2 * j + 1, k));
    st = tpf_bulk_overlap(cm, &a.m, &b.m, &d.m, NULL);
    FUZZ_ASSERT_STATUS(st, c->want);
    if (st == TPF_OK && c->check_values) {
      for (uint64_t i = 0; i < c->gm; i++)
        for (uint64_t j = 0; j < c->gn; j++) {
          float want = 0;
          for (uint64_t k = 0; k < c->gk; k++)
            want += w_v(i, k) * w_v(2 * j + 1, k);
          EXPECT_VAL(get(&d.m, i, j), want, "BULK rank %d D (%llu, %llu)", (double)get(&d.m, i, j),
                     (double)want, rank, (ull)i, (ull)j);
        }
      if (ag) {
        for (uint64_t t = 0; t < T; t++)
          for (uint64_t j = 0; j < H; j++)
            EXPECT_VAL(get(&buf, t, j), shard_v((int)(t / R), t % R, j),
                       "BULK AG rank %d buffer (%llu, %llu)", (double)get(&buf, t, j),
                       (double)shard_v((int)(t / R), t % R, j), rank, (ull)t, (ull)j);
      } else {
        for (uint64_t i = 0; i < R; i++)
          for (uint64_t j = 0; j < H; j++) {
            uint64_t t = (uint64_t)rank * R + i;
            float want = 0;
            for (int q = 0; q < P; q++)
              want += part_v(q, t, j);
            EXPECT_VAL(get(&buf, t, j), want, "BULK RS rank %d buffer (%llu, %llu)",
                       (double)get(&buf, t, j), (double)want, rank, (ull)t, (ull)j);
          }
      }
    }
    free(a.m.ptr);
    free(b.m.ptr);
    free(d.m.ptr);
  }
}

/* ---- Execution: every rank runs the program on its own thread ---------------------------------
 */

static void check_state(program *pg, int rank, int ci) {
  const cmd *c = &pg->cmds[ci];
  for (int s = 0; s < SLOTS; s++) {
    const model_comm *mc = &c->after[s];
    tpf_comm *cm = pg->comm[rank][s];
    FUZZ_ASSERT_MSG((cm != NULL) == mc->live, "rank %d command %d: slot %d live %d, model %d", rank,
                    ci, s, cm != NULL, mc->live);
    if (!cm) continue;
    tpf_shape a = tpf_comm_active_shape(cm), cap = tpf_comm_capacity_shape(cm);
    FUZZ_ASSERT_MSG(a.rows == mc->active.rows && a.cols == mc->active.cols,
                    "rank %d command %d: slot %d active [%llu, %llu], model [%llu, %llu]", rank, ci,
                    s, (ull)a.rows, (ull)a.cols, (ull)mc->active.rows, (ull)mc->active.cols);
    FUZZ_ASSERT(cap.rows == mc->cfg.capacity.rows && cap.cols == mc->cfg.capacity.cols);
    FUZZ_ASSERT_MSG(tpf_comm_epoch(cm) == mc->epoch,
                    "rank %d command %d: slot %d epoch %llu, "
                    "model %llu",
                    rank, ci, s, (ull)tpf_comm_epoch(cm), (ull)mc->epoch);
    void *base = NULL;
    uint64_t bytes = 0;
    FUZZ_ASSERT_STATUS(tpf_comm_registration(cm, &base, &bytes), TPF_OK);
    FUZZ_ASSERT(base != NULL && bytes == mc->reg_bytes);
    FUZZ_ASSERT(strcmp(tpf_comm_config_of(cm)->name, pg->names[s]) == 0);
  }
  FUZZ_ASSERT_MSG(c->mgr_count == (pg->mgr[rank] ? tpf_manager_count(pg->mgr[rank]) : -1),
                  "rank %d command %d: manager count %d, model %d", rank, ci,
                  pg->mgr[rank] ? tpf_manager_count(pg->mgr[rank]) : -1, c->mgr_count);
}

static void exec_cmd(program *pg, tpf_backend *be, int rank, int ci) {
  const cmd *c = &pg->cmds[ci];
  tpf_comm **slot = &pg->comm[rank][c->slot];
  tpf_manager **mgr = &pg->mgr[rank];
  tpf_comm_config cfg = c->cfg;
  cfg.name = pg->names[c->name_slot];
  tpf_comm *got = NULL;
  switch (c->kind) {
  case CMD_CREATE:
    FUZZ_ASSERT_STATUS(tpf_comm_create(be, &cfg, &got), c->want);
    if (c->want == TPF_OK) *slot = got;
    break;
  case CMD_MGR_ADD:
    FUZZ_ASSERT_STATUS(tpf_manager_add(*mgr, &cfg, &got), c->want);
    if (c->want == TPF_OK) *slot = got;
    break;
  case CMD_DESTROY:
    FUZZ_ASSERT_STATUS(tpf_comm_destroy(*slot), TPF_OK);
    *slot = NULL;
    break;
  case CMD_MGR_CREATE:
    FUZZ_ASSERT_STATUS(tpf_manager_create(be, mgr), TPF_OK);
    break;
  case CMD_MGR_GET:
    FUZZ_ASSERT_STATUS(tpf_manager_get(*mgr, pg->names[c->slot], &got), c->want);
    FUZZ_ASSERT(c->want != TPF_OK || got == *slot);
    break;
  case CMD_MGR_DESTROY:
    FUZZ_ASSERT_STATUS(tpf_manager_destroy(*mgr), c->want);
    if (c->want == TPF_OK) {
      /* The managed slots are those the model drops now. */
      const model_comm *before = ci > 0 ? pg->cmds[ci - 1].after : NULL;
      for (int s = 0; s < SLOTS; s++)
        if (before && before[s].live && before[s].managed) pg->comm[rank][s] = NULL;
      *mgr = NULL;
    }
    break;
  case CMD_MGR_SET:
    FUZZ_ASSERT_STATUS(tpf_manager_set_active_shape(*mgr, c->shape), c->want);
    break;
  case CMD_SET:
    FUZZ_ASSERT_STATUS(tpf_comm_set_active_shape(*slot, c->shape), c->want);
    break;
  case CMD_OP:
  case CMD_WRONG_OP:
    run_op(pg, rank, *slot, c, c->kind == CMD_WRONG_OP);
    break;
  case CMD_MISMATCH: {
    tpf_shape old = tpf_comm_active_shape(*slot), mine = c->shape;
    if (rank == 0) mine.rows = c->rows_a;
    FUZZ_ASSERT_STATUS(tpf_comm_set_active_shape(*slot, mine), TPF_OK);
    run_op(pg, rank, *slot, c, false);
    FUZZ_ASSERT_STATUS(tpf_comm_set_active_shape(*slot, old), TPF_OK);
    break;
  }
  default:
    break;
  }
  check_state(pg, rank, ci);
}

static tpf_status rank_main(tpf_backend *be, int rank, void *arg) {
  program *pg = arg;
  for (int i = pg->from; i < pg->to; i++)
    exec_cmd(pg, be, rank, i);
  return TPF_OK;
}

/* Destroys what is left, in the same order on every rank. */
static tpf_status rank_cleanup(tpf_backend *be, int rank, void *arg) {
  program *pg = arg;
  (void)be;
  for (int s = 0; s < SLOTS; s++) {
    const model_comm *m = pg->ncmds ? &pg->cmds[pg->ncmds - 1].after[s] : NULL;
    if (pg->comm[rank][s] && m && !m->managed)
      FUZZ_ASSERT_STATUS(tpf_comm_destroy(pg->comm[rank][s]), TPF_OK);
    pg->comm[rank][s] = NULL;
  }
  if (pg->mgr[rank]) FUZZ_ASSERT_STATUS(tpf_manager_destroy(pg->mgr[rank]), TPF_OK);
  pg->mgr[rank] = NULL;
  return TPF_OK;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static bool hooked;
  if (!hooked) { /* once, before any object exists */
    FUZZ_ASSERT_STATUS(tpf_set_allocator(count_malloc, count_calloc, count_realloc, count_free),
                       TPF_OK);
    hooked = true;
  }
  long live_before = atomic_load(&live_allocs);

  tpf_fuzz_input in;
  tpf_fuzz_init(&in, data, size);
  program *pg = calloc(1, sizeof *pg);
  FUZZ_ASSERT(pg != NULL);
  pg->p = tpf_fuzz_int(&in, 1, MAX_P);
  tpf_sim_config wc;
  memset(&wc, 0, sizeof wc);
  wc.tp_size = pg->p;
  wc.seed = tpf_fuzz_bytes(&in, 2);
  wc.max_delay_us = (unsigned)tpf_fuzz_range(&in, 0, 3) == 0 ? 5u : 0u;
  wc.timeout_ms = 5000;
  wc.arena_bytes = 16ull << 20;

  for (int i = 0; i < SLOTS; i++)
    snprintf(pg->names[i], sizeof pg->names[i], "site%d", i);
  model_comm m[SLOTS];
  memset(m, 0, sizeof m);
  bool mgr = false;
  int stamp = 0;
  while (!tpf_fuzz_empty(&in) && pg->ncmds < MAX_CMDS) {
    memset(&pg->cmds[pg->ncmds], 0, sizeof pg->cmds[0]);
    model_step(&in, pg->p, m, &mgr, &stamp, &pg->cmds[pg->ncmds]);
    pg->ncmds++;
  }
  pg->split = pg->ncmds / 2;

  tpf_sim_world *w = NULL;
  FUZZ_ASSERT_STATUS(tpf_sim_world_create(&wc, &w), TPF_OK);
  pg->from = 0;
  pg->to = pg->split;
  FUZZ_ASSERT_STATUS(tpf_sim_run(w, rank_main, pg), TPF_OK);
  pg->from = pg->split;
  pg->to = pg->ncmds;
  FUZZ_ASSERT_STATUS(tpf_sim_run(w, rank_main, pg), TPF_OK);
  FUZZ_ASSERT_STATUS(tpf_sim_run(w, rank_cleanup, pg), TPF_OK);
  FUZZ_ASSERT_STATUS(tpf_sim_world_destroy(w), TPF_OK);
  free(pg);
  long live_after = atomic_load(&live_allocs);
  FUZZ_ASSERT_MSG(live_after == live_before, "%ld core allocations leaked",
                  live_after - live_before);
  return 0;
}
