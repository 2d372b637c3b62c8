"""Conversation text in SQLite: the one copy of what was said, shared by the window and ``hearth-cli chat``.

Text always lands here before any model work starts, so a crash, a full disk for checkpoints or a
damaged checkpoint never loses a word: checkpoints are a cache that can always be rebuilt from this.
WAL mode lets the window read while the CLI writes. The schema is versioned with ``PRAGMA
user_version`` and upgraded by the ordered migrations of engine/db_schema.py; a database from a newer Hearth is refused.
"""

from __future__ import annotations

import json
import logging
import shutil
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from engine import db_lock, tool_messages
from engine.db_schema import ID_PATTERN, MIGRATIONS, ROLES, SCHEMA_VERSION, title_from
from engine.errors import ConversationError, DiskFullError
from engine.private_files import private_dir, private_file
from engine.types import Attachment, Conversation, Message, ReplyFacts, ReplyVersions, ToolCall

TOOL_RUN_ENDS = ("done", "error", "denied", "abandoned")  # how a call Hearth ran or refused ended (schema 11)

log = logging.getLogger(__name__)
COLUMNS = "id, title, system_prompt, settings, model, created_ms, updated_ms, model_key"  # what a Conversation is made of
LOW_SPACE_BYTES = 8 << 20  # below this much free space, a failed write is taken for a full disk
IMPORT_STALE_MS = 10 * 60 * 1000  # an import with no batch for this long was abandoned (its process died)

try:
    import resource
except ImportError:  # Windows
    resource = None

ATTACHMENT_COLUMNS = "name, size, sha256, kind, text, pages"  # what an Attachment is made of, in its order
MODEL_CHARS = 200  # a model's name in words, as stored with a reply (a GGUF stem and its weights)
# StopReason.LENGTH and INTERRUPTED (cut off by Hearth closing): the reply can be continued.
CONTINUABLE_FINISHES = ("length", "interrupted")
# an agent's fields of a message (migration 10), in agent_row's order
AGENT_COLUMNS = "reasoning, thought_ms, tool_calls, tool_call_id, name"
# what a kept version of a reply has beside its text and time, in this order (messages and alternatives alike)
VERSION_COLUMNS = "finish, model, reasoning, thought_ms, tool_calls"
MAX_REASONING_CHARS = 4 << 20  # a reply's thinking (a 128k-token context holds ~0.5 MB of text)


def visible(alias: str = "") -> str:
    """SQL condition: the row is not part of an import still under way."""
    return f"({alias}import_id IS NULL OR {alias}import_id NOT IN (SELECT id FROM imports))"


def now_ms() -> int:
    return int(time.time() * 1000)


def check_id(conversation_id: str) -> str:
    if not isinstance(conversation_id, str) or not ID_PATTERN.fullmatch(conversation_id):
        raise ConversationError(f"invalid conversation id {conversation_id!r}: use 1–128 letters, digits, '.', "
                                "'_', ':' or '-', starting with a letter or digit")
    return conversation_id


