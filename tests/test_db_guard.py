"""The window's start-up guard of the conversation database (app/db_guard.py): a damaged database with no
backup is rescued from the dialog — real widgets (pytest-qt, offscreen), real SQLite files."""

from __future__ import annotations

from app.db_guard import DatabaseGuard
from engine import db_recovery
from engine.conversations import ConversationStore
from engine.paths import resolve_paths

from .test_db_recovery import _overwrite_page, _page_owners, _several_conversations, _stored


def test_a_damaged_database_without_a_backup_is_rescued_from_the_dialog(qtbot, tmp_path):
    """Issue 27: with no backup the dialog offered only Quit; now it offers the salvage."""
    paths = resolve_paths(tmp_path / "home").ensure()
    db = paths.conversations_db
    said = _several_conversations(db)
    page = next(p for p, name in sorted(_page_owners(db).items()) if name == "messages_by_conversation")
    _overwrite_page(db, page)
    guard = DatabaseGuard(paths)
    passed, salvaged = [], []
    guard.passed.connect(lambda: passed.append(True))
    guard.salvaged.connect(salvaged.append)
    guard.start()
    qtbot.waitUntil(lambda: guard.dialog is not None and guard.dialog.isVisible(), timeout=30_000)
    assert guard.restore_button is None and "rescue" in guard.dialog.text()
    guard.rescue_button.click()
    qtbot.waitUntil(lambda: bool(passed), timeout=30_000)
    guard.wait_job()
    assert salvaged and salvaged[0].damaged.exists()
    assert guard.report is not None and "kept 6 conversation(s) and 48 message(s)" in guard.report.text()
    assert not db_recovery.problem_with(db) and _stored(db) == said
    assert len(ConversationStore(db).list()) == 6
    guard.report.close()
