"""Hearth's CUDA kernels (engine/native/cuda/, ``ai.hearth.cuda``): the prebuilt library against its sources, the
graph that runs on them, and — where a GPU is — each kernel against a float64 reference and ONNX Runtime's own
fp16 MatMul, and every bad input. The GPU tests skip cleanly without CUDA."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, quants
from onnx import TensorProto, helper, numpy_helper

from engine.errors import ModelFileError
from engine.model.synthetic import random_k_blocks
from engine.runtime import cuda_kernels, providers

TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"]
# Byte offsets of each 32-weight block type's fp16 fields (d, and m for the _1 types), and its size.
_SMALL_BLOCKS = {"Q4_0": (18, (0,)), "Q4_1": (20, (0, 2)), "Q5_0": (22, (0,)), "Q5_1": (24, (0, 2)),
                 "Q8_0": (34, (0,))}


def blocks(rng: np.random.Generator, type_name: str, n: int, k: int) -> np.ndarray:
    """``n`` random rows of ``type_name`` blocks ([n, bytes per row] uint8), weights of about unit spread / √k."""
    if type_name not in _SMALL_BLOCKS:
        return random_k_blocks(rng, type_name, n, k, 1.0)
    size, halves = _SMALL_BLOCKS[type_name]
    raw = rng.integers(0, 256, (n, k // 32, size), dtype=np.uint8)
    for at in halves:
        field = rng.uniform(0.5, 1.5, (n, k // 32)) / np.sqrt(k) / (16 if type_name != "Q8_0" else 128)
        raw[:, :, at:at + 2] = field.astype(np.float16).view(np.uint8).reshape(n, k // 32, 2)
    return raw.reshape(n, -1)


def dequantized(raw: np.ndarray, type_name: str) -> np.ndarray:
    return quants.dequantize(raw, GGMLQuantizationType[type_name]).astype(np.float64).reshape(raw.shape[0], -1)


def act_of(act: int, gate_up: np.ndarray) -> np.ndarray:
    gate, up = np.split(gate_up, 2, axis=-1)
    if act == cuda_kernels.ACT_SILU:
        return gate / (1 + np.exp(-gate)) * up
    return 0.5 * gate * (1 + np.tanh(0.7978845608 * (gate + 0.044715 * gate ** 3))) * up


# ---- everywhere: the library, the switch, the graph ---------------------------------------------------------------
def test_the_prebuilt_library_was_built_from_these_sources():
    library = cuda_kernels.library_path()
    assert library is not None, "engine/native/linux-x86_64/libhearth_cuda.so is missing: run engine/native/cuda/build.sh"
    assert cuda_kernels.library_source_hash(library) == cuda_kernels.source_hash(), \
        "libhearth_cuda.so is stale: rebuild it with engine/native/cuda/build.sh (nvcc) and commit it"


def test_the_switch_turns_the_kernels_off(monkeypatch):
    monkeypatch.setenv(cuda_kernels.ENV_SWITCH, "0")
    assert cuda_kernels.unavailable() == "HEARTH_CUDA_KERNELS=0"


def test_a_graph_on_the_cuda_kernels_refuses_to_open_where_they_cannot_run(monkeypatch, arch_converted):
    from engine.runtime.runner import ModelRunner

    monkeypatch.setenv(cuda_kernels.ENV_SWITCH, "0")
    converted = arch_converted("llama-q4km", cuda_kernels.PRECISION, "last")
    with pytest.raises(ModelFileError, match="runs on Hearth's CUDA kernels, which cannot run here: HEARTH_CUDA_KERNELS=0"):
        ModelRunner(converted.onnx_path, "auto")


def test_the_q4km_graph_runs_every_matrix_from_its_blocks_with_the_mlp_fused(arch_converted):
    """Q4_K_M's mix (Q6_K value rows beside Q4_K query and key rows) in one launch a projection; no Split,
    activation or Mul around the down projection; the table gathered from its blocks."""
    import onnx

    model = onnx.load(str(arch_converted("llama-q4km", cuda_kernels.PRECISION, "last").onnx_path),
                      load_external_data=False)
    ops = [(n.domain, n.op_type) for n in model.graph.node]
    layers = sum(1 for n in model.graph.node if n.op_type == "GroupQueryAttention")
    assert ops.count((cuda_kernels.DOMAIN, "MatMulQ")) == 4 * layers + 1  # QKV, O, gate|up, down; the head
    assert ops.count((cuda_kernels.DOMAIN, "GatherQ")) == 1
    assert not {"Split", "Sigmoid", "Mul", "MatMul", "MatMulNBits", "SimplifiedLayerNormalization"} & {op for _, op in ops}
    # Every pre-norm runs inside the projection that reads it; only the final norm (read by the logits' Slice) is
    # ONNX Runtime's.
    assert ops.count(("com.microsoft", "SkipSimplifiedLayerNormalization")) == 1
    normed = [n for n in model.graph.node if n.op_type == "MatMulQ" and len(n.input) == 6]
    assert len(normed) == 2 * layers and sum(len(n.output) > 1 and bool(n.output[1]) for n in normed) == 2 * layers - 1
    # int8 activations, each MatMulQ quantizing x into its own scratch output (its third)
    matmuls = [n for n in model.graph.node if n.op_type == "MatMulQ"]
    assert all(len(n.output) == 3 and n.output[2] and any(a.name == "numerics" and a.i == cuda_kernels.NUMERICS_INT8
                                                          for a in n.attribute) for n in matmuls)
    mixed = [n for n in model.graph.node if n.op_type == "MatMulQ" and len(n.input) >= 3]
    assert mixed, "no projection with two block types in one launch"
    downs = [n for n in model.graph.node if any(a.name == "act" for a in n.attribute)]
    assert len(downs) == layers and all(a.i == cuda_kernels.ACT_SILU for n in downs for a in n.attribute if a.name == "act")


def test_gemma_gates_its_down_projection_with_gelu(arch_converted):
    import onnx

    model = onnx.load(str(arch_converted("gemma3", cuda_kernels.PRECISION, "last").onnx_path), load_external_data=False)
    acts = [a.i for n in model.graph.node for a in n.attribute if n.op_type == "MatMulQ" and a.name == "act"]
    assert acts and set(acts) == {cuda_kernels.ACT_GELU_TANH}
    assert not any(n.op_type == "Gelu" for n in model.graph.node)


# ---- on the GPU: each kernel against the float64 reference and ONNX Runtime's own -----------------------------------
@pytest.fixture(scope="module")
def cuda():
    why = providers.cuda_unavailable() or cuda_kernels.unavailable()
    if why:
        pytest.skip(f"Hearth's CUDA kernels cannot run here: {why}")


def _session(nodes, inputs, outputs, initializers, library: bool = True):
    import onnxruntime as ort

    graph = helper.make_graph(nodes, "g", inputs, outputs, initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(cuda_kernels.DOMAIN, 1)])
    model.ir_version = 10
    options = ort.SessionOptions()
    if library:
        cuda_kernels.register_library(options)
    session = ort.InferenceSession(model.SerializeToString(), options, providers=providers.ort_provider_list("cuda"))
    assert session.get_providers()[0] == "CUDAExecutionProvider"
    return session


def _matmul_q(parts: list[tuple[str, np.ndarray]], kx: int, act: int = 0, scratch: bool = False, **extra):
    """One MatMulQ; ``scratch``: with the third output the 8-bit GEMV quantizes x into once (as the converter
    writes it), else it quantizes x in each block."""
    inits = [numpy_helper.from_array(raw, f"w{i}") for i, (_, raw) in enumerate(parts)]
    attrs = {("type", "type1", "type2")[i]: cuda_kernels.TYPE_IDS[t] for i, (t, _) in enumerate(parts)}
    attrs.update(extra)
    node = helper.make_node("MatMulQ", ["x", *(f"w{i}" for i in range(len(parts)))], ["y", "", "q8"] if scratch else ["y"],
                            domain=cuda_kernels.DOMAIN, **attrs, **({"act": act} if act else {}))
    return _session([node], [helper.make_tensor_value_info("x", TensorProto.FLOAT16, ["m", kx])],
                    [helper.make_tensor_value_info("y", TensorProto.FLOAT16, None)], inits)


def _ort_matmul(w: np.ndarray):
    """ONNX Runtime's own CUDA MatMul over the dequantized weights in fp16: what int4-cuda-dense runs."""
    node = helper.make_node("MatMul", ["x", "w"], ["y"])
    return _session([node], [helper.make_tensor_value_info("x", TensorProto.FLOAT16, ["m", w.shape[1]])],
                    [helper.make_tensor_value_info("y", TensorProto.FLOAT16, None)],
                    [numpy_helper.from_array(np.ascontiguousarray(w.T).astype(np.float16), "w")], library=False)


