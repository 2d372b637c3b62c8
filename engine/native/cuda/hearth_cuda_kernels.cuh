/* The CUDA kernels behind ai.hearth.cuda.MatMulQ and GatherQ (hearth_cuda.cu wires them to ONNX Runtime).
 *
 * gemv_kernel: y = act(x) · Wᵀ for a few rows of x (a decode step: 1; prompt-lookup verification: up to 8),
 * straight from the GGUF's blocks. One warp per output row; the block's 8 warps share x, staged once in shared
 * memory as fp32 (after the gate activation when the layer is an MLP's down projection: x then holds gate|up
 * side by side and the kernel reads act(gate)·up, so the Split, activation and Mul of ONNX Runtime's graph are
 * not separate kernels). Each lane decodes eight weights at a time (hearth_cuda_blocks.cuh) and keeps fp32
 * sums; the warp adds its lanes' sums. Up to three weight matrices of different types can sit side by side in
 * one launch (Q|K|V where V is Q6_K and Q, K are Q4_K, as llama.cpp's Q4_K_M mix has them).
 *
 * Longer inputs (a prefill) dequantize the weights to fp16 in slabs (dequant_kernel) for cuBLAS's GEMM.
 */
#ifndef HEARTH_CUDA_KERNELS_CUH
#define HEARTH_CUDA_KERNELS_CUH

#include <cstdlib>

#include "hearth_cuda_blocks.cuh"

#define HQ_THREADS 256       /* threads of a GEMV block, sharing its rows' chunks */
#define HQ_WARPS (HQ_THREADS / 32)
#define HQ_STAGE_BYTES 32768 /* shared memory for the staged activations: under the 48 KB every GPU gives unasked */
#define HQ_MAX_SEGMENTS 3

enum { HQ_ACT_NONE = 0, HQ_ACT_SILU = 1, HQ_ACT_GELU_TANH = 2 };

/* The RMS norm a layer's input takes first, fused into the matmul that reads it: x' = RMSNorm(x + skip) · gamma,
 * (x + skip) also written out as the new residual stream. gamma null: no norm. skip null: the norm of x alone. */
struct HqNorm {
    const __half *skip;
    const __half *gamma;
    __half *summed;  /* x + skip, fp16, written by the first block (null where no one reads it) */
    float eps;
};

/* Weight matrices side by side along the output: segment s holds output rows [start[s], start[s+1]). */
struct HqSegments {
    const uint8_t *rows[HQ_MAX_SEGMENTS];
    int64_t row_bytes[HQ_MAX_SEGMENTS];
    int type[HQ_MAX_SEGMENTS];
    int64_t start[HQ_MAX_SEGMENTS + 1];
    int count;
    int64_t total;  /* start[count], set by the host: indexing by count in a kernel puts the struct in local memory */
};

/* Programmatic dependent launch (compute capability 9.0 and later; hq_launch): a kernel launched so may start
 * while the one before it on the stream is still running, and must wait (hq_pdl_wait) before it reads what that one
 * writes or writes anything at all (ONNX Runtime reuses buffers, so a write could land in one still being read).
 * Before the wait it may only read weights: a GEMV pulls its rows into L2 there, so its loads overlap the previous
 * kernel's tail and the launch between them (a decode step of the 8B is 293 launches). Each kernel lets the next
 * one launch (hq_pdl_release) once it is past its own wait, so at most two kernels are resident at a time. Both are
 * no-ops on older GPUs and where the kernel was launched plainly. */
__device__ __forceinline__ void hq_pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void hq_pdl_release() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* `bytes` from p into L2, a 128-byte line a lane in turn (no registers held, nothing waited on). */
__device__ __forceinline__ void hq_prefetch_l2(const uint8_t *p, int64_t bytes, int lane, int lanes) {
    for (int64_t off = (int64_t)lane * 128; off < bytes; off += (int64_t)lanes * 128)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(p + off));
}

#ifdef __CUDACC__
/* Whether hq_launch launches programmatically dependent: on GPUs of compute capability 9.0 and later, unless
 * HEARTH_CUDA_PDL=0. Read once. */
static inline bool hq_pdl_on() {
    static const bool on = [] {
        const char *env = getenv("HEARTH_CUDA_PDL");
        if (env && env[0] == '0' && env[1] == '\0') return false;
        int device = 0, major = 0;
        return cudaGetDevice(&device) == cudaSuccess &&
               cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess && major >= 9;
    }();
    return on;
}

