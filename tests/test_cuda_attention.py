"""Hearth's CUDA decode attention (ai.hearth.cuda.Attention): which nodes the decode session renames, and on the
GPU the kernel against the float64 definition and ONNX Runtime's GroupQueryAttention, inside a replayed CUDA graph,
every input it refuses, and the engine's decode steps with it against ONNX Runtime's."""

from __future__ import annotations

import logging

import numpy as np
import onnx
import pytest
from onnx import TensorProto

from engine.model.synthetic import SyntheticSpec, write_synthetic_gguf
from engine.runtime import cuda_attention, cuda_kernels, providers
from tests.test_native_attention import attention_model, feeds_for, reference_attention

DOMAIN = cuda_kernels.DOMAIN


def _graph_file(tmp_path, model: bytes, kv_dtype: str = "float16"):
    proto = onnx.load_from_string(model)
    onnx.helper.set_model_props(proto, {"hearth.kv_dtype": kv_dtype})
    path = tmp_path / "attention.onnx"
    path.write_bytes(proto.SerializeToString())
    return path


def _ops(model: bytes) -> list[tuple[str, str]]:
    return [(n.domain, n.op_type) for n in onnx.load_from_string(model).graph.node]


# ---- which nodes the decode session renames (runs everywhere) --------------------------------------------------------
def test_an_fp16_graphs_attention_is_renamed_and_its_opset_added(tmp_path):
    path = _graph_file(tmp_path, attention_model("com.microsoft", 32, 8, 128, half=64, dtype=TensorProto.FLOAT16))
    model = cuda_attention.decode_graph(path)
    assert model is not None and _ops(model) == [(DOMAIN, "Attention")]
    assert DOMAIN in {o.domain for o in onnx.load_from_string(model).opset_import}


@pytest.mark.parametrize("why, heads, kv, d, attrs", [
    ("softcap", 4, 1, 64, {"softcap": 30.0}),
    ("interleaved rotary", 4, 1, 64, {"rotary_interleaved": 1}),
    ("a head size not compiled", 4, 1, 48, {}),
    ("nine query heads a KV head", 9, 1, 64, {}),
])
def test_a_node_the_kernel_cannot_run_keeps_onnxruntimes(tmp_path, why, heads, kv, d, attrs):
    model = attention_model("com.microsoft", heads, kv, d, half=16, dtype=TensorProto.FLOAT16, **attrs)
    assert cuda_attention.decode_graph(_graph_file(tmp_path, model)) is None, why


def test_an_fp32_cache_keeps_onnxruntimes(tmp_path):
    path = _graph_file(tmp_path, attention_model("com.microsoft", 8, 2, 64, half=32), kv_dtype="float32")
    assert cuda_attention.decode_graph(path) is None


def test_a_converted_cuda_graph_has_every_layer_renamed(arch_converted):
    path = arch_converted("llama-q4km", cuda_kernels.PRECISION).onnx_path  # head size 64
    model = cuda_attention.decode_graph(path)
    assert model is not None
    ops = _ops(model)
    assert ops.count((DOMAIN, "Attention")) == 2 and ("com.microsoft", "GroupQueryAttention") not in ops


def _decode_ops(tmp_path, monkeypatch, name: str, fold: bool):
    """(the converted graph of ENGINE_SPECS[name], its decode graph with the fold switch as given)."""
    from engine.model.convert import ensure_converted

    spec, precision = ENGINE_SPECS[name]
    path = ensure_converted(write_synthetic_gguf(tmp_path / f"{name}.gguf", spec), precision,
                            tmp_path / "conv").onnx_path
    monkeypatch.setenv(cuda_attention.FOLD_SWITCH, "1" if fold else "0")
    model = onnx.load_from_string(cuda_attention.decode_graph(path))
    return onnx.load(str(path), load_external_data=False), model