@pytest.mark.gpu
@pytest.mark.parametrize("type_name", TYPES)
@pytest.mark.parametrize("rows", [1, 3, 8, 40])  # the GEMV for up to 8 rows, the slab dequantization + cuBLAS above
def test_matmul_matches_float64_and_onnxruntime(cuda, type_name, rows):
    rng = np.random.default_rng(rows)
    n, k = 300, 768 if type_name in _SMALL_BLOCKS else 1024  # N not a multiple of the block's 8 warps
    raw = blocks(rng, type_name, n, k)
    w = dequantized(raw, type_name)
    x = rng.standard_normal((rows, k)).astype(np.float16)
    want = x.astype(np.float64) @ w.T
    got = _matmul_q([(type_name, raw)], k).run(None, {"x": x})[0].astype(np.float64)
    ort = _ort_matmul(w).run(None, {"x": x})[0].astype(np.float64)
    scale = np.abs(want).max()
    assert got.shape == (rows, n)
    # fp16 output rounding (2^-11 relative) for the GEMV; the GEMM also rounds each weight to fp16.
    np.testing.assert_allclose(got, want, atol=(2e-3 if rows <= 8 else 4e-3) * scale, rtol=0)
    np.testing.assert_allclose(got, ort, atol=4e-3 * scale, rtol=0)


