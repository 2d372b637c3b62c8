"""Our GGUF reader (engine/model/gguf_parse.py) against the gguf package's GGUFReader, and against
damaged files: crafted ones for each check, and hypothesis-mutated and truncated real headers."""

from __future__ import annotations

import itertools
import struct
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.errors import ModelFileError, UnsupportedModelError
from engine.model.gguf_file import GGUFModel

REFUSALS = (ModelFileError, UnsupportedModelError)


# equivalence with gguf.GGUFReader ------------------------------------------------------------------------------

def assert_same_as_gguf_reader(path: Path) -> None:
    """Every metadata key, type and value, and every tensor's name, type, shape, layout and bytes, as the
    gguf package reads them."""
    import gguf

    reader, model = gguf.GGUFReader(path), GGUFModel(path)
    assert list(model.fields) == list(reader.fields)
    for key, theirs in reader.fields.items():
        ours = model.fields[key]
        assert ours.type == theirs.types[0], key
        if ours.is_array and ours.count:
            assert ours.item_type == theirs.types[-1], key
        assert model.value(key) == theirs.contents(), key
        assert model.array_length(key) == len(theirs.data), key
    assert [t.name for t in model.tensors] == [t.name for t in reader.tensors]
    for ours, theirs in zip(model.tensors, reader.tensors, strict=True):
        assert ours.tensor_type == theirs.tensor_type, ours.name
        assert ours.shape == tuple(int(x) for x in theirs.shape), ours.name
        assert (ours.n_elements, ours.n_bytes, ours.data_offset) == (theirs.n_elements, theirs.n_bytes, theirs.data_offset)
        assert ours.data.shape == theirs.data.shape and ours.data.dtype == theirs.data.dtype, ours.name
        assert np.array_equal(ours.data.reshape(-1).view(np.uint8), np.asarray(theirs.data).reshape(-1).view(np.uint8))
        assert not ours.data.flags.writeable


def write_every_kind(path: Path, alignment: int | None = None) -> Path:
    """A GGUF with a value of every type, arrays of each, and tensors of plain and block types."""
    import gguf
    from gguf import GGMLQuantizationType as Q
    from gguf import GGUFValueType as V
    from gguf import quants

    rng = np.random.default_rng(7)
    w = gguf.GGUFWriter(str(path), "llama")
    if alignment is not None:
        w.add_custom_alignment(alignment)
    scalars = {V.UINT8: 200, V.INT8: -5, V.UINT16: 65000, V.INT16: -300, V.UINT32: 4_000_000_000, V.INT32: -7,
               V.FLOAT32: 0.1, V.BOOL: True, V.UINT64: 2**63 + 5, V.INT64: -(2**40), V.FLOAT64: 1e-300,
               V.STRING: "héllo ✓ <|im_end|>"}
    for vtype, value in scalars.items():
        w.add_key_value(f"test.scalar.{vtype.name.lower()}", value, vtype)
        if vtype != V.STRING:
            w.add_key_value(f"test.array.{vtype.name.lower()}", [value, value, value], V.ARRAY, sub_type=vtype)
    w.add_key_value("test.array.bool_mixed", [True, False, True], V.ARRAY, sub_type=V.BOOL)
    w.add_array("test.array.strings", ["", "a", "ü" * 3, "<0x0A>", "x" * 1000])
    w.add_tensor("plain.f32", rng.standard_normal((3, 4, 5)).astype(np.float32))
    w.add_tensor("plain.f16", rng.standard_normal((8, 32)).astype(np.float16))
    w.add_tensor("plain.i32", np.arange(7, dtype=np.int32))
    w.add_tensor("block.q8_0", quants.quantize(rng.standard_normal((4, 64)).astype(np.float32), Q.Q8_0), raw_dtype=Q.Q8_0)
    q4k = rng.integers(0, 256, (2, 144), dtype=np.uint8)  # random blocks: gguf cannot quantize K-quants
    q4k[:, :4] = 0  # keep the scales finite
    w.add_tensor("block.q4_k", q4k, raw_dtype=Q.Q4_K)
    w.add_tensor("block.bf16", rng.integers(0, 2**16, (3, 16), dtype=np.uint16).view(np.uint8), raw_dtype=Q.BF16)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("alignment", [None, 64, 8])
def test_a_file_of_every_value_and_tensor_kind_reads_as_the_gguf_package_reads_it(tmp_path, alignment):
    path = write_every_kind(tmp_path / "kinds.gguf", alignment)
    assert_same_as_gguf_reader(path)
    model = GGUFModel(path)
    assert model.alignment == (alignment or 32)
    assert model.value("test.scalar.uint64") == 2**63 + 5 and model.value("test.scalar.bool") is True
    assert model.int_array("test.array.int16").tolist() == [-300] * 3
    assert model.float_array("test.array.float32").dtype == np.float32
    assert model.string_array("test.array.strings")[2] == "üüü" and model.string_array("missing") == []


