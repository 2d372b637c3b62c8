"""Issue 27, the main window: Delete asks from every entry point; each reply says why it stopped and which
model wrote it, after a restart too; after a model switch and back, nothing of the other model lingers."""

from __future__ import annotations

import sqlite3

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QMessageBox

from app.config import AppConfig
from app.sidebar import SUBTITLE_ROLE, TOKENS_ROLE
from engine.api import resolve_paths
from engine.conversations import MIGRATIONS, ConversationStore
from engine.types import ReplyFacts, Resumed, ResumeSource, Token
from tests.qt_helpers import TIMEOUT, new_chat_with_turn, send, use_settings, wait_idle
from tests.test_app_models import SMOLLM2, pick, wait_for, wait_listed, wait_model

from .qt_helpers import on_event


@pytest.fixture
def real_config(real_model_home) -> AppConfig:
    return AppConfig(resolve_paths(real_model_home).ensure(), model=None, weights="int4", provider="cpu")


def delete_question(qtbot, w) -> QMessageBox:
    qtbot.waitUntil(lambda: bool(w.findChildren(QMessageBox, "deleteChatQuestion")), timeout=TIMEOUT)
    return w.findChildren(QMessageBox, "deleteChatQuestion")[-1]


def answer(qtbot, box: QMessageBox, role: QMessageBox.ButtonRole) -> None:
    button = next(b for b in box.buttons() if box.buttonRole(b) == role)
    qtbot.mouseClick(button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not box.isVisible(), timeout=TIMEOUT)


def two_chats(w) -> tuple[str, str]:
    keep, doomed = (w.store.create().id for _ in range(2))
    for cid, text in ((keep, "keep me"), (doomed, "delete me")):
        w.store.append(cid, "user", text)
    w.reload_list()
    w.sidebar.setCurrentItem(w.sidebar.item_for(doomed))
    return keep, doomed


def check_asks_then_deletes(qtbot, w, doomed: str, act) -> None:
    """``act()`` is one entry point: it asks (nothing goes on Cancel), and deletes only on Delete."""
    act()
    box = delete_question(qtbot, w)
    assert "delete me" in box.text() and box.defaultButton() is box.button(QMessageBox.StandardButton.Cancel)
    assert w.store.get(doomed) is not None  # asking is all it did
    answer(qtbot, box, QMessageBox.ButtonRole.RejectRole)
    assert w.store.get(doomed) is not None and w.sidebar.item_for(doomed) is not None
    act()
    answer(qtbot, delete_question(qtbot, w), QMessageBox.ButtonRole.DestructiveRole)
    assert w.store.get(doomed) is None and w.sidebar.item_for(doomed) is None


def test_chat_delete_action_and_its_shortcut_ask_first(qtbot, windows):
    w = windows(wait_ready=False)
    keep, doomed = two_chats(w)
    assert w.act_delete.shortcut().toString() == "Ctrl+Shift+Del"
    check_asks_then_deletes(qtbot, w, doomed, w.act_delete.trigger)  # Chat → Delete… (and its shortcut)
    assert w.store.get(keep) is not None


def test_delete_key_in_the_sidebar_asks_first(qtbot, windows):
    w = windows(wait_ready=False)
    keep, doomed = two_chats(w)

    def press() -> None:
        w.activateWindow()  # a key goes to the active window's focus widget
        qtbot.waitUntil(w.isActiveWindow, timeout=TIMEOUT)
        w.sidebar.setFocus()
        qtbot.waitUntil(w.sidebar.hasFocus, timeout=TIMEOUT)
        qtbot.keyClick(w.sidebar, Qt.Key.Key_Delete)

    check_asks_then_deletes(qtbot, w, doomed, press)
    assert w.store.get(keep) is not None


def test_sidebar_context_menu_delete_asks_about_the_chat_under_the_menu(qtbot, windows):
    w = windows(wait_ready=False)
    keep, doomed = two_chats(w)

    def from_menu() -> None:
        menu = w.sidebar_menu(doomed)
        next(a for a in menu.actions() if a.text() == "Delete…").trigger()

    check_asks_then_deletes(qtbot, w, doomed, from_menu)
    assert w.store.get(keep) is not None


