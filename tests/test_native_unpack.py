"""The GGUF block unpack layer (engine/native/hearth_unpack.h) and ai.hearth.GatherQ against gguf's own
dequantizer: random valid blocks of every supported type, the built library through ctypes, and GatherQ in
real ONNX Runtime sessions."""

from __future__ import annotations

import ctypes

import numpy as np
import onnxruntime as ort
import pytest
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize
from onnx import TensorProto, helper

from engine.model.gguf_parse import read_gguf
from engine.runtime import native_library
from engine.runtime.runner import session_options

LIBRARY = native_library.platform_library()
needs_library = pytest.mark.skipif(LIBRARY is None, reason="no prebuilt kernel for this platform")
DOMAIN = "ai.hearth"

# type → (elements, bytes, sub-block, byte offsets of its fp16 fields)
TYPES = {
    T.Q4_0: (32, 18, 32, (0,)),
    T.Q4_1: (32, 20, 32, (0, 2)),
    T.Q5_0: (32, 22, 32, (0,)),
    T.Q5_1: (32, 24, 32, (0, 2)),
    T.Q8_0: (32, 34, 32, (0,)),
    T.Q2_K: (256, 84, 16, (80, 82)),
    T.Q3_K: (256, 110, 16, (108,)),
    T.Q4_K: (256, 144, 32, (0, 2)),
    T.Q5_K: (256, 176, 32, (0, 2)),
    T.Q6_K: (256, 210, 16, (208,)),
}
TYPE_IDS = list(TYPES)
TOP_CODE = {T.Q4_0: 15, T.Q4_1: 15, T.Q5_0: 31, T.Q5_1: 31, T.Q2_K: 3, T.Q3_K: 7, T.Q4_K: 15, T.Q5_K: 31, T.Q6_K: 63}


@pytest.fixture(scope="module")
def lib() -> ctypes.CDLL:
    handle = ctypes.CDLL(str(LIBRARY))
    u8, f32, i8 = (ctypes.POINTER(t) for t in (ctypes.c_uint8, ctypes.c_float, ctypes.c_int8))
    handle.HearthDequantizeRows.argtypes = [ctypes.c_int, u8, ctypes.c_int64, ctypes.c_int64, f32]
    handle.HearthDequantizeRows.restype = ctypes.c_int
    handle.HearthUnpackBlocks.argtypes = [ctypes.c_int, u8, ctypes.c_int64, i8, f32, f32]
    handle.HearthUnpackBlocks.restype = ctypes.c_int
    return handle


def _ptr(array: np.ndarray, ctype):
    return array.ctypes.data_as(ctypes.POINTER(ctype))


