/* The cost model: the text format of a cost table, GEMM interpolation, and the replay of all
 * ranks' schedules of one operation (see include/tpflex/tpflex_cost.h).
 *
 * Method of the replay: each rank's steps are walked stream by stream with a cursor per
 * (rank, stream). A step can be placed when every earlier step of its stream and every dep has
 * ended and its rank's host thread has enqueued it (steps are enqueued in order, launch_us
 * each); it starts at the latest of those times. A rank's GEMMs, on whichever compute stream,
 * run one at a time (each fills the GPU's multiprocessors), so a GEMM also waits for the rank's
 * previous GEMM; copies and waits run beside them. A RECV also waits for the end of the matching
 * SEND (same sender, receiver and tag) on the sender. A HANDSHAKE, or a BARRIER of one tag, is
 * placed on all ranks at once, when every rank can place it: each rank's span starts at its own
 * ready time and ends at the latest ready time plus the step's cost. Sweeps repeat until every
 * step is placed; a sweep that places nothing means the schedules wait on each other in a
 * cycle, which is reported rather than looped on. Span ends of -1 mark steps not yet placed, so
 * the caller's span array is the whole state and nothing is allocated.
 */
#include "tpflex/tpflex_cost.h"

#include "internal.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef unsigned long long ull;

/* ---- the text format ------------------------------------------------------------------------ */

/* Reads up to `want` numbers after the key; false when a field is missing, not a finite number
 * >= 0, or followed by anything but a comment. */
static bool read_numbers(const char *p, double *v, int want) {
  for (int i = 0; i < want; i++) {
    char *end = NULL;
    errno = 0;
    double x = strtod(p, &end);
    if (end == p || errno != 0 || !isfinite(x) || x < 0) return false;
    v[i] = x;
    p = end;
  }
  while (*p == ' ' || *p == '\t' || *p == '\r')
    p++;
  return *p == '\0' || *p == '#';
}

static bool dtype_of(const char *name, size_t len, tpf_dtype *out) {
  for (int t = 0; t < TPF_DTYPE_COUNT; t++) {
    const char *n = tpf_dtype_name((tpf_dtype)t);
    if (strlen(n) == len && strncmp(n, name, len) == 0) {
      *out = (tpf_dtype)t;
      return true;
    }
  }
  return false;
}

enum {
  K_LAUNCH,
  K_HANDSHAKE,
  K_BARRIER,
  K_PEER,
  K_LOCAL,
  K_REDUCE,
  K_SHARED,
  K_MARGIN,
  K_BASE_MARGIN,
  K_COUNT
};

/* The parser's scratch: the table and, per sched point, its line (for the duplicate message). */
typedef struct {
  tpf_cost_table t;
  bool seen[K_COUNT];
  int sched_line[TPF_COST_MAX_SCHED_POINTS];
} parse_state;

#define COST_STR_(x) #x
#define COST_STR(x) COST_STR_(x)

/* A plain decimal integer in [lo, hi] (digits only, as the CLI's numbers). */
static bool read_uint(const char *tok, size_t len, uint64_t lo, uint64_t hi, uint64_t *out) {
  if (len > 19 || (len > 1 && tok[0] == '0')) return false; /* tokens are never empty */
  uint64_t v = 0;
  for (size_t i = 0; i < len; i++) {
    if (tok[i] < '0' || tok[i] > '9') return false;
    v = v * 10 + (uint64_t)(tok[i] - '0');
  }
  if (v < lo || v > hi) return false;
  *out = v;
  return true;
}

/* Index of the word tok[0, len) in the '|'-separated list words, or -1. */
static int word_of(const char *words, const char *tok, size_t len) {
  int i = 0;
  for (const char *w = words; *w; i++) {
    size_t n = strcspn(w, "|");
    if (n == len && strncmp(w, tok, len) == 0) return i;
    w += n + (w[n] == '|');
  }
  return -1;
}

static bool same_key(const tpf_cost_sched_point *a, const tpf_cost_sched_point *b) {
  return a->shared == b->shared && a->algo == b->algo && a->coll == b->coll &&
         a->tp_size == b->tp_size && a->num_splits == b->num_splits &&
         a->aggregate == b->aggregate && a->dtype == b->dtype && a->hidden == b->hidden &&
         a->n == b->n;
}

/* "sched <device> <algo> <coll> <P> <splits> <aggregate> <dtype> <H> <N> <T> <us>" (after the
 * key: p points past "sched"). */
