"""What the transcript shows when a chat outgrows the model's context: a marker above the first message
the model still reads ("12 earlier messages are outside the model's view"), and, when a turn was
refused because the chat no longer fits, an error block offering the ways on; and under a last message
that has no reply (a failed or stopped turn, a chat reopened later), a block to answer it or edit it."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QPushButton, QVBoxLayout, QWidget


def outside_view_text(count: int) -> str:
    if count == 1:
        return "1 earlier message is outside the model's view"
    return f"{count:,} earlier messages are outside the model's view"


def too_long_alone_text(tokens: int, limit: int) -> str:
    return (f"Your message and the system prompt are {tokens:,} tokens, but the model reads at most {limit:,}. "
            "Shorten the message, or send it in parts.")


class ViewMarker(QWidget):
    """A rule with a centred note, placed above the first message the model reads."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("viewMarker")
        row = QHBoxLayout(self)
        row.setContentsMargins(0, 4, 0, 4)
        self.label = QLabel("")
        self.label.setEnabled(False)  # the palette's dim text: a note, not a message
        self.label.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.label.setToolTip("The model reads the system prompt and the messages below this line. "
                              "Every message stays in the chat; the earlier ones are just not read any more.")
        row.addWidget(self._rule(), 1)
        row.addWidget(self.label)
        row.addWidget(self._rule(), 1)
        self.count = 0
        self.hide()

    @staticmethod
    def _rule() -> QFrame:
        line = QFrame()
        line.setFrameShape(QFrame.Shape.HLine)
        line.setFrameShadow(QFrame.Shadow.Sunken)
        return line

    def set_count(self, count: int) -> None:
        self.count = count
        self.label.setText(outside_view_text(count))
        self.setAccessibleName(outside_view_text(count))


def _button(label: str, tip: str, slot) -> QPushButton:
    b = QPushButton(label)
    b.setAccessibleName(label)
    b.setToolTip(tip)
    b.clicked.connect(slot)
    return b


class ContextLimitBlock(QFrame):
    """The chat is longer than the model reads: the engine's explanation and the ways on: edit the message
    (it waits in the message box), and where they help, a new chat with the same system prompt or letting
    this chat drop its oldest messages (and retry)."""

    new_chat_requested = Signal()
    drop_oldest_requested = Signal()
    edit_requested = Signal()

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("contextLimit")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.setStyleSheet("#contextLimit { background-color: rgba(192, 57, 43, 0.10); "
                           "border: 1px solid rgba(192, 57, 43, 0.55); border-radius: 6px; }")
        self.setAccessibleName("The chat is longer than the model's context")
        outer = QVBoxLayout(self)
        outer.setContentsMargins(12, 10, 12, 10)
        self.title = QLabel("<b>This chat no longer fits in what the model can read</b>")
        outer.addWidget(self.title)
        self.message = QLabel("")
        self.message.setWordWrap(True)
        self.message.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        outer.addWidget(self.message)
        row = QHBoxLayout()
        self.edit_button = _button("Edit the message", "Your message is back in the message box: shorten it "
                                   "and send it again", self.edit_requested)
        row.addWidget(self.edit_button)
        self.new_chat_button = QPushButton("Start a new chat with this message")
        self.new_chat_button.setAccessibleName("Start a new chat with this message and system prompt")
        self.new_chat_button.setToolTip("A new chat with this chat's system prompt and settings; your message "
                                        "waits in its message box")
        self.new_chat_button.clicked.connect(self.new_chat_requested)
        self.drop_button = QPushButton("Drop oldest messages for this chat")
        self.drop_button.setAccessibleName("Drop oldest messages for this chat")
        self.drop_button.setToolTip("From now on the model reads the system prompt and the newest messages that "
                                    "fit; every message stays in the chat. Your message is sent again.")
        self.drop_button.clicked.connect(self.drop_oldest_requested)
        row.addWidget(self.new_chat_button)
        row.addWidget(self.drop_button)
        row.addStretch(1)
        outer.addLayout(row)
        self.hide()

    def set_problem(self, message: str, can_drop: bool) -> None:
        """``can_drop``: the chat stops at the limit now, so dropping its oldest messages would help (else
        even the newest message alone is too long, and only shortening it does)."""
        self.title.setText("<b>This chat no longer fits in what the model can read</b>" if can_drop
                           else "<b>This message is too long for the model</b>")
        self.message.setText(message)
        self.new_chat_button.setVisible(can_drop)
        self.drop_button.setVisible(can_drop)
        self.setAccessibleDescription(message)


class UnansweredBlock(QFrame):
    """The last message has no reply (its turn failed or was stopped before a word, or the app closed):
    say so, and offer to answer it now or to edit it."""

    answer_requested = Signal()
    edit_requested = Signal()

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("unanswered")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.setAccessibleName("This message has no reply yet")
        outer = QVBoxLayout(self)
        outer.setContentsMargins(12, 8, 12, 8)
        self.title = QLabel("<b>This message has no reply yet</b>")
        outer.addWidget(self.title)
        self.reason = QLabel("")
        self.reason.setWordWrap(True)
        self.reason.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        outer.addWidget(self.reason)
        row = QHBoxLayout()
        self.answer_button = _button("Answer it", "Have the model answer this message now", self.answer_requested)
        self.edit_button = _button("Edit", "Change the message, then send it again", self.edit_requested)
        row.addWidget(self.answer_button)
        row.addWidget(self.edit_button)
        row.addStretch(1)
        outer.addLayout(row)
        self.hide()

    def set_reason(self, reason: str) -> None:
        """Why it has none, when known (the turn's error); empty: just that it has none."""
        self.reason.setText(reason)
        self.reason.setVisible(bool(reason))
        self.setAccessibleDescription(reason)
