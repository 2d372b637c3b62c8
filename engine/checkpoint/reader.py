"""Reading a checkpoint as untrusted input: every size is checked before anything is allocated.

The order follows the load pipeline: header → identity (fingerprints, then KV shape) → record headers
(bounds against the header, the model's shape and the file's size) → token ids (their own checksum)
→ rows (read straight into their destination, then checksummed; the caller commits them only after
they verify). A damaged record ends the usable part of the file: the records before it still load.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import numpy as np
import xxhash

from engine.checkpoint.format import (
    HEADER_SIZE,
    RECORD_HEADER_SIZE,
    CheckpointError,
    FileHeader,
    Identity,
    Reason,
    RecordInfo,
    unpack_header,
    unpack_record_header,
    xxh,
)

log = logging.getLogger(__name__)
BlocksFn = Callable[[int, int], Iterable[np.ndarray]]  # (start, end) → writable row blocks in file order


def io_error(path: Path, exc: OSError) -> CheckpointError:
    return CheckpointError(Reason.IO_ERROR, f"cannot read {path.name}: {exc.strerror or exc}")


class CheckpointReader:
    def __init__(self, path: Path):
        self.path = Path(path)
        try:
            self._fh = open(self.path, "rb", buffering=0)  # raw: readinto goes straight to the destination
            self.size = os.fstat(self._fh.fileno()).st_size
        except OSError as exc:
            raise io_error(self.path, exc) from None
        self.header: FileHeader | None = None

    def close(self) -> None:
        self._fh.close()

    def __enter__(self) -> CheckpointReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _read_at(self, offset: int, n: int) -> bytes:
        try:
            self._fh.seek(offset)
            return self._fh.read(n)
        except OSError as exc:
            raise io_error(self.path, exc) from None

    # header and identity --------------------------------------------------------------------------
    def read_header(self) -> FileHeader:
        self.header = unpack_header(self._read_at(0, HEADER_SIZE))
        return self.header

    def check_identity(self, identity: Identity) -> None:
        h = self.header or self.read_header()
        if h.model_fp != identity.model_fp:
            raise CheckpointError(Reason.MODEL_MISMATCH, f"made by another model ({h.label or 'unnamed'}, "
                                  f"fingerprint {h.model_fp.hex()[:12]} ≠ {identity.model_fp.hex()[:12]})")
        if h.tokenizer_fp != identity.tokenizer_fp:
            raise CheckpointError(Reason.TOKENIZER_MISMATCH, "made with another tokenizer or chat template "
                                  f"({h.tokenizer_fp.hex()[:12]} ≠ {identity.tokenizer_fp.hex()[:12]})")
        if h.shape != identity.shape:
            raise CheckpointError(Reason.LAYOUT, f"KV shape {h.shape} does not match the model's {identity.shape}")

    # records ----------------------------------------------------------------------------------------
    def scan(self) -> tuple[list[RecordInfo], CheckpointError | None]:
        """Every complete, verified record header in order, and what stopped the scan (None at a clean end)."""
        h = self.header or self.read_header()
        records: list[RecordInfo] = []
        offset, frontier, chain = HEADER_SIZE, 0, h.seed
        while offset < self.size:
            if offset + RECORD_HEADER_SIZE > self.size:
                return records, CheckpointError(Reason.TRUNCATED, f"{self.size - offset} stray bytes after the last "
                                                "complete record (a save was interrupted)")
            try:
                r = unpack_record_header(self._read_at(offset, RECORD_HEADER_SIZE), offset, chain)
                self._check_bounds(r, len(records), frontier)
            except CheckpointError as exc:
                return records, exc
            records.append(r)
            offset, frontier, chain = r.end_offset, r.end, r.header_xxh
        if not records:
            return records, CheckpointError(Reason.TRUNCATED, "the file has a header but no records")
        return records, None

    def _check_bounds(self, r: RecordInfo, index: int, frontier: int) -> None:
        shape = self.header.shape
        if r.seq != index or r.start != frontier or r.end <= r.start:
            raise CheckpointError(Reason.LAYOUT, f"record {index} covers tokens [{r.start}, {r.end}) "
                                  f"but should start at {frontier}")
        if r.end > shape.context_length:
            raise CheckpointError(Reason.TOO_LARGE, f"record {index} reaches token {r.end}, past the model's "
                                  f"context of {shape.context_length}")
        expected = shape.payload_bytes(r.n_tokens)
        if r.payload_bytes != expected:
            reason = Reason.TOO_LARGE if r.payload_bytes > expected else Reason.LAYOUT
            raise CheckpointError(reason, f"record {index} declares {r.payload_bytes} payload bytes; "
                                  f"{r.n_tokens} tokens need {expected}")
        if r.end_offset > self.size:
            raise CheckpointError(Reason.TRUNCATED, f"record {index} needs {r.end_offset - self.size} bytes "
                                  "more than the file holds (a save was interrupted)")

    def read_tokens(self, r: RecordInfo, vocab_size: int) -> list[int]:
        data = self._read_at(r.payload_offset, 4 * r.n_tokens)  # size already bounded by the file
        if len(data) != 4 * r.n_tokens:
            raise CheckpointError(Reason.TRUNCATED, f"record {r.seq}: token ids cut short")
        if xxh(data, self.header.seed) != r.tokens_xxh:
            raise CheckpointError(Reason.CHECKSUM, f"record {r.seq}: the token ids are damaged (checksum)")
        ids = np.frombuffer(data, dtype="<u4")
        if ids.size and int(ids.max()) >= vocab_size:
            raise CheckpointError(Reason.LAYOUT, f"record {r.seq}: token id {int(ids.max())} is outside "
                                  f"the vocabulary of {vocab_size}")
        return ids.tolist()

    def load_rows(self, records: list[RecordInfo], blocks: BlocksFn) -> tuple[int, CheckpointError | None]:
        """Read each record's rows into ``blocks(start, end)`` and verify them; return (records good, problem)."""
        for i, r in enumerate(records):
            hasher = xxhash.xxh3_64(seed=self.header.seed)
            try:
                self._fh.seek(r.payload_offset + 4 * r.n_tokens)
                for block in blocks(r.start, r.end):
                    view = memoryview(block).cast("B")
                    if self._fh.readinto(view) != len(view):
                        return i, CheckpointError(Reason.TRUNCATED, f"record {r.seq}: rows cut short")
                    hasher.update(view)
            except OSError as exc:
                return i, io_error(self.path, exc)
            if hasher.intdigest() != r.rows_xxh:
                return i, CheckpointError(Reason.CHECKSUM, f"record {r.seq} (tokens {r.start}–{r.end}): "
                                          "the KV rows are damaged (checksum)")
        return len(records), None

    def verify_all(self, vocab_size: int) -> tuple[list[RecordInfo], CheckpointError | None]:
        """Full check without a model: every record's tokens and rows, reading rows in bounded chunks."""
        records, problem = self.scan()
        shape = self.header.shape
        for i, r in enumerate(records):
            try:
                self.read_tokens(r, vocab_size)
            except CheckpointError as exc:
                return records[:i], exc

            def reused_block(start: int, end: int) -> Iterator[np.ndarray]:
                # One head's rows at a time into the same buffer: only the checksum matters here.
                block = np.empty(((end - start) * shape.head_dim,), dtype=shape.dtype)
                for _ in range(2 * shape.n_layers * shape.n_kv_heads):
                    yield block

            _, exc = self.load_rows([r], reused_block)
            if exc is not None:
                return records[:i], exc
        return records, problem
