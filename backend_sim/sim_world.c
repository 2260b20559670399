/* The simulator world: P ranks as threads, one shared arena, stream worker threads per rank.
 *
 * Method: a world owns one anonymous mmap (the arena) from which every collective registration
 * takes one extent holding all P ranks' blocks, so a peer's buffer is just an address and a
 * "copy-engine transfer" is a memcpy into it. Each rank is a tpf_sim_rank (the backend object the
 * core receives) with TPF_NUM_STREAMS persistent worker threads standing for its CUDA streams;
 * execute (sim_exec.c) hands a schedule to them and waits. Cross-rank flags are C11 atomics in
 * the arena; a waiter sleeps on its own rank's doorbell (mutex + condition + generation), which
 * every writer into that rank's flags rings, so waits cost no CPU on a 2-core machine and every
 * wait carries a deadline. tpf_sim_run starts one thread per rank for the user's function; the
 * workers outlive runs, so objects created in one run are usable in the next.
 *
 * Ranks as processes (tpf_sim_backend_create): a world holds one rank, the one of this process,
 * and the execution code is the same. What changes is where the shared things live and how
 * ranks meet: each registration is a POSIX shared memory segment of its own instead of an arena
 * extent (sim_reg.c), the rendezvous of reg_create and of the creation allgather is the
 * bootstrap's allgather instead of the world mutex (sim_reg.c, sim_exchange.c), the doorbell is
 * a futex word in the registration instead of the rank's condition (sim_doorbell.c), and a
 * cross-rank wait also watches the peers' pids (sim_exec.c, sim_proc.c). Creation exchanges
 * every rank's pid and rank 0's job name (the prefix of the segment names) with a local outcome,
 * so a local failure fails every rank at once, naming it.
 *
 * Rooms: sim_world.c (this: world, ranks, runs, the ops table, observation) calls sim_exec.c
 * (execute and the stream workers), sim_reg.c (registrations, canary), sim_exchange.c (the
 * creation allgather) and sim_math.c; those call only the leaves sim_clock.c, sim_arena.c,
 * sim_doorbell.c, sim_fault.c and sim_proc.c (shared memory segments, peer liveness), which call
 * nothing but the clock. No file calls back up.
 */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS, MAP_NORESERVE */
#include "sim_internal.h"

#include <stddef.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

/* ---- the ops table ---- */

const tpf_backend_ops tpf_sim_ops = {
    .abi_version = TPF_BACKEND_ABI_VERSION,
    .name = "sim",
    .caps = TPF_BE_CAP_HOST_MEMORY | TPF_BE_CAP_OPTIONS | TPF_BE_CAP_FP8,
    .align_bytes = 16,
    .max_ranks = TPF_MAX_RANKS,
    .reg_create = tpf_sim__reg_create,
    .reg_destroy = tpf_sim__reg_destroy,
    .reg_activate = tpf_sim__reg_activate,
    .execute = tpf_sim__execute,
    .sync = tpf_sim__sync,
    .reg_sync = tpf_sim__reg_sync,
    .reg_async_error = tpf_sim__reg_async_error,
    .reg_abort = tpf_sim__reg_abort,
    .allgather = tpf_sim__allgather,
};

/* ---- world ---- */

static tpf_status pthread_error(int err, const char *what) {
  return tpf_set_error(TPF_EBACKEND, "simulator: %s failed: %s", what, strerror(err));
}

static void rank_stop_workers(tpf_sim_rank *rk) {
  pthread_mutex_lock(&rk->mu);
  rk->shutdown = true;
  pthread_cond_broadcast(&rk->cv);
  pthread_mutex_unlock(&rk->mu);
  for (int s = 0; s < TPF_NUM_STREAMS; s++) {
    if (rk->workers_started[s]) pthread_join(rk->workers[s].thread, NULL);
    rk->workers_started[s] = false;
    tpf_sim__scratch_free(&rk->workers[s].scratch);
  }
}

