/*
 * fakegpu cuDNN stub: the cuDNN 9 entry points PyTorch's CUDA build imports,
 * answered without a GPU.  Compiled by build.py into the same libcuda.so.1
 * as stub.c (when the venv has cuDNN's headers), so the LD_PRELOADed stub
 * also satisfies libtorch_cuda's cudnn* imports before libcudnn.so.9 can.
 *
 * Why a stub and not the real library: libcudnn's sub-libraries link the
 * CUDA runtime statically, and that runtime reaches the driver through
 * cuGetExportTable (private, undocumented function tables) before it will
 * even count devices; cudnnCreate then fails with
 * CUDNN_STATUS_NOT_INITIALIZED.  So the fake GPU answers cuDNN itself.
 *
 * What it does:
 *   - handles and the legacy descriptors (tensor, filter, convolution,
 *     RNN, dropout, ...) are plain host objects; tensor and filter
 *     descriptors keep their shape so PyTorch can read it back;
 *   - the backend ("graph") API that cudnn_frontend drives for
 *     convolutions keeps every attribute it is given, per descriptor;
 *     heuristics return one engine (global index 0, no knobs, no notes,
 *     no shared memory), an operation graph counts one engine, and every
 *     execution plan's workspace (convolutions, and cuDNN attention's graphs)
 *     is FAKEGPU_CUDNN_WORKSPACE bytes (default 0);
 *   - the legacy convolution algorithm queries return one algorithm with
 *     that same workspace;
 *   - batch-norm workspaces and reserve space, RNN workspace and reserve
 *     space and the dropout state size are 0 bytes;
 *   - RNN weights have cuDNN's canonical per-layer layout (input matrices,
 *     recurrent matrices, projection, then the two bias sets), so PyTorch's
 *     flat weight buffer has the size and views it has on a real GPU;
 *   - every compute call (convolutions, executions, batch norm, RNN, CTC,
 *     spatial transformer, pooling) does nothing and returns success.
 *
 * The sizes that cuDNN's own heuristics would choose on a real H100 are not
 * known here: whatever a real cuDNN allocates for its workspaces differs
 * from what the fake GPU reports.  FAKEGPU_DEBUG=1 logs backend attributes
 * asked for that the stub does not know.
 */
