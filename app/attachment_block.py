"""An attachment in the transcript: a collapsed block with its name, kind and size; expanding it shows the
extracted text, as plain text (never HTML or Markdown: a document is anyone's) in a scroll area of bounded
height. The text is laid out only when first expanded, and at most DISPLAY_CHARS of it until "Show all"
is pressed, so a chat with a 2 MB document opens and scrolls as fast as one without."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QTextOption
from PySide6.QtWidgets import QFrame, QHBoxLayout, QPlainTextEdit, QPushButton, QToolButton, QVBoxLayout, QWidget

from app.attachment_text import describe
from app.text import count

DISPLAY_CHARS = 100_000  # laid out at first; "Show all" lays out the rest
TEXT_HEIGHT_PX = 320  # the expanded text scrolls inside this height, so the transcript stays readable


class AttachmentBlock(QFrame):
    def __init__(self, attachment, parent: QWidget | None = None):
        super().__init__(parent)
        self.attachment = attachment
        self.setObjectName("attachmentBlock")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.setStyleSheet("#attachmentBlock { border: 1px solid palette(mid); border-radius: 6px; }")
        outer = QVBoxLayout(self)
        outer.setContentsMargins(6, 2, 6, 2)
        outer.setSpacing(2)
        head = QHBoxLayout()
        label = describe(attachment.name, attachment.kind, attachment.size, attachment.pages)
        self.toggle = QToolButton(self)
        self.toggle.setCheckable(True)
        self.toggle.setAutoRaise(True)
        self.toggle.setArrowType(Qt.ArrowType.RightArrow)
        self.toggle.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.toggle.setText(label)
        self.toggle.setToolTip("Show the text Hearth read from this file")
        self.toggle.setAccessibleName(f"Attachment {label}: show its text")
        self.toggle.toggled.connect(self.set_expanded)
        head.addWidget(self.toggle)
        head.addStretch(1)
        outer.addLayout(head)
        self.text_view: QPlainTextEdit | None = None  # made on first expanding
        self.show_all: QPushButton | None = None

    @property
    def expanded(self) -> bool:
        return self.toggle.isChecked()

    def set_expanded(self, expanded: bool) -> None:
        if self.toggle.isChecked() != expanded:
            self.toggle.setChecked(expanded)  # comes back here through toggled
            return
        self.toggle.setArrowType(Qt.ArrowType.DownArrow if expanded else Qt.ArrowType.RightArrow)
        self.toggle.setToolTip("Hide the text" if expanded else "Show the text Hearth read from this file")
        if expanded and self.text_view is None:
            self._build_text()
        if self.text_view is not None:
            self.text_view.setVisible(expanded)
        if self.show_all is not None:
            self.show_all.setVisible(expanded and self.shown_chars < len(self.attachment.text.rstrip("\n")))

    def _build_text(self) -> None:
        view = self.text_view = QPlainTextEdit(self)
        view.setReadOnly(True)
        view.setWordWrapMode(QTextOption.WrapMode.WrapAtWordBoundaryOrAnywhere)
        view.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)  # it wraps: nothing to the side
        view.setAccessibleName(f"Text of {self.attachment.name}")
        text = self.attachment.text.rstrip("\n")  # a final newline only adds an empty line (and a scrollbar)
        view.setPlainText(text[:DISPLAY_CHARS])
        self.shown_chars = min(len(text), DISPLAY_CHARS)
        view.setFixedHeight(min(TEXT_HEIGHT_PX, self._natural_height(view)))
        self.layout().addWidget(view)
        if self.shown_chars < len(text):
            self.show_all = QPushButton(f"Show all ({count(len(text))} characters; "
                                        f"{count(self.shown_chars)} shown)", self)
            self.show_all.setAccessibleName("Show the whole text of the attachment")
            self.show_all.clicked.connect(self._show_everything)
            self.layout().addWidget(self.show_all, 0, Qt.AlignmentFlag.AlignLeft)

    def _natural_height(self, view: QPlainTextEdit) -> int:
        """A short text gets a short box: about its lines' height, wrapped at ~90 characters (the box never
        passes TEXT_HEIGHT_PX, so only the start of a long text is looked at)."""
        lines = sum(max(1, -(-len(line) // 90)) for line in self.attachment.text[:4000].split("\n"))
        return (min(lines, 40) + 1) * view.fontMetrics().lineSpacing() + 2 * view.frameWidth() + 12

    def _show_everything(self) -> None:
        if self.text_view is None:
            return
        self.text_view.setPlainText(self.attachment.text.rstrip("\n"))
        self.shown_chars = len(self.attachment.text.rstrip("\n"))
        self.text_view.setFixedHeight(TEXT_HEIGHT_PX)
        if self.show_all is not None:
            self.show_all.hide()

    def shown_text(self) -> str:
        return self.text_view.toPlainText() if self.text_view is not None else ""
