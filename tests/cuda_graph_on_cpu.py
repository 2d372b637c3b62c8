"""The int4-cuda-blocks graph run on the CPU, for tests on machines without a GPU: each ai.hearth.cuda op replaced by
what it computes in the CPU kernels' ops (ai.hearth.MatMulQ per matrix, the gate's activation as ONNX ops,
ai.hearth.GatherQ), with casts between the graph's fp16 and those ops' fp32. What this checks is the converter's
graph (which matrices go into one launch and in which order, gate before up, the activation, the table), so every
MatMulQ stands in with fp32 activations even where the CUDA op quantizes them to int8 (``numerics``): that moves a
random synthetic model's logits by up to ~20% of their spread (tests/test_graph_reference.py), which would hide a
wiring mistake. The CUDA kernels' own arithmetic is checked against a float64 reference on the GPU
(tests/test_cuda_kernels.py) and, lane by lane, on the CPU (bench/cuda_blocks_check.py)."""

from __future__ import annotations

from pathlib import Path

import onnx
from onnx import TensorProto, helper

from engine.runtime import cuda_kernels, native_matmul


def cpu_stand_in(onnx_path: Path, out_dir: Path) -> Path:
    """A copy of the graph at ``onnx_path`` with its CUDA ops replaced; returns the copy's path."""
    model = onnx.load(str(onnx_path))
    shapes = {init.name: list(init.dims) for init in model.graph.initializer}
    nodes = []
    for node in model.graph.node:
        if node.domain != cuda_kernels.DOMAIN:
            nodes.append(node)
            continue
        attrs = {a.name: a.i for a in node.attribute}
        name, out = node.name or node.output[0], node.output[0]
        if node.op_type == "GatherQ":
            k = _weights_per_row(attrs["type"], shapes[node.input[1]][1])
            nodes.append(helper.make_node("GatherQ", list(node.input), [name + "/f32"], domain=native_matmul.DOMAIN,
                                          type=attrs["type"], k=k))
            nodes.append(helper.make_node("Cast", [name + "/f32"], [out], to=TensorProto.FLOAT16))
            continue
        source = node.input[0]
        inputs = list(node.input) + [""] * (6 - len(node.input))
        skip, gamma = inputs[4], inputs[5]
        if gamma:  # the pre-norm folded in (engine/arch/cuda_fusion.py): ONNX Runtime's own norm, as before
            source = name + "/normed"
            eps = next(a.f for a in node.attribute if a.name == "eps")
            if skip:
                summed = node.output[1] if len(node.output) > 1 else ""
                nodes.append(helper.make_node("SkipSimplifiedLayerNormalization", [node.input[0], skip, gamma],
                                              [source, "", "", summed], domain="com.microsoft", epsilon=eps))
            else:
                nodes.append(helper.make_node("SimplifiedLayerNormalization", [node.input[0], gamma], [source],
                                              axis=-1, epsilon=eps))
        x = name + "/x32"
        nodes.append(helper.make_node("Cast", [source], [x], to=TensorProto.FLOAT))
        act = attrs.get("act", 0)
        if act:
            gate, up = name + "/gate", name + "/up"
            nodes.append(helper.make_node("Split", [x], [gate, up], axis=-1, num_outputs=2))
            gated = name + "/gated"
            if act == cuda_kernels.ACT_SILU:
                nodes.append(helper.make_node("Sigmoid", [gate], [name + "/sig"]))
                nodes.append(helper.make_node("Mul", [gate, name + "/sig"], [gated]))
            else:
                nodes.append(helper.make_node("Gelu", [gate], [gated], approximate="tanh"))
            x = name + "/act"
            nodes.append(helper.make_node("Mul", [gated, up], [x]))
        parts = []
        for i, weights in enumerate(w for w in node.input[1:4] if w):
            part = f"{name}/part{i}"
            nodes.append(helper.make_node("MatMulQ", [x, weights], [part], domain=native_matmul.DOMAIN,
                                          type=attrs[("type", "type1", "type2")[i]], fast=0))
            parts.append(part)
        y = parts[0]
        if len(parts) > 1:
            y = name + "/concat"
            nodes.append(helper.make_node("Concat", parts, [y], axis=-1))
        nodes.append(helper.make_node("Cast", [y], [out], to=TensorProto.FLOAT16))
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    others = [o for o in model.opset_import if o.domain not in (cuda_kernels.DOMAIN, native_matmul.DOMAIN)]
    del model.opset_import[:]
    model.opset_import.extend([*others, helper.make_opsetid(native_matmul.DOMAIN, 1)])
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "model.onnx"
    onnx.save(model, str(path), save_as_external_data=True, location="model.onnx.data")
    return path


def _weights_per_row(type_id: int, row_bytes: int) -> int:
    block_bytes, block_weights = {2: (18, 32), 3: (20, 32), 6: (22, 32), 7: (24, 32), 8: (34, 32), 12: (144, 256),
                                  13: (176, 256), 14: (210, 256)}[type_id]
    return row_bytes // block_bytes * block_weights
