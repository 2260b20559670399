/* The process-mode fault cases (proc_faults.h) on the CUDA backend: P forked processes on the
 * GPUs there are (rank r on device r % count; TPF_CUDA_TEST_DEVICE: all on that one), CUDA IPC
 * between them, the launcher's socket bootstrap. This process never touches CUDA (a probe child
 * counts the devices), so the forked ranks can. Exit 77 ("skipped: no GPU") without a device.
 *
 *   test_proc_faults_gpu CASE | all | list
 */
#define _DEFAULT_SOURCE
#define _POSIX_C_SOURCE 200809L
#include "proc_faults.h"
#include "tpflex/tpflex_cuda.h"

#include <cuda_runtime.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static int g_device_count, g_fixed_device = -1;
/* Per rank process. */
static cudaStream_t g_stream;
static void *g_w, *g_d;

static tpf_status cuda_fail(cudaError_t e, const char *what) {
  return tpf_set_error(TPF_EBACKEND, "%s: %s", what, cudaGetErrorString(e));
}

static tpf_status kit_rank_begin(int rank, int *device) {
  *device = g_fixed_device >= 0 ? g_fixed_device : tpf_launch_device(rank, g_device_count);
  cudaError_t e = cudaSetDevice(*device);
  if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking);
  if (e != cudaSuccess) return cuda_fail(e, "cudaSetDevice/cudaStreamCreate");
  const size_t wb = (size_t)PROC_N * PROC_H * 2,
               db = (size_t)PROC_C_PER_RANK * PROC_MAXP * PROC_N * 2;
  e = cudaMalloc(&g_w, wb);
  if (e == cudaSuccess) e = cudaMalloc(&g_d, db);
  if (e == cudaSuccess) e = cudaMemset(g_w, 0, wb);
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  return e == cudaSuccess ? TPF_OK : cuda_fail(e, "operands");
}

static void kit_rank_end(void) {
  if (g_stream != NULL) cudaStreamSynchronize(g_stream);
  cudaFree(g_w);
  cudaFree(g_d);
  if (g_stream != NULL) cudaStreamDestroy(g_stream);
  g_stream = NULL;
  g_w = g_d = NULL;
}

static tpf_status kit_backend_create(const tpf_bootstrap *boot, tpf_backend **out) {
  return tpf_cuda_backend_create(boot, out);
}

static tpf_status kit_set_timeout(tpf_backend *be, unsigned ms) {
  return tpf_cuda_backend_set_timeout(be, ms);
}

/* Holds the caller's stream, so nothing of the operation enqueued behind it runs on the device
 * before the process is killed. */
static void CUDART_CB hold_stream(void *arg) {
  (void)arg;
  struct timespec t = {5, 0};
  nanosleep(&t, NULL);
}

static tpf_status kit_ag_op(tpf_backend *be, tpf_comm *c, bool die_inside) {
  (void)be;
  const tpf_shape a = tpf_comm_active_shape(c);
  tpf_matrix w = {g_w, PROC_N, PROC_H, PROC_H, TPF_BF16};
  tpf_matrix d = {g_d, a.rows, PROC_N, PROC_N, TPF_BF16};
  if (die_inside) {
    cudaLaunchHostFunc(g_stream, hold_stream, NULL);
    /* The host agreement completes (every peer sees this rank arrive), the device work is
     * enqueued behind the held stream, and the process dies with it in flight. */
    tpf_ag_gemm(c, &w, &d, g_stream);
    kill(getpid(), SIGKILL);
  }
  tpf_status st = tpf_ag_gemm(c, &w, &d, g_stream);
  return st != TPF_OK ? st : tpf_comm_sync(c);
}

static tpf_status kit_write(void *dst, const void *src, size_t n) {
  cudaError_t e = cudaMemcpy(dst, src, n, cudaMemcpyHostToDevice);
  return e == cudaSuccess ? TPF_OK : cuda_fail(e, "cudaMemcpy(to device)");
}

static tpf_status kit_read(void *dst, const void *src, size_t n) {
  cudaError_t e = cudaMemcpy(dst, src, n, cudaMemcpyDeviceToHost);
  return e == cudaSuccess ? TPF_OK : cuda_fail(e, "cudaMemcpy(to host)");
}

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

int main(int argc, char **argv) {
  if (argc > 1 && !strcmp(argv[1], "list")) return proc_faults_main(NULL, argc, argv);
  char *msg = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (msg == MAP_FAILED) return 1;
  msg[0] = '\0';
  probe_arg pa = {msg, 4096};
  g_device_count = tpf_launch_in_child(probe_devices, &pa);
  if (g_device_count < 1 || g_device_count > 254) {
    printf("skipped: no GPU (%s)\n", g_device_count == 0 ? "0 devices" : msg[0] ? msg : "probe");
    return 77;
  }
  munmap(msg, 4096);
  const char *dev = getenv("TPF_CUDA_TEST_DEVICE");
  if (dev != NULL && *dev) g_fixed_device = atoi(dev);
  printf("%d GPU(s); rank r on device %s\n", g_device_count,
         g_fixed_device >= 0 ? "TPF_CUDA_TEST_DEVICE" : "r % count");
  const proc_kit kit = {
      .name = "CUDA backend",
      .moves_data = true,
      .timeout_ms = 3000,
      .rank_begin = kit_rank_begin,
      .rank_end = kit_rank_end,
      .backend_create = kit_backend_create,
      .backend_destroy = tpf_cuda_backend_destroy,
      .set_timeout = kit_set_timeout,
      .ag_op = kit_ag_op,
      .write_bytes = kit_write,
      .read_bytes = kit_read,
  };
  return proc_faults_main(&kit, argc, argv);
}
