"""The server's prompt cache across a restart, over real HTTP through the official client, on the real
default model: a long system prompt and five turns, the server stopped and started again, and the next
request resumes from disk with the same reply a cold server gives; a damaged saved context is reported
and rebuilt, with the same reply."""

from __future__ import annotations

import pytest

from engine.api import resolve_paths
from engine.model.fetch import default_model

from .checkpoint_names import chain_block_paths
from .server_helpers import LiveServer

MODEL = default_model().key
RULES = " ".join(f"Rule {i}: when asked about topic {i}, answer in one short sentence and stay polite." for i in range(70))


@pytest.fixture
def paths(real_model_home):
    return resolve_paths(real_model_home).ensure()


def ask(server: LiveServer, messages: list[dict]):
    raw = server.client().chat.completions.with_raw_response.create(model=MODEL, messages=messages, max_tokens=8,
                                                                     temperature=0)
    reply = raw.parse()
    return reply, raw.headers


def conversation(server: LiveServer, turns: int) -> tuple[list[dict], int]:
    """A system prompt of ~1,500 tokens and ``turns`` turns, each resending everything; (messages, the last
    request's prompt tokens)."""
    messages = [{"role": "system", "content": RULES}]
    prompt = 0
    for i in range(turns):
        messages.append({"role": "user", "content": f"Tell me about topic {i}."})
        reply, _ = ask(server, messages)
        prompt = reply.usage.prompt_tokens
        messages.append({"role": "assistant", "content": reply.choices[0].message.content})
    return messages, prompt


def test_after_a_restart_the_next_request_resumes_from_disk_with_the_cold_reply(paths, tmp_path, real_home):
    server = LiveServer(paths, MODEL)
    try:
        messages, last_prompt = conversation(server, 5)
        assert last_prompt > 1500
    finally:
        server.close()
    messages.append({"role": "user", "content": "And topic 42?"})
    again = LiveServer(paths, MODEL)  # a new process's worth of state: only the disk remembers
    try:
        reply, headers = ask(again, messages)
    finally:
        again.close()
    assert reply.usage.prompt_tokens_details.cached_tokens >= last_prompt
    assert reply.hearth["source"] == "disk" and headers["X-Hearth-Cache"] == "disk"  # type: ignore[attr-defined]
    cold_home = tmp_path / "cold"
    cold_home.mkdir()
    for sub in ("models", "converted"):
        (cold_home / sub).symlink_to(real_home / sub)
    cold = LiveServer(resolve_paths(cold_home).ensure(), MODEL)
    try:
        fresh, _ = ask(cold, messages)
    finally:
        cold.close()
    assert fresh.hearth["source"] == "cold"  # type: ignore[attr-defined]
    assert reply.choices[0].message.content == fresh.choices[0].message.content


def test_a_damaged_saved_context_is_reported_and_rebuilt_with_the_same_reply(paths):
    server = LiveServer(paths, MODEL)
    try:
        messages, _ = conversation(server, 2)
    finally:
        server.close()
    chains = sorted(paths.checkpoints.glob("api-*.hkc"))
    assert chains, "the server saved nothing"
    files = sorted({b for c in chains for b in chain_block_paths(paths.checkpoints, c)})
    for f in files:  # flip a byte inside every block the saved records use
        data = bytearray(f.read_bytes())
        data[len(data) // 2] ^= 0x40
        f.write_bytes(bytes(data))
    messages.append({"role": "user", "content": "And topic 7?"})
    again = LiveServer(paths, MODEL)
    try:
        reply, headers = ask(again, messages)
        clean, _ = ask(again, messages)  # the rebuilt context is live now: the same request, cleanly
    finally:
        again.close()
    assert reply.hearth["source"] == "rebuilt" and reply.hearth["reason"]  # type: ignore[attr-defined]
    assert headers["X-Hearth-Cache"] == "rebuilt"
    assert reply.choices[0].message.content == clean.choices[0].message.content