/* kernel<<<grid, block, shared, stream>>>(args...), allowed to start before the kernel ahead of it on the stream
 * ends where hq_pdl_on (the kernel then calls hq_pdl_wait first). An error is left for cudaGetLastError. */
template <typename... Params, typename... Args>
static inline void hq_launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared, cudaStream_t stream,
                             Args... args) {
    if (!hq_pdl_on()) {
        kernel<<<grid, block, shared, stream>>>(args...);
        return;
    }
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t config = {};
    config.gridDim = grid, config.blockDim = block, config.dynamicSmemBytes = shared, config.stream = stream;
    config.attrs = attr, config.numAttrs = 1;
    (void)cudaLaunchKernelEx(&config, kernel, static_cast<Params>(args)...);
}
#endif

__device__ __forceinline__ float hq_act(int act, float g) {
    if (act == HQ_ACT_SILU) return g / (1.0f + __expf(-g));
    if (act == HQ_ACT_GELU_TANH) return 0.5f * g * (1.0f + tanhf(0.7978845608f * (g + 0.044715f * g * g * g)));
    return g;
}

/* x's column k of row m as the matmul reads it: act(gate)·up when act is set (x_stride = 2K), else x itself. */
__device__ __forceinline__ float hq_input(const __half *x, int64_t x_stride, int act, int64_t k_total, int m,
                                          int64_t k) {
    const __half *row = x + (int64_t)m * x_stride;
    if (act == HQ_ACT_NONE) return __half2float(row[k]);
    return hq_act(act, __half2float(row[k])) * __half2float(row[k_total + k]);
}

/* The tile of K staged at a time: a multiple of 256, so no block straddles two tiles, and the largest whose MT
 * rows fit the stage, or all of K rounded up where that is less. Also the stride between the staged rows. */
__host__ __device__ __forceinline__ int64_t hq_tile(int mt, int64_t k_total) {
    const int64_t most = (int64_t)(HQ_STAGE_BYTES / 4 / mt) & ~255LL, whole = (k_total + 255) & ~255LL;
    return whole < most ? whole : most;
}

/* A block's R output rows: where each one's blocks start and their type (static indexing of the segments, so
 * nothing of the kernel's parameters goes through local memory). A row past the last is clamped to it. */
template <int R>
HQ_FN bool hq_locate(const HqSegments segs, int64_t r0, const uint8_t *row[R], int type[R]) {
    const int64_t n_total = segs.total;
HQ_UNROLL
    for (int i = 0; i < R; i++) {
        const int64_t r = r0 + i < n_total ? r0 + i : n_total - 1;
HQ_UNROLL
        for (int s = 0; s < HQ_MAX_SEGMENTS; s++) {
            if (s < segs.count && r >= segs.start[s] && r < segs.start[s + 1]) {
                row[i] = segs.rows[s] + (r - segs.start[s]) * segs.row_bytes[s];
                type[i] = segs.type[s];
            }
        }
    }
    bool uniform = true;
HQ_UNROLL
    for (int i = 1; i < R; i++) uniform = uniform && type[i] == type[0];
    return uniform;
}

/* The block's threads share the chunks of K: thread t (``thread``) takes chunks t, t + 256, …, and for each decodes the same
 * chunk of all R rows (R independent loads in flight per thread; a warp reads 128 consecutive bytes of a row).
 * One block per R rows, not one warp per row: a 4,096-wide row is 512 chunks, two per thread instead of sixteen
 * sequential ones per lane, whose load latency was the GEMV's whole cost (23 µs a [4096 x 4096] Q4_K layer
 * against ~6 µs of bandwidth on an H100, bench/cuda_layer_forms.py). */
