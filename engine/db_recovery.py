"""The conversation database's safety net: rolling backups, a quick check, and restore.

One damaged page of ``conversations.sqlite3`` would otherwise lock the user out of every conversation.
Backups are made with SQLite's online backup API (a consistent copy while the app runs) into
``backups/`` next to the database, at most once a day, the newest ``KEEP`` kept, never of a database
that fails its check (a damaged copy must not push out a good one). Every process that writes makes
them: the window in ``at_start`` (off its UI thread), the CLI and the server when they open the store
(``daily_backup``), and one more before the schema is upgraded (``before_migration``). Restore moves the
damaged file aside (never deletes it; a sound one only when forced) and puts the newest good backup, or a named one, in its place
atomically; with no sound backup, ``engine.db_salvage`` copies what can still be read into a new one.
"""

from __future__ import annotations

import logging
import os
import shutil
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

from engine import db_lock
from engine.db_aside import set_aside
from engine.db_schema import SCHEMA_VERSION
from engine.errors import ConversationError
from engine.fsutil import fsync_dir
from engine.private_files import FILE_MODE, private_dir

log = logging.getLogger(__name__)

KEEP = 3
EVERY_S = 24 * 3600
MAX_BYTES = 2 << 30  # a larger database is not copied automatically (say so in the log); `db backup` still can
SPARE_BYTES = 256 << 20  # free space to leave after a backup
PREFIX, SUFFIX = "conversations-", ".sqlite3"


@dataclass(frozen=True)
class DbCheck:
    path: Path
    ok: bool
    problem: str  # "" when ok
    backups: list[Path]  # newest first


@dataclass(frozen=True)
class StartCheck:
    """What the window learns before it opens the store: the check, the backups, the day's backup."""

    check: DbCheck
    backups: list[Path]  # newest first
    backup_made: Path | None


@dataclass(frozen=True)
class RestoreResult:
    source: Path  # the backup put in place
    damaged: Path | None  # where the previous file went


def at_start(db: Path) -> StartCheck:
    """quick_check, and the day's backup when the database is sound (a failed backup is logged); one more
    before a schema upgrade the store will make when it opens."""
    result = check(db)
    made = None
    if result.ok:
        made = daily_backup(db, logging.WARNING)
        if 0 < _schema_version(db) < SCHEMA_VERSION:  # here, so the store's own copy before it upgrades is not
            made = before_migration(db) or made       # made on the window's UI thread
    return StartCheck(result, list_backups(db), made)


def _query_one(db: Path, sql: str) -> object:
    """The first value of ``sql``'s first row (None: no row), read-only; raises sqlite3.Error."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    try:
        row = conn.execute(sql).fetchone()
        return None if row is None else row[0]
    finally:
        conn.close()


def _schema_version(db: Path) -> int:
    try:
        return _query_one(db, "PRAGMA user_version")
    except sqlite3.Error:
        return 0


def daily_backup(db: Path, level: int = logging.INFO) -> Path | None:
    """The day's backup when it is due; never raises. A failure is logged at ``level``: the CLI keeps it
    off the terminal (a damaged or unwritable database is the store's to report, in its own words)."""
    try:
        return backup(db, level=level)
    except (ConversationError, OSError, sqlite3.Error) as exc:
        log.log(level, "could not back up %s: %s", Path(db).name, exc)
        return None


def before_migration(db: Path) -> Path | None:
    """A backup of ``db`` just before its schema is upgraded, unless the newest backup already holds it
    as it is now; never raises (a failed backup is logged, and the migration is atomic anyway)."""
    db = Path(db)
    try:
        existing = list_backups(db)
        parts = [p.stat() for p in (db, Path(str(db) + "-wal")) if p.exists()]
        changed = max(st.st_mtime for st in parts if st.st_size)  # a -wal just opened, still empty, is no change
        if existing and existing[0].stat().st_mtime > changed:
            return None
        return backup(db, force=True)
    except (ConversationError, OSError, sqlite3.Error, ValueError) as exc:
        log.warning("could not back up %s before upgrading it: %s", db.name, exc)
        return None


def way_out(db: Path) -> str:
    """What the person can run about a damaged ``db``: restore when there is a backup, else salvage."""
    salvage = "'hearth-cli db salvage' copies every conversation that can still be read into a new database"
    if list_backups(db):
        return (f"'hearth-cli db restore' puts the newest backup in its place, or {salvage} "
                "(both keep the damaged file aside)")
    return f"there is no backup; {salvage} (the damaged file is kept aside)"


def backups_dir(db: Path) -> Path:
    return Path(db).parent / "backups"


def list_backups(db: Path) -> list[Path]:
    """The backups of ``db``, newest first (their names sort by time)."""
    folder = backups_dir(db)
    if not folder.is_dir():
        return []
    return sorted((p for p in folder.glob(f"{PREFIX}*{SUFFIX}") if p.is_file()), reverse=True)


def problem_with(path: Path) -> str:
    """"" when ``path`` is a sound SQLite database (or absent: nothing to lose), else what is wrong."""
    path = Path(path)
    if not path.exists():
        return ""
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
        try:
            rows = [r[0] for r in db.execute("PRAGMA quick_check").fetchall()]
        finally:
            db.close()
    except sqlite3.DatabaseError as exc:
        return f"{path.name} cannot be read as a database ({exc})"
    if rows != ["ok"]:
        return f"{path.name} is damaged: {'; '.join(str(r) for r in rows[:3])}"
    return ""


def check(db: Path) -> DbCheck:
    problem = problem_with(db)
    return DbCheck(Path(db), not problem, problem, list_backups(db))


def backup(db: Path, force: bool = False, level: int = logging.WARNING) -> Path | None:
    """Copy ``db`` into its backups; None when skipped (not due, too large, short of space, or nothing to
    copy; a skip for want of space is logged at ``level``). A damaged database is an error: it would
    replace a good backup with a bad one."""
    db = Path(db)
    if not db.exists():
        return None
    existing = list_backups(db)
    if not force and existing and time.time() - existing[0].stat().st_mtime < EVERY_S:
        return None
    if not force and not _holds_conversations(db):  # a new install's empty file: nothing to lose yet
        return None
    size = db.stat().st_size
    folder = private_dir(backups_dir(db))
    if not force and size > MAX_BYTES:
        log.info("not backing up %s automatically: %d MiB is more than %d MiB", db.name, size >> 20, MAX_BYTES >> 20)
        return None
    if shutil.disk_usage(folder).free < size + SPARE_BYTES:
        log.log(level, "not backing up %s: not enough free disk space", db.name)
        return None
    problem = problem_with(db)
    if problem:
        raise ConversationError(f"not backing up {db.name}: {problem}")
    target = folder / f"{PREFIX}{time.strftime('%Y%m%d-%H%M%S')}-{time.time_ns() % 10**9:09d}{SUFFIX}"
    tmp = target.with_name("." + target.name + ".tmp")
    try:
        _copy_database(db, tmp)
        os.replace(tmp, target)
        fsync_dir(folder)
    finally:
        tmp.unlink(missing_ok=True)
    for old in list_backups(db)[KEEP:]:
        old.unlink(missing_ok=True)
    return target


def _holds_conversations(db: Path) -> bool:
    """Whether ``db`` has a conversation to keep; True when it cannot tell (damage is the check's to report)."""
    try:
        return _query_one(db, "SELECT 1 FROM conversations LIMIT 1") is not None
    except sqlite3.OperationalError as exc:
        return "no such table" not in str(exc)
    except sqlite3.DatabaseError:
        return True


class SoundDatabaseError(ConversationError):
    """``restore`` refused: the database passes its check, and the backup would replace it (``force`` not given)."""


def restore(db: Path, source: Path | None = None, force: bool = False) -> tuple[Path, Path | None]:
    """Put a good backup (``source``, else the newest that passes its check) in place of ``db``; the
    current file, if any, moves aside with its -wal/-shm as ``<name>.damaged-<time>``, or when it passes
    its check as ``<name>.replaced-<time>``. A sound ``db`` is replaced only with ``force``: a backup is
    older, so restoring it over a healthy file loses what was written since (SoundDatabaseError
    otherwise). Returns (the backup used, where the old file went). The caller must have closed every
    connection to ``db``."""
    db = Path(db)
    with db_lock.exclusive(db):  # never under a process that has it open: its writes would go to the file set aside
        return _restore(db, source, force)


def _restore(db: Path, source: Path | None, force: bool) -> tuple[Path, Path | None]:
    candidates = [Path(source)] if source is not None else list_backups(db)
    chosen = next((c for c in candidates if c.is_file() and not problem_with(c)), None)
    if chosen is None:
        if source is not None:
            raise ConversationError(f"cannot restore: {source} is not a sound backup")
        raise ConversationError(f"cannot restore: no sound backup of {db.name} was found (in {backups_dir(db)}); "
                                "'hearth-cli db salvage' copies every conversation that can still be read into a "
                                "new database, keeping the damaged file aside")
    sound = db.exists() and not problem_with(db)
    if sound and not force:
        raise SoundDatabaseError(
            f"{db.name} is sound; restoring the backup of {_when(chosen)} would replace "
            f"{_conversation_count(db)} conversation(s) with {_conversation_count(chosen)} — pass --force to do it "
            "anyway")
    aside = None
    if db.exists():
        aside = set_aside(db, "replaced" if sound else "damaged")
    tmp = db.with_name("." + db.name + ".restore.tmp")
    try:
        _copy_database(chosen, tmp)
        os.replace(tmp, db)
        fsync_dir(db.parent)
    finally:
        tmp.unlink(missing_ok=True)
    return chosen, aside


def _when(backup_file: Path) -> str:
    """A backup's time as its name holds it (conversations-YYYYmmdd-HHMMSS-…), else its file's."""
    try:
        stamp = time.strptime(backup_file.name[len(PREFIX):len(PREFIX) + 15], "%Y%m%d-%H%M%S")
    except ValueError:
        stamp = time.localtime(backup_file.stat().st_mtime)
    return time.strftime("%Y-%m-%d %H:%M", stamp)


def _conversation_count(db: Path) -> int | str:
    """Conversations in ``db`` (not counting deleted ones still undoable); "?" when it cannot be counted."""
    try:
        return _query_one(db, "SELECT COUNT(*) FROM conversations WHERE deleted_ms IS NULL")
    except sqlite3.Error:
        return "?"


def salvage(db: Path):
    """Replace a damaged ``db`` by a new database of every row that can still be read (engine.db_salvage);
    returns its SalvageResult. The caller must have closed every connection to ``db``."""
    from engine.db_salvage import salvage as run

    with db_lock.exclusive(Path(db)):  # as restore: not under a process that has it open
        return run(db)


def _copy_database(src: Path, dst: Path) -> None:
    """A consistent copy through SQLite's backup API, 0600, fsynced."""
    dst.unlink(missing_ok=True)
    fd = os.open(dst, os.O_WRONLY | os.O_CREAT, FILE_MODE)
    os.close(fd)
    source = sqlite3.connect(f"file:{src}?mode=ro", uri=True, timeout=10)
    target = sqlite3.connect(dst)
    try:
        source.backup(target)
        target.execute("PRAGMA journal_mode=DELETE")  # a self-contained file, no -wal beside it
    finally:
        target.close()
        source.close()
    os.chmod(dst, FILE_MODE)
    with open(dst, "rb") as fh:
        os.fsync(fh.fileno())
