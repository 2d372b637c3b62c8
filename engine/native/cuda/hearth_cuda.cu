/* libhearth_cuda: Hearth's CUDA kernels as ONNX Runtime custom ops (domain ai.hearth.cuda), for graphs whose
 * weights are the GGUF's own blocks (engine/model/precision.py, "int4-cuda-blocks").
 *
 *   MatMulQ(X fp16 [.., Kx], W0 uint8 [N0, R0], W1?, W2?, skip?, gamma?) -> Y fp16 [.., N0+N1+N2], summed?
 *       attributes type, type1, type2 (GGML type ids of W0..W2), act (0 none; 1 silu, 2 gelu-tanh: X is gate|up,
 *       Kx = 2K, and the layer reads act(gate)·up), eps, numerics (0: fp32 activations; 1: int8 per 32, dp4a, as llama.cpp's MMVQ). With gamma the layer reads RMSNorm(X + skip)·gamma (the
 *       pre-norm ONNX Runtime would run as its own SkipSimplifiedLayerNormalization) and, with skip, writes
 *       X + skip as `summed`, the new residual stream. Up to 8 rows of X: hearth_cuda_kernels.cuh's GEMV (a
 *       one-row norm staged inside it); more (a prefill): the weights dequantized to fp16 in slabs of at most
 *       64 MB and cuBLAS's GEMM.
 *   GatherQ(ids int64 [..], table uint8 [V, R]) -> fp16 [.., K]; attributes type, k.
 *   Attention: com.microsoft.GroupQueryAttention's inputs, attributes and outputs, for one decode step over an fp16
 *       KV cache (hearth_cuda_attention.cuh); the engine runs it in the CUDA graph's decode session only. Two more
 *       optional inputs, the QK norms' gains [D] (attribute qk_norm_eps), norm q and the new key per head first.
 *
 * The library links the CUDA runtime statically and needs nothing at load time but the driver; cuBLAS is looked
 * up (dlopen) on the first prefill, where ONNX Runtime's CUDA provider has loaded it already. Every kernel runs
 * on the stream ONNX Runtime gives the op, so a decode step's kernels are captured into its CUDA graph with the
 * rest. The ONNX Runtime API is reached through ../ort_abi.h's slots, as the CPU library does (no headers ship
 * with the wheel); RegisterCustomOps checks the layout before using any slot.
 *
 * Built by build.sh (nvcc, sm_80/86/89/90 and PTX); the source hash it bakes in is checked by
 * engine/runtime/cuda_kernels.py before the library is used.
 */
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "../ort_abi.h"
#include "hearth_cuda_attention.cuh"
#include "hearth_cuda_q8.cuh"

#ifndef HEARTH_CUDA_SOURCE_HASH
#define HEARTH_CUDA_SOURCE_HASH "unknown"
#endif

#define HQ_EXPORT extern "C" __attribute__((visibility("default")))

/* Slots and element types beyond those ort_abi.h names (counted from onnxruntime_c_api.h, as it does). */
enum { SLOT_GetOutputCount = 89, SLOT_GetGPUComputeStream = 193 };
enum { ELEMENT_INT64 = 7, ELEMENT_FLOAT16 = 10 };
typedef OrtStatus *(*GetStreamFn)(const OrtKernelContext *ctx, void **out);

static const OrtApi *api;
#define CALL(type, index) ((type)api->slot[index])

static const int GEMV_MAX_ROWS = 8;
static const int64_t SLAB_BYTES = 64ll << 20;

