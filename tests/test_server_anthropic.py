"""The Anthropic Messages API over real HTTP through the official ``anthropic`` client (and raw ``httpx``
where a test needs the bytes): whole and streamed messages (the event order checked), a tool loop,
count_tokens, the prompt cache across requests and a restart, cache_control save points, every documented
error status with its type, and the key from ``x-api-key`` or ``Authorization: Bearer``."""

from __future__ import annotations

import json
import threading

import anthropic
import httpx
import jsonschema
import pytest

from engine.api import resolve_paths
from engine.model.fetch import default_model
from engine.server.config import ServerSettings
from tests.server_helpers import LiveServer

MODEL = default_model().key
WAIT_S = 300
KEY = "test-key-1234"
# additionalProperties false: without it the grammar rightly lets a call add keys, and a small model may add them
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"], "additionalProperties": False}
TOOLS = [{"name": "get_weather", "description": "the weather in a city now", "input_schema": WEATHER}]
HELLO = [{"role": "user", "content": "Say hello."}]
RULES = " ".join(f"Rule {i}: when asked about topic {i}, answer in one short sentence." for i in range(40))


def client(s: LiveServer, **options) -> anthropic.Anthropic:
    options.setdefault("api_key", s.settings.api_key or "none")
    return anthropic.Anthropic(base_url=s.base, max_retries=0, timeout=WAIT_S, **options)


def home_for(real_home, tmp_path_factory, name: str):
    home = tmp_path_factory.mktemp(name)
    for sub in ("models", "converted"):
        (home / sub).symlink_to(real_home / sub)
    return resolve_paths(home).ensure()


@pytest.fixture(scope="module")
def real_paths_module(real_home, tmp_path_factory):
    return home_for(real_home, tmp_path_factory, "anthropic-home")


@pytest.fixture(scope="module")
def real(real_paths_module):
    s = LiveServer(real_paths_module, MODEL)
    yield s
    s.close()


GREEDY = {"temperature": 0}  # the 2.x client no longer takes the sampling fields: a raw request's extra


def create(s: LiveServer, **options):
    options.setdefault("max_tokens", 24)
    options.setdefault("messages", HELLO)
    return client(s).messages.create(model=MODEL, extra_body=GREEDY, **options)


def events(s: LiveServer, body: dict, **options) -> list[tuple[str, dict]]:
    """A raw stream's (event, data) pairs, in order."""
    out = []
    with httpx.stream("POST", s.base + "/v1/messages", json={"model": MODEL, "stream": True, **body},
                      timeout=WAIT_S, **options) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        kind = None
        for line in r.iter_lines():
            if line.startswith("event: "):
                kind = line[7:]
            elif line.startswith("data: "):
                data = json.loads(line[6:])
                assert data["type"] == kind
                out.append((kind, data))
    return out


# messages ---------------------------------------------------------------------------------------------------
@pytest.mark.real_model
def test_a_message_through_the_client(real):
    reply = create(real, system="You are brief.")
    assert reply.type == "message" and reply.role == "assistant" and reply.model == MODEL
    assert reply.id.startswith("msg_") and reply.content[0].type == "text" and reply.content[0].text
    assert reply.stop_reason in ("end_turn", "max_tokens") and reply.stop_sequence is None
    u = reply.usage
    assert u.input_tokens + u.cache_read_input_tokens + u.cache_creation_input_tokens > 0 and 0 < u.output_tokens <= 24


