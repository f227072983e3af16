/*
 * fakegpu NCCL stub: the nccl* entry points PyTorch's CUDA build imports
 * (libtorch_cuda's ProcessGroupNCCL and torch.cuda.nccl), answered without a
 * GPU and without a network.  Compiled by build.py into the same libcuda.so.1
 * as stub.c (when the venv's nvidia/nccl wheel has nccl.h), so the
 * LD_PRELOADed stub also satisfies the ncclXxx imports before libnccl.so.2
 * can; the real NCCL is still loaded (torch's DT_NEEDED) but never called.
 *
 * Each rank is its own process on its own fake device 0.  PyTorch exchanges
 * the unique id through its store (TCPStore or FileStore) as it does on a real
 * cluster; the communicator here only remembers its rank and size.  Nothing
 * crosses between processes: every collective acts as if every rank held what
 * this one holds, on the host memory that stands for device memory:
 *   - all-gather: the send buffer copied into every rank's slot;
 *   - reduce-scatter: this rank's chunk of the send buffer copied out;
 *   - all-reduce, broadcast, reduce: the send buffer copied to the receive
 *     buffer when they differ (a sum of equal values is not computed; values
 *     on the fake GPU are meaningless anyway, kernels do not run);
 *   - all-to-all, gather: this rank's slot copied; send, receive: nothing.
 * So shape and metadata checks that compare ranks (DDP's parameter check,
 * broadcasts of module states) see agreeing ranks, and everything PyTorch
 * allocates around a collective goes through its own caching allocator as on
 * a GPU.
 *
 * What it cannot know: the memory NCCL itself takes on a real GPU (its
 * channels' FIFO buffers, proxy and NVLS/IB registration buffers, the
 * per-communicator device state), which is outside PyTorch's allocator and
 * so in neither max_memory_allocated nor max_memory_reserved; ncclMemAlloc
 * (user-buffer registration pools, symmetric memory) is plain host memory.
 * ncclCommSplit learns the new communicator's size and rank from the other
 * ranks' colours and keys: each rank of the parent writes its own to a file
 * in FAKEGPU_NCCL_DIR (the rank processes' shared folder, fxmem.validate.
 * fakegpu.ranks) and reads the others' (a parent known by its unique id, the
 * split by its number); without that folder the size is unknown (-1), the
 * rank the key.
 */
#define _GNU_SOURCE
/* nccl.h includes the half-precision headers, which need CCCL's <nv/target> (not in the
 * wheels) and are not used by any declaration here: their include guards set first */
#define __CUDA_FP16_H__
#define __CUDA_BF16_H__
#include <nccl.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

struct ncclComm {
    int rank;
    int nranks;
    unsigned long long uid; /* the same on every rank of the communicator */
    unsigned splits;        /* ncclCommSplit calls on it so far */
};

static int debug_on(void) {
    static int v = -1;
    if (v < 0) {
        const char *e = getenv("FAKEGPU_DEBUG");
        v = (e && *e && *e != '0') ? 1 : 0;
    }
    return v;
}

#define LOG(...)                                                                   \
    do {                                                                           \
        if (debug_on()) {                                                          \
            fprintf(stderr, "[fakegpu nccl] " __VA_ARGS__);                        \
            fputc('\n', stderr);                                                   \
        }                                                                          \
    } while (0)

static size_t type_size(ncclDataType_t t) {
    switch (t) {
    case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    default: return 8;
    }
}

static void copy(void *dst, const void *src, size_t n) {
    if (dst && src && dst != src && n) memmove(dst, src, n);
}

static ncclComm_t new_comm(int rank, int nranks) {
    ncclComm_t c = calloc(1, sizeof(struct ncclComm));
    if (c) {
        c->rank = rank;
        c->nranks = nranks;
    }
    return c;
}

static unsigned long long mix(unsigned long long h, const void *p, size_t n) {
    const unsigned char *b = p; /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ULL;
    return h;
}

/* The colours and keys of every rank of ``comm`` for its next split, this rank's written
 * first; 0 when they were read (into colors/keys, nranks entries), -1 when they cannot be. */
