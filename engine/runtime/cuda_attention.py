"""Hearth's CUDA decode attention (``ai.hearth.cuda.Attention``, engine/native/cuda/hearth_cuda_attention.cuh) in
the CUDA graph's decode session (cuda_graph.py) in place of ONNX Runtime's GroupQueryAttention.

ONNX Runtime's CUDA GroupQueryAttention spends three to four kernel launches a layer on a decode step; Hearth's
kernel does the rotary, the KV append, the attention and its split-K merge in one. The converted graph is not
changed on disk: the decode session opens it with its GroupQueryAttention nodes renamed in memory (same inputs,
attributes and outputs, the KV cache in the same layout), as native_attention.py does for the CPU. Prefill keeps
ONNX Runtime's kernel (its flash attention for long prompts).

The rename also folds into the node what the graph does to Q, K and V before it: Gemma 3's and Qwen3's per-head
QK norms (their Split, Reshapes and SimplifiedLayerNormalizations: five launches a layer on ONNX Runtime's kernels,
~19 µs of Gemma 3 270M's 1.16 ms step on an H100) and Qwen2's QKV bias (an Add). On by default since an H100 run
passed every GPU test with it and a second the kernel and attention tests (2026-12-07);
``HEARTH_CUDA_ATTENTION_FOLD=0`` keeps those nodes.

A node keeps ONNX Runtime's kernel when ``HEARTH_CUDA_ATTENTION=0`` or ``HEARTH_CUDA_KERNELS=0`` is set, the CUDA
library cannot run here, the KV cache is not fp16, or it uses what the kernel lacks (softcap, smooth softmax,
interleaved rotary, a head size other than 64, 96, 128 or 256, more than 8 query heads a KV head).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from engine.runtime import cuda_kernels
from engine.runtime.native_attention import EXTERNAL_DATA_FOLDER, MAX_INPUTS, UNSUPPORTED_ATTRIBUTES

log = logging.getLogger(__name__)

ENV_SWITCH = "HEARTH_CUDA_ATTENTION"
FOLD_SWITCH = "HEARTH_CUDA_ATTENTION_FOLD"  # =0: leave the QK norms and the QKV bias to the graph's own nodes
OP_TYPE = "Attention"
HEAD_SIZES = (64, 96, 128, 256)
MAX_GROUP = 8
# Hearth's inputs after GroupQueryAttention's MAX_INPUTS: the QK norms' gains, then the packed Q|K|V's bias.
Q_GAIN_INPUT, K_GAIN_INPUT, QKV_BIAS_INPUT = MAX_INPUTS, MAX_INPUTS + 1, MAX_INPUTS + 2


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


def _producers(graph) -> dict:
    return {out: node for node in graph.node for out in node.output if out}


def _normed_part(producers: dict, name: str):
    """(the Split that ``name`` comes from through Reshape → SimplifiedLayerNormalization → Reshape, which of its
    outputs, the norm node, the two Reshapes), or None where ``name`` is not a head norm's output."""
    outer = producers.get(name)
    norm = producers.get(outer.input[0]) if outer is not None and outer.op_type == "Reshape" else None
    inner = producers.get(norm.input[0]) if norm is not None and norm.op_type == "SimplifiedLayerNormalization" else None
    split = producers.get(inner.input[0]) if inner is not None and inner.op_type == "Reshape" else None
    if split is None or split.op_type != "Split" or len(split.output) != 3:
        return None
    return split, list(split.output).index(inner.input[0]), norm, (inner, outer)


def _fold_qk_norms(graph, node) -> bool:
    """Node (renamed to Attention) reads the packed Q|K|V the head norms split apart, with the norms' gains as its
    inputs 9 and 10; the nodes no longer read are removed. False (nothing changed) where the pattern differs."""
    from onnx import helper

    producers = _producers(graph)
    if len(node.input) < 3 or not node.input[1] or not node.input[2]:
        return False
    q, k = _normed_part(producers, node.input[0]), _normed_part(producers, node.input[1])
    if q is None or k is None or q[0] is not k[0] or (q[1], k[1]) != (0, 1) or node.input[2] != q[0].output[2]:
        return False
    eps = [helper.get_attribute_value(a) for n in (q[2], k[2]) for a in n.attribute if a.name == "epsilon"]
    if len(eps) != 2 or eps[0] != eps[1] or len(q[2].input) < 2 or len(k[2].input) < 2:
        return False
    inputs = list(node.input) + [""] * (K_GAIN_INPUT + 1 - len(node.input))
    inputs[0:3] = [q[0].input[0], "", ""]
    inputs[Q_GAIN_INPUT], inputs[K_GAIN_INPUT] = q[2].input[1], k[2].input[1]
    del node.input[:]
    node.input.extend(inputs)
    node.attribute.append(helper.make_attribute("qk_norm_eps", float(eps[0])))
    _drop_unread(graph, [q[0], q[2], k[2], *q[3], *k[3]])
    return True


