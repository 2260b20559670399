/* `tpflex bench`'s rank groups: P ranks of one backend (a simulator world, or the in-process CUDA
 * ranks of bench_cuda_dev.c), the random input source every operand view reads, device-neutral
 * memory (host memory on the simulator, device memory on CUDA) and the timing of one repetition
 * across all ranks. Calls bench_cuda_dev.c and bench_util.c.
 *
 * Method: src[i] = pool[i % pool_elems] for a pool of random bf16 values uniform in [-1, 1)
 * (never zero-filled), so any element of any operand view into src is known on the host without
 * copying it back. Simulator timing: the host clock around each repetition, all ranks released
 * by a barrier; a repetition spans the earliest rank's start to the latest rank's end.
 *
 * Host-wall timing (either backend, either mode): the L2 flush finished, an agreement of every
 * rank (a barrier that also spreads failures), then CLOCK_MONOTONIC, which is system-wide, so
 * the clocks of ranks in different processes compare; the repetition is max t1 - min t0 over all
 * ranks. In procs mode each process reduces its own rank threads, then the first rank thread of
 * every process exchanges the reductions through the bootstrap's allgather. */
#define _POSIX_C_SOURCE 200809L
#include "bench.h"

#include "reference.h" /* tpf_ref_float_to_bf16, tpf_ref_bf16_to_float, tpf_ref_float_to_fp8 */
#include "tpflex/tpflex_sim.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the random source -------------------------------------------------------------------- */

static uint16_t to_bf16(float f) {
  return tpf_ref_float_to_bf16(f);
}

static tpf_status pool_init(bench_group *g) {
  g->pool_elems = g->cuda ? (32ull << 20) : (1ull << 20);
  g->pool = malloc(g->pool_elems * sizeof(uint16_t));
  if (!g->pool) return tpf_set_error(TPF_ENOMEM, "bench: no memory for the input pool");
  uint64_t s = 0x9E3779B97F4A7C15ull;
  for (uint64_t i = 0; i < g->pool_elems; i++) {
    /* splitmix64 -> uniform [-1, 1) -> bf16; never zero-filled. */
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    float u = (float)(z >> 40) * (1.0f / 16777216.0f);
    g->pool[i] = to_bf16(2.0f * u - 1.0f);
  }
  return TPF_OK;
}

float bench_src_value(const bench_group *g, uint64_t i) {
  return tpf_ref_bf16_to_float(g->pool[i % g->pool_elems]);
}

/* *dst (holding *have elements of esz bytes) made to hold `elems` elements tiled from `pool`
 * (g->pool_elems elements). */
static tpf_status src_fill(bench_group *g, const void *pool, size_t esz, uint64_t elems, void **dst,
                           uint64_t *have) {
  if (elems <= *have) return TPF_OK;
  if (*dst) bench_mem_free(g, *dst);
  *dst = NULL;
  *have = 0;
  void *p = bench_mem_alloc(g, elems * esz);
  if (!p)
    return tpf_set_error(TPF_ENOMEM, "bench: cannot allocate %llu bytes of inputs",
                         (unsigned long long)(elems * esz));
  if (g->cuda) { /* one upload of the pool, then doubling device copies */
    tpf_status st = bench_cuda_tile(p, pool, g->pool_elems * esz, elems * esz);
    if (st != TPF_OK) {
      bench_mem_free(g, p);
      return st;
    }
  } else {
    for (uint64_t off = 0; off < elems; off += g->pool_elems) {
      uint64_t n = elems - off < g->pool_elems ? elems - off : g->pool_elems;
      memcpy((uint8_t *)p + off * esz, pool, n * esz);
    }
  }
  *dst = p;
  *have = elems;
  return TPF_OK;
}

tpf_status bench_src_reserve(bench_group *g, uint64_t elems) {
  return src_fill(g, g->pool, 2, elems, &g->src, &g->src_elems);
}

tpf_status bench_src8_reserve(bench_group *g, uint64_t elems) {
  if (!g->pool8) {
    g->pool8 = malloc(g->pool_elems);
    if (!g->pool8) return tpf_set_error(TPF_ENOMEM, "bench: no memory for the FP8 input pool");
    for (uint64_t i = 0; i < g->pool_elems; i++)
      g->pool8[i] = tpf_ref_float_to_fp8(TPF_FP8_E4M3, tpf_ref_bf16_to_float(g->pool[i]));
  }
  return src_fill(g, g->pool8, 1, elems, &g->src8, &g->src8_elems);
}