static tpf_status parse_sched(parse_state *ps, const char *p, const char *line, int lineno) {
  enum { F_DEV, F_ALGO, F_COLL, F_P, F_SPLITS, F_AGG, F_DTYPE, F_H, F_N, F_T, F_US, F_COUNT };
  static const char *const names[F_COUNT] = {"device", "algo", "coll", "P", "splits", "aggregate",
                                             "dtype",  "H",    "N",    "T", "us"};
  static const char *const want[F_COUNT] = {"shared or dedicated",
                                            "ring or pipeline",
                                            "ag or rs",
                                            "an integer in [1, " COST_STR(TPF_MAX_RANKS) "]",
                                            "an integer in [1, " COST_STR(TPF_MAX_SPLITS) "]",
                                            "0 or 1",
                                            "bf16, fp16, fp32, fp8_e4m3 or fp8_e5m2",
                                            "an integer >= 1",
                                            "an integer >= 1",
                                            "an integer >= 1",
                                            "a number > 0"};
  const char *tok[F_COUNT];
  size_t len[F_COUNT];
  int nf = 0;
  for (;;) {
    while (*p == ' ' || *p == '\t') /* the line has no '\r' left at its end */
      p++;
    if (*p == '\0' || *p == '#') break;
    size_t n = strcspn(p, " \t#");
    TPF_RETURN_IF(nf == F_COUNT, TPF_EINVAL,
                  "cost table line %d: sched has more than %d fields (device algo coll P splits "
                  "aggregate dtype H N T us): '%s'",
                  lineno, F_COUNT, line);
    tok[nf] = p;
    len[nf++] = n;
    p += n;
  }
  TPF_RETURN_IF(nf < F_COUNT, TPF_EINVAL,
                "cost table line %d: sched needs %d fields (device algo coll P splits aggregate "
                "dtype H N T us), '%s' is missing: '%s'",
                lineno, F_COUNT, names[nf], line);
  tpf_cost_sched_point sp;
  memset(&sp, 0, sizeof sp);
  uint64_t u = 0;
  int bad = -1, w;
  if ((w = word_of("dedicated|shared", tok[F_DEV], len[F_DEV])) < 0) bad = F_DEV;
  sp.shared = w == 1;
  if (bad < 0 && (w = word_of("ring|pipeline", tok[F_ALGO], len[F_ALGO])) < 0) bad = F_ALGO;
  sp.algo = w == 0 ? TPF_ALGO_RING : TPF_ALGO_PIPELINE;
  if (bad < 0 && (w = word_of("ag|rs", tok[F_COLL], len[F_COLL])) < 0) bad = F_COLL;
  sp.coll = w == 0 ? TPF_COLL_AG : TPF_COLL_RS;
  if (bad < 0 && !read_uint(tok[F_P], len[F_P], 1, TPF_MAX_RANKS, &u)) bad = F_P;
  sp.tp_size = (int)u;
  if (bad < 0 && !read_uint(tok[F_SPLITS], len[F_SPLITS], 1, TPF_MAX_SPLITS, &u)) bad = F_SPLITS;
  sp.num_splits = (int)u;
  if (bad < 0 && !read_uint(tok[F_AGG], len[F_AGG], 0, 1, &u)) bad = F_AGG;
  sp.aggregate = u == 1;
  if (bad < 0 && !dtype_of(tok[F_DTYPE], len[F_DTYPE], &sp.dtype)) bad = F_DTYPE;
  if (bad < 0 && !read_uint(tok[F_H], len[F_H], 1, UINT64_MAX, &sp.hidden)) bad = F_H;
  if (bad < 0 && !read_uint(tok[F_N], len[F_N], 1, UINT64_MAX, &sp.n)) bad = F_N;
  if (bad < 0 && !read_uint(tok[F_T], len[F_T], 1, UINT64_MAX, &sp.rows)) bad = F_T;
  if (bad < 0) {
    char num[32];
    size_t n = len[F_US] < sizeof num - 1 ? len[F_US] : sizeof num - 1;
    memcpy(num, tok[F_US], n);
    num[n] = '\0';
    if (!read_numbers(num, &sp.us, 1) || sp.us <= 0 || n != len[F_US]) bad = F_US;
  }
  TPF_RETURN_IF(bad >= 0, TPF_EINVAL, "cost table line %d: sched field '%s' must be %s, not '%.*s'",
                lineno, names[bad], want[bad], (int)len[bad], tok[bad]);
  TPF_RETURN_IF(sp.aggregate && (sp.algo != TPF_ALGO_RING || sp.coll != TPF_COLL_AG), TPF_EINVAL,
                "cost table line %d: sched field 'aggregate' 1 needs ring ag: '%s'", lineno, line);
  tpf_cost_table *t = &ps->t;
  for (int i = 0; i < t->nsched; i++)
    TPF_RETURN_IF(same_key(&t->sched[i], &sp) && t->sched[i].rows == sp.rows, TPF_EINVAL,
                  "cost table line %d: sched point given twice (first on line %d): '%s'", lineno,
                  ps->sched_line[i], line);
  TPF_RETURN_IF(t->nsched >= TPF_COST_MAX_SCHED_POINTS, TPF_EINVAL,
                "cost table line %d: more than %d sched points", lineno, TPF_COST_MAX_SCHED_POINTS);
  ps->sched_line[t->nsched] = lineno;
  t->sched[t->nsched++] = sp;
  return TPF_OK;
}

