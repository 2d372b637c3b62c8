"""Server requests bound to a conversation (X-Hearth-Conversation) that carry an agent's turns (issue 30): the
tool calls and results of the history are stored and compared, the tools and template kwargs reach the
template, and the reply is stored with its thinking. Through ``Hearth.serve`` on real models (the tiny ChatML
model, whose template cannot express tools: the built-in fallback; a tiny Qwen3 with the real template)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.api import Hearth
from engine.errors import PromptError
from engine.paths import resolve_paths
from engine.types import PieceKind, SamplingParams, ServeRequest, ToolChoice, ToolChoiceMode

GREEDY = SamplingParams(temperature=0.0)
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}
CALL = {"id": "call_0123456789abcdef01234567", "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}


def _loop() -> list[dict]:
    """An agent's history as its client sends it: a question, the model's call, the tool's result."""
    return [{"role": "system", "content": "You call tools."},
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": CALL["id"], "name": "get_weather", "content": '{"temperature": 21}'}]


def _serve(hearth: Hearth, messages: list[dict], conversation: str, **extra):
    """A bound request; on the tiny model (256 tokens of context) without the tools' long fallback section."""
    request = ServeRequest(messages=tuple(messages), params=GREEDY, max_tokens=6, conversation=conversation, **extra)
    return hearth.serve(request)


def test_a_tool_loop_is_stored_and_continues_in_the_conversation(hearth):
    first = _serve(hearth, _loop(), "agent")
    held = hearth.conversations.messages("agent")
    assert [m.role for m in held] == ["user", "assistant", "tool", "assistant"]
    assert held[1].tool_calls[0].id == CALL["id"] and held[1].tool_calls[0].arguments == '{"city": "Paris"}'
    assert held[2].tool_call_id == CALL["id"] and held[2].name == "get_weather"
    assert held[3].content == first.text and first.finish_reason in ("stop", "length")
    # the next request sends it all back (arguments re-serialised by the client: still the same call)
    again = [*_loop(), {"role": "assistant", "content": first.text}, {"role": "user", "content": "And tomorrow?"}]
    again[2] = {**again[2], "tool_calls": [{**CALL, "function": {**CALL["function"], "arguments": '{"city":"Paris"}'}}]}
    second = _serve(hearth, again, "agent")
    assert second.cache.reused_tokens > 0  # the conversation's live context: only what is new was read
    held = hearth.conversations.messages("agent")
    assert [m.role for m in held] == ["user", "assistant", "tool", "assistant", "user", "assistant"]
    assert held[1].tool_calls[0].arguments == '{"city": "Paris"}'  # the stored call is what the model reads


@pytest.mark.parametrize("change, needle", [
    (lambda m: m[3].update(tool_call_id="call_other"), "message 4 differs"),
    (lambda m: m[2].update(tool_calls=[{**CALL, "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}]),
     "message 3 differs"),
    (lambda m: m[2].pop("tool_calls"), "message 3 differs"),
])
def test_a_history_whose_calls_or_results_differ_is_refused(hearth, change, needle):
    _serve(hearth, _loop(), "strict")
    before = hearth.conversations.messages("strict")
    changed = [dict(m) for m in _loop()]
    change(changed)
    with pytest.raises(PromptError, match=needle):
        _serve(hearth, [*changed, {"role": "assistant", "content": before[-1].content},
                        {"role": "user", "content": "more"}], "strict")
    assert hearth.conversations.messages("strict") == before  # nothing stored


@pytest.mark.parametrize("bad, needle", [
    ({"role": "assistant", "content": "", "tool_calls": [{**CALL, "id": "has space"}]}, "not an id"),
    ({"role": "tool", "content": "r", "tool_call_id": "x" * 300}, "256"),
    ({"role": "assistant", "content": "", "tool_calls": [{**CALL, "function": {"name": "get_weather",
                                                                               "arguments": "[1]"}}]}, "object"),
])
def test_bad_agent_fields_are_refused_before_anything_is_stored(hearth, bad, needle):
    messages = [{"role": "user", "content": "hi"}, bad, {"role": "user", "content": "go on"}]
    with pytest.raises(PromptError, match=needle):
        _serve(hearth, messages, "refused")
    assert hearth.conversations.get("refused") is None


def test_tools_that_make_the_prompt_too_long_are_refused_before_anything_is_stored(hearth):
    with pytest.raises(PromptError, match="context window"):  # the fallback's tool section: past 256 tokens
        _serve(hearth, _loop(), "long", tools=(WEATHER,))
    assert hearth.conversations.get("long") is None


def test_a_bad_tools_list_is_refused_before_anything_is_stored(hearth):
    request = ServeRequest(messages=({"role": "user", "content": "hi"},), params=GREEDY, max_tokens=4,
                           conversation="badtools", tools=({"type": "function", "function": {"name": "bad name"}},))
    with pytest.raises(PromptError, match="name"):
        hearth.serve(request)
    request = ServeRequest(messages=({"role": "user", "content": "hi"},), params=GREEDY, max_tokens=4,
                           conversation="badtools", tools=(WEATHER,),
                           tool_choice=ToolChoice(ToolChoiceMode.FUNCTION, "nope"))
    with pytest.raises(PromptError):
        hearth.serve(request)
    assert hearth.conversations.get("badtools") is None


@pytest.fixture
def qwen3(qwen3_chat_gguf, qwen3_chat_home, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / "converted").symlink_to(qwen3_chat_home)
    service = Hearth(resolve_paths(home).ensure(), model=str(qwen3_chat_gguf), provider="cpu")
    service.load()
    yield service
    service.close()


def test_qwen3s_template_gets_the_tools_and_the_kwargs_of_a_bound_request(qwen3):
    pieces: list = []
    plain = qwen3.serve(ServeRequest(messages=({"role": "user", "content": "hi"},), params=GREEDY, max_tokens=4,
                                     conversation="q1"))
    tooled = qwen3.serve(ServeRequest(messages=({"role": "user", "content": "hi"},), params=GREEDY, max_tokens=4,
                                      conversation="q2", tools=(WEATHER,)), None, None, pieces.append)
    quiet = qwen3.serve(ServeRequest(messages=({"role": "user", "content": "hi"},), params=GREEDY, max_tokens=4,
                                     conversation="q3", template_kwargs={"enable_thinking": False}))
    assert tooled.prompt_tokens > plain.prompt_tokens + len(json.dumps(WEATHER)) // 2  # the tools' section
    assert quiet.prompt_tokens > plain.prompt_tokens  # the empty thinking block enable_thinking=False adds
    assert pieces and "".join(p.text for p in pieces if p.kind == PieceKind.CONTENT) == tooled.text
    for cid, result in (("q1", plain), ("q2", tooled), ("q3", quiet)):
        reply = qwen3.conversations.messages(cid)[-1]
        assert (reply.content, reply.reasoning) == (result.text, result.reasoning)


SHORT = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}}, "required": ["city"],
    "additionalProperties": False}}}  # a random model would add properties until max_tokens


