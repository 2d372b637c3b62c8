"""Hearth's CPU attention kernel (engine/native): same results as ONNX Runtime's GroupQueryAttention,
the committed binary built from the committed source, the engine using it, and every way it falls back."""

from __future__ import annotations

import logging

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from engine.generation import Engine
from engine.runtime import native_attention, native_library
from engine.runtime.runner import ModelRunner, session_options
from tests.arch_models import ARCH_SPECS

LIBRARY = native_library.platform_library()
needs_library = pytest.mark.skipif(LIBRARY is None, reason="no prebuilt kernel for this platform")


def attention_model(domain: str, heads: int, kv_heads: int, d: int, *, packed: bool = True, rotary: bool = True,
                    half: int = 0, free_shapes: bool = False, dtype: int = TensorProto.FLOAT, **attrs) -> bytes:
    """One attention node (GroupQueryAttention or hearth's, CPU or CUDA) with the engine's input layout;
    ``dtype``: the floats' element type (TensorProto.FLOAT16 for CUDA's)."""
    width = (heads + 2 * kv_heads) * d if packed else heads * d
    inputs = [helper.make_tensor_value_info("q", dtype, [1, None, width])]
    names = ["q", "", ""]
    if not packed:
        names[1:] = ["k", "v"]
        inputs += [helper.make_tensor_value_info(n, dtype, [1, None, kv_heads * d]) for n in ("k", "v")]
    inputs += [helper.make_tensor_value_info(n, dtype, [1, kv_heads, None, d]) for n in ("pk", "pv")]
    inputs += [helper.make_tensor_value_info("sl", TensorProto.INT32, [1]),
               helper.make_tensor_value_info("tot", TensorProto.INT32, [])]
    names += ["pk", "pv", "sl", "tot"]
    if rotary:
        inputs += [helper.make_tensor_value_info(n, dtype, [None, half]) for n in ("cos", "sin")]
        names += ["cos", "sin"]
        attrs = {"do_rotary": 1, "rotary_interleaved": 0, **attrs}
    op = "GroupQueryAttention" if domain == "com.microsoft" else native_attention.OP_TYPE
    node = helper.make_node(op, names, ["o", "ok", "ov"], domain=domain, num_heads=heads, kv_num_heads=kv_heads,
                            **attrs)
    outputs = [helper.make_tensor_value_info(n, dtype, None) for n in ("o", "ok", "ov")]
    if free_shapes:  # no declared shapes: bad shapes reach the kernel instead of ONNX Runtime's checks
        for value in inputs:
            value.type.tensor_type.ClearField("shape")
    graph = helper.make_graph([node], "attention", inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(domain, 1)],
                             ir_version=9).SerializeToString()


def session(model: bytes, native: bool, library=None) -> ort.InferenceSession:
    options = session_options(2)
    if native:
        options.register_custom_ops_library(str(library or LIBRARY))
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def feeds_for(rng, heads, kv_heads, d, past, seq, cap, *, packed=True, half=0) -> dict:
    width = (heads + 2 * kv_heads) * d if packed else heads * d
    feeds = {"q": rng.standard_normal((1, seq, width), np.float32),
             "pk": rng.standard_normal((1, kv_heads, cap, d), np.float32),
             "pv": rng.standard_normal((1, kv_heads, cap, d), np.float32),
             "sl": np.array([past + seq - 1], np.int32), "tot": np.array(past + seq, np.int32)}
    if not packed:
        feeds["k"] = rng.standard_normal((1, seq, kv_heads * d), np.float32)
        feeds["v"] = rng.standard_normal((1, seq, kv_heads * d), np.float32)
    if half:
        angles = np.outer(np.arange(cap), rng.random(half))
        feeds["cos"], feeds["sin"] = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
    return feeds


