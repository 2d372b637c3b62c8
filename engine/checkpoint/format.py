"""The checkpoint file format, byte by byte (``docs/checkpoint-format.md`` is the prose version).

A file is a fixed 256-byte header followed by records. The header names the model, tokenizer and KV
shape the rows belong to; it never changes after creation except for a small usage slot (last used,
hit count) that sits outside the header checksum so updating it can never invalidate the file.
Each record adds the K and V rows of positions [start, end) for every layer, the token ids of those
positions, and the frontier it reaches: the length and SHA-256 of the rendered text that tokens
[0, end) spell. Records chain: each record header's checksum is seeded with the previous one's, so a
record copied from another file, or moved within this one, does not verify.

Every integer is little-endian. All checksums are XXH3-64.
"""

from __future__ import annotations

import struct
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import xxhash

MAGIC = b"HEARTHKV"
FORMAT_VERSION = 1
HEADER_SIZE = 256
# Payload ABI: token ids (u32 × n), then for each layer K then V, each [kv_heads][n][head_dim].
LAYOUT_ROWS_V1 = 1  # "exact": rows at the KV dtype, bit for bit
# The same order of rows, each stored as head_dim int8 codes; per layer all codes first, then one
# float16 scale per (K/V, head, token) row: value = code × scale (docs/checkpoint-format.md §4b).
LAYOUT_INT8_ROWS = 2
ENCODINGS = {"exact": LAYOUT_ROWS_V1, "int8": LAYOUT_INT8_ROWS}
ENCODING_NAMES = {v: k for k, v in ENCODINGS.items()}
SCALE_DTYPE = np.dtype("<f2")
SCALE_DTYPE_CODE = 2  # the KV dtype codes below: 2 = float16
INT8_BITS = 8
RECORD_MAGIC = b"KVRC"
RECORD_HEADER_SIZE = 128
DTYPES = {1: np.dtype("<f4"), 2: np.dtype("<f2")}
DTYPE_CODES = {np.dtype(v).name: k for k, v in DTYPES.items()}
LABEL_SIZE = 48

# header: magic, version, header size, layout, dtype, flags, reserved, layers, kv heads, head dim,
# context length, the encoding's parameters (scale dtype code, code bits, elements per scale; all 0 for
# the exact layout), file id, model fp, tokenizer fp, created ms, label; then its checksum.
_HEADER = struct.Struct("<8sHHIBBHIIIIBBH16s32s32sQ48s")
HEADER_CHECKED = _HEADER.size  # 176: bytes 0..175 are covered by the header checksum at 176
USAGE_OFFSET = 184  # last used ms, hit count, checksum (seeded with the file id)
_USAGE = struct.Struct("<QQQ")
# record: magic, seq, start, end, text length, text sha256, saved ms, reason, reserved,
# payload bytes, tokens checksum, rows checksum (96 bytes), 24 reserved zero bytes; then the checksum
# of bytes 0..119 at 120.
_RECORD = struct.Struct("<4sIIIQ32sQB7sQQQ")
RECORD_CHECKED = 120

SAVE_REASONS = ("turn", "prefill", "switch", "shutdown", "rebuild", "prefix", "import")

if sys.byteorder != "little":  # the rows are written straight from memory
    raise ImportError("Hearth's checkpoint format needs a little-endian machine")


class Reason:
    """Why a checkpoint was not (fully) used: stable identifiers for logs, JSON and the UI."""

    BAD_MAGIC = "bad_magic"
    VERSION = "version"
    LAYOUT = "layout"
    MODEL_MISMATCH = "model_mismatch"
    TOKENIZER_MISMATCH = "tokenizer_mismatch"
    PREFIX_MISMATCH = "prefix_mismatch"
    CHECKSUM = "checksum"
    TRUNCATED = "truncated"
    TOO_LARGE = "too_large"
    IO_ERROR = "io_error"
    NON_FINITE = "non_finite"


PLAIN_WORDS = {
    Reason.BAD_MAGIC: "the saved context is not a Hearth checkpoint",
    Reason.VERSION: "the saved context was written by a different version of Hearth",
    Reason.LAYOUT: "the saved context has a layout this model cannot use",
    Reason.MODEL_MISMATCH: "the saved context was made by a different model",
    Reason.TOKENIZER_MISMATCH: "the saved context was made with a different tokenizer or chat template",
    Reason.PREFIX_MISMATCH: "the conversation no longer matches the saved context",
    Reason.CHECKSUM: "the saved context was damaged (checksum)",
    Reason.TRUNCATED: "the saved context was cut short",
    Reason.TOO_LARGE: "the saved context claims more than the model can hold",
    Reason.IO_ERROR: "the saved context could not be read",
    Reason.NON_FINITE: "the saved context holds values that are not numbers (NaN or infinity)",
}


