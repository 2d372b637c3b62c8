"""CUDA provider: same logits as the CPU on a tiny model. Skips cleanly where CUDA cannot load."""

from __future__ import annotations

import numpy as np
import pytest

from engine.runtime.runner import ModelRunner
from engine.sampling import SamplingParams
from tests.arch_models import half_tolerance


@pytest.fixture(scope="module")
def cuda_runner(tiny_converted):
    runner = ModelRunner(tiny_converted("int4", "all").onnx_path, "cuda")
    if runner.provider != "cuda":
        pytest.skip(f"no usable CUDA here: {runner.provider_note}")
    return runner


@pytest.mark.gpu
def test_cuda_matches_cpu_prefill_and_decode(cuda_runner, tiny_converted):
    ids = np.random.default_rng(4).integers(0, 300, 40)
    cpu = ModelRunner(tiny_converted("int4", "all").onnx_path, "cpu")
    expected = cpu.forward(ids, cpu.new_cache())
    cache = cuda_runner.new_cache()
    got = np.concatenate([cuda_runner.forward(ids[:30], cache)] + [cuda_runner.forward([t], cache) for t in ids[30:]])
    # The CUDA provider uses TF32 matmuls by default: ~0.5% of the logit range on an H200.
    scale = np.abs(expected).max()
    np.testing.assert_allclose(got, expected, atol=0.02 * scale, rtol=0)
    assert (got.argmax(-1) == expected.argmax(-1)).mean() > 0.9
    keys, _ = cache.export()
    assert keys.shape[2] == 40


@pytest.mark.gpu
def test_gpu_rows_move_for_all_layers_in_one_copy(cuda_runner):
    """The cache is one device buffer; rows go in and out with one strided copy, leaving the rows
    around them alone."""
    from engine.runtime.cuda_copy import cuda_runtime

    assert cuda_runtime() is not None  # else rows would move as whole buffers
    cache = cuda_runner.new_cache()
    rng = np.random.default_rng(7)
    shape = (cache.n_layers, cache.n_kv_heads, 50, cache.head_dim)
    keys, values = (rng.standard_normal(shape).astype(cache.dtype) for _ in range(2))
    cache.load(keys, values, 0)
    patch_k, patch_v = (rng.standard_normal(shape).astype(cache.dtype)[:, :, :10] for _ in range(2))
    cache.truncate(20)
    cache.load(patch_k, patch_v, 20)
    got_k, got_v = cache.export()
    assert cache.length == 30 and got_k.shape[2] == 30
    np.testing.assert_array_equal(got_k[:, :, :20], keys[:, :, :20])
    np.testing.assert_array_equal(got_v[:, :, 20:], patch_v)
    stage = cache.staging(5)
    stage[...] = 1.5
    cache.truncate(30)
    cache.load_staged(stage, 30)
    assert (cache.export(30, 35)[0] == 1.5).all() and cache.length == 35


# checkpoints across providers (real model: its greedy answers are confident enough to compare) --------
@pytest.fixture(scope="module")
def gpu_engine(real_paths):
    from engine.loader import load_engine

    engine, converted, _ = load_engine(real_paths, weights="int4", provider="cuda")
    if engine.provider != "cuda":
        pytest.skip(f"no usable CUDA here: {engine.runner.provider_note}")
    assert converted.precision == _cuda_form("int4-cuda-dense") and engine.cache.dtype == np.float16  # fp16 on the GPU
    return engine


QUESTION = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]


def _turn(engine, root, adaptive=False):
    from engine.checkpoint.store import CheckpointStore
    from engine.sampling import SamplingParams
    from engine.session import ChatSessions

    engine.reset()
    sessions = ChatSessions(engine, CheckpointStore(root), adaptive=adaptive)
    return sessions, sessions.generate("c", QUESTION, SamplingParams.greedy_params(), 12)