class ConversationStore:
    def __init__(self, path: Path, backup_before_upgrade: bool = True):
        """``backup_before_upgrade``: copy an older schema into the backups before migrating it (False only
        where that copy was just made off the UI thread: the window's database_at_start)."""
        self.path = Path(path)
        self._backup_before_upgrade = backup_before_upgrade
        private_dir(self.path.parent)
        private_file(self.path)  # before SQLite creates it: its -wal and -shm files take its mode
        self._lock = threading.RLock()
        # held while open: 'db restore' and 'db salvage' in another process refuse to replace the file under us
        self._open_mark = db_lock.hold_shared(self.path)
        try:
            self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=10)
            self._db.execute("PRAGMA journal_mode=WAL")
            # WAL + NORMAL: a commit costs no fsync (the window writes on its UI thread); a crash of the
            # app loses nothing, a power cut at most the last commits, and never corrupts the file.
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute("PRAGMA foreign_keys=ON")
            self._migrate()
        except BaseException as exc:
            if hasattr(self, "_db"):
                self._db.close()
            db_lock.release(self._open_mark)
            if isinstance(exc, sqlite3.DatabaseError):  # a full disk, a locked or a damaged file: each in its own words
                raise self._failure(exc) from None
            raise

    def close(self) -> None:
        with self._lock:
            self._db.close()
            db_lock.release(self._open_mark)
            self._open_mark = None

    def _migrate(self) -> None:
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise ConversationError(f"{self.path} was written by a newer Hearth (schema {version}; this one "
                                    f"knows {SCHEMA_VERSION}); upgrade Hearth to open it")
        if 0 < version < SCHEMA_VERSION and self._backup_before_upgrade:  # keep a copy from before the upgrade
            from engine import db_recovery

            db_recovery.before_migration(self.path)
        if version == SCHEMA_VERSION:
            return
        # Off while migrating (it cannot change inside a transaction): a migration that builds a table again
        # drops the old one, and with foreign keys on that would delete the rows that refer to it.
        self._db.execute("PRAGMA foreign_keys=OFF")
        try:
            for target in range(version + 1, SCHEMA_VERSION + 1):
                with self._tx() as db:
                    db.executescript("SAVEPOINT migrate;" + MIGRATIONS[target - 1] +
                                     f"; PRAGMA user_version = {target}; RELEASE migrate;")
            if broken := self._db.execute("PRAGMA foreign_key_check").fetchall():  # from before (a salvage): said
                log.warning("%s: %d row(s) refer to rows that are not there (first: %s)", self.path, len(broken),
                            broken[0])
        finally:
            self._db.execute("PRAGMA foreign_keys=ON")

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """The connection, for reads and single statements (autocommit)."""
        with self._lock:
            try:
                yield self._db
            except sqlite3.DatabaseError as exc:
                raise self._failure(exc) from None

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction: all of it is stored, or none of it (and the error says why)."""
        with self._lock:
            db = self._db
            try:
                db.execute("BEGIN IMMEDIATE")
                yield db
                db.execute("COMMIT")
            except BaseException as exc:
                # SQLite may already have rolled back (a COMMIT that hit a full disk does): a second
                # ROLLBACK would raise "no transaction is active" and hide the real error.
                if db.in_transaction:
                    try:
                        db.execute("ROLLBACK")
                    except sqlite3.Error:
                        pass
                if isinstance(exc, sqlite3.DatabaseError):
                    raise self._failure(exc) from None
                raise

    def _out_of_space(self) -> bool:
        """SQLite reports a write past the file size limit (EFBIG) as a plain I/O error: tell it apart."""
        try:
            if shutil.disk_usage(self.path.parent).free < LOW_SPACE_BYTES:
                return True
        except OSError:
            return False
        if resource is not None:
            return resource.getrlimit(resource.RLIMIT_FSIZE)[0] != resource.RLIM_INFINITY
        return False

    def _failure(self, exc: sqlite3.DatabaseError) -> ConversationError:
        """The database error in plain words: a full disk says so."""
        code = getattr(exc, "sqlite_errorcode", None)
        if code is not None and code & 0xFF == sqlite3.SQLITE_FULL or "disk is full" in str(exc):
            return DiskFullError(f"the disk holding {self.path.parent} is full, so the conversation could not be saved "
                                 "(everything stored before is kept); free some space and try again")
        if code is not None and code & 0xFF == sqlite3.SQLITE_IOERR and self._out_of_space():
            return DiskFullError(f"the disk holding {self.path.parent} is full (or the file size limit was reached), so "
                                 "the conversation could not be saved (everything stored before is kept); free some "
                                 "space and try again")
        if code is not None and code & 0xFF == sqlite3.SQLITE_IOERR:
            return ConversationError(f"the conversation database {self.path} could not be written ({exc}); the disk "
                                     "may be failing (everything stored before is kept)")
        if code is not None and code & 0xFF == sqlite3.SQLITE_BUSY:
            return ConversationError(f"the conversation database {self.path} is locked by another program; try again")
        if code is not None and code & 0xFF in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB):
            return ConversationError(self._damage(exc))
        return ConversationError(f"the conversation database failed: {exc}")

    def _damage(self, exc: sqlite3.DatabaseError) -> str:
        """A damaged database, checked before it is blamed, with the way out that exists: the newest
        backup when there is one, else the salvage."""
        from engine import db_recovery

        problem = db_recovery.problem_with(self.path)
        if not problem:
            return (f"the conversation database {self.path} reported '{exc}', but it passes its check "
                    "(nothing is damaged); try again")
        return f"the conversation database {self.path} is damaged ({exc}); {db_recovery.way_out(self.path)}"

    def read(self, sql: str, args: tuple | dict = ()) -> list[tuple]:
        """A read-only query for modules built on the store (search); raises ConversationError."""
        with self._tx() as db:
            return db.execute(sql, args).fetchall()

    # conversations -----------------------------------------------------------------------------------
    def create(self, conversation_id: str | None = None, title: str = "", system_prompt: str = "",
               settings: dict | None = None, model: str = "") -> Conversation:
        cid = check_id(conversation_id) if conversation_id is not None else uuid.uuid4().hex
        t = now_ms()
        conv = Conversation(cid, title, system_prompt, settings or {}, model, t, t)
        with self._write() as db:
            try:
                db.execute("INSERT INTO conversations (id, title, system_prompt, settings, model, created_ms, updated_ms) "
                           "VALUES (?,?,?,?,?,?,?)", (cid, title, system_prompt, json.dumps(conv.settings), model, t, t))
            except sqlite3.IntegrityError:
                raise ConversationError(f"conversation {cid!r} already exists") from None
        return conv

    def ensure(self, conversation_id: str, system_prompt: str = "") -> Conversation:
        """The conversation, created when it does not exist: two processes doing this at once both get
        it, and neither fails (INSERT OR IGNORE, then read)."""
        cid = check_id(conversation_id)
        t = now_ms()
        with self._write() as db:
            db.execute("INSERT OR IGNORE INTO conversations (id, title, system_prompt, settings, model, created_ms, "
                       "updated_ms) VALUES (?, '', ?, '{}', '', ?, ?)", (cid, system_prompt, t, t))
        return self.require(cid)

    def get(self, conversation_id: str) -> Conversation | None:
        with self._tx() as db:
            row = db.execute(f"SELECT {COLUMNS} FROM conversations WHERE id = ? AND {visible()}",
                             (conversation_id,)).fetchone()
        return self._conversation(row) if row else None

    def require(self, conversation_id: str) -> Conversation:
        conv = self.get(conversation_id)
        if conv is None:
            raise ConversationError(f"no conversation {conversation_id!r}")
        return conv

    def list(self) -> list[Conversation]:
        """Every conversation not in the trash, most recent first."""
        with self._tx() as db:
            rows = db.execute(f"SELECT {COLUMNS} FROM conversations WHERE deleted_ms IS NULL AND {visible()} "
                              "ORDER BY updated_ms DESC").fetchall()
        return [self._conversation(r) for r in rows]

    def ids(self) -> set[str]:
        """Every conversation that still exists, trash included (its checkpoints must survive an undo)."""
        with self._tx() as db:
            return {r[0] for r in db.execute("SELECT id FROM conversations")}

    def summaries(self) -> list[dict]:
        """One row per conversation for the browser: counts come from one grouped query."""
        with self._tx() as db:
            rows = db.execute(
                "SELECT c.id, c.title, c.created_ms, c.updated_ms, c.model, COUNT(m.id), c.model_key "
                "FROM conversations c LEFT JOIN messages m ON m.conversation_id = c.id "
                f"WHERE c.deleted_ms IS NULL AND {visible('c.')} GROUP BY c.id ORDER BY c.updated_ms DESC").fetchall()
        return [{"id": r[0], "title": r[1], "created_ms": r[2], "updated_ms": r[3], "model": r[4], "messages": r[5],
                 "model_key": r[6]} for r in rows]

    def models(self) -> list[str]:
        with self._tx() as db:
            return [r[0] for r in db.execute("SELECT DISTINCT model FROM conversations WHERE model != '' AND "
                                             f"{visible()} ORDER BY 1")]

    def set_model(self, conversation_id: str, model: str, model_key: str | None = None) -> None:
        """Record the model a turn ran on: ``model`` its label in words, ``model_key`` (when given) the
        library name or GGUF path that runs it again."""
        with self._tx() as db:
            if model_key is None:
                db.execute("UPDATE conversations SET model = ? WHERE id = ?", (model, conversation_id))
            else:
                db.execute("UPDATE conversations SET model = ?, model_key = ? WHERE id = ?",
                           (model, model_key, conversation_id))

    def model_key(self, conversation_id: str) -> str:
        """The library name or GGUF path the conversation was last used with; "" when none (or no such
        conversation)."""
        with self._tx() as db:
            row = db.execute("SELECT model_key FROM conversations WHERE id = ?", (conversation_id,)).fetchone()
        return row[0] if row else ""

    # trash: delete with undo ----------------------------------------------------------------------------
    def trash(self, ids: list[str]) -> None:
        with self._tx() as db:
            db.executemany("UPDATE conversations SET deleted_ms = ? WHERE id = ?", [(now_ms(), i) for i in ids])

    def untrash(self, ids: list[str]) -> None:
        with self._tx() as db:
            db.executemany("UPDATE conversations SET deleted_ms = NULL WHERE id = ?", [(i,) for i in ids])

    def trashed(self, older_than_ms: int = 0) -> list[str]:
        with self._tx() as db:
            return [r[0] for r in db.execute("SELECT id FROM conversations WHERE deleted_ms IS NOT NULL "
                                             "AND deleted_ms <= ?", (now_ms() - older_than_ms,))]

    def purge(self, ids: list[str]) -> None:
        """Delete for good (messages go with them); the caller deletes their checkpoints."""
        with self._write() as db:
            db.executemany("DELETE FROM conversations WHERE id = ?", [(i,) for i in ids])

    def insert_full(self, conversations: list[dict]) -> list[str]:
        """Insert whole conversations (already validated) in one transaction: all or nothing. Each
        keeps its id unless that id is taken (then it gets a new one); returns the ids used."""
        with self._write() as db:
            return self._insert(db, conversations, None)

    @staticmethod
    def _insert(db: sqlite3.Connection, conversations: list[dict], import_id: str | None) -> list[str]:
        used: list[str] = []
        for c in conversations:
            cid = c.get("id")
            if not cid or db.execute("SELECT 1 FROM conversations WHERE id = ?", (cid,)).fetchone():
                cid = uuid.uuid4().hex
            db.execute("INSERT INTO conversations (id, title, system_prompt, settings, model, created_ms, "
                       "updated_ms, import_id) VALUES (?,?,?,?,?,?,?,?)",
                       (cid, c["title"], c["system_prompt"], json.dumps(c["settings"]), c["model"],
                        c["created_ms"], c["updated_ms"], import_id))
            for i, m in enumerate(c["messages"]):
                attachments = tuple(m.get("attachments") or ())
                cur = db.execute(f"INSERT INTO messages (conversation_id, seq, role, content, created_ms, finish, "
                                 f"model, typed_text, {AGENT_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                                 (cid, i, m["role"], m["content"], m["created_ms"], m.get("finish_reason"),
                                  m.get("model") or None, m.get("typed_text") if attachments else None,
                                  *agent_row(m["role"], m.get("reasoning", ""), m.get("thought_ms"),
                                             m.get("tool_calls", ()), m.get("tool_call_id", ""), m.get("name", ""))))
                _store_attachments(db, cur.lastrowid, attachments)
            used.append(cid)
        return used

    # imports in batches: each batch is its own short transaction, the rows stay hidden until the end --------
    def begin_import(self) -> str:
        """Register an import (removing any abandoned one first); its id marks every row it adds."""
        self.remove_stale_imports()
        import_id, t = uuid.uuid4().hex, now_ms()
        with self._write() as db:
            db.execute("INSERT INTO imports (id, started_ms, beat_ms) VALUES (?,?,?)", (import_id, t, t))
        return import_id

    def insert_batch(self, conversations: list[dict], import_id: str) -> list[str]:
        """One batch of an import (validated conversations), hidden until ``finish_import``."""
        with self._write() as db:
            if db.execute("UPDATE imports SET beat_ms = ? WHERE id = ?", (now_ms(), import_id)).rowcount == 0:
                raise ConversationError("the import was abandoned (no progress for a long time) and removed")
            return self._insert(db, conversations, import_id)

    def finish_import(self, import_id: str) -> None:
        """Show everything the import added, at once (the rows keep their import_id as provenance)."""
        with self._write() as db:
            if db.execute("DELETE FROM imports WHERE id = ?", (import_id,)).rowcount == 0:
                raise ConversationError("the import was abandoned (no progress for a long time) and removed")

    def abort_import(self, import_id: str, batch: int = 1000) -> int:
        """Delete what the import added, a batch per transaction (other writers get in between);
        return how many conversations went."""
        removed = 0
        while True:
            with self._write() as db:
                rows = db.execute("SELECT rowid FROM conversations WHERE import_id = ? AND import_id IN "
                                  "(SELECT id FROM imports) LIMIT ?", (import_id, batch)).fetchall()
                db.executemany("DELETE FROM conversations WHERE rowid = ?", rows)
            if not rows:
                break
            removed += len(rows)
        with self._write() as db:
            db.execute("DELETE FROM imports WHERE id = ?", (import_id,))
        return removed

    def remove_stale_imports(self) -> int:
        """Remove the rows of imports whose process stopped mid-way (a crash): none of them was shown."""
        with self._tx() as db:
            stale = [r[0] for r in db.execute("SELECT id FROM imports WHERE beat_ms < ?", (now_ms() - IMPORT_STALE_MS,))]
        return sum(self.abort_import(i) for i in stale)

    def duplicate(self, conversation_id: str, upto_seq: int | None = None) -> Conversation:
        """A new conversation with the same settings and the messages up to ``upto_seq`` (all if None)."""
        src = self.require(conversation_id)
        msgs = [m for m in self.messages(conversation_id) if upto_seq is None or m.seq <= upto_seq]
        copy = self.create(title=f"{src.title or 'New chat'} (branch)", system_prompt=src.system_prompt,
                           settings=src.settings, model=src.model)
        with self._write() as db:
            db.execute("UPDATE conversations SET model_key = (SELECT model_key FROM conversations WHERE id = ?) "
                       "WHERE id = ?", (conversation_id, copy.id))
            for i, m in enumerate(msgs):  # a message's attachments come with it
                cur = db.execute(f"INSERT INTO messages (conversation_id, seq, role, content, created_ms, typed_text, "
                                 f"{AGENT_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                                 (copy.id, i, m.role, m.content, m.created_ms, m.typed_text if m.attachments else None,
                                  *agent_row(m.role, m.reasoning, m.thought_ms, m.tool_calls, m.tool_call_id, m.name)))
                _store_attachments(db, cur.lastrowid, m.attachments)
        return copy

    @staticmethod
    def _conversation(row: tuple) -> Conversation:
        try:
            settings = json.loads(row[3])
        except ValueError:
            settings = {}
        return Conversation(row[0], row[1], row[2], settings if isinstance(settings, dict) else {}, row[4], row[5], row[6],
                            row[7])

    def rename(self, conversation_id: str, title: str) -> None:
        """A new title; the last activity stays as it was (a rename is not a message: it showed "just now")."""
        with self._tx() as db:
            cur = db.execute("UPDATE conversations SET title = ? WHERE id = ?", (title.strip(), conversation_id))
        if cur.rowcount == 0:
            raise ConversationError(f"no conversation {conversation_id!r}")

    def set_system_prompt(self, conversation_id: str, text: str) -> None:
        self._update(conversation_id, "system_prompt = ?", text)

    def set_settings(self, conversation_id: str, settings: dict) -> None:
        self._update(conversation_id, "settings = ?", json.dumps(settings))

    def _update(self, conversation_id: str, assignment: str, value: object) -> None:
        with self._tx() as db:
            cur = db.execute(f"UPDATE conversations SET {assignment}, updated_ms = ? WHERE id = ?",
                             (value, now_ms(), conversation_id))
        if cur.rowcount == 0:
            raise ConversationError(f"no conversation {conversation_id!r}")

    def delete(self, conversation_id: str) -> bool:
        with self._tx() as db:
            return db.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,)).rowcount > 0

    # messages ------------------------------------------------------------------------------------------
    def messages(self, conversation_id: str) -> list[Message]:
        with self._tx() as db:
            rows = db.execute(f"SELECT seq, role, content, created_ms, typed_text, id, {AGENT_COLUMNS} FROM messages "
                              "WHERE conversation_id = ? ORDER BY seq", (conversation_id,)).fetchall()
            files: dict[int, list[Attachment]] = {}
            for r in db.execute(f"SELECT a.message_id, {', '.join('a.' + c for c in ATTACHMENT_COLUMNS.split(', '))} "
                                "FROM attachments a JOIN messages m ON m.id = a.message_id WHERE m.conversation_id = ? "
                                "ORDER BY a.message_id, a.position", (conversation_id,)):
                files.setdefault(r[0], []).append(Attachment(*r[1:]))
        # typed_text only means something beside attachments (a salvaged database may have lost them: then the
        # content, which holds the files' text, is what the person sees)
        return [Message(seq, role, content, ms, tuple(files.get(mid, ())), typed if mid in files else None,
                        **_agent_fields(conversation_id, seq, agent))
                for seq, role, content, ms, typed, mid, *agent in rows]

    def attachments(self, conversation_id: str, seq: int) -> tuple[Attachment, ...]:
        """The files attached to message ``seq`` (none: an empty tuple)."""
        with self._tx() as db:
            rows = db.execute(f"SELECT {', '.join('a.' + c for c in ATTACHMENT_COLUMNS.split(', '))} FROM attachments a "
                              "JOIN messages m ON m.id = a.message_id WHERE m.conversation_id = ? AND m.seq = ? "
                              "ORDER BY a.position", (conversation_id, seq)).fetchall()
        return tuple(Attachment(*r) for r in rows)

    def documents(self, conversation_id: str) -> tuple[Attachment, ...]:
        """Every file attached anywhere in the chat, once each (the same name and bytes attached twice is one),
        in the order they were first attached: what the browser's "New chat with these documents" carries."""
        seen: dict[tuple[str, str], Attachment] = {}
        for m in self.messages(conversation_id):
            for a in m.attachments:
                seen.setdefault((a.name, a.sha256), a)
        return tuple(seen.values())

    def chat_messages(self, conversation_id: str) -> list[dict]:
        """What the model sees: the system prompt (if any), then the messages in order."""
        conv = self.require(conversation_id)
        head = [{"role": "system", "content": conv.system_prompt}] if conv.system_prompt else []
        return head + [m.as_chat() for m in self.messages(conversation_id)]

    def append(self, conversation_id: str, role: str, content: str, finish: str | None = None,
               model: str | None = None, *, attachments: tuple[Attachment, ...] = (),
               typed_text: str | None = None, reasoning: str = "", thought_ms: int | None = None,
               tool_calls: tuple[ToolCall, ...] = (), tool_call_id: str = "", name: str = "",
               _tool_run: str | None = None) -> Message:
        """Add a message at the end; ``finish``: why a reply ended (a StopReason value) and ``model``: the model
        that wrote it, in words, kept for replies only. ``attachments`` (a user message's files) are stored with
        it in the same transaction; ``content`` is then the composed text the model reads
        (``engine.documents.compose_message``) and ``typed_text`` the person's own words. A reply may carry its
        thinking (``reasoning``, ``thought_ms``) and ``tool_calls``; a tool message (role "tool") carries the
        ``tool_call_id`` it answers and the tool's ``name`` (engine/tool_messages.py bounds them all)."""
        if role not in ROLES:
            raise ConversationError(f"role {role!r} is not one of {', '.join(ROLES)}")
        if not isinstance(content, str):
            raise ConversationError("message content must be text")
        attachments = tuple(attachments)
        if attachments and role != "user":
            raise ConversationError("only a user message can carry attachments")
        agent = agent_row(role, reasoning, thought_ms, tool_calls, tool_call_id, name)
        typed = (typed_text if typed_text is not None else content) if attachments else None
        t = now_ms()
        with self._write() as db:
            conv = db.execute("SELECT title FROM conversations WHERE id = ?", (conversation_id,)).fetchone()
            if conv is None:
                raise ConversationError(f"no conversation {conversation_id!r}")
            seq = db.execute("SELECT COALESCE(MAX(seq), -1) + 1 FROM messages WHERE conversation_id = ?",
                             (conversation_id,)).fetchone()[0]
            if _tool_run is not None:
                _check_awaited(db, conversation_id, tool_call_id)
            if role != "assistant":  # versions of a reply that was set aside and never came back
                db.execute("DELETE FROM alternatives WHERE conversation_id = ? AND seq >= ?", (conversation_id, seq))
            reply = role == "assistant"
            cur = db.execute(f"INSERT INTO messages (conversation_id, seq, role, content, created_ms, finish, model, "
                             f"typed_text, {AGENT_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                             (conversation_id, seq, role, content, t, finish if reply else None,
                              model[:MODEL_CHARS] if reply and model else None, typed, *agent))
            _store_attachments(db, cur.lastrowid, attachments)
            if _tool_run is not None:  # append_tool_result: how the call ended, with its result
                db.execute("INSERT INTO tool_runs (conversation_id, call_id, state, updated_ms) VALUES (?, ?, ?, ?) "
                           "ON CONFLICT (conversation_id, call_id) DO UPDATE SET state = excluded.state, "
                           "updated_ms = excluded.updated_ms", (conversation_id, tool_call_id, _tool_run, t))
            title = conv[0] or (message_title(content, typed, attachments) if role == "user" else "")
            db.execute("UPDATE conversations SET updated_ms = ?, title = ? WHERE id = ?", (t, title, conversation_id))
        return Message(seq, role, content, t, attachments, typed, **_agent_fields(conversation_id, seq, agent))

    # the tool loop's calls (schema 11, engine/tools/loop.py) ------------------------------------------------
    def start_tool_run(self, conversation_id: str, call_id: str) -> None:
        """Mark a call as running, just before its tool starts: a restart before its result is stored finds it
        and asks rather than running it again."""
        tool_messages.check_id(call_id)
        with self._write() as db:
            if db.execute("SELECT 1 FROM conversations WHERE id = ?", (conversation_id,)).fetchone() is None:
                raise ConversationError(f"no conversation {conversation_id!r}")
            db.execute("INSERT INTO tool_runs (conversation_id, call_id, state, updated_ms) VALUES (?, ?, 'running', ?) "
                       "ON CONFLICT (conversation_id, call_id) DO UPDATE SET state = 'running', updated_ms = excluded.updated_ms",
                       (conversation_id, call_id, now_ms()))

    def tool_runs(self, conversation_id: str) -> dict[str, str]:
        """call id → its state ('running', 'done', 'error', 'denied', 'abandoned') for the calls Hearth ran or
        refused in this conversation."""
        with self._tx() as db:
            rows = db.execute("SELECT call_id, state FROM tool_runs WHERE conversation_id = ?",
                              (conversation_id,)).fetchall()
        return dict(rows)

    def append_tool_result(self, conversation_id: str, call_id: str, name: str, content: str, state: str) -> Message:
        """Store a call's result as a message of its own (role 'tool') and how the call ended, in one transaction."""
        if state not in TOOL_RUN_ENDS:
            raise ConversationError(f"a tool call ends as one of {', '.join(TOOL_RUN_ENDS)}, not {state!r}")
        return self.append(conversation_id, "tool", content, tool_call_id=call_id, name=name, _tool_run=state)

    def truncate(self, conversation_id: str, seq: int) -> int:
        """Delete messages from ``seq`` on (editing or regenerating); return how many went."""
        with self._write() as db:
            return self._truncate(db, conversation_id, seq)

    @staticmethod
    def _truncate(db: sqlite3.Connection, conversation_id: str, seq: int) -> int:
        n = db.execute("DELETE FROM messages WHERE conversation_id = ? AND seq >= ?", (conversation_id, seq)).rowcount
        # the versions of replies that no longer follow go with them
        db.execute("DELETE FROM alternatives WHERE conversation_id = ? AND seq >= ?", (conversation_id, seq))
        db.execute("UPDATE conversations SET updated_ms = ? WHERE id = ?", (now_ms(), conversation_id))
        return n

    def edit(self, conversation_id: str, seq: int, content: str,
             attachments: tuple[Attachment, ...] | None = None) -> None:
        """Replace message ``seq`` and drop everything after it (the replies no longer follow), at once.
        A title still the one the first message gave follows that message's new text. For a message with
        attachments, ``content`` is the new typed text: the files stay (``attachments=None``) or are replaced by
        ``attachments`` (``()``: none), and the stored content is composed again."""
        from engine.documents import compose_message

        with self._write() as db:  # the files read in the same transaction that rewrites them
            before = self.attachments(conversation_id, seq)
            current = before if attachments is None else tuple(attachments)
            old = db.execute("SELECT content, role, id, typed_text FROM messages WHERE conversation_id = ? AND seq = ?",
                             (conversation_id, seq)).fetchone()
            if old is None:
                raise ConversationError(f"conversation {conversation_id!r} has no message {seq}")
            if current and old[1] != "user":
                raise ConversationError("only a user message can carry attachments")
            composed = compose_message(content, current)
            # A reply the person rewrote no longer ends where the model stopped: nothing to continue.
            db.execute("UPDATE messages SET content = ?, finish = NULL, model = NULL, typed_text = ?, reasoning = NULL, "
                       "thought_ms = NULL WHERE id = ?",
                       (composed, content if current else None, old[2]))
            db.execute("DELETE FROM attachments WHERE message_id = ?", (old[2],))
            _store_attachments(db, old[2], current)
            self._retitle(db, conversation_id, seq, old[1], message_title(old[0], old[3], before),
                          message_title(composed, content, current))
            self._truncate(db, conversation_id, seq + 1)

    @staticmethod
    def _retitle(db: sqlite3.Connection, conversation_id: str, seq: int, role: str, old_title: str,
                 new_title: str) -> None:
        """The first user message was edited: a title that was made from it (not one the person chose)
        is made again from the new text."""
        first = db.execute("SELECT MIN(seq) FROM messages WHERE conversation_id = ? AND role = 'user'",
                           (conversation_id,)).fetchone()[0]
        if role != "user" or first != seq:
            return
        db.execute("UPDATE conversations SET title = ? WHERE id = ? AND title = ?",
                   (new_title, conversation_id, old_title))

    # pins: chats kept at the top of the sidebar -----------------------------------------------------------
    def set_pinned(self, conversation_id: str, pinned: bool) -> None:
        """Pin (or unpin) a chat; its last activity stays as it was."""
        with self._tx() as db:
            cur = db.execute("UPDATE conversations SET pinned = ? WHERE id = ?", (1 if pinned else 0, conversation_id))
        if cur.rowcount == 0:
            raise ConversationError(f"no conversation {conversation_id!r}")

    def pinned_ids(self) -> set[str]:
        """The pinned chats (trash and unfinished imports excluded)."""
        with self._tx() as db:
            return {r[0] for r in db.execute(f"SELECT id FROM conversations WHERE pinned != 0 AND deleted_ms IS NULL "
                                             f"AND {visible()}")}

    def data_version(self) -> int:
        """Changes whenever another connection (another process, or another store object) commits: a
        cheap way for the window to notice turns added by ``hearth-cli`` or the server."""
        with self._tx() as db:
            return int(db.execute("PRAGMA data_version").fetchone()[0])

    # versions of a reply (regenerate keeps the earlier ones) ----------------------------------------------
    def reply_versions(self, conversation_id: str, seq: int) -> ReplyVersions | None:
        """Every version of reply ``seq``, oldest first, and which one the chat continues with; None when
        ``seq`` is not a stored reply."""
        with self._tx() as db:
            current = db.execute("SELECT content FROM messages WHERE conversation_id = ? AND seq = ? AND "
                                 "role = 'assistant'", (conversation_id, seq)).fetchone()
            if current is None:
                return None
            others = db.execute("SELECT position, content FROM alternatives WHERE conversation_id = ? AND seq = ? "
                                "ORDER BY position", (conversation_id, seq)).fetchall()
        position = self._free_position(others)
        versions = sorted([*others, (position, current[0])], key=lambda v: v[0])
        return ReplyVersions(seq, [p for p, _ in versions].index(position), tuple(text for _, text in versions))

    def versions_count(self, conversation_id: str) -> dict[int, int]:
        """seq → how many versions the reply has, for the replies that have more than one."""
        with self._tx() as db:
            rows = db.execute("SELECT a.seq, COUNT(*) + 1 FROM alternatives a JOIN messages m ON "
                              "m.conversation_id = a.conversation_id AND m.seq = a.seq AND m.role = 'assistant' "
                              "WHERE a.conversation_id = ? GROUP BY a.seq", (conversation_id,)).fetchall()
        return {seq: n for seq, n in rows}

    @staticmethod
    def _free_position(others: list[tuple[int, str]]) -> int:
        """The chosen version's position: the first one the other versions do not hold (a damaged table
        with gaps still gives one answer)."""
        taken = {p for p, _ in others}
        return next(i for i in range(len(taken) + 1) if i not in taken)

    def set_aside_reply(self, conversation_id: str) -> int:
        """Keep the last reply as an earlier version and take it off the chat, so a new one is written in
        its place (regenerate); returns its seq. ConversationError when the chat does not end in a reply."""
        with self._write() as db:
            last = db.execute(f"SELECT seq, role, content, created_ms, {VERSION_COLUMNS} FROM messages WHERE "
                              "conversation_id = ? ORDER BY seq DESC LIMIT 1", (conversation_id,)).fetchone()
            if last is None or last[1] != "assistant":
                raise ConversationError("the conversation does not end in a reply, so there is none to write again")
            seq = last[0]
            others = db.execute("SELECT position, content FROM alternatives WHERE conversation_id = ? AND seq = ?",
                                (conversation_id, seq)).fetchall()
            db.execute(f"INSERT INTO alternatives (conversation_id, seq, position, content, created_ms, "
                       f"{VERSION_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?)",
                       (conversation_id, seq, self._free_position(others), *last[2:]))
            db.execute("DELETE FROM messages WHERE conversation_id = ? AND seq = ?", (conversation_id, seq))
        return seq

    def restore_reply(self, conversation_id: str, seq: int) -> bool:
        """A regenerate wrote nothing: put the newest version set aside at ``seq`` back (when the chat has
        nothing there). True when one came back."""
        with self._write() as db:
            if db.execute("SELECT 1 FROM messages WHERE conversation_id = ? AND seq >= ?",
                          (conversation_id, seq)).fetchone():
                return False
            # The row set aside last has the highest id (a flip rewrites rows in place; it never adds one): by
            # position, a regenerate of a version chosen with ‹ › would bring back another version.
            row = db.execute(f"SELECT id, content, created_ms, {VERSION_COLUMNS} FROM alternatives WHERE "
                             "conversation_id = ? AND seq = ? ORDER BY id DESC LIMIT 1", (conversation_id, seq)).fetchone()
            if row is None:
                return False
            db.execute("DELETE FROM alternatives WHERE id = ?", (row[0],))
            db.execute(f"INSERT INTO messages (conversation_id, seq, role, content, created_ms, {VERSION_COLUMNS}) "
                       "VALUES (?,?,?,?,?,?,?,?,?,?)", (conversation_id, seq, "assistant", *row[1:]))
        return True

    def choose_version(self, conversation_id: str, seq: int, index: int) -> str:
        """Make version ``index`` (oldest first, as ``reply_versions`` lists them) of the last reply the one the
        chat continues with; returns its text. Only the last reply: the messages after an earlier one
        answered the version they followed."""
        with self._write() as db:
            last = db.execute(f"SELECT seq, role, content, created_ms, {VERSION_COLUMNS} FROM messages WHERE "
                              "conversation_id = ? ORDER BY seq DESC LIMIT 1", (conversation_id,)).fetchone()
            if last is None or last[0] != seq or last[1] != "assistant":
                raise ConversationError(f"message {seq} is not the last reply of the conversation: only the last "
                                        "reply's version can be chosen")
            others = db.execute(f"SELECT id, position, content, created_ms, {VERSION_COLUMNS} FROM alternatives WHERE "
                                "conversation_id = ? AND seq = ? ORDER BY position", (conversation_id, seq)).fetchall()
            current = self._free_position([(o[1], o[2]) for o in others])
            positions = sorted([o[1] for o in others] + [current])
            if not 0 <= index < len(positions):
                raise ConversationError(f"reply {seq} has {len(positions)} version(s); there is no version {index + 1}")
            wanted = positions[index]
            if wanted == current:
                return last[2]
            row = next(o for o in others if o[1] == wanted)
            swapped = ", ".join(f"{c} = ?" for c in ("content", "created_ms", *VERSION_COLUMNS.split(", ")))
            db.execute(f"UPDATE alternatives SET position = ?, {swapped} WHERE id = ?", (current, *last[2:], row[0]))
            db.execute(f"UPDATE messages SET {swapped} WHERE conversation_id = ? AND seq = ?",
                       (*row[2:], conversation_id, seq))
            db.execute("UPDATE conversations SET updated_ms = ? WHERE id = ?", (now_ms(), conversation_id))
        return row[2]

    def extend_reply(self, conversation_id: str, seq: int, text: str, finish: str | None = None,
                     model: str | None = None, *, reasoning: str = "", thought_ms: int | None = None) -> None:
        """Append ``text`` to reply ``seq`` (Continue: the same message, written on); ``finish`` is why it
        ended this time; ``model`` wrote the new part (a reply started by another model names both);
        ``reasoning``: more thinking (a reply stopped while it thought), ``thought_ms`` how long it took."""
        agent_row("assistant", reasoning, thought_ms, (), "", "")
        with self._write() as db:
            old = db.execute("SELECT model FROM messages WHERE conversation_id = ? AND seq = ? AND role = 'assistant'",
                             (conversation_id, seq)).fetchone()
            writers = old[0] if old is not None and old[0] else None
            if model and (writers is None or model not in writers.split(" + ")):
                writers = f"{writers} + {model}" if writers else model
            cur = db.execute("UPDATE messages SET content = content || ?, finish = ?, model = ?, reasoning = "
                             "NULLIF(COALESCE(reasoning, '') || ?, ''), thought_ms = CASE WHEN ? IS NULL THEN "
                             "thought_ms ELSE COALESCE(thought_ms, 0) + ? END WHERE conversation_id = ? AND seq = ? "
                             "AND role = 'assistant'",
                             (text, finish, writers[:MODEL_CHARS] if writers else None, reasoning, thought_ms,
                              thought_ms, conversation_id, seq))
            if cur.rowcount == 0:
                raise ConversationError(f"conversation {conversation_id!r} has no reply {seq} to continue")
            db.execute("UPDATE conversations SET updated_ms = ? WHERE id = ?", (now_ms(), conversation_id))

    # why a reply ended: Continue after a restart ----------------------------------------------------------------
    def set_finish(self, conversation_id: str, seq: int, finish: str | None) -> None:
        """Record why reply ``seq`` ended (a StopReason value, or None for not known)."""
        with self._tx() as db:
            cur = db.execute("UPDATE messages SET finish = ? WHERE conversation_id = ? AND seq = ? AND role = 'assistant'",
                             (finish, conversation_id, seq))
        if cur.rowcount == 0:
            raise ConversationError(f"conversation {conversation_id!r} has no reply {seq}")

    def reply_facts(self, conversation_id: str) -> dict[int, ReplyFacts]:
        """seq → why each reply of the chat ended and which model wrote it (the captions under replies)."""
        with self._tx() as db:
            rows = db.execute("SELECT seq, finish, model FROM messages WHERE conversation_id = ? AND role = 'assistant'",
                              (conversation_id,)).fetchall()
        return {seq: ReplyFacts(seq, finish, model or "") for seq, finish, model in rows}

    def continuable_reply(self, conversation_id: str) -> int | None:
        """The seq of the chat's last message when it is a reply the length limit stopped or Hearth's closing
        cut off (Continue writes on there); None otherwise."""
        with self._tx() as db:
            last = db.execute("SELECT seq, role, finish FROM messages WHERE conversation_id = ? ORDER BY seq DESC "
                              "LIMIT 1", (conversation_id,)).fetchone()
        return last[0] if last is not None and last[1] == "assistant" and last[2] in CONTINUABLE_FINISHES else None


