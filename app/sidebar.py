"""The conversation list: title, last activity, token count and a badge for the saved context."""

from __future__ import annotations

from collections.abc import Mapping

from PySide6.QtCore import QModelIndex, QRect, QSize, Qt
from PySide6.QtGui import QColor, QFontMetrics, QPainter, QPalette
from PySide6.QtWidgets import QListWidget, QListWidgetItem, QStyle, QStyledItemDelegate, QStyleOptionViewItem

from app.text import age, count
from engine.types import ContextBadge, ContextState

ID_ROLE = Qt.ItemDataRole.UserRole
SUBTITLE_ROLE = Qt.ItemDataRole.UserRole + 1
BADGE_ROLE = Qt.ItemDataRole.UserRole + 2
UPDATED_ROLE = Qt.ItemDataRole.UserRole + 3
TOKENS_ROLE = Qt.ItemDataRole.UserRole + 4
MODEL_ROLE = Qt.ItemDataRole.UserRole + 5  # the model the chat was last used with, as a short title
BADGE_COLORS = {"live": "#2e9d57", "saved": "#3b78c4", "stale": "#c48a1e", "rebuilding": "#8e5cc7", "none": "#8a8a8a",
                "damaged": "#c0392b"}
BADGE_TIPS = {
    "live": "in memory: continues at once",
    "saved": "saved context on disk: reopens without re-reading",
    "stale": "saved context only from another model (kept for it): this model reads the chat anew",
    "rebuilding": "the context is being rebuilt",
    "none": "no saved context: it will be read from scratch",
    "damaged": "the saved context failed its check: it is rebuilt when the chat is opened",
}


class ConversationDelegate(QStyledItemDelegate):
    def sizeHint(self, option: QStyleOptionViewItem, index: QModelIndex) -> QSize:  # noqa: N802
        fm = QFontMetrics(option.font)
        return QSize(200, fm.height() * 2 + 14)

    def paint(self, painter: QPainter, option: QStyleOptionViewItem, index: QModelIndex) -> None:
        painter.save()
        style = option.widget.style() if option.widget else None
        if style:
            style.drawPrimitive(QStyle.PrimitiveElement.PE_PanelItemViewItem, option, painter, option.widget)
        selected = bool(option.state & QStyle.StateFlag.State_Selected)
        pal = option.palette
        text_color = pal.color(QPalette.ColorRole.HighlightedText if selected else QPalette.ColorRole.Text)
        dim = QColor(text_color)
        dim.setAlpha(150)
        r = option.rect.adjusted(8, 5, -8, -5)
        badge = index.data(BADGE_ROLE) or "none"
        font = QFontMetrics(option.font)
        badge_w = font.horizontalAdvance(badge) + 12
        badge_rect = QRect(r.right() - badge_w, r.top() + 1, badge_w, font.height())
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        painter.setPen(Qt.PenStyle.NoPen)
        painter.setBrush(QColor(BADGE_COLORS.get(badge, "#8a8a8a")))
        painter.drawRoundedRect(badge_rect, 6, 6)
        painter.setPen(QColor("white"))
        painter.drawText(badge_rect, Qt.AlignmentFlag.AlignCenter, badge)
        title_font = option.font
        title_font.setBold(True)
        painter.setFont(title_font)
        painter.setPen(text_color)
        title_rect = QRect(r.left(), r.top(), r.width() - badge_w - 6, font.height())
        title = QFontMetrics(title_font).elidedText(index.data(Qt.ItemDataRole.DisplayRole) or "", Qt.TextElideMode.ElideRight,
                                                    title_rect.width())
        painter.drawText(title_rect, Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter, title)
        title_font.setBold(False)
        painter.setFont(title_font)
        painter.setPen(dim)
        sub_rect = QRect(r.left(), r.top() + font.height() + 3, r.width(), font.height())
        painter.drawText(sub_rect, Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter,
                         font.elidedText(index.data(SUBTITLE_ROLE) or "", Qt.TextElideMode.ElideRight, sub_rect.width()))
        painter.restore()


