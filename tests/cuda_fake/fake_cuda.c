/* The counting stand-in for cudart / cuBLASLt / the driver entry points (what and why:
 * fake_cuda.h). Every definition here has the prototype of the real header it includes, so the
 * compiler checks each signature against the toolkit's. Kernels and GEMMs are counted, never run.
 */
#define _GNU_SOURCE
#include "fake_cuda.h"

#include <cublasLt.h>
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- counters ---------------------------------------------------------------------------- */

#define FAKE_MAX_KERNELS 64

typedef struct {
  const void *host_fun; /* the host stub nvcc registered */
  const char *name;     /* its device (mangled) name */
} fake_kernel;

static fake_kernel g_kernels[FAKE_MAX_KERNELS];
static _Atomic int g_num_kernels;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

static _Thread_local tpf_fake_counts t_counts;
static _Thread_local uint64_t t_launch_by_kernel[FAKE_MAX_KERNELS];
static _Atomic uint64_t g_calls[TPF_FAKE_NUM_KINDS];
static _Atomic uint64_t g_total, g_live;
static _Atomic uint64_t g_mm_m, g_mm_n, g_mm_k;

/* The configured fault: the n-th call of `name` fails. */
static char g_fail_name[96];
static _Atomic uint64_t g_fail_n, g_fail_seen;
static int g_fail_code = -1;
static pthread_once_t g_env_once = PTHREAD_ONCE_INIT;

static void fake_read_env(void) {
  const char *e = getenv("TPF_FAKE_CUDA_FAIL");
  if (e == NULL || *e == '\0') return;
  char buf[sizeof g_fail_name];
  snprintf(buf, sizeof buf, "%s", e);
  char *c1 = strchr(buf, ':');
  if (c1 == NULL) return;
  *c1 = '\0';
  char *c2 = strchr(c1 + 1, ':');
  if (c2 != NULL) {
    *c2 = '\0';
    g_fail_code = atoi(c2 + 1);
  }
  snprintf(g_fail_name, sizeof g_fail_name, "%s", buf);
  atomic_store(&g_fail_n, strtoull(c1 + 1, NULL, 10));
}

/* Counts one call of `name` (kind k); returns nonzero when this call is the one to fail. */
static int fake_call(tpf_fake_kind k, const char *name) {
  pthread_once(&g_env_once, fake_read_env);
  t_counts.calls[k]++;
  t_counts.total++;
  atomic_fetch_add(&g_calls[k], 1);
  atomic_fetch_add(&g_total, 1);
  uint64_t n = atomic_load(&g_fail_n);
  if (n == 0 || strcmp(name, g_fail_name) != 0) return 0;
  return atomic_fetch_add(&g_fail_seen, 1) + 1 == n;
}

/* The calling thread's last error, as cudaGetLastError reports it (a kernel launch's error
 * reaches its caller only there: nvcc's launch stub drops the launch call's return). */
static _Thread_local cudaError_t t_last_error;

static cudaError_t fake_rt(tpf_fake_kind k, const char *name) {
  if (!fake_call(k, name)) return cudaSuccess;
  t_last_error = g_fail_code >= 0 ? (cudaError_t)g_fail_code : cudaErrorLaunchFailure;
  return t_last_error;
}

static cublasStatus_t fake_lt(tpf_fake_kind k, const char *name) {
  if (!fake_call(k, name)) return CUBLAS_STATUS_SUCCESS;
  return g_fail_code >= 0 ? (cublasStatus_t)g_fail_code : CUBLAS_STATUS_EXECUTION_FAILED;
}

void tpf_fake_cuda_counts(int scope, tpf_fake_counts *out) {
  if (scope == TPF_FAKE_THREAD) {
    *out = t_counts;
  } else {
    memset(out, 0, sizeof *out);
    for (int k = 0; k < TPF_FAKE_NUM_KINDS; k++)
      out->calls[k] = atomic_load(&g_calls[k]);
    out->total = atomic_load(&g_total);
    out->matmul_m = atomic_load(&g_mm_m);
    out->matmul_n = atomic_load(&g_mm_n);
    out->matmul_k = atomic_load(&g_mm_k);
  }
  out->live_allocs = atomic_load(&g_live);
}

