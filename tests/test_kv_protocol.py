"""The KV cache row protocol (engine/runtime/kv_protocol.py) on the CPU cache, with real checkpoint
files: rows read out in checkpoint order and written back from a verifying reader round-trip exactly
(float32, float16, another dtype, int8 files); rows become visible only once verified; a damaged
record leaves the length at the last good record and nothing unverified in the buffers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine.checkpoint.format import Identity, KVShape, Reason, RecordInfo
from engine.checkpoint.int8 import dequantize_into, quantize_layer
from engine.checkpoint.reader import CheckpointReader
from engine.checkpoint.writer import NewRecord, write_new
from engine.runtime.kv_cache import KVCache
from engine.runtime.kv_protocol import BlocksFn, KVCacheProtocol, RowSource

LAYERS, HEADS, HEAD_DIM, CONTEXT = 3, 2, 8, 1024
SPANS = [(0, 40), (40, 100), (100, 130)]  # one record each
END = SPANS[-1][1]


def new_cache(dtype) -> KVCache:
    return KVCache(LAYERS, HEADS, HEAD_DIM, CONTEXT, dtype=dtype)


def filled_cache(dtype, seed: int = 0) -> KVCache:
    rng = np.random.default_rng(seed)
    shape = (LAYERS, HEADS, END, HEAD_DIM)
    cache = new_cache(dtype)
    cache.load(rng.standard_normal(shape).astype(dtype), rng.standard_normal(shape).astype(dtype))
    return cache


def save(cache: KVCache, path: Path, encoding: str = "exact") -> list[RecordInfo]:
    """Write the cache's rows as a checkpoint of three records, taking them through ``read_rows``."""
    identity = Identity(b"m" * 32, b"t" * 32, KVShape(LAYERS, HEADS, HEAD_DIM, CONTEXT, cache.dtype.name))
    pieces = [NewRecord(s, list(range(s, e)), cache.read_rows(s, e), e, bytes(32), "turn") for s, e in SPANS]
    _, records, _ = write_new(path, identity, pieces, encoding)
    return records


def restore(path: Path, cache: KVCache, first: int = 0) -> tuple[int, RowSource]:
    """Write records ``first``… of ``path`` into ``cache`` (from their start) through the protocol."""
    with CheckpointReader(path) as reader:
        reader.read_header()
        records, _ = reader.scan()
        rows = reader.rows(records[first:])
        return cache.write_rows(records[first].start, END, rows), rows


def damage_rows(path: Path, record: RecordInfo) -> None:
    data = bytearray(path.read_bytes())
    data[record.payload_offset + 4 * record.n_tokens + 5] ^= 0x10  # a K row of this record
    path.write_bytes(bytes(data))


def assert_cleared(cache: KVCache, start: int, end: int) -> None:
    for block in cache.host_blocks(start, end):
        assert not block.any(), "unverified rows must not linger in the buffers"


class Interrupted(Exception):
    pass


class Watched:
    """A row source passing a reader's rows through, noting the cache's length whenever the reader asks
    for a record's blocks, and optionally raising when it reaches token ``fail_at``."""

    def __init__(self, inner: RowSource, cache: KVCache, fail_at: int | None = None):
        self.inner, self.cache, self.fail_at = inner, cache, fail_at
        self.dtype = inner.dtype
        self.lengths: list[int] = []

    def fill(self, blocks: BlocksFn) -> int:
        def watched(start: int, end: int):
            self.lengths.append(self.cache.length)
            if self.fail_at is not None and start >= self.fail_at:
                raise Interrupted(f"stopped at {start}")
            return blocks(start, end)

        return self.inner.fill(watched)


