"""The remote backend against the wire shapes of each engine (tests/fixtures/remote_wire: vLLM, SGLang,
llama.cpp's server, Ollama, a loose SSE stream) and against bad servers (a huge line, non-JSON, an endless
stream, the wrong content type, HTML error pages, 401, 404, 429 with Retry-After), replayed over real HTTP on
127.0.0.1 by tests/remote_replay.py. The real servers are in test_remote_backend.py."""

from __future__ import annotations

import itertools
import json
import threading
import time

import pytest

from engine.api import RemoteBackend, RemoteError, RemoteServer, resolve_paths
from engine.backends import remote_http, remote_wire
from engine.backends.remote_http import RemoteBusyError, RemoteKeyError, RemoteModelError, RemoteStoppedError, retry_after
from engine.errors import PromptError
from engine.types import CancelToken, SamplingParams, StopReason, Token, TurnRequest

from .remote_replay import Answer, ReplayServer, transcript

GREEDY = SamplingParams.greedy_params()
KEY = "sk-wire-test-0123456789"


@pytest.fixture
def replay():
    server = ReplayServer()
    yield server
    server.close()


@pytest.fixture
def backend(replay, tmp_path):
    made = RemoteBackend(resolve_paths(tmp_path / "front"), RemoteServer("w", replay.base, True), KEY, model="m",
                         timeout_s=5)
    made.load()
    yield made
    made.close()


def turn(backend, text="hi", cancel=None, on_event=None, **kw):
    return backend.run_turn(TurnRequest("c", text, GREEDY, 16, **kw), on_event, cancel, create=True)


def finish_of(backend, cid="c") -> str | None:
    last = backend.conversations.messages(cid)[-1]
    return backend.conversations.reply_facts(cid)[last.seq].finish


def sse(*chunks: dict | str) -> bytes:
    return b"".join(f"data: {c if isinstance(c, str) else json.dumps(c)}\n\n".encode() for c in chunks)


def piece(text: str, finish: str | None = None) -> dict:
    return {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}]}


@pytest.mark.parametrize("name", ["vllm.txt", "sglang.txt", "llamacpp.txt", "ollama.txt", "loose.txt"])
def test_each_engines_stream_gives_the_reply_the_stop_and_the_cached_tokens(replay, backend, name):
    expect, body = transcript(name)
    replay.answers.append(Answer(body=body))
    tokens = []
    done = turn(backend, on_event=lambda e: tokens.append(e.text) if isinstance(e, Token) else None)
    assert done.reply == expect["reply"] == "".join(tokens)
    assert done.stop_reason == StopReason(expect["stop"])
    cached = None if expect["cached"] == "None" else int(expect["cached"])
    assert done.server_cached_tokens == cached and done.prompt_tokens == int(expect["prompt"])
    assert done.local is None and done.model.provider == "remote" and done.model.key == "w/m"
    stored = backend.conversations.messages("c")
    assert [(m.role, m.content) for m in stored] == [("user", "hi"), ("assistant", expect["reply"])]
    sent = replay.requests[-1]  # what Hearth sent: the stored chat, the model's id, a stream with usage
    assert sent["model"] == "m" and sent["stream"] and sent["stream_options"] == {"include_usage": True}
    assert sent["messages"] == [{"role": "user", "content": "hi"}] and sent["temperature"] == 0.0
    assert replay.headers[-1]["Authorization"] == f"Bearer {KEY}"


def test_the_second_turn_sends_the_first_unchanged(replay, backend):
    replay.answers += [Answer(body=transcript("vllm.txt")[1]), Answer(body=transcript("vllm.txt")[1])]
    turn(backend, "one")
    turn(backend, "two")
    first, second = replay.requests[-2]["messages"], replay.requests[-1]["messages"]
    assert second[:len(first)] == first and second[len(first)] == {"role": "assistant", "content": "Hello there!"}


def test_a_huge_line_is_refused_and_what_came_before_is_kept(replay, backend):
    huge = b"data: " + b"x" * (remote_wire.MAX_LINE_BYTES + 10) + b"\n\n"
    replay.answers.append(Answer(body=[sse(piece("kept")), huge]))
    with pytest.raises(RemoteStoppedError, match="longer than 1 MiB.*characters that arrived are kept"):
        turn(backend)
    assert backend.conversations.messages("c")[-1].content == "kept"
    assert finish_of(backend) == "interrupted"  # Continue writes on from there