/* ---- groups ------------------------------------------------------------------------------- */

#ifdef TPF_HAVE_SIM
typedef struct {
  bench_group *g;
  bench_rank_fn fn;
  void *arg;
} sim_tramp;

static tpf_status sim_rank(tpf_backend *be, int rank, void *arg) {
  sim_tramp *t = arg;
  bench_rank rk = {.rank = rank, .tp = t->g->tp, .stream = NULL, .g = t->g, .be = be};
  return t->fn(&rk, t->arg);
}
#endif

static tpf_status group_create(const bench_opts *o, int tp, const tpf_bootstrap *xboot,
                               bench_group **out) {
  bench_group *g = calloc(1, sizeof(*g));
  if (!g) return tpf_set_error(TPF_ENOMEM, "bench: no memory");
  g->o = o;
  g->cuda = o->cuda;
  g->tp = tp;
  g->xboot = xboot;
  atomic_init(&g->xfail, 0);
  /* A process-mode rank (CUDA, or the simulator with ranks as processes) is one thread here. */
  g->nlocal = xboot ? 1 : tp;
  g->rank0 = xboot ? xboot->rank : 0;
  if (tp > 0) /* tp == 0: inputs and GEMMs only, no ranks (CUDA baselines) */
    pthread_barrier_init(&g->bar, NULL, (unsigned)g->nlocal);
  const size_t slots = (size_t)(tp + 1) * BENCH_MAX_ITERS;
  g->t0 = calloc(slots, sizeof(double));
  g->t1 = calloc(slots, sizeof(double));
  g->h0 = calloc(slots, sizeof(double));
  g->h1 = calloc(slots, sizeof(double));
  g->enq = calloc(slots, sizeof(double));
  tpf_status st = (g->t0 && g->t1 && g->h0 && g->h1 && g->enq)
                      ? pool_init(g)
                      : tpf_set_error(TPF_ENOMEM, "bench: no memory for timing");
  if (st == TPF_OK) {
    if (g->cuda) {
      st = bench_cuda_group_init(g);
    } else {
#ifdef TPF_HAVE_SIM
      tpf_sim_config cfg;
      memset(&cfg, 0, sizeof(cfg));
      cfg.tp_size = tp;
      cfg.seed = 1;
      cfg.timeout_ms = 60000;
      cfg.arena_bytes = o->arena_bytes;
      tpf_sim_world *w = NULL;
      if (xboot) { /* this process's rank of a simulator group over the bootstrap */
        tpf_backend *be = NULL;
        st = tpf_sim_backend_create(&cfg, xboot, &be);
        if (st == TPF_OK) {
          g->sim_be = be;
          st = tpf_sim_backend_world(be, &w);
        }
      } else {
        st = tpf_sim_world_create(&cfg, &w);
      }
      g->sim_world = w;
#else
      st = tpf_set_error(TPF_EUNSUPPORTED, "bench: no simulator in this build");
#endif
    }
  }
  if (st != TPF_OK) {
    bench_group_destroy(g);
    return st;
  }
  *out = g;
  return TPF_OK;
}

tpf_status bench_group_create(const bench_opts *o, int tp, bench_group **out) {
  return group_create(o, tp, NULL, out);
}

tpf_status bench_group_create_procs(const bench_opts *o, int tp, const tpf_bootstrap *xboot,
                                    bench_group **out) {
  if (!xboot || tp < 1)
    return tpf_set_error(TPF_EINVAL, "bench: a process-mode group needs a bootstrap and ranks");
  return group_create(o, tp, xboot, out);
}

tpf_status bench_group_run(bench_group *g, bench_rank_fn fn, void *arg) {
  if (g->cuda) return bench_cuda_group_run(g, fn, arg);
#ifdef TPF_HAVE_SIM
  sim_tramp t = {g, fn, arg};
  if (g->sim_be) return sim_rank(g->sim_be, g->rank0, &t); /* its one rank, on this thread */
  return tpf_sim_run((tpf_sim_world *)g->sim_world, sim_rank, &t);
#else
  return TPF_EUNSUPPORTED;
#endif
}

