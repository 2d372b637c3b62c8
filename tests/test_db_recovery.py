"""A damaged conversation database is not the end: rolling backups, a quick check, and restore."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from engine import db_recovery
from engine.api import database_at_start
from engine.conversations import ConversationStore
from engine.errors import ConversationError
from engine.paths import resolve_paths

from .test_cli import assert_clean_error, run_cli


def _store_with(db: Path, conversations: int) -> None:
    store = ConversationStore(db)
    for i in range(conversations):
        store.create(f"c{i}", system_prompt="Be brief.")
        store.append(f"c{i}", "user", f"message {i} " + "words " * 200)
    store.close()


def _damage(db: Path, how: str) -> None:
    data = bytearray(db.read_bytes())
    if how == "truncated":
        db.write_bytes(bytes(data[: len(data) // 3]))
    else:  # a page in the middle overwritten
        page = 4096
        middle = (len(data) // page // 2) * page
        data[middle:middle + page] = b"\xa5" * page
        db.write_bytes(bytes(data))


def _checkpointed(db: Path) -> None:
    """Fold the WAL into the main file, so damage to the file is damage to the data."""
    import sqlite3

    con = sqlite3.connect(db)
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.close()


def test_the_start_check_makes_the_days_backup_once_private_and_bounded(tmp_path):
    paths = resolve_paths(tmp_path / "home").ensure()
    _store_with(paths.conversations_db, 3)
    first = database_at_start(paths)
    backups = db_recovery.list_backups(paths.conversations_db)
    assert first.check.ok and first.backup_made == backups[0]
    assert len(backups) == 1 and stat.S_IMODE(backups[0].stat().st_mode) == 0o600
    assert database_at_start(paths).backup_made is None  # at most once a day
    assert db_recovery.list_backups(paths.conversations_db) == backups
    for _ in range(4):  # forced ones (the CLI's) rotate: the newest three stay
        db_recovery.backup(paths.conversations_db, force=True)
    assert len(db_recovery.list_backups(paths.conversations_db)) == db_recovery.KEEP
    assert ConversationStore(db_recovery.list_backups(paths.conversations_db)[0]).list()  # a usable database


@pytest.mark.parametrize("how", ["truncated", "corrupted page"])
def test_a_damaged_database_is_found_and_restored_from_the_newest_sound_backup(tmp_path, how):
    paths = resolve_paths(tmp_path / "home").ensure()
    db = paths.conversations_db
    _store_with(db, 40)
    _checkpointed(db)
    good = db_recovery.backup(db, force=True)
    _damage(db, how)
    found = db_recovery.check(db)
    assert not found.ok and found.problem and found.backups == [good]
    with pytest.raises(ConversationError, match="not backing up"):
        db_recovery.backup(db, force=True)  # a damaged copy must not push out a good one
    assert db_recovery.list_backups(db) == [good]
    used, aside = db_recovery.restore(db)
    assert used == good and aside is not None and aside.exists()  # the damaged file is kept
    assert stat.S_IMODE(db.stat().st_mode) == 0o600
    assert len(ConversationStore(db).list()) == 40
    assert db_recovery.check(db).ok


def test_restore_refuses_without_a_sound_backup_and_keeps_the_file(tmp_path):
    db = tmp_path / "conversations.sqlite3"
    _store_with(db, 2)
    _checkpointed(db)
    _damage(db, "truncated")
    damaged = db.read_bytes()
    with pytest.raises(ConversationError, match="no sound backup"):
        db_recovery.restore(db)
    bad_backup = tmp_path / "not-a-backup.sqlite3"
    bad_backup.write_bytes(b"junk" * 100)
    with pytest.raises(ConversationError, match="not a sound backup"):
        db_recovery.restore(db, bad_backup)
    assert db.read_bytes() == damaged


def test_the_cli_checks_backs_up_and_restores(tmp_path):
    home = tmp_path / "home"
    paths = resolve_paths(home).ensure()
    _store_with(paths.conversations_db, 40)
    _checkpointed(paths.conversations_db)
    made = json.loads(run_cli("db", "backup", "--json", home=home).stdout)
    assert Path(made["backup"]).is_file()
    ok = run_cli("db", "check", "--json", home=home)
    assert ok.returncode == 0 and json.loads(ok.stdout)["ok"] is True
    _damage(paths.conversations_db, "truncated")
    bad = run_cli("db", "check", "--json", home=home)
    assert bad.returncode == 1 and json.loads(bad.stdout)["problem"]
    assert_clean_error(run_cli("conversations", "ls", home=home), "hearth-cli db restore")
    assert run_cli("kv", "ls", "--json", home=home).returncode == 0  # saved context needs no conversation text
    restored = json.loads(run_cli("db", "restore", "--json", home=home).stdout)
    assert restored["restored_from"] == made["backup"] and os.path.exists(restored["damaged_kept_at"])
    listed = json.loads(run_cli("conversations", "ls", "--json", home=home).stdout)["conversations"]
    assert len(listed) == 40
    assert_clean_error(run_cli("db", "restore", "--from", str(tmp_path / "missing.sqlite3"), home=home),
                       "not a sound backup")
