"""Stop strings and OpenAI's presence/frequency penalties: the filter and the logits arithmetic on their
own, then through the real engine (the tiny synthetic model, greedy) and ``Hearth.complete``."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from engine.errors import PromptError
from engine.sampling import Sampler, apply_openai_penalties
from engine.text.stop_strings import MAX_STOP_LENGTH, MAX_STOP_STRINGS, StopStringFilter
from engine.types import SamplingParams, StopReason

GREEDY = SamplingParams.greedy_params()
MESSAGES = [{"role": "user", "content": "hello there"}]


def run_filter(stop, pieces):
    f = StopStringFilter(stop)
    shown = [f.push(p) for p in pieces]
    shown.append(f.flush())
    return shown, f.stopped


# the filter ------------------------------------------------------------------------------------------
def test_one_stop_string_cuts_the_text_before_it():
    shown, stopped = run_filter(["END"], ["hello ", "world END and more"])
    assert "".join(shown) == "hello world " and stopped


def test_the_earliest_of_several_stop_strings_wins():
    shown, stopped = run_filter(["zz", "b", "world"], ["hello world", " abc zz"])
    assert "".join(shown) == "hello " and stopped


def test_a_stop_string_split_over_pieces_is_held_back_and_never_shown():
    shown, stopped = run_filter(["</answer>"], ["42", "</an", "sw", "er>", "tail"])
    assert shown[:2] == ["42", ""]  # "</an" could be the start: held
    assert "".join(shown) == "42" and stopped


def test_held_text_comes_out_when_it_turns_out_not_to_be_a_stop_string():
    shown, stopped = run_filter(["</answer>"], ["a</an", "t>b"])
    assert shown == ["a", "</ant>b", ""] and not stopped


def test_held_text_comes_out_at_the_end_of_the_reply():
    shown, stopped = run_filter(["STOP"], ["go ST"])
    assert shown == ["go ", "ST"] and not stopped


def test_a_stop_string_at_the_very_start_gives_empty_text():
    shown, stopped = run_filter(["Hi"], ["H", "i there"])
    assert "".join(shown) == "" and stopped


def test_no_stop_strings_passes_everything_through():
    shown, stopped = run_filter([], ["a", "b"])
    assert shown == ["a", "b", ""] and not stopped


@given(text=st.text(alphabet="ab<>/", max_size=30), cuts=st.lists(st.integers(0, 30), max_size=8),
       stop=st.lists(st.text(alphabet="ab<>/", min_size=1, max_size=4), min_size=1, max_size=3))
# Found in CI: "b" completes at 2 in the first piece while "<b<", begun at 1, completes only in the next;
# and the same reply ending before "<b<" could complete (the held "<b" must still stop at "b").
@example(text="<<b<", cuts=[3], stop=["b", "<b<"])
@example(text="<<b", cuts=[], stop=["b", "<b<"])
def test_whatever_the_split_streamed_text_is_always_a_prefix_of_the_answer(text, cuts, stop):
    firsts = [i for i in (text.find(s) for s in stop) if i >= 0]
    expected = text[: min(firsts)] if firsts else text
    bounds = sorted({0, len(text), *(c for c in cuts if c <= len(text))})
    f = StopStringFilter(stop)
    shown = ""
    for a, b in zip(bounds, bounds[1:], strict=False):
        shown += f.push(text[a:b])
        assert expected.startswith(shown)  # never a character that a later stop string takes back
    shown += f.flush()
    assert shown == expected and f.stopped == bool(firsts)


@pytest.mark.parametrize("stop, message", [
    ([""], "must not be empty"),
    (["x"] * (MAX_STOP_STRINGS + 1), f"at most {MAX_STOP_STRINGS} stop strings"),
    (["x" * (MAX_STOP_LENGTH + 1)], f"at most {MAX_STOP_LENGTH} characters"),
    ([3], "must be text"),
])
def test_bad_stop_strings_are_refused_with_a_clear_message(stop, message):
    with pytest.raises(PromptError, match=message):
        StopStringFilter(stop)


# penalties: the arithmetic -------------------------------------------------------------------------------
def test_presence_and_frequency_penalties_subtract_as_openai_specifies():
    logits = np.array([1.0, 2.0, 3.0, 4.0], dtype=np.float32)
    counts = np.array([0, 1, 3, 0], dtype=np.float32)  # token 1 once, token 2 three times
    out = apply_openai_penalties(logits, counts, presence=0.5, frequency=0.25)
    np.testing.assert_allclose(out, [1.0, 2.0 - 0.5 - 0.25, 3.0 - 0.5 - 0.75, 4.0])
    np.testing.assert_allclose(apply_openai_penalties(logits, counts, -1.0, 0.0), [1.0, 3.0, 4.0, 4.0])


def test_the_sampler_applies_penalties_only_to_tokens_in_the_reply():
    logits = np.array([5.0, 4.9, 0.0], dtype=np.float32)
    sampler = Sampler(GREEDY, presence_penalty=0.2)
    assert sampler.sample(logits, [0, 0, 0], np.zeros(3, dtype=np.float32)) == 0  # prompt tokens: no penalty
    assert sampler.sample(logits, [0], np.array([1, 0, 0], dtype=np.float32)) == 1


@pytest.mark.parametrize("kwargs, message", [
    ({"presence_penalty": 2.5}, "presence penalty must be from -2 to 2, got 2.5"),
    ({"frequency_penalty": -2.01}, "frequency penalty must be from -2 to 2"),
    ({"frequency_penalty": float("nan")}, "frequency penalty must be from -2 to 2"),
])
def test_out_of_range_penalties_are_refused(kwargs, message):
    with pytest.raises(PromptError, match=message):
        Sampler(GREEDY, **kwargs)


# through the engine ------------------------------------------------------------------------------------------
def greedy_reply(engine, n=40, **kwargs):
    pieces: list[str] = []
    result = engine.generate(engine.prompt_tokens(MESSAGES), GREEDY, n, on_text=pieces.append, **kwargs)
    return result, pieces


def test_a_stop_string_spanning_two_tokens_ends_the_reply_before_it(tiny_engine):
    base, pieces = greedy_reply(tiny_engine)
    # the first pair of neighbouring pieces whose joint (last char + first char) first occurs right there
    at = 0
    for k in range(len(pieces) - 1):
        at += len(pieces[k])
        stop = pieces[k][-1:] + pieces[k + 1][:1]
        if pieces[k] and pieces[k + 1] and base.text.find(stop) == at - 1:
            break
    else:
        pytest.fail(f"no two-token stop string in {base.text!r}")
    result, streamed = greedy_reply(tiny_engine, stop=[stop])
    assert result.stop_reason == "stop"
    assert result.text == base.text[: at - 1]
    assert "".join(streamed) == result.text  # the first half of the stop string was never streamed
    assert result.tokens == base.tokens[: k + 2]  # the token that completed it is counted, its text is not


def test_a_stop_string_at_the_very_start_streams_nothing(tiny_engine):
    base, _ = greedy_reply(tiny_engine)
    result, streamed = greedy_reply(tiny_engine, stop=["never there", base.text[:2]])
    assert result.stop_reason == "stop" and result.text == "" and "".join(streamed) == ""


def test_a_stop_string_that_never_comes_changes_nothing(tiny_engine):
    base, _ = greedy_reply(tiny_engine)
    result, streamed = greedy_reply(tiny_engine, stop=["\u2603never"])
    assert (result.text, result.stop_reason, result.tokens) == (base.text, base.stop_reason, base.tokens)
    assert "".join(streamed) == base.text


def test_penalties_change_a_repetitive_greedy_reply_as_their_sign_says(tiny_engine):
    def most_repeated(tokens):
        return max(np.bincount(tokens))

    base, _ = greedy_reply(tiny_engine, 60)
    discouraged, _ = greedy_reply(tiny_engine, 60, frequency_penalty=2.0, presence_penalty=2.0)
    encouraged, _ = greedy_reply(tiny_engine, 60, frequency_penalty=-2.0)
    assert most_repeated(discouraged.tokens) < most_repeated(base.tokens) < most_repeated(encouraged.tokens)
    # the first token has nothing in the reply to penalise
    assert discouraged.tokens[0] == base.tokens[0] == encouraged.tokens[0]


def test_logprobs_stay_those_of_the_raw_distribution_under_penalties(tiny_engine):
    base, _ = greedy_reply(tiny_engine, 10, top_logprobs=2)
    penalised, _ = greedy_reply(tiny_engine, 10, top_logprobs=2, presence_penalty=2.0)
    assert penalised.logprobs[0].logprob == pytest.approx(base.logprobs[0].logprob, abs=1e-4)  # the same first step
    # greedy under a penalty picks tokens that are not the raw favourite: the report still ranks by the raw
    # distribution, so such a token is not at the head of its own list
    demoted = [lp for lp in penalised.logprobs if lp.top[0][0] != lp.token]
    assert demoted and all(lp.logprob < lp.top[0][1] for lp in demoted)


def test_bad_options_are_refused_before_the_cache_changes(tiny_engine):
    greedy_reply(tiny_engine, 3)
    before = list(tiny_engine.tokens)
    for kwargs in ({"stop": [""]}, {"presence_penalty": 3.0}, {"frequency_penalty": -9}):
        with pytest.raises(PromptError):
            tiny_engine.generate(tiny_engine.prompt_tokens([{"role": "user", "content": "other"}]), GREEDY, 5, **kwargs)
        assert tiny_engine.tokens == before


# through the API ------------------------------------------------------------------------------------------------
def test_complete_and_complete_raw_take_stop_strings_and_penalties(hearth):
    base = hearth.complete(MESSAGES, GREEDY, 30)
    stopped = hearth.complete(MESSAGES, GREEDY, 30, stop=[base.text[3:6]])
    assert stopped.stop_reason == StopReason.STOP and stopped.text == base.text[: base.text.find(base.text[3:6])]
    raw = hearth.complete_raw("hello", GREEDY, 30)
    raw_stopped = hearth.complete_raw("hello", GREEDY, 30, stop=[raw.text[:1]])
    assert raw_stopped.stop_reason == StopReason.STOP and raw_stopped.text == ""
    penalised = hearth.complete(MESSAGES, GREEDY, 30, frequency_penalty=2.0)
    assert penalised.tokens != base.tokens
    with pytest.raises(PromptError, match="presence penalty"):
        hearth.complete_raw("hello", GREEDY, 5, presence_penalty=-2.5)