def test_non_json_data_is_said_plainly(replay, backend):
    replay.answers.append(Answer(body=b"data: <b>oops</b>\n\n"))
    with pytest.raises(RemoteError, match="server w sent something that is not JSON"):
        turn(backend)
    assert [m.role for m in backend.conversations.messages("c")] == ["user"]  # the message stays; no empty reply


def test_an_endless_stream_is_bounded_and_stop_ends_it(replay, backend, monkeypatch):
    replay.answers.append(Answer(body=(sse(piece("la ")) for _ in itertools.count()), pause_s=0.001))
    cancel = CancelToken()
    count = 0

    def stop_after_some(event):
        nonlocal count
        if isinstance(event, Token):
            count += 1
            if count == 50:
                cancel.cancel()

    done = turn(backend, cancel=cancel, on_event=stop_after_some)
    assert done.stop_reason == StopReason.CANCELLED and done.reply.startswith("la la")
    assert backend.conversations.messages("c")[-1].content == done.reply
    monkeypatch.setattr(remote_wire, "MAX_REPLY_CHARS", 3000)  # no Stop: the reply's bound ends it
    replay.answers.append(Answer(body=(sse(piece("la ")) for _ in itertools.count())))
    with pytest.raises(RemoteStoppedError, match="reply longer than"):
        backend.run_turn(TurnRequest("d", "again", GREEDY, 16), create=True)
    assert 2900 < len(backend.conversations.messages("d")[-1].content) <= 3000


def test_stop_while_the_server_is_silent_returns_at_once(replay, backend):
    def silent():
        yield sse(piece("a"))
        time.sleep(4)  # a long prefill, or a stuck server: nothing comes
        yield sse(piece("b", "stop"))

    replay.answers.append(Answer(body=silent()))
    cancel = CancelToken()
    threading.Timer(0.5, cancel.cancel).start()
    started = time.monotonic()
    done = turn(backend, cancel=cancel)
    assert time.monotonic() - started < 2.5 and done.stop_reason == StopReason.CANCELLED and done.reply == "a"


def test_a_silent_server_times_out_per_chunk(replay, tmp_path):
    def stalls():
        yield sse(piece("slow "))
        time.sleep(3)  # longer than the read timeout below
        yield sse(piece("end", "stop"))

    made = RemoteBackend(resolve_paths(tmp_path / "t"), RemoteServer("w", replay.base), None, model="m", timeout_s=1)
    made.load()
    replay.answers.append(Answer(body=stalls()))
    with pytest.raises(RemoteStoppedError, match="broke mid-reply \\(nothing came for 1 s\\).*5 characters"):
        turn(made)
    made.close()


def test_a_server_that_stops_mid_reply_keeps_what_arrived(replay, backend):
    replay.answers.append(Answer(body=sse(piece("half a "))))  # the connection closes: no finish_reason, no [DONE]
    with pytest.raises(RemoteStoppedError, match="stopped mid-reply.*7 characters that arrived are kept"):
        turn(backend)
    reply = backend.conversations.messages("c")[-1]
    assert (reply.role, reply.content, finish_of(backend)) == ("assistant", "half a ", "interrupted")
    replay.answers.append(Answer(body=sse(piece("reply.", "stop"), "[DONE]")))
    done = backend.run_turn(TurnRequest("c", None, GREEDY, 16, continue_reply=True))  # Continue writes on
    assert done.reply == "half a reply." and done.continued
    sent = replay.requests[-1]
    assert sent["messages"][-1] == {"role": "assistant", "content": "half a "} and sent["continue_final_message"]
    assert backend.conversations.messages("c")[-1].content == "half a reply."


def test_an_error_event_mid_stream(replay, backend):
    replay.answers.append(Answer(body=sse(piece("so"), {"error": {"message": "engine died", "code": 500}})))
    with pytest.raises(RemoteStoppedError, match="failed mid-reply: engine died.*2 characters"):
        turn(backend)