static tpf_status parse_line(parse_state *ps, const char *line, int lineno) {
  tpf_cost_table *t = &ps->t;
  bool *seen = ps->seen;
  static const char *const keys[K_COUNT] = {"launch_us",     "handshake_us",  "barrier_us",
                                            "copy peer",     "copy local",    "reduce",
                                            "shared_device", "prefer_margin", "baseline_margin"};
  double v[4];
  for (int k = 0; k < K_COUNT; k++) {
    size_t n = strlen(keys[k]);
    if (strncmp(line, keys[k], n) != 0 || (line[n] != ' ' && line[n] != '\t')) continue;
    TPF_RETURN_IF(seen[k], TPF_EINVAL, "cost table line %d: '%s' given twice", lineno, keys[k]);
    seen[k] = true;
    const bool link = k >= K_PEER && k <= K_REDUCE;
    int want = link ? 2 : 1;
    TPF_RETURN_IF(!read_numbers(line + n, v, want), TPF_EINVAL,
                  "cost table line %d: '%s' needs %d number%s >= 0: '%s'", lineno, keys[k], want,
                  want > 1 ? "s (latency_us, GB/s)" : "", line);
    if (k == K_LAUNCH) t->launch_us = v[0];
    if (k == K_HANDSHAKE) t->handshake_us = v[0];
    if (k == K_BARRIER) t->barrier_us = v[0];
    if (k == K_SHARED) {
      TPF_RETURN_IF(v[0] != 0 && v[0] != 1, TPF_EINVAL,
                    "cost table line %d: 'shared_device' is 0 or 1: '%s'", lineno, line);
      t->shared_device = v[0] != 0;
    }
    if (k == K_MARGIN) {
      TPF_RETURN_IF(!(v[0] < 0.5), TPF_EINVAL,
                    "cost table line %d: 'prefer_margin' is a fraction in [0, 0.5): '%s'", lineno,
                    line);
      t->prefer_margin = v[0];
    }
    if (k == K_BASE_MARGIN) {
      TPF_RETURN_IF(!(v[0] < 0.5), TPF_EINVAL,
                    "cost table line %d: 'baseline_margin' is a fraction in [0, 0.5): '%s'", lineno,
                    line);
      t->baseline_margin = v[0];
    }
    if (link) {
      TPF_RETURN_IF(v[1] <= 0, TPF_EINVAL, "cost table line %d: '%s' bandwidth must be > 0: '%s'",
                    lineno, keys[k], line);
      tpf_cost_link *l = k == K_PEER ? &t->peer : k == K_LOCAL ? &t->local : &t->reduce;
      l->latency_us = v[0];
      l->gbps = v[1];
    }
    return TPF_OK;
  }
  if (strncmp(line, "gemm", 4) == 0 && (line[4] == ' ' || line[4] == '\t')) {
    const char *p = line + 5;
    while (*p == ' ' || *p == '\t')
      p++;
    size_t len = strcspn(p, " \t");
    tpf_dtype dt;
    TPF_RETURN_IF(!dtype_of(p, len, &dt), TPF_EINVAL,
                  "cost table line %d: unknown dtype '%.*s' (bf16, fp16, fp32, fp8_e4m3, "
                  "fp8_e5m2)",
                  lineno, (int)len, p);
    TPF_RETURN_IF(!read_numbers(p + len, v, 4) || v[0] < 1 || v[1] < 1 || v[2] < 1 || v[3] <= 0,
                  TPF_EINVAL,
                  "cost table line %d: gemm needs <dtype> m n k us (m, n, k >= 1, us > 0): '%s'",
                  lineno, line);
    TPF_RETURN_IF(t->ngemm >= TPF_COST_MAX_GEMM_POINTS, TPF_EINVAL,
                  "cost table line %d: more than %d gemm points", lineno, TPF_COST_MAX_GEMM_POINTS);
    tpf_cost_gemm_point *g = &t->gemm[t->ngemm++];
    g->dtype = dt;
    g->m = (uint64_t)v[0];
    g->n = (uint64_t)v[1];
    g->k = (uint64_t)v[2];
    g->us = v[3];
    return TPF_OK;
  }
  if (strncmp(line, "sched", 5) == 0 && (line[5] == ' ' || line[5] == '\t'))
    return parse_sched(ps, line + 5, line, lineno);
  return tpf_set_error(TPF_EINVAL, "cost table line %d: unknown key in '%s'", lineno, line);
}

