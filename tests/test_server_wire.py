"""The server's wire translation as pure functions: OpenAI and Anthropic requests into ``ServeRequest``
(messages, tools, tool_choice, template variables, save points) and results back into each API's JSON
and stream events. No model: the HTTP tests (test_server_tools.py, test_server_anthropic.py) run them live."""

from __future__ import annotations

import json

import pytest

from engine.server.anthropic_requests import anthropic_id, engine_id, messages_request, prompt_parts
from engine.server.anthropic_schemas import CountTokensRequest, MessagesRequest
from engine.server.anthropic_wire import EventMaker, message, stop_reason, usage
from engine.server.backend import Served
from engine.server.errors import ApiError, anthropic_path, shaped
from engine.server.requests import chat_request
from engine.server.schemas import ChatRequest
from engine.server.wire import ChunkMaker, chat_completion
from engine.types import (
    CacheReport,
    PieceKind,
    ReplyPiece,
    ResumeSource,
    ServeResult,
    ToolCall,
    ToolChoiceMode,
)

TOOL = {"type": "function", "function": {"name": "get_weather", "description": "the weather",
                                         "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
HEX = "0123456789abcdef01234567"


def chat(**body) -> ChatRequest:
    return ChatRequest.model_validate({"messages": [{"role": "user", "content": "hi"}], **body})


def anthropic(**body) -> MessagesRequest:
    return MessagesRequest.model_validate({"max_tokens": 64, "messages": [{"role": "user", "content": "hi"}], **body})


def bad_param(make, *args) -> str | None:
    with pytest.raises(ApiError) as caught:
        make(*args)
    assert caught.value.status == 400 and caught.value.message
    return caught.value.param


def result(**fields) -> ServeResult:
    cache = fields.pop("cache", CacheReport(ResumeSource.COLD, prefilled_tokens=10))
    base = {"text": "", "tokens": (1, 2, 3), "finish_reason": "stop", "prompt_tokens": 10, "cache": cache}
    return ServeResult(**{**base, **fields})


# OpenAI requests --------------------------------------------------------------------------------------------
def test_openai_tools_choice_and_history_reach_the_serve_request():
    body = chat(messages=[{"role": "user", "content": "weather?"},
                          {"role": "assistant", "content": None, "tool_calls": [CALL], "reasoning_content": "think"},
                          {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "sunny"}],
                tools=[TOOL], tool_choice={"type": "function", "function": {"name": "get_weather"}},
                parallel_tool_calls=False, chat_template_kwargs={"enable_thinking": False}, reasoning_effort="low")
    r = chat_request(body, None).request
    assert r.messages[1] == {"role": "assistant", "content": "", "tool_calls": [CALL], "reasoning_content": "think"}
    assert r.messages[2] == {"role": "tool", "content": "sunny", "tool_call_id": "call_1", "name": "get_weather"}
    assert r.tools == (TOOL,) and r.tool_choice.mode == ToolChoiceMode.FUNCTION and r.tool_choice.name == "get_weather"
    assert r.parallel_tool_calls is False
    assert r.template_kwargs == {"enable_thinking": False, "reasoning_effort": "low"}


@pytest.mark.parametrize("choice, mode", [(None, ToolChoiceMode.AUTO), ("auto", ToolChoiceMode.AUTO),
                                          ("none", ToolChoiceMode.NONE), ("required", ToolChoiceMode.REQUIRED)])
def test_openai_tool_choice_modes(choice, mode):
    assert chat_request(chat(tools=[TOOL], tool_choice=choice), None).request.tool_choice.mode == mode


def test_a_model_is_optional_and_arguments_given_as_an_object_or_empty_are_json_text():
    planned = chat_request(chat(messages=[
        {"role": "user", "content": "x"},
        {"role": "assistant", "tool_calls": [{"id": "a", "function": {"name": "f", "arguments": ""}},
                                             {"id": "b", "function": {"name": "f", "arguments": {"x": "é"}}}]},
        {"role": "tool", "tool_call_id": "a", "content": "r"}]), None)
    assert planned.model is None
    calls = planned.request.messages[1]["tool_calls"]
    assert [c["function"]["arguments"] for c in calls] == ["{}", '{"x": "é"}']


@pytest.mark.parametrize("body, param", [
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages.0.tool_call_id"),
    ({"messages": [{"role": "user", "content": "x"}, {"role": "tool", "tool_call_id": "nope", "content": "r"}]},
     "messages.1.tool_call_id"),
    ({"messages": [{"role": "user", "content": "x", "tool_calls": [CALL]}]}, "messages.0.tool_calls"),
    ({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [
        {**CALL, "function": {"name": "get_weather", "arguments": "{broken"}}]}]}, "messages.1.tool_calls.0.function.arguments"),
    ({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [
        {**CALL, "function": {"name": "get_weather", "arguments": "[1]"}}]}]}, "messages.1.tool_calls.0.function.arguments"),
    ({"tools": [TOOL, TOOL]}, "tools.1"),
    ({"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "other"}}}, "tool_choice.function.name"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}]},
     "tools.0.function.parameters"),
    ({"tools": [TOOL], "tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format"),
    ({"chat_template_kwargs": {"not a name": 1}}, "chat_template_kwargs.not a name"),
    ({"chat_template_kwargs": {"big": "x" * 20_000}}, "chat_template_kwargs"),
])
def test_openai_bad_tool_requests_are_400_naming_the_field(body, param):
    assert bad_param(chat_request, chat(**body), None) == param


