"""The conversation list: title, last activity, token count and a badge for the saved context.

Chats are grouped (Pinned, Today, Yesterday, Previous 7 days, Older, by last activity) and can be
filtered by title. A group's header is drawn above its first chat by the delegate rather than being
an item of its own: every item stays a chat, so rows, keyboard moves and selection never land on a
header.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping

from PySide6.QtCore import QEvent, QModelIndex, QRect, QSize, Qt
from PySide6.QtGui import QColor, QFont, QFontMetrics, QKeyEvent, QMouseEvent, QPainter, QPalette
from PySide6.QtWidgets import (
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QStyle,
    QStyledItemDelegate,
    QStyleOptionViewItem,
)

from app.elided_label import elide_title
from app.text import age, count, display_safe
from engine.types import ContextBadge, ContextState

ID_ROLE = Qt.ItemDataRole.UserRole
SUBTITLE_ROLE = Qt.ItemDataRole.UserRole + 1
BADGE_ROLE = Qt.ItemDataRole.UserRole + 2
UPDATED_ROLE = Qt.ItemDataRole.UserRole + 3
TOKENS_ROLE = Qt.ItemDataRole.UserRole + 4
MODEL_ROLE = Qt.ItemDataRole.UserRole + 5  # the model the chat was last used with, as a short title
PINNED_ROLE = Qt.ItemDataRole.UserRole + 6
HEADER_ROLE = Qt.ItemDataRole.UserRole + 7  # the group name drawn above this chat (its group's first), else None
PINNED, TODAY, YESTERDAY, PREVIOUS_WEEK, OLDER = "Pinned", "Today", "Yesterday", "Previous 7 days", "Older"
# White text on each badge reads at ≥ 4.5:1 (tests/test_app_shell.py checks).
BADGE_COLORS = {"live": "#23804a", "saved": "#3566b0", "stale": "#9a6a12", "rebuilding": "#7d4fb8", "none": "#6b6b6b",
                "damaged": "#c0392b", "remote": "#2d6a73"}
BADGE_TIPS = {
    "live": "in memory: continues at once",
    "saved": "saved context on disk: reopens without re-reading",
    "stale": "saved context only from another model (kept for it): this model reads the chat anew",
    "rebuilding": "the context is being rebuilt",
    "none": "no saved context: it will be read from scratch",
    "damaged": "the saved context failed its check: it is rebuilt when the chat is opened",
    "remote": "runs on a remote server: saved context on this disk does not apply to it",
}


def date_group(updated_ms: int, today: dt.date | None = None) -> str:
    """The group of a chat last active at ``updated_ms`` (local time)."""
    today = today or dt.date.today()
    days = (today - dt.datetime.fromtimestamp(updated_ms / 1000).date()).days
    if days <= 0:
        return TODAY  # today, or a clock that moved back: not "Older"
    if days == 1:
        return YESTERDAY
    return PREVIOUS_WEEK if days <= 7 else OLDER


def header_height(option: QStyleOptionViewItem) -> int:
    return QFontMetrics(option.font).height() + 12


class ConversationDelegate(QStyledItemDelegate):
    def __init__(self, parent=None):
        super().__init__(parent)
        self.drawn_titles: dict[str, str] = {}  # conversation id → its title as last painted (maybe cut)

    def sizeHint(self, option: QStyleOptionViewItem, index: QModelIndex) -> QSize:  # noqa: N802
        fm = QFontMetrics(option.font)
        extra = header_height(option) if index.data(HEADER_ROLE) else 0
        return QSize(200, fm.height() * 2 + 14 + extra)

    def paint(self, painter: QPainter, option: QStyleOptionViewItem, index: QModelIndex) -> None:
        painter.save()
        header = index.data(HEADER_ROLE)
        if header:
            option = QStyleOptionViewItem(option)
            self._paint_header(painter, option, header)
            option.rect = option.rect.adjusted(0, header_height(option), 0, 0)
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
        title = elide_title(QFontMetrics(title_font), index.data(Qt.ItemDataRole.DisplayRole) or "", title_rect.width())
        self.drawn_titles[index.data(ID_ROLE)] = title  # what shows, for tests and accessibility checks
        painter.drawText(title_rect, Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter, title)
        title_font.setBold(False)
        painter.setFont(title_font)
        painter.setPen(dim)
        sub_rect = QRect(r.left(), r.top() + font.height() + 3, r.width(), font.height())
        painter.drawText(sub_rect, Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter,
                         font.elidedText(index.data(SUBTITLE_ROLE) or "", Qt.TextElideMode.ElideRight, sub_rect.width()))
        painter.restore()

    @staticmethod
    def _paint_header(painter: QPainter, option: QStyleOptionViewItem, text: str) -> None:
        """The group's name, small and bold in the window's dim text colour, never highlighted."""
        font = QFont(option.font)
        font.setBold(True)
        font.setPointSizeF(max(6.0, font.pointSizeF() * 0.9))
        painter.setFont(font)
        painter.setPen(option.palette.color(QPalette.ColorGroup.Disabled, QPalette.ColorRole.WindowText))
        rect = QRect(option.rect.left() + 8, option.rect.top() + 6, option.rect.width() - 16, header_height(option) - 6)
        painter.drawText(rect, Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter, text.upper())


class ConversationList(QListWidget):
    def __init__(self, parent=None):
        super().__init__(parent)
        self.setItemDelegate(ConversationDelegate(self))
        self.setAccessibleName("Conversations")
        self.setUniformItemSizes(False)  # a group's first chat is taller: its header is drawn above it
        self._badges: dict[str, str] = {}
        self._pinned: set[str] = set()
        self._remote: set[str] = set()  # chats whose model is NAME/MODEL of an added server: badge "remote"
        self._filter = ""

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
            item.setData(PINNED_ROLE, conversation in self._pinned)
            (self.insertItem(self._top_row(conversation), item) if top else self.addItem(item))
        elif top and self.row(item) != self._top_row(conversation):
            selected = item.isSelected()
            self.blockSignals(True)
            self.insertItem(self._top_row(conversation), self.takeItem(self.row(item)))
            if selected:
                self.setCurrentItem(item)
            self.blockSignals(False)
        item.setData(Qt.ItemDataRole.DisplayRole, display_safe(title or "") or "New chat")  # an import's: anyone's
        item.setData(UPDATED_ROLE, updated_ms)
        if tokens is not None:
            item.setData(TOKENS_ROLE, tokens)
        if model is not None:
            item.setData(MODEL_ROLE, display_safe(model))
        self._refresh(item)
        self._regroup()
        return item

    def sync(self, rows: list[tuple]) -> None:
        """Show exactly ``rows`` (id, title, last activity[, model]), in that order but pinned chats first,
        keeping each item's badge and token count and the current item, without a selection signal (the
        window decides what to show when its chat is gone)."""
        rows = self._pinned_first(rows)
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
                model = (display_safe(rest[0]) if rest[0] else rest[0]) if rest else item.data(MODEL_ROLE)  # anyone's text
                shown = display_safe(title or "") or "New chat"
                if (item.data(Qt.ItemDataRole.DisplayRole) != shown or item.data(UPDATED_ROLE) != updated_ms
                        or item.data(MODEL_ROLE) != model):
                    item.setData(Qt.ItemDataRole.DisplayRole, shown)
                    item.setData(UPDATED_ROLE, updated_ms)
                    item.setData(MODEL_ROLE, model)
                    self._refresh(item)
                item.setData(PINNED_ROLE, cid in self._pinned)
            self._regroup()
        finally:
            self.blockSignals(False)

    def set_badges(self, states: Mapping[str, ContextState]) -> None:
        """Conversations not named get "none" (unless rebuilding) and keep the token count they had. A stale
        entry's count is the other model's (another tokenizer): the chat shows none until this model counts."""
        for i in range(self.count()):
            item = self.item(i)
            cid = item.data(ID_ROLE)
            if item.data(BADGE_ROLE) == ContextBadge.REBUILDING and cid not in states:
                continue
            state = states.get(cid)
            item.setData(BADGE_ROLE, "remote" if cid in self._remote else str(state.badge if state else ContextBadge.NONE))
            if state is not None and state.badge == ContextBadge.STALE:
                item.setData(TOKENS_ROLE, None)
            elif state is not None and state.tokens:
                item.setData(TOKENS_ROLE, state.tokens)
            self._refresh(item)

    def set_badge(self, conversation: str, badge: ContextBadge) -> None:
        item = self.item_for(conversation)
        if item is not None:
            item.setData(BADGE_ROLE, "remote" if conversation in self._remote else str(badge))
            self._refresh(item)

    def set_remote_ids(self, conversations: set[str]) -> None:
        """The chats on a remote server's model: their badge says ``remote`` (a chat moved back to a local
        model gets its saved-context badge at the engine's next report; "none" until then)."""
        before, self._remote = self._remote, set(conversations)
        for i in range(self.count()):
            item = self.item(i)
            cid = item.data(ID_ROLE)
            if cid in self._remote:
                item.setData(BADGE_ROLE, "remote")
            elif cid in before:
                item.setData(BADGE_ROLE, str(ContextBadge.NONE))
            else:
                continue
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
        self._regroup()  # midnight moves chats from Today to Yesterday

    # pins, groups and the filter (issue 18) ---------------------------------------------------------------
    def set_pinned_ids(self, pinned: set[str]) -> None:
        """Which chats are pinned: they go first, in their own group (the order among them is kept)."""
        self._pinned = set(pinned)
        current = self.currentItem()
        self.blockSignals(True)
        try:
            order = [self.item(i) for i in range(self.count())]
            wanted = self._pinned_first([(it.data(ID_ROLE),) for it in order])
            if [it.data(ID_ROLE) for it in order] != [r[0] for r in wanted]:
                by_id = {it.data(ID_ROLE): it for it in order}
                while self.count():
                    self.takeItem(0)
                for (cid,) in wanted:
                    self.addItem(by_id[cid])
                if current is not None:
                    self.setCurrentItem(current)
            for it in order:
                it.setData(PINNED_ROLE, it.data(ID_ROLE) in self._pinned)
            self._regroup()
        finally:
            self.blockSignals(False)

    def is_pinned(self, conversation: str) -> bool:
        return conversation in self._pinned

    def _pinned_first(self, rows: list[tuple]) -> list[tuple]:
        return [r for r in rows if r[0] in self._pinned] + [r for r in rows if r[0] not in self._pinned]

    def _top_row(self, conversation: str) -> int:
        """Where a chat with new activity goes: the top of its part of the list (pinned or not)."""
        if conversation in self._pinned:
            return 0
        return sum(1 for i in range(self.count()) if self.item(i).data(ID_ROLE) in self._pinned
                   and self.item(i).data(ID_ROLE) != conversation)

    def set_filter(self, text: str) -> None:
        """Show only chats whose title contains ``text`` (any case); "" shows all."""
        self._filter = text.strip().casefold()
        for i in range(self.count()):
            item = self.item(i)
            title = str(item.data(Qt.ItemDataRole.DisplayRole) or "").casefold()
            item.setHidden(bool(self._filter) and self._filter not in title)
        self._regroup()
        self.viewport().update()

    def visible_ids(self) -> list[str]:
        return [self.item(i).data(ID_ROLE) for i in range(self.count()) if not self.item(i).isHidden()]

    def group_of(self, conversation: str) -> str | None:
        item = self.item_for(conversation)
        if item is None:
            return None
        return PINNED if item.data(PINNED_ROLE) else date_group(item.data(UPDATED_ROLE) or 0)

    def headers(self) -> list[tuple[str, str]]:
        """(group name, its first chat) for each header drawn, top to bottom."""
        return [(self.item(i).data(HEADER_ROLE), self.item(i).data(ID_ROLE)) for i in range(self.count())
                if self.item(i).data(HEADER_ROLE) and not self.item(i).isHidden()]

    def _regroup(self) -> None:
        """Mark the first visible chat of each group, whose header the delegate draws."""
        today, last = dt.date.today(), None
        for i in range(self.count()):
            item = self.item(i)
            if item.isHidden():
                header = None
            else:
                group = PINNED if item.data(PINNED_ROLE) else date_group(item.data(UPDATED_ROLE) or 0, today)
                header, last = (group if group != last else None), group
            if item.data(HEADER_ROLE) != header:
                item.setData(HEADER_ROLE, header)

    def mousePressEvent(self, event: QMouseEvent) -> None:  # noqa: N802 - Qt's name
        """A click on a group's header selects nothing."""
        item = self.itemAt(event.position().toPoint())
        if item is not None and item.data(HEADER_ROLE):
            top = self.visualItemRect(item).top()
            option = QStyleOptionViewItem()
            option.font = self.font()
            if event.position().y() < top + header_height(option):
                event.accept()
                return
        super().mousePressEvent(event)

    def paintEvent(self, event) -> None:  # noqa: N802 - Qt's name
        super().paintEvent(event)
        if self._filter and not self.visible_ids():
            painter = QPainter(self.viewport())
            painter.setPen(self.palette().color(QPalette.ColorGroup.Disabled, QPalette.ColorRole.Text))
            painter.drawText(self.viewport().rect().adjusted(12, 12, -12, -12),
                             Qt.AlignmentFlag.AlignHCenter | Qt.AlignmentFlag.AlignTop | Qt.TextFlag.TextWordWrap,
                             "No chat title contains this text.")


