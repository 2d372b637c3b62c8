"""The converted graph against an independent numpy forward pass (tests/reference.py): the plain llama
model, and one of each other architecture (tests/arch_models.py)."""

from __future__ import annotations

import numpy as np
import pytest

from engine.model.convert import ensure_converted
from engine.model.synthetic import SyntheticSpec, write_synthetic_gguf
from engine.runtime import native_matmul
from engine.runtime.runner import ModelRunner
from tests.arch_models import ARCH_SPECS, half_tolerance
from tests.gguf_edit import rewrite_gguf
from tests.reference import Reference, ReferenceLlama

IDS = np.random.default_rng(7).integers(0, 300, 48)
ORT_FORM = "int4@ort"  # int4 with Hearth's matmul kernels turned off: ONNX Runtime's MatMulNBits form


@pytest.fixture(scope="module")
def reference(tiny_gguf):
    return ReferenceLlama(tiny_gguf).logits(IDS)


def _runner(converted, precision):
    return ModelRunner(converted(precision, "all").onnx_path, "cpu")


@pytest.mark.parametrize("precision,atol", [("int4", 1e-4), ("fp32", 1e-4), ("fp16", 0.2)])
def test_prefill_matches_reference(tiny_converted, reference, precision, atol):
    runner = _runner(tiny_converted, precision)
    logits = runner.forward(IDS, runner.new_cache())
    assert logits.shape == reference.shape
    np.testing.assert_allclose(logits, reference, atol=atol, rtol=1e-4)


