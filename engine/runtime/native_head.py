"""The output head from the token table's 8-bit blocks (``ai.hearth.HeadQ8``, engine/native/hearth_head.c).

A model whose head is tied to a Q8_0 token embedding (the default model) is converted, for the exact
setting, with the table in MatMulNBits' 8-bit blocks (for the embedding's Gather) and the head as a
dense float32 [n_embd, vocab] MatMul: 113 MB read every step, ~30% of a decode step at 512 tokens.
The blocks hold the same numbers — each dense weight is exactly its code times its fp16 scale — in
a quarter of the bytes, so on the CPU the runner replaces that MatMul with HeadQ8 over the blocks.

The swap is made only when the graph has exactly that form (names from the converter: the dense head
``token_embd.weight_t``, the blocks ``token_embd.weight.qweight`` / ``.scales`` with zero point 128, no
4-bit planes and no offset correction) and when a sample of the dense head's columns equals the blocks
dequantized, bit for bit. Otherwise the MatMul stays. ``HEARTH_NATIVE_HEAD=0`` keeps it as well.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import NamedTuple

import numpy as np

from engine.arch import io_names
from engine.model import weights
from engine.model.quant import has_offsets, is_packable, packed_bits
from engine.runtime import native_library

log = logging.getLogger(__name__)

ENV_SWITCH = "HEARTH_NATIVE_HEAD"
OP_TYPE = "HeadQ8"
DENSE_HEAD = weights.EMBEDDING + "_t"  # blocks.py: the tied head as one dense [n_embd, vocab] matrix
CODES, SCALES = weights.EMBEDDING + ".qweight", weights.EMBEDDING + ".scales"  # packed_ops.py's names
# gather_rows constants that mark forms HeadQ8 does not read: 4-bit codes, two planes, an offset correction.
OTHER_FORMS = ("token_embd.low_mask", "token_embd.plane_zero", "token_embd.offset_axis")
SAMPLE_GROUPS, SAMPLE_WIDTH = 8, 8  # columns compared: 8 runs of 8 adjacent ones, spread over the vocabulary


def enabled() -> bool:
    return os.environ.get(ENV_SWITCH, "1") != "0"


def available() -> bool:
    """Whether a CPU session here would run HeadQ8 (the library exists for this platform, nothing turned
    it off); the memory estimates ask, since the dense head is then never loaded."""
    return enabled() and native_library.enabled() and native_library.platform_library() is not None


def table_type_qualifies(type_name: str) -> bool:
    """Whether a GGUF table of this type is converted into the blocks HeadQ8 reads (8-bit codes without
    offsets: Q8_0, Q6_K, Q5_0), so a dense head tied to it would run from them here."""
    return is_packable(type_name) and packed_bits(type_name) == 8 and not has_offsets(type_name) and available()


class TiedHead(NamedTuple):
    node: object  # the head's MatMul
    dense: object  # its dense [n_embd, vocab] matrix (an initializer)
    codes: object  # the table's 8-bit codes [vocab, blocks, block]
    scales: object  # their scales [vocab * blocks]


def tied_dense_head(graph) -> TiedHead | None:
    """The head and the table's blocks when ``graph`` has the form HeadQ8 reads, else None. Looks at the
    graph only (the weights' values: _blocks_match_dense)."""
    from onnx import numpy_helper

    inits = {t.name: t for t in graph.initializer}
    head = next((n for n in graph.node if n.op_type == "MatMul" and list(n.output) == [io_names.LOGITS]
                 and len(n.input) == 2 and n.input[1] == DENSE_HEAD), None)
    dense, codes, scales = inits.get(DENSE_HEAD), inits.get(CODES), inits.get(SCALES)
    if head is None or dense is None or codes is None or scales is None or any(n in inits for n in OTHER_FORMS):
        return None
    zero = inits.get("token_embd.zero")
    if zero is None or numpy_helper.to_array(zero).ravel().tolist() != [128.0]:
        return None
    if len(codes.dims) != 3 or len(dense.dims) != 2 or codes.data_type != 2 or dense.data_type != 1:
        return None
    vocab, blocks, block = codes.dims
    if list(dense.dims) != [blocks * block, vocab] or list(scales.dims) != [vocab * blocks]:
        return None
    return TiedHead(head, dense, codes, scales)


def swap_head(model, folder: Path, domain: str) -> bool:
    """Replace the dense tied head of ``model`` (an onnx ModelProto loaded without external data, whose
    data files are in ``folder``) with HeadQ8 over the embedding's blocks; True if it did."""
    from onnx import helper

    graph = model.graph
    found = tied_dense_head(graph)
    if found is None:
        return False
    head, dense, codes, scales = found
    if not _blocks_match_dense(folder, dense, codes, scales):
        log.warning("native head: the embedding's blocks differ from the dense head; keeping the MatMul")
        return False
    index = list(graph.node).index(head)
    graph.node.remove(head)
    graph.node.insert(index, helper.make_node(OP_TYPE, [head.input[0], CODES, SCALES], [io_names.LOGITS],
                                              name="hearth_head", domain=domain))
    graph.initializer.remove(dense)  # nothing else reads it: 113 MB the session no longer maps
    return True


def _located(folder: Path, tensor, itemsize: int) -> tuple[Path, int]:
    """(file, offset) of an initializer stored in an external data file, its extent checked against the file."""
    info = {e.key: e.value for e in tensor.external_data}
    path = folder / info["location"]
    offset, length = int(info.get("offset", 0)), int(info["length"])
    if length != int(np.prod(tensor.dims)) * itemsize or offset < 0 or offset + length > path.stat().st_size:
        raise ValueError(f"{tensor.name}: its external data does not fit {path.name}")
    return path, offset


def _blocks_match_dense(folder: Path, dense, codes, scales) -> bool:
    """Whether groups of columns sampled across the vocabulary read the same from the blocks as from the
    dense head. Read with plain file reads, a few bytes each: mapping the files would count every page
    a strided column touches in the process's memory (160 MiB for Gemma 3's head)."""
    vocab, blocks, block = codes.dims
    k = blocks * block
    handles: dict[Path, object] = {}
    try:
        (dense_file, dense_at), (codes_file, codes_at), (scales_file, scales_at) = (
            _located(folder, t, size) for t, size in ((dense, 4), (codes, 1), (scales, 4)))
        for path in {dense_file, codes_file, scales_file}:
            handles[path] = open(path, "rb")  # noqa: SIM115 (closed below, all together)

        def read(path: Path, offset: int, count: int, dtype) -> np.ndarray:
            size = count * np.dtype(dtype).itemsize
            fh = handles[path]
            fh.seek(offset)
            data = fh.read(size)
            if len(data) != size:
                raise ValueError(f"{path.name} ends early")
            return np.frombuffer(data, dtype=dtype)

        for first in np.linspace(0, vocab - SAMPLE_WIDTH, SAMPLE_GROUPS).astype(np.int64).tolist():
            code = read(codes_file, codes_at + first * k, SAMPLE_WIDTH * k, np.uint8)
            scale = read(scales_file, scales_at + first * blocks * 4, SAMPLE_WIDTH * blocks, np.float32)
            decoded = (code.reshape(SAMPLE_WIDTH, blocks, block).astype(np.float32) - 128.0) \
                * scale.reshape(SAMPLE_WIDTH, blocks, 1)
            dense_rows = [read(dense_file, dense_at + (r * vocab + first) * 4, SAMPLE_WIDTH, np.float32)
                          for r in range(k)]
            if not np.array_equal(decoded.reshape(SAMPLE_WIDTH, k), np.stack(dense_rows, axis=1)):
                return False
    except (KeyError, OSError, ValueError) as exc:
        log.info("native head: cannot read the weights to compare (%s)", exc)
        return False
    finally:
        for fh in handles.values():
            fh.close()
    return True