# heads, kv heads, head size, past rows, new rows, capacity, packed, rotary half-width, window
SHAPES = {
    "decode over a long past": (9, 3, 64, 4000, 1, 4096, True, 32, 0),
    "prefill from empty": (9, 3, 64, 0, 37, 256, True, 32, 0),
    "a chunk over a past": (9, 3, 64, 300, 20, 512, True, 32, 0),
    "gemma-like window, separate q/k/v": (4, 1, 256, 700, 5, 1024, False, 120, 512),
    "window shorter than the chunk": (9, 3, 64, 50, 40, 128, True, 32, 16),
    "no rotary, head size 128": (8, 2, 128, 100, 1, 256, True, 0, 0),
    "one query head per KV head": (2, 2, 64, 5, 3, 16, True, 32, 0),
    "partial rotary, head size 48": (6, 2, 48, 9, 2, 32, True, 8, 0),
}


def reference_attention(feeds: dict, heads: int, kv_heads: int, d: int, half: int, window: int = 0,
                        scale: float = 0.0) -> np.ndarray:
    """Attention in float64, written from the definition: rotate Q and K (half-split), scale by 1/sqrt(d) (or
    ``scale``), softmax over the causal (and windowed) keys, weight V. Q, K and V packed in feeds["q"], or K and V
    apart in feeds["k"] and feeds["v"]."""
    q_all = feeds["q"][0].astype(np.float64)
    seq, past = q_all.shape[0], int(feeds["tot"]) - q_all.shape[0]
    keys = feeds["pk"][0, :, :past].astype(np.float64)
    values = feeds["pv"][0, :, :past].astype(np.float64)

    def rotate(x, pos):
        if not half:
            return x
        c, s = feeds["cos"][pos].astype(np.float64), feeds["sin"][pos].astype(np.float64)
        out = x.copy()
        out[..., :half] = x[..., :half] * c - x[..., half:2 * half] * s
        out[..., half:2 * half] = x[..., half:2 * half] * c + x[..., :half] * s
        return out

    k_all = feeds["k"][0].astype(np.float64) if "k" in feeds else q_all[:, heads * d:(heads + kv_heads) * d]
    v_all = feeds["v"][0].astype(np.float64) if "v" in feeds else q_all[:, (heads + kv_heads) * d:]
    new_k = np.stack([rotate(k_all[s].reshape(kv_heads, d), past + s) for s in range(seq)], axis=1)
    new_v = v_all.reshape(seq, kv_heads, d).transpose(1, 0, 2)
    keys, values = np.concatenate([keys, new_k], axis=1), np.concatenate([values, new_v], axis=1)
    out = np.zeros((seq, heads, d))
    for s in range(seq):
        pos = past + s
        lo = max(0, pos - window + 1) if window else 0
        for n in range(heads):
            h = n // (heads // kv_heads)
            q = rotate(q_all[s, n * d:(n + 1) * d], pos) * (scale or 1 / np.sqrt(d))
            scores = keys[h, lo:pos + 1] @ q
            weights = np.exp(scores - scores.max())
            out[s, n] = weights @ values[h, lo:pos + 1] / weights.sum()
    return out.reshape(1, seq, heads * d)


@needs_library
@pytest.mark.parametrize("heads, kv, d, past, seq, half, window", [
    (6, 2, 40, 9, 2, 8, 0),     # a head size ONNX Runtime's kernel refuses (not a multiple of 16)
    (9, 3, 64, 2000, 1, 32, 0),  # a long past split over key chunks
    (4, 2, 32, 30, 9, 16, 6),    # a window
    (4, 1, 64, 69, 2, 32, 0),    # 8 rows: one vector of rows, a last tile of 7 keys
    (8, 1, 32, 101, 4, 16, 5),   # 32 rows: row groups 3 + 1, a window
])
def test_the_kernel_matches_a_float64_reference(heads, kv, d, past, seq, half, window):
    feeds = feeds_for(np.random.default_rng(d), heads, kv, d, past, seq, past + seq + 8, half=half)
    attrs = {"local_window_size": window} if window else {}
    got = session(attention_model(native_attention.DOMAIN, heads, kv, d, half=half, **attrs), True).run(None, feeds)
    np.testing.assert_allclose(got[0], reference_attention(feeds, heads, kv, d, half, window), atol=2e-5, rtol=0)