def random_rows(rng: np.random.Generator, qtype: T, n: int, k: int) -> np.ndarray:
    """n rows of k weights as uint8 [n, R]: random bytes, every fp16 field a random finite half (normal,
    subnormal, either sign); the first block has d = 0 and the second a negative d."""
    elements, size, _, halves = TYPES[qtype]
    blocks = rng.integers(0, 256, (n, k // elements, size), dtype=np.uint8)
    for at in halves:
        bits = rng.integers(0, 1 << 16, blocks.shape[:2], dtype=np.uint16)
        bits = np.where((bits & 0x7C00) == 0x7C00, bits & 0x83FF, bits)  # no inf or NaN: exponent 31 → 0
        blocks[..., at:at + 2] = bits.astype("<u2")[..., None].view(np.uint8)
    flat = blocks.reshape(-1, size)
    flat[0, halves[0]:halves[0] + 2] = 0
    if flat.shape[0] > 1:
        flat[1, halves[0] + 1] |= 0x80
    return blocks.reshape(n, -1)


def native_rows(lib: ctypes.CDLL, qtype: T, rows: np.ndarray, k: int) -> np.ndarray:
    out = np.full((rows.shape[0], k), np.nan, np.float32)
    rows = np.ascontiguousarray(rows)
    assert lib.HearthDequantizeRows(int(qtype), _ptr(rows, ctypes.c_uint8), rows.shape[0], k, _ptr(out, ctypes.c_float)) == 0
    return out


def same_bits(got: np.ndarray, expected: np.ndarray) -> None:
    assert got.shape == expected.shape
    mismatched = np.flatnonzero(got.view(np.uint32) != expected.view(np.uint32))
    assert mismatched.size == 0, f"{mismatched.size} weights differ, first at {mismatched[:5]}"


@needs_library
@pytest.mark.parametrize("qtype", TYPE_IDS, ids=lambda t: t.name)
@pytest.mark.parametrize("n, blocks", [(1, 1), (3, 2), (7, 5)])
def test_dequantized_rows_are_gguf_bit_for_bit(lib, qtype, n, blocks):
    k = blocks * TYPES[qtype][0]
    rows = random_rows(np.random.default_rng(int(qtype) * 100 + n), qtype, n, k)
    expected = dequantize(rows, qtype)
    assert expected.shape == (n, k)
    same_bits(native_rows(lib, qtype, rows, k), expected)


@needs_library
@pytest.mark.parametrize("qtype", [T.Q4_0, T.Q5_0, T.Q8_0, T.Q3_K, T.Q6_K], ids=lambda t: t.name)
def test_negative_zeros_of_the_centred_types_are_gguf_s(lib, qtype):
    """gguf computes these as s·(q − c): a code at the centre under a negative scale is −0, which s·q + o
    would make +0. The random rows hold such weights, and the row kernel keeps their sign."""
    k = 5 * TYPES[qtype][0]
    rows = random_rows(np.random.default_rng(int(qtype) * 100 + 7), qtype, 7, k)
    expected = dequantize(rows, qtype)
    negative_zero = (expected == 0) & np.signbit(expected)
    assert negative_zero.any()
    got = native_rows(lib, qtype, rows, k)
    assert np.array_equal(np.signbit(got[negative_zero]), np.ones(negative_zero.sum(), bool))


@needs_library
@pytest.mark.parametrize("qtype", TYPE_IDS, ids=lambda t: t.name)
def test_unpacked_codes_scales_and_offsets_give_gguf_weights(lib, qtype):
    """w = s·q + o, computed in fp32, equals gguf's weight (a centred type may give +0 for gguf's −0)."""
    elements, _, sub, _ = TYPES[qtype]
    nblocks = 9
    raw = np.ascontiguousarray(random_rows(np.random.default_rng(int(qtype)), qtype, 1, nblocks * elements))
    q = np.zeros(nblocks * elements, np.int8)
    s = np.full(nblocks * elements // sub, np.nan, np.float32)
    o = np.full_like(s, np.nan)
    assert lib.HearthUnpackBlocks(int(qtype), _ptr(raw, ctypes.c_uint8), nblocks, _ptr(q, ctypes.c_int8),
                                  _ptr(s, ctypes.c_float), _ptr(o, ctypes.c_float)) == 0
    low, high = (-128, 127) if qtype == T.Q8_0 else (0, 63)
    assert low <= q.min() and q.max() <= high
    if qtype != T.Q8_0:  # 9 random blocks reach the type's largest code
        assert q.max() == TOP_CODE[qtype]
    weights = s.repeat(sub) * q.astype(np.float32) + o.repeat(sub)
    np.testing.assert_array_equal(weights, dequantize(raw, qtype).reshape(-1))


@needs_library
def test_the_test_exports_refuse_an_unknown_type_or_a_bad_k(lib):
    rows = np.zeros((1, 34), np.uint8)
    out = np.zeros(32, np.float32)
    q, s = np.zeros(256, np.int8), np.zeros(16, np.float32)
    assert lib.HearthDequantizeRows(1, _ptr(rows, ctypes.c_uint8), 1, 32, _ptr(out, ctypes.c_float)) == -1  # F16
    assert lib.HearthDequantizeRows(int(T.Q8_0), _ptr(rows, ctypes.c_uint8), 1, 33, _ptr(out, ctypes.c_float)) == -1
    assert lib.HearthUnpackBlocks(9, _ptr(rows, ctypes.c_uint8), 1, _ptr(q, ctypes.c_int8), _ptr(s, ctypes.c_float),
                                  _ptr(s, ctypes.c_float)) == -1  # Q8_1: not a weight type
    assert not out.any()


def one_op_model(op: str, inputs: dict[str, int], **attributes) -> bytes:
    """One node of Hearth's ``op`` over ``inputs`` (name → element type), output y float32; no declared
    shapes, so bad shapes reach the kernel itself."""
    values = [helper.make_tensor_value_info(name, element, None) for name, element in inputs.items()]
    node = helper.make_node(op, list(inputs), ["y"], domain=DOMAIN, **attributes)
    graph = helper.make_graph([node], op, values, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)],
                             ir_version=9).SerializeToString()


def gather_model(qtype: int, k: int) -> bytes:
    return one_op_model("GatherQ", {"ids": TensorProto.INT64, "w": TensorProto.UINT8}, type=int(qtype), k=k)


def gather(qtype: int, k: int, ids: np.ndarray, w: np.ndarray) -> np.ndarray:
    options = session_options(2)
    options.register_custom_ops_library(str(LIBRARY))
    session = ort.InferenceSession(gather_model(qtype, k), options, providers=["CPUExecutionProvider"])
    return session.run(None, {"ids": ids, "w": w})[0]


@needs_library
@pytest.mark.parametrize("qtype", TYPE_IDS, ids=lambda t: t.name)
def test_gathered_rows_are_gguf_rows(qtype):
    k = 3 * TYPES[qtype][0]
    table = random_rows(np.random.default_rng(int(qtype) + 7), qtype, 37, k)
    expected = dequantize(table, qtype)
    for ids in (np.array([[36]]), np.array([[0, 5, 5, 17, 2], [36, 1, 0, 9, 30]])):
        got = gather(qtype, k, ids.astype(np.int64), table)
        assert got.shape == ids.shape + (k,)
        same_bits(got, expected[ids])


@needs_library
def test_a_scalar_id_gives_one_row_and_no_ids_give_no_rows():
    qtype, k = T.Q6_K, 256
    table = random_rows(np.random.default_rng(8), qtype, 5, k)
    same_bits(gather(qtype, k, np.array(3, np.int64), table), dequantize(table, qtype)[3])
    assert gather(qtype, k, np.zeros((1, 0), np.int64), table).shape == (1, 0, k)


@needs_library
def test_many_rows_are_split_across_threads_and_still_exact():
    """Prefill's gather (above GatherQ's serial threshold) runs on the session's threads: same rows."""
    qtype, k = T.Q4_K, 1024
    table = random_rows(np.random.default_rng(5), qtype, 300, k)
    ids = np.random.default_rng(6).integers(0, 300, (1, 257)).astype(np.int64)
    same_bits(gather(qtype, k, ids, table), dequantize(table, qtype)[ids])


@needs_library
@pytest.mark.parametrize("qtype, k, width, ids, message", [
    (1, 32, 34, [[0]], "unsupported weight type 1"),  # F16
    (99, 32, 34, [[0]], "unsupported weight type 99"),
    (int(T.Q8_0), 48, 34, [[0]], "k = 48 is not a positive multiple of Q8_0's 32-element block"),
    (int(T.Q4_K), 0, 144, [[0]], "k = 0 is not a positive multiple"),
    (int(T.Q4_K), 256, 145, [[0]], r"W must be \[rows, 144\]"),
    (int(T.Q6_K), 512, 210, [[0]], r"W must be \[rows, 420\]"),
    (int(T.Q8_0), 32, 34, [[4]], r"id 4 is out of range \(the table has 4 rows\)"),
    (int(T.Q8_0), 32, 34, [[1, -1]], "id -1 is out of range"),
])
def test_bad_inputs_are_refused_with_a_plain_message(qtype, k, width, ids, message):
    with pytest.raises(Exception, match=f"hearth.GatherQ: {message}"):
        gather(qtype, k, np.array(ids, np.int64), np.zeros((4, width), np.uint8))


@needs_library
def test_a_table_that_is_not_two_dimensional_is_refused():
    with pytest.raises(Exception, match=r"hearth.GatherQ: W must be \[rows, 34\]"):
        gather(int(T.Q8_0), 32, np.array([[0]], np.int64), np.zeros((4, 1, 34), np.uint8))


@needs_library
def test_ids_of_more_than_three_dimensions_are_refused():
    with pytest.raises(Exception, match="hearth.GatherQ: ids has more than 3 dimensions"):
        gather(int(T.Q8_0), 32, np.zeros((1, 1, 1, 1), np.int64), np.zeros((4, 34), np.uint8))


def _real_rows(path, lib: ctypes.CDLL) -> set[str]:
    """Every supported 2-D tensor of a real GGUF: its first two and last rows through the row kernel ==
    gguf's, bit for bit. Returns the types seen."""
    seen = set()
    for tensor in read_gguf(path).tensors.values():  # gguf's GGUFReader takes 14 s over Gemma's vocabulary
        if tensor.tensor_type not in TYPES or len(tensor.shape) != 2:
            continue
        k = int(tensor.shape[0])
        rows = np.ascontiguousarray(np.asarray(tensor.data)[[0, 1, -1]])
        same_bits(native_rows(lib, tensor.tensor_type, rows, k), dequantize(rows, tensor.tensor_type))
        seen.add(tensor.tensor_type.name)
    return seen


@needs_library
def test_every_weight_type_of_the_real_models_dequantizes_as_gguf(lib, real_home, gemma_gguf):
    smollm = real_home / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert _real_rows(smollm, lib) == {"Q4_1", "Q8_0"}
    assert _real_rows(gemma_gguf, lib) == {"Q8_0", "Q5_0", "Q4_K", "Q6_K"}


@needs_library
def test_gatherq_reads_the_real_token_table(real_home):
    """The default model's Q8_0 token table [49152, 612 bytes], as the converted graph will feed it."""
    tensor = read_gguf(real_home / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf").tensors["token_embd.weight"]
    table = np.ascontiguousarray(np.asarray(tensor.data))
    ids = np.array([[1, 49151, 0, 1, 12345]], np.int64)
    got = gather(tensor.tensor_type, int(tensor.shape[0]), ids, table)
    same_bits(got, dequantize(table[ids[0]], tensor.tensor_type)[None])
