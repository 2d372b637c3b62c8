"""A chat longer than the model's context, under each context policy: "stop" refuses with the numbers and
stores nothing; "drop_oldest" keeps answering from the system prompt and the newest messages, never
changes what is stored, keeps reusing the live KV, and finds the same view after a restart. Real ONNX
Runtime on the tiny synthetic model (256-token context) and SmolLM2, real SQLite, real checkpoint files."""

from __future__ import annotations

import pytest

from engine.api import Hearth, resolve_paths, saved_contexts
from engine.errors import ContextFullError, ContextPolicyError
from engine.types import Accepted, Finished, Resumed, ResumeSource, SamplingParams, TurnRequest

GREEDY = SamplingParams.greedy_params()
SYSTEM = "You are a helpful assistant who answers briefly and kindly."  # longer than a shared-prefix file's minimum
REPLY = 16


def open_hearth(home, gguf, context_length: int | None = None) -> Hearth:
    service = Hearth(resolve_paths(home).ensure(), model=str(gguf), provider="cpu", context_length=context_length)
    service.load()
    # The tiny model re-reads a few hundred tokens faster than any disk, so the adaptive resume would
    # never restore; restore whatever is usable, as a real model on a CPU does.
    service._sessions.adaptive = False
    return service


@pytest.fixture
def hearth(tiny_home, tiny_gguf):
    service = open_hearth(tiny_home, tiny_gguf)
    yield service
    service.close()


def turn(hearth: Hearth, cid: str, text: str, **request) -> tuple[Accepted, Finished]:
    events = []
    done = hearth.run_turn(TurnRequest(cid, text, GREEDY, REPLY, **request), events.append)
    accepted = next(e for e in events if isinstance(e, Accepted))
    resumed = next(e for e in events if isinstance(e, Resumed))
    assert accepted.dropped_messages == resumed.dropped_messages == done.dropped_messages
    return accepted, done


def kv_text(hearth: Hearth) -> bytes:
    engine = hearth._require_engine()
    return b"".join(engine.tokenizer.token_bytes(t) for t in engine.tokens)


def view_text(hearth: Hearth, cid: str, dropped: int) -> bytes:
    """The rendered prompt of the chat's last turn as the model should read it: the system prompt, then
    the stored messages after the first ``dropped``, up to the last user message."""
    chat = hearth.conversations.chat_messages(cid)
    body = chat[1:]
    last_user = max(i for i, m in enumerate(body) if m["role"] == "user")
    return hearth._require_engine().render(chat[:1] + body[dropped : last_user + 1]).encode()


# stop ----------------------------------------------------------------------------------------------------
def test_stop_refuses_a_chat_past_the_context_with_the_numbers_and_stores_nothing(hearth):
    hearth.conversations.create("s", system_prompt=SYSTEM)
    with pytest.raises(ContextFullError) as refused:
        for i in range(20):
            turn(hearth, "s", f"message number {i} says hello")
    error = refused.value
    assert error.limit == 256 and error.tokens >= 256 and error.policy == "stop"
    assert str(error) == (f"This chat is {error.tokens:,} tokens, but the model reads at most 256. Start a new "
                          "chat (it keeps the system prompt) or let this chat drop its oldest messages.")
    stored = hearth.conversations.messages("s")
    assert stored[-1].role == "assistant" and f"message number {i}" not in [m.content for m in stored]
    assert hearth.view_window("s", REPLY) == 0  # nothing is left out under stop
    # answering what is stored (after an edit) is refused the same way, before any model work
    hearth.conversations.edit("s", stored[-2].seq, "word " * 300)
    hearth.conversations.truncate("s", stored[-1].seq)
    with pytest.raises(ContextFullError, match="This chat is"):
        hearth.run_turn(TurnRequest("s", None, GREEDY, REPLY))
    assert len(hearth.conversations.messages("s")) == len(stored) - 1


def test_the_chat_setting_wins_over_the_callers_default(hearth):
    hearth.conversations.create("c", settings={"context_policy": "stop"})
    with pytest.raises(ContextFullError):
        for i in range(20):
            turn(hearth, "c", f"message number {i} says hello", context_policy="drop_oldest")
    hearth.conversations.create("d")  # no setting of its own: the caller's default applies
    for i in range(8):
        _, done = turn(hearth, "d", f"message number {i} says hello", context_policy="drop_oldest")
    assert done.dropped_messages > 0