@pytest.mark.gpu
@pytest.mark.real_model
def test_a_checkpoint_saved_on_the_gpu_loads_on_the_cpu(gpu_engine, real_engine, tmp_path):
    _, on_gpu = _turn(gpu_engine, tmp_path)  # saves the prompt and reply from the GPU's buffers
    follow = QUESTION + [{"role": "assistant", "content": on_gpu.generation.text},
                         {"role": "user", "content": "And of Italy?"}]
    from engine.checkpoint.store import CheckpointStore
    from engine.sampling import SamplingParams
    from engine.session import ChatSessions

    real_engine.reset()
    cpu = ChatSessions(real_engine, CheckpointStore(tmp_path), adaptive=False)
    turn = cpu.generate("c", follow, SamplingParams.greedy_params(), 12)
    assert turn.resume.source == "disk" and turn.resume.reason is None
    assert turn.resume.restored_tokens >= on_gpu.prompt_tokens
    gpu_engine.reset()
    again = ChatSessions(gpu_engine, CheckpointStore(tmp_path / "gpu-only"), adaptive=False)
    reference = again.generate("c", follow, SamplingParams.greedy_params(), 12)
    assert "Rome" in turn.generation.text and turn.generation.tokens == reference.generation.tokens


@pytest.mark.gpu
@pytest.mark.real_model
def test_a_checkpoint_saved_on_the_cpu_loads_on_the_gpu(gpu_engine, real_engine, tmp_path):
    _, on_cpu = _turn(real_engine, tmp_path)
    follow = QUESTION + [{"role": "assistant", "content": on_cpu.generation.text},
                         {"role": "user", "content": "And of Spain?"}]
    from engine.checkpoint.store import CheckpointStore
    from engine.sampling import SamplingParams
    from engine.session import ChatSessions

    gpu_engine.reset()
    gpu = ChatSessions(gpu_engine, CheckpointStore(tmp_path), adaptive=False)
    turn = gpu.generate("c", follow, SamplingParams.greedy_params(), 12)
    assert turn.resume.source == "disk" and turn.resume.restored_tokens >= on_cpu.prompt_tokens
    assert "Madrid" in turn.generation.text


@pytest.mark.gpu
@pytest.mark.real_model
def test_a_long_context_stays_correct_on_the_gpu(gpu_engine, real_engine):
    rng = np.random.default_rng(11)
    tokens = rng.integers(100, 40000, 6000).tolist()
    for e in (gpu_engine, real_engine):
        e.reset()
    gpu_logits = gpu_engine.prefill(tokens)
    cpu_logits = real_engine.prefill(tokens)
    scale = np.abs(cpu_logits).max()
    np.testing.assert_allclose(gpu_logits, cpu_logits, atol=0.05 * scale, rtol=0)  # fp16 vs fp32
    assert gpu_logits.argmax() == cpu_logits.argmax()
    assert gpu_engine.cache.capacity == gpu_engine.context_length  # allocated once, never grown


# every architecture on CUDA --------------------------------------------------------------------------------------
def _arch_logits(converted, provider: str, ids: np.ndarray, prefill: int) -> np.ndarray:
    from engine.runtime import cuda_kernels, providers

    why = providers.cuda_unavailable() if provider == "cuda" else ""
    if not why and converted.precision == cuda_kernels.PRECISION:
        why = cuda_kernels.unavailable()
    if why:
        pytest.skip(f"no usable CUDA here: {why}")
    runner = ModelRunner(converted.onnx_path, provider)
    if runner.provider != provider:
        pytest.skip(f"no usable CUDA here: {runner.provider_note}")
    cache = runner.new_cache()
    steps = [runner.forward(ids[:prefill], cache)] + [runner.forward([t], cache) for t in ids[prefill:]]
    return np.concatenate(steps).astype(np.float64)


