"""The block under a reply that called a tool (issue 33): "wants to run `NAME`" with its arguments and
Allow once / Always allow in this chat / Deny; while the tool runs, "Running `NAME`…" with Stop; and after a
restart, a call that was running when Hearth closed, which may have run: Run again / Abandon — never run again
without asking. The arguments are the model's output: shown as plain text, bounded."""

from __future__ import annotations

import html

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QPlainTextEdit, QPushButton, QVBoxLayout, QWidget

from app.text import display_safe
from engine.api import pretty_arguments

MAX_SHOWN_ARGUMENTS = 20_000  # characters of arguments laid out; a call's arguments may be 256 KiB
ARGUMENT_LINES = 8  # the arguments box grows to this many lines, then scrolls
ALLOW, ALWAYS, DENY, STOP = "allow", "always", "deny", "stop"

ASKING, RUNNING, INTERRUPTED = "asking", "running", "interrupted"


def shown_arguments(arguments: str) -> str:
    text = pretty_arguments(arguments)
    if len(text) > MAX_SHOWN_ARGUMENTS:
        return text[:MAX_SHOWN_ARGUMENTS] + f"\n… ({len(text) - MAX_SHOWN_ARGUMENTS:,} more characters not shown)"
    return text


class ToolPermissionBlock(QFrame):
    """``decided(call_id, choice)``: ALLOW, ALWAYS, DENY (Abandon, for a call that was running), or STOP."""

    decided = Signal(str, str)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("toolPermission")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.setStyleSheet("#toolPermission { background-color: rgba(41, 128, 185, 0.10); "
                           "border: 1px solid rgba(41, 128, 185, 0.55); border-radius: 6px; }")
        self.call_id = ""
        self.function = ""
        self.mode = ASKING
        outer = QVBoxLayout(self)
        outer.setContentsMargins(12, 8, 12, 8)
        self.title = QLabel("")
        self.title.setTextFormat(Qt.TextFormat.RichText)
        self.title.setWordWrap(True)
        outer.addWidget(self.title)
        self.note = QLabel("")
        self.note.setWordWrap(True)
        outer.addWidget(self.note)
        self.arguments = QPlainTextEdit()
        self.arguments.setReadOnly(True)
        self.arguments.setAccessibleName("The arguments the model gave the tool")
        outer.addWidget(self.arguments)
        row = QHBoxLayout()
        self.allow_button = self._button("Allow once", "Run this call now", ALLOW)
        self.always_button = self._button("Always allow in this chat",
                                          "Run this call, and this tool's later calls in this chat without asking", ALWAYS)
        self.deny_button = self._button("Deny", "Do not run it: the model is told you said no", DENY)
        self.stop_button = self._button("Stop", "Stop the tool; the model is told it was stopped", STOP)
        for b in (self.allow_button, self.always_button, self.deny_button, self.stop_button):
            row.addWidget(b)
        row.addStretch(1)
        outer.addLayout(row)
        self.hide()

    def _button(self, text: str, tip: str, choice: str) -> QPushButton:
        b = QPushButton(text)
        b.setToolTip(tip)
        b.setAccessibleName(text)
        b.clicked.connect(lambda: self.decided.emit(self.call_id, choice))
        return b

    def ask(self, call, server: str = "", interrupted: bool = False) -> None:
        """Ask about ``call`` (engine.api's ToolCall); ``interrupted``: it was running when Hearth closed."""
        self.call_id, self.function = call.id, call.name
        self.mode = INTERRUPTED if interrupted else ASKING
        name = html.escape(display_safe(call.name))  # the model's words, in a rich-text label
        where = f" <span style='color: palette(mid)'>({html.escape(display_safe(server))})</span>" if server else ""
        if interrupted:
            self.title.setText(f"<b><code>{name}</code></b>{where} was running when Hearth closed")
            self.note.setText("It may or may not have finished. Run it again, or abandon it (the model is told it "
                              "was not run again).")
            self.allow_button.setText("Run again")
            self.deny_button.setText("Abandon")
        else:
            self.title.setText(f"The model wants to run <b><code>{name}</code></b>{where}")
            self.note.setText("")
            self.allow_button.setText("Allow once")
            self.deny_button.setText("Deny")
        self.note.setVisible(interrupted)
        self.setAccessibleName(f"The model wants to run {call.name}" if not interrupted
                               else f"{call.name} was running when Hearth closed")
        self._show_arguments(call.arguments)
        self.always_button.setVisible(not interrupted)
        for b in (self.allow_button, self.deny_button):
            b.setVisible(True)
            b.setEnabled(True)
        self.always_button.setEnabled(True)
        self.stop_button.hide()

    def _show_arguments(self, arguments: str) -> None:
        """The arguments, in a box as tall as they are (up to ARGUMENT_LINES lines, then it scrolls)."""
        text = shown_arguments(arguments)
        self.arguments.setPlainText(text)
        lines = min(text.count("\n") + 1, ARGUMENT_LINES)
        height = self.arguments.fontMetrics().lineSpacing() * lines
        self.arguments.setFixedHeight(height + 2 * self.arguments.frameWidth() + 8)

    def running(self, call, server: str = "") -> None:
        """``call`` is running: its name and Stop."""
        self.call_id, self.function, self.mode = call.id, call.name, RUNNING
        where = f" ({html.escape(display_safe(server))})" if server else ""
        self.title.setText(f"Running <b><code>{html.escape(display_safe(call.name))}</code></b>{where}…")
        self.note.hide()
        self.setAccessibleName(f"Running {call.name}")
        self._show_arguments(call.arguments)
        for b in (self.allow_button, self.always_button, self.deny_button):
            b.hide()
        self.stop_button.show()
        self.stop_button.setEnabled(True)
