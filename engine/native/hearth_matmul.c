/* hearth.MatMulQ: a linear layer straight from the GGUF's own blocks.
 *
 * inputs:     X float32 [..., K] (rank 1–4), W uint8 [N, R] (the GGUF tensor's rows as stored: row n is
 *             output feature n, R = K / elements · bytes of the type's block)
 * attributes: type (the ggml type id), fast (0: exact fp32; 1: 8-bit activations, integer dots)
 * output:     Y float32 [..., N] = X · dequant(W)ᵀ
 *
 * The instruction set is chosen when a kernel is created: HEARTH_KERNEL_ISA (portable, avx2, avx512,
 * avx512vnni) if set, else the best this CPU has; hearth_matmul_impl.h holds the arithmetic of all four.
 * Bad shapes, an unknown type or a forced instruction set the CPU lacks are INVALID_ARGUMENT statuses
 * whose message starts "hearth.MatMulQ: " (or "hearth: " for the instruction set).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hearth_matmul.h"
#include "hearth_ort.h"
#include "hearth_unpack.h"

#define EXPORT __attribute__((visibility("default")))
/* Below this many multiply-adds one thread does it all: handing work to the pool costs ~3 us (measured
 * for GatherQ, bench/gather_q.py), and 65536 of them take ~5 us on one thread at the fast decode's
 * 12.5 G a second (2048 x 2048 Q4_K, avx512vnni). */
#define MATMUL_SERIAL_MACS 65536

typedef struct {
    const HearthQType *t;
    int fast;
    const HearthMatIsa *isa;
} MatKernel;

void *hearth_scratch(size_t bytes) {
    static _Thread_local void *buffer;
    static _Thread_local size_t capacity;
    if (bytes > capacity) {
        void *grown = realloc(buffer, bytes);
        if (!grown) return NULL;
        buffer = grown, capacity = bytes;
    }
    return buffer;
}

/* The instruction set HEARTH_KERNEL_ISA names (or the best this CPU has), or NULL with ``why`` filled. */
static const HearthMatIsa *choose_isa(char *why, size_t size) {
    __builtin_cpu_init();
    const int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    const int avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                       __builtin_cpu_supports("avx512vl");
    const int vnni = avx512 && __builtin_cpu_supports("avx512vnni");
    const char *forced = getenv("HEARTH_KERNEL_ISA");
    if (!forced || !*forced) {
        return vnni ? &hearth_matmul_avx512vnni : avx512 ? &hearth_matmul_avx512 : avx2 ? &hearth_matmul_avx2
                                                                                       : &hearth_matmul_portable;
    }
    static const struct {
        const char *name, *lacks;
        const HearthMatIsa *isa;
    } known[] = {{"portable", "", &hearth_matmul_portable},
                 {"avx2", "AVX2 and FMA", &hearth_matmul_avx2},
                 {"avx512", "AVX-512 (F, BW and VL)", &hearth_matmul_avx512},
                 {"avx512vnni", "AVX-512 VNNI", &hearth_matmul_avx512vnni}};
    const int has[] = {1, avx2, avx512, vnni};
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (strcmp(forced, known[i].name) == 0) {
            if (has[i]) return known[i].isa;
            snprintf(why, size, "hearth: HEARTH_KERNEL_ISA=%s but this CPU has no %s", forced, known[i].lacks);
            return NULL;
        }
    snprintf(why, size, "hearth: HEARTH_KERNEL_ISA=%.40s is not one of portable, avx2, avx512, avx512vnni", forced);
    return NULL;
}

typedef struct {
    const HearthMatJob *job;
    const HearthMatIsa *isa;
} MatItems;

static void matmul_item(void *data, size_t item) {
    const MatItems *it = data;
    const int64_t first = (int64_t)item * HEARTH_TILE_ROWS;
    const int64_t last = first + HEARTH_TILE_ROWS < it->job->n ? first + HEARTH_TILE_ROWS : it->job->n;
    it->isa->rows(it->job, first, last);
}

