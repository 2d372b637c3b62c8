/* The glue Hearth's kernels share (see hearth_ort.h), and the library's entry point: RegisterCustomOps
 * adds both ops to the ai.hearth domain once the API layout and the CPU check out. */
#include <stdlib.h>
#include <string.h>

#include "hearth_ort.h"

#ifndef HEARTH_SOURCE_HASH
#define HEARTH_SOURCE_HASH "unknown"
#endif

const OrtApi *hearth_api;

OrtStatus *hearth_error(const char *message) {
    return CALL(CreateStatusFn, SLOT_CreateStatus)(ORT_INVALID_ARGUMENT, message);
}

OrtStatus *hearth_tensor(const OrtValue *value, HearthTensor *t, int element) {
    OrtTensorTypeAndShapeInfo *info;
    OrtStatus *st = CALL(GetTensorTypeAndShapeFn, SLOT_GetTensorTypeAndShape)(value, &info);
    if (st) return st;
    int type = 0;
    st = CALL(GetTensorElementTypeFn, SLOT_GetTensorElementType)(info, &type);
    if (!st) st = CALL(GetDimensionsCountFn, SLOT_GetDimensionsCount)(info, &t->rank);
    if (!st && t->rank > 4) st = hearth_error("hearth: a tensor has more than 4 dimensions");
    if (!st) st = CALL(GetDimensionsFn, SLOT_GetDimensions)(info, t->dims, t->rank);
    CALL(ReleaseTypeShapeFn, SLOT_ReleaseTensorTypeAndShapeInfo)(info);
    if (st) return st;
    if (type != element) return hearth_error("hearth: an input has an unsupported element type");
    void *p;
    st = CALL(GetTensorMutableDataFn, SLOT_GetTensorMutableData)((OrtValue *)value, &p);
    t->data = p;
    t->bytes = p;
    return st;
}

int64_t hearth_count(const HearthTensor *t) {
    int64_t n = 1;
    for (size_t i = 0; i < t->rank; i++) n *= t->dims[i];
    return n;
}

OrtStatus *hearth_output(OrtKernelContext *ctx, size_t index, const int64_t *dims, size_t rank, float **out) {
    OrtValue *value;
    OrtStatus *st = CALL(GetOutputFn, SLOT_KernelContext_GetOutput)(ctx, index, dims, rank, &value);
    if (st) return st;
    void *p;
    st = CALL(GetTensorMutableDataFn, SLOT_GetTensorMutableData)(value, &p);
    *out = p;
    return st;
}

const char *hearth_cpu_provider(const OrtCustomOp *op) { (void)op; return "CPUExecutionProvider"; }
int hearth_cpu_memory(const OrtCustomOp *op, size_t i) { (void)op, (void)i; return 0; }
int hearth_required(const OrtCustomOp *op, size_t i) { (void)op, (void)i; return IO_REQUIRED; }
int hearth_zero(const OrtCustomOp *op) { (void)op; return 0; }
int hearth_one(const OrtCustomOp *op) { (void)op; return 1; }
int hearth_end_version(const OrtCustomOp *op) { (void)op; return 1 << 30; }

/* For the Python side: which sources this binary was built from (see build.sh). */
__attribute__((visibility("default"))) const char *HearthKernelsSourceHash(void) { return HEARTH_SOURCE_HASH; }

__attribute__((visibility("default"))) OrtStatus *RegisterCustomOps(OrtSessionOptions *options, const OrtApiBase *base) {
    hearth_api = base->GetApi(HEARTH_ORT_API_VERSION);
    if (!hearth_api) return NULL; /* too old an ONNX Runtime: cannot even make a status; the ops stay unknown */
    const char *build = CALL(GetBuildInfoStringFn, SLOT_GetBuildInfoString)();
    if (!build || strncmp(build, "ORT Build Info", 14) != 0)
        return CALL(CreateStatusFn, SLOT_CreateStatus)(ORT_FAIL, "hearth kernels: unexpected ONNX Runtime API layout");
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma"))
        return CALL(CreateStatusFn, SLOT_CreateStatus)(ORT_NOT_IMPLEMENTED, "hearth kernels need AVX2 and FMA");
    OrtCustomOpDomain *domain;
    OrtStatus *st = CALL(CreateCustomOpDomainFn, SLOT_CreateCustomOpDomain)("ai.hearth", &domain);
    if (!st) st = CALL(CustomOpDomainAddFn, SLOT_CustomOpDomain_Add)(domain, &hearth_attention_op);
    if (!st) st = CALL(CustomOpDomainAddFn, SLOT_CustomOpDomain_Add)(domain, &hearth_head_op);
    if (!st) st = CALL(CustomOpDomainAddFn, SLOT_CustomOpDomain_Add)(domain, &hearth_gather_op);
    if (!st) st = CALL(AddCustomOpDomainFn, SLOT_AddCustomOpDomain)(options, domain);
    return st;
}