tpf_status tpf_cost_table_parse(const char *text, tpf_cost_table *out) {
  TPF_RETURN_IF(!text || !out, TPF_EINVAL, "cost table: text or out pointer is NULL");
  /* Parsed into scratch (too large for a stack frame; parsing is not on a per-microbatch path)
   * so that *out is written only on success. */
  parse_state *ps = tpf__calloc(1, sizeof *ps);
  TPF_RETURN_IF(!ps, TPF_ENOMEM, "cost table: out of memory");
  char line[512];
  int lineno = 0;
  tpf_status rc = TPF_OK;
  for (const char *p = text; *p && rc == TPF_OK;) {
    size_t n = strcspn(p, "\n");
    lineno++;
    if (n >= sizeof line) {
      rc = tpf_set_error(TPF_EINVAL, "cost table line %d: longer than %d characters", lineno,
                         (int)sizeof line - 1);
      break;
    }
    memcpy(line, p, n);
    line[n] = '\0';
    p += n + (p[n] == '\n');
    char *s = line;
    while (*s == ' ' || *s == '\t')
      s++;
    size_t e = strlen(s);
    while (e > 0 && (s[e - 1] == ' ' || s[e - 1] == '\t' || s[e - 1] == '\r'))
      s[--e] = '\0';
    if (*s == '\0' || *s == '#') continue;
    rc = parse_line(ps, s, lineno);
  }
  if (rc == TPF_OK) *out = ps->t;
  tpf__free(ps);
  return rc;
}

/* ---- the table's hash and its measured schedules -------------------------------------------- */

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++)
    h = (h ^ b[i]) * 0x100000001b3ull;
  return h;
}

uint64_t tpf__cost_table_hash(const tpf_cost_table *t) {
  if (!t) return 0;
  uint64_t h = 0xcbf29ce484222325ull;
  const double d[] = {t->launch_us,   t->handshake_us,         t->barrier_us, t->peer.latency_us,
                      t->peer.gbps,   t->local.latency_us,     t->local.gbps, t->reduce.latency_us,
                      t->reduce.gbps, (double)t->shared_device};
  h = fnv(h, d, sizeof d);
  for (int i = 0; i < t->ngemm && i < TPF_COST_MAX_GEMM_POINTS; i++) {
    const tpf_cost_gemm_point *g = &t->gemm[i];
    const uint64_t v[] = {(uint64_t)g->dtype, g->m, g->n, g->k};
    h = fnv(fnv(h, v, sizeof v), &g->us, sizeof g->us);
  }
  /* Only when set: a table without it hashes as it did before the key existed. */
  if (t->prefer_margin != 0) h = fnv(h, &t->prefer_margin, sizeof t->prefer_margin);
  if (t->baseline_margin != 0)
    h = fnv(fnv(h, "bm", 2), &t->baseline_margin, sizeof t->baseline_margin);
  /* Field by field (no padding bytes), and only when there are points: a table without sched
   * lines hashes as it did before they existed. */
  for (int i = 0; i < t->nsched && i < TPF_COST_MAX_SCHED_POINTS; i++) {
    const tpf_cost_sched_point *p = &t->sched[i];
    const uint64_t v[] = {(uint64_t)p->shared,
                          (uint64_t)p->algo,
                          (uint64_t)p->coll,
                          (uint64_t)p->tp_size,
                          (uint64_t)p->num_splits,
                          (uint64_t)p->aggregate,
                          (uint64_t)p->dtype,
                          p->hidden,
                          p->n,
                          p->rows};
    h = fnv(fnv(h, v, sizeof v), &p->us, sizeof p->us);
  }
  return h;
}