void bench_group_destroy(bench_group *g) {
  if (!g) return;
  if (g->src) bench_mem_free(g, g->src);
  if (g->src8) bench_mem_free(g, g->src8);
  if (g->cuda) bench_cuda_group_fini(g);
#ifdef TPF_HAVE_SIM
  else if (g->sim_be)
    tpf_sim_backend_destroy(g->sim_be);
  else if (g->sim_world)
    tpf_sim_world_destroy((tpf_sim_world *)g->sim_world);
#endif
  if (g->tp > 0) pthread_barrier_destroy(&g->bar);
  free(g->pool);
  free(g->pool8);
  free(g->t0);
  free(g->t1);
  free(g->h0);
  free(g->h1);
  free(g->enq);
  free(g);
}

long long bench_group_registrations(bench_group *g) {
#ifdef TPF_HAVE_SIM
  if (!g->cuda && g->sim_world) {
    tpf_sim_stats s;
    if (tpf_sim_get_stats((tpf_sim_world *)g->sim_world, &s) == TPF_OK)
      return (long long)s.registrations;
  }
#else
  (void)g;
#endif
  return -1;
}

void *bench_mem_alloc(bench_group *g, uint64_t bytes) {
  return g->cuda ? bench_cuda_alloc(bytes) : malloc(bytes ? bytes : 1);
}
void bench_mem_free(bench_group *g, void *p) {
  if (g->cuda)
    bench_cuda_free(p);
  else
    free(p);
}
tpf_status bench_mem_copy(bench_rank *rk, void *dst, const void *src, uint64_t bytes) {
  if (rk->g->cuda) return bench_cuda_copy(rk, dst, src, bytes);
  memcpy(dst, src, bytes);
  return TPF_OK;
}
tpf_status bench_mem_download(bench_rank *rk, void *host, const void *dev, uint64_t bytes) {
  if (rk->g->cuda) return bench_cuda_download(rk, host, dev, bytes);
  memcpy(host, dev, bytes);
  return TPF_OK;
}
tpf_status bench_mem_poison(bench_rank *rk, void *dev, uint64_t bytes) {
  if (rk->g->cuda) return bench_cuda_poison(rk, dev, bytes);
  memset(dev, 0xFF, bytes);
  return TPF_OK;
}
tpf_status bench_sync(bench_rank *rk) {
  return rk->g->cuda ? bench_cuda_sync(rk) : TPF_OK;
}

tpf_status bench_time_begin(bench_rank *rk, int it) {
  if (rk->g->cuda) return bench_cuda_time_begin(rk, it);
  bench_barrier(rk);
  rk->g->t0[rk->rank * BENCH_MAX_ITERS + it] = bench_now_ns();
  return TPF_OK;
}
tpf_status bench_time_end(bench_rank *rk, int it) {
  if (rk->g->cuda) return bench_cuda_time_end(rk, it);
  rk->g->t1[rk->rank * BENCH_MAX_ITERS + it] = bench_now_ns();
  return TPF_OK;
}
tpf_status bench_time_collect(bench_rank *rk, int n, double *us) {
  if (rk->g->cuda) return bench_cuda_time_collect(rk, n, us);
  bench_barrier(rk);
  if (rk->rank == 0) {
    for (int it = 0; it < n; it++) {
      double a = INFINITY, b = -INFINITY;
      for (int r = 0; r < rk->tp; r++) {
        double x = rk->g->t0[r * BENCH_MAX_ITERS + it], y = rk->g->t1[r * BENCH_MAX_ITERS + it];
        a = x < a ? x : a;
        b = y > b ? y : b;
      }
      us[it] = (b - a) * 1e-3;
    }
  }
  bench_barrier(rk);
  return TPF_OK;
}

/* ---- agreements and host-wall timing (either backend, either mode) ------------------------- */

static bool first_here(const bench_rank *rk) {
  return rk->rank == rk->g->rank0;
}

tpf_status bench_xallgather(bench_group *g, const void *mine, void *all, size_t bytes) {
  if (!g->xboot) {
    memcpy(all, mine, bytes);
    return TPF_OK;
  }
  if (atomic_load(&g->xfail)) return tpf_set_error(TPF_ETIMEOUT, "%s", g->xerr);
  tpf_status st = g->xboot->allgather(g->xboot->ctx, mine, all, bytes);
  if (st != TPF_OK) {
    snprintf(g->xerr, sizeof g->xerr, "bootstrap allgather: %s", tpf_last_error());
    atomic_store(&g->xfail, 1);
  }
  return st;
}

