"""The reading size of the chat (View → Larger/Smaller text): bounded, one point per step."""

from __future__ import annotations

import logging

from PySide6.QtGui import QFont
from PySide6.QtWidgets import QApplication, QWidget

log = logging.getLogger(__name__)
MIN_PT, MAX_PT = 8, 24


def default_size() -> int:
    """The application font's size: what Reset goes back to."""
    app = QApplication.instance()
    size = round(app.font().pointSizeF()) if app is not None else 10
    return clamp(size if size > 0 else 10)


def clamp(points: int) -> int:
    return max(MIN_PT, min(MAX_PT, points))


def parse_size(value: object) -> int | None:
    """A stored size, or None (the default) when missing or not a number; out of range is clamped."""
    if value is None or value == "":
        return None
    try:
        return clamp(int(float(str(value))))
    except ValueError:
        log.warning("text size %r in the settings file is not a number; using the default", value)
        return None


def apply_size(widgets: list[QWidget], points: int) -> None:
    """Give ``widgets`` (and, by Qt's font propagation, their children) text of ``points`` points."""
    for w in widgets:
        font = QFont(w.font())
        font.setPointSize(points)
        w.setFont(font)