template <int TYPE, int MT, int R>
HQ_FN void hq_rows_dot(const uint8_t *const row[R], int c0, int c1, int k0, const float *xs, int tile,
                       float (&acc)[MT][R], int thread) {
    for (int c = c0 + thread; c < c1; c += HQ_THREADS) {
        /* The chunk's activations once (every row's chunk c sits at the same columns), then each row's weights. */
        float w[8], xv[MT][8];
        int pos = 0, off[4];
        hq_decode8(TYPE, row[0], c, w, &pos, off);
HQ_UNROLL
        for (int p = 0; p < 4; p++)
HQ_UNROLL
            for (int m = 0; m < MT; m++) {
                const float2 v = *reinterpret_cast<const float2 *>(xs + m * tile + pos + off[p] - k0);
                xv[m][2 * p] = v.x;
                xv[m][2 * p + 1] = v.y;
            }
HQ_UNROLL
        for (int i = 0; i < R; i++) {
            if (i > 0) hq_decode8(TYPE, row[i], c, w, &pos, off);
HQ_UNROLL
            for (int m = 0; m < MT; m++)
HQ_UNROLL
                for (int j = 0; j < 8; j++) acc[m][i] = fmaf(w[j], xv[m][j], acc[m][i]);
        }
    }
}

template <int MT, int R>
HQ_FN void hq_dispatch(int type, const uint8_t *const row[R], int c0, int c1, int k0, const float *xs, int tile,
                       float (&acc)[MT][R], int thread) {
    switch (type) {
    case HQ_Q4_0: hq_rows_dot<HQ_Q4_0, MT, R>(row, c0, c1, k0, xs, tile, acc, thread); break;
    case HQ_Q4_1: hq_rows_dot<HQ_Q4_1, MT, R>(row, c0, c1, k0, xs, tile, acc, thread); break;
    case HQ_Q5_0: hq_rows_dot<HQ_Q5_0, MT, R>(row, c0, c1, k0, xs, tile, acc, thread); break;
    case HQ_Q5_1: hq_rows_dot<HQ_Q5_1, MT, R>(row, c0, c1, k0, xs, tile, acc, thread); break;
    case HQ_Q8_0: hq_rows_dot<HQ_Q8_0, MT, R>(row, c0, c1, k0, xs, tile, acc, thread); break;
    case HQ_Q4_K: hq_rows_dot<HQ_Q4_K, MT, R>(row, c0, c1, k0, xs, tile, acc, thread); break;
    case HQ_Q5_K: hq_rows_dot<HQ_Q5_K, MT, R>(row, c0, c1, k0, xs, tile, acc, thread); break;
    case HQ_Q6_K: hq_rows_dot<HQ_Q6_K, MT, R>(row, c0, c1, k0, xs, tile, acc, thread); break;
    default: break;
    }
}

/* Σ v and max v over a warp's lanes, for every lane. */
__device__ __forceinline__ float hq_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float hq_warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Block-wide sum of one float per thread (a block of WARPS warps); every thread gets it. */
template <int WARPS = HQ_WARPS>
__device__ __forceinline__ float hq_block_sum(float v, float *scratch) {
    v = hq_warp_sum(v);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float total = 0.0f;
    for (int w = 0; w < WARPS; w++) total += scratch[w];
    return total;
}

/* Eight fp16 values from a 16-byte aligned address, as floats. */
__device__ __forceinline__ void hq_load8(const __half *p, float v[8]) {
    const uint4 u = *reinterpret_cast<const uint4 *>(p);
    const __half2 *h2 = reinterpret_cast<const __half2 *>(&u);
    for (int e = 0; e < 4; e++) {
        const float2 f = __half22float2(h2[e]);
        v[2 * e] = f.x, v[2 * e + 1] = f.y;
    }
}

/* The RMS norm's scale 1/sqrt(mean((x + skip)²) + eps) of one row (skip may be null), x + skip written to summed
 * where that is not null. Every thread of the block calls it. Eight columns a load (rows are whole blocks of 32
 * weights, 16-byte aligned); a single 4,096-wide row read two values a load took most of the 8-bit quantizer's
 * 10 µs on an H100 (bench/gpu_kernels.py, 2026-12-07). */
__device__ __forceinline__ float hq_norm_scale(const __half *x, const __half *skip, __half *summed, int64_t k_total,
                                               float eps) {
    __shared__ float scratch[HQ_WARPS];
    float squares = 0.0f;
    for (int64_t k = 8 * (int64_t)threadIdx.x; k < k_total; k += 8 * (int64_t)blockDim.x) {
        float v[8], w[8];
        hq_load8(x + k, v);
        if (skip) {
            hq_load8(skip + k, w);
            for (int e = 0; e < 8; e++) v[e] += w[e];
        }
        if (summed) {
            uint4 packed;
            __half2 *h2 = reinterpret_cast<__half2 *>(&packed);
            for (int e = 0; e < 4; e++) h2[e] = __floats2half2_rn(v[2 * e], v[2 * e + 1]);
            *reinterpret_cast<uint4 *>(summed + k) = packed;
        }
        for (int e = 0; e < 8; e++) squares += v[e] * v[e];
    }
    return rsqrtf(hq_block_sum(squares, scratch) / (float)k_total + eps);
}

