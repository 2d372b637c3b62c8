/* GGUF weight blocks, unpacked: the one place Hearth's kernels read ggml's block layouts.
 *
 * Every kernel (MatMulQ's per-ISA TUs, GatherQ) includes this header, so everything here is static
 * inline, portable C11, written as fixed-trip loops over bytes that the compiler vectorizes for
 * whatever -m flags the including TU has.
 *
 * hearth_unpack_block turns one GGUF block into codes q (int8: signed for Q8_0, 0..63 for every other
 * type) and, per sub-block, a scale s and offset o with  w = s·q + o  the weight gguf's dequantizer
 * gives. Each s·q + o below is exact in fp32 or rounds exactly as gguf's expression does:
 *   Q4_0 s=d, o=−8d      Q4_1 s=d, o=m        Q5_0 s=d, o=−16d     Q5_1 s=d, o=m      Q8_0 s=d, o=0
 *   Q2_K s=d·sc, o=−dmin·m                    Q3_K s=d·(sc−32), o=−4s
 *   Q4_K / Q5_K s=d·sc, o=−dmin·m             Q6_K s=d·sc, o=−32s
 * (d, dmin and Q4_1/Q5_1's m are fp16, 11 significant bits; the K-quants' integer scales and mins have
 * at most 7 and the codes at most 6, so every d·sc and s·q fits fp32's 24 bits and is exact; where gguf
 * adds an offset it rounds once, as s·q + o does; where it has none, s·q + o is the exact s·(q − c).) The one difference: a zero weight of a centred type comes out +0 where gguf's
 * s·(q − c) gives −0 for a negative s. hearth_dequant_row computes gguf's own expression, so it is
 * bit-identical, signed zeros included (tests/test_native_unpack.py checks both). Every product s·q is
 * exact, so a compiler contracting s·q + o into an FMA (-ffp-contract=fast) gives the same bits; the tests
 * passed with the library built under -mavx2 -mfma and -mavx512f/bw/vl/vnni, both with contraction on.
 * -ffast-math would not keep them (it drops signed zeros). Byte order: little-endian is what ran; the
 * big-endian branch of hearth_fifth_bits is untested.
 *
 * Layouts: ggml-quants.c's block_* structs and dequantize_row_*; engine/model/quant.py describes them.
 */
#ifndef HEARTH_UNPACK_H
#define HEARTH_UNPACK_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* The unpack and the row loops are forced inline so that a caller's constant type folds their switches. */
#if defined(__GNUC__)
#define HEARTH_INLINE static inline __attribute__((always_inline))
#else
#define HEARTH_INLINE static inline
#endif

enum {
    HEARTH_Q4_0 = 2, HEARTH_Q4_1 = 3, HEARTH_Q5_0 = 6, HEARTH_Q5_1 = 7, HEARTH_Q8_0 = 8,
    HEARTH_Q2_K = 10, HEARTH_Q3_K = 11, HEARTH_Q4_K = 12, HEARTH_Q5_K = 13, HEARTH_Q6_K = 14,
};

#define HEARTH_MAX_ELEMENTS 256 /* elements in the largest block (a K-quant super-block) */
#define HEARTH_MAX_SUBS 16      /* sub-blocks in the largest block (Q2_K, Q3_K, Q6_K) */

/* One ggml type: elements and bytes per block, elements per sub-block (one s and o each), and the block
 * llama.cpp quantizes the activations in for it (its vec_dot_type: Q8_0/Q8_1 per 32, Q8_K per 256). */
typedef struct {
    int id;
    const char *name;
    int elements;
    int bytes;
    int sub;
    int act_block;
} HearthQType;

static const HearthQType hearth_qtypes[] = {
    {HEARTH_Q4_0, "Q4_0", 32, 18, 32, 32},     {HEARTH_Q4_1, "Q4_1", 32, 20, 32, 32},
    {HEARTH_Q5_0, "Q5_0", 32, 22, 32, 32},     {HEARTH_Q5_1, "Q5_1", 32, 24, 32, 32},
    {HEARTH_Q8_0, "Q8_0", 32, 34, 32, 32},     {HEARTH_Q2_K, "Q2_K", 256, 84, 16, 256},
    {HEARTH_Q3_K, "Q3_K", 256, 110, 16, 256},  {HEARTH_Q4_K, "Q4_K", 256, 144, 32, 256},
    {HEARTH_Q5_K, "Q5_K", 256, 176, 32, 256},  {HEARTH_Q6_K, "Q6_K", 256, 210, 16, 256},
};

/* The type with this ggml id, or NULL when Hearth's kernels do not support it. */
static inline const HearthQType *hearth_qtype(int id) {
    for (size_t i = 0; i < sizeof hearth_qtypes / sizeof hearth_qtypes[0]; i++)
        if (hearth_qtypes[i].id == id) return &hearth_qtypes[i];
    return NULL;
}

