/* `tpflex demo`: the layer's layouts and schedules. Options (checked against every site's
 * layout), the microbatch sizes drawn from a packer of random sequences, and the bytes every
 * rank's schedule moves across ranks at T and at the capacity C (what padding would move). */
#define _POSIX_C_SOURCE 200809L
#include "demo.h"

#include "cli_args.h"
#include "reference.h" /* tpf_ref_mix, tpf_ref_rand_u64: the seeded draws */

#include "tpflex/tpflex_backend_support.h" /* TPF_CHECK */

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* GEMM dims of a site at T. AG: d[T, N] = AG(X)[T, H] w[N, H]^T with N = mult*H/P (the
 * column-parallel output shard). RS: x[T, K] w[H, K]^T with K = mult*H/P (the row-parallel input
 * shard). BULK dgrad (AG): d[T, H] = a[T, K] b[H, K]^T, K = mult*H/P; BULK wgrad (RS):
 * d[M, H] = a[M, T] b[H, T]^T, M = mult*H/P. */
tpf_gemm_dims demo_site_dims(const demo_site *s, uint64_t H, int P, uint64_t T) {
  uint64_t shard = (uint64_t)s->mult * H / (uint64_t)P;
  tpf_gemm_dims g = {T, shard, H};
  if (s->op == DEMO_OP_GEMM_RS) {
    g.n = H;
    g.k = shard;
  } else if (s->op == DEMO_OP_BULK && s->coll == TPF_COLL_AG) {
    g.m = T;
    g.n = H;
    g.k = shard;
  } else if (s->op == DEMO_OP_BULK) {
    g.m = shard;
    g.n = H;
    g.k = T;
  }
  return g;
}

/* ---- command line ---- */

enum {
  D_BACKEND,
  D_MODE,
  D_TP,
  D_MBS,
  D_CAP,
  D_HIDDEN,
  D_DTYPE,
  D_SEED,
  D_DELAY,
  D_TIMEOUT,
  D_ARENA,
  D_TRACE,
  D_ROWS,
  D_NOCHECK,
  D_NOPTS
};
static const cli_opt kDemoOpts[D_NOPTS] = {
    [D_BACKEND] = {"--backend", CLI_CHOICE, 0, 0, "sim|cuda", NULL, "backend (default sim)", 0,
                   false},
    [D_MODE] = {"--mode", CLI_CHOICE, 0, 0, "threads|procs", NULL,
                "ranks as threads of this process (default), or one process per rank as torchrun "
                "launches them (sim only)",
                0, false},
    [D_TP] = {"--tp", CLI_U64, 1, TPF_MAX_RANKS, NULL, "P", "tensor-parallel ranks (default 4)", 0,
              false},
    [D_MBS] = {"--microbatches", CLI_U64, 1, 100000, NULL, "N", "microbatches to run (default 12)",
               0, false},
    [D_CAP] = {"--capacity", CLI_U64, 1, 1ull << 24, NULL, "C",
               "max tokens per microbatch, a multiple of P (default 1024)", 0, false},
    [D_HIDDEN] = {"--hidden", CLI_U64, 4, 1ull << 16, NULL, "H",
                  "hidden size, a multiple of P (default 128)", 0, false},
    [D_DTYPE] = {"--dtype", CLI_CHOICE, 0, 0, "bf16|fp16|fp32", NULL,
                 "buffer and operand dtype (default bf16)", 0, false},
    [D_SEED] = {"--seed", CLI_U64, 0, UINT64_MAX, NULL, "S",
                "seed of sequence lengths, data and delays (default 1)", 0, false},
    [D_DELAY] = {"--max-delay-us", CLI_U64, 0, 1000000, NULL, "U",
                 "simulator: random delay before each step (default 0)", 0, false},
    [D_TIMEOUT] = {"--timeout-ms", CLI_U64, 1, 3600000, NULL, "MS",
                   "bound on every wait (default 10000)", 0, false},
    [D_ARENA] = {"--arena-mib", CLI_U64, 1, 1u << 20, NULL, "MIB",
                 "simulator: size of the shared arena all registrations live in (default 1024)", 0,
                 false},
    [D_TRACE] = {"--trace", CLI_STR, 0, 0, NULL, "FILE",
                 "write a Chrome trace JSON (open in ui.perfetto.dev)", 0, false},
    [D_ROWS] = {"--rows", CLI_U64, 1, 1000000, NULL, "N",
                "table rows to print on long runs (default 40)", 0, false},
    [D_NOCHECK] = {"--no-check", CLI_FLAG, 0, 0, NULL, NULL,
                   "skip the reference checks (timing only)", 0, false},
};

