"""A one-line label that never widens its window: long text is cut with "…", the whole of it in the tooltip."""

from __future__ import annotations

import math

from PySide6.QtCore import QEvent, QSize, Qt
from PySide6.QtGui import QFontMetrics, QFontMetricsF, QPainter
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
    """``preferred_width``: the most it asks a layout for (None: its whole text, and it is never made wider
    than that either, so it sizes to its text and reserves no blank room).
    ``setText(text, short)``: a shorter form drawn (cut only if need be) when the whole does not fit; it is
    then what the label asks a layout for, and the whole is in the tooltip.
    ``least_width``: the narrowest a layout may make it (a label given a stretch shrinks to that first)."""

    def __init__(self, text: str = "", parent: QWidget | None = None, *,
                 preferred_width: int | None = PREFERRED_WIDTH, least_width: int = 0):
        super().__init__(parent)
        self._full = ""
        self._short = ""
        self._preferred = preferred_width
        self._least = least_width  # it is cut down to no less than this (or its text's width, if less)
        self.note = ""  # more for the tooltip, after the whole text when that is cut
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.setText(text)

    def setText(self, text: str, short: str = "") -> None:  # noqa: N802 - Qt's name
        self._full = text
        self._short = short if short != text else ""
        super().setText(text)  # kept whole for accessibility tools and text()
        self._tip()
        self._fit()
        self.update()

    def _fit(self) -> None:
        if self._preferred is None:
            self.setMaximumWidth(self.text_width())
        self.updateGeometry()

    def text_width(self, text: str | None = None) -> int:
        """The width that shows ``text`` (the whole text when None) uncut, margins included."""
        margins = self.width() - self.contentsRect().width()
        return self._advance(self._full if text is None else text) + margins

    def _advance(self, text: str) -> int:
        # Rounded up: QFontMetrics rounds 169.14 px down to 169, and the text drawn in 169 px was cut.
        return math.ceil(QFontMetricsF(self.font()).horizontalAdvance(text))

    def set_note(self, note: str) -> None:
        self.note = note
        self._tip()

    def _tip(self) -> None:
        # Not laid out yet (hidden): its width means nothing; the resize that shows it asks again.
        cut = self.isVisible() and self._advance(self._full) > self.contentsRect().width()
        self.setToolTip("\n".join(part for part in (self._full if cut else "", self.note) if part))

    def text(self) -> str:
        return self._full

    def elided(self) -> str:
        """What is drawn at the current width."""
        fm, width = self.fontMetrics(), self.contentsRect().width()
        shown = self._short if self._short and self._advance(self._full) > width else self._full
        return fm.elidedText(shown, Qt.TextElideMode.ElideRight, width)

    def sizeHint(self) -> QSize:  # noqa: N802 - Qt's name
        wanted = self.text_width(self._short or self._full)  # with a short form, what is left may grow it
        return QSize(wanted if self._preferred is None else min(wanted, self._preferred), super().sizeHint().height())

    def minimumSizeHint(self) -> QSize:  # noqa: N802 - Qt's name
        return QSize(min(self._least, self.text_width(self._short or self._full)), super().minimumSizeHint().height())

    def changeEvent(self, event) -> None:  # noqa: N802 - Qt's name
        super().changeEvent(event)
        if event.type() == QEvent.Type.FontChange:  # View → text size: the text's width changed
            self._fit()

    def resizeEvent(self, event) -> None:  # noqa: N802 - Qt's name
        super().resizeEvent(event)
        self._tip()

    def paintEvent(self, _event) -> None:  # noqa: N802 - Qt's name
        painter = QPainter(self)
        painter.setPen(self.palette().color(self.foregroundRole()))
        painter.drawText(self.contentsRect(), Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter, self.elided())
