"""Tokenizers (byte-level BPE and SentencePiece), chat templates (the file's and built-in ones), stop
tokens and streaming detokenization: on the real models' GGUFs and on small written vocabularies."""

from __future__ import annotations

import pytest

from engine.errors import PromptError, UnsupportedModelError
from engine.text.chat_template import ChatTemplate
from engine.text.stream import StreamDecoder
from tests.text_helpers import gguf_vocabulary, reference_spm, spm_vocabulary, write_bare_gguf, write_spm_gguf

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


# the default model's tokenizer identity -------------------------------------------------------------
@pytest.mark.real_model
def test_default_model_tokenizer_fingerprint_is_unchanged(tokenizer):
    # Saved checkpoints record this fingerprint: a change would orphan every saved conversation.
    assert tokenizer.kind == "gpt2"
    assert tokenizer.fingerprint.hex() == "230f5c9b1f0dc861a50bb256ffd02f721c0b9e59948d3b017919fc404ee7ff8b"
    assert tokenizer.specials.stop == {0, 2}


# byte-level pre-tokenizers ----------------------------------------------------------------------------
@pytest.mark.parametrize("pre,digits", [("qwen2", ["1", "2", "3", "4", "5"]), ("llama-bpe", ["123", "45"]),
                                        ("smollm", ["1", "2", "3", "4", "5"]), ("gpt2", ["Ġ12345"])])
def test_pre_tokenizers_split_numbers_as_their_models_do(pre, digits):
    from engine.text.byte_level import build, byte_to_char

    hf = build([byte_to_char()[b] for b in range(256)], [], pre)
    words = [w for w, _ in hf.pre_tokenizer.pre_tokenize_str("It's 12345")]
    assert words[-len(digits):] == digits


def test_llama3_and_qwen2_words_keep_their_leading_space_and_case_insensitive_contractions():
    from engine.text.byte_level import build, byte_to_char

    for pre in ("llama-bpe", "qwen2"):
        hf = build([byte_to_char()[b] for b in range(256)], [], pre)
        assert [w for w, _ in hf.pre_tokenizer.pre_tokenize_str("IT'S a test!\n\n")] == ["IT", "'S", "Ġa", "Ġtest", "!ĊĊ"]


def test_unknown_pre_tokenizer_is_refused():
    from engine.text.byte_level import build

    with pytest.raises(UnsupportedModelError, match="pre-tokenizer 'mystery' is not supported"):
        build(["a"], [], "mystery")


# SentencePiece vocabularies: a synthetic one ------------------------------------------------------------
@pytest.fixture(scope="module")
def spm(tmp_path_factory):
    from engine.model.gguf_file import GGUFModel
    from engine.text.tokenizer import Tokenizer

    folder = tmp_path_factory.mktemp("spm")
    with_prefix = Tokenizer.from_gguf(GGUFModel(write_spm_gguf(folder / "prefix.gguf", eot="<end_of_turn>")))
    plain = Tokenizer.from_gguf(GGUFModel(write_spm_gguf(folder / "plain.gguf", add_space_prefix=False)))
    return with_prefix, plain


@pytest.mark.parametrize("text,ids", [
    ("hel", [262, 278, 265]),  # "he" scores above "▁h": ▁ he l, not ▁h e l
    ("hello world", [282, 289]),  # ll, he, llo, hello, ▁hello, or, ▁w, ▁wor, ld, ▁world
    ("sandy", [262, 274, 284, 276]),  # ▁ s and y
    ("<s>hello\nhi", [1, 282, 5, 279, 272]),  # specials first; the space prefix after each special, as llama.cpp
    ("é", [262, 6 + 0xC3, 6 + 0xA9]),  # not in the vocabulary: its UTF-8 bytes
])
def test_sentencepiece_known_ids(spm, text, ids):
    assert spm[0].encode(text) == ids


def test_sentencepiece_without_space_prefix(spm):
    _, plain = spm
    assert plain.encode("hello world") == [281, 289]
    assert plain.encode("hi") == [263, 272]
    assert plain.decode(plain.encode(" hello")) == " hello"


@pytest.mark.parametrize("text", ["hello world", "sandy wand", "é ünï 日本 🎉", "a  b\tc\r\n", "\x00\x7f", "hello"])
def test_sentencepiece_round_trip_and_matches_the_reference(spm, text):
    tokens, scores, types = spm_vocabulary()
    for tok, prefix in zip(spm, (True, False), strict=True):
        ids = tok.encode(text)
        assert ids == reference_spm(tokens, types, scores, text, prefix)
        assert tok.decode(ids) == text
        stream = StreamDecoder(tok)
        assert "".join([stream.push(i) for i in ids] + [stream.flush()]) == (" " + text if prefix else text)


