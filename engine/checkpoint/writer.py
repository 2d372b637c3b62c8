"""Writing checkpoints: a new file atomically, or one more record appended to an existing file.

A file's encoding (its layout id: ``exact`` rows at the KV dtype, or ``int8`` codes with a float16
scale per row) is chosen when the file is created and kept by every later append, so the records of
one file never mix encodings. The int8 writer quantizes each layer (in a small thread pool) before
the record is written; checksums cover the encoded bytes as stored.

A new file goes through ``atomic_write`` (temp file, fsync, rename, fsync the directory). An append
first cuts the file back to the last record worth keeping, then writes the record header and its
rows and fsyncs. A crash mid-append leaves a torn tail that the reader detects (the declared payload
runs past the end of the file, or a checksum fails) and the file falls back to its last complete
record; the next append cuts the torn tail off. An append that fails (a full disk) cuts its own tail off
at once, so the space it took is free again.
"""

from __future__ import annotations

import io
import logging
import os
import secrets
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from engine.checkpoint.format import (
    HEADER_SIZE,
    LAYOUT_INT8_ROWS,
    USAGE_OFFSET,
    FileHeader,
    Identity,
    RecordInfo,
    encoding_layout,
    layer_digest,
    pack_header,
    pack_record_header,
    pack_usage,
    rows_digest,
    xxh,
)
from engine.checkpoint.int8 import quantize_layer
from engine.fsutil import atomic_write

log = logging.getLogger(__name__)
QUANTIZE_THREADS = min(4, os.cpu_count() or 1)


@dataclass
class NewRecord:
    """What one record holds: tokens [start, end), their rows in file order, and the frontier reached."""

    start: int
    tokens: Sequence[int]
    blocks: Sequence[np.ndarray]  # per layer: K heads then V heads, each [n, head_dim], C-contiguous
    text_len: int
    text_sha: bytes
    reason: str

    @property
    def end(self) -> int:
        return self.start + len(self.tokens)


def now_ms() -> int:
    return int(time.time() * 1000)


def new_header(identity: Identity, encoding: str = "exact") -> FileHeader:
    return FileHeader(1, encoding_layout(encoding), identity.shape, secrets.token_bytes(16), identity.model_fp,
                      identity.tokenizer_fp, now_ms(), identity.label, now_ms(), 0)


def encode_layers(header: FileHeader, blocks: Sequence[np.ndarray]) -> list[list[np.ndarray]]:
    """A record's rows grouped by layer, as the file stores them: the row blocks themselves for the
    exact layout; [codes, scales] per layer for int8 (quantized in parallel: numpy releases the GIL)."""
    per_layer = len(blocks) // header.shape.n_layers
    layers = [list(blocks[i : i + per_layer]) for i in range(0, len(blocks), per_layer)]
    if header.layout != LAYOUT_INT8_ROWS:
        return layers
    with ThreadPoolExecutor(max_workers=QUANTIZE_THREADS) as pool:
        return [list(encoded) for encoded in pool.map(quantize_layer, layers)]


def _write_record(fh: BinaryIO, header: FileHeader, seq: int, chain: int, offset: int, rec: NewRecord) -> RecordInfo:
    token_bytes = np.asarray(rec.tokens, dtype="<u4").tobytes()
    layers = encode_layers(header, rec.blocks)
    rows = rows_digest([layer_digest(stored, header.seed) for stored in layers], header.seed)
    payload = len(token_bytes) + sum(memoryview(b).nbytes for stored in layers for b in stored)
    info = RecordInfo(seq, rec.start, rec.end, rec.text_len, rec.text_sha, now_ms(), rec.reason, payload,
                      xxh(token_bytes, header.seed), rows, 0, offset)
    packed = pack_record_header(info, chain)
    info.header_xxh = int.from_bytes(packed[-8:], "little")
    fh.write(packed)
    fh.write(token_bytes)
    for stored in layers:
        for block in stored:
            fh.write(memoryview(block).cast("B"))
    return info


def write_new(path: Path, identity: Identity, records: Sequence[NewRecord],
              encoding: str = "exact") -> tuple[FileHeader, list[RecordInfo], int]:
    """Create ``path`` atomically with ``records`` in ``encoding`` ("exact" or "int8"); return
    (header, record infos, bytes written)."""
    header = new_header(identity, encoding)
    with atomic_write(path) as fh:
        infos, offset = _write_all(fh, header, records)
    return header, infos, offset


