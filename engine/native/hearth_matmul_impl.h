/* hearth.MatMulQ's arithmetic, written once and compiled per instruction set (hearth_matmul_<isa>.c
 * defines HEARTH_ISA_NAME and HEARTH_ISA_TABLE, then includes this). Float work uses GCC vector types of
 * 16 or 8 lanes, which the compiler lowers to whatever the file's -m flags allow; the 8-bit dot products
 * use AVX2's maddubs or AVX-512 VNNI's dpbusd where the flags have them, plain C otherwise.
 *
 * Both numerics decode HEARTH_TILE_ROWS rows of W at a time into a per-thread tile and reuse it for
 * every row of X, so a prefill decodes each block once per call, and decode streams the blocks once:
 * - exact: each row is decoded to fp32 by hearth_dequant_row (bit-identical to gguf), and the dots are
 *   fp32 FMAs, so a result differs from the float64 reference only by fp32 summation;
 * - fast: each row is unpacked to its codes with, per run of 4 codes, the sub-block's scale, and per run
 *   of 16 its offset; X was quantized by quantize() as llama.cpp's CPU path does (Q8_0 / Q8_1 per 32,
 *   Q8_K per 256); the codes meet in 8-bit integer dots of 4 codes a lane, and each lane is scaled once:
 *   y = sum over lanes of s·dx·(codes · x codes) + sum over runs of 16 of o·dx·(sum of x codes).
 * BF16 (present on some of these CPUs) is not used: it keeps neither numerics.
 */
#include <math.h>
#include <string.h>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "hearth_matmul.h"
#include "hearth_unpack.h"

typedef float v16f __attribute__((vector_size(64)));
typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));

static inline v16f ld16(const float *p) {
    v16f v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline v8f ld8(const float *p) {
    v8f v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline float hsum16(v16f v) {
    float t = 0.0f;
    for (int i = 0; i < 16; i++) t += v[i];
    return t;
}

static inline float hsum8f(v8f v) {
    float t = 0.0f;
    for (int i = 0; i < 8; i++) t += v[i];
    return t;
}

/* exact ------------------------------------------------------------------------------------------ */

/* Four dots of x[k] with tile rows w0..w3 (k a multiple of 16): one x load feeds four FMAs. */
static inline void dot4_exact(const float *restrict x, const float *restrict w, int64_t stride, int64_t k,
                              float *out) {
    v16f a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
    for (int64_t e = 0; e < k; e += 16) {
        const v16f xv = ld16(x + e);
        a0 += xv * ld16(w + e);
        a1 += xv * ld16(w + stride + e);
        a2 += xv * ld16(w + 2 * stride + e);
        a3 += xv * ld16(w + 3 * stride + e);
    }
    out[0] = hsum16(a0), out[1] = hsum16(a1), out[2] = hsum16(a2), out[3] = hsum16(a3);
}

static inline float dot1_exact(const float *restrict x, const float *restrict w, int64_t k) {
    v16f a = {0};
    for (int64_t e = 0; e < k; e += 16) a += ld16(x + e) * ld16(w + e);
    return hsum16(a);
}

static void rows_exact(const HearthMatJob *j, int64_t first, int64_t last) {
    const int64_t k = j->k;
    float *tile = hearth_scratch(HEARTH_EXACT_TILE_BYTES(k));
    if (!tile) {
        __atomic_store_n(j->failed, 1, __ATOMIC_RELAXED);
        return;
    }
    for (int64_t n0 = first; n0 < last; n0 += HEARTH_TILE_ROWS) {
        const int64_t count = last - n0 < HEARTH_TILE_ROWS ? last - n0 : HEARTH_TILE_ROWS;
        for (int64_t r = 0; r < count; r++) hearth_dequant_row(j->type, j->w + (n0 + r) * j->row_bytes, k, tile + r * k);
        for (int64_t m = 0; m < j->rows; m++) {
            const float *x = j->x + m * k;
            float *y = j->y + m * j->n + n0;
            int64_t r = 0;
            for (; r + 4 <= count; r += 4) dot4_exact(x, tile + r * k, k, k, y + r);
            for (; r < count; r++) y[r] = dot1_exact(x, tile + r * k, k);
        }
    }
}

/* fast: activations ------------------------------------------------------------------------------- */

/* llama.cpp's Q8_0 / Q8_1 (per 32: d = amax / 127, q = round(x / d)) or Q8_K (per 256: the value of
 * largest magnitude maps to −127, q = nearest(−127 / max · x) capped at 127, d = max / −127). */
static void quantize_x(HearthMatJob *j) {
    const int block = hearth_qtype(j->type)->act_block;
    for (int64_t m = 0; m < j->rows; m++) {
        const float *x = j->x + m * j->k;
        int8_t *q = j->xq + m * j->k;
        float *xd = j->xd + m * (j->k / 32), *xs = j->xs + m * (j->k / 16);
        for (int64_t e = 0; e < j->k; e += block) {
            float d;
            if (block == 32) {
                float amax = 0.0f;
                for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[e + i]));
                d = amax / 127.0f;
                const float id = d != 0.0f ? 1.0f / d : 0.0f;
                for (int i = 0; i < 32; i++) q[e + i] = (int8_t)roundf(x[e + i] * id);
            } else {
                float amax = 0.0f, max = 0.0f;
                for (int i = 0; i < block; i++)
                    if (fabsf(x[e + i]) > amax) amax = fabsf(x[e + i]), max = x[e + i];
                if (amax == 0.0f) {
                    d = 0.0f;
                    for (int i = 0; i < block; i++) q[e + i] = 0;
                } else {
                    const float iscale = -127.0f / max;
                    for (int i = 0; i < block; i++) {
                        const int v = (int)nearbyintf(iscale * x[e + i]);
                        q[e + i] = (int8_t)(v < 127 ? v : 127);
                    }
                    d = 1.0f / iscale;
                }
            }
            for (int c = 0; c < block / 32; c++) xd[(e + 32 * c) / 32] = d;
            for (int g = 0; g < block / 16; g++) {
                int sum = 0;
                for (int i = 0; i < 16; i++) sum += q[e + 16 * g + i];
                xs[(e + 16 * g) / 16] = d * (float)sum;
            }
        }
    }
}

