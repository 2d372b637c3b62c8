"""Help → Keyboard shortcuts: every action of the window with its keys, read from the window's menus
and actions when the dialog opens, so it never lists a shortcut that changed or misses a new one."""

from __future__ import annotations

from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QHeaderView,
    QMenu,
    QMenuBar,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

# Keys handled by widgets rather than actions (they have no QAction to read).
WIDGET_KEYS = [
    ("Message box", "Send the message", "Enter"),
    ("Message box", "New line", "Shift+Enter"),
    ("Attachment chip", "Remove the attachment", "Delete or Backspace"),
    ("Conversations", "Previous / next chat", "Up / Down"),
    ("Conversation filter", "Clear the filter", "Esc"),
    ("Conversation filter", "Go to the list", "Down"),
]


def plain(text: str) -> str:
    """An action's text without its mnemonic marker or trailing dots."""
    return text.replace("&&", "\0").replace("&", "").replace("\0", "&").rstrip("…").rstrip(".")


def keys(action: QAction) -> str:
    return " or ".join(s.toString(QKeySequence.SequenceFormat.NativeText) for s in action.shortcuts() if not s.isEmpty())


def menu_actions(menu: QMenu, path: str) -> list[tuple[str, QAction]]:
    found: list[tuple[str, QAction]] = []
    for act in menu.actions():
        if act.isSeparator():
            continue
        if act.menu() is not None:
            found += menu_actions(act.menu(), f"{path} → {plain(act.text())}")
        else:
            found.append((path, act))
    return found


def window_actions(window: QWidget) -> list[tuple[str, QAction]]:
    """(where, action) for every menu action, then for every other action with a shortcut and a name."""
    listed: list[tuple[str, QAction]] = []
    bar = window.findChild(QMenuBar)
    if bar is not None:
        for top in bar.actions():
            if top.menu() is not None:
                listed += menu_actions(top.menu(), plain(top.text()))
    seen = {id(a) for _, a in listed}
    for act in window.findChildren(QAction):
        if id(act) not in seen and keys(act) and act.text() and act.menu() is None:
            owner = act.parent()  # a widget's own action: named after that widget ("Conversations")
            listed.append((getattr(owner, "accessibleName", lambda: "")() or "Window", act))
            seen.add(id(act))
    return listed


def rows(window: QWidget) -> list[tuple[str, str, str]]:
    """(where, action, keys) for the dialog: actions with shortcuts, then the widgets' own keys."""
    return [(where, plain(a.text()), keys(a)) for where, a in window_actions(window) if keys(a)] + WIDGET_KEYS


class ShortcutsDialog(QDialog):
    def __init__(self, window: QWidget):
        super().__init__(window)
        self.setWindowTitle("Keyboard shortcuts")
        self.setAccessibleName("Keyboard shortcuts")
        self.resize(620, 600)
        layout = QVBoxLayout(self)
        entries = rows(window)
        self.table = QTableWidget(len(entries), 3, self)
        self.table.setAccessibleName("Shortcuts")
        self.table.setHorizontalHeaderLabels(["Where", "Action", "Keys"])
        self.table.verticalHeader().setVisible(False)
        self.table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        self.table.setSelectionBehavior(QTableWidget.SelectionBehavior.SelectRows)
        self.table.setAlternatingRowColors(True)
        self.table.setShowGrid(False)
        self.table.setWordWrap(False)
        for r, entry in enumerate(entries):
            for c, text in enumerate(entry):
                self.table.setItem(r, c, QTableWidgetItem(text))
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(1, QHeaderView.ResizeMode.Stretch)
        header.setSectionResizeMode(2, QHeaderView.ResizeMode.ResizeToContents)
        self.table.resizeRowsToContents()
        self.table.setCurrentCell(-1, -1)  # nothing looks selected until the person moves
        layout.addWidget(self.table)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        layout.addWidget(buttons)

    def listed(self) -> list[tuple[str, str, str]]:
        return [tuple(self.table.item(r, c).text() for c in range(3)) for r in range(self.table.rowCount())]