static int split_exchange(ncclComm_t comm, unsigned seq, int color, int key, int *colors,
                          int *keys) {
    const char *dir = getenv("FAKEGPU_NCCL_DIR");
    if (!dir || !*dir || comm->nranks < 1) return -1;
    char path[4096], tmp[4200];
    snprintf(path, sizeof(path), "%s/split-%llx-%u-%d", dir, comm->uid, seq, comm->rank);
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) return -1;
    fprintf(f, "%d %d\n", color, key);
    fclose(f);
    if (rename(tmp, path) != 0) return -1;
    for (int r = 0; r < comm->nranks; r++) {
        snprintf(path, sizeof(path), "%s/split-%llx-%u-%d", dir, comm->uid, seq, r);
        for (int waited = 0;; waited++) { /* up to a minute: every rank splits at once */
            f = fopen(path, "r");
            if (f) break;
            if (waited > 60000) return -1;
            usleep(1000);
        }
        int ok = fscanf(f, "%d %d", &colors[r], &keys[r]) == 2;
        fclose(f);
        if (!ok) return -1;
    }
    return 0;
}

/* --- versions, ids, errors ------------------------------------------------ */
EXPORT ncclResult_t ncclGetVersion(int *version) {
    if (!version) return ncclInvalidArgument;
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}

EXPORT ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    static unsigned counter = 0;
    if (!id) return ncclInvalidArgument;
    memset(id, 0, sizeof(*id));
    snprintf(id->internal, sizeof(id->internal), "fakegpu-nccl-%d-%u", (int)getpid(),
             __atomic_fetch_add(&counter, 1, __ATOMIC_RELAXED));
    return ncclSuccess;
}

EXPORT ncclResult_t ncclCommGetUniqueId(ncclComm_t comm, ncclUniqueId *id) {
    (void)comm;
    return ncclGetUniqueId(id);
}

EXPORT const char *ncclGetErrorString(ncclResult_t r) {
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclInvalidArgument: return "invalid argument (fakegpu NCCL stub)";
    case ncclInvalidUsage: return "invalid usage (fakegpu NCCL stub: not supported)";
    default: return "unknown result (fakegpu NCCL stub)";
    }
}

EXPORT const char *ncclGetLastError(ncclComm_t comm) {
    (void)comm;
    return "";
}

EXPORT ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *err) {
    (void)comm;
    if (err) *err = ncclSuccess;
    return ncclSuccess;
}

/* --- communicators -------------------------------------------------------- */
EXPORT ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
    if (!comm || nranks < 1 || rank < 0 || rank >= nranks) return ncclInvalidArgument;
    *comm = new_comm(rank, nranks);
    if (*comm) (*comm)->uid = mix(1469598103934665603ULL, id.internal, sizeof(id.internal));
    return *comm ? ncclSuccess : ncclSystemError;
}

EXPORT ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id,
                                           int rank, ncclConfig_t *config) {
    (void)config;
    return ncclCommInitRank(comm, nranks, id, rank);
}

EXPORT ncclResult_t ncclCommInitRankScalable(ncclComm_t *comm, int nranks, int rank, int nId,
                                             ncclUniqueId *ids, ncclConfig_t *config) {
    (void)nId;
    (void)config;
    ncclUniqueId none;
    memset(&none, 0, sizeof(none));
    return ncclCommInitRank(comm, nranks, ids ? ids[0] : none, rank);
}

EXPORT ncclResult_t ncclCommInitAll(ncclComm_t *comms, int ndev, const int *devlist) {
    (void)devlist;
    if (!comms || ndev < 1) return ncclInvalidArgument;
    for (int i = 0; i < ndev; i++) comms[i] = new_comm(i, ndev);
    return ncclSuccess;
}

EXPORT ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                                  ncclConfig_t *config) {
    (void)config;
    if (!newcomm) return ncclInvalidArgument;
    unsigned seq = comm ? comm->splits++ : 0;
    int n = comm ? comm->nranks : 0;
    int *colors = n > 0 ? calloc((size_t)n, sizeof(int)) : NULL;
    int *keys = n > 0 ? calloc((size_t)n, sizeof(int)) : NULL;
    int known = colors && keys && split_exchange(comm, seq, color, key, colors, keys) == 0;
    int size = -1, rank = key;
    if (known) { /* ranked by key, then by the parent's rank, as NCCL does */
        size = rank = 0;
        for (int r = 0; r < n; r++) {
            if (colors[r] != color) continue;
            size++;
            if (keys[r] < key || (keys[r] == key && r < comm->rank)) rank++;
        }
    }
    free(colors);
    free(keys);
    LOG("ncclCommSplit colour %d key %d: rank %d of %d", color, key, rank, size);
    if (color == NCCL_SPLIT_NOCOLOR) {
        *newcomm = NULL;
        return ncclSuccess;
    }
    *newcomm = new_comm(rank, size);
    if (*newcomm && comm) {
        unsigned long long h = mix(comm->uid, &seq, sizeof(seq));
        (*newcomm)->uid = mix(h, &color, sizeof(color));
    }
    return *newcomm ? ncclSuccess : ncclSystemError;
}

