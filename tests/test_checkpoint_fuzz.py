"""Fuzzing the checkpoint reader: a file on disk is untrusted, whatever it holds. Mutated, truncated and
extended checkpoints, read the way a restore reads them (header, scan, full verify, rows into a cache),
raise nothing but CheckpointError, never write rows past the file's verified records, and finish."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.checkpoint.format import CheckpointError
from engine.checkpoint.reader import CheckpointReader

from .test_kv_protocol import END, filled_cache, new_cache, save

VOCAB = 1000  # the records' token ids are positions below END


def _valid(tmp_path_factory) -> bytes:
    path = Path(tmp_path_factory.mktemp("fuzz")) / "good.hkv"
    save(filled_cache(np.float32), path)
    return path.read_bytes()


def _read_like_a_restore(path: Path) -> None:
    with CheckpointReader(path) as reader:
        reader.read_header()
        reader.scan()
        verified, _ = reader.verify_all(VOCAB)
        if not verified:
            return
        assert all(r.end <= END for r in verified)  # verified records stay inside what was written
        cache = new_cache(np.float32)
        written = cache.write_rows(verified[0].start, verified[-1].end, reader.rows(verified))
        assert written <= verified[-1].end


_SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@_SETTINGS
@given(flips=st.lists(st.tuples(st.integers(0, 10**9), st.integers(1, 255)), min_size=1, max_size=8))
def test_flipped_bytes_anywhere_give_a_checkpoint_error_or_verified_rows(tmp_path_factory, flips):
    data = bytearray(_valid(tmp_path_factory))
    for offset, mask in flips:
        data[offset % len(data)] ^= mask
    path = Path(tmp_path_factory.mktemp("flip")) / "x.hkv"
    path.write_bytes(bytes(data))
    try:
        _read_like_a_restore(path)
    except CheckpointError:
        pass


@_SETTINGS
@given(cut=st.integers(0, 10**9), tail=st.binary(max_size=512))
def test_truncated_or_extended_files_give_a_checkpoint_error_or_verified_rows(tmp_path_factory, cut, tail):
    data = _valid(tmp_path_factory)
    path = Path(tmp_path_factory.mktemp("cut")) / "x.hkv"
    path.write_bytes(data[: cut % (len(data) + 1)] + tail)
    try:
        _read_like_a_restore(path)
    except CheckpointError:
        pass


@_SETTINGS
@given(junk=st.binary(max_size=4096))
def test_random_bytes_are_never_a_checkpoint(tmp_path_factory, junk):
    path = Path(tmp_path_factory.mktemp("junk")) / "x.hkv"
    path.write_bytes(junk)
    try:
        _read_like_a_restore(path)
    except CheckpointError:
        pass