/* Stages RMSNorm(x + skip) · gamma of one row of K (all of it: the caller checks K fits one tile) into xs, and
 * the sum into norm.summed from the first block. */
__device__ __forceinline__ void hq_stage_normed(const __half *x, int64_t k_total, const HqNorm &norm, float *xs) {
    const float scale = hq_norm_scale(x, norm.skip, blockIdx.x == 0 ? norm.summed : nullptr, k_total, norm.eps);
    for (int64_t k = threadIdx.x; k < k_total; k += blockDim.x) {
        float v = __half2float(x[k]);
        if (norm.skip) v += __half2float(norm.skip[k]);
        xs[k] = v * scale * __half2float(norm.gamma[k]);
    }
}

/* Output rows per block for MT rows of x: fewer as MT grows, so MT·R sums fit the registers. */
__host__ __device__ constexpr int hq_rows_per_block(int mt) { return mt == 1 ? 8 : mt == 2 ? 4 : mt == 4 ? 2 : 1; }

/* Rows 0 .. MT-1 of x (fewer when rows < MT) against every output row; y is [rows, n_total]. */
template <int MT>
__global__ void __launch_bounds__(HQ_THREADS) gemv_kernel(const __half *__restrict__ x, int64_t x_stride, int act,
                                                          int rows, int64_t k_total, HqSegments segs, HqNorm norm,
                                                          __half *__restrict__ y) {
    constexpr int R = hq_rows_per_block(MT);
    extern __shared__ float xs[];
    __shared__ float partial[HQ_WARPS][MT * R];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t n_total = segs.total;
    const int64_t r0 = (int64_t)blockIdx.x * R;
    const uint8_t *row[R];
    int type[R];
    const bool uniform = hq_locate<R>(segs, r0, row, type);
    const int tile = (int)hq_tile(MT, k_total);
    float acc[MT][R];
HQ_UNROLL
    for (int m = 0; m < MT; m++)
HQ_UNROLL
        for (int i = 0; i < R; i++) acc[m][i] = 0.0f;
    for (int k0 = 0; k0 < k_total; k0 += tile) {
        const int kt = (int)min((int64_t)tile, k_total - k0);
        __syncthreads();  /* the previous tile is read */
        if (norm.gamma) {  /* MT == 1, and all of K in this tile (launch_gemv checks) */
            hq_stage_normed(x, k_total, norm, xs);
        } else {
            for (int m = 0; m < MT; m++)
                for (int k = threadIdx.x; k < kt; k += HQ_THREADS)
                    xs[m * tile + k] = m < rows ? hq_input(x, x_stride, act, k_total, m, k0 + k) : 0.0f;
        }
        __syncthreads();
        const int c0 = k0 / 8, c1 = (k0 + kt) / 8;
        if (uniform) {
            hq_dispatch<MT, R>(type[0], row, c0, c1, k0, xs, tile, acc, threadIdx.x);
        } else {  /* rows of different types (a segment boundary inside this block): one at a time */
HQ_UNROLL
            for (int i = 0; i < R; i++) {
                float one[MT][1];
HQ_UNROLL
                for (int m = 0; m < MT; m++) one[m][0] = 0.0f;
                const uint8_t *single[1] = {row[i]};
                hq_dispatch<MT, 1>(type[i], single, c0, c1, k0, xs, tile, one, threadIdx.x);
HQ_UNROLL
                for (int m = 0; m < MT; m++) acc[m][i] += one[m][0];
            }
        }
    }
HQ_UNROLL
    for (int m = 0; m < MT; m++)
HQ_UNROLL
        for (int i = 0; i < R; i++) {
            const float v = hq_warp_sum(acc[m][i]);
            if (lane == 0) partial[warp][m * R + i] = v;
        }
    __syncthreads();
    if (threadIdx.x < MT * R) {
        const int m = threadIdx.x / R, i = threadIdx.x % R;
        float v = 0.0f;
HQ_UNROLL
        for (int w = 0; w < HQ_WARPS; w++) v += partial[w][threadIdx.x];
        if (m < rows && r0 + i < n_total) y[(int64_t)m * n_total + r0 + i] = __float2half(v);
    }
}

