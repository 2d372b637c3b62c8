/* MatMulQ's GEMV with 8-bit activations: x is quantized per 32 columns to int8 (a scale per 32, the codes' sum
 * per 16), and the GGUF's codes meet it in __dp4a, four products an instruction, as llama.cpp's MMVQ computes
 * (ggml-cuda/mmvq.cu, vecdotq.cuh). The fp32 GEMV of hearth_cuda_kernels.cuh decodes every weight to a float
 * (shift, mask, int→float, scale): ~10 instructions a weight, which on an H100 costs more than reading a Q4_K
 * layer's bytes does; here a weight costs ~1.2 (a word of codes is masked once, then one dp4a).
 *
 * A chunk is one block's worth of codes a lane reads at once: 32 weights for the 32-weight types, 64 (one of a
 * K-quant super-block's 64-column groups, or a quarter of Q6_K's) for the others, as G groups of 16 columns.
 * Each group shares a scale a and an offset b: its weights are a·v + b for the codes v, so
 *     Σ w·x = dx · (a · Σ v·xq + b · Σ xq)      (dx the 32 columns' activation scale)
 * and the sums of the activation codes per 16 columns come from the staging, once per block.
 *
 * One warp per output row (RW rows a warp, one after the other), its lanes taking the row's chunks in turn, so
 * every lane of a warp reads the same type (a launch of Q|K|V with V in Q6_K branches per warp, not per lane).
 * The functions marked HQ_FN also compile for the host: bench/cuda_blocks_check.py runs every lane of every row
 * on the CPU against the float64 product with the quantized activations.
 */
#ifndef HEARTH_CUDA_Q8_CUH
#define HEARTH_CUDA_Q8_CUH

#include "hearth_cuda_kernels.cuh"

/* Chunks a lane of a one-row GEMV has loading at once (bench/cuda_gemv_bench.cu times 2, 4 and 8). */
#ifndef HQ_Q8_DEPTH
#define HQ_Q8_DEPTH 2
#endif

HQ_FN int hq_dp4a(int a, int b, int c) {
#ifdef __CUDA_ARCH__
    return __dp4a(a, b, c);
#else
    for (int i = 0; i < 4; i++) c += (int)(int8_t)(a >> (8 * i)) * (int)(int8_t)(b >> (8 * i));
    return c;
#endif
}

/* Columns of the activations staged at a time: a multiple of 256 whose MT rows (1 byte a column, plus a float
 * scale per 32 and an int sum per 16: 1.375 bytes) fit the stage, or all of K rounded up where that is less. */
__host__ __device__ __forceinline__ int64_t hq_q8_tile(int mt, int64_t k_total) {
    const int64_t most = (int64_t)(HQ_STAGE_BYTES * 8 / 11 / mt) & ~255LL, whole = (k_total + 255) & ~255LL;
    return whole < most ? whole : most;
}

/* The staged activations of one row of x: codes [tile], scales [tile / 32], code sums [tile / 16]. */
struct HqXq {
    const int8_t *q;
    const float *d;
    const int *s;
};

template <int TYPE>
HQ_FN constexpr int hq_q8_chunk() { return TYPE >= HQ_Q4_K ? 64 : 32; }

/* A chunk's codes: v[4g .. 4g+3] are group g's 16 codes (one byte each), at columns col0 + goff[g] .. +15;
 * its weights are a[g]·v + b[g]. */
struct HqChunk {
    int v[16];
    float a[4], b[4];
    int goff[4];
    int col0;
};

HQ_FN int hq_spread4(uint32_t bits) {  /* 4 bits to bit 4 of each of a word's bytes (Q5_0, Q5_1's fifth bits) */
    return (int)(((bits & 1) << 4) | ((bits & 2) << 11) | ((bits & 4) << 18) | ((bits & 8) << 25));
}

/* Sixteen bytes at p (2-byte aligned: Q6_K's blocks of 210 bytes leave every other one 2 bytes off a word) as four
 * words, from the five aligned words around them and a funnel shift. The extra bytes read lie in the same aligned
 * words as the run's own, so inside the row's block or the word holding the row's first byte. */