#define _GNU_SOURCE
#include <cudnn.h>

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))
#define ALIAS(name, target)                                                    \
    __asm__(".globl " #name "\n\t.type " #name ", @function\n\t.set " #name \
            ", " #target "\n");
#define CUDNN_OK(name) ALIAS(name, fakegpu_cudnn_ok)

EXPORT int fakegpu_cudnn_ok(void) { return 0; /* CUDNN_STATUS_SUCCESS */ }

static int cudnn_debug(void) {
    static int v = -1;
    if (v < 0) {
        const char *e = getenv("FAKEGPU_DEBUG");
        v = (e && *e && *e != '0') ? 1 : 0;
    }
    return v;
}

/* The workspace every execution plan / convolution algorithm reports (bytes). */
static size_t conv_workspace(void) {
    static long long v = -1;
    if (v < 0) {
        const char *e = getenv("FAKEGPU_CUDNN_WORKSPACE");
        v = (e && *e) ? atoll(e) : 0;
        if (v < 0) v = 0;
    }
    return (size_t)v;
}

/* ------------------------------------------------------------------------ */
/* Library, handle                                                          */
/* ------------------------------------------------------------------------ */
struct cudnnContext { cudaStream_t stream; };

EXPORT size_t cudnnGetVersion(void) { return CUDNN_VERSION; }
EXPORT size_t cudnnGetCudartVersion(void) { return CUDART_VERSION; }
EXPORT cudnnStatus_t cudnnGetProperty(libraryPropertyType type, int *value) {
    switch (type) {
    case MAJOR_VERSION: *value = CUDNN_MAJOR; break;
    case MINOR_VERSION: *value = CUDNN_MINOR; break;
    case PATCH_LEVEL: *value = CUDNN_PATCHLEVEL; break;
    default: return CUDNN_STATUS_BAD_PARAM;
    }
    return CUDNN_STATUS_SUCCESS;
}
EXPORT const char *cudnnGetErrorString(cudnnStatus_t s) {
    return s == CUDNN_STATUS_SUCCESS ? "CUDNN_STATUS_SUCCESS" : "CUDNN_STATUS_FAKEGPU_ERROR";
}
EXPORT void cudnnGetLastErrorString(char *message, size_t max_size) {
    if (message && max_size) message[0] = '\0';
}
EXPORT cudnnStatus_t cudnnCreate(cudnnHandle_t *h) {
    *h = calloc(1, sizeof(struct cudnnContext));
    return *h ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_ALLOC_FAILED;
}
EXPORT cudnnStatus_t cudnnDestroy(cudnnHandle_t h) { free(h); return CUDNN_STATUS_SUCCESS; }
EXPORT cudnnStatus_t cudnnSetStream(cudnnHandle_t h, cudaStream_t s) {
    h->stream = s;
    return CUDNN_STATUS_SUCCESS;
}
EXPORT cudnnStatus_t cudnnGetStream(cudnnHandle_t h, cudaStream_t *s) {
    *s = h->stream;
    return CUDNN_STATUS_SUCCESS;
}

/* ------------------------------------------------------------------------ */
/* Legacy descriptors                                                       */
/* ------------------------------------------------------------------------ */
#define MAXD 8
struct cudnnTensorStruct {
    cudnnDataType_t dtype;
    int nb;
    int dims[MAXD];
    int strides[MAXD];
};
struct cudnnFilterStruct {
    cudnnDataType_t dtype;
    cudnnTensorFormat_t format;
    int nb;
    int dims[MAXD];
};
struct cudnnRNNStruct {
    cudnnRNNMode_t cell;
    cudnnRNNBiasMode_t bias;
    cudnnDirectionMode_t dir;
    cudnnDataType_t dtype;
    int input, hidden, proj, layers;
};

EXPORT cudnnStatus_t cudnnCreateTensorDescriptor(cudnnTensorDescriptor_t *d) {
    *d = calloc(1, sizeof(**d));
    return CUDNN_STATUS_SUCCESS;
}
EXPORT cudnnStatus_t cudnnDestroyTensorDescriptor(cudnnTensorDescriptor_t d) {
    free(d);
    return CUDNN_STATUS_SUCCESS;
}
EXPORT cudnnStatus_t cudnnSetTensorNdDescriptor(cudnnTensorDescriptor_t d, cudnnDataType_t dt,
                                                int nb, const int dims[], const int strides[]) {
    if (nb < 0 || nb > MAXD) return CUDNN_STATUS_NOT_SUPPORTED;
    d->dtype = dt;
    d->nb = nb;
    for (int i = 0; i < nb; i++) {
        d->dims[i] = dims[i];
        d->strides[i] = strides ? strides[i] : 0;
    }
    return CUDNN_STATUS_SUCCESS;
}
EXPORT cudnnStatus_t cudnnGetTensorNdDescriptor(const cudnnTensorDescriptor_t d, int req,
                                                cudnnDataType_t *dt, int *nb, int dims[],
                                                int strides[]) {
    if (dt) *dt = d->dtype;
    if (nb) *nb = d->nb;
    for (int i = 0; i < d->nb && i < req; i++) {
        if (dims) dims[i] = d->dims[i];
        if (strides) strides[i] = d->strides[i];
    }
    return CUDNN_STATUS_SUCCESS;
}
EXPORT cudnnStatus_t cudnnCreateFilterDescriptor(cudnnFilterDescriptor_t *d) {
    *d = calloc(1, sizeof(**d));
    return CUDNN_STATUS_SUCCESS;
}
EXPORT cudnnStatus_t cudnnDestroyFilterDescriptor(cudnnFilterDescriptor_t d) {
    free(d);
    return CUDNN_STATUS_SUCCESS;
}
EXPORT cudnnStatus_t cudnnSetFilterNdDescriptor(cudnnFilterDescriptor_t d, cudnnDataType_t dt,
                                                cudnnTensorFormat_t f, int nb, const int dims[]) {
    if (nb < 0 || nb > MAXD) return CUDNN_STATUS_NOT_SUPPORTED;
    d->dtype = dt;
    d->format = f;
    d->nb = nb;
    for (int i = 0; i < nb; i++) d->dims[i] = dims[i];
    return CUDNN_STATUS_SUCCESS;
}
EXPORT cudnnStatus_t cudnnGetFilterNdDescriptor(const cudnnFilterDescriptor_t d, int req,
                                                cudnnDataType_t *dt, cudnnTensorFormat_t *f,
                                                int *nb, int dims[]) {
    if (dt) *dt = d->dtype;
    if (f) *f = d->format;
    if (nb) *nb = d->nb;
    for (int i = 0; i < d->nb && i < req; i++) dims[i] = d->dims[i];
    return CUDNN_STATUS_SUCCESS;
}

/* descriptors whose contents nobody reads back: an opaque block each */
static void *opaque(void) { return calloc(1, 64); }
#define OPAQUE_DESC(kind, type)                                                   \
    EXPORT cudnnStatus_t cudnnCreate##kind##Descriptor(type *d) {                 \
        *d = opaque();                                                            \
        return CUDNN_STATUS_SUCCESS;                                              \
    }                                                                             \
    EXPORT cudnnStatus_t cudnnDestroy##kind##Descriptor(type d) {                 \
        free(d);                                                                  \
        return CUDNN_STATUS_SUCCESS;                                              \
    }
OPAQUE_DESC(Convolution, cudnnConvolutionDescriptor_t)
OPAQUE_DESC(Activation, cudnnActivationDescriptor_t)
OPAQUE_DESC(Pooling, cudnnPoolingDescriptor_t)
OPAQUE_DESC(Dropout, cudnnDropoutDescriptor_t)
OPAQUE_DESC(RNNData, cudnnRNNDataDescriptor_t)
OPAQUE_DESC(CTCLoss, cudnnCTCLossDescriptor_t)
OPAQUE_DESC(SpatialTransformer, cudnnSpatialTransformerDescriptor_t)