static OrtStatus *fail(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static OrtStatus *fail(int code, const char *fmt, ...) {
    char message[300];
    va_list args;
    va_start(args, fmt);
    vsnprintf(message, sizeof message, fmt, args);
    va_end(args);
    return CALL(CreateStatusFn, SLOT_CreateStatus)(code, message);
}

static OrtStatus *cuda_status(const char *op, cudaError_t err) {
    return err == cudaSuccess ? nullptr : fail(ORT_FAIL, "hearth.cuda.%s: %s", op, cudaGetErrorString(err));
}

/* A tensor's data and shape. */
struct Tensor {
    void *data;
    int64_t dims[8];
    size_t rank;
    int64_t count() const {
        int64_t n = 1;
        for (size_t i = 0; i < rank; i++) n *= dims[i];
        return n;
    }
};

static OrtStatus *read_tensor(const OrtValue *value, int element, const char *what, Tensor *t) {
    OrtTensorTypeAndShapeInfo *info;
    OrtStatus *st = CALL(GetTensorTypeAndShapeFn, SLOT_GetTensorTypeAndShape)(value, &info);
    if (st) return st;
    int type = 0;
    st = CALL(GetTensorElementTypeFn, SLOT_GetTensorElementType)(info, &type);
    if (!st) st = CALL(GetDimensionsCountFn, SLOT_GetDimensionsCount)(info, &t->rank);
    if (!st && t->rank > 8) st = fail(ORT_INVALID_ARGUMENT, "hearth.cuda: %s has more than 8 dimensions", what);
    if (!st) st = CALL(GetDimensionsFn, SLOT_GetDimensions)(info, t->dims, t->rank);
    CALL(ReleaseTypeShapeFn, SLOT_ReleaseTensorTypeAndShapeInfo)(info);
    if (st) return st;
    if (type != element) return fail(ORT_INVALID_ARGUMENT, "hearth.cuda: %s has element type %d, not %d", what, type, element);
    return CALL(GetTensorMutableDataFn, SLOT_GetTensorMutableData)((OrtValue *)value, &t->data);
}

static OrtStatus *make_output(OrtKernelContext *ctx, const int64_t *dims, size_t rank, void **out) {
    OrtValue *value;
    OrtStatus *st = CALL(GetOutputFn, SLOT_KernelContext_GetOutput)(ctx, 0, dims, rank, &value);
    return st ? st : CALL(GetTensorMutableDataFn, SLOT_GetTensorMutableData)(value, out);
}

static OrtStatus *stream_of(OrtKernelContext *ctx, cudaStream_t *stream) {
    void *s = nullptr;
    OrtStatus *st = CALL(GetStreamFn, SLOT_GetGPUComputeStream)(ctx, &s);
    *stream = (cudaStream_t)s;
    return st;
}

/* The node's attribute `name` read by `get` (one of the API's typed getters), or ``fallback`` where it has none. */
template <typename T>
static T attribute(OrtStatus *(*get)(const OrtKernelInfo *, const char *, T *), const OrtKernelInfo *info,
                   const char *name, T fallback) {
    T value = fallback;
    OrtStatus *st = get(info, name, &value);
    if (st) {
        CALL(ReleaseStatusFn, SLOT_ReleaseStatus)(st);
        return fallback;
    }
    return value;
}

static int64_t int_attribute(const OrtKernelInfo *info, const char *name, int64_t fallback) {
    return attribute<int64_t>(CALL(AttrInt64Fn, SLOT_KernelInfoGetAttribute_int64), info, name, fallback);
}

static float float_attribute(const OrtKernelInfo *info, const char *name, float fallback) {
    return attribute<float>(CALL(AttrFloatFn, SLOT_KernelInfoGetAttribute_float), info, name, fallback);
}

/* ---- cuBLAS, found at first use ------------------------------------------------------------------------------- */
typedef void *CublasHandle;
typedef int (*CublasCreateFn)(CublasHandle *);
typedef int (*CublasSetStreamFn)(CublasHandle, cudaStream_t);
typedef int (*CublasGemmExFn)(CublasHandle, int, int, int, int, int, const void *, const void *, int, int, const void *,
                              int, int, const void *, void *, int, int, int, int);
enum { CUBLAS_OP_N_ = 0, CUBLAS_OP_T_ = 1, CUDA_R_16F_ = 2, CUBLAS_COMPUTE_32F_ = 68, CUBLAS_GEMM_DEFAULT_ = -1 };

struct Cublas {
    CublasCreateFn create = nullptr;
    CublasSetStreamFn set_stream = nullptr;
    CublasGemmExFn gemm = nullptr;
    std::mutex lock;
    std::unordered_map<cudaStream_t, CublasHandle> handles;  // one per stream: a handle's workspace is not shared
    bool tried = false;
};
static Cublas cublas;

/* The cuBLAS handle for ``stream``, or null where cuBLAS cannot be loaded (the GEMV then serves every length). */
static CublasHandle cublas_for(cudaStream_t stream) {
    std::lock_guard<std::mutex> guard(cublas.lock);
    if (!cublas.tried) {
        cublas.tried = true;
        void *lib = dlopen("libcublas.so.13", RTLD_NOW | RTLD_NOLOAD);
        if (!lib) lib = dlopen("libcublas.so.13", RTLD_NOW);
        if (!lib) lib = dlopen("libcublas.so", RTLD_NOW);
        if (lib) {
            cublas.create = (CublasCreateFn)dlsym(lib, "cublasCreate_v2");
            cublas.set_stream = (CublasSetStreamFn)dlsym(lib, "cublasSetStream_v2");
            cublas.gemm = (CublasGemmExFn)dlsym(lib, "cublasGemmEx");
        }
    }
    if (!cublas.create || !cublas.set_stream || !cublas.gemm) return nullptr;
    auto found = cublas.handles.find(stream);
    if (found != cublas.handles.end()) return found->second;
    CublasHandle handle = nullptr;
    if (cublas.create(&handle) != 0 || cublas.set_stream(handle, stream) != 0) return nullptr;
    cublas.handles[stream] = handle;
    return handle;
}

/* Scratch for a prefill (a slab of dequantized weights, the gated or normed input) comes from the device's
 * stream-ordered pool. Its default release threshold (0) hands the memory back to the driver at every stream
 * synchronization, which ONNX Runtime does after each run, so each layer of the next prefill chunk mapped its
 * 64 MB slab afresh; keeping it in the pool makes every later allocation a pointer bump. */
static cudaError_t scratch(void **p, size_t bytes, cudaStream_t stream) {
    static std::mutex lock;
    static bool kept[64];
    int device = 0;
    if (cudaGetDevice(&device) == cudaSuccess && device >= 0 && device < 64) {
        std::lock_guard<std::mutex> guard(lock);
        cudaMemPool_t pool;
        if (!kept[device] && cudaDeviceGetDefaultMemPool(&pool, device) == cudaSuccess) {
            uint64_t keep = UINT64_MAX;
            cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
            kept[device] = true;
        }
    }
    return cudaMallocAsync(p, bytes, stream);
}

/* ---- MatMulQ -------------------------------------------------------------------------------------------------- */
enum { INPUT_SKIP = 1 + HQ_MAX_SEGMENTS, INPUT_GAMMA, MATMUL_INPUTS };

enum { NUMERICS_EXACT = 0, NUMERICS_Q8 = 1 };

struct MatMulKernel {
    int types[HQ_MAX_SEGMENTS];
    int act;
    int numerics;  /* NUMERICS_EXACT: fp32 activations (hearth_cuda_kernels.cuh); NUMERICS_Q8: int8 (hearth_cuda_q8.cuh) */
    float eps;
};

/* Whether the 8-bit GEMV can read these segments: their rows start where its word loads need them to (16 bytes
 * for Q4_K's and Q5_K's 128-bit loads, 4 for Q4_1's and Q5_1's words, 2 for the rest's halves). ONNX Runtime's
 * buffers start 256-byte aligned; a row stride keeps that for the K-quants (144 and 176 bytes). */
static bool q8_aligned(const HqSegments &segs) {
    for (int s = 0; s < segs.count; s++) {
        const int t = segs.type[s];
        const uintptr_t need = t == HQ_Q4_K || t == HQ_Q5_K ? 16 : t == HQ_Q4_1 || t == HQ_Q5_1 ? 4 : 2;
        if ((uintptr_t)segs.rows[s] % need || (uintptr_t)segs.row_bytes[s] % need) return false;
    }
    return true;
}

/* Rows a warp of the 8-bit GEMV takes: two where there are enough rows to fill the GPU twice over either way (the
 * block's staging of x is then shared by 16 rows), else one. */
static const int64_t Q8_TWO_ROWS_FROM = 8192;

/* From how many weights (N·K) a launch quantizes x once into the scratch output rather than in each block: a
 * small matrix's decode is launch-bound, and the quantizing kernel is one more launch; a large one's blocks each
 * spent longer quantizing x than reading their rows. On an H100 (docs/benchmarks.md, third lease): from 2^22 the
 * Q4_K_M 8B decodes 5% faster (203 against 193 tok/s) and Gemma 3 270M 3% (its 168M-weight head), the default
 * model the same (956 against 953); every launch through the scratch (0) slows the default model to 853.
 * HEARTH_CUDA_SCRATCH_FROM (weights) overrides it (tests/test_cuda_kernels.py sets 0). */
static int64_t scratch_from_weights() {
    static const int64_t from = [] {
        const char *env = getenv("HEARTH_CUDA_SCRATCH_FROM");
        return env && *env ? (int64_t)atoll(env) : (int64_t)1 << 22;
    }();
    return from;
}

template <int MT>
static void gemv_q8(dim3 grid, size_t shared, int rw, cudaStream_t stream, const __half *x, int64_t x_stride, int act,
                    int rows, int64_t k, const HqSegments &segs, const HqNorm &norm, __half *y) {
    const dim3 block(HQ_THREADS);
    if (rw == 2)
        hq_launch(gemv_q8_kernel<MT, 2>, grid, block, shared, stream, x, x_stride, act, rows, k, segs, norm, y);
    else
        hq_launch(gemv_q8_kernel<MT, 1>, grid, block, shared, stream, x, x_stride, act, rows, k, segs, norm, y);
}

/* The most blocks an 8-bit GEMV over the scratch launches: unset (0), one per 8·RW rows, as measured; with
 * HEARTH_CUDA_GEMV_BLOCKS_PER_SM=n, n per multiprocessor, each warp then walking several rows (not yet timed: the
 * 8B's GEMVs reach about a third of the H100's bandwidth either way of quantizing x, which leaves the blocks'
 * short lives, a row each, as the next suspect). Read once, with the device's multiprocessor count. */
static int64_t gemv_blocks_most() {
    static const int64_t most = [] {
        const char *env = getenv("HEARTH_CUDA_GEMV_BLOCKS_PER_SM");
        const int64_t per_sm = env && *env ? (int64_t)atoll(env) : 0;
        int device = 0, sms = 0;
        if (per_sm <= 0 || cudaGetDevice(&device) != cudaSuccess ||
            cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || sms <= 0)
            return (int64_t)0;
        return per_sm * sms;
    }();
    return most;
}

/* Output rows a warp of the 8-bit GEMV over the scratch takes for one row of x (a decode step): two, read together
 * (hq_q8_rows, sharing x's loads). On an H100 that took a step's GEMVs and quantizers from 3.27 to 2.68 ms for the
 * 8B and 3.28 to 2.55 for Qwen2.5-7B (bench/cuda_gemv_bench.cu), and decode from 262 to 308 tok/s at 1k
 * (bench/gpu.py). HEARTH_CUDA_GEMV_ROWS=1 takes one row a warp, 4 four together, to time against it. Read once. */
static int gemv_rows_a_warp() {
    static const int rows = [] {
        const char *env = getenv("HEARTH_CUDA_GEMV_ROWS");
        const int n = env && *env ? atoi(env) : 2;
        return n == 1 || n == 2 || n == 4 ? n : 2;
    }();
    return rows;
}

template <int MT>
static void gemv_q8x(dim3 grid, int rw, cudaStream_t stream, const uint8_t *scratch, int rows, int m0, int mt,
                     int64_t k, const HqSegments &segs, __half *y) {
    const dim3 block(HQ_THREADS);
    if (MT == 1 && gemv_rows_a_warp() > 1) {  // asked for: a warp's rows read together (rw is 2 or 4 here)
        if (rw == 4) hq_launch(gemv_q8x_rows_kernel<4>, grid, block, 0, stream, scratch, rows, m0, mt, k, segs, y);
        else hq_launch(gemv_q8x_rows_kernel<2>, grid, block, 0, stream, scratch, rows, m0, mt, k, segs, y);
    } else if (rw == 2) {
        hq_launch(gemv_q8x_kernel<MT, 2>, grid, block, 0, stream, scratch, rows, m0, mt, k, segs, y);
    } else {
        hq_launch(gemv_q8x_kernel<MT, 1>, grid, block, 0, stream, scratch, rows, m0, mt, k, segs, y);
    }
}

/* The 8-bit GEMV with x quantized once into the node's scratch output (q8_quantize_kernel, the norm or act
 * applied there), then read by every warp. */
static OrtStatus *launch_gemv_q8x(const __half *x, int64_t x_stride, int act, int rows, int64_t k,
                                  const HqSegments &segs, const HqNorm &norm, uint8_t *scratch, __half *y,
                                  cudaStream_t stream) {
    const dim3 slices((unsigned)((k + HQ_Q8_SLICE - 1) / HQ_Q8_SLICE), (unsigned)rows);
    hq_launch(q8_quantize_kernel, slices, dim3(HQ_THREADS), 0, stream, x, x_stride, act, k, norm, rows, scratch);
    const int64_t n_total = segs.total;
    const int chosen = gemv_rows_a_warp();
    const int rw = rows == 1 ? chosen : n_total >= Q8_TWO_ROWS_FROM ? 2 : 1;
    const int64_t per_block = (int64_t)HQ_WARPS * rw;
    int64_t blocks = (n_total + per_block - 1) / per_block;
    const int64_t most = gemv_blocks_most();
    if (most > 0 && blocks > most) blocks = most;
    const dim3 grid((unsigned)blocks);
    for (int m0 = 0; m0 < rows; m0 += GEMV_MAX_ROWS) {
        const int mt = rows - m0 < GEMV_MAX_ROWS ? rows - m0 : GEMV_MAX_ROWS;
        const int width = mt == 1 ? 1 : mt == 2 ? 2 : mt <= 4 ? 4 : 8;
        switch (width) {
        case 1: gemv_q8x<1>(grid, rw, stream, scratch, rows, m0, mt, k, segs, y); break;
        case 2: gemv_q8x<2>(grid, rw, stream, scratch, rows, m0, mt, k, segs, y); break;
        case 4: gemv_q8x<4>(grid, rw, stream, scratch, rows, m0, mt, k, segs, y); break;
        default: gemv_q8x<8>(grid, rw, stream, scratch, rows, m0, mt, k, segs, y); break;
        }
    }
    return cuda_status("MatMulQ", cudaGetLastError());
}

static OrtStatus *launch_gemv_q8(const __half *x, int64_t x_stride, int act, int rows, int64_t k,
                                 const HqSegments &segs, const HqNorm &norm, __half *y, cudaStream_t stream) {
    const int64_t n_total = segs.total;
    const int rw = n_total >= Q8_TWO_ROWS_FROM ? 2 : 1;
    const int64_t per_block = (int64_t)HQ_WARPS * rw;
    const dim3 grid((unsigned)((n_total + per_block - 1) / per_block));
    for (int m0 = 0; m0 < rows; m0 += GEMV_MAX_ROWS) {
        const int mt = rows - m0 < GEMV_MAX_ROWS ? rows - m0 : GEMV_MAX_ROWS;
        const __half *xm = x + (int64_t)m0 * x_stride;
        __half *ym = y + (int64_t)m0 * n_total;
        const int width = mt == 1 ? 1 : mt == 2 ? 2 : mt <= 4 ? 4 : 8;
        const int64_t tile = hq_q8_tile(width, k);
        const size_t shared = (size_t)(width * tile) * 11 / 8;  // codes, a scale per 32, a sum per 16
        switch (width) {
        case 1: gemv_q8<1>(grid, shared, rw, stream, xm, x_stride, act, mt, k, segs, norm, ym); break;
        case 2: gemv_q8<2>(grid, shared, rw, stream, xm, x_stride, act, mt, k, segs, norm, ym); break;
        case 4: gemv_q8<4>(grid, shared, rw, stream, xm, x_stride, act, mt, k, segs, norm, ym); break;
        default: gemv_q8<8>(grid, shared, rw, stream, xm, x_stride, act, mt, k, segs, norm, ym); break;
        }
    }
    return cuda_status("MatMulQ", cudaGetLastError());
}

static OrtStatus *launch_gemv(const __half *x, int64_t x_stride, int act, int rows, int64_t k, const HqSegments &segs,
                              const HqNorm &norm, __half *y, cudaStream_t stream) {
    const int64_t n_total = segs.total;
    const dim3 block(HQ_THREADS);
    for (int m0 = 0; m0 < rows; m0 += GEMV_MAX_ROWS) {
        const int mt = rows - m0 < GEMV_MAX_ROWS ? rows - m0 : GEMV_MAX_ROWS;
        const __half *xm = x + (int64_t)m0 * x_stride;
        __half *ym = y + (int64_t)m0 * n_total;
        const int width = mt == 1 ? 1 : mt == 2 ? 2 : mt <= 4 ? 4 : 8;
        const size_t shared = (size_t)width * (size_t)hq_tile(width, k) * sizeof(float);
        const int64_t per_block = hq_rows_per_block(width);
        const dim3 grid((unsigned)((n_total + per_block - 1) / per_block));
        switch (width) {
        case 1: gemv_kernel<1><<<grid, block, shared, stream>>>(xm, x_stride, act, mt, k, segs, norm, ym); break;
        case 2: gemv_kernel<2><<<grid, block, shared, stream>>>(xm, x_stride, act, mt, k, segs, norm, ym); break;
        case 4: gemv_kernel<4><<<grid, block, shared, stream>>>(xm, x_stride, act, mt, k, segs, norm, ym); break;
        default: gemv_kernel<8><<<grid, block, shared, stream>>>(xm, x_stride, act, mt, k, segs, norm, ym); break;
        }
    }
    return cuda_status("MatMulQ", cudaGetLastError());
}

/* A prefill: y [rows, N] = act(x) · Wᵀ through cuBLAS, W dequantized a slab of rows at a time. */
static OrtStatus *launch_gemm(CublasHandle handle, const __half *x, int act, int64_t rows, int64_t k,
                              const HqSegments &segs, __half *y, cudaStream_t stream) {
    const int64_t n_total = segs.total;
    int64_t slab_rows = SLAB_BYTES / (k * 2);
    if (slab_rows < 1) slab_rows = 1;
    if (slab_rows > n_total) slab_rows = n_total;
    __half *slab = nullptr, *input = nullptr;
    OrtStatus *st = cuda_status("MatMulQ", scratch((void **)&slab, (size_t)(slab_rows * k * 2), stream));
    if (!st && act != HQ_ACT_NONE) {
        st = cuda_status("MatMulQ", scratch((void **)&input, (size_t)(rows * k * 2), stream));
        if (!st) activation_kernel<<<1024, 256, 0, stream>>>(x, rows, k, act, input);
    }
    const __half *a = input ? input : x;
    const float alpha = 1.0f, beta = 0.0f;
    for (int64_t r0 = 0; !st && r0 < n_total; r0 += slab_rows) {
        const int64_t count = n_total - r0 < slab_rows ? n_total - r0 : slab_rows;
        const int64_t chunks = count * (k / 8);
        const unsigned blocks = (unsigned)(chunks / 256 + 1 < 65535 ? chunks / 256 + 1 : 65535);
        dequant_kernel<<<blocks, 256, 0, stream>>>(segs, r0, r0 + count, k, slab);
        st = cuda_status("MatMulQ", cudaGetLastError());
        // Column-major view: Yᵀ[N, rows] (ld n_total) = slabᵀ' · Xᵀ, the slab's rows being its columns of length k.
        if (!st && cublas.gemm(handle, CUBLAS_OP_T_, CUBLAS_OP_N_, (int)count, (int)rows, (int)k, &alpha, slab,
                               CUDA_R_16F_, (int)k, a, CUDA_R_16F_, (int)k, &beta, y + r0, CUDA_R_16F_, (int)n_total,
                               CUBLAS_COMPUTE_32F_, CUBLAS_GEMM_DEFAULT_) != 0)
            st = fail(ORT_FAIL, "hearth.cuda.MatMulQ: cuBLAS's GEMM failed");
    }
    if (slab) cudaFreeAsync(slab, stream);
    if (input) cudaFreeAsync(input, stream);
    return st;
}

static OrtStatus *matmul_compute(void *self, OrtKernelContext *ctx) {
    const MatMulKernel *kern = (const MatMulKernel *)self;
    size_t inputs = 0;
    OrtStatus *st = CALL(GetInputCountFn, SLOT_KernelContext_GetInputCount)(ctx, &inputs);
    if (st) return st;
    const OrtValue *value;
    Tensor x;
    if ((st = CALL(GetInputFn, SLOT_KernelContext_GetInput)(ctx, 0, &value)) ||
        (st = read_tensor(value, ELEMENT_FLOAT16, "MatMulQ's X", &x)))
        return st;
    HqSegments segs = {};
    int64_t k = -1;
    HqNorm norm = {nullptr, nullptr, nullptr, kern->eps};
    Tensor skip = {}, gamma = {};
    for (size_t i = INPUT_SKIP; i < inputs && i <= INPUT_GAMMA; i++) {
        if ((st = CALL(GetInputFn, SLOT_KernelContext_GetInput)(ctx, i, &value))) return st;
        if (value && (st = read_tensor(value, ELEMENT_FLOAT16, i == INPUT_SKIP ? "MatMulQ's skip" : "MatMulQ's gamma",
                                       i == INPUT_SKIP ? &skip : &gamma)))
            return st;
    }
    norm.skip = (const __half *)skip.data;
    norm.gamma = (const __half *)gamma.data;
    for (size_t i = 1; i < inputs && i <= HQ_MAX_SEGMENTS; i++) {
        if ((st = CALL(GetInputFn, SLOT_KernelContext_GetInput)(ctx, i, &value))) return st;
        if (!value) break;
        Tensor w;
        if ((st = read_tensor(value, ELEMENT_UINT8, "MatMulQ's W", &w))) return st;
        const int type = kern->types[i - 1], bytes = hq_block_bytes(type);
        if (bytes == 0)
            return fail(ORT_INVALID_ARGUMENT, "hearth.cuda.MatMulQ: W%zu is given but its type attribute is not", i - 1);
        if (w.rank != 2 || w.dims[1] <= 0 || w.dims[1] % bytes)
            return fail(ORT_INVALID_ARGUMENT, "hearth.cuda.MatMulQ: W%zu must be [N, R] with R a positive multiple of "
                        "type %d's %d-byte block", i - 1, type, bytes);
        const int64_t kw = w.dims[1] / bytes * hq_block_weights(type);
        if (k >= 0 && kw != k)
            return fail(ORT_INVALID_ARGUMENT, "hearth.cuda.MatMulQ: W%zu holds %lld weights a row, W0 %lld", i - 1,
                        (long long)kw, (long long)k);
        k = kw;
        const int s = segs.count++;
        segs.rows[s] = (const uint8_t *)w.data;
        segs.row_bytes[s] = w.dims[1];
        segs.type[s] = type;
        segs.start[s + 1] = segs.start[s] + w.dims[0];
        segs.total = segs.start[s + 1];
    }
    const int64_t kx = kern->act == HQ_ACT_NONE ? k : 2 * k;
    if (x.rank < 1 || x.dims[x.rank - 1] != kx)
        return fail(ORT_INVALID_ARGUMENT, "hearth.cuda.MatMulQ: X's last dimension must be %lld (W's rows hold %lld "
                    "weights%s)", (long long)kx, (long long)k, kern->act ? ", and X holds gate and up side by side" : "");
    if (norm.skip && (skip.rank != x.rank || memcmp(skip.dims, x.dims, x.rank * sizeof(int64_t))))
        return fail(ORT_INVALID_ARGUMENT, "hearth.cuda.MatMulQ: skip must have X's shape");
    if (norm.gamma && (gamma.rank != 1 || gamma.dims[0] != k || kern->act != HQ_ACT_NONE))
        return fail(ORT_INVALID_ARGUMENT, "hearth.cuda.MatMulQ: gamma must be [%lld] (and no act beside a norm)",
                    (long long)k);
    if (norm.skip && !norm.gamma) return fail(ORT_INVALID_ARGUMENT, "hearth.cuda.MatMulQ: skip without gamma");
    int64_t dims[8];
    memcpy(dims, x.dims, sizeof dims);
    const int64_t n_total = segs.total;
    dims[x.rank - 1] = n_total;
    void *y;
    if ((st = make_output(ctx, dims, x.rank, &y))) return st;
    size_t outputs = 0;
    if ((st = CALL(GetInputCountFn, SLOT_GetOutputCount)(ctx, &outputs))) return st;
    if (norm.skip && outputs > 1) {  // the new residual stream, x + skip, is the second output
        OrtValue *summed = nullptr;
        if ((st = CALL(GetOutputFn, SLOT_KernelContext_GetOutput)(ctx, 1, x.dims, x.rank, &summed)) ||
            (summed && (st = CALL(GetTensorMutableDataFn, SLOT_GetTensorMutableData)(summed, (void **)&norm.summed))))
            return st;
    }
    const int64_t rows = x.count() / kx;
    const bool q8 = kern->numerics == NUMERICS_Q8 && q8_aligned(segs);
    cudaStream_t stream;
    if ((st = stream_of(ctx, &stream))) return st;
    CublasHandle handle = rows > GEMV_MAX_ROWS && n_total > 0 ? cublas_for(stream) : nullptr;
    uint8_t *q8_scratch = nullptr;
    if (outputs > 2) {  // the scratch output: sized for the rows the 8-bit GEMV quantizes, else empty
        const bool used = q8 && !handle && n_total > 0 && rows > 0 && n_total * k >= scratch_from_weights();
        const int64_t scratch_dims[2] = {used ? rows : 0, hq_q8_row_bytes(k)};
        OrtValue *value = nullptr;
        if ((st = CALL(GetOutputFn, SLOT_KernelContext_GetOutput)(ctx, 2, scratch_dims, 2, &value))) return st;
        if (used && value &&
            (st = CALL(GetTensorMutableDataFn, SLOT_GetTensorMutableData)(value, (void **)&q8_scratch)))
            return st;
    }
    if (rows == 0) return nullptr;
    const __half *input = (const __half *)x.data;
    __half *normed = nullptr;
    if (norm.gamma && !q8_scratch && (rows > 1 || (q8 ? hq_q8_tile(1, k) : hq_tile(1, k)) < k)) {
        // The GEMV stages the norm only for one row whose K fits a tile; otherwise a kernel of its own first.
        if ((st = cuda_status("MatMulQ", scratch((void **)&normed, (size_t)(rows * k * 2), stream)))) return st;
        rmsnorm_kernel<<<(unsigned)rows, HQ_THREADS, 0, stream>>>(input, k, norm, normed);
        input = normed;
        norm = {nullptr, nullptr, nullptr, 0.0f};
    }
    if (n_total == 0) {
        st = nullptr;
    } else if (handle) {
        st = launch_gemm(handle, input, kern->act, rows, k, segs, (__half *)y, stream);
    } else if (q8_scratch) {
        st = launch_gemv_q8x(input, kx, kern->act, (int)rows, k, segs, norm, q8_scratch, (__half *)y, stream);
    } else if (q8) {
        st = launch_gemv_q8(input, kx, kern->act, (int)rows, k, segs, norm, (__half *)y, stream);
    } else {
        st = launch_gemv(input, kx, kern->act, (int)rows, k, segs, norm, (__half *)y, stream);
    }
    if (normed) cudaFreeAsync(normed, stream);
    return st;
}

static OrtStatus *matmul_create(const OrtCustomOp *, const OrtApi *, const OrtKernelInfo *info, void **out) {
    (void)scratch_from_weights();  // the settings read now, outside any CUDA graph capture
    (void)gemv_blocks_most();
    MatMulKernel *kern = new MatMulKernel();
    static const char *names[HQ_MAX_SEGMENTS] = {"type", "type1", "type2"};
    for (int i = 0; i < HQ_MAX_SEGMENTS; i++) {
        const int64_t type = int_attribute(info, names[i], i == 0 ? -1 : 0);
        kern->types[i] = (int)type;
        if ((i == 0 || type != 0) && (type != (int)type || hq_block_bytes((int)type) == 0)) {
            delete kern;
            return fail(ORT_INVALID_ARGUMENT, "hearth.cuda.MatMulQ: unsupported weight type %lld in %s",
                        (long long)type, names[i]);
        }
    }
    const int64_t act = int_attribute(info, "act", 0);
    if (act < HQ_ACT_NONE || act > HQ_ACT_GELU_TANH) {
        delete kern;
        return fail(ORT_INVALID_ARGUMENT, "hearth.cuda.MatMulQ: act must be 0, 1 or 2, not %lld", (long long)act);
    }
    kern->act = (int)act;
    const int64_t numerics = int_attribute(info, "numerics", NUMERICS_EXACT);
    if (numerics != NUMERICS_EXACT && numerics != NUMERICS_Q8) {
        delete kern;
        return fail(ORT_INVALID_ARGUMENT, "hearth.cuda.MatMulQ: numerics must be 0 (fp32 activations) or 1 (int8), "
                    "not %lld", (long long)numerics);
    }
    kern->numerics = (int)numerics;
    const float eps = float_attribute(info, "eps", 1e-6f);  // absent: no norm in this node, or the default
    if (!(eps > 0.0f)) {
        delete kern;
        return fail(ORT_INVALID_ARGUMENT, "hearth.cuda.MatMulQ: eps must be positive");
    }
    kern->eps = eps;
    *out = kern;
    return nullptr;
}

static void matmul_destroy(void *kernel) { delete (MatMulKernel *)kernel; }

/* ---- GatherQ -------------------------------------------------------------------------------------------------- */
struct GatherKernel {
    int type;
};

static OrtStatus *gather_compute(void *self, OrtKernelContext *ctx) {
    const GatherKernel *kern = (const GatherKernel *)self;
    const OrtValue *in[2];
    OrtStatus *st;
    for (size_t i = 0; i < 2; i++)
        if ((st = CALL(GetInputFn, SLOT_KernelContext_GetInput)(ctx, i, &in[i]))) return st;
    Tensor ids, table;
    if ((st = read_tensor(in[0], ELEMENT_INT64, "GatherQ's ids", &ids)) ||
        (st = read_tensor(in[1], ELEMENT_UINT8, "GatherQ's table", &table)))
        return st;
    const int bytes = hq_block_bytes(kern->type);
    if (table.rank != 2 || table.dims[1] <= 0 || table.dims[1] % bytes || ids.rank > 7)
        return fail(ORT_INVALID_ARGUMENT, "hearth.cuda.GatherQ: the table must be [V, R] with R a positive multiple of "
                    "type %d's %d-byte block, and ids of rank 7 at most", kern->type, bytes);
    const int64_t k = table.dims[1] / bytes * hq_block_weights(kern->type);
    int64_t dims[8];
    memcpy(dims, ids.dims, sizeof dims);
    dims[ids.rank] = k;
    void *out;
    if ((st = make_output(ctx, dims, ids.rank + 1, &out))) return st;
    const int64_t count = ids.count();
    if (count == 0) return nullptr;
    cudaStream_t stream;
    if ((st = stream_of(ctx, &stream))) return st;
    gather_kernel<<<(unsigned)count, 128, 0, stream>>>((const int64_t *)ids.data, count, (const uint8_t *)table.data,
                                                        table.dims[0], table.dims[1], kern->type, k, (__half *)out);
    return cuda_status("GatherQ", cudaGetLastError());
}

static OrtStatus *gather_create(const OrtCustomOp *, const OrtApi *, const OrtKernelInfo *info, void **out) {
    const int64_t type = int_attribute(info, "type", -1);
    if (type != (int)type || hq_block_bytes((int)type) == 0)
        return fail(ORT_INVALID_ARGUMENT, "hearth.cuda.GatherQ: unsupported table type %lld", (long long)type);
    GatherKernel *kern = new GatherKernel();
    kern->type = (int)type;
    *out = kern;
    return nullptr;
}

static void gather_destroy(void *kernel) { delete (GatherKernel *)kernel; }

/* ---- Attention ------------------------------------------------------------------------------------------------ */
/* GroupQueryAttention's inputs, then (Hearth's) the QK norms' gains, with which q and the new key are normed per head
 * here, and the packed Q|K|V's bias, added here (engine/runtime/cuda_attention.py folds the graph's own nodes in). */
enum { ATTN_QUERY, ATTN_KEY, ATTN_VALUE, ATTN_PAST_K, ATTN_PAST_V, ATTN_SEQLENS, ATTN_TOTAL, ATTN_COS, ATTN_SIN,
       ATTN_Q_GAMMA, ATTN_K_GAMMA, ATTN_QKV_BIAS, ATTN_INPUTS };

struct AttentionKernel {
    int heads, kv_heads, rotary, splits;
    float scale, qk_eps;
    int64_t window;
    std::mutex lock;
    void *buffer = nullptr;  /* the splits' partial softmaxes, then a counter per KV head (hearth_cuda_attention.cuh) */
    size_t buffer_bytes = 0;
};

/* The kernel's own buffer, allocated on the first run: ONNX Runtime runs a session once before it captures a CUDA
 * graph, and a replayed graph keeps the address. Zeroed once; the kernel leaves its counters at zero. */
static OrtStatus *attention_buffer(AttentionKernel *kern, size_t bytes, cudaStream_t stream, void **out) {
    std::lock_guard<std::mutex> guard(kern->lock);
    if (kern->buffer_bytes < bytes) {
        cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
        if (cudaStreamIsCapturing(stream, &capturing) == cudaSuccess && capturing != cudaStreamCaptureStatusNone)
            return fail(ORT_FAIL, "hearth.cuda.Attention: its first run must not be captured into a CUDA graph");
        if (kern->buffer) cudaFree(kern->buffer);
        kern->buffer = nullptr, kern->buffer_bytes = 0;
        OrtStatus *st = cuda_status("Attention", cudaMalloc(&kern->buffer, bytes));
        if (!st) st = cuda_status("Attention", cudaMemsetAsync(kern->buffer, 0, bytes, stream));
        if (st) return st;
        kern->buffer_bytes = bytes;
    }
    *out = kern->buffer;
    return nullptr;
}

static OrtStatus *attention_compute(void *self, OrtKernelContext *ctx) {
    AttentionKernel *kern = (AttentionKernel *)self;
    const OrtValue *in[ATTN_INPUTS] = {};
    size_t inputs = 0;
    OrtStatus *st = CALL(GetInputCountFn, SLOT_KernelContext_GetInputCount)(ctx, &inputs);
    for (size_t i = 0; !st && i < inputs && i < ATTN_INPUTS; i++) st = CALL(GetInputFn, SLOT_KernelContext_GetInput)(ctx, i, &in[i]);
    if (st) return st;
    if (!in[ATTN_QUERY] || !in[ATTN_PAST_K] || !in[ATTN_PAST_V] || !in[ATTN_SEQLENS] || !in[ATTN_TOTAL])
        return fail(ORT_INVALID_ARGUMENT, "hearth.cuda.Attention needs query, past_key, past_value, seqlens_k and "
                    "total_sequence_length");
    Tensor query, key = {}, value = {}, past_k, past_v, seqlens, total, cos = {}, sin = {}, q_gamma = {}, k_gamma = {}, bias = {};
    if ((st = read_tensor(in[ATTN_QUERY], ELEMENT_FLOAT16, "Attention's query", &query)) ||
        (st = read_tensor(in[ATTN_PAST_K], ELEMENT_FLOAT16, "Attention's past_key", &past_k)) ||
        (st = read_tensor(in[ATTN_PAST_V], ELEMENT_FLOAT16, "Attention's past_value", &past_v)) ||
        (st = read_tensor(in[ATTN_SEQLENS], ELEMENT_INT32, "Attention's seqlens_k", &seqlens)) ||
        (st = read_tensor(in[ATTN_TOTAL], ELEMENT_INT32, "Attention's total_sequence_length", &total)))
        return st;
    const bool packed = in[ATTN_KEY] == nullptr;
    if (!packed && (!in[ATTN_VALUE] || (st = read_tensor(in[ATTN_KEY], ELEMENT_FLOAT16, "Attention's key", &key)) ||
                    (st = read_tensor(in[ATTN_VALUE], ELEMENT_FLOAT16, "Attention's value", &value))))
        return st ? st : fail(ORT_INVALID_ARGUMENT, "hearth.cuda.Attention: key given without value");
    const int64_t heads = kern->heads, kvh = kern->kv_heads;
    if (past_k.rank != 4 || past_k.dims[0] != 1 || past_k.dims[1] != kvh || past_v.rank != 4 ||
        memcmp(past_k.dims, past_v.dims, sizeof(int64_t) * 4) != 0)
        return fail(ORT_INVALID_ARGUMENT, "hearth.cuda.Attention: past key and value must both be [1, %lld, capacity, "
                    "head size]", (long long)kvh);
    const int64_t cap = past_k.dims[2], d = past_k.dims[3];
    if (!hq_attn_supported((int)d, (int)(heads / kvh)))
        return fail(ORT_INVALID_ARGUMENT, "hearth.cuda.Attention: head size %lld with %lld query heads a KV head is not "
                    "compiled (64, 96, 128 or 256; 1 to %d)", (long long)d, (long long)(heads / kvh), HQ_ATTN_MAX_GROUP);
    if (query.rank != 3 || query.dims[0] != 1 || query.dims[1] != 1)
        return fail(ORT_INVALID_ARGUMENT, "hearth.cuda.Attention runs one decode step: query must be [1, 1, width]");
    const int64_t width = packed ? (heads + 2 * kvh) * d : heads * d;
    if (query.dims[2] != width)
        return fail(ORT_INVALID_ARGUMENT, "hearth.cuda.Attention: query is %lld wide, the heads need %lld",
                    (long long)query.dims[2], (long long)width);
    if (!packed && (key.count() != kvh * d || value.count() != kvh * d))
        return fail(ORT_INVALID_ARGUMENT, "hearth.cuda.Attention: key and value must be [1, 1, %lld]", (long long)(kvh * d));
    if (seqlens.count() != 1 || total.count() != 1)
        return fail(ORT_INVALID_ARGUMENT, "hearth.cuda.Attention: batch size must be 1");
    const int32_t total_length = *(const int32_t *)total.data;  /* on the host (its memory type below) */
    if (total_length < 1 || total_length > cap)
        return fail(ORT_INVALID_ARGUMENT, "hearth.cuda.Attention: total_sequence_length %d does not fit the cache's %lld "
                    "rows", total_length, (long long)cap);
    int half = 0;
    if (kern->rotary) {
        if (!in[ATTN_COS] || !in[ATTN_SIN] ||
            (st = read_tensor(in[ATTN_COS], ELEMENT_FLOAT16, "Attention's cos_cache", &cos)) ||
            (st = read_tensor(in[ATTN_SIN], ELEMENT_FLOAT16, "Attention's sin_cache", &sin)))
            return st ? st : fail(ORT_INVALID_ARGUMENT, "hearth.cuda.Attention: do_rotary needs cos_cache and sin_cache");
        if (cos.rank != 2 || sin.rank != 2 || cos.dims[0] != sin.dims[0] || cos.dims[1] != sin.dims[1] ||
            cos.dims[1] < 1 || 2 * cos.dims[1] > d)
            return fail(ORT_INVALID_ARGUMENT, "hearth.cuda.Attention: cos and sin caches must be [positions, rotary "
                        "size / 2], at most half the head");
        half = (int)cos.dims[1];
    }
    if ((in[ATTN_Q_GAMMA] == nullptr) != (in[ATTN_K_GAMMA] == nullptr))
        return fail(ORT_INVALID_ARGUMENT, "hearth.cuda.Attention: the QK norms need both gains or neither");
    if (in[ATTN_Q_GAMMA]) {
        if ((st = read_tensor(in[ATTN_Q_GAMMA], ELEMENT_FLOAT16, "Attention's q norm gain", &q_gamma)) ||
            (st = read_tensor(in[ATTN_K_GAMMA], ELEMENT_FLOAT16, "Attention's k norm gain", &k_gamma)))
            return st;
        if (q_gamma.count() != d || k_gamma.count() != d)
            return fail(ORT_INVALID_ARGUMENT, "hearth.cuda.Attention: the QK norms' gains must be [%lld]", (long long)d);
    }
    if (in[ATTN_QKV_BIAS]) {
        if ((st = read_tensor(in[ATTN_QKV_BIAS], ELEMENT_FLOAT16, "Attention's qkv bias", &bias))) return st;
        if (!packed || in[ATTN_Q_GAMMA] || bias.count() != (heads + 2 * kvh) * d)
            return fail(ORT_INVALID_ARGUMENT, "hearth.cuda.Attention: a qkv bias goes with a packed query of %lld and no "
                        "QK norms", (long long)((heads + 2 * kvh) * d));
    }
    const int64_t out_dims[3] = {1, 1, heads * d};
    void *out, *present_k, *present_v;
    OrtValue *value_out;
    for (size_t i = 0; i < 3; i++) {
        void **dst = i == 0 ? &out : i == 1 ? &present_k : &present_v;
        if ((st = CALL(GetOutputFn, SLOT_KernelContext_GetOutput)(ctx, i, i == 0 ? out_dims : past_k.dims,
                                                                   i == 0 ? 3 : 4, &value_out)) ||
            (st = CALL(GetTensorMutableDataFn, SLOT_GetTensorMutableData)(value_out, dst)))
            return st;
    }
    cudaStream_t stream;
    if ((st = stream_of(ctx, &stream))) return st;
    const size_t cache_bytes = (size_t)(kvh * cap * d) * sizeof(__half);
    if (present_k != past_k.data)  /* not one shared buffer: the present starts as a copy of the past */
        st = cuda_status("Attention", cudaMemcpyAsync(present_k, past_k.data, cache_bytes, cudaMemcpyDeviceToDevice, stream));
    if (!st && present_v != past_v.data)
        st = cuda_status("Attention", cudaMemcpyAsync(present_v, past_v.data, cache_bytes, cudaMemcpyDeviceToDevice, stream));
    const int group = (int)(heads / kvh);
    const size_t partial_bytes =
        (size_t)(kvh * kern->splits * hq_attn_group_width(group) * HQ_ATTN_ROW(d)) * sizeof(float);
    void *buffer = nullptr;
    if (!st) st = attention_buffer(kern, partial_bytes + (size_t)kvh * sizeof(unsigned), stream, &buffer);
    if (st) return st;
    const __half *q = (const __half *)query.data;
    HqAttnArgs args;
    args.q = q;
    args.k_new = packed ? q + heads * d : (const __half *)key.data;
    args.v_new = packed ? q + (heads + kvh) * d : (const __half *)value.data;
    args.keys = (__half *)present_k, args.values = (__half *)present_v;
    args.seqlens = (const int32_t *)seqlens.data;
    args.q_gamma = (const __half *)q_gamma.data, args.k_gamma = (const __half *)k_gamma.data;
    args.qk_eps = kern->qk_eps;
    args.qkv_bias = (const __half *)bias.data;
    args.cos = (const __half *)cos.data, args.sin = (const __half *)sin.data;
    args.positions = half ? cos.dims[0] : 0, args.half = half;
    args.cap = cap;
    args.scale = kern->scale > 0.0f ? kern->scale : 1.0f / sqrtf((float)d);
    args.window = kern->window;
    args.splits = kern->splits;
    args.group = group;
    args.partial = (float *)buffer;
    args.done = (unsigned *)((char *)buffer + partial_bytes);
    args.out = (__half *)out;
    hq_attn_launch((int)d, (int)kvh, args, stream);
    return cuda_status("Attention", cudaGetLastError());
}

/* Splits of the past a KV head's keys go to: about two blocks for each multiprocessor in all (128 at most), or
 * HEARTH_CUDA_ATTENTION_BLOCKS_PER_SM=n per multiprocessor (1-16) for timing more blocks against it. */
static int attention_splits(int64_t kv_heads) {
    int device = 0, sms = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || sms <= 0)
        sms = 108;
    const char *env = getenv("HEARTH_CUDA_ATTENTION_BLOCKS_PER_SM");
    int64_t per_sm = env && *env ? (int64_t)atoll(env) : 2;
    per_sm = per_sm < 1 ? 1 : per_sm > 16 ? 16 : per_sm;
    const int64_t splits = (per_sm * sms + kv_heads - 1) / kv_heads;
    return (int)(splits < 1 ? 1 : splits > HQ_ATTN_MAX_SPLITS ? HQ_ATTN_MAX_SPLITS : splits);
}