HQ_FN void hq_run16(const uint8_t *p, uint32_t (&w)[4]) {
    const uint32_t *aligned = reinterpret_cast<const uint32_t *>((uintptr_t)p & ~(uintptr_t)3);
    const int shift = (int)((uintptr_t)p & 3) * 8;
    uint32_t r[5];
    HQ_UNROLL
    for (int i = 0; i < 5; i++) r[i] = aligned[i];
    HQ_UNROLL
    for (int i = 0; i < 4; i++) {
#ifdef __CUDA_ARCH__
        w[i] = __funnelshift_r(r[i], r[i + 1], shift);
#else
        w[i] = (uint32_t)((((uint64_t)r[i + 1] << 32) | r[i]) >> shift);
#endif
    }
}

/* Chunk c of a row: its codes, scales and offsets, read from the block as the format lays it out (ggml's
 * dequantize_row_*; each layout is checked against gguf-py by bench/cuda_blocks_check.py). */
template <int TYPE>
HQ_FN void hq_q8_load(const uint8_t *row, int c, HqChunk &k) {
    const uint32_t low = 0x0F0F0F0Fu;
    if (TYPE < HQ_Q4_K) {
        const uint8_t *blk = row + (size_t)c * hq_block_bytes(TYPE);
        const float d = hq_half(blk);
        k.col0 = c * 32;
        k.goff[0] = 0, k.goff[1] = 16;
        if (TYPE == HQ_Q8_0) {  /* qs[32] int8 at 2: columns in order */
            HQ_UNROLL
            for (int i = 0; i < 8; i++) k.v[i] = (int)hq_word<2>(blk + 2 + 4 * i);
            k.a[0] = k.a[1] = d;
            k.b[0] = k.b[1] = 0.0f;
            return;
        }
        /* qs[16]: low nibbles are columns 0..15, high nibbles 16..31; Q5's fifth bit j of qh is column j's. */
        const int qs = TYPE == HQ_Q4_0 ? 2 : TYPE == HQ_Q4_1 ? 4 : TYPE == HQ_Q5_0 ? 6 : 8;
        const uint32_t qh = TYPE == HQ_Q5_0 ? hq_word<2>(blk + 2) : TYPE == HQ_Q5_1 ? hq_word<4>(blk + 4) : 0;
        HQ_UNROLL
        for (int i = 0; i < 4; i++) {
            const uint32_t w = TYPE == HQ_Q4_1 || TYPE == HQ_Q5_1 ? hq_word<4>(blk + qs + 4 * i)
                                                                 : hq_word<2>(blk + qs + 4 * i);
            k.v[i] = (int)(w & low);
            k.v[4 + i] = (int)((w >> 4) & low);
            if (TYPE == HQ_Q5_0 || TYPE == HQ_Q5_1) {
                k.v[i] |= hq_spread4((qh >> (4 * i)) & 0xF);
                k.v[4 + i] |= hq_spread4((qh >> (16 + 4 * i)) & 0xF);
            }
        }
        const float b = TYPE == HQ_Q4_0 ? -8.0f * d : TYPE == HQ_Q5_0 ? -16.0f * d : hq_half(blk + 2);
        k.a[0] = k.a[1] = d;
        k.b[0] = k.b[1] = b;
        return;
    }
    const int sb = c >> 2;
    const uint8_t *blk = row + (size_t)sb * hq_block_bytes(TYPE);
    if (TYPE == HQ_Q6_K) {
        /* Half h (128 columns: ql[64], qh[32], 8 scales) of the super-block, columns t·16 .. +15 of each of its
         * four 32-column quarters: ql's low nibbles (quarters 0, 1), high nibbles (2, 3), qh's 2-bit pairs. Each
         * 16-byte run by aligned words (hq_run16): 20 loads a chunk where 16-bit halves took 29. */
        const int h = (c >> 1) & 1, t = c & 1;
        uint32_t a[4], b[4], hb[4];
        hq_run16(blk + 64 * h + 16 * t, a);
        hq_run16(blk + 64 * h + 32 + 16 * t, b);
        hq_run16(blk + 128 + 32 * h + 16 * t, hb);
        const int8_t *sc = (const int8_t *)(blk + 192) + 8 * h + t;
        const float d = hq_half(blk + 208);
        k.col0 = sb * 256 + 128 * h;
        HQ_UNROLL
        for (int i = 0; i < 4; i++) {
            k.v[i] = (int)((a[i] & low) | ((hb[i] << 4) & 0x30303030u));
            k.v[4 + i] = (int)((b[i] & low) | ((hb[i] << 2) & 0x30303030u));
            k.v[8 + i] = (int)(((a[i] >> 4) & low) | (hb[i] & 0x30303030u));
            k.v[12 + i] = (int)(((b[i] >> 4) & low) | ((hb[i] >> 2) & 0x30303030u));
        }
        HQ_UNROLL
        for (int q = 0; q < 4; q++) {
            k.goff[q] = 32 * q + 16 * t;
            k.a[q] = d * (float)sc[2 * q];
            k.b[q] = -32.0f * k.a[q];
        }
        return;
    }
    /* Q4_K / Q5_K: group g's 32 bytes of qs: low nibbles are columns 64g .. +31 (sub-block 2g), high nibbles
     * 64g+32 .. +63 (2g+1); Q5_K's fifth bits are bits 2g and 2g+1 of qh[0..31]. Blocks of 144 and 176 bytes keep
     * qs and qh 16-byte aligned in rows that start so (launch_gemv_q8 checks). */
    const int g = c & 3;
    const float2 dm = __half22float2(*reinterpret_cast<const __half2 *>(blk));
    const uint32_t *s3 = reinterpret_cast<const uint32_t *>(blk + 4);  /* 12 bytes of 6-bit scales and mins */
    const uint32_t s0 = s3[0], s1 = s3[1], s2 = s3[2];
    float sc[2], mn[2];
    HQ_UNROLL
    for (int i = 0; i < 2; i++) {
        const int j = 2 * g + i;
        if (j < 4) {
            sc[i] = (float)((s0 >> (8 * j)) & 63);
            mn[i] = (float)((s1 >> (8 * j)) & 63);
        } else {
            const int s = 8 * (j - 4);
            sc[i] = (float)(((s2 >> s) & 0xF) | (((s0 >> (s + 6)) & 3) << 4));
            mn[i] = (float)(((s2 >> (s + 4)) & 0xF) | (((s1 >> (s + 6)) & 3) << 4));
        }
    }
    const uint4 *qs = reinterpret_cast<const uint4 *>(blk + (TYPE == HQ_Q4_K ? 16 : 48) + 32 * g);
    const uint4 q0 = qs[0], q1 = qs[1];
    const uint32_t w[8] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w};
    uint32_t hb[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (TYPE == HQ_Q5_K) {
        const uint4 *qh = reinterpret_cast<const uint4 *>(blk + 16);
        const uint4 h0 = qh[0], h1 = qh[1];
        hb[0] = h0.x, hb[1] = h0.y, hb[2] = h0.z, hb[3] = h0.w, hb[4] = h1.x, hb[5] = h1.y, hb[6] = h1.z, hb[7] = h1.w;
    }
    HQ_UNROLL
    for (int i = 0; i < 8; i++) {
        k.v[i] = (int)((w[i] & low) | (((hb[i] >> (2 * g)) & 0x01010101u) << 4));
        k.v[8 + i] = (int)(((w[i] >> 4) & low) | (((hb[i] >> (2 * g + 1)) & 0x01010101u) << 4));
    }
    k.col0 = sb * 256 + 64 * g;
    HQ_UNROLL
    for (int q = 0; q < 4; q++) {
        k.goff[q] = 16 * q;
        k.a[q] = dm.x * sc[q >> 1];
        k.b[q] = -dm.y * mn[q >> 1];
    }
}

