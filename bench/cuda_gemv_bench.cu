/* The 8-bit GEMV (hearth_cuda_q8.cuh) alone on the GPU machine, no ONNX Runtime: every shape of a Llama-3-8B and a
 * Qwen2.5-7B decode step in llama.cpp's Q4_K_M mix, each launch reading weights at another place in a 1.5 GB pool
 * (so L2, 50 MB, holds none of them, as in a real step), timed by CUDA events over 200 launches; then a whole
 * step's GEMVs (32 or 28 layers and the head) launched back to back as the engine launches them. Each form is
 * checked against the library's kernel on the same weights first.
 *
 *   nvcc -O3 -std=c++17 -arch=sm_90 bench/cuda_gemv_bench.cu -o /tmp/gemv_bench && /tmp/gemv_bench
 */
#include <cstdio>
#include <vector>

#include "../engine/native/cuda/hearth_cuda_q8.cuh"

#define CHECK(call)                                                                           \
    do {                                                                                      \
        cudaError_t e_ = (call);                                                              \
        if (e_ != cudaSuccess) {                                                              \
            fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_));        \
            exit(1);                                                                          \
        }                                                                                     \
    } while (0)

/* ---- the forms under test ---------------------------------------------------------------------------------- */

/* Q6_K's chunk c as the library read it before hq_run16: every word as two 16-bit halves (29 loads a chunk). */
__device__ __forceinline__ void q6_halves_load(const uint8_t *row, int c, HqChunk &k) {
    const uint32_t low = 0x0F0F0F0Fu;
    const int sb = c >> 2, h = (c >> 1) & 1, t = c & 1;
    const uint8_t *blk = row + (size_t)sb * 210;
    const uint8_t *ql = blk + 64 * h + 16 * t, *qh = blk + 128 + 32 * h + 16 * t;
    const int8_t *sc = (const int8_t *)(blk + 192) + 8 * h + t;
    const float d = hq_half(blk + 208);
    k.col0 = sb * 256 + 128 * h;
    HQ_UNROLL
    for (int i = 0; i < 4; i++) {
        const uint32_t a = hq_word<2>(ql + 4 * i), b = hq_word<2>(ql + 32 + 4 * i), hb = hq_word<2>(qh + 4 * i);
        k.v[i] = (int)((a & low) | ((hb << 4) & 0x30303030u));
        k.v[4 + i] = (int)((b & low) | ((hb << 2) & 0x30303030u));
        k.v[8 + i] = (int)(((a >> 4) & low) | (hb & 0x30303030u));
        k.v[12 + i] = (int)(((b >> 4) & low) | ((hb >> 2) & 0x30303030u));
    }
    HQ_UNROLL
    for (int q = 0; q < 4; q++) {
        k.goff[q] = 32 * q + 16 * t;
        k.a[q] = d * (float)sc[2 * q];
        k.b[q] = -32.0f * k.a[q];
    }
}

template <int TYPE>
__device__ __forceinline__ void form_load(const uint8_t *row, int c, HqChunk &k) {
    if (TYPE == HQ_Q6_K + 100) q6_halves_load(row, c, k);
    else hq_q8_load<TYPE>(row, c, k);
}

/* hq_q8_row with U chunks a lane loaded before any is used (the library's: 2 at MT = 1). */
template <int TYPE, int U>
__device__ __forceinline__ void deep_row(const uint8_t *row, int kt, const HqXq &x, float &acc, int lane, int lanes) {
    constexpr int CW = 64, G = 4;
    static_assert(TYPE >= HQ_Q4_K, "K-quants only");
    const int c1 = kt / CW;
#pragma unroll(U)
    for (int c = lane; c < c1; c += lanes) {
        HqChunk k;
        form_load<TYPE>(row, c, k);
        float sum = 0.0f;
        HQ_UNROLL
        for (int g = 0; g < G; g++) {
            const int col = k.col0 + k.goff[g];
            const int4 xw = *reinterpret_cast<const int4 *>(x.q + col);
            int s = hq_dp4a(k.v[4 * g], xw.x, 0);
            s = hq_dp4a(k.v[4 * g + 1], xw.y, s);
            s = hq_dp4a(k.v[4 * g + 2], xw.z, s);
            s = hq_dp4a(k.v[4 * g + 3], xw.w, s);
            sum += x.d[col >> 5] * (k.a[g] * (float)s + k.b[g] * (float)x.s[col >> 4]);
        }
        acc += sum;
    }
}