def test_the_qk_norms_fold_into_the_attention_only_when_asked(tmp_path, monkeypatch):
    """Gemma 3's Split → Reshape → per-head RMSNorm → Reshape for q and k become the Attention's own inputs: it reads
    the packed Q|K|V and the two gains; the other norms (the layers' post-norms) stay."""
    converted, plain = _decode_ops(tmp_path, monkeypatch, "gemma3", fold=False)
    _, folded = _decode_ops(tmp_path, monkeypatch, "gemma3", fold=True)

    def count(model, op):
        return sum(n.op_type == op for n in model.graph.node)

    layers = count(converted, "GroupQueryAttention")
    assert layers == 6 and count(plain, "Attention") == layers
    assert all(len(n.input) <= 9 for n in plain.graph.node if n.op_type == "Attention")
    assert count(folded, "SimplifiedLayerNormalization") == count(plain, "SimplifiedLayerNormalization") - 2 * layers
    assert count(folded, "Split") == count(plain, "Split") - layers
    producers = {o: n for n in folded.graph.node for o in n.output}
    for node in (n for n in folded.graph.node if n.op_type == "Attention"):
        assert len(node.input) == 11 and node.input[1:3] == ["", ""]
        assert producers[node.input[0]].op_type == "MatMulQ"  # the packed projection itself
        gains = {i.name: i for i in converted.graph.initializer}
        assert node.input[9] in gains and node.input[10] in gains
        assert [a.f for a in node.attribute if a.name == "qk_norm_eps"] == [pytest.approx(1e-5)]  # the GGUF's


def test_the_fold_is_the_default(tmp_path, monkeypatch):
    """With HEARTH_CUDA_ATTENTION_FOLD unset the decode graph folds Gemma 3's QK norms in, as "1" does."""
    from engine.model.convert import ensure_converted

    _, folded = _decode_ops(tmp_path, monkeypatch, "gemma3", fold=True)
    _, plain = _decode_ops(tmp_path, monkeypatch, "gemma3", fold=False)
    monkeypatch.delenv(cuda_attention.FOLD_SWITCH)
    precision = ENGINE_SPECS["gemma3"][1]
    path = ensure_converted(tmp_path / "gemma3.gguf", precision, tmp_path / "conv").onnx_path  # converted above
    default = onnx.load_from_string(cuda_attention.decode_graph(path))
    assert [n.op_type for n in default.graph.node] == [n.op_type for n in folded.graph.node]
    assert len(default.graph.node) < len(plain.graph.node)


def test_qwen2s_qkv_bias_folds_into_the_attention_only_when_asked(tmp_path, monkeypatch):
    converted, plain = _decode_ops(tmp_path, monkeypatch, "qwen2", fold=False)
    _, folded = _decode_ops(tmp_path, monkeypatch, "qwen2", fold=True)
    adds = [sum(n.op_type == "Add" for n in m.graph.node) for m in (plain, folded)]
    assert adds[1] == adds[0] - 2  # one a layer
    producers = {o: n for n in folded.graph.node for o in n.output}
    constants = {i.name: i for i in converted.graph.initializer}
    for node in (n for n in folded.graph.node if n.op_type == "Attention"):
        assert len(node.input) == 12 and node.input[9:11] == ["", ""]
        assert node.input[11].endswith(".bias") and list(constants[node.input[11]].dims) == [(4 + 2 * 2) * 64]
        assert node.input[11] not in producers[node.input[0]].input  # reads the projection before its bias
    assert all(len(n.input) == 9 for n in plain.graph.node if n.op_type == "Attention")


def test_a_graph_without_qk_norms_folds_nothing(monkeypatch, tmp_path):
    monkeypatch.setenv(cuda_attention.FOLD_SWITCH, "1")
    path = _graph_file(tmp_path, attention_model("com.microsoft", 8, 2, 64, half=32, dtype=TensorProto.FLOAT16))
    model = onnx.load_from_string(cuda_attention.decode_graph(path))
    assert [len(n.input) for n in model.graph.node] == [9]


def test_the_switch_keeps_onnxruntimes(monkeypatch):
    monkeypatch.setenv(cuda_attention.ENV_SWITCH, "0")
    assert cuda_attention.unavailable() == "HEARTH_CUDA_ATTENTION=0"
    monkeypatch.setenv(cuda_attention.ENV_SWITCH, "1")
    monkeypatch.setenv(cuda_kernels.ENV_SWITCH, "0")
    assert cuda_attention.unavailable() == "HEARTH_CUDA_KERNELS=0"