/* Lane ``lane`` of ``lanes``'s share of one row against the MT staged rows of x: chunks lane, lane + lanes, … of
 * the tile [k0, k0 + kt). Each chunk's codes are read once for all MT rows. */
template <int TYPE, int MT>
HQ_FN void hq_q8_row(const uint8_t *row, int64_t k0, int kt, const HqXq (&x)[MT], float (&acc)[MT], int lane,
                     int lanes) {
    constexpr int CW = hq_q8_chunk<TYPE>(), G = CW / 16;
    const int c1 = (int)((k0 + kt) / CW);
    constexpr int depth = MT == 1 ? HQ_Q8_DEPTH : 1;
    /* One row of x: two chunks' loads in flight before either's dots; more rows already give a lane work enough
     * between loads (and two chunks of them would not fit the registers). */
#ifdef __CUDA_ARCH__
#pragma unroll(depth)
#endif
    for (int c = (int)(k0 / CW) + lane; c < c1; c += lanes) {
        HqChunk k;
        hq_q8_load<TYPE>(row, c, k);
        const int base = (int)(k.col0 - k0);
        HQ_UNROLL
        for (int m = 0; m < MT; m++) {
            float sum = 0.0f;
            HQ_UNROLL
            for (int g = 0; g < G; g++) {
                const int col = base + k.goff[g];
                const int4 xw = *reinterpret_cast<const int4 *>(x[m].q + col);
                int s = hq_dp4a(k.v[4 * g], xw.x, 0);
                s = hq_dp4a(k.v[4 * g + 1], xw.y, s);
                s = hq_dp4a(k.v[4 * g + 2], xw.z, s);
                s = hq_dp4a(k.v[4 * g + 3], xw.w, s);
                sum += x[m].d[col >> 5] * (k.a[g] * (float)s + k.b[g] * (float)x[m].s[col >> 4]);
            }
            acc[m] += sum;
        }
    }
}

