/* hearth.Attention: GroupQueryAttention for ONNX Runtime's CPU provider, with the same inputs,
 * attributes and outputs, written for a long past and a few new tokens.
 *
 * ONNX Runtime's own CPU kernel runs one matrix product per query head, so each key/value head is
 * read (and its keys transposed into a packed panel) once for every query head that shares it, and a
 * decode step over 8k tokens spends about twice the time the memory reads need. Here each work item
 * takes one KV head, a block of query positions and a range of keys, and every key row it reads serves
 * all the query heads of its group at once; long pasts are split over the threads by key range (flash-
 * decoding) and the partial softmaxes merged. The arithmetic stays in float32 with the usual
 * max-subtracted softmax, so results match ONNX Runtime's kernel to float32 rounding.
 *
 * Supported: batch 1, float32, head size a multiple of 8 (up to 512), packed or separate Q/K/V, rotary
 * in the half-split layout, a local window, past and present sharing one buffer (or not). Anything else
 * (softcap, smooth softmax, interleaved rotary) is refused when the session is made, and the engine then
 * runs ONNX Runtime's own GroupQueryAttention instead.
 *
 * Needs AVX2 and FMA; RegisterCustomOps refuses to register on a CPU without them.
 */
#include <immintrin.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hearth_ort.h"

#define TILE 64         /* keys scored per pass */
#define BLOCK_QUERIES 16 /* query positions per work item */
#define MAX_HEAD 512
#define MAX_ROWS 256    /* query rows (heads of a group x positions) per work item */
#define NEG (-1.0e30f)  /* "no key yet": finite, so NEG - NEG is 0, never NaN */
#define COLUMN_ROWS 8   /* from this many query rows per item, scores are computed key-major (run_columns) */


/* ---- vector helpers (AVX2 + FMA) ------------------------------------------------------------------ */

#define VEC __attribute__((target("avx2,fma")))