int tpf__cost_sched_bracket(const tpf_cost_table *t, const tpf_cost_sched_point *key, int *lo,
                            int *hi) {
  *lo = *hi = -1;
  int n = 0;
  for (int i = 0; i < t->nsched && i < TPF_COST_MAX_SCHED_POINTS; i++) {
    const tpf_cost_sched_point *p = &t->sched[i];
    if (!same_key(p, key)) continue;
    n++;
    if (p->rows <= key->rows && (*lo < 0 || p->rows > t->sched[*lo].rows)) *lo = i;
    if (p->rows >= key->rows && (*hi < 0 || p->rows < t->sched[*hi].rows)) *hi = i;
  }
  return n;
}

/* ---- GEMM interpolation --------------------------------------------------------------------- */

static double flops_of(uint64_t m, uint64_t n, uint64_t k) {
  return 2.0 * (double)m * (double)n * (double)k;
}

static bool is_fp8(tpf_dtype t) {
  return t == TPF_FP8_E4M3 || t == TPF_FP8_E5M2;
}

/* The dtypes whose points may price GEMMs of `want`, most preferred first (the header's "Which
 * points price a GEMM"): want itself; for fp8 then the other fp8 dtype, bf16, fp16, fp32. */
static int price_order(tpf_dtype want, tpf_dtype out[5]) {
  out[0] = want;
  if (!is_fp8(want)) return 1;
  out[1] = want == TPF_FP8_E4M3 ? TPF_FP8_E5M2 : TPF_FP8_E4M3;
  out[2] = TPF_BF16;
  out[3] = TPF_FP16;
  out[4] = TPF_FP32;
  return 5;
}

static bool has_points(const tpf_cost_table *t, tpf_dtype dt) {
  for (int i = 0; i < t->ngemm && i < TPF_COST_MAX_GEMM_POINTS; i++)
    if (t->gemm[i].dtype == dt) return true;
  return false;
}

tpf_status tpf_cost_gemm_dtype(const tpf_cost_table *t, tpf_dtype dtype, tpf_dtype *used) {
  TPF_RETURN_IF(!t || !used, TPF_EINVAL, "cost: table or out pointer is NULL");
  TPF_RETURN_IF((unsigned)dtype >= TPF_DTYPE_COUNT, TPF_EINVAL, "cost: dtype %d is not a tpf_dtype",
                (int)dtype);
  tpf_dtype order[5];
  const int n = price_order(dtype, order);
  for (int i = 0; i < n; i++)
    if (has_points(t, order[i])) {
      *used = order[i];
      return TPF_OK;
    }
  if (n == 1)
    return tpf_set_error(TPF_EINVAL, "cost table has no gemm point for %s (%d gemm lines)",
                         tpf_dtype_name(dtype), t->ngemm);
  return tpf_set_error(TPF_EINVAL,
                       "cost table has no gemm point for %s, nor for the dtypes that price it "
                       "without points of its own (%s, %s, %s, %s): %d gemm lines",
                       tpf_dtype_name(dtype), tpf_dtype_name(order[1]), tpf_dtype_name(order[2]),
                       tpf_dtype_name(order[3]), tpf_dtype_name(order[4]), t->ngemm);
}

tpf_status tpf_cost_gemm_us(const tpf_cost_table *t, tpf_dtype dtype, uint64_t m, uint64_t n,
                            uint64_t k, double *us) {
  TPF_RETURN_IF(!t || !us, TPF_EINVAL, "cost: table or out pointer is NULL");
  tpf_dtype pts;
  TPF_CHECK(tpf_cost_gemm_dtype(t, dtype, &pts));
  double f = flops_of(m, n, k);
  if (f == 0) {
    *us = 0;
    return TPF_OK;
  }
  /* The neighbours below and above f in flops (the rate of each point is flops/us). */
  int lo = -1, hi = -1;
  for (int i = 0; i < t->ngemm && i < TPF_COST_MAX_GEMM_POINTS; i++) {
    const tpf_cost_gemm_point *g = &t->gemm[i];
    if (g->dtype != pts) continue;
    double gf = flops_of(g->m, g->n, g->k);
    if (gf <= f && (lo < 0 || gf > flops_of(t->gemm[lo].m, t->gemm[lo].n, t->gemm[lo].k))) lo = i;
    if (gf >= f && (hi < 0 || gf < flops_of(t->gemm[hi].m, t->gemm[hi].n, t->gemm[hi].k))) hi = i;
  }
  if (lo < 0) lo = hi; /* tpf_cost_gemm_dtype found a point of pts: one of them is set */
  if (hi < 0) hi = lo;
  const tpf_cost_gemm_point *a = &t->gemm[lo], *b = &t->gemm[hi];
  double fa = flops_of(a->m, a->n, a->k), fb = flops_of(b->m, b->n, b->k);
  double ra = fa / a->us, rb = fb / b->us, rate = ra;
  if (fb > fa) {
    double w = (log(f) - log(fa)) / (log(fb) - log(fa));
    rate = ra + w * (rb - ra);
  }
  *us = f / rate;
  return TPF_OK;
}