template <int MT>
HQ_FN void hq_q8_dispatch(int type, const uint8_t *row, int64_t k0, int kt, const HqXq (&x)[MT], float (&acc)[MT],
                          int lane, int lanes) {
    switch (type) {
    case HQ_Q4_0: hq_q8_row<HQ_Q4_0, MT>(row, k0, kt, x, acc, lane, lanes); break;
    case HQ_Q4_1: hq_q8_row<HQ_Q4_1, MT>(row, k0, kt, x, acc, lane, lanes); break;
    case HQ_Q5_0: hq_q8_row<HQ_Q5_0, MT>(row, k0, kt, x, acc, lane, lanes); break;
    case HQ_Q5_1: hq_q8_row<HQ_Q5_1, MT>(row, k0, kt, x, acc, lane, lanes); break;
    case HQ_Q8_0: hq_q8_row<HQ_Q8_0, MT>(row, k0, kt, x, acc, lane, lanes); break;
    case HQ_Q4_K: hq_q8_row<HQ_Q4_K, MT>(row, k0, kt, x, acc, lane, lanes); break;
    case HQ_Q5_K: hq_q8_row<HQ_Q5_K, MT>(row, k0, kt, x, acc, lane, lanes); break;
    case HQ_Q6_K: hq_q8_row<HQ_Q6_K, MT>(row, k0, kt, x, acc, lane, lanes); break;
    default: break;
    }
}

/* RW rows of one type against one row of x (all of K): chunk c of every row is loaded before any is dotted, and x's
 * codes and scales for its columns are read once for all RW rows. A lane's x reads (16 bytes of codes a group, with
 * its scale and sum) are twice its weight bytes at 4 bits, and they go through the same L1 as the weights: sharing
 * them over rows is what bench/cuda_gemv_bench.cu's `together` forms time against one row after another. */
template <int TYPE, int RW>
HQ_FN void hq_q8_rows(const uint8_t *const (&row)[RW], int kt, const HqXq &x, float (&acc)[RW], int lane, int lanes) {
    constexpr int CW = hq_q8_chunk<TYPE>(), G = CW / 16;
    const int c1 = kt / CW;
    for (int c = lane; c < c1; c += lanes) {
        HqChunk k[RW];
        HQ_UNROLL
        for (int j = 0; j < RW; j++) hq_q8_load<TYPE>(row[j], c, k[j]);
        HQ_UNROLL
        for (int g = 0; g < G; g++) {
            const int col = k[0].col0 + k[0].goff[g];
            const int4 xw = *reinterpret_cast<const int4 *>(x.q + col);
            const float xd = x.d[col >> 5], xs = (float)x.s[col >> 4];
            HQ_UNROLL
            for (int j = 0; j < RW; j++) {
                int s = hq_dp4a(k[j].v[4 * g], xw.x, 0);
                s = hq_dp4a(k[j].v[4 * g + 1], xw.y, s);
                s = hq_dp4a(k[j].v[4 * g + 2], xw.z, s);
                s = hq_dp4a(k[j].v[4 * g + 3], xw.w, s);
                acc[j] += xd * (k[j].a[g] * (float)s + k[j].b[g] * xs);
            }
        }
    }
}

