"""A reasoning model's thinking over real HTTP, apart from its answer: ``message.reasoning_content`` and
``delta.reasoning_content`` on the OpenAI side, ``thinking`` blocks and ``thinking_delta`` events on
Anthropic's. The model is a tiny random network with DeepSeek-R1-distill's real template, whose
generation prompt opens the thinking block (``<think>\\n``): what it writes is thinking until ``</think>``."""

from __future__ import annotations

import json

import anthropic
import httpx
import pytest

from engine.api import ModelLibrary, resolve_paths
from engine.model.synthetic import SyntheticSpec, write_synthetic_gguf
from tests.chat_models import TEMPLATES
from tests.server_helpers import LiveServer

NAME = "r1-tiny"
WAIT_S = 300
ASK = [{"role": "user", "content": "Why is the sky blue?"}]


@pytest.fixture(scope="module")
def thinker(tmp_path_factory):
    spec = SyntheticSpec(architecture="qwen3", head_dim=32, seed=5, context_length=1024, user_tokens=("<think>", "</think>"),
                         chat_template=(TEMPLATES / "deepseek-r1-distill-qwen.jinja").read_text(encoding="utf-8"))
    root = tmp_path_factory.mktemp("thinker")
    paths = resolve_paths(root / "home").ensure()
    assert ModelLibrary(paths).add(write_synthetic_gguf(root / f"{NAME}.gguf", spec)).name == NAME
    s = LiveServer(paths, NAME)
    yield s
    s.close()


def openai_stream(s: LiveServer, body: dict) -> tuple[str, str]:
    reasoning = content = ""
    with httpx.stream("POST", s.base + "/v1/chat/completions", json={**body, "stream": True}, timeout=WAIT_S) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: {"):
                delta = json.loads(line[6:])["choices"][0]["delta"]
                reasoning += delta.get("reasoning_content") or ""
                content += delta.get("content") or ""
    return reasoning, content


def test_thinking_comes_as_reasoning_content_streamed_or_not(thinker):
    body = {"messages": ASK, "max_tokens": 40, "temperature": 0}
    whole = httpx.post(thinker.base + "/v1/chat/completions", json=body, timeout=WAIT_S).json()
    message = whole["choices"][0]["message"]
    assert message["reasoning_content"]  # the prompt opened the block: the reply starts in it
    assert "<think>" not in (message["content"] or "") and "</think>" not in message["reasoning_content"]
    assert openai_stream(thinker, body) == (message["reasoning_content"], message["content"] or "")


def test_thinking_is_a_thinking_block_through_the_anthropic_client(thinker):
    c = anthropic.Anthropic(base_url=thinker.base, api_key="none", max_retries=0, timeout=WAIT_S)
    whole = c.messages.create(model=NAME, max_tokens=40, messages=ASK, extra_body={"temperature": 0})
    assert whole.content[0].type == "thinking" and whole.content[0].thinking and whole.content[0].signature == ""
    openai = httpx.post(thinker.base + "/v1/chat/completions", json={"messages": ASK, "max_tokens": 40, "temperature": 0},
                        timeout=WAIT_S).json()["choices"][0]["message"]
    assert whole.content[0].thinking == openai["reasoning_content"]
    with c.messages.stream(model=NAME, max_tokens=40, messages=ASK, extra_body={"temperature": 0}) as stream:
        thinking = "".join(e.thinking for e in stream if e.type == "thinking")
        final = stream.get_final_message()
    assert thinking == whole.content[0].thinking
    assert [b.type for b in final.content] == [b.type for b in whole.content]


def test_a_thinking_turn_in_the_history_is_accepted_both_ways(thinker):
    history = [*ASK, {"role": "assistant", "content": "Rayleigh scattering.", "reasoning_content": "Light scatters."},
               {"role": "user", "content": "And sunsets?"}]
    r = httpx.post(thinker.base + "/v1/chat/completions", json={"messages": history, "max_tokens": 4}, timeout=WAIT_S)
    assert r.status_code == 200, r.text
    blocks = [*ASK, {"role": "assistant", "content": [{"type": "thinking", "thinking": "Light scatters.", "signature": "x"},
                                                      {"type": "text", "text": "Rayleigh scattering."}]},
              {"role": "user", "content": "And sunsets?"}]
    r = httpx.post(thinker.base + "/v1/messages", json={"max_tokens": 4, "messages": blocks}, timeout=WAIT_S)
    assert r.status_code == 200, r.text