CUDNN_OK(cudnnSetConvolutionNdDescriptor)
CUDNN_OK(cudnnSetConvolutionGroupCount)
CUDNN_OK(cudnnSetConvolutionMathType)
CUDNN_OK(cudnnSetActivationDescriptor)
CUDNN_OK(cudnnSetPooling2dDescriptor)
CUDNN_OK(cudnnSetDropoutDescriptor)
CUDNN_OK(cudnnRestoreDropoutDescriptor)
CUDNN_OK(cudnnSetRNNDataDescriptor)
CUDNN_OK(cudnnSetCTCLossDescriptorEx)
CUDNN_OK(cudnnSetCTCLossDescriptor_v9)
CUDNN_OK(cudnnSetSpatialTransformerNdDescriptor)

/* ------------------------------------------------------------------------ */
/* Sizes: 0 bytes, except the convolution workspace                         */
/* ------------------------------------------------------------------------ */
EXPORT cudnnStatus_t cudnnDropoutGetStatesSize(cudnnHandle_t h, size_t *n) {
    (void)h;
    *n = 0;
    return CUDNN_STATUS_SUCCESS;
}
EXPORT cudnnStatus_t cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize(
    cudnnHandle_t h, cudnnBatchNormMode_t m, cudnnBatchNormOps_t o, const cudnnTensorDescriptor_t x,
    const cudnnTensorDescriptor_t z, const cudnnTensorDescriptor_t y,
    const cudnnTensorDescriptor_t sb, const cudnnActivationDescriptor_t a, size_t *n) {
    (void)h; (void)m; (void)o; (void)x; (void)z; (void)y; (void)sb; (void)a;
    *n = 0;
    return CUDNN_STATUS_SUCCESS;
}
EXPORT cudnnStatus_t cudnnGetBatchNormalizationBackwardExWorkspaceSize(
    cudnnHandle_t h, cudnnBatchNormMode_t m, cudnnBatchNormOps_t o, const cudnnTensorDescriptor_t x,
    const cudnnTensorDescriptor_t y, const cudnnTensorDescriptor_t dy,
    const cudnnTensorDescriptor_t dz, const cudnnTensorDescriptor_t dx,
    const cudnnTensorDescriptor_t dsb, const cudnnActivationDescriptor_t a, size_t *n) {
    (void)h; (void)m; (void)o; (void)x; (void)y; (void)dy; (void)dz; (void)dx; (void)dsb; (void)a;
    *n = 0;
    return CUDNN_STATUS_SUCCESS;
}
EXPORT cudnnStatus_t cudnnGetBatchNormalizationTrainingExReserveSpaceSize(
    cudnnHandle_t h, cudnnBatchNormMode_t m, cudnnBatchNormOps_t o,
    const cudnnActivationDescriptor_t a, const cudnnTensorDescriptor_t x, size_t *n) {
    (void)h; (void)m; (void)o; (void)a; (void)x;
    *n = 0;
    return CUDNN_STATUS_SUCCESS;
}
EXPORT cudnnStatus_t cudnnGetCTCLossWorkspaceSize(
    cudnnHandle_t h, const cudnnTensorDescriptor_t p, const cudnnTensorDescriptor_t g,
    const int *labels, const int *lab_len, const int *in_len, cudnnCTCLossAlgo_t algo,
    cudnnCTCLossDescriptor_t c, size_t *n) {
    (void)h; (void)p; (void)g; (void)labels; (void)lab_len; (void)in_len; (void)algo; (void)c;
    *n = 0;
    return CUDNN_STATUS_SUCCESS;
}
EXPORT cudnnStatus_t cudnnGetCTCLossWorkspaceSize_v8(
    cudnnHandle_t h, cudnnCTCLossAlgo_t algo, cudnnCTCLossDescriptor_t c,
    const cudnnTensorDescriptor_t p, const cudnnTensorDescriptor_t g, size_t *n) {
    (void)h; (void)algo; (void)c; (void)p; (void)g;
    *n = 0;
    return CUDNN_STATUS_SUCCESS;
}

/* legacy (v7) convolution algorithm choice: one algorithm, the set workspace */
#define ONE_ALGO(perf_type, ret, res)                                  \
    do {                                                               \
        if (req < 1) return CUDNN_STATUS_BAD_PARAM;                    \
        memset(res, 0, sizeof(perf_type));                             \
        res->algo = 1; /* an implicit-GEMM flavour in every table */   \
        res->status = CUDNN_STATUS_SUCCESS;                            \
        res->time = 1.0f;                                              \
        res->memory = conv_workspace();                                \
        res->determinism = CUDNN_DETERMINISTIC;                        \
        res->mathType = CUDNN_DEFAULT_MATH;                            \
        *ret = 1;                                                      \
    } while (0)
