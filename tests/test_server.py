"""The local OpenAI-compatible server over real HTTP on 127.0.0.1 (a free port), through the official
``openai`` client where it can speak, and raw ``httpx`` where the test needs what a client would not send."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import openai
import pytest

from engine.api import ModelLibrary, resolve_paths
from engine.server.config import ServerSettings
from tests.conftest import REPO
from tests.server_helpers import LiveServer

TINY = "tiny"
CHAT = [{"role": "user", "content": "hello"}]
WAIT_S = 120  # a ceiling for things that happen, never a speed assertion


@pytest.fixture
def tiny_paths(tiny_home, tiny_gguf):
    paths = resolve_paths(tiny_home).ensure()
    assert ModelLibrary(paths).add(tiny_gguf).name == TINY
    return paths


@pytest.fixture
def serve(tiny_paths):
    """serve(settings=..., **options) → a started LiveServer on the tiny model, closed at the end."""
    started = []

    def make(settings: ServerSettings | None = None, **options) -> LiveServer:
        started.append(LiveServer(tiny_paths, TINY, settings, **options))
        return started[-1]

    yield make
    for s in started:
        s.close()


@pytest.fixture
def server(serve):
    return serve()


def wait_until(condition, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.02)


def post(s: LiveServer, path: str, body, **options) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"Content-Type": "application/json", **options.pop("headers", {})}
    return httpx.post(s.base + path, content=content, headers=headers, timeout=WAIT_S, **options)


def assert_error(r: httpx.Response, status: int, param: str | None = None) -> dict:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    if param is not None:
        assert error["param"] == param
    return error


# endpoints ----------------------------------------------------------------------------------------------
def test_models_and_health(server):
    assert [m.id for m in server.client().models.list()] == [TINY]
    health = httpx.get(server.base + "/health")
    assert health.status_code == 200 and health.json()["status"] == "ready"
    assert httpx.get(server.base + "/v1/models/" + TINY).json()["id"] == TINY
    assert_error(httpx.get(server.base + "/v1/models/nope"), 404, "model")


def test_chat_reports_usage_and_how_the_context_was_obtained(server):
    raw = server.client().chat.completions.with_raw_response.create(
        model=TINY, messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
        max_tokens=6, temperature=0)
    reply = raw.parse()
    assert reply.object == "chat.completion" and reply.model == TINY
    assert reply.choices[0].finish_reason in ("stop", "length") and reply.choices[0].message.role == "assistant"
    usage = reply.usage
    assert 0 < usage.completion_tokens <= 6 and usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    hearth = reply.model_extra["hearth"]
    assert hearth["source"] in ("cold", "live", "disk", "rebuilt")
    assert usage.prompt_tokens_details.cached_tokens == hearth["reused_tokens"]
    assert hearth["reused_tokens"] + hearth["prefilled_tokens"] == usage.prompt_tokens
    assert raw.headers["X-Hearth-Cache"] == hearth["source"]
    assert raw.headers["X-Hearth-Cached-Tokens"] == str(hearth["reused_tokens"])
    assert hearth["ttft_ms"] > 0  # the engine's own time to the first token


def test_text_parts_and_developer_role_read_as_plain_messages(server):
    c = server.client()
    plain = c.chat.completions.create(model=TINY, messages=[{"role": "system", "content": "ab"},
                                                            {"role": "user", "content": "cd"}], max_tokens=5, temperature=0)
    parts = c.chat.completions.create(model=TINY, messages=[
        {"role": "developer", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "user", "content": [{"type": "text", "text": "cd"}]}], max_tokens=5, temperature=0)
    assert parts.choices[0].message.content == plain.choices[0].message.content
    assert parts.usage.prompt_tokens == plain.usage.prompt_tokens


def test_chat_stream_equals_the_whole_reply(server):
    c = server.client()
    whole = c.chat.completions.create(model=TINY, messages=CHAT, max_tokens=12, temperature=0)
    chunks = list(c.chat.completions.create(model=TINY, messages=CHAT, max_tokens=12, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == whole.choices[0].message.content
    finish = [ch for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert len(finish) == 1 and finish[0].choices[0].finish_reason == whole.choices[0].finish_reason
    assert finish[0].model_extra["hearth"]["source"] in ("cold", "live", "disk", "rebuilt")
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_stream_ends_with_done_and_no_usage_unless_asked(server):
    with httpx.stream("POST", server.base + "/v1/chat/completions", timeout=WAIT_S,
                      json={"model": TINY, "messages": CHAT, "max_tokens": 4, "stream": True}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = [line[len("data: "):] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert all("usage" not in json.loads(e) for e in events[:-1])


def test_completions_raw_prompt_streamed_and_not(server):
    c = server.client()
    whole = c.completions.create(model=TINY, prompt="abc", max_tokens=8, temperature=0)
    assert whole.object == "text_completion" and whole.choices[0].text
    streamed = "".join(ch.choices[0].text for ch in c.completions.create(
        model=TINY, prompt="abc", max_tokens=8, temperature=0, stream=True) if ch.choices)
    assert streamed == whole.choices[0].text
    assert whole.usage.prompt_tokens < c.chat.completions.create(
        model=TINY, messages=[{"role": "user", "content": "abc"}], max_tokens=1).usage.prompt_tokens  # no template


def test_a_seed_reproduces_a_sampled_reply(server):
    c = server.client()

    def sample(seed: int) -> str:
        return c.completions.create(model=TINY, prompt="x y z", max_tokens=16, temperature=1.5, seed=seed).choices[0].text

    assert sample(11) == sample(11)
    assert len({sample(s) for s in range(6)}) > 1  # the seed is what made them equal


def test_stop_strings_end_the_reply_before_them(server):
    c = server.client()
    full = c.completions.create(model=TINY, prompt="abc", max_tokens=12, temperature=0).choices[0].text
    assert len(full) > 6
    stop = full[3:6]
    expected = full[:full.find(stop)]
    stopped = c.completions.create(model=TINY, prompt="abc", max_tokens=12, temperature=0, stop=[stop, "never seen"])
    assert stopped.choices[0].text == expected and stopped.choices[0].finish_reason == "stop"
    streamed = "".join(ch.choices[0].text for ch in c.completions.create(
        model=TINY, prompt="abc", max_tokens=12, temperature=0, stop=stop, stream=True) if ch.choices)
    assert streamed == expected


def test_chat_logprobs(server):
    reply = server.client().chat.completions.create(model=TINY, messages=CHAT, max_tokens=5, temperature=0,
                                                    logprobs=True, top_logprobs=3)
    content = reply.choices[0].logprobs.content
    assert len(content) == reply.usage.completion_tokens
    assert "".join(t.token for t in content) == reply.choices[0].message.content
    for t in content:
        assert len(t.top_logprobs) == 3 and t.logprob <= 0
        assert t.top_logprobs[0].token == t.token  # greedy takes the most likely token
        assert bytes(t.bytes) == t.token.encode()


def test_completion_logprobs_legacy_shape(server):
    reply = server.client().completions.create(model=TINY, prompt="abc", max_tokens=4, temperature=0, logprobs=2)
    lp = reply.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == reply.usage.completion_tokens
    assert lp.text_offset[0] == 0 and all(len(top) <= 2 for top in lp.top_logprobs)


def test_penalties_and_response_format_reach_the_engine(server):
    body = {"model": TINY, "messages": CHAT, "max_tokens": 4}
    penalised = post(server, "/v1/chat/completions", {**body, "presence_penalty": 0.5})
    schema = {"type": "object", "properties": {"a": {"enum": ["x", "y"]}}, "required": ["a"],
              "additionalProperties": False}
    formatted = post(server, "/v1/chat/completions", {**body, "max_tokens": 40, "response_format": {
        "type": "json_schema", "json_schema": {"name": "choice", "schema": schema}}})
    assert penalised.status_code == 200 and formatted.status_code == 200
    assert json.loads(formatted.json()["choices"][0]["message"]["content"])["a"] in ("x", "y")


# errors --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("change, param", [
    ({"n": 2}, "n"),
    ({"temperature": 3}, "temperature"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages.0.tool_call_id"),  # a tool result needs its call
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, None),
    ({"messages": [{"role": "system", "content": "only a system prompt"}]}, "messages"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
    ({"model": ""}, "model"),
    ({"prompt_lookup": 65}, "prompt_lookup"),
    ({"prompt_lookup": -1}, "prompt_lookup"),
    ({"prompt_lookup": "4"}, "prompt_lookup"),
])
def test_invalid_fields_are_400_naming_them(server, change, param):
    body = {"model": TINY, "messages": CHAT, "max_tokens": 4, "unknown_field": {"ignored": True}, **change}
    assert_error(post(server, "/v1/chat/completions", body), 400, param)


def test_prompt_lookup_is_a_hearth_field_and_the_hearth_object_counts_its_drafts(server):
    body = {"model": TINY, "messages": CHAT, "max_tokens": 6, "temperature": 0}
    plain = post(server, "/v1/chat/completions", body)
    drafted = post(server, "/v1/chat/completions", dict(body, prompt_lookup=8))
    assert plain.status_code == drafted.status_code == 200, drafted.text
    for r in (plain, drafted):
        hearth = r.json()["hearth"]
        assert 0 <= hearth["accepted_tokens"] <= hearth["drafted_tokens"]
    assert plain.json()["hearth"]["drafted_tokens"] == 0  # off unless asked
    assert drafted.json()["choices"][0]["message"]["content"] == plain.json()["choices"][0]["message"]["content"]


def test_n_above_one_is_refused_through_the_client(server):
    with pytest.raises(openai.BadRequestError, match="n must be 1"):
        server.client().chat.completions.create(model=TINY, messages=CHAT, n=2)


def test_unknown_fields_are_ignored(server):
    r = post(server, "/v1/chat/completions", {"model": TINY, "messages": CHAT, "max_tokens": 2, "tools": [],
                                              "parallel_tool_calls": False, "metadata": {"a": "b"}})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("body", [b"{not json", b"[1, 2]", b"{\"model\": \"tiny\", \"prompt\": \"\\ud800\""])
def test_a_body_that_is_not_a_json_object_is_400(server, body):
    assert_error(post(server, "/v1/completions", body), 400)


@pytest.mark.parametrize("change, param", [({"prompt": ["a", "b"]}, "prompt"), ({"prompt": ""}, "prompt"),
                                           ({"echo": True}, "echo"), ({"suffix": "x"}, "suffix"),
                                           ({"best_of": 2}, "best_of"), ({"logprobs": 6}, "logprobs")])
def test_invalid_completions_fields_are_400(server, change, param):
    assert_error(post(server, "/v1/completions", {"model": TINY, "prompt": "abc", "max_tokens": 2, **change}), 400, param)


def test_conversation_header_must_be_an_id(server):
    r = post(server, "/v1/chat/completions", {"model": TINY, "messages": CHAT, "max_tokens": 2},
             headers={"X-Hearth-Conversation": "../../etc"})
    assert_error(r, 400, "X-Hearth-Conversation")


def test_unknown_model_is_404(server):
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        server.client().chat.completions.create(model="gpt-4o", messages=CHAT)
    assert_error(post(server, "/v1/completions", {"model": "nope", "prompt": "a", "stream": True}), 404, "model")
    assert_error(httpx.get(server.base + "/v1/nothing"), 404)


def test_a_prompt_longer_than_the_context_is_400_even_streamed(server):
    long = "word " * 2000  # the tiny model reads 256 tokens
    for stream in (False, True):
        r = post(server, "/v1/chat/completions", {"model": TINY, "messages": [{"role": "user", "content": long}],
                                                  "stream": stream})
        assert_error(r, 400)


def test_oversized_body_is_413_before_parsing(serve):
    s = serve(ServerSettings(max_body_bytes=4096))
    big = {"model": TINY, "messages": [{"role": "user", "content": "x" * 10_000}]}
    assert_error(post(s, "/v1/chat/completions", big), 413)

    def chunked():  # no Content-Length: counted as it arrives
        yield json.dumps(big).encode()

    r = httpx.post(s.base + "/v1/chat/completions", content=chunked(), headers={"Content-Type": "application/json"})
    assert_error(r, 413)
    assert post(s, "/v1/chat/completions", {"model": TINY, "messages": CHAT, "max_tokens": 2}).status_code == 200


def block_engine(s: LiveServer) -> threading.Event:
    """Occupy the engine thread until the returned event is set."""
    release = threading.Event()
    s.runner.submit(lambda: release.wait(WAIT_S), bounded=False)
    return release


def test_a_full_queue_is_429_with_retry_after(serve):
    s = serve(ServerSettings(max_queue=1))
    release = block_engine(s)
    try:
        wait_until(lambda: s.runner.waiting == 0, "the blocking job to start")
        with ThreadPoolExecutor(1) as pool:
            queued = pool.submit(post, s, "/v1/completions", {"model": TINY, "prompt": "a", "max_tokens": 2})
            wait_until(lambda: s.runner.waiting == 1, "the first request to queue")
            refused = post(s, "/v1/completions", {"model": TINY, "prompt": "a", "max_tokens": 2})
            assert_error(refused, 429)
            assert refused.headers["Retry-After"] == "1"
            release.set()
            assert queued.result().status_code == 200
    finally:
        release.set()


def test_health_is_503_while_the_model_loads(serve):
    s = serve(start_model=False)
    release = block_engine(s)
    loaded = s.host.start()
    r = httpx.get(s.base + "/health")
    assert r.status_code == 503 and r.json()["status"] == "starting"
    release.set()
    loaded.result(WAIT_S)
    assert httpx.get(s.base + "/health").json()["status"] == "ready"


def test_a_model_that_cannot_load_is_503_with_the_reason(serve):
    s = serve(start_model=False, available_memory=1)
    error = assert_error(post(s, "/v1/chat/completions", {"model": TINY, "messages": CHAT}), 503, "model")
    assert "do not fit" in error["message"]
    health = httpx.get(s.base + "/health")
    assert health.status_code == 503 and health.json()["status"] == "failed" and health.json()["problem"]


# security --------------------------------------------------------------------------------------------------
def cli(*args: str, **options) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-m", "engine.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=REPO, **options)


def test_binding_beyond_127_0_0_1_without_a_key_refuses_to_start(tmp_path):
    proc = cli("serve", "--data-dir", str(tmp_path), "--host", "127.0.0.2", "--port", "0")
    out, err = proc.communicate(timeout=WAIT_S)
    assert proc.returncode == 2 and out == ""
    assert err.count("\n") == 1 and "without an API key" in err and "Traceback" not in err


@pytest.mark.parametrize("args, message", [
    (["--api-key", "short"], "at least 8"),
    (["--api-key-file", "missing-key-file"], "cannot read the API key file"),
    (["--cors-origin", "*"], "--cors-origin"),
    (["--max-queue", "0"], "--max-queue"),
])
def test_bad_server_options_are_one_line_and_exit_2(tmp_path, args, message):
    proc = cli("serve", "--data-dir", str(tmp_path), "--port", "0", *args)
    _, err = proc.communicate(timeout=WAIT_S)
    assert proc.returncode == 2 and err.count("\n") == 1 and message in err


def test_an_empty_key_file_is_refused(tmp_path):
    (tmp_path / "key").write_text("\n")
    proc = cli("serve", "--data-dir", str(tmp_path), "--host", "127.0.0.2", "--api-key-file", str(tmp_path / "key"))
    _, err = proc.communicate(timeout=WAIT_S)
    assert proc.returncode == 2 and "is empty" in err


def test_beyond_loopback_a_key_is_required_and_checked(serve, tmp_path):
    s = serve(ServerSettings(host="127.0.0.2", api_key="s3cret-key-1"))
    body = {"model": TINY, "messages": CHAT, "max_tokens": 2}
    assert_error(post(s, "/v1/chat/completions", body), 401)
    assert_error(post(s, "/v1/chat/completions", body, headers={"Authorization": "Bearer wrong-key-00"}), 401)
    assert_error(httpx.get(s.base + "/v1/models", headers={"Authorization": "Basic czNjcmV0"}), 401)
    with pytest.raises(openai.AuthenticationError):
        s.client(api_key="nope-nope-nope").models.list()
    assert s.client().chat.completions.create(model=TINY, messages=CHAT, max_tokens=2).choices
    assert httpx.get(s.base + "/health").status_code == 200  # says only that it is up


def test_a_foreign_host_header_is_refused(server):
    for host in ("evil.example", "evil.example:8080", "127.0.0.1.nip.io"):
        assert_error(httpx.get(server.base + "/v1/models", headers={"Host": host}), 421)
    for host in (f"127.0.0.1:{server.port}", f"localhost:{server.port}", "localhost"):
        assert httpx.get(server.base + "/v1/models", headers={"Host": host}).status_code == 200


def test_an_allowed_host_is_answered(serve):
    s = serve(ServerSettings(allowed_hosts=("hearth.lan",)))
    assert httpx.get(s.base + "/v1/models", headers={"Host": "hearth.lan:8080"}).status_code == 200
    assert_error(httpx.get(s.base + "/v1/models", headers={"Host": "other.lan"}), 421)


def test_cors_is_off_unless_an_origin_is_listed(serve):
    closed = serve()
    r = httpx.get(closed.base + "/v1/models", headers={"Origin": "http://localhost:3000"})
    assert "access-control-allow-origin" not in r.headers
    opened = serve(ServerSettings(cors_origins=("http://localhost:3000",)))
    allowed = httpx.get(opened.base + "/v1/models", headers={"Origin": "http://localhost:3000"})
    assert allowed.headers["access-control-allow-origin"] == "http://localhost:3000"
    refused = httpx.get(opened.base + "/v1/models", headers={"Origin": "http://evil.example"})
    assert "access-control-allow-origin" not in refused.headers
    preflight = httpx.options(opened.base + "/v1/chat/completions", headers={
        "Origin": "http://localhost:3000", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type"})
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] == "http://localhost:3000"
    evil = httpx.options(opened.base + "/v1/chat/completions", headers={
        "Origin": "http://evil.example", "Access-Control-Request-Method": "POST"})
    assert "access-control-allow-origin" not in evil.headers


# concurrency, disconnects, signals ------------------------------------------------------------------------------
def test_fifty_concurrent_requests_are_answered_or_429_never_mixed_up(serve):
    s = serve(ServerSettings(max_queue=8))
    c = s.client()

    def ask(i: int) -> str:
        return c.completions.create(model=TINY, prompt=f"number {i}", max_tokens=6, temperature=1.2,
                                    seed=i).choices[0].text

    expected = [ask(i) for i in range(50)]
    assert len(set(expected)) > 10  # the replies differ, so a mix-up would show

    def attempt(i: int):
        try:
            return ask(i)
        except openai.RateLimitError:
            return None

    with ThreadPoolExecutor(50) as pool:
        got = list(pool.map(attempt, range(50)))
    answered = [i for i, g in enumerate(got) if g is not None]
    assert answered and all(got[i] == expected[i] for i in answered)


@pytest.mark.real_model
def test_a_disconnect_mid_stream_stops_the_generation(real_model_home):
    paths = resolve_paths(real_model_home).ensure()
    model = ModelLibrary(paths).default_name()
    s = LiveServer(paths, model)
    try:
        body = {"model": model, "messages": [{"role": "user", "content": "Tell me a very long story."}],
                "max_tokens": 2000, "temperature": 0, "stream": True}
        with httpx.stream("POST", s.base + "/v1/chat/completions", json=body, timeout=WAIT_S) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            seen = sum(1 for line, _ in zip(lines, range(4), strict=False) if line.startswith("data: "))
            assert seen >= 2
        wait_until(lambda: s.host.last_result is not None, "the cancelled generation to end")
        stopped = s.host.last_result
        assert stopped.finish_reason == "cancelled" and stopped.completion_tokens < 2000
        after = s.client().chat.completions.create(model=model, messages=CHAT, max_tokens=3, temperature=0)
        assert after.usage.completion_tokens >= 1
    finally:
        s.close()


def start_cli_server(data_dir, *extra: str) -> tuple[subprocess.Popen, str]:
    proc = cli("serve", "--data-dir", str(data_dir), "--model", TINY, "--port", "0", "--provider", "cpu", *extra)
    line = proc.stderr.readline()
    assert "serving http://" in line, line + (proc.stderr.read() if proc.poll() is not None else "")
    return proc, line.split("serving ", 1)[1].strip().removesuffix("/v1")


def test_sigterm_stops_the_server_cleanly(tiny_paths):
    proc, base = start_cli_server(tiny_paths.data)
    try:
        r = httpx.post(base + "/v1/chat/completions", json={"model": TINY, "messages": CHAT, "max_tokens": 3},
                       timeout=WAIT_S)
        assert r.status_code == 200
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=WAIT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "context saved" in err and "Traceback" not in err


def test_sigterm_leaves_the_served_context_on_disk(tiny_paths):
    proc, base = start_cli_server(tiny_paths.data)
    try:
        r = httpx.post(base + "/v1/chat/completions", json={"model": TINY, "messages": CHAT, "max_tokens": 3},
                       headers={"X-Hearth-Conversation": "sigterm-test"}, timeout=WAIT_S)
        assert r.status_code == 200
        r = httpx.post(base + "/v1/chat/completions", json={"model": TINY, "max_tokens": 3, "messages": [
            {"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "an unbound request"}]},
            timeout=WAIT_S)  # its KV is live (too short for a save of its own) until the shutdown saves it
        assert r.status_code == 200
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=WAIT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0
    listing = cli("kv", "ls", "--json", "--data-dir", str(tiny_paths.data))
    out, _ = listing.communicate(timeout=WAIT_S)
    assert listing.returncode == 0
    entries = json.loads(out)["entries"]
    assert any(e["conversation"] == "sigterm-test" for e in entries)  # the bound request: its chat's file
    assert any(e["kind"] == "api" for e in entries)  # the unbound one: saved as the server stopped


# models ---------------------------------------------------------------------------------------------------
def test_a_request_for_another_library_model_switches_to_it(serve, tiny_paths, tiny_gguf, tmp_path):
    other = tmp_path / "other.gguf"
    other.write_bytes(tiny_gguf.read_bytes())
    assert ModelLibrary(tiny_paths).add(other).name == "other"
    s = serve()
    assert {m.id for m in s.client().models.list()} == {TINY, "other"}
    reply = s.client().chat.completions.create(model="other", messages=CHAT, max_tokens=2)
    assert reply.model == "other" and s.host.hearth.model_key == "other"
    back = s.client().chat.completions.create(model=TINY, messages=CHAT, max_tokens=2)
    assert back.model == TINY and s.host.hearth.model_key == TINY


def test_idle_unload_frees_the_model_and_the_next_request_loads_it(serve):
    s = serve(ServerSettings(idle_unload_s=0.2))
    s.client().chat.completions.create(model=TINY, messages=CHAT, max_tokens=2)
    wait_until(lambda: s.host.state == "unloaded", "the idle model to be unloaded")
    assert s.host.hearth.model is None and httpx.get(s.base + "/health").status_code == 200
    assert s.client().chat.completions.create(model=TINY, messages=CHAT, max_tokens=2).choices
    assert s.host.hearth.model is not None


def test_serve_with_an_unknown_model_exits_1_with_one_line(tiny_paths):
    proc = cli("serve", "--data-dir", str(tiny_paths.data), "--model", "no-such-model", "--port", "0")
    _, err = proc.communicate(timeout=WAIT_S)
    assert proc.returncode == 1 and err.count("\n") == 1 and "no-such-model" in err


# issue 27: what a web page, a neighbour or a careless client could send ------------------------------------
EVIL = "http://evil.example"
ISSUE_27_BODY = {"model": TINY, "max_tokens": 2, "messages": [{"role": "system", "content": "attacker's prompt"},
                                                              {"role": "user", "content": "hi"}]}


def stored_ids(s: LiveServer) -> set[str]:
    from engine.api import open_conversations

    store = open_conversations(s.host.paths)
    try:
        return store.ids()
    finally:
        store.close()


@pytest.mark.parametrize("user", [None, "csrf-victim"])
def test_a_simple_cross_site_post_is_refused_before_any_work(server, user):
    body = dict(ISSUE_27_BODY, **({"user": user} if user else {}))
    for path in ("/v1/chat/completions", "/v1/completions"):
        r = post(server, path, body, headers={"Origin": EVIL, "Content-Type": "text/plain"})
        assert assert_error(r, 403)["code"] == "origin_not_allowed"
    assert server.host.last_result is None and stored_ids(server) == set()
    assert_error(httpx.get(server.base + "/v1/models", headers={"Origin": EVIL}), 403)
    assert_error(httpx.get(server.base + "/health", headers={"Origin": "null"}), 403)
    # without an Origin (a form post from a page that hides it, curl): the body must still be declared JSON
    for content_type in ("text/plain", "application/x-www-form-urlencoded", None):
        headers = {"Content-Type": content_type} if content_type else {}
        r = httpx.post(server.base + "/v1/chat/completions", content=json.dumps(body).encode(), headers=headers)
        assert assert_error(r, 415)["code"] == "unsupported_media_type"
    assert server.host.last_result is None and stored_ids(server) == set()
    ok = post(server, "/v1/chat/completions", body, headers={"Content-Type": "application/json; charset=utf-8"})
    assert ok.status_code == 200, ok.text


def test_a_refused_page_is_told_the_serve_option_that_lets_it_in(serve):
    s = serve()
    error = assert_error(httpx.get(s.base + "/v1/models", headers={"Origin": EVIL}), 403)
    assert "start it with --cors-origin ORIGIN" in error["message"]
    listed = serve(ServerSettings(cors_origins=("http://localhost:3000",)))
    error = assert_error(httpx.get(listed.base + "/v1/models", headers={"Origin": EVIL}), 403)
    assert "not one of the --cors-origin origins" in error["message"]


def test_with_cors_origins_only_those_pages_may_call_and_only_with_json(serve):
    s = serve(ServerSettings(cors_origins=("http://localhost:3000",)))
    body = dict(ISSUE_27_BODY, user="csrf-victim")
    assert_error(post(s, "/v1/chat/completions", body, headers={"Origin": EVIL, "Content-Type": "text/plain"}), 403)
    assert_error(post(s, "/v1/chat/completions", body, headers={"Origin": EVIL}), 403)
    listed = {"Origin": "http://localhost:3000"}
    refused = post(s, "/v1/chat/completions", body, headers={**listed, "Content-Type": "text/plain"})
    assert_error(refused, 415)
    assert refused.headers["access-control-allow-origin"] == "http://localhost:3000"  # the page can read why
    assert stored_ids(s) == set()
    assert post(s, "/v1/chat/completions", body, headers=listed).status_code == 200
    assert stored_ids(s) == {"csrf-victim"}


def test_the_official_client_passes_the_origin_and_type_checks(server):
    c = server.client()
    assert c.chat.completions.create(model=TINY, messages=CHAT, max_tokens=2).choices
    assert c.completions.create(model=TINY, prompt="a", max_tokens=2).choices
    assert list(c.chat.completions.create(model=TINY, messages=CHAT, max_tokens=2, stream=True))


def test_serve_warns_when_other_login_accounts_could_use_it_without_a_key(serve, tmp_path, monkeypatch, capfd):
    from engine.server import accounts

    passwd = tmp_path / "passwd"
    passwd.write_text("root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534::/nonexistent:/usr/sbin/nologin\n"
                      f"me:x:{os.getuid()}:1000::/home/me:/bin/bash\nalice:x:1001:1001::/home/alice:/bin/zsh\n"
                      "svc:x:1002:1002::/srv:/bin/false\nbroken line\nbob:x:notanumber:0::/:/bin/sh\n")
    monkeypatch.setattr(accounts, "PASSWD", passwd)
    assert accounts.other_login_accounts(passwd, os.getuid()) == ["alice"]
    serve()
    err = capfd.readouterr().err
    assert "warning: 1 other login account on this machine (alice) can use this server" in err
    assert err.count("warning") == 1 and "--api-key" in err
    serve(ServerSettings(api_key="s3cret-key-1"))
    assert "warning" not in capfd.readouterr().err
    passwd.write_text("\n".join(f"u{i}:x:{2000 + i}:0::/:/bin/bash" for i in range(100_000)))
    assert len(accounts.other_login_accounts(passwd, os.getuid())) < 100_000  # read bounded


def test_a_bound_message_too_long_for_the_context_is_refused_before_it_is_stored(server):
    long = [{"role": "user", "content": "word " * 9000}]  # the tiny model reads 256 tokens
    for stream in (False, True):
        r = post(server, "/v1/chat/completions", {"model": TINY, "messages": long, "stream": stream},
                 headers={"X-Hearth-Conversation": "too-long"})
        assert assert_error(r, 400)["code"] == "context_length_exceeded"
    assert stored_ids(server) == set()
    r = post(server, "/v1/chat/completions", {"model": TINY, "messages": CHAT, "max_tokens": 2},
             headers={"X-Hearth-Conversation": "too-long"})  # the id is still usable
    assert r.status_code == 200, r.text


def test_a_prompt_longer_than_the_context_says_context_length_exceeded(server):
    with pytest.raises(openai.BadRequestError) as caught:
        server.client().chat.completions.create(model=TINY, messages=[{"role": "user", "content": "word " * 2000}])
    assert caught.value.code == "context_length_exceeded" and caught.value.param == "messages"
    r = post(server, "/v1/completions", {"model": TINY, "prompt": "word " * 2000})
    assert assert_error(r, 400, "prompt")["code"] == "context_length_exceeded"


@pytest.mark.parametrize("raw", [
    b'{"model": "tiny", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    b"[" * 100_000 + b"]" * 100_000,
    b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "response_format": {"type": '
    b'"json_schema", "json_schema": {"schema": ' + b'{"a": ' * 500 + b"{}" + b"}" * 500 + b"}}}",
    b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1' + b"0" * 5000 + b"}",
])
def test_deep_or_huge_json_is_400(server, raw):
    assert_error(post(server, "/v1/chat/completions", raw, headers={"X-Hearth-Conversation": "deep"}), 400)
    assert stored_ids(server) == set()


def test_a_lone_surrogate_is_400_and_stores_nothing(server):
    raw = b'{"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "hi \\ud800"}]}'
    for headers in ({}, {"X-Hearth-Conversation": "surrogate"}):
        error = assert_error(post(server, "/v1/chat/completions", raw, headers=headers), 400, "messages.0.content")
        assert error["type"] == "invalid_request_error"
    raw = b'{"model": "tiny", "max_tokens": 2, "prompt": "\\udfff"}'
    assert_error(post(server, "/v1/completions", raw), 400, "prompt")
    assert stored_ids(server) == set() and server.host.last_result is None


def test_seed_minus_one_is_a_random_seed_and_other_negatives_are_400(server):
    body = {"model": TINY, "messages": CHAT, "max_tokens": 2, "seed": -1}
    assert post(server, "/v1/chat/completions", body).status_code == 200
    r = post(server, "/v1/chat/completions", body, headers={"X-Hearth-Conversation": "seeded"})
    assert r.status_code == 200, r.text
    for seed in (-2, 2**64):
        bad = post(server, "/v1/chat/completions", dict(body, seed=seed, messages=CHAT + [
            {"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]},
            {"role": "user", "content": "again"}]), headers={"X-Hearth-Conversation": "seeded"})
        assert_error(bad, 400, "seed")
    from engine.api import open_conversations

    store = open_conversations(server.host.paths)
    assert [m.role for m in store.messages("seeded")] == ["user", "assistant"]
    store.close()


def test_serve_on_a_busy_port_is_one_line_and_exit_2(tiny_paths):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = cli("serve", "--data-dir", str(tiny_paths.data), "--model", TINY, "--port", str(port))
        _, err = proc.communicate(timeout=WAIT_S)
    assert proc.returncode == 2, err
    assert err == f"hearth-cli: error: port {port} is in use (another program is listening there); pick another " \
                  "with --port\n"


@pytest.mark.parametrize("poison", ["nan_rows", "finite_rows_giving_nan"])
def test_a_resealed_prompt_cache_entry_is_rebuilt_and_replaced_over_http(tiny_paths, tmp_path, poison):
    """Issue 27, item 9, for the server's prompt cache: its saved thread resealed with NaN rows, or with
    finite rows that overflow the attention. The next request of the thread gets its reply, says
    ``rebuilt`` (and serves no cached tokens it did not use), and the files are replaced by finite ones."""
    from engine.checkpoint.chain import read_chain
    from tests.checkpoint_names import as_checkpoint_file, reseal_chain
    from tests.test_sessions import saved_rows

    def chain_nan_rows(rows):  # a block's rows as [2 × layers × KV heads, n, dim]
        rows[0, 0, 0], rows[-1, -1, -1] = np.nan, np.inf

    def chain_huge_rows(rows):
        rows[:, 0, :] = np.finfo(rows.dtype).max

    messages = [{"role": "system", "content": "Rule one: be brief. Rule two: be kind."},
                {"role": "user", "content": "hello"}]
    body = {"model": TINY, "messages": messages, "max_tokens": 4, "temperature": 0}
    first = LiveServer(tiny_paths, TINY)
    try:
        reply = post(first, "/v1/chat/completions", body)
        assert reply.status_code == 200, reply.text
    finally:
        first.close()  # the thread's rows are saved at shutdown
    store = tiny_paths.checkpoints
    [prefix] = store.glob("prefix-*.hkc")  # the system prompt's chain: its blocks are the thread's first
    prefix_tokens = read_chain(prefix, 1 << 20).frontiers[-1].end
    files = sorted(store.glob("api-*.hkc"))
    assert files, "the server saved nothing"
    for f in files:  # every block the thread reads, resealed (the system prompt's too: they are shared)
        reseal_chain(store, f, chain_nan_rows if poison == "nan_rows" else chain_huge_rows)
    messages += [reply.json()["choices"][0]["message"], {"role": "user", "content": "go on"}]
    again = LiveServer(tiny_paths, TINY)
    try:
        r = post(again, "/v1/chat/completions", {**body, "messages": messages})
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"], r.text
        assert r.headers["X-Hearth-Cache"] == "rebuilt" and r.json()["hearth"]["reason"] == "non_finite"
        # nothing cached from the thread's file: at most the sound system prompt's rows (NaN rows: the
        # restore fell back to it; finite rows giving NaN: the whole prompt was prefilled again)
        assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] <= prefix_tokens
    finally:
        again.close()
    saved = sorted(store.glob("*.hkc"))
    assert {p.name.split("-")[0] for p in saved} == {"api", "prefix"}
    for path in saved:  # the thread's chain and the shared prefix: every one verifies, and holds sane rows
        assert np.abs(saved_rows(as_checkpoint_file(path))).max() < 1e6, path.name