/* ---- the replay ----------------------------------------------------------------------------- */

double tpf__cost_link_us(const tpf_cost_link *l, double bytes) {
  return l->latency_us + bytes / (l->gbps * 1e3);
}

/* A link the parser never saw keeps bandwidth 0 (the parser refuses 0 on a line it reads):
 * pricing bytes over it gave inf and nan predictions that looked like results. */
tpf_status tpf__cost_link_check(const tpf_cost_table *t, tpf_step_kind kind) {
  const char *key = kind == TPF_STEP_SEND     ? "copy peer"
                    : kind == TPF_STEP_REDUCE ? "reduce"
                                              : "copy local";
  const char *what = kind == TPF_STEP_SEND     ? "a SEND to another rank"
                     : kind == TPF_STEP_REDUCE ? "a REDUCE or PEER_REDUCE step"
                                               : "a SEND to the rank itself";
  const tpf_cost_link *l = kind == TPF_STEP_SEND     ? &t->peer
                           : kind == TPF_STEP_REDUCE ? &t->reduce
                                                     : &t->local;
  TPF_RETURN_IF(!(l->gbps > 0) || !isfinite(l->gbps) || !(l->latency_us >= 0) ||
                    !isfinite(l->latency_us),
                TPF_EINVAL,
                "cost table has no '%s' line, and %s is priced as "
                "latency + bytes / bandwidth: add '%s <latency_us> <GB/s>' (tpflex calibrate "
                "measures it on the GPU; data/cost/h200.txt has the H200's)",
                key, what, key);
  return TPF_OK;
}

/* A step's cost. Bytes (SEND, REDUCE) are the buffer's: the schedule's dtype. A GEMM is priced
 * as a GEMM of its A operand's dtype: x_dtype when A is the operation's x, else the buffer's. */
static tpf_status step_cost(const tpf_cost_table *t, const tpf_schedule *s, tpf_dtype x_dtype,
                            const tpf_step *st, double *us) {
  double e = (double)tpf_dtype_size(s->dtype), c = 0;
  if (x_dtype == TPF_DTYPE_COUNT) x_dtype = s->dtype;
  switch (st->kind) {
  case TPF_STEP_HANDSHAKE:
    c += t->handshake_us;
    break;
  case TPF_STEP_BARRIER:
    c += t->barrier_us;
    break;
  case TPF_STEP_RECV:
    break;
  case TPF_STEP_SEND:
    TPF_CHECK(tpf__cost_link_check(t, st->peer == s->rank ? TPF_STEP_KIND_COUNT : TPF_STEP_SEND));
    c += tpf__cost_link_us(st->peer == s->rank ? &t->local : &t->peer, (double)st->bytes);
    break;
  case TPF_STEP_REDUCE:
  case TPF_STEP_PEER_REDUCE:
    TPF_CHECK(tpf__cost_link_check(t, TPF_STEP_REDUCE));
    c += tpf__cost_link_us(&t->reduce, (double)st->count * (double)st->m * (double)st->n * e);
    break;
  case TPF_STEP_GEMM: {
    double g = 0;
    TPF_CHECK(
        tpf_cost_gemm_us(t, st->a.id == TPF_MAT_X ? x_dtype : s->dtype, st->m, st->n, st->k, &g));
    c += g;
    break;
  }
  default:
    return tpf_set_error(TPF_EINVAL, "cost: step kind %d unknown", (int)st->kind);
  }
  *us = c;
  return TPF_OK;
}

typedef struct {
  const tpf_schedule *s;
  tpf_dtype x_dtype; /* the operation's x: the dtype of GEMMs whose A is x */
  int p, max;
  double launch_us;
  bool shared;                     /* shared_device: one GEMM queue for every rank */
  double gemm_free[TPF_MAX_RANKS]; /* a rank's GEMMs share its GPU's SMs: one at a time */
  tpf_cost_span *sp;
  int cur[TPF_MAX_RANKS][TPF_NUM_STREAMS]; /* next unplaced step index per stream */
} replay;