@pytest.mark.parametrize("body", [{"messages": [{"role": "user", "content": "x"}] * 10_001},
                                  {"messages": [{"role": "user", "content": [{"type": "text", "text": "x"}] * 1001}]},
                                  {"tools": [TOOL] * 129}])
def test_counts_are_capped(body):
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        chat(**body)
    with pytest.raises(ValidationError):
        anthropic(messages=body["messages"]) if "messages" in body else anthropic(tools=[
            {"name": "f", "input_schema": {"type": "object"}}] * 129)


def test_prompt_lookup_reaches_the_sampling_params_greedy_or_not():
    assert chat_request(chat(), None).request.params.prompt_lookup == 0
    assert chat_request(chat(prompt_lookup=4), None).request.params.prompt_lookup == 4
    assert chat_request(chat(prompt_lookup=4, temperature=0), None).request.params.prompt_lookup == 4


# OpenAI results ---------------------------------------------------------------------------------------------
def test_a_reply_that_only_calls_has_null_content_and_finish_reason_tool_calls():
    calls = (ToolCall("call_1", "get_weather", '{"city": "Oslo"}', 0),)
    body = chat_completion(Served(result(tool_calls=calls, finish_reason="tool_calls", reasoning="hm"), "m"), "id", 0)
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None and choice["message"]["reasoning_content"] == "hm"
    assert choice["message"]["tool_calls"] == [CALL]
    plain = chat_completion(Served(result(text="hello"), "m"), "id", 0)["choices"][0]["message"]
    assert plain["content"] == "hello" and "tool_calls" not in plain and "reasoning_content" not in plain


def test_the_hearth_object_reports_drafted_and_accepted_tokens():
    from engine.types import Timings

    body = chat_completion(Served(result(timings=Timings(drafted_tokens=12, accepted_tokens=7)), "m"), "id", 0)
    assert body["hearth"]["drafted_tokens"] == 12 and body["hearth"]["accepted_tokens"] == 7


def test_stream_chunks_carry_reasoning_content_and_tool_calls_by_index():
    maker = ChunkMaker(True, "id", "m", 0)
    deltas = [c["choices"][0]["delta"] for p in (
        ReplyPiece(PieceKind.REASONING, "think"), ReplyPiece(PieceKind.CONTENT, "text"),
        ReplyPiece(PieceKind.TOOL_CALL, call=ToolCall("call_9", "f", '{"a": 1}', 1))) for c in maker.piece(p)]
    assert deltas == [{"reasoning_content": "think"}, {"content": "text"},
                      {"tool_calls": [{"index": 1, "id": "call_9", "type": "function",
                                       "function": {"name": "f", "arguments": ""}}]},
                      {"tool_calls": [{"index": 1, "function": {"arguments": '{"a": 1}'}}]}]
    assert maker.piece(ReplyPiece(PieceKind.CONTENT, "")) == []


