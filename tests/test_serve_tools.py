"""Tool calls and thinking in the server's stateless requests (Hearth.serve), engine side: forced calls valid by
construction, the reply split into thinking / text / calls as it streams, the re-read count after a thinking turn,
save points, stop sequences — on real ONNX Runtime, a tiny Qwen3 with Qwen3's real chat template, and SmolLM2
(whose template has no tools: the built-in fallback format)."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from engine.api import Hearth, resolve_paths
from engine.checkpoint.chain import open_saved
from engine.errors import PromptError
from engine.session.prompt_cache import PromptCache
from engine.types import (
    PieceKind,
    ResponseFormat,
    ResponseFormatKind,
    SamplingParams,
    ServeRequest,
    ToolChoice,
    ToolChoiceMode,
)

GREEDY = SamplingParams.greedy_params()
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                                    "unit": {"type": "string", "enum": ["C", "F"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
CLOCK = {"type": "function", "function": {
    "name": "get_time", "description": "The time now",
    "parameters": {"type": "object", "properties": {"zone": {"type": "integer", "minimum": -12, "maximum": 14}},
                   "required": ["zone"], "additionalProperties": False}}}
QUESTION = [{"role": "system", "content": "You help."}, {"role": "user", "content": "Weather in Oslo?"}]
FORCE_WEATHER = ToolChoice(ToolChoiceMode.FUNCTION, "get_weather")


def schema_of(tool: dict) -> dict:
    return tool["function"]["parameters"]


@pytest.fixture
def qwen(tmp_path, qwen3_chat_gguf, qwen3_chat_home, monkeypatch):
    monkeypatch.setattr(PromptCache, "save_block", 64)  # the save policy scaled to a tiny model's prompts
    home = tmp_path / "home"
    home.mkdir()
    (home / "converted").symlink_to(qwen3_chat_home)
    service = Hearth(resolve_paths(home).ensure(), model=str(qwen3_chat_gguf), provider="cpu")
    service.load()
    service._sessions.adaptive = False  # the tiny model re-reads faster than it restores: always restore
    yield service
    service.close()


def serve(hearth: Hearth, messages: list[dict], max_tokens: int = 48, pieces: list | None = None, **extra):
    request = ServeRequest(messages=tuple(messages), params=GREEDY, max_tokens=max_tokens, **extra)
    return hearth.serve(request, on_piece=pieces.append if pieces is not None else None)


# forced calls ----------------------------------------------------------------------------------------------
def test_a_forced_call_names_the_tool_and_its_arguments_validate_against_the_schema(qwen):
    result = serve(qwen, QUESTION, tools=(WEATHER, CLOCK), tool_choice=FORCE_WEATHER, max_tokens=120)
    assert result.finish_reason == "tool_calls"
    [call] = result.tool_calls
    assert call.name == "get_weather" and call.id.startswith("call_")
    jsonschema.validate(json.loads(call.arguments), schema_of(WEATHER))
    assert "<tool_call>" not in result.text and "get_weather" not in result.text


def test_required_calls_one_of_the_offered_tools(qwen):
    result = serve(qwen, QUESTION, tools=(WEATHER, CLOCK), tool_choice=ToolChoice(ToolChoiceMode.REQUIRED),
                   max_tokens=120, parallel_tool_calls=False)
    [call] = result.tool_calls
    tool = {"get_weather": WEATHER, "get_time": CLOCK}[call.name]
    jsonschema.validate(json.loads(call.arguments), schema_of(tool))


def test_the_streamed_pieces_add_up_to_the_result(qwen):
    pieces: list = []
    result = serve(qwen, QUESTION, pieces=pieces, tools=(WEATHER,), tool_choice=FORCE_WEATHER, max_tokens=120,
                   template_kwargs={"enable_thinking": True, "thinking_budget": 12})
    text = "".join(p.text for p in pieces if p.kind == PieceKind.CONTENT)
    thought = "".join(p.text for p in pieces if p.kind == PieceKind.REASONING)
    calls = [p.call for p in pieces if p.kind == PieceKind.TOOL_CALL]
    assert (text, thought, tuple(calls)) == (result.text, result.reasoning, result.tool_calls)
    assert result.reasoning.strip(), "the forced call's grammar opens a bounded thinking block on a thinking model"
    assert "<think>" not in result.text and "</think>" not in result.reasoning


def test_a_call_only_reply_is_the_same_again_with_the_same_request(qwen):
    first = serve(qwen, QUESTION, tools=(WEATHER,), tool_choice=FORCE_WEATHER, max_tokens=120)
    again = serve(qwen, QUESTION, tools=(WEATHER,), tool_choice=FORCE_WEATHER, max_tokens=120)
    assert [(c.name, c.arguments) for c in first.tool_calls] == [(c.name, c.arguments) for c in again.tool_calls]
    assert again.cache.reused_tokens >= first.prompt_tokens - 1


# thinking and what the next request re-reads ---------------------------------------------------------------
def test_after_a_thinking_turn_the_next_request_rereads_only_the_visible_reply_and_what_is_new(qwen):
    request = {"tools": (WEATHER,), "tool_choice": FORCE_WEATHER, "max_tokens": 120,
               "template_kwargs": {"enable_thinking": True, "thinking_budget": 16}}
    first = serve(qwen, QUESTION, **request)
    assert first.reasoning and first.tool_calls
    [call] = first.tool_calls
    follow = [*QUESTION,
              {"role": "assistant", "content": "", "tool_calls": [
                  {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}]},
              {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 21 C"}]
    second = serve(qwen, follow, max_tokens=4, tools=(WEATHER,), tool_choice=ToolChoice(ToolChoiceMode.NONE))
    new_text = qwen.render_prompt(follow, tools=(WEATHER,))[len(qwen.render_prompt(QUESTION, tools=(WEATHER,))):]
    assert second.cache.reused_tokens >= first.prompt_tokens - 1  # the thinking's rows were cut, the prompt's kept
    # what is re-read is the call as history renders it, the tool result and the generation prompt: no thinking
    assert second.cache.prefilled_tokens <= qwen.count_tokens(new_text) + 2
    assert second.cache.prefilled_tokens < qwen.count_tokens(new_text) + qwen.count_tokens(first.reasoning)


def test_a_template_that_opens_thinking_in_its_prompt_gives_reasoning_not_text(tmp_path, tiny_dir):
    import dataclasses

    from engine.model.convert import ensure_converted
    from engine.model.synthetic import write_synthetic_gguf
    from tests.chat_models import TEMPLATES, qwen3_chat_spec

    spec = dataclasses.replace(qwen3_chat_spec(), seed=21,
                               chat_template=(TEMPLATES / "deepseek-r1-distill-qwen.jinja").read_text(encoding="utf-8"))
    gguf = write_synthetic_gguf(tmp_path / "r1.gguf", spec)
    ensure_converted(gguf, "int4", tmp_path / "home" / "converted")
    hearth = Hearth(resolve_paths(tmp_path / "home").ensure(), model=str(gguf), provider="cpu")
    hearth.load()
    try:
        prompt = hearth.render_prompt(QUESTION)
        assert prompt.rstrip().endswith("<think>")
        result = serve(hearth, QUESTION, max_tokens=10)
        assert result.reasoning and result.text == ""  # never closed: all of it was thinking
    finally:
        hearth.close()


# save points (Anthropic's cache_control) -------------------------------------------------------------------
def _frontiers(hearth: Hearth) -> set[int]:
    root = hearth.checkpoints.root
    found = set()
    for entry in hearth.checkpoints.entries(kind="api"):
        with open_saved(Path(root / entry.name)) as reader:
            reader.read_header()
            records, problem = reader.scan()
        assert problem is None
        found |= {r.end for r in records}
    return found


def test_a_save_point_is_kept_as_a_record_even_for_a_short_prompt(qwen):
    system = [{"role": "system", "content": "Rules: answer in one word."}]
    messages = [*system, {"role": "user", "content": "Hi?"}]
    result = serve(qwen, messages, max_tokens=3, save_points=(1,))
    prompt = qwen.render_prompt(messages)
    # the system turn's end, and the next turn's opening every request with this system prompt has too
    upto = qwen.count_tokens(prompt[: prompt.index("<|im_start|>user")])
    opening = qwen.count_tokens(prompt[: prompt.index("Hi?")])
    assert result.prompt_tokens < PromptCache.save_block  # the policy alone would not have saved it
    assert any(upto <= end <= opening for end in _frontiers(qwen))
    assert result.cache.saved_tokens == result.prompt_tokens


# the prompt, stop sequences, refusals ----------------------------------------------------------------------
def test_render_prompt_is_what_a_request_reads(qwen):
    text = qwen.render_prompt(QUESTION, tools=(WEATHER,), template_kwargs={"enable_thinking": False})
    assert "<tools>" in text and '"name": "get_weather"' in text
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    result = serve(qwen, QUESTION, max_tokens=2, tools=(WEATHER,), template_kwargs={"enable_thinking": False})
    assert result.prompt_tokens == qwen.count_tokens(text)


def test_the_stop_string_that_ended_a_reply_is_reported(qwen):
    free = serve(qwen, QUESTION, max_tokens=12)
    stop = free.text[4:6]
    assert stop
    cut = serve(qwen, QUESTION, max_tokens=12, stop=(stop, "never-seen"))
    assert cut.finish_reason == "stop" and cut.stop_sequence == stop and cut.text == free.text[: free.text.index(stop)]


@pytest.mark.parametrize("extra, words", [
    ({"tools": (WEATHER,), "tool_choice": ToolChoice(ToolChoiceMode.FUNCTION, "no_such_tool")}, "no_such_tool"),
    ({"tool_choice": ToolChoice(ToolChoiceMode.REQUIRED)}, "tool"),
    ({"tools": ({"type": "function", "function": {"name": "bad name!"}},)}, "name"),
    ({"tools": (WEATHER,), "tool_choice": FORCE_WEATHER,
      "response_format": ResponseFormat(ResponseFormatKind.JSON_OBJECT)}, "response_format"),
    ({"tools": (WEATHER,), "tool_choice": FORCE_WEATHER, "template_kwargs": {"thinking_budget": 0}}, "thinking_budget"),
    ({"template_kwargs": {"messages": []}}, "messages"),
    ({"template_kwargs": {"bad-name": 1}}, "name"),
])
def test_bad_tool_options_are_refused_before_any_model_work(qwen, extra, words):
    with pytest.raises(PromptError, match=words):
        serve(qwen, QUESTION, **extra)


def test_a_tool_call_in_history_must_name_a_function(qwen):
    bad = [*QUESTION, {"role": "assistant", "content": "", "tool_calls": [{"id": "x", "function": {}}]},
           {"role": "user", "content": "and?"}]
    with pytest.raises(PromptError, match="function with a name"):
        serve(qwen, bad)


# the default model: its template has no tools, so the fallback format --------------------------------------
def test_the_default_model_makes_a_forced_call_in_the_fallback_format(real_model_home):
    hearth = Hearth(resolve_paths(real_model_home).ensure(), weights="int4", provider="cpu")
    hearth.load()
    try:
        text = hearth.render_prompt(QUESTION, tools=(WEATHER, CLOCK))
        assert "get_weather" in text and "<tool_call>" in text  # the fallback section describes tools and format
        result = serve(hearth, QUESTION, tools=(WEATHER, CLOCK), tool_choice=FORCE_WEATHER, max_tokens=60)
        [call] = result.tool_calls
        jsonschema.validate(json.loads(call.arguments), schema_of(WEATHER))
        # an open schema (no additionalProperties) is closed by the grammar: SmolLM2 wrote extra keys until
        # max_tokens under the open one
        open_weather = json.loads(json.dumps(WEATHER))
        del open_weather["function"]["parameters"]["additionalProperties"]
        closed = serve(hearth, QUESTION, tools=(open_weather,), tool_choice=FORCE_WEATHER, max_tokens=60,
                       parallel_tool_calls=False)
        assert closed.finish_reason == "tool_calls"
        assert set(json.loads(closed.tool_calls[0].arguments)) <= {"city", "unit"}
        plain = serve(hearth, QUESTION, tools=(WEATHER, CLOCK), max_tokens=24)  # auto: the model answers in words
        assert plain.finish_reason in ("stop", "length") and not plain.tool_calls and plain.text
    finally:
        hearth.close()


def test_a_marker_held_as_a_control_token_reaches_the_parser(tiny_engine):
    from engine.text.stream import StreamDecoder

    tokenizer = tiny_engine.tokenizer
    marker = tokenizer.token_id("<|im_start|>")  # a control token, as Llama 3.1's <|python_tag|> is
    assert tokenizer.is_special(marker)
    assert StreamDecoder(tokenizer).push(marker) == ""  # hidden, as every control token is in a reply
    assert StreamDecoder(tokenizer, frozenset({marker})).push(marker) == "<|im_start|>"


def test_a_thinking_budget_bounds_the_thinking_of_a_plain_reply(qwen):
    from engine.text.tool_grammar import CHARS_PER_TOKEN

    pieces: list = []
    result = serve(qwen, QUESTION, max_tokens=90, pieces=pieces,
                   template_kwargs={"enable_thinking": True, "thinking_budget": 8})
    assert result.reasoning and len(result.reasoning) <= 8 * CHARS_PER_TOKEN
    assert result.text and not result.tool_calls  # after the closed block, any text
    assert "".join(p.text for p in pieces if p.kind == PieceKind.REASONING) == result.reasoning


def test_a_tool_result_must_name_its_call(qwen):
    lost = [*QUESTION, {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]},
        {"role": "tool", "content": "Sunny"}]
    with pytest.raises(PromptError, match="tool_call_id"):
        serve(qwen, lost, tools=(WEATHER,))
    with pytest.raises(PromptError, match="tool_call_id"):
        qwen.render_prompt(lost, tools=(WEATHER,))