static tpf_cost_span *span(replay *r, int rank, int i) {
  return &r->sp[rank * r->max + i];
}
static bool placed(replay *r, int rank, int i) {
  return span(r, rank, i)->end_us >= 0;
}

/* The next unplaced step of (rank, stream), or -1. */
static int next_on(replay *r, int rank, int stream) {
  const tpf_schedule *s = &r->s[rank];
  int i = r->cur[rank][stream];
  while (i < s->nsteps && (s->steps[i].stream != stream || placed(r, rank, i)))
    i++;
  r->cur[rank][stream] = i;
  return i < s->nsteps ? i : -1;
}

/* When step i of rank can start as far as its own rank is concerned; false if not yet. */
static bool ready_at(replay *r, int rank, int i, double *t) {
  const tpf_schedule *s = &r->s[rank];
  const tpf_step *st = &s->steps[i];
  if (next_on(r, rank, st->stream) != i) return false;
  /* One host thread enqueues a rank's steps in order, launch_us each: step i is on its stream
   * no earlier than (i + 1) * launch_us. */
  double at = (double)(i + 1) * r->launch_us;
  for (int j = i - 1; j >= 0; j--) /* the previous step of the same stream */
    if (s->steps[j].stream == st->stream) {
      if (span(r, rank, j)->end_us > at) at = span(r, rank, j)->end_us;
      break;
    }
  for (int d = 0; d < st->ndeps; d++) {
    if (!placed(r, rank, st->deps[d])) return false;
    double e = span(r, rank, st->deps[d])->end_us;
    if (e > at) at = e;
  }
  *t = at;
  return true;
}

/* The step of `rank` matching a collective step (HANDSHAKE, or BARRIER of the same tag). */
static int collective_match(const replay *r, int rank, const tpf_step *st) {
  const tpf_schedule *s = &r->s[rank];
  for (int i = 0; i < s->nsteps; i++)
    if (s->steps[i].kind == st->kind &&
        (st->kind != TPF_STEP_BARRIER || s->steps[i].tag == st->tag))
      return i;
  return -1;
}

static int send_match(const replay *r, int sender, int receiver, uint32_t tag) {
  const tpf_schedule *s = &r->s[sender];
  for (int i = 0; i < s->nsteps; i++)
    if (s->steps[i].kind == TPF_STEP_SEND && s->steps[i].peer == receiver && s->steps[i].tag == tag)
      return i;
  return -1;
}

/* Tries to place step i of rank (and, for a collective step, its matches on every rank). */
static tpf_status try_place(const tpf_cost_table *t, replay *r, int rank, int i, bool *did) {
  const tpf_step *st = &r->s[rank].steps[i];
  double at = 0, cost = 0;
  if (!ready_at(r, rank, i, &at)) return TPF_OK;
  TPF_CHECK(step_cost(t, &r->s[rank], r->x_dtype, st, &cost));
  if (st->kind == TPF_STEP_HANDSHAKE || st->kind == TPF_STEP_BARRIER) {
    int idx[TPF_MAX_RANKS];
    double ready[TPF_MAX_RANKS], last = 0;
    for (int q = 0; q < r->p; q++) {
      idx[q] = collective_match(r, q, st);
      TPF_RETURN_IF(idx[q] < 0, TPF_EINVAL,
                    "cost: rank %d step %d (%s tag %u) has no match on rank %d", rank, i,
                    tpf_step_kind_name(st->kind), st->tag, q);
      if (!ready_at(r, q, idx[q], &ready[q])) return TPF_OK;
      if (ready[q] > last) last = ready[q];
    }
    for (int q = 0; q < r->p; q++) {
      span(r, q, idx[q])->start_us = ready[q];
      span(r, q, idx[q])->end_us = last + cost;
    }
  } else {
    double start = at;
    if (st->kind == TPF_STEP_RECV) {
      TPF_RETURN_IF(st->peer < 0 || st->peer >= r->p, TPF_EINVAL, "cost: rank %d step %d: peer %d",
                    rank, i, (int)st->peer);
      int j = send_match(r, st->peer, rank, st->tag);
      TPF_RETURN_IF(j < 0, TPF_EINVAL, "cost: rank %d step %d RECV from %d tag %u has no SEND",
                    rank, i, (int)st->peer, st->tag);
      if (!placed(r, st->peer, j)) return TPF_OK;
      double e = span(r, st->peer, j)->end_us;
      if (e > at) at = e;
    }
    if (st->kind == TPF_STEP_GEMM) {
      /* Starts when the previous GEMM on its device has finished: the rank's own, or with
       * shared_device every rank's (they all share one GPU's SMs). */
      const int q = r->shared ? 0 : rank;
      if (r->gemm_free[q] > at) at = r->gemm_free[q];
      r->gemm_free[q] = at + cost;
      start = at;
    }
    span(r, rank, i)->start_us = start;
    span(r, rank, i)->end_us = at + cost;
  }
  *did = true;
  return TPF_OK;
}

