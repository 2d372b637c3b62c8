"""A conversation bound with X-Hearth-Conversation over real HTTP takes an agent's tool loop through both APIs (the
official openai and anthropic clients): the call, then its result, stored and continued on the reused context."""
from __future__ import annotations

import json

from engine.library import ModelLibrary
from engine.paths import resolve_paths
from tests.server_helpers import LiveServer

TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}}, "required": ["city"],
    "additionalProperties": False}}}


def test_openai_bound_loop(qwen3_chat_gguf, qwen3_chat_home, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / "converted").symlink_to(qwen3_chat_home)
    paths = resolve_paths(home).ensure()
    name = ModelLibrary(paths).add(qwen3_chat_gguf).name
    server = LiveServer(paths, name)
    try:
        client = server.client()
        ask = [{"role": "user", "content": "Weather in Paris?"}]
        h = {"X-Hearth-Conversation": "http-loop"}
        first = client.chat.completions.create(model=name, messages=ask, tools=[TOOL], max_tokens=120, temperature=0,
                                               tool_choice={"type": "function", "function": {"name": "get_weather"}},
                                               extra_body={"chat_template_kwargs": {"enable_thinking": False}},
                                               extra_headers=h)
        msg = first.choices[0].message
        assert first.choices[0].finish_reason == "tool_calls", first
        loop = [*ask, msg.model_dump(exclude_none=True),
                *({"role": "tool", "tool_call_id": c.id, "content": '{"t": 21}'} for c in msg.tool_calls)]
        final = client.chat.completions.create(model=name, messages=loop, tools=[TOOL], max_tokens=6, temperature=0,
                                               extra_body={"chat_template_kwargs": {"enable_thinking": False}},
                                               extra_headers=h)
        held = server.host.hearth.conversations.messages("http-loop")
        print([ (m.role, m.content[:30], m.tool_calls, m.tool_call_id) for m in held])
        assert [m.role for m in held] == ["user", "assistant", *["tool"] * len(msg.tool_calls), "assistant"]
        assert held[-1].content == (final.choices[0].message.content or "")
        # anthropic, same conversation continued
        import anthropic
        ac = anthropic.Anthropic(base_url=server.base, api_key="none", max_retries=0)
        msgs = [{"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_" + c.id[5:], "name": c.function.name,
                                                    "input": json.loads(c.function.arguments)} for c in msg.tool_calls]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_" + c.id[5:], "content": '{"t": 21}'}
                                             for c in msg.tool_calls]},
                {"role": "assistant", "content": final.choices[0].message.content or "."},
                {"role": "user", "content": "Thanks"}]
        r = ac.messages.create(model=name, max_tokens=4, messages=msgs, extra_headers=h,
                               tools=[{"name": "get_weather", "input_schema": TOOL["function"]["parameters"]}])
        print(r)
        held = server.host.hearth.conversations.messages("http-loop")
        print([(m.role, m.content[:30]) for m in held])
    finally:
        server.close()
