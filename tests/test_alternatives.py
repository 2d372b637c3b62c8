"""Regenerate keeps the earlier versions of a reply, the chosen one continues the chat, and Continue writes
on at the end of a reply stopped by the length limit: in the store (real SQLite) and through the engine
API (real ONNX Runtime, the tiny model and the real default model)."""

from __future__ import annotations

import sqlite3

import pytest

from engine.api import Hearth, resolve_paths, saved_contexts
from engine.conversations import SCHEMA_VERSION, ConversationStore, title_from
from engine.errors import ConversationError, PromptError
from engine.types import CancelToken, ResumeSource, SamplingParams, StopReason, Token, TurnRequest

GREEDY = SamplingParams.greedy_params()


@pytest.fixture
def store(tmp_path):
    s = ConversationStore(tmp_path / "c.db")
    yield s
    s.close()


def chat(store: ConversationStore, *replies: str) -> str:
    cid = store.create().id
    store.append(cid, "user", "hello")
    for r in replies:
        store.append(cid, "assistant", r)
    return cid


# the store -----------------------------------------------------------------------------------------------
def test_setting_a_reply_aside_keeps_it_as_an_earlier_version(store):
    cid = chat(store, "first")
    assert store.reply_versions(cid, 1).texts == ("first",)
    assert store.set_aside_reply(cid) == 1
    assert [m.role for m in store.messages(cid)] == ["user"]
    store.append(cid, "assistant", "second")
    store.set_aside_reply(cid)
    store.append(cid, "assistant", "third")
    versions = store.reply_versions(cid, 1)
    assert versions.texts == ("first", "second", "third") and versions.chosen == 2
    assert store.versions_count(cid) == {1: 3}


def test_choosing_a_version_makes_it_the_stored_reply_and_keeps_the_order(store):
    cid = chat(store, "first")
    store.set_aside_reply(cid)
    store.append(cid, "assistant", "second")
    assert store.choose_version(cid, 1, 0) == "first"
    assert store.messages(cid)[-1].content == "first"
    assert store.chat_messages(cid)[-1] == {"role": "assistant", "content": "first"}
    versions = store.reply_versions(cid, 1)
    assert versions.texts == ("first", "second") and versions.chosen == 0
    store.choose_version(cid, 1, 1)
    assert store.reply_versions(cid, 1).chosen == 1 and store.messages(cid)[-1].content == "second"


def test_choosing_a_version_that_does_not_exist_or_of_an_earlier_reply_is_refused(store):
    cid = chat(store, "first")
    store.set_aside_reply(cid)
    store.append(cid, "assistant", "second")
    with pytest.raises(ConversationError, match="has 2 version"):
        store.choose_version(cid, 1, 2)
    with pytest.raises(ConversationError, match="has 2 version"):
        store.choose_version(cid, 1, -1)
    store.append(cid, "user", "and then?")
    with pytest.raises(ConversationError, match="only the last reply"):
        store.choose_version(cid, 1, 0)
    assert store.messages(cid)[1].content == "second"


def test_setting_aside_a_chat_that_does_not_end_in_a_reply_is_refused(store):
    cid = chat(store)
    with pytest.raises(ConversationError, match="does not end in a reply"):
        store.set_aside_reply(cid)
    with pytest.raises(ConversationError, match="does not end in a reply"):
        store.set_aside_reply(store.create().id)


def test_a_regenerate_that_wrote_nothing_gets_its_reply_back(store):
    cid = chat(store, "first")
    seq = store.set_aside_reply(cid)
    assert store.restore_reply(cid, seq)
    assert store.messages(cid)[-1].content == "first" and store.versions_count(cid) == {}
    assert not store.restore_reply(cid, seq)  # the chat has its reply: nothing to put back


