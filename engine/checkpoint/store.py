"""The checkpoint store: one directory of checkpoint files, an SQLite index over them, a disk budget.

Files are named from what they hold, never from user text: ``conv-<sha256(conversation id)>-<model>.hkv``
for a conversation's context under one model, ``prefix-<sha256(prefix text)>-<model>.hkv`` for a shared
prefix (a system prompt and the template's preamble, reused by every conversation that starts with it),
``api-<key>-<branch>-<model>.hkv`` for the server's prompt cache (kind ``api``: see
engine/session/prompt_cache.py), ``<model>`` being the first 8 bytes of the model fingerprint in hex. So a conversation keeps one
context per model side by side, and switching models back and forth resumes each from disk. The index
answers "which checkpoints could serve this conversation" without listing or opening files; it is
reconciled with the directory once when the store opens, so a lost or stale index heals itself.
Files named by an older Hearth (no model part) are adopted then: renamed to the name their header gives.

The store is the first storage tier (``engine/checkpoint/tier.py``): every name, copy, cut and removal
of a checkpoint file happens here, so code above it works with any tier.

Eviction keeps the store under its budget: first the files of models whose GGUF is gone (no one can
use them again; ``model_registry.py``), then those with the lowest score: hits decayed by age
(half-life one week) × tokens ÷ bytes. The entry used most recently, pinned entries and the caller's
protected conversations are never evicted.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from engine.checkpoint import writer
from engine.checkpoint.format import CheckpointError, FileHeader, Identity, RecordInfo, encoding_layout
from engine.checkpoint.lock import StoreBusyError, StoreLock
from engine.checkpoint.model_registry import KnownModel, ModelRegistry
from engine.checkpoint.reader import CheckpointReader
from engine.checkpoint.tier import Entry, Stamp, TierUsage, Written  # Entry: the tier's record type, named here too
from engine.errors import CheckpointStoreError
from engine.fsutil import atomic_write, fsync_dir, read_json
from engine.private_files import FILE_MODE, private_dir, private_file

log = logging.getLogger(__name__)

DEFAULT_BUDGET_BYTES = 2 << 30
DEFAULT_KV_ENCODING = "exact"  # lossless; "int8" is a quarter of float32's bytes (docs/checkpoint-format.md §4b)
SUFFIX = ".hkv"
INDEX_NAME = "index.sqlite3"
MAX_SETTINGS_BYTES = 64 << 10  # store.json holds two settings
DAMAGED_SUFFIX = ".damaged"  # a damaged index is kept beside its rebuilt one, for a look
_SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (
    name TEXT PRIMARY KEY,
    conversation TEXT,            -- NULL for shared prefixes and files the index did not know
    kind TEXT NOT NULL,           -- 'conversation', 'api', 'prefix' or 'orphan'
    tokens INTEGER NOT NULL,      -- frontier of the last record
    text_len INTEGER NOT NULL,
    text_sha BLOB NOT NULL,
    bytes INTEGER NOT NULL,
    model_fp BLOB NOT NULL,
    created_ms INTEGER NOT NULL,
    last_used_ms INTEGER NOT NULL,
    hits INTEGER NOT NULL DEFAULT 0,
    pinned INTEGER NOT NULL DEFAULT 0,
    label TEXT NOT NULL DEFAULT ''  -- the model's name in words (from the file's header)
);
CREATE INDEX IF NOT EXISTS entries_by_conversation ON entries(conversation);
"""


LEGACY_NAME = re.compile(r"(conv|prefix)-[0-9a-f]{32}\.hkv")  # before contexts were kept per model
MODEL_TAG_BYTES = 8


def model_tag(model_fp: bytes) -> str:
    """The model part of a file name."""
    return model_fp[:MODEL_TAG_BYTES].hex()


# The server's prompt cache (engine/session/prompt_cache.py) owns files too: its owners are named
# "#api-<key>-<branch>", which no conversation id can be (those start with a letter or digit), and their
# files "api-<key>-<branch>-<model>.hkv", indexed with kind "api".
API_OWNER_MARK = "#"
API_NAME_PREFIX = "api-"


