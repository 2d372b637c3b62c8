"""The tool-call grammar, driven token by token with the real default model's tokenizer through
engine.text.constrained.Constraint (llguidance's matcher): valid calls are accepted, invalid ones refused,
and what the grammar lets a random walk write parses with parse_reply and validates with jsonschema."""

from __future__ import annotations

import json
import random
from pathlib import Path

import jsonschema
import pytest

from engine.errors import PromptError
from engine.text.constrained import Constraint, ConstraintError
from engine.text.reply_format import ReplyFormat, reply_format_for
from engine.text.reply_parse import parse_reply
from engine.text.tool_grammar import CHARS_PER_TOKEN, tool_grammar
from engine.types import ToolChoice, ToolChoiceMode

pytestmark = pytest.mark.real_model

TEMPLATES = Path(__file__).parent / "templates"
QWEN3 = reply_format_for((TEMPLATES / "qwen3.jinja").read_text())
QWEN25 = reply_format_for((TEMPLATES / "qwen2.5.jinja").read_text())
LLAMA = reply_format_for((TEMPLATES / "llama3.2.jinja").read_text())
MISTRAL = reply_format_for((TEMPLATES / "mistral-nemo.jinja").read_text())
MISTRAL_ARGS = reply_format_for((TEMPLATES / "mistral-small-3.2.jinja").read_text())
FALLBACK = reply_format_for((TEMPLATES / "gemma3.jinja").read_text())
REQUIRED = ToolChoice(ToolChoiceMode.REQUIRED)

SCHEMAS = {
    "nested": {"type": "object", "additionalProperties": False, "required": ["user"], "properties": {
        "user": {"type": "object", "additionalProperties": False, "required": ["name", "address"], "properties": {
            "name": {"type": "string", "maxLength": 8},
            "address": {"type": "object", "additionalProperties": False, "required": ["zip"],
                        "properties": {"zip": {"type": "string", "pattern": "^[0-9]{5}$"}}}}}}},
    "enum": {"type": "object", "additionalProperties": False, "required": ["unit"],
             "properties": {"unit": {"enum": ["celsius", "fahrenheit"]}}},
    "array": {"type": "object", "additionalProperties": False, "required": ["tags"], "properties": {
        "tags": {"type": "array", "minItems": 1, "maxItems": 3, "items": {"type": "string", "maxLength": 6}}}},
    "bounded numbers": {"type": "object", "additionalProperties": False, "required": ["count", "ratio"], "properties": {
        "count": {"type": "integer", "minimum": 1, "maximum": 10},
        "ratio": {"type": "number", "minimum": 0, "maximum": 1}}},
    "required and optional": {"type": "object", "additionalProperties": False, "required": ["city"], "properties": {
        "city": {"type": "string", "maxLength": 10}, "days": {"type": "integer", "minimum": 1, "maximum": 7},
        "metric": {"type": "boolean"}}},
}
VALID = {
    "nested": {"user": {"name": "Ann", "address": {"zip": "12345"}}},
    "enum": {"unit": "celsius"},
    "array": {"tags": ["a", "b"]},
    "bounded numbers": {"count": 3, "ratio": 0.5},
    "required and optional": {"city": "Oslo", "metric": True},
}
INVALID = {
    "nested": {"user": {"name": "Ann", "address": {"zip": "1234"}}},
    "enum": {"unit": "kelvin"},
    "array": {"tags": []},
    "bounded numbers": {"count": 11, "ratio": 0.5},
    "required and optional": {"days": 3},
}


def tool(name: str, schema: dict) -> dict:
    return {"type": "function", "function": {"name": name, "description": f"the {name} tool", "parameters": schema}}


TOOLS = [tool(name.replace(" ", "_"), schema) for name, schema in SCHEMAS.items()]


@pytest.fixture(scope="module")
def tokenizer(real_home):
    from engine.model.fetch import default_model, fetch_model
    from engine.model.gguf_file import GGUFModel
    from engine.text.tokenizer import Tokenizer

    return Tokenizer.from_gguf(GGUFModel(fetch_model(default_model(), real_home / "models")))


def accepts(tokenizer, grammar: str, text: str) -> bool:
    """The grammar's parser takes exactly ``text`` (as the tokenizer spells it) and may end there.

    The parser's verdict, not the mask's: llguidance's mask may leave out one spelling of a valid text
    (here `"}` where the text continues `},`) while allowing another, which is all a model needs."""
    constraint = Constraint(tokenizer, grammar, tokenizer.specials.stop)
    for token in tokenizer.encode(text):
        try:
            constraint.advance(token)
        except RuntimeError:
            return False
    return constraint.accepting


