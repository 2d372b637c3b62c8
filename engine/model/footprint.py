"""What a GGUF takes in memory under a precision, before any conversion: its tensor types, the form the
converter gives each (engine/model/weights.py decides), and the RAM of its weights and a full-context KV
cache. Behind ``hearth-cli model info``."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from engine.arch.config import ModelConfig
from engine.errors import UnsupportedModelError
from engine.model.gguf_file import GGUFModel
from engine.model.precision import DEFAULT_PRECISION, get_precision
from engine.model.quant import is_packable, pack_rows
from engine.model.weights import EMBEDDING, embedding_in_blocks, planes_for, tensor_rows, will_pack
from engine.runtime import native_head, native_matmul
from engine.types import ModelFootprint, WeightTypeUse

_FLOAT_TYPES = frozenset({"F32", "F16", "BF16", "F64"})


def model_footprint(gguf: Path | GGUFModel, weights: str = DEFAULT_PRECISION) -> ModelFootprint:
    """The GGUF's tensor types, the form ``weights`` gives each (engine/model/weights.py decides), and an
    estimate of the RAM its weights and a full-context KV cache take. Needs no conversion, and works for
    an architecture that cannot run yet (then without the KV cache). ``gguf``: a path, or the file
    already open (saves reading its header again)."""
    model = gguf if isinstance(gguf, GGUFModel) else GGUFModel(gguf)
    precision = native_matmul.running(weights)
    tied = not model.has_tensor("output.weight")
    totals: dict[str, list] = {}  # type → [tensors, form, file bytes, ram bytes, fp32 bytes]
    for t in model.tensors:
        name = t.name
        form, ram = _tensor_form_and_ram(model, name, precision, tied)
        row = totals.setdefault(t.tensor_type.name, [0, form, 0, 0, 0])
        row[0] += 1
        row[2] += int(t.n_bytes)
        row[3] += ram
        row[4] += int(t.n_elements) * 4
        if form == "unsupported":
            row[1] = form
    types = {k: WeightTypeUse(*v) for k, v in sorted(totals.items())}
    kv_dtype = precision.compute
    from engine.arch import model_config  # above the file reader: imported when a footprint is asked for

    try:
        cfg = model_config(model)
    except UnsupportedModelError:
        cfg = None
    kv = None if cfg is None else (cfg.n_layers * 2 * cfg.n_head_kv * cfg.head_dim * cfg.context_length
                                   * np.dtype(kv_dtype).itemsize)
    return ModelFootprint(str(model.value("general.architecture", "")), precision.name, types,
                          sum(u.ram_bytes for u in types.values()), sum(u.dense_fp32_bytes for u in types.values()),
                          kv_dtype, None if cfg is None else cfg.context_length, kv)


def rotary_table_bytes(cfg: ModelConfig, weights: str = DEFAULT_PRECISION) -> int:
    """Bytes of the rotary cos/sin tables the converted graph holds as constants: [context_length,
    rope_dim / 2] each, in the activations' type, a second pair where Gemma 3's local layers rotate with
    another base. Not weights (``model info`` lists those), but loaded as they are: 1.0 GB for a declared
    1,000,000-token context with 256-dim heads, which the library's estimate before a conversion missed."""
    pairs = 2 if cfg.extras.get("local_layers") else 1
    itemsize = 2 if get_precision(weights).compute == "float16" else 4
    return pairs * 2 * cfg.context_length * (cfg.rope_dim // 2) * itemsize


def _tensor_form_and_ram(model, name: str, precision, tied: bool) -> tuple[str, int]:
    """(form, estimated bytes in the converted model) of one tensor, by the converter's own rules:
    1-D tensors are vectors in the activations' type; matrices are packed where ``will_pack`` says so, else dense; the
    token table as ``Graph.embed`` keeps it, plus the head when tied and the two cannot share."""
    t = model.tensor(name)
    shape = [int(x) for x in t.shape]
    type_name = t.tensor_type.name
    elements = int(t.n_elements)
    if len(shape) != 2:  # norms and biases, in the activations' type
        return "dense", elements * (2 if precision.compute == "float16" else 4)
    # Dense matrices are stored in the precision's dense dtype, or in fp16 where activations are fp16.
    itemsize = 2 if "float16" in (precision.dense_dtype, precision.compute) else 4
    dense_bytes = elements * itemsize
    if not _dequantizable(t):
        return "unsupported", dense_bytes
    if precision.native and native_matmul.supports(type_name, precision):  # the GGUF's rows as they are; a tied head shares them
        return "packed", int(t.n_bytes)
    packed = will_pack(model, name, precision)
    form = "packed" if packed else "dense" if type_name in _FLOAT_TYPES or is_packable(type_name) else "dense fallback"
    if name != EMBEDDING:
        return form, _packed_bytes(model, name, precision) if packed else dense_bytes
    # The table: in the precision's packed form, which a tied head shares; else dense rows, which a tied
    # dense head shares, and a tied packed head does not.
    if embedding_in_blocks(model, precision):
        if packed:  # in the head's form, shared when tied
            return "packed", _packed_bytes(model, name, precision)
        table = _packed_bytes(model, name, precision, planes=1)  # plain 8-bit blocks beside a dense head
        return "packed", table + (dense_bytes if tied and not native_head.table_type_qualifies(type_name) else 0)
    if not (tied and packed):
        return form, dense_bytes
    return "packed", dense_bytes + _packed_bytes(model, name, precision)


def _packed_bytes(model, name: str, precision, planes: int = 0) -> int:
    """A packed layer's bytes in the form the precision runs it (or as ``planes``): pack one row for real
    and scale by the rows (everything a layer holds grows linearly with them), so the layout stays
    quant.py's alone."""
    type_name, raw, n, k = tensor_rows(model, name)
    one = pack_rows(type_name, raw.reshape(n, -1)[:1], 1, k, name, planes or planes_for(model, type_name, precision))
    return one.stored_bytes(2 if precision.compute == "float16" else 4) * n


def _dequantizable(tensor) -> bool:
    """Whether gguf can turn this type into floats (tried on the first row only)."""
    from gguf import quants

    if tensor.tensor_type.name in _FLOAT_TYPES:
        return True
    try:
        quants.dequantize(np.asarray(tensor.data).reshape(int(tensor.shape[-1]), -1)[:1], tensor.tensor_type)
    except (NotImplementedError, ValueError):
        return False
    return True


def largest_dense_matmul_bytes(gguf: Path | GGUFModel, weights: str = DEFAULT_PRECISION) -> int:
    """Bytes of the largest matrix ``weights`` keeps dense as a MatMul's weight (0 when every one is
    packed). ONNX Runtime prepacks such a matrix into a copy while a session loads, so for a moment it is
    in memory twice: the load's peak (engine/model/memory.py)."""
    model = gguf if isinstance(gguf, GGUFModel) else GGUFModel(gguf)
    precision = native_matmul.running(weights)
    itemsize = 2 if "float16" in (precision.dense_dtype, precision.compute) else 4
    tied = not model.has_tensor("output.weight")
    largest = 0
    for t in model.tensors:
        if len(t.shape) != 2 or will_pack(model, t.name, precision):
            continue
        if t.name == EMBEDDING and not tied:  # a dense table alone is only gathered from, never prepacked
            continue
        if t.name == EMBEDDING and embedding_in_blocks(model, precision) and native_head.table_type_qualifies(t.tensor_type.name):
            continue  # the tied head runs from the table's blocks: no dense copy at all
        largest = max(largest, int(t.n_elements) * itemsize)
    return largest