def message_title(content: str, typed_text: str | None, attachments: tuple[Attachment, ...]) -> str:
    """A chat's title from its first message: the typed words, else the first file's name (never the
    ``[File: …]`` line a composed message begins with)."""
    if not attachments:
        return title_from(content)
    return title_from(typed_text or "") or title_from(attachments[0].name)


def _store_attachments(db: sqlite3.Connection, message_id: int, attachments: tuple[Attachment, ...]) -> None:
    db.executemany(f"INSERT INTO attachments (message_id, position, {ATTACHMENT_COLUMNS}) VALUES (?,?,?,?,?,?,?,?)",
                   [(message_id, i, a.name, a.size, a.sha256, a.kind, a.text, a.pages)
                    for i, a in enumerate(attachments)])


def _check_awaited(db: sqlite3.Connection, conversation_id: str, call_id: str) -> None:
    """A call's result (``append_tool_result``) goes after the reply that made the call, among that reply's
    results, once. A chat that went on while the tool ran (a new message, the reply written again, another
    process's turn, a second answer for the call) takes no late result: stored, it would follow a later message."""
    last = db.execute("SELECT seq, role, tool_calls FROM messages WHERE conversation_id = ? AND role != 'tool' "
                      "ORDER BY seq DESC LIMIT 1", (conversation_id,)).fetchone()
    try:
        calls = tool_messages.from_json(last[2]) if last is not None and last[1] == "assistant" else ()
    except ValueError:
        calls = ()
    if all(c.id != call_id for c in calls):
        raise ConversationError(f"the chat went on before the result of the call {call_id} came: it is not stored")
    answered = db.execute("SELECT 1 FROM messages WHERE conversation_id = ? AND seq > ? AND role = 'tool' AND "
                          "tool_call_id = ?", (conversation_id, last[0], call_id)).fetchone()
    if answered is not None:
        raise ConversationError(f"the call {call_id} already has its result")