def test_editing_or_truncating_drops_the_versions_after_that_point(store):
    cid = chat(store, "a1")
    store.set_aside_reply(cid)
    store.append(cid, "assistant", "a2")
    store.append(cid, "user", "more")
    store.append(cid, "assistant", "b1")
    store.set_aside_reply(cid)
    store.append(cid, "assistant", "b2")
    assert store.versions_count(cid) == {1: 2, 3: 2}
    store.truncate(cid, 3)
    assert store.versions_count(cid) == {1: 2}
    store.edit(cid, 0, "hello again")
    assert store.versions_count(cid) == {}
    assert store.read("SELECT COUNT(*) FROM alternatives")[0][0] == 0


def test_versions_of_a_reply_never_written_again_go_when_a_message_takes_its_place(store):
    cid = chat(store, "first")
    store.set_aside_reply(cid)
    store.append(cid, "user", "never mind")  # (another process) a message where the reply was
    assert store.read("SELECT COUNT(*) FROM alternatives")[0][0] == 0


def test_deleting_a_conversation_deletes_its_versions(store):
    cid = chat(store, "first")
    store.set_aside_reply(cid)
    store.append(cid, "assistant", "second")
    store.purge([cid])
    assert store.read("SELECT COUNT(*) FROM alternatives")[0][0] == 0


def test_a_damaged_versions_table_still_gives_one_answer(store):
    cid = chat(store, "chosen")
    with sqlite3.connect(store.path) as db:  # positions with a gap, as a hand-edited file might have
        db.execute("INSERT INTO alternatives (conversation_id, seq, position, content, created_ms) "
                   "VALUES (?, 1, 0, 'zero', 0), (?, 1, 5, 'five', 0)", (cid, cid))
    versions = store.reply_versions(cid, 1)
    assert versions.texts == ("zero", "chosen", "five") and versions.chosen == 1
    assert store.choose_version(cid, 1, 2) == "five"
    assert store.reply_versions(cid, 1).texts == ("zero", "chosen", "five")


def test_an_old_database_gains_the_versions_table(tmp_path):
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as db:  # schema 4, as the previous Hearth left it
        from engine.conversations import MIGRATIONS

        for i, sql in enumerate(MIGRATIONS[:4], 1):
            db.executescript(sql + f"; PRAGMA user_version = {i};")
        db.execute("INSERT INTO conversations (id, created_ms, updated_ms) VALUES ('old', 0, 0)")
        db.execute("INSERT INTO messages (conversation_id, seq, role, content, created_ms) "
                   "VALUES ('old', 0, 'user', 'hi', 0), ('old', 1, 'assistant', 'hello', 0)")
    s = ConversationStore(path)
    try:
        assert s.read("PRAGMA user_version")[0][0] == SCHEMA_VERSION
        assert s.reply_versions("old", 1).texts == ("hello",)
    finally:
        s.close()


def test_editing_the_first_message_retitles_a_chat_whose_title_came_from_it(store):
    cid = chat(store, "reply")
    assert store.require(cid).title == "hello"
    store.edit(cid, 0, "What is a hearth?\nmore")
    assert store.require(cid).title == title_from("What is a hearth?")
    store.append(cid, "assistant", "a fireplace")
    store.rename(cid, "My own title")
    store.edit(cid, 0, "something else")
    assert store.require(cid).title == "My own title"


def test_editing_a_later_message_keeps_the_title(store):
    cid = chat(store, "reply")
    store.append(cid, "user", "second question")
    store.edit(cid, 2, "hello")  # the title came from message 0, not this one
    assert store.require(cid).title == "hello"
    store.edit(cid, 2, "other")
    assert store.require(cid).title == "hello"


def test_extending_a_reply_that_does_not_exist_is_refused(store):
    cid = chat(store, "reply")
    with pytest.raises(ConversationError, match="no reply 0"):
        store.extend_reply(cid, 0, "more")
    store.extend_reply(cid, 1, " and more")
    assert store.messages(cid)[-1].content == "reply and more"