/* Starts local rank object i, which is rank r of the group. */
static tpf_status rank_init(tpf_sim_world *w, int i, int r) {
  tpf_sim_rank *rk = &w->ranks[i];
  rk->hdr.ops = &tpf_sim_ops;
  rk->hdr.tp_size = w->tp_size;
  rk->hdr.rank = r;
  rk->world = w;
  rk->rank = r;
  pthread_mutex_init(&rk->mu, NULL);
  pthread_cond_init(&rk->cv, NULL);
  pthread_mutex_init(&rk->bell_mu, NULL);
  tpf_sim__cond_init_mono(&rk->bell_cv);
  pthread_mutex_init(&rk->fault_mu, NULL);
  for (int s = 0; s < TPF_NUM_STREAMS; s++) {
    tpf_sim_worker *wk = &rk->workers[s];
    wk->rank = rk;
    wk->stream = s;
    /* Distinct, reproducible delay streams per (seed, rank, stream). */
    wk->rng = w->seed ^ (0x9e3779b97f4a7c15ull * (uint64_t)(r * TPF_NUM_STREAMS + s + 1));
    int err = pthread_create(&wk->thread, NULL, tpf_sim__worker_main, wk);
    if (err) return pthread_error(err, "creating a stream worker");
    rk->workers_started[s] = true;
  }
  return TPF_OK;
}

static void world_free(tpf_sim_world *w) {
  if (w->ranks) {
    for (int i = 0; i < w->nlocal; i++) {
      tpf_sim_rank *rk = &w->ranks[i];
      if (!rk->world) continue;
      rank_stop_workers(rk);
      pthread_mutex_destroy(&rk->mu);
      pthread_cond_destroy(&rk->cv);
      pthread_mutex_destroy(&rk->bell_mu);
      pthread_cond_destroy(&rk->bell_cv);
      pthread_mutex_destroy(&rk->fault_mu);
    }
    tpf_free(w->ranks);
  }
  tpf_sim__free_groups(w);
  tpf_sim__free_exchanges(w);
  while (w->free_list) {
    tpf_sim_extent *e = w->free_list;
    w->free_list = e->next;
    tpf_free(e);
  }
  if (w->arena) munmap(w->arena, (size_t)w->arena_bytes);
  pthread_mutex_destroy(&w->mu);
  pthread_cond_destroy(&w->cv);
  tpf_free(w);
}

/* Unregisters the handle (later calls on w are refused, naming it) and frees the world. */
static void world_destroy(tpf_sim_world *w) {
  tpf_handle_remove(w, NULL);
  world_free(w);
}

/* The configuration as this header's layout, checked. */
static tpf_status config_norm(const char *fn, const tpf_sim_config *cfg, tpf_sim_config *norm) {
  static const size_t released[] = {sizeof(tpf_sim_config)}; /* 0.2's layout */
  TPF_CHECK(tpf_check_struct_size(fn, "config", "tpf_sim_config", cfg->size, released,
                                  TPF_ARRAY_SIZE(released)));
  tpf_sim_config d = TPF_SIM_CONFIG_INIT;
  *norm = d;
  memcpy(norm, cfg, cfg->size ? cfg->size : sizeof *norm);
  if (norm->tp_size < 1 || norm->tp_size > TPF_MAX_RANKS)
    return tpf_set_error(TPF_EINVAL, "%s: tp_size %d outside 1..%d", fn, norm->tp_size,
                         TPF_MAX_RANKS);
  return TPF_OK;
}

/* A world of cfg->tp_size ranks: all of them here (proc_rank < 0: threads, with the arena), or
 * only rank proc_rank (process mode: registrations are shared memory segments of their own). */