/* The replay; x_dtype TPF_DTYPE_COUNT: each schedule's own dtype (tpf_cost_predict). */
static tpf_status predict(const tpf_cost_table *t, const tpf_schedule *scheds, int tp_size,
                          tpf_dtype x_dtype, tpf_cost_span *spans, int max_steps,
                          double *total_us) {
  TPF_RETURN_IF(!t || !scheds || !spans || !total_us, TPF_EINVAL,
                "cost: table, schedules, spans or total pointer is NULL");
  TPF_RETURN_IF(tp_size < 1 || tp_size > TPF_MAX_RANKS, TPF_EINVAL,
                "cost: tp_size %d outside [1, %d]", tp_size, TPF_MAX_RANKS);
  for (int q = 0; q < tp_size; q++) {
    TPF_RETURN_IF(scheds[q].nsteps < 0 || scheds[q].nsteps > max_steps, TPF_EINVAL,
                  "cost: rank %d has %d steps, more than max_steps %d", q, scheds[q].nsteps,
                  max_steps);
    for (int i = 0; i < scheds[q].nsteps; i++) {
      const tpf_step *st = &scheds[q].steps[i];
      TPF_RETURN_IF(st->stream >= TPF_NUM_STREAMS || st->ndeps > TPF_STEP_MAX_DEPS, TPF_EINVAL,
                    "cost: rank %d step %d: stream %d, %d deps", q, i, (int)st->stream,
                    (int)st->ndeps);
      for (int d = 0; d < st->ndeps; d++)
        TPF_RETURN_IF(st->deps[d] >= i, TPF_EINVAL, "cost: rank %d step %d depends on step %d", q,
                      i, (int)st->deps[d]);
      spans[q * max_steps + i].start_us = -1;
      spans[q * max_steps + i].end_us = -1;
    }
  }
  replay r;
  memset(&r, 0, sizeof r);
  r.s = scheds;
  r.x_dtype = x_dtype;
  r.p = tp_size;
  r.max = max_steps;
  r.sp = spans;
  r.launch_us = t->launch_us;
  r.shared = t->shared_device != 0;
  for (;;) {
    bool did = false;
    for (int q = 0; q < tp_size; q++)
      for (int k = 0; k < TPF_NUM_STREAMS; k++) {
        int i;
        while ((i = next_on(&r, q, k)) >= 0) {
          bool one = false;
          TPF_CHECK(try_place(t, &r, q, i, &one));
          if (!one) break;
          did = true;
        }
      }
    if (!did) break;
  }
  double end = 0;
  for (int q = 0; q < tp_size; q++)
    for (int i = 0; i < scheds[q].nsteps; i++) {
      const tpf_cost_span *s = &spans[q * max_steps + i];
      if (s->end_us < 0)
        return tpf_set_error(TPF_EINVAL,
                             "cost: rank %d step %d (%s) can never start: the schedules wait on "
                             "each other",
                             q, i, tpf_step_kind_name(scheds[q].steps[i].kind));
      if (s->end_us > end) end = s->end_us;
    }
  *total_us = end;
  return TPF_OK;
}

tpf_status tpf_cost_predict(const tpf_cost_table *t, const tpf_schedule *scheds, int tp_size,
                            tpf_cost_span *spans, int max_steps, double *total_us) {
  return predict(t, scheds, tp_size, TPF_DTYPE_COUNT, spans, max_steps, total_us);
}

tpf_status tpf_cost_predict_x(const tpf_cost_table *t, const tpf_schedule *scheds, int tp_size,
                              tpf_dtype x_dtype, tpf_cost_span *spans, int max_steps,
                              double *total_us) {
  TPF_RETURN_IF((unsigned)x_dtype >= TPF_DTYPE_COUNT, TPF_EINVAL,
                "cost: x dtype %d is not a tpf_dtype", (int)x_dtype);
  return predict(t, scheds, tp_size, x_dtype, spans, max_steps, total_us);
}
