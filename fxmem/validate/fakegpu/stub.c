/*
 * fakegpu stub: a pretend NVIDIA H100 for PyTorch's real CUDA build.
 *
 * Loaded with LD_PRELOAD (soname libcuda.so.1) into a Python process whose
 * torch is a CUDA build.  The dynamic linker then binds torch's imports of
 * the CUDA runtime (cuda*), the driver API (cu*), cuBLAS (cublas*) and
 * cuBLASLt (cublasLt*) to the definitions in this file instead of libcudart,
 * libcuda, libcublas and libcublasLt.  The symbols here carry no version tag;
 * glibc lets an unversioned definition satisfy a versioned reference such as
 * cudaMalloc@libcudart.so.13, and LD_PRELOAD puts this object first in the
 * lookup order, so it wins.  The real libcudart/libcublas are still loaded
 * (torch's DT_NEEDED) but never called.
 *
 * Behaviour:
 *   - one device, with H100 SXM 80GB properties (sm_90, 132 SMs);
 *   - cudaMalloc returns zero-filled anonymous host mappings (lazily
 *     committed, so untouched "device" memory costs no RAM) and fails with
 *     cudaErrorMemoryAllocation past the 80 GB capacity, like a real card;
 *   - memcpy / memset really happen on the host;
 *   - each block PyTorch's caching allocator hands out is zeroed
 *     (fakegpu_block_zero, called by alloc_hook.cpp's allocator tracker), so a
 *     value read on the host is 0 unless the host wrote it;
 *   - kernel launches, GEMMs and everything else that would compute are
 *     no-ops returning success, so tensor values are meaningless;
 *   - streams, events, contexts, modules are dummy handles.
 *
 * Built by build.py with gcc against the CUDA headers shipped in the venv.
 * Set FAKEGPU_DEBUG=1 to log device mallocs/frees and the driver entry points
 * asked for that this file does not define.
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define EXPORT __attribute__((visibility("default")))

/* ------------------------------------------------------------------------ */
/* Helpers: generic "success" / "not supported" bodies exported under many  */
/* names.  An assembler alias avoids clashing with the prototypes in the    */
/* CUDA headers; all three APIs use 0 for success, and callers on x86-64    */
/* clean up their own arguments, so one body fits every signature.          */
/* ------------------------------------------------------------------------ */
EXPORT int fakegpu_ok(void) { return 0; }
EXPORT int fakegpu_unsupported_rt(void) { return 801; /* cudaErrorNotSupported */ }
EXPORT int fakegpu_unsupported_drv(void) { return 801; /* CUDA_ERROR_NOT_SUPPORTED */ }
EXPORT int fakegpu_unsupported_blas(void) { return 15; /* CUBLAS_STATUS_NOT_SUPPORTED */ }

#define ALIAS(name, target)                                                    \
    __asm__(".globl " #name "\n\t.type " #name ", @function\n\t.set " #name \
            ", " #target "\n");
#define OK(name) ALIAS(name, fakegpu_ok)
#define RT_UNSUPPORTED(name) ALIAS(name, fakegpu_unsupported_rt)
#define DRV_UNSUPPORTED(name) ALIAS(name, fakegpu_unsupported_drv)
#define BLAS_UNSUPPORTED(name) ALIAS(name, fakegpu_unsupported_blas)

static int debug_enabled(void) {
    static int v = -1;
    if (v < 0) {
        const char *e = getenv("FAKEGPU_DEBUG");
        v = (e && *e && *e != '0') ? 1 : 0;
    }
    return v;
}

/* A fresh, unique, non-NULL handle (stream, event, module, descriptor...). */
static void *new_handle(void) { return calloc(1, 64); }

/* ------------------------------------------------------------------------ */
/* The device: H100 SXM 80GB, compute capability 9.0                       */
/* ------------------------------------------------------------------------ */
#define FAKE_TOTAL_MEM 85520809984ULL /* 79.65 GiB, as an H100 80GB reports */
#define FAKE_CONTEXT_BYTES (512ULL << 20) /* pretend context, for MemGetInfo */
static const char FAKE_NAME[] = "NVIDIA H100 80GB HBM3";

/* Attribute values.  cudaDeviceAttr and CUdevice_attribute share numbers. */
static int dev_attr(int attr) {
    switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock: return 1024;
    case cudaDevAttrMaxBlockDimX: return 1024;
    case cudaDevAttrMaxBlockDimY: return 1024;
    case cudaDevAttrMaxBlockDimZ: return 64;
    case cudaDevAttrMaxGridDimX: return 2147483647;
    case cudaDevAttrMaxGridDimY: return 65535;
    case cudaDevAttrMaxGridDimZ: return 65535;
    case cudaDevAttrMaxSharedMemoryPerBlock: return 49152;
    case cudaDevAttrTotalConstantMemory: return 65536;
    case cudaDevAttrWarpSize: return 32;
    case cudaDevAttrMaxPitch: return 2147483647;
    case cudaDevAttrMaxRegistersPerBlock: return 65536;
    case cudaDevAttrClockRate: return 1980000;
    case cudaDevAttrTextureAlignment: return 512;
    case cudaDevAttrGpuOverlap: return 1;
    case cudaDevAttrMultiProcessorCount: return 132;
    case cudaDevAttrKernelExecTimeout: return 0;
    case cudaDevAttrIntegrated: return 0;
    case cudaDevAttrCanMapHostMemory: return 1;
    case cudaDevAttrComputeMode: return 0;
    case cudaDevAttrSurfaceAlignment: return 512;
    case cudaDevAttrConcurrentKernels: return 1;
    case cudaDevAttrEccEnabled: return 1;
    case cudaDevAttrPciBusId: return 0x18;
    case cudaDevAttrPciDeviceId: return 0;
    case cudaDevAttrTccDriver: return 0;
    case cudaDevAttrMemoryClockRate: return 2619000;
    case cudaDevAttrGlobalMemoryBusWidth: return 5120;
    case cudaDevAttrL2CacheSize: return 52428800;
    case cudaDevAttrMaxThreadsPerMultiProcessor: return 2048;
    case cudaDevAttrAsyncEngineCount: return 3;
    case cudaDevAttrUnifiedAddressing: return 1;
    case cudaDevAttrPciDomainId: return 0;
    case cudaDevAttrTexturePitchAlignment: return 32;
    case cudaDevAttrComputeCapabilityMajor: return 9;
    case cudaDevAttrComputeCapabilityMinor: return 0;
    case cudaDevAttrStreamPrioritiesSupported: return 1;
    case cudaDevAttrGlobalL1CacheSupported: return 1;
    case cudaDevAttrLocalL1CacheSupported: return 1;
    case cudaDevAttrMaxSharedMemoryPerMultiprocessor: return 233472;
    case cudaDevAttrMaxRegistersPerMultiprocessor: return 65536;
    case cudaDevAttrManagedMemory: return 1;
    case cudaDevAttrIsMultiGpuBoard: return 0;
    case cudaDevAttrMultiGpuBoardGroupID: return 0;
    case cudaDevAttrHostNativeAtomicSupported: return 0;
    case cudaDevAttrSingleToDoublePrecisionPerfRatio: return 2;
    case cudaDevAttrPageableMemoryAccess: return 0;
    case cudaDevAttrConcurrentManagedAccess: return 1;
    case cudaDevAttrComputePreemptionSupported: return 1;
    case cudaDevAttrCanUseHostPointerForRegisteredMem: return 1;
    case cudaDevAttrCooperativeLaunch: return 1;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: return 232448;
    case cudaDevAttrCanFlushRemoteWrites: return 0;
    case cudaDevAttrHostRegisterSupported: return 1;
    case cudaDevAttrPageableMemoryAccessUsesHostPageTables: return 0;
    case cudaDevAttrDirectManagedMemAccessFromHost: return 0;
    case cudaDevAttrMaxBlocksPerMultiprocessor: return 32;
    case cudaDevAttrMaxPersistingL2CacheSize: return 32505856;
    case cudaDevAttrMaxAccessPolicyWindowSize: return 134213632;
    case cudaDevAttrReservedSharedMemoryPerBlock: return 1024;
    case cudaDevAttrSparseCudaArraySupported: return 1;
    case cudaDevAttrHostRegisterReadOnlySupported: return 1;
    case cudaDevAttrTimelineSemaphoreInteropSupported: return 1;
    case cudaDevAttrMemoryPoolsSupported: return 1;
    case cudaDevAttrGPUDirectRDMASupported: return 1;
    case cudaDevAttrGPUDirectRDMAFlushWritesOptions: return 1;
    case cudaDevAttrGPUDirectRDMAWritesOrdering: return 0;
    case cudaDevAttrMemoryPoolSupportedHandleTypes: return 9;
    case cudaDevAttrClusterLaunch: return 1;
    case cudaDevAttrDeferredMappingCudaArraySupported: return 1;
    case cudaDevAttrIpcEventSupport: return 1;
    default: return 0;
    }
}

