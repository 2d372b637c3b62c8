"""OpenAI tool calls over real HTTP through the official ``openai`` client, on the real default model
(SmolLM2-135M: its chatml template cannot express tools, so the built-in fallback format is what it
reads and writes): forced calls valid against their schemas, stream and whole reply alike, a full loop,
parallel calls, ``auto`` and ``none``, every 400; and the model-optional rules on the tiny model."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest

from engine.api import ModelLibrary, resolve_paths
from engine.model.fetch import default_model
from engine.server.config import ServerSettings
from tests.server_helpers import LiveServer

MODEL = default_model().key
WAIT_S = 300


def strict(schema: dict) -> dict:
    """``schema`` with ``additionalProperties: false`` on every object, as OpenAI's strict tools have it: without
    it the grammar rightly lets a call add keys, and a small model may add them until max_tokens."""
    if schema.get("type") == "object":
        schema = {**schema, "additionalProperties": False,
                  "properties": {k: strict(v) for k, v in schema.get("properties", {}).items()}}
    if schema.get("type") == "array" and isinstance(schema.get("items"), dict):
        schema = {**schema, "items": strict(schema["items"])}
    return schema


WEATHER = strict({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})
SCHEMAS = {name: strict(schema) for name, schema in {  # five shapes a tool's arguments take
    "nested_objects": {"type": "object", "properties": {
        "user": {"type": "object", "properties": {"name": {"type": "string"}, "address": {
            "type": "object", "properties": {"street": {"type": "string"}, "zip": {"type": "string"}},
            "required": ["street", "zip"]}}, "required": ["name", "address"]}}, "required": ["user"]},
    "enums": {"type": "object", "properties": {"unit": {"enum": ["celsius", "fahrenheit"]},
                                               "mode": {"type": "string", "enum": ["fast", "slow"]}},
              "required": ["unit", "mode"]},
    "arrays": {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string"}, "minItems": 1,
                                                         "maxItems": 4}}, "required": ["tags"]},
    "bounded_numbers": {"type": "object", "properties": {"count": {"type": "integer", "minimum": 1, "maximum": 9},
                                                         "ratio": {"type": "number", "minimum": 0, "maximum": 1}},
                        "required": ["count", "ratio"]},
    "optional_fields": {"type": "object", "properties": {"query": {"type": "string"}, "limit": {"type": "integer"},
                                                         "exact": {"type": "boolean"}}, "required": ["query"]},
}.items()}


def tool(name: str, schema: dict, description: str = "") -> dict:
    return {"type": "function", "function": {"name": name, "description": description or f"the {name} tool",
                                             "parameters": schema}}


def weather_tools() -> list[dict]:
    return [tool("get_weather", WEATHER, "the weather in a city now"),
            tool("get_time", strict({"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}),
                 "the time in a time zone")]


@pytest.fixture(scope="module")
def real(real_home, tmp_path_factory):
    """One server on the real default model for the module (a fresh data dir sharing the model)."""
    home = tmp_path_factory.mktemp("tools-home")
    for sub in ("models", "converted"):
        (home / sub).symlink_to(real_home / sub)
    s = LiveServer(resolve_paths(home).ensure(), MODEL)
    yield s
    s.close()


def ask(s: LiveServer, messages: list[dict], **options):
    options.setdefault("max_tokens", 120)
    return s.client(timeout=WAIT_S).chat.completions.create(model=MODEL, messages=messages, temperature=0, **options)


def streamed(s: LiveServer, messages: list[dict], **options) -> dict:
    """A streamed reply put together as a client does: content, reasoning and calls by index."""
    options.setdefault("max_tokens", 120)
    content, calls, finish = "", {}, None
    for chunk in s.client(timeout=WAIT_S).chat.completions.create(model=MODEL, messages=messages, temperature=0,
                                                                  stream=True, **options):
        choice = chunk.choices[0]
        content += choice.delta.content or ""
        for d in choice.delta.tool_calls or ():
            if d.index not in calls:  # the first chunk of a call: its id, type and name, no arguments yet
                assert d.id and d.type == "function" and d.function.name and d.function.arguments == ""
                calls[d.index] = {"id": d.id, "name": d.function.name, "arguments": ""}
            else:
                assert d.id is None
                calls[d.index]["arguments"] += d.function.arguments or ""
        finish = choice.finish_reason or finish
    return {"content": content, "calls": [calls[i] for i in sorted(calls)], "finish": finish}


def calls_of(reply) -> list[dict]:
    return [{"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
            for c in reply.choices[0].message.tool_calls or ()]


# forced calls -----------------------------------------------------------------------------------------------
@pytest.mark.real_model
@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_a_named_tool_choice_gives_arguments_valid_against_the_schema_streamed_or_not(real, name):
    messages = [{"role": "user", "content": f"Use the {name} tool with sensible values."}]
    options = {"tools": [tool(name, SCHEMAS[name]), tool("get_weather", WEATHER)],
               "tool_choice": {"type": "function", "function": {"name": name}}, "parallel_tool_calls": False}
    reply = ask(real, messages, **options)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    calls = calls_of(reply)
    assert len(calls) == 1 and calls[0]["name"] == name and calls[0]["id"].startswith("call_")
    jsonschema.validate(json.loads(calls[0]["arguments"]), SCHEMAS[name])
    stream = streamed(real, messages, **options)
    assert stream["finish"] == "tool_calls" and stream["content"] == ""
    assert [(c["name"], c["arguments"]) for c in stream["calls"]] == [(name, calls[0]["arguments"])]


@pytest.mark.real_model
def test_required_calls_one_of_the_tools(real):
    reply = ask(real, [{"role": "user", "content": "What is the weather in Oslo?"}], tools=weather_tools(),
                tool_choice="required", parallel_tool_calls=False)
    calls = calls_of(reply)
    assert reply.choices[0].finish_reason == "tool_calls" and len(calls) == 1
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in weather_tools()}
    for c in calls:
        jsonschema.validate(json.loads(c["arguments"]), schemas[c["name"]])
    assert len({c["id"] for c in calls}) == len(calls)


@pytest.mark.real_model
def test_parallel_calls_come_by_index_and_parallel_false_gives_one(real):
    """Several calls: tool_choice required lets the grammar write one or more; asked for two cities, the
    model writes a call per city. With parallel_tool_calls false it may write only one."""
    messages = [{"role": "user", "content": "Call get_weather for Oslo, then call get_weather for Paris."}]
    many = ask(real, messages, tools=weather_tools(), tool_choice="required", max_tokens=160)
    calls = calls_of(many)
    assert len(calls) >= 2, calls
    stream = streamed(real, messages, tools=weather_tools(), tool_choice="required", max_tokens=160)
    assert [(c["name"], c["arguments"]) for c in stream["calls"]] == [(c["name"], c["arguments"]) for c in calls]
    one = ask(real, messages, tools=weather_tools(), tool_choice="required", parallel_tool_calls=False, max_tokens=160)
    assert len(calls_of(one)) == 1


@pytest.mark.real_model
def test_a_full_loop_call_then_tool_result_then_answer_rereads_only_what_is_new(real):
    messages = [{"role": "system", "content": "You answer questions about the weather."},
                {"role": "user", "content": "What is the weather in Oslo?"}]
    first = ask(real, messages, tools=weather_tools(), tool_choice={"type": "function", "function": {"name": "get_weather"}})
    call = first.choices[0].message.tool_calls[0]
    messages.append({"role": "assistant", "content": None, "tool_calls": [
        {"id": call.id, "type": "function", "function": {"name": call.function.name, "arguments": call.function.arguments}}]})
    messages.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps({"sky": "sunny", "celsius": 21})})
    final = ask(real, messages, tools=weather_tools(), tool_choice="none", max_tokens=40)
    choice = final.choices[0]
    assert choice.finish_reason in ("stop", "length") and choice.message.content and not choice.message.tool_calls
    # the call renders back to the bytes the model wrote: the whole first prompt comes from the live KV
    assert final.usage.prompt_tokens > first.usage.prompt_tokens
    assert final.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens


@pytest.mark.real_model
def test_auto_with_a_reply_that_is_not_a_call_is_text(real):
    reply = ask(real, [{"role": "user", "content": "Say hello to me in one short sentence."}], tools=weather_tools(),
                tool_choice="auto", max_tokens=30)
    choice = reply.choices[0]
    assert choice.finish_reason in ("stop", "length") and choice.message.content and not choice.message.tool_calls
    assert "<tool_call>" not in choice.message.content


@pytest.mark.real_model
def test_tool_choice_none_never_calls(real):
    reply = ask(real, [{"role": "user", "content": "What is the weather in Oslo? Use get_weather."}],
                tools=weather_tools(), tool_choice="none", max_tokens=40)
    assert reply.choices[0].finish_reason in ("stop", "length") and not reply.choices[0].message.tool_calls


# refusals ---------------------------------------------------------------------------------------------------
def post(s: LiveServer, body: dict, path: str = "/v1/chat/completions", **options) -> httpx.Response:
    return httpx.post(s.base + path, json=body, timeout=WAIT_S, **options)


CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}


@pytest.mark.real_model
@pytest.mark.parametrize("change, param", [
    ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools.0.function.name"),
    ({"tools": [{"type": "retrieval"}]}, "tools.0.type"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]},
     "tools.0.function.parameters"),
    ({"tools": [tool("f", WEATHER)] * 2}, "tools.1"),
    ({"tools": [tool("f", WEATHER)] * 129}, "tools"),
    ({"tools": [tool("f", WEATHER)], "tool_choice": {"type": "function", "function": {"name": "g"}}},
     "tool_choice.function.name"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tool_choice": "sometimes"}, "tool_choice"),
    ({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": None, "tool_calls": [CALL]},
                   {"role": "tool", "content": "sunny"}]}, "messages.2.tool_call_id"),
    ({"messages": [{"role": "user", "content": "x"}, {"role": "tool", "tool_call_id": "call_9", "content": "sunny"}]},
     "messages.1.tool_call_id"),
    ({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [
        {**CALL, "function": {"name": "get_weather", "arguments": "{not json"}}]}]},
     "messages.1.tool_calls.0.function.arguments"),
    ({"chat_template_kwargs": {"x": "y" * 20_000}}, "chat_template_kwargs"),
    ({"reasoning_effort": "extreme"}, "reasoning_effort"),
])
def test_bad_tool_requests_are_400_naming_the_field(real, change, param):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **change}
    r = post(real, body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"] and error["param"] == param


@pytest.mark.real_model
def test_reasoning_effort_and_template_kwargs_are_accepted_by_a_template_that_ignores_them(real):
    reply = ask(real, [{"role": "user", "content": "hi"}], max_tokens=4, reasoning_effort="low",
                extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert reply.choices[0].message.content is not None and reply.choices[0].message.model_extra.get(
        "reasoning_content") is None


# the model a request runs on --------------------------------------------------------------------------------
TINY = "tiny"


@pytest.fixture
def tiny_library(tiny_home, tiny_gguf, tmp_path):
    paths = resolve_paths(tiny_home).ensure()
    assert ModelLibrary(paths).add(tiny_gguf).name == TINY
    other = tmp_path / "other.gguf"
    other.write_bytes(tiny_gguf.read_bytes())
    assert ModelLibrary(paths).add(other).name == "other"
    return paths


@pytest.fixture
def tiny_server(tiny_library):
    started = []

    def make(settings: ServerSettings | None = None, model: str = "other") -> LiveServer:
        started.append(LiveServer(tiny_library, model, settings))
        return started[-1]

    yield make
    for s in started:
        s.close()


def test_models_lists_every_loadable_model_the_loaded_one_first_and_marked(tiny_server):
    s = tiny_server()
    data = httpx.get(s.base + "/v1/models").json()["data"]
    assert [(m["id"], m["loaded"]) for m in data] == [("other", True), (TINY, False)]
    assert httpx.get(s.base + f"/v1/models/{TINY}").json()["loaded"] is False
    s.client().chat.completions.create(model=TINY, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    data = httpx.get(s.base + "/v1/models").json()["data"]
    assert [(m["id"], m["loaded"]) for m in data] == [(TINY, True), ("other", False)]


def test_after_an_idle_unload_no_model_is_marked_loaded_and_a_request_without_one_loads_it(tiny_server):
    import time

    s = tiny_server(ServerSettings(idle_unload_s=0.2))
    s.client().chat.completions.create(model=TINY, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    deadline = time.monotonic() + WAIT_S
    while s.host.state != "unloaded":
        assert time.monotonic() < deadline
        time.sleep(0.02)
    data = httpx.get(s.base + "/v1/models").json()["data"]
    assert [(m["id"], m["loaded"]) for m in data] == [(TINY, False), ("other", False)]  # the last one first
    r = post(s, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert r.status_code == 200 and r.json()["model"] == TINY


def test_a_request_without_a_model_runs_on_the_loaded_one(tiny_server):
    s = tiny_server()
    r = post(s, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert r.status_code == 200 and r.json()["model"] == "other"
    s.client().completions.create(model=TINY, prompt="a", max_tokens=1)  # now the tiny one is loaded
    r = post(s, {"prompt": "a", "max_tokens": 2}, "/v1/completions")
    assert r.status_code == 200 and r.json()["model"] == TINY
    stream = httpx.post(s.base + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                               "max_tokens": 2, "stream": True}, timeout=WAIT_S)
    first = json.loads(stream.text.split("\n\n")[0][6:])
    assert stream.status_code == 200 and first["model"] == TINY


def test_an_unknown_model_is_404_unless_any_model_is_set(tiny_server):
    s = tiny_server()
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        s.client().chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    lenient = tiny_server(ServerSettings(any_model=True))
    reply = lenient.client().chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}],
                                                     max_tokens=2)
    assert reply.model == "other"  # the model that answered, not the name asked for
    assert post(lenient, {"model": "", "messages": [{"role": "user", "content": "hi"}]}).status_code == 400


@pytest.mark.real_model
def test_openais_own_stream_accumulator_reads_the_calls(real):
    """The client's stream helper puts ``delta.tool_calls`` together by index as it does OpenAI's: the calls
    it assembles are the whole reply's."""
    messages = [{"role": "user", "content": "What is the weather in Oslo?"}]
    options = {"tools": weather_tools(), "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
               "parallel_tool_calls": False, "max_tokens": 120, "temperature": 0}
    whole = real.client(timeout=WAIT_S).chat.completions.create(model=MODEL, messages=messages, **options)
    with real.client(timeout=WAIT_S).chat.completions.stream(model=MODEL, messages=messages, **options) as stream:
        done = [e for e in stream if e.type == "tool_calls.function.arguments.done"]
        final = stream.get_final_completion()
    expected = [(c["name"], c["arguments"]) for c in calls_of(whole)]  # the ids differ from request to request
    assert [(e.name, e.arguments) for e in done] == expected
    assert final.choices[0].finish_reason == "tool_calls"
    assert [(c["name"], c["arguments"]) for c in calls_of(final)] == expected


@pytest.mark.real_model
def test_a_bound_conversation_takes_a_call_and_its_result(real):
    """X-Hearth-Conversation with tools: the call comes back as on an unbound request, and the next request
    (the call and its result added) continues the stored conversation."""
    headers = {"X-Hearth-Conversation": "agent-1"}
    messages = [{"role": "user", "content": "What is the weather in Oslo?"}]
    options = {"tools": weather_tools(), "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
               "parallel_tool_calls": False}
    first = ask(real, messages, extra_headers=headers, **options)
    assert first.choices[0].finish_reason == "tool_calls"
    call = first.choices[0].message.tool_calls[0]
    jsonschema.validate(json.loads(call.function.arguments), WEATHER)
    messages += [{"role": "assistant", "content": None, "tool_calls": [
        {"id": call.id, "type": "function", "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": "sunny"}]
    final = ask(real, messages, extra_headers=headers, tools=weather_tools(), tool_choice="none", max_tokens=20)
    assert final.choices[0].message.content and final.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens
