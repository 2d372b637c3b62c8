"""Salvage: a damaged conversation database with no sound backup, copied row by row into a new one.

One bad page must not cost every conversation. Each table is read in rowid order, forwards and then
backwards (a scan stops at the first page that cannot be read), and the rows between the two are looked
up one rowid at a time. When any of that fails (a root or interior page is gone, or page 1 with the
schema), the file's leaf pages are read one by one as well (engine.db_pages) and each record goes to the
table its shape fits, so only the rows on the damaged pages themselves are lost. The search indexes are
not read:
the new database's triggers rebuild them from the text. A message whose conversation row was lost keeps
its text under a re-created, titled "Recovered" conversation. The new file is written beside the old one
and renamed into place; the damaged file is kept aside as ``<name>.damaged-<time>``, never deleted.
"""

from __future__ import annotations

import logging
import os
import shutil
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from engine.db_aside import set_aside
from engine.db_pages import leaf_rows, unreadable_pages
from engine.db_schema import ID_PATTERN, MIGRATIONS, ROLES, SCHEMA_VERSION, title_from
from engine.errors import ConversationError
from engine.fsutil import fsync_dir
from engine.private_files import FILE_MODE

log = logging.getLogger(__name__)

TABLES = ("conversations", "messages", "alternatives", "imports")  # in the order their rows are inserted
OPEN_END_PROBES = 1000  # past the last row a scan reached, give up after this many rowids in a row hold nothing


@dataclass(frozen=True)
class SalvageResult:
    conversations: int  # conversations in the new database
    messages: int
    recreated: int  # of ``conversations``: re-created for messages whose conversation row was lost
    missing_messages: int  # messages known to be lost (an index lists them, or a gap in their numbering)
    unreadable_rows: int  # rowids between readable rows that could not be read, of tables not accounted for
    damaged: Path  # where the damaged file went
    unreadable_ends: tuple[str, ...] = ()  # tables of which rows may be lost beyond those counted (how many: unknown)
    lost_conversations: int = 0  # conversations known to be lost (an index lists them), not re-created
    unreadable_pages: int | None = 0  # pages of the file that parse as nothing (None: cannot be told)

    def summary(self) -> str:
        """What was kept and what was lost, in one line; "nothing was lost" only when every table's rows are
        accounted for (read whole, or an index of it lists no row that was not kept)."""
        text = f"kept {self.conversations} conversation(s) and {self.messages} message(s)"
        if self.recreated:
            text += (f" ({self.recreated} conversation(s) re-created as \"Recovered\": their title and settings "
                     "could not be read)")
        lost = []
        if self.missing_messages:
            lost.append(f"{self.missing_messages} message(s) could not be read")
        if self.lost_conversations:
            lost.append(f"{self.lost_conversations} conversation(s) could not be read")
        if self.unreadable_rows:
            lost.append(f"{self.unreadable_rows} row(s) on damaged pages could not be read")
        if self.unreadable_ends:
            names = [_WHAT[t] for t in self.unreadable_ends]
            what = " or ".join(filter(None, (", ".join(names[:-1]), names[-1])))
            pages = f"{self.unreadable_pages} page(s) of the file could not be read, so " if self.unreadable_pages else ""
            lost.append(f"{pages}{'more ' if lost else 'some '}{what} may be lost")
        text += "; " + (", ".join(lost) if lost else "no message was lost" if self.recreated else "nothing was lost")
        return text + f"; the damaged file is kept at {self.damaged}"


_WHAT = {"conversations": "conversations", "messages": "messages", "alternatives": "earlier versions of replies",
         "imports": "records of imports under way"}


