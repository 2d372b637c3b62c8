"""Find in the chat (Ctrl+F, F3): a bar under the transcript that selects matches across messages."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication, QHBoxLayout, QLabel, QLineEdit, QToolButton, QWidget

from app.text import plural
from app.transcript import TranscriptView


class FindBar(QWidget):
    def __init__(self, transcript: TranscriptView, parent: QWidget | None = None):
        super().__init__(parent)
        self.transcript = transcript
        h = QHBoxLayout(self)
        h.setContentsMargins(0, 2, 0, 2)
        h.addWidget(QLabel("Find:"))
        self.edit = QLineEdit()
        self.edit.setAccessibleName("Find in the conversation")
        self.edit.setPlaceholderText("text in this conversation")
        h.addWidget(self.edit, 1)
        self.count = QLabel("")
        h.addWidget(self.count)
        for label, tip, backward in (("↑", "Previous match (Shift+Enter)", True), ("↓", "Next match (Enter)", False)):
            b = QToolButton()
            b.setText(label)
            b.setToolTip(tip)
            b.setAccessibleName(tip)
            b.clicked.connect(lambda _=False, back=backward: self.find(back))
            h.addWidget(b)
        close = QToolButton()
        close.setText("✕")
        close.setAccessibleName("Close find")
        close.clicked.connect(self.hide)
        h.addWidget(close)
        self.edit.textChanged.connect(lambda _: self.find(False))
        self.edit.returnPressed.connect(
            lambda: self.find(bool(QApplication.keyboardModifiers() & Qt.KeyboardModifier.ShiftModifier)))
        self.hide()

    def open(self) -> None:
        self.show()
        self.edit.setFocus()
        self.edit.selectAll()

    def find(self, backward: bool = False) -> None:
        needle = self.edit.text()
        found = self.transcript.find(needle, backward)
        n = self.transcript.match_count(needle)
        self.count.setText("" if not needle else plural(n, 'match', 'matches') if found else "no matches")