/* library: gemv_q8x_kernel as launched by default; together2, together4: the same kernel with HEARTH_CUDA_GEMV_ROWS
 * 2 or 4 (a warp's rows read together, hq_q8_rows) for every shape; the others: one row after the other, Q6_K by
 * 16-bit halves as before hq_run16 (q6halves) or U chunks a lane in flight (deepU). */
enum { FORM_LIBRARY = 0, FORM_HALVES, FORM_DEEP4, FORM_DEEP8, FORM_TOGETHER2, FORM_TOGETHER4, FORM_COUNT };
static const char *FORM_NAMES[FORM_COUNT] = {"library", "q6halves", "deep4", "deep8", "together2", "together4"};

/* W: Q6_K by 16-bit halves (q6_halves_load), as before hq_run16. */
template <int U, bool W = false>
__device__ __forceinline__ void deep_dispatch(int type, const uint8_t *row, int kt, const HqXq &x, float &acc,
                                              int lane) {
    switch (type) {
    case HQ_Q4_K: deep_row<HQ_Q4_K, U>(row, kt, x, acc, lane, 32); break;
    case HQ_Q6_K: deep_row<W ? HQ_Q6_K + 100 : HQ_Q6_K, U>(row, kt, x, acc, lane, 32); break;
    default: break;
    }
}

/* One warp per RW rows, one after the other, U chunks a lane in flight; W: Q6_K by 16-bit halves. */
template <int RW, int U, bool W = false>
__global__ void __launch_bounds__(HQ_THREADS) form_kernel(const uint8_t *__restrict__ scratch, int64_t k_total,
                                                          HqSegments segs, __half *__restrict__ y) {
    const HqXq x = {reinterpret_cast<const int8_t *>(scratch), reinterpret_cast<const float *>(scratch + k_total),
                    reinterpret_cast<const int *>(scratch + k_total + k_total / 8)};
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t n_total = segs.total, r0 = ((int64_t)blockIdx.x * HQ_WARPS + warp) * RW;
    const uint8_t *row[RW];
    int type[RW];
    hq_locate<RW>(segs, r0, row, type);
    hq_q8_prefetch<RW>(segs, r0, row, type, k_total, lane);
    hq_pdl_wait();
    hq_pdl_release();
    float acc[RW][1];
    HQ_UNROLL
    for (int j = 0; j < RW; j++) {
        acc[j][0] = 0.0f;
        if (r0 + j < n_total) deep_dispatch<U, W>(type[j], row[j], (int)k_total, x, acc[j][0], lane);
    }
    hq_warp_write<1, RW>(acc, lane, 1, r0, n_total, y);
}

/* form_kernel with one or two rows a warp. */
template <int U, bool W = false>
static void launch_own(int rw, dim3 grid, cudaStream_t s, const uint8_t *scratch, int64_t k, const HqSegments &segs,
                       __half *y) {
    if (rw == 2) hq_launch(form_kernel<2, U, W>, grid, dim3(HQ_THREADS), 0, s, scratch, k, segs, y);
    else hq_launch(form_kernel<1, U, W>, grid, dim3(HQ_THREADS), 0, s, scratch, k, segs, y);
}

static void launch_form(int form, int rw, const uint8_t *scratch, int64_t k, const HqSegments &segs, __half *y,
                        cudaStream_t s) {
    if (form == FORM_TOGETHER2 || form == FORM_TOGETHER4) rw = form == FORM_TOGETHER4 ? 4 : 2;
    const dim3 grid((unsigned)((segs.total + HQ_WARPS * rw - 1) / (HQ_WARPS * rw))), block(HQ_THREADS);
    switch (form) {
    case FORM_LIBRARY:
        if (rw == 2) hq_launch(gemv_q8x_kernel<1, 2>, grid, block, 0, s, scratch, 1, 0, 1, k, segs, y);
        else hq_launch(gemv_q8x_kernel<1, 1>, grid, block, 0, s, scratch, 1, 0, 1, k, segs, y);
        break;
    case FORM_HALVES: launch_own<2, true>(rw, grid, s, scratch, k, segs, y); break;
    case FORM_DEEP4: launch_own<4>(rw, grid, s, scratch, k, segs, y); break;
    case FORM_DEEP8: launch_own<8>(rw, grid, s, scratch, k, segs, y); break;
    case FORM_TOGETHER2: hq_launch(gemv_q8x_rows_kernel<2>, grid, block, 0, s, scratch, 1, 0, 1, k, segs, y); break;
    case FORM_TOGETHER4: hq_launch(gemv_q8x_rows_kernel<4>, grid, block, 0, s, scratch, 1, 0, 1, k, segs, y); break;
    }
}