def test_sentencepiece_specials_and_stop_ids(spm):
    tok, plain = spm
    assert (tok.specials.bos, tok.specials.eos, tok.specials.eot, tok.add_bos) == (1, 2, 4, True)
    assert tok.specials.stop == {2, 4}  # EOS, EOT (<end_of_turn>)
    assert tok.decode([1, 282, 4, 2]) == "hello" and tok.decode([1, 282, 4], skip_special=False) == "<s> hello<end_of_turn>"
    assert tok.kind == "llama" and tok.fingerprint != plain.fingerprint  # the space prefix changes the ids


# SentencePiece: the real Gemma 3 file -------------------------------------------------------------------
GEMMA_SAMPLES = [*SAMPLES, "\x00\x01\x1b[0m bell\x07", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𐍈 \U0010fffd", "  indented\n\n\n    code\t\ttabs",
                 "<b>bold</b> <start_of_turn>user\nHi<end_of_turn>\n"]


@pytest.mark.real_model
def test_gemma_vocabulary_facts(gemma_tokenizer):
    tok = gemma_tokenizer
    assert (tok.kind, tok.vocab_size, tok.add_bos, tok.add_space_prefix) == ("llama", 262_144, True, False)
    assert (tok.specials.bos, tok.specials.eos) == (2, 1)
    assert tok.token_id("<end_of_turn>") == 106 and tok.token_id("<start_of_turn>") == 105
    assert tok.specials.stop == {1, 106}
    assert tok.tokens[238] == "<0x00>" and tok.token_bytes(238) == b"\x00"


@pytest.mark.real_model
@pytest.mark.parametrize("text,ids", [
    ("Hello, world!", [9259, 236764, 1902, 236888]),  # Hello , ▁world !
    ("<start_of_turn>user\nHi<end_of_turn>\n", [105, 2364, 107, 10979, 106, 107]),
    ("<start_of_turn>model\n", [105, 4368, 107]),
    ("\x00", [238]),  # byte fallback: <0x00>
])
def test_gemma_known_ids(gemma_tokenizer, text, ids):
    assert gemma_tokenizer.encode(text) == ids


@pytest.mark.real_model
@pytest.mark.parametrize("text", GEMMA_SAMPLES)
def test_gemma_round_trip_streaming_and_reference(gemma_tokenizer, gemma_model, text):
    tok = gemma_tokenizer
    ids = tok.encode(text)
    assert tok.decode(ids, skip_special=False) == text
    tokens, types, scores = gguf_vocabulary(gemma_model)
    assert ids == reference_spm(tokens, types, scores, text, add_space_prefix=False)
    stream = StreamDecoder(tok)
    pieces = [stream.push(i) for i in ids] + [stream.flush()]
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) == tok.decode(ids)


@pytest.mark.real_model
def test_gemma_gets_the_builtin_gemma_template(gemma_tokenizer, gemma_model):
    from engine.text.builtin_templates import template_for
    from engine.text.profile import describe

    template = template_for(gemma_model, gemma_tokenizer)
    assert template.template_source == "builtin:gemma" and template.end_of_turn == "<end_of_turn>"
    text = template.render([{"role": "user", "content": "Hi"}])
    assert text == "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"
    assert gemma_tokenizer.encode(text) == [2, 105, 2364, 107, 10979, 106, 107, 105, 4368, 107]
    profile = describe(gemma_model)
    assert (profile.kind, profile.chat_template_source, profile.tokenizer) == ("base", "builtin:gemma", "llama")
    assert profile.stop_tokens == ("<end_of_turn>", "<eos>")


# built-in chat templates --------------------------------------------------------------------------------
CONVERSATION = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye"}]


@pytest.mark.parametrize("family,bos,expected", [
    ("gemma", "<bos>", "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n"
                       "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n"),
    ("chatml", "", "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
                   "Hello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n"),
    ("llama3", "<|begin_of_text|>",
     "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|><|start_header_id|>user"
     "<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
     "<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"),
])
def test_builtin_templates_render_exactly(family, bos, expected):
    from engine.text.builtin_templates import FAMILIES

    source = next(f.source for f in FAMILIES if f.name == family)
    assert ChatTemplate(source, bos).render(CONVERSATION) == expected


