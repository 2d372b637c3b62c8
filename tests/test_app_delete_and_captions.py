"""Issue 27, the main window: Delete asks from every entry point; each reply says why it stopped and which
model wrote it, after a restart too; after a model switch and back, nothing of the other model lingers."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QMessageBox

from tests.qt_helpers import TIMEOUT, new_chat_with_turn


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