# the shape of the protocol ---------------------------------------------------------------------------
def test_the_cache_and_the_reader_implement_the_protocol(tmp_path):
    cache = filled_cache(np.float32)
    save(cache, tmp_path / "c.hkv")
    assert isinstance(cache, KVCacheProtocol)
    with CheckpointReader(tmp_path / "c.hkv") as reader:
        reader.read_header()
        rows = reader.rows(reader.scan()[0])
        assert isinstance(rows, RowSource) and rows.dtype == np.float32
    blocks = cache.read_rows(10, 30)
    assert len(blocks) == LAYERS * 2 * HEADS
    keys, values = cache.export(10, 30)
    np.testing.assert_array_equal(blocks[0], keys[0, 0])  # layer 0, K, head 0
    np.testing.assert_array_equal(blocks[HEADS], values[0, 0])  # layer 0, V, head 0
    np.testing.assert_array_equal(blocks[-1], values[-1, -1])
    assert all(b.flags.c_contiguous and b.shape == (20, HEAD_DIM) for b in blocks)
    with pytest.raises(ValueError, match="outside"):
        cache.read_rows(0, END + 1)  # only committed rows leave the cache
    with pytest.raises(ValueError, match="cannot write"):
        new_cache(np.float32).write_rows(5, 10, rows)  # nothing may be skipped over


# round trips -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_rows_read_out_and_written_into_a_fresh_cache_round_trip_exactly(tmp_path, dtype):
    cache = filled_cache(dtype)
    save(cache, tmp_path / "c.hkv")
    fresh = new_cache(dtype)
    end, rows = restore(tmp_path / "c.hkv", fresh)
    assert end == fresh.length == END and rows.good == len(SPANS) and rows.problem is None
    for got, expected in zip(fresh.export(), cache.export(), strict=True):
        assert got.dtype == dtype
        np.testing.assert_array_equal(got, expected)


def test_rows_of_another_dtype_are_converted_on_the_way_in(tmp_path):
    half = filled_cache(np.float16)
    save(half, tmp_path / "c.hkv")
    full = new_cache(np.float32)
    assert restore(tmp_path / "c.hkv", full)[0] == END
    for got, expected in zip(full.export(), half.export(), strict=True):
        np.testing.assert_array_equal(got, expected.astype(np.float32))  # float16 → float32 is exact


@pytest.mark.parametrize("written,read", [(np.float32, np.float32), (np.float32, np.float16),
                                          (np.float16, np.float32), (np.float16, np.float16)])
def test_int8_rows_are_dequantized_into_either_float_cache(tmp_path, written, read):
    cache = filled_cache(written)
    save(cache, tmp_path / "c.hkv", "int8")
    fresh = new_cache(read)
    end, rows = restore(tmp_path / "c.hkv", fresh)
    assert rows.dtype is None and end == fresh.length == END
    per_layer = 2 * HEADS
    for s, e in SPANS:  # exactly what the int8 codec makes of each record's blocks
        blocks = cache.read_rows(s, e)
        for layer in range(LAYERS):
            codes, scales = quantize_layer(blocks[layer * per_layer : (layer + 1) * per_layer])
            expected = [np.empty((e - s, HEAD_DIM), read) for _ in range(per_layer)]
            dequantize_into(codes, scales, expected)
            got = fresh.read_rows(s, e)[layer * per_layer : (layer + 1) * per_layer]
            for g, x in zip(got, expected, strict=True):
                np.testing.assert_array_equal(g, x)


# verification ------------------------------------------------------------------------------------------
def test_rows_become_visible_only_after_their_record_verified(tmp_path):
    save(filled_cache(np.float32), tmp_path / "c.hkv")
    fresh = new_cache(np.float32)
    with CheckpointReader(tmp_path / "c.hkv") as reader:
        reader.read_header()
        records, _ = reader.scan()
        watched = Watched(reader.rows(records), fresh)
        assert fresh.write_rows(0, END, watched) == END
    assert watched.lengths == [0, 0, 0]  # no record was visible while the file was being read
    assert fresh.length == END