def int8_activations(x: np.ndarray) -> np.ndarray:
    """x as the 8-bit GEMV holds it (hearth_cuda_q8.cuh): per 32 columns, codes round(x·127/amax) in fp32 arithmetic
    and the scale amax/127; float64 of codes × scale."""
    v = x.astype(np.float32).reshape(x.shape[0], -1, 32)
    amax = np.abs(v).max(-1, keepdims=True)
    inv = np.where(amax > 0, np.float32(127) / np.where(amax > 0, amax, np.float32(1)), np.float32(0)).astype(np.float32)
    codes = np.clip(np.rint((v * inv).astype(np.float32)), -127, 127)
    return (codes.astype(np.float64) * (amax / np.float32(127)).astype(np.float64)).reshape(x.shape)


INT8 = {"numerics": cuda_kernels.NUMERICS_INT8}
# The library reads this once: every launch given a scratch output uses it here, however small its matrix (by
# default only matrices of 2^22 weights and up do, which these tests' and the tiny models' of tests/test_gpu.py,
# run in the same process, are not; the per-block quantizing is what the scratch=False cases check).
os.environ["HEARTH_CUDA_SCRATCH_FROM"] = "0"


@pytest.mark.gpu
@pytest.mark.parametrize("type_name", TYPES)
@pytest.mark.parametrize("rows", [1, 3, 8, 11])
@pytest.mark.parametrize("scratch", [True, False])
def test_the_8bit_gemv_matches_its_codes_product_and_stays_near_float64(cuda, type_name, rows, scratch):
    """numerics=1: exact against the float64 product of the weights with x's int8 codes (only the fp16 output
    rounds), and within int8's quantization of x·Wᵀ; x quantized once into the scratch output, or in each block.
    (11 rows: cuBLAS's GEMM over fp16 x, the scratch left empty.)"""
    rng = np.random.default_rng(rows + 100)
    n, k = 300, 768 if type_name in _SMALL_BLOCKS else 1024
    raw = blocks(rng, type_name, n, k)
    w = dequantized(raw, type_name)
    x = (rng.standard_normal((rows, k)) * 4).astype(np.float16)
    got = _matmul_q([(type_name, raw)], k, scratch=scratch, **INT8).run(None, {"x": x})[0].astype(np.float64)
    exact = x.astype(np.float64) @ w.T
    want = exact if rows > 8 else int8_activations(x) @ w.T
    assert got.shape == (rows, n)
    np.testing.assert_allclose(got, want, atol=2e-3 * np.abs(want).max(), rtol=0)
    np.testing.assert_allclose(got, exact, atol=3e-2 * np.abs(exact).max(), rtol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 5])