def test_deleting_the_open_chat_after_a_turn_removes_it_once_confirmed(qtbot, windows):
    w = windows()
    conv = new_chat_with_turn(qtbot, w, "soon gone")
    w.act_delete.trigger()
    answer(qtbot, delete_question(qtbot, w), QMessageBox.ButtonRole.DestructiveRole)
    assert w.store.get(conv) is None


# item 19: each reply's caption (why it stopped, which model wrote it) outlives a restart ---------------------
def test_the_store_keeps_each_replys_model_through_versions_and_continues(tmp_path):
    store = ConversationStore(tmp_path / "c.db")
    try:
        cid = store.create().id
        store.append(cid, "user", "hi")
        seq = store.append(cid, "assistant", "hello", "cancelled", "Model A int4").seq
        assert store.reply_facts(cid) == {seq: ReplyFacts(seq, "cancelled", "Model A int4")}
        store.set_aside_reply(cid)
        store.append(cid, "assistant", "hey", "length", "Model B int4")
        store.extend_reply(cid, seq, " there", "eos", "Model C int4")  # continued by another model: both wrote it
        assert store.reply_facts(cid)[seq] == ReplyFacts(seq, "eos", "Model B int4 + Model C int4")
        assert store.choose_version(cid, seq, 0) == "hello"
        assert store.reply_facts(cid)[seq] == ReplyFacts(seq, "cancelled", "Model A int4")  # the version's own
        store.edit(cid, seq, "my words")  # the person wrote it now: no model to name
        assert store.reply_facts(cid)[seq] == ReplyFacts(seq, None, "")
    finally:
        store.close()


def test_a_schema_7_database_gains_reply_models_and_keeps_finishes(tmp_path):
    path = tmp_path / "v7.db"
    with sqlite3.connect(path) as db:
        for i, sql in enumerate(MIGRATIONS[:7], 1):
            db.executescript(sql + f"; PRAGMA user_version = {i};")
        db.execute("INSERT INTO conversations (id, created_ms, updated_ms) VALUES ('old', 0, 0)")
        db.execute("INSERT INTO messages (conversation_id, seq, role, content, created_ms, finish) "
                   "VALUES ('old', 0, 'user', 'hi', 0, NULL), ('old', 1, 'assistant', 'hel', 0, 'cancelled')")
    store = ConversationStore(path)
    try:
        assert store.reply_facts("old") == {1: ReplyFacts(1, "cancelled", "")}
    finally:
        store.close()


def shown_notes(qtbot, w) -> dict[int, str]:
    qtbot.waitUntil(lambda: not w.transcript.loading, timeout=TIMEOUT)
    return {m.seq: m.note.text() for m in w.transcript.messages if m.role == "assistant"}


def test_a_models_name_in_a_caption_is_shown_as_text_not_markup(qtbot, windows):
    w = windows(wait_ready=False)
    cid = w.store.create().id
    w.store.append(cid, "user", "hi")
    w.store.append(cid, "assistant", "hello", "cancelled", '<img src="file:///etc/passwd"><b>Evil</b>')
    w.reload_list()
    w.open_conversation(cid)
    note = next(m.note for m in w.transcript.messages if m.role == "assistant")
    assert note.text() == 'stopped · <img src="file:///etc/passwd"><b>Evil</b>'
    assert note.textFormat() == Qt.TextFormat.PlainText