def salvage(db: Path) -> SalvageResult:
    """Replace ``db`` by a new database holding every row of it that can still be read. The caller must
    have closed every connection to ``db``. ConversationError when nothing of it can be read."""
    db = Path(db)
    if not db.is_file():
        raise ConversationError(f"nothing to salvage: {db} does not exist")
    tmp = db.with_name("." + db.name + ".salvage.tmp")
    folded = db.with_name("." + db.name + ".salvage-source")
    try:
        source = _with_wal_folded_in(db, folded)
        counts = _copy_readable(source, tmp)
        aside = set_aside(db, "damaged")
        os.replace(tmp, db)
        fsync_dir(db.parent)
    finally:
        tmp.unlink(missing_ok=True)
        for suffix in ("", "-wal", "-shm"):
            Path(str(folded) + suffix).unlink(missing_ok=True)
    result = SalvageResult(**counts, damaged=aside)
    log.warning("salvaged %s: %s", db, result.summary())
    return result


def _with_wal_folded_in(db: Path, copy: Path) -> Path:
    """The file to read: ``db`` itself, or with a write-ahead log beside it, a copy with the log folded in
    (the pages read one by one must be the newest; older ones may hold rows deleted since). The damaged
    file itself is never written."""
    wal = Path(str(db) + "-wal")
    if not wal.exists() or wal.stat().st_size == 0:
        return db
    for suffix in ("", "-wal"):
        target = Path(str(copy) + suffix)
        target.unlink(missing_ok=True)
        os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE))  # private, as the original
        shutil.copyfile(Path(str(db) + suffix), target)
    try:
        con = sqlite3.connect(copy)
        try:
            con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            con.close()
    except sqlite3.DatabaseError as exc:  # read through the log, and pages straight off the main file
        log.warning("salvage: could not fold the write-ahead log of %s in (%s)", db, exc)
    return copy


def _copy_readable(db: Path, tmp: Path) -> dict:
    """Copy what can be read of ``db`` into a new database at ``tmp``; SalvageResult's counts."""
    src = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    try:
        present: dict[str, list[str]] | None = {
            t: [r[1] for r in src.execute(f"PRAGMA table_info({t})")] for t in TABLES}
    except sqlite3.DatabaseError as exc:  # page 1 (the header and the list of tables) is gone: read the pages
        log.warning("salvage: the list of tables of %s cannot be read (%s); reading its pages one by one", db, exc)
        present = None
    tmp.unlink(missing_ok=True)
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE))
    out = sqlite3.connect(tmp, isolation_level=None)
    try:
        out.executescript(";\n".join(MIGRATIONS) + f"; PRAGMA user_version = {SCHEMA_VERSION};")
        schema = {t: [r[1] for r in out.execute(f"PRAGMA table_info({t})")] for t in TABLES}
        rows: dict[str, dict[int, dict]] = {}
        failed: dict[str, set[int]] = {}
        incomplete = set()  # tables whose tree lost some leaves: those are read off the pages directly
        for table in TABLES:
            columns = [c for c in (present or {}).get(table, []) if c in schema[table]]
            rows[table], failed[table], end_lost = _read_table(src, table, columns) if columns else ({}, set(), False)
            if present is None or end_lost or failed[table]:
                incomplete.add(table)
        witnesses = {t: _witness(src, t) for t in incomplete} if present is not None else {}
        pages_lost: set[int] | None = set()
        if incomplete:
            found, unplaced = _leaf_records(db, schema)
            for table in incomplete:
                for rowid, row in found[table].items():
                    rows[table].setdefault(rowid, row)
            pages_lost = unreadable_pages(db)
            # every page parses but page 1 (never a row of Hearth's, only the list of tables), and every
            # record found a table: what the tree could not reach was all read off the leaves
            if pages_lost is None or not pages_lost <= {1} or unplaced:
                log.warning("salvage: %s page(s) of %s parse as nothing, %d record(s) fit no table",
                            "some" if pages_lost is None else len(pages_lost), db, unplaced)
            else:
                incomplete = set()
        out.execute("BEGIN")
        kept = {"conversations": _insert(out, "conversations", rows["conversations"])}
        recreated = _recreate_missing(out, rows)
        for table in TABLES[1:]:
            kept[table] = _insert(out, table, rows[table])
        gaps = _missing_messages(out)
        out.execute("COMMIT")
        problem = out.execute("PRAGMA quick_check").fetchone()[0]
        if problem != "ok":  # cannot happen short of a failing disk: never put a bad copy in place
            raise ConversationError(f"the salvaged copy of {db.name} fails its own check ({problem})")
    except sqlite3.DatabaseError as exc:
        raise ConversationError(f"could not write the salvaged copy of {db.name}: {exc}") from None
    finally:
        out.close()
        src.close()
    if not (kept["conversations"] or recreated or kept["messages"]) and present is None:
        raise ConversationError(f"{db} cannot be salvaged: no conversation can be read from it; keep the file, "
                                "it may still be rescued by hand")
    with open(tmp, "rb") as fh:
        os.fsync(fh.fileno())
    # what is known lost: rows an index (or the tree) lists that did not go in; the rest is uncounted
    lost: dict[str, set[int]] = {}
    uncounted = []
    for table in TABLES:
        listed, whole = witnesses.get(table, ({}, False))
        lost[table] = (listed.keys() | rows[table].keys()) - kept[table]
        if table in incomplete and not whole:
            uncounted.append(table)
    unreadable = sum(len(failed[t] - rows[t].keys() - witnesses.get(t, ({}, False))[0].keys()) for t in uncounted)
    return {"conversations": len(kept["conversations"]) + len(recreated), "messages": len(kept["messages"]),
            "recreated": len(recreated), "missing_messages": max(len(lost["messages"]), gaps),
            "lost_conversations": _lost_conversations(lost["conversations"], witnesses, recreated),
            "unreadable_rows": unreadable, "unreadable_ends": tuple(uncounted),
            "unreadable_pages": None if pages_lost is None else len(pages_lost)}