class ConversationList(QListWidget):
    def __init__(self, parent=None):
        super().__init__(parent)
        self.setItemDelegate(ConversationDelegate(self))
        self.setAccessibleName("Conversations")
        self.setUniformItemSizes(True)
        self._badges: dict[str, str] = {}

    def item_for(self, conversation: str) -> QListWidgetItem | None:
        for i in range(self.count()):
            if self.item(i).data(ID_ROLE) == conversation:
                return self.item(i)
        return None

    def upsert(self, conversation: str, title: str, updated_ms: int, tokens: int | None = None,
               top: bool = False, model: str | None = None) -> QListWidgetItem:
        item = self.item_for(conversation)
        if item is None:
            item = QListWidgetItem()
            item.setData(ID_ROLE, conversation)
            (self.insertItem(0, item) if top else self.addItem(item))
        elif top and self.row(item) != 0:
            selected = item.isSelected()
            self.blockSignals(True)
            self.insertItem(0, self.takeItem(self.row(item)))
            if selected:
                self.setCurrentItem(item)
            self.blockSignals(False)
        item.setData(Qt.ItemDataRole.DisplayRole, title or "New chat")
        item.setData(UPDATED_ROLE, updated_ms)
        if tokens is not None:
            item.setData(TOKENS_ROLE, tokens)
        if model is not None:
            item.setData(MODEL_ROLE, model)
        self._refresh(item)
        return item

    def sync(self, rows: list[tuple]) -> None:
        """Show exactly ``rows`` (id, title, last activity[, model]), in that order, keeping each item's badge and
        token count and the current item, without a selection signal (the window decides what to show
        when its chat is gone)."""
        items = {self.item(i).data(ID_ROLE): self.item(i) for i in range(self.count())}
        current = self.currentItem()
        self.blockSignals(True)
        try:
            if list(items) != [r[0] for r in rows]:
                while self.count():
                    self.takeItem(0)
                for cid, *_ in rows:
                    if cid not in items:
                        items[cid] = QListWidgetItem()
                        items[cid].setData(ID_ROLE, cid)
                    self.addItem(items[cid])
                if current is not None and current.data(ID_ROLE) in {r[0] for r in rows}:
                    self.setCurrentItem(current)
            for cid, title, updated_ms, *rest in rows:
                item = items[cid]
                model = rest[0] if rest else item.data(MODEL_ROLE)
                if (item.data(Qt.ItemDataRole.DisplayRole) != (title or "New chat") or item.data(UPDATED_ROLE) != updated_ms
                        or item.data(MODEL_ROLE) != model):
                    item.setData(Qt.ItemDataRole.DisplayRole, title or "New chat")
                    item.setData(UPDATED_ROLE, updated_ms)
                    item.setData(MODEL_ROLE, model)
                    self._refresh(item)
        finally:
            self.blockSignals(False)

    def set_badges(self, states: Mapping[str, ContextState]) -> None:
        """Conversations not named get "none" (unless rebuilding) and keep the token count they had."""
        for i in range(self.count()):
            item = self.item(i)
            cid = item.data(ID_ROLE)
            if item.data(BADGE_ROLE) == ContextBadge.REBUILDING and cid not in states:
                continue
            state = states.get(cid)
            item.setData(BADGE_ROLE, str(state.badge if state else ContextBadge.NONE))
            if state is not None and state.tokens:
                item.setData(TOKENS_ROLE, state.tokens)
            self._refresh(item)

    def set_badge(self, conversation: str, badge: ContextBadge) -> None:
        item = self.item_for(conversation)
        if item is not None:
            item.setData(BADGE_ROLE, str(badge))
            self._refresh(item)

    def badge(self, conversation: str) -> str | None:
        item = self.item_for(conversation)
        return item.data(BADGE_ROLE) if item is not None else None

    def _refresh(self, item: QListWidgetItem) -> None:
        tokens = item.data(TOKENS_ROLE)
        parts = [age(item.data(UPDATED_ROLE) or 0)]
        if tokens:
            parts.append(f"{count(tokens)} tokens")
        if item.data(MODEL_ROLE):
            parts.append(item.data(MODEL_ROLE))
        item.setData(SUBTITLE_ROLE, " · ".join(parts))
        badge = item.data(BADGE_ROLE) or "none"
        item.setToolTip(f"{item.data(Qt.ItemDataRole.DisplayRole)}\n{item.data(SUBTITLE_ROLE)}\n{BADGE_TIPS[badge]}")

    def refresh_ages(self) -> None:
        for i in range(self.count()):
            self._refresh(self.item(i))