@needs_library
@pytest.mark.parametrize("case", SHAPES)
def test_the_kernel_matches_onnxruntimes_group_query_attention(case):
    heads, kv, d, past, seq, cap, packed, half, window = SHAPES[case]
    attrs = {"local_window_size": window} if window else {}
    feeds = feeds_for(np.random.default_rng(len(case)), heads, kv, d, past, seq, cap, packed=packed, half=half)
    ref = session(attention_model("com.microsoft", heads, kv, d, packed=packed, rotary=bool(half), half=half,
                                  **attrs), False).run(None, feeds)
    got = session(attention_model(native_attention.DOMAIN, heads, kv, d, packed=packed, rotary=bool(half),
                                  half=half, **attrs), True).run(None, feeds)
    np.testing.assert_allclose(got[0], ref[0], atol=2e-5, rtol=0)
    for mine, theirs in zip(got[1:], ref[1:], strict=True):  # the rows written; the rest is scratch
        np.testing.assert_allclose(mine[:, :, :past + seq], theirs[:, :, :past + seq], atol=2e-6, rtol=0)


@needs_library
def test_sharing_one_buffer_as_past_and_present_writes_the_new_rows_in_place():
    heads, kv, d, past, seq, cap = 9, 3, 64, 600, 3, 1024
    feeds = feeds_for(np.random.default_rng(3), heads, kv, d, past, seq, cap, half=32)
    expected = session(attention_model("com.microsoft", heads, kv, d, half=32), False).run(None, feeds)
    sess = session(attention_model(native_attention.DOMAIN, heads, kv, d, half=32), True)
    binding = sess.io_binding()
    for name in ("q", "sl", "tot", "cos", "sin"):
        binding.bind_cpu_input(name, feeds[name])
    buffers = {n: ort.OrtValue.ortvalue_from_numpy(feeds[n].copy()) for n in ("pk", "pv")}
    binding.bind_output("o", "cpu")  # first, so it is output 0
    for past_name, present_name in (("pk", "ok"), ("pv", "ov")):
        binding.bind_ortvalue_input(past_name, buffers[past_name])
        binding.bind_ortvalue_output(present_name, buffers[past_name])
    sess.run_with_iobinding(binding)
    np.testing.assert_allclose(binding.get_outputs()[0].numpy(), expected[0], atol=2e-5, rtol=0)
    np.testing.assert_allclose(buffers["pk"].numpy()[:, :, :past + seq], expected[1][:, :, :past + seq], atol=2e-6)
    np.testing.assert_allclose(buffers["pv"].numpy()[:, :, :past + seq], expected[2][:, :, :past + seq], atol=0)


@needs_library
def test_the_committed_library_was_built_from_the_committed_source():
    """engine/native/build.sh bakes a hash of the sources into the binary; rebuild after any edit."""
    assert native_library.library_source_hash(LIBRARY) == native_library.source_hash()


@needs_library
@pytest.mark.parametrize("name", ["gemma3", "qwen3", "phi3"])
def test_the_engine_runs_hearths_kernel_and_matches_onnxruntimes(arch_converted, monkeypatch, name):
    converted = arch_converted(name)
    native = Engine.load(converted, "cpu")
    monkeypatch.setenv(native_library.ENV_SWITCH, "0")
    plain = Engine.load(converted, "cpu")
    assert (native.runner.attention, plain.runner.attention) == ("hearth", "onnxruntime")
    vocab = native.runner.config.vocab_size
    prompt = np.random.default_rng(7).integers(0, vocab, 40).tolist()  # past gemma3's 8-key window
    a, b = native.prefill(prompt), plain.prefill(prompt)
    np.testing.assert_allclose(a, b, atol=1e-4, rtol=0)
    for _ in range(6):  # decode steps, each over the other's cache contents being the same
        token = int(np.argmax(a))
        a, b = native.runner.forward([token], native.cache), plain.runner.forward([token], plain.cache)
        np.testing.assert_allclose(a, b, atol=1e-4, rtol=0)


