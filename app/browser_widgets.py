"""The browser's parts, each a small widget that renders what it is given and says what the person did:
the search bar and its filters, the undo bar, the preview of the selected chat, and the saved-context row
(disk used, budget, Reclaim, Verify all). ``BrowserWindow`` (app/browser.py) puts them together.
"""

from __future__ import annotations

import html

from PySide6.QtCore import QDate, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDateEdit,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QProgressBar,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.browser_listing import STATUSES, ListingQuery, Preview
from app.text import display_safe, plural
from app.transcript import TranscriptView, copy_to_clipboard
from engine.types import StoreUsage

NOTHING_SELECTED = "Select a conversation to preview it."


# The saved context no row shows, by kind of file, as the disk line names it
UNLISTED_KINDS = (("prefix", "shared system prompts"), ("api", "local server's prompt cache"),
                  ("orphan", "leftovers"))


def usage_text(usage: StoreUsage) -> str:
    """The disk line: the total against the budget and, apart, what no row shows (the local server's
    prompt cache, shared system prompts, leftovers), so the rows and the total agree."""
    text = f"Saved context: {usage.bytes / 2**20:,.1f} MiB of {usage.budget / 2**20:,.0f} MiB"
    if usage.shared:  # blocks several chats start with, stored once (each row counts its share)
        text += f" ({usage.shared / 2**20:,.1f} MiB of it shared by several chats, stored once)"
    apart = [(name, usage.by_kind.get(kind, 0)) for kind, name in UNLISTED_KINDS if usage.by_kind.get(kind, 0)]
    if apart:
        chats = usage.bytes - sum(n for _, n in apart)
        text += f" — chats {chats / 2**20:,.1f} MiB, " + ", ".join(f"{name} {n / 2**20:,.1f} MiB" for name, n in apart)
        text += " (not listed)"
    return text


def _bare(layout: QHBoxLayout | QVBoxLayout) -> QHBoxLayout | QVBoxLayout:
    """A part's layout without margins of its own: it lines up as the window's own rows did."""
    layout.setContentsMargins(0, 0, 0, 0)
    return layout


class SearchBar(QWidget):
    """The search text and the date, model and saved-context filters; ``changed`` on any edit."""

    changed = Signal()

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        bar = _bare(QHBoxLayout(self))
        self.query = QLineEdit()
        self.query.setPlaceholderText('Search titles and messages — "a phrase", -exclude, prefix*')
        self.query.setAccessibleName("Search conversations")
        self.query.setClearButtonEnabled(True)
        self.query.textChanged.connect(lambda _: self.changed.emit())
        bar.addWidget(self.query, 3)
        self._build_dates(bar)
        self.model_filter = QComboBox()
        self.model_filter.setAccessibleName("Filter by model")
        self.model_filter.currentIndexChanged.connect(lambda _: self.changed.emit())
        bar.addWidget(self.model_filter)
        self.status_filter = QComboBox()
        self.status_filter.addItems([f"context: {s}" for s in STATUSES])
        self.status_filter.setAccessibleName("Filter by saved-context status")
        self.status_filter.currentIndexChanged.connect(lambda _: self.changed.emit())
        bar.addWidget(self.status_filter)

    def _build_dates(self, bar: QHBoxLayout) -> None:
        self.use_dates = QCheckBox("From")
        self.use_dates.setAccessibleName("Filter by date")
        self.date_from, self.date_to = QDateEdit(), QDateEdit()
        for d, name in ((self.date_from, "From date"), (self.date_to, "To date")):
            d.setCalendarPopup(True)
            d.setDisplayFormat("yyyy-MM-dd")
            d.setAccessibleName(name)
        self.date_from.setDate(QDate.currentDate().addMonths(-1))
        self.date_to.setDate(QDate.currentDate())
        for d in (self.date_from, self.date_to):
            d.dateChanged.connect(lambda _: self.changed.emit())
        self.use_dates.toggled.connect(lambda _: self.changed.emit())
        bar.addWidget(self.use_dates)
        bar.addWidget(self.date_from)
        bar.addWidget(QLabel("to"))
        bar.addWidget(self.date_to)

    def status(self) -> str:
        return STATUSES[self.status_filter.currentIndex()]

    def listing_query(self) -> ListingQuery:
        since = until = None
        if self.use_dates.isChecked():
            since = int(self.date_from.dateTime().toSecsSinceEpoch() * 1000)
            until = int(self.date_to.dateTime().addDays(1).toSecsSinceEpoch() * 1000)
        return ListingQuery(self.query.text(), since, until, self.model_filter.currentData(), self.status())

    def set_models(self, models: list[str]) -> None:
        """The model filter's choices (the one chosen stays chosen while it is there); no ``changed``."""
        current = self.model_filter.currentData()
        if [self.model_filter.itemData(i) for i in range(1, self.model_filter.count())] == models:
            return
        self.model_filter.blockSignals(True)
        self.model_filter.clear()
        self.model_filter.addItem("any model", None)
        for m in models:
            self.model_filter.addItem(display_safe(m), m)
        index = self.model_filter.findData(current)
        self.model_filter.setCurrentIndex(max(0, index))
        self.model_filter.blockSignals(False)