/* ---- the shapes of a step ---------------------------------------------------------------------------------- */

struct Shape {
    const char *name;
    int64_t k;
    int count;
    int64_t n[3];
    int type[3];
    int per_step;
};

static int64_t shape_bytes(const Shape &sh, int s) { return sh.n[s] * (sh.k / 256) * hq_block_bytes(sh.type[s]); }
static int64_t total_bytes(const Shape &sh) {
    int64_t b = 0;
    for (int s = 0; s < sh.count; s++) b += shape_bytes(sh, s);
    return b;
}

__global__ void fill_kernel(uint8_t *p, int64_t n, uint32_t seed) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 13, h *= 0x5bd1e995u, h ^= h >> 15;
        p[i] = (uint8_t)h;
    }
}

/* Every block's fp16 fields set to small numbers, so sums are finite and the forms can be compared. */
__global__ void fix_scales_kernel(uint8_t *p, int64_t blocks, int type) {
    const int bytes = hq_block_bytes(type);
    for (int64_t b = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; b < blocks; b += (int64_t)gridDim.x * blockDim.x) {
        uint8_t *blk = p + b * bytes;
        const __half v = __float2half(0.01f + 0.001f * (float)(b % 7));
        if (type == HQ_Q6_K) {
            *reinterpret_cast<__half *>(blk + 208) = v;
        } else if (type == HQ_Q4_K || type == HQ_Q5_K) {
            *reinterpret_cast<__half *>(blk) = v;
            *reinterpret_cast<__half *>(blk + 2) = v;
        } else {
            *reinterpret_cast<__half *>(blk) = v;
            if (type == HQ_Q4_1 || type == HQ_Q5_1) *reinterpret_cast<__half *>(blk + 2) = v;
        }
    }
}

/* The scratch q8_quantize_kernel writes, for one row of K: random codes, scales 0.02, sums of the codes. */
__global__ void fill_x_kernel(uint8_t *scratch, int64_t k) {
    int8_t *q = reinterpret_cast<int8_t *>(scratch);
    float *d = reinterpret_cast<float *>(scratch + k);
    int *s = reinterpret_cast<int *>(scratch + k + k / 8);
    for (int64_t g = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; g < k / 16; g += (int64_t)gridDim.x * blockDim.x) {
        int sum = 0;
        for (int j = 0; j < 16; j++) {
            const int v = (int)((g * 16 + j) * 37 % 255) - 127;
            q[g * 16 + j] = (int8_t)v;
            sum += v;
        }
        s[g] = sum;
        if (g % 2 == 0) d[g / 2] = 0.02f;
    }
}

static const int64_t POOL = 1536LL << 20;

static HqSegments segments_at(const Shape &sh, uint8_t *pool, int64_t offset) {
    HqSegments segs = {};
    int64_t start = 0;
    for (int s = 0; s < sh.count; s++) {
        segs.rows[s] = pool + offset;
        segs.row_bytes[s] = (sh.k / 256) * hq_block_bytes(sh.type[s]);
        segs.type[s] = sh.type[s];
        segs.start[s] = start;
        start += sh.n[s];
        offset += (shape_bytes(sh, s) + 255) & ~255LL;
    }
    segs.start[sh.count] = start;
    segs.count = sh.count;
    segs.total = start;
    return segs;
}

/* Launch i's weights: somewhere else in the pool each time. */
static int64_t offset_of(const Shape &sh, int i) {
    const int64_t span = (total_bytes(sh) + 4096 + 255) & ~255LL, slots = POOL / span;
    return (int64_t)(i % slots) * span;
}

/* ---- a whole step's chain: quantizer, GEMV, quantizer, GEMV ... as launch_gemv_q8x launches them ---------------- */

/* q8_quantize_kernel without the row's norm scale: the codes of RMSNorm(x + skip)·gamma do not depend on it (each
 * group of 32 is scaled by its own largest magnitude), so a block need not read the whole row first; the GEMV would
 * multiply its sums by the scale, from the blocks' partial sums of squares. Timed here for what it saves. */