def _fold_qkv_bias(graph, node) -> bool:
    """Node (renamed to Attention, reading a packed Q|K|V) reads the projection before its bias Add, with the bias as
    its input 11; the Add goes where nothing else reads it. False (nothing changed) where the pattern differs."""
    if len(node.input) > MAX_INPUTS or (len(node.input) > 1 and node.input[1]):
        return False
    add = _producers(graph).get(node.input[0])
    constants = {i.name for i in graph.initializer}
    if add is None or add.op_type != "Add" or len(add.input) != 2 or add.input[1] not in constants:
        return False
    if sum(node.input[0] in n.input for n in graph.node) != 1:  # the biased Q|K|V read elsewhere too: keep the Add
        return False
    inputs = list(node.input) + [""] * (QKV_BIAS_INPUT + 1 - len(node.input))
    inputs[0], inputs[QKV_BIAS_INPUT] = add.input[0], add.input[1]
    del node.input[:]
    node.input.extend(inputs)
    _drop_unread(graph, [add])
    return True


def _drop_unread(graph, candidates: list) -> None:
    """Remove those of ``candidates`` none of whose outputs is read by a node or is a graph output, until none is."""
    outputs = {o.name for o in graph.output}
    while candidates:
        read = {i for n in graph.node for i in n.input} | outputs
        dead = [n for n in candidates if not any(o in read for o in n.output if o)]
        if not dead:
            return
        for n in dead:
            graph.node.remove(n)
            candidates.remove(n)


def _rename(model) -> bool:
    """Each GroupQueryAttention node of ``model`` the kernel can run renamed to ai.hearth.cuda.Attention (its Q, K and
    V preparation folded in unless FOLD_SWITCH is 0), the domain imported; False (nothing changed) when none qualifies
    or the KV cache is not fp16."""
    from onnx import helper

    if {p.key: p.value for p in model.metadata_props}.get("hearth.kv_dtype") != "float16":
        return False
    renamed = []
    for node in model.graph.node:
        if node.op_type == "GroupQueryAttention" and node.domain == "com.microsoft" and _qualifies(node, model.graph):
            node.op_type, node.domain = OP_TYPE, cuda_kernels.DOMAIN
            renamed.append(node)
    for node in renamed if os.environ.get(FOLD_SWITCH) != "0" else ():
        _fold_qk_norms(model.graph, node) or _fold_qkv_bias(model.graph, node)
    if renamed and cuda_kernels.DOMAIN not in {o.domain for o in model.opset_import}:
        model.opset_import.append(helper.make_opsetid(cuda_kernels.DOMAIN, 1))
    return bool(renamed)


def _load(onnx_path: Path):
    import onnx

    return onnx.load(str(onnx_path), load_external_data=False)


def decode_graph(onnx_path: Path) -> bytes | None:
    """The graph at ``onnx_path`` renamed for the decode session (``_rename``), serialized; None when nothing
    qualifies."""
    model = _load(onnx_path)
    return model.SerializeToString() if _rename(model) else None


def decode_model(onnx_path: Path, options) -> bytes | None:
    """What the decode session should open: the renamed graph (``options`` then set up for it: the kernel library
    registered unless the graph's MatMulQ already needs it, the weights file's folder named), or None to open the
    graph as it is (and why, logged)."""
    why = unavailable()
    if why:
        log.info("CUDA decode attention: ONNX Runtime's (%s)", why)
        return None
    model = _load(onnx_path)
    runs_matmul_q = cuda_kernels.DOMAIN in {o.domain for o in model.opset_import}  # the runner registered it then
    if not _rename(model):
        log.info("CUDA decode attention: %s does not qualify; ONNX Runtime's kernel runs", onnx_path.name)
        return None
    if not runs_matmul_q:
        cuda_kernels.register_library(options)
    options.add_session_config_entry(EXTERNAL_DATA_FOLDER, str(onnx_path.parent))
    return model.SerializeToString()