/* fast: weights ---------------------------------------------------------------------------------- */

/* One row → codes[k], the scale of each run of 4 codes sc[k / 4], the offset of each run of 16 off[k / 16]. */
static inline void unpack_row(int type, const uint8_t *restrict row, int64_t k, int8_t *restrict codes,
                              float *restrict sc, float *restrict off) {
    const HearthQType *t = hearth_qtype(type);
    float s[HEARTH_MAX_SUBS], o[HEARTH_MAX_SUBS];
    for (int64_t e = 0; e < k; e += t->elements, row += t->bytes) {
        hearth_unpack_block(type, row, codes + e, s, o);
        for (int g = 0; g < t->elements / 16; g++) {
            const int sub = g * 16 / t->sub;
            for (int l = 0; l < 4; l++) sc[(e + 16 * g) / 4 + l] = s[sub];
            off[(e + 16 * g) / 16] = o[sub];
        }
    }
}

/* 32 weight codes · 32 activation codes → 8 lanes, each the sum of 4 products. Q8_0's codes are signed
 * (``is_signed``); every other type's are 0..63, which maddubs' unsigned operand takes as they are
 * (63 · 127 · 2 fits its int16 pairs). For signed codes the sign moves onto the activations. */
static inline v8i dot32_lanes(const int8_t *restrict w, const int8_t *restrict x, int is_signed) {
#if defined(__AVX2__)
    __m256i a = _mm256_loadu_si256((const __m256i *)(const void *)w);
    __m256i b = _mm256_loadu_si256((const __m256i *)(const void *)x);
    if (is_signed) {
        b = _mm256_sign_epi8(b, a);
        a = _mm256_sign_epi8(a, a);
    }
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    const __m256i lanes = _mm256_dpbusd_epi32(_mm256_setzero_si256(), a, b);
#else
    const __m256i lanes = _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1));
#endif
    v8i v;
    memcpy(&v, &lanes, sizeof v);
    return v;
#else
    (void)is_signed; /* plain C multiplies signed codes as they are */
    v8i v;
    for (int l = 0; l < 8; l++) {
        int32_t t = 0;
        for (int i = 0; i < 4; i++) t += (int32_t)w[4 * l + i] * (int32_t)x[4 * l + i];
        v[l] = t;
    }
    return v;
