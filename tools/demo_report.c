/* `tpflex demo`: what rank 0 prints. The header names the layer's communicators; one table row
 * per microbatch (every row on short runs, a sample of --rows on long ones, every failure);
 * bytes moved are the schedules' sums, replaced by the backend's own count where it has one (a
 * difference fails the microbatch); the summary gives tokens, rows, operations, registrations,
 * bytes against padding to capacity, the trace and the verdict. */
#define _POSIX_C_SOURCE 200809L
#include "demo.h"

#include <stdio.h>
#include <string.h>

static void fmt_bytes(uint64_t b, char *buf, size_t len) {
  if (b >= (1ull << 30))
    snprintf(buf, len, "%.2f GiB", (double)b / (double)(1ull << 30));
  else if (b >= (1ull << 20))
    snprintf(buf, len, "%.2f MiB", (double)b / (double)(1ull << 20));
  else if (b >= 1024)
    snprintf(buf, len, "%.1f KiB", (double)b / 1024.0);
  else
    snprintf(buf, len, "%llu B", (unsigned long long)b);
}

static bool row_printed(const demo_ctx *d, int mb, bool ok) {
  int n = d->o.mbs;
  if (!ok || n <= d->o.rows || mb < 10 || mb == n - 1) return true;
  int every = (n + d->o.rows - 1) / d->o.rows;
  return mb % every == 0;
}

/* Rank 0, between the end-of-microbatch barriers: every rank's results of mb are in. */
void demo_report_mb(demo_ctx *d, int mb) {
  demo_mb *m = &d->mb[mb];
  bool ok = true;
  const char *why = "";
  int bad_rank = -1;
  double op_ms = d->res[(size_t)mb * (size_t)d->o.P].op_ms;
  for (int r = 0; r < d->o.P; r++) {
    demo_rank_mb *x = &d->res[(size_t)mb * (size_t)d->o.P + (size_t)r];
    if (!x->ok && ok) {
      ok = false;
      why = x->why;
      bad_rank = r;
    }
  }
  uint64_t moved = m->sched_bytes;
  char note[64] = "";
  if (d->bytes_moved) {
    uint64_t now = d->bytes_moved(d);
    uint64_t meas = now - d->measured_total;
    d->measured_total = now;
    if (meas != m->sched_bytes) {
      d->measured_ok = false;
      if (ok) {
        ok = false;
        bad_rank = 0;
        why = "bytes moved by the backend differ from the schedule";
      }
      snprintf(note, sizeof note, " (measured %llu)", (unsigned long long)meas);
    }
    moved = meas;
  }
  d->sched_total += m->sched_bytes;
  d->padded_total += m->padded_bytes;
  d->tokens_total += m->tokens;
  d->rows_total += m->T;
  d->ops_total += (uint64_t)d->layer.nops;
  d->op_ms_total += op_ms;
  if (ok)
    d->ok_mbs++;
  else
    d->failed_mbs++;
  if (row_printed(d, mb, ok)) {
    char mv[32], pd[32];
    fmt_bytes(moved, mv, sizeof mv);
    fmt_bytes(m->padded_bytes, pd, sizeof pd);
    printf("%5d %7llu %7llu %8llu %5llu %6.1f%% %4d %12s %12s %9.2f  %s%s\n", mb + 1,
           (unsigned long long)m->tokens, (unsigned long long)m->T,
           (unsigned long long)(m->T / (uint64_t)d->o.P), (unsigned long long)m->seqs,
           100.0 * (double)m->T / (double)d->o.C, d->layer.nops, mv, pd, op_ms, ok ? "OK" : "FAIL",
           note);
    if (!ok) printf("        rank %d: %s\n", bad_rank, why);
    fflush(stdout);
  }
  double t = demo_now_s();
  if (d->o.mbs > d->o.rows && t - d->t_progress > 2.0) {
    d->t_progress = t;
    fprintf(stderr, "progress: %d/%d microbatches, %llu tokens, %.1f s\n", mb + 1, d->o.mbs,
            (unsigned long long)d->tokens_total, t - d->t_start);
  }
}

void demo_print_header(const demo_ctx *d) {
  const demo_opts *o = &d->o;
  const demo_layer *L = &d->layer;
  printf("tpflex demo: backend %s, TP %d%s, one manager per rank, capacity [%llu, %llu] %s, %d "
         "microbatches of packed sequences\n",
         d->env->name, o->P, o->procs ? " (one process per rank)" : "", (unsigned long long)o->C,
         (unsigned long long)o->H, tpf_dtype_name(o->dtype), o->mbs);
  printf("communicators (TransformerEngine defaults):");
  for (int i = 0; i < L->nsites; i++)
    printf("%s %s=%s%s%s", i ? "," : "", L->sites[i].name,
           L->sites[i].algo == TPF_ALGO_RING       ? "ring-exchange "
           : L->sites[i].algo == TPF_ALGO_PIPELINE ? "pipeline "
                                                   : "bulk ",
           tpf_coll_name(L->sites[i].coll), L->sites[i].external ? " (external)" : "");
  printf("\n  (external: registered by the manager but filled outside tpflex, so it is never "
         "resized and stays at capacity)");
  printf(
      "\nper microbatch: set_active_shape once, then %d operations (4 fprop, 6 dgrad/wgrad), each "
      "checked against the host reference%s\n\n",
      L->nops, o->check ? "" : " (checks off)");
  printf("tokens = packed sequence tokens; rows T = tokens padded to a row count every layout "
         "accepts; rows/rank = T/P; fill = T/C\n");
  printf("%5s %7s %7s %8s %5s %7s %4s %12s %12s %9s  %s\n", "mb", "tokens", "rows T", "rows/rank",
         "seqs", "fill", "ops", "moved", "padded-to-C", "ops ms", "check");
}

