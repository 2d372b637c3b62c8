"""Rename a chat: a dialog wide enough for a long title, prefilled and selected so typing replaces it."""

from __future__ import annotations

from PySide6.QtWidgets import QDialog, QDialogButtonBox, QLabel, QLineEdit, QVBoxLayout, QWidget

MIN_WIDTH = 420
MAX_TITLE = 200  # longer titles are of no use in a list and only slow it


class RenameDialog(QDialog):
    def __init__(self, title: str, parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle("Rename chat")
        self.setMinimumWidth(MIN_WIDTH)
        layout = QVBoxLayout(self)
        layout.addWidget(QLabel("Title:"))
        self.edit = QLineEdit(title[:MAX_TITLE])
        self.edit.setMaxLength(MAX_TITLE)
        self.edit.setAccessibleName("Chat title")
        self.edit.selectAll()
        layout.addWidget(self.edit)
        self.hint = QLabel("")
        self.hint.setAccessibleName("Why the title cannot be used")
        layout.addWidget(self.hint)
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        self.ok = self.buttons.button(QDialogButtonBox.StandardButton.Ok)
        self.ok.setText("Rename")
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)
        layout.addWidget(self.buttons)
        self.edit.textChanged.connect(self._check)
        self._check()

    def _check(self) -> None:
        blank = not self.edit.text().strip()
        self.ok.setEnabled(not blank)
        self.hint.setText("A title cannot be empty." if blank else "")
        self.hint.setVisible(blank)

    def title(self) -> str:
        return self.edit.text().strip()