#endif
}

/* The offsets' share of one dot: sum over runs of 16 of off · (dx · sum of x codes). */
static inline float offsets(const float *restrict off, const float *restrict xs, int64_t runs) {
    v16f a = {0};
    int64_t g = 0;
    for (; g + 16 <= runs; g += 16) a += ld16(off + g) * ld16(xs + g);
    float t = hsum16(a);
    for (; g < runs; g++) t += off[g] * xs[g];
    return t;
}

typedef struct {
    int8_t *codes;
    float *sc, *off;
} FastTile;

static inline void dot4_fast(const HearthMatJob *j, const FastTile *t, int64_t r, int64_t m, int is_signed,
                             int has_offsets, float *out) {
    const int64_t k = j->k;
    const int8_t *xq = j->xq + m * k;
    const float *xd = j->xd + m * (k / 32);
    v8f a[4] = {{0}, {0}, {0}, {0}};
    for (int64_t c = 0; c < k / 32; c++) {
        const float d = xd[c];
        for (int i = 0; i < 4; i++) {
            const v8i lanes = dot32_lanes(t->codes + (r + i) * k + 32 * c, xq + 32 * c, is_signed);
            a[i] += __builtin_convertvector(lanes, v8f) * (ld8(t->sc + (r + i) * (k / 4) + 8 * c) * d);
        }
    }
    for (int i = 0; i < 4; i++)
        out[i] = hsum8f(a[i]) + (has_offsets ? offsets(t->off + (r + i) * (k / 16), j->xs + m * (k / 16), k / 16) : 0.0f);
}

static inline float dot1_fast(const HearthMatJob *j, const FastTile *t, int64_t r, int64_t m, int is_signed,
                              int has_offsets) {
    const int64_t k = j->k;
    const int8_t *xq = j->xq + m * k, *w = t->codes + r * k;
    const float *xd = j->xd + m * (k / 32), *sc = t->sc + r * (k / 4);
    v8f a = {0};
    for (int64_t c = 0; c < k / 32; c++)
        a += __builtin_convertvector(dot32_lanes(w + 32 * c, xq + 32 * c, is_signed), v8f) * (ld8(sc + 8 * c) * xd[c]);
    return hsum8f(a) + (has_offsets ? offsets(t->off + r * (k / 16), j->xs + m * (k / 16), k / 16) : 0.0f);
}

static void rows_fast(const HearthMatJob *j, int64_t first, int64_t last) {
    const int64_t k = j->k, tile_rows = HEARTH_TILE_ROWS;
    char *buf = hearth_scratch(HEARTH_FAST_TILE_BYTES(k));
    if (!buf) {
        __atomic_store_n(j->failed, 1, __ATOMIC_RELAXED);
        return;
    }
    FastTile t = {.codes = (int8_t *)buf};
    t.sc = (float *)(void *)(buf + ((tile_rows * k + 63) & ~(int64_t)63));
    t.off = t.sc + tile_rows * (k / 4);
    const int is_signed = j->type == HEARTH_Q8_0, has_offsets = j->type != HEARTH_Q8_0;
    for (int64_t n0 = first; n0 < last; n0 += tile_rows) {
        const int64_t count = last - n0 < tile_rows ? last - n0 : tile_rows;
        for (int64_t r = 0; r < count; r++)
            unpack_row(j->type, j->w + (n0 + r) * j->row_bytes, k, t.codes + r * k, t.sc + r * (k / 4),
                       t.off + r * (k / 16));
        for (int64_t m = 0; m < j->rows; m++) {
            float *y = j->y + m * j->n + n0;
            int64_t r = 0;
            for (; r + 4 <= count; r += 4) dot4_fast(j, &t, r, m, is_signed, has_offsets, y + r);
            for (; r < count; r++) y[r] = dot1_fast(j, &t, r, m, is_signed, has_offsets);
        }
    }
}

static void rows(const HearthMatJob *j, int64_t first, int64_t last) {
    if (j->fast)
        rows_fast(j, first, last);
    else
        rows_exact(j, first, last);
}

const HearthMatIsa HEARTH_ISA_TABLE = {HEARTH_ISA_NAME, quantize_x, rows};