static void fill_props(struct cudaDeviceProp *p) {
    memset(p, 0, sizeof(*p));
    strncpy(p->name, FAKE_NAME, sizeof(p->name) - 1);
    for (int i = 0; i < 16; i++) p->uuid.bytes[i] = (char)(0xA0 + i);
    p->totalGlobalMem = FAKE_TOTAL_MEM;
    p->sharedMemPerBlock = 49152;
    p->regsPerBlock = 65536;
    p->warpSize = 32;
    p->memPitch = 2147483647;
    p->maxThreadsPerBlock = 1024;
    p->maxThreadsDim[0] = 1024; p->maxThreadsDim[1] = 1024; p->maxThreadsDim[2] = 64;
    p->maxGridSize[0] = 2147483647; p->maxGridSize[1] = 65535; p->maxGridSize[2] = 65535;
    p->totalConstMem = 65536;
    p->major = 9;
    p->minor = 0;
    p->textureAlignment = 512;
    p->texturePitchAlignment = 32;
    p->multiProcessorCount = 132;
    p->canMapHostMemory = 1;
    p->surfaceAlignment = 512;
    p->concurrentKernels = 1;
    p->ECCEnabled = 1;
    p->pciBusID = 0x18;
    p->asyncEngineCount = 3;
    p->unifiedAddressing = 1;
    p->memoryBusWidth = 5120;
    p->l2CacheSize = 52428800;
    p->persistingL2CacheMaxSize = 32505856;
    p->maxThreadsPerMultiProcessor = 2048;
    p->streamPrioritiesSupported = 1;
    p->globalL1CacheSupported = 1;
    p->localL1CacheSupported = 1;
    p->sharedMemPerMultiprocessor = 233472;
    p->regsPerMultiprocessor = 65536;
    p->managedMemory = 1;
    p->concurrentManagedAccess = 1;
    p->computePreemptionSupported = 1;
    p->canUseHostPointerForRegisteredMem = 1;
    p->cooperativeLaunch = 1;
    p->sharedMemPerBlockOptin = 232448;
    p->maxBlocksPerMultiProcessor = 32;
    p->accessPolicyMaxWindowSize = 134213632;
    p->reservedSharedMemPerBlock = 1024;
    p->hostRegisterSupported = 1;
    p->sparseCudaArraySupported = 1;
    p->hostRegisterReadOnlySupported = 1;
    p->timelineSemaphoreInteropSupported = 1;
    p->memoryPoolsSupported = 1;
    p->gpuDirectRDMASupported = 1;
    p->gpuDirectRDMAFlushWritesOptions = 1;
    p->memoryPoolSupportedHandleTypes = 9;
    p->deferredMappingCudaArraySupported = 1;
    p->ipcEventSupported = 1;
    p->clusterLaunch = 1;
    p->unifiedFunctionPointers = 1;
    p->deviceNumaId = -1;
    p->hostNumaId = -1;
}

/* ------------------------------------------------------------------------ */
/* "Device" memory: anonymous mappings with a one-page header holding the   */
/* size.  Fresh mappings read as zero.                                       */
/* ------------------------------------------------------------------------ */
#define HDR 4096
static size_t g_in_use = 0; /* bytes currently handed out by cudaMalloc */

/* ------------------------------------------------------------------------ */
/* What a read of device memory gives.  Kernels do not run, so a device->   */
/* host copy reads what the host last put there.  So that this does not     */
/* depend on what ran before, every block the caching allocator hands out   */
/* reads as zero until a host->device copy, a memset or a device->device    */
/* copy writes it: alloc_hook.cpp, loaded by _child.py, adds a trace        */
/* tracker to PyTorch's caching allocator that calls fakegpu_block_zero     */
/* with each allocation's address and size.  Pages wholly inside are given  */
/* back (MADV_DONTNEED: they read as zero), so zeroing commits no memory.   */
/* ------------------------------------------------------------------------ */
static size_t g_zeroed_blocks; /* blocks zeroed, for tests */

/* [lo, lo + size) made to read as zero: the pages wholly inside given back (MADV_DONTNEED on
 * the stub's private anonymous mappings: they read as zero, and commit no memory), the rest
 * written; a range under ``written`` bytes is written whole. */
static void zero_range(uintptr_t lo, size_t size, size_t written) {
    uintptr_t hi = lo + size;
    uintptr_t a = (lo + 4095) & ~(uintptr_t)4095, b = hi & ~(uintptr_t)4095;
    if (a >= b || size < written) {
        memset((void *)lo, 0, size);
    } else {
        memset((void *)lo, 0, a - lo);
        madvise((void *)a, b - a, MADV_DONTNEED);
        memset((void *)b, 0, hi - b);
    }
}

EXPORT void fakegpu_block_zero(uintptr_t lo, size_t size) {
    zero_range(lo, size, 0);
    __atomic_add_fetch(&g_zeroed_blocks, 1, __ATOMIC_RELAXED);
}
EXPORT size_t fakegpu_zeroed_blocks(void) { return g_zeroed_blocks; }

