"""CUDA provider: same logits as the CPU on a tiny model; the real Gemma 3 on CUDA in the engine, the CLI, the server
and the window. Skips cleanly where CUDA cannot load."""

from __future__ import annotations

from pathlib import Path

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


FP32_ACTIVATIONS = "int4-cuda-blocks with fp32 activations"  # the same graph, every MatMulQ's numerics attribute dropped


def _converted_form(arch_converted, arch: str, precision: str, tmp_path: Path):
    """The converted model a test runs; for FP32_ACTIVATIONS, a copy of int4-cuda-blocks' graph whose MatMulQs take
    fp32 activations (numerics 0), so the kernels and the converter's wiring are checked to fp16's rounding, apart
    from int8's quantization of the activations (checked per kernel in tests/test_cuda_kernels.py)."""
    import dataclasses
    import shutil

    import onnx

    from engine.runtime import cuda_kernels

    if precision != FP32_ACTIVATIONS:
        return arch_converted(arch, precision, "all")
    converted = arch_converted(arch, cuda_kernels.PRECISION, "all")
    copy = tmp_path / "fp32-activations"
    shutil.copytree(converted.onnx_path.parent, copy)
    model = onnx.load(str(converted.onnx_path))
    for node in model.graph.node:
        kept = [a for a in node.attribute if not (node.domain == cuda_kernels.DOMAIN and a.name == "numerics")]
        del node.attribute[:]
        node.attribute.extend(kept)
    path = copy / converted.onnx_path.name
    path.unlink()
    (copy / "model.onnx.data").unlink(missing_ok=True)
    onnx.save(model, str(path), save_as_external_data=True, location="model.onnx.data")
    return dataclasses.replace(converted, onnx_path=path)


@pytest.mark.gpu
@pytest.mark.parametrize("arch", ["llama-rope-freqs", "qwen2", "qwen3", "llama-q4km", "phi3"])
@pytest.mark.parametrize("precision", [FP32_ACTIVATIONS, "int4-cuda-dense", "int4-cuda", "int4-half"])
def test_each_architecture_on_cuda_matches_the_cpu(arch_converted, arch, precision, tmp_path):
    """fp16 activations on the GPU against the exact CPU graph: prefill, then decode."""
    ids = np.random.default_rng(5).integers(0, 300, 24)
    expected = _arch_logits(arch_converted(arch, "int4", "all"), "cpu", ids, 16)
    got = _arch_logits(_converted_form(arch_converted, arch, precision, tmp_path), "cuda", ids, 16)
    scale = np.abs(expected).max()
    np.testing.assert_allclose(got, expected, atol=half_tolerance(arch, 0.02) * scale, rtol=0)
    assert (got.argmax(-1) == expected.argmax(-1)).mean() > 0.9


@pytest.mark.gpu
@pytest.mark.parametrize("arch", ["llama-rope-freqs", "qwen2", "qwen3", "llama-q4km", "phi3", "gemma3"])
def test_each_architecture_with_8bit_activations_stays_near_the_cpu(arch_converted, arch):
    """int4-cuda-blocks as it runs (int8 activations, as llama.cpp's CUDA path): within what int8 activations move
    a random synthetic model's logits by (int4-fast's bound on the CPU, tests/test_graph_reference.py; its Q4_K_M
    model's noisy logits move ~20% of their spread)."""
    from engine.runtime import cuda_kernels

    ids = np.random.default_rng(5).integers(0, 300, 24)
    expected = _arch_logits(arch_converted(arch, "int4", "all"), "cpu", ids, 16)
    got = _arch_logits(arch_converted(arch, cuda_kernels.PRECISION, "all"), "cuda", ids, 16)
    spread = expected.max() - expected.min()
    assert np.abs(got - expected).max() < (0.25 if arch == "llama-q4km" else 0.1) * spread
    assert (got.argmax(-1) == expected.argmax(-1)).mean() > (0.6 if arch == "llama-q4km" else 0.8)


@pytest.mark.gpu
@pytest.mark.parametrize("precision", [FP32_ACTIVATIONS, "int4-cuda-dense", "int4-half"])
def test_gemma_on_cuda_matches_the_cpu(arch_converted, precision, tmp_path):
    """Gemma 3 on CUDA (issue 34): its residual stream kept at 1/8 of its size in the fp16 graph, the synthetic
    model's prefill and decode past its sliding window against the exact CPU graph."""
    ids = np.random.default_rng(5).integers(0, 300, 24)
    expected = _arch_logits(arch_converted("gemma3", "int4", "all"), "cpu", ids, 16)
    got = _arch_logits(_converted_form(arch_converted, "gemma3", precision, tmp_path), "cuda", ids, 16)
    scale = np.abs(expected).max()
    np.testing.assert_allclose(got, expected, atol=0.02 * scale, rtol=0)
    assert (got.argmax(-1) == expected.argmax(-1)).mean() > 0.9