# Anthropic requests -----------------------------------------------------------------------------------------
def test_anthropic_blocks_become_openai_shaped_messages_with_save_points():
    body = anthropic(
        system=[{"type": "text", "text": "rules"}, {"type": "text", "text": "more", "cache_control": {"type": "ephemeral"}}],
        tools=[{"name": "get_weather", "description": "the weather", "input_schema": TOOL["function"]["parameters"]}],
        tool_choice={"type": "any", "disable_parallel_tool_use": True}, stop_sequences=["END", ""],
        thinking={"type": "enabled", "budget_tokens": 1024}, max_tokens=2048, temperature=0, top_k=5,
        messages=[{"role": "user", "content": [{"type": "text", "text": "weather?"}]},
                  {"role": "assistant", "content": [
                      {"type": "thinking", "thinking": "hm", "signature": "sig"}, {"type": "redacted_thinking", "data": "x"},
                      {"type": "text", "text": "let me look"},
                      {"type": "tool_use", "id": f"toolu_{HEX}", "name": "get_weather", "input": {"city": "Oslo"}}]},
                  {"role": "user", "content": [
                      {"type": "tool_result", "tool_use_id": f"toolu_{HEX}", "is_error": True,
                       "content": [{"type": "text", "text": "timeout"}], "cache_control": {"type": "ephemeral"}},
                      {"type": "text", "text": "try again"}]}])
    r = messages_request(body, None).request
    assert r.messages == (
        {"role": "system", "content": "rules\n\nmore"},
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "let me look", "reasoning_content": "hm", "tool_calls": [
            {"id": f"call_{HEX}", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "tool_call_id": f"call_{HEX}", "content": "Error: timeout"},
        {"role": "user", "content": "try again"})
    assert r.save_points == (1, 5)
    assert r.tools == (TOOL,) and r.tool_choice.mode == ToolChoiceMode.REQUIRED and not r.parallel_tool_calls
    assert r.template_kwargs == {"enable_thinking": True, "thinking_budget": 1024}
    assert r.stop == ("END",) and r.params.greedy and r.max_tokens == 2048


def test_output_config_and_a_top_level_breakpoint():
    r = messages_request(anthropic(output_config={"effort": "max", "format": {"type": "json_schema", "schema": {
        "type": "object"}}}, cache_control={"type": "ephemeral"}), None).request
    assert r.response_format.schema == {"type": "object"} and r.template_kwargs == {"reasoning_effort": "high"}
    assert r.save_points == (1,)


def test_ids_map_between_the_apis():
    assert anthropic_id(f"call_{HEX}") == f"toolu_{HEX}" and engine_id(f"toolu_{HEX}") == f"call_{HEX}"
    assert engine_id("toolu_theirs") == "toolu_theirs" and anthropic_id("other") == "other"


@pytest.mark.parametrize("thinking, kwargs", [({"type": "disabled"}, {"enable_thinking": False}),
                                              ({"type": "adaptive"}, {"enable_thinking": True}), (None, {})])
def test_anthropic_thinking_reaches_the_template(thinking, kwargs):
    assert messages_request(anthropic(thinking=thinking), None).request.template_kwargs == kwargs


def test_count_tokens_needs_no_max_tokens():
    parts = prompt_parts(CountTokensRequest.model_validate({"messages": [{"role": "user", "content": "hi"}],
                                                           "system": "s"}))
    assert parts[0] == ({"role": "system", "content": "s"}, {"role": "user", "content": "hi"})


TOOL_A = {"name": "get_weather", "input_schema": {"type": "object"}}


@pytest.mark.parametrize("body, param", [
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "base64"}}]}]},
     "messages.0.content.0"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "x", "content": [
        {"type": "image", "source": {}}]}]}]}, "messages.0.content.0.content.0"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": {}}]}]},
     "messages.0.content.0.type"),
    ({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": [
        {"type": "tool_result", "tool_use_id": "a"}]}, {"role": "user", "content": "x"}]}, "messages.1.content.0.type"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "nope", "content": "r"}]}]},
     "messages"),
    ({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "prefill"}]}, "messages.1.role"),
    ({"messages": [{"role": "user", "content": []}]}, "messages.0.content"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools.0.type"),
    ({"tools": [{"name": "f"}]}, "tools.0.input_schema"),
    ({"tools": [{"name": "f", "input_schema": {"type": "string"}}]}, "tools.0.input_schema"),
    ({"tools": [TOOL_A, TOOL_A]}, "tools.1"),
    ({"tool_choice": {"type": "any"}}, "tool_choice"),
    ({"tools": [TOOL_A], "tool_choice": {"type": "tool"}}, "tool_choice.name"),
    ({"tools": [TOOL_A], "tool_choice": {"type": "tool", "name": "other"}}, "tool_choice.name"),
    ({"thinking": {"type": "enabled"}}, "thinking.budget_tokens"),
    ({"thinking": {"type": "enabled", "budget_tokens": 1024}, "max_tokens": 1024}, "thinking.budget_tokens"),
    ({"system": [{"type": "text", "text": "s", "cache_control": {"type": "ephemeral"}}] * 4,
      "cache_control": {"type": "ephemeral"}}, "messages"),
    ({"tools": [TOOL_A], "tool_choice": {"type": "any"}, "output_config": {"format": {
        "type": "json_schema", "schema": {"type": "object"}}}}, "output_config.format"),
])
def test_anthropic_bad_requests_are_400_naming_the_field(body, param):
    assert bad_param(messages_request, anthropic(**body), None) == param