static int dev_alloc(void **out, size_t size) {
    if (!out) return 1;
    *out = NULL;
    if (size == 0) return 0;
    size_t cur = __atomic_load_n(&g_in_use, __ATOMIC_RELAXED);
    if (cur + size > FAKE_TOTAL_MEM - FAKE_CONTEXT_BYTES) return 2; /* OOM */
    size_t total = ((size + HDR + 4095) / 4096) * 4096;
    void *base = mmap(NULL, total, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED) return 2;
    ((size_t *)base)[0] = total;
    ((size_t *)base)[1] = size;
    ((size_t *)base)[2] = 0xFA4E69B0ULL; /* magic */
    __atomic_add_fetch(&g_in_use, size, __ATOMIC_RELAXED);
    *out = (char *)base + HDR;
    if (debug_enabled()) fprintf(stderr, "[fakegpu] device malloc %zu -> %p\n", size, *out);
    return 0;
}

static int dev_free(void *p) {
    if (!p) return 0;
    size_t *base = (size_t *)((char *)p - HDR);
    if (base[2] != 0xFA4E69B0ULL) return 1; /* not ours: invalid value */
    __atomic_sub_fetch(&g_in_use, base[1], __ATOMIC_RELAXED);
    if (debug_enabled()) fprintf(stderr, "[fakegpu] device free %zu at %p\n", base[1], p);
    munmap(base, base[0]);
    return 0;
}

static void mem_info(size_t *free_b, size_t *total_b) {
    size_t used = __atomic_load_n(&g_in_use, __ATOMIC_RELAXED) + FAKE_CONTEXT_BYTES;
    if (total_b) *total_b = FAKE_TOTAL_MEM;
    if (free_b) *free_b = used < FAKE_TOTAL_MEM ? FAKE_TOTAL_MEM - used : 0;
}

/* ======================================================================== */
/* CUDA runtime API (libcudart)                                             */
/* ======================================================================== */

/* --- device management --- */
static int g_device = 0;

EXPORT cudaError_t cudaGetDeviceCount(int *count) { *count = 1; return cudaSuccess; }
EXPORT cudaError_t cudaGetDevice(int *device) { *device = g_device; return cudaSuccess; }
EXPORT cudaError_t cudaSetDevice(int device) {
    if (device != 0) return cudaErrorInvalidDevice;
    g_device = device;
    return cudaSuccess;
}
EXPORT cudaError_t cudaInitDevice(int device, unsigned int a, unsigned int b) {
    (void)a; (void)b;
    return device == 0 ? cudaSuccess : cudaErrorInvalidDevice;
}
EXPORT cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device) {
    if (device != 0) return cudaErrorInvalidDevice;
    fill_props(prop);
    return cudaSuccess;
}
EXPORT cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device) {
    if (device != 0) return cudaErrorInvalidDevice;
    *value = dev_attr((int)attr);
    return cudaSuccess;
}
EXPORT cudaError_t cudaDeviceGetPCIBusId(char *pciBusId, int len, int device) {
    (void)device;
    snprintf(pciBusId, (size_t)len, "0000:18:00.0");
    return cudaSuccess;
}
EXPORT cudaError_t cudaDeviceCanAccessPeer(int *can, int d, int p) {
    (void)d; (void)p;
    *can = 0;
    return cudaSuccess;
}
EXPORT cudaError_t cudaDeviceGetStreamPriorityRange(int *least, int *greatest) {
    if (least) *least = 0;
    if (greatest) *greatest = -5;
    return cudaSuccess;
}
EXPORT cudaError_t cudaDriverGetVersion(int *v) { *v = CUDA_VERSION; return cudaSuccess; }
EXPORT cudaError_t cudaRuntimeGetVersion(int *v) { *v = CUDART_VERSION; return cudaSuccess; }
OK(cudaDeviceSynchronize)
OK(cudaDeviceReset)
OK(cudaDeviceSetCacheConfig)
OK(cudaDeviceSetLimit)
OK(cudaSetDeviceFlags)
OK(cudaDeviceEnablePeerAccess)
OK(cudaDeviceDisablePeerAccess)
OK(cudaProfilerStart)
OK(cudaProfilerStop)

/* --- errors --- */
EXPORT cudaError_t cudaGetLastError(void) { return cudaSuccess; }
EXPORT cudaError_t cudaPeekAtLastError(void) { return cudaSuccess; }
EXPORT const char *cudaGetErrorName(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorNotSupported: return "cudaErrorNotSupported";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    default: return "cudaErrorUnknown(fakegpu)";
    }
}
EXPORT const char *cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorNotSupported: return "operation not supported (fakegpu)";
    case cudaErrorNotReady: return "device not ready";
    default: return "unknown error (fakegpu)";
    }
}

/* --- memory --- */
EXPORT cudaError_t cudaMalloc(void **p, size_t size) {
    int r = dev_alloc(p, size);
    return r == 0 ? cudaSuccess : (r == 2 ? cudaErrorMemoryAllocation : cudaErrorInvalidValue);
}
EXPORT cudaError_t cudaFree(void *p) {
    return dev_free(p) == 0 ? cudaSuccess : cudaErrorInvalidValue;
}
EXPORT cudaError_t cudaMallocAsync(void **p, size_t size, cudaStream_t s) {
    (void)s;
    return cudaMalloc(p, size);
}
EXPORT cudaError_t cudaFreeAsync(void *p, cudaStream_t s) { (void)s; return cudaFree(p); }
EXPORT cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total_b) {
    mem_info(free_b, total_b);
    return cudaSuccess;
}
/* pinned host memory is ordinary host memory */
EXPORT cudaError_t cudaHostAlloc(void **p, size_t size, unsigned int flags) {
    (void)flags;
    if (posix_memalign(p, 4096, size ? size : 1)) return cudaErrorMemoryAllocation;
    memset(*p, 0, size);
    return cudaSuccess;
}
EXPORT cudaError_t cudaMallocHost(void **p, size_t size) { return cudaHostAlloc(p, size, 0); }
EXPORT cudaError_t cudaFreeHost(void *p) { free(p); return cudaSuccess; }
OK(cudaHostRegister)
OK(cudaHostUnregister)
EXPORT cudaError_t cudaHostGetDevicePointer(void **d, void *h, unsigned int f) {
    (void)f;
    *d = h;
    return cudaSuccess;
}
EXPORT cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *a, const void *ptr) {
    memset(a, 0, sizeof(*a));
    a->type = cudaMemoryTypeDevice;
    a->device = 0;
    a->devicePointer = (void *)ptr;
    a->hostPointer = NULL;
    return cudaSuccess;
}
/* copies and sets really happen, on the host */
EXPORT cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind k) {
    (void)k;
    if (n && dst != src) memmove(dst, src, n);
    return cudaSuccess;
}
EXPORT cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind k,
                                   cudaStream_t s) {
    (void)s;
    return cudaMemcpy(dst, src, n, k);
}
EXPORT cudaError_t cudaMemcpyPeerAsync(void *dst, int dd, const void *src, int sd, size_t n,
                                       cudaStream_t s) {
    (void)dd; (void)sd; (void)s;
    return cudaMemcpy(dst, src, n, cudaMemcpyDefault);
}
EXPORT cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch,
                                     size_t width, size_t height, enum cudaMemcpyKind k,
                                     cudaStream_t s) {
    (void)k; (void)s;
    for (size_t r = 0; r < height; r++)
        memmove((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
    return cudaSuccess;
}
EXPORT cudaError_t cudaMemcpy2D(void *dst, size_t dpitch, const void *src, size_t spitch,
                                size_t width, size_t height, enum cudaMemcpyKind k) {
    return cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, height, k, 0);
}
OK(cudaMemcpyToSymbol) /* would write device constants: nothing reads them */
OK(cudaMemcpyToSymbolAsync)
/* a memset of zero over a MiB or more as a block's zeroing (inductor's autotuning zeroes a
 * 50 MB buffer, the L2's size, 205 times for each kernel it times: written, 1.7 ms each; under
 * a MiB, a system call costs more than the write) */
EXPORT cudaError_t cudaMemset(void *p, int v, size_t n) {
    if (n && v == 0) zero_range((uintptr_t)p, n, (size_t)1 << 20);
    else if (n) memset(p, v, n);
    return cudaSuccess;
}
EXPORT cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s) {
    (void)s;
    return cudaMemset(p, v, n);
}
EXPORT cudaError_t cudaGetSymbolAddress(void **d, const void *sym) {
    *d = (void *)sym; /* the host shadow stands in for the device symbol */
    return cudaSuccess;
}
/* stream-ordered pools and IPC: not available (PyTorch's native allocator
 * does not need them) */
