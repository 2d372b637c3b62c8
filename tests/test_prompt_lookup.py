"""Prompt-lookup decoding (engine/lookup.py): the same greedy tokens with drafts as without, the KV cache
rolled back after a rejected draft, the speculative acceptance rule's distribution, and its setting."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from engine.errors import PromptError
from engine.generation import Engine
from engine.lookup import propose, speculative_accept
from engine.model.convert import ensure_converted
from engine.sampling import Sampler
from engine.types import SamplingParams

GREEDY = SamplingParams.greedy_params()
LOOKUP = replace(GREEDY, prompt_lookup=8)
REPEAT = ("Copy this text exactly.\n\ndef add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\n"
          "def mul(a, b):\n    return a * b\n\nCopy:\n\ndef add(a, b):\n")
PROMPTS = ["The capital of France is", "Write a haiku about the sea.", REPEAT]


@pytest.fixture(scope="module")
def smol(real_home, tmp_path_factory) -> Engine:
    """The real default model, converted afresh (the graph must have the logits_start input)."""
    gguf = real_home / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    converted = ensure_converted(gguf, "int4", tmp_path_factory.mktemp("lookup") / "converted")
    return Engine.load(converted, "cpu")


def _run(engine: Engine, prompt: list[int], params: SamplingParams, n: int = 48):
    engine.reset()
    return engine.generate(prompt, params, n)


def test_the_proposer_drafts_what_followed_the_latest_match():
    assert propose([1, 2, 3, 9, 1, 2, 3, 7, 8, 1, 2, 3], 4) == [7, 8, 1, 2]  # the latest "1 2 3"
    assert propose([5, 6, 5], 3) == [6, 5]  # n=1 when nothing longer matches
    assert propose([1, 2, 3, 4], 4) == []
    assert propose([4, 4], 0) == [] and propose([4], 3) == []


@pytest.mark.parametrize("text", PROMPTS)
def test_greedy_tokens_are_the_same_with_and_without_lookup(smol, text):
    assert smol.runner.can_verify
    prompt = smol.prompt_tokens([{"role": "user", "content": text}])
    plain = _run(smol, prompt, GREEDY)
    drafted = _run(smol, prompt, LOOKUP)
    assert drafted.tokens == plain.tokens
    assert plain.timings.drafted_tokens == 0
    assert drafted.timings.accepted_tokens <= drafted.timings.drafted_tokens


def test_a_repetitive_prompt_accepts_drafts(smol):
    prompt = smol.encode_prompt(REPEAT)
    plain = _run(smol, prompt, GREEDY, 40)
    drafted = _run(smol, prompt, LOOKUP, 40)
    assert drafted.tokens == plain.tokens
    assert drafted.timings.accepted_tokens > 0
    assert len(smol.tokens) == smol.cache.length  # no draft rows left valid past the context


def test_the_kv_after_rejected_drafts_is_plain_decodings(smol):
    prompt = smol.encode_prompt(REPEAT + "def sub(x, y):\n")  # drafts "a, b" get rejected on the way
    drafted = _run(smol, prompt, LOOKUP, 24)
    assert drafted.timings.drafted_tokens > drafted.timings.accepted_tokens  # something was rejected
    tokens, keys, values = smol.export_kv()
    plain = _run(smol, prompt, GREEDY, 24)
    assert plain.tokens == drafted.tokens
    tokens2, keys2, values2 = smol.export_kv()
    assert tokens == tokens2
    np.testing.assert_allclose(keys, keys2, atol=1e-4)
    np.testing.assert_allclose(values, values2, atol=1e-4)
    # and continuing from each context gives the same next tokens
    more = smol.generate(tokens2 + [drafted.tokens[-1]], GREEDY, 8).tokens
    smol.reset()
    smol.import_kv(tokens, keys, values)
    assert smol.generate(tokens + [drafted.tokens[-1]], GREEDY, 8).tokens == more


def test_the_verification_pass_returns_the_last_positions_logits(smol):
    smol.reset()
    prompt = smol.encode_prompt("One two three four five")
    cache = smol.runner.new_cache()
    several = smol.runner.forward(prompt, cache, last=3)
    assert several.shape == (3, smol.runner.config.vocab_size)
    singles = []
    cache2 = smol.runner.new_cache()
    smol.runner.forward(prompt[:-3], cache2)
    for t in prompt[-3:]:
        singles.append(smol.runner.forward([t], cache2)[0])
    np.testing.assert_allclose(several, np.stack(singles), atol=2e-3)
    with pytest.raises(ValueError, match="last 9 of 5"):
        smol.runner.forward(prompt, smol.runner.new_cache(), last=9)


def test_lookup_off_means_no_drafts(tiny_engine):
    prompt = [1, 5, 6, 7, 5, 6, 7, 5, 6]
    result = tiny_engine.generate(prompt, GREEDY, 12)
    assert (result.timings.drafted_tokens, result.timings.accepted_tokens) == (0, 0)


@pytest.mark.parametrize("bad", [-1, 65, 2.5, True, "8"])
def test_bad_lookup_settings_are_refused(bad):
    with pytest.raises(PromptError, match="prompt lookup drafts 0"):
        replace(GREEDY, prompt_lookup=bad).validate()
    with pytest.raises(PromptError, match="prompt lookup"):
        Sampler(SamplingParams(prompt_lookup=bad))


# the acceptance rule ---------------------------------------------------------------------------------
P = np.array([0.5, 0.25, 0.15, 0.07, 0.03])
IDS = np.array([10, 11, 12, 13, 14])
DRAWS = 40_000


def _frequencies(rule, draft: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    counts = np.zeros(P.size)
    for _ in range(DRAWS):
        counts[int(rule(IDS, P, draft, rng)) - 10] += 1
    return counts / DRAWS


def _chi_square(freq: np.ndarray) -> float:
    expected = P * DRAWS
    return float((((freq * DRAWS) - expected) ** 2 / expected).sum())


CHI2_4DOF_999 = 18.47  # the 99.9th percentile of chi-square with 4 degrees of freedom


@pytest.mark.parametrize(("draft", "seed"), [(10, 1), (12, 2), (14, 3), (99, 4)])
def test_the_acceptance_rule_keeps_the_distribution(draft, seed):
    freq = _frequencies(speculative_accept, draft, seed)
    assert _chi_square(freq) < CHI2_4DOF_999
    assert 0.5 * np.abs(freq - P).sum() < 0.02  # total variation


@pytest.mark.parametrize("wrong", ["always", "never_resample_excluding"])
def test_a_wrong_acceptance_rule_fails_the_same_test(wrong):
    def always(ids, probs, draft, rng):
        return draft

    def naive(ids, probs, draft, rng):  # accept with p(t), else resample from p *with* t: biased towards t
        return draft if rng.random() < probs[ids == draft][0] else int(rng.choice(ids, p=probs))

    freq = _frequencies(always if wrong == "always" else naive, 12, 5)
    assert _chi_square(freq) > CHI2_4DOF_999


def test_a_draft_holding_all_the_mass_is_taken():
    rng = np.random.default_rng(0)
    assert speculative_accept(np.array([3, 4]), np.array([1.0, 0.0]), 3, rng) == 3


def test_sampling_with_lookup_drafts_and_keeps_the_cache_consistent(smol):
    prompt = smol.encode_prompt(REPEAT)
    params = SamplingParams(temperature=0.2, repetition_penalty=1.0, seed=3, prompt_lookup=8)
    result = _run(smol, prompt, params, 32)
    assert result.timings.drafted_tokens > 0
    assert result.stop_reason == "length"
    assert len(smol.tokens) == smol.cache.length == len(prompt) + len(result.tokens) - 1
    again = _run(smol, prompt, params, 32)  # the same seed, the same reply
    assert again.tokens == result.tokens


def test_the_back_off_pauses_after_drafts_that_keep_missing_and_ends_on_a_hit():
    from engine.lookup import Backoff

    b = Backoff(misses_before_pause=2, pause_tokens=4)
    b.outcome(0)
    assert b.ready()  # one miss: keep drafting
    b.outcome(0)
    assert [b.ready() for _ in range(5)] == [False] * 4 + [True]  # two in a row: a pause of 4 tokens
    b.outcome(0)
    assert [b.ready() for _ in range(9)] == [False] * 8 + [True]  # each further miss doubles it
    b.outcome(1)
    b.outcome(0)
    assert b.ready()  # a draft with a token accepted starts the count again
    off = Backoff(misses_before_pause=2, pause_tokens=0)
    for _ in range(5):
        off.outcome(0)
        assert off.ready()  # pause 0: never pauses


def test_the_back_off_drafts_less_where_drafts_miss_and_keeps_the_tokens(smol, monkeypatch):
    from engine import lookup

    prompt = smol.prompt_tokens([{"role": "user", "content": PROMPTS[0]}])
    plain = _run(smol, prompt, GREEDY, 48)
    monkeypatch.setattr(lookup, "PAUSE_TOKENS", 0)
    always = _run(smol, prompt, LOOKUP, 48)
    monkeypatch.setattr(lookup, "PAUSE_TOKENS", 16)
    backing_off = _run(smol, prompt, LOOKUP, 48)
    assert plain.tokens == always.tokens == backing_off.tokens
    assert backing_off.timings.drafted_tokens <= always.timings.drafted_tokens