def test_the_tiny_model_reads_as_the_gguf_package_reads_it(tiny_gguf):
    assert_same_as_gguf_reader(tiny_gguf)


@pytest.mark.real_model
def test_the_default_model_reads_as_the_gguf_package_reads_it(real_home):
    from engine.model.fetch import default_model

    assert_same_as_gguf_reader(real_home / "models" / default_model().filename)


@pytest.mark.real_model
def test_gemma_reads_as_the_gguf_package_reads_it(gemma_gguf):
    assert_same_as_gguf_reader(gemma_gguf)  # the gguf package takes ~10 s over its vocabulary


@pytest.mark.real_model
def test_opening_gemma_is_fast(gemma_gguf):
    """The point of the reader: 262,144 tokens with scores and types, well under a second."""
    start = time.perf_counter()
    model = GGUFModel(gemma_gguf)
    tokens, scores = model.string_array("tokenizer.ggml.tokens"), model.float_array("tokenizer.ggml.scores")
    types = model.int_array("tokenizer.ggml.token_type")
    assert len(tokens) == len(scores) == len(types) == 262_144
    assert time.perf_counter() - start < 1.0


# crafted damage ----------------------------------------------------------------------------------------------------

U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)  # GGUF value types, from the spec
F32_T, Q4_0_T = 0, 2  # ggml tensor types