@pytest.mark.gpu
@pytest.mark.parametrize("arch", ["llama-rope-freqs", "qwen2", "qwen3", "llama-q4km", "phi3"])
@pytest.mark.parametrize("precision", ["int4-cuda-blocks", "int4-cuda-dense", "int4-cuda", "int4-half"])
def test_each_architecture_on_cuda_matches_the_cpu(arch_converted, arch, precision):
    """fp16 activations on the GPU against the exact CPU graph: prefill, then decode."""
    ids = np.random.default_rng(5).integers(0, 300, 24)
    expected = _arch_logits(arch_converted(arch, "int4", "all"), "cpu", ids, 16)
    got = _arch_logits(arch_converted(arch, precision, "all"), "cuda", ids, 16)
    scale = np.abs(expected).max()
    np.testing.assert_allclose(got, expected, atol=half_tolerance(arch, 0.02) * scale, rtol=0)
    assert (got.argmax(-1) == expected.argmax(-1)).mean() > 0.9


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["int4-cuda-blocks", "int4-cuda-dense", "int4-half"])
def test_gemma_on_cuda_matches_the_cpu(arch_converted, precision):
    """Gemma 3 on CUDA (issue 34): its residual stream kept at 1/8 of its size in the fp16 graph, the synthetic
    model's prefill and decode past its sliding window against the exact CPU graph."""
    ids = np.random.default_rng(5).integers(0, 300, 24)
    expected = _arch_logits(arch_converted("gemma3", "int4", "all"), "cpu", ids, 16)
    got = _arch_logits(arch_converted("gemma3", precision, "all"), "cuda", ids, 16)
    scale = np.abs(expected).max()
    np.testing.assert_allclose(got, expected, atol=0.02 * scale, rtol=0)
    assert (got.argmax(-1) == expected.argmax(-1)).mean() > 0.9


@pytest.mark.gpu
@pytest.mark.real_model
def test_the_real_gemma_runs_on_cuda_with_the_cpu_models_greedy_tokens(tmp_path):
    """The catalog's Gemma 3 270M (Q4_K_M) loads on CUDA by itself (auto), no longer falling back to the CPU, and
    its greedy reply is the CPU model's. The GPU machine reaches no registry: the GGUF travels to its test cache."""
    from engine.loader import load_engine
    from engine.paths import resolve_paths
    from engine.runtime import providers
    from tests.conftest import TEST_CACHE

    if providers.cuda_unavailable():
        pytest.skip(f"no usable CUDA here: {providers.cuda_unavailable()}")
    gemma_gguf = TEST_CACHE / "home" / "models" / "gemma-3-270m-q4_k_m.gguf"
    if not gemma_gguf.exists():
        pytest.skip(f"the Gemma 3 GGUF is not in {gemma_gguf.parent} (copy it there on the GPU machine)")
    paths = resolve_paths(tmp_path).ensure()
    cpu, _, _ = load_engine(paths, model=str(gemma_gguf), provider="cpu")
    prompt = cpu.encode_prompt(cpu.render([{"role": "user", "content": "Name three colours of the rainbow."}]))
    expected = cpu.generate(prompt, SamplingParams.greedy_params(), 16).tokens
    for kernels in ("1", "0"):  # Hearth's CUDA kernels, then ONNX Runtime's own
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("HEARTH_CUDA_KERNELS", kernels)
            gpu, converted, _ = load_engine(paths, model=str(gemma_gguf), provider="auto")
            assert gpu.provider == "cuda" and converted.precision == _cuda_form("int4-cuda-dense")
            assert gpu.generate(prompt, SamplingParams.greedy_params(), 16).tokens == expected


def _cuda_form(onnxruntime_form: str) -> str:
    """What int4 runs as on CUDA here: on Hearth's CUDA kernels where they can run, else ONNX Runtime's form."""
    from engine.runtime import cuda_kernels

    return onnxruntime_form if cuda_kernels.unavailable() else cuda_kernels.PRECISION


@pytest.mark.gpu
def test_a_new_gpu_cache_holds_zeros_not_what_the_memory_held_before(cuda_runner):
    """Fresh CUDA memory can hold NaNs from earlier work; attention reads tiles past the valid rows."""
    cache = cuda_runner.new_cache()
    buffers = [cache.arena] if getattr(cache, "arena", None) is not None else cache.keys + cache.values
    for value in buffers:
        assert not np.any(value.numpy()), "a new KV buffer on the GPU is not zeroed"