template <int RW>
HQ_FN void hq_q8_rows_dispatch(int type, const uint8_t *const (&row)[RW], int kt, const HqXq &x, float (&acc)[RW],
                               int lane, int lanes) {
    switch (type) {
    case HQ_Q4_0: hq_q8_rows<HQ_Q4_0, RW>(row, kt, x, acc, lane, lanes); break;
    case HQ_Q4_1: hq_q8_rows<HQ_Q4_1, RW>(row, kt, x, acc, lane, lanes); break;
    case HQ_Q5_0: hq_q8_rows<HQ_Q5_0, RW>(row, kt, x, acc, lane, lanes); break;
    case HQ_Q5_1: hq_q8_rows<HQ_Q5_1, RW>(row, kt, x, acc, lane, lanes); break;
    case HQ_Q8_0: hq_q8_rows<HQ_Q8_0, RW>(row, kt, x, acc, lane, lanes); break;
    case HQ_Q4_K: hq_q8_rows<HQ_Q4_K, RW>(row, kt, x, acc, lane, lanes); break;
    case HQ_Q5_K: hq_q8_rows<HQ_Q5_K, RW>(row, kt, x, acc, lane, lanes); break;
    case HQ_Q6_K: hq_q8_rows<HQ_Q6_K, RW>(row, kt, x, acc, lane, lanes); break;
    default: break;
    }
}

/* Eight activations quantized with their 32 columns' largest magnitude: codes round(v·127/amax) as two words;
 * returns their sum. The scale is amax/127 (0 where the 32 columns are all 0). */
HQ_FN int hq_q8_pack8(const float v[8], float amax, int *lo, int *hi) {
    const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    int sum = 0;
    uint32_t words[2] = {0, 0};
    for (int j = 0; j < 8; j++) {
        int q = (int)rintf(v[j] * inv);
        q = q > 127 ? 127 : q < -127 ? -127 : q;
        sum += q;
        words[j >> 2] |= (uint32_t)(q & 0xFF) << (8 * (j & 3));
    }
    *lo = (int)words[0], *hi = (int)words[1];
    return sum;
}

#ifdef __CUDACC__
/* Columns k .. k+7 of one row of x as the matmul reads them (RMSNorm(x + skip)·gamma with the row's scale where
 * gamma is set; act(gate)·up where act is; else x), quantized with the rest of their group of 32, which three
 * neighbouring lanes hold (all four must call this; on: the columns exist), into the codes at xq, the sums of
 * 16 at xs and the group's scale at xd (the three already offset to these columns' places). */
__device__ __forceinline__ void hq_q8_quantize8(const __half *row, const __half *skip, const __half *gamma,
                                                float norm_scale, int act, int64_t k_total, int64_t k, bool on,
                                                int8_t *xq, float *xd, int *xs) {
    float v[8] = {0, 0, 0, 0, 0, 0, 0, 0}, amax = 0.0f;
    if (on) {  /* eight columns a load (16-byte aligned: k is a multiple of 8, K of 32) */
        float w[8];
        hq_load8(row + k, v);
        if (gamma) {
            if (skip) {
                hq_load8(skip + k, w);
                for (int j = 0; j < 8; j++) v[j] += w[j];
            }
            hq_load8(gamma + k, w);
            for (int j = 0; j < 8; j++) v[j] = v[j] * norm_scale * w[j];
        } else if (act != HQ_ACT_NONE) {
            hq_load8(row + k_total + k, w);  /* up, beside the gate */
            for (int j = 0; j < 8; j++) v[j] = hq_act(act, v[j]) * w[j];
        }
    }
    for (int j = 0; j < 8; j++) amax = fmaxf(amax, fabsf(v[j]));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
    int lo, hi;
    int sum = hq_q8_pack8(v, amax, &lo, &hi);
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    if (on) {
        *reinterpret_cast<int2 *>(xq) = make_int2(lo, hi);
        if ((threadIdx.x & 1) == 0) *xs = sum;
        if ((threadIdx.x & 3) == 0) *xd = amax / 127.0f;
    }
}