/* RMSNorm(x + skip) · gamma of each row of x [rows, K] into out (fp16), the sum into norm.summed: a fused norm's
 * input where the GEMV cannot stage it (more than one row, or K past one tile). One block per row. */
__global__ void __launch_bounds__(HQ_THREADS) rmsnorm_kernel(const __half *__restrict__ x, int64_t k_total,
                                                                HqNorm norm, __half *__restrict__ out) {
    __shared__ float scratch[HQ_WARPS];
    const int64_t row = blockIdx.x;
    const __half *xr = x + row * k_total;
    const __half *sr = norm.skip ? norm.skip + row * k_total : nullptr;
    float squares = 0.0f;
    for (int64_t k = threadIdx.x; k < k_total; k += blockDim.x) {
        float v = __half2float(xr[k]);
        if (sr) v += __half2float(sr[k]);
        if (norm.summed) norm.summed[row * k_total + k] = __float2half(v);
        squares += v * v;
    }
    const float scale = rsqrtf(hq_block_sum(squares, scratch) / (float)k_total + norm.eps);
    for (int64_t k = threadIdx.x; k < k_total; k += blockDim.x) {
        float v = __half2float(xr[k]);
        if (sr) v += __half2float(sr[k]);
        out[row * k_total + k] = __float2half(v * scale * __half2float(norm.gamma[k]));
    }
}

/* Rows [r0, r1) of the side-by-side matrices, dequantized to fp16 [r1 - r0, K] (a slab for cuBLAS). */
__global__ void dequant_kernel(HqSegments segs, int64_t r0, int64_t r1, int64_t k_total, __half *__restrict__ out) {
    const int64_t chunks = k_total / 8, total = (r1 - r0) * chunks;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = r0 + i / chunks;
        const int c = (int)(i % chunks);
        const uint8_t *row[1];
        int type[1];
        hq_locate<1>(segs, r, row, type);
        float w[8];
        int pos, off[4];
        hq_decode8(type[0], row[0], c, w, &pos, off);
        __half *dst = out + (r - r0) * k_total + pos;
        for (int p = 0; p < 4; p++)
            *reinterpret_cast<__half2 *>(dst + off[p]) = __floats2half2_rn(w[2 * p], w[2 * p + 1]);
    }
}

/* act(gate)·up of x [rows, 2K] as fp16 [rows, K]: a prefill's down-projection input for cuBLAS. */
__global__ void activation_kernel(const __half *__restrict__ x, int64_t rows, int64_t k_total, int act,
                                  __half *__restrict__ out) {
    const int64_t total = rows * k_total;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t m = i / k_total, k = i - m * k_total;
        out[i] = __float2half(hq_input(x, 2 * k_total, act, k_total, (int)m, k));
    }
}

/* Rows ids[t] of the table, dequantized to fp16 out[t, K]; an id outside [0, vocab) gives a row of zeros
 * (a kernel cannot fail; the engine never sends one: its token ids come from the model's own vocabulary). */
__global__ void gather_kernel(const int64_t *__restrict__ ids, int64_t count, const uint8_t *__restrict__ table,
                              int64_t vocab, int64_t row_bytes, int type, int64_t k_total, __half *__restrict__ out) {
    const int64_t t = blockIdx.x;
    if (t >= count) return;
    const int64_t id = ids[t];
    __half *dst = out + t * k_total;
    if (id < 0 || id >= vocab) {
        for (int64_t k = threadIdx.x; k < k_total; k += blockDim.x) dst[k] = __float2half(0.0f);
        return;
    }
    const uint8_t *row = table + id * row_bytes;
    for (int c = threadIdx.x; c < k_total / 8; c += blockDim.x) {
        float w[8];
        int pos, off[4];
        hq_decode8(type, row, c, w, &pos, off);
        for (int p = 0; p < 4; p++)
            *reinterpret_cast<__half2 *>(dst + pos + off[p]) = __floats2half2_rn(w[2 * p], w[2 * p + 1]);
    }
}

#endif
