"""The saved-conversation browser: search, filter, preview, open, and manage conversations and the
disk their saved context uses.

Search runs on every keystroke against SQLite FTS5 (``engine/search.py``: safe for any text, tens of
milliseconds at 200,000 messages). Checkpoint facts (status, tokens, size) come from the engine
thread: a quick header check of every saved context when the browser opens, a full check on
"Verify all". Deleting moves chats to the trash for a few seconds, with Undo; then they and their
saved context are deleted for good.
"""

from __future__ import annotations

import html
import logging

from PySide6.QtCore import QDate, QModelIndex, QPoint, QRectF, QSize, Qt, QTimer, Signal
from PySide6.QtGui import QAction, QKeySequence, QPalette, QTextDocument
from PySide6.QtWidgets import (
    QAbstractItemView,
    QApplication,
    QCheckBox,
    QComboBox,
    QDateEdit,
    QFileDialog,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QMenu,
    QMessageBox,
    QProgressBar,
    QProgressDialog,
    QProxyStyle,
    QPushButton,
    QSpinBox,
    QSplitter,
    QStyle,
    QStyledItemDelegate,
    QStyleOptionHeader,
    QTableView,
    QToolBar,
    QVBoxLayout,
    QWidget,
)

from app.browser_model import ID_ROLE, ConversationTableModel, column_widths
from app.context_status import ContextStatusRegistry
from app.elided_label import elide_title
from app.engine_worker import EngineHost
from app.import_worker import BundleConversations, ImportHost, PendingImport
from app.rename_dialog import RenameDialog
from app.text import display_safe, plural, reply_notes
from app.transcript import TranscriptView, copy_to_clipboard
from engine.api import (
    ConversationStore,
    bundle_signed_here,
    export_json,
    export_markdown,
    fts_query,
    search,
    snippet_html,
    to_document,
)
from engine.errors import ConversationError, HearthError
from engine.types import (
    BundleExported,
    BundleImported,
    CancelToken,
    ContextHealth,
    ContextReport,
    GcReport,
    StoreUsage,
)

log = logging.getLogger(__name__)
MAX_MATCHES = 200  # a search shows the newest matches; refine it to see others
MAX_LISTED = 1_000_000  # no words: every conversation
UNDO_SECONDS = 8
STATUSES = ("any", "valid", "stale", "damaged", "none")
NOTHING_SELECTED = "Select a conversation to preview it."


# The browser's actions: key, label, shortcut, (method, args). Row actions work on the selected rows.
ACTIONS = (
    ("open", "Open", "Return", ("open_selected",)),
    ("rename", "Rename…", "F2", ("rename_selected",)),
    ("duplicate", "Duplicate as branch", "Ctrl+D", ("duplicate_selected",)),
    ("delete", "Delete", "Delete", ("delete_selected",)),
    (None, "", "", ()),
    ("md", "Export Markdown…", "Ctrl+Shift+M", ("export_selected", (None, "md"))),
    ("json", "Export JSON…", "Ctrl+E", ("export_selected", (None, "json"))),
    ("bundle", "Export with context…", "Ctrl+Shift+E", ("export_bundle", (None,))),
    (None, "", "", ()),
    ("import", "Import JSON…", "Ctrl+I", ("import_file", (None,))),
    ("unbundle", "Import bundle…", "Ctrl+Shift+I", ("import_bundle", (None,))),
    (None, "", "", ()),
    ("drop", "Drop saved context", "Ctrl+Shift+Delete", ("drop_selected_context",)),
)
ROW_ACTIONS = ("open", "rename", "delete")
MENU_ACTIONS = ("open", "rename", "duplicate", None, "md", "json", "bundle", None, "drop", None, "delete")


def import_summary(result: BundleImported) -> str:
    """Which saved contexts an import used and which will be rebuilt, and why, in a sentence or two."""
    text = f"Saved context used for {plural(len(result.used), 'conversation')}" + (" (trusted by you)" if result.trusted
                                                                                      else "")
    if result.rebuilt:
        whys = sorted({result.notes.get(cid) or result.rebuilt[cid] for cid in result.rebuilt})
        text += f"; {len(result.rebuilt)} will be rebuilt when opened — " + "; ".join(whys)
    return text + "."


# The saved context no row shows, by kind of file, as the disk line names it
UNLISTED_KINDS = (("prefix", "shared system prompts"), ("api", "local server's prompt cache"),
                  ("orphan", "leftovers"))


def usage_text(usage: StoreUsage) -> str:
    """The disk line: the total against the budget and, apart, what no row shows (the local server's
    prompt cache, shared system prompts, leftovers), so the rows and the total agree."""
    text = f"Saved context: {usage.bytes / 2**20:,.1f} MiB of {usage.budget / 2**20:,.0f} MiB"
    apart = [(name, usage.by_kind.get(kind, 0)) for kind, name in UNLISTED_KINDS if usage.by_kind.get(kind, 0)]
    if apart:
        chats = usage.bytes - sum(n for _, n in apart)
        text += f" — chats {chats / 2**20:,.1f} MiB, " + ", ".join(f"{name} {n / 2**20:,.1f} MiB" for name, n in apart)
        text += " (not listed)"
    return text


