"""GGUF block packing for MatMulNBits, checked against the gguf package's own dequantizer."""

from __future__ import annotations

import numpy as np
import pytest

from engine.arch.llama import unpermute_heads
from engine.errors import ModelFileError
from engine.model.quant import concat_packed, pack_rows


@pytest.mark.parametrize("type_name", ["Q4_0", "Q4_1", "Q8_0"])
def test_packing_is_lossless(type_name):
    import gguf
    from gguf import quants

    w = np.random.default_rng(1).standard_normal((12, 96)).astype(np.float32) * 3
    qtype = gguf.GGMLQuantizationType[type_name]
    raw = quants.quantize(w, qtype)
    packed = pack_rows(type_name, raw, 12, 96)
    np.testing.assert_array_equal(packed.dequantize(), quants.dequantize(raw, qtype))
    assert packed.bits == (8 if type_name == "Q8_0" else 4)
    assert (packed.correction is not None) == (type_name == "Q4_1")


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
