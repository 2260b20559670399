/* The conformance sweep on the CUDA backend (environment in harness/cuda_env.c). Exit status 77
 * (CTest SKIP_RETURN_CODE) with "skipped: no GPU" when no CUDA device is usable.
 *
 *   conformance_cuda [body options]           ranks as threads of this process on one GPU
 *   conformance_cuda --procs [body options]   each rank in its own process (CUDA IPC), as training
 *                                             launches one process per GPU; rank r uses device
 *                                             r % device count (TPF_CUDA_TEST_DEVICE: that one)
 *
 * Method (process mode). This process never touches CUDA (a forked child of a process that
 * initialised CUDA cannot use it): a probe child counts the devices, and env->run forks P ranks
 * through the launcher (harness/launcher.h), which also gives them a socket bootstrap. The
 * body (conformance_body.c) hands run() one argument, its per-P state, and reads the ranks'
 * results from it after run() returns; with threads the ranks write into it directly. Here every
 * rank writes into its own copy, so run() brings the copies back (tpf_launch_fork_merging and
 * tpf_launch_merge): before forking the launcher takes the argument's extent (a heap block: its
 * usable size), each rank copies its final bytes into shared memory, and run() merges them into
 * the original with a three-way merge against the unchanged original (a byte takes the value a
 * rank wrote). Ranks of the body write disjoint
 * fields (rank r its own result slot), so the merge is exact; two ranks writing different values
 * into one byte would be a data race with threads too, and here fails the run loudly instead of
 * picking one. The argument must be a heap block the ranks do not free, and what they report
 * must live inside it (not behind pointers it holds): true of the body today.
 */
#define _DEFAULT_SOURCE
#define _POSIX_C_SOURCE 200809L
#include "conformance.h"
#include "cuda_env.h"
#include "internal.h" /* TPF_CHECK */
#include "launcher.h"

#include <cuda_runtime.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* ---- process mode ---- */

#define PROC_DETAIL 600

typedef struct {
  _Atomic int32_t reported; /* 1 once status and detail are written */
  int32_t status;
  int32_t device;
  int32_t pad;
  char detail[PROC_DETAIL];
} proc_report;

typedef struct {
  tpf_conf_env *env;
  tpf_conf_rank_fn fn;
  void *arg;
  int device_count;
  int fixed_device; /* TPF_CUDA_TEST_DEVICE, or -1 */
} proc_job;

typedef struct {
  int device_count; /* of the probe */
  int fixed_device;
  uint64_t run_timeout_ms, grace_ms;
} proc_state;

static uint64_t env_ms(const char *name, uint64_t dflt) {
  const char *v = getenv(name);
  if (v == NULL || *v == '\0') return dflt;
  return (uint64_t)strtoull(v, NULL, 10);
}

static int proc_rank_main(const tpf_launch_rank *me, void *p) {
  proc_job *job = p;
  proc_report *rep = (proc_report *)me->shared + me->rank;
  const int device =
      job->fixed_device >= 0 ? job->fixed_device : tpf_launch_device(me->rank, job->device_count);
  tpf_backend *be = NULL;
  tpf_bootstrap boot;
  bool have_boot = false;
  tpf_status rc = tpf_cuda_conf_env_enter_rank(job->env, me->rank, device);
  if (rc == TPF_OK) {
    rc = tpf_sockboot_create(me, device, 0, &boot);
    have_boot = rc == TPF_OK;
  }
  if (rc == TPF_OK) rc = tpf_cuda_backend_create(&boot, &be);
  if (rc == TPF_OK) rc = job->fn(be, me->rank, job->arg);
  char saved[PROC_DETAIL];
  snprintf(saved, sizeof saved, "%s", rc == TPF_OK ? "" : tpf_last_error());
  if (be != NULL) {
    tpf_status rc2 = tpf_cuda_backend_destroy(be);
    if (rc == TPF_OK && rc2 != TPF_OK) {
      rc = rc2;
      snprintf(saved, sizeof saved, "%s", tpf_last_error());
    }
  }
  if (have_boot) tpf_sockboot_free(&boot);
  tpf_cuda_conf_env_leave_rank(job->env, me->rank);
  rep->status = (int32_t)rc;
  rep->device = device;
  snprintf(rep->detail, sizeof rep->detail, "%s", saved);
  atomic_store_explicit(&rep->reported, 1, memory_order_release);
  return 0;
}

/* One process-mode environment per process (this binary's main). */
static proc_state g_proc;