def walk(tokenizer, grammar: str, seed: int, steps: int = 600) -> str:
    """What a model choosing at random among the allowed tokens writes (ending as soon as it may)."""
    rng = random.Random(seed)
    constraint = Constraint(tokenizer, grammar, tokenizer.specials.stop)
    ids: list[int] = []
    for _ in range(steps):
        if constraint.accepting or constraint.done:
            return tokenizer.decode(ids)
        allowed = [int(i) for i in constraint.allowed().nonzero()[0]]
        token = rng.choice(allowed)
        constraint.advance(token)
        ids.append(token)
    raise AssertionError(f"the walk did not end in {steps} tokens: {tokenizer.decode(ids)[:200]!r}")


def _structure(text: str) -> str:
    """``text`` with its JSON strings taken out: the separators and brackets that are left."""
    out, in_string, escaped = [], False, False
    for c in text:
        if in_string:
            in_string = escaped or c != '"'
            escaped = not escaped and c == "\\"
        elif c == '"':
            in_string = True
        else:
            out.append(c)
    return "".join(out)


def hermes(name: str, args: dict) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(args)}}}\n</tool_call>'


@pytest.mark.parametrize("schema", list(SCHEMAS))
def test_each_schema_accepts_a_valid_call_and_refuses_an_invalid_one(tokenizer, schema):
    name = schema.replace(" ", "_")
    grammar = tool_grammar(QWEN25, TOOLS, ToolChoice(ToolChoiceMode.FUNCTION, name), True, think=False)
    jsonschema.validate(VALID[schema], SCHEMAS[schema])
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(INVALID[schema], SCHEMAS[schema])
    assert accepts(tokenizer, grammar, hermes(name, VALID[schema]))
    assert not accepts(tokenizer, grammar, hermes(name, INVALID[schema]))
    # json.dumps's spacing only: the same call written compactly is refused
    compact = f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(VALID[schema], separators=(",", ":"))}}}\n</tool_call>'
    if compact != hermes(name, VALID[schema]):
        assert not accepts(tokenizer, grammar, compact)


@pytest.mark.parametrize("schema", list(SCHEMAS))
def test_what_the_grammar_writes_parses_and_validates(tokenizer, schema):
    name = schema.replace(" ", "_")
    grammar = tool_grammar(QWEN25, TOOLS, ToolChoice(ToolChoiceMode.FUNCTION, name), False, think=False)
    for seed in range(3):
        text = walk(tokenizer, grammar, seed)
        reply = parse_reply(QWEN25, text, tools=TOOLS)
        assert [c.name for c in reply.tool_calls] == [name], text
        args = json.loads(reply.tool_calls[0].arguments)
        jsonschema.validate(args, SCHEMAS[schema])
        if schema != "bounded numbers":  # a number may be spelled "1.00"; the spacing is json.dumps's still
            assert reply.tool_calls[0].arguments == json.dumps(args, ensure_ascii=False)  # tojson's bytes
        bare = _structure(reply.tool_calls[0].arguments)
        assert bare.count(", ") == bare.count(",") and bare.count(": ") == bare.count(":")
        assert not any(c.isspace() for c in bare.replace(", ", ",").replace(": ", ":"))
        assert reply.content == ""


def test_a_named_function_refuses_a_call_of_another_tool(tokenizer):
    grammar = tool_grammar(QWEN25, TOOLS, ToolChoice(ToolChoiceMode.FUNCTION, "enum"), True, think=False)
    assert accepts(tokenizer, grammar, hermes("enum", VALID["enum"]))
    assert not accepts(tokenizer, grammar, hermes("array", VALID["array"]))


def test_required_takes_any_tool_and_parallel_takes_several(tokenizer):
    one = tool_grammar(QWEN25, TOOLS, REQUIRED, False, think=False)
    many = tool_grammar(QWEN25, TOOLS, REQUIRED, True, think=False)
    two = hermes("enum", VALID["enum"]) + "\n" + hermes("array", VALID["array"])
    assert accepts(tokenizer, one, hermes("array", VALID["array"]))
    assert not accepts(tokenizer, one, two)
    assert accepts(tokenizer, many, two)
    assert not accepts(tokenizer, many, "Sure! " + hermes("enum", VALID["enum"]))  # no text: a call is required
    assert not accepts(tokenizer, many, "")