void tpf_fake_cuda_reset(int scope) {
  memset(&t_counts, 0, sizeof t_counts);
  memset(t_launch_by_kernel, 0, sizeof t_launch_by_kernel);
  if (scope != TPF_FAKE_PROCESS) return;
  for (int k = 0; k < TPF_FAKE_NUM_KINDS; k++)
    atomic_store(&g_calls[k], 0);
  atomic_store(&g_total, 0);
  atomic_store(&g_fail_seen, 0);
}

int tpf_fake_cuda_launches(const char **names, uint64_t *counts, int cap) {
  int n = 0, nk = atomic_load(&g_num_kernels);
  for (int i = 0; i < nk; i++) {
    if (t_launch_by_kernel[i] == 0) continue;
    if (n < cap) {
      names[n] = g_kernels[i].name;
      counts[n] = t_launch_by_kernel[i];
    }
    n++;
  }
  return n;
}

void tpf_fake_cuda_fail_at(const char *call, uint64_t n) {
  pthread_once(&g_env_once, fake_read_env);
  snprintf(g_fail_name, sizeof g_fail_name, "%s", call ? call : "");
  atomic_store(&g_fail_seen, 0);
  atomic_store(&g_fail_n, call ? n : 0);
}

int tpf_fake_cuda_fault_fired(void) {
  const uint64_t n = atomic_load(&g_fail_n);
  return n != 0 && atomic_load(&g_fail_seen) >= n;
}

int tpf_fake_cuda_active(void) {
  Dl_info info;
  void *p = dlsym(RTLD_DEFAULT, "cudaMalloc");
  return p != NULL && dladdr(p, &info) != 0 && info.dli_fname != NULL &&
         strstr(info.dli_fname, "tpf_fake_cuda") != NULL;
}

const char *tpf_fake_cuda_format(const tpf_fake_counts *c, char *buf, int cap) {
  static const char *names[TPF_FAKE_NUM_KINDS] = {
      "matmul", "launch", "memcpy", "memset", "record",   "wait",    "query",
      "sync",   "memop",  "alloc",  "free",   "lt_setup", "lt_attr", "other"};
  int off = 0;
  for (int k = 0; k < TPF_FAKE_NUM_KINDS && off < cap; k++)
    off += snprintf(buf + off, (size_t)(cap - off), "%s%s %llu", k ? " " : "", names[k],
                    (unsigned long long)c->calls[k]);
  return buf;
}

/* ---- memory ------------------------------------------------------------------------------ */

static void *fake_alloc(size_t bytes) {
  void *p = NULL;
  size_t n = bytes == 0 ? 256 : (bytes + 255) / 256 * 256;
  if (posix_memalign(&p, 256, n) != 0) return NULL;
  /* Device memory is not zeroed: neither is the head of this (the rest stays untouched: a 32 MiB
   * cuBLASLt workspace per backend would otherwise cost page faults, not test anything). */
  memset(p, 0xA5, n < (64u << 10) ? n : (64u << 10));
  atomic_fetch_add(&g_live, 1);
  return p;
}

cudaError_t cudaMalloc(void **devPtr, size_t size) {
  cudaError_t e = fake_rt(TPF_FAKE_ALLOC, "cudaMalloc");
  if (e != cudaSuccess) return e;
  *devPtr = fake_alloc(size);
  return *devPtr ? cudaSuccess : cudaErrorMemoryAllocation;
}

cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags) {
  (void)flags;
  cudaError_t e = fake_rt(TPF_FAKE_ALLOC, "cudaHostAlloc");
  if (e != cudaSuccess) return e;
  *pHost = fake_alloc(size);
  return *pHost ? cudaSuccess : cudaErrorMemoryAllocation;
}

cudaError_t cudaMallocHost(void **ptr, size_t size) {
  return cudaHostAlloc(ptr, size, 0);
}

static cudaError_t fake_free(void *p, const char *name) {
  cudaError_t e = fake_rt(TPF_FAKE_FREE, name);
  if (e != cudaSuccess) return e;
  if (p != NULL) {
    free(p);
    atomic_fetch_sub(&g_live, 1);
  }
  return cudaSuccess;
}