static tpf_status world_new(const tpf_sim_config *cfg, int proc_rank, tpf_sim_world **out) {
  tpf_sim_world *w = tpf_calloc(1, sizeof *w);
  if (!w) return tpf_set_error(TPF_ENOMEM, "tpf_sim_world_create: world");
  w->tp_size = cfg->tp_size;
  w->procs = proc_rank >= 0;
  w->proc_rank = w->procs ? proc_rank : -1;
  w->nlocal = w->procs ? 1 : cfg->tp_size;
  w->seed = cfg->seed;
  w->max_delay_us = cfg->max_delay_us;
  w->timeout_ms = cfg->timeout_ms ? cfg->timeout_ms : TPF_SIM_DEFAULT_TIMEOUT_MS;
  w->t0_ns = tpf_sim__now_ns();
  pthread_mutex_init(&w->mu, NULL);
  pthread_cond_init(&w->cv, NULL);
  w->fault.base.fail_status = TPF_OK;

  if (!w->procs) {
    /* The arena is reserved, not committed: pages appear as registrations touch them. */
    w->arena_bytes = cfg->arena_bytes ? cfg->arena_bytes : TPF_SIM_DEFAULT_ARENA_BYTES;
    w->arena_bytes =
        (w->arena_bytes + TPF_SIM_ARENA_ALIGN - 1) / TPF_SIM_ARENA_ALIGN * TPF_SIM_ARENA_ALIGN;
    void *a = mmap(NULL, (size_t)w->arena_bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (a == MAP_FAILED) {
      int err = errno;
      world_free(w);
      return tpf_set_error(
          TPF_ENOMEM, "simulator arena: mmap of %llu bytes failed: %s",
          (unsigned long long)(cfg->arena_bytes ? cfg->arena_bytes : TPF_SIM_DEFAULT_ARENA_BYTES),
          strerror(err));
    }
    w->arena = a;
    w->free_list = tpf_malloc(sizeof *w->free_list);
    if (!w->free_list) {
      world_free(w);
      return tpf_set_error(TPF_ENOMEM, "tpf_sim_world_create: arena list");
    }
    w->free_list->off = 0;
    w->free_list->len = w->arena_bytes;
    w->free_list->next = NULL;
  }
  w->ranks = tpf_calloc((size_t)w->nlocal, sizeof *w->ranks);
  if (!w->ranks) {
    world_free(w);
    return tpf_set_error(TPF_ENOMEM, "tpf_sim_world_create: rank table");
  }
  for (int i = 0; i < w->nlocal; i++) {
    tpf_status st = rank_init(w, i, w->procs ? proc_rank : i);
    if (st != TPF_OK) {
      char msg[TPF_SIM_MSG_LEN];
      snprintf(msg, sizeof msg, "%s", tpf_last_error());
      world_free(w);
      return tpf_set_error(st, "%s", msg);
    }
  }
  tpf_status hs = tpf_handle_add(w, TPF_HANDLE_WORLD);
  if (hs != TPF_OK) {
    world_free(w);
    return hs;
  }
  *out = w;
  return TPF_OK;
}

tpf_status tpf_sim_world_create(const tpf_sim_config *cfg, tpf_sim_world **out) {
  if (!cfg || !out)
    return tpf_set_error(TPF_EINVAL, "tpf_sim_world_create: NULL %s", cfg ? "out" : "config");
  tpf_sim_config norm;
  TPF_CHECK(config_norm("tpf_sim_world_create", cfg, &norm));
  return world_new(&norm, -1, out);
}

/* ---- ranks as processes ---- */

/* What every rank says at creation: its local outcome, its pid, its idea of P and, from rank 0,
 * the job's name. */
typedef struct {
  int32_t status;
  int32_t pid;
  int32_t tp_size;
  uint32_t pad;
  char job[64];
  char msg[128];
} sim_hello;

tpf_status tpf_sim_backend_create(const tpf_sim_config *cfg, const tpf_bootstrap *boot,
                                  tpf_backend **out) {
  const char *fn = "tpf_sim_backend_create";
  if (!boot || !out)
    return tpf_set_error(TPF_EINVAL, "%s: NULL %s", fn, boot ? "out" : "bootstrap");
  if (!boot->allgather || !boot->barrier)
    return tpf_set_error(TPF_EINVAL, "%s: the bootstrap lacks its %s function", fn,
                         boot->allgather ? "barrier" : "allgather");
  if (boot->tp_size < 1 || boot->tp_size > TPF_MAX_RANKS || boot->rank < 0 ||
      boot->rank >= boot->tp_size)
    return tpf_set_error(TPF_EINVAL, "%s: bootstrap rank %d of %d (a rank in 0..P-1, P in 1..%d)",
                         fn, boot->rank, boot->tp_size, TPF_MAX_RANKS);
  tpf_sim_config norm = TPF_SIM_CONFIG_INIT;
  norm.tp_size = boot->tp_size;
  if (cfg) {
    TPF_CHECK(config_norm(fn, cfg, &norm));
    if (norm.tp_size != boot->tp_size)
      return tpf_set_error(TPF_EINVAL,
                           "%s: config tp_size %d but the bootstrap group has %d ranks (set "
                           "tp_size to the group's size, or pass a NULL config)",
                           fn, norm.tp_size, boot->tp_size);
  }
  /* The local part first; its outcome travels in the hello, so that a failure here fails every
   * rank at once, naming this one, instead of leaving the peers waiting. */
  tpf_sim_world *w = NULL;
  tpf_status local = world_new(&norm, boot->rank, &w);
  sim_hello mine, all[TPF_MAX_RANKS];
  memset(&mine, 0, sizeof mine);
  mine.status = (int32_t)local;
  mine.pid = (int32_t)getpid();
  mine.tp_size = boot->tp_size;
  if (local != TPF_OK) snprintf(mine.msg, sizeof mine.msg, "%s", tpf_last_error());
  if (boot->rank == 0) {
    /* Segments a killed job left behind go first (their creator's pid no longer runs). */
    tpf_sim__shm_sweep();
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t nonce = ((uint64_t)ts.tv_nsec << 20) ^ (uint64_t)ts.tv_sec ^ (uint64_t)(uintptr_t)w;
    snprintf(mine.job, sizeof mine.job, "/tpflex-sim-%ld-%llx", (long)getpid(),
             (unsigned long long)(nonce & 0xffffffffffull));
  }
  tpf_status st = boot->allgather(boot->ctx, &mine, all, sizeof mine);
  char msg[TPF_SIM_MSG_LEN];
  if (st != TPF_OK) snprintf(msg, sizeof msg, "%s: %s", fn, tpf_last_error());
  for (int q = 0; st == TPF_OK && q < boot->tp_size; q++) {
    all[q].msg[sizeof all[q].msg - 1] = '\0';
    if (all[q].status != TPF_OK) {
      st = (tpf_status)all[q].status;
      if (q == boot->rank)
        snprintf(msg, sizeof msg, "%s", mine.msg);
      else
        snprintf(msg, sizeof msg, "%s: rank %d failed: %s", fn, q, all[q].msg);
    } else if (all[q].tp_size != boot->tp_size) {
      st = TPF_EMISMATCH;
      snprintf(msg, sizeof msg, "%s: ranks disagree on the group size: rank %d has %d, rank %d %d",
               fn, boot->rank, boot->tp_size, q, all[q].tp_size);
    }
  }
  if (st != TPF_OK) {
    if (w) world_destroy(w);
    return tpf_set_error(st, "%s", msg);
  }
  w->boot = *boot;
  for (int q = 0; q < boot->tp_size; q++)
    w->pids[q] = all[q].pid;
  all[0].job[sizeof all[0].job - 1] = '\0';
  snprintf(w->job, sizeof w->job, "%s", all[0].job);
  *out = &w->ranks[0].hdr;
  return TPF_OK;
}

static tpf_status proc_world_of(const char *fn, tpf_backend *be, tpf_sim_world **w) {
  if (!be || be->ops != &tpf_sim_ops)
    return tpf_set_error(TPF_EINVAL, "%s: not a simulator backend", fn);
  tpf_sim_world *pw = ((tpf_sim_rank *)be)->world;
  TPF_CHECK(tpf_handle_check(pw, TPF_HANDLE_WORLD, fn));
  if (!pw->procs)
    return tpf_set_error(TPF_EINVAL,
                         "%s: rank %d belongs to a world of ranks as threads "
                         "(tpf_sim_world_create): destroy that with tpf_sim_world_destroy",
                         fn, be->rank);
  *w = pw;
  return TPF_OK;
}

tpf_status tpf_sim_backend_world(tpf_backend *be, tpf_sim_world **out) {
  if (!out) return tpf_set_error(TPF_EINVAL, "tpf_sim_backend_world: NULL out");
  tpf_sim_world *w = NULL;
  TPF_CHECK(proc_world_of("tpf_sim_backend_world", be, &w));
  *out = w;
  return TPF_OK;
}

tpf_status tpf_sim_backend_destroy(tpf_backend *be) {
  tpf_sim_world *w = NULL;
  TPF_CHECK(proc_world_of("tpf_sim_backend_destroy", be, &w));
  world_destroy(w);
  return TPF_OK;
}

static void *run_main(void *arg) {
  tpf_sim_rank *rk = arg;
  tpf_status st = rk->run_fn(&rk->hdr, rk->rank, rk->run_arg);
  rk->run_status = st;
  if (st != TPF_OK) snprintf(rk->run_msg, sizeof rk->run_msg, "%s", tpf_last_error());
  return NULL;
}

tpf_status tpf_sim_run(tpf_sim_world *w, tpf_status (*fn)(tpf_backend *be, int rank, void *arg),
                       void *arg) {
  TPF_CHECK(tpf_handle_check(w, TPF_HANDLE_WORLD, "tpf_sim_run"));
  if (!fn) return tpf_set_error(TPF_EINVAL, "tpf_sim_run: NULL function");
  if (w->procs)
    return tpf_set_error(TPF_EINVAL,
                         "tpf_sim_run: this world holds rank %d of %d ranks as processes "
                         "(tpf_sim_backend_create); call the operations on its backend in this "
                         "process instead",
                         w->proc_rank, w->tp_size);
  int started = 0;
  tpf_status st = TPF_OK;
  for (int r = 0; r < w->tp_size; r++) {
    tpf_sim_rank *rk = &w->ranks[r];
    rk->run_fn = fn;
    rk->run_arg = arg;
    rk->run_status = TPF_OK;
    rk->run_msg[0] = '\0';
    int err = pthread_create(&rk->run_thread, NULL, run_main, rk);
    if (err) {
      /* The ranks already started would wait for this one until their timeout; they still
       * end, because every wait is bounded. */
      st = pthread_error(err, "creating a rank thread");
      break;
    }
    started++;
  }
  for (int r = 0; r < started; r++)
    pthread_join(w->ranks[r].run_thread, NULL);
  if (st != TPF_OK) return st;
  for (int r = 0; r < w->tp_size; r++) {
    tpf_sim_rank *rk = &w->ranks[r];
    if (rk->run_status != TPF_OK)
      return tpf_set_error(rk->run_status, "rank %d: %s", r, rk->run_msg);
  }
  return TPF_OK;
}

tpf_status tpf_sim_world_destroy(tpf_sim_world *w) {
  TPF_CHECK(tpf_handle_check(w, TPF_HANDLE_WORLD, "tpf_sim_world_destroy"));
  if (w->procs)
    return tpf_set_error(TPF_EINVAL,
                         "tpf_sim_world_destroy: this world holds rank %d of a group of processes; "
                         "destroy it with tpf_sim_backend_destroy on its backend",
                         w->proc_rank);
  world_destroy(w);
  return TPF_OK;
}

tpf_status tpf_sim_set_trace(tpf_sim_world *w, tpf_sim_trace_fn fn, void *ctx) {
  TPF_CHECK(tpf_handle_check(w, TPF_HANDLE_WORLD, "tpf_sim_set_trace"));
  w->trace_fn = fn;
  w->trace_ctx = ctx;
  return TPF_OK;
}

tpf_status tpf_sim_get_stats(const tpf_sim_world *w, tpf_sim_stats *out) {
  TPF_CHECK(tpf_handle_check(w, TPF_HANDLE_WORLD, "tpf_sim_get_stats"));
  if (!out) return tpf_set_error(TPF_EINVAL, "tpf_sim_get_stats: NULL out");
  tpf_sim_world *mw = (tpf_sim_world *)w; /* atomics are read through a non-const lvalue */
  tpf_sim_stats s;
  s.ops = atomic_load(&mw->ops);
  s.steps = atomic_load(&mw->steps);
  s.bytes_moved = atomic_load(&mw->bytes_moved);
  s.flops = atomic_load(&mw->flops);
  s.registrations = atomic_load(&mw->registrations);
  s.backend_calls = atomic_load(&mw->backend_calls);
  s.signals = atomic_load(&mw->signals);
  *out = s;
  return TPF_OK;
}

uint64_t tpf_sim_elapsed_ns(const tpf_sim_world *w) {
  return tpf_handle_live(w, TPF_HANDLE_WORLD) ? tpf_sim__now_ns() - w->t0_ns : 0;
}

tpf_status tpf_sim_get_fault_report(const tpf_sim_world *w, tpf_sim_fault_report *out) {
  TPF_CHECK(tpf_handle_check(w, TPF_HANDLE_WORLD, "tpf_sim_get_fault_report"));
  if (!out) return tpf_set_error(TPF_EINVAL, "tpf_sim_get_fault_report: NULL out");
  tpf_sim_world *mw = (tpf_sim_world *)w; /* atomics and the mutex need a non-const lvalue */
  tpf_sim_fault_report r;
  memset(&r, 0, sizeof r);
  r.calls = atomic_load(&mw->fault_calls);
  r.entries = atomic_load(&mw->fault_entries);
  r.signals = atomic_load(&mw->fault_signals);
  r.injected = atomic_load(&mw->fault_injected);
  pthread_mutex_lock(&mw->mu);
  r.live_registrations = mw->live_regs;
  r.arena_used_bytes = mw->arena_used;
  for (const tpf_sim_group *g = mw->groups; g; g = g->next)
    r.pending_rendezvous++;
  r.pending_rendezvous += tpf_sim__pending_exchanges(mw);
  pthread_mutex_unlock(&mw->mu);
  *out = r;
  return TPF_OK;
}
