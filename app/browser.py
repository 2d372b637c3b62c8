"""The saved-conversation browser: search, filter, preview, open, and manage conversations and the
disk their saved context uses.

Search runs on every keystroke against SQLite FTS5 (``engine/search.py``: safe for any text, tens of
milliseconds at 200,000 messages). Checkpoint facts (status, tokens, size) come from the engine
thread: a quick header check of every saved context when the browser opens, a full check on
"Verify all". Deleting moves chats to the trash for a few seconds, with Undo; then they and their
saved context are deleted for good.
"""

from __future__ import annotations

import logging

from PySide6.QtCore import QModelIndex, QPoint, QRectF, QSize, Qt, QTimer, Signal
from PySide6.QtGui import QAction, QKeySequence, QPalette, QTextDocument
from PySide6.QtWidgets import (
    QAbstractItemView,
    QApplication,
    QHeaderView,
    QLabel,
    QMenu,
    QMessageBox,
    QProxyStyle,
    QSplitter,
    QStyle,
    QStyledItemDelegate,
    QStyleOptionHeader,
    QTableView,
    QToolBar,
    QVBoxLayout,
    QWidget,
)

from app.browser_listing import BrowserListing
from app.browser_model import ID_ROLE, ConversationTableModel, column_widths
from app.browser_transfers import TransferFlow
from app.browser_widgets import DiskBar, PreviewPanel, SearchBar, UndoBar
from app.context_status import ContextStatusRegistry
from app.elided_label import elide_title
from app.engine_worker import EngineHost
from app.rename_dialog import RenameDialog
from app.text import plural
from engine.api import (
    ConversationStore,
)
from engine.types import (
    CancelToken,
    ContextHealth,
    ContextReport,
    GcReport,
    StoreUsage,
)

log = logging.getLogger(__name__)
UNDO_SECONDS = 8