@pytest.mark.real_model
def test_a_stream_has_anthropics_event_order_and_the_whole_reply(real):
    whole = create(real, max_tokens=16)
    seen = events(real, {"max_tokens": 16, "temperature": 0, "messages": HELLO})
    kinds = [k for k, _ in seen]
    assert kinds[:2] == ["message_start", "ping"] and kinds[-2:] == ["message_delta", "message_stop"]
    assert kinds[2] == "content_block_start" and kinds[-3] == "content_block_stop"
    assert set(kinds[3:-3]) == {"content_block_delta"}
    text = "".join(d["delta"]["text"] for k, d in seen if k == "content_block_delta")
    assert text == whole.content[0].text
    delta = seen[-2][1]
    assert delta["delta"]["stop_reason"] == whole.stop_reason and delta["usage"]["output_tokens"] == whole.usage.output_tokens
    # message_start already says how big the prompt is and how much of it came from cache (as Anthropic's does)
    start = seen[0][1]["message"]["usage"]
    prompt = whole.usage.input_tokens + whole.usage.cache_read_input_tokens + whole.usage.cache_creation_input_tokens
    assert start["input_tokens"] + start["cache_read_input_tokens"] == prompt and start["cache_read_input_tokens"] > 0
    with client(real).messages.stream(model=MODEL, max_tokens=16, extra_body=GREEDY, messages=HELLO) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed == whole.content[0].text and final.usage.output_tokens == whole.usage.output_tokens
    assert final.usage.input_tokens + final.usage.cache_read_input_tokens > 0  # the totals come in message_delta


@pytest.mark.real_model
def test_stop_sequences_end_the_reply_and_are_reported(real):
    whole = create(real, max_tokens=24)
    words = whole.content[0].text.split()
    assert len(words) > 2
    reply = create(real, max_tokens=24, stop_sequences=[words[1]])
    assert reply.stop_reason == "stop_sequence" and reply.stop_sequence == words[1]
    assert words[1] not in reply.content[0].text


@pytest.mark.real_model
def test_a_tool_loop_through_the_client(real):
    messages = [{"role": "user", "content": "What is the weather in Oslo?"}]
    first = create(real, messages=messages, tools=TOOLS, max_tokens=80,
                   tool_choice={"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True})
    assert first.stop_reason == "tool_use"
    use = next(b for b in first.content if b.type == "tool_use")
    assert use.id.startswith("toolu_") and use.name == "get_weather"
    jsonschema.validate(use.input, WEATHER)
    messages += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "sunny, 21 C"}]}]
    final = create(real, messages=messages, tools=TOOLS, tool_choice={"type": "none"}, max_tokens=30)
    assert final.stop_reason in ("end_turn", "max_tokens") and final.content[0].type == "text" and final.content[0].text
    assert final.usage.cache_read_input_tokens >= sum(
        (first.usage.input_tokens, first.usage.cache_read_input_tokens, first.usage.cache_creation_input_tokens))


@pytest.mark.real_model
def test_a_streamed_tool_call_is_an_input_json_delta(real):
    body = {"max_tokens": 80, "temperature": 0, "tools": TOOLS,
            "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
            "messages": [{"role": "user", "content": "Weather in Oslo?"}]}
    seen = events(real, body)
    starts = [d["content_block"] for k, d in seen if k == "content_block_start"]
    assert starts and starts[-1]["type"] == "tool_use" and starts[-1]["input"] == {}
    parts = "".join(d["delta"]["partial_json"] for k, d in seen
                    if k == "content_block_delta" and d["delta"]["type"] == "input_json_delta")
    jsonschema.validate(json.loads(parts), WEATHER)
    assert seen[-2][1]["delta"]["stop_reason"] == "tool_use"
    with client(real).messages.stream(model=MODEL, extra_body=GREEDY, **{k: v for k, v in body.items()
                                                                          if k != "temperature"}) as stream:
        final = stream.get_final_message()
    assert [b.input for b in final.content if b.type == "tool_use"][-1] == json.loads(parts)


@pytest.mark.real_model
def test_count_tokens_is_the_prompt_a_request_reads(real):
    system, messages = "You are brief.", [{"role": "user", "content": "Count me."}]
    counted = client(real).messages.count_tokens(model=MODEL, system=system, messages=messages, tools=TOOLS)
    reply = create(real, system=system, messages=messages, tools=TOOLS, max_tokens=2)
    u = reply.usage
    assert counted.input_tokens == u.input_tokens + u.cache_read_input_tokens + u.cache_creation_input_tokens > 0
    no_model = httpx.post(real.base + "/v1/messages/count_tokens", json={"messages": messages}, timeout=WAIT_S)
    assert no_model.status_code == 200 and no_model.json()["input_tokens"] > 0