cudaError_t cudaFree(void *devPtr) {
  return fake_free(devPtr, "cudaFree");
}

cudaError_t cudaFreeHost(void *ptr) {
  return fake_free(ptr, "cudaFreeHost");
}

cudaError_t cudaHostGetDevicePointer(void **pDevice, void *pHost, unsigned int flags) {
  (void)flags;
  *pDevice = pHost;
  return fake_rt(TPF_FAKE_OTHER, "cudaHostGetDevicePointer");
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                            cudaStream_t stream) {
  (void)kind, (void)stream;
  cudaError_t e = fake_rt(TPF_FAKE_MEMCPY, "cudaMemcpyAsync");
  if (e == cudaSuccess && count > 0) memmove(dst, src, count);
  return e;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind) {
  return cudaMemcpyAsync(dst, src, count, kind, NULL);
}

cudaError_t cudaMemsetAsync(void *devPtr, int value, size_t count, cudaStream_t stream) {
  (void)stream;
  cudaError_t e = fake_rt(TPF_FAKE_MEMSET, "cudaMemsetAsync");
  if (e == cudaSuccess && count > 0) memset(devPtr, value, count);
  return e;
}

cudaError_t cudaMemset(void *devPtr, int value, size_t count) {
  return cudaMemsetAsync(devPtr, value, count, NULL);
}

/* ---- device, streams, events ------------------------------------------------------------- */

cudaError_t cudaSetDevice(int device) {
  return device == 0 ? fake_rt(TPF_FAKE_OTHER, "cudaSetDevice") : cudaErrorInvalidDevice;
}

cudaError_t cudaGetDevice(int *device) {
  *device = 0;
  return fake_rt(TPF_FAKE_OTHER, "cudaGetDevice");
}

cudaError_t cudaGetDeviceCount(int *count) {
  *count = 1;
  return fake_rt(TPF_FAKE_OTHER, "cudaGetDeviceCount");
}

cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device) {
  (void)device;
  *value = attr == cudaDevAttrMultiProcessorCount ? 132 : 1;
  return fake_rt(TPF_FAKE_OTHER, "cudaDeviceGetAttribute");
}

cudaError_t cudaDeviceGetStreamPriorityRange(int *leastPriority, int *greatestPriority) {
  if (leastPriority) *leastPriority = 0;
  if (greatestPriority) *greatestPriority = -5;
  return fake_rt(TPF_FAKE_OTHER, "cudaDeviceGetStreamPriorityRange");
}

cudaError_t cudaDeviceCanAccessPeer(int *canAccessPeer, int device, int peerDevice) {
  *canAccessPeer = device != peerDevice;
  return fake_rt(TPF_FAKE_OTHER, "cudaDeviceCanAccessPeer");
}

cudaError_t cudaDeviceEnablePeerAccess(int peerDevice, unsigned int flags) {
  (void)peerDevice, (void)flags;
  return fake_rt(TPF_FAKE_OTHER, "cudaDeviceEnablePeerAccess");
}

cudaError_t cudaDeviceSynchronize(void) {
  return fake_rt(TPF_FAKE_SYNC, "cudaDeviceSynchronize");
}

/* A stream or event is a small heap object: distinct, non-NULL handles. */
typedef struct {
  int magic;
} fake_obj;

static cudaError_t fake_new(void **out, const char *name) {
  cudaError_t e = fake_rt(TPF_FAKE_OTHER, name);
  if (e != cudaSuccess) return e;
  fake_obj *o = calloc(1, sizeof *o);
  if (o == NULL) return cudaErrorMemoryAllocation;
  o->magic = 0x5eed;
  *out = o;
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *pStream) {
  return fake_new((void **)pStream, "cudaStreamCreate");
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags) {
  (void)flags;
  return fake_new((void **)pStream, "cudaStreamCreateWithFlags");
}

