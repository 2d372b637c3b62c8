"""A packed layer (engine/model/quant.py) in the graph: its initializers, written once, and the rows of
its weight gathered and dequantized in the graph, so a token table can stay in its blocks and a tied
head can share them.

Gathered rows are exactly ``PackedWeight.dequantize()``'s: codes minus the zero point (2^(bits−1), or
0 and 8 for a split layer's two planes), times the block's scale, the planes summed, plus the block's
correction, each in fp32 and in that order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from onnx import TensorProto

from engine.model.onnx_writer import OnnxWriter
from engine.model.quant import BlockGeometry, PackedWeight


@dataclass(frozen=True)
class PackedInitializers(BlockGeometry):
    """A packed layer written into the graph: what MatMulNBits and a row gather need, by name."""

    bits: int
    n: int
    k: int
    block: int
    planes: int
    blob: str  # uint8 [N, K/block · planes, block · bits / 8]
    scales: str  # [N · K/block · planes]
    zero_points: str | None  # MatMulNBits' zero points (a split layer's, or float ones), else its default
    correction: str | None  # [K/block, N]: the per-block offsets the block-sum branch adds


def write_packed(w: OnnxWriter, name: str, layer: PackedWeight, dtype: type, zero_point_form: bool) -> PackedInitializers:
    """Write ``layer``'s arrays as initializers named after ``name``. ``dtype``: the activations' (the
    scales must match them). ``zero_point_form``: offsets as float zero points instead of a correction
    (below 8 bits, unsplit: ONNX Runtime's CPU kernel refuses 8-bit float zero points)."""
    if zero_point_form and layer.correction is not None and layer.bits < 8 and layer.planes == 1:
        blob, scales, zero_points = layer.with_zero_points()
        return PackedInitializers(
            layer.bits, layer.n, layer.k, layer.block, 1, w.constant(name + ".qweight", blob),
            w.constant(name + ".scales", scales.astype(dtype, copy=False)),
            w.constant(name + ".zero_points", zero_points.astype(dtype)), None)
    zero_points = None if layer.planes == 1 else w.constant(name + ".zero_points", layer.plane_zero_points())
    correction = None if layer.correction is None else w.constant(name + ".q4_1_offset", layer.correction.astype(dtype))
    return PackedInitializers(layer.bits, layer.n, layer.k, layer.block, layer.planes,
                              w.constant(name + ".qweight", layer.blob),
                              w.constant(name + ".scales", layer.scales.astype(dtype, copy=False)), zero_points, correction)


def gather_rows(w: OnnxWriter, p: PackedInitializers, ids: str, prefix: str) -> str:
    """Rows ``ids`` [batch, seq] of the layer's weight, dequantized: fp32 [batch, seq, K]."""
    if p.zero_points is not None and p.planes == 1:
        raise ValueError("rows of a layer with float zero points are not gathered")

    def const(suffix: str, value) -> str:
        return w.constant(f"{prefix}.{suffix}", np.array(value))

    nbp = p.n_blocks * p.planes
    codes = w.op1("Gather", [p.blob, ids], axis=0)  # [b, s, nbp, bytes per block]
    if p.bits == 4:  # element 2i in the low nibble of byte i, 2i + 1 in the high one
        low = w.op1("BitwiseAnd", [codes, const("low_mask", np.uint8(15))])
        high = w.op1("BitShift", [codes, const("shift", np.uint8(4))], direction="RIGHT")
        last = const("last_axis", np.array([-1], np.int64))
        pairs = w.op1("Concat", [w.op1("Unsqueeze", [low, last]), w.op1("Unsqueeze", [high, last])], axis=-1)
        codes = w.op1("Reshape", [pairs, const("codes_shape", [0, 0, nbp, p.block])])
    values = w.op1("Cast", [codes], to=TensorProto.FLOAT)
    # Each row's scales, read from the flat list MatMulNBits takes: entries id·nbp … id·nbp + nbp − 1.
    first = w.op1("Mul", [w.op1("Unsqueeze", [ids, const("ids_axis", np.array([-1], np.int64))]),
                          const("blocks_per_row", np.int64(nbp))])
    scales = w.op1("Gather", [p.scales, w.op1("Add", [first, const("block_index", np.arange(nbp, dtype=np.int64))])])
    if p.planes == 1:
        zero = const("zero", np.float32(1 << (p.bits - 1)))
        scaled = w.op1("Mul", [w.op1("Sub", [values, zero]), w.op1("Unsqueeze", [scales, const("scale_axis", [-1])])])
    else:  # [b, s, nb, plane, block]: plane 0 has zero point 0, plane 1 zero point 8; then summed
        grouped = w.op1("Reshape", [values, const("planes_shape", [0, 0, p.n_blocks, 2, p.block])])
        zero = const("plane_zero", np.array([[0.0], [8.0]], np.float32))
        plane_scales = w.op1("Reshape", [scales, const("plane_scales_shape", [0, 0, p.n_blocks, 2, 1])])
        scaled = w.op1("Mul", [w.op1("Sub", [grouped, zero]), plane_scales])
        scaled = w.op1("ReduceSum", [scaled, const("plane_axis", [3])], keepdims=0)  # [b, s, nb, block]
    if p.correction is not None:
        offsets = w.op1("Transpose", [w.op1("Gather", [p.correction, ids], axis=1)], perm=[1, 2, 0])  # [b, s, nb]
        scaled = w.op1("Add", [scaled, w.op1("Unsqueeze", [offsets, const("offset_axis", [-1])])])
    return w.op1("Reshape", [scaled, const("row_shape", [0, 0, p.k])])