EXPORT ncclResult_t ncclCommShrink(ncclComm_t comm, int *exclude, int nexclude,
                                   ncclComm_t *newcomm, ncclConfig_t *config, int flags) {
    (void)exclude;
    (void)config;
    (void)flags;
    if (!comm || !newcomm) return ncclInvalidArgument;
    *newcomm = new_comm(comm->rank, comm->nranks > 0 ? comm->nranks - nexclude : -1);
    return ncclSuccess;
}

EXPORT ncclResult_t ncclCommGrow(ncclComm_t comm, int nranks, const ncclUniqueId *id, int rank,
                                 ncclComm_t *newcomm, ncclConfig_t *config) {
    (void)id;
    (void)config;
    if (!newcomm) return ncclInvalidArgument;
    *newcomm = new_comm(comm ? comm->rank : rank, nranks);
    return ncclSuccess;
}

EXPORT ncclResult_t ncclCommFinalize(ncclComm_t comm) {
    (void)comm;
    return ncclSuccess;
}

EXPORT ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    free(comm);
    return ncclSuccess;
}

EXPORT ncclResult_t ncclCommAbort(ncclComm_t comm) {
    free(comm);
    return ncclSuccess;
}

EXPORT ncclResult_t ncclCommRevoke(ncclComm_t comm, int flags) {
    (void)comm;
    (void)flags;
    return ncclSuccess;
}

EXPORT ncclResult_t ncclCommSuspend(ncclComm_t comm, int flags) {
    (void)comm;
    (void)flags;
    return ncclSuccess;
}

EXPORT ncclResult_t ncclCommResume(ncclComm_t comm) {
    (void)comm;
    return ncclSuccess;
}

EXPORT ncclResult_t ncclCommCount(const ncclComm_t comm, int *count) {
    if (!comm || !count) return ncclInvalidArgument;
    *count = comm->nranks;
    return ncclSuccess;
}

EXPORT ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device) {
    (void)comm;
    if (!device) return ncclInvalidArgument;
    *device = 0;
    return ncclSuccess;
}

EXPORT ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank) {
    if (!comm || !rank) return ncclInvalidArgument;
    *rank = comm->rank;
    return ncclSuccess;
}

EXPORT ncclResult_t ncclCommMemStats(ncclComm_t comm, ncclCommMemStat_t stat, uint64_t *value) {
    (void)comm;
    (void)stat;
    if (value) *value = 0; /* NCCL's own device memory: not known here */
    return ncclSuccess;
}

/* --- memory, registration, windows ---------------------------------------- */
EXPORT ncclResult_t ncclMemAlloc(void **ptr, size_t size) {
    if (!ptr) return ncclInvalidArgument;
    *ptr = calloc(1, size ? size : 1);
    return *ptr ? ncclSuccess : ncclSystemError;
}

EXPORT ncclResult_t ncclMemFree(void *ptr) {
    free(ptr);
    return ncclSuccess;
}

EXPORT ncclResult_t ncclCommRegister(const ncclComm_t comm, void *buff, size_t size,
                                     void **handle) {
    (void)comm;
    (void)size;
    if (handle) *handle = buff;
    return ncclSuccess;
}

EXPORT ncclResult_t ncclCommDeregister(const ncclComm_t comm, void *handle) {
    (void)comm;
    (void)handle;
    return ncclSuccess;
}

/* symmetric memory (windows, device communicators, signals): not emulated */
EXPORT ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void *buff, size_t size,
                                           ncclWindow_t *win, int flags) {
    (void)comm; (void)buff; (void)size; (void)win; (void)flags;
    return ncclInvalidUsage;
}