static OrtStatus *attention_create(const OrtCustomOp *, const OrtApi *, const OrtKernelInfo *info, void **out) {
    const int64_t heads = int_attribute(info, "num_heads", 0), kv_heads = int_attribute(info, "kv_num_heads", 0);
    if (heads < 1 || kv_heads < 1 || heads % kv_heads != 0 || heads > (1 << 16))
        return fail(ORT_INVALID_ARGUMENT, "hearth.cuda.Attention: num_heads (%lld) must be a positive multiple of "
                    "kv_num_heads (%lld)", (long long)heads, (long long)kv_heads);
    if (heads / kv_heads > HQ_ATTN_MAX_GROUP)
        return fail(ORT_INVALID_ARGUMENT, "hearth.cuda.Attention: at most %d query heads a KV head, not %lld",
                    HQ_ATTN_MAX_GROUP, (long long)(heads / kv_heads));
    const float scale = float_attribute(info, "scale", 0.0f), softcap = float_attribute(info, "softcap", 0.0f);
    if (int_attribute(info, "rotary_interleaved", 0) || int_attribute(info, "smooth_softmax", 0) || softcap != 0.0f)
        return fail(ORT_INVALID_ARGUMENT, "hearth.cuda.Attention: interleaved rotary, smooth softmax and softcap are "
                    "not supported");
    if (!(scale >= 0.0f)) return fail(ORT_INVALID_ARGUMENT, "hearth.cuda.Attention: scale must not be negative");
    const float qk_eps = float_attribute(info, "qk_norm_eps", 1e-6f);
    if (!(qk_eps > 0.0f)) return fail(ORT_INVALID_ARGUMENT, "hearth.cuda.Attention: qk_norm_eps must be positive");
    AttentionKernel *kern = new AttentionKernel();
    kern->heads = (int)heads, kern->kv_heads = (int)kv_heads;
    kern->rotary = int_attribute(info, "do_rotary", 0) != 0;
    kern->scale = scale, kern->qk_eps = qk_eps;
    kern->window = int_attribute(info, "local_window_size", -1);
    kern->splits = attention_splits(kv_heads);
    *out = kern;
    return nullptr;
}

