"""GGUF block packing for MatMulNBits, checked against the gguf package's own dequantizer."""

from __future__ import annotations

import numpy as np
import pytest

from engine.arch.llama import unpermute_heads
from engine.errors import ModelFileError
from engine.model.quant import concat_packed, is_packable, pack_rows, split_planes


@pytest.mark.parametrize("type_name", ["Q4_0", "Q4_1", "Q8_0", "Q5_0", "Q5_1"])
def test_packing_is_lossless(type_name):
    import gguf
    from gguf import quants

    w = np.random.default_rng(1).standard_normal((12, 96)).astype(np.float32) * 3
    qtype = gguf.GGMLQuantizationType[type_name]
    raw = quants.quantize(w, qtype)
    packed = pack_rows(type_name, raw, 12, 96)
    np.testing.assert_array_equal(packed.dequantize(), quants.dequantize(raw, qtype))
    assert packed.bits == (4 if type_name in ("Q4_0", "Q4_1") else 8) and packed.block == 32
    assert (packed.correction is not None) == (type_name in ("Q4_1", "Q5_1"))


def test_wrong_byte_count_is_a_clear_error():
    with pytest.raises(ModelFileError, match="holds 10 bytes"):
        pack_rows("Q4_1", np.zeros(10, np.uint8), 2, 32, "blk.0.attn_q.weight")


def test_input_size_must_be_whole_blocks():
    with pytest.raises(ModelFileError, match="not a multiple"):
        pack_rows("Q4_0", np.zeros(18, np.uint8), 1, 36)


def test_concat_keeps_rows_in_order():
    import gguf
    from gguf import quants

    rng = np.random.default_rng(2)
    parts = []
    for n in (4, 2):
        raw = quants.quantize(rng.standard_normal((n, 64)).astype(np.float32), gguf.GGMLQuantizationType.Q4_1)
        parts.append(pack_rows("Q4_1", raw, n, 64))
    merged = concat_packed(parts)
    np.testing.assert_array_equal(merged.dequantize(), np.concatenate([p.dequantize() for p in parts]))