# the engine API: regenerate -------------------------------------------------------------------------------------
def test_regenerate_keeps_the_earlier_reply_as_a_version(hearth):
    hearth.run_turn(TurnRequest("r", "hello there", GREEDY, 6), create=True)
    first = hearth.conversations.messages("r")[-1].content
    done = hearth.run_turn(TurnRequest("r", None, SamplingParams(seed=7), 6, regenerate=True))
    msgs = hearth.conversations.messages("r")
    assert [m.role for m in msgs] == ["user", "assistant"] and done.reply_seq == 1
    versions = hearth.conversations.reply_versions("r", 1)
    assert versions.texts[0] == first and versions.texts[1] == done.reply and versions.chosen == 1


def test_a_regenerate_stopped_before_its_first_word_keeps_the_last_reply(hearth):
    hearth.run_turn(TurnRequest("s", "hello there", GREEDY, 6), create=True)
    before = hearth.conversations.messages("s")
    cancel = CancelToken()
    cancel.cancel()
    done = hearth.run_turn(TurnRequest("s", None, GREEDY, 6, regenerate=True), cancel=cancel)
    assert done.reply_seq is None
    assert hearth.conversations.messages("s") == before and hearth.conversations.versions_count("s") == {}


def test_bad_regenerate_and_continue_requests_are_refused_before_anything_changes(hearth):
    hearth.run_turn(TurnRequest("b", "hello there", GREEDY, 4), create=True)
    before = hearth.conversations.messages("b")
    with pytest.raises(PromptError, match="not both"):
        hearth.run_turn(TurnRequest("b", None, GREEDY, 4, regenerate=True, continue_reply=True))
    with pytest.raises(PromptError, match="takes no new message"):
        hearth.run_turn(TurnRequest("b", "new", GREEDY, 4, regenerate=True))
    with pytest.raises(PromptError, match="takes no new message"):
        hearth.run_turn(TurnRequest("b", "new", GREEDY, 4, continue_reply=True))
    assert hearth.conversations.messages("b") == before
    hearth.conversations.truncate("b", 1)
    with pytest.raises(PromptError, match="no[a-z ]* reply|does not end in a reply"):
        hearth.run_turn(TurnRequest("b", None, GREEDY, 4, regenerate=True))
    with pytest.raises(PromptError, match="none to continue"):
        hearth.run_turn(TurnRequest("b", None, GREEDY, 4, continue_reply=True))
    assert [m.role for m in hearth.conversations.messages("b")] == ["user"]


def test_tokens_carry_the_context_in_use_as_the_reply_grows(hearth):
    events = []
    done = hearth.run_turn(TurnRequest("t", "hello there", GREEDY, 8), events.append, create=True)
    counts = [e.context_tokens for e in events if isinstance(e, Token)]
    assert counts and counts == sorted(counts) and counts[0] > done.prompt_tokens - 1
    assert counts[-1] <= done.prompt_tokens + len(done.tokens)


# the real model: the chosen version continues the chat; Continue -------------------------------------------------
@pytest.fixture
def real_hearth(real_model_home):
    service = Hearth(resolve_paths(real_model_home).ensure(), weights="int4", provider="cpu")
    service.load()
    yield service
    service.close()