class CheckpointError(Exception):
    """A checkpoint that cannot be used, with a stable ``reason`` and a specific message."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason

    @property
    def plain(self) -> str:
        return PLAIN_WORDS.get(self.reason, self.reason)


@dataclass(frozen=True)
class KVShape:
    n_layers: int
    n_kv_heads: int
    head_dim: int
    context_length: int
    dtype: str = "float32"

    @property
    def itemsize(self) -> int:
        return np.dtype(self.dtype).itemsize

    @property
    def bytes_per_token(self) -> int:
        """The minimum: layers × 2 (K and V) × KV heads × head size × bytes per element."""
        return self.n_layers * 2 * self.n_kv_heads * self.head_dim * self.itemsize

    def payload_bytes(self, n_tokens: int) -> int:
        return n_tokens * (4 + self.bytes_per_token)


@dataclass(frozen=True)
class Identity:
    """What a checkpoint must match to be used: the model, the tokenizer + template, the KV shape."""

    model_fp: bytes  # 32 bytes
    tokenizer_fp: bytes  # 32 bytes
    shape: KVShape
    label: str = ""


@dataclass
class FileHeader:
    version: int
    layout: int
    shape: KVShape
    file_id: bytes
    model_fp: bytes
    tokenizer_fp: bytes
    created_ms: int
    label: str
    last_used_ms: int = 0
    hits: int = 0

    @property
    def seed(self) -> int:
        return int.from_bytes(self.file_id[:8], "little")

    @property
    def encoding(self) -> str:
        return ENCODING_NAMES[self.layout]

    def layer_bytes(self, n_tokens: int) -> int:
        """Bytes one layer's rows of ``n_tokens`` tokens take in this file's payload."""
        return layer_bytes(self.shape, self.layout, n_tokens)

    @property
    def bytes_per_token(self) -> int:
        return self.shape.n_layers * self.layer_bytes(1)

    def payload_bytes(self, n_tokens: int) -> int:
        return n_tokens * (4 + self.bytes_per_token)


def layer_bytes(shape: KVShape, layout: int, n_tokens: int) -> int:
    """One layer's rows (K and V, every head) of ``n_tokens`` tokens as stored in ``layout``."""
    rows = 2 * shape.n_kv_heads * n_tokens
    if layout == LAYOUT_INT8_ROWS:
        return rows * (shape.head_dim + SCALE_DTYPE.itemsize)
    return rows * shape.head_dim * shape.itemsize


def encoding_layout(name: str) -> int:
    """The layout id of an encoding name ("exact" or "int8"); ValueError names the choices."""
    try:
        return ENCODINGS[name]
    except KeyError:
        raise ValueError(f"unknown KV encoding {name!r}; choose one of: {', '.join(ENCODINGS)}") from None


@dataclass
class RecordInfo:
    seq: int
    start: int
    end: int
    text_len: int
    text_sha: bytes
    saved_ms: int
    reason: str
    payload_bytes: int
    tokens_xxh: int
    rows_xxh: int
    header_xxh: int
    offset: int  # where the record header starts

    @property
    def n_tokens(self) -> int:
        return self.end - self.start

    @property
    def payload_offset(self) -> int:
        return self.offset + RECORD_HEADER_SIZE

    @property
    def end_offset(self) -> int:
        return self.payload_offset + self.payload_bytes


def xxh(data, seed: int) -> int:
    return xxhash.xxh3_64_intdigest(data, seed=seed)


def layer_digest(blocks: Iterable, seed: int) -> int:
    """XXH3-64 of one layer's rows as stored (its K heads, then its V heads), streamed block by block."""
    h = xxhash.xxh3_64(seed=seed)
    for block in blocks:
        h.update(memoryview(block).cast("B"))
    return h.intdigest()


def rows_digest(layer_digests: Sequence[int], seed: int) -> int:
    """A record's rows checksum: XXH3-64 over the layers' digests (u64 each, in layer order). Hashing
    layer by layer lets a reader verify layers in parallel while still covering every byte."""
    return xxh(struct.pack(f"<{len(layer_digests)}Q", *layer_digests), seed)


# header ------------------------------------------------------------------------------------------
def pack_header(h: FileHeader) -> bytes:
    label = h.label.encode("utf-8")[:LABEL_SIZE]
    params = (SCALE_DTYPE_CODE, INT8_BITS, h.shape.head_dim) if h.layout == LAYOUT_INT8_ROWS else (0, 0, 0)
    body = _HEADER.pack(MAGIC, FORMAT_VERSION, HEADER_SIZE, h.layout, DTYPE_CODES[h.shape.dtype], 0, 0,
                        h.shape.n_layers, h.shape.n_kv_heads, h.shape.head_dim, h.shape.context_length, *params,
                        h.file_id, h.model_fp, h.tokenizer_fp, h.created_ms, label)
    out = bytearray(HEADER_SIZE)
    out[:HEADER_CHECKED] = body
    struct.pack_into("<Q", out, HEADER_CHECKED, xxh(body, 0))
    out[USAGE_OFFSET : USAGE_OFFSET + _USAGE.size] = pack_usage(h.seed, h.last_used_ms, h.hits)
    return bytes(out)


