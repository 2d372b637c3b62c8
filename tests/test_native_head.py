"""The output head over the token table's 8-bit blocks (ai.hearth.HeadQ8, engine/runtime/native_head.py):
real ONNX Runtime sessions, the real converter's graphs, a float64 reference."""

from __future__ import annotations

import logging
import shutil

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from engine.runtime import native_attention, native_head, native_library
from engine.runtime.runner import ModelRunner, session_options

LIBRARY = native_library.platform_library()
needs_library = pytest.mark.skipif(LIBRARY is None, reason="no prebuilt kernel for this platform")


def head_model(rank: int = 3) -> bytes:
    """One HeadQ8 node; no declared shapes, so bad shapes reach the kernel itself."""
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, None),
              helper.make_tensor_value_info("codes", TensorProto.UINT8, None),
              helper.make_tensor_value_info("scales", TensorProto.FLOAT, None)]
    node = helper.make_node(native_head.OP_TYPE, ["x", "codes", "scales"], ["y"], domain=native_attention.DOMAIN)
    graph = helper.make_graph([node], "head", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid(native_attention.DOMAIN, 1)],
                             ir_version=9).SerializeToString()


def head_session() -> ort.InferenceSession:
    options = session_options(2)
    options.register_custom_ops_library(str(LIBRARY))
    return ort.InferenceSession(head_model(), options, providers=["CPUExecutionProvider"])


def random_blocks(rng, vocab: int, blocks: int, block: int):
    codes = rng.integers(0, 256, (vocab, blocks, block), dtype=np.uint8)
    scales = (rng.random(vocab * blocks) * 0.02).astype(np.float32)
    return codes, scales


@needs_library
def test_the_head_matches_a_float64_reference_for_several_rows():
    rng = np.random.default_rng(3)
    vocab, blocks, block = 1037, 3, 32  # a vocabulary that does not fill the last work item
    codes, scales = random_blocks(rng, vocab, blocks, block)
    x = rng.standard_normal((1, 5, blocks * block)).astype(np.float32)
    got = head_session().run(None, {"x": x, "codes": codes, "scales": scales})[0]
    weights = (codes.astype(np.float64) - 128) * scales.astype(np.float64).reshape(vocab, blocks, 1)
    expected = x.astype(np.float64) @ weights.reshape(vocab, blocks * block).T
    assert got.shape == (1, 5, vocab)
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=1e-5)


@needs_library
@pytest.mark.parametrize("x_shape, codes_shape, scales_len, message", [
    ((1, 1, 95), (10, 3, 32), 30, "hidden size does not match"),
    ((1, 1, 96), (10, 3, 32), 29, "scales must be"),
    ((1, 1, 96), (10, 96), 30, "codes must be"),
    ((1, 1, 12), (10, 1, 12), 10, "codes must be"),  # a block size that is not a multiple of 8
])
def test_bad_inputs_are_refused_with_a_plain_message(x_shape, codes_shape, scales_len, message):
    feeds = {"x": np.zeros(x_shape, np.float32), "codes": np.zeros(codes_shape, np.uint8),
             "scales": np.zeros(scales_len, np.float32)}
    with pytest.raises(Exception, match=message):
        head_session().run(None, feeds)


@needs_library
@pytest.mark.parametrize("logits_mode", ["last", "all"])
def test_the_tied_head_runs_from_the_blocks_and_matches_the_dense_matmul(tiny_converted, monkeypatch, logits_mode):
    path = tiny_converted("int4", logits_mode).onnx_path
    native = ModelRunner(path, "cpu", 2)
    monkeypatch.setenv(native_head.ENV_SWITCH, "0")
    dense = ModelRunner(path, "cpu", 2)
    assert (native.head, dense.head) == ("hearth", "onnxruntime")
    assert native.attention == dense.attention == "hearth"
    ids = np.random.default_rng(5).integers(0, native.config.vocab_size, 12).tolist()
    a_cache, b_cache = native.new_cache(), dense.new_cache()
    a, b = native.forward(ids, a_cache), dense.forward(ids, b_cache)
    assert a.shape == b.shape == ((12 if logits_mode == "all" else 1), native.config.vocab_size)
    np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)
    for _ in range(3):
        token = int(np.argmax(a[-1]))
        a, b = native.forward([token], a_cache), dense.forward([token], b_cache)
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)


def test_a_dense_head_that_differs_from_the_blocks_keeps_the_matmul(tiny_converted, tmp_path, caplog):
    source = tiny_converted("int4").onnx_path.parent
    copy = tmp_path / "converted"
    shutil.copytree(source, copy)
    model = onnx.load(str(copy / "model.onnx"), load_external_data=False)
    dense = next(t for t in model.graph.initializer if t.name == native_head.DENSE_HEAD)
    offset = int({e.key: e.value for e in dense.external_data}["offset"])
    data = bytearray((copy / "model.onnx.data").read_bytes())
    data[offset:offset + 4] = np.float32(0.123).tobytes()  # weight [0, 0]: column 0 is always sampled
    (copy / "model.onnx.data").write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="engine.runtime.native_head"):
        assert not native_head.swap_head(model, copy, native_attention.DOMAIN)
    assert "differ from the dense head" in caplog.text
    assert any(n.op_type == "MatMul" and list(n.output) == ["logits"] for n in model.graph.node)


def test_weights_that_do_not_fit_their_data_file_keep_the_matmul(tiny_converted, tmp_path):
    source = tiny_converted("int4").onnx_path.parent
    copy = tmp_path / "converted"
    shutil.copytree(source, copy)
    data = copy / "model.onnx.data"
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])  # cut short: the head's bytes are past it
    model = onnx.load(str(copy / "model.onnx"), load_external_data=False)
    assert not native_head.swap_head(model, copy, native_attention.DOMAIN)


def test_graphs_without_a_dense_tied_head_are_left_alone(tiny_converted):
    fast = onnx.load(str(tiny_converted("int4-fast").onnx_path), load_external_data=False)
    assert not native_head.swap_head(fast, tiny_converted("int4-fast").onnx_path.parent, native_attention.DOMAIN)
    graph = native_attention.native_graph(tiny_converted("int4-fast").onnx_path)
    assert graph is not None and not graph.head


def test_a_head_whose_data_location_is_incomplete_keeps_the_matmul(tiny_converted):
    path = tiny_converted("int4").onnx_path
    model = onnx.load(str(path), load_external_data=False)
    dense = next(t for t in model.graph.initializer if t.name == native_head.DENSE_HEAD)
    kept = [e for e in dense.external_data if e.key != "length"]
    del dense.external_data[:]
    dense.external_data.extend(kept)
    assert not native_head.swap_head(model, path.parent, native_attention.DOMAIN)
