"""The message box: Enter sends, Shift+Enter starts a new line. Files dropped on it or pasted into it
(file URLs on the clipboard) are offered as attachments (``files_offered``); a pasted text, however long,
stays text. A model file (.gguf) dropped here is left to the window, which adds it to the library."""

from __future__ import annotations

from collections.abc import Iterable

from PySide6.QtCore import QMimeData, Qt, QUrl, Signal
from PySide6.QtGui import QDragEnterEvent, QDragMoveEvent, QDropEvent, QKeyEvent
from PySide6.QtWidgets import QPlainTextEdit


def local_files(urls: Iterable[QUrl]) -> list[str]:
    """The local files among ``urls``, leaving out model files (the window's drop adds those to the library)."""
    return [u.toLocalFile() for u in urls if u.isLocalFile() and u.toLocalFile()
            and not u.toLocalFile().lower().endswith(".gguf")]


class Composer(QPlainTextEdit):
    submitted = Signal(str)
    files_offered = Signal(list)  # local paths dropped or pasted

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setPlaceholderText("Message Hearth… (Enter to send, Shift+Enter for a new line; drop files to attach)")
        self.setAccessibleName("Message")
        self.setTabChangesFocus(True)
        self.has_attachments = False  # set by the pane: a message of attachments alone may be sent
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
        """Send what is typed; with attachments, an empty message sends the documents alone."""
        text = self.toPlainText()
        if text.strip() or self.has_attachments:
            self.submitted.emit(text)

    # files dropped or pasted -----------------------------------------------------------------------------
    def _files_in(self, mime: QMimeData) -> list[str]:
        return local_files(mime.urls()) if mime.hasUrls() else []

    @staticmethod
    def _models_only(mime: QMimeData) -> bool:
        """Only model files: left to the window (it adds them to the library), not typed as paths here."""
        urls = mime.urls() if mime.hasUrls() else []
        return bool(urls) and all(u.isLocalFile() and u.toLocalFile().lower().endswith(".gguf") for u in urls)

    def dragEnterEvent(self, event: QDragEnterEvent) -> None:  # noqa: N802 - Qt's name
        if self._files_in(event.mimeData()):
            event.acceptProposedAction()
        elif self._models_only(event.mimeData()):
            event.ignore()  # a model file: the window takes it
        else:
            super().dragEnterEvent(event)

    def dragMoveEvent(self, event: QDragMoveEvent) -> None:  # noqa: N802 - Qt's name
        if self._files_in(event.mimeData()):
            event.acceptProposedAction()
        else:
            super().dragMoveEvent(event)

    def dropEvent(self, event: QDropEvent) -> None:  # noqa: N802 - Qt's name
        files = self._files_in(event.mimeData())
        if files:
            event.acceptProposedAction()
            self.files_offered.emit(files)
        elif self._models_only(event.mimeData()):
            event.ignore()
        else:
            super().dropEvent(event)

    def canInsertFromMimeData(self, source: QMimeData) -> bool:  # noqa: N802 - Qt's name
        return bool(self._files_in(source)) or super().canInsertFromMimeData(source)

    def insertFromMimeData(self, source: QMimeData) -> None:  # noqa: N802 - Qt's name
        """A pasted file (a file manager's Copy puts its URL on the clipboard) is attached, not its path typed."""
        files = self._files_in(source)
        if files:
            self.files_offered.emit(files)
        else:
            super().insertFromMimeData(source)