int demo_parse(int argc, char **argv, const demo_layer *layer, demo_opts *o) {
  static const cli_ctx ctx = {"tpflex demo", false, NULL};
  cli_val v[D_NOPTS];
  int rc = cli_parse(&ctx, kDemoOpts, D_NOPTS, argc, argv, v,
                     "usage: tpflex demo [options]   "
                     "(every option is optional)");
  if (rc >= 0) return rc;
  static const tpf_dtype dts[] = {TPF_BF16, TPF_FP16, TPF_FP32};
  o->backend = v[D_BACKEND].set ? v[D_BACKEND].s : "sim";
  o->procs = v[D_MODE].set && v[D_MODE].u == 1;
  o->P = v[D_TP].set ? (int)v[D_TP].u : 4;
  o->mbs = v[D_MBS].set ? (int)v[D_MBS].u : 12;
  o->C = v[D_CAP].set ? v[D_CAP].u : 1024;
  o->H = v[D_HIDDEN].set ? v[D_HIDDEN].u : 128;
  o->dtype = v[D_DTYPE].set ? dts[v[D_DTYPE].u] : TPF_BF16;
  o->seed = v[D_SEED].set ? v[D_SEED].u : 1;
  o->delay_us = v[D_DELAY].set ? (unsigned)v[D_DELAY].u : 0;
  o->timeout_ms = v[D_TIMEOUT].set ? (unsigned)v[D_TIMEOUT].u : 10000;
  o->arena_bytes = v[D_ARENA].set ? v[D_ARENA].u << 20 : 0;
  o->trace = v[D_TRACE].set ? v[D_TRACE].s : NULL;
  o->rows = v[D_ROWS].set ? (int)v[D_ROWS].u : 40;
  o->check = !v[D_NOCHECK].set;
  const unsigned long long P = (unsigned long long)o->P;
  if (o->H % P != 0)
    return cli_error(&ctx, "--hidden '%llu' is not a multiple of --tp %llu (try %llu)",
                     (unsigned long long)o->H, P, (o->H + P - 1) / P * P);
  if (o->C % P != 0 || !demo_layouts_accept(layer, o, o->C)) {
    /* One suggestion, and a valid one: the smallest capacity >= C that every layout accepts.
     * T/P a multiple of 16 meets every alignment rule, so a few steps of P past the first
     * multiple of P find it (core/legal_rows.c). */
    char why[512];
    if (o->C % P != 0)
      snprintf(why, sizeof why, "is not a multiple of --tp %llu", P);
    else
      snprintf(why, sizeof why, "breaks a layout rule with --hidden %llu --tp %llu: %s",
               (unsigned long long)o->H, P, tpf_last_error());
    demo_opts t = *o;
    for (t.C = (o->C + P - 1) / P * P; t.C <= o->C + 64 * P && t.C <= (1ull << 24); t.C += P)
      if (demo_layouts_accept(layer, &t, t.C))
        return cli_error(&ctx,
                         "--capacity '%llu' %s; the smallest capacity >= %llu that every "
                         "layout accepts is %llu",
                         (unsigned long long)o->C, why, (unsigned long long)o->C,
                         (unsigned long long)t.C);
    return cli_error(&ctx, "--capacity '%llu' %s", (unsigned long long)o->C, why);
  }
  if (o->arena_bytes && strcmp(o->backend, "sim") != 0)
    return cli_error(&ctx, "--arena-mib applies to --backend sim only");
  if (v[D_DELAY].set && strcmp(o->backend, "sim") != 0)
    return cli_error(&ctx, "--max-delay-us applies to --backend sim only");
  if (o->procs && strcmp(o->backend, "sim") != 0)
    return cli_error(&ctx, "--mode procs runs on --backend sim only (on GPUs, ranks as processes "
                           "are `tpflex bench --mode procs` or a torchrun script)");
  if (o->procs && o->arena_bytes)
    return cli_error(&ctx,
                     "--arena-mib applies to --mode threads only (with one process per rank "
                     "every registration is a shared memory segment of its own, in /dev/shm)");
  if (o->procs && o->trace)
    return cli_error(&ctx, "--trace applies to --mode threads only: with one process per rank "
                           "each simulator traces its own rank alone (trace the same run with "
                           "--mode threads)");
  /* A trace that could not be written fails the run at its end; a path that cannot be written
   * at all is refused now, before any work (nothing is created here). */
  if (o->trace && !cli_path_writable(o->trace))
    return cli_error(&ctx, "--trace '%s' cannot be written (%s)", o->trace, strerror(errno));
  return -1;
}

/* True when every site's layout accepts T rows (SPEC §3 with the strictest alignment, 16 bytes:
 * a pipeline block of T x H/4 elements must start 16-byte aligned, which can need more than
 * T % P == 0). */
