/* The counting stand-in for cudart / cuBLASLt / the driver entry points (what and why:
 * fake_cuda.h). Every definition here has the prototype of the real header it includes, so the
 * compiler checks each signature against the toolkit's. Kernels and GEMMs are counted, never run.
 */
#define _GNU_SOURCE
#include "fake_cuda.h"

#include "cuda_internal.h" /* the kernels' argument structs (exec mode) */

#include <cublasLt.h>
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

/* TPF_FAKE_CUDA_EXEC=1: run the backend's kernels and GEMMs on the host (see fake_cuda.h). */
static int g_exec;

static void fake_read_env(void) {
  const char *x = getenv("TPF_FAKE_CUDA_EXEC");
  g_exec = x != NULL && x[0] == '1';
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

cudaError_t cudaMallocAsync(void **devPtr, size_t size, cudaStream_t hStream) {
  (void)hStream;
  return cudaMalloc(devPtr, size);
}

cudaError_t cudaFreeAsync(void *devPtr, cudaStream_t hStream) {
  (void)hStream;
  return fake_free(devPtr, "cudaFreeAsync");
}

cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t *memPool, int device) {
  static int pool;
  (void)device;
  *memPool = (cudaMemPool_t)(void *)&pool;
  return fake_rt(TPF_FAKE_OTHER, "cudaDeviceGetDefaultMemPool");
}

cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t memPool, enum cudaMemPoolAttr attr, void *value) {
  (void)memPool, (void)attr, (void)value;
  return fake_rt(TPF_FAKE_OTHER, "cudaMemPoolSetAttribute");
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

cudaError_t cudaMemcpyPeerAsync(void *dst, int dstDevice, const void *src, int srcDevice,
                                size_t count, cudaStream_t stream) {
  (void)dstDevice, (void)srcDevice;
  return cudaMemcpyAsync(dst, src, count, cudaMemcpyDefault, stream);
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind) {
  return cudaMemcpyAsync(dst, src, count, kind, NULL);
}

cudaError_t cudaMemsetAsync(void *devPtr, int value, size_t count, cudaStream_t stream) {
  (void)stream;
  cudaError_t e = fake_rt(TPF_FAKE_MEMSET, "cudaMemsetAsync");
  /* The benches' L2 flush (1 GiB before every timed repetition) is counted, not written: its
   * bytes are never read. Anything smaller (registrations, operands) is written. */
  if (e == cudaSuccess && count > 0 && count < (256u << 20)) memset(devPtr, value, count);
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

/* A stream or event is a small heap object: distinct, non-NULL handles. An event keeps its
 * flags and the host time of its last record (exec mode's elapsed times). */
typedef struct {
  int magic;
  unsigned flags;
  double recorded_ms; /* < 0: never recorded */
} fake_obj;

static cudaError_t fake_new(void **out, const char *name, unsigned flags) {
  cudaError_t e = fake_rt(TPF_FAKE_OTHER, name);
  if (e != cudaSuccess) return e;
  fake_obj *o = calloc(1, sizeof *o);
  if (o == NULL) return cudaErrorMemoryAllocation;
  o->magic = 0x5eed;
  o->flags = flags;
  o->recorded_ms = -1.0;
  *out = o;
  return cudaSuccess;
}

static double fake_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static void fake_record(cudaEvent_t event) {
  ((fake_obj *)(void *)event)->recorded_ms = fake_now_ms();
}

cudaError_t cudaStreamCreate(cudaStream_t *pStream) {
  return fake_new((void **)pStream, "cudaStreamCreate", 0);
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags) {
  (void)flags;
  return fake_new((void **)pStream, "cudaStreamCreateWithFlags", 0);
}

cudaError_t cudaStreamCreateWithPriority(cudaStream_t *pStream, unsigned int flags, int priority) {
  (void)flags, (void)priority;
  return fake_new((void **)pStream, "cudaStreamCreateWithPriority", 0);
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
  return fake_new((void **)event, "cudaEventCreate", 0);
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags) {
  return fake_new((void **)event, "cudaEventCreateWithFlags", flags);
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  free(event);
  return fake_rt(TPF_FAKE_OTHER, "cudaEventDestroy");
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  (void)stream;
  cudaError_t e = fake_rt(TPF_FAKE_EVENT_RECORD, "cudaEventRecord");
  if (e == cudaSuccess) fake_record(event);
  return e;
}

cudaError_t cudaEventRecordWithFlags(cudaEvent_t event, cudaStream_t stream, unsigned int flags) {
  (void)stream, (void)flags;
  cudaError_t e = fake_rt(TPF_FAKE_EVENT_RECORD, "cudaEventRecordWithFlags");
  if (e == cudaSuccess) fake_record(event);
  return e;
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  (void)event;
  return fake_rt(TPF_FAKE_QUERY, "cudaEventQuery");
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  (void)event;
  return fake_rt(TPF_FAKE_SYNC, "cudaEventSynchronize");
}

/* Counting mode: no work runs, so no time is given (refused rather than made up). Exec mode:
 * the host time between the two records, i.e. how long the fake took to run what was enqueued
 * between them on this CPU; it lets the benches' code run, and says nothing about a GPU. Events
 * created without timing are refused as CUDA refuses them. */
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end) {
  cudaError_t e = fake_rt(TPF_FAKE_OTHER, "cudaEventElapsedTime");
  if (e != cudaSuccess) return e;
  const fake_obj *a = (const fake_obj *)(void *)start, *b = (const fake_obj *)(void *)end;
  if (!g_exec) return t_last_error = cudaErrorNotSupported;
  if ((a->flags | b->flags) & cudaEventDisableTiming)
    return t_last_error = cudaErrorInvalidResourceHandle;
  if (a->recorded_ms < 0 || b->recorded_ms < 0)
    return t_last_error = cudaErrorInvalidResourceHandle;
  *ms = (float)(b->recorded_ms - a->recorded_ms);
  return cudaSuccess;
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
  return error == cudaSuccess ? "no error (fake CUDA)"
                              : "an error under the fake CUDA (an injected fault, or a call it "
                                "does not model, which the real runtime answered)";
}

const char *cudaGetErrorName(cudaError_t error) {
  static _Thread_local char buf[48];
  snprintf(buf, sizeof buf, "cudaError %d (fake CUDA)", (int)error);
  return error == cudaSuccess ? "cudaSuccess" : buf;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device) {
  cudaError_t e = fake_rt(TPF_FAKE_OTHER, "cudaGetDeviceProperties");
  if (e != cudaSuccess) return e;
  if (device != 0) return t_last_error = cudaErrorInvalidDevice;
  memset(prop, 0, sizeof *prop);
  snprintf(prop->name, sizeof prop->name, "fake CUDA device (tests/cuda_fake: no GPU)");
  prop->multiProcessorCount = 132;
  prop->major = 9;
  prop->totalGlobalMem = (size_t)16 << 30;
  prop->l2CacheSize = 50 << 20;
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total) {
  *free_bytes = (size_t)8 << 30;
  *total = (size_t)16 << 30;
  return fake_rt(TPF_FAKE_OTHER, "cudaMemGetInfo");
}

cudaError_t cudaRuntimeGetVersion(int *runtimeVersion) {
  *runtimeVersion = CUDART_VERSION;
  return fake_rt(TPF_FAKE_OTHER, "cudaRuntimeGetVersion");
}

cudaError_t cudaDriverGetVersion(int *driverVersion) {
  *driverVersion = 0; /* no driver */
  return fake_rt(TPF_FAKE_OTHER, "cudaDriverGetVersion");
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

/* ---- exec mode: element conversions and the backend's kernels on the host ---------------- */

static float bf16_to_f(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static uint16_t f_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
  u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even */
  return (uint16_t)(u >> 16);
}

static float f16_to_f(uint16_t h) {
  const int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
  float v = e == 0    ? ldexpf((float)m, -24)
            : e == 31 ? (m ? NAN : INFINITY)
                      : ldexpf((float)(m | 1024), e - 25);
  return s ? -v : v;
}

static uint16_t f_to_f16(float f) {
  const uint16_t sign = signbit(f) ? 0x8000u : 0;
  float a = fabsf(f);
  if (isnan(f)) return 0x7e00u;
  if (a >= 65520.0f) return sign | 0x7c00u; /* rounds to infinity */
  if (a < ldexpf(1.0f, -14)) {              /* subnormal: units of 2^-24, ties to even */
    return sign | (uint16_t)lrintf(a * ldexpf(1.0f, 24));
  }
  int e;
  const float fr = frexpf(a, &e);  /* a = fr * 2^e, fr in [0.5, 1) */
  long m = lrintf(ldexpf(fr, 11)); /* 11 significant bits, ties to even */
  if (m == 2048) m = 1024, e++;
  return sign | (uint16_t)(((e + 14) << 10) | (m - 1024));
}

static float f8_to_f(uint8_t v, int e5m2) {
  const int s = v >> 7;
  float r;
  if (e5m2) {
    const int e = (v >> 2) & 31, m = v & 3;
    r = e == 0    ? ldexpf((float)m, -16)
        : e == 31 ? (m ? NAN : INFINITY)
                  : ldexpf((float)(m | 4), e - 17);
  } else {
    const int e = (v >> 3) & 15, m = v & 7;
    r = (e == 15 && m == 7) ? NAN : e == 0 ? ldexpf((float)m, -9) : ldexpf((float)(m | 8), e - 10);
  }
  return s ? -r : r;
}

/* Element i of a buffer of CUDA data type t, as float; and a store with one rounding. */
static float ld_cuda(const void *p, uint64_t i, cudaDataType t) {
  switch (t) {
  case CUDA_R_16BF:
    return bf16_to_f(((const uint16_t *)p)[i]);
  case CUDA_R_16F:
    return f16_to_f(((const uint16_t *)p)[i]);
  case CUDA_R_8F_E4M3:
    return f8_to_f(((const uint8_t *)p)[i], 0);
  case CUDA_R_8F_E5M2:
    return f8_to_f(((const uint8_t *)p)[i], 1);
  default:
    return ((const float *)p)[i];
  }
}

static void st_cuda(void *p, uint64_t i, cudaDataType t, float v) {
  if (t == CUDA_R_16BF)
    ((uint16_t *)p)[i] = f_to_bf16(v);
  else if (t == CUDA_R_16F)
    ((uint16_t *)p)[i] = f_to_f16(v);
  else
    ((float *)p)[i] = v;
}

static cudaDataType of_tpf(int d) {
  return d == TPF_BF16 ? CUDA_R_16BF : d == TPF_FP16 ? CUDA_R_16F : CUDA_R_32F;
}

static float gelu_tanh(float x) {
  const float u = 0.7978845608f * (x + 0.044715f * x * x * x);
  return 0.5f * x * (1.0f + tanhf(u));
}

/* The reduction kernels (vector and scalar paths compute the same): dst[i, j] = epi(sum over t in
 * order of src_t[i, j]), fp32 sums, one rounding; nothing when the status area holds a failure. */
static void exec_reduce(void **args) {
  const tpf_cuda_reduce_args *a = args[0];
  const tpf_cuda_status *st = *(const tpf_cuda_status *const *)args[1];
  if (st != NULL && st->code != TPF_CUDA_DEV_OK) return;
  const cudaDataType ti = of_tpf(a->src_dtype), to = of_tpf(a->dst_dtype);
  for (uint64_t i = 0; i < a->rows; i++)
    for (uint64_t j = 0; j < a->cols; j++) {
      float acc = 0.0f;
      for (int t = 0; t < a->count; t++)
        acc += ld_cuda(a->srcs[t], i * a->src_ld + j, ti);
      const uint64_t di = i * a->dst_ld + j;
      if (a->epi.on) {
        float x = a->epi.alpha * acc;
        if (a->epi.beta != 0.0f) x += a->epi.beta * ld_cuda(a->dst, di, to);
        if (a->epi.bias != NULL) x += ld_cuda(a->epi.bias, j, to);
        acc = a->epi.gelu ? gelu_tanh(x) : x;
      }
      st_cuda(a->dst, di, to, acc);
    }
}

static void exec_copy(void **args) {
  void *dst = *(void **)args[0];
  const void *src = *(const void *const *)args[1];
  const uint64_t n16 = *(const uint64_t *)args[2];
  unsigned char *dtail = *(unsigned char **)args[3];
  const unsigned char *stail = *(const unsigned char *const *)args[4];
  const uint64_t ntail = *(const uint64_t *)args[5];
  const tpf_cuda_status *st = *(const tpf_cuda_status *const *)args[6];
  if (st != NULL && st->code != TPF_CUDA_DEV_OK) return;
  memmove(dst, src, n16 * 16);
  memmove(dtail, stail, ntail);
}

/* Runs kernel `index` on the host; cudaErrorNotSupported for one exec mode cannot run (the flag
 * kernels' device waits, the fallback GEMM), so that a test cannot pass without it. */
static cudaError_t exec_kernel(int index, void **args) {
  const char *name = index >= 0 && index < atomic_load(&g_num_kernels) ? g_kernels[index].name : "";
  if (strstr(name, "reduce_vec_kernel") || strstr(name, "reduce_scalar_kernel")) {
    exec_reduce(args);
    return cudaSuccess;
  }
  if (strstr(name, "copy_kernel")) {
    exec_copy(args);
    return cudaSuccess;
  }
  if (strstr(name, "seq_bump_kernel")) {
    uint64_t *c = *(uint64_t **)args[0];
    *c += 1;
    return cudaSuccess;
  }
  fprintf(stderr, "fake CUDA: kernel %s cannot run in exec mode\n", name);
  return cudaErrorNotSupported;
}

static cudaError_t fake_launch(int index, void **args) {
  if (index >= 0 && index < FAKE_MAX_KERNELS) t_launch_by_kernel[index]++;
  cudaError_t e = fake_rt(TPF_FAKE_LAUNCH, "launch");
  if (e == cudaSuccess && g_exec) e = exec_kernel(index, args);
  if (e != cudaSuccess) t_last_error = e;
  return e;
}

cudaError_t __cudaLaunchKernel(cudaKernel_t kernel, dim3 gridDim, dim3 blockDim, void **args,
                               size_t sharedMem, cudaStream_t stream) {
  (void)gridDim, (void)blockDim, (void)sharedMem, (void)stream;
  return fake_launch((int)(uintptr_t)kernel - 1, args);
}

/* The launch path of toolkits before CUDA 13 (and of explicit cudaLaunchKernel calls). */
cudaError_t cudaLaunchKernel(const void *func, dim3 gridDim, dim3 blockDim, void **args,
                             size_t sharedMem, cudaStream_t stream) {
  (void)gridDim, (void)blockDim, (void)sharedMem, (void)stream;
  cudaKernel_t k = NULL;
  return fake_launch(__cudaGetKernel(&k, func) == cudaSuccess ? (int)(uintptr_t)k - 1 : -1, args);
}

/* ---- cuBLASLt ----------------------------------------------------------------------------- */

/* The opaque descriptors are ours to fill: a layout keeps rows and cols, a desc its TRANSA. */
enum { L_ROWS = 0, L_COLS = 1, L_TYPE = 2, L_LD = 3 };
enum { D_TRANSA = 0, D_TRANSB, D_EPILOGUE, D_BIAS, D_ASCALE, D_BSCALE };

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

/* A cuBLASLt object: `bytes` zeroed bytes of ours (the opaque types are ours to fill). */
static cublasStatus_t fake_lt_new(void **out, size_t bytes, const char *name) {
  cublasStatus_t s = fake_lt(TPF_FAKE_LT_SETUP, name);
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  *out = calloc(1, bytes);
  return *out ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_ALLOC_FAILED;
}

static cublasStatus_t fake_lt_free(void *p, const char *name) {
  free(p);
  return fake_lt(TPF_FAKE_LT_SETUP, name);
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *matmulDesc,
                                        cublasComputeType_t computeType, cudaDataType_t scaleType) {
  (void)computeType, (void)scaleType;
  return fake_lt_new((void **)matmulDesc, sizeof(cublasLtMatmulDescOpaque_t),
                     "cublasLtMatmulDescCreate");
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmulDesc) {
  return fake_lt_free(matmulDesc, "cublasLtMatmulDescDestroy");
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t matmulDesc,
                                              cublasLtMatmulDescAttributes_t attr, const void *buf,
                                              size_t sizeInBytes) {
  int slot = -1;
  if (attr == CUBLASLT_MATMUL_DESC_TRANSA) slot = D_TRANSA;
  if (attr == CUBLASLT_MATMUL_DESC_TRANSB) slot = D_TRANSB;
  if (attr == CUBLASLT_MATMUL_DESC_EPILOGUE) slot = D_EPILOGUE;
  if (attr == CUBLASLT_MATMUL_DESC_BIAS_POINTER) slot = D_BIAS;
  if (attr == CUBLASLT_MATMUL_DESC_A_SCALE_POINTER) slot = D_ASCALE;
  if (attr == CUBLASLT_MATMUL_DESC_B_SCALE_POINTER) slot = D_BSCALE;
  if (slot >= 0 && sizeInBytes == 4) matmulDesc->data[slot] = *(const uint32_t *)buf;
  if (slot >= 0 && sizeInBytes == 8) memcpy(&matmulDesc->data[slot], buf, 8);
  return fake_lt(TPF_FAKE_LT_ATTR, "cublasLtMatmulDescSetAttribute");
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *matLayout, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld) {
  cublasStatus_t s = fake_lt_new((void **)matLayout, sizeof(cublasLtMatrixLayoutOpaque_t),
                                 "cublasLtMatrixLayoutCreate");
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  (*matLayout)->data[L_ROWS] = rows;
  (*matLayout)->data[L_COLS] = cols;
  (*matLayout)->data[L_TYPE] = (uint64_t)type;
  (*matLayout)->data[L_LD] = (uint64_t)ld;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t matLayout) {
  return fake_lt_free(matLayout, "cublasLtMatrixLayoutDestroy");
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *pref) {
  return fake_lt_new((void **)pref, sizeof(cublasLtMatmulPreferenceOpaque_t),
                     "cublasLtMatmulPreferenceCreate");
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  return fake_lt_free(pref, "cublasLtMatmulPreferenceDestroy");
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

/* cuBLASLt's definition, column-major: D = act(alpha * sa * sb * op(A) op(B) + beta * C + bias)
 * with bias[i] per row of D (D's type), act GELU (tanh) for the GELU epilogues, fp32 sums in k
 * order, one rounding to D's type; C is read only when beta != 0. */
static void fake_matmul_exec(const cublasLtMatmulDescOpaque_t *dsc, const void *alpha,
                             const void *A, const cublasLtMatrixLayoutOpaque_t *Ad, const void *B,
                             const cublasLtMatrixLayoutOpaque_t *Bd, const void *beta,
                             const void *C, void *D, const cublasLtMatrixLayoutOpaque_t *Dd,
                             uint64_t m, uint64_t n, uint64_t k) {
  const bool ta = dsc->data[D_TRANSA] != CUBLAS_OP_N, tb = dsc->data[D_TRANSB] != CUBLAS_OP_N;
  const uint64_t epi = dsc->data[D_EPILOGUE];
  const bool bias = epi == CUBLASLT_EPILOGUE_BIAS || epi == CUBLASLT_EPILOGUE_GELU_BIAS;
  const bool gelu = epi == CUBLASLT_EPILOGUE_GELU || epi == CUBLASLT_EPILOGUE_GELU_BIAS;
  const void *bp = (const void *)(uintptr_t)dsc->data[D_BIAS];
  const float *sa = (const float *)(uintptr_t)dsc->data[D_ASCALE];
  const float *sb = (const float *)(uintptr_t)dsc->data[D_BSCALE];
  const float al = *(const float *)alpha * (sa ? *sa : 1.0f) * (sb ? *sb : 1.0f);
  const float be = *(const float *)beta;
  const cudaDataType tA = (cudaDataType)Ad->data[L_TYPE], tB = (cudaDataType)Bd->data[L_TYPE],
                     tD = (cudaDataType)Dd->data[L_TYPE];
  const uint64_t lda = Ad->data[L_LD], ldb = Bd->data[L_LD], ldd = Dd->data[L_LD];
  for (uint64_t j = 0; j < n; j++)
    for (uint64_t i = 0; i < m; i++) {
      float acc = 0.0f;
      for (uint64_t l = 0; l < k; l++)
        acc += ld_cuda(A, ta ? l + i * lda : i + l * lda, tA) *
               ld_cuda(B, tb ? j + l * ldb : l + j * ldb, tB);
      float x = al * acc;
      if (be != 0.0f) x += be * ld_cuda(C, i + j * ldd, tD);
      if (bias) x += ld_cuda(bp, i, tD);
      st_cuda(D, i + j * ldd, tD, gelu ? gelu_tanh(x) : x);
    }
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc,
                              const void *alpha, const void *A, cublasLtMatrixLayout_t Adesc,
                              const void *B, cublasLtMatrixLayout_t Bdesc, const void *beta,
                              const void *C, cublasLtMatrixLayout_t Cdesc, void *D,
                              cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t *algo,
                              void *workspace, size_t workspaceSizeInBytes, cudaStream_t stream) {
  (void)lightHandle, (void)Cdesc, (void)algo, (void)workspace, (void)workspaceSizeInBytes;
  (void)stream;
  cublasStatus_t s = fake_lt(TPF_FAKE_MATMUL, "cublasLtMatmul");
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  uint64_t m = Ddesc->data[L_ROWS], n = Ddesc->data[L_COLS];
  uint64_t k =
      computeDesc->data[D_TRANSA] == CUBLAS_OP_N ? Adesc->data[L_COLS] : Adesc->data[L_ROWS];
  t_counts.matmul_m = m, t_counts.matmul_n = n, t_counts.matmul_k = k;
  atomic_store(&g_mm_m, m), atomic_store(&g_mm_n, n), atomic_store(&g_mm_k, k);
  if (g_exec) fake_matmul_exec(computeDesc, alpha, A, Adesc, B, Bdesc, beta, C, D, Ddesc, m, n, k);
  return CUBLAS_STATUS_SUCCESS;
}
