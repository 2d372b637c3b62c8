/* The GGUF's block formats, decoded eight weights at a time, for Hearth's CUDA kernels (hearth_cuda.cu).
 *
 * A row of K weights is K/8 "chunks" of eight. decode8 turns chunk c of a row into its eight weights w[0..7]
 * and says where they sit: four pairs of neighbours, pair p at columns pos + off[p] and pos + off[p] + 1, so a
 * kernel reads the matching activations as four half2 loads. Consecutive chunks read consecutive bytes of the
 * row wherever the format allows (32 lanes of a warp read the 128 quant bytes of a Q4_K super-block in one
 * sweep), and every weight comes out exactly as the format defines it: scale·q + offset in fp32, as ggml's
 * dequantize_row_* and the CPU kernels (hearth_unpack.h) compute it. The functions are __host__ too, so the
 * layouts are checked on the CPU against gguf-py's dequantize (bench/cuda_blocks_check.py).
 */
#ifndef HEARTH_CUDA_BLOCKS_CUH
#define HEARTH_CUDA_BLOCKS_CUH

#include <cuda_fp16.h>
#include <stdint.h>

#define HQ_FN __host__ __device__ __forceinline__
#ifdef __CUDA_ARCH__
#define HQ_UNROLL _Pragma("unroll")
#else
#define HQ_UNROLL /* the host compiler (bench/cuda_blocks_check.py) unrolls as it sees fit */
#endif

/* GGML type ids (gguf.GGMLQuantizationType), the ones the CUDA kernels read. */
enum { HQ_Q4_0 = 2, HQ_Q4_1 = 3, HQ_Q5_0 = 6, HQ_Q5_1 = 7, HQ_Q8_0 = 8, HQ_Q4_K = 12, HQ_Q5_K = 13, HQ_Q6_K = 14 };

/* Bytes of one block and weights in it; 0 for a type the kernels do not read. */
HQ_FN int hq_block_bytes(int type) {
    switch (type) {
    case HQ_Q4_0: return 18;
    case HQ_Q4_1: return 20;
    case HQ_Q5_0: return 22;
    case HQ_Q5_1: return 24;
    case HQ_Q8_0: return 34;
    case HQ_Q4_K: return 144;
    case HQ_Q5_K: return 176;
    case HQ_Q6_K: return 210;
    default: return 0;
    }
}

HQ_FN int hq_block_weights(int type) { return type >= HQ_Q4_K ? 256 : 32; }

HQ_FN float hq_half(const uint8_t *p) {  /* every block's size and fp16 fields are even: 2-byte aligned */
    return __half2float(*reinterpret_cast<const __half *>(p));
}

HQ_FN uint32_t hq_u16(const uint8_t *p) { return *reinterpret_cast<const uint16_t *>(p); }

