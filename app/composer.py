"""The message box: Enter sends, Shift+Enter starts a new line."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import QPlainTextEdit


class Composer(QPlainTextEdit):
    submitted = Signal(str)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setPlaceholderText("Message Hearth… (Enter to send, Shift+Enter for a new line)")
        self.setAccessibleName("Message")
        self.setTabChangesFocus(True)
        self.document().documentLayout().documentSizeChanged.connect(self._grow)
        self._grow()

    def _grow(self, *_: object) -> None:
        """Three lines tall when empty, growing with the text up to about eight lines."""
        line = self.fontMetrics().lineSpacing()
        lines = max(3, min(8, int(self.document().size().height())))
        self.setFixedHeight(lines * line + 2 * self.frameWidth() + 10)

    def keyPressEvent(self, event: QKeyEvent) -> None:  # noqa: N802 - Qt's name
        enter = event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter)
        if enter and not event.modifiers() & (Qt.KeyboardModifier.ShiftModifier | Qt.KeyboardModifier.AltModifier):
            self.submit()
            return
        super().keyPressEvent(event)

    def submit(self) -> None:
        text = self.toPlainText()
        if text.strip():
            self.submitted.emit(text)