static void attention_destroy(void *kernel) {
    AttentionKernel *kern = (AttentionKernel *)kernel;
    if (kern->buffer) cudaFree(kern->buffer);
    delete kern;
}

/* ---- registration --------------------------------------------------------------------------------------------- */
static const char *cuda_provider(const OrtCustomOp *) { return "CUDAExecutionProvider"; }
static int default_memory(const OrtCustomOp *, size_t) { return 0; }
static int required(const OrtCustomOp *, size_t) { return IO_REQUIRED; }
static int matmul_characteristic(const OrtCustomOp *, size_t i) { return i < 2 ? IO_REQUIRED : IO_OPTIONAL; }
static int second_optional(const OrtCustomOp *, size_t i) { return i == 0 ? IO_REQUIRED : IO_OPTIONAL; }
static int zero(const OrtCustomOp *) { return 0; }
static int one(const OrtCustomOp *) { return 1; }
static int end_version(const OrtCustomOp *) { return 1 << 30; }
static int half_type(const OrtCustomOp *, size_t) { return ELEMENT_FLOAT16; }
static size_t one_count(const OrtCustomOp *) { return 1; }

static const char *matmul_name(const OrtCustomOp *) { return "MatMulQ"; }
static int matmul_input_type(const OrtCustomOp *, size_t i) {
    return i == 0 || i >= INPUT_SKIP ? (int)ELEMENT_FLOAT16 : (int)ELEMENT_UINT8;
}
static size_t matmul_inputs(const OrtCustomOp *) { return MATMUL_INPUTS; }
static const char *gather_name(const OrtCustomOp *) { return "GatherQ"; }
static int gather_input_type(const OrtCustomOp *, size_t i) { return i == 0 ? (int)ELEMENT_INT64 : (int)ELEMENT_UINT8; }
static size_t gather_inputs(const OrtCustomOp *) { return 2; }