class ConversationFilter(QLineEdit):
    """Filters the list by title as one types; Esc clears it, Down moves to the list, Enter opens the first
    match."""

    def __init__(self, conversations: ConversationList, parent=None):
        super().__init__(parent)
        self.conversations = conversations
        self.setPlaceholderText("Filter chats")
        self.setAccessibleName("Filter conversations by title")
        self.setClearButtonEnabled(True)
        self.textChanged.connect(conversations.set_filter)

    def event(self, event: QEvent) -> bool:
        # Esc is the window's Stop shortcut: while there is text to clear, it is ours.
        if (event.type() == QEvent.Type.ShortcutOverride and isinstance(event, QKeyEvent)
                and event.key() == Qt.Key.Key_Escape and self.text()):
            event.accept()
            return True
        return super().event(event)

    def keyPressEvent(self, event: QKeyEvent) -> None:  # noqa: N802 - Qt's name
        key = event.key()
        if key == Qt.Key.Key_Escape and self.text():
            self.clear()
            return
        if key in (Qt.Key.Key_Down, Qt.Key.Key_Return, Qt.Key.Key_Enter):
            shown = self.conversations.visible_ids()
            if shown:
                current = self.conversations.currentItem()
                if current is None or current.isHidden() or key != Qt.Key.Key_Down:
                    self.conversations.setCurrentItem(self.conversations.item_for(shown[0]))
                self.conversations.setFocus()
            return
        super().keyPressEvent(event)