@pytest.mark.parametrize("resume_from", ["memory", "disk"])
def test_the_turn_after_a_flip_answers_the_chosen_version_and_trusts_no_saved_context_past_it(real_hearth, real_home,
                                                                                             tmp_path, resume_from):
    h, convs = real_hearth, real_hearth.conversations
    h.run_turn(TurnRequest("f", "Name a colour.", GREEDY, 12), create=True)
    h.run_turn(TurnRequest("f", None, SamplingParams(seed=3, temperature=1.5), 12, regenerate=True))
    versions = convs.reply_versions("f", 1)
    assert len(versions.texts) == 2 and versions.texts[0] != versions.texts[1]
    convs.choose_version("f", 1, 0)  # back to the first reply, which the saved context no longer holds
    if resume_from == "disk":  # another chat takes the KV: the next turn restores "f" from its file
        h.run_turn(TurnRequest("other", "Hello.", GREEDY, 4), create=True)
    done = h.run_turn(TurnRequest("f", "Why that one?", GREEDY, 12))
    # The context kept is no longer than the tokens the prompts with either version share.
    engine = h._engine
    chosen = engine.encode_prompt(engine.render(convs.chat_messages("f")[:3]))
    other = engine.encode_prompt(engine.render([*convs.chat_messages("f")[:1],
                                                {"role": "assistant", "content": versions.texts[1]},
                                                *convs.chat_messages("f")[2:3]]))
    common = next(i for i, (a, b) in enumerate(zip(chosen, other, strict=False)) if a != b)
    assert 0 < done.local.resume.reused_tokens <= common
    if resume_from == "disk":
        assert done.local.resume.source in (ResumeSource.DISK, ResumeSource.COLD)
    # The answer is the one a cold start on the same stored chat gives.
    home = tmp_path / "cold"
    home.mkdir()
    for sub in ("models", "converted"):
        (home / sub).symlink_to(real_home / sub)
    cold = Hearth(resolve_paths(home).ensure(), weights="int4", provider="cpu")
    try:
        cold.load()
        store = cold.conversations
        store.create("f")
        for m in convs.messages("f")[:3]:
            store.append("f", m.role, m.content)
        again = cold.run_turn(TurnRequest("f", None, GREEDY, 12))
        assert again.local.resume.source == ResumeSource.COLD or again.local.resume.reused_tokens == 0
        assert again.reply == done.reply
    finally:
        cold.close()


def test_continue_after_the_length_limit_writes_on_in_the_same_message(real_hearth):
    h, convs = real_hearth, real_hearth.conversations
    short = h.run_turn(TurnRequest("c", "Count from one to twenty in words.", GREEDY, 8), create=True)
    assert short.stop_reason == StopReason.LENGTH
    more = h.run_turn(TurnRequest("c", None, GREEDY, 8, continue_reply=True))
    msgs = convs.messages("c")
    assert [m.role for m in msgs] == ["user", "assistant"] and more.reply_seq == 1 and more.continued
    assert msgs[-1].content == more.reply and more.reply.startswith(short.reply) and len(more.reply) > len(short.reply)
    assert more.local.resume.reused_tokens > short.prompt_tokens  # resumed, not re-read
    # One longer generation writes the same text.
    whole = h.run_turn(TurnRequest("w", "Count from one to twenty in words.", GREEDY, 16), create=True)
    assert whole.reply == more.reply


# why a reply ended (migration 7): Continue after a restart -------------------------------------------------------
def test_the_store_keeps_why_each_reply_and_each_of_its_versions_ended(store):
    cid = store.create().id
    store.append(cid, "user", "hello", finish="length")  # a person's message has no finish
    assert store.read("SELECT finish FROM messages WHERE seq = 0")[0][0] is None
    store.append(cid, "assistant", "cut", finish="length")
    assert store.continuable_reply(cid) == 1
    store.set_aside_reply(cid)  # regenerate: the new version ended by itself
    assert store.continuable_reply(cid) is None  # the chat ends in a message now
    store.append(cid, "assistant", "whole", finish="eos")
    assert store.continuable_reply(cid) is None
    assert store.choose_version(cid, 1, 0) == "cut" and store.continuable_reply(cid) == 1
    assert store.choose_version(cid, 1, 1) == "whole" and store.continuable_reply(cid) is None
    store.choose_version(cid, 1, 0)
    store.extend_reply(cid, 1, " and more", "eos")  # Continue wrote on and the reply ended by itself
    assert store.continuable_reply(cid) is None
    store.extend_reply(cid, 1, " and more", "length")
    assert store.continuable_reply(cid) == 1
    seq = store.set_aside_reply(cid)  # a regenerate that wrote nothing gives the reply back as it ended
    assert store.restore_reply(cid, seq) and store.continuable_reply(cid) == 1
    assert store.messages(cid)[-1].content == "cut and more and more"  # the version shown, not the newest position
    store.append(cid, "user", "next")
    assert store.continuable_reply(cid) is None  # only the last message can be continued


