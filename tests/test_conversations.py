"""The SQLite conversation store: messages, titles, edits, deletion, schema versions, bad databases."""

from __future__ import annotations

import sqlite3

import pytest

from engine.conversations import SCHEMA_VERSION, ConversationError, ConversationStore, check_id, title_from


def test_messages_titles_and_order(tmp_path):
    store = ConversationStore(tmp_path / "c.sqlite3")
    conv = store.create("chat-1", system_prompt="Be brief.")
    store.append(conv.id, "user", "  \nWhat is the tallest mountain on Earth, and how was it measured?\n")
    store.append(conv.id, "assistant", "Everest.")
    got = store.require(conv.id)
    assert got.title.startswith("What is the tallest mountain") and got.title.endswith("…") and len(got.title) == 60
    assert store.chat_messages(conv.id) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "  \nWhat is the tallest mountain on Earth, and how was it measured?\n"},
        {"role": "assistant", "content": "Everest."},
    ]
    store.rename(conv.id, "  Mountains ")
    assert store.require(conv.id).title == "Mountains"
    assert [c.id for c in store.list()] == ["chat-1"]


def test_edit_drops_the_replies_that_followed(tmp_path):
    store = ConversationStore(tmp_path / "c.sqlite3")
    cid = store.create().id
    for role, text in (("user", "a"), ("assistant", "b"), ("user", "c"), ("assistant", "d")):
        store.append(cid, role, text)
    store.edit(cid, 2, "c, edited")
    assert [m.content for m in store.messages(cid)] == ["a", "b", "c, edited"]
    assert store.truncate(cid, 1) == 2
    with pytest.raises(ConversationError, match="no message 7"):
        store.edit(cid, 7, "x")


def test_delete_cascades_to_messages(tmp_path):
    store = ConversationStore(tmp_path / "c.sqlite3")
    cid = store.create().id
    store.append(cid, "user", "hello")
    assert store.delete(cid) and not store.delete(cid)
    assert store.messages(cid) == [] and store.get(cid) is None


def test_text_survives_reopening_and_is_shared_between_connections(tmp_path):
    path = tmp_path / "c.sqlite3"
    a, b = ConversationStore(path), ConversationStore(path)
    cid = a.create("shared").id
    a.append(cid, "user", "visible to the other side ✓")
    assert b.chat_messages(cid)[-1]["content"] == "visible to the other side ✓"
    a.close()
    b.close()
    assert ConversationStore(path).messages("shared")[0].content.endswith("✓")
    assert sqlite3.connect(path).execute("PRAGMA journal_mode").fetchone()[0] == "wal"


@pytest.mark.parametrize("bad", ["", "-leading-dash", "has space", "x" * 129, "slash/inside", "ünïcode"])
def test_bad_conversation_ids_are_refused(bad):
    with pytest.raises(ConversationError, match="invalid conversation id"):
        check_id(bad)


def test_bad_calls_name_the_problem(tmp_path):
    store = ConversationStore(tmp_path / "c.sqlite3")
    store.create("x")
    with pytest.raises(ConversationError, match="already exists"):
        store.create("x")
    with pytest.raises(ConversationError, match="role 'robot'"):
        store.append("x", "robot", "beep")
    with pytest.raises(ConversationError, match="no conversation 'y'"):
        store.append("y", "user", "hello")
    with pytest.raises(ConversationError, match="no conversation 'y'"):
        store.rename("y", "t")
    assert store.messages("x") == []  # nothing half-written


def test_a_database_from_a_newer_hearth_is_refused(tmp_path):
    path = tmp_path / "c.sqlite3"
    ConversationStore(path).close()
    db = sqlite3.connect(path)
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.close()
    with pytest.raises(ConversationError, match="newer Hearth"):
        ConversationStore(path)


def test_a_file_that_is_not_a_database_gives_a_clear_error(tmp_path):
    path = tmp_path / "c.sqlite3"
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(ConversationError, match="is damaged .*no backup.*db salvage"):
        ConversationStore(path)


def test_schema_is_created_at_the_current_version(tmp_path):
    path = tmp_path / "c.sqlite3"
    ConversationStore(path).close()
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


def test_title_from_skips_blank_lines():
    assert title_from("\n\n  short  \nmore") == "short"