EXPORT ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win) {
    (void)comm; (void)win;
    return ncclInvalidUsage;
}

EXPORT ncclResult_t ncclWinGetUserPtr(ncclComm_t comm, ncclWindow_t win, void **out) {
    (void)comm; (void)win; (void)out;
    return ncclInvalidUsage;
}

EXPORT ncclResult_t ncclPutSignal(const void *localbuff, size_t count, ncclDataType_t datatype,
                                  int peer, ncclWindow_t peerWin, size_t peerWinOffset,
                                  int sigIdx, int ctx, unsigned int flags, ncclComm_t comm,
                                  cudaStream_t stream) {
    (void)localbuff; (void)count; (void)datatype; (void)peer; (void)peerWin;
    (void)peerWinOffset; (void)sigIdx; (void)ctx; (void)flags; (void)comm; (void)stream;
    return ncclInvalidUsage;
}

EXPORT ncclResult_t ncclSignal(int peer, int sigIdx, int ctx, unsigned int flags,
                               ncclComm_t comm, cudaStream_t stream) {
    (void)peer; (void)sigIdx; (void)ctx; (void)flags; (void)comm; (void)stream;
    return ncclInvalidUsage;
}

EXPORT ncclResult_t ncclWaitSignal(int nDesc, ncclWaitSignalDesc_t *descs, ncclComm_t comm,
                                   cudaStream_t stream) {
    (void)nDesc; (void)descs; (void)comm; (void)stream;
    return ncclInvalidUsage;
}

/* declared in nccl_device/core.h (C++ only): any signature, never reached by default */
EXPORT ncclResult_t ncclDevCommCreate(void) { return ncclInvalidUsage; }
EXPORT ncclResult_t ncclDevCommDestroy(void) { return ncclInvalidUsage; }
EXPORT ncclResult_t ncclGetPeerDevicePointer(void) { return ncclInvalidUsage; }
EXPORT ncclResult_t ncclGetLsaMultimemDevicePointer(void) { return ncclInvalidUsage; }

/* --- reduction operators, groups ------------------------------------------ */
EXPORT ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t *op, void *scalar,
                                             ncclDataType_t datatype,
                                             ncclScalarResidence_t residence, ncclComm_t comm) {
    (void)scalar; (void)datatype; (void)residence; (void)comm;
    if (!op) return ncclInvalidArgument;
    *op = (ncclRedOp_t)ncclNumOps;
    return ncclSuccess;
}

EXPORT ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm) {
    (void)op; (void)comm;
    return ncclSuccess;
}

EXPORT ncclResult_t ncclGroupStart(void) { return ncclSuccess; }
EXPORT ncclResult_t ncclGroupEnd(void) { return ncclSuccess; }
EXPORT ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t *info) {
    if (info) info->estimatedTime = 0.0f;
    return ncclSuccess;
}

/* --- collectives: every rank holds what this one holds --------------------- */
EXPORT ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                                  ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                  cudaStream_t stream) {
    LOG("ncclAllReduce %zu x %d, comm rank %d of %d", (size_t)count, (int)datatype, comm ? comm->rank : -1, comm ? comm->nranks : -1);
    (void)op; (void)comm; (void)stream;
    copy(recvbuff, sendbuff, count * type_size(datatype));
    return ncclSuccess;
}

EXPORT ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count,
                               ncclDataType_t datatype, ncclRedOp_t op, int root,
                               ncclComm_t comm, cudaStream_t stream) {
    LOG("ncclReduce %zu x %d, comm rank %d of %d", (size_t)count, (int)datatype, comm ? comm->rank : -1, comm ? comm->nranks : -1);
    (void)op; (void)stream;
    if (comm && comm->rank == root) copy(recvbuff, sendbuff, count * type_size(datatype));
    return ncclSuccess;
}

EXPORT ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                                  ncclDataType_t datatype, int root, ncclComm_t comm,
                                  cudaStream_t stream) {
    LOG("ncclBroadcast %zu x %d, comm rank %d of %d", (size_t)count, (int)datatype, comm ? comm->rank : -1, comm ? comm->nranks : -1);
    (void)root; (void)comm; (void)stream;
    copy(recvbuff, sendbuff, count * type_size(datatype));
    return ncclSuccess;
}