def test_a_forced_call_and_its_result_make_a_full_loop_in_the_conversation(qwen3):
    """tool_choice names the function: the reply is a call (decoded under its grammar), stored with the reply;
    the client runs it and sends the result; the next reply answers it. All of it is in the conversation."""
    pieces: list = []
    ask = [{"role": "user", "content": "Weather in Paris?"}]
    forced = ServeRequest(messages=tuple(ask), params=GREEDY, max_tokens=120, conversation="loop", tools=(SHORT,),
                          tool_choice=ToolChoice(ToolChoiceMode.FUNCTION, "get_weather"),
                          template_kwargs={"enable_thinking": False, "thinking_budget": 4})
    first = qwen3.serve(forced, None, None, pieces.append)
    assert first.finish_reason == "tool_calls" and len(first.tool_calls) >= 1
    call = first.tool_calls[0]
    assert call.name == "get_weather" and json.loads(call.arguments)["city"] in ("Paris", "Rome")
    assert [p.call for p in pieces if p.kind == PieceKind.TOOL_CALL] == list(first.tool_calls)
    held = qwen3.conversations.messages("loop")
    assert [m.role for m in held] == ["user", "assistant"] and held[1].tool_calls == first.tool_calls
    assert held[1].content == first.text
    # the client sends the call back as it got it, and the tool's result
    wire = [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in first.tool_calls]
    loop = [*ask, {"role": "assistant", "content": first.text, "tool_calls": wire},
            *({"role": "tool", "tool_call_id": c.id, "content": '{"temperature": 21}'} for c in first.tool_calls)]
    final = qwen3.serve(ServeRequest(messages=tuple(loop), params=GREEDY, max_tokens=6, conversation="loop",
                                     tools=(SHORT,), template_kwargs={"enable_thinking": False}))
    assert final.cache.reused_tokens > 0  # the live context of the call: only the results were read
    held = qwen3.conversations.messages("loop")
    assert [m.role for m in held] == ["user", "assistant", *["tool"] * len(wire), "assistant"]
    assert held[-1].content == final.text and held[2].tool_call_id == call.id


