"""A one-line label that never widens its window: long text is cut with "…", the whole of it in the tooltip."""

from __future__ import annotations

from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QFontMetrics, QPainter
from PySide6.QtWidgets import QLabel, QSizePolicy, QWidget

from engine.api import COPY_SUFFIX

PREFERRED_WIDTH = 360  # what it asks a layout for at most; it takes whatever it is given


def elide_title(fm: QFontMetrics, title: str, width: int) -> str:
    """A chat's title cut to ``width`` with "…", keeping a trailing " (imported)" whole: cut at the end,
    an imported copy and its original looked identical in the lists."""
    if fm.horizontalAdvance(title) <= width or not title.endswith(COPY_SUFFIX) or title == COPY_SUFFIX:
        return fm.elidedText(title, Qt.TextElideMode.ElideRight, width)
    base = title[: -len(COPY_SUFFIX)]
    room = width - fm.horizontalAdvance(COPY_SUFFIX)
    if room < fm.horizontalAdvance("x…"):
        return fm.elidedText(title, Qt.TextElideMode.ElideLeft, width)  # too narrow: the suffix still shows
    return fm.elidedText(base, Qt.TextElideMode.ElideRight, room) + COPY_SUFFIX


class ElidedLabel(QLabel):
    def __init__(self, text: str = "", parent: QWidget | None = None):
        super().__init__(parent)
        self._full = ""
        self.note = ""  # more for the tooltip, after the whole text when that is cut
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.setText(text)

    def setText(self, text: str) -> None:  # noqa: N802 - Qt's name
        self._full = text
        super().setText(text)  # kept whole for accessibility tools and text()
        self._tip()
        self.update()

    def set_note(self, note: str) -> None:
        self.note = note
        self._tip()

    def _tip(self) -> None:
        # Not laid out yet (hidden): its width means nothing; the resize that shows it asks again.
        cut = self.isVisible() and self.fontMetrics().horizontalAdvance(self._full) > self.contentsRect().width()
        self.setToolTip("\n".join(part for part in (self._full if cut else "", self.note) if part))

    def text(self) -> str:
        return self._full

    def elided(self) -> str:
        """What is drawn at the current width."""
        return self.fontMetrics().elidedText(self._full, Qt.TextElideMode.ElideRight, self.contentsRect().width())

    def sizeHint(self) -> QSize:  # noqa: N802 - Qt's name
        hint = super().sizeHint()
        return QSize(min(hint.width(), PREFERRED_WIDTH), hint.height())

    def minimumSizeHint(self) -> QSize:  # noqa: N802 - Qt's name
        return QSize(0, super().minimumSizeHint().height())

    def resizeEvent(self, event) -> None:  # noqa: N802 - Qt's name
        super().resizeEvent(event)
        self._tip()

    def paintEvent(self, _event) -> None:  # noqa: N802 - Qt's name
        painter = QPainter(self)
        painter.setPen(self.palette().color(self.foregroundRole()))
        painter.drawText(self.contentsRect(), Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter, self.elided())
