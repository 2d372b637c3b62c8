"""A fast, bounds-checked reader of the GGUF container (versions 2 and 3, little-endian).

The layout, from the GGUF specification: the magic ``GGUF``, a u32 version, a u64 tensor count and a
u64 metadata count; the metadata pairs (a string key, a u32 value type, the value); one info per
tensor (a string name, a u32 dimension count, that many u64 dimensions, fastest-varying first, a u32
ggml type, a u64 offset into the data section); then the data section, which starts at the next
multiple of ``general.alignment`` (32 when unset). A string is a u64 byte count and UTF-8 bytes; an
array is a u32 item type, a u64 count and the items.

Why not ``gguf.GGUFReader``: it makes a numpy view per array element, which for a 262,144-token
vocabulary takes seconds. Here number arrays are one ``np.frombuffer`` view each and string arrays
one Python pass, and tensors are views of one read-only memory map.

The file is untrusted: every count and length is checked against the bytes left before anything is
allocated, and every failure is one ModelFileError naming the file (UnsupportedModelError for a
well-formed file this engine cannot read).
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from engine.errors import ModelFileError, UnsupportedModelError

MAGIC = b"GGUF"
VERSIONS = (2, 3)  # 2 and 3 share the layout; 3 only allowed big-endian files, which we refuse
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # ggml's GGML_MAX_DIMS: no reader of the format accepts more
HEADER_BYTES = 24  # magic, version, tensor count, metadata count

_U32 = struct.Struct("<I").unpack_from
_U64 = struct.Struct("<Q").unpack_from

# Scalar value types: (struct format, numpy dtype of an array of them).
_NUMBERS: dict[GGUFValueType, tuple[struct.Struct, np.dtype]] = {
    t: (struct.Struct("<" + fmt), np.dtype(dt)) for t, fmt, dt in (
        (GGUFValueType.UINT8, "B", "<u1"), (GGUFValueType.INT8, "b", "<i1"),
        (GGUFValueType.UINT16, "H", "<u2"), (GGUFValueType.INT16, "h", "<i2"),
        (GGUFValueType.UINT32, "I", "<u4"), (GGUFValueType.INT32, "i", "<i4"),
        (GGUFValueType.FLOAT32, "f", "<f4"), (GGUFValueType.BOOL, "?", "?"),
        (GGUFValueType.UINT64, "Q", "<u8"), (GGUFValueType.INT64, "q", "<i8"),
        (GGUFValueType.FLOAT64, "d", "<f8"),
    )
}

# Tensor types stored as plain numbers, with the dtype of their data (gguf's reader uses the same);
# every other type is blocks, given as bytes.
_PLAIN_TENSORS: dict[GGMLQuantizationType, np.dtype] = {
    GGMLQuantizationType.F32: np.dtype("<f4"), GGMLQuantizationType.F16: np.dtype("<f2"),
    GGMLQuantizationType.F64: np.dtype("<f8"), GGMLQuantizationType.I8: np.dtype("i1"),
    GGMLQuantizationType.I16: np.dtype("<i2"), GGMLQuantizationType.I32: np.dtype("<i4"),
    GGMLQuantizationType.I64: np.dtype("<i8"),
}

_MIN_KV_BYTES = 8 + 4 + 1  # key length, value type, the smallest value
_MIN_TENSOR_INFO_BYTES = 8 + 4 + 4 + 8  # name length, dimension count, type, offset


@dataclass(frozen=True, eq=False)
class GGUFField:
    """One metadata pair. ``raw``: an int/float/bool, bytes (a string), a read-only numpy array (an
    array of numbers) or a list of bytes (an array of strings)."""

    name: str
    type: GGUFValueType
    item_type: GGUFValueType | None  # arrays only
    raw: Any
    offset: int

    @property
    def is_array(self) -> bool:
        return self.type == GGUFValueType.ARRAY

    @property
    def count(self) -> int:
        """Items in an array; 1 for a scalar."""
        return len(self.raw) if self.is_array else 1

    def contents(self, errors: str = "strict") -> Any:
        """The value as Python objects, as gguf's ``ReaderField.contents()`` gives it (UnicodeDecodeError
        on a string that is not UTF-8 unless ``errors`` says otherwise)."""
        if self.item_type == GGUFValueType.STRING:
            return [b.decode("utf-8", errors) for b in self.raw]
        if self.is_array:
            return self.raw.tolist()
        if self.type == GGUFValueType.STRING:
            return self.raw.decode("utf-8", errors)
        return self.raw


@dataclass(frozen=True, eq=False)
class GGUFTensor:
    """One tensor: ``shape`` in GGUF's order (fastest-varying first); ``data`` a read-only view of the
    file, in gguf's reader's form: numbers for plain types, else bytes shaped [..., bytes per row]."""

    name: str
    tensor_type: GGMLQuantizationType
    shape: tuple[int, ...]
    n_elements: int
    n_bytes: int
    data_offset: int  # from the start of the file
    data: np.ndarray


@dataclass(frozen=True, eq=False)
class GGUFContents:
    version: int
    fields: dict[str, GGUFField]  # in file order, with gguf's pseudo-fields GGUF.version/tensor_count/kv_count
    tensors: dict[str, GGUFTensor]  # in file order
    alignment: int
    data_start: int
    buffer: mmap.mmap | None = None  # the mapping the tensors view


class _Cursor:
    """Reads forward through the mapped file; never past its end."""

    def __init__(self, buf: mmap.mmap, fail):
        self.buf, self.pos, self.end, self.fail = buf, 0, len(buf), fail

    def take(self, n: int, what: str) -> int:
        """Skip ``n`` bytes, returning where they start."""
        if n > self.end - self.pos:
            raise self.fail(f"{what} at byte {self.pos} needs {n} bytes, the file has {self.end - self.pos} left")
        start = self.pos
        self.pos += n
        return start

    def u32(self, what: str) -> int:
        return _U32(self.buf, self.take(4, what))[0]

    def u64(self, what: str) -> int:
        return _U64(self.buf, self.take(8, what))[0]

    def string(self, what: str) -> bytes:
        n = self.u64(what + " length")
        start = self.take(n, what)
        return self.buf[start:start + n]

    def count(self, what: str, min_item_bytes: int) -> int:
        """A u64 count, refused if that many items of at least ``min_item_bytes`` cannot fit."""
        n = self.u64(what)
        if n > (self.end - self.pos) // max(min_item_bytes, 1):
            raise self.fail(f"{what} is {n}, more than the {self.end - self.pos} bytes left can hold")
        return n


def read_gguf(path: Path) -> GGUFContents:
    """Parse ``path``'s header, metadata and tensor infos; tensors become views of a memory map."""
    name = path.name

    def damaged(what: str) -> ModelFileError:
        return ModelFileError(f"{name} is damaged or truncated and cannot be read as GGUF ({what}); "
                              "download it again with 'hearth-cli model fetch'")

    with open(path, "rb") as fh:
        if fh.read(4) != MAGIC:
            raise ModelFileError(f"{name} is not a GGUF file (it does not start with the GGUF magic bytes)")
        size = fh.seek(0, 2)
        if size < HEADER_BYTES:
            raise damaged(f"the file is {size} bytes, shorter than a GGUF header")
        buf = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    cur = _Cursor(buf, damaged)
    cur.take(4, "magic")
    version = cur.u32("version")
    _check_version(version, name, damaged)
    n_tensors = cur.u64("tensor count")
    n_kv = cur.u64("metadata count")
    fields = {
        "GGUF.version": GGUFField("GGUF.version", GGUFValueType.UINT32, None, version, 4),
        "GGUF.tensor_count": GGUFField("GGUF.tensor_count", GGUFValueType.UINT64, None, n_tensors, 8),
        "GGUF.kv_count": GGUFField("GGUF.kv_count", GGUFValueType.UINT64, None, n_kv, 16),
    }
    if n_kv > (size - cur.pos) // _MIN_KV_BYTES:
        raise damaged(f"metadata count {n_kv} is more than the file can hold")
    for _ in range(n_kv):
        field = _read_field(cur, name, damaged)
        if field.name in fields:
            raise damaged(f"metadata key {_show(field.name)} appears twice")
        fields[field.name] = field
    if n_tensors > (size - cur.pos) // _MIN_TENSOR_INFO_BYTES:
        raise damaged(f"tensor count {n_tensors} is more than the file can hold")
    infos = [_read_tensor_info(cur, damaged) for _ in range(n_tensors)]
    alignment = _alignment(fields.get("general.alignment"), damaged)
    data_start = -(-cur.pos // alignment) * alignment
    tensors: dict[str, GGUFTensor] = {}
    for info in infos:
        tensor = _tensor(buf, info, data_start, alignment, name, damaged)
        if tensor.name in tensors:
            raise damaged(f"tensor {_show(tensor.name)} appears twice")
        tensors[tensor.name] = tensor
    _check_no_overlap(tensors.values(), damaged)
    return GGUFContents(version, fields, tensors, alignment, data_start, buf)


def _check_version(version: int, name: str, damaged) -> None:
    if version in VERSIONS:
        return
    if version == 1:
        raise UnsupportedModelError(f"{name} is GGUF version 1, an early form Hearth does not read; "
                                    "download a current GGUF of the model")
    if int.from_bytes(version.to_bytes(4, "little"), "big") in VERSIONS:
        raise UnsupportedModelError(f"{name} is a big-endian GGUF; Hearth reads little-endian GGUF files only")
    if 3 < version < 1000:
        raise UnsupportedModelError(f"{name} is GGUF version {version}, newer than this Hearth reads (2 and 3)")
    raise damaged(f"version field is {version}")


def _read_field(cur: _Cursor, name: str, damaged) -> GGUFField:
    offset = cur.pos
    key = _text(cur.string("metadata key"), "a metadata key", damaged)
    vtype = _value_type(cur.u32(f"type of {_show(key)}"), key, damaged)
    if vtype != GGUFValueType.ARRAY:
        return GGUFField(key, vtype, None, _read_scalar(cur, vtype, key), offset)
    itype = _value_type(cur.u32(f"item type of {_show(key)}"), key, damaged)
    if itype == GGUFValueType.ARRAY:  # ggml's own reader refuses these too
        raise UnsupportedModelError(f"{name}: metadata {_show(key)} is an array of arrays, which Hearth does not read")
    if itype == GGUFValueType.STRING:
        return GGUFField(key, vtype, itype, _read_strings(cur, key), offset)
    dtype = _NUMBERS[itype][1]
    n = cur.count(f"length of {_show(key)}", dtype.itemsize)
    start = cur.take(n * dtype.itemsize, f"items of {_show(key)}")
    return GGUFField(key, vtype, itype, np.frombuffer(cur.buf, dtype, n, start), offset)


def _read_scalar(cur: _Cursor, vtype: GGUFValueType, key: str) -> Any:
    if vtype == GGUFValueType.STRING:
        return cur.string(f"value of {_show(key)}")
    fmt = _NUMBERS[vtype][0]
    return fmt.unpack_from(cur.buf, cur.take(fmt.size, f"value of {_show(key)}"))[0]


def _read_strings(cur: _Cursor, key: str) -> list[bytes]:
    """An array of strings in one pass: every length is checked before its bytes are sliced."""
    n = cur.count(f"length of {_show(key)}", 8)
    buf, pos, end = cur.buf, cur.pos, cur.end
    out: list[bytes] = []
    append = out.append
    try:
        for _ in range(n):
            stop = pos + 8 + _U64(buf, pos)[0]  # struct.error if the length itself is past the end
            if stop > end:
                break
            append(buf[pos + 8:stop])
            pos = stop
    except struct.error:
        pass
    if len(out) != n:
        raise cur.fail(f"string {len(out)} of {_show(key)} at byte {pos} runs past the end of the file")
    cur.pos = pos
    return out


def _read_tensor_info(cur: _Cursor, damaged) -> tuple[str, tuple[int, ...], int, int]:
    name = _text(cur.string("tensor name"), "a tensor name", damaged)
    n_dims = cur.u32(f"dimension count of {_show(name)}")
    if n_dims > MAX_DIMS:
        raise damaged(f"tensor {_show(name)} has {n_dims} dimensions, GGUF allows at most {MAX_DIMS}")
    start = cur.take(8 * n_dims, f"dimensions of {_show(name)}")
    dims = struct.unpack_from(f"<{n_dims}Q", cur.buf, start)
    return name, dims, cur.u32(f"type of {_show(name)}"), cur.u64(f"offset of {_show(name)}")


def _alignment(field: GGUFField | None, damaged) -> int:
    if field is None:
        return DEFAULT_ALIGNMENT
    if field.type != GGUFValueType.UINT32:
        raise damaged(f"general.alignment is {field.type.name}, not UINT32")
    value = int(field.raw)
    if value == 0 or value & (value - 1):
        raise damaged(f"general.alignment is {value}, not a power of two")
    return value


def _tensor(buf: mmap.mmap, info: tuple[str, tuple[int, ...], int, int], data_start: int, alignment: int,
            file_name: str, damaged) -> GGUFTensor:
    name, dims, raw_type, offset = info
    try:
        ttype = GGMLQuantizationType(raw_type)
    except ValueError:
        raise UnsupportedModelError(f"{file_name}: tensor {_show(name)} has type {raw_type}, "
                                    "a tensor type this Hearth does not know") from None
    block, type_bytes = GGML_QUANT_SIZES[ttype]
    row = dims[0] if dims else 1
    if row % block:  # not damage but a shape the type cannot hold: say so, not "download it again"
        raise ModelFileError(
            f"{file_name}: tensor {_show(name)} is {ttype.name} with rows of {row} values, not a whole number of "
            f"{block}-value blocks; Hearth cannot read a tensor of this shape in that type (a fresh download "
            "will not change it: use a GGUF of this model made with another quantization)")
    n_elements = 1
    for d in dims:
        n_elements *= d
    n_bytes = n_elements // block * type_bytes
    if offset % alignment:
        raise damaged(f"tensor {_show(name)} starts at data offset {offset}, not a multiple of the alignment {alignment}")
    at = data_start + offset
    if at > len(buf) or n_bytes > len(buf) - at:
        raise damaged(f"tensor {_show(name)} ({n_bytes} bytes at byte {at}) runs past the end of the file "
                      f"({len(buf)} bytes)")
    shape = tuple(reversed(dims))
    dtype = _PLAIN_TENSORS.get(ttype)
    if dtype is None:  # blocks: bytes, the last axis a row's worth
        dtype = np.dtype(np.uint8)
        shape = shape[:-1] + (row // block * type_bytes,)
    try:
        data = np.frombuffer(buf, dtype, n_bytes // dtype.itemsize, at).reshape(shape)
    except ValueError:  # e.g. a zero dimension beside ones too large for numpy
        raise damaged(f"tensor {_show(name)} has an impossible shape {list(dims)}") from None
    return GGUFTensor(name, ttype, tuple(dims), n_elements, n_bytes, at, data)


def _check_no_overlap(tensors, damaged) -> None:
    spans = sorted((t.data_offset, t.data_offset + t.n_bytes, t.name) for t in tensors if t.n_bytes)
    for (_, end, a), (start, _, b) in zip(spans, spans[1:], strict=False):
        if start < end:
            raise damaged(f"tensors {_show(a)} and {_show(b)} overlap")


def _value_type(raw: int, key: str, damaged) -> GGUFValueType:
    try:
        return GGUFValueType(raw)
    except ValueError:
        raise damaged(f"metadata {_show(key)} has value type {raw}, which GGUF does not define") from None


def _text(raw: bytes, what: str, damaged) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise damaged(f"{what} is not UTF-8 text") from None


def _show(text: str, limit: int = 80) -> str:
    """A name for a one-line message: quoted, escaped, and cut short if long (it comes from the file)."""
    shown = repr(text[:limit])
    return shown if len(text) <= limit else shown + "…"