def test_gemma_template_without_system_and_without_generation_prompt():
    from engine.text.builtin_templates import FAMILIES

    t = ChatTemplate(FAMILIES[0].source, "<bos>")
    text = t.render([{"role": "user", "content": "Hi"}], add_generation_prompt=False)
    assert text == "<bos><start_of_turn>user\nHi<end_of_turn>\n"


@pytest.mark.parametrize("architecture,markers,family", [
    ("gemma3", {"<start_of_turn>", "<end_of_turn>"}, "gemma"),
    ("llama", {"<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"}, "llama3"),
    ("qwen2", {"<|im_start|>", "<|im_end|>"}, "chatml"),
    ("qwen2", {"<|im_start|>", "<|im_end|>", "<start_of_turn>", "<end_of_turn>"}, "chatml"),  # the architecture decides
    ("llama", {"<|im_start|>", "<|im_end|>"}, "chatml"),  # the only format the vocabulary can spell
    ("gemma3", {"<start_of_turn>"}, None),  # half a format is none
    ("llama", {"<s>", "</s>"}, None),
])
def test_builtin_family_is_chosen_from_vocabulary_and_architecture(architecture, markers, family):
    from engine.text.builtin_templates import choose_family

    chosen = choose_family(architecture, markers | {"a", "b"})
    assert (chosen.name if chosen else None) == family


def test_template_source_and_stop_ids_for_synthetic_files(tmp_path, tiny_gguf):
    from engine.generation import Engine
    from engine.model.gguf_file import GGUFModel
    from engine.text.builtin_templates import stop_ids
    from engine.text.profile import describe
    from engine.text.tokenizer import Tokenizer

    spm_file = GGUFModel(write_spm_gguf(tmp_path / "spm.gguf"))
    tok = Tokenizer.from_gguf(spm_file)
    builtin = Engine.template_for(spm_file, tok)
    assert builtin.template_source == "builtin:gemma" and builtin.bos_token == "<s>"
    assert stop_ids(tok, builtin) == {2, 4}  # EOS and the family's <end_of_turn>
    assert describe(spm_file).as_dict() == {"tokenizer": "llama", "vocab_size": 291, "chat_template_source": "builtin:gemma",
                                            "kind": "base", "stop_tokens": ["</s>", "<end_of_turn>"]}
    own = GGUFModel(write_spm_gguf(tmp_path / "own.gguf", template="{{ messages[0]['content'] }}"))
    assert Engine.template_for(own, Tokenizer.from_gguf(own)).template_source == "gguf"
    assert describe(own).kind == "chat"
    tiny = GGUFModel(tiny_gguf)
    assert Engine.template_for(tiny, Tokenizer.from_gguf(tiny)).template_source == "gguf"
    none = GGUFModel(write_spm_gguf(tmp_path / "none.gguf", architecture="llama"))
    assert describe(none).chat_template_source == "builtin:gemma"  # the vocabulary spells Gemma's turns


def test_model_without_any_usable_format_cannot_chat(tmp_path):
    from engine.generation import Engine
    from engine.model.gguf_file import GGUFModel
    from engine.text.tokenizer import Tokenizer

    write_bare_gguf(tmp_path / "bare.gguf")
    bare = GGUFModel(tmp_path / "bare.gguf")
    with pytest.raises(PromptError, match="has no chat template, and its vocabulary fits none"):
        Engine.template_for(bare, Tokenizer.from_gguf(bare))


@pytest.mark.parametrize("finetune,name,template,kind", [
    ("instruct", "Llama 3.2 1B", None, "chat"),
    (None, "Gemma 3 270m It", None, "chat"),
    ("base", "Qwen2.5 0.5B", "{{ x }}", "base"),  # a base model's file may still carry a template
    (None, "Gemma 3 270m", None, "base"),
    ("8k-lc100k-mix1-ep2", "Smollm2 135M", "{{ x }}", "chat"),
])
def test_model_kind_from_metadata(tmp_path, finetune, name, template, kind):
    import gguf

    from engine.model.gguf_file import GGUFModel
    from engine.text.profile import model_kind

    writer = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "llama")
    writer.add_name(name)
    if finetune:
        writer.add_finetune(finetune)
    if template:
        writer.add_chat_template(template)
    for step in (writer.write_header_to_file, writer.write_kv_data_to_file, writer.write_tensors_to_file, writer.close):
        step()
    assert model_kind(GGUFModel(tmp_path / "m.gguf")) == kind