/* Stages columns [k0, k0 + kt) of x's rows (act(gate)·up where act is set; RMSNorm(x + skip)·gamma where norm
 * has gamma: then MT is 1 and the tile holds all of K) as int8 codes. Each thread takes 8 columns, four
 * neighbouring lanes one group of 32 (kt is a multiple of 32, so a group is never split). */
template <int MT>
__device__ __forceinline__ void hq_q8_stage(const __half *x, int64_t x_stride, int act, int rows, int64_t k_total,
                                            int64_t k0, int kt, int tile, const HqNorm &norm, float norm_scale,
                                            int8_t *xq, float *xd, int *xs) {
    for (int m = 0; m < MT; m++) {
        for (int base = 0; base < kt; base += HQ_THREADS * 8) {
            const int col = base + 8 * (int)threadIdx.x;
            hq_q8_quantize8(x + (int64_t)m * x_stride, norm.skip, norm.gamma, norm_scale, act, k_total, k0 + col,
                            col < kt && m < rows, xq + m * tile + col, xd + m * (tile / 32) + col / 32,
                            xs + m * (tile / 16) + col / 16);
        }
    }
}

#define HQ_Q8_SLICE (HQ_THREADS * 8)  /* columns a block of q8_quantize_kernel quantizes */

/* Bytes of one row's quantized activations in MatMulQ's scratch output: K codes, K/32 float scales, K/16 int sums
 * (stored as three arrays over all rows: codes [rows, K], scales [rows, K/32], sums [rows, K/16]). */
__host__ __device__ __forceinline__ int64_t hq_q8_row_bytes(int64_t k) { return k + k / 8 + k / 4; }

/* Row blockIdx.y of x quantized once for every GEMV block to read (the llama.cpp way: quantize_q8_1, then MMVQ),
 * with the act or the norm the staging above would apply; block x takes columns [x, x + 1) · HQ_Q8_SLICE (each
 * block finds the row's norm scale itself: one block a row took 10 µs of the 8B's 4.4 ms step, 129 times, H100). */
__global__ void __launch_bounds__(HQ_THREADS) q8_quantize_kernel(const __half *__restrict__ x, int64_t x_stride,
                                                                 int act, int64_t k_total, HqNorm norm, int rows,
                                                                 uint8_t *__restrict__ scratch) {
    hq_pdl_wait();
    hq_pdl_release();
    const int m = blockIdx.y;
    int8_t *xq = reinterpret_cast<int8_t *>(scratch) + (int64_t)m * k_total;
    float *xd = reinterpret_cast<float *>(scratch + rows * k_total) + (int64_t)m * (k_total / 32);
    int *xs = reinterpret_cast<int *>(scratch + rows * k_total + rows * (k_total / 8)) + (int64_t)m * (k_total / 16);
    const __half *row = x + (int64_t)m * x_stride;
    const __half *skip = norm.skip ? norm.skip + (int64_t)m * k_total : nullptr;
    __half *summed = norm.summed && blockIdx.x == 0 ? norm.summed + (int64_t)m * k_total : nullptr;
    const float scale = norm.gamma ? hq_norm_scale(row, skip, summed, k_total, norm.eps) : 1.0f;
    const int64_t col = (int64_t)blockIdx.x * HQ_Q8_SLICE + 8 * (int64_t)threadIdx.x;
    hq_q8_quantize8(row, skip, norm.gamma, scale, act, k_total, col, col < k_total, xq + col, xd + col / 32,
                    xs + col / 16);
}

/* Rows r0 .. r0 + RW - 1 (those that exist: row and type from hq_locate) into L2 by a warp's lanes, before the
 * GEMV waits for x (hq_pdl_wait). */