# Anthropic results ------------------------------------------------------------------------------------------
def test_the_message_has_thinking_text_and_tool_use_blocks_and_usage_adds_up():
    cache = CacheReport(ResumeSource.DISK, reused_tokens=60, prefilled_tokens=40, saved_tokens=30)
    r = result(text="ok", reasoning="hm", finish_reason="tool_calls", prompt_tokens=100, cache=cache,
               tool_calls=(ToolCall(f"call_{HEX}", "get_weather", '{"city": "Oslo"}'),))
    body = message(Served(r, "m"), "msg_1")
    assert body["content"] == [{"type": "thinking", "thinking": "hm", "signature": ""}, {"type": "text", "text": "ok"},
                               {"type": "tool_use", "id": f"toolu_{HEX}", "name": "get_weather", "input": {"city": "Oslo"}}]
    assert body["stop_reason"] == "tool_use" and body["type"] == "message" and body["role"] == "assistant"
    assert body["usage"] == {"input_tokens": 10, "output_tokens": 3, "cache_read_input_tokens": 60,
                             "cache_creation_input_tokens": 30}
    u = usage(r)
    assert u["input_tokens"] + u["cache_read_input_tokens"] + u["cache_creation_input_tokens"] == r.prompt_tokens


@pytest.mark.parametrize("fields, reason", [({"finish_reason": "length"}, "max_tokens"),
                                            ({"stop_sequence": "END"}, "stop_sequence"), ({}, "end_turn"),
                                            ({"finish_reason": "cancelled"}, "end_turn")])
def test_stop_reasons(fields, reason):
    assert stop_reason(result(**fields)) == reason


def parse_events(text: str) -> list[tuple[str, dict]]:
    out = []
    for chunk in text.strip().split("\n\n"):
        kind, data = chunk.split("\n")
        assert kind.startswith("event: ") and data.startswith("data: ")
        payload = json.loads(data[6:])
        assert payload["type"] == kind[7:]
        out.append((kind[7:], payload))
    return out


def test_the_event_sequence_opens_and_closes_a_block_per_kind():
    maker = EventMaker("msg_1", "m")
    pieces = [ReplyPiece(PieceKind.REASONING, "a"), ReplyPiece(PieceKind.REASONING, "b"),
              ReplyPiece(PieceKind.CONTENT, "c"), ReplyPiece(PieceKind.TOOL_CALL, call=ToolCall(f"call_{HEX}", "f", "{}"))]
    text = "".join(maker.start() + [e for p in pieces for e in maker.piece(p)]
                   + maker.end(Served(result(finish_reason="tool_calls"), "m")))
    events = parse_events(text)
    assert [k for k, _ in events] == [
        "message_start", "ping", "content_block_start", "content_block_delta", "content_block_delta",
        "content_block_delta", "content_block_stop", "content_block_start", "content_block_delta", "content_block_stop",
        "content_block_start", "content_block_delta", "content_block_stop", "message_delta", "message_stop"]
    starts = [e["content_block"] for k, e in events if k == "content_block_start"]
    assert [b["type"] for b in starts] == ["thinking", "text", "tool_use"] and starts[2]["id"] == f"toolu_{HEX}"
    assert [e["index"] for k, e in events if k == "content_block_stop"] == [0, 1, 2]
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use"


def test_an_empty_reply_still_has_one_text_block():
    kinds = [k for k, _ in parse_events("".join(EventMaker("m", "x").end(Served(result(), "x"))))]
    assert kinds == ["content_block_start", "content_block_stop", "message_delta", "message_stop"]


# errors -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("status, code, anthropic_status, kind", [
    (400, None, 400, "invalid_request_error"), (401, None, 401, "authentication_error"),
    (403, None, 403, "permission_error"), (404, None, 404, "not_found_error"), (405, None, 404, "not_found_error"),
    (413, None, 413, "request_too_large"), (415, None, 400, "invalid_request_error"),
    (421, None, 403, "permission_error"), (429, None, 429, "rate_limit_error"), (500, None, 500, "api_error"),
    (503, "model_not_available", 500, "api_error"), (503, "shutting_down", 529, "overloaded_error")])
def test_errors_take_the_shape_of_the_api_asked(status, code, anthropic_status, kind):
    assert anthropic_path("/v1/messages") and anthropic_path("/v1/messages/count_tokens")
    assert not anthropic_path("/v1/messagesx") and not anthropic_path("/v1/chat/completions")
    got, body = shaped("/v1/messages", status, "why", "p", code)
    assert got == anthropic_status and body == {"type": "error", "error": {"type": kind, "message": "why"}}
    got, body = shaped("/v1/chat/completions", status, "why", "p", code)
    assert got == status and body["error"]["message"] == "why" and body["error"]["param"] == "p"


def test_an_error_after_the_stream_began_is_an_error_event():
    status, body = ApiError(400, "the prompt is too long", code="context_length_exceeded").shaped("/v1/messages")
    (kind, data), = parse_events(EventMaker.error(body))
    assert status == 400 and kind == "error" and data["error"] == {"type": "invalid_request_error",
                                                                   "message": "the prompt is too long"}


def test_serve_takes_any_model():
    from engine.cli.main import build_parser
    from engine.server.main import settings_from_args

    assert settings_from_args(build_parser().parse_args(["serve", "--any-model"])).any_model is True
    assert settings_from_args(build_parser().parse_args(["serve"])).any_model is False