# The browser's actions: key, label, shortcut, (method, args); "transfers.…": the TransferFlow's.
# Row actions work on the selected rows.
ACTIONS = (
    ("open", "Open", "Return", ("open_selected",)),
    ("rename", "Rename…", "F2", ("rename_selected",)),
    ("duplicate", "Duplicate as branch", "Ctrl+D", ("duplicate_selected",)),
    ("documents", "New chat with these documents", "Ctrl+Shift+D", ("documents_selected",)),
    ("delete", "Delete", "Delete", ("delete_selected",)),
    (None, "", "", ()),
    ("md", "Export Markdown…", "Ctrl+Shift+M", ("transfers.export_selected", (None, "md"))),
    ("json", "Export JSON…", "Ctrl+E", ("transfers.export_selected", (None, "json"))),
    ("bundle", "Export with context…", "Ctrl+Shift+E", ("transfers.export_bundle", (None,))),
    (None, "", "", ()),
    ("import", "Import JSON…", "Ctrl+I", ("transfers.import_file", (None,))),
    ("unbundle", "Import bundle…", "Ctrl+Shift+I", ("transfers.import_bundle", (None,))),
    (None, "", "", ()),
    ("drop", "Drop saved context", "Ctrl+Shift+Delete", ("drop_selected_context",)),
)
ROW_ACTIONS = ("open", "rename", "delete")
TOOLBAR_TEXT = {"documents": "New chat with files"}  # shorter on the toolbar, so every action fits on it
MENU_ACTIONS = ("open", "rename", "duplicate", "documents", None, "md", "json", "bundle", None, "drop", None, "delete")


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
    """Renders ``BrowserListing`` (app/browser_listing.py: the search, its rows, the preview) in its parts
    (app/browser_widgets.py) and forwards what the person does to the store and the engine thread."""

    open_requested = Signal(str)
    conversations_changed = Signal()
    documents_requested = Signal(str)  # a new chat in the window whose message box holds this chat's files

    def __init__(self, store: ConversationStore, host: EngineHost, parent: QWidget | None = None,
                 contexts: ContextStatusRegistry | None = None):
        super().__init__(parent, Qt.WindowType.Window)
        self.store, self.host = store, host
        # The window's registry when it has one, so badge, Context column and preview agree.
        self.contexts = contexts if contexts is not None else ContextStatusRegistry(host.worker, self)
        self.listing = BrowserListing(store, self.contexts)
        self.setWindowTitle("Saved conversations — Hearth")
        self.setAccessibleName("Saved conversations")
        self.resize(1240, 740)  # every column and the preview fit; a 1280-px screen still holds it
        self.usage = StoreUsage(0, 0)
        self._trash: list[str] = []
        self._verify_cancel: CancelToken | None = None
        self.transfers = TransferFlow(self)  # exports and imports (app/browser_transfers.py)
        self._build()
        host.worker.checkpoint_report.connect(self._on_report)
        host.worker.checkpoint_progress.connect(self._on_verify_progress)
        host.worker.usage.connect(self._on_usage)
        host.worker.reclaimed.connect(self._on_reclaimed)
        self.contexts.changed.connect(self._on_contexts_changed)
        self.undo_timer = QTimer(self)  # when it fires, the deleted chats go for good
        self.undo_timer.setSingleShot(True)
        self.undo_timer.timeout.connect(self._purge_trash)
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
        self._build_window_keys()
        self.search_bar = SearchBar()
        self.search_bar.changed.connect(self.refresh)
        outer.addWidget(self.search_bar)
        self.undo = UndoBar()
        self.undo.undo_button.clicked.connect(self.undo_delete)
        outer.addWidget(self.undo)
        split = QSplitter(Qt.Orientation.Horizontal)
        split.addWidget(self._build_table())
        self.preview_panel = PreviewPanel()
        split.addWidget(self.preview_panel)
        split.setSizes([950, 290])
        split.setStretchFactor(0, 3)
        split.setStretchFactor(1, 1)
        outer.addWidget(split, 1)
        self.disk = DiskBar()
        self.disk.apply_budget.clicked.connect(self.apply_budget)
        self.disk.reclaim.clicked.connect(self.reclaim)
        self.disk.verify_button.clicked.connect(self.verify_all)
        outer.addWidget(self.disk)
        # On its own line, wrapped: a long report is read whole at 1,100 px, and never widens the window.
        self.verify_result = QLabel("")
        self.verify_result.setTextFormat(Qt.TextFormat.PlainText)
        self.verify_result.setWordWrap(True)
        self.verify_result.setAccessibleName("Result of the last action")
        outer.addWidget(self.verify_result)
        # The parts' widgets, by the names the browser has always had (tests and tools use them).
        sb, pp, d = self.search_bar, self.preview_panel, self.disk
        self.query, self.use_dates, self.date_from, self.date_to = sb.query, sb.use_dates, sb.date_from, sb.date_to
        self.model_filter, self.status_filter = sb.model_filter, sb.status_filter
        self.undo_bar, self.undo_label, self.undo_button = self.undo, self.undo.undo_label, self.undo.undo_button
        self.preview_title, self.preview_status, self.preview = pp.preview_title, pp.preview_status, pp.preview
        self.usage_label, self.budget, self.verify_button, self.verify_bar = (d.usage_label, d.budget,
                                                                              d.verify_button, d.verify_bar)

    def _build_window_keys(self) -> None:
        """Ctrl+W closes, as any other window; Esc empties a search being typed first, as a browser's find bar."""
        self.close_action = QAction("Close the browser", self)
        keys = [QKeySequence("Ctrl+W")]  # QKeySequence(StandardKey) is Ctrl+F4 here
        self.close_action.setShortcuts(keys + [k for k in QKeySequence.keyBindings(QKeySequence.StandardKey.Close)
                                               if k not in keys])
        self.close_action.setShortcutContext(Qt.ShortcutContext.WindowShortcut)
        self.close_action.triggered.connect(self.close)
        self.addAction(self.close_action)
        self.escape_action = QAction("Clear the search, or close the browser", self)
        self.escape_action.setShortcut(QKeySequence(Qt.Key.Key_Escape))
        self.escape_action.setShortcutContext(Qt.ShortcutContext.WindowShortcut)
        self.escape_action.triggered.connect(self._escape)
        self.addAction(self.escape_action)

    def _build_table(self) -> QTableView:
        self.model = ConversationTableModel(self)
        self.proxy = self.model  # what the view shows, in display order (the model sorts itself)
        table = self.table = QTableView()
        table.setModel(self.model)
        # Newest activity first until the person clicks a header (sorting enabled with no indicator set
        # sorted by Title, descending).
        table.horizontalHeader().setSortIndicator(3, Qt.SortOrder.DescendingOrder)
        table.setSortingEnabled(True)
        table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        table.setSelectionMode(QAbstractItemView.SelectionMode.ExtendedSelection)
        table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        table.setItemDelegateForColumn(0, TitleDelegate(table))
        table.setItemDelegateForColumn(1, HtmlDelegate(table))
        table.verticalHeader().hide()
        table.setWordWrap(False)
        table.setTextElideMode(Qt.TextElideMode.ElideRight)
        self._build_header(table.horizontalHeader())
        table.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAsNeeded)
        table.setAccessibleName("Conversations found")
        table.selectionModel().selectionChanged.connect(lambda *_: self._show_preview())
        self.model.modelReset.connect(self._show_preview)  # a reset drops the selection without a signal
        table.doubleClicked.connect(lambda _: self.open_selected())
        table.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        table.customContextMenuRequested.connect(lambda pos: self.context_menu(pos).popup(
            table.viewport().mapToGlobal(pos)))
        for key in ROW_ACTIONS:  # Enter, F2, Delete act on the rows while the table has focus
            table.addAction(self.buttons[key])
        return table

    def _build_header(self, header: QHeaderView) -> None:
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
            if key in TOOLBAR_TEXT:
                act.setIconText(TOOLBAR_TEXT[key])  # what a text-only tool button shows; menus show the label
            act.setShortcut(QKeySequence(shortcut))
            act.setToolTip(f"{label.rstrip('…')} ({QKeySequence(shortcut).toString(QKeySequence.SequenceFormat.NativeText)})")
            act.triggered.connect(self._slot(slot[0]) if len(slot) == 1 else
                                  (lambda _=False, name=slot[0], arg=slot[1]: self._slot(name)(*arg)))
            if key in ROW_ACTIONS:  # keys that mean something else in the search box act on the table only
                act.setShortcutContext(Qt.ShortcutContext.WidgetShortcut)
            else:
                act.setShortcutContext(Qt.ShortcutContext.WindowShortcut)
                self.addAction(act)
            bar.addAction(act)
            bar.widgetForAction(act).setAccessibleName(label.rstrip("…"))
            self.buttons[key] = act
        return bar

    def _slot(self, name: str):
        """An action's method by its name in ACTIONS ("delete_selected", "transfers.import_file")."""
        target = self
        for part in name.split("."):
            target = getattr(target, part)
        return target

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
        self.listing.reload()
        self.search_bar.set_models(self.listing.models())
        self.refresh()

    def refresh(self) -> None:
        """Re-run the search with the current text and filters (cheap: on every keystroke)."""
        found = self.listing.find(self.search_bar.listing_query())
        if found.error:
            self.preview_title.setText(f"⚠ {found.error}")
        self.model.set_rows(found.rows)
        self.setWindowTitle(f"Saved conversations ({len(found.rows)}{'+' if found.capped else ''}) — Hearth")

    @property
    def checkpoints(self) -> dict:
        """Each conversation's last checked status (the shared registry's; read only here)."""
        return self.contexts.statuses

    def _on_contexts_changed(self, ids: set[str]) -> None:
        """The registry's news: with a status filter the listing may change; otherwise only cells do
        (no reset, so the selection and the preview stay)."""
        if self.search_bar.status() != "any":
            self.refresh()
            return
        self.model.update_checkpoints(ids, self.contexts.status)
        current = self.selected_ids()
        if len(current) == 1 and current[0] in ids:
            self.preview_status.setText(self.contexts.describe(current[0]))

    def selected_ids(self) -> list[str]:
        rows = {i.row() for i in self.table.selectionModel().selectedRows()}
        return [self.proxy.index(r, 0).data(ID_ROLE) for r in sorted(rows)]

    def ids_shown(self) -> list[str]:
        return [self.proxy.index(r, 0).data(ID_ROLE) for r in range(self.proxy.rowCount())]

    def _show_preview(self) -> None:
        """The one selected chat; otherwise a neutral line (never a chat that is gone or not selected)."""
        ids = self.selected_ids()
        self.preview_panel.show_chat(self.listing.preview(ids[0]) if len(ids) == 1 else None, len(ids))

    # actions ------------------------------------------------------------------------------------------------
    def open_selected(self) -> None:
        ids = self.selected_ids()
        if ids:
            self.open_requested.emit(ids[0])

    def documents_selected(self) -> None:
        """A new chat in the window with the selected chat's system prompt, its files waiting in the message box
        (the window says so when the chat has none)."""
        ids = self.selected_ids()
        if len(ids) == 1:
            self.documents_requested.emit(ids[0])

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
            self.note_changed()

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
        self.undo.deleted(len(ids))
        self.undo_timer.start(UNDO_SECONDS * 1000)
        self.note_changed()

    def undo_delete(self) -> None:
        self.undo_timer.stop()
        if self._trash:
            self.store.untrash(self._trash)
            self._trash = []
            self.note_changed()
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
        self.note_changed()

    def drop_selected_context(self) -> None:
        ids = self.selected_ids()
        if ids:
            self.host.request_drop_context.emit(ids)
            self.contexts.mark_dropped(ids)

    def warn(self, message: str) -> None:
        box = QMessageBox(QMessageBox.Icon.Warning, "Hearth", message, QMessageBox.StandardButton.Ok, self)
        box.setObjectName("browserWarning")
        box.open()  # window-modal, not blocking the event loop

    def note_changed(self) -> None:
        self.reload()
        self.conversations_changed.emit()
        # The set of chats changed here: the engine says again which have saved or live context, so
        # the sidebar's badges and token counts are re-read rather than lost.
        self.host.request_states.emit()

    # saved context --------------------------------------------------------------------------------------------
    def check_contexts(self, full: bool, ids: list[str] | None = None) -> None:
        """Check saved contexts on the engine thread (headers, or every checksum when ``full``): of
        ``ids``, or of every conversation."""
        ids = list(self.listing.summaries) if ids is None else list(ids)
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
        self.disk.show_usage(usage)

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
        self.transfers.close()
        super().closeEvent(event)

    def shutdown(self) -> None:
        """End the import thread (a running import is cancelled and rolled back first)."""
        self.transfers.shutdown()