cudaError_t cudaStreamCreateWithPriority(cudaStream_t *pStream, unsigned int flags, int priority) {
  (void)flags, (void)priority;
  return fake_new((void **)pStream, "cudaStreamCreateWithPriority");
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  free(stream);
  return fake_rt(TPF_FAKE_OTHER, "cudaStreamDestroy");
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  (void)stream;
  return fake_rt(TPF_FAKE_SYNC, "cudaStreamSynchronize");
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
  (void)stream;
  return fake_rt(TPF_FAKE_QUERY, "cudaStreamQuery");
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream,
                                  enum cudaStreamCaptureStatus *pCaptureStatus) {
  (void)stream;
  *pCaptureStatus = cudaStreamCaptureStatusNone;
  return fake_rt(TPF_FAKE_QUERY, "cudaStreamIsCapturing");
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
  (void)stream, (void)event, (void)flags;
  return fake_rt(TPF_FAKE_STREAM_WAIT, "cudaStreamWaitEvent");
}

cudaError_t cudaEventCreate(cudaEvent_t *event) {
  return fake_new((void **)event, "cudaEventCreate");
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags) {
  (void)flags;
  return fake_new((void **)event, "cudaEventCreateWithFlags");
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  free(event);
  return fake_rt(TPF_FAKE_OTHER, "cudaEventDestroy");
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  (void)event, (void)stream;
  return fake_rt(TPF_FAKE_EVENT_RECORD, "cudaEventRecord");
}

cudaError_t cudaEventRecordWithFlags(cudaEvent_t event, cudaStream_t stream, unsigned int flags) {
  (void)event, (void)stream, (void)flags;
  return fake_rt(TPF_FAKE_EVENT_RECORD, "cudaEventRecordWithFlags");
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  (void)event;
  return fake_rt(TPF_FAKE_QUERY, "cudaEventQuery");
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  (void)event;
  return fake_rt(TPF_FAKE_SYNC, "cudaEventSynchronize");
}

/* No time passes on a fake device: elapsed times are refused rather than made up. */
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end) {
  (void)ms, (void)start, (void)end;
  fake_call(TPF_FAKE_OTHER, "cudaEventElapsedTime");
  return cudaErrorNotSupported;
}

/* Errors are not sticky here (no context is lost): the last one is reported once. */
cudaError_t cudaGetLastError(void) {
  cudaError_t e = t_last_error;
  t_last_error = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError(void) {
  return t_last_error;
}

const char *cudaGetErrorString(cudaError_t error) {
  return error == cudaSuccess ? "no error (fake CUDA)" : "an injected error (fake CUDA)";
}

const char *cudaGetErrorName(cudaError_t error) {
  return error == cudaSuccess ? "cudaSuccess" : "cudaErrorFake";
}

/* IPC is not modelled (ranks in other processes): refused, so process mode fails cleanly. */
cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t *handle, void *devPtr) {
  (void)handle, (void)devPtr;
  fake_call(TPF_FAKE_OTHER, "cudaIpcGetMemHandle");
  return cudaErrorNotSupported;
}

cudaError_t cudaIpcOpenMemHandle(void **devPtr, cudaIpcMemHandle_t handle, unsigned int flags) {
  (void)devPtr, (void)handle, (void)flags;
  fake_call(TPF_FAKE_OTHER, "cudaIpcOpenMemHandle");
  return cudaErrorNotSupported;
}

cudaError_t cudaIpcCloseMemHandle(void *devPtr) {
  (void)devPtr;
  return fake_rt(TPF_FAKE_OTHER, "cudaIpcCloseMemHandle");
}

/* ---- driver entry points: stream memory operations on host words -------------------------- */

static CUresult fake_cu(const char *name) {
  return fake_call(TPF_FAKE_MEMOP, name) ? CUDA_ERROR_LAUNCH_FAILED : CUDA_SUCCESS;
}

static CUresult fake_write64(CUstream s, CUdeviceptr addr, cuuint64_t value, unsigned int flags) {
  (void)s, (void)flags;
  CUresult r = fake_cu("cuStreamWriteValue64");
  if (r == CUDA_SUCCESS) atomic_store((_Atomic uint64_t *)(uintptr_t)addr, value);
  return r;
}