static OrtCustomOp cuda_op(const char *(*name)(const OrtCustomOp *), int (*input_type)(const OrtCustomOp *, size_t),
                           size_t (*inputs)(const OrtCustomOp *), int (*characteristic)(const OrtCustomOp *, size_t),
                           OrtStatus *(*create)(const OrtCustomOp *, const OrtApi *, const OrtKernelInfo *, void **),
                           OrtStatus *(*compute)(void *, OrtKernelContext *), void (*destroy)(void *)) {
    OrtCustomOp op;
    memset(&op, 0, sizeof op);
    op.version = HEARTH_ORT_API_VERSION;
    op.GetName = name;
    op.GetExecutionProviderType = cuda_provider;
    op.GetInputType = input_type;
    op.GetInputTypeCount = inputs;
    op.GetOutputType = half_type;
    op.GetOutputTypeCount = one_count;
    op.KernelDestroy = destroy;
    op.GetInputCharacteristic = characteristic;
    op.GetOutputCharacteristic = required;
    op.GetInputMemoryType = default_memory;
    op.GetVariadicInputMinArity = one;
    op.GetVariadicInputHomogeneity = zero;
    op.GetVariadicOutputMinArity = one;
    op.GetVariadicOutputHomogeneity = zero;
    op.CreateKernelV2 = create;
    op.KernelComputeV2 = compute;
    op.GetStartVersion = one;
    op.GetEndVersion = end_version;
    return op;
}

