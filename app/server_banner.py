"""A non-modal banner under the chat header: the remote server a chat runs on cannot be used now (refused
key, unreachable, unknown model, busy), in plain words, with Try again and a way to the Models dialog.
The transcript and composer stay usable; replies come from the model still loaded until it is dismissed."""

from __future__ import annotations

from html import escape

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QPushButton, QToolButton


class ServerBanner(QFrame):
    retry_requested = Signal(str)  # NAME/MODEL
    manage_requested = Signal()

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("serverBanner")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.setStyleSheet("#serverBanner { background-color: rgba(192, 57, 43, 0.12); border-radius: 6px; }")
        self.setAccessibleName("The remote server cannot be used")
        row = QHBoxLayout(self)
        row.setContentsMargins(10, 6, 6, 6)
        self.message = QLabel("")
        self.message.setWordWrap(True)
        self.message.setTextFormat(Qt.TextFormat.RichText)
        self.message.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        row.addWidget(self.message, 1)
        self.retry = QPushButton("Try again")
        self.retry.clicked.connect(lambda: self.retry_requested.emit(self.key))
        row.addWidget(self.retry)
        self.manage = QPushButton("Servers…")
        self.manage.clicked.connect(self.manage_requested)
        row.addWidget(self.manage)
        close = QToolButton(self)
        close.setText("✕")
        close.setAutoRaise(True)
        close.setToolTip("Dismiss")
        close.setAccessibleName("Dismiss the server message")
        close.clicked.connect(self.hide)
        row.addWidget(close)
        self.key = ""
        self.hide()

    def failed(self, key: str, why: str, running: str | None) -> None:
        """``key`` could not be used because ``why``; ``running``: what answers meanwhile (None: nothing)."""
        self.key = key
        then = f" Replies come from {escape(running)} until then." if running else ""
        self.message.setText(f"<b>{escape(key)} cannot be used now.</b> {escape(why)}{then}")
        self.message.setToolTip(why)
        self.show()