def test_an_edit_or_a_truncate_of_a_continuable_reply_clears_it(store):
    cid = store.create().id
    store.append(cid, "user", "hello")
    store.append(cid, "assistant", "cut", finish="length")
    store.edit(cid, 1, "my own words")  # the person rewrote it: it no longer ends where the model stopped
    assert store.continuable_reply(cid) is None
    store.append(cid, "user", "again")
    store.append(cid, "assistant", "cut again", finish="length")
    store.truncate(cid, 3)
    assert store.continuable_reply(cid) is None
    store.append(cid, "assistant", "written anew")  # finish not known: not offered
    assert store.continuable_reply(cid) is None
    store.set_finish(cid, 3, "length")
    assert store.continuable_reply(cid) == 3
    store.set_finish(cid, 3, None)
    assert store.continuable_reply(cid) is None


def test_setting_why_a_missing_reply_ended_is_refused(store):
    cid = chat(store)
    with pytest.raises(ConversationError, match="no reply 0"):
        store.set_finish(cid, 0, "length")  # a person's message
    with pytest.raises(ConversationError, match="no reply 5"):
        store.set_finish(cid, 5, "length")
    assert store.continuable_reply("no-such-chat") is None


def test_a_database_of_the_previous_schema_gains_the_finish_of_replies(tmp_path):
    path = tmp_path / "v6.db"
    from engine.conversations import MIGRATIONS

    with sqlite3.connect(path) as db:  # schema 6, as the previous Hearth left it, with a kept version
        for i, sql in enumerate(MIGRATIONS[:6], 1):
            db.executescript(sql + f"; PRAGMA user_version = {i};")
        db.execute("INSERT INTO conversations (id, created_ms, updated_ms) VALUES ('old', 0, 0)")
        db.execute("INSERT INTO messages (conversation_id, seq, role, content, created_ms) "
                   "VALUES ('old', 0, 'user', 'hi', 0), ('old', 1, 'assistant', 'hello', 0)")
        db.execute("INSERT INTO alternatives (conversation_id, seq, position, content, created_ms) "
                   "VALUES ('old', 1, 0, 'earlier', 0)")
    s = ConversationStore(path)
    try:
        assert s.read("PRAGMA user_version")[0][0] == SCHEMA_VERSION == 11
        assert s.messages("old")[-1].content == "hello" and s.continuable_reply("old") is None
        assert s.choose_version("old", 1, 0) == "earlier" and s.reply_versions("old", 1).texts == ("earlier", "hello")
        s.set_finish("old", 1, "length")
        assert s.continuable_reply("old") == 1
    finally:
        s.close()


def test_a_turn_stores_why_its_reply_ended_and_continue_updates_it(hearth):
    convs = hearth.conversations
    short = hearth.run_turn(TurnRequest("len", "hello there", GREEDY, 3), create=True)
    assert short.stop_reason == StopReason.LENGTH and convs.continuable_reply("len") == 1
    reopened = ConversationStore(convs.path)  # another process (a restart) sees it too
    try:
        assert reopened.continuable_reply("len") == 1
    finally:
        reopened.close()
    cancel = CancelToken()
    cancel.cancel()
    hearth.run_turn(TurnRequest("len", None, GREEDY, 3, continue_reply=True), cancel=cancel)
    assert convs.continuable_reply("len") == 1  # stopped before a word: still cut where it was
    more = hearth.run_turn(TurnRequest("len", None, GREEDY, 3, continue_reply=True))
    assert more.stop_reason == StopReason.LENGTH and convs.continuable_reply("len") == 1
    assert convs.messages("len")[-1].content == more.reply
    convs.set_finish("len", 1, "eos")  # as if it had ended by itself
    assert convs.continuable_reply("len") is None


