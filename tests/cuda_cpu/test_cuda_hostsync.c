/* The host agreement of ranks in different processes (backend_cuda/cuda_hostsync.c), with P
 * forked processes and no GPU: agreement, a shape mismatch seen by every rank, a late rank, an
 * operation-key mismatch (same rows, different split count or kind) naming both keys, an absent
 * rank, and nothing left behind in /dev/shm. */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS */
#define _POSIX_C_SOURCE 200809L
#include "cuda_internal.h"
#include "tpf_test.h"

#include <dirent.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { P = 3, SLOT = 512, STEPS = 10 };

typedef struct {
  pthread_barrier_t bar;
  unsigned char buf[P][SLOT];
  int status[P][STEPS]; /* tpf_status of each step, -1 = not run */
  char msg[P][STEPS][256];
} shared;

typedef struct {
  shared *sh;
  int rank;
} ctx;

static tpf_status sh_barrier(void *c) {
  pthread_barrier_wait(&((ctx *)c)->sh->bar);
  return TPF_OK;
}

static tpf_status sh_allgather(void *c, const void *send, void *recv, size_t bytes) {
  ctx *x = c;
  if (bytes > SLOT) return TPF_EINVAL;
  pthread_barrier_wait(&x->sh->bar);
  memcpy(x->sh->buf[x->rank], send, bytes);
  pthread_barrier_wait(&x->sh->bar);
  for (int q = 0; q < P; q++)
    memcpy((unsigned char *)recv + (size_t)q * bytes, x->sh->buf[q], bytes);
  pthread_barrier_wait(&x->sh->bar);
  return TPF_OK;
}

static void record(shared *sh, int rank, int step, tpf_status st) {
  sh->status[rank][step] = (int)st;
  snprintf(sh->msg[rank][step], sizeof sh->msg[rank][step], "%s", tpf_last_error());
}

static void child(shared *sh, int rank) {
  ctx c = {sh, rank};
  tpf_bootstrap boot = {.tp_size = P,
                        .rank = rank,
                        .device = 0,
                        .allgather = sh_allgather,
                        .barrier = sh_barrier,
                        .ctx = &c};
  tpf_cuda_hostsync *h = NULL;
  tpf_status st = tpf_cuda__hostsync_create(&boot, "qkv_fprop", &h);
  record(sh, rank, 0, st == TPF_OK && h ? TPF_OK : TPF_EBACKEND);
  if (!h) _exit(1);
  const uint64_t ms = 1000000ull;
  /* 1-3: agreement, rows changing every operation. */
  for (uint64_t seq = 1; seq <= 3; seq++)
    record(sh, rank, (int)seq, tpf_cuda__hostsync_agree(h, "qkv_fprop", seq, 8 * seq, 2000 * ms));
  /* 4: rank 1 disagrees. */
  record(sh, rank, 4, tpf_cuda__hostsync_agree(h, "qkv_fprop", 4, rank == 1 ? 96 : 48, 2000 * ms));
  /* 5-6: rank 2 comes late into 5; the others wait for it, then all run 6. */
  if (rank == 2) {
    struct timespec t = {0, 50 * 1000 * 1000};
    nanosleep(&t, NULL);
  }
  record(sh, rank, 5, tpf_cuda__hostsync_agree(h, "qkv_fprop", 5, 16, 2000 * ms));
  record(sh, rank, 6, tpf_cuda__hostsync_agree(h, "qkv_fprop", 6, 24, 2000 * ms));
  /* 7: same rows, but rank 0 runs ag_gemm with 4 splits and the others with 8 (what different
   * per-operation num_splits give); 8: same rows and splits, rank 2 runs gemm_rs. */
  const uint8_t k4 = TPF_OP_KEY(TPF_OP_AG_GEMM, 4), k8 = TPF_OP_KEY(TPF_OP_AG_GEMM, 8);
  const uint8_t rs8 = TPF_OP_KEY(TPF_OP_GEMM_RS, 8);
  record(sh, rank, 7,
         tpf_cuda__hostsync_agree(h, "qkv_fprop", 7,
                                  TPF_READY_BODY(TPF_READY_WORD(0, rank == 0 ? k4 : k8, 48)),
                                  2000 * ms));
  record(sh, rank, 8,
         tpf_cuda__hostsync_agree(h, "qkv_fprop", 8,
                                  TPF_READY_BODY(TPF_READY_WORD(0, rank == 2 ? rs8 : k8, 48)),
                                  2000 * ms));
  /* 9: rank 2 never arrives. */
  if (rank != 2) record(sh, rank, 9, tpf_cuda__hostsync_agree(h, "qkv_fprop", 9, 32, 200 * ms));
  tpf_cuda__hostsync_destroy(h);
  _exit(0);
}