EXPORT ncclResult_t ncclBcast(void *buff, size_t count, ncclDataType_t datatype, int root,
                              ncclComm_t comm, cudaStream_t stream) {
    LOG("ncclBcast %zu x %d, comm rank %d of %d", (size_t)count, (int)datatype, comm ? comm->rank : -1, comm ? comm->nranks : -1);
    (void)buff; (void)count; (void)datatype; (void)root; (void)comm; (void)stream;
    return ncclSuccess;
}

EXPORT ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                                  ncclDataType_t datatype, ncclComm_t comm,
                                  cudaStream_t stream) {
    LOG("ncclAllGather %zu x %d, comm rank %d of %d", (size_t)sendcount, (int)datatype, comm ? comm->rank : -1, comm ? comm->nranks : -1);
    (void)stream;
    size_t n = sendcount * type_size(datatype);
    int world = comm ? comm->nranks : -1;
    if (world < 1) /* size unknown (a split communicator): this rank's slot */
        copy((char *)recvbuff + (size_t)(comm ? comm->rank : 0) * n, sendbuff, n);
    for (int r = 0; r < world; r++) copy((char *)recvbuff + (size_t)r * n, sendbuff, n);
    return ncclSuccess;
}

EXPORT ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                                      ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                      cudaStream_t stream) {
    LOG("ncclReduceScatter %zu x %d, comm rank %d of %d", (size_t)recvcount, (int)datatype, comm ? comm->rank : -1, comm ? comm->nranks : -1);
    (void)op; (void)stream;
    size_t n = recvcount * type_size(datatype);
    copy(recvbuff, (const char *)sendbuff + (size_t)(comm ? comm->rank : 0) * n, n);
    return ncclSuccess;
}

EXPORT ncclResult_t ncclAlltoAll(const void *sendbuff, void *recvbuff, size_t count,
                                 ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
    LOG("ncclAlltoAll %zu x %d, comm rank %d of %d", (size_t)count, (int)datatype, comm ? comm->rank : -1, comm ? comm->nranks : -1);
    (void)stream;
    size_t n = count * type_size(datatype), off = (size_t)(comm ? comm->rank : 0) * n;
    copy((char *)recvbuff + off, (const char *)sendbuff + off, n);
    return ncclSuccess;
}

EXPORT ncclResult_t ncclGather(const void *sendbuff, void *recvbuff, size_t count,
                               ncclDataType_t datatype, int root, ncclComm_t comm,
                               cudaStream_t stream) {
    LOG("ncclGather %zu x %d, comm rank %d of %d", (size_t)count, (int)datatype, comm ? comm->rank : -1, comm ? comm->nranks : -1);
    (void)stream;
    size_t n = count * type_size(datatype);
    if (comm && comm->rank == root) copy((char *)recvbuff + (size_t)comm->rank * n, sendbuff, n);
    return ncclSuccess;
}

EXPORT ncclResult_t ncclScatter(const void *sendbuff, void *recvbuff, size_t count,
                                ncclDataType_t datatype, int root, ncclComm_t comm,
                                cudaStream_t stream) {
    LOG("ncclScatter %zu x %d, comm rank %d of %d", (size_t)count, (int)datatype, comm ? comm->rank : -1, comm ? comm->nranks : -1);
    (void)root; (void)stream;
    size_t n = count * type_size(datatype);
    copy(recvbuff, (const char *)sendbuff + (size_t)(comm ? comm->rank : 0) * n, n);
    return ncclSuccess;
}

EXPORT ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype,
                             int peer, ncclComm_t comm, cudaStream_t stream) {
    LOG("ncclSend %zu x %d, comm rank %d of %d", (size_t)count, (int)datatype, comm ? comm->rank : -1, comm ? comm->nranks : -1);
    (void)sendbuff; (void)count; (void)datatype; (void)peer; (void)comm; (void)stream;
    return ncclSuccess;
}

EXPORT ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
                             ncclComm_t comm, cudaStream_t stream) {
    LOG("ncclRecv %zu x %d, comm rank %d of %d", (size_t)count, (int)datatype, comm ? comm->rank : -1, comm ? comm->nranks : -1);
    (void)recvbuff; (void)count; (void)datatype; (void)peer; (void)comm; (void)stream;
    return ncclSuccess;
}