RT_UNSUPPORTED(cudaDeviceGetDefaultMemPool)
RT_UNSUPPORTED(cudaMemPoolGetAttribute)
RT_UNSUPPORTED(cudaMemPoolSetAttribute)
RT_UNSUPPORTED(cudaMemPoolSetAccess)
RT_UNSUPPORTED(cudaMemPoolTrimTo)
RT_UNSUPPORTED(cudaDeviceGetGraphMemAttribute)
RT_UNSUPPORTED(cudaDeviceSetGraphMemAttribute)
RT_UNSUPPORTED(cudaIpcGetMemHandle)
RT_UNSUPPORTED(cudaIpcOpenMemHandle)
RT_UNSUPPORTED(cudaIpcCloseMemHandle)
RT_UNSUPPORTED(cudaIpcGetEventHandle)
RT_UNSUPPORTED(cudaIpcOpenEventHandle)

/* --- streams --- */
EXPORT cudaError_t cudaStreamCreate(cudaStream_t *s) { *s = new_handle(); return cudaSuccess; }
EXPORT cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int f) {
    (void)f;
    return cudaStreamCreate(s);
}
EXPORT cudaError_t cudaStreamCreateWithPriority(cudaStream_t *s, unsigned int f, int prio) {
    (void)f; (void)prio;
    return cudaStreamCreate(s);
}
EXPORT cudaError_t cudaStreamDestroy(cudaStream_t s) {
    if ((uintptr_t)s > 2) free(s); /* 0,1,2 are the special legacy/per-thread streams */
    return cudaSuccess;
}
OK(cudaStreamQuery)
OK(cudaStreamSynchronize)
OK(cudaStreamWaitEvent)
EXPORT cudaError_t cudaStreamGetPriority(cudaStream_t s, int *prio) {
    (void)s;
    *prio = 0;
    return cudaSuccess;
}
EXPORT cudaError_t cudaStreamGetFlags(cudaStream_t s, unsigned int *f) {
    (void)s;
    *f = 0;
    return cudaSuccess;
}
EXPORT cudaError_t cudaStreamGetDevice(cudaStream_t s, int *d) {
    (void)s;
    *d = 0;
    return cudaSuccess;
}
EXPORT cudaError_t cudaStreamGetId(cudaStream_t s, unsigned long long *id) {
    *id = (unsigned long long)(uintptr_t)s;
    return cudaSuccess;
}
/* host callbacks run immediately: all "device work" is already complete */
EXPORT cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void *ud) {
    (void)s;
    fn(ud);
    return cudaSuccess;
}
EXPORT cudaError_t cudaStreamAddCallback(cudaStream_t s, cudaStreamCallback_t cb, void *ud,
                                         unsigned int f) {
    (void)f;
    cb(s, cudaSuccess, ud);
    return cudaSuccess;
}
/* stream capture: never capturing; CUDA graphs are not supported */
EXPORT cudaError_t cudaStreamIsCapturing(cudaStream_t s, enum cudaStreamCaptureStatus *st) {
    (void)s;
    *st = cudaStreamCaptureStatusNone;
    return cudaSuccess;
}
EXPORT cudaError_t cudaStreamGetCaptureInfo(cudaStream_t s, enum cudaStreamCaptureStatus *st,
                                            unsigned long long *id, cudaGraph_t *g,
                                            const cudaGraphNode_t **deps,
                                            const cudaGraphEdgeData **edges, size_t *ndeps) {
    (void)s;
    if (st) *st = cudaStreamCaptureStatusNone;
    if (id) *id = 0;
    if (g) *g = NULL;
    if (deps) *deps = NULL;
    if (edges) *edges = NULL;
    if (ndeps) *ndeps = 0;
    return cudaSuccess;
}
OK(cudaThreadExchangeStreamCaptureMode)
RT_UNSUPPORTED(cudaStreamBeginCapture)
RT_UNSUPPORTED(cudaStreamBeginCaptureToGraph)
RT_UNSUPPORTED(cudaStreamEndCapture)
RT_UNSUPPORTED(cudaStreamUpdateCaptureDependencies)
RT_UNSUPPORTED(cudaGraphAddNode)
RT_UNSUPPORTED(cudaGraphConditionalHandleCreate)
RT_UNSUPPORTED(cudaGraphGetNodes)
RT_UNSUPPORTED(cudaGraphNodeGetDependencies)
RT_UNSUPPORTED(cudaGraphInstantiateWithFlags)
RT_UNSUPPORTED(cudaGraphLaunch)
RT_UNSUPPORTED(cudaGraphRetainUserObject)
RT_UNSUPPORTED(cudaUserObjectCreate)
RT_UNSUPPORTED(cudaUserObjectRelease)
OK(cudaGraphDestroy)
OK(cudaGraphExecDestroy)

/* --- events --- */
EXPORT cudaError_t cudaEventCreate(cudaEvent_t *e) { *e = new_handle(); return cudaSuccess; }
EXPORT cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int f) {
    (void)f;
    return cudaEventCreate(e);
}
EXPORT cudaError_t cudaEventDestroy(cudaEvent_t e) { free(e); return cudaSuccess; }
OK(cudaEventRecord)
OK(cudaEventRecordWithFlags)
OK(cudaEventQuery)
OK(cudaEventSynchronize)
EXPORT cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) {
    (void)a; (void)b;
    *ms = 0.0f;
    return cudaSuccess;
}

/* --- kernels: launches do nothing; attribute/occupancy queries answer for
 *     a generic kernel on sm_90 --- */