/* The fast path's activations for ``job``: one buffer holding codes [rows, k], then the scales per 32 and
 * the sums per 16, filled by the path's quantizer; NULL when out of memory. The caller frees it. */
static char *quantized_activations(HearthMatJob *job, const HearthMatIsa *isa) {
    const int64_t rows = job->rows, k = job->k;
    char *buffer = malloc((size_t)(rows * k) + (size_t)(rows * (k / 32 + k / 16)) * sizeof(float) + 64);
    if (!buffer) return NULL;
    job->xq = (int8_t *)buffer;
    job->xd = (float *)(void *)(buffer + ((rows * k + 63) & ~(int64_t)63));
    job->xs = job->xd + rows * (k / 32);
    isa->quantize(job);
    return buffer;
}

static OrtStatus *matmul_compute(void *self, OrtKernelContext *ctx) {
    const MatKernel *kern = self;
    const HearthQType *t = kern->t;
    const OrtValue *in[2];
    OrtStatus *st;
    for (size_t i = 0; i < 2; i++)
        if ((st = CALL(GetInputFn, SLOT_KernelContext_GetInput)(ctx, i, &in[i]))) return st;
    HearthTensor x, w;
    if ((st = hearth_tensor(in[0], &x, ELEMENT_FLOAT)) || (st = hearth_tensor(in[1], &w, ELEMENT_UINT8))) return st;
    char message[200];
    if (w.rank != 2 || w.dims[1] <= 0 || w.dims[1] % t->bytes) {
        snprintf(message, sizeof message, "hearth.MatMulQ: W must be [N, R] with R a positive multiple of %s's %d-byte block",
                 t->name, t->bytes);
        return hearth_error(message);
    }
    const int64_t n = w.dims[0], k = w.dims[1] / t->bytes * t->elements;
    if (x.rank < 1 || x.dims[x.rank - 1] != k) {
        snprintf(message, sizeof message, "hearth.MatMulQ: X's last dimension must be K = %lld (W's rows hold %lld %s weights)",
                 (long long)k, (long long)k, t->name);
        return hearth_error(message);
    }
    int64_t dims[4];
    for (size_t i = 0; i + 1 < x.rank; i++) dims[i] = x.dims[i];
    dims[x.rank - 1] = n;
    int failed = 0;
    HearthMatJob job = {.type = t->id, .fast = kern->fast, .rows = hearth_count(&x) / k, .k = k, .n = n,
                        .row_bytes = w.dims[1], .x = x.data, .w = w.bytes, .failed = &failed};
    if ((st = hearth_output(ctx, 0, dims, x.rank, &job.y))) return st;
    if (job.rows == 0 || n == 0) return NULL;
    char *activations = NULL;
    if (job.fast && !(activations = quantized_activations(&job, kern->isa)))
        return CALL(CreateStatusFn, SLOT_CreateStatus)(ORT_FAIL, "hearth.MatMulQ: out of memory");
    MatItems items = {.job = &job, .isa = kern->isa};
    const size_t count = (size_t)((n + HEARTH_TILE_ROWS - 1) / HEARTH_TILE_ROWS);
    if (job.rows * n * k < MATMUL_SERIAL_MACS) {
        for (size_t i = 0; i < count; i++) matmul_item(&items, i);
    } else {
        st = CALL(ParallelForFn, SLOT_KernelContext_ParallelFor)(ctx, matmul_item, count, 0, &items);
    }
    free(activations);
    if (!st && __atomic_load_n(&failed, __ATOMIC_RELAXED))
        st = CALL(CreateStatusFn, SLOT_CreateStatus)(ORT_FAIL, "hearth.MatMulQ: out of memory for a weight tile");
    return st;
}