def is_api_owner(owner: str | None) -> bool:
    """True for an owner of the server's prompt cache (not a stored conversation)."""
    return bool(owner) and owner.startswith(API_OWNER_MARK + API_NAME_PREFIX)


def owner_kind(owner: str) -> str:
    """The index kind of an owner's files: "api" for the server's prompt cache, else "conversation"."""
    return "api" if is_api_owner(owner) else "conversation"


def conversation_key(conversation: str) -> str:
    """What every file of ``conversation`` is named with, whatever the model."""
    if is_api_owner(conversation):
        return conversation[len(API_OWNER_MARK):]
    return f"conv-{hashlib.sha256(conversation.encode()).hexdigest()[:32]}"


def conversation_file(conversation: str, model_fp: bytes) -> str:
    """The conversation's checkpoint under the model with fingerprint ``model_fp``."""
    return f"{conversation_key(conversation)}-{model_tag(model_fp)}{SUFFIX}"


def legacy_conversation_file(conversation: str) -> str:
    """The name an older Hearth gave the conversation's one checkpoint (adopted when the store opens)."""
    return f"{conversation_key(conversation)}{SUFFIX}"


def prefix_file(text_sha: bytes, model_fp: bytes) -> str:
    return f"prefix-{text_sha.hex()[:32]}-{model_tag(model_fp)}{SUFFIX}"


_ENTRY_COLUMNS = ("name, conversation, kind, tokens, text_len, text_sha, bytes, model_fp, created_ms, last_used_ms, "
                  "hits, pinned, label")


def _entry(row: tuple) -> Entry:
    return Entry(*row[:11], bool(row[11]), row[12])


def _index_damaged(exc: sqlite3.DatabaseError) -> bool:
    """The index file is not a database or is corrupt (not: locked, full, read-only)."""
    code = getattr(exc, "sqlite_errorcode", None)  # extended codes keep the primary one in the low byte
    return (code & 0xFF) in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB) if code is not None else (
        "not a database" in str(exc) or "malformed" in str(exc))


def _owner_key(name: str) -> str:
    """``conv-<sha>`` of a conversation file's name, whatever its model part."""
    return name[: len("conv-") + 32]


def eviction_order(entries: list[Entry], protect: Iterable[str], gone: set[bytes]) -> list[tuple[Entry, str]]:
    """The entries a tier may evict, in the order it evicts them, each with why: first those of models
    whose GGUF is gone, then the lowest-scoring; never pinned ones, the most recently used one, or the
    ``protect``ed names and owners. Every tier evicts by this one policy."""
    if not entries:
        return []
    protected = set(protect)
    newest = max(entries, key=lambda e: e.last_used_ms).name
    now = int(time.time() * 1000)
    candidates = [e for e in entries if not e.pinned and e.name != newest
                  and e.name not in protected and e.conversation not in protected]
    ordered = sorted(candidates, key=lambda e: (e.model_fp not in gone, e.score(now)))
    return [(e, "its model is gone" if e.model_fp in gone else "lowest score") for e in ordered]


def prefixes_of(entries: Iterable[Entry], model_fp: bytes, text: bytes) -> list[Entry]:
    """The shared prefixes among ``entries`` of this model that spell a prefix of ``text``, longest first."""
    fits = [e for e in entries if e.kind == "prefix" and e.model_fp == model_fp and e.text_len <= len(text)
            and hashlib.sha256(text[: e.text_len]).digest() == e.text_sha]
    return sorted(fits, key=lambda e: -e.text_len)


def copy_name(name: str, owner: str, model_fp: bytes) -> str:
    """The name of ``owner``'s copy of the conversation record ``name`` (a legacy name stays legacy)."""
    return legacy_conversation_file(owner) if LEGACY_NAME.fullmatch(name) else conversation_file(owner, model_fp)


