/* hearth.MatMulQ's arithmetic, written once and compiled per instruction set (hearth_matmul_<isa>.c
 * defines HEARTH_ISA_NAME and HEARTH_ISA_TABLE, then includes this). Float work uses GCC vector types of
 * 16 or 8 lanes, which the compiler lowers to whatever the file's -m flags allow; the 8-bit dot products
 * use AVX2's maddubs or AVX-512 VNNI's dpbusd where the flags have them, plain C otherwise.
 *
 * Both numerics decode HEARTH_TILE_ROWS rows of W at a time into a per-thread tile and reuse it for
 * every row of X, so a prefill decodes each block once per call, and decode streams the blocks once:
 * - exact: up to FUSED_EXACT_ROWS rows of X (decode), each row of W is unpacked to its codes with a scale
 *   and offset per run of 16, and the weights s·q + o are formed in registers (exactly gguf's values,
 *   hearth_unpack.h); more rows of X (prefill), the tile holds rows decoded to fp32 by hearth_dequant_row
 *   (bit-identical to gguf). Either way the dots are fp32 FMAs, so a result differs from the float64
 *   reference only by fp32 summation;
 * - fast: each row is unpacked to the same codes, scales and offsets; X was quantized by quantize() as
 *   llama.cpp's CPU path does (Q8_0 / Q8_1 per 32, Q8_K per 256); the codes meet in 8-bit integer dots
 *   of 4 codes a lane, and each lane is scaled once:
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

/* weights, unpacked for the fused paths ------------------------------------------------------------ */

/* One row → codes[k] and, per run of 16 codes, the sub-block's scale s16 and offset o16 (w = s·q + o). */
HEARTH_INLINE void unpack_row(int type, int elements, int bytes, int sub, const uint8_t *restrict row, int64_t k,
                              int8_t *restrict codes, float *restrict s16, float *restrict o16) {
    float s[HEARTH_MAX_SUBS], o[HEARTH_MAX_SUBS];
    for (int64_t e = 0; e < k; e += elements, row += bytes) {
        hearth_unpack_block(type, row, codes + e, s, o);
        for (int g = 0; g < elements / 16; g++) {
            s16[e / 16 + g] = s[g * 16 / sub];
            o16[e / 16 + g] = o[g * 16 / sub];
        }
    }
}

typedef struct {
    int8_t *codes;
    float *s16, *o16;
} Tile;

/* The per-thread tile for ``rows`` rows of k: codes, then the scales and offsets per 16; NULL (and the job
 * marked failed) when out of memory. */
static inline int tile_for(const HearthMatJob *j, Tile *t) {
    char *buf = hearth_scratch(HEARTH_FAST_TILE_BYTES(j->k));
    if (!buf) {
        __atomic_store_n(j->failed, 1, __ATOMIC_RELAXED);
        return 0;
    }
    t->codes = (int8_t *)buf;
    t->s16 = (float *)(void *)(buf + ((HEARTH_TILE_ROWS * j->k + 63) & ~(int64_t)63));
    t->o16 = t->s16 + HEARTH_TILE_ROWS * (j->k / 16);
    return 1;
}

/* exact, decode: the weights are decoded in registers (s·q + o per 16, exact: hearth_unpack.h), never
 * stored as fp32; below this many rows of X that beats decoding a float tile (the tile wins when reused). */
#define FUSED_EXACT_ROWS 4

/* exact decode's inner loop: 16 codes a step under AVX-512, 8 (one ymm) otherwise. Composing a 16-lane
 * vector of two converted halves went through the stack under -mavx2 and stalled on the reload (a 2048 x
 * 2048 Q4_K took 3.7 ms against 0.86 for a float tile); gcc 12 also scalarized __builtin_convertvector
 * from int8 lanes (2.3 ms), hence the intrinsics. */