bool bench_agree_failed(bench_rank *rk, atomic_int *flag) {
  bench_group *g = rk->g;
  pthread_barrier_wait(&g->bar);
  if (g->xboot) {
    if (first_here(rk)) {
      int mine = atomic_load(flag) != 0, all[TPF_MAX_RANKS];
      int any = mine;
      if (bench_xallgather(g, &mine, all, sizeof mine) != TPF_OK) {
        any = 1;
      } else {
        for (int q = 0; q < g->xboot->tp_size; q++)
          any |= all[q];
      }
      if (any) atomic_store(flag, 1);
    }
    pthread_barrier_wait(&g->bar);
  }
  return atomic_load(flag) != 0;
}

bool bench_host_begin(bench_rank *rk, int it, atomic_int *failed) {
  /* The flush must be over before t0: it is not part of the repetition. */
  if (rk->g->cuda && rk->rank == 0 && bench_cuda_flush(rk, it) != TPF_OK) atomic_store(failed, 1);
  bool f = bench_agree_failed(rk, failed);
  rk->g->h0[rk->rank * BENCH_MAX_ITERS + it] = bench_now_ns();
  return f;
}

void bench_host_end(bench_rank *rk, int it) {
  bench_sync(rk);
  rk->g->h1[rk->rank * BENCH_MAX_ITERS + it] = bench_now_ns();
}

tpf_status bench_host_collect(bench_rank *rk, int n, double *us, double *enq_us) {
  return bench_host_collect_at(rk, 0, n, us, enq_us);
}

tpf_status bench_host_collect_at(bench_rank *rk, int first, int n, double *us, double *enq_us) {
  bench_group *g = rk->g;
  tpf_status st = TPF_OK;
  pthread_barrier_wait(&g->bar); /* every rank thread here has written its slots */
  if (first_here(rk)) {
    /* Per process: [0, n) min t0, [n, 2n) max t1, then nlocal * n enqueue times. */
    const int nl = g->nlocal, nproc = g->xboot ? g->xboot->tp_size : 1;
    const size_t per = (size_t)(2 + nl) * (size_t)n;
    double *mine = malloc(per * sizeof(double)),
           *all = malloc(per * (size_t)nproc * sizeof(double));
    double *enq = malloc((size_t)nl * (size_t)n * (size_t)nproc * sizeof(double));
    if (!mine || !all || !enq) st = tpf_set_error(TPF_ENOMEM, "bench: no memory for timing");
    for (int it = 0; st == TPF_OK && it < n; it++) {
      double a = INFINITY, b = -INFINITY;
      for (int l = 0; l < nl; l++) {
        const int r = g->rank0 + l;
        const int slot = r * BENCH_MAX_ITERS + first + it;
        const double x = g->h0[slot], y = g->h1[slot];
        a = x < a ? x : a;
        b = y > b ? y : b;
        mine[(size_t)(2 + l) * (size_t)n + (size_t)it] = g->enq[slot];
      }
      mine[it] = a;
      mine[n + it] = b;
    }
    if (st == TPF_OK) st = bench_xallgather(g, mine, all, per * sizeof(double));
    if (st == TPF_OK) {
      int ne = 0;
      for (int it = 0; it < n; it++) {
        double a = INFINITY, b = -INFINITY;
        for (int q = 0; q < nproc; q++) {
          const double *p = all + (size_t)q * per;
          a = p[it] < a ? p[it] : a;
          b = p[n + it] > b ? p[n + it] : b;
        }
        us[it] = (b - a) * 1e-3;
      }
      for (int q = 0; q < nproc; q++)
        for (size_t k = 2 * (size_t)n; k < per; k++)
          enq[ne++] = all[(size_t)q * per + k];
      *enq_us = bench_median(enq, ne) * 1e-3;
    } else {
      for (int it = 0; it < n; it++)
        us[it] = NAN;
      *enq_us = NAN;
    }
    free(mine);
    free(all);
    free(enq);
  }
  pthread_barrier_wait(&g->bar);
  return st;
}