VEC static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* e^x for x <= 0 (scores minus their running max): 2^n * p(r), r in [-ln2/2, ln2/2], relative error ~1e-7. */
VEC static inline __m256 exp_ps(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

/* The row-block kernels below are instantiated for 1 to 4 rows (NR is a constant in each copy), so
 * their inner loops carry no per-row branches: each key or value row loaded serves all NR query rows. */
#define INLINE __attribute__((always_inline)) inline

/* scores[r * TILE + t] = q_r . k_t for NR rows starting at q[0], keys [0, nt). */
VEC static INLINE void score_rows(const float *const *q, const int NR, const float *keys, int nt, int d,
                                  float *scores, const float *fetch) {
    for (int t = 0; t < nt; t++) {
        const float *k = keys + (size_t)t * d;
        if (fetch) /* this key's value row, wanted right after this pass: ask for it now */
            for (int i = 0; i < d; i += 16) _mm_prefetch((const char *)(fetch + (size_t)t * d + i), _MM_HINT_T0);
        __m256 a[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
        __m256 b[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
        int i = 0;
        for (; i + 16 <= d; i += 16) { /* two accumulators per row: shorter FMA dependency chains */
            __m256 k0 = _mm256_loadu_ps(k + i), k1 = _mm256_loadu_ps(k + i + 8);
            for (int r = 0; r < NR; r++) {
                a[r] = _mm256_fmadd_ps(_mm256_loadu_ps(q[r] + i), k0, a[r]);
                b[r] = _mm256_fmadd_ps(_mm256_loadu_ps(q[r] + i + 8), k1, b[r]);
            }
        }
        if (i < d) {
            __m256 k0 = _mm256_loadu_ps(k + i);
            for (int r = 0; r < NR; r++) a[r] = _mm256_fmadd_ps(_mm256_loadu_ps(q[r] + i), k0, a[r]);
        }
        for (int r = 0; r < NR; r++) scores[r * TILE + t] = hsum(_mm256_add_ps(a[r], b[r]));
    }
}

/* Many rows (a prefill block): the item's query rows are laid out by dimension once, qt[i * R + r] = q_r[i]
 * (R: the rows rounded up to 8, padding zero), and scores come out key-major, st[t * R + r]. Each key
 * row is read as stored, one element at a time broadcast against 8 query rows per vector, so no key tile
 * is transposed, and the softmax bookkeeping below runs 8 rows per vector. NK keys x NG groups of 8 rows
 * are accumulated in registers over the whole head (12 accumulators at most: AVX2 has 16 registers). */
VEC static INLINE void score_block(const float *qt, int R, const int NG, const int NK, const float *keys, int d,
                                   float *st) {
    __m256 a[4][3];
    for (int k = 0; k < NK; k++)
        for (int g = 0; g < NG; g++) a[k][g] = _mm256_setzero_ps();
    for (int i = 0; i < d; i++) {
        __m256 q[3];
        for (int g = 0; g < NG; g++) q[g] = _mm256_loadu_ps(qt + (size_t)i * R + 8 * g);
        for (int k = 0; k < NK; k++) {
            __m256 w = _mm256_broadcast_ss(keys + (size_t)k * d + i);
            for (int g = 0; g < NG; g++) a[k][g] = _mm256_fmadd_ps(w, q[g], a[k][g]);
        }
    }
    for (int k = 0; k < NK; k++)
        for (int g = 0; g < NG; g++) _mm256_storeu_ps(st + (size_t)k * R + 8 * g, a[k][g]);
}

#define SCORE_BLOCK(NG)                                                                    \
    switch (nk) {                                                                          \
    case 4: score_block(qt + 8 * g, R, NG, 4, keys + (size_t)t * d, d, st + (size_t)t * R + 8 * g); break; \
    case 3: score_block(qt + 8 * g, R, NG, 3, keys + (size_t)t * d, d, st + (size_t)t * R + 8 * g); break; \
    case 2: score_block(qt + 8 * g, R, NG, 2, keys + (size_t)t * d, d, st + (size_t)t * R + 8 * g); break; \
    default: score_block(qt + 8 * g, R, NG, 1, keys + (size_t)t * d, d, st + (size_t)t * R + 8 * g); break; \
    }

/* st[t * R + r] = q_r . k_t for all R rows, keys [0, nt). */
VEC static void score_tile_columns(const float *qt, int R, const float *keys, int nt, int d, float *st) {
    const int groups = R / 8;
    for (int t = 0; t < nt; t += 4) { /* the 4 key rows stay in L1 while every row group meets them */
        int nk = nt - t < 4 ? nt - t : 4;
        for (int g = 0; g < groups; g += 3) {
            switch (groups - g < 3 ? groups - g : 3) {
            case 3: SCORE_BLOCK(3) break;
            case 2: SCORE_BLOCK(2) break;
            default: SCORE_BLOCK(1) break;
            }
        }
    }
}

VEC static void score_tile(const float *const *q, int rows, const float *keys, int nt, int d, float *scores,
                           const float *values) {
    int r = 0;
    for (; r + 4 <= rows; r += 4) score_rows(q + r, 4, keys, nt, d, scores + r * TILE, r == 0 ? values : NULL);
    const float *fetch = r == 0 ? values : NULL;
    switch (rows - r) {
    case 3: score_rows(q + r, 3, keys, nt, d, scores + r * TILE, fetch); break;
    case 2: score_rows(q + r, 2, keys, nt, d, scores + r * TILE, fetch); break;
    case 1: score_rows(q + r, 1, keys, nt, d, scores + r * TILE, fetch); break;
    default: break;
    }
}

/* acc_r += sum_t p[r * rs + t * ts] * v_t for NR rows starting at acc / p, keys [0, nt): the
 * probabilities are row-major (rs TILE, ts 1) after score_tile or key-major (rs 1, ts R) after
 * score_tile_columns. */
VEC static INLINE void accumulate_rows(float *acc, const int NR, const float *p, size_t rs, size_t ts,
                                       const float *values, int nt, int d) {
    int i = 0;
    for (; i + 16 <= d; i += 16) {
        __m256 a[6], b[6];
        for (int r = 0; r < NR; r++) {
            a[r] = _mm256_loadu_ps(acc + (size_t)r * d + i);
            b[r] = _mm256_loadu_ps(acc + (size_t)r * d + i + 8);
        }
        for (int t = 0; t < nt; t++) {
            __m256 v0 = _mm256_loadu_ps(values + (size_t)t * d + i), v1 = _mm256_loadu_ps(values + (size_t)t * d + i + 8);
            for (int r = 0; r < NR; r++) {
                __m256 w = _mm256_broadcast_ss(p + r * rs + t * ts);
                a[r] = _mm256_fmadd_ps(w, v0, a[r]);
                b[r] = _mm256_fmadd_ps(w, v1, b[r]);
            }
        }
        for (int r = 0; r < NR; r++) {
            _mm256_storeu_ps(acc + (size_t)r * d + i, a[r]);
            _mm256_storeu_ps(acc + (size_t)r * d + i + 8, b[r]);
        }
    }
    if (i < d) {
        __m256 a[6];
        for (int r = 0; r < NR; r++) a[r] = _mm256_loadu_ps(acc + (size_t)r * d + i);
        for (int t = 0; t < nt; t++) {
            __m256 v0 = _mm256_loadu_ps(values + (size_t)t * d + i);
            for (int r = 0; r < NR; r++) a[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(p + r * rs + t * ts), v0, a[r]);
        }
        for (int r = 0; r < NR; r++) _mm256_storeu_ps(acc + (size_t)r * d + i, a[r]);
    }
}

VEC static void accumulate_tile(float *acc, int rows, const float *p, size_t rs, size_t ts, const float *values,
                                int nt, int d) {
    int r = 0;
    for (; r + 6 <= rows; r += 6) accumulate_rows(acc + (size_t)r * d, 6, p + r * rs, rs, ts, values, nt, d);
    float *a = acc + (size_t)r * d;
    const float *pr = p + r * rs;
    switch (rows - r) {
    case 5: accumulate_rows(a, 5, pr, rs, ts, values, nt, d); break;
    case 4: accumulate_rows(a, 4, pr, rs, ts, values, nt, d); break;
    case 3: accumulate_rows(a, 3, pr, rs, ts, values, nt, d); break;
    case 2: accumulate_rows(a, 2, pr, rs, ts, values, nt, d); break;
    case 1: accumulate_rows(a, 1, pr, rs, ts, values, nt, d); break;
    default: break;
    }
}

/* The largest of s[0..n). */
VEC static float max_of(const float *s, int n) {
    __m256 m = _mm256_set1_ps(NEG);
    int t = 0;
    for (; t + 8 <= n; t += 8) m = _mm256_max_ps(m, _mm256_loadu_ps(s + t));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    float best = _mm_cvtss_f32(h);
    for (; t < n; t++) best = s[t] > best ? s[t] : best;
    return best;
}

/* One row of a tile: softmax numerators against the running max, masked keys to 0; returns their sum. */
VEC static float exp_row(float *s, int nt, float max) {
    __m256 m = _mm256_set1_ps(max), sum = _mm256_setzero_ps();
    int t = 0;
    for (; t + 8 <= nt; t += 8) {
        __m256 raw = _mm256_loadu_ps(s + t);
        __m256 e = exp_ps(_mm256_sub_ps(raw, m));
        e = _mm256_and_ps(e, _mm256_cmp_ps(raw, _mm256_set1_ps(NEG * 0.5f), _CMP_GT_OQ));
        _mm256_storeu_ps(s + t, e);
        sum = _mm256_add_ps(sum, e);
    }
    float total = hsum(sum);
    for (; t < nt; t++) {
        s[t] = s[t] > NEG * 0.5f ? expf(s[t] - max) : 0.0f;
        total += s[t];
    }
    return total;
}

/* ---- the work ------------------------------------------------------------------------------------- */

typedef struct {
    int heads, kv_heads, group, d;
    int64_t window;         /* > 0: a query at position p sees keys (p - window, p], as ONNX Runtime's GQA */
    int64_t past, seq, cap; /* rows already cached, new positions, rows per head in the cache */
    const float *q;         /* [heads][seq][d], rotated and scaled */
    const float *keys, *values; /* present buffers [kv_heads][cap][d] */
    int blocks, chunks;     /* query blocks per KV head, key chunks per block */
    int rows;               /* query rows per work item at most: group x positions per block */
    float *m, *l, *acc;     /* per item: running max and sum per row, and the row's weighted values */
} Job;

static void item_geometry(const Job *job, size_t item, int *h, int *s0, int *s1, int64_t *a, int64_t *b) {
    int c = (int)(item % job->chunks);
    int qb = (int)((item / job->chunks) % job->blocks);
    *h = (int)(item / ((size_t)job->chunks * job->blocks));
    *s0 = qb * BLOCK_QUERIES;
    *s1 = *s0 + BLOCK_QUERIES < job->seq ? *s0 + BLOCK_QUERIES : (int)job->seq;
    int64_t hi = job->past + *s1; /* keys [lo, hi) can matter to this block */
    int64_t lo = job->window > 0 ? job->past + *s0 - job->window + 1 : 0;
    if (lo < 0) lo = 0;
    int64_t span = (hi - lo + job->chunks - 1) / job->chunks;
    span = (span + TILE - 1) / TILE * TILE;
    *a = lo + c * span;
    *b = *a + span < hi ? *a + span : hi;
}

/* Few rows (decode, or a short chunk): row-major scores, one row's softmax at a time. */
static void run_rows(const Job *job, const float *const *q, int rows, int positions, int s0, int64_t a, int64_t b,
                     const float *keys, const float *values, float *m, float *l, float *acc) {
    const int d = job->d;
    float scores[MAX_ROWS * TILE];
    for (int64_t j0 = a; j0 < b; j0 += TILE) {
        int nt = b - j0 < TILE ? (int)(b - j0) : TILE;
        score_tile(q, rows, keys + j0 * d, nt, d, scores, values + j0 * d);
        for (int r = 0; r < rows; r++) {
            int64_t pos = job->past + s0 + r % positions; /* this row's position */
            int64_t first = job->window > 0 ? pos - job->window + 1 : 0;
            float *s = scores + r * TILE, best = NEG;
            if (j0 >= first && j0 + nt - 1 <= pos) {
                best = max_of(s, nt); /* the whole tile is visible to this row */
            } else {
                for (int t = 0; t < nt; t++) {
                    int64_t j = j0 + t;
                    if (j > pos || j < first) s[t] = NEG;
                    else if (s[t] > best) best = s[t];
                }
            }
            if (best == NEG) { /* nothing this row may see in the tile */
                memset(s, 0, sizeof(float) * nt);
                continue;
            }
            if (best > m[r]) {
                float fix = expf(m[r] - best);
                l[r] *= fix;
                for (int i = 0; i < d; i++) acc[(size_t)r * d + i] *= fix;
                m[r] = best;
            }
            l[r] += exp_row(s, nt, m[r]);
        }
        accumulate_tile(acc, rows, scores, TILE, 1, values + j0 * d, nt, d);
    }
}

/* Many rows: key-major scores (score_tile_columns), the running max and sum of 8 rows per vector. */
VEC static void run_columns(const Job *job, const float *const *q, int rows, int positions, int s0, int64_t a,
                            int64_t b, const float *keys, const float *values, float *m_out, float *l_out,
                            float *acc, float *qt, float *st) {
    const int d = job->d, R = (rows + 7) / 8 * 8;
    float m[MAX_ROWS], l[MAX_ROWS], fix[MAX_ROWS];
    for (int r = 0; r < R; r++) {
        m[r] = NEG;
        l[r] = 0.0f;
        for (int i = 0; i < d; i++) qt[(size_t)i * R + r] = r < rows ? q[r][i] : 0.0f;
    }
    const int64_t newest = job->past + s0, last = newest + positions - 1; /* the block's first and last position */
    for (int64_t j0 = a; j0 < b; j0 += TILE) {
        int nt = b - j0 < TILE ? (int)(b - j0) : TILE;
        for (size_t i = 0; i < (size_t)nt * d; i += 16) _mm_prefetch((const char *)(values + j0 * d + i), _MM_HINT_T0);
        score_tile_columns(qt, R, keys + j0 * d, nt, d, st);
        /* Mask what a row may not see: only tiles at the causal edge or the window's far edge need it. */
        int edge = j0 + nt - 1 > newest || (job->window > 0 && j0 <= last - job->window);
        for (int t = 0; edge && t < nt; t++)
            for (int r = 0; r < rows; r++) {
                int64_t pos = newest + r % positions, j = j0 + t;
                if (j > pos || (job->window > 0 && j <= pos - job->window)) st[(size_t)t * R + r] = NEG;
            }
        for (int g = 0; g < R; g += 8) {
            __m256 best = _mm256_set1_ps(NEG);
            for (int t = 0; t < nt; t++) best = _mm256_max_ps(best, _mm256_loadu_ps(st + (size_t)t * R + g));
            __m256 old = _mm256_loadu_ps(m + g), top = _mm256_max_ps(old, best);
            __m256 sum = _mm256_setzero_ps(), floor = _mm256_set1_ps(NEG * 0.5f);
            for (int t = 0; t < nt; t++) { /* numerators against the running max; masked keys to 0 */
                __m256 raw = _mm256_loadu_ps(st + (size_t)t * R + g);
                __m256 e = _mm256_and_ps(exp_ps(_mm256_sub_ps(raw, top)), _mm256_cmp_ps(raw, floor, _CMP_GT_OQ));
                _mm256_storeu_ps(st + (size_t)t * R + g, e);
                sum = _mm256_add_ps(sum, e);
            }
            __m256 f = exp_ps(_mm256_sub_ps(old, top)); /* 1 where the max did not move */
            _mm256_storeu_ps(fix + g, f);
            _mm256_storeu_ps(l + g, _mm256_fmadd_ps(_mm256_loadu_ps(l + g), f, sum));
            _mm256_storeu_ps(m + g, top);
        }
        for (int r = 0; r < rows; r++)
            if (fix[r] != 1.0f)
                for (int i = 0; i < d; i++) acc[(size_t)r * d + i] *= fix[r];
        accumulate_tile(acc, rows, st, 1, (size_t)R, values + j0 * d, nt, d);
    }
    memcpy(m_out, m, sizeof(float) * rows);
    memcpy(l_out, l, sizeof(float) * rows);
}

static void run_item(void *data, size_t item) {
    const Job *job = data;
    int h, s0, s1;
    int64_t a, b;
    item_geometry(job, item, &h, &s0, &s1, &a, &b);
    const int d = job->d, group = job->group, positions = s1 - s0, rows = group * positions;
    float *m = job->m + item * job->rows, *l = job->l + item * job->rows;
    float *acc = job->acc + item * (size_t)job->rows * d;
    const float *q[MAX_ROWS];
    for (int g = 0; g < group; g++)
        for (int s = 0; s < positions; s++) {
            int r = g * positions + s;
            q[r] = job->q + ((size_t)(h * group + g) * job->seq + s0 + s) * d;
            m[r] = NEG;
            l[r] = 0.0f;
        }
    memset(acc, 0, sizeof(float) * rows * d);
    const float *keys = job->keys + (size_t)h * job->cap * d, *values = job->values + (size_t)h * job->cap * d;
    if (rows < COLUMN_ROWS) {
        run_rows(job, q, rows, positions, s0, a, b, keys, values, m, l, acc);
        return;
    }
    /* Scratch: the rows by dimension (d x R) and a tile's key-major scores (TILE x R). */
    const int R = (rows + 7) / 8 * 8;
    float *scratch = malloc(sizeof(float) * (size_t)R * (d + TILE));
    if (!scratch) { /* cannot happen in practice (under 1 MiB); fall back to the row path */
        run_rows(job, q, rows, positions, s0, a, b, keys, values, m, l, acc);
        return;
    }
    run_columns(job, q, rows, positions, s0, a, b, keys, values, m, l, acc, scratch, scratch + (size_t)R * d);
    free(scratch);
}

/* Rotate (x[i], x[i + half]) by the position's angle, for i < half. */
static void rotate(float *x, const float *cos, const float *sin, int half) {
    for (int i = 0; i < half; i++) {
        float x1 = x[i], x2 = x[i + half];
        x[i] = x1 * cos[i] - x2 * sin[i];
        x[i + half] = x2 * cos[i] + x1 * sin[i];
    }
}

/* ---- the operator ----------------------------------------------------------------------------------- */

typedef struct {
    int heads, kv_heads, rotary;
    float scale;
    int64_t window;
} Kernel;

static OrtStatus *compute(void *self, OrtKernelContext *ctx) {
    const Kernel *k = self;
    size_t n_inputs = 0;
    OrtStatus *st = CALL(GetInputCountFn, SLOT_KernelContext_GetInputCount)(ctx, &n_inputs);
    if (st) return st;
    const OrtValue *in[9] = {0};
    for (size_t i = 0; i < n_inputs && i < 9; i++)
        if ((st = CALL(GetInputFn, SLOT_KernelContext_GetInput)(ctx, i, &in[i]))) return st;
    if (!in[0] || !in[3] || !in[4] || !in[5] || !in[6])
        return hearth_error("hearth.Attention needs query, past_key, past_value, seqlens_k and total_sequence_length");
    HearthTensor query, key = {0}, value = {0}, past_k, past_v, seqlens, total_t, cos = {0}, sin = {0};
    if ((st = hearth_tensor(in[0], &query, ELEMENT_FLOAT)) || (st = hearth_tensor(in[3], &past_k, ELEMENT_FLOAT)) ||
        (st = hearth_tensor(in[4], &past_v, ELEMENT_FLOAT)) || (st = hearth_tensor(in[5], &seqlens, ELEMENT_INT32)) ||
        (st = hearth_tensor(in[6], &total_t, ELEMENT_INT32)))
        return st;
    const int packed = in[1] == NULL;
    if (!packed && (!in[2] || (st = hearth_tensor(in[1], &key, ELEMENT_FLOAT)) || (st = hearth_tensor(in[2], &value, ELEMENT_FLOAT))))
        return st ? st : hearth_error("hearth.Attention: key given without value");
    if (past_k.rank != 4 || past_k.dims[0] != 1 || past_k.dims[1] != k->kv_heads || past_v.rank != 4 ||
        memcmp(past_k.dims, past_v.dims, sizeof past_k.dims) != 0)
        return hearth_error("hearth.Attention: past key/value must both be [1, kv_num_heads, capacity, head_size]");
    const int64_t cap = past_k.dims[2], d = past_k.dims[3];
    if (d % 8 != 0 || d > MAX_HEAD) return hearth_error("hearth.Attention: head size must be a multiple of 8, at most 512");
    if (query.rank != 3 || query.dims[0] != 1) return hearth_error("hearth.Attention: query must be [1, sequence, hidden]");
    const int64_t seq = query.dims[1], heads = k->heads, kvh = k->kv_heads;
    const int64_t q_width = packed ? (heads + 2 * kvh) * d : heads * d;
    if (query.dims[2] != q_width) return hearth_error("hearth.Attention: query width does not match the heads");
    if (!packed && (key.rank != 3 || value.rank != 3 || key.dims[1] != seq || value.dims[1] != seq ||
                    key.dims[2] != kvh * d || value.dims[2] != kvh * d))
        return hearth_error("hearth.Attention: key/value must be [1, sequence, kv_num_heads * head_size]");
    if (hearth_count(&seqlens) != 1 || hearth_count(&total_t) != 1) return hearth_error("hearth.Attention: batch size must be 1");
    const int64_t total = total_t.data ? ((const int32_t *)total_t.data)[0] : 0;
    if (((const int32_t *)seqlens.data)[0] + 1 != total)
        return hearth_error("hearth.Attention: seqlens_k must be total_sequence_length - 1");
    const int64_t past = total - seq;
    if (seq < 1 || past < 0 || total > cap) return hearth_error("hearth.Attention: the sequence does not fit the cache");
    int half = 0;
    if (k->rotary) {
        if (!in[7] || !in[8] || (st = hearth_tensor(in[7], &cos, ELEMENT_FLOAT)) || (st = hearth_tensor(in[8], &sin, ELEMENT_FLOAT)))
            return st ? st : hearth_error("hearth.Attention: do_rotary needs cos_cache and sin_cache");
        if (cos.rank != 2 || sin.rank != 2 || cos.dims[0] != sin.dims[0] || cos.dims[1] != sin.dims[1] ||
            2 * cos.dims[1] > d)
            return hearth_error("hearth.Attention: cos/sin caches must be [positions, rotary_dim / 2]");
        if (total > cos.dims[0]) return hearth_error("hearth.Attention: a position is past the rotary cache");
        half = (int)cos.dims[1];
    }

    int64_t out_dims[3] = {1, seq, heads * d};
    float *out, *present_k, *present_v;
    if ((st = hearth_output(ctx, 0, out_dims, 3, &out)) || (st = hearth_output(ctx, 1, past_k.dims, 4, &present_k)) ||
        (st = hearth_output(ctx, 2, past_k.dims, 4, &present_v)))
        return st;
    if (present_k != past_k.data) /* not sharing one buffer: bring the past rows over */
        for (int64_t h = 0; h < kvh; h++) {
            memcpy(present_k + h * cap * d, past_k.data + h * cap * d, sizeof(float) * past * d);
            memcpy(present_v + h * cap * d, past_v.data + h * cap * d, sizeof(float) * past * d);
        }

    const float scale = k->scale > 0.0f ? k->scale : 1.0f / sqrtf((float)d);
    float *qbuf = malloc(sizeof(float) * heads * seq * d);
    if (!qbuf) return hearth_error("hearth.Attention: out of memory");
    for (int64_t s = 0; s < seq; s++) { /* rotate and scale Q; rotate K into the cache, copy V */
        int64_t pos = past + s;
        const float *row = query.data + s * q_width;
        const float *krow = packed ? row + heads * d : key.data + s * kvh * d;
        const float *vrow = packed ? row + (heads + kvh) * d : value.data + s * kvh * d;
        const float *c = half ? cos.data + pos * half : NULL, *sn = half ? sin.data + pos * half : NULL;
        for (int64_t n = 0; n < heads; n++) {
            float *dst = qbuf + (n * seq + s) * d;
            memcpy(dst, row + n * d, sizeof(float) * d);
            if (half) rotate(dst, c, sn, half);
            for (int64_t i = 0; i < d; i++) dst[i] *= scale;
        }
        for (int64_t h = 0; h < kvh; h++) {
            float *kd = present_k + (h * cap + pos) * d;
            memmove(kd, krow + h * d, sizeof(float) * d);
            if (half) rotate(kd, c, sn, half);
            memmove(present_v + (h * cap + pos) * d, vrow + h * d, sizeof(float) * d);
        }
    }

    Job job = {.heads = (int)heads, .kv_heads = (int)kvh, .group = (int)(heads / kvh), .d = (int)d,
               .window = k->window, .past = past, .seq = seq, .cap = cap, .q = qbuf,
               .keys = present_k, .values = present_v};
    job.blocks = (int)((seq + BLOCK_QUERIES - 1) / BLOCK_QUERIES);
    int64_t span = job.window > 0 && job.window + BLOCK_QUERIES < total ? job.window + BLOCK_QUERIES : total;
    job.chunks = 1;
    if ((int64_t)job.blocks * kvh < 16) { /* few items: split the keys too, ~256 keys per chunk at least */
        int64_t want = span / 256;
        job.chunks = (int)(want < 1 ? 1 : want > 16 ? 16 : want);
    }
    size_t items = (size_t)kvh * job.blocks * job.chunks;
    job.rows = job.group * (int)(seq < BLOCK_QUERIES ? seq : BLOCK_QUERIES);
    job.m = malloc(sizeof(float) * items * job.rows * 2);
    job.acc = malloc(sizeof(float) * items * job.rows * d);
    if (!job.m || !job.acc) {
        free(qbuf), free(job.m), free(job.acc);
        return hearth_error("hearth.Attention: out of memory");
    }
    job.l = job.m + items * job.rows;
    st = CALL(ParallelForFn, SLOT_KernelContext_ParallelFor)(ctx, run_item, items, 0, &job);

    /* Merge each block's key chunks: out = sum_c acc_c e^(m_c - M) / sum_c l_c e^(m_c - M). */
    for (size_t base = 0; !st && base < items; base += job.chunks) {
        int h, s0, s1;
        int64_t a, b;
        item_geometry(&job, base, &h, &s0, &s1, &a, &b);
        int positions = s1 - s0;
        for (int g = 0; g < job.group; g++)
            for (int s = 0; s < positions; s++) {
                int r = g * positions + s;
                float best = NEG, sum = 0.0f;
                for (int c = 0; c < job.chunks; c++)
                    if (job.m[(base + c) * job.rows + r] > best) best = job.m[(base + c) * job.rows + r];
                float *dst = out + (size_t)(s0 + s) * heads * d + (size_t)(h * job.group + g) * d;
                memset(dst, 0, sizeof(float) * d);
                for (int c = 0; c < job.chunks; c++) {
                    size_t it = base + c;
                    if (job.l[it * job.rows + r] == 0.0f) continue;
                    float w = expf(job.m[it * job.rows + r] - best);
                    sum += w * job.l[it * job.rows + r];
                    const float *src = job.acc + (it * job.rows + r) * d;
                    for (int i = 0; i < d; i++) dst[i] += w * src[i];
                }
                float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
                for (int i = 0; i < d; i++) dst[i] *= inv;
            }
    }
    free(qbuf);
    free(job.m);
    free(job.acc);
    return st;
}

static OrtStatus *create_kernel(const OrtCustomOp *op, const OrtApi *unused, const OrtKernelInfo *info, void **out) {
    (void)op, (void)unused;
    AttrInt64Fn get_int = CALL(AttrInt64Fn, SLOT_KernelInfoGetAttribute_int64);
    AttrFloatFn get_float = CALL(AttrFloatFn, SLOT_KernelInfoGetAttribute_float);
    ReleaseStatusFn release = CALL(ReleaseStatusFn, SLOT_ReleaseStatus);
    int64_t heads = 0, kv_heads = 0, rotary = 0, interleaved = 0, window = -1, smooth = 0;
    float scale = 0.0f, softcap = 0.0f;
    OrtStatus *st;
    if ((st = get_int(info, "num_heads", &heads)) || (st = get_int(info, "kv_num_heads", &kv_heads))) return st;
#define OPTIONAL_ATTR(call) do { OrtStatus *missing = (call); if (missing) release(missing); } while (0)
    OPTIONAL_ATTR(get_int(info, "do_rotary", &rotary));
    OPTIONAL_ATTR(get_int(info, "rotary_interleaved", &interleaved));
    OPTIONAL_ATTR(get_int(info, "local_window_size", &window));
    OPTIONAL_ATTR(get_int(info, "smooth_softmax", &smooth));
    OPTIONAL_ATTR(get_float(info, "scale", &scale));
    OPTIONAL_ATTR(get_float(info, "softcap", &softcap));
    if (heads < 1 || kv_heads < 1 || heads % kv_heads != 0 || heads / kv_heads > MAX_ROWS / BLOCK_QUERIES)
        return hearth_error("hearth.Attention: num_heads must be a multiple of kv_num_heads, at most 16 per KV head");
    if (interleaved || smooth || softcap != 0.0f)
        return hearth_error("hearth.Attention: interleaved rotary, smooth softmax and softcap are not supported");
    Kernel *k = malloc(sizeof *k);
    if (!k) return hearth_error("hearth.Attention: out of memory");
    *k = (Kernel){.heads = (int)heads, .kv_heads = (int)kv_heads, .rotary = rotary != 0, .scale = scale,
                  .window = window};
    *out = k;
    return NULL;
}

static const char *op_name(const OrtCustomOp *op) { (void)op; return "Attention"; }
static int input_type(const OrtCustomOp *op, size_t i) { (void)op; return i == 5 || i == 6 ? ELEMENT_INT32 : ELEMENT_FLOAT; }
static size_t input_count(const OrtCustomOp *op) { (void)op; return 9; }
static int output_type(const OrtCustomOp *op, size_t i) { (void)op, (void)i; return ELEMENT_FLOAT; }
static size_t output_count(const OrtCustomOp *op) { (void)op; return 3; }
static int input_kind(const OrtCustomOp *op, size_t i) {
    (void)op;
    return i == 1 || i == 2 || i == 7 || i == 8 ? IO_OPTIONAL : IO_REQUIRED;
}

const OrtCustomOp hearth_attention_op = {
    HEARTH_CPU_OP_DEFAULTS,
    .GetName = op_name,
    .GetInputType = input_type,
    .GetInputTypeCount = input_count,
    .GetOutputType = output_type,
    .GetOutputTypeCount = output_count,
    .KernelDestroy = free,
    .GetInputCharacteristic = input_kind,
    .CreateKernelV2 = create_kernel,
    .KernelComputeV2 = compute,
};
