/* hearth.HeadQ8: the output head computed straight from the token table's 8-bit blocks.
 *
 *   logits[m, n] = sum over blocks b of  scale[n * B + b] * sum_i x[m, b * S + i] * (code[n, b, i] - 128)
 *
 * inputs:  x [..., K] float32 (the final hidden states), codes [V, B, S] uint8 (the embedding table
 *          in MatMulNBits' 8-bit form: zero point 128, K = B * S), scales [V * B] float32;
 * output:  logits [..., V] float32.
 *
 * A model whose head is tied to a Q8_0 embedding already carries those blocks for the embedding's
 * Gather, and its dense float32 head holds exactly code * scale (an 8-bit integer times an fp16 scale
 * is exact in float32). So this reads 1.06 bytes a weight instead of 4, in float32 arithmetic: the
 * logits match the dense MatMul to float32 rounding. The runner swaps it in (engine/runtime/
 * native_head.py) only after checking the blocks against the dense head.
 */
#include <immintrin.h>

#include "hearth_ort.h"

#define VEC __attribute__((target("avx2,fma")))
#define COLUMNS_PER_ITEM 512 /* vocabulary columns per parallel work item */

typedef struct {
    const float *x;
    const uint8_t *codes;
    const float *scales;
    float *out;
    int64_t rows, k, v, blocks, block;
} HeadJob;

VEC static float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Columns [first, first + COLUMNS_PER_ITEM) for every row: a column's codes stay in L1 across the rows. */
VEC static void head_item(void *data, size_t item) {
    const HeadJob *job = data;
    const int64_t first = (int64_t)item * COLUMNS_PER_ITEM;
    const int64_t last = first + COLUMNS_PER_ITEM < job->v ? first + COLUMNS_PER_ITEM : job->v;
    const __m128i flip = _mm_set1_epi8((char)0x80); /* code ^ 0x80, read as int8, is code - 128 */
    for (int64_t n = first; n < last; n++) {
        const uint8_t *column = job->codes + n * job->k;
        const float *scale = job->scales + n * job->blocks;
        if (n + 4 < last) _mm_prefetch((const char *)(column + 4 * job->k), _MM_HINT_T0);
        for (int64_t m = 0; m < job->rows; m++) {
            const float *x = job->x + m * job->k;
            __m256 total = _mm256_setzero_ps();
            for (int64_t b = 0; b < job->blocks; b++) {
                const uint8_t *codes = column + b * job->block;
                const float *xb = x + b * job->block;
                __m256 part = _mm256_setzero_ps();
                for (int64_t i = 0; i < job->block; i += 8) {
                    __m128i raw = _mm_xor_si128(_mm_loadl_epi64((const __m128i *)(codes + i)), flip);
                    __m256 w = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(raw));
                    part = _mm256_fmadd_ps(_mm256_loadu_ps(xb + i), w, part);
                }
                total = _mm256_fmadd_ps(part, _mm256_set1_ps(scale[b]), total);
            }
            job->out[m * job->v + n] = hsum8(total);
        }
    }
}

static OrtStatus *head_compute(void *self, OrtKernelContext *ctx) {
    (void)self;
    const OrtValue *in[3];
    OrtStatus *st;
    for (size_t i = 0; i < 3; i++)
        if ((st = CALL(GetInputFn, SLOT_KernelContext_GetInput)(ctx, i, &in[i]))) return st;
    HearthTensor x, codes, scales;
    if ((st = hearth_tensor(in[0], &x, ELEMENT_FLOAT)) || (st = hearth_tensor(in[1], &codes, ELEMENT_UINT8)) ||
        (st = hearth_tensor(in[2], &scales, ELEMENT_FLOAT)))
        return st;
    if (codes.rank != 3 || codes.dims[2] % 8 != 0 || codes.dims[1] < 1 || codes.dims[0] < 1)
        return hearth_error("hearth.HeadQ8: codes must be [vocabulary, blocks, block size (a multiple of 8)]");
    const int64_t v = codes.dims[0], blocks = codes.dims[1], block = codes.dims[2], k = blocks * block;
    if (x.rank < 1 || x.dims[x.rank - 1] != k)
        return hearth_error("hearth.HeadQ8: the hidden size does not match the blocks");
    if (scales.rank != 1 || scales.dims[0] != v * blocks)
        return hearth_error("hearth.HeadQ8: scales must be [vocabulary * blocks]");
    int64_t dims[4];
    for (size_t i = 0; i + 1 < x.rank; i++) dims[i] = x.dims[i];
    dims[x.rank - 1] = v;
    HeadJob job = {.x = x.data, .codes = codes.bytes, .scales = scales.data, .rows = hearth_count(&x) / k,
                   .k = k, .v = v, .blocks = blocks, .block = block};
    if ((st = hearth_output(ctx, 0, dims, x.rank, &job.out))) return st;
    size_t items = (size_t)((v + COLUMNS_PER_ITEM - 1) / COLUMNS_PER_ITEM);
    return CALL(ParallelForFn, SLOT_KernelContext_ParallelFor)(ctx, head_item, items, 0, &job);
}

static OrtStatus *head_create(const OrtCustomOp *op, const OrtApi *unused, const OrtKernelInfo *info, void **out) {
    (void)op, (void)unused, (void)info;
    static int stateless; /* no state: everything comes from the inputs */
    *out = &stateless;
    return NULL;
}

static void head_destroy(void *kernel) { (void)kernel; }
static const char *head_name(const OrtCustomOp *op) { (void)op; return "HeadQ8"; }
static int head_input_type(const OrtCustomOp *op, size_t i) { (void)op; return i == 1 ? ELEMENT_UINT8 : ELEMENT_FLOAT; }
static size_t head_inputs(const OrtCustomOp *op) { (void)op; return 3; }
static int head_output_type(const OrtCustomOp *op, size_t i) { (void)op, (void)i; return ELEMENT_FLOAT; }
static size_t head_outputs(const OrtCustomOp *op) { (void)op; return 1; }

const OrtCustomOp hearth_head_op = {
    HEARTH_CPU_OP_DEFAULTS,
    .GetName = head_name,
    .GetInputType = head_input_type,
    .GetInputTypeCount = head_inputs,
    .GetOutputType = head_output_type,
    .GetOutputTypeCount = head_outputs,
    .KernelDestroy = head_destroy,
    .GetInputCharacteristic = hearth_required,
    .CreateKernelV2 = head_create,
    .KernelComputeV2 = head_compute,
};