@pytest.mark.parametrize("scratch", [True, False])
def test_the_8bit_gemv_reads_the_gated_activation_and_three_types(cuda, rows, scratch):
    """The down projection's act(gate)·up quantized in the staging (K past one tile of 8 rows), and Q|K|V of two
    types in one launch, with numerics=1."""
    rng = np.random.default_rng(rows + 200)
    k = 4864
    raw = blocks(rng, "Q6_K", 70, k)
    gate_up = (rng.standard_normal((rows, 2 * k)) * 2).astype(np.float16)
    gated = act_of(cuda_kernels.ACT_SILU, gate_up.astype(np.float32).astype(np.float64))
    want = int8_activations(gated) @ dequantized(raw, "Q6_K").T
    got = _matmul_q([("Q6_K", raw)], 2 * k, cuda_kernels.ACT_SILU, scratch, **INT8).run(None, {"x": gate_up})[0]
    np.testing.assert_allclose(got.astype(np.float64), want, atol=4e-3 * np.abs(want).max(), rtol=0)
    k = 512
    parts = [("Q4_K", blocks(rng, "Q4_K", 64, k)), ("Q4_K", blocks(rng, "Q4_K", 16, k)), ("Q6_K", blocks(rng, "Q6_K", 16, k))]
    x = rng.standard_normal((rows, k)).astype(np.float16)
    want = int8_activations(x) @ np.concatenate([dequantized(r, t) for t, r in parts]).T
    got = _matmul_q(parts, k, scratch=scratch, **INT8).run(None, {"x": x})[0].astype(np.float64)
    np.testing.assert_allclose(got, want, atol=2e-3 * np.abs(want).max(), rtol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("rows, k", [(1, 1024), (1, 9216), (2, 1024)])
@pytest.mark.parametrize("scratch", [True, False])
def test_the_8bit_gemv_stages_the_pre_norm(cuda, rows, k, scratch):
    rng = np.random.default_rng(rows * k + 1)
    n, eps = 72, 1e-5
    raw = blocks(rng, "Q4_K", n, k)
    x = (rng.standard_normal((rows, k)) * 3).astype(np.float16)
    skip = (rng.standard_normal((rows, k)) * 3).astype(np.float16)
    gamma = rng.uniform(0.5, 1.5, k).astype(np.float16)
    node = helper.make_node("MatMulQ", ["x", "w0", "", "", "skip", "gamma"], ["y", "summed", "q8"][:2 + scratch],
                            domain=cuda_kernels.DOMAIN, type=cuda_kernels.TYPE_IDS["Q4_K"], eps=eps, **INT8)
    session = _session([node], [helper.make_tensor_value_info(name, TensorProto.FLOAT16, ["m", k]) for name in ("x", "skip")],
                       [helper.make_tensor_value_info(o, TensorProto.FLOAT16, None) for o in ("y", "summed")],
                       [numpy_helper.from_array(raw, "w0"), numpy_helper.from_array(gamma, "gamma")])
    y, summed = session.run(None, {"x": x, "skip": skip})
    s = x.astype(np.float64) + skip.astype(np.float64)
    normed = s / np.sqrt((s ** 2).mean(-1, keepdims=True) + eps) * gamma.astype(np.float64)
    want = normed @ dequantized(raw, "Q4_K").T
    np.testing.assert_allclose(y.astype(np.float64), want, atol=3e-2 * np.abs(want).max(), rtol=0)
    np.testing.assert_array_equal(summed, s.astype(np.float16))


@pytest.mark.gpu
@pytest.mark.parametrize("act", [cuda_kernels.ACT_SILU, cuda_kernels.ACT_GELU_TANH])
@pytest.mark.parametrize("rows", [1, 5, 20])
def test_the_down_projection_reads_the_gated_activation(cuda, act, rows):
    rng = np.random.default_rng(act * 10 + rows)
    n, k = 130, 9216  # K past one tile of staged activations (8,192 for a single row)
    raw = blocks(rng, "Q4_K", n, k)
    gate_up = (rng.standard_normal((rows, 2 * k)) * 2).astype(np.float16)
    want = act_of(act, gate_up.astype(np.float64)) @ dequantized(raw, "Q4_K").T
    got = _matmul_q([("Q4_K", raw)], 2 * k, act).run(None, {"x": gate_up})[0].astype(np.float64)
    np.testing.assert_allclose(got, want, atol=4e-3 * np.abs(want).max(), rtol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 12])