static CUresult fake_wait64(CUstream s, CUdeviceptr addr, cuuint64_t value, unsigned int flags) {
  (void)s, (void)addr, (void)value, (void)flags;
  return fake_cu("cuStreamWaitValue64");
}

static CUresult fake_batch(CUstream s, unsigned int count, CUstreamBatchMemOpParams *ops,
                           unsigned int flags) {
  (void)s, (void)flags;
  CUresult r = fake_cu("cuStreamBatchMemOp");
  for (unsigned i = 0; r == CUDA_SUCCESS && i < count; i++)
    if (ops[i].operation == CU_STREAM_MEM_OP_WRITE_VALUE_64)
      atomic_store((_Atomic uint64_t *)(uintptr_t)ops[i].writeValue.address,
                   ops[i].writeValue.value64);
  return r;
}

static CUresult fake_attr(int *pi, CUdevice_attribute attrib, CUdevice dev) {
  (void)attrib, (void)dev;
  *pi = 1;
  return CUDA_SUCCESS;
}

cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **funcPtr,
                                             unsigned int cudaVersion, unsigned long long flags,
                                             enum cudaDriverEntryPointQueryResult *driverStatus) {
  (void)cudaVersion, (void)flags;
  cudaError_t e = fake_rt(TPF_FAKE_OTHER, "cudaGetDriverEntryPointByVersion");
  void *fn = NULL;
  if (strcmp(symbol, "cuStreamWriteValue64") == 0) fn = (void *)fake_write64;
  if (strcmp(symbol, "cuStreamWaitValue64") == 0) fn = (void *)fake_wait64;
  if (strcmp(symbol, "cuStreamBatchMemOp") == 0) fn = (void *)fake_batch;
  if (strcmp(symbol, "cuDeviceGetAttribute") == 0) fn = (void *)fake_attr;
  *funcPtr = fn;
  if (driverStatus)
    *driverStatus = fn ? cudaDriverEntryPointSuccess : cudaDriverEntryPointSymbolNotFound;
  return e;
}

/* ---- kernels: nvcc's registration and launch ABI ------------------------------------------ */

static _Thread_local struct {
  dim3 grid, block;
  size_t shmem;
  void *stream;
} t_cfg;

void **__cudaRegisterFatBinary(void *fatCubin);
void __cudaRegisterFatBinaryEnd(void **fatCubinHandle);
void __cudaUnregisterFatBinary(void **fatCubinHandle);
void __cudaRegisterFunction(void **fatCubinHandle, const char *hostFun, char *deviceFun,
                            const char *deviceName, int thread_limit, uint3 *tid, uint3 *bid,
                            dim3 *bDim, dim3 *gDim, int *wSize);
unsigned __cudaPushCallConfiguration(dim3 gridDim, dim3 blockDim, size_t sharedMem, void *stream);
cudaError_t __cudaPopCallConfiguration(dim3 *gridDim, dim3 *blockDim, size_t *sharedMem,
                                       void *stream);
cudaError_t __cudaGetKernel(cudaKernel_t *kernel, const void *hostFun);
cudaError_t __cudaLaunchKernel(cudaKernel_t kernel, dim3 gridDim, dim3 blockDim, void **args,
                               size_t sharedMem, cudaStream_t stream);

static void *g_fatbin_handle;

void **__cudaRegisterFatBinary(void *fatCubin) {
  g_fatbin_handle = fatCubin;
  return &g_fatbin_handle;
}

void __cudaRegisterFatBinaryEnd(void **fatCubinHandle) {
  (void)fatCubinHandle;
}

void __cudaUnregisterFatBinary(void **fatCubinHandle) {
  (void)fatCubinHandle;
}

void __cudaRegisterFunction(void **fatCubinHandle, const char *hostFun, char *deviceFun,
                            const char *deviceName, int thread_limit, uint3 *tid, uint3 *bid,
                            dim3 *bDim, dim3 *gDim, int *wSize) {
  (void)fatCubinHandle, (void)deviceFun, (void)thread_limit, (void)tid, (void)bid, (void)bDim;
  (void)gDim, (void)wSize;
  pthread_mutex_lock(&g_lock);
  int n = atomic_load(&g_num_kernels);
  if (n < FAKE_MAX_KERNELS) {
    g_kernels[n].host_fun = hostFun;
    g_kernels[n].name = deviceName;
    atomic_store(&g_num_kernels, n + 1);
  }
  pthread_mutex_unlock(&g_lock);
}