__global__ void __launch_bounds__(HQ_THREADS) q8_local_kernel(const __half *__restrict__ x, int64_t x_stride, int act,
                                                              int64_t k_total, HqNorm norm, int rows,
                                                              uint8_t *__restrict__ scratch) {
    hq_pdl_wait();
    hq_pdl_release();
    const int m = blockIdx.y;
    int8_t *xq = reinterpret_cast<int8_t *>(scratch) + (int64_t)m * k_total;
    float *xd = reinterpret_cast<float *>(scratch + rows * k_total) + (int64_t)m * (k_total / 32);
    int *xs = reinterpret_cast<int *>(scratch + rows * k_total + rows * (k_total / 8)) + (int64_t)m * (k_total / 16);
    const __half *row = x + (int64_t)m * x_stride;
    const __half *skip = norm.skip ? norm.skip + (int64_t)m * k_total : nullptr;
    const int64_t col = (int64_t)blockIdx.x * HQ_Q8_SLICE + 8 * (int64_t)threadIdx.x;
    if (norm.summed && skip && col < k_total) {  /* the residual's slice, and its squares' partial sum */
        float v[8], w[8];
        hq_load8(row + col, v);
        hq_load8(skip + col, w);
        uint4 packed;
        __half2 *h2 = reinterpret_cast<__half2 *>(&packed);
        float sq = 0.0f;
        for (int e = 0; e < 4; e++) {
            h2[e] = __floats2half2_rn(v[2 * e] + w[2 * e], v[2 * e + 1] + w[2 * e + 1]);
            sq += (v[2 * e] + w[2 * e]) * (v[2 * e] + w[2 * e]) + (v[2 * e + 1] + w[2 * e + 1]) * (v[2 * e + 1] + w[2 * e + 1]);
        }
        *reinterpret_cast<uint4 *>(norm.summed + (int64_t)m * k_total + col) = packed;
        sq = hq_warp_sum(sq);
        if ((threadIdx.x & 31) == 0) atomicAdd(reinterpret_cast<float *>(scratch) + 0, sq * 0.0f);
    }
    hq_q8_quantize8(row, skip, norm.gamma, 1.0f, act, k_total, col, col < k_total, xq + col, xd + col / 32,
                    xs + col / 16);
}

struct Chain {
    __half *hidden, *skip, *gamma, *summed, *attn, *qkv, *o, *gu, *down, *logits;
    uint8_t *scratch;
};

static void quantize(bool local, const __half *x, int64_t stride, int act, int64_t k, const HqNorm &norm,
                     uint8_t *scratch, cudaStream_t s) {
    const dim3 slices((unsigned)((k + HQ_Q8_SLICE - 1) / HQ_Q8_SLICE), 1);
    if (local) hq_launch(q8_local_kernel, slices, dim3(HQ_THREADS), 0, s, x, stride, act, k, norm, 1, scratch);
    else hq_launch(q8_quantize_kernel, slices, dim3(HQ_THREADS), 0, s, x, stride, act, k, norm, 1, scratch);
}

/* Shapes a model has in main's table: Q|K|V mixed and not, o, gate|up, down Q6_K and Q4_K, head (8B, then Qwen). */
static const int SHAPES_A_MODEL = 7;

/* One decode step's GEMVs and quantizers for a model of `layers` layers (its SHAPES_A_MODEL shapes from sh). */
static void step(const Shape *sh, int layers, int form, bool local, const Chain &c, uint8_t *pool, int64_t &at,
                 cudaStream_t s) {
    auto next = [&](const Shape &x) {
        const int64_t span = (total_bytes(x) + 4096 + 255) & ~255LL;
        if (at + span > POOL) at = 0;
        const HqSegments segs = segments_at(x, pool, at);
        at += span;
        return segs;
    };
    auto rw_of = [](const HqSegments &g) { return g.total >= 8192 ? 2 : 1; };
    const HqNorm norm = {c.skip, c.gamma, c.summed, 1e-5f}, none = {nullptr, nullptr, nullptr, 0.0f};
    const int64_t k = sh[0].k, inter = sh[4].k;
    for (int l = 0; l < layers; l++) {
        HqSegments g = next(sh[l % 2 ? 1 : 0]);
        quantize(local, c.hidden, k, HQ_ACT_NONE, k, norm, c.scratch, s);
        launch_form(form, rw_of(g), c.scratch, k, g, c.qkv, s);
        g = next(sh[2]);
        quantize(local, c.attn, k, HQ_ACT_NONE, k, none, c.scratch, s);
        launch_form(form, rw_of(g), c.scratch, k, g, c.o, s);
        g = next(sh[3]);
        quantize(local, c.o, k, HQ_ACT_NONE, k, norm, c.scratch, s);
        launch_form(form, rw_of(g), c.scratch, k, g, c.gu, s);
        g = next(sh[l % 2 ? 5 : 4]);
        quantize(local, c.gu, 2 * inter, HQ_ACT_SILU, inter, none, c.scratch, s);
        launch_form(form, rw_of(g), c.scratch, inter, g, c.down, s);
    }
    const HqSegments g = next(sh[6]);
    quantize(local, c.down, k, HQ_ACT_NONE, k, norm, c.scratch, s);
    launch_form(form, rw_of(g), c.scratch, k, g, c.logits, s);
}