EXPORT cudnnStatus_t cudnnGetConvolutionForwardAlgorithm_v7(
    cudnnHandle_t h, const cudnnTensorDescriptor_t x, const cudnnFilterDescriptor_t w,
    const cudnnConvolutionDescriptor_t c, const cudnnTensorDescriptor_t y, const int req,
    int *ret, cudnnConvolutionFwdAlgoPerf_t *res) {
    (void)h; (void)x; (void)w; (void)c; (void)y;
    ONE_ALGO(cudnnConvolutionFwdAlgoPerf_t, ret, res);
    return CUDNN_STATUS_SUCCESS;
}
EXPORT cudnnStatus_t cudnnFindConvolutionForwardAlgorithmEx(
    cudnnHandle_t h, const cudnnTensorDescriptor_t xd, const void *x,
    const cudnnFilterDescriptor_t wd, const void *w, const cudnnConvolutionDescriptor_t c,
    const cudnnTensorDescriptor_t yd, void *y, const int req, int *ret,
    cudnnConvolutionFwdAlgoPerf_t *res, void *ws, size_t wsn) {
    (void)h; (void)xd; (void)x; (void)wd; (void)w; (void)c; (void)yd; (void)y; (void)ws; (void)wsn;
    ONE_ALGO(cudnnConvolutionFwdAlgoPerf_t, ret, res);
    return CUDNN_STATUS_SUCCESS;
}
EXPORT cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithm_v7(
    cudnnHandle_t h, const cudnnFilterDescriptor_t w, const cudnnTensorDescriptor_t dy,
    const cudnnConvolutionDescriptor_t c, const cudnnTensorDescriptor_t dx, const int req,
    int *ret, cudnnConvolutionBwdDataAlgoPerf_t *res) {
    (void)h; (void)w; (void)dy; (void)c; (void)dx;
    ONE_ALGO(cudnnConvolutionBwdDataAlgoPerf_t, ret, res);
    return CUDNN_STATUS_SUCCESS;
}
EXPORT cudnnStatus_t cudnnFindConvolutionBackwardDataAlgorithmEx(
    cudnnHandle_t h, const cudnnFilterDescriptor_t wd, const void *w,
    const cudnnTensorDescriptor_t dyd, const void *dy, const cudnnConvolutionDescriptor_t c,
    const cudnnTensorDescriptor_t dxd, void *dx, const int req, int *ret,
    cudnnConvolutionBwdDataAlgoPerf_t *res, void *ws, size_t wsn) {
    (void)h; (void)wd; (void)w; (void)dyd; (void)dy; (void)c; (void)dxd; (void)dx; (void)ws;
    (void)wsn;
    ONE_ALGO(cudnnConvolutionBwdDataAlgoPerf_t, ret, res);
    return CUDNN_STATUS_SUCCESS;
}
EXPORT cudnnStatus_t cudnnGetConvolutionBackwardFilterAlgorithm_v7(
    cudnnHandle_t h, const cudnnTensorDescriptor_t x, const cudnnTensorDescriptor_t dy,
    const cudnnConvolutionDescriptor_t c, const cudnnFilterDescriptor_t dw, const int req,
    int *ret, cudnnConvolutionBwdFilterAlgoPerf_t *res) {
    (void)h; (void)x; (void)dy; (void)c; (void)dw;
    ONE_ALGO(cudnnConvolutionBwdFilterAlgoPerf_t, ret, res);
    return CUDNN_STATUS_SUCCESS;
}
EXPORT cudnnStatus_t cudnnFindConvolutionBackwardFilterAlgorithmEx(
    cudnnHandle_t h, const cudnnTensorDescriptor_t xd, const void *x,
    const cudnnTensorDescriptor_t dyd, const void *dy, const cudnnConvolutionDescriptor_t c,
    const cudnnFilterDescriptor_t dwd, void *dw, const int req, int *ret,
    cudnnConvolutionBwdFilterAlgoPerf_t *res, void *ws, size_t wsn) {
    (void)h; (void)xd; (void)x; (void)dyd; (void)dy; (void)c; (void)dwd; (void)dw; (void)ws;
    (void)wsn;
    ONE_ALGO(cudnnConvolutionBwdFilterAlgoPerf_t, ret, res);
    return CUDNN_STATUS_SUCCESS;
}
EXPORT cudnnStatus_t cudnnGetConvolutionForwardWorkspaceSize(
    cudnnHandle_t h, const cudnnTensorDescriptor_t x, const cudnnFilterDescriptor_t w,
    const cudnnConvolutionDescriptor_t c, const cudnnTensorDescriptor_t y,
    cudnnConvolutionFwdAlgo_t a, size_t *n) {
    (void)h; (void)x; (void)w; (void)c; (void)y; (void)a;
    *n = conv_workspace();
    return CUDNN_STATUS_SUCCESS;
}
EXPORT cudnnStatus_t cudnnGetConvolutionBackwardDataWorkspaceSize(
    cudnnHandle_t h, const cudnnFilterDescriptor_t w, const cudnnTensorDescriptor_t dy,
    const cudnnConvolutionDescriptor_t c, const cudnnTensorDescriptor_t dx,
    cudnnConvolutionBwdDataAlgo_t a, size_t *n) {
    (void)h; (void)w; (void)dy; (void)c; (void)dx; (void)a;
    *n = conv_workspace();
    return CUDNN_STATUS_SUCCESS;
}
EXPORT cudnnStatus_t cudnnGetConvolutionBackwardFilterWorkspaceSize(
    cudnnHandle_t h, const cudnnTensorDescriptor_t x, const cudnnTensorDescriptor_t dy,
    const cudnnConvolutionDescriptor_t c, const cudnnFilterDescriptor_t dw,
    cudnnConvolutionBwdFilterAlgo_t a, size_t *n) {
    (void)h; (void)x; (void)dy; (void)c; (void)dw; (void)a;
    *n = conv_workspace();
    return CUDNN_STATUS_SUCCESS;
}