@pytest.mark.parametrize("fmt, text", [
    (LLAMA, '{"name": "enum", "parameters": {"unit": "celsius"}}'),
    (LLAMA, '{"name": "enum", "parameters": {"unit": "celsius"}}; {"name": "array", "parameters": {"tags": ["x"]}}'),
    (MISTRAL, '[TOOL_CALLS][{"name": "enum", "arguments": {"unit": "celsius"}}, {"name": "array", "arguments": {"tags": ["x"]}}]'),
    (MISTRAL_ARGS, '[TOOL_CALLS]enum[ARGS]{"unit": "celsius"}[TOOL_CALLS]array[ARGS]{"tags": ["x"]}'),
    (FALLBACK, hermes("enum", {"unit": "celsius"})),
])
def test_each_style_writes_its_own_format_and_parses_back(tokenizer, fmt: ReplyFormat, text: str):
    grammar = tool_grammar(fmt, TOOLS, REQUIRED, True, think=False)
    assert accepts(tokenizer, grammar, text)
    reply = parse_reply(fmt, text, tools=TOOLS)
    assert reply.tool_calls and reply.content == ""
    assert not accepts(tokenizer, grammar, text.replace("celsius", "kelvin"))


def test_thinking_is_optional_before_the_call(tokenizer):
    grammar = tool_grammar(QWEN3, TOOLS, REQUIRED, False, think=False)
    call = hermes("enum", VALID["enum"])
    assert accepts(tokenizer, grammar, call)
    thought = "<think>\nThe user wants a unit.\n</think>\n\n" + call
    assert accepts(tokenizer, grammar, thought)
    reply = parse_reply(QWEN3, thought, tools=TOOLS)
    assert reply.reasoning == "The user wants a unit." and reply.tool_calls[0].name == "enum"


def test_an_open_thinking_block_leads_and_its_budget_forces_the_close(tokenizer):
    grammar = tool_grammar(QWEN3, TOOLS, ToolChoice(ToolChoiceMode.FUNCTION, "enum"), False, think=True, think_budget=8)
    assert accepts(tokenizer, grammar, "short\n</think>\n\n" + hermes("enum", VALID["enum"]))
    assert not accepts(tokenizer, grammar, hermes("enum", VALID["enum"]))  # the reply starts inside thinking
    long_thought = " ".join(["word"] * 40)
    assert not accepts(tokenizer, grammar, long_thought + "\n</think>\n\n" + hermes("enum", VALID["enum"]))
    text = walk(tokenizer, grammar, seed=1)
    reply = parse_reply(QWEN3, text, tools=TOOLS, in_thinking=True)
    assert [c.name for c in reply.tool_calls] == ["enum"], text
    assert len(text.split("</think>")[0]) <= 8 * CHARS_PER_TOKEN


def test_auto_and_none_are_unconstrained():
    assert tool_grammar(QWEN25, TOOLS, ToolChoice(), True, think=False) is None
    assert tool_grammar(QWEN25, TOOLS, ToolChoice(ToolChoiceMode.NONE), True, think=False) is None


@pytest.mark.parametrize("tools, choice, message", [
    ([], REQUIRED, "offers no tools"),
    (TOOLS, ToolChoice(ToolChoiceMode.FUNCTION, "missing"), "not among the tools"),
    ([{"type": "function", "function": {"name": "bad name"}}], REQUIRED, "letters, digits"),
])
def test_bad_tools_or_choice_are_prompt_errors(tools, choice, message):
    with pytest.raises(PromptError, match=message):
        tool_grammar(QWEN25, tools, choice, True, think=False)


def test_a_bad_budget_is_refused():
    with pytest.raises(PromptError, match="thinking budget"):
        tool_grammar(QWEN3, TOOLS, REQUIRED, True, think=True, think_budget=0)


def test_a_schema_llguidance_cannot_compile_is_a_constraint_error():
    bad = [tool("weird", {"type": "object", "properties": {"a": {"type": "no-such-type"}}})]
    with pytest.raises(ConstraintError, match="cannot be used"):
        tool_grammar(QWEN25, bad, REQUIRED, True, think=False)


def test_an_object_that_does_not_say_is_closed_to_extra_keys(tokenizer):
    open_schema = {"type": "object", "properties": {"city": {"type": "string"},
                                                    "where": {"type": "object", "properties": {"x": {"type": "integer"}}}},
                   "required": ["city"]}
    grammar = tool_grammar(ReplyFormat(), [tool("find", open_schema)], ToolChoice(ToolChoiceMode.REQUIRED), False,
                           think=False)
    assert accepts(tokenizer, grammar, hermes("find", {"city": "Oslo", "where": {"x": 1}}))
    assert not accepts(tokenizer, grammar, hermes("find", {"city": "Oslo", "extra": 1}))
    assert not accepts(tokenizer, grammar, hermes("find", {"city": "Oslo", "where": {"x": 1, "y": 2}}))
    said = dict(open_schema, additionalProperties={"type": "integer"})  # a schema that says is kept as it says
    grammar = tool_grammar(ReplyFormat(), [tool("find", said)], ToolChoice(ToolChoiceMode.REQUIRED), False, think=False)
    assert accepts(tokenizer, grammar, hermes("find", {"city": "Oslo", "extra": 1}))