#if defined(__AVX512F__)
HEARTH_INLINE float dot_fused_exact(const float *restrict x, const int8_t *restrict q, const float *restrict s16,
                                    const float *restrict o16, int64_t k) {
    __m512 a = _mm512_setzero_ps();
    for (int64_t g = 0; g < k / 16; g++) {
        const __m512 w = _mm512_fmadd_ps(
            _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(const void *)(q + 16 * g)))),
            _mm512_set1_ps(s16[g]), _mm512_set1_ps(o16[g]));
        a = _mm512_fmadd_ps(_mm512_loadu_ps(x + 16 * g), w, a);
    }
    return _mm512_reduce_add_ps(a);
}
#elif defined(__AVX2__)
HEARTH_INLINE float dot_fused_exact(const float *restrict x, const int8_t *restrict q, const float *restrict s16,
                                    const float *restrict o16, int64_t k) {
    __m256 a = _mm256_setzero_ps(), b = _mm256_setzero_ps();
    for (int64_t g = 0; g < k / 16; g++) {
        const __m256 s = _mm256_set1_ps(s16[g]), o = _mm256_set1_ps(o16[g]);
        const __m128i codes = _mm_loadu_si128((const __m128i *)(const void *)(q + 16 * g));
        const __m256 lo = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(codes)), s, o);
        const __m256 hi = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(codes, 8))), s, o);
        a = _mm256_fmadd_ps(_mm256_loadu_ps(x + 16 * g), lo, a);
        b = _mm256_fmadd_ps(_mm256_loadu_ps(x + 16 * g + 8), hi, b);
    }
    v8f t;
    const __m256 sum = _mm256_add_ps(a, b);
    memcpy(&t, &sum, sizeof t);
    return hsum8f(t);
}
#else
HEARTH_INLINE float dot_fused_exact(const float *restrict x, const int8_t *restrict q, const float *restrict s16,
                                    const float *restrict o16, int64_t k) {
    v16f a = {0};
    for (int64_t g = 0; g < k / 16; g++) {
        v16f w;
        for (int i = 0; i < 16; i++) w[i] = (float)q[16 * g + i];
        a += ld16(x + 16 * g) * (w * s16[g] + o16[g]);
    }
    return hsum16(a);
}
#endif

HEARTH_INLINE void rows_fused_exact_t(const HearthMatJob *j, int64_t first, int64_t last, int type, int elements,
                                      int bytes, int sub) {
    Tile t;
    if (!tile_for(j, &t)) return;
    const int64_t k = j->k;
    for (int64_t n = first; n < last; n++) {
        unpack_row(type, elements, bytes, sub, j->w + n * j->row_bytes, k, t.codes, t.s16, t.o16);
        for (int64_t m = 0; m < j->rows; m++) j->y[m * j->n + n] = dot_fused_exact(j->x + m * k, t.codes, t.s16, t.o16, k);
    }
}

/* fast ------------------------------------------------------------------------------------------- */

/* 32 weight codes · 32 activation codes → 8 lanes, each the sum of 4 products. Q8_0's codes are signed
 * (``is_signed``); every other type's are 0..63, which maddubs' unsigned operand takes as they are
 * (63 · 127 · 2 fits its int16 pairs). For signed codes the sign moves onto the activations. */