def test_wrong_content_type_and_html_pages(replay, backend):
    replay.answers.append(Answer(body=b"hello", content_type="text/plain"))
    with pytest.raises(RemoteError, match="did not answer with a stream"):
        turn(backend)
    page = b"<!DOCTYPE html><html><body><h1>502 Bad Gateway</h1></body></html>"
    replay.answers.append(Answer(502, page, "text/html"))
    with pytest.raises(RemoteError, match=r"server w failed \(502\): it answered with a web page"):
        turn(backend, "again")
    replay.answers.append(Answer(200, page, "text/html"))
    with pytest.raises(RemoteError, match="content type text/html.*web page"):
        turn(backend, "and again")


def test_a_whole_json_answer_to_a_stream_request_is_read(replay, backend):
    whole = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "whole"}, "finish_reason": "stop"}],
             "usage": {"prompt_tokens": 3, "prompt_tokens_details": {"cached_tokens": 2}}}
    replay.answers.append(Answer(body=json.dumps(whole).encode(), content_type="application/json"))
    done = turn(backend)
    assert (done.reply, done.server_cached_tokens) == ("whole", 2)


def test_refused_key_unknown_model_and_bad_request(replay, backend):
    replay.answers.append(Answer(401, json.dumps({"error": {"message": f"bad key {KEY}"}}).encode(), "application/json"))
    with pytest.raises(RemoteKeyError) as refused:
        turn(backend)
    assert "server w refused the API key (401" in str(refused.value) and KEY not in str(refused.value)  # echo blotted
    replay.answers.append(Answer(404, b'{"error": {"message": "The model `m` does not exist."}}', "application/json"))
    with pytest.raises(RemoteModelError, match="server w has no model 'm'"):
        turn(backend, "b")
    replay.answers.append(Answer(400, b'{"error": {"message": "context too long"}}', "application/json"))
    with pytest.raises(PromptError, match="refused the request \\(400\\): context too long"):
        turn(backend, "c")


def test_busy_is_retried_once_after_retry_after(replay, backend):
    replay.answers += [Answer(429, b'{"error": {"message": "busy"}}', "application/json", {"Retry-After": "1"}),
                       Answer(body=sse(piece("ok", "stop"), "[DONE]"))]
    started = time.monotonic()
    assert turn(backend).reply == "ok" and time.monotonic() - started >= 0.9
    replay.answers += [Answer(503, b"down", "text/plain", {"Retry-After": "0"}),
                       Answer(429, b"still busy", "text/plain", {"Retry-After": "0"})]
    with pytest.raises(RemoteBusyError, match="server w is busy \\(429: still busy\\)"):
        turn(backend, "again")


def test_retry_after_is_bounded():
    assert retry_after(None) == remote_http.DEFAULT_RETRY_WAIT_S and retry_after("2") == 2.0
    assert retry_after("3600") == remote_http.MAX_RETRY_WAIT_S and retry_after("-5") == 0.0
    assert retry_after("soon") == remote_http.DEFAULT_RETRY_WAIT_S and retry_after("nan") == 1.0
    assert 0 <= retry_after("Wed, 21 Oct 2015 07:28:00 GMT") <= remote_http.MAX_RETRY_WAIT_S


def test_the_model_list_is_bounded_and_read_for_context_lengths(tmp_path):
    models = [{"id": "big", "max_model_len": 131072}, {"id": "gguf", "meta": {"n_ctx_train": 8192}}, {"id": "bare"},
              {"id": "\x1b[31mevil"}, {"id": "x" * 300}, "junk", {"id": 5}]
    models += [{"id": f"m{i}"} for i in range(remote_wire.MAX_MODELS + 50)]
    replay = ReplayServer(models)
    try:
        made = RemoteBackend(resolve_paths(tmp_path / "f"), RemoteServer("lab", replay.base), None)
        listed = made.list_models()
        assert [m.name for m in listed[:3]] == ["lab/big", "lab/gguf", "lab/bare"] and listed[0].title == "big"
        assert [m.context_length for m in listed[:3]] == [131072, 8192, 0]
        assert len(listed) <= remote_wire.MAX_MODELS and all(m.title.isprintable() for m in listed)
        assert made.load().key == "lab/big"  # no model named: the first listed
        assert made.switch_model("lab/gguf").context_length == 8192 and made.model_key == "lab/gguf"
        with pytest.raises(RemoteModelError, match="server lab has no model 'nope' \\(it lists big, gguf"):
            made.switch_model("lab/nope")
        assert made.model_key == "lab/gguf"  # a failed switch keeps the model
        made.close()
    finally:
        replay.close()


