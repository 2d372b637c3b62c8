"""The browser's table as a model over plain rows: cells are formatted only when Qt paints them, so
listing or re-searching 10,000 conversations costs a list, not 90,000 item objects."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from PySide6.QtCore import QAbstractTableModel, QModelIndex, Qt
from PySide6.QtGui import QFontMetrics

from app.text import age, count, display_safe
from engine.types import ContextHealth, ContextStatus

COLUMNS = ("Title", "Match", "Created", "Last activity", "Messages", "Tokens", "Model", "Size", "Context")
HEADER_TIPS = {7: "Disk space of the chat's saved context, for every model that keeps one",
               8: "Saved context: valid, stale, damaged or none"}
ID_ROLE = Qt.ItemDataRole.UserRole + 11
FIRST_CONTEXT_COLUMN = 5  # Tokens, Model, Size, Context come from the saved-context check
# The widest text each fixed column usually shows (the header may be wider); Title and Match stretch.
_SAMPLES = {2: "2026-11-30 23:59", 3: "59 min ago", 4: "9,999", 5: "99,999", 6: "SmolLM2 135M",
            7: "99.9 MiB", 8: "damaged"}
DEFAULT_ORDER = (3, Qt.SortOrder.DescendingOrder)  # last activity, newest first


def column_widths(fm: QFontMetrics) -> dict[int, int]:
    """Pixel widths of the fixed columns for the table's font: their text and header fit, no more."""
    # Cell margins; the header also needs room for the sort arrow. A longer model name is cut with "…",
    # whole in its tooltip.
    return {c: max(fm.horizontalAdvance(sample) + 16, fm.horizontalAdvance(COLUMNS[c]) + 24)
            for c, sample in _SAMPLES.items()}


def mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def size_breakdown(status: ContextStatus) -> str:
    """The Size cell's tooltip when the chat keeps saved context for more than one model: each one's part,
    the one checked (shown in the other cells) first."""
    first = f"{mib(status.bytes)} for {display_safe(status.model) or 'the model it uses'}" if status.bytes else ""
    kept = [f"{mib(n)} kept for {display_safe(model)}" for model, n in status.others]  # labels from the files
    return f"{mib(status.disk_bytes)} in all: " + "; ".join([first, *kept] if first else kept)


def _ck(row: dict) -> ContextStatus:
    return row["checkpoint"] or _UNCHECKED


_UNCHECKED = ContextStatus("", ContextHealth.NONE)  # before the first check comes back: shown as "…"


# per column: (text shown, sort key)
_CELLS = (
    (lambda r: display_safe(r["title"] or "") or "New chat", lambda r: (r["title"] or "").lower()),  # anyone's text
    (lambda r: r["snippet"], lambda r: r["snippet"]),
    (lambda r: time.strftime("%Y-%m-%d %H:%M", time.localtime(r["created_ms"] / 1000)), lambda r: r["created_ms"]),
    (lambda r: age(r["updated_ms"]), lambda r: r["updated_ms"]),
    (lambda r: count(r["messages"]), lambda r: r["messages"]),
    (lambda r: count(_ck(r).tokens) if _ck(r).tokens else ("—" if r["checkpoint"] else ""), lambda r: _ck(r).tokens),
    (lambda r: display_safe(r["model"] or ""), lambda r: r["model"]),
    (lambda r: mib(_ck(r).disk_bytes) if _ck(r).disk_bytes else "", lambda r: _ck(r).disk_bytes),
    (lambda r: str(r["checkpoint"].health) if r["checkpoint"] else "…", lambda r: _ck(r).health if r["checkpoint"] else ""),
)


class ConversationTableModel(QAbstractTableModel):
    def __init__(self, parent=None):
        super().__init__(parent)
        self.rows: list[dict] = []  # store summaries + snippet (HTML) + checkpoint (ContextStatus or None)
        self._sorted: tuple[int, Qt.SortOrder] = DEFAULT_ORDER

    def set_rows(self, rows: list[dict]) -> None:
        self.beginResetModel()
        self.rows = rows
        self._sort_rows(*self._sorted)
        self.endResetModel()

    def rowCount(self, parent: QModelIndex | None = None) -> int:  # noqa: N802 - Qt's name
        return 0 if parent is not None and parent.isValid() else len(self.rows)

    def columnCount(self, parent: QModelIndex | None = None) -> int:  # noqa: N802 - Qt's name
        return 0 if parent is not None and parent.isValid() else len(COLUMNS)

    def headerData(self, section: int, orientation, role=Qt.ItemDataRole.DisplayRole):  # noqa: N802
        if orientation == Qt.Orientation.Horizontal and role == Qt.ItemDataRole.DisplayRole:
            return COLUMNS[section]
        if orientation == Qt.Orientation.Horizontal and role == Qt.ItemDataRole.ToolTipRole:
            return HEADER_TIPS.get(section)
        return None

    def data(self, index: QModelIndex, role=Qt.ItemDataRole.DisplayRole):
        if not index.isValid():
            return None
        row = self.rows[index.row()]
        if role == Qt.ItemDataRole.DisplayRole:
            return _CELLS[index.column()][0](row)
        if role == ID_ROLE:
            return row["id"]
        if role == Qt.ItemDataRole.ToolTipRole:
            return self._tooltip(row, index.column())
        return None

    @staticmethod
    def _tooltip(row: dict, column: int) -> str | None:
        if column == 0:
            return display_safe(row["title"] or "") or "New chat"  # elided in the cell
        if column == 5 and row["checkpoint"] and not _ck(row).tokens:
            return "No saved context: counted when the chat is next opened"
        if column == 6:
            return display_safe(row["model"] or "") or None
        if column == 7 and _ck(row).others:
            return size_breakdown(_ck(row))
        if column == len(COLUMNS) - 1:
            return _ck(row).message or _ck(row).reason
        return None

    def update_checkpoints(self, ids: Iterable[str], status_of: Callable[[str], ContextStatus | None]) -> None:
        """New saved-context facts for ``ids``: their cells repaint, the rows stay where they are."""
        wanted = set(ids)
        changed = [i for i, row in enumerate(self.rows) if row["id"] in wanted]
        for i in changed:
            self.rows[i]["checkpoint"] = status_of(self.rows[i]["id"])
        if changed:
            self.dataChanged.emit(self.index(min(changed), FIRST_CONTEXT_COLUMN),
                                  self.index(max(changed), len(COLUMNS) - 1))

    def sort(self, column: int, order: Qt.SortOrder = Qt.SortOrder.AscendingOrder) -> None:
        self.layoutAboutToBeChanged.emit()
        self._sorted = (column, order)
        self._sort_rows(column, order)
        self.layoutChanged.emit()

    def _sort_rows(self, column: int, order: Qt.SortOrder) -> None:
        self.rows.sort(key=_CELLS[column][1], reverse=order == Qt.SortOrder.DescendingOrder)
