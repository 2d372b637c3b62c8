"""The two forms a CPU conversion of int4 / int4-fast takes: the GGUF's own blocks run by Hearth's kernels
(ai.hearth.MatMulQ / GatherQ), and ONNX Runtime's MatMulNBits form, the fallback where the kernels cannot run.
Both against the float64 reference (tests/reference.py) for every block type, and against each other."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from gguf import GGUFReader

from engine.errors import ModelFileError
from engine.model.convert import ensure_converted
from engine.model.synthetic import SyntheticSpec, write_synthetic_gguf
from engine.runtime import native_library, native_matmul
from engine.runtime.runner import ModelRunner
from tests.reference import ReferenceLlama

needs_kernels = pytest.mark.skipif(not native_matmul.usable(), reason="Hearth's matmul kernels cannot run here")


@pytest.fixture(autouse=True)
def blocks_form(monkeypatch):
    """The GGUF-blocks form is opt-in (native_matmul.py): these tests turn it on unless they turn it off."""
    monkeypatch.setenv(native_matmul.ENV_SWITCH, "1")
IDS = np.random.default_rng(11).integers(0, 300, 20)
LEGACY = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")
K_QUANTS = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")


def spec_for(weight_type: str, **extra) -> SyntheticSpec:
    """A small llama whose linear layers are ``weight_type`` (K-quants need 256-wide rows)."""
    wide = weight_type in K_QUANTS
    return SyntheticSpec(n_embd=256 if wide else 64, n_ff=512 if wide else 128, weight_type=weight_type,
                         embedding_type=weight_type if weight_type in ("Q8_0", "Q4_K", "Q6_K") else "Q8_0",
                         seed=5, **extra)


@pytest.fixture(scope="module")
def typed_gguf(tmp_path_factory):
    done: dict = {}
    root = tmp_path_factory.mktemp("forms")

    def get(weight_type: str):
        if weight_type not in done:
            path = write_synthetic_gguf(root / f"{weight_type}.gguf", spec_for(weight_type))
            done[weight_type] = (path, ReferenceLlama(path).logits(IDS))
        return done[weight_type]

    return get


def graph_ops(converted) -> set[str]:
    return {n.op_type for n in onnx.load(str(converted.onnx_path), load_external_data=False).graph.node}


def run(converted) -> np.ndarray:
    runner = ModelRunner(converted.onnx_path, "cpu")
    return runner.forward(IDS, runner.new_cache())


def exact_atol(reference: np.ndarray) -> float:
    # fp32 against float64 through a few layers; random K-quant blocks make large logits
    return 1e-4 * max(1.0, float(np.abs(reference).max()))


@needs_kernels
@pytest.mark.parametrize("weight_type", LEGACY + K_QUANTS)
def test_every_block_type_runs_from_its_blocks_like_the_reference(tmp_path, typed_gguf, weight_type):
    gguf_path, reference = typed_gguf(weight_type)
    converted = ensure_converted(gguf_path, "int4", tmp_path / "converted", logits_mode="all")
    ops = graph_ops(converted)
    assert "MatMulQ" in ops and "MatMulNBits" not in ops
    np.testing.assert_allclose(run(converted), reference, atol=exact_atol(reference), rtol=1e-4)


@needs_kernels
@pytest.mark.parametrize("weight_type", ["Q4_1", "Q8_0", "Q4_K", "Q6_K"])
def test_fast_kernels_stay_close_to_the_reference(tmp_path, typed_gguf, weight_type):
    gguf_path, reference = typed_gguf(weight_type)
    logits = run(ensure_converted(gguf_path, "int4-fast", tmp_path / "converted", logits_mode="all"))
    spread = reference.max() - reference.min()
    assert np.abs(logits - reference).max() < 0.1 * spread  # int8 activations: close, not exact
    assert (logits.argmax(-1) == reference.argmax(-1)).mean() > 0.8


@needs_kernels
def test_the_block_form_is_the_size_of_the_gguf_and_shares_the_table_with_the_head(tmp_path, typed_gguf):
    gguf_path, _ = typed_gguf("Q8_0")
    converted = ensure_converted(gguf_path, "int4", tmp_path / "converted")
    model = onnx.load(str(converted.onnx_path), load_external_data=False)
    table = [n for n in model.graph.node if n.op_type == "GatherQ"]
    heads = [n for n in model.graph.node if n.op_type == "MatMulQ" and n.output[0] == "logits"]
    assert len(table) == 1 and len(heads) == 1 and table[0].input[1] == heads[0].input[1]
    # every quantized tensor's bytes once, as the GGUF holds them (the rest: norms and rotary tables in fp32)
    blocks = sum(int(next(e.value for e in t.external_data if e.key == "length"))
                 for t in model.graph.initializer if t.name.endswith(".blocks"))
    quantized = sum(int(t.n_bytes) for t in GGUFReader(gguf_path).tensors if t.tensor_type.name != "F32")
    assert blocks == quantized
    done = json.loads((converted.onnx_path.parent / "complete.json").read_text())
    assert done["weights"] == "gguf-blocks" and converted.onnx_path.parent.name.endswith("-int4-blocks")


@needs_kernels
@pytest.mark.parametrize("weight_type", ["Q4_1", "Q4_K"])
def test_the_fallback_form_matches_the_block_form_and_keeps_its_fingerprint(tmp_path, typed_gguf, monkeypatch,
                                                                           weight_type):
    gguf_path, reference = typed_gguf(weight_type)
    native = ensure_converted(gguf_path, "int4", tmp_path / "converted", logits_mode="all")
    monkeypatch.setenv(native_matmul.ENV_SWITCH, "0")
    fallback = ensure_converted(gguf_path, "int4", tmp_path / "converted", logits_mode="all")
    assert native.onnx_path.parent.name.endswith("-int4-blocks-all") and fallback.onnx_path.parent.name.endswith("-int4-all")
    ops = graph_ops(fallback)
    assert "MatMulNBits" in ops and "MatMulQ" not in ops and "GatherQ" not in ops
    assert fallback.fingerprint == native.fingerprint  # the same weights: saved context moves between them
    np.testing.assert_allclose(run(fallback), run(native), atol=exact_atol(reference), rtol=1e-4)


@needs_kernels
@pytest.mark.parametrize("isa", ["portable", "avx2", "avx512", "avx512vnni"])
def test_each_instruction_set_runs_a_whole_model_alike(tmp_path, typed_gguf, monkeypatch, isa):
    gguf_path, reference = typed_gguf("Q4_K")
    converted = ensure_converted(gguf_path, "int4", tmp_path / "converted", logits_mode="all")
    monkeypatch.setenv(native_matmul.ISA_SWITCH, isa)
    chosen = native_matmul.chosen_isa()
    if chosen.startswith("error"):
        pytest.skip(f"this CPU cannot run {isa}: {chosen}")
    assert chosen == isa
    np.testing.assert_allclose(run(converted), reference, atol=exact_atol(reference), rtol=1e-4)


@needs_kernels
def test_a_block_conversion_where_the_kernels_are_missing_is_refused_plainly(tmp_path, typed_gguf, monkeypatch):
    gguf_path, _ = typed_gguf("Q4_0")
    converted = ensure_converted(gguf_path, "int4", tmp_path / "converted")
    monkeypatch.setattr(native_library, "NATIVE_DIR", tmp_path / "no-kernels")  # as on a machine without them
    with pytest.raises(ModelFileError, match="Hearth's CPU kernels, which cannot run on this machine"):
        ModelRunner(converted.onnx_path, "cpu")


@pytest.mark.parametrize("switch", ["0", None], ids=["off", "unset (the default)"])
def test_without_the_kernels_int4_converts_to_onnx_runtimes_form(tmp_path, typed_gguf, monkeypatch, switch):
    if switch is None:
        monkeypatch.delenv(native_matmul.ENV_SWITCH)
    else:
        monkeypatch.setenv(native_matmul.ENV_SWITCH, switch)
    gguf_path, reference = typed_gguf("Q4_0")
    converted = ensure_converted(gguf_path, "int4", tmp_path / "converted", logits_mode="all")
    assert converted.onnx_path.parent.name.endswith("-int4-all")
    assert json.loads((converted.onnx_path.parent / "complete.json").read_text())["weights"] == "onnxruntime"
    assert "MatMulNBits" in graph_ops(converted)
    np.testing.assert_allclose(run(converted), reference, atol=exact_atol(reference), rtol=1e-4)
