"""The browser's table as a model over plain rows: cells are formatted only when Qt paints them, so
listing or re-searching 10,000 conversations costs a list, not 90,000 item objects."""

from __future__ import annotations

import time

from PySide6.QtCore import QAbstractTableModel, QModelIndex, Qt

from app.text import age, count
from engine.types import ContextHealth, ContextStatus

COLUMNS = ("Title", "Match", "Created", "Last activity", "Messages", "Tokens", "Model", "Context size", "Context")
ID_ROLE = Qt.ItemDataRole.UserRole + 11


def _ck(row: dict) -> ContextStatus:
    return row["checkpoint"] or _UNCHECKED


_UNCHECKED = ContextStatus("", ContextHealth.NONE)  # before the first check comes back: shown as "…"


# per column: (text shown, sort key)
_CELLS = (
    (lambda r: r["title"] or "New chat", lambda r: (r["title"] or "").lower()),
    (lambda r: r["snippet"], lambda r: r["snippet"]),
    (lambda r: time.strftime("%Y-%m-%d %H:%M", time.localtime(r["created_ms"] / 1000)), lambda r: r["created_ms"]),
    (lambda r: age(r["updated_ms"]), lambda r: r["updated_ms"]),
    (lambda r: count(r["messages"]), lambda r: r["messages"]),
    (lambda r: count(_ck(r).tokens) if _ck(r).tokens else "", lambda r: _ck(r).tokens),
    (lambda r: r["model"], lambda r: r["model"]),
    (lambda r: f"{_ck(r).bytes / 2**20:.1f} MiB" if _ck(r).bytes else "", lambda r: _ck(r).bytes),
    (lambda r: str(r["checkpoint"].health) if r["checkpoint"] else "…", lambda r: _ck(r).health if r["checkpoint"] else ""),
)


class ConversationTableModel(QAbstractTableModel):
    def __init__(self, parent=None):
        super().__init__(parent)
        self.rows: list[dict] = []  # store summaries + snippet (HTML) + checkpoint (ContextStatus or None)
        self._sorted: tuple[int, Qt.SortOrder] | None = None

    def set_rows(self, rows: list[dict]) -> None:
        self.beginResetModel()
        self.rows = rows
        if self._sorted is not None:
            self._sort_rows(*self._sorted)
        self.endResetModel()

    def rowCount(self, parent: QModelIndex | None = None) -> int:  # noqa: N802 - Qt's name
        return 0 if parent is not None and parent.isValid() else len(self.rows)

    def columnCount(self, parent: QModelIndex | None = None) -> int:  # noqa: N802 - Qt's name
        return 0 if parent is not None and parent.isValid() else len(COLUMNS)

    def headerData(self, section: int, orientation, role=Qt.ItemDataRole.DisplayRole):  # noqa: N802
        if orientation == Qt.Orientation.Horizontal and role == Qt.ItemDataRole.DisplayRole:
            return COLUMNS[section]
        return None

    def data(self, index: QModelIndex, role=Qt.ItemDataRole.DisplayRole):
        if not index.isValid():
            return None
        row = self.rows[index.row()]
        if role == Qt.ItemDataRole.DisplayRole:
            return _CELLS[index.column()][0](row)
        if role == ID_ROLE:
            return row["id"]
        if role == Qt.ItemDataRole.ToolTipRole and index.column() == len(COLUMNS) - 1:
            return _ck(row).message or _ck(row).reason
        return None

    def sort(self, column: int, order: Qt.SortOrder = Qt.SortOrder.AscendingOrder) -> None:
        self.layoutAboutToBeChanged.emit()
        self._sorted = (column, order)
        self._sort_rows(column, order)
        self.layoutChanged.emit()

    def _sort_rows(self, column: int, order: Qt.SortOrder) -> None:
        self.rows.sort(key=_CELLS[column][1], reverse=order == Qt.SortOrder.DescendingOrder)
