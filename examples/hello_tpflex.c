/* hello_tpflex: the whole API in one page. Two ranks on the simulator (threads of this process)
 * register one RING AG communicator at capacity and run microbatches of changing T through it.
 *
 * Where the backend comes from: every rank needs its own tpf_backend. Here tpf_sim_run starts P
 * rank threads and hands each one its backend. On GPUs a rank fills a tpf_bootstrap
 * (tpf_cuda_threads_bootstrap: ranks as threads of one process; tpf_cuda_nccl_bootstrap or your
 * own allgather/barrier: one process per rank) and calls tpf_cuda_backend_create(&boot, &be)
 * (tpflex_cuda.h); rank_main stays as it is. The stream argument of an operation: NULL on the
 * simulator (the operation has completed when the call returns); on CUDA the cudaStream_t it is
 * enqueued on (tpf_comm_sync waits for it). Collective calls (every rank, same order):
 * tpf_manager_add / tpf_comm_create, the operations, tpf_manager_destroy. Local calls:
 * tpf_manager_create, set_active_shape, legal_rows, views, layout queries (docs/SPEC.md §6).
 * Build (PKG_CONFIG_PATH=<prefix>/lib/pkgconfig; the rpath lets it find libtpflex.so):
 *   cc hello_tpflex.c $(pkg-config --cflags --libs tpflex) \
 *     -Wl,-rpath,$(pkg-config --variable=libdir tpflex) -o hello
 */
#include <stdio.h>
#include <string.h>
#include <tpflex/tpflex.h>
#include <tpflex/tpflex_sim.h>

enum { P = 2, C = 64, H = 16, N = 8 };

static float rows_value(int rank, uint64_t i, uint64_t j) {
  return (float)(rank + 1) * 0.5f + (float)(i + j) * 0.25f;
}

static tpf_status rank_main(tpf_backend *be, int rank, void *arg) {
  (void)arg;
  tpf_manager *m = NULL;
  tpf_comm *fc1 = NULL;
  tpf_status s = tpf_manager_create(be, &m);
  tpf_comm_config cfg = {.name = "fc1_fprop",
                         .algo = TPF_ALGO_RING,
                         .coll = TPF_COLL_AG,
                         .dtype = TPF_FP32,
                         .capacity = {C, H}};
  if (s == TPF_OK) s = tpf_manager_add(m, &cfg, &fc1); /* collective: registers [C, H] once */
  static float w[P][N * H], d[P][C * N];               /* weight [N, H], output [T, N] */
  const uint64_t tokens[] = {11, 64, 37, 3};           /* the microbatches' token counts */
  for (size_t b = 0; s == TPF_OK && b < sizeof tokens / sizeof *tokens; b++) {
    uint64_t t = 0;
    s = tpf_comm_legal_rows(fc1, tokens[b], &t); /* pad to the smallest legal T */
    if (s == TPF_OK) s = tpf_manager_set_active_shape(m, (tpf_shape){t, H}); /* local, no alloc */
    tpf_matrix x;
    if (s == TPF_OK) s = tpf_comm_local_chunk(fc1, &x); /* this rank's [T/P, H] shard */
    for (uint64_t i = 0; s == TPF_OK && i < x.rows; i++)
      for (uint64_t j = 0; j < x.cols; j++)
        ((float *)x.ptr)[i * x.ld + j] = rows_value(rank, i, j);
    for (int k = 0; k < N * H; k++)
      w[rank][k] = (k % H) % N == k / H; /* w[n][h] = (h%N == n) */
    tpf_matrix wm = {w[rank], N, H, H, TPF_FP32}, dm = {d[rank], t, N, N, TPF_FP32};
    if (s == TPF_OK) s = tpf_ag_gemm(fc1, &wm, &dm, NULL); /* d = AG(x) * w^T; NULL: simulator */
    double worst = 0; /* d[i][n] = x[i][n] + x[i][n + N], x row i from rank i / (T/P) */
    for (uint64_t i = 0; s == TPF_OK && i < t * N; i++) {
      uint64_t row = i / N, n = i % N, owner = row / (t / P), li = row % (t / P);
      double want = rows_value((int)owner, li, n) + rows_value((int)owner, li, n + N);
      double err = d[rank][i] > want ? d[rank][i] - want : want - d[rank][i];
      if (err > worst) worst = err;
    }
    if (s == TPF_OK && rank == 0)
      printf("microbatch %zu: %3llu tokens -> T = %3llu rows, epoch %llu, max error %.1e %s\n", b,
             (unsigned long long)tokens[b], (unsigned long long)t,
             (unsigned long long)tpf_comm_epoch(fc1), worst, worst < 1e-5 ? "OK" : "WRONG");
    if (s == TPF_OK && worst >= 1e-5) s = TPF_EBACKEND;
  }
  if (s != TPF_OK) fprintf(stderr, "rank %d: %s: %s\n", rank, tpf_status_name(s), tpf_last_error());
  if (m) tpf_manager_destroy(m); /* collective: deregisters every communicator */
  return s;
}

int main(void) {
  tpf_sim_config cfg = {.tp_size = P};
  tpf_sim_world *world = NULL;
  tpf_status s = tpf_sim_world_create(&cfg, &world);
  if (s == TPF_OK) s = tpf_sim_run(world, rank_main, NULL); /* rank_main on P threads */
  if (world) tpf_sim_world_destroy(world);
  printf("hello_tpflex: %s\n", s == TPF_OK ? "every microbatch OK" : tpf_status_name(s));
  return s == TPF_OK ? 0 : 1;
}