def gstr(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def kv(key: str | bytes, vtype: int, payload: bytes) -> bytes:
    return gstr(key) + struct.pack("<I", vtype) + payload


def tensor_info(name: str, dims: tuple[int, ...], ttype: int, offset: int) -> bytes:
    return gstr(name) + struct.pack(f"<I{len(dims)}QIQ", len(dims), *dims, ttype, offset)


def raw_gguf(kvs: list[bytes] = (), infos: list[bytes] = (), data: bytes = b"", *, version: int = 3,
             n_kv: int | None = None, n_tensors: int | None = None, alignment: int = 32) -> bytes:
    """GGUF bytes put together by hand, with counts that may lie."""
    head = b"GGUF" + struct.pack("<IQQ", version, len(infos) if n_tensors is None else n_tensors,
                                 len(kvs) if n_kv is None else n_kv) + b"".join(kvs) + b"".join(infos)
    return head + bytes(-len(head) % alignment) + data


ARCH = kv("general.architecture", STR, gstr("llama"))
W16 = tensor_info("w", (4,), F32_T, 0)
DATA16 = np.arange(4, dtype="<f4").tobytes()

CRAFTED = {
    "2^60 strings": (raw_gguf([kv("t", ARR, struct.pack("<IQ", STR, 2**60))]), ModelFileError, "more than"),
    "2^62 numbers": (raw_gguf([kv("t", ARR, struct.pack("<IQ", U32, 2**62))]), ModelFileError, "more than"),
    "a string past the end": (raw_gguf([kv("k", STR, struct.pack("<Q", 10**6) + b"abc")]), ModelFileError,
                              "needs 1000000 bytes"),
    "an array's string past the end": (raw_gguf([kv("t", ARR, struct.pack("<IQ", STR, 2) + gstr("ok")
                                                    + struct.pack("<Q", 2**63))]), ModelFileError, "string 1 of 't'"),
    "unknown value type": (raw_gguf([kv("k", 99, b"\0" * 8)]), ModelFileError, "value type 99"),
    "unknown item type": (raw_gguf([kv("k", ARR, struct.pack("<IQ", 13, 1) + b"\0" * 8)]), ModelFileError,
                          "value type 13"),
    "nested array": (raw_gguf([kv("k", ARR, struct.pack("<IQ", ARR, 1) + struct.pack("<IQ", U8, 1) + b"\1")]),
                     UnsupportedModelError, "array of arrays"),
    "2^64-1 pairs": (raw_gguf([ARCH], n_kv=2**64 - 1), ModelFileError, "metadata count"),
    "more pairs than written": (raw_gguf([ARCH], n_kv=2, alignment=1), ModelFileError, "damaged or truncated"),
    "2^63 tensors": (raw_gguf([ARCH], n_tensors=2**63), ModelFileError, "tensor count"),
    "a tensor past the end": (raw_gguf([ARCH], [tensor_info("w", (4,), F32_T, 2**40)], DATA16), ModelFileError,
                              "runs past the end"),
    "a tensor cut short": (raw_gguf([ARCH], [W16], DATA16[:-1]), ModelFileError, "runs past the end"),
    "a misaligned tensor": (raw_gguf([ARCH], [tensor_info("w", (4,), F32_T, 4)], DATA16 * 2), ModelFileError,
                            "not a multiple of the alignment 32"),
    "alignment 48": (raw_gguf([kv("general.alignment", U32, struct.pack("<I", 48))], [W16], DATA16, alignment=16),
                     ModelFileError, "48, not a power of two"),
    "alignment 0": (raw_gguf([kv("general.alignment", U32, struct.pack("<I", 0))]), ModelFileError, "not a power of two"),
    "alignment as u64": (raw_gguf([kv("general.alignment", U64, struct.pack("<Q", 32))]), ModelFileError, "not UINT32"),
    "five dimensions": (raw_gguf([ARCH], [tensor_info("w", (1, 1, 1, 1, 4), F32_T, 0)], DATA16), ModelFileError,
                        "at most 4"),
    "impossible shape": (raw_gguf([ARCH], [tensor_info("w", (2**63, 0), F32_T, 0)]), ModelFileError, "impossible shape"),
    "unknown tensor type": (raw_gguf([ARCH], [tensor_info("w", (4,), 200, 0)], DATA16), UnsupportedModelError,
                            "type 200"),
    "duplicate key": (raw_gguf([ARCH, ARCH]), ModelFileError, "'general.architecture' appears twice"),
    "duplicate tensor": (raw_gguf([ARCH], [W16, tensor_info("w", (4,), F32_T, 32)], DATA16 * 4), ModelFileError,
                         "'w' appears twice"),
    "overlapping tensors": (raw_gguf([ARCH], [tensor_info("a", (16,), F32_T, 0), tensor_info("b", (4,), F32_T, 32)],
                                     DATA16 * 4), ModelFileError, "overlap"),
    "a key that is not UTF-8": (raw_gguf([kv(b"k\xff", U8, b"\1")]), ModelFileError, "not UTF-8"),
    "version 1": (raw_gguf(version=1), UnsupportedModelError, "version 1"),
    "version 4": (raw_gguf(version=4), UnsupportedModelError, "newer than this Hearth reads"),
    "big-endian": (raw_gguf(version=3 << 24), UnsupportedModelError, "big-endian"),
    "version 0": (b"GGUF" + bytes(64), ModelFileError, "damaged or truncated"),
    "header cut short": (b"GGUF\3\0\0\0", ModelFileError, "shorter than a GGUF header"),
}


@pytest.mark.parametrize("case", CRAFTED)
def test_each_kind_of_damage_is_one_line_naming_the_file_without_a_big_allocation(tmp_path, case):
    data, error, needle = CRAFTED[case]
    path = tmp_path / "crafted.gguf"
    path.write_bytes(data)
    tracemalloc.start()
    try:
        with pytest.raises(error, match=needle) as refused:
            GGUFModel(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20
    message = str(refused.value)
    assert "crafted.gguf" in message and "\n" not in message


def test_a_valid_crafted_file_opens(tmp_path):
    """The crafting above is right: undamaged, the same pieces open (with empty arrays, which gguf's
    writer cannot make), as the gguf package reads them."""
    path = tmp_path / "ok.gguf"
    path.write_bytes(raw_gguf([ARCH, kv("t", ARR, struct.pack("<IQ", STR, 2) + gstr("a") + gstr("bc")),
                               kv("e", ARR, struct.pack("<IQ", STR, 0)), kv("n", ARR, struct.pack("<IQ", F64, 0))],
                              [W16], DATA16))
    model = GGUFModel(path)
    assert model.value("t") == ["a", "bc"] and model.tensor("w").data.tolist() == [0, 1, 2, 3]
    assert model.value("e") == model.value("n") == [] and model.array_length("e") == 0
    assert_same_as_gguf_reader(path)


def test_a_row_that_is_not_whole_blocks_says_so_and_not_that_the_file_is_damaged(tmp_path):
    path = tmp_path / "rows.gguf"
    path.write_bytes(raw_gguf([ARCH], [tensor_info("blk.0.ffn_up.weight", (48, 2), Q4_0_T, 0)], bytes(64)))
    with pytest.raises(ModelFileError, match="rows of 48 values, not a whole number of 32-value blocks") as refused:
        GGUFModel(path)
    message = str(refused.value)
    assert "damaged" not in message and "download it again" not in message and "blk.0.ffn_up.weight" in message


def test_text_that_is_not_utf8_is_refused_by_value_and_replaced_by_string_array(tmp_path):
    path = tmp_path / "latin1.gguf"
    path.write_bytes(raw_gguf([ARCH, kv("s", STR, gstr(b"caf\xe9")), kv("t", ARR, struct.pack("<IQ", STR, 1) + gstr(b"\xff"))]))
    model = GGUFModel(path)
    for key in ("s", "t"):
        with pytest.raises(ModelFileError, match=f"'{key}'.*not UTF-8"):
            model.value(key)
    assert model.string_array("t") == ["\ufffd"]
    with pytest.raises(ModelFileError, match="not a list of strings"):
        model.string_array("s")
    with pytest.raises(ModelFileError, match="not a list of numbers"):
        model.int_array("t")


# fuzzing: truncated and mutated real headers -----------------------------------------------------------------------

def exercise(path: Path) -> None:
    """Open ``path`` and read everything in it: only our two refusals may come out."""
    try:
        model = GGUFModel(path)
        for key, field in model.fields.items():
            if field.item_type is not None and field.item_type.name == "STRING":
                model.string_array(key)
            elif field.is_array:
                model.int_array(key)
            model.value(key)
        for t in model.tensors:
            flat = t.data.reshape(-1)
            if flat.size:
                flat[[0, -1]].tobytes()  # the first and last byte are inside the file
    except REFUSALS as exc:
        assert "\n" not in str(exc)


def test_every_truncation_of_a_small_file_is_refused(tmp_path):
    data = write_every_kind(tmp_path / "kinds.gguf").read_bytes()
    end = max(t.data_offset + t.n_bytes for t in GGUFModel(tmp_path / "kinds.gguf").tensors)
    for cut in range(end):
        path = tmp_path / f"cut{cut}.gguf"
        path.write_bytes(data[:cut])
        with pytest.raises(REFUSALS):
            GGUFModel(path)
        path.unlink()


EXTREMES = [0, 1, 7, 13, 2**31 - 1, 2**32 - 1, 2**32, 2**60, 2**63 - 1, 2**63, 2**64 - 1]


def mutation():
    """(fraction of the way into the region, bytes to write there)."""
    u64s = st.sampled_from(EXTREMES).map(lambda v: struct.pack("<Q", v))
    u32s = st.sampled_from([v for v in EXTREMES if v < 2**32]).map(lambda v: struct.pack("<I", v))
    return st.tuples(st.floats(0, 1, exclude_max=True), st.one_of(st.binary(min_size=1, max_size=8), u64s, u32s))


class Mutator:
    """Writes mutated copies of a file's header; the tensor data is left as a sparse hole of zeros."""

    def __init__(self, src: Path, folder: Path):
        model = GGUFModel(src)
        self.size = src.stat().st_size
        data_start = min((t.data_offset for t in model.tensors), default=self.size)
        with open(src, "rb") as fh:
            self.header = fh.read(data_start)
        first = next(iter(model.tensors), None)
        infos = self.header.find(gstr(first.name)) if first is not None else -1
        # Where the structure is: the counts and first pairs, the tensor infos, and the header as a whole.
        self.regions = [(0, min(4096, data_start)), (max(infos, 0), data_start), (0, data_start)]
        self.folder, self.n = folder, itertools.count()

    def write(self, region: int, edits: list[tuple[float, bytes]], cut: float | None) -> Path:
        lo, hi = self.regions[region]
        header = bytearray(self.header)
        for where, patch in edits:
            at = lo + int(where * (hi - lo))
            header[at:at + len(patch)] = patch
        path = self.folder / f"m{next(self.n)}.gguf"
        with open(path, "wb") as fh:
            fh.write(header[:len(self.header)])
            fh.truncate(self.size if cut is None else int(cut * self.size))
        return path


@pytest.fixture(scope="module")
def small_mutator(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fuzz-small")
    return Mutator(write_every_kind(folder / "kinds.gguf"), folder)


@pytest.fixture(scope="module")
def tiny_mutator(tiny_gguf, tmp_path_factory):
    return Mutator(tiny_gguf, tmp_path_factory.mktemp("fuzz-tiny"))


FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
EDITS = st.lists(mutation(), min_size=1, max_size=4)
CUTS = st.one_of(st.none(), st.floats(0, 1))


@FUZZ
@given(region=st.integers(0, 2), edits=EDITS, cut=CUTS)
def test_a_mutated_small_file_is_read_or_refused_cleanly(small_mutator, region, edits, cut):
    path = small_mutator.write(region, edits, cut)
    exercise(path)
    path.unlink()


@FUZZ
@given(region=st.integers(0, 2), edits=EDITS, cut=CUTS)
def test_a_mutated_model_header_is_read_or_refused_cleanly(tiny_mutator, region, edits, cut):
    path = tiny_mutator.write(region, edits, cut)
    exercise(path)
    path.unlink()


@pytest.mark.real_model
@settings(FUZZ, max_examples=40)
@given(region=st.integers(0, 2), edits=EDITS, cut=CUTS)
def test_a_mutated_default_model_header_is_read_or_refused_cleanly(real_mutator, region, edits, cut):
    path = real_mutator.write(region, edits, cut)
    exercise(path)
    path.unlink()


@pytest.fixture(scope="module")
def real_mutator(real_home, tmp_path_factory):
    from engine.model.fetch import default_model

    return Mutator(real_home / "models" / default_model().filename, tmp_path_factory.mktemp("fuzz-real"))
