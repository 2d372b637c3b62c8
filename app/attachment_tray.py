"""Above the message box: a chip per attachment (its name and token count, or "reading…", and a remove
button), a total that warns when the message will not fit, and the reason a file was refused."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QToolButton, QVBoxLayout, QWidget

from app.attachment_text import Total, chip_tokens, describe
from app.flow_layout import FlowLayout
from app.text import display_safe

CHIP_NAME_CHARS = 32  # a longer name is cut in the middle on the chip; the tooltip has it whole


def short_name(name: str, most: int = CHIP_NAME_CHARS) -> str:
    name = display_safe(name)
    if len(name) <= most:
        return name
    keep = most - 1
    return name[: keep - keep // 3] + "…" + name[len(name) - keep // 3:]


class AttachmentChip(QFrame):
    """One attachment: '📄 report.pdf  1,234 tokens ×'. Delete or Backspace on the focused chip, or its
    × button, removes it."""

    remove_requested = Signal(int)  # the chip's key

    def __init__(self, key: int, name: str, parent: QWidget | None = None):
        super().__init__(parent)
        self.key, self.name = key, name
        self.setObjectName("attachmentChip")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
        self.setStyleSheet("#attachmentChip { border: 1px solid palette(mid); border-radius: 10px; "
                           "background-color: palette(alternate-base); }")
        row = QHBoxLayout(self)
        row.setContentsMargins(8, 2, 2, 2)
        row.setSpacing(6)
        self.label = QLabel(short_name(name))
        self.label.setTextFormat(Qt.TextFormat.PlainText)  # a file's name is anyone's: never markup
        row.addWidget(self.label)
        self.tokens = QLabel("reading…")
        self.tokens.setEnabled(False)  # the palette's dim text
        row.addWidget(self.tokens)
        self.remove_button = QToolButton(self)
        self.remove_button.setText("×")
        self.remove_button.setAutoRaise(True)
        self.remove_button.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
        self.remove_button.setToolTip(f"Remove {display_safe(name)}")
        self.remove_button.setAccessibleName(f"Remove the attachment {display_safe(name)}")
        self.remove_button.clicked.connect(lambda: self.remove_requested.emit(self.key))
        row.addWidget(self.remove_button)
        self.setToolTip(display_safe(name))
        self.setAccessibleName(f"Attachment {display_safe(name)}, being read")

    def set_read(self, kind: str, size: int, pages: int | None, tokens: int | None) -> None:
        """The file was read: its token count (None: still being counted) and, in the tooltip, what it is."""
        self.tokens.setText(chip_tokens(tokens))
        self.setToolTip(describe(self.name, kind, size, pages))
        self.setAccessibleName(f"Attachment {describe(self.name, kind, size, pages)}, {chip_tokens(tokens)}")

    def keyPressEvent(self, event: QKeyEvent) -> None:  # noqa: N802 - Qt's name
        if event.key() in (Qt.Key.Key_Delete, Qt.Key.Key_Backspace):
            self.remove_requested.emit(self.key)
            return
        super().keyPressEvent(event)


class AttachmentTray(QWidget):
    """The chips, the total line and the refusal line; hidden while there is nothing to show."""

    remove_requested = Signal(int)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setAccessibleName("Attachments")
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 4)
        outer.setSpacing(3)
        self.chip_area = QWidget(self)
        self.flow = FlowLayout(self.chip_area)
        outer.addWidget(self.chip_area)
        self.total = QLabel("")
        self.total.setObjectName("attachmentTotal")
        self.total.setTextFormat(Qt.TextFormat.PlainText)
        self.total.setWordWrap(True)
        self.total.setAccessibleName("Tokens of the message with its attachments")
        outer.addWidget(self.total)
        self.problem = QLabel("")
        self.problem.setObjectName("attachmentProblem")
        self.problem.setTextFormat(Qt.TextFormat.PlainText)  # the reason names the file: never markup
        self.problem.setWordWrap(True)
        self.problem.setStyleSheet("#attachmentProblem { color: #c0392b; }")
        self.problem.setAccessibleName("Why a file was not attached")
        outer.addWidget(self.problem)
        self.chips: dict[int, AttachmentChip] = {}
        self._update_visibility()

    def add_chip(self, key: int, name: str) -> AttachmentChip:
        chip = AttachmentChip(key, name, self.chip_area)
        chip.remove_requested.connect(self.remove_requested)
        self.chips[key] = chip
        self.flow.addWidget(chip)
        chip.show()
        self._update_visibility()
        return chip

    def remove_chip(self, key: int) -> None:
        chip = self.chips.pop(key, None)
        if chip is not None:
            self.flow.removeWidget(chip)
            chip.hide()
            chip.deleteLater()
        self._update_visibility()

    def set_total(self, total: Total | None) -> None:
        self.total.setText(total.text if total is not None else "")
        self.total.setStyleSheet("#attachmentTotal { color: #c0392b; font-weight: bold; }"
                                 if total is not None and total.warning else "")
        self._update_visibility()

    def say_problem(self, text: str) -> None:
        """Why a file was not attached ("" clears it)."""
        self.problem.setText(text)
        self._update_visibility()

    def add_problem(self, text: str) -> None:
        """Another file of the same drop was refused: its reason on a line of its own."""
        self.say_problem("\n".join(filter(None, (self.problem.text(), text))))

    def _update_visibility(self) -> None:
        self.chip_area.setVisible(bool(self.chips))
        self.total.setVisible(bool(self.chips) and bool(self.total.text()))
        self.problem.setVisible(bool(self.problem.text()))
        self.setVisible(bool(self.chips) or bool(self.problem.text()))
        self.chip_area.updateGeometry()
