"""The reply parser against fixed transcripts of each template's tool format, and streaming ≡ whole.

The formats come from the real templates in tests/templates/ (reply_format_for reads them), so a
template's style and the parser's reading of it are tested together.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.text.reply_format import ReplyFormat, reply_format_for
from engine.text.reply_parse import MAX_CALL_CHARS, MAX_CALLS, ReplyParser, new_call_id, parse_reply
from engine.types import PieceKind

TEMPLATES = Path(__file__).parent / "templates"
QWEN3 = reply_format_for((TEMPLATES / "qwen3.jinja").read_text())
QWEN25 = reply_format_for((TEMPLATES / "qwen2.5.jinja").read_text())
LLAMA = reply_format_for((TEMPLATES / "llama3.2.jinja").read_text())
MISTRAL = reply_format_for((TEMPLATES / "mistral-nemo.jinja").read_text())
MISTRAL_ARGS = reply_format_for((TEMPLATES / "mistral-small-3.2.jinja").read_text())
FALLBACK = reply_format_for((TEMPLATES / "smollm2.jinja").read_text())
R1 = reply_format_for((TEMPLATES / "deepseek-r1-distill-qwen.jinja").read_text())
TOOLS = ["get_weather", "search"]


def ids():
    counter = itertools.count()
    return lambda: f"call_{next(counter):024x}"


def parse(fmt: ReplyFormat, text: str, **kw):
    kw.setdefault("tools", TOOLS)
    return parse_reply(fmt, text, new_id=ids(), **kw)


def calls(result) -> list[tuple[str, str]]:
    return [(c.name, c.arguments) for c in result.tool_calls]


def hermes_call(name: str, args: str) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {args}}}\n</tool_call>'


# --- Hermes (Qwen2.5, Qwen3, Hermes 3) ------------------------------------------------------------

def test_hermes_one_call_is_a_call_and_no_text():
    r = parse(QWEN25, hermes_call("get_weather", '{"city": "Paris"}'))
    assert calls(r) == [("get_weather", '{"city": "Paris"}')]
    assert r.content == "" and r.reasoning == ""
    assert r.tool_calls[0].id == f"call_{0:024x}" and r.tool_calls[0].index == 0
    assert [p.kind for p in r.pieces] == [PieceKind.TOOL_CALL]


def test_hermes_arguments_are_the_exact_text_the_model_wrote():
    args = '{"city":"Paris" ,  "days":[1,2.50]}'
    r = parse(QWEN25, hermes_call("get_weather", args))
    assert r.tool_calls[0].arguments == args
    assert json.loads(r.tool_calls[0].arguments) == {"city": "Paris", "days": [1, 2.5]}


def test_hermes_several_calls_and_text_around_them():
    text = ("Let me look.\n" + hermes_call("get_weather", '{"city": "Oslo"}') + "\n"
            + hermes_call("search", '{"q": "fjords"}') + "\n\nDone soon.")
    r = parse(QWEN25, text)
    assert calls(r) == [("get_weather", '{"city": "Oslo"}'), ("search", '{"q": "fjords"}')]
    assert [c.index for c in r.tool_calls] == [0, 1]
    assert r.content == "Let me look.Done soon."  # the newlines next to a call are the format's, not text
    assert [p.kind for p in r.pieces] == [PieceKind.CONTENT, PieceKind.TOOL_CALL, PieceKind.TOOL_CALL, PieceKind.CONTENT]


@pytest.mark.parametrize("inner", [
    '{"name": "get_weather", "arguments": {"city": "Paris"}',  # broken JSON: the object never closes
    '{"name": "get_weather", "arguments": {"city": Paris}}',  # broken JSON: a bare word
    '{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}',  # arguments not an object
    '{"name": "get_weather", "arguments": [1, 2]}',  # arguments not an object
    '{"name": "rm_rf", "arguments": {}}',  # a tool that was not offered
    '{"name": 7, "arguments": {}}',  # a name that is not text
    '{"arguments": {}}',  # no name
    '{"name": "get_weather", "arguments": {"t": NaN}}',  # not JSON, though Python reads it
    '{"name": "get_weather", "arguments": {}} trailing',  # more than one object
])
def test_hermes_a_call_that_does_not_parse_is_text(inner):
    text = f"Before <tool_call>\n{inner}\n</tool_call> after"
    r = parse(QWEN25, text)
    assert r.tool_calls == ()
    assert r.content == text


def test_hermes_call_truncated_mid_call_is_text():
    text = 'Sure.\n<tool_call>\n{"name": "get_weather", "argum'
    r = parse(QWEN25, text)
    assert r.tool_calls == () and r.content == text


def test_hermes_good_call_then_a_broken_one():
    good = hermes_call("get_weather", '{"city": "Rome"}')
    broken = '<tool_call>\n{"name": "search", "arguments": {"q": }\n</tool_call>'
    r = parse(QWEN25, good + "\n" + broken)
    assert calls(r) == [("get_weather", '{"city": "Rome"}')]
    assert r.content == broken


def test_huge_call_is_text_and_the_text_after_it_still_parses():
    huge = hermes_call("search", json.dumps({"q": "x" * MAX_CALL_CHARS}))
    after = hermes_call("get_weather", '{"city": "Lima"}')
    r = parse(QWEN25, huge + after)
    assert calls(r) == [("get_weather", '{"city": "Lima"}')]
    assert r.content == huge


def test_call_just_under_the_limit_parses():
    args = json.dumps({"q": "y" * (MAX_CALL_CHARS - 100)})
    r = parse(QWEN25, hermes_call("search", args))
    assert calls(r) == [("search", args)]


def test_parallel_false_keeps_the_first_call_only():
    text = hermes_call("get_weather", '{"city": "A"}') + "\n" + hermes_call("search", '{"q": "B"}')
    r = parse(QWEN25, text, parallel=False)
    assert calls(r) == [("get_weather", '{"city": "A"}')] and r.content == ""


def test_at_most_max_calls():
    text = "\n".join(hermes_call("search", f'{{"q": "{i}"}}') for i in range(MAX_CALLS + 5))
    r = parse(QWEN25, text)
    assert len(r.tool_calls) == MAX_CALLS
    assert r.tool_calls[-1].arguments == f'{{"q": "{MAX_CALLS - 1}"}}'


def test_no_tools_means_no_calls():
    text = hermes_call("get_weather", '{"city": "Paris"}')
    assert parse(QWEN25, text, tools=()).content == text
    assert parse(QWEN25, text, tools=False).tool_calls == ()


def test_tools_as_openai_dicts_and_as_any_name():
    text = hermes_call("anything", "{}")
    offered = [{"type": "function", "function": {"name": "anything"}}]
    assert calls(parse(QWEN25, text, tools=offered)) == [("anything", "{}")]
    assert calls(parse(QWEN25, text, tools=True)) == [("anything", "{}")]


def test_default_ids_are_openai_shaped_and_unique():
    a, b = new_call_id(), new_call_id()
    assert a != b and a.startswith("call_") and len(a) == 29 and int(a[5:], 16) >= 0


# --- thinking (Qwen3, DeepSeek-R1 distills) -----------------------------------------------------------

def test_qwen3_thinking_then_call():
    text = "<think>\nThe user wants weather.\n\nCall it.\n</think>\n\n" + hermes_call("get_weather", '{"city": "Oslo"}')
    r = parse(QWEN3, text)
    assert r.reasoning == "The user wants weather.\n\nCall it."
    assert r.content == ""
    assert calls(r) == [("get_weather", '{"city": "Oslo"}')]


def test_qwen3_thinking_then_answer_strips_the_template_newlines():
    r = parse(QWEN3, "<think>\n\nponder\n\n</think>\n\nThe answer is 4.\n", tools=())
    assert (r.reasoning, r.content) == ("ponder", "The answer is 4.\n")
    assert [p.kind for p in r.pieces] == [PieceKind.REASONING, PieceKind.CONTENT]


def test_qwen3_empty_thinking_block():
    r = parse(QWEN3, "<think>\n\n</think>\n\nHi.", tools=())
    assert (r.reasoning, r.content) == ("", "Hi.")


def test_thinking_unterminated_is_all_reasoning():
    r = parse(QWEN3, "<think>\nstill going " + hermes_call("search", "{}"))
    assert r.content == "" and r.tool_calls == ()
    assert r.reasoning == "still going " + hermes_call("search", "{}")


def test_reply_that_starts_inside_thinking():
    r = parse(R1, "Let me think.\n</think>\n\nParis.", in_thinking=True, tools=())
    assert (r.reasoning, r.content) == ("Let me think.", "Paris.")


def test_think_marker_later_in_the_reply_is_text():
    r = parse(QWEN3, "Use <think> tags.", tools=())
    assert (r.reasoning, r.content) == ("", "Use <think> tags.")


def test_partial_think_marker_at_the_end_is_text():
    r = parse(QWEN3, "<thi", tools=())
    assert (r.reasoning, r.content) == ("", "<thi")


def test_format_without_markers_never_splits_thinking():
    r = parse(QWEN25, "<think>x</think>y", tools=(), in_thinking=True)
    assert (r.reasoning, r.content) == ("", "<think>x</think>y")


# --- Llama 3.1+ JSON ----------------------------------------------------------------------------------

def test_llama_bare_json_call():
    r = parse(LLAMA, '{"name": "get_weather", "parameters": {"city": "Paris"}}')
    assert calls(r) == [("get_weather", '{"city": "Paris"}')] and r.content == ""


def test_llama_arguments_key_also_accepted():
    r = parse(LLAMA, ' \n{"name": "search", "arguments": {"q": "x"}}\n')
    assert calls(r) == [("search", '{"q": "x"}')]


def test_llama_python_tag_calls_separated_by_semicolons():
    text = '<|python_tag|>{"name": "search", "parameters": {"q": "a"}}; {"name": "get_weather", "parameters": {}}'
    r = parse(LLAMA, text)
    assert calls(r) == [("search", '{"q": "a"}'), ("get_weather", "{}")]


def test_llama_text_then_python_tag_call():
    r = parse(LLAMA, 'Checking.<|python_tag|>{"name": "search", "parameters": {"q": "a"}}')
    assert r.content == "Checking." and calls(r) == [("search", '{"q": "a"}')]


@pytest.mark.parametrize("text", [
    '{"name": "get_weather", "parameters": {"city": "Paris"}} and some words',  # not the whole reply
    '{"name": "get_weather", "parameters": {"city": "Par',  # truncated
    '{"name": "nope", "parameters": {}}',  # not offered
    '{"name": "search", "parameters": "q"}',  # parameters not an object
    '{"answer": 42}',  # JSON content that is no call
    '<|python_tag|>brave_search.call(query="x")',  # a built-in tool Hearth does not run
    '{"name": "search", "parameters": {}}; {"name": "nope", "parameters": {}}',  # one of them not offered
])
def test_llama_what_is_not_a_call_is_text(text):
    r = parse(LLAMA, text)
    assert r.tool_calls == () and r.content == text


def test_llama_plain_text():
    r = parse(LLAMA, "Hello there.")
    assert r.content == "Hello there." and r.tool_calls == ()


# --- Mistral [TOOL_CALLS] -----------------------------------------------------------------------------

def test_mistral_call_list():
    text = ('[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Nice"}, "id": "a1b2c3d4e"}, '
            '{"name": "search", "arguments": {}}]')
    r = parse(MISTRAL, text)
    assert calls(r) == [("get_weather", '{"city": "Nice"}'), ("search", "{}")] and r.content == ""


@pytest.mark.parametrize("text", [
    '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Nice"}}',  # truncated
    '[TOOL_CALLS]{"name": "get_weather", "arguments": {}}',  # not a list
    '[TOOL_CALLS][{"name": "get_weather", "arguments": {}}] more',  # text after the list
    '[TOOL_CALLS][{"name": "x", "arguments": {}}]',  # not offered
    '[TOOL_CALLS][]',  # no call in it
])
def test_mistral_what_is_not_a_call_is_text(text):
    r = parse(MISTRAL, text)
    assert r.tool_calls == () and r.content == text


def test_mistral_name_args_calls():
    assert MISTRAL_ARGS.tool_style == "mistral_args"
    text = 'Sure.[TOOL_CALLS]search[ARGS]{"q": "a"}[TOOL_CALLS]get_weather[CALL_ID]abc123XYZ[ARGS]{"city": "Nice"}'
    r = parse(MISTRAL_ARGS, text)
    assert r.content == "Sure."
    assert calls(r) == [("search", '{"q": "a"}'), ("get_weather", '{"city": "Nice"}')]


@pytest.mark.parametrize("text", [
    '[TOOL_CALLS]search[ARGS]{"q": "a"',  # truncated
    '[TOOL_CALLS]search{"q": "a"}',  # no [ARGS]
    '[TOOL_CALLS]nope[ARGS]{}',  # not offered
    '[TOOL_CALLS]search[ARGS][1]',  # arguments not an object
    '[TOOL_CALLS]search[ARGS]{} and then text',  # text after the calls
    '[TOOL_CALLS]search[CALL_ID]a-b[ARGS]{}',  # an id that is not letters and digits
    '[TOOL_CALLS]bad name[ARGS]{}',
])
def test_mistral_name_args_what_is_not_a_call_is_text(text):
    r = parse(MISTRAL_ARGS, text)
    assert r.tool_calls == () and r.content == text


# --- the fallback -------------------------------------------------------------------------------------

def test_fallback_reads_hermes_tags():
    assert FALLBACK.tool_style == "fallback"
    r = parse(FALLBACK, "I'll check.\n" + hermes_call("get_weather", '{"city": "Bern"}'))
    assert r.content == "I'll check." and calls(r) == [("get_weather", '{"city": "Bern"}')]


# --- streaming ----------------------------------------------------------------------------------------

TRANSCRIPTS = [
    (QWEN3, "<think>\nplan\n\nmore\n</think>\n\nOK.\n" + hermes_call("get_weather", '{"city": "Oslo"}') + "\n"
     + hermes_call("search", '{"q": "a<b"}') + "\nbye\n\n", False),
    (QWEN3, "<think>\nunfinished <tool_call> thought\n", False),
    (QWEN25, 'x <tool_call>\n{"name": "search", "arguments": {"q": 1}\n</tool_call> <tool_call> <tool_ca', False),
    (QWEN25, "<tool_cal" + hermes_call("nope", "{}") + "\n\n\ntext\n" + hermes_call("search", "{}"), False),
    (R1, "\n\nhmm\n\n</think>\n\n\nanswer", True),
    (LLAMA, '  {"name": "search", "parameters": {"q": ";"}}; <|python_tag|>{"name": "get_weather", "parameters": {}}', False),
    (LLAMA, 'text <|python_ta <|python_tag|>{"name": "search", "parameters": {"q": "}"}}', False),
    (MISTRAL, 'ok [TOOL_CALLS] [{"name": "search", "arguments": {"q": "]"}}]', False),
    (FALLBACK, "\n\n" + hermes_call("get_weather", "{}") + "\n", False),
    (MISTRAL_ARGS, 'a [TOOL_CALLS]search[ARGS]{"q": "[ARGS]"}\n[TOOL_CALLS]get_weather[ARGS]{}', False),
]


def streamed(fmt: ReplyFormat, text: str, cuts: list[int], in_thinking: bool):
    parser = ReplyParser(fmt, tools=TOOLS, in_thinking=in_thinking, new_id=ids())
    pieces = []
    bounds = sorted({c % (len(text) + 1) for c in cuts}) + [len(text)]
    start = 0
    for end in bounds:
        pieces += parser.feed(text[start:end])
        start = end
    pieces += parser.finish()
    return parser, pieces


def merged(pieces):
    out = []
    for p in pieces:
        if out and p.kind != PieceKind.TOOL_CALL and out[-1][0] == p.kind:
            out[-1] = (p.kind, out[-1][1] + p.text)
        else:
            out.append((p.kind, p.text if p.call is None else p.call))
    return out


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(range(len(TRANSCRIPTS))), st.lists(st.integers(min_value=0, max_value=10_000), max_size=40))
def test_streaming_gives_exactly_what_the_whole_text_gives(which, cuts):
    fmt, text, in_thinking = TRANSCRIPTS[which]
    whole = parse(fmt, text, in_thinking=in_thinking)
    parser, pieces = streamed(fmt, text, cuts, in_thinking)
    assert parser.content == whole.content
    assert parser.reasoning == whole.reasoning
    assert parser.tool_calls == list(whole.tool_calls)
    assert merged(pieces) == merged(whole.pieces)


def test_streaming_one_character_at_a_time_never_takes_text_back():
    fmt, text, _ = TRANSCRIPTS[0]
    whole = parse(fmt, text)
    parser = ReplyParser(fmt, tools=TOOLS, new_id=ids())
    shown = ""
    for ch in text:
        for piece in parser.feed(ch):
            if piece.kind == PieceKind.CONTENT:
                shown += piece.text
                assert whole.content.startswith(shown)  # what was shown is never taken back
            assert "<tool_call>" not in shown
    parser.finish()
    assert parser.content == whole.content == "OK.bye\n\n"


def test_a_partial_marker_is_held_back_until_decided():
    parser = ReplyParser(QWEN25, tools=TOOLS, new_id=ids())
    assert [p.text for p in parser.feed("Hello <tool_")] == ["Hello "]
    assert [p.text for p in parser.feed("x")] == ["<tool_x"]


def test_a_call_comes_whole_when_it_closes():
    parser = ReplyParser(QWEN25, tools=TOOLS, new_id=ids())
    text = hermes_call("search", '{"q": "a"}')
    assert parser.feed(text[:-3]) == []
    (piece,) = parser.feed(text[-3:])
    assert piece.kind == PieceKind.TOOL_CALL and piece.call.name == "search"
    assert parser.finish() == []


def test_feed_after_finish_is_refused():
    parser = ReplyParser(QWEN25)
    parser.finish()
    with pytest.raises(RuntimeError):
        parser.feed("x")


FRAGMENTS = ["<think>", "</think>", "\n", "\n\n", " ", "text", "<tool_call>", "</tool_call>", "<tool_", "</think",
             '{"name": "search", "arguments": {"q": "a"}}', '{"name": "get_weather", "parameters": {}}', '{"name": ',
             '"arguments": ', "{}", "}", "{", "[", "]", ",", ";", '"', "\\", "<|python_tag|>", "[TOOL_CALLS]",
             "[ARGS]", "[CALL_ID]", "search", "abc123XYZ", "é", "🙂",
             hermes_call("search", '{"q": "a"}'), '[TOOL_CALLS][{"name": "search", "arguments": {}}]',
             "[TOOL_CALLS]search[ARGS]{}"]
FORMATS = [QWEN3, QWEN25, LLAMA, MISTRAL, MISTRAL_ARGS, FALLBACK, R1]


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(range(len(FORMATS))), st.lists(st.sampled_from(FRAGMENTS), max_size=30),
       st.lists(st.integers(min_value=0, max_value=10_000), max_size=20), st.booleans(), st.booleans())
def test_streaming_equals_whole_on_any_text(which, fragments, cuts, in_thinking, parallel):
    fmt, text = FORMATS[which], "".join(fragments)
    whole = parse(fmt, text, in_thinking=in_thinking, parallel=parallel)
    parser = ReplyParser(fmt, tools=TOOLS, in_thinking=in_thinking, parallel=parallel, new_id=ids())
    pieces, start = [], 0
    for end in sorted({c % (len(text) + 1) for c in cuts}) + [len(text)]:
        pieces += parser.feed(text[start:end])
        start = end
    pieces += parser.finish()
    assert (parser.content, parser.reasoning, parser.tool_calls) == (whole.content, whole.reasoning, list(whole.tool_calls))
    assert merged(pieces) == merged(whole.pieces)
    assert len(whole.tool_calls) <= (MAX_CALLS if parallel else 1)
    for call in whole.tool_calls:  # whatever came out as a call is one: an offered tool, an object's text
        assert call.name in TOOLS and isinstance(json.loads(call.arguments), dict)


def test_without_calls_newlines_are_not_held_back():
    parser = ReplyParser(QWEN25, tools=False)
    assert [p.text for p in parser.feed("Line one\n")] == ["Line one\n"]
    parser = ReplyParser(QWEN25, tools=TOOLS)
    assert [p.text for p in parser.feed("Line one\n")] == ["Line one"]  # the newline may be a call's
    assert [p.text for p in parser.feed("two")] == ["\ntwo"]
