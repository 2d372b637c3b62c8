/* hearth.GatherQ: rows of a token table read straight from its GGUF blocks.
 *
 * inputs:     ids int64 [...] (rank 0–3), W uint8 [V, R] (the GGUF tensor's rows as stored, R bytes each)
 * attributes: type (the ggml type id), k (the row's elements: R = k / elements · bytes)
 * output:     float32 [..., k], each row bit-identical to gguf.quants.dequantize (hearth_dequant_row).
 *
 * An id outside [0, V), a W of the wrong width or an unknown type is an INVALID_ARGUMENT whose message
 * starts "hearth.GatherQ: ". Also here: the test exports HearthDequantizeRows and HearthUnpackBlocks,
 * which let tests/test_native_unpack.py check the unpack layer (hearth_unpack.h) against gguf directly.
 */
#include <stdio.h>
#include <stdlib.h>

#include "hearth_ort.h"
#include "hearth_unpack.h"

#define EXPORT __attribute__((visibility("default")))
#define ELEMENT_INT64_ID 7          /* ONNX's TensorProto.INT64 */
/* Below this many output weights one thread does it all: a row of 2048 Q4_K weights takes ~0.45 us and
 * handing work to the second thread ~3 us; 2 threads first won at 8-16 rows of 2048 (bench/gather_q.py,
 * 1 vs 2 intra-op threads: 8 rows 13.2 vs 12.8 us, 16 rows 18.7 vs 16.0, 64 rows 51 vs 31). */
#define GATHER_SERIAL_ELEMENTS 16384
#define GATHER_ROWS_PER_ITEM 4

typedef struct {
    int type;
    int64_t k, row_bytes;
} GatherKernel;

typedef struct {
    const GatherKernel *kernel;
    const int64_t *ids;
    const uint8_t *w;
    float *out;
    int64_t rows;
} GatherJob;

static void gather_rows(const GatherJob *job, int64_t first, int64_t last) {
    const GatherKernel *g = job->kernel;
    for (int64_t r = first; r < last; r++)
        hearth_dequant_row(g->type, job->w + job->ids[r] * g->row_bytes, g->k, job->out + r * g->k);
}

static void gather_item(void *data, size_t item) {
    const GatherJob *job = data;
    const int64_t first = (int64_t)item * GATHER_ROWS_PER_ITEM;
    gather_rows(job, first, first + GATHER_ROWS_PER_ITEM < job->rows ? first + GATHER_ROWS_PER_ITEM : job->rows);
}

static OrtStatus *gather_compute(void *self, OrtKernelContext *ctx) {
    const GatherKernel *g = self;
    const OrtValue *in[2];
    OrtStatus *st;
    for (size_t i = 0; i < 2; i++)
        if ((st = CALL(GetInputFn, SLOT_KernelContext_GetInput)(ctx, i, &in[i]))) return st;
    HearthTensor ids, w;
    if ((st = hearth_tensor(in[0], &ids, ELEMENT_INT64_ID)) || (st = hearth_tensor(in[1], &w, ELEMENT_UINT8)))
        return st;
    char message[160];
    if (w.rank != 2 || w.dims[1] != g->row_bytes) {
        snprintf(message, sizeof message, "hearth.GatherQ: W must be [rows, %lld] (bytes of a row of %lld %s weights)",
                 (long long)g->row_bytes, (long long)g->k, hearth_qtype(g->type)->name);
        return hearth_error(message);
    }
    if (ids.rank > 3) return hearth_error("hearth.GatherQ: ids has more than 3 dimensions");
    const int64_t rows = hearth_count(&ids), v = w.dims[0];
    const int64_t *id = (const int64_t *)(const void *)ids.bytes;
    for (int64_t r = 0; r < rows; r++)
        if (id[r] < 0 || id[r] >= v) {
            snprintf(message, sizeof message, "hearth.GatherQ: id %lld is out of range (the table has %lld rows)",
                     (long long)id[r], (long long)v);
            return hearth_error(message);
        }
    int64_t dims[4];
    for (size_t i = 0; i < ids.rank; i++) dims[i] = ids.dims[i];
    dims[ids.rank] = g->k;
    GatherJob job = {.kernel = g, .ids = id, .w = w.bytes, .rows = rows};
    if ((st = hearth_output(ctx, 0, dims, ids.rank + 1, &job.out))) return st;
    if (rows * g->k < GATHER_SERIAL_ELEMENTS) { /* decode's one token: a thread hand-off costs more */
        gather_rows(&job, 0, rows);
        return NULL;
    }
    size_t items = (size_t)((rows + GATHER_ROWS_PER_ITEM - 1) / GATHER_ROWS_PER_ITEM);
    return CALL(ParallelForFn, SLOT_KernelContext_ParallelFor)(ctx, gather_item, items, 0, &job);
}