bool demo_print_summary(demo_ctx *d, tpf_status st, double wall) {
  /* The run's detail, before the layout probes below overwrite tpf_last_error(). */
  char err[1024];
  snprintf(err, sizeof err, "%s", tpf_last_error());
  const demo_opts *o = &d->o;
  const demo_layer *L = &d->layer;
  int done = (int)(d->ok_mbs + d->failed_mbs);
  char mv[32], pd[32];
  fmt_bytes(d->sched_total, mv, sizeof mv);
  fmt_bytes(d->padded_total, pd, sizeof pd);
  printf("\nsummary\n");
  printf("  microbatches      %d of %d run, %llu checked OK, %llu failed\n", done, o->mbs,
         (unsigned long long)d->ok_mbs, (unsigned long long)d->failed_mbs);
  uint64_t q = 0; /* the row multiple every layout accepts at this shape, when there is one */
  for (uint64_t t = (uint64_t)o->P; t <= o->C && !q; t += (uint64_t)o->P)
    if (demo_layouts_accept(L, o, t)) q = t;
  for (uint64_t t = q; q && t <= o->C && t <= 16 * q; t += q)
    if (!demo_layouts_accept(L, o, t)) q = 0;
  if (q)
    printf("  tokens            %llu in packed sequences; %llu rows run (T = tokens rounded up to "
           "a multiple of %llu, the smallest row step every layout aligns); %llu rows if padded "
           "to capacity\n",
           (unsigned long long)d->tokens_total, (unsigned long long)d->rows_total,
           (unsigned long long)q, (unsigned long long)((uint64_t)done * o->C));
  else
    printf("  tokens            %llu in packed sequences; %llu rows run (T = tokens rounded up to "
           "the next multiple of %d that every layout aligns); %llu rows if padded to "
           "capacity\n",
           (unsigned long long)d->tokens_total, (unsigned long long)d->rows_total, o->P,
           (unsigned long long)((uint64_t)done * o->C));
  printf("  operations        %llu (%d per microbatch), ops time %.1f ms on rank 0, wall %.2f s\n",
         (unsigned long long)d->ops_total, L->nops, d->op_ms_total, wall);
  if (d->have_registrations)
    printf("  registrations     %s per communicator: %d communicators, %llu registrations at "
           "capacity before the first microbatch, %llu during the %d microbatches\n",
           d->regs_setup == (uint64_t)L->nsites && d->regs_loop == 0 ? "1" : "NOT 1", L->nsites,
           (unsigned long long)d->regs_setup, (unsigned long long)d->regs_loop, done);
  else
    printf("  registrations     not counted by this backend (%d communicators, each registered "
           "once at capacity by the demo)\n",
           L->nsites);
  printf("  bytes moved       %s here vs %s padded to capacity (%.1f%% saved)%s\n", mv, pd,
         d->padded_total ? 100.0 * (1.0 - (double)d->sched_total / (double)d->padded_total) : 0.0,
         d->measured_ok && d->have_registrations ? "; backend-measured bytes equal the schedule's"
                                                 : "");
  bool trace_failed = false;
  if (d->trace) {
    tpf_status ts = tpf_trace_write(d->trace, o->trace, o->P);
    if (ts == TPF_OK)
      printf("  trace             %s (%llu spans; one track per rank and stream; "
             "ui.perfetto.dev)\n",
             o->trace, (unsigned long long)tpf_trace_count(d->trace));
    else {
      printf("  trace             not written: %s\n", tpf_last_error());
      fprintf(stderr, "tpflex demo: --trace '%s' could not be written: %s\n", o->trace,
              tpf_last_error());
      trace_failed = true;
    }
  }
  bool pass =
      st == TPF_OK && !trace_failed && d->failed_mbs == 0 && done == o->mbs &&
      (!d->have_registrations || (d->regs_setup == (uint64_t)L->nsites && d->regs_loop == 0));
  if (st != TPF_OK && strstr(err, "arena"))
    printf("  error             %s: %s (the simulator arena: raise it with --arena-mib)\n",
           tpf_status_name(st), err);
  else if (st == TPF_ETIMEOUT)
    printf("  error             %s: %s (the wait bound: raise it with --timeout-ms, now %u)\n",
           tpf_status_name(st), err, o->timeout_ms);
  else if (st != TPF_OK)
    printf("  error             %s: %s\n", tpf_status_name(st), err);
  printf("  result            %s\n", pass ? "every check OK" : "FAILED");
  return pass;
}
