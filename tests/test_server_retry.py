"""A bound conversation whose client went away mid-reply, retried over real HTTP on 127.0.0.1 (the real
model: a reply long enough to be cut off while it streams)."""

from __future__ import annotations

import json

import httpx
import pytest

from engine.api import ModelLibrary, open_conversations, resolve_paths
from tests.server_helpers import LiveServer
from tests.test_server import WAIT_S, wait_until


def streamed(s: LiveServer, body: dict, headers: dict, chunks: int | None = None) -> tuple[str, str | None]:
    """(the text, the finish_reason) of a streamed chat reply; ``chunks``: close the connection after that
    many, as a client that gives up does."""
    text, finish = "", None
    with httpx.stream("POST", s.base + "/v1/chat/completions", json=body, headers=headers, timeout=WAIT_S) as r:
        assert r.status_code == 200, r.read()
        seen = 0
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            choice = json.loads(line[6:])["choices"][0]
            text += choice["delta"].get("content") or ""
            finish = choice["finish_reason"] or finish
            seen += 1
            if chunks is not None and seen >= chunks:
                break
    return text, finish


@pytest.mark.real_model
def test_a_bound_request_the_client_gave_up_on_is_answered_again_and_the_cut_reply_kept(real_model_home):
    """Issue 27: the retry of a request cut off mid-stream got 400 "this request's message 2 differs from the
    stored one" (the request has one message), so that conversation id was stuck."""
    paths = resolve_paths(real_model_home).ensure()
    model = ModelLibrary(paths).default_name()
    s = LiveServer(paths, model)
    try:
        body = {"model": model, "messages": [{"role": "user", "content": "Tell me a very long story."}],
                "max_tokens": 300, "temperature": 0, "stream": True}
        headers = {"X-Hearth-Conversation": "dc1"}
        streamed(s, body, headers, chunks=4)
        wait_until(lambda: s.host.last_result is not None, "the cut-off generation to end")
        assert s.host.last_result.finish_reason == "cancelled"
        s.host.last_result = None
        text, finish = streamed(s, body, headers)  # the very same request
        assert finish in ("stop", "length") and text
        store = open_conversations(paths)
        try:
            shown = [(m.role, m.content) for m in store.messages("dc1")]
            versions = store.reply_versions("dc1", 1)
            finishes = store.reply_facts("dc1")
        finally:
            store.close()
        assert shown == [("user", "Tell me a very long story."), ("assistant", text)]
        partial = versions.texts[0]
        assert len(versions.texts) == 2 and versions.chosen == 1 and partial and len(partial) < len(text)
        assert finishes[1].finish in ("eos", "length")
    finally:
        s.close()
