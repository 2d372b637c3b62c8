from __future__ import annotations

import numpy as np
import pytest

from engine.errors import HearthError
from engine.sampling import Sampler, SamplingParams, apply_repetition_penalty

LOGITS = np.random.default_rng(0).standard_normal(500).astype(np.float32) * 3


def draws(params: SamplingParams, n: int = 50) -> list[int]:
    s = Sampler(params)
    return [s.sample(LOGITS, []) for _ in range(n)]


def test_greedy_takes_argmax():
    assert draws(SamplingParams.greedy_params(), 3) == [int(LOGITS.argmax())] * 3


def test_same_seed_same_tokens_different_seed_different_tokens():
    p = SamplingParams(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0, repetition_penalty=1.0, seed=42)
    assert draws(p) == draws(p)
    other = SamplingParams(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0, repetition_penalty=1.0, seed=43)
    assert draws(p) != draws(other)


def test_top_k_limits_candidates():
    allowed = set(np.argsort(-LOGITS)[:3].tolist())
    got = set(draws(SamplingParams(temperature=5.0, top_k=3, top_p=1.0, min_p=0.0, seed=1), 200))
    assert got <= allowed and len(got) > 1


def test_top_p_limits_candidates():
    p = SamplingParams(temperature=1.0, top_k=0, top_p=0.3, min_p=0.0, seed=1)
    probs = np.exp(LOGITS - LOGITS.max())
    probs /= probs.sum()
    order = np.argsort(-probs)
    nucleus = order[: int(np.searchsorted(np.cumsum(probs[order]), 0.3) + 1)]
    assert set(draws(p, 200)) <= set(nucleus.tolist())


def test_min_p_limits_candidates():
    p = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.5, seed=1)
    probs = np.exp(LOGITS - LOGITS.max())
    assert set(draws(p, 200)) <= set(np.flatnonzero(probs >= 0.5).tolist())


def test_repetition_penalty_lowers_seen_tokens():
    logits = np.array([2.0, -2.0, 1.0], np.float32)
    out = apply_repetition_penalty(logits, [0, 1], 2.0)
    np.testing.assert_allclose(out, [1.0, -4.0, 1.0])
    top = int(LOGITS.argmax())
    assert Sampler(SamplingParams(greedy=False, temperature=0, repetition_penalty=100.0)).sample(LOGITS, [top]) != top


@pytest.mark.parametrize(
    "kwargs",
    [{"temperature": -1}, {"top_k": -2}, {"top_p": 0}, {"top_p": 1.5}, {"min_p": 1}, {"repetition_penalty": 0}],
)
def test_invalid_parameters_are_clear_errors(kwargs):
    with pytest.raises(HearthError):
        Sampler(SamplingParams(**kwargs))


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_logits_that_are_not_numbers_stop_generation_with_a_clear_error(bad):
    """NaN logits (fp16 overflow) used to become token 0 again and again: an empty reply and no error."""
    from engine.errors import NumericalError

    logits = np.zeros(50, np.float32)
    logits[7] = bad
    for params in (SamplingParams(greedy=True), SamplingParams(temperature=0.8, seed=1)):
        with pytest.raises(NumericalError, match=r"invalid numbers \(NaN or infinity\)"):
            Sampler(params).sample(logits, [])


def test_a_context_that_gives_nan_is_rebuilt_and_int4_is_not_told_to_run_int4(tiny_engine):
    """Issue 27: NaN rows in a reused context made every turn fail with "run it with --weights int4",
    on a model already running int4. The context is rebuilt from the prompt once, and the advice fits
    the precision."""
    engine = tiny_engine
    prompt = engine.encode_prompt("The owl flies at night over the quiet fields")
    engine.reset()
    engine.sync(prompt[:-1])
    keys, values = engine.cache.export()
    values[:, :, 0, :] = np.nan  # a poisoned context, as a resealed checkpoint once delivered
    engine.cache.truncate(0)
    engine.cache.load(keys, values)
    result = engine.generate(prompt, SamplingParams(greedy=True), max_new_tokens=3)
    assert result.tokens and result.reused_tokens == 0  # rebuilt: not reused, and a reply
    assert "int4 or fp32" not in engine._numerical_advice() and "--weights int4" in engine._numerical_advice()