static int matmul_output_type(const OrtCustomOp *, size_t i) { return i == 2 ? (int)ELEMENT_UINT8 : (int)ELEMENT_FLOAT16; }
static size_t three_count(const OrtCustomOp *) { return 3; }

/* MatMulQ's optional outputs: the residual stream a norm adds (1), and the scratch of the 8-bit GEMV's quantized
 * activations (2), which ONNX Runtime allocates like any output, so a captured CUDA graph keeps its address. */
static OrtCustomOp matmul_with_sum(OrtCustomOp op) {
    op.GetOutputType = matmul_output_type;
    op.GetOutputTypeCount = three_count;
    op.GetOutputCharacteristic = second_optional;
    return op;
}
static OrtCustomOp matmul_op = matmul_with_sum(cuda_op(matmul_name, matmul_input_type, matmul_inputs,
                                                       matmul_characteristic, matmul_create, matmul_compute,
                                                       matmul_destroy));
static OrtCustomOp gather_op = cuda_op(gather_name, gather_input_type, gather_inputs, required, gather_create,
                                       gather_compute, gather_destroy);

static const char *attention_name(const OrtCustomOp *) { return "Attention"; }
static int attention_input_type(const OrtCustomOp *, size_t i) {
    return i == ATTN_SEQLENS || i == ATTN_TOTAL ? (int)ELEMENT_INT32 : (int)ELEMENT_FLOAT16;
}
static size_t attention_inputs(const OrtCustomOp *) { return ATTN_INPUTS; }
static int attention_characteristic(const OrtCustomOp *, size_t i) {
    return i == ATTN_KEY || i == ATTN_VALUE || i == ATTN_COS || i == ATTN_SIN || i >= ATTN_Q_GAMMA ? IO_OPTIONAL
                                                                                                  : IO_REQUIRED;
}
/* total_sequence_length stays on the host, as GroupQueryAttention has it (OrtMemTypeCPUInput). */
static int attention_memory(const OrtCustomOp *, size_t i) { return i == ATTN_TOTAL ? -2 : 0; }