static tpf_status proc_run(tpf_conf_env *env, int P, tpf_conf_rank_fn fn, void *arg) {
  if (P < 1 || P > env->max_ranks)
    return tpf_set_error(TPF_EINVAL, "cuda-procs env: P=%d outside 1..%d", P, env->max_ranks);
  proc_job job = {env, fn, arg, g_proc.device_count, g_proc.fixed_device};
  const size_t shared_bytes = (size_t)P * sizeof(proc_report);
  tpf_launch *l = NULL;
  if (arg != NULL)
    TPF_CHECK(tpf_launch_fork_merging(P, shared_bytes, proc_rank_main, &job, arg, 0, &l));
  else
    TPF_CHECK(tpf_launch_fork(P, shared_bytes, proc_rank_main, &job, &l));
  int codes[TPF_MAX_RANKS];
  tpf_status wst = tpf_launch_wait(l, g_proc.run_timeout_ms, g_proc.grace_ms, codes);
  char wait_why[PROC_DETAIL / 2];
  snprintf(wait_why, sizeof wait_why, "%s", wst == TPF_OK ? "" : tpf_last_error());
  const proc_report *rep = tpf_launch_shared(l);
  bool have[TPF_MAX_RANKS];
  tpf_status rs[TPF_MAX_RANKS];
  char why[TPF_MAX_RANKS][PROC_DETAIL];
  for (int r = 0; r < P; r++) {
    have[r] = atomic_load_explicit(&rep[r].reported, memory_order_acquire) == 1;
    if (have[r]) {
      rs[r] = (tpf_status)rep[r].status;
      snprintf(why[r], sizeof why[r], "%s", rep[r].detail);
    } else if (codes[r] == 128 + 9 && wst == TPF_ETIMEOUT) {
      rs[r] = TPF_ETIMEOUT;
      snprintf(why[r], sizeof why[r], "rank %d's process was killed: %s", r, wait_why);
    } else {
      rs[r] = TPF_EBACKEND;
      snprintf(why[r], sizeof why[r],
               "rank %d's process ended with %s %d before reporting (its output above says why)", r,
               codes[r] > 128 ? "signal" : "exit status",
               codes[r] > 128 ? codes[r] - 128 : codes[r]);
    }
  }
  tpf_status rc = arg != NULL ? tpf_launch_merge(l, arg, NULL) : TPF_OK;
  tpf_launch_free(l);
  if (rc != TPF_OK) return rc;
  /* Every failing rank's reason on stderr: the first rank's is often a consequence. */
  int first = -1;
  for (int r = 0; r < P; r++) {
    if (rs[r] == TPF_OK) continue;
    fprintf(stderr, "conformance[cuda-procs] P=%d rank %d: %s: %s\n", P, r, tpf_status_name(rs[r]),
            why[r]);
    if (first < 0) first = r;
  }
  if (first >= 0) return tpf_set_error(rs[first], "rank %d: %s", first, why[first]);
  return TPF_OK;
}

/* The probe child: the device count as its exit status (255: CUDA failed), the reason in msg. */
typedef struct {
  char *msg;
  size_t n;
} probe_arg;

static int probe_devices(void *p) {
  probe_arg *pa = p;
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    snprintf(pa->msg, pa->n, "%s", cudaGetErrorString(e));
    return 255;
  }
  return count > 254 ? 254 : count;
}

static tpf_status proc_env_init(tpf_conf_env *env) {
  char *msg = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (msg == MAP_FAILED) return tpf_set_error(TPF_ENOMEM, "cannot map the probe's message");
  msg[0] = '\0';
  probe_arg pa = {msg, 4096};
  const int count = tpf_launch_in_child(probe_devices, &pa);
  char why[256];
  snprintf(why, sizeof why, "%s", msg);
  munmap(msg, 4096);
  if (count < 1 || count > 254)
    return tpf_set_error(TPF_EUNSUPPORTED, "no GPU (%s)",
                         count == 0 ? "0 devices"
                         : why[0]   ? why
                                    : "the probe process failed");
  g_proc.device_count = count;
  g_proc.fixed_device = -1;
  const char *dev = getenv("TPF_CUDA_TEST_DEVICE");
  if (dev != NULL && *dev) {
    g_proc.fixed_device = atoi(dev);
    if (g_proc.fixed_device < 0 || g_proc.fixed_device >= count)
      return tpf_set_error(TPF_EUNSUPPORTED, "no GPU %d (%d present)", g_proc.fixed_device, count);
  }
  /* Bounds of one run (every P): a rank that dies makes the others fail within the backend's
   * timeout; one that hangs is killed. */
  g_proc.run_timeout_ms = env_ms("TPF_PROC_RUN_TIMEOUT_MS", 900000);
  g_proc.grace_ms = env_ms("TPF_PROC_GRACE_MS", 90000);
  TPF_CHECK(tpf_cuda_conf_env_init_lazy(env));
  env->name = "cuda-procs";
  env->run = proc_run;
  return TPF_OK;
}

int main(int argc, char **argv) {
  /* --procs selects process mode; everything else is the body's. */
  bool procs = false;
  int n = 1;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--procs"))
      procs = true;
    else
      argv[n++] = argv[i];
  }
  argc = n;
  argv[argc] = NULL;
  tpf_conf_env env;
  tpf_status st = procs ? proc_env_init(&env) : tpf_cuda_conf_env_init(&env);
  if (st == TPF_EUNSUPPORTED) {
    printf("skipped: %s\n", tpf_last_error());
    return 77;
  }
  if (st != TPF_OK) {
    printf("conformance[%s]: %s: %s\n", procs ? "cuda-procs" : "cuda", tpf_status_name(st),
           tpf_last_error());
    return 1;
  }
  if (procs)
    printf("conformance[cuda-procs]: every rank its own process; %d GPU(s), rank r on device %s\n",
           g_proc.device_count, g_proc.fixed_device >= 0 ? "TPF_CUDA_TEST_DEVICE" : "r % count");
  /* cuBLASLt sums over k in its own order: GEMM results get SPEC §7's fp32 accumulation-order
   * slack (tpf_ref_order_slack). */
  int rc = tpf_conformance_main(&env, true, argc, argv);
  tpf_cuda_conf_env_free(&env);
  return rc;
}