static OrtStatus *matmul_create(const OrtCustomOp *op, const OrtApi *unused, const OrtKernelInfo *info, void **out) {
    (void)op, (void)unused;
    AttrInt64Fn get_int = CALL(AttrInt64Fn, SLOT_KernelInfoGetAttribute_int64);
    int64_t type = 0, fast = 0;
    OrtStatus *st;
    if ((st = get_int(info, "type", &type)) || (st = get_int(info, "fast", &fast))) return st;
    const HearthQType *t = type == (int)type ? hearth_qtype((int)type) : NULL;
    char message[200];
    if (!t) {
        snprintf(message, sizeof message, "hearth.MatMulQ: unsupported weight type %lld", (long long)type);
        return hearth_error(message);
    }
    if (fast != 0 && fast != 1) {
        snprintf(message, sizeof message, "hearth.MatMulQ: fast must be 0 or 1, not %lld", (long long)fast);
        return hearth_error(message);
    }
    const HearthMatIsa *isa = choose_isa(message, sizeof message);
    if (!isa) return hearth_error(message);
    MatKernel *kern = malloc(sizeof *kern);
    if (!kern) return CALL(CreateStatusFn, SLOT_CreateStatus)(ORT_FAIL, "hearth.MatMulQ: out of memory");
    *kern = (MatKernel){.t = t, .fast = (int)fast, .isa = isa};
    *out = kern;
    return NULL;
}

static void matmul_destroy(void *kernel) { free(kernel); }
static const char *matmul_name(const OrtCustomOp *op) { (void)op; return "MatMulQ"; }
static int matmul_input_type(const OrtCustomOp *op, size_t i) { (void)op; return i == 0 ? ELEMENT_FLOAT : ELEMENT_UINT8; }
static size_t matmul_inputs(const OrtCustomOp *op) { (void)op; return 2; }
static int matmul_output_type(const OrtCustomOp *op, size_t i) { (void)op, (void)i; return ELEMENT_FLOAT; }
static size_t matmul_outputs(const OrtCustomOp *op) { (void)op; return 1; }

const OrtCustomOp hearth_matmul_op = {
    HEARTH_CPU_OP_DEFAULTS,
    .GetName = matmul_name,
    .GetInputType = matmul_input_type,
    .GetInputTypeCount = matmul_inputs,
    .GetOutputType = matmul_output_type,
    .GetOutputTypeCount = matmul_outputs,
    .KernelDestroy = matmul_destroy,
    .GetInputCharacteristic = hearth_required,
    .CreateKernelV2 = matmul_create,
    .KernelComputeV2 = matmul_compute,
};

/* For the Python side: the instruction set a kernel made now would use, or "error: ..." when
 * HEARTH_KERNEL_ISA names one this CPU lacks. */
EXPORT const char *HearthKernelsIsa(void) {
    static _Thread_local char text[200];
    char why[180];
    const HearthMatIsa *isa = choose_isa(why, sizeof why);
    if (isa)
        snprintf(text, sizeof text, "%s", isa->name);
    else
        snprintf(text, sizeof text, "error: %s", why);
    return text;
}

/* 1 when RegisterCustomOps registers the library's ops on this CPU (it needs AVX2 and FMA). */
EXPORT int HearthKernelsUsable(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

/* Test export: the same arithmetic without ONNX Runtime, single-threaded: Y[rows, n] from X[rows, k] and
 * W[n, row bytes]; −1 for an unsupported type, a bad k or a forced instruction set the CPU lacks, −2 when
 * out of memory. */
EXPORT int HearthMatMulRows(int type, int fast, const float *x, int64_t rows, int64_t k, const uint8_t *w, int64_t n,
                            float *y) {
    const HearthQType *t = hearth_qtype(type);
    char why[180];
    const HearthMatIsa *isa = choose_isa(why, sizeof why);
    if (!t || !isa || k <= 0 || k % t->elements || rows < 0 || n < 0) return -1;
    int failed = 0;
    HearthMatJob job = {.type = type, .fast = fast != 0, .rows = rows, .k = k, .n = n,
                        .row_bytes = k / t->elements * t->bytes, .x = x, .w = w, .y = y, .failed = &failed};
    char *activations = NULL;
    if (job.fast && !(activations = quantized_activations(&job, isa))) return -2;
    if (rows > 0) isa->rows(&job, 0, n);
    free(activations);
    return failed ? -2 : 0;
}