static OrtCustomOp attention_with_cache(OrtCustomOp op) {
    op.GetOutputTypeCount = three_count;
    op.GetInputMemoryType = attention_memory;
    return op;
}
static OrtCustomOp attention_op = attention_with_cache(cuda_op(attention_name, attention_input_type, attention_inputs,
                                                               attention_characteristic, attention_create,
                                                               attention_compute, attention_destroy));

/* For the Python side: the sources this binary was built from (build.sh), and whether a GPU here can run it. */
HQ_EXPORT const char *HearthCudaKernelsSourceHash(void) { return HEARTH_CUDA_SOURCE_HASH; }

HQ_EXPORT int HearthCudaKernelsUsable(void) {
    int count = 0, major = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count < 1) return 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) != cudaSuccess) return 0;
    return major >= 8;  // built for sm_80 and later (build.sh)
}

HQ_EXPORT OrtStatus *RegisterCustomOps(OrtSessionOptions *options, const OrtApiBase *base) {
    api = base->GetApi(HEARTH_ORT_API_VERSION);
    if (!api) return nullptr;
    const char *build = CALL(GetBuildInfoStringFn, SLOT_GetBuildInfoString)();
    if (!build || strncmp(build, "ORT Build Info", 14) != 0)
        return CALL(CreateStatusFn, SLOT_CreateStatus)(ORT_FAIL, "hearth CUDA kernels: unexpected ONNX Runtime API layout");
    OrtCustomOpDomain *domain;
    OrtStatus *st = CALL(CreateCustomOpDomainFn, SLOT_CreateCustomOpDomain)("ai.hearth.cuda", &domain);
    if (!st) st = CALL(CustomOpDomainAddFn, SLOT_CustomOpDomain_Add)(domain, &matmul_op);
    if (!st) st = CALL(CustomOpDomainAddFn, SLOT_CustomOpDomain_Add)(domain, &gather_op);
    if (!st) st = CALL(CustomOpDomainAddFn, SLOT_CustomOpDomain_Add)(domain, &attention_op);
    if (!st) st = CALL(AddCustomOpDomainFn, SLOT_AddCustomOpDomain)(options, domain);
    return st;
}