OK(cudaLaunchKernel)
OK(cudaLaunchKernelExC)
OK(cudaLaunchCooperativeKernel)
OK(cudaFuncSetAttribute)
OK(cudaFuncSetCacheConfig)
OK(cudaKernelSetAttributeForDevice)
EXPORT cudaError_t cudaFuncGetAttributes(struct cudaFuncAttributes *a, const void *f) {
    (void)f;
    memset(a, 0, sizeof(*a));
    a->maxThreadsPerBlock = 1024;
    a->numRegs = 32;
    a->ptxVersion = 90;
    a->binaryVersion = 90;
    a->maxDynamicSharedSizeBytes = 49152;
    a->preferredShmemCarveout = -1;
    return cudaSuccess;
}
static int occupancy(int blockSize) {
    int n = blockSize > 0 ? 2048 / blockSize : 32;
    if (n > 32) n = 32;
    if (n < 1) n = 1;
    return n;
}
EXPORT cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(
    int *n, const void *f, int bs, size_t smem, unsigned int flags) {
    (void)f; (void)smem; (void)flags;
    *n = occupancy(bs);
    return cudaSuccess;
}
EXPORT cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *n, const void *f, int bs,
                                                                 size_t smem) {
    return cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(n, f, bs, smem, 0);
}
EXPORT cudaError_t cudaLibraryLoadData(cudaLibrary_t *lib, const void *code,
                                       enum cudaJitOption *o, void **ov, unsigned int no,
                                       enum cudaLibraryOption *lo, void **lov, unsigned int nlo) {
    (void)code; (void)o; (void)ov; (void)no; (void)lo; (void)lov; (void)nlo;
    *lib = new_handle();
    return cudaSuccess;
}
EXPORT cudaError_t cudaLibraryGetKernel(cudaKernel_t *k, cudaLibrary_t lib, const char *name) {
    (void)lib; (void)name;
    *k = new_handle();
    return cudaSuccess;
}
OK(cudaLibraryUnload)

/* --- hidden entry points that nvcc-generated host code calls: fat binary
 *     registration at load time and the <<<...>>> launch sequence --- */
static void *g_fatbin_handle[4];
EXPORT void **__cudaRegisterFatBinary(void *fatCubin) {
    (void)fatCubin;
    return g_fatbin_handle;
}
EXPORT void __cudaRegisterFatBinaryEnd(void **h) { (void)h; }
EXPORT void __cudaUnregisterFatBinary(void **h) { (void)h; }
EXPORT void __cudaRegisterFunction(void **h, const char *hf, char *df, const char *dn, int tl,
                                   void *tid, void *bid, void *bd, void *gd, int *ws) {
    (void)h; (void)hf; (void)df; (void)dn; (void)tl; (void)tid; (void)bid; (void)bd; (void)gd;
    (void)ws;
}
EXPORT void __cudaRegisterVar(void **h, char *hv, char *dA, const char *dN, int ext, size_t size,
                              int constant, int global) {
    (void)h; (void)hv; (void)dA; (void)dN; (void)ext; (void)size; (void)constant; (void)global;
}
EXPORT void __cudaRegisterManagedVar(void **h, void **hv, char *dA, const char *dN, int ext,
                                     size_t size, int constant, int global) {
    (void)h; (void)hv; (void)dA; (void)dN; (void)ext; (void)size; (void)constant; (void)global;
}
EXPORT char __cudaInitModule(void **h) { (void)h; return 1; }
EXPORT unsigned __cudaPushCallConfiguration(dim3 g, dim3 b, size_t smem, void *stream) {
    (void)g; (void)b; (void)smem; (void)stream;
    return 0;
}
EXPORT cudaError_t __cudaPopCallConfiguration(dim3 *g, dim3 *b, size_t *smem, void *stream) {
    if (g) { g->x = g->y = g->z = 1; }
    if (b) { b->x = b->y = b->z = 1; }
    if (smem) *smem = 0;
    if (stream) *(void **)stream = NULL;
    return cudaSuccess;
}
EXPORT cudaError_t __cudaGetKernel(cudaKernel_t *k, const void *fn) {
    *k = (cudaKernel_t)fn;
    return cudaSuccess;
}
OK(__cudaLaunchKernel)
OK(__cudaLaunchKernel_ptsz)
OK(cudaLaunchKernel_ptsz)

/* --- driver entry points requested through the runtime --- */
static void *lookup_driver_symbol(const char *symbol);

EXPORT cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **fp,
                                                    unsigned int ver, unsigned long long flags,
                                                    enum cudaDriverEntryPointQueryResult *st) {
    (void)ver; (void)flags;
    *fp = lookup_driver_symbol(symbol);
    if (st) *st = *fp ? cudaDriverEntryPointSuccess : cudaDriverEntryPointSymbolNotFound;
    return cudaSuccess;
}
EXPORT cudaError_t cudaGetDriverEntryPoint(const char *symbol, void **fp, unsigned long long flags,
                                           enum cudaDriverEntryPointQueryResult *st) {
    return cudaGetDriverEntryPointByVersion(symbol, fp, CUDA_VERSION, flags, st);
}

/* ======================================================================== */
/* CUDA driver API (libcuda.so.1).  Names follow cuda.h's macros, so e.g.   */
/* cuDeviceTotalMem below is exported as cuDeviceTotalMem_v2, as in libcuda. */
/* ======================================================================== */
static int g_ctx_dummy;
#define FAKE_CTX ((CUcontext)&g_ctx_dummy)