GEMMA_FILE = "gemma-3-270m-q4_k_m.gguf"  # the catalog's gemma-3-270m, a base model (Hearth's built-in gemma chat format)
GEMMA_PROMPT = "Name three colours of the rainbow."  # its greedy reply: the same 24 tokens on fp16 (bench/gemma_fp16.py)


def _real_gemma_on_cuda() -> Path:
    """The real Gemma 3 GGUF in the test cache, where CUDA can run; else the test skips, saying which is missing.
    The GPU machine reaches no registry: the GGUF travels to its test cache (docs/cuda.md, the next GPU run)."""
    from engine.runtime import providers
    from tests.conftest import TEST_CACHE

    if why := providers.cuda_unavailable():
        pytest.skip(f"no usable CUDA here: {why}")
    gguf = TEST_CACHE / "home" / "models" / GEMMA_FILE
    if not gguf.exists():
        pytest.skip(f"the Gemma 3 GGUF is not in {gguf.parent} (copy it there on the GPU machine)")
    return gguf


@pytest.mark.gpu
@pytest.mark.real_model
def test_the_real_gemma_runs_on_cuda_with_the_cpu_models_greedy_tokens(tmp_path):
    """The catalog's Gemma 3 270M (Q4_K_M) loads on CUDA by itself (auto), no longer falling back to the CPU, and
    its greedy reply is the CPU model's. The GPU machine reaches no registry: the GGUF travels to its test cache."""
    from engine.loader import load_engine
    from engine.paths import resolve_paths

    gemma_gguf = _real_gemma_on_cuda()
    paths = resolve_paths(tmp_path).ensure()
    cpu, _, _ = load_engine(paths, model=str(gemma_gguf), provider="cpu")
    prompt = cpu.encode_prompt(cpu.render([{"role": "user", "content": GEMMA_PROMPT}]))
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


# the real Gemma on CUDA in each front end: the CLI, the server, the window (issue 34) ------------------------------
GEMMA_TOKENS = 12  # a few greedy tokens: enough to compare with the CPU, quick on both


@pytest.fixture
def gemma_home(tmp_path) -> Path:
    """An empty data dir sharing the test cache's models (the real Gemma among them) and conversions, so the
    GPU machine converts Gemma once while it stays warm; skips where CUDA or the Gemma GGUF is missing."""
    return _linked_home(tmp_path / "home", _real_gemma_on_cuda())


def _linked_home(home: Path, gguf: Path) -> Path:
    home.mkdir(parents=True)
    for sub in ("models", "converted"):
        (gguf.parent.parent / sub).mkdir(parents=True, exist_ok=True)  # a link to nothing would break ensure()
        (home / sub).symlink_to(gguf.parent.parent / sub)
    return home


def _front_end_or_skip(what: str, *modules: str) -> None:
    """Skip, naming the module, where a front end's own dependencies are not installed (the GPU machine gets only
    what is carried to it); CUDA and the GGUF are checked first, so a machine without them says that."""
    import importlib

    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            pytest.skip(f"{what} cannot run here: {type(exc).__name__}: {exc}")


def _cli_generate(home: Path, gguf: Path, provider: str) -> dict:
    """``hearth-cli generate --json`` in its own process, greedy, on ``provider``; its JSON object."""
    import json
    import os
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "engine.cli", "generate", "--prompt", GEMMA_PROMPT, "--greedy",
                           "--max-new-tokens", str(GEMMA_TOKENS), "--json", "--provider", provider,
                           "--model", str(gguf), "--data-dir", str(home)],
                          capture_output=True, text=True, env=os.environ.copy(), timeout=600)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.gpu
@pytest.mark.real_model
def test_the_cli_runs_the_real_gemma_on_cuda_with_the_cpu_models_reply(gemma_home):
    """``hearth-cli generate --provider cuda``: the process reports the session ONNX Runtime really put on CUDA
    (``provider``, from the session, not from the providers asked for) in the CUDA form, and writes the greedy
    reply the same command writes on the CPU."""
    _front_end_or_skip("hearth-cli", "engine.cli.main")
    gguf = gemma_home / "models" / GEMMA_FILE
    cpu = _cli_generate(gemma_home, gguf, "cpu")
    assert (cpu["provider"], cpu["weights"]) == ("cpu", "int4")
    gpu = _cli_generate(gemma_home, gguf, "cuda")
    assert gpu["provider"] == "cuda" and gpu["provider_note"] == "", gpu["provider_note"]
    assert gpu["weights"] == _cuda_form("int4-cuda-dense")
    assert gpu["text"].strip() and len(gpu["tokens"]) == GEMMA_TOKENS
    assert gpu["prompt_tokens"] == cpu["prompt_tokens"]
    assert (gpu["tokens"], gpu["text"]) == (cpu["tokens"], cpu["text"])