HEARTH_INLINE v8i dot32_lanes(const int8_t *restrict w, const int8_t *restrict x, int is_signed) {
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

/* The scales of a run of 32 codes, one per lane of 4: one sub-block's, or two of 16 each. */
HEARTH_INLINE v8f lane_scales(const float *s16, int sub) {
    if (sub == 32) return (v8f){0} + s16[0];
    const float a = s16[0], b = s16[1];
    return (v8f){a, a, a, a, b, b, b, b};
}

/* The offsets' share of one dot: sum over runs of 16 of o · (dx · sum of x codes). */
HEARTH_INLINE float offsets(const float *restrict o16, const float *restrict xs, int64_t runs) {
    v16f a = {0};
    int64_t g = 0;
    for (; g + 16 <= runs; g += 16) a += ld16(o16 + g) * ld16(xs + g);
    float t = hsum16(a);
    for (; g < runs; g++) t += o16[g] * xs[g];
    return t;
}

HEARTH_INLINE float dot_fast(const HearthMatJob *j, const int8_t *restrict w, const float *restrict s16,
                             const float *restrict o16, int64_t m, int sub, int is_signed) {
    const int64_t k = j->k;
    const int8_t *xq = j->xq + m * k;
    const float *xd = j->xd + m * (k / 32);
    v8f a = {0};
    for (int64_t c = 0; c < k / 32; c++)
        a += __builtin_convertvector(dot32_lanes(w + 32 * c, xq + 32 * c, is_signed), v8f) *
             (lane_scales(s16 + 2 * c, sub) * xd[c]);
    return hsum8f(a) + (is_signed ? 0.0f : offsets(o16, j->xs + m * (k / 16), k / 16)); /* Q8_0: no offsets */
}

/* Four weight rows against one row of X: the activation codes and scales are loaded once for all four
 * (prefill's inner loop). */
HEARTH_INLINE void dot4_fast(const HearthMatJob *j, const Tile *t, int64_t r, int64_t m, int sub, int is_signed,
                             float *out) {
    const int64_t k = j->k, g16 = k / 16;
    const int8_t *xq = j->xq + m * k, *w = t->codes + r * k;
    const float *xd = j->xd + m * (k / 32), *s16 = t->s16 + r * g16;
    v8f a[4] = {{0}, {0}, {0}, {0}};
    for (int64_t c = 0; c < k / 32; c++)
        for (int i = 0; i < 4; i++)
            a[i] += __builtin_convertvector(dot32_lanes(w + i * k + 32 * c, xq + 32 * c, is_signed), v8f) *
                    (lane_scales(s16 + i * g16 + 2 * c, sub) * xd[c]);
    for (int i = 0; i < 4; i++)
        out[i] = hsum8f(a[i]) + (is_signed ? 0.0f : offsets(t->o16 + (r + i) * g16, j->xs + m * g16, g16));
}

HEARTH_INLINE void rows_fast_t(const HearthMatJob *j, int64_t first, int64_t last, int type, int elements, int bytes,
                               int sub) {
    Tile t;
    if (!tile_for(j, &t)) return;
    const int64_t k = j->k, g16 = k / 16;
    const int is_signed = type == HEARTH_Q8_0;
    for (int64_t n0 = first; n0 < last; n0 += HEARTH_TILE_ROWS) {
        const int64_t count = last - n0 < HEARTH_TILE_ROWS ? last - n0 : HEARTH_TILE_ROWS;
        for (int64_t r = 0; r < count; r++)
            unpack_row(type, elements, bytes, sub, j->w + (n0 + r) * j->row_bytes, k, t.codes + r * k,
                       t.s16 + r * g16, t.o16 + r * g16);
        for (int64_t m = 0; m < j->rows; m++) {
            float *y = j->y + m * j->n + n0;
            int64_t r = 0;
            for (; r + 4 <= count && j->rows > 1; r += 4) dot4_fast(j, &t, r, m, sub, is_signed, y + r);
            for (; r < count; r++) y[r] = dot_fast(j, t.codes + r * k, t.s16 + r * g16, t.o16 + r * g16, m, sub, is_signed);
        }
    }
}

/* Each type's geometry as constants, so the unpack's switch and every loop bound fold away. */
#define FOR_EACH_TYPE(fn, ...)                                                                           \
    switch (j->type) {                                                                                 \
    case HEARTH_Q4_0: fn(__VA_ARGS__, HEARTH_Q4_0, 32, 18, 32); break;                                 \
    case HEARTH_Q4_1: fn(__VA_ARGS__, HEARTH_Q4_1, 32, 20, 32); break;                                 \
    case HEARTH_Q5_0: fn(__VA_ARGS__, HEARTH_Q5_0, 32, 22, 32); break;                                 \
    case HEARTH_Q5_1: fn(__VA_ARGS__, HEARTH_Q5_1, 32, 24, 32); break;                                 \
    case HEARTH_Q8_0: fn(__VA_ARGS__, HEARTH_Q8_0, 32, 34, 32); break;                                 \
    case HEARTH_Q2_K: fn(__VA_ARGS__, HEARTH_Q2_K, 256, 84, 16); break;                                \
    case HEARTH_Q3_K: fn(__VA_ARGS__, HEARTH_Q3_K, 256, 110, 16); break;                               \
    case HEARTH_Q4_K: fn(__VA_ARGS__, HEARTH_Q4_K, 256, 144, 32); break;                               \
    case HEARTH_Q5_K: fn(__VA_ARGS__, HEARTH_Q5_K, 256, 176, 32); break;                               \
    case HEARTH_Q6_K: fn(__VA_ARGS__, HEARTH_Q6_K, 256, 210, 16); break;                               \
    default: break;                                                                                    \
    }

static void rows(const HearthMatJob *j, int64_t first, int64_t last) {
    if (j->fast) {
        FOR_EACH_TYPE(rows_fast_t, j, first, last)
    } else if (j->rows <= FUSED_EXACT_ROWS) {
        FOR_EACH_TYPE(rows_fused_exact_t, j, first, last)
    } else {
        rows_exact(j, first, last);
    }
}

const HearthMatIsa HEARTH_ISA_TABLE = {HEARTH_ISA_NAME, quantize_x, rows};