static OrtStatus *gather_create(const OrtCustomOp *op, const OrtApi *unused, const OrtKernelInfo *info, void **out) {
    (void)op, (void)unused;
    AttrInt64Fn get_int = CALL(AttrInt64Fn, SLOT_KernelInfoGetAttribute_int64);
    int64_t type = 0, k = 0;
    OrtStatus *st;
    if ((st = get_int(info, "type", &type)) || (st = get_int(info, "k", &k))) return st;
    const HearthQType *t = type == (int)type ? hearth_qtype((int)type) : NULL;
    char message[160];
    if (!t) {
        snprintf(message, sizeof message, "hearth.GatherQ: unsupported weight type %lld", (long long)type);
        return hearth_error(message);
    }
    if (k <= 0 || k % t->elements) {
        snprintf(message, sizeof message, "hearth.GatherQ: k = %lld is not a positive multiple of %s's %d-element block",
                 (long long)k, t->name, t->elements);
        return hearth_error(message);
    }
    GatherKernel *g = malloc(sizeof *g);
    if (!g) return CALL(CreateStatusFn, SLOT_CreateStatus)(ORT_FAIL, "hearth.GatherQ: out of memory");
    *g = (GatherKernel){.type = t->id, .k = k, .row_bytes = k / t->elements * t->bytes};
    *out = g;
    return NULL;
}

static void gather_destroy(void *kernel) { free(kernel); }
static const char *gather_name(const OrtCustomOp *op) { (void)op; return "GatherQ"; }
static int gather_input_type(const OrtCustomOp *op, size_t i) { (void)op; return i == 0 ? ELEMENT_INT64_ID : ELEMENT_UINT8; }
static size_t gather_inputs(const OrtCustomOp *op) { (void)op; return 2; }
static int gather_output_type(const OrtCustomOp *op, size_t i) { (void)op, (void)i; return ELEMENT_FLOAT; }
static size_t gather_outputs(const OrtCustomOp *op) { (void)op; return 1; }

const OrtCustomOp hearth_gather_op = {
    HEARTH_CPU_OP_DEFAULTS,
    .GetName = gather_name,
    .GetInputType = gather_input_type,
    .GetInputTypeCount = gather_inputs,
    .GetOutputType = gather_output_type,
    .GetOutputTypeCount = gather_outputs,
    .KernelDestroy = gather_destroy,
    .GetInputCharacteristic = hearth_required,
    .CreateKernelV2 = gather_create,
    .KernelComputeV2 = gather_compute,
};

/* Test exports. n rows of k weights of type id → out[n·k], as GatherQ computes them; −1 (nothing
 * written) for an unsupported type or a k that is not a positive multiple of its block. */
EXPORT int HearthDequantizeRows(int id, const uint8_t *rows, int64_t n, int64_t k, float *out) {
    const HearthQType *t = hearth_qtype(id);
    if (!t || k <= 0 || k % t->elements || n < 0) return -1;
    const int64_t row_bytes = k / t->elements * t->bytes;
    for (int64_t r = 0; r < n; r++) hearth_dequant_row(id, rows + r * row_bytes, k, out + r * k);
    return 0;
}

/* nblocks blocks of type id → codes q[nblocks·elements], scales s and offsets o [nblocks·elements/sub];
 * −1 for an unsupported type. */
EXPORT int HearthUnpackBlocks(int id, const uint8_t *blocks, int64_t nblocks, int8_t *q, float *s, float *o) {
    const HearthQType *t = hearth_qtype(id);
    if (!t || nblocks < 0) return -1;
    const int subs = t->elements / t->sub;
    for (int64_t b = 0; b < nblocks; b++)
        hearth_unpack_block(id, blocks + b * t->bytes, q + b * t->elements, s + b * subs, o + b * subs);
    return 0;
}