# the prompt cache -------------------------------------------------------------------------------------------
@pytest.mark.real_model
def test_the_second_request_and_the_first_after_a_restart_read_the_cache(real_home, tmp_path_factory):
    paths = home_for(real_home, tmp_path_factory, "anthropic-restart")
    messages = [{"role": "user", "content": "Tell me about topic 3."}]
    s = LiveServer(paths, MODEL)
    try:
        first = create(s, system=RULES, messages=messages)
        messages += [{"role": "assistant", "content": first.content[0].text},
                     {"role": "user", "content": "And topic 4?"}]
        second = create(s, system=RULES, messages=messages)
    finally:
        s.close()
    prompt = first.usage.input_tokens + first.usage.cache_creation_input_tokens + first.usage.cache_read_input_tokens
    assert second.usage.cache_read_input_tokens >= prompt
    messages += [{"role": "assistant", "content": second.content[0].text}, {"role": "user", "content": "And 5?"}]
    again = LiveServer(paths, MODEL)  # only the disk remembers
    try:
        raw = client(again).messages.with_raw_response.create(model=MODEL, max_tokens=8, extra_body=GREEDY,
                                                              system=RULES, messages=messages)
    finally:
        again.close()
    assert raw.headers["X-Hearth-Cache"] == "disk"
    assert raw.parse().usage.cache_read_input_tokens > prompt


SHORT = [{"role": "user", "content": [{"type": "text", "text": "What does clause 4 say about leaks?"}]}]


@pytest.mark.real_model
def test_a_cache_control_breakpoint_is_a_save_point_kept_at_once(real):
    """A short prompt is not worth saving by the server's own policy (it waits for a longer one, another
    conversation or shutdown); a breakpoint saves it at once, and the usage says so."""
    plain = create(real, system="You read contracts, version A.", messages=SHORT, max_tokens=4)
    assert plain.usage.cache_creation_input_tokens == 0
    marked = [{"role": "user", "content": [{**SHORT[0]["content"][0], "cache_control": {"type": "ephemeral"}}]}]
    saved = create(real, system="You read contracts, version B.", messages=marked, max_tokens=4)
    assert saved.usage.cache_creation_input_tokens > 0
    top = client(real).messages.create(model=MODEL, max_tokens=4, extra_body=GREEDY, messages=SHORT,
                                       system="You read contracts, version C.", cache_control={"type": "ephemeral"})
    assert top.usage.cache_creation_input_tokens > 0  # the top-level breakpoint: on the last block


# errors -----------------------------------------------------------------------------------------------------
def assert_anthropic_error(r: httpx.Response, status: int, kind: str) -> str:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == kind and body["error"]["message"]
    assert set(body) == {"type", "error"} and set(body["error"]) == {"type", "message"}
    return body["error"]["message"]


def post(s: LiveServer, body: dict | bytes, path: str = "/v1/messages", **options) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"Content-Type": "application/json", **options.pop("headers", {})}
    return httpx.post(s.base + path, content=content, headers=headers, timeout=WAIT_S, **options)


TINY = "tiny"


@pytest.fixture
def tiny(tiny_home, tiny_gguf):
    from engine.api import ModelLibrary

    paths = resolve_paths(tiny_home).ensure()
    assert ModelLibrary(paths).add(tiny_gguf).name == TINY
    started = []

    def make(settings: ServerSettings | None = None, **options) -> LiveServer:
        started.append(LiveServer(paths, TINY, settings, **options))
        return started[-1]

    yield make
    for s in started:
        s.close()


BODY = {"model": TINY, "max_tokens": 2, "messages": HELLO}


