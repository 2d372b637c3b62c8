"""Reading a checkpoint as untrusted input: every size is checked before anything is allocated.

The order follows the load pipeline: header → identity (fingerprints, then KV shape) → record headers
(bounds against the header, the model's shape and the file's size) → token ids (their own checksum)
→ rows (read straight into their destination, then checksummed; the caller commits them only after
they verify). A damaged record ends the usable part of the file: the records before it still load.

An int8 file (layout 2) is read a layer at a time into a reusable scratch buffer, hashed as stored,
its scales checked, and dequantized into the destination rows (float32 or float16), layers in
parallel as for exact files.
"""

from __future__ import annotations

import logging
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import numpy as np

from engine.checkpoint.format import (
    HEADER_SIZE,
    LAYOUT_INT8_ROWS,
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
from engine.checkpoint.int8 import dequantize_into, give_scratch, scales_valid, take_scratch
from engine.fsutil import open_regular
from engine.runtime.kv_protocol import BlocksFn  # (start, end) → writable row blocks in file order

log = logging.getLogger(__name__)
READ_THREADS = min(4, os.cpu_count() or 1)


def check_identity(h: FileHeader, identity: Identity) -> None:
    """Raise CheckpointError unless a file with header ``h`` was made by this model and tokenizer."""
    if h.model_fp != identity.model_fp:
        raise CheckpointError(Reason.MODEL_MISMATCH, f"made by another model ({h.label or 'unnamed'}, "
                              f"fingerprint {h.model_fp.hex()[:12]} ≠ {identity.model_fp.hex()[:12]})")
    if h.tokenizer_fp != identity.tokenizer_fp:
        raise CheckpointError(Reason.TOKENIZER_MISMATCH, "made with another tokenizer or chat template "
                              f"({h.tokenizer_fp.hex()[:12]} ≠ {identity.tokenizer_fp.hex()[:12]})")
    # The element type may differ (an fp16 GPU cache and an fp32 CPU one): rows are converted on load.
    if replace(h.shape, dtype=identity.shape.dtype) != identity.shape:
        raise CheckpointError(Reason.LAYOUT, f"KV shape {h.shape} does not match the model's {identity.shape}")


def io_error(path: Path, exc: OSError) -> CheckpointError:
    return CheckpointError(Reason.IO_ERROR, f"cannot read {path.name}: {exc.strerror or exc}")


class CheckpointReader:
    def __init__(self, path: Path, data: bytes | bytearray | None = None):
        """Read the file at ``path``; or, given ``data``, those bytes (a record a tier keeps in memory,
        ``path`` only naming it in messages): every check below is the same for both."""
        self.path = Path(path)
        self._mem = memoryview(data) if data is not None else None
        self._fh = None
        if self._mem is not None:
            self.size = self._mem.nbytes
        else:
            try:
                self._fh = open_regular(self.path, buffering=0)  # raw: readinto goes straight to the destination; a FIFO would hang
                self.size = os.fstat(self._fh.fileno()).st_size
            except OSError as exc:
                raise io_error(self.path, exc) from None
        self.header: FileHeader | None = None

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
        if self._mem is not None:
            self._mem.release()

    def __enter__(self) -> CheckpointReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _read_at(self, offset: int, n: int) -> bytes:
        if self._mem is not None:
            return bytes(self._mem[offset : offset + n])
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
        check_identity(self.header or self.read_header(), identity)

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
        expected = self.header.payload_bytes(r.n_tokens)
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

    def rows(self, records: list[RecordInfo]) -> RecordRows:
        """These records' rows as a verifying row source for a KV cache's ``write_rows``."""
        return RecordRows(self, records)

    def load_rows(self, records: list[RecordInfo], blocks: BlocksFn) -> tuple[int, CheckpointError | None]:
        """Read each record's rows into ``blocks(start, end)`` and verify them; return (records good, problem).

        Layers are read and hashed in parallel (file reads, XXH3 and numpy's arithmetic release the
        GIL). An exact file is read with one scattered read per layer straight into its destination
        blocks, which must have the file's dtype; an int8 file is read per layer into a scratch
        buffer and dequantized into the blocks, which may be float32 or float16.
        """
        h = self.header
        n_layers = h.shape.n_layers
        int8 = h.layout == LAYOUT_INT8_ROWS
        with ThreadPoolExecutor(max_workers=READ_THREADS) as pool:
            for i, r in enumerate(records):
                dest = list(blocks(r.start, r.end))
                per_layer = len(dest) // n_layers
                offset = r.payload_offset + 4 * r.n_tokens
                layer_size = h.layer_bytes(r.n_tokens)
                jobs = []
                for layer in range(n_layers):
                    mine = dest[layer * per_layer : (layer + 1) * per_layer]
                    if int8:
                        jobs.append(pool.submit(self._read_layer_int8, offset, layer_size, r.n_tokens, mine))
                    else:
                        jobs.append(pool.submit(self._read_layer_exact, offset, mine))
                    offset += layer_size
                try:
                    results = [job.result() for job in jobs]
                except OSError as exc:
                    return i, io_error(self.path, exc)
                digests = [res if res is None else res[0] for res in results]
                if any(d is None for d in digests):
                    return i, CheckpointError(Reason.TRUNCATED, f"record {r.seq}: rows cut short")
                if rows_digest(digests, h.seed) != r.rows_xxh:
                    return i, CheckpointError(Reason.CHECKSUM, f"record {r.seq} (tokens {r.start}–{r.end}): "
                                              "the KV rows are damaged (checksum)")
                bad = [layer for layer, res in enumerate(results) if not res[1]]
                if bad and not int8:
                    for block in dest:  # never leave NaN in a cache: attention multiplies masked rows by 0
                        block[...] = 0
                if bad:
                    return i, self._bad_scales(r, bad[0]) if int8 else self._non_finite(r, bad[0])
        return len(records), None

    def _non_finite(self, r: RecordInfo, layer: int) -> CheckpointError:
        # A resealed file (every checksum recomputed) once got NaN rows past verification; every turn
        # after it then failed with "the model computed invalid numbers".
        return CheckpointError(Reason.NON_FINITE, f"record {r.seq} (tokens {r.start}–{r.end}), layer {layer}: "
                               "a KV row holds NaN or infinity (a model's cache never does)")

    def _read_layer_exact(self, offset: int, dest: list[np.ndarray]) -> tuple[int, bool] | None:
        """Read one exact layer into ``dest``: (digest, every value finite), or None if the file ends early."""
        digest = self._read_layer(offset, [memoryview(b).cast("B") for b in dest])
        return None if digest is None else (digest, all(rows_finite(b) for b in dest))

    def _bad_scales(self, r: RecordInfo, layer: int) -> CheckpointError:
        return CheckpointError(Reason.LAYOUT, f"record {r.seq} (tokens {r.start}–{r.end}), layer {layer}: an int8 "
                               "row scale is negative, infinite or NaN (the writer stores only finite, "
                               "non-negative float16 scales)")

    def _read_into(self, offset: int, views: list[memoryview]) -> int:
        if self._mem is not None:
            return self._copy_into(offset, views)
        if hasattr(os, "preadv"):
            return os.preadv(self._fh.fileno(), views, offset)
        with open(self.path, "rb", buffering=0) as fh:  # one handle per call: threads share no position
            fh.seek(offset)
            return sum(fh.readinto(v) or 0 for v in views)

    def _copy_into(self, offset: int, views: list[memoryview]) -> int:
        """``_read_into`` for bytes in memory: as many bytes as the record holds, like a short read."""
        got = 0
        for view in views:
            piece = self._mem[offset + got : offset + got + view.nbytes]
            view[: piece.nbytes] = piece
            got += piece.nbytes
            if piece.nbytes < view.nbytes:
                break
        return got

    def _read_layer(self, offset: int, views: list[memoryview]) -> int | None:
        """Read one layer's rows at ``offset`` into ``views``; its digest, or None if the file ends early."""
        got = self._read_into(offset, views)
        return layer_digest(views, self.header.seed) if got == sum(v.nbytes for v in views) else None

    def _split_int8(self, buf: np.ndarray, n_tokens: int) -> tuple[np.ndarray, np.ndarray]:
        """(codes [2·heads, n, head_dim] int8, scales [2·heads, n] float16) viewed in one layer's bytes."""
        shape = self.header.shape
        rows = 2 * shape.n_kv_heads
        n_codes = rows * n_tokens * shape.head_dim
        codes = buf[:n_codes].view(np.int8).reshape(rows, n_tokens, shape.head_dim)
        scales = buf[n_codes : n_codes + 2 * rows * n_tokens].view("<f2").reshape(rows, n_tokens)
        return codes, scales

    def _read_layer_int8(self, offset: int, size: int, n_tokens: int,
                         dest: list[np.ndarray]) -> tuple[int, bool] | None:
        """Read one int8 layer (``size`` bytes, bounded by the record, which fits in the file) into a
        scratch buffer and dequantize it into ``dest``: (digest, scales valid), or None if the file
        ends early. Rows with invalid scales are left unwritten (the caller clears failed rows)."""
        buf = take_scratch(size)
        try:
            view = memoryview(buf)[:size]
            if self._read_into(offset, [view]) != size:
                return None
            digest = layer_digest([view], self.header.seed)
            codes, scales = self._split_int8(buf, n_tokens)
            ok = scales_valid(scales)
            if ok:
                dequantize_into(codes, scales, dest)
            return digest, ok
        finally:
            give_scratch(buf, READ_THREADS)

    def verify_all(self, vocab_size: int) -> tuple[list[RecordInfo], CheckpointError | None]:
        """Full check without a model: every record's tokens and rows, one layer at a time."""
        records, problem = self.scan()
        shape = self.header.shape
        for i, r in enumerate(records):
            try:
                self.read_tokens(r, vocab_size)
            except CheckpointError as exc:
                return records[:i], exc
            layer_bytes = self.header.layer_bytes(r.n_tokens)
            raw = np.empty(layer_bytes, np.uint8)  # bounded: the record already fits in the file
            buffer = memoryview(raw)
            offset, digests, bad = r.payload_offset + 4 * r.n_tokens, [], None
            for layer in range(shape.n_layers):
                digest = self._read_layer(offset, [buffer])
                if digest is None:
                    return records[:i], CheckpointError(Reason.TRUNCATED, f"record {r.seq}: rows cut short")
                digests.append(digest)
                int8 = self.header.layout == LAYOUT_INT8_ROWS
                if bad is None and not (scales_valid(self._split_int8(raw, r.n_tokens)[1]) if int8
                                        else rows_finite(raw.view(np.dtype(shape.dtype)))):
                    bad = layer
                offset += layer_bytes
            if rows_digest(digests, self.header.seed) != r.rows_xxh:
                return records[:i], CheckpointError(Reason.CHECKSUM, f"record {r.seq} (tokens {r.start}–{r.end}): "
                                                    "the KV rows are damaged (checksum)")
            if bad is not None:
                return records[:i], (self._bad_scales(r, bad) if self.header.layout == LAYOUT_INT8_ROWS
                                     else self._non_finite(r, bad))
        return records, problem


_EXPONENT_BITS = {2: (np.uint16, 0x7FFF, 0x7C00), 4: (np.uint32, 0x7FFFFFFF, 0x7F800000)}


def rows_finite(rows: np.ndarray) -> bool:
    """No NaN or infinity among float16/float32 rows: an all-ones exponent is what both are. The bit test
    takes 8 ms per 96 MiB of float16 rows where numpy's isfinite takes 79 (float32: 7 and 6)."""
    if rows.size == 0:
        return True
    kind = _EXPONENT_BITS.get(rows.dtype.itemsize)
    if kind is None or rows.dtype.kind != "f":
        return bool(np.isfinite(rows).all())
    bits, magnitude, infinity = kind
    return int(np.bitwise_and(rows.view(bits), magnitude).max()) < infinity


class RecordRows:
    """A checkpoint's records as a ``RowSource`` (engine/runtime/kv_protocol.py): ``fill`` reads each
    record into the blocks the cache gives and verifies it before the next; afterwards ``good`` counts
    the records that verified and ``problem`` says what stopped the rest (None when all did)."""

    def __init__(self, reader: CheckpointReader, records: list[RecordInfo]):
        h = reader.header
        self.reader, self.records = reader, records
        # Exact rows arrive as they are stored; int8 rows are dequantized into any float dtype.
        self.dtype = None if h.layout == LAYOUT_INT8_ROWS else np.dtype(h.shape.dtype)
        self.good, self.problem = 0, None

    def fill(self, blocks: BlocksFn) -> int:
        self.good, self.problem = self.reader.load_rows(self.records, blocks)
        return self.records[self.good - 1].end if self.good else self.records[0].start