def pack_usage(seed: int, last_used_ms: int, hits: int) -> bytes:
    body = struct.pack("<QQ", last_used_ms, hits)
    return body + struct.pack("<Q", xxh(body, seed))


def unpack_header(data: bytes) -> FileHeader:
    """Parse and check the fixed header; raise CheckpointError naming the first thing wrong."""
    if len(data) < 8 and MAGIC.startswith(data):
        raise CheckpointError(Reason.TRUNCATED, f"the file ends after {len(data)} bytes, inside the header")
    if data[:8] != MAGIC:
        raise CheckpointError(Reason.BAD_MAGIC, "not a Hearth checkpoint (wrong magic bytes)")
    if len(data) < HEADER_SIZE:
        raise CheckpointError(Reason.TRUNCATED, f"the header is {len(data)} bytes; it should be {HEADER_SIZE}")
    (_, version, header_size, layout, dtype_code, _flags, _r0, layers, heads, head_dim, context,
     scale_code, bits, group, file_id, model_fp, tok_fp, created, label) = _HEADER.unpack_from(data)
    if version != FORMAT_VERSION:
        raise CheckpointError(Reason.VERSION, f"format version {version}; this Hearth reads version {FORMAT_VERSION}")
    (stored,) = struct.unpack_from("<Q", data, HEADER_CHECKED)
    if stored != xxh(data[:HEADER_CHECKED], 0):
        raise CheckpointError(Reason.CHECKSUM, "the header checksum does not match (the header is damaged)")
    if header_size != HEADER_SIZE or layout not in ENCODING_NAMES or dtype_code not in DTYPES:
        raise CheckpointError(Reason.LAYOUT, f"unknown payload layout (layout {layout}, dtype code {dtype_code}, "
                                             f"header size {header_size})")
    # The exact layout leaves these bytes 0 (files written before int8 existed too) and ignores them.
    if layout == LAYOUT_INT8_ROWS and (scale_code, bits, group) != (SCALE_DTYPE_CODE, INT8_BITS, head_dim):
        raise CheckpointError(Reason.LAYOUT, f"unsupported int8 encoding: scale dtype code {scale_code}, {bits}-bit "
                                             f"codes, {group} elements per scale (this Hearth reads float16 "
                                             f"scales, 8-bit codes, one scale per row of {head_dim})")
    shape = KVShape(layers, heads, head_dim, context, DTYPES[dtype_code].name)
    header = FileHeader(version, layout, shape, file_id, model_fp, tok_fp, created,
                        label.rstrip(b"\0").decode("utf-8", "replace"))
    last_used, hits, check = _USAGE.unpack_from(data, USAGE_OFFSET)
    if check == xxh(data[USAGE_OFFSET : USAGE_OFFSET + 16], header.seed):  # a torn usage slot only loses stats
        header.last_used_ms, header.hits = last_used, hits
    return header


# records -----------------------------------------------------------------------------------------
def pack_record_header(r: RecordInfo, chain_seed: int) -> bytes:
    reason = SAVE_REASONS.index(r.reason) if r.reason in SAVE_REASONS else 255
    body = _RECORD.pack(RECORD_MAGIC, r.seq, r.start, r.end, r.text_len, r.text_sha, r.saved_ms, reason,
                        b"\0" * 7, r.payload_bytes, r.tokens_xxh, r.rows_xxh).ljust(RECORD_CHECKED, b"\0")
    return body + struct.pack("<Q", xxh(body, chain_seed))


def unpack_record_header(data: bytes, offset: int, chain_seed: int) -> RecordInfo:
    if data[:4] != RECORD_MAGIC:
        raise CheckpointError(Reason.CHECKSUM, f"no record marker at byte {offset} (damaged record)")
    (stored,) = struct.unpack_from("<Q", data, RECORD_CHECKED)
    if stored != xxh(data[:RECORD_CHECKED], chain_seed):
        raise CheckpointError(Reason.CHECKSUM, f"the record header at byte {offset} does not verify "
                                               "(damaged, or copied from another file)")
    (_, seq, start, end, text_len, text_sha, saved, reason, _r, payload, tok_x, rows_x) = _RECORD.unpack_from(data)
    name = SAVE_REASONS[reason] if reason < len(SAVE_REASONS) else "unknown"
    return RecordInfo(seq, start, end, text_len, text_sha, saved, name, payload, tok_x, rows_x, stored, offset)