HQ_FN uint32_t hq_u32(const uint8_t *p) {  /* unaligned little-endian 32-bit read */
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

/* Four quant bytes as one word: a single 32-bit load where the format keeps them 4-byte aligned (blocks of 20,
 * 24, 144 and 176 bytes, in rows that start 4-byte aligned as ONNX Runtime's buffers do), two 16-bit loads where
 * it keeps them 2-byte aligned (18, 22 bytes). One wide load instead of four byte loads is most of a GEMV's
 * instructions saved on a bandwidth-bound model. */
template <int ALIGN>
HQ_FN uint32_t hq_word(const uint8_t *p) {
    if (ALIGN == 4) return *reinterpret_cast<const uint32_t *>(p);
    const uint16_t *h = reinterpret_cast<const uint16_t *>(p);
    return (uint32_t)h[0] | ((uint32_t)h[1] << 16);
}

/* A K-quant's 6-bit scale and min of sub-block j (0..7) from its 12 packed bytes. */
HQ_FN void hq_scale_min_k4(int j, const uint8_t *q, float *sc, float *m) {
    if (j < 4) {
        *sc = (float)(q[j] & 63);
        *m = (float)(q[j + 4] & 63);
    } else {
        *sc = (float)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (float)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

/* Chunk c of a row of this type: its weights w[8] and the pairs' columns (pos + off[p], +1). */
HQ_FN void hq_decode8(int type, const uint8_t *row, int c, float w[8], int *pos, int off[4]) {
    if (type < HQ_Q4_K) {  /* blocks of 32: four chunks each */
        const int b = c >> 2, s = c & 3;
        const uint8_t *blk = row + (size_t)b * hq_block_bytes(type);
        *pos = b * 32;
        const float d = hq_half(blk);
        if (type == HQ_Q8_0) {  /* qs[8s .. 8s+7] are weights 8s .. 8s+7 */
            const uint32_t lo = hq_word<2>(blk + 2 + 8 * s), hi = hq_word<2>(blk + 6 + 8 * s);
            for (int i = 0; i < 4; i++) {
                w[i] = d * (float)(int8_t)(lo >> (8 * i));
                w[4 + i] = d * (float)(int8_t)(hi >> (8 * i));
            }
            for (int p = 0; p < 4; p++) off[p] = 8 * s + 2 * p;
            return;
        }
        /* Bytes qs[4s .. 4s+3]: low nibbles are weights 4s .. 4s+3, high nibbles 16+4s .. 16+4s+3. */
        const uint8_t *qs = blk + (type == HQ_Q4_0 ? 2 : type == HQ_Q4_1 ? 4 : type == HQ_Q5_0 ? 6 : 8) + 4 * s;
        float scale = d, offset;
        uint32_t high = 0;
        if (type == HQ_Q4_0) {
            offset = -8.0f * d;
        } else if (type == HQ_Q4_1) {
            offset = hq_half(blk + 2);
        } else if (type == HQ_Q5_0) {
            offset = -16.0f * d;
            high = hq_u32(blk + 2);
        } else {
            offset = hq_half(blk + 2);
            high = hq_u32(blk + 4);
        }
        const int fifth = type == HQ_Q5_0 || type == HQ_Q5_1;
        const uint32_t word = type == HQ_Q4_1 || type == HQ_Q5_1 ? hq_word<4>(qs) : hq_word<2>(qs);
        for (int i = 0; i < 4; i++) {
            const int j = 4 * s + i;
            int lo = (word >> (8 * i)) & 0xF, hi = (word >> (8 * i + 4)) & 0xF;
            if (fifth) {
                lo |= (int)((high >> j) & 1) << 4;
                hi |= (int)((high >> (j + 16)) & 1) << 4;
            }
            w[i] = scale * (float)lo + offset;
            w[4 + i] = scale * (float)hi + offset;
        }
        off[0] = 4 * s, off[1] = 4 * s + 2, off[2] = 16 + 4 * s, off[3] = 18 + 4 * s;
        return;
    }
    const int sb = c >> 5, l = c & 31;  /* super-blocks of 256: 32 chunks each */
    const uint8_t *blk = row + (size_t)sb * hq_block_bytes(type);
    *pos = sb * 256;
    if (type == HQ_Q6_K) {
        /* Two halves of 128 (ql[64], qh[32], 8 scales each). Chunk t of a half holds columns 2t, 2t+1 of each
         * of its four 32-column quarters: ql's low nibbles (quarters 0, 1), high nibbles (2, 3), qh's 2-bit pairs. */
        const int h = l >> 4, t = l & 15;
        const uint8_t *ql = blk + 64 * h, *qh = blk + 128 + 32 * h;
        const int8_t *sc = (const int8_t *)(blk + 192) + 8 * h;
        const float d = hq_half(blk + 208);
        const int is = (2 * t) >> 4;
        const float s1 = d * (float)sc[is + 0], s2 = d * (float)sc[is + 2], s3 = d * (float)sc[is + 4],
                    s4 = d * (float)sc[is + 6];
        const uint32_t a = hq_u16(ql + 2 * t), b = hq_u16(ql + 2 * t + 32), bits = hq_u16(qh + 2 * t);
        for (int i = 0; i < 2; i++) {
            const uint32_t la = (a >> (8 * i)) & 0xFF, lb = (b >> (8 * i)) & 0xFF, h = (bits >> (8 * i)) & 0xFF;
            w[0 + i] = s1 * (float)((int)((la & 0xF) | ((h & 3) << 4)) - 32);
            w[2 + i] = s2 * (float)((int)((lb & 0xF) | (((h >> 2) & 3) << 4)) - 32);
            w[4 + i] = s3 * (float)((int)((la >> 4) | (((h >> 4) & 3) << 4)) - 32);
            w[6 + i] = s4 * (float)((int)((lb >> 4) | (((h >> 6) & 3) << 4)) - 32);
        }
        for (int p = 0; p < 4; p++) off[p] = 128 * h + 32 * p + 2 * t;
        return;
    }
    /* Q4_K / Q5_K: d, dmin, 12 scale bytes, (Q5_K: qh[32]), qs[128]. Lane l reads qs[4l .. 4l+3]: in 64-column
     * group g = l/8 at column p = 4l mod 32, low nibbles are columns 64g+p.., high nibbles 64g+32+p.. */
    const float2 dm = __half22float2(*reinterpret_cast<const __half2 *>(blk));  /* d, dmin */
    const float d = dm.x, dmin = dm.y;
    const uint8_t *scales = blk + 4;
    const uint32_t word = hq_word<4>(blk + (type == HQ_Q4_K ? 16 : 48) + 4 * l);
    const int g = l >> 3, p = (4 * l) & 31;
    float sc1, m1, sc2, m2;
    hq_scale_min_k4(2 * g, scales, &sc1, &m1);
    hq_scale_min_k4(2 * g + 1, scales, &sc2, &m2);
    const float a1 = d * sc1, b1 = -dmin * m1, a2 = d * sc2, b2 = -dmin * m2;
    const uint32_t high = type == HQ_Q5_K ? hq_word<4>(blk + 16 + p) : 0;
    for (int i = 0; i < 4; i++) {
        int lo = (word >> (8 * i)) & 0xF, hi = (word >> (8 * i + 4)) & 0xF;
        if (type == HQ_Q5_K) {
            const uint32_t bits = high >> (8 * i);
            lo += (bits >> (2 * g)) & 1 ? 16 : 0;
            hi += (bits >> (2 * g + 1)) & 1 ? 16 : 0;
        }
        w[i] = a1 * (float)lo + b1;
        w[4 + i] = a2 * (float)hi + b2;
    }
    off[0] = 64 * g + p, off[1] = 64 * g + p + 2, off[2] = 64 * g + 32 + p, off[3] = 64 * g + 34 + p;
}

#endif