def test_unpermute_inverts_llama_cpp_permutation():
    heads, head_dim = 3, 8
    hf = np.arange(heads * head_dim * 2).reshape(heads * head_dim, 2)
    # llama.cpp's convert script: reshape(heads, 2, d/2, ...).swapaxes(1, 2)
    gguf_rows = hf.reshape(heads, 2, head_dim // 2, 2).swapaxes(1, 2).reshape(hf.shape)
    np.testing.assert_array_equal(unpermute_heads(gguf_rows, heads), hf)


@pytest.mark.parametrize("type_name", ["Q4_0", "Q4_1"])
def test_zero_point_form_is_the_same_weights(type_name):
    """int4-cuda stores Q4_1 offsets as float zero points: d·(q − zp) must equal d·q + m, flat
    blocks (d = 0, every weight m) included."""
    import gguf
    from gguf import quants

    from engine.model.quant import _unpack_nibbles_onnx

    w = np.random.default_rng(2).standard_normal((8, 128)).astype(np.float32)
    w[3, 32:64] = 0.75  # a constant block: Q4_1 stores d = 0, m = 0.75
    packed = pack_rows(type_name, quants.quantize(w, gguf.GGMLQuantizationType[type_name]), 8, 128)
    blob, scales, zero_points = packed.with_zero_points()
    q = _unpack_nibbles_onnx(blob).astype(np.float32)
    rebuilt = ((q - zero_points.reshape(8, 4, 1)) * scales.reshape(8, 4, 1)).reshape(8, 128)
    np.testing.assert_allclose(rebuilt, packed.dequantize(), atol=1e-6, rtol=0)
    if type_name == "Q4_1":
        assert np.allclose(rebuilt[3, 32:64], 0.75)


# K-quants: gguf 0.19 cannot quantize them, so tests write random blocks by hand. Every byte pattern is a
# valid block except the fp16 super-scales, which are set to finite values of either sign.
_K_FP16_AT = {"Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}
_K_FORM = {"Q3_K": (4, 16), "Q4_K": (4, 32), "Q5_K": (8, 32), "Q6_K": (8, 16)}  # bits, block


def random_k_raw(type_name: str, n: int, k: int, seed: int = 0) -> np.ndarray:
    import gguf

    rng = np.random.default_rng(seed)
    block_bytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[type_name]][1]
    nb = k // 256
    raw = np.frombuffer(rng.bytes(n * nb * block_bytes), np.uint8).reshape(n, nb, block_bytes).copy()
    for at in _K_FP16_AT[type_name]:
        d = (rng.uniform(1e-4, 2e-2, (n, nb)) * rng.choice([-1, 1], (n, nb))).astype(np.float16)
        d[0, 0] = 0  # a block of d = 0 (or dmin = 0)
        raw[:, :, at:at + 2] = d.view(np.uint8).reshape(n, nb, 2)
    return raw.reshape(n, nb * block_bytes)


def _gguf_dequantize(type_name: str, raw: np.ndarray) -> np.ndarray:
    import gguf
    from gguf import quants

    return quants.dequantize(raw, gguf.GGMLQuantizationType[type_name])


@pytest.mark.parametrize("type_name", ["Q3_K", "Q5_K", "Q6_K"])
def test_k_quant_packing_is_lossless(type_name):
    raw = random_k_raw(type_name, 16, 768)
    packed = pack_rows(type_name, raw, 16, 768)
    np.testing.assert_array_equal(packed.dequantize(), _gguf_dequantize(type_name, raw))
    assert (packed.bits, packed.block) == _K_FORM[type_name]
    assert packed.blob.shape == (16, 768 // packed.block, packed.block * packed.bits // 8)
    assert (packed.correction is not None) == (type_name == "Q5_K")


def test_q4_k_differs_by_fp32_rounding_only():
    """Q4_K keeps its 4-bit codes, so the min rides on a correction of 8·scale − dmin·m: scale·(q − 8)
    is exact in fp32, the correction and the final sum round once each, so each weight is within half
    an ulp of the correction plus one ulp of the weight."""
    raw = random_k_raw("Q4_K", 16, 768, seed=1)
    packed = pack_rows("Q4_K", raw, 16, 768)
    ref = _gguf_dequantize("Q4_K", raw)
    got = packed.dequantize()
    assert (packed.bits, packed.block) == (4, 32) and packed.correction is not None
    corr = np.repeat(packed.correction.T, packed.block, axis=1)  # [n, k]
    bound = np.finfo(np.float32).eps * (0.5 * np.abs(corr) + np.abs(ref))
    assert (np.abs(got - ref) <= bound).all()
    assert (got == ref).mean() > 0.5


def test_types_left_dense():
    """Q2_K has no fast 2-bit CPU kernel; IQ types are lookup tables, not affine; F16 is dense already."""
    assert not any(is_packable(t) for t in ("Q2_K", "IQ4_NL", "IQ4_XS", "F16", "F32"))


def test_k_quant_rows_must_be_whole_super_blocks():
    with pytest.raises(ModelFileError, match="blk.0.ffn_down.weight: input size 128 is not a multiple of Q4_K's 256-element"):
        pack_rows("Q4_K", np.zeros(144, np.uint8), 2, 128, "blk.0.ffn_down.weight")


def test_concat_refuses_different_blocks():
    a = pack_rows("Q6_K", random_k_raw("Q6_K", 2, 256), 2, 256)
    b = pack_rows("Q5_K", random_k_raw("Q5_K", 2, 256), 2, 256)
    with pytest.raises(ValueError, match="same bits, input size and block"):
        concat_packed([a, b])


def test_concat_mixes_offsets_and_none():
    a = pack_rows("Q4_K", random_k_raw("Q4_K", 3, 512), 3, 512)
    b = pack_rows("Q4_0", np.zeros(2 * 16 * 18, np.uint8), 2, 512)
    merged = concat_packed([a, b])
    np.testing.assert_array_equal(merged.dequantize(), np.concatenate([a.dequantize(), b.dequantize()]))


_ALL_TYPES = ["Q4_0", "Q4_1", "Q8_0", "Q5_0", "Q5_1", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]


def _packed_layer(type_name: str, n: int, k: int):
    """A packed layer and gguf's float64 dequantization of the same blocks."""
    import gguf
    from gguf import quants

    if type_name in _K_FP16_AT:
        raw = random_k_raw(type_name, n, k, seed=2)
    else:
        w = np.random.default_rng(2).standard_normal((n, k)).astype(np.float32)
        raw = quants.quantize(w, gguf.GGMLQuantizationType[type_name])
    return pack_rows(type_name, raw, n, k), _gguf_dequantize(type_name, raw).astype(np.float64)


def _run_matmulnbits(layer, x: np.ndarray, zero_points: bool = False) -> np.ndarray:
    """One MatMulNBits node (plus the block-sum branch when the layer has offsets) on the CPU."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    blob, scales, corr = layer.blob, layer.scales, layer.correction
    inputs, inits, nodes = ["x" if layer.planes == 1 else "x2", "w", "s"], [], []
    if layer.planes == 2:  # each input block read twice, as Graph._doubled feeds a split layer
        inits.append(numpy_helper.from_array(np.array([0, layer.n_blocks, 1, layer.block], np.int64), "pairs"))
        inits.append(numpy_helper.from_array(np.array([0, 2 * layer.k], np.int64), "flat"))
        nodes += [helper.make_node("Reshape", ["x", "pairs"], ["xp"]), helper.make_node("Concat", ["xp", "xp"], ["xx"], axis=2),
                  helper.make_node("Reshape", ["xx", "flat"], ["x2"])]
    if zero_points:
        blob, scales, zp = layer.with_zero_points()
        inputs.append("zp")
        inits.append(numpy_helper.from_array(zp, "zp"))
        corr = None
    inits += [numpy_helper.from_array(blob, "w"), numpy_helper.from_array(scales, "s")]
    if layer.planes == 2:
        inputs.append("zp")
        inits.append(numpy_helper.from_array(layer.plane_zero_points(), "zp"))
    nodes.append(helper.make_node("MatMulNBits", inputs, ["y" if corr is None else "y0"], domain="com.microsoft",
                                  K=layer.matmul_k, N=layer.n, bits=layer.bits, block_size=layer.block, accuracy_level=0))
    if corr is not None:
        inits += [numpy_helper.from_array(corr, "c"), numpy_helper.from_array(np.array([-1], np.int64), "axes"),
                  numpy_helper.from_array(np.array([0, layer.n_blocks, layer.block], np.int64), "shape")]
        nodes += [helper.make_node("Reshape", ["x", "shape"], ["xb"]),
                  helper.make_node("ReduceSum", ["xb", "axes"], ["sums"], keepdims=0),
                  helper.make_node("MatMul", ["sums", "c"], ["offs"]), helper.make_node("Add", ["y0", "offs"], ["y"])]
    graph = helper.make_graph(nodes, "one", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["m", layer.k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["m", layer.n])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 10
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


@pytest.mark.parametrize("type_name", _ALL_TYPES)
def test_matmulnbits_computes_the_gguf_weights(type_name):
    """Through ONNX Runtime (bit packing order, block 16, the side branch): x @ W.T as float64 numpy
    computes it from gguf's own dequantization, within fp32 accumulation error."""
    layer, w = _packed_layer(type_name, 40, 512)
    x = np.random.default_rng(3).standard_normal((5, 512)).astype(np.float32)
    ref = x.astype(np.float64) @ w.T
    scale = np.abs(x).astype(np.float64) @ np.abs(w).T  # what the rounding errors accumulate against
    assert np.abs(_run_matmulnbits(layer, x) - ref).max() <= 1e-6 * scale.max()


@pytest.mark.parametrize("type_name", ["Q4_1", "Q4_K"])
def test_float_zero_points_compute_the_same_weights(type_name):
    """int4-cuda's form: 4-bit offsets as float zero points instead of the branch."""
    layer, w = _packed_layer(type_name, 40, 512)
    x = np.random.default_rng(4).standard_normal((5, 512)).astype(np.float32)
    ref = x.astype(np.float64) @ w.T
    scale = np.abs(x).astype(np.float64) @ np.abs(w).T
    assert np.abs(_run_matmulnbits(layer, x, zero_points=True) - ref).max() <= 1e-6 * scale.max()


_EIGHT_BIT = ["Q8_0", "Q5_0", "Q5_1", "Q5_K", "Q6_K"]


@pytest.mark.parametrize("type_name", _EIGHT_BIT)
def test_split_planes_are_the_8bit_weights(type_name):
    """Exact int4's head: an 8-bit layer as two 4-bit planes (scales d and 16·d, zero points 0 and 8)
    holds the same weights to within the rounding of one fp32 addition."""
    layer, w = _packed_layer(type_name, 40, 512)
    split = split_planes(layer, rows_per_chunk=7)  # chunks that do not divide the rows
    assert (split.bits, split.planes, split.k, split.matmul_k, split.block) == (4, 2, 512, 1024, layer.block)
    got = split.dequantize().astype(np.float64)
    assert np.abs(got - w).max() <= 2 ** -22 * np.abs(w).max()
    assert np.abs(split.dequantize() - layer.dequantize()).max() <= 2 ** -22 * np.abs(w).max()


@pytest.mark.parametrize("type_name", _EIGHT_BIT)
def test_matmulnbits_computes_the_gguf_weights_from_split_planes(type_name):
    layer, w = _packed_layer(type_name, 40, 512)
    x = np.random.default_rng(5).standard_normal((5, 512)).astype(np.float32)
    ref = x.astype(np.float64) @ w.T
    scale = np.abs(x).astype(np.float64) @ np.abs(w).T
    assert np.abs(_run_matmulnbits(split_planes(layer), x) - ref).max() <= 1e-6 * scale.max()


def test_only_8bit_layers_split_and_split_layers_have_no_zero_point_form():
    four, _ = _packed_layer("Q4_0", 8, 64)
    with pytest.raises(ValueError, match="8-bit"):
        split_planes(four)
    split = split_planes(_packed_layer("Q8_0", 8, 64)[0])
    with pytest.raises(ValueError, match="8-bit"):
        split_planes(split)
    with pytest.raises(ValueError, match="zero-point"):
        split.with_zero_points()
    with pytest.raises(ValueError, match="plane zero points"):
        four.plane_zero_points()
    with pytest.raises(ValueError, match="same bits"):
        concat_packed([split, _packed_layer("Q4_0", 8, 64)[0]])
