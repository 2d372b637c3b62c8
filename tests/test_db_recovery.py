"""A damaged conversation database is not the end: rolling backups, a quick check, and restore."""

from __future__ import annotations

import json
import os
import shutil
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


# salvage: a damaged database with no backup (issue 27: one overwritten page broke chat and
# conversations ls, and 'db restore' found no sound backup) -------------------------------------------
def _several_conversations(db: Path) -> dict[tuple[str, int], str]:
    """Six conversations of eight messages (some long enough to spill into overflow pages); what was said."""
    store = ConversationStore(db)
    said = {}
    for i in range(6):
        cid = f"chat{i}"
        store.create(cid, title=f"Title {i}", system_prompt="Be brief.")
        for j in range(8):
            text = f"chat {i} message {j} " + ("long words " * (600 if (i + j) % 5 == 0 else 40))
            store.append(cid, "user" if j % 2 == 0 else "assistant", text)
            said[(cid, j)] = text
    store.close()
    _checkpointed(db)
    return said


def _stored(db: Path) -> dict[tuple[str, int], str]:
    store = ConversationStore(db)
    try:
        return {(c.id, m.seq): m.content for c in store.list() for m in store.messages(c.id)}
    finally:
        store.close()


def _readable(db: Path) -> set[tuple[str, int]]:
    """Oracle: the messages of the damaged file that SQLite can still read, each looked up by itself."""
    import sqlite3

    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    found = set()
    try:
        top = 200
        for rowid in range(1, top):
            try:
                row = con.execute("SELECT conversation_id, seq, content FROM messages NOT INDEXED WHERE rowid = ?",
                                  (rowid,)).fetchone()
            except sqlite3.DatabaseError:
                continue
            if row is not None:
                found.add((row[0], row[1]))
    finally:
        con.close()
    return found


def _page_owners(db: Path) -> dict[int, str]:
    import sqlite3

    con = sqlite3.connect(db)
    try:
        return {page: name for name, page in con.execute("SELECT name, pageno FROM dbstat")}
    finally:
        con.close()


def _overwrite_page(db: Path, page: int, fill: str = "junk") -> None:
    """Page ``page`` (1-based) overwritten with bytes that are no b-tree page at all (or with zeros)."""
    with open(db, "r+b") as fh:
        fh.seek((page - 1) * 4096)
        fh.write(bytes(4096) if fill == "zeros" else bytes((page * 37 + i * 11) % 251 for i in range(4096)))


@pytest.mark.parametrize("fill", ["junk", "zeros"])
def test_salvage_keeps_every_readable_conversation_whichever_page_is_overwritten(tmp_path, fill):
    original = tmp_path / "original.sqlite3"
    said = _several_conversations(original)
    owners = _page_owners(original)
    pages = original.stat().st_size // 4096
    assert pages >= 14
    broken = 0
    for page in range(1, pages + 1):  # page 1 too: the file header and the list of tables
        db = tmp_path / f"p{page}" / "conversations.sqlite3"
        db.parent.mkdir()
        db.write_bytes(original.read_bytes())
        _overwrite_page(db, page, fill)
        if not db_recovery.problem_with(db):
            continue  # a free page: nothing to salvage (and the salvage refuses a sound database)
        broken += 1
        readable = _readable(db)
        saved = db_recovery.salvage(db)
        assert saved.damaged.exists() and not db_recovery.problem_with(db)
        kept = _stored(db)
        assert all(said[key] == text for key, text in kept.items()), page  # nothing kept is garbled
        assert readable <= kept.keys(), (page, owners.get(page), readable - kept.keys())
        assert saved.messages == len(kept)
        if owners.get(page) not in ("messages", "conversations"):  # an index, a search index, a sequence
            assert kept == said, (page, owners.get(page))
        lost = said.keys() - kept.keys()
        assert len(lost) <= 8, (page, owners.get(page), len(lost))  # at most what one page held
        if "messages" not in saved.unreadable_ends:  # accounted for: every lost message counted, no more
            assert saved.missing_messages == len(lost), (page, owners.get(page))
        claim = "nothing was lost" in saved.summary() or "no message was lost" in saved.summary()
        assert claim == (not lost and not saved.unreadable_ends), (page, saved.summary())  # never more than known
        titles = {c.id: c.title for c in ConversationStore(db).list()}
        assert {cid for cid, _ in kept} <= titles.keys()  # every message kept is in a conversation
    assert broken >= 9


