"""The conversation database's schema: its migrations (the version is their count), the roles and ids its
rows may hold, and a title from a first message. Below the store, its recovery and its salvage, which all
read it."""

from __future__ import annotations

import re

ROLES = ("system", "user", "assistant", "tool")
ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")
TITLE_CHARS = 60

MIGRATIONS: list[str] = [
    # 1: conversations and their messages
    """
    CREATE TABLE conversations (
        id TEXT PRIMARY KEY,
        title TEXT NOT NULL DEFAULT '',
        system_prompt TEXT NOT NULL DEFAULT '',
        settings TEXT NOT NULL DEFAULT '{}',
        model TEXT NOT NULL DEFAULT '',
        created_ms INTEGER NOT NULL,
        updated_ms INTEGER NOT NULL
    );
    CREATE TABLE messages (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        conversation_id TEXT NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
        seq INTEGER NOT NULL,
        role TEXT NOT NULL CHECK (role IN ('system', 'user', 'assistant')),
        content TEXT NOT NULL,
        created_ms INTEGER NOT NULL,
        UNIQUE (conversation_id, seq)
    );
    CREATE INDEX conversations_by_update ON conversations(updated_ms DESC);
    """,
    # 2: full-text search over titles and messages (FTS5, external content: the text is stored once),
    # kept in step by triggers; deleted_ms marks a conversation deleted but still undoable.
    """
    ALTER TABLE conversations ADD COLUMN deleted_ms INTEGER;
    CREATE VIRTUAL TABLE message_fts USING fts5(content, content='messages', content_rowid='id',
                                                tokenize='unicode61 remove_diacritics 2');
    CREATE VIRTUAL TABLE title_fts USING fts5(title, content='conversations', content_rowid='rowid',
                                              tokenize='unicode61 remove_diacritics 2');
    INSERT INTO message_fts(rowid, content) SELECT id, content FROM messages;
    INSERT INTO title_fts(rowid, title) SELECT rowid, title FROM conversations;
    CREATE TRIGGER messages_fts_insert AFTER INSERT ON messages BEGIN
        INSERT INTO message_fts(rowid, content) VALUES (new.id, new.content);
    END;
    CREATE TRIGGER messages_fts_delete AFTER DELETE ON messages BEGIN
        INSERT INTO message_fts(message_fts, rowid, content) VALUES ('delete', old.id, old.content);
    END;
    CREATE TRIGGER messages_fts_update AFTER UPDATE OF content ON messages BEGIN
        INSERT INTO message_fts(message_fts, rowid, content) VALUES ('delete', old.id, old.content);
        INSERT INTO message_fts(rowid, content) VALUES (new.id, new.content);
    END;
    CREATE TRIGGER titles_fts_insert AFTER INSERT ON conversations BEGIN
        INSERT INTO title_fts(rowid, title) VALUES (new.rowid, new.title);
    END;
    CREATE TRIGGER titles_fts_delete AFTER DELETE ON conversations BEGIN
        INSERT INTO title_fts(title_fts, rowid, title) VALUES ('delete', old.rowid, old.title);
    END;
    CREATE TRIGGER titles_fts_update AFTER UPDATE OF title ON conversations BEGIN
        INSERT INTO title_fts(title_fts, rowid, title) VALUES ('delete', old.rowid, old.title);
        INSERT INTO title_fts(rowid, title) VALUES (new.rowid, new.title);
    END;
    CREATE INDEX messages_by_conversation ON messages(conversation_id, seq);
    """,
    # 3: imports land in batches; a conversation whose import_id is still in ``imports`` belongs to an
    # import under way and is hidden, so an import is all or nothing for whoever is looking.
    """
    ALTER TABLE conversations ADD COLUMN import_id TEXT;
    CREATE TABLE imports (id TEXT PRIMARY KEY, started_ms INTEGER NOT NULL, beat_ms INTEGER NOT NULL);
    CREATE INDEX conversations_by_import ON conversations(import_id) WHERE import_id IS NOT NULL;
    """,
    # 4: the model a conversation was last used with, as what runs it: a library name or a GGUF path
    # (``model`` keeps its label in words, for display). '' until a turn records one.
    """
    ALTER TABLE conversations ADD COLUMN model_key TEXT NOT NULL DEFAULT '';
    """,
    # 5: earlier versions of a reply kept when it is regenerated. ``messages`` holds the version the chat
    # continues with; this table the others. Every version of a reply has a position (0 = the first one
    # written); the chosen one's is the position missing here.
    """
    CREATE TABLE alternatives (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        conversation_id TEXT NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
        seq INTEGER NOT NULL,
        position INTEGER NOT NULL,
        content TEXT NOT NULL,
        created_ms INTEGER NOT NULL,
        UNIQUE (conversation_id, seq, position)
    );
    """,
    # 6: a chat pinned to the top of the sidebar; pinning is not activity, so it never touches updated_ms.
    """
    ALTER TABLE conversations ADD COLUMN pinned INTEGER NOT NULL DEFAULT 0;
    """,
    # 7: why a reply ended, as the turn that last wrote it said (a StopReason value), for the chat's reply and
    # each kept version: a reply the length limit stopped offers Continue after a restart too. NULL when not
    # known (rows from before, imports of exports from before, a reply the person edited).
    """
    ALTER TABLE messages ADD COLUMN finish TEXT;
    ALTER TABLE alternatives ADD COLUMN finish TEXT;
    """,
    # 8: the model that wrote each reply (and each kept version), in words, so the chat can say so after a
    # restart; NULL when not known (rows from before, imports of exports from before, a reply the person edited).
    """
    ALTER TABLE messages ADD COLUMN model TEXT;
    ALTER TABLE alternatives ADD COLUMN model TEXT;
    """,
    # 9: files attached to a user message (engine/documents.py), kept with it: the name, size, SHA-256, kind,
    # pages and extracted text, so nothing depends on the original file. They go with their message (a
    # truncate, an edit that drops it, the conversation's purge: ON DELETE CASCADE). ``typed_text`` is the
    # person's own words when the message has attachments (``content`` is the composed text the model reads);
    # NULL: the content is the typed text.
    """
    CREATE TABLE attachments (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        message_id INTEGER NOT NULL REFERENCES messages(id) ON DELETE CASCADE,
        position INTEGER NOT NULL,
        name TEXT NOT NULL,
        size INTEGER NOT NULL,
        sha256 TEXT NOT NULL,
        kind TEXT NOT NULL,
        pages INTEGER,
        text TEXT NOT NULL,
        UNIQUE (message_id, position)
    );
    ALTER TABLE messages ADD COLUMN typed_text TEXT;
    """,
    # 10: agents' turns (issue 30). A message may be a tool's result (role 'tool', with the ``tool_call_id`` it
    # answers and the tool's ``name``); a reply may carry the model's thinking (``reasoning``, and how long it
    # thought, ``thought_ms``) and the calls it made (``tool_calls``: the JSON text of OpenAI's list,
    # engine/tool_messages.py). SQLite cannot widen a CHECK in place, so the table is built again with the
    # same ids, which the search index and the attachments refer to (the store runs migrations with foreign
    # keys off, so the attachments stay), and its index and search triggers made again. The rows wait in a
    # temporary table meanwhile, so the new table takes the old one's pages (no free pages left behind, and
    # a new database is laid out as before). Kept versions of a reply keep its thinking and calls too.
    """
    CREATE TEMP TABLE messages_before_10 AS SELECT id, conversation_id, seq, role, content, created_ms, finish, model,
        typed_text FROM messages;
    DROP TABLE messages;
    CREATE TABLE messages (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        conversation_id TEXT NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
        seq INTEGER NOT NULL,
        role TEXT NOT NULL CHECK (role IN ('system', 'user', 'assistant', 'tool')),
        content TEXT NOT NULL,
        created_ms INTEGER NOT NULL,
        finish TEXT,
        model TEXT,
        typed_text TEXT,
        reasoning TEXT,
        thought_ms INTEGER,
        tool_calls TEXT,
        tool_call_id TEXT,
        name TEXT,
        UNIQUE (conversation_id, seq)
    );
    INSERT INTO messages (id, conversation_id, seq, role, content, created_ms, finish, model, typed_text)
        SELECT id, conversation_id, seq, role, content, created_ms, finish, model, typed_text FROM temp.messages_before_10;
    DROP TABLE temp.messages_before_10;
    CREATE INDEX messages_by_conversation ON messages(conversation_id, seq);
    CREATE TRIGGER messages_fts_insert AFTER INSERT ON messages BEGIN
        INSERT INTO message_fts(rowid, content) VALUES (new.id, new.content);
    END;
    CREATE TRIGGER messages_fts_delete AFTER DELETE ON messages BEGIN
        INSERT INTO message_fts(message_fts, rowid, content) VALUES ('delete', old.id, old.content);
    END;
    CREATE TRIGGER messages_fts_update AFTER UPDATE OF content ON messages BEGIN
        INSERT INTO message_fts(message_fts, rowid, content) VALUES ('delete', old.id, old.content);
        INSERT INTO message_fts(rowid, content) VALUES (new.id, new.content);
    END;
    ALTER TABLE alternatives ADD COLUMN reasoning TEXT;
    ALTER TABLE alternatives ADD COLUMN thought_ms INTEGER;
    ALTER TABLE alternatives ADD COLUMN tool_calls TEXT;
    """,
    # 11: the tool loop in a chat (issue 33). Each call the model made that Hearth ran or refused has a row:
    # 'running' from just before the tool starts until its result is stored (so a restart finds a call that
    # may have run, and asks instead of running it again), then how it ended: 'done', 'error', 'denied' or
    # 'abandoned', set in the same transaction that stores the result (a role 'tool' message). A call with
    # no row and no result was never started: the chat offers it again.
    """
    CREATE TABLE tool_runs (
        conversation_id TEXT NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
        call_id TEXT NOT NULL,
        state TEXT NOT NULL CHECK (state IN ('running', 'done', 'error', 'denied', 'abandoned')),
        updated_ms INTEGER NOT NULL,
        PRIMARY KEY (conversation_id, call_id)
    );
    """,
]
SCHEMA_VERSION = len(MIGRATIONS)


def title_from(text: str) -> str:
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    return line if len(line) <= TITLE_CHARS else line[: TITLE_CHARS - 1].rstrip() + "…"
