"""The remote backend against a real second Hearth (its own data dir) over real HTTP on 127.0.0.1: chat and
streaming, the server's cached tokens on the second turn, Stop, regenerate and Continue, per-chat model memory,
a refused key, an unknown model, a full queue's 429 with Retry-After, an unreachable port, and a server killed
mid-reply (a real ``hearth-cli serve`` process, SIGKILLed)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest

from engine.api import (
    ModelLibrary,
    RemoteBackend,
    RemoteError,
    RemoteRegistry,
    RemoteServer,
    open_remote,
    remote_models,
    resolve_paths,
)
from engine.backends.remote_http import RemoteBusyError, RemoteKeyError, RemoteModelError, RemoteStoppedError
from engine.server.config import ServerSettings
from engine.types import CancelToken, SamplingParams, StopReason, Token, TurnRequest

from .server_helpers import LiveServer

GREEDY = SamplingParams.greedy_params()
TINY = "tiny"
KEY = "sk-live-test-key-42"


@pytest.fixture
def peer_paths(tiny_home, tiny_gguf):
    paths = resolve_paths(tiny_home).ensure()
    ModelLibrary(paths).add(tiny_gguf)
    return paths


@pytest.fixture
def live(peer_paths):
    server = LiveServer(peer_paths, TINY)
    yield server
    server.close()


@pytest.fixture
def front(tmp_path):
    return resolve_paths(tmp_path / "front").ensure()


def remote(front, base, key=None, **kw) -> RemoteBackend:
    return RemoteBackend(front, RemoteServer("peer", base, key is not None), key, **kw)


def turn(backend, text, cid="c", tokens=8, cancel=None, on_event=None, **kw):
    return backend.run_turn(TurnRequest(cid, text, GREEDY, tokens, **kw), on_event, cancel, create=True)


def test_a_chat_streams_is_stored_and_the_second_turn_hits_the_servers_cache(live, front):
    backend = remote(front, live.base, model=TINY)
    try:
        info = backend.load()
        assert (info.name, info.provider, info.key, info.note) == (TINY, "remote", "peer/tiny", "served by peer")
        pieces = []
        first = turn(backend, "hello there", on_event=lambda e: pieces.append(e.text) if isinstance(e, Token) else 0)
        assert first.reply == "".join(pieces) and first.reply and first.prompt_tokens > 0
        second = turn(backend, "and again")
        assert second.server_cached_tokens is not None and second.server_cached_tokens > 0  # Hearth reports it
        assert second.server_cached_tokens <= second.prompt_tokens
        convs = backend.conversations
        assert [m.role for m in convs.messages("c")] == ["user", "assistant", "user", "assistant"]
        assert convs.model_key("c") == "peer/tiny"  # per-chat model memory: the chat remembers NAME/MODEL
    finally:
        backend.close()


def test_stop_regenerate_and_continue(live, front):
    backend = remote(front, live.base, model=TINY)
    try:
        backend.load()
        cancel = CancelToken()
        done = turn(backend, "write a long reply", tokens=64, cancel=cancel,
                    on_event=lambda e: cancel.cancel() if isinstance(e, Token) else None)
        assert done.stop_reason == StopReason.CANCELLED and done.reply
        assert backend.conversations.messages("c")[-1].content == done.reply
        again = backend.run_turn(TurnRequest("c", None, GREEDY, 8, regenerate=True))
        versions = backend.conversations.reply_versions("c", again.reply_seq)
        assert len(versions.texts) == 2 and versions.texts[versions.chosen] == again.reply  # a new version
        short = turn(backend, "count to twenty", cid="d", tokens=2)
        assert short.stop_reason == StopReason.LENGTH
        more = backend.run_turn(TurnRequest("d", None, GREEDY, 4, continue_reply=True))
        assert more.continued and more.reply.startswith(short.reply) and len(more.reply) > len(short.reply)
        assert backend.conversations.messages("d")[-1].content == more.reply
        assert [m.role for m in backend.conversations.messages("d")] == ["user", "assistant"]
    finally:
        backend.close()


def test_a_shared_store_is_used_and_not_closed(live, front):
    from engine.api import open_conversations

    store = open_conversations(front)
    backend = remote(front, live.base, model=TINY, conversations=store)
    backend.load()
    turn(backend, "hi")
    backend.close()
    assert [m.role for m in store.messages("c")] == ["user", "assistant"]  # still open
    store.close()


def test_a_wrong_key_is_refused_plainly_and_the_right_one_works(peer_paths, front):
    server = LiveServer(peer_paths, TINY, ServerSettings(api_key=KEY))
    try:
        wrong = remote(front, server.base, "sk-wrong-key", model=TINY)
        with pytest.raises(RemoteKeyError) as refused:
            wrong.load()
        assert "server peer refused the API key (401" in str(refused.value)
        assert "sk-wrong-key" not in str(refused.value) and KEY not in str(refused.value)
        wrong.close()
        right = remote(front, server.base, KEY, model=TINY)
        right.load()
        assert turn(right, "hello").reply
        right.close()
    finally:
        server.close()


def test_an_unknown_model_and_an_unreachable_port(live, front):
    backend = remote(front, live.base, model="no-such-model")
    with pytest.raises(RemoteModelError, match="server peer has no model 'no-such-model' \\(it lists .*tiny"):
        backend.load()
    backend.close()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    dead = remote(front, f"http://127.0.0.1:{port}", model=TINY)
    with pytest.raises(RemoteError, match=f"server peer cannot be reached at http://127.0.0.1:{port}"):
        dead.load()
    dead.close()


def test_a_full_queue_answers_429_with_retry_after(peer_paths, front):
    """Hearth's own bounded queue (engine/server/pending.py) says when to come back; the remote backend waits
    that long once, then says the server is busy."""
    from concurrent.futures import ThreadPoolExecutor

    server = LiveServer(peer_paths, TINY, ServerSettings(max_queue=1))
    try:
        body = {"model": TINY, "messages": [{"role": "user", "content": "a long story"}], "max_tokens": 2000,
                "temperature": 1.5, "top_k": 0, "top_p": 1.0, "min_p": 0.0}

        def post(_i: int) -> httpx.Response:
            return httpx.post(server.base + "/v1/chat/completions", json=body, timeout=60)

        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(post, range(8)))
        busy = [r for r in answers if r.status_code == 429]
        assert busy and all(r.headers["retry-after"].isdigit() for r in busy)
        assert "busy" in busy[0].json()["error"]["message"]
        hot = SamplingParams(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0)

        def through_backend(i: int) -> object:
            backend = remote(front, server.base, model=TINY)
            try:
                backend.load()
                return backend.complete([{"role": "user", "content": f"story {i}"}], hot, 2000)
            except RemoteBusyError as exc:  # retried once after Retry-After, then said plainly
                return exc
            finally:
                backend.close()

        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(through_backend, range(8)))
        assert any(not isinstance(r, Exception) for r in results)
        assert all(str(r).startswith("server peer is busy (429") for r in results if isinstance(r, Exception))
    finally:
        server.close()


def test_open_remote_and_remote_models(live, front):
    registry = RemoteRegistry(front.data)
    registry.add("peer", live.base)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    registry.add("gone", f"http://127.0.0.1:{port}")
    assert open_remote(front, "tiny") is None and open_remote(front, "other/tiny") is None
    backend = open_remote(front, "peer/tiny")
    assert backend is not None and backend.model is None and backend.model_key == "peer/tiny"
    assert backend.load().key == "peer/tiny"
    backend.close()
    started = time.monotonic()
    listed = dict((s.name, models) for s, models in remote_models(front, timeout_s=2))
    assert time.monotonic() - started < 10
    assert [m.name for m in listed["peer"]] == ["peer/tiny"] and listed["peer"][0].source == "remote"
    assert isinstance(listed["gone"], str) and "server gone cannot be reached" in listed["gone"]


def test_a_server_killed_mid_reply_keeps_what_arrived(peer_paths, front):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "HEARTH_HOME": str(peer_paths.data)}
    proc = subprocess.Popen([sys.executable, "-m", "engine.cli", "serve", "--model", TINY, "--port", str(port),
                             "--provider", "cpu"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(base + "/v1/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, "the serve process did not start"
            time.sleep(0.2)
        backend = remote(front, base, model=TINY)
        backend.load()
        seen = []

        def kill_after_some(event):
            if isinstance(event, Token):
                seen.append(event.text)
                if len(seen) == 1:
                    proc.send_signal(signal.SIGKILL)

        hot = SamplingParams(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0, seed=7)  # a long reply: EOS is rare
        with pytest.raises(RemoteStoppedError, match="connection to server peer broke mid-reply.*characters that "
                                                     "arrived are kept"):
            backend.run_turn(TurnRequest("c", "tell me a long story", hot, 4000), kill_after_some, create=True)
        reply = backend.conversations.messages("c")[-1]
        assert reply.role == "assistant" and reply.content.startswith(seen[0])
        assert [m.role for m in backend.conversations.messages("c")] == ["user", "assistant"]
        assert backend.conversations.reply_facts("c")[reply.seq].finish == "interrupted"
        backend.close()
    finally:
        proc.kill()
        proc.wait(30)