def duplicates_count(n: int, total: int) -> str:
    """The start of the duplicates question: "The conversation in this file is", "All 3 conversations in
    this file are", "2 of the 5 conversations in this file are" (never "1 of the 1 conversation")."""
    verb = "is" if n == 1 else "are"
    if n == total:
        return f"The conversation in this file {verb}" if n == 1 else f"All {n:,} conversations in this file {verb}"
    return f"{n:,} of the {plural(total, 'conversation')} in this file {verb}"


class SortArrowStyle(QProxyStyle):
    """Header arrows that point the way the column runs: ▼ for descending (newest first), ▲ for ascending.
    QHeaderView asks for "SortUp" on a descending column, which Fusion draws as ▲: "Last activity" showed
    ▲ while the newest chats were on top."""

    _FLIP = {QStyleOptionHeader.SortIndicator.SortUp: QStyleOptionHeader.SortIndicator.SortDown,
             QStyleOptionHeader.SortIndicator.SortDown: QStyleOptionHeader.SortIndicator.SortUp}

    def drawPrimitive(self, element, option, painter, widget=None) -> None:  # noqa: N802 - Qt's name
        if element == QStyle.PrimitiveElement.PE_IndicatorHeaderArrow and isinstance(option, QStyleOptionHeader):
            option = QStyleOptionHeader(option)
            option.sortIndicator = self._FLIP.get(option.sortIndicator, option.sortIndicator)
        super().drawPrimitive(element, option, painter, widget)


class TitleDelegate(QStyledItemDelegate):
    """The Title cell, cut so that a copy's " (imported)" stays visible (``elide_title``)."""

    def initStyleOption(self, option, index: QModelIndex) -> None:  # noqa: N802 - Qt's name
        super().initStyleOption(option, index)
        style = option.widget.style() if option.widget is not None else QApplication.style()
        room = style.subElementRect(QStyle.SubElement.SE_ItemViewItemText, option, option.widget).width()
        option.text = elide_title(option.fontMetrics, option.text, room - 2)  # what the style would cut anyway


class HtmlDelegate(QStyledItemDelegate):
    """Paints a cell's text as rich text (the search snippet, matched words in bold)."""

    def paint(self, painter, option, index: QModelIndex) -> None:
        self.initStyleOption(option, index)
        html = option.text
        option.text = ""
        option.widget.style().drawControl(option.widget.style().ControlElement.CE_ItemViewItem, option, painter,
                                          option.widget)
        selected = bool(option.state & QStyle.StateFlag.State_Selected)
        color = option.palette.color(QPalette.ColorRole.HighlightedText if selected else QPalette.ColorRole.Text)
        doc = self._document(f'<span style="color: {color.name()}">{html}</span>', option)
        # One line, centred in the row like the plain cells beside it (the document's own margin made it
        # sit at the top and lose its descenders).
        top = max(0.0, (option.rect.height() - doc.size().height()) / 2)
        painter.save()
        painter.translate(option.rect.left(), option.rect.top() + top)
        painter.setClipRect(QRectF(0, -top, option.rect.width(), option.rect.height()))
        doc.drawContents(painter)
        painter.restore()

    @staticmethod
    def _document(html: str, option) -> QTextDocument:
        doc = QTextDocument()
        doc.setDocumentMargin(2)
        doc.setDefaultFont(option.font)
        doc.setHtml(html)
        return doc

    def sizeHint(self, option, index: QModelIndex) -> QSize:  # noqa: N802 - Qt's name
        self.initStyleOption(option, index)
        size = self._document(option.text, option).size()
        return QSize(int(size.width()), int(size.height()) + 4)