def test_the_cli_salvages_a_damaged_database_without_a_backup(tmp_path):
    """The issue's sequence: the CLI alone (no window, so no backup then), one page overwritten; chat and
    conversations ls say what to run, 'db restore' points at the salvage, 'db salvage' keeps the rest."""
    home = tmp_path / "home"
    paths = resolve_paths(home).ensure()
    said = _several_conversations(paths.conversations_db)
    owners = _page_owners(paths.conversations_db)
    page = next(p for p, name in sorted(owners.items()) if name == "messages_by_conversation")  # ls reads it
    _overwrite_page(paths.conversations_db, page)
    listed = run_cli("conversations", "ls", home=home)
    assert_clean_error(listed, "is damaged", "hearth-cli db salvage")
    assert "db restore" not in listed.stderr  # there is no backup to restore
    assert_clean_error(run_cli("db", "restore", home=home), "no sound backup", "hearth-cli db salvage")
    out = run_cli("db", "salvage", "--json", home=home)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert os.path.exists(report["damaged_kept_at"])
    listed = json.loads(run_cli("conversations", "ls", "--json", home=home).stdout)["conversations"]
    assert len(listed) == 6
    assert _stored(paths.conversations_db) == said and report["messages"] == len(said)  # an index: nothing lost
    assert {c["title"] for c in listed} == {f"Title {i}" for i in range(6)}
    assert_clean_error(run_cli("db", "salvage", home=home), "nothing to salvage")  # sound now: left alone


def test_every_process_that_writes_backs_up_once_a_day(tmp_path):
    """Only the window used to back up: a CLI user had no backups/ at all."""
    home = tmp_path / "home"
    paths = resolve_paths(home).ensure()
    _store_with(paths.conversations_db, 2)
    assert run_cli("conversations", "ls", home=home).returncode == 0
    backups = db_recovery.list_backups(paths.conversations_db)
    assert len(backups) == 1 and ConversationStore(backups[0]).list()
    assert run_cli("conversations", "ls", home=home).returncode == 0
    assert db_recovery.list_backups(paths.conversations_db) == backups  # at most once a day


def _schema_5(db: Path) -> None:
    import sqlite3

    from engine.conversations import MIGRATIONS

    db.parent.mkdir(parents=True, exist_ok=True)
    con = sqlite3.connect(db)
    con.executescript(";\n".join(MIGRATIONS[:5]) + "; PRAGMA user_version = 5;")
    con.execute("INSERT INTO conversations (id, created_ms, updated_ms) VALUES ('old', 1, 1)")
    con.commit()
    con.close()


def _version(db: Path) -> int:
    import sqlite3

    con = sqlite3.connect(db)
    try:
        return con.execute("PRAGMA user_version").fetchone()[0]
    finally:
        con.close()


def test_an_older_schema_is_backed_up_before_it_is_upgraded(tmp_path):
    db = tmp_path / "conversations.sqlite3"
    _schema_5(db)
    db_recovery.backup(db, force=True)  # the day's backup, made before the database changed
    os.utime(db_recovery.list_backups(db)[0], (1, 1))
    ConversationStore(db).close()
    before = db_recovery.list_backups(db)[0]
    assert len(db_recovery.list_backups(db)) == 2 and _version(before) == 5  # a copy from before the upgrade
    assert [c.id for c in ConversationStore(db).list()] == ["old"] and _version(db) > 5


def test_the_window_backs_up_an_older_schema_off_its_ui_thread(tmp_path):
    from engine.api import open_conversations

    paths = resolve_paths(tmp_path / "home").ensure()
    _schema_5(paths.conversations_db)
    start = database_at_start(paths)  # the window's worker thread
    assert start.check.ok and _version(start.backup_made) == 5
    open_conversations(paths).close()  # the UI thread: upgrades, copies nothing more
    assert db_recovery.list_backups(paths.conversations_db) == [start.backup_made]
    assert _version(paths.conversations_db) > 5


def test_salvage_reads_the_newest_pages_so_deleted_messages_stay_deleted(tmp_path):
    """Rows deleted since the last checkpoint are still on the main file's pages; the write-ahead log holds
    the newer pages. Reading pages one by one must not bring the deleted ones back."""
    import shutil

    original = tmp_path / "live" / "conversations.sqlite3"
    original.parent.mkdir()
    said = _several_conversations(original)
    owners = _page_owners(original)
    store = ConversationStore(original)
    store.truncate("chat0", 4)  # in the log only while the store stays open
    db = tmp_path / "copy" / "conversations.sqlite3"
    db.parent.mkdir()
    for suffix in ("", "-wal"):
        shutil.copyfile(f"{original}{suffix}", f"{db}{suffix}")
    store.close()
    wal = Path(f"{db}-wal").read_bytes()
    logged = {int.from_bytes(wal[i:i + 4], "big") for i in range(32, len(wal), 24 + 4096)}
    page = next(p for p, name in sorted(owners.items()) if name == "messages" and p not in logged)
    _overwrite_page(db, page)  # a page the log does not replace: the leaves are then read one by one
    assert db_recovery.problem_with(db)
    db_recovery.salvage(db)
    kept = _stored(db)
    assert not [k for k in kept if k[0] == "chat0" and k[1] >= 4]  # deleted before the damage: still deleted
    assert all(said[k] == v for k, v in kept.items()) and len(kept) >= len(said) - 4 - 8


