"""A minimal ONNX graph writer whose weights stream straight into one external-data file.

Building TensorProtos in memory would hold every weight twice; writing each array to the data file
as it is added keeps conversion memory near one copy of the largest tensor.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO

import numpy as np
import onnx
from onnx import TensorProto, helper

from engine.private_files import open_private

ALIGN = 4096  # page-aligned offsets let ONNX Runtime memory-map initializers


class OnnxWriter:
    def __init__(self, data_path: Path):
        self.data_path = Path(data_path)
        self._fh: BinaryIO = os.fdopen(open_private(self.data_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "wb")
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self._counter = 0

    def fresh(self, hint: str) -> str:
        self._counter += 1
        return f"{hint}_{self._counter}"

    def constant(self, name: str, array: np.ndarray) -> str:
        """Add an initializer; small ones stay inline, big ones go to the data file."""
        array = np.ascontiguousarray(array)
        if array.nbytes < 1024:
            self.initializers.append(onnx.numpy_helper.from_array(array, name))
            return name
        offset = self._fh.tell()
        pad = (-offset) % ALIGN
        if pad:
            self._fh.write(b"\0" * pad)
            offset += pad
        self._fh.write(memoryview(array.reshape(-1).view(np.uint8)))  # no second copy of a large array
        self._external(name, helper.np_dtype_to_tensor_dtype(array.dtype), array.shape, offset, array.nbytes)
        return name

    def constant_blocks(self, name: str, shape: tuple[int, ...], dtype: np.dtype | type,
                        blocks: Iterable[np.ndarray]) -> str:
        """Add an initializer of ``shape`` written as it is made, its leading rows a block at a time: only
        one block is ever in memory (a long context's rotary tables; engine/arch/rope.py)."""
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if nbytes < 1024:
            return self.constant(name, np.concatenate([np.asarray(b, dtype) for b in blocks]).reshape(shape))
        start = self._fh.tell()
        offset = start + (-start) % ALIGN
        self._fh.write(b"\0" * (offset - start))
        for block in blocks:
            self._fh.write(memoryview(np.ascontiguousarray(block, dtype).reshape(-1).view(np.uint8)))
        if self._fh.tell() - offset != nbytes:
            raise ValueError(f"{name}: {self._fh.tell() - offset} bytes written for a {list(shape)} {dtype} tensor")
        self._external(name, helper.np_dtype_to_tensor_dtype(dtype), shape, offset, nbytes)
        return name

    def _external(self, name: str, data_type: int, shape: tuple[int, ...], offset: int, nbytes: int) -> None:
        tensor = TensorProto()
        tensor.name = name
        tensor.data_type = data_type
        tensor.dims.extend(shape)
        tensor.data_location = TensorProto.EXTERNAL
        for key, value in (("location", self.data_path.name), ("offset", str(offset)), ("length", str(nbytes))):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, value
        self.initializers.append(tensor)

    def op(
        self, op_type: str, inputs: list[str], n_out: int = 1, domain: str = "", name: str = "",
        outputs: list[str] | None = None, **attrs,
    ) -> list[str]:
        base = name or self.fresh(op_type)
        outputs = outputs or [f"{base}/{i}" for i in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, outputs, name=base, domain=domain or None, **attrs))
        return outputs

    def op1(self, op_type: str, inputs: list[str], domain: str = "", **attrs) -> str:
        return self.op(op_type, inputs, 1, domain, **attrs)[0]

    def add_input(self, name: str, elem_type: int, shape: list) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, elem_type, shape))
        return name

    def add_output(self, name: str, elem_type: int, shape: list) -> None:
        self.outputs.append(helper.make_tensor_value_info(name, elem_type, shape))

    def save(self, model_path: Path, metadata: dict[str, str]) -> None:
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self._fh.close()
        graph = helper.make_graph(self.nodes, "hearth", self.inputs, self.outputs, self.initializers)
        model = helper.make_model(
            graph,
            opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1),
                           *(helper.make_opsetid(d, 1) for d in sorted({n.domain for n in self.nodes} - {"", "com.microsoft"}))],
            producer_name="hearth",
        )
        model.ir_version = 10
        for key, value in metadata.items():
            entry = model.metadata_props.add()
            entry.key, entry.value = key, value
        with os.fdopen(open_private(model_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "wb") as fh:
            fh.write(model.SerializeToString())
            fh.flush()
            os.fsync(fh.fileno())

    def close(self) -> None:
        if not self._fh.closed:
            self._fh.close()