class UndoBar(QWidget):
    """"Deleted 3 chats." and Undo, while the delete can still be undone."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        ub = _bare(QHBoxLayout(self))
        self.undo_label = QLabel("")
        ub.addWidget(self.undo_label, 1)
        self.undo_button = QPushButton("Undo")
        self.undo_button.setAccessibleName("Undo the delete")
        ub.addWidget(self.undo_button)
        self.hide()

    def deleted(self, count: int) -> None:
        self.undo_label.setText(f"Deleted {plural(count, 'chat')}.")
        self.show()


class PreviewPanel(QWidget):
    """The one selected chat, read only; otherwise a neutral line (never a chat that is gone or not selected)."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        rv = _bare(QVBoxLayout(self))
        self.preview_title = QLabel("")
        self.preview_title.setWordWrap(True)
        self.preview_title.setAccessibleName("Selected conversation")
        rv.addWidget(self.preview_title)
        self.preview_status = QLabel("")
        self.preview_status.setWordWrap(True)
        self.preview_status.setAccessibleName("Saved context of the selected conversation")
        rv.addWidget(self.preview_status)
        self.preview = TranscriptView(read_only=True)
        self.preview.empty_hint.setText(NOTHING_SELECTED)
        self.preview.setAccessibleName("Preview of the selected conversation")
        self.preview.copy_requested.connect(copy_to_clipboard)
        rv.addWidget(self.preview, 1)

    def show_chat(self, preview: Preview | None, selected: int) -> None:
        """``preview``: the selected chat's, or None (``selected`` chats, not one, or one that is gone)."""
        self.preview.clear()
        self.preview_status.setText("")
        if preview is None:
            self.preview_title.setText(f"{plural(selected, 'conversation')} selected" if selected > 1 else "")
            self.preview.empty_hint.setText("Select one conversation to preview it." if selected > 1
                                            else NOTHING_SELECTED)
            return
        self.preview_title.setText(f"<b>{html.escape(preview.conversation.title or 'New chat')}</b>")
        self.preview_status.setText(preview.context)
        self.preview.empty_hint.setText("No messages yet.")
        self.preview.load(preview.messages, preview.notes, preview.files, preview.agents)


class DiskBar(QWidget):
    """Disk used by saved context, the budget and Apply, Reclaim space, Verify all and its progress."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        disk = _bare(QHBoxLayout(self))
        self.usage_label = QLabel("Saved context: …")
        self.usage_label.setWordWrap(True)  # the server's share makes it long: wrapped, never cut at 1,100 px
        self.usage_label.setAccessibleName("Disk used by saved context")
        self.usage_label.setToolTip("A chat's Size counts every saved context it keeps, for the model it uses and "
                                    "for others (the cell's tooltip says which); context several chats share is "
                                    "stored once and each counts its share, so the rows add up to “chats”")
        disk.addWidget(self.usage_label, 1)
        disk.addWidget(QLabel("Budget (MiB):"))
        self.budget = QSpinBox()
        self.budget.setRange(64, 1 << 20)
        self.budget.setAccessibleName("Disk budget for saved context in MiB")
        disk.addWidget(self.budget)
        self.apply_budget = QPushButton("Apply")
        self.apply_budget.setAccessibleName("Apply the disk budget")
        disk.addWidget(self.apply_budget)
        self.reclaim = QPushButton("&Reclaim space")
        self.reclaim.setAccessibleName("Reclaim space")
        self.reclaim.setToolTip("Delete leftovers and the saved context of deleted chats, then keep within the budget")
        disk.addWidget(self.reclaim)
        self.verify_button = QPushButton("&Verify all")
        self.verify_button.setAccessibleName("Verify all saved contexts")
        self.verify_button.setToolTip("Check every checksum of every saved context")
        disk.addWidget(self.verify_button)
        self.verify_bar = QProgressBar()
        self.verify_bar.setAccessibleName("Verification progress")
        self.verify_bar.hide()
        disk.addWidget(self.verify_bar)

    def show_usage(self, usage: StoreUsage) -> None:
        self.usage_label.setText(usage_text(usage))
        if not self.budget.hasFocus():
            self.budget.setValue(min(self.budget.maximum(), usage.budget >> 20))