def test_a_float16_graph_or_one_with_a_feature_the_kernel_lacks_keeps_onnxruntimes(tmp_path, tiny_converted):
    assert native_attention.native_graph(tiny_converted("int4-half").onnx_path) is None
    model = attention_model("com.microsoft", 2, 1, 64, rotary=False, softcap=30.0)
    path = tmp_path / "softcap.onnx"
    path.write_bytes(model)
    assert native_attention.native_graph(path) is None
    no_attention = tmp_path / "none.onnx"
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    no_attention.write_bytes(helper.make_model(graph).SerializeToString())
    assert native_attention.native_graph(no_attention) is None


def test_turned_off_by_the_environment_the_runner_uses_onnxruntimes_kernel(tiny_converted, monkeypatch):
    monkeypatch.setenv(native_library.ENV_SWITCH, "0")
    runner = ModelRunner(tiny_converted("int4").onnx_path, "cpu")
    assert runner.attention == "onnxruntime"
    assert runner.forward([1, 2, 3], runner.new_cache()).shape == (1, runner.config.vocab_size)


def test_a_library_that_does_not_load_falls_back_with_a_warning(tiny_converted, tmp_path, caplog):
    broken = tmp_path / "libhearth_kernels.so"
    broken.write_bytes(b"\x7fELF but not really a shared library")
    opened = []
    with caplog.at_level(logging.WARNING, logger="engine.runtime.native_attention"):
        result = native_attention.open_native_session(
            tiny_converted("int4").onnx_path, session_options(1), lambda m, o: opened.append(m), library=broken)
    assert result is None and not opened
    assert "native attention unavailable" in caplog.text


@needs_library
@pytest.mark.parametrize("problem, change, message", [
    ("seqlens_k disagrees with the total", {"sl": np.array([5], np.int32)}, "seqlens_k must be"),
    ("more rows than the cache holds", {"sl": np.array([40], np.int32), "tot": np.array(41, np.int32)},
     "does not fit the cache"),
    ("a position past the rotary tables", {"cos": np.zeros((3, 32), np.float32), "sin": np.zeros((3, 32), np.float32)},
     "past the rotary cache"),
    ("a query narrower than the heads", {"q": np.zeros((1, 2, 64), np.float32)}, "query width"),
    ("past rows of the wrong head count", {"pk": np.zeros((1, 2, 32, 64), np.float32),
                                           "pv": np.zeros((1, 2, 32, 64), np.float32)}, "past key/value"),
])
def test_bad_inputs_are_refused_with_a_plain_message(problem, change, message):
    feeds = feeds_for(np.random.default_rng(1), 2, 1, 64, 6, 2, 32, half=32)
    feeds.update(change)
    sess = session(attention_model(native_attention.DOMAIN, 2, 1, 64, half=32, free_shapes=True), True)
    with pytest.raises(Exception, match=message):
        sess.run(None, feeds)


@needs_library
@pytest.mark.parametrize("attrs", [{"softcap": 50.0}, {"rotary_interleaved": 1}, {"num_heads": 3}])
def test_attributes_the_kernel_lacks_fail_when_the_session_is_made(attrs):
    heads = attrs.pop("num_heads", 4)
    model = attention_model(native_attention.DOMAIN, heads, 2, 64, half=32, **attrs)
    with pytest.raises(Exception, match="hearth.Attention"):
        session(model, True)


def test_every_architecture_qualifies_for_the_kernel(arch_converted):
    for name in ARCH_SPECS:
        assert native_attention.native_graph(arch_converted(name).onnx_path) is not None, name