def _write_all(fh: BinaryIO, header: FileHeader, records: Sequence[NewRecord]) -> tuple[list[RecordInfo], int]:
    infos: list[RecordInfo] = []
    fh.write(pack_header(header))
    offset, chain = HEADER_SIZE, header.seed
    for rec in records:
        info = _write_record(fh, header, len(infos), chain, offset, rec)
        infos.append(info)
        offset, chain = info.end_offset, info.header_xxh
    return infos, offset


def encode_new(identity: Identity, records: Sequence[NewRecord],
               encoding: str = "exact") -> tuple[FileHeader, list[RecordInfo], bytes]:
    """``write_new`` into bytes (a tier that keeps records in memory): the same bytes a file holds."""
    header = new_header(identity, encoding)
    buf = io.BytesIO()
    infos, _ = _write_all(buf, header, records)
    return header, infos, buf.getvalue()


def append_bytes(data: bytes, header: FileHeader, keep: Sequence[RecordInfo],
                 rec: NewRecord) -> tuple[bytes, RecordInfo, int]:
    """``append`` on bytes: (the new bytes, the record's info, bytes written)."""
    offset = cut_offset(keep)
    chain = keep[-1].header_xxh if keep else header.seed
    buf = io.BytesIO()
    buf.write(data[:offset])
    info = _write_record(buf, header, len(keep), chain, offset, rec)
    return buf.getvalue(), info, info.end_offset - offset


def cut_offset(keep: Sequence[RecordInfo]) -> int:
    """Where a checkpoint holding only the records in ``keep`` ends."""
    return keep[-1].end_offset if keep else HEADER_SIZE


def append(path: Path, header: FileHeader, keep: Sequence[RecordInfo], rec: NewRecord) -> tuple[RecordInfo, int]:
    """Cut ``path`` after the records in ``keep`` and append ``rec`` in the file's own encoding;
    return (its info, bytes written)."""
    offset = cut_offset(keep)
    chain = keep[-1].header_xxh if keep else header.seed
    fd = os.open(path, os.O_RDWR | getattr(os, "O_BINARY", 0))
    try:
        os.ftruncate(fd, offset)
        os.lseek(fd, offset, os.SEEK_SET)
        try:
            info = _write_record(_FdWriter(fd), header, len(keep), chain, offset, rec)
            os.fsync(fd)
        except BaseException:
            _cut_back(fd, offset)
            raise
    finally:
        os.close(fd)
    return info, info.end_offset - offset


class _FdWriter:
    """Unbuffered writes that finish or raise: no buffer is left to land past a cut-back after a failure
    (a buffered file would flush it again on close), and a short write is retried, never ignored."""

    def __init__(self, fd: int):
        self.fd = fd

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        while view:
            view = view[os.write(self.fd, view):]
        return len(data)


def _cut_back(fd: int, offset: int) -> None:
    """A failed append (a full disk) takes its torn tail with it: the file keeps its complete records and
    the space the tail took is free again for the conversation text. Best effort: the reader would also
    detect the tail, so a failure here must not hide the write's own error."""
    try:
        os.ftruncate(fd, offset)
        os.fsync(fd)
    except OSError as exc:
        log.warning("could not cut a failed append back to %d bytes: %s", offset, exc)


def cut(path: Path, keep: Sequence[RecordInfo]) -> None:
    """Drop every record after ``keep`` (the live state is a prefix of what the file holds)."""
    with open(path, "r+b") as fh:
        fh.truncate(cut_offset(keep))
        os.fsync(fh.fileno())


def update_usage(path: Path, header: FileHeader, last_used_ms: int, hits: int) -> None:
    """Rewrite the usage slot in place; a torn write there only loses the statistics, never the file."""
    with open(path, "r+b") as fh:
        fh.seek(USAGE_OFFSET)
        fh.write(pack_usage(header.seed, last_used_ms, hits))


def usage_patched(data: bytes, header: FileHeader, last_used_ms: int, hits: int) -> bytes:
    """``update_usage`` on bytes."""
    slot = pack_usage(header.seed, last_used_ms, hits)
    return data[:USAGE_OFFSET] + slot + data[USAGE_OFFSET + len(slot):]