OK(cuInit)
EXPORT CUresult cuDriverGetVersion(int *v) { *v = CUDA_VERSION; return CUDA_SUCCESS; }
EXPORT CUresult cuDeviceGet(CUdevice *d, int ordinal) {
    if (ordinal != 0) return CUDA_ERROR_INVALID_DEVICE;
    *d = 0;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGetCount(int *n) { *n = 1; return CUDA_SUCCESS; }
EXPORT CUresult cuDeviceGetAttribute(int *v, CUdevice_attribute a, CUdevice d) {
    (void)d;
    *v = dev_attr((int)a);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGetName(char *name, int len, CUdevice d) {
    (void)d;
    snprintf(name, (size_t)len, "%s", FAKE_NAME);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceTotalMem(size_t *b, CUdevice d) {
    (void)d;
    *b = FAKE_TOTAL_MEM;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGetUuid(CUuuid *u, CUdevice d) {
    (void)d;
    for (int i = 0; i < 16; i++) u->bytes[i] = (char)(0xA0 + i);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGetPCIBusId(char *s, int len, CUdevice d) {
    (void)d;
    snprintf(s, (size_t)len, "0000:18:00.0");
    return CUDA_SUCCESS;
}
/* the primary context always exists and is active (the autograd engine asks) */
EXPORT CUresult cuDevicePrimaryCtxGetState(CUdevice d, unsigned int *flags, int *active) {
    (void)d;
    if (flags) *flags = 0;
    if (active) *active = 1;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) {
    (void)d;
    *c = FAKE_CTX;
    return CUDA_SUCCESS;
}
OK(cuDevicePrimaryCtxRelease)
OK(cuDevicePrimaryCtxSetFlags)
OK(cuDevicePrimaryCtxReset)
EXPORT CUresult cuCtxGetCurrent(CUcontext *c) { *c = FAKE_CTX; return CUDA_SUCCESS; }
OK(cuCtxSetCurrent)
EXPORT CUresult cuCtxGetDevice(CUdevice *d) { *d = 0; return CUDA_SUCCESS; }
OK(cuCtxSynchronize)
/* triton's launcher (cuda_utils.so, a compiled step: fxmem.trace.compiled) sets and reads
   the stack size limit */
OK(cuCtxSetLimit)
EXPORT CUresult cuCtxGetLimit(size_t *value, CUlimit limit) {
    (void)limit;
    if (value) *value = 1024;
    return CUDA_SUCCESS;
}
/* and asks whether the stream is being captured into a CUDA graph (2.15's triton) */
EXPORT CUresult cuStreamIsCapturing(CUstream s, CUstreamCaptureStatus *status) {
    (void)s;
    if (status) *status = CU_STREAM_CAPTURE_STATUS_NONE;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxPushCurrent(CUcontext c) { (void)c; return CUDA_SUCCESS; }
EXPORT CUresult cuCtxPopCurrent(CUcontext *c) {
    if (c) *c = FAKE_CTX;
    return CUDA_SUCCESS;
}
/* modules, functions, launches (NVRTC/jiterator path) */
EXPORT CUresult cuModuleLoadData(CUmodule *m, const void *img) {
    (void)img;
    *m = new_handle();
    return CUDA_SUCCESS;
}
EXPORT CUresult cuModuleLoadDataEx(CUmodule *m, const void *img, unsigned int n,
                                   CUjit_option *o, void **ov) {
    (void)n; (void)o; (void)ov;
    return cuModuleLoadData(m, img);
}
EXPORT CUresult cuModuleLoad(CUmodule *m, const char *f) { (void)f; return cuModuleLoadData(m, 0); }
OK(cuModuleUnload)
EXPORT CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name) {
    (void)m; (void)name;
    *f = new_handle();
    return CUDA_SUCCESS;
}
EXPORT CUresult cuModuleGetGlobal(CUdeviceptr *dp, size_t *bytes, CUmodule m, const char *name) {
    (void)m; (void)name;
    static char dummy[4096];
    if (dp) *dp = (CUdeviceptr)(uintptr_t)dummy;
    if (bytes) *bytes = sizeof(dummy);
    return CUDA_SUCCESS;
}
OK(cuLaunchKernel)
OK(cuLaunchKernelEx)
OK(cuLaunchCooperativeKernel)
OK(cuFuncSetAttribute)
OK(cuFuncSetCacheConfig)
EXPORT CUresult cuFuncGetAttribute(int *v, CUfunction_attribute a, CUfunction f) {
    (void)f;
    switch (a) {
    case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *v = 1024; break;
    case CU_FUNC_ATTRIBUTE_NUM_REGS: *v = 32; break;
    case CU_FUNC_ATTRIBUTE_PTX_VERSION: *v = 90; break;
    case CU_FUNC_ATTRIBUTE_BINARY_VERSION: *v = 90; break;
    case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: *v = 49152; break;
    default: *v = 0;
    }
    return CUDA_SUCCESS;
}
EXPORT CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int *n, CUfunction f, int bs,
                                                            size_t smem) {
    (void)f; (void)smem;
    *n = occupancy(bs);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int *n, CUfunction f, int bs,
                                                                     size_t smem, unsigned fl) {
    (void)fl;
    return cuOccupancyMaxActiveBlocksPerMultiprocessor(n, f, bs, smem);
}
EXPORT CUresult cuLinkCreate(unsigned int n, CUjit_option *o, void **ov, CUlinkState *st) {
    (void)n; (void)o; (void)ov;
    *st = new_handle();
    return CUDA_SUCCESS;
}
OK(cuLinkAddData)
OK(cuLinkAddFile)
EXPORT CUresult cuLinkComplete(CUlinkState st, void **cubin, size_t *size) {
    (void)st;
    static char empty[16];
    if (cubin) *cubin = empty;
    if (size) *size = sizeof(empty);
    return CUDA_SUCCESS;
}
OK(cuLinkDestroy)
OK(cuTensorMapEncodeTiled)
OK(cuTensorMapEncodeIm2col)
/* memory through the driver API */
EXPORT CUresult cuMemAlloc(CUdeviceptr *dp, size_t size) {
    void *p;
    int r = dev_alloc(&p, size);
    *dp = (CUdeviceptr)(uintptr_t)p;
    return r == 0 ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
EXPORT CUresult cuMemFree(CUdeviceptr dp) {
    return dev_free((void *)(uintptr_t)dp) == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
EXPORT CUresult cuMemGetInfo(size_t *f, size_t *t) { mem_info(f, t); return CUDA_SUCCESS; }
EXPORT CUresult cuMemGetAddressRange(CUdeviceptr *base, size_t *size, CUdeviceptr dp) {
    if (base) *base = dp;
    if (size) *size = 0;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuMemsetD32Async(CUdeviceptr dp, unsigned int v, size_t n, CUstream s) {
    (void)s;
    unsigned int *p = (unsigned int *)(uintptr_t)dp;
    for (size_t i = 0; i < n; i++) p[i] = v;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuMemsetD8Async(CUdeviceptr dp, unsigned char v, size_t n, CUstream s) {
    (void)s;
    cudaMemset((void *)(uintptr_t)dp, v, n);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuMemcpyAsync(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st) {
    (void)st;
    memmove((void *)(uintptr_t)d, (const void *)(uintptr_t)s, n);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuPointerGetAttribute(void *data, CUpointer_attribute a, CUdeviceptr p) {
    switch (a) {
    case CU_POINTER_ATTRIBUTE_CONTEXT: *(CUcontext *)data = FAKE_CTX; break;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE: *(unsigned int *)data = CU_MEMORYTYPE_DEVICE; break;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER: *(CUdeviceptr *)data = p; break;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: *(int *)data = 0; break;
    default: return CUDA_ERROR_NOT_SUPPORTED;
    }
    return CUDA_SUCCESS;
}
OK(cuStreamWriteValue32)
OK(cuStreamWaitValue32)
OK(cuStreamSynchronize)
OK(cuCtxFromGreenCtx)
/* virtual memory management (expandable segments), multicast, green
 * contexts, logs: not supported */
DRV_UNSUPPORTED(cuMemCreate)
DRV_UNSUPPORTED(cuMemRelease)
DRV_UNSUPPORTED(cuMemMap)
DRV_UNSUPPORTED(cuMemUnmap)
DRV_UNSUPPORTED(cuMemSetAccess)
DRV_UNSUPPORTED(cuMemAddressReserve)
DRV_UNSUPPORTED(cuMemAddressFree)
DRV_UNSUPPORTED(cuMemGetAllocationGranularity)
DRV_UNSUPPORTED(cuMemGetAllocationPropertiesFromHandle)
DRV_UNSUPPORTED(cuMemRetainAllocationHandle)
DRV_UNSUPPORTED(cuMemExportToShareableHandle)
DRV_UNSUPPORTED(cuMemImportFromShareableHandle)
DRV_UNSUPPORTED(cuMulticastCreate)
DRV_UNSUPPORTED(cuMulticastAddDevice)
DRV_UNSUPPORTED(cuMulticastBindMem)
DRV_UNSUPPORTED(cuMulticastUnbind)
DRV_UNSUPPORTED(cuGreenCtxCreate)
DRV_UNSUPPORTED(cuGreenCtxDestroy)
DRV_UNSUPPORTED(cuGreenCtxStreamCreate)
DRV_UNSUPPORTED(cuDeviceGetDevResource)
DRV_UNSUPPORTED(cuDevSmResourceSplitByCount)
DRV_UNSUPPORTED(cuDevResourceGenerateDesc)
DRV_UNSUPPORTED(cuLogsRegisterCallback)
DRV_UNSUPPORTED(cuLogsUnregisterCallback)

EXPORT CUresult cuGetErrorString(CUresult e, const char **s) {
    *s = e == CUDA_SUCCESS ? "no error" : "fakegpu driver error";
    return CUDA_SUCCESS;
}
EXPORT CUresult cuGetErrorName(CUresult e, const char **s) {
    *s = e == CUDA_SUCCESS ? "CUDA_SUCCESS" : "CUDA_ERROR_FAKEGPU";
    return CUDA_SUCCESS;
}

/* Entry-point lookup by name: dlsym on this very library, preferring the
 * newest ABI variant we export (cuda.h maps e.g. cuMemAlloc to _v2). */
static void *lookup_driver_symbol(const char *symbol) {
    static void *self = NULL;
    if (!self) {
        Dl_info info;
        if (dladdr((void *)&lookup_driver_symbol, &info) && info.dli_fname)
            self = dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD);
        if (!self) return NULL;
    }
    static const char *suffixes[] = {"_v4", "_v3", "_v2", ""};
    char name[256];
    for (size_t i = 0; i < sizeof(suffixes) / sizeof(*suffixes); i++) {
        snprintf(name, sizeof(name), "%s%s", symbol, suffixes[i]);
        void *p = dlsym(self, name);
        if (p) return p;
    }
    if (debug_enabled()) fprintf(stderr, "[fakegpu] driver entry point not stubbed: %s\n", symbol);
    return NULL;
}
EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int ver, cuuint64_t flags,
                                 CUdriverProcAddressQueryResult *st) {
    (void)ver; (void)flags;
    *pfn = lookup_driver_symbol(symbol);
    if (st) *st = *pfn ? CU_GET_PROC_ADDRESS_SUCCESS : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return *pfn ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}
/* the pre-12.0 four-argument form, still exported by libcuda as
 * plain "cuGetProcAddress" */
EXPORT CUresult fakegpu_cuGetProcAddress_v1(const char *symbol, void **pfn, int ver,
                                            cuuint64_t flags) {
    (void)ver; (void)flags;
    *pfn = lookup_driver_symbol(symbol);
    return *pfn ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}
#undef cuGetProcAddress
ALIAS(cuGetProcAddress, fakegpu_cuGetProcAddress_v1)

/* ======================================================================== */
/* cuBLAS (libcublas) and cuBLASLt (libcublasLt).  Declared here without    */
/* their headers (which need the CUDA C++ fp16 headers); all handles are    */
/* opaque pointers and cublasStatus_t is an int (0 = success).             */
/* ======================================================================== */
typedef struct fake_blas {
    void *stream;
    int math_mode;
    int pointer_mode;
} fake_blas;

EXPORT int cublasCreate_v2(fake_blas **h) { *h = calloc(1, sizeof(fake_blas)); return 0; }
EXPORT int cublasDestroy_v2(fake_blas *h) { free(h); return 0; }
EXPORT int cublasSetStream_v2(fake_blas *h, void *s) { h->stream = s; return 0; }
EXPORT int cublasGetStream_v2(fake_blas *h, void **s) { *s = h->stream; return 0; }
EXPORT int cublasSetMathMode(fake_blas *h, int m) { h->math_mode = m; return 0; }
EXPORT int cublasGetMathMode(fake_blas *h, int *m) { *m = h->math_mode; return 0; }
EXPORT int cublasSetPointerMode_v2(fake_blas *h, int m) { h->pointer_mode = m; return 0; }
EXPORT int cublasGetPointerMode_v2(fake_blas *h, int *m) { *m = h->pointer_mode; return 0; }
EXPORT int cublasGetVersion_v2(fake_blas *h, int *v) { (void)h; *v = FAKEGPU_CUBLAS_VERSION; return 0; }
EXPORT int cublasGetProperty(int type, int *v) {
    *v = type == 0 ? FAKEGPU_CUBLAS_VERSION / 10000
       : type == 1 ? (FAKEGPU_CUBLAS_VERSION / 100) % 100 : FAKEGPU_CUBLAS_VERSION % 100;
    return 0;
}
EXPORT const char *cublasGetStatusString(int s) { return s ? "fakegpu cuBLAS error" : "CUBLAS_STATUS_SUCCESS"; }
EXPORT const char *cublasGetStatusName(int s) { return s ? "CUBLAS_STATUS_FAKEGPU" : "CUBLAS_STATUS_SUCCESS"; }
OK(cublasSetWorkspace_v2)
OK(cublasSetSmCountTarget)
OK(cublasSetAtomicsMode)
OK(cublasSetVectorAsync)
OK(cublasGetVectorAsync)
OK(cublasSetMatrixAsync)
OK(cublasGetMatrixAsync)

/* every compute routine torch (libtorch_cuda, libtorch_cuda_linalg) calls:
 * a no-op returning success.  Results (including dot/nrm2 scalars, which
 * torch asks to be written to device memory) are left as they are. */
OK(cublasGemmEx) OK(cublasGemmStridedBatchedEx) OK(cublasGemmBatchedEx) OK(cublasSgemmEx)
OK(cublasCgemmEx) OK(cublasDotEx) OK(cublasDotcEx) OK(cublasAxpyEx) OK(cublasScalEx)
OK(cublasSgemm_v2) OK(cublasDgemm_v2) OK(cublasCgemm_v2) OK(cublasZgemm_v2) OK(cublasHgemm)
OK(cublasSgemmStridedBatched) OK(cublasDgemmStridedBatched) OK(cublasCgemmStridedBatched)
OK(cublasZgemmStridedBatched) OK(cublasHgemmStridedBatched)
OK(cublasSgemmBatched) OK(cublasDgemmBatched) OK(cublasCgemmBatched) OK(cublasZgemmBatched)
OK(cublasSgemv_v2) OK(cublasDgemv_v2) OK(cublasCgemv_v2) OK(cublasZgemv_v2)
OK(cublasSdot_v2) OK(cublasDdot_v2) OK(cublasCdotc_v2) OK(cublasCdotu_v2) OK(cublasZdotc_v2)
OK(cublasZdotu_v2)
OK(cublasStrsm_v2) OK(cublasDtrsm_v2) OK(cublasCtrsm_v2) OK(cublasZtrsm_v2)
OK(cublasStrsmBatched) OK(cublasDtrsmBatched) OK(cublasCtrsmBatched) OK(cublasZtrsmBatched)
OK(cublasSgetrfBatched) OK(cublasDgetrfBatched) OK(cublasCgetrfBatched) OK(cublasZgetrfBatched)
OK(cublasSgetrsBatched) OK(cublasDgetrsBatched) OK(cublasCgetrsBatched) OK(cublasZgetrsBatched)
OK(cublasSgeqrfBatched) OK(cublasDgeqrfBatched) OK(cublasCgeqrfBatched) OK(cublasZgeqrfBatched)
OK(cublasSgelsBatched) OK(cublasDgelsBatched) OK(cublasCgelsBatched) OK(cublasZgelsBatched)
OK(cublasSaxpy_v2) OK(cublasDaxpy_v2) OK(cublasCaxpy_v2) OK(cublasZaxpy_v2)
OK(cublasScopy_v2) OK(cublasDcopy_v2) OK(cublasCcopy_v2) OK(cublasZcopy_v2)
OK(cublasSscal_v2) OK(cublasDscal_v2) OK(cublasCscal_v2) OK(cublasZscal_v2) OK(cublasCsscal_v2)
OK(cublasZdscal_v2)
OK(cublasSswap_v2) OK(cublasDswap_v2) OK(cublasCswap_v2) OK(cublasZswap_v2)
OK(cublasSnrm2_v2) OK(cublasDnrm2_v2) OK(cublasScnrm2_v2) OK(cublasDznrm2_v2)
OK(cublasSasum_v2) OK(cublasDasum_v2) OK(cublasScasum_v2) OK(cublasDzasum_v2)
OK(cublasIsamax_v2) OK(cublasIdamax_v2) OK(cublasIcamax_v2) OK(cublasIzamax_v2)
OK(cublasIsamin_v2) OK(cublasIdamin_v2) OK(cublasIcamin_v2) OK(cublasIzamin_v2)
OK(cublasSrot_v2) OK(cublasDrot_v2) OK(cublasCrot_v2) OK(cublasZrot_v2) OK(cublasCsrot_v2)
OK(cublasZdrot_v2)
OK(cublasSrotg_v2) OK(cublasDrotg_v2) OK(cublasCrotg_v2) OK(cublasZrotg_v2)
OK(cublasSrotm_v2) OK(cublasDrotm_v2) OK(cublasSrotmg_v2) OK(cublasDrotmg_v2)
OK(cublasSger_v2) OK(cublasDger_v2) OK(cublasCgeru_v2) OK(cublasCgerc_v2) OK(cublasZgeru_v2)
OK(cublasZgerc_v2)
OK(cublasSsymv_v2) OK(cublasDsymv_v2) OK(cublasCsymv_v2) OK(cublasZsymv_v2)
OK(cublasChemv_v2) OK(cublasZhemv_v2)
OK(cublasSsyr_v2) OK(cublasDsyr_v2) OK(cublasCsyr_v2) OK(cublasZsyr_v2) OK(cublasCher_v2)
OK(cublasZher_v2)
OK(cublasSsyr2_v2) OK(cublasDsyr2_v2) OK(cublasCsyr2_v2) OK(cublasZsyr2_v2) OK(cublasCher2_v2)
OK(cublasZher2_v2)
OK(cublasSsymm_v2) OK(cublasDsymm_v2) OK(cublasCsymm_v2) OK(cublasZsymm_v2) OK(cublasChemm_v2)
OK(cublasZhemm_v2)
OK(cublasSsyrk_v2) OK(cublasDsyrk_v2) OK(cublasCsyrk_v2) OK(cublasZsyrk_v2) OK(cublasCherk_v2)
OK(cublasZherk_v2)
OK(cublasSsyr2k_v2) OK(cublasDsyr2k_v2) OK(cublasCsyr2k_v2) OK(cublasZsyr2k_v2)
OK(cublasCher2k_v2) OK(cublasZher2k_v2)
OK(cublasStrmm_v2) OK(cublasDtrmm_v2) OK(cublasCtrmm_v2) OK(cublasZtrmm_v2)
OK(cublasStrmv_v2) OK(cublasDtrmv_v2) OK(cublasCtrmv_v2) OK(cublasZtrmv_v2)
OK(cublasStrsv_v2) OK(cublasDtrsv_v2) OK(cublasCtrsv_v2) OK(cublasZtrsv_v2)

/* --- cuBLASLt --- */
typedef struct { uint64_t data[8]; } fake_lt_algo;
typedef struct {
    fake_lt_algo algo;
    size_t workspaceSize;
    int state;
    float wavesCount;
    int reserved[4];
} fake_lt_heuristic;

EXPORT size_t cublasLtGetVersion(void) { return FAKEGPU_CUBLAS_VERSION; }
EXPORT size_t cublasLtGetCudartVersion(void) { return CUDART_VERSION; }
EXPORT int cublasLtCreate(void **h) { *h = new_handle(); return 0; }
EXPORT int cublasLtDestroy(void *h) { free(h); return 0; }
/* descriptor objects: a handle each; attributes are accepted and dropped */
EXPORT int cublasLtMatmulDescCreate(void **d, int computeType, int scaleType) {
    (void)computeType; (void)scaleType;
    *d = new_handle();
    return 0;
}
EXPORT int cublasLtMatmulDescDestroy(void *d) { free(d); return 0; }
EXPORT int cublasLtMatrixLayoutCreate(void **l, int type, uint64_t rows, uint64_t cols, int64_t ld) {
    (void)type; (void)rows; (void)cols; (void)ld;
    *l = new_handle();
    return 0;
}
EXPORT int cublasLtMatrixLayoutDestroy(void *l) { free(l); return 0; }
EXPORT int cublasLtMatmulPreferenceCreate(void **p) { *p = new_handle(); return 0; }
EXPORT int cublasLtMatmulPreferenceDestroy(void *p) { free(p); return 0; }
OK(cublasLtMatmulDescSetAttribute)
OK(cublasLtMatrixLayoutSetAttribute)
OK(cublasLtMatmulPreferenceSetAttribute)
OK(cublasLtMatmulAlgoConfigSetAttribute)
OK(cublasLtMatmulAlgoInit)
EXPORT int cublasLtMatmulDescGetAttribute(void *d, int attr, void *buf, size_t size,
                                          size_t *written) {
    (void)d; (void)attr;
    if (buf && size) memset(buf, 0, size);
    if (written) *written = size;
    return 0;
}
EXPORT int cublasLtMatrixLayoutGetAttribute(void *l, int attr, void *buf, size_t size,
                                            size_t *written) {
    return cublasLtMatmulDescGetAttribute(l, attr, buf, size, written);
}
EXPORT int cublasLtMatmulAlgoConfigGetAttribute(const fake_lt_algo *a, int attr, void *buf,
                                                size_t size, size_t *written) {
    return cublasLtMatmulDescGetAttribute((void *)a, attr, buf, size, written);
}
/* one algorithm that needs no workspace */
EXPORT int cublasLtMatmulAlgoGetHeuristic(void *h, void *op, void *A, void *B, void *C, void *D,
                                          void *pref, int requested, fake_lt_heuristic *res,
                                          int *returned) {
    (void)h; (void)op; (void)A; (void)B; (void)C; (void)D; (void)pref;
    if (requested < 1) { *returned = 0; return 7; /* CUBLAS_STATUS_INVALID_VALUE */ }
    memset(res, 0, sizeof(*res));
    res->workspaceSize = 0;
    res->state = 0;
    res->wavesCount = 1.0f;
    *returned = 1;
    return 0;
}
EXPORT int cublasLtMatmulAlgoCheck(void *h, void *op, void *A, void *B, void *C, void *D,
                                   const fake_lt_algo *algo, fake_lt_heuristic *res) {
    (void)h; (void)op; (void)A; (void)B; (void)C; (void)D;
    memset(res, 0, sizeof(*res));
    if (algo) res->algo = *algo;
    res->wavesCount = 1.0f;
    return 0;
}
OK(cublasLtMatmul)
