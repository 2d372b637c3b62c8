"""A conversation remembers the model it was last used with (schema 4: ``model_key``), and a database
made before that keeps everything it held."""

from __future__ import annotations

import sqlite3

from engine.conversations import MIGRATIONS, ConversationStore


def schema_3_database(path) -> None:
    """A database exactly as Hearth made it at schema 3, holding a conversation, a trashed one and an import."""
    db = sqlite3.connect(path)
    for version, script in enumerate(MIGRATIONS[:3], start=1):
        db.executescript(script + f"; PRAGMA user_version = {version};")
    db.executescript("""
        INSERT INTO conversations (id, title, system_prompt, settings, model, created_ms, updated_ms)
            VALUES ('old', 'Rivers', 'Be brief.', '{"temperature": 0.2}', 'SmolLM2-135M-Instruct.Q4_1 int4', 1, 2);
        INSERT INTO messages (conversation_id, seq, role, content, created_ms) VALUES ('old', 0, 'user', 'hello', 1);
        INSERT INTO messages (conversation_id, seq, role, content, created_ms) VALUES ('old', 1, 'assistant', 'hi', 2);
        INSERT INTO conversations (id, title, created_ms, updated_ms, deleted_ms) VALUES ('binned', 'gone', 1, 1, 5);
    """)
    db.commit()
    db.close()


def test_migration_4_adds_the_model_key_and_keeps_the_data(tmp_path):
    path = tmp_path / "c.sqlite3"
    schema_3_database(path)
    store = ConversationStore(path)
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS) >= 4  # later migrations run too
    conv = store.require("old")
    assert (conv.title, conv.system_prompt, conv.settings, conv.model) == (
        "Rivers", "Be brief.", {"temperature": 0.2}, "SmolLM2-135M-Instruct.Q4_1 int4")
    assert [(m.role, m.content) for m in store.messages("old")] == [("user", "hello"), ("assistant", "hi")]
    assert store.trashed() == ["binned"] and store.ids() == {"old", "binned"}
    assert store.model_key("old") == ""  # nothing remembered yet: the default model answers
    (summary,) = store.summaries()
    assert summary["model_key"] == "" and summary["messages"] == 2
    assert [r[0] for r in store.read("SELECT rowid FROM message_fts WHERE message_fts MATCH 'hello'")]  # search too
    store.close()
    assert ConversationStore(path).model_key("old") == ""  # reopening migrates nothing twice


def test_a_turn_records_the_model_and_a_branch_inherits_it(tmp_path):
    store = ConversationStore(tmp_path / "c.sqlite3")
    store.create("c")
    store.append("c", "user", "hello")
    store.set_model("c", "tiny int4", "/models/tiny.gguf")
    assert store.model_key("c") == "/models/tiny.gguf" and store.require("c").model == "tiny int4"
    store.set_model("c", "another label")  # the label alone: the key stays
    assert store.model_key("c") == "/models/tiny.gguf" and store.require("c").model == "another label"
    branch = store.duplicate("c")
    assert store.model_key(branch.id) == "/models/tiny.gguf"
    assert store.model_key("no-such-chat") == ""