def test_three_block_types_side_by_side_in_one_launch(cuda, rows):
    rng = np.random.default_rng(7)
    k = 512
    parts = [("Q4_K", blocks(rng, "Q4_K", 64, k)), ("Q4_K", blocks(rng, "Q4_K", 16, k)), ("Q6_K", blocks(rng, "Q6_K", 16, k))]
    x = rng.standard_normal((rows, k)).astype(np.float16)
    want = x.astype(np.float64) @ np.concatenate([dequantized(r, t) for t, r in parts]).T
    got = _matmul_q(parts, k).run(None, {"x": x})[0].astype(np.float64)
    assert got.shape == (rows, 96)
    np.testing.assert_allclose(got, want, atol=4e-3 * np.abs(want).max(), rtol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("rows, k, with_skip", [(1, 1024, True), (1, 1024, False), (3, 1024, True), (1, 9216, True)])
def test_the_pre_norm_runs_inside_the_matmul(cuda, rows, k, with_skip):
    """RMSNorm(x + skip)·gamma staged by the GEMV for one row whose K fits a tile, by a kernel of its own otherwise
    (several rows, or K past 8,192); x + skip written as the second output."""
    rng = np.random.default_rng(rows * k)
    n, eps = 72, 1e-5
    raw = blocks(rng, "Q4_K", n, k)
    x = (rng.standard_normal((rows, k)) * 3).astype(np.float16)
    skip = (rng.standard_normal((rows, k)) * 3).astype(np.float16)
    gamma = rng.uniform(0.5, 1.5, k).astype(np.float16)
    inits = [numpy_helper.from_array(raw, "w0"), numpy_helper.from_array(gamma, "gamma")]
    names = ["x", "w0", "", "", "skip" if with_skip else "", "gamma"]
    outputs = ["y", "summed"] if with_skip else ["y"]
    node = helper.make_node("MatMulQ", names, outputs, domain=cuda_kernels.DOMAIN, type=cuda_kernels.TYPE_IDS["Q4_K"],
                            eps=eps)
    graph_inputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT16, ["m", k]) for name in ("x", "skip")[:1 + with_skip]]
    session = _session([node], graph_inputs, [helper.make_tensor_value_info(o, TensorProto.FLOAT16, None) for o in outputs],
                       inits)
    got = session.run(None, {"x": x, **({"skip": skip} if with_skip else {})})
    s = x.astype(np.float64) + (skip.astype(np.float64) if with_skip else 0)
    normed = s / np.sqrt((s ** 2).mean(-1, keepdims=True) + eps) * gamma.astype(np.float64)
    want = normed @ dequantized(raw, "Q4_K").T
    np.testing.assert_allclose(got[0].astype(np.float64), want, atol=4e-3 * np.abs(want).max(), rtol=0)
    if with_skip:
        np.testing.assert_array_equal(got[1], s.astype(np.float16))


