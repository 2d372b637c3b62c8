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


# attachments: stored with their message, gone with it -------------------------------------------------------------
def _with_file(store: ConversationStore, cid: str, typed: str = "what does it say?"):
    from engine.documents import attachment_from_text, compose_message

    doc = attachment_from_text("notes.md", "# Notes\nline", "markdown")
    store.create(cid)
    store.append(cid, "user", compose_message(typed, [doc]), attachments=(doc,), typed_text=typed)
    store.append(cid, "assistant", "it says notes")
    return doc


def test_attachments_are_stored_with_their_message_and_survive_reopening(tmp_path):
    from engine.documents import compose_message

    store = ConversationStore(tmp_path / "c.db")
    doc = _with_file(store, "a")
    store.close()
    again = ConversationStore(tmp_path / "c.db")
    user, reply = again.messages("a")
    assert (user.attachments, user.typed_text, user.content) == ((doc,), "what does it say?",
                                                                 compose_message("what does it say?", [doc]))
    assert (reply.attachments, reply.typed_text) == ((), "it says notes")
    assert again.attachments("a", 0) == (doc,) and again.attachments("a", 1) == ()
    assert again.get("a").title == "what does it say?"  # not the "[File: …]" line
    assert again.chat_messages("a")[0]["content"] == user.content  # the model reads the composed text


def test_attachments_go_with_a_truncate_a_purge_and_a_delete(tmp_path):
    store = ConversationStore(tmp_path / "c.db")
    count = lambda: store.read("SELECT COUNT(*) FROM attachments")[0][0]  # noqa: E731
    _with_file(store, "t")
    _with_file(store, "p")
    _with_file(store, "d")
    assert count() == 3
    store.truncate("t", 0)
    assert count() == 2 and store.messages("t") == []
    store.purge(["p"])
    assert count() == 1
    store.delete("d")
    assert count() == 0


def test_a_duplicate_carries_the_attachments(tmp_path):
    store = ConversationStore(tmp_path / "c.db")
    doc = _with_file(store, "src")
    copy = store.duplicate("src", upto_seq=0)
    (user,) = store.messages(copy.id)
    assert (user.attachments, user.typed_text) == ((doc,), "what does it say?")
    store.delete("src")  # the copy's own rows, not references to the source's
    assert store.messages(copy.id)[0].attachments == (doc,)


def test_editing_a_message_with_files_keeps_or_replaces_them(tmp_path):
    from engine.documents import attachment_from_text, compose_message

    store = ConversationStore(tmp_path / "c.db")
    doc = _with_file(store, "e")
    store.edit("e", 0, "summarise it")
    (user,) = store.messages("e")
    assert (user.content, user.typed_text, user.attachments) == (compose_message("summarise it", [doc]),
                                                                 "summarise it", (doc,))
    assert store.get("e").title == "summarise it"
    other = attachment_from_text("other.txt", "other text")
    store.edit("e", 0, "and this?", attachments=(other,))
    assert store.messages("e")[0].attachments == (other,)
    store.edit("e", 0, "no files now", attachments=())
    (user,) = store.messages("e")
    assert (user.content, user.typed_text, user.attachments) == ("no files now", "no files now", ())
    assert store.read("SELECT COUNT(*) FROM attachments")[0][0] == 0


def test_only_a_user_message_carries_attachments(tmp_path):
    from engine.documents import attachment_from_text

    store = ConversationStore(tmp_path / "c.db")
    store.create("r")
    with pytest.raises(ConversationError, match="only a user message"):
        store.append("r", "assistant", "x", attachments=(attachment_from_text("a.txt", "a"),))
    assert store.messages("r") == []


def test_a_schema_8_database_is_upgraded_to_keep_attachments(tmp_path):
    from engine.db_schema import MIGRATIONS

    path = tmp_path / "old.sqlite3"
    db = sqlite3.connect(path)
    db.executescript(";".join(MIGRATIONS[:8]) + "; PRAGMA user_version = 8;")
    db.execute("INSERT INTO conversations (id, title, created_ms, updated_ms) VALUES ('old', 'Old', 1, 1)")
    db.execute("INSERT INTO messages (conversation_id, seq, role, content, created_ms) VALUES ('old', 0, 'user', 'hi', 1)")
    db.commit()
    db.close()
    store = ConversationStore(path, backup_before_upgrade=False)
    (m,) = store.messages("old")
    assert (m.content, m.typed_text, m.attachments) == ("hi", "hi", ())
    _with_file(store, "new")
    assert store.messages("new")[0].attachments


def test_documents_lists_every_file_of_a_chat_once(tmp_path):
    from engine.documents import attachment_from_text, compose_message

    store = ConversationStore(tmp_path / "c.db")
    doc = _with_file(store, "docs")
    other = attachment_from_text("second.txt", "more")
    store.append("docs", "user", compose_message("and", [other, doc]), attachments=(other, doc), typed_text="and")
    assert store.documents("docs") == (doc, other)
    store.create("none")
    store.append("none", "user", "no files")
    assert store.documents("none") == ()