# bad values ---------------------------------------------------------------------------------------------
def test_an_unknown_policy_is_a_clear_error_and_nothing_is_stored(hearth):
    hearth.conversations.create("bad", settings={"context_policy": "sometimes"})
    with pytest.raises(ContextPolicyError, match=r"this chat's setting .* is 'sometimes', which is not one of: "
                                                 r"stop, drop_oldest"):
        turn(hearth, "bad", "hello")
    assert hearth.conversations.messages("bad") == []
    with pytest.raises(ContextPolicyError, match="is 'sometimes'"):
        hearth.view_window("bad")
    hearth.conversations.create("ok")
    with pytest.raises(ContextPolicyError, match=r"the default .* is 'never', which is not one of"):
        turn(hearth, "ok", "hello", context_policy="never")
    with pytest.raises(ContextPolicyError, match="is 42"):
        hearth.conversations.set_settings("ok", {"context_policy": 42})
        turn(hearth, "ok", "hello")
    assert hearth.conversations.messages("ok") == []


def test_a_message_that_cannot_fit_even_alone_is_refused_under_drop_oldest(hearth):
    hearth.conversations.create("long", system_prompt=SYSTEM, settings={"context_policy": "drop_oldest"})
    turn(hearth, "long", "a short first message")
    with pytest.raises(ContextFullError) as refused:
        turn(hearth, "long", "word " * 300)
    assert refused.value.policy == "drop_oldest" and refused.value.tokens >= 256
    assert str(refused.value).startswith(f"Your message and the system prompt are {refused.value.tokens:,} tokens, "
                                         "but the model reads at most 256.")
    assert len(hearth.conversations.messages("long")) == 2


# drop_oldest ----------------------------------------------------------------------------------------------
def drive(hearth: Hearth, cid: str, turns: int, switch: bool) -> list[Finished]:
    """Turns on a drop_oldest chat, checking each; ``switch``: another chat takes the live KV before each."""
    convs = hearth.conversations
    convs.create(cid, system_prompt=SYSTEM, settings={"context_policy": "drop_oldest"})
    if convs.get("other") is None:
        convs.create("other", settings={"context_policy": "drop_oldest"})
    done = []
    for i in range(turns):
        if switch:
            turn(hearth, "other", f"other chat {i}")
        _, finished = turn(hearth, cid, f"message number {i} says hello")
        assert finished.reply and finished.local.resume.source != ResumeSource.REBUILT
        stored = convs.messages(cid)
        assert len(stored) == 2 * (i + 1) and stored[0].content == "message number 0 says hello"  # never changed
        assert finished.dropped_messages % 2 == 0 and stored[finished.dropped_messages].role == "user"
        assert kv_text(hearth).startswith(view_text(hearth, cid, finished.dropped_messages))  # system prompt first
        done.append(finished)
    dropped = [d.dropped_messages for d in done]
    assert dropped == sorted(dropped) and dropped[-1] > 0
    return done


def drop_turns(done: list[Finished]) -> list[int]:
    return [i for i in range(1, len(done)) if done[i].dropped_messages > done[i - 1].dropped_messages]


def test_drop_oldest_keeps_answering_from_the_newest_messages_and_reuses_the_live_kv(hearth, tiny_home, tiny_gguf):
    done = drive(hearth, "a", 14, switch=False)
    drops = drop_turns(done)
    assert drops and len(drops) < len(done) // 2  # hysteresis: a drop leaves room for the next few turns
    for i in range(1, len(done)):
        resume = done[i].local.resume
        assert resume.source == ResumeSource.LIVE
        if i in drops:  # the live KV is cut back to the system prompt (and what the new view shares with it)
            assert 0 < resume.reused_tokens < min(done[i].prompt_tokens, done[i - 1].prompt_tokens)
        else:  # the view did not move: everything up to the new message is reused
            assert resume.reused_tokens >= done[i - 1].prompt_tokens

    # a fresh service on the same data dir finds the same view and restores it from disk
    hearth.close()
    again = open_hearth(tiny_home, tiny_gguf)
    try:
        assert again.view_window("a", REPLY) == done[-1].dropped_messages
        events = []
        resume = again.open_conversation("a", events.append, max_new_tokens=REPLY)
        assert resume.source == ResumeSource.DISK and resume.restored_tokens >= done[-1].prompt_tokens
        assert [e.dropped_messages for e in events if isinstance(e, Resumed)] == [done[-1].dropped_messages]
        _, after = turn(again, "a", "and one more")
        assert after.local.resume.source == ResumeSource.LIVE and after.local.resume.reused_tokens > 0
    finally:
        again.close()