@pytest.mark.real_model
def test_stopped_and_cut_off_replies_keep_their_marker_and_model_after_a_restart(qtbot, windows, real_config):
    w = windows(real_config)
    label = w.model_info.label
    whole = new_chat_with_turn(qtbot, w, "Say hello.", {"temperature": 0.0, "max_new_tokens": 4})
    stopped = w.new_chat()
    use_settings(w, {"temperature": 0.0, "max_new_tokens": 400})
    send(qtbot, w, "Write a long story about a lighthouse keeper.")
    qtbot.waitUntil(lambda: len(w.turns.turn(stopped).reply) > 20, timeout=TIMEOUT)
    qtbot.keyClick(w, Qt.Key.Key_Escape)  # Chat → Stop
    wait_idle(qtbot, w)
    assert list(shown_notes(qtbot, w).values())[-1] == f"stopped · {label}"
    cut = w.new_chat()
    use_settings(w, {"temperature": 0.0, "max_new_tokens": 400})
    send(qtbot, w, "Write a long story about a dragon.")
    qtbot.waitUntil(lambda: len(w.turns.turn(cut).reply) > 20, timeout=TIMEOUT)
    windows.close(w)  # quitting mid-stream: the reply so far is stored, as cut off (not as stopped)
    again = windows(real_config)
    for cid, note in ((whole, f"reached the length limit · {label}"), (stopped, f"stopped · {label}"),
                      (cut, f"cut off before it ended · {label}")):
        again.open_conversation(cid)
        assert again.store.messages(cid)[-1].role == "assistant"
        assert list(shown_notes(qtbot, again).values()) == [note], cid
    # The cut-off reply (shown last) can be continued, as one the length limit stopped; the stopped one not.
    assert not again.transcript.last_reply().continue_button.isHidden() and again.act_continue.isEnabled()
    again.open_conversation(stopped)
    wait_idle(qtbot, again)
    assert again.transcript.last_reply().continue_button.isHidden() and not again.act_continue.isEnabled()


# item 20: after a switch to another model and back, nothing of the other model lingers ----------------------
def subtitle(w, chat: str) -> str:
    return w.sidebar.item_for(chat).data(SUBTITLE_ROLE)


def settle(qtbot, w) -> None:
    """Until the engine thread has done everything asked of it so far and the window has heard of it all:
    the list of contexts asked for now comes back last."""
    seen: list = []
    w.contexts.changed.connect(lambda ids: seen.append(ids))  # emitted on the UI thread, after the list
    w.host.request_states.emit()
    qtbot.waitUntil(lambda: bool(seen), timeout=TIMEOUT)


@pytest.mark.real_model
def test_a_switch_to_another_model_and_back_shows_only_the_chats_own_models_figures(qtbot, windows, real_config,
                                                                                    tiny_gguf):
    w = windows(real_config)
    wait_listed(qtbot, w, SMOLLM2)
    badges: list = []
    w.turns.events.on(Token, lambda e: badges.append(w.sidebar.badge(e.conversation)))
    chat = new_chat_with_turn(qtbot, w, "Name three rivers.", {"temperature": 0.0, "max_new_tokens": 6})
    assert set(badges) == {"live"}  # a new chat's first reply: in memory as it is written (was "none")
    on_smol = w.sidebar.item_for(chat).data(TOKENS_ROLE)
    assert on_smol and w.status.speed.text()
    w.models.add_and_use(str(tiny_gguf))  # B: another model, for the same chat
    wait_for(qtbot, w, lambda: w.model_info is not None and w.model_info.key not in (SMOLLM2, ""), "the added model")
    settle(qtbot, w)
    tiny = w.model_info.key
    assert w.status.speed.text() == ""  # SmolLM2's "first token in … · … tokens/s" is not tiny's
    assert "tokens" not in subtitle(w, chat) and subtitle(w, chat).endswith("tiny")  # nor its token count
    badges.clear()
    send(qtbot, w, "And three lakes?")
    wait_idle(qtbot, w)
    assert badges and set(badges) == {"live"}  # its own reply being written (was "stale": SmolLM2's file)
    assert w.store.get(chat).model_key == tiny
    opened: list = []
    on_event(w.worker, Resumed, lambda e: opened.append(e.resume) if e.conversation == chat else None)
    pick(w, SMOLLM2)  # back to A: its context of this chat is on disk
    wait_model(qtbot, w, SMOLLM2)
    qtbot.waitUntil(lambda: bool(opened), timeout=TIMEOUT)
    settle(qtbot, w)
    assert [r.source for r in opened] == [ResumeSource.DISK]  # opened once, from disk (a second opening said "memory")
    assert "from disk" in w.status.resume.text() and "memory" not in w.status.resume.text()
    assert w.status.speed.text() == ""  # tiny's figures are gone
    assert subtitle(w, chat).endswith("SmolLM2 135M Instruct") and w.sidebar.item_for(chat).data(TOKENS_ROLE) == on_smol
