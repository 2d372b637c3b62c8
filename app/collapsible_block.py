"""A collapsed block in the transcript: a header that expands it (click, or Space/Enter on the focused
header), and plain text under it (never HTML or Markdown: a document, a model's thinking or a tool's result
is anyone's) in a box of bounded height. The text is laid out only when first expanded, and at most
DISPLAY_CHARS of it until "Show all", so a chat with a 2 MB document or a long thinking opens and scrolls as
fast as one without. The attachments (app/attachment_block.py), a reply's thinking and its tool calls and
results (app/agent_blocks.py) are such blocks."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QTextCursor, QTextOption
from PySide6.QtWidgets import QFrame, QHBoxLayout, QPlainTextEdit, QPushButton, QToolButton, QVBoxLayout, QWidget

from app.text import count

DISPLAY_CHARS = 100_000  # laid out at first; "Show all" lays out the rest
TEXT_HEIGHT_PX = 320  # the expanded text scrolls inside this height, so the transcript stays readable


class CollapsibleBlock(QFrame):
    """``title`` on the header, ``text`` under it once expanded; ``hints``: the header's tooltip when
    collapsed and expanded; ``what``: the text's name for screen readers ("Text of heron.txt")."""

    def __init__(self, title: str, text: str, hints: tuple[str, str], what: str, parent: QWidget | None = None,
                 object_name: str = "collapsibleBlock"):
        super().__init__(parent)
        self._text = text
        self._hints = hints
        self._what = what
        self.setObjectName(object_name)
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.setStyleSheet(f"#{object_name} {{ border: 1px solid palette(mid); border-radius: 6px; }}")
        outer = QVBoxLayout(self)
        outer.setContentsMargins(6, 2, 6, 2)
        outer.setSpacing(2)
        head = QHBoxLayout()
        self.toggle = QToolButton(self)
        self.toggle.setCheckable(True)
        self.toggle.setAutoRaise(True)
        self.toggle.setArrowType(Qt.ArrowType.RightArrow)
        self.toggle.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.toggle.setFocusPolicy(Qt.FocusPolicy.StrongFocus)  # reachable with Tab, opened with Space
        self.toggle.toggled.connect(self.set_expanded)
        head.addWidget(self.toggle)
        head.addStretch(1)
        outer.addLayout(head)
        self.text_view: QPlainTextEdit | None = None  # made on first expanding
        self.show_all: QPushButton | None = None
        self.shown_chars = 0
        self.set_title(title)

    @property
    def title(self) -> str:
        return self.toggle.text()

    @property
    def text(self) -> str:
        return self._text

    def set_title(self, title: str) -> None:
        self.toggle.setText(title)
        self._describe()

    def _describe(self) -> None:
        expanded = self.toggle.isChecked()
        self.toggle.setToolTip(self._hints[1] if expanded else self._hints[0])
        self.toggle.setAccessibleName(f"{self.toggle.text()}: {self._hints[1] if expanded else self._hints[0]}")

    @property
    def expanded(self) -> bool:
        return self.toggle.isChecked()

    def set_expanded(self, expanded: bool) -> None:
        if self.toggle.isChecked() != expanded:
            self.toggle.setChecked(expanded)  # comes back here through toggled
            return
        self.toggle.setArrowType(Qt.ArrowType.DownArrow if expanded else Qt.ArrowType.RightArrow)
        self._describe()
        if expanded and self.text_view is None:
            self._build_text()
        if self.text_view is not None:
            self.text_view.setVisible(expanded)
        if self.show_all is not None:
            self.show_all.setVisible(expanded and self.shown_chars < len(self._shown_source()))

    def _shown_source(self) -> str:
        return self._text.rstrip("\n")  # a final newline only adds an empty line (and a scrollbar)

    def _build_text(self) -> None:
        view = self.text_view = QPlainTextEdit(self)
        view.setReadOnly(True)
        view.setWordWrapMode(QTextOption.WrapMode.WrapAtWordBoundaryOrAnywhere)
        view.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)  # it wraps: nothing to the side
        view.setAccessibleName(self._what)
        text = self._shown_source()
        view.setPlainText(text[:DISPLAY_CHARS])
        self.shown_chars = min(len(text), DISPLAY_CHARS)
        self._fit_height()
        self.layout().addWidget(view)
        if self.shown_chars < len(text):
            self._offer_show_all(len(text))

    def _offer_show_all(self, total: int) -> None:
        if self.show_all is None:
            self.show_all = QPushButton(self)
            self.show_all.setAccessibleName("Show the whole text")
            self.show_all.clicked.connect(self._show_everything)
            self.layout().addWidget(self.show_all, 0, Qt.AlignmentFlag.AlignLeft)
        self.show_all.setText(f"Show all ({count(total)} characters; {count(self.shown_chars)} shown)")
        self.show_all.setVisible(self.expanded)

    def _fit_height(self) -> None:
        """A short text gets a short box: about its lines' height, wrapped at ~90 characters (the box never
        passes TEXT_HEIGHT_PX, so only the start of a long text is looked at)."""
        view = self.text_view
        lines = sum(max(1, -(-len(line) // 90)) for line in self._text[:4000].split("\n"))
        natural = (min(lines, 40) + 1) * view.fontMetrics().lineSpacing() + 2 * view.frameWidth() + 12
        view.setFixedHeight(min(TEXT_HEIGHT_PX, natural))

    def _show_everything(self) -> None:
        if self.text_view is None:
            return
        self.text_view.setPlainText(self._shown_source())
        self.shown_chars = len(self._shown_source())
        self.text_view.setFixedHeight(TEXT_HEIGHT_PX)
        if self.show_all is not None:
            self.show_all.hide()

    def append_text(self, piece: str) -> None:
        """More text at the end (a thinking that streams): drawn at once when the block is laid out and shows
        everything so far, else laid out when expanded."""
        before = len(self._shown_source())
        self._text += piece
        view = self.text_view
        if view is None or self.shown_chars < before:
            return
        text = self._shown_source()
        room = DISPLAY_CHARS - self.shown_chars
        added = text[self.shown_chars:]
        cursor = QTextCursor(view.document())
        cursor.movePosition(QTextCursor.MoveOperation.End)
        cursor.insertText(added[:room])
        self.shown_chars += min(len(added), room)
        self._fit_height()
        if self.shown_chars < len(text):
            self._offer_show_all(len(text))
        bar = view.verticalScrollBar()
        bar.setValue(bar.maximum())  # the newest thinking in sight, as it is written

    def set_text(self, text: str) -> None:
        """The whole text anew (a reply's final thinking): laid out again only when it is shown."""
        self._text = text
        if self.text_view is not None:
            view = self.text_view
            shown = self._shown_source()
            view.setPlainText(shown[:DISPLAY_CHARS])
            self.shown_chars = min(len(shown), DISPLAY_CHARS)
            self._fit_height()
            if self.shown_chars < len(shown):
                self._offer_show_all(len(shown))

    def shown_text(self) -> str:
        return self.text_view.toPlainText() if self.text_view is not None else ""