unsigned __cudaPushCallConfiguration(dim3 gridDim, dim3 blockDim, size_t sharedMem, void *stream) {
  t_cfg.grid = gridDim;
  t_cfg.block = blockDim;
  t_cfg.shmem = sharedMem;
  t_cfg.stream = stream;
  return 0;
}

cudaError_t __cudaPopCallConfiguration(dim3 *gridDim, dim3 *blockDim, size_t *sharedMem,
                                       void *stream) {
  *gridDim = t_cfg.grid;
  *blockDim = t_cfg.block;
  *sharedMem = t_cfg.shmem;
  *(void **)stream = t_cfg.stream;
  return cudaSuccess;
}

/* The handle of a kernel is 1 + its index in the registry (never NULL). */
cudaError_t __cudaGetKernel(cudaKernel_t *kernel, const void *hostFun) {
  int n = atomic_load(&g_num_kernels);
  for (int i = 0; i < n; i++)
    if (g_kernels[i].host_fun == hostFun) {
      *kernel = (cudaKernel_t)(uintptr_t)(i + 1);
      return cudaSuccess;
    }
  return cudaErrorInvalidDeviceFunction;
}

static cudaError_t fake_launch(int index) {
  if (index >= 0 && index < FAKE_MAX_KERNELS) t_launch_by_kernel[index]++;
  return fake_rt(TPF_FAKE_LAUNCH, "launch");
}

cudaError_t __cudaLaunchKernel(cudaKernel_t kernel, dim3 gridDim, dim3 blockDim, void **args,
                               size_t sharedMem, cudaStream_t stream) {
  (void)gridDim, (void)blockDim, (void)args, (void)sharedMem, (void)stream;
  return fake_launch((int)(uintptr_t)kernel - 1);
}

/* The launch path of toolkits before CUDA 13 (and of explicit cudaLaunchKernel calls). */
cudaError_t cudaLaunchKernel(const void *func, dim3 gridDim, dim3 blockDim, void **args,
                             size_t sharedMem, cudaStream_t stream) {
  (void)gridDim, (void)blockDim, (void)args, (void)sharedMem, (void)stream;
  cudaKernel_t k = NULL;
  return fake_launch(__cudaGetKernel(&k, func) == cudaSuccess ? (int)(uintptr_t)k - 1 : -1);
}

/* ---- cuBLASLt ----------------------------------------------------------------------------- */

/* The opaque descriptors are ours to fill: a layout keeps rows and cols, a desc its TRANSA. */
enum { L_ROWS = 0, L_COLS = 1 };
enum { D_TRANSA = 0 };

cublasStatus_t cublasLtCreate(cublasLtHandle_t *lightHandle) {
  cublasStatus_t s = fake_lt(TPF_FAKE_OTHER, "cublasLtCreate");
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  *lightHandle = calloc(1, 64);
  return *lightHandle ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_ALLOC_FAILED;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t lightHandle) {
  free(lightHandle);
  return fake_lt(TPF_FAKE_OTHER, "cublasLtDestroy");
}

