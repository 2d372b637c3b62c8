"""A model's name is anyone's text: a GGUF's general.name (or its file name, or a label in the database)
with an ESC or a bidi override reached the sidebar, the picker, the status bar, the captions and the Models
dialog raw. Each shows it with those characters written as visible escapes (app/text.py's display_safe)."""

from __future__ import annotations

import gguf
from PySide6.QtCore import Qt

from app.text import display_safe

from .gguf_edit import rewrite_gguf
from .qt_helpers import TIMEOUT, send, use_settings, wait_idle
from .test_app_browser_polish import open_browser
from .test_app_delete_and_captions import shown_notes
from .test_app_models import open_dialog

EVIL = "\x1b[31mEvil\u202e"
SHOWN = "\\x1b[31mEvil\\u202e"
RAW = ("\x1b", "\u202e", "\x07")


def raw(text: str) -> bool:
    return any(c in text for c in RAW)


def test_display_safe_escapes_controls_and_bidi_and_keeps_the_rest():
    assert display_safe(EVIL) == SHOWN
    assert display_safe("Qwen2.5 · 7B — «ok» 日本") == "Qwen2.5 · 7B — «ok» 日本"
    assert display_safe("a\tb\nc\x7f\x9b\u2066\u200f") == "a\\x09b\\x0ac\\x7f\\x9b\\u2066\\u200f"


def test_a_models_control_characters_never_reach_the_window_raw(qtbot, windows, tiny_gguf, tmp_path):
    w = windows()
    evil = rewrite_gguf(tiny_gguf, tmp_path / "Evil\x1b]0;owned\x07.gguf",
                        new_values={"general.name": (EVIL, gguf.GGUFValueType.STRING)})
    chat = w.new_chat()
    use_settings(w, {"temperature": 0.0, "max_new_tokens": 3})
    w.models.add_and_use(str(evil))  # File → Open model file… does this
    qtbot.waitUntil(lambda: w.model_info is not None and w.model_info.name.startswith("Evil"), timeout=TIMEOUT)
    key = w.model_info.key
    qtbot.waitUntil(lambda: key in w.models.models, timeout=TIMEOUT)
    send(qtbot, w, "hello")
    wait_idle(qtbot, w)
    w.reload_list()
    # the sidebar's line under the chat, and its tooltip
    item = w.sidebar.item_for(chat)
    subtitle = item.data(Qt.ItemDataRole.UserRole + 1)
    assert SHOWN in subtitle and not raw(subtitle) and not raw(item.toolTip())
    # the chat header's picker
    picker = w.models.picker
    shown = picker.itemText(picker.findData(key))
    assert shown.startswith(SHOWN) and not raw(shown)
    # the status bar names the file ("Evil\x1b]0;owned\x07"), drawn or in its tooltip
    status = w.status.model
    assert status.text().startswith("Evil\\x1b]0;owned\\x07") and not raw(status.text() + status.toolTip())
    assert not raw(status.elided())
    # the caption under the reply (the model that wrote it, as stored)
    notes = shown_notes(qtbot, w)
    assert notes and not any(raw(n) for n in notes.values()), notes
    # the Models dialog: its row and its details
    d = open_dialog(qtbot, w)
    cells = [d.table.item(r, 0).text() for r in range(d.table.rowCount())
             if d.table.item(r, 0).data(Qt.ItemDataRole.UserRole) == key]
    assert cells and cells[0].startswith(SHOWN) and not raw(cells[0])
    for r in range(d.table.rowCount()):
        if d.table.item(r, 0).data(Qt.ItemDataRole.UserRole) == key:
            d.table.selectRow(r)
    assert SHOWN in d.details.text() and not raw(d.details.text())


def test_a_chats_title_and_model_label_from_the_database_are_shown_escaped(qtbot, windows):
    """An imported chat's title and the model label it names come from anyone's file."""
    w = windows()
    c = w.store.create(title=f"Invoice{EVIL}")
    w.store.append(c.id, "user", "hi")
    w.store.append(c.id, "assistant", "hello", "cancelled", EVIL)
    w.reload_list()
    item = w.sidebar.item_for(c.id)
    title = item.data(Qt.ItemDataRole.DisplayRole)
    assert title == f"Invoice{SHOWN}" and not raw(item.toolTip())
    w.sidebar.grab()  # paints every row
    assert not any(raw(t) for t in w.sidebar.itemDelegate().drawn_titles.values())
    b = open_browser(qtbot, w)
    row = b.ids_shown().index(c.id)
    cell = b.proxy.index(row, 0)
    assert b.proxy.data(cell) == f"Invoice{SHOWN}" and not raw(b.proxy.data(cell, Qt.ItemDataRole.ToolTipRole))