class BrowserWindow(QWidget):
    open_requested = Signal(str)
    conversations_changed = Signal()

    def __init__(self, store: ConversationStore, host: EngineHost, parent: QWidget | None = None,
                 contexts: ContextStatusRegistry | None = None):
        super().__init__(parent, Qt.WindowType.Window)
        self.store, self.host = store, host
        # The window's registry when it has one, so badge, Context column and preview agree.
        self.contexts = contexts if contexts is not None else ContextStatusRegistry(host.worker, self)
        self.setWindowTitle("Saved conversations — Hearth")
        self.setAccessibleName("Saved conversations")
        self.resize(1240, 740)  # every column and the preview fit; a 1280-px screen still holds it
        self.usage = StoreUsage(0, 0)
        self._trash: list[str] = []
        self._verify_cancel: CancelToken | None = None
        self._import_cancel: CancelToken | None = None
        self.import_progress: QProgressDialog | None = None
        self.importer = ImportHost(self)
        self.importer.worker.progress.connect(self._on_import_progress)
        self.importer.worker.finished.connect(self._on_imported)
        self.importer.worker.bundle_finished.connect(self._on_bundle_read)
        self.importer.worker.duplicates_found.connect(self._on_duplicates)
        self.duplicates_box: QMessageBox | None = None
        self._duplicates_choice: tuple[str, int] | None = None  # the last import's: policy, how many
        self._import_note = ""  # what the last import did with chats already here, for its result line
        self._bundle_trust: bool | None = None
        self._build()
        host.worker.checkpoint_report.connect(self._on_report)
        host.worker.checkpoint_progress.connect(self._on_verify_progress)
        host.worker.usage.connect(self._on_usage)
        host.worker.reclaimed.connect(self._on_reclaimed)
        host.worker.bundle_done.connect(self._on_bundle)
        self.contexts.changed.connect(self._on_contexts_changed)
        self.undo_timer = QTimer(self)  # when it fires, the deleted chats go for good
        self.undo_timer.setSingleShot(True)
        self.undo_timer.timeout.connect(self._purge_trash)
        self._summaries: dict[str, dict] = {}
        self.imported_ids: list[str] = []  # the last import's, for the status line and tests
        self.reload()
        self.check_contexts(full=False)

    def _escape(self) -> None:
        if self.query.hasFocus() and self.query.text():
            self.query.clear()
        else:
            self.close()

    # layout -----------------------------------------------------------------------------------------------
    def _build(self) -> None:
        outer = QVBoxLayout(self)
        outer.addWidget(self._build_toolbar())
        self.close_action = QAction("Close the browser", self)  # Ctrl+W, as any other window
        keys = [QKeySequence("Ctrl+W")]  # QKeySequence(StandardKey) is Ctrl+F4 here
        self.close_action.setShortcuts(keys + [k for k in QKeySequence.keyBindings(QKeySequence.StandardKey.Close)
                                               if k not in keys])
        self.close_action.setShortcutContext(Qt.ShortcutContext.WindowShortcut)
        self.close_action.triggered.connect(self.close)
        self.addAction(self.close_action)
        # Esc as in a browser's find bar: it empties a search being typed first, and closes only then.
        self.escape_action = QAction("Clear the search, or close the browser", self)
        self.escape_action.setShortcut(QKeySequence(Qt.Key.Key_Escape))
        self.escape_action.setShortcutContext(Qt.ShortcutContext.WindowShortcut)
        self.escape_action.triggered.connect(self._escape)
        self.addAction(self.escape_action)
        bar = QHBoxLayout()
        self.query = QLineEdit()
        self.query.setPlaceholderText('Search titles and messages — "a phrase", -exclude, prefix*')
        self.query.setAccessibleName("Search conversations")
        self.query.setClearButtonEnabled(True)
        self.query.textChanged.connect(lambda _: self.refresh())
        bar.addWidget(self.query, 3)
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
            d.dateChanged.connect(lambda _: self.refresh())
        self.use_dates.toggled.connect(lambda _: self.refresh())
        bar.addWidget(self.use_dates)
        bar.addWidget(self.date_from)
        bar.addWidget(QLabel("to"))
        bar.addWidget(self.date_to)
        self.model_filter = QComboBox()
        self.model_filter.setAccessibleName("Filter by model")
        self.model_filter.currentIndexChanged.connect(lambda _: self.refresh())
        bar.addWidget(self.model_filter)
        self.status_filter = QComboBox()
        self.status_filter.addItems([f"context: {s}" for s in STATUSES])
        self.status_filter.setAccessibleName("Filter by saved-context status")
        self.status_filter.currentIndexChanged.connect(lambda _: self.refresh())
        bar.addWidget(self.status_filter)
        outer.addLayout(bar)

        self.undo_bar = QWidget()
        ub = QHBoxLayout(self.undo_bar)
        ub.setContentsMargins(0, 0, 0, 0)
        self.undo_label = QLabel("")
        ub.addWidget(self.undo_label, 1)
        self.undo_button = QPushButton("Undo")
        self.undo_button.setAccessibleName("Undo the delete")
        self.undo_button.clicked.connect(self.undo_delete)
        ub.addWidget(self.undo_button)
        self.undo_bar.hide()
        outer.addWidget(self.undo_bar)

        split = QSplitter(Qt.Orientation.Horizontal)
        self.model = ConversationTableModel(self)
        self.proxy = self.model  # what the view shows, in display order (the model sorts itself)
        self.table = QTableView()
        self.table.setModel(self.model)
        # Newest activity first until the person clicks a header (sorting enabled with no indicator set
        # sorted by Title, descending).
        self.table.horizontalHeader().setSortIndicator(3, Qt.SortOrder.DescendingOrder)
        self.table.setSortingEnabled(True)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.ExtendedSelection)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setItemDelegateForColumn(0, TitleDelegate(self.table))
        self.table.setItemDelegateForColumn(1, HtmlDelegate(self.table))
        self.table.verticalHeader().hide()
        self.table.setWordWrap(False)
        self.table.setTextElideMode(Qt.TextElideMode.ElideRight)
        header = self.table.horizontalHeader()
        self._arrow_style = SortArrowStyle()  # kept: a widget does not own the style it is given
        self._arrow_style.setParent(self)
        header.setStyle(self._arrow_style)
        header.setStretchLastSection(False)
        header.setMinimumSectionSize(40)
        # Title and Match share what the fixed columns leave, so every column fits without scrolling.
        for column, width in column_widths(self.table.fontMetrics()).items():
            header.setSectionResizeMode(column, QHeaderView.ResizeMode.Interactive)
            header.resizeSection(column, width)
        for column in (0, 1):
            header.setSectionResizeMode(column, QHeaderView.ResizeMode.Stretch)
        self.table.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAsNeeded)
        self.table.setAccessibleName("Conversations found")
        self.table.selectionModel().selectionChanged.connect(lambda *_: self._show_preview())
        self.model.modelReset.connect(self._show_preview)  # a reset drops the selection without a signal
        self.table.doubleClicked.connect(lambda _: self.open_selected())
        self.table.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.table.customContextMenuRequested.connect(lambda pos: self.context_menu(pos).popup(
            self.table.viewport().mapToGlobal(pos)))
        for key in ROW_ACTIONS:  # Enter, F2, Delete act on the rows while the table has focus
            self.table.addAction(self.buttons[key])
        split.addWidget(self.table)
        right = QWidget()
        rv = QVBoxLayout(right)
        rv.setContentsMargins(0, 0, 0, 0)
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
        split.addWidget(right)
        split.setSizes([950, 290])
        split.setStretchFactor(0, 3)
        split.setStretchFactor(1, 1)
        outer.addWidget(split, 1)

        disk = QHBoxLayout()
        self.usage_label = QLabel("Saved context: …")
        self.usage_label.setWordWrap(True)  # the server's share makes it long: wrapped, never cut at 1,100 px
        self.usage_label.setAccessibleName("Disk used by saved context")
        self.usage_label.setToolTip("A chat's Size counts every saved context it keeps, for the model it uses and "
                                    "for others (the cell's tooltip says which); the rows add up to “chats”")
        disk.addWidget(self.usage_label, 1)
        disk.addWidget(QLabel("Budget (MiB):"))
        self.budget = QSpinBox()
        self.budget.setRange(64, 1 << 20)
        self.budget.setAccessibleName("Disk budget for saved context in MiB")
        disk.addWidget(self.budget)
        apply_budget = QPushButton("Apply")
        apply_budget.setAccessibleName("Apply the disk budget")
        apply_budget.clicked.connect(self.apply_budget)
        disk.addWidget(apply_budget)
        reclaim = QPushButton("&Reclaim space")
        reclaim.setAccessibleName("Reclaim space")
        reclaim.setToolTip("Delete leftovers and the saved context of deleted chats, then keep within the budget")
        reclaim.clicked.connect(self.reclaim)
        disk.addWidget(reclaim)
        self.verify_button = QPushButton("&Verify all")
        self.verify_button.setAccessibleName("Verify all saved contexts")
        self.verify_button.setToolTip("Check every checksum of every saved context")
        self.verify_button.clicked.connect(self.verify_all)
        disk.addWidget(self.verify_button)
        self.verify_bar = QProgressBar()
        self.verify_bar.setAccessibleName("Verification progress")
        self.verify_bar.hide()
        disk.addWidget(self.verify_bar)
        outer.addLayout(disk)
        # On its own line, wrapped: a long report is read whole at 1,100 px, and never widens the window.
        self.verify_result = QLabel("")
        self.verify_result.setTextFormat(Qt.TextFormat.PlainText)
        self.verify_result.setWordWrap(True)
        self.verify_result.setAccessibleName("Result of the last action")
        outer.addWidget(self.verify_result)

    def _build_toolbar(self) -> QToolBar:
        """The actions, once: on the toolbar, in the rows' context menu and on their shortcuts."""
        bar = QToolBar("Conversation actions")
        bar.setAccessibleName("Conversation actions")
        bar.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextOnly)
        self.toolbar = bar
        self.buttons: dict[str, QAction] = {}
        for key, label, shortcut, slot in ACTIONS:
            if key is None:
                bar.addSeparator()
                continue
            act = QAction(label, self)
            act.setShortcut(QKeySequence(shortcut))
            act.setToolTip(f"{label.rstrip('…')} ({QKeySequence(shortcut).toString(QKeySequence.SequenceFormat.NativeText)})")
            act.triggered.connect(getattr(self, slot[0]) if len(slot) == 1 else
                                  (lambda _=False, name=slot[0], arg=slot[1]: getattr(self, name)(*arg)))
            if key in ROW_ACTIONS:  # keys that mean something else in the search box act on the table only
                act.setShortcutContext(Qt.ShortcutContext.WidgetShortcut)
            else:
                act.setShortcutContext(Qt.ShortcutContext.WindowShortcut)
                self.addAction(act)
            bar.addAction(act)
            bar.widgetForAction(act).setAccessibleName(label.rstrip("…"))
            self.buttons[key] = act
        return bar

    def context_menu(self, pos: QPoint) -> QMenu:
        """The rows' right-click menu: the row under the pointer is selected first (unless it already is)."""
        index = self.table.indexAt(pos)
        if index.isValid() and not self.table.selectionModel().isRowSelected(index.row(), QModelIndex()):
            self.table.selectRow(index.row())
        menu = QMenu(self)
        menu.setObjectName("browserRowMenu")
        menu.setAccessibleName("Conversation actions")
        for key in MENU_ACTIONS:
            if key is None:
                menu.addSeparator()
            else:
                menu.addAction(self.buttons[key])
        return menu

    # listing ----------------------------------------------------------------------------------------------
    def reload(self) -> None:
        """Re-read the per-conversation facts (a grouped query: ~140 ms at 10,000 chats, so not per
        keystroke) and re-run the search. Called when chats change, here or in the main window."""
        self._summaries = {s["id"]: s for s in self.store.summaries()}
        self._refresh_models()
        self.refresh()

    def refresh(self) -> None:
        """Re-run the search with the current text and filters (cheap: on every keystroke)."""
        since = until = None
        if self.use_dates.isChecked():
            since = int(self.date_from.dateTime().toSecsSinceEpoch() * 1000)
            until = int(self.date_to.dateTime().addDays(1).toSecsSinceEpoch() * 1000)
        model = self.model_filter.currentData()
        text = self.query.text()
        limit = MAX_MATCHES if fts_query(text) else MAX_LISTED  # a listing is one indexed query
        try:
            hits = search(self.store, text, since_ms=since, until_ms=until, model=model, limit=limit)
        except ConversationError as exc:
            self.preview_title.setText(f"⚠ {exc}")
            hits = []
        status = STATUSES[self.status_filter.currentIndex()]
        if status != "any":
            hits = [h for h in hits if self._health(h.conversation) == status]
        rows = [{**s, "snippet": snippet_html(h.snippet), "checkpoint": self.contexts.status(h.conversation)}
                for h in hits if (s := self._summaries.get(h.conversation)) is not None]
        self.model.set_rows(rows)
        more = "+" if len(hits) == limit and limit == MAX_MATCHES else ""
        self.setWindowTitle(f"Saved conversations ({len(rows)}{more}) — Hearth")

    def _health(self, conversation: str) -> str:
        status = self.contexts.status(conversation)
        return status.health if status is not None else ContextHealth.NONE

    @property
    def checkpoints(self) -> dict:
        """Each conversation's last checked status (the shared registry's; read only here)."""
        return self.contexts.statuses

    def _on_contexts_changed(self, ids: set[str]) -> None:
        """The registry's news: with a status filter the listing may change; otherwise only cells do
        (no reset, so the selection and the preview stay)."""
        if STATUSES[self.status_filter.currentIndex()] != "any":
            self.refresh()
            return
        self.model.update_checkpoints(ids, self.contexts.status)
        current = self.selected_ids()
        if len(current) == 1 and current[0] in ids:
            self.preview_status.setText(self.contexts.describe(current[0]))

    def _refresh_models(self) -> None:
        current = self.model_filter.currentData()
        models = self.store.models()
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

    def selected_ids(self) -> list[str]:
        rows = {i.row() for i in self.table.selectionModel().selectedRows()}
        return [self.proxy.index(r, 0).data(ID_ROLE) for r in sorted(rows)]

    def ids_shown(self) -> list[str]:
        return [self.proxy.index(r, 0).data(ID_ROLE) for r in range(self.proxy.rowCount())]

    def _show_preview(self) -> None:
        """The one selected chat; otherwise a neutral line (never a chat that is gone or not selected)."""
        ids = self.selected_ids()
        self.preview.clear()
        self.preview_status.setText("")
        conv = self.store.get(ids[0]) if len(ids) == 1 else None
        if conv is None:
            self.preview_title.setText(f"{plural(len(ids), 'conversation')} selected" if len(ids) > 1 else "")
            self.preview.empty_hint.setText("Select one conversation to preview it." if len(ids) > 1
                                            else NOTHING_SELECTED)
            return
        self.preview_title.setText(f"<b>{html.escape(conv.title or 'New chat')}</b>")
        self.preview_status.setText(self.contexts.describe(conv.id))
        self.preview.empty_hint.setText("No messages yet.")
        try:  # the captions the chat pane shows under replies: why each ended, which model wrote it
            notes = reply_notes(self.store.reply_facts(conv.id))
        except ConversationError as exc:  # the replies show without them; the database's trouble shows elsewhere
            log.warning("could not read how the replies of %s ended: %s", conv.id, exc)
            notes = {}
        self.preview.load([(m.seq, m.role, m.content) for m in self.store.messages(conv.id)], notes)

    # actions ------------------------------------------------------------------------------------------------
    def open_selected(self) -> None:
        ids = self.selected_ids()
        if ids:
            self.open_requested.emit(ids[0])

    def rename_selected(self) -> RenameDialog | None:
        """The same rename dialog as the window's (wide, prefilled, refuses a blank title); not modal-blocking."""
        ids = self.selected_ids()
        if len(ids) != 1:
            return None
        conv = self.store.require(ids[0])
        dialog = RenameDialog(conv.title, self)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)

        def rename() -> None:
            if self.store.get(conv.id) is None:
                return  # deleted meanwhile: nothing to rename
            self.store.rename(conv.id, dialog.title())
            self._changed()

        dialog.accepted.connect(rename)
        dialog.open()
        return dialog

    def delete_selected(self) -> None:
        """Move the selected chats to the trash; they are deleted for good unless Undo comes in time."""
        ids = self.selected_ids()
        if not ids:
            return
        self._purge_trash()  # an earlier delete's undo window closes now
        self.store.trash(ids)
        self._trash = ids
        self.undo_label.setText(f"Deleted {plural(len(ids), 'chat')}.")
        self.undo_bar.show()
        self.undo_timer.start(UNDO_SECONDS * 1000)
        self._changed()

    def undo_delete(self) -> None:
        self.undo_timer.stop()
        if self._trash:
            self.store.untrash(self._trash)
            self._trash = []
            self._changed()
        self.undo_bar.hide()

    def _purge_trash(self) -> None:
        self.undo_timer.stop()
        ids, self._trash = self._trash, []
        self.undo_bar.hide()
        if ids:
            self.store.purge(ids)
            for cid in ids:
                self.host.request_forget.emit(cid)

    def duplicate_selected(self) -> None:
        ids = self.selected_ids()
        if len(ids) != 1:
            return
        branch = self.store.duplicate(ids[0])
        self.host.request_copy_context.emit(ids[0], branch.id)
        self._changed()

    def drop_selected_context(self) -> None:
        ids = self.selected_ids()
        if ids:
            self.host.request_drop_context.emit(ids)
            self.contexts.mark_dropped(ids)

    def export_selected(self, path: str | None, kind: str) -> int:
        ids = self.selected_ids() or self.ids_shown()
        if not ids:
            return 0
        if path is None:
            suffix = "md" if kind == "md" else "json"
            path, _ = QFileDialog.getSaveFileName(self, "Export conversations", f"conversations.{suffix}",
                                                  f"{suffix.upper()} (*.{suffix})")
            if not path:
                return 0
        try:
            n = (export_markdown if kind == "md" else export_json)(self.store, ids, path)
        except OSError as exc:
            self._warn(f"The export could not be written: {exc.strerror or exc}")
            return 0
        self.verify_result.setText(f"Exported {plural(n, 'conversation')}.")
        return n

    def import_file(self, path: str | None, duplicates: str = "") -> bool:
        """Start importing a JSON export on the import thread, with a progress dialog and Cancel; the
        result (or the reason nothing was imported) arrives in ``_on_imported``. Conversations already
        here are skipped or copied as ``duplicates`` says ("skip", "copy"), or "" asks the person
        (``duplicates_question``). False if not started."""
        if path is None:
            path, _ = QFileDialog.getOpenFileName(self, "Import conversations", "", "Hearth export (*.json)")
            if not path:
                return False
        if not self._start_import_dialog("Importing conversations — Hearth"):
            return False
        self._duplicates_choice = None
        self.importer.start(self.store.path, str(path), self._import_cancel, duplicates)
        return True

    def duplicates_question(self, pending: PendingImport) -> QMessageBox:
        """Skip the conversations already here, or import them as copies marked "(imported)"."""
        n, total = len(pending.duplicates), len(pending.conversations)
        names = ", ".join(f"“{t}”" for t in pending.titles[:3]) + (f" and {n - 3} more" if n > 3 else "")
        box = QMessageBox(QMessageBox.Icon.Question, "Conversations already here",
                          f"{duplicates_count(n, total)} already here (same id or same messages): {names}.\n\n"
                          "Skip them, or import them as copies titled “… (imported)” so you can tell them apart?",
                          QMessageBox.StandardButton.NoButton, self)
        box.setObjectName("importDuplicates")
        box.setAccessibleName("Conversations already here")
        skip = box.addButton("Skip them", QMessageBox.ButtonRole.AcceptRole)
        skip.setObjectName("skip")
        copy = box.addButton("Import as copies", QMessageBox.ButtonRole.YesRole)
        copy.setObjectName("copy")
        cancel = box.addButton("Cancel import", QMessageBox.ButtonRole.RejectRole)
        cancel.setObjectName("cancel")
        box.setDefaultButton(skip)
        box.setEscapeButton(cancel)
        return box

    def _on_duplicates(self, pending: PendingImport) -> None:
        """The import thread read the file and found conversations already here: ask, then store."""
        if self._import_cancel is None or self._import_cancel.cancelled:
            self._on_imported(HearthError("the import was cancelled"))
            return
        if self.import_progress is not None:
            self.import_progress.hide()
        box = self.duplicates_box = self.duplicates_question(pending)

        def answered() -> None:
            self.duplicates_box = None
            choice = box.clickedButton().objectName() if box.clickedButton() is not None else "cancel"
            box.deleteLater()
            token = self._import_cancel
            if choice not in ("skip", "copy") or token is None:
                self._import_cancel = None
                self._on_imported([])  # closes the progress dialog
                self.verify_result.setText("Nothing was imported.")
                return
            self._duplicates_choice = (choice, len(pending.duplicates))
            if self.import_progress is not None:
                self.import_progress.show()
            self.importer.store_pending(self.store.path, pending, choice, token)

        box.finished.connect(answered)
        box.open()  # window-modal, not blocking the event loop

    def _start_import_dialog(self, title: str) -> bool:
        """The progress dialog with Cancel an import shows; False when one is already running."""
        if self._import_cancel is not None:
            self._warn("An import is already running; wait for it or cancel it first.")
            return False
        self._import_cancel = token = CancelToken()
        dialog = QProgressDialog("Reading the file…", "Cancel", 0, 0, self)
        dialog.setObjectName("importProgress")
        dialog.setWindowTitle(title)
        dialog.setWindowModality(Qt.WindowModality.WindowModal)
        dialog.setMinimumDuration(0)
        dialog.setAutoClose(False)
        dialog.setAutoReset(False)
        dialog.canceled.disconnect()  # by default Cancel hides the dialog at once; it stays until the rollback ends
        dialog.canceled.connect(lambda: self._cancel_import(token))
        dialog.show()
        self.import_progress = dialog
        self.buttons["import"].setEnabled(False)
        return True

    def _cancel_import(self, token: CancelToken) -> None:
        token.cancel()
        if self.import_progress is not None:
            self.import_progress.setLabelText("Cancelling: removing what was imported so far…")
            self.import_progress.setCancelButton(None)

    def _on_import_progress(self, done: int, total: int) -> None:
        dialog = self.import_progress
        if dialog is None or self._import_cancel is None or self._import_cancel.cancelled:
            return
        dialog.setMaximum(max(1, total))
        dialog.setValue(done)
        dialog.setLabelText(f"Imported {done:,} of {plural(total, 'conversation')}…")

    def _on_imported(self, result: list[str] | HearthError) -> None:
        self._import_cancel = None
        self.buttons["import"].setEnabled(True)
        if self.import_progress is not None:
            self.import_progress.close()
            self.import_progress.deleteLater()
            self.import_progress = None
        if isinstance(result, HearthError):  # TransferError and the rest: nothing was imported, says why
            self._warn(f"Nothing was imported: {result}")
            return
        n = len(result)
        self._import_note = ""
        if self._duplicates_choice is not None:
            choice, dup = self._duplicates_choice
            self._import_note = (f"; skipped {dup:,} already here" if choice == "skip"
                                 else f", {dup:,} of them as copies marked “(imported)”")
        self.verify_result.setText(f"Imported {plural(n, 'conversation')}{self._import_note}.")
        self.imported_ids = result
        self._changed()
        if result:
            self.check_contexts(full=False, ids=result)  # their Tokens and Context cells, without Verify all

    def export_bundle(self, path: str | None) -> bool:
        """Conversations and their saved context in one portable file (written on the engine thread)."""
        ids = self.selected_ids() or self.ids_shown()
        if not ids:
            return False
        if path is None:
            path, _ = QFileDialog.getSaveFileName(self, "Export with saved context", "conversations.hearth",
                                                  "Hearth bundle (*.hearth)")
            if not path:
                return False
        self.verify_result.setText("Writing the bundle…")
        self.host.request_export_bundle.emit(path, to_document(self.store, ids), ids)
        return True

    def import_bundle(self, path: str | None, trust: bool | None = None, duplicates: str = "") -> bool:
        """Import a bundle: its conversations on the import thread (validated, in batches, all or nothing,
        with progress and Cancel, as a JSON import), then their saved contexts on the engine thread, each
        used only if this installation signed it (or ``trust``) and it verifies against this model.
        ``trust`` None: ask, when the bundle has context this installation did not sign. Chats already
        here: ``duplicates`` as for ``import_file``. The result lands in ``_on_bundle_read``; False if not
        started."""
        if path is None:
            path, _ = QFileDialog.getOpenFileName(self, "Import a bundle", "", "Hearth bundle (*.hearth)")
            if not path:
                return False
        if not self._start_import_dialog("Importing a bundle — Hearth"):
            return False
        self._bundle_trust = trust
        self._duplicates_choice = None
        self.importer.start_bundle(self.store.path, str(path), self._import_cancel, duplicates)
        return True

    def _on_bundle_read(self, result: BundleConversations | HearthError) -> None:
        if isinstance(result, HearthError):
            self._on_imported(result)
            return
        self._on_imported(result.ids)  # stored: the progress dialog goes, the list shows them
        if not result.ids:
            return  # all skipped: no context to install, and the line says so
        trust = self._bundle_trust
        if trust is None:
            trust = bool(result.entries) and not bundle_signed_here(result.path, self.host.config.paths) \
                and self.ask_trust()
        owners = {c["id"]: new for c, new in zip(result.conversations, result.ids, strict=True) if c["id"]}
        n = len(result.ids)
        self.verify_result.setText(f"Imported {plural(n, 'conversation')}{self._import_note}; "
                                   "checking their saved context…")
        self.host.request_import_bundle.emit(result.path, result.entries, owners, bool(trust))

    def trust_question(self) -> QMessageBox:
        """The plain warning before using saved context that another installation made."""
        box = QMessageBox(QMessageBox.Icon.Warning, "Use this bundle's saved context?",
                          "This bundle's saved context was not made by this Hearth.\n\n"
                          "Saved context is what the model remembers of a chat. It cannot be checked against the "
                          "chat's text: a forged one can make the model answer from a different conversation than "
                          "the one you see.\n\nUse it only if you trust whoever made this file. Otherwise Hearth "
                          "rebuilds it from the chat's text when you open the chat (slower, always safe).",
                          QMessageBox.StandardButton.NoButton, self)
        box.setObjectName("bundleTrust")
        box.addButton("Rebuild (safe)", QMessageBox.ButtonRole.RejectRole)
        box.setDefaultButton(box.buttons()[0])
        box.addButton("Trust and use it", QMessageBox.ButtonRole.AcceptRole)
        return box

    def ask_trust(self) -> bool:
        box = self.trust_question()
        box.exec()
        return box.buttonRole(box.clickedButton()) == QMessageBox.ButtonRole.AcceptRole

    def _on_bundle(self, result: BundleExported | BundleImported | HearthError) -> None:
        if isinstance(result, HearthError):
            self._warn(str(result))
        elif isinstance(result, BundleExported):
            self.verify_result.setText(f"Exported {plural(result.conversations, 'conversation')} with "
                                       f"{plural(result.contexts, 'saved context')}.")
        else:
            self.verify_result.setText(import_summary(result) + self._duplicates_sentence())
            self.check_contexts(full=False)

    def _duplicates_sentence(self) -> str:
        """After a bundle's contexts: what its import did with chats already here, as a sentence."""
        if self._duplicates_choice is None:
            return ""
        choice, n = self._duplicates_choice
        return (f" Skipped {n:,} already here." if choice == "skip"
                else f" {n:,} imported as copies marked “(imported)”.")

    def _warn(self, message: str) -> None:
        box = QMessageBox(QMessageBox.Icon.Warning, "Hearth", message, QMessageBox.StandardButton.Ok, self)
        box.setObjectName("browserWarning")
        box.open()  # window-modal, not blocking the event loop

    def _changed(self) -> None:
        self.reload()
        self.conversations_changed.emit()
        # The set of chats changed here: the engine says again which have saved or live context, so
        # the sidebar's badges and token counts are re-read rather than lost.
        self.host.request_states.emit()

    # saved context --------------------------------------------------------------------------------------------
    def check_contexts(self, full: bool, ids: list[str] | None = None) -> None:
        """Check saved contexts on the engine thread (headers, or every checksum when ``full``): of
        ``ids``, or of every conversation."""
        ids = list(self._summaries) if ids is None else list(ids)
        token = CancelToken()
        if full:
            self._verify_cancel = token
            self.verify_bar.setRange(0, max(1, len(ids)))
            self.verify_bar.setValue(0)
            self.verify_bar.show()
            self.verify_result.setText("Verifying…")
        self.host.request_inspect.emit(ids, full, token)

    def verify_all(self) -> None:
        self.check_contexts(full=True)

    def _on_verify_progress(self, done: int, total: int) -> None:
        self.verify_bar.setRange(0, total)
        self.verify_bar.setValue(done)

    def _on_report(self, report: ContextReport) -> None:
        self._on_usage(StoreUsage(report.bytes, report.budget, report.by_kind))
        if report.full:
            self.verify_bar.hide()
            found = [status.health for status in report.items.values()]
            damaged = found.count(ContextHealth.DAMAGED)
            self.verify_result.setText(
                f"Checked {len(found):,}: {found.count(ContextHealth.VALID)} valid, {found.count(ContextHealth.STALE)} "
                f"stale, {damaged} damaged, {found.count(ContextHealth.NONE)} without saved context"
                + (" — damaged ones are rebuilt when opened." if damaged else "."))

    def _on_usage(self, usage: StoreUsage) -> None:
        self.usage = usage
        self.usage_label.setText(usage_text(usage))
        if not self.budget.hasFocus():
            self.budget.setValue(min(self.budget.maximum(), usage.budget >> 20))

    def _on_reclaimed(self, report: GcReport) -> None:
        removed = report.temp_files + len(report.orphans) + len(report.evicted)
        self.verify_result.setText(f"Reclaimed space: removed {plural(removed, 'saved-context file')}.")

    def apply_budget(self) -> None:
        self.host.request_set_budget.emit(self.budget.value() << 20)

    def reclaim(self) -> None:
        self.host.request_reclaim.emit(sorted(self.store.ids()))

    def showEvent(self, event) -> None:  # noqa: N802 - Qt's name
        super().showEvent(event)
        self.reload()  # chats may have changed in the main window while this was hidden

    def closeEvent(self, event) -> None:  # noqa: N802 - Qt's name
        self._purge_trash()
        if self.duplicates_box is not None:  # an unanswered question imports nothing
            self.duplicates_box.reject()
        if self._import_cancel is not None:  # closing cancels a running import (it removes what it added)
            self._cancel_import(self._import_cancel)
        super().closeEvent(event)

    def shutdown(self) -> None:
        """End the import thread (a running import is cancelled and rolled back first)."""
        if self._import_cancel is not None:
            self._import_cancel.cancel()
        self.importer.stop()