const char *cublasLtGetStatusString(cublasStatus_t status) {
  return status == CUBLAS_STATUS_SUCCESS ? "CUBLAS_STATUS_SUCCESS (fake)"
                                         : "an injected cuBLASLt error (fake)";
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *matmulDesc,
                                        cublasComputeType_t computeType, cudaDataType_t scaleType) {
  (void)computeType, (void)scaleType;
  cublasStatus_t s = fake_lt(TPF_FAKE_LT_SETUP, "cublasLtMatmulDescCreate");
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  *matmulDesc = calloc(1, sizeof(cublasLtMatmulDescOpaque_t));
  return *matmulDesc ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_ALLOC_FAILED;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmulDesc) {
  free(matmulDesc);
  return fake_lt(TPF_FAKE_LT_SETUP, "cublasLtMatmulDescDestroy");
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t matmulDesc,
                                              cublasLtMatmulDescAttributes_t attr, const void *buf,
                                              size_t sizeInBytes) {
  if (attr == CUBLASLT_MATMUL_DESC_TRANSA && sizeInBytes == sizeof(int32_t))
    matmulDesc->data[D_TRANSA] = (uint64_t) * (const int32_t *)buf;
  return fake_lt(TPF_FAKE_LT_ATTR, "cublasLtMatmulDescSetAttribute");
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *matLayout, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld) {
  (void)type, (void)ld;
  cublasStatus_t s = fake_lt(TPF_FAKE_LT_SETUP, "cublasLtMatrixLayoutCreate");
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  *matLayout = calloc(1, sizeof(cublasLtMatrixLayoutOpaque_t));
  if (*matLayout == NULL) return CUBLAS_STATUS_ALLOC_FAILED;
  (*matLayout)->data[L_ROWS] = rows;
  (*matLayout)->data[L_COLS] = cols;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t matLayout) {
  free(matLayout);
  return fake_lt(TPF_FAKE_LT_SETUP, "cublasLtMatrixLayoutDestroy");
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *pref) {
  cublasStatus_t s = fake_lt(TPF_FAKE_LT_SETUP, "cublasLtMatmulPreferenceCreate");
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  *pref = calloc(1, sizeof(cublasLtMatmulPreferenceOpaque_t));
  return *pref ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_ALLOC_FAILED;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  free(pref);
  return fake_lt(TPF_FAKE_LT_SETUP, "cublasLtMatmulPreferenceDestroy");
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void *buf, size_t sizeInBytes) {
  (void)pref, (void)attr, (void)buf, (void)sizeInBytes;
  return fake_lt(TPF_FAKE_LT_SETUP, "cublasLtMatmulPreferenceSetAttribute");
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(
    cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t operationDesc, cublasLtMatrixLayout_t Adesc,
    cublasLtMatrixLayout_t Bdesc, cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
    cublasLtMatmulPreference_t preference, int requestedAlgoCount,
    cublasLtMatmulHeuristicResult_t heuristicResultsArray[], int *returnAlgoCount) {
  (void)lightHandle, (void)operationDesc, (void)Adesc, (void)Bdesc, (void)Cdesc, (void)Ddesc;
  (void)preference;
  cublasStatus_t s = fake_lt(TPF_FAKE_LT_SETUP, "cublasLtMatmulAlgoGetHeuristic");
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  if (requestedAlgoCount < 1) return CUBLAS_STATUS_INVALID_VALUE;
  memset(&heuristicResultsArray[0], 0, sizeof heuristicResultsArray[0]);
  heuristicResultsArray[0].state = CUBLAS_STATUS_SUCCESS;
  heuristicResultsArray[0].wavesCount = 1.0f;
  *returnAlgoCount = 1;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc,
                              const void *alpha, const void *A, cublasLtMatrixLayout_t Adesc,
                              const void *B, cublasLtMatrixLayout_t Bdesc, const void *beta,
                              const void *C, cublasLtMatrixLayout_t Cdesc, void *D,
                              cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t *algo,
                              void *workspace, size_t workspaceSizeInBytes, cudaStream_t stream) {
  (void)lightHandle, (void)alpha, (void)A, (void)B, (void)beta, (void)C, (void)Cdesc, (void)D;
  (void)Bdesc, (void)algo, (void)workspace, (void)workspaceSizeInBytes, (void)stream;
  cublasStatus_t s = fake_lt(TPF_FAKE_MATMUL, "cublasLtMatmul");
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  uint64_t m = Ddesc->data[L_ROWS], n = Ddesc->data[L_COLS];
  uint64_t k =
      computeDesc->data[D_TRANSA] == CUBLAS_OP_N ? Adesc->data[L_COLS] : Adesc->data[L_ROWS];
  t_counts.matmul_m = m, t_counts.matmul_n = n, t_counts.matmul_k = k;
  atomic_store(&g_mm_m, m), atomic_store(&g_mm_n, n), atomic_store(&g_mm_k, k);
  return CUBLAS_STATUS_SUCCESS;
}