def test_after_a_thinking_turn_the_next_turn_rereads_only_the_visible_reply(qwen3):
    """Qwen3's template drops an earlier turn's thinking from the next prompt: the conversation's context is
    kept up to where that render diverges (the reply's start), so the next turn re-reads only the visible
    reply and what is new, not the whole chat."""
    kwargs = {"enable_thinking": True, "thinking_budget": 6}  # a bounded thinking block, then the reply
    ask = [{"role": "user", "content": "Plan a trip to Paris."}]
    first = qwen3.serve(ServeRequest(messages=tuple(ask), params=GREEDY, max_tokens=24, conversation="think",
                                     template_kwargs=kwargs))
    assert first.reasoning and qwen3.conversations.messages("think")[-1].reasoning == first.reasoning
    follow = [*ask, {"role": "assistant", "content": first.text}, {"role": "user", "content": "And Rome?"}]
    second = qwen3.serve(ServeRequest(messages=tuple(follow), params=GREEDY, max_tokens=4, conversation="think",
                                      template_kwargs=kwargs))
    engine = qwen3._engine
    new_part = engine.tokenizer.encode(first.text + "<|im_end|>\n<|im_start|>user\nAnd Rome?<|im_end|>\n"
                                       "<|im_start|>assistant\n")
    reread = second.cache.prefilled_tokens
    assert second.cache.reused_tokens >= first.prompt_tokens - 1  # the first prompt, all kept
    assert reread <= len(new_part) + 4, (reread, len(new_part))  # the visible reply and the new turn only
    print(f"re-read after a thinking turn: {reread} tokens (visible reply and new turn: {len(new_part)}; the "
          f"thinking dropped from the prompt: {len(engine.tokenizer.encode(first.reasoning))})")


def test_a_bound_request_over_http_stores_the_thinking_beside_the_reply(tiny_gguf, tmp_path):
    """A real server on 127.0.0.1 (the official openai client) on a model whose template thinks: the reply's
    text is what the client gets as content, and the conversation keeps the thinking beside it, which the
    window then draws as its block."""
    from engine.library import ModelLibrary
    from tests.gguf_edit import rewrite_gguf
    from tests.server_helpers import LiveServer

    template = (Path(__file__).parent / "templates" / "deepseek-r1-distill-qwen.jinja").read_text()
    gguf = rewrite_gguf(tiny_gguf, tmp_path / "thinks.gguf", values={"tokenizer.chat_template": template})
    paths = resolve_paths(tmp_path / "home").ensure()
    name = ModelLibrary(paths).add(gguf).name
    server = LiveServer(paths, name)
    try:
        reply = server.client().chat.completions.create(
            model=name, messages=[{"role": "user", "content": "What is 2 + 2?"}], max_tokens=6, temperature=0,
            extra_headers={"X-Hearth-Conversation": "over-http"})
        held = server.host.hearth.conversations.messages("over-http")
    finally:
        server.close()
    assert [m.role for m in held] == ["user", "assistant"]
    assert held[1].reasoning and held[1].content == (reply.choices[0].message.content or "")
    assert held[1].reasoning not in (reply.choices[0].message.content or "")  # the thinking is not the content
