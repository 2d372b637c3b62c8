"""Read one GGUF tensor as the layer form a precision asks for: packed blocks or dense rows."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from engine.errors import ModelFileError, UnsupportedModelError
from engine.model.gguf_file import GGUFModel
from engine.model.precision import Precision
from engine.model.quant import PackedWeight, is_packable, pack_rows, packed_bits
from engine.runtime import native_matmul

EMBEDDING = "token_embd.weight"


@dataclass
class RawRows:
    """A layer kept as the GGUF stores it, for Hearth's kernels (precision.native): row n is output
    feature n's blocks, byte for byte."""

    type_name: str
    raw: np.ndarray  # uint8 [N, bytes per row]
    n: int
    k: int


Layer = PackedWeight | RawRows | np.ndarray  # np.ndarray: dense fp32 [N, K]
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

    t = model.tensor(name)
    shape = [int(x) for x in reversed(t.shape)]
    data = np.asarray(t.data)
    try:
        if t.tensor_type in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
            out = data.astype(np.float32)
        else:
            out = _dequantize_by_rows(data, t.tensor_type)
    except NotImplementedError:
        raise UnsupportedModelError(f"{model.path.name}: tensor type {t.tensor_type.name} of {name} is not supported") from None
    if out.size != int(np.prod(shape)):
        raise ModelFileError(f"{model.path.name}: {name} holds {out.size} values, expected {shape}")
    return out.reshape(shape)


def _dequantize_by_rows(data: np.ndarray, tensor_type) -> np.ndarray:
    """gguf's dequantizer a few MB of rows at a time, into one fp32 array: whole, its temporaries
    would take several times the result."""
    from gguf import quants

    rows = data.reshape(-1, data.shape[-1]) if data.ndim > 1 else data.reshape(1, -1)
    chunk = max(1, (4 << 20) // max(1, rows.shape[1]))
    first = quants.dequantize(rows[:chunk], tensor_type)
    out = np.empty((rows.shape[0], first.shape[-1]), np.float32)
    out[:len(first)] = first
    for start in range(chunk, rows.shape[0], chunk):
        out[start:start + chunk] = quants.dequantize(rows[start:start + chunk], tensor_type)
    return out


def will_pack(model: GGUFModel, name: str, precision: Precision) -> bool:
    """Whether ``name`` runs from its GGUF blocks: 2- and 4-bit forms whenever the precision packs, 8-bit
    forms (Q8_0, and Q5_0/Q5_1/Q5_K/Q6_K, which MatMulNBits holds as 8-bit) where it packs them as
    8-bit or splits this model's into 4-bit planes."""
    type_name = model.tensor(name).tensor_type.name
    if precision.native:
        return native_matmul.supports(type_name, precision)
    if not (precision.packed and is_packable(type_name)):
        return False
    return packed_bits(type_name) < 8 or precision.packed_8bit or splits_8bit(model, precision)


def splits_8bit(model: GGUFModel, precision: Precision) -> bool:
    """Whether this model's 8-bit forms run as two 4-bit planes (precision.split_8bit_from says from
    which GGUF size)."""
    start = precision.split_8bit_from
    return not precision.packed_8bit and start is not None and model.path.stat().st_size >= start


def embedding_in_blocks(model: GGUFModel, precision: Precision) -> bool:
    """Whether the token table stays in GGUF blocks (rows gathered and dequantized in the graph) instead
    of dense rows: with fp32 activations, wherever the precision packs; in the matmul's form where the
    head can share it, else (an 8-bit table whose head is dense) as plain 8-bit blocks."""
    if precision.native:
        return native_matmul.supports(model.tensor(EMBEDDING).tensor_type.name, precision)
    return precision.compute == "float32" and precision.packed and is_packable(model.tensor(EMBEDDING).tensor_type.name)


def planes_for(model: GGUFModel, type_name: str, precision: Precision) -> int:
    """2 where this model's packable type runs as two 4-bit planes, else 1."""
    return 2 if packed_bits(type_name) == 8 and splits_8bit(model, precision) else 1


def gathered_table(model: GGUFModel, precision: Precision) -> PackedWeight | RawRows:
    """The token table as embedding_in_blocks keeps it: its GGUF rows under Hearth's kernels, else the
    head's packed form where the precision packs the type for a matmul, else plain 8-bit blocks."""
    if precision.native:
        type_name, raw, n, k = tensor_rows(model, EMBEDDING)
        return RawRows(type_name, raw.reshape(n, -1), n, k)
    if will_pack(model, EMBEDDING, precision):
        layer = linear(model, EMBEDDING, precision)
        assert isinstance(layer, PackedWeight)
        return layer
    type_name, raw, n, k = tensor_rows(model, EMBEDDING)
    return pack_rows(type_name, raw, n, k, EMBEDDING)


def linear(model: GGUFModel, name: str, precision: Precision, reorder_rows: RowOrder | None = None) -> Layer:
    """A linear layer in the form ``precision`` wants. ``reorder_rows``, an architecture's, reorders the
    output rows (llama's Q/K un-permute): applied to the stored rows, so to quantized rows as well."""
    type_name, raw, n, k = tensor_rows(model, name)
    if will_pack(model, name, precision) and precision.native:
        rows = raw.reshape(n, -1)
        return RawRows(type_name, np.ascontiguousarray(rows if reorder_rows is None else reorder_rows(rows)), n, k)
    if will_pack(model, name, precision):
        return pack_rows(type_name, raw if reorder_rows is None else reorder_rows(raw), n, k, name,
                         planes=planes_for(model, type_name, precision))
    w = dense(model, name)
    return w if reorder_rows is None else reorder_rows(w)