def unknown_entry(name: str, open_reader: Callable[[], CheckpointReader], size: int) -> Entry:
    """The index row of a record the index did not know, from its header and record headers, without
    judging it (a damaged one is reported and replaced when a session next tries it). Its owner is
    found again by name (``conversation_entry``)."""
    header, records = None, []
    try:
        with open_reader() as reader:
            header = reader.read_header()
            records, _ = reader.scan()
    except CheckpointError as exc:
        log.info("checkpoint %s does not verify (%s); a session will report and rebuild it", name, exc)
    last = records[-1] if records else None
    kind = ("prefix" if name.startswith("prefix-") else "conversation" if name.startswith("conv-")
            else "api" if name.startswith(API_NAME_PREFIX) else "orphan")
    created = header.created_ms if header else int(time.time() * 1000)
    return Entry(name, None, kind, last.end if last else 0, last.text_len if last else 0,
                 last.text_sha if last else b"", size, header.model_fp if header else b"",
                 created, (header.last_used_ms if header else 0) or created, header.hits if header else 0,
                 False, header.label if header else "")


@dataclass(frozen=True)
class Share:
    """A record's part of a store: ``bytes`` its share (the block store divides each block among the
    records that use it, so the shares add up to the total), ``shared`` the bytes of its blocks other
    records use too."""

    bytes: int
    shared: int