def test_a_model_list_that_is_not_one(tmp_path):
    replay = ReplayServer()
    replay.models = None  # /v1/models answers {"data": null}
    try:
        made = RemoteBackend(resolve_paths(tmp_path / "f"), RemoteServer("lab", replay.base), None)
        with pytest.raises(RemoteError, match="did not list its models"):
            made.load()
        made.close()
    finally:
        replay.close()


def test_no_proxy_from_the_environment_sees_the_key(replay, backend, monkeypatch):
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")  # would refuse every request, were it used
    replay.answers.append(Answer(body=sse(piece("direct", "stop"), "[DONE]")))
    assert turn(backend).reply == "direct"


def test_sse_lines_and_events_edge_cases():
    chunks = [b"data: {\"a\"", b": 1}\r", b"\n\r\ndata:{\"b\":2}\r\rdata: [DONE]\r\rdata: {\"c\": 3}\n\n"]
    assert list(remote_wire.events(remote_wire.lines(chunks, "s"), "s")) == [{"a": 1}, {"b": 2}]
    with pytest.raises(RemoteError, match="not a JSON object"):
        list(remote_wire.events(["data: [1, 2]", ""], "s"))
    assert remote_wire.body_message(500, "", b"") == "HTTP 500 with no explanation"
    assert remote_wire.body_message(400, "application/json", b'{"detail": "bad"}') == "bad"  # FastAPI's shape
    assert remote_wire.body_message(500, "text/plain", b"a\nb\x1b " * 200).endswith("…")


def test_a_continue_stopped_before_a_word_keeps_the_reply_as_it_was(replay, backend):
    replay.answers.append(Answer(body=sse(piece("cut at the", "length"), "[DONE]")))
    assert turn(backend).stop_reason == StopReason.LENGTH

    def silent():
        time.sleep(3)
        yield sse(piece(" end", "stop"))

    replay.answers.append(Answer(body=silent()))
    cancel = CancelToken()
    threading.Timer(0.3, cancel.cancel).start()
    done = backend.run_turn(TurnRequest("c", None, GREEDY, 16, continue_reply=True), cancel=cancel)
    assert done.stop_reason == StopReason.CANCELLED and done.reply == "cut at the"
    assert finish_of(backend) == "length"  # still offered for Continue, as before the Stop


def test_regenerate_that_writes_nothing_gives_the_last_reply_back(replay, backend):
    replay.answers.append(Answer(body=sse(piece("first", "stop"), "[DONE]")))
    turn(backend)
    replay.answers.append(Answer(500, b'{"error": {"message": "boom"}}', "application/json"))
    with pytest.raises(RemoteError, match="server w failed \\(500\\): boom"):
        backend.run_turn(TurnRequest("c", None, GREEDY, 16, regenerate=True))
    assert backend.conversations.messages("c")[-1].content == "first"
    replay.answers.append(Answer(body=sse(piece("second", "stop"), "[DONE]")))
    again = backend.run_turn(TurnRequest("c", None, GREEDY, 16, regenerate=True))
    assert backend.conversations.reply_versions("c", again.reply_seq).texts == ("first", "second")


def test_an_endless_keep_alive_stream_is_bounded_too(replay, backend, monkeypatch):
    monkeypatch.setattr(remote_wire, "MAX_STREAM_BYTES", 1 << 16)
    replay.answers.append(Answer(body=(b": keep-alive\n\n" for _ in itertools.count())))
    with pytest.raises(RemoteError, match="sent more than 0.0625 MiB for one reply"):
        turn(backend)
    assert [m.role for m in backend.conversations.messages("c")] == ["user"]