/* compute: nothing happens */
CUDNN_OK(cudnnConvolutionForward)
CUDNN_OK(cudnnConvolutionBackwardData)
CUDNN_OK(cudnnConvolutionBackwardFilter)
CUDNN_OK(cudnnConvolutionBiasActivationForward)
CUDNN_OK(cudnnBatchNormalizationForwardTrainingEx)
CUDNN_OK(cudnnBatchNormalizationForwardInference)
CUDNN_OK(cudnnBatchNormalizationBackwardEx)
CUDNN_OK(cudnnPoolingForward)
CUDNN_OK(cudnnCTCLoss)
CUDNN_OK(cudnnCTCLoss_v8)
CUDNN_OK(cudnnSpatialTfGridGeneratorForward)
CUDNN_OK(cudnnSpatialTfGridGeneratorBackward)
CUDNN_OK(cudnnSpatialTfSamplerForward)
CUDNN_OK(cudnnSpatialTfSamplerBackward)
CUDNN_OK(cudnnRNNForward)
CUDNN_OK(cudnnRNNBackwardData_v8)
CUDNN_OK(cudnnRNNBackwardWeights_v8)
CUDNN_OK(cudnnBackendExecute)

/* ------------------------------------------------------------------------ */
/* RNNs                                                                     */
/* ------------------------------------------------------------------------ */
EXPORT cudnnStatus_t cudnnCreateRNNDescriptor(cudnnRNNDescriptor_t *d) {
    *d = calloc(1, sizeof(**d));
    return CUDNN_STATUS_SUCCESS;
}
EXPORT cudnnStatus_t cudnnDestroyRNNDescriptor(cudnnRNNDescriptor_t d) {
    free(d);
    return CUDNN_STATUS_SUCCESS;
}
EXPORT cudnnStatus_t cudnnSetRNNDescriptor_v8(
    cudnnRNNDescriptor_t d, cudnnRNNAlgo_t algo, cudnnRNNMode_t cell, cudnnRNNBiasMode_t bias,
    cudnnDirectionMode_t dir, cudnnRNNInputMode_t inmode, cudnnDataType_t dtype,
    cudnnDataType_t prec, cudnnMathType_t math, int32_t input, int32_t hidden, int32_t proj,
    int32_t layers, cudnnDropoutDescriptor_t drop, uint32_t aux) {
    (void)algo; (void)inmode; (void)prec; (void)math; (void)drop; (void)aux;
    d->cell = cell;
    d->bias = bias;
    d->dir = dir;
    d->dtype = dtype;
    d->input = input;
    d->hidden = hidden;
    d->proj = proj > 0 && proj < hidden ? proj : 0;
    d->layers = layers;
    return CUDNN_STATUS_SUCCESS;
}

static size_t dtype_size(cudnnDataType_t t) {
    switch (t) {
    case CUDNN_DATA_DOUBLE: case CUDNN_DATA_INT64: return 8;
    case CUDNN_DATA_HALF: case CUDNN_DATA_BFLOAT16: return 2;
    case CUDNN_DATA_INT8: case CUDNN_DATA_UINT8: case CUDNN_DATA_BOOLEAN: return 1;
    default: return 4;
    }
}
static int gates(const struct cudnnRNNStruct *d) {
    return d->cell == CUDNN_LSTM ? 4 : d->cell == CUDNN_GRU ? 3 : 1;
}
static int dirs(const struct cudnnRNNStruct *d) { return d->dir == CUDNN_BIDIRECTIONAL ? 2 : 1; }
static int biases(const struct cudnnRNNStruct *d) {
    return d->bias == CUDNN_RNN_NO_BIAS ? 0 : d->bias == CUDNN_RNN_DOUBLE_BIAS ? 2 : 1;
}
static int out_size(const struct cudnnRNNStruct *d) { return d->proj ? d->proj : d->hidden; }

/* Elements of each part of pseudo-layer p's block:
 * [input matrices][recurrent matrices][projection][input biases][recurrent biases] */
typedef struct { int64_t in_cols, rec_cols, w, r, p, bw, br; } rnn_block;
static rnn_block block_of(const struct cudnnRNNStruct *d, int p) {
    rnn_block b;
    int layer = p / dirs(d), g = gates(d), nb = biases(d);
    b.in_cols = layer == 0 ? d->input : (int64_t)out_size(d) * dirs(d);
    b.rec_cols = out_size(d);
    b.w = (int64_t)g * d->hidden * b.in_cols;
    b.r = (int64_t)g * d->hidden * b.rec_cols;
    b.p = d->proj ? (int64_t)d->proj * d->hidden : 0;
    b.bw = nb >= 1 ? (int64_t)g * d->hidden : 0;
    b.br = nb == 2 ? (int64_t)g * d->hidden : 0;
    return b;
}
static int64_t block_numel(rnn_block b) { return b.w + b.r + b.p + b.bw + b.br; }

