"""Read one GGUF tensor as the layer form a precision asks for: packed blocks or dense rows."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from engine.errors import ModelFileError, UnsupportedModelError
from engine.model.gguf_file import GGUFModel
from engine.model.precision import Precision
from engine.model.quant import PackedWeight, is_packable, pack_rows, packed_bits

Layer = PackedWeight | np.ndarray  # np.ndarray: dense fp32 [N, K]
RowOrder = Callable[[np.ndarray], np.ndarray]  # rows [N, ...] → the same rows, reordered


def tensor_rows(model: GGUFModel, name: str) -> tuple[str, np.ndarray, int, int]:
    """(type name, raw rows, out features N, in features K) of a 2-D weight."""
    t = model.tensor(name)
    shape = [int(x) for x in t.shape]
    if len(shape) != 2:
        raise ModelFileError(f"{model.path.name}: {name} should be 2-D, has shape {shape}")
    k, n = shape
    return t.tensor_type.name, np.asarray(t.data), n, k


def dense(model: GGUFModel, name: str) -> np.ndarray:
    """Any tensor type → fp32 with GGUF's row-major shape (rows = out features)."""
    import gguf
    from gguf import quants

    t = model.tensor(name)
    shape = [int(x) for x in reversed(t.shape)]
    data = np.asarray(t.data)
    try:
        if t.tensor_type in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
            out = data.astype(np.float32)
        else:
            out = quants.dequantize(data, t.tensor_type)
    except NotImplementedError:
        raise UnsupportedModelError(f"{model.path.name}: tensor type {t.tensor_type.name} of {name} is not supported") from None
    if out.size != int(np.prod(shape)):
        raise ModelFileError(f"{model.path.name}: {name} holds {out.size} values, expected {shape}")
    return out.reshape(shape)


def will_pack(model: GGUFModel, name: str, precision: Precision) -> bool:
    """Whether ``name`` stays in GGUF blocks: 2- and 4-bit forms whenever the precision packs, 8-bit
    forms (Q8_0, and Q5_0/Q5_1/Q5_K/Q6_K, which MatMulNBits holds as 8-bit) only where it packs 8-bit."""
    type_name = model.tensor(name).tensor_type.name
    if not (precision.packed and is_packable(type_name)):
        return False
    return packed_bits(type_name) < 8 or precision.packed_8bit


def linear(model: GGUFModel, name: str, precision: Precision, reorder_rows: RowOrder | None = None) -> Layer:
    """A linear layer in the form ``precision`` wants. ``reorder_rows``, an architecture's, reorders the
    output rows (llama's Q/K un-permute): applied to the stored rows, so to quantized rows as well."""
    type_name, raw, n, k = tensor_rows(model, name)
    if will_pack(model, name, precision):
        return pack_rows(type_name, raw if reorder_rows is None else reorder_rows(raw), n, k, name)
    w = dense(model, name)
    return w if reorder_rows is None else reorder_rows(w)