bool demo_layouts_accept(const demo_layer *layer, const demo_opts *o, uint64_t T) {
  for (int i = 0; i < layer->nsites; i++) {
    tpf_layout_desc desc;
    memset(&desc, 0, sizeof desc);
    desc.tp_size = o->P;
    desc.algo = layer->sites[i].algo;
    desc.coll = layer->sites[i].coll;
    desc.dtype = o->dtype;
    desc.capacity.rows = o->C;
    desc.capacity.cols = o->H;
    desc.active.rows = T;
    desc.active.cols = o->H;
    if (tpf_layout_check(&desc) != TPF_OK) return false;
  }
  return true;
}

/* ---- microbatches and their schedules ---- */

/* Packed-sequence microbatches: each packs random sequence lengths up to a random fill of the
 * capacity (a packer with a token budget); T is rounded up to a multiple of P, and further when a
 * layout needs it for 16-byte alignment. */
static void plan_microbatches(demo_ctx *d) {
  uint64_t st = tpf_ref_mix(d->o.seed, 0x6d62ull);
  const uint64_t C = d->o.C, P = (uint64_t)d->o.P;
  uint64_t max_seq = C / 4 > P ? C / 4 : P;
  for (int i = 0; i < d->o.mbs; i++) {
    double fill = 0.1 + 0.9 * (double)(tpf_ref_rand_u64(&st) >> 11) / 9007199254740992.0;
    uint64_t budget = (uint64_t)(fill * (double)C);
    if (budget < 1) budget = 1;
    uint64_t tokens = 0, seqs = 0;
    for (;;) {
      uint64_t len = 1 + tpf_ref_rand_u64(&st) % max_seq;
      if (tokens + len > budget) {
        if (seqs == 0) { /* a first sequence longer than the budget is cut to it */
          tokens = budget;
          seqs = 1;
        }
        break;
      }
      tokens += len;
      seqs++;
    }
    uint64_t T = (tokens + P - 1) / P * P;
    while (T < C && !demo_layouts_accept(&d->layer, &d->o, T))
      T += P;
    if (T > C) T = C;
    d->mb[i].T = T;
    d->mb[i].tokens = tokens;
    d->mb[i].seqs = seqs;
  }
}

/* Bytes every rank's schedule of site s moves across ranks at T: SEND payloads, and the peer
 * reads of PEER_REDUCE. */
static tpf_status sched_bytes(const demo_opts *o, const demo_site *s, uint64_t T, uint64_t *out) {
  uint64_t total = 0;
  for (int r = 0; r < o->P; r++) {
    tpf_layout_desc desc;
    memset(&desc, 0, sizeof desc);
    desc.tp_size = o->P;
    desc.rank = r;
    desc.algo = s->algo;
    desc.coll = s->coll;
    desc.dtype = o->dtype;
    desc.capacity.rows = o->C;
    desc.capacity.cols = o->H;
    desc.active.rows = T;
    desc.active.cols = o->H;
    tpf_gemm_dims g = demo_site_dims(s, o->H, o->P, T);
    tpf_schedule sch;
    TPF_CHECK(tpf_schedule_build(&desc, &g, &sch));
    size_t esz = tpf_dtype_size(o->dtype);
    for (int i = 0; i < sch.nsteps; i++) {
      const tpf_step *st = &sch.steps[i];
      if (st->kind == TPF_STEP_SEND)
        total += st->bytes;
      else if (st->kind == TPF_STEP_PEER_REDUCE && st->count > 1)
        total += (uint64_t)(st->count - 1) * st->m * st->n * esz;
    }
    tpf_schedule_free(&sch);
  }
  *out = total;
  return TPF_OK;
}

int demo_plan(demo_ctx *d) {
  const demo_opts *o = &d->o;
  const demo_layer *L = &d->layer;
  plan_microbatches(d);
  uint64_t padded = 0;
  for (int k = 0; k < L->nops; k++) {
    uint64_t b = 0;
    if (sched_bytes(o, &L->sites[L->order[k]], o->C, &b) != TPF_OK) {
      fprintf(stderr, "tpflex demo: schedule of %s at capacity: %s\n", L->sites[L->order[k]].name,
              tpf_last_error());
      return 1;
    }
    padded += b;
  }
  for (int i = 0; i < o->mbs; i++) {
    d->mb[i].padded_bytes = padded;
    for (int k = 0; k < L->nops; k++) {
      uint64_t b = 0;
      if (sched_bytes(o, &L->sites[L->order[k]], d->mb[i].T, &b) != TPF_OK) {
        fprintf(stderr, "tpflex demo: schedule of %s at T=%llu: %s\n", L->sites[L->order[k]].name,
                (unsigned long long)d->mb[i].T, tpf_last_error());
        return 1;
      }
      d->mb[i].sched_bytes += b;
    }
  }
  return 0;
}