@pytest.mark.parametrize("encoding", ["exact", "int8"])
def test_a_checksum_failure_in_the_middle_keeps_the_good_records_and_clears_the_rest(tmp_path, encoding):
    cache = filled_cache(np.float32)
    path = tmp_path / "c.hkv"
    records = save(cache, path, encoding)
    damage_rows(path, records[1])
    fresh = new_cache(np.float32)
    end, rows = restore(path, fresh)
    assert end == fresh.length == records[0].end
    assert rows.good == 1 and rows.problem.reason == Reason.CHECKSUM
    assert_cleared(fresh, records[0].end, END)  # record 1 was read, failed, and was wiped; record 2 never came
    if encoding == "exact":
        np.testing.assert_array_equal(fresh.export()[0], cache.export(0, records[0].end)[0])


@pytest.mark.parametrize("file_dtype", [np.float32, np.float16], ids=["in-place", "converted"])
def test_rows_written_after_a_kept_prefix_leave_it_alone(tmp_path, file_dtype):
    cache = filled_cache(file_dtype)
    path = tmp_path / "c.hkv"
    records = save(cache, path)
    damage_rows(path, records[2])
    fresh = new_cache(np.float32)
    keys, values = cache.export(0, records[1].start)
    fresh.load(keys, values)
    end, rows = restore(path, fresh, first=1)  # records 1 and 2, on top of the rows before them
    assert end == fresh.length == records[1].end and rows.good == 1
    for got, expected in zip(fresh.export(), cache.export(0, records[1].end), strict=True):
        np.testing.assert_array_equal(got, expected.astype(np.float32))
    assert_cleared(fresh, records[1].end, END)


def test_a_fill_that_raises_leaves_nothing_it_wrote(tmp_path):
    save(filled_cache(np.float32), tmp_path / "c.hkv")
    fresh = new_cache(np.float32)
    with CheckpointReader(tmp_path / "c.hkv") as reader:
        reader.read_header()
        records, _ = reader.scan()
        with pytest.raises(Interrupted):
            fresh.write_rows(0, END, Watched(reader.rows(records), fresh, fail_at=records[2].start))
    assert fresh.length == 0  # records 0 and 1 had verified, but the restore as a whole did not finish
    assert_cleared(fresh, 0, END)


def test_the_staged_path_moves_only_verified_rows(tmp_path):
    """The GPU's path (rows gathered in a staging array, then moved in one copy) has its row
    arithmetic checked here on a CPU cache, where the staging array is ordinary memory and the move
    is a plain load; the copy itself runs only on a GPU (tests/test_gpu.py)."""
    cache = filled_cache(np.float32)
    path = tmp_path / "c.hkv"
    records = save(cache, path)
    damage_rows(path, records[2])
    fresh = new_cache(np.float32)
    keys, values = cache.export(0, records[1].start)
    fresh.load(keys, values)
    with CheckpointReader(path) as reader:
        reader.read_header()
        all_records, _ = reader.scan()
        rows = reader.rows(all_records[1:])
        assert fresh._write_staged(records[1].start, END, rows) == records[1].end
    assert fresh.length == records[1].end and rows.problem.reason == Reason.CHECKSUM
    for got, expected in zip(fresh.export(), cache.export(0, records[1].end), strict=True):
        np.testing.assert_array_equal(got, expected)
    assert_cleared(fresh, records[1].end, END)  # the failed record never left the staging array


class Stray:
    """A row source that asks for rows it was not given (before the ones it should fill)."""

    dtype = np.dtype(np.float32)

    def fill(self, blocks: BlocksFn) -> int:
        for block in blocks(0, 5):
            block[...] = 7.0
        return 5


def test_a_source_cannot_touch_committed_rows():
    cache = filled_cache(np.float32)
    before = cache.export(0, 40)
    with pytest.raises(ValueError, match="outside"):
        cache.write_rows(40, END, Stray())
    assert cache.length == 40
    for got, expected in zip(cache.export(), before, strict=True):
        np.testing.assert_array_equal(got, expected)
    assert_cleared(cache, 40, END)
