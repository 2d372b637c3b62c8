"""The engine's explicit KV cache, prefill/decode, stopping, cancellation and context policy."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from engine.errors import PromptError
from engine.generation import CancelToken, Engine
from engine.sampling import SamplingParams
from tests.arch_models import ARCH_SPECS
from tests.reference import Reference

GREEDY = SamplingParams.greedy_params()
PROMPT = [int(x) for x in np.random.default_rng(3).integers(0, 300, 90)]


# Cut-then-continue and a fresh prefill are the same arithmetic in a different order: on the CPU the
# attention kernel (engine/native) scores a block of 8 or more query rows key-major (8 rows per vector) and
# fewer rows with per-key dot products, so which rows share a block moves the float32 rounding (up to
# ~4e-5 on these logits). Rows taken from the wrong place would be off by far more than this.
SAME_ARITHMETIC_ATOL = 1e-4


def test_cut_cache_then_continue_equals_fresh_prefill(tiny_engine):
    e = tiny_engine
    e.prefill(PROMPT)
    e.truncate(40)
    cut = e.prefill([5, 6, 7])
    e.reset()
    fresh = e.prefill(PROMPT[:40] + [5, 6, 7])
    np.testing.assert_allclose(cut, fresh, atol=SAME_ARITHMETIC_ATOL)


def test_export_then_import_restores_identical_logits(tiny_engine):
    e = tiny_engine
    e.prefill(PROMPT)
    tokens, keys, values = e.export_kv()
    assert keys.shape == (e.runner.config.n_layers, e.runner.config.n_head_kv, len(PROMPT), e.runner.config.head_dim)
    live = e.runner.forward([11], e.cache)
    e.reset()
    e.import_kv(tokens, keys, values)
    assert e.tokens == PROMPT
    np.testing.assert_array_equal(e.runner.forward([11], e.cache), live)


def test_import_of_mismatched_rows_leaves_an_empty_cache(tiny_engine):
    e = tiny_engine
    e.prefill(PROMPT)
    _, keys, values = e.export_kv()
    with pytest.raises(ValueError):
        e.import_kv(PROMPT, keys[:, :1], values[:, :1])  # wrong KV head count
    assert e.tokens == [] and e.cache.length == 0


@pytest.mark.parametrize("name", list(ARCH_SPECS))
def test_each_architecture_cuts_exports_and_decodes_like_the_reference(arch_converted, arch_gguf, name):
    e = Engine.load(arch_converted(name), "cpu")
    cfg = e.runner.config
    e.prefill(PROMPT)
    e.truncate(40)
    cut = e.prefill([5, 6, 7])
    e.reset()
    np.testing.assert_allclose(cut, e.prefill(PROMPT[:40] + [5, 6, 7]), atol=SAME_ARITHMETIC_ATOL)
    tokens, keys, values = e.export_kv()
    assert keys.shape == (cfg.n_layers, cfg.n_head_kv, 43, cfg.head_dim)
    live = e.runner.forward([11], e.cache)
    e.reset()
    e.import_kv(tokens, keys, values)
    np.testing.assert_array_equal(e.runner.forward([11], e.cache), live)
    e.reset()
    reply = e.generate(PROMPT[:30], GREEDY, 6).tokens
    reference, ids = Reference(arch_gguf(name)), PROMPT[:30]
    for _ in reply:  # greedy decoding of the float64 reference picks the same tokens
        ids = ids + [int(reference.logits(ids)[-1].argmax())]
    assert reply == ids[30:] and len(reply) > 0


def test_cache_growth_keeps_earlier_rows():
    from engine.runtime.kv_cache import KVCache

    cache = KVCache(n_layers=2, n_kv_heads=3, head_dim=8, max_tokens=2048)
    assert cache.capacity == 256
    rows = np.random.default_rng(0).standard_normal((2, 3, 200, 8)).astype(np.float32)
    cache.load(rows, -rows)
    cache.reserve(600)
    assert cache.capacity == 768
    keys, values = cache.export()
    np.testing.assert_array_equal(keys, rows)
    np.testing.assert_array_equal(values, -rows)
    with pytest.raises(ValueError, match="exceed the context"):
        cache.reserve(4096)
    cache.truncate(10)
    cache.shrink_to_fit()
    assert cache.capacity == 256
    np.testing.assert_array_equal(cache.export()[0], rows[:, :, :10])


def test_generate_reuses_the_cached_prefix(tiny_engine):
    e = tiny_engine
    first = e.generate(PROMPT, GREEDY, 5)
    assert first.reused_tokens == 0 and first.timings.prefill_tokens == len(PROMPT)
    follow = PROMPT + first.tokens + [9, 10]
    second = e.generate(follow, GREEDY, 5)
    assert second.reused_tokens == len(PROMPT) + len(first.tokens) - 1
    e.reset()
    cold = e.generate(follow, GREEDY, 5)
    assert cold.tokens == second.tokens


def test_seed_reproduces_a_sampled_reply(tiny_engine):
    params = SamplingParams(temperature=1.0, seed=1234)
    a = tiny_engine.generate(PROMPT, params, 20)
    tiny_engine.reset()
    b = tiny_engine.generate(PROMPT, params, 20)
    assert a.tokens == b.tokens and len(a.tokens) == 20


def test_max_new_tokens(tiny_engine):
    r = tiny_engine.generate(PROMPT, GREEDY, 7)
    assert len(r.tokens) == 7 and r.stop_reason == "length"


def test_decode_yields_typed_steps_then_the_result_generate_gives(tiny_engine):
    from engine.generation import GenerationResult, Step

    expected = tiny_engine.generate(PROMPT, GREEDY, 12)
    tiny_engine.reset()
    steps = list(tiny_engine.decode(PROMPT, GREEDY, 12))
    *pieces, result = steps
    assert all(isinstance(s, Step) and s.text for s in pieces) and isinstance(result, GenerationResult)
    assert "".join(s.text for s in pieces) == result.text == expected.text and result.tokens == expected.tokens
    contexts = [s.context for s in pieces if s.token is not None]
    assert contexts == sorted(contexts) and contexts[-1] <= len(PROMPT) + len(result.tokens)
    assert all(s.token in result.tokens for s in pieces if s.token is not None)


def test_a_cancel_set_at_a_step_stops_the_decode_after_it(tiny_engine):
    cancel = CancelToken()
    steps = tiny_engine.decode(PROMPT, GREEDY, 50, cancel=cancel)
    first = next(steps)
    cancel.cancel()  # the consumer runs before the next forward pass
    rest = list(steps)
    result = rest[-1]
    assert result.stop_reason == "cancelled" and result.text.startswith(first.text)
    assert result.tokens[-1] == first.token  # no token was decoded after the step that saw the cancel


def test_cancel_from_another_thread_stops_within_one_step(tiny_engine):
    cancel = CancelToken()
    reached, resume = threading.Event(), threading.Event()
    seen = []

    def on_text(_piece: str) -> None:
        seen.append(len(tiny_engine.tokens))
        if len(seen) == 3:
            reached.set()
            resume.wait(10)

    box = {}

    def work() -> None:
        box["r"] = tiny_engine.generate(PROMPT, GREEDY, 100, on_text, cancel=cancel)

    worker = threading.Thread(target=work)
    worker.start()
    assert reached.wait(30)
    tokens_at_cancel = len(tiny_engine.tokens)
    cancel.cancel()
    resume.set()
    worker.join(30)
    result = box["r"]
    assert result.stop_reason == "cancelled"
    assert len(tiny_engine.tokens) <= tokens_at_cancel + 1


def test_cancel_during_prefill(tiny_engine):
    cancel = CancelToken()
    tiny_engine.prefill_chunk = 16
    r = tiny_engine.generate(PROMPT, GREEDY, 5, progress=lambda done, total: cancel.cancel(), cancel=cancel)
    assert r.stop_reason == "cancelled" and r.tokens == []
    assert len(tiny_engine.tokens) == 16  # stopped after the first chunk


def test_prefill_reports_progress_per_chunk(tiny_engine):
    tiny_engine.prefill_chunk = 32
    calls = []
    tiny_engine.generate(PROMPT, GREEDY, 1, progress=lambda d, t: calls.append((d, t)))
    assert calls == [(32, 90), (64, 90), (90, 90)]


def test_generation_stops_when_the_context_fills(tiny_engine):
    ctx = tiny_engine.context_length
    r = tiny_engine.generate(PROMPT[:1] * (ctx - 5), GREEDY, 50)
    assert r.stop_reason == "context_full"
    assert len(tiny_engine.tokens) < ctx and len(r.tokens) <= 5


@pytest.mark.parametrize("length", [0, 256, 1000])
def test_prompt_that_does_not_fit_is_a_clear_error(tiny_engine, length):
    with pytest.raises(PromptError, match="empty|context window holds 256"):
        tiny_engine.generate([1] * length, GREEDY, 5)
    assert tiny_engine.cache.length == 0


@pytest.mark.real_model
def test_real_model_knows_the_capital_of_france(real_engine):
    real_engine.reset()
    prompt = real_engine.prompt_tokens([{"role": "user", "content": "What is the capital of France?"}])
    r = real_engine.generate(prompt, GREEDY, 40)
    assert "Paris" in r.text
    assert r.stop_reason == "eos"
    assert not set(r.tokens) & real_engine.tokenizer.specials.stop


def test_onnx_runtime_telemetry_is_off(tiny_converted, tmp_path):
    """ONNX Runtime's telemetry (1.29+) writes a device id under ~/.cache/Microsoft and sends events;
    importing the engine opts out, so running a model leaves nothing there."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "ORT_DISABLE_TELEMETRY"}
    env["HOME"] = str(tmp_path)
    code = ("import sys; from engine.generation import Engine; from engine.model.convert import ConvertedModel; "
            "from pathlib import Path; e = Engine.load(ConvertedModel(Path(sys.argv[1]), Path(sys.argv[2]), 'x', 'int4', 2, "
            "'llama', 1), 'cpu'); e.prefill([5, 6, 7])")
    converted = tiny_converted("int4")
    proc = subprocess.run([sys.executable, "-c", code, str(converted.onnx_path), str(converted.gguf_path)],
                          capture_output=True, text=True, env=env, timeout=120,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert proc.returncode == 0, proc.stderr
    assert not (tmp_path / ".cache" / "Microsoft").exists()


def test_a_context_length_setting_caps_the_window_but_not_the_checkpoint_shape(tiny_engine):
    from engine.checkpoint.identity import engine_identity

    own = tiny_engine.context_length
    tiny_engine.set_context_limit(64)
    try:
        assert tiny_engine.context_length == 64
        with pytest.raises(PromptError, match="context window holds 64"):
            tiny_engine.generate([1] * 64, GREEDY, 5)
        r = tiny_engine.generate(PROMPT[:1] * 60, GREEDY, 50)
        assert r.stop_reason == "context_full" and len(tiny_engine.tokens) < 64
        assert engine_identity(tiny_engine).shape.context_length == own  # checkpoints survive the setting
        tiny_engine.set_context_limit(10 * own)
        assert tiny_engine.context_length == own  # never more than the model's own
        with pytest.raises(PromptError, match="too short"):
            tiny_engine.set_context_limit(3)
    finally:
        tiny_engine.set_context_limit(None)