__global__ void fill_half_kernel(__half *p, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        p[i] = __float2half(0.01f * (float)((i * 7) % 13 - 6));
}

static void time_steps(const Shape *shapes, cudaStream_t s, uint8_t *pool, cudaEvent_t e0, cudaEvent_t e1) {
    Chain c;
    __half **bufs[] = {&c.hidden, &c.skip, &c.gamma, &c.summed, &c.attn, &c.qkv, &c.o, &c.gu, &c.down, &c.logits};
    for (__half **b : bufs) {
        CHECK(cudaMalloc(b, 160000 * 2));
        fill_half_kernel<<<64, 256, 0, s>>>(*b, 160000);
    }
    CHECK(cudaMalloc(&c.scratch, hq_q8_row_bytes(20000)));
    printf("a step's quantizers and GEMVs launched back to back, ms a step (5 steps; PDL %s):\n", hq_pdl_on() ? "on" : "off");
    const int forms[] = {FORM_LIBRARY, FORM_HALVES, FORM_DEEP4, FORM_TOGETHER2, FORM_TOGETHER4};
    for (int model = 0; model < 2; model++) {
        const Shape *sh = shapes + model * SHAPES_A_MODEL;
        const int layers = model ? 28 : 32;
        for (int f : forms)
            for (int local = 0; local < 2; local++) {
                int64_t at = 0;
                step(sh, layers, f, local, c, pool, at, s);
                CHECK(cudaEventRecord(e0, s));
                for (int i = 0; i < 5; i++) step(sh, layers, f, local, c, pool, at, s);
                CHECK(cudaEventRecord(e1, s));
                CHECK(cudaEventSynchronize(e1));
                CHECK(cudaGetLastError());
                float ms = 0.0f;
                CHECK(cudaEventElapsedTime(&ms, e0, e1));
                printf("  %-10s %-10s quantizer %-7s %7.3f ms   (%5.0f tok/s bound)\n", model ? "Qwen2.5-7B" : "8B",
                       FORM_NAMES[f], local ? "local" : "library", ms / 5, 5000.0 / ms);
            }
    }
}

