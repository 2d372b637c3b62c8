/* What Hearth's kernels share: the ONNX Runtime API pointer RegisterCustomOps obtained, typed access
 * to inputs and outputs, and the callbacks every CPU custom op of ours answers the same way. The ops
 * themselves: hearth_attention.c (ai.hearth.Attention) and hearth_head.c (ai.hearth.HeadQ8). */
#ifndef HEARTH_ORT_H
#define HEARTH_ORT_H

#include "ort_abi.h"

extern const OrtApi *hearth_api;

#define CALL(type, index) ((type)hearth_api->slot[index])

/* An input tensor: its data (``data`` for float32, ``bytes`` for any type) and up to 4 dimensions. */
typedef struct {
    const float *data;
    const uint8_t *bytes;
    int64_t dims[4];
    size_t rank;
} HearthTensor;

/* A status with ORT_INVALID_ARGUMENT and this message. */
OrtStatus *hearth_error(const char *message);
/* ``value`` as a tensor of element type ``element`` (an error otherwise, or above 4 dimensions). */
OrtStatus *hearth_tensor(const OrtValue *value, HearthTensor *t, int element);
int64_t hearth_count(const HearthTensor *t);
/* Output ``index`` allocated with these dimensions, as float32. */
OrtStatus *hearth_output(OrtKernelContext *ctx, size_t index, const int64_t *dims, size_t rank, float **out);

const char *hearth_cpu_provider(const struct OrtCustomOp *op);
int hearth_cpu_memory(const struct OrtCustomOp *op, size_t i);
int hearth_required(const struct OrtCustomOp *op, size_t i);
int hearth_zero(const struct OrtCustomOp *op);
int hearth_one(const struct OrtCustomOp *op);
int hearth_end_version(const struct OrtCustomOp *op);

/* The OrtCustomOp fields every op of ours fills the same way: CPU, fixed (non-variadic) inputs and
 * outputs, all outputs required, any opset version. */
#define HEARTH_CPU_OP_DEFAULTS                                                                      \
    .version = HEARTH_ORT_API_VERSION, .GetExecutionProviderType = hearth_cpu_provider,             \
    .GetOutputCharacteristic = hearth_required, .GetInputMemoryType = hearth_cpu_memory,            \
    .GetVariadicInputMinArity = hearth_one, .GetVariadicInputHomogeneity = hearth_zero,             \
    .GetVariadicOutputMinArity = hearth_one, .GetVariadicOutputHomogeneity = hearth_zero,           \
    .GetStartVersion = hearth_one, .GetEndVersion = hearth_end_version

extern const OrtCustomOp hearth_attention_op, hearth_head_op, hearth_gather_op;

#endif