@pytest.mark.gpu
@pytest.mark.parametrize("type_name", ["Q4_1", "Q8_0", "Q4_K", "Q6_K"])
def test_gather_dequantizes_the_rows_asked_for(cuda, type_name):
    rng = np.random.default_rng(3)
    raw = blocks(rng, type_name, 50, 512)
    node = helper.make_node("GatherQ", ["ids", "table"], ["y"], domain=cuda_kernels.DOMAIN,
                            type=cuda_kernels.TYPE_IDS[type_name])
    session = _session([node], [helper.make_tensor_value_info("ids", TensorProto.INT64, ["b", "s"])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT16, None)],
                       [numpy_helper.from_array(raw, "table")])
    ids = np.array([[0, 49, 7, 7, 23]], np.int64)
    got = session.run(None, {"ids": ids})[0].astype(np.float64)
    want = dequantized(raw, type_name)[ids]
    np.testing.assert_allclose(got, want, atol=1e-3 * np.abs(want).max(), rtol=0)
    assert got.shape == (1, 5, 512)


@pytest.mark.gpu
def test_a_wrong_input_width_is_refused_with_the_width_it_needs(cuda):
    raw = blocks(np.random.default_rng(0), "Q4_K", 8, 256)
    session = _matmul_q([("Q4_K", raw)], 300)
    with pytest.raises(Exception, match="X's last dimension must be 256"):
        session.run(None, {"x": np.zeros((1, 300), np.float16)})


@pytest.mark.gpu
def test_weights_that_are_not_whole_blocks_are_refused(cuda):
    session = _matmul_q([("Q4_K", np.zeros((4, 100), np.uint8))], 256)
    with pytest.raises(Exception, match="positive multiple of type 12's 144-byte block"):
        session.run(None, {"x": np.zeros((1, 256), np.float16)})


@pytest.mark.gpu
@pytest.mark.parametrize("names, inits, message", [
    (["x", "w0", "w1"], ["w0", "w1"], "W1 is given but its type attribute is not"),
    (["x", "w0", "", "", "skip"], ["w0"], "skip without gamma"),
    (["x", "w0", "", "", "", "gamma_short"], ["w0", "gamma_short"], r"gamma must be \[256\]"),
    (["x", "w0", "w6"], ["w0", "w6"], "W1 holds 512 weights a row, W0 256"),
])
def test_inputs_that_do_not_fit_together_are_refused(cuda, names, inits, message):
    """A second matrix without its type, a skip without a gain, a gain of the wrong length, matrices of different
    widths: each refused at the first run with what is wrong (none of these has run on a GPU yet; the tests above
    were the ones in the one GPU run)."""
    rng = np.random.default_rng(1)
    arrays = {"w0": blocks(rng, "Q4_K", 8, 256), "w1": blocks(rng, "Q4_K", 8, 256), "w6": blocks(rng, "Q6_K", 8, 512),
              "gamma_short": np.ones(100, np.float16)}
    extra = {"type1": cuda_kernels.TYPE_IDS["Q6_K"]} if "w6" in names else {}
    node = helper.make_node("MatMulQ", names, ["y"], domain=cuda_kernels.DOMAIN, type=cuda_kernels.TYPE_IDS["Q4_K"],
                            **extra)
    graph_inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT16, [1, 256]) for n in ("x", "skip") if n in names]
    session = _session([node], graph_inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT16, None)],
                       [numpy_helper.from_array(arrays[n], n) for n in inits])
    feeds = {n: np.zeros((1, 256), np.float16) for n in ("x", "skip") if n in names}
    with pytest.raises(Exception, match=message):
        session.run(None, feeds)


@pytest.mark.gpu
def test_a_table_that_is_not_whole_blocks_is_refused(cuda):
    node = helper.make_node("GatherQ", ["ids", "table"], ["y"], domain=cuda_kernels.DOMAIN,
                            type=cuda_kernels.TYPE_IDS["Q8_0"])
    session = _session([node], [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 2])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT16, None)],
                       [numpy_helper.from_array(np.zeros((4, 50), np.uint8), "table")])
    with pytest.raises(Exception, match="positive multiple of type 8's 34-byte block"):
        session.run(None, {"ids": np.zeros((1, 2), np.int64)})