# The indexes (and search-index tables) that list every row of a table by rowid; read through a covering
# index, they need none of the table's own pages, so they say which rows a damaged table held.
_WITNESSES = {
    "conversations": ("SELECT rowid, id FROM conversations INDEXED BY sqlite_autoindex_conversations_1",
                      "SELECT rowid, NULL FROM conversations INDEXED BY conversations_by_update",
                      "SELECT id, NULL FROM title_fts_docsize"),
    "messages": ("SELECT rowid, NULL FROM messages INDEXED BY sqlite_autoindex_messages_1",
                 "SELECT rowid, NULL FROM messages INDEXED BY messages_by_conversation",
                 "SELECT id, NULL FROM message_fts_docsize"),
    "alternatives": ("SELECT rowid, NULL FROM alternatives INDEXED BY sqlite_autoindex_alternatives_1",),
    "imports": ("SELECT rowid, NULL FROM imports INDEXED BY sqlite_autoindex_imports_1",),
}


def _witness(src: sqlite3.Connection, table: str) -> tuple[dict[int, str | None], bool]:
    """(the rowids of ``table`` its indexes list, with a conversation's id where known; whether one of them
    was read whole, so that the rowids are all the table held)."""
    listed: dict[int, str | None] = {}
    whole = False
    for sql in _WITNESSES[table]:
        try:
            for rowid, key in _rows(src, sql):
                if listed.get(rowid) is None:
                    listed[rowid] = key
            whole = True
        except sqlite3.DatabaseError as exc:  # that index is damaged too (or missing): the next may do
            log.info("salvage: %s: %s", sql, exc)
    return listed, whole


def _lost_conversations(lost: set[int], witnesses: dict, recreated: set[str]) -> int:
    """Conversations known lost and not re-created for their messages (those have new rowids: match them by
    id where an index gave it, else count them off the rows with no id known)."""
    ids = witnesses.get("conversations", ({}, False))[0]
    named = {ids[r] for r in lost if ids.get(r) is not None}
    unnamed = len([r for r in lost if ids.get(r) is None])
    return len(named - recreated) + max(0, unnamed - len(recreated - named))