def test_after_a_drop_the_system_prompt_comes_from_the_shared_prefix_file(hearth):
    done = drive(hearth, "a", 12, switch=True)
    drops = drop_turns(done)
    assert drops
    shared = {done[i].local.resume.restored_tokens for i in drops}
    for i in range(1, len(done)):
        resume = done[i].local.resume
        assert resume.source == ResumeSource.DISK
        if i in drops:  # the chat's file held the old view; only the system prompt's file starts the new one
            assert len(shared) == 1 and 16 <= resume.restored_tokens < done[i].prompt_tokens
        else:
            assert resume.restored_tokens >= done[i - 1].prompt_tokens
    assert saved_contexts(hearth).context_status("a").health.value == "valid"  # saved again for the new view


def test_the_view_depends_on_the_context_length_and_the_longest_reply(hearth, tiny_home, tiny_gguf):
    hearth.conversations.create("v", system_prompt=SYSTEM, settings={"context_policy": "drop_oldest"})
    for i in range(6):
        turn(hearth, "v", f"message number {i} says hello")
    wide = hearth.view_window("v", REPLY)
    hearth.close()
    small = open_hearth(tiny_home, tiny_gguf, context_length=160)
    try:
        narrow = small.view_window("v", REPLY)
        assert narrow > wide
        assert small.view_window("v", 40) >= narrow  # more room kept for the reply: no more messages fit
        assert small.view_window("v", REPLY, context_policy="stop") == narrow  # the chat's own setting wins
    finally:
        small.close()


@pytest.mark.real_model
def test_smollm_keeps_chatting_past_a_small_context(real_model_home):
    """SmolLM2 (a real BPE vocabulary and chat template) on a 192-token context: it keeps answering, every
    drop after another chat had the KV restores the system prompt's file, and a restart finds the view."""
    paths = resolve_paths(real_model_home).ensure()
    service = Hearth(paths, weights="int4", provider="cpu", context_length=192)
    service.load()
    convs = service.conversations
    convs.create("r", system_prompt="You are a friendly assistant. Answer in one short sentence, please.",
                 settings={"context_policy": "drop_oldest"})
    convs.create("other", settings={"context_policy": "drop_oldest"})
    done = []
    try:
        for i, question in enumerate(["What is the capital of France?", "And of Italy?", "Name a red fruit.",
                                      "What colour is the sky?", "How many legs has a cat?", "Name a planet.",
                                      "What is two plus two?", "Say hello in Spanish.", "Name a big animal.",
                                      "What do bees make?"]):
            if i % 2:
                turn(service, "other", question)
            _, finished = turn(service, "r", question)
            assert finished.reply.strip() and finished.local.resume.source != ResumeSource.REBUILT
            assert kv_text(service).startswith(view_text(service, "r", finished.dropped_messages))
            done.append(finished)
        assert done[-1].dropped_messages > 0 and len(convs.messages("r")) == 2 * len(done)
        for i in drop_turns(done):
            if i % 2:  # "other" had the KV: the system prompt comes from its shared-prefix file
                assert done[i].local.resume.source == ResumeSource.DISK and 16 <= done[i].local.resume.restored_tokens
            else:
                assert done[i].local.resume.source == ResumeSource.LIVE and done[i].local.resume.reused_tokens > 0
    finally:
        service.close()
    again = Hearth(paths, weights="int4", provider="cpu", context_length=192)
    again.load()
    try:
        events = []
        resume = again.open_conversation("r", events.append, max_new_tokens=REPLY)
        assert resume.source == ResumeSource.DISK and resume.restored_tokens >= done[-1].prompt_tokens
        assert [e.dropped_messages for e in events if isinstance(e, Resumed)] == [done[-1].dropped_messages]
    finally:
        again.close()