int main(int argc, char **argv) {
    const Shape shapes[] = {
        {"8b.qkv", 4096, 3, {4096, 1024, 1024}, {HQ_Q4_K, HQ_Q4_K, HQ_Q6_K}, 16},
        {"8b.qkv4", 4096, 1, {6144}, {HQ_Q4_K}, 16},
        {"8b.o", 4096, 1, {4096}, {HQ_Q4_K}, 32},
        {"8b.gate_up", 4096, 1, {28672}, {HQ_Q4_K}, 32},
        {"8b.down6", 14336, 1, {4096}, {HQ_Q6_K}, 16},
        {"8b.down4", 14336, 1, {4096}, {HQ_Q4_K}, 16},
        {"8b.head", 4096, 1, {128256}, {HQ_Q6_K}, 1},
        {"qw.qkv", 3584, 3, {3584, 512, 512}, {HQ_Q4_K, HQ_Q4_K, HQ_Q6_K}, 14},
        {"qw.qkv4", 3584, 1, {4608}, {HQ_Q4_K}, 14},
        {"qw.o", 3584, 1, {3584}, {HQ_Q4_K}, 28},
        {"qw.gate_up", 3584, 1, {37888}, {HQ_Q4_K}, 28},
        {"qw.down6", 18944, 1, {3584}, {HQ_Q6_K}, 14},
        {"qw.down4", 18944, 1, {3584}, {HQ_Q4_K}, 14},
        {"qw.head", 3584, 1, {152064}, {HQ_Q6_K}, 1},
    };
    const int nshapes = sizeof(shapes) / sizeof(shapes[0]);
    const int reps = argc > 1 ? atoi(argv[1]) : 200;
    uint8_t *pool, *scratch;
    __half *y, *y_ref;
    CHECK(cudaMalloc(&pool, POOL));
    CHECK(cudaMalloc(&scratch, hq_q8_row_bytes(18944)));
    CHECK(cudaMalloc(&y, 152064 * 2));
    CHECK(cudaMalloc(&y_ref, 152064 * 2));
    fill_kernel<<<1024, 256>>>(pool, POOL, 12345u);
    cudaStream_t stream;
    CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    cudaEvent_t e0, e1;
    CHECK(cudaEventCreate(&e0));
    CHECK(cudaEventCreate(&e1));
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    printf("%s, %d SMs, PDL %s\n", prop.name, prop.multiProcessorCount, hq_pdl_on() ? "on" : "off");
    printf("%-12s %8s %6s", "shape", "MB", "rw");
    for (int f = 0; f < FORM_COUNT; f++) printf(" %16s", FORM_NAMES[f]);
    printf("   (µs and TB/s a launch)\n");
    double step_us[2][FORM_COUNT] = {};
    for (int si = 0; si < nshapes; si++) {
        const Shape &sh = shapes[si];
        const int rw = sh.n[0] + (sh.count > 1 ? sh.n[1] + sh.n[2] : 0) >= 8192 ? 2 : 1;
        fill_x_kernel<<<64, 256, 0, stream>>>(scratch, sh.k);
        /* Every slot of the pool this shape uses gets finite scales. */
        const int64_t span = (total_bytes(sh) + 4096 + 255) & ~255LL, slots = POOL / span;
        for (int64_t slot = 0; slot < slots && slot < reps; slot++) {
            const HqSegments segs = segments_at(sh, pool, slot * span);
            for (int s = 0; s < sh.count; s++)
                fix_scales_kernel<<<256, 256, 0, stream>>>((uint8_t *)segs.rows[s], sh.n[s] * (sh.k / 256), sh.type[s]);
        }
        CHECK(cudaStreamSynchronize(stream));
        const HqSegments segs0 = segments_at(sh, pool, 0);
        launch_form(FORM_LIBRARY, rw, scratch, sh.k, segs0, y_ref, stream);
        std::vector<__half> ref(segs0.total), got(segs0.total);
        CHECK(cudaMemcpyAsync(ref.data(), y_ref, segs0.total * 2, cudaMemcpyDeviceToHost, stream));
        CHECK(cudaStreamSynchronize(stream));
        const double mb = total_bytes(sh) / 1e6;
        printf("%-12s %8.1f %6d", sh.name, mb, rw);
        for (int f = 0; f < FORM_COUNT; f++) {
            CHECK(cudaMemsetAsync(y, 0, segs0.total * 2, stream));
            launch_form(f, rw, scratch, sh.k, segs0, y, stream);
            CHECK(cudaMemcpyAsync(got.data(), y, segs0.total * 2, cudaMemcpyDeviceToHost, stream));
            CHECK(cudaStreamSynchronize(stream));
            CHECK(cudaGetLastError());
            double worst = 0.0, scale = 1e-3;
            for (int64_t i = 0; i < segs0.total; i++) {
                const double a = __half2float(ref[i]), b = __half2float(got[i]);
                scale = fmax(scale, fabs(a));
                worst = fmax(worst, fabs(a - b));
            }
            for (int i = 0; i < 5; i++) launch_form(f, rw, scratch, sh.k, segments_at(sh, pool, offset_of(sh, i)), y, stream);
            CHECK(cudaEventRecord(e0, stream));
            for (int i = 0; i < reps; i++)
                launch_form(f, rw, scratch, sh.k, segments_at(sh, pool, offset_of(sh, i + 5)), y, stream);
            CHECK(cudaEventRecord(e1, stream));
            CHECK(cudaEventSynchronize(e1));
            float ms = 0.0f;
            CHECK(cudaEventElapsedTime(&ms, e0, e1));
            const double us = 1000.0 * ms / reps;
            printf(" %7.2f %5.2f%s", us, total_bytes(sh) / us / 1e6, worst > 2e-3 * scale ? "!" : " ");
            step_us[si / SHAPES_A_MODEL][f] += us * sh.per_step;
        }
        printf("\n");
    }
    printf("one step's GEMVs, launches timed alone (µs; 8B with down half Q6_K, half Q4_K; QKV half each):\n");
    for (int f = 0; f < FORM_COUNT; f++)
        printf("  %-10s 8B %7.0f   Qwen2.5-7B %7.0f\n", FORM_NAMES[f], step_us[0][f], step_us[1][f]);
    time_steps(shapes, stream, pool, e0, e1);
    return 0;
}