static int shm_entries(pid_t pid) {
  char prefix[64];
  snprintf(prefix, sizeof prefix, "tpflex-%ld-", (long)pid);
  DIR *d = opendir("/dev/shm");
  if (!d) return 0;
  int n = 0;
  for (struct dirent *e; (e = readdir(d)) != NULL;)
    n += strncmp(e->d_name, prefix, strlen(prefix)) == 0;
  closedir(d);
  return n;
}

static void test_cuda_hostsync__processes_agree_or_fail_together(void **state) {
  (void)state;
  shared *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  assert_true(sh != MAP_FAILED);
  memset(sh, 0, sizeof *sh);
  for (int r = 0; r < P; r++)
    for (int s = 0; s < STEPS; s++)
      sh->status[r][s] = -1;
  pthread_barrierattr_t at;
  pthread_barrierattr_init(&at);
  pthread_barrierattr_setpshared(&at, PTHREAD_PROCESS_SHARED);
  pthread_barrier_init(&sh->bar, &at, P);
  pid_t kids[P];
  for (int r = 0; r < P; r++) {
    kids[r] = fork();
    assert_true(kids[r] >= 0);
    if (kids[r] == 0) child(sh, r);
  }
  for (int r = 0; r < P; r++) {
    int ws = 0;
    waitpid(kids[r], &ws, 0);
    assert_true(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
  }
  for (int r = 0; r < P; r++) {
    for (int s = 0; s <= 3; s++)
      if (sh->status[r][s] != TPF_OK) fail_msg("rank %d step %d: %s", r, s, sh->msg[r][s]);
    /* The mismatch is seen by every rank, each naming both row counts. */
    if (sh->status[r][4] != TPF_EMISMATCH) fail_msg("rank %d mismatch: %s", r, sh->msg[r][4]);
    assert_non_null(strstr(sh->msg[r][4], "96"));
    assert_non_null(strstr(sh->msg[r][4], "48"));
    assert_non_null(strstr(sh->msg[r][4], "no byte moved"));
    for (int s = 5; s <= 6; s++)
      if (sh->status[r][s] != TPF_OK) fail_msg("rank %d step %d: %s", r, s, sh->msg[r][s]);
    /* Key mismatches: every rank fails, naming both operations; the rows agree. */
    if (sh->status[r][7] != TPF_EMISMATCH) fail_msg("rank %d key mismatch: %s", r, sh->msg[r][7]);
    assert_non_null(strstr(sh->msg[r][7], "ag_gemm/4 splits"));
    assert_non_null(strstr(sh->msg[r][7], "ag_gemm/8 splits"));
    assert_non_null(strstr(sh->msg[r][7], "no byte moved"));
    if (sh->status[r][8] != TPF_EMISMATCH) fail_msg("rank %d kind mismatch: %s", r, sh->msg[r][8]);
    assert_non_null(strstr(sh->msg[r][8], "gemm_rs/8 splits"));
    assert_non_null(strstr(sh->msg[r][8], "ag_gemm/8 splits"));
  }
  /* Rank 0 compares with rank 1 first: 4 splits here, 8 on rank 1. */
  assert_non_null(
      strstr(sh->msg[0][7], "(ag_gemm/4 splits) here but 48 (ag_gemm/8 splits) on rank 1"));
  for (int r = 0; r < 2; r++) {
    if (sh->status[r][9] != TPF_ETIMEOUT) fail_msg("rank %d absent peer: %s", r, sh->msg[r][9]);
    assert_non_null(strstr(sh->msg[r][9], "rank 2"));
  }
  print_message("rank 0, mismatch: %s\nrank 0, key mismatch: %s\nrank 0, absent peer: %s\n",
                sh->msg[0][4], sh->msg[0][7], sh->msg[0][9]);
  /* The forked rank 0 created the table under its own pid and unlinked it. */
  assert_int_equal(shm_entries(kids[0]), 0);
  pthread_barrier_destroy(&sh->bar);
  munmap(sh, sizeof *sh);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cuda_hostsync__processes_agree_or_fail_together),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