template <int RW>
__device__ __forceinline__ void hq_q8_prefetch(const HqSegments &segs, int64_t r0, const uint8_t *const (&row)[RW],
                                               const int (&type)[RW], int64_t k_total, int lane) {
    HQ_UNROLL
    for (int j = 0; j < RW; j++)
        if (r0 + j < segs.total)
            hq_prefetch_l2(row[j], k_total / hq_block_weights(type[j]) * hq_block_bytes(type[j]), lane, 32);
}

/* A warp's sums for its RW output rows r0 .. against MT rows of x, added over its lanes; lane j·MT + m writes
 * y[m, r0 + j] for the rows that exist (m < valid, r0 + j < N). */
template <int MT, int RW>
__device__ __forceinline__ void hq_warp_write(const float (&acc)[RW][MT], int lane, int valid, int64_t r0,
                                              int64_t n_total, __half *y) {
    HQ_UNROLL
    for (int j = 0; j < RW; j++)
        HQ_UNROLL
        for (int m = 0; m < MT; m++) {
            const float v = hq_warp_sum(acc[j][m]);
            if (lane == j * MT + m && m < valid && r0 + j < n_total) y[(int64_t)m * n_total + r0 + j] = __float2half(v);
        }
}

/* The GEMV over x quantized by q8_quantize_kernel: no staging and no barrier, so a warp's weight loads start at
 * once (the staged kernel below spent most of a [4096 × 4096] layer quantizing x in every block before its first
 * load: 10.6 µs a Q4_K layer against ~3 µs of bytes, bench/cuda_layer_forms.py on an H100). Warp w of block b
 * takes output rows (8b + w)·RW .. +RW-1 against rows m0 .. m0+MT-1 of the scratch; together (one row of x, rows
 * of one type): all RW at once (hq_q8_rows), else one after the other. */