def test_a_reply_cut_off_by_closing_is_stored_as_interrupted_and_can_be_continued(hearth):
    cancel, pieces = CancelToken(), []

    def close_after_a_few_words(event) -> None:  # what the window's close does mid-stream
        if isinstance(event, Token):
            pieces.append(event.text)
            if len(pieces) == 3:
                cancel.interrupt()

    cut = hearth.run_turn(TurnRequest("cut", "hello there", GREEDY, 40), close_after_a_few_words, cancel, create=True)
    convs = hearth.conversations
    assert cut.stop_reason == StopReason.INTERRUPTED and cut.reply
    assert convs.reply_facts("cut")[1].finish == "interrupted" and convs.continuable_reply("cut") == 1
    more = hearth.run_turn(TurnRequest("cut", None, GREEDY, 3, continue_reply=True))
    assert convs.messages("cut")[-1].content == more.reply and more.reply.startswith(cut.reply)
    stopped = CancelToken()
    stopped.cancel()  # the person stopped it first: closing afterwards does not make it "interrupted"
    stopped.interrupt()
    assert stopped.cancelled and not stopped.interrupted


# after ‹ ›: the chat's tokens with the version chosen --------------------------------------------------------------
def test_after_a_flip_the_chats_tokens_are_counted_with_the_chosen_version(hearth):
    convs = hearth.conversations
    first = hearth.run_turn(TurnRequest("v", "hello there", GREEDY, 6), create=True)
    hearth.run_turn(TurnRequest("v", None, SamplingParams(seed=5, temperature=1.5), 12, regenerate=True))
    live = saved_contexts(hearth).context_states()["v"].tokens
    convs.choose_version("v", 1, 0)
    counted = hearth.note_version_chosen("v")
    engine = hearth._engine
    chat = convs.chat_messages("v")
    expected = engine.encode_prompt(engine.render(chat[:-1]) + chat[-1]["content"])
    assert counted.conversation == "v" and counted.tokens == len(expected)
    assert abs(counted.tokens - len(first.tokens) - first.prompt_tokens) <= 1  # the first turn's size again
    assert counted.kept is not None and counted.kept < live and counted.to_reread == counted.tokens - counted.kept
    assert saved_contexts(hearth).context_states()["v"].tokens == counted.tokens  # the sidebar's figure, until the next turn
    done = hearth.run_turn(TurnRequest("v", "and then?", GREEDY, 4))
    assert saved_contexts(hearth).context_states()["v"].tokens == done.context_tokens != counted.tokens


def test_a_flip_in_a_chat_that_is_not_live_counts_without_kept_tokens(hearth):
    hearth.run_turn(TurnRequest("n", "hello there", GREEDY, 4), create=True)
    hearth.run_turn(TurnRequest("n", None, SamplingParams(seed=5, temperature=1.5), 8, regenerate=True))
    hearth.run_turn(TurnRequest("other", "hi", GREEDY, 2), create=True)  # the live context is another chat's now
    hearth.conversations.choose_version("n", 1, 0)
    counted = hearth.note_version_chosen("n")
    assert counted.kept is None and counted.to_reread is None and counted.tokens > 0
    assert saved_contexts(hearth).context_states()["n"].tokens == counted.tokens


def test_counting_a_chats_tokens_needs_a_model_and_a_chat_that_exists(hearth, tmp_path):
    with pytest.raises(ConversationError, match="no conversation 'missing'"):
        hearth.note_version_chosen("missing")
    unloaded = Hearth(resolve_paths(tmp_path / "empty").ensure())
    try:
        from engine.errors import ModelNotLoadedError

        with pytest.raises(ModelNotLoadedError):
            unloaded.note_version_chosen("any")
    finally:
        unloaded.close()