def _serve_one_chat(home: Path, provider: str) -> tuple[dict, object]:
    """One greedy /v1/chat/completions on a Hearth server started on ``home`` with ``provider`` (127.0.0.1, a
    free port); (its JSON body, the ModelInfo of the model that answered)."""
    import httpx

    from engine.api import resolve_paths
    from tests.server_helpers import LiveServer

    server = LiveServer(resolve_paths(home).ensure(), "gemma-3-270m", provider=provider)
    try:
        body = {"model": "gemma-3-270m", "messages": [{"role": "user", "content": GEMMA_PROMPT}],
                "max_tokens": GEMMA_TOKENS, "temperature": 0}
        r = httpx.post(server.base + "/v1/chat/completions", json=body, timeout=300)
        assert r.status_code == 200, r.text
        return r.json(), server.host.hearth.model
    finally:
        server.close()


@pytest.mark.gpu
@pytest.mark.real_model
def test_the_server_runs_the_real_gemma_on_cuda_with_the_cpu_models_reply(gemma_home, tmp_path):
    """``hearth-cli serve``'s server (in process, on 127.0.0.1) with the catalog's Gemma on CUDA answers an OpenAI
    chat completion (a base model, through Hearth's built-in gemma format) with the reply a CPU server gives; its
    backend reports the model running on CUDA in the CUDA form. Each server has its own data dir, so the CUDA one
    reads the whole prompt itself instead of resuming the CPU one's saved context."""
    _front_end_or_skip("the server", "fastapi", "uvicorn", "httpx")
    cpu, cpu_model = _serve_one_chat(_linked_home(tmp_path / "cpu-home", gemma_home / "models" / GEMMA_FILE), "cpu")
    assert cpu_model.provider == "cpu"
    gpu, gpu_model = _serve_one_chat(gemma_home, "cuda")
    assert gpu_model.provider == "cuda" and gpu_model.note == "", gpu_model.note
    assert gpu_model.weights == _cuda_form("int4-cuda-dense") and gpu_model.kind == "base"
    assert gpu["model"] == "gemma-3-270m"
    text = gpu["choices"][0]["message"]["content"]
    assert text.strip() and gpu["usage"]["completion_tokens"] >= 1
    assert text == cpu["choices"][0]["message"]["content"]
    assert gpu["usage"] == cpu["usage"]
    assert (gpu["hearth"]["reused_tokens"], gpu["hearth"]["prefilled_tokens"]) == (0, gpu["usage"]["prompt_tokens"])


@pytest.mark.gpu
@pytest.mark.real_model
def test_the_window_runs_the_real_gemma_on_cuda(gemma_home, request):
    """The desktop window started with the catalog's Gemma on CUDA: it loads there (the status bar says CUDA and
    the CUDA form), a message sent from the composer gets a reply, shown and stored, and nothing says a problem:
    no error box, no banner, no warning in the status line."""
    _front_end_or_skip("the window", "PySide6.QtWidgets", "pytestqt")
    from PySide6.QtWidgets import QMessageBox

    from app.config import AppConfig
    from engine.api import resolve_paths
    from tests.conftest import Windows
    from tests.qt_helpers import TIMEOUT, send, use_settings, wait_idle

    qtbot = request.getfixturevalue("qtbot")  # pytest-qt's, asked for once it is known to be installed
    config = AppConfig(resolve_paths(gemma_home).ensure(), model=str(gemma_home / "models" / GEMMA_FILE),
                       weights="int4", provider="cuda")
    windows = Windows(qtbot, config)
    w = windows(wait_ready=False)
    try:
        # a first load on a warm machine converts Gemma's CUDA form (~15 s): more than a window usually waits for
        qtbot.waitUntil(lambda: w.model_info is not None or bool(w.findChildren(QMessageBox)), timeout=5 * TIMEOUT)
        assert not w.findChildren(QMessageBox), [box.text() for box in w.findChildren(QMessageBox)]
        info = w.model_info
        assert info.provider == "cuda" and info.note == "", info.note
        assert info.weights == _cuda_form("int4-cuda-dense")
        assert w.status.model.text() == f"{info.name} · base model · {info.weights} · CUDA"
        conversation = w.new_chat()
        use_settings(w, {"temperature": 0.0, "max_new_tokens": GEMMA_TOKENS})
        send(qtbot, w, GEMMA_PROMPT)
        wait_idle(qtbot, w)
        stored = w.store.messages(conversation)
        assert [m.role for m in stored] == ["user", "assistant"] and stored[0].content == GEMMA_PROMPT
        assert stored[1].content.strip() and w.transcript.messages[-1].text == stored[1].content
        assert not w.banner.isVisible() and not w.notice.isVisible()
        assert not w.findChildren(QMessageBox)
        assert not w.status.resume.text().startswith("⚠"), w.status.resume.text()
        assert w.status.model.text().endswith(" · CUDA")  # still on the GPU after the turn
    finally:
        w.close()