def _read_table(src: sqlite3.Connection, table: str, columns: list[str]) -> tuple[dict[int, dict], set[int], bool]:
    """(every row the tree still reaches, by rowid; the rowids between reachable rows that failed; whether
    the rowids past the last reachable row failed too: rows may be lost there)."""
    select = f"SELECT rowid, {', '.join(columns)} FROM {table} NOT INDEXED"  # the table itself, not an index
    found: dict[int, tuple] = {}
    failed: set[int] = set()
    end_lost = False
    forward = _scan(src, select + " ORDER BY rowid", found)
    if forward is not None:  # a page failed: read backwards from the end, then the rowids between one by one
        backward = _scan(src, select + " ORDER BY rowid DESC", found)
        high = backward if backward not in (None, _NOTHING) else None
        run: list[int] = []  # rowids in a row past the last found one that held nothing readable
        rowid = forward if forward != _NOTHING else 0
        while high is None or rowid < high - 1:
            rowid += 1
            if rowid in found:
                run = []
                continue
            try:
                row = src.execute(select + " WHERE rowid = ?", (rowid,)).fetchone()
            except sqlite3.DatabaseError:
                failed.add(rowid)
                row = None
            if row is not None:
                found[rowid] = row
                run = []
            elif high is None:
                run.append(rowid)
                if len(run) >= OPEN_END_PROBES:  # past the end: those rowids may never have held a row
                    end_lost = bool(failed & set(run))
                    failed -= set(run)
                    break
    if failed:
        log.warning("salvage: %d rowid(s) of %s could not be read through its tree", len(failed), table)
    return {k: dict(zip(columns, row[1:], strict=True)) for k, row in found.items()}, failed, end_lost


_NOTHING = -1  # a scan that failed before its first row


def _scan(src: sqlite3.Connection, sql: str, found: dict[int, tuple]) -> int | None:
    """Read rows into ``found`` until a page fails: None when the scan finished, else the last rowid it
    reached (``_NOTHING`` when it read none)."""
    last = _NOTHING
    try:
        for row in _rows(src, sql):
            found[row[0]] = row
            last = row[0]
    except sqlite3.DatabaseError:
        return last
    return None


def _rows(src: sqlite3.Connection, sql: str) -> Iterator[tuple]:
    cursor = src.execute(sql)
    while (row := cursor.fetchone()) is not None:
        yield row


def _leaf_records(db: Path, schema: dict[str, list[str]]) -> tuple[dict[str, dict[int, dict]], int]:
    """Rows read off the file's leaf pages (engine.db_pages), each given to the table its shape fits; and how
    many records fit neither one of Hearth's tables nor SQLite's own (those may be rows lost)."""
    found: dict[str, dict[int, dict]] = {t: {} for t in TABLES}
    unplaced = 0
    try:
        for _page, rowid, values in leaf_rows(db):
            table = _shape(values)
            if table is not None and len(values) <= len(schema[table]):
                row = dict(zip(schema[table], values, strict=False))
                if "id" in row and row["id"] is None:  # INTEGER PRIMARY KEY: the rowid itself
                    row["id"] = rowid
                found[table].setdefault(rowid, row)
            elif not _sqlite_own(values):
                unplaced += 1
    except OSError as exc:
        log.warning("salvage: could not read the pages of %s: %s", db, exc)
        unplaced += 1  # unread: not known to hold nothing
    return found, unplaced


def _sqlite_own(v: list) -> bool:
    """A record of SQLite's own tables: the list of tables, sqlite_sequence, or a search index's blocks and
    sizes (FTS5's _data and _docsize: an integer key, stored as NULL, and a blob)."""
    n = len(v)
    if n == 5 and v[0] in ("table", "index", "view", "trigger") and all(isinstance(x, str) for x in v[1:3]):
        return True
    if n == 2 and isinstance(v[0], str) and isinstance(v[1], int):
        return True
    return n == 2 and v[0] is None and isinstance(v[1], bytes)