EXPORT cudnnStatus_t cudnnGetRNNWeightSpaceSize(cudnnHandle_t h, cudnnRNNDescriptor_t d,
                                                size_t *n) {
    (void)h;
    int64_t total = 0;
    for (int p = 0; p < d->layers * dirs(d); p++) total += block_numel(block_of(d, p));
    *n = (size_t)total * dtype_size(d->dtype);
    return CUDNN_STATUS_SUCCESS;
}
static void set_shape(cudnnTensorDescriptor_t t, cudnnDataType_t dt, int rows, int cols) {
    if (!t) return;
    t->dtype = dt;
    t->nb = 3;
    t->dims[0] = 1; t->dims[1] = rows; t->dims[2] = cols;
    t->strides[0] = rows * cols; t->strides[1] = cols; t->strides[2] = 1;
}
static void set_none(cudnnTensorDescriptor_t t) {
    if (t) { t->nb = 0; }
}
EXPORT cudnnStatus_t cudnnGetRNNWeightParams(cudnnHandle_t h, cudnnRNNDescriptor_t d,
                                             int32_t pseudo, size_t wsize, const void *w,
                                             int32_t lin, cudnnTensorDescriptor_t mDesc,
                                             void **mAddr, cudnnTensorDescriptor_t bDesc,
                                             void **bAddr) {
    (void)h; (void)wsize;
    int g = gates(d);
    if (pseudo < 0 || pseudo >= d->layers * dirs(d)) return CUDNN_STATUS_BAD_PARAM;
    if (lin < 0 || lin >= 2 * g + (d->proj && d->cell == CUDNN_LSTM ? 1 : 0))
        return CUDNN_STATUS_BAD_PARAM;
    int64_t start = 0;
    for (int p = 0; p < pseudo; p++) start += block_numel(block_of(d, p));
    rnn_block b = block_of(d, pseudo);
    size_t es = dtype_size(d->dtype);
    const char *base = (const char *)w + start * es;
    int64_t m_off, b_off = -1;
    int rows, cols;
    if (lin < g) { /* input matrix / bias of gate lin */
        rows = d->hidden; cols = (int)b.in_cols;
        m_off = (int64_t)lin * rows * cols;
        if (b.bw) b_off = b.w + b.r + b.p + (int64_t)lin * d->hidden;
    } else if (lin < 2 * g) { /* recurrent matrix / bias */
        rows = d->hidden; cols = (int)b.rec_cols;
        m_off = b.w + (int64_t)(lin - g) * rows * cols;
        if (b.br) b_off = b.w + b.r + b.p + b.bw + (int64_t)(lin - g) * d->hidden;
        else if (b.bw && !b.br && d->bias == CUDNN_RNN_SINGLE_REC_BIAS)
            b_off = b.w + b.r + b.p + (int64_t)(lin - g) * d->hidden;
    } else { /* LSTM projection: no bias */
        rows = d->proj; cols = d->hidden;
        m_off = b.w + b.r;
    }
    if (d->bias == CUDNN_RNN_SINGLE_REC_BIAS && lin < g) b_off = -1;
    if (mAddr) *mAddr = (void *)(base + m_off * es);
    set_shape(mDesc, d->dtype, rows, cols);
    if (b_off >= 0) {
        if (bAddr) *bAddr = (void *)(base + b_off * es);
        set_shape(bDesc, d->dtype, d->hidden, 1);
    } else {
        if (bAddr) *bAddr = NULL;
        set_none(bDesc);
    }
    return CUDNN_STATUS_SUCCESS;
}
EXPORT cudnnStatus_t cudnnGetRNNTempSpaceSizes(cudnnHandle_t h, cudnnRNNDescriptor_t d,
                                               cudnnForwardMode_t m, cudnnRNNDataDescriptor_t x,
                                               size_t *ws, size_t *rs) {
    (void)h; (void)d; (void)m; (void)x;
    if (ws) *ws = 0;
    if (rs) *rs = 0;
    return CUDNN_STATUS_SUCCESS;
}

/* ------------------------------------------------------------------------ */
/* Backend (graph) API: descriptors that keep their attributes              */
/* ------------------------------------------------------------------------ */
#define BD_MAGIC 0xCD0BDE5Cu
typedef struct bdesc bdesc;
typedef struct {
    cudnnBackendAttributeName_t name;
    cudnnBackendAttributeType_t type;
    int64_t count;
    void *data; /* count elements; descriptor-typed: bdesc* clones we own */
} battr;
struct bdesc {
    uint32_t magic;
    cudnnBackendDescriptorType_t kind;
    int finalized;
    int n, cap;
    battr *attrs;
};

static size_t elem_size(cudnnBackendAttributeType_t t) {
    switch (t) {
    case CUDNN_TYPE_HANDLE: case CUDNN_TYPE_VOID_PTR: case CUDNN_TYPE_BACKEND_DESCRIPTOR:
        return sizeof(void *);
    case CUDNN_TYPE_INT64: case CUDNN_TYPE_DOUBLE: return 8;
    case CUDNN_TYPE_BOOLEAN: return sizeof(bool);
    case CUDNN_TYPE_CHAR: return 1;
    case CUDNN_TYPE_FRACTION: return sizeof(cudnnFraction_t);
    default: return 4; /* enums, INT32, FLOAT */
    }
}