template <int MT, int RW, bool TOGETHER>
__device__ __forceinline__ void hq_gemv_q8x(const uint8_t *__restrict__ scratch, int rows, int m0, int mt,
                                            int64_t k_total, const HqSegments &segs, __half *__restrict__ y) {
    const int8_t *xq = reinterpret_cast<const int8_t *>(scratch);
    const float *xd = reinterpret_cast<const float *>(scratch + rows * k_total);
    const int *xs = reinterpret_cast<const int *>(scratch + rows * k_total + rows * (k_total / 8));
    HqXq x[MT];
    HQ_UNROLL
    for (int m = 0; m < MT; m++) {
        const int r = m0 + (m < mt ? m : 0);  /* a row past mt repeats the first; its sums are never written */
        x[m] = {xq + (int64_t)r * k_total, xd + (int64_t)r * (k_total / 32), xs + (int64_t)r * (k_total / 16)};
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t n_total = segs.total, stride = (int64_t)gridDim.x * HQ_WARPS * RW;
    {
        const int64_t first = ((int64_t)blockIdx.x * HQ_WARPS + warp) * RW;
        const uint8_t *row[RW];
        int type[RW];
        hq_locate<RW>(segs, first, row, type);
        hq_q8_prefetch<RW>(segs, first, row, type, k_total, lane);
    }
    hq_pdl_wait();
    hq_pdl_release();
    /* A grid of one block per 8·RW rows takes this loop once; a smaller one (HEARTH_CUDA_GEMV_BLOCKS_PER_SM, to be
     * timed against it) walks the rows with fewer, longer-lived warps. */
    for (int64_t r0 = ((int64_t)blockIdx.x * HQ_WARPS + warp) * RW; r0 < n_total; r0 += stride) {
        const uint8_t *row[RW];
        int type[RW];
        const bool uniform = hq_locate<RW>(segs, r0, row, type);
        float acc[RW][MT];
        if (TOGETHER && MT == 1 && RW > 1 && uniform && r0 + RW <= n_total) {
            float together[RW];
            HQ_UNROLL
            for (int j = 0; j < RW; j++) together[j] = 0.0f;
            hq_q8_rows_dispatch<RW>(type[0], row, (int)k_total, x[0], together, lane, 32);
            HQ_UNROLL
            for (int j = 0; j < RW; j++) acc[j][0] = together[j];
        } else {
            HQ_UNROLL
            for (int j = 0; j < RW; j++) {
                HQ_UNROLL
                for (int m = 0; m < MT; m++) acc[j][m] = 0.0f;
                if (r0 + j < n_total) hq_q8_dispatch<MT>(type[j], row[j], 0, (int)k_total, x, acc[j], lane, 32);
            }
        }
        hq_warp_write<MT, RW>(acc, lane, mt, r0, n_total, y + (int64_t)m0 * n_total);
    }
}

template <int MT, int RW>
__global__ void __launch_bounds__(HQ_THREADS) gemv_q8x_kernel(const uint8_t *__restrict__ scratch, int rows, int m0,
                                                              int mt, int64_t k_total, HqSegments segs,
                                                              __half *__restrict__ y) {
    hq_gemv_q8x<MT, RW, false>(scratch, rows, m0, mt, k_total, segs, y);
}

/* The same for one row of x, a warp's RW rows read together where they are of one type (HEARTH_CUDA_GEMV_ROWS):
 * its own kernel, so the registers it holds (RW chunks) do not spill the others'. */
template <int RW>
__global__ void __launch_bounds__(HQ_THREADS, RW == 4 ? 2 : 3) gemv_q8x_rows_kernel(
    const uint8_t *__restrict__ scratch, int rows, int m0, int mt, int64_t k_total, HqSegments segs,
    __half *__restrict__ y) {
    hq_gemv_q8x<1, RW, true>(scratch, rows, m0, mt, k_total, segs, y);
}

/* y = act(x)·Wᵀ for rows 0 .. MT-1 of x (fewer when rows < MT): warp w of block b takes output rows
 * (8b + w)·RW .. +RW-1. Shared memory: hq_q8_tile(MT, K) columns of MT rows (launch_gemv_q8 sizes it). */
template <int MT, int RW>
__global__ void __launch_bounds__(HQ_THREADS) gemv_q8_kernel(const __half *__restrict__ x, int64_t x_stride, int act,
                                                             int rows, int64_t k_total, HqSegments segs, HqNorm norm,
                                                             __half *__restrict__ y) {
    extern __shared__ int4 hq_q8_stage_mem[];
    const int tile = (int)hq_q8_tile(MT, k_total);
    int8_t *xq = reinterpret_cast<int8_t *>(hq_q8_stage_mem);
    float *xd = reinterpret_cast<float *>(xq + MT * tile);
    int *xs = reinterpret_cast<int *>(xd + MT * (tile / 32));
    HqXq staged[MT];
    HQ_UNROLL
    for (int m = 0; m < MT; m++) staged[m] = {xq + m * tile, xd + m * (tile / 32), xs + m * (tile / 16)};
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t n_total = segs.total, r0 = ((int64_t)blockIdx.x * HQ_WARPS + warp) * RW;
    const uint8_t *row[RW];
    int type[RW];
    hq_locate<RW>(segs, r0, row, type);
    hq_q8_prefetch<RW>(segs, r0, row, type, k_total, lane);
    hq_pdl_wait();
    hq_pdl_release();
    float acc[RW][MT];
    HQ_UNROLL
    for (int j = 0; j < RW; j++)
        HQ_UNROLL
        for (int m = 0; m < MT; m++) acc[j][m] = 0.0f;
    const float norm_scale =
        norm.gamma ? hq_norm_scale(x, norm.skip, blockIdx.x == 0 ? norm.summed : nullptr, k_total, norm.eps) : 1.0f;
    for (int64_t k0 = 0; k0 < k_total; k0 += tile) {
        const int kt = (int)min((int64_t)tile, k_total - k0);
        __syncthreads();  /* the previous tile is read */
        hq_q8_stage<MT>(x, x_stride, act, rows, k_total, k0, kt, tile, norm, norm_scale, xq, xd, xs);
        __syncthreads();
        HQ_UNROLL
        for (int j = 0; j < RW; j++)
            if (r0 + j < n_total) hq_q8_dispatch<MT>(type[j], row[j], k0, kt, staged, acc[j], lane, 32);
    }
    hq_warp_write<MT, RW>(acc, lane, rows, r0, n_total, y);
}
#endif

#endif
