"""Reading a checkpoint as untrusted input: every size is checked before anything is allocated.

The order follows the load pipeline: header → identity (fingerprints, then KV shape) → record headers
(bounds against the header, the model's shape and the file's size) → token ids (their own checksum)
→ rows (read straight into their destination, then checksummed; the caller commits them only after
they verify). A damaged record ends the usable part of the file: the records before it still load.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import numpy as np

from engine.checkpoint.format import (
    HEADER_SIZE,
    RECORD_HEADER_SIZE,
    CheckpointError,
    FileHeader,
    Identity,
    Reason,
    RecordInfo,
    layer_digest,
    rows_digest,
    unpack_header,
    unpack_record_header,
    xxh,
)

log = logging.getLogger(__name__)
READ_THREADS = min(4, os.cpu_count() or 1)
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
        # The element type may differ (an fp16 GPU cache and an fp32 CPU one): rows are converted on load.
        if replace(h.shape, dtype=identity.shape.dtype) != identity.shape:
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
        """Read each record's rows into ``blocks(start, end)`` and verify them; return (records good, problem).

        Layers are read and hashed in parallel (file reads and XXH3 both release the GIL), each
        layer with one scattered read straight into its destination blocks.
        """
        n_layers = self.header.shape.n_layers
        with ThreadPoolExecutor(max_workers=READ_THREADS) as pool:
            for i, r in enumerate(records):
                dest = list(blocks(r.start, r.end))
                per_layer = len(dest) // n_layers
                offset = r.payload_offset + 4 * r.n_tokens
                jobs = []
                for layer in range(n_layers):
                    views = [memoryview(b).cast("B") for b in dest[layer * per_layer : (layer + 1) * per_layer]]
                    jobs.append(pool.submit(self._read_layer, offset, views))
                    offset += sum(v.nbytes for v in views)
                try:
                    digests = [job.result() for job in jobs]
                except OSError as exc:
                    return i, io_error(self.path, exc)
                if any(d is None for d in digests):
                    return i, CheckpointError(Reason.TRUNCATED, f"record {r.seq}: rows cut short")
                if rows_digest(digests, self.header.seed) != r.rows_xxh:
                    return i, CheckpointError(Reason.CHECKSUM, f"record {r.seq} (tokens {r.start}–{r.end}): "
                                              "the KV rows are damaged (checksum)")
        return len(records), None

    def _read_layer(self, offset: int, views: list[memoryview]) -> int | None:
        """Read one layer's rows at ``offset`` into ``views``; its digest, or None if the file ends early."""
        want = sum(v.nbytes for v in views)
        if hasattr(os, "preadv"):
            got = os.preadv(self._fh.fileno(), views, offset)
        else:  # no scattered reads here: one handle per call, so threads do not share a position
            with open(self.path, "rb", buffering=0) as fh:
                fh.seek(offset)
                got = sum(fh.readinto(v) or 0 for v in views)
        return layer_digest(views, self.header.seed) if got == want else None

    def verify_all(self, vocab_size: int) -> tuple[list[RecordInfo], CheckpointError | None]:
        """Full check without a model: every record's tokens and rows, one layer at a time."""
        records, problem = self.scan()
        shape = self.header.shape
        for i, r in enumerate(records):
            try:
                self.read_tokens(r, vocab_size)
            except CheckpointError as exc:
                return records[:i], exc
            layer_bytes = 2 * shape.n_kv_heads * r.n_tokens * shape.head_dim * shape.itemsize
            buffer = memoryview(bytearray(layer_bytes))  # bounded: the record already fits in the file
            offset, digests = r.payload_offset + 4 * r.n_tokens, []
            for _ in range(shape.n_layers):
                digest = self._read_layer(offset, [buffer])
                if digest is None:
                    return records[:i], CheckpointError(Reason.TRUNCATED, f"record {r.seq}: rows cut short")
                digests.append(digest)
                offset += layer_bytes
            if rows_digest(digests, self.header.seed) != r.rows_xxh:
                return records[:i], CheckpointError(Reason.CHECKSUM, f"record {r.seq} (tokens {r.start}–{r.end}): "
                                                    "the KV rows are damaged (checksum)")
        return records, problem