static bdesc *bd_new(cudnnBackendDescriptorType_t kind) {
    bdesc *d = calloc(1, sizeof(bdesc));
    d->magic = BD_MAGIC;
    d->kind = kind;
    return d;
}
static void bd_clear(bdesc *d);
static void bd_free(bdesc *d) {
    if (!d || d->magic != BD_MAGIC) return;
    bd_clear(d);
    d->magic = 0;
    free(d);
}
static void attr_free(battr *a) {
    if (a->type == CUDNN_TYPE_BACKEND_DESCRIPTOR)
        for (int64_t i = 0; i < a->count; i++) bd_free(((bdesc **)a->data)[i]);
    free(a->data);
    a->data = NULL;
    a->count = 0;
}
static void bd_clear(bdesc *d) {
    for (int i = 0; i < d->n; i++) attr_free(&d->attrs[i]);
    free(d->attrs);
    d->attrs = NULL;
    d->n = d->cap = 0;
}
static bdesc *bd_clone(const bdesc *s);
/* copy s's contents into d (d keeps its identity) */
static void bd_assign(bdesc *d, const bdesc *s) {
    bd_clear(d);
    d->kind = s->kind;
    d->finalized = s->finalized;
    d->cap = d->n = s->n;
    d->attrs = calloc((size_t)(s->n ? s->n : 1), sizeof(battr));
    for (int i = 0; i < s->n; i++) {
        const battr *a = &s->attrs[i];
        battr *b = &d->attrs[i];
        *b = *a;
        size_t bytes = (size_t)a->count * elem_size(a->type);
        b->data = malloc(bytes ? bytes : 1);
        if (a->type == CUDNN_TYPE_BACKEND_DESCRIPTOR)
            for (int64_t k = 0; k < a->count; k++)
                ((bdesc **)b->data)[k] = bd_clone(((bdesc **)a->data)[k]);
        else
            memcpy(b->data, a->data, bytes);
    }
}
static bdesc *bd_clone(const bdesc *s) {
    if (!s || s->magic != BD_MAGIC) return NULL;
    bdesc *d = bd_new(s->kind);
    bd_assign(d, s);
    return d;
}
static battr *bd_find(bdesc *d, cudnnBackendAttributeName_t name) {
    for (int i = 0; i < d->n; i++)
        if (d->attrs[i].name == name) return &d->attrs[i];
    return NULL;
}
static battr *bd_slot(bdesc *d, cudnnBackendAttributeName_t name) {
    battr *a = bd_find(d, name);
    if (a) { attr_free(a); return a; }
    if (d->n == d->cap) {
        d->cap = d->cap ? 2 * d->cap : 8;
        d->attrs = realloc(d->attrs, (size_t)d->cap * sizeof(battr));
    }
    a = &d->attrs[d->n++];
    memset(a, 0, sizeof(*a));
    a->name = name;
    return a;
}
/* store count elements (descriptors are cloned) */
static void bd_set(bdesc *d, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
                   int64_t count, const void *elems) {
    battr *a = bd_slot(d, name);
    a->type = type;
    a->count = count;
    size_t bytes = (size_t)count * elem_size(type);
    a->data = malloc(bytes ? bytes : 1);
    if (type == CUDNN_TYPE_BACKEND_DESCRIPTOR)
        for (int64_t k = 0; k < count; k++)
            ((bdesc **)a->data)[k] = bd_clone(((bdesc *const *)elems)[k]);
    else if (bytes)
        memcpy(a->data, elems, bytes);
}
static void bd_set_i64(bdesc *d, cudnnBackendAttributeName_t name, int64_t v) {
    bd_set(d, name, CUDNN_TYPE_INT64, 1, &v);
}

EXPORT cudnnStatus_t cudnnBackendCreateDescriptor(cudnnBackendDescriptorType_t kind,
                                                  cudnnBackendDescriptor_t *out) {
    *out = bd_new(kind);
    return CUDNN_STATUS_SUCCESS;
}
EXPORT cudnnStatus_t cudnnBackendDestroyDescriptor(cudnnBackendDescriptor_t d) {
    if (!d || ((bdesc *)d)->magic != BD_MAGIC) return CUDNN_STATUS_BAD_PARAM;
    bd_free(d);
    return CUDNN_STATUS_SUCCESS;
}
EXPORT cudnnStatus_t cudnnBackendInitialize(cudnnBackendDescriptor_t d) {
    if (!d || ((bdesc *)d)->magic != BD_MAGIC) return CUDNN_STATUS_BAD_PARAM;
    bd_clear(d);
    ((bdesc *)d)->finalized = 0;
    return CUDNN_STATUS_SUCCESS;
}
EXPORT cudnnStatus_t cudnnBackendSetAttribute(cudnnBackendDescriptor_t desc,
                                              cudnnBackendAttributeName_t name,
                                              cudnnBackendAttributeType_t type, int64_t count,
                                              const void *elems) {
    bdesc *d = desc;
    if (!d || d->magic != BD_MAGIC || count < 0 || (count && !elems))
        return CUDNN_STATUS_BAD_PARAM;
    if (d->finalized) return CUDNN_STATUS_NOT_INITIALIZED;
    bd_set(d, name, type, count, elems);
    return CUDNN_STATUS_SUCCESS;
}

