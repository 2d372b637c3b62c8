"""A non-modal banner above the transcript: what went wrong with the saved context, progress of the
rebuild, and how it ended. The transcript and composer stay usable underneath."""

from __future__ import annotations

import time

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QProgressBar, QToolButton, QVBoxLayout

from app.text import duration
from engine.types import SaveResult


class CacheBanner(QFrame):
    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("cacheBanner")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.setStyleSheet("#cacheBanner { background-color: rgba(230, 170, 40, 0.18); border-radius: 6px; }")
        self.setAccessibleName("Saved context status")
        outer = QVBoxLayout(self)
        outer.setContentsMargins(10, 6, 6, 6)
        row = QHBoxLayout()
        self.message = QLabel("")
        self.message.setWordWrap(True)
        self.message.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        row.addWidget(self.message, 1)
        close = QToolButton(self)
        close.setText("✕")
        close.setAutoRaise(True)
        close.setToolTip("Dismiss")
        close.setAccessibleName("Dismiss the saved-context message")
        close.clicked.connect(self.hide)
        row.addWidget(close)
        outer.addLayout(row)
        self.progress = QProgressBar(self)
        self.progress.setTextVisible(True)
        self.progress.setAccessibleName("Rebuild progress")
        outer.addWidget(self.progress)
        self.conversation: str | None = None
        self.plain_reason = ""
        self._started = 0.0
        self._first_done: int | None = None
        self.hide()

    def rebuilding(self, conversation: str, plain_reason: str, detail: str) -> None:
        self.conversation = conversation
        self._started = time.monotonic()
        self._first_done = None  # the rate is measured from the first progress report on
        self.plain_reason = plain_reason or "the saved context was unusable"
        reason = self.plain_reason[:1].upper() + self.plain_reason[1:]
        self.message.setText(f"<b>{reason} — rebuilding.</b> You can keep reading and writing; a message you "
                             f"send now is answered once the rebuild is done.")
        self.message.setToolTip(detail)
        self.progress.setRange(0, 0)  # busy until the first progress report
        self.progress.show()
        self.show()

    def update_progress(self, done: int, total: int) -> None:
        if total <= 0:
            return
        self.progress.setRange(0, total)
        self.progress.setValue(done)
        if self._first_done is None:  # the prefix kept from the restore counts as done, at no cost
            self._first_done, self._started = done, time.monotonic()
        elapsed, read = time.monotonic() - self._started, done - self._first_done
        if read > 0 and done < total:
            left = elapsed / read * (total - done) * 1000
            self.progress.setFormat(f"%v of %m tokens · about {duration(left)} left")
        else:
            self.progress.setFormat("%v of %m tokens")

    def finished(self, ms: float, tokens: int, cancelled: bool, save: SaveResult | None = None) -> None:
        """How the rebuild ended. "Saved again" only when the engine's save after the rebuild succeeded
        (it saves on the engine thread before reporting, so the file is there when this says so)."""
        self.progress.hide()
        if cancelled:
            self.message.setText(f"<b>Rebuild stopped</b> after {duration(ms)}; it continues with your next message.")
        else:
            why = f"Why: {self.plain_reason}."  # the reason may hold parentheses: never nested in more
            if save is not None and save.ok:
                outcome = "the context is saved again."
            else:
                error = save.error if save is not None and save.error else "nothing was written"
                outcome = f"it could not be saved ({error}), so the next opening rebuilds it again."
            self.message.setText(f"<b>Rebuilt</b> {tokens:,} tokens in {duration(ms)}; {outcome} {why}")
        self.show()


class NoticeBanner(QFrame):
    """A dismissable line above the chat for something the person should know but need not act on now
    (say, a damaged preferences file that was set aside)."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("noticeBanner")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.setStyleSheet("#noticeBanner { background-color: rgba(230, 170, 40, 0.18); border-radius: 6px; }")
        self.setAccessibleName("Notice")
        row = QHBoxLayout(self)
        row.setContentsMargins(10, 6, 6, 6)
        self.message = QLabel("")
        self.message.setTextFormat(Qt.TextFormat.PlainText)  # the text may quote a damaged file
        self.message.setWordWrap(True)
        self.message.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        row.addWidget(self.message, 1)
        self.dismiss = QToolButton(self)
        self.dismiss.setText("✕")
        self.dismiss.setAutoRaise(True)
        self.dismiss.setToolTip("Dismiss")
        self.dismiss.setAccessibleName("Dismiss the notice")
        self.dismiss.clicked.connect(self.hide)
        row.addWidget(self.dismiss)
        self.hide()

    def say(self, text: str) -> None:
        self.message.setText(text)
        self.show()