@pytest.mark.gpu
@pytest.mark.parametrize("attrs, message", [({"type": 10}, "unsupported weight type 10 in type"),
                                            ({"type": 12, "act": 5}, "act must be 0, 1 or 2, not 5"),
                                            ({"type": 12, "eps": 0.0}, "eps must be positive"),
                                            ({"type": 12, "numerics": 2}, "numerics must be 0 .* or 1 .*, not 2")])
def test_bad_attributes_are_refused_when_the_session_opens(cuda, attrs, message):
    import onnxruntime as ort

    node = helper.make_node("MatMulQ", ["x", "w"], ["y"], domain=cuda_kernels.DOMAIN, **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [1, 256])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT16, None)],
                              [numpy_helper.from_array(np.zeros((4, 144), np.uint8), "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(cuda_kernels.DOMAIN, 1)])
    model.ir_version = 10
    options = ort.SessionOptions()
    cuda_kernels.register_library(options)
    with pytest.raises(Exception, match=message):
        session = ort.InferenceSession(model.SerializeToString(), options, providers=providers.ort_provider_list("cuda"))
        session.run(None, {"x": np.zeros((1, 256), np.float16)})


def test_int4_tries_the_cuda_kernels_first_then_onnxruntimes_form(monkeypatch, arch_gguf):
    from engine import loader

    gguf = arch_gguf("llama-q4km")
    monkeypatch.setattr(cuda_kernels, "unavailable", lambda: "")
    assert loader.cuda_variants("int4", gguf) == [cuda_kernels.PRECISION, "int4-cuda-dense"]
    monkeypatch.setattr(cuda_kernels, "unavailable", lambda: "HEARTH_CUDA_KERNELS=0")
    assert loader.cuda_variants("int4", gguf) == ["int4-cuda-dense"]
    assert loader.cuda_variants("fp32", gguf) == []  # other precisions run as they are


def test_the_kernels_run_only_when_asked_until_verified_on_a_gpu(monkeypatch):
    monkeypatch.delenv(cuda_kernels.ENV_SWITCH, raising=False)
    assert cuda_kernels.enabled() == cuda_kernels.ON_BY_DEFAULT
    monkeypatch.setenv(cuda_kernels.ENV_SWITCH, "1")
    assert cuda_kernels.enabled()
    monkeypatch.setenv(cuda_kernels.ENV_SWITCH, "yes")  # only 1 asks
    assert not cuda_kernels.enabled()


def test_without_a_gpu_the_kernels_say_so(monkeypatch):
    if not providers.cuda_unavailable():
        pytest.skip("this machine has a GPU")
    monkeypatch.setenv(cuda_kernels.ENV_SWITCH, "1")
    assert cuda_kernels.unavailable() == "no GPU here has compute capability 8.0 or later"


def test_the_cli_says_why_the_cuda_form_cannot_run_here(tmp_path, arch_gguf):
    from tests.test_cli import run_cli

    if not providers.cuda_unavailable() and not cuda_kernels.unavailable():
        pytest.skip("the CUDA kernels run here")
    result = run_cli("chat", "--conversation", "c", "--message", "hi", "--model", str(arch_gguf("llama-q4km")),
                     "--weights", cuda_kernels.PRECISION, "--max-new-tokens", "2", home=tmp_path)
    assert result.returncode == 1
    assert "runs on Hearth's CUDA kernels, which cannot run here" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("arch", ["llama-q4km", "gemma3", "qwen2", "phi3", "qwen3"])
def test_the_cuda_graph_computes_the_int4_model(arch_converted, arch, tmp_path):
    """The int4-cuda-blocks graph with its CUDA ops stood in for by the CPU kernels' (tests/cuda_graph_on_cpu.py)
    gives the exact int4 model's logits within fp16's rounding: the right matrices in each launch, in order, the
    gate's activation, the table. Runs everywhere; the kernels themselves are checked on the GPU."""
    from engine.runtime import native_matmul
    from engine.runtime.runner import ModelRunner
    from tests.arch_models import half_tolerance
    from tests.cuda_graph_on_cpu import cpu_stand_in

    if not native_matmul.usable():
        pytest.skip("Hearth's CPU kernels cannot run on this machine")
    ids = np.random.default_rng(5).integers(0, 300, 20)

    def logits(path) -> np.ndarray:
        runner = ModelRunner(path, "cpu")
        cache = runner.new_cache()
        steps = [runner.forward(ids[:14], cache)] + [runner.forward([t], cache) for t in ids[14:]]
        return np.concatenate(steps).astype(np.float64)

    expected = logits(arch_converted(arch, "int4", "all").onnx_path)
    got = logits(cpu_stand_in(arch_converted(arch, cuda_kernels.PRECISION, "all").onnx_path, tmp_path))
    scale = np.abs(expected).max()
    np.testing.assert_allclose(got, expected, atol=half_tolerance(arch, 0.02) * scale, rtol=0)
    assert (got.argmax(-1) == expected.argmax(-1)).mean() > 0.9


@pytest.mark.gpu
def test_the_8bit_gemv_walks_its_rows_with_a_capped_grid(cuda):
    """HEARTH_CUDA_GEMV_BLOCKS_PER_SM=1 (read once per process, so in a child): each warp walks several rows
    (3,000 rows against a multiprocessor count × 8 warps), and the product is still the codes'."""
    import subprocess
    import sys

    code = """
import numpy as np
from tests.test_cuda_kernels import INT8, _matmul_q, blocks, dequantized, int8_activations
rng = np.random.default_rng(9)
raw = blocks(rng, "Q4_K", 3000, 512)
x = rng.standard_normal((2, 512)).astype(np.float16)
got = _matmul_q([("Q4_K", raw)], 512, scratch=True, **INT8).run(None, {"x": x})[0].astype(np.float64)
want = int8_activations(x) @ dequantized(raw, "Q4_K").T
np.testing.assert_allclose(got, want, atol=2e-3 * np.abs(want).max(), rtol=0)
print("same")
"""
    env = {**os.environ, "HEARTH_CUDA_GEMV_BLOCKS_PER_SM": "1", "HEARTH_CUDA_SCRATCH_FROM": "0"}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                            cwd=str(Path(__file__).resolve().parent.parent))
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().endswith("same")


@pytest.mark.gpu
@pytest.mark.parametrize("rows_a_warp", ["1", "4", "3"])
def test_the_8bit_gemv_reads_one_two_or_four_rows_a_warp(cuda, rows_a_warp):
    """HEARTH_CUDA_GEMV_ROWS (read once per process, so in a child): one row of x against Q4_K|Q6_K|Q4_K side by
    side (13 + 7 + 6 rows, so some warps' rows straddle two types and go one at a time), a warp taking one row or
    reading four together; 3, not a choice, reads two as unset does. The product is still the codes'."""
    import subprocess
    import sys

    code = """
import numpy as np
from tests.test_cuda_kernels import INT8, _matmul_q, blocks, dequantized, int8_activations
rng = np.random.default_rng(11)
parts = [("Q4_K", blocks(rng, "Q4_K", 13, 768)), ("Q6_K", blocks(rng, "Q6_K", 7, 768)),
         ("Q4_K", blocks(rng, "Q4_K", 6, 768))]
x = rng.standard_normal((1, 768)).astype(np.float16)
got = _matmul_q(parts, 768, scratch=True, **INT8).run(None, {"x": x})[0].astype(np.float64)
want = int8_activations(x) @ np.concatenate([dequantized(raw, t) for t, raw in parts]).T
np.testing.assert_allclose(got, want, atol=2e-3 * np.abs(want).max(), rtol=0)
print("same")
"""
    env = {**os.environ, "HEARTH_CUDA_GEMV_ROWS": rows_a_warp, "HEARTH_CUDA_SCRATCH_FROM": "0"}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                            cwd=str(Path(__file__).resolve().parent.parent))
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().endswith("same")