def test_without_the_kernels_the_decode_session_opens_the_graph_as_it_is(monkeypatch, tmp_path):
    monkeypatch.setenv(cuda_kernels.ENV_SWITCH, "0")
    path = _graph_file(tmp_path, attention_model("com.microsoft", 8, 2, 64, half=32, dtype=TensorProto.FLOAT16))
    assert cuda_attention.decode_model(path, object()) is None  # nothing registered on the options


# ---- on the GPU ------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cuda():
    why = providers.cuda_unavailable() or cuda_kernels.unavailable()
    if why:
        pytest.skip(f"Hearth's CUDA kernels cannot run here: {why}")


def _session(model: bytes, graph: bool = False):
    import onnxruntime as ort

    options = ort.SessionOptions()
    cuda_kernels.register_library(options)
    provider = [(providers.ort_name("cuda"), {"enable_cuda_graph": "1" if graph else "0"})]
    session = ort.InferenceSession(model, options, providers=provider)
    assert session.get_providers()[0] == "CUDAExecutionProvider"
    return session


def _half(feeds: dict) -> dict:
    return {k: v.astype(np.float16) if v.dtype == np.float32 else v for k, v in feeds.items()}


# heads, kv heads, head size, past rows, capacity, packed, rotary half-width, window, scale
CASES = {
    "Llama-3-8B's heads over 3,000 keys: many splits merged": (32, 8, 128, 3000, 4096, True, 64, 0, 0.0),
    "SmolLM2's group of 3, run as 4": (9, 3, 64, 700, 1024, True, 32, 0, 0.0),
    "Gemma 3's: one KV head of 256, q/k/v apart, a window, a scale": (4, 1, 256, 900, 1024, False, 128, 512, 0.0625),
    "the first token": (8, 2, 128, 0, 64, True, 64, 0, 0.0),
    "head size 96, a group of 1, partial rotary": (4, 4, 96, 150, 256, True, 16, 0, 0.0),
    "a group of 8, no rotary": (16, 2, 64, 260, 512, True, 0, 0, 0.0),
    "a group of 6, a window longer than the past": (12, 2, 64, 300, 512, True, 32, 1000, 0.0),
    "a window of 1: the new key alone": (8, 2, 64, 40, 64, True, 32, 1, 0.0),
    # the tile's shapes: two lanes a key row at head size 256, whole tiles of value rows in flight, a merge whose
    # threads take several items each (and one whose items do not fill the last round), many passes of a split
    "Qwen2.5-7B's group of 7 over 7,000 keys": (28, 4, 128, 7000, 8192, True, 64, 0, 0.0),
    "Gemma 3's global layer at 7,000 keys": (4, 1, 256, 7000, 8192, False, 128, 0, 0.0625),
    "head size 256, a group of 8, a past of 901": (16, 2, 256, 901, 1024, True, 128, 0, 0.0),
    "head size 96, a group of 8": (16, 2, 96, 500, 512, True, 48, 0, 0.0),
}


def _case(name: str):
    heads, kv, d, past, cap, packed, half, window, scale = CASES[name]
    attrs = {"local_window_size": window} if window else {}
    if scale:
        attrs["scale"] = scale
    feeds = _half(feeds_for(np.random.default_rng(len(name)), heads, kv, d, past, 1, cap, packed=packed, half=half))
    return (heads, kv, d, past, packed, half, window, scale), attrs, feeds