/* an engine (index 0, no knobs, no notes) for an operation graph */
static bdesc *engine_for(bdesc *graph) {
    bdesc *e = bd_new(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
    if (graph) bd_set(e, CUDNN_ATTR_ENGINE_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                      &graph);
    bd_set_i64(e, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, 0);
    e->finalized = 1;
    return e;
}

EXPORT cudnnStatus_t cudnnBackendFinalize(cudnnBackendDescriptor_t desc) {
    bdesc *d = desc;
    if (!d || d->magic != BD_MAGIC) return CUDNN_STATUS_BAD_PARAM;
    if (d->kind == CUDNN_BACKEND_ENGINE_DESCRIPTOR && !bd_find(d, CUDNN_ATTR_ENGINE_GLOBAL_INDEX))
        bd_set_i64(d, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, 0);
    if (d->kind == CUDNN_BACKEND_ENGINE_DESCRIPTOR) {
        battr *gi = bd_find(d, CUDNN_ATTR_ENGINE_GLOBAL_INDEX);
        if (gi && gi->count == 1 && *(int64_t *)gi->data != 0)
            return CUDNN_STATUS_NOT_SUPPORTED; /* the graph has one engine: index 0 */
    }
    d->finalized = 1;
    return CUDNN_STATUS_SUCCESS;
}

/* copy a stored attribute out: descriptors into the caller's descriptors */
static cudnnStatus_t get_stored(battr *a, cudnnBackendAttributeType_t type, int64_t req,
                                int64_t *count, void *out) {
    if (count) *count = a->count;
    if (!out) return CUDNN_STATUS_SUCCESS;
    int64_t n = a->count < req ? a->count : req;
    if (a->type == CUDNN_TYPE_BACKEND_DESCRIPTOR) {
        for (int64_t k = 0; k < n; k++) {
            bdesc *dst = ((bdesc **)out)[k];
            bdesc *src = ((bdesc **)a->data)[k];
            if (!dst || dst->magic != BD_MAGIC) return CUDNN_STATUS_BAD_PARAM;
            if (src) bd_assign(dst, src);
        }
    } else {
        size_t es = elem_size(a->type), want = elem_size(type);
        if (es != want) return CUDNN_STATUS_BAD_PARAM;
        memcpy(out, a->data, (size_t)n * es);
    }
    return CUDNN_STATUS_SUCCESS;
}

EXPORT cudnnStatus_t cudnnBackendGetAttribute(cudnnBackendDescriptor_t const desc,
                                              cudnnBackendAttributeName_t name,
                                              cudnnBackendAttributeType_t type, int64_t req,
                                              int64_t *count, void *out) {
    bdesc *d = desc;
    if (!d || d->magic != BD_MAGIC || req < 0) return CUDNN_STATUS_BAD_PARAM;
    switch (name) {
    case CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT:
        if (count) *count = 1;
        if (out && req >= 1) *(int64_t *)out = 1;
        return CUDNN_STATUS_SUCCESS;
    case CUDNN_ATTR_ENGINEHEUR_RESULTS: {
        /* one engine configuration: engine 0 of the heuristics' operation graph */
        if (count) *count = 1;
        if (out && req >= 1) {
            bdesc *cfg = ((bdesc **)out)[0];
            if (!cfg || cfg->magic != BD_MAGIC) return CUDNN_STATUS_BAD_PARAM;
            battr *g = bd_find(d, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH);
            bdesc *e = engine_for(g && g->count ? ((bdesc **)g->data)[0] : NULL);
            bd_clear(cfg);
            cfg->kind = CUDNN_BACKEND_ENGINECFG_DESCRIPTOR;
            bd_set(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &e);
            cfg->finalized = 1;
            bd_free(e);
        }
        return CUDNN_STATUS_SUCCESS;
    }
    case CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE:
    case CUDNN_ATTR_ENGINECFG_WORKSPACE_SIZE:
        if (count) *count = 1;
        if (out && req >= 1) *(int64_t *)out = (int64_t)conv_workspace();
        return CUDNN_STATUS_SUCCESS;
    case CUDNN_ATTR_ENGINECFG_SHARED_MEMORY_USED: /* cudnn_frontend checks it fits the SM */
        if (count) *count = 1;
        if (out && req >= 1) *(int64_t *)out = 0;
        return CUDNN_STATUS_SUCCESS;
    default:
        break;
    }
    battr *a = bd_find(d, name);
    if (a) return get_stored(a, type, req, count, out);
    /* not set and not computed: knobs, notes, intermediates... none */
    if (cudnn_debug())
        fprintf(stderr, "[fakegpu] cuDNN backend: descriptor type %d has no attribute %d "
                        "(answered with 0 elements)\n", (int)d->kind, (int)name);
    if (count) *count = 0;
    return CUDNN_STATUS_SUCCESS;
}
