"""The ‹ 2/3 › switcher in a reply's header: which version of a regenerated reply is shown (and continues
the chat). It only says and asks; the chat pane changes the store."""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QHBoxLayout, QLabel, QToolButton, QWidget


class VersionSwitcher(QWidget):
    step_requested = Signal(int)  # -1: the earlier version, +1: the later one

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        row = QHBoxLayout(self)
        row.setContentsMargins(0, 0, 0, 0)
        row.setSpacing(2)
        self.back = self._button("‹", "Show the earlier version of this reply", -1)
        self.label = QLabel("")
        self.label.setAccessibleName("Which version of this reply")
        self.forward = self._button("›", "Show the later version of this reply", 1)
        for w in (self.back, self.label, self.forward):
            row.addWidget(w)
        self.index, self.count = 0, 1
        self.hide()

    def _button(self, text: str, tip: str, delta: int) -> QToolButton:
        b = QToolButton(self)
        b.setText(text)
        b.setToolTip(tip)
        b.setAccessibleName(tip)
        b.setAutoRaise(True)
        b.clicked.connect(lambda: self.step_requested.emit(delta))
        return b

    def set_versions(self, index: int, count: int) -> None:
        """Show version ``index`` (from 0) of ``count``; hidden while there is only one."""
        self.index, self.count = index, count
        self.label.setText(f"{index + 1}/{count}")
        self.label.setToolTip(f"Version {index + 1} of {count}: the chat continues with the one shown")
        self.back.setEnabled(index > 0)
        self.forward.setEnabled(index < count - 1)
        self.setVisible(count > 1)