@pytest.mark.gpu
@pytest.mark.parametrize("name", CASES)
def test_the_kernel_matches_float64_and_onnxruntimes_attention(cuda, name):
    (heads, kv, d, past, packed, half, window, scale), attrs, feeds = _case(name)
    build = dict(packed=packed, rotary=bool(half), half=half, dtype=TensorProto.FLOAT16, **attrs)
    got = _session(attention_model(DOMAIN, heads, kv, d, **build)).run(None, feeds)
    theirs = _session(attention_model("com.microsoft", heads, kv, d, **build)).run(None, feeds)
    want = reference_attention(feeds, heads, kv, d, half, window, scale)
    np.testing.assert_allclose(got[0].astype(np.float64), want, atol=4e-3, rtol=0)
    np.testing.assert_allclose(got[0], theirs[0], atol=4e-3, rtol=0)
    for mine, ort_rows in zip(got[1:], theirs[1:], strict=True):  # the rows written: the past and the new one
        np.testing.assert_allclose(mine[:, :, :past + 1].astype(np.float32), ort_rows[:, :, :past + 1], atol=4e-3,
                                   rtol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("heads, kv, d, past, half, window", [
    (4, 1, 256, 900, 128, 512),  # Gemma 3 270M's heads and window
    (16, 8, 128, 300, 64, 0),    # Qwen3's
])
def test_the_folded_qk_norms_match_float64(cuda, heads, kv, d, past, half, window):
    """Inputs 9 and 10 (the QK norms' gains): q's heads and the new key RMS-normed (rounded to fp16, as the graph's
    norm node stores them) before rotating, against the float64 definition of the same."""
    eps = 1e-6
    attrs = {"local_window_size": window} if window else {}
    proto = onnx.load_from_string(attention_model(DOMAIN, heads, kv, d, half=half, dtype=TensorProto.FLOAT16, **attrs))
    node = proto.graph.node[0]
    node.input.extend(["qg", "kg"])
    node.attribute.append(onnx.helper.make_attribute("qk_norm_eps", eps))
    proto.graph.input.extend([onnx.helper.make_tensor_value_info(n, TensorProto.FLOAT16, [d]) for n in ("qg", "kg")])
    rng = np.random.default_rng(d + heads)
    feeds = _half(feeds_for(rng, heads, kv, d, past, 1, past + 64, half=half))
    feeds["q"] = (feeds["q"].astype(np.float32) * 7.0).astype(np.float16)  # norms that matter
    feeds["qg"], feeds["kg"] = (rng.uniform(0.5, 1.5, d).astype(np.float16) for _ in range(2))
    got = _session(proto.SerializeToString()).run(None, feeds)[0].astype(np.float64)

    def normed(x, gain):  # [..., d]
        x = x.astype(np.float64)
        return (x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * gain.astype(np.float64)).astype(np.float16)

    qkv = feeds["q"][0, 0]
    q = normed(qkv[:heads * d].reshape(heads, d), feeds["qg"]).reshape(-1)
    k = normed(qkv[heads * d:(heads + kv) * d].reshape(kv, d), feeds["kg"]).reshape(-1)
    want = reference_attention({**feeds, "q": np.concatenate([q, k, qkv[(heads + kv) * d:]])[None, None]}, heads, kv,
                               d, half, window)
    np.testing.assert_allclose(got, want, atol=4e-3, rtol=0)


@pytest.mark.gpu
def test_the_folded_qkv_bias_matches_float64(cuda):
    """Input 11 (the packed Q|K|V's bias): added to q, the new key and value (rounded to fp16, as the graph's Add
    stores the sum) before rotating, against the float64 definition of the same."""
    heads, kv, d, past, half = 28, 4, 128, 500, 64  # Qwen2.5-7B's heads: a group of 7, run as 8
    proto = onnx.load_from_string(attention_model(DOMAIN, heads, kv, d, half=half, dtype=TensorProto.FLOAT16))
    proto.graph.node[0].input.extend(["", "", "bias"])
    width = (heads + 2 * kv) * d
    proto.graph.input.append(onnx.helper.make_tensor_value_info("bias", TensorProto.FLOAT16, [width]))
    rng = np.random.default_rng(11)
    feeds = _half(feeds_for(rng, heads, kv, d, past, 1, past + 64, half=half))
    feeds["bias"] = rng.standard_normal(width).astype(np.float16)
    out, _, values = _session(proto.SerializeToString()).run(None, feeds)
    biased = (feeds["q"].astype(np.float32) + feeds["bias"].astype(np.float32)).astype(np.float16)
    want = reference_attention({**feeds, "q": biased}, heads, kv, d, half)
    np.testing.assert_allclose(out.astype(np.float64), want, atol=4e-3, rtol=0)
    np.testing.assert_array_equal(values[0, :, past], biased[0, 0, (heads + kv) * d:].reshape(kv, d))


@pytest.mark.gpu
def test_a_replayed_cuda_graph_takes_each_steps_length_from_the_device(cuda):
    """The decode session's way: past and present one buffer, seqlens_k on the GPU written in place, the host's
    total fixed at the capacity; five steps replayed from one capture, each against the float64 definition, the
    later ones over more keys than one split takes (the merge's counter reset between launches)."""
    import onnxruntime as ort

    heads, kv, d, half, cap = 8, 2, 128, 64, 2048
    session = _session(attention_model(DOMAIN, heads, kv, d, half=half, dtype=TensorProto.FLOAT16), graph=True)
    rng = np.random.default_rng(3)
    feeds = _half(feeds_for(rng, heads, kv, d, 0, 1, cap, half=half))
    on_gpu = {n: ort.OrtValue.ortvalue_from_numpy(feeds[n], "cuda", 0) for n in ("q", "pk", "pv", "cos", "sin")}
    seqlens = ort.OrtValue.ortvalue_from_numpy(np.zeros(1, np.int32), "cuda", 0)
    total = ort.OrtValue.ortvalue_from_numpy(np.array(cap, np.int32))
    out = ort.OrtValue.ortvalue_from_shape_and_type([1, 1, heads * d], np.float16, "cuda", 0)
    binding = session.io_binding()
    for name in ("q", "cos", "sin"):
        binding.bind_ortvalue_input(name, on_gpu[name])
    binding.bind_ortvalue_input("sl", seqlens)
    binding.bind_ortvalue_input("tot", total)
    binding.bind_ortvalue_output("o", out)
    for past_name, present_name in (("pk", "ok"), ("pv", "ov")):
        binding.bind_ortvalue_input(past_name, on_gpu[past_name])
        binding.bind_ortvalue_output(present_name, on_gpu[past_name])
    for past in (5, 6, 700, 1500, 1501):
        q = rng.standard_normal((1, 1, (heads + 2 * kv) * d)).astype(np.float16)
        on_gpu["q"].update_inplace(q)
        seqlens.update_inplace(np.array([past], np.int32))
        before = {n: on_gpu[n].numpy() for n in ("pk", "pv")}
        session.run_with_iobinding(binding)
        step = {**feeds, "q": q, "pk": before["pk"], "pv": before["pv"], "tot": np.array(past + 1, np.int32)}
        want = reference_attention(step, heads, kv, d, half)
        np.testing.assert_allclose(out.numpy().astype(np.float64), want, atol=4e-3, rtol=0, err_msg=f"past {past}")
        np.testing.assert_array_equal(on_gpu["pv"].numpy()[0, :, past], q[0, 0, (heads + kv) * d:].reshape(kv, d))


@pytest.mark.gpu
@pytest.mark.parametrize("what, change, message", [
    ("two new tokens", {"q": lambda f: np.concatenate([f["q"], f["q"]], axis=1)}, "runs one decode step"),
    ("a total past the cache", {"tot": lambda f: np.array(5000, np.int32)}, "does not fit the cache"),
    ("a total of 0", {"tot": lambda f: np.array(0, np.int32)}, "does not fit the cache"),
    ("two batch rows", {"sl": lambda f: np.array([3, 3], np.int32)}, "batch size must be 1"),
    ("a query of the wrong width", {"q": lambda f: f["q"][:, :, :-8]}, "the heads need"),
    ("a past of another KV head count", {"pk": lambda f: f["pk"][:, :1], "pv": lambda f: f["pv"][:, :1]},
     "past key and value must both be"),
    ("a past key and value apart in shape", {"pv": lambda f: f["pv"][:, :, :32]}, "past key and value must both be"),
    ("cos and sin of different widths", {"sin": lambda f: f["sin"][:, :-1]}, "cos and sin caches must be"),
    ("a rotary wider than the head", {"cos": lambda f: np.tile(f["cos"], 3), "sin": lambda f: np.tile(f["sin"], 3)},
     "at most half the head"),
])
def test_bad_inputs_are_refused_with_what_is_wrong(cuda, what, change, message):
    feeds = _half(feeds_for(np.random.default_rng(1), 8, 2, 64, 10, 1, 64, half=32))
    for name, make in change.items():
        feeds[name] = make(feeds)
    session = _session(attention_model(DOMAIN, 8, 2, 64, half=32, dtype=TensorProto.FLOAT16, free_shapes=True))
    with pytest.raises(Exception, match=message):
        session.run(None, feeds)


def _with_inputs(model: bytes, extra: dict, **attrs) -> bytes:
    """The attention model with Hearth's optional inputs set: {index: (name, shape)}, as free-shaped fp16 inputs."""
    proto = onnx.load_from_string(model)
    node = proto.graph.node[0]
    names = list(node.input) + [""] * (max(extra, default=0) + 1 - len(node.input))
    for index, (name, shape) in extra.items():
        names[index] = name
        proto.graph.input.append(onnx.helper.make_tensor_value_info(name, TensorProto.FLOAT16, shape))
    del node.input[:]
    node.input.extend(names)
    node.attribute.extend(onnx.helper.make_attribute(k, v) for k, v in attrs.items())
    return proto.SerializeToString()


@pytest.mark.gpu
@pytest.mark.parametrize("what, extra, sizes, message", [
    ("a q gain without a k gain", {9: ("qg", [64])}, {"qg": 64}, "need both gains or neither"),
    ("gains of the wrong size", {9: ("qg", [None]), 10: ("kg", [None])}, {"qg": 32, "kg": 32}, "must be \\[64\\]"),
    ("a bias beside the QK norms", {9: ("qg", [64]), 10: ("kg", [64]), 11: ("b", [768])},
     {"qg": 64, "kg": 64, "b": 768}, "a qkv bias goes with"),
    ("a bias of the wrong size", {11: ("b", [None])}, {"b": 700}, "a qkv bias goes with"),
])
def test_bad_gains_and_biases_are_refused(cuda, what, extra, sizes, message):
    feeds = _half(feeds_for(np.random.default_rng(5), 8, 2, 64, 10, 1, 64, half=32))
    feeds.update({name: np.ones(n, np.float16) for name, n in sizes.items()})
    model = _with_inputs(attention_model(DOMAIN, 8, 2, 64, half=32, dtype=TensorProto.FLOAT16), extra)
    with pytest.raises(Exception, match=message):
        _session(model).run(None, feeds)


@pytest.mark.gpu
def test_a_key_without_a_value_and_a_rotary_without_its_tables_are_refused(cuda):
    feeds = _half(feeds_for(np.random.default_rng(6), 8, 2, 64, 10, 1, 64, packed=False))
    proto = onnx.load_from_string(attention_model(DOMAIN, 8, 2, 64, packed=False, rotary=False,
                                                  dtype=TensorProto.FLOAT16))
    proto.graph.node[0].input[2] = ""
    del proto.graph.input[[i.name for i in proto.graph.input].index("v")]
    with pytest.raises(Exception, match="key given without value"):
        _session(proto.SerializeToString()).run(None, {k: v for k, v in feeds.items() if k != "v"})
    rotary = attention_model(DOMAIN, 8, 2, 64, packed=False, rotary=False, dtype=TensorProto.FLOAT16, do_rotary=1)
    with pytest.raises(Exception, match="do_rotary needs cos_cache and sin_cache"):
        _session(rotary).run(None, feeds)


@pytest.mark.gpu
def test_a_head_size_not_compiled_is_refused_when_it_runs(cuda):
    feeds = _half(feeds_for(np.random.default_rng(2), 4, 1, 48, 10, 1, 64, half=16))
    session = _session(attention_model(DOMAIN, 4, 1, 48, half=16, dtype=TensorProto.FLOAT16))
    with pytest.raises(Exception, match="head size 48 .* is not compiled"):
        session.run(None, feeds)


@pytest.mark.gpu
@pytest.mark.parametrize("heads, kv, attrs, message", [
    (9, 1, {}, "at most 8 query heads a KV head"),
    (6, 4, {}, "must be a positive multiple"),
    (8, 2, {"softcap": 30.0}, "softcap are not supported"),
    (8, 2, {"scale": -1.0}, "scale must not be negative"),
    (8, 2, {"qk_norm_eps": 0.0}, "qk_norm_eps must be positive"),
    (8, 2, {"smooth_softmax": 1}, "smooth softmax"),
])
def test_attributes_it_cannot_run_are_refused_when_the_session_opens(cuda, heads, kv, attrs, message):
    with pytest.raises(Exception, match=message):
        _session(attention_model(DOMAIN, heads, kv, 64, half=32, dtype=TensorProto.FLOAT16, **attrs))


# Models whose heads the kernel compiles (the suite's usual tiny models have heads of 16 and 32): Gemma 3's layout
# (q/k/v apart after their norms, a scale, an 8-key window on five layers of six) on Hearth's matmuls, a llama with
# groups of 3 at head size 64 and Phi-3's head size 96 with a group of 1 on ONNX Runtime's (int4-half: the decode
# session then loads the library for the attention alone); a context long enough for several splits. The matmuls
# keep fp16 activations where the synthetic models' wide logits would turn the int8 ones' rounding into noise
# (tests/test_gpu.py).
ENGINE_SPECS = {
    "gemma3": (SyntheticSpec(architecture="gemma3", n_layers=6, n_embd=128, n_head=4, n_head_kv=1, head_dim=64,
                             n_ff=256, rope_base=1e6, sliding_window=8, context_length=1024, seed=21),
               cuda_kernels.PRECISION),
    "llama": (SyntheticSpec(n_embd=192, n_head=3, n_head_kv=1, n_ff=384, context_length=1024, seed=22), "int4-half"),
    "phi3": (SyntheticSpec(architecture="phi3", n_embd=192, n_head=2, n_head_kv=2, n_ff=384, context_length=1024,
                           seed=23), "int4-half"),
    "qwen2": (SyntheticSpec(architecture="qwen2", n_embd=256, n_head=4, n_head_kv=2, n_ff=512, rope_base=1e6,
                            context_length=1024, seed=24), "int4-half"),
}


@pytest.mark.gpu
@pytest.mark.parametrize("name", [*ENGINE_SPECS, "gemma3 folded", "qwen2 folded"])
def test_the_engines_decode_steps_match_onnxruntimes_attention(cuda, monkeypatch, tmp_path, name):
    """Each layout's decode steps with Hearth's attention against ONNX Runtime's, with the QK norms or the QKV bias
    left to the graph (HEARTH_CUDA_ATTENTION_FOLD=0) and, "folded", folded into it (the default)."""
    from engine.model.convert import ensure_converted
    from engine.runtime.runner import ModelRunner

    monkeypatch.setenv(cuda_attention.FOLD_SWITCH, "1" if name.endswith(" folded") else "0")
    name = name.split()[0]
    spec, precision = ENGINE_SPECS[name]
    gguf = write_synthetic_gguf(tmp_path / f"{name}.gguf", spec)
    path = ensure_converted(gguf, precision, tmp_path / "converted").onnx_path
    runners = {}
    for switch in ("1", "0"):
        monkeypatch.setenv(cuda_attention.ENV_SWITCH, switch)
        runners[switch] = ModelRunner(path, "cuda", cpu_fallback=False)
    assert runners["1"].graph.attention == "hearth (CUDA)" and runners["0"].graph.attention == "onnxruntime"
    prompt = np.random.default_rng(4).integers(0, runners["1"].config.vocab_size, 600).tolist()
    caches = {s: r.new_cache() for s, r in runners.items()}
    logits = {s: r.forward(prompt, caches[s]) for s, r in runners.items()}  # prefill: ONNX Runtime's in both
    for step in range(8):
        token = int(np.argmax(logits["0"][-1]))
        logits = {s: r.forward([token], caches[s]) for s, r in runners.items()}
        scale = np.abs(logits["0"]).max()
        np.testing.assert_allclose(logits["1"], logits["0"], atol=0.01 * scale, rtol=0, err_msg=f"step {step}")
    keys = {s: c.export()[0].astype(np.float32) for s, c in caches.items()}
    # later rows come from hidden states the two attentions rounded apart: ~1% of a key's size
    np.testing.assert_allclose(keys["1"], keys["0"], atol=0.01 * np.abs(keys["0"]).max(), rtol=0)


_DECODE_IN_A_CHILD = """
import sys
from pathlib import Path
import numpy as np
from engine.model.convert import ensure_converted
from engine.model.synthetic import write_synthetic_gguf
from engine.runtime.runner import ModelRunner
from tests.test_cuda_attention import ENGINE_SPECS
spec, precision = ENGINE_SPECS["gemma3"]
out = sys.argv[1]
path = ensure_converted(write_synthetic_gguf(Path(out + ".gguf"), spec), precision, Path(out + "-conv")).onnx_path
runner = ModelRunner(path, "cuda", cpu_fallback=False)
cache = runner.new_cache()
steps = [runner.forward(np.random.default_rng(4).integers(0, runner.config.vocab_size, 300).tolist(), cache)[-1:]]
for _ in range(12):
    steps.append(runner.forward([int(np.argmax(steps[-1][-1]))], cache))
np.save(out + ".npy", np.concatenate(steps).astype(np.float32))
"""


@pytest.mark.gpu
def test_decode_steps_launched_programmatically_dependent_match_plain_launches(cuda, tmp_path):
    """HEARTH_CUDA_PDL=0 (read once a process, so in children): the int4-cuda-blocks Gemma 3 layout's decode steps,
    whose GEMVs, quantizers and attentions start before the kernel ahead of them ends where the GPU can (compute
    capability 9.0), against the same steps launched plainly: the same logits (the kernels' sums keep their order)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    logits = {}
    for pdl in ("1", "0"):
        out = str(tmp_path / f"pdl{pdl}")
        result = subprocess.run([sys.executable, "-c", _DECODE_IN_A_CHILD, out], capture_output=True, text=True,
                                env={**os.environ, "HEARTH_CUDA_PDL": pdl}, timeout=300,
                                cwd=str(Path(__file__).resolve().parent.parent))
        assert result.returncode == 0, result.stderr[-2000:]
        logits[pdl] = np.load(out + ".npy")
    assert logits["1"].shape[0] == 13
    np.testing.assert_allclose(logits["1"], logits["0"], atol=1e-3 * np.abs(logits["0"]).max(), rtol=0)
    assert (logits["1"].argmax(-1) == logits["0"].argmax(-1)).all()


@pytest.mark.gpu
def test_a_decode_session_that_will_not_open_with_hearths_attention_keeps_onnxruntimes(cuda, monkeypatch, tmp_path,
                                                                                       caplog):
    """A renamed graph the kernel refuses when the session opens (here a softcap on every node) leaves the decode
    session on the graph as converted, with a warning, decoding as before."""
    from engine.model.convert import ensure_converted
    from engine.runtime.runner import ModelRunner

    spec, precision = ENGINE_SPECS["llama"]
    path = ensure_converted(write_synthetic_gguf(tmp_path / "l.gguf", spec), precision, tmp_path / "conv").onnx_path
    rename = cuda_attention._rename

    def refused(model) -> bool:
        renamed = rename(model)
        for node in (n for n in model.graph.node if n.op_type == "Attention"):
            node.attribute.append(onnx.helper.make_attribute("softcap", 30.0))
        return renamed

    monkeypatch.setattr(cuda_attention, "_rename", refused)
    with caplog.at_level(logging.WARNING, logger="engine.runtime.cuda_graph"):
        runner = ModelRunner(path, "cuda", cpu_fallback=False)
    assert runner.graph.attention == "onnxruntime" and "CUDA decode attention unavailable" in caplog.text
    monkeypatch.setenv(cuda_attention.ENV_SWITCH, "0")
    plain = ModelRunner(path, "cuda", cpu_fallback=False)
    caches = (runner.new_cache(), plain.new_cache())
    for r, c in zip((runner, plain), caches, strict=True):
        r.forward([1, 2, 3], c)
    np.testing.assert_array_equal(runner.forward([4], caches[0]), plain.forward([4], caches[1]))