def test_invalid_requests_are_400_invalid_request_error(tiny):
    s = tiny()
    for body in ({"model": TINY, "messages": HELLO}, {**BODY, "max_tokens": 0}, {**BODY, "messages": []},
                 {**BODY, "temperature": 1.5}, {**BODY, "messages": [{"role": "user", "content": [{"type": "image"}]}]},
                 {**BODY, "tool_choice": {"type": "any"}}):
        assert_anthropic_error(post(s, body), 400, "invalid_request_error")
    assert "not valid JSON" in assert_anthropic_error(post(s, b"{nope"), 400, "invalid_request_error")
    assert "Content-Type" in assert_anthropic_error(post(s, BODY, headers={"Content-Type": "text/plain"}), 400,
                                                    "invalid_request_error")
    with pytest.raises(anthropic.BadRequestError, match="image blocks are not supported"):
        client(s).messages.create(model=TINY, max_tokens=2, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}]}])


def test_a_prompt_longer_than_the_context_is_400_even_streamed(tiny):
    s = tiny()
    for stream in (False, True):
        long = {**BODY, "stream": stream, "messages": [{"role": "user", "content": "word " * 2000}]}
        assert_anthropic_error(post(s, long), 400, "invalid_request_error")


def test_the_key_comes_from_x_api_key_or_bearer(tiny):
    s = tiny(ServerSettings(api_key=KEY))
    assert "missing API key" in assert_anthropic_error(post(s, BODY), 401, "authentication_error")
    assert_anthropic_error(post(s, BODY, headers={"x-api-key": "wrong-key-123"}), 401, "authentication_error")
    assert_anthropic_error(post(s, BODY, headers={"Authorization": "Bearer wrong-key-123"}), 401, "authentication_error")
    assert post(s, BODY, headers={"x-api-key": KEY}).status_code == 200
    assert post(s, BODY, headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
    assert post(s, BODY, headers={"x-api-key": "", "Authorization": f"Bearer {KEY}"}).status_code == 200  # either
    assert client(s).messages.create(model=TINY, max_tokens=2, messages=HELLO).content
    assert client(s, api_key=None, auth_token=None, default_headers={"x-api-key": KEY}).messages.create(
        model=TINY, max_tokens=2, messages=HELLO).content
    with pytest.raises(anthropic.AuthenticationError):
        client(s, api_key="wrong-key-123").messages.create(model=TINY, max_tokens=2, messages=HELLO)
    # the OpenAI endpoints take x-api-key too, and keep OpenAI's error shape
    chat = {"model": TINY, "messages": HELLO, "max_tokens": 2}
    assert post(s, chat, "/v1/chat/completions", headers={"x-api-key": KEY}).status_code == 200
    r = post(s, chat, "/v1/chat/completions")
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"


def test_a_web_page_and_a_foreign_host_are_403_permission_error(tiny):
    s = tiny()
    assert_anthropic_error(post(s, BODY, headers={"Origin": "https://evil.example"}), 403, "permission_error")
    assert_anthropic_error(post(s, BODY, headers={"Host": "evil.example"}), 403, "permission_error")
    with pytest.raises(anthropic.PermissionDeniedError):
        client(s, default_headers={"Origin": "https://evil.example"}).messages.create(model=TINY, max_tokens=2,
                                                                                       messages=HELLO)


def test_unknown_models_and_paths_are_404_not_found_error(tiny):
    s = tiny()
    with pytest.raises(anthropic.NotFoundError, match="does not exist"):
        client(s).messages.create(model="claude-sonnet-4-5", max_tokens=2, messages=HELLO)
    assert_anthropic_error(post(s, {**BODY, "model": "nope"}, "/v1/messages/count_tokens"), 404, "not_found_error")
    assert_anthropic_error(post(s, BODY, "/v1/messages/batches"), 404, "not_found_error")
    assert_anthropic_error(httpx.get(s.base + "/v1/messages", timeout=WAIT_S), 404, "not_found_error")
    lenient = tiny(ServerSettings(any_model=True))
    reply = client(lenient).messages.create(model="claude-sonnet-4-5", max_tokens=2, messages=HELLO)
    assert reply.model == TINY
    assert post(lenient, {"max_tokens": 2, "messages": HELLO}).json()["model"] == TINY  # no model: the loaded one


def test_a_body_too_large_is_413_request_too_large(tiny):
    s = tiny(ServerSettings(max_body_bytes=4096))
    big = {**BODY, "messages": [{"role": "user", "content": "x" * 10_000}]}
    assert_anthropic_error(post(s, big), 413, "request_too_large")
    with pytest.raises(anthropic.APIStatusError) as caught:
        client(s).messages.create(model=TINY, max_tokens=2, messages=big["messages"])
    assert caught.value.status_code == 413


def test_a_full_queue_is_429_rate_limit_error(tiny):
    s = tiny(ServerSettings(max_queue=1))
    release = threading.Event()
    s.runner.submit(lambda: release.wait(WAIT_S), bounded=False)
    try:
        import time

        while s.runner.waiting:
            time.sleep(0.02)
        waiting = threading.Thread(target=post, args=(s, BODY))
        waiting.start()
        while s.runner.waiting < 1:
            time.sleep(0.02)
        refused = post(s, BODY)
        assert_anthropic_error(refused, 429, "rate_limit_error")
        assert refused.headers["Retry-After"] == "1"
        release.set()
        waiting.join(WAIT_S)
    finally:
        release.set()


def test_a_model_that_cannot_load_is_500_api_error(tiny):
    s = tiny(start_model=False, available_memory=1)
    assert "do not fit" in assert_anthropic_error(post(s, BODY), 500, "api_error")


def test_a_server_shutting_down_is_529_overloaded_error(tiny):
    s = tiny()
    s.runner.close()  # takes no new work, as while stopping
    assert_anthropic_error(post(s, BODY), 529, "overloaded_error")
    with pytest.raises(anthropic.APIStatusError) as caught:
        client(s).messages.create(model=TINY, max_tokens=2, messages=HELLO)
    assert caught.value.status_code == 529 and caught.value.body["error"]["type"] == "overloaded_error"


def test_a_bound_message_is_stored_into_the_conversation(tiny):
    from engine.api import open_conversations

    s = tiny()
    r = post(s, BODY, headers={"X-Hearth-Conversation": "from-anthropic"})
    assert r.status_code == 200, r.text
    store = open_conversations(s.host.paths)
    try:
        stored = [m.content for m in store.messages("from-anthropic")]
    finally:
        store.close()
    assert stored[0] == "Say hello." and len(stored) == 2
    assert_anthropic_error(post(s, BODY, headers={"X-Hearth-Conversation": "../x"}), 400, "invalid_request_error")


def test_the_anthropic_client_lists_the_models_the_loaded_one_first(tiny):
    s = tiny()
    page = client(s).models.list()
    assert [(m.id, m.type) for m in page.data] == [(TINY, "model")] and page.data[0].model_extra["loaded"] is True
    assert client(s).models.retrieve(TINY).id == TINY
    assert httpx.get(s.base + "/v1/models", timeout=WAIT_S).json()["object"] == "list"  # OpenAI's without the header


def test_a_bad_block_is_named_by_where_it_is(tiny):
    s = tiny()
    r = post(s, {**BODY, "messages": [{"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "f"}]}]})
    assert assert_anthropic_error(r, 400, "invalid_request_error").startswith("messages.0.content.0.input:")
    r = post(s, {**BODY, "messages": [{"role": "user", "content": [{"type": "weird"}]}]})
    assert "'weird'" in assert_anthropic_error(r, 400, "invalid_request_error")


@pytest.mark.real_model
def test_output_config_format_constrains_the_reply_to_the_schema(real):
    schema = {"type": "object", "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}},
              "required": ["answer"], "additionalProperties": False}
    reply = create(real, messages=[{"role": "user", "content": "Is water wet? Answer in JSON."}], max_tokens=30,
                   output_config={"format": {"type": "json_schema", "schema": schema}})
    jsonschema.validate(json.loads(reply.content[0].text), schema)
