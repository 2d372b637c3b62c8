/* The part of ONNX Runtime's C ABI that Hearth's kernels (hearth_*.c) use, declared by hand.
 *
 * ONNX Runtime's C API is one struct of function pointers (OrtApi) that only ever grows at its end, and
 * a custom operator is a struct of callbacks (OrtCustomOp). The pip wheel ships no headers, so this file
 * names the entries we call by their position in OrtApi (counted from onnxruntime_c_api.h, API version
 * 17, when KernelContext_ParallelFor arrived) and leaves the rest as anonymous slots. RegisterCustomOps
 * checks the count against a known entry (GetBuildInfoString must return "ORT Build Info") before using
 * any other, so a miscount fails loudly at load time instead of calling the wrong function.
 */
#ifndef HEARTH_ORT_ABI_H
#define HEARTH_ORT_ABI_H

#include <stddef.h>
#include <stdint.h>

#define HEARTH_ORT_API_VERSION 17

typedef struct OrtStatus OrtStatus;
typedef struct OrtValue OrtValue;
typedef struct OrtKernelInfo OrtKernelInfo;
typedef struct OrtKernelContext OrtKernelContext;
typedef struct OrtSessionOptions OrtSessionOptions;
typedef struct OrtCustomOpDomain OrtCustomOpDomain;
typedef struct OrtTensorTypeAndShapeInfo OrtTensorTypeAndShapeInfo;

enum { ORT_OK = 0, ORT_FAIL = 1, ORT_INVALID_ARGUMENT = 2, ORT_NOT_IMPLEMENTED = 9 };
enum { ELEMENT_UNDEFINED = 0, ELEMENT_FLOAT = 1, ELEMENT_UINT8 = 2, ELEMENT_INT32 = 6 };
enum { IO_REQUIRED = 0, IO_OPTIONAL = 1 };

/* Positions in struct OrtApi (0-based). */
enum {
    SLOT_CreateStatus = 0,
    SLOT_CreateCustomOpDomain = 26,
    SLOT_CustomOpDomain_Add = 27,
    SLOT_AddCustomOpDomain = 28,
    SLOT_GetTensorMutableData = 51,
    SLOT_GetTensorElementType = 60,
    SLOT_GetDimensionsCount = 61,
    SLOT_GetDimensions = 62,
    SLOT_GetTensorTypeAndShape = 65,
    SLOT_KernelInfoGetAttribute_float = 85,
    SLOT_KernelInfoGetAttribute_int64 = 86,
    SLOT_KernelContext_GetInputCount = 88,
    SLOT_KernelContext_GetInput = 90,
    SLOT_KernelContext_GetOutput = 91,
    SLOT_ReleaseStatus = 93,
    SLOT_ReleaseTensorTypeAndShapeInfo = 99,
    SLOT_GetBuildInfoString = 254,
    SLOT_KernelContext_ParallelFor = 274,
    SLOT_COUNT = 275,
};

typedef struct OrtApi {
    void *slot[SLOT_COUNT];
} OrtApi;

typedef struct OrtApiBase {
    const OrtApi *(*GetApi)(uint32_t version);
    const char *(*GetVersionString)(void);
} OrtApiBase;

/* Typed views of the slots above. */
typedef OrtStatus *(*CreateStatusFn)(int code, const char *msg);
typedef OrtStatus *(*CreateCustomOpDomainFn)(const char *domain, OrtCustomOpDomain **out);
typedef OrtStatus *(*CustomOpDomainAddFn)(OrtCustomOpDomain *domain, const void *op);
typedef OrtStatus *(*AddCustomOpDomainFn)(OrtSessionOptions *options, OrtCustomOpDomain *domain);
typedef OrtStatus *(*GetTensorMutableDataFn)(OrtValue *value, void **out);
typedef OrtStatus *(*GetTensorElementTypeFn)(const OrtTensorTypeAndShapeInfo *info, int *out);
typedef OrtStatus *(*GetDimensionsCountFn)(const OrtTensorTypeAndShapeInfo *info, size_t *out);
typedef OrtStatus *(*GetDimensionsFn)(const OrtTensorTypeAndShapeInfo *info, int64_t *dims, size_t n);
typedef OrtStatus *(*GetTensorTypeAndShapeFn)(const OrtValue *value, OrtTensorTypeAndShapeInfo **out);
typedef OrtStatus *(*AttrFloatFn)(const OrtKernelInfo *info, const char *name, float *out);
typedef OrtStatus *(*AttrInt64Fn)(const OrtKernelInfo *info, const char *name, int64_t *out);
typedef OrtStatus *(*GetInputCountFn)(const OrtKernelContext *ctx, size_t *out);
typedef OrtStatus *(*GetInputFn)(const OrtKernelContext *ctx, size_t index, const OrtValue **out);
typedef OrtStatus *(*GetOutputFn)(OrtKernelContext *ctx, size_t index, const int64_t *dims, size_t n,
                                  OrtValue **out);
typedef void (*ReleaseStatusFn)(OrtStatus *status);
typedef void (*ReleaseTypeShapeFn)(OrtTensorTypeAndShapeInfo *info);
typedef const char *(*GetBuildInfoStringFn)(void);
typedef OrtStatus *(*ParallelForFn)(const OrtKernelContext *ctx, void (*fn)(void *, size_t), size_t total,
                                    size_t num_batch, void *user_data);

/* struct OrtCustomOp, in its declared order, up to GetEndVersion (version 17). */
typedef struct OrtCustomOp {
    uint32_t version;
    void *(*CreateKernel)(const struct OrtCustomOp *op, const OrtApi *api, const OrtKernelInfo *info);
    const char *(*GetName)(const struct OrtCustomOp *op);
    const char *(*GetExecutionProviderType)(const struct OrtCustomOp *op);
    int (*GetInputType)(const struct OrtCustomOp *op, size_t index);
    size_t (*GetInputTypeCount)(const struct OrtCustomOp *op);
    int (*GetOutputType)(const struct OrtCustomOp *op, size_t index);
    size_t (*GetOutputTypeCount)(const struct OrtCustomOp *op);
    void (*KernelCompute)(void *kernel, OrtKernelContext *ctx);
    void (*KernelDestroy)(void *kernel);
    int (*GetInputCharacteristic)(const struct OrtCustomOp *op, size_t index);
    int (*GetOutputCharacteristic)(const struct OrtCustomOp *op, size_t index);
    int (*GetInputMemoryType)(const struct OrtCustomOp *op, size_t index);
    int (*GetVariadicInputMinArity)(const struct OrtCustomOp *op);
    int (*GetVariadicInputHomogeneity)(const struct OrtCustomOp *op);
    int (*GetVariadicOutputMinArity)(const struct OrtCustomOp *op);
    int (*GetVariadicOutputHomogeneity)(const struct OrtCustomOp *op);
    OrtStatus *(*CreateKernelV2)(const struct OrtCustomOp *op, const OrtApi *api, const OrtKernelInfo *info,
                                 void **kernel);
    OrtStatus *(*KernelComputeV2)(void *kernel, OrtKernelContext *ctx);
    void *InferOutputShapeFn;
    int (*GetStartVersion)(const struct OrtCustomOp *op);
    int (*GetEndVersion)(const struct OrtCustomOp *op);
} OrtCustomOp;

#endif