@pytest.mark.parametrize("precision", ["int4", "fp32"])
def test_decode_with_cache_matches_reference_and_full_recompute(tiny_converted, reference, precision):
    runner = _runner(tiny_converted, precision)
    full = runner.forward(IDS, runner.new_cache())
    cache = runner.new_cache()
    pieces = [runner.forward(IDS[:20], cache), runner.forward(IDS[20:31], cache)]  # chunked prefill with a past
    pieces += [runner.forward([t], cache) for t in IDS[31:]]  # then one token at a time
    stepped = np.concatenate(pieces)
    np.testing.assert_allclose(stepped, reference, atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(stepped, full, atol=1e-4, rtol=1e-4)
    assert cache.length == len(IDS)


def test_fast_int4_stays_close_to_reference(tiny_converted, reference):
    runner = _runner(tiny_converted, "int4-fast")
    logits = runner.forward(IDS, runner.new_cache())
    spread = reference.max() - reference.min()
    assert np.abs(logits - reference).max() < 0.1 * spread  # int8 activations: close, not exact
    assert (logits.argmax(-1) == reference.argmax(-1)).mean() > 0.8


def test_last_logits_graph_returns_only_the_last_position(tiny_converted, reference):
    runner = ModelRunner(tiny_converted("int4", "last").onnx_path, "cpu")
    logits = runner.forward(IDS, runner.new_cache())
    assert logits.shape == (1, reference.shape[1])
    np.testing.assert_allclose(logits[0], reference[-1], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("weight_type", ["Q4_0", "Q8_0", "F16", "F32"])
def test_other_gguf_tensor_types_convert_exactly(tmp_path, weight_type):
    spec = SyntheticSpec(weight_type=weight_type, embedding_type="F16" if weight_type == "F16" else "Q8_0", seed=3)
    gguf_path = write_synthetic_gguf(tmp_path / f"{weight_type}.gguf", spec)
    ref = ReferenceLlama(gguf_path).logits(IDS[:24])
    converted = ensure_converted(gguf_path, "int4", tmp_path / "converted", logits_mode="all")
    runner = ModelRunner(converted.onnx_path, "cpu")
    np.testing.assert_allclose(runner.forward(IDS[:24], runner.new_cache()), ref, atol=1e-4, rtol=1e-4)


def base_vocab(path) -> int:
    from engine.arch import model_config
    from engine.model.gguf_file import GGUFModel

    return model_config(GGUFModel(path)).vocab_size


def test_untied_output_head_and_grouped_heads(tmp_path):
    """A model with its own output.weight, one KV head shared by all query heads, and 3 layers."""
    import gguf
    from gguf import quants

    spec = SyntheticSpec(n_layers=3, n_head=4, n_head_kv=1, seed=5)
    base = write_synthetic_gguf(tmp_path / "base.gguf", spec)
    head = np.random.default_rng(9).standard_normal((base_vocab(base), spec.n_embd)).astype(np.float32)
    q4_1 = gguf.GGMLQuantizationType.Q4_1
    rewrite_gguf(base, tmp_path / "untied.gguf", add={"output.weight": (quants.quantize(head, q4_1), q4_1)})
    path = tmp_path / "untied.gguf"
    ref = ReferenceLlama(path).logits(IDS[:16])
    converted = ensure_converted(path, "int4", tmp_path / "converted", logits_mode="all")
    runner = ModelRunner(converted.onnx_path, "cpu")
    assert not runner.config.tied_embeddings and runner.config.n_head_kv == 1
    np.testing.assert_allclose(runner.forward(IDS[:16], runner.new_cache()), ref, atol=1e-4, rtol=1e-4)


# every architecture -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def arch_reference(arch_gguf):
    done: dict = {}

    def get(name: str) -> np.ndarray:
        if name not in done:
            done[name] = Reference(arch_gguf(name)).logits(IDS)
        return done[name]

    return get


def _exact_atol(name: str, reference: np.ndarray) -> float:
    """fp32 rounding: 1e-4 for the tiny models; the Q4_K_M one's 256-wide layers of random K-quant
    blocks accumulate more of it, so relative to its logits' size (as tests/test_quant_convert.py)."""
    return 3e-5 * float(np.abs(reference).max()) if name == "llama-q4km" else 1e-4


@pytest.mark.parametrize("precision", ["int4", ORT_FORM, "fp32"])
@pytest.mark.parametrize("name", list(ARCH_SPECS))
def test_each_architecture_prefills_and_decodes_like_the_reference(arch_converted, arch_reference, name, precision,
                                                                   monkeypatch):
    """Prefill in one call, then chunked prefill with a past and one-token decode steps: both equal the
    float64 reference and each other. int4 runs on Hearth's kernels where they can run, and in ONNX
    Runtime's form (ORT_FORM) everywhere."""
    if precision == ORT_FORM:
        monkeypatch.setenv(native_matmul.ENV_SWITCH, "0")
        precision = "int4"
    converted = arch_converted(name, precision, "all")
    assert converted.architecture == ARCH_SPECS[name].architecture
    runner = ModelRunner(converted.onnx_path, "cpu")
    reference = arch_reference(name)
    atol = _exact_atol(name, reference)
    full = runner.forward(IDS, runner.new_cache())
    np.testing.assert_allclose(full, reference, atol=atol, rtol=1e-4)
    cache = runner.new_cache()
    pieces = [runner.forward(IDS[:20], cache), runner.forward(IDS[20:31], cache)]
    pieces += [runner.forward([t], cache) for t in IDS[31:]]
    stepped = np.concatenate(pieces)
    np.testing.assert_allclose(stepped, reference, atol=atol, rtol=1e-4)
    np.testing.assert_allclose(stepped, full, atol=atol, rtol=1e-4)
    assert cache.length == len(IDS)


# The Q4_K_M model's random K-quant blocks give wide, noisy logits that int8 activations move by ~20% of their
# spread (7.3 of 40.5 under MatMulNBits); its fast numerics are checked per kernel (tests/test_native_matmul.py).
FAST_ARCHS = [name for name in ARCH_SPECS if name != "llama-q4km"]


@pytest.mark.parametrize("name", FAST_ARCHS)
def test_each_architecture_in_int8_activations_stays_close_to_the_reference(arch_converted, arch_reference, name):
    """int4-fast (Hearth's integer kernels where they run, else MatMulNBits at accuracy level 4)."""
    runner = ModelRunner(arch_converted(name, "int4-fast", "all").onnx_path, "cpu")
    logits, reference = runner.forward(IDS, runner.new_cache()), arch_reference(name)
    assert np.abs(logits - reference).max() < 0.1 * (reference.max() - reference.min())
    assert (logits.argmax(-1) == reference.argmax(-1)).mean() > 0.8


@pytest.mark.parametrize("name", list(ARCH_SPECS))
def test_each_architectures_last_logits_graph_matches_the_reference(arch_converted, arch_reference, name):
    runner = ModelRunner(arch_converted(name, "int4", "last").onnx_path, "cpu")
    logits = runner.forward(IDS, runner.new_cache())
    reference = arch_reference(name)
    np.testing.assert_allclose(logits[0], reference[-1], atol=_exact_atol(name, reference), rtol=1e-4)


def test_rope_freqs_change_what_llama_computes(tmp_path, arch_gguf, arch_reference):
    """The factors matter at these positions: without them the same weights give other logits, so the
    match above is the factors' doing. Llama 3.2's tied head with factors matches as well."""
    with_factors = arch_gguf("llama-rope-freqs")
    without = rewrite_gguf(with_factors, tmp_path / "no-factors.gguf", drop=("rope_freqs.weight",))
    assert np.abs(Reference(without).logits(IDS) - arch_reference("llama-rope-freqs")).max() > 1.0
    tied = write_synthetic_gguf(tmp_path / "tied.gguf", SyntheticSpec(rope_freqs=True, seed=11))
    converted = ensure_converted(tied, "int4", tmp_path / "converted", logits_mode="all")
    runner = ModelRunner(converted.onnx_path, "cpu")
    assert runner.config.tied_embeddings
    np.testing.assert_allclose(runner.forward(IDS[:24], runner.new_cache()), Reference(tied).logits(IDS[:24]),
                               atol=1e-4, rtol=1e-4)


FP16_ARCHS = [name for name in ARCH_SPECS if name != "gemma3"]  # gemma3 overflows fp16: refused (test_gemma3.py)


@pytest.mark.parametrize("name", FP16_ARCHS)
def test_each_architecture_in_fp16_activations_stays_within_half_precision(arch_converted, arch_reference, name):
    """int4-half (what int4 runs as on CUDA): the QK norm, biases and factors in fp16 too."""
    runner = ModelRunner(arch_converted(name, "int4-half", "all").onnx_path, "cpu")
    reference = arch_reference(name)
    np.testing.assert_allclose(runner.forward(IDS, runner.new_cache()), reference,
                               atol=half_tolerance(name, 0.01) * np.abs(reference).max(), rtol=0)