def agent_row(role: str, reasoning: str, thought_ms: int | None, tool_calls: tuple[ToolCall, ...],
              tool_call_id: str, name: str) -> tuple:
    """The agent's columns of a message (AGENT_COLUMNS), checked and bounded; ConversationError says what is
    wrong. Thinking and calls go only with a reply, a call id and tool name only with a tool's result."""
    reply = role == "assistant"
    if not isinstance(reasoning, str) or len(reasoning) > MAX_REASONING_CHARS:
        raise ConversationError(f"a reply's thinking must be text of at most {MAX_REASONING_CHARS:,} characters")
    if thought_ms is not None and (not isinstance(thought_ms, int) or isinstance(thought_ms, bool)
                                   or not 0 <= thought_ms < 1 << 53):
        raise ConversationError(f"thought_ms must be a count of milliseconds, not {thought_ms!r}")
    if (reasoning or thought_ms is not None or tool_calls) and not reply:
        raise ConversationError(f"only a reply (role 'assistant') carries thinking or tool calls, not a {role!r} message")
    if role == "tool":
        try:
            tool_messages.check_id(tool_call_id, "a tool message's tool_call_id")
            if name:
                tool_messages.check_name(name, "a tool message's name")
        except ValueError as exc:
            raise ConversationError(str(exc)) from None
    elif tool_call_id or name:
        raise ConversationError(f"only a tool message carries a tool_call_id or name, not a {role!r} message")
    try:
        calls = tool_messages.to_json(tool_calls)
    except ValueError as exc:
        raise ConversationError(str(exc)) from None
    return reasoning or None, thought_ms, calls, tool_call_id or None, name or None


def _agent_fields(conversation_id: str, seq: int, row: tuple | list) -> dict:
    """``Message``'s agent fields from AGENT_COLUMNS. Stored calls that do not read back (a database edited by
    hand) are left out and logged: the message's text still shows."""
    reasoning, thought_ms, calls, tool_call_id, name = row
    try:
        tool_calls = tool_messages.from_json(calls)
    except ValueError as exc:
        log.warning("conversation %s, message %s: its tool calls are unreadable (%s); shown without them",
                    conversation_id, seq, exc)
        tool_calls = ()
    return {"reasoning": reasoning or "", "thought_ms": thought_ms, "tool_calls": tool_calls,
            "tool_call_id": tool_call_id or "", "name": name or ""}
