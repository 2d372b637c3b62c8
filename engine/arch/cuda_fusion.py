"""A graph pass for the CUDA kernels' form (int4-cuda-blocks): each pre-norm whose only reader is a MatMulQ goes
into that MatMulQ (engine/native/cuda/hearth_cuda.cu: the GEMV stages RMSNorm(x + skip)·gamma itself and writes
x + skip as its second output, the new residual stream).

A small model's decode step is launch-bound (docs/cuda.md: 424 kernels a step at ~2.7 µs each on an H200 for the
default model), and these norms are two of them a layer. Norms read by anything else (the final norm, read by the
logits' Slice; Gemma's post-norms and the QK norms) stay ONNX Runtime's.
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING

from engine.runtime import cuda_kernels

if TYPE_CHECKING:  # onnx loads only when a conversion runs: the CLI's quick commands never import it
    from onnx import NodeProto

MS = "com.microsoft"


def fuse_norms(nodes: list[NodeProto], graph_outputs: set[str]) -> list[NodeProto]:
    """``nodes`` (in topological order) with every fusable pre-norm folded into the MatMulQ that reads it."""
    readers: dict[str, list[int]] = defaultdict(list)
    for i, node in enumerate(nodes):
        for name in node.input:
            if name:
                readers[name].append(i)
    replaced: dict[int, NodeProto] = {}  # index of a norm → the fused MatMulQ that takes its place
    dropped: set[int] = set()  # the MatMulQs moved up to their norm's place
    for i, norm in enumerate(nodes):
        fused = _fuse(norm, nodes, readers, graph_outputs)
        if fused is not None:
            matmul_at, node = fused
            replaced[i] = node
            dropped.add(matmul_at)
    return [replaced.get(i, node) for i, node in enumerate(nodes) if i not in dropped]


def _fuse(norm: NodeProto, nodes: list[NodeProto], readers: dict[str, list[int]],
          graph_outputs: set[str]) -> tuple[int, NodeProto] | None:
    """(the reader's index, the fused node) where ``norm`` can go into the MatMulQ that alone reads it."""
    with_skip = norm.op_type == "SkipSimplifiedLayerNormalization" and norm.domain == MS
    alone = norm.op_type == "SimplifiedLayerNormalization" and norm.domain in ("", "ai.onnx")
    if not (with_skip or alone):
        return None
    attrs = {a.name: a for a in norm.attribute}
    if alone and attrs.get("axis") is not None and attrs["axis"].i != -1:
        return None
    if with_skip and len(norm.input) > 3 and norm.input[3]:  # a bias: not ours to fold
        return None
    normed = norm.output[0]
    users = readers.get(normed, [])
    if len(users) != 1 or normed in graph_outputs:
        return None
    matmul = nodes[users[0]]
    if not (matmul.domain == cuda_kernels.DOMAIN and matmul.op_type == "MatMulQ" and matmul.input[0] == normed):
        return None
    if any(a.name in ("act", "eps") for a in matmul.attribute):
        return None
    side_outputs = [o for o in norm.output[1:3] if o]
    if any(readers.get(o) or o in graph_outputs for o in side_outputs):  # mean or inverse deviation read
        return None
    x, gamma = norm.input[0], norm.input[2] if with_skip else norm.input[1]
    skip = norm.input[1] if with_skip else ""
    summed = norm.output[3] if with_skip and len(norm.output) > 3 else ""
    weights = list(matmul.input[1:4]) + [""] * (4 - len(matmul.input))
    inputs = [x, *weights, skip, gamma]
    scratch = matmul.output[2] if len(matmul.output) > 2 else ""  # the 8-bit GEMV's, kept the third output
    outputs = [matmul.output[0], summed if skip else "", scratch]
    while not outputs[-1]:
        outputs.pop()
    eps = attrs["epsilon"].f if "epsilon" in attrs else 1e-5
    from onnx import helper

    node = helper.make_node("MatMulQ", inputs, outputs, name=matmul.name, domain=cuda_kernels.DOMAIN, eps=eps)
    node.attribute.extend(matmul.attribute)
    return users[0], node