class CheckpointStore:
    """The file tier: one directory of checkpoint files (a ``StorageTier``, engine/checkpoint/tier.py)."""

    tier_name = "file"

    def __init__(self, root: Path, budget_bytes: int | None = None, lock_timeout_s: float = 15.0):
        """``budget_bytes`` None: the budget saved in ``store.json`` (``set_budget``), else 2 GiB."""
        self.root = Path(root)
        private_dir(self.root)
        private_file(self.root / INDEX_NAME)  # before SQLite creates it: its -wal and -shm take its mode
        self.budget_bytes = budget_bytes if budget_bytes is not None else self._saved_budget()
        self.kv_encoding = self._saved_encoding()
        self.lock = StoreLock(self.root / "store.lock", lock_timeout_s)
        self.models = ModelRegistry(self.root / "models.json")
        self._db_lock = threading.RLock()
        index = self.root / INDEX_NAME
        try:
            try:
                self._open_index(index)
            except sqlite3.DatabaseError as exc:
                if not _index_damaged(exc):
                    raise
                # The index is a cache of what the files' headers say: rebuild it rather than refuse the store.
                log.warning("the saved-context index %s is damaged (%s); rebuilding it from the checkpoint files "
                            "(the damaged one is kept as %s)", index, exc, index.name + DAMAGED_SUFFIX)
                self._set_aside(index)
                self._open_index(index)
        except sqlite3.DatabaseError as exc:
            full = "full" in str(exc).lower()
            raise CheckpointStoreError(
                f"the saved-context index {index} cannot be used ({exc})"
                + ("; the disk may be full. Free some space, or" if full else "; you can")
                + f" delete {self.root} (saved context is a cache: no conversation is lost)") from None

    def _open_index(self, index: Path) -> None:
        """Open (creating) the index and reconcile it with the directory; on failure nothing stays open."""
        # The busy timeout first, and the switch to WAL under the store lock: two processes opening a
        # new store at once otherwise race on the journal mode ("database is locked").
        self._db = sqlite3.connect(index, check_same_thread=False, isolation_level=None, timeout=5)
        try:
            with self.lock.held():
                self._db.execute("PRAGMA journal_mode=WAL")
                self._db.executescript(_SCHEMA)
                self._add_label_column()
                self._extra_schema()
                self.remove_stale_temp_files()
                self.reconcile()
        except BaseException:
            self._db.close()
            raise

    def _extra_schema(self) -> None:
        """Tables a tier built on this one keeps in the same index (the block store's nodes)."""

    def _set_aside(self, index: Path) -> None:
        """Move a damaged index aside (one copy, replacing an older one) with its WAL files, under the lock."""
        with self.lock.held():
            os.replace(index, index.with_name(index.name + DAMAGED_SUFFIX))
            for side in ("-wal", "-shm"):
                index.with_name(index.name + side).unlink(missing_ok=True)
            private_file(index)

    def _add_label_column(self) -> None:
        """An index made before labels were kept gets the column; its rows' labels come from their
        headers at the next reconcile."""
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(entries)")}
        if "label" not in columns:
            self._db.execute("ALTER TABLE entries ADD COLUMN label TEXT NOT NULL DEFAULT ''")

    def _settings(self) -> dict:
        try:
            saved = read_json(self.root / "store.json", MAX_SETTINGS_BYTES)
        except (OSError, ValueError):
            return {}
        return saved if isinstance(saved, dict) else {}

    def _save_setting(self, key: str, value: object) -> None:
        """Update one key of ``store.json``, keeping the others (written atomically)."""
        settings = self._settings()
        settings[key] = value
        with atomic_write(self.root / "store.json") as fh:
            fh.write(json.dumps(settings).encode())

    def _saved_budget(self) -> int:
        value = self._settings().get("budget_bytes")
        return value if isinstance(value, int) and value > 0 else DEFAULT_BUDGET_BYTES

    def _saved_encoding(self) -> str:
        value = self._settings().get("kv_encoding", DEFAULT_KV_ENCODING)
        try:
            encoding_layout(value)
        except (ValueError, TypeError):
            log.warning("store.json names an unknown KV encoding %r; using %s", value, DEFAULT_KV_ENCODING)
            return DEFAULT_KV_ENCODING
        return value

    def set_budget(self, budget_bytes: int) -> None:
        """Change the budget and remember it for later runs (then evict down to it)."""
        if budget_bytes <= 0:
            raise ValueError("the checkpoint budget must be positive")
        self.budget_bytes = budget_bytes
        self._save_setting("budget_bytes", budget_bytes)

    def set_kv_encoding(self, encoding: str) -> None:
        """Choose how new checkpoint files store the KV ("exact" or "int8") and remember it. Files
        already written keep their encoding (appends included) until they are rewritten."""
        encoding_layout(encoding)  # ValueError naming the choices
        self.kv_encoding = encoding
        self._save_setting("kv_encoding", encoding)

    def close(self) -> None:
        with self._db_lock:
            self._db.close()

    def path(self, name: str) -> Path:
        return self.root / name

    @contextmanager
    def _sql(self) -> Iterator[sqlite3.Connection]:
        with self._db_lock:
            yield self._db

    # start-up housekeeping -------------------------------------------------------------------------
    def remove_stale_temp_files(self) -> int:
        """Temp files left by a crash mid-write (``atomic_write`` names them ``.NAME.XXXX.tmp``)."""
        removed = 0
        for p in self.root.glob(".*.tmp"):
            p.unlink(missing_ok=True)
            removed += 1
        if removed:
            log.info("removed %d stale temp file(s) from %s", removed, self.root)
        return removed

    def reconcile(self) -> None:
        """Adopt files named by an older Hearth, drop index rows whose file is gone, index files the
        index does not know (as orphans) and fill in labels the index lacks."""
        with self.lock.held():
            self._adopt_legacy()
            on_disk = {p.name for p in self.root.glob(f"*{SUFFIX}") if not p.name.startswith(".")}
            with self._sql() as db:
                known = {row[0] for row in db.execute("SELECT name FROM entries") if row[0].endswith(SUFFIX)}
                for name in known - on_disk:
                    db.execute("DELETE FROM entries WHERE name = ?", (name,))
                unlabelled = [row[0] for row in db.execute(
                    "SELECT name FROM entries WHERE label = '' AND kind != 'orphan'")]
            for name in sorted(on_disk - known):
                self._index_unknown(name)
            for name in sorted(set(unlabelled) & on_disk):
                self._fill_label(name)

    def _adopt_legacy(self) -> None:
        """Rename each ``conv-<sha>.hkv`` / ``prefix-<sha>.hkv`` to the per-model name its header gives,
        keeping its index row (and so its owner). One whose header cannot be read keeps its name: a
        conversation's is tried, reported and rebuilt when the conversation is next used (see
        ``conversation_entry``); a shared prefix's is deleted, there being no one to report it to."""
        for path in sorted(self.root.glob(f"*{SUFFIX}")):
            if LEGACY_NAME.fullmatch(path.name):
                try:
                    self._adopt(path)
                except OSError as exc:  # it keeps its old name: still found by its conversation, adopted later
                    log.warning("cannot adopt checkpoint %s: %s", path.name, exc)

    def _adopt(self, path: Path) -> None:
        try:
            with CheckpointReader(path) as reader:
                header = reader.read_header()
        except CheckpointError as exc:
            if path.name.startswith("prefix-"):
                self.remove(path.name, f"an unreadable shared prefix ({exc})")
            else:
                log.info("checkpoint %s cannot be read (%s); a session will report and rebuild it", path.name, exc)
            return
        target = f"{path.name[:-len(SUFFIX)]}-{model_tag(header.model_fp)}{SUFFIX}"
        if self.path(target).exists():  # written by this Hearth, so newer: the old one is redundant
            self.remove(path.name, f"superseded by {target}")
            return
        os.replace(path, self.path(target))
        fsync_dir(self.root)
        with self._sql() as db:
            db.execute("DELETE FROM entries WHERE name = ?", (target,))
            db.execute("UPDATE entries SET name = ?, model_fp = ?, label = ? WHERE name = ?",
                       (target, header.model_fp, header.label, path.name))
        log.info("adopted checkpoint %s as %s (%s)", path.name, target, header.label)

    def _fill_label(self, name: str) -> None:
        try:
            with CheckpointReader(self.path(name)) as reader:
                header = reader.read_header()
        except CheckpointError:
            return  # judged when a session tries it
        with self._sql() as db:
            db.execute("UPDATE entries SET label = ?, model_fp = ? WHERE name = ?", (header.label, header.model_fp, name))

    def _index_unknown(self, name: str) -> None:
        """Index a file the index did not know, without judging it: a damaged one is reported (with
        its reason) and replaced when a session next tries it, not silently dropped here."""
        path = self.path(name)
        self.put(unknown_entry(name, lambda: CheckpointReader(path), path.stat().st_size))

    # the index ---------------------------------------------------------------------------------------
    def put(self, e: Entry) -> None:
        with self._sql() as db:
            db.execute("INSERT OR REPLACE INTO entries (name, conversation, kind, tokens, text_len, text_sha, bytes, "
                       "model_fp, created_ms, last_used_ms, hits, pinned, label) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                       (e.name, e.conversation, e.kind, e.tokens, e.text_len, e.text_sha, e.bytes, e.model_fp,
                        e.created_ms, e.last_used_ms, e.hits, int(e.pinned), e.label))

    def entries(self, conversation: str | None = None, kind: str | None = None) -> list[Entry]:
        sql, args = f"SELECT {_ENTRY_COLUMNS} FROM entries WHERE 1=1", []
        if conversation is not None:
            sql += " AND conversation = ?"
            args.append(conversation)
        if kind is not None:
            sql += " AND kind = ?"
            args.append(kind)
        with self._sql() as db:
            rows = db.execute(sql + " ORDER BY last_used_ms DESC", args).fetchall()
        return [_entry(row) for row in rows]

    def entry(self, name: str) -> Entry | None:
        with self._sql() as db:
            row = db.execute(f"SELECT {_ENTRY_COLUMNS} FROM entries WHERE name = ?", (name,)).fetchone()
        return _entry(row) if row else None

    def _owned(self, e: Entry | None, conversation: str) -> Entry | None:
        """Re-attach an entry found by name to its owner, if the index had lost track."""
        if e is not None and e.conversation != conversation:
            e.conversation = conversation
            self.put(e)
        return e

    def conversation_entry(self, conversation: str, model_fp: bytes) -> Entry | None:
        """The conversation's checkpoint under this model; else a file under the name an older Hearth
        gave it, which is there only because its header could not be read (trying it reports why)."""
        e = self.entry(conversation_file(conversation, model_fp)) or self.entry(legacy_conversation_file(conversation))
        return self._owned(e, conversation)

    def conversation_entries(self, conversation: str) -> list[Entry]:
        """Every checkpoint of the conversation, whatever its model, most recently used first."""
        key = conversation_key(conversation)
        with self._sql() as db:
            rows = db.execute(f"SELECT {_ENTRY_COLUMNS} FROM entries WHERE name = ? OR name LIKE ? "
                              "ORDER BY last_used_ms DESC", (key + SUFFIX, key + "-%")).fetchall()
        return [self._owned(_entry(row), conversation) for row in rows]

    # the models -------------------------------------------------------------------------------------------
    def note_model(self, model_fp: bytes, label: str, gguf: Path | None) -> None:
        """Remember which model a fingerprint is (its label and GGUF), so its files can be named in
        words and found gone later. A store that cannot be written only loses that knowledge."""
        try:
            with self.lock.held():
                self.models.note(model_fp, label, gguf)
        except (OSError, StoreBusyError) as exc:
            log.warning("could not note the model in %s: %s", self.models.path, exc)

    def known_models(self) -> dict[str, KnownModel]:
        """Fingerprint (hex) → label, GGUF and last use of every model noted in this store."""
        return self.models.read()

    def model_label(self, entry: Entry) -> str:
        """The entry's model in words: its header's label, else what the registry knows, else ""."""
        if entry.label:
            return entry.label
        known = self.models.read().get(entry.model_fp.hex())
        return known.label if known else ""

    def touch(self, name: str) -> None:
        with self._sql() as db:
            db.execute("UPDATE entries SET hits = hits + 1, last_used_ms = ? WHERE name = ?",
                       (int(time.time() * 1000), name))

    def set_pinned(self, name: str, pinned: bool) -> None:
        with self._sql() as db:
            db.execute("UPDATE entries SET pinned = ? WHERE name = ?", (int(pinned), name))

    def total_bytes(self) -> int:
        with self._sql() as db:
            return int(db.execute("SELECT COALESCE(SUM(bytes), 0) FROM entries").fetchone()[0])

    def bytes_by_kind(self) -> dict[str, int]:
        """The files' size per kind: "conversation", "prefix" (shared system prompts), "api" (the
        server's prompt cache), "orphan" (leftovers Reclaim removes)."""
        with self._sql() as db:
            return {kind: int(n) for kind, n in db.execute("SELECT kind, SUM(bytes) FROM entries GROUP BY kind")}

    def shares(self) -> dict[str, Share]:
        """Each record's part of the total (here: its file) and the bytes it shares (none: files share nothing)."""
        return {e.name: Share(e.bytes, 0) for e in self.entries()}

    def shared_bytes(self) -> int:
        return 0

    def block_count(self) -> int:
        return 0

    def stats(self) -> dict[str, int]:
        """Counters of what the store wrote (the block store keeps them; files keep none)."""
        return {}

    # removal ------------------------------------------------------------------------------------------
    def remove(self, name: str, why: str = "") -> None:
        with self.lock.held():
            self.path(name).unlink(missing_ok=True)
            with self._sql() as db:
                db.execute("DELETE FROM entries WHERE name = ?", (name,))
        if why:
            log.info("removed checkpoint %s: %s", name, why)

    def discard(self, name: str, why: str) -> None:
        self.remove(name, why)

    def delete_conversation(self, conversation: str) -> int:
        """Delete every checkpoint of ``conversation``, under every model; return how many files went."""
        names = ({e.name for e in self.entries(conversation=conversation)}
                 | {e.name for e in self.conversation_entries(conversation)}
                 | {p.name for p in self.root.glob(f"{conversation_key(conversation)}*{SUFFIX}")})
        gone = 0
        for name in names:
            gone += self.path(name).exists()
            self.remove(name)
        return gone

    def enforce_budget(self, protect: Iterable[str] = ()) -> list[str]:
        """Evict until the store fits its budget, every model's files counting: first those of models
        whose GGUF is gone, then the lowest-scoring; return the names evicted."""
        evicted: list[str] = []
        with self.lock.held():
            entries = self.entries()
            total = sum(e.bytes for e in entries)
            if total <= self.budget_bytes:
                return evicted
            for e, why in eviction_order(entries, protect, self.models.gone()):
                if total <= self.budget_bytes:
                    break
                self.remove(e.name, f"over the {self.budget_bytes >> 20} MiB budget ({why})")
                total -= e.bytes
                evicted.append(e.name)
        return evicted

    def gc(self, live_conversations: set[str] | None = None) -> dict:
        """Remove orphans (and, given the live set, checkpoints of deleted conversations); then evict."""
        with self.lock.held():
            temp = self.remove_stale_temp_files()
            self.reconcile()
            dropped = []
            live_keys = None if live_conversations is None else {conversation_key(c) for c in live_conversations}
            for e in self.entries():
                gone = e.kind == "orphan" or (
                    live_keys is not None and e.kind == "conversation" and _owner_key(e.name) not in live_keys)
                if gone:
                    self.remove(e.name, "no conversation owns it")
                    dropped.append(e.name)
            evicted = self.enforce_budget()
        return {"temp_files": temp, "orphans": dropped, "evicted": evicted, "bytes": self.total_bytes(),
                "budget": self.budget_bytes}

    # the storage-tier interface (engine/checkpoint/tier.py) -------------------------------------------
    def record_name(self, owner: str, model_fp: bytes) -> str:
        return conversation_file(owner, model_fp)

    def prefix_name(self, text_sha: bytes, model_fp: bytes) -> str:
        return prefix_file(text_sha, model_fp)

    def prefix_entries(self, model_fp: bytes, text: bytes) -> list[Entry]:
        return prefixes_of(self.entries(kind="prefix"), model_fp, text)

    def open(self, name: str) -> CheckpointReader:
        return CheckpointReader(self.path(name))

    def stamp(self, name: str) -> Stamp | None:
        try:
            st = os.stat(self.path(name))
        except OSError:
            return None
        return st.st_size, st.st_mtime_ns

    def note_use(self, name: str, header: FileHeader) -> None:
        try:
            writer.update_usage(self.path(name), header, writer.now_ms(), header.hits + 1)
        except OSError:
            pass  # statistics only
        self.touch(name)

    def create(self, name: str, identity: Identity, records: Sequence[writer.NewRecord], encoding: str) -> Written:
        return Written(*writer.write_new(self.path(name), identity, records, encoding))

    def append(self, name: str, header: FileHeader, keep: Sequence[RecordInfo],
               rec: writer.NewRecord) -> tuple[RecordInfo, int]:
        return writer.append(self.path(name), header, keep, rec)

    def cut(self, name: str, keep: Sequence[RecordInfo]) -> None:
        writer.cut(self.path(name), keep)

    def copy(self, name: str, owner: str) -> Entry | None:
        """Copy a conversation's file for ``owner`` (a branch), by the owner's own name; OSError if it fails."""
        source = self.entry(name)
        if source is None:
            return None
        with self.lock.held():
            target = self.path(copy_name(name, owner, source.model_fp))
            shutil.copyfile(self.path(name), target)
            os.chmod(target, FILE_MODE)  # copyfile makes it by the umask
        self.reconcile()
        return self.conversation_entry(owner, source.model_fp)

    def usage(self) -> TierUsage:
        return TierUsage(self.tier_name, self.total_bytes(), self.budget_bytes, self.bytes_by_kind())

    def free_space(self) -> tuple[int, str] | None:
        try:
            return shutil.disk_usage(self.root).free, f"the disk holding {self.root}"
        except OSError:
            return None

    def side_file(self, name: str) -> Path:
        return self.root / name

    def read_stream(self, name: str) -> BinaryIO:
        return open(self.path(name), "rb")

    @contextmanager
    def staging(self, owner: str, model_fp: bytes) -> Iterator[Path]:
        final = self.path(conversation_file(owner, model_fp))
        tmp = final.with_name(f".{final.name}.import.tmp")  # the start-up clean-up removes strays
        try:
            yield tmp
        finally:
            tmp.unlink(missing_ok=True)

    def install(self, staged: Path, owner: str, model_fp: bytes, isolated: bool = False) -> Entry | None:
        """``isolated``: ignored here (a file serves only its owner anyway)."""
        final = self.path(conversation_file(owner, model_fp))
        with self.lock.held():
            os.replace(staged, final)
            fsync_dir(final.parent)
        self.reconcile()
        return self.conversation_entry(owner, model_fp)