/* IEEE half (little-endian bytes) → float, exactly; no F16C needed, so the portable path has it too. */
static inline float hearth_fp16(const uint8_t *p) {
    const uint32_t h = (uint32_t)p[0] | (uint32_t)p[1] << 8;
    const uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1Fu, man = h & 0x3FFu;
    uint32_t bits;
    if (exp == 0x1F) {
        bits = sign | 0x7F800000u | man << 13; /* inf, NaN */
    } else if (exp != 0) {
        bits = sign | (exp + 112) << 23 | man << 13;
    } else if (man == 0) {
        bits = sign;
    } else {
        const float f = (float)man * 0x1p-24f; /* a subnormal half: man · 2^−24, exact in fp32 */
        return sign ? -f : f;
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* ggml's half-split nibbles: byte j of a run of n holds element j (low) and n + j (high). For the runs of
 * 32 and 64 bytes of the K-quants: this byte loop vectorizes under every -m flag. */
static inline void hearth_nibbles(const uint8_t *restrict qs, int n, int8_t *restrict q) {
    for (int j = 0; j < n; j++) {
        q[j] = (int8_t)(qs[j] & 0x0F);
        q[j + n] = (int8_t)(qs[j] >> 4);
    }
}

static inline uint64_t hearth_load64(const void *p) {
    uint64_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void hearth_store64(void *p, uint64_t v) { memcpy(p, &v, sizeof v); }

/* The 32-element types' 16 bytes of nibbles, eight at a time in a 64-bit word (the masks work byte by
 * byte, so this holds for either byte order). The byte loop above, given 16 bytes under -mavx2, came out
 * as scalar byte stores read back by vector loads: 20 ns a block against 2 for this (gcc 12). */
static inline void hearth_nibbles16(const uint8_t *restrict qs, int8_t *restrict q) {
    for (int g = 0; g < 2; g++) {
        const uint64_t v = hearth_load64(qs + 8 * g);
        hearth_store64(q + 8 * g, v & 0x0F0F0F0F0F0F0F0Fu);
        hearth_store64(q + 16 + 8 * g, (v >> 4) & 0x0F0F0F0F0F0F0F0Fu);
    }
}

/* Q5_0/Q5_1's fifth bits: bit j of the little-endian 32-bit qh is element j's bit 4. Each byte of qh is
 * spread over 8 codes in a word: broadcast it, keep bit i in byte i, carry that up to bit 7, and move it
 * to bit 4. (A loop over the bits does not vectorize: 5x Q4_0's time a row, bench/gather_q.py.) */
static inline void hearth_fifth_bits(const uint8_t *restrict qh, int8_t *restrict q) {
    for (int g = 0; g < 4; g++) {
        uint64_t bits = ((uint64_t)qh[g] * 0x0101010101010101u) & 0x8040201008040201u;
        bits = ((bits + 0x7F7F7F7F7F7F7F7Fu) >> 3) & 0x1010101010101010u; /* byte i: 16 if bit i was set */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        bits = __builtin_bswap64(bits); /* byte i of the value is byte 7 − i in memory */
#endif
        hearth_store64(q + 8 * g, hearth_load64(q + 8 * g) | bits);
    }
}

/* The K-quants' 2-bit fields: each half of 128 elements is 32 bytes, element 32·t + j in bits 2t..2t+1
 * of byte j. */
static inline void hearth_crumbs(const uint8_t *restrict qs, int8_t *restrict q) {
    for (int h = 0; h < 2; h++)
        for (int t = 0; t < 4; t++)
            for (int j = 0; j < 32; j++) q[128 * h + 32 * t + j] = (int8_t)((qs[32 * h + j] >> (2 * t)) & 3);
}

/* Q3_K/Q5_K's per-element high bit: element 32·b + j is bit b of byte j of 32, shifted up by ``at``. */
static inline void hearth_high_bits(const uint8_t *restrict qh, int at, int8_t *restrict q) {
    for (int b = 0; b < 8; b++)
        for (int j = 0; j < 32; j++) q[32 * b + j] = (int8_t)(q[32 * b + j] | ((qh[j] >> b) & 1) << at);
}

/* Q4_K/Q5_K's twelve bytes of 6-bit scales and mins (ggml's get_scale_min_k4). */
static inline void hearth_scale_min_k4(const uint8_t *restrict p, uint8_t *restrict sc, uint8_t *restrict mn) {
    for (int j = 0; j < 4; j++) {
        sc[j] = p[j] & 63;
        mn[j] = p[j + 4] & 63;
        sc[j + 4] = (uint8_t)((p[j + 8] & 0x0F) | (p[j] >> 6) << 4);
        mn[j + 4] = (uint8_t)((p[j + 8] >> 4) | (p[j + 4] >> 6) << 4);
    }
}

/* Q4_K/Q5_K's head: s = d·sc, o = −dmin·m per sub-block of 32, and the low nibbles (4 runs of 32 bytes,
 * each two sub-blocks). */
static inline void hearth_unpack_k4_head(const uint8_t *restrict b, const uint8_t *restrict qs, int8_t *restrict q,
                                         float *restrict s, float *restrict o) {
    const float d = hearth_fp16(b), dmin = hearth_fp16(b + 2);
    uint8_t sc[8], mn[8];
    hearth_scale_min_k4(b + 4, sc, mn);
    for (int j = 0; j < 8; j++) {
        s[j] = d * (float)sc[j];
        o[j] = -(dmin * (float)mn[j]);
    }
    for (int p = 0; p < 4; p++) hearth_nibbles(qs + 32 * p, 32, q + 64 * p);
}

/* One block of type ``id`` (which must be supported: see hearth_qtype) → q[elements], s[n], o[n] for
 * its n = elements / sub sub-blocks. */
HEARTH_INLINE void hearth_unpack_block(int id, const uint8_t *restrict b, int8_t *restrict q, float *restrict s,
                                      float *restrict o) {
    switch (id) {
    case HEARTH_Q4_0:
        s[0] = hearth_fp16(b);
        o[0] = -8.0f * s[0];
        hearth_nibbles16(b + 2, q);
        break;
    case HEARTH_Q4_1:
        s[0] = hearth_fp16(b);
        o[0] = hearth_fp16(b + 2);
        hearth_nibbles16(b + 4, q);
        break;
    case HEARTH_Q5_0:
        s[0] = hearth_fp16(b);
        o[0] = -16.0f * s[0];
        hearth_nibbles16(b + 6, q);
        hearth_fifth_bits(b + 2, q);
        break;
    case HEARTH_Q5_1:
        s[0] = hearth_fp16(b);
        o[0] = hearth_fp16(b + 2);
        hearth_nibbles16(b + 8, q);
        hearth_fifth_bits(b + 4, q);
        break;
    case HEARTH_Q8_0:
        s[0] = hearth_fp16(b);
        o[0] = 0.0f;
        memcpy(q, b + 2, 32);
        break;
    case HEARTH_Q2_K: { /* scales[16] (low nibble sc, high nibble m), qs[64], d, dmin */
        const float d = hearth_fp16(b + 80), dmin = hearth_fp16(b + 82);
        for (int j = 0; j < 16; j++) {
            s[j] = d * (float)(b[j] & 0x0F);
            o[j] = -(dmin * (float)(b[j] >> 4));
        }
        hearth_crumbs(b + 16, q);
        break;
    }
    case HEARTH_Q3_K: { /* hmask[32], qs[64], scales[12], d; code = low 2 bits | high bit << 2 */
        const float d = hearth_fp16(b + 108);
        const uint8_t *p = b + 96;
        for (int j = 0; j < 16; j++) {
            const int low = (j < 8 ? p[j] : p[j - 8] >> 4) & 0x0F, top = (p[8 + (j & 3)] >> (2 * (j >> 2))) & 3;
            s[j] = d * (float)((low | top << 4) - 32);
            o[j] = -4.0f * s[j];
        }
        hearth_crumbs(b + 32, q);
        hearth_high_bits(b, 2, q);
        break;
    }
    case HEARTH_Q4_K: /* d, dmin, scales[12], qs[128] */
        hearth_unpack_k4_head(b, b + 16, q, s, o);
        break;
    case HEARTH_Q5_K: /* d, dmin, scales[12], qh[32], qs[128] */
        hearth_unpack_k4_head(b, b + 48, q, s, o);
        hearth_high_bits(b + 16, 4, q);
        break;
    case HEARTH_Q6_K: { /* ql[128], qh[64], int8 scales[16], d */
        const float d = hearth_fp16(b + 208);
        for (int j = 0; j < 16; j++) {
            s[j] = d * (float)(int8_t)b[192 + j];
            o[j] = -32.0f * s[j];
        }
        for (int h = 0; h < 2; h++) {
            hearth_nibbles(b + 64 * h, 64, q + 128 * h);
            for (int t = 0; t < 4; t++)
                for (int j = 0; j < 32; j++)
                    q[128 * h + 32 * t + j] =
                        (int8_t)(q[128 * h + 32 * t + j] | ((b[128 + 32 * h + j] >> (2 * t)) & 3) << 4);
        }
        break;
    }
    default:
        break;
    }
}

/* Whole blocks of one type, its geometry as constants: once inlined with them, every loop has a fixed
 * trip count and the unpack's switch folds away. A centred type (centre c >= 0: Q4_0 8, Q5_0 16, Q8_0 0,
 * Q3_K 4, Q6_K 32) is gguf's s·(q − c); the others are gguf's d·q + m and d·q − dmin·m, i.e. s·q + o.
 * Measured with gcc 12, a row of 2048, by -m flags (none / avx2 / avx512), what decided the shape:
 * - blocks are unpacked HEARTH_MAX_ELEMENTS weights at a time (8 of the 32-element types), then converted:
 *   converting each 32-element block straight after its unpack read codes still in the store buffer at
 *   another width (a failed store-to-load forward): Q8_0 747 -> 184 ns, Q4_0 1163 -> 215 under avx2;
 * - weights are converted 32 at a time, two sub-blocks of 16 together: a loop of 16 int8 codes does not
 *   fill an AVX2 vector of them and came out scalar (Q6_K 700 -> 290 ns, Q3_K 800 -> 450);
 * - the geometry is constant: read from the table at run time, the row took 2.5x as long under avx2.
 * Every type now takes 200-560 ns a row under each flag set (bench/gather_q.py gives the library's). */
HEARTH_INLINE void hearth_dequant_blocks(int id, int elements, int bytes, int sub, int centre,
                                         const uint8_t *restrict row, int64_t k, float *restrict out) {
    int8_t q[HEARTH_MAX_ELEMENTS];
    float s[HEARTH_MAX_ELEMENTS / 16], o[HEARTH_MAX_ELEMENTS / 16];
    const int per = HEARTH_MAX_ELEMENTS / elements, subs = elements / sub;
    for (int64_t e = 0; e < k; e += HEARTH_MAX_ELEMENTS) {
        const int64_t left = (k - e) / elements;
        const int blocks = left < per ? (int)left : per;
        for (int b = 0; b < blocks; b++)
            hearth_unpack_block(id, row + (int64_t)b * bytes, q + b * elements, s + b * subs, o + b * subs);
        for (int j = 0; j < blocks * subs; j += 32 / sub) { /* 32 weights: one or two sub-blocks */
            const int8_t *qj = q + j * sub;
            float *w = out + j * sub;
            const float s0 = s[j], s1 = s[j + (sub == 16)], o0 = o[j], o1 = o[j + (sub == 16)];
            if (centre >= 0) {
                for (int i = 0; i < 32; i++) w[i] = (i < 16 ? s0 : s1) * (float)(qj[i] - centre);
            } else if (sub == 32) {
                for (int i = 0; i < 32; i++) w[i] = s0 * (float)qj[i] + o0;
            } else { /* Q2_K: the two selects above did not vectorize (3x the time of these halves) */
                for (int i = 0; i < 16; i++) w[i] = s0 * (float)qj[i] + o0;
                for (int i = 16; i < 32; i++) w[i] = s1 * (float)qj[i] + o1;
            }
        }
        row += (int64_t)blocks * bytes;
        out += blocks * elements;
    }
}

/* One row of k weights (k a multiple of the type's block; a supported type, else nothing is written)
 * → out[k], bit-identical to gguf.quants.dequantize: each weight is gguf's own expression. */
static inline void hearth_dequant_row(int id, const uint8_t *restrict row, int64_t k, float *restrict out) {
    switch (id) {
    case HEARTH_Q4_0: hearth_dequant_blocks(HEARTH_Q4_0, 32, 18, 32, 8, row, k, out); break;
    case HEARTH_Q4_1: hearth_dequant_blocks(HEARTH_Q4_1, 32, 20, 32, -1, row, k, out); break;
    case HEARTH_Q5_0: hearth_dequant_blocks(HEARTH_Q5_0, 32, 22, 32, 16, row, k, out); break;
    case HEARTH_Q5_1: hearth_dequant_blocks(HEARTH_Q5_1, 32, 24, 32, -1, row, k, out); break;
    case HEARTH_Q8_0: hearth_dequant_blocks(HEARTH_Q8_0, 32, 34, 32, 0, row, k, out); break;
    case HEARTH_Q2_K: hearth_dequant_blocks(HEARTH_Q2_K, 256, 84, 16, -1, row, k, out); break;
    case HEARTH_Q3_K: hearth_dequant_blocks(HEARTH_Q3_K, 256, 110, 16, 4, row, k, out); break;
    case HEARTH_Q4_K: hearth_dequant_blocks(HEARTH_Q4_K, 256, 144, 32, -1, row, k, out); break;
    case HEARTH_Q5_K: hearth_dequant_blocks(HEARTH_Q5_K, 256, 176, 32, -1, row, k, out); break;
    case HEARTH_Q6_K: hearth_dequant_blocks(HEARTH_Q6_K, 256, 210, 16, 32, row, k, out); break;
    default: break;
    }
}

#endif
