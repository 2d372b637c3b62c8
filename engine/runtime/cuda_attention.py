"""Hearth's CUDA decode attention (``ai.hearth.cuda.Attention``, engine/native/cuda/hearth_cuda_attention.cuh) in
the CUDA graph's decode session (cuda_graph.py) in place of ONNX Runtime's GroupQueryAttention.

ONNX Runtime's CUDA GroupQueryAttention spends three to four kernel launches a layer on a decode step; Hearth's
kernel does the rotary, the KV append, the attention and its split-K merge in one. The converted graph is not
changed on disk: the decode session opens it with its GroupQueryAttention nodes renamed in memory (same inputs,
attributes and outputs, the KV cache in the same layout), as native_attention.py does for the CPU. Prefill keeps
ONNX Runtime's kernel (its flash attention for long prompts).

A node keeps ONNX Runtime's kernel when ``HEARTH_CUDA_ATTENTION=0`` or ``HEARTH_CUDA_KERNELS=0`` is set, the CUDA
library cannot run here, the KV cache is not fp16, or it uses what the kernel lacks (softcap, smooth softmax,
interleaved rotary, a head size other than 64, 96, 128 or 256, more than 8 query heads a KV head).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from engine.runtime import cuda_kernels

log = logging.getLogger(__name__)

ENV_SWITCH = "HEARTH_CUDA_ATTENTION"
OP_TYPE = "Attention"
HEAD_SIZES = (64, 96, 128, 256)
MAX_GROUP = 8
UNSUPPORTED_ATTRIBUTES = ("softcap", "smooth_softmax", "rotary_interleaved", "qk_output")
MAX_INPUTS = 9  # query, key, value, past key/value, seqlens_k, total length, cos and sin caches
EXTERNAL_DATA_FOLDER = "session.model_external_initializers_file_folder_path"


def unavailable() -> str:
    """Why the decode session keeps ONNX Runtime's attention, or "" when Hearth's can run."""
    if os.environ.get(ENV_SWITCH, "1") == "0":
        return f"{ENV_SWITCH}=0"
    return cuda_kernels.unavailable()


def _head_size(graph, past_key: str) -> int:
    """The head size of a past-key input [batch, kv heads, capacity, head size], or 0 where it is not fixed."""
    for value in graph.input:
        if value.name == past_key:
            dims = value.type.tensor_type.shape.dim
            return dims[3].dim_value if len(dims) == 4 and dims[3].HasField("dim_value") else 0
    return 0


def _qualifies(node, graph) -> bool:
    from onnx import helper

    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    heads, kv_heads = attrs.get("num_heads", 0), attrs.get("kv_num_heads", 0)
    return (len(node.input) <= MAX_INPUTS and not any(attrs.get(name) for name in UNSUPPORTED_ATTRIBUTES)
            and kv_heads > 0 and heads % kv_heads == 0 and heads // kv_heads <= MAX_GROUP
            and _head_size(graph, node.input[3]) in HEAD_SIZES)


def decode_graph(onnx_path: Path) -> bytes | None:
    """The graph at ``onnx_path`` with each GroupQueryAttention node the kernel can run renamed to
    ai.hearth.cuda.Attention, serialized; None when none qualifies (or the KV cache is not fp16)."""
    import onnx
    from onnx import helper

    model = onnx.load(str(onnx_path), load_external_data=False)
    meta = {p.key: p.value for p in model.metadata_props}
    if meta.get("hearth.kv_dtype") != "float16":
        return None
    renamed = 0
    for node in model.graph.node:
        if node.op_type == "GroupQueryAttention" and node.domain == "com.microsoft" and _qualifies(node, model.graph):
            node.op_type, node.domain = OP_TYPE, cuda_kernels.DOMAIN
            renamed += 1
    if not renamed:
        return None
    if cuda_kernels.DOMAIN not in {o.domain for o in model.opset_import}:
        model.opset_import.append(helper.make_opsetid(cuda_kernels.DOMAIN, 1))
    return model.SerializeToString()


def decode_model(onnx_path: Path, options) -> bytes | None:
    """What the decode session should open: the renamed graph (``options`` then set up for it: the kernel library
    registered unless the graph's MatMulQ already needs it, the weights file's folder named), or None to open the
    graph as it is (and why, logged)."""
    why = unavailable()
    if why:
        log.info("CUDA decode attention: ONNX Runtime's (%s)", why)
        return None
    model = decode_graph(onnx_path)
    if model is None:
        log.info("CUDA decode attention: %s does not qualify; ONNX Runtime's kernel runs", onnx_path.name)
        return None
    from engine.runtime import native_matmul

    if cuda_kernels.DOMAIN not in native_matmul.graph_domains(onnx_path):
        cuda_kernels.register_library(options)
    options.add_session_config_entry(EXTERNAL_DATA_FOLDER, str(onnx_path.parent))
    return model
