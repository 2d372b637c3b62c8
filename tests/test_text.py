"""Tokenizer, chat template and streaming detokenization on the real model's GGUF."""

from __future__ import annotations

import pytest

from engine.errors import PromptError, UnsupportedModelError
from engine.text.chat_template import ChatTemplate
from engine.text.stream import StreamDecoder

SAMPLES = [
    "Hello, world!",
    "naïve café — Ünïcödé ½ ∑ 日本語のテキスト Ελληνικά",
    "emoji 🎉👩‍👩‍👧‍👦🇫🇷 and skin tones 👍🏽",
    "  leading, trailing   \t\n\n  whitespace runs \r\n ",
    "def f(x: int) -> int:\n    return x ** 2  # squares\n\tif x != 0: {'a': [1, 2]}",
    "digits 1234567890 and 3.14159",
]


@pytest.fixture(scope="module")
def tokenizer(real_engine):
    return real_engine.tokenizer


@pytest.mark.real_model
@pytest.mark.parametrize("text", SAMPLES)
def test_round_trip(tokenizer, text):
    ids = tokenizer.encode(text)
    assert ids
    assert tokenizer.decode(ids) == text


@pytest.mark.real_model
def test_words_become_whole_vocabulary_tokens(tokenizer):
    # Common words are single BPE tokens (Ġ marks a leading space); the smollm pre-tokenizer splits
    # digits one by one; ChatML markers in text are their single special ids.
    pieces = [tokenizer.tokens[i] for i in tokenizer.encode("What is the capital of France?")]
    assert pieces == ["What", "Ġis", "Ġthe", "Ġcapital", "Ġof", "ĠFrance", "?"]
    assert [tokenizer.tokens[i] for i in tokenizer.encode("12345")] == list("12345")
    ids = tokenizer.encode("<|im_start|>user\nHi<|im_end|>")
    assert ids[0] == tokenizer.tokens.index("<|im_start|>") and ids[-1] == tokenizer.tokens.index("<|im_end|>")
    assert tokenizer.decode(ids, skip_special=False) == "<|im_start|>user\nHi<|im_end|>"


@pytest.mark.real_model
@pytest.mark.parametrize("text", SAMPLES)
def test_streaming_never_emits_broken_utf8(tokenizer, text):
    stream = StreamDecoder(tokenizer)
    pieces = [stream.push(i) for i in tokenizer.encode(text)] + [stream.flush()]
    for piece in pieces:
        assert "\ufffd" not in piece  # no replacement characters from split multi-byte sequences
    assert "".join(pieces) == text


@pytest.mark.real_model
def test_emoji_is_split_over_tokens_and_held_back(tokenizer):
    ids = tokenizer.encode("🎉")
    assert len(ids) > 1  # the interesting case: one character, several tokens
    stream = StreamDecoder(tokenizer)
    assert stream.push(ids[0]) == ""
    assert "".join(stream.push(i) for i in ids[1:]) == "🎉"


@pytest.mark.real_model
def test_template_renders_chatml_with_default_system_prompt(real_engine):
    text = real_engine.render([{"role": "user", "content": "Hi"}])
    assert text.startswith("<|im_start|>system\n")
    assert text.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


def test_template_runs_sandboxed():
    hostile = "{{ ''.__class__.__mro__[1].__subclasses__() }}"
    with pytest.raises(PromptError):
        ChatTemplate(hostile).render([{"role": "user", "content": "x"}])


def test_template_raise_exception_becomes_a_prompt_error():
    t = ChatTemplate("{% if messages[0]['role'] != 'user' %}{{ raise_exception('first must be user') }}{% endif %}")
    with pytest.raises(PromptError, match="first must be user"):
        t.render([{"role": "assistant", "content": "x"}, {"role": "user", "content": "y"}])


def test_invalid_template_syntax_is_reported():
    with pytest.raises(UnsupportedModelError, match="not valid Jinja"):
        ChatTemplate("{% for %}")


@pytest.mark.parametrize(
    "messages,match",
    [
        ([], "non-empty list"),
        ("hello", "non-empty list"),
        ([{"role": "user"}], "role"),
        ([{"role": "wizard", "content": "x"}], "role 'wizard'"),
        ([{"role": "user", "content": 5}], "must be text"),
        ([{"role": "user", "content": "   "}], "empty"),
    ],
)
def test_bad_messages_are_rejected(messages, match):
    with pytest.raises(PromptError, match=match):
        ChatTemplate("{{ messages }}").render(messages)