# issue 27: restore and salvage replaced the file under a process that had it open --------------------
HOLDER = """
import sys
from engine.api import Hearth, resolve_paths

hearth = Hearth(resolve_paths(sys.argv[1]))
print(len(hearth.conversations.list()), flush=True)  # open, as the window, 'serve' or a 'chat' holds it
sys.stdin.readline()
hearth.close()
"""


def _holding(home: Path):
    """A second process with the conversation database open, as the window or 'serve' keeps it."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(home)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert line.strip().isdigit(), line + proc.stderr.read()
    return proc


def _quit(proc) -> None:
    proc.communicate("\n", timeout=60)
    assert proc.returncode == 0


@pytest.mark.parametrize("action", ["restore", "salvage"])
def test_restore_and_salvage_refuse_while_another_process_has_the_database_open(tmp_path, action):
    home = tmp_path / "home"
    db = resolve_paths(home).ensure().conversations_db
    said = _several_conversations(db)
    if action == "restore":
        assert run_cli("db", "backup", home=home).returncode == 0
    holder = _holding(home)
    try:
        page = next(p for p, name in sorted(_page_owners(db).items()) if name == "messages_by_conversation")
        _overwrite_page(db, page)  # damaged while the other process has it open
        before = sorted(p.name for p in db.parent.iterdir())
        refused = run_cli("db", action, home=home)
        assert_clean_error(refused, f"Hearth is running (pid {holder.pid})", "quit it first")
        assert sorted(p.name for p in db.parent.iterdir()) == before  # nothing moved aside, nothing replaced
    finally:
        _quit(holder)
    done = run_cli("db", action, "--json", home=home)  # once it has quit
    assert done.returncode == 0, done.stderr
    assert os.path.exists(json.loads(done.stdout)["damaged_kept_at"])
    assert _stored(db) == said


def test_a_store_waits_for_a_restore_in_progress_then_says_so(tmp_path):
    from engine import db_lock

    db = tmp_path / "conversations.sqlite3"
    _store_with(db, 1)
    with db_lock.exclusive(db):  # as 'db restore' holds it while it replaces the file
        with pytest.raises(ConversationError, match="is being restored or salvaged by another Hearth process"):
            db_lock.hold_shared(db, wait_s=0.2)
    db_lock.release(db_lock.hold_shared(db, wait_s=0.2))
    store = ConversationStore(db)  # and two stores share it
    try:
        assert len(ConversationStore(db).list()) == len(store.list()) == 1
    finally:
        store.close()


def conversations_in(db: Path) -> int:
    store = ConversationStore(db)
    try:
        return len(store.list())
    finally:
        store.close()


def test_restore_over_a_sound_database_asks_for_force(tmp_path):
    """The tester's sequence: a backup of 2 conversations, 3 more written since, 'db restore' on the sound
    file replaced 5 conversations with 2 unasked and kept the healthy file as '.damaged-…'."""
    home = tmp_path / "home"
    paths = resolve_paths(home).ensure()
    db = paths.conversations_db
    _store_with(db, 2)
    backup = Path(json.loads(run_cli("db", "backup", "--json", home=home).stdout)["backup"])
    store = ConversationStore(db)
    for i in range(2, 5):
        store.create(f"c{i}")
    store.close()
    for extra in ((), ("--from", str(backup))):  # naming the backup is no licence to replace a sound file
        refused = run_cli("db", "restore", *extra, home=home)
        assert refused.returncode == 2
        assert_clean_error(refused, "conversations.sqlite3 is sound", "would replace 5 conversation(s) with 2",
                           "--force")
        assert conversations_in(db) == 5  # closed again: an open store holds the lock 'db restore' needs
        assert not list(db.parent.glob("conversations.sqlite3.*-2*"))  # nothing set aside
    forced = json.loads(run_cli("db", "restore", "--force", "--json", home=home).stdout)
    kept = Path(forced["replaced_kept_at"])
    assert forced["damaged_kept_at"] is None and kept.name.startswith("conversations.sqlite3.replaced-")
    assert conversations_in(db) == 2 and conversations_in(kept) == 5
    assert_clean_error(run_cli("db", "check", "--force", home=home), "--force is for 'db restore'")


def test_the_windows_restore_refuses_a_sound_database(tmp_path):
    """The window offers restore only for a damaged file; should the file read as sound by the click, the
    engine still refuses rather than replace it."""
    from engine.api import restore_database

    paths = resolve_paths(tmp_path / "home").ensure()
    _store_with(paths.conversations_db, 3)
    db_recovery.backup(paths.conversations_db, force=True)
    with pytest.raises(db_recovery.SoundDatabaseError, match="is sound"):
        restore_database(paths)
    assert len(ConversationStore(paths.conversations_db).list()) == 3


def test_two_restores_in_one_second_keep_both_files_set_aside(tmp_path):
    db = tmp_path / "conversations.sqlite3"
    _store_with(db, 2)
    _checkpointed(db)
    db_recovery.backup(db, force=True)
    asides = []
    for _ in range(2):
        _damage(db, "truncated")
        asides.append(db_recovery.restore(db)[1])
    assert asides[0] != asides[1] and all(a.exists() for a in asides)


# the tester's data dir: 5 conversations, 8 messages, one conversation with none; page 4 holds the messages
def _five_conversations(db: Path) -> None:
    store = ConversationStore(db)
    for i, count in enumerate((2, 2, 2, 2, 0)):
        store.create(f"c{i}", title=f"Title {i}")
        for j in range(count):
            store.append(f"c{i}", "user" if j % 2 == 0 else "assistant", f"conversation {i} message {j}")
    store.close()
    _checkpointed(db)
    assert _page_owners(db)[4] == "messages" and _page_owners(db)[2] == "conversations"


def _salvage_after(tmp_path, *pages: int) -> tuple[dict, str, Path]:
    """Overwrite ``pages`` with 0xab as the tester did and run the real 'db salvage'; (its JSON, its line)."""
    home = tmp_path / "home"
    db = resolve_paths(home).ensure().conversations_db
    _five_conversations(db)
    with open(db, "r+b") as fh:
        for page in pages:
            fh.seek((page - 1) * 4096)
            fh.write(b"\xab" * 4096)
    copy = tmp_path / "copy.sqlite3"
    copy.write_bytes(db.read_bytes())
    out = run_cli("db", "salvage", "--json", home=home)
    assert out.returncode == 0, out.stderr
    shutil.copyfile(copy, db)  # once more for the line a person reads
    line = run_cli("db", "salvage", home=home)
    assert line.returncode == 0, line.stderr
    return json.loads(out.stdout), line.stdout, db


def test_salvage_counts_the_messages_of_a_lost_page_instead_of_saying_nothing_was_lost(tmp_path):
    """Page 4 overwritten: every message gone, and the salvage said 'nothing was lost'. The indexes of the
    messages table still list all 8."""
    report, line, db = _salvage_after(tmp_path, 4)
    assert report["messages"] == 0 and report["missing_messages"] == 8 and report["unreadable_ends"] == []
    assert "8 message(s) could not be read" in line and "nothing was lost" not in line
    assert len(ConversationStore(db).list()) == 5


def test_salvage_keeps_every_message_when_page_1_is_lost(tmp_path):
    """Page 1 (the list of tables) overwritten: the messages on page 4 are intact and all kept."""
    report, line, db = _salvage_after(tmp_path, 1)
    assert report["messages"] == 8 and report["conversations"] == 5 and report["unreadable_pages"] == 1
    assert "nothing was lost" in line
    assert {c.id: len(ConversationStore(db).messages(c.id)) for c in ConversationStore(db).list()} == {
        "c0": 2, "c1": 2, "c2": 2, "c3": 2, "c4": 0}


def test_salvage_says_a_conversation_without_messages_on_a_lost_page_is_lost(tmp_path):
    """Page 2 (every conversation row) overwritten: four come back as "Recovered" for their messages; the
    fifth had none, so nothing of it is left, and the salvage said 'no message was lost' and no more."""
    report, line, _db = _salvage_after(tmp_path, 2)
    assert report["conversations"] == 4 and report["recreated_conversations"] == 4
    assert report["lost_conversations"] == 1 and report["messages"] == 8
    assert "1 conversation(s) could not be read" in line and "no message was lost" not in line


def test_salvage_says_messages_may_be_lost_when_it_cannot_count_them(tmp_path):
    """The messages page and every index listing its rows overwritten, or page 1 with it: nothing is left
    to count from, so the salvage must not claim a count, nor that nothing was lost."""
    owners = _page_owners_of_five(tmp_path)
    listing = [p for p, name in owners.items() if name in (
        "messages", "sqlite_autoindex_messages_1", "messages_by_conversation", "message_fts_docsize")]
    for pages in (listing, [1, 4]):
        report, line, _db = _salvage_after(tmp_path / str(pages[0] + len(pages)), *pages)
        assert "messages" in report["unreadable_ends"], pages
        assert "messages" in line and "may be lost" in line and "nothing was lost" not in line, line


def _page_owners_of_five(tmp_path) -> dict[int, str]:
    db = tmp_path / "probe" / "conversations.sqlite3"
    db.parent.mkdir(parents=True)
    _five_conversations(db)
    return _page_owners(db)