def _shape(v: list) -> str | None:
    """Which of Hearth's tables a record of this shape belongs to (columns in schema order); None: none."""
    def kinds(*types) -> bool:
        return all(isinstance(x, t) and not (t is int and isinstance(x, bool)) for x, t in zip(v, types, strict=False))

    n = len(v)
    # messages and alternatives: six columns, then the optional finish (migration 7), model (8) and the
    # messages' typed_text (9), text or NULL, then an agent's (10: text, and the milliseconds of thinking); a
    # migration that adds a column to either must widen this (the salvage tests fail if it does not)
    if (6 <= n <= 14 and v[0] is None and kinds(type(None), str, int) and ID_PATTERN.fullmatch(v[1])
            and all(x is None or isinstance(x, (str, int)) and not isinstance(x, bool) for x in v[6:])):
        if v[3] in ROLES and kinds(type(None), str, int, str, str, int):
            return "messages"
        if kinds(type(None), str, int, int, str, int):
            return "alternatives"
    if 7 <= n <= 11 and kinds(str, str, str, str, str, int, int) and ID_PATTERN.fullmatch(v[0]):
        return "conversations"
    if n == 3 and kinds(str, int, int):
        return "imports"
    return None


def _insert(out: sqlite3.Connection, table: str, rows: dict[int, dict]) -> set[int]:
    """Insert rows in rowid order, their rowids kept (the search index of titles refers to them); a row that
    breaks a constraint (a damaged page can read back as nonsense) is left out and logged. Returns the rowids
    that went in."""
    done: set[int] = set()
    for rowid in sorted(rows):
        row = rows[rowid]
        sql = (f"INSERT INTO {table} (rowid, {', '.join(row)}) VALUES ({', '.join('?' * (len(row) + 1))})")
        try:
            out.execute("SAVEPOINT row")
            out.execute(sql, (rowid, *row.values()))
            out.execute("RELEASE row")
            done.add(rowid)
        except sqlite3.DatabaseError as exc:
            out.execute("ROLLBACK TO row")
            out.execute("RELEASE row")
            log.warning("salvage: a row of %s (rowid %s) is not usable: %s", table, rowid, exc)
    return done


def _recreate_missing(out: sqlite3.Connection, rows: dict[str, dict[int, dict]]) -> set[str]:
    """A conversation for each message (or kept reply version) whose own conversation row was lost."""
    have = {r[0] for r in out.execute("SELECT id FROM conversations")}
    orphans: dict[str, list[tuple[str, int]]] = {}  # id -> [(content, created_ms)]
    for table in ("messages", "alternatives"):
        for row in rows[table].values():
            cid = row.get("conversation_id")
            if isinstance(cid, str) and cid not in have and ID_PATTERN.fullmatch(cid):
                ms = row.get("created_ms")
                orphans.setdefault(cid, []).append((row.get("content"), ms if isinstance(ms, int) else 0))
    for cid, texts in orphans.items():
        first = next((t for t, _ in texts if isinstance(t, str) and t.strip()), "")
        times = [ms for _, ms in texts]
        out.execute("INSERT INTO conversations (id, title, created_ms, updated_ms) VALUES (?, ?, ?, ?)",
                    (cid, f"Recovered: {title_from(first)}" if first else "Recovered", min(times), max(times)))
    return set(orphans)


def _missing_messages(out: sqlite3.Connection) -> int:
    """Messages known lost: a conversation's messages are numbered 0, 1, 2… with no gaps, so each gap
    below its highest number is a message that could not be read (lost trailing messages leave no trace)."""
    row = out.execute("SELECT COALESCE(SUM(top + 1 - n), 0) FROM (SELECT MAX(seq) AS top, COUNT(*) AS n "
                      "FROM messages GROUP BY conversation_id)").fetchone()
    return int(row[0])
